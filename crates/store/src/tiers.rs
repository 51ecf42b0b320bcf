//! The two tiers of the session-keyed tables written once and read back rarely: the event log
//! and the inbox.
//!
//! A row written by a commit goes first into the table's *front*, keyed
//! `(generation, session, seq)`. The generation is a counter the writer advances every few
//! thousand rows, so the rows one commit writes for a thousand sessions land side by side on a
//! few pages instead of on a page per session: redb copies every page a transaction touches, and
//! with session-major keys that copy, not the row, was the cost of a write. When the front holds
//! enough rows the writer *folds* it into the *base* table, keyed `(session, seq)`, in one
//! transaction and in key order, so each session's page is copied once for many rows.
//!
//! Invariants (the readers below rely on them):
//! - a row lives in exactly one place: the base, or one generation of the front. An update
//!   rewrites it where it lives; a new row goes to the newest generation;
//! - for one session, every base row has a lower seq than every front row, and a lower
//!   generation holds lower seqs than a higher one: seqs only grow, generations only grow, and
//!   a fold moves the whole front. So a session's rows in seq order are its base rows followed
//!   by its front rows generation by generation, with no merge.

use redb::{ReadableTable, TableDefinition};

use crate::error::{Result, storage};

/// Key of a base table: `(session, seq)`.
pub(crate) type BaseKey = (&'static str, u64);
/// Key of a front table: `(generation, session, seq)`.
pub(crate) type FrontKey = (u64, &'static str, u64);
pub(crate) type Bytes = &'static [u8];

/// A session-keyed table in its two tiers.
#[derive(Clone, Copy)]
pub(crate) struct Tiered {
    pub(crate) what: &'static str,
    pub(crate) base: TableDefinition<'static, BaseKey, Bytes>,
    pub(crate) front: TableDefinition<'static, FrontKey, Bytes>,
}

/// Where a row lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    Base,
    Front(u64),
}

/// The generations a front table holds, oldest first.
pub(crate) fn generations(front: &impl ReadableTable<FrontKey, Bytes>) -> Result<Vec<u64>> {
    let first = front.first().map_err(storage)?.map(|(k, _)| k.value().0);
    let last = front.last().map_err(storage)?.map(|(k, _)| k.value().0);
    Ok(match (first, last) {
        (Some(first), Some(last)) => (first..=last).collect(),
        _ => Vec::new(),
    })
}

/// Calls `each` with a session's rows whose seq is at least `from`, in seq order, until it
/// returns false.
pub(crate) fn for_each(
    base: &impl ReadableTable<BaseKey, Bytes>,
    front: &impl ReadableTable<FrontKey, Bytes>,
    generations: &[u64],
    session: &str,
    from: u64,
    mut each: impl FnMut(u64, &[u8]) -> Result<bool>,
) -> Result<()> {
    for entry in base
        .range((session, from)..=(session, u64::MAX))
        .map_err(storage)?
    {
        let (key, value) = entry.map_err(storage)?;
        if !each(key.value().1, value.value())? {
            return Ok(());
        }
    }
    for &generation in generations {
        let range = (generation, session, from)..=(generation, session, u64::MAX);
        for entry in front.range(range).map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            if !each(key.value().2, value.value())? {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Finds one row: the newest generations first (recent rows are the ones read back), then the
/// base.
pub(crate) fn find(
    base: &impl ReadableTable<BaseKey, Bytes>,
    front: &impl ReadableTable<FrontKey, Bytes>,
    generations: &[u64],
    session: &str,
    seq: u64,
) -> Result<Option<(Tier, Vec<u8>)>> {
    for &generation in generations.iter().rev() {
        if let Some(value) = front.get((generation, session, seq)).map_err(storage)? {
            return Ok(Some((Tier::Front(generation), value.value().to_vec())));
        }
    }
    Ok(base
        .get((session, seq))
        .map_err(storage)?
        .map(|value| (Tier::Base, value.value().to_vec())))
}

/// Calls `each` with every row of both tiers: the base in key order, then the front generation
/// by generation, so each session's rows come in seq order.
pub(crate) fn for_all(
    base: &impl ReadableTable<BaseKey, Bytes>,
    front: &impl ReadableTable<FrontKey, Bytes>,
    mut each: impl FnMut(&str, u64, &[u8]) -> Result<()>,
) -> Result<()> {
    for entry in base.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (session, seq) = key.value();
        each(session, seq, value.value())?;
    }
    for entry in front.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (_, session, seq) = key.value();
        each(session, seq, value.value())?;
    }
    Ok(())
}
