//! The crash-point matrix: one scripted turn with text, two tool calls (one idempotent, one not),
//! a retryable failure, a stream cut after output and an automatic compaction, with a queued
//! follow-up admitted behind it, stopped after every durable operation, by SIGKILL-like abort or
//! by graceful shutdown, then restarted. After the restart both inputs are answered in order (the
//! follow-up only once the turn was answered), no non-idempotent tool ran twice, nothing is left
//! open, the claim is released and the projections equal a replay of the log.
//!
//! The turn runs in a child process (this test binary, re-entered) whose store commits every
//! operation on its own (`max_batch = 1`), so a commit is one durable operation; the store's
//! commit hook stops it right after commit `n`. A stop point the run never reaches fails the
//! test. The short matrix (a spread of operations) runs in CI; the full one (every operation,
//! both ways) with `AGENTHOST_SOAK=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_actors::{CreateSession, Extensions, PromptRequest, Runtime, Tool, Tools};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_llm::{ErrorKind, FinishReason, Request};
use agenthost_model::{Message, MessageId, SessionId};
use agenthost_store::{Config as StoreConfig, RedbStore, Store};

use crate::harness;
use crate::recovery::Journal;

const CHILD_ENV: &str = "AGENTHOST_MATRIX_CHILD";
const STOP_ENV: &str = "AGENTHOST_MATRIX_STOP";
const SESSION: &str = "ses_matrix";
/// Long enough that the summary has something to replace.
const FIRST: &str = "first question, with context; ";
const TURN: &str = "the matrix turn";
const SUMMARY: &str = "summary of the earlier work";
const ANSWER: &str = "all done";
/// The follow-up queued behind the turn, and its answer.
const FOLLOW_UP: &str = "and one more thing";
const FOLLOW_UP_ANSWER: &str = "the one more thing";

/// How the child stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Runs to the end and reports how many commits the turn took.
    Never,
    /// Aborts the process right after commit `n` is durable.
    Kill(usize),
    /// Shuts the runtime down gracefully right after commit `n`.
    Term(usize),
}

impl Stop {
    fn env(self) -> String {
        match self {
            Stop::Never => "never".into(),
            Stop::Kill(n) => format!("kill:{n}"),
            Stop::Term(n) => format!("term:{n}"),
        }
    }

    fn parse(s: &str) -> Stop {
        match s.split_once(':') {
            Some(("kill", n)) => Stop::Kill(n.parse().expect("n")),
            Some(("term", n)) => Stop::Term(n.parse().expect("n")),
            _ => Stop::Never,
        }
    }
}

/// Answers by what the request holds, so a restarted process continues the same script. A
/// marker file makes the retryable failure and the cut happen once across processes.
fn respond(dir: &Path, request: &Request) -> Script {
    let seen = format!("{:?} {:?}", request.system, request.messages);
    let once = |name: &str| {
        let marker = dir.join(name);
        if marker.exists() {
            return false;
        }
        std::fs::write(&marker, b"").expect("marker");
        true
    };
    if seen.contains(agenthost_actors::SUMMARY_REQUEST) {
        return crate::harness::summary(SUMMARY);
    }
    // A queued input that joined before the turn was answered would take the turn's answer
    // away: `check` then finds the turn unanswered.
    if seen.contains(FOLLOW_UP) {
        return Script::new()
            .text(FOLLOW_UP_ANSWER)
            .finish(FinishReason::Stop);
    }
    if !seen.contains(TURN) {
        return Script::new()
            .text("first answer")
            .finish(FinishReason::Stop);
    }
    let summarized = seen.contains(SUMMARY);
    let tool_results = request
        .messages
        .iter()
        .any(|m| matches!(m, agenthost_llm::Message::Tool(_)));
    if !summarized {
        // Too long until the earlier exchange is summarized: automatic compaction.
        return Script::new().error(agenthost_llm::Error::context_overflow("prompt is too long"));
    }
    if !tool_results {
        if once("failed") {
            return Script::new().error(agenthost_llm::Error::new(
                ErrorKind::ProviderInternal { overloaded: true },
                "overloaded",
            ));
        }
        return Script::new()
            .text("checking")
            .tool_call("c1", "charge", "{}")
            .tool_call("c2", "sync", "{}")
            .finish(FinishReason::ToolCalls);
    }
    if once("cut") {
        return Script::new()
            .text("partial")
            .error(agenthost_llm::Error::incomplete("connection reset"));
    }
    Script::new().text(ANSWER).finish(FinishReason::Stop)
}

fn config(
    dir: &Path,
    stop: Stop,
    commits: Arc<AtomicUsize>,
    armed: Arc<AtomicBool>,
    term: Arc<tokio::sync::Notify>,
) -> (agenthost_actors::Config, Extensions) {
    let responder = dir.to_path_buf();
    let provider = Arc::new(Scripted::from_fn(move |request| {
        Some(respond(&responder, request))
    }));
    let mut config = harness::config(dir, provider);
    // Every operation commits on its own: the matrix stops after each, not after a batch.
    config.store.max_batch = 1;
    config.compaction.auto = true;
    config.compaction.keep_tokens = 50;
    config.store.on_commit = Some(Arc::new(move |_events| {
        if !armed.load(Ordering::SeqCst) {
            return;
        }
        let n = commits.fetch_add(1, Ordering::SeqCst) + 1;
        match stop {
            Stop::Kill(at) if n == at => std::process::abort(),
            Stop::Term(at) if n == at => term.notify_one(),
            _ => {}
        }
    }));
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "charge",
        "charges a card (not idempotent)",
        serde_json::json!({"type": "object"}),
        Arc::new(Journal {
            path: dir.join("charge"),
        }),
    ));
    let mut sync = Tool::new(
        "sync",
        "syncs (idempotent)",
        serde_json::json!({"type": "object"}),
        Arc::new(Journal {
            path: dir.join("sync"),
        }),
    );
    sync.idempotent = true;
    tools.register(sync);
    if let Some(agent) = config.agents.get_mut("default") {
        agent.tools = vec!["*".into()];
    }
    let extensions = Extensions {
        tools,
        hooks: Vec::new(),
    };
    (config, extensions)
}

/// Entry point of the child process; does nothing in a normal test run.
#[test]
fn crash_matrix_child_entry() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let stop = Stop::parse(&std::env::var(STOP_ENV).unwrap_or_default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async move {
        let commits = Arc::new(AtomicUsize::new(0));
        let armed = Arc::new(AtomicBool::new(false));
        let term = Arc::new(tokio::sync::Notify::new());
        let (config, extensions) = config(&dir, stop, commits.clone(), armed.clone(), term.clone());
        let runtime = Runtime::start_with(config, extensions)
            .await
            .expect("start");
        let s = SessionId::parse(SESSION).expect("id");
        let fresh = runtime
            .snapshot()
            .expect("snap")
            .session(&s)
            .expect("read")
            .is_none();
        let work = async {
            if fresh {
                runtime
                    .create_session(CreateSession {
                        id: Some(s.clone()),
                        ..Default::default()
                    })
                    .await
                    .expect("session");
                runtime
                    .prompt(PromptRequest::new(&s, FIRST.repeat(40)))
                    .await
                    .expect("first");
                runtime
                    .wait_idle(&s, Duration::from_secs(60))
                    .await
                    .expect("first answered");
                // The turn's commits are counted from its admission on.
                armed.store(true, Ordering::SeqCst);
            }
            // Admitted again after a restart, as a client retrying would: an exact retry returns
            // the original receipt, and admits what a stop prevented.
            let mut turn = PromptRequest::new(&s, TURN);
            turn.id = Some(MessageId::parse("msg_matrix").expect("id"));
            runtime.prompt(turn).await.expect("turn admitted");
            let mut follow_up = PromptRequest::new(&s, FOLLOW_UP);
            follow_up.id = Some(MessageId::parse("msg_matrix_queued").expect("id"));
            follow_up.delivery = agenthost_model::Delivery::Queue;
            runtime.prompt(follow_up).await.expect("follow-up admitted");
            runtime.recovered().await;
            runtime
                .wait_idle(&s, Duration::from_secs(120))
                .await
                .expect("idle");
        };
        tokio::select! {
            _ = work => {}
            _ = term.notified() => println!("stopped"),
        }
        runtime.shutdown().await;
        println!("commits {}", commits.load(Ordering::SeqCst));
    });
    // Leave before the test harness prints anything the parent might misread.
    std::process::exit(0);
}

/// Runs the child once and returns the commits it counted (for a run to the end).
fn child(dir: &Path, stop: Stop) -> Option<usize> {
    let exe = std::env::current_exe().expect("test binary");
    let output = Command::new(exe)
        .args([
            "crash_matrix::crash_matrix_child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .env(STOP_ENV, stop.env())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stop {
        Stop::Kill(_) => assert!(!output.status.success(), "the child was to abort: {stdout}"),
        Stop::Term(_) => {
            assert!(output.status.success(), "child failed: {stdout}");
            assert!(
                stdout.lines().any(|l| l.trim_end().ends_with("stopped")),
                "the run never reached the stop point {stop:?}: {stdout}"
            );
        }
        Stop::Never => assert!(output.status.success(), "child failed: {stdout}"),
    }
    stdout.lines().find_map(|l| {
        l.find("commits ")
            .map(|at| l[at + 8..].trim().parse().expect("n"))
    })
}

/// What every stop must leave after the restart.
fn check(dir: &Path, stop: Stop) {
    let store = RedbStore::open(StoreConfig::new(dir.join("store.redb"))).expect("reopen");
    let snap = store.snapshot().expect("snap");
    let s = SessionId::parse(SESSION).expect("id");
    let row = snap.session(&s).expect("read").expect("row");
    let events = snap
        .events(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events");
    let log: Vec<String> = events
        .iter()
        .map(|e| format!("{} {:?}", e.seq, e.event))
        .collect();
    let context = || format!("stopped with {stop:?}:\n{}", log.join("\n"));
    assert!(row.claim.is_none(), "still claimed; {}", context());
    assert_eq!(row.pending, 0, "pending input; {}", context());
    let messages = snap
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    assert!(
        agenthost_model::owed::leftovers(&messages).is_empty(),
        "left open; {}",
        context()
    );
    // The turn is answered before the follow-up is promoted, and the follow-up after it.
    let says = |m: &Message, answer: &str| match m {
        Message::Assistant(a) => {
            a.finish.is_some()
                && a.parts.iter().any(
                    |p| matches!(p, agenthost_model::Part::Text { text, .. } if text == answer),
                )
        }
        _ => false,
    };
    let follow_up = messages
        .iter()
        .position(|m| matches!(m, Message::User { prompt, .. } if prompt.text == FOLLOW_UP))
        .unwrap_or_else(|| panic!("the follow-up was never promoted; {}", context()));
    let turn_answered = messages[..follow_up].iter().any(|m| says(m, ANSWER));
    assert!(
        turn_answered,
        "the queued follow-up joined before the turn was answered; {}",
        context()
    );
    let last = messages
        .iter()
        .rev()
        .find(|m| matches!(m, Message::Assistant(_)));
    assert!(
        last.is_some_and(|m| says(m, FOLLOW_UP_ANSWER)),
        "the follow-up is unanswered; {}",
        context()
    );
    for (key, n) in Journal::starts(&dir.join("charge")) {
        assert_eq!(n, 1, "the charge {key} ran {n} times; {}", context());
    }
    let verified = agenthost_store::verify(&*snap).expect("readable");
    assert!(verified.ok(), "{:?}; {}", verified.differences, context());
    store.close();
}

#[test]
fn every_commit_boundary_of_a_turn_survives_a_kill_and_a_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let boundaries = child(dir.path(), Stop::Never).expect("the turn's commits");
    check(dir.path(), Stop::Never);
    // The turn has every shape the matrix is about.
    let kinds: Vec<&'static str> = {
        let store = RedbStore::open(StoreConfig::new(dir.path().join("store.redb"))).expect("open");
        let s = SessionId::parse(SESSION).expect("id");
        let events = store
            .snapshot()
            .expect("snap")
            .events(&s, agenthost_model::Seq::ZERO, usize::MAX)
            .expect("events");
        store.close();
        events.iter().map(|e| e.event.kind()).collect()
    };
    for (kind, n) in [
        ("compaction_ended", 1),
        ("retry_scheduled", 2),
        ("tool_succeeded", 2),
        ("step_failed", 1),
    ] {
        let seen = kinds.iter().filter(|k| **k == kind).count();
        assert!(seen >= n, "{kind} {seen} times: {kinds:?}");
    }
    eprintln!("crash matrix: {boundaries} commit boundaries");
    assert!(
        boundaries >= 10,
        "a turn of {boundaries} commits is too short to mean much"
    );
    let stops: Vec<Stop> = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        (1..=boundaries)
            .flat_map(|n| [Stop::Kill(n), Stop::Term(n)])
            .collect()
    } else {
        // A spread of boundaries, both ways: the admission, the compaction, the tools, the cut.
        let at = |f: usize| (boundaries * f / 8).max(1);
        vec![
            Stop::Kill(1),
            Stop::Term(at(2)),
            Stop::Kill(at(3)),
            Stop::Term(at(4)),
            Stop::Kill(at(5)),
            Stop::Term(at(6)),
            Stop::Kill(at(7)),
            Stop::Kill(boundaries),
        ]
    };
    for stop in stops {
        let dir = tempfile::tempdir().expect("tempdir");
        child(dir.path(), stop);
        child(dir.path(), Stop::Never);
        check(dir.path(), stop);
    }
}
