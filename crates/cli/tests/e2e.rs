//! End-to-end tests of the real `agenthost` binary: `serve` on a free loopback port over a
//! temporary data directory, with `agenthost mock-provider` processes as the model, driven
//! through HTTP only. Every wait is bounded, and every child process is killed on every exit
//! path (the [`Proc`] guard).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "e2e/approvals.rs"]
mod approvals;
#[path = "e2e/budgets.rs"]
mod budgets;
#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/laws.rs"]
mod laws;
#[path = "e2e/mcp.rs"]
mod mcp;
#[path = "e2e/mcp_server.rs"]
mod mcp_server;
#[path = "e2e/schedules.rs"]
mod schedules;
#[path = "e2e/security.rs"]
mod security;
#[path = "e2e/wire.rs"]
mod wire;

const BIN: &str = env!("CARGO_BIN_EXE_agenthost");
/// The longest any single wait in these tests may take.
const LIMIT: Duration = Duration::from_secs(20);

/// A child process that is killed when the guard drops.
struct Proc {
    name: String,
    child: Child,
    stdout: mpsc::Receiver<String>,
    log: PathBuf,
    url: Option<String>,
}

impl Proc {
    fn spawn(name: &str, dir: &Path, args: &[&str]) -> Proc {
        Proc::spawn_with_env(name, dir, args, &[])
    }

    fn spawn_with_env(name: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut command = Command::new(BIN);
        command.args(args).envs(env.iter().copied());
        Proc::spawn_command(name, dir, command)
    }

    /// `command` (the binary, or a shell that runs it) with the harness's environment and pipes.
    fn spawn_command(name: &str, dir: &Path, mut command: Command) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut child = command
            .env_remove("AGENTHOST_TOKEN")
            .env_remove("AGENTHOST_CONFIG")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn agenthost");
        let (tx, stdout) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            name: name.to_owned(),
            child,
            stdout,
            log,
            url: None,
        }
    }

    /// Reads the URL once and keeps it.
    fn url_cached(&mut self) {
        if self.url.is_none() {
            self.url = Some(self.url());
        }
    }

    fn cached_url(&self) -> String {
        self.url.clone().expect("url_cached first")
    }

    /// The URL from the "listening on …" line.
    fn url(&self) -> String {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.split("listening on ").nth(1) {
                        return url.trim().to_owned();
                    }
                }
                Err(_) => panic!("{} printed no address: {}", self.name, self.log_text()),
            }
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} failed");
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit: {}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.wait_exit();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.log_text());
        }
    }
}

/// Runs the binary to completion (bounded), returning its status, stdout and stderr.
fn run(args: &[&str]) -> (ExitStatus, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("AGENTHOST_TOKEN")
        .env_remove("AGENTHOST_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agenthost");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("agenthost {args:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = reader.join().unwrap_or_default();
    (status, stdout, errors.join().unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// HTTP helpers.

struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    fn new(base: &str) -> Http {
        Http {
            base: base.to_owned(),
            client: agenthost_llm::client_builder()
                .expect("a client builder")
                .timeout(LIMIT)
                .build()
                .expect("client"),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    /// A page that is not JSON (`/metrics`), as text.
    async fn text(&self, path: &str) -> String {
        let (status, page) = self.call(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "GET {path}: {page}");
        page.as_str().expect("text").to_owned()
    }

    async fn get(&self, path: &str) -> Value {
        let (status, json) = self.call(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "GET {path}: {json}");
        json
    }

    async fn post(&self, path: &str, body: Option<Value>) -> Value {
        let (status, json) = self.call(reqwest::Method::POST, path, body).await;
        assert!(
            status == 200 || status == 202,
            "POST {path}: {status} {json}"
        );
        json
    }

    async fn session(&self, agent: &str) -> String {
        let reply = self
            .post("/api/session", Some(json!({"agent": agent})))
            .await;
        reply["data"]["id"].as_str().expect("id").to_owned()
    }

    /// A new session of the default agent, prompted with `text`: the session and its live
    /// frames up to the end of the execution.
    async fn turn(&self, text: &str) -> (String, Vec<Frame>) {
        let s = self.session("default").await;
        let mut stream = self.events(&s).await;
        stream.until("synced").await;
        self.post(
            &format!("/api/session/{s}/prompt"),
            Some(json!({ "text": text })),
        )
        .await;
        let live = stream
            .until_any(&["execution_succeeded", "execution_failed"])
            .await;
        (s, live)
    }

    async fn events(&self, session: &str) -> Sse {
        self.events_with(session, None).await
    }

    /// A stream resumed after the frame with id `last`, with `Last-Event-ID`.
    async fn events_after(&self, session: &str, last: u64) -> Sse {
        self.events_with(session, Some(last)).await
    }

    async fn events_with(&self, session: &str, last: Option<u64>) -> Sse {
        let client = agenthost_api::Client::new(&self.base).expect("API client");
        let mut events = client.events(session, last);
        tokio::time::timeout(LIMIT, events.open())
            .await
            .expect("stream opened in time")
            .expect("stream opened");
        Sse(events)
    }
}

/// A frame as the tests look at it: its SSE event name, id and JSON data.
#[derive(Debug)]
struct Frame {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// An event stream, read with the API client's reconnecting [`agenthost_api::Events`].
struct Sse(agenthost_api::Events);

impl Sse {
    async fn next(&mut self) -> Frame {
        use agenthost_api::Frame as F;
        let frame = tokio::time::timeout(LIMIT, self.0.next())
            .await
            .expect("a frame in time")
            .expect("stream open")
            .expect("a frame");
        fn json(value: &impl serde::Serialize) -> Value {
            serde_json::to_value(value).expect("JSON")
        }
        let (event, id, data) = match &frame {
            F::Event(e) => {
                let data = json(e);
                let name = data["type"].as_str().expect("an event type").to_owned();
                (name, Some(e.seq), data)
            }
            F::Synced(s) => ("synced".to_owned(), None, json(s)),
            F::Delta(d) => ("delta".to_owned(), None, json(d)),
            F::Status(s) => ("status".to_owned(), None, json(s)),
            F::Error(e) => ("error".to_owned(), None, json(e)),
        };
        Frame { event, id, data }
    }

    /// Frames up to and including the first named `event`.
    async fn until(&mut self, event: &str) -> Vec<Frame> {
        self.until_any(&[event]).await
    }

    /// Frames up to and including the first of `events`.
    async fn until_any(&mut self, events: &[&str]) -> Vec<Frame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next().await;
            let done = events.contains(&frame.event.as_str());
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }
}

fn config(dir: &Path, fast: &str, slow: &str, slow_provider: &str) -> PathBuf {
    let path = dir.join("agenthost.toml");
    let text = format!(
        r#"
data_dir = "{data}"
# The fast provider is spoken to over HTTP/2 (h2c), the slow one over HTTP/1.1: the mock
# serves both on one port.
[providers.fast]
kind = "openai"
base_url = "{fast}"
http2_prior_knowledge = true
streams_per_connection = 2
[providers.slow]
kind = "openai"
base_url = "{slow}"
[models.default]
provider = "fast"
model = "mock-1"
[models.slow]
provider = "{slow_provider}"
model = "mock-1"
[agents.default]
model = "default"
[agents.slow]
model = "slow"
"#,
        data = dir.join("data").display()
    );
    std::fs::write(&path, text).expect("config written");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_end_to_end_with_interrupt_and_sigkill_recovery() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let fast = Proc::spawn(
        "fast-mock",
        d,
        &[
            "mock-provider",
            "--bind",
            "127.0.0.1:0",
            "--tokens-per-sec",
            "500",
        ],
    );
    let slow = Proc::spawn(
        "slow-mock",
        d,
        &[
            "mock-provider",
            "--bind",
            "127.0.0.1:0",
            "--tokens-per-sec",
            "4",
        ],
    );
    let (fast_url, slow_url) = (fast.url(), slow.url());
    let cfg = config(d, &fast_url, &slow_url, "slow");
    let cfg = cfg.to_str().expect("utf-8 path");
    let mut server = Proc::spawn(
        "serve-1",
        d,
        &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
    );
    let http = Http::new(&server.url());

    assert_eq!(http.get("/healthz").await, json!({"status": "ok"}));
    let doc = http.get("/openapi.json").await;
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    assert!(doc["paths"]["/api/session/{id}/events"]["get"].is_object());

    // A turn, streamed: replay, synced, live events in seq order, text deltas.
    let a = http.session("default").await;
    let mut stream = http.events(&a).await;
    let replay = stream.until("synced").await;
    assert_eq!(replay.len(), 2, "session_created then synced: {replay:?}");
    let admitted = http
        .post(
            &format!("/api/session/{a}/prompt"),
            Some(json!({"text": "hello"})),
        )
        .await;
    assert_eq!(admitted["data"]["admitted_seq"], 1);
    let live = stream.until("execution_succeeded").await;
    let seqs: Vec<u64> = live.iter().filter_map(|f| f.id).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{live:?}"
    );
    assert!(
        live.iter()
            .any(|f| f.event == "delta" && f.data["kind"] == "text")
    );
    let messages = http.get(&format!("/api/session/{a}/messages")).await;
    let messages = messages["data"].as_array().expect("messages").clone();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["text"], "hello");
    assert_eq!(messages[1]["finish"], "stop");
    assert!(
        messages[1]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );

    // Generate records nothing.
    let before = http.get(&format!("/api/session/{a}")).await["data"]["last_seq"].clone();
    let generated = http
        .post(
            &format!("/api/session/{a}/generate"),
            Some(json!({"prompt": "recap"})),
        )
        .await;
    assert!(
        generated["data"]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(
        http.get(&format!("/api/session/{a}")).await["data"]["last_seq"],
        before
    );

    // A forced resume runs one more step.
    let resumed = http
        .post(&format!("/api/session/{a}/resume?wait=true"), None)
        .await;
    assert_eq!(resumed["data"], json!({"outcome": "completed", "steps": 1}));

    // Interrupt mid-stream: the partial text is kept, marked incomplete.
    let b = http.session("slow").await;
    let mut stream = http.events(&b).await;
    http.post(
        &format!("/api/session/{b}/prompt"),
        Some(json!({"text": "long one"})),
    )
    .await;
    stream.until("delta").await;
    let interrupted = http
        .post(&format!("/api/session/{b}/interrupt"), None)
        .await;
    assert_eq!(interrupted["data"], json!({"interrupted": true}));
    stream.until("execution_interrupted").await;
    let messages = http.get(&format!("/api/session/{b}/messages")).await;
    let last = messages["data"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .expect("assistant");
    assert_eq!(last["error"]["kind"], "aborted", "{last}");
    assert_eq!(last["content"][0]["incomplete"], true, "{last}");

    // SIGKILL mid-turn, then a restart that resumes the session by itself.
    let c = http.session("slow").await;
    let mut stream = http.events(&c).await;
    http.post(
        &format!("/api/session/{c}/prompt"),
        Some(json!({"text": "survive this"})),
    )
    .await;
    stream.until("delta").await;
    drop(stream);
    server.sigkill();
    let cfg = config(d, &fast_url, &slow_url, "fast");
    let cfg = cfg.to_str().expect("utf-8 path");
    let mut server = Proc::spawn(
        "serve-2",
        d,
        &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
    );
    let http = Http::new(&server.url());
    let idle = http
        .post(&format!("/api/session/{c}/wait?timeout_ms=15000"), None)
        .await;
    assert_eq!(idle["data"]["idle"], true);
    let session = http.get(&format!("/api/session/{c}")).await;
    assert_eq!(session["data"]["claimed"], false, "{session}");
    assert_eq!(session["data"]["pending"], 0);
    let messages = http.get(&format!("/api/session/{c}/messages")).await;
    let messages = messages["data"].as_array().expect("messages").clone();
    let kinds: Vec<&str> = messages.iter().filter_map(|m| m["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"user"), "{messages:#?}");
    assert_eq!(messages[1]["error"]["kind"], "restarted", "{messages:#?}");
    let last = messages.last().expect("answer");
    assert_eq!(last["type"], "assistant");
    assert_eq!(last["finish"], "stop", "{messages:#?}");
    // The recovery is in the log, and the interrupted session B was not resumed.
    let mut replay = http.events(&c).await;
    let log = replay.until("synced").await;
    assert!(log.iter().any(|f| f.event == "recovery_attempted"));
    assert_eq!(
        log.iter()
            .filter(|f| f.event == "execution_succeeded")
            .count(),
        1
    );
    drop(replay);
    let b_row = http.get(&format!("/api/session/{b}")).await;
    assert_eq!(b_row["data"]["claimed"], false);

    // The load test through this server.
    let (status, out, err) = run(&[
        "loadtest",
        "--url",
        &http.base,
        "--sessions",
        "3",
        "--prompts",
        "2",
    ]);
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("6 turns ok, 0 failed"), "{out}");
    // Its JSON report carries the server's CPU and memory (from its /metrics) and our overhead
    // beyond the provider's time.
    let (status, out, err) = run(&[
        "loadtest",
        "--url",
        &http.base,
        "--sessions",
        "2",
        "--prompts",
        "2",
        "--json",
    ]);
    assert!(status.success(), "{out}\n{err}");
    let report: Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert!(report["cpu_ms_per_turn"].as_f64().is_some(), "{report}");
    assert!(
        report["server_rss_kib"].as_u64().is_some_and(|k| k > 0),
        "{report}"
    );
    assert!(
        report["provider_ms_per_turn"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{report}"
    );
    assert!(report["overhead_ms"]["p99"].as_f64().is_some(), "{report}");
    // The embedded runtime against the same OpenAI-wire mock, over HTTP.
    let provider = fast_url.clone();
    let (status, out, err) = run(&[
        "loadtest",
        "--provider-url",
        &provider,
        "--sessions",
        "2",
        "--prompts",
        "2",
    ]);
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("4 turns ok, 0 failed"), "{out}");
    assert!(out.contains("overhead ms"), "{out}");

    // Graceful stop, not held up by an open event stream, then an offline inspection of the
    // same store.
    let mut open = http.events(&a).await;
    open.until("synced").await;
    let stopping = Instant::now();
    server.signal("-TERM");
    let status = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", server.log_text());
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        stopping.elapsed()
    );
    drop(open);
    let data = d.join("data");
    let data = data.to_str().expect("utf-8 path");
    let (status, out, err) = run(&["inspect", "--data-dir", data]);
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains(&c) && out.contains(&a), "{out}");
    assert!(
        out.contains("verified: projections equal a replay"),
        "{out}"
    );
    let (status, out, err) = run(&["inspect", "--data-dir", data, &c]);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(out.contains("recovery_attempted"), "{out}");
    assert!(out.contains("\"type\":\"assistant\""), "{out}");
    let (status, _, err) = run(&["inspect", "--data-dir", data, "ses_missing"]);
    assert_eq!(status.code(), Some(2), "{err}");
    drop((fast, slow));
}

#[test]
fn embedded_loadtest_reports() {
    let (status, out, err) = run(&["loadtest", "--sessions", "4", "--prompts", "3"]);
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("12 turns ok, 0 failed"), "{out}");
    for row in [
        "admission",
        "first token",
        "turn",
        "turns/s",
        "overhead ms",
        "cpu:",
        "memory: rss",
    ] {
        assert!(out.contains(row), "{row} missing: {out}");
    }
    // Sessions spread over a ramp-up: the second starts 50 ms after the first.
    let (status, out, err) = run(&[
        "loadtest",
        "--sessions",
        "2",
        "--prompts",
        "1",
        "--ramp-up-ms",
        "100",
        "--json",
    ]);
    assert!(status.success(), "{err}");
    let report: Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert_eq!(report["turns_ok"], 2);
    assert!(
        report["seconds"].as_f64().is_some_and(|s| s >= 0.05),
        "the last session starts half the ramp-up in: {report}"
    );
    for row in ["admission", "first_token", "turn"] {
        let max = report["latency"][row]["max_ms"].as_f64().expect("a figure");
        assert!(max > 0.0, "{row}: {report}");
        assert_eq!(report["latency"][row]["count"], 2, "{row}: {report}");
    }
    let p50 = report["latency"]["turn"]["p50_ms"]
        .as_f64()
        .expect("a figure");
    assert!(p50 > 0.0 && p50 <= report["latency"]["turn"]["max_ms"].as_f64().unwrap_or(0.0));
    assert!(
        report["provider_ms_per_turn"].as_f64().is_some(),
        "{report}"
    );
    assert!(report["cpu_ms_per_turn"].as_f64().is_some(), "{report}");
    // Under load too, every turn's first token is measured: one session's traffic never makes
    // another's driver miss its tokens.
    let (status, out, err) = run(&["loadtest", "--sessions", "2000", "--prompts", "2", "--json"]);
    assert!(status.success(), "{err}");
    let report: Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert_eq!(report["turns_ok"], 4000, "{report}");
    assert_eq!(report["latency"]["first_token"]["count"], 4000, "{report}");
}

/// Bad configuration: a clear message, exit code 2, and the data directory never created.
#[test]
fn config_errors_exit_2_without_touching_the_data_dir() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: &[(&str, &str)] = &[
        ("colour = \"red\"", "unknown field `colour`"),
        ("[server]\nbind = \"everywhere\"", "`server.bind`"),
        (
            "[server]\ntoken_env = \"AGENTHOST_TEST_UNSET\"",
            "AGENTHOST_TEST_UNSET is not set",
        ),
        (
            "[providers.p]\nkind = \"gemini\"",
            "unknown variant `gemini`",
        ),
        (
            "[providers.p]\nkind = \"openai\"\napi_key_env = \"AGENTHOST_TEST_UNSET\"\n[models.m]\nmodel = \"x\"",
            "`providers.p.api_key_env`",
        ),
        (
            "[models.m]\nprovider = \"ghost\"",
            "unknown provider \"ghost\"",
        ),
        ("[agents.a]\nmodel = \"ghost\"", "unknown model \"ghost\""),
        (
            "[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"nowhere\"",
            "`tools[0].url`",
        ),
        (
            "[recovery]\nmode = \"sometimes\"",
            "unknown variant `sometimes`",
        ),
        ("[server\nbind = 1", "config file"),
    ];
    for (n, (text, expected)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{n}.toml"));
        std::fs::write(&file, text).expect("write config");
        let data = dir.path().join(format!("data{n}"));
        let (status, _, err) = run(&[
            "serve",
            "--config",
            file.to_str().expect("utf-8"),
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--bind",
            "127.0.0.1:0",
        ]);
        assert_eq!(status.code(), Some(2), "{text:?}: {err}");
        assert!(
            err.contains(expected),
            "{text:?}: expected {expected:?} in\n{err}"
        );
        assert!(
            err.contains(file.to_str().expect("utf-8")),
            "names the file: {err}"
        );
        assert!(!data.exists(), "{text:?} touched the data dir");
    }
    let data = dir.path().join("data-flags");
    let data = data.to_str().expect("utf-8");
    let (status, _, err) = run(&["serve", "--data-dir", data, "--bind", "0.0.0.0:0"]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{err}"
    );
    let (status, _, err) = run(&["serve", "--data-dir", data, "--bind", "localhost"]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--bind"), "{err}");
    let (status, _, err) = run(&[
        "serve",
        "--config",
        "/nonexistent/agenthost.toml",
        "--data-dir",
        data,
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("cannot read config file"), "{err}");
    let (status, _, err) = run(&["serve", "--no-such-flag"]);
    assert_eq!(status.code(), Some(2), "{err}");
    let (status, _, err) = run(&["inspect", "--data-dir", data]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("no store at"), "{err}");
    assert!(!Path::new(data).exists());
    // A data dir that cannot be made (under a regular file): the cause, said once.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write file");
    let under = file.join("data");
    let under = under.to_str().expect("utf-8");
    let (status, _, err) = run(&["serve", "--data-dir", under, "--bind", "127.0.0.1:0"]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("cannot create {under}")), "{err}");
    assert_eq!(err.matches("storage failure").count(), 1, "{err}");
}

/// A mock provider that calls tools in a share `tool_ratio` of its answers.
fn tool_mock(dir: &Path, name: &str, tokens_per_sec: &str, tool_ratio: &str) -> Proc {
    let args = [
        "mock-provider",
        "--bind",
        "127.0.0.1:0",
        "--tokens-per-sec",
        tokens_per_sec,
        "--tool-ratio",
        tool_ratio,
    ];
    Proc::spawn(name, dir, &args)
}

/// A config whose default agent runs `steps` steps against the provider at `url` (of `kind`) and
/// may call one HTTP tool, `lookup`, whose endpoint refuses connections: its failure is a result
/// the model sees like any other.
fn tool_loop_config(dir: &Path, kind: &str, url: &str, steps: u32) -> PathBuf {
    tool_loop_config_with(dir, kind, url, steps, "http://127.0.0.1:9/lookup")
}

/// [`tool_loop_config`] with the `lookup` tool served at `tool_url`.
fn tool_loop_config_with(dir: &Path, kind: &str, url: &str, steps: u32, tool_url: &str) -> PathBuf {
    let path = dir.join("agenthost.toml");
    let text = format!(
        r#"
data_dir = "{data}"
[providers.mock]
kind = "{kind}"
base_url = "{url}"
[models.default]
provider = "mock"
model = "mock-1"
[agents.default]
model = "default"
steps = {steps}
[[tools]]
name = "lookup"
kind = "http"
url = "{tool_url}"
timeout_ms = 2000
"#,
        data = dir.join("data").display()
    );
    std::fs::write(&path, text).expect("config written");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_wire_tool_loop_to_the_step_limit_and_generate_after_tools() {
    // The mock provider's Anthropic route refuses every request the real Messages API would
    // (tool blocks without tool definitions, unanswered tool calls, no max_tokens, ...).
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let mock = tool_mock(d, "anthropic-mock", "1000", "1");
    // Two steps: the model calls a tool in the first, so the second, the step-limit step, carries
    // tool blocks in its history.
    let path = tool_loop_config(d, "anthropic", &mock.url(), 2);
    let cfg = path.to_str().expect("utf-8 path");
    let server = Proc::spawn(
        "serve-anthropic",
        d,
        &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
    );
    let http = Http::new(&server.url());
    let (s, live) = http.turn("look it up").await;
    assert!(
        !live.iter().any(|f| f.event == "execution_failed"),
        "{live:?}\n{}",
        server.log_text()
    );
    let messages = http.get(&format!("/api/session/{s}/messages")).await;
    let messages = messages["data"].as_array().expect("messages").clone();
    assert_eq!(
        messages.len(),
        3,
        "user, tool step, step-limit step: {messages:?}"
    );
    assert_eq!(messages[2]["finish"], "stop", "{messages:?}");

    let generated = http
        .post(
            &format!("/api/session/{s}/generate"),
            Some(json!({"prompt": "recap"})),
        )
        .await;
    assert!(
        generated["data"]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{generated}"
    );
}

/// A proxy named in the environment carries the calls to a plain-`http://` provider, as reqwest
/// does everywhere: the provider's own address refuses connections, and the proxy (the mock
/// provider, which answers a request in absolute form like any other) gives the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_in_the_environment_carries_provider_calls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let proxy = tool_mock(d, "proxy-mock", "0", "0");
    let proxy_url = proxy.url();
    let proxy_url = proxy_url.trim_end_matches("/v1");
    let path = tool_loop_config(d, "openai", "http://127.0.0.1:9/v1", 1);
    let cfg = path.to_str().expect("utf-8 path");
    let server = Proc::spawn_with_env(
        "serve-proxied",
        d,
        &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
        &[
            ("HTTP_PROXY", proxy_url),
            ("NO_PROXY", ""),
            ("no_proxy", ""),
        ],
    );
    let http = Http::new(&server.url());
    let (_, live) = http.turn("hello").await;
    assert!(
        live.iter().any(|f| f.event == "execution_succeeded"),
        "{live:?}\n{}",
        server.log_text()
    );
}

/// Kills `agenthost serve` with SIGKILL or stops it with SIGTERM at moments spread over a mixed
/// workload (text answers, tool loops, several sessions at once), restarts it each time, and
/// checks that after the last restart no session is left with an input that is neither answered
/// nor explicitly failed. `AGENTHOST_SOAK=1` runs more rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stopped_at_any_moment_of_a_mixed_workload_loses_no_turn() {
    let rounds: u64 = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        16
    } else {
        4
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let mock = tool_mock(d, "workload-mock", "60", "0.5");
    let path = tool_loop_config(d, "openai", &mock.url(), 4);
    let cfg = path.to_str().expect("utf-8 path");
    let serve = |round: u64| {
        Proc::spawn(
            &format!("serve-{round}"),
            d,
            &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
        )
    };
    let mut sessions: Vec<(String, usize)> = Vec::new();
    for round in 0..rounds {
        let mut server = serve(round);
        let http = Http::new(&server.url());
        if sessions.is_empty() {
            for _ in 0..6 {
                sessions.push((http.session("default").await, 0));
            }
        }
        for (s, acked) in sessions.iter_mut() {
            for p in 0..2 {
                http.post(
                    &format!("/api/session/{s}/prompt"),
                    Some(json!({"text": format!("round {round} task {p}")})),
                )
                .await;
                *acked += 1;
            }
        }
        // Stop at a different moment of the work each round.
        tokio::time::sleep(Duration::from_millis(20 + 97 * (round % 5))).await;
        if round % 2 == 0 {
            server.sigkill();
        } else {
            server.signal("-TERM");
            assert!(server.wait_exit().success(), "{}", server.log_text());
        }
    }
    let server = serve(rounds);
    let http = Http::new(&server.url());
    let mut resumed = 0;
    for (s, acked) in &sessions {
        let idle = http
            .post(&format!("/api/session/{s}/wait?timeout_ms=120000"), None)
            .await;
        assert_eq!(idle["data"]["idle"], true, "{s}: {idle}");
        let row = http.get(&format!("/api/session/{s}")).await["data"].clone();
        assert_eq!(row["claimed"], false, "{s}: {row}");
        assert_eq!(row["pending"], 0, "{s}: {row}");
        let messages = http
            .get(&format!("/api/session/{s}/messages?limit=1000"))
            .await["data"]
            .as_array()
            .expect("messages")
            .clone();
        resumed += messages
            .iter()
            .filter(|m| m["type"] == "system" && m.to_string().contains("server restarted"))
            .count();
        let users = messages.iter().filter(|m| m["type"] == "user").count();
        assert_eq!(
            users, *acked,
            "{s}: every acknowledged input became a message"
        );
        let last = messages.last().expect("messages");
        let answered = last["type"] == "assistant" && last["finish"].is_string();
        let failed = row["halted"].is_string();
        assert!(
            answered || failed,
            "{s} ends with an unanswered input: {last}\n{}",
            server.log_text()
        );
    }
    assert!(
        resumed > 0,
        "no stop landed mid-turn: the test proved nothing"
    );
}

/// Clients that close their socket right after sending a prompt: the server may drop the
/// request's handler at any point, but every input it admitted is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_from_clients_that_hang_up_at_once_are_all_answered() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let mock = Proc::spawn(
        "hangup-mock",
        d,
        &["mock-provider", "--bind", "127.0.0.1:0"],
    );
    let url = mock.url();
    let cfg = config(d, &url, &url, "fast");
    let cfg = cfg.to_str().expect("utf-8 path");
    let server = Proc::spawn(
        "serve-hangups",
        d,
        &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
    );
    let base = server.url();
    let http = Http::new(&base);
    let mut sessions = Vec::new();
    for _ in 0..20 {
        sessions.push(http.session("default").await);
    }
    let addr = base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    for n in 0..200 {
        let s = &sessions[n % sessions.len()];
        let body = json!({"text": format!("hang up {n}")}).to_string();
        let request = format!(
            "POST /api/session/{s}/prompt HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut socket = std::net::TcpStream::connect(&addr).expect("connect");
        socket.write_all(request.as_bytes()).expect("sent");
        // Gone before any answer.
        drop(socket);
    }
    // Whatever was admitted is answered: nothing stays pending, every session ends answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    for s in &sessions {
        loop {
            let row = http.get(&format!("/api/session/{s}")).await["data"].clone();
            let messages = http
                .get(&format!("/api/session/{s}/messages?limit=1000"))
                .await["data"]
                .as_array()
                .expect("messages")
                .clone();
            let answered = messages
                .last()
                .is_none_or(|m| m["type"] == "assistant" && m["finish"].is_string());
            if row["pending"] == 0 && row["claimed"] == false && answered {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{s} left with unanswered input: {row}\n{}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A tool that answers 1 MiB: history keeps a head-and-tail preview with a marker, and the whole
/// output reads back intact through the API, after a SIGKILL and a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_tool_output_is_previewed_in_history_and_read_back_whole_after_a_restart() {
    let whole = format!("BEGIN{}END", "é".repeat(512 * 1024));
    let answer = serde_json::to_string(&json!({ "output": whole })).expect("json");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let tool_url = format!("http://{}/lookup", listener.local_addr().expect("addr"));
    let app = axum::Router::new().route(
        "/lookup",
        axum::routing::post(move || {
            let answer = answer.clone();
            async move { ([("content-type", "application/json")], answer) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let mock = tool_mock(d, "big-tool-mock", "1000", "1");
    let path = tool_loop_config_with(d, "openai", &mock.url(), 2, &tool_url);
    let cfg = path.to_str().expect("utf-8 path");
    let args = ["serve", "--config", cfg, "--bind", "127.0.0.1:0"];
    let mut server = Proc::spawn("serve-big-tool", d, &args);
    let mut http = Http::new(&server.url());
    let (s, live) = http.turn("look it up").await;
    assert!(
        live.iter().any(|f| f.event == "tool_output"),
        "the whole output's event is on the stream: {live:?}"
    );
    let messages = http.get(&format!("/api/session/{s}/messages")).await;
    let (message_id, call_id, preview) = messages["data"]
        .as_array()
        .expect("messages")
        .iter()
        .find_map(|m| {
            let tool = m["content"]
                .as_array()?
                .iter()
                .find(|p| p["type"] == "tool")?;
            Some((
                m["id"].as_str()?.to_owned(),
                tool["call_id"].as_str()?.to_owned(),
                tool["state"]["output"].as_str()?.to_owned(),
            ))
        })
        .expect("a tool call");
    assert!(
        preview.starts_with("BEGIN") && preview.ends_with("END"),
        "head and tail kept"
    );
    assert!(preview.len() < 33 * 1024, "{} bytes kept", preview.len());
    assert!(
        preview.contains("bytes cut") && preview.contains(&format!("{message_id}/{call_id}")),
        "the marker says how much and where"
    );
    let url = format!("/api/session/{s}/tool-output/{message_id}/{call_id}");
    for round in 0..2 {
        let read = http.get(&url).await;
        assert_eq!(read["data"]["output"], whole.as_str(), "round {round}");
        assert_eq!(read["data"]["cut"], true);
        assert_eq!(read["data"]["bytes"], whole.len() as u64);
        if round == 0 {
            server.sigkill();
            server = Proc::spawn("serve-big-tool-2", d, &args);
            http = Http::new(&server.url());
        }
    }
    let (status, missing) = http
        .call(
            reqwest::Method::GET,
            &format!("/api/session/{s}/tool-output/{message_id}/nope"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{missing}");
    let (status, _) = http
        .call(
            reqwest::Method::GET,
            &format!("/api/session/{s}/tool-output/not-an-id/{call_id}"),
            None,
        )
        .await;
    assert_eq!(status, 404);
}

/// `inspect` opens the store read-only: it refuses a store a running server holds (saying so),
/// inspects a store a SIGKILL left needing recovery through a recovered copy without changing a
/// byte of it, and `--verify --json` gives scripts one object and an exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_is_read_only_and_scriptable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let data = d.join("data");
    let data = data.to_str().expect("utf-8 path").to_owned();
    let mut server = Proc::spawn(
        "serve-inspected",
        d,
        &["serve", "--data-dir", &data, "--bind", "127.0.0.1:0"],
    );
    let http = Http::new(&server.url());
    let s = http.session("default").await;
    http.post(
        &format!("/api/session/{s}/prompt"),
        Some(json!({"text": "hello"})),
    )
    .await;
    let idle = http
        .post(&format!("/api/session/{s}/wait?timeout_ms=30000"), None)
        .await;
    assert_eq!(idle["data"]["idle"], true, "{idle}");

    let (status, out, err) = run(&["inspect", "--data-dir", &data]);
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("open in another process"), "{err}");

    server.sigkill();
    let file = Path::new(&data).join("store.redb");
    let before = std::fs::read(&file).expect("store bytes");
    let (status, out, err) = run(&["inspect", "--data-dir", &data, &s]);
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("recovered copy"), "{out}");
    assert!(
        out.contains("verified: projections equal a replay of 1 sessions"),
        "{out}"
    );
    assert!(out.contains("execution_succeeded"), "{out}");
    let (status, out, err) = run(&["inspect", "--data-dir", &data, "--verify", "--json"]);
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    let report: Value = serde_json::from_str(out.trim()).expect("one JSON document");
    assert_eq!(report["verification"]["ok"], true, "{report}");
    assert_eq!(report["verification"]["sessions"], 1);
    assert_eq!(report["recovered_copy"], true);
    assert!(report.get("sessions").is_none(), "--verify lists nothing");
    assert!(
        std::fs::read(&file).expect("store bytes") == before,
        "inspect changed the store file"
    );
    let (status, out, _) = run(&["inspect", "--data-dir", &data, "--json", &s]);
    assert_eq!(status.code(), Some(0));
    let report: Value = serde_json::from_str(out.trim()).expect("one JSON document");
    assert_eq!(report["session"]["id"], s.as_str(), "{report}");
    assert!(report["events"].as_array().is_some_and(|e| e.len() > 3));
}

/// Starts `serve` on the built-in mock with `server` as the `[server]` section.
/// `agenthost serve --config CONFIG` on a free loopback port, its URL read.
fn serve_config(dir: &Path, name: &str, config: &Path) -> Proc {
    let config = config.to_str().expect("utf-8 path");
    let mut server = Proc::spawn(
        name,
        dir,
        &["serve", "--config", config, "--bind", "127.0.0.1:0"],
    );
    server.url_cached();
    server
}

fn serve_with(dir: &Path, name: &str, server: &str) -> Proc {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        "data_dir = \"{}\"\n[server]\n{server}\n",
        dir.join(name).display()
    );
    std::fs::write(&path, text).expect("config written");
    let cfg = path.to_str().expect("utf-8 path");
    Proc::spawn(
        name,
        dir,
        &["serve", "--config", cfg, "--bind", "127.0.0.1:0"],
    )
}

/// Reads until the peer closes or `limit` passes; what arrived, and whether it closed.
async fn read_to_close(stream: &mut tokio::net::TcpStream, limit: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

/// Slow and greedy clients: a connection whose head never completes is closed after the header
/// timeout, a body that trickles gets 408 after the body timeout, and connections beyond the cap
/// get 503 (the answer to their request, or after a second when they send none); the server
/// keeps answering everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_greedy_clients_are_cut_off() {
    use tokio::io::AsyncWriteExt as _;
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let server = serve_with(d, "slow", "header_timeout_ms = 300\nbody_timeout_ms = 300");
    let url = server.url();
    let addr = url.trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        stream
            .write_all(b"POST /api/session HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            .await
            .expect("partial head");
        slow.push(stream);
    }
    let http = Http::new(&url);
    assert_eq!(http.get("/healthz").await["status"], "ok");
    for stream in &mut slow {
        let (_, closed) = read_to_close(stream, Duration::from_secs(10)).await;
        assert!(closed, "a connection with an unfinished head stayed open");
    }
    let mut trickle = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    trickle
        .write_all(
            b"POST /api/session HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        )
        .await
        .expect("head and a byte");
    let (answer, _) = read_to_close(&mut trickle, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let sessions = http.get("/api/session").await;
    assert_eq!(
        sessions["data"]["sessions"].as_array().map(Vec::len),
        Some(0),
        "nothing was created: {sessions}"
    );
    drop(server);

    let server = serve_with(d, "greedy", "max_connections = 8");
    let url = server.url();
    let addr = url.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    // Accepted in order: the ninth finds every slot taken.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (answer, closed) = read_to_close(&mut extra, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(closed);
    // A client that sends its request over the cap reads the 503 as the answer to it, whatever
    // the request's size: not a reset, nor a message on a connection it had sent nothing on.
    let client = agenthost_llm::client_builder()
        .expect("a client builder")
        .pool_max_idle_per_host(0)
        .timeout(LIMIT)
        .build()
        .expect("client");
    for size in [2, 64 * 1024, 1024 * 1024].into_iter().cycle().take(12) {
        let body = serde_json::json!({ "id": format!("ses_{}", "x".repeat(size)) });
        let answer = client
            .post(format!("{url}/api/session"))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("a request of {size} bytes over the cap: {e:?}"));
        assert_eq!(answer.status().as_u16(), 503, "{size} bytes");
        let body: Value = answer.json().await.expect("a JSON body");
        assert_eq!(body["error"]["type"], "unavailable", "{body}");
    }
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let http = Http::new(&url);
    assert_eq!(http.get("/healthz").await["status"], "ok");
}

/// The soft and hard limits of open files of a process, from `/proc/<pid>/limits`.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open files line")
        .to_owned();
    let mut values = line["Max open files".len()..].split_whitespace();
    let soft = values.next().expect("soft").to_owned();
    let hard = values.next().expect("hard").to_owned();
    (soft, hard)
}

/// `serve` raises its soft limit of open files to the hard one (at a soft limit of 1 024, the
/// default of many systems, it would stop accepting at about a thousand connections), and warns
/// when the hard limit leaves less room than `max_connections` asks for.
#[test]
fn serve_raises_its_open_file_limit_and_warns_when_it_is_too_low() {
    if !Path::new("/proc/self/limits").exists() {
        eprintln!("left out: serve_raises_its_open_file_limit (no /proc on this system)");
        return;
    }
    let (_, hard) = open_file_limits(std::process::id());
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let config = d.join("files.toml");
    // More connections than any hard limit allows.
    std::fs::write(&config, "[server]\nmax_connections = 100000000\n").expect("config");
    let data = d.join("data");
    let mut command = Command::new("sh");
    command.args([
        "-c",
        "ulimit -S -n 256 && exec \"$0\" \"$@\"",
        BIN,
        "serve",
        "--config",
        config.to_str().expect("utf-8"),
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--bind",
        "127.0.0.1:0",
    ]);
    let server = Proc::spawn_command("files", d, command);
    let _ = server.url();
    let (soft, now_hard) = open_file_limits(server.child.id());
    assert_eq!(
        (soft.as_str(), now_hard.as_str()),
        (hard.as_str(), hard.as_str())
    );
    let log = server.log_text();
    assert!(
        log.contains("open-file limit leaves room for fewer connections"),
        "{log}"
    );
}

/// A store file damaged on disk (bytes flipped all through its middle): `inspect --verify`
/// and plain `inspect` report the damage with exit 3, `serve` refuses it with exit 1, each in
/// a clear line and never with a panic report from inside redb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_verify_reports_a_damaged_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let data = d.join("data");
    let data = data.to_str().expect("utf-8 path").to_owned();
    let mut server = Proc::spawn(
        "serve-damaged",
        d,
        &["serve", "--data-dir", &data, "--bind", "127.0.0.1:0"],
    );
    let http = Http::new(&server.url());
    for _ in 0..5 {
        http.turn("hello").await;
    }
    server.signal("-TERM");
    assert_eq!(server.wait_exit().code(), Some(0));
    let (status, out, err) = run(&["inspect", "--data-dir", &data, "--verify"]);
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("file: intact"), "{out}");

    let file = Path::new(&data).join("store.redb");
    let mut bytes = std::fs::read(&file).expect("store bytes");
    let len = bytes.len();
    for at in (len / 4..len * 3 / 4).step_by(97) {
        bytes[at] ^= 0x5a;
    }
    std::fs::write(&file, &bytes).expect("damaged");
    let (status, out, err) = run(&["inspect", "--data-dir", &data, "--verify"]);
    assert_eq!(status.code(), Some(3), "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("damaged") || out.contains("VERIFICATION FAILED"),
        "{out}\n{err}"
    );
    assert_no_panic(&err);
    let (status, out, err) = run(&["inspect", "--data-dir", &data]);
    assert_eq!(status.code(), Some(3), "{out}\n{err}");
    assert!(err.contains("damaged"), "{err}");
    assert_no_panic(&err);
    // The server refuses to start on it, saying so in one line and naming the file.
    let (status, _, err) = run(&["serve", "--data-dir", &data, "--bind", "127.0.0.1:0"]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("damaged") && err.contains("store.redb"),
        "{err}"
    );
    assert_no_panic(&err);
}

/// What a damaged file makes redb do inside never reaches the operator as a panic report.
fn assert_no_panic(err: &str) {
    assert!(
        !err.contains("panicked")
            && !err.contains("stack backtrace")
            && !err.contains("RUST_BACKTRACE"),
        "a panic report on stderr:\n{err}"
    );
}

/// `config check` validates a configuration with its environment and prints the effective
/// configuration, secrets redacted; `completions` and `man` come from the command definitions.
#[test]
fn config_check_completions_and_man() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("agenthost.toml");
    std::fs::write(
        &path,
        "[server]\ntoken_env = \"E2E_TOK\"\ndelta_interval_ms = 25\n[providers.p]\nkind = \"openai\"\n\
         api_key_env = \"E2E_KEY\"\n[models.default]\nprovider = \"p\"\nmodel = \"m\"\n",
    )
    .expect("config written");
    let check = |envs: &[(&str, &str)]| {
        Command::new(BIN)
            .args(["config", "check", path.to_str().expect("utf-8")])
            .env_remove("AGENTHOST_CONFIG")
            .envs(envs.iter().copied())
            .output()
            .expect("runs")
    };
    let out = check(&[
        ("E2E_TOK", "tok-very-secret"),
        ("E2E_KEY", "sk-very-secret"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("very-secret"),
        "a secret was printed: {text}"
    );
    let json: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["providers"]["p"]["api_key"]["set"], true);
    assert_eq!(json["server"]["token"]["from_env"], "E2E_TOK");
    assert_eq!(json["server"]["delta_interval_ms"], 25);
    assert_eq!(json["models"]["default"]["model"], "m");
    assert_eq!(json["store"]["kind"], "redb");
    // The key's variable unset: invalid, exit 2, saying which key and variable.
    let out = check(&[("E2E_TOK", "tok")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("E2E_KEY"));
    let (status, completions, _) = run(&["completions", "bash"]);
    assert!(status.success() && completions.contains("agenthost"));
    let (status, man, _) = run(&["man"]);
    assert!(status.success() && man.contains(".TH agenthost"), "{man}");
}

/// With `[telemetry] otlp_endpoint`, `serve` exports its spans over OTLP/HTTP: a loopback
/// collector gets a turn's drain, step and provider-call spans with the session id, under the
/// configured service name, by the time a SIGTERM has stopped the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_an_otlp_collector() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let collector = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(body.to_vec());
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, collector).await });

    let dir = tempfile::tempdir().expect("temp dir");
    let telemetry =
        format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"agenthost-e2e\"");
    let mut server = serve_with(dir.path(), "traced", &telemetry);
    let http = Http::new(&server.url());
    let (session, _) = http.turn("hello").await;
    server.signal("-TERM");
    assert!(server.wait_exit().success(), "{}", server.log_text());

    let mut names = Vec::new();
    let mut service = None;
    let mut steps_of_session = 0;
    while let Ok(body) = rx.try_recv() {
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            for attr in resource.resource.iter().flat_map(|r| &r.attributes) {
                if attr.key == "service.name" {
                    service = attr.value.as_ref().and_then(|v| v.value.clone());
                }
            }
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                let session_attr = span.attributes.iter().any(|a| {
                    a.key == "session_id"
                        && a.value.as_ref().and_then(|v| v.value.as_ref())
                            == Some(&Any::StringValue(session.clone()))
                });
                if span.name == "step" && session_attr {
                    steps_of_session += 1;
                }
                names.push(span.name);
            }
        }
    }
    for name in ["drain", "step", "provider_call"] {
        assert!(
            names.iter().any(|n| n == name),
            "no {name} span in {names:?}"
        );
    }
    assert_eq!(steps_of_session, 1, "{names:?}");
    assert_eq!(service, Some(Any::StringValue("agenthost-e2e".into())));
}

/// The Rust API client against the real binary: one call of every route, typed answers and
/// typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_drives_every_route() {
    use agenthost_api::{Client, Frame, wire};

    let dir = tempfile::tempdir().expect("temp dir");
    let server = serve_with(dir.path(), "client", "");
    let client = Client::new(&server.url()).expect("client");

    assert_eq!(client.health().await.expect("health").status, "ok");
    assert_eq!(
        client.openapi().await.expect("document"),
        agenthost_api::OPENAPI
    );
    assert!(
        client
            .metrics()
            .await
            .expect("metrics")
            .ends_with("# EOF\n")
    );
    assert_eq!(client.cluster().await.expect("cluster").store, "redb");

    let create = wire::CreateSession {
        id: Some("ses_client".into()),
        title: Some("typed".into()),
        ..Default::default()
    };
    let session = client.create_session(&create).await.expect("created");
    assert_eq!(session.id, "ses_client");
    let again = client.create_session(&create).await.expect("same session");
    assert_eq!(again.created, session.created);
    let budget = wire::Budget {
        max_tokens: Some(1_000_000),
        max_cost_usd: Some(2.5),
        ..Default::default()
    };
    let updated = client
        .update_session(
            "ses_client",
            &wire::UpdateSession {
                budget: Some(budget),
            },
        )
        .await
        .expect("updated");
    let state = updated.budget.expect("the budget");
    assert_eq!(state.own, budget);
    assert_eq!(state.left.max_tokens, Some(1_000_000));
    let page = client
        .sessions(&wire::ListQuery {
            limit: Some(10),
            cursor: None,
        })
        .await
        .expect("listed");
    assert!(page.sessions.iter().any(|s| s.id == "ses_client"));

    // A turn, watched on the event stream.
    let mut events = client.events(&session.id, None);
    events.open().await.expect("stream opened");
    let prompt = wire::Prompt {
        id: Some("msg_client_1".into()),
        text: "hello".into(),
        ..Default::default()
    };
    let receipt = client.prompt(&session.id, &prompt).await.expect("admitted");
    let retried = client.prompt(&session.id, &prompt).await.expect("retried");
    assert_eq!(
        (retried.id, retried.admitted_seq),
        (receipt.id, receipt.admitted_seq),
        "an exact retry gets the original admission"
    );
    let mut text = String::new();
    loop {
        match tokio::time::timeout(LIMIT, events.next())
            .await
            .expect("in time")
        {
            Some(Ok(Frame::Delta(delta))) => text.push_str(&delta.delta),
            Some(Ok(Frame::Event(e))) if matches!(e.body, wire::EventBody::ExecutionSucceeded) => {
                break;
            }
            Some(Ok(_)) => {}
            other => panic!("stream ended: {other:?}"),
        }
    }
    assert!(!text.is_empty(), "deltas arrived");
    assert!(client.wait(&session.id, LIMIT).await.expect("waited").idle);
    assert!(client.active().await.expect("active").is_empty());
    let messages = client
        .messages(&session.id, &wire::MessagesQuery::default())
        .await
        .expect("messages");
    assert_eq!(messages.len(), 2);

    // Parked input, then a resume that waits, then one that does not.
    let parked = wire::Prompt {
        text: "later".into(),
        resume: Some(false),
        ..Default::default()
    };
    client.prompt(&session.id, &parked).await.expect("parked");
    assert_eq!(client.inbox(&session.id).await.expect("inbox").len(), 1);
    let page = agenthost_api::wire::InboxQuery {
        after_seq: Some(0),
        limit: Some(1),
    };
    assert_eq!(
        client
            .inbox_page(&session.id, &page)
            .await
            .expect("inbox page")
            .len(),
        1
    );
    let outcome = client.resume_and_wait(&session.id).await.expect("resumed");
    assert!(
        matches!(outcome, wire::DrainOutcome::Completed { .. }),
        "{outcome:?}"
    );
    assert!(client.inbox(&session.id).await.expect("inbox").is_empty());
    assert_eq!(
        client.resume(&session.id).await.expect("accepted").status,
        "accepted"
    );
    assert!(client.wait(&session.id, LIMIT).await.expect("waited").idle);

    let generated = client
        .generate(&session.id, "summarize")
        .await
        .expect("generated");
    assert!(!generated.text.is_empty());
    // So short a history fits in the part a compaction keeps verbatim.
    let compact = client
        .compact(&session.id)
        .await
        .expect_err("nothing to compact");
    assert_eq!(
        compact.kind(),
        Some(wire::ErrorType::InvalidRequest),
        "{compact}"
    );
    assert!(
        !client
            .interrupt(&session.id)
            .await
            .expect("interrupt")
            .interrupted
    );

    // Typed errors.
    let missing = client.session("ses_missing").await.expect_err("no session");
    assert_eq!(
        missing.kind(),
        Some(wire::ErrorType::SessionNotFound),
        "{missing}"
    );
    let output = client
        .tool_output(&session.id, "msg_none", "call_none")
        .await
        .expect_err("no such call");
    assert!(output.kind().is_some(), "{output}");
    let mut gone = client.events("ses_missing", None);
    match tokio::time::timeout(LIMIT, gone.next())
        .await
        .expect("in time")
    {
        Some(Err(e)) => assert_eq!(e.kind(), Some(wire::ErrorType::SessionNotFound)),
        other => panic!("expected the API error: {other:?}"),
    }
    assert!(gone.next().await.is_none());
}
