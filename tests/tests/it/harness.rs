//! A runtime over a temporary store with a scripted provider, and helpers to read what happened.

use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Activity, Config, CreateSession, Extensions, Live, PromptRequest, Runtime};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_model::{Event, Seq, SessionId};
use tokio::sync::broadcast;

pub struct Harness {
    /// Kept so the store outlives the test.
    _dir: tempfile::TempDir,
    pub runtime: Runtime,
    pub provider: Arc<Scripted>,
    events: broadcast::Receiver<Arc<(SessionId, Live)>>,
}

pub fn config(dir: &std::path::Path, provider: Arc<Scripted>) -> Config {
    let mut config = Config::new(dir.join("store.redb")).with_provider("scripted", provider);
    config.supervision.backoff = Duration::from_millis(1);
    // Fold the store's front every few rows, so every scenario reads and writes across both
    // tiers and several generations.
    config.store.fold_rows = 7;
    config
}

impl Harness {
    pub async fn start(scripts: impl IntoIterator<Item = Script>) -> Harness {
        Harness::start_with(scripts, |_| {}, Extensions::default()).await
    }

    pub async fn start_with(
        scripts: impl IntoIterator<Item = Script>,
        tweak: impl FnOnce(&mut Config),
        extensions: Extensions,
    ) -> Harness {
        Harness::over(Arc::new(Scripted::new(scripts)), tweak, extensions).await
    }

    /// A runtime over `provider` (one that answers by function, say).
    pub async fn over(
        provider: Arc<Scripted>,
        tweak: impl FnOnce(&mut Config),
        extensions: Extensions,
    ) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = config(dir.path(), provider.clone());
        tweak(&mut config);
        let runtime = Runtime::start_with(config, extensions)
            .await
            .expect("runtime starts");
        let events = runtime.subscribe();
        Harness {
            _dir: dir,
            runtime,
            provider,
            events,
        }
    }

    pub async fn session(&self) -> SessionId {
        self.runtime
            .create_session(CreateSession::default())
            .await
            .expect("session")
            .id
    }

    /// Admits `text` and wakes the session.
    pub async fn prompt(&self, session: &SessionId, text: &str) {
        self.runtime
            .prompt(PromptRequest::new(session, text))
            .await
            .expect("admitted");
    }

    /// Waits until the session has no drain and no follow-up pending.
    pub async fn idle(&self, session: &SessionId) {
        self.runtime
            .wait_idle(session, Duration::from_secs(30))
            .await
            .expect("the session went idle");
    }

    /// The session's row as the store has it now.
    pub fn row(&self, session: &SessionId) -> agenthost_model::SessionRow {
        self.runtime
            .snapshot()
            .expect("snapshot")
            .session(session)
            .expect("read")
            .expect("the session exists")
    }

    /// Admits `text` without waking.
    pub async fn admit(&self, session: &SessionId, text: &str) {
        let mut request = PromptRequest::new(session, text);
        request.resume = false;
        self.runtime.prompt(request).await.expect("admitted");
    }

    /// The durable log of a session as event kinds.
    /// The sessions of the provider's requests, in the order they were made.
    pub fn request_order(&self) -> Vec<String> {
        self.provider
            .requests()
            .iter()
            .map(|r| r.prompt_cache_key.clone().unwrap_or_default())
            .collect()
    }

    pub fn kinds(&self, session: &SessionId) -> Vec<&'static str> {
        self.log(session).iter().map(|e| e.kind()).collect()
    }

    pub fn log(&self, session: &SessionId) -> Vec<Event> {
        let snap = self.runtime.snapshot().expect("snapshot");
        snap.events(session, Seq::ZERO, usize::MAX)
            .expect("events")
            .into_iter()
            .map(|s| s.event)
            .collect()
    }

    pub fn count(&self, session: &SessionId, kind: &str) -> usize {
        self.kinds(session).iter().filter(|k| **k == kind).count()
    }

    /// Waits until the session reports `running: false`, `n` times from now.
    pub async fn drains_finished(&mut self, session: &SessionId, n: usize) -> usize {
        let mut started = 0;
        let mut finished = 0;
        while finished < n {
            let event = tokio::time::timeout(Duration::from_secs(30), self.events.recv())
                .await
                .expect("drain finished in time")
                .expect("bus open");
            if &event.0 == session {
                match event.1 {
                    Live::Status(Activity::Running) => started += 1,
                    Live::Status(_) => finished += 1,
                    _ => {}
                }
            }
        }
        started
    }

    /// Checks that projections equal a replay of the log.
    pub fn assert_replay_equal(&self) {
        let snap = self.runtime.snapshot().expect("snapshot");
        let verified = agenthost_store::verify(&*snap).expect("readable");
        assert!(verified.ok(), "{:#?}", verified.differences);
    }
}

pub fn text(s: &str) -> Script {
    Script::new()
        .text(s)
        .finish(agenthost_llm::FinishReason::Stop)
}

/// A text reply that waits at `gate` before its first token.
pub fn gated(gate: &agenthost_llm::scripted::Gate, s: &str) -> Script {
    Script::new()
        .gate(gate)
        .text(s)
        .finish(agenthost_llm::FinishReason::Stop)
}

/// The text of every user-side message of a request, in order.
/// A runtime over a store in `dir` and `provider`, with one session that `text` was admitted to.
pub async fn started_with_prompt(
    dir: &std::path::Path,
    provider: Arc<Scripted>,
    text: &str,
) -> (Runtime, SessionId) {
    let runtime = Runtime::start(config(dir, provider)).await.expect("start");
    let s = runtime
        .create_session(CreateSession::default())
        .await
        .expect("session")
        .id;
    runtime
        .prompt(PromptRequest::new(&s, text))
        .await
        .expect("admitted");
    (runtime, s)
}

/// A compaction's summary reply that follows the template, each section saying `what`.
pub fn summary(what: &str) -> Script {
    let reply: String = agenthost_actors::SUMMARY_SECTIONS
        .iter()
        .map(|section| format!("## {section}\n{what}\n\n"))
        .collect();
    Script::new()
        .text(reply)
        .finish(agenthost_llm::FinishReason::Stop)
}

pub fn user_texts(request: &agenthost_llm::Request) -> Vec<String> {
    request
        .messages
        .iter()
        .filter_map(|m| match m {
            agenthost_llm::Message::User { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}
