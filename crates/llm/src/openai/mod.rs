//! OpenAI-compatible Chat Completions (`kind = "openai"`): the request body and headers, and the
//! stream [`Parser`].
//!
//! Request mapping: system parts become one `system` message (joined by blank lines, since
//! several compatible servers reject more than one or a content array there); user files become
//! content parts; assistant text and tool calls become one `assistant` message with
//! `tool_calls`; reasoning is not replayed (Chat Completions has no input field for it); each
//! tool result becomes a `tool` message. `stream_options.include_usage` is always on so usage
//! arrives in the final chunk.

mod parse;

use std::fmt;
use std::sync::Arc;

use reqwest::header::AUTHORIZATION;
use serde_json::{Map, Value, json};

pub use parse::Parser;

use crate::config::Config;
use crate::error::Error;
use crate::http::{self, Endpoint};
use crate::provider::{EventStream, Provider};
use crate::request::{AssistantPart, File, FileContent, Message, Request, ToolChoice};

/// OpenAI's public endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A Chat Completions client. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct OpenAi {
    endpoint: Arc<Endpoint>,
    legacy_max_tokens: bool,
}

impl fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.endpoint.fmt_as("OpenAi", f)
    }
}

impl OpenAi {
    /// A client for `config` (its `kind` is not checked). No connection is made yet.
    pub fn new(config: &Config) -> Result<Self, Error> {
        Ok(Self {
            endpoint: Arc::new(Endpoint::new(
                config,
                DEFAULT_BASE_URL,
                "chat/completions",
                "openai",
            )?),
            legacy_max_tokens: config.legacy_max_tokens,
        })
    }

    /// The JSON body sent for `request`.
    pub fn body(&self, request: &Request) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(request.model));
        body.insert("messages".into(), Value::Array(messages(request)));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(|tool| {
                    let mut function = Map::new();
                    function.insert("name".into(), json!(tool.name));
                    if !tool.description.is_empty() {
                        function.insert("description".into(), json!(tool.description));
                    }
                    function.insert("parameters".into(), tool.parameters.clone());
                    json!({ "type": "function", "function": function })
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            // Sent only with tools: OpenAI rejects a tool_choice without them.
            let choice = match &request.tool_choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool(name) => {
                    json!({ "type": "function", "function": { "name": name } })
                }
            };
            body.insert("tool_choice".into(), choice);
        }
        if let Some(max) = request.max_output {
            let field = if self.legacy_max_tokens {
                "max_tokens"
            } else {
                "max_completion_tokens"
            };
            body.insert(field.into(), json!(max));
        }
        if let Some(temperature) = request.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if let Some(key) = &request.prompt_cache_key {
            body.insert("prompt_cache_key".into(), json!(key));
        }
        for (key, value) in &request.extra_body {
            body.insert(key.clone(), value.clone());
        }
        Value::Object(body)
    }

    /// The complete HTTP request for `request`: POST to `{base_url}/chat/completions` with the
    /// bearer key, the session-affinity header, configured then per-request headers, and
    /// [`OpenAi::body`].
    pub fn http_request(&self, request: &Request) -> Result<reqwest::Request, Error> {
        let mut headers = http::stream_headers();
        if let Some(key) = self.endpoint.api_key() {
            headers.insert(
                AUTHORIZATION,
                http::secret_header(format!("Bearer {}", key.expose()))?,
            );
        }
        self.endpoint.post(headers, request, &self.body(request))
    }
}

impl Provider for OpenAi {
    fn stream(&self, request: Request) -> EventStream {
        self.endpoint
            .stream(self.http_request(&request), Parser::new().into_wire())
    }
}

fn messages(request: &Request) -> Vec<Value> {
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.is_empty() {
        let text: Vec<&str> = request
            .system
            .iter()
            .map(|part| part.text.as_str())
            .collect();
        out.push(json!({ "role": "system", "content": text.join("\n\n") }));
    }
    for message in &request.messages {
        match message {
            Message::User { text, files } => out.push(user(text, files)),
            Message::Assistant { parts } => {
                if let Some(message) = assistant(parts) {
                    out.push(message);
                }
            }
            Message::Tool(result) => out.push(json!({
                "role": "tool",
                "tool_call_id": result.call_id,
                "content": result.output,
            })),
        }
    }
    out
}

fn user(text: &str, files: &[File]) -> Value {
    if files.is_empty() {
        return json!({ "role": "user", "content": text });
    }
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({ "type": "text", "text": text }));
    }
    for file in files {
        content.push(match &file.content {
            FileContent::Url(url) if file.media_type.starts_with("image/") => {
                json!({ "type": "image_url", "image_url": { "url": url } })
            }
            // Chat Completions takes other files only as uploads or base64, so a URL is named.
            FileContent::Url(url) => json!({ "type": "text", "text": file_link(file, url) }),
            FileContent::Text(body) => json!({ "type": "text", "text": file_text(file, body) }),
        });
    }
    json!({ "role": "user", "content": content })
}

/// A file by URL where the API cannot attach it: named, so the model knows it exists. Shared
/// with the Anthropic mapping.
pub(crate) fn file_link(file: &File, url: &str) -> String {
    format!(
        "[file {}: {url}]",
        file.name.as_deref().unwrap_or("attachment")
    )
}

/// Inline text attachments, shared with the Anthropic mapping.
pub(crate) fn file_text(file: &File, body: &str) -> String {
    match &file.name {
        Some(name) => format!(
            "<file name=\"{name}\" type=\"{}\">\n{body}\n</file>",
            file.media_type
        ),
        None => format!("<file type=\"{}\">\n{body}\n</file>", file.media_type),
    }
}

fn assistant(parts: &[AssistantPart]) -> Option<Value> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in parts {
        match part {
            AssistantPart::Text(more) => text.push_str(more),
            AssistantPart::Reasoning { .. } => {}
            AssistantPart::ToolCall(call) => calls.push(json!({
                "id": call.id,
                "type": "function",
                "function": { "name": call.name, "arguments": call.input },
            })),
        }
    }
    if text.is_empty() && calls.is_empty() {
        // Reasoning alone has nothing to replay here.
        return None;
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        if text.is_empty() {
            Value::Null
        } else {
            json!(text)
        },
    );
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Some(Value::Object(message))
}
