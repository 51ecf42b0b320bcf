//! [`Events`]: a session's event stream that survives dropped connections.
//!
//! The server gives every durable event an SSE `id` equal to its `seq`, and sequence numbers
//! of a session have no gaps. So the stream keeps the seq of the last durable event it yielded
//! and, when the connection drops (or the server restarts, or a cluster node hands the session
//! over), reconnects with `Last-Event-ID` set to it: the server replays exactly what followed.
//! A durable event whose seq is not above the last one is a duplicate and is dropped; one that
//! skips a seq means something was lost in between, so the stream reconnects from the last one
//! instead of yielding it. Deltas are ephemeral: those sent while the stream was disconnected are
//! not replayed (the durable events that follow carry the same content); every (re)connection
//! ends its replay with the session's current status.
//!
//! Frames are decoded by [`agenthost_http::sse::Decoder`], which completes a line before
//! decoding it, so a UTF-8 character split across network chunks arrives whole.

use std::collections::VecDeque;
use std::time::Duration;

use agenthost_http::sse;
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

use crate::client::{Client, Error, api_error};
use crate::wire;

/// One frame of an event stream, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A durable event, in seq order, each exactly once.
    Event(wire::Event),
    /// The replay is complete and live events follow; sent after every (re)connection, and
    /// followed by a `Status` with the session's state at that moment.
    Synced(wire::Synced),
    /// A piece of the answer being generated (ephemeral).
    Delta(wire::Delta),
    /// The session started or stopped running (ephemeral).
    Status(wire::Status),
    /// The server could not read the store; it ends that connection, and the stream
    /// reconnects.
    Error(wire::ErrorBody),
}

/// How an event stream reconnects: exponential backoff from `initial` up to `max`, at most
/// `attempts` times in a row without a frame in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Reconnections in a row, without any frame received between them, before the stream
    /// gives up with the last error. Zero never reconnects.
    pub attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Reconnect {
    /// Eight attempts, 100 ms doubling up to 5 s: about 16 s in all, longer than a cluster
    /// takeover with the default lease.
    fn default() -> Self {
        Reconnect {
            attempts: 8,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl Reconnect {
    /// The delay before reconnection number `n` (1-based).
    fn delay(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(20);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }
}

/// A session's event stream. Call [`Events::next`] until it returns `None`; the stream ends
/// only when it gives up reconnecting (after an error it yields) or on an error the server
/// answered on connecting (an unknown session, a missing token).
#[derive(Debug)]
pub struct Events {
    client: Client,
    url: Url,
    reconnect: Reconnect,
    /// Seq of the last durable event yielded, or the one the caller asked to start after.
    last: Option<u64>,
    /// Whether `last` came from an event of this stream (only then does a jump show a gap).
    seen: bool,
    response: Option<reqwest::Response>,
    decoder: sse::Decoder,
    frames: VecDeque<sse::Frame>,
    /// Reconnections since the last frame.
    failures: u32,
    ended: bool,
}

/// What to do with one decoded frame.
enum Step {
    Yield(Frame),
    Skip,
    /// A durable event (of this seq) skipped some: reconnect after the last one.
    Gap(u64),
}

impl Events {
    pub(crate) fn new(client: Client, url: Url, after: Option<u64>, reconnect: Reconnect) -> Self {
        Events {
            client,
            url,
            reconnect,
            last: after,
            seen: false,
            response: None,
            decoder: sse::Decoder::new(),
            frames: VecDeque::new(),
            failures: 0,
            ended: false,
        }
    }

    /// Seq of the last durable event yielded (or the one the stream started after).
    pub fn last_seq(&self) -> Option<u64> {
        self.last
    }

    /// Connects now, unless connected, without retrying: when it returns `Ok`, the server has
    /// subscribed this stream, so every live delta from then on will arrive. (Without it, the
    /// first [`Events::next`] connects.)
    pub async fn open(&mut self) -> Result<(), Error> {
        if self.response.is_some() || self.ended {
            return Ok(());
        }
        self.connect()
            .await
            .map_err(|(Connect::Retry(e) | Connect::Fatal(e))| e)
    }

    /// The next frame; `None` once the stream has ended.
    pub async fn next(&mut self) -> Option<Result<Frame, Error>> {
        loop {
            if self.ended {
                return None;
            }
            let mut gap = None;
            while let Some(raw) = self.frames.pop_front() {
                match self.step(&raw) {
                    Ok(Step::Yield(frame)) => {
                        self.failures = 0;
                        return Some(Ok(frame));
                    }
                    Ok(Step::Skip) => {}
                    Ok(Step::Gap(seq)) => {
                        gap = Some(seq);
                        break;
                    }
                    Err(error) => {
                        self.ended = true;
                        return Some(Err(error));
                    }
                }
            }
            let failure = match (gap, self.response.as_mut()) {
                // Reconnected like any other break, with backoff: a server that keeps skipping
                // is not hammered.
                (Some(seq), _) => Error::Decode(format!(
                    "event seq {seq} skipped some after {}",
                    self.last.unwrap_or_default()
                )),
                (None, None) => match self.connect().await {
                    Ok(()) => continue,
                    Err(Connect::Fatal(error)) => {
                        self.ended = true;
                        return Some(Err(error));
                    }
                    Err(Connect::Retry(error)) => error,
                },
                (None, Some(response)) => match response.chunk().await {
                    Ok(Some(chunk)) => {
                        let mut out = Vec::new();
                        self.decoder.feed(&chunk, &mut out);
                        if self.decoder.overflowed() {
                            self.ended = true;
                            return Some(Err(Error::Decode(format!(
                                "an event stream frame over {} bytes",
                                sse::MAX_FRAME
                            ))));
                        }
                        self.frames.extend(out);
                        continue;
                    }
                    // The server ended the response: a frame it did not finish is dropped
                    // with the decoder, and will be replayed.
                    Ok(None) => Error::Http("the server ended the event stream".into()),
                    Err(error) => Error::http(error),
                },
            };
            self.disconnect();
            self.failures += 1;
            if self.failures > self.reconnect.attempts {
                self.ended = true;
                return Some(Err(failure));
            }
            tokio::time::sleep(self.reconnect.delay(self.failures)).await;
        }
    }

    fn disconnect(&mut self) {
        self.response = None;
        self.decoder = sse::Decoder::new();
        self.frames.clear();
    }

    async fn connect(&mut self) -> Result<(), Connect> {
        let mut request = self
            .client
            .request(Method::GET, self.url.clone())
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(last) = self.last {
            request = request.header("last-event-id", last.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| Connect::Retry(Error::http(e)))?;
        let status = response.status();
        if status.is_success() {
            self.response = Some(response);
            return Ok(());
        }
        let bytes = response.bytes().await.unwrap_or_default();
        let error = api_error(status.as_u16(), &bytes);
        // Busy, overloaded or between owners: worth another try. Anything else the request
        // itself is wrong, and stays wrong.
        Err(match status.as_u16() {
            408 | 429 | 500..=599 => Connect::Retry(error),
            _ => Connect::Fatal(error),
        })
    }

    fn step(&mut self, raw: &sse::Frame) -> Result<Step, Error> {
        Ok(match raw.event.as_str() {
            "synced" => Step::Yield(Frame::Synced(parse(&raw.data)?)),
            "delta" => Step::Yield(Frame::Delta(parse(&raw.data)?)),
            "status" => Step::Yield(Frame::Status(parse(&raw.data)?)),
            "error" => Step::Yield(Frame::Error(parse(&raw.data)?)),
            _ => {
                let event: wire::Event = parse(&raw.data)?;
                match self.last {
                    Some(last) if event.seq <= last => Step::Skip,
                    Some(last) if self.seen && event.seq > last + 1 => Step::Gap(event.seq),
                    _ => {
                        self.last = Some(event.seq);
                        self.seen = true;
                        Step::Yield(Frame::Event(event))
                    }
                }
            }
        })
    }
}

enum Connect {
    Retry(Error),
    Fatal(Error),
}

fn parse<T: DeserializeOwned>(data: &str) -> Result<T, Error> {
    serde_json::from_str(data).map_err(|e| Error::Decode(format!("{e}: {data}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let policy = Reconnect::default();
        let delays: Vec<u64> = (1..=8)
            .map(|n| policy.delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(policy.delay(u32::MAX), policy.max);
    }

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A durable event frame whose text is multi-byte UTF-8.
    fn event(seq: u64) -> String {
        format!(
            "event: prompt_admitted\nid: {seq}\ndata: {{\"seq\":{seq},\"time\":0,\"type\":\"prompt_admitted\",\
             \"id\":\"msg_{seq}\",\"delivery\":\"steer\",\"text\":\"héllo 日本 🎉 {seq}\",\"files\":[]}}\n\n"
        )
    }

    /// Reads one request head and returns its `last-event-id`, if any.
    async fn accept(listener: &TcpListener) -> (TcpStream, Option<String>) {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            socket.read_exact(&mut byte).await.expect("request head");
            head.push(byte[0]);
        }
        let head = String::from_utf8(head)
            .expect("ASCII head")
            .to_ascii_lowercase();
        let last = head
            .lines()
            .find_map(|l| l.strip_prefix("last-event-id: ").map(str::to_owned));
        (socket, last)
    }

    /// Writes `parts` one at a time, so the client reads them as separate chunks.
    async fn stream(socket: &mut TcpStream, parts: &[&[u8]]) {
        socket
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            )
            .await
            .expect("head");
        for part in parts {
            socket.write_all(part).await.expect("part");
            socket.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Cut connections, a replayed duplicate, a skipped seq, a 503 and a split UTF-8 character:
    /// the stream yields every durable event once, in order, and ends on a 404.
    #[tokio::test]
    async fn reconnects_without_gaps_or_duplicates() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            // 1: events 0 and 1, the second cut inside a character, then half of event 2.
            let (mut socket, last) = accept(&listener).await;
            seen.push(last);
            let one = event(1);
            let cut = one.find('日').expect("a multi-byte character") + 1;
            let two = event(2);
            stream(
                &mut socket,
                &[
                    event(0).as_bytes(),
                    &one.as_bytes()[..cut],
                    &one.as_bytes()[cut..],
                    &two.as_bytes()[..two.len() / 2],
                ],
            )
            .await;
            drop(socket);
            // 2: a replayed duplicate, event 2, then event 4: 3 is missing.
            let (mut socket, last) = accept(&listener).await;
            seen.push(last);
            stream(
                &mut socket,
                &[event(1).as_bytes(), two.as_bytes(), event(4).as_bytes()],
            )
            .await;
            drop(socket);
            // 3: busy.
            let (mut socket, last) = accept(&listener).await;
            seen.push(last);
            let body = r#"{"error":{"type":"unavailable","message":"taking over"}}"#;
            let reply = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(reply.as_bytes()).await.expect("reply");
            drop(socket);
            // 4: the rest, and the end of the replay.
            let (mut socket, last) = accept(&listener).await;
            seen.push(last);
            let synced = "event: synced\ndata: {\"last_seq\":4}\n\n";
            stream(
                &mut socket,
                &[event(3).as_bytes(), event(4).as_bytes(), synced.as_bytes()],
            )
            .await;
            drop(socket);
            // 5: the session is gone.
            let (mut socket, last) = accept(&listener).await;
            seen.push(last);
            let body = r#"{"error":{"type":"session_not_found","message":"no such session"}}"#;
            let reply = format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(reply.as_bytes()).await.expect("reply");
            seen
        });

        let policy = Reconnect {
            attempts: 3,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(4),
        };
        let client = Client::new(&base).expect("client");
        let mut events = client.events_with("ses_1", None, policy);
        let mut got = Vec::new();
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(30), events.next())
                .await
                .expect("a frame in time")
            {
                Some(Ok(Frame::Event(e))) => {
                    let wire::EventBody::PromptAdmitted { text, .. } = &e.body else {
                        panic!("unexpected event {e:?}");
                    };
                    assert_eq!(text, &format!("héllo 日本 🎉 {}", e.seq));
                    got.push(e.seq);
                }
                Some(Ok(Frame::Synced(s))) => assert_eq!(s.last_seq, Some(4)),
                Some(Ok(other)) => panic!("unexpected frame {other:?}"),
                Some(Err(error)) => break error,
                None => panic!("ended without the error"),
            }
        };
        assert_eq!(got, [0, 1, 2, 3, 4]);
        assert_eq!(end.kind(), Some(wire::ErrorType::SessionNotFound), "{end}");
        assert!(events.next().await.is_none());
        let seen = server.await.expect("server");
        let want = [None, Some("1"), Some("2"), Some("2"), Some("4")];
        assert_eq!(seen, want.map(|s| s.map(str::to_owned)));
    }
}
