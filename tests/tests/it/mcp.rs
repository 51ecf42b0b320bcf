//! Tools from real MCP servers through the runtime (ARCHITECTURE.md, "MCP tool servers"): the
//! fixture server on the official Python SDK over stdio and streamable HTTP, and the reference
//! server-everything; deadlines and interrupts cancel calls on the server, a server that dies
//! fails its calls and comes back, `tools/list_changed` brings new tools, and a restart runs a
//! cut call again only as the crash rule says. Needs the fixtures (`.ci/mcp-fixtures`); without
//! them each test says so in one line and returns.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Extensions, PromptRequest, Runtime, STOPPED_TOOL};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_llm::{FinishReason, Request};
use agenthost_mcp::testing::Fixtures;
use agenthost_mcp::{Mcp, ServerConfig, State, Transport};
use agenthost_model::{Event, MessageId, SessionId};
use agenthost_store::{Config as StoreConfig, NewSession, RedbStore, Store};

use crate::harness::{self, text};

fn fixtures() -> Option<Fixtures> {
    agenthost_mcp::testing::fixtures("the MCP tests")
}

/// The fixture over stdio, journaling to `journal`.
fn stdio(f: &Fixtures, name: &str, journal: &Path, extra: &[(&str, &str)]) -> ServerConfig {
    let mut env: BTreeMap<String, String> = extra
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.insert("FIXTURE_JOURNAL".into(), journal.display().to_string());
    ServerConfig {
        name: name.into(),
        transport: Transport::Stdio {
            command: vec![
                f.python.display().to_string(),
                f.server.display().to_string(),
                "stdio".into(),
            ],
            env,
            cwd: None,
        },
        trusted: true,
        call_timeout: Duration::from_secs(30),
        idempotent: Vec::new(),
    }
}

/// The fixture served over streamable HTTP by a child process, killed when dropped.
struct HttpFixture {
    child: std::process::Child,
    url: String,
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpFixture {
    fn start(f: &Fixtures, journal: &Path) -> HttpFixture {
        let mut child = std::process::Command::new(&f.python)
            .arg(&f.server)
            .args(["http", "0"])
            .env("FIXTURE_JOURNAL", journal)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the HTTP fixture starts");
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        // Keeps draining its stderr, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the HTTP fixture says where it listens");
        HttpFixture { child, url }
    }

    fn config(&self, name: &str) -> ServerConfig {
        ServerConfig {
            name: name.into(),
            transport: Transport::Http {
                url: self.url.clone(),
                headers: BTreeMap::new(),
            },
            trusted: false,
            call_timeout: Duration::from_secs(30),
            idempotent: Vec::new(),
        }
    }
}

/// Waits until every server is ready (bounded).
async fn ready(mcp: &Mcp) {
    for _ in 0..600 {
        if mcp.status().iter().all(|s| s.state == State::Ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the MCP servers did not get ready: {:#?}", mcp.status());
}

async fn runtime(dir: &Path, provider: Arc<Scripted>) -> Runtime {
    let runtime = Runtime::start_with(harness::config(dir, provider), Extensions::default())
        .await
        .expect("start");
    runtime.recovered().await;
    runtime
}

async fn turn(runtime: &Runtime, text: &str) -> SessionId {
    let s = runtime
        .create_session(Default::default())
        .await
        .expect("session")
        .id;
    runtime
        .prompt(PromptRequest::new(&s, text))
        .await
        .expect("admitted");
    runtime
        .wait_idle(&s, Duration::from_secs(60))
        .await
        .expect("idle");
    s
}

/// The results the provider saw, by call id: `(error?, output)`.
fn results(request: &Request) -> BTreeMap<String, (bool, String)> {
    request
        .messages
        .iter()
        .filter_map(|m| match m {
            agenthost_llm::Message::Tool(r) => {
                Some((r.call_id.clone(), (r.is_error, r.output.clone())))
            }
            _ => None,
        })
        .collect()
}

fn calls(calls: &[(&str, &str, &str)]) -> Script {
    let mut script = Script::new();
    for (id, name, input) in calls {
        script = script.tool_call(*id, *name, *input);
    }
    script.finish(FinishReason::ToolCalls)
}

fn journal(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_tools_of_a_stdio_and_an_http_server() {
    let Some(f) = fixtures() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (j1, j2) = (
        dir.path().join("files.journal"),
        dir.path().join("web.journal"),
    );
    let http = HttpFixture::start(&f, &j2);
    let provider = Arc::new(Scripted::new([
        calls(&[
            ("c1", "files_read_note", r#"{"name": "a"}"#),
            ("c2", "web_put_note", r#"{"name": "b", "text": "hi"}"#),
            ("c3", "web_fail", "{}"),
            ("c4", "web_structured", "{}"),
        ]),
        text("done"),
    ]));
    let runtime = runtime(dir.path(), provider.clone()).await;
    let mcp = Mcp::start(
        &runtime,
        vec![stdio(&f, "files", &j1, &[]), http.config("web")],
    );
    ready(&mcp).await;
    let tools = runtime.tools().current();
    for name in [
        "files_read_note",
        "files_slow",
        "web_put_note",
        "web_structured",
    ] {
        assert!(tools.get(name).is_some(), "{name} is published");
    }
    // A trusted server's read-only tool runs again after a stop; an untrusted one's does not.
    assert!(tools.get("files_read_note").is_some_and(|t| t.idempotent));
    assert!(tools.get("files_send_mail").is_some_and(|t| !t.idempotent));
    assert!(tools.get("web_put_note").is_some_and(|t| !t.idempotent));
    let status = mcp.status();
    let files = status.iter().find(|s| s.name == "files").expect("files");
    let read = files
        .tools
        .iter()
        .find(|t| t.original == "read_note")
        .expect("read_note listed");
    assert_eq!((read.read_only, read.reruns), (Some(true), true));

    let s = turn(&runtime, "use the tools").await;
    let seen = results(&provider.requests()[1]);
    assert_eq!(seen["c1"], (false, "note a".to_owned()));
    assert_eq!(seen["c2"], (false, "stored b".to_owned()));
    assert_eq!(seen["c3"], (true, "it failed on purpose".to_owned()));
    assert!(
        seen["c4"].1.contains("42") && !seen["c4"].0,
        "{:?}",
        seen["c4"]
    );
    // The idempotency key travels in `_meta`.
    let message = runtime
        .snapshot()
        .expect("snap")
        .events(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events")
        .into_iter()
        .find_map(|e| match e.event {
            Event::ToolCalled { id, .. } => Some(id),
            _ => None,
        })
        .expect("a call");
    assert_eq!(journal(&j1), [format!("read_note {s}/{message}/c1")]);
    assert_eq!(journal(&j2), [format!("put_note {s}/{message}/c2")]);
    runtime.shutdown().await;
    mcp.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_or_interrupted_is_cancelled_on_the_server() {
    let Some(f) = fixtures() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("journal");
    let provider = Arc::new(Scripted::new([
        calls(&[("c1", "files_slow", r#"{"ms": 20000}"#)]),
        text("too slow"),
        calls(&[("c2", "files_slow", r#"{"ms": 20000}"#)]),
    ]));
    let runtime = runtime(dir.path(), provider.clone()).await;
    let mut config = stdio(&f, "files", &j, &[]);
    config.call_timeout = Duration::from_millis(500);
    let mcp = Mcp::start(&runtime, vec![config]);
    ready(&mcp).await;
    turn(&runtime, "wait").await;
    let seen = results(&provider.requests()[1]);
    assert!(
        seen["c1"].0 && seen["c1"].1.contains("timed out"),
        "{seen:?}"
    );
    cancelled_on_the_server(&mcp, 1).await;

    // An interrupt cancels a call the same way.
    let s = runtime
        .create_session(Default::default())
        .await
        .expect("session")
        .id;
    runtime
        .prompt(PromptRequest::new(&s, "wait again"))
        .await
        .expect("admitted");
    for _ in 0..400 {
        if journal(&j).len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(journal(&j).len(), 2, "the second call started");
    assert!(runtime.interrupt(&s).await.expect("interrupt"));
    cancelled_on_the_server(&mcp, 2).await;
    runtime.shutdown().await;
    mcp.stop(Duration::from_secs(5)).await;
}

/// Waits until the server's stderr says `n` calls were cancelled.
async fn cancelled_on_the_server(mcp: &Mcp, n: usize) {
    for _ in 0..400 {
        let stderr = mcp.status()[0].stderr.clone();
        if stderr
            .iter()
            .filter(|l| l.contains("slow cancelled"))
            .count()
            >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the server saw no cancellation: {:#?}", mcp.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_fails_the_call_and_comes_back_with_its_tools() {
    let Some(f) = fixtures() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("journal");
    let provider = Arc::new(Scripted::new([
        calls(&[("c1", "files_crash", "{}")]),
        text("it crashed"),
        calls(&[("c2", "files_read_note", r#"{"name": "x"}"#)]),
        text("read it"),
    ]));
    let runtime = runtime(dir.path(), provider.clone()).await;
    let mcp = Mcp::start(
        &runtime,
        vec![stdio(&f, "files", &j, &[("FIXTURE_LIST_CHANGED", "1")])],
    );
    ready(&mcp).await;
    // `tools/list_changed` brings the tool the server adds a second after it started.
    for _ in 0..400 {
        if runtime.tools().current().get("files_late").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(runtime.tools().current().get("files_late").is_some());

    turn(&runtime, "crash it").await;
    let seen = results(&provider.requests()[1]);
    assert!(seen["c1"].0);
    assert!(seen["c1"].1.contains("may or may not"), "{seen:?}");
    for _ in 0..400 {
        let status = &mcp.status()[0];
        if status.state == State::Ready && status.restarts >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let status = &mcp.status()[0];
    assert_eq!(status.state, State::Ready, "{status:#?}");
    assert!(status.restarts >= 1);
    assert!(
        status
            .stderr
            .iter()
            .any(|l| l.contains("exiting with status 3")),
        "the stderr tail is kept: {status:#?}"
    );
    turn(&runtime, "read it").await;
    let seen = results(&provider.requests()[3]);
    assert_eq!(seen["c2"], (false, "note x".to_owned()));
    runtime.shutdown().await;
    mcp.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_of_server_everything_run_through_a_session() {
    let Some(f) = fixtures() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(Scripted::new([
        calls(&[
            ("c1", "everything_echo", r#"{"message": "hello"}"#),
            ("c2", "everything_get-sum", r#"{"a": 2, "b": 3}"#),
        ]),
        text("done"),
    ]));
    let runtime = runtime(dir.path(), provider.clone()).await;
    let config = ServerConfig {
        name: "everything".into(),
        transport: Transport::Stdio {
            command: vec![f.everything.display().to_string(), "stdio".into()],
            env: BTreeMap::new(),
            cwd: None,
        },
        trusted: false,
        call_timeout: Duration::from_secs(30),
        idempotent: Vec::new(),
    };
    let mcp = Mcp::start(&runtime, vec![config]);
    ready(&mcp).await;
    assert!(mcp.status()[0].tools.len() >= 5, "{:#?}", mcp.status());
    turn(&runtime, "echo").await;
    let seen = results(&provider.requests()[1]);
    assert_eq!(seen["c1"], (false, "Echo: hello".to_owned()));
    assert!(seen["c2"].1.contains('5') && !seen["c2"].0, "{seen:?}");
    runtime.shutdown().await;
    mcp.stop(Duration::from_secs(5)).await;
}

/// A store a process left with the call `tool` of `server` recorded and never settled.
async fn crashed_mid_call(path: &Path, tool: &str) -> (SessionId, MessageId) {
    let store = RedbStore::open(StoreConfig::new(path)).expect("store");
    let s = SessionId::parse("ses_mcpcrash").expect("id");
    store
        .create_session(NewSession {
            id: s.clone(),
            agent: "default".into(),
            model: None,
            title: None,
        })
        .await
        .expect("session");
    let (input, a) = (
        MessageId::parse("msg_input").expect("id"),
        MessageId::parse("msg_assistant").expect("id"),
    );
    store
        .admit(agenthost_store::Admission {
            session: s.clone(),
            id: input.clone(),
            prompt: agenthost_model::Prompt::text("read it"),
            delivery: agenthost_model::Delivery::Steer,
            wake: true,
        })
        .await
        .expect("admitted");
    store
        .append(
            s.clone(),
            vec![
                Event::ExecutionStarted { forced: false },
                Event::PromptPromoted { id: input },
                Event::StepStarted {
                    id: a.clone(),
                    step: 1,
                    agent: "default".into(),
                    model: "m".into(),
                },
                Event::ToolCalled {
                    id: a.clone(),
                    call_id: "c1".into(),
                    name: tool.into(),
                    input: r#"{"name": "a", "to": "b"}"#.into(),
                },
            ],
        )
        .await
        .expect("mid-call");
    store.close();
    (s, a)
}

/// The crash rule: a cut call runs again (same key) only for a trusted server's annotated
/// tool; an untrusted server's annotations, or no annotations, leave it "may or may not".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_a_cut_call_again_only_as_the_crash_rule_says() {
    let Some(f) = fixtures() else { return };
    for (tool, trusted, reruns) in [
        ("files_read_note", true, true),
        ("files_read_note", false, false),
        ("files_send_mail", true, false),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = dir.path().join("journal");
        let (s, a) = crashed_mid_call(&dir.path().join("store.redb"), tool).await;
        let provider = Arc::new(Scripted::new([text("after the restart")]));
        // The server starts with the runtime: recovery waits for its tools.
        let runtime = Runtime::start_with(
            harness::config(dir.path(), provider.clone()),
            Extensions::default(),
        )
        .await
        .expect("start");
        let mut config = stdio(&f, "files", &j, &[]);
        config.trusted = trusted;
        let mcp = Mcp::start(&runtime, vec![config]);
        runtime.recovered().await;
        runtime
            .wait_idle(&s, Duration::from_secs(60))
            .await
            .expect("idle");
        let seen = results(&provider.requests()[0]);
        let original = tool.trim_start_matches("files_");
        match reruns {
            true => {
                assert_eq!(journal(&j), [format!("{original} {s}/{a}/c1")], "{tool}");
                assert!(!seen["c1"].0, "{tool}: {seen:?}");
            }
            false => {
                assert!(journal(&j).is_empty(), "{tool} ran again");
                assert_eq!(seen["c1"], (true, STOPPED_TOOL.to_owned()), "{tool}");
            }
        }
        runtime.shutdown().await;
        mcp.stop(Duration::from_secs(5)).await;
    }
}
