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

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use reqwest::header::AUTHORIZATION;
use serde::ser::{SerializeMap as _, SerializeSeq as _};
use serde::{Serialize, Serializer};
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

    /// The JSON body sent for `request`, as a tree (the bytes sent are serialized from the same
    /// [`Body`] without building one).
    pub fn body(&self, request: &Request) -> Value {
        serde_json::to_value(self.wire_body(request)).unwrap_or(Value::Null)
    }

    fn wire_body<'a>(&self, request: &'a Request) -> Body<'a> {
        Body {
            request,
            legacy_max_tokens: self.legacy_max_tokens,
        }
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
        self.endpoint
            .post(headers, request, &self.wire_body(request))
    }
}

impl Provider for OpenAi {
    fn stream(&self, request: Request) -> EventStream {
        self.stream_ref(&request)
    }

    fn stream_ref(&self, request: &Request) -> EventStream {
        self.endpoint
            .stream(self.http_request(request), Parser::new().into_wire())
    }
}

/// The Chat Completions body of a request, serialized straight from it: the built fields, then
/// `extra_body`, whose keys replace built ones.
struct Body<'a> {
    request: &'a Request,
    legacy_max_tokens: bool,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let request = self.request;
        let extra = &request.extra_body;
        let mut map = serializer.serialize_map(None)?;
        http::field(&mut map, extra, "model", &request.model)?;
        http::field(&mut map, extra, "messages", &Messages(request))?;
        http::field(&mut map, extra, "stream", &true)?;
        http::field(
            &mut map,
            extra,
            "stream_options",
            &json!({ "include_usage": true }),
        )?;
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
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
            http::field(&mut map, extra, "tools", &tools)?;
            // Sent only with tools: OpenAI rejects a tool_choice without them.
            let choice = match &request.tool_choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool(name) => {
                    json!({ "type": "function", "function": { "name": name } })
                }
            };
            http::field(&mut map, extra, "tool_choice", &choice)?;
        }
        if let Some(max) = request.max_output {
            let key = if self.legacy_max_tokens {
                "max_tokens"
            } else {
                "max_completion_tokens"
            };
            http::field(&mut map, extra, key, &max)?;
        }
        if let Some(temperature) = request.temperature {
            http::field(&mut map, extra, "temperature", &temperature)?;
        }
        if let Some(key) = &request.prompt_cache_key {
            http::field(&mut map, extra, "prompt_cache_key", key)?;
        }
        for (key, value) in extra {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// `messages`: the system prompt as one message, then the conversation.
struct Messages<'a>(&'a Request);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let request = self.0;
        let mut seq = serializer.serialize_seq(None)?;
        if !request.system.is_empty() {
            let text: Vec<&str> = request
                .system
                .iter()
                .map(|part| part.text.as_str())
                .collect();
            seq.serialize_element(&Role {
                role: "system",
                content: Some(Content::Text(&text.join("\n\n"))),
                ..Role::default()
            })?;
        }
        for message in &request.messages {
            match message {
                Message::User { text, files } if files.is_empty() => {
                    seq.serialize_element(&Role {
                        role: "user",
                        content: Some(Content::Text(text)),
                        ..Role::default()
                    })?
                }
                Message::User { text, files } => seq.serialize_element(&Role {
                    role: "user",
                    content: Some(Content::Parts(user_parts(text, files))),
                    ..Role::default()
                })?,
                Message::Assistant { parts } => {
                    if let Some(message) = Assistant::of(parts) {
                        seq.serialize_element(&message)?;
                    }
                }
                Message::Tool(result) => seq.serialize_element(&Role {
                    role: "tool",
                    tool_call_id: Some(&result.call_id),
                    content: Some(Content::Text(&result.output)),
                })?,
            }
        }
        seq.end()
    }
}

/// A system, user or tool message.
#[derive(Serialize, Default)]
struct Role<'a> {
    role: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Content<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(&'a str),
    Parts(Vec<Value>),
}

/// A user message's text and files as content parts.
fn user_parts(text: &str, files: &[File]) -> Vec<Value> {
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
    content
}

/// An assistant message: its text (null when it has none) and its tool calls.
#[derive(Serialize)]
struct Assistant<'a> {
    role: &'static str,
    content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call<'a>>,
}

#[derive(Serialize)]
struct Call<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl<'a> Assistant<'a> {
    /// `None` when there is nothing to replay (reasoning alone).
    fn of(parts: &'a [AssistantPart]) -> Option<Self> {
        let mut text: Option<Cow<'a, str>> = None;
        let mut tool_calls = Vec::new();
        for part in parts {
            match part {
                AssistantPart::Text(more) => match &mut text {
                    None => text = Some(Cow::Borrowed(more)),
                    Some(text) => text.to_mut().push_str(more),
                },
                AssistantPart::Reasoning { .. } => {}
                AssistantPart::ToolCall(call) => tool_calls.push(Call {
                    id: &call.id,
                    kind: "function",
                    function: Function {
                        name: &call.name,
                        arguments: &call.input,
                    },
                }),
            }
        }
        let content = text.filter(|text| !text.is_empty());
        if content.is_none() && tool_calls.is_empty() {
            return None;
        }
        Some(Assistant {
            role: "assistant",
            content,
            tool_calls,
        })
    }
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
