//! The registry (SPEC §8): routes messages to session actors, spawns them on demand, supervises
//! them, and forgets them when they passivate.
//!
//! Routing to a live actor never touches this actor's mailbox: the runtime looks the session up
//! in a shared concurrent map first and only asks the registry when no live actor is there.
//! The registry keeps its own table; ractor's global named registry is never used.
//!
//! Supervision: session actors are spawned linked to the registry. ractor restarts nothing by
//! itself, so when one fails the registry applies the restart policy: up to `max_restarts`
//! restarts within `window`, each after an exponential backoff; one more and the session is
//! durably marked failed (`ExecutionFailed { halted: true }`) and left alone until an explicit
//! resume.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use agenthost_model::{Event, SessionId};
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::runtime::Shared;
use crate::session::{self, SessionActor, Start};

#[derive(Debug)]
pub(crate) enum Msg {
    /// The live actor of a session, spawned if the session exists; `None` for an unknown one.
    /// The flag says the caller knows the session exists (it has just admitted input to it), so
    /// spawning skips the store lookup: the registry spawns one actor at a time, and a lookup
    /// for each of a thousand sessions woken at once made the last ones wait.
    Get(
        SessionId,
        bool,
        RpcReplyPort<Result<Option<ActorRef<session::Msg>>>>,
    ),
    /// Restart a failed session actor (after its backoff).
    Restart(SessionId),
}

#[derive(Debug)]
pub(crate) struct Registry;

pub(crate) struct State {
    shared: Arc<Shared>,
    /// Which session each live actor serves, to interpret supervision events.
    by_actor: HashMap<ActorId, SessionId>,
    /// Recent restart times per session, for the intensity limit.
    restarts: HashMap<SessionId, VecDeque<Instant>>,
}

impl Registry {
    async fn spawn(
        myself: &ActorRef<Msg>,
        state: &mut State,
        session: SessionId,
        start: Start,
    ) -> Result<ActorRef<session::Msg>> {
        let args = (session.clone(), state.shared.clone(), start);
        let (actor, _handle) = Actor::spawn_linked(None, SessionActor, args, myself.get_cell())
            .await
            .map_err(|e| Error::Unavailable(format!("cannot start session actor: {e}")))?;
        state.by_actor.insert(actor.get_id(), session.clone());
        state.shared.actors.insert(session, actor.clone());
        Ok(actor)
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
            .shared
            .actors
            .remove_if(&session, |_, a| a.get_id() == cell.get_id());
        if state.shared.is_shutting_down() {
            return;
        }
        let policy = state.shared.supervision.clone();
        let now = Instant::now();
        let recent = state.restarts.entry(session.clone()).or_default();
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            recent.pop_front();
        }
        if recent.len() >= policy.max_restarts {
            state.restarts.remove(&session);
            tracing::error!(session_id = %session, %reason, "restart limit reached; session halted");
            let event = Event::ExecutionFailed {
                error: format!("the session actor failed too often ({reason}); resume to retry"),
                halted: true,
            };
            if let Err(e) = state
                .shared
                .store
                .append(session.clone(), vec![event])
                .await
            {
                tracing::error!(session_id = %session, error = %e, "could not record the halt");
            }
            return;
        }
        let backoff = policy.backoff * 2u32.saturating_pow(recent.len() as u32);
        recent.push_back(now);
        state
            .shared
            .metrics
            .restarts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(session_id = %session, %reason, ?backoff, "session actor failed; restarting");
        // The timer task only sends a message; if the registry is gone by then, it is a no-op.
        drop(myself.send_after(backoff, move || Msg::Restart(session)));
    }
}

impl Actor for Registry {
    type Msg = Msg;
    type State = State;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Msg>,
        shared: Arc<Shared>,
    ) -> Result<State, ActorProcessingErr> {
        Ok(State {
            shared,
            by_actor: HashMap::new(),
            restarts: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Msg>,
        msg: Msg,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Msg::Get(session, known, reply) => {
                let live = state.shared.actors.get(&session).map(|a| a.clone());
                let result = match live {
                    Some(actor) => Ok(Some(actor)),
                    None if state.shared.is_shutting_down() => Err(Error::ShuttingDown),
                    None if known => Registry::spawn(&myself, state, session, Start::Fresh)
                        .await
                        .map(Some),
                    None => match session_exists(&state.shared, &session).await {
                        Ok(true) => Registry::spawn(&myself, state, session, Start::Fresh)
                            .await
                            .map(Some),
                        Ok(false) => Ok(None),
                        Err(e) => Err(e),
                    },
                };
                let _ = reply.send(result);
            }
            Msg::Restart(session) => {
                if state.shared.actors.contains_key(&session) || state.shared.is_shutting_down() {
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
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                // A clean stop (passivation, shutdown): forget it.
                if let Some(session) = state.by_actor.remove(&cell.get_id()) {
                    state
                        .shared
                        .actors
                        .remove_if(&session, |_, a| a.get_id() == cell.get_id());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A store read, so it runs on the blocking pool rather than in the registry's handler thread.
async fn session_exists(shared: &Arc<Shared>, session: &SessionId) -> Result<bool> {
    let (shared, session) = (shared.clone(), session.clone());
    tokio::task::spawn_blocking(move || Ok(shared.store.snapshot()?.session(&session)?.is_some()))
        .await
        .map_err(|e| Error::Unavailable(format!("session lookup failed: {e}")))?
}
