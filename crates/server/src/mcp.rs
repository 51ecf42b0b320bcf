//! agenthost as an MCP server: durable sessions for any MCP client (ARCHITECTURE.md, "agenthost
//! as an MCP server"). [`Handler`] is an `rmcp` server whose tools drive sessions through the
//! HTTP API's own client: served at `/mcp` (streamable HTTP, behind the same bearer token as
//! `/api`, calling the node's own API with the caller's token, so a cluster forwards as for any
//! request) and over stdio by `agenthost mcp --url URL` (calling that URL). Either way a tool's
//! answer and its errors are the HTTP API's: structured content with the same wire types, and a
//! tool error `{"type", "message"}` with the API's error type. No tool blocks longer than its
//! bound: `wait` at most 30 s, sending progress notifications while it waits.

use std::sync::Arc;
use std::time::Duration;

use agenthost_api::{Client, wire};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::{Value, json};

/// The longest a `wait` may take.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The MCP server: its tools over an HTTP API client.
#[derive(Debug, Clone)]
pub struct Handler {
    client: Client,
    /// Take the bearer token from each MCP request's `Authorization` header (at `/mcp`); over
    /// stdio the client carries its own.
    per_request_token: bool,
}

impl Handler {
    /// Tools over `client` (its token, if any, sent with every call).
    pub fn new(client: Client) -> Handler {
        Handler {
            client,
            per_request_token: false,
        }
    }

    /// Tools over the node's own API at `client`'s base URL, each call with the token of the MCP
    /// request it serves.
    pub(crate) fn with_callers_token(client: Client) -> Handler {
        Handler {
            client,
            per_request_token: true,
        }
    }

    fn client(&self, context: &RequestContext<RoleServer>) -> Client {
        if !self.per_request_token {
            return self.client.clone();
        }
        let token = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get(axum::http::header::AUTHORIZATION))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        match token {
            Some(token) => self.client.clone().with_token(token),
            None => self.client.clone(),
        }
    }
}

/// A tool's failure: the HTTP API's error type and message.
struct Failure {
    kind: String,
    message: String,
}

impl From<agenthost_api::Error> for Failure {
    fn from(e: agenthost_api::Error) -> Self {
        match e {
            agenthost_api::Error::Api { body, .. } => Failure {
                kind: body.kind.as_str().to_owned(),
                message: body.message,
            },
            other => Failure {
                kind: wire::ErrorType::Unavailable.as_str().to_owned(),
                message: other.to_string(),
            },
        }
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        kind: wire::ErrorType::InvalidRequest.as_str().to_owned(),
        message: message.into(),
    }
}

type Outcome = Result<Value, Failure>;

fn to_value(value: impl serde::Serialize) -> Outcome {
    serde_json::to_value(value).map_err(|e| Failure {
        kind: wire::ErrorType::Internal.as_str().to_owned(),
        message: e.to_string(),
    })
}

/// The string argument `name`.
fn string(args: &serde_json::Map<String, Value>, name: &str) -> Result<String, Failure> {
    args.get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| invalid(format!("{name}: a string is required")))
}

fn optional_string(
    args: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<String>, Failure> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(format!("{name}: must be a string"))),
    }
}

fn optional_u64(args: &serde_json::Map<String, Value>, name: &str) -> Result<Option<u64>, Failure> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(format!("{name}: must be a non-negative integer"))),
    }
}

/// A JSON Schema object with these properties, `required` naming the ones that must be there.
fn object(properties: Value, required: &[&str]) -> Arc<serde_json::Map<String, Value>> {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("a JSON object literal"),
    }
}

/// An output schema: an object, its properties loosely described.
fn output(properties: Value) -> Arc<serde_json::Map<String, Value>> {
    match json!({"type": "object", "properties": properties}) {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("a JSON object literal"),
    }
}

fn tool(
    name: &'static str,
    description: &'static str,
    input: Arc<serde_json::Map<String, Value>>,
    result: Arc<serde_json::Map<String, Value>>,
    annotations: ToolAnnotations,
) -> Tool {
    let mut tool = Tool::new(name, description, input);
    tool.output_schema = Some(result);
    tool.annotations = Some(annotations);
    tool
}

fn read_only() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(true)
        .idempotent(true)
        .destructive(false)
        .open_world(false)
}

fn writes(idempotent: bool, destructive: bool) -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(false)
        .idempotent(idempotent)
        .destructive(destructive)
        .open_world(false)
}

/// Every tool, with truthful annotations and an output schema.
pub fn tools() -> Vec<Tool> {
    let session = json!({"type": "string", "description": "A session id, `ses_…`."});
    vec![
        tool(
            "list_sessions",
            "Lists sessions, newest first, one page at a time.",
            object(
                json!({
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "cursor": {"type": "string", "description": "`next_cursor` of the previous page."}
                }),
                &[],
            ),
            output(
                json!({"sessions": {"type": "array"}, "next_cursor": {"type": ["string", "null"]}}),
            ),
            read_only(),
        ),
        tool(
            "create_session",
            "Creates a session (or returns the one `session_id` names).",
            object(
                json!({"agent": {"type": "string"}, "session_id": session}),
                &[],
            ),
            output(json!({"id": {"type": "string"}, "status": {"type": "object"}})),
            writes(false, false),
        ),
        tool(
            "prompt",
            "Sends a prompt to a session. Returns as soon as the prompt is durably admitted, \
             with its receipt; use `wait` for the answer. With an `id`, a retry admits it once.",
            object(
                json!({
                    "session_id": session,
                    "text": {"type": "string"},
                    "id": {"type": "string", "description": "An idempotency key, `msg_…`."},
                    "delivery": {"type": "string", "enum": ["steer", "queue"]}
                }),
                &["session_id", "text"],
            ),
            output(json!({"id": {"type": "string"}, "admitted_seq": {"type": "integer"}})),
            writes(false, false),
        ),
        tool(
            "wait",
            "Waits (at most `timeout_s`, 30 at most) until the session is idle, sending progress \
             notifications meanwhile, then returns its status and the messages after `after_seq`.",
            object(
                json!({
                    "session_id": session,
                    "after_seq": {"type": "integer", "minimum": 0},
                    "timeout_s": {"type": "integer", "minimum": 0, "maximum": 30}
                }),
                &["session_id"],
            ),
            output(json!({
                "idle": {"type": "boolean"},
                "status": {"type": "string"},
                "last_seq": {"type": "integer"},
                "messages": {"type": "array"}
            })),
            read_only(),
        ),
        tool(
            "messages",
            "Reads a session's history after `after_seq` (oldest first, `limit` at most).",
            object(
                json!({
                    "session_id": session,
                    "after_seq": {"type": "integer", "minimum": 0},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000}
                }),
                &["session_id"],
            ),
            output(json!({"messages": {"type": "array"}})),
            read_only(),
        ),
        tool(
            "generate",
            "A one-off model call with the session's history and instructions plus `prompt`; \
             nothing is recorded.",
            object(
                json!({"session_id": session, "prompt": {"type": "string"}}),
                &["session_id", "prompt"],
            ),
            output(json!({"text": {"type": "string"}})),
            read_only().idempotent(false),
        ),
        tool(
            "interrupt",
            "Interrupts the session's running turn (its partial output is kept); a no-op when \
             nothing runs.",
            object(json!({"session_id": session}), &["session_id"]),
            output(json!({"interrupted": {"type": "boolean"}})),
            writes(true, true),
        ),
        tool(
            "approvals",
            "Lists the tool calls of the session that wait for a person's approval.",
            object(json!({"session_id": session}), &["session_id"]),
            output(json!({"approvals": {"type": "array"}})),
            read_only(),
        ),
        tool(
            "decide_approval",
            "Approves or denies a tool call that waits for approval, once; `digest` (from \
             `approvals`) binds the decision to what was asked.",
            object(
                json!({
                    "session_id": session,
                    "message_id": {"type": "string"},
                    "call_id": {"type": "string"},
                    "decision": {"type": "string", "enum": ["approve", "deny"]},
                    "digest": {"type": "string"},
                    "reason": {"type": "string"},
                    "by": {"type": "string"}
                }),
                &["session_id", "message_id", "call_id", "decision", "digest"],
            ),
            output(json!({"decision": {"type": "string"}, "by": {"type": ["string", "null"]}})),
            writes(false, false),
        ),
    ]
}

impl Handler {
    async fn run(
        &self,
        name: &str,
        args: serde_json::Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Outcome {
        let client = self.client(context);
        match name {
            "list_sessions" => {
                let query = wire::ListQuery {
                    limit: optional_u64(&args, "limit")?.map(|n| n as usize),
                    cursor: optional_string(&args, "cursor")?,
                };
                let page = client.sessions(&query).await?;
                Ok(json!({"sessions": to_value(page.sessions)?, "next_cursor": page.cursor.next}))
            }
            "create_session" => {
                let body = wire::CreateSession {
                    id: optional_string(&args, "session_id")?,
                    agent: optional_string(&args, "agent")?,
                    ..Default::default()
                };
                to_value(client.create_session(&body).await?)
            }
            "prompt" => {
                let delivery = match optional_string(&args, "delivery")?.as_deref() {
                    None | Some("steer") => wire::Delivery::Steer,
                    Some("queue") => wire::Delivery::Queue,
                    Some(other) => {
                        return Err(invalid(format!(
                            "delivery: {other:?} is neither \"steer\" nor \"queue\""
                        )));
                    }
                };
                let body = wire::Prompt {
                    id: optional_string(&args, "id")?,
                    text: string(&args, "text")?,
                    delivery: Some(delivery),
                    ..Default::default()
                };
                to_value(client.prompt(&string(&args, "session_id")?, &body).await?)
            }
            "wait" => self.wait(&client, &args, context).await,
            "messages" => {
                let query = wire::MessagesQuery {
                    after_seq: optional_u64(&args, "after_seq")?,
                    limit: optional_u64(&args, "limit")?.map(|n| n as usize),
                };
                let messages = client
                    .messages(&string(&args, "session_id")?, &query)
                    .await?;
                Ok(json!({"messages": to_value(messages)?}))
            }
            "generate" => to_value(
                client
                    .generate(&string(&args, "session_id")?, &string(&args, "prompt")?)
                    .await?,
            ),
            "interrupt" => to_value(client.interrupt(&string(&args, "session_id")?).await?),
            "approvals" => {
                let list = client.approvals(&string(&args, "session_id")?).await?;
                Ok(json!({"approvals": to_value(list)?}))
            }
            "decide_approval" => {
                let decision = match string(&args, "decision")?.as_str() {
                    "approve" => wire::DecideKind::Approve,
                    "deny" => wire::DecideKind::Deny,
                    other => {
                        return Err(invalid(format!(
                            "decision: {other:?} is neither \"approve\" nor \"deny\""
                        )));
                    }
                };
                let body = wire::Decide {
                    decision,
                    digest: string(&args, "digest")?,
                    reason: optional_string(&args, "reason")?,
                    by: optional_string(&args, "by")?,
                };
                to_value(
                    client
                        .decide(
                            &string(&args, "session_id")?,
                            &string(&args, "message_id")?,
                            &string(&args, "call_id")?,
                            &body,
                        )
                        .await?,
                )
            }
            other => Err(Failure {
                kind: wire::ErrorType::NotFound.as_str().to_owned(),
                message: format!("no tool {other:?}"),
            }),
        }
    }

    /// Waits a second at a time, so progress goes out meanwhile and the bound holds.
    async fn wait(
        &self,
        client: &Client,
        args: &serde_json::Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Outcome {
        let session = string(args, "session_id")?;
        let timeout =
            Duration::from_secs(optional_u64(args, "timeout_s")?.unwrap_or(30)).min(MAX_WAIT);
        let token = context.meta.get_progress_token();
        let start = tokio::time::Instant::now();
        let mut step = 0u32;
        let idle = loop {
            let left = timeout.saturating_sub(start.elapsed());
            let slice = left.min(Duration::from_secs(1));
            if client.wait(&session, slice).await?.idle {
                break true;
            }
            if left <= slice || context.ct.is_cancelled() {
                break false;
            }
            step += 1;
            if let Some(token) = &token {
                let progress = ProgressNotificationParam::new(token.clone(), f64::from(step))
                    .with_total(timeout.as_secs_f64())
                    .with_message("the session is still running");
                let _ = context.peer.notify_progress(progress).await;
            }
        };
        let info = client.session(&session).await?;
        let query = wire::MessagesQuery {
            after_seq: optional_u64(args, "after_seq")?,
            limit: None,
        };
        let messages = client.messages(&session, &query).await?;
        let status = to_value(info.status.kind)?;
        Ok(json!({
            "idle": idle,
            "status": status,
            "last_seq": info.last_seq,
            "messages": to_value(messages)?,
        }))
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::default();
        info.capabilities = ServerCapabilities::builder().enable_tools().build();
        info.server_info = Implementation::new("agenthost", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Durable LLM agent sessions. create_session, then prompt (it returns once the input \
             is durable), then wait until the session is idle and read the answer from its \
             messages. Tool calls that need a person's approval are listed by approvals and \
             decided with decide_approval."
                .into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult {
            tools: tools(),
            ..Default::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let result = match self.run(&request.name, args, &context).await {
            Ok(value) => CallToolResult::structured(value),
            Err(failure) => CallToolResult::structured_error(
                json!({"type": failure.kind, "message": failure.message}),
            ),
        };
        Ok(CallToolResponse::Complete(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_input_and_an_output_schema_and_truthful_annotations() {
        let tools = tools();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "list_sessions",
                "create_session",
                "prompt",
                "wait",
                "messages",
                "generate",
                "interrupt",
                "approvals",
                "decide_approval"
            ]
        );
        for tool in &tools {
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
            assert!(tool.output_schema.is_some(), "{}", tool.name);
            assert!(tool.description.is_some(), "{}", tool.name);
        }
        let hints = |name: &str| {
            let a = tools
                .iter()
                .find(|t| t.name == name)
                .and_then(|t| t.annotations.clone())
                .expect("annotated");
            (a.read_only_hint, a.destructive_hint, a.idempotent_hint)
        };
        for reader in ["list_sessions", "wait", "messages", "approvals"] {
            assert_eq!(
                hints(reader),
                (Some(true), Some(false), Some(true)),
                "{reader}"
            );
        }
        assert_eq!(hints("interrupt"), (Some(false), Some(true), Some(true)));
        for writer in ["create_session", "prompt", "decide_approval"] {
            assert_eq!(
                hints(writer),
                (Some(false), Some(false), Some(false)),
                "{writer}"
            );
        }
    }
}
