//! The HTTP plumbing both wire formats share: the [`Endpoint`] a client holds (its connections,
//! URL, key, configured headers, timeouts), the one request per call, the idle-read timeout,
//! error responses, and feeding body bytes to a [`Wire`] parser. The protocol modules add only
//! their body, their own headers and their parser.
//!
//! Connections: a plain-`http://` provider is called over HTTP/1.1 connections of our own, each
//! driven by the call using it ([`h1`]); TLS, HTTP/2 and proxies go through reqwest clients
//! ([`Clients`]).
//!
//! **Invariant:** exactly one HTTP request per stream, sent on first poll, never retried and
//! never re-sent on a redirect (redirects are disabled: following a 301/302 would turn the POST
//! into a GET). A request the HTTP library hands back unsent, none of it written, may go on
//! another connection: the server has seen nothing of it.

mod h1;

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::provider::EventStream;
use crate::request::{Headers, Request};
use crate::secret::ApiKey;
use crate::wire::{Output, Wire};

/// Largest error body read to classify a non-2xx response.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Where and how one configured provider is called: what both HTTP clients hold.
pub(crate) struct Endpoint {
    clients: Arc<Clients>,
    /// Connections of our own, used instead of `clients` for a plain-HTTP/1.1 provider.
    own: Option<Arc<h1::Pool>>,
    url: reqwest::Url,
    api_key: Option<ApiKey>,
    headers: Headers,
    affinity_header: String,
    timeouts: Timeouts,
}

impl Endpoint {
    /// `{base_url}/{path}` for `config`, with `default_base` when it names no base URL; `kind`
    /// names the protocol in the error for a bad URL. No connection is made yet.
    pub fn new(config: &Config, default_base: &str, path: &str, kind: &str) -> Result<Self, Error> {
        let base = config.base_url_or(default_base);
        let url = reqwest::Url::parse(&format!("{base}/{path}")).map_err(|_| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("invalid base_url for {kind}"),
            )
        })?;
        let own = h1::Pool::applies(&url, config.http2_prior_knowledge, config.connect_timeout)
            .map(Arc::new);
        Ok(Self {
            clients: Arc::new(Clients::new(config)?),
            own,
            url,
            api_key: config.api_key.clone(),
            headers: config.headers.clone(),
            affinity_header: config.affinity_header.clone(),
            timeouts: Timeouts {
                connect: config.connect_timeout,
                idle: config.idle_timeout,
            },
        })
    }

    /// The configured key, for the protocol to put in its own credential header.
    pub fn api_key(&self) -> Option<&ApiKey> {
        self.api_key.as_ref()
    }

    /// `Debug` of a client named `name`. Safe to print: [`ApiKey`] and [`Headers`] redact
    /// themselves, and the reqwest client (which could show more) is left out.
    pub fn fmt_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("endpoint", &self.url.as_str())
            .field("api_key", &self.api_key)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }

    /// The POST of `body` for `request`: the protocol's own `headers` (from [`stream_headers`],
    /// plus its credential and version), then the session-affinity header, the configured
    /// headers and the request's own, each later one winning.
    pub fn post(
        &self,
        mut headers: HeaderMap,
        request: &Request,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::Request, Error> {
        let mut extra = Headers::new();
        if let Some(session) = &request.session_id
            && !self.affinity_header.is_empty()
        {
            extra.insert(self.affinity_header.clone(), session.clone());
        }
        add_headers(&mut headers, &extra)?;
        add_headers(&mut headers, &self.headers)?;
        add_headers(&mut headers, &request.headers)?;
        let body = serde_json::to_vec(body).map_err(|error| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("cannot encode the body: {error}"),
            )
        })?;
        let mut http_request = reqwest::Request::new(reqwest::Method::POST, self.url.clone());
        *http_request.headers_mut() = headers;
        *http_request.body_mut() = Some(body.into());
        Ok(http_request)
    }

    /// Runs `request` and parses its body with `wire`; a request that could not be built is a
    /// stream of that one error. Nothing is sent until the stream is polled.
    pub fn stream<W: Wire>(
        &self,
        request: Result<reqwest::Request, Error>,
        wire: W,
    ) -> EventStream {
        match request {
            Ok(request) => stream(
                match &self.own {
                    Some(pool) => Route::Own(pool.clone()),
                    None => Route::Clients(self.clients.clone()),
                },
                request,
                wire,
                self.timeouts,
                self.api_key.clone(),
            ),
            Err(error) => Box::pin(futures::stream::once(async move { Err(error) })),
        }
    }
}

/// A field the protocol builds into its body, unless the request's `extra_body` replaces it
/// (the extra fields are written after the built ones).
pub(crate) fn field<M: serde::ser::SerializeMap, V: serde::Serialize + ?Sized>(
    map: &mut M,
    extra: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    value: &V,
) -> Result<(), M::Error> {
    if extra.contains_key(key) {
        return Ok(());
    }
    map.serialize_entry(key, value)
}

/// The headers every call starts with: a JSON body in, an event stream back.
pub(crate) fn stream_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
    headers
}

/// The HTTP clients of one provider, each holding up to `per_client` calls at once.
///
/// Over HTTP/2 a client multiplexes its calls on one connection, and hyper does not open a
/// second connection when the server's limit on concurrent streams is reached: the calls past it
/// would wait for a stream to end, which for model calls can be minutes. So a call takes the
/// first client with fewer than `per_client` calls open, and when every client is full one more
/// is made, with a connection of its own. Clients are never dropped: there are at most as many
/// as the runtime's limit on concurrent calls divided by `per_client`.
struct Clients {
    clients: Mutex<Vec<Counted>>,
    per_client: usize,
    connect_timeout: Duration,
    http2_prior_knowledge: bool,
}

#[derive(Clone)]
struct Counted {
    client: reqwest::Client,
    open: Arc<AtomicUsize>,
}

/// One call counted against its client until it is dropped.
struct Lease(Arc<AtomicUsize>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Clients {
    /// The first client is made at once, so that a configuration no client can be built from
    /// fails when the provider is built.
    fn new(config: &Config) -> Result<Self, Error> {
        let clients = Clients {
            clients: Mutex::new(Vec::new()),
            per_client: config.streams_per_connection.max(1),
            connect_timeout: config.connect_timeout,
            http2_prior_knowledge: config.http2_prior_knowledge,
        };
        let first = clients.make()?;
        clients
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(first);
        Ok(clients)
    }

    /// A client for one more call, and the lease that counts the call until it is dropped.
    fn checkout(&self) -> Result<(reqwest::Client, Lease), Error> {
        // Counts go up only under the lock, so two calls cannot both take a client's last
        // place; they go down without it, which can only leave more room.
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let free = clients
            .iter()
            .find(|c| c.open.load(Ordering::Relaxed) < self.per_client)
            .cloned();
        let chosen = match free {
            Some(counted) => counted,
            None => {
                let counted = self.make()?;
                clients.push(counted.clone());
                counted
            }
        };
        chosen.open.fetch_add(1, Ordering::Relaxed);
        Ok((chosen.client, Lease(chosen.open)))
    }

    fn make(&self) -> Result<Counted, Error> {
        Ok(Counted {
            client: client(self.connect_timeout, self.http2_prior_knowledge)?,
            open: Arc::new(AtomicUsize::new(0)),
        })
    }

    #[cfg(test)]
    fn count(&self) -> usize {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Builds one HTTP client of a provider.
///
/// No total timeout: it would kill long streams. Idle time is enforced per read in
/// [`stream`] instead.
fn client(
    connect_timeout: Duration,
    http2_prior_knowledge: bool,
) -> Result<reqwest::Client, Error> {
    let builder = agenthost_http::client_builder()
        .map_err(|reason| Error::new(ErrorKind::InvalidRequest, reason))?
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true);
    let builder = match http2_prior_knowledge {
        true => builder.http2_prior_knowledge(),
        false => builder,
    };
    builder.build().map_err(|error| {
        Error::new(
            ErrorKind::InvalidRequest,
            format!("cannot build the HTTP client: {}", describe(&error)),
        )
    })
}

/// Adds `headers` to `map`, marking credentials sensitive so that hyper never prints them.
fn add_headers(map: &mut HeaderMap, headers: &Headers) -> Result<(), Error> {
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
struct Timeouts {
    connect: Duration,
    idle: Duration,
}

/// Which connections carry a call.
enum Route {
    Clients(Arc<Clients>),
    Own(Arc<h1::Pool>),
}

/// A response body's chunks, or why one could not be read.
enum Chunks {
    Clients(BoxStream<'static, Result<Bytes, String>>),
    Own(Box<h1::Streamed>),
}

impl futures::Stream for Chunks {
    type Item = Result<Bytes, String>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        match self.get_mut() {
            Chunks::Clients(chunks) => chunks.poll_next_unpin(cx),
            Chunks::Own(chunks) => chunks.poll_next_unpin(cx),
        }
    }
}

impl Chunks {
    /// Done with a body whose parser has read all it needs: an own connection is read to the
    /// body's end so that it can be reused; reqwest's are dropped, as reqwest reads on.
    fn finish(self) {
        match self {
            Chunks::Clients(chunks) => drop(chunks),
            Chunks::Own(chunks) => (*chunks).finish(),
        }
    }
}

enum Phase {
    // Boxed: the request is large and this state lives for the whole stream.
    Request(Box<(Route, reqwest::Request)>),
    Body(Box<Body>),
    Done,
}

/// The response body being read, and its idle timer.
struct Body {
    chunks: Chunks,
    /// Armed once and moved only when it fires early: a chunk pushes `deadline` out, not the
    /// timer, so a reply streamed chunk by chunk does not re-arm a timer for every chunk.
    idle: Pin<Box<tokio::time::Sleep>>,
    /// When the body has been idle too long: one idle period after the last chunk.
    deadline: tokio::time::Instant,
}

impl Body {
    fn new(chunks: Chunks, idle: Duration) -> Self {
        let deadline = tokio::time::Instant::now() + idle;
        Body {
            chunks,
            idle: Box::pin(tokio::time::sleep_until(deadline)),
            deadline,
        }
    }

    /// The next chunk; `None` when the body was idle for a whole period.
    async fn next(&mut self, idle: Duration) -> Option<Option<Result<Bytes, String>>> {
        loop {
            tokio::select! {
                biased;
                chunk = self.chunks.next() => {
                    self.deadline = tokio::time::Instant::now() + idle;
                    return Some(chunk);
                }
                () = self.idle.as_mut() => {
                    if tokio::time::Instant::now() >= self.deadline {
                        return None;
                    }
                    let deadline = self.deadline;
                    self.idle.as_mut().reset(deadline);
                }
            }
        }
    }
}

struct State<W> {
    phase: Phase,
    wire: W,
    queue: VecDeque<Result<crate::Event, Error>>,
    scratch: Output,
    received_any: bool,
    timeouts: Timeouts,
    secret: Option<ApiKey>,
    /// Held from the request's sending to the stream's end.
    lease: Option<Lease>,
}

/// Runs one request and parses its body with `wire`. Nothing happens until the stream is
/// polled; dropping it drops the connection.
fn stream<W: Wire>(
    route: Route,
    request: reqwest::Request,
    wire: W,
    timeouts: Timeouts,
    secret: Option<ApiKey>,
) -> EventStream {
    let state = State {
        phase: Phase::Request(Box::new((route, request))),
        wire,
        queue: VecDeque::new(),
        scratch: Vec::new(),
        received_any: false,
        timeouts,
        secret,
        lease: None,
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
                Phase::Done => {
                    self.lease = None;
                    return None;
                }
                Phase::Request(call) => {
                    let (route, request) = *call;
                    self.send(route, request).await;
                }
                Phase::Body(mut body) => {
                    match body.next(self.timeouts.idle).await {
                        None => {
                            let error = Error::transport(
                                self.received_any,
                                format!(
                                    "idle timeout: no bytes for {} ms",
                                    self.timeouts.idle.as_millis()
                                ),
                            );
                            self.wire.fail(error, &mut self.scratch);
                        }
                        Some(None) => self.wire.finish(&mut self.scratch),
                        Some(Some(Err(error))) => {
                            let error = Error::transport(
                                self.received_any,
                                format!("reading the stream: {error}"),
                            );
                            self.wire.fail(error, &mut self.scratch);
                        }
                        Some(Some(Ok(bytes))) => {
                            self.received_any |= !bytes.is_empty();
                            self.wire.feed(&bytes, &mut self.scratch);
                            // After `[DONE]`, `message_stop` or an error nothing more is parsed.
                            // A body that failed (an event stream line past its bound, a broken
                            // event) is dropped, which closes its connection at once: reading its
                            // rest to reuse the connection could read an endless line for ever.
                            let failed = self.scratch.iter().any(Result::is_err);
                            match self.wire.is_done() {
                                true if failed => drop(body),
                                true => body.chunks.finish(),
                                false => self.phase = Phase::Body(body),
                            }
                        }
                    }
                    self.queue.extend(self.scratch.drain(..));
                }
            }
        }
    }

    async fn send(&mut self, route: Route, request: reqwest::Request) {
        tracing::debug!(url.path = request.url().path(), "provider request");
        // The wait for response headers is bounded too: connect time plus one idle period.
        let wait = self.timeouts.connect + self.timeouts.idle;
        let sent = match route {
            Route::Own(pool) => tokio::time::timeout(wait, pool.send(request))
                .await
                .map(|sent| {
                    sent.map(|(head, body)| {
                        (head.status, head.headers, Chunks::Own(Box::new(body)))
                    })
                }),
            Route::Clients(clients) => {
                let (client, lease) = match clients.checkout() {
                    Ok(checked_out) => checked_out,
                    Err(error) => return self.queue.push_back(Err(error)),
                };
                self.lease = Some(lease);
                tokio::time::timeout(wait, client.execute(request))
                    .await
                    .map(|sent| match sent {
                        Ok(mut response) => Ok((
                            response.status(),
                            std::mem::take(response.headers_mut()),
                            Chunks::Clients(
                                response
                                    .bytes_stream()
                                    .map(|chunk| chunk.map_err(|error| describe(&error)))
                                    .boxed(),
                            ),
                        )),
                        Err(error) => Err(describe(&error)),
                    })
            }
        };
        let (status, headers, chunks) = match sent {
            Err(_elapsed) => {
                return self.queue.push_back(Err(Error::transport(
                    false,
                    format!("no response within {} ms", wait.as_millis()),
                )));
            }
            Ok(Err(error)) => {
                return self.queue.push_back(Err(Error::transport(
                    false,
                    format!("sending the request: {error}"),
                )));
            }
            Ok(Ok(sent)) => sent,
        };
        if !status.is_success() {
            let body = read_error_body(chunks, self.timeouts.idle).await;
            let error = Error::from_http(status.as_u16(), &headers, &body);
            tracing::debug!(status = status.as_u16(), kind = %error.kind(), "provider error response");
            return self.queue.push_back(Err(error));
        }
        let is_json = headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        if is_json {
            // A 200 JSON body instead of a stream: an error object from a gateway, or a server
            // that ignored `stream: true`.
            let body = read_error_body(chunks, self.timeouts.idle).await;
            let error = match serde_json::from_str::<serde_json::Value>(&body) {
                Ok(value) if value.get("error").is_some_and(|e| !e.is_null()) => {
                    Error::from_stream_body(&value)
                }
                _ => Error::invalid_output("expected an event stream, got a JSON body"),
            };
            return self.queue.push_back(Err(error));
        }
        self.phase = Phase::Body(Box::new(Body::new(chunks, self.timeouts.idle)));
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
async fn read_error_body(mut chunks: Chunks, idle: Duration) -> String {
    let mut body = Vec::new();
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

#[cfg(test)]
mod tests {
    /// Building a provider's client sets no process-wide state: an
    /// embedder's choice of rustls crypto provider, or its absence, stands.
    #[test]
    fn clients_install_no_process_wide_crypto_provider() {
        let client =
            super::client(std::time::Duration::from_secs(1), false).expect("a provider client");
        drop(client);
        assert!(
            rustls::crypto::CryptoProvider::get_default().is_none(),
            "a library installed a process-wide crypto provider"
        );
    }

    /// A call takes the first client with room; one more client is made only when every client
    /// is full, and a call that ends makes room in its own client.
    #[test]
    fn calls_fill_a_client_before_another_is_made() {
        let mut config = crate::Config::new(crate::Kind::Openai);
        config.streams_per_connection = 2;
        let clients = super::Clients::new(&config).expect("clients");
        let a = clients.checkout().expect("a");
        let b = clients.checkout().expect("b");
        assert_eq!(clients.count(), 1, "two calls fit one client");
        let c = clients.checkout().expect("c");
        assert_eq!(clients.count(), 2, "the third call needs another client");
        drop(a);
        let d = clients.checkout().expect("d");
        assert_eq!(
            clients.count(),
            2,
            "an ended call made room in the first client"
        );
        let e = clients.checkout().expect("e");
        assert_eq!(clients.count(), 2, "the second client had room");
        let f = clients.checkout().expect("f");
        assert_eq!(clients.count(), 3, "both clients were full");
        drop((b, c, d, e, f));
    }
}
