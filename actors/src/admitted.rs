//! The rows of inputs this process admitted and no drain has read yet, so that a drain's opening
//! read takes a pending input from memory instead of reading the event that admitted it back
//! from the log.
//!
//! Why it is exact: an input's row never changes once its admission is durable, and a row is kept
//! only after that, under the seq the store gave it, and only for an id this process minted, so
//! no earlier admission of the same id (a retry with another wake flag) can be what the log
//! holds. A snapshot asks only for the seqs it sees pending, so a row kept here for a seq it
//! lists is that input's row. Debug builds check every row a drain takes against the log.
//!
//! A drain takes the rows it reads. A row nobody takes (its session halted, or its input promoted
//! by a drain that read it from the log) leaves, oldest first, once the rows kept pass
//! [`MOST_BYTES`]; a miss costs the read it would have cost anyway.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use agenthost_model::{InboxRow, Seq, SessionId};

/// Bytes of rows kept at most (approximate: each prompt's size and a fixed overhead per row).
const MOST_BYTES: usize = 4 << 20;
/// A prompt larger than this is not kept: its copy would cost more than reading it back.
pub(crate) const MOST_PROMPT: usize = 16 << 10;
/// What a row costs besides its prompt: the row, its session's key and its place in the order.
const ROW_OVERHEAD: usize = 160;

#[derive(Debug, Default)]
pub(crate) struct Admitted {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each session's rows, in admission order.
    rows: HashMap<SessionId, Vec<InboxRow>>,
    /// Every row kept, oldest first; rows taken since stay here until eviction or a compaction
    /// passes them.
    order: VecDeque<(SessionId, Seq)>,
    count: usize,
    bytes: usize,
}

fn weight(row: &InboxRow) -> usize {
    row.prompt.size() + ROW_OVERHEAD
}

impl Admitted {
    /// Keeps the row of an input whose admission is durable.
    pub(crate) fn keep(&self, session: &SessionId, row: InboxRow) {
        if row.prompt.size() > MOST_PROMPT {
            return;
        }
        let weight = weight(&row);
        let mut inner = self.lock();
        while inner.bytes + weight > MOST_BYTES && inner.evict() {}
        inner.order.push_back((session.clone(), row.admitted_seq));
        match inner.rows.get_mut(session) {
            Some(rows) => rows.push(row),
            None => {
                inner.rows.insert(session.clone(), vec![row]);
            }
        }
        inner.count += 1;
        inner.bytes += weight;
        // Rows taken leave their keys in the order: dropped once they outnumber the rows kept.
        if inner.order.len() > 2 * inner.count + 64 {
            let Inner { rows, order, .. } = &mut *inner;
            order.retain(|(session, seq)| {
                rows.get(session)
                    .is_some_and(|rows| rows.iter().any(|row| row.admitted_seq == *seq))
            });
        }
    }

    /// Takes the row of the session's input admitted at `seq`, if it is kept.
    pub(crate) fn take(&self, session: &SessionId, seq: Seq) -> Option<InboxRow> {
        let mut inner = self.lock();
        inner.remove(session, seq)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Held for a few map operations; a panic in one leaves the maps consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rows kept, their bytes, and the keys in the order (the rows' and those of rows taken).
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize, usize) {
        let inner = self.lock();
        (inner.count, inner.bytes, inner.order.len())
    }
}

impl Inner {
    fn remove(&mut self, session: &SessionId, seq: Seq) -> Option<InboxRow> {
        let rows = self.rows.get_mut(session)?;
        let at = rows.iter().position(|row| row.admitted_seq == seq)?;
        let row = rows.remove(at);
        if rows.is_empty() {
            self.rows.remove(session);
        }
        self.count -= 1;
        self.bytes -= weight(&row);
        Some(row)
    }

    /// Lets the oldest row kept go; `false` when none is.
    fn evict(&mut self) -> bool {
        while let Some((session, seq)) = self.order.pop_front() {
            if self.remove(&session, seq).is_some() {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use agenthost_model::{Delivery, MessageId, Prompt, Timestamp};

    use super::*;

    fn session(n: u32) -> SessionId {
        SessionId::mint(Timestamp(1_000 + u64::from(n)), u128::from(n))
    }

    fn row(seq: u64, text: &str) -> InboxRow {
        InboxRow {
            id: MessageId::mint(Timestamp(seq), u128::from(seq)),
            admitted_seq: Seq(seq),
            delivery: Delivery::Steer,
            prompt: Prompt::text(text),
            wake: true,
        }
    }

    #[test]
    fn a_row_is_taken_once_by_its_session_and_seq() {
        let admitted = Admitted::default();
        let (a, b) = (session(1), session(2));
        admitted.keep(&a, row(2, "one"));
        admitted.keep(&a, row(3, "two"));
        admitted.keep(&b, row(2, "other"));
        assert_eq!(admitted.take(&a, Seq(3)), Some(row(3, "two")));
        assert_eq!(admitted.take(&a, Seq(3)), None, "taken once");
        assert_eq!(admitted.take(&b, Seq(3)), None, "another session's seq");
        assert_eq!(admitted.take(&b, Seq(2)), Some(row(2, "other")));
        assert_eq!(admitted.take(&a, Seq(2)), Some(row(2, "one")));
        assert_eq!(admitted.sizes().0, 0);
        assert_eq!(admitted.sizes().1, 0);
    }

    #[test]
    fn the_oldest_rows_leave_once_the_bytes_are_spent() {
        let admitted = Admitted::default();
        let s = session(1);
        let text = "x".repeat(MOST_PROMPT);
        let per = MOST_PROMPT + ROW_OVERHEAD;
        let fit = MOST_BYTES / per;
        for seq in 0..(fit as u64 + 10) {
            admitted.keep(&s, row(seq, &text));
        }
        let (count, bytes, _) = admitted.sizes();
        assert_eq!(count, fit);
        assert!(bytes <= MOST_BYTES);
        assert_eq!(admitted.take(&s, Seq(9)), None, "evicted, oldest first");
        assert!(admitted.take(&s, Seq(10)).is_some());
        // A prompt over the limit is not kept at all.
        admitted.keep(&s, row(1_000, &"y".repeat(MOST_PROMPT + 1)));
        assert_eq!(admitted.take(&s, Seq(1_000)), None);
    }

    #[test]
    fn keys_of_taken_rows_do_not_pile_up() {
        let admitted = Admitted::default();
        let s = session(1);
        for seq in 0..10_000 {
            admitted.keep(&s, row(seq, "hi"));
            assert!(admitted.take(&s, Seq(seq)).is_some());
        }
        let (count, _, order) = admitted.sizes();
        assert_eq!(count, 0);
        assert!(order <= 64 + 1, "{order} keys kept for no row");
    }
}
