//! The agent loop, one test per rule: a scripted transcript in, the rendered
//! durable log and the recorded provider requests out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{
    Call, Error, Executor, Extensions, Hook, Instruction, Outcome, PromptRequest, SUMMARY_REQUEST,
    Tool, Tools,
};
use agenthost_llm::scripted::{Gate, Script};
use agenthost_llm::{FinishReason, Message, Request, ToolChoice, Usage};
use agenthost_model::{Delivery, Event, SessionId};
use futures::future::BoxFuture;

use crate::harness::{self, Harness, text};

/// One line per durable event after session creation, terse enough to compare whole logs.
fn render(event: &Event) -> String {
    match event {
        Event::PromptAdmitted { prompt, .. } => format!("admitted {:?}", prompt.text),
        Event::PromptPromoted { .. } => "promoted".into(),
        Event::InstructionsUpdated { text, .. } => format!("instructions {text:?}"),
        Event::StepStarted { step, .. } => format!("step_started {step}"),
        Event::TextEnded {
            text, incomplete, ..
        } => {
            format!(
                "text {text:?}{}",
                if *incomplete { " (incomplete)" } else { "" }
            )
        }
        Event::ToolCalled { call_id, name, .. } => format!("tool_called {call_id} {name}"),
        Event::ToolSucceeded {
            call_id, output, ..
        } => format!("tool_ok {call_id} {output:?}"),
        Event::ToolFailed { call_id, error, .. } => format!("tool_failed {call_id} {error}"),
        Event::StepEnded { finish, .. } => format!("step_ended {finish:?}"),
        Event::StepFailed { error, .. } => format!("step_failed {:?}", error.kind),
        Event::RetryScheduled { attempt, .. } => format!("retry {attempt}"),
        Event::CompactionStarted { auto, .. } => format!("compaction_started auto={auto}"),
        Event::CompactionEnded { summary, .. } => format!("compaction_ended {summary:?}"),
        Event::CompactionFailed { .. } => "compaction_failed".into(),
        other => other.kind().to_owned(),
    }
}

/// Runs `prompts` through a session whose provider plays `scripts`, waits until idle, and
/// returns the rendered log (after creation) and the requests the provider received.
async fn check(h: &Harness, prompts: &[&str]) -> (SessionId, Vec<String>, Vec<Request>) {
    let s = h.session().await;
    for p in prompts {
        h.prompt(&s, p).await;
    }
    h.idle(&s).await;
    h.assert_replay_equal();
    let log = h.log(&s).iter().skip(1).map(render).collect();
    (s, log, h.provider.requests())
}

#[derive(Debug)]
struct Echo;
impl Executor for Echo {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async move { Ok(format!("echo {}", call.input)) })
    }
}

#[derive(Debug)]
struct Fails;
impl Executor for Fails {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async { Err("disk full".to_owned()) })
    }
}

#[derive(Debug)]
struct Panics;
impl Executor for Panics {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async { panic!("tool bug") })
    }
}

#[derive(Debug)]
struct Sleeps;
impl Executor for Sleeps {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok("late".to_owned())
        })
    }
}

/// Finishes only when `n` calls run at the same time.
#[derive(Debug)]
struct Together(Arc<tokio::sync::Barrier>);
impl Executor for Together {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        let barrier = self.0.clone();
        Box::pin(async move {
            barrier.wait().await;
            Ok("together".to_owned())
        })
    }
}

fn tools() -> Tools {
    let schema = serde_json::json!({"type": "object"});
    let mut tools = Tools::default();
    tools.register(Tool::new("echo", "echoes", schema.clone(), Arc::new(Echo)));
    tools.register(Tool::new("fails", "fails", schema.clone(), Arc::new(Fails)));
    tools.register(Tool::new(
        "panics",
        "panics",
        schema.clone(),
        Arc::new(Panics),
    ));
    tools.register(Tool::new(
        "secret",
        "not allowed",
        schema.clone(),
        Arc::new(Echo),
    ));
    let mut slow = Tool::new("slow", "times out", schema.clone(), Arc::new(Sleeps));
    slow.timeout = Duration::from_millis(50);
    tools.register(slow);
    tools.register(Tool::new(
        "together",
        "waits for its siblings",
        schema,
        Arc::new(Together(Arc::new(tokio::sync::Barrier::new(5)))),
    ));
    tools
}

async fn harness(scripts: Vec<Script>) -> Harness {
    harness_with(scripts, |_| {}, Vec::new()).await
}

async fn harness_with(
    scripts: Vec<Script>,
    tweak: impl FnOnce(&mut agenthost_actors::Config),
    hooks: Vec<Arc<dyn Hook>>,
) -> Harness {
    Harness::start_with(
        scripts,
        |c| {
            if let Some(agent) = c.agents.get_mut("default") {
                agent.tools = vec!["*".into(), "!secret".into()];
            }
            tweak(c);
        },
        Extensions {
            tools: tools(),
            hooks,
        },
    )
    .await
}

fn call(id: &str, name: &str, input: &str) -> Script {
    Script::new()
        .tool_call(id, name, input)
        .finish(FinishReason::ToolCalls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_is_recorded_before_it_runs_and_answered_in_the_next_request() {
    let h = harness(vec![call("c1", "echo", r#"{"q":1}"#), text("done")]).await;
    let (_, log, requests) = check(&h, &["look it up"]).await;
    assert_eq!(
        log,
        [
            "admitted \"look it up\"",
            "execution_started",
            "promoted",
            "step_started 1",
            "tool_called c1 echo",
            "tool_ok c1 \"echo {\\\"q\\\":1}\"",
            "step_ended ToolCalls",
            "step_started 2",
            "text \"done\"",
            "step_ended Stop",
            "execution_succeeded"
        ]
    );
    assert_eq!(requests.len(), 2);
    let second = &requests[1].messages;
    assert!(matches!(&second[0], Message::User { text, .. } if text == "look it up"));
    assert!(
        matches!(&second[1], Message::Assistant { parts } if matches!(&parts[0], agenthost_llm::AssistantPart::ToolCall(c) if c.id == "c1"))
    );
    assert!(matches!(&second[2], Message::Tool(r) if r.call_id == "c1" && !r.is_error));
    // Denied tools are not advertised.
    let names: Vec<&str> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"echo") && !names.contains(&"secret"),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_tools_of_one_step_run_at_the_same_time() {
    let mut script = Script::new();
    for i in 0..5 {
        script = script.tool_call(format!("c{i}"), "together", format!(r#"{{"i":{i}}}"#));
    }
    let h = harness(vec![
        script.finish(FinishReason::ToolCalls),
        text("all done"),
    ])
    .await;
    let (_, log, requests) = check(&h, &["go"]).await;
    assert_eq!(log.iter().filter(|l| l.starts_with("tool_ok")).count(), 5);
    assert_eq!(requests.len(), 2);
    let results = requests[1]
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Tool(_)))
        .count();
    assert_eq!(results, 5, "every tool settled before the next request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failed_tool_becomes_a_result_the_model_sees() {
    let script = Script::new()
        .tool_call("u", "nonexistent", "{}")
        .tool_call("j", "echo", "{not json")
        .tool_call("e", "fails", "{}")
        .tool_call("p", "panics", "{}")
        .tool_call("t", "slow", "{}")
        .tool_call("d", "secret", "{}")
        .finish(FinishReason::ToolCalls);
    let h = harness(vec![script, text("noted")]).await;
    let (_, log, requests) = check(&h, &["try everything"]).await;
    let failed: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("tool_failed"))
        .collect();
    assert_eq!(failed.len(), 6, "{log:#?}");
    let has = |id: &str, needle: &str| {
        failed
            .iter()
            .any(|l| l.starts_with(&format!("tool_failed {id} ")) && l.contains(needle))
    };
    assert!(has("u", "unknown tool"));
    assert!(has("j", "invalid JSON"));
    assert!(has("e", "disk full"));
    assert!(has("p", "panicked"));
    assert!(has("t", "timed out"));
    assert!(has("d", "permission denied"));
    let errors = requests[1]
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Tool(r) if r.is_error))
        .count();
    assert_eq!(errors, 6);
    assert!(log.last().is_some_and(|l| l == "execution_succeeded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_duplicate_calls_run_once_and_both_get_the_result() {
    let script = Script::new()
        .tool_call("a", "echo", r#"{"x":1}"#)
        .tool_call("b", "echo", r#"{"x":1}"#)
        .finish(FinishReason::ToolCalls);
    let h = harness(vec![script, text("ok")]).await;
    let (_, log, _) = check(&h, &["dup"]).await;
    let ok: Vec<&String> = log.iter().filter(|l| l.starts_with("tool_ok")).collect();
    assert_eq!(ok.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_error_after_a_tool_call_settles_the_tool_and_fails_once() {
    let script = Script::new()
        .tool_call("c1", "echo", "{}")
        .error(agenthost_llm::Error::new(
            agenthost_llm::ErrorKind::InvalidRequest,
            "bad",
        ));
    let h = harness(vec![script]).await;
    let (_, log, requests) = check(&h, &["go"]).await;
    assert_eq!(
        log[3..],
        [
            "step_started 1",
            "tool_called c1 echo",
            "tool_ok c1 \"echo {}\"",
            "step_failed Provider",
            "execution_failed"
        ]
    );
    assert_eq!(requests.len(), 1, "no continuation after a provider error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_fails_running_tools_and_the_step_once() {
    let h = harness(vec![call("c1", "slow_forever", "{}")]).await;
    // A tool that never finishes on its own.
    drop(h);
    let mut tools = tools();
    let mut forever = Tool::new(
        "forever",
        "never ends",
        serde_json::json!({}),
        Arc::new(Sleeps),
    );
    forever.timeout = Duration::from_secs(7200);
    tools.register(forever);
    let h = Harness::start_with(
        [call("c1", "forever", "{}")],
        |_| {},
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    let mut waited = 0;
    while !h.kinds(&s).contains(&"tool_called") {
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += 1;
        assert!(waited < 2000, "the tool never started");
    }
    assert_eq!(h.runtime.interrupt(&s).await, Ok(true));
    let log: Vec<String> = h.log(&s).iter().skip(1).map(render).collect();
    assert_eq!(
        log[3..],
        [
            "step_started 1",
            "tool_called c1 forever",
            "tool_failed c1 interrupted",
            "step_failed Aborted",
            "execution_interrupted"
        ]
    );
    assert_eq!(h.provider.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_step_offers_no_tools_and_a_steer_resets_the_count() {
    let gate = Gate::new();
    let first = Script::new()
        .gate(&gate)
        .tool_call("c1", "echo", "{}")
        .finish(FinishReason::ToolCalls);
    let h = harness_with(
        vec![first, call("c2", "echo", "{}"), call("c3", "echo", "{}")],
        |c| {
            if let Some(agent) = c.agents.get_mut("default") {
                agent.steps = 2;
            }
        },
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "start").await;
    gate.reached().await;
    h.prompt(&s, "also this").await;
    gate.release();
    h.idle(&s).await;
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 3);
    // The steer was promoted after request 1: the count restarted, so request 2 still has tools.
    assert!(!requests[1].tools.is_empty());
    assert_eq!(requests[1].tool_choice, ToolChoice::Auto);
    // The last step defines the same tools as every step (providers refuse tool blocks in
    // history without definitions) and forbids calling them.
    assert_eq!(requests[2].tools, requests[1].tools);
    assert_eq!(requests[2].tool_choice, ToolChoice::None);
    assert!(
        matches!(requests[2].messages.last(), Some(Message::Assistant { .. })),
        "ends with the note"
    );
    // The call returned anyway on the last step failed without running; no continuation.
    let log: Vec<String> = h.log(&s).iter().map(render).collect();
    assert!(
        log.iter()
            .any(|l| l.starts_with("tool_failed c3 tool calls are disabled")),
        "{log:#?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("execution_succeeded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steers_during_a_step_join_the_very_next_request_as_one_batch() {
    let gate = Gate::new();
    let first = Script::new()
        .gate(&gate)
        .text("working")
        .finish(FinishReason::Stop);
    let h = harness(vec![first, text("got both")]).await;
    let s = h.session().await;
    h.prompt(&s, "one").await;
    gate.reached().await;
    h.prompt(&s, "two").await;
    h.prompt(&s, "three").await;
    gate.release();
    h.idle(&s).await;
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 2, "several steers cause one extra request");
    let users = |r: &Request| {
        r.messages
            .iter()
            .filter(|m| matches!(m, Message::User { .. }))
            .count()
    };
    assert_eq!(users(&requests[1]), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_inputs_run_fifo_one_per_idle_boundary() {
    let gate = Gate::new();
    let first = Script::new()
        .gate(&gate)
        .text("a")
        .finish(FinishReason::Stop);
    let h = harness(vec![first, text("q1"), text("q2")]).await;
    let s = h.session().await;
    h.prompt(&s, "A").await;
    gate.reached().await;
    for q in ["Q1", "Q2"] {
        let mut request = PromptRequest::new(&s, q);
        request.delivery = Delivery::Queue;
        h.runtime.prompt(request).await.expect("queued");
    }
    gate.release();
    h.idle(&s).await;
    let users: Vec<Vec<String>> = h
        .provider
        .requests()
        .iter()
        .map(|r| {
            r.messages
                .iter()
                .filter_map(|m| match m {
                    Message::User { text, .. } => Some(text.clone()),
                    _ => None,
                })
                .collect()
        })
        .collect();
    assert_eq!(
        users,
        vec![vec!["A"], vec!["A", "Q1"], vec!["A", "Q1", "Q2"]]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retries_follow_the_schedule_and_respect_retry_after() {
    let limited = || Script::new().error(agenthost_llm::Error::rate_limit(None));
    let slow_down = Script::new().error(agenthost_llm::Error::rate_limit(Some(
        Duration::from_secs(30),
    )));
    let h = harness(vec![limited(), slow_down, text("finally")]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let started = tokio::time::Instant::now();
    assert_eq!(
        h.runtime.resume(&s).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    let elapsed = started.elapsed();
    let delays: Vec<u64> = h
        .log(&s)
        .iter()
        .filter_map(|e| match e {
            Event::RetryScheduled { delay_ms, .. } => Some(*delay_ms),
            _ => None,
        })
        .collect();
    assert_eq!(delays.len(), 2);
    assert!(
        (1600..=2400).contains(&delays[0]),
        "first retry ≈ 2 s ±20 %: {delays:?}"
    );
    assert!(delays[1] >= 30_000, "retry-after is a minimum: {delays:?}");
    assert!(elapsed >= Duration::from_millis(delays[0] + delays[1]));
    assert_eq!(h.provider.calls(), 3);
    assert_eq!(
        h.count(&s, "step_started"),
        1,
        "retries reuse the assistant message"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retries_give_up_after_four() {
    let limited = || Script::new().error(agenthost_llm::Error::rate_limit(None));
    let h = harness(vec![limited(), limited(), limited(), limited(), limited()]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let result = h.runtime.resume(&s).await;
    assert!(matches!(result, Err(Error::Provider(_))), "{result:?}");
    assert_eq!(h.provider.calls(), 5, "one attempt and four retries");
    assert_eq!(h.count(&s, "retry_scheduled"), 4);
}

// Real time: interrupt waits for durable cleanup, and a paused clock would jump its timeout
// while the store's writer threads work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_during_backoff_stops_further_attempts() {
    let limited = || Script::new().error(agenthost_llm::Error::rate_limit(None));
    let h = harness(vec![limited(), text("never")]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    let resume = tokio::spawn({
        let (r, s) = (h.runtime.clone(), s.clone());
        async move { r.resume(&s).await }
    });
    while h.count(&s, "retry_scheduled") == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(h.runtime.interrupt(&s).await, Ok(true));
    assert_eq!(resume.await.expect("joined"), Ok(Outcome::Interrupted));
    assert_eq!(h.provider.calls(), 1, "no attempt after the interrupt");
}

fn long_history_config(c: &mut agenthost_actors::Config, auto: bool) {
    c.compaction.auto = auto;
    c.compaction.keep_tokens = 50;
    if let Some(model) = c.models.get_mut("default") {
        model.context_window = 100_000;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflow_before_output_compacts_once_and_rebuilds_the_step() {
    let overflow =
        || Script::new().error(agenthost_llm::Error::context_overflow("prompt is too long"));
    let h = harness_with(
        vec![
            text("first"),
            overflow(),
            harness::summary("the summary"),
            text("rebuilt"),
        ],
        |c| long_history_config(c, true),
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, &"old context ".repeat(100)).await;
    h.idle(&s).await;
    h.prompt(&s, "new question").await;
    h.idle(&s).await;
    let requests = h.provider.requests();
    assert_eq!(
        requests.len(),
        4,
        "first exchange, overflow, summary, rebuilt step"
    );
    assert!(
        matches!(requests[2].messages.last(), Some(Message::User { text, .. }) if text.starts_with(SUMMARY_REQUEST))
    );
    // The summary request defines the step's tools (its history may hold tool blocks) and
    // forbids calling them.
    assert_eq!(requests[2].tools, requests[3].tools);
    assert_eq!(requests[2].tool_choice, ToolChoice::None);
    let rebuilt = &requests[3].messages;
    assert!(
        matches!(&rebuilt[0], Message::User { text, .. } if text.contains("the summary")),
        "{rebuilt:?}"
    );
    assert!(matches!(rebuilt.last(), Some(Message::User { text, .. }) if text == "new question"));
    let log: Vec<String> = h.log(&s).iter().map(render).collect();
    assert!(
        log.iter()
            .any(|l| l.starts_with("compaction_ended") && l.contains("the summary")),
        "{log:#?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("execution_succeeded"));
    h.assert_replay_equal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_overflow_or_auto_off_is_terminal() {
    let overflow =
        || Script::new().error(agenthost_llm::Error::context_overflow("prompt is too long"));
    let h = harness_with(
        vec![
            text("first"),
            overflow(),
            harness::summary("summary"),
            overflow(),
        ],
        |c| long_history_config(c, true),
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, &"old context ".repeat(100)).await;
    h.idle(&s).await;
    h.admit(&s, "again").await;
    assert!(matches!(
        h.runtime.resume(&s).await,
        Err(Error::ContextOverflow(_))
    ));
    assert_eq!(h.provider.calls(), 4);
    assert_eq!(h.count(&s, "compaction_ended"), 1);

    let h = harness_with(
        vec![overflow()],
        |c| long_history_config(c, false),
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "too big").await;
    assert!(matches!(
        h.runtime.resume(&s).await,
        Err(Error::ContextOverflow(_))
    ));
    assert_eq!(h.provider.calls(), 1);
    assert_eq!(h.count(&s, "compaction_started"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_compaction_and_nothing_to_compact() {
    let h = harness_with(
        vec![
            text("first answer"),
            text("second answer"),
            harness::summary("the summary"),
        ],
        |c| long_history_config(c, true),
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    let result = h.runtime.compact(&s).await;
    assert!(matches!(result, Err(Error::NothingToCompact)), "{result:?}");
    assert_eq!(h.provider.calls(), 0);
    h.prompt(&s, &"lots of words ".repeat(50)).await;
    h.idle(&s).await;
    h.prompt(&s, "recent").await;
    h.idle(&s).await;
    let kept_from = h.runtime.compact(&s).await;
    assert!(kept_from.is_ok(), "{kept_from:?}");
    assert_eq!(h.provider.calls(), 3);
    let row = h.row(&s);
    assert_eq!(row.active_from, kept_from.expect("ok"));
}

/// An instruction source backed by a file the test rewrites between prompts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instruction_change_lands_between_prompts_with_the_system_prefix_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("RULES.md");
    std::fs::write(&rules, "Be brief.").expect("write");
    let path = rules.clone();
    let h = harness_with(
        vec![text("one"), text("two"), text("three")],
        move |c| {
            c.instructions = vec![Instruction::File {
                name: "rules".into(),
                path,
            }]
        },
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "user1").await;
    h.idle(&s).await;
    std::fs::write(&rules, "Be very brief.").expect("rewrite");
    h.prompt(&s, "user2").await;
    h.idle(&s).await;
    let requests = h.provider.requests();
    assert_eq!(
        requests[0].system, requests[1].system,
        "the system prefix never changes"
    );
    let texts: Vec<String> = requests[1]
        .messages
        .iter()
        .map(|m| match m {
            Message::User { text, .. } => text.clone(),
            Message::Assistant { .. } => "assistant".into(),
            Message::Tool(_) => "tool".into(),
        })
        .collect();
    assert_eq!(texts.len(), 5, "{texts:?}");
    assert!(texts[0].contains("Be brief."));
    assert_eq!(texts[1], "user1");
    assert_eq!(texts[2], "assistant");
    assert!(texts[3].contains("Be very brief."));
    assert_eq!(texts[4], "user2");

    // A source that becomes unreadable keeps its last value: no update, the prompt runs.
    std::fs::remove_file(&rules).expect("remove");
    h.prompt(&s, "user3").await;
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 3);
    assert_eq!(h.count(&s, "instructions_updated"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_without_any_value_blocks_the_step_and_keeps_the_input_pending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.md");
    let h = harness_with(
        vec![],
        move |c| {
            c.instructions = vec![Instruction::File {
                name: "rules".into(),
                path: missing,
            }]
        },
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.admit(&s, "waits").await;
    let result = h.runtime.resume(&s).await;
    assert!(
        matches!(result, Err(Error::Unavailable(ref m)) if m.contains("rules")),
        "{result:?}"
    );
    assert_eq!(h.provider.calls(), 0);
    let row = h.row(&s);
    assert_eq!(row.pending, 1, "the input stays pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_totals_equal_the_sum_of_step_usages() {
    let used = |input, output| Usage {
        input,
        output,
        reasoning: 0,
        cache_read: 0,
        cache_write: 0,
    };
    let first = Script::new()
        .tool_call("c", "echo", "{}")
        .usage(used(10, 5))
        .finish(FinishReason::ToolCalls);
    let second = Script::new()
        .text("done")
        .usage(used(30, 7))
        .finish(FinishReason::Stop);
    let h = harness(vec![first, second]).await;
    let (s, _, _) = check(&h, &["count"]).await;
    let row = h.row(&s);
    assert_eq!((row.usage.input, row.usage.output), (40, 12));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stream_cut_after_output_continues_with_the_note_in_a_new_message() {
    let cut = Script::new()
        .text("partial answer")
        .error(agenthost_llm::Error::incomplete(
            "connection reset mid-stream",
        ));
    let h = harness(vec![cut, text("the rest")]).await;
    let s = h.session().await;
    h.admit(&s, "tell me").await;
    assert_eq!(
        h.runtime.resume(&s).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    let log: Vec<String> = h.log(&s).iter().skip(1).map(render).collect();
    assert_eq!(
        log[3..],
        [
            "step_started 1",
            "text \"partial answer\" (incomplete)",
            "retry 1",
            "step_failed Provider",
            "step_started 1",
            "text \"the rest\"",
            "step_ended Stop",
            "execution_succeeded"
        ]
    );
    let second = &h.provider.requests()[1];
    assert!(
        matches!(&second.messages[1], Message::Assistant { .. }),
        "the partial message is kept"
    );
    assert!(
        matches!(second.messages.last(), Some(Message::User { text, .. }) if text == agenthost_actors::CONTINUE_NOTE)
    );
    h.assert_replay_equal();
}

#[derive(Debug)]
struct Verbose;
impl Executor for Verbose {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async { Ok("é".repeat(20_000)) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_output_is_bounded_with_a_preview_and_the_whole_reads_back() {
    let mut tools = tools();
    tools.register(Tool::new(
        "verbose",
        "talks a lot",
        serde_json::json!({}),
        Arc::new(Verbose),
    ));
    let h = Harness::start_with(
        [call("c1", "verbose", "{}"), text("ok")],
        |_| {},
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await;
    let (s, _, requests) = check(&h, &["go"]).await;
    let (output, truncated) = h
        .log(&s)
        .into_iter()
        .find_map(|e| match e {
            Event::ToolSucceeded {
                output, truncated, ..
            } => Some((output, truncated)),
            _ => None,
        })
        .expect("settled");
    assert!(truncated);
    let (kept, marker) = output.split_once("\n[…").expect("a marker");
    let tail = marker.split_once("…]\n").expect("a closed marker").1;
    assert!(
        kept.chars().chain(tail.chars()).all(|c| c == 'é'),
        "cut on character boundaries"
    );
    assert!(kept.len() + tail.len() <= 32 * 1024);
    assert!(
        marker.contains(agenthost_actors::TOOL_OUTPUT_CUT),
        "{marker}"
    );
    // The whole output reads back.
    let message = h
        .log(&s)
        .into_iter()
        .find_map(|e| match e {
            Event::ToolSucceeded { id, .. } => Some(id),
            _ => None,
        })
        .expect("settled");
    let whole = h
        .runtime
        .tool_output(&s, &message, "c1")
        .await
        .expect("whole output");
    assert_eq!(whole.output, "é".repeat(20_000));
    assert!(whole.cut && !whole.failed);
    let missing = h.runtime.tool_output(&s, &message, "c2").await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
    assert!(matches!(&requests[1].messages[2], Message::Tool(r) if r.output == output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_can_name_its_own_model() {
    let h = harness_with(
        vec![text("from the big model")],
        |c| {
            let mut big = agenthost_actors::Model::new("scripted", "big-model-1");
            big.context_window = 1_000_000;
            c.models.insert("big".into(), big);
        },
        Vec::new(),
    )
    .await;
    let create = |model: &str| agenthost_actors::CreateSession {
        model: Some(model.to_owned()),
        ..Default::default()
    };
    let refused = h.runtime.create_session(create("missing")).await;
    assert!(
        matches!(refused, Err(Error::Invalid(ref m)) if m.contains("unknown model")),
        "{refused:?}"
    );
    let s = h
        .runtime
        .create_session(create("big"))
        .await
        .expect("created")
        .id;
    h.prompt(&s, "hello").await;
    h.idle(&s).await;
    assert_eq!(
        h.provider.last_request().expect("sent").model,
        "big-model-1"
    );
    let row = h.row(&s);
    assert_eq!(row.model.as_deref(), Some("big"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_connection_reset_after_output_keeps_the_partial_message_and_continues() {
    let reset = Script::new()
        .text("partial answer")
        .error(agenthost_llm::Error::new(
            agenthost_llm::ErrorKind::Transport { received_any: true },
            "connection reset by peer",
        ));
    let h = harness(vec![reset, text("the rest")]).await;
    // Under the paused clock, resume (no timeout) rather than wait_idle.
    let s = h.session().await;
    h.admit(&s, "tell me").await;
    assert_eq!(
        h.runtime.resume(&s).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    let log: Vec<String> = h.log(&s).iter().skip(1).map(render).collect();
    let requests = h.provider.requests();
    assert_eq!(
        log[3..],
        [
            "step_started 1",
            "text \"partial answer\" (incomplete)",
            "retry 1",
            "step_failed Provider",
            "step_started 1",
            "text \"the rest\"",
            "step_ended Stop",
            "execution_succeeded"
        ]
    );
    assert!(
        matches!(requests[1].messages.last(), Some(Message::User { text, .. }) if text == agenthost_actors::CONTINUE_NOTE)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retryable_error_after_a_complete_tool_call_settles_the_tool_and_fails_once() {
    let cut = Script::new()
        .tool_call("c1", "echo", "{}")
        .error(agenthost_llm::Error::incomplete(
            "connection reset mid-stream",
        ));
    let h = harness(vec![cut, text("never asked")]).await;
    let s = h.session().await;
    h.admit(&s, "look it up").await;
    let result = h.runtime.resume(&s).await;
    assert!(matches!(result, Err(Error::Provider(_))), "{result:?}");
    let log: Vec<String> = h.log(&s).iter().skip(1).map(render).collect();
    assert_eq!(
        log[3..],
        [
            "step_started 1",
            "tool_called c1 echo",
            "tool_ok c1 \"echo {}\"",
            "step_failed Provider",
            "execution_failed"
        ]
    );
    assert_eq!(h.provider.calls(), 1, "no automatic continuation");
    assert!(h.row(&s).claim.is_none());
}

#[test]
fn the_continue_note_reads_as_written() {
    let note = agenthost_actors::CONTINUE_NOTE;
    assert!(!note.contains("  "), "{note:?}");
    assert!(
        note.contains("Continue exactly where it stopped"),
        "{note:?}"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cut_attempts_usage_counts_on_its_message_and_the_totals_equal_the_messages() {
    let spent = Usage {
        input: 30,
        output: 5,
        ..Usage::default()
    };
    let rest = Usage {
        input: 40,
        output: 7,
        ..Usage::default()
    };
    let cut = Script::new()
        .text("partial")
        .usage(spent)
        .error(agenthost_llm::Error::incomplete("connection reset"));
    let continued = Script::new()
        .text(" and the rest")
        .usage(rest)
        .finish(FinishReason::Stop);
    let h = harness(vec![cut, continued]).await;
    let s = h.session().await;
    h.admit(&s, "go").await;
    assert_eq!(
        h.runtime.resume(&s).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    let messages = h
        .runtime
        .snapshot()
        .expect("snap")
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    let usages: Vec<(u64, u64)> = messages
        .iter()
        .filter_map(|m| match m {
            agenthost_model::Message::Assistant(a) => Some((a.usage.input, a.usage.output)),
            _ => None,
        })
        .collect();
    assert_eq!(
        usages,
        [(30, 5), (40, 7)],
        "each attempt on its own message"
    );
    let row = h.row(&s);
    assert_eq!((row.usage.input, row.usage.output), (70, 12));
    h.assert_replay_equal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tool_choice_none_gets_auto_and_a_call_on_the_last_step_still_fails() {
    let h = harness_with(
        vec![call("c1", "echo", "{}"), call("c2", "echo", "{}")],
        |c| {
            if let Some(agent) = c.agents.get_mut("default") {
                agent.steps = 2;
            }
            if let Some(model) = c.models.get_mut("default") {
                model.tool_choice_none = false;
            }
        },
        Vec::new(),
    )
    .await;
    let (s, log, requests) = check(&h, &["go"]).await;
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].tools, requests[0].tools);
    assert_eq!(requests[1].tool_choice, ToolChoice::Auto);
    assert!(
        log.iter()
            .any(|l| l.starts_with("tool_failed c2 tool calls are disabled")),
        "{log:#?}"
    );
    assert!(h.row(&s).claim.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflow_compaction_with_a_single_stream_permit_does_not_deadlock() {
    let overflow =
        || Script::new().error(agenthost_llm::Error::context_overflow("prompt is too long"));
    let h = harness_with(
        vec![
            text("first"),
            overflow(),
            harness::summary("the summary"),
            text("rebuilt"),
        ],
        |c| {
            long_history_config(c, true);
            c.limits.concurrent_streams = 1;
        },
        Vec::new(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, &"old context ".repeat(100)).await;
    h.idle(&s).await;
    h.prompt(&s, "new question").await;
    h.idle(&s).await;
    assert_eq!(h.provider.calls(), 4);
    assert_eq!(h.count(&s, "compaction_ended"), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_backoff_holds_no_stream_permit() {
    let limited = Script::new().error(agenthost_llm::Error::rate_limit(Some(Duration::from_secs(
        600,
    ))));
    let h = harness_with(
        vec![limited, text("b's answer"), text("a's answer")],
        |c| c.limits.concurrent_streams = 1,
        Vec::new(),
    )
    .await;
    let (a, b) = (h.session().await, h.session().await);
    h.admit(&a, "from a").await;
    h.admit(&b, "from b").await;
    let first = tokio::spawn({
        let (r, a) = (h.runtime.clone(), a.clone());
        async move { r.resume(&a).await }
    });
    // a's first attempt is refused with a long retry-after; b streams during a's backoff.
    while h.count(&a, "retry_scheduled") == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        h.runtime.resume(&b).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    assert_eq!(
        first.await.expect("joined"),
        Ok(Outcome::Completed { steps: 1 })
    );
    assert_eq!(
        h.request_order(),
        [a.to_string(), b.to_string(), a.to_string()]
    );
}

/// A provider that streams without end (a hostile or broken server) fails the step once its
/// answer passes the output bound: the message stays readable, and the session takes the next
/// prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_fails_the_step_at_the_output_bound() {
    let chunk = "x".repeat(64 * 1024);
    let mut endless = Script::new();
    for _ in 0..(agenthost_actors::MAX_STEP_OUTPUT / chunk.len() + 8) {
        endless = endless.text(chunk.clone());
    }
    // The kept partial answer is far over the window: the next prompt compacts first.
    let h = harness(vec![
        endless.finish(FinishReason::Stop),
        harness::summary("talked too much"),
        text("fine again"),
    ])
    .await;
    let s = h.session().await;
    h.prompt(&s, "talk").await;
    h.idle(&s).await;
    let kinds = h.kinds(&s);
    assert!(kinds.contains(&"step_failed"), "{kinds:?}");
    assert!(kinds.contains(&"execution_failed"), "{kinds:?}");
    let snap = h.runtime.snapshot().expect("snapshot");
    let messages = snap
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages stay readable");
    let stored: usize = messages
        .iter()
        .map(|m| match m {
            agenthost_model::Message::Assistant(a) => format!("{:?}", a.parts).len(),
            _ => 0,
        })
        .sum();
    assert!(
        stored <= agenthost_actors::MAX_STEP_OUTPUT + 4096,
        "{stored} bytes kept"
    );
    h.prompt(&s, "again").await;
    h.idle(&s).await;
    assert_eq!(h.kinds(&s).last(), Some(&"execution_succeeded"));
    h.assert_replay_equal();
}

/// A span's name and its fields as text.
type SpanSeen = (String, BTreeMap<String, String>);

/// Spans as a test sees them: name and fields, in the order they closed.
#[derive(Clone, Default)]
struct Spans {
    open: Arc<std::sync::Mutex<HashMap<u64, SpanSeen>>>,
    closed: Arc<std::sync::Mutex<Vec<SpanSeen>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name().to_owned();
        self.open
            .lock()
            .expect("lock")
            .insert(id.into_u64(), (name, fields));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some((_, fields)) = self.open.lock().expect("lock").get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }

    fn on_close(&self, id: tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = self.open.lock().expect("lock").remove(&id.into_u64()) {
            self.closed.lock().expect("lock").push(span);
        }
    }
}

/// A drain, each step, each provider call and each tool call is a span carrying the session id,
/// the step number and the outcome, so one turn can be followed in any tracing backend.
#[tokio::test(flavor = "current_thread")]
async fn drains_steps_provider_calls_and_tools_are_spans() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let h = harness(vec![call("c1", "echo", r#"{"q":1}"#), text("done")]).await;
    let (s, _, _) = check(&h, &["look it up"]).await;
    let closed = spans.closed.lock().expect("lock").clone();
    let named = |name: &str| -> Vec<BTreeMap<String, String>> {
        closed
            .iter()
            .filter(|(n, f)| n == name && f.get("session_id") == Some(&s.to_string()))
            .map(|(_, f)| f.clone())
            .collect()
    };
    assert!(!named("drain").is_empty(), "{closed:?}");
    let steps = named("step");
    let outcomes: Vec<(&str, &str)> = steps
        .iter()
        .map(|f| (f["step"].as_str(), f["outcome"].as_str()))
        .collect();
    assert_eq!(outcomes, [("1", "continue"), ("2", "done")], "{closed:?}");
    let calls = named("provider_call");
    assert_eq!(calls.len(), 2, "{closed:?}");
    assert!(
        calls
            .iter()
            .all(|f| f["outcome"] == "ok" && f["attempt"] == "0" && f.contains_key("model"))
    );
    let tools = named("tool_call");
    assert_eq!(tools.len(), 1, "{closed:?}");
    assert_eq!(
        (
            tools[0]["tool"].as_str(),
            tools[0]["call_id"].as_str(),
            tools[0]["outcome"].as_str()
        ),
        ("echo", "c1", "ok")
    );
}
