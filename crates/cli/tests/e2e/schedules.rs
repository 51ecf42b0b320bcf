//! Schedules through the binary and its HTTP API: a one-shot fires once and is answered; bad
//! requests get a status naming the field and change nothing; a restart between setting and
//! firing fires it once after start; a SIGKILL around the firing admits it once; a cron schedule
//! shows its next minute and stops when cancelled (its ticks, with `AGENTHOST_SOAK`).

use super::wire::{Wire, calls_tools_named_in_the_prompt, last_user};
use super::*;

async fn schedule(http: &Http, s: &str, body: Value) -> (u16, Value) {
    http.call(
        reqwest::Method::POST,
        &format!("/api/session/{s}/schedules"),
        Some(body),
    )
    .await
}

/// The user messages of the session, with their ids.
async fn user_messages(http: &Http, s: &str) -> Vec<(String, String)> {
    let messages = http.get(&format!("/api/session/{s}/messages")).await;
    messages["data"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "user")
        .map(|m| {
            (
                m["id"].as_str().expect("id").to_owned(),
                m["text"].as_str().expect("text").to_owned(),
            )
        })
        .collect()
}

/// Waits (bounded) until the model was asked `text`.
async fn asked(wire: &Wire, text: &str) {
    let text = text.to_owned();
    wire.until("the firing's turn", move |requests, _| {
        requests.iter().any(|r| last_user(r) == text)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_schedule_fires_once_and_bad_ones_change_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
    let cfg = wire.config(d, &[], "schedules_per_session = 3");
    let server = serve_config(d, "serve", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let last_seq = http.get(&format!("/api/session/{s}")).await["data"]["last_seq"].clone();
    for (body, field) in [
        (json!({"text": "x", "cron": "* * * *"}), "cron:"),
        (
            json!({"text": "x", "cron": "* * * * *", "tz": "Nowhere/Else"}),
            "tz:",
        ),
        (json!({"text": "x", "at": "tomorrow"}), "at"),
        (json!({"text": "x", "at": "2001-01-01T00:00:00Z"}), "at"),
        (
            json!({"text": "x", "after_ms": 5, "cron": "* * * * *"}),
            "exactly one",
        ),
        (json!({"text": "x"}), "exactly one"),
        (json!({"text": "x", "after_ms": 5, "tz": "UTC"}), "tz"),
        (json!({"text": "x", "after_ms": 5, "id": "nope"}), "id"),
        (
            json!({"text": "x", "after_ms": 5, "every": 3}),
            "unknown field",
        ),
    ] {
        let (status, error) = schedule(&http, &s, body.clone()).await;
        assert_eq!(status, 400, "{body}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["last_seq"], last_seq, "nothing was written");

    let (status, set) = schedule(
        &http,
        &s,
        json!({"id": "sch_wake", "text": "wake up", "after_ms": 300}),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["data"]["id"], "sch_wake");
    assert!(
        set["data"]["next_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let (status, conflict) = schedule(
        &http,
        &s,
        json!({"id": "sch_wake", "text": "something else", "after_ms": 300}),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["type"], "schedule_conflict");

    asked(&wire, "wake up").await;
    let idle = http
        .post(&format!("/api/session/{s}/wait?timeout_ms=15000"), None)
        .await;
    assert_eq!(idle["data"]["idle"], true);
    let users = user_messages(&http, &s).await;
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(users[0].0.starts_with("msg_wake-"), "{users:?}");
    let listed = http.get(&format!("/api/session/{s}/schedules")).await;
    assert_eq!(listed["data"], json!([]));

    // A cron schedule shows its next minute; cancelling is idempotent.
    let (status, cron) = schedule(
        &http,
        &s,
        json!({"id": "sch_tick", "text": "tick", "cron": "* * * * *", "catch_up": "skip"}),
    )
    .await;
    assert_eq!(status, 200, "{cron}");
    assert_eq!(cron["data"]["next"].as_u64().map(|n| n % 60_000), Some(0));
    for cancelled in [true, false] {
        let reply = http
            .call(
                reqwest::Method::DELETE,
                &format!("/api/session/{s}/schedules/sch_tick"),
                None,
            )
            .await;
        assert_eq!(reply.0, 200, "{reply:?}");
        assert_eq!(reply.1["data"]["cancelled"], cancelled);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_setting_and_firing_fires_once_after_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
    let cfg = wire.config(d, &[], "");
    let mut server = serve_config(d, "serve-1", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let (status, _) = schedule(
        &http,
        &s,
        json!({"text": "while you were away", "after_ms": 1000}),
    )
    .await;
    assert_eq!(status, 200);
    server.signal("-TERM");
    assert_eq!(server.wait_exit().code(), Some(0), "{}", server.log_text());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(wire.requests().is_empty());

    let server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    asked(&wire, "while you were away").await;
    let idle = http
        .post(&format!("/api/session/{s}/wait?timeout_ms=15000"), None)
        .await;
    assert_eq!(idle["data"]["idle"], true);
    assert_eq!(user_messages(&http, &s).await.len(), 1);
    assert_eq!(wire.requests().len(), 1);
}

/// SIGKILL a few milliseconds before, at and after the firing: after a restart the firing's
/// input exists exactly once, and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_around_the_firing_admits_it_once() {
    for offset in [-20i64, 0, 20] {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
        let cfg = wire.config(d, &[], "");
        let mut server = serve_config(d, "serve-1", &cfg);
        let http = Http::new(&server.cached_url());
        let s = http.session("default").await;
        let (status, set) =
            schedule(&http, &s, json!({"text": "fire once", "after_ms": 500})).await;
        assert_eq!(status, 200, "{set}");
        let next = set["data"]["next"].as_u64().expect("next");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        let wait = (next as i64 - now + offset).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        server.sigkill();

        let server = serve_config(d, "serve-2", &cfg);
        let http = Http::new(&server.cached_url());
        asked(&wire, "fire once").await;
        let idle = http
            .post(&format!("/api/session/{s}/wait?timeout_ms=15000"), None)
            .await;
        assert_eq!(idle["data"]["idle"], true);
        let users = user_messages(&http, &s).await;
        assert_eq!(users.len(), 1, "offset {offset}: {users:?}");
        assert!(
            http.get(&format!("/api/session/{s}/schedules")).await["data"]
                .as_array()
                .is_some_and(Vec::is_empty)
        );
    }
}

/// A firing missed while no process ran (later than `schedule_grace_ms`, here 200 ms) is
/// admitted once with `catch_up: "once"`, and not at all with `"skip"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_missed_during_downtime_is_caught_up_once_or_skipped() {
    for (catch_up, admitted) in [("once", 1), ("skip", 0)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
        let cfg = wire.config(d, &[], "schedule_grace_ms = 200");
        let mut server = serve_config(d, "serve-1", &cfg);
        let http = Http::new(&server.cached_url());
        let s = http.session("default").await;
        let (status, set) = schedule(
            &http,
            &s,
            json!({"text": "missed", "after_ms": 300, "catch_up": catch_up}),
        )
        .await;
        assert_eq!(status, 200, "{set}");
        server.sigkill();
        // Down well past the firing and its grace.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let server = serve_config(d, "serve-2", &cfg);
        let http = Http::new(&server.cached_url());
        let deadline = Instant::now() + LIMIT;
        loop {
            let listed = http.get(&format!("/api/session/{s}/schedules")).await;
            if listed["data"].as_array().is_some_and(Vec::is_empty) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{catch_up}: never fired: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let idle = http
            .post(&format!("/api/session/{s}/wait?timeout_ms=15000"), None)
            .await;
        assert_eq!(idle["data"]["idle"], true);
        assert_eq!(user_messages(&http, &s).await.len(), admitted, "{catch_up}");
        assert_eq!(wire.requests().len(), admitted, "{catch_up}");
    }
}

/// A cron schedule fires on each minute and stops when cancelled. Takes two minutes: only with
/// `AGENTHOST_SOAK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_schedule_fires_on_each_tick_until_cancelled() {
    if std::env::var_os("AGENTHOST_SOAK").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
    let cfg = wire.config(d, &[], "");
    let server = serve_config(d, "serve", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let (status, _) = schedule(
        &http,
        &s,
        json!({"id": "sch_tick", "text": "tick", "cron": "* * * * *", "delivery": "queue"}),
    )
    .await;
    assert_eq!(status, 200);
    let ticks = |n: usize| {
        move |requests: &[Value], _: &[(String, String)]| {
            requests.iter().filter(|r| last_user(r) == "tick").count() >= n
        }
    };
    let wait = async {
        loop {
            if ticks(2)(&wire.requests(), &[]) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(150), wait)
        .await
        .expect("two ticks");
    http.call(
        reqwest::Method::DELETE,
        &format!("/api/session/{s}/schedules/sch_tick"),
        None,
    )
    .await;
    let before = wire.requests().len();
    tokio::time::sleep(Duration::from_secs(65)).await;
    assert_eq!(wire.requests().len(), before, "no tick after the cancel");
}
