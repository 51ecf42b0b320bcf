//! Several `agenthost serve` nodes over one PostgreSQL database: sessions spread over the
//! nodes, any node answers for any session (forwarding, event streams with `Last-Event-ID`
//! included), and a node killed mid-turn has its sessions resumed by the others, each input
//! answered once and no non-idempotent tool run twice.
//!
//! Needs `AGENTHOST_PG_URL` (`.ci/with-postgres` starts a throwaway server); without it they say
//! so in one line and return, unless `AGENTHOST_REQUIRE_SERVICES` is set (as in CI).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;

/// The PostgreSQL server's URL; `None` (each test then returns, and one line says so) without one,
/// unless CI requires it (`AGENTHOST_REQUIRE_SERVICES`).
fn pg_url() -> Option<String> {
    agenthost_store::testing::postgres_url("the cluster tests")
}

/// The partition of a session: FNV-1a over its id (the cluster's documented hash).
fn partition(session: &str, partitions: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in session.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(partitions)) as u32
}

const PARTITIONS: u32 = 12;
const TTL_MS: u64 = 1500;
/// The nodes' shared secret: they sign what they forward with it.
const CLUSTER_SECRET: &str = "the e2e cluster's shared secret";

/// An HTTP tool that counts its calls by idempotency key, answering after a pause so that a
/// kill can land while a call runs.
async fn counting_tool() -> (String, Arc<Mutex<BTreeMap<String, u32>>>) {
    use axum::http::HeaderMap;
    let calls: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/tool",
        axum::routing::post(move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                *seen.lock().expect("lock").entry(key).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    json!({"result": "found"}).to_string(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("tool binds");
    let url = format!("http://{}/tool", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

fn node_config(dir: &Path, node: usize, schema: &str, provider: &str, tool: &str) -> PathBuf {
    let path = dir.join(format!("node{node}.toml"));
    let text = format!(
        r#"
data_dir = "{data}"
[store]
kind = "postgres"
schema = "{schema}"
[cluster]
node_id = "n{node}"
partitions = {PARTITIONS}
lease_ttl_ms = {TTL_MS}
[providers.mock]
kind = "openai"
base_url = "{provider}"
[models.default]
provider = "mock"
model = "mock-1"
[agents.default]
model = "default"
steps = 4
[[tools]]
name = "lookup"
kind = "http"
url = "{tool}"
timeout_ms = 5000
idempotent = false
"#,
        data = dir.join(format!("data{node}")).display()
    );
    std::fs::write(&path, text).expect("config written");
    path
}

/// `count` nodes `n0`, `n1`, … over the schema, their URLs read.
fn start_nodes(count: usize, dir: &Path, schema: &str, provider: &str, tool: &str) -> Vec<Proc> {
    let url = pg_url().expect("invariant: tests check pg_url first");
    (0..count)
        .map(|n| {
            let cfg = node_config(dir, n, schema, provider, tool);
            let args = [
                "serve",
                "--config",
                cfg.to_str().expect("utf-8"),
                "--bind",
                "127.0.0.1:0",
            ];
            let mut proc = Proc::spawn_with_env(
                &format!("node{n}"),
                dir,
                &args,
                &[
                    ("AGENTHOST_PG_URL", &url),
                    ("AGENTHOST_CLUSTER_SECRET", CLUSTER_SECRET),
                ],
            );
            proc.url_cached();
            proc
        })
        .collect()
}

/// Sends until the answer is not a `503` (ownership moving), within `limit`.
async fn call_through(
    http: &Http,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    limit: Duration,
) -> (u16, Value) {
    let deadline = Instant::now() + limit;
    loop {
        let (status, json) = http.call(method.clone(), path, body.clone()).await;
        if status != 503 || Instant::now() > deadline {
            return (status, json);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prompts every session once, the i-th through node `(i + shift) % nodes`, and counts the
/// acknowledged input.
async fn prompt_all(http: &[Http], sessions: &mut [(String, usize)], shift: usize, text: &str) {
    for (i, (s, acked)) in sessions.iter_mut().enumerate() {
        let via = &http[(i + shift) % http.len()];
        let (status, reply) = call_through(
            via,
            reqwest::Method::POST,
            &format!("/api/session/{s}/prompt"),
            Some(json!({ "text": text })),
            LIMIT,
        )
        .await;
        assert_eq!(status, 200, "{reply}");
        *acked += 1;
    }
}

/// Waits (through `via`, retrying `503`s) until session `s` is idle.
async fn idle(via: &Http, s: &str) {
    let (status, idle) = call_through(
        via,
        reqwest::Method::POST,
        &format!("/api/session/{s}/wait?timeout_ms=15000"),
        None,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(status, 200, "{s}: {idle}");
    assert_eq!(idle["data"]["idle"], true, "{s}: {idle}");
}

/// The nodes and the partitions each holds, as `node` sees them.
async fn holdings(http: &Http) -> BTreeMap<String, Vec<u32>> {
    let cluster = http.get("/api/cluster").await;
    cluster["data"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["alive"] == true)
        .map(|n| {
            let parts = n["partitions"]
                .as_array()
                .expect("partitions")
                .iter()
                .map(|p| p.as_u64().expect("partition") as u32)
                .collect();
            (n["id"].as_str().expect("id").to_owned(), parts)
        })
        .collect()
}

async fn until_holdings(http: &Http, what: &str, ok: impl Fn(&BTreeMap<String, Vec<u32>>) -> bool) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let held = holdings(http).await;
        if ok(&held) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_sessions_forward_requests_and_survive_a_sigkill() {
    if pg_url().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let schema = format!("e2e{}", std::process::id());
    let mock = tool_mock(d, "cluster-mock", "80", "0.5");
    let (tool, calls) = counting_tool().await;
    let mut nodes = start_nodes(3, d, &schema, &mock.url(), &tool);
    let http: Vec<Http> = nodes.iter().map(|n| Http::new(&n.cached_url())).collect();
    until_holdings(&http[0], "the partitions spread over three nodes", |held| {
        held.len() == 3
            && held.values().all(|p| !p.is_empty())
            && held.values().map(Vec::len).sum::<usize>() == PARTITIONS as usize
    })
    .await;
    let held = holdings(&http[0]).await;
    let owner_of = |session: &str| {
        let p = partition(session, PARTITIONS);
        held.iter()
            .find(|(_, parts)| parts.contains(&p))
            .map(|(node, _)| node.clone())
            .expect("an owner")
    };

    // Sessions created on each node are that node's; each is then driven through another one.
    let mut sessions: Vec<(String, usize)> = Vec::new();
    for (n, node) in http.iter().enumerate() {
        for _ in 0..3 {
            let s = node.session("default").await;
            assert_eq!(
                owner_of(&s),
                format!("n{n}"),
                "created where the request arrived"
            );
            sessions.push((s, 0));
        }
    }
    // A create naming an id another node owns is forwarded there.
    let named = (0..)
        .map(|i| format!("ses_01J{:023}", i))
        .find(|s| owner_of(s) == "n1")
        .expect("an id");
    let created = http[0]
        .post(
            "/api/session",
            Some(json!({"id": named, "agent": "default"})),
        )
        .await;
    assert_eq!(created["data"]["id"], named.as_str());
    sessions.push((named, 0));

    // An event stream through a node that does not own the session, resumed through a third
    // with Last-Event-ID: no gap, no duplicate.
    let watched = sessions[3].0.clone();
    let mut stream = http[0].events(&watched).await;
    stream.until("synced").await;
    prompt_all(&http, &mut sessions, 1, "look it up, then answer").await;
    // An admission retried through another node gets the original receipt.
    let (retried, _) = &sessions[0];
    let body = json!({"text": "once only", "id": "msg_retried_across_nodes"});
    let path = format!("/api/session/{retried}/prompt");
    let (_, first_receipt) = call_through(
        &http[1],
        reqwest::Method::POST,
        &path,
        Some(body.clone()),
        LIMIT,
    )
    .await;
    let (_, again) = call_through(&http[2], reqwest::Method::POST, &path, Some(body), LIMIT).await;
    assert_eq!(
        first_receipt["data"]["admitted_seq"], again["data"]["admitted_seq"],
        "{first_receipt} {again}"
    );
    assert!(
        first_receipt["data"]["admitted_seq"].is_u64(),
        "{first_receipt}"
    );
    sessions[0].1 += 1;
    let first = stream.until("execution_succeeded").await;
    let last_id = first
        .iter()
        .filter_map(|f| f.id)
        .max()
        .expect("durable frames");
    drop(stream);
    let mut resumed = http[2].events_after(&watched, last_id).await;
    let next = resumed.next().await;
    if let Some(id) = next.id {
        assert_eq!(
            id,
            last_id + 1,
            "resumed right after the last frame: {next:?}"
        );
    }
    drop(resumed);

    // A second prompt each, then kill n1 while turns (and tool calls) run.
    prompt_all(&http, &mut sessions, 0, "and once more").await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    nodes[1].sigkill();
    let killed = Instant::now();

    // Every session finishes on the survivors, each input answered once.
    let survivors = [&http[0], &http[2]];
    let mut resumed = 0;
    for (i, (s, acked)) in sessions.iter().enumerate() {
        let via = survivors[i % 2];
        idle(via, s).await;
        let row = via.get(&format!("/api/session/{s}")).await["data"].clone();
        assert_eq!(row["pending"], 0, "{s}: {row}");
        assert_eq!(row["claimed"], false, "{s}: {row}");
        let messages = via
            .get(&format!("/api/session/{s}/messages?limit=1000"))
            .await["data"]
            .as_array()
            .expect("messages")
            .clone();
        let users = messages.iter().filter(|m| m["type"] == "user").count();
        assert_eq!(
            users, *acked,
            "{s}: every acknowledged input became a message"
        );
        resumed += messages
            .iter()
            .filter(|m| m["type"] == "system" && m.to_string().contains("server restarted"))
            .count();
        let last = messages.last().expect("messages");
        assert!(
            (last["type"] == "assistant" && last["finish"].is_string())
                || row["halted"].is_string(),
            "{s} ends with an unanswered input: {last}"
        );
    }
    let failover = killed.elapsed();
    eprintln!(
        "failover: every session idle {failover:?} after the kill; {resumed} resumed mid-turn"
    );
    assert!(
        resumed > 0,
        "the kill landed on no turn: the test proved nothing"
    );
    assert!(
        failover < Duration::from_millis(TTL_MS) + Duration::from_secs(20),
        "failover took {failover:?}"
    );
    for (key, n) in calls.lock().expect("lock").iter() {
        assert_eq!(*n, 1, "the non-idempotent tool call {key} ran {n} times");
    }
    until_holdings(&http[0], "the survivors hold every partition", |held| {
        held.len() == 2 && held.values().map(Vec::len).sum::<usize>() == PARTITIONS as usize
    })
    .await;
}

/// A counter's value in a `/metrics` page.
async fn metric(http: &Http, name: &str) -> f64 {
    let page = http
        .client
        .get(format!("{}/metrics", http.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// A node paused (SIGSTOP) past its lease TTL loses its partitions to the other; its sessions
/// finish there; resumed (SIGCONT), every write it still attempts for them is refused, nothing
/// runs twice, and it rejoins with a share of the partitions. `AGENTHOST_SOAK=1` runs 10 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_is_fenced_after_a_takeover() {
    if pg_url().is_none() {
        return;
    }
    let rounds = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        10
    } else {
        1
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let schema = format!("fence{}", std::process::id());
    let mock = tool_mock(d, "fence-mock", "60", "0.5");
    let (tool, calls) = counting_tool().await;
    let nodes = start_nodes(2, d, &schema, &mock.url(), &tool);
    let http: Vec<Http> = nodes.iter().map(|n| Http::new(&n.cached_url())).collect();
    let mut sessions: Vec<(String, usize)> = Vec::new();
    let mut fenced = 0.0;
    for round in 0..rounds {
        until_holdings(&http[0], "both nodes hold partitions", |held| {
            held.len() == 2 && held.values().all(|p| !p.is_empty())
        })
        .await;
        if sessions.is_empty() {
            for node in &http {
                for _ in 0..4 {
                    sessions.push((node.session("default").await, 0));
                }
            }
        }
        prompt_all(
            &http,
            &mut sessions,
            0,
            &format!("round {round}: look it up"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(150 + 70 * (round % 4))).await;
        nodes[1].signal("-STOP");
        until_holdings(&http[0], "the running node took every partition", |held| {
            held.get("n0")
                .is_some_and(|p| p.len() == PARTITIONS as usize)
        })
        .await;
        for (s, _) in &sessions {
            idle(&http[0], s).await;
        }
        nodes[1].signal("-CONT");
        // The resumed node notices at its next renewal; whatever it tried meanwhile was refused.
        tokio::time::sleep(Duration::from_millis(TTL_MS)).await;
        fenced = metric(&http[1], "agenthost_store_fenced_total").await;
    }
    eprintln!("fencing: {rounds} rounds, {fenced} writes of the paused node refused");
    until_holdings(&http[0], "the resumed node rejoined", |held| {
        held.len() == 2 && held.values().all(|p| !p.is_empty())
    })
    .await;
    for (s, acked) in &sessions {
        idle(&http[1], s).await;
        let row = http[1].get(&format!("/api/session/{s}")).await["data"].clone();
        let messages = http[1]
            .get(&format!("/api/session/{s}/messages?limit=1000"))
            .await["data"]
            .as_array()
            .expect("messages")
            .clone();
        let users = messages.iter().filter(|m| m["type"] == "user").count();
        assert_eq!(
            users, *acked,
            "{s}: every acknowledged input became a message once"
        );
        let last = messages.last().expect("messages");
        assert!(
            (last["type"] == "assistant" && last["finish"].is_string())
                || row["halted"].is_string(),
            "{s} ends with an unanswered input: {last}"
        );
        // Seqs strictly increase: nothing was committed twice.
        let seqs: Vec<u64> = messages.iter().filter_map(|m| m["seq"].as_u64()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{s}: {seqs:?}");
    }
    for (key, n) in calls.lock().expect("lock").iter() {
        assert_eq!(*n, 1, "the non-idempotent tool call {key} ran {n} times");
    }
}

/// An approval asked on one node is listed and decided through another: the decision is
/// forwarded to the owner, which runs the approved call once; a second decision through either
/// node gets the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_decided_through_the_node_that_does_not_own_the_session() {
    use super::wire::{Wire, calls_tools_named_in_the_prompt};
    if pg_url().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let schema = format!("e2eapprove{}", std::process::id());
    let wire = Wire::start(calls_tools_named_in_the_prompt(&["lookup"]), &[]).await;
    let provider = format!("{}/v1", wire.url);
    let tool = format!("{}/tools/lookup", wire.url);
    // Both nodes ask before `lookup`.
    for n in 0..2 {
        let path = node_config(d, n, &schema, &provider, &tool);
        let text = std::fs::read_to_string(&path).expect("config");
        let text = text.replace("steps = 4\n", "steps = 4\nask = [\"lookup\"]\n");
        std::fs::write(&path, text).expect("config written");
    }
    let url = pg_url().expect("checked above");
    let nodes: Vec<Proc> = (0..2)
        .map(|n| {
            let cfg = d.join(format!("node{n}.toml"));
            let args = [
                "serve",
                "--config",
                cfg.to_str().expect("utf-8"),
                "--bind",
                "127.0.0.1:0",
            ];
            let mut proc = Proc::spawn_with_env(
                &format!("node{n}"),
                d,
                &args,
                &[
                    ("AGENTHOST_PG_URL", &url),
                    ("AGENTHOST_CLUSTER_SECRET", CLUSTER_SECRET),
                ],
            );
            proc.url_cached();
            proc
        })
        .collect();
    let http: Vec<Http> = nodes.iter().map(|n| Http::new(&n.cached_url())).collect();
    until_holdings(&http[0], "the partitions spread over two nodes", |held| {
        held.len() == 2 && held.values().all(|p| !p.is_empty())
    })
    .await;
    // Created on n0, so n0 owns it.
    let s = http[0].session("default").await;
    http[0]
        .post(
            &format!("/api/session/{s}/prompt"),
            Some(json!({"text": "use lookup"})),
        )
        .await;
    idle(&http[0], &s).await;
    let (status, pending) = call_through(
        &http[1],
        reqwest::Method::GET,
        &format!("/api/session/{s}/approvals"),
        None,
        LIMIT,
    )
    .await;
    assert_eq!(status, 200, "{pending}");
    let approval = pending["data"][0].clone();
    assert_eq!(approval["name"], "lookup", "{pending}");
    let session = http[1].get(&format!("/api/session/{s}")).await;
    assert_eq!(session["data"]["status"]["type"], "waiting", "{session}");
    let path = format!(
        "/api/session/{s}/approvals/{}/{}",
        approval["message_id"].as_str().expect("message id"),
        approval["call_id"].as_str().expect("call id")
    );
    let body = json!({"decision": "approve", "digest": approval["digest"], "by": "ann"});
    let (status, decided) =
        call_through(&http[1], reqwest::Method::POST, &path, Some(body), LIMIT).await;
    assert_eq!(status, 200, "{decided}");
    idle(&http[1], &s).await;
    assert_eq!(wire.calls().len(), 1, "{:?}", wire.calls());
    for node in &http {
        let body = json!({"decision": "deny", "digest": approval["digest"]});
        let (status, again) = node.call(reqwest::Method::POST, &path, Some(body)).await;
        assert_eq!(status, 409, "{again}");
        assert_eq!(again["error"]["decision"]["by"], "ann", "{again}");
    }
    assert_eq!(wire.calls().len(), 1);
}

/// A schedule whose owner is killed before it fires is fired once by the node that takes the
/// session over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_whose_owner_died_fires_once_on_the_new_owner() {
    use super::wire::{Wire, calls_tools_named_in_the_prompt, last_user};
    if pg_url().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let schema = format!("e2esched{}", std::process::id());
    let wire = Wire::start(calls_tools_named_in_the_prompt(&[]), &[]).await;
    let provider = format!("{}/v1", wire.url);
    let mut nodes = start_nodes(2, d, &schema, &provider, "http://127.0.0.1:9/unused");
    let http: Vec<Http> = nodes.iter().map(|n| Http::new(&n.cached_url())).collect();
    until_holdings(&http[0], "the partitions spread over two nodes", |held| {
        held.len() == 2 && held.values().all(|p| !p.is_empty())
    })
    .await;
    let s = http[0].session("default").await;
    let set = http[0]
        .post(
            &format!("/api/session/{s}/schedules"),
            Some(json!({"text": "after the takeover", "after_ms": 2500})),
        )
        .await;
    assert!(set["data"]["id"].is_string(), "{set}");
    nodes[0].sigkill();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !wire
        .requests()
        .iter()
        .any(|r| last_user(r) == "after the takeover")
    {
        assert!(Instant::now() < deadline, "the schedule never fired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    idle(&http[1], &s).await;
    let messages = http[1].get(&format!("/api/session/{s}/messages")).await;
    let users = messages["data"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "user")
        .count();
    assert_eq!(users, 1, "{messages}");
}
