//! The on-disk record format, owned here and nowhere else.
//!
//! Every value stored is `[FORMAT_VERSION as u16 little-endian][bincode 2 standard encoding]`,
//! or, in the event log, a [`run`] of such records.
//! The version is also written once in the `meta` table; opening a store of a version this build
//! cannot read fails with [`Error::FormatVersion`] naming both, so a build never misreads
//! another's data. Opening an older readable store rewrites the `meta` version, so older builds
//! then refuse the file instead of missing what they do not know.
//! Decoding is bounded ([`MAX_RECORD`]) so a corrupt length prefix cannot allocate unbounded
//! memory. Bump [`FORMAT_VERSION`] whenever a stored type changes shape; the golden-file test in
//! `tests/` fails until you do.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The store format this build reads and writes: the first that shipped (versions 1 and 2 never
/// did). A later format adds its upgrade from this one, and its own golden file.
pub const FORMAT_VERSION: u16 = 3;

/// The oldest format this build opens.
pub const OLDEST_READABLE: u16 = FORMAT_VERSION;

/// The largest record decoded; larger length prefixes are treated as corruption.
pub const MAX_RECORD: usize = 64 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_RECORD>()
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    // Writing into a Vec cannot fail for I/O reasons, and model types are plain serde data that
    // bincode can express (no `deserialize_any` types).
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .expect("invariant: model types are plain serde data that bincode can encode");
    out
}

pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
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
    let (value, read) =
        bincode::serde::decode_from_slice(body, config()).map_err(|e| corrupt(e.to_string()))?;
    if read != body.len() {
        return Err(corrupt(format!("{} trailing bytes", body.len() - read)));
    }
    Ok(value)
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
mod tests {
    use super::*;
    use agenthost_model::{Event, Seq, Stored, Timestamp};

    #[test]
    fn round_trip_and_version_check() {
        let stored = Stored {
            seq: Seq(3),
            time: Timestamp(9),
            event: Event::ExecutionStarted { forced: true },
        };
        let bytes = encode(&stored);
        assert_eq!(decode::<Stored>("event", &bytes).expect("decodes"), stored);

        let mut future = bytes.clone();
        future[..2].copy_from_slice(&7u16.to_le_bytes());
        assert!(matches!(
            decode::<Stored>("event", &future),
            Err(Error::FormatVersion {
                found: 7,
                supported: FORMAT_VERSION
            })
        ));
        assert!(matches!(
            decode::<Stored>("event", &bytes[..1]),
            Err(Error::Corrupt { .. })
        ));
        let mut trailing = bytes;
        trailing.push(0);
        assert!(matches!(
            decode::<Stored>("event", &trailing),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn runs_frame_records_and_a_bare_record_is_a_run_of_one() {
        let a = encode(&Stored {
            seq: Seq(1),
            time: Timestamp(2),
            event: Event::ExecutionSucceeded,
        });
        let b = encode(&Stored {
            seq: Seq(2),
            time: Timestamp(2),
            event: Event::ExecutionStarted { forced: false },
        });
        let framed = run(&[&a, &b]);
        assert_eq!(records("run", &framed).expect("run"), [&a[..], &b[..]]);
        assert_eq!(run(&[&a]), a);
        assert_eq!(records("run", &a).expect("bare"), [&a[..]]);
        for cut in 1..framed.len() {
            assert!(
                matches!(records("run", &framed[..cut]), Err(Error::Corrupt { .. })),
                "cut at {cut}"
            );
        }
        let mut builder = RunBuilder::default();
        for records in [&[&a[..], &b[..]][..], &[&a[..]], &[&b[..], &a[..], &b[..]]] {
            for record in records {
                builder.push(record);
            }
            assert_eq!(builder.count(), records.len());
            assert_eq!(
                builder.bytes(),
                records.iter().map(|r| r.len()).sum::<usize>()
            );
            assert_eq!(builder.finish(), run(records), "built as run() frames it");
        }
        let mut long = framed;
        long.push(7);
        assert!(matches!(records("run", &long), Err(Error::Corrupt { .. })));
    }
}
