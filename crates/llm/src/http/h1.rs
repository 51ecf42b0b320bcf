//! HTTP/1.1 connections to a plain-`http://` provider, each driven by the call that uses it.
//!
//! reqwest runs every connection on a task of its own. Over HTTP/1.1 a response body then passes
//! from that task to the reader through a channel one chunk deep, so a reply streamed in n chunks
//! costs about 2n task wake-ups, most of them across threads. Here a call polls its connection
//! itself, in the task that reads the body: a reply already in the socket is read without
//! waking anyone. Between calls a connection waits unpolled in the [`Pool`]; one the server
//! closed meanwhile is found out when it is taken, or by the pool's look-over every
//! [`REAP_EVERY`], and dropped.
//!
//! Used only where reqwest would add nothing (see [`Pool::applies`]): `http://` URLs, without a
//! proxy in the environment or HTTP/2 prior knowledge. TLS, proxies and HTTP/2 stay with reqwest.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1;
use hyper::header::{HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

type Connection = http1::Connection<TokioIo<TcpStream>, reqwest::Body>;
type Sender = http1::SendRequest<reqwest::Body>;

/// How long a connection may wait unused before it is closed rather than reused (reqwest's
/// default too): servers close idle connections after a while, and a connection closed by the
/// server just as a request goes out costs that request.
const IDLE_LIFETIME: Duration = Duration::from_secs(90);

/// How often idle connections are looked over: those past [`IDLE_LIFETIME`] and those the
/// server closed are dropped, so that a provider no longer called holds no sockets.
const REAP_EVERY: Duration = Duration::from_secs(30);

/// How long the rest of an unwanted body is read for before its connection is closed instead.
const FINISH_WITHIN: Duration = Duration::from_secs(5);

/// Chunks of an unwanted body read at once before the rest is left to a task.
const FINISH_POLLS: usize = 4;

/// The idle HTTP/1.1 connections of one provider endpoint, newest last.
pub(super) struct Pool {
    host: String,
    port: u16,
    /// The `Host` header of every request.
    authority: HeaderValue,
    /// The request target, in origin form (`/v1/chat/completions`).
    target: hyper::Uri,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
    /// Whether the task that looks over idle connections runs (started with the first one).
    reaping: AtomicBool,
}

struct Idle {
    sender: Sender,
    connection: Connection,
    since: Instant,
}

/// A connection in use by one call. `connection` is `None` once it has ended.
struct Live {
    sender: Sender,
    connection: Option<Connection>,
    reused: bool,
}

impl Live {
    /// Polls the connection, which reads and writes on behalf of the request and its body.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(connection) = &mut self.connection
            && Pin::new(connection).poll(cx).is_ready()
        {
            // Ended, well or not: the request or the body reports what happened.
            self.connection = None;
        }
    }

    /// Runs `future` while driving the connection.
    async fn run<F: Future + Unpin>(&mut self, mut future: F) -> F::Output {
        std::future::poll_fn(|cx| {
            self.drive(cx);
            Pin::new(&mut future).poll(cx)
        })
        .await
    }
}

impl Pool {
    /// The pool for `url`, or `None` when reqwest must carry its calls: a scheme other than
    /// `http`, HTTP/2 prior knowledge, credentials in the URL, or a proxy named in the
    /// environment.
    pub fn applies(
        url: &reqwest::Url,
        http2_prior_knowledge: bool,
        connect_timeout: Duration,
    ) -> Option<Pool> {
        if url.scheme() != "http"
            || http2_prior_knowledge
            // reqwest turns credentials in the URL into basic authentication.
            || !url.username().is_empty()
            || url.password().is_some()
            || proxied(url)
        {
            return None;
        }
        let host = url.host_str()?.to_owned();
        let port = url.port_or_known_default()?;
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        Some(Pool {
            // `Url` keeps an IPv6 host in brackets; connecting wants the bare address.
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            authority: HeaderValue::from_str(&authority).ok()?,
            target: target.parse().ok()?,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            reaping: AtomicBool::new(false),
        })
    }

    /// Sends `request` and waits for the response's head. The body is read from the returned
    /// [`Streamed`], which gives its connection back to the pool once the body has ended.
    ///
    /// A request hyper hands back unsent, because its reused connection was closed by the
    /// server in the meantime, goes once more on a new connection: nothing of it reached the
    /// server, so this is not a retry of the call.
    pub async fn send(
        self: &Arc<Self>,
        request: reqwest::Request,
    ) -> Result<(hyper::http::response::Parts, Streamed), String> {
        let mut request = self.http_request(request);
        let mut fresh_only = false;
        loop {
            let mut live = match fresh_only {
                false => match self.take() {
                    Some(live) => live,
                    None => self.connect().await?,
                },
                true => self.connect().await?,
            };
            let ready = std::future::poll_fn(|cx| {
                live.drive(cx);
                live.sender.poll_ready(cx)
            })
            .await;
            if let Err(error) = ready {
                match live.reused && !fresh_only {
                    true => {
                        fresh_only = true;
                        continue;
                    }
                    false => return Err(describe(&error)),
                }
            }
            let sent = Box::pin(live.sender.try_send_request(request));
            match live.run(sent).await {
                Ok(response) => {
                    let (head, body) = response.into_parts();
                    return Ok((
                        head,
                        Streamed {
                            live: Some(live),
                            body,
                            pool: self.clone(),
                        },
                    ));
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if live.reused && !fresh_only => {
                        request = unsent;
                        fresh_only = true;
                    }
                    _ => return Err(describe(error.error())),
                },
            }
        }
    }

    fn http_request(&self, mut request: reqwest::Request) -> hyper::Request<reqwest::Body> {
        let body = request
            .body_mut()
            .take()
            .unwrap_or_else(|| reqwest::Body::from(Bytes::new()));
        let mut out = hyper::Request::new(body);
        *out.method_mut() = request.method().clone();
        *out.uri_mut() = self.target.clone();
        *out.headers_mut() = std::mem::take(request.headers_mut());
        // A `Host` the configuration sets stands, as with reqwest.
        out.headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.authority.clone());
        out
    }

    /// The newest idle connection still open, if any; expired and closed ones are dropped.
    fn take(&self) -> Option<Live> {
        loop {
            let mut idle = {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                let now = Instant::now();
                let expired =
                    idle.partition_point(|c| now.duration_since(c.since) >= IDLE_LIFETIME);
                drop(idle.drain(..expired));
                idle.pop()?
            };
            if idle.sender.is_closed() {
                continue;
            }
            // One poll lets a connection the server closed while it was idle see its end of
            // file and finish; nothing is registered to wake, since nothing waits on it yet.
            let mut cx = Context::from_waker(Waker::noop());
            if Pin::new(&mut idle.connection).poll(&mut cx).is_ready() {
                continue;
            }
            return Some(Live {
                sender: idle.sender,
                connection: Some(idle.connection),
                reused: true,
            });
        }
    }

    async fn connect(&self) -> Result<Live, String> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_elapsed) => {
                return Err(format!(
                    "connection failed: no connection within {} ms",
                    self.connect_timeout.as_millis()
                ));
            }
            Ok(Err(error)) => return Err(format!("connection failed: {error}")),
            Ok(Ok(stream)) => stream,
        };
        // Small writes (a request, a window of a stream) go out at once.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| describe(&error))?;
        Ok(Live {
            sender,
            connection: Some(connection),
            reused: false,
        })
    }

    fn put(self: &Arc<Self>, live: Live) {
        let Some(connection) = live.connection else {
            return;
        };
        if live.sender.is_closed() {
            return;
        }
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Idle {
                sender: live.sender,
                connection,
                since: Instant::now(),
            });
        if !self.reaping.swap(true, Ordering::Relaxed)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(reap(Arc::downgrade(self)));
        }
    }

    /// Drops the idle connections past [`IDLE_LIFETIME`] and those the server closed; returns
    /// how many are left.
    fn reap(&self) -> usize {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let mut cx = Context::from_waker(Waker::noop());
        // Dropped after the lock: closing a socket is a system call.
        let gone: Vec<Idle> = idle
            .extract_if(.., |c| {
                now.duration_since(c.since) >= IDLE_LIFETIME
                    || c.sender.is_closed()
                    || Pin::new(&mut c.connection).poll(&mut cx).is_ready()
            })
            .collect();
        let left = idle.len();
        drop(idle);
        drop(gone);
        left
    }
}

/// Looks over a pool's idle connections every [`REAP_EVERY`] until the pool is gone.
async fn reap(pool: Weak<Pool>) {
    let mut every = tokio::time::interval_at(Instant::now() + REAP_EVERY, REAP_EVERY);
    loop {
        every.tick().await;
        match pool.upgrade() {
            Some(pool) => {
                pool.reap();
            }
            None => return,
        }
    }
}

/// A response body read on the caller's task, which drives its connection as it reads. The
/// connection goes back to the pool when the body ends; dropped before then, it closes.
pub(super) struct Streamed {
    live: Option<Live>,
    body: Incoming,
    pool: Arc<Pool>,
}

impl Stream for Streamed {
    type Item = Result<Bytes, String>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // Polling the body asks the connection for the next chunk; the second pass lets the
        // connection hand over one it already holds without a wake-up in between.
        let mut passes = 0;
        loop {
            if let Some(live) = &mut this.live {
                live.drive(cx);
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending if passes == 0 => passes += 1,
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        return Poll::Ready(Some(Ok(data)));
                    }
                    // Trailers carry nothing a stream parser reads.
                }
                Poll::Ready(Some(Err(error))) => {
                    this.live = None;
                    return Poll::Ready(Some(Err(describe(&error))));
                }
                Poll::Ready(None) => {
                    if let Some(live) = this.live.take() {
                        this.pool.put(live);
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

impl Streamed {
    /// Reads the rest of a body whose content is no longer wanted, so that its connection can
    /// be reused: at once when the end is already in hand (the usual case, as a server ends
    /// the body right after its last event), else on a task of its own for up to
    /// [`FINISH_WITHIN`]. A body that does not end by then closes its connection.
    pub fn finish(mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..FINISH_POLLS {
            match Pin::new(&mut self).poll_next(&mut cx) {
                Poll::Ready(None) | Poll::Ready(Some(Err(_))) => return,
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Pending => break,
            }
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let rest = async { while let Some(Ok(_)) = self.next().await {} };
                let _ = tokio::time::timeout(FINISH_WITHIN, rest).await;
            });
        }
    }
}

/// Whether reqwest would send a call to `url` through a proxy named in the environment
/// (`HTTP_PROXY`, `ALL_PROXY`, less `NO_PROXY`; the rules reqwest itself follows).
fn proxied(url: &reqwest::Url) -> bool {
    let matcher = hyper_util::client::proxy::matcher::Matcher::from_env();
    url.as_str()
        .parse::<hyper::Uri>()
        .map_or(true, |uri| matcher.intercept(&uri).is_some())
}

/// A hyper error with its causes.
fn describe(error: &hyper::Error) -> String {
    agenthost_http::describe(error)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::Pool;

    fn pool(url: &str, http2: bool) -> Option<Pool> {
        let url = reqwest::Url::parse(url).expect("a URL");
        Pool::applies(&url, http2, Duration::from_secs(1))
    }

    /// Only plain HTTP/1.1 without credentials in the URL takes connections of our own; the
    /// request goes to the origin-form target with the URL's authority as `Host`.
    #[test]
    fn own_connections_serve_plain_http1_only() {
        let own = pool(
            "http://127.0.0.1:8080/v1/chat/completions?api-version=1",
            false,
        )
        .expect("plain HTTP/1.1");
        assert_eq!(own.target, "/v1/chat/completions?api-version=1");
        assert_eq!(own.authority, "127.0.0.1:8080");
        assert_eq!((own.host.as_str(), own.port), ("127.0.0.1", 8080));

        let own = pool("http://[::1]/v1/messages", false).expect("IPv6, default port");
        assert_eq!(own.authority, "[::1]");
        assert_eq!((own.host.as_str(), own.port), ("::1", 80));

        assert!(
            pool("https://api.example.com/v1/messages", false).is_none(),
            "TLS"
        );
        assert!(pool("http://127.0.0.1:8080/v1", true).is_none(), "HTTP/2");
        assert!(
            pool("http://user:secret@127.0.0.1:8080/v1", false).is_none(),
            "credentials"
        );
    }

    /// A connection back in the pool is kept while its server keeps it open, and dropped once
    /// the server closes it, without waiting for the next call.
    #[tokio::test]
    async fn idle_connections_the_server_closed_are_dropped() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (close, closed) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let reply = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi";
            stream.write_all(reply.as_bytes()).await.expect("answer");
            let _ = closed.await;
        });
        let url = reqwest::Url::parse(&format!("http://{addr}/v1")).expect("URL");
        let pool = Arc::new(Pool::applies(&url, false, Duration::from_secs(5)).expect("pool"));
        let mut request = reqwest::Request::new(reqwest::Method::POST, url);
        *request.body_mut() = Some(reqwest::Body::from("{}"));
        let (head, mut body) = pool.send(request).await.expect("answered");
        assert_eq!(head.status, 200);
        let mut got = Vec::new();
        while let Some(chunk) = body.next().await {
            got.extend_from_slice(&chunk.expect("chunk"));
        }
        assert_eq!(got, b"hi");
        assert_eq!(pool.reap(), 1, "the server keeps the connection open");

        drop(close);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while pool.reap() != 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a connection the server closed stayed in the pool"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
