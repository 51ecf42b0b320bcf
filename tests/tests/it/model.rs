//! A model-based test of the runtime: random sequences of prompt (some answered with a call to
//! a tool that panics, some with a call that waits for approval), wake, resume, wait, interrupt,
//! generate, approve, deny, expire, drain panic, passivation and runtime restart, checked against
//! a reference of what was admitted. Invariants: at most one drain per session at any moment,
//! every admitted input is promoted exactly once, every resume is answered (never left hanging),
//! and no approved call ever runs twice.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthost_actors::{
    Activity, Call, CreateSession, Executor, Extensions, Hook, Live, PromptRequest, RequestContext,
    Runtime, Tool, Tools,
};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_llm::{FinishReason, Request};
use agenthost_model::{Delivery, Event, MessageId, Seq, SessionId};
use futures::future::BoxFuture;
use proptest::prelude::*;
use tokio::task::JoinHandle;

use crate::harness;

#[derive(Debug, Clone)]
enum Op {
    Prompt {
        session: usize,
        queue: bool,
        resume: bool,
        /// The model answers this input with a call to a tool that panics.
        tool: bool,
        /// The model answers this input with a call that waits for approval.
        asks: bool,
    },
    Wake(usize),
    Resume(usize),
    /// Waits for idle beside whatever runs, across restarts too.
    Wait(usize),
    Interrupt(usize),
    Panic(usize),
    /// A transient call beside whatever runs.
    Generate(usize),
    Restart,
    Pause,
    /// Decides every approval the session waits for.
    Decide(usize, bool),
    /// Waits past the approvals' time to live.
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..2, any::<bool>(), any::<bool>(), 0..10u8)
            .prop_map(|(session, queue, resume, n)| Op::Prompt {
                session, queue, resume, tool: n < 2, asks: (2..5).contains(&n),
            }),
        2 => (0usize..2).prop_map(Op::Wake),
        2 => (0usize..2).prop_map(Op::Resume),
        2 => (0usize..2).prop_map(Op::Wait),
        2 => (0usize..2).prop_map(Op::Interrupt),
        1 => (0usize..2).prop_map(Op::Panic),
        1 => (0usize..2).prop_map(Op::Generate),
        1 => Just(Op::Restart),
        2 => Just(Op::Pause),
        3 => (0usize..2, any::<bool>()).prop_map(|(s, approve)| Op::Decide(s, approve)),
        1 => Just(Op::Expire),
    ]
}

/// An input the model answers with a call to the `pay` tool, which waits for approval.
const ASK_TOOL: &str = "pay with approval";

/// How long an approval waits before it expires.
const APPROVAL_TTL: Duration = Duration::from_millis(40);

/// Counts `pay`'s executions by idempotency key: an approved call runs at most once.
#[derive(Debug, Default)]
struct Pay(Mutex<BTreeMap<String, usize>>);

impl Executor for Pay {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(call.idempotency_key())
            .or_default() += 1;
        Box::pin(async { Ok("paid".to_owned()) })
    }
}

/// An input the model answers with a call to the `panics` tool.
const PANIC_TOOL: &str = "use the tool with a bug";

#[derive(Debug)]
struct Panics;
impl Executor for Panics {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async { panic!("injected tool panic") })
    }
}

/// Panics in the next request prepared for an armed session.
#[derive(Debug, Default)]
struct PanicOnce {
    armed: Mutex<HashSet<SessionId>>,
}

impl Hook for PanicOnce {
    fn on_request(&self, ctx: &RequestContext, _request: &mut Request) {
        let armed = self
            .armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ctx.session);
        if armed {
            panic!("injected drain panic");
        }
    }
}

struct World {
    dir: tempfile::TempDir,
    runtime: Runtime,
    hook: Arc<PanicOnce>,
    pay: Arc<Pay>,
    sessions: Vec<SessionId>,
    /// Drains running per session, from live status events; never above one.
    monitor: Monitor,
}

/// Counts drains running per session from live status events and fails if one ever has two.
/// Joined (not aborted) when its runtime stops, so a violation fails the test.
struct Monitor {
    task: JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Monitor {
    fn start(mut events: tokio::sync::broadcast::Receiver<Arc<(SessionId, Live)>>) -> Monitor {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut running: BTreeMap<SessionId, i32> = BTreeMap::new();
            let mut check = |event: &(SessionId, Live)| {
                if let Live::Status(activity) = event.1 {
                    let n = running.entry(event.0.clone()).or_default();
                    *n += if activity == Activity::Running { 1 } else { -1 };
                    assert!(*n <= 1, "two drains at once in {}", event.0);
                }
            };
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    event = events.recv() => match event {
                        Ok(event) => check(&event),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            panic!("the monitor missed {n} live events; its counts are lost")
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
            // What was published before the stop is still checked.
            while let Ok(event) = events.try_recv() {
                check(&event);
            }
        });
        Monitor { task, stop }
    }

    /// Stops the monitor and fails the test if it saw two drains of one session at once.
    async fn join(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => panic!("the monitor did not finish: {e}"),
            }
        }
    }
}

async fn start(
    dir: tempfile::TempDir,
    hook: Arc<PanicOnce>,
    pay: Arc<Pay>,
) -> (Runtime, Monitor, tempfile::TempDir) {
    // Every request gets a short answer after a little real time, so interrupts land mid-drain;
    // a request whose newest message is a tool-asking input gets a call to a tool that panics.
    let provider = Arc::new(Scripted::from_fn(|request: &Request| {
        let script = Script::new().delay(Duration::from_millis(2));
        Some(match request.messages.last() {
            Some(agenthost_llm::Message::User { text, .. }) if text.contains(PANIC_TOOL) => script
                .tool_call("p", "panics", "{}")
                .finish(FinishReason::ToolCalls),
            Some(agenthost_llm::Message::User { text, .. }) if text.contains(ASK_TOOL) => script
                .tool_call("a", "pay", r#"{"amount": 1}"#)
                .finish(FinishReason::ToolCalls),
            _ => script.text("ok").finish(FinishReason::Stop),
        })
    }));
    let mut config = harness::config(dir.path(), provider);
    // Small enough that resumes and waits hit the waiter limit, and that idle actors passivate
    // between operations.
    config.limits.waiters_per_session = 3;
    config.passivate_after = Duration::from_millis(5);
    if let Some(agent) = config.agents.get_mut("default") {
        agent.ask = vec!["pay".into()];
        agent.approval_ttl = APPROVAL_TTL;
    }
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "pay",
        "pays, once approved",
        serde_json::json!({"type": "object"}),
        pay,
    ));
    tools.register(Tool::new(
        "panics",
        "a tool with a bug",
        serde_json::json!({"type": "object"}),
        Arc::new(Panics),
    ));
    let extensions = Extensions {
        tools,
        hooks: vec![hook as Arc<dyn Hook>],
    };
    let runtime = Runtime::start_with(config, extensions)
        .await
        .expect("start");
    let monitor = Monitor::start(runtime.subscribe());
    (runtime, monitor, dir)
}

async fn run(ops: Vec<Op>) {
    let hook = Arc::new(PanicOnce::default());
    let pay = Arc::new(Pay::default());
    let (runtime, monitor, dir) = start(
        tempfile::tempdir().expect("tempdir"),
        hook.clone(),
        pay.clone(),
    )
    .await;
    let mut sessions = Vec::new();
    for _ in 0..2 {
        sessions.push(
            runtime
                .create_session(CreateSession::default())
                .await
                .expect("session")
                .id,
        );
    }
    let mut w = World {
        dir,
        runtime,
        hook,
        pay,
        sessions,
        monitor,
    };
    let mut admitted: Vec<(SessionId, MessageId)> = Vec::new();
    let mut resumes: Vec<JoinHandle<agenthost_actors::Result<agenthost_actors::Outcome>>> =
        Vec::new();
    let mut others: Vec<JoinHandle<()>> = Vec::new();
    let mut panics = 0;
    for op in ops {
        match op {
            Op::Prompt {
                session,
                queue,
                resume,
                tool,
                asks,
            } => {
                let s = &w.sessions[session];
                let text = match (tool, asks) {
                    (true, _) => PANIC_TOOL,
                    (_, true) => ASK_TOOL,
                    _ => "work",
                };
                let mut request = PromptRequest::new(s, text);
                request.delivery = if queue {
                    Delivery::Queue
                } else {
                    Delivery::Steer
                };
                request.resume = resume;
                let receipt = w.runtime.prompt(request).await.expect("admitted");
                admitted.push((s.clone(), receipt.id));
            }
            Op::Wake(session) => w.runtime.wake(&w.sessions[session]).await.expect("wake"),
            Op::Resume(session) => {
                let (r, s) = (w.runtime.clone(), w.sessions[session].clone());
                resumes.push(tokio::spawn(async move { r.resume(&s).await }));
            }
            Op::Wait(session) => {
                let (r, s) = (w.runtime.clone(), w.sessions[session].clone());
                others.push(tokio::spawn(async move {
                    // Idle, over the waiter limit, or shut down: any answer, never a hang.
                    let _ = r.wait_idle(&s, Duration::from_secs(5)).await;
                }));
            }
            Op::Interrupt(session) => {
                w.runtime
                    .interrupt(&w.sessions[session])
                    .await
                    .expect("interrupt");
            }
            Op::Panic(session) if panics < 3 => {
                panics += 1;
                let s = w.sessions[session].clone();
                w.hook
                    .armed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(s.clone());
                w.runtime.wake(&s).await.expect("wake");
            }
            Op::Panic(_) => {}
            Op::Generate(session) => {
                let (r, s) = (w.runtime.clone(), w.sessions[session].clone());
                others.push(tokio::spawn(async move {
                    // Any answer will do (a refusal, a shutdown); it must not hang.
                    let _ = r.generate(&s, "peek").await;
                }));
            }
            Op::Restart => {
                w.runtime.shutdown().await;
                w.monitor.join().await;
                let (runtime, monitor, dir) = start(w.dir, w.hook.clone(), w.pay.clone()).await;
                w = World {
                    dir,
                    runtime,
                    hook: w.hook,
                    pay: w.pay,
                    sessions: w.sessions,
                    monitor,
                };
            }
            Op::Pause => tokio::time::sleep(Duration::from_millis(3)).await,
            Op::Decide(session, approve) => {
                decide_all(&w.runtime, &w.sessions[session], approve).await;
            }
            Op::Expire => tokio::time::sleep(APPROVAL_TTL + Duration::from_millis(10)).await,
        }
    }
    // Every generate ends, whatever its answer.
    for other in others {
        tokio::time::timeout(Duration::from_secs(30), other)
            .await
            .expect("a call was left hanging")
            .expect("joined");
    }
    // Every resume is answered, with an outcome or an error, never left hanging.
    for resume in resumes {
        tokio::time::timeout(Duration::from_secs(30), resume)
            .await
            .expect("a resume was left hanging")
            .expect("joined")
            .ok();
    }
    // A last restart: recovery picks up whatever is claimed or pending; then everything settles.
    w.hook
        .armed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    w.runtime.shutdown().await;
    w.monitor.join().await;
    let (runtime, monitor, dir) = start(w.dir, w.hook.clone(), w.pay.clone()).await;
    runtime.recovered().await;
    for s in &w.sessions {
        settle(&runtime, s).await;
    }
    // Recovery ran every input that asked for a wake; what it left pending was admitted with
    // `resume: false` and waits for a wake that comes for another reason.
    let snap = runtime.snapshot().expect("snapshot");
    for s in &w.sessions {
        let left = snap.pending(s).expect("pending");
        assert!(
            left.iter().all(|input| !input.wake),
            "{s}: recovery left input that asked for a wake: {left:?}"
        );
    }
    drop(snap);
    for s in &w.sessions {
        runtime.wake(s).await.expect("wake");
        settle(&runtime, s).await;
    }
    let snap = runtime.snapshot().expect("snapshot");
    for s in &w.sessions {
        let row = snap.session(s).expect("read").expect("row");
        assert_eq!(row.pending, 0, "{s} kept pending input: {row:?}");
        assert!(row.claim.is_none(), "{s} still claimed");
        // Every admitted input is answered or explicitly failed: the session owes nothing.
        let messages = snap.messages(s, Seq::ZERO, usize::MAX).expect("messages");
        let policy = agenthost_model::Policy {
            max_steps: 25,
            max_attempts: 10,
        };
        let owed = agenthost_model::owed(&row, &messages, &policy);
        assert!(
            matches!(
                owed,
                agenthost_model::Owed::Nothing | agenthost_model::Owed::Halted
            ),
            "{s} still owes {owed:?}; its log: {:#?}",
            snap.events(s, Seq::ZERO, usize::MAX)
                .expect("events")
                .iter()
                .map(|e| format!("{:?}", e.event))
                .collect::<Vec<_>>()
        );
    }
    // Queued input waited out every open exchange, restarts and panics included.
    for s in &w.sessions {
        let events = snap.events(s, Seq::ZERO, usize::MAX).expect("events");
        if let Err(at) = queue_waits_for_the_open_exchange(&events, 25) {
            panic!(
                "{s}: event {at} promoted a queued input into an open exchange: {:#?}",
                events
                    .iter()
                    .map(|e| format!("{} {:?}", e.seq, e.event))
                    .collect::<Vec<_>>()
            );
        }
    }
    let mut promoted: BTreeMap<MessageId, usize> = BTreeMap::new();
    for s in &w.sessions {
        for stored in snap.events(s, Seq::ZERO, usize::MAX).expect("events") {
            if let Event::PromptPromoted { id } = stored.event {
                *promoted.entry(id).or_default() += 1;
            }
        }
    }
    for (_, id) in &admitted {
        assert_eq!(
            promoted.get(id),
            Some(&1),
            "{id} promoted {:?} times",
            promoted.get(id)
        );
    }
    assert_eq!(promoted.len(), admitted.len());
    // No approved call ran twice, and every one that reported success ran.
    let runs = w.pay.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(runs.values().all(|n| *n == 1), "a call ran twice: {runs:?}");
    for s in &w.sessions {
        for stored in snap.events(s, Seq::ZERO, usize::MAX).expect("events") {
            if let Event::ToolSucceeded {
                id,
                call_id,
                output,
                ..
            } = &stored.event
                && output == "paid"
            {
                let key = format!("{s}/{id}/{call_id}");
                assert_eq!(
                    runs.get(&key),
                    Some(&1),
                    "{key} succeeded without running once"
                );
            }
        }
    }
    runtime.shutdown().await;
    monitor.join().await;
    drop(dir);
}

/// Waits until the session is idle, denying whatever it waits for on the way: nothing waits
/// forever.
async fn settle(runtime: &Runtime, s: &SessionId) {
    loop {
        runtime
            .wait_idle(s, Duration::from_secs(30))
            .await
            .expect("idle");
        if runtime.approvals(s).await.expect("approvals").is_empty() {
            return;
        }
        decide_all(runtime, s, false).await;
    }
}

/// Decides every approval the session waits for; a decision something else made first (the
/// expiry, an interrupt) is an answer too.
async fn decide_all(runtime: &Runtime, s: &SessionId, approve: bool) {
    let Ok(pending) = runtime.approvals(s).await else {
        return;
    };
    for approval in pending {
        let decide = agenthost_actors::Decide {
            approve,
            digest: approval.digest.clone(),
            reason: None,
            by: Some("model test".into()),
        };
        match runtime
            .decide(s, &approval.message, &approval.call_id, decide)
            .await
        {
            Ok(_) | Err(agenthost_actors::Error::AlreadyDecided { .. }) => {}
            Err(e) => panic!("deciding {approval:?}: {e}"),
        }
    }
}

/// The queue law read off a session's log: a queued input is promoted only when no exchange is
/// open. An exchange opens with a promotion and ends with a step that owes no continuation (no
/// tool called, the step limit, a filtered answer), a failed execution or a user's interrupt; a
/// shutdown, a crash or a panic ends none. `Err` holds the seq of the promotion that broke it.
fn queue_waits_for_the_open_exchange(
    events: &[agenthost_model::Stored],
    max_steps: u32,
) -> Result<(), u64> {
    use agenthost_model::{Finish, InterruptReason};
    let mut queued: HashSet<MessageId> = HashSet::new();
    let mut steps: BTreeMap<MessageId, (u32, bool)> = BTreeMap::new();
    let mut open = false;
    for stored in events {
        match &stored.event {
            Event::PromptAdmitted {
                id,
                delivery: Delivery::Queue,
                ..
            } => {
                queued.insert(id.clone());
            }
            Event::PromptPromoted { id } => {
                if open && queued.contains(id) {
                    return Err(stored.seq.0);
                }
                open = true;
            }
            Event::StepStarted { id, step, .. } => {
                steps.insert(id.clone(), (*step, false));
            }
            Event::ToolCalled { id, .. } => {
                if let Some(step) = steps.get_mut(id) {
                    step.1 = true;
                }
            }
            Event::StepEnded { id, finish, .. } => {
                let (step, called) = steps.get(id).copied().unwrap_or((0, false));
                let continues =
                    called && step < max_steps && !matches!(finish, Finish::ContentFilter);
                if !continues {
                    open = false;
                }
            }
            Event::ExecutionFailed { .. }
            | Event::ExecutionInterrupted {
                reason: InterruptReason::User,
            } => open = false,
            _ => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12), ..ProptestConfig::default() })]
    #[test]
    fn runtime_matches_the_reference(ops in proptest::collection::vec(op(), 1..25)) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(run(ops));
    }
}
