//! `GET /api/session/{id}/events`: durable events replayed from the store, one `synced` event,
//! then live events, as server-sent events.
//!
//! Frames:
//! - a durable event: `event: <type>`, `id: <seq>`, `data:` its [`wire::Event`] JSON;
//! - `event: synced`, `data: {"last_seq": …}` once, when the replay is complete, followed by
//!   a `status` frame with the session's state at that moment;
//! - `event: delta`, `data:` a [`wire::Delta`] (ephemeral; no `id`);
//! - `event: status`, `data: {"type": "running"|"idle"|"waiting"}` (ephemeral; no `id`);
//! - `event: error`, `data:` an error body, if reading the store failed (the stream then ends).
//!
//! Deltas are paced ([`Pace`]): at most one write of deltas alone per `delta_interval`, so a
//! reply streamed token by token does not cost a write (and a wakeup of the client) per token.
//! The first delta of a burst leaves alone; those held after it that continue one part leave as
//! one `delta` frame holding their text in order. The stream is not woken for each delta it
//! holds. Woken by a durable event, a stream lets the runtime run a few rounds before it writes
//! (`Feed::gather`), so the status that follows an admission or a turn's last commit leaves in
//! the same write.
//!
//! **Invariant:** no durable event is skipped or sent twice. The stream subscribes to the bus
//! *before* it reads the replay, so every commit is either in the replay, on the bus, or both;
//! bus events with a seq already sent are dropped. The replay reads the store up to the
//! session's last event as of the subscription, and the bus carries the rest. If the bus shows
//! a gap, the missing events up to it are read from the store by seq; a subscriber that fell
//! behind ends its stream instead (see below). The `id` of every durable frame is its seq, so a
//! reconnecting client's `Last-Event-ID` resumes exactly after the last event it received.
//!
//! The stream is a state machine polled by the response body, not a spawned task: when the
//! client goes away the body is dropped and with it the bus subscription.
//!
//! **Bounded in bytes.** What one stream holds for a client that does not read is bounded in
//! bytes, not frames: the bus queues at most `SESSION_BYTES` for it (beyond that it has fallen
//! behind: it gets a final `error` frame, type `unavailable`, and ends, and the client resumes
//! from the store with `Last-Event-ID`); it renders at most [`AHEAD`] beyond what the
//! connection took; the connection takes a frame in slices of at most [`SLICE`] bytes into a
//! bounded write buffer; a durable event's frame is rendered once for every stream that
//! sends it at the same time, or moments apart ([`Renders`]), so a large event watched by many
//! streams is one copy, not one per stream; and the store reads of replays and catch-ups run a
//! few at a time (`crate::read`), rendering on the thread that read.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use agenthost_actors::Live;
use agenthost_model::{Seq, SessionId, Stored};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::Stream;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::error::ApiError;
use crate::extract::{Query, SessionPath};
use crate::wire::{self, ErrorEnvelope};
use crate::{Shared, read};

/// Durable events read from the store at once, during replay and catch-up.
const PAGE: usize = 64;

/// Frames a stream renders ahead of what its client has taken, in bytes, and what it reads from
/// the store at once: a client that does not read holds about this (and the connection's write
/// buffer), however long the history.
const AHEAD: usize = 64 * 1024;

/// The largest piece of a frame the connection takes at once: a large frame goes out in slices
/// of one shared buffer, so the write buffer of a client that does not read stops filling at its
/// bound instead of holding the whole frame.
const SLICE: usize = 16 * 1024;

/// Frames this large or larger are rendered once for all the streams sending them at the same
/// time; smaller ones cost less to render than to look up.
const SHARED_FRAME: usize = 4 * 1024;

/// The keep-alive comment.
const KEEP_ALIVE: &[u8] = b":\n\n";

/// The event stream of one session.
#[utoipa::path(get, path = "/api/session/{id}/events", operation_id = "streamEvents", tag = "session",
    params(
        ("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"),
        wire::EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Seq of the last event received; replay resumes after it (wins over `after`)"),
    ),
    responses(
        (status = 200, description = "Server-sent events: durable events (`event: <type>`, `id: <seq>`, data: Event), then `synced` (data: Synced) and the current `status`, then live durable events, `delta` (data: Delta) and `status` (data: Status); a final `error` (data: ErrorBody) when the store cannot be read or the client fell too far behind", content_type = "text/event-stream", body = wire::Event),
        (status = 400, description = "Malformed `after` or `Last-Event-ID`, or either past the session's last event", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 503, description = "Too many event streams open, on this session or in all", body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn stream(
    State(shared): State<Arc<Shared>>,
    SessionPath(session): SessionPath,
    Query(query): Query<wire::EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = match headers.get("last-event-id") {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ApiError::invalid("Last-Event-ID must be an event seq"))?,
        ),
        None => query.after,
    };
    // Subscribe first: whatever commits from now on is on the bus, whatever committed before
    // is in the store.
    let rx = shared.runtime.subscribe_session(&session);
    let id = session.clone();
    let row = read(&shared, move |snap| {
        snap.session(&id)?
            .ok_or_else(|| ApiError::from(agenthost_actors::Error::SessionNotFound(id.clone())))
    })
    .await?;
    // Every event a client received is durable, so it is in the log this snapshot reads: a
    // resume point past the log's end is another store's (or an older backup's), and a stream
    // from it would skip every event up to it without a word.
    if let Some(after) = after.filter(|&after| after > row.last_seq.0) {
        return Err(ApiError::invalid(format!(
            "cannot resume after event {after}: the session's last event is {}; pass the seq of \
             the last event received from this server",
            row.last_seq.0
        )));
    }
    let slot = shared.streams.open(&shared.options, &session)?;
    let feed = Feed {
        _slot: slot,
        shared: shared.clone(),
        session,
        rx,
        next: after.map_or(0, |a| a.saturating_add(1)),
        last: after,
        reading: Some(Reading::Replay),
        until: row.last_seq.0,
        queue: VecDeque::new(),
        queued: 0,
        deltas: 0,
        pace: Pace::new(shared.options.delta_interval),
        timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        done: false,
        statuses: 0,
    };
    shared.counters.sse_opened();
    let frames = futures::stream::unfold(feed, |mut feed| async move {
        feed.next_frame().await.map(|frame| (frame, feed))
    });
    let body = Sliced {
        frames: Box::pin(frames),
        current: Bytes::new(),
        keep_alive: Box::pin(tokio::time::sleep(shared.options.keep_alive)),
        interval: shared.options.keep_alive,
    };
    let mut response = axum::body::Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// The response body of a stream: its frames in slices of at most [`SLICE`] bytes (of the
/// frame's own buffer, not copies), and a keep-alive comment when nothing was sent for
/// `interval`.
struct Sliced {
    frames: Pin<Box<dyn Stream<Item = Bytes> + Send>>,
    /// What is left of the frame being sent.
    current: Bytes,
    keep_alive: Pin<Box<tokio::time::Sleep>>,
    interval: Duration,
}

impl Stream for Sliced {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.current.is_empty() {
            match this.frames.as_mut().poll_next(cx) {
                Poll::Ready(Some(frame)) => this.current = frame,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => {
                    if this.keep_alive.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let next = tokio::time::Instant::now() + this.interval;
                    this.keep_alive.as_mut().reset(next);
                    return Poll::Ready(Some(Ok(Bytes::from_static(KEEP_ALIVE))));
                }
            }
        }
        let next = tokio::time::Instant::now() + this.interval;
        this.keep_alive.as_mut().reset(next);
        let slice = this.current.split_to(this.current.len().min(SLICE));
        Poll::Ready(Some(Ok(slice)))
    }
}

/// Frames of durable events being sent, shared by the streams sending them: a large event
/// watched by many streams (or replayed to many at once) is rendered and held once. Entries
/// live as long as some stream holds their frame, and the most recent large frames (up to
/// [`RECENT_BYTES`] in all) a while longer: a stream whose client reads hands its frame to the
/// kernel's socket buffer at once and lets it go, so streams sending the same event moments
/// apart would otherwise each render (and allocate) it anew.
#[derive(Debug, Default)]
pub(crate) struct Renders {
    frames: Mutex<Frames>,
}

#[derive(Debug, Default)]
struct Frames {
    held: HashMap<FrameKey, Weak<Vec<u8>>>,
    /// The most recently rendered large frames, oldest first, and their bytes.
    recent: VecDeque<Arc<Vec<u8>>>,
    recent_bytes: usize,
}

/// The most bytes of recently rendered frames [`Renders`] keeps after every stream let them go.
const RECENT_BYTES: usize = 8 * 1024 * 1024;

/// A durable event: its session and seq.
type FrameKey = (SessionId, u64);

impl Renders {
    /// The frame of `stored`, rendered by `render` unless a stream already holds it.
    fn frame(&self, session: &SessionId, stored: &Stored) -> Bytes {
        let size = std::mem::size_of::<Stored>() + stored.event.weight();
        if size < SHARED_FRAME {
            return Bytes::from(render(stored));
        }
        let key = (session.clone(), stored.seq.0);
        let mut frames = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = frames.held.get(&key).and_then(Weak::upgrade) {
            return Bytes::from_owner(ArcBytes(shared));
        }
        let rendered = Arc::new(render(stored));
        // Forget the frames no stream holds any more, now and then: the map stays as large as
        // the frames in flight and the recent ones.
        if frames.held.len() >= 64 && frames.held.len().is_power_of_two() {
            frames.held.retain(|_, frame| frame.strong_count() > 0);
        }
        frames.held.insert(key, Arc::downgrade(&rendered));
        if rendered.len() <= RECENT_BYTES / 4 {
            frames.recent_bytes += rendered.len();
            frames.recent.push_back(rendered.clone());
            while frames.recent_bytes > RECENT_BYTES {
                let Some(oldest) = frames.recent.pop_front() else {
                    break;
                };
                frames.recent_bytes -= oldest.len();
            }
        }
        drop(frames);
        Bytes::from_owner(ArcBytes(rendered))
    }
}

/// A shared rendered frame as the owner of [`Bytes`].
struct ArcBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The SSE frame of a durable event.
fn render(stored: &Stored) -> Vec<u8> {
    let mut frame = Vec::with_capacity(128 + stored.event.weight());
    frame.extend_from_slice(b"event: ");
    frame.extend_from_slice(stored.event.kind().as_bytes());
    frame.extend_from_slice(b"\nid: ");
    frame.extend_from_slice(stored.seq.0.to_string().as_bytes());
    frame.extend_from_slice(b"\ndata: ");
    data(&mut frame, &wire::Event::from(stored));
    frame
}

/// Appends `payload` as a frame's JSON data line and the blank line that ends the frame,
/// serialized in place.
fn data<T: serde::Serialize>(frame: &mut Vec<u8>, payload: &T) {
    let start = frame.len();
    if let Err(e) = serde_json::to_writer(&mut *frame, payload) {
        // Wire types serialize infallibly; keep the stream well-formed regardless.
        frame.truncate(start);
        let error = serde_json::json!({ "error": format!("cannot serialize: {e}") });
        frame.extend_from_slice(error.to_string().as_bytes());
    }
    frame.extend_from_slice(b"\n\n");
}

/// The event streams open, in all and per session.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    inner: Arc<std::sync::Mutex<StreamCounts>>,
}

#[derive(Debug, Default)]
struct StreamCounts {
    total: usize,
    by_session: std::collections::HashMap<SessionId, usize>,
}

impl Streams {
    /// Counts a new stream of `session`, or refuses it when a limit is reached.
    fn open(&self, options: &crate::Options, session: &SessionId) -> Result<Slot, ApiError> {
        let mut counts = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if counts.total >= options.max_streams {
            return Err(ApiError::new(
                crate::error::ErrorType::Unavailable,
                format!(
                    "too many event streams open ({}); retry shortly",
                    options.max_streams
                ),
            ));
        }
        let open = counts.by_session.entry(session.clone()).or_default();
        if *open >= options.max_streams_per_session {
            return Err(ApiError::new(
                crate::error::ErrorType::Unavailable,
                format!(
                    "too many event streams open on session {session} ({}); retry shortly",
                    options.max_streams_per_session
                ),
            ));
        }
        *open += 1;
        counts.total += 1;
        Ok(Slot {
            streams: self.inner.clone(),
            session: session.clone(),
        })
    }
}

/// One open stream, counted until dropped.
struct Slot {
    streams: Arc<std::sync::Mutex<StreamCounts>>,
    session: SessionId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        counts.total -= 1;
        if let Some(open) = counts.by_session.get_mut(&self.session) {
            *open -= 1;
            if *open == 0 {
                counts.by_session.remove(&self.session);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Replay,
    CatchUp,
}

struct Feed {
    /// Counts this stream against the limits until it ends.
    _slot: Slot,
    shared: Arc<Shared>,
    session: SessionId,
    rx: agenthost_actors::Subscription,
    /// The seq of the next durable event to send.
    next: u64,
    /// The seq of the last durable event sent (or the client's starting point).
    last: Option<u64>,
    /// Reading durable events from the store, page by page as the client takes them: the
    /// replay (then `synced`), or a catch-up after the bus showed a gap.
    reading: Option<Reading>,
    /// The last seq `reading` reads from the store: the session's last event when the stream
    /// subscribed (the bus has every later one), or the event that showed a gap. A reading that
    /// chased the log's end instead would, on a session that keeps committing, hold back
    /// `synced`, deltas and status changes for as long as it kept finding more, and send the
    /// deltas after the events that end their parts.
    until: u64,
    queue: VecDeque<Frame>,
    /// Bytes of durable frames in `queue`.
    queued: usize,
    /// Delta frames in `queue`.
    deltas: usize,
    /// When queued frames go out.
    pace: Pace,
    /// Fires when held deltas are due; armed once per stream and moved, not made anew for
    /// every delta.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// An error frame was queued; end after it.
    done: bool,
    /// Status frames queued so far (see `gather`).
    statuses: u64,
}

/// The most rounds of the runtime an event stream woken by a durable event lets run before it
/// writes (see `Feed::gather`). Measured (BENCHMARKS.md, socket writes): a turn took 4.4–4.7
/// writes after one round, 3.4–3.8 after up to six; three is the fewest.
const GATHER_ROUNDS: usize = 6;

/// When an event stream's queued frames go out. Deltas are written at most once per
/// `interval`: the first of a burst at once, those that follow within the interval together
/// when it ends, or as soon as any other frame is queued behind them (a durable event or a
/// status never waits, and frames keep their order). A reply streamed token by token then costs
/// a write per interval instead of one per token. Decisions as data: the stream reports what it
/// holds and the time, and pops while [`Pace::releasing`].
#[derive(Debug)]
struct Pace {
    /// The shortest time between two writes of deltas alone; zero writes each as it comes.
    interval: Duration,
    /// Deltas queued before this instant wait for it.
    hold: Option<tokio::time::Instant>,
    /// Everything queued goes out now, without a pause.
    releasing: bool,
}

impl Pace {
    fn new(interval: Duration) -> Self {
        Pace {
            interval,
            hold: None,
            releasing: false,
        }
    }

    fn releasing(&self) -> bool {
        self.releasing
    }

    /// Whether deltas are paced at all (an interval of zero writes each as it comes, in its own
    /// frame).
    fn paced(&self) -> bool {
        !self.interval.is_zero()
    }

    /// Whether deltas queued at `now` wait (for the end of the interval a write began).
    fn holding(&self, now: tokio::time::Instant) -> bool {
        self.hold.is_some_and(|due| now < due)
    }

    /// With frames queued: starts releasing them all when they are due. Returns when deltas
    /// queued from now on are due, when that changed (the stream's timer is set to it).
    fn release(
        &mut self,
        now: tokio::time::Instant,
        only_deltas: bool,
        deltas: bool,
    ) -> Option<tokio::time::Instant> {
        if self.releasing || (only_deltas && self.holding(now)) {
            return None;
        }
        self.releasing = true;
        self.hold = None;
        if deltas && !self.interval.is_zero() {
            self.hold = Some(now + self.interval);
        }
        self.hold
    }

    /// A frame was taken; `empty` when it was the last one queued.
    fn popped(&mut self, empty: bool) {
        self.releasing = !empty;
    }
}

/// A frame waiting to be written.
struct Frame {
    body: Body,
    /// The size of a durable frame's data; 0 for ephemeral ones.
    bytes: usize,
}

enum Body {
    Frame(Bytes),
    /// Rendered when it leaves, so that deltas of one part held together leave as one frame.
    /// The first delta of a burst goes alone (`joinable` is false).
    Delta {
        delta: wire::Delta,
        joinable: bool,
    },
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.shared.counters.sse_closed();
    }
}

impl Feed {
    /// The next frame to write, paced by [`Pace`]. Frames returned without a pause in between
    /// leave in one write.
    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if !self.queue.is_empty() {
                if !self.pace.releasing() && self.reading.is_none() {
                    self.take_ready();
                }
                let now = tokio::time::Instant::now();
                let only_deltas = self.queue.len() == self.deltas;
                if let Some(due) = self.pace.release(now, only_deltas, self.deltas > 0) {
                    self.timer.as_mut().reset(due);
                }
                if self.pace.releasing()
                    && let Some(frame) = self.queue.pop_front()
                {
                    self.queued -= frame.bytes;
                    self.pace.popped(self.queue.is_empty());
                    return Some(match frame.body {
                        Body::Frame(frame) => frame,
                        Body::Delta { delta, .. } => {
                            self.deltas -= 1;
                            json_event("delta", &delta)
                        }
                    });
                }
            }
            if self.done {
                return None;
            }
            if let Some(reading) = self.reading {
                match self.catch_up().await {
                    Ok(true) => {}
                    Ok(false) => {
                        self.reading = None;
                        if reading == Reading::Replay {
                            let synced = wire::Synced {
                                last_seq: self.last,
                            };
                            self.enqueue(json_event("synced", &synced));
                            // Where the session stands now, so a client that (re)connects
                            // knows without asking; changes follow live.
                            let activity = self.shared.runtime.activity(&self.session);
                            let status = wire::Status::of(wire::status(activity));
                            self.enqueue(json_event("status", &status));
                        }
                    }
                    Err(e) => self.fail(e),
                }
                continue;
            }
            // Here the queue is empty or holds deltas that are not due yet. Deltas published
            // while some are held join them without waking the stream: it wakes when they are
            // due or when anything else comes, and takes everything queued then.
            let received = if self.queue.is_empty() {
                tokio::select! {
                    // Shutdown ends every stream, so the server's graceful stop is not held up.
                    () = self.shared.closing.cancelled() => return None,
                    received = self.rx.recv() => received,
                }
            } else {
                let due = tokio::select! {
                    () = self.shared.closing.cancelled() => return None,
                    () = self.timer.as_mut() => true,
                    () = self.rx.urgent() => false,
                };
                // Once the bus is gone, the stream ends after the deltas that are due.
                if self.take_ready() || due {
                    continue;
                }
                return None;
            };
            match received {
                Ok(message) => {
                    let durable = matches!(message.1, Live::Event(_));
                    self.take(&message);
                    self.gather(durable).await;
                }
                Err(RecvError::Lagged(missed)) => self.lagged(missed),
                Err(RecvError::Closed) => return None,
            }
        }
    }

    /// Lets the runtime run what is ready before the stream writes, so that what it publishes
    /// to this stream leaves in the same write instead of a write (and a wakeup of the client)
    /// each. After durable events that is usually a status two or three task hops away (the
    /// drain an admission starts says `running`, a drain whose last events just committed says
    /// `idle`): the stream waits up to [`GATHER_ROUNDS`] rounds of the runtime (a yield resumes
    /// once the worker has run every ready task and polled the I/O driver), and no longer once a
    /// status came. After a delta or a status it waits one round, so a reply's first token is
    /// not held back.
    async fn gather(&mut self, durable: bool) {
        let rounds = if durable { GATHER_ROUNDS } else { 1 };
        let statuses = self.statuses;
        for _ in 0..rounds {
            tokio::task::yield_now().await;
            // A catch-up from the store takes the bus in once it is done (see `next_frame`).
            if self.reading.is_some()
                || !self.take_ready()
                || self.done
                || self.statuses != statuses
            {
                return;
            }
        }
    }

    /// Takes in what the bus already holds for this stream, without waiting, so that a burst
    /// leaves in one write; `false` when the bus is gone and nothing more will come.
    fn take_ready(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(message) => self.take(&message),
                Err(TryRecvError::Lagged(missed)) => {
                    self.lagged(missed);
                    return true;
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Closed) => return false,
            }
        }
    }

    /// Queues the frame of one bus message.
    fn take(&mut self, message: &(SessionId, Live)) {
        let (session, live) = message;
        if *session != self.session {
            return;
        }
        match live {
            Live::Event(stored) if stored.seq.0 < self.next => {}
            Live::Event(stored) if stored.seq.0 == self.next => self.push(stored),
            // A gap means bus messages were lost without a lag report: the store has them
            // (this event is committed, so everything before it is too).
            Live::Event(stored) => {
                self.until = self.until.max(stored.seq.0);
                self.reading.get_or_insert(Reading::CatchUp);
            }
            Live::Delta {
                message,
                kind,
                part,
                delta,
            } => {
                let kind = wire::delta_type(*kind);
                // The first delta of a burst goes at once and alone; one that follows it and
                // continues the part of the delta queued before it joins that one: a write of
                // held deltas carries one frame per part, not one per token.
                let first = self.deltas == 0 && !self.pace.holding(tokio::time::Instant::now());
                if !first
                    && let Some(Frame {
                        body:
                            Body::Delta {
                                delta: last,
                                joinable: true,
                            },
                        ..
                    }) = self.queue.back_mut()
                    && last.message_id == message.as_str()
                    && last.kind == kind
                    && last.part == *part
                {
                    last.delta.push_str(delta);
                    return;
                }
                let delta = wire::Delta {
                    message_id: message.to_string(),
                    kind,
                    part: *part,
                    delta: delta.clone(),
                };
                self.queue.push_back(Frame {
                    body: Body::Delta {
                        delta,
                        joinable: !first && self.pace.paced(),
                    },
                    bytes: 0,
                });
                self.deltas += 1;
            }
            Live::Status(activity) => {
                let status = wire::Status::of(wire::status(*activity));
                self.enqueue(json_event("status", &status));
                self.statuses += 1;
            }
        }
    }

    /// The client fell further behind than its stream may hold: it gets a final frame saying
    /// so after what is queued, and resumes from the store when it reconnects.
    fn lagged(&mut self, missed: u64) {
        tracing::debug!(session_id = %self.session, missed, "event stream fell behind; closing it");
        self.shared.counters.sse_lagged();
        if self.done {
            return;
        }
        let resume = self.last.map_or_else(
            || "from the start".to_owned(),
            |last| format!("after {last}"),
        );
        let body = wire::ErrorBody {
            kind: crate::error::ErrorType::Unavailable,
            message: format!(
                "this stream fell more than {} KiB of events behind and is closed; reconnect \
                 with Last-Event-ID to resume from the store ({resume})",
                agenthost_actors::SESSION_BYTES / 1024
            ),
            decision: None,
        };
        self.queue.clear();
        self.deltas = 0;
        self.queued = 0;
        self.enqueue(json_event("error", &body));
        self.done = true;
    }

    /// Queues an ephemeral frame that is not a delta (it never waits, see `next_frame`).
    fn enqueue(&mut self, frame: Bytes) {
        self.queue.push_back(Frame {
            body: Body::Frame(frame),
            bytes: 0,
        });
    }

    fn push(&mut self, stored: &Stored) {
        let frame = self.shared.renders.frame(&self.session, stored);
        self.push_frame(stored.seq.0, frame);
    }

    /// Queues the frame of the durable event `seq`.
    fn push_frame(&mut self, seq: u64, frame: Bytes) {
        let bytes = frame.len();
        self.queue.push_back(Frame {
            body: Body::Frame(frame),
            bytes,
        });
        self.queued += bytes;
        self.last = Some(seq);
        self.next = seq + 1;
    }

    /// Queues durable events from `next` up to `until`, a page at most and no further than
    /// [`AHEAD`] bytes beyond what the client took; `true` while there are more. The events are
    /// rendered where they were read, and only their frames come back: a large event read by
    /// many streams at once is then decoded and dropped on the reading thread, instead of
    /// allocated there and freed on another, which an allocator with per-thread heaps holds on
    /// to.
    async fn catch_up(&mut self) -> Result<bool, ApiError> {
        if self.next > self.until {
            return Ok(false);
        }
        let session = self.session.clone();
        let from = Seq(self.next);
        let until = self.until;
        let limit = usize::try_from(until - self.next).map_or(PAGE, |n| PAGE.min(n + 1));
        let shared = self.shared.clone();
        let frames = read(&self.shared, move |snap| {
            let events = snap.events_within(&session, from, limit, AHEAD)?;
            Ok(events
                .iter()
                .take_while(|stored| stored.seq.0 <= until)
                .map(|stored| (stored.seq.0, shared.renders.frame(&session, stored)))
                .collect::<Vec<_>>())
        })
        .await?;
        // Empty only if the log ended early, which a committed `until` rules out: the reading
        // ends rather than asks again.
        let more = !frames.is_empty();
        for (seq, frame) in frames {
            if self.queued >= AHEAD {
                // The rest is read again once the client took what is queued.
                return Ok(true);
            }
            self.push_frame(seq, frame);
        }
        Ok(more && self.next <= self.until)
    }

    fn fail(&mut self, error: ApiError) {
        tracing::warn!(session_id = %self.session, error = %error, "event stream failed");
        let body = wire::ErrorBody {
            kind: error.kind(),
            message: error.message().to_owned(),
            decision: None,
        };
        self.enqueue(json_event("error", &body));
        self.done = true;
    }
}

/// The frame of an ephemeral event (no `id`).
fn json_event<T: serde::Serialize>(name: &str, payload: &T) -> Bytes {
    let mut frame = Vec::with_capacity(64 + name.len());
    frame.extend_from_slice(b"event: ");
    frame.extend_from_slice(name.as_bytes());
    frame.extend_from_slice(b"\ndata: ");
    data(&mut frame, payload);
    Bytes::from(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_frame_is_its_event_its_id_and_one_json_data_line() {
        let stored = Stored {
            seq: Seq(7),
            time: agenthost_model::Timestamp(1_700_000_000_000),
            event: agenthost_model::Event::ExecutionSucceeded,
        };
        let frame = String::from_utf8(render(&stored)).unwrap();
        let data = frame
            .strip_prefix("event: execution_succeeded\nid: 7\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("not a durable frame: {frame:?}"));
        let json: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(json["type"], "execution_succeeded");
        assert_eq!(json["seq"], 7);
        assert!(!data.contains('\n'));

        let status = json_event("status", &wire::Status::of(wire::StatusType::Idle));
        assert_eq!(&status[..], b"event: status\ndata: {\"type\":\"idle\"}\n\n");
    }

    fn failed(seq: u64, bytes: usize) -> Stored {
        Stored {
            seq: Seq(seq),
            time: agenthost_model::Timestamp(1_700_000_000_000),
            event: agenthost_model::Event::ExecutionFailed {
                error: "x".repeat(bytes),
                halted: false,
            },
        }
    }

    #[test]
    fn a_large_frame_is_rendered_once_for_streams_that_send_it_moments_apart() {
        let renders = Renders::default();
        let session = SessionId::parse("ses_frames").unwrap();
        let key = (session.clone(), 1);
        let first = renders.frame(&session, &failed(1, 100_000));
        // The first stream handed its frame to the kernel and let it go; the frame is still
        // there, and the next stream to send the event gets it, not a new rendering.
        drop(first);
        let kept = renders.frames.lock().unwrap().held[&key].upgrade();
        let kept = kept.expect("the frame is kept after its stream let it go");
        let again = renders.frame(&session, &failed(1, 100_000));
        assert_eq!(again.as_ptr(), kept.as_ptr());
        drop((again, kept));
        // What is kept after every stream let go is bounded: enough newer frames push it out,
        // and the event is rendered anew.
        for seq in 2..=(RECENT_BYTES / 100_000 + 1) as u64 {
            drop(renders.frame(&session, &failed(seq, 100_000)));
        }
        let frames = renders.frames.lock().unwrap();
        assert!(
            frames.recent_bytes <= RECENT_BYTES,
            "{}",
            frames.recent_bytes
        );
        assert!(
            frames.held[&key].upgrade().is_none(),
            "the oldest frame is still held"
        );
        drop(frames);
        // A small frame is not kept: it costs less to render than to look up.
        let small = renders.frame(&session, &failed(999, 10));
        assert!(
            !renders
                .frames
                .lock()
                .unwrap()
                .held
                .contains_key(&(session, 999))
        );
        drop(small);
    }

    #[test]
    fn a_bursts_first_delta_goes_at_once_and_the_rest_together_an_interval_later() {
        let t0 = tokio::time::Instant::now();
        let mut pace = Pace::new(10 * MS);
        // The first delta: out at once, and deltas are held for the next 10 ms.
        assert_eq!(pace.release(t0, true, true), Some(t0 + 10 * MS));
        assert!(pace.releasing());
        pace.popped(true);
        // Two more within the interval wait...
        assert_eq!(pace.release(t0 + 2 * MS, true, true), None);
        assert!(!pace.releasing());
        assert_eq!(pace.release(t0 + 9 * MS, true, true), None);
        assert!(!pace.releasing());
        // ...and go out together when it ends.
        assert_eq!(pace.release(t0 + 10 * MS, true, true), Some(t0 + 20 * MS));
        pace.popped(false);
        assert!(pace.releasing(), "the second goes in the same write");
        pace.popped(true);
        assert!(!pace.releasing());
    }

    #[test]
    fn any_other_frame_takes_the_held_deltas_out_with_it() {
        let t0 = tokio::time::Instant::now();
        let mut pace = Pace::new(10 * MS);
        pace.release(t0, true, true);
        pace.popped(true);
        assert_eq!(pace.release(t0 + MS, true, true), None, "a delta waits");
        // A durable event queued behind it: both go now.
        pace.release(t0 + 2 * MS, false, true);
        assert!(pace.releasing());
        pace.popped(false);
        pace.popped(true);
        // A durable event alone never waits and holds nothing back.
        assert_eq!(pace.release(t0 + 3 * MS, false, false), None);
        assert!(pace.releasing());
        pace.popped(true);
        assert_eq!(pace.release(t0 + 4 * MS, true, true), Some(t0 + 14 * MS));
    }

    #[test]
    fn with_no_interval_every_delta_goes_as_it_comes() {
        let t0 = tokio::time::Instant::now();
        let mut pace = Pace::new(Duration::ZERO);
        for n in 0..3 {
            assert_eq!(pace.release(t0 + n * MS, true, true), None);
            assert!(pace.releasing());
            pace.popped(true);
        }
    }
}
