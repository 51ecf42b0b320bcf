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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agenthost_model::{Event, MessageId, SessionId, Stored};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{broadcast, mpsc};

use crate::IdMap;

/// Something that happened in a session, as subscribers see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    /// A durable event, delivered after it committed. Boxed: most items are deltas, and an item
    /// is as large as its largest kind.
    Event(Box<Stored>),
    /// A streamed fragment of an assistant part. Never stored; the part's durable event follows.
    Delta {
        message: MessageId,
        kind: DeltaKind,
        part: u32,
        delta: String,
    },
    /// The session started or finished a drain.
    Status { running: bool },
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
/// (durable events come back from there; deltas it missed do not). The queue grows in blocks
/// as it fills and frees what its reader took, so a watched session that is keeping up holds
/// one small block, not this many slots.
const SESSION_CAPACITY: usize = 128;

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
        if let Live::Delta { message, .. } = &live
            && (self.tx.receiver_count() > 0 || self.sessions.contains_key(session))
            && let Some(mut held) = self.held.get_mut(message)
            && !held.released
        {
            held.items.push(Arc::new((session.clone(), live)));
            return;
        }
        if matches!(live, Live::Delta { .. })
            && self.tx.receiver_count() == 0
            && !self.sessions.contains_key(session)
        {
            return;
        }
        let created = match &live {
            Live::Event(stored) => match &stored.event {
                Event::StepStarted { id, .. } => Some(id.clone()),
                _ => None,
            },
            _ => None,
        };
        self.send(session, Arc::new((session.clone(), live)));
        if let Some(id) = created
            && let Some(mut held) = self.held.get_mut(&id)
        {
            // Under the entry's lock: a delta published meanwhile waits, then goes straight out
            // after these.
            for item in std::mem::take(&mut held.items) {
                self.send(session, item);
            }
            held.released = true;
        }
    }

    fn send(&self, session: &SessionId, item: Item) {
        if self.tx.receiver_count() > 0 {
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
        let (tx, rx) = mpsc::channel(SESSION_CAPACITY);
        let missed = Arc::new(AtomicU64::new(0));
        let sub = Subscriber {
            tx,
            missed: missed.clone(),
        };
        self.sessions.entry(session.clone()).or_default().push(sub);
        Subscription { rx, missed }
    }
}

/// The bus's end of a [`Subscription`].
#[derive(Debug)]
struct Subscriber {
    tx: mpsc::Sender<Item>,
    /// Items dropped because the queue was full, not yet reported to the reader.
    missed: Arc<AtomicU64>,
}

impl Subscriber {
    fn open(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Queues `item`, or counts it missed when the reader is too far behind; `false` once the
    /// reader is gone.
    fn offer(&self, item: &Item) -> bool {
        match self.tx.try_send(item.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.missed.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
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
    rx: mpsc::Receiver<Item>,
    missed: Arc<AtomicU64>,
}

impl Subscription {
    /// The next item. A loss is reported as soon as the reader asks, never after an empty
    /// queue (items are dropped only while it is full).
    pub async fn recv(&mut self) -> Result<Item, RecvError> {
        if let Some(lost) = self.lost() {
            return Err(RecvError::Lagged(lost));
        }
        self.rx.recv().await.ok_or(RecvError::Closed)
    }

    /// The next item if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Result<Item, TryRecvError> {
        if let Some(lost) = self.lost() {
            return Err(TryRecvError::Lagged(lost));
        }
        self.rx.try_recv().map_err(|e| match e {
            mpsc::error::TryRecvError::Empty => TryRecvError::Empty,
            mpsc::error::TryRecvError::Disconnected => TryRecvError::Closed,
        })
    }

    /// After a loss: the items dropped and those still queued, which go with them.
    fn lost(&mut self) -> Option<u64> {
        let missed = self.missed.swap(0, Ordering::Relaxed);
        if missed == 0 {
            return None;
        }
        let mut lost = missed;
        while self.rx.try_recv().is_ok() {
            lost += 1;
        }
        Some(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u32) -> SessionId {
        SessionId::parse(&format!("ses_{n:04}")).expect("valid")
    }

    fn status(n: u32) -> Live {
        Live::Status {
            running: n % 2 == 1,
        }
    }

    fn running(item: &Item) -> bool {
        match &item.1 {
            Live::Status { running } => *running,
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
