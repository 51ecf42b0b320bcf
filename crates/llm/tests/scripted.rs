//! The scripted provider: transcripts become event streams that follow the stream contract,
//! requests are recorded, time is tokio's (paused-clock friendly), gates and hangs let tests
//! act mid-stream.

use std::time::Duration;

use agenthost_llm::scripted::{Gate, Script, Scripted};
use agenthost_llm::{
    Error, ErrorKind, Event, FinishReason, Message, Provider, ReasoningMetadata, Request, Usage,
};
use futures::StreamExt;

fn request(text: &str) -> Request {
    let mut request = Request::new("scripted-model");
    request.messages.push(Message::user(text));
    request
}

/// Renders a stream compactly, one item per line, for whole-transcript comparisons.
fn render(items: &[Result<Event, Error>]) -> String {
    items
        .iter()
        .map(|item| match item {
            Ok(Event::StepStart { id, model }) => format!(
                "start {} {}",
                id.as_deref().unwrap_or("-"),
                model.as_deref().unwrap_or("-")
            ),
            Ok(Event::TextStart { part }) => format!("text_start {part}"),
            Ok(Event::TextDelta { part, delta }) => format!("text {part} {delta:?}"),
            Ok(Event::TextEnd { part }) => format!("text_end {part}"),
            Ok(Event::ReasoningStart { part }) => format!("reasoning_start {part}"),
            Ok(Event::ReasoningDelta { part, delta }) => format!("reasoning {part} {delta:?}"),
            Ok(Event::ReasoningEnd { part, metadata }) => {
                format!("reasoning_end {part} {metadata:?}")
            }
            Ok(Event::ToolInputStart { part, id, name }) => {
                format!("tool_start {part} {id} {name}")
            }
            Ok(Event::ToolInputDelta { part, delta }) => format!("tool_delta {part} {delta}"),
            Ok(Event::ToolInputEnd { part }) => format!("tool_end {part}"),
            Ok(Event::ToolCall { part, call }) => {
                format!("tool_call {part} {} {} {}", call.id, call.name, call.input)
            }
            Ok(Event::StepFinish { reason, usage, .. }) => format!(
                "finish {} in={} out={}",
                reason.as_str(),
                usage.input,
                usage.output
            ),
            Err(error) => format!("error {:?}", error.kind()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn run(provider: &Scripted, request: Request) -> String {
    render(&provider.stream(request).collect::<Vec<_>>().await)
}

#[tokio::test]
async fn a_transcript_becomes_a_well_formed_stream() {
    let provider = Scripted::new([Script::new()
        .reasoning("Think")
        .reasoning_with(
            " more",
            ReasoningMetadata::Anthropic {
                signature: "sig".into(),
            },
        )
        .text("Hel")
        .text("lo")
        .tool_call("c1", "lookup", r#"{"q":"x"}"#)
        .tool_call_fragments("c2", "add", [r#"{"a":"#, "1}"])
        .usage(Usage {
            input: 10,
            output: 5,
            ..Usage::default()
        })]);
    let expected = [
        "start scripted-1 scripted-model",
        "reasoning_start 0",
        "reasoning 0 \"Think\"",
        "reasoning 0 \" more\"",
        "reasoning_end 0 Some(Anthropic { signature: \"sig\" })",
        "text_start 1",
        "text 1 \"Hel\"",
        "text 1 \"lo\"",
        "text_end 1",
        "tool_start 2 c1 lookup",
        "tool_delta 2 {\"q\":\"x\"}",
        "tool_end 2",
        "tool_call 2 c1 lookup {\"q\":\"x\"}",
        "tool_start 3 c2 add",
        "tool_delta 3 {\"a\":",
        "tool_delta 3 1}",
        "tool_end 3",
        "tool_call 3 c2 add {\"a\":1}",
        // No explicit finish: tool calls were made, so ToolCalls.
        "finish tool_calls in=10 out=5",
    ]
    .join("\n");
    assert_eq!(run(&provider, request("hi")).await, expected);
}

#[tokio::test]
async fn generate_collects_one_script() {
    let provider = Scripted::new([
        Script::new()
            .text("Hello")
            .tool_call("c1", "lookup", r#"{"q":"x"}"#)
            .finish(FinishReason::Stop),
        Script::new().text("Done."),
    ]);
    let first = provider.generate(request("a")).await.expect("first");
    assert_eq!(first.text, "Hello");
    assert_eq!(first.tool_calls.len(), 1);
    // A forced tool call may finish with `stop`; the call is still there.
    assert_eq!(first.finish, FinishReason::Stop);
    let second = provider.generate(request("b")).await.expect("second");
    assert_eq!(
        (second.text.as_str(), second.finish),
        ("Done.", FinishReason::Stop)
    );
    assert_eq!(provider.calls(), 2);
    assert_eq!(provider.remaining(), 0);
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].messages, vec![Message::user("b")]);
    assert_eq!(
        provider.last_request().map(|r| r.messages),
        Some(vec![Message::user("b")])
    );
}

#[tokio::test]
async fn running_out_of_scripts_is_a_clear_error() {
    let provider = Scripted::new([]);
    let error = provider
        .generate(request("a"))
        .await
        .expect_err("nothing scripted");
    assert_eq!(error.kind(), ErrorKind::InvalidRequest);
    assert!(
        error
            .message()
            .contains("no scripted response left for call #1"),
        "{error}"
    );
    assert!(
        !error.retryable(),
        "a missing script must not be retried forever"
    );
    assert_eq!(provider.calls(), 1);
    assert_eq!(provider.requests().len(), 1);
    provider.push(Script::new().text("late"));
    assert_eq!(
        provider.generate(request("b")).await.expect("queued").text,
        "late"
    );
}

#[tokio::test]
async fn errors_before_and_after_output() {
    let provider = Scripted::new([
        Script::new().error(Error::rate_limit(Some(Duration::from_secs(2)))),
        Script::new()
            .text("partial")
            .error(Error::incomplete("cut")),
    ]);
    assert_eq!(run(&provider, request("a")).await, "error RateLimit");
    assert_eq!(
        run(&provider, request("b")).await,
        "start scripted-2 scripted-model\ntext_start 0\ntext 0 \"partial\"\nfinish error in=0 out=0\nerror IncompleteStream"
    );
}

#[tokio::test(start_paused = true)]
async fn delays_use_tokio_time() {
    let provider = Scripted::new([Script::new()
        .delay(Duration::from_secs(30))
        .text("a")
        .delay(Duration::from_secs(10))
        .text("b")]);
    let start = tokio::time::Instant::now();
    let mut stream = provider.stream(request("x"));
    assert!(matches!(
        stream.next().await,
        Some(Ok(Event::StepStart { .. }))
    ));
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    let rest: Vec<_> = stream.collect().await;
    assert_eq!(start.elapsed(), Duration::from_secs(40));
    assert!(matches!(rest.last(), Some(Ok(Event::StepFinish { .. }))));
}

#[tokio::test(start_paused = true)]
async fn a_hang_lasts_until_the_stream_is_dropped() {
    let provider = Scripted::new([Script::new().text("waiting").hang()]);
    let mut stream = provider.stream(request("x"));
    for _ in 0..3 {
        assert!(stream.next().await.is_some());
    }
    // With the clock paused, an hour passes instantly unless something is truly pending.
    let next = tokio::time::timeout(Duration::from_secs(3600), stream.next()).await;
    assert!(next.is_err(), "still hanging after an hour");
    drop(stream);
}

#[tokio::test]
async fn gates_hold_streams_until_released() {
    let gate = Gate::new();
    let provider = Scripted::new([
        Script::new().text("before").gate(&gate).text(" after"),
        Script::new().gate(&gate).text("second"),
    ]);
    let worker = {
        let provider = provider.clone();
        tokio::spawn(async move { provider.generate(request("x")).await })
    };
    gate.reached().await;
    assert!(!worker.is_finished());
    gate.release();
    let response = worker.await.expect("joined").expect("success");
    assert_eq!(response.text, "before after");

    // `open` lets every later arrival through.
    gate.open();
    let response = provider.generate(request("y")).await.expect("success");
    assert_eq!(response.text, "second");
}

#[tokio::test]
async fn a_function_responder_sees_each_request() {
    let provider = Scripted::from_fn(|request| match request.messages.last() {
        Some(Message::User { text, .. }) if text == "stop" => None,
        Some(Message::User { text, .. }) => Some(Script::new().text(format!("echo: {text}"))),
        _ => None,
    });
    assert_eq!(
        provider.generate(request("ping")).await.expect("echo").text,
        "echo: ping"
    );
    assert!(provider.generate(request("stop")).await.is_err());
    assert_eq!(provider.calls(), 2);
}

#[tokio::test]
async fn truncated_tool_calls_and_raw_events() {
    let provider = Scripted::new([Script::new()
        .tool_call("c1", "ok", "{}")
        .truncated_tool_call("c2", "cut", [r#"{"pa"#])
        .event(Event::TextStart { part: 9 })
        .finish(FinishReason::Length)]);
    assert_eq!(
        run(&provider, request("x")).await,
        [
            "start scripted-1 scripted-model",
            "tool_start 0 c1 ok",
            "tool_delta 0 {}",
            "tool_end 0",
            "tool_call 0 c1 ok {}",
            "tool_start 1 c2 cut",
            "tool_delta 1 {\"pa",
            "text_start 9",
            "finish length in=0 out=0",
        ]
        .join("\n")
    );
    provider.push(
        Script::new()
            .truncated_tool_call("c3", "cut", ["{"])
            .finish(FinishReason::Length),
    );
    let response = provider.generate(request("y")).await.expect("completes");
    assert!(response.tool_calls.is_empty());
    assert_eq!(response.incomplete_tool_calls[0].id, "c3");
}

/// Collecting a call (`generate`, a compaction's summary) holds at most `MAX_COLLECTED` bytes of
/// output: a provider that streams more fails with invalid output instead of growing memory
/// without bound; within the bound the answer is collected whole.
#[tokio::test]
async fn collecting_stops_at_the_output_bound() {
    let over = "x".repeat(agenthost_llm::MAX_COLLECTED + 1);
    let within = "y".repeat(agenthost_llm::MAX_COLLECTED);
    let provider = Scripted::new([
        Script::new().text(over).finish(FinishReason::Stop),
        Script::new()
            .text(within.clone())
            .finish(FinishReason::Stop),
    ]);
    let error = provider
        .generate(request("too much"))
        .await
        .expect_err("over the bound");
    assert_eq!(error.kind(), ErrorKind::InvalidOutput, "{error}");
    let response = provider
        .generate(request("enough"))
        .await
        .expect("within the bound");
    assert_eq!(response.text.len(), within.len());
}
