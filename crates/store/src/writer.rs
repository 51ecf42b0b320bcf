//! The group-commit writer (SPEC §4.4): one thread owns redb's single write transaction.
//!
//! Requests from every session queue on one channel. The thread takes the first waiting request,
//! then everything else already queued (up to `max_batch`, optionally lingering `max_wait` for
//! more), runs them all in one write transaction and commits once with `Durability::Immediate`.
//! Only after that fsync does any caller hear back, so batching trades no durability: it only
//! shares the fsync among the requests that arrived while the previous one was in flight.
//!
//! A std thread and a std channel, not a tokio task: the commit blocks on fsync and must never
//! occupy a runtime worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agenthost_model::{SessionId, Stored, Timestamp};
use redb::{Database, Durability};
use tokio::sync::oneshot;

use crate::error::{Error, Result, storage};
use crate::ops::{Op, Outcome, execute};
use crate::rows::{Committed, Overlay, Tables};

/// Called on the writer thread with every batch of events, in commit order, right after the
/// commit is durable and before any caller is answered.
pub type CommitHook = Arc<dyn Fn(&[(SessionId, Stored)]) + Send + Sync>;

/// Supplies event timestamps; the system clock unless a test pins it.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<Outcome>>,
}

/// Batch-size buckets: 1, 2–3, 4–7, …, ≥ 2^(BUCKETS-1).
pub const BUCKETS: usize = 12;

/// Counters of the writer, readable at any time.
#[derive(Debug, Default)]
pub struct Stats {
    pub commits: AtomicU64,
    pub ops: AtomicU64,
    pub failed_commits: AtomicU64,
    /// Histogram of operations per commit by power of two.
    pub batch_sizes: [AtomicU64; BUCKETS],
    /// Folds of the front of the log into the per-session tables, the rows they moved, and the
    /// time they took inside their transactions, in microseconds.
    pub folds: AtomicU64,
    pub folded_rows: AtomicU64,
    pub fold_micros: AtomicU64,
}

impl Stats {
    fn record(&self, ops: usize) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(ops as u64, Ordering::Relaxed);
        let bucket = (usize::BITS - ops.max(1).leading_zeros() - 1) as usize;
        self.batch_sizes[bucket.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }
}

/// How the writer fills the front of the session-keyed tables and when it folds it (`tiers`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Front {
    /// The generation new rows go to.
    pub(crate) generation: u64,
    /// Rows added since the last fold, and since the current generation began.
    pub(crate) rows: usize,
    pub(crate) in_generation: usize,
    /// Fold once the front holds this many rows.
    pub(crate) fold_rows: usize,
    /// Start a new generation after this many rows.
    pub(crate) generation_rows: usize,
}

impl Front {
    pub(crate) fn new(fold_rows: usize) -> Self {
        let fold_rows = fold_rows.max(1);
        Front {
            generation: 0,
            rows: 0,
            in_generation: 0,
            fold_rows,
            // A handful of generations between folds: each stays small enough that a commit's
            // rows land on few pages, and readers visit few of them.
            generation_rows: fold_rows.div_ceil(8),
        }
    }

    /// Records a committed transaction that added `added` rows, after folding or not.
    fn committed(&mut self, folded: bool, added: usize) {
        if folded {
            self.rows = 0;
        }
        self.rows += added;
        self.in_generation += added;
        if self.in_generation >= self.generation_rows {
            self.generation += 1;
            self.in_generation = 0;
        }
    }
}

pub(crate) struct Writer {
    pub(crate) db: Arc<Database>,
    pub(crate) front: Front,
    pub(crate) committed: Committed,
    pub(crate) max_batch: usize,
    pub(crate) max_wait: Duration,
    pub(crate) pending_limit: u32,
    pub(crate) clock: Clock,
    pub(crate) on_commit: Option<CommitHook>,
    pub(crate) stats: Arc<Stats>,
}

impl Writer {
    /// Runs until every sender is gone, then returns: the last batch is committed first.
    pub(crate) fn run(mut self, rx: mpsc::Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            self.gather(&rx, &mut batch);
            self.commit(batch);
        }
    }

    fn gather(&self, rx: &mpsc::Receiver<Request>, batch: &mut Vec<Request>) {
        let deadline = Instant::now() + self.max_wait;
        while batch.len() < self.max_batch {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) if self.max_wait.is_zero() => return,
                Err(_) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    Ok(request) => batch.push(request),
                    Err(_) => return,
                },
            }
        }
    }

    fn commit(&mut self, batch: Vec<Request>) {
        let (ops, replies): (Vec<Op>, Vec<_>) = batch.into_iter().map(|r| (r.op, r.reply)).unzip();
        let count = ops.len();
        match self.transact(ops) {
            Ok((results, events)) => {
                self.stats.record(count);
                if let (Some(hook), false) = (&self.on_commit, events.is_empty()) {
                    hook(&events);
                }
                for (reply, result) in replies.into_iter().zip(results) {
                    // A caller that stopped waiting does not undo a committed operation.
                    let _ = reply.send(result);
                }
            }
            Err(e) => {
                self.stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, ops = count, "store commit failed; batch rejected");
                let message = e.to_string();
                for reply in replies {
                    let _ = reply.send(Err(Error::Storage(message.clone())));
                }
            }
        }
    }

    /// One write transaction for the whole batch. An operation refused by validation is dropped
    /// with its overlay and answered with its error; a storage error fails the whole batch,
    /// because redb poisons a transaction that failed part-way.
    #[allow(clippy::type_complexity)]
    fn transact(
        &mut self,
        ops: Vec<Op>,
    ) -> Result<(Vec<Result<Outcome>>, Vec<(SessionId, Stored)>)> {
        let now = (self.clock)();
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        let mut results = Vec::with_capacity(ops.len());
        let mut events = Vec::new();
        let fold = self.front.rows >= self.front.fold_rows;
        let mut folded = None;
        if fold {
            let start = Instant::now();
            let rows = crate::rows::fold(&txn)?;
            crate::rows::prune_working(&txn, &self.committed)?;
            folded = Some((rows, start.elapsed()));
        }
        let (added, rows, inputs);
        {
            let mut tables = Tables::open(&txn, self.front.generation, &self.committed)?;
            for op in ops {
                let mut overlay = Overlay::new(&mut tables);
                match execute(&mut overlay, op, now, self.pending_limit) {
                    Ok(outcome) => {
                        events.extend(overlay.flush()?);
                        results.push(Ok(outcome));
                    }
                    Err(e @ Error::Storage(_)) => return Err(e),
                    Err(e) => results.push(Err(e)),
                }
            }
            (added, rows, inputs) = tables.finish()?;
        }
        txn.commit().map_err(storage)?;
        self.front.committed(fold, added);
        self.committed.update(rows, inputs);
        if let Some((rows, took)) = folded {
            self.stats.folds.fetch_add(1, Ordering::Relaxed);
            self.stats
                .folded_rows
                .fetch_add(rows as u64, Ordering::Relaxed);
            self.stats
                .fold_micros
                .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        }
        Ok((results, events))
    }
}
