//! Live events: every durable event right after its commit, plus ephemeral deltas and status
//! changes that are never stored. One broadcast channel carries every session's
//! events (for observers that watch them all); a subscriber of one session has its own bounded
//! queue instead ([`Subscription`]), so a thousand event streams do not each filter every
//! session's traffic, and a session's events are freed as soon as its subscribers took them. A
//! subscriber that lags loses live events and must resync from the durable log by seq, which is
//! what `events?after=N` is for.
//!
//! A step records its start without waiting for the commit, so its first deltas can be streamed
//! before the `step_started` event that creates their message is durable. The bus holds such
//! deltas ([`Bus::hold`]) and lets them out right after that event, so no subscriber ever sees a
//! delta of a message it has not been told about.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use agenthost_model::{Event, MessageId, SessionId, Stored};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::IdMap;

/// Something that happened in a session, as subscribers see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    /// A durable event, delivered after it committed. Boxed: most items are deltas, and an item
    /// is as large as its largest kind.
    Event(Box<Stored>),
    /// A streamed fragment of an assistant part. Never stored; the part's durable event follows.
    /// Fragments the provider's stream had ready together come joined, up to 16 KiB in one.
    Delta {
        message: MessageId,
        kind: DeltaKind,
        part: u32,
        delta: String,
    },
    /// The session started or finished a drain, or began waiting for approvals.
    Status(Activity),
}

/// What a session is doing, as far as this process knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Idle,
    /// A drain runs.
    Running,
    /// Its last step waits for a person's approval; it holds no drain slot.
    Waiting,
    /// Its next model call would pass its budget; it holds no drain slot.
    Blocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaKind {
    Text,
    Reasoning,
    ToolInput,
    /// A compaction's summary as the model writes it (the compaction message's id).
    Summary,
}

impl DeltaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeltaKind::Text => "text",
            DeltaKind::Reasoning => "reasoning",
            DeltaKind::ToolInput => "tool_input",
            DeltaKind::Summary => "summary",
        }
    }
}

/// What a subscriber of one session may fall behind by before it has to resync from the store
/// (durable events come back from there; deltas it missed do not). The queue grows as it fills,
/// so a watched session that is keeping up holds a few slots, not this many.
const SESSION_CAPACITY: usize = 128;

/// What a subscriber of one session may fall behind by in bytes (about: an item's text and
/// fixed size, see [`weight`]): a reader that does not read holds no more than this alive,
/// however large the session's events. An item alone in the queue is always taken, so one
/// event larger than this does not make a reader that keeps up lag.
pub const SESSION_BYTES: usize = 1024 * 1024;

/// About how many bytes an item keeps alive.
fn weight(item: &Item) -> usize {
    std::mem::size_of::<(SessionId, Live)>()
        + match &item.1 {
            Live::Event(stored) => stored.event.weight(),
            Live::Delta { delta, .. } => delta.len(),
            Live::Status(_) => 0,
        }
}

/// Slots a queue keeps when its reader caught up; a larger burst's are given back.
const KEPT_SLOTS: usize = 16;

/// Deltas queued for a reader that waits for anything else ([`Subscription::urgent`]) wake it
/// anyway from this many on, well before the queue is full.
const QUIET_LIMIT: usize = SESSION_CAPACITY / 2;

fn is_delta(item: &Item) -> bool {
    matches!(item.1, Live::Delta { .. })
}

type Item = Arc<(SessionId, Live)>;

/// The runtime's event bus.
#[derive(Debug, Clone)]
pub struct Bus {
    tx: broadcast::Sender<Item>,
    sessions: Arc<IdMap<SessionId, Vec<Subscriber>>>,
    /// Deltas of messages whose creating event has not been published yet.
    held: Arc<IdMap<MessageId, Held>>,
}

#[derive(Debug, Default)]
struct Held {
    items: Vec<Item>,
    released: bool,
}

/// Holds a message's deltas until its `step_started` event is published; dropping it forgets
/// the message (and any delta still held, when the event never came).
#[derive(Debug)]
pub(crate) struct Hold {
    bus: Bus,
    message: MessageId,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.bus.held.remove(&self.message);
    }
}

impl Bus {
    pub(crate) fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity);
        Bus {
            tx,
            sessions: Arc::default(),
            held: Arc::default(),
        }
    }

    /// Starts holding `message`'s deltas until its creating event is published.
    pub(crate) fn hold(&self, message: &MessageId) -> Hold {
        self.held.insert(message.clone(), Held::default());
        Hold {
            bus: self.clone(),
            message: message.clone(),
        }
    }

    /// Whether anyone listens to `session` (or to every session) right now. Publishers check it
    /// before building what nobody would receive; a subscriber that arrives just after sees
    /// what is published from then on, as with any subscription. A session whose subscribers
    /// all left is forgotten here, as in [`Bus::publish`].
    pub(crate) fn listening(&self, session: &SessionId) -> bool {
        if self.tx.receiver_count() > 0 {
            return true;
        }
        let listened = self
            .sessions
            .get(session)
            .map(|subs| subs.iter().any(Subscriber::open));
        if listened == Some(false) {
            self.sessions
                .remove_if(session, |_, subs| !subs.iter().any(Subscriber::open));
        }
        listened == Some(true)
    }

    /// Publishes to whoever listens; with no subscriber the event is simply dropped. A session
    /// whose subscribers all left is forgotten here.
    pub(crate) fn publish(&self, session: &SessionId, live: Live) {
        let everyone = self.tx.receiver_count() > 0;
        if let Live::Delta { message, .. } = &live {
            if !everyone && !self.sessions.contains_key(session) {
                return;
            }
            if let Some(mut held) = self.held.get_mut(message)
                && !held.released
            {
                held.items.push(Arc::new((session.clone(), live)));
                return;
            }
        }
        let created = match &live {
            Live::Event(stored) => match &stored.event {
                Event::StepStarted { id, .. } => Some(id.clone()),
                _ => None,
            },
            _ => None,
        };
        self.send(session, everyone, Arc::new((session.clone(), live)));
        if let Some(id) = created
            && let Some(mut held) = self.held.get_mut(&id)
        {
            // Under the entry's lock: a delta published meanwhile waits, then goes straight out
            // after these.
            for item in std::mem::take(&mut held.items) {
                self.send(session, everyone, item);
            }
            held.released = true;
        }
    }

    /// Sends `item` to the session's subscribers, and to everyone's when `everyone` listens.
    fn send(&self, session: &SessionId, everyone: bool, item: Item) {
        if everyone {
            let _ = self.tx.send(item.clone());
        }
        let mut gone = false;
        if let Some(mut subs) = self.sessions.get_mut(session) {
            subs.retain(|sub| sub.offer(&item));
            gone = subs.is_empty();
        }
        if gone {
            self.sessions.remove_if(session, |_, subs| subs.is_empty());
        }
    }

    /// Every session's events.
    pub fn subscribe(&self) -> broadcast::Receiver<Item> {
        self.tx.subscribe()
    }

    /// One session's events only.
    pub fn subscribe_session(&self, session: &SessionId) -> Subscription {
        let queue = Arc::new(Queue::default());
        let sub = Subscriber {
            queue: queue.clone(),
        };
        self.sessions.entry(session.clone()).or_default().push(sub);
        Subscription { queue }
    }
}

/// A subscriber's queue, shared by the bus's end and the reader's. A mutex around a deque: a
/// queue that keeps up holds a few slots, and an idle subscriber costs about a hundred bytes
/// (a tokio channel allocates a first block and cache-padded state, ten times that, for each of
/// ten thousand streams).
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    items: VecDeque<Item>,
    /// About how many bytes `items` keep alive ([`weight`]).
    bytes: usize,
    /// Items dropped because the queue was full, not yet reported to the reader.
    missed: u64,
    /// The reader waiting for an item.
    waker: Option<Waker>,
    /// The reader waits for anything but a delta (see [`Subscription::urgent`]): a delta is
    /// queued without waking it.
    quiet: bool,
    /// The bus forgot this subscriber (the bus is gone): nothing more will come.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves the deque whole: every critical section is a
        // single push, pop or flag change.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The bus's end of a [`Subscription`]. Dropping it (the bus forgot the subscriber) ends the
/// subscription once the reader took what is queued.
#[derive(Debug)]
struct Subscriber {
    queue: Arc<Queue>,
}

impl Subscriber {
    /// Whether the reader is still there: the bus and the reader hold the queue, no one else.
    fn open(&self) -> bool {
        Arc::strong_count(&self.queue) > 1
    }

    /// Queues `item`, or counts it missed when the reader is too far behind; `false` once the
    /// reader is gone.
    fn offer(&self, item: &Item) -> bool {
        if !self.open() {
            return false;
        }
        let weight = weight(item);
        let mut state = self.queue.lock();
        let full = state.items.len() >= SESSION_CAPACITY
            || (!state.items.is_empty() && state.bytes + weight > SESSION_BYTES);
        if full || state.missed > 0 {
            // Behind: what follows a loss is dropped with it (the reader resyncs from the
            // store), and nothing more is held for it.
            state.missed += 1;
            if state.bytes > 0 {
                let dropped = std::mem::take(&mut state.items);
                state.missed += dropped.len() as u64;
                state.bytes = 0;
                let waker = state.waker.take();
                drop(state);
                drop(dropped);
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            return true;
        }
        state.bytes += weight;
        state.items.push_back(item.clone());
        let wake = !(state.quiet && is_delta(item) && state.items.len() < QUIET_LIMIT);
        let waker = if wake {
            state.quiet = false;
            state.waker.take()
        } else {
            None
        };
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.closed = true;
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// One session's live events, in the order they were published. It reports
/// [`RecvError::Lagged`] when it fell too far behind and items were dropped, and
/// [`RecvError::Closed`] when the bus is gone. A reader that lagged resyncs from the store, so
/// what was still queued (older than that resync: durable events the store has, stale deltas)
/// is dropped with the report, and the reader goes on with what is published next.
#[derive(Debug)]
pub struct Subscription {
    queue: Arc<Queue>,
}

/// What a read found, before it is mapped to the caller's error type.
enum Next {
    Item(Item),
    Lost(u64),
    Empty,
    Closed,
}

impl Subscription {
    /// The next item. A loss is reported as soon as the reader asks, never after an empty
    /// queue (items are dropped only while it is full).
    pub async fn recv(&mut self) -> Result<Item, RecvError> {
        std::future::poll_fn(|cx| match self.next(Some(cx.waker())) {
            Next::Item(item) => Poll::Ready(Ok(item)),
            Next::Lost(n) => Poll::Ready(Err(RecvError::Lagged(n))),
            Next::Closed => Poll::Ready(Err(RecvError::Closed)),
            Next::Empty => Poll::Pending,
        })
        .await
    }

    /// The next item if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Result<Item, TryRecvError> {
        match self.next(None) {
            Next::Item(item) => Ok(item),
            Next::Lost(n) => Err(TryRecvError::Lagged(n)),
            Next::Closed => Err(TryRecvError::Closed),
            Next::Empty => Err(TryRecvError::Empty),
        }
    }

    /// Waits until something other than a delta is queued (or the reader lost items, the bus
    /// is gone, or deltas fill half the queue), without taking anything: a reader that holds
    /// deltas back to write them together waits here, so that every delta published meanwhile
    /// does not wake it for nothing. It then takes what is queued with
    /// [`Subscription::try_recv`].
    pub async fn urgent(&mut self) {
        std::future::poll_fn(|cx| {
            let mut state = self.queue.lock();
            let ready = state.missed > 0
                || state.closed
                || state.items.len() >= QUIET_LIMIT
                || state.items.iter().any(|item| !is_delta(item));
            if ready {
                return Poll::Ready(());
            }
            if !state
                .waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                state.waker = Some(cx.waker().clone());
            }
            state.quiet = true;
            Poll::Pending
        })
        .await
    }

    /// Takes the next item; with `waker`, registers it when there is none yet. After a loss,
    /// what is still queued goes with the items dropped.
    fn next(&mut self, waker: Option<&Waker>) -> Next {
        let mut state = self.queue.lock();
        if state.missed > 0 {
            let lost = std::mem::take(&mut state.missed) + state.items.len() as u64;
            state.items = VecDeque::new();
            state.bytes = 0;
            return Next::Lost(lost);
        }
        if let Some(item) = state.items.pop_front() {
            state.bytes = state.bytes.saturating_sub(weight(&item));
            if state.items.is_empty() && state.items.capacity() > KEPT_SLOTS {
                // A burst is over: give its slots back.
                state.items = VecDeque::new();
            }
            return Next::Item(item);
        }
        if state.closed {
            return Next::Closed;
        }
        if let Some(waker) = waker {
            if !state.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                state.waker = Some(waker.clone());
            }
            state.quiet = false;
        }
        Next::Empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future as _;

    fn session(n: u32) -> SessionId {
        SessionId::parse(&format!("ses_{n:04}")).expect("valid")
    }

    fn status(n: u32) -> Live {
        Live::Status(match n % 2 == 1 {
            true => Activity::Running,
            false => Activity::Idle,
        })
    }

    fn running(item: &Item) -> bool {
        match &item.1 {
            Live::Status(activity) => *activity == Activity::Running,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_subscriber_gets_its_sessions_items_in_order() {
        let bus = Bus::new(16);
        let (a, b) = (session(1), session(2));
        let mut sub = bus.subscribe_session(&a);
        assert!(bus.listening(&a));
        assert!(!bus.listening(&b));
        for n in 0..4 {
            bus.publish(&a, status(n));
            bus.publish(&b, status(1));
        }
        for n in 0..4 {
            let item = sub.recv().await.expect("queued");
            assert_eq!(item.0, a);
            assert_eq!(running(&item), n % 2 == 1);
        }
    }

    #[tokio::test]
    async fn a_queue_is_bounded_in_bytes_and_frees_them_when_its_reader_falls_behind() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut slow = bus.subscribe_session(&a);
        // One item larger than the bound alone is taken: a reader that keeps up never lags.
        bus.publish(&a, delta(&"x".repeat(2 * SESSION_BYTES)));
        assert!(slow.recv().await.is_ok());
        // Far fewer items than the queue's slots, but more bytes than it may hold.
        let each = SESSION_BYTES / 4;
        for _ in 0..6 {
            bus.publish(&a, delta(&"x".repeat(each)));
        }
        let (queued, bytes) = {
            let state = slow.queue.lock();
            (state.items.len(), state.bytes)
        };
        assert_eq!((queued, bytes), (0, 0), "dropped at once, not when read");
        assert!(matches!(slow.recv().await, Err(RecvError::Lagged(6))));
        bus.publish(&a, status(1));
        assert!(running(&slow.recv().await.expect("after the loss")));
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_how_much_it_lost_and_goes_on() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut slow = bus.subscribe_session(&a);
        let mut quick = bus.subscribe_session(&a);
        let extra = 5;
        for n in 0..SESSION_CAPACITY as u32 + extra {
            bus.publish(&a, status(n));
            quick.recv().await.expect("keeps up");
        }
        // The loss and what was still queued: the reader resyncs from the store.
        let lost = u64::from(extra) + SESSION_CAPACITY as u64;
        assert!(matches!(slow.recv().await, Err(RecvError::Lagged(n)) if n == lost));
        assert!(matches!(slow.try_recv(), Err(TryRecvError::Empty)));
        // Then what is published after it.
        bus.publish(&a, status(1));
        assert!(running(&slow.recv().await.expect("after the loss")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_subscriber_is_woken_by_a_publish() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut sub = bus.subscribe_session(&a);
        let reader = tokio::spawn(async move { sub.recv().await.map(|item| running(&item)) });
        tokio::task::yield_now().await;
        bus.publish(&a, status(1));
        let woken = tokio::time::timeout(std::time::Duration::from_secs(1), reader).await;
        assert!(matches!(woken, Ok(Ok(Ok(true)))), "{woken:?}");
    }

    fn delta(text: &str) -> Live {
        Live::Delta {
            message: MessageId::parse("msg_0001").expect("valid"),
            kind: DeltaKind::Text,
            part: 0,
            delta: text.to_owned(),
        }
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[test]
    fn a_reader_waiting_for_more_than_deltas_is_woken_by_anything_else_only() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut sub = bus.subscribe_session(&a);
        let wakes = Arc::new(Wakes::default());
        let waker = futures::task::waker(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        {
            let mut urgent = Box::pin(sub.urgent());
            assert!(urgent.as_mut().poll(&mut cx).is_pending());
            bus.publish(&a, delta("a"));
            bus.publish(&a, delta("b"));
            assert_eq!(wakes.count(), 0, "woken by a delta");
            bus.publish(&a, status(1));
            assert_eq!(wakes.count(), 1, "not woken by the status");
            assert!(urgent.as_mut().poll(&mut cx).is_ready());
        }
        let mut taken = Vec::new();
        while let Ok(item) = sub.try_recv() {
            taken.push(item.1.clone());
        }
        assert_eq!(taken, [delta("a"), delta("b"), status(1)]);
        // A reader waiting for any item is woken by a delta.
        let mut next = Box::pin(sub.recv());
        assert!(next.as_mut().poll(&mut cx).is_pending());
        bus.publish(&a, delta("c"));
        assert_eq!(wakes.count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_deltas_wakes_a_quiet_reader_before_the_queue_is_full() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut sub = bus.subscribe_session(&a);
        let reader = tokio::spawn(async move { sub.urgent().await });
        tokio::task::yield_now().await;
        for _ in 0..QUIET_LIMIT {
            bus.publish(&a, delta("x"));
        }
        let woken = tokio::time::timeout(std::time::Duration::from_secs(1), reader).await;
        assert!(woken.is_ok(), "never woken");
    }

    #[tokio::test]
    async fn a_queue_gives_back_a_bursts_slots_once_read() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut sub = bus.subscribe_session(&a);
        for n in 0..100 {
            bus.publish(&a, status(n));
        }
        assert!(sub.queue.lock().items.capacity() >= 100);
        for _ in 0..100 {
            sub.recv().await.expect("queued");
        }
        assert!(sub.queue.lock().items.capacity() <= KEPT_SLOTS);
    }

    #[tokio::test]
    async fn a_subscriber_that_left_is_forgotten() {
        let bus = Bus::new(16);
        let a = session(1);
        let sub = bus.subscribe_session(&a);
        let mut kept = bus.subscribe_session(&a);
        drop(sub);
        bus.publish(&a, status(1));
        assert_eq!(bus.sessions.get(&a).map(|subs| subs.len()), Some(1));
        assert!(running(&kept.recv().await.expect("queued")));
        drop(kept);
        assert!(!bus.listening(&a));
        assert!(!bus.sessions.contains_key(&a));
    }

    #[tokio::test]
    async fn a_subscription_ends_with_the_bus() {
        let bus = Bus::new(16);
        let a = session(1);
        let mut sub = bus.subscribe_session(&a);
        assert!(matches!(sub.try_recv(), Err(TryRecvError::Empty)));
        bus.publish(&a, status(1));
        drop(bus);
        assert!(sub.try_recv().is_ok());
        assert!(matches!(sub.recv().await, Err(RecvError::Closed)));
        assert!(matches!(sub.try_recv(), Err(TryRecvError::Closed)));
    }
}
