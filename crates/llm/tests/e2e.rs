//! End to end over loopback: the real HTTP clients against the mock provider server (OpenAI
//! wire) and a small fixture-replaying server (Anthropic wire). Every call is bounded in time,
//! and every call must reach the server exactly once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthost_llm::mock::server::{self, Failure, Handle};
use agenthost_llm::{
    Anthropic, ApiKey, Config, Error, ErrorKind, Event, FinishReason, Kind, Message, Mock, OpenAi,
    Provider, Request, Tool, ToolChoice, mock,
};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Upper bound for any single call in these tests; far above what they need.
const BOUND: Duration = Duration::from_secs(20);

async fn start(config: server::Config) -> Handle {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    server::serve(listener, config).expect("serve")
}

fn client(base_url: String, idle: Duration) -> OpenAi {
    client_over(base_url, idle, false)
}

/// [`client`], over HTTP/2 (h2c) when `http2`: failures must read the same either way.
fn client_over(base_url: String, idle: Duration, http2: bool) -> OpenAi {
    let mut config = Config::new(Kind::Openai);
    config.http2_prior_knowledge = http2;
    config.base_url = Some(base_url);
    config.api_key = Some(ApiKey::new("sk-e2e-secret-key-000000"));
    config.connect_timeout = Duration::from_secs(2);
    config.idle_timeout = idle;
    OpenAi::new(&config).expect("client")
}

fn ask(text: &str) -> Request {
    let mut request = Request::new("mock-model");
    request.messages.push(Message::user(text));
    request
}

fn with_tools(mut request: Request) -> Request {
    request.tools.push(Tool {
        name: "lookup".into(),
        description: "Look a thing up".into(),
        parameters: json!({ "type": "object", "properties": {
            "query": { "type": "string" }, "limit": { "type": "integer" } } }),
    });
    request.tool_choice = ToolChoice::Required;
    request
}

fn failing(request: Request, failure: &str) -> Request {
    let mut request = request;
    request.headers.insert("x-mock-fail", failure);
    request
}

async fn events(provider: &dyn Provider, request: Request) -> Vec<Result<Event, Error>> {
    tokio::time::timeout(BOUND, provider.stream(request).collect::<Vec<_>>())
        .await
        .expect("the call ends within the bound")
}

#[tokio::test]
async fn streams_text_and_matches_the_in_process_mock() {
    let server = start(server::Config::default()).await;
    let client = client(server.base_url(), Duration::from_secs(5));
    let response = tokio::time::timeout(BOUND, client.generate(ask("hello there")))
        .await
        .expect("bounded")
        .expect("success");
    assert_eq!(server.requests(), 1);
    assert_eq!(response.finish, FinishReason::Stop);
    assert_eq!(response.raw_finish.as_deref(), Some("stop"));
    assert!(
        response
            .id
            .as_deref()
            .is_some_and(|id| id.starts_with("mock-"))
    );
    assert_eq!(response.model.as_deref(), Some("mock-model"));
    assert_eq!(response.usage.output, 24);
    assert!(response.usage.input > 0);
    assert!(response.tool_calls.is_empty());
    // Same request, same seed: the HTTP mock and the in-process mock answer alike.
    let local = Mock::new(mock::Config::default())
        .generate(ask("hello there"))
        .await
        .expect("mock");
    assert_eq!(response.text, local.text);
    assert_eq!(response.usage, local.usage);
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn streams_tool_calls_with_split_arguments() {
    let server = start(server::Config::default()).await;
    let client = client(server.base_url(), Duration::from_secs(5));
    let items = events(&client, with_tools(ask("find it"))).await;
    assert_eq!(server.requests(), 1);
    let items: Vec<Event> = items.into_iter().map(|i| i.expect("no error")).collect();
    let deltas: Vec<&str> = items
        .iter()
        .filter_map(|e| match e {
            Event::ToolInputDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        deltas.len() >= 2,
        "arguments arrive in fragments: {deltas:?}"
    );
    let call = items
        .iter()
        .find_map(|e| match e {
            Event::ToolCall { call, .. } => Some(call.clone()),
            _ => None,
        })
        .expect("a tool call");
    assert_eq!(call.name, "lookup");
    assert_eq!(deltas.concat(), call.input);
    let input: Value = serde_json::from_str(&call.input).expect("JSON arguments");
    assert!(
        input["query"].is_string() && input["limit"].is_u64(),
        "{input}"
    );
    assert!(matches!(
        items.last(),
        Some(Event::StepFinish {
            reason: FinishReason::ToolCalls,
            ..
        })
    ));
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn injected_failures_are_classified_and_each_call_is_one_request() {
    injected_failures_are_classified_and_each_call_is_one_request_over(false).await;
}

#[tokio::test]
async fn injected_failures_are_classified_and_each_call_is_one_request_over_http2() {
    injected_failures_are_classified_and_each_call_is_one_request_over(true).await;
}

async fn injected_failures_are_classified_and_each_call_is_one_request_over(http2: bool) {
    let server = start(server::Config {
        retry_after: Duration::from_secs(3),
        ..server::Config::default()
    })
    .await;
    let client = client_over(server.base_url(), Duration::from_secs(5), http2);
    let cases: [(&str, ErrorKind, bool, Option<Duration>); 8] = [
        (
            "rate_limit",
            ErrorKind::RateLimit,
            true,
            Some(Duration::from_secs(3)),
        ),
        ("quota", ErrorKind::QuotaExceeded, false, None),
        (
            "internal",
            ErrorKind::ProviderInternal { overloaded: false },
            true,
            None,
        ),
        (
            "overloaded",
            ErrorKind::ProviderInternal { overloaded: true },
            true,
            None,
        ),
        ("context_overflow", ErrorKind::ContextOverflow, false, None),
        ("auth", ErrorKind::Authentication, false, None),
        ("truncate", ErrorKind::IncompleteStream, true, None),
        (
            "stream_error",
            ErrorKind::ProviderInternal { overloaded: false },
            true,
            None,
        ),
    ];
    for (n, (failure, kind, retryable, retry_after)) in cases.into_iter().enumerate() {
        let items = events(&client, failing(ask("hi"), failure)).await;
        assert_eq!(
            server.requests(),
            n as u64 + 1,
            "{failure}: exactly one request"
        );
        let error = items
            .last()
            .expect("some item")
            .clone()
            .expect_err("ends with an error");
        assert_eq!(error.kind(), kind, "{failure}: {error}");
        assert_eq!(error.retryable(), retryable, "{failure}");
        assert_eq!(error.retry_after(), retry_after, "{failure}");
        assert_eq!(items.iter().filter(|i| i.is_err()).count(), 1, "{failure}");
    }
    assert_eq!(server.http2_requests(), if http2 { 8 } else { 0 });
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_truncated_stream_keeps_its_partial_output() {
    a_truncated_stream_keeps_its_partial_output_over(false).await;
}

#[tokio::test]
async fn a_truncated_stream_keeps_its_partial_output_over_http2() {
    a_truncated_stream_keeps_its_partial_output_over(true).await;
}

async fn a_truncated_stream_keeps_its_partial_output_over(http2: bool) {
    let server = start(server::Config::default()).await;
    let client = client_over(server.base_url(), Duration::from_secs(5), http2);
    let items = events(&client, failing(ask("hi"), "truncate")).await;
    let text: String = items
        .iter()
        .filter_map(|i| match i {
            Ok(Event::TextDelta { delta, .. }) => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert!(!text.is_empty(), "partial text arrived");
    let n = items.len();
    assert!(matches!(
        items[n - 2],
        Ok(Event::StepFinish {
            reason: FinishReason::Error,
            ..
        })
    ));
    // The open text part is not ended: it is partial.
    assert!(!items.iter().any(|i| matches!(i, Ok(Event::TextEnd { .. }))));
    assert_eq!(server.requests(), 1);
    assert_eq!(server.http2_requests(), u64::from(http2));
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn idle_timeout_fires_on_a_stalled_stream() {
    idle_timeout_fires_on_a_stalled_stream_over(false).await;
}

#[tokio::test]
async fn idle_timeout_fires_on_a_stalled_stream_over_http2() {
    idle_timeout_fires_on_a_stalled_stream_over(true).await;
}

async fn idle_timeout_fires_on_a_stalled_stream_over(http2: bool) {
    let server = start(server::Config::default()).await;
    let client = client_over(server.base_url(), Duration::from_millis(200), http2);
    let items = events(&client, failing(ask("hi"), "stall")).await;
    let error = items.last().expect("items").clone().expect_err("times out");
    assert_eq!(
        error.kind(),
        ErrorKind::Transport { received_any: true },
        "{error}"
    );
    // A stall is an incomplete stream: the runtime continues from what arrived.
    assert!(error.retryable());
    assert!(error.message().contains("idle timeout"), "{error}");
    // The first chunk arrived before the stall.
    assert!(matches!(items[0], Ok(Event::StepStart { .. })));
    assert_eq!(server.requests(), 1);
    assert_eq!(server.http2_requests(), u64::from(http2));
    // Shutdown ends the stalled response on the server side too.
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_slow_but_steady_stream_is_not_an_idle_timeout() {
    // 40 tokens at 50/s take ~0.8 s in total, far beyond the 300 ms idle timeout, yet no gap
    // between bytes comes close to it: there is no total deadline.
    let server = start(server::Config {
        mock: mock::Config {
            tokens_per_second: 50.0,
            reply_tokens: 40,
            ..mock::Config::default()
        },
        ..server::Config::default()
    })
    .await;
    let client = client(server.base_url(), Duration::from_millis(300));
    let response = tokio::time::timeout(BOUND, client.generate(ask("slowly")))
        .await
        .expect("bounded")
        .expect("no timeout");
    assert_eq!(response.usage.output, 40);
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn drawn_failures_still_cost_one_request_per_call() {
    let server = start(server::Config {
        fail_ratio: 0.5,
        failures: vec![Failure::RateLimit, Failure::Internal, Failure::Truncate],
        ..server::Config::default()
    })
    .await;
    let client = client(server.base_url(), Duration::from_secs(5));
    let (mut ok, mut failed) = (0, 0);
    for n in 0..20u64 {
        match tokio::time::timeout(BOUND, client.generate(ask(&format!("q{n}")))).await {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(error)) => {
                assert!(error.retryable(), "{error}");
                failed += 1;
            }
            Err(_) => panic!("call {n} exceeded the bound"),
        }
        assert_eq!(server.requests(), n + 1);
    }
    assert!(ok > 0 && failed > 0, "{ok} ok, {failed} failed");
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn connection_refused_is_a_retryable_transport_error() {
    // Bind to learn a free port, then close it so that nothing listens there.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let client = client(format!("http://{addr}/v1"), Duration::from_secs(5));
    let items = events(&client, ask("hi")).await;
    assert_eq!(items.len(), 1);
    let error = items[0].clone().expect_err("fails");
    assert_eq!(
        error.kind(),
        ErrorKind::Transport {
            received_any: false
        },
        "{error}"
    );
    assert!(error.retryable());
}

#[tokio::test]
async fn nothing_is_sent_until_the_stream_is_polled() {
    let server = start(server::Config::default()).await;
    let client = client(server.base_url(), Duration::from_secs(5));
    let stream = client.stream(ask("lazy"));
    tokio::task::yield_now().await;
    assert_eq!(server.requests(), 0);
    drop(stream);
    assert_eq!(server.requests(), 0);
    server.shutdown().await.expect("clean shutdown");
}

/// What the Anthropic replay server saw.
#[derive(Default)]
struct Seen {
    requests: usize,
    api_key: Option<String>,
    version: Option<String>,
    body: Option<Value>,
}

/// Serves a recorded Anthropic stream in 7-byte pieces (splitting UTF-8 and lines) to
/// `POST /v1/messages`.
async fn anthropic_replay(fixture: &'static str) -> (String, Arc<Mutex<Seen>>) {
    use axum::body::{Body, Bytes};
    use axum::http::HeaderMap;
    let bytes = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/providers")
            .join(fixture),
    )
    .expect("fixture");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let state = seen.clone();
    let app = axum::Router::new().route(
        "/v1/messages",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let bytes = bytes.clone();
            let state = state.clone();
            async move {
                {
                    let mut seen = state.lock().expect("lock");
                    seen.requests += 1;
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                    };
                    seen.api_key = header("x-api-key");
                    seen.version = header("anthropic-version");
                    seen.body = serde_json::from_slice(&body).ok();
                }
                let pieces: Vec<Result<Bytes, std::convert::Infallible>> = bytes
                    .chunks(7)
                    .map(|c| Ok(Bytes::copy_from_slice(c)))
                    .collect();
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(futures::stream::iter(pieces)))
                    .expect("response")
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), seen)
}

#[tokio::test]
async fn anthropic_over_http_with_thinking_and_a_tool_call() {
    let (base_url, seen) = anthropic_replay("anthropic-thinking-tool-use.sse").await;
    let mut config = Config::new(Kind::Anthropic);
    config.base_url = Some(base_url);
    config.api_key = Some(ApiKey::new("sk-ant-e2e-000000000"));
    let client = Anthropic::new(&config).expect("client");
    let mut request = with_tools(ask("Weather in Florence?"));
    request.tool_choice = ToolChoice::Auto;
    let response = tokio::time::timeout(BOUND, client.generate(request))
        .await
        .expect("bounded")
        .expect("success");
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(response.tool_calls.len(), 1);
    assert_eq!(
        response.tool_calls[0].input,
        r#"{"location": "Florence, Italy"}"#
    );
    assert!(response.reasoning[0].text.starts_with("The user is asking"));
    assert!(matches!(
        &response.reasoning[0].metadata,
        Some(agenthost_llm::ReasoningMetadata::Anthropic { signature }) if signature.starts_with("EsQDCkYICBgCKkBr9")
    ));
    assert_eq!((response.usage.input, response.usage.output), (423, 119));
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.requests, 1);
    assert_eq!(seen.api_key.as_deref(), Some("sk-ant-e2e-000000000"));
    assert_eq!(seen.version.as_deref(), Some("2023-06-01"));
    assert_eq!(
        seen.body.as_ref().map(|b| b["stream"].clone()),
        Some(json!(true))
    );
}

/// A mock that closes every connection after its answer: the header says so, and calls keep
/// working, each on a connection of its own.
#[tokio::test]
async fn a_mock_that_closes_connections_still_answers_every_call() {
    let handle = start(server::Config {
        close_connections: true,
        ..server::Config::default()
    })
    .await;
    let http = agenthost_llm::client_builder()
        .expect("builder")
        .build()
        .expect("client");
    let reply = http
        .get(format!("{}/models", handle.base_url()))
        .send()
        .await
        .expect("answer");
    assert_eq!(reply.headers()["connection"], "close");
    let provider = client(handle.base_url(), BOUND);
    for _ in 0..3 {
        let events = events(&provider, ask("hello")).await;
        assert!(events.iter().all(Result::is_ok), "{events:?}");
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Ok(Event::StepFinish { .. }))),
            "{events:?}"
        );
    }
}

/// With `http2_prior_knowledge`, calls go over HTTP/2 to a plain `http://` server (the mock
/// serves both protocols on one port), and several calls share one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_streams_over_h2c() {
    let server = start(server::Config::default()).await;
    let mut config = Config::new(Kind::Openai);
    config.base_url = Some(server.base_url());
    config.http2_prior_knowledge = true;
    let provider = OpenAi::new(&config).expect("client");
    let calls = (0..3).map(|i| provider.generate(ask(&format!("call {i}"))));
    let local = Mock::new(mock::Config::default());
    for (i, response) in tokio::time::timeout(BOUND, futures::future::join_all(calls))
        .await
        .expect("bounded")
        .into_iter()
        .enumerate()
    {
        let response = response.expect("success");
        assert_eq!(response.finish, FinishReason::Stop);
        let expected = local
            .generate(ask(&format!("call {i}")))
            .await
            .expect("mock");
        assert_eq!(response.text, expected.text);
    }
    assert_eq!(server.requests(), 3);
    assert_eq!(server.http2_requests(), 3, "every call went over HTTP/2");

    // Without it, the same server is reached over HTTP/1.1.
    let provider = client(server.base_url(), BOUND);
    let response = tokio::time::timeout(BOUND, provider.generate(ask("over HTTP/1.1")))
        .await
        .expect("bounded")
        .expect("success");
    assert_eq!(response.finish, FinishReason::Stop);
    assert_eq!((server.requests(), server.http2_requests()), (4, 3));
    server.shutdown().await.expect("clean shutdown");
}

/// A server that allows two streams per HTTP/2 connection: a client with
/// `streams_per_connection = 2` opens a second connection for a third call rather than make it
/// wait. The server holds every call of the batch until all three have arrived, so the test
/// would hang (and fail at its bound) if the third waited for a stream of the first connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_streams_of_a_connection_opens_another() {
    use axum::http::Request as HttpRequest;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let calls = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    // The first call (which lets the client learn the server's limit) is not held.
    let batch = Arc::new(tokio::sync::Barrier::new(3));
    let app = {
        let calls = calls.clone();
        axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |_request: HttpRequest<axum::body::Body>| {
                let calls = calls.clone();
                let batch = batch.clone();
                async move {
                    if calls.fetch_add(1, Ordering::SeqCst) > 0 {
                        batch.wait().await;
                    }
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from(HI))
                        .expect("response")
                }
            }),
        )
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = connections.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let service = TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http2().max_concurrent_streams(2);
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let mut config = Config::new(Kind::Openai);
    config.base_url = Some(format!("http://{addr}/v1"));
    config.http2_prior_knowledge = true;
    config.streams_per_connection = 2;
    let provider = OpenAi::new(&config).expect("client");
    let first = tokio::time::timeout(BOUND, provider.generate(ask("first")))
        .await
        .expect("bounded")
        .expect("success");
    assert_eq!(first.text, "hi");
    let batch = (0..3).map(|i| provider.generate(ask(&format!("call {i}"))));
    let results = tokio::time::timeout(BOUND, futures::future::join_all(batch))
        .await
        .expect("a call waited for a stream of a full connection");
    for response in results {
        let response = response.expect("success");
        assert_eq!(
            (response.text.as_str(), response.finish),
            ("hi", FinishReason::Stop)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

/// An OpenAI-wire answer of one text chunk, "hi".
const HI: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\
    \"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\
    \"hi\"},\"finish_reason\":null}]}\n\n\
    data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\
    \"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
    data: [DONE]\n\n";

/// One call that must be answered with [`HI`].
async fn answers_hi(provider: &OpenAi, prompt: &str) {
    let response = tokio::time::timeout(BOUND, provider.generate(ask(prompt)))
        .await
        .expect("bounded")
        .expect("success");
    assert_eq!(
        (response.text.as_str(), response.finish),
        ("hi", FinishReason::Stop)
    );
}

/// A plain HTTP/1.1 server counting connections and requests: each request is answered with
/// [`HI`] (chunked, keep-alive), unless its prompt says `stall`, which gets the first event and
/// then nothing. With `close_after`, the server closes each connection that long after an
/// answer without saying so first, as a server's keep-alive timeout does.
async fn counting_server(
    close_after: Option<Duration>,
) -> (
    String,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (accepted, answered) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    // One request: its head, then `content-length` bytes of body.
                    let head_end = loop {
                        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .and_then(|value| value.trim().parse().ok())
                        .unwrap_or(0);
                    while buffer.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
                    // Origin form and a `Host`, as RFC 9112 asks of a client.
                    if !head.starts_with("post /v1/chat/completions http/1.1\r\n")
                        || !head.contains(&format!("\r\nhost: {addr}\r\n"))
                    {
                        let _ = stream
                            .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                    answered.fetch_add(1, Ordering::SeqCst);
                    let stall = String::from_utf8_lossy(&body).contains("stall");
                    let text = match stall {
                        true => HI.split_inclusive("\n\n").next().unwrap_or(HI),
                        false => HI,
                    };
                    let mut reply = String::from(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                         transfer-encoding: chunked\r\n\r\n",
                    );
                    reply.push_str(&format!("{:x}\r\n{text}\r\n", text.len()));
                    if !stall {
                        reply.push_str("0\r\n\r\n");
                    }
                    if stream.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                    if stall {
                        // Until the client closes the connection.
                        let mut rest = [0u8; 64];
                        while let Ok(n) = stream.read(&mut rest).await {
                            if n == 0 {
                                return;
                            }
                        }
                        return;
                    }
                    if let Some(after) = close_after {
                        tokio::time::sleep(after).await;
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}/v1"), connections, requests)
}

/// Calls one after another to a plain-HTTP/1.1 provider share one connection; a call dropped
/// before its answer ends closes its connection, so the next call opens another.
#[tokio::test]
async fn http1_calls_reuse_a_connection_and_a_dropped_call_closes_its_own() {
    use std::sync::atomic::Ordering;
    let (base, connections, requests) = counting_server(None).await;
    let provider = client(base, BOUND);
    for i in 0..5 {
        answers_hi(&provider, &format!("call {i}")).await;
    }
    assert_eq!(requests.load(Ordering::SeqCst), 5);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "five calls, one connection"
    );

    let mut stalled = provider.stream(ask("stall"));
    let first = tokio::time::timeout(BOUND, stalled.next())
        .await
        .expect("bounded");
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
    drop(stalled);
    answers_hi(&provider, "after").await;
    assert_eq!(requests.load(Ordering::SeqCst), 7);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "the stalled call took the idle connection and closed it; the next call opened another"
    );
}

/// A server that closes idle connections without warning (a keep-alive timeout) never fails a
/// call: the closed connection is found out before it is used, and the call goes on a new one.
#[tokio::test]
async fn a_connection_the_server_closed_while_idle_fails_no_call() {
    use std::sync::atomic::Ordering;
    let (base, connections, requests) = counting_server(Some(Duration::from_millis(20))).await;
    let provider = client(base, BOUND);
    for i in 0..3 {
        answers_hi(&provider, &format!("call {i}")).await;
        // Past the server's close.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "each call was sent once"
    );
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}

/// A provider named by host name is reached through the resolver, whichever of its addresses
/// (`::1` or `127.0.0.1`) answers.
#[tokio::test]
async fn a_provider_named_by_host_name_is_reached() {
    let handle = start(server::Config::default()).await;
    let provider = client(handle.base_url().replace("127.0.0.1", "localhost"), BOUND);
    let response = tokio::time::timeout(BOUND, provider.generate(ask("hello")))
        .await
        .expect("bounded")
        .expect("success");
    assert_eq!(response.finish, FinishReason::Stop);
    assert_eq!(handle.requests(), 1);
}

/// A server that answers in HTTP/1.0 and ends the body by closing the connection (as a small
/// script server does) gives the whole answer, and the next call opens a new connection.
#[tokio::test]
async fn an_http10_answer_ended_by_closing_the_connection_is_read_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The request's head and body arrive together here; what they say is not read.
                let mut request = [0u8; 16 * 1024];
                let _ = stream.read(&mut request).await;
                let reply =
                    format!("HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{HI}");
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    let provider = client(format!("http://{addr}/v1"), BOUND);
    for _ in 0..2 {
        answers_hi(&provider, "hello").await;
    }
}

/// A server that never ends its body after `[DONE]` does not hold the call up: the answer is
/// complete at `[DONE]`, and the connection, whose body never ended, is not reused.
#[tokio::test]
async fn a_body_left_open_after_done_does_not_hold_the_call() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let accepted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut request = [0u8; 16 * 1024];
                let _ = stream.read(&mut request).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                     transfer-encoding: chunked\r\n\r\n{:x}\r\n{HI}\r\n",
                    HI.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                // No last chunk: the body stays open until the client goes.
                let mut rest = [0u8; 64];
                while let Ok(n) = stream.read(&mut rest).await {
                    if n == 0 {
                        return;
                    }
                }
            });
        }
    });
    let provider = client(format!("http://{addr}/v1"), BOUND);
    for _ in 0..2 {
        // Bounded: the call ends at `[DONE]`.
        answers_hi(&provider, "hello").await;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

/// A server that takes the request and never answers it: the call fails after the connect
/// timeout plus one idle period, as a transport error before any output, over HTTP/1.1 and
/// HTTP/2 alike. An HTTP/1.1 connection is closed with its call; an HTTP/2 one carries other
/// calls and stays.
#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    for http2 in [false, true] {
        a_server_that_never_answers_times_out_over(http2).await;
    }
}

async fn a_server_that_never_answers_times_out_over(http2: bool) {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (hung_up, on_hang_up) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut buffer = [0u8; 4096];
        // Reads until the client goes; answers nothing.
        while let Ok(n) = stream.read(&mut buffer).await {
            if n == 0 {
                break;
            }
        }
        let _ = hung_up.send(());
    });
    let mut config = Config::new(Kind::Openai);
    config.http2_prior_knowledge = http2;
    config.base_url = Some(format!("http://{addr}/v1"));
    config.connect_timeout = Duration::from_millis(200);
    config.idle_timeout = Duration::from_millis(300);
    let provider = OpenAi::new(&config).expect("client");
    let events = events(&provider, ask("hello")).await;
    let Some(Err(error)) = events.last() else {
        panic!("expected an error: {events:?}");
    };
    assert_eq!(
        error.kind(),
        ErrorKind::Transport {
            received_any: false
        },
        "{error}"
    );
    assert!(
        error.message().contains("no response within 500 ms"),
        "{error}"
    );
    if !http2 {
        tokio::time::timeout(BOUND, on_hang_up)
            .await
            .expect("the connection was closed")
            .expect("the server saw the close");
    }
}

/// A provider that sends one endless event-stream line: the call fails once the line passes
/// the frame bound, and the connection is cut there, so no more than about the bound is read
/// off the network (the server counts what it could write before the client went away).
#[tokio::test]
async fn an_endless_line_fails_the_call_and_cuts_the_connection_at_the_bound() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let written = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let counted = written.clone();
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let _ = stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                  transfer-encoding: chunked\r\n\r\n",
            )
            .await;
        let line = vec![b'x'; 64 * 1024];
        let chunk = format!("{:x}\r\n", line.len());
        // `data: ` and then x's for ever, never a line end: up to 256 MiB, or until cut.
        let _ = stream.write_all(b"6\r\ndata: \r\n").await;
        for _ in 0..4096 {
            let wrote = async {
                stream.write_all(chunk.as_bytes()).await?;
                stream.write_all(&line).await?;
                stream.write_all(b"\r\n").await
            };
            match tokio::time::timeout(Duration::from_secs(5), wrote).await {
                Ok(Ok(())) => counted.fetch_add(line.len(), Ordering::SeqCst),
                _ => break,
            };
        }
        let _ = done_tx.send(());
    });
    let provider = client(format!("http://{addr}/v1"), Duration::from_secs(5));
    let events = events(&provider, ask("hello")).await;
    let failed = events.iter().any(|e| {
        e.as_ref()
            .is_err_and(|e| e.to_string().contains("event stream line"))
    });
    assert!(failed, "{events:?}");
    tokio::time::timeout(Duration::from_secs(30), done_rx)
        .await
        .expect("the server stops writing")
        .expect("done");
    let written = written.load(Ordering::SeqCst);
    // The bound, plus what the socket buffers hold on both sides.
    assert!(
        written < agenthost_llm::sse::MAX_FRAME + 16 * 1024 * 1024,
        "{written} bytes were read off the network"
    );
}
