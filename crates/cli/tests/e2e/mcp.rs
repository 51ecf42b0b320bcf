//! MCP tool servers through the binary: `[mcp.NAME]` sections, `GET /api/mcp`, and the crash
//! rule across a SIGKILL of agenthost while a call runs (a trusted server's read-only tool runs
//! again with the same key; an untrusted server's, or an unannotated tool, is reported as "may
//! or may not have taken effect"), a server that dies mid-call, and a call past its deadline.
//! The model is the scripted one of `wire`; the server is the fixture on the official Python
//! SDK. Needs the fixtures (`.ci/mcp-fixtures`).

use std::sync::Arc;

use super::wire::{Answer, Wire, last_user, shown, tools_answered};
use super::*;

fn fixtures() -> Option<agenthost_mcp::testing::Fixtures> {
    agenthost_mcp::testing::fixtures("the MCP end-to-end tests")
}

/// A model that, asked `call <tool> <json>`, calls `<tool>` with those arguments once, and
/// otherwise answers with the text it was asked.
fn calls_what_it_is_told() -> super::wire::Script {
    Arc::new(|request| {
        let asked = last_user(request);
        match asked.strip_prefix("call ").and_then(|r| r.split_once(' ')) {
            Some((tool, args)) if !tools_answered(request) => Answer::Tool {
                name: tool.to_owned(),
                arguments: serde_json::from_str(args).expect("JSON arguments"),
            },
            _ => Answer::Text(format!("answered: {asked}")),
        }
    })
}

/// `wire`'s config plus the fixture as `[mcp.files]`.
fn config(
    wire: &Wire,
    dir: &Path,
    f: &agenthost_mcp::testing::Fixtures,
    trusted: bool,
    timeout_ms: u64,
) -> PathBuf {
    let path = wire.config(dir, &[], "");
    let mut text = std::fs::read_to_string(&path).expect("config");
    text.push_str(&format!(
        "[mcp.files]\ncommand = [{python:?}, {server:?}, \"stdio\"]\n\
         env = {{ FIXTURE_JOURNAL = {journal:?} }}\ntrusted = {trusted}\n\
         call_timeout_ms = {timeout_ms}\n",
        python = f.python.display().to_string(),
        server = f.server.display().to_string(),
        journal = dir.join("journal").display().to_string(),
    ));
    std::fs::write(&path, text).expect("config written");
    path
}

fn journal(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("journal"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn ready(http: &Http) -> Value {
    let deadline = Instant::now() + LIMIT;
    loop {
        let servers = http.get("/api/mcp").await;
        if servers["data"][0]["status"] == "ready" {
            return servers;
        }
        assert!(Instant::now() < deadline, "not ready: {servers}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn idle(http: &Http, session: &str) {
    let idle = http
        .post(
            &format!("/api/session/{session}/wait?timeout_ms=15000"),
            None,
        )
        .await;
    assert_eq!(idle["data"]["idle"], true, "{idle}");
}

/// What the model was shown as the latest tool result, in its last request.
fn result_shown(wire: &Wire) -> String {
    let requests = wire.requests();
    shown(requests.last().expect("a request"))
        .into_iter()
        .rev()
        .find(|m| m.starts_with("tool: "))
        .unwrap_or_default()
}

/// Starts a call of `tool` and SIGKILLs agenthost while it runs; returns the restarted server,
/// after the session's recovery.
async fn killed_during(
    d: &Path,
    wire: &Wire,
    cfg: &Path,
    tool: &str,
    args: &str,
) -> (Proc, String, String) {
    let mut server = serve_config(d, "serve-1", cfg);
    let http = Http::new(&server.cached_url());
    ready(&http).await;
    let s = http.session("default").await;
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({ "text": format!("call {tool} {args}") })),
    )
    .await;
    let deadline = Instant::now() + LIMIT;
    while journal(d).is_empty() {
        assert!(Instant::now() < deadline, "the call never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = journal(d)[0].clone();
    server.sigkill();
    let server = serve_config(d, "serve-2", cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    let _ = wire;
    (server, s, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_read_only_call_a_sigkill_cut_runs_again_with_the_same_key() {
    let Some(f) = fixtures() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_what_it_is_told(), &[]).await;
    let cfg = config(&wire, d, &f, true, 60_000);
    let (server, _, key) = killed_during(d, &wire, &cfg, "files_slow", r#"{"ms": 2000}"#).await;
    assert_eq!(
        journal(d),
        [key.clone(), key],
        "run again, with the same key"
    );
    assert_eq!(result_shown(&wire), "tool: slept 2000");
    let http = Http::new(&server.cached_url());
    let servers = ready(&http).await;
    let slow = servers["data"][0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "files_slow")
        .cloned()
        .expect("files_slow listed");
    assert_eq!(slow["read_only"], true, "{slow}");
    assert_eq!(slow["reruns"], true, "{slow}");
    assert_eq!(servers["data"][0]["transport"], "stdio");

    // An interrupt during a call cancels it on the server.
    let s = http.session("default").await;
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "call files_slow {\"ms\": 30000}"})),
    )
    .await;
    let deadline = Instant::now() + LIMIT;
    while journal(d).len() < 3 {
        assert!(Instant::now() < deadline, "the call never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let interrupted = http
        .post(&format!("/api/session/{s}/interrupt"), None)
        .await;
    assert_eq!(interrupted["data"]["interrupted"], true, "{interrupted}");
    let deadline = Instant::now() + LIMIT;
    loop {
        let servers = http.get("/api/mcp").await;
        let cancelled = servers["data"][0]["stderr"]
            .as_array()
            .is_some_and(|lines| {
                lines
                    .iter()
                    .any(|l| l.as_str().is_some_and(|l| l.contains("slow cancelled")))
            });
        if cancelled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not cancelled on the server: {servers}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_or_unannotated_call_a_sigkill_cut_is_not_run_again() {
    let Some(f) = fixtures() else { return };
    for (trusted, tool, args) in [
        (false, "files_slow", r#"{"ms": 2000}"#),
        (true, "files_slow_mail", r#"{"to": "ann", "ms": 2000}"#),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let wire = Wire::start(calls_what_it_is_told(), &[]).await;
        let cfg = config(&wire, d, &f, trusted, 60_000);
        let (_server, _, _) = killed_during(d, &wire, &cfg, tool, args).await;
        assert_eq!(journal(d).len(), 1, "{tool} ran again: {:?}", journal(d));
        let shown = result_shown(&wire);
        assert!(
            shown.contains("may or may not have taken effect"),
            "{shown}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_and_a_call_past_its_deadline_read_as_errors() {
    let Some(f) = fixtures() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_what_it_is_told(), &[]).await;
    let cfg = config(&wire, d, &f, true, 700);
    let server = serve_config(d, "serve", &cfg);
    let http = Http::new(&server.cached_url());
    ready(&http).await;
    let s = http.session("default").await;
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "call files_crash {}"})),
    )
    .await;
    idle(&http, &s).await;
    let shown = result_shown(&wire);
    assert!(shown.contains("MCP server stopped"), "{shown}");
    let servers = ready(&http).await;
    assert!(
        servers["data"][0]["restarts"].as_u64() >= Some(1),
        "{servers}"
    );
    assert!(
        servers["data"][0]["stderr"]
            .as_array()
            .is_some_and(|lines| lines.iter().any(|l| l
                .as_str()
                .is_some_and(|l| l.contains("exiting with status 3")))),
        "{servers}"
    );

    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "call files_slow {\"ms\": 30000}"})),
    )
    .await;
    idle(&http, &s).await;
    let shown = result_shown(&wire);
    assert!(shown.contains("timed out"), "{shown}");
    let metrics = http.get("/metrics").await;
    let metrics = metrics.as_str().expect("the metrics text");
    assert!(
        metrics.contains("agenthost_mcp_calls_total{server=\"files\",outcome=\"timeout\"} 1"),
        "{metrics}"
    );
}
