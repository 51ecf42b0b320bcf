//! The runtime's error type. `Clone`, because one drain outcome is delivered to every caller that
//! joined it.

use agenthost_llm as llm;
use agenthost_model::{MessageId, SessionId};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("session {0} not found")]
    SessionNotFound(SessionId),
    /// Something inside a session that does not exist (a message, a tool call).
    #[error("{0} not found")]
    NotFound(String),
    #[error("prompt id {id} conflicts: {reason}")]
    PromptConflict { id: MessageId, reason: &'static str },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("prompt is {size} bytes, over the limit of {limit} bytes")]
    PromptTooLarge { size: usize, limit: usize },
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The store took nothing for a reason of its own (a full disk, an I/O error): `what` says
    /// so for a client, `detail` is the store's own text (paths, addresses) for the log.
    #[error("{what}: {detail}")]
    StoreUnavailable { what: &'static str, detail: String },
    /// The session is running work this request cannot join; it may be sent again once idle.
    #[error("session busy: {0}")]
    Busy(String),
    #[error("provider error: {0}")]
    Provider(llm::Error),
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    #[error("storage failure: {0}")]
    Storage(String),
    #[error("session {0} actor stopped before answering")]
    ActorDied(SessionId),
    #[error("session {session} did not answer {what} in time")]
    Timeout {
        session: SessionId,
        what: &'static str,
    },
    #[error("the runtime is shutting down")]
    ShuttingDown,
    #[error("the drain panicked: {0}")]
    Panicked(String),
    #[error("configuration: {0}")]
    Config(String),
    /// Compaction found nothing older than the part it keeps verbatim; no provider call was made.
    #[error("nothing to compact: the active history fits in the part kept verbatim")]
    NothingToCompact,
    /// The drain was interrupted (by a user or a shutdown) while this operation waited or ran.
    #[error("interrupted")]
    Interrupted,
    /// A schedule of that id exists with another text, delivery or time.
    #[error("schedule conflict: {0}")]
    ScheduleConflict(String),
    /// The approval was decided already; the first decision stands.
    #[error("the approval of tool call {call_id} was already decided: {}", .decision.verdict.as_str())]
    AlreadyDecided {
        call_id: String,
        decision: Box<agenthost_model::Decision>,
    },
    /// A decision named another digest than the call's: it would approve something else than
    /// what was asked.
    #[error("the digest {given:?} is not the digest of tool call {call_id} ({asked})")]
    DigestMismatch {
        call_id: String,
        given: String,
        asked: String,
    },
    /// A model call was not made: at its worst it would have passed the `which` limit of the
    /// session's budget, of which `spent` was spent.
    #[error("the budget's {} limit ({limit}) does not allow the call: {spent} spent", .which.as_str())]
    BudgetExhausted {
        which: agenthost_model::Limit,
        spent: u64,
        limit: u64,
    },
    /// Recovery gave up on the session, or a supervisor halted it: it waits for a resume.
    #[error("session {session} halted: {reason}")]
    Halted { session: SessionId, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<agenthost_store::Error> for Error {
    fn from(e: agenthost_store::Error) -> Self {
        use agenthost_store::Error as S;
        match e {
            S::SessionNotFound(id) => Error::SessionNotFound(id),
            S::PromptConflict { id, reason } => Error::PromptConflict { id, reason },
            S::Invalid(e) => Error::from(e),
            S::Closed => Error::ShuttingDown,
            full @ S::Full { .. } => Error::StoreUnavailable {
                what: "the session holds as many pending inputs as it may; retry once it has \
                       answered some",
                detail: full.to_string(),
            },
            // Nothing was written: the caller may retry once the disk is back.
            io @ (S::DiskFull(_) | S::Io(_) | S::Stopped(_)) => Error::StoreUnavailable {
                what: match io {
                    S::DiskFull(_) => {
                        "the disk of the store is full: writes are refused until there is space"
                    }
                    S::Stopped(_) => {
                        "the store stopped accepting writes after an I/O error; check the disk \
                         and restart"
                    }
                    _ => "a write to the store failed; nothing was written, retry",
                },
                detail: io.to_string(),
            },
            // Another node holds the session (or nobody does until a takeover): nothing was
            // written, and a retry through any node reaches the owner.
            moved @ S::NotOwner { .. } => Error::StoreUnavailable {
                what: "another node owns this session now (a takeover may be under way); retry",
                detail: moved.to_string(),
            },
            // The store's own storage failure keeps its text: it says "storage failure" once.
            S::Storage(detail) => Error::Storage(detail),
            other => Error::Storage(other.to_string()),
        }
    }
}

impl From<agenthost_model::Error> for Error {
    fn from(e: agenthost_model::Error) -> Self {
        match e {
            agenthost_model::Error::PromptTooLarge { size, limit } => {
                Error::PromptTooLarge { size, limit }
            }
            other => Error::Invalid(other.to_string()),
        }
    }
}

/// The message of a caught panic, for [`Error::Panicked`].
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned())
}

impl From<agenthost_model::budget::Exceeded> for Error {
    fn from(e: agenthost_model::budget::Exceeded) -> Self {
        Error::BudgetExhausted {
            which: e.which,
            spent: e.spent,
            limit: e.limit,
        }
    }
}
