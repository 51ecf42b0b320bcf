//! The drain: one execution span of a session. It promotes eligible input and runs
//! steps until nothing more is owed. It runs in a task its session actor owns and reports back by
//! message, so the actor's mailbox never waits on a provider or a tool.
//!
//! Durable shape of a drain: `ExecutionStarted` (takes the claim) → promotions and steps →
//! `ExecutionSucceeded` | `ExecutionFailed` | `ExecutionInterrupted`. A drain with nothing to
//! do writes nothing. Every drain that took the claim ends with one of those events, except a
//! shutdown's and a panic's, which keep the claim for recovery.
//!
//! A drain that finds a claim at its start recovers it first ([`recover`]): the claim was left by
//! an execution that is gone, and what the session owes is decided by
//! [`agenthost_model::owed()`] (ARCHITECTURE.md, "Recovery: what a session owes").
//!
//! The loop, at each boundary: sample instruction sources (a change is one chronological system
//! message, ahead of the input it applies to); promote (`Continuation` while tool results are
//! owed, else `Idle`; new input resets the step counter); if nothing is owed, `SucceedIfIdle`;
//! otherwise run a step. When everything the drain submitted is durable and no instruction update
//! is due, its snapshot is complete: the drain selects the inputs itself and submits their
//! `PromptPromoted` events, and the step builds its request from the snapshot plus those inputs,
//! so the promotion rides with the step's first write. Until that write is durable nothing is
//! promoted: a crash leaves the input pending. A plain turn is therefore two writer operations:
//! the admission, and one write carrying the claim, the promotion, the step and the drain's
//! success; and one snapshot: the opening read, which the first step's build reads again
//! ([`Opening`]), while the settlement looks for input that arrived during the step itself.

pub(crate) mod compaction;
mod course;
pub(crate) mod settle;
pub(crate) mod step;
mod writes;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agenthost_model::promotion;
use agenthost_model::{Event, InterruptReason, SessionId};
use agenthost_store::{Action, Snapshot};
use tokio_util::sync::CancellationToken;

use crate::drain::settle::{Recovered, recover};
use crate::drain::writes::Submitted;
use crate::error::{Error, Result};
use crate::history_cache::HistoryCache;
use crate::instructions;
use crate::mint;
use crate::shared::Shared;
pub use course::Outcome;
use course::{AfterPromotion, AfterStep, AtBoundary, Course, Stepped};
use step::StepEnd;

/// Cancellation with the reason the drain records: a user interrupt or a shutdown.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    token: CancellationToken,
    reason: Arc<Mutex<Option<InterruptReason>>>,
}

impl Cancel {
    pub fn interrupt(&self, reason: InterruptReason) {
        let mut slot = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(reason);
        drop(slot);
        self.token.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// Why the drain was cancelled. Only meaningful once cancelled; the token is cancelled only
    /// through [`Cancel::interrupt`], which records the reason first.
    pub fn reason(&self) -> InterruptReason {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(InterruptReason::User)
    }
}

/// One drain's inputs.
#[derive(Clone)]
pub(crate) struct Drain {
    pub session: SessionId,
    pub shared: Arc<Shared>,
    pub forced: bool,
    pub kind: Kind,
    /// The lease epoch the drain runs under, on a store shared by several nodes: its writes are
    /// refused once the partition was lost, even if this node took it again since (the owner in
    /// between may have recovered the session).
    pub fence: Option<i64>,
    pub cancel: Cancel,
    /// Writes submitted and not yet confirmed durable.
    pub in_flight: Arc<Mutex<Submitted>>,
    /// The session actor's history cache; none for a drain outside an actor.
    pub history: Option<Arc<Mutex<HistoryCache>>>,
    /// The drain's run slot, while it holds one.
    pub slot: Slot,
}

/// What a drain does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The agent loop: recovery of a claim it finds, promotion and steps.
    Turn,
    /// A manual compaction.
    Compaction,
    /// A user interrupt that found no drain: ends what a stopped execution left under its claim
    /// ([`release`]); runs nothing.
    Release,
}

/// A drain's place among the drains running at once (`limits.concurrent_drains`): taken before
/// the drain starts, given back while its tools run and during a retry's backoff and taken again
/// after, released when the drain ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct Slot(Arc<Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>);

impl Slot {
    /// Waits for a slot, in FIFO order; `false` when the drain was cancelled first.
    pub(crate) async fn take(&self, shared: &Shared, cancel: &Cancel) -> bool {
        let waiting = Waiting::count(&shared.drains_waiting);
        let permit = tokio::select! {
            biased;
            _ = cancel.cancelled() => return false,
            permit = shared.drains.clone().acquire_owned() => permit,
        };
        drop(waiting);
        match permit {
            Ok(permit) => {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(permit);
                true
            }
            // The semaphore is never closed; without one, the drain goes on unbounded.
            Err(_) => true,
        }
    }

    /// Gives the slot back, to another drain waiting for one.
    pub(crate) fn release(&self) {
        drop(self.0.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// Counts a drain among those waiting for a slot until dropped, however the wait ends (a slot,
/// an interrupt, or the task aborted with its actor).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("session", &self.session)
            .field("forced", &self.forced)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// How a drain ended, for its actor.
#[derive(Debug)]
pub(crate) struct Ended {
    pub result: Result<Outcome>,
    /// The drain failed and its failure could not be recorded (the store refused writes): the
    /// claim may be left with no drain, and its actor retries it with backoff.
    pub stranded: bool,
}

/// Runs the drain. Every drain that took the claim ends with a durable terminal event: a drain
/// that fails with the claim still held (a configuration problem, a storage error, a failed
/// step) records `ExecutionFailed` with the reason, so the session never stays claimed while
/// idle. Shutdown and a panic are the exceptions: they keep the claim on purpose, for recovery.
/// When even that record cannot be written, the drain ends [`Ended::stranded`].
pub(crate) async fn run(d: Drain) -> Ended {
    let result = match d.kind {
        // Boxed: a compaction's future is larger than a turn's, and every running drain would
        // otherwise carry its size.
        Kind::Compaction => Box::pin(crate::drain::compaction::compact(&d, false))
            .await
            .map(|kept_from| Outcome::Compacted { kept_from }),
        Kind::Turn => agent_loop(&d).await,
        Kind::Release => release(&d).await,
    };
    match result {
        // A panic is the supervisor's to handle: the restarted actor recovers the claim. A
        // refusal (`Busy`: a compaction asked of an exchange that is not done) wrote nothing,
        // and the claim it found is not its to end.
        Err(error)
            if !matches!(
                error,
                Error::ShuttingDown | Error::Panicked(_) | Error::Busy(_)
            ) =>
        {
            let stranded = match fail_claim(&d, &error).await {
                Ok(()) => false,
                Err(e) => {
                    tracing::error!(session_id = %d.session, error = %e, "could not record the drain's failure; its claim is retried with backoff");
                    true
                }
            };
            Ended {
                result: Err(error),
                stranded,
            }
        }
        result => Ended {
            result,
            stranded: false,
        },
    }
}

/// Records `error` as the end of the execution that holds the session's claim, if the claim is
/// held. Read from the store, not from what the drain submitted: a write that carried the
/// drain's own `ExecutionFailed` (a failed step's) may itself be what failed. Drains of one
/// session never overlap, so a claim held now is this drain's, or the one it was recovering.
///
/// Calls its exchange held for approval are withdrawn in the same commit: nothing may wait on an
/// execution that ended.
async fn fail_claim(d: &Drain, error: &Error) -> Result<()> {
    let held = d
        .read(|snap, session| {
            let Some(row) = snap.session(session)?.filter(|row| row.claim.is_some()) else {
                return Ok(None);
            };
            let from = agenthost_model::history::load_from(&row);
            let messages = snap.messages(session, from, usize::MAX)?;
            Ok(Some(agenthost_model::owed::leftovers(&messages).held))
        })
        .await?;
    let Some(held) = held else {
        return Ok(());
    };
    let mut events = agenthost_model::owed::withdraw(&held, "the execution failed");
    events.push(Event::ExecutionFailed {
        error: error.to_string(),
        halted: false,
    });
    d.append(events).await
}

impl Drain {
    /// Runs `read` on a snapshot: inline where the store's reads are local (the embedded store),
    /// on the blocking pool where they are round trips on pooled connections (PostgreSQL), so a
    /// drain never holds a runtime thread while it waits on the network.
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&dyn Snapshot, &SessionId) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if self.shared.store.local_reads() {
            return read(&*self.shared.store.snapshot()?, &self.session);
        }
        let (store, session) = (self.shared.store.clone(), self.session.clone());
        tokio::task::spawn_blocking(move || read(&*store.snapshot()?, &session))
            .await
            .map_err(|e| Error::Unavailable(format!("a store read failed: {e}")))?
    }
}

/// The snapshot a drain opened with and the session's row in it, kept for the drain's first
/// step where reads are local: when the drain promotes the inputs that snapshot showed and writes
/// nothing before the step, the step's build reads the same state, so it reads that snapshot
/// instead of taking another and reading the row again.
pub(crate) struct Opening {
    pub snap: Box<dyn Snapshot>,
    pub row: agenthost_model::SessionRow,
}

/// The session's row and its pending inputs, from one snapshot; the inputs admitted here are
/// taken from memory (see `admitted`).
fn opening_read(
    snap: &dyn Snapshot,
    session: &SessionId,
    shared: &Shared,
) -> Result<(agenthost_model::SessionRow, Vec<agenthost_model::InboxRow>)> {
    let mut known = |seq| {
        let row = shared.admitted.take(session, seq)?;
        shared.metrics.inputs_from_memory.inc();
        Some(row)
    };
    snap.session_and_pending_known(session, &mut known)?
        .ok_or_else(|| Error::SessionNotFound(session.clone()))
}

async fn agent_loop(d: &Drain) -> Result<Outcome> {
    // The row and the pending inputs from one snapshot; the inputs serve the first boundary.
    let (row, inputs, snap) = match d.shared.store.local_reads() {
        true => {
            let snap = d.shared.store.snapshot()?;
            let (row, inputs) = opening_read(&*snap, &d.session, &d.shared)?;
            (row, inputs, Some(snap))
        }
        false => {
            let shared = d.shared.clone();
            let (row, inputs) = d
                .read(move |snap, session| opening_read(snap, session, &shared))
                .await?;
            (row, inputs, None)
        }
    };
    let mut first_inputs = Some(inputs);
    // Drains of one session never overlap, so a claim seen here was left by an execution that
    // is gone: a crash, a shutdown or a dead actor. Recovery comes before anything else, unless
    // the user interrupted it already: then the interrupt wins, and nothing is run again.
    let recovering = row.claim.is_some();
    if recovering && d.cancel.is_cancelled() && d.cancel.reason() == InterruptReason::User {
        return Box::pin(release(d)).await;
    }
    if row.halted.is_some() && !d.forced {
        return Ok(Outcome::Idle);
    }
    if !d.forced && !recovering && row.pending == 0 {
        return Ok(Outcome::Idle);
    }
    // The claim is taken in the drain's first write, together with whatever that write does
    // (instructions, promotion, or the first step's start and, when the stream is quick, its
    // whole settlement). Recovery takes it first, with the attempt it counts.
    d.shared.metrics.drains.inc();
    // Recovery writes before any step: its drain keeps no snapshot.
    let mut opening = None;
    let mut course = match recovering {
        false => {
            opening = snap.map(|snap| Opening { snap, row });
            Course::new(true, d.forced, 1)
        }
        true => match Box::pin(recover(d, &row, steering(&first_inputs))).await? {
            Recovered::GaveUp(reason) => {
                return Err(Error::Halted {
                    session: d.session.clone(),
                    reason,
                });
            }
            Recovered::Owes {
                next_step,
                boundary,
            } => Course::recovered(next_step, boundary),
            Recovered::Answered => Course::new(false, d.forced, 1),
            Recovered::Waiting(expires_at) => return Ok(Outcome::Waiting { expires_at }),
            Recovered::Interrupted => return Ok(Outcome::Interrupted),
        },
    };

    // The admitted seqs of the last promotion that rode with a step (see below).
    let mut promised = Vec::new();
    loop {
        let boundary = match course.at_boundary(d.cancel.is_cancelled()) {
            // Before the first write nothing is recorded: the input stays pending.
            AtBoundary::Stop { record: false } => return Ok(Outcome::Interrupted),
            AtBoundary::Stop { record: true } => return interrupted(d).await,
            AtBoundary::Promote(boundary) => boundary,
        };
        // A snapshot read decides whether promotion can find anything: an empty promotion would
        // still cost a commit. With nothing in flight the snapshot is complete and the drain
        // chooses the inputs itself; otherwise it may predate the drain's own promotion, whose
        // inputs do not count, and the writer chooses.
        let deferrable = d.nothing_submitted();
        let first = first_inputs.take();
        let mut opened_with = opening.take();
        let (inputs, pending) = if deferrable {
            let inputs = match first {
                Some(inputs) => inputs,
                None => d.read(|snap, session| Ok(snap.pending(session)?)).await?,
            };
            let pending = !inputs.is_empty();
            (inputs, pending)
        } else if course.settles_unless_promoted() {
            // Only new input would give this drain a step, and the settlement looks for it
            // itself: `SucceedIfIdle` does not succeed over pending input, and the loop goes
            // round to promote it. A read here would cost every turn to save a rare one a write.
            (Vec::new(), false)
        } else {
            let seqs = d
                .read(|snap, session| Ok(snap.pending_seqs(session)?))
                .await?;
            (Vec::new(), seqs.iter().any(|seq| !promised.contains(seq)))
        };
        let opened = course
            .take_opening()
            .then_some(Event::ExecutionStarted { forced: d.forced });
        let mut update = None;
        if course.samples_instructions(pending) {
            // Instructions are sampled here, before promotion, so a change lands in history
            // ahead of the input it applies to.
            match instructions_update(d).await {
                Ok(changed) => update = changed,
                Err(error) => {
                    // Recorded with the claim it takes: the input stays pending.
                    let failed = Event::ExecutionFailed {
                        error: error.to_string(),
                        halted: false,
                    };
                    d.append(opened.into_iter().chain([failed]).collect())
                        .await?;
                    return Err(error);
                }
            }
        }
        if d.cancel.is_cancelled() {
            // Cancelled while the instruction sources were read (they may block): stop as at the
            // boundary, before promoting or calling anything.
            return match opened {
                Some(_) => Ok(Outcome::Interrupted),
                None => interrupted(d).await,
            };
        }
        let selected = promotion::select(&inputs, boundary);
        let mut ahead = Vec::new();
        let promoted = if update.is_none() && !selected.is_empty() {
            // The promotion rides with the step's first write instead of a commit of its own:
            // the step is built from the snapshot plus the inputs promoted here (promote, then
            // prepare). Until that write is durable nothing is promoted, so a crash leaves the
            // input pending for recovery, and the writer refuses a promotion of an input that is
            // no longer pending.
            let promoted = selected
                .iter()
                .map(|id| Event::PromptPromoted { id: id.clone() });
            d.submit(opened.into_iter().chain(promoted).collect());
            ahead = inputs
                .into_iter()
                .filter(|input| selected.contains(&input.id))
                .collect::<Vec<_>>();
            promised = ahead.iter().map(|input| input.admitted_seq).collect();
            true
        } else {
            // A write comes first, or nothing is promoted: the step reads a fresh snapshot.
            opened_with = None;
            let mut actions: Vec<Action> = opened
                .into_iter()
                .chain(update)
                .map(Action::Append)
                .collect();
            if pending {
                actions.push(Action::Promote(boundary));
            }
            let written = match actions.is_empty() {
                true => Vec::new(),
                false => d.write(actions).await?,
            };
            written
                .iter()
                .any(|e| matches!(e.event, Event::PromptPromoted { .. }))
        };
        let step = match course.promoted(promoted) {
            AfterPromotion::Step(step) => step,
            AfterPromotion::Settle => {
                // Settles in the same commit as the step's last writes, unless input arrived
                // since the snapshot above: then the loop goes round again and promotes it.
                let settled = d.write(vec![Action::SucceedIfIdle]).await?;
                let succeeded = settled
                    .iter()
                    .any(|e| matches!(e.event, Event::ExecutionSucceeded));
                match course.settled(succeeded) {
                    Some(outcome) => return Ok(outcome),
                    None => continue,
                }
            }
        };
        // Boxed: the step's state is held only while a step runs, not by every drain waiting on
        // a write.
        let mut waiting = None;
        let mut exceeded = None;
        let (end, failure) = match Box::pin(step::run(d, step, ahead, opened_with)).await? {
            StepEnd::Done { continuation } => (Stepped::Done { continuation }, None),
            StepEnd::Waiting { expires_at } => {
                waiting = Some(expires_at);
                (Stepped::Waiting, None)
            }
            StepEnd::Blocked(e) => {
                exceeded = Some(e);
                (Stepped::Blocked, None)
            }
            StepEnd::Interrupted => (Stepped::Interrupted, None),
            StepEnd::Failed(error) => (Stepped::Failed, Some(error)),
        };
        match (course.stepped(end), failure) {
            (AfterStep::Continue, _) => {}
            (AfterStep::Stop, _) => return interrupted(d).await,
            (AfterStep::Wait, _) => {
                // The claim stays with the exchange; the approvals are durable before the
                // drain reports that it waits.
                d.flush().await?;
                let expires_at = waiting.expect("invariant: only a waiting step waits");
                return Ok(Outcome::Waiting { expires_at });
            }
            (AfterStep::Block, _) => {
                let e = exceeded.expect("invariant: only a blocked step blocks");
                return blocked(d, e).await;
            }
            // The step wrote its `StepFailed` with the drain's `ExecutionFailed`, in one commit,
            // so a failed step under a held claim always means a retry or a continuation was
            // still to come.
            (AfterStep::Fail, failure) => {
                return Err(failure.expect("invariant: only a failed step fails the course"));
            }
        }
    }
}

/// Records that the budget blocks the exchange (with whatever the drain submitted before, its
/// claim included) and ends the drain: the claim and the input stay with the exchange.
async fn blocked(d: &Drain, e: agenthost_model::budget::Exceeded) -> Result<Outcome> {
    tracing::info!(session_id = %d.session, limit = e.which.as_str(), spent = e.spent, cap = e.limit, "the budget blocks the session");
    d.append(vec![Event::BudgetExhausted {
        which: e.which,
        spent: e.spent,
        limit: e.limit,
    }])
    .await?;
    Ok(Outcome::Blocked(e.which))
}

/// Whether steering input is among the pending inputs a drain read at its start.
fn steering(inputs: &Option<Vec<agenthost_model::InboxRow>>) -> bool {
    inputs.as_ref().is_some_and(|inputs| {
        inputs
            .iter()
            .any(|input| input.delivery == agenthost_model::Delivery::Steer)
    })
}

/// Resolves instruction sources read-only and returns the chronological system update to
/// commit if they changed. Fails, writing nothing, when a source has never had a value.
async fn instructions_update(d: &Drain) -> Result<Option<Event>> {
    if d.shared.instructions.is_empty() && d.shared.hooks.is_empty() {
        return Ok(None);
    }
    let shared = d.shared.clone();
    let session = d.session.clone();
    let (resolved, told) = tokio::task::spawn_blocking(move || -> Result<_> {
        let resolved = instructions::resolve(&shared.instructions, &shared.hooks, &session);
        let told = shared.store.snapshot()?.instructions(&session)?;
        Ok((resolved, told))
    })
    .await
    .map_err(|e| Error::Panicked(e.to_string()))??;
    match instructions::diff(&resolved, &told) {
        Ok(None) => Ok(None),
        Ok(Some(change)) => Ok(Some(Event::InstructionsUpdated {
            id: mint::message_id(),
            changed: change.changed,
            text: change.text,
        })),
        Err(source) => Err(Error::Unavailable(format!(
            "instruction source {source:?} has no value yet; the input stays pending"
        ))),
    }
}

/// Ends what a stopped execution left under its claim as a user interrupt of it would have
/// (`owed::interrupt`: running tools failed, open steps aborted, running compactions failed,
/// the claim released), running nothing. `Interrupted` when there was a claim to release, else
/// `Idle` with nothing written. An interrupt therefore wins however it races a restart: it
/// reaches a session whose execution is gone before recovery runs it again.
pub(crate) async fn release(d: &Drain) -> Result<Outcome> {
    let claimed = d
        .read(|snap, session| {
            let row = snap
                .session(session)?
                .ok_or_else(|| Error::SessionNotFound(session.clone()))?;
            if row.claim.is_none() {
                return Ok(None);
            }
            let from = agenthost_model::history::load_from(&row);
            let messages = snap.messages(session, from, usize::MAX)?;
            Ok(Some((row, messages)))
        })
        .await?;
    let Some((row, messages)) = claimed else {
        return Ok(Outcome::Idle);
    };
    let left = agenthost_model::owed::leftovers(&messages);
    tracing::info!(session_id = %d.session, claim = ?row.claim, "interrupted before recovery ran it: ending the cut turn");
    d.append(agenthost_model::owed::interrupt(&left)).await?;
    Ok(Outcome::Interrupted)
}

/// Records the end of an interrupted drain. A user interrupt releases the claim; a shutdown keeps
/// it so recovery resumes the session.
async fn interrupted(d: &Drain) -> Result<Outcome> {
    let reason = d.cancel.reason();
    d.append(vec![Event::ExecutionInterrupted { reason }])
        .await?;
    Ok(Outcome::Interrupted)
}
