//! The fold: the whole front of the log moved into its base, runs joined.

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
/// generation instead of reading and sorting the whole front, and copies only the run it is
/// building.
pub(crate) fn fold(txn: &WriteTransaction) -> Result<usize> {
    let moved = {
        let front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
        let generations = super::generations(&front)?;
        if generations.is_empty() {
            return Ok(0);
        }
        let mut base = txn.open_table(EVENTS).map_err(storage)?;
        // One cursor per generation, with its head's session and first seq decoded once.
        let mut cursors = Vec::with_capacity(generations.len());
        for &generation in &generations {
            let rows = front
                .range((generation, "", 0)..(generation + 1, "", 0))
                .map_err(storage)?;
            let mut cursor = (rows, None, String::new(), 0);
            advance(&mut cursor)?;
            cursors.push(cursor);
        }
        let mut run = codec::RunBuilder::default();
        // The session and first seq of the run being built, and the seq it expects next.
        let mut joined: (String, u64, u64) = (String::new(), 0, 0);
        let mut moved = 0;
        loop {
            // The cursor at the least (session, seq); a handful of generations, so a scan.
            let mut least: Option<usize> = None;
            for (i, (_, head, session, first)) in cursors.iter().enumerate() {
                if head.is_some()
                    && least.is_none_or(|l| {
                        (session.as_str(), *first) < (cursors[l].2.as_str(), cursors[l].3)
                    })
                {
                    least = Some(i);
                }
            }
            let Some(i) = least else {
                break;
            };
            let cursor = &mut cursors[i];
            let (_, value) = cursor
                .1
                .take()
                .expect("invariant: the least cursor has a head");
            let records = codec::records("event", value.value())?;
            moved += records.len();
            for (seq, record) in (cursor.3..).zip(records) {
                let joins = joined.0 == cursor.2
                    && joined.2 == seq
                    && run.count() < RUN_EVENTS
                    && run.bytes() < RUN_BYTES;
                if !joins {
                    if run.count() > 0 {
                        base.insert((joined.0.as_str(), joined.1), run.finish())
                            .map_err(storage)?;
                    }
                    joined.0.clone_from(&cursor.2);
                    joined.1 = seq;
                }
                run.push(record);
                joined.2 = seq + 1;
            }
            drop(value);
            advance(cursor)?;
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

/// A fold's cursor over one generation: its rows, its head, and the head's session and first
/// seq.
type Cursor<'t> = (
    redb::Range<'t, FrontKey, Bytes>,
    Option<(
        redb::AccessGuard<'t, FrontKey>,
        redb::AccessGuard<'t, Bytes>,
    )>,
    String,
    u64,
);

/// Moves a fold's cursor to its next row.
fn advance(cursor: &mut Cursor<'_>) -> Result<()> {
    cursor.1 = cursor.0.next().transpose().map_err(storage)?;
    if let Some((key, _)) = &cursor.1 {
        let (_, session, first) = key.value();
        cursor.2.clear();
        cursor.2.push_str(session);
        cursor.3 = first;
    }
    Ok(())
}
