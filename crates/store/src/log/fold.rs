//! The folds: the whole front moved into a new epoch of the middle, or the middle and the front
//! together merged into the base; each session's runs joined either way. A fold into the middle
//! may also be prepared from a snapshot, off the commit path ([`prepare`]), and applied by a
//! later commit ([`apply`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use redb::{ReadTransaction, ReadableTable, WriteTransaction};

use super::{Bytes, FrontKey, MIDDLE_EPOCHS, generations};
use crate::codec;
use crate::error::{Error, Result, storage};
use crate::tables::{EVENTS, EVENTS_FRONT, EVENTS_MIDDLE};

/// Most events a fold joins into one run, and most bytes past which it starts another: runs
/// stay small enough to read back cheaply and to fit a few to a page.
const RUN_EVENTS: usize = 256;
const RUN_BYTES: usize = 16 * 1024;

/// Folds the whole front (see the module docs of `log`): into a new epoch of the middle, or,
/// when the middle holds [`MIDDLE_EPOCHS`] already, together with the middle into the base.
/// Either way the emptied tables are dropped whole (and created again, empty, for readers).
/// Returns how many events left the front. Runs before a batch's `Writes` in the transaction.
pub(crate) fn fold(txn: &WriteTransaction) -> Result<usize> {
    fold_within(txn, MIDDLE_EPOCHS)
}

/// Moves every event of the middle and the front into the base.
#[cfg(test)]
pub(crate) fn merge_all(txn: &WriteTransaction) -> Result<usize> {
    fold_within(txn, 0)
}

/// [`fold`], with the middle holding at most `most_epochs` (none: every fold merges). A middle
/// at its bound is merged even when the front is empty.
pub(crate) fn fold_within(txn: &WriteTransaction, most_epochs: usize) -> Result<usize> {
    let (moved, merged) = {
        let front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
        let gens = generations(&front)?;
        let mut middle = txn.open_table(EVENTS_MIDDLE).map_err(storage)?;
        let epochs = generations(&middle)?;
        let merge = epochs.len() >= most_epochs;
        if gens.is_empty() && (!merge || epochs.is_empty()) {
            return Ok(0);
        }
        if merge {
            // In base key order, so that each base page is copied once.
            let mut base = txn.open_table(EVENTS).map_err(storage)?;
            let mut parts = Vec::with_capacity(epochs.len() + gens.len());
            for &epoch in &epochs {
                parts.push(of(&middle, epoch)?);
            }
            for &generation in &gens {
                parts.push(of(&front, generation)?);
            }
            let joined = join(parts, |session, first, run| {
                base.insert((session, first), run).map_err(storage)?;
                Ok(())
            })?;
            (joined, true)
        } else {
            // Every key of the new epoch sorts above the middle's: one cursor at its end.
            let epoch = epochs.last().map_or(0, |last| last + 1);
            let mut parts = Vec::with_capacity(gens.len());
            for &generation in &gens {
                parts.push(of(&front, generation)?);
            }
            let mut end = middle
                .upper_bound_mut(std::ops::Bound::<FrontKey>::Unbounded)
                .map_err(storage)?;
            let joined = join(parts, |session, first, run| {
                end.insert_before((epoch, session, first), run)
                    .map_err(storage)
            })?;
            end.close().map_err(storage)?;
            (joined, false)
        }
    };
    txn.delete_table(EVENTS_FRONT).map_err(storage)?;
    txn.open_table(EVENTS_FRONT).map_err(storage)?;
    if merged {
        txn.delete_table(EVENTS_MIDDLE).map_err(storage)?;
        txn.open_table(EVENTS_MIDDLE).map_err(storage)?;
    }
    Ok(moved)
}

/// The rows of one epoch or generation of `table`.
fn of<'a>(
    table: &'a impl ReadableTable<FrontKey, Bytes>,
    part: u64,
) -> Result<redb::Range<'a, FrontKey, Bytes>> {
    table
        .range((part, "", 0)..(part + 1, "", 0))
        .map_err(storage)
}

/// Most bytes of joined runs a prepared fold holds in memory: a front larger than this is
/// folded by the commit instead, streaming.
const PREPARED_BYTES: usize = 64 << 20;

/// What [`prepare`] found to do.
pub(crate) enum Prepared {
    /// The front's generations up to `upto`, joined into runs for a new epoch of the middle.
    Runs(Runs),
    /// The fold is the commit's to do whole ([`fold`]): the middle is full, so the front
    /// merges into the base with it, or the front is too large to hold in memory.
    InCommit,
}

/// The runs of a prepared fold, in key order, and where they go.
pub(crate) struct Runs {
    /// The front's generations these runs hold: all of them up to this one.
    upto: u64,
    /// The middle's epoch they become, one above every epoch it held when they were read.
    epoch: u64,
    /// Each run's session, first seq and end in `bytes` (it begins where the one before ends).
    keys: Vec<(String, u64, usize)>,
    bytes: Vec<u8>,
    /// Events the runs hold.
    events: usize,
}

#[cfg(test)]
impl Runs {
    pub(crate) fn upto(&self) -> u64 {
        self.upto
    }

    pub(crate) fn empty(upto: u64) -> Runs {
        Runs {
            upto,
            epoch: 0,
            keys: Vec::new(),
            bytes: Vec::new(),
            events: 0,
        }
    }
}

/// Reads the front's generations up to `upto` from `txn` and joins each session's runs, as
/// [`fold`] would into a new epoch of the middle. Those generations must no longer change: every
/// batch that wrote them is durable, and later batches go to higher generations.
pub(crate) fn prepare(txn: &ReadTransaction, upto: u64) -> Result<Prepared> {
    prepare_within(txn, upto, MIDDLE_EPOCHS, PREPARED_BYTES)
}

/// [`prepare`], with the middle holding at most `most_epochs` (see [`fold_within`]) and the
/// prepared runs at most `most_bytes`.
pub(crate) fn prepare_within(
    txn: &ReadTransaction,
    upto: u64,
    most_epochs: usize,
    most_bytes: usize,
) -> Result<Prepared> {
    let front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
    let middle = txn.open_table(EVENTS_MIDDLE).map_err(storage)?;
    let epochs = generations(&middle)?;
    if epochs.len() >= most_epochs {
        return Ok(Prepared::InCommit);
    }
    let mut parts = Vec::new();
    for generation in generations(&front)? {
        if generation <= upto {
            parts.push(of(&front, generation)?);
        }
    }
    let mut runs = Runs {
        upto,
        epoch: epochs.last().map_or(0, |last| last + 1),
        keys: Vec::new(),
        bytes: Vec::new(),
        events: 0,
    };
    let mut too_large = false;
    let joined = join(parts, |session, first, run| {
        if runs.bytes.len() + run.len() > most_bytes {
            // Stops the join; the commit folds instead.
            too_large = true;
            return Err(Error::Storage("a prepared fold past its bound".into()));
        }
        runs.bytes.extend_from_slice(run);
        runs.keys
            .push((session.to_owned(), first, runs.bytes.len()));
        Ok(())
    });
    if too_large {
        return Ok(Prepared::InCommit);
    }
    runs.events = joined?;
    Ok(Prepared::Runs(runs))
}

/// Applies a prepared fold in `txn`: its runs go into the middle as a new epoch, at the table's
/// end, and the front keeps only its generations above the prepared ones (the batches since,
/// put back after the table is dropped whole). Returns how many events left the front. Runs
/// before a batch's `Writes` in the transaction.
pub(crate) fn apply(txn: &WriteTransaction, runs: &Runs) -> Result<usize> {
    {
        let mut middle = txn.open_table(EVENTS_MIDDLE).map_err(storage)?;
        if generations(&middle)?
            .last()
            .is_some_and(|&last| last >= runs.epoch)
        {
            // Only a fold changes the middle, and the writer has one at a time.
            return Err(Error::Storage(format!(
                "a fold prepared for epoch {} of the middle, which has moved on",
                runs.epoch
            )));
        }
        let mut end = middle
            .upper_bound_mut(std::ops::Bound::<FrontKey>::Unbounded)
            .map_err(storage)?;
        let mut start = 0;
        for (session, first, until) in &runs.keys {
            let run = &runs.bytes[start..*until];
            end.insert_before((runs.epoch, session.as_str(), *first), run)
                .map_err(storage)?;
            start = *until;
        }
        end.close().map_err(storage)?;
    }
    let later: Vec<((u64, String, u64), Vec<u8>)> = {
        let front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
        let rows = front.range((runs.upto + 1, "", 0)..).map_err(storage)?;
        rows.map(|row| {
            let (key, value) = row.map_err(storage)?;
            let (generation, session, first) = key.value();
            Ok((
                (generation, session.to_owned(), first),
                value.value().to_vec(),
            ))
        })
        .collect::<Result<_>>()?
    };
    txn.delete_table(EVENTS_FRONT).map_err(storage)?;
    let mut front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
    if !later.is_empty() {
        // In key order, into an empty table: one cursor at its end.
        let mut end = front
            .upper_bound_mut(std::ops::Bound::<FrontKey>::Unbounded)
            .map_err(storage)?;
        for ((generation, session, first), run) in &later {
            end.insert_before((*generation, session.as_str(), *first), run.as_slice())
                .map_err(storage)?;
        }
        end.close().map_err(storage)?;
    }
    Ok(runs.events)
}

/// Joins the runs of `parts` (each an epoch or a generation, in `(session, first seq)` order,
/// a session's events in an older part preceding those in a newer one) into runs in
/// `(session, first seq)` order, handing each to `put`. Merges one cursor per part (a heap of
/// their heads: there may be dozens) instead of reading and sorting them all, and copies only
/// the run it is building. Returns how many events it read.
fn join<'t>(
    parts: Vec<redb::Range<'t, FrontKey, Bytes>>,
    mut put: impl FnMut(&str, u64, &[u8]) -> Result<()>,
) -> Result<usize> {
    // One cursor per part, and the heads of all of them by their (session, first seq): the
    // least is the next run in key order. A head's session is a buffer its cursor reuses, so
    // a row costs no allocation.
    let mut cursors = Vec::with_capacity(parts.len());
    let mut heads = BinaryHeap::with_capacity(parts.len());
    for rows in parts {
        let mut cursor = (rows, None);
        let mut head = (String::new(), 0);
        if advance(&mut cursor, &mut head)? {
            heads.push(Reverse((head, cursors.len())));
        }
        cursors.push(cursor);
    }
    let mut run = codec::RunBuilder::default();
    // The session and first seq of the run being built, and the seq it expects next.
    let mut joined: (String, u64, u64) = (String::new(), 0, 0);
    let mut moved = 0;
    while let Some(Reverse((mut head, i))) = heads.pop() {
        let (session, first) = (&head.0, head.1);
        let cursor = &mut cursors[i];
        let (_, value) = cursor
            .1
            .take()
            .expect("invariant: a cursor in the heap has a head");
        let records = codec::records("event", value.value())?;
        moved += records.len();
        for (seq, record) in (first..).zip(records) {
            let joins = joined.0 == *session
                && joined.2 == seq
                && run.count() < RUN_EVENTS
                && run.bytes() < RUN_BYTES;
            if !joins {
                if run.count() > 0 {
                    put(&joined.0, joined.1, run.finish())?;
                }
                joined.0.clone_from(session);
                joined.1 = seq;
            }
            run.push(record);
            joined.2 = seq + 1;
        }
        drop(value);
        if advance(cursor, &mut head)? {
            heads.push(Reverse((head, i)));
        }
    }
    if run.count() > 0 {
        put(&joined.0, joined.1, run.finish())?;
    }
    Ok(moved)
}

/// A fold's cursor over one part: its rows and its head.
type Cursor<'t> = (
    redb::Range<'t, FrontKey, Bytes>,
    Option<(
        redb::AccessGuard<'t, FrontKey>,
        redb::AccessGuard<'t, Bytes>,
    )>,
);

/// Moves a fold's cursor to its next row, writing that row's session and first seq into
/// `head`; false when the cursor is done.
fn advance(cursor: &mut Cursor<'_>, head: &mut (String, u64)) -> Result<bool> {
    cursor.1 = cursor.0.next().transpose().map_err(storage)?;
    Ok(match &cursor.1 {
        Some((key, _)) => {
            let (_, session, first) = key.value();
            head.0.clear();
            head.0.push_str(session);
            head.1 = first;
            true
        }
        None => false,
    })
}
