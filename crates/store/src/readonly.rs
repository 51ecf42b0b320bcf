//! Offline, read-only access to a store file, for `agenthost inspect`: opening it never writes
//! (no upgrade, no fold, no recovery, no version rewrite), so a check cannot change what it
//! checks. A store this build cannot read as it is, is refused with the reason.

use std::path::Path;

use redb::{DatabaseError, ReadableDatabase as _, TableError};

use crate::codec::FORMAT_VERSION;
use crate::error::{Error, Result, storage};
use crate::snapshot::{RedbSnapshot, Snapshot};
use crate::tables;

/// What redb's own integrity check (page checksums, tree structure) says of a store file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Integrity {
    Intact,
    /// Damaged, but redb could repair it (in the checked copy; the file itself is unchanged).
    Repairable,
    /// Damaged beyond repair, with redb's reason.
    Damaged(String),
}

/// Checks the store file at `path` through a copy in `scratch`: the original is never written,
/// and a file damaged so badly that redb panics on it is reported, not a crash. Reads the whole
/// file: an offline check.
pub fn check_integrity(path: &Path, scratch: &Path) -> Result<Integrity> {
    let copy = scratch.join("check.redb");
    std::fs::copy(path, &copy).map_err(|e| {
        Error::Storage(format!(
            "cannot copy {} to {}: {e}",
            path.display(),
            copy.display()
        ))
    })?;
    let checked = crate::quietly(|| -> std::result::Result<bool, String> {
        let mut db = redb::Database::open(&copy).map_err(|e| e.to_string())?;
        db.check_integrity().map_err(|e| e.to_string())
    });
    Ok(match checked {
        Ok(Ok(true)) => Integrity::Intact,
        Ok(Ok(false)) => Integrity::Repairable,
        Ok(Err(reason)) => Integrity::Damaged(reason),
        Err(panic) => Integrity::Damaged(crate::panic_message(&*panic)),
    })
}

/// A store file opened read-only.
pub struct ReadOnlyStore {
    db: redb::ReadOnlyDatabase,
}

impl std::fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyStore").finish_non_exhaustive()
    }
}

impl ReadOnlyStore {
    /// Opens `path` read-only. Refused: a file another process holds open for writing
    /// ([`Error::Locked`]), one a crash left needing recovery ([`Error::NeedsRecovery`]), one of
    /// another format version ([`Error::FormatVersion`]), and anything that is not an agenthost
    /// store.
    pub fn open(path: &Path) -> Result<ReadOnlyStore> {
        // redb may panic on a file damaged in a way its checks do not cover: a damaged file.
        let damaged = |reason: String| Error::Corrupt {
            what: format!("file {}", path.display()),
            reason,
        };
        let opened = crate::quietly(|| redb::Builder::new().open_read_only(path))
            .map_err(|panic| damaged(crate::panic_message(&*panic)))?;
        let db = opened.map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => Error::Locked,
            DatabaseError::RepairAborted => Error::NeedsRecovery,
            DatabaseError::Storage(redb::StorageError::Corrupted(reason)) => damaged(reason),
            other => Error::Storage(format!("cannot open {}: {other}", path.display())),
        })?;
        let store = ReadOnlyStore { db };
        store.check_version()?;
        Ok(store)
    }

    /// Opens a copy of `path`, made in `scratch` and recovered there, for a store a crash left
    /// needing recovery: the original is never written.
    pub fn open_recovered_copy(path: &Path, scratch: &Path) -> Result<ReadOnlyStore> {
        let copy = scratch.join("store.redb");
        std::fs::copy(path, &copy).map_err(|e| {
            Error::Storage(format!(
                "cannot copy {} to {}: {e}",
                path.display(),
                copy.display()
            ))
        })?;
        // Opening for writing runs redb's recovery; closing leaves the copy clean.
        drop(redb::Database::open(&copy).map_err(storage)?);
        ReadOnlyStore::open(&copy)
    }

    /// A consistent read view.
    pub fn snapshot(&self) -> Result<Box<dyn Snapshot>> {
        let txn = self.db.begin_read().map_err(storage)?;
        Ok(Box::new(RedbSnapshot::new(txn)))
    }

    fn check_version(&self) -> Result<()> {
        let txn = self.db.begin_read().map_err(storage)?;
        let not_ours = || Error::Corrupt {
            what: "store".into(),
            reason: "it has no agenthost format version: not an agenthost store".into(),
        };
        let meta = match txn.open_table(tables::META) {
            Ok(meta) => meta,
            Err(TableError::TableDoesNotExist(_)) => return Err(not_ours()),
            Err(e) => return Err(storage(e)),
        };
        let value = meta
            .get(tables::FORMAT_KEY)
            .map_err(storage)?
            .ok_or_else(not_ours)?;
        let found = <[u8; 2]>::try_from(value.value())
            .map(u16::from_le_bytes)
            .map_err(|_| Error::Corrupt {
                what: "format version".into(),
                reason: format!("{} bytes instead of 2", value.value().len()),
            })?;
        // An older readable format reads as it is: its values decode with the current records.
        if !(crate::codec::OLDEST_READABLE..=FORMAT_VERSION).contains(&found) {
            return Err(Error::FormatVersion {
                found,
                supported: FORMAT_VERSION,
            });
        }
        Ok(())
    }
}
