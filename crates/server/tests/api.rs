//! Router tests: every route of the HTTP API called through `tower::ServiceExt::oneshot` (no
//! socket), against a real runtime with the scripted provider. Each test states the requests
//! and checks statuses, error types and the JSON shapes clients rely on.

use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Config, Runtime};
use agenthost_llm::scripted::{Gate, Script, Scripted};
use agenthost_llm::{Error as LlmError, ErrorKind, FinishReason};
use agenthost_server::{Api, Options, Token};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use futures::StreamExt;
use serde_json::{Value, json};
use tempfile::TempDir;
use tower::ServiceExt;

/// Every wait in these tests is bounded by this.
const LIMIT: Duration = Duration::from_secs(20);

struct Harness {
    api: Api,
    router: Router,
    provider: Scripted,
    _dir: TempDir,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    json: Value,
}

async fn harness(scripts: Vec<Script>) -> Harness {
    harness_with(scripts, Options::default(), |_| {}).await
}

async fn harness_with(
    scripts: Vec<Script>,
    options: Options,
    edit: impl FnOnce(&mut Config),
) -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let provider = Scripted::new(scripts);
    let mut config = Config::new(dir.path().join("store.redb"))
        .with_provider("scripted", Arc::new(provider.clone()));
    edit(&mut config);
    let runtime = Runtime::start(config).await.expect("runtime starts");
    let api = Api::new(runtime, options);
    let router = api.router();
    Harness {
        api,
        router,
        provider,
        _dir: dir,
    }
}

impl Harness {
    async fn send(&self, request: Request<Body>) -> Reply {
        let response = tokio::time::timeout(LIMIT, self.router.clone().oneshot(request))
            .await
            .expect("answered in time")
            .expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = tokio::time::timeout(
            LIMIT,
            axum::body::to_bytes(response.into_body(), usize::MAX),
        )
        .await
        .expect("body in time")
        .expect("body");
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Reply {
            status,
            headers,
            json,
        }
    }

    async fn get(&self, uri: &str) -> Reply {
        self.send(request(Method::GET, uri, None)).await
    }

    async fn post(&self, uri: &str, body: Option<&str>) -> Reply {
        self.send(request(Method::POST, uri, body)).await
    }

    /// Creates a session and returns its id.
    async fn session(&self) -> String {
        let reply = self.post("/api/session", None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        reply.json["data"]["id"]
            .as_str()
            .expect("session id")
            .to_owned()
    }

    async fn idle(&self, session: &str) {
        let reply = self
            .post(
                &format!("/api/session/{session}/wait?timeout_ms=15000"),
                None,
            )
            .await;
        assert_eq!(reply.json["data"]["idle"], true, "{}", reply.json);
    }
}

fn request(method: Method, uri: &str, body: Option<&str>) -> Request<Body> {
    let builder = Request::builder().method(method).uri(uri);
    match body {
        Some(body) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned())),
        None => builder.body(Body::empty()),
    }
    .expect("valid request")
}

#[track_caller]
fn assert_error(reply: &Reply, status: u16, kind: &str) {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.json);
    assert_eq!(reply.json["error"]["type"], kind, "{}", reply.json);
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.is_empty(),
        "an error needs a message: {}",
        reply.json
    );
    assert_eq!(
        reply.headers[header::CONTENT_TYPE],
        "application/json",
        "errors are JSON"
    );
    assert!(
        reply
            .headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|id| id.starts_with("req_")),
        "every error answer names its request id: {:?}",
        reply.headers
    );
}

/// An error answer that names nothing internal: none of `secrets`, no OS error text.
fn assert_clean(reply: &Reply, secrets: &[&str]) {
    let body = reply.json.to_string();
    for secret in secrets.iter().chain(&["os error", "No space left"]) {
        assert!(
            !body.contains(secret),
            "{} answer shows {secret:?}: {body}",
            reply.status
        );
    }
}

fn text(reply: &str) -> Script {
    Script::new().text(reply).finish(FinishReason::Stop)
}

#[tokio::test]
async fn health_metrics_and_unknown_routes() {
    let h = harness(vec![]).await;
    let reply = h.get("/healthz").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json, json!({"status": "ok"}));

    let reply = h.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.headers[header::CONTENT_TYPE]
            .to_str()
            .is_ok_and(|t| t.starts_with("application/openmetrics-text; version=1.0.0"))
    );
    let text = reply.json.as_str().expect("text");
    assert!(text.ends_with("# EOF\n"), "{text}");
    for metric in [
        "agenthost_sessions_live ",
        "agenthost_sessions_active ",
        "agenthost_drains_waiting ",
        "agenthost_actor_restarts_total ",
        "agenthost_sessions_recovered_total ",
        "agenthost_inputs_from_memory_total ",
        "agenthost_store_commits_total ",
        "agenthost_store_commit_batch_size_bucket{le=\"1.0\"}",
        "agenthost_store_commit_seconds_bucket{le=\"0.0001\"}",
        "agenthost_store_maintenance_total ",
        "agenthost_store_lingered_batches_total ",
        "agenthost_drains_total ",
        "agenthost_admissions_total ",
        "agenthost_sse_streams ",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
    ] {
        assert!(text.contains(metric), "{metric} missing from\n{text}");
    }

    assert_error(&h.get("/nope").await, 404, "not_found");
    assert_error(&h.get("/api/session/ses_a/nope").await, 404, "not_found");
    let reply = h.send(request(Method::DELETE, "/api/session", None)).await;
    assert_error(&reply, 405, "method_not_allowed");
    assert_error(
        &h.get("/api/session/ses_a/prompt").await,
        405,
        "method_not_allowed",
    );
}

/// A tool that answers with its input.
#[derive(Debug)]
struct Echo;

impl agenthost_actors::Executor for Echo {
    fn execute(
        &self,
        call: agenthost_actors::Call,
    ) -> futures::future::BoxFuture<'static, Result<String, String>> {
        Box::pin(async move { Ok(call.input.to_string()) })
    }
}

/// `name{labels} value` lines of an OpenMetrics text, by `name{labels}`.
fn samples(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Counters are kept where things happen, so a scripted run moves each by exactly what
/// happened: 3 prompts, 1 tool call, 1 retry. Read over HTTP with the API client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_what_happened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let scripted = Scripted::new([
        text("one"),
        Script::new()
            .tool_call("call_1", "echo", r#"{"x":1}"#)
            .finish(FinishReason::ToolCalls),
        text("after the tool"),
        Script::new().error(LlmError::rate_limit(None)),
        text("after the retry"),
    ]);
    let providers = Arc::new(agenthost_server::metrics::Providers::default());
    let config = Config::new(dir.path().join("store.redb"))
        .with_provider("scripted", providers.wrap("scripted", Arc::new(scripted)));
    let mut tools = agenthost_actors::Tools::default();
    tools.register(agenthost_actors::Tool::new(
        "echo",
        "echoes",
        json!({"type": "object"}),
        Arc::new(Echo),
    ));
    let extensions = agenthost_actors::Extensions {
        tools,
        ..Default::default()
    };
    let runtime = Runtime::start_with(config, extensions)
        .await
        .expect("runtime starts");
    let options = Options {
        providers: Some(providers),
        ..Options::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(Api::new(runtime, options).serve(listener, std::future::pending()));
    let client = agenthost_api::Client::new(&url).expect("client");

    let session = client
        .create_session(&agenthost_api::wire::CreateSession::default())
        .await
        .expect("session");
    for text in ["a", "b", "c"] {
        let prompt = agenthost_api::wire::Prompt {
            text: text.into(),
            ..Default::default()
        };
        client.prompt(&session.id, &prompt).await.expect("admitted");
        let idle = client.wait(&session.id, LIMIT).await.expect("waited");
        assert!(idle.idle);
    }
    let metrics = samples(&client.metrics().await.expect("metrics"));
    for (sample, want) in [
        ("agenthost_admissions_total", 3.0),
        ("agenthost_promotions_total", 3.0),
        ("agenthost_drains_total", 3.0),
        ("agenthost_steps_total{outcome=\"done\"}", 3.0),
        ("agenthost_steps_total{outcome=\"continue\"}", 1.0),
        ("agenthost_retries_total{reason=\"rate_limit\"}", 1.0),
        (
            "agenthost_tool_calls_total{tool=\"echo\",outcome=\"ok\"}",
            1.0,
        ),
        ("agenthost_events_total{kind=\"session_created\"}", 1.0),
        ("agenthost_events_total{kind=\"prompt_admitted\"}", 3.0),
        ("agenthost_events_total{kind=\"retry_scheduled\"}", 1.0),
        ("agenthost_events_total{kind=\"execution_succeeded\"}", 3.0),
        (
            "agenthost_provider_requests_total{provider=\"scripted\"}",
            5.0,
        ),
        (
            "agenthost_provider_errors_total{provider=\"scripted\"}",
            1.0,
        ),
        (
            "agenthost_provider_first_token_seconds_count{provider=\"scripted\"}",
            4.0,
        ),
        (
            "agenthost_provider_call_seconds_count{provider=\"scripted\"}",
            4.0,
        ),
        ("agenthost_actor_restarts_total", 0.0),
        ("agenthost_sessions_active", 0.0),
        ("agenthost_drains_waiting", 0.0),
        ("agenthost_sessions_claimed", 0.0),
        ("agenthost_inputs_pending", 0.0),
    ] {
        assert_eq!(metrics.get(sample), Some(&want), "{sample}: {metrics:#?}");
    }
    assert!(
        !metrics.keys().any(|k| k.contains("ses_")),
        "no session id in a label"
    );
    // An input admitted without a wake stays pending.
    let parked = agenthost_api::wire::Prompt {
        text: "later".into(),
        resume: Some(false),
        ..Default::default()
    };
    client.prompt(&session.id, &parked).await.expect("admitted");
    let metrics = samples(&client.metrics().await.expect("metrics"));
    assert_eq!(metrics.get("agenthost_inputs_pending"), Some(&1.0));
    assert_eq!(metrics.get("agenthost_admissions_total"), Some(&4.0));
    assert_eq!(metrics.get("agenthost_promotions_total"), Some(&3.0));
    server.abort();
}

/// A scrape reads no store: its gauges of pending inputs and claims come from memory, seeded
/// by the start's recovery read and moved by every commit, so they hold across a restart too,
/// from the first scrape on (the read is done before the runtime is handed out).
#[tokio::test]
async fn a_scrape_reads_no_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.redb");
    let start = |path: std::path::PathBuf| async move {
        let config =
            Config::new(path).with_provider("scripted", Arc::new(Scripted::new([text("ok")])));
        let runtime = Runtime::start(config).await.expect("runtime starts");
        Api::new(runtime, Options::default())
    };
    let get = |router: Router| async move {
        let reply = router
            .oneshot(request(Method::GET, "/metrics", None))
            .await
            .expect("infallible");
        let body = axum::body::to_bytes(reply.into_body(), usize::MAX)
            .await
            .expect("body");
        samples(&String::from_utf8_lossy(&body))
    };
    let api = start(path.clone()).await;
    let router = api.router();
    let created = router
        .clone()
        .oneshot(request(Method::POST, "/api/session", None))
        .await
        .expect("infallible");
    let body = axum::body::to_bytes(created.into_body(), usize::MAX)
        .await
        .expect("body");
    let created: Value = serde_json::from_slice(&body).expect("JSON");
    let session = created["data"]["id"].as_str().expect("id").to_owned();
    for text in ["one", "two"] {
        let prompt = format!(r#"{{"text":"{text}","resume":false}}"#);
        let reply = router
            .clone()
            .oneshot(request(
                Method::POST,
                &format!("/api/session/{session}/prompt"),
                Some(&prompt),
            ))
            .await
            .expect("infallible");
        assert_eq!(reply.status(), StatusCode::OK);
    }
    let first = get(router.clone()).await;
    assert_eq!(first.get("agenthost_inputs_pending"), Some(&2.0));
    let reads = |m: &std::collections::HashMap<String, f64>| {
        *m.get("agenthost_store_snapshots_total")
            .expect("the read counter")
    };
    let mut before = reads(&first);
    for _ in 0..20 {
        let again = get(router.clone()).await;
        assert_eq!(reads(&again), before, "a scrape read the store");
        before = reads(&again);
    }
    drop(router);
    api.runtime().shutdown().await;

    // After a restart, the start's one read seeds what the store holds.
    let router = start(path).await.router();
    let metrics = get(router.clone()).await;
    assert_eq!(metrics.get("agenthost_inputs_pending"), Some(&2.0));
    assert_eq!(metrics.get("agenthost_sessions_claimed"), Some(&0.0));
    let reply = router
        .clone()
        .oneshot(request(
            Method::POST,
            &format!("/api/session/{session}/resume?wait=true"),
            None,
        ))
        .await
        .expect("infallible");
    assert_eq!(reply.status(), StatusCode::OK);
    let metrics = get(router).await;
    assert_eq!(metrics.get("agenthost_inputs_pending"), Some(&0.0));
}

#[tokio::test]
async fn create_and_get_sessions() {
    let h = harness(vec![]).await;
    let reply = h.post("/api/session", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    let session = &reply.json["data"];
    let id = session["id"].as_str().expect("id");
    assert!(id.starts_with("ses_"));
    assert_eq!(session["agent"], "default");
    assert_eq!(session["status"], json!({"type": "idle"}));
    assert_eq!(session["last_seq"], 0);
    assert_eq!(session["usage"]["input"], 0);
    assert_eq!(session["claimed"], false);

    // A client-chosen id; creating it again returns the same session.
    let body = r#"{"id": "ses_mine", "title": "t"}"#;
    let first = h.post("/api/session", Some(body)).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.json);
    assert_eq!(first.json["data"]["id"], "ses_mine");
    assert_eq!(first.json["data"]["title"], "t");
    let again = h.post("/api/session", Some(body)).await;
    assert_eq!(again.json["data"]["created"], first.json["data"]["created"]);
    assert_eq!(
        h.post("/api/session", Some("{}")).await.status,
        StatusCode::OK
    );

    let reply = h.get("/api/session/ses_mine").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json["data"]["id"], "ses_mine");

    assert_error(
        &h.get("/api/session/ses_unknown").await,
        404,
        "session_not_found",
    );
    // A path that cannot name a session names none: 404, with the reason in the message. Only a
    // body that would create one under a malformed id is a bad request.
    let reply = h.get("/api/session/nope").await;
    assert_error(&reply, 404, "session_not_found");
    assert!(
        reply.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"nope\"") && m.contains("missing prefix")),
        "{}",
        reply.json
    );
    assert_error(
        &h.get("/api/session/ses_bad%20id").await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.post(
            "/api/session/does-not-exist/prompt",
            Some(r#"{"text": "hi"}"#),
        )
        .await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.post("/api/session", Some(r#"{"id": "session-1"}"#)).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post("/api/session", Some(r#"{"agent": "ghost"}"#)).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post("/api/session", Some(r#"{"model": "gpt"}"#)).await,
        400,
        "invalid_request",
    );
    let with_model = h
        .post("/api/session", Some(r#"{"model": "default"}"#))
        .await;
    assert_eq!(with_model.status, StatusCode::OK, "{}", with_model.json);
    let reply = h.post("/api/session", Some(r#"{"colour": "red"}"#)).await;
    assert_error(&reply, 400, "invalid_request");
    assert!(
        reply.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown field `colour`")),
        "{}",
        reply.json
    );
    let reply = h.post("/api/session", Some(r#"{"id": "#)).await;
    assert_error(&reply, 400, "invalid_request");
    assert!(
        reply.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("malformed JSON"))
    );
    assert_error(
        &h.post("/api/session", Some(r#"{"id": 5}"#)).await,
        400,
        "invalid_request",
    );
    let form = Request::post("/api/session")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from("{}"))
        .expect("request");
    assert_error(&h.send(form).await, 415, "unsupported_media_type");
}

#[tokio::test]
async fn list_sessions_newest_first_with_a_cursor() {
    let h = harness(vec![]).await;
    for n in 0..3 {
        h.post("/api/session", Some(&format!(r#"{{"id": "ses_{n}"}}"#)))
            .await;
        // Creation times are milliseconds; keep them distinct so the order is the id order.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let page = h.get("/api/session?limit=2").await;
    assert_eq!(page.status, StatusCode::OK);
    let ids: Vec<&str> = page.json["data"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, ["ses_2", "ses_1"]);
    let next = page.json["data"]["cursor"]["next"].as_str().expect("next");
    let page = h.get(&format!("/api/session?limit=2&cursor={next}")).await;
    assert_eq!(page.json["data"]["sessions"][0]["id"], "ses_0");
    assert_eq!(
        page.json["data"]["sessions"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(page.json["data"]["cursor"]["next"], Value::Null);
    let all = h.get("/api/session").await;
    assert_eq!(
        all.json["data"]["sessions"].as_array().map(Vec::len),
        Some(3)
    );

    assert_error(&h.get("/api/session?limit=0").await, 400, "invalid_request");
    assert_error(
        &h.get("/api/session?limit=5000").await,
        400,
        "invalid_request",
    );
    assert_error(&h.get("/api/session?limit=x").await, 400, "invalid_request");
    assert_error(
        &h.get("/api/session?cursor=garbage").await,
        400,
        "invalid_request",
    );
    assert_error(&h.get("/api/session?page=2").await, 400, "invalid_request");
}

#[tokio::test]
async fn prompt_admission_idempotency_and_bad_input() {
    let h = harness(vec![]).await;
    let s = h.session().await;
    let url = format!("/api/session/{s}/prompt");
    let body = r#"{"id": "msg_p1", "text": "hello", "delivery": "queue", "resume": false}"#;
    let first = h.post(&url, Some(body)).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.json);
    assert_eq!(
        first.json["data"],
        json!({"id": "msg_p1", "session_id": s, "admitted_seq": 1, "delivery": "queue", "promoted_seq": null})
    );
    // An exact retry returns the original receipt and writes nothing.
    let retry = h.post(&url, Some(body)).await;
    assert_eq!(retry.json, first.json);
    let reply = h
        .post(
            &url,
            Some(r#"{"id": "msg_p1", "text": "other", "delivery": "queue", "resume": false}"#),
        )
        .await;
    assert_error(&reply, 409, "prompt_conflict");
    // Files only, no text, is a valid prompt.
    let files = r#"{"files": [{"mime": "image/png", "url": "data:image/png;base64,AAAA"}], "resume": false}"#;
    let reply = h.post(&url, Some(files)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"]["admitted_seq"], 2);

    let inbox = h.get(&format!("/api/session/{s}/inbox")).await;
    assert_eq!(inbox.status, StatusCode::OK);
    let items = inbox.json["data"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], "msg_p1");
    assert_eq!(items[0]["text"], "hello");
    assert_eq!(items[0]["delivery"], "queue");
    assert_eq!(items[1]["files"][0]["mime"], "image/png");

    // Paged: at most `limit`, then on after the last one's admitted_seq.
    let page = h.get(&format!("/api/session/{s}/inbox?limit=1")).await;
    assert_eq!(page.json["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(page.json["data"][0]["admitted_seq"], 1);
    let next = h
        .get(&format!("/api/session/{s}/inbox?after_seq=1&limit=1"))
        .await;
    assert_eq!(next.json["data"][0]["admitted_seq"], 2, "{}", next.json);
    let done = h.get(&format!("/api/session/{s}/inbox?after_seq=2")).await;
    assert_eq!(done.json["data"], json!([]));
    for bad in ["limit=0", "limit=1001", "after_seq=x", "cursor=1"] {
        assert_error(
            &h.get(&format!("/api/session/{s}/inbox?{bad}")).await,
            400,
            "invalid_request",
        );
    }

    for (bad, kind, status) in [
        (r#"{"text": ""}"#, "invalid_request", 400),
        (r#"{"text": "  "}"#, "invalid_request", 400),
        (r#"{}"#, "invalid_request", 400),
        (
            r#"{"text": "x", "delivery": "later"}"#,
            "invalid_request",
            400,
        ),
        (r#"{"text": "x", "id": "p1"}"#, "invalid_request", 400),
        (r#"{"text": "x", "priority": 1}"#, "invalid_request", 400),
        (
            r#"{"text": "x", "files": [{"mime": "png", "url": "x"}]}"#,
            "invalid_request",
            400,
        ),
        (r#"{"text": "x""#, "invalid_request", 400),
        (r#"["x"]"#, "invalid_request", 400),
    ] {
        let reply = h.post(&url, Some(bad)).await;
        assert_error(&reply, status, kind);
    }
    assert_error(&h.post(&url, None).await, 400, "invalid_request");
    assert_error(
        &h.post("/api/session/ses_ghost/prompt", Some(r#"{"text": "x"}"#))
            .await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.post("/api/session/ghost/prompt", Some(r#"{"text": "x"}"#))
            .await,
        404,
        "session_not_found",
    );
    // Over the prompt limit (1 MiB) but under the body limit: payload_too_large, from the
    // prompt check.
    let big = format!(
        r#"{{"text": "{}", "resume": false}}"#,
        "a".repeat(1024 * 1024 + 1)
    );
    assert_error(&h.post(&url, Some(&big)).await, 413, "payload_too_large");
    // Over the body limit (4 MiB): refused before parsing.
    let huge = format!(r#"{{"text": "{}"}}"#, "a".repeat(5 * 1024 * 1024));
    assert_error(&h.post(&url, Some(&huge)).await, 413, "payload_too_large");
    // Nothing of the refused requests was written.
    let session = h.get(&format!("/api/session/{s}")).await;
    assert_eq!(session.json["data"]["last_seq"], 2);
    assert_eq!(session.json["data"]["pending"], 2);
}

#[tokio::test]
async fn a_turn_then_messages() {
    let h = harness(vec![
        Script::new()
            .reasoning("thinking")
            .text("hi there")
            .finish(FinishReason::Stop),
    ])
    .await;
    let s = h.session().await;
    let reply = h
        .post(
            &format!("/api/session/{s}/prompt"),
            Some(r#"{"text": "hello"}"#),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    h.idle(&s).await;

    let reply = h.get(&format!("/api/session/{s}/messages")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let messages = reply.json["data"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{}", reply.json);
    let user = &messages[0];
    assert_eq!(user["type"], "user");
    assert_eq!(user["text"], "hello");
    assert_eq!(user["files"], json!([]));
    assert!(user["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert!(user["seq"].as_u64().is_some());
    let assistant = &messages[1];
    assert_eq!(assistant["type"], "assistant");
    assert_eq!(assistant["finish"], "stop");
    assert_eq!(assistant["error"], Value::Null);
    assert_eq!(
        assistant["content"][0],
        json!({"type": "reasoning", "text": "thinking", "incomplete": false})
    );
    assert_eq!(
        assistant["content"][1],
        json!({"type": "text", "text": "hi there", "incomplete": false})
    );
    assert!(assistant["usage"].is_object());
    assert!(assistant["time"]["created"].as_u64().is_some());
    assert!(assistant["time"]["completed"].as_u64().is_some());

    let user_seq = user["seq"].as_u64().expect("seq");
    let after = h
        .get(&format!("/api/session/{s}/messages?after_seq={user_seq}"))
        .await;
    assert_eq!(after.json["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(after.json["data"][0]["type"], "assistant");
    let limited = h.get(&format!("/api/session/{s}/messages?limit=1")).await;
    assert_eq!(limited.json["data"][0]["type"], "user");
    assert_eq!(limited.json["data"].as_array().map(Vec::len), Some(1));
    let beyond = h
        .get(&format!(
            "/api/session/{s}/messages?after_seq=18446744073709551615"
        ))
        .await;
    assert_eq!(beyond.json["data"], json!([]));

    assert_error(
        &h.get(&format!("/api/session/{s}/messages?limit=0")).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.get(&format!("/api/session/{s}/messages?after_seq=-1"))
            .await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.get(&format!("/api/session/{s}/messages?after=1")).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.get("/api/session/ses_ghost/messages").await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.get("/api/session/ses_ghost/inbox").await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.get("/api/session/x/inbox").await,
        404,
        "session_not_found",
    );

    let session = h.get(&format!("/api/session/{s}")).await;
    assert_eq!(session.json["data"]["status"]["type"], "idle");
    assert_eq!(session.json["data"]["claimed"], false);
}

#[tokio::test]
async fn resume_interrupt_wait_and_active() {
    let gate = Gate::new();
    let h = harness(vec![
        text("first"),
        Script::new()
            .gate(&gate)
            .text("late")
            .finish(FinishReason::Stop),
    ])
    .await;
    let s = h.session().await;

    // A forced drain from existing history, waited for.
    let reply = h
        .post(&format!("/api/session/{s}/resume?wait=true"), None)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(
        reply.json["data"],
        json!({"outcome": "completed", "steps": 1})
    );

    // Without wait: 202 at once; the drain reaches the gate.
    let reply = h.post(&format!("/api/session/{s}/resume"), None).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
    assert_eq!(reply.json["data"]["status"], "accepted");
    tokio::time::timeout(LIMIT, gate.reached())
        .await
        .expect("gate reached");

    let active = h.get("/api/session/active").await;
    assert_eq!(active.status, StatusCode::OK);
    assert_eq!(active.json["data"][&s], json!({"type": "running"}));
    let session = h.get(&format!("/api/session/{s}")).await;
    assert_eq!(session.json["data"]["status"]["type"], "running");
    assert_eq!(session.json["data"]["claimed"], true);

    let reply = h
        .post(&format!("/api/session/{s}/wait?timeout_ms=50"), None)
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json["data"], json!({"idle": false}));
    // A compaction cannot join a running drain: the session is busy (409), not the server.
    let reply = h.post(&format!("/api/session/{s}/compact"), None).await;
    assert_error(&reply, 409, "session_busy");
    assert!(
        reply.headers.get("retry-after").is_none(),
        "{:?}",
        reply.headers
    );

    let reply = h.post(&format!("/api/session/{s}/interrupt"), None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"], json!({"interrupted": true}));
    h.idle(&s).await;
    let reply = h
        .post(&format!("/api/session/{s}/interrupt"), Some("{}"))
        .await;
    assert_eq!(reply.json["data"], json!({"interrupted": false}));
    let active = h.get("/api/session/active").await;
    assert_eq!(active.json["data"], json!({}));

    let messages = h.get(&format!("/api/session/{s}/messages")).await;
    let last = messages.json["data"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .expect("a message");
    assert_eq!(last["error"]["kind"], "aborted", "{last}");

    for (url, kind, status) in [
        ("/api/session/ses_ghost/resume", "session_not_found", 404),
        (
            "/api/session/ses_ghost/resume?wait=true",
            "session_not_found",
            404,
        ),
        ("/api/session/ses_ghost/interrupt", "session_not_found", 404),
        ("/api/session/ses_ghost/wait", "session_not_found", 404),
        ("/api/session/ghost/wait", "session_not_found", 404),
        ("/api/session/ghost/interrupt", "session_not_found", 404),
        ("/api/session/ghost/resume", "session_not_found", 404),
    ] {
        assert_error(&h.post(url, None).await, status, kind);
    }
    let base = format!("/api/session/{s}");
    assert_error(
        &h.post(&format!("{base}/resume?wait=maybe"), None).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post(&format!("{base}/resume?now=1"), None).await,
        400,
        "invalid_request",
    );
    // Options may come in the body too, but unknown ones are refused there as well.
    assert_error(
        &h.post(
            &format!("{base}/resume"),
            Some(r#"{"wait": true, "now": 1}"#),
        )
        .await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post(&format!("{base}/interrupt"), Some("[1]")).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post(&format!("{base}/wait?timeout_ms=99999999"), None)
            .await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post(&format!("{base}/wait?timeout_ms=soon"), None).await,
        400,
        "invalid_request",
    );
}

/// A wait that follows an accepted resume waits for that resume's drain: the 202 is sent only
/// once the resume is in the session's hands, so nothing asked after it can overtake it.
#[tokio::test]
async fn a_wait_after_an_accepted_resume_waits_for_its_drain() {
    let h = harness(vec![text("first"), text("second")]).await;
    let s = h.session().await;
    let reply = h
        .post(&format!("/api/session/{s}/resume?wait=true"), None)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);

    let reply = h.post(&format!("/api/session/{s}/resume"), None).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
    h.idle(&s).await;
    let messages = h.get(&format!("/api/session/{s}/messages")).await;
    let texts: Vec<String> = messages.json["data"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            m["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(
        texts,
        ["first", "second"],
        "the wait answered before the accepted resume's drain: {}",
        messages.json
    );
}

#[tokio::test]
async fn provider_failure_is_a_bad_gateway() {
    // What the provider said (an address, a key's prefix) stays in the log.
    let auth = LlmError::new(
        ErrorKind::Authentication,
        "bad key sk-live-7f3a at https://10.9.8.7:8443/v1",
    );
    let h = harness(vec![
        Script::new().error(auth.clone()),
        Script::new().error(auth),
    ])
    .await;
    let s = h.session().await;
    let reply = h
        .post(&format!("/api/session/{s}/resume?wait=true"), None)
        .await;
    assert_error(&reply, 502, "provider_error");
    let secrets = ["sk-live", "10.9.8.7", "bad key"];
    assert_clean(&reply, &secrets);
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("authentication"), "{message}");
    let reply = h
        .post(
            &format!("/api/session/{s}/generate"),
            Some(r#"{"prompt": "sum up"}"#),
        )
        .await;
    assert_error(&reply, 502, "provider_error");
    assert_clean(&reply, &secrets);
}

#[tokio::test]
async fn generate_answers_and_refuses_bad_input() {
    let h = harness_with(vec![text("a recap")], Options::default(), |c| {
        for model in c.models.values_mut() {
            model.context_window = 2_000;
            model.max_output = Some(100);
        }
    })
    .await;
    let s = h.session().await;
    let url = format!("/api/session/{s}/generate");
    let reply = h.post(&url, Some(r#"{"prompt": "summarize"}"#)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"], json!({"text": "a recap"}));
    assert_eq!(h.provider.calls(), 1);
    // Nothing was recorded.
    let session = h.get(&format!("/api/session/{s}")).await;
    assert_eq!(session.json["data"]["last_seq"], 0);

    let long = format!(r#"{{"prompt": "{}"}}"#, "word ".repeat(20_000));
    assert_error(&h.post(&url, Some(&long)).await, 422, "context_overflow");
    assert_error(
        &h.post(&url, Some(r#"{"prompt": ""}"#)).await,
        400,
        "invalid_request",
    );
    assert_error(&h.post(&url, Some(r#"{}"#)).await, 400, "invalid_request");
    assert_error(
        &h.post(&url, Some(r#"{"prompt": "x", "tools": []}"#)).await,
        400,
        "invalid_request",
    );
    assert_error(
        &h.post(
            "/api/session/ses_ghost/generate",
            Some(r#"{"prompt": "x"}"#),
        )
        .await,
        404,
        "session_not_found",
    );
    assert_eq!(
        h.provider.calls(),
        1,
        "refused requests never reach the provider"
    );
}

/// A summary that follows the compaction template.
fn summary_reply() -> Script {
    let reply: String = agenthost_actors::SUMMARY_SECTIONS
        .iter()
        .map(|section| format!("## {section}\nthe summary\n\n"))
        .collect();
    text(&reply)
}

#[tokio::test]
async fn compact_summarizes_older_history_or_says_there_is_nothing() {
    let h = harness_with(
        vec![text("first answer"), text("second answer"), summary_reply()],
        Options::default(),
        |c| c.compaction.keep_tokens = 10,
    )
    .await;
    let s = h.session().await;
    let url = format!("/api/session/{s}/compact");
    assert_error(&h.post(&url, None).await, 400, "invalid_request");
    assert_eq!(
        h.provider.calls(),
        0,
        "nothing to compact makes no provider call"
    );
    for text in [
        "an older question with some words in it",
        "a newer question",
    ] {
        let body = format!(r#"{{"text": "{text}"}}"#);
        let reply = h
            .post(&format!("/api/session/{s}/prompt"), Some(&body))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        let wait = h
            .post(&format!("/api/session/{s}/wait?timeout_ms=30000"), None)
            .await;
        assert_eq!(wait.json["data"]["idle"], true, "{}", wait.json);
    }
    let reply = h.post(&url, None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"]["outcome"], "compacted");
    assert!(
        reply.json["data"]["kept_from"]
            .as_u64()
            .is_some_and(|k| k > 0)
    );
    assert_eq!(h.provider.calls(), 3);
    assert_error(
        &h.post("/api/session/ses_ghost/compact", None).await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.post(&url, Some(r#"{"x": 1}"#)).await,
        400,
        "invalid_request",
    );
}

#[tokio::test]
async fn token_protects_the_api_only() {
    let options = Options {
        token: Token::new("s3cret"),
        ..Options::default()
    };
    let h = harness_with(vec![], options, |_| {}).await;
    let reply = h.post("/api/session", None).await;
    assert_error(&reply, 401, "unauthorized");
    assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");
    let with = |value: &str| {
        Request::post("/api/session")
            .header(header::AUTHORIZATION, value)
            .body(Body::empty())
            .expect("request")
    };
    assert_error(&h.send(with("Bearer wrong")).await, 401, "unauthorized");
    assert_error(&h.send(with("Bearer s3cret2")).await, 401, "unauthorized");
    assert_error(&h.send(with("Basic s3cret")).await, 401, "unauthorized");
    let reply = h.send(with("Bearer s3cret")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    let id = reply.json["data"]["id"].as_str().expect("id").to_owned();
    assert_error(
        &h.get(&format!("/api/session/{id}")).await,
        401,
        "unauthorized",
    );
    assert_error(
        &h.get(&format!("/api/session/{id}/events")).await,
        401,
        "unauthorized",
    );
    // Health, metrics and the document stay open.
    assert_eq!(h.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(h.get("/metrics").await.status, StatusCode::OK);
    assert_eq!(h.get("/openapi.json").await.status, StatusCode::OK);
}

/// Every route of the OpenAPI document against every role: a role below the route's gets 403
/// `forbidden` and changes nothing; a role that reaches it is never refused for its role. The
/// expected role comes from this table, not from the server's code: `read` for `GET` and
/// `POST …/wait`, `admin` for the cluster's routes and a protected `/metrics`, `write` for the
/// rest.
#[tokio::test]
async fn each_role_reaches_exactly_its_routes() {
    use agenthost_server::auth::{NamedToken, Role, Tokens};
    let named = |name: &str, role, token: &str| NamedToken {
        name: name.into(),
        role,
        token: Token::new(token).expect("a token"),
    };
    let options = Options {
        tokens: Some(Arc::new(Tokens::new(vec![
            named("viewer", Role::Read, "read-token-0123456789"),
            named("ci", Role::Write, "write-token-0123456789"),
            named("ops", Role::Admin, "admin-token-0123456789"),
        ]))),
        protect_metrics: true,
        protect_healthz: true,
        ..Options::default()
    };
    let h = harness_with(vec![text("ok")], options, |_| {}).await;
    let send = |method: &str, uri: &str, token: Option<&str>| {
        let mut request = Request::builder()
            .method(Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method"))
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = if method == "get" {
            Body::empty()
        } else {
            Body::from("{}")
        };
        let request = request.body(body).expect("request");
        let router = h.router.clone();
        async move {
            // The status only: an event stream's body never ends.
            let response = tokio::time::timeout(LIMIT, router.oneshot(request))
                .await
                .expect("answered in time")
                .expect("infallible");
            let status = response.status().as_u16();
            let body = if status == 403 || status == 401 {
                let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body");
                serde_json::from_slice(&bytes).unwrap_or(Value::Null)
            } else {
                Value::Null
            };
            (status, body)
        }
    };
    let created = send("post", "/api/session", Some("write-token-0123456789")).await;
    assert_eq!(created.0, 200);
    let list = h
        .send(
            Request::get("/api/session")
                .header(header::AUTHORIZATION, "Bearer read-token-0123456789")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    let session = list.json["data"]["sessions"][0]["id"]
        .as_str()
        .expect("a session")
        .to_owned();
    let document: Value =
        serde_json::from_str(&h.get("/openapi.json").await.json.to_string()).expect("the document");
    let mut routes = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("methods").keys() {
            routes.push((method.clone(), path.clone()));
        }
    }
    assert!(routes.len() >= 20, "{routes:?}");
    let expected = |method: &str, path: &str| {
        if path.starts_with("/api/cluster") || path == "/metrics" {
            Role::Admin
        } else if method == "get" || path.ends_with("/wait") {
            Role::Read
        } else {
            Role::Write
        }
    };
    let tokens = [
        (Role::Read, "read-token-0123456789"),
        (Role::Write, "write-token-0123456789"),
        (Role::Admin, "admin-token-0123456789"),
    ];
    for (method, path) in &routes {
        let uri = path
            .replace("{id}", &session)
            .replace("{message_id}", "msg_01J0000000000000000000000A")
            .replace("{call_id}", "call_1")
            .replace("{schedule_id}", "sch_x");
        let needed = expected(method, path);
        if path == "/openapi.json" {
            continue;
        }
        for (role, token) in tokens {
            let (status, body) = send(method, &uri, Some(token)).await;
            if role < needed {
                assert_eq!(status, 403, "{method} {path} as {role:?}: {body}");
                assert_eq!(body["error"]["type"], "forbidden", "{body}");
            } else {
                assert!(
                    status != 403 && status != 401,
                    "{method} {path} as {role:?} was refused: {status} {body}"
                );
            }
        }
        if path != "/openapi.json" {
            let (status, _) = send(method, &uri, Some("no-such-token-0123456789")).await;
            assert_eq!(status, 401, "{method} {path} with an unknown token");
        }
    }
    // The refused writes changed nothing: still the one session, with nothing admitted.
    let list = h
        .send(
            Request::get("/api/session")
                .header(header::AUTHORIZATION, "Bearer admin-token-0123456789")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert!(
        list.json["data"]["sessions"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    );
    // A reloaded list: the old token stops working, the new one works at once.
    let tokens = h.api.tokens().expect("tokens");
    tokens.replace(vec![named("viewer2", Role::Read, "read-token-9876543210")]);
    assert_eq!(
        send("get", "/api/session", Some("read-token-0123456789"))
            .await
            .0,
        401
    );
    assert_eq!(
        send("get", "/api/session", Some("read-token-9876543210"))
            .await
            .0,
        200
    );
    // Emptied, it locks everyone out; it never opens the server.
    tokens.replace(vec![]);
    assert_eq!(send("get", "/api/session", None).await.0, 401);
}

/// An interrupt made with a named token records the token's name, durably, after the
/// interrupt; one that interrupts nothing records nothing.
#[tokio::test]
async fn an_interrupt_records_the_tokens_name() {
    use agenthost_server::auth::{NamedToken, Role, Tokens};
    let options = Options {
        tokens: Some(Arc::new(Tokens::new(vec![NamedToken {
            name: "ops-bot".into(),
            role: Role::Write,
            token: Token::new("writer-token-0123456789").expect("a token"),
        }]))),
        ..Options::default()
    };
    let h = harness_with(vec![Script::new().hang()], options, |_| {}).await;
    let as_writer = |method: Method, uri: &str, body: Option<&str>| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, "Bearer writer-token-0123456789")
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
            .expect("request")
    };
    let created = h.send(as_writer(Method::POST, "/api/session", None)).await;
    let s = created.json["data"]["id"].as_str().expect("id").to_owned();
    let interrupt = format!("/api/session/{s}/interrupt");
    // Nothing runs: nothing to interrupt, nothing recorded.
    let idle = h.send(as_writer(Method::POST, &interrupt, None)).await;
    assert_eq!(idle.json["data"]["interrupted"], false, "{}", idle.json);
    h.send(as_writer(
        Method::POST,
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "go"}"#),
    ))
    .await;
    let id = agenthost_model::SessionId::parse(&s).expect("id");
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !h.api.runtime().is_active(&id) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reply = h.send(as_writer(Method::POST, &interrupt, None)).await;
    assert_eq!(reply.json["data"]["interrupted"], true, "{}", reply.json);
    let log = h
        .api
        .runtime()
        .snapshot()
        .expect("snapshot")
        .events(&id, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events");
    let kinds: Vec<&str> = log.iter().map(|e| e.event.kind()).collect();
    let at = kinds
        .iter()
        .position(|k| *k == "interrupt_requested")
        .expect("recorded");
    assert_eq!(kinds[at - 1], "execution_interrupted", "{kinds:?}");
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "interrupt_requested")
            .count(),
        1
    );
    assert!(matches!(
        &log[at].event,
        agenthost_model::Event::InterruptRequested { by } if by == "ops-bot"
    ));
}

/// A forwarded request is served only when a node of the cluster signed exactly it, recently
/// and once: a forged header, a token instead of a signature, a changed body, path or caller, a
/// signature from outside the window, another secret and a replay are all refused with 401 and
/// change nothing; a valid one is served as the caller it carries, with that caller's role.
#[tokio::test]
async fn forwarded_requests_need_a_fresh_signature_over_exactly_them() {
    use agenthost_server::forward::{self, CALLER, ClusterSecret, FORWARDED, SIGNATURE};
    use std::time::SystemTime;
    let secret = ClusterSecret::new("a cluster secret of some length").expect("a secret");
    let options = Options {
        token: Token::new("the-callers-token"),
        cluster_secret: Some(secret.clone()),
        ..Options::default()
    };
    let h = harness_with(vec![text("ok")], options, |_| {}).await;
    let build = |method: Method, uri: &str, body: &str, headers: &[(&str, String)]| {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.body(Body::from(body.to_owned())).expect("request")
    };
    let signed = |method: &str, uri: &str, body: &str, caller: &str, at: SystemTime| {
        vec![
            (FORWARDED, "n1".to_owned()),
            (CALLER, caller.to_owned()),
            (
                SIGNATURE,
                forward::sign(&secret, method, uri, body.as_bytes(), "n1", caller, at),
            ),
        ]
    };
    let now = SystemTime::now();
    // A valid forward of a create, as a writer.
    let create = r#"{"id": "ses_forwarded"}"#;
    let reply = h
        .send(build(
            Method::POST,
            "/api/session",
            create,
            &signed("POST", "/api/session", create, "write:ci", now),
        ))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);

    let refused = [
        // The header alone, with the caller's token: nodes never accept a token for a forward.
        vec![
            (FORWARDED, "n1".to_owned()),
            ("authorization", "Bearer the-callers-token".to_owned()),
        ],
        // Signed for another body.
        signed(
            "POST",
            "/api/session",
            r#"{"id": "ses_other"}"#,
            "write:ci",
            now,
        ),
        // Signed for another path.
        signed("POST", "/api/session/ses_x/prompt", create, "write:ci", now),
        // Signed as a reader, sent as an admin.
        {
            let mut h = signed("POST", "/api/session", create, "read:viewer", now);
            h[1].1 = "admin:ops".to_owned();
            h
        },
        // Too old, and too far ahead.
        signed(
            "POST",
            "/api/session",
            create,
            "write:ci",
            now - std::time::Duration::from_secs(120),
        ),
        signed(
            "POST",
            "/api/session",
            create,
            "write:ci",
            now + std::time::Duration::from_secs(120),
        ),
        // Another secret.
        {
            let other = ClusterSecret::new("another secret, of some length").expect("a secret");
            vec![
                (FORWARDED, "n1".to_owned()),
                (CALLER, "write:ci".to_owned()),
                (
                    SIGNATURE,
                    forward::sign(
                        &other,
                        "POST",
                        "/api/session",
                        create.as_bytes(),
                        "n1",
                        "write:ci",
                        now,
                    ),
                ),
            ]
        },
    ];
    for headers in refused {
        let reply = h
            .send(build(Method::POST, "/api/session", create, &headers))
            .await;
        assert_error(&reply, 401, "unauthorized");
    }
    // A replay of a request that was accepted.
    let once = signed("GET", "/api/session", "", "read:viewer", now);
    let reply = h.send(build(Method::GET, "/api/session", "", &once)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    let reply = h.send(build(Method::GET, "/api/session", "", &once)).await;
    assert_error(&reply, 401, "unauthorized");
    // The carried caller's role holds on the owner.
    let prompt = r#"{"text": "hi"}"#;
    let uri = "/api/session/ses_forwarded/prompt";
    let reply = h
        .send(build(
            Method::POST,
            uri,
            prompt,
            &signed("POST", uri, prompt, "read:viewer", now),
        ))
        .await;
    assert_error(&reply, 403, "forbidden");
    // Nothing refused was created.
    let listed = h
        .send(build(
            Method::GET,
            "/api/session",
            "",
            &[("authorization", "Bearer the-callers-token".to_owned())],
        ))
        .await;
    let ids: Vec<&str> = listed.json["data"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, ["ses_forwarded"], "{}", listed.json);

    // A node without a secret accepts no forward at all.
    let h = harness(vec![]).await;
    let reply = h
        .send(build(
            Method::POST,
            "/api/session",
            create,
            &signed("POST", "/api/session", create, "write:ci", now),
        ))
        .await;
    assert_error(&reply, 401, "unauthorized");
}

#[tokio::test]
async fn cross_site_browser_requests_are_refused_without_a_token() {
    let h = harness(vec![]).await;
    let request = Request::post("/api/session")
        .header("sec-fetch-site", "cross-site")
        .body(Body::empty())
        .expect("request");
    assert_error(&h.send(request).await, 401, "unauthorized");
}

#[tokio::test]
async fn shutting_down_is_unavailable() {
    let h = harness(vec![]).await;
    let s = h.session().await;
    h.api.runtime().shutdown().await;
    assert_error(&h.post("/api/session", None).await, 503, "unavailable");
    let reply = h
        .post(
            &format!("/api/session/{s}/prompt"),
            Some(r#"{"text": "x"}"#),
        )
        .await;
    assert_error(&reply, 503, "unavailable");
    assert_eq!(reply.headers[header::RETRY_AFTER], "1");
}

/// `Api::serve` accepts on a task of its own; dropping the `serve` future stops that task, so
/// the port closes as it did when accepting was part of the future.
#[tokio::test]
async fn dropping_serve_closes_its_port() {
    let h = harness(vec![]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(h.api.clone().serve(listener, std::future::pending()));
    let client = agenthost_api::Client::new(&format!("http://{addr}")).expect("client");
    client.health().await.expect("served");
    server.abort();
    assert!(server.await.is_err_and(|e| e.is_cancelled()));
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        refused,
        "the port still accepts connections after serve was dropped"
    );
}

/// Lists every route with one valid request; the OpenAPI test checks the same list.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/api/session"),
    ("get", "/api/session"),
    ("get", "/api/session/active"),
    ("get", "/api/session/{id}"),
    ("patch", "/api/session/{id}"),
    ("post", "/api/session/{id}/prompt"),
    ("post", "/api/session/{id}/resume"),
    ("post", "/api/session/{id}/interrupt"),
    ("post", "/api/session/{id}/wait"),
    ("post", "/api/session/{id}/generate"),
    ("post", "/api/session/{id}/compact"),
    ("get", "/api/session/{id}/messages"),
    ("get", "/api/session/{id}/inbox"),
    (
        "get",
        "/api/session/{id}/tool-output/{message_id}/{call_id}",
    ),
    ("get", "/api/session/{id}/events"),
    ("get", "/api/session/{id}/approvals"),
    ("post", "/api/session/{id}/approvals/{message_id}/{call_id}"),
    ("post", "/api/session/{id}/schedules"),
    ("get", "/api/session/{id}/schedules"),
    ("delete", "/api/session/{id}/schedules/{schedule_id}"),
    ("get", "/api/cluster"),
    ("get", "/api/mcp"),
];

#[tokio::test]
async fn the_embedded_store_is_a_cluster_of_one() {
    let h = harness(vec![]).await;
    let reply = h.get("/api/cluster").await;
    assert_eq!(reply.status, StatusCode::OK);
    let cluster = &reply.json["data"];
    assert_eq!(cluster["store"], "redb");
    assert_eq!(cluster["partitions"], 1);
    assert_eq!(cluster["nodes"][0]["partitions"], json!([0]));
    assert_eq!(cluster["nodes"][0]["alive"], true);
}

#[tokio::test]
async fn openapi_document_lists_every_route() {
    let h = harness(vec![]).await;
    let reply = h.get("/openapi.json").await;
    assert_eq!(reply.status, StatusCode::OK);
    let doc = &reply.json;
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().expect("paths");
    let mut documented = 0;
    for item in paths.values() {
        documented += item.as_object().map_or(0, |ops| ops.len());
    }
    assert_eq!(
        documented,
        ROUTES.len(),
        "documented operations: {paths:#?}"
    );
    for (method, path) in ROUTES {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
        // And the router serves it: the answer is not the router's own "no route" or
        // method_not_allowed (a handler may say its message or call does not exist).
        let uri = path.replace("{id}", "ses_x");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let reply = h.send(request(method.clone(), &uri, None)).await;
        let kind = reply.json["error"]["type"].as_str().unwrap_or_default();
        let message = reply.json["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.starts_with("no route for") && kind != "method_not_allowed",
            "{method} {uri} is not routed: {}",
            reply.json
        );
    }
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    for schema in [
        "Session",
        "Message",
        "Part",
        "ToolState",
        "Event",
        "EventBody",
        "Admitted",
        "ErrorEnvelope",
        "Delta",
        "Synced",
    ] {
        assert!(schemas.contains_key(schema), "schema {schema} missing");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

/// The document the clients build on (`agenthost-api`'s `openapi.json`, from which the
/// TypeScript types are generated) is the one the server serves. After a change to the API:
/// `AGENTHOST_BLESS=1 cargo test -p agenthost-server openapi`, then regenerate the TypeScript
/// types (`npm run generate` in `clients/typescript`).
#[test]
fn the_clients_openapi_document_is_the_served_one() {
    let served = agenthost_server::openapi::json();
    if std::env::var_os("AGENTHOST_BLESS").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/openapi.json");
        std::fs::write(path, served).expect("write the golden document");
        return;
    }
    assert!(
        served == agenthost_api::OPENAPI,
        "crates/api/openapi.json differs from the document the server serves: run \
         AGENTHOST_BLESS=1 cargo test -p agenthost-server openapi, then npm run generate in \
         clients/typescript"
    );
}

// ---------------------------------------------------------------------------------------------
// The event stream.

#[derive(Debug, Clone)]
struct Frame {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// Reads SSE frames from a response body, with the clients' decoder.
struct Frames {
    body: axum::body::BodyDataStream,
    decoder: agenthost_http::sse::Decoder,
    pending: std::collections::VecDeque<agenthost_http::sse::Frame>,
}

impl Frames {
    async fn open(h: &Harness, uri: &str, last_event_id: Option<&str>) -> Frames {
        let mut builder = Request::get(uri);
        if let Some(id) = last_event_id {
            builder = builder.header("last-event-id", id);
        }
        let response = tokio::time::timeout(
            LIMIT,
            h.router
                .clone()
                .oneshot(builder.body(Body::empty()).expect("request")),
        )
        .await
        .expect("in time")
        .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/event-stream"
        );
        Frames {
            body: response.into_body().into_data_stream(),
            decoder: agenthost_http::sse::Decoder::new(),
            pending: Default::default(),
        }
    }

    async fn next(&mut self) -> Frame {
        loop {
            if let Some(raw) = self.pending.pop_front() {
                return Frame {
                    id: raw.id.map(|id| id.parse().expect("numeric id")),
                    event: raw.event,
                    data: serde_json::from_str(&raw.data).expect("JSON data"),
                };
            }
            let chunk = tokio::time::timeout(LIMIT, self.body.next())
                .await
                .expect("a frame in time")
                .expect("stream open")
                .expect("body chunk");
            let mut out = Vec::new();
            self.decoder.feed(&chunk, &mut out);
            self.pending.extend(out);
        }
    }

    /// Whether the body ends (after what is already decoded, which must be nothing more).
    async fn ended(&mut self) -> bool {
        loop {
            if !self.pending.is_empty() {
                return false;
            }
            match tokio::time::timeout(LIMIT, self.body.next()).await {
                Ok(None) => return true,
                Ok(Some(chunk)) => {
                    let mut out = Vec::new();
                    self.decoder.feed(&chunk.expect("body chunk"), &mut out);
                    self.pending.extend(out);
                }
                Err(_) => return false,
            }
        }
    }

    /// Durable frames up to and including the first of `kind`, checking the stream's rules.
    async fn until(&mut self, kind: &str) -> Vec<Frame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next().await;
            let done = frame.event == kind;
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }
}

/// The ids of durable frames: each frame's `id` equals its data's `seq` and its event name
/// equals its data's `type`.
fn seqs(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .filter(|f| f.id.is_some())
        .map(|f| {
            assert_eq!(f.id, f.data["seq"].as_u64(), "{f:?}");
            assert_eq!(f.event, f.data["type"], "{f:?}");
            f.id.unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn events_replay_sync_then_live_without_gaps_or_duplicates() {
    let h = harness(vec![text("one"), text("two")]).await;
    let s = h.session().await;
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "a"}"#),
    )
    .await;
    h.idle(&s).await;
    let last = h.get(&format!("/api/session/{s}")).await.json["data"]["last_seq"]
        .as_u64()
        .expect("last seq");

    // Replay from the start, then synced.
    let mut stream = Frames::open(&h, &format!("/api/session/{s}/events"), None).await;
    let replay = stream.until("synced").await;
    let synced = replay.last().expect("synced");
    // Then where the session stands.
    let status = stream.next().await;
    assert_eq!(
        (status.event.as_str(), status.data.clone()),
        ("status", json!({"type": "idle"}))
    );
    assert_eq!(synced.data, json!({"last_seq": last}));
    assert_eq!(synced.id, None);
    assert_eq!(seqs(&replay), (0..=last).collect::<Vec<_>>());
    assert_eq!(replay[0].event, "session_created");
    assert!(
        replay
            .iter()
            .any(|f| f.event == "text_ended" && f.data["text"] == "one")
    );

    // Live: a second turn arrives with deltas and status, durable seqs continuing.
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "b"}"#),
    )
    .await;
    let live = stream.until("execution_succeeded").await;
    let live_seqs = seqs(&live);
    assert_eq!(
        live_seqs,
        (last + 1..=last + live_seqs.len() as u64).collect::<Vec<_>>()
    );
    assert!(
        live.iter()
            .any(|f| f.event == "delta" && f.data["kind"] == "text" && f.data["delta"] == "two"),
        "{live:#?}"
    );
    assert!(
        live.iter()
            .any(|f| f.event == "status" && f.data["type"] == "running")
    );
    let end = live.last().expect("end").id.expect("durable");

    // Resume after a point with `after`, and with Last-Event-ID (which wins).
    let mut from = Frames::open(&h, &format!("/api/session/{s}/events?after={last}"), None).await;
    let resumed = from.until("synced").await;
    assert_eq!(seqs(&resumed), (last + 1..=end).collect::<Vec<_>>());
    let mut from = Frames::open(
        &h,
        &format!("/api/session/{s}/events?after=0"),
        Some(&(end - 1).to_string()),
    )
    .await;
    let resumed = from.until("synced").await;
    assert_eq!(seqs(&resumed), vec![end]);
    assert_eq!(
        resumed.last().expect("synced").data,
        json!({"last_seq": end})
    );
    let mut none = Frames::open(&h, &format!("/api/session/{s}/events?after={end}"), None).await;
    let nothing = none.until("synced").await;
    assert_eq!(nothing.len(), 1);
    assert_eq!(nothing[0].data, json!({"last_seq": end}));

    assert_error(
        &h.get("/api/session/ses_ghost/events").await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.get("/api/session/x/events").await,
        404,
        "session_not_found",
    );
    assert_error(
        &h.get(&format!("/api/session/{s}/events?after=x")).await,
        400,
        "invalid_request",
    );
    let bad_id = Request::get(format!("/api/session/{s}/events"))
        .header("last-event-id", "seven")
        .body(Body::empty())
        .expect("request");
    assert_error(&h.send(bad_id).await, 400, "invalid_request");
    // A resume point past the session's last event names events the session does not have (a
    // client of another store, or of a store restored from an older backup): refused, saying
    // where the log ends, instead of a stream that would silently skip the events up to it.
    let beyond = h
        .get(&format!("/api/session/{s}/events?after={}", end + 1))
        .await;
    assert_error(&beyond, 400, "invalid_request");
    let message = beyond.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&end.to_string()), "{message}");
    let beyond = Request::get(format!("/api/session/{s}/events"))
        .header("last-event-id", (end + 100).to_string())
        .body(Body::empty())
        .expect("request");
    assert_error(&h.send(beyond).await, 400, "invalid_request");
}

#[tokio::test]
async fn a_stream_opened_mid_turn_misses_nothing() {
    let gate = Gate::new();
    let h = harness(vec![
        Script::new()
            .text("before")
            .gate(&gate)
            .text(" after")
            .finish(FinishReason::Stop),
    ])
    .await;
    let s = h.session().await;
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "go"}"#),
    )
    .await;
    tokio::time::timeout(LIMIT, gate.reached())
        .await
        .expect("gate reached");
    let mut stream = Frames::open(&h, &format!("/api/session/{s}/events"), None).await;
    let replay = stream.until("synced").await;
    gate.release();
    let live = stream.until("execution_succeeded").await;
    let mut all = seqs(&replay);
    all.extend(seqs(&live));
    let last = all.last().copied().expect("events");
    assert_eq!(
        all,
        (0..=last).collect::<Vec<_>>(),
        "every seq exactly once"
    );
    assert!(
        live.iter()
            .any(|f| f.event == "text_ended" && f.data["text"] == "before after")
    );
}

/// A replay ends where the log stood when the stream subscribed; what commits later comes live,
/// with its deltas before the events that end their parts. (A replay that chased the log instead
/// withheld `synced` and every delta for as long as the session kept committing, then sent the
/// deltas after their own text.)
#[tokio::test]
async fn a_replay_ends_where_the_stream_subscribed_and_the_rest_comes_live() {
    let h = harness(vec![text("one"), text("two")]).await;
    let s = h.session().await;
    // A prompt larger than a replay reads at once, so the replay takes two reads.
    let large = "x".repeat(80 * 1024);
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(&json!({ "text": large }).to_string()),
    )
    .await;
    h.idle(&s).await;
    let horizon = h.get(&format!("/api/session/{s}")).await.json["data"]["last_seq"]
        .as_u64()
        .expect("last seq");

    let mut stream = Frames::open(&h, &format!("/api/session/{s}/events"), None).await;
    // The first read of the replay has happened; a turn commits before the second.
    assert_eq!(stream.next().await.event, "session_created");
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "b"}"#),
    )
    .await;
    h.idle(&s).await;

    let replay = stream.until("synced").await;
    assert_eq!(
        replay.last().expect("synced").data,
        json!({ "last_seq": horizon })
    );
    assert_eq!(
        seqs(&replay),
        (1..=horizon).collect::<Vec<_>>(),
        "the replay holds what committed before the stream subscribed"
    );
    let live = stream.until("execution_succeeded").await;
    let live_seqs = seqs(&live);
    assert_eq!(
        live_seqs,
        (horizon + 1..=horizon + live_seqs.len() as u64).collect::<Vec<_>>()
    );
    let delta = live
        .iter()
        .position(|f| f.event == "delta" && f.data["delta"] == "two");
    let ended = live
        .iter()
        .position(|f| f.event == "text_ended" && f.data["text"] == "two");
    assert!(
        matches!((delta, ended), (Some(d), Some(e)) if d < e),
        "the delta comes live, before its text ends: {live:#?}"
    );
}

/// Paced deltas (held while the interval runs, released together, or taken out by a durable
/// event behind them) keep their order, and none is lost or repeated. Deltas of one part held
/// together leave as one frame.
///
/// The pauses are long against the interval, so that a loaded machine's late timers do not
/// change which deltas are held together: "d" comes half an interval after the second one
/// began, so it is held by any lag under half an interval.
#[tokio::test]
async fn paced_deltas_keep_their_order_and_none_is_lost() {
    let h = harness_with(
        vec![
            // The yields make each delta a bus message of its own: deltas the stream has
            // ready together reach the bus joined.
            Script::new()
                .text("a")
                .yield_now()
                .text("b")
                .delay(Duration::from_millis(5))
                .text("c")
                .delay(Duration::from_millis(1_500))
                .text("d")
                .yield_now()
                .text("e")
                .finish(FinishReason::Stop),
        ],
        Options {
            delta_interval: Duration::from_millis(1_000),
            ..Options::default()
        },
        |_| {},
    )
    .await;
    let s = h.session().await;
    let mut stream = Frames::open(&h, &format!("/api/session/{s}/events"), None).await;
    stream.until("synced").await;
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "go"}"#),
    )
    .await;
    // Each frame with when it came, to tell deltas the interval held from those that left
    // early (half an interval is far beyond any lag of a loaded machine's timers).
    let mut live = Vec::new();
    let mut came = Vec::new();
    loop {
        let frame = stream.next().await;
        came.push(tokio::time::Instant::now());
        let done = frame.event == "execution_succeeded";
        live.push(frame);
        if done {
            break;
        }
    }
    let deltas: Vec<&str> = live
        .iter()
        .filter(|f| f.event == "delta")
        .map(|f| f.data["delta"].as_str().expect("text"))
        .collect();
    // "a" at once and alone; "b" and "c" held by the interval and sent together at its end,
    // or sent early: with "a" while the stream was still writing it out, or taken out by a
    // durable event behind them (the step's start published late, as on a loaded machine).
    // When the interval let them out, "d" comes while the next interval runs and is held with
    // "e", and the part's end sends both as one frame. When they left early, the interval has
    // run out by the time "d" comes: it goes at once and alone, and "e" after it.
    assert_eq!(deltas.concat(), "abcde", "{live:#?}");
    assert_eq!(deltas[0], "a", "{live:#?}");
    assert!(deltas.len() <= 4, "{live:#?}");
    let delta_with = |c: char| {
        live.iter()
            .position(|f| {
                f.event == "delta" && f.data["delta"].as_str().is_some_and(|d| d.contains(c))
            })
            .expect("the delta")
    };
    let early = came[delta_with('c')] - came[delta_with('a')] < Duration::from_millis(500);
    match deltas.as_slice() {
        [.., "de"] => {}
        [.., "d", "e"] if early => {}
        _ => panic!("d and e were held together but left apart: {live:#?}"),
    }
    let ended = live
        .iter()
        .position(|f| f.event == "text_ended")
        .expect("text_ended");
    assert_eq!(live[ended].data["text"], "abcde");
    let last_delta = live
        .iter()
        .rposition(|f| f.event == "delta")
        .expect("deltas");
    assert!(
        last_delta < ended,
        "a delta after its part ended: {live:#?}"
    );
    let seqs = seqs(&live);
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
}

#[tokio::test]
async fn a_stream_that_falls_behind_is_closed_with_a_final_frame_and_resumes_from_the_store() {
    // More deltas than a stream may fall behind by while the client reads nothing: the stream
    // ends with a final `error` frame saying so, and a reconnect with `Last-Event-ID` gets every
    // durable event it missed, once each.
    // Each delta on its own (a stream's ready deltas reach the bus joined).
    let mut script = Script::new();
    for _ in 0..20_000 {
        script = script.text("x").yield_now();
    }
    let h = harness(vec![script.finish(FinishReason::Stop), text("again")]).await;
    let s = h.session().await;
    let uri = format!("/api/session/{s}/events");
    let mut stream = Frames::open(&h, &uri, None).await;
    let mut frames = stream.until("synced").await;
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "go"}"#),
    )
    .await;
    h.idle(&s).await;
    let cut = stream.until("error").await;
    let last = cut.last().expect("the final frame");
    assert_eq!(last.data["type"], "unavailable", "{:?}", last.data);
    let message = last.data["message"].as_str().expect("a message");
    assert!(message.contains("Last-Event-ID"), "{message}");
    assert!(
        stream.ended().await,
        "the stream ends after its final frame"
    );
    frames.extend(cut.into_iter().filter(|f| f.event != "error"));
    let resume = seqs(&frames).last().copied().expect("events").to_string();
    let mut stream = Frames::open(&h, &uri, Some(&resume)).await;
    frames.extend(stream.until("execution_succeeded").await);
    h.post(
        &format!("/api/session/{s}/prompt"),
        Some(r#"{"text": "more"}"#),
    )
    .await;
    let second = stream.until("execution_succeeded").await;
    assert!(
        second
            .iter()
            .any(|f| f.event == "text_ended" && f.data["text"] == "again"),
        "{second:?}"
    );
    frames.extend(second);
    let all = seqs(&frames);
    let last = all.last().copied().expect("events");
    assert_eq!(
        all,
        (0..=last).collect::<Vec<_>>(),
        "every seq exactly once"
    );
    let text = frames
        .iter()
        .find(|f| f.event == "text_ended")
        .expect("the text part");
    assert_eq!(text.data["text"].as_str().map(str::len), Some(20_000));
    let metrics = h.get("/metrics").await;
    let metrics = metrics.json.as_str().expect("text");
    let lagged: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agenthost_sse_lagged_total "))
        .and_then(|v| v.parse().ok())
        .expect("the lag counter");
    assert!(lagged >= 1, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_routes_take_their_options_as_a_json_body_or_as_query_parameters() {
    let h = harness(vec![text("one"), text("two")]).await;
    let s = h.session().await;
    // Options in the body.
    let reply = h
        .post(
            &format!("/api/session/{s}/resume"),
            Some(r#"{"wait": true}"#),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"]["outcome"], "completed");
    // The body wins over the query.
    let reply = h
        .post(
            &format!("/api/session/{s}/resume?wait=false"),
            Some(r#"{"wait": true}"#),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    let reply = h
        .post(
            &format!("/api/session/{s}/wait"),
            Some(r#"{"timeout_ms": 5000}"#),
        )
        .await;
    assert_eq!(reply.json["data"]["idle"], true, "{}", reply.json);
    // An empty object and no body at all are both fine.
    for body in [Some("{}"), None] {
        let reply = h.post(&format!("/api/session/{s}/interrupt"), body).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    }
    // Unknown fields and malformed JSON are refused with a clear message.
    let reply = h
        .post(
            &format!("/api/session/{s}/resume"),
            Some(r#"{"wiat": true}"#),
        )
        .await;
    assert_error(&reply, 400, "invalid_request");
    assert!(
        reply.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("wiat")),
        "{}",
        reply.json
    );
    let reply = h
        .post(
            &format!("/api/session/{s}/wait"),
            Some(r#"{"timeout_ms": "#),
        )
        .await;
    assert_error(&reply, 400, "invalid_request");
    // Creating a session takes its options in the query too: a client-chosen id there names
    // the session, the body's id wins over it, and an unknown or malformed one is refused
    // without creating anything.
    let reply = h.post("/api/session?id=ses_from_query", None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"]["id"], "ses_from_query", "{}", reply.json);
    let reply = h
        .post(
            "/api/session?id=ses_query_loses&title=kept",
            Some(r#"{"id": "ses_body_wins"}"#),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    assert_eq!(reply.json["data"]["id"], "ses_body_wins", "{}", reply.json);
    assert_eq!(reply.json["data"]["title"], "kept", "{}", reply.json);
    let listed = h.get("/api/session?limit=100").await;
    let before = listed.json["data"]["sessions"].as_array().map(Vec::len);
    for uri in ["/api/session?idd=ses_typo", "/api/session?id=bad%20id"] {
        let reply = h.post(uri, None).await;
        assert_error(&reply, 400, "invalid_request");
    }
    let listed = h.get("/api/session?limit=100").await;
    assert_eq!(
        listed.json["data"]["sessions"].as_array().map(Vec::len),
        before,
        "{}",
        listed.json
    );
}

/// A JSON value that is not an object is refused where an object belongs, and changes nothing:
/// no session is created, no provider is called, nothing is admitted.
#[tokio::test]
async fn bodies_must_be_json_objects() {
    let h = harness(vec![text("never")]).await;
    let s = h.session().await;
    for (uri, body) in [
        ("/api/session".to_owned(), "[]"),
        ("/api/session".to_owned(), r#"["ses_array"]"#),
        ("/api/session".to_owned(), "null"),
        (format!("/api/session/{s}/generate"), r#"["text"]"#),
        (format!("/api/session/{s}/prompt"), r#"["hello"]"#),
        (format!("/api/session/{s}/prompt"), r#""hello""#),
        (format!("/api/session/{s}/resume"), "[true]"),
        (format!("/api/session/{s}/wait"), "[1000]"),
    ] {
        let reply = h.post(&uri, Some(body)).await;
        assert_error(&reply, 400, "invalid_request");
        assert!(
            reply.json["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("JSON object")),
            "{uri} {body}: {}",
            reply.json
        );
    }
    assert_eq!(h.provider.calls(), 0);
    let sessions = h.get("/api/session").await;
    assert_eq!(
        sessions.json["data"]["sessions"].as_array().map(Vec::len),
        Some(1),
        "{}",
        sessions.json
    );
    let inbox = h.get(&format!("/api/session/{s}/inbox")).await;
    assert_eq!(inbox.json["data"], serde_json::json!([]));
}

/// Storage faults, through the API: a full disk refuses prompts with 503 and a clear message
/// while reads go on and `/healthz` says `disk_full`, and prompts work again once there is space,
/// without a restart; a failed sync stops writes until a restart and `/healthz` answers 503.
#[tokio::test]
async fn storage_faults_answer_503_and_healthz_tells() {
    use agenthost_store::faults::{Fault, Faults};
    let faults = Arc::new(Faults::default());
    let armed = faults.clone();
    let h = harness_with(
        vec![text("one"), text("two")],
        Options::default(),
        move |c| c.store.faults = Some(armed),
    )
    .await;
    let s = h.session().await;
    let prompt = |text: &str| format!(r#"{{"text": "{text}", "resume": false}}"#);
    let uri = format!("/api/session/{s}/prompt");
    assert_eq!(
        h.post(&uri, Some(&prompt("first"))).await.status,
        StatusCode::OK
    );

    // The store's own text names its file: only the log may hold it.
    let path = h._dir.path().to_str().expect("utf-8 path").to_owned();
    let secrets = [path.as_str(), "store.redb"];
    faults.fail_writes(Fault::NoSpace);
    let refused = h.post(&uri, Some(&prompt("refused"))).await;
    assert_error(&refused, 503, "unavailable");
    assert!(
        refused.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("is full")),
        "{}",
        refused.json
    );
    assert_clean(&refused, &secrets);
    let health = h.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json["status"], "disk_full", "{}", health.json);
    assert_clean(&health, &secrets);
    let inbox = h.get(&format!("/api/session/{s}/inbox")).await;
    assert_eq!(inbox.status, StatusCode::OK, "reads go on: {}", inbox.json);
    assert_eq!(inbox.json["data"].as_array().map(Vec::len), Some(1));
    let metrics = h.get("/metrics").await;
    let text = metrics.json.as_str().expect("plain text");
    assert!(text.contains("agenthost_store_health 1"), "{text}");

    faults.clear();
    assert_eq!(
        h.post(&uri, Some(&prompt("second"))).await.status,
        StatusCode::OK
    );
    assert_eq!(h.get("/healthz").await.json["status"], "ok");

    faults.fail_syncs(Fault::Io);
    assert_error(
        &h.post(&uri, Some(&prompt("lost"))).await,
        503,
        "unavailable",
    );
    faults.clear();
    let stopped = h.post(&uri, Some(&prompt("after"))).await;
    assert_error(&stopped, 503, "unavailable");
    assert_clean(&stopped, &secrets);
    assert!(
        stopped.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("restart")),
        "{}",
        stopped.json
    );
    let health = h.get("/healthz").await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health.json["status"], "store_failed", "{}", health.json);
    assert_clean(&health, &secrets);
    assert!(
        health.json["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty())
    );
}

/// A turn whose failure cannot be recorded (the disk filled while it ran) is not stranded: its
/// claim is retried with backoff, and once writes work again the session recovers the turn by
/// itself, without a restart. Until then the session is not idle.
#[tokio::test]
async fn a_turn_the_disk_cut_is_recovered_once_writes_work_again() {
    use agenthost_store::faults::{Fault, Faults};
    let faults = Arc::new(Faults::default());
    let armed = faults.clone();
    let gate = Gate::new();
    let h = harness_with(
        vec![
            Script::new()
                .gate(&gate)
                .text("lost to the full disk")
                .finish(FinishReason::Stop),
            text("recovered"),
        ],
        Options::default(),
        move |c| c.store.faults = Some(armed),
    )
    .await;
    let s = h.session().await;
    let reply = h
        .post(
            &format!("/api/session/{s}/prompt"),
            Some(r#"{"text": "go"}"#),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    tokio::time::timeout(LIMIT, gate.reached())
        .await
        .expect("gate reached");
    // The step's first write (the claim, the promotion, its start) is on its way while the
    // provider answers: let it land before the disk fills.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while h.get(&format!("/api/session/{s}")).await.json["data"]["claimed"] != true {
        assert!(tokio::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    faults.fail_writes(Fault::NoSpace);
    gate.release();
    let wait = h
        .post(&format!("/api/session/{s}/wait?timeout_ms=300"), None)
        .await;
    assert_eq!(
        wait.json["data"]["idle"], false,
        "stranded work is not idle"
    );
    faults.clear();
    let wait = h
        .post(&format!("/api/session/{s}/wait?timeout_ms=20000"), None)
        .await;
    assert_eq!(wait.json["data"]["idle"], true, "{}", wait.json);
    let session = h.get(&format!("/api/session/{s}")).await;
    assert_eq!(session.json["data"]["claimed"], false, "{}", session.json);
    let messages = h.get(&format!("/api/session/{s}/messages")).await;
    let last = messages.json["data"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .expect("a message");
    assert_eq!(last["finish"], "stop", "{}", messages.json);
    assert_eq!(last["content"][0]["text"], "recovered", "{}", messages.json);
}

/// A page of the inbox ends once its prompts pass 4 MiB: a deep inbox of large prompts is read a
/// page at a time, never whole.
#[tokio::test]
async fn an_inbox_of_large_prompts_is_read_in_bounded_pages() {
    let h = harness(vec![]).await;
    let s = h.session().await;
    let text = "x".repeat(1000 * 1000);
    for _ in 0..6 {
        let body = json!({"text": text, "resume": false}).to_string();
        let reply = h
            .post(&format!("/api/session/{s}/prompt"), Some(&body))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
    }
    let first = h.get(&format!("/api/session/{s}/inbox")).await;
    let items = first.json["data"].as_array().expect("items").clone();
    assert_eq!(items.len(), 5, "the page ends once past 4 MiB");
    let last = items[4]["admitted_seq"].as_u64().expect("seq");
    let rest = h
        .get(&format!("/api/session/{s}/inbox?after_seq={last}"))
        .await;
    assert_eq!(rest.json["data"].as_array().map(Vec::len), Some(1));
}

/// A JSON value of any shape, biased towards the fields the routes know.
fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[ -~]{0,16}".prop_map(Value::from),
        Just(Value::from("ses_fuzz")),
        Just(Value::from("msg_fuzz")),
        Just(Value::from("steer")),
        Just(Value::from("queue")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        let key = prop_oneof![
            Just("text".to_owned()),
            Just("id".to_owned()),
            Just("delivery".to_owned()),
            Just("resume".to_owned()),
            Just("files".to_owned()),
            Just("prompt".to_owned()),
            Just("agent".to_owned()),
            Just("model".to_owned()),
            Just("title".to_owned()),
            Just("wait".to_owned()),
            Just("timeout_ms".to_owned()),
            Just("url".to_owned()),
            Just("mime".to_owned()),
            "[a-z]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// What a refused request must not change: the sessions (their durable position) and one
/// session's inbox.
async fn state(h: &Harness, s: &str) -> (Vec<Value>, Value) {
    let sessions = h.get("/api/session?limit=1000").await.json;
    let durable = sessions["data"]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|row| json!([row["id"], row["last_seq"], row["pending"]]))
        .collect();
    let inbox = h.get(&format!("/api/session/{s}/inbox")).await.json;
    (durable, inbox)
}

/// Every POST route with generated bodies, valid and not: only documented statuses, never a
/// 500, and a request refused changes nothing.
#[test]
fn generated_bodies_get_documented_answers_and_refusals_change_nothing() {
    use proptest::test_runner::{Config, TestRunner};
    let cases = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        5_000
    } else {
        200
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (h, s) = rt.block_on(async {
        // No lost-wake sweep: it would promote the inputs admitted with `resume: false` in the
        // background, between the two reads of the state.
        let h = harness_with(vec![], Options::default(), |c| {
            c.limits.wake_sweep = std::time::Duration::ZERO;
        })
        .await;
        let s = h.session().await;
        (h, s)
    });
    let routes = [
        "/api/session".to_owned(),
        format!("/api/session/{s}/prompt"),
        format!("/api/session/{s}/generate"),
        // `resume` starts a drain in the background, which changes the session by itself.
        format!("/api/session/{s}/wait"),
        format!("/api/session/{s}/interrupt"),
        format!("/api/session/{s}/compact"),
    ];
    let mut runner = TestRunner::new(Config::with_cases(cases));
    runner
        .run(&(0..routes.len(), json_value()), |(route, body)| {
            rt.block_on(async {
                let before = state(&h, &s).await;
                let text = body.to_string();
                // `resume` would answer after a provider call the harness has no script for.
                let uri = &routes[route];
                let mut text = text;
                if let Value::Object(map) = &body
                    && uri.ends_with("/prompt")
                    && map.get("resume") != Some(&Value::Bool(false))
                {
                    let mut map = map.clone();
                    map.insert("resume".into(), Value::Bool(false));
                    text = Value::Object(map).to_string();
                }
                let reply = h.post(uri, Some(&text)).await;
                let code = reply.status.as_u16();
                proptest::prop_assert!(
                    [200, 400, 404, 409, 413, 422, 502, 503].contains(&code),
                    "{uri} {text}: {code} {}",
                    reply.json
                );
                if code != 200 {
                    proptest::prop_assert!(reply.json["error"]["type"].is_string());
                    let after = state(&h, &s).await;
                    proptest::prop_assert_eq!(
                        &before,
                        &after,
                        "{} {} changed the state",
                        uri,
                        text
                    );
                }
                Ok(())
            })
        })
        .expect("every generated request answered as documented");
}

/// Event streams are capped per session and in all: one more gets 503, and a stream that ends
/// gives its place back.
#[tokio::test]
async fn event_streams_are_capped_per_session_and_in_all() {
    let options = Options {
        max_streams: 3,
        max_streams_per_session: 2,
        ..Options::default()
    };
    let h = harness_with(vec![], options, |_| {}).await;
    let (a, b, c) = (h.session().await, h.session().await, h.session().await);
    let events = |s: &str| format!("/api/session/{s}/events");
    let mut first = Frames::open(&h, &events(&a), None).await;
    first.until("synced").await;
    let second = Frames::open(&h, &events(&a), None).await;
    let refused = h.get(&events(&a)).await;
    assert_error(&refused, 503, "unavailable");
    assert!(
        refused.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&a)),
        "{}",
        refused.json
    );
    let third = Frames::open(&h, &events(&b), None).await;
    assert_error(&h.get(&events(&c)).await, 503, "unavailable");
    drop(second);
    let again = Frames::open(&h, &events(&c), None).await;
    drop((first, third, again));
}

/// `/metrics` and `/healthz` can be put behind the token too; every refusal is 401 and no
/// message echoes what was presented.
#[tokio::test]
async fn metrics_and_health_can_require_the_token() {
    for (protect_metrics, protect_healthz) in [(true, false), (false, true), (true, true)] {
        let options = Options {
            token: Token::new("s3cret"),
            protect_metrics,
            protect_healthz,
            ..Options::default()
        };
        let h = harness_with(vec![], options, |_| {}).await;
        for (path, protected) in [("/metrics", protect_metrics), ("/healthz", protect_healthz)] {
            let open = h.get(path).await;
            match protected {
                true => assert_error(&open, 401, "unauthorized"),
                false => assert_eq!(open.status, StatusCode::OK, "{path}"),
            }
            let wrong = h
                .send(
                    Request::get(path)
                        .header(header::AUTHORIZATION, "Bearer guess-XYZ")
                        .body(Body::empty())
                        .expect("request"),
                )
                .await;
            if protected {
                assert_error(&wrong, 401, "unauthorized");
                assert!(
                    !wrong.json.to_string().contains("guess-XYZ"),
                    "{}",
                    wrong.json
                );
            }
            let right = h
                .send(
                    Request::get(path)
                        .header(header::AUTHORIZATION, "Bearer s3cret")
                        .body(Body::empty())
                        .expect("request"),
                )
                .await;
            assert_eq!(right.status, StatusCode::OK, "{path}");
        }
    }
}

/// The console is served from the binary with an ETag a browser revalidates against, without a
/// token, and an unknown file is a 404 in our error shape.
#[tokio::test]
async fn the_console_is_served_with_an_etag_and_no_cache() {
    let h = harness(vec![]).await;
    let page = h.get("/console").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.headers[header::CONTENT_TYPE]
            .to_str()
            .is_ok_and(|t| t.starts_with("text/html"))
    );
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-cache");
    let etag = page.headers[header::ETAG].clone();
    let mut again = request(Method::GET, "/console", None);
    again
        .headers_mut()
        .insert(header::IF_NONE_MATCH, etag.clone());
    let again = h.send(again).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert_eq!(again.headers[header::ETAG], etag);
    for (file, kind) in [("app.js", "text/javascript"), ("style.css", "text/css")] {
        let reply = h.get(&format!("/console/{file}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{file}");
        assert!(
            reply.headers[header::CONTENT_TYPE]
                .to_str()
                .is_ok_and(|t| t.starts_with(kind))
        );
    }
    let missing = h.get("/console/secrets.txt").await;
    assert_error(&missing, 404, "not_found");
}
