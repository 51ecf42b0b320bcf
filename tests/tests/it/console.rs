//! The operator console in a real browser: headless Chromium through WebDriver (Debian's
//! `chromium` and `chromium-driver`) against an in-process server with the scripted provider.
//! Open the console, see a created session, open it, send a prompt from the page and see the
//! streamed answer, approve a pending call and see it run, interrupt a running turn, and
//! reconnect after the server drops the stream without losing or repeating a message. Without
//! the browser the suite says so in one line and returns, unless `AGENTHOST_REQUIRE_SERVICES` is
//! set (as in CI). `AGENTHOST_BLESS=1` writes a screenshot of each page to `docs/`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_actors::{Call, Executor, Extensions, PromptRequest, Runtime, Tool, Tools};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_llm::{FinishReason, Request};
use agenthost_model::SessionId;
use agenthost_server::{Api, Options};
use fantoccini::{Client, ClientBuilder, Locator};
use futures::future::BoxFuture;

use crate::harness;

/// Chromium and its WebDriver, or `None` (one line said) without them.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let find = |names: &[&str]| {
        names
            .iter()
            .map(|n| Path::new("/usr/bin").join(n))
            .find(|p| p.exists())
    };
    match (
        find(&["chromium", "chromium-browser"]),
        find(&["chromedriver"]),
    ) {
        (Some(chromium), Some(driver)) => Some((chromium, driver)),
        _ if std::env::var_os("AGENTHOST_REQUIRE_SERVICES").is_some() => panic!(
            "the console's browser tests need Debian's chromium and chromium-driver, and \
             AGENTHOST_REQUIRE_SERVICES is set: apt-get install chromium chromium-driver"
        ),
        _ => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the console's browser tests (no chromium and chromium-driver)"
            );
            None
        }
    }
}

/// The WebDriver process, killed when dropped.
struct Driver(std::process::Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn open_browser(chromium: &Path, driver: &Path) -> (Driver, Client) {
    let port = free_port();
    let child = std::process::Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver(child);
    let profile = tempfile::tempdir().expect("profile").keep();
    let caps = serde_json::json!({
        "goog:chromeOptions": {
            "binary": chromium.display().to_string(),
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ]
        }
    });
    let caps = match caps {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("an object"),
    };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if let Ok(client) = ClientBuilder::new(connector.clone())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            return (driver, client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not start a browser session through chromedriver");
}

/// Counts the runs of the `lookup` tool.
#[derive(Debug, Default)]
struct Lookup(AtomicUsize);

impl Executor for Lookup {
    fn execute(&self, _call: Call) -> BoxFuture<'static, Result<String, String>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok("found it".to_owned()) })
    }
}

/// Answers each request from its last user message.
fn model() -> Arc<Scripted> {
    Arc::new(Scripted::from_fn(|request: &Request| {
        let last = crate::harness::user_texts(request)
            .last()
            .cloned()
            .unwrap_or_default();
        let answered = matches!(
            request.messages.last(),
            Some(agenthost_llm::Message::Tool(_))
        );
        Some(match last.as_str() {
            "use lookup" if !answered => Script::new()
                .tool_call("c1", "lookup", r#"{"q": "weather"}"#)
                .finish(FinishReason::ToolCalls),
            "use lookup" => Script::new()
                .text("looked it up")
                .finish(FinishReason::Stop),
            "write forever" => Script::new().text("partial words").hang(),
            other => Script::new()
                .text(format!("you said: {other}"))
                .finish(FinishReason::Stop),
        })
    }))
}

/// A runtime and its HTTP API on `addr` (a free port when `None`), over the store in `dir`.
struct Server {
    addr: SocketAddr,
    runtime: Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    lookup: Arc<Lookup>,
}

impl Server {
    async fn start(dir: &Path, addr: Option<SocketAddr>) -> Server {
        let lookup = Arc::new(Lookup::default());
        let mut config = harness::config(dir, model());
        if let Some(agent) = config.agents.get_mut("default") {
            agent.ask = vec!["lookup".into()];
        }
        let mut tools = Tools::default();
        tools.register(Tool::new(
            "lookup",
            "looks things up",
            serde_json::json!({"type": "object"}),
            lookup.clone(),
        ));
        let runtime = Runtime::start_with(
            config,
            Extensions {
                tools,
                hooks: Vec::new(),
            },
        )
        .await
        .expect("runtime");
        let bind = addr.unwrap_or_else(|| "127.0.0.1:0".parse().expect("address"));
        let mut listener = None;
        for _ in 0..50 {
            match tokio::net::TcpListener::bind(bind).await {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let listener = listener.expect("the port is free again");
        let addr = listener.local_addr().expect("address");
        let api = Api::new(runtime.clone(), Options::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = api
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Server {
            addr,
            runtime,
            stop: Some(stop),
            task,
            lookup,
        }
    }

    /// Stops the server (its event streams drop) and waits until the port is closed.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), &mut self.task).await;
    }
}

/// Waits (bounded) until `css` matches an element whose text contains `text`.
async fn see(client: &Client, css: &str, text: &str) -> fantoccini::elements::Element {
    for _ in 0..300 {
        if let Ok(elements) = client.find_all(Locator::Css(css)).await {
            for element in elements {
                if element.text().await.is_ok_and(|t| t.contains(text)) {
                    return element;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let source = client.source().await.unwrap_or_default();
    panic!("no {css} showing {text:?} on the page:\n{source}");
}

async fn attr(client: &Client, css: &str, name: &str) -> Option<String> {
    client
        .find(Locator::Css(css))
        .await
        .ok()?
        .attr(name)
        .await
        .ok()?
}

async fn screenshot(client: &Client, name: &str) {
    if std::env::var_os("AGENTHOST_BLESS").is_none() {
        return;
    }
    let png = client.screenshot().await.expect("a screenshot");
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs");
    std::fs::create_dir_all(&docs).expect("docs/");
    std::fs::write(docs.join(format!("console-{name}.png")), png).expect("written");
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_drives_a_session_in_a_real_browser() {
    let Some((chromium, driver)) = browser() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), None).await;
    let base = format!("http://{}", server.addr);
    let (_driver, client) = open_browser(&chromium, &driver).await;

    // A session created through the API shows in the sessions table.
    let s: SessionId = server
        .runtime
        .create_session(Default::default())
        .await
        .expect("session")
        .id;
    client
        .goto(&format!("{base}/console#/"))
        .await
        .expect("the console loads");
    see(&client, &format!("tr[data-session-id=\"{s}\"]"), s.as_str()).await;
    screenshot(&client, "sessions").await;

    // Open it and prompt from the page: the answer streams into the transcript.
    client
        .find(Locator::Css(&format!("a[href=\"#/session/{s}\"]")))
        .await
        .expect("the session's link")
        .click()
        .await
        .expect("opened");
    see(&client, "#stream-state", "live").await;
    let text = client
        .find(Locator::Css("#prompt-text"))
        .await
        .expect("the prompt box");
    text.send_keys("hello console").await.expect("typed");
    client
        .find(Locator::Css("#send"))
        .await
        .expect("send")
        .click()
        .await
        .expect("sent");
    see(&client, "[data-role=\"user\"]", "hello console").await;
    see(
        &client,
        "[data-role=\"assistant\"]",
        "you said: hello console",
    )
    .await;

    // A call that needs approval: approve it from the page and see it run.
    server
        .runtime
        .prompt(PromptRequest::new(&s, "use lookup"))
        .await
        .expect("admitted");
    see(&client, "#session-status", "waiting").await;
    let approval = see(&client, "[data-approval]", "lookup").await;
    screenshot(&client, "session").await;
    approval
        .find(Locator::Css("button.approve"))
        .await
        .expect("approve button")
        .click()
        .await
        .expect("approved");
    see(
        &client,
        "[data-call-id=\"c1\"][data-state=\"completed\"]",
        "found it",
    )
    .await;
    see(&client, "[data-role=\"assistant\"]", "looked it up").await;
    assert_eq!(server.lookup.0.load(Ordering::SeqCst), 1);

    // Interrupt a running turn from the page.
    server
        .runtime
        .prompt(PromptRequest::new(&s, "write forever"))
        .await
        .expect("admitted");
    see(&client, "#session-status", "running").await;
    see(&client, "[data-role=\"assistant\"]", "partial words").await;
    client
        .find(Locator::Css("#interrupt"))
        .await
        .expect("interrupt")
        .click()
        .await
        .expect("interrupted");
    see(&client, "#session-status", "idle").await;

    // The server drops the stream (it stops) and comes back on the same port: the page
    // reconnects from its last event, and nothing is lost or repeated.
    let addr = server.addr;
    server.stop().await;
    let server = Server::start(dir.path(), Some(addr)).await;
    server
        .runtime
        .prompt(PromptRequest::new(&s, "after the restart"))
        .await
        .expect("admitted");
    see(
        &client,
        "[data-role=\"assistant\"]",
        "you said: after the restart",
    )
    .await;
    see(&client, "#stream-state", "live").await;
    let last = server
        .runtime
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read")
        .expect("row")
        .last_seq;
    let runtime = server.runtime.clone();
    wait_until("the page applied every event", async || {
        let shown = attr(&client, "#transcript", "data-last-seq").await;
        let now = runtime
            .snapshot()
            .ok()
            .and_then(|snap| snap.session(&s).ok().flatten())
            .map(|row| row.last_seq.0);
        shown.is_some() && shown == now.map(|n| n.to_string())
    })
    .await;
    assert!(last.0 > 0);
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for element in client
            .find_all(Locator::Css("[data-message-id]"))
            .await
            .expect("messages")
        {
            if let Ok(Some(id)) = element.attr("data-message-id").await {
                ids.push(id);
            }
        }
        ids
    };
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "a message shows twice: {ids:?}");
    let messages = server
        .runtime
        .snapshot()
        .expect("snapshot")
        .messages(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("messages");
    for message in &messages {
        let id = message.id().to_string();
        assert!(ids.contains(&id), "{id} is missing from the page: {ids:?}");
    }

    // The system page: the cluster of one.
    client
        .goto(&format!("{base}/console#/system"))
        .await
        .expect("system page");
    see(&client, "#cluster", "local").await;
    screenshot(&client, "system").await;

    client.close().await.expect("the browser closes");
    server.stop().await;
}
