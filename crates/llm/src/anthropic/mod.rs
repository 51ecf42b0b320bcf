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

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue};
use serde::ser::SerializeMap as _;
use serde::{Serialize, Serializer};
use serde_json::{Value, json};

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

    /// The JSON body sent for `request`, as a tree (the bytes sent are serialized from the same
    /// [`Body`] without building one).
    pub fn body(&self, request: &Request) -> Value {
        serde_json::to_value(self.wire_body(request)).unwrap_or(Value::Null)
    }

    fn wire_body<'a>(&self, request: &'a Request) -> Body<'a> {
        Body {
            request,
            default_max_output: self.default_max_output,
        }
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
        self.endpoint
            .post(headers, request, &self.wire_body(request))
    }
}

impl Provider for Anthropic {
    fn stream(&self, request: Request) -> EventStream {
        self.stream_ref(&request)
    }

    fn stream_ref(&self, request: &Request) -> EventStream {
        self.endpoint
            .stream(self.http_request(request), Parser::new().into_wire())
    }
}

/// The Messages body of a request, serialized straight from it: the built fields, then
/// `extra_body`, whose keys replace built ones.
struct Body<'a> {
    request: &'a Request,
    default_max_output: u32,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let request = self.request;
        let extra = &request.extra_body;
        let mut map = serializer.serialize_map(None)?;
        http::field(&mut map, extra, "model", &request.model)?;
        let max_tokens = request.max_output.unwrap_or(self.default_max_output);
        http::field(&mut map, extra, "max_tokens", &max_tokens)?;
        http::field(&mut map, extra, "stream", &true)?;
        let system = system(request);
        if !system.is_empty() {
            http::field(&mut map, extra, "system", &system)?;
        }
        http::field(&mut map, extra, "messages", &turns(request))?;
        if !request.tools.is_empty() {
            let tools: Vec<Tool<'_>> = request
                .tools
                .iter()
                .map(|tool| Tool {
                    name: &tool.name,
                    description: Some(tool.description.as_str()).filter(|d| !d.is_empty()),
                    input_schema: &tool.parameters,
                })
                .collect();
            http::field(&mut map, extra, "tools", &tools)?;
            let choice = match &request.tool_choice {
                ToolChoice::Auto => json!({ "type": "auto" }),
                ToolChoice::None => json!({ "type": "none" }),
                ToolChoice::Required => json!({ "type": "any" }),
                ToolChoice::Tool(name) => json!({ "type": "tool", "name": name }),
            };
            http::field(&mut map, extra, "tool_choice", &choice)?;
        }
        if let Some(temperature) = request.temperature {
            http::field(&mut map, extra, "temperature", &temperature)?;
        }
        for (key, value) in extra {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct Tool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: &'a Value,
}

/// A system text block; the last stable one marks the end of the cached prefix.
#[derive(Serialize)]
struct SystemBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Serialize)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

fn system(request: &Request) -> Vec<SystemBlock<'_>> {
    let last_stable = request.system.iter().rposition(|part| part.stable);
    request
        .system
        .iter()
        .enumerate()
        .filter(|(_, part)| !part.text.is_empty())
        .map(|(position, part)| SystemBlock {
            kind: "text",
            text: &part.text,
            cache_control: (Some(position) == last_stable)
                .then_some(CacheControl { kind: "ephemeral" }),
        })
        .collect()
}

/// One message of the body: a role and its content blocks.
#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

/// A content block.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: Cow<'a, str>,
    },
    Image {
        source: Source<'a>,
    },
    Document {
        source: Source<'a>,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
struct Source<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    url: &'a str,
}

/// The conversation as turns; adjacent messages of one role are merged into one turn.
fn turns(request: &Request) -> Vec<Turn<'_>> {
    let mut turns: Vec<Turn<'_>> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            Message::User { text, files } => ("user", user(text, files)),
            Message::Assistant { parts } => ("assistant", assistant(parts)),
            Message::Tool(result) => (
                "user",
                vec![Block::ToolResult {
                    tool_use_id: &result.call_id,
                    content: Some(result.output.as_str()).filter(|o| !o.is_empty()),
                    is_error: result.is_error,
                }],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => turns.push(Turn {
                role,
                content: blocks,
            }),
        }
    }
    turns
}

fn user<'a>(text: &'a str, files: &'a [File]) -> Vec<Block<'a>> {
    let mut blocks = Vec::new();
    if !text.is_empty() {
        blocks.push(Block::Text {
            text: Cow::Borrowed(text),
        });
    }
    for file in files {
        blocks.push(match &file.content {
            FileContent::Url(url) if file.media_type.starts_with("image/") => Block::Image {
                source: Source { kind: "url", url },
            },
            FileContent::Url(url) if file.media_type == "application/pdf" => Block::Document {
                source: Source { kind: "url", url },
            },
            FileContent::Url(url) => Block::Text {
                text: Cow::Owned(file_link(file, url)),
            },
            FileContent::Text(body) => Block::Text {
                text: Cow::Owned(file_text(file, body)),
            },
        });
    }
    blocks
}

fn assistant(parts: &[AssistantPart]) -> Vec<Block<'_>> {
    let mut blocks = Vec::new();
    for part in parts {
        match part {
            AssistantPart::Reasoning {
                text,
                metadata: Some(ReasoningMetadata::Anthropic { signature }),
            } => blocks.push(Block::Thinking {
                thinking: text,
                signature,
            }),
            AssistantPart::Reasoning {
                metadata: Some(ReasoningMetadata::AnthropicRedacted { data }),
                ..
            } => blocks.push(Block::RedactedThinking { data }),
            AssistantPart::Reasoning { metadata: None, .. } => {}
            AssistantPart::Text(text) if text.is_empty() => {}
            AssistantPart::Text(text) => blocks.push(Block::Text {
                text: Cow::Borrowed(text),
            }),
            AssistantPart::ToolCall(call) => {
                // The API wants the input as an object. Arguments that were not one were
                // already answered with a failed tool result; `{}` keeps the turn valid.
                let input = match serde_json::from_str::<Value>(&call.input) {
                    Ok(object @ Value::Object(_)) => object,
                    _ => json!({}),
                };
                blocks.push(Block::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    input,
                });
            }
        }
    }
    blocks
}
