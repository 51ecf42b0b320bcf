//! The `Runtime`: starts the actor system over a store and hands out a cheap, cloneable handle
//! with typed async methods. Every method returns an error value rather than hanging when an
//! actor died, and every acknowledgement has a timeout.
//!
//! Routing: a session's live actor is looked up in a shared concurrent map first, so messages to
//! live actors never pass through the registry's mailbox; only a miss asks the registry, which
//! checks that the session exists and spawns its actor (the wake after an admission skips the
//! check: the admission just found the session). A message that cannot be delivered (the actor
//! passivated or died in between) is routed again: messages are idempotent up to their effect.

mod approvals;
pub(crate) mod recovery;
pub(crate) mod schedules;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agenthost_model::{Delivery, Event, InterruptReason, MessageId, Prompt, SessionId, SessionRow};
use agenthost_store::{Action, Admission, NewSession, Receipt, Snapshot, Store};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort};
use tokio::sync::{Semaphore, broadcast};

use crate::IdMap;
use crate::bus::{Bus, Live};
use crate::catalog::Catalog;
use crate::config::Config;
use crate::drain::Outcome;
use crate::error::{Error, Result};
use crate::generate::Pool;
use crate::hooks::Hook;
use crate::metrics::Metrics;
use crate::registry::{self, Registry};
use crate::session::{self, Actors};
use crate::shared::Shared;
use crate::tools::Tools;

/// Preparers in the generate pool. Preparation is a snapshot read plus a request build (well
/// under a millisecond for ordinary histories), so a few workers keep up with many callers.
const PREPARERS: usize = 4;

/// A session to create.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    /// A client-chosen id; an existing id returns that session unchanged.
    pub id: Option<SessionId>,
    pub agent: Option<String>,
    /// A model from the configuration, instead of the agent's.
    pub model: Option<String>,
    pub title: Option<String>,
    /// The session's own budget (its limits replace its agent's where set).
    pub budget: Option<agenthost_model::Budget>,
}

/// A prompt to admit.
#[derive(Debug, Clone)]
pub struct PromptRequest {
    pub session: SessionId,
    /// The idempotency key; minted when absent.
    pub id: Option<MessageId>,
    pub prompt: Prompt,
    pub delivery: Delivery,
    /// Wake the session once the admission is durable.
    pub resume: bool,
}

impl PromptRequest {
    pub fn new(session: &SessionId, text: impl Into<String>) -> Self {
        PromptRequest {
            session: session.clone(),
            id: None,
            prompt: Prompt::text(text),
            delivery: Delivery::Steer,
            resume: true,
        }
    }
}

/// Tools and hooks an embedder adds at start.
#[derive(Debug, Clone, Default)]
pub struct Extensions {
    pub tools: Tools,
    pub hooks: Vec<Arc<dyn Hook>>,
}

/// The handle. Clone it freely; all clones drive the same runtime.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    /// Live session actors: the routing fast path.
    actors: Arc<Actors>,
    /// What recovery sweeps still owe: `wait_idle` waits for it.
    sweeps: recovery::Sweeps,
    registry: ActorRef<registry::Msg>,
    preparers: Arc<Pool>,
    recovery: Arc<tokio::sync::watch::Receiver<bool>>,
}

impl Runtime {
    /// Opens the store, starts the registry and runs the boot recovery sweep in the background
    /// (see [`Runtime::recovered`]).
    pub async fn start(config: Config) -> Result<Runtime> {
        Runtime::start_with(config, Extensions::default()).await
    }

    pub async fn start_with(config: Config, extensions: Extensions) -> Result<Runtime> {
        let catalog = Catalog {
            providers: config.providers,
            models: config.models,
            agents: config.agents,
            default_agent: config.default_agent,
        };
        catalog.resolve(&catalog.default_agent, None)?;
        let bus = Bus::new(16 * 1024);
        let mut store_config = config.store;
        let prompt_limit = store_config.prompt_limit;
        store_config.pending_limit = config.limits.pending_per_session;
        let commits = bus.clone();
        let metrics = Metrics::default();
        let counted = metrics.clone();
        // An embedder's own commit hook (a test's fault injection, say) runs first.
        let embedder = store_config.on_commit.take();
        store_config.on_commit = Some(Arc::new(move |events| {
            if let Some(hook) = &embedder {
                hook(events);
            }
            for (session, stored) in events {
                counted.committed(session, &stored.event);
                // The commit hook runs on the store's committer thread: copy an event only for
                // a listener.
                if commits.listening(session) {
                    commits.publish(session, Live::Event(Box::new(stored.clone())));
                }
            }
        }));
        let store = tokio::task::spawn_blocking(move || agenthost_store::open(store_config))
            .await
            .map_err(|e| Error::Storage(e.to_string()))??;
        let history_budget = crate::history_cache::Budget::new(config.limits.history_cache);
        // The built-in tools, unless the embedder brings tools of those names.
        let builtin = schedules::Handle::default();
        let mut tools = extensions.tools;
        for tool in schedules::builtins(&builtin) {
            if tools.get(&tool.name).is_none() {
                tools.register(tool);
            }
        }
        let shared = Arc::new(Shared {
            store,
            catalog,
            tools: crate::tools::Registry::new(tools),
            hooks: extensions.hooks,
            bus,
            streams: Arc::new(Semaphore::new(config.limits.concurrent_streams.max(1))),
            drains: Arc::new(Semaphore::new(config.limits.concurrent_drains.max(1))),
            drains_waiting: Default::default(),
            parked: IdMap::default(),
            crowded: AtomicBool::new(false),
            active: IdMap::default(),
            deadlines: Default::default(),
            blocked: Default::default(),
            schedules: Default::default(),
            prompt_limit,
            limits: config.limits,
            supervision: config.supervision,
            passivate_after: config.passivate_after,
            instructions: config.instructions,
            compaction: config.compaction,
            recovery: config.recovery.clone(),
            history_budget,
            admitted: Default::default(),
            metrics,
            shutting_down: AtomicBool::new(false),
            stopping: Default::default(),
            released: Default::default(),
        });
        let _ = builtin.set(Arc::downgrade(&shared));
        let actors: Arc<Actors> = Arc::default();
        let (registry, _) = Actor::spawn(None, Registry, (shared.clone(), actors.clone()))
            .await
            .map_err(|e| Error::Unavailable(format!("cannot start the registry: {e}")))?;
        let preparers = Arc::new(Pool::start(shared.clone(), PREPARERS).await?);
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let runtime = Runtime {
            shared,
            actors,
            sweeps: Default::default(),
            registry,
            preparers,
            recovery: Arc::new(done_rx),
        };
        if let Some(ownership) = runtime.shared.store.ownership() {
            let follower = runtime.clone();
            let changes = ownership.subscribe();
            // What is held now, the boot sweep (which `wait_idle` waits for) covers.
            runtime.sweeps.handled(ownership.version());
            tokio::spawn(async move { recovery::follow(&follower, changes).await });
        }
        // The boot sweep lists what a previous process left before anything can be admitted or
        // fired here: input admitted from now on is this process's own to wake, and the counts
        // the listing seeds are not older than any commit of this process.
        let found = recovery::owed(&runtime).await;
        tokio::spawn(session::passivate(
            runtime.shared.clone(),
            runtime.actors.clone(),
        ));
        tokio::spawn(crate::approvals::expire(runtime.clone()));
        let timer = runtime.clone();
        tokio::spawn(async move {
            schedules::load(&timer).await;
            schedules::run(timer).await;
        });
        let (sweeper, recovery) = (runtime.clone(), config.recovery);
        tokio::spawn(async move {
            recovery::resume(&sweeper, &recovery, found, None).await;
            let _ = done_tx.send(true);
            // Like recovery, the lost-wake sweep resumes work nobody asked for again: it runs in
            // `resume` mode only.
            if recovery.mode == crate::config::RecoveryMode::Resume {
                recovery::watch(&sweeper).await;
            }
        });
        Ok(runtime)
    }

    /// Resolves when the boot recovery sweep has resumed (or reported) every session it found.
    pub async fn recovered(&self) {
        let mut rx = (*self.recovery).clone();
        let _ = rx.wait_for(|done| *done).await;
    }

    fn check_open(&self) -> Result<()> {
        if self.shared.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    /// Creates a session, or returns the existing one when `id` names it.
    pub async fn create_session(&self, create: CreateSession) -> Result<SessionRow> {
        self.check_open()?;
        let agent = create
            .agent
            .unwrap_or_else(|| self.shared.catalog.default_agent.clone());
        if !self.shared.catalog.agents.contains_key(&agent) {
            return Err(Error::Invalid(format!("unknown agent {agent:?}")));
        }
        if let Some(model) = &create.model
            && !self.shared.catalog.models.contains_key(model)
        {
            return Err(Error::Invalid(format!("unknown model {model:?}")));
        }
        let id = match create.id {
            Some(id) => id,
            None => self.mint_owned()?,
        };
        let new = NewSession {
            id,
            agent,
            model: create.model,
            title: create.title,
        };
        let row = self.shared.store.create_session(new).await?;
        match create.budget {
            // A new session takes its budget in the commit after its creation; a retry finds it
            // without one and sets it then. An existing session with history is left unchanged.
            Some(budget) if row.budget != budget && row.last_seq == agenthost_model::Seq::ZERO => {
                let id = row.id.clone();
                let mut actions = self.fence(&id);
                actions.push(Action::Append(Event::BudgetSet { budget }));
                self.shared.store.write(id.clone(), actions).await?;
                self.shared
                    .store
                    .snapshot()?
                    .session(&id)?
                    .ok_or(Error::SessionNotFound(id))
            }
            _ => Ok(row),
        }
    }

    /// Sets the session's own budget (its limits replace its agent's where set), durably, then
    /// wakes the session: an exchange the budget blocked goes on where it stopped, its next call
    /// checked against the new budget.
    pub async fn set_budget(
        &self,
        session: &SessionId,
        budget: agenthost_model::Budget,
    ) -> Result<SessionRow> {
        self.check_open()?;
        self.check_owner(session)?;
        let mut actions = self.fence(session);
        actions.push(Action::Append(Event::BudgetSet { budget }));
        self.shared.store.write(session.clone(), actions).await?;
        // As a decision's: in a task of its own, so the budget is applied whatever happens to
        // the caller; a session with nothing owed stays idle.
        let (runtime, woken) = (self.clone(), session.clone());
        if let Ok(Err(e)) = tokio::spawn(async move { runtime.wake(&woken).await }).await {
            tracing::warn!(session_id = %session, error = %e, "budget set, but the wake failed");
        }
        let (reader, id) = (self.clone(), session.clone());
        tokio::task::spawn_blocking(move || {
            reader
                .snapshot()?
                .session(&id)?
                .ok_or(Error::SessionNotFound(id))
        })
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?
    }

    /// The session's budget in force: its agent's, with its own limits over them.
    pub fn budget_of(&self, row: &SessionRow) -> agenthost_model::Budget {
        self.shared
            .catalog
            .agents
            .get(&row.agent)
            .map_or_else(agenthost_model::Budget::default, |agent| agent.budget)
            .with(&row.budget)
    }

    /// Sessions of this process whose exchange the budget blocks.
    pub fn blocked(&self) -> usize {
        self.shared.blocked.len()
    }

    /// Admits a prompt durably, then wakes the session once when `resume` is set. Without
    /// `resume` the input only waits: no sweep runs it on its own (the admission records that it
    /// asked for no wake), and a wake or resume that comes for another reason promotes it.
    pub async fn prompt(&self, request: PromptRequest) -> Result<Receipt> {
        self.check_open()?;
        // The store checks the session, the id and the pending limit in the admission's own
        // transaction.
        // The input's row is kept for the drain's opening read (see `admitted`) when its id is
        // minted here, so no earlier admission of it can exist, and the store's reads are local:
        // only the embedded store's snapshot takes kept rows (a PostgreSQL snapshot reads the
        // pending inputs either way, and would leave them to age out unused).
        let kept = (request.id.is_none()
            && self.shared.store.local_reads()
            && request.prompt.size() <= crate::admitted::MOST_PROMPT)
            .then(|| request.prompt.clone());
        let id = request.id.unwrap_or_else(crate::mint::message_id);
        let admission = Admission {
            session: request.session.clone(),
            id,
            prompt: request.prompt,
            delivery: request.delivery,
            wake: request.resume,
        };
        let receipt = self.shared.store.admit(admission).await?;
        if let Some(prompt) = kept
            && receipt.promoted_seq.is_none()
        {
            let row = agenthost_model::InboxRow {
                id: receipt.id.clone(),
                admitted_seq: receipt.admitted_seq,
                delivery: receipt.delivery,
                prompt,
                wake: request.resume,
            };
            self.shared.admitted.keep(&receipt.session, row);
        }
        for hook in &self.shared.hooks {
            hook.on_admitted(&receipt.session, &receipt.id);
        }
        if request.resume {
            // The wake runs in a task of its own, so a caller that goes away (an HTTP client
            // that hung up) cannot cancel it half-way; and the input is durable whatever happens
            // to the wake, so the caller gets its receipt either way. A wake that never ran is
            // caught by the lost-wake sweep (`recovery::watch`).
            let (runtime, session) = (self.clone(), request.session.clone());
            let wake = tokio::spawn(async move { runtime.notify(&session, true).await });
            match wake.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(session_id = %request.session, error = %e, "admitted, but the wake failed; the sweep will wake it")
                }
                Err(e) => {
                    tracing::warn!(session_id = %request.session, error = %e, "admitted, but the wake task failed; the sweep will wake it")
                }
            }
        }
        Ok(receipt)
    }

    /// Advisory notice that durable work may exist. A no-op for an unknown session.
    pub async fn wake(&self, session: &SessionId) -> Result<()> {
        self.check_open()?;
        self.notify(session, false).await
    }

    async fn notify(&self, session: &SessionId, known: bool) -> Result<()> {
        let timeout = self.shared.limits.call_timeout;
        let ask = registry::Ask { known, wake: true };
        self.ask_routed(session, ask, "wake", Some(timeout), session::Msg::Wake)
            .await
            .map(|_| ())
    }

    /// Starts a forced drain, or joins the running one, and returns its outcome.
    pub async fn resume(&self, session: &SessionId) -> Result<Outcome> {
        self.check_open()?;
        match self
            .ask(session, "resume", None, session::Msg::Resume)
            .await?
        {
            Some(outcome) => outcome,
            None => Err(Error::SessionNotFound(session.clone())),
        }
    }

    /// [`Runtime::resume`] without waiting: returns once the session's actor holds the request,
    /// with the future of its outcome. Whatever is asked of the session afterwards (a wait, a
    /// compaction) is queued behind it, so it sees the drain this resume starts.
    pub async fn start_resume(
        &self,
        session: &SessionId,
    ) -> Result<impl Future<Output = Result<Outcome>> + Send + 'static> {
        self.check_open()?;
        for _ in 0..3 {
            let Some(actor) = self
                .route(session, registry::Ask::default(), "resume", None)
                .await?
            else {
                return Err(Error::SessionNotFound(session.clone()));
            };
            let (tx, rx) = ractor::concurrency::oneshot();
            if actor.send_message(session::Msg::Resume(tx.into())).is_ok() {
                let (session, shared) = (session.clone(), self.shared.clone());
                return Ok(async move {
                    // An actor stops without answering at shutdown, or when it failed.
                    rx.await
                        .unwrap_or_else(|_| match shared.is_shutting_down() {
                            true => Err(Error::ShuttingDown),
                            false => Err(Error::ActorDied(session)),
                        })
                });
            }
            self.retire(session, &actor, "resume").await?;
        }
        Err(Error::ActorDied(session.clone()))
    }

    /// Compacts the session's active history now: a summary of the older part, the
    /// recent part kept verbatim. Fails with `NothingToCompact` when there is nothing to compact (no
    /// provider call) and with `Unavailable` while a drain runs. Returns the new `kept_from`.
    pub async fn compact(&self, session: &SessionId) -> Result<agenthost_model::Seq> {
        self.check_open()?;
        let outcome = self
            .ask(session, "compact", None, session::Msg::Compact)
            .await?
            .ok_or_else(|| Error::SessionNotFound(session.clone()))??;
        match outcome {
            Outcome::Compacted { kept_from } => Ok(kept_from),
            other => Err(Error::Unavailable(format!("unexpected outcome {other:?}"))),
        }
    }

    /// [`Runtime::interrupt`], then, when it interrupted something, a record that `by` (a
    /// token's name) asked for it.
    pub async fn interrupt_by(&self, session: &SessionId, by: Option<String>) -> Result<bool> {
        let interrupted = self.interrupt(session).await?;
        if let (true, Some(by)) = (interrupted, by) {
            let mut actions = self.fence(session);
            actions.push(Action::Append(Event::InterruptRequested { by }));
            self.shared.store.write(session.clone(), actions).await?;
        }
        Ok(interrupted)
    }

    /// Interrupts the running drain and returns after its durable cleanup, with whether a drain
    /// was running. A claimed session with no drain (a restart that has not resumed it yet) has
    /// the turn its stopped execution left ended the same way, and answers true. A no-op (false)
    /// for an idle or unknown session.
    pub async fn interrupt(&self, session: &SessionId) -> Result<bool> {
        self.check_open()?;
        // Only a live actor can have a drain, and only a claim can hold what a stopped one left:
        // with neither there is nothing to interrupt, and no actor is spawned for it.
        if !self.actors.contains_key(session) && !self.claimed(session).await? {
            return Ok(false);
        }
        let timeout = self.shared.limits.call_timeout;
        let interrupted = self
            .ask(session, "interrupt", Some(timeout), |reply| {
                session::Msg::Interrupt(InterruptReason::User, reply)
            })
            .await?;
        Ok(interrupted.unwrap_or(false))
    }

    /// Whether the session holds a claim (read on the blocking pool, like every store read the
    /// async paths make outside a drain).
    async fn claimed(&self, session: &SessionId) -> Result<bool> {
        let reader = self.clone();
        let session = session.clone();
        tokio::task::spawn_blocking(move || -> Result<bool> {
            let row = reader.snapshot()?.session(&session)?;
            Ok(row.is_some_and(|row| row.claim.is_some()))
        })
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?
    }

    /// Returns when the session has no drain and no follow-up pending, and the boot recovery
    /// sweep has resumed whatever it found.
    pub async fn wait_idle(&self, session: &SessionId, timeout: Duration) -> Result<()> {
        self.check_open()?;
        // A session a previous process left running is not idle before the boot sweep has
        // resumed it: wait for the sweep first, within the same timeout.
        let start = tokio::time::Instant::now();
        let swept = *self.recovery.borrow();
        let timed_out = || Error::Timeout {
            session: session.clone(),
            what: "wait_idle",
        };
        if !swept
            && tokio::time::timeout(timeout, self.recovered())
                .await
                .is_err()
        {
            return Err(timed_out());
        }
        // Likewise a session of a partition this node just took over, before its sweep has
        // resumed it.
        let left = timeout.saturating_sub(start.elapsed());
        if !self
            .sweeps
            .settled(session, || self.ownership_version(), left)
            .await
        {
            return Err(timed_out());
        }
        self.idle(session, timeout.saturating_sub(start.elapsed()))
            .await
    }

    /// Returns when the session has no drain and no follow-up pending.
    pub(crate) async fn idle(&self, session: &SessionId, timeout: Duration) -> Result<()> {
        match self
            .ask(session, "wait_idle", Some(timeout), session::Msg::WaitIdle)
            .await?
        {
            Some(answer) => answer,
            None => Err(Error::SessionNotFound(session.clone())),
        }
    }

    /// A transient, session-aware, one-shot model call: the session's settled history
    /// and instructions plus `prompt`, prepared exactly like a durable step but with tool calls
    /// forbidden (the tools are still defined), sent once, with nothing recorded. It never talks to the session actor, so it neither waits
    /// for nor disturbs a running drain. An answer without text is `""`.
    pub async fn generate(&self, session: &SessionId, prompt: &str) -> Result<String> {
        self.check_open()?;
        if prompt.trim().is_empty() {
            return Err(Error::Invalid("generate needs a non-empty prompt".into()));
        }
        let prepared = self.preparers.prepare(session, prompt).await?;
        // `generate` counts against the same limit as steps and compactions.
        let _permit = self
            .shared
            .streams
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let (price, agent, model) = (
            prepared.model.price,
            prepared.agent.clone(),
            prepared.model.model.clone(),
        );
        let response = prepared
            .provider
            .generate(prepared.request)
            .await
            .map_err(|e| match e.kind() {
                agenthost_llm::ErrorKind::ContextOverflow => Error::ContextOverflow(e.to_string()),
                _ => Error::Provider(e),
            })?;
        // Counted in the spend metrics; the session's totals stay as they are (a transient call
        // changes no durable byte), while its budget still bounds what the call may cost.
        let usage = crate::drain::step::cost(&response.usage, &price);
        self.shared.metrics.spent(&agent, &model, &usage);
        Ok(response.text)
    }

    /// Drains waiting for a slot among those running at once (`limits.concurrent_drains`).
    pub fn drains_waiting(&self) -> usize {
        self.shared.drains_waiting.load(Ordering::Relaxed)
    }

    /// Sessions waiting for a place among the live session actors (`limits.live_sessions`).
    pub fn sessions_waiting(&self) -> usize {
        self.shared.parked.len()
    }

    /// Sessions with a drain in progress in this process.
    pub fn active(&self) -> Vec<SessionId> {
        let mut active: Vec<SessionId> =
            self.shared.active.iter().map(|e| e.key().clone()).collect();
        active.sort();
        active
    }

    /// Whether `session` has a drain in progress in this process.
    pub fn is_active(&self, session: &SessionId) -> bool {
        self.shared.active.contains_key(session)
    }

    /// Inputs admitted and not yet promoted, and sessions holding a claim, of the sessions this
    /// node owns: from memory (seeded by the recovery sweep's read, then moved by every commit),
    /// never a store read.
    pub fn held(&self) -> (u64, u64) {
        self.shared.metrics.held.count(|session| self.owns(session))
    }

    /// Session actors alive right now (passivated sessions are not counted).
    pub fn live(&self) -> usize {
        self.actors.len()
    }

    /// Live events of every session: durable events after commit, deltas, status changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<(SessionId, Live)>> {
        self.shared.bus.subscribe()
    }

    /// Live events of one session; cheaper than filtering [`Runtime::subscribe`] when many
    /// sessions are watched at once.
    pub fn subscribe_session(&self, session: &SessionId) -> crate::Subscription {
        self.shared.bus.subscribe_session(session)
    }

    /// The whole output of tool call `call_id` of assistant message `message` (or its error), as
    /// the tool returned it, even where history keeps only a preview. A call still running is
    /// `Error::NotFound` too: it has no output yet.
    pub async fn tool_output(
        &self,
        session: &SessionId,
        message: &MessageId,
        call_id: &str,
    ) -> Result<ToolOutput> {
        let (store, session, message, call_id) = (
            self.shared.store.clone(),
            session.clone(),
            message.clone(),
            call_id.to_owned(),
        );
        tokio::task::spawn_blocking(move || {
            whole_output(&*store.snapshot()?, &session, &message, &call_id)
        })
        .await
        .map_err(|e| Error::Panicked(e.to_string()))?
    }

    /// A consistent read view of the store.
    pub fn snapshot(&self) -> Result<Box<dyn Snapshot>> {
        Ok(self.shared.store.snapshot()?)
    }

    /// The version of this node's partitions (see `Ownership::version`); 0 on the embedded
    /// store.
    pub(crate) fn ownership_version(&self) -> u64 {
        self.shared.store.ownership().map_or(0, |o| o.version())
    }

    /// Whether this node may run the session: always on the embedded store; in a cluster, when
    /// it holds the session's partition.
    pub fn owns(&self, session: &SessionId) -> bool {
        self.shared
            .store
            .ownership()
            .is_none_or(|o| o.owns(session))
    }

    /// A new session id, in a partition this node holds, so a session is created where the
    /// request arrived.
    fn mint_owned(&self) -> Result<SessionId> {
        // With a fair share of the partitions, a few tries find one; 256 misses in a row mean
        // this node holds none.
        for _ in 0..256 {
            let id = crate::mint::session_id();
            if self.owns(&id) {
                return Ok(id);
            }
        }
        Err(Error::Unavailable(
            "this node holds no partition yet; retry shortly or ask another node".into(),
        ))
    }

    /// The runtime's tools: those given at start, and what sources (MCP servers) publish.
    pub fn tools(&self) -> &crate::tools::Registry {
        &self.shared.tools
    }

    pub fn store(&self) -> &dyn Store {
        &*self.shared.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Graceful, bounded shutdown: stop accepting work, interrupt drains with reason
    /// `shutdown` (their claims stay, so the next start resumes them), stop the actors, flush
    /// the store and release it. Every call, concurrent ones included, returns only once the store
    /// is released, so the process may open it again at once.
    pub async fn shutdown(&self) {
        if self.shared.shutting_down.swap(true, Ordering::AcqRel) {
            // Another caller runs the shutdown: return when it is complete, not before.
            self.shared.released.cancelled().await;
            return;
        }
        self.shared.stopping.cancel();
        // One deadline for every phase: the whole shutdown, not each phase, is bounded by
        // `shutdown_timeout`.
        let end = tokio::time::Instant::now() + self.shared.limits.shutdown_timeout;
        let left = || {
            end.saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(1))
        };
        let actors: Vec<ActorRef<session::Msg>> =
            self.actors.iter().map(|e| e.value().clone()).collect();
        let interrupts = actors.iter().map(|actor| {
            actor.call(
                |reply| session::Msg::Interrupt(InterruptReason::Shutdown, reply),
                Some(left()),
            )
        });
        let _ = tokio::time::timeout_at(end, futures::future::join_all(interrupts)).await;
        let _ = self
            .registry
            .stop_children_and_wait(Some("shutdown".into()), Some(left()))
            .await;
        let _ = self
            .registry
            .stop_and_wait(Some("shutdown".into()), Some(left()))
            .await;
        self.preparers.stop();
        // The registry may stop before it has processed every child's termination: forget the
        // stopped actors here, so `live()` is exact and their handles are released.
        self.actors.clear();
        self.shared.active.clear();
        let store = self.shared.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
        self.shared.released.cancel();
    }

    /// Stops the actors of sessions this node no longer owns: their drains are interrupted as
    /// by a shutdown (the claim stays for the new owner) and the actors stop. Their writes are
    /// refused already; this stops the work.
    pub(crate) async fn stop_unowned(&self) {
        // Their approvals are the new owner's to time out (its sweep finds them waiting), and
        // their schedules the new owner's to fire (it arms them from the store).
        for (session, _) in self.shared.deadlines.sessions() {
            if !self.owns(&session) {
                self.shared.deadlines.clear(&session);
            }
        }
        self.shared.schedules.retain(|s| self.owns(s));
        let lost: Vec<(SessionId, ActorRef<session::Msg>)> = self
            .actors
            .iter()
            .filter(|e| !self.owns(e.key()))
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        if lost.is_empty() {
            return;
        }
        tracing::warn!(
            sessions = lost.len(),
            "partitions lost: stopping their sessions here"
        );
        let deadline = self.shared.limits.shutdown_timeout;
        let stops = lost.into_iter().map(|(session, actor)| async move {
            let _ = actor
                .call(
                    |reply| session::Msg::Interrupt(InterruptReason::Shutdown, reply),
                    Some(deadline),
                )
                .await;
            actor.stop(Some("partition lost".into()));
            tracing::info!(session_id = %session, "stopped: its partition moved to another node");
        });
        futures::future::join_all(stops).await;
    }

    /// Routes to the session's live actor: the concurrent map first, the registry only when no
    /// live actor is there. `None` for an unknown session, and for a wake the registry keeps
    /// while the session waits for a place. Any other caller waits for that place up to `wait`
    /// (`None`: as long as it takes), as it would for the actor's answer.
    async fn route(
        &self,
        session: &SessionId,
        ask: registry::Ask,
        what: &'static str,
        wait: Option<Duration>,
    ) -> Result<Option<ActorRef<session::Msg>>> {
        if let Some(actor) = self.actors.get(session) {
            return Ok(Some(actor.clone()));
        }
        if !self.owns(session) {
            // In a cluster, another node runs it: no actor here, ever.
            return Err(Error::Unavailable(format!(
                "this node does not own session {session}; another node runs it"
            )));
        }
        let timeout = self.shared.limits.call_timeout;
        match self
            .registry
            .call(
                |reply| registry::Msg::Get(session.clone(), ask, reply),
                Some(timeout),
            )
            .await
        {
            Ok(CallResult::Success(Ok(registry::Placed::Now(actor)))) => Ok(actor),
            Ok(CallResult::Success(Ok(registry::Placed::Later(None)))) => Ok(None),
            Ok(CallResult::Success(Ok(registry::Placed::Later(Some(placed))))) => {
                let placed =
                    match wait {
                        Some(wait) => tokio::time::timeout(wait, placed).await.map_err(|_| {
                            Error::Timeout {
                                session: session.clone(),
                                what,
                            }
                        })?,
                        None => placed.await,
                    };
                // The registry drops the line when it stops.
                placed.unwrap_or_else(|_| Err(self.registry_gone()))
            }
            Ok(CallResult::Success(Err(e))) => Err(e),
            Ok(CallResult::Timeout) => Err(Error::Unavailable("the registry is overloaded".into())),
            _ => Err(self.registry_gone()),
        }
    }

    fn registry_gone(&self) -> Error {
        match self.shared.is_shutting_down() {
            true => Error::ShuttingDown,
            false => Error::Unavailable("the registry stopped".into()),
        }
    }

    /// Sends a request to the session's actor. A message that could not be delivered, or whose
    /// actor stopped before answering (passivation racing the send), is routed again: messages
    /// are idempotent up to their effect, and a stopped actor processed nothing more.
    async fn ask<T: Send + 'static>(
        &self,
        session: &SessionId,
        what: &'static str,
        timeout: Option<Duration>,
        build: impl Fn(RpcReplyPort<T>) -> session::Msg,
    ) -> Result<Option<T>> {
        self.ask_routed(session, registry::Ask::default(), what, timeout, build)
            .await
    }

    /// [`Runtime::ask`], saying what the caller wants of the registry (see `registry::Ask`).
    async fn ask_routed<T: Send + 'static>(
        &self,
        session: &SessionId,
        ask: registry::Ask,
        what: &'static str,
        timeout: Option<Duration>,
        build: impl Fn(RpcReplyPort<T>) -> session::Msg,
    ) -> Result<Option<T>> {
        for _ in 0..3 {
            let Some(actor) = self.route(session, ask, what, timeout).await? else {
                return Ok(None);
            };
            match actor.call(&build, timeout).await {
                Ok(CallResult::Success(value)) => return Ok(Some(value)),
                Ok(CallResult::Timeout) => {
                    return Err(Error::Timeout {
                        session: session.clone(),
                        what,
                    });
                }
                Ok(CallResult::SenderError) | Err(_) => self.retire(session, &actor, what).await?,
            }
        }
        Err(Error::ActorDied(session.clone()))
    }

    /// After a request to `actor` was dropped: removes its routing entry once it has stopped, so
    /// that the next attempt gets a new actor; an error when that cannot be.
    async fn retire(
        &self,
        session: &SessionId,
        actor: &ActorRef<session::Msg>,
        what: &'static str,
    ) -> Result<()> {
        if self.shared.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        // Limits answer with an error, so a dropped request means the actor is going away. Only
        // once it has stopped may its routing entry go, so a new actor never overlaps the old one.
        if !stopped(actor).await {
            return Err(Error::Unavailable(format!(
                "the actor of session {session} did not answer {what}"
            )));
        }
        self.actors
            .remove_if(session, |_, a| a.get_id() == actor.get_id());
        Ok(())
    }
}

/// Waits (briefly) until `actor` has stopped; false if it is still alive after that.
async fn stopped(actor: &ActorRef<session::Msg>) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if actor.get_status() == ractor::ActorStatus::Stopped {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A tool call's whole output, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// The output, or the error when the call failed.
    pub output: String,
    pub failed: bool,
    /// Whether history keeps only a preview of it.
    pub cut: bool,
}

/// The seq of message `message` of `session`: `None` when the id names no message of it (an
/// input, another session's message, nothing); `SessionNotFound` without the session.
pub(crate) fn message_seq(
    snap: &dyn Snapshot,
    session: &SessionId,
    message: &MessageId,
) -> Result<Option<agenthost_model::Seq>> {
    snap.session(session)?
        .ok_or_else(|| Error::SessionNotFound(session.clone()))?;
    Ok(match snap.index(message)? {
        Some(agenthost_model::IndexEntry::Message {
            session: owner,
            seq,
        }) if owner == *session => Some(seq),
        _ => None,
    })
}

/// Reads a settled call's whole output: the events of its step from the message on, up to the
/// call's settlement (a cut output's `ToolOutput` comes just before it, in the same commit).
fn whole_output(
    snap: &dyn Snapshot,
    session: &SessionId,
    message: &MessageId,
    call_id: &str,
) -> Result<ToolOutput> {
    use agenthost_model::{Event, Seq};
    let missing = || Error::NotFound(format!("tool call {call_id} of message {message}"));
    let seq = message_seq(snap, session, message)?.ok_or_else(missing)?;
    const PAGE: usize = 256;
    let mut from = seq;
    let mut whole = None;
    loop {
        let events = snap.events(session, from, PAGE)?;
        for stored in &events {
            match &stored.event {
                Event::ToolOutput {
                    id,
                    call_id: c,
                    output,
                } if id == message && c == call_id => {
                    whole = Some(output.clone());
                }
                Event::ToolSucceeded {
                    id,
                    call_id: c,
                    output,
                    ..
                } if id == message && c == call_id => {
                    return Ok(ToolOutput {
                        cut: whole.is_some(),
                        output: whole.unwrap_or_else(|| output.clone()),
                        failed: false,
                    });
                }
                Event::ToolFailed {
                    id,
                    call_id: c,
                    error,
                } if id == message && c == call_id => {
                    return Ok(ToolOutput {
                        cut: whole.is_some(),
                        output: whole.unwrap_or_else(|| error.clone()),
                        failed: true,
                    });
                }
                _ => {}
            }
        }
        match events.last() {
            Some(last) if events.len() == PAGE => from = Seq(last.seq.0 + 1),
            _ => return Err(missing()),
        }
    }
}
