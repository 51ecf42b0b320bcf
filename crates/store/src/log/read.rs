//! Reading the log: a session's events in seq order across the three tiers, one event, the
//! epochs and generations of the upper two.

use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, TableError};

use super::{BaseKey, Bytes, FrontKey};
use crate::codec::records;
use crate::error::{Result, storage};
use crate::tables::{EVENTS, EVENTS_FRONT, EVENTS_MIDDLE};

/// The generations a front table holds, or the epochs a middle table holds, oldest first.
pub(crate) fn generations(table: &impl ReadableTable<FrontKey, Bytes>) -> Result<Vec<u64>> {
    let first = table.first().map_err(storage)?.map(|(k, _)| k.value().0);
    let last = table.last().map_err(storage)?.map(|(k, _)| k.value().0);
    Ok(match (first, last) {
        (Some(first), Some(last)) => (first..=last).collect(),
        _ => Vec::new(),
    })
}

/// The log as one read transaction sees it: its tables, and the epochs and generations of the
/// upper tiers, oldest first.
pub(crate) struct ReadLog {
    base: ReadOnlyTable<BaseKey, Bytes>,
    /// `None` in a store of a format before 8 opened read-only: opening for writing creates
    /// the table, a read-only open never writes.
    middle: Option<ReadOnlyTable<FrontKey, Bytes>>,
    epochs: Vec<u64>,
    front: ReadOnlyTable<FrontKey, Bytes>,
    generations: Vec<u64>,
}

impl ReadLog {
    pub(crate) fn open(txn: &ReadTransaction) -> Result<Self> {
        let middle = match txn.open_table(EVENTS_MIDDLE) {
            Ok(table) => Some(table),
            Err(TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(storage(e)),
        };
        let epochs = match &middle {
            Some(middle) => generations(middle)?,
            None => Vec::new(),
        };
        let front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
        Ok(ReadLog {
            base: txn.open_table(EVENTS).map_err(storage)?,
            middle,
            epochs,
            generations: generations(&front)?,
            front,
        })
    }

    /// The upper tiers' parts, oldest first: the middle's epochs, then the front's generations.
    fn upper(&self) -> impl Iterator<Item = (&ReadOnlyTable<FrontKey, Bytes>, u64)> + '_ {
        let middle = (self.middle.iter()).flat_map(|m| self.epochs.iter().map(move |&e| (m, e)));
        let front = self.generations.iter().map(|&g| (&self.front, g));
        middle.chain(front)
    }

    /// Calls `each` with a session's records whose seq is at least `from`, in seq order, until
    /// it returns false.
    pub(crate) fn for_each(
        &self,
        session: &str,
        from: u64,
        mut each: impl FnMut(u64, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        // The run holding `from` starts at or before it; every later run starts after it.
        let holding = self
            .base
            .range((session, 0)..=(session, from))
            .map_err(storage)?
            .next_back();
        let later = self
            .base
            .range((session, from.saturating_add(1))..=(session, u64::MAX))
            .map_err(storage)?;
        for entry in holding.into_iter().chain(later) {
            let (key, value) = entry.map_err(storage)?;
            if !emit(key.value().1, value.value(), from, &mut each)? {
                return Ok(());
            }
        }
        // A session has a run or two in an epoch or a generation, if any: one seek each, and
        // the records before `from` are passed over undecoded.
        for (table, part) in self.upper() {
            let runs = table
                .range((part, session, 0)..=(part, session, u64::MAX))
                .map_err(storage)?;
            for entry in runs {
                let (key, value) = entry.map_err(storage)?;
                if !emit(key.value().2, value.value(), from, &mut each)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Finds one record: in the base first, one seek, where an input that waited through a
    /// merge is; then the middle, oldest epoch first, and the front, newest generation first,
    /// one seek each. The record wanted is a pending input. One that waited through a fold is
    /// in the middle, and sessions get their turns about in the order their inputs came, so the
    /// inputs read from the middle are mostly the oldest there (at 10 000 sessions, a third in
    /// its oldest epoch and nine in ten in its oldest four of eight); the front holds what is
    /// recent.
    pub(crate) fn find(&self, session: &str, seq: u64) -> Result<Option<Vec<u8>>> {
        let in_base = self
            .base
            .range((session, 0)..=(session, seq))
            .map_err(storage)?;
        if let Some(record) = in_last_run(in_base, |(_, first)| first, seq)? {
            return Ok(Some(record));
        }
        let middle = (self.middle.iter()).flat_map(|m| self.epochs.iter().map(move |&e| (m, e)));
        let front = self.generations.iter().rev().map(|&g| (&self.front, g));
        for (table, part) in middle.chain(front) {
            let in_part = table
                .range((part, session, 0)..=(part, session, seq))
                .map_err(storage)?;
            if let Some(record) = in_last_run(in_part, |(_, _, first)| first, seq)? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// Calls `each` with every record of every tier: the base in key order, then the middle
    /// epoch by epoch, then the front generation by generation, so each session's records come
    /// in seq order.
    #[cfg(test)]
    pub(crate) fn for_all(
        &self,
        mut each: impl FnMut(&str, u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        for entry in self.base.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (session, first) = key.value();
            for (seq, record) in (first..).zip(records("event run", value.value())?) {
                each(session, seq, record)?;
            }
        }
        for table in self.middle.iter().chain([&self.front]) {
            for entry in table.iter().map_err(storage)? {
                let (key, value) = entry.map_err(storage)?;
                let (_, session, first) = key.value();
                for (seq, record) in (first..).zip(records("event run", value.value())?) {
                    each(session, seq, record)?;
                }
            }
        }
        Ok(())
    }
}

/// Calls `each` with the records of a run that starts at `first`, from seq `from` on, until it
/// returns false. Returns whether it may go on.
fn emit(
    first: u64,
    value: &[u8],
    from: u64,
    each: &mut impl FnMut(u64, &[u8]) -> Result<bool>,
) -> Result<bool> {
    for (seq, record) in (first..).zip(records("event run", value)?) {
        if seq >= from && !each(seq, record)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The record at `seq` of a run that starts at `first`, if the run reaches it.
fn pick(first: u64, value: &[u8], seq: u64) -> Result<Option<Vec<u8>>> {
    let at = usize::try_from(seq - first).unwrap_or(usize::MAX);
    Ok(records("event run", value)?.get(at).map(|r| r.to_vec()))
}

/// The record at `seq` of the last run `runs` holds (the one starting at or before it), if
/// that run reaches it; `first` reads a run's first seq from its key.
fn in_last_run<K: redb::Key + 'static>(
    mut runs: redb::Range<'_, K, Bytes>,
    first: impl Fn(K::SelfType<'_>) -> u64,
    seq: u64,
) -> Result<Option<Vec<u8>>> {
    match runs.next_back() {
        Some(entry) => {
            let (key, value) = entry.map_err(storage)?;
            pick(first(key.value()), value.value(), seq)
        }
        None => Ok(None),
    }
}
