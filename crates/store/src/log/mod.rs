//! The event log on redb: its two tiers, the runs its values hold, the front the writer fills
//! and the fold that empties it. Everything about the log's layout is here; `rows` writes
//! runs into the front, `snapshot` reads through `read`.
//!
//! An event written by a commit goes first into the log's *front*, keyed
//! `(generation, session, seq)`. The generation is a counter the writer advances every few
//! thousand events, so the events one commit writes for a thousand sessions land side by side on
//! a few pages instead of on a page per session: redb copies every page a transaction touches,
//! and with session-major keys that copy, not the event, was the cost of a write. When the front
//! holds enough events the writer *folds* it into the *base*, keyed `(session, seq)`, in one
//! transaction and in key order, so each session's page is copied once for many events.
//!
//! A value holds a *run*: consecutive events of one session (`codec::run`), keyed by the first
//! one's seq. An operation writes its events as one run, and a fold joins a session's runs into
//! one, so a B-tree insert carries many events instead of one.
//!
//! Invariants (the readers below rely on them):
//! - an event lives in exactly one run, in the base or in one generation of the front; a run
//!   holds consecutive seqs of one session;
//! - for one session, every base event has a lower seq than every front event, and a lower
//!   generation holds lower seqs than a higher one: seqs only grow, generations only grow, and
//!   a fold moves the whole front. So a session's events in seq order are its base runs
//!   followed by its front runs generation by generation, with no merge.

mod fold;
mod read;
#[cfg(test)]
mod tests;

pub(crate) use fold::fold;
#[cfg(test)]
pub(crate) use read::for_all;
pub(crate) use read::{find, for_each, generations};

/// Key of the base: `(session, first seq)`.
pub(crate) type BaseKey = (&'static str, u64);
/// Key of the front: `(generation, session, first seq)`.
pub(crate) type FrontKey = (u64, &'static str, u64);
pub(crate) type Bytes = &'static [u8];

/// How the writer fills the front and when it folds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Front {
    /// The generation new rows go to.
    pub(crate) generation: u64,
    /// Rows added since the last fold, and since the current generation began.
    pub(crate) rows: usize,
    pub(crate) in_generation: usize,
    /// Fold once the front holds this many rows.
    pub(crate) fold_rows: usize,
    /// Start a new generation after this many rows.
    pub(crate) generation_rows: usize,
}

impl Front {
    pub(crate) fn new(fold_rows: usize) -> Self {
        let fold_rows = fold_rows.max(1);
        Front {
            generation: 0,
            rows: 0,
            in_generation: 0,
            fold_rows,
            // A handful of generations between folds: each stays small enough that a commit's
            // rows land on few pages, and readers visit few of them.
            generation_rows: fold_rows.div_ceil(8),
        }
    }

    /// Records a committed transaction that added `added` rows, after folding or not.
    pub(crate) fn committed(&mut self, folded: bool, added: usize) {
        if folded {
            self.rows = 0;
        }
        self.rows += added;
        self.in_generation += added;
        if self.in_generation >= self.generation_rows {
            self.generation += 1;
            self.in_generation = 0;
        }
    }
}
