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

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

pub use parse::Parser;

use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::http::{self, Timeouts};
use crate::openai::file_text;
use crate::provider::{EventStream, Provider};
use crate::request::{
    AssistantPart, File, FileContent, Headers, Message, ReasoningMetadata, Request, ToolChoice,
};
use crate::secret::ApiKey;

/// Anthropic's public endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com/v1";

/// The API version this client speaks.
pub const API_VERSION: &str = "2023-06-01";

/// A Messages client. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Anthropic {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    api_key: Option<ApiKey>,
    headers: Headers,
    affinity_header: String,
    timeouts: Timeouts,
    default_max_output: u32,
}

impl fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Anthropic")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("api_key", &self.inner.api_key)
            .field("headers", &self.inner.headers)
            .finish_non_exhaustive()
    }
}

impl Anthropic {
    /// A client for `config` (its `kind` is not checked). No connection is made yet.
    pub fn new(config: &Config) -> Result<Self, Error> {
        let base = config.base_url_or(DEFAULT_BASE_URL);
        let endpoint = reqwest::Url::parse(&format!("{base}/messages"))
            .map_err(|_| Error::new(ErrorKind::InvalidRequest, "invalid base_url for anthropic"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                client: http::client(config.connect_timeout)?,
                endpoint,
                api_key: config.api_key.clone(),
                headers: config.headers.clone(),
                affinity_header: config.affinity_header.clone(),
                timeouts: Timeouts {
                    connect: config.connect_timeout,
                    idle: config.idle_timeout,
                },
                default_max_output: config.default_max_output,
            }),
        })
    }

    /// The JSON body sent for `request`.
    pub fn body(&self, request: &Request) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(request.model));
        body.insert(
            "max_tokens".into(),
            json!(request.max_output.unwrap_or(self.inner.default_max_output)),
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
        let inner = &self.inner;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        if let Some(key) = &inner.api_key {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                http::secret_header(key.expose().to_owned())?,
            );
        }
        let mut extra = Headers::new();
        if let Some(session) = &request.session_id
            && !inner.affinity_header.is_empty()
        {
            extra.insert(inner.affinity_header.clone(), session.clone());
        }
        http::add_headers(&mut headers, &extra)?;
        http::add_headers(&mut headers, &inner.headers)?;
        http::add_headers(&mut headers, &request.headers)?;
        let body = serde_json::to_vec(&self.body(request)).map_err(|error| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("cannot encode the body: {error}"),
            )
        })?;
        let mut http_request = reqwest::Request::new(reqwest::Method::POST, inner.endpoint.clone());
        *http_request.headers_mut() = headers;
        *http_request.body_mut() = Some(body.into());
        Ok(http_request)
    }
}

impl Provider for Anthropic {
    fn stream(&self, request: Request) -> EventStream {
        match self.http_request(&request) {
            Ok(http_request) => http::stream(
                self.inner.client.clone(),
                http_request,
                Parser::new(),
                self.inner.timeouts,
                self.inner.api_key.clone(),
            ),
            Err(error) => Box::pin(futures::stream::once(async move { Err(error) })),
        }
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
            FileContent::Url(url) => json!({
                "type": "text",
                "text": format!("[file {}: {url}]", file.name.as_deref().unwrap_or("attachment")),
            }),
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
