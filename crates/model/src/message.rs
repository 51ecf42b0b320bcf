//! Projected rows: messages with their parts, the session row, inbox rows, the message-id index
//! and instruction state. These are what snapshots read; only the projector writes
//! them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::StepError;
use crate::ids::{MessageId, Seq, SessionId, Timestamp};
use crate::prompt::{Delivery, Prompt};

/// Token usage and cost of one model call, or a running total. Input counts exclude cached
/// tokens: `input + cache_read + cache_write` is the whole prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub reasoning: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    /// Cost in billionths of a US dollar; integers keep totals exact.
    pub cost_nanos: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input += other.input;
        self.output += other.output;
        self.reasoning += other.reasoning;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.cost_nanos += other.cost_nanos;
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Other(String),
}

/// A durable claim: execution is in progress for the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Seq of the `ExecutionStarted` that took it.
    pub seq: Seq,
    pub forced: bool,
}

/// The session row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    pub id: SessionId,
    pub agent: String,
    pub model: Option<String>,
    pub title: Option<String>,
    pub created: Timestamp,
    pub updated: Timestamp,
    /// Seq of the latest event; the next event gets `last_seq + 1`.
    pub last_seq: Seq,
    pub usage: Usage,
    pub claim: Option<Claim>,
    /// Recoveries attempted in a row without progress: reset by a completed step and by every
    /// execution that releases the claim.
    pub resume_attempts: u32,
    /// Set when the runtime gave up on the session (restart intensity exceeded, recovery
    /// exhausted): nothing resumes it until an explicit resume.
    pub halted: Option<String>,
    /// History before this seq is covered by the latest completed compaction's summary.
    pub active_from: Seq,
    /// The latest completed compaction message, if any.
    pub compaction: Option<Seq>,
    /// Inputs admitted and not yet promoted.
    pub pending: u32,
    /// The session's own budget (`BudgetSet`), over its agent's.
    pub budget: crate::budget::Budget,
    /// The limit that blocks the exchange (`BudgetExhausted`) until the budget changes or the
    /// claim is released.
    pub blocked: Option<crate::budget::Limit>,
}

/// An admitted input that has not been promoted yet, keyed by `(session, admitted_seq)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxRow {
    pub id: MessageId,
    pub admitted_seq: Seq,
    pub delivery: Delivery,
    pub prompt: Prompt,
    /// Its admission asked for a wake (see `Event::PromptAdmitted`).
    pub wake: bool,
}

/// Where a message id lives. Every id is unique across the whole store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexEntry {
    /// An admitted input; `promoted_seq` is set once it became a user message.
    Prompt {
        session: SessionId,
        admitted_seq: Seq,
        promoted_seq: Option<Seq>,
    },
    /// Any other message, created at `seq`.
    Message { session: SessionId, seq: Seq },
}

impl IndexEntry {
    pub fn session(&self) -> &SessionId {
        match self {
            IndexEntry::Prompt { session, .. } | IndexEntry::Message { session, .. } => session,
        }
    }
}

/// What each instruction source last told the model, by source name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InstructionState {
    pub sources: BTreeMap<String, String>,
}

/// A message of session history, keyed by `(session, seq)` where `seq` is the seq of the event
/// that created it and never changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    User {
        id: MessageId,
        seq: Seq,
        admitted_seq: Seq,
        delivery: Delivery,
        prompt: Prompt,
        time: Timestamp,
    },
    Assistant(AssistantMessage),
    /// A chronological instruction update: what changed, rendered as one system message.
    System {
        id: MessageId,
        seq: Seq,
        text: String,
        time: Timestamp,
    },
    Compaction {
        id: MessageId,
        seq: Seq,
        auto: bool,
        state: CompactionState,
        time: Timestamp,
    },
}

impl Message {
    pub fn id(&self) -> &MessageId {
        match self {
            Message::User { id, .. }
            | Message::System { id, .. }
            | Message::Compaction { id, .. } => id,
            Message::Assistant(a) => &a.id,
        }
    }

    pub fn seq(&self) -> Seq {
        match self {
            Message::User { seq, .. }
            | Message::System { seq, .. }
            | Message::Compaction { seq, .. } => *seq,
            Message::Assistant(a) => a.seq,
        }
    }
}

/// The state of a compaction message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompactionState {
    Running,
    /// History before `kept_from` is replaced by `summary`.
    Completed {
        summary: String,
        kept_from: Seq,
    },
    Failed {
        error: String,
    },
}

/// One model response: created by `StepStarted`, filled part by part, settled exactly once by
/// `StepEnded` or `StepFailed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub id: MessageId,
    pub seq: Seq,
    pub step: u32,
    pub agent: String,
    pub model: String,
    pub parts: Vec<Part>,
    pub finish: Option<Finish>,
    pub error: Option<StepError>,
    pub usage: Usage,
    pub retries: u32,
    pub created: Timestamp,
    pub completed: Option<Timestamp>,
}

impl AssistantMessage {
    /// Settled messages have a finish reason or an error; only an unsettled one can grow.
    pub fn is_settled(&self) -> bool {
        self.finish.is_some() || self.error.is_some()
    }

    /// The approval of tool call `call_id`, if it asked for one.
    pub fn approval(&self, call_id: &str) -> Option<&Approval> {
        self.parts.iter().find_map(|p| match p {
            Part::Approval(a) if a.call_id == call_id => Some(a),
            _ => None,
        })
    }

    /// Tool calls held for an approval (decided or not) and not started.
    pub fn held_tools(&self) -> impl Iterator<Item = &ToolPart> {
        self.parts.iter().filter_map(|p| match p {
            Part::Tool(t) if t.state == ToolState::Held => Some(t),
            _ => None,
        })
    }

    pub fn tool(&self, call_id: &str) -> Option<&ToolPart> {
        self.parts.iter().find_map(|p| match p {
            Part::Tool(t) if t.call_id == call_id => Some(t),
            _ => None,
        })
    }

    /// Tool calls recorded as called and not settled.
    pub fn running_tools(&self) -> impl Iterator<Item = &ToolPart> {
        self.parts.iter().filter_map(|p| match p {
            Part::Tool(t) if t.state == ToolState::Running => Some(t),
            _ => None,
        })
    }
}

/// A content part of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Part {
    /// `incomplete` marks text cut short by a failed or interrupted stream.
    Text {
        text: String,
        incomplete: bool,
    },
    /// `metadata` is opaque provider data (a signature) replayed unchanged to the same provider.
    Reasoning {
        text: String,
        metadata: Option<String>,
        incomplete: bool,
    },
    Tool(ToolPart),
    /// A person's approval of the tool call `call_id` of the same message (ARCHITECTURE.md,
    /// "Approvals"): requested with the call, decided once. Never sent to the model.
    Approval(Approval),
}

/// An approval a tool call waits for, and its decision once made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub call_id: String,
    /// What was asked: a hash of the tool's name and its input as canonical JSON. A decision
    /// names it, so it approves exactly what was asked.
    pub digest: String,
    /// When it is settled as expired if nobody decided it.
    pub expires_at: Timestamp,
    pub decision: Option<Decision>,
}

/// A decision on an approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    /// Who decided (a person, a token's name); `None` for the runtime's own decisions.
    pub by: Option<String>,
    pub reason: Option<String>,
    pub time: Timestamp,
}

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The call runs, exactly once.
    Approved,
    /// A person refused it.
    Denied,
    /// Nobody decided before `expires_at`.
    Expired,
    /// An interrupt, new input (`on_new_input = "deny"`) or a failed execution withdrew it.
    Cancelled,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Denied => "denied",
            Verdict::Expired => "expired",
            Verdict::Cancelled => "cancelled",
        }
    }
}

impl Decision {
    /// The result the model sees for a call this decision refused (`None` when it approved):
    /// it names who refused it and why.
    pub fn refusal(&self) -> Option<String> {
        let why = self
            .reason
            .as_deref()
            .filter(|r| !r.trim().is_empty())
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        let by = self
            .by
            .as_deref()
            .filter(|b| !b.trim().is_empty())
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        match self.verdict {
            Verdict::Approved => None,
            Verdict::Denied => Some(format!("the call was denied{by}{why}; it did not run")),
            Verdict::Expired => Some(format!(
                "the call was not approved in time (the approval expired{why}); it did not run"
            )),
            Verdict::Cancelled => Some(format!("the call was cancelled{by}{why}; it did not run")),
        }
    }
}

/// A tool call of an assistant message. `call_id` is unique within its message only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolPart {
    pub call_id: String,
    pub name: String,
    /// The arguments as the model sent them (JSON text, possibly invalid).
    pub input: String,
    pub state: ToolState,
}

/// A tool call's durable state. `Pending` (input still streaming) exists only live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolState {
    /// Started (for a call that needed no approval: recorded, which is when it starts).
    Running,
    Completed {
        output: String,
        truncated: bool,
    },
    Error {
        error: String,
    },
    /// Recorded and not started: it waits for its approval, or approved, for the drain that
    /// starts it (`ToolStarted`).
    Held,
}
