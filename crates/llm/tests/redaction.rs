//! Secrets never appear in `Debug` or `Display` of configs, clients, requests or errors, nor in
//! log lines, even when a provider echoes the key back in an error body.

use std::time::Duration;

use agenthost_llm::{Anthropic, ApiKey, Config, Error, Kind, Message, OpenAi, Provider, Request};
use axum::http::HeaderMap;
use futures::StreamExt;
use tokio::net::TcpListener;

const KEY: &str = "sk-live-SECRET-6f1d2a9b8c7e";
const HEADER_SECRET: &str = "Bearer hdr-SECRET-1234567890";

fn config(kind: Kind, base_url: Option<String>) -> Config {
    let mut config = Config::new(kind);
    config.base_url = base_url;
    config.api_key = Some(ApiKey::new(KEY));
    config.headers.insert("Proxy-Authorization", HEADER_SECRET);
    config.headers.insert("x-visible", "fine");
    config
}

fn assert_clean(text: &str) {
    assert!(!text.contains("SECRET"), "a secret leaked: {text}");
}

#[test]
fn configs_clients_and_requests_do_not_print_secrets() {
    let openai_config = config(Kind::Openai, None);
    let shown = format!("{openai_config:?}");
    assert_clean(&shown);
    assert!(
        shown.contains("x-visible") && shown.contains("fine"),
        "{shown}"
    );
    assert!(shown.contains("[redacted]"), "{shown}");
    assert_clean(&format!("{:?}", ApiKey::new(KEY)));
    assert_clean(&format!(
        "{:?}",
        OpenAi::new(&openai_config).expect("client")
    ));
    assert_clean(&format!(
        "{:?}",
        Anthropic::new(&config(Kind::Anthropic, None)).expect("client")
    ));
    assert_clean(&format!("{:?}", openai_config.build().expect("provider")));

    let mut request = Request::new("m");
    request.messages.push(Message::user("hi"));
    request.headers.insert("authorization", HEADER_SECRET);
    request.headers.insert("X-Api-Key", KEY);
    assert_clean(&format!("{request:?}"));
    assert_clean(&format!("{request:#?}"));
}

/// A server answering every request with an error body that quotes the credentials it got.
async fn echoing_server(status: u16, in_stream: bool) -> String {
    let app = axum::Router::new().fallback(move |headers: HeaderMap| async move {
        let credentials: Vec<String> = ["authorization", "x-api-key", "proxy-authorization"]
            .iter()
            .filter_map(|name| headers.get(*name)?.to_str().ok().map(str::to_owned))
            .collect();
        let message = format!("Incorrect API key provided: {}", credentials.join(" / "));
        let body = serde_json::json!({ "error": { "message": message, "type": "invalid_request_error", "code": "invalid_api_key" } });
        let (status, content_type, body) = if in_stream {
            let stream = format!(
                "data: {{\"id\":\"x\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}}}}]}}\n\ndata: {body}\n\n"
            );
            (200, "text/event-stream", stream)
        } else {
            (status, "application/json", body.to_string())
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

async fn last_error(provider: &dyn Provider) -> Error {
    let mut request = Request::new("m");
    request.messages.push(Message::user("hi"));
    let items = tokio::time::timeout(
        Duration::from_secs(20),
        provider.stream(request).collect::<Vec<_>>(),
    )
    .await
    .expect("bounded");
    items
        .into_iter()
        .last()
        .expect("items")
        .expect_err("an error")
}

#[tokio::test]
async fn keys_echoed_in_error_bodies_are_scrubbed() {
    for (kind, in_stream) in [
        (Kind::Openai, false),
        (Kind::Openai, true),
        (Kind::Anthropic, false),
    ] {
        let base = echoing_server(401, in_stream).await;
        let provider = config(kind, Some(base)).build().expect("provider");
        let error = last_error(provider.as_ref()).await;
        let shown = format!("{error} {error:?}");
        // The key itself is scrubbed from the provider's message…
        assert!(!shown.contains(KEY), "{kind:?}/{in_stream}: {shown}");
        assert!(
            shown.contains("[redacted]"),
            "{kind:?}/{in_stream}: {shown}"
        );
    }
}

#[tokio::test]
async fn transport_errors_do_not_show_url_credentials() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let base = format!("http://user:url-SECRET-pass@{addr}/v1");
    let provider = OpenAi::new(&config(Kind::Openai, Some(base))).expect("client");
    let error = last_error(&provider).await;
    assert_clean(&format!("{error} {error:?}"));
}
