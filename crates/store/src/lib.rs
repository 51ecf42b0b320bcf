//! The agenthost store: the durable event log of every session, its projections, and the
//! group-commit writer, on redb.
//!
//! It owns the on-disk format (`codec`, `tables`) and nothing above it sees a redb type:
//! callers use the [`Store`] trait, whose every write is one whole transaction (create a session,
//! admit a prompt, promote inputs, append events), and [`Snapshot`] for consistent reads. Events
//! are applied through `agenthost_model::apply`, the same projector replay uses.
//!
//! It must not decide execution (that is the actors' job) and must not hold a write transaction
//! outside the writer's committer thread.
//!
//! Main types: [`Store`], [`RedbStore`], [`Config`], [`Snapshot`], [`Action`], [`Admission`], [`Receipt`],
//! [`NewSession`], [`Error`].

mod backend;
mod cluster;
mod codec;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod error;
#[cfg(any(test, feature = "faults"))]
pub mod faults;
mod folder;
mod log;
mod ops;
mod pg;
mod readonly;
mod record;
mod rows;
mod slot;
mod snapshot;
mod tables;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod verify;
mod writer;

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agenthost_model::promotion::Boundary;
use agenthost_model::prompt::DEFAULT_PROMPT_LIMIT;
use agenthost_model::{Event, SessionId, SessionRow, Stored, Timestamp};
use futures::future::BoxFuture;
use redb::{Database, ReadableDatabase as _, ReadableTable as _};
use tokio::sync::oneshot;

pub use cluster::{ClusterView, Lease, Node, Ownership, partition_of};
pub use codec::FORMAT_VERSION;
pub use error::{Error, Result};
pub use ops::{Action, Admission, NewSession, Receipt};
pub use pg::{PgConfig, PgStore};
pub use readonly::{Integrity, ReadOnlyStore, check_integrity};
pub use slot::Health;
pub use snapshot::Snapshot;
pub use verify::{Verified, verify};
pub use writer::{Clock, CommitHook, Stats};

use crate::error::storage;
use crate::ops::{Op, Outcome};
use crate::writer::{Committer, Inbox, Msg, Planner, Request};

/// Every durable operation of agenthost, each one whole transaction. redb is the
/// embedded backend; a second backend implements this trait without touching callers, and
/// passes the conformance suite (`conformance`, feature `conformance`) unchanged.
///
/// The contract every backend keeps:
/// - **Atomicity.** Each call is one transaction: every event it writes and every projection
///   those events update (session row, messages, inbox, index, instruction state, schedules)
///   commit together, or nothing does. A refused event refuses its whole call.
/// - **Ordering.** A session's events get consecutive seqs from 0, without gaps, in the order
///   the calls were made; each operation sees every operation acknowledged before it.
/// - **Idempotency.** Creating an existing session returns it unchanged; admitting an id again
///   with the same session, prompt and delivery returns the original receipt and writes nothing,
///   even when the retries run concurrently; any other reuse of an id is a `PromptConflict`. An
///   input is promoted at most once.
/// - **Durability at return.** A future resolves `Ok` only once its transaction is durable (it
///   survives a crash of the process or the machine); a write, once called, completes even if
///   the caller stops waiting, so nothing is ever half-admitted.
/// - **Isolation.** A [`Snapshot`] sees exactly the transactions durable when it was taken.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Creates a session, or returns the existing session with that id unchanged.
    fn create_session(&self, new: NewSession) -> BoxFuture<'static, Result<SessionRow>>;
    /// Admits a prompt durably and idempotently.
    fn admit(&self, admission: Admission) -> BoxFuture<'static, Result<Receipt>>;
    /// Runs `actions` on one session in order, in one transaction: every event they write is
    /// applied, or none is. Returns the events written, in seq order.
    fn write(
        &self,
        session: SessionId,
        actions: Vec<Action>,
    ) -> BoxFuture<'static, Result<Vec<Stored>>>;
    /// Promotes the pending inputs `boundary` selects, atomically and exactly once.
    fn promote(
        &self,
        session: SessionId,
        boundary: Boundary,
    ) -> BoxFuture<'static, Result<Vec<Stored>>> {
        self.write(session, vec![Action::Promote(boundary)])
    }
    /// Appends events with the session's next seqs; all are applied or none.
    fn append(
        &self,
        session: SessionId,
        events: Vec<Event>,
    ) -> BoxFuture<'static, Result<Vec<Stored>>> {
        self.write(session, events.into_iter().map(Action::Append).collect())
    }
    /// A consistent read view of the latest durable state.
    fn snapshot(&self) -> Result<Box<dyn Snapshot>>;
    /// Whether a snapshot and its reads stay in this process (the embedded store: memory-mapped
    /// pages) rather than waiting on the network and on a pool of connections (PostgreSQL). An
    /// async caller reads a store whose reads are not local on the blocking pool.
    fn local_reads(&self) -> bool {
        true
    }
    /// Writer counters (commits, operations, batch sizes).
    fn stats(&self) -> &Stats;
    /// Whether the store takes writes (see [`Health`]).
    fn health(&self) -> Health {
        Health::Ok
    }
    /// Partition ownership when several nodes share the store; `None` when this process owns
    /// every session (the embedded store).
    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        None
    }
    /// Stops accepting writes, returns once everything already submitted is durable, and
    /// releases the storage. Later operations fail with [`Error::Closed`].
    fn close(&self);
}

/// Opens the store `config` describes: the embedded store at `config.path`, created when
/// missing, or the PostgreSQL store when `config.postgres` is set.
pub fn open(mut config: Config) -> Result<Arc<dyn Store>> {
    match config.postgres.take() {
        Some(pg) => Ok(Arc::new(PgStore::open(config, pg)?)),
        None => Ok(Arc::new(RedbStore::open(config)?)),
    }
}

/// How long a busy writer's batch waits for more operations by default ([`Config::max_wait`]).
pub const DEFAULT_LINGER: Duration = Duration::from_millis(1);

/// How to open a [`RedbStore`].
#[derive(Clone)]
pub struct Config {
    pub path: PathBuf,
    /// Most operations committed in one transaction. 1 disables group commit.
    pub max_batch: usize,
    /// How long a batch lingers for more operations before it is committed while the writer is
    /// busy (see `linger_after` and `busy_for`), so that one fsync serves more of them. Zero
    /// never lingers: batches then form from what arrives during the previous fsync alone.
    pub max_wait: Duration,
    /// The writer may be busy once its last batch held this many operations or more.
    pub linger_after: usize,
    /// ... and once it has had work for this long without resting (an idle wait of 2 ms or
    /// more), so that a short burst does not make it busy. Zero: the last batch alone decides.
    pub busy_for: Duration,
    pub prompt_limit: usize,
    /// Pending inputs a session may hold: an admission beyond it is refused with
    /// [`Error::Full`] (an exact retry is still answered with its receipt).
    pub pending_limit: u32,
    /// redb page cache in bytes; redb's default (1 GiB, allocated as used) when `None`.
    pub cache_size: Option<usize>,
    /// New events are written to a front area keyed for locality and folded into the
    /// per-session tables once it holds this many (or 64 generations); a commit of at least
    /// `fold_rows / 64` events has a generation of the front to itself, smaller ones share one
    /// of up to `fold_rows / 8` (see `log`). Larger folds copy each session's pages less often;
    /// each fold makes one commit longer.
    pub fold_rows: usize,
    pub clock: Clock,
    pub on_commit: Option<CommitHook>,
    /// Check the whole file (redb's page checksums and tree structure) when opening, so a
    /// damaged store stops the start with a clear error instead of failing later. Reads the
    /// whole file: about 0.1 s per 40 MB.
    pub check_on_open: bool,
    /// Use the PostgreSQL backend instead of the embedded one (`path`, `cache_size`,
    /// `fold_rows` and `check_on_open` then do not apply).
    pub postgres: Option<PgConfig>,
    /// Tests: the storage faults to inject (see `faults`).
    #[cfg(any(test, feature = "faults"))]
    pub faults: Option<Arc<faults::Faults>>,
    /// Tests: partition ownership for [`Store::ownership`] to report, as a store shared by
    /// several nodes would, so the runtime's takeover handling runs over the embedded store. It
    /// only reports: the embedded store neither takes leases nor fences writes.
    #[cfg(any(test, feature = "faults"))]
    pub ownership: Option<Arc<dyn Ownership>>,
}

impl Config {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Config {
            path: path.into(),
            max_batch: 4096,
            max_wait: DEFAULT_LINGER,
            linger_after: 8,
            busy_for: Duration::from_millis(20),
            prompt_limit: DEFAULT_PROMPT_LIMIT,
            pending_limit: u32::MAX,
            cache_size: None,
            fold_rows: 16_384,
            clock: Arc::new(system_clock),
            on_commit: None,
            check_on_open: true,
            postgres: None,
            #[cfg(any(test, feature = "faults"))]
            faults: None,
            #[cfg(any(test, feature = "faults"))]
            ownership: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("path", &self.path)
            .field("max_batch", &self.max_batch)
            .field("max_wait", &self.max_wait)
            .field("linger_after", &self.linger_after)
            .field("busy_for", &self.busy_for)
            .field("prompt_limit", &self.prompt_limit)
            .field("pending_limit", &self.pending_limit)
            .field("cache_size", &self.cache_size)
            .field("fold_rows", &self.fold_rows)
            .field("postgres", &self.postgres)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch from the system clock.
pub fn system_clock() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Timestamp(ms)
}

/// The redb store. Cheap to share behind an `Arc`; dropping the last handle (or
/// [`Store::close`]) lets the writer commit what is queued and stop.
pub struct RedbStore {
    /// The database, shared with the writer's threads (see `slot`).
    db: Arc<slot::Slot>,
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    /// The planner's and the committer's threads.
    writer: Mutex<Vec<JoinHandle<()>>>,
    stats: Arc<Stats>,
    prompt_limit: usize,
    path: PathBuf,
    #[cfg(test)]
    fail_commits: Arc<std::sync::atomic::AtomicU64>,
    /// Tests: how many of the next batches planned while another is being committed to fail,
    /// after an operation of theirs ran (as a read of redb that fails does).
    #[cfg(test)]
    fail_plans: Arc<std::sync::atomic::AtomicU64>,
    #[cfg(any(test, feature = "faults"))]
    ownership: Option<Arc<dyn Ownership>>,
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .field("commits", &self.stats.commits.get())
            .finish_non_exhaustive()
    }
}

impl RedbStore {
    /// Opens the store at `config.path`, creating it if absent. Fails with
    /// [`Error::FormatVersion`] for a store of another format version and with a clear storage
    /// error for a corrupt file.
    pub fn open(config: Config) -> Result<Self> {
        if let Some(parent) = config.path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::Storage(format!("cannot create {}: {e}", parent.display())))?;
        }
        let open = opener(&config);
        let db = open()?;
        init(&db)?;
        let db = Arc::new(slot::Slot::new(db, open, prober(&config)));
        let stats = Arc::new(Stats::default());
        let (tx, requests) = mpsc::channel();
        let (signal, signals) = mpsc::channel();
        let (plans, planned) = mpsc::channel();
        let (jobs, folder_jobs) = mpsc::channel();
        let (folded_tx, folded) = mpsc::channel();
        #[cfg(test)]
        let fail_plans = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let planner = Planner {
            db: db.clone(),
            front: log::Front::new(config.fold_rows),
            folding: Default::default(),
            folder: Some(jobs),
            jobs: 0,
            committed: Default::default(),
            in_flight: Default::default(),
            epoch: 0,
            max_batch: config.max_batch.max(1),
            linger: writer::Linger {
                max_wait: config.max_wait,
                after: config.linger_after,
                busy_for: config.busy_for,
            },
            last_batch: 0,
            sizes: Default::default(),
            stats: stats.clone(),
            pending_limit: config.pending_limit,
            clock: config.clock,
            #[cfg(test)]
            fail_plans: fail_plans.clone(),
        };
        #[cfg(test)]
        let fail_commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let committer = Committer {
            db: db.clone(),
            on_commit: config.on_commit,
            stats: stats.clone(),
            #[cfg(test)]
            fail_commits: fail_commits.clone(),
        };
        let spawn = |name: &str, run: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(run)
                .map_err(|e| Error::Storage(format!("cannot start the {name} thread: {e}")))
        };
        let inbox = Inbox {
            requests,
            signals,
            folded,
        };
        let folder_db = db.clone();
        let threads = vec![
            spawn(
                "store-folder",
                Box::new(move || folder::run(folder_db, folder_jobs, folded_tx)),
            )?,
            spawn(
                "store-committer",
                Box::new(move || committer.run(planned, signal)),
            )?,
            spawn("store-planner", Box::new(move || planner.run(inbox, plans)))?,
        ];
        Ok(RedbStore {
            db,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(threads),
            stats,
            prompt_limit: config.prompt_limit,
            path: config.path,
            #[cfg(test)]
            fail_commits,
            #[cfg(test)]
            fail_plans,
            #[cfg(any(test, feature = "faults"))]
            ownership: config.ownership,
        })
    }

    /// Stops accepting writes, lets the writer commit everything already queued, waits for it,
    /// and releases the database file, after any reader that has just taken the database to
    /// begin a transaction (a snapshot already begun does not hold the file). Later writes and
    /// snapshots fail with [`Error::Closed`].
    fn close_writer(&self) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(Msg::Close);
        }
        for handle in std::mem::take(&mut *lock(&self.writer)) {
            if handle.join().is_err() {
                tracing::error!("a store writer thread panicked");
            }
        }
        self.db.close();
    }

    fn submit(&self, op: Op) -> BoxFuture<'static, Result<Outcome>> {
        let (reply, rx) = oneshot::channel();
        let sent = match lock(&self.tx).as_ref() {
            Some(tx) => tx.send(Msg::Request(Request { op, reply })).is_ok(),
            None => false,
        };
        Box::pin(async move {
            if !sent {
                return Err(Error::Closed);
            }
            rx.await.map_err(|_| Error::Closed)?
        })
    }
}

impl RedbStore {
    /// The largest prompt admitted, in bytes.
    pub fn prompt_limit(&self) -> usize {
        self.prompt_limit
    }

    pub(crate) fn redb_snapshot(&self) -> Result<snapshot::RedbSnapshot> {
        let txn = self.db.get()?.begin_read().map_err(storage)?;
        Ok(snapshot::RedbSnapshot::new(txn))
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        self.close_writer();
    }
}

/// A poisoned lock only means another thread panicked while holding it; the guarded values
/// (a sender, a join handle) stay valid, so recover them.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes the format version into a new store, checks it in an existing one (upgrading an
/// older readable format), creates every table so that readers never meet a missing one, folds
/// the front and prunes the working set.
/// Opens (or creates) the database file `config` names, over the fault-injecting backend when a
/// test armed one.
fn opener(config: &Config) -> slot::Opener {
    let path = config.path.clone();
    let cache = config.cache_size;
    let check = config.check_on_open;
    #[cfg(any(test, feature = "faults"))]
    let faults = config.faults.clone();
    Box::new(move || {
        let mut builder = Database::builder();
        if let Some(bytes) = cache {
            builder.set_cache_size(bytes);
        }
        builder.set_check_integrity_on_open(check);
        let damaged = |reason: &dyn std::fmt::Display| {
            Error::Storage(format!(
                "cannot open store {}: it is damaged ({reason}); `agenthost inspect --verify` \
                 tells more; restore it from a backup",
                path.display()
            ))
        };
        // A full disk stays a full disk; anything else about opening is the file's problem.
        let cannot = |e: redb::Error| match e {
            redb::Error::Corrupted(reason) => damaged(&reason),
            e => match storage(e) {
                full @ Error::DiskFull(_) => full,
                Error::Storage(message) | Error::Io(message) => {
                    Error::Storage(format!("cannot open store {}: {message}", path.display()))
                }
                other => Error::Storage(format!("cannot open store {}: {other}", path.display())),
            },
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::Storage(format!("cannot open {}: {e}", path.display())))?;
        let storage = backend::Storage::new(
            file,
            #[cfg(any(test, feature = "faults"))]
            faults.clone(),
        )
        .map_err(|e| cannot(e.into()))?;
        // redb may panic on a file damaged in a way its checks do not cover: that is a damaged
        // file, said as such, not a crash.
        let opened = quietly(|| builder.create_with_backend(storage));
        match opened {
            Ok(opened) => opened.map_err(|e| cannot(e.into())),
            Err(panic) => Err(damaged(&panic_message(&*panic))),
        }
    })
}

thread_local! {
    /// Inside [`quietly`]: a panic here is caught and reported as what it means (a damaged
    /// file), so a panic hook has nothing to add.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, catching a panic (redb may panic on a file damaged in a way its checks do not
/// cover); while it runs, [`panic_is_reported`] is true on this thread, so a binary's panic hook
/// can leave the caught panic to the error that reports it instead of printing a backtrace.
pub fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    let outer = QUIET.replace(true);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.set(outer);
    result
}

/// Whether a panic on this thread now is one [`quietly`] catches and reports.
pub fn panic_is_reported() -> bool {
    QUIET.get()
}

/// What a caught panic said.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "redb panicked reading it".into())
}

/// Writes and syncs a scratch file beside the store: whether the disk takes writes again.
fn prober(config: &Config) -> slot::Probe {
    let scratch = config.path.with_extension("space");
    #[cfg(any(test, feature = "faults"))]
    let faults = config.faults.clone();
    Box::new(move || {
        #[cfg(any(test, feature = "faults"))]
        if let Some(faults) = &faults {
            faults.check_write()?;
        }
        let written = (|| {
            use std::io::Write as _;
            let mut file = std::fs::File::create(&scratch)?;
            file.write_all(&[0u8; 1 << 20])?;
            file.sync_data()
        })();
        let _ = std::fs::remove_file(&scratch);
        written
    })
}

fn init(db: &Database) -> Result<()> {
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut meta = txn.open_table(tables::META).map_err(storage)?;
        let found = meta
            .get(tables::FORMAT_KEY)
            .map_err(storage)?
            .map(|v| v.value().to_vec());
        if let Some(bytes) = found {
            let found = <[u8; 2]>::try_from(bytes.as_slice())
                .map(u16::from_le_bytes)
                .map_err(|_| Error::Corrupt {
                    what: "format version".into(),
                    reason: format!("{} bytes instead of 2", bytes.len()),
                })?;
            if !(codec::OLDEST_READABLE..=FORMAT_VERSION).contains(&found) {
                return Err(Error::FormatVersion {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
        }
        meta.insert(tables::FORMAT_KEY, FORMAT_VERSION.to_le_bytes().as_slice())
            .map_err(storage)?;
        // Start with an empty front: what a previous process left there is folded now, so the
        // writer's own count of front rows starts true.
        log::fold(&txn)?;
        rows::prune_working(&txn)?;
        rows::create_tables(&txn)?;
    }
    txn.commit().map_err(storage)
}

fn expect_outcome<T: Send + 'static>(
    fut: BoxFuture<'static, Result<Outcome>>,
    pick: fn(Outcome) -> Option<T>,
) -> BoxFuture<'static, Result<T>> {
    Box::pin(async move {
        let outcome = fut.await?;
        Ok(pick(outcome).expect("invariant: each op kind returns its own outcome kind"))
    })
}

impl Store for RedbStore {
    fn create_session(&self, new: NewSession) -> BoxFuture<'static, Result<SessionRow>> {
        expect_outcome(self.submit(Op::Create(new)), |o| match o {
            Outcome::Session(row) => Some(*row),
            _ => None,
        })
    }

    fn admit(&self, admission: Admission) -> BoxFuture<'static, Result<Receipt>> {
        // Validation happens before the writer sees anything: bad input writes nothing.
        if let Err(e) = admission.prompt.validate(self.prompt_limit) {
            return Box::pin(async move { Err(Error::Invalid(e)) });
        }
        expect_outcome(self.submit(Op::Admit(admission)), |o| match o {
            Outcome::Receipt(r) => Some(r),
            _ => None,
        })
    }

    fn write(
        &self,
        session: SessionId,
        actions: Vec<Action>,
    ) -> BoxFuture<'static, Result<Vec<Stored>>> {
        expect_outcome(self.submit(Op::Write(session, actions)), events)
    }

    fn snapshot(&self) -> Result<Box<dyn Snapshot>> {
        self.stats.snapshots.inc();
        Ok(Box::new(self.redb_snapshot()?))
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn health(&self) -> Health {
        self.db.health()
    }

    #[cfg(any(test, feature = "faults"))]
    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        self.ownership.clone()
    }

    fn close(&self) {
        self.close_writer();
    }
}

fn events(outcome: Outcome) -> Option<Vec<Stored>> {
    match outcome {
        Outcome::Events(events) => Some(events),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
