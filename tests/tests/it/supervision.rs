//! Supervision and passivation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_actors::{Extensions, Hook, RequestContext, Runtime};
use agenthost_llm::Request;
use agenthost_llm::scripted::Scripted;

use crate::harness::{self, Harness, text};

/// Panics in the first `times` request preparations.
#[derive(Debug)]
struct PanicOnRequest {
    left: AtomicUsize,
}

impl Hook for PanicOnRequest {
    fn on_request(&self, _ctx: &RequestContext, _request: &mut Request) {
        if self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("hook exploded");
        }
    }
}

fn panicking(times: usize) -> Extensions {
    Extensions {
        tools: Default::default(),
        hooks: vec![Arc::new(PanicOnRequest {
            left: AtomicUsize::new(times),
        })],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_drain_restarts_the_actor_and_owed_work_continues() {
    let h = Harness::start_with([text("made it")], |_| {}, panicking(1)).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let result = h.runtime.resume(&s).await;
    assert!(
        matches!(result, Err(agenthost_actors::Error::Panicked(_))),
        "{result:?}"
    );
    // The dead drain panicked building its first request, before its first write (which would
    // carry the claim and the promotion): the restarted actor finds the input still pending and
    // answers it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while h.count(&s, "execution_succeeded") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", h.kinds(&s));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The settlement is durable before the drain reports back to its actor: wait for that.
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 1);
    assert_eq!(h.runtime.metrics().restarts.get(), 1);
    assert!(h.runtime.active().is_empty());
    h.assert_replay_equal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_limit_halts_the_session_until_an_explicit_resume() {
    let h = Harness::start_with([text("finally")], |_| {}, panicking(6)).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let _ = h.runtime.resume(&s).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let halted = loop {
        let row = h.row(&s);
        if row.halted.is_some() {
            break row;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", h.kinds(&s));
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(halted.claim.is_none());
    assert_eq!(h.runtime.metrics().restarts.get(), 5);
    // A wake does not revive a halted session; an explicit resume does.
    h.runtime.wake(&s).await.expect("wake");
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 0);
    let outcome = h.runtime.resume(&s).await;
    assert_eq!(
        outcome,
        Ok(agenthost_actors::Outcome::Completed { steps: 1 })
    );
    assert_eq!(h.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_actor_passivates_and_the_next_prompt_respawns_it() {
    let h = Harness::start_with(
        [text("first"), text("second")],
        |c| c.passivate_after = Duration::from_millis(50),
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "one").await;
    h.idle(&s).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while h.runtime.live() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "never passivated");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.prompt(&s, "two").await;
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 2);
    assert_eq!(h.count(&s, "prompt_promoted"), 2);
    assert_eq!(h.count(&s, "execution_succeeded"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_forgets_every_actor() {
    let h = Harness::start([text("a"), text("b")]).await;
    for _ in 0..2 {
        let s = h.session().await;
        h.prompt(&s, "hi").await;
        h.idle(&s).await;
    }
    assert_eq!(h.runtime.live(), 2);
    h.runtime.shutdown().await;
    assert_eq!(h.runtime.live(), 0);
    assert!(h.runtime.active().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_session_refuses_more_input_as_unavailable() {
    let h = Harness::start_with(
        [],
        |c| c.limits.pending_per_session = 2,
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "one").await;
    h.admit(&s, "two").await;
    let mut third = agenthost_actors::PromptRequest::new(&s, "three");
    third.resume = false;
    let refused = h.runtime.prompt(third).await;
    assert!(
        matches!(
            refused,
            Err(agenthost_actors::Error::StoreUnavailable { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        h.count(&s, "prompt_admitted"),
        2,
        "nothing written for the refused input"
    );
}

/// A harness under `limit` whose first session's turn is held at a gate (its reply is "a"; the
/// next two answer "b" and "c"), once it is.
async fn first_held_at_a_gate(
    limit: fn(&mut agenthost_actors::Config),
) -> (
    Harness,
    agenthost_llm::scripted::Gate,
    agenthost_model::SessionId,
) {
    let gate = agenthost_llm::scripted::Gate::new();
    let h = Harness::start_with(
        [harness::gated(&gate, "a"), text("b"), text("c")],
        limit,
        Extensions::default(),
    )
    .await;
    let a = h.session().await;
    h.prompt(&a, "first").await;
    gate.reached().await;
    (h, gate, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_streams_are_bounded_and_waiting_steps_run_in_order() {
    let (h, gate, a) = first_held_at_a_gate(|c| c.limits.concurrent_streams = 1).await;
    let (b, c) = (h.session().await, h.session().await);
    h.prompt(&b, "second").await;
    // Let b's drain reach the permit queue before c's.
    while !h.kinds(&b).contains(&"step_started") {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    h.prompt(&c, "third").await;
    while !h.kinds(&c).contains(&"step_started") {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        h.provider.calls(),
        1,
        "the other steps wait for the only stream permit"
    );
    gate.release();
    for s in [&a, &b, &c] {
        h.idle(s).await;
    }
    assert_eq!(
        h.request_order(),
        [a.to_string(), b.to_string(), c.to_string()],
        "FIFO"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_during_the_restart_backoff_restarts_the_actor_at_once() {
    let h = Harness::start_with(
        [text("made it")],
        |c| c.supervision.backoff = Duration::from_secs(3600),
        panicking(1),
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let result = h.runtime.resume(&s).await;
    assert!(
        matches!(result, Err(agenthost_actors::Error::Panicked(_))),
        "{result:?}"
    );
    // The scheduled restart is an hour away; a caller that asks now gets the restarted actor,
    // which continues the owed work.
    h.runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(h.count(&s, "execution_succeeded"), 1, "{:?}", h.kinds(&s));
    assert_eq!(h.provider.calls(), 1);
}

/// Panics in every tool report: after a tool settled, before its step did.
#[derive(Debug)]
struct PanicAfterTool;

impl Hook for PanicAfterTool {
    fn on_tool(&self, _report: &agenthost_actors::ToolReport) {
        panic!("hook exploded after a tool");
    }
}

#[derive(Debug)]
struct Ok_;

impl agenthost_actors::Executor for Ok_ {
    fn execute(
        &self,
        _call: agenthost_actors::Call,
    ) -> futures::future::BoxFuture<'static, Result<String, String>> {
        Box::pin(async { Ok("done".to_owned()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_settles_everything_the_dead_actor_left_open() {
    use agenthost_llm::scripted::Script;
    let calls = (0..10).map(|_| {
        Script::new()
            .tool_call("c1", "ok", "{}")
            .finish(agenthost_llm::FinishReason::ToolCalls)
    });
    let mut tools = agenthost_actors::Tools::default();
    tools.register(agenthost_actors::Tool::new(
        "ok",
        "succeeds",
        serde_json::json!({"type": "object"}),
        Arc::new(Ok_),
    ));
    let extensions = Extensions {
        tools,
        hooks: vec![Arc::new(PanicAfterTool)],
    };
    let h = Harness::start_with(
        calls,
        |c| {
            if let Some(agent) = c.agents.get_mut("default") {
                agent.tools = vec!["*".into()];
            }
        },
        extensions,
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let _ = h.runtime.resume(&s).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while h.row(&s).halted.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", h.kinds(&s));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row = h.row(&s);
    assert!(row.claim.is_none());
    let messages = h
        .runtime
        .snapshot()
        .expect("snap")
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    assert!(
        agenthost_model::owed::leftovers(&messages).is_empty(),
        "left open after the halt: {:?}",
        h.kinds(&s)
    );
    h.assert_replay_equal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_limit_answers_unavailable_and_never_splits_the_session() {
    use agenthost_llm::scripted::Gate;
    let gate = Gate::new();
    let held = harness::gated(&gate, "done");
    let h = Harness::start_with(
        [held, text("second")],
        |c| c.limits.waiters_per_session = 2,
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "slow").await;
    gate.reached().await;
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (runtime, s) = (h.runtime.clone(), s.clone());
            tokio::spawn(async move { runtime.wait_idle(&s, Duration::from_secs(30)).await })
        })
        .collect();
    // Let both waiters reach the actor.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = h.runtime.wait_idle(&s, Duration::from_secs(30)).await;
    assert!(
        matches!(refused, Err(agenthost_actors::Error::Unavailable(_))),
        "over the limit: {refused:?}"
    );
    assert_eq!(h.runtime.live(), 1, "the live actor is still the session's");
    gate.release();
    for waiter in waiters {
        waiter.await.expect("joined").expect("idle");
    }
    h.prompt(&s, "again").await;
    h.idle(&s).await;
    assert_eq!(h.count(&s, "execution_started"), 2, "{:?}", h.kinds(&s));
    assert_eq!(h.count(&s, "execution_succeeded"), 2, "{:?}", h.kinds(&s));
    assert_eq!(h.provider.calls(), 2);
}

/// A tool that waits until the test releases it.
#[derive(Debug)]
struct Held(agenthost_llm::scripted::Gate);

impl agenthost_actors::Executor for Held {
    fn execute(
        &self,
        _call: agenthost_actors::Call,
    ) -> futures::future::BoxFuture<'static, Result<String, String>> {
        let gate = self.0.clone();
        Box::pin(async move {
            gate.pass().await;
            Ok("held".to_owned())
        })
    }
}

/// One session's tool waits at a gate while another session is prompted, under `limit` (a limit
/// of one): the other session is answered before the tool returns.
async fn a_slow_tool_leaves_room_for_another_session(limit: fn(&mut agenthost_actors::Config)) {
    use agenthost_llm::scripted::{Gate, Script};
    let gate = Gate::new();
    let mut tools = agenthost_actors::Tools::default();
    tools.register(agenthost_actors::Tool::new(
        "slow",
        "takes its time",
        serde_json::json!({"type": "object"}),
        Arc::new(Held(gate.clone())),
    ));
    let call = Script::new()
        .tool_call("c1", "slow", "{}")
        .finish(agenthost_llm::FinishReason::ToolCalls);
    let h = Harness::start_with(
        [call, text("other session"), text("after the tool")],
        |c| {
            limit(c);
            if let Some(agent) = c.agents.get_mut("default") {
                agent.tools = vec!["*".into()];
            }
        },
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await;
    let (a, b) = (h.session().await, h.session().await);
    h.prompt(&a, "use the slow tool").await;
    gate.reached().await;
    h.prompt(&b, "meanwhile").await;
    h.runtime
        .wait_idle(&b, Duration::from_secs(10))
        .await
        .expect("b answered while a's tool runs");
    gate.release();
    h.idle(&a).await;
    assert_eq!(h.count(&a, "execution_succeeded"), 1);
}

/// While a's tool runs, b streams: the only permit is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tool_holds_no_stream_permit() {
    a_slow_tool_leaves_room_for_another_session(|c| c.limits.concurrent_streams = 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_ends_a_session_waiting_for_a_stream_permit() {
    let (h, gate, a) = first_held_at_a_gate(|c| c.limits.concurrent_streams = 1).await;
    let b = h.session().await;
    h.prompt(&b, "waits for it").await;
    while !h.kinds(&b).contains(&"step_started") {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(h.runtime.interrupt(&b).await, Ok(true));
    assert!(h.row(&b).claim.is_none(), "{:?}", h.kinds(&b));
    assert_eq!(h.provider.calls(), 1, "b never streamed");
    gate.release();
    h.idle(&a).await;
}

/// At most `concurrent_drains` drains run at once; the others wait for a slot, in order, before
/// they read or write anything (a burst of ten thousand sessions holds a few hundred drains'
/// state, not ten thousand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_drains_are_bounded_and_waiting_ones_run_in_order() {
    let (h, gate, a) = first_held_at_a_gate(|c| c.limits.concurrent_drains = 1).await;
    let (b, c) = (h.session().await, h.session().await);
    h.prompt(&b, "second").await;
    while !h.runtime.active().contains(&b) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    h.prompt(&c, "third").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.runtime.drains_waiting() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "b and c never queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Queued, not started: neither took the claim nor promoted its input.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for s in [&b, &c] {
        assert_eq!(
            h.kinds(s).last(),
            Some(&"prompt_admitted"),
            "{:?}",
            h.kinds(s)
        );
    }
    assert_eq!(h.provider.calls(), 1);
    assert_eq!(h.runtime.drains_waiting(), 2);
    gate.release();
    for s in [&a, &b, &c] {
        h.idle(s).await;
        assert_eq!(h.count(s, "execution_succeeded"), 1);
    }
    assert_eq!(h.runtime.drains_waiting(), 0);
    assert_eq!(
        h.request_order(),
        [a.to_string(), b.to_string(), c.to_string()],
        "FIFO"
    );
}

/// At most `live_sessions` session actors live at once. A prompt to a session beyond the bound
/// is admitted and answered at once while its session waits in line (nothing read or written
/// for it yet); the actor ahead passivates as soon as it is idle, and every session's turn runs,
/// in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_actors_are_bounded_and_sessions_wait_in_line() {
    let (h, gate, a) = first_held_at_a_gate(|c| c.limits.live_sessions = 1).await;
    let (b, c) = (h.session().await, h.session().await);
    h.prompt(&b, "second").await;
    h.prompt(&c, "third").await;
    assert_eq!(h.runtime.sessions_waiting(), 2);
    assert_eq!(h.runtime.live(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for s in [&b, &c] {
        assert_eq!(
            h.kinds(s).last(),
            Some(&"prompt_admitted"),
            "{:?}",
            h.kinds(s)
        );
    }
    // A caller other than a wake waits for the place within its own timeout.
    assert!(matches!(
        h.runtime.wait_idle(&c, Duration::from_millis(20)).await,
        Err(agenthost_actors::Error::Timeout { .. })
    ));
    gate.release();
    for s in [&a, &b, &c] {
        h.idle(s).await;
        assert_eq!(h.count(s, "execution_succeeded"), 1, "{:?}", h.kinds(s));
    }
    assert_eq!(h.runtime.sessions_waiting(), 0);
    assert!(h.runtime.live() <= 1);
    assert_eq!(
        h.request_order(),
        [a.to_string(), b.to_string(), c.to_string()],
        "in line"
    );
}

/// An idle actor gives its place up when another session needs one, long before its own idle
/// time is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_actor_gives_its_place_to_a_waiting_session() {
    let h = Harness::start_with(
        [text("a"), text("b"), text("a again")],
        |c| c.limits.live_sessions = 1,
        Extensions::default(),
    )
    .await;
    let (a, b) = (h.session().await, h.session().await);
    h.prompt(&a, "first").await;
    h.idle(&a).await;
    assert_eq!(h.runtime.live(), 1, "idle, within its passivation time");
    h.prompt(&b, "second").await;
    h.idle(&b).await;
    h.prompt(&a, "third").await;
    h.idle(&a).await;
    for (s, turns) in [(&a, 2), (&b, 1)] {
        assert_eq!(h.count(s, "execution_succeeded"), turns, "{:?}", h.kinds(s));
    }
    assert_eq!(h.runtime.live(), 1);
}

/// A drain gives its slot back while its tools run: a tool that waits on another session (here,
/// for as long as the other session's turn takes) cannot hold up the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tool_holds_no_drain_slot() {
    a_slow_tool_leaves_room_for_another_session(|c| c.limits.concurrent_drains = 1).await;
}

/// A drain waiting out a retry's backoff gives its slot back: a provider that rate-limits one
/// session for a minute does not hold up the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_backing_off_holds_no_slot() {
    use agenthost_llm::scripted::Script;
    let limited = Script::new().error(agenthost_llm::Error::rate_limit(Some(Duration::from_secs(
        60,
    ))));
    let h = Harness::start_with(
        [limited, text("meanwhile")],
        |c| c.limits.concurrent_drains = 1,
        Extensions::default(),
    )
    .await;
    let (a, b) = (h.session().await, h.session().await);
    h.prompt(&a, "rate limited").await;
    while !h.kinds(&a).contains(&"retry_scheduled") {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    h.prompt(&b, "not held up").await;
    h.runtime
        .wait_idle(&b, Duration::from_secs(10))
        .await
        .expect("b answered while a backs off");
    assert_eq!(h.runtime.interrupt(&a).await, Ok(true));
    assert_eq!(h.count(&a, "execution_interrupted"), 1, "{:?}", h.kinds(&a));
}

/// An interrupt ends a drain still waiting for a slot at once, with nothing written: its input
/// stays pending for the next drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_ends_a_drain_waiting_for_a_slot() {
    let (h, gate, a) = first_held_at_a_gate(|c| c.limits.concurrent_drains = 1).await;
    let b = h.session().await;
    h.prompt(&b, "waits for it").await;
    while !h.runtime.active().contains(&b) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(h.runtime.interrupt(&b).await, Ok(true));
    assert_eq!(
        h.kinds(&b).last(),
        Some(&"prompt_admitted"),
        "{:?}",
        h.kinds(&b)
    );
    assert_eq!(h.row(&b).pending, 1, "the input stays pending");
    gate.release();
    h.idle(&a).await;
    // The next drain answers it.
    assert_eq!(
        h.runtime.resume(&b).await,
        Ok(agenthost_actors::Outcome::Completed { steps: 1 })
    );
    assert_eq!(h.provider.calls(), 2);
}

/// Every caller of `shutdown` returns only once the store is released, even when another caller
/// started the shutdown: the process can open the same store again as soon as any returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shutdown_call_returns_once_the_store_is_released() {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(Scripted::new([text("a")]));
    let (runtime, _) = harness::started_with_prompt(dir.path(), provider.clone(), "hi").await;
    let (a, b) = (runtime.clone(), runtime.clone());
    let first = tokio::spawn(async move { a.shutdown().await });
    let second = tokio::spawn(async move { b.shutdown().await });
    // Whichever returns first, the store must be free by then.
    futures::future::select(first, second).await;
    let again = Runtime::start(harness::config(dir.path(), provider))
        .await
        .expect("the store was released");
    again.shutdown().await;
}

/// A snapshot still held when the shutdown comes (a `generate`'s preparer, an API read on the
/// blocking pool) does not keep the store's file: the process can open the same store again as
/// soon as `shutdown` returns, while the old snapshot is still alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_held_across_shutdown_does_not_keep_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(Scripted::new([text("a")]));
    let (runtime, _) = harness::started_with_prompt(dir.path(), provider.clone(), "hi").await;
    let (held, holding) = std::sync::mpsc::channel();
    let reader = {
        let runtime = runtime.clone();
        std::thread::spawn(move || {
            let snapshot = runtime.snapshot().expect("a snapshot");
            held.send(()).expect("the test waits");
            std::thread::sleep(Duration::from_millis(300));
            drop(snapshot);
        })
    };
    holding.recv().expect("the reader holds a snapshot");
    runtime.shutdown().await;
    let again = Runtime::start(harness::config(dir.path(), provider))
        .await
        .expect("the store was released");
    again.shutdown().await;
    reader.join().expect("the reader");
}

/// An interrupt sent while a panicked actor waits out its restart backoff wins: it restarts the
/// actor at once, and the turn the panic cut (its claim held) ends as interrupted instead of being
/// resumed by the restarted actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_during_the_restart_backoff_ends_the_cut_turn() {
    use agenthost_llm::scripted::Script;
    let mut tools = agenthost_actors::Tools::default();
    tools.register(agenthost_actors::Tool::new(
        "ok",
        "succeeds",
        serde_json::json!({"type": "object"}),
        Arc::new(Ok_),
    ));
    let h = Harness::start_with(
        [
            Script::new()
                .tool_call("c1", "ok", "{}")
                .finish(agenthost_llm::FinishReason::ToolCalls),
            text("resumed anyway"),
        ],
        |c| c.supervision.backoff = Duration::from_secs(3600),
        Extensions {
            tools,
            hooks: vec![Arc::new(PanicAfterTool)],
        },
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let result = h.runtime.resume(&s).await;
    assert!(
        matches!(result, Err(agenthost_actors::Error::Panicked(_))),
        "{result:?}"
    );
    assert!(h.row(&s).claim.is_some(), "the panic kept the claim");
    assert_eq!(h.runtime.interrupt(&s).await, Ok(true));
    h.runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(h.provider.calls(), 1, "the cut turn was not resumed");
    assert!(h.row(&s).claim.is_none());
    assert_eq!(h.count(&s, "execution_interrupted"), 1, "{:?}", h.kinds(&s));
    h.assert_replay_equal();
}

/// Blocks the first instruction resolution until released: a drain held before its first write,
/// in a blocking section an interrupt cannot cut short.
#[derive(Debug, Default)]
struct BlockInstructions {
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl BlockInstructions {
    fn wait_reached(&self) {
        let mut state = self.state.lock().expect("lock");
        while !state.0 {
            state = self.changed.wait(state).expect("wait");
        }
    }

    fn release(&self) {
        self.state.lock().expect("lock").1 = true;
        self.changed.notify_all();
    }
}

/// Releases the block when dropped, so a failing test never leaves a thread blocked.
struct Unblock(Arc<BlockInstructions>);

impl Drop for Unblock {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Hook for BlockInstructions {
    fn instructions(&self, _session: &agenthost_model::SessionId) -> Vec<(String, Option<String>)> {
        let mut state = self.state.lock().expect("lock");
        state.0 = true;
        self.changed.notify_all();
        while !state.1 {
            state = self.changed.wait(state).expect("wait");
        }
        vec![("hook".into(), Some("be brief".into()))]
    }
}

/// Callers waiting for an interrupt's cleanup are bounded like every other waiter: past
/// `waiters_per_session` an interrupt is still applied and answered at once, so a flood of
/// interrupts cannot grow a session's memory while its drain cleans up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupts_past_the_waiter_limit_are_answered_at_once() {
    let block = Arc::new(BlockInstructions::default());
    let unblock = Unblock(block.clone());
    let h = Harness::start_with(
        [text("never")],
        |c| c.limits.waiters_per_session = 2,
        Extensions {
            tools: Default::default(),
            hooks: vec![block.clone()],
        },
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    h.runtime.wake(&s).await.expect("wake");
    let waiting = block.clone();
    tokio::task::spawn_blocking(move || waiting.wait_reached())
        .await
        .expect("reached");
    let interrupts: Vec<_> = (0..5)
        .map(|_| {
            let (r, s) = (h.runtime.clone(), s.clone());
            tokio::spawn(async move { r.interrupt(&s).await })
        })
        .collect();
    // Three are past the limit: answered while the drain is still held.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while interrupts.iter().filter(|i| i.is_finished()).count() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "not answered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        interrupts.iter().filter(|i| i.is_finished()).count(),
        3,
        "two wait for the cleanup"
    );
    drop(unblock);
    for interrupt in interrupts {
        assert_eq!(interrupt.await.expect("joined"), Ok(true));
    }
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 0);
    assert_eq!(h.row(&s).pending, 1, "the input stays pending");
}
