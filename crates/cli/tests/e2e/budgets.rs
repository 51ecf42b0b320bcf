//! Budgets through the binary and its HTTP API, against the scripted OpenAI-wire model (which
//! reports 15 tokens a call): a tool loop stops before the call its budget cannot pay, the
//! session is blocked with its input, a SIGKILL loses no spend, and a raise lets it finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::wire::{Answer, Tool, Wire};
use super::*;

/// What the scripted model reports for every call.
const PER_CALL: u64 = 15;

async fn session_info(http: &Http, s: &str) -> Value {
    http.get(&format!("/api/session/{s}")).await["data"].clone()
}

async fn idle(http: &Http, s: &str) {
    let idle = http
        .post(&format!("/api/session/{s}/wait?timeout_ms=15000"), None)
        .await;
    assert_eq!(idle["data"]["idle"], true, "{idle}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_loop_stops_at_its_budget_keeps_its_spend_through_a_sigkill_and_goes_on_when_raised()
{
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    // The model calls `look` until the test lets it answer.
    let answer = Arc::new(AtomicBool::new(false));
    let answers = answer.clone();
    let wire = Wire::start(
        Arc::new(move |_| match answers.load(Ordering::SeqCst) {
            true => Answer::Text("found it".into()),
            false => Answer::Tool {
                name: "look".into(),
                arguments: json!({}),
            },
        }),
        &[("look", Tool::Quick)],
    )
    .await;
    let cfg = wire.config(d, &[("look", true)], "");
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    let limit = 600;
    text = text.replace(
        "[models.default]\nprovider = \"wire\"\nmodel = \"scripted\"\n",
        "[models.default]\nprovider = \"wire\"\nmodel = \"scripted\"\nmax_output = 20\n",
    );
    text = text.replace(
        "[agents.default]\nmodel = \"default\"\n",
        &format!(
            "[agents.default]\nmodel = \"default\"\nsteps = 100\nbudget = {{ max_tokens = {limit} }}\n"
        ),
    );
    assert!(text.contains("budget = "), "{text}");
    std::fs::write(&cfg, text).expect("config written");
    let mut server = serve_config(d, "serve", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "look around"})),
    )
    .await;
    idle(&http, &s).await;
    let info = session_info(&http, &s).await;
    let calls = wire.requests().len() as u64;
    assert!(calls >= 2, "the loop ran: {calls} calls");
    assert_eq!(info["status"]["type"], "blocked", "{info}");
    assert_eq!(info["budget"]["blocked"], "max_tokens", "{info}");
    assert_eq!(info["budget"]["limits"]["max_tokens"], limit, "{info}");
    assert_eq!(info["budget"]["spent_tokens"], calls * PER_CALL, "{info}");
    assert!(
        calls * PER_CALL <= limit,
        "never over budget: {calls} calls"
    );
    assert_eq!(info["claimed"], true);
    let events = http.get(&format!("/api/session/{s}/messages")).await;
    assert!(events["data"].is_array());

    // Input meanwhile waits, and nothing is called for it.
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "and then?", "delivery": "queue"})),
    )
    .await;
    idle(&http, &s).await;
    assert_eq!(wire.requests().len() as u64, calls);
    assert_eq!(session_info(&http, &s).await["pending"], 1);

    // A bad budget changes nothing.
    let (status, refused) = http
        .call(
            reqwest::Method::PATCH,
            &format!("/api/session/{s}"),
            Some(json!({"budget": {"max_cost_usd": -1.0}})),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    let (status, refused) = http
        .call(
            reqwest::Method::PATCH,
            &format!("/api/session/{s}"),
            Some(json!({"budget": {"max_tokens": "many"}})),
        )
        .await;
    assert_eq!(status, 400, "{refused}");

    // SIGKILL: the spend is what the provider reported, no more and no less, and the session
    // is still blocked after the restart (its recovery makes no call).
    server.sigkill();
    let server = serve_config(d, "serve-again", &cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    let info = session_info(&http, &s).await;
    assert_eq!(
        wire.requests().len() as u64,
        calls,
        "no call after the restart"
    );
    assert_eq!(info["budget"]["spent_tokens"], calls * PER_CALL, "{info}");
    assert_eq!(info["status"]["type"], "blocked", "{info}");
    assert_eq!(info["resume_attempts"], 0, "{info}");

    // `generate` over what is left is refused with 402.
    let (status, refused) = http
        .call(
            reqwest::Method::POST,
            &format!("/api/session/{s}/generate"),
            Some(json!({"prompt": "recap"})),
        )
        .await;
    assert_eq!(status, 402, "{refused}");
    assert_eq!(refused["error"]["type"], "budget_exhausted", "{refused}");

    // Raised: the loop goes on where it stopped, answers, then the queued input runs.
    answer.store(true, Ordering::SeqCst);
    let (status, raised) = http
        .call(
            reqwest::Method::PATCH,
            &format!("/api/session/{s}"),
            Some(json!({"budget": {"max_tokens": 100_000}})),
        )
        .await;
    assert_eq!(status, 200, "{raised}");
    assert_eq!(raised["data"]["budget"]["own"]["max_tokens"], 100_000);
    idle(&http, &s).await;
    let info = session_info(&http, &s).await;
    let total = wire.requests().len() as u64;
    assert_eq!(total, calls + 2, "the owed call, then the queued input");
    assert_eq!(info["status"]["type"], "idle", "{info}");
    assert_eq!(info["claimed"], false, "{info}");
    assert_eq!(info["pending"], 0, "{info}");
    assert!(info["budget"]["blocked"].is_null(), "{info}");
    assert_eq!(info["budget"]["spent_tokens"], total * PER_CALL, "{info}");
    let metrics = http.text("/metrics").await;
    assert!(
        metrics.contains("agenthost_spend_tokens_total{agent=\"default\",model=\"scripted\"} 30"),
        "this process spent two calls: {metrics}"
    );
}
