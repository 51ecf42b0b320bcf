//! A scripted model on the OpenAI wire, and HTTP tools beside it, served from the test process
//! so that the server under test can be killed and restarted while they keep every request they
//! were sent: what the model was shown after a restart is then checked as the model saw it.
//!
//! The model answers each request from the request itself (see [`Script`]), so an answer does not
//! depend on how many calls came before, across restarts included.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;

use super::*;

/// What the model answers to a request.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Text(String),
    /// One call of tool `name` with these JSON arguments.
    Tool {
        name: String,
        arguments: Value,
    },
}

/// Answers a request (its JSON body) with an [`Answer`].
pub(crate) type Script = Arc<dyn Fn(&Value) -> Answer + Send + Sync>;

/// How an HTTP tool behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tool {
    /// Answers `{"output": "done"}` at once.
    Quick,
    /// Its first call never answers (the server under test is stopped while it runs); later
    /// calls answer at once.
    HangsOnce,
}

#[derive(Default)]
struct Log {
    requests: Vec<Value>,
    /// Tool calls: the tool's name and the idempotency key.
    calls: Vec<(String, String)>,
}

struct Shared {
    script: Script,
    tools: Vec<(String, Tool)>,
    log: Mutex<Log>,
    changed: tokio::sync::Notify,
}

/// The scripted model and its tools, on one loopback port until dropped.
pub(crate) struct Wire {
    pub(crate) url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Wire {
    pub(crate) async fn start(script: Script, tools: &[(&str, Tool)]) -> Wire {
        let shared = Arc::new(Shared {
            script,
            tools: tools.iter().map(|(n, t)| ((*n).to_owned(), *t)).collect(),
            log: Mutex::default(),
            changed: tokio::sync::Notify::new(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/tools/{name}", post(tool))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Wire { url, shared, task }
    }

    /// Every request body the model was sent, in order.
    pub(crate) fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// Every tool call, as `(tool, idempotency key)`, in order.
    pub(crate) fn calls(&self) -> Vec<(String, String)> {
        self.lock().calls.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (bounded by [`LIMIT`]) until `done` holds of the log.
    pub(crate) async fn until(
        &self,
        what: &str,
        done: impl Fn(&[Value], &[(String, String)]) -> bool,
    ) {
        let wait = async {
            loop {
                let changed = self.shared.changed.notified();
                {
                    let log = self.lock();
                    if done(&log.requests, &log.calls) {
                        return;
                    }
                }
                changed.await;
            }
        };
        if tokio::time::timeout(LIMIT, wait).await.is_err() {
            panic!("timed out waiting for {what}: {:#?}", self.requests());
        }
    }

    /// A config whose default agent runs against this model, with these tools (each an HTTP tool
    /// of this server; `idempotent` as given) and extra `[limits]` lines.
    pub(crate) fn config(&self, dir: &Path, tools: &[(&str, bool)], limits: &str) -> PathBuf {
        let path = dir.join("agenthost.toml");
        let mut text = format!(
            r#"
data_dir = "{data}"
[providers.wire]
kind = "openai"
base_url = "{url}/v1"
[models.default]
provider = "wire"
model = "scripted"
[agents.default]
model = "default"
[limits]
{limits}
"#,
            data = dir.join("data").display(),
            url = self.url,
        );
        for (name, idempotent) in tools {
            text.push_str(&format!(
                "[[tools]]\nname = \"{name}\"\nkind = \"http\"\nurl = \"{url}/tools/{name}\"\n\
                 idempotent = {idempotent}\ntimeout_ms = 60000\n",
                url = self.url
            ));
        }
        std::fs::write(&path, text).expect("config written");
        path
    }
}

async fn complete(State(shared): State<Arc<Shared>>, body: String) -> Response {
    let request: Value = serde_json::from_str(&body).expect("a JSON request");
    let answer = (shared.script)(&request);
    shared
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .requests
        .push(request);
    shared.changed.notify_waiters();
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "model": "scripted",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let (delta, finish) = match answer {
        Answer::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        Answer::Tool { name, arguments } => (
            json!({"role": "assistant", "tool_calls": [{
                "index": 0,
                "id": format!("call_{name}"),
                "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()},
            }]}),
            "tool_calls",
        ),
    };
    let usage = json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "model": "scripted",
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    });
    let frames = [
        chunk(delta, Value::Null),
        chunk(json!({}), json!(finish)),
        usage,
    ];
    let mut text = String::new();
    for frame in frames {
        text.push_str(&format!("data: {frame}\n\n"));
    }
    text.push_str("data: [DONE]\n\n");
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(text))
        .expect("a response")
}

async fn tool(
    State(shared): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let behaviour = shared
        .tools
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap_or(Tool::Quick);
    let earlier = {
        let mut log = shared.log.lock().unwrap_or_else(|e| e.into_inner());
        let earlier = log.calls.iter().filter(|(n, _)| *n == name).count();
        log.calls.push((name.clone(), key));
        earlier
    };
    shared.changed.notify_waiters();
    if behaviour == Tool::HangsOnce && earlier == 0 {
        std::future::pending::<()>().await;
    }
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(json!({"output": "done"}).to_string()))
        .expect("a response")
}

/// The text of every message of a request, one string per message (tool results and tool calls
/// included), for assertions on what the model was shown.
pub(crate) fn shown(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or("?"), content(m)))
        .collect()
}

fn content(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        Value::Null => message["tool_calls"].to_string(),
        other => other.to_string(),
    }
}

/// The last user message's text of a request, notes of the runtime (`<system-reminder>`) left
/// out.
pub(crate) fn last_user(request: &Value) -> String {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .filter(|m| m["role"] == "user")
        .map(content)
        .find(|text| !text.starts_with("<system-reminder>"))
        .unwrap_or_default()
}

/// Whether a tool result follows the request's last user message.
pub(crate) fn tools_answered(request: &Value) -> bool {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .take_while(|m| m["role"] != "user" || content(m).starts_with("<system-reminder>"))
        .any(|m| m["role"] == "tool")
}

/// A model that calls tool `name` once when the last user message names it, and otherwise
/// answers with the text it was asked.
pub(crate) fn calls_tools_named_in_the_prompt(tools: &'static [&'static str]) -> Script {
    Arc::new(move |request| {
        let asked = last_user(request);
        match tools.iter().find(|t| asked.contains(&format!("use {t}"))) {
            Some(name) if !tools_answered(request) => Answer::Tool {
                name: (*name).to_owned(),
                arguments: json!({"about": asked}),
            },
            _ => Answer::Text(format!("answered: {asked}")),
        }
    })
}
