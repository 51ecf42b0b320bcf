//! Session-aware generate: the laws, checked against the durable path.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_actors::{
    Call, Error, Executor, Extensions, Hook, Purpose, RequestContext, Tool, ToolReport, Tools,
};
use agenthost_llm::scripted::{Gate, Script};
use agenthost_llm::{ErrorKind, FinishReason, Message, Request, ToolChoice};
use futures::future::BoxFuture;

use crate::harness::{Harness, text, user_texts};

#[derive(Debug, Default)]
struct Counter(AtomicUsize);

impl Executor for Counter {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok("ran".to_owned()) })
    }
}

/// Adds a header to every request and counts tool observations.
#[derive(Debug, Default)]
struct Tagger {
    tools_seen: AtomicUsize,
}

impl Hook for Tagger {
    fn on_request(&self, ctx: &RequestContext, request: &mut Request) {
        // The same transformation for steps and generate: parity is what the test checks.
        assert!(matches!(ctx.purpose, Purpose::Step | Purpose::Generate));
        request.headers.insert("x-tagged", "yes");
    }
    fn on_tool(&self, _report: &ToolReport) {
        self.tools_seen.fetch_add(1, Ordering::SeqCst);
    }
}

struct Setup {
    h: Harness,
    counter: Arc<Counter>,
    tagger: Arc<Tagger>,
}

async fn setup(scripts: Vec<Script>) -> Setup {
    let counter = Arc::new(Counter::default());
    let tagger = Arc::new(Tagger::default());
    let mut tools = Tools::default();
    tools.register(Tool::new(
        "lookup",
        "looks things up",
        serde_json::json!({"type": "object"}),
        counter.clone(),
    ));
    let extensions = Extensions {
        tools,
        hooks: vec![tagger.clone() as Arc<dyn Hook>],
    };
    let h = Harness::start_with(scripts, |_| {}, extensions).await;
    Setup { h, counter, tagger }
}

/// Everything the store holds for every session, as read through the snapshot.
fn contents(h: &Harness) -> String {
    let snap = h.runtime.snapshot().expect("snapshot");
    let mut out = String::new();
    for row in snap.sessions(None, usize::MAX).expect("sessions") {
        let s = &row.id;
        let all = agenthost_model::Seq::ZERO;
        out.push_str(&format!(
            "{row:?}\n{:?}\n{:?}\n{:?}\n{:?}\n",
            snap.messages(s, all, usize::MAX).expect("messages"),
            snap.pending(s).expect("pending"),
            snap.instructions(s).expect("instructions"),
            snap.events(s, all, usize::MAX).expect("events"),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_equals_the_step_request_with_calls_forbidden_plus_the_prompt_and_changes_nothing()
{
    let t = setup(vec![
        text("first answer"),
        text("recap: we said hello"),
        text("forced step"),
    ])
    .await;
    let h = &t.h;
    let s = h.session().await;
    h.prompt(&s, "hello").await;
    h.idle(&s).await;

    let before = contents(h);
    let answer = h
        .runtime
        .generate(&s, "summarize where we left off")
        .await
        .expect("generated");
    assert_eq!(answer, "recap: we said hello");
    assert_eq!(contents(h), before, "generate changed the store");

    // The durable path at the same state: a forced step from the same history.
    h.runtime.resume(&s).await.expect("resumed");
    let requests = h.provider.requests();
    let (generate, step) = (&requests[1], &requests[2]);
    assert!(!step.tools.is_empty() && step.tool_choice == ToolChoice::Auto);
    // The same tool definitions (providers refuse tool blocks in history without them, and the
    // prompt-cache prefix stays the step's), with calls forbidden.
    assert_eq!(generate.tools, step.tools);
    assert_eq!(generate.tool_choice, ToolChoice::None);
    let mut expected = step.messages.clone();
    expected.push(Message::user("summarize where we left off"));
    assert_eq!(generate.messages, expected);
    assert_eq!(generate.system, step.system);
    assert_eq!(generate.model, step.model);
    assert_eq!(
        generate.prompt_cache_key, step.prompt_cache_key,
        "cache identity"
    );
    assert_eq!(generate.prompt_cache_key.as_deref(), Some(s.as_str()));
    let headers = |r: &Request| {
        r.headers
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect::<Vec<_>>()
    };
    assert_eq!(headers(generate), headers(step));
    assert!(
        headers(generate).contains(&("x-tagged".into(), "yes".into())),
        "hook parity"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_provider_is_called_once_and_nothing_is_retried() {
    let failing = Script::new().error(agenthost_llm::Error::rate_limit(Some(
        Duration::from_millis(1),
    )));
    let t = setup(vec![failing]).await;
    let s = t.h.session().await;
    let before = contents(&t.h);
    let result = t.h.runtime.generate(&s, "anything").await;
    assert!(
        matches!(&result, Err(Error::Provider(e)) if e.kind() == ErrorKind::RateLimit),
        "{result:?}"
    );
    assert_eq!(t.h.provider.calls(), 1);
    assert_eq!(contents(&t.h), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_in_the_answer_run_nothing_and_empty_answers_are_success() {
    let with_tool = Script::new()
        .tool_call("c1", "lookup", "{}")
        .finish(FinishReason::ToolCalls);
    let empty = Script::new().finish(FinishReason::Stop);
    let t = setup(vec![with_tool, empty]).await;
    let s = t.h.session().await;
    assert_eq!(
        t.h.runtime.generate(&s, "use a tool").await,
        Ok(String::new())
    );
    assert_eq!(
        t.h.runtime.generate(&s, "say nothing").await,
        Ok(String::new())
    );
    assert_eq!(t.counter.0.load(Ordering::SeqCst), 0, "no tool ran");
    assert_eq!(
        t.tagger.tools_seen.load(Ordering::SeqCst),
        0,
        "no tool hook ran"
    );
    assert_eq!(t.h.kinds(&s), ["session_created"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_runs_during_a_drain_from_settled_history_without_pending_input() {
    let gate = Gate::new();
    let drain = Script::new()
        .tool_call("c1", "lookup", "{}")
        .gate(&gate)
        .finish(FinishReason::ToolCalls);
    let t = setup(vec![
        text("first"),
        drain,
        text("aside"),
        text("after tools"),
    ])
    .await;
    let h = &t.h;
    let s = h.session().await;
    h.prompt(&s, "one").await;
    h.idle(&s).await;
    h.prompt(&s, "two").await;
    gate.reached().await;
    // The drain is mid-step with a tool call recorded and unresolved; another input is pending.
    // The step's promotion and its events so far go to the store as the stream waits.
    while !h.kinds(&s).contains(&"tool_called") {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    h.admit(&s, "three").await;
    assert_eq!(h.runtime.active(), vec![s.clone()]);
    let answer = h
        .runtime
        .generate(&s, "aside?")
        .await
        .expect("generated while draining");
    assert_eq!(answer, "aside");
    let request = h.provider.last_request().expect("recorded");
    let users = user_texts(&request);
    // Settled history only: stops before the unsettled assistant; pending input excluded.
    assert_eq!(users, ["one", "two", "aside?"]);
    assert!(
        !request
            .messages
            .iter()
            .any(|m| matches!(m, Message::Tool(_)))
    );
    gate.release();
    h.idle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sessions_and_overflow_fail_before_any_provider_call() {
    let t = setup(vec![]).await;
    let unknown = agenthost_model::SessionId::parse("ses_nobody").expect("id");
    assert_eq!(
        t.h.runtime.generate(&unknown, "hi").await,
        Err(Error::SessionNotFound(unknown.clone()))
    );
    let s = t.h.session().await;
    let huge = "word ".repeat(200_000);
    let mut request = agenthost_actors::PromptRequest::new(&s, huge);
    request.resume = false;
    t.h.runtime.prompt(request).await.expect("admitted");
    t.h.runtime.resume(&s).await.ok();
    let result = t.h.runtime.generate(&s, "recap").await;
    assert!(
        matches!(result, Err(Error::ContextOverflow(_))),
        "{result:?}"
    );
    assert!(t.h.provider.calls() <= 1, "generate itself made no call");
    let calls_before = t.h.provider.calls();
    let _ = t.h.runtime.generate(&s, "recap").await;
    assert_eq!(t.h.provider.calls(), calls_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_instruction_source_reaches_the_generate_request_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("RULES.md");
    std::fs::write(&rules, "Rule one.").expect("write");
    let path = rules.clone();
    let h = Harness::start_with(
        [text("answer"), text("transient")],
        move |c| {
            c.instructions = vec![agenthost_actors::Instruction::File {
                name: "rules".into(),
                path,
            }]
        },
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "hello").await;
    h.idle(&s).await;
    std::fs::write(&rules, "Rule two.").expect("rewrite");
    let before = contents(&h);
    let told_before = h
        .runtime
        .snapshot()
        .expect("snap")
        .instructions(&s)
        .expect("read");
    assert_eq!(
        h.runtime.generate(&s, "recap").await,
        Ok("transient".into())
    );
    assert_eq!(
        contents(&h),
        before,
        "no event, no instruction state written"
    );
    assert_eq!(
        h.runtime
            .snapshot()
            .expect("snap")
            .instructions(&s)
            .expect("read"),
        told_before
    );
    let request = h.provider.last_request().expect("recorded");
    let texts = user_texts(&request);
    assert!(texts[0].contains("Rule one."));
    assert!(texts.iter().any(|t| t.contains("Rule two.")), "{texts:?}");
    assert_eq!(texts.last().map(String::as_str), Some("recap"));
}

/// Holds `generate` between its snapshot and its provider call until the test lets it go.
#[derive(Debug)]
struct Pause {
    reached: tokio::sync::Notify,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Hook for Pause {
    fn on_request(&self, ctx: &RequestContext, _request: &mut Request) {
        if ctx.purpose == Purpose::Generate {
            self.reached.notify_one();
            // Hooks run on the preparer's blocking thread: waiting here blocks nothing else.
            let _ = self.go.lock().expect("lock").recv();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_uses_the_state_at_its_start_even_if_a_drain_appends_before_its_call() {
    let (go, wait) = std::sync::mpsc::channel();
    let pause = Arc::new(Pause {
        reached: tokio::sync::Notify::new(),
        go: std::sync::Mutex::new(wait),
    });
    let h = Harness::start_with(
        [text("one"), text("two"), text("generated")],
        |_| {},
        Extensions {
            tools: Tools::default(),
            hooks: vec![pause.clone() as Arc<dyn Hook>],
        },
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "first").await;
    h.idle(&s).await;
    let generate = tokio::spawn({
        let (r, s) = (h.runtime.clone(), s.clone());
        async move { r.generate(&s, "recap").await }
    });
    pause.reached.notified().await;
    // The snapshot is taken; now a drain appends a whole exchange before the provider call.
    h.prompt(&s, "second").await;
    h.idle(&s).await;
    go.send(()).expect("release");
    assert_eq!(generate.await.expect("joined"), Ok("generated".into()));
    let request = h.provider.last_request().expect("recorded");
    let users = user_texts(&request);
    assert_eq!(
        users,
        ["first", "recap"],
        "the drain's later input is not in the request"
    );
}

/// The durable step's request for a recorded scenario, rendered and compared with a committed
/// snapshot; `AGENTHOST_BLESS=1` rewrites it after an intended change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_request_for_a_recorded_scenario_is_unchanged() {
    let t = setup(vec![
        Script::new()
            .tool_call("c1", "lookup", r#"{"q":"weather"}"#)
            .finish(FinishReason::ToolCalls),
        text("It is sunny."),
    ])
    .await;
    let s =
        t.h.runtime
            .create_session(agenthost_actors::CreateSession {
                id: Some(agenthost_model::SessionId::parse("ses_snapshot").expect("id")),
                ..Default::default()
            })
            .await
            .expect("session")
            .id;
    t.h.prompt(&s, "What is the weather?").await;
    t.h.idle(&s).await;
    let rendered = format!("{:#?}\n", t.h.provider.requests()[1]);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/step_request.txt");
    if std::env::var_os("AGENTHOST_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        std::fs::write(&path, &rendered).expect("write snapshot");
    }
    let expected = std::fs::read_to_string(&path).expect("the snapshot exists (bless it once)");
    assert_eq!(rendered, expected, "the durable step's request changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_returned_to_generate_anyway_is_ignored() {
    let call = Script::new()
        .tool_call("c1", "lookup", "{}")
        .text("answer without the tool")
        .finish(FinishReason::ToolCalls);
    let t = setup(vec![text("first answer"), call]).await;
    let h = &t.h;
    let s = h.session().await;
    h.prompt(&s, "hello").await;
    h.idle(&s).await;
    let before = contents(h);
    let answer = h.runtime.generate(&s, "quick question").await;
    assert_eq!(answer.as_deref(), Ok("answer without the tool"));
    assert_eq!(t.counter.0.load(Ordering::SeqCst), 0, "never executed");
    assert_eq!(t.tagger.tools_seen.load(Ordering::SeqCst), 0);
    assert_eq!(contents(h), before);
    let request = h.provider.last_request().expect("sent");
    assert!(!request.tools.is_empty());
    assert_eq!(request.tool_choice, ToolChoice::None);
}

/// Blocks the request build of `generate` for one session until released.
#[derive(Debug)]
struct SlowFor {
    session: std::sync::Mutex<Option<agenthost_model::SessionId>>,
    entered: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Hook for SlowFor {
    fn on_request(&self, ctx: &RequestContext, _request: &mut Request) {
        let slow = self.session.lock().expect("lock").clone();
        if ctx.purpose == Purpose::Generate && slow.as_ref() == Some(&ctx.session) {
            if let Some(entered) = self.entered.lock().expect("lock").take() {
                let _ = entered.send(());
            }
            // Hooks run on the preparer's blocking thread: waiting here blocks nothing else.
            let _ = self
                .release
                .lock()
                .expect("lock")
                .recv_timeout(Duration::from_secs(30));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_preparation_does_not_hold_up_the_generates_behind_it() {
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let slow = Arc::new(SlowFor {
        session: std::sync::Mutex::new(None),
        entered: std::sync::Mutex::new(Some(entered_tx)),
        release: std::sync::Mutex::new(release_rx),
    });
    let scripts = (0..10).map(|n| text(&format!("answer {n}")));
    let h = Harness::start_with(
        scripts,
        |_| {},
        Extensions {
            tools: Tools::default(),
            hooks: vec![slow.clone() as Arc<dyn Hook>],
        },
    )
    .await;
    let (a, b) = (h.session().await, h.session().await);
    *slow.session.lock().expect("lock") = Some(a.clone());
    let held = tokio::spawn({
        let (r, a) = (h.runtime.clone(), a.clone());
        async move { r.generate(&a, "slow one").await }
    });
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(Duration::from_secs(30)))
        .await
        .expect("joined")
        .expect("the slow preparation started");
    for n in 0..8 {
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            h.runtime.generate(&b, &format!("quick {n}")),
        )
        .await
        .unwrap_or_else(|_| panic!("generate {n} waited behind the slow one"));
        assert!(answer.is_ok(), "{answer:?}");
    }
    release_tx.send(()).expect("released");
    assert!(held.await.expect("joined").is_ok());
}
