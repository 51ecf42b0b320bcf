//! The open database, shared by the store's readers, its planner and its committer, and the
//! store's health.
//!
//! redb refuses every write after an I/O error until the database is closed and opened again.
//! After a full disk that is what the committer does (`reopen`), before the next commit, until it
//! works: writes resume by themselves once there is space. After any other I/O error (a failed
//! sync may have dropped pages the kernel said were written) the store stops accepting writes
//! until a restart, and says so in its health.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redb::Database;

use crate::error::{Error, Result};

/// Whether the store takes writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Health {
    #[default]
    Ok,
    /// The disk filled up: writes are refused until there is space again (then they resume by
    /// themselves); reads go on.
    DiskFull(String),
    /// An I/O error stopped writes until a restart; reads go on where they can.
    Failed(String),
    /// The shared database (PostgreSQL) cannot be reached: reads and writes fail until it is
    /// back, then go on by themselves.
    Unreachable(String),
}

/// Opens the database file (again).
pub(crate) type Opener = Box<dyn Fn() -> Result<Database> + Send + Sync>;

/// Tells whether the disk takes writes again, without touching the database.
pub(crate) type Probe = Box<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// How long closing the database waits for the transactions that hold it to let go.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Drops `db` once this is its last holder (readers, the planner and the folder hold it only for
/// one transaction at a time), by `deadline`; otherwise gives it back.
fn last(mut db: Arc<Database>, deadline: Instant) -> std::result::Result<(), Arc<Database>> {
    loop {
        match Arc::try_unwrap(db) {
            Ok(only) => {
                drop(only);
                return Ok(());
            }
            Err(shared) if Instant::now() < deadline => {
                db = shared;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(shared) => return Err(shared),
        }
    }
}

pub(crate) struct Slot {
    /// `None` once closed: closing releases the file, so another store can open it.
    db: RwLock<Option<Arc<Database>>>,
    open: Opener,
    probe: Probe,
    health: Mutex<Health>,
    /// Set by `close`: an empty slot is then closed, not waiting to be opened again.
    closed: std::sync::atomic::AtomicBool,
}

impl Slot {
    pub(crate) fn new(db: Database, open: Opener, probe: Probe) -> Slot {
        Slot {
            db: RwLock::new(Some(Arc::new(db))),
            open,
            probe,
            health: Mutex::default(),
            closed: Default::default(),
        }
    }

    /// The database, to use for one transaction and let go.
    pub(crate) fn get(&self) -> Result<Arc<Database>> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner()).clone();
        match db {
            Some(db) => Ok(db),
            None if self.closed.load(std::sync::atomic::Ordering::Acquire) => Err(Error::Closed),
            None => Err(Error::DiskFull(
                "the database could not be opened again yet after the disk filled up".into(),
            )),
        }
    }

    /// Releases the database (for good), returning once the file is free: a reader that took
    /// the database for a transaction just before is waited for (boundedly), so the process can
    /// open the store again as soon as this returns.
    pub(crate) fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        let taken = self.db.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(db) = taken
            && let Err(db) = last(db, Instant::now() + RELEASE_WAIT)
        {
            tracing::warn!("the store's file is still in use after closing; it is released later");
            drop(db);
        }
    }

    /// Closes the database and opens it again, which clears redb's refusal after an I/O error.
    /// Readers, the planner and the folder hold it only for one transaction at a time; they are
    /// waited for (boundedly), since the file can be opened again only once it is released.
    pub(crate) fn reopen(&self) -> Result<()> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        // Opening again may need to write (redb's repair): while the disk is still full, keep the
        // database open for readers instead.
        (self.probe)().map_err(|e| Error::DiskFull(e.to_string()))?;
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        // Empty when the last attempt to open it failed: just try again.
        if let Some(db) = slot.take()
            && let Err(shared) = last(db, Instant::now() + RELEASE_WAIT)
        {
            *slot = Some(shared);
            return Err(Error::Io(
                "the database is still in use; it cannot be opened again yet".into(),
            ));
        }
        match (self.open)() {
            Ok(db) => {
                *slot = Some(Arc::new(db));
                Ok(())
            }
            // Leaves the slot empty: the next write tries again, readers are told why.
            Err(e) => Err(e),
        }
    }

    pub(crate) fn health(&self) -> Health {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_health(&self, health: Health) {
        let mut current = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if *current != health {
            match &health {
                Health::Ok => tracing::info!("the store takes writes again"),
                Health::DiskFull(reason) => {
                    tracing::error!(%reason, "the disk is full: writes are refused until there is space")
                }
                Health::Failed(reason) => {
                    tracing::error!(%reason, "an I/O error stopped the store's writes until a restart")
                }
                Health::Unreachable(reason) => {
                    tracing::error!(%reason, "the database cannot be reached")
                }
            }
            *current = health;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that took the database just before the close holds it for a moment more:
    /// `close` returns only once it let go, so the file can be opened again at once.
    #[test]
    fn close_returns_once_the_file_is_free() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("store.redb");
        let db = Database::create(&path).expect("create");
        let again = path.clone();
        let slot = Slot::new(
            db,
            Box::new(move || Database::create(&again).map_err(crate::error::storage)),
            Box::new(|| Ok(())),
        );
        let held = slot.get().expect("the database");
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        slot.close();
        Database::create(&path).expect("the file is free once close returns");
        reader.join().expect("the reader");
        assert!(matches!(slot.get(), Err(Error::Closed)));
    }
}
