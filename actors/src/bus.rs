//! Live events: every durable event right after its commit, plus ephemeral deltas and status
//! changes that are never stored. One broadcast channel carries every session's
//! events (for observers such as metrics); each session with a subscriber also has its own
//! channel, so a thousand event streams do not each filter every session's traffic. A
//! subscriber that lags loses live events and must resync from the durable log by seq, which is
//! what `events?after=N` is for.
//!
//! A step records its start without waiting for the commit, so its first deltas can be streamed
//! before the `step_started` event that creates their message is durable. The bus holds such
//! deltas ([`Bus::hold`]) and lets them out right after that event, so no subscriber ever sees a
//! delta of a message it has not been told about.

use std::sync::Arc;

use agenthost_model::{Event, MessageId, SessionId, Stored};
use tokio::sync::broadcast;

use crate::IdMap;

/// Something that happened in a session, as subscribers see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    /// A durable event, delivered after it committed.
    Event(Stored),
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

/// Capacity of a session's own channel: the events a slow reader may fall behind by before it
/// has to resync from the store (durable events come back from there; deltas it missed do not).
/// A channel allocates its whole capacity up front, about 32 bytes a slot, and every watched
/// session has one: at 1 024 slots, 10 000 watched sessions held 320 MiB in empty slots.
const SESSION_CAPACITY: usize = 128;

type Item = Arc<(SessionId, Live)>;

/// The runtime's event bus.
#[derive(Debug, Clone)]
pub struct Bus {
    tx: broadcast::Sender<Item>,
    sessions: Arc<IdMap<SessionId, broadcast::Sender<Item>>>,
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
    /// what is published from then on, as with any subscription. A session channel whose last
    /// subscriber left is removed here, as in [`Bus::publish`].
    pub(crate) fn listening(&self, session: &SessionId) -> bool {
        if self.tx.receiver_count() > 0 {
            return true;
        }
        let listened = self.sessions.get(session).map(|tx| tx.receiver_count() > 0);
        if listened == Some(false) {
            self.sessions
                .remove_if(session, |_, tx| tx.receiver_count() == 0);
        }
        listened == Some(true)
    }

    /// Publishes to whoever listens; with no subscriber the event is simply dropped. A session
    /// channel whose last subscriber left is removed here.
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
            Live::Event(Stored {
                event: Event::StepStarted { id, .. },
                ..
            }) => Some(id.clone()),
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
        let listened = self.sessions.get(session).map(|tx| tx.receiver_count() > 0);
        if self.tx.receiver_count() == 0 && listened != Some(true) {
            if listened == Some(false) {
                self.sessions
                    .remove_if(session, |_, tx| tx.receiver_count() == 0);
            }
            return;
        }
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(item.clone());
        }
        match listened {
            Some(true) => {
                if let Some(tx) = self.sessions.get(session) {
                    let _ = tx.send(item);
                }
            }
            Some(false) => {
                self.sessions
                    .remove_if(session, |_, tx| tx.receiver_count() == 0);
            }
            None => {}
        }
    }

    /// Every session's events.
    pub fn subscribe(&self) -> broadcast::Receiver<Item> {
        self.tx.subscribe()
    }

    /// One session's events only.
    pub fn subscribe_session(&self, session: &SessionId) -> broadcast::Receiver<Item> {
        self.sessions
            .entry(session.clone())
            .or_insert_with(|| broadcast::channel(SESSION_CAPACITY).0)
            .subscribe()
    }
}
