//! Session history as the model sees it: after the latest completed compaction.

use crate::ids::Seq;
use crate::message::{CompactionState, Message, SessionRow};

/// Which messages a request may include.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Everything in the active history (durable steps).
    All,
    /// Stops before the first assistant message that is unsettled or still has a running tool,
    /// so nothing is ever appended after an unresolved tool call (transient generate).
    Settled,
}

/// The active history: the latest compaction's summary, then the messages it kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    pub summary: Option<String>,
    pub messages: Vec<Message>,
}

/// The first seq a snapshot must load to select the active history of `row`.
pub fn load_from(row: &SessionRow) -> Seq {
    match row.compaction {
        Some(at) => at.min(row.active_from),
        None => row.active_from,
    }
}

/// Selects the active history from `messages` (seq order, at least every message from
/// [`load_from`] on). Compaction messages never reach the model themselves; the latest completed
/// one contributes its summary.
pub fn select(
    row: &SessionRow,
    messages: impl IntoIterator<Item = Message>,
    mode: Mode,
) -> History {
    let mut history = History::default();
    for message in messages {
        if let Message::Compaction { seq, state, .. } = &message {
            if Some(*seq) == row.compaction
                && let CompactionState::Completed { summary, .. } = state
            {
                history.summary = Some(summary.clone());
            }
            continue;
        }
        if message.seq() < row.active_from {
            continue;
        }
        if mode == Mode::Settled
            && let Message::Assistant(a) = &message
            && (!a.is_settled() || a.running_tools().next().is_some())
        {
            break;
        }
        history.messages.push(message);
    }
    history
}
