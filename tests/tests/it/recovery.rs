//! Restart recovery: claims, the boot sweep, attempt limits, and a real process killed
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
pub(crate) struct Journal {
    pub(crate) path: PathBuf,
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

    pub(crate) fn starts(path: &Path) -> BTreeMap<String, usize> {
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
    let snap = store.snapshot().expect("snap");
    for key in starts.keys().filter(|k| !ended.contains(k.as_str())) {
        let mut parts = key.splitn(3, '/');
        let (s, m, call) = (
            parts.next().expect("s"),
            parts.next().expect("m"),
            parts.next().expect("c"),
        );
        let session = SessionId::parse(s).expect("session id");
        let state = snap
            .messages(&session, agenthost_model::Seq::ZERO, usize::MAX)
            .expect("messages")
            .into_iter()
            .find_map(|message| match message {
                Message::Assistant(a) if a.id.as_str() == m => {
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
    let verified = agenthost_store::verify(&*snap).expect("readable");
    assert!(verified.ok(), "{:#?}", verified.differences);
}

/// Opens the store at `path` with session `s` of `agent` created.
async fn store_with_session(path: &Path, s: &SessionId, agent: &str) -> RedbStore {
    let store = RedbStore::open(StoreConfig::new(path)).expect("store");
    store
        .create_session(NewSession {
            id: s.clone(),
            agent: agent.into(),
            model: None,
            title: None,
        })
        .await
        .expect("created");
    store
}

/// Leaves a session claimed, as a crashed process would, with `attempts` recoveries already
/// counted.
async fn crashed_session(path: &Path, attempts: u32) -> SessionId {
    let s = SessionId::parse("ses_crashed").expect("id");
    let store = store_with_session(path, &s, "default").await;
    store
        .admit(agenthost_store::Admission {
            session: s.clone(),
            id: MessageId::parse("msg_lost").expect("id"),
            prompt: agenthost_model::Prompt::text("finish this"),
            delivery: agenthost_model::Delivery::Steer,
            wake: true,
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

/// Partition ownership moved by hand: one partition, held or not, and the lease changes a test
/// sends, as a store shared by several nodes would report them.
#[derive(Debug)]
struct HandOwnership {
    held: std::sync::atomic::AtomicBool,
    version: std::sync::atomic::AtomicU64,
    changes: tokio::sync::broadcast::Sender<agenthost_store::Lease>,
}

impl HandOwnership {
    fn new() -> Arc<Self> {
        Arc::new(HandOwnership {
            held: false.into(),
            version: 1.into(),
            changes: tokio::sync::broadcast::channel(8).0,
        })
    }

    /// Takes the partition: the version moves first, then the change is sent, as a lease
    /// renewal would do it.
    fn take(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.held.store(true, SeqCst);
        let version = self.version.fetch_add(1, SeqCst) + 1;
        self.changes
            .send(agenthost_store::Lease::Gained(vec![0], version))
            .expect("the runtime follows the lease");
    }
}

impl agenthost_store::Ownership for HandOwnership {
    fn node(&self) -> &str {
        "n1"
    }
    fn partitions(&self) -> u32 {
        1
    }
    fn owns(&self, _: &SessionId) -> bool {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn owner(&self, _: &SessionId) -> Option<agenthost_store::Node> {
        None
    }
    fn view(&self) -> agenthost_store::ClusterView {
        agenthost_store::ClusterView::default()
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<agenthost_store::Lease> {
        self.changes.subscribe()
    }
    fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_idle_waits_for_the_sweep_of_a_partition_just_taken_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = crashed_session(&path, 0).await;
    let ownership = HandOwnership::new();
    let provider = Arc::new(Scripted::new([text("resumed")]));
    let mut config = harness::config(dir.path(), provider.clone());
    config.store.ownership = Some(ownership.clone());
    let runtime = Runtime::start(config).await.expect("start");
    runtime.recovered().await;
    let claimed = |runtime: &Runtime| {
        let snap = runtime.snapshot().expect("snap");
        snap.session(&s)
            .expect("read")
            .expect("row")
            .claim
            .is_some()
    };
    assert!(
        claimed(&runtime),
        "another node's session is not this node's to recover"
    );
    assert_eq!(provider.calls(), 0);

    // The partition comes here; `wait_idle` asks before the takeover's sweep has run.
    ownership
        .held
        .store(true, std::sync::atomic::Ordering::SeqCst);
    ownership
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let waiting = tokio::spawn({
        let (runtime, s) = (runtime.clone(), s.clone());
        async move { runtime.wait_idle(&s, Duration::from_secs(30)).await }
    });
    // Long enough for an answer that did not wait for the sweep (a missing wait fails here;
    // a slow machine can only make this pass, never fail).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "wait_idle answered before the takeover's sweep resumed the session"
    );
    ownership
        .changes
        .send(agenthost_store::Lease::Gained(
            vec![0],
            ownership.version.load(std::sync::atomic::Ordering::SeqCst),
        ))
        .expect("the runtime follows the lease");
    waiting.await.expect("joined").expect("idle");
    assert!(!claimed(&runtime), "idle means recovered and settled");
    assert_eq!(provider.calls(), 1, "resumed once");

    // A later takeover with nothing owed is handled as quickly.
    ownership.take();
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(provider.calls(), 1);
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
    let (runtime, s) = harness::started_with_prompt(dir.path(), provider.clone(), "long job").await;
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
    crashed_mid_tool_after(path, tool, 0).await
}

/// [`crashed_mid_tool`], with `attempts` recoveries already counted.
async fn crashed_mid_tool_after(path: &Path, tool: &str, attempts: u32) -> (SessionId, MessageId) {
    let s = crashed_session(path, attempts).await;
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

/// Appends `events` to the crashed session of [`crashed_session`] (claimed, "finish this"
/// admitted as `msg_lost`), as a process that died right after writing them would leave it.
async fn crashed_after(path: &Path, events: Vec<Event>) -> SessionId {
    let s = crashed_session(path, 0).await;
    let store = RedbStore::open(StoreConfig::new(path)).expect("store");
    let mut all = vec![Event::PromptPromoted {
        id: MessageId::parse("msg_lost").expect("id"),
    }];
    all.extend(events);
    store.append(s.clone(), all).await.expect("appended");
    store.close();
    s
}

fn kinds(runtime: &Runtime, s: &SessionId) -> Vec<&'static str> {
    log(runtime, s).iter().map(|e| e.kind()).collect()
}

fn log(runtime: &Runtime, s: &SessionId) -> Vec<Event> {
    runtime
        .snapshot()
        .expect("snap")
        .events(s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

/// The session's last assistant message ended with a finish reason, its claim is released and
/// nothing is left open.
fn assert_answered(runtime: &Runtime, s: &SessionId) {
    let snap = runtime.snapshot().expect("snap");
    let row = snap.session(s).expect("read").expect("row");
    let messages = snap
        .messages(s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    let kinds = kinds(runtime, s);
    assert!(row.claim.is_none(), "still claimed: {kinds:?}");
    assert!(
        agenthost_model::owed::leftovers(&messages).is_empty(),
        "left open: {kinds:?}"
    );
    match messages
        .iter()
        .rev()
        .find(|m| matches!(m, Message::Assistant(_)))
    {
        Some(Message::Assistant(a)) => assert!(a.finish.is_some(), "unanswered: {kinds:?}"),
        _ => panic!("never answered: {kinds:?}"),
    }
}

fn step(id: &MessageId) -> Event {
    Event::StepStarted {
        id: id.clone(),
        step: 1,
        agent: "default".into(),
        model: "m".into(),
    }
}

fn provider_error() -> agenthost_model::StepError {
    agenthost_model::StepError {
        kind: agenthost_model::FailureKind::Provider,
        message: "connection reset".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cut_by_a_graceful_shutdown_is_answered_after_the_restart() {
    let gate = agenthost_llm::scripted::Gate::new();
    let slow = agenthost_llm::scripted::Script::new()
        .text("half")
        .gate(&gate)
        .text(" of it")
        .finish(agenthost_llm::FinishReason::Stop);
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(Scripted::new([slow]));
    let runtime = Runtime::start(harness::config(dir.path(), provider))
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

    let provider = Arc::new(Scripted::new([text("the whole answer")]));
    let runtime = restart(dir.path(), provider.clone(), Tools::default(), &s).await;
    assert_eq!(
        provider.calls(),
        1,
        "the owed turn is run: {:?}",
        kinds(&runtime, &s)
    );
    assert_answered(&runtime, &s);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_continuation_backoff_still_answers_the_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let a = MessageId::parse("msg_cut").expect("id");
    let s = crashed_after(
        &path,
        vec![
            step(&a),
            Event::TextEnded {
                id: a.clone(),
                text: "partial".into(),
                incomplete: true,
            },
            Event::RetryScheduled {
                id: a.clone(),
                attempt: 1,
                delay_ms: 2000,
                error: provider_error(),
            },
            Event::StepFailed {
                id: a,
                error: provider_error(),
            },
        ],
    )
    .await;
    let provider = Arc::new(Scripted::new([text("the rest")]));
    let runtime = restart(dir.path(), provider.clone(), Tools::default(), &s).await;
    assert_eq!(provider.calls(), 1, "{:?}", kinds(&runtime, &s));
    assert_answered(&runtime, &s);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_retry_backoff_still_answers_the_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let a = MessageId::parse("msg_retry").expect("id");
    let retry = Event::RetryScheduled {
        id: a.clone(),
        attempt: 1,
        delay_ms: 2000,
        error: provider_error(),
    };
    let s = crashed_after(&path, vec![step(&a), retry]).await;
    let provider = Arc::new(Scripted::new([text("answered")]));
    let runtime = restart(dir.path(), provider.clone(), Tools::default(), &s).await;
    assert_eq!(provider.calls(), 1, "{:?}", kinds(&runtime, &s));
    assert_answered(&runtime, &s);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_cut_by_a_crash_is_settled_and_its_turn_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let c = MessageId::parse("msg_compaction").expect("id");
    let started = Event::CompactionStarted {
        id: c.clone(),
        auto: true,
    };
    let s = crashed_after(&path, vec![started]).await;
    let provider = Arc::new(Scripted::new([text("answered")]));
    let runtime = restart(dir.path(), provider.clone(), Tools::default(), &s).await;
    assert_answered(&runtime, &s);
    assert!(
        log(&runtime, &s)
            .iter()
            .any(|e| matches!(e, Event::CompactionFailed { id, .. } if *id == c)),
        "{:?}",
        kinds(&runtime, &s)
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_compaction_cut_by_a_crash_is_settled_without_a_model_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = SessionId::parse("ses_compacting").expect("id");
    let c = MessageId::parse("msg_compaction").expect("id");
    {
        let store = store_with_session(&path, &s, "default").await;
        let events = vec![
            Event::ExecutionStarted { forced: false },
            Event::CompactionStarted {
                id: c.clone(),
                auto: false,
            },
        ];
        store.append(s.clone(), events).await.expect("compacting");
        store.close();
    }
    let provider = Arc::new(Scripted::new([]));
    let runtime = restart(dir.path(), provider.clone(), Tools::default(), &s).await;
    assert_eq!(provider.calls(), 0);
    let kinds = kinds(&runtime, &s);
    assert!(
        kinds.ends_with(&["compaction_failed", "execution_succeeded"]),
        "{kinds:?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_agent_is_gone_fails_readably_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = SessionId::parse("ses_orphan").expect("id");
    {
        let store = store_with_session(&path, &s, "removed").await;
        store
            .admit(agenthost_store::Admission {
                session: s.clone(),
                id: MessageId::parse("msg_orphan").expect("id"),
                prompt: agenthost_model::Prompt::text("hello?"),
                delivery: agenthost_model::Delivery::Steer,
                wake: true,
            })
            .await
            .expect("admitted");
        // A crash in an earlier drain left it claimed.
        let claimed = vec![Event::ExecutionStarted { forced: false }];
        store.append(s.clone(), claimed).await.expect("claimed");
        store.close();
    }
    for boot in 0..3 {
        let provider = Arc::new(Scripted::new([]));
        let runtime = restart(dir.path(), provider.clone(), Tools::default(), &s).await;
        let log = log(&runtime, &s);
        let failures: Vec<&str> = log
            .iter()
            .filter_map(|e| match e {
                Event::ExecutionFailed { error, .. } => Some(error.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(failures.len(), 1, "boot {boot}: {log:?}");
        assert!(failures[0].contains("removed"), "{failures:?}");
        let attempts = log
            .iter()
            .filter(|e| matches!(e, Event::RecoveryAttempted { .. }))
            .count();
        assert_eq!(attempts, 1, "boot {boot}: counted once, then settled");
        let row = runtime
            .snapshot()
            .expect("snap")
            .session(&s)
            .expect("read")
            .expect("row");
        assert!(row.claim.is_none());
        assert_eq!(provider.calls(), 0);
        runtime.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_prompted_right_after_start_gets_exactly_one_restart_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = crashed_session(&path, 0).await;
    let provider = Arc::new(Scripted::new([text("one"), text("two")]));
    let runtime = Runtime::start(harness::config(dir.path(), provider.clone()))
        .await
        .expect("start");
    // Prompted before the sweep got to it.
    runtime
        .prompt(PromptRequest::new(&s, "and this"))
        .await
        .expect("admitted");
    runtime.recovered().await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    let log = log(&runtime, &s);
    let notes = log
        .iter()
        .filter(|e| matches!(e, Event::InstructionsUpdated { text, .. } if text == RESTART_NOTE))
        .count();
    let attempts = log
        .iter()
        .filter(|e| matches!(e, Event::RecoveryAttempted { .. }))
        .count();
    assert_eq!((notes, attempts), (1, 1), "{log:?}");
    assert_answered(&runtime, &s);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_session_prompted_right_after_start_gets_no_restart_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    // Another session a previous process left claimed keeps the sweep busy.
    crashed_session(&path, 0).await;
    let provider = Arc::new(Scripted::new([text("one"), text("two")]));
    let runtime = Runtime::start(harness::config(dir.path(), provider.clone()))
        .await
        .expect("start");
    let fresh = runtime
        .create_session(CreateSession::default())
        .await
        .expect("s")
        .id;
    runtime
        .prompt(PromptRequest::new(&fresh, "new work"))
        .await
        .expect("admitted");
    runtime.recovered().await;
    runtime
        .wait_idle(&fresh, Duration::from_secs(30))
        .await
        .expect("idle");
    let kinds = kinds(&runtime, &fresh);
    assert!(!kinds.contains(&"instructions_updated"), "{kinds:?}");
    assert!(!kinds.contains(&"recovery_attempted"), "{kinds:?}");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_runs_no_tool_and_counts_the_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let (s, _) = crashed_mid_tool_after(&path, "sync", 10).await;
    let keys = Arc::new(Keys::default());
    let mut tool = Tool::new("sync", "idempotent", serde_json::json!({}), keys.clone());
    tool.idempotent = true;
    let mut tools = Tools::default();
    tools.register(tool);
    let provider = Arc::new(Scripted::new([]));
    let runtime = restart(dir.path(), provider.clone(), tools, &s).await;
    assert!(keys.0.lock().expect("lock").is_empty(), "nothing runs");
    let log = log(&runtime, &s);
    assert!(
        log.iter()
            .any(|e| matches!(e, Event::RecoveryAttempted { attempt: 11 })),
        "{log:?}"
    );
    let snap = runtime.snapshot().expect("snap");
    let row = snap.session(&s).expect("read").expect("row");
    assert!(row.halted.is_some() && row.claim.is_none(), "{row:?}");
    let messages = snap
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    assert!(agenthost_model::owed::leftovers(&messages).is_empty());
    assert_eq!(provider.calls(), 0);
    runtime.shutdown().await;
}

/// An interrupt wins however it races a restart. Sent while no actor runs a claimed session
/// (the boot sweep has not reached it: here recovery is paused), it ends the turn the crash cut
/// as a user interrupt would have (the open step aborted, the claim released) and runs nothing;
/// a later wake owes nothing, so the turn is not resumed behind the user's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_before_recovery_reaches_a_claimed_session_ends_its_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let s = SessionId::parse("ses_cut").expect("id");
    let store = store_with_session(&path, &s, "default").await;
    let input = MessageId::parse("msg_asked").expect("id");
    let step = MessageId::parse("msg_cut_step").expect("id");
    store
        .admit(agenthost_store::Admission {
            session: s.clone(),
            id: input.clone(),
            prompt: agenthost_model::Prompt::text("a long job"),
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
                    id: step.clone(),
                    step: 1,
                    agent: "default".into(),
                    model: "scripted".into(),
                },
            ],
        )
        .await
        .expect("cut mid-step");
    store.close();
    drop(store);

    let provider = Arc::new(Scripted::new([text("resumed anyway")]));
    let mut config = harness::config(dir.path(), provider.clone());
    config.recovery.mode = RecoveryMode::Pause;
    let runtime = Runtime::start(config).await.expect("start");
    runtime.recovered().await;
    assert_eq!(
        runtime.interrupt(&s).await,
        Ok(true),
        "the cut turn is ended"
    );
    let snap = runtime.snapshot().expect("snap");
    let row = snap.session(&s).expect("read").expect("row");
    assert!(row.claim.is_none(), "the claim is released: {row:?}");
    let aborted = snap
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages")
        .into_iter()
        .any(|m| matches!(m, Message::Assistant(a) if a.id == step && a.error.as_ref().is_some_and(|e| e.kind == agenthost_model::FailureKind::Aborted)));
    assert!(aborted, "the open step is closed as aborted");
    drop(snap);
    runtime.wake(&s).await.expect("wake");
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(provider.calls(), 0, "the interrupted turn was not resumed");
    // A session with nothing running and nothing left by a stopped run: a no-op.
    assert_eq!(runtime.interrupt(&s).await, Ok(false));
    runtime.shutdown().await;
}
