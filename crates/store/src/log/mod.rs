//! The event log on redb: its three tiers, the runs its values hold, the front the writer fills
//! and the folds that empty it. Everything about the log's layout is here; `rows` writes runs
//! into the front, `snapshot` reads through `read`.
//!
//! An event written by a commit goes first into the log's *front*, keyed
//! `(generation, session, seq)`. The generation is a counter the writer advances as it commits
//! ([`Front`]): a commit of a few hundred events has one of its own, above every row the front
//! holds, so its events go in at the table's end, side by side on few pages, instead of on a
//! page per session: redb copies every page a transaction touches, and with session-major keys
//! that copy, not the event, was the cost of a write. Smaller commits share a generation until
//! it holds a few thousand events.
//!
//! When the front holds enough events the writer *folds* it, in one transaction, joining each
//! session's runs: into a new *epoch* of the *middle*, keyed `(epoch, session, seq)`, at that
//! table's end (pages written whole, one after the other); or, once the middle holds
//! [`MIDDLE_EPOCHS`] epochs, the middle and the front together into the *base*, keyed
//! `(session, seq)`, in key order. A base insert copies the page of the session it lands in, so
//! merging several folds' worth at once copies each session's page once for all of them
//! instead of once per fold.
//!
//! A value holds a *run*: consecutive events of one session (`codec::run`), keyed by the first
//! one's seq. An operation writes its events as one run, and a fold joins a session's runs into
//! one, so a B-tree insert carries many events instead of one.
//!
//! Invariants (the readers below rely on them):
//! - an event lives in exactly one run, in the base, in one epoch of the middle or in one
//!   generation of the front; a run holds consecutive seqs of one session;
//! - for one session, base seqs are below middle seqs, which are below front seqs, and a lower
//!   epoch (generation) holds lower seqs than a higher one: seqs only grow, epochs and
//!   generations only grow, a fold moves the whole front and a merge the whole middle. So a
//!   session's events in seq order are its base runs, then its middle runs epoch by epoch, then
//!   its front runs generation by generation, with no merge.

mod fold;
mod read;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use fold::merge_all;
pub(crate) use fold::{Prepared, Runs, apply, fold, prepare};
pub(crate) use read::{ReadLog, generations};

/// Key of the base: `(session, first seq)`.
pub(crate) type BaseKey = (&'static str, u64);
/// Key of the front, `(generation, session, first seq)`, and of the middle,
/// `(epoch, session, first seq)`.
pub(crate) type FrontKey = (u64, &'static str, u64);
pub(crate) type Bytes = &'static [u8];

/// Most epochs the middle holds: the fold that would add one more merges the middle and the
/// front into the base instead. Readers visit every epoch, as every generation of the front.
pub(crate) const MIDDLE_EPOCHS: usize = 8;

/// How the writer fills the front and when it folds it. A batch with many events gets a
/// generation of its own, new, so that its keys sort above every row the front holds and go in
/// at the table's end, where redb packs them into full leaves (see `rows::put_sorted`), instead
/// of landing one by one among the rows earlier batches wrote; the next batch starts another.
/// Smaller batches share a generation until it holds `generation_rows`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Front {
    /// The generation batches go to.
    generation: u64,
    /// Events added since the last fold, and to the current generation.
    rows: usize,
    in_generation: usize,
    /// Generations begun since the last fold: readers visit each, so they are bounded too.
    generations: usize,
    /// The current generation takes no more batches.
    closed: bool,
    /// Fold once the front holds this many events, or this many generations.
    fold_rows: usize,
    /// A batch of at least this many events gets a generation of its own.
    own_rows: usize,
    /// Start a new generation after this many events.
    generation_rows: usize,
}

/// Generations of the front closed for a fold being prepared ([`Front::freeze`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frozen {
    /// The last of them: the fold takes every generation up to this one.
    pub(crate) upto: u64,
    /// The events and generations they held, as the front counted them.
    rows: usize,
    generations: usize,
}

/// Most generations between folds.
const FOLD_GENERATIONS: usize = 64;

impl Front {
    pub(crate) fn new(fold_rows: usize) -> Self {
        let fold_rows = fold_rows.max(1);
        Front {
            generation: 0,
            rows: 0,
            in_generation: 0,
            generations: 0,
            closed: false,
            fold_rows,
            // Batches of a few hundred events, as a busy writer commits, each get their own;
            // a fold's worth of them stays within `FOLD_GENERATIONS`.
            own_rows: fold_rows.div_ceil(FOLD_GENERATIONS),
            generation_rows: fold_rows.div_ceil(8),
        }
    }

    /// Whether the next batch folds the front first.
    pub(crate) fn due(&self) -> bool {
        self.rows >= self.fold_rows || self.generations >= FOLD_GENERATIONS
    }

    /// Closes the generations the front holds so far to further batches, for a fold of them
    /// prepared while batches go on (see `fold::prepare`): later batches go to higher
    /// generations, and count towards the next fold from zero.
    pub(crate) fn freeze(&mut self) -> Frozen {
        let frozen = Frozen {
            upto: self.generation,
            rows: self.rows,
            generations: self.generations,
        };
        self.generation += 1;
        self.rows = 0;
        self.in_generation = 0;
        self.generations = 0;
        self.closed = false;
        frozen
    }

    /// Frozen generations that were not folded after all: they count towards the next fold
    /// again.
    pub(crate) fn thaw(&mut self, frozen: Frozen) {
        self.rows += frozen.rows;
        self.generations += frozen.generations;
    }

    /// Places a batch that adds `added` events to the front, after folding it or not, in the
    /// order batches are committed: returns the generation its events go to.
    pub(crate) fn place(&mut self, folded: bool, added: usize) -> u64 {
        if folded {
            // The front is empty: the current generation starts over.
            self.rows = 0;
            self.in_generation = 0;
            self.generations = 0;
            self.closed = false;
        }
        if added == 0 {
            return self.generation;
        }
        let own = added >= self.own_rows;
        if self.in_generation > 0 && (own || self.closed) {
            self.generation += 1;
            self.in_generation = 0;
        }
        if self.in_generation == 0 {
            self.generations += 1;
        }
        self.rows += added;
        self.in_generation += added;
        self.closed = own || self.in_generation >= self.generation_rows;
        self.generation
    }
}
