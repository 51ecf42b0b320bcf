//! The core's laws at the edges a user meets through the binary: a deferred input waits for a
//! resume, a queued follow-up waits for a tool exchange a restart cut, and a tool a graceful
//! stop cut reads to the model as after a crash, and sessions beyond the live bound wait in line
//! and survive a crash. The model is the scripted one of `wire`, which
//! keeps every request across the restarts.

use super::wire::{Tool, Wire, calls_tools_named_in_the_prompt, last_user, shown};
use super::*;

/// Waits until the session is idle, with whatever recovery it owed done.
async fn idle(http: &Http, session: &str) {
    let idle = http
        .post(
            &format!("/api/session/{session}/wait?timeout_ms=15000"),
            None,
        )
        .await;
    assert_eq!(idle["data"]["idle"], true, "{idle}");
}

/// `resume: false` admits only: neither the lost-wake sweep nor a restart's boot sweep runs the
/// input; an explicit resume does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_input_waits_for_a_resume_across_sweeps_and_restarts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
    // The lost-wake sweep every 50 ms: a deferred input it took for a lost wake would run at once.
    let cfg = wire.config(d, &[], "wake_sweep_ms = 50");
    let mut server = serve_config(d, "serve-1", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let admitted = http
        .post(
            &format!("/api/session/{s}/prompt"),
            Some(json!({"text": "later", "resume": false})),
        )
        .await;
    assert_eq!(admitted["data"]["admitted_seq"], 1, "{admitted}");
    // Twenty sweeps.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(wire.requests().is_empty(), "{:#?}", wire.requests());
    assert_eq!(
        http.get(&format!("/api/session/{s}")).await["data"]["pending"],
        1
    );

    server.signal("-TERM");
    assert_eq!(server.wait_exit().code(), Some(0), "{}", server.log_text());
    let server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(wire.requests().is_empty(), "{:#?}", wire.requests());
    assert_eq!(
        http.get(&format!("/api/session/{s}")).await["data"]["pending"],
        1
    );

    let resumed = http
        .post(&format!("/api/session/{s}/resume?wait=true"), None)
        .await;
    assert_eq!(resumed["data"], json!({"outcome": "completed", "steps": 1}));
    let requests = wire.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(last_user(&requests[0]), "later");
}

/// A server (`serve-1`, with `limits` in its `[limits]`) whose one session is held in a
/// `lookup` tool that hangs the first time it runs.
struct Held {
    wire: Wire,
    cfg: std::path::PathBuf,
    server: Proc,
    http: Http,
    session: String,
}

async fn held_in_a_tool(d: &std::path::Path, limits: &str) -> Held {
    let wire = Wire::start(
        calls_tools_named_in_the_prompt(&["lookup"]),
        &[("lookup", Tool::HangsOnce)],
    )
    .await;
    let cfg = wire.config(d, &[("lookup", true)], limits);
    let server = serve_config(d, "serve-1", &cfg);
    let http = Http::new(&server.cached_url());
    let session = http.session("default").await;
    http.post(
        &format!("/api/session/{session}/prompt"),
        Some(json!({"text": "use lookup"})),
    )
    .await;
    wire.until("the tool call", |_, calls| !calls.is_empty())
        .await;
    Held {
        wire,
        cfg,
        server,
        http,
        session,
    }
}

/// A queued follow-up waits until the session would otherwise go idle, recovery or not: after a
/// SIGKILL while a tool ran, the first call answers the cut tool exchange without it, and the
/// follow-up starts its own exchange after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_follow_up_waits_for_a_tool_exchange_a_crash_cut() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let Held {
        wire,
        cfg,
        mut server,
        http,
        session: s,
    } = held_in_a_tool(d, "").await;
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "follow-up", "delivery": "queue"})),
    )
    .await;
    let before = wire.requests().len();
    server.sigkill();

    let server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    let requests = wire.requests();
    let after = &requests[before..];
    assert!(after.len() >= 2, "{after:#?}");
    let first = shown(&after[0]);
    assert!(
        !first.iter().any(|m| m.contains("follow-up")),
        "the queued input jumped into the recovered exchange: {first:#?}"
    );
    assert!(
        first.iter().any(|m| m.starts_with("tool: ")),
        "the first call after the restart answers the tool: {first:#?}"
    );
    assert_eq!(last_user(&after[1]), "follow-up", "{after:#?}");
    // The idempotent tool ran again with the same key.
    let calls = wire.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], calls[1]);
    let row = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(row["data"]["pending"], 0, "{row}");
}

/// A graceful stop knows no more than a crash about a tool it cut: a non-idempotent one is
/// reported to the model as "may or may not have taken effect" and not run again, and an
/// idempotent one runs again with the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_a_graceful_stop_cut_reads_as_after_a_crash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(
        calls_tools_named_in_the_prompt(&["mail", "fetch"]),
        &[("mail", Tool::HangsOnce), ("fetch", Tool::HangsOnce)],
    )
    .await;
    let cfg = wire.config(d, &[("mail", false), ("fetch", true)], "");
    let mut server = serve_config(d, "serve-1", &cfg);
    let http = Http::new(&server.cached_url());
    let mut sessions = Vec::new();
    for (n, text) in ["use mail", "use fetch"].into_iter().enumerate() {
        let s = http.session("default").await;
        http.post(
            &format!("/api/session/{s}/prompt"),
            Some(json!({ "text": text })),
        )
        .await;
        wire.until("the tool call", |_, calls| calls.len() > n)
            .await;
        sessions.push(s);
    }
    server.signal("-TERM");
    assert_eq!(server.wait_exit().code(), Some(0), "{}", server.log_text());

    let server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    for s in &sessions {
        idle(&http, s).await;
    }
    let calls = wire.calls();
    let mails: Vec<_> = calls.iter().filter(|(n, _)| n == "mail").collect();
    let fetches: Vec<_> = calls.iter().filter(|(n, _)| n == "fetch").collect();
    assert_eq!(
        mails.len(),
        1,
        "the non-idempotent tool ran again: {calls:?}"
    );
    assert_eq!(fetches.len(), 2, "the idempotent tool ran once: {calls:?}");
    assert_eq!(fetches[0], fetches[1], "same idempotency key");
    let requests = wire.requests();
    let answered = |tool: &str| {
        requests
            .iter()
            .filter(|r| last_user(r) == format!("use {tool}"))
            .filter_map(|r| shown(r).into_iter().find(|m| m.starts_with("tool: ")))
            .collect::<Vec<_>>()
    };
    let mail = answered("mail");
    assert_eq!(mail.len(), 1, "{requests:#?}");
    assert!(
        mail[0].contains("may or may not have taken effect"),
        "{mail:?}"
    );
    assert_eq!(answered("fetch"), ["tool: done"], "{requests:#?}");
}

/// `limits.live_sessions` bounds live session actors: with one place, held by a session whose
/// tool hangs, prompts to other sessions are admitted at once and wait in line (as the metrics
/// show); a SIGKILL then loses none of them, and after the restart every input is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_beyond_the_live_bound_wait_in_line_and_survive_a_crash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let Held {
        wire,
        cfg,
        mut server,
        http,
        session: holder,
    } = held_in_a_tool(d, "live_sessions = 1").await;
    let mut waiting = Vec::new();
    for n in 0..3 {
        let s = http.session("default").await;
        let admitted = http
            .post(
                &format!("/api/session/{s}/prompt"),
                Some(json!({ "text": format!("question {n}") })),
            )
            .await;
        assert_eq!(admitted["data"]["admitted_seq"], 1, "{admitted}");
        waiting.push(s);
    }
    let metrics = http.text("/metrics").await;
    assert!(
        metrics.contains("agenthost_sessions_waiting_place 3\n"),
        "{metrics}"
    );
    assert!(metrics.contains("agenthost_sessions_live 1\n"), "{metrics}");
    // A caller that waits for a waiting session is told it is not idle yet.
    let wait = http
        .post(
            &format!("/api/session/{}/wait?timeout_ms=100", waiting[0]),
            None,
        )
        .await;
    assert_eq!(wait["data"]["idle"], false, "{wait}");
    assert_eq!(wire.requests().len(), 1, "{:#?}", wire.requests());
    server.sigkill();

    let server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    for s in waiting.iter().chain([&holder]) {
        idle(&http, s).await;
        let row = http.get(&format!("/api/session/{s}")).await;
        assert_eq!(row["data"]["pending"], 0, "{row}");
    }
    let requests = wire.requests();
    for n in 0..3 {
        let asked = format!("question {n}");
        let answered = requests.iter().filter(|r| last_user(r) == asked).count();
        assert_eq!(answered, 1, "{asked}: {requests:#?}");
    }
    let metrics = http.text("/metrics").await;
    assert!(
        metrics.contains("agenthost_sessions_waiting_place 0\n"),
        "{metrics}"
    );
    assert!(metrics.contains("agenthost_sessions_live 1\n"), "{metrics}");
}
