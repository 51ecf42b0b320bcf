//! The JSON wire types of the API, and their conversions from the domain types. Only this crate
//! knows them: the domain ([`agenthost_model`]) has no JSON shape of its own.
//!
//! Request bodies reject unknown fields, so a misspelled option is an error rather than being
//! silently ignored. Response types also derive `Deserialize` for [`crate::client`].
//!
//! Conventions: ids are strings (`ses_…`, `msg_…`), `seq` and times are integers (times in
//! milliseconds since the Unix epoch), enums are snake_case strings, tagged unions carry a
//! `type` (or, for tool states, `status`) field.

use agenthost_actors::{DeltaKind, Outcome};
use agenthost_model as model;
use agenthost_store::Receipt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::error::ErrorType;

/// Every successful `/api` response: the payload under `data`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Data<T> {
    pub data: T,
}

/// Every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: ErrorType,
    pub message: String,
}

/// `GET /api/cluster`: the nodes sharing the store and the partitions each holds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Cluster {
    /// `redb` (one node, the embedded store) or `postgres` (a cluster).
    pub store: String,
    /// The node that answered.
    pub node: String,
    /// Partitions sessions hash into (1 on the embedded store).
    pub partitions: u32,
    pub nodes: Vec<ClusterNode>,
}

/// One node of a cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterNode {
    pub id: String,
    /// How the other nodes reach it.
    pub url: String,
    /// Renewed its membership within the lease TTL.
    pub alive: bool,
    /// The partitions it holds an unexpired lease on.
    pub partitions: Vec<u32>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`; `disk_full` (status 200: reads work, writes are refused until there is space, then
    /// resume by themselves); `store_failed` (503: an I/O error stopped writes until a restart);
    /// `store_unreachable` (503: the shared PostgreSQL database cannot be reached; both work
    /// again once it is back); or `shutting_down` (503).
    pub status: String,
    /// Why, when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// `POST /api/session`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// A client-chosen id (`ses_` plus up to 64 of `[A-Za-z0-9_-]`); an existing id returns
    /// that session unchanged. Minted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The agent; the configured default agent when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Reserved: a session's model is its agent's model. Any value is refused with
    /// `invalid_request` until the runtime supports per-session models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// `POST /api/session/{id}/prompt`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    /// The idempotency key (`msg_…`). Re-sending the same id with the same prompt returns the
    /// original receipt; any difference is a `prompt_conflict`. Minted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<File>,
    /// `steer` (default) or `queue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// Wake the session once the input is durable (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<bool>,
}

/// A file attached to a prompt, by URL (`data:`, `file:` or `http(s):`); not fetched by the
/// server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub mime: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

/// `POST /api/session/{id}/generate`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Generate {
    pub prompt: String,
}

/// Query of `GET /api/session`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Sessions per page, 1–1000 (default 50).
    pub limit: Option<usize>,
    /// `cursor.next` of the previous page.
    pub cursor: Option<String>,
}

/// Query of `GET /api/session/{id}/messages`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MessagesQuery {
    /// Only messages with a larger seq (default: from the start).
    pub after_seq: Option<u64>,
    /// Messages per page, 1–1000 (default 100).
    pub limit: Option<usize>,
}

/// No options: `POST /api/session/{id}/interrupt` and `…/compact` take none (an empty body or
/// `{}` is fine).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoOptions {}

/// Options of `POST /api/session/{id}/resume`, as query parameters or a JSON body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ResumeQuery {
    /// Wait for the drain to end and return its outcome (default false: 202 at once).
    pub wait: Option<bool>,
}

/// Options of `POST /api/session/{id}/wait`, as query parameters or a JSON body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Longest wait in milliseconds (default 30000, at most the server's limit, 600000).
    pub timeout_ms: Option<u64>,
}

/// Query of `GET /api/session/{id}/events`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Replay durable events with a larger seq (default: from seq 0). A `Last-Event-ID`
    /// header, sent by reconnecting SSE clients, takes precedence.
    pub after: Option<u64>,
}

// ---------------------------------------------------------------------------------------------
// Sessions.

/// A session as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: String,
    pub agent: String,
    pub model: Option<String>,
    pub title: Option<String>,
    /// Creation time, ms since the Unix epoch.
    pub created: u64,
    pub updated: u64,
    /// Seq of the latest durable event.
    pub last_seq: u64,
    /// Token and cost totals.
    pub usage: Usage,
    pub status: Status,
    /// An execution holds a durable claim (it is running, or a crash left it for recovery).
    pub claimed: bool,
    /// Admitted inputs not yet promoted.
    pub pending: u32,
    pub resume_attempts: u32,
    /// Why the runtime stopped resuming the session automatically, if it did.
    pub halted: Option<String>,
}

impl Session {
    pub fn from_row(row: &model::SessionRow, running: bool) -> Self {
        Session {
            id: row.id.to_string(),
            agent: row.agent.clone(),
            model: row.model.clone(),
            title: row.title.clone(),
            created: row.created.0,
            updated: row.updated.0,
            last_seq: row.last_seq.0,
            usage: Usage::from(&row.usage),
            status: Status::new(running),
            claimed: row.claim.is_some(),
            pending: row.pending,
            resume_attempts: row.resume_attempts,
            halted: row.halted.clone(),
        }
    }
}

/// Whether a drain is in progress in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Status {
    #[serde(rename = "type")]
    pub kind: StatusType,
}

impl Status {
    pub fn new(running: bool) -> Self {
        Status {
            kind: if running {
                StatusType::Running
            } else {
                StatusType::Idle
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StatusType {
    Idle,
    Running,
}

/// `GET /api/session`: one page, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionPage {
    pub sessions: Vec<Session>,
    pub cursor: Cursor,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Cursor {
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next: Option<String>,
}

/// Token usage and cost. `input` excludes cached tokens; `input + cache_read + cache_write` is
/// the whole prompt; `reasoning` is part of `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub reasoning: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    /// Cost in billionths of a US dollar.
    pub cost_nanos: u64,
}

impl From<&model::Usage> for Usage {
    fn from(u: &model::Usage) -> Self {
        Usage {
            input: u.input,
            output: u.output,
            reasoning: u.reasoning,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            cost_nanos: u.cost_nanos,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Admission and execution.

/// The admission receipt. An exact retry returns the same receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Admitted {
    pub id: String,
    pub session_id: String,
    /// Seq of the `prompt_admitted` event.
    pub admitted_seq: u64,
    pub delivery: Delivery,
    /// Seq of the `prompt_promoted` event once the input became a user message.
    pub promoted_seq: Option<u64>,
}

impl From<&Receipt> for Admitted {
    fn from(r: &Receipt) -> Self {
        Admitted {
            id: r.id.to_string(),
            session_id: r.session.to_string(),
            admitted_seq: r.admitted_seq.0,
            delivery: r.delivery.into(),
            promoted_seq: r.promoted_seq.map(|s| s.0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    Steer,
    Queue,
}

impl From<model::Delivery> for Delivery {
    fn from(d: model::Delivery) -> Self {
        match d {
            model::Delivery::Steer => Delivery::Steer,
            model::Delivery::Queue => Delivery::Queue,
        }
    }
}

/// `POST /api/session/{id}/resume` without `wait`: the resume was handed to the session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Accepted {
    /// Always `accepted`.
    pub status: String,
}

/// How a drain ended (`POST /api/session/{id}/resume?wait=true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DrainOutcome {
    /// Nothing was owed; nothing was written.
    Idle,
    /// Ran `steps` steps and settled.
    Completed { steps: u32 },
    /// Stopped by an interrupt or a shutdown, after durable cleanup.
    Interrupted,
    /// A manual compaction finished; history before `kept_from` is summarized.
    Compacted { kept_from: u64 },
}

impl From<Outcome> for DrainOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Idle => DrainOutcome::Idle,
            Outcome::Completed { steps } => DrainOutcome::Completed { steps },
            Outcome::Interrupted => DrainOutcome::Interrupted,
            Outcome::Compacted { kept_from } => DrainOutcome::Compacted {
                kept_from: kept_from.0,
            },
        }
    }
}

/// `POST /api/session/{id}/interrupt`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Interrupted {
    /// Whether a drain was running (and is now stopped and cleaned up).
    pub interrupted: bool,
}

/// `POST /api/session/{id}/wait`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Idle {
    /// `true` when the session is idle; `false` when the timeout passed first.
    pub idle: bool,
}

/// `POST /api/session/{id}/generate`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Generated {
    pub text: String,
}

/// A tool call's whole output (`GET /api/session/{id}/tool-output/{message_id}/{call_id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ToolOutput {
    pub message_id: String,
    pub call_id: String,
    /// The output, or the error when the call failed.
    pub output: String,
    /// Its length in bytes.
    pub bytes: u64,
    pub failed: bool,
    /// Whether history keeps only a preview of it.
    pub cut: bool,
}

/// An admitted input not yet promoted (`GET /api/session/{id}/inbox`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InboxItem {
    pub id: String,
    pub admitted_seq: u64,
    pub delivery: Delivery,
    pub text: String,
    pub files: Vec<File>,
}

impl From<&model::InboxRow> for InboxItem {
    fn from(row: &model::InboxRow) -> Self {
        InboxItem {
            id: row.id.to_string(),
            admitted_seq: row.admitted_seq.0,
            delivery: row.delivery.into(),
            text: row.prompt.text.clone(),
            files: files(&row.prompt),
        }
    }
}

fn files(prompt: &model::Prompt) -> Vec<File> {
    prompt
        .files
        .iter()
        .map(|f| File {
            mime: f.mime.clone(),
            url: f.url.clone(),
            filename: f.filename.clone(),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Messages.

/// A message of session history, in seq order. `seq` is the seq of the event that created it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    User {
        id: String,
        seq: u64,
        text: String,
        files: Vec<File>,
        /// Seq of its `prompt_admitted` event.
        admitted_seq: u64,
        delivery: Delivery,
        time: Time,
    },
    Assistant {
        id: String,
        seq: u64,
        /// Step number within its exchange.
        step: u32,
        agent: String,
        model: String,
        content: Vec<Part>,
        /// Why the model stopped, once settled successfully: `stop`, `length`, `tool_calls`,
        /// `content_filter` or a provider-specific reason.
        finish: Option<String>,
        /// Why the step failed, once settled with an error.
        error: Option<StepError>,
        usage: Usage,
        /// Retries of this step (each recorded as `retry_scheduled`).
        retries: u32,
        time: Time,
    },
    /// A chronological instruction update.
    System {
        id: String,
        seq: u64,
        text: String,
        time: Time,
    },
    Compaction {
        id: String,
        seq: u64,
        auto: bool,
        state: Compaction,
        time: Time,
    },
}

/// When a message was created and, for an assistant message, settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Time {
    pub created: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

/// A content part of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// `incomplete` marks text cut short by a failed or interrupted stream.
    Text {
        text: String,
        incomplete: bool,
    },
    Reasoning {
        text: String,
        incomplete: bool,
    },
    Tool {
        call_id: String,
        name: String,
        /// The arguments: parsed JSON when the model sent valid JSON, otherwise the raw text
        /// as a string.
        #[schema(value_type = Object)]
        input: Value,
        state: ToolState,
    },
}

/// A tool call's state. `pending` (input still streaming) is only ever seen live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolState {
    Pending,
    Running,
    Completed {
        output: String,
        /// The output was cut to the configured bound, with a marker.
        truncated: bool,
    },
    Error {
        error: String,
    },
}

/// Why a step failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StepError {
    pub kind: FailureKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Interrupted by the user or a shutdown.
    Aborted,
    /// Left incomplete by a process that stopped; closed by recovery.
    Restarted,
    Provider,
    ContextOverflow,
    Internal,
}

impl From<&model::StepError> for StepError {
    fn from(e: &model::StepError) -> Self {
        StepError {
            kind: match e.kind {
                model::FailureKind::Aborted => FailureKind::Aborted,
                model::FailureKind::Restarted => FailureKind::Restarted,
                model::FailureKind::Provider => FailureKind::Provider,
                model::FailureKind::ContextOverflow => FailureKind::ContextOverflow,
                model::FailureKind::Internal => FailureKind::Internal,
            },
            message: e.message.clone(),
        }
    }
}

/// The state of a compaction message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Compaction {
    Running,
    /// History before `kept_from` is replaced by `summary`.
    Completed {
        summary: String,
        kept_from: u64,
    },
    Failed {
        error: String,
    },
}

/// The wire name of a finish reason.
pub fn finish(f: &model::Finish) -> String {
    match f {
        model::Finish::Stop => "stop".into(),
        model::Finish::Length => "length".into(),
        model::Finish::ToolCalls => "tool_calls".into(),
        model::Finish::ContentFilter => "content_filter".into(),
        model::Finish::Other(other) => other.clone(),
    }
}

/// Tool input as JSON: parsed when valid, else the raw text.
pub fn tool_input(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

impl From<&model::Message> for Message {
    fn from(m: &model::Message) -> Self {
        match m {
            model::Message::User {
                id,
                seq,
                admitted_seq,
                delivery,
                prompt,
                time,
            } => Message::User {
                id: id.to_string(),
                seq: seq.0,
                text: prompt.text.clone(),
                files: files(prompt),
                admitted_seq: admitted_seq.0,
                delivery: (*delivery).into(),
                time: Time {
                    created: time.0,
                    completed: None,
                },
            },
            model::Message::Assistant(a) => Message::Assistant {
                id: a.id.to_string(),
                seq: a.seq.0,
                step: a.step,
                agent: a.agent.clone(),
                model: a.model.clone(),
                content: a.parts.iter().map(Part::from).collect(),
                finish: a.finish.as_ref().map(finish),
                error: a.error.as_ref().map(StepError::from),
                usage: Usage::from(&a.usage),
                retries: a.retries,
                time: Time {
                    created: a.created.0,
                    completed: a.completed.map(|t| t.0),
                },
            },
            model::Message::System {
                id,
                seq,
                text,
                time,
            } => Message::System {
                id: id.to_string(),
                seq: seq.0,
                text: text.clone(),
                time: Time {
                    created: time.0,
                    completed: None,
                },
            },
            model::Message::Compaction {
                id,
                seq,
                auto,
                state,
                time,
            } => Message::Compaction {
                id: id.to_string(),
                seq: seq.0,
                auto: *auto,
                state: match state {
                    model::CompactionState::Running => Compaction::Running,
                    model::CompactionState::Completed { summary, kept_from } => {
                        Compaction::Completed {
                            summary: summary.clone(),
                            kept_from: kept_from.0,
                        }
                    }
                    model::CompactionState::Failed { error } => Compaction::Failed {
                        error: error.clone(),
                    },
                },
                time: Time {
                    created: time.0,
                    completed: None,
                },
            },
        }
    }
}

impl From<&model::Part> for Part {
    fn from(p: &model::Part) -> Self {
        match p {
            model::Part::Text { text, incomplete } => Part::Text {
                text: text.clone(),
                incomplete: *incomplete,
            },
            model::Part::Reasoning {
                text, incomplete, ..
            } => Part::Reasoning {
                text: text.clone(),
                incomplete: *incomplete,
            },
            model::Part::Tool(t) => Part::Tool {
                call_id: t.call_id.clone(),
                name: t.name.clone(),
                input: tool_input(&t.input),
                state: match &t.state {
                    model::ToolState::Running => ToolState::Running,
                    model::ToolState::Completed { output, truncated } => ToolState::Completed {
                        output: output.clone(),
                        truncated: *truncated,
                    },
                    model::ToolState::Error { error } => ToolState::Error {
                        error: error.clone(),
                    },
                },
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Events (the SSE stream).

/// A durable event as the SSE stream sends it (`event: <type>`, `id: <seq>`, this as `data`).
/// The `type` is the model's stable event name (`Event::kind()`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    pub seq: u64,
    /// When it was written, ms since the Unix epoch.
    pub time: u64,
    #[serde(flatten)]
    pub body: EventBody,
}

/// The kinds of durable event and their fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// Always seq 0.
    SessionCreated {
        agent: String,
        model: Option<String>,
        title: Option<String>,
    },
    /// Input recorded in the inbox, not yet visible to the model.
    PromptAdmitted {
        id: String,
        delivery: Delivery,
        text: String,
        files: Vec<File>,
    },
    /// The admitted input `id` became a user message at this seq.
    PromptPromoted {
        id: String,
    },
    /// Instruction sources changed; `text` is the rendered system message.
    InstructionsUpdated {
        id: String,
        changed: Vec<InstructionChange>,
        text: String,
    },
    /// A drain began executing and took the claim.
    ExecutionStarted {
        forced: bool,
    },
    ExecutionSucceeded,
    /// `halted`: no automatic resumption until an explicit resume.
    ExecutionFailed {
        error: String,
        halted: bool,
    },
    ExecutionInterrupted {
        reason: InterruptReason,
    },
    RecoveryAttempted {
        attempt: u32,
    },
    /// Creates the assistant message `id`.
    StepStarted {
        id: String,
        step: u32,
        agent: String,
        model: String,
    },
    TextEnded {
        id: String,
        text: String,
        incomplete: bool,
    },
    /// Reasoning text; the provider's opaque metadata (signatures) is not sent.
    ReasoningEnded {
        id: String,
        text: String,
        incomplete: bool,
    },
    /// Recorded before the tool runs.
    ToolCalled {
        id: String,
        call_id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
    ToolSucceeded {
        id: String,
        call_id: String,
        output: String,
        truncated: bool,
    },
    ToolFailed {
        id: String,
        call_id: String,
        error: String,
    },
    StepEnded {
        id: String,
        finish: String,
        usage: Usage,
    },
    StepFailed {
        id: String,
        error: StepError,
    },
    RetryScheduled {
        id: String,
        attempt: u32,
        delay_ms: u64,
        error: StepError,
    },
    CompactionStarted {
        id: String,
        auto: bool,
    },
    CompactionEnded {
        id: String,
        summary: String,
        kept_from: u64,
        usage: Usage,
    },
    CompactionFailed {
        id: String,
        error: String,
    },
    /// Usage of a model call that is not a step.
    UsageRecorded {
        usage: Usage,
    },
    /// Usage of an attempt of step `id` that did not end it (retried, cut off or failed); it
    /// counts in the message's usage and in the session totals.
    StepUsage {
        id: String,
        usage: Usage,
    },
    /// The whole output of a call history keeps a preview of was stored (`bytes` long); read it
    /// from `GET /api/session/{id}/tool-output/{message_id}/{call_id}`.
    ToolOutput {
        id: String,
        call_id: String,
        bytes: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstructionChange {
    pub source: String,
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InterruptReason {
    User,
    Shutdown,
}

impl From<&model::Stored> for Event {
    fn from(stored: &model::Stored) -> Self {
        use model::Event as E;
        let body = match &stored.event {
            E::SessionCreated {
                agent,
                model,
                title,
            } => EventBody::SessionCreated {
                agent: agent.clone(),
                model: model.clone(),
                title: title.clone(),
            },
            E::PromptAdmitted {
                id,
                delivery,
                prompt,
            } => EventBody::PromptAdmitted {
                id: id.to_string(),
                delivery: (*delivery).into(),
                text: prompt.text.clone(),
                files: files(prompt),
            },
            E::PromptPromoted { id } => EventBody::PromptPromoted { id: id.to_string() },
            E::InstructionsUpdated { id, changed, text } => EventBody::InstructionsUpdated {
                id: id.to_string(),
                changed: changed
                    .iter()
                    .map(|(source, value)| InstructionChange {
                        source: source.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                text: text.clone(),
            },
            E::ExecutionStarted { forced } => EventBody::ExecutionStarted { forced: *forced },
            E::ExecutionSucceeded => EventBody::ExecutionSucceeded,
            E::ExecutionFailed { error, halted } => EventBody::ExecutionFailed {
                error: error.clone(),
                halted: *halted,
            },
            E::ExecutionInterrupted { reason } => EventBody::ExecutionInterrupted {
                reason: match reason {
                    model::InterruptReason::User => InterruptReason::User,
                    model::InterruptReason::Shutdown => InterruptReason::Shutdown,
                },
            },
            E::RecoveryAttempted { attempt } => EventBody::RecoveryAttempted { attempt: *attempt },
            E::StepStarted {
                id,
                step,
                agent,
                model,
            } => EventBody::StepStarted {
                id: id.to_string(),
                step: *step,
                agent: agent.clone(),
                model: model.clone(),
            },
            E::TextEnded {
                id,
                text,
                incomplete,
            } => EventBody::TextEnded {
                id: id.to_string(),
                text: text.clone(),
                incomplete: *incomplete,
            },
            E::ReasoningEnded {
                id,
                text,
                incomplete,
                ..
            } => EventBody::ReasoningEnded {
                id: id.to_string(),
                text: text.clone(),
                incomplete: *incomplete,
            },
            E::ToolCalled {
                id,
                call_id,
                name,
                input,
            } => EventBody::ToolCalled {
                id: id.to_string(),
                call_id: call_id.clone(),
                name: name.clone(),
                input: tool_input(input),
            },
            E::ToolSucceeded {
                id,
                call_id,
                output,
                truncated,
            } => EventBody::ToolSucceeded {
                id: id.to_string(),
                call_id: call_id.clone(),
                output: output.clone(),
                truncated: *truncated,
            },
            E::ToolFailed { id, call_id, error } => EventBody::ToolFailed {
                id: id.to_string(),
                call_id: call_id.clone(),
                error: error.clone(),
            },
            E::StepEnded { id, finish, usage } => EventBody::StepEnded {
                id: id.to_string(),
                finish: self::finish(finish),
                usage: usage.into(),
            },
            E::StepFailed { id, error } => EventBody::StepFailed {
                id: id.to_string(),
                error: error.into(),
            },
            E::RetryScheduled {
                id,
                attempt,
                delay_ms,
                error,
            } => EventBody::RetryScheduled {
                id: id.to_string(),
                attempt: *attempt,
                delay_ms: *delay_ms,
                error: error.into(),
            },
            E::CompactionStarted { id, auto } => EventBody::CompactionStarted {
                id: id.to_string(),
                auto: *auto,
            },
            E::CompactionEnded {
                id,
                summary,
                kept_from,
                usage,
            } => EventBody::CompactionEnded {
                id: id.to_string(),
                summary: summary.clone(),
                kept_from: kept_from.0,
                usage: usage.into(),
            },
            E::CompactionFailed { id, error } => EventBody::CompactionFailed {
                id: id.to_string(),
                error: error.clone(),
            },
            E::UsageRecorded { usage } => EventBody::UsageRecorded {
                usage: usage.into(),
            },
            E::StepUsage { id, usage } => EventBody::StepUsage {
                id: id.to_string(),
                usage: usage.into(),
            },
            E::ToolOutput {
                id,
                call_id,
                output,
            } => EventBody::ToolOutput {
                id: id.to_string(),
                call_id: call_id.clone(),
                bytes: output.len() as u64,
            },
        };
        Event {
            seq: stored.seq.0,
            time: stored.time.0,
            body,
        }
    }
}

/// A streamed fragment of an assistant part (`event: delta`, no `id`). Ephemeral: the part's
/// durable `*_ended` or `tool_called` event follows and is authoritative.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Delta {
    /// The assistant message.
    pub message_id: String,
    pub kind: DeltaType,
    /// Part number within the message.
    pub part: u32,
    pub delta: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeltaType {
    Text,
    Reasoning,
    ToolInput,
    /// A compaction's summary; `message_id` is the compaction's.
    Summary,
}

impl From<DeltaKind> for DeltaType {
    fn from(k: DeltaKind) -> Self {
        match k {
            DeltaKind::Text => DeltaType::Text,
            DeltaKind::Reasoning => DeltaType::Reasoning,
            DeltaKind::ToolInput => DeltaType::ToolInput,
            DeltaKind::Summary => DeltaType::Summary,
        }
    }
}

/// `event: synced`: the replay is complete; live events follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Synced {
    /// Seq of the last durable event sent so far (`null` when none was).
    pub last_seq: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenthost_model::{
        Event as E, FailureKind as F, Finish, InterruptReason as R, MessageId, Prompt, Seq,
        StepError as SE, Stored, Timestamp,
    };

    fn every_event() -> Vec<E> {
        let id = MessageId::parse("msg_1").expect("invariant: valid id");
        let err = SE {
            kind: F::Provider,
            message: "x".into(),
        };
        vec![
            E::SessionCreated {
                agent: "a".into(),
                model: None,
                title: None,
            },
            E::PromptAdmitted {
                id: id.clone(),
                delivery: model::Delivery::Queue,
                prompt: Prompt::text("hi"),
            },
            E::PromptPromoted { id: id.clone() },
            E::InstructionsUpdated {
                id: id.clone(),
                changed: vec![("system".into(), "be brief".into())],
                text: "be brief".into(),
            },
            E::ExecutionStarted { forced: true },
            E::ExecutionSucceeded,
            E::ExecutionFailed {
                error: "e".into(),
                halted: false,
            },
            E::ExecutionInterrupted { reason: R::User },
            E::RecoveryAttempted { attempt: 2 },
            E::StepStarted {
                id: id.clone(),
                step: 1,
                agent: "a".into(),
                model: "m".into(),
            },
            E::TextEnded {
                id: id.clone(),
                text: "t".into(),
                incomplete: false,
            },
            E::ReasoningEnded {
                id: id.clone(),
                text: "r".into(),
                metadata: Some("sig".into()),
                incomplete: true,
            },
            E::ToolCalled {
                id: id.clone(),
                call_id: "c".into(),
                name: "n".into(),
                input: r#"{"q":1}"#.into(),
            },
            E::ToolSucceeded {
                id: id.clone(),
                call_id: "c".into(),
                output: "o".into(),
                truncated: false,
            },
            E::ToolFailed {
                id: id.clone(),
                call_id: "c".into(),
                error: "e".into(),
            },
            E::StepEnded {
                id: id.clone(),
                finish: Finish::ToolCalls,
                usage: model::Usage::default(),
            },
            E::StepFailed {
                id: id.clone(),
                error: err.clone(),
            },
            E::RetryScheduled {
                id: id.clone(),
                attempt: 1,
                delay_ms: 2000,
                error: err,
            },
            E::CompactionStarted {
                id: id.clone(),
                auto: true,
            },
            E::CompactionEnded {
                id: id.clone(),
                summary: "s".into(),
                kept_from: Seq(4),
                usage: model::Usage::default(),
            },
            E::CompactionFailed {
                id,
                error: "e".into(),
            },
            E::UsageRecorded {
                usage: model::Usage::default(),
            },
            E::StepUsage {
                id: MessageId::parse("msg_x").expect("id"),
                usage: model::Usage::default(),
            },
            E::ToolOutput {
                id: MessageId::parse("msg_x").expect("id"),
                call_id: "c".into(),
                output: "whole".into(),
            },
        ]
    }

    #[test]
    fn event_type_is_the_model_kind_and_round_trips() {
        for (n, event) in every_event().into_iter().enumerate() {
            let stored = Stored {
                seq: Seq(n as u64),
                time: Timestamp(1000 + n as u64),
                event: event.clone(),
            };
            let wire = Event::from(&stored);
            let json = serde_json::to_value(&wire).expect("invariant: serializable");
            assert_eq!(json["type"], event.kind(), "{json}");
            assert_eq!(json["seq"], n as u64);
            assert_eq!(json["time"], 1000 + n as u64);
            let back: Event = serde_json::from_value(json.clone()).expect("round trip");
            assert_eq!(back, wire, "{json}");
        }
    }

    #[test]
    fn rendering_is_stable() {
        let stored = Stored {
            seq: Seq(7),
            time: Timestamp(42),
            event: E::ToolCalled {
                id: MessageId::parse("msg_a").expect("invariant: valid id"),
                call_id: "c1".into(),
                name: "lookup".into(),
                input: r#"{"q":"x"}"#.into(),
            },
        };
        assert_eq!(
            serde_json::to_string(&Event::from(&stored)).expect("invariant: serializable"),
            r#"{"seq":7,"time":42,"type":"tool_called","id":"msg_a","call_id":"c1","name":"lookup","input":{"q":"x"}}"#
        );
        let invalid = tool_input("{not json");
        assert_eq!(invalid, Value::String("{not json".into()));
    }

    #[test]
    fn message_json_has_the_documented_fields() {
        let assistant = model::Message::Assistant(model::AssistantMessage {
            id: MessageId::parse("msg_b").expect("invariant: valid id"),
            seq: Seq(3),
            step: 1,
            agent: "default".into(),
            model: "m".into(),
            parts: vec![
                model::Part::Text {
                    text: "hi".into(),
                    incomplete: false,
                },
                model::Part::Tool(model::ToolPart {
                    call_id: "c1".into(),
                    name: "lookup".into(),
                    input: "{}".into(),
                    state: model::ToolState::Completed {
                        output: "ok".into(),
                        truncated: false,
                    },
                }),
            ],
            finish: Some(Finish::Stop),
            error: None,
            usage: model::Usage::default(),
            retries: 0,
            created: Timestamp(5),
            completed: Some(Timestamp(6)),
        });
        let json = serde_json::to_value(Message::from(&assistant)).expect("serializable");
        assert_eq!(json["type"], "assistant");
        assert_eq!(json["id"], "msg_b");
        assert_eq!(json["seq"], 3);
        assert_eq!(json["finish"], "stop");
        assert_eq!(json["error"], Value::Null);
        assert_eq!(json["time"]["completed"], 6);
        assert_eq!(json["content"][0]["type"], "text");
        assert_eq!(json["content"][1]["type"], "tool");
        assert_eq!(json["content"][1]["state"]["status"], "completed");
        assert_eq!(json["content"][1]["state"]["output"], "ok");
        assert_eq!(json["usage"]["input"], 0);
    }
}
