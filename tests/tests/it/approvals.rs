//! Human approval of tool calls through the runtime (ARCHITECTURE.md, "Approvals"): a call that
//! asks waits without a drain, runs exactly once when approved, gives the model the refusal when
//! denied, expired or withdrawn, and survives restarts in every state; the provider always sees
//! one result for every call.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_actors::{
    Activity, Call, Config, Decide, Error, Executor, Extensions, Hook, OnNewInput, Permission,
    PromptRequest, Runtime, STOPPED_TOOL, Tool, ToolRequest, Tools,
};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_llm::{FinishReason, Request};
use agenthost_model::{Delivery, Event, MessageId, SessionId, Verdict};
use agenthost_store::{Config as StoreConfig, RedbStore, Store};
use futures::future::BoxFuture;

use crate::harness::{self, Harness, text, user_texts};

/// Counts its executions and the idempotency keys it ran with.
#[derive(Debug, Default)]
struct Charge {
    runs: AtomicUsize,
    keys: std::sync::Mutex<Vec<String>>,
}

impl Charge {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Executor for Charge {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.keys.lock().expect("lock").push(call.idempotency_key());
        Box::pin(async { Ok("charged".to_owned()) })
    }
}

#[derive(Debug)]
struct Echo;

impl Executor for Echo {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async move { Ok(format!("echo {}", call.input)) })
    }
}

fn tools(charge: &Arc<Charge>, idempotent: bool) -> Tools {
    let mut tools = Tools::default();
    let mut tool = Tool::new(
        "charge",
        "charges a card",
        serde_json::json!({"type": "object"}),
        charge.clone(),
    );
    tool.idempotent = idempotent;
    tools.register(tool);
    tools.register(Tool::new(
        "echo",
        "echoes",
        serde_json::json!({"type": "object"}),
        Arc::new(Echo),
    ));
    tools
}

/// The default agent asks before `charge`.
fn asking(c: &mut Config) {
    if let Some(agent) = c.agents.get_mut("default") {
        agent.ask = vec!["charge".into()];
    }
}

/// One step that calls `echo` (no approval) and `charge` (asks).
fn two_calls() -> Script {
    Script::new()
        .tool_call("c1", "echo", r#"{"q":1}"#)
        .tool_call("c2", "charge", r#"{"amount": 5, "to": "ann"}"#)
        .finish(FinishReason::ToolCalls)
}

struct Setup {
    h: Harness,
    charge: Arc<Charge>,
    s: SessionId,
}

/// A session whose first step waits for the approval of `c2`.
async fn waiting(scripts: Vec<Script>, tweak: impl FnOnce(&mut Config)) -> Setup {
    let charge = Arc::new(Charge::default());
    let h = Harness::start_with(
        std::iter::once(two_calls()).chain(scripts),
        |c| {
            asking(c);
            tweak(c);
        },
        Extensions {
            tools: tools(&charge, false),
            hooks: Vec::new(),
        },
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "pay ann").await;
    h.idle(&s).await;
    Setup { h, charge, s }
}

/// The results the provider saw in `request`, as `(call id, error?, output)`.
fn results(request: &Request) -> Vec<(String, bool, String)> {
    request
        .messages
        .iter()
        .filter_map(|m| match m {
            agenthost_llm::Message::Tool(r) => {
                Some((r.call_id.clone(), r.is_error, r.output.clone()))
            }
            _ => None,
        })
        .collect()
}

fn decide(approve: bool, digest: &str, by: &str, reason: Option<&str>) -> Decide {
    Decide {
        approve,
        digest: digest.to_owned(),
        reason: reason.map(str::to_owned),
        by: Some(by.to_owned()),
    }
}

/// Approves the call the session waits for, as `ann`, and waits until the session is idle.
async fn approve(h: &Harness, s: &SessionId) {
    let asked = h.runtime.approvals(s).await.expect("approvals").remove(0);
    h.runtime
        .decide(
            s,
            &asked.message,
            "c2",
            decide(true, &asked.digest, "ann", None),
        )
        .await
        .expect("approved");
    h.idle(s).await;
}

async fn wait_for_calls(provider: &Scripted, n: usize) {
    for _ in 0..2000 {
        if provider.calls() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the provider got {} calls, not {n}", provider.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_runs_exactly_once_and_the_model_sees_its_result() {
    let Setup { h, charge, s } = waiting(vec![text("paid")], |_| {}).await;
    // Waiting: the exchange keeps its claim, holds no drain, and nothing ran.
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    assert!(h.row(&s).claim.is_some());
    assert!(h.runtime.active().is_empty());
    assert_eq!((h.provider.calls(), charge.runs()), (1, 0));
    let pending = h.runtime.approvals(&s).await.expect("approvals");
    assert_eq!(pending.len(), 1);
    let asked = &pending[0];
    assert_eq!(
        (asked.call_id.as_str(), asked.name.as_str()),
        ("c2", "charge")
    );
    assert_eq!(
        asked.digest,
        agenthost_actors::digest("charge", &serde_json::json!({"to": "ann", "amount": 5}))
    );
    // The call that needed none ran at once.
    assert!(h.kinds(&s).contains(&"tool_succeeded"));

    let decision = h
        .runtime
        .decide(
            &s,
            &asked.message,
            "c2",
            decide(true, &asked.digest, "ann", None),
        )
        .await
        .expect("approved");
    assert_eq!(decision.verdict, Verdict::Approved);
    assert_eq!(decision.by.as_deref(), Some("ann"));
    h.idle(&s).await;
    assert_eq!((h.provider.calls(), charge.runs()), (2, 1));
    assert_eq!(
        *charge.keys.lock().expect("lock"),
        [format!("{s}/{}/c2", asked.message)]
    );
    let seen = results(&h.provider.requests()[1]);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.contains(&("c2".into(), false, "charged".into())),
        "{seen:?}"
    );
    assert_eq!(h.runtime.activity(&s), Activity::Idle);
    assert!(h.row(&s).claim.is_none());
    let kinds = h.kinds(&s);
    for kind in ["approval_requested", "approval_decided", "tool_started"] {
        assert_eq!(kinds.iter().filter(|k| **k == kind).count(), 1, "{kinds:?}");
    }
    // The decision was single-use: a second one gets the first, and changes nothing.
    let seq = h.row(&s).last_seq;
    let again = h
        .runtime
        .decide(
            &s,
            &asked.message,
            "c2",
            decide(false, &asked.digest, "bob", None),
        )
        .await;
    match again {
        Err(Error::AlreadyDecided { decision, .. }) => {
            assert_eq!(decision.verdict, Verdict::Approved);
            assert_eq!(decision.by.as_deref(), Some("ann"));
        }
        other => panic!("expected AlreadyDecided, got {other:?}"),
    }
    assert_eq!(h.row(&s).last_seq, seq);
    assert_eq!(charge.runs(), 1);
    h.assert_replay_equal();
}

/// A decision made durable whose wake never ran (its caller went away between the two) is woken
/// by the lost-wake sweep, once, and the approved call runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_whose_wake_never_ran_is_woken_by_the_sweep() {
    let Setup { h, charge, s } = waiting(vec![text("paid")], |c| {
        c.limits.wake_sweep = Duration::from_millis(20);
    })
    .await;
    let asked = h.runtime.approvals(&s).await.expect("approvals").remove(0);
    // Decided straight into the store, as `decide` does before its wake.
    h.runtime
        .store()
        .append(s.clone(), vec![approved(&asked.message)])
        .await
        .expect("decided");
    for _ in 0..2000 {
        if charge.runs() > 0 && h.runtime.activity(&s) == Activity::Idle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.idle(&s).await;
    assert_eq!(
        (h.provider.calls(), charge.runs()),
        (2, 1),
        "{:?}",
        h.kinds(&s)
    );
    assert!(h.row(&s).claim.is_none());
    h.assert_replay_equal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_never_runs_and_the_model_learns_who_denied_it_and_why() {
    let Setup { h, charge, s } = waiting(vec![text("ok, not paying")], |_| {}).await;
    let asked = h.runtime.approvals(&s).await.expect("approvals").remove(0);
    h.runtime
        .decide(
            &s,
            &asked.message,
            "c2",
            decide(false, &asked.digest, "bob", Some("over budget")),
        )
        .await
        .expect("denied");
    h.idle(&s).await;
    assert_eq!((h.provider.calls(), charge.runs()), (2, 0));
    let seen = results(&h.provider.requests()[1]);
    let (_, error, text) = seen
        .iter()
        .find(|(id, ..)| id == "c2")
        .expect("a result for c2");
    assert!(*error);
    assert!(text.contains("denied by bob: over budget"), "{text}");
    assert!(!h.kinds(&s).contains(&"tool_started"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_digest_an_unknown_call_and_a_call_that_asked_nothing_change_nothing() {
    let Setup { h, charge, s } = waiting(vec![text("paid")], |_| {}).await;
    let asked = h.runtime.approvals(&s).await.expect("approvals").remove(0);
    let seq = h.row(&s).last_seq;
    let wrong = h
        .runtime
        .decide(
            &s,
            &asked.message,
            "c2",
            decide(true, "sha256:00", "ann", None),
        )
        .await;
    assert!(
        matches!(wrong, Err(Error::DigestMismatch { .. })),
        "{wrong:?}"
    );
    for call in ["c1", "nope"] {
        let missing = h
            .runtime
            .decide(
                &s,
                &asked.message,
                call,
                decide(true, &asked.digest, "ann", None),
            )
            .await;
        assert!(
            matches!(missing, Err(Error::NotFound(_))),
            "{call}: {missing:?}"
        );
    }
    let stranger = MessageId::parse("msg_stranger").expect("id");
    let missing = h
        .runtime
        .decide(
            &s,
            &stranger,
            "c2",
            decide(true, &asked.digest, "ann", None),
        )
        .await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
    assert_eq!(h.row(&s).last_seq, seq, "nothing was written");
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    assert_eq!((h.provider.calls(), charge.runs()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_withdraws_the_approvals_and_the_next_turn_sees_a_valid_transcript() {
    let Setup { h, charge, s } = waiting(vec![text("fine")], |_| {}).await;
    let asked = h.runtime.approvals(&s).await.expect("approvals").remove(0);
    assert!(h.runtime.interrupt(&s).await.expect("interrupt"));
    assert!(h.row(&s).claim.is_none());
    assert!(h.runtime.approvals(&s).await.expect("approvals").is_empty());
    assert_eq!(h.runtime.activity(&s), Activity::Idle);
    // Deciding it now gets the withdrawal.
    let late = h
        .runtime
        .decide(
            &s,
            &asked.message,
            "c2",
            decide(true, &asked.digest, "ann", None),
        )
        .await;
    match late {
        Err(Error::AlreadyDecided { decision, .. }) => {
            assert_eq!(decision.verdict, Verdict::Cancelled)
        }
        other => panic!("expected AlreadyDecided, got {other:?}"),
    }
    h.prompt(&s, "never mind").await;
    h.idle(&s).await;
    assert_eq!((h.provider.calls(), charge.runs()), (2, 0));
    let seen = results(&h.provider.requests()[1]);
    assert_eq!(seen.len(), 2, "every call has exactly one result: {seen:?}");
    assert!(
        seen.iter()
            .any(|(id, error, text)| id == "c2" && *error && text.contains("cancelled"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_nobody_decides_expires_and_the_model_is_told() {
    let Setup { h, charge, s } = waiting(vec![text("it expired")], |c| {
        if let Some(agent) = c.agents.get_mut("default") {
            agent.approval_ttl = Duration::from_millis(300);
        }
    })
    .await;
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    // The runtime's timer wakes the session once the approval expired.
    wait_for_calls(&h.provider, 2).await;
    h.idle(&s).await;
    assert_eq!(charge.runs(), 0);
    let seen = results(&h.provider.requests()[1]);
    assert!(
        seen.iter()
            .any(|(id, error, text)| id == "c2" && *error && text.contains("expired")),
        "{seen:?}"
    );
    let expired = h.log(&s).iter().any(|e| {
        matches!(
            e,
            Event::ApprovalDecided {
                verdict: Verdict::Expired,
                by: None,
                ..
            }
        )
    });
    assert!(expired);
    assert_eq!(h.runtime.activity(&s), Activity::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_input_waits_behind_the_approvals_and_joins_the_exchange_once_decided() {
    let Setup { h, charge, s } = waiting(vec![text("paid, and noted")], |_| {}).await;
    h.prompt(&s, "also say thanks").await;
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 1, "the input waits: nothing ran");
    assert_eq!(h.row(&s).pending, 1);
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    approve(&h, &s).await;
    assert_eq!((h.provider.calls(), charge.runs()), (2, 1));
    let second = &h.provider.requests()[1];
    assert!(user_texts(second).contains(&"also say thanks".to_owned()));
    assert_eq!(results(second).len(), 2);
    assert_eq!(h.row(&s).pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_new_input_deny_a_steer_withdraws_the_approvals_and_is_answered() {
    let Setup { h, charge, s } = waiting(vec![text("stopped")], |c| {
        if let Some(agent) = c.agents.get_mut("default") {
            agent.on_new_input = OnNewInput::Deny;
        }
    })
    .await;
    // A queued input does not withdraw anything: it waits.
    let mut queued = PromptRequest::new(&s, "later");
    queued.delivery = Delivery::Queue;
    h.runtime.prompt(queued).await.expect("admitted");
    h.idle(&s).await;
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    h.provider.push(text("and later"));
    h.prompt(&s, "stop, do not pay").await;
    h.idle(&s).await;
    assert_eq!(charge.runs(), 0);
    assert_eq!(
        h.provider.calls(),
        3,
        "the steer's step, then the queued input's"
    );
    let second = &h.provider.requests()[1];
    assert!(user_texts(second).contains(&"stop, do not pay".to_owned()));
    assert!(!user_texts(second).contains(&"later".to_owned()));
    let seen = results(second);
    assert!(
        seen.iter()
            .any(|(id, error, text)| id == "c2" && *error && text.contains("new input arrived"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_holds_no_drain_slot() {
    let charge = Arc::new(Charge::default());
    let h = Harness::start_with(
        [two_calls(), text("other answered")],
        |c| {
            asking(c);
            c.limits.concurrent_drains = 1;
        },
        Extensions {
            tools: tools(&charge, false),
            hooks: Vec::new(),
        },
    )
    .await;
    let (a, b) = (h.session().await, h.session().await);
    h.prompt(&a, "pay ann").await;
    h.idle(&a).await;
    assert_eq!(h.runtime.activity(&a), Activity::Waiting);
    h.prompt(&b, "hello").await;
    h.idle(&b).await;
    assert_eq!(h.provider.calls(), 2);
    assert!(h.row(&b).claim.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_and_compaction_leave_pending_approvals_intact() {
    let Setup { h, charge, s } = waiting(vec![text("a summary of sorts")], |_| {}).await;
    let answer = h.runtime.generate(&s, "what is pending?").await;
    assert!(answer.is_ok(), "{answer:?}");
    let seen = results(&h.provider.requests()[1]);
    assert!(
        seen.iter()
            .any(|(id, error, text)| id == "c2" && *error && text.contains("approval")),
        "generate sees one result for the held call: {seen:?}"
    );
    let compacted = h.runtime.compact(&s).await;
    assert!(matches!(compacted, Err(Error::Busy(_))), "{compacted:?}");
    assert_eq!(h.runtime.approvals(&s).await.expect("approvals").len(), 1);
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    assert_eq!(charge.runs(), 0);
}

#[derive(Debug)]
struct Policy;

impl Hook for Policy {
    fn permission(&self, call: &ToolRequest<'_>) -> Option<Permission> {
        match call.name {
            "echo" if call.input["q"] == 2 => Some(Permission::Deny("q=2 is off limits".into())),
            "echo" => Some(Permission::Ask),
            // No opinion: the agent's patterns decide.
            _ => None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_decides_per_call_before_the_patterns() {
    let charge = Arc::new(Charge::default());
    let script = Script::new()
        .tool_call("c1", "echo", r#"{"q":1}"#)
        .tool_call("c2", "echo", r#"{"q":2}"#)
        .tool_call("c3", "charge", r#"{}"#)
        .finish(FinishReason::ToolCalls);
    let h = Harness::start_with(
        [script],
        |_| {},
        Extensions {
            tools: tools(&charge, false),
            hooks: vec![Arc::new(Policy) as Arc<dyn Hook>],
        },
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    let pending = h.runtime.approvals(&s).await.expect("approvals");
    assert_eq!(
        pending
            .iter()
            .map(|p| p.call_id.as_str())
            .collect::<Vec<_>>(),
        ["c1"]
    );
    assert_eq!(charge.runs(), 1, "no `ask` pattern: charge ran");
    let denied = h.log(&s).into_iter().find_map(|e| match e {
        Event::ToolFailed { call_id, error, .. } if call_id == "c2" => Some(error),
        _ => None,
    });
    assert_eq!(
        denied.as_deref(),
        Some("permission denied: q=2 is off limits")
    );
}

// ---------------------------------------------------------------------------------------------
// Restarts: the approval and the call's exactly-once survive a stop in every state.

async fn start(dir: &Path, provider: Arc<Scripted>, tools: Tools) -> Runtime {
    start_with_ttl(dir, provider, tools, agenthost_actors::DEFAULT_APPROVAL_TTL).await
}

async fn start_with_ttl(
    dir: &Path,
    provider: Arc<Scripted>,
    tools: Tools,
    ttl: Duration,
) -> Runtime {
    let mut config = harness::config(dir, provider);
    asking(&mut config);
    if let Some(agent) = config.agents.get_mut("default") {
        agent.approval_ttl = ttl;
    }
    let runtime = Runtime::start_with(
        config,
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await
    .expect("start");
    runtime.recovered().await;
    runtime
}

/// A runtime over `dir` whose session waits for the approval of `c2`; stopped.
async fn stopped_while_waiting(dir: &Path, charge: &Arc<Charge>) -> (SessionId, MessageId, String) {
    stopped_waiting_for(dir, charge, agenthost_actors::DEFAULT_APPROVAL_TTL).await
}

/// [`stopped_while_waiting`], its approvals expiring after `ttl`.
async fn stopped_waiting_for(
    dir: &Path,
    charge: &Arc<Charge>,
    ttl: Duration,
) -> (SessionId, MessageId, String) {
    let provider = Arc::new(Scripted::new([two_calls()]));
    let runtime = start_with_ttl(dir, provider, tools(charge, false), ttl).await;
    let s = runtime
        .create_session(Default::default())
        .await
        .expect("session")
        .id;
    runtime
        .prompt(PromptRequest::new(&s, "pay ann"))
        .await
        .expect("admitted");
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    let asked = runtime.approvals(&s).await.expect("approvals").remove(0);
    runtime.shutdown().await;
    (s, asked.message, asked.digest)
}

/// Appends `events` to the stopped store in `dir`, as a process that stopped right after them
/// would have left it.
async fn append(dir: &Path, s: &SessionId, events: Vec<Event>) {
    let store = RedbStore::open(StoreConfig::new(dir.join("store.redb"))).expect("store");
    store.append(s.clone(), events).await.expect("appended");
    store.close();
}

fn approved(message: &MessageId) -> Event {
    Event::ApprovalDecided {
        id: message.clone(),
        call_id: "c2".into(),
        verdict: Verdict::Approved,
        by: Some("ann".into()),
        reason: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_approval_and_the_approved_call_then_runs_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let charge = Arc::new(Charge::default());
    let (s, message, digest) = stopped_while_waiting(dir.path(), &charge).await;
    let provider = Arc::new(Scripted::new([text("paid")]));
    let runtime = start(dir.path(), provider.clone(), tools(&charge, false)).await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(
        runtime.activity(&s),
        Activity::Waiting,
        "the boot sweep found it waiting"
    );
    assert_eq!(provider.calls(), 0, "a restart runs nothing while it waits");
    let kinds: Vec<&str> = runtime
        .snapshot()
        .expect("snap")
        .events(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events")
        .iter()
        .map(|e| e.event.kind())
        .collect();
    assert!(!kinds.contains(&"recovery_attempted"), "{kinds:?}");
    runtime
        .decide(&s, &message, "c2", decide(true, &digest, "ann", None))
        .await
        .expect("approved");
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!((provider.calls(), charge.runs()), (1, 1));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_approved_before_a_crash_and_never_started_runs_once_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let charge = Arc::new(Charge::default());
    let (s, message, _) = stopped_while_waiting(dir.path(), &charge).await;
    // Decided, and the process died before the wake ran anything.
    append(dir.path(), &s, vec![approved(&message)]).await;
    let provider = Arc::new(Scripted::new([text("paid")]));
    let runtime = start(dir.path(), provider.clone(), tools(&charge, false)).await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!((provider.calls(), charge.runs()), (1, 1));
    let seen = results(&provider.requests()[0]);
    assert!(
        seen.contains(&("c2".into(), false, "charged".into())),
        "{seen:?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_a_crash_cut_follows_the_crash_rule() {
    // Not idempotent: reported as "may or may not have taken effect", never run again.
    let dir = tempfile::tempdir().expect("tempdir");
    let charge = Arc::new(Charge::default());
    let (s, message, _) = stopped_while_waiting(dir.path(), &charge).await;
    let started = Event::ToolStarted {
        id: message.clone(),
        call_id: "c2".into(),
    };
    append(dir.path(), &s, vec![approved(&message), started.clone()]).await;
    let provider = Arc::new(Scripted::new([text("told the user")]));
    let runtime = start(dir.path(), provider.clone(), tools(&charge, false)).await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!((provider.calls(), charge.runs()), (1, 0));
    let seen = results(&provider.requests()[0]);
    assert!(
        seen.contains(&("c2".into(), true, STOPPED_TOOL.into())),
        "{seen:?}"
    );
    runtime.shutdown().await;

    // Idempotent: run again with the same key.
    let dir = tempfile::tempdir().expect("tempdir");
    let charge = Arc::new(Charge::default());
    let (s, message, _) = stopped_while_waiting(dir.path(), &charge).await;
    let started = Event::ToolStarted {
        id: message.clone(),
        call_id: "c2".into(),
    };
    append(dir.path(), &s, vec![approved(&message), started]).await;
    let provider = Arc::new(Scripted::new([text("paid")]));
    let runtime = start(dir.path(), provider.clone(), tools(&charge, true)).await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!((provider.calls(), charge.runs()), (1, 1));
    assert_eq!(
        *charge.keys.lock().expect("lock"),
        [format!("{s}/{message}/c2")]
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_that_expired_while_no_process_ran_is_settled_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let charge = Arc::new(Charge::default());
    let (s, _, _) = stopped_waiting_for(dir.path(), &charge, Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let provider = Arc::new(Scripted::new([text("it expired")]));
    let runtime = start(dir.path(), provider.clone(), tools(&charge, false)).await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!((provider.calls(), charge.runs()), (1, 0));
    let seen = results(&provider.requests()[0]);
    assert!(
        seen.iter()
            .any(|(id, error, text)| id == "c2" && *error && text.contains("expired"))
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passivated_waiting_session_keeps_its_approval_and_runs_once_decided() {
    let Setup { h, charge, s } = waiting(vec![text("paid")], |c| {
        c.passivate_after = Duration::from_millis(5);
    })
    .await;
    for _ in 0..2000 {
        if h.runtime.live() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        h.runtime.live(),
        0,
        "the waiting session's actor passivated"
    );
    assert_eq!(h.runtime.activity(&s), Activity::Waiting);
    approve(&h, &s).await;
    assert_eq!((h.provider.calls(), charge.runs()), (2, 1));
}
