//! What the two wire parsers share: the step bracket of the stream contract (start once, finish
//! once, fail once), the SSE framing that feeds each format's [`Frames`] and stops once the step
//! is done, the few events both build alike, and the trait the HTTP layer drives them through.

use serde_json::Value;

use crate::error::Error;
use crate::event::{Event, FinishReason, Usage};
use crate::request::ToolCall;
use crate::sse::Decoder;

/// Items a parser produces while fed.
pub type Output = Vec<Result<Event, Error>>;

/// A byte-stream parser for one provider's wire format, driven by the HTTP layer.
pub(crate) trait Wire: Send + 'static {
    /// Parses more response bytes.
    fn feed(&mut self, bytes: &[u8], out: &mut Output);
    /// The response body ended.
    fn finish(&mut self, out: &mut Output);
    /// The transport failed; ends the stream with `error`.
    fn fail(&mut self, error: Error, out: &mut Output);
    /// Nothing more will be produced (finished or failed).
    fn is_done(&self) -> bool;
}

/// What one wire format does with the frames of its SSE body; [`Framed`] calls it.
pub(crate) trait Frames {
    fn step(&self) -> &Step;
    fn step_mut(&mut self) -> &mut Step;
    /// One SSE frame. Called only while the step is not done.
    fn frame(&mut self, event: &str, data: &str, out: &mut Output);
    /// The body ended after the last frame and the step is not done: complete it or fail it.
    fn end(&mut self, out: &mut Output);
}

/// A format's [`Frames`] behind the SSE decoder: the body of each public `Parser`.
#[derive(Debug, Default)]
pub(crate) struct Framed<F> {
    sse: Decoder,
    frames: F,
}

impl<F: Frames + Send + 'static> Wire for Framed<F> {
    fn feed(&mut self, bytes: &[u8], out: &mut Output) {
        if self.is_done() {
            return;
        }
        let frames = &mut self.frames;
        self.sse
            .feed_with(bytes, |event, data| deliver(frames, event, data, out));
        if self.sse.overflowed() && !self.is_done() {
            let error = Error::invalid_output(format!(
                "the provider sent an event stream line or event over {} bytes",
                crate::sse::MAX_FRAME
            ));
            self.fail(error, out);
        }
    }

    fn finish(&mut self, out: &mut Output) {
        if self.is_done() {
            return;
        }
        let frames = &mut self.frames;
        // A last frame without its blank line still counts.
        self.sse
            .finish_with(|event, data| deliver(frames, event, data, out));
        if !frames.step().is_done() {
            frames.end(out);
        }
    }

    fn fail(&mut self, error: Error, out: &mut Output) {
        self.frames.step_mut().fail(error, out);
    }

    fn is_done(&self) -> bool {
        self.frames.step().is_done()
    }
}

/// Frames after the step ended (later in the same chunk as `[DONE]` or an error) are not parsed.
fn deliver<F: Frames>(frames: &mut F, event: &str, data: &str, out: &mut Output) {
    if !frames.step().is_done() {
        frames.frame(event, data, out);
    }
}

/// The error an SSE `error` event reports; a payload that is not JSON is classified as text.
pub(crate) fn error_event(data: &str) -> Error {
    let body = serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.into()));
    Error::from_stream_body(&body)
}

/// Ends a complete tool input: `ToolInputEnd`, then the `ToolCall` the contract pairs with it.
pub(crate) fn end_tool(part: u32, call: ToolCall, out: &mut Output) {
    out.push(Ok(Event::ToolInputEnd { part }));
    out.push(Ok(Event::ToolCall { part, call }));
}

/// The step bracket: enforces "`StepStart` once, then exactly one `StepFinish`, `Err` last".
#[derive(Debug, Default)]
pub(crate) struct Step {
    started: bool,
    done: bool,
    /// The provider's finish reason once it reported one, normalized and raw.
    pub reason: Option<(FinishReason, String)>,
    /// Usage as last reported.
    pub usage: Usage,
}

impl Step {
    pub fn is_started(&self) -> bool {
        self.started
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn start(&mut self, id: Option<String>, model: Option<String>, out: &mut Output) {
        if !self.started && !self.done {
            self.started = true;
            out.push(Ok(Event::StepStart { id, model }));
        }
    }

    /// Ends successfully; `fallback` is the reason when the provider reported none.
    pub fn finish(&mut self, fallback: FinishReason, out: &mut Output) {
        if self.done {
            return;
        }
        self.start(None, None, out);
        self.done = true;
        let (reason, raw_reason) = match self.reason.take() {
            Some((reason, raw)) => (reason, Some(raw)),
            None => (fallback, None),
        };
        out.push(Ok(Event::StepFinish {
            reason,
            raw_reason,
            usage: self.usage,
        }));
    }

    /// Ends with an error, preceded by the `StepFinish` the contract owes a started step.
    pub fn fail(&mut self, error: Error, out: &mut Output) {
        if self.done {
            return;
        }
        if self.started {
            self.finish(FinishReason::Error, out);
        }
        self.done = true;
        out.push(Err(error));
    }
}

/// A JSON string borrowed from the input when it has no escapes, owned otherwise. For fields
/// that are inspected and dropped (types, ids, finish reasons), this saves an allocation per
/// event; serde's own `Cow` support does not borrow inside an `Option`.
#[derive(Debug)]
pub(crate) struct Str<'a>(pub std::borrow::Cow<'a, str>);

impl Str<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Str<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Borrowed(text)))
            }

            fn visit_str<E>(self, text: &str) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Owned(text.to_owned())))
            }

            fn visit_string<E>(self, text: String) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Owned(text)))
            }
        }

        deserializer.deserialize_str(Visitor)
    }
}
