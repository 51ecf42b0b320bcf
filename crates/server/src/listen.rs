//! The accept loop: HTTP/1.1 connections served by hyper with what `axum::serve` does not offer,
//! so slow and greedy clients cannot exhaust the server:
//! - a header read timeout: a connection whose request head does not complete in time is closed
//!   (a slowloris client cannot hold a connection forever);
//! - a cap on open connections: beyond it a new connection gets a `503` to its first request and
//!   is closed;
//! - graceful shutdown: once `stop` is cancelled no connection is accepted, idle keep-alive
//!   connections close, and in-flight requests finish (bounded by the caller).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What the loop enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// The answer to a connection over the cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 85\r\n\r\n\
{\"error\":{\"type\":\"unavailable\",\"message\":\"too many open connections; retry shortly\"}}";

/// Connections over the cap being answered at once (each for a moment: until its request begins
/// and its client closes, [`refuse`]); beyond them one is closed unanswered, so that a flood of
/// connections holds at most these sockets besides the cap. A load generator that opens
/// thousands of connections together gets its `503`s.
const REFUSING: usize = 1024;

/// How long a refused connection waits for its request, and then for the client to close.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `stop` is cancelled, then waits for open connections to
/// finish their requests.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // What a connection buffers for a client that does not read: a small multiple of a
        // stream's read-ahead, not hyper's default.
        .max_buf_size(64 * 1024)
        .keep_alive(true);
    loop {
        let (stream, _) = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if let Ok(refusal) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(refusal);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a connection over the cap with [`BUSY`] and closes it. The answer waits for the
/// request to begin (at most [`REFUSAL_WAIT`]): a client that finds a response on a connection it
/// has sent nothing on reports a broken connection, not the `503`. Then the connection is closed
/// for writing, and what the client still sends is read and dropped until it closes too (again
/// at most [`REFUSAL_WAIT`]): closing a socket with unread bytes resets the connection, and the
/// reset discards the answer before the client reads it.
async fn refuse(mut stream: TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSAL_WAIT, stream.read(&mut buf)).await;
    if !matches!(
        tokio::time::timeout(REFUSAL_WAIT, stream.write_all(BUSY)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(REFUSAL_WAIT, async {
        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_busy_answer_is_well_formed() {
        let text = std::str::from_utf8(super::BUSY).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|l| l.parse().ok())
            .expect("a length");
        assert_eq!(body.len(), length);
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(json["error"]["type"], "unavailable");
    }
}
