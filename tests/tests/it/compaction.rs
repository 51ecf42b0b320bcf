//! Compaction for real agent work: a long tool loop after one prompt compacts inside the
//! exchange and carries on; a provider that refuses by size gets one compaction per overflow; a
//! summary that breaks the template gets one reminder.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agenthost_actors::{
    Call, Error, Executor, Extensions, SUMMARY_OFF_TEMPLATE as OFF_TEMPLATE, SUMMARY_REQUEST,
    SUMMARY_SECTIONS, Tool, Tools,
};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_llm::{FinishReason, Message, Request};
use agenthost_model::{Event, Seq, SessionId};
use futures::future::BoxFuture;

use crate::harness::{self, Harness};

/// Tool calls the scripted agent makes before it answers.
const CALLS: usize = 40;
const PROMPT: &str = "read every file and report";

/// Returns 6 KiB that name the call.
#[derive(Debug)]
struct Read;
impl Executor for Read {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async move { Ok(format!("{}:{}", call.call_id, "x".repeat(6 * 1024))) })
    }
}

fn extensions() -> Extensions {
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "read",
        "reads a file",
        serde_json::json!({"type": "object"}),
        Arc::new(Read),
    ));
    Extensions {
        tools,
        hooks: Vec::new(),
    }
}

fn is_summary(request: &Request) -> bool {
    matches!(request.messages.last(), Some(Message::User { text, .. }) if text.starts_with(SUMMARY_REQUEST))
}

/// Bytes of everything a request carries, as a server would count them.
fn size(request: &Request) -> usize {
    format!(
        "{:?}{:?}{:?}",
        request.system, request.messages, request.tools
    )
    .len()
}

/// One prompt, then `CALLS` tool calls one step at a time, then the answer; summaries follow the
/// template. `refuse_above` makes the provider answer `context_length_exceeded` above that size.
fn agent(refuse_above: Option<usize>, overflows: Arc<AtomicUsize>) -> Arc<Scripted> {
    let steps = AtomicUsize::new(0);
    Arc::new(Scripted::from_fn(move |request: &Request| {
        if refuse_above.is_some_and(|limit| size(request) > limit) {
            overflows.fetch_add(1, Ordering::SeqCst);
            return Some(Script::new().error(agenthost_llm::Error::context_overflow(
                "This model's maximum context length is exceeded",
            )));
        }
        if is_summary(request) {
            return Some(harness::summary("reading files one by one"));
        }
        let n = steps.fetch_add(1, Ordering::SeqCst);
        Some(match n < CALLS {
            true => Script::new()
                .tool_call(format!("c{n}"), "read", "{}")
                .finish(FinishReason::ToolCalls),
            false => Script::new().text("all done").finish(FinishReason::Stop),
        })
    }))
}

async fn run(h: &Harness) -> agenthost_model::SessionId {
    let s = h.session().await;
    h.prompt(&s, PROMPT).await;
    h.idle(&s).await;
    h.assert_replay_equal();
    s
}

/// Every step request after a tool call ends with that call and its result, in order; the
/// prompt's text is visible in every step request (verbatim or quoted in the summary).
fn assert_steps_see_their_tools(requests: &[Request]) {
    let steps: Vec<&Request> = requests.iter().filter(|r| !is_summary(r)).collect();
    let mut answered = 0;
    for request in &steps {
        let seen = format!("{:?}", request.messages);
        assert!(seen.contains(PROMPT), "the prompt is lost: {seen:.2000}");
        let n = request.messages.len();
        if answered == 0 && !matches!(request.messages.get(n - 1), Some(Message::Tool(_))) {
            continue;
        }
        let call = format!("c{answered}");
        assert!(
            matches!(&request.messages[n - 2], Message::Assistant { parts }
                if format!("{parts:?}").contains(&format!("\"{call}\""))),
            "step {answered}: {:?}",
            &request.messages[n - 2]
        );
        assert!(
            matches!(&request.messages[n - 1], Message::Tool(r) if r.call_id == call && r.output.starts_with(&format!("{call}:"))),
            "step {answered}: {:?}",
            &request.messages[n - 1]
        );
        answered += 1;
    }
    assert_eq!(answered, CALLS, "every call answered in the next request");
}

/// A compaction that cut inside the exchange: the kept window starts at an assistant message.
fn cut_inside(h: &Harness, s: &agenthost_model::SessionId) -> usize {
    let snap = h.runtime.snapshot().expect("snapshot");
    let messages = snap.messages(s, Seq::ZERO, usize::MAX).expect("messages");
    h.log(s)
        .iter()
        .filter_map(|e| match e {
            Event::CompactionEnded { kept_from, .. } => Some(*kept_from),
            _ => None,
        })
        .filter(|kept_from| {
            messages.iter().any(|m| {
                m.seq() == *kept_from && matches!(m, agenthost_model::Message::Assistant(_))
            })
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_tool_loop_compacts_inside_the_exchange_and_finishes() {
    let provider = agent(None, Arc::default());
    let h = Harness::over(
        provider.clone(),
        |c| {
            for model in c.models.values_mut() {
                // Overflows after about ten 6 KiB results.
                model.context_window = 16_000;
                model.max_output = Some(2_000);
            }
            for agent in c.agents.values_mut() {
                agent.steps = CALLS as u32 + 5;
            }
        },
        extensions(),
    )
    .await;
    let s = run(&h).await;
    let kinds = h.kinds(&s);
    assert!(!kinds.contains(&"execution_failed"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"execution_succeeded"));
    let last = h
        .runtime
        .snapshot()
        .expect("snapshot")
        .messages(&s, Seq::ZERO, usize::MAX)
        .expect("messages")
        .pop();
    assert!(
        matches!(&last, Some(agenthost_model::Message::Assistant(a)) if format!("{:?}", a.parts).contains("all done")),
        "{last:?}"
    );
    assert!(cut_inside(&h, &s) >= 1, "{kinds:?}");
    assert_eq!(h.count(&s, "compaction_failed"), 0);
    let requests = provider.requests();
    assert_steps_see_their_tools(&requests);
    // Every summary after the first updates the one before.
    let summaries: Vec<&Request> = requests.iter().filter(|r| is_summary(r)).collect();
    assert!(summaries.len() >= 2, "{} compactions", summaries.len());
    for (n, request) in summaries.iter().enumerate() {
        let updates = format!("{:?}", request.messages).contains("<previous-summary>");
        assert_eq!(updates, n > 0, "summary request {n}");
    }
    // No request the runtime sent outgrew the model.
    for request in &requests {
        assert!(
            agenthost_actors::prepare::estimate(request) <= 16_000,
            "{}",
            agenthost_actors::prepare::estimate(request)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_refuses_by_size_gets_one_compaction_per_overflow() {
    let overflows = Arc::new(AtomicUsize::new(0));
    let provider = agent(Some(80_000), overflows.clone());
    let h = Harness::over(
        provider.clone(),
        |c| {
            for model in c.models.values_mut() {
                // The runtime's own estimate never triggers: only the provider refuses.
                model.context_window = 1_000_000;
            }
            for agent in c.agents.values_mut() {
                agent.steps = CALLS as u32 + 5;
            }
        },
        extensions(),
    )
    .await;
    let s = run(&h).await;
    let kinds = h.kinds(&s);
    assert!(!kinds.contains(&"execution_failed"), "{kinds:?}");
    let overflowed = overflows.load(Ordering::SeqCst);
    assert!(overflowed >= 1);
    // Each overflow compacted once and its step then went through.
    assert_eq!(h.count(&s, "compaction_ended"), overflowed, "{kinds:?}");
    assert_eq!(h.count(&s, "step_failed"), 0, "{kinds:?}");
    assert!(cut_inside(&h, &s) >= 1);
    // The requests refused are sent again after the compaction.
    let sent: Vec<Request> = provider
        .requests()
        .into_iter()
        .filter(|r| size(r) <= 80_000)
        .collect();
    assert_steps_see_their_tools(&sent);
}

/// A summary off the template gets one reminder; still off it, it is kept, marked as such, so the
/// turn goes on (small models often ignore templates); only a reply with no text fails the
/// compaction, and a reply that follows the template after the reminder is taken as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_off_the_template_gets_one_reminder_then_is_kept_marked() {
    let prose = || {
        Script::new()
            .text("It went fine.")
            .finish(FinishReason::Stop)
    };
    let empty = || Script::new().finish(FinishReason::Stop);
    let answer = |t: &str| Script::new().text(t).finish(FinishReason::Stop);
    let long = "many words ".repeat(200);
    let h = Harness::start_with(
        [
            answer(&long),
            answer(&long),
            prose(),
            prose(),
            answer(&long),
            empty(),
            empty(),
            answer(&long),
            prose(),
            harness::summary("second try"),
        ],
        |c| c.compaction.keep_tokens = 100,
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    for text in ["first", "second"] {
        h.prompt(&s, text).await;
        h.idle(&s).await;
    }
    let kept_from = h.runtime.compact(&s).await.expect("compacted");
    assert_eq!(h.row(&s).active_from, kept_from);
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 4, "two summary calls");
    let reminder = &requests[3].messages;
    assert!(
        matches!(reminder.last(), Some(Message::User { text, .. }) if text.contains("did not follow the required format")),
        "{reminder:?}"
    );
    assert!(
        matches!(&reminder[reminder.len() - 2], Message::Assistant { parts } if format!("{parts:?}").contains("It went fine."))
    );
    let summary = last_summary(&h, &s);
    assert!(summary.starts_with(OFF_TEMPLATE), "{summary}");
    assert!(summary.contains("It went fine."), "{summary}");

    // No text at all, twice: the compaction fails, and nothing is cut.
    h.prompt(&s, "third").await;
    h.idle(&s).await;
    let before = h.row(&s);
    let result = h.runtime.compact(&s).await;
    let Err(Error::Provider(error)) = &result else {
        panic!("{result:?}");
    };
    assert!(error.to_string().contains("no text"), "{error}");
    let log = h.log(&s);
    assert!(
        log.iter().any(
            |e| matches!(e, Event::CompactionFailed { error, .. } if error.contains("no text"))
        ),
        "{log:#?}"
    );
    let after = h.row(&s);
    assert_eq!(after.active_from, before.active_from, "nothing was cut");
    assert!(after.claim.is_none());

    // A reply that follows the template after the reminder is taken as it is.
    h.prompt(&s, "fourth").await;
    h.idle(&s).await;
    let kept_from = h.runtime.compact(&s).await.expect("compacted");
    assert_eq!(h.row(&s).active_from, kept_from);
    let summary = last_summary(&h, &s);
    assert!(!summary.contains(OFF_TEMPLATE), "{summary}");
    for section in SUMMARY_SECTIONS {
        assert!(summary.contains(&format!("## {section}")), "{summary}");
    }
    // Usage of every summary call, the failed ones included, is in the totals.
    h.assert_replay_equal();
}

fn last_summary(h: &Harness, s: &SessionId) -> String {
    h.log(s)
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::CompactionEnded { summary, .. } => Some(summary.clone()),
            _ => None,
        })
        .expect("ended")
}

/// Manual compaction cuts inside a tool loop too, and `generate` then sees the summary and the
/// kept window, not what was summarized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_compaction_cuts_a_tool_loop_and_generate_sees_the_result() {
    let provider = agent(None, Arc::default());
    let h = Harness::over(
        provider.clone(),
        |c| {
            for agent in c.agents.values_mut() {
                agent.steps = CALLS as u32 + 5;
            }
            c.compaction.auto = false;
            c.compaction.keep_tokens = 4_000;
        },
        extensions(),
    )
    .await;
    let s = run(&h).await;
    assert_eq!(h.count(&s, "compaction_started"), 0);
    let kept_from = h.runtime.compact(&s).await.expect("compacted");
    assert!(cut_inside(&h, &s) == 1, "{:?}", h.kinds(&s));
    let summary = h
        .log(&s)
        .iter()
        .find_map(|e| match e {
            Event::CompactionEnded { summary, .. } => Some(summary.clone()),
            _ => None,
        })
        .expect("ended");
    // The prompt is no longer in the kept window: the runtime quoted it.
    assert!(summary.contains(&format!("> {PROMPT}")), "{summary}");
    h.runtime.generate(&s, "recap").await.expect("generated");
    let request = provider.last_request().expect("generate request");
    let seen = format!("{:?}", request.messages);
    assert!(seen.contains("reading files one by one"), "the summary");
    assert!(!seen.contains("\"c0\""), "a summarized call");
    assert!(seen.contains(&format!("\"c{}\"", CALLS - 1)), "a kept call");
    assert_eq!(h.row(&s).active_from, kept_from);
}

/// The summary call follows the step's retry policy (a rate limit waits and retries), a provider
/// overflow halves the request, and the summary streams live as `summary` deltas.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn summary_calls_retry_shrink_after_an_overflow_and_stream_live() {
    let answer = |t: String| Script::new().text(t).finish(FinishReason::Stop);
    let h = Harness::start_with(
        [
            answer("a".repeat(20_000)),
            answer("b".repeat(20_000)),
            Script::new().error(agenthost_llm::Error::rate_limit(Some(
                std::time::Duration::from_secs(30),
            ))),
            Script::new().error(agenthost_llm::Error::context_overflow("too long")),
            harness::summary("carry on"),
        ],
        |c| {
            c.compaction.auto = false;
            c.compaction.keep_tokens = 100;
            for model in c.models.values_mut() {
                model.context_window = 8_000;
                model.max_output = Some(1_000);
            }
        },
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    for text in ["first", "second"] {
        h.admit(&s, text).await;
        h.runtime.resume(&s).await.expect("answered");
    }
    let mut live = h.runtime.subscribe_session(&s);
    h.runtime.compact(&s).await.expect("compacted");
    let requests: Vec<Request> = h.provider.requests().into_iter().skip(2).collect();
    assert_eq!(requests.len(), 3, "refused, overflowed, answered");
    let text = |r: &Request| match r.messages.last() {
        Some(Message::User { text, .. }) => text.len(),
        _ => 0,
    };
    assert_eq!(
        text(&requests[0]),
        text(&requests[1]),
        "a retry sends the same"
    );
    assert!(
        text(&requests[2]) < text(&requests[1]),
        "the overflow halves the request: {} then {}",
        text(&requests[1]),
        text(&requests[2])
    );
    let compaction = h
        .log(&s)
        .iter()
        .find_map(|e| match e {
            Event::CompactionEnded { id, .. } => Some(id.clone()),
            _ => None,
        })
        .expect("ended");
    let mut streamed = String::new();
    while let Ok(item) = live.try_recv() {
        if let agenthost_actors::Live::Delta {
            message,
            kind: agenthost_actors::DeltaKind::Summary,
            delta,
            ..
        } = &item.1
        {
            assert_eq!(message, &compaction);
            streamed.push_str(delta);
        }
    }
    assert!(streamed.contains("## Objective"), "{streamed:?}");
    h.assert_replay_equal();
}
