//! The fold: the whole front of the log moved into its base, runs joined.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use redb::{ReadableTable as _, WriteTransaction};

use super::{Bytes, FrontKey};
use crate::codec;
use crate::error::{Result, storage};
use crate::tables::{EVENTS, EVENTS_FRONT};

/// Most events a fold joins into one run, and most bytes past which it starts another: runs
/// stay small enough to read back cheaply and to fit a few to a page.
const RUN_EVENTS: usize = 256;
const RUN_BYTES: usize = 16 * 1024;

/// Moves the whole front of the event log into its base table, in base key order so that each
/// base page is copied once, joining each session's runs into longer ones, and drops the
/// emptied front table whole (and creates it again, empty, for readers). Returns how many
/// events moved. Runs before a batch's [`Writes`] in the transaction.
///
/// Each generation of the front is in `(session, seq)` order already, and a session's events in
/// an older generation precede those in a newer one, so the fold merges one cursor per
/// generation (a heap of their heads: there may be dozens) instead of reading and sorting the
/// whole front, and copies only the run it is building.
pub(crate) fn fold(txn: &WriteTransaction) -> Result<usize> {
    let moved = {
        let front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
        let generations = super::generations(&front)?;
        if generations.is_empty() {
            return Ok(0);
        }
        let mut base = txn.open_table(EVENTS).map_err(storage)?;
        // One cursor per generation, and the heads of all of them by their (session, first
        // seq): the least is the next run in base key order.
        let mut cursors = Vec::with_capacity(generations.len());
        let mut heads = BinaryHeap::with_capacity(generations.len());
        for &generation in &generations {
            let rows = front
                .range((generation, "", 0)..(generation + 1, "", 0))
                .map_err(storage)?;
            let mut cursor = (rows, None);
            if let Some(head) = advance(&mut cursor)? {
                heads.push(Reverse((head, cursors.len())));
            }
            cursors.push(cursor);
        }
        let mut run = codec::RunBuilder::default();
        // The session and first seq of the run being built, and the seq it expects next.
        let mut joined: (String, u64, u64) = (String::new(), 0, 0);
        let mut moved = 0;
        while let Some(Reverse(((session, first), i))) = heads.pop() {
            let cursor = &mut cursors[i];
            let (_, value) = cursor
                .1
                .take()
                .expect("invariant: a cursor in the heap has a head");
            let records = codec::records("event", value.value())?;
            moved += records.len();
            for (seq, record) in (first..).zip(records) {
                let joins = joined.0 == session
                    && joined.2 == seq
                    && run.count() < RUN_EVENTS
                    && run.bytes() < RUN_BYTES;
                if !joins {
                    if run.count() > 0 {
                        base.insert((joined.0.as_str(), joined.1), run.finish())
                            .map_err(storage)?;
                    }
                    joined.0.clone_from(&session);
                    joined.1 = seq;
                }
                run.push(record);
                joined.2 = seq + 1;
            }
            drop(value);
            if let Some(head) = advance(cursor)? {
                heads.push(Reverse((head, i)));
            }
        }
        if run.count() > 0 {
            base.insert((joined.0.as_str(), joined.1), run.finish())
                .map_err(storage)?;
        }
        moved
    };
    txn.delete_table(EVENTS_FRONT).map_err(storage)?;
    txn.open_table(EVENTS_FRONT).map_err(storage)?;
    Ok(moved)
}

/// A fold's cursor over one generation: its rows and its head.
type Cursor<'t> = (
    redb::Range<'t, FrontKey, Bytes>,
    Option<(
        redb::AccessGuard<'t, FrontKey>,
        redb::AccessGuard<'t, Bytes>,
    )>,
);

/// Moves a fold's cursor to its next row, returning that row's session and first seq.
fn advance(cursor: &mut Cursor<'_>) -> Result<Option<(String, u64)>> {
    cursor.1 = cursor.0.next().transpose().map_err(storage)?;
    Ok(cursor.1.as_ref().map(|(key, _)| {
        let (_, session, first) = key.value();
        (session.to_owned(), first)
    }))
}
