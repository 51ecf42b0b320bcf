//! The HTTP plumbing both wire formats share: the reqwest client, the one request per call, the
//! idle-read timeout, error responses, and feeding body bytes to a [`Wire`] parser.
//!
//! **Invariant:** exactly one HTTP request per stream, sent on first poll, never retried and
//! never re-sent on a redirect (redirects are disabled: following a 301/302 would turn the POST
//! into a GET).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::error::{Error, ErrorKind};
use crate::provider::EventStream;
use crate::request::Headers;
use crate::secret::ApiKey;
use crate::wire::{Output, Wire};

/// Largest error body read to classify a non-2xx response.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Builds the client shared by every call of one provider.
///
/// No total timeout: it would kill long streams (SPEC §13.4). Idle time is enforced per read in
/// [`stream`] instead.
pub(crate) fn client(connect_timeout: Duration) -> Result<reqwest::Client, Error> {
    // reqwest is built without a bundled crypto provider (see the workspace manifest); install
    // ring unless the embedding program installed one already, in which case `Err` just says so.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .build()
        .map_err(|error| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("cannot build the HTTP client: {}", describe(&error)),
            )
        })
}

/// Adds `headers` to `map`, marking credentials sensitive so that hyper never prints them.
pub(crate) fn add_headers(map: &mut HeaderMap, headers: &Headers) -> Result<(), Error> {
    for (name, value) in headers.iter() {
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("invalid header name {name:?}"),
            )
        })?;
        // The value is not echoed: it may be a credential.
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("invalid value for header {name:?}"),
            )
        })?;
        if Headers::is_sensitive(name) {
            value.set_sensitive(true);
        }
        map.insert(header, value);
    }
    Ok(())
}

/// A header value holding a secret, marked sensitive.
pub(crate) fn secret_header(value: String) -> Result<HeaderValue, Error> {
    let mut value = HeaderValue::from_str(&value).map_err(|_| {
        Error::new(
            ErrorKind::Authentication,
            "the API key contains characters not allowed in a header",
        )
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Timeouts of one streaming call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub idle: Duration,
}

enum Phase {
    // Boxed: the request is large and this state lives for the whole stream.
    Request(Box<(reqwest::Client, reqwest::Request)>),
    Body(BoxStream<'static, reqwest::Result<Bytes>>),
    Done,
}

struct State<W> {
    phase: Phase,
    wire: W,
    queue: VecDeque<Result<crate::Event, Error>>,
    scratch: Output,
    received_any: bool,
    timeouts: Timeouts,
    secret: Option<ApiKey>,
}

/// Runs one request and parses its body with `wire`. Nothing happens until the stream is
/// polled; dropping it drops the connection.
pub(crate) fn stream<W: Wire>(
    client: reqwest::Client,
    request: reqwest::Request,
    wire: W,
    timeouts: Timeouts,
    secret: Option<ApiKey>,
) -> EventStream {
    let state = State {
        phase: Phase::Request(Box::new((client, request))),
        wire,
        queue: VecDeque::new(),
        scratch: Vec::new(),
        received_any: false,
        timeouts,
        secret,
    };
    futures::stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        Some((item, state))
    })
    .boxed()
}

impl<W: Wire> State<W> {
    async fn next(&mut self) -> Option<Result<crate::Event, Error>> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(match item {
                    Err(error) => Err(self.scrub(error)),
                    ok => ok,
                });
            }
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                Phase::Request(call) => {
                    let (client, request) = *call;
                    self.send(client, request).await;
                }
                Phase::Body(mut body) => {
                    match tokio::time::timeout(self.timeouts.idle, body.next()).await {
                        Err(_elapsed) => {
                            let error = Error::transport(
                                self.received_any,
                                format!(
                                    "idle timeout: no bytes for {} ms",
                                    self.timeouts.idle.as_millis()
                                ),
                            );
                            self.wire.fail(error, &mut self.scratch);
                        }
                        Ok(None) => self.wire.finish(&mut self.scratch),
                        Ok(Some(Err(error))) => {
                            let error = Error::transport(
                                self.received_any,
                                format!("reading the stream: {}", describe(&error)),
                            );
                            self.wire.fail(error, &mut self.scratch);
                        }
                        Ok(Some(Ok(bytes))) => {
                            self.received_any |= !bytes.is_empty();
                            self.wire.feed(&bytes, &mut self.scratch);
                            // After `[DONE]`, `message_stop` or an error nothing more is read;
                            // dropping the body closes the connection.
                            if !self.wire.is_done() {
                                self.phase = Phase::Body(body);
                            }
                        }
                    }
                    self.queue.extend(self.scratch.drain(..));
                }
            }
        }
    }

    async fn send(&mut self, client: reqwest::Client, request: reqwest::Request) {
        tracing::debug!(url.path = request.url().path(), "provider request");
        // The wait for response headers is bounded too: connect time plus one idle period.
        let wait = self.timeouts.connect + self.timeouts.idle;
        let response = match tokio::time::timeout(wait, client.execute(request)).await {
            Err(_elapsed) => {
                return self.queue.push_back(Err(Error::transport(
                    false,
                    format!("no response within {} ms", wait.as_millis()),
                )));
            }
            Ok(Err(error)) => {
                return self.queue.push_back(Err(Error::transport(
                    false,
                    format!("sending the request: {}", describe(&error)),
                )));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = read_error_body(response, self.timeouts.idle).await;
            let error = Error::from_http(status.as_u16(), &headers, &body);
            tracing::debug!(status = status.as_u16(), kind = %error.kind(), "provider error response");
            return self.queue.push_back(Err(error));
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        if is_json {
            // A 200 JSON body instead of a stream: an error object from a gateway, or a server
            // that ignored `stream: true`.
            let body = read_error_body(response, self.timeouts.idle).await;
            let error = match serde_json::from_str::<serde_json::Value>(&body) {
                Ok(value) if value.get("error").is_some_and(|e| !e.is_null()) => {
                    Error::from_stream_body(&value)
                }
                _ => Error::invalid_output("expected an event stream, got a JSON body"),
            };
            return self.queue.push_back(Err(error));
        }
        self.phase = Phase::Body(response.bytes_stream().boxed());
    }

    fn scrub(&self, error: Error) -> Error {
        match &self.secret {
            Some(key) => error.redact(key.expose()),
            None => error,
        }
    }
}

/// Reads at most [`MAX_ERROR_BODY`] bytes, each read bounded by the idle timeout; a body that
/// cannot be read classifies from status and headers alone.
async fn read_error_body(response: reqwest::Response, idle: Duration) -> String {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout(idle, chunks.next()).await {
            Ok(Some(Ok(bytes))) => body.extend_from_slice(&bytes),
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    String::from_utf8_lossy(&body).into_owned()
}

/// A reqwest error with its causes, without the URL (which could carry credentials in its
/// userinfo or query).
fn describe(error: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut current: Option<&dyn std::error::Error> = Some(error);
    let mut first = true;
    while let Some(cause) = current {
        let part = if first {
            // `reqwest::Error`'s own Display includes the URL; describe it by its kind instead.
            first = false;
            reqwest_kind(error).to_owned()
        } else {
            cause.to_string()
        };
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
        current = cause.source();
    }
    text
}

fn reqwest_kind(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "body error"
    } else if error.is_request() {
        "request error"
    } else if error.is_builder() {
        "invalid request"
    } else {
        "HTTP error"
    }
}
