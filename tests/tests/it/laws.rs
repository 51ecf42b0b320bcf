//! The session actor's laws: serialized drains, coalesced wakes, joins, interrupts.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agenthost_actors::{Call, Executor, Extensions, Outcome, Runtime, Tool, Tools};
use agenthost_llm::scripted::{Gate, Script};
use agenthost_llm::{Error as LlmError, ErrorKind, FinishReason};
use futures::future::BoxFuture;

use crate::harness::{Harness, text};

fn gated(gate: &Gate, reply: &str) -> Script {
    Script::new()
        .gate(gate)
        .text(reply)
        .finish(FinishReason::Stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_while_idle_starts_a_drain_and_active_is_exact() {
    let gate = Gate::new();
    let mut h = Harness::start([gated(&gate, "hi")]).await;
    let s = h.session().await;
    assert!(h.runtime.active().is_empty());
    h.prompt(&s, "hello").await;
    gate.reached().await;
    assert_eq!(h.runtime.active(), vec![s.clone()]);
    gate.release();
    h.drains_finished(&s, 1).await;
    assert!(h.runtime.active().is_empty());
    assert_eq!(
        h.kinds(&s),
        [
            "session_created",
            "prompt_admitted",
            "execution_started",
            "prompt_promoted",
            "step_started",
            "text_ended",
            "step_ended",
            "execution_succeeded"
        ]
    );
    let request = h.provider.last_request().expect("one request");
    assert_eq!(
        request.messages,
        vec![agenthost_llm::Message::user("hello")]
    );
    h.assert_replay_equal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_resumes_join_one_drain() {
    let gate = Gate::new();
    let h = Harness::start([gated(&gate, "once")]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let resumes: Vec<_> = (0..3)
        .map(|_| {
            let runtime = h.runtime.clone();
            let s = s.clone();
            tokio::spawn(async move { runtime.resume(&s).await })
        })
        .collect();
    gate.reached().await;
    gate.release();
    for r in resumes {
        assert_eq!(
            r.await.expect("joined"),
            Ok(Outcome::Completed { steps: 1 })
        );
    }
    assert_eq!(h.provider.calls(), 1);
    assert_eq!(h.count(&s, "execution_started"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_during_a_wake_started_drain_joins_without_forcing() {
    let gate = Gate::new();
    let mut h = Harness::start([gated(&gate, "answer")]).await;
    let s = h.session().await;
    h.prompt(&s, "question").await;
    gate.reached().await;
    let resume = {
        let runtime = h.runtime.clone();
        let s = s.clone();
        tokio::spawn(async move { runtime.resume(&s).await })
    };
    tokio::task::yield_now().await;
    gate.release();
    assert_eq!(
        resume.await.expect("joined"),
        Ok(Outcome::Completed { steps: 1 })
    );
    assert_eq!(h.drains_finished(&s, 1).await, 1);
    assert_eq!(h.provider.calls(), 1, "the join forced nothing");
    assert_eq!(h.count(&s, "execution_started"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_wakes_during_a_drain_give_exactly_two_drains() {
    let gate = Gate::new();
    let mut h = Harness::start([gated(&gate, "a")]).await;
    let s = h.session().await;
    h.prompt(&s, "one").await;
    gate.reached().await;
    for _ in 0..3 {
        h.runtime.wake(&s).await.expect("wake");
    }
    gate.release();
    assert_eq!(h.drains_finished(&s, 2).await, 2);
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 1, "the follow-up found nothing to do");
    assert_eq!(h.count(&s, "execution_started"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_during_the_follow_up_gives_a_third_drain() {
    let (first, second) = (Gate::new(), Gate::new());
    let failing = Script::new()
        .gate(&first)
        .error(LlmError::new(ErrorKind::InvalidRequest, "refused"));
    let mut h = Harness::start([failing, gated(&second, "b")]).await;
    let s = h.session().await;
    h.prompt(&s, "one").await;
    first.reached().await;
    // New input during the first drain; the drain fails before promoting it.
    h.prompt(&s, "two").await;
    first.release();
    second.reached().await;
    h.runtime.wake(&s).await.expect("wake");
    second.release();
    assert_eq!(h.drains_finished(&s, 3).await, 3);
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_on_idle_or_unknown_is_a_no_op() {
    let h = Harness::start([]).await;
    let s = h.session().await;
    assert_eq!(h.runtime.interrupt(&s).await, Ok(false));
    let unknown = agenthost_model::SessionId::parse("ses_unknown").expect("valid");
    assert_eq!(h.runtime.interrupt(&unknown).await, Ok(false));
    assert_eq!(h.kinds(&s), ["session_created"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_clears_the_follow_up_and_records_cleanup() {
    let gate = Gate::new();
    let script = Script::new()
        .text("partial answer")
        .gate(&gate)
        .text(" never")
        .finish(FinishReason::Stop);
    let mut h = Harness::start([script]).await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    gate.reached().await;
    h.runtime.wake(&s).await.expect("wake sets the follow-up");
    assert_eq!(h.runtime.interrupt(&s).await, Ok(true));
    assert_eq!(
        h.drains_finished(&s, 1).await,
        1,
        "no follow-up after interrupt"
    );
    assert_eq!(
        h.kinds(&s)[2..],
        [
            "execution_started",
            "prompt_promoted",
            "step_started",
            "text_ended",
            "step_failed",
            "execution_interrupted"
        ]
    );
    let log = h.log(&s);
    assert!(log.iter().any(|e| matches!(e, agenthost_model::Event::TextEnded { incomplete: true, text, .. } if text == "partial answer")));
    assert!(log.iter().any(|e| matches!(e, agenthost_model::Event::StepFailed { error, .. } if error.kind == agenthost_model::FailureKind::Aborted)));
    assert_eq!(h.count(&s, "step_ended"), 0);
    assert_eq!(h.provider.calls(), 1);
    let row = h.row(&s);
    assert!(row.claim.is_none(), "a user interrupt releases the claim");
}

#[tokio::test(flavor = "current_thread")]
async fn wake_and_resume_during_interrupt_cleanup_run_after_it() {
    let gate = Gate::new();
    let script = Script::new()
        .gate(&gate)
        .text("never")
        .finish(FinishReason::Stop);
    let mut h = Harness::start([script, text("after")]).await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    gate.reached().await;
    // Spawned in this order on one thread, the three messages reach the mailbox in this order.
    let interrupt = tokio::spawn({
        let (r, s) = (h.runtime.clone(), s.clone());
        async move { r.interrupt(&s).await }
    });
    let wake = tokio::spawn({
        let (r, s) = (h.runtime.clone(), s.clone());
        async move { r.wake(&s).await }
    });
    let resume = tokio::spawn({
        let (r, s) = (h.runtime.clone(), s.clone());
        async move { r.resume(&s).await }
    });
    assert_eq!(interrupt.await.expect("joined"), Ok(true));
    wake.await.expect("joined").expect("woken");
    assert_eq!(
        resume.await.expect("joined"),
        Ok(Outcome::Completed { steps: 1 })
    );
    assert_eq!(h.drains_finished(&s, 2).await, 2);
    let kinds = h.kinds(&s);
    let interrupted = kinds
        .iter()
        .position(|k| *k == "execution_interrupted")
        .expect("interrupted");
    let restarted = kinds
        .iter()
        .rposition(|k| *k == "execution_started")
        .expect("started again");
    assert!(interrupted < restarted, "{kinds:?}");
    assert_eq!(h.provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_reaches_every_joiner_and_a_racing_wake_gets_one_follow_up() {
    let gate = Gate::new();
    let failing = Script::new()
        .gate(&gate)
        .error(LlmError::new(ErrorKind::InvalidRequest, "bad request"));
    let mut h = Harness::start([failing, text("recovered")]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let joiners: Vec<_> = (0..2)
        .map(|_| {
            let (r, s) = (h.runtime.clone(), s.clone());
            tokio::spawn(async move { r.resume(&s).await })
        })
        .collect();
    gate.reached().await;
    h.prompt(&s, "more").await;
    gate.release();
    for j in joiners {
        let result = j.await.expect("joined");
        assert!(
            matches!(result, Err(agenthost_actors::Error::Provider(_))),
            "{result:?}"
        );
    }
    assert_eq!(h.drains_finished(&s, 2).await, 2);
    assert_eq!(h.count(&s, "execution_failed"), 1);
    assert_eq!(h.count(&s, "step_failed"), 1);
    assert_eq!(h.count(&s, "execution_succeeded"), 1);
    assert!(h.runtime.active().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_that_stops_waiting_does_not_cancel_the_drain() {
    let gate = Gate::new();
    let mut h = Harness::start([gated(&gate, "done")]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let impatient = {
        let (r, s) = (h.runtime.clone(), s.clone());
        tokio::spawn(async move { r.resume(&s).await })
    };
    gate.reached().await;
    impatient.abort();
    let _ = impatient.await;
    gate.release();
    h.drains_finished(&s, 1).await;
    assert_eq!(h.count(&s, "execution_succeeded"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_drain_at_the_same_time() {
    let gate = Gate::new();
    let h = Harness::start([gated(&gate, "a"), gated(&gate, "b")]).await;
    let (a, b) = (h.session().await, h.session().await);
    h.prompt(&a, "one").await;
    h.prompt(&b, "two").await;
    gate.reached().await;
    gate.reached().await;
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(h.runtime.active(), both);
    gate.open();
    h.idle(&a).await;
    h.idle(&b).await;
}

/// A tool that wakes its own session many times from inside the drain.
#[derive(Debug)]
struct SelfWaker {
    runtime: Arc<OnceLock<Runtime>>,
    times: usize,
}

impl Executor for SelfWaker {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        let runtime = self.runtime.get().expect("set after start").clone();
        let times = self.times;
        Box::pin(async move {
            for _ in 0..times {
                runtime
                    .wake(&call.session)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(format!("woke {times} times"))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_self_wakes_coalesce() {
    let slot = Arc::new(OnceLock::new());
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "wake_self",
        "wakes the session",
        serde_json::json!({"type": "object"}),
        Arc::new(SelfWaker {
            runtime: slot.clone(),
            times: 20_000,
        }),
    ));
    let call = Script::new()
        .tool_call("c1", "wake_self", "{}")
        .finish(FinishReason::ToolCalls);
    let mut h = Harness::start_with(
        [call, text("done")],
        |_| {},
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await;
    slot.set(h.runtime.clone()).expect("set once");
    let s = h.session().await;
    h.prompt(&s, "wake yourself").await;
    // The drain, then exactly one follow-up (which finds nothing to do).
    assert_eq!(h.drains_finished(&s, 2).await, 2);
    assert_eq!(h.provider.calls(), 2);
    let log = h.log(&s);
    assert!(log.iter().any(|e| matches!(e, agenthost_model::Event::ToolSucceeded { output, .. } if output == "woke 20000 times")));
}

/// A step's start is written without waiting for its commit, so the provider streams at once;
/// subscribers still see every delta after the `step_started` that creates its message and
/// before the `text_ended` that closes its part, and none is lost. What the stream has ready
/// together goes out as one delta; a wait for the stream ends a delta.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_follow_the_event_that_creates_their_message() {
    use agenthost_actors::Live;
    use agenthost_model::Event;
    let script = (0..20)
        .fold(Script::new(), |s, i| match i {
            12 => s.yield_now().text(format!("t{i} ")),
            _ => s.text(format!("t{i} ")),
        })
        .finish(FinishReason::Stop);
    let h = Harness::start([script.clone(), script]).await;
    let s = h.session().await;
    let mut live = h.runtime.subscribe_session(&s);
    for prompt in ["one", "two"] {
        h.prompt(&s, prompt).await;
        h.idle(&s).await;
    }
    let mut seen = Vec::new();
    while let Ok(item) = live.try_recv() {
        seen.push(match &item.1 {
            Live::Event(stored) => match &stored.event {
                Event::StepStarted { id, .. } => (format!("start {id}"), String::new()),
                Event::TextEnded { id, .. } => (format!("end {id}"), String::new()),
                _ => continue,
            },
            Live::Delta { message, delta, .. } => (format!("delta {message}"), delta.clone()),
            Live::Status(_) => continue,
        });
    }
    let starts: Vec<_> = seen
        .iter()
        .filter(|(l, _)| l.starts_with("start"))
        .collect();
    assert_eq!(starts.len(), 2, "{seen:#?}");
    let first: String = (0..12).map(|i| format!("t{i} ")).collect();
    let rest: String = (12..20).map(|i| format!("t{i} ")).collect();
    for (start, _) in starts {
        let id = start.trim_start_matches("start ");
        let mine: Vec<(&str, &str)> = seen
            .iter()
            .filter(|(l, _)| l.ends_with(id))
            .map(|(l, text)| (l.split(' ').next().expect("kind"), text.as_str()))
            .collect();
        let want = vec![
            ("start", ""),
            ("delta", first.as_str()),
            ("delta", rest.as_str()),
            ("end", ""),
        ];
        assert_eq!(mine, want, "{seen:#?}");
    }
}

/// Deltas a stream has ready together are joined for the bus, but never past 16 KiB in one:
/// what the bus holds for a reader stays counted in bounded pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_deltas_are_joined_in_pieces_of_bounded_size() {
    use agenthost_actors::Live;
    let script = (0..40_000)
        .fold(Script::new(), |s, _| s.text("x"))
        .finish(FinishReason::Stop);
    let h = Harness::start([script]).await;
    let s = h.session().await;
    let mut live = h.runtime.subscribe_session(&s);
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    let mut sizes = Vec::new();
    while let Ok(item) = live.try_recv() {
        if let Live::Delta { delta, .. } = &item.1 {
            sizes.push(delta.len());
        }
    }
    assert_eq!(sizes, [16 * 1024, 16 * 1024, 40_000 - 32 * 1024]);
}

/// A step's events go to the store in bursts: what the stream has ready is handled first, and
/// the events so far are sent when the step would wait, and the drain's opening (claim and
/// promotion) rides with the step's first write. A stream that is ready all at once therefore
/// costs the turn two writer operations: the admission, and the drain's opening with the step
/// and the drain's settlement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_stream_settles_its_turn_in_one_write() {
    let h = Harness::start([Script::new()
        .reasoning("weighing it")
        .text("answer")
        .finish(FinishReason::Stop)])
    .await;
    let s = h.session().await;
    let ops = || h.runtime.store().stats().ops.get();
    let before = ops();
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    assert_eq!(ops() - before, 2, "{:?}", h.kinds(&s));
    assert_eq!(
        h.kinds(&s)[2..],
        [
            "execution_started",
            "prompt_promoted",
            "step_started",
            "reasoning_ended",
            "text_ended",
            "step_ended",
            "execution_succeeded"
        ]
    );
    h.assert_replay_equal();
}

/// A plain turn's drain takes one snapshot: its opening read finds the input, the step is built
/// from that same snapshot (the drain wrote nothing in between), and the settlement itself looks
/// for input that arrived during the step instead of a read before it. Input that does arrive
/// during the step is still answered by the same drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_turn_takes_one_snapshot() {
    let gate = Gate::new();
    let answer = || Script::new().text("answer").finish(FinishReason::Stop);
    let h = Harness::start([
        answer(),
        answer(),
        Script::new()
            .gate(&gate)
            .text("first")
            .finish(FinishReason::Stop),
        answer(),
    ])
    .await;
    let s = h.session().await;
    // The first turn loads the session's history cache.
    h.prompt(&s, "warm up").await;
    h.idle(&s).await;
    let snapshots = || h.runtime.store().stats().snapshots.get();
    let before = snapshots();
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    assert_eq!(snapshots() - before, 1, "{:?}", h.kinds(&s));

    h.prompt(&s, "first").await;
    gate.reached().await;
    let mut queued = agenthost_actors::PromptRequest::new(&s, "meanwhile");
    queued.delivery = agenthost_model::Delivery::Queue;
    h.runtime.prompt(queued).await.expect("queued");
    gate.release();
    h.idle(&s).await;
    assert_eq!(
        h.count(&s, "execution_started"),
        3,
        "one drain answers both"
    );
    assert_eq!(h.count(&s, "execution_succeeded"), 3);
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 4);
    let users = requests[3]
        .messages
        .iter()
        .filter(|m| matches!(m, agenthost_llm::Message::User { .. }))
        .count();
    assert_eq!(users, 4, "the queued input is answered after the first");
    h.assert_replay_equal();
}

/// A drain takes an input admitted in this process from memory, not from the store, when the
/// runtime minted its id; an id the client chose may have been admitted before with other flags,
/// so that input is read from the store. Both are answered alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_takes_an_input_admitted_here_from_memory() {
    let answer = || Script::new().text("answer").finish(FinishReason::Stop);
    let h = Harness::start([answer(), answer()]).await;
    let s = h.session().await;
    let from_memory = || h.runtime.metrics().inputs_from_memory.get();
    h.prompt(&s, "minted").await;
    h.idle(&s).await;
    assert_eq!(from_memory(), 1);

    let mut chosen = agenthost_actors::PromptRequest::new(&s, "chosen");
    chosen.id = Some(agenthost_model::MessageId::parse("msg_chosen").expect("id"));
    h.runtime.prompt(chosen).await.expect("admitted");
    h.idle(&s).await;
    assert_eq!(from_memory(), 1, "read from the store");
    let users = h.provider.requests()[1]
        .messages
        .iter()
        .filter(|m| matches!(m, agenthost_llm::Message::User { .. }))
        .count();
    assert_eq!(users, 2);
    assert_eq!(h.count(&s, "execution_succeeded"), 2);
    h.assert_replay_equal();
}

/// A part that ends with the provider's finish waits a moment for the stream's end, as over
/// HTTP, where usage and the end marker follow the finish: it rides in the step's last write. A
/// turn then costs three writer operations: the admission, the step's start (sent while the
/// provider has not answered yet), and the step's end with the part; four if the part went on its
/// own. Timing decides only when the machine stalls longer than the grace, so the bound leaves
/// room for a few such turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_ends_with_the_finish_rides_in_the_steps_last_write() {
    const TURNS: u64 = 20;
    let turn = || {
        Script::new()
            .delay(Duration::from_millis(1))
            .text("answer")
            .event(agenthost_llm::Event::TextEnd { part: 0 })
            .yield_now()
            .finish(FinishReason::Stop)
    };
    let h = Harness::start((0..TURNS).map(|_| turn())).await;
    let s = h.session().await;
    let ops = || h.runtime.store().stats().ops.get();
    let before = ops();
    for n in 0..TURNS {
        h.prompt(&s, &format!("go {n}")).await;
        h.idle(&s).await;
    }
    let written = ops() - before;
    assert!(
        written < TURNS * 3 + TURNS / 2,
        "{written} operations for {TURNS} turns"
    );
    assert_eq!(h.count(&s, "text_ended"), TURNS as usize);
}

/// A part that ended is durable while the stream waits for more, not only when the step ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_part_is_durable_while_the_stream_waits() {
    let gate = Gate::new();
    let h = Harness::start([Script::new()
        .reasoning("weighing it")
        .text("answer")
        .gate(&gate)
        .finish(FinishReason::Stop)])
    .await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    gate.reached().await;
    while !h.kinds(&s).contains(&"reasoning_ended") {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert_eq!(h.count(&s, "step_ended"), 0, "the stream is still open");
    gate.release();
    h.idle(&s).await;
    assert_eq!(h.count(&s, "text_ended"), 1);
    assert_eq!(h.count(&s, "step_ended"), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_interrupt_during_cleanup_keeps_the_wake_that_came_between() {
    let gate = Gate::new();
    let script = Script::new()
        .gate(&gate)
        .text("never")
        .finish(FinishReason::Stop);
    let mut h = Harness::start([script, text("after")]).await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    gate.reached().await;
    h.admit(&s, "more").await;
    // Spawned in this order on one thread, the messages reach the mailbox in this order: the
    // wake arrives during the first interrupt's cleanup, the second interrupt after it.
    let spawn_interrupt = |h: &Harness| {
        let (r, s) = (h.runtime.clone(), s.clone());
        tokio::spawn(async move { r.interrupt(&s).await })
    };
    let first = spawn_interrupt(&h);
    let wake = tokio::spawn({
        let (r, s) = (h.runtime.clone(), s.clone());
        async move { r.wake(&s).await }
    });
    let second = spawn_interrupt(&h);
    assert_eq!(first.await.expect("joined"), Ok(true));
    wake.await.expect("joined").expect("woken");
    assert_eq!(second.await.expect("joined"), Ok(true));
    assert_eq!(
        h.drains_finished(&s, 2).await,
        2,
        "the wake ran after the cleanup"
    );
    assert_eq!(h.row(&s).pending, 0, "{:?}", h.kinds(&s));
    assert_eq!(h.provider.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_input_whose_wake_never_ran_is_woken_by_the_sweep() {
    let h = Harness::start_with(
        [text("found you")],
        |c| c.limits.wake_sweep = std::time::Duration::from_millis(20),
        agenthost_actors::Extensions::default(),
    )
    .await;
    let s = h.session().await;
    // Admitted asking for a wake that never comes, as when the caller goes away between the two.
    h.runtime
        .store()
        .admit(agenthost_store::Admission {
            session: s.clone(),
            id: agenthost_model::MessageId::parse("msg_lost_wake").expect("id"),
            prompt: agenthost_model::Prompt::text("anyone?"),
            delivery: agenthost_model::Delivery::Steer,
            wake: true,
        })
        .await
        .expect("admitted");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while h.count(&s, "execution_succeeded") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", h.kinds(&s));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 1);
    assert_eq!(h.row(&s).pending, 0);
}
