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

use std::sync::{Arc, Mutex};

use agenthost_model::owed::{self, Owed, Policy, Why};
use agenthost_model::promotion::{self, Boundary};
use agenthost_model::{Event, InterruptReason, Message, MessageId, SessionId, Stored};
use agenthost_store::Action;
use tokio_util::sync::CancellationToken;

use crate::bus::Hold;
use crate::error::{Error, Result};
use crate::history_cache::HistoryCache;
use crate::instructions;
use crate::runtime::Shared;
use crate::step::{self, StepEnd};

/// How a drain ended, delivered to every caller that joined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was owed; nothing was written.
    Idle,
    /// Ran `steps` steps and settled.
    Completed { steps: u32 },
    /// Stopped by `interrupt` (or shutdown) after durable cleanup.
    Interrupted,
    /// A manual compaction finished; history before `kept_from` is now summarized.
    Compacted { kept_from: agenthost_model::Seq },
}

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
    /// A manual compaction instead of the agent loop.
    pub compact: bool,
    pub cancel: Cancel,
    /// Writes submitted and not yet confirmed durable.
    pub in_flight: Arc<Mutex<Submitted>>,
    /// The session actor's history cache; none for a drain outside an actor.
    pub history: Option<Arc<Mutex<HistoryCache>>>,
}

/// What a drain submitted and has not yet waited for.
#[derive(Default)]
pub(crate) struct Submitted {
    /// Events submitted and not yet sent to the store, in order (see [`Drain::send`]).
    unsent: Vec<Event>,
    /// Writes sent, in order.
    writes: Vec<InFlight>,
    /// Deltas held on the bus until a submitted `StepStarted` is published: released by the
    /// next flush, once that write has either committed (and been published) or failed.
    holds: Vec<Hold>,
    /// Whether the events this drain wrote leave the claim held: set by `ExecutionStarted`,
    /// cleared by an event that releases it. A drain that fails with the claim held writes
    /// `ExecutionFailed` (see [`run`]).
    holds_claim: bool,
}

impl Submitted {
    fn note(&mut self, events: &[Event]) {
        for event in events {
            match event {
                Event::ExecutionStarted { .. } => self.holds_claim = true,
                Event::ExecutionSucceeded
                | Event::ExecutionFailed { .. }
                | Event::ExecutionInterrupted {
                    reason: InterruptReason::User,
                } => self.holds_claim = false,
                _ => {}
            }
        }
    }
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("session", &self.session)
            .field("forced", &self.forced)
            .field("compact", &self.compact)
            .finish_non_exhaustive()
    }
}

/// A write submitted to the store, not yet awaited.
pub(crate) type InFlight =
    futures::future::BoxFuture<'static, agenthost_store::Result<Vec<agenthost_model::Stored>>>;

impl Drain {
    /// Appends and waits until these events, and every event submitted before them, are
    /// durable.
    pub(crate) async fn append(&self, events: Vec<Event>) -> Result<()> {
        self.submit(events);
        self.flush().await
    }

    /// Runs `actions` in one transaction after everything submitted before, waits until all of
    /// it is durable, and returns the events the actions wrote. Events submitted and not sent
    /// yet ride in the same transaction, ahead of the actions.
    pub(crate) async fn write(&self, actions: Vec<Action>) -> Result<Vec<Stored>> {
        let (unsent, writes, holds) = {
            let mut submitted = self.submitted();
            let unsent = std::mem::take(&mut submitted.unsent);
            let writes = std::mem::take(&mut submitted.writes);
            let holds = std::mem::take(&mut submitted.holds);
            (unsent, writes, holds)
        };
        let ahead = unsent.len();
        let all: Vec<Action> = unsent
            .into_iter()
            .map(Action::Append)
            .chain(actions)
            .collect();
        let write = self.shared.store.write(self.session.clone(), all);
        let earlier = wait(writes).await;
        let written = write.await;
        // Held deltas go out only once the write that may carry their `StepStarted` is done.
        drop(holds);
        earlier?;
        let mut written = written?;
        // Each append wrote exactly its one event.
        written.drain(..ahead);
        let events: Vec<Event> = written.iter().map(|e| e.event.clone()).collect();
        self.submitted().note(&events);
        Ok(written)
    }

    /// Submits events without waiting for them. They go to the store with the next
    /// [`Drain::send`], which the step calls whenever it is about to wait for the provider, and
    /// with every write and flush, so an event is on its way as soon as the drain would
    /// otherwise sit idle, and the events of a burst (a part's end, the step's end, the drain's
    /// settlement) share one operation. Used for events nothing waits on before the step's next
    /// durable boundary (the step's start, parts that ended, the step's end).
    pub(crate) fn submit(&self, events: Vec<Event>) {
        let mut submitted = self.submitted();
        submitted.note(&events);
        submitted.unsent.extend(events);
    }

    /// Whether this drain's writes leave the session claimed.
    fn holds_claim(&self) -> bool {
        self.submitted().holds_claim
    }

    /// Sends the events submitted so far to the store as one operation, without waiting.
    pub(crate) fn send(&self) {
        let mut submitted = self.submitted();
        if submitted.unsent.is_empty() {
            return;
        }
        let events = std::mem::take(&mut submitted.unsent);
        let write = self.shared.store.append(self.session.clone(), events);
        submitted.writes.push(write);
    }

    /// Keeps `hold` until every write submitted so far has been waited for.
    pub(crate) fn keep(&self, hold: Hold) {
        self.submitted().holds.push(hold);
    }

    /// Whether everything the drain submitted is durable (or failed and was reported).
    pub(crate) fn nothing_submitted(&self) -> bool {
        let submitted = self.submitted();
        submitted.unsent.is_empty() && submitted.writes.is_empty()
    }

    fn submitted(&self) -> std::sync::MutexGuard<'_, Submitted> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends what is unsent and waits for every submitted write; the first failure is returned.
    pub(crate) async fn flush(&self) -> Result<()> {
        self.send();
        let (writes, holds) = {
            let mut submitted = self.submitted();
            let writes = std::mem::take(&mut submitted.writes);
            let holds = std::mem::take(&mut submitted.holds);
            (writes, holds)
        };
        let result = wait(writes).await;
        drop(holds);
        result
    }
}

/// Waits for every write; the first failure is returned.
async fn wait(writes: Vec<InFlight>) -> Result<()> {
    let mut result = Ok(());
    for write in writes {
        if let Err(e) = write.await
            && result.is_ok()
        {
            result = Err(e.into());
        }
    }
    result
}

/// Runs the drain. Every drain that took the claim ends with a durable terminal event: a drain
/// that fails with the claim still held (a configuration problem, a storage error, a failed
/// step) records `ExecutionFailed` with the reason, so the session never stays claimed while
/// idle. Shutdown and a panic are the exceptions: they keep the claim on purpose, for recovery.
pub(crate) async fn run(d: Drain) -> Result<Outcome> {
    let result = match d.compact {
        true => crate::compaction::compact(&d, false)
            .await
            .map(|kept_from| Outcome::Compacted { kept_from }),
        false => agent_loop(&d).await,
    };
    match result {
        // A panic is the supervisor's to handle: the restarted actor recovers the claim.
        Err(error)
            if d.holds_claim() && !matches!(error, Error::ShuttingDown | Error::Panicked(_)) =>
        {
            let failed = Event::ExecutionFailed {
                error: error.to_string(),
                halted: false,
            };
            if let Err(e) = d.append(vec![failed]).await {
                tracing::error!(session_id = %d.session, error = %e, "could not record the drain's failure");
            }
            Err(error)
        }
        other => other,
    }
}

async fn agent_loop(d: &Drain) -> Result<Outcome> {
    // The row and the pending inputs from one snapshot; the inputs serve the first boundary.
    let (row, mut first_inputs) = {
        let snap = d.shared.store.snapshot()?;
        let row = snap
            .session(&d.session)?
            .ok_or_else(|| Error::SessionNotFound(d.session.clone()))?;
        let inputs = match row.pending {
            0 => Vec::new(),
            _ => snap.pending(&d.session)?,
        };
        (row, Some(inputs))
    };
    // Drains of one session never overlap, so a claim seen here was left by an execution that
    // is gone: a crash, a shutdown or a dead actor. Recovery comes before anything else.
    let recovering = row.claim.is_some();
    if row.halted.is_some() && !d.forced {
        return Ok(Outcome::Idle);
    }
    if !d.forced && !recovering && row.pending == 0 {
        return Ok(Outcome::Idle);
    }
    // The claim is taken in the drain's first write, together with whatever that write does
    // (instructions, promotion, or the first step's start and, when the stream is quick, its
    // whole settlement). Recovery takes it first, with the attempt it counts.
    let mut opening = Some(Event::ExecutionStarted { forced: d.forced });
    d.shared
        .metrics
        .drains
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut owed = d.forced;
    let mut step = 1;
    if recovering {
        opening = None;
        match recover(d, &row).await? {
            Recovered::GaveUp(reason) => {
                return Err(Error::Halted {
                    session: d.session.clone(),
                    reason,
                });
            }
            Recovered::Owes { next_step } => {
                owed = true;
                step = next_step;
            }
            Recovered::Answered => {}
        }
    }

    let mut continuation = false;
    // The admitted seqs of the last promotion that rode with a step (see below).
    let mut promised = Vec::new();
    let mut steps_run = 0;
    loop {
        if d.cancel.is_cancelled() {
            return match opening {
                // Nothing written yet: the input stays pending for the next wake.
                Some(_) => Ok(Outcome::Interrupted),
                None => interrupted(d).await,
            };
        }
        let boundary = if continuation {
            Boundary::Continuation
        } else {
            Boundary::Idle
        };
        // A snapshot read decides whether promotion can find anything: an empty promotion would
        // still cost a commit. With nothing in flight the snapshot is complete and the drain
        // chooses the inputs itself; otherwise it may predate the drain's own promotion, whose
        // inputs do not count, and the writer chooses.
        let deferrable = d.nothing_submitted();
        let first = first_inputs.take();
        let (inputs, pending) = if deferrable {
            let inputs = match first {
                Some(inputs) => inputs,
                None => d.shared.store.snapshot()?.pending(&d.session)?,
            };
            let pending = !inputs.is_empty();
            (inputs, pending)
        } else {
            let seqs = d.shared.store.snapshot()?.pending_seqs(&d.session)?;
            (Vec::new(), seqs.iter().any(|seq| !promised.contains(seq)))
        };
        let opened = opening.take();
        let mut update = None;
        if owed || continuation || pending {
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
        let selected = promotion::select(&inputs, boundary);
        let mut ahead = Vec::new();
        if update.is_none() && !selected.is_empty() {
            // The promotion rides with the step's first write instead of a commit of its own:
            // the step is built from the snapshot plus the inputs promoted here (the loop's order:
            // promote, then prepare). Until that write is durable nothing is promoted, so a
            // crash leaves the input pending for recovery, and the writer refuses a promotion
            // of an input that is no longer pending.
            let promoted = selected
                .iter()
                .map(|id| Event::PromptPromoted { id: id.clone() });
            d.submit(opened.into_iter().chain(promoted).collect());
            ahead = inputs
                .into_iter()
                .filter(|input| selected.contains(&input.id))
                .collect::<Vec<_>>();
            promised = ahead.iter().map(|input| input.admitted_seq).collect();
            step = 1;
            owed = true;
        } else {
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
            if written
                .iter()
                .any(|e| matches!(e.event, Event::PromptPromoted { .. }))
            {
                step = 1;
                owed = true;
            }
        }
        if !owed && !continuation {
            // Settles in the same commit as the step's last writes, unless input arrived since
            // the snapshot above: then the loop goes round again and promotes it.
            let settled = d.write(vec![Action::SucceedIfIdle]).await?;
            if settled
                .iter()
                .any(|e| matches!(e.event, Event::ExecutionSucceeded))
            {
                return Ok(Outcome::Completed { steps: steps_run });
            }
            continue;
        }
        owed = false;
        match step::run(d, step, ahead).await? {
            StepEnd::Done { continuation: next } => {
                continuation = next;
                steps_run += 1;
                step += 1;
            }
            StepEnd::Interrupted => return interrupted(d).await,
            // The step's `StepFailed` is submitted, not written: `run` writes it with the
            // drain's `ExecutionFailed`, in one commit, so a failed step under a held claim
            // always means a retry or a continuation was still to come.
            StepEnd::Failed(error) => return Err(error),
        }
    }
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
            id: mint_message_id(),
            changed: change.changed,
            text: change.text,
        })),
        Err(source) => Err(Error::Unavailable(format!(
            "instruction source {source:?} has no value yet; the input stays pending"
        ))),
    }
}

/// Records the end of an interrupted drain. A user interrupt releases the claim; a shutdown keeps
/// it so recovery resumes the session.
async fn interrupted(d: &Drain) -> Result<Outcome> {
    let reason = d.cancel.reason();
    d.append(vec![Event::ExecutionInterrupted { reason }])
        .await?;
    Ok(Outcome::Interrupted)
}

/// The "may or may not have taken effect" result of a tool a stopped process was running.
pub const STOPPED_TOOL: &str = "the process stopped while this tool ran; it may or may not have \
     taken effect. Check before repeating it.";

/// What recovery found.
enum Recovered {
    /// Too many recoveries in a row without progress: the session is failed and halted.
    GaveUp(String),
    /// A model call is owed; the drain runs `next_step` next.
    Owes { next_step: u32 },
    /// Nothing is owed: the drain settles.
    Answered,
}

/// Recovers a session whose claim an execution that is gone left (ARCHITECTURE.md, "Recovery:
/// what a session owes"). It runs inside the session's own drain, so nothing else of the
/// session runs meanwhile. It counts the attempt durably with the claim it takes over, then
/// asks [`agenthost_model::owed`] what the session owes: past the attempt limit, everything
/// left open is failed without running anything and the session is halted, in one commit;
/// otherwise the leftovers are settled (an idempotent tool runs again with the same key, any
/// other is failed as stopped), and when a model call is owed, one note tells the model the
/// server restarted.
async fn recover(d: &Drain, row: &agenthost_model::SessionRow) -> Result<Recovered> {
    // Every message from where the active history loads, compactions included (the history the
    // model sees leaves them out).
    let from = agenthost_model::history::load_from(row);
    let messages = d
        .shared
        .store
        .snapshot()?
        .messages(&d.session, from, usize::MAX)?;
    let policy = policy(d, row);
    let attempt = row.resume_attempts + 1;
    let left = owed::leftovers(&messages);
    let decision = owed::owed(row, &messages, &policy);
    tracing::info!(session_id = %d.session, attempt, ?decision, "recovering");
    d.shared
        .metrics
        .recovered
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Owed::Fail(reason) = decision {
        let mut events = vec![Event::RecoveryAttempted { attempt }];
        events.extend(owed::close(&left, STOPPED_TOOL));
        events.push(Event::ExecutionFailed {
            error: reason.clone(),
            halted: true,
        });
        d.append(events).await?;
        return Ok(Recovered::GaveUp(reason));
    }
    d.append(vec![
        Event::ExecutionStarted { forced: d.forced },
        Event::RecoveryAttempted { attempt },
    ])
    .await?;
    for (message, tool) in &left.tools {
        step::settle_orphaned_tool(d, message, tool).await?;
    }
    let mut closing: Vec<Event> = left
        .steps
        .iter()
        .map(|id| Event::StepFailed {
            id: id.clone(),
            error: owed::restarted(),
        })
        .collect();
    closing.extend(owed::close_compactions(&left));
    let Owed::Call(why) = decision else {
        if !closing.is_empty() {
            d.append(closing).await?;
        }
        return Ok(Recovered::Answered);
    };
    closing.push(Event::InstructionsUpdated {
        id: mint_message_id(),
        changed: Vec::new(),
        text: crate::recovery::RESTART_NOTE.into(),
    });
    d.append(closing).await?;
    // The step a stop cut is run again under its number; tool results continue to the next.
    let last = messages.iter().rev().find_map(|m| match m {
        Message::Assistant(a) => Some(a.step),
        _ => None,
    });
    let next_step = match (why, last) {
        (Why::ToolResults, Some(step)) => step + 1,
        (Why::CutStep | Why::PendingRetry | Why::Compaction, Some(step)) => step,
        _ => 1,
    };
    Ok(Recovered::Owes { next_step })
}

/// The limits [`agenthost_model::owed`] applies to this session.
pub(crate) fn policy(d: &Drain, row: &agenthost_model::SessionRow) -> Policy {
    policy_of(&d.shared, row)
}

pub(crate) fn policy_of(shared: &Shared, row: &agenthost_model::SessionRow) -> Policy {
    Policy {
        // An agent no longer configured owes a call: the step then fails with the reason.
        max_steps: shared
            .catalog
            .agents
            .get(&row.agent)
            .map_or(u32::MAX, |a| a.steps),
        max_attempts: shared.recovery.max_attempts,
    }
}

/// Mints a message id from the system clock and fresh entropy.
pub(crate) fn mint_message_id() -> MessageId {
    MessageId::mint(agenthost_store::system_clock(), rand::random())
}
