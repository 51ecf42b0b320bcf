//! Restart recovery (SPEC §12): claims, the boot sweep, attempt limits, and a real process killed
//! with SIGKILL mid-drain.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{
    Call, Config, CreateSession, Executor, Extensions, PromptRequest, RESTART_NOTE, RecoveryMode,
    Runtime, STOPPED_TOOL, Tool, Tools,
};
use agenthost_llm::scripted::Scripted;
use agenthost_model::{Event, IndexEntry, Message, MessageId, Part, SessionId, ToolState};
use agenthost_store::{Config as StoreConfig, NewSession, RedbStore, Store};
use futures::future::BoxFuture;

use crate::harness::{self, text};

/// Appends `start <key>` before and `end <key>` after its work, fsynced, so a test can see
/// whether a call ran twice across processes.
#[derive(Debug)]
struct Journal {
    path: PathBuf,
}

impl Journal {
    fn write(path: &Path, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("journal");
        // One write per line: O_APPEND keeps concurrent writers' lines whole.
        f.write_all(format!("{line}\n").as_bytes()).expect("write");
        f.sync_data().expect("sync");
    }

    fn starts(path: &Path) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        if let Ok(text) = std::fs::read_to_string(path) {
            for key in text.lines().filter_map(|l| l.strip_prefix("start ")) {
                *counts.entry(key.to_owned()).or_default() += 1;
            }
        }
        counts
    }
}

impl Executor for Journal {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        let path = self.path.clone();
        Box::pin(async move {
            let key = call.idempotency_key();
            Journal::write(&path, &format!("start {key}"));
            tokio::time::sleep(Duration::from_millis(30)).await;
            Journal::write(&path, &format!("end {key}"));
            Ok("charged".into())
        })
    }
}

fn runtime_config(dir: &Path) -> (Config, Extensions) {
    let mock = agenthost_llm::Mock::new(agenthost_llm::mock::Config {
        latency: Duration::from_millis(5),
        tokens_per_second: 400.0,
        tool_call_ratio: 1.0,
        reply_tokens: 8,
        seed: 7,
    });
    let mut config = Config::new(dir.join("store.redb")).with_provider("mock", Arc::new(mock));
    // Kills land before, during and after folds of the store's front.
    config.store.fold_rows = 7;
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "charge",
        "charges a card (not idempotent)",
        serde_json::json!({"type": "object"}),
        Arc::new(Journal {
            path: dir.join("journal"),
        }),
    ));
    (
        config,
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
}

const CHILD_ENV: &str = "AGENTHOST_RUNTIME_CHILD";

/// Entry point of the child process; does nothing in a normal test run.
#[test]
fn runtime_child_entry() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async move {
        let (config, extensions) = runtime_config(&dir);
        let runtime = Runtime::start_with(config, extensions)
            .await
            .expect("start");
        let round: usize = std::env::var("AGENTHOST_ROUND")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        for n in 0..6 {
            let id = SessionId::parse(&format!("ses_r{round}n{n}")).expect("id");
            runtime
                .create_session(CreateSession {
                    id: Some(id.clone()),
                    ..Default::default()
                })
                .await
                .expect("session");
            for p in 0..2 {
                let receipt = runtime
                    .prompt(PromptRequest::new(&id, format!("task {p}")))
                    .await
                    .expect("admitted");
                let mut out = std::io::stdout().lock();
                writeln!(out, "ack {id} {}", receipt.id).expect("stdout");
                out.flush().expect("flush");
            }
        }
        // Keep working until killed.
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

#[test]
fn sessions_resume_after_sigkill_without_repeating_tools() {
    let rounds = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        20
    } else {
        2
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut acked: BTreeSet<(SessionId, MessageId)> = BTreeSet::new();
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args([
                "recovery::runtime_child_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .env("AGENTHOST_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness may print its own text before ours on the same line.
                if let Some(at) = line.find("ack ses_")
                    && tx.send(line[at + 4..].to_owned()).is_err()
                {
                    break;
                }
            }
        });
        let prefix = format!("ses_r{round}n");
        while acked
            .iter()
            .filter(|(s, _)| s.as_str().starts_with(&prefix))
            .count()
            < 12
        {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the child acknowledges");
            let (s, id) = line.split_once(' ').expect("two fields");
            acked.insert((
                SessionId::parse(s).expect("s"),
                MessageId::parse(id).expect("id"),
            ));
        }
        // Let drains get into their tools, then kill mid-flight.
        let journal = dir.path().join("journal");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while Journal::starts(&journal).len() < 2 * (round + 1)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(7 * (round as u64 % 5)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        reader.join().expect("reader");
    }

    // A new runtime over the same store resumes everything without any prompt or resume.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let (config, extensions) = runtime_config(dir.path());
        let runtime = Runtime::start_with(config, extensions)
            .await
            .expect("restart");
        runtime.recovered().await;
        let sessions: BTreeSet<SessionId> = acked.iter().map(|(s, _)| s.clone()).collect();
        for s in &sessions {
            runtime
                .wait_idle(s, Duration::from_secs(60))
                .await
                .expect("idle");
        }
        let snap = runtime.snapshot().expect("snapshot");
        for (s, id) in &acked {
            match snap.index(id).expect("index") {
                Some(IndexEntry::Prompt {
                    session,
                    promoted_seq: Some(_),
                    ..
                }) => assert_eq!(&session, s),
                other => panic!("acknowledged input {id} not promoted: {other:?}"),
            }
        }
        for s in &sessions {
            let row = snap.session(s).expect("read").expect("row");
            assert!(row.claim.is_none(), "{s} still claimed");
            assert_eq!(row.pending, 0, "{s} has pending input");
            let messages = snap
                .messages(s, agenthost_model::Seq::ZERO, usize::MAX)
                .expect("messages");
            let last = messages
                .iter()
                .rev()
                .find(|m| matches!(m, Message::Assistant(_)));
            match last {
                Some(Message::Assistant(a)) => {
                    let log: Vec<String> = snap
                        .events(s, agenthost_model::Seq::ZERO, usize::MAX)
                        .expect("events")
                        .iter()
                        .map(|e| format!("{} {:?}", e.seq, e.event))
                        .collect();
                    // Answered, or explicitly failed after too many interrupted recoveries.
                    let answered = a.finish.is_some();
                    let failed = a.is_settled() && row.halted.is_some();
                    assert!(
                        answered || failed,
                        "{s} ends unanswered: {a:?}\n{}",
                        log.join("\n")
                    )
                }
                _ => panic!("{s} was never answered"),
            }
            // Every tool call is settled; those cut off by a kill say so.
            for m in &messages {
                if let Message::Assistant(a) = m {
                    for p in &a.parts {
                        if let Part::Tool(t) = p {
                            assert!(
                                !matches!(t.state, ToolState::Running),
                                "{s}: unsettled tool"
                            );
                        }
                    }
                }
            }
        }
        runtime.shutdown().await;
    });
    let starts = Journal::starts(&dir.path().join("journal"));
    assert!(!starts.is_empty(), "tools ran");
    for (key, n) in &starts {
        assert_eq!(*n, 1, "non-idempotent call {key} ran {n} times");
    }
    // A call the kill cut off (started, never ended) was failed as stopped, not run again.
    let journal = std::fs::read_to_string(dir.path().join("journal")).expect("journal");
    let ended: BTreeSet<&str> = journal
        .lines()
        .filter_map(|l| l.strip_prefix("end "))
        .collect();
    let store = RedbStore::open(StoreConfig::new(dir.path().join("store.redb"))).expect("reopen");
    let projections = store.snapshot().expect("snap").projections().expect("rows");
    for key in starts.keys().filter(|k| !ended.contains(k.as_str())) {
        let mut parts = key.splitn(3, '/');
        let (s, m, call) = (
            parts.next().expect("s"),
            parts.next().expect("m"),
            parts.next().expect("c"),
        );
        let state = projections
            .messages
            .iter()
            .find_map(|((session, _), message)| match message {
                Message::Assistant(a) if session.as_str() == s && a.id.as_str() == m => {
                    a.tool(call).map(|t| t.state.clone())
                }
                _ => None,
            })
            .expect("the interrupted call is recorded");
        assert_eq!(
            state,
            ToolState::Error {
                error: STOPPED_TOOL.into()
            },
            "{key}"
        );
    }
    let logs = store.snapshot().expect("snap").logs().expect("logs");
    let replayed =
        agenthost_model::Projections::replay(logs.iter().map(|(s, l)| (s, l.as_slice())))
            .expect("replay");
    assert_eq!(projections, replayed);
}

/// Leaves a session claimed, as a crashed process would, with `attempts` recoveries already
/// counted.
async fn crashed_session(path: &Path, attempts: u32) -> SessionId {
    let store = RedbStore::open(StoreConfig::new(path)).expect("store");
    let s = SessionId::parse("ses_crashed").expect("id");
    store
        .create_session(NewSession {
            id: s.clone(),
            agent: "default".into(),
            model: None,
            title: None,
        })
        .await
        .expect("created");
    store
        .admit(agenthost_store::Admission {
            session: s.clone(),
            id: MessageId::parse("msg_lost").expect("id"),
            prompt: agenthost_model::Prompt::text("finish this"),
            delivery: agenthost_model::Delivery::Steer,
        })
        .await
        .expect("admitted");
    let mut events = vec![Event::ExecutionStarted { forced: false }];
    if attempts > 0 {
        events.push(Event::RecoveryAttempted { attempt: attempts });
    }
    store.append(s.clone(), events).await.expect("claimed");
    store.close();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_boot_sweep_resumes_a_claimed_session_once_with_a_restart_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = crashed_session(&path, 0).await;
    let provider = Arc::new(Scripted::new([text("resumed")]));
    let runtime = Runtime::start(harness::config(dir.path(), provider.clone()))
        .await
        .expect("start");
    runtime.recovered().await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(provider.calls(), 1);
    let request = provider.last_request().expect("request");
    let notes = request
        .messages
        .iter()
        .filter(|m| matches!(m, agenthost_llm::Message::User { text, .. } if text.contains(RESTART_NOTE)))
        .count();
    assert_eq!(notes, 1, "exactly one restart note");
    let row = runtime
        .snapshot()
        .expect("snap")
        .session(&s)
        .expect("read")
        .expect("row");
    assert!(row.claim.is_none());
    assert_eq!(
        row.resume_attempts, 0,
        "a settled execution resets the count"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_gives_up_after_max_attempts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = crashed_session(&path, 10).await;
    let provider = Arc::new(Scripted::new([]));
    let runtime = Runtime::start(harness::config(dir.path(), provider.clone()))
        .await
        .expect("start");
    runtime.recovered().await;
    let snap = runtime.snapshot().expect("snap");
    let row = snap.session(&s).expect("read").expect("row");
    assert!(row.claim.is_none(), "the claim is released");
    assert!(
        row.halted
            .as_deref()
            .is_some_and(|h| h.contains("interrupted repeatedly")),
        "{row:?}"
    );
    assert_eq!(provider.calls(), 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_mode_leaves_claimed_sessions_for_an_explicit_resume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = crashed_session(&path, 0).await;
    let provider = Arc::new(Scripted::new([text("on request")]));
    let mut config = harness::config(dir.path(), provider.clone());
    config.recovery.mode = RecoveryMode::Pause;
    let runtime = Runtime::start(config).await.expect("start");
    runtime.recovered().await;
    assert_eq!(provider.calls(), 0);
    assert!(
        runtime
            .snapshot()
            .expect("snap")
            .claimed()
            .expect("claimed")
            .contains(&s)
    );
    let outcome = runtime.resume(&s).await.expect("resumed");
    assert_eq!(outcome, agenthost_actors::Outcome::Completed { steps: 1 });
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_the_claim_of_an_interrupted_drain() {
    let gate = agenthost_llm::scripted::Gate::new();
    let script = agenthost_llm::scripted::Script::new()
        .gate(&gate)
        .text("x")
        .finish(agenthost_llm::FinishReason::Stop);
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(Scripted::new([script]));
    let runtime = Runtime::start(harness::config(dir.path(), provider.clone()))
        .await
        .expect("start");
    let s = runtime
        .create_session(CreateSession::default())
        .await
        .expect("s")
        .id;
    runtime
        .prompt(PromptRequest::new(&s, "long job"))
        .await
        .expect("admitted");
    gate.reached().await;
    runtime.shutdown().await;
    assert!(matches!(
        runtime.wake(&s).await,
        Err(agenthost_actors::Error::ShuttingDown)
    ));
    // Shutdown released the store: it reopens, with the claim kept.
    let store = RedbStore::open(StoreConfig::new(dir.path().join("store.redb"))).expect("reopen");
    let snap = store.snapshot().expect("snap");
    assert!(
        snap.session(&s)
            .expect("read")
            .expect("row")
            .claim
            .is_some(),
        "claim kept for recovery"
    );
    let kinds: Vec<_> = snap
        .events(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events")
        .into_iter()
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(kinds.last(), Some(&"execution_interrupted"));
}

/// Starts a runtime over the store in `dir`, lets the boot sweep run, and waits until `session`
/// is idle again.
async fn restart(
    dir: &Path,
    provider: Arc<Scripted>,
    tools: Tools,
    session: &SessionId,
) -> Runtime {
    let extensions = Extensions {
        tools,
        hooks: Vec::new(),
    };
    let runtime = Runtime::start_with(harness::config(dir, provider), extensions)
        .await
        .expect("start");
    runtime.recovered().await;
    runtime
        .wait_idle(session, Duration::from_secs(30))
        .await
        .expect("idle");
    runtime
}

/// Records the idempotency key of every execution.
#[derive(Debug, Default)]
struct Keys(std::sync::Mutex<Vec<String>>);

impl Executor for Keys {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        self.0.lock().expect("lock").push(call.idempotency_key());
        Box::pin(async { Ok("done again".to_owned()) })
    }
}

/// A crashed session whose last step called `tool` and never settled it.
async fn crashed_mid_tool(path: &Path, tool: &str) -> (SessionId, MessageId) {
    let s = crashed_session(path, 0).await;
    let store = RedbStore::open(StoreConfig::new(path)).expect("store");
    let a = MessageId::parse("msg_assistant").expect("id");
    store
        .append(
            s.clone(),
            vec![Event::PromptPromoted {
                id: MessageId::parse("msg_lost").expect("id"),
            }],
        )
        .await
        .expect("promoted");
    let events = vec![
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
            input: "{}".into(),
        },
    ];
    store.append(s.clone(), events).await.expect("mid-tool");
    store.close();
    (s, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_tool_cut_off_by_a_crash_runs_again_with_the_same_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let (s, a) = crashed_mid_tool(&path, "sync").await;
    let keys = Arc::new(Keys::default());
    let mut tool = Tool::new("sync", "idempotent", serde_json::json!({}), keys.clone());
    tool.idempotent = true;
    let mut tools = Tools::default();
    tools.register(tool);
    let provider = Arc::new(Scripted::new([text("after the tool")]));
    let runtime = restart(dir.path(), provider.clone(), tools, &s).await;
    assert_eq!(*keys.0.lock().expect("lock"), [format!("{s}/{a}/c1")]);
    let snap = runtime.snapshot().expect("snap");
    let messages = snap
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    let settled = messages.iter().find_map(|m| match m {
        Message::Assistant(x) if x.id == a => x.tool("c1").map(|t| t.state.clone()),
        _ => None,
    });
    assert_eq!(
        settled,
        Some(ToolState::Completed {
            output: "done again".into(),
            truncated: false
        })
    );
    assert_eq!(provider.calls(), 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_idempotent_tool_cut_off_by_a_crash_is_failed_not_repeated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let (s, _) = crashed_mid_tool(&path, "charge").await;
    let keys = Arc::new(Keys::default());
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "charge",
        "not idempotent",
        serde_json::json!({}),
        keys.clone(),
    ));
    let provider = Arc::new(Scripted::new([text("told the user")]));
    let runtime = restart(dir.path(), provider.clone(), tools, &s).await;
    assert!(
        keys.0.lock().expect("lock").is_empty(),
        "never executed again"
    );
    let request = provider.last_request().expect("resumed");
    assert!(request.messages.iter().any(
        |m| matches!(m, agenthost_llm::Message::Tool(r) if r.is_error && r.output == STOPPED_TOOL)
    ));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_off_leaves_claimed_sessions_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = crashed_session(&path, 0).await;
    let provider = Arc::new(Scripted::new([]));
    let mut config = harness::config(dir.path(), provider.clone());
    config.recovery.mode = RecoveryMode::Off;
    let runtime = Runtime::start(config).await.expect("start");
    runtime.recovered().await;
    let row = runtime
        .snapshot()
        .expect("snap")
        .session(&s)
        .expect("read")
        .expect("row");
    assert!(row.claim.is_some());
    assert_eq!(row.resume_attempts, 0, "not even counted");
    assert_eq!(provider.calls(), 0);
    runtime.shutdown().await;
}
