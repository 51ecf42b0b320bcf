//! What the `sessions` table holds for a session: its row and its inbox.
//!
//! The inbox keeps only each pending input's admitted seq and delivery, a few bytes each, in the
//! record every event of the session rewrites anyway. The input's id and prompt are in its
//! `PromptAdmitted` event, which the log keeps anyway and which is read back at promotion (and
//! when an exact retry is compared), so admitting an input writes its prompt once and adds no
//! row of its own.

use agenthost_model::{Delivery, Event, InboxRow, Seq, SessionId, SessionRow, Stored};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A session's record. Invariant: `inbox` lists exactly the inputs admitted and not promoted,
/// so its length is `row.pending`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub(crate) row: SessionRow,
    pub(crate) inbox: Inbox,
}

impl SessionRecord {
    /// Holds a claim or has pending input: recovery's business (see `tables::WORKING`).
    pub(crate) fn working(&self) -> bool {
        working(&self.row)
    }
}

pub(crate) fn working(row: &SessionRow) -> bool {
    row.claim.is_some() || row.pending > 0
}

/// Pending inputs in admission order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Inbox {
    pub(crate) inputs: Vec<Waiting>,
}

/// A pending input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiting {
    pub(crate) seq: Seq,
    pub(crate) delivery: Delivery,
}

impl Inbox {
    pub(crate) fn waiting(&self, seq: Seq) -> bool {
        self.inputs.binary_search_by_key(&seq, |w| w.seq).is_ok()
    }

    /// Adds an input, keeping admission order.
    pub(crate) fn add(&mut self, seq: Seq, delivery: Delivery) {
        if let Err(at) = self.inputs.binary_search_by_key(&seq, |w| w.seq) {
            self.inputs.insert(at, Waiting { seq, delivery });
        }
    }

    pub(crate) fn remove(&mut self, seq: Seq) {
        if let Ok(at) = self.inputs.binary_search_by_key(&seq, |w| w.seq) {
            self.inputs.remove(at);
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
    fn inputs_stay_in_admission_order() {
        let mut inbox = Inbox::default();
        inbox.add(Seq(5), Delivery::Queue);
        inbox.add(Seq(2), Delivery::Steer);
        inbox.add(Seq(5), Delivery::Queue);
        assert_eq!(
            inbox.inputs.iter().map(|w| w.seq).collect::<Vec<_>>(),
            [Seq(2), Seq(5)]
        );
        assert!(inbox.waiting(Seq(2)) && !inbox.waiting(Seq(3)));
        inbox.remove(Seq(2));
        inbox.remove(Seq(9));
        assert_eq!(inbox.inputs.len(), 1);
        inbox.remove(Seq(5));
        assert!(inbox.inputs.is_empty());
    }
}
