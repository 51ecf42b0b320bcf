//! What the `sessions` table holds for a session: its row and its inbox.
//!
//! The inbox keeps only the admitted seqs of the pending inputs, as spans of consecutive seqs,
//! in the record that the session's events rewrite (see below): a few bytes, however deep the
//! queue when prompts arrive back to back. An input's id, delivery and prompt are in its
//! `PromptAdmitted` event, which the log keeps anyway and which is read back at promotion (and
//! when an exact retry is compared), so admitting an input writes its prompt once and adds no
//! row of its own.
//!
//! **A record may trail its log by admissions** (format 9). An admission changes only the
//! record's last seq, its time, its pending count and its inbox, all of which its
//! `PromptAdmitted` event says. So an admission queued behind pending input writes the record
//! marked as trailing (`trails`), and the admissions that follow it are not written to the record
//! at all, up to [`MAX_TRAIL`] of them; readers of a marked record apply the session's events
//! after its last seq ([`SessionRecord::admit`]). Any other event, and an admission to a session
//! without pending input (a turn's), writes the record whole and unmarked, so a reader looks at
//! the log's tail only for a session with a queue of prompts.

use agenthost_model::{Event, InboxRow, Seq, SessionId, SessionRow, Stored};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A session's record. Invariant: `inbox` holds exactly the seqs of the inputs admitted and not
/// promoted, so it holds `row.pending` of them. Stored as `codec`'s record of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionRecord {
    pub(crate) row: SessionRow,
    pub(crate) inbox: Inbox,
    /// Admissions after this record may be in the log instead of in it (see above). Set by the
    /// writer on the record it writes for an admission queued behind pending input; the record
    /// of any other event is written without it.
    pub(crate) trails: bool,
}

/// Most admissions a stored record trails its log by.
pub(crate) const MAX_TRAIL: u32 = 32;

impl SessionRecord {
    /// Holds a claim or has pending input: recovery's business (see `tables::WORKING`).
    pub(crate) fn working(&self) -> bool {
        self.row.claim.is_some() || self.row.pending > 0
    }

    /// Whether the stored record may trail its log.
    pub(crate) fn may_trail(&self) -> bool {
        self.trails
    }

    /// Applies an admission that follows the record in its session's log, as the projector
    /// does: its seq is the next one, and it adds a pending input.
    pub(crate) fn admit(&mut self, stored: &Stored) -> Result<()> {
        let corrupt = |reason: String| Error::Corrupt {
            what: format!("session record {} at seq {}", self.row.id, stored.seq),
            reason,
        };
        if !matches!(stored.event, Event::PromptAdmitted { .. }) {
            return Err(corrupt(format!(
                "the log after the record holds {}, not PromptAdmitted",
                stored.event.kind()
            )));
        }
        if stored.seq != self.row.last_seq.next() {
            return Err(corrupt(format!(
                "the log after the record goes on at seq {}, not {}",
                stored.seq,
                self.row.last_seq.next()
            )));
        }
        self.row.last_seq = stored.seq;
        self.row.updated = stored.time;
        self.row.pending += 1;
        self.inbox.add(stored.seq);
        Ok(())
    }
}

/// The admitted seqs of pending inputs, as sorted, disjoint, non-adjacent spans. The store's own
/// type, so the session record stores it as it is: changing its shape (or [`Span`]'s) is a
/// change of the record format (see `codec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Inbox {
    spans: Vec<Span>,
}

/// Seqs `first .. first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Span {
    first: u64,
    count: u64,
}

impl Span {
    fn end(&self) -> u64 {
        self.first + self.count
    }
}

impl Inbox {
    /// The span that would hold `seq`: the last one starting at or before it.
    fn span_of(&self, seq: Seq) -> Option<usize> {
        self.spans
            .partition_point(|s| s.first <= seq.0)
            .checked_sub(1)
    }

    pub(crate) fn waiting(&self, seq: Seq) -> bool {
        self.span_of(seq)
            .is_some_and(|i| seq.0 < self.spans[i].end())
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The pending seqs in admission order.
    pub(crate) fn seqs(&self) -> impl Iterator<Item = Seq> + '_ {
        self.spans.iter().flat_map(|s| (s.first..s.end()).map(Seq))
    }

    pub(crate) fn add(&mut self, seq: Seq) {
        if self.waiting(seq) {
            return;
        }
        // Where a span of its own would go, between the spans it may touch. A seq that extends
        // a span (the next admission of a queue) changes that span in place.
        let at = self.span_of(seq).map_or(0, |i| i + 1);
        let extends_before = at > 0 && self.spans[at - 1].end() == seq.0;
        let extends_after = self.spans.get(at).is_some_and(|s| s.first == seq.0 + 1);
        match (extends_before, extends_after) {
            (true, true) => {
                self.spans[at - 1].count += 1 + self.spans[at].count;
                self.spans.remove(at);
            }
            (true, false) => self.spans[at - 1].count += 1,
            (false, true) => {
                self.spans[at].first = seq.0;
                self.spans[at].count += 1;
            }
            (false, false) => self.spans.insert(
                at,
                Span {
                    first: seq.0,
                    count: 1,
                },
            ),
        }
    }

    pub(crate) fn remove(&mut self, seq: Seq) {
        let Some(i) = self.span_of(seq).filter(|&i| seq.0 < self.spans[i].end()) else {
            return;
        };
        let span = self.spans[i];
        let before = Span {
            first: span.first,
            count: seq.0 - span.first,
        };
        let after = Span {
            first: seq.0 + 1,
            count: span.end() - seq.0 - 1,
        };
        let kept: Vec<Span> = [before, after]
            .into_iter()
            .filter(|s| s.count > 0)
            .collect();
        self.spans.splice(i..=i, kept);
    }
}

/// The inbox row of a pending input, from the event that admitted it.
pub(crate) fn inbox_row(session: &SessionId, stored: Stored) -> Result<InboxRow> {
    match stored.event {
        Event::PromptAdmitted {
            id,
            delivery,
            prompt,
            wake,
        } => Ok(InboxRow {
            id,
            admitted_seq: stored.seq,
            delivery,
            prompt,
            wake,
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

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_inbox_is_the_set_of_seqs_added_and_not_removed(
            ops in proptest::collection::vec((any::<bool>(), 0u64..24), 0..80)
        ) {
            let mut inbox = Inbox::default();
            let mut model = std::collections::BTreeSet::new();
            for (add, seq) in ops {
                if add {
                    inbox.add(Seq(seq));
                    model.insert(seq);
                } else {
                    inbox.remove(Seq(seq));
                    model.remove(&seq);
                }
                let seqs: Vec<u64> = inbox.seqs().map(|s| s.0).collect();
                prop_assert_eq!(&seqs, &model.iter().copied().collect::<Vec<_>>());
                for seq in 0..24 {
                    prop_assert_eq!(inbox.waiting(Seq(seq)), model.contains(&seq));
                }
                // Spans stay as few as the set allows: no two touch.
                prop_assert!(inbox.spans.windows(2).all(|w| w[0].end() < w[1].first));
                prop_assert!(inbox.spans.iter().all(|s| s.count > 0));
            }
        }
    }

    /// Catching a record up with an admission makes of it what the projector does, and
    /// anything but the next admission is damage.
    #[test]
    fn an_admission_caught_up_is_what_the_projector_makes_of_it() {
        use agenthost_model::{Delivery, MessageId, Projections, Prompt, Timestamp};
        let s = SessionId::parse("ses_trail").expect("id");
        let event = |seq: u64, event: Event| Stored {
            seq: Seq(seq),
            time: Timestamp(100 + seq),
            event,
        };
        let created = event(
            0,
            Event::SessionCreated {
                agent: "default".into(),
                model: None,
                title: None,
            },
        );
        let admitted = |seq: u64| {
            event(
                seq,
                Event::PromptAdmitted {
                    id: MessageId::parse(&format!("msg_{seq}")).expect("id"),
                    delivery: Delivery::Queue,
                    prompt: Prompt::text("later"),
                    wake: true,
                },
            )
        };
        let mut p = Projections::default();
        p.apply(&s, &created).expect("created");
        let mut record = SessionRecord {
            row: p.sessions[&s].clone(),
            inbox: Inbox::default(),
            trails: true,
        };
        for seq in 1..=3 {
            p.apply(&s, &admitted(seq)).expect("admitted");
            record.admit(&admitted(seq)).expect("caught up");
        }
        assert_eq!(record.row, p.sessions[&s]);
        let pending: Vec<Seq> = p.inbox.keys().map(|(_, seq)| *seq).collect();
        assert_eq!(record.inbox.seqs().collect::<Vec<_>>(), pending);

        let before = record.clone();
        let other = event(4, Event::ExecutionStarted { forced: false });
        assert!(matches!(record.admit(&other), Err(Error::Corrupt { .. })));
        assert!(matches!(
            record.admit(&admitted(6)),
            Err(Error::Corrupt { .. })
        ));
        assert_eq!(record, before, "a refused event changes nothing");
    }

    #[test]
    fn a_queue_of_back_to_back_admissions_is_one_span() {
        let mut inbox = Inbox::default();
        for seq in 10..1010 {
            inbox.add(Seq(seq));
        }
        assert_eq!(inbox.spans.len(), 1);
        inbox.remove(Seq(10));
        inbox.remove(Seq(500));
        assert_eq!(inbox.spans.len(), 2);
        assert_eq!(inbox.seqs().count(), 998);
    }
}
