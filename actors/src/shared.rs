//! What every actor and drain of one runtime shares: the store, the catalog, tools and hooks,
//! the live-event bus, the stream permits, the routing map, limits and counters. Built once by
//! `Runtime::start_with`; everything here is read-mostly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_model::SessionId;
use agenthost_store::Store;
use tokio::sync::Semaphore;

use crate::IdMap;
use crate::bus::Bus;
use crate::catalog::Catalog;
use crate::config::{Limits, Supervision};
use crate::hooks::Hook;
use crate::metrics::Metrics;

/// What every actor and drain of one runtime shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Arc<dyn Store>,
    pub catalog: Catalog,
    pub tools: crate::tools::Registry,
    pub hooks: Vec<Arc<dyn Hook>>,
    pub bus: Bus,
    /// Provider calls open at once (steps, compactions, `generate`); tokio's semaphore is fair, so
    /// callers wait in FIFO order.
    pub streams: Arc<Semaphore>,
    /// Drains running at once (`limits.concurrent_drains`); fair like `streams`.
    pub drains: Arc<Semaphore>,
    /// Drains waiting for one of those slots right now.
    pub drains_waiting: AtomicUsize,
    /// Sessions waiting in the registry's line for a place among the live actors
    /// (`limits.live_sessions`).
    pub parked: IdMap<SessionId, ()>,
    /// Some session waits for a place: idle actors passivate at once rather than after
    /// `passivate_after`. Set and cleared by the registry.
    pub crowded: AtomicBool,
    /// Sessions with a drain in progress in this process.
    pub active: IdMap<SessionId, ()>,
    /// Sessions waiting for approvals, by their earliest expiry (the approval timer's).
    pub deadlines: crate::approvals::Deadlines,
    /// Sessions of this process whose exchange the budget blocks, and the limit.
    pub blocked: crate::IdMap<SessionId, agenthost_model::Limit>,
    /// Schedules armed in this process, by their next firing.
    pub schedules: crate::schedules::Armed,
    /// The largest prompt, in bytes (the store's limit, which schedules check before writing).
    pub prompt_limit: usize,
    pub limits: Limits,
    pub supervision: Supervision,
    pub passivate_after: Duration,
    pub instructions: Vec<crate::instructions::Instruction>,
    pub compaction: crate::config::Compaction,
    pub recovery: crate::config::Recovery,
    /// What session actors' history caches may hold together.
    pub history_budget: Arc<crate::history_cache::Budget>,
    /// Rows of inputs admitted here that no drain has read yet.
    pub admitted: crate::admitted::Admitted,
    pub metrics: Metrics,
    /// Set once by `Runtime::shutdown`; new work is refused from then on.
    pub shutting_down: AtomicBool,
    /// Cancelled by `Runtime::shutdown`, so background loops end at once.
    pub stopping: tokio_util::sync::CancellationToken,
    /// Cancelled when `Runtime::shutdown` has released the store.
    pub released: tokio_util::sync::CancellationToken,
}

impl Shared {
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    pub(crate) fn is_crowded(&self) -> bool {
        self.crowded.load(Ordering::Acquire)
    }
}
