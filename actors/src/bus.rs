//! Live events: every durable event right after its commit, plus ephemeral deltas and status
//! changes that are never stored (SPEC §4.1). One broadcast channel for the runtime; subscribers
//! filter by session. A subscriber that lags loses live events and must resync from the durable
//! log by seq, which is what `events?after=N` is for.

use std::sync::Arc;

use agenthost_model::{MessageId, SessionId, Stored};
use tokio::sync::broadcast;

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
}

impl DeltaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeltaKind::Text => "text",
            DeltaKind::Reasoning => "reasoning",
            DeltaKind::ToolInput => "tool_input",
        }
    }
}

/// The runtime's event bus.
#[derive(Debug, Clone)]
pub struct Bus {
    tx: broadcast::Sender<Arc<(SessionId, Live)>>,
}

impl Bus {
    pub(crate) fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity);
        Bus { tx }
    }

    /// Publishes to whoever listens; with no subscriber the event is simply dropped.
    pub(crate) fn publish(&self, session: &SessionId, live: Live) {
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(Arc::new((session.clone(), live)));
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<(SessionId, Live)>> {
        self.tx.subscribe()
    }
}
