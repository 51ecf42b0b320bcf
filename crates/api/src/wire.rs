//! The JSON wire types of the API. The server serializes them and the [`crate::Client`]
//! deserializes them, so the two cannot disagree about a field; with the `domain` feature, the
//! conversions from the domain types ([`agenthost_model`]) come along (module `domain`): the
//! domain has no JSON shape of its own.
//!
//! Request bodies reject unknown fields, so a misspelled option is an error rather than being
//! silently ignored. Every type derives both `Serialize` and `Deserialize`.
//!
//! Conventions: ids are strings (`ses_…`, `msg_…`), `seq` and times are integers (times in
//! milliseconds since the Unix epoch), enums are snake_case strings, tagged unions carry a
//! `type` (or, for tool states, `status`) field.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// Every successful `/api` response: the payload under `data`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Data<T> {
    pub data: T,
}

/// The `type` of an error body. Stable: clients branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// 404: the session does not exist.
    SessionNotFound,
    /// 409: a prompt id was reused with a different prompt, session or delivery.
    PromptConflict,
    /// 409: the session is running work the request cannot join (a compaction while a drain
    /// runs, or before a previous run's work is recovered); send it again once the session is
    /// idle.
    SessionBusy,
    /// 400: malformed JSON, an unknown field, an invalid id, value or query parameter.
    InvalidRequest,
    /// 409: the approval was decided already; the body's `decision` is the first decision,
    /// which stands.
    ApprovalDecided,
    /// 409: the decision's `digest` is not the digest of the call's name and input: it would
    /// decide something else than what was asked.
    DigestMismatch,
    /// 409: a schedule of that id exists with another text, delivery or time.
    ScheduleConflict,
    /// 413: the body or the prompt is over its size limit.
    PayloadTooLarge,
    /// 415: a body sent with a content type other than JSON.
    UnsupportedMediaType,
    /// 408: the request body did not arrive in time.
    RequestTimeout,
    /// 422: the session's history does not fit the model's context window.
    ContextOverflow,
    /// 401: a token is configured and the request lacks it or has another one.
    Unauthorized,
    /// 402: the call would pass the session's budget (`generate`, a compaction); raise it with
    /// `PATCH /api/session/{id}`.
    BudgetExhausted,
    /// 403: the token's role does not allow the route, or the request's `Host` is not a name
    /// this server answers to (a page that rebinds its name to this machine).
    Forbidden,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 502: the model provider failed.
    ProviderError,
    /// 503: overloaded, shutting down, or a session actor did not answer in time.
    Unavailable,
    /// 500: a storage failure, a configuration that cannot serve the session, or a bug (a
    /// panicked drain). The message gives only a request id (also in `x-request-id`); the
    /// server's log holds the detail under it.
    Internal,
}

impl ErrorType {
    /// The HTTP status an error of this type comes with.
    pub fn status(self) -> u16 {
        match self {
            ErrorType::SessionNotFound | ErrorType::NotFound => 404,
            ErrorType::PromptConflict
            | ErrorType::SessionBusy
            | ErrorType::ApprovalDecided
            | ErrorType::DigestMismatch
            | ErrorType::ScheduleConflict => 409,
            ErrorType::InvalidRequest => 400,
            ErrorType::PayloadTooLarge => 413,
            ErrorType::UnsupportedMediaType => 415,
            ErrorType::RequestTimeout => 408,
            ErrorType::ContextOverflow => 422,
            ErrorType::Unauthorized => 401,
            ErrorType::Forbidden => 403,
            ErrorType::BudgetExhausted => 402,
            ErrorType::MethodNotAllowed => 405,
            ErrorType::ProviderError => 502,
            ErrorType::Unavailable => 503,
            ErrorType::Internal => 500,
        }
    }

    /// The wire name, as in the body's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::SessionNotFound => "session_not_found",
            ErrorType::PromptConflict => "prompt_conflict",
            ErrorType::SessionBusy => "session_busy",
            ErrorType::InvalidRequest => "invalid_request",
            ErrorType::ApprovalDecided => "approval_decided",
            ErrorType::DigestMismatch => "digest_mismatch",
            ErrorType::ScheduleConflict => "schedule_conflict",
            ErrorType::PayloadTooLarge => "payload_too_large",
            ErrorType::UnsupportedMediaType => "unsupported_media_type",
            ErrorType::RequestTimeout => "request_timeout",
            ErrorType::ContextOverflow => "context_overflow",
            ErrorType::Unauthorized => "unauthorized",
            ErrorType::Forbidden => "forbidden",
            ErrorType::BudgetExhausted => "budget_exhausted",
            ErrorType::NotFound => "not_found",
            ErrorType::MethodNotAllowed => "method_not_allowed",
            ErrorType::ProviderError => "provider_error",
            ErrorType::Unavailable => "unavailable",
            ErrorType::Internal => "internal",
        }
    }
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
    /// With `approval_decided`: the decision that was made first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
}

/// An MCP server the runtime runs tools of (`GET /api/mcp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct McpServer {
    pub name: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// Its tools' annotations may decide whether a call a stop cut runs again.
    pub trusted: bool,
    pub status: McpStatus,
    /// Its tools, as the runtime names them (`<server>_<tool>`); empty unless `ready`.
    pub tools: Vec<McpTool>,
    /// Why the last connection failed or ended.
    pub last_error: Option<String>,
    /// Connections that failed or ended and were tried again.
    pub restarts: u64,
    /// The last lines the server wrote to stderr (stdio servers).
    pub stderr: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpStatus {
    /// Connecting for the first time.
    Starting,
    Ready,
    /// The last attempt failed; another follows after a backoff.
    Failed,
    /// Its connection ended; connecting again.
    Restarting,
}

/// A tool of an MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct McpTool {
    /// The runtime's name: what agents' `tools` and `ask` patterns match.
    pub name: String,
    /// The server's own name.
    pub original: String,
    pub description: String,
    /// The server's annotations (`readOnlyHint`, `idempotentHint`, `destructiveHint`).
    pub read_only: Option<bool>,
    pub idempotent: Option<bool>,
    pub destructive: Option<bool>,
    /// A call a stop cut runs again with the same idempotency key (a trusted server's
    /// read-only or idempotent tool, or one the configuration names); otherwise the model is
    /// told it may or may not have taken effect.
    pub reruns: bool,
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
    /// The session's own budget; its limits replace its agent's where set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// `PATCH /api/session/{id}`: what to change.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSession {
    /// The session's own budget, replacing the one it had (a limit left out is its agent's, if
    /// any). A session the budget blocked goes on where it stopped.
    pub budget: Option<Budget>,
}

/// A session's budget: the limits in force, its own, what it spent and what is left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetState {
    /// The limits in force: its agent's, with its own over them.
    pub limits: Budget,
    /// The session's own limits.
    pub own: Budget,
    /// What it spent over its life (every model call, failed attempts included).
    pub spent_tokens: u64,
    pub spent_cost_usd: f64,
    /// What is left of the life limits (`max_tokens`, `max_cost_usd`); per-turn limits apply to
    /// each user turn.
    pub left: Budget,
    /// The limit that blocks the session (`max_tokens`, `max_cost`, `turn_max_tokens` or
    /// `turn_max_cost`), while it does.
    pub blocked: Option<String>,
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
    pub delivery: Option<Delivery>,
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Sessions per page, 1–1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// `cursor.next` of the previous page.
    pub cursor: Option<String>,
}

/// Query of `GET /api/session/{id}/messages`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MessagesQuery {
    /// Only messages with a larger seq (default: from the start).
    pub after_seq: Option<u64>,
    /// Messages per page, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Query of `GET /api/session/{id}/inbox`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InboxQuery {
    /// Only inputs admitted after this seq (default: from the oldest).
    pub after_seq: Option<u64>,
    /// Inputs per page, 1–1000 (default 100); a page also ends once its prompts pass 4 MiB.
    #[param(minimum = 1, maximum = 1000)]
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
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
    /// An execution holds a durable claim (it is running, waits for approvals, or a crash left
    /// it for recovery).
    pub claimed: bool,
    /// Admitted inputs not yet promoted.
    pub pending: u32,
    pub resume_attempts: u32,
    /// Why the runtime stopped resuming the session automatically, if it did.
    pub halted: Option<String>,
    /// Its budget, where the server knows its agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetState>,
}

/// What the session is doing in this process: a drain in progress, waiting for approvals, or
/// idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Status {
    #[serde(rename = "type")]
    pub kind: StatusType,
}

impl Status {
    pub fn new(running: bool) -> Self {
        Status::of(if running {
            StatusType::Running
        } else {
            StatusType::Idle
        })
    }

    pub fn of(kind: StatusType) -> Self {
        Status { kind }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StatusType {
    Idle,
    Running,
    /// A call of its last step waits for a person's approval (`GET …/approvals`); it holds no
    /// drain and runs again once every approval is decided or expired.
    Waiting,
    /// Its next model call would pass its budget: it keeps its input and holds no drain, and runs
    /// again once its budget changes (`PATCH /api/session/{id}`) or a user interrupts it.
    Blocked,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    Steer,
    Queue,
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
    /// The exchange waits for a person's approval of a call; the earliest approval expires at
    /// `expires_at` (ms since the Unix epoch).
    Waiting { expires_at: u64 },
    /// The exchange's next call would pass the `which` limit of the session's budget; it was not
    /// made, and the session is blocked.
    Blocked { which: String },
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
        #[schema(value_type = Value)]
        input: Value,
        state: ToolState,
    },
    /// The approval tool call `call_id` of this message waits for, or its decision.
    Approval {
        call_id: String,
        digest: String,
        /// When it expires unless decided, ms since the Unix epoch.
        expires_at: u64,
        decision: Option<ApprovalDecision>,
    },
}

/// A tool call's state. `pending` (input still streaming) is only ever seen live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolState {
    Pending,
    Running,
    /// Recorded and not started: it waits for its approval (the message's `approval` part for
    /// the same `call_id`), or it was approved and starts with the session's next run.
    Waiting,
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
        #[schema(value_type = Value)]
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
    /// Tool call `call_id`, recorded with it, waits for a person's approval of exactly
    /// `digest` until `expires_at` (ms since the Unix epoch).
    ApprovalRequested {
        id: String,
        call_id: String,
        /// The tool.
        name: String,
        digest: String,
        expires_at: u64,
    },
    /// The approval of `call_id` was decided, once.
    ApprovalDecided {
        id: String,
        call_id: String,
        decision: Verdict,
        by: Option<String>,
        reason: Option<String>,
    },
    /// An approved call starts; a refused one settles with `tool_failed` instead.
    ToolStarted {
        id: String,
        call_id: String,
    },
    /// A schedule was set.
    ScheduleSet {
        schedule: Schedule,
    },
    /// Schedule `id` fired for its time `at` (ms since the Unix epoch): with `admitted`, its
    /// prompt was admitted (as input `msg_<schedule id body>-<at>`); without, the firing was
    /// missed while no process ran and skipped. It fires next at `next`, or never again.
    ScheduleFired {
        id: String,
        at: u64,
        next: Option<u64>,
        admitted: bool,
    },
    /// Schedule `id` was cancelled.
    ScheduleCancelled {
        id: String,
    },
    /// The session's own budget was set (its limits replace its agent's where set); a session a
    /// budget blocked runs on.
    BudgetSet {
        budget: Budget,
    },
    /// A model call was not made: at its worst it would have passed the `which` limit
    /// (`max_tokens`, `max_cost`, `turn_max_tokens` or `turn_max_cost`), of which `spent` was
    /// spent (tokens, or billionths of a US dollar for a cost). The session is blocked, keeping
    /// its input, until its budget changes or a user interrupts it.
    BudgetExhausted {
        which: String,
        spent: u64,
        limit: u64,
    },
    /// The interrupt just before was asked by the token named `by`.
    InterruptRequested {
        by: String,
    },
}

/// Limits on what a session spends on model calls, over its life and per user turn (since its
/// latest user message); a missing or null field is no limit of the session's own (its agent's
/// applies, if any).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// In US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_max_tokens: Option<u64>,
    /// In US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_max_cost_usd: Option<f64>,
}

// ---------------------------------------------------------------------------------------------
// Schedules.

/// `POST /api/session/{id}/schedules`: exactly one of `at`, `after_ms` and `cron`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSchedule {
    /// A schedule id (`sch_…`, at most 40 characters after the prefix); an exact retry returns
    /// the schedule unchanged. Minted when absent.
    pub id: Option<String>,
    /// The prompt each firing admits.
    pub text: String,
    /// `steer` (default) or `queue`.
    pub delivery: Option<Delivery>,
    /// Once, at this RFC 3339 time.
    pub at: Option<String>,
    /// Once, this many milliseconds from now.
    pub after_ms: Option<u64>,
    /// At every time this five-field cron expression names (minute, hour, day of month, month,
    /// day of week).
    pub cron: Option<String>,
    /// The IANA time zone of `cron` (default UTC).
    pub tz: Option<String>,
    /// Firings missed while no process ran: `once` (default: one firing for all) or `skip`.
    pub catch_up: Option<CatchUp>,
}

/// A schedule of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Schedule {
    pub id: String,
    pub text: String,
    pub delivery: Delivery,
    /// The cron expression, for a repeating schedule; `null` for a one-shot.
    pub cron: Option<String>,
    pub tz: Option<String>,
    pub catch_up: CatchUp,
    /// The next firing, ms since the Unix epoch.
    pub next: u64,
    /// The next firing, as RFC 3339.
    pub next_at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    Once,
    Skip,
}

/// `DELETE /api/session/{id}/schedules/{schedule_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleCancelled {
    /// Whether a schedule of that id existed (and is now cancelled).
    pub cancelled: bool,
}

// ---------------------------------------------------------------------------------------------
// Approvals.

/// A decision on an approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalDecision {
    pub decision: Verdict,
    /// Who decided; `null` for the runtime's own decisions (expiry, cancellation).
    pub by: Option<String>,
    pub reason: Option<String>,
    /// When, ms since the Unix epoch.
    pub time: u64,
}

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The call runs, exactly once.
    Approved,
    /// The model gets the denial as the call's result, with who denied it and why.
    Denied,
    /// Nobody decided in time: denied as expired.
    Expired,
    /// An interrupt, steering input (`on_new_input = "deny"`) or a failed execution withdrew it.
    Cancelled,
}

/// A pending approval (`GET /api/session/{id}/approvals`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Approval {
    /// The assistant message that made the call.
    pub message_id: String,
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// The arguments: parsed JSON when the model sent valid JSON, otherwise the raw text.
    #[schema(value_type = Value)]
    pub input: Value,
    /// Send it back with the decision: it binds the decision to this name and input.
    pub digest: String,
    /// When it expires unless decided, ms since the Unix epoch.
    pub expires_at: u64,
}

/// `POST /api/session/{id}/approvals/{message_id}/{call_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    pub decision: DecideKind,
    /// The approval's `digest`, as listed.
    pub digest: String,
    /// Why; the model sees it with a denial. At most 4096 bytes.
    pub reason: Option<String>,
    /// Who decides; the model sees it with a denial. At most 256 bytes.
    pub by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecideKind {
    Approve,
    Deny,
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

/// `event: synced`: the replay is complete; live events follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Synced {
    /// Seq of the last durable event sent so far (`null` when none was).
    pub last_seq: Option<u64>,
}
