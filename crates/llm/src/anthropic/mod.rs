//! Anthropic Messages (`kind = "anthropic"`): the request body and headers, and the stream
//! [`Parser`].
//!
//! Request mapping: system parts become `system` text blocks with `cache_control: {type:
//! ephemeral}` on the last stable part (tools and system then form the cached prefix); user
//! text and files become content blocks; assistant parts become `thinking` (signature replayed
//! verbatim), `redacted_thinking`, `text` and `tool_use` blocks in order; consecutive tool
//! results become `tool_result` blocks of one user message, ahead of any user text that
//! follows, as the API requires. Reasoning without Anthropic metadata (from another provider)
//! is dropped: the API rejects unsigned thinking. Empty text blocks are dropped: the API rejects
//! them.

mod parse;

use std::fmt;
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

pub use parse::Parser;

use crate::config::Config;
use crate::error::Error;
use crate::http::{self, Endpoint};
use crate::openai::{file_link, file_text};
use crate::provider::{EventStream, Provider};
use crate::request::{
    AssistantPart, File, FileContent, Message, ReasoningMetadata, Request, ToolChoice,
};

/// Anthropic's public endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com/v1";

/// The API version this client speaks.
pub const API_VERSION: &str = "2023-06-01";

/// A Messages client. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Anthropic {
    endpoint: Arc<Endpoint>,
    default_max_output: u32,
}

impl fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.endpoint.fmt_as("Anthropic", f)
    }
}

impl Anthropic {
    /// A client for `config` (its `kind` is not checked). No connection is made yet.
    pub fn new(config: &Config) -> Result<Self, Error> {
        Ok(Self {
            endpoint: Arc::new(Endpoint::new(
                config,
                DEFAULT_BASE_URL,
                "messages",
                "anthropic",
            )?),
            default_max_output: config.default_max_output,
        })
    }

    /// The JSON body sent for `request`.
    pub fn body(&self, request: &Request) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(request.model));
        body.insert(
            "max_tokens".into(),
            json!(request.max_output.unwrap_or(self.default_max_output)),
        );
        body.insert("stream".into(), json!(true));
        let system = system(request);
        if !system.is_empty() {
            body.insert("system".into(), Value::Array(system));
        }
        body.insert("messages".into(), Value::Array(messages(request)));
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(|tool| {
                    let mut spec = Map::new();
                    spec.insert("name".into(), json!(tool.name));
                    if !tool.description.is_empty() {
                        spec.insert("description".into(), json!(tool.description));
                    }
                    spec.insert("input_schema".into(), tool.parameters.clone());
                    Value::Object(spec)
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            let choice = match &request.tool_choice {
                ToolChoice::Auto => json!({ "type": "auto" }),
                ToolChoice::None => json!({ "type": "none" }),
                ToolChoice::Required => json!({ "type": "any" }),
                ToolChoice::Tool(name) => json!({ "type": "tool", "name": name }),
            };
            body.insert("tool_choice".into(), choice);
        }
        if let Some(temperature) = request.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        for (key, value) in &request.extra_body {
            body.insert(key.clone(), value.clone());
        }
        Value::Object(body)
    }

    /// The complete HTTP request for `request`: POST to `{base_url}/messages` with `x-api-key`,
    /// `anthropic-version`, the session-affinity header, configured then per-request headers,
    /// and [`Anthropic::body`].
    pub fn http_request(&self, request: &Request) -> Result<reqwest::Request, Error> {
        let mut headers = http::stream_headers();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        if let Some(key) = self.endpoint.api_key() {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                http::secret_header(key.expose().to_owned())?,
            );
        }
        self.endpoint.post(headers, request, &self.body(request))
    }
}

impl Provider for Anthropic {
    fn stream(&self, request: Request) -> EventStream {
        self.endpoint
            .stream(self.http_request(&request), Parser::new().into_wire())
    }
}

fn system(request: &Request) -> Vec<Value> {
    let last_stable = request.system.iter().rposition(|part| part.stable);
    request
        .system
        .iter()
        .enumerate()
        .filter(|(_, part)| !part.text.is_empty())
        .map(|(position, part)| {
            let mut block = Map::new();
            block.insert("type".into(), json!("text"));
            block.insert("text".into(), json!(part.text));
            if Some(position) == last_stable {
                block.insert("cache_control".into(), json!({ "type": "ephemeral" }));
            }
            Value::Object(block)
        })
        .collect()
}

fn messages(request: &Request) -> Vec<Value> {
    // (role, content blocks); adjacent turns of one role are merged below.
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            Message::User { text, files } => ("user", user(text, files)),
            Message::Assistant { parts } => ("assistant", assistant(parts)),
            Message::Tool(result) => {
                let mut block = Map::new();
                block.insert("type".into(), json!("tool_result"));
                block.insert("tool_use_id".into(), json!(result.call_id));
                if !result.output.is_empty() {
                    block.insert("content".into(), json!(result.output));
                }
                if result.is_error {
                    block.insert("is_error".into(), json!(true));
                }
                ("user", vec![Value::Object(block)])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, content)) if *last_role == role => content.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({ "role": role, "content": content }))
        .collect()
}

fn user(text: &str, files: &[File]) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !text.is_empty() {
        blocks.push(json!({ "type": "text", "text": text }));
    }
    for file in files {
        blocks.push(match &file.content {
            FileContent::Url(url) if file.media_type.starts_with("image/") => {
                json!({ "type": "image", "source": { "type": "url", "url": url } })
            }
            FileContent::Url(url) if file.media_type == "application/pdf" => {
                json!({ "type": "document", "source": { "type": "url", "url": url } })
            }
            FileContent::Url(url) => json!({ "type": "text", "text": file_link(file, url) }),
            FileContent::Text(body) => json!({ "type": "text", "text": file_text(file, body) }),
        });
    }
    blocks
}

fn assistant(parts: &[AssistantPart]) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in parts {
        match part {
            AssistantPart::Reasoning {
                text,
                metadata: Some(ReasoningMetadata::Anthropic { signature }),
            } => {
                blocks.push(json!({ "type": "thinking", "thinking": text, "signature": signature }))
            }
            AssistantPart::Reasoning {
                metadata: Some(ReasoningMetadata::AnthropicRedacted { data }),
                ..
            } => blocks.push(json!({ "type": "redacted_thinking", "data": data })),
            AssistantPart::Reasoning { metadata: None, .. } => {}
            AssistantPart::Text(text) if text.is_empty() => {}
            AssistantPart::Text(text) => blocks.push(json!({ "type": "text", "text": text })),
            AssistantPart::ToolCall(call) => {
                // The API wants the input as an object. Arguments that were not one were
                // already answered with a failed tool result; `{}` keeps the turn valid.
                let input = match serde_json::from_str::<Value>(&call.input) {
                    Ok(object @ Value::Object(_)) => object,
                    _ => json!({}),
                };
                blocks.push(json!({
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": input,
                }));
            }
        }
    }
    blocks
}
