//! Reading the log: a session's events in seq order across both tiers, one event, the
//! generations of the front.

use redb::ReadableTable;

use super::{BaseKey, Bytes, FrontKey};
use crate::codec::records;
use crate::error::{Result, storage};

/// The generations a front table holds, oldest first.
pub(crate) fn generations(front: &impl ReadableTable<FrontKey, Bytes>) -> Result<Vec<u64>> {
    let first = front.first().map_err(storage)?.map(|(k, _)| k.value().0);
    let last = front.last().map_err(storage)?.map(|(k, _)| k.value().0);
    Ok(match (first, last) {
        (Some(first), Some(last)) => (first..=last).collect(),
        _ => Vec::new(),
    })
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

/// Calls `each` with a session's records whose seq is at least `from`, in seq order, until it
/// returns false.
pub(crate) fn for_each(
    base: &impl ReadableTable<BaseKey, Bytes>,
    front: &impl ReadableTable<FrontKey, Bytes>,
    generations: &[u64],
    session: &str,
    from: u64,
    mut each: impl FnMut(u64, &[u8]) -> Result<bool>,
) -> Result<()> {
    // The run holding `from` starts at or before it; every later run starts after it.
    let holding = base
        .range((session, 0)..=(session, from))
        .map_err(storage)?
        .next_back();
    let later = base
        .range((session, from.saturating_add(1))..=(session, u64::MAX))
        .map_err(storage)?;
    for entry in holding.into_iter().chain(later) {
        let (key, value) = entry.map_err(storage)?;
        if !emit(key.value().1, value.value(), from, &mut each)? {
            return Ok(());
        }
    }
    // A session has a run or two in a generation of the front, if any: one seek per
    // generation, and the records before `from` are passed over undecoded.
    for &generation in generations {
        let runs = front
            .range((generation, session, 0)..=(generation, session, u64::MAX))
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

/// The record at `seq` of a run that starts at `first`, if the run reaches it.
fn pick(first: u64, value: &[u8], seq: u64) -> Result<Option<Vec<u8>>> {
    let at = usize::try_from(seq - first).unwrap_or(usize::MAX);
    Ok(records("event run", value)?.get(at).map(|r| r.to_vec()))
}

/// Finds one record: in the base first, one seek, where an input that waited through a fold
/// is; then the front, newest generation first (recent events are the ones read back), one
/// seek each.
pub(crate) fn find(
    base: &impl ReadableTable<BaseKey, Bytes>,
    front: &impl ReadableTable<FrontKey, Bytes>,
    generations: &[u64],
    session: &str,
    seq: u64,
) -> Result<Option<Vec<u8>>> {
    let in_base = base.range((session, 0)..=(session, seq)).map_err(storage)?;
    if let Some(record) = in_last_run(in_base, |(_, first)| first, seq)? {
        return Ok(Some(record));
    }
    for &generation in generations.iter().rev() {
        let in_generation = front
            .range((generation, session, 0)..=(generation, session, seq))
            .map_err(storage)?;
        if let Some(record) = in_last_run(in_generation, |(_, _, first)| first, seq)? {
            return Ok(Some(record));
        }
    }
    Ok(None)
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

/// Calls `each` with every record of both tiers: the base in key order, then the front
/// generation by generation, so each session's records come in seq order.
#[cfg(test)]
pub(crate) fn for_all(
    base: &impl ReadableTable<BaseKey, Bytes>,
    front: &impl ReadableTable<FrontKey, Bytes>,
    mut each: impl FnMut(&str, u64, &[u8]) -> Result<()>,
) -> Result<()> {
    for entry in base.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (session, first) = key.value();
        for (seq, record) in (first..).zip(records("event run", value.value())?) {
            each(session, seq, record)?;
        }
    }
    for entry in front.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (_, session, first) = key.value();
        for (seq, record) in (first..).zip(records("event run", value.value())?) {
            each(session, seq, record)?;
        }
    }
    Ok(())
}
