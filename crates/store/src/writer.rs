//! The group-commit writer: two threads, one write transaction at a time (and a third that
//! prepares folds of the log's front, `folder`).
//!
//! - The *planner* takes requests from one channel in arrival order and runs each operation
//!   against the batch's view of the tables (`rows::Tables`): validation, the projector, and
//!   the encoding of every row it changes. It reads through a read transaction, under the rows
//!   of the batches still being committed, which it holds in memory.
//! - The *committer* owns redb's write transaction: it inserts a batch's encoded rows, applies a
//!   fold of the front of the log when the batch carries one, and commits once with
//!   `Durability::Immediate`. Only after that fsync does any caller of the batch hear back, so
//!   batching trades no durability.
//!
//! While the committer inserts batch N, the planner runs the operations of batch N+1 as they
//! arrive (it encodes each operation's rows as it goes, so a batch is ready the moment it is
//! handed over). When the committer has inserted N and begins its commit (the fsync), the
//! planner hands N+1 over, to be inserted the moment N is durable, and starts N+2 (a small
//! batch waits for N's commit instead, to gather more): batches form from what arrives
//! meanwhile, as with one thread, but the work of a batch is split between two cores and the
//! committer does not wait for the planner.
//!
//! Under sustained load a batch lingers for more ([`Linger`]): once the writer has had work
//! without a rest for a while (`busy_for`, a rest being an idle wait of [`REST`]) and its last
//! batch held `linger_after` operations or more, a batch the committer is ready for waits up to
//! `max_wait`, taking in what came every [`TICK`] without being woken for each request, until it
//! fills up or two naps in a row bring nothing. One fsync, and the pages every commit rewrites,
//! then serve more operations. A quiet writer, or one hit by a short burst, commits at once, and
//! a linger that brought nothing (its writers all wait in the batch) pauses lingering for
//! [`DRY_PAUSE`] batches.
//!
//! When the front of the log is due for a fold, the folder prepares it from a snapshot and a
//! later batch carries it to the committer, which inserts what was prepared; a fold that merges
//! into the base is done by the commit whole.
//!
//! A batch is planned on the rows of the (at most two) batches handed over and not yet durable.
//! If a commit fails, the batch handed over on top of it is dropped, the one being planned fails,
//! and the planner drops its caches and starts again from what is durable.
//!
//! Std threads and std channels, not tokio tasks: the commit blocks on fsync and must never
//! occupy a runtime worker.

use std::collections::VecDeque;
use std::sync::Arc;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use agenthost_model::{SessionId, Stored, Timestamp};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use redb::{Durability, ReadableDatabase as _};
use tokio::sync::oneshot;

use crate::error::{Error, Result, storage};
use crate::folder::{self, Fold, Folding, Job};
use crate::log::Front;
use crate::ops::{Op, Outcome, execute};
use crate::rows::{Changes, Committed, Finished, Overlay, Sizes, Tables, Writes, room};
use crate::slot::{Health, Slot};

/// Called on the commit thread with every batch of events, in commit order, right after the
/// commit is durable and before any caller is answered.
pub type CommitHook = Arc<dyn Fn(&[(SessionId, Stored)]) + Send + Sync>;

/// Supplies event timestamps; the system clock unless a test pins it.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<Outcome>>,
}

/// What the planner receives from the store.
pub(crate) enum Msg {
    Request(Request),
    /// The store is closing: plan and commit what is queued, then stop.
    Close,
}

/// What the planner hears from the committer, on a channel of its own: while the committer is
/// busy with the batch before the one being planned, the planner waits on this one and takes
/// requests in when it wakes (see [`Flow::wait`]), so that callers do not pay a thread wake-up
/// for every request.
pub(crate) enum Signal {
    /// The committer wrote batch `n` into its transaction and is committing it: the next batch
    /// may be handed over, to start once that commit returns.
    Committing(u64),
    /// The committer is done with batch `n`. Its rows come back to be freed where they were
    /// made.
    Committed(u64, Done, Box<Writes>),
}

/// How often the planner takes requests in while a batch waits for the committer.
const TICK: Duration = Duration::from_micros(200);

/// How the committer finished a batch.
pub(crate) enum Done {
    Durable,
    /// The commit failed, for this reason.
    Failed(Failure),
    /// Not tried: it was planned on top of a batch that failed.
    Dropped,
}

/// What the writers count, where they commit: counters and histograms in OpenMetrics form,
/// readable at any time (`get`) and registered by whoever exports them (the server's
/// `/metrics`). Clones share their values.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Write transactions committed.
    pub commits: Counter,
    /// Operations committed.
    pub ops: Counter,
    /// Write transactions that failed as a whole.
    pub failed_commits: Counter,
    /// Operations refused because this node did not hold the session's partition at the epoch
    /// it took it (a cluster's fencing).
    pub fenced: Counter,
    /// Operations per commit (group commit).
    pub batch_size: Histogram,
    /// Batches that lingered for more operations before their commit (a busy writer's).
    pub lingered: Counter,
    /// Time one commit took: page writes and the fsync (redb), the round trips and the commit
    /// (PostgreSQL).
    pub commit_seconds: Histogram,
    /// The same time, summed, in microseconds (for benches that difference two readings).
    pub commit_micros: Counter,
    /// Background work a backend does inside its commits (the embedded store folds the front
    /// of its log into per-session tables): runs, rows moved, and time in microseconds.
    pub maintenance_runs: Counter,
    pub maintenance_rows: Counter,
    pub maintenance_micros: Counter,
    /// Read views opened ([`crate::Store::snapshot`]): reads of the API, drains and sweeps.
    pub snapshots: Counter,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            commits: Counter::default(),
            ops: Counter::default(),
            failed_commits: Counter::default(),
            fenced: Counter::default(),
            // 1, 2, 4, … 2048 operations.
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            lingered: Counter::default(),
            // 100 µs to about 3 s.
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            commit_micros: Counter::default(),
            maintenance_runs: Counter::default(),
            maintenance_rows: Counter::default(),
            maintenance_micros: Counter::default(),
            snapshots: Counter::default(),
        }
    }
}

impl Stats {
    /// A commit of `ops` operations that took `took`.
    pub(crate) fn record(&self, ops: usize, took: Duration) {
        self.commits.inc();
        self.ops.inc_by(ops as u64);
        self.batch_size.observe(ops as f64);
        self.commit_seconds.observe(took.as_secs_f64());
        self.commit_micros.inc_by(took.as_micros() as u64);
    }
}

/// A planned batch, handed to the committer.
pub(crate) struct Plan {
    /// Batches are numbered from 1 in the order planned.
    n: u64,
    /// How many failed commits the planner had seen: a batch planned before a failure is
    /// dropped, as it may build on the failed one.
    epoch: u64,
    /// What the transaction does about the front of the log (when it folds, the writes also
    /// list the sessions to take out of the working set).
    fold: Fold,
    writes: Writes,
    /// Every operation's reply, in order: an operation refused by validation is answered with
    /// its error after the commit, like the others.
    replies: Replies,
    events: Vec<(SessionId, Stored)>,
}

type Replies = Vec<(oneshot::Sender<Result<Outcome>>, Result<Outcome>)>;

/// Batches of at least this many operations are handed over while the batch before them syncs
/// (see [`Flow::ready`]).
const EARLY_HANDOVER: usize = 64;

/// Where the planner is between messages.
#[derive(Default)]
struct Flow {
    /// The last batch handed over, the last the committer began to commit, and the last it is
    /// done with.
    handed: u64,
    committing: u64,
    done: u64,
    /// No more requests will come.
    closing: bool,
    /// Requests received and not yet run.
    backlog: VecDeque<Request>,
    /// A commit failed, for this reason.
    failed: Option<Failure>,
    /// Since when the writer has had work without a [`REST`]; `None` while it rests.
    working_since: Option<Instant>,
    /// Batches still to hand over before one may linger again: a linger that brought nothing
    /// pauses lingering for [`DRY_PAUSE`] batches.
    linger_pause: u32,
}

impl Flow {
    /// Takes in one message from the store; `Err` means the store is gone.
    fn request(&mut self, msg: std::result::Result<Msg, mpsc::RecvError>) {
        match msg {
            Ok(Msg::Request(request)) => self.backlog.push_back(request),
            Ok(Msg::Close) | Err(mpsc::RecvError) => self.closing = true,
        }
    }

    /// Takes in one signal; `Err` means the committer is gone.
    fn signal(&mut self, signal: std::result::Result<Signal, mpsc::RecvError>) {
        match signal {
            Ok(Signal::Committing(n)) => self.committing = self.committing.max(n),
            Ok(Signal::Committed(n, done, writes)) => {
                self.committing = self.committing.max(n);
                self.done = self.done.max(n);
                if let Done::Failed(reason) = done {
                    self.failed = Some(reason);
                }
                drop(writes);
            }
            Err(mpsc::RecvError) => {
                if self.done < self.handed {
                    self.committing = u64::MAX;
                    self.done = u64::MAX;
                    self.failed = Some(Failure::stopped("the store's commit thread stopped"));
                }
            }
        }
    }

    /// Takes in every signal and request already waiting.
    fn take_waiting(&mut self, inbox: &Inbox) {
        loop {
            match inbox.signals.try_recv() {
                Ok(signal) => self.signal(Ok(signal)),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.signal(Err(mpsc::RecvError));
                    break;
                }
            }
        }
        loop {
            match inbox.requests.try_recv() {
                Ok(msg) => self.request(Ok(msg)),
                Err(mpsc::TryRecvError::Empty) => return,
                Err(mpsc::TryRecvError::Disconnected) => return self.request(Err(mpsc::RecvError)),
            }
        }
    }

    /// Waits for something to do, with `planned` operations in the batch being planned: for a
    /// request when there is nothing else (the committer's signals wait until then); else for
    /// the committer, taking in the requests that came every [`TICK`], so that the batch is
    /// complete when the committer is ready for it.
    fn wait(&mut self, inbox: &Inbox, planned: usize) {
        if planned == 0 || self.done >= self.handed {
            if self.closing {
                return;
            }
            let idle = Instant::now();
            self.request(inbox.requests.recv());
            if planned == 0 && idle.elapsed() >= REST {
                self.working_since = None;
            }
        } else {
            match inbox.signals.recv_timeout(TICK) {
                Ok(signal) => self.signal(Ok(signal)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => self.signal(Err(mpsc::RecvError)),
            }
        }
        self.take_waiting(inbox);
    }

    /// Whether to hand over a batch of `ops` operations now. A large batch goes as soon as the
    /// committer is syncing every batch it was given, so that the committer starts it the moment
    /// that sync returns instead of waiting for the planner to hear of it; a small one waits
    /// until the committer is done, gathering what arrives during the fsync, as every commit
    /// costs an fsync.
    fn ready(&self, ops: usize) -> bool {
        match ops {
            0 => false,
            ops if ops >= EARLY_HANDOVER => self.committing >= self.handed,
            _ => self.done >= self.handed,
        }
    }
}

/// An idle wait for requests at least this long ends the writer's busy spell.
const REST: Duration = Duration::from_millis(2);

/// Naps in a row that bring nothing end a linger: the batch then holds every writer there is.
const EMPTY_NAPS: u32 = 2;

/// Batches handed over without lingering after a linger that brought nothing: writers that all
/// wait for the batch they are in (a closed loop) pay a linger that rarely.
const DRY_PAUSE: u32 = 8;

/// A batch lingering: since when, how many operations it held then and when it last looked, and
/// how many naps in a row brought none.
struct Lingering {
    since: Instant,
    first: usize,
    seen: usize,
    empty: u32,
}

/// When a batch the committer is ready for waits for more operations, decided from counts and
/// times alone (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Linger {
    /// The longest a batch waits; zero never.
    pub(crate) max_wait: Duration,
    /// Operations in the last batch from which the writer may be busy.
    pub(crate) after: usize,
    /// How long the writer must have had work, without a [`REST`], to be busy.
    pub(crate) busy_for: Duration,
}

impl Linger {
    /// Whether the next batch lingers: the last one held `last_batch` operations, and the writer
    /// has had work for `working` without a rest (`None`: it is resting). With a zero `busy_for`
    /// the last batch alone decides.
    fn starts(&self, last_batch: usize, working: Option<Duration>) -> bool {
        !self.max_wait.is_zero()
            && last_batch >= self.after
            && (self.busy_for.is_zero() || working.is_some_and(|w| w >= self.busy_for))
    }

    /// How long a lingering batch sleeps before it looks again, having lingered `waited`, the
    /// last `empty` naps in a row bringing nothing. `None` hands it over.
    fn nap(&self, waited: Duration, empty: u32) -> Option<Duration> {
        (empty < EMPTY_NAPS && waited < self.max_wait).then(|| (self.max_wait - waited).min(TICK))
    }
}

/// The planner's channels.
pub(crate) struct Inbox {
    pub(crate) requests: mpsc::Receiver<Msg>,
    pub(crate) signals: mpsc::Receiver<Signal>,
    /// The folder's outcomes (see `folder`).
    pub(crate) folded: mpsc::Receiver<folder::Done>,
}

pub(crate) struct Planner {
    pub(crate) db: Arc<Slot>,
    pub(crate) front: Front,
    /// The next fold of the front, and the folder that prepares it (`None` once its thread is
    /// gone: the commit then folds). Jobs sent so far.
    pub(crate) folding: Folding,
    pub(crate) folder: Option<mpsc::Sender<Job>>,
    pub(crate) jobs: u64,
    pub(crate) committed: Committed,
    /// The rows of the batches handed over and not yet durable, oldest first, by number.
    pub(crate) in_flight: VecDeque<(u64, Changes)>,
    /// Failed commits seen.
    pub(crate) epoch: u64,
    pub(crate) max_batch: usize,
    pub(crate) linger: Linger,
    /// Operations in the batch handed over last, which tell whether the writer is busy.
    pub(crate) last_batch: usize,
    /// What the batches handed over last held, which the next one starts with room for.
    pub(crate) sizes: Sizes,
    pub(crate) stats: Arc<Stats>,
    pub(crate) pending_limit: u32,
    pub(crate) clock: Clock,
    /// Tests: how many of the next batches to fail after one of their operations ran.
    #[cfg(test)]
    pub(crate) fail_plans: Arc<std::sync::atomic::AtomicU64>,
}

impl Planner {
    /// Runs until the store closes (or every sender is gone): what is queued is committed first.
    pub(crate) fn run(mut self, inbox: Inbox, committer: mpsc::Sender<Plan>) {
        let mut flow = Flow::default();
        loop {
            while flow.backlog.is_empty() && !flow.closing {
                flow.wait(&inbox, 0);
                self.after_failure(&mut flow);
            }
            if flow.backlog.is_empty() {
                break;
            }
            if !self.plan(&inbox, &mut flow, &committer) {
                return;
            }
        }
        while flow.done < flow.handed {
            flow.signal(inbox.signals.recv());
        }
    }

    /// After a failed commit, nothing the planner holds is known to be true any more.
    fn after_failure(&mut self, flow: &mut Flow) {
        if flow.failed.take().is_some() {
            self.committed = Committed::default();
            self.in_flight.clear();
            self.epoch += 1;
            self.folding.give_up(&mut self.front, None);
        }
    }

    /// After a batch failed while it was planned: what it changed in the caches in place is not
    /// true, and the batches being committed are known only there, so the planner waits for
    /// them to be done with before it drops the caches.
    fn forget(&mut self, inbox: &Inbox, flow: &mut Flow) {
        while flow.done < flow.handed {
            flow.signal(inbox.signals.recv());
        }
        self.committed = Committed::default();
        self.in_flight.clear();
        self.after_failure(flow);
    }

    /// Takes in what the folder prepared, and sends it the next job when one is due; returns
    /// what the batch about to be planned does about the front.
    fn fold_step(&mut self, inbox: &Inbox, flow: &Flow) -> (Fold, Option<crate::log::Frozen>) {
        loop {
            match inbox.folded.try_recv() {
                Ok((job, outcome)) => self.folding.prepared(job, outcome, &mut self.front),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.folder = None;
                    self.folding.folder_gone();
                    break;
                }
            }
        }
        if flow.failed.is_none() {
            let (handed, done) = (flow.handed, flow.done);
            let folder = self.folder.is_some();
            if let Some(job) =
                (self.folding).step(&mut self.front, handed, done, folder, &mut self.jobs)
                && let Some(sender) = &self.folder
                && sender.send(job).is_err()
            {
                self.folder = None;
                self.folding.folder_gone();
            }
        }
        self.folding.carried()
    }

    /// Plans the next batch and hands it over once the committer is ready for it. Returns
    /// false when the committer is gone.
    fn plan(&mut self, inbox: &Inbox, flow: &mut Flow, committer: &mpsc::Sender<Plan>) -> bool {
        // Batches that are durable now are seen by the read transaction the plan begins with.
        while self.in_flight.front().is_some_and(|(n, _)| *n <= flow.done) {
            self.in_flight.pop_front();
        }
        let (fold, frozen) = self.fold_step(inbox, flow);
        let mut replies = Replies::with_capacity(room(self.sizes.ops));
        let mut events = Vec::with_capacity(room(self.sizes.events));
        let finished = match self.gather(inbox, flow, fold.folds(), &mut replies, &mut events) {
            Ok(finished) => finished,
            Err(reason) => {
                self.folding.give_up(&mut self.front, frozen);
                if replies.is_empty() {
                    // The batch could not even start: its first request takes the error, so
                    // that the planner does not try the same thing forever.
                    if let Some(request) = flow.backlog.pop_front() {
                        replies.push((request.reply, Ok(Outcome::Events(Vec::new()))));
                    }
                }
                fail(replies, &reason);
                self.forget(inbox, flow);
                return true;
            }
        };
        let n = flow.handed + 1;
        let (ops, recorded) = (replies.len(), events.len());
        let mut writes = finished.writes;
        let prunes = fold.folds();
        // A fold in the commit empties the whole front; a prepared one, the frozen generations,
        // which the front no longer counts.
        let emptied = matches!(fold, Fold::InCommit);
        writes.generation = self.front.place(emptied, finished.front_rows);
        let plan = Plan {
            n,
            epoch: self.epoch,
            fold,
            writes,
            replies,
            events,
        };
        if let Err(mpsc::SendError(plan)) = committer.send(plan) {
            fail(
                plan.replies,
                &Failure::stopped("the store's commit thread stopped"),
            );
            return false;
        }
        flow.handed = n;
        self.last_batch = ops;
        flow.working_since.get_or_insert_with(Instant::now);
        flow.linger_pause = flow.linger_pause.saturating_sub(1);
        let mut sizes = finished.sizes;
        (sizes.ops, sizes.events) = (ops, recorded);
        self.sizes = self.sizes.after(sizes);
        let mut changes = finished.changes;
        changes.prunes = prunes;
        self.in_flight.push_back((n, changes));
        true
    }

    /// Runs requests as they come, up to `max_batch` operations, until the committer is ready
    /// for another batch; then returns the batch's rows. `Err` fails the batch.
    fn gather(
        &mut self,
        inbox: &Inbox,
        flow: &mut Flow,
        fold: bool,
        replies: &mut Replies,
        events: &mut Vec<(SessionId, Stored)>,
    ) -> std::result::Result<Finished, Failure> {
        // The database is held for the call only: the committer may have to open it again.
        let read = (self.db.get())
            .and_then(|db| db.begin_read().map_err(storage))
            .map_err(|e| Failure::of(&e))?;
        let in_flight: Vec<&Changes> = self.in_flight.iter().rev().map(|(_, c)| c).collect();
        let n = flow.handed + 1;
        let mut tables = Tables::open(&read, &mut self.committed, in_flight, self.sizes, n)
            .map_err(|e| Failure::of(&e))?;
        let now = (self.clock)();
        let mut lingering: Option<Lingering> = None;
        loop {
            flow.take_waiting(inbox);
            if let Some(reason) = &flow.failed {
                // Planned on top of a batch that did not commit.
                return Err(reason.clone());
            }
            let room = replies.len() < self.max_batch;
            // The committer is ready: hand the batch over now, unless the writer is busy and
            // the batch lingers for more. Only for an idle committer: a batch large enough to be
            // handed over while the one before it syncs is not held back.
            let ready = flow.ready(replies.len());
            let linger = ready
                && flow.done >= flow.handed
                && room
                && !flow.closing
                && (lingering.is_some()
                    || (flow.linger_pause == 0
                        && self.linger.starts(
                            self.last_batch,
                            flow.working_since.map(|since| since.elapsed()),
                        )));
            if ready && !linger {
                return (tables.finish(fold, flow.done)).map_err(|e| Failure::of(&e));
            }
            if room && let Some(request) = flow.backlog.pop_front() {
                let mut overlay = Overlay::new(&mut tables);
                let result = execute(&mut overlay, request.op, now, self.pending_limit).and_then(
                    |outcome| {
                        overlay.flush(events)?;
                        Ok(outcome)
                    },
                );
                if let Err(e @ (Error::Storage(_) | Error::DiskFull(_) | Error::Io(_))) = &result {
                    // redb failed a read: the batch cannot be trusted as a whole.
                    let failure = Failure::of(e);
                    replies.push((request.reply, result));
                    return Err(failure);
                }
                replies.push((request.reply, result));
                // Only while a batch is being committed: the case that needs care.
                #[cfg(test)]
                if flow.done < flow.handed && take_one(&self.fail_plans) {
                    return Err(Failure::stopped("injected read failure"));
                }
                continue;
            }
            if linger {
                let size = replies.len();
                let state = lingering.get_or_insert_with(|| {
                    self.stats.lingered.inc();
                    Lingering {
                        since: Instant::now(),
                        first: size,
                        seen: 0,
                        empty: 0,
                    }
                });
                state.empty = if size > state.seen {
                    0
                } else {
                    state.empty + 1
                };
                state.seen = size;
                let Some(nap) = self.linger.nap(state.since.elapsed(), state.empty) else {
                    if size == state.first {
                        flow.linger_pause = DRY_PAUSE;
                    }
                    return (tables.finish(fold, flow.done)).map_err(|e| Failure::of(&e));
                };
                // Asleep on the committer's channel: a request does not wake the planner (a
                // thread wake-up each would cost more than the linger saves); what came is
                // taken in when it wakes, so a batch that fills up goes at once.
                match inbox.signals.recv_timeout(nap) {
                    Ok(signal) => flow.signal(Ok(signal)),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => flow.signal(Err(mpsc::RecvError)),
                }
                continue;
            }
            // Nothing to run until a request comes or the committer moves on.
            flow.wait(inbox, replies.len());
        }
    }
}

/// Why a batch did not commit, as each of its callers is told.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    kind: fn(String) -> Error,
    reason: String,
}

impl Failure {
    fn stopped(reason: &str) -> Failure {
        Failure {
            kind: Error::Storage,
            reason: reason.to_owned(),
        }
    }

    fn of(error: &Error) -> Failure {
        let kind: fn(String) -> Error = match error {
            Error::DiskFull(_) => Error::DiskFull,
            Error::Io(_) => Error::Io,
            Error::Stopped(_) => Error::Stopped,
            _ => Error::Storage,
        };
        let reason = match error {
            Error::DiskFull(r) | Error::Io(r) | Error::Stopped(r) | Error::Storage(r) => r.clone(),
            other => other.to_string(),
        };
        Failure { kind, reason }
    }
}

/// Answers every operation of a batch that will not commit.
fn fail(replies: Replies, failure: &Failure) {
    tracing::error!(error = %failure.reason, ops = replies.len(), "store batch rejected");
    for (reply, _) in replies {
        let _ = reply.send(Err((failure.kind)(failure.reason.clone())));
    }
}

pub(crate) struct Committer {
    pub(crate) db: Arc<Slot>,
    pub(crate) on_commit: Option<CommitHook>,
    pub(crate) stats: Arc<Stats>,
    /// Tests: how many of the next commits to fail, at the last moment (after the next batch
    /// may have been handed over).
    #[cfg(test)]
    pub(crate) fail_commits: Arc<std::sync::atomic::AtomicU64>,
}

impl Committer {
    /// Commits each batch in the order planned, until the planner is gone.
    pub(crate) fn run(self, plans: mpsc::Receiver<Plan>, planner: mpsc::Sender<Signal>) {
        let planner = Stopping(planner);
        let planner = &planner.0;
        // Batches planned before the planner saw the last failure are dropped.
        let mut live_epoch = 0;
        let mut last_failure = Failure::of(&Error::Storage(String::new()));
        while let Ok(plan) = plans.recv() {
            let Plan {
                n,
                epoch,
                fold,
                writes,
                replies,
                events,
            } = plan;
            if epoch < live_epoch {
                let _ = planner.send(Signal::Committed(n, Done::Dropped, Box::new(writes)));
                fail(replies, &last_failure);
                continue;
            }
            let count = replies.len();
            let committed = self
                .writable()
                .and_then(|()| self.commit(n, &fold, &writes, planner));
            match committed {
                Ok(took) => {
                    self.db.set_health(Health::Ok);
                    let _ = planner.send(Signal::Committed(n, Done::Durable, Box::new(writes)));
                    self.stats.record(count, took);
                    if let (Some(hook), false) = (&self.on_commit, events.is_empty()) {
                        hook(&events);
                    }
                    for (reply, result) in replies {
                        // A caller that stopped waiting does not undo a committed operation.
                        let _ = reply.send(result);
                    }
                }
                Err(e) => {
                    self.stats.failed_commits.inc();
                    match &e {
                        Error::DiskFull(reason) => {
                            self.db.set_health(Health::DiskFull(reason.clone()))
                        }
                        Error::Io(reason) => self.db.set_health(Health::Failed(reason.clone())),
                        _ => {}
                    }
                    live_epoch = epoch + 1;
                    last_failure = Failure::of(&e);
                    let _ = planner.send(Signal::Committed(
                        n,
                        Done::Failed(last_failure.clone()),
                        Box::new(writes),
                    ));
                    fail(replies, &last_failure);
                }
            }
        }
    }

    /// Whether a commit may be tried: never after an I/O error stopped writes; after a full
    /// disk, only once the database opened again (redb refuses writes after an I/O error until
    /// then), which is tried before every batch until it works.
    fn writable(&self) -> Result<()> {
        match self.db.health() {
            Health::Ok => Ok(()),
            Health::Failed(reason) | Health::Unreachable(reason) => Err(Error::Stopped(reason)),
            Health::DiskFull(reason) => self.db.reopen().map_err(|e| match e {
                Error::Io(_) | Error::Storage(_) => Error::DiskFull(reason),
                other => other,
            }),
        }
    }

    /// One write transaction for the whole batch, returning how long its commit took. A storage
    /// error fails the whole batch, because redb poisons a transaction that failed part-way.
    fn commit(
        &self,
        n: u64,
        fold: &Fold,
        writes: &Writes,
        planner: &mpsc::Sender<Signal>,
    ) -> Result<Duration> {
        let mut txn = self.db.get()?.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        let start = Instant::now();
        let folded = match fold {
            Fold::None => None,
            Fold::InCommit => Some(crate::log::fold(&txn)?),
            Fold::Prepared(runs) => Some(crate::log::apply(&txn, runs)?),
        }
        .map(|rows| (rows, start.elapsed()));
        writes.apply(&txn)?;
        if let Some((rows, took)) = folded {
            self.stats.maintenance_runs.inc();
            self.stats.maintenance_rows.inc_by(rows as u64);
            self.stats
                .maintenance_micros
                .inc_by(took.as_micros() as u64);
        }
        // The planner may hand over the next batch while this one syncs.
        let _ = planner.send(Signal::Committing(n));
        #[cfg(test)]
        if take_one(&self.fail_commits) {
            return Err(Error::Storage("injected commit failure".into()));
        }
        let start = Instant::now();
        txn.commit().map_err(storage)?;
        Ok(start.elapsed())
    }
}

/// Tests: takes one from a count of failures to inject; whether there was one.
#[cfg(test)]
fn take_one(count: &std::sync::atomic::AtomicU64) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    count
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Tells the planner that the committer stopped if it panics, so that the batch it held is
/// answered and the planner stops handing over more.
struct Stopping(mpsc::Sender<Signal>);

impl Drop for Stopping {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.send(Signal::Committed(
                u64::MAX,
                Done::Failed(Failure::stopped("the store's commit thread panicked")),
                Box::default(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINGER: Linger = Linger {
        max_wait: Duration::from_millis(1),
        after: 8,
        busy_for: Duration::from_millis(20),
    };

    #[test]
    fn a_batch_lingers_after_a_large_one_once_the_writer_has_worked_without_rest() {
        let ms = Duration::from_millis;
        assert!(LINGER.starts(8, Some(ms(20))));
        assert!(LINGER.starts(4096, Some(ms(500))));
        assert!(!LINGER.starts(7, Some(ms(500))), "the last batch was small");
        assert!(!LINGER.starts(8, Some(ms(19))), "a short burst");
        assert!(!LINGER.starts(4096, None), "the writer rests");
        let never = Linger {
            max_wait: Duration::ZERO,
            ..LINGER
        };
        assert!(
            !never.starts(4096, Some(ms(500))),
            "a zero wait never lingers"
        );
        let always = Linger {
            after: 0,
            busy_for: Duration::ZERO,
            ..LINGER
        };
        assert!(always.starts(0, None), "the last batch alone decides");
    }

    #[test]
    fn a_lingering_batch_naps_a_tick_at_a_time_until_its_time_is_up_or_nothing_comes() {
        let us = Duration::from_micros;
        assert_eq!(LINGER.nap(us(0), 0), Some(TICK), "a tick at most");
        assert_eq!(
            LINGER.nap(us(900), 0),
            Some(us(100)),
            "what is left of the wait"
        );
        assert_eq!(LINGER.nap(us(1000), 0), None, "the wait is over");
        assert_eq!(LINGER.nap(us(5000), 0), None);
        assert_eq!(
            LINGER.nap(us(200), 1),
            Some(TICK),
            "one nap brought nothing"
        );
        assert_eq!(LINGER.nap(us(400), EMPTY_NAPS), None, "two in a row end it");
    }
}
