//! Human approval of tool calls through the binary and its HTTP API: ask, decide, run exactly
//! once; every refusal a clear status that changes nothing; and the approval and the call's
//! exactly-once across a SIGKILL in every state, expiry included. The model is the scripted one
//! of `wire`, which keeps every request across the restarts.

use super::wire::{Tool, Wire, calls_tools_named_in_the_prompt, shown};
use super::*;

/// `wire`'s config with the default agent asking before `pay` (idempotent as given), its
/// approvals expiring after `ttl_ms`.
fn config(wire: &Wire, dir: &Path, idempotent: bool, ttl_ms: u64) -> PathBuf {
    let path = wire.config(dir, &[("pay", idempotent)], "");
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text.replace(
        "[agents.default]\nmodel = \"default\"\n",
        &format!(
            "[agents.default]\nmodel = \"default\"\nask = [\"pay\"]\napproval_ttl_ms = {ttl_ms}\n"
        ),
    );
    assert!(text.contains("ask = [\"pay\"]"), "{text}");
    std::fs::write(&path, text).expect("config written");
    path
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

/// Prompts `use pay` and waits until the call waits for its approval; returns the approval.
async fn asked(http: &Http, s: &str) -> Value {
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "use pay"})),
    )
    .await;
    idle(http, s).await;
    let pending = http.get(&format!("/api/session/{s}/approvals")).await;
    let list = pending["data"].as_array().expect("a list");
    assert_eq!(list.len(), 1, "{pending}");
    list[0].clone()
}

fn decision_path(s: &str, approval: &Value) -> String {
    format!(
        "/api/session/{s}/approvals/{}/{}",
        approval["message_id"].as_str().expect("message id"),
        approval["call_id"].as_str().expect("call id")
    )
}

/// What the model was shown as the result of the `pay` call, in its last request.
fn result_shown(wire: &Wire) -> String {
    let requests = wire.requests();
    let last = requests.last().expect("a request");
    shown(last)
        .into_iter()
        .find(|m| m.starts_with("tool: "))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_asked_decided_once_and_the_call_runs_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&["pay"]), &[]).await;
    let cfg = config(&wire, d, false, 86_400_000);
    let server = serve_config(d, "serve", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let approval = asked(&http, &s).await;
    assert_eq!(approval["name"], "pay");
    assert_eq!(approval["input"]["about"], "use pay");
    assert!(
        approval["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:"))
    );
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["status"]["type"], "waiting", "{session}");
    assert_eq!(session["data"]["claimed"], true, "{session}");
    assert!(wire.calls().is_empty());
    let path = decision_path(&s, &approval);
    let last_seq = session["data"]["last_seq"].clone();

    // Refusals that change nothing.
    let (status, wrong) = http
        .call(
            reqwest::Method::POST,
            &path,
            Some(json!({"decision": "approve", "digest": "sha256:00"})),
        )
        .await;
    assert_eq!(status, 409, "{wrong}");
    assert_eq!(wrong["error"]["type"], "digest_mismatch", "{wrong}");
    let other = path.replace("/call_pay", "/call_nope");
    let (status, missing) = http
        .call(
            reqwest::Method::POST,
            &other,
            Some(json!({"decision": "approve", "digest": approval["digest"]})),
        )
        .await;
    assert_eq!(status, 404, "{missing}");
    let (status, long) = http
        .call(
            reqwest::Method::POST,
            &path,
            Some(json!({"decision": "deny", "digest": approval["digest"], "by": "x".repeat(300)})),
        )
        .await;
    assert_eq!(status, 400, "{long}");
    let (status, unknown) = http
        .call(
            reqwest::Method::POST,
            &path,
            Some(json!({"decision": "maybe", "digest": approval["digest"]})),
        )
        .await;
    assert_eq!(status, 400, "{unknown}");
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["last_seq"], last_seq, "nothing was written");

    let decided = http
        .post(
            &path,
            Some(json!({"decision": "approve", "digest": approval["digest"], "by": "ann"})),
        )
        .await;
    assert_eq!(decided["data"]["decision"], "approved", "{decided}");
    assert_eq!(decided["data"]["by"], "ann", "{decided}");
    idle(&http, &s).await;
    assert_eq!(wire.calls().len(), 1, "{:?}", wire.calls());
    assert_eq!(result_shown(&wire), "tool: done");
    let (status, again) = http
        .call(
            reqwest::Method::POST,
            &path,
            Some(json!({"decision": "deny", "digest": approval["digest"], "by": "bob"})),
        )
        .await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["error"]["type"], "approval_decided", "{again}");
    assert_eq!(
        again["error"]["decision"]["decision"], "approved",
        "{again}"
    );
    assert_eq!(again["error"]["decision"]["by"], "ann", "{again}");
    assert_eq!(wire.calls().len(), 1);
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["status"]["type"], "idle", "{session}");
    assert!(
        http.get(&format!("/api/session/{s}/approvals")).await["data"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_reaches_the_model_and_an_interrupt_withdraws_an_approval() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&["pay"]), &[]).await;
    let cfg = config(&wire, d, false, 86_400_000);
    let server = serve_config(d, "serve", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let approval = asked(&http, &s).await;
    http.post(
        &decision_path(&s, &approval),
        Some(json!({"decision": "deny", "digest": approval["digest"], "by": "bob", "reason": "not today"})),
    )
    .await;
    idle(&http, &s).await;
    assert!(wire.calls().is_empty());
    let denial = result_shown(&wire);
    assert!(denial.contains("denied by bob: not today"), "{denial}");

    let t = http.session("default").await;
    let approval = asked(&http, &t).await;
    let interrupted = http
        .post(&format!("/api/session/{t}/interrupt"), None)
        .await;
    assert_eq!(interrupted["data"]["interrupted"], true, "{interrupted}");
    let session = http.get(&format!("/api/session/{t}")).await;
    assert_eq!(session["data"]["claimed"], false, "{session}");
    assert_eq!(session["data"]["status"]["type"], "idle", "{session}");
    let (status, late) = http
        .call(
            reqwest::Method::POST,
            &decision_path(&t, &approval),
            Some(json!({"decision": "approve", "digest": approval["digest"]})),
        )
        .await;
    assert_eq!(status, 409, "{late}");
    assert_eq!(late["error"]["decision"]["decision"], "cancelled", "{late}");
    assert!(wire.calls().is_empty());
}

/// SIGKILL while the approval waits, then after it was approved while the approved call runs:
/// the approval survives, the call starts once, and a call a crash cut follows the crash rule
/// ("may or may not have taken effect" unless idempotent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_and_its_call_survive_sigkills_in_every_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(
        calls_tools_named_in_the_prompt(&["pay"]),
        &[("pay", Tool::HangsOnce)],
    )
    .await;
    let cfg = config(&wire, d, false, 86_400_000);
    let mut server = serve_config(d, "serve-1", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    let approval = asked(&http, &s).await;
    server.sigkill();

    let mut server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["status"]["type"], "waiting", "{session}");
    let pending = http.get(&format!("/api/session/{s}/approvals")).await;
    assert_eq!(pending["data"][0], approval, "the same approval, intact");
    let requests = wire.requests().len();
    http.post(
        &decision_path(&s, &approval),
        Some(json!({"decision": "approve", "digest": approval["digest"], "by": "ann"})),
    )
    .await;
    // The approved call starts and hangs: kill the process while it runs.
    wire.until("the approved call", |_, calls| !calls.is_empty())
        .await;
    server.sigkill();

    let server = serve_config(d, "serve-3", &cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    assert_eq!(wire.calls().len(), 1, "not run again: {:?}", wire.calls());
    assert_eq!(wire.requests().len(), requests + 1);
    let shown = result_shown(&wire);
    assert!(
        shown.contains("may or may not have taken effect"),
        "{shown}"
    );
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["claimed"], false, "{session}");
}

/// An approval that expires while no process runs is settled as expired at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_expires_across_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&["pay"]), &[]).await;
    let cfg = config(&wire, d, false, 1_000);
    let mut server = serve_config(d, "serve-1", &cfg);
    let http = Http::new(&server.cached_url());
    let s = http.session("default").await;
    asked(&http, &s).await;
    server.sigkill();
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let server = serve_config(d, "serve-2", &cfg);
    let http = Http::new(&server.cached_url());
    idle(&http, &s).await;
    assert!(wire.calls().is_empty());
    let shown = result_shown(&wire);
    assert!(shown.contains("expired"), "{shown}");
    let session = http.get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["status"]["type"], "idle", "{session}");
    assert_eq!(session["data"]["claimed"], false, "{session}");
}

/// Named tokens from a tokens file: a reader sees the approval but cannot decide it, a writer
/// decides it and the decision records the writer's name; the file is read again when it
/// changes (a token removed stops working, a broken file changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_token_decides_as_itself_and_the_tokens_file_is_reloaded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(calls_tools_named_in_the_prompt(&["pay"]), &[]).await;
    let cfg = config(&wire, d, false, 86_400_000);
    let tokens = d.join("tokens.toml");
    let file = |entries: &[(&str, &str, &str)]| {
        let text: String = entries
            .iter()
            .map(|(name, role, token)| {
                format!("[tokens.{name}]\nrole = \"{role}\"\ntoken = \"{token}\"\n")
            })
            .collect();
        std::fs::write(&tokens, text).expect("tokens written");
    };
    file(&[
        ("viewer", "read", "reader-token-0123456789"),
        ("alice", "write", "writer-token-0123456789"),
    ]);
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    text.push_str(&format!(
        "[server]\ntokens_file = \"{}\"\n",
        tokens.display()
    ));
    std::fs::write(&cfg, text).expect("config written");
    let server = serve_config(d, "serve", &cfg);
    let as_token = |token: &str| {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("a header"),
        );
        Http {
            base: server.cached_url(),
            client: agenthost_llm::client_builder()
                .expect("a client builder")
                .timeout(LIMIT)
                .default_headers(headers)
                .build()
                .expect("client"),
        }
    };
    let (reader, writer) = (
        as_token("reader-token-0123456789"),
        as_token("writer-token-0123456789"),
    );
    let anonymous = Http::new(&server.cached_url());
    assert_eq!(
        anonymous
            .call(reqwest::Method::GET, "/api/session", None)
            .await
            .0,
        401
    );
    let (status, refused) = reader
        .call(reqwest::Method::POST, "/api/session", None)
        .await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["error"]["type"], "forbidden", "{refused}");
    let s = writer.session("default").await;
    let approval = asked(&writer, &s).await;
    let seen = reader.get(&format!("/api/session/{s}/approvals")).await;
    assert_eq!(seen["data"][0]["call_id"], approval["call_id"], "{seen}");
    let path = decision_path(&s, &approval);
    let decide = json!({"decision": "approve", "digest": approval["digest"]});
    let (status, refused) = reader
        .call(reqwest::Method::POST, &path, Some(decide.clone()))
        .await;
    assert_eq!(status, 403, "{refused}");
    let decided = writer.post(&path, Some(decide)).await;
    assert_eq!(decided["data"]["by"], "alice", "{decided}");
    idle(&writer, &s).await;
    assert_eq!(wire.calls().len(), 1, "the approved call ran once");

    // A broken file changes nothing; a valid one replaces the tokens.
    std::fs::write(&tokens, "[tokens.viewer]\nrole = \"boss\"\ntoken = \"x\"\n").expect("written");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        reader.get("/api/session").await["data"]["sessions"][0]["id"],
        s
    );
    file(&[("viewer", "read", "reader-token-0123456789")]);
    let deadline = Instant::now() + LIMIT;
    loop {
        let (status, _) = writer
            .call(reqwest::Method::GET, "/api/session", None)
            .await;
        if status == 401 {
            break;
        }
        assert!(Instant::now() < deadline, "the removed token still works");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        reader
            .call(reqwest::Method::GET, "/api/session", None)
            .await
            .0,
        200
    );
    assert!(
        server.log_text().contains("cannot be used"),
        "the broken file is reported: {}",
        server.log_text()
    );
}

/// The policy as configuration states it: a tool's own `permission`, and an agent's rules in
/// the file's order, the last matching one deciding (`*` asks, `read_*` runs, `rm` is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_rules_ask_allow_and_deny_in_the_files_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let wire = Wire::start(
        calls_tools_named_in_the_prompt(&["read_x", "rm", "pay"]),
        &[],
    )
    .await;
    let path = wire.config(d, &[("read_x", true), ("rm", false), ("pay", false)], "");
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text
        .replace(
            "[agents.default]\nmodel = \"default\"\n",
            "[agents.default]\nmodel = \"default\"\n\
             permission = { \"*\" = \"ask\", \"read_*\" = \"allow\", \"rm\" = \"deny\" }\n\
             [agents.plain]\nmodel = \"default\"\n",
        )
        .replace(
            "name = \"pay\"\nkind = \"http\"\n",
            "name = \"pay\"\nkind = \"http\"\npermission = \"ask\"\n",
        );
    std::fs::write(&path, &text).expect("config written");
    assert!(text.contains("permission = \"ask\""), "{text}");
    let server = serve_config(d, "serve", &path);
    let http = Http::new(&server.cached_url());
    let pending = |s: &str| format!("/api/session/{s}/approvals");

    let s = http.session("default").await;
    for (prompt, ran) in [("use read_x", 1), ("use rm", 1)] {
        http.post(
            &format!("/api/session/{s}/prompt"),
            Some(json!({"text": prompt})),
        )
        .await;
        idle(&http, &s).await;
        assert_eq!(wire.calls().len(), ran, "{prompt}: {:?}", wire.calls());
        assert!(
            http.get(&pending(&s)).await["data"]
                .as_array()
                .is_some_and(Vec::is_empty),
            "{prompt} asks nobody"
        );
    }
    let requests = wire.requests();
    let refused = shown(requests.last().expect("a request"))
        .into_iter()
        .rfind(|m| m.starts_with("tool: "))
        .unwrap_or_default();
    assert!(
        refused.contains("the policy of agent \"default\" denies it"),
        "{refused}"
    );
    let approval = asked(&http, &s).await;
    assert_eq!(approval["name"], "pay", "`*` asks: {approval}");

    // Another agent without rules: `pay` asks by its own permission.
    let t = http.session("plain").await;
    let approval = asked(&http, &t).await;
    assert_eq!(approval["name"], "pay", "{approval}");
    assert_eq!(wire.calls().len(), 1, "only read_x ran: {:?}", wire.calls());
}
