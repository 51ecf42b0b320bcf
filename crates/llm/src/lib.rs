//! `agenthost-llm`: the provider client.
//!
//! **Owns**: its own request and event types ([`Request`], [`Event`], [`Response`]), the
//! [`Provider`] trait, the OpenAI-compatible Chat Completions and Anthropic Messages clients
//! over HTTP (reqwest, and HTTP/1.1 connections of its own for plain-`http://` providers) with
//! the incremental SSE decoder of `agenthost-http`, the scripted provider for tests,
//! the mock provider and its HTTP server, and the error taxonomy ([`Error`], [`ErrorKind`]).
//!
//! **Must not**: depend on any other agenthost crate but `agenthost-http` (it knows nothing of
//! sessions, the store or actors); retry (one call is exactly one HTTP request, retries live in the runtime); use an
//! SSE client that reconnects by re-sending the POST; put a total deadline on a stream (an idle
//! timeout between bytes instead); print a secret (keys are [`ApiKey`]s, credential headers are
//! redacted in `Debug`, provider error messages are scrubbed of the key).
//!
//! Main types:
//! - [`Provider`]: `stream(Request) -> EventStream` and `generate(Request) -> Response`.
//! - [`Config`] / [`Kind`]: how to reach a provider; [`Config::build`] gives an
//!   `Arc<dyn Provider>`.
//! - [`OpenAi`], [`Anthropic`], [`Mock`], [`Scripted`]: the implementations.
//! - [`Event`]: the stream contract is documented in [`event`]; [`Usage`] documents the
//!   normalization of token counts across providers.
//! - [`openai::Parser`], [`anthropic::Parser`], [`sse::Decoder`]: the byte-level parsers, usable
//!   on their own (tests, benches, recorded streams).

pub mod anthropic;
mod config;
mod error;
pub mod event;
mod http;
pub mod mock;
pub mod openai;
mod provider;
mod request;
pub mod rules;
pub mod scripted;
mod secret;
mod wire;

pub use agenthost_http::{client_builder, sse};
pub use anthropic::Anthropic;
pub use config::{Config, DEFAULT_STREAMS_PER_CONNECTION, Kind};
pub use error::{Error, ErrorKind};
pub use event::{
    Collector, Event, FinishReason, MAX_COLLECTED, Reasoning, Response, Usage, collect,
};
pub use mock::Mock;
pub use openai::OpenAi;
pub use provider::{EventStream, Provider};
pub use request::{
    AssistantPart, File, FileContent, Headers, Message, ReasoningMetadata, Request, SystemPart,
    Tool, ToolCall, ToolChoice, ToolResult,
};
pub use scripted::Scripted;
pub use secret::ApiKey;
pub use wire::Output;
