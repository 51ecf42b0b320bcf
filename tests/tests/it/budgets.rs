//! Budgets through the runtime (ARCHITECTURE.md, "Budgets"): a call whose worst case would pass
//! the budget is never made; the session records why and is blocked, keeping its input and its
//! claim, until its budget is raised (then it goes on where it stopped, no recovery note) or a
//! user interrupts it; retries, restarts and `generate` are checked like any call.

use std::sync::Arc;

use agenthost_actors::{
    Activity, Call, Config, Error, Executor, Extensions, PromptRequest, RESTART_NOTE, Tool, Tools,
};
use agenthost_llm::scripted::Script;
use agenthost_llm::{Error as LlmError, FinishReason, Usage};
use agenthost_model::{Budget, Event, Limit};
use futures::future::BoxFuture;

use crate::harness::{Harness, text, user_texts};

#[derive(Debug)]
struct Echo;

impl Executor for Echo {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async move { Ok(format!("echo {}", call.input)) })
    }
}

fn echo() -> Extensions {
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "echo",
        "echoes",
        serde_json::json!({"type": "object"}),
        Arc::new(Echo),
    ));
    Extensions {
        tools,
        ..Default::default()
    }
}

/// A reply of at most this many tokens: a call's worst case is its input estimate plus this.
const MAX_OUTPUT: u64 = 100;

/// What a call reports: 150 tokens.
fn used() -> Usage {
    Usage {
        input: 100,
        output: 50,
        ..Default::default()
    }
}

/// The agent's budget: `max_tokens`, and replies of at most [`MAX_OUTPUT`] tokens.
fn limited(max_tokens: u64) -> impl FnOnce(&mut Config) {
    move |config: &mut Config| {
        for model in config.models.values_mut() {
            model.max_output = Some(MAX_OUTPUT as u32);
        }
        for agent in config.agents.values_mut() {
            agent.budget = Budget {
                max_tokens: Some(max_tokens),
                ..Budget::default()
            };
        }
    }
}

/// A budget that leaves room for everything these tests call.
fn ample() -> Budget {
    Budget {
        max_tokens: Some(100_000),
        ..Budget::default()
    }
}

fn exhausted(log: &[Event]) -> Vec<Limit> {
    log.iter()
        .filter_map(|e| match e {
            Event::BudgetExhausted { which, .. } => Some(*which),
            _ => None,
        })
        .collect()
}

/// After one call of 150 tokens, less than a reply's worth is left: the call its tool results
/// owe is not made. The session is blocked with its claim and its queued input, and goes on
/// where it stopped once its budget is raised: no recovery, no restart note.
#[tokio::test]
async fn a_session_pauses_before_the_call_its_budget_cannot_pay_and_goes_on_when_raised() {
    let h = Harness::start_with(
        [
            Script::new()
                .tool_call("call_1", "echo", r#"{"x":1}"#)
                .usage(used())
                .finish(FinishReason::ToolCalls),
            text("done"),
            text("later, answered"),
        ],
        limited(150 + MAX_OUTPUT - 1),
        echo(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    assert_eq!(
        h.provider.requests().len(),
        1,
        "the second call was not made"
    );
    let log = h.log(&s);
    assert_eq!(exhausted(&log), [Limit::Tokens]);
    let row = h.row(&s);
    assert!(row.claim.is_some(), "the exchange keeps its claim");
    assert_eq!(row.blocked, Some(Limit::Tokens));
    assert_eq!(h.runtime.activity(&s), Activity::Blocked);
    let Some(Event::BudgetExhausted { spent, limit, .. }) = log.last() else {
        panic!("the drain ends on the block: {log:?}");
    };
    assert_eq!((*spent, *limit), (150, 150 + MAX_OUTPUT - 1));

    // Input that comes meanwhile waits: a queued prompt stays pending through a wake.
    let mut later = PromptRequest::new(&s, "later");
    later.delivery = agenthost_model::Delivery::Queue;
    h.runtime.prompt(later).await.expect("admitted");
    h.idle(&s).await;
    assert_eq!(h.provider.requests().len(), 1, "still nothing over budget");
    assert_eq!(h.row(&s).pending, 1);

    // Raised: the exchange goes on where it stopped, then the queued input runs.
    let raised = ample();
    let row = h.runtime.set_budget(&s, raised).await.expect("raised");
    assert_eq!(row.budget, raised);
    h.idle(&s).await;
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 3, "the owed call, then the queued input");
    for request in &requests {
        assert!(
            !user_texts(request).iter().any(|t| t.contains(RESTART_NOTE)),
            "a block is no restart"
        );
    }
    let log = h.log(&s);
    assert!(
        !log.iter()
            .any(|e| matches!(e, Event::RecoveryAttempted { .. }))
    );
    let row = h.row(&s);
    assert_eq!(
        (row.claim.is_none(), row.blocked, row.pending),
        (true, None, 0)
    );
    assert_eq!(h.runtime.activity(&s), Activity::Idle);
    h.assert_replay_equal();
}

/// A failed attempt's usage counts: the retry it schedules is not made when what is left does
/// not cover it. The step settles as failed, so the retry is owed again once the budget allows.
#[tokio::test]
async fn a_retry_is_a_call_like_any_other() {
    let h = Harness::start_with(
        [
            // The attempt reports its usage, then fails retryably.
            Script::new()
                .usage(used())
                .event(agenthost_llm::Event::StepFinish {
                    reason: FinishReason::Error,
                    raw_reason: None,
                    usage: used(),
                })
                .error(LlmError::rate_limit(Some(
                    std::time::Duration::from_millis(1),
                ))),
            text("after the retry"),
        ],
        limited(150 + MAX_OUTPUT - 1),
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    assert_eq!(
        h.provider.requests().len(),
        1,
        "the retry was not made: {:?}",
        h.log(&s)
    );
    let log = h.log(&s);
    assert_eq!(exhausted(&log), [Limit::Tokens]);
    assert!(log.iter().any(|e| matches!(e, Event::StepUsage { .. })));
    assert_eq!(h.row(&s).usage.input + h.row(&s).usage.output, 150);
    h.runtime.set_budget(&s, ample()).await.expect("raised");
    h.idle(&s).await;
    assert_eq!(h.provider.requests().len(), 2);
    let log = h.log(&s);
    assert!(
        log.iter()
            .any(|e| matches!(e, Event::TextEnded { text, .. } if text == "after the retry"))
    );
    assert!(matches!(log.last(), Some(Event::ExecutionSucceeded)));
}

/// A user interrupt ends a blocked turn as any other: the claim is released, the block with it,
/// and the session owes nothing more.
#[tokio::test]
async fn an_interrupt_ends_a_blocked_turn() {
    let h = Harness::start_with(
        [Script::new()
            .tool_call("call_1", "echo", "{}")
            .usage(used())
            .finish(FinishReason::ToolCalls)],
        limited(150 + MAX_OUTPUT - 1),
        echo(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "go").await;
    h.idle(&s).await;
    assert_eq!(h.row(&s).blocked, Some(Limit::Tokens));
    assert!(h.runtime.interrupt(&s).await.expect("interrupted"));
    h.idle(&s).await;
    let row = h.row(&s);
    assert_eq!((row.claim.is_none(), row.blocked), (true, None));
    assert_eq!(h.runtime.activity(&s), Activity::Idle);
    assert_eq!(h.provider.requests().len(), 1);
}

/// `generate` is checked against what is left of the session's life budget, and a session's
/// own budget replaces its agent's limits where it sets them.
#[tokio::test]
async fn generate_over_budget_is_refused_and_a_sessions_own_budget_wins() {
    let h = Harness::start_with([text("a recap")], limited(10), Extensions::default()).await;
    let s = h.session().await;
    match h.runtime.generate(&s, "recap").await {
        Err(Error::BudgetExhausted { which, limit, .. }) => {
            assert_eq!((which, limit), (Limit::Tokens, 10));
        }
        other => panic!("refused for its budget, got {other:?}"),
    }
    assert!(h.provider.requests().is_empty());
    h.runtime.set_budget(&s, ample()).await.expect("set");
    assert_eq!(
        h.runtime.generate(&s, "recap").await.expect("generated"),
        "a recap"
    );
    // Transient: no durable byte changed but the budget set.
    assert_eq!(h.row(&s).usage, agenthost_model::Usage::default());
}

/// A restart finds a blocked session blocked: its recovery makes no call the budget cannot pay,
/// and counts no attempt; raised, it goes on.
#[tokio::test]
async fn a_restart_keeps_a_blocked_session_blocked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(agenthost_llm::scripted::Scripted::new([
        Script::new()
            .tool_call("call_1", "echo", "{}")
            .usage(used())
            .finish(FinishReason::ToolCalls),
        text("done"),
    ]));
    let start = |provider: Arc<agenthost_llm::scripted::Scripted>| {
        let mut config = crate::harness::config(dir.path(), provider);
        limited(150 + MAX_OUTPUT - 1)(&mut config);
        agenthost_actors::Runtime::start_with(config, echo())
    };
    let runtime = start(provider.clone()).await.expect("starts");
    let s = runtime
        .create_session(Default::default())
        .await
        .expect("session")
        .id;
    runtime
        .prompt(PromptRequest::new(&s, "go"))
        .await
        .expect("admitted");
    runtime
        .wait_idle(&s, std::time::Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(provider.requests().len(), 1);
    runtime.shutdown().await;

    let runtime = start(provider.clone()).await.expect("starts again");
    runtime.recovered().await;
    runtime
        .wait_idle(&s, std::time::Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(
        provider.requests().len(),
        1,
        "recovery made no call over budget"
    );
    let row = runtime
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read")
        .expect("exists");
    assert_eq!(row.blocked, Some(Limit::Tokens));
    assert_eq!(row.resume_attempts, 0, "a block is no crash");
    runtime.set_budget(&s, ample()).await.expect("raised");
    runtime
        .wait_idle(&s, std::time::Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(provider.requests().len(), 2);
    runtime.shutdown().await;
}
