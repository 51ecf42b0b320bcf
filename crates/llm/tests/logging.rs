//! Log lines carry no secrets. In its own test binary: tracing caches per-callsite interest
//! process-wide, so tests hitting the same callsites without a subscriber on other threads
//! would race the thread-local subscriber installed here.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthost_llm::{ApiKey, Config, Kind, Message, Request};
use futures::StreamExt;
use tokio::net::TcpListener;

const KEY: &str = "sk-live-SECRET-6f1d2a9b8c7e";

/// A server whose 401 body, or in-stream error, quotes the credentials it received.
async fn echoing_server(in_stream: bool) -> String {
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| async move {
        let key = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = serde_json::json!({ "error": { "message": format!("Incorrect API key provided: {key}"), "code": "invalid_api_key" } });
        let (status, content_type, body) = if in_stream {
            (200, "text/event-stream", format!("data: {body}\n\n"))
        } else {
            (401, "application/json", body.to_string())
        };
        axum::response::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(axum::body::Body::from(body))
            .expect("response")
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// Records every event and span field as text.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut log = self.0.lock().expect("lock");
        span.record(&mut Fields(&mut log));
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Fields(&mut self.0.lock().expect("lock")));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut log = self.0.lock().expect("lock");
        log.push('\n');
        event.record(&mut Fields(&mut log));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn log_lines_carry_no_secrets() {
    let capture = Capture::default();
    // The test runtime is single-threaded, so a thread-local default sees every event.
    let _guard = tracing::subscriber::set_default(capture.clone());
    for in_stream in [false, true] {
        let mut config = Config::new(Kind::Openai);
        config.base_url = Some(echoing_server(in_stream).await);
        config.api_key = Some(ApiKey::new(KEY));
        let provider = config.build().expect("provider");
        let mut request = Request::new("m");
        request.messages.push(Message::user("hi"));
        let items = tokio::time::timeout(
            Duration::from_secs(20),
            provider.stream(request).collect::<Vec<_>>(),
        )
        .await
        .expect("bounded");
        assert!(items.last().is_some_and(Result::is_err));
    }
    let log = capture.0.lock().expect("lock").clone();
    assert!(
        log.contains("provider request"),
        "the client logs at all: {log}"
    );
    assert!(
        log.contains("provider error response"),
        "errors are logged: {log}"
    );
    assert!(!log.contains("SECRET"), "a secret leaked: {log}");
}
