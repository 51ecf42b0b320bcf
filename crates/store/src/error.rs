//! The store's error type. redb's own errors are flattened into [`Error::Storage`] so no redb type
//! crosses the crate boundary.

use agenthost_model::{MessageId, SessionId, Violation};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("session {0} not found")]
    SessionNotFound(SessionId),
    #[error("prompt id {id} conflicts: {reason}")]
    PromptConflict { id: MessageId, reason: &'static str },
    #[error(transparent)]
    Invalid(#[from] agenthost_model::Error),
    #[error("session {session} already holds {pending} pending inputs")]
    Full { session: SessionId, pending: u32 },
    #[error("refused event: {0}")]
    Violation(#[from] Violation),
    #[error(
        "store format version {found} is not supported by this build (it reads version \
         {supported}); use a matching agenthost release"
    )]
    FormatVersion { found: u16, supported: u16 },
    #[error("store record {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
    #[error("storage failure: {0}")]
    Storage(String),
    #[error("the store is closed")]
    Closed,
    /// Another process has the store open for writing (a server running on it, say).
    #[error("the store is open in another process (is a server running on this data directory?)")]
    Locked,
    /// A crash left the store needing recovery, which only a writer may run.
    #[error(
        "the store was not closed cleanly and needs recovery (the next `agenthost serve` runs it)"
    )]
    NeedsRecovery,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Converts any redb error into [`Error::Storage`], keeping its message and dropping its type.
pub(crate) fn storage(e: impl Into<redb::Error>) -> Error {
    Error::Storage(e.into().to_string())
}
