//! Wire-parser edge cases beyond the recorded fixtures: endings without `[DONE]`, truncation,
//! malformed data, dialect variations of OpenAI-compatible servers, Anthropic block types.

use agenthost_llm::{
    Collector, Error, ErrorKind, Event, FinishReason, ReasoningMetadata, Response, anthropic,
    openai,
};

fn openai_items(body: &str) -> Vec<Result<Event, Error>> {
    let mut out = Vec::new();
    let mut parser = openai::Parser::new();
    parser.feed(body.as_bytes(), &mut out);
    parser.finish(&mut out);
    out
}

fn anthropic_items(body: &str) -> Vec<Result<Event, Error>> {
    let mut out = Vec::new();
    let mut parser = anthropic::Parser::new();
    parser.feed(body.as_bytes(), &mut out);
    parser.finish(&mut out);
    out
}

/// The collected response and the final error, if the stream failed.
fn collect(items: Vec<Result<Event, Error>>) -> (Response, Option<Error>) {
    let mut collector = Collector::new();
    for item in items {
        match item {
            Ok(event) => collector.push(&event).expect("within the output bound"),
            Err(error) => return (collector.snapshot(), Some(error)),
        }
    }
    (collector.finish().expect("finished"), None)
}

fn completed(items: Vec<Result<Event, Error>>) -> Response {
    match collect(items) {
        (response, None) => response,
        (_, Some(error)) => panic!("unexpected error: {error}"),
    }
}

/// The error and the partial response before it.
fn failed(items: Vec<Result<Event, Error>>) -> (Error, Response) {
    match collect(items) {
        (partial, Some(error)) => (error, partial),
        (response, None) => panic!("expected an error, got {response:?}"),
    }
}

fn chunk(delta: &str, finish: Option<&str>) -> String {
    let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
    format!(
        "data: {{\"id\":\"c1\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

#[test]
fn openai_finish_without_done_is_complete_but_eof_before_finish_is_not() {
    let body = chunk(r#"{"content":"hi"}"#, None) + &chunk("{}", Some("stop"));
    let response = completed(openai_items(&body));
    assert_eq!(
        (response.text.as_str(), response.finish),
        ("hi", FinishReason::Stop)
    );

    let (error, partial) = failed(openai_items(&chunk(r#"{"content":"hi"}"#, None)));
    assert_eq!(error.kind(), ErrorKind::IncompleteStream);
    assert!(error.retryable());
    assert_eq!(partial.text, "hi");
    assert_eq!(partial.finish, FinishReason::Error);

    let (error, _) = failed(openai_items(""));
    assert_eq!(error.kind(), ErrorKind::IncompleteStream);
}

#[test]
fn openai_length_cut_tool_arguments_are_never_a_tool_call() {
    let body = chunk(
        r#"{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"ok","arguments":"{}"}},{"index":1,"id":"b","type":"function","function":{"name":"cut","arguments":"{\"pa"}}]}"#,
        None,
    ) + &chunk("{}", Some("length"))
        + "data: [DONE]\n\n";
    let response = completed(openai_items(&body));
    assert_eq!(response.finish, FinishReason::Length);
    assert_eq!(
        response
            .tool_calls
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["ok"]
    );
    assert_eq!(response.incomplete_tool_calls.len(), 1);
    assert_eq!(response.incomplete_tool_calls[0].input, "{\"pa");
}

#[test]
fn openai_dialects() {
    // reasoning_content (vLLM, DeepSeek), tool calls without index or id sent whole, each in
    // its own entry, and a DeepSeek-style cache-hit usage field.
    let body = chunk(r#"{"reasoning_content":"think"}"#, None)
        + &chunk(r#"{"content":"ok"}"#, None)
        + &chunk(
            r#"{"tool_calls":[{"id":"x1","function":{"name":"a","arguments":"{\"n\":1}"}},{"id":"x2","function":{"name":"b","arguments":"{}"}}]}"#,
            None,
        )
        + &chunk(
            r#"{"tool_calls":[{"function":{"name":"c","arguments":"{}"}}]}"#,
            None,
        )
        + &chunk("{}", Some("tool_calls"))
        + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":7,\"prompt_cache_hit_tokens\":60}}\n\n"
        + "data: [DONE]\n\n";
    let response = completed(openai_items(&body));
    assert_eq!(response.reasoning.len(), 1);
    assert_eq!(response.reasoning[0].text, "think");
    assert_eq!(response.text, "ok");
    let calls: Vec<(&str, &str, &str)> = response
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.input.as_str()))
        .collect();
    // The index-less call without an id lands at position 0, the slot of `x1`; with no id it
    // cannot be told apart and its (empty-object) arguments continue that call.
    assert_eq!(calls, [("x1", "a", "{\"n\":1}{}"), ("x2", "b", "{}")]);
    assert_eq!(response.usage.input, 40);
    assert_eq!(response.usage.cache_read, 60);
    assert_eq!(response.usage.output, 7);
}

#[test]
fn openai_usage_with_cached_tokens_is_normalized() {
    // Synthetic: no public recording has cached_tokens > 0 (see the fixtures' README).
    let body = chunk(r#"{"content":"x"}"#, Some("stop"))
        + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2006,\"completion_tokens\":300,\"total_tokens\":2306,\"prompt_tokens_details\":{\"cached_tokens\":1920},\"completion_tokens_details\":{\"reasoning_tokens\":192}}}\n\n"
        + "data: [DONE]\n\n";
    let usage = completed(openai_items(&body)).usage;
    assert_eq!(
        (usage.input, usage.cache_read, usage.cache_write),
        (86, 1920, 0)
    );
    assert_eq!((usage.output, usage.reasoning), (300, 192));
    assert_eq!(usage.total_input(), 2006);
    assert_eq!(usage.total(), 2306);
}

#[test]
fn openai_malformed_chunks_and_error_events() {
    let (error, _) = failed(openai_items("data: {not json\n\n"));
    assert_eq!(error.kind(), ErrorKind::InvalidOutput);
    assert!(!error.retryable());

    // An error as the very first chunk: no StepStart, just the error.
    let items = openai_items(
        "data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\"}}\n\n",
    );
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0].clone().expect_err("error").kind(),
        ErrorKind::ProviderInternal { overloaded: true }
    );

    // `event: error` frames (some compatible servers).
    let body = chunk(r#"{"content":"a"}"#, None)
        + "event: error\ndata: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n";
    let (error, partial) = failed(openai_items(&body));
    assert_eq!(
        error.kind(),
        ErrorKind::ProviderInternal { overloaded: false }
    );
    assert_eq!(partial.text, "a");

    // Nothing after the error is parsed, even a [DONE].
    let body = chunk(r#"{"content":"a"}"#, None)
        + "data: {\"error\":{\"message\":\"x\"}}\n\n"
        + &chunk(r#"{"content":"ignored"}"#, None)
        + "data: [DONE]\n\n";
    let items = openai_items(&body);
    assert!(items.last().expect("items").is_err());
    assert_eq!(items.iter().filter(|i| i.is_err()).count(), 1);
}

#[test]
fn anthropic_redacted_thinking_and_unknown_blocks() {
    let body = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
        event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"redacted_thinking\",\"data\":\"ENC\"}}\n\n\
        event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
        event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srv\",\"name\":\"web_search\",\"input\":{}}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n\
        event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n\
        event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"text\",\"text\":\"Hi\"}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"citations_delta\",\"citation\":{}}}\n\n\
        event: future_event\ndata: {\"type\":\"future_event\"}\n\n\
        event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\"},\"usage\":{\"output_tokens\":9}}\n\n\
        event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let response = completed(anthropic_items(body));
    assert_eq!(
        response.reasoning[0].metadata,
        Some(ReasoningMetadata::AnthropicRedacted { data: "ENC".into() })
    );
    // Server tools run at the provider: never a local tool call.
    assert!(response.tool_calls.is_empty() && response.incomplete_tool_calls.is_empty());
    // Text from the start event itself counts; the open block is closed by message_stop.
    assert_eq!(response.text, "Hi");
    assert_eq!(response.finish, FinishReason::ContentFilter);
    assert_eq!(response.raw_finish.as_deref(), Some("refusal"));
    assert_eq!((response.usage.input, response.usage.output), (5, 9));
}

#[test]
fn anthropic_endings() {
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n";
    let (error, partial) = failed(anthropic_items(start));
    assert_eq!(error.kind(), ErrorKind::IncompleteStream);
    assert_eq!(partial.usage.input, 5);

    // An error before anything else: a lone error, no StepStart.
    let items = anthropic_items(
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    assert_eq!(items.len(), 1);
    assert!(items[0].is_err());

    let (error, _) = failed(anthropic_items(&format!("{start}data: {{oops\n\n")));
    assert_eq!(error.kind(), ErrorKind::InvalidOutput);
}

/// A parser's `feed`, whichever format.
type Feed<'a> = dyn FnMut(&[u8], &mut Vec<Result<Event, Error>>) + 'a;

#[test]
fn a_line_over_the_bound_fails_the_stream_as_invalid_output() {
    let start_openai = chunk(r#"{"role":"assistant","content":"hi"}"#, None);
    let start_anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"x\",\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n";
    let mut openai = openai::Parser::new();
    let mut anthropic = anthropic::Parser::new();
    let feeds: [(&str, &mut Feed<'_>); 2] = [
        (&start_openai, &mut |b, out| openai.feed(b, out)),
        (start_anthropic, &mut |b, out| anthropic.feed(b, out)),
    ];
    let huge = vec![b'a'; 1024 * 1024];
    for (start, feed) in feeds {
        let mut out = Vec::new();
        feed(start.as_bytes(), &mut out);
        feed(b"data: ", &mut out);
        for _ in 0..(agenthost_llm::sse::MAX_FRAME / huge.len() + 2) {
            feed(&huge, &mut out);
        }
        let (error, _) = failed(out);
        assert_eq!(error.kind(), ErrorKind::InvalidOutput, "{error}");
        assert!(error.to_string().contains("bytes"), "{error}");
    }
}
