//! The scripted provider: in-process and deterministic, driven by one [`Script`] per call, for
//! tests of everything above `llm`.
//!
//! ```
//! use agenthost_llm::{FinishReason, Provider, Request, scripted::{Script, Scripted}};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let provider = Scripted::new([
//!     Script::new().text("Let me look.").tool_call("c1", "lookup", r#"{"q":"x"}"#),
//!     Script::new().text("Found it.").finish(FinishReason::Stop),
//! ]);
//! let first = provider.generate(Request::new("m")).await.unwrap();
//! assert_eq!(first.tool_calls[0].name, "lookup");
//! assert_eq!(provider.calls(), 1);
//! # });
//! ```
//!
//! Emission follows the stream contract of [`crate::event`]: `StepStart` comes right before the
//! first output step (so a script that opens with `delay` then `error` looks like an HTTP error
//! after latency), consecutive `text` steps share one part, a script without `finish` ends with
//! `ToolCalls` when it made tool calls and `Stop` otherwise, and an `error` after output is
//! preceded by `StepFinish` with [`FinishReason::Error`].

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Semaphore;

use crate::error::{Error, ErrorKind};
use crate::event::{Event, FinishReason, Usage};
use crate::provider::{EventStream, Provider};
use crate::request::{ReasoningMetadata, Request, ToolCall};

/// One step of a scripted response.
#[derive(Clone, Debug)]
pub enum Step {
    /// A text delta; consecutive text steps form one part.
    Text(String),
    /// A reasoning delta; consecutive reasoning steps form one part, whose metadata is the last
    /// one given.
    Reasoning {
        /// The text.
        text: String,
        /// Metadata reported when the part ends.
        metadata: Option<ReasoningMetadata>,
    },
    /// A whole tool call, its input streamed in the given fragments.
    ToolCall {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Input fragments; the input is their concatenation (`{}` when empty).
        fragments: Vec<String>,
    },
    /// A tool call cut off mid-input, as when the provider hits its output limit: start and
    /// fragments only, never `ToolInputEnd` or `ToolCall`.
    TruncatedToolCall {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// The fragments that arrived.
        fragments: Vec<String>,
    },
    /// Any event, emitted as is (after `StepStart`, which is emitted first if needed): an
    /// escape hatch for sequences the other steps cannot express.
    Event(Event),
    /// The usage reported at finish (zero when never set).
    Usage(Usage),
    /// Ends the stream with this reason.
    Finish(FinishReason),
    /// Ends the stream with this error.
    Error(Error),
    /// Waits (tokio time, so a paused clock controls it).
    Delay(Duration),
    /// Returns `Pending` once and is polled again at once, as a network stream is between two
    /// chunks that arrived together.
    Yield,
    /// Never makes progress again; only dropping the stream ends it.
    Hang,
    /// Waits until the test releases the gate.
    Gate(Gate),
}

/// A scripted response: the steps of one call.
#[derive(Clone, Debug, Default)]
pub struct Script {
    steps: Vec<Step>,
}

impl Script {
    /// An empty script (it finishes with `Stop` and nothing else).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends any step.
    pub fn step(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// A text delta.
    pub fn text(self, text: impl Into<String>) -> Self {
        self.step(Step::Text(text.into()))
    }

    /// A reasoning delta without metadata.
    pub fn reasoning(self, text: impl Into<String>) -> Self {
        self.step(Step::Reasoning {
            text: text.into(),
            metadata: None,
        })
    }

    /// A reasoning delta with provider metadata (e.g. an Anthropic signature).
    pub fn reasoning_with(self, text: impl Into<String>, metadata: ReasoningMetadata) -> Self {
        self.step(Step::Reasoning {
            text: text.into(),
            metadata: Some(metadata),
        })
    }

    /// A tool call whose input arrives in one fragment.
    pub fn tool_call(
        self,
        id: impl Into<String>,
        name: impl Into<String>,
        input: impl Into<String>,
    ) -> Self {
        self.step(Step::ToolCall {
            id: id.into(),
            name: name.into(),
            fragments: vec![input.into()],
        })
    }

    /// A tool call whose input arrives in the given fragments.
    pub fn tool_call_fragments<I, S>(
        self,
        id: impl Into<String>,
        name: impl Into<String>,
        fragments: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.step(Step::ToolCall {
            id: id.into(),
            name: name.into(),
            fragments: fragments.into_iter().map(Into::into).collect(),
        })
    }

    /// A tool call cut off mid-input (no `ToolInputEnd`, no `ToolCall`); usually followed by
    /// `.finish(FinishReason::Length)`.
    pub fn truncated_tool_call<I, S>(
        self,
        id: impl Into<String>,
        name: impl Into<String>,
        fragments: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.step(Step::TruncatedToolCall {
            id: id.into(),
            name: name.into(),
            fragments: fragments.into_iter().map(Into::into).collect(),
        })
    }

    /// Emits `event` as is.
    pub fn event(self, event: Event) -> Self {
        self.step(Step::Event(event))
    }

    /// The usage to report at finish.
    pub fn usage(self, usage: Usage) -> Self {
        self.step(Step::Usage(usage))
    }

    /// Ends with this finish reason.
    pub fn finish(self, reason: FinishReason) -> Self {
        self.step(Step::Finish(reason))
    }

    /// Ends with this error.
    pub fn error(self, error: Error) -> Self {
        self.step(Step::Error(error))
    }

    /// Waits for `duration` of tokio time.
    pub fn delay(self, duration: Duration) -> Self {
        self.step(Step::Delay(duration))
    }

    /// Yields once: the stream is not ready for a moment (see [`Step::Yield`]).
    pub fn yield_now(self) -> Self {
        self.step(Step::Yield)
    }

    /// Hangs until the stream is dropped.
    pub fn hang(self) -> Self {
        self.step(Step::Hang)
    }

    /// Waits until `gate` is released.
    pub fn gate(self, gate: &Gate) -> Self {
        self.step(Step::Gate(gate.clone()))
    }
}

/// A point in a script where the stream waits for the test. Each [`Gate::release`] lets one
/// waiting (or future) arrival pass; [`Gate::open`] lets every arrival pass from now on;
/// [`Gate::reached`] waits until a stream arrives, so a test can act while a call is
/// mid-stream without sleeping.
#[derive(Clone, Default)]
pub struct Gate {
    inner: Arc<GateInner>,
}

struct GateInner {
    /// Permits to pass; closed means open for everyone.
    pass: Semaphore,
    /// One permit per arrival not yet observed by `reached`.
    arrived: Semaphore,
}

impl Default for GateInner {
    fn default() -> Self {
        Self {
            pass: Semaphore::new(0),
            arrived: Semaphore::new(0),
        }
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("releases", &self.inner.pass.available_permits())
            .field("open", &self.inner.pass.is_closed())
            .finish()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets one arrival pass.
    pub fn release(&self) {
        self.inner.pass.add_permits(1);
    }

    /// Lets every arrival pass, now and later.
    pub fn open(&self) {
        self.inner.pass.close();
    }

    /// Waits until a stream arrives at the gate (each arrival is observed once).
    pub async fn reached(&self) {
        // The arrival semaphore is never closed, so this always gets a permit.
        if let Ok(permit) = self.inner.arrived.acquire().await {
            permit.forget();
        }
    }

    /// Arrives at the gate and waits until it lets this arrival pass: what a script's gate step
    /// does, and what a test's own code (a tool, a hook) can do to stop at the same gate.
    pub async fn pass(&self) {
        self.inner.arrived.add_permits(1);
        if let Ok(permit) = self.inner.pass.acquire().await {
            permit.forget();
        }
        // A closed semaphore means the gate is open.
    }
}

/// A function answering each request with a script (or `None`).
type Respond = Box<dyn FnMut(&Request) -> Option<Script> + Send>;

/// What answers calls: a queue of scripts or a function of the request.
enum Responder {
    Queue(VecDeque<Script>),
    Function(Respond),
}

struct Inner {
    // std mutexes: held for a push or a pop, never across an await.
    responder: Mutex<Responder>,
    requests: Mutex<Vec<Request>>,
    calls: AtomicUsize,
}

/// The scripted provider. Cheap to clone; clones share the queue and the recorded requests, so
/// a test keeps one and hands another to the runtime.
#[derive(Clone)]
pub struct Scripted {
    inner: Arc<Inner>,
}

impl fmt::Debug for Scripted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scripted")
            .field("calls", &self.calls())
            .field("remaining", &self.remaining())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (push/pop only).
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Scripted {
    /// Answers call *n* with the *n*-th script; a call beyond the last gets an error.
    pub fn new(scripts: impl IntoIterator<Item = Script>) -> Self {
        Self::with_responder(Responder::Queue(scripts.into_iter().collect()))
    }

    /// Answers each call with `respond(request)`; `None` gets the "nothing scripted" error.
    pub fn from_fn(respond: impl FnMut(&Request) -> Option<Script> + Send + 'static) -> Self {
        Self::with_responder(Responder::Function(Box::new(respond)))
    }

    fn with_responder(responder: Responder) -> Self {
        Self {
            inner: Arc::new(Inner {
                responder: Mutex::new(responder),
                requests: Mutex::new(Vec::new()),
                calls: AtomicUsize::new(0),
            }),
        }
    }

    /// Queues another script (no effect on a function responder).
    pub fn push(&self, script: Script) {
        if let Responder::Queue(queue) = &mut *lock(&self.inner.responder) {
            queue.push_back(script);
        }
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.inner.requests).clone()
    }

    /// The last request received.
    pub fn last_request(&self) -> Option<Request> {
        lock(&self.inner.requests).last().cloned()
    }

    /// How many calls were made.
    pub fn calls(&self) -> usize {
        self.inner.calls.load(Ordering::SeqCst)
    }

    /// Scripts still queued (0 for a function responder).
    pub fn remaining(&self) -> usize {
        match &*lock(&self.inner.responder) {
            Responder::Queue(queue) => queue.len(),
            Responder::Function(_) => 0,
        }
    }
}

impl Provider for Scripted {
    fn stream(&self, request: Request) -> EventStream {
        let call = self.inner.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let script = match &mut *lock(&self.inner.responder) {
            Responder::Queue(queue) => queue.pop_front(),
            Responder::Function(respond) => respond(&request),
        };
        let model = request.model.clone();
        lock(&self.inner.requests).push(request);
        let Some(script) = script else {
            let error = Error::new(
                ErrorKind::InvalidRequest,
                format!("scripted provider: no scripted response left for call #{call}"),
            );
            return futures::stream::once(async move { Err(error) }).boxed();
        };
        let player = Player {
            steps: script.steps.into(),
            queue: VecDeque::new(),
            started: false,
            done: false,
            open: Open::None,
            next_part: 0,
            usage: Usage::default(),
            made_tool_calls: false,
            id: format!("scripted-{call}"),
            model,
        };
        futures::stream::unfold(player, |mut player| async move {
            let item = player.next().await?;
            Some((item, player))
        })
        .boxed()
    }
}

enum Open {
    None,
    Text(u32),
    Reasoning(u32, Option<ReasoningMetadata>),
}

struct Player {
    steps: VecDeque<Step>,
    queue: VecDeque<Result<Event, Error>>,
    started: bool,
    done: bool,
    open: Open,
    next_part: u32,
    usage: Usage,
    made_tool_calls: bool,
    id: String,
    model: String,
}

impl Player {
    async fn next(&mut self) -> Option<Result<Event, Error>> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            if self.done {
                return None;
            }
            match self.steps.pop_front() {
                None => {
                    let reason = if self.made_tool_calls {
                        FinishReason::ToolCalls
                    } else {
                        FinishReason::Stop
                    };
                    self.finish(reason);
                }
                Some(Step::Delay(duration)) => tokio::time::sleep(duration).await,
                Some(Step::Yield) => tokio::task::yield_now().await,
                Some(Step::Hang) => futures::future::pending::<()>().await,
                Some(Step::Gate(gate)) => gate.pass().await,
                Some(Step::Usage(usage)) => self.usage = usage,
                Some(Step::Event(event)) => {
                    self.start();
                    self.queue.push_back(Ok(event));
                }
                Some(Step::TruncatedToolCall {
                    id,
                    name,
                    fragments,
                }) => {
                    self.start();
                    self.close();
                    let part = self.part();
                    self.queue
                        .push_back(Ok(Event::ToolInputStart { part, id, name }));
                    for delta in fragments.into_iter().filter(|f| !f.is_empty()) {
                        self.queue
                            .push_back(Ok(Event::ToolInputDelta { part, delta }));
                    }
                }
                Some(Step::Finish(reason)) => self.finish(reason),
                Some(Step::Error(error)) => {
                    if self.started {
                        self.queue.push_back(Ok(Event::StepFinish {
                            reason: FinishReason::Error,
                            raw_reason: None,
                            usage: self.usage,
                        }));
                    }
                    self.queue.push_back(Err(error));
                    self.done = true;
                }
                Some(Step::Text(delta)) => {
                    self.start();
                    let part = match self.open {
                        Open::Text(part) => part,
                        _ => {
                            self.close();
                            let part = self.part();
                            self.open = Open::Text(part);
                            self.queue.push_back(Ok(Event::TextStart { part }));
                            part
                        }
                    };
                    self.queue.push_back(Ok(Event::TextDelta { part, delta }));
                }
                Some(Step::Reasoning { text, metadata }) => {
                    self.start();
                    let part = match &mut self.open {
                        Open::Reasoning(part, kept) => {
                            if metadata.is_some() {
                                *kept = metadata;
                            }
                            *part
                        }
                        _ => {
                            self.close();
                            let part = self.part();
                            self.open = Open::Reasoning(part, metadata);
                            self.queue.push_back(Ok(Event::ReasoningStart { part }));
                            part
                        }
                    };
                    self.queue
                        .push_back(Ok(Event::ReasoningDelta { part, delta: text }));
                }
                Some(Step::ToolCall {
                    id,
                    name,
                    fragments,
                }) => {
                    self.start();
                    self.close();
                    self.made_tool_calls = true;
                    let part = self.part();
                    self.queue.push_back(Ok(Event::ToolInputStart {
                        part,
                        id: id.clone(),
                        name: name.clone(),
                    }));
                    let mut input = String::new();
                    for delta in fragments.into_iter().filter(|f| !f.is_empty()) {
                        input.push_str(&delta);
                        self.queue
                            .push_back(Ok(Event::ToolInputDelta { part, delta }));
                    }
                    if input.trim().is_empty() {
                        input = "{}".to_owned();
                    }
                    self.queue.push_back(Ok(Event::ToolInputEnd { part }));
                    self.queue.push_back(Ok(Event::ToolCall {
                        part,
                        call: ToolCall { id, name, input },
                    }));
                }
            }
        }
    }

    fn start(&mut self) {
        if !self.started {
            self.started = true;
            self.queue.push_back(Ok(Event::StepStart {
                id: Some(self.id.clone()),
                model: Some(self.model.clone()),
            }));
        }
    }

    fn part(&mut self) -> u32 {
        let part = self.next_part;
        self.next_part += 1;
        part
    }

    fn close(&mut self) {
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => {}
            Open::Text(part) => self.queue.push_back(Ok(Event::TextEnd { part })),
            Open::Reasoning(part, metadata) => self
                .queue
                .push_back(Ok(Event::ReasoningEnd { part, metadata })),
        }
    }

    fn finish(&mut self, reason: FinishReason) {
        self.start();
        self.close();
        self.queue.push_back(Ok(Event::StepFinish {
            reason,
            raw_reason: None,
            usage: self.usage,
        }));
        self.done = true;
    }
}
