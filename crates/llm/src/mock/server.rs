//! The mock provider over HTTP (`agenthost mock-provider`): an axum server speaking OpenAI Chat
//! Completions (`POST /v1/chat/completions`, streaming or not; `GET /v1/models`) and Anthropic
//! Messages (`POST /v1/messages`, streamed), with the mock's latency, token rate and tool-call
//! ratio, and injected failures for fault tests (OpenAI route). Both routes refuse, with the
//! provider's 400 body, every request the real API would refuse ([`crate::rules`]).
//!
//! A failure is chosen per request by the `x-mock-fail` header (one of [`Failure`]'s names), or
//! else by [`Config::fail_ratio`], drawn deterministically from the request's sequence number.
//! Every request is counted ([`Handle::requests`]) so tests can assert that a client sent
//! exactly one.
//!
//! One port serves HTTP/1.1 and HTTP/2 without TLS (h2c, for a client with prior knowledge),
//! as a real provider offers HTTP/2 over TLS. `close_connections` applies to HTTP/1.1 only.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Version, header};
use axum::response::Response;
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Plan, Reply, SplitMix, fragments, mix, plan};
use crate::request::{
    AssistantPart, Message, Request, SystemPart, Tool, ToolCall, ToolChoice, ToolResult,
};

/// An injected failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// 429 with `retry-after` and an OpenAI `rate_limit_exceeded` body.
    RateLimit,
    /// 429 with OpenAI's `insufficient_quota` body.
    Quota,
    /// 500 with an OpenAI `server_error` body.
    Internal,
    /// 529 `overloaded_error`, as Anthropic sends it.
    Overloaded,
    /// 400 `context_length_exceeded`, with OpenAI's message.
    ContextOverflow,
    /// 401 `invalid_api_key`.
    Auth,
    /// A 200 stream that stops halfway, without `finish_reason` or `[DONE]`.
    Truncate,
    /// A 200 stream that sends its first chunk and then nothing until shutdown.
    Stall,
    /// A 200 stream with an `error` chunk halfway.
    StreamError,
}

impl Failure {
    /// Every failure, in declaration order.
    pub const ALL: [Self; 9] = [
        Self::RateLimit,
        Self::Quota,
        Self::Internal,
        Self::Overloaded,
        Self::ContextOverflow,
        Self::Auth,
        Self::Truncate,
        Self::Stall,
        Self::StreamError,
    ];

    /// The `x-mock-fail` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::RateLimit => "rate_limit",
            Self::Quota => "quota",
            Self::Internal => "internal",
            Self::Overloaded => "overloaded",
            Self::ContextOverflow => "context_overflow",
            Self::Auth => "auth",
            Self::Truncate => "truncate",
            Self::Stall => "stall",
            Self::StreamError => "stream_error",
        }
    }
}

impl FromStr for Failure {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|failure| failure.name() == name)
            .ok_or_else(|| format!("unknown failure {name:?}"))
    }
}

/// Server behaviour.
#[derive(Clone, Debug)]
pub struct Config {
    /// Latency, token rate, tool-call ratio and seed, as for the in-process mock.
    pub mock: super::Config,
    /// Share of requests (0.0–1.0) that fail without an `x-mock-fail` header.
    pub fail_ratio: f64,
    /// The failures `fail_ratio` picks from.
    pub failures: Vec<Failure>,
    /// The `retry-after` sent with rate-limit responses (whole seconds).
    pub retry_after: Duration,
    /// Answer with `connection: close`, so every call opens a connection of its own (as some
    /// gateways do), instead of keeping it alive.
    pub close_connections: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            mock: super::Config::default(),
            fail_ratio: 0.0,
            failures: vec![
                Failure::RateLimit,
                Failure::Internal,
                Failure::Overloaded,
                Failure::Truncate,
            ],
            retry_after: Duration::from_secs(1),
            close_connections: false,
        }
    }
}

struct Shared {
    config: Config,
    requests: AtomicU64,
    /// Of [`Shared::requests`], those that came over HTTP/2.
    http2_requests: AtomicU64,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// Counts one more request; its sequence number, from 1.
    fn count(&self, version: Version) -> u64 {
        if version == Version::HTTP_2 {
            self.http2_requests.fetch_add(1, Ordering::SeqCst);
        }
        self.requests.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// A running mock server. Dropping it without [`Handle::shutdown`] leaves the task running
/// until the runtime stops.
#[derive(Debug)]
pub struct Handle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: JoinHandle<io::Result<()>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("requests", &self.requests)
            .field("http2_requests", &self.http2_requests)
            .finish_non_exhaustive()
    }
}

impl Handle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}/v1`, the `base_url` for an `openai` provider.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Chat-completion requests received so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Of [`Handle::requests`], those that came over HTTP/2.
    pub fn http2_requests(&self) -> u64 {
        self.shared.http2_requests.load(Ordering::SeqCst)
    }

    /// Stops accepting, ends stalled streams, waits for open responses to finish.
    pub async fn shutdown(self) -> io::Result<()> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|error| io::Error::other(format!("mock server task failed: {error}")))?
    }
}

/// Serves `config` on `listener` in a task of the current tokio runtime.
pub fn serve(listener: TcpListener, config: Config) -> io::Result<Handle> {
    let addr = listener.local_addr()?;
    let (stop, shutdown) = watch::channel(false);
    let shared = Arc::new(Shared {
        config,
        requests: AtomicU64::new(0),
        http2_requests: AtomicU64::new(0),
        shutdown: shutdown.clone(),
    });
    let mut app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .with_state(shared.clone());
    if shared.config.close_connections {
        // HTTP/2 has no `connection` header (a connection carries every call anyway).
        app = app.layer(axum::middleware::from_fn(
            |request: axum::extract::Request, next: axum::middleware::Next| async move {
                let http1 = request.version() < Version::HTTP_2;
                let mut response = next.run(request).await;
                if http1 {
                    response.headers_mut().insert(
                        header::CONNECTION,
                        header::HeaderValue::from_static("close"),
                    );
                }
                response
            },
        ));
    }
    let mut signal = shutdown;
    let task = tokio::spawn(async move {
        axum::serve(accepting(listener), app)
            .with_graceful_shutdown(async move {
                let _ = signal.wait_for(|stop| *stop).await;
            })
            .await
    });
    Ok(Handle {
        addr,
        shared,
        stop,
        task,
    })
}

/// The connections `listener` accepts, each sending what it is given at once (`TCP_NODELAY`), as
/// a provider's servers do. Otherwise the pieces of a streamed reply on a kept-alive connection
/// wait for the client's acknowledgement of the one before, which a client with nothing to send
/// delays (40 ms on Linux): every call after a connection's first took that long.
fn accepting(
    listener: TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    listener.tap_io(|connection| {
        if let Err(error) = connection.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on a mock provider connection");
        }
    })
}

async fn models() -> Response {
    json_response(
        StatusCode::OK,
        &json!({ "object": "list", "data": [{ "id": "mock", "object": "model", "owned_by": "agenthost" }] }),
    )
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let number = shared.count(version);
    let config = &shared.config;
    let Ok(wire) = serde_json::from_slice::<Value>(&body) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "We could not parse the JSON body of your request.",
            "invalid_request_error",
            None,
        );
    };
    let failure = match headers.get("x-mock-fail").map(|value| value.to_str()) {
        Some(Ok(name)) => match name.trim().parse::<Failure>() {
            Ok(failure) => Some(failure),
            Err(message) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    &message,
                    "invalid_request_error",
                    None,
                );
            }
        },
        Some(Err(_)) => None,
        None => drawn_failure(config, number),
    };
    match failure {
        Some(Failure::RateLimit) => {
            let mut response = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                "Rate limit reached for requests (mock).",
                "requests",
                Some("rate_limit_exceeded"),
            );
            let seconds = config.retry_after.as_secs().to_string();
            if let Ok(value) = seconds.parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return response;
        }
        Some(Failure::Quota) => {
            return error_response(
                StatusCode::TOO_MANY_REQUESTS,
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                Some("insufficient_quota"),
            );
        }
        Some(Failure::Internal) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The server had an error while processing your request (mock).",
                "server_error",
                None,
            );
        }
        Some(Failure::Overloaded) => {
            return error_response(
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "Overloaded",
                "overloaded_error",
                None,
            );
        }
        Some(Failure::ContextOverflow) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "This model's maximum context length is 128000 tokens. However, your messages \
                 resulted in 131072 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                Some("context_length_exceeded"),
            );
        }
        Some(Failure::Auth) => {
            return error_response(
                StatusCode::UNAUTHORIZED,
                "Incorrect API key provided (mock).",
                "invalid_request_error",
                Some("invalid_api_key"),
            );
        }
        _ => {}
    }
    if let Err(message) = crate::rules::openai(&wire) {
        return error_response(
            StatusCode::BAD_REQUEST,
            &message,
            "invalid_request_error",
            None,
        );
    }
    let request = decode(&wire);
    let plan = plan(&config.mock, &request);
    if wire.get("stream").and_then(Value::as_bool) != Some(true) {
        return json_response(StatusCode::OK, &completion(&request.model, &plan));
    }
    let include_usage = wire
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let frames = stream_frames(&config.mock, &request.model, &plan, include_usage);
    let body = match failure {
        Some(Failure::Truncate) => {
            let cut = frames.len() / 2;
            paced(frames.into_iter().take(cut.max(1)).collect()).boxed()
        }
        Some(Failure::Stall) => {
            let mut shutdown = shared.shutdown.clone();
            let stall = futures::stream::once(async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            })
            .filter_map(|()| futures::future::ready(None));
            paced(frames.into_iter().take(1).collect())
                .chain(stall)
                .boxed()
        }
        Some(Failure::StreamError) => {
            let cut = (frames.len() / 2).max(1);
            let mut frames: Vec<_> = frames.into_iter().take(cut).collect();
            let error = json!({
                "id": plan.id, "object": "chat.completion.chunk", "model": request.model,
                "choices": [],
                "error": { "message": "The stream failed (mock).", "type": "server_error", "code": "server_error" },
            });
            frames.push((Duration::ZERO, sse(&error)));
            frames.push((Duration::ZERO, Bytes::from_static(b"data: [DONE]\n\n")));
            paced(frames).boxed()
        }
        _ => paced(frames).boxed(),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn drawn_failure(config: &Config, number: u64) -> Option<Failure> {
    if config.fail_ratio <= 0.0 || config.failures.is_empty() {
        return None;
    }
    let mut random = SplitMix(mix(
        config.mock.seed ^ number.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    ));
    (random.unit() < config.fail_ratio)
        .then(|| config.failures[random.below(config.failures.len())])
}

fn paced(
    frames: Vec<(Duration, Bytes)>,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures::stream::iter(frames).then(|(pause, bytes)| async move {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        Ok(bytes)
    })
}

fn sse(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\n\n"))
}

fn created() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

fn usage(plan: &Plan) -> Value {
    let usage = plan.usage;
    let prompt = usage.input + usage.cache_read;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": { "cached_tokens": usage.cache_read },
        "completion_tokens_details": { "reasoning_tokens": usage.reasoning },
    })
}

/// The chunks of a streamed answer, each with the pause before it.
fn stream_frames(
    mock: &super::Config,
    model: &str,
    plan: &Plan,
    include_usage: bool,
) -> Vec<(Duration, Bytes)> {
    let created = created();
    let chunk = |delta: Value, finish: Option<&str>| {
        sse(&json!({
            "id": plan.id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        }))
    };
    let interval = mock.token_interval();
    let mut frames = vec![(
        Duration::ZERO,
        chunk(json!({ "role": "assistant", "content": "" }), None),
    )];
    let finish = match &plan.reply {
        Reply::Text(tokens) => {
            for (position, token) in tokens.iter().enumerate() {
                let pause = if position == 0 {
                    mock.latency
                } else {
                    interval
                };
                frames.push((pause, chunk(json!({ "content": token }), None)));
            }
            "stop"
        }
        Reply::Tool(call) => {
            let header = json!({ "tool_calls": [{ "index": 0, "id": call.id, "type": "function",
                "function": { "name": call.name, "arguments": "" } }] });
            frames.push((mock.latency, chunk(header, None)));
            for fragment in fragments(&call.input) {
                let delta = json!({ "tool_calls": [{ "index": 0, "function": { "arguments": fragment } }] });
                frames.push((interval, chunk(delta, None)));
            }
            "tool_calls"
        }
    };
    frames.push((Duration::ZERO, chunk(json!({}), Some(finish))));
    if include_usage {
        frames.push((
            Duration::ZERO,
            sse(&json!({
                "id": plan.id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [], "usage": usage(plan),
            })),
        ));
    }
    frames.push((Duration::ZERO, Bytes::from_static(b"data: [DONE]\n\n")));
    frames
}

/// A non-streaming `chat.completion`.
fn completion(model: &str, plan: &Plan) -> Value {
    let (message, finish) = match &plan.reply {
        Reply::Text(tokens) => (
            json!({ "role": "assistant", "content": tokens.concat() }),
            "stop",
        ),
        Reply::Tool(call) => (
            json!({ "role": "assistant", "content": null, "tool_calls": [{ "id": call.id,
                "type": "function", "function": { "name": call.name, "arguments": call.input } }] }),
            "tool_calls",
        ),
    };
    json!({
        "id": plan.id, "object": "chat.completion", "created": created(), "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": usage(plan),
    })
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// An error body in OpenAI's shape.
fn error_response(status: StatusCode, message: &str, kind: &str, code: Option<&str>) -> Response {
    json_response(
        status,
        &json!({ "error": { "message": message, "type": kind, "param": null, "code": code } }),
    )
}

/// Reads a Chat Completions request body back into a [`Request`] (leniently: the mock answers
/// whatever it can understand).
fn decode(wire: &Value) -> Request {
    let text = |value: Option<&Value>| -> String {
        match value {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    };
    let string = |value: &Value, key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut request = Request::new(string(wire, "model"));
    for message in wire
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match message.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => {
                request
                    .system
                    .push(SystemPart::stable(text(message.get("content"))));
            }
            Some("assistant") => {
                let mut parts = Vec::new();
                let content = text(message.get("content"));
                if !content.is_empty() {
                    parts.push(AssistantPart::Text(content));
                }
                for call in message
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let function = call.get("function").cloned().unwrap_or(Value::Null);
                    parts.push(AssistantPart::ToolCall(ToolCall {
                        id: string(call, "id"),
                        name: string(&function, "name"),
                        input: string(&function, "arguments"),
                    }));
                }
                request.messages.push(Message::Assistant { parts });
            }
            Some("tool") => request.messages.push(Message::Tool(ToolResult {
                call_id: string(message, "tool_call_id"),
                output: text(message.get("content")),
                is_error: false,
            })),
            _ => request
                .messages
                .push(Message::user(text(message.get("content")))),
        }
    }
    for tool in wire
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let function = tool.get("function").cloned().unwrap_or(Value::Null);
        request.tools.push(Tool {
            name: string(&function, "name"),
            description: string(&function, "description"),
            parameters: function
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({})),
        });
    }
    request.tool_choice = match wire.get("tool_choice") {
        Some(Value::String(choice)) if choice == "none" => ToolChoice::None,
        Some(Value::String(choice)) if choice == "required" => ToolChoice::Required,
        Some(Value::Object(choice)) => choice
            .get("function")
            .and_then(|function| function.get("name"))
            .and_then(Value::as_str)
            .map_or(ToolChoice::Auto, |name| ToolChoice::Tool(name.to_owned())),
        _ => ToolChoice::Auto,
    };
    request
}

/// `POST /v1/messages`: Anthropic Messages, streamed. A request the real API would refuse gets
/// its 400 `invalid_request_error`.
async fn messages(State(shared): State<Arc<Shared>>, version: Version, body: Bytes) -> Response {
    shared.count(version);
    let refuse = |message: &str| {
        json_response(
            StatusCode::BAD_REQUEST,
            &json!({ "type": "error", "error": { "type": "invalid_request_error", "message": message } }),
        )
    };
    let Ok(wire) = serde_json::from_slice::<Value>(&body) else {
        return refuse("We could not parse the JSON body of your request.");
    };
    if let Err(message) = crate::rules::anthropic(&wire) {
        return refuse(&message);
    }
    if wire.get("stream").and_then(Value::as_bool) != Some(true) {
        return refuse("this mock serves streamed Messages only (`stream: true`)");
    }
    let request = decode_anthropic(&wire);
    let plan = plan(&shared.config.mock, &request);
    let frames = anthropic_frames(&shared.config.mock, &request.model, &plan);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(paced(frames)))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn anthropic_event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// The events of a streamed Messages answer, each with the pause before it.
fn anthropic_frames(mock: &super::Config, model: &str, plan: &Plan) -> Vec<(Duration, Bytes)> {
    let usage = plan.usage;
    let start = json!({ "type": "message_start", "message": {
        "id": plan.id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": { "input_tokens": usage.input, "cache_read_input_tokens": usage.cache_read,
                   "cache_creation_input_tokens": 0, "output_tokens": 1 } } });
    let mut frames = vec![(Duration::ZERO, anthropic_event("message_start", &start))];
    let interval = mock.token_interval();
    let block = |content: Value| json!({ "type": "content_block_start", "index": 0, "content_block": content });
    let stop_reason = match &plan.reply {
        Reply::Text(tokens) => {
            let opened = block(json!({ "type": "text", "text": "" }));
            frames.push((
                mock.latency,
                anthropic_event("content_block_start", &opened),
            ));
            for token in tokens {
                let delta = json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "text_delta", "text": token } });
                frames.push((interval, anthropic_event("content_block_delta", &delta)));
            }
            "end_turn"
        }
        Reply::Tool(call) => {
            let opened =
                block(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": {} }));
            frames.push((
                mock.latency,
                anthropic_event("content_block_start", &opened),
            ));
            for fragment in fragments(&call.input) {
                let delta = json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "input_json_delta", "partial_json": fragment } });
                frames.push((interval, anthropic_event("content_block_delta", &delta)));
            }
            "tool_use"
        }
    };
    let stop = json!({ "type": "content_block_stop", "index": 0 });
    frames.push((Duration::ZERO, anthropic_event("content_block_stop", &stop)));
    let delta = json!({ "type": "message_delta",
        "delta": { "stop_reason": stop_reason, "stop_sequence": null },
        "usage": { "output_tokens": usage.output } });
    frames.push((Duration::ZERO, anthropic_event("message_delta", &delta)));
    frames.push((
        Duration::ZERO,
        anthropic_event("message_stop", &json!({ "type": "message_stop" })),
    ));
    frames
}

/// What the plan needs of a Messages body: model, system, messages, tools and tool choice.
fn decode_anthropic(wire: &Value) -> Request {
    let string = |value: &Value, key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let blocks = |message: &Value| -> Vec<Value> {
        match message.get("content") {
            Some(Value::Array(blocks)) => blocks.clone(),
            Some(Value::String(text)) => vec![json!({ "type": "text", "text": text })],
            _ => Vec::new(),
        }
    };
    let mut request = Request::new(string(wire, "model"));
    for part in wire
        .get("system")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        request
            .system
            .push(SystemPart::stable(string(part, "text")));
    }
    for message in wire
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let assistant = message.get("role").and_then(Value::as_str) == Some("assistant");
        let mut parts = Vec::new();
        let mut text = Vec::new();
        for block in blocks(message) {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => text.push(string(&block, "text")),
                Some("tool_use") => parts.push(AssistantPart::ToolCall(ToolCall {
                    id: string(&block, "id"),
                    name: string(&block, "name"),
                    input: block.get("input").map(Value::to_string).unwrap_or_default(),
                })),
                Some("tool_result") => request.messages.push(Message::Tool(ToolResult {
                    call_id: string(&block, "tool_use_id"),
                    output: block
                        .get("content")
                        .map(Value::to_string)
                        .unwrap_or_default(),
                    is_error: block
                        .get("is_error")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                })),
                _ => {}
            }
        }
        let text = text.join("\n");
        if assistant {
            if !text.is_empty() {
                parts.insert(0, AssistantPart::Text(text));
            }
            request.messages.push(Message::Assistant { parts });
        } else if !text.is_empty() {
            request.messages.push(Message::user(text));
        }
    }
    for tool in wire
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        request.tools.push(Tool {
            name: string(tool, "name"),
            description: string(tool, "description"),
            parameters: tool
                .get("input_schema")
                .cloned()
                .unwrap_or_else(|| json!({})),
        });
    }
    request.tool_choice = match wire.pointer("/tool_choice/type").and_then(Value::as_str) {
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => wire
            .pointer("/tool_choice/name")
            .and_then(Value::as_str)
            .map_or(ToolChoice::Auto, |name| ToolChoice::Tool(name.to_owned())),
        _ => ToolChoice::Auto,
    };
    request
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener as _;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_send_without_waiting_for_acknowledgements() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut listener = accepting(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (connection, _) = listener.accept().await;
        // Without it, a reply written in pieces on a kept-alive connection waits for the
        // client's delayed acknowledgement (40 ms on Linux) between them.
        assert!(connection.nodelay().expect("nodelay"), "TCP_NODELAY is off");
    }
}
