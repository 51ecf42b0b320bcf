//! The session actor: one per live session, owning that session's execution.
//!
//! Its mailbox serializes everything for the session; the drain itself runs in a task the actor
//! owns and reports back with [`Msg::Finished`], so the mailbox stays responsive while a provider
//! streams or tools run.
//!
//! Rules it keeps: at most one drain at a time; wakes during a drain coalesce into one follow-up;
//! a resume joins the running drain (or starts a forced one when idle); every joiner gets the
//! drain's outcome; interrupt clears the follow-up, cancels, and answers after the durable
//! cleanup; wakes and resumes that arrive during that cleanup run after it.

use std::sync::{Arc, Mutex};

use agenthost_model::{InterruptReason, SessionId};
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::bus::{Activity, Live};
use crate::drain::{self, Cancel, Drain, Kind, Outcome};
use crate::error::{Error, Result, panic_message};
use crate::history_cache::HistoryCache;
use crate::shared::Shared;

pub(crate) type Reply<T> = RpcReplyPort<T>;

/// Live session actors by session: the routing fast path. The runtime owns it, the registry adds
/// the actors it spawns, and an actor that passivates removes itself.
pub(crate) type Actors = crate::IdMap<SessionId, ActorRef<Msg>>;

/// Messages of a session actor.
#[derive(Debug)]
pub(crate) enum Msg {
    /// New durable work may exist. Acknowledged on receipt, not on completion.
    Wake(Reply<()>),
    /// Start or join a drain; answered with its outcome.
    Resume(Reply<Result<Outcome>>),
    /// Compact the session's history now; refused while a drain runs.
    Compact(Reply<Result<Outcome>>),
    /// Cancel the drain; answered after its durable cleanup with whether one was running.
    Interrupt(InterruptReason, Reply<bool>),
    /// Answered when the session has no drain and no follow-up pending; `Unavailable` at once
    /// when the session already has too many waiting callers.
    WaitIdle(Reply<Result<()>>),
    /// The drain task finished. `stranded`: its failure could not be recorded, and a drain of
    /// this kind is retried with backoff.
    Finished {
        drain: u64,
        result: Result<Outcome>,
        stranded: Option<Kind>,
    },
    /// The backoff of a stranded claim is over: run the drain that retries it.
    Retry,
    /// The passivation tick ([`passivate`]): stop if the actor has been idle long enough, or
    /// at once if idle while sessions wait for a place (the registry sends it then too).
    Idle,
}

/// How an actor was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// On demand, for a message.
    Fresh,
    /// By the supervisor after a panic: settle what the dead actor left and continue.
    Restarted,
}

#[derive(Debug)]
pub(crate) struct SessionActor;

pub(crate) struct State {
    session: SessionId,
    start: Start,
    shared: Arc<Shared>,
    actors: Arc<Actors>,
    current: Option<Current>,
    /// A wake arrived during the drain: run exactly one more afterwards.
    follow_up: bool,
    /// Resumes that arrived during an interrupt's cleanup; they get a forced drain after it.
    queued_resumes: Vec<Reply<Result<Outcome>>>,
    idle_waiters: Vec<Reply<Result<()>>>,
    drains: u64,
    /// When the last message other than the passivation tick arrived.
    last_active: tokio::time::Instant,
    /// A message other than the passivation tick has arrived: an actor spawned for a caller is
    /// not passivated for crowding before that caller's message reaches it.
    served: bool,
    /// The settled front of the session's history, for its drains' steps.
    history: Arc<Mutex<HistoryCache>>,
    /// A drain failed and could not record it (the store refused writes): the claim it may have
    /// left is retried with a drain of this kind after `retry_in`, doubling up to
    /// [`MAX_RETRY_IN`], until a drain ends with its outcome recorded. Not idle meanwhile.
    stranded: Option<Kind>,
    retry_in: std::time::Duration,
}

/// The first wait before a stranded claim is retried, and the longest.
const FIRST_RETRY_IN: std::time::Duration = std::time::Duration::from_millis(100);
const MAX_RETRY_IN: std::time::Duration = std::time::Duration::from_secs(30);

/// What retries a drain that ended stranded: the interrupt a user asked for, if the drain was
/// ending one (so a retry never resumes a turn the user interrupted), else the agent loop, which
/// recovers the claim.
fn retry_kind(kind: Kind, interrupted_by_user: bool) -> Kind {
    match (kind, interrupted_by_user) {
        (Kind::Release, _) | (_, true) => Kind::Release,
        _ => Kind::Turn,
    }
}

struct Current {
    id: u64,
    joiners: Vec<Reply<Result<Outcome>>>,
    cancel: Cancel,
    interrupters: Vec<Reply<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for State {
    /// The drain task belongs to the actor: if the actor goes away (stop, panic, kill), the
    /// drain is aborted at its next await. It writes no cleanup and its claim stays, so the
    /// restarted actor (or the next process) settles what it left.
    fn drop(&mut self) {
        if let Some(current) = &self.current {
            current.task.abort();
        }
    }
}

impl State {
    fn waiters(&self) -> usize {
        self.idle_waiters.len()
            + self.queued_resumes.len()
            + self.current.as_ref().map_or(0, |c| c.joiners.len())
    }

    fn start(
        &mut self,
        myself: &ActorRef<Msg>,
        forced: bool,
        joiners: Vec<Reply<Result<Outcome>>>,
    ) {
        self.start_drain(myself, forced, Kind::Turn, joiners);
    }

    fn start_drain(
        &mut self,
        myself: &ActorRef<Msg>,
        forced: bool,
        kind: Kind,
        joiners: Vec<Reply<Result<Outcome>>>,
    ) {
        self.drains += 1;
        let id = self.drains;
        let cancel = Cancel::default();
        let drain = Drain {
            session: self.session.clone(),
            shared: self.shared.clone(),
            forced,
            kind,
            fence: self
                .shared
                .store
                .ownership()
                .and_then(|o| o.epoch(&self.session)),
            cancel: cancel.clone(),
            in_flight: Default::default(),
            history: Some(self.history.clone()),
            slot: Default::default(),
        };
        self.shared.active.insert(self.session.clone(), ());
        self.shared
            .bus
            .publish(&self.session, Live::Status(Activity::Running));
        let me = myself.clone();
        let task = tokio::spawn(async move {
            // Waiting for a slot holds only this task and the drain's inputs: the drain's state,
            // its span and everything it reads come once it runs. Interrupted while waiting, it
            // ends having written nothing, so its input stays pending; a user's interrupt still
            // ends what a stopped execution left under a claim (a restarted actor's first drain).
            let cancel = drain.cancel.clone();
            let ended = match drain.slot.take(&drain.shared, &drain.cancel).await {
                // Boxed: every task waiting for a slot would otherwise reserve room for it.
                false if cancel.reason() == InterruptReason::User => drain::Ended {
                    result: Box::pin(drain::release(&drain))
                        .await
                        .map(|_| Outcome::Interrupted),
                    stranded: false,
                },
                false => drain::Ended {
                    result: Ok(Outcome::Interrupted),
                    stranded: false,
                },
                true => {
                    let span = tracing::info_span!("drain", session_id = %drain.session, forced);
                    let slot = drain.slot.clone();
                    let run = std::panic::AssertUnwindSafe(drain::run(drain)).catch_unwind();
                    let ended = Box::pin(run.instrument_with(span))
                        .await
                        .unwrap_or_else(|panic| drain::Ended {
                            result: Err(Error::Panicked(panic_message(&panic))),
                            stranded: false,
                        });
                    slot.release();
                    ended
                }
            };
            let by_user = cancel.is_cancelled() && cancel.reason() == InterruptReason::User;
            let stranded = ended.stranded.then(|| retry_kind(kind, by_user));
            // The actor may be gone; then nobody is waiting for this report.
            let _ = me.cast(Msg::Finished {
                drain: id,
                result: ended.result,
                stranded,
            });
        });
        self.current = Some(Current {
            id,
            joiners,
            cancel,
            interrupters: Vec::new(),
            task,
        });
    }

    fn is_idle(&self) -> bool {
        self.current.is_none()
            && !self.follow_up
            && self.queued_resumes.is_empty()
            && self.stranded.is_none()
    }

    /// Idle with nobody waiting on it: stopping loses nothing.
    fn may_passivate(&self) -> bool {
        self.is_idle() && self.idle_waiters.is_empty()
    }

    /// Stops the actor. It leaves the routing table first: a message already routed here is
    /// dropped with the mailbox and its caller routes again, to a fresh actor. While sessions
    /// wait for a place, its history cache is parked for the session's next actor.
    fn passivate(&self, myself: &ActorRef<Msg>) {
        self.actors
            .remove_if(&self.session, |_, a| a.get_id() == myself.get_id());
        if self.shared.is_crowded() {
            HistoryCache::park_shared(&self.history, &self.session);
        }
        self.shared.metrics.passivations.inc();
        myself.stop(Some("passivated".into()));
    }
}

/// `tracing::Instrument` under a name that reads well at the call site.
trait InstrumentWith: Sized {
    fn instrument_with(self, span: tracing::Span) -> tracing::instrument::Instrumented<Self>;
}

impl<F: std::future::Future> InstrumentWith for F {
    fn instrument_with(self, span: tracing::Span) -> tracing::instrument::Instrumented<Self> {
        tracing::Instrument::instrument(self, span)
    }
}

impl Actor for SessionActor {
    type Msg = Msg;
    type State = State;
    type Arguments = (SessionId, Arc<Shared>, Arc<Actors>, Start);

    async fn pre_start(
        &self,
        _myself: ActorRef<Msg>,
        (session, shared, actors, start): Self::Arguments,
    ) -> Result<State, ActorProcessingErr> {
        // A restarted actor trusts only the store, not a cache parked before the failure.
        let cache = match start {
            Start::Fresh => HistoryCache::unpark(shared.history_budget.clone(), &session),
            Start::Restarted => {
                drop(HistoryCache::unpark(
                    shared.history_budget.clone(),
                    &session,
                ));
                HistoryCache::new(shared.history_budget.clone())
            }
        };
        let history = Arc::new(Mutex::new(cache));
        Ok(State {
            session,
            start,
            shared,
            actors,
            current: None,
            follow_up: false,
            queued_resumes: Vec::new(),
            idle_waiters: Vec::new(),
            drains: 0,
            last_active: tokio::time::Instant::now(),
            served: false,
            history,
            stranded: None,
            retry_in: FIRST_RETRY_IN,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Msg>,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        // A restarted actor trusts only the store: a non-forced drain settles what the dead one
        // left (its claim is still held) and continues owed work.
        if state.start == Start::Restarted {
            state.start(&myself, false, Vec::new());
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Msg>,
        msg: Msg,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        if !matches!(msg, Msg::Idle) {
            state.last_active = tokio::time::Instant::now();
            state.served = true;
        }
        match msg {
            Msg::Wake(reply) => {
                let _ = reply.send(());
                match &state.current {
                    Some(_) => state.follow_up = true,
                    None => state.start(&myself, false, Vec::new()),
                }
            }
            Msg::Resume(reply) => {
                if state.waiters() >= state.shared.limits.waiters_per_session {
                    let _ = reply.send(Err(Error::Unavailable(format!(
                        "session {} has too many waiting callers",
                        state.session
                    ))));
                } else {
                    match &mut state.current {
                        Some(c) if !c.interrupters.is_empty() => state.queued_resumes.push(reply),
                        Some(c) => c.joiners.push(reply),
                        None => state.start(&myself, true, vec![reply]),
                    }
                }
            }
            Msg::Compact(reply) => match &state.current {
                Some(_) => {
                    let _ = reply.send(Err(Error::Busy(format!(
                        "session {} is running; compact it when idle",
                        state.session
                    ))));
                }
                None => state.start_drain(&myself, false, Kind::Compaction, vec![reply]),
            },
            Msg::Interrupt(reason, reply) => match &mut state.current {
                // No drain, but a user's interrupt may still find a claim a stopped execution
                // left (a restart that has not resumed it yet): a drain that runs nothing ends
                // that turn, and answers whether there was one.
                None if reason == InterruptReason::User => {
                    state.start_drain(&myself, false, Kind::Release, Vec::new());
                    if let Some(current) = &mut state.current {
                        current.interrupters.push(reply);
                    }
                }
                None => {
                    let _ = reply.send(false);
                }
                Some(c) => {
                    // The first interrupt clears the follow-up; a wake that arrives during the
                    // cleanup runs after it, and a second interrupt of the same drain must not
                    // drop that wake.
                    if !c.cancel.is_cancelled() {
                        state.follow_up = false;
                    }
                    c.cancel.interrupt(reason);
                    // Callers waiting for the cleanup are bounded like every other waiter: past
                    // the limit an interrupt is still applied, and answered at once.
                    if c.interrupters.len() < state.shared.limits.waiters_per_session {
                        c.interrupters.push(reply);
                    } else {
                        let _ = reply.send(true);
                    }
                }
            },
            Msg::WaitIdle(reply) => {
                if state.is_idle() {
                    let _ = reply.send(Ok(()));
                } else if state.waiters() >= state.shared.limits.waiters_per_session {
                    // A limit is an answer, never a dropped port: a caller reads a dropped port
                    // as a dead actor.
                    let _ = reply.send(Err(Error::Unavailable(format!(
                        "session {} has too many waiting callers",
                        state.session
                    ))));
                } else {
                    state.idle_waiters.push(reply);
                }
            }
            Msg::Retry => {
                if let (None, Some(kind)) = (&state.current, state.stranded) {
                    state.start_drain(&myself, false, kind, Vec::new());
                }
            }
            Msg::Finished {
                drain,
                result,
                stranded,
            } => {
                let Some(current) = state.current.take_if(|c| c.id == drain) else {
                    return Ok(());
                };
                state.shared.active.remove(&state.session);
                // A session that waits for approvals holds no drain: the runtime's timer wakes
                // it when the earliest expires, whether or not this actor is still alive.
                if let Ok(Outcome::Blocked(limit)) = &result {
                    state.shared.blocked.insert(state.session.clone(), *limit);
                } else if !matches!(result, Err(Error::Busy(_))) {
                    state.shared.blocked.remove(&state.session);
                }
                let activity = match &result {
                    Ok(Outcome::Waiting { expires_at }) => {
                        state.shared.deadlines.set(&state.session, *expires_at);
                        Activity::Waiting
                    }
                    Ok(Outcome::Blocked(_)) => Activity::Blocked,
                    // A refusal changed nothing: a session that waited still does.
                    Err(Error::Busy(_)) if state.shared.deadlines.is_waiting(&state.session) => {
                        Activity::Waiting
                    }
                    _ => {
                        state.shared.deadlines.clear(&state.session);
                        Activity::Idle
                    }
                };
                state
                    .shared
                    .bus
                    .publish(&state.session, Live::Status(activity));
                let panicked = matches!(result, Err(Error::Panicked(_)));
                for joiner in current.joiners {
                    let _ = joiner.send(result.clone());
                }
                // An interrupt that cut nothing (a release that found no claim) says so.
                let cut = !matches!(result, Ok(Outcome::Idle));
                for interrupter in current.interrupters {
                    let _ = interrupter.send(cut);
                }
                if let Err(e) = &result {
                    tracing::warn!(session_id = %state.session, error = %e, "drain failed");
                }
                state.stranded = stranded;
                match stranded {
                    Some(_) => {
                        let (me, delay) = (myself.clone(), state.retry_in);
                        state.retry_in = (delay * 2).min(MAX_RETRY_IN);
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            // The actor may be gone: its successor recovers the claim.
                            let _ = me.cast(Msg::Retry);
                        });
                    }
                    None => state.retry_in = FIRST_RETRY_IN,
                }
                if panicked {
                    // Let the supervisor decide: returning an error marks this actor failed.
                    let message = match result {
                        Err(e) => e.to_string(),
                        Ok(_) => unreachable!("checked above"),
                    };
                    return Err(message.into());
                }
                let resumes = std::mem::take(&mut state.queued_resumes);
                if !resumes.is_empty() {
                    state.follow_up = false;
                    state.start(&myself, true, resumes);
                } else if std::mem::take(&mut state.follow_up) {
                    state.start(&myself, false, Vec::new());
                } else if state.is_idle() {
                    for waiter in state.idle_waiters.drain(..) {
                        let _ = waiter.send(Ok(()));
                    }
                }
            }
            Msg::Idle => {
                if state.may_passivate()
                    && state.last_active.elapsed() >= state.shared.passivate_after
                {
                    state.passivate(&myself);
                    return Ok(());
                }
            }
        }
        // Sessions wait for a place among the live actors: an idle one gives its place up now.
        if state.served && state.shared.is_crowded() && state.may_passivate() {
            state.passivate(&myself);
        }
        Ok(())
    }
}

/// Passivation for every session actor with one timer: every tick, each live actor is asked
/// whether it has been idle for `passivate_after`, and stops if so. An actor therefore stops
/// between `passivate_after` and one tick later. One timer instead of one per idle actor: ten
/// thousand idle actors held ten thousand timer tasks. Ends with the runtime.
pub(crate) async fn passivate(shared: Arc<Shared>, actors: Arc<Actors>) {
    let every = passivation_tick(shared.passivate_after);
    loop {
        tokio::select! {
            _ = shared.stopping.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for actor in actors.iter() {
            // An actor that is gone already needs no tick.
            let _ = actor.value().cast(Msg::Idle);
        }
    }
}

/// An eighth of the idle time, at least a millisecond.
fn passivation_tick(passivate_after: std::time::Duration) -> std::time::Duration {
    (passivate_after / 8).max(std::time::Duration::from_millis(1))
}
