//! Errors of the domain: invalid input ([`Error`]) and events that break an invariant of the
//! projection ([`Violation`]).

use crate::ids::{MessageId, ScheduleId, Seq, SessionId};

/// Input rejected before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid {kind} id {value:?}: {reason}")]
    InvalidId {
        kind: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("a prompt needs text or at least one file")]
    EmptyPrompt,
    #[error("prompt is {size} bytes, over the limit of {limit} bytes")]
    PromptTooLarge { size: usize, limit: usize },
    #[error("unknown delivery mode {0:?}; expected \"steer\" or \"queue\"")]
    UnknownDelivery(String),
    #[error("invalid file attachment {index}: {reason}")]
    InvalidFile { index: usize, reason: &'static str },
}

/// An event that cannot be applied to the current projections. Appending it is refused and the
/// transaction that carried it writes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("session {0} does not exist")]
    NoSession(SessionId),
    #[error("session {0} already exists")]
    SessionExists(SessionId),
    #[error("session {session}: event seq {got} is not the next seq {expected}")]
    SeqGap {
        session: SessionId,
        expected: Seq,
        got: Seq,
    },
    #[error("message id {0} already exists")]
    DuplicateMessage(MessageId),
    #[error("session {session}: no pending input {id}")]
    NotPending { session: SessionId, id: MessageId },
    #[error("session {session}: no assistant message {id}")]
    NoAssistant { session: SessionId, id: MessageId },
    #[error("session {session}: assistant message {id} is already settled")]
    AssistantSettled { session: SessionId, id: MessageId },
    #[error("session {session}: message {id} has no running tool call {call_id:?}")]
    NoRunningTool {
        session: SessionId,
        id: MessageId,
        call_id: String,
    },
    #[error("session {session}: message {id} already has tool call {call_id:?}")]
    DuplicateToolCall {
        session: SessionId,
        id: MessageId,
        call_id: String,
    },
    #[error("session {session}: message {id} has no undecided approval of tool call {call_id:?}")]
    NoApproval {
        session: SessionId,
        id: MessageId,
        call_id: String,
    },
    #[error("session {session}: schedule {id} exists already")]
    ScheduleExists { session: SessionId, id: ScheduleId },
    #[error("session {session}: no schedule {id} waiting for that firing")]
    NoSchedule { session: SessionId, id: ScheduleId },
    #[error("session {session}: {what} needs the session's claim")]
    NotClaimed {
        session: SessionId,
        what: &'static str,
    },
    #[error("session {session}: no running compaction {id}")]
    NoCompaction { session: SessionId, id: MessageId },
}
