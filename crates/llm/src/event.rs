//! Stream events, normalized usage, and [`Response`], the collected form of one stream.
//!
//! # The stream contract
//!
//! A provider stream yields `Ok` events and ends, or ends with exactly one `Err` and nothing
//! after it. Events come in this shape:
//!
//! - [`Event::StepStart`] first, once the provider started answering. An error before that
//!   (an HTTP 429, a refused connection) is a lone `Err`.
//! - Parts, each `…Start`, deltas, `…End`, identified by a `part` number unique within the
//!   stream. Text and reasoning parts do not overlap each other. A tool call is
//!   [`Event::ToolInputStart`], deltas, [`Event::ToolInputEnd`], then [`Event::ToolCall`] with
//!   the complete input; a tool input that never ended (the provider ran out of tokens
//!   mid-call) gets neither `ToolInputEnd` nor `ToolCall` and must never be executed.
//! - [`Event::StepFinish`] exactly once after a `StepStart`. On success it is the last item. On a
//!   failure after `StepStart` it comes right before the `Err`, with the finish reason the
//!   provider had already reported (else [`FinishReason::Error`]) and the usage reported so far,
//!   so tokens spent on a failed attempt can still be accounted. Parts still open at a failure
//!   stay open: they are partial output.
//!
//! Tool calls are decided by the presence of `ToolCall` events, never by the finish reason (a
//! forced tool call ends with `stop`).

use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind};
use crate::request::{ReasoningMetadata, ToolCall};

/// One event of a provider stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The provider started answering.
    StepStart {
        /// The provider's response id (`chatcmpl-…`, `msg_…`), if it sent one.
        id: Option<String>,
        /// The model that answered, as the provider reports it.
        model: Option<String>,
    },
    /// A text part begins.
    TextStart {
        /// The part number.
        part: u32,
    },
    /// More text.
    TextDelta {
        /// The part number.
        part: u32,
        /// The new text.
        delta: String,
    },
    /// A text part is complete.
    TextEnd {
        /// The part number.
        part: u32,
    },
    /// A reasoning part begins.
    ReasoningStart {
        /// The part number.
        part: u32,
    },
    /// More reasoning text.
    ReasoningDelta {
        /// The part number.
        part: u32,
        /// The new text.
        delta: String,
    },
    /// A reasoning part is complete.
    ReasoningEnd {
        /// The part number.
        part: u32,
        /// Opaque provider metadata to replay with this reasoning (an Anthropic signature).
        metadata: Option<ReasoningMetadata>,
    },
    /// The model began a tool call.
    ToolInputStart {
        /// The part number.
        part: u32,
        /// The provider's call id.
        id: String,
        /// The tool name.
        name: String,
    },
    /// More argument text, exactly as the provider sent it.
    ToolInputDelta {
        /// The part number.
        part: u32,
        /// The fragment.
        delta: String,
    },
    /// The tool call's input is complete.
    ToolInputEnd {
        /// The part number.
        part: u32,
    },
    /// A complete tool call, to be recorded and (after validation) executed by the runtime.
    ToolCall {
        /// The part number of its `ToolInputStart`.
        part: u32,
        /// The call.
        call: ToolCall,
    },
    /// The provider finished (see the module docs for its place on failures).
    StepFinish {
        /// Normalized reason.
        reason: FinishReason,
        /// The provider's own value (`end_turn`, `tool_calls`, …), if it sent one.
        raw_reason: Option<String>,
        /// Normalized usage.
        usage: Usage,
    },
}

/// Why the model stopped, normalized across providers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end or stop sequence (OpenAI `stop`, Anthropic `end_turn`, `stop_sequence`).
    #[default]
    Stop,
    /// The output limit was hit (`length`, `max_tokens`, `model_context_window_exceeded`).
    Length,
    /// The model ended its turn to call tools (`tool_calls`, `tool_use`).
    ToolCalls,
    /// The output was filtered or refused (`content_filter`, `refusal`).
    ContentFilter,
    /// The stream failed before the provider reported a reason.
    Error,
    /// Anything else (`pause_turn`, an unknown value, or none at all).
    Other,
}

impl FinishReason {
    /// Maps an OpenAI Chat Completions `finish_reason`.
    pub fn from_openai(raw: &str) -> Self {
        match raw {
            "stop" => Self::Stop,
            "length" => Self::Length,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
            "error" => Self::Error,
            _ => Self::Other,
        }
    }

    /// Maps an Anthropic `stop_reason`.
    pub fn from_anthropic(raw: &str) -> Self {
        match raw {
            "end_turn" | "stop_sequence" => Self::Stop,
            "max_tokens" | "model_context_window_exceeded" => Self::Length,
            "tool_use" => Self::ToolCalls,
            "refusal" => Self::ContentFilter,
            _ => Self::Other,
        }
    }

    /// The snake_case name (`stop`, `tool_calls`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
            Self::Error => "error",
            Self::Other => "other",
        }
    }
}

/// Token usage of one call, normalized so that the fields never overlap except `reasoning`:
///
/// - `input`: prompt tokens processed at the full price, i.e. **excluding** cache reads and
///   cache writes. OpenAI's `prompt_tokens` includes cached tokens, so `input = prompt_tokens -
///   cached_tokens`; Anthropic's `input_tokens` already excludes both.
/// - `cache_read`: prompt tokens served from the provider's cache (OpenAI
///   `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`).
/// - `cache_write`: prompt tokens written to the cache (Anthropic
///   `cache_creation_input_tokens`; OpenAI does not report writes, so 0).
/// - `output`: generated tokens **including** reasoning tokens (both providers bill reasoning as
///   output).
/// - `reasoning`: the part of `output` spent on reasoning, when the provider says (OpenAI
///   `completion_tokens_details.reasoning_tokens`; Anthropic does not say, so 0). Never add it
///   to `output` again.
///
/// The whole prompt is [`Usage::total_input`] = `input + cache_read + cache_write`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached prompt tokens.
    pub input: u64,
    /// Generated tokens, reasoning included.
    pub output: u64,
    /// Reasoning tokens, a part of `output`.
    pub reasoning: u64,
    /// Prompt tokens read from the cache.
    pub cache_read: u64,
    /// Prompt tokens written to the cache.
    pub cache_write: u64,
}

impl Usage {
    /// The whole prompt: uncached, cache reads and cache writes.
    pub fn total_input(&self) -> u64 {
        self.input + self.cache_read + self.cache_write
    }

    /// Prompt and output.
    pub fn total(&self) -> u64 {
        self.total_input() + self.output
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.input += other.input;
        self.output += other.output;
        self.reasoning += other.reasoning;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
    }
}

/// A reasoning part of a [`Response`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reasoning {
    /// The text.
    pub text: String,
    /// Provider metadata to replay with it.
    pub metadata: Option<ReasoningMetadata>,
}

/// One stream collected: what `generate` returns. Tool calls are recorded, never acted on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The provider's response id.
    pub id: Option<String>,
    /// The model that answered.
    pub model: Option<String>,
    /// All text parts concatenated.
    pub text: String,
    /// Reasoning parts in order.
    pub reasoning: Vec<Reasoning>,
    /// Complete tool calls in order.
    pub tool_calls: Vec<ToolCall>,
    /// Tool calls whose input never completed (input holds what arrived). Never execute these.
    pub incomplete_tool_calls: Vec<ToolCall>,
    /// Why the model stopped.
    pub finish: FinishReason,
    /// The provider's own finish value.
    pub raw_finish: Option<String>,
    /// Normalized usage.
    pub usage: Usage,
}

/// The most a collected response may hold (text, reasoning and tool inputs together), in bytes.
/// Real answers are far below it; past it the provider is broken or hostile, and collecting
/// fails with invalid output instead of growing without bound.
pub const MAX_COLLECTED: usize = 8 * 1024 * 1024;

/// Folds events into a [`Response`]; what [`crate::Provider::generate`] uses, exposed for
/// callers that forward events and also want the summary. Holds at most [`MAX_COLLECTED`] bytes
/// of output.
#[derive(Debug, Default)]
pub struct Collector {
    response: Response,
    reasoning_open: Option<u32>,
    tools_open: Vec<(u32, ToolCall)>,
    finished: bool,
    /// Bytes of output collected so far, against [`MAX_COLLECTED`].
    collected: usize,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event in; fails, keeping nothing of it, once the output would pass
    /// [`MAX_COLLECTED`] (the caller then drops the stream, which cancels the call).
    pub fn push(&mut self, event: &Event) -> Result<(), Error> {
        if let Event::TextDelta { delta, .. }
        | Event::ReasoningDelta { delta, .. }
        | Event::ToolInputDelta { delta, .. } = event
        {
            self.collected = self.collected.saturating_add(delta.len());
            if self.collected > MAX_COLLECTED {
                return Err(Error::invalid_output(format!(
                    "the response passed {MAX_COLLECTED} bytes of output"
                )));
            }
        }
        match event {
            Event::StepStart { id, model } => {
                self.response.id.clone_from(id);
                self.response.model.clone_from(model);
            }
            Event::TextStart { .. } | Event::TextEnd { .. } | Event::ToolInputEnd { .. } => {}
            Event::TextDelta { delta, .. } => self.response.text.push_str(delta),
            Event::ReasoningStart { part } => {
                self.reasoning_open = Some(*part);
                self.response.reasoning.push(Reasoning::default());
            }
            Event::ReasoningDelta { delta, .. } => {
                if let Some(reasoning) = self.response.reasoning.last_mut() {
                    reasoning.text.push_str(delta);
                }
            }
            Event::ReasoningEnd { metadata, .. } => {
                if self.reasoning_open.take().is_some()
                    && let Some(reasoning) = self.response.reasoning.last_mut()
                {
                    reasoning.metadata.clone_from(metadata);
                }
            }
            Event::ToolInputStart { part, id, name } => self.tools_open.push((
                *part,
                ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    input: String::new(),
                },
            )),
            Event::ToolInputDelta { part, delta } => {
                if let Some((_, call)) = self.tools_open.iter_mut().find(|(p, _)| p == part) {
                    call.input.push_str(delta);
                }
            }
            Event::ToolCall { part, call } => {
                self.tools_open.retain(|(p, _)| p != part);
                self.response.tool_calls.push(call.clone());
            }
            Event::StepFinish {
                reason,
                raw_reason,
                usage,
            } => {
                self.finished = true;
                self.response.finish = *reason;
                self.response.raw_finish.clone_from(raw_reason);
                self.response.usage = *usage;
            }
        }
        Ok(())
    }

    /// The response so far, with still-open tool inputs moved to `incomplete_tool_calls`.
    pub fn snapshot(&self) -> Response {
        let mut response = self.response.clone();
        response
            .incomplete_tool_calls
            .extend(self.tools_open.iter().map(|(_, call)| call.clone()));
        response
    }

    /// The collected response; an error if the stream never reported its finish.
    pub fn finish(self) -> Result<Response, Error> {
        if !self.finished {
            return Err(Error::new(
                ErrorKind::IncompleteStream,
                "the stream ended without a step finish",
            ));
        }
        Ok(self.snapshot())
    }
}

/// Collects exactly one stream into a [`Response`]; the first `Err` item is returned as is.
pub async fn collect<S>(stream: S) -> Result<Response, Error>
where
    S: Stream<Item = Result<Event, Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut collector = Collector::new();
    while let Some(item) = stream.next().await {
        collector.push(&item?)?;
    }
    collector.finish()
}
