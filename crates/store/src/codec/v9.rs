//! Format 9's records: format 7's (`v7`), with one field appended to the session record, whether
//! admissions after it may be in the log instead of in it (see `record`). A new shape, so a
//! session record is decoded by the format its value was written in, and one of an earlier format
//! reads as one that trails nothing. As in `v3`: never change a type here; a new shape is a new
//! format (see the module docs of `codec`).

use agenthost_model as model;
use serde::{Deserialize, Serialize};

/// A session's record in format 9: format 7's, and whether it may trail its log.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SessionRecord<'a> {
    base: super::v7::SessionRecord<'a>,
    trails: bool,
}

impl<'a> From<&'a crate::record::SessionRecord> for SessionRecord<'a> {
    fn from(record: &'a crate::record::SessionRecord) -> Self {
        SessionRecord {
            base: record.into(),
            trails: record.trails,
        }
    }
}

impl TryFrom<SessionRecord<'_>> for crate::record::SessionRecord {
    type Error = model::Error;
    fn try_from(record: SessionRecord<'_>) -> Result<Self, model::Error> {
        let SessionRecord { base, trails } = record;
        let mut record: crate::record::SessionRecord = base.try_into()?;
        record.trails = trails;
        Ok(record)
    }
}
