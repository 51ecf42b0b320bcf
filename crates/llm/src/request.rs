//! The provider-neutral request: model, system parts, messages, tools and options.
//!
//! These types are `llm`'s own; the runtime's request preparation maps session history into
//! them. Each provider module turns a [`Request`] into its wire format.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One model call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    /// The provider's model id.
    pub model: String,
    /// System prompt parts, in order. The [`SystemPart::stable`] ones form the cacheable prefix.
    pub system: Vec<SystemPart>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools the model may call. When empty, no tools and no tool choice are sent.
    pub tools: Vec<Tool>,
    /// Whether and which tool the model must call.
    pub tool_choice: ToolChoice,
    /// Maximum output tokens. Anthropic requires a value; the provider's configured default is
    /// sent when this is `None`.
    pub max_output: Option<u32>,
    /// Sampling temperature, when set.
    pub temperature: Option<f64>,
    /// Extra HTTP headers for this request (after the provider's configured ones).
    pub headers: Headers,
    /// OpenAI's `prompt_cache_key` (the session id). Anthropic has no such field and
    /// caches by `cache_control` on the stable prefix instead.
    pub prompt_cache_key: Option<String>,
    /// The session this call belongs to, sent in the session-affinity header so a load balancer
    /// can keep a session on the replica that holds its cache.
    pub session_id: Option<String>,
    /// Provider-specific top-level body fields, merged over the built body (e.g. Anthropic
    /// `thinking`, OpenAI `reasoning_effort`). An escape hatch; prefer typed fields.
    pub extra_body: serde_json::Map<String, Value>,
}

impl Request {
    /// A request for `model` with no messages yet.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            ..Self::default()
        }
    }
}

/// One part of the system prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemPart {
    /// The text.
    pub text: String,
    /// Part of the stable prefix that stays identical across calls of a session, so providers
    /// can cache it. Anthropic gets `cache_control` on the last stable part.
    pub stable: bool,
}

impl SystemPart {
    /// A part of the stable, cacheable prefix.
    pub fn stable(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            stable: true,
        }
    }

    /// A part that may change from call to call.
    pub fn volatile(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            stable: false,
        }
    }
}

/// One conversation message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// User input with optional attachments.
    User {
        /// The text.
        text: String,
        /// Attachments.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<File>,
    },
    /// A previous model turn, replayed.
    Assistant {
        /// Its parts in the order the model produced them.
        parts: Vec<AssistantPart>,
    },
    /// The result of one tool call of the preceding assistant message.
    Tool(ToolResult),
}

impl Message {
    /// User text without attachments.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            text: text.into(),
            files: Vec::new(),
        }
    }

    /// An assistant message of plain text.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Assistant {
            parts: vec![AssistantPart::Text(text.into())],
        }
    }

    /// A successful tool result.
    pub fn tool_result(call_id: impl Into<String>, output: impl Into<String>) -> Self {
        Self::Tool(ToolResult {
            call_id: call_id.into(),
            output: output.into(),
            is_error: false,
        })
    }

    /// A failed tool result, which the model sees as an error.
    pub fn tool_error(call_id: impl Into<String>, output: impl Into<String>) -> Self {
        Self::Tool(ToolResult {
            call_id: call_id.into(),
            output: output.into(),
            is_error: true,
        })
    }
}

/// A file attached to user input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct File {
    /// Display name, if any.
    pub name: Option<String>,
    /// MIME type, e.g. `text/plain`, `image/png`, `application/pdf`.
    pub media_type: String,
    /// The content.
    pub content: FileContent,
}

/// How an attachment's content is carried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileContent {
    /// Inline text, sent as a text part wrapped in a `<file>` tag.
    Text(String),
    /// A URL: images become image parts, PDFs become Anthropic document parts, anything else is
    /// referenced in text.
    Url(String),
}

/// One part of a replayed assistant message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssistantPart {
    /// Visible text.
    Text(String),
    /// Reasoning the model produced, with the provider's opaque metadata to replay unchanged.
    Reasoning {
        /// The reasoning text (may be empty for redacted reasoning).
        text: String,
        /// Provider metadata, e.g. an Anthropic signature.
        metadata: Option<ReasoningMetadata>,
    },
    /// A tool call the model made.
    ToolCall(ToolCall),
}

/// A tool call: the provider's call id, the tool name and the arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id, unique within its assistant message.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments exactly as the model produced them (`{}` when it produced none). Usually
    /// a JSON object, but not guaranteed: validate before executing.
    pub input: String,
}

/// The result of executing a tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The [`ToolCall::id`] this answers.
    pub call_id: String,
    /// The output text the model sees.
    pub output: String,
    /// Whether the call failed. Anthropic carries this as `is_error`; OpenAI has no such flag,
    /// so there the output text must say so.
    pub is_error: bool,
}

/// Opaque provider data attached to a reasoning part, replayed unchanged on later requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case")]
pub enum ReasoningMetadata {
    /// An Anthropic `thinking` block's signature.
    Anthropic {
        /// The signature, verbatim.
        signature: String,
    },
    /// An Anthropic `redacted_thinking` block: encrypted reasoning with no readable text.
    AnthropicRedacted {
        /// The encrypted data, verbatim.
        data: String,
    },
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must not call tools.
    None,
    /// The model must call some tool.
    Required,
    /// The model must call this tool.
    Tool(String),
}

/// HTTP headers as name-value pairs. `Debug` hides the values of credential-bearing headers
/// (`authorization`, `x-api-key`, `api-key`, `cookie`, `proxy-authorization`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a header.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.push((name.into(), value.into()));
    }

    /// The headers in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a header of this name carries a credential.
    pub fn is_sensitive(name: &str) -> bool {
        const SENSITIVE: [&str; 5] = [
            "authorization",
            "proxy-authorization",
            "x-api-key",
            "api-key",
            "cookie",
        ];
        SENSITIVE.iter().any(|s| s.eq_ignore_ascii_case(name))
    }
}

impl<N: Into<String>, V: Into<String>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .collect(),
        )
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, value)| {
                let shown = if Self::is_sensitive(name) {
                    "[redacted]"
                } else {
                    value.as_str()
                };
                (name, shown)
            }))
            .finish()
    }
}
