//! Incremental parser of the Anthropic Messages SSE stream into [`Event`]s.
//!
//! Event types: `message_start` (id, model, provisional usage), `content_block_start` /
//! `_delta` / `_stop` for `text`, `thinking` (with `signature_delta`), `redacted_thinking` and
//! `tool_use` (with `input_json_delta`), `message_delta` (stop reason, cumulative usage),
//! `message_stop`, `ping`, and `error`. Unknown event, block and delta types are ignored for
//! forward compatibility. Dispatch is on the payload's `type`, so a proxy that drops `event:`
//! lines does not matter.

use serde::Deserialize;
use serde_json::Value;

use crate::error::Error;
use crate::event::{Event, FinishReason, Usage};
use crate::request::{ReasoningMetadata, ToolCall};
use crate::wire::{self, Framed, Frames, Output, Step, Str, Wire};

/// Parses one Messages response body. Feed bytes as they arrive, then call
/// [`Parser::finish`] at end of body.
#[derive(Debug, Default)]
pub struct Parser {
    framed: Framed<State>,
}

/// What the frames build up; [`Framed`] keeps the SSE decoder beside it.
#[derive(Debug, Default)]
struct State {
    step: Step,
    blocks: Vec<Block>,
}

#[derive(Debug)]
struct Block {
    index: u32,
    kind: BlockKind,
    open: bool,
}

#[derive(Debug)]
enum BlockKind {
    Text,
    Thinking {
        signature: String,
    },
    Redacted {
        data: String,
    },
    Tool {
        id: String,
        name: String,
        json: String,
        /// `content_block.input` from the start event: what an empty input means.
        initial: String,
    },
    /// A block type this client does not handle (server tools, citations, …).
    Ignored,
}

/// Every payload's fields in one flat struct: deserializing it is much faster than serde's
/// internally tagged enums, which buffer the whole object first.
#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(rename = "type", borrow)]
    kind: Str<'a>,
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    message: Option<MessageStart>,
    #[serde(default, borrow)]
    content_block: Option<BlockStart<'a>>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct MessageStart {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct BlockStart<'a> {
    #[serde(rename = "type", borrow)]
    kind: Str<'a>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Str<'a>>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Anthropic's fields are disjoint already (`input_tokens` excludes cache reads and
    /// writes) and `message_delta` repeats them cumulatively, so present values overwrite.
    fn merge_into(&self, usage: &mut Usage) {
        let set = |field: &mut u64, value: Option<u64>| {
            if let Some(value) = value {
                *field = value;
            }
        };
        set(&mut usage.input, self.input_tokens);
        set(&mut usage.output, self.output_tokens);
        set(&mut usage.cache_write, self.cache_creation_input_tokens);
        set(&mut usage.cache_read, self.cache_read_input_tokens);
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

    /// The body ended; without `message_stop` that is an
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
        if event == "error" {
            return self.step.fail(wire::error_event(data), out);
        }
        let payload: Payload<'_> = match serde_json::from_str(data) {
            Ok(payload) => payload,
            Err(error) => {
                return self.step.fail(
                    Error::invalid_output(format!("malformed event: {error}")),
                    out,
                );
            }
        };
        match payload.kind.as_str() {
            "message_start" => {
                let message = payload.message;
                let (id, model) = match &message {
                    Some(message) => (message.id.clone(), message.model.clone()),
                    None => (None, None),
                };
                if let Some(usage) = message.as_ref().and_then(|m| m.usage.as_ref()) {
                    usage.merge_into(&mut self.step.usage);
                }
                self.step.start(id, model, out);
            }
            "content_block_start" => {
                if let (Some(index), Some(block)) = (payload.index, payload.content_block) {
                    self.step.start(None, None, out);
                    self.block_start(index, block, out);
                }
            }
            "content_block_delta" => {
                if let (Some(index), Some(delta)) = (payload.index, payload.delta) {
                    self.block_delta(index, delta, out);
                }
            }
            "content_block_stop" => {
                if let Some(index) = payload.index {
                    self.block_stop(index, out);
                }
            }
            "message_delta" => {
                if let Some(raw) = payload.delta.and_then(|delta| delta.stop_reason) {
                    self.step.reason = Some((FinishReason::from_anthropic(&raw), raw));
                }
                if let Some(usage) = payload.usage {
                    usage.merge_into(&mut self.step.usage);
                }
            }
            "message_stop" => {
                // Text and thinking still open are whole as far as they go; an open tool_use
                // was cut off and stays incomplete.
                let open: Vec<u32> = self
                    .blocks
                    .iter()
                    .filter(|block| block.open && !matches!(block.kind, BlockKind::Tool { .. }))
                    .map(|block| block.index)
                    .collect();
                for index in open {
                    self.block_stop(index, out);
                }
                self.step.finish(FinishReason::Other, out);
            }
            "error" => self.step.fail(wire::error_event(data), out),
            // `ping` and future event types.
            _ => {}
        }
    }

    fn end(&mut self, out: &mut Output) {
        self.step.fail(
            Error::incomplete("the stream ended before message_stop"),
            out,
        );
    }
}

impl State {
    fn block_start(&mut self, index: u32, block: BlockStart<'_>, out: &mut Output) {
        let part = index;
        let kind = match block.kind.as_str() {
            "text" => {
                out.push(Ok(Event::TextStart { part }));
                if let Some(text) = block.text.filter(|text| !text.is_empty()) {
                    out.push(Ok(Event::TextDelta { part, delta: text }));
                }
                BlockKind::Text
            }
            "thinking" => {
                out.push(Ok(Event::ReasoningStart { part }));
                if let Some(text) = block.thinking.filter(|text| !text.is_empty()) {
                    out.push(Ok(Event::ReasoningDelta { part, delta: text }));
                }
                BlockKind::Thinking {
                    signature: block.signature.unwrap_or_default(),
                }
            }
            "redacted_thinking" => {
                out.push(Ok(Event::ReasoningStart { part }));
                BlockKind::Redacted {
                    data: block.data.unwrap_or_default(),
                }
            }
            "tool_use" => {
                let id = block.id.unwrap_or_default();
                let name = block.name.unwrap_or_default();
                out.push(Ok(Event::ToolInputStart {
                    part,
                    id: id.clone(),
                    name: name.clone(),
                }));
                let initial = match block.input {
                    Some(input @ Value::Object(_)) => input.to_string(),
                    _ => "{}".to_owned(),
                };
                BlockKind::Tool {
                    id,
                    name,
                    json: String::new(),
                    initial,
                }
            }
            _ => BlockKind::Ignored,
        };
        self.blocks.push(Block {
            index,
            kind,
            open: true,
        });
    }

    fn block_delta(&mut self, index: u32, delta: Delta<'_>, out: &mut Output) {
        let Some(block) = self
            .blocks
            .iter_mut()
            .rev()
            .find(|block| block.index == index && block.open)
        else {
            return;
        };
        let part = index;
        match (&mut block.kind, delta.kind.as_ref().map(Str::as_str)) {
            (BlockKind::Text, Some("text_delta")) => {
                if let Some(text) = delta.text.filter(|text| !text.is_empty()) {
                    out.push(Ok(Event::TextDelta { part, delta: text }));
                }
            }
            (BlockKind::Thinking { .. }, Some("thinking_delta")) => {
                if let Some(text) = delta.thinking.filter(|text| !text.is_empty()) {
                    out.push(Ok(Event::ReasoningDelta { part, delta: text }));
                }
            }
            (BlockKind::Thinking { signature }, Some("signature_delta")) => {
                if let Some(more) = delta.signature {
                    signature.push_str(&more);
                }
            }
            (BlockKind::Tool { json, .. }, Some("input_json_delta")) => {
                if let Some(fragment) = delta.partial_json.filter(|f| !f.is_empty()) {
                    json.push_str(&fragment);
                    out.push(Ok(Event::ToolInputDelta {
                        part,
                        delta: fragment,
                    }));
                }
            }
            // citations_delta and future delta types.
            _ => {}
        }
    }

    fn block_stop(&mut self, index: u32, out: &mut Output) {
        let Some(block) = self
            .blocks
            .iter_mut()
            .rev()
            .find(|block| block.index == index && block.open)
        else {
            return;
        };
        block.open = false;
        let part = index;
        match &block.kind {
            BlockKind::Text => out.push(Ok(Event::TextEnd { part })),
            BlockKind::Thinking { signature } => out.push(Ok(Event::ReasoningEnd {
                part,
                metadata: (!signature.is_empty()).then(|| ReasoningMetadata::Anthropic {
                    signature: signature.clone(),
                }),
            })),
            BlockKind::Redacted { data } => out.push(Ok(Event::ReasoningEnd {
                part,
                metadata: Some(ReasoningMetadata::AnthropicRedacted { data: data.clone() }),
            })),
            BlockKind::Tool {
                id,
                name,
                json,
                initial,
            } => {
                // An empty accumulated input means "no arguments": the start event's `input`
                // (normally `{}`) is the value, not a parse error.
                let input = if json.trim().is_empty() {
                    initial.clone()
                } else {
                    json.clone()
                };
                let call = ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    input,
                };
                wire::end_tool(part, call, out);
            }
            BlockKind::Ignored => {}
        }
    }
}
