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
    /// The disk is full. Nothing of the operation was written; writes resume by themselves once
    /// there is space again.
    #[error("the disk is full: {0}")]
    DiskFull(String),
    /// The device failed (an I/O error, a failed sync). Nothing of the operation was written.
    #[error("storage I/O error: {0}")]
    Io(String),
    /// An I/O error made the store stop accepting writes (a failed sync may have dropped pages,
    /// so carrying on could lose data); reads go on where they can, writes wait for a restart.
    #[error(
        "the store stopped accepting writes after an I/O error ({0}); check the disk and restart"
    )]
    Stopped(String),
    /// In a cluster: this node does not hold the session's partition (another node does, or
    /// its lease was lost). Nothing was written.
    #[error("this node does not own session {session} (partition {partition})")]
    NotOwner { session: SessionId, partition: u32 },
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

/// Converts any redb error into ours, keeping its message and dropping its type: a full disk is
/// [`Error::DiskFull`], another I/O failure (or redb refusing to go on after one) [`Error::Io`],
/// anything else [`Error::Storage`].
pub(crate) fn storage(e: impl Into<redb::Error>) -> Error {
    let e = e.into();
    let message = e.to_string();
    match &e {
        // A failed sync stops writes, whatever its code (see `backend`).
        redb::Error::Io(io) if crate::backend::sync_failed(io) => Error::Io(message),
        redb::Error::Io(io) if full(io) => Error::DiskFull(message),
        redb::Error::Io(_) | redb::Error::PreviousIo => Error::Io(message),
        _ => Error::Storage(message),
    }
}

fn full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

impl Error {
    /// Whether the error says the storage failed (not the request): the store's health follows.
    pub fn is_io(&self) -> bool {
        matches!(self, Error::DiskFull(_) | Error::Io(_) | Error::Stopped(_))
    }
}
