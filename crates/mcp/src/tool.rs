//! An MCP server's tool as a runtime tool: its name, whether a call a stop cut may run again,
//! the call itself, and what its result reads as to the model.

use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Call, Executor, Tool};
use futures::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, RequestMetaObject};
use rmcp::service::ServiceError;

use crate::server::{Outcome, Server};

/// The `_meta` key that carries a call's idempotency key (`<session>/<message>/<call>`), the
/// same for a call run again after a stop.
pub const META_KEY: &str = "agenthost/idempotency-key";

/// What a call's result reads as when the server stopped while it ran.
pub const SERVER_STOPPED: &str = "the MCP server stopped while this tool ran; it may or may not \
     have taken effect. Check before repeating it.";

/// The most characters of a tool's name (providers refuse longer ones).
const MAX_NAME: usize = 64;

/// The runtime's name of tool `tool` of server `server`: `<server>_<tool>`, with every character
/// outside `[a-zA-Z0-9_-]` replaced by `_`, cut to 64 characters.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{server}_{tool}")
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .take(MAX_NAME)
        .collect()
}

/// Whether a call of `tool` that a stop cut runs again: when the server is trusted and the tool
/// is annotated read-only or idempotent, or when the configuration's `idempotent` patterns name
/// it. An untrusted server's annotations decide nothing.
pub(crate) fn reruns(server: &crate::ServerConfig, tool: &rmcp::model::Tool) -> bool {
    let annotated = tool
        .annotations
        .as_ref()
        .is_some_and(|a| a.read_only_hint == Some(true) || a.idempotent_hint == Some(true));
    (server.trusted && annotated)
        || agenthost_actors::tools::allowed(&server.idempotent, &tool.name)
}

/// The runtime tool for `tool` of `server`.
pub(crate) fn runtime_tool(server: &Arc<Server>, tool: &rmcp::model::Tool) -> Tool {
    let config = server.config();
    let mut runtime = Tool::new(
        tool_name(&config.name, &tool.name),
        tool.description.as_deref().unwrap_or_default(),
        serde_json::Value::Object((*tool.input_schema).clone()),
        Arc::new(McpTool {
            server: server.clone(),
            tool: tool.name.to_string(),
        }),
    );
    runtime.idempotent = reruns(config, tool);
    // A little beyond the server's own deadline, which cancels the call on the server first.
    runtime.timeout = config.call_timeout;
    runtime
}

/// Runs one tool of one server.
#[derive(Debug)]
pub(crate) struct McpTool {
    server: Arc<Server>,
    /// The server's own name of the tool.
    tool: String,
}

impl Executor for McpTool {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        let (server, tool) = (self.server.clone(), self.tool.clone());
        Box::pin(async move {
            let Some(peer) = server.peer() else {
                server.count(Outcome::Unavailable);
                return Err(format!(
                    "the MCP server {:?} is not running ({})",
                    server.config().name,
                    server.state().as_str()
                ));
            };
            let mut params = CallToolRequestParams::new(tool);
            params.arguments = match call.input.clone() {
                serde_json::Value::Object(map) => Some(map),
                serde_json::Value::Null => None,
                other => {
                    return Err(format!("the arguments must be a JSON object, not {other}"));
                }
            };
            let mut meta = RequestMetaObject::new();
            meta.insert(
                META_KEY.to_owned(),
                serde_json::Value::String(call.idempotency_key()),
            );
            params.meta = Some(meta);
            // rmcp's `call_tool` has no deadline of its own, and cancels a call it drops with
            // `notifications/cancelled`: the deadline here, an interrupt or a shutdown (which
            // abort the task running this future) all end up there.
            let deadline = server.config().call_timeout;
            match tokio::time::timeout(deadline, peer.call_tool(params)).await {
                Ok(Ok(result)) => {
                    let read = read(result);
                    server.count(match read {
                        Ok(_) => Outcome::Ok,
                        Err(_) => Outcome::Error,
                    });
                    read
                }
                Ok(Err(ServiceError::TransportClosed)) => {
                    server.count(Outcome::Stopped);
                    Err(SERVER_STOPPED.to_owned())
                }
                Ok(Err(ServiceError::McpError(e))) => {
                    server.count(Outcome::Error);
                    Err(format!("the MCP server refused the call: {}", e.message))
                }
                Ok(Err(e)) => {
                    server.count(Outcome::Error);
                    Err(format!("the MCP call failed: {e}"))
                }
                Err(_) => {
                    server.count(Outcome::Timeout);
                    Err(format!(
                        "the MCP call timed out after {}; it was cancelled",
                        pretty(deadline)
                    ))
                }
            }
        })
    }
}

fn pretty(d: Duration) -> String {
    match d.as_millis() {
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

/// What a result reads as: its text content, other content described in words, structured
/// content as JSON; `isError` makes it the call's error.
pub(crate) fn read(result: CallToolResult) -> Result<String, String> {
    let mut parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => format!(
                "[an image ({}), {} bytes of base64]",
                image.mime_type,
                image.data.len()
            ),
            ContentBlock::Audio(audio) => format!(
                "[audio ({}), {} bytes of base64]",
                audio.mime_type,
                audio.data.len()
            ),
            ContentBlock::Resource(resource) => match serde_json::to_value(&resource.resource) {
                Ok(value) => match value.get("text").and_then(|t| t.as_str()) {
                    Some(text) => text.to_owned(),
                    None => format!(
                        "[an embedded resource: {}]",
                        value.get("uri").and_then(|u| u.as_str()).unwrap_or("?")
                    ),
                },
                Err(_) => "[an embedded resource]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[a link to resource {}]", link.uri),
            // A kind of content this build does not know yet.
            _ => "[content of a kind agenthost cannot show]".to_owned(),
        })
        .collect();
    if let Some(structured) = &result.structured_content {
        let json = structured.to_string();
        // Servers often send the same value as text too: say it once.
        if !parts.iter().any(|p| p.trim() == json) {
            parts.push(json);
        }
    }
    let text = parts.join("\n");
    match result.is_error {
        Some(true) => Err(text),
        _ => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_cleaned_and_bounded() {
        assert_eq!(tool_name("files", "read_note"), "files_read_note");
        assert_eq!(
            tool_name("my.server", "get/item v2"),
            "my_server_get_item_v2"
        );
        assert_eq!(tool_name("s", &"x".repeat(100)).len(), 64);
        assert_eq!(tool_name("s", "é"), "s__");
    }

    fn tool(annotations: Option<rmcp::model::ToolAnnotations>) -> rmcp::model::Tool {
        let mut tool =
            rmcp::model::Tool::new("read_note", "reads", Arc::new(serde_json::Map::new()));
        tool.annotations = annotations;
        tool
    }

    fn config(trusted: bool, idempotent: &[&str]) -> crate::ServerConfig {
        crate::ServerConfig {
            name: "files".into(),
            transport: crate::Transport::Http {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: Default::default(),
            },
            trusted,
            call_timeout: Duration::from_secs(1),
            idempotent: idempotent.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    #[test]
    fn only_a_trusted_servers_annotations_or_the_configuration_make_a_call_run_again() {
        let read_only = tool(Some(rmcp::model::ToolAnnotations::new().read_only(true)));
        let idempotent = tool(Some(rmcp::model::ToolAnnotations::new().idempotent(true)));
        let plain = tool(None);
        assert!(reruns(&config(true, &[]), &read_only));
        assert!(reruns(&config(true, &[]), &idempotent));
        assert!(!reruns(&config(false, &[]), &read_only), "untrusted");
        assert!(!reruns(&config(true, &[]), &plain), "unannotated");
        assert!(
            reruns(&config(false, &["read_*"]), &plain),
            "named by the configuration"
        );
        assert!(!reruns(&config(false, &["read_*", "!read_note"]), &plain));
    }

    #[test]
    fn results_read_as_text_with_errors_and_structured_content() {
        let ok = CallToolResult::success(vec![ContentBlock::text("found it")]);
        assert_eq!(read(ok), Ok("found it".to_owned()));
        let failed = CallToolResult::error(vec![ContentBlock::text("no such note")]);
        assert_eq!(read(failed), Err("no such note".to_owned()));
        let mut structured = CallToolResult::success(vec![ContentBlock::text("see below")]);
        structured.structured_content = Some(serde_json::json!({"answer": 42}));
        assert_eq!(
            read(structured),
            Ok("see below\n{\"answer\":42}".to_owned())
        );
    }
}
