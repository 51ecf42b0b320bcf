//! `generate`: the pool of stateless preparer actors that turn a session snapshot into a transient
//! `generate` request. They read one redb snapshot and never send anything to a session actor, so
//! `generate` neither waits for nor disturbs a running drain.
//!
//! A preparer only prepares; the provider call happens in the caller's task, so a slow model
//! never occupies a preparer's mailbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agenthost_model::history::Mode;
use agenthost_model::{Message, Seq, SessionId};
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::error::panic_message;
use crate::error::{Error, Result};
use crate::hooks::Purpose;
use crate::instructions;
use crate::mint;
use crate::prepare::{Inputs, Prepared, prepare};
use crate::shared::Shared;

#[derive(Debug)]
pub(crate) enum Msg {
    Prepare {
        session: SessionId,
        prompt: String,
        reply: RpcReplyPort<Result<Prepared>>,
    },
}

#[derive(Debug)]
pub(crate) struct Preparer;

impl Actor for Preparer {
    type Msg = Msg;
    type State = Arc<Shared>;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Msg>,
        shared: Arc<Shared>,
    ) -> Result<Arc<Shared>, ActorProcessingErr> {
        Ok(shared)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Msg>,
        msg: Msg,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        let Msg::Prepare {
            session,
            prompt,
            reply,
        } = msg;
        // The snapshot read and request build are blocking work: keep them off the async
        // workers. A panicking hook becomes this request's error, not the preparer's death.
        let shared = shared.clone();
        let result = tokio::task::spawn_blocking(move || build(&shared, &session, &prompt))
            .await
            .unwrap_or_else(|e| match e.try_into_panic() {
                Ok(panic) => Err(Error::Panicked(panic_message(&panic))),
                Err(e) => Err(Error::Unavailable(e.to_string())),
            });
        let _ = reply.send(result);
        Ok(())
    }
}

/// One snapshot: the session, its settled history after the latest compaction (pending inputs
/// are not history; it stops before an unsettled assistant message), then the shared
/// preparation with tool calls forbidden and the caller's prompt appended.
fn build(shared: &Shared, session: &SessionId, prompt: &str) -> Result<Prepared> {
    let snap = shared.store.snapshot()?;
    let (row, mut history) = snap
        .history(session, Mode::Settled)?
        .ok_or_else(|| Error::SessionNotFound(session.clone()))?;
    let told = snap.instructions(session)?;
    drop(snap);
    // Instructions are resolved read-only; a change reaches this request only, never the store.
    let resolved = instructions::resolve(&shared.instructions, &shared.hooks, session);
    match instructions::diff(&resolved, &told) {
        Ok(None) => {}
        Ok(Some(change)) => history.messages.push(Message::System {
            id: mint::message_id(),
            seq: Seq(row.last_seq.0 + 1),
            text: change.text,
            time: row.updated,
        }),
        Err(source) => {
            return Err(Error::Unavailable(format!(
                "instruction source {source:?} has no value yet"
            )));
        }
    }
    let tools = shared.tools.current();
    let inputs = Inputs::of(shared, &tools, &row, &history, 1, Purpose::Generate);
    let prepared = prepare(inputs, Some(prompt))?;
    // A transient call is no part of a turn: it counts against the session's life budget.
    if let Some(exceeded) = prepared.over_life_budget(agenthost_model::Spend::default()) {
        return Err(exceeded.into());
    }
    let window = u64::from(prepared.model.context_window);
    if prepared.estimated_tokens > window {
        return Err(Error::ContextOverflow(format!(
            "session {session}: about {} tokens do not fit the {window}-token context window of {}",
            prepared.estimated_tokens, prepared.model.model
        )));
    }
    Ok(prepared)
}

/// A fixed set of preparers. Each request goes to the least busy one, so a slow preparation
/// (a large history, a slow hook) holds up only the requests already given to its worker; the
/// requests waiting in the pool are bounded, and a request that is not prepared within the
/// runtime's call timeout fails as unavailable.
#[derive(Debug)]
pub(crate) struct Pool {
    workers: Vec<(ActorRef<Msg>, Arc<AtomicUsize>)>,
    /// Requests given to a worker and not answered yet, across the pool.
    in_flight: Arc<AtomicUsize>,
    /// Most requests the pool holds at once; more are refused as unavailable.
    bound: usize,
    timeout: std::time::Duration,
}

/// Counts one request in, and out again when dropped (answered, failed or abandoned).
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn add(counter: &Arc<AtomicUsize>) -> (Counted, usize) {
        let before = counter.fetch_add(1, Ordering::AcqRel);
        (Counted(counter.clone()), before)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Requests the pool holds per worker before it refuses more.
const QUEUE_PER_WORKER: usize = 64;

impl Pool {
    pub(crate) async fn start(shared: Arc<Shared>, size: usize) -> Result<Pool> {
        let mut workers = Vec::with_capacity(size.max(1));
        for _ in 0..size.max(1) {
            let (worker, _) = Actor::spawn(None, Preparer, shared.clone())
                .await
                .map_err(|e| Error::Unavailable(format!("cannot start a preparer: {e}")))?;
            workers.push((worker, Arc::new(AtomicUsize::new(0))));
        }
        let bound = workers.len() * QUEUE_PER_WORKER;
        Ok(Pool {
            workers,
            in_flight: Arc::new(AtomicUsize::new(0)),
            bound,
            timeout: shared.limits.call_timeout,
        })
    }

    pub(crate) async fn prepare(&self, session: &SessionId, prompt: &str) -> Result<Prepared> {
        let (_pooled, before) = Counted::add(&self.in_flight);
        if before >= self.bound {
            return Err(Error::Unavailable(format!(
                "generate is overloaded: {before} requests are being prepared"
            )));
        }
        let (worker, load) = self
            .workers
            .iter()
            .min_by_key(|(_, load)| load.load(Ordering::Acquire))
            .expect("invariant: the pool has at least one worker");
        let (_queued, _) = Counted::add(load);
        let call = worker.call(
            |reply| Msg::Prepare {
                session: session.clone(),
                prompt: prompt.to_owned(),
                reply,
            },
            Some(self.timeout),
        );
        match call.map(|r| r.map_err(|_| ())).await {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            Ok(ractor::rpc::CallResult::Timeout) => Err(Error::Unavailable(format!(
                "preparing the request took longer than {:?}",
                self.timeout
            ))),
            _ => Err(Error::Unavailable("the preparer pool stopped".into())),
        }
    }

    pub(crate) fn stop(&self) {
        for (worker, _) in &self.workers {
            worker.stop(Some("shutdown".into()));
        }
    }
}
