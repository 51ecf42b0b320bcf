//! A session's outstanding work, in one row of the `work` table: whether it holds a claim and
//! which admitted inputs are still pending. Recovery finds its sessions here without scanning
//! session rows, and a pending input costs a few bytes in this row instead of a row of its own.
//!
//! The inbox keeps only each input's admitted seq and delivery. Its id and prompt are in its
//! `PromptAdmitted` event, which the log keeps anyway and which is read back at promotion (and
//! when an exact retry is compared), so admitting an input writes its prompt once.

use agenthost_model::{Delivery, Event, InboxRow, Seq, SessionId, Stored};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The row; absent while the session has no claim and nothing pending.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Work {
    pub(crate) claimed: bool,
    /// Pending inputs in admission order.
    pub(crate) inbox: Vec<Waiting>,
}

/// A pending input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiting {
    pub(crate) seq: Seq,
    pub(crate) delivery: Delivery,
}

impl Work {
    /// Nothing to keep: the row is removed.
    pub(crate) fn is_idle(&self) -> bool {
        !self.claimed && self.inbox.is_empty()
    }

    pub(crate) fn waiting(&self, seq: Seq) -> bool {
        self.inbox.binary_search_by_key(&seq, |w| w.seq).is_ok()
    }

    /// Adds an input, keeping admission order.
    pub(crate) fn add(&mut self, seq: Seq, delivery: Delivery) {
        if let Err(at) = self.inbox.binary_search_by_key(&seq, |w| w.seq) {
            self.inbox.insert(at, Waiting { seq, delivery });
        }
    }

    pub(crate) fn remove(&mut self, seq: Seq) {
        if let Ok(at) = self.inbox.binary_search_by_key(&seq, |w| w.seq) {
            self.inbox.remove(at);
        }
    }
}

/// The inbox row of a pending input, from the event that admitted it.
pub(crate) fn inbox_row(session: &SessionId, stored: Stored) -> Result<InboxRow> {
    match stored.event {
        Event::PromptAdmitted {
            id,
            delivery,
            prompt,
        } => Ok(InboxRow {
            id,
            admitted_seq: stored.seq,
            delivery,
            prompt,
        }),
        other => Err(Error::Corrupt {
            what: format!("pending input {session}/{}", stored.seq),
            reason: format!("its event is {}, not PromptAdmitted", other.kind()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_stay_in_admission_order_and_the_row_empties() {
        let mut work = Work::default();
        assert!(work.is_idle());
        work.add(Seq(5), Delivery::Queue);
        work.add(Seq(2), Delivery::Steer);
        work.add(Seq(5), Delivery::Queue);
        assert_eq!(
            work.inbox.iter().map(|w| w.seq).collect::<Vec<_>>(),
            [Seq(2), Seq(5)]
        );
        assert!(work.waiting(Seq(2)) && !work.waiting(Seq(3)));
        work.remove(Seq(2));
        work.remove(Seq(9));
        assert!(!work.is_idle());
        work.remove(Seq(5));
        assert!(work.is_idle());
        work.claimed = true;
        assert!(!work.is_idle());
    }
}
