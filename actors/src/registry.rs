//! The registry: routes messages to session actors, spawns them on demand, supervises
//! them, and forgets them when they passivate.
//!
//! Routing to a live actor never touches this actor's mailbox: the runtime looks the session up
//! in a shared concurrent map first and only asks the registry when no live actor is there.
//! The registry keeps its own table; ractor's global named registry is never used.
//!
//! Live actors are bounded (`limits.live_sessions`, ARCHITECTURE.md "Live sessions"): at the
//! bound a session without an actor waits in line, in arrival order, and the registry asks every
//! idle actor to passivate at once; each actor that stops gives its place to the first in line.
//! A wake waits in line without its caller (the input it announces is durable already); any other
//! request's caller waits for the actor, bounded by its own timeout.
//!
//! Supervision: session actors are spawned linked to the registry. ractor restarts nothing by
//! itself, so when one fails the registry applies the restart policy: up to `max_restarts`
//! restarts within `window`, each after an exponential backoff (a message for the session
//! during the backoff restarts it at once); one more and everything the dead actor left open is
//! failed and the session durably halted (`ExecutionFailed { halted: true }`), left alone until
//! an explicit resume.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use agenthost_model::history;
use agenthost_model::{Event, SessionId, owed};
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;

use crate::drain::settle::STOPPED_TOOL;
use crate::error::{Error, Result};
use crate::session::{self, Actors, SessionActor, Start};
use crate::shared::Shared;

#[derive(Debug)]
pub(crate) enum Msg {
    /// The live actor of a session, spawned if the session exists and there is a place for it.
    Get(SessionId, Ask, RpcReplyPort<Result<Placed>>),
    /// Restart a failed session actor (after its backoff).
    Restart(SessionId),
}

/// What a caller of [`Msg::Get`] wants.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ask {
    /// The caller knows the session exists (it has just admitted input to it), so spawning skips
    /// the store lookup: the registry spawns one actor at a time, and a lookup for each of a
    /// thousand sessions woken at once made the last ones wait.
    pub known: bool,
    /// The caller only wakes the session: if it must wait in line, the registry wakes the actor
    /// itself once it has a place, and the caller goes on at once.
    pub wake: bool,
}

/// A session's actor, or the caller's place in line.
pub(crate) type Placement = Result<Option<ActorRef<session::Msg>>>;

/// The answer to [`Msg::Get`].
#[derive(Debug)]
pub(crate) enum Placed {
    /// The live actor; `None` for an unknown session.
    Now(Option<ActorRef<session::Msg>>),
    /// Every place is taken: the session waits in line. The actor comes on the receiver; a wake
    /// gets none, as the registry wakes the actor itself.
    Later(Option<tokio::sync::oneshot::Receiver<Placement>>),
}

/// A session waiting in line for a place among the live actors.
#[derive(Debug, Default)]
struct Waiting {
    known: bool,
    wake: bool,
    callers: Vec<tokio::sync::oneshot::Sender<Placement>>,
}

#[derive(Debug)]
pub(crate) struct Registry;

/// Recent restarts per session, for the intensity limit. Holds only sessions restarted within the
/// window: every failure first forgets the restarts older than it, of every session, so the map
/// never grows with the sessions that ever failed.
#[derive(Debug, Default)]
struct Intensity(HashMap<SessionId, VecDeque<Instant>>);

impl Intensity {
    /// Counts a failure of `session` at `now`: the number of its restarts within the window
    /// before this one (this one is then recorded), or `None` past `max_restarts`, when the
    /// session is halted and forgotten.
    fn failed(
        &mut self,
        session: &SessionId,
        now: Instant,
        policy: &crate::config::Supervision,
    ) -> Option<usize> {
        self.0.retain(|_, recent| {
            while recent
                .front()
                .is_some_and(|t| now.duration_since(*t) > policy.window)
            {
                recent.pop_front();
            }
            !recent.is_empty()
        });
        let recent = self.0.entry(session.clone()).or_default();
        if recent.len() >= policy.max_restarts {
            self.0.remove(session);
            return None;
        }
        let earlier = recent.len();
        recent.push_back(now);
        Some(earlier)
    }
}

pub(crate) struct State {
    shared: Arc<Shared>,
    actors: Arc<Actors>,
    /// Which session each live actor serves, to interpret supervision events.
    by_actor: HashMap<ActorId, SessionId>,
    /// Recent restarts per session, for the intensity limit.
    restarts: Intensity,
    /// Sessions whose failed actor waits out its restart backoff. A message for one of them
    /// starts the restarted actor at once, which then settles what the dead one left.
    restarting: HashSet<SessionId>,
    /// Sessions waiting for a place among the live actors, in arrival order, each once.
    line: VecDeque<SessionId>,
    waiting: HashMap<SessionId, Waiting>,
}

impl State {
    /// Whether every place for a live actor is taken.
    fn at_bound(&self) -> bool {
        self.by_actor.len() >= self.shared.limits.live_sessions
    }

    /// Whether a session without an actor must wait in line: no place, or others before it.
    fn full(&self) -> bool {
        self.at_bound() || !self.line.is_empty()
    }

    /// Puts the session in line (once, however often it is asked for) and returns what its
    /// caller waits on. The first session in line makes the runtime crowded: every idle actor is
    /// asked to passivate now instead of after its idle time.
    fn queue(
        &mut self,
        session: SessionId,
        ask: Ask,
    ) -> Option<tokio::sync::oneshot::Receiver<Placement>> {
        let waiting = self.waiting.entry(session.clone()).or_insert_with(|| {
            self.line.push_back(session.clone());
            self.shared.parked.insert(session, ());
            Waiting::default()
        });
        waiting.known |= ask.known;
        waiting.wake |= ask.wake;
        let receiver = (!ask.wake).then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            waiting.callers.push(tx);
            rx
        });
        if !self.shared.crowded.swap(true, Ordering::AcqRel) {
            for actor in self.actors.iter() {
                let _ = actor.value().cast(session::Msg::Idle);
            }
        }
        receiver
    }
}

impl Registry {
    async fn spawn(
        myself: &ActorRef<Msg>,
        state: &mut State,
        session: SessionId,
        start: Start,
    ) -> Result<ActorRef<session::Msg>> {
        let args = (
            session.clone(),
            state.shared.clone(),
            state.actors.clone(),
            start,
        );
        let (actor, _handle) = Actor::spawn_linked(None, SessionActor, args, myself.get_cell())
            .await
            .map_err(|e| Error::Unavailable(format!("cannot start session actor: {e}")))?;
        state.by_actor.insert(actor.get_id(), session.clone());
        state.actors.insert(session, actor.clone());
        Ok(actor)
    }

    /// The session's actor, spawned if the session exists (`known` skips the lookup).
    async fn place(
        myself: &ActorRef<Msg>,
        state: &mut State,
        session: SessionId,
        known: bool,
        start: Start,
    ) -> Result<Option<ActorRef<session::Msg>>> {
        if !known && start == Start::Fresh && !session_exists(&state.shared, &session).await? {
            return Ok(None);
        }
        Registry::spawn(myself, state, session, start)
            .await
            .map(Some)
    }

    /// Gives the places that are free to the sessions first in line. Called whenever an actor
    /// stops, so a free place and a waiting session never coexist for longer than that.
    async fn admit(myself: &ActorRef<Msg>, state: &mut State) {
        while !state.at_bound() && !state.shared.is_shutting_down() {
            let Some(session) = state.line.pop_front() else {
                break;
            };
            let Some(waiting) = state.waiting.remove(&session) else {
                continue;
            };
            state.shared.parked.remove(&session);
            // Callers that gave up (their timeout) need no actor; a wake always does.
            if !waiting.wake && waiting.callers.iter().all(|c| c.is_closed()) {
                continue;
            }
            let live = state.actors.get(&session).map(|a| a.clone());
            let placed = match live {
                Some(actor) => Ok(Some(actor)),
                None => {
                    Registry::place(myself, state, session.clone(), waiting.known, Start::Fresh)
                        .await
                }
            };
            if let (Ok(Some(actor)), true) = (&placed, waiting.wake) {
                let (tx, _rx) = ractor::concurrency::oneshot();
                let _ = actor.cast(session::Msg::Wake(tx.into()));
            }
            for caller in waiting.callers {
                let _ = caller.send(placed.clone());
            }
        }
        if state.line.is_empty() && state.shared.crowded.swap(false, Ordering::AcqRel) {
            state.shared.history_budget.drop_parked();
        }
    }

    async fn on_failure(
        &self,
        myself: &ActorRef<Msg>,
        state: &mut State,
        cell: ActorCell,
        reason: String,
    ) {
        let Some(session) = state.by_actor.remove(&cell.get_id()) else {
            return;
        };
        state
            .actors
            .remove_if(&session, |_, a| a.get_id() == cell.get_id());
        if state.shared.is_shutting_down() {
            return;
        }
        let policy = state.shared.supervision.clone();
        let Some(earlier) = state.restarts.failed(&session, Instant::now(), &policy) else {
            tracing::error!(session_id = %session, %reason, "restart limit reached; session halted");
            // Awaited in the handler on purpose: a message for this session waits until the
            // halt is durable, so no new actor can start on what the halt is closing.
            if let Err(e) = halt(&state.shared, &session, &reason).await {
                tracing::error!(session_id = %session, error = %e, "could not record the halt");
            }
            return;
        };
        state.restarting.insert(session.clone());
        let backoff = policy.backoff * 2u32.saturating_pow(earlier as u32);
        state.shared.metrics.restarts.inc();
        tracing::warn!(session_id = %session, %reason, ?backoff, "session actor failed; restarting");
        // The timer task only sends a message; if the registry is gone by then, it is a no-op.
        drop(myself.send_after(backoff, move || Msg::Restart(session)));
    }
}

impl Actor for Registry {
    type Msg = Msg;
    type State = State;
    type Arguments = (Arc<Shared>, Arc<Actors>);

    async fn pre_start(
        &self,
        _myself: ActorRef<Msg>,
        (shared, actors): (Arc<Shared>, Arc<Actors>),
    ) -> Result<State, ActorProcessingErr> {
        Ok(State {
            shared,
            actors,
            by_actor: HashMap::new(),
            restarts: Intensity::default(),
            restarting: HashSet::new(),
            line: VecDeque::new(),
            waiting: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Msg>,
        msg: Msg,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Msg::Get(session, ask, reply) => {
                let live = state.actors.get(&session).map(|a| a.clone());
                let start = match state.restarting.remove(&session) {
                    true => Start::Restarted,
                    false => Start::Fresh,
                };
                let result = match live {
                    Some(actor) => Ok(Placed::Now(Some(actor))),
                    None if state.shared.is_shutting_down() => Err(Error::ShuttingDown),
                    // A restart takes a place even at the bound: it settles what a failed actor
                    // left, and that actor's place is free already.
                    None if start == Start::Fresh && state.full() => {
                        Ok(Placed::Later(state.queue(session, ask)))
                    }
                    None => Registry::place(&myself, state, session, ask.known, start)
                        .await
                        .map(Placed::Now),
                };
                let _ = reply.send(result);
            }
            Msg::Restart(session) => {
                // Already restarted early, for a message that came during the backoff.
                if !state.restarting.remove(&session) || state.shared.is_shutting_down() {
                    return Ok(());
                }
                // A caller may have reached the registry before it learnt of the failure and got
                // a fresh actor: never start a second one; wake that one instead, so it recovers
                // what the dead actor left.
                let live = state.actors.get(&session).map(|a| a.clone());
                if let Some(actor) = live {
                    let (tx, _rx) = ractor::concurrency::oneshot();
                    let _ = actor.cast(session::Msg::Wake(tx.into()));
                    return Ok(());
                }
                if let Err(e) =
                    Registry::spawn(&myself, state, session.clone(), Start::Restarted).await
                {
                    tracing::error!(session_id = %session, error = %e, "restart failed");
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Msg>,
        event: SupervisionEvent,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                self.on_failure(&myself, state, cell, error.to_string())
                    .await;
                Registry::admit(&myself, state).await;
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                // A clean stop (passivation, shutdown): forget it.
                if let Some(session) = state.by_actor.remove(&cell.get_id()) {
                    state
                        .actors
                        .remove_if(&session, |_, a| a.get_id() == cell.get_id());
                }
                Registry::admit(&myself, state).await;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Halts a session whose actor failed too often: everything its dead actor left open (tools,
/// the step, a compaction) is failed without running anything, and the claim is released with
/// `ExecutionFailed { halted: true }`, in one commit. Nothing resumes it until an explicit
/// resume.
async fn halt(shared: &Arc<Shared>, session: &SessionId, reason: &str) -> Result<()> {
    let (s, id) = (shared.clone(), session.clone());
    let messages = tokio::task::spawn_blocking(move || -> Result<_> {
        let snap = s.store.snapshot()?;
        let Some(row) = snap.session(&id)? else {
            return Ok(None);
        };
        Ok(Some(snap.messages(
            &id,
            history::load_from(&row),
            usize::MAX,
        )?))
    })
    .await
    .map_err(|e| Error::Unavailable(format!("session read failed: {e}")))??;
    let Some(messages) = messages else {
        return Ok(());
    };
    let mut events = owed::close(&owed::leftovers(&messages), STOPPED_TOOL);
    events.push(Event::ExecutionFailed {
        error: format!("the session actor failed too often ({reason}); resume to retry"),
        halted: true,
    });
    shared.store.append(session.clone(), events).await?;
    Ok(())
}

/// A store read, so it runs on the blocking pool rather than in the registry's handler thread.
async fn session_exists(shared: &Arc<Shared>, session: &SessionId) -> Result<bool> {
    let (shared, session) = (shared.clone(), session.clone());
    tokio::task::spawn_blocking(move || Ok(shared.store.snapshot()?.session(&session)?.is_some()))
        .await
        .map_err(|e| Error::Unavailable(format!("session lookup failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Supervision;

    /// The intensity limit counts restarts within the window, halts past it, and forgets every
    /// session whose restarts are older than the window: a long-running server whose sessions
    /// each fail now and then holds none of them.
    #[test]
    fn the_intensity_limit_counts_within_the_window_and_forgets_the_rest() {
        let policy = Supervision {
            max_restarts: 2,
            window: Duration::from_secs(60),
            backoff: Duration::from_millis(100),
        };
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let s = SessionId::parse("ses_flaky").expect("id");
        let mut intensity = Intensity::default();
        assert_eq!(intensity.failed(&s, at(0), &policy), Some(0));
        assert_eq!(intensity.failed(&s, at(1), &policy), Some(1));
        assert_eq!(intensity.failed(&s, at(2), &policy), None, "halted");
        assert_eq!(intensity.failed(&s, at(3), &policy), Some(0), "forgotten");
        // A thousand sessions failing once each, a window apart: only the newest is held.
        for n in 0..1000u64 {
            let other = SessionId::parse(&format!("ses_{n}")).expect("id");
            intensity.failed(&other, at(100 + 61 * n), &policy);
        }
        assert_eq!(intensity.0.len(), 1);
    }
}
