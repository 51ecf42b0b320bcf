//! Incremental parser of the Chat Completions SSE stream into [`Event`]s.
//!
//! What it copes with (each seen in recorded streams): `usage` before `choices` in a chunk; a
//! role chunk with `content: ""` or `null`; tool-call headers (id, name) only in the first
//! fragment of each `index`, and arguments split anywhere; `delta.reasoning` (OpenRouter) and
//! `delta.reasoning_content` (vLLM, DeepSeek); usage in a final chunk with `choices: []`; a
//! `finish_reason` repeated, or followed by chunks whose `finish_reason` is null; a top-level
//! `error` object inside a 200 stream; SSE comments as keep-alives; and `[DONE]`.

use serde::Deserialize;
use serde_json::Value;

use crate::error::Error;
use crate::event::{Event, FinishReason, Usage};
use crate::request::ToolCall;
use crate::wire::{self, Framed, Frames, Output, Step, Str, Wire};

/// Parses one Chat Completions response body. Feed bytes as they arrive, then call
/// [`Parser::finish`] at end of body.
#[derive(Debug, Default)]
pub struct Parser {
    framed: Framed<State>,
}

/// What the frames build up; [`Framed`] keeps the SSE decoder beside it.
#[derive(Debug, Default)]
struct State {
    step: Step,
    next_part: u32,
    text: Option<u32>,
    reasoning: Option<u32>,
    tools: Vec<ToolState>,
}

#[derive(Debug)]
struct ToolState {
    index: u64,
    part: u32,
    id: String,
    name: String,
    arguments: String,
    closed: bool,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default, borrow)]
    finish_reason: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolDelta>>,
}

#[derive(Deserialize)]
struct ToolDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek's name for cached prompt tokens.
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    /// OpenAI's `prompt_tokens` includes cached tokens; ours does not (see [`Usage`]).
    fn normalize(&self) -> Usage {
        let prompt = self.prompt_tokens.unwrap_or(0);
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|details| details.cached_tokens)
            .or(self.prompt_cache_hit_tokens)
            .unwrap_or(0)
            .min(prompt);
        Usage {
            input: prompt - cached,
            output: self.completion_tokens.unwrap_or(0),
            reasoning: self
                .completion_tokens_details
                .as_ref()
                .and_then(|details| details.reasoning_tokens)
                .unwrap_or(0),
            cache_read: cached,
            cache_write: 0,
        }
    }
}

impl Parser {
    /// A parser at the start of a response body.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses more bytes, appending events (and at most one final error) to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Output) {
        self.framed.feed(bytes, out);
    }

    /// The body ended. Without `[DONE]` the stream still counts as complete when a
    /// `finish_reason` arrived (some compatible servers omit `[DONE]`); otherwise it is an
    /// [`crate::ErrorKind::IncompleteStream`].
    pub fn finish(&mut self, out: &mut Output) {
        self.framed.finish(out);
    }

    /// Whether the stream is over (completed or failed).
    pub fn is_done(&self) -> bool {
        self.framed.is_done()
    }

    /// The parser as the HTTP layer drives it.
    pub(super) fn into_wire(self) -> impl Wire {
        self.framed
    }
}

impl Frames for State {
    fn step(&self) -> &Step {
        &self.step
    }

    fn step_mut(&mut self) -> &mut Step {
        &mut self.step
    }

    fn frame(&mut self, event: &str, data: &str, out: &mut Output) {
        let data = data.trim();
        if data == "[DONE]" {
            return self.complete(out);
        }
        if event == "error" {
            return self.step.fail(wire::error_event(data), out);
        }
        let chunk: Chunk<'_> = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(error) => {
                return self.step.fail(
                    Error::invalid_output(format!("malformed chunk: {error}")),
                    out,
                );
            }
        };
        let error = chunk.error.filter(|error| !error.is_null());
        if error.is_none() && !self.step.is_started() {
            let text = |field: Option<Str<'_>>| field.map(|s| s.0.into_owned());
            self.step.start(text(chunk.id), text(chunk.model), out);
        }
        // An error chunk that opens the stream carries no output worth reporting.
        if self.step.is_started() {
            for choice in chunk.choices.into_iter().flatten() {
                // We never ask for `n > 1`; other choices would interleave with the first.
                if choice.index == 0 {
                    self.choice(choice, out);
                }
            }
        }
        if let Some(usage) = chunk.usage {
            self.step.usage = usage.normalize();
        }
        if let Some(error) = error {
            let body = serde_json::json!({ "error": error });
            self.step.fail(Error::from_stream_body(&body), out);
        }
    }

    fn end(&mut self, out: &mut Output) {
        if self.step.reason.is_some() {
            self.complete(out);
        } else {
            self.step.fail(
                Error::incomplete("the stream ended before a finish_reason or [DONE]"),
                out,
            );
        }
    }
}

impl State {
    fn choice(&mut self, choice: Choice<'_>, out: &mut Output) {
        if let Some(delta) = choice.delta {
            let reasoning = delta.reasoning_content.or(delta.reasoning);
            if let Some(text) = reasoning.filter(|text| !text.is_empty()) {
                self.reasoning_delta(text, out);
            }
            for text in [delta.content, delta.refusal].into_iter().flatten() {
                if !text.is_empty() {
                    self.text_delta(text, out);
                }
            }
            for (position, call) in delta.tool_calls.into_iter().flatten().enumerate() {
                self.tool_delta(position, call, out);
            }
        }
        // A later chunk's null finish_reason must not erase an earlier one; a repeated one is
        // a no-op.
        if let Some(raw) = choice.finish_reason
            && self.step.reason.is_none()
        {
            let reason = FinishReason::from_openai(raw.as_str());
            self.step.reason = Some((reason, raw.0.into_owned()));
            self.close_parts(out);
            self.close_tools(reason == FinishReason::Length, out);
        }
    }

    fn text_delta(&mut self, delta: String, out: &mut Output) {
        self.close_reasoning(out);
        let part = match self.text {
            Some(part) => part,
            None => {
                let part = self.allocate_part();
                self.text = Some(part);
                out.push(Ok(Event::TextStart { part }));
                part
            }
        };
        out.push(Ok(Event::TextDelta { part, delta }));
    }

    fn reasoning_delta(&mut self, delta: String, out: &mut Output) {
        self.close_text(out);
        let part = match self.reasoning {
            Some(part) => part,
            None => {
                let part = self.allocate_part();
                self.reasoning = Some(part);
                out.push(Ok(Event::ReasoningStart { part }));
                part
            }
        };
        out.push(Ok(Event::ReasoningDelta { part, delta }));
    }

    fn tool_delta(&mut self, position: usize, call: ToolDelta, out: &mut Output) {
        self.close_parts(out);
        let mut index = call.index.unwrap_or(position as u64);
        let (name, arguments) = match call.function {
            Some(function) => (function.name, function.arguments),
            None => (None, None),
        };
        // Servers that omit `index` and send each call whole would otherwise be merged into
        // one: a different id at a known index is a new call.
        if call.index.is_none()
            && let Some(id) = &call.id
            && self
                .tools
                .iter()
                .any(|tool| tool.index == index && !tool.id.is_empty() && &tool.id != id)
        {
            index = self
                .tools
                .iter()
                .map(|tool| tool.index + 1)
                .max()
                .unwrap_or(0);
        }
        let slot = match self.tools.iter().position(|tool| tool.index == index) {
            Some(slot) => slot,
            None => {
                let part = self.allocate_part();
                let tool = ToolState {
                    index,
                    part,
                    // Some servers send no id; the runtime still needs one to answer the call.
                    id: call.id.clone().unwrap_or_else(|| format!("call_{part}")),
                    name: name.clone().unwrap_or_default(),
                    arguments: String::new(),
                    closed: false,
                };
                out.push(Ok(Event::ToolInputStart {
                    part,
                    id: tool.id.clone(),
                    name: tool.name.clone(),
                }));
                self.tools.push(tool);
                self.tools.len() - 1
            }
        };
        let tool = &mut self.tools[slot];
        if tool.closed {
            return;
        }
        if tool.name.is_empty()
            && let Some(name) = name
        {
            tool.name = name;
        }
        if let Some(arguments) = arguments.filter(|arguments| !arguments.is_empty()) {
            tool.arguments.push_str(&arguments);
            out.push(Ok(Event::ToolInputDelta {
                part: tool.part,
                delta: arguments,
            }));
        }
    }

    /// Ends every tool input. After a `length` finish, arguments that are not valid JSON were
    /// cut off: that call stays incomplete (no `ToolInputEnd`, no `ToolCall`) and never runs.
    fn close_tools(&mut self, truncated: bool, out: &mut Output) {
        for tool in self.tools.iter_mut().filter(|tool| !tool.closed) {
            tool.closed = true;
            let input = if tool.arguments.trim().is_empty() {
                "{}".to_owned()
            } else {
                tool.arguments.clone()
            };
            if truncated && serde_json::from_str::<serde::de::IgnoredAny>(&input).is_err() {
                continue;
            }
            let call = ToolCall {
                id: tool.id.clone(),
                name: tool.name.clone(),
                input,
            };
            wire::end_tool(tool.part, call, out);
        }
    }

    fn complete(&mut self, out: &mut Output) {
        self.close_parts(out);
        let truncated = matches!(self.step.reason, Some((FinishReason::Length, _)));
        self.close_tools(truncated, out);
        self.step.finish(FinishReason::Other, out);
    }

    fn close_parts(&mut self, out: &mut Output) {
        self.close_text(out);
        self.close_reasoning(out);
    }

    fn close_text(&mut self, out: &mut Output) {
        if let Some(part) = self.text.take() {
            out.push(Ok(Event::TextEnd { part }));
        }
    }

    fn close_reasoning(&mut self, out: &mut Output) {
        if let Some(part) = self.reasoning.take() {
            out.push(Ok(Event::ReasoningEnd {
                part,
                metadata: None,
            }));
        }
    }

    fn allocate_part(&mut self) -> u32 {
        let part = self.next_part;
        self.next_part += 1;
        part
    }
}
