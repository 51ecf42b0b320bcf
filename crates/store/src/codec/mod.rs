//! The on-disk record format, owned here and nowhere else.
//!
//! **Records are the store's own, versioned types.** The store never encodes a model type: each
//! persisted model type (events, messages, the session record, index entries, instruction state,
//! schedules) implements [`Record`], which converts it to its record in the current format
//! (`v7`'s records, unchanged in format 8, and `v9`'s session record) and back.
//! A record mirrors its model type field for field as that type was when its format shipped,
//! and never changes after; the conversions are written out by hand, so that a change to a model
//! type fails to compile here instead of silently changing the bytes on disk.
//!
//! - A model change that the current records can still express (a renamed field, a new
//!   derived value) needs only a conversion change here; the format stays.
//! - A change of a record's shape (a new event variant, a new field, a new encoding) needs a
//!   [`FORMAT_VERSION`] bump, a new `vN` module with the new records, an upgrade from the previous
//!   version's records (opening an older store runs it), and its own golden file under
//!   `testdata/` (the golden-file test in `tests/` fails until all of that is done). A variant
//!   appended to an enum is the cheapest change: bincode encodes a variant by its position, so
//!   the older records decode with the new types as they are, and the upgrade is nothing more
//!   (formats 4, 5 and 6 are format 3 so extended, see `v5` and `v6`).
//!
//! Every value stored is `[FORMAT_VERSION as u16 little-endian][bincode 2 standard encoding]`,
//! or, in the event log, a [`run`] of such records. bincode is named nowhere else in the crate.
//! The version is also written once in the `meta` table; opening a store of a version this build
//! cannot read fails with [`Error::FormatVersion`] naming both, so a build never misreads
//! another's data.
//! Decoding is bounded ([`MAX_RECORD`]) so a corrupt length prefix cannot allocate unbounded
//! memory.

mod v3;
mod v5;
mod v6;
mod v7;
mod v9;

use agenthost_model::{IndexEntry, InstructionState, Message, Schedule, Stored};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::record::SessionRecord;

/// The store format this build writes: 9, format 3 (the first that shipped; versions 1 and 2
/// never did) with variants appended: one event in format 4, in format 5 the events, tool state
/// and message part of approvals, in format 6 the events of schedules (and the schedule record
/// they hold, which the schedules projection stores), and in format 7 the events of budgets and
/// two fields of the session record. Format 8 has format 7's records and changed the embedded
/// store's event log, which gained its middle tier (see `log`): a build of format 7 would not
/// read the events there, so it must refuse the store. Format 9 appends a field to the session
/// record, which may now trail its log by admissions (`v9`, see `record`); a record of an earlier
/// format reads as one that trails nothing, so the upgrade rewrites only the version. A later
/// format adds its upgrade from this one, and its own golden file.
pub const FORMAT_VERSION: u16 = 9;

/// The oldest format this build opens: every value of formats 3 to 7 decodes with format 7's
/// records (see `v7`; a session record by the format it was written in), and opening such a
/// store rewrites only its version (and creates the tables it lacks).
pub const OLDEST_READABLE: u16 = 3;

/// The largest record decoded; larger length prefixes are treated as corruption.
pub const MAX_RECORD: usize = 64 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_RECORD>()
}

/// A value the store persists, through its record in the current format.
pub(crate) trait Record: Sized + 'static {
    /// The record: borrows from the value it encodes, owns what it decodes.
    type Stored<'a>: Serialize + DeserializeOwned;

    fn to_stored(&self) -> Self::Stored<'_>;

    /// Fails when the record holds what the model refuses (an invalid id).
    fn from_stored(stored: Self::Stored<'static>) -> Result<Self, agenthost_model::Error>;

    /// Decodes a value's body written in format `version`: with the current record, unless the
    /// record changed shape since (then with the record of `version`).
    fn from_body(version: u16, body: &[u8]) -> Result<Self, String> {
        let _ = version;
        Self::from_stored(body_of(body)?).map_err(|e| e.to_string())
    }
}

/// A record's body, decoded whole.
fn body_of<S: DeserializeOwned>(body: &[u8]) -> Result<S, String> {
    let (stored, read): (S, usize) =
        bincode::serde::decode_from_slice(body, config()).map_err(|e| e.to_string())?;
    if read != body.len() {
        return Err(format!("{} trailing bytes", body.len() - read));
    }
    Ok(stored)
}

impl Record for Stored {
    type Stored<'a> = v7::Stored<'a>;

    fn to_stored(&self) -> v7::Stored<'_> {
        self.into()
    }

    fn from_stored(stored: v7::Stored<'static>) -> Result<Self, agenthost_model::Error> {
        stored.try_into()
    }
}

impl Record for SessionRecord {
    type Stored<'a> = v9::SessionRecord<'a>;

    fn to_stored(&self) -> v9::SessionRecord<'_> {
        self.into()
    }

    fn from_stored(stored: v9::SessionRecord<'static>) -> Result<Self, agenthost_model::Error> {
        stored.try_into()
    }

    fn from_body(version: u16, body: &[u8]) -> Result<Self, String> {
        let converted = |r: Result<Self, agenthost_model::Error>| r.map_err(|e| e.to_string());
        match version {
            ..7 => converted(body_of::<v3::SessionRecord<'static>>(body)?.try_into()),
            7..9 => converted(body_of::<v7::SessionRecord<'static>>(body)?.try_into()),
            _ => converted(Self::from_stored(body_of(body)?)),
        }
    }
}

// Format 6's record, unchanged in format 7.

impl Record for Schedule {
    type Stored<'a> = v6::Schedule<'a>;

    fn to_stored(&self) -> v6::Schedule<'_> {
        self.into()
    }

    fn from_stored(stored: v6::Schedule<'static>) -> Result<Self, agenthost_model::Error> {
        stored.try_into()
    }
}

// Format 5's record, unchanged in formats 6 and 7.

impl Record for Message {
    type Stored<'a> = v5::Message<'a>;

    fn to_stored(&self) -> v5::Message<'_> {
        self.into()
    }

    fn from_stored(stored: v5::Message<'static>) -> Result<Self, agenthost_model::Error> {
        stored.try_into()
    }
}

// The records below are format 3's, unchanged in formats 4 to 7.

impl Record for IndexEntry {
    type Stored<'a> = v3::IndexEntry<'a>;

    fn to_stored(&self) -> v3::IndexEntry<'_> {
        self.into()
    }

    fn from_stored(stored: v3::IndexEntry<'static>) -> Result<Self, agenthost_model::Error> {
        stored.try_into()
    }
}

impl Record for InstructionState {
    type Stored<'a> = v3::InstructionState<'a>;

    fn to_stored(&self) -> v3::InstructionState<'_> {
        self.into()
    }

    fn from_stored(stored: v3::InstructionState<'static>) -> Result<Self, agenthost_model::Error> {
        Ok(stored.into())
    }
}

pub(crate) fn encode<T: Record>(value: &T) -> Vec<u8> {
    // Room for a session record or an admission's event, so that most encodings do not grow.
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    // Writing into a Vec cannot fail, and records are plain serde data that bincode can express
    // (no `deserialize_any` types).
    bincode::serde::encode_into_writer(value.to_stored(), Appending(&mut out), config())
        .expect("invariant: records are plain serde data that bincode can encode");
    out
}

/// Appends what bincode writes to a vector: one `extend_from_slice` a write, without the
/// `std::io::Write` layer's count of bytes written.
struct Appending<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for Appending<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

pub(crate) fn decode<T: Record>(what: &str, bytes: &[u8]) -> Result<T> {
    let corrupt = |reason: String| Error::Corrupt {
        what: what.to_owned(),
        reason,
    };
    let (version, body) = bytes
        .split_first_chunk::<2>()
        .ok_or_else(|| corrupt("shorter than its version header".into()))?;
    let version = u16::from_le_bytes(*version);
    if !(OLDEST_READABLE..=FORMAT_VERSION).contains(&version) {
        return Err(Error::FormatVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    T::from_body(version, body).map_err(corrupt)
}

/// Marks a value that holds a run of records: a record begins with its format version, and no
/// version is this.
const RUN: u16 = u16::MAX;

/// Frames consecutive records (each as [`encode`] made it) as one value:
/// `[RUN u16][count u32][length u32, record]…`, all little-endian. A run of one is the bare
/// record, so a value of the formats before runs reads as a run of one.
pub(crate) fn run(records: &[&[u8]]) -> Vec<u8> {
    if let [record] = records {
        return record.to_vec();
    }
    let size = records.iter().map(|r| 4 + r.len()).sum::<usize>();
    let mut out = Vec::with_capacity(6 + size);
    out.extend_from_slice(&RUN.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for record in records {
        out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(record);
    }
    out
}

/// Builds the value [`run`] makes, one record at a time, in a buffer that is reused from run to
/// run.
#[derive(Default)]
pub(crate) struct RunBuilder {
    buf: Vec<u8>,
    count: u32,
}

/// Bytes before the first record's length in a framed run: the marker and the count.
const RUN_HEADER: usize = 6;

impl RunBuilder {
    pub(crate) fn push(&mut self, record: &[u8]) {
        if self.count == 0 {
            self.buf.clear();
            self.buf.extend_from_slice(&RUN.to_le_bytes());
            self.buf.extend_from_slice(&0u32.to_le_bytes());
        }
        self.buf
            .extend_from_slice(&(record.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(record);
        self.count += 1;
    }

    /// Records pushed since the last [`RunBuilder::finish`].
    pub(crate) fn count(&self) -> usize {
        self.count as usize
    }

    /// Bytes of the records pushed since the last [`RunBuilder::finish`].
    pub(crate) fn bytes(&self) -> usize {
        self.buf.len().saturating_sub(RUN_HEADER) - 4 * self.count as usize
    }

    /// The value, equal to [`run`] of the records pushed; the next push starts a new run.
    pub(crate) fn finish(&mut self) -> &[u8] {
        let count = std::mem::take(&mut self.count);
        match count {
            0 => &[],
            1 => &self.buf[RUN_HEADER + 4..],
            _ => {
                self.buf[2..RUN_HEADER].copy_from_slice(&count.to_le_bytes());
                &self.buf
            }
        }
    }
}

/// The records of a value written by [`run`], in order.
pub(crate) fn records<'a>(what: &str, bytes: &'a [u8]) -> Result<Vec<&'a [u8]>> {
    let corrupt = |reason: &str| Error::Corrupt {
        what: what.to_owned(),
        reason: reason.to_owned(),
    };
    let Some((marker, mut rest)) = bytes.split_first_chunk::<2>() else {
        return Err(corrupt("shorter than its version header"));
    };
    if u16::from_le_bytes(*marker) != RUN {
        return Ok(vec![bytes]);
    }
    let mut take = |n: usize| -> Result<&'a [u8]> {
        let (head, tail) = rest
            .split_at_checked(n)
            .ok_or_else(|| corrupt("a run ends inside a record"))?;
        rest = tail;
        Ok(head)
    };
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("invariant: 4 bytes")) as usize;
    let count = u32_at(take(4)?);
    let mut out = Vec::with_capacity(count.min(bytes.len() / 4));
    for _ in 0..count {
        let len = u32_at(take(4)?);
        out.push(take(len)?);
    }
    if !rest.is_empty() {
        return Err(corrupt("trailing bytes after a run"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
