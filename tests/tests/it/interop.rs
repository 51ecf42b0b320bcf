//! Provider interop: every request the runtime sends, encoded for each wire format, is one the
//! real API accepts (the rules of `agenthost_llm::rules`): a plain turn, a tool loop with signed
//! reasoning, the step-limit step, a continuation after a stream error, a failed step after a
//! tool call, and `generate` after tools.

use std::sync::Arc;

use agenthost_actors::{Call, Executor, Extensions, Outcome, Tool, Tools};
use agenthost_llm::scripted::Script;
use agenthost_llm::{Anthropic, Config, FinishReason, Kind, OpenAi, ReasoningMetadata, Request};
use futures::future::BoxFuture;

use crate::harness::{Harness, text};

#[derive(Debug)]
struct Echo;
impl Executor for Echo {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async move { Ok(format!("echo {}", call.input)) })
    }
}

async fn harness(scripts: Vec<Script>, steps: u32) -> Harness {
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "echo",
        "echoes",
        serde_json::json!({"type": "object"}),
        Arc::new(Echo),
    ));
    Harness::start_with(
        scripts,
        |c| {
            if let Some(agent) = c.agents.get_mut("default") {
                agent.tools = vec!["*".into()];
                agent.steps = steps;
            }
        },
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await
}

/// Every request the provider received, checked against both wire formats' rules.
fn check_all(requests: &[Request]) {
    let anthropic = Anthropic::new(&Config::new(Kind::Anthropic)).expect("client");
    let openai = OpenAi::new(&Config::new(Kind::Openai)).expect("client");
    for (n, request) in requests.iter().enumerate() {
        let body = anthropic.body(request);
        if let Err(e) = agenthost_llm::rules::anthropic(&body) {
            panic!("request {n} refused by the Anthropic rules: {e}\n{body:#}");
        }
        let body = openai.body(request);
        if let Err(e) = agenthost_llm::rules::openai(&body) {
            panic!("request {n} refused by the OpenAI rules: {e}\n{body:#}");
        }
    }
}

fn call(id: &str) -> Script {
    Script::new()
        .tool_call(id, "echo", "{}")
        .finish(FinishReason::ToolCalls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_turn_and_a_tool_loop_with_signed_reasoning() {
    let signed = Script::new()
        .reasoning_with(
            "thinking it over",
            ReasoningMetadata::Anthropic {
                signature: "sig==".into(),
            },
        )
        .tool_call("c1", "echo", "{}")
        .finish(FinishReason::ToolCalls);
    let h = harness(vec![text("hi"), signed, text("done")], 25).await;
    let s = h.session().await;
    h.prompt(&s, "hello").await;
    h.idle(&s).await;
    h.prompt(&s, "use a tool").await;
    h.idle(&s).await;
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 3);
    check_all(&requests);
    // The thinking block is replayed with its signature.
    let body = Anthropic::new(&Config::new(Kind::Anthropic))
        .expect("client")
        .body(&requests[2]);
    assert!(body.to_string().contains("sig=="), "{body:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_limit_step_and_generate_after_tools() {
    let h = harness(vec![call("c1"), call("c2"), text("recap")], 2).await;
    let s = h.session().await;
    h.prompt(&s, "loop").await;
    h.idle(&s).await;
    let answer = h.runtime.generate(&s, "where are we?").await;
    assert_eq!(answer.as_deref(), Ok("recap"));
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 3, "step 1, the step-limit step, generate");
    check_all(&requests);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_continuation_after_a_stream_error_and_a_failed_step_after_a_tool_call() {
    let cut = Script::new()
        .text("partial")
        .error(agenthost_llm::Error::incomplete("connection reset"));
    let failed = Script::new()
        .tool_call("c1", "echo", "{}")
        .error(agenthost_llm::Error::incomplete("connection reset"));
    let h = harness(vec![cut, text("rest"), failed, text("after")], 25).await;
    let s = h.session().await;
    h.admit(&s, "first").await;
    assert_eq!(
        h.runtime.resume(&s).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    h.admit(&s, "second").await;
    assert!(h.runtime.resume(&s).await.is_err(), "the step fails once");
    h.admit(&s, "third").await;
    assert_eq!(
        h.runtime.resume(&s).await,
        Ok(Outcome::Completed { steps: 1 })
    );
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 4);
    check_all(&requests);
}
