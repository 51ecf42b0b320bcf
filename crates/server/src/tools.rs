//! HTTP tools: a tool declared in configuration whose executor POSTs the call to a
//! URL.
//!
//! Request: `POST <url>` with `Content-Type: application/json`, header
//! `Idempotency-Key: <session>/<assistant message>/<call id>` (the same for every execution of
//! one call, so a tool server can recognize a re-execution after a restart), and body
//! `{"session_id", "call_id", "name", "input"}`.
//!
//! Response: a 2xx with `{"output": …}` (a string, or any JSON value, which the model then sees
//! as JSON text) or `{"error": "…"}`. Anything else (another status, a body that is not JSON of
//! that shape, a timeout, a connection failure) is a tool failure the model sees; the drain
//! goes on.

use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Call, Executor, Permission, Tool};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest tool response read; the runtime keeps far less in history (32 KiB by default).
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// Why an HTTP tool cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tool {name:?}: url {url:?} is not an http:// or https:// URL")]
    Url { name: String, url: String },
    #[error("tool {name:?}: cannot build the HTTP client: {reason}")]
    Client { name: String, reason: String },
}

/// How to declare one HTTP tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub name: String,
    pub description: String,
    /// JSON schema of the input.
    pub parameters: Value,
    pub url: String,
    /// Safe to run again with the same idempotency key after a crash.
    pub idempotent: bool,
    /// Longest wait for the tool server's answer.
    pub timeout: Duration,
    /// Whether a call runs, waits for approval or is refused (agents' rules may say otherwise).
    pub permission: Permission,
}

impl Spec {
    /// The runtime tool: this spec with an [`Http`] executor.
    pub fn build(&self) -> Result<Tool, Error> {
        let executor = Http::new(&self.name, &self.url, self.timeout)?;
        let mut tool = Tool::new(
            self.name.clone(),
            self.description.clone(),
            self.parameters.clone(),
            Arc::new(executor),
        );
        tool.idempotent = self.idempotent;
        tool.timeout = self.timeout;
        tool.permission = self.permission.clone();
        Ok(tool)
    }
}

/// The executor of an HTTP tool.
#[derive(Debug, Clone)]
pub struct Http {
    url: reqwest::Url,
    client: reqwest::Client,
}

#[derive(Serialize)]
struct Request<'a> {
    session_id: &'a str,
    call_id: &'a str,
    name: &'a str,
    input: &'a Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    output: Option<Value>,
    error: Option<String>,
}

impl Http {
    pub fn new(name: &str, url: &str, timeout: Duration) -> Result<Http, Error> {
        let parsed = reqwest::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| Error::Url {
                name: name.to_owned(),
                url: url.to_owned(),
            })?;
        Ok(Http {
            url: parsed,
            client: client(timeout).map_err(|reason| Error::Client {
                name: name.to_owned(),
                reason,
            })?,
        })
    }
}

/// A reqwest client with `timeout` as the whole-call deadline and no redirects (a redirect
/// would turn the POST into a GET and lose the call).
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, String> {
    agenthost_llm::client_builder()?
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())
}

impl Executor for Http {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        let this = self.clone();
        async move { this.call(call).await }.boxed()
    }
}

impl Http {
    async fn call(&self, call: Call) -> Result<String, String> {
        let session = call.session.to_string();
        let body = serde_json::to_vec(&Request {
            session_id: &session,
            call_id: &call.call_id,
            name: &call.name,
            input: &call.input,
        })
        .map_err(|e| format!("cannot encode the tool call: {e}"))?;
        let mut response = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", call.idempotency_key())
            .body(body)
            .send()
            .await
            .map_err(|e| format!("tool request failed: {}", describe(&e)))?;
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("reading the tool response failed: {}", describe(&e)))?
        {
            if bytes.len() + chunk.len() > MAX_RESPONSE {
                return Err(format!("the tool response is over {MAX_RESPONSE} bytes"));
            }
            bytes.extend_from_slice(&chunk);
        }
        let answer = serde_json::from_slice::<Answer>(&bytes).ok();
        match (status.is_success(), answer) {
            (
                true,
                Some(Answer {
                    output: Some(output),
                    error: None,
                }),
            ) => Ok(match output {
                Value::String(text) => text,
                other => other.to_string(),
            }),
            (
                _,
                Some(Answer {
                    error: Some(error),
                    output: None,
                }),
            ) => Err(error),
            (true, _) => {
                Err("the tool server answered without {\"output\": …} or {\"error\": …}".to_owned())
            }
            (false, _) => Err(format!(
                "the tool server answered {status}: {}",
                excerpt(&bytes)
            )),
        }
    }
}

/// reqwest's error with its sources, which hold the useful part (connection refused, …).
fn describe(e: &reqwest::Error) -> String {
    agenthost_http::describe(e)
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut cut: String = text.chars().take(200).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenthost_model::{MessageId, SessionId};
    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use std::sync::Mutex;

    fn call() -> Call {
        Call {
            session: SessionId::parse("ses_t").expect("invariant: valid id"),
            message: MessageId::parse("msg_m").expect("invariant: valid id"),
            call_id: "call_1".into(),
            name: "lookup".into(),
            input: serde_json::json!({"q": "x"}),
        }
    }

    type Seen = Arc<Mutex<Vec<(String, Value)>>>;

    /// A tool server on a loopback port: `/ok` answers output, `/err` an error, `/500` a
    /// failure status, `/bad` a body of the wrong shape, `/slow` nothing for 5 s.
    async fn server(seen: Seen) -> (String, tokio::task::JoinHandle<()>) {
        let record = move |headers: HeaderMap, body: bytes::Bytes| {
            let seen = seen.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((key, body));
            }
        };
        let r1 = record.clone();
        let app = Router::new()
            .route(
                "/ok",
                post(move |h: HeaderMap, b: bytes::Bytes| async move {
                    r1(h, b).await;
                    r#"{"output":"found it"}"#
                }),
            )
            .route("/json", post(|| async { r#"{"output":{"n":1}}"# }))
            .route("/err", post(|| async { r#"{"error":"no such thing"}"# }))
            .route(
                "/500",
                post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
            )
            .route("/bad", post(|| async { r#"{"result":1}"# }))
            .route(
                "/slow",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    r#"{"output":"late"}"#
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}"), task)
    }

    #[tokio::test]
    async fn posts_the_call_and_reads_the_answer() {
        let seen: Seen = Arc::default();
        let (base, task) = server(seen.clone()).await;
        let run = |path: &str, timeout_ms: u64| {
            let http = Http::new(
                "lookup",
                &format!("{base}{path}"),
                Duration::from_millis(timeout_ms),
            )
            .expect("valid url");
            async move { http.execute(call()).await }
        };
        assert_eq!(run("/ok", 5000).await, Ok("found it".to_owned()));
        assert_eq!(run("/json", 5000).await, Ok(r#"{"n":1}"#.to_owned()));
        assert_eq!(run("/err", 5000).await, Err("no such thing".to_owned()));
        let e = run("/500", 5000).await.expect_err("500 fails");
        assert!(e.contains("500") && e.contains("boom"), "{e}");
        let e = run("/bad", 5000).await.expect_err("wrong shape fails");
        assert!(e.contains("without"), "{e}");
        let e = run("/slow", 200).await.expect_err("timeout fails");
        assert!(e.contains("tool request failed"), "{e}");
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, "ses_t/msg_m/call_1");
        assert_eq!(
            seen[0].1,
            serde_json::json!({"session_id": "ses_t", "call_id": "call_1", "name": "lookup", "input": {"q": "x"}})
        );
        task.abort();
        let _ = task.await;
    }

    #[test]
    fn refuses_non_http_urls() {
        for url in ["ftp://x/y", "not a url", "file:///etc/passwd"] {
            assert!(matches!(
                Http::new("t", url, Duration::from_secs(1)),
                Err(Error::Url { .. })
            ));
        }
        let spec = Spec {
            name: "t".into(),
            description: "d".into(),
            parameters: serde_json::json!({"type": "object"}),
            url: "http://127.0.0.1:1/x".into(),
            idempotent: true,
            timeout: Duration::from_secs(3),
            permission: Permission::Ask,
        };
        let tool = spec.build().expect("valid spec");
        assert!(tool.idempotent);
        assert_eq!(tool.permission, Permission::Ask);
        assert_eq!(tool.timeout, Duration::from_secs(3));
    }
}
