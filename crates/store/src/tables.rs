//! Every redb table of the store, in one place. Keys are `(session id, seq)` tuples where rows
//! belong to a session's log, so a session's rows are one contiguous range. The event log has a
//! *front* table besides, keyed `(generation, session, seq)`, that takes new events until the
//! writer folds them into its *middle* table, keyed `(epoch, session, seq)`, and a few folds later
//! into the base table (see `log`).

use redb::TableDefinition;

/// `"format_version"` → u16 (little-endian). Written once when the store is created.
pub(crate) const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
/// `(session, seq)` → [`agenthost_model::Stored`]: the event log, the source of truth.
pub(crate) const EVENTS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("events");
/// `session` → `record::SessionRecord`: the session row and its inbox.
pub(crate) const SESSIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("sessions");
/// `(created ms, session)` → (): sessions in creation order, for listing newest first.
pub(crate) const SESSIONS_BY_CREATED: TableDefinition<'_, (u64, &str), ()> =
    TableDefinition::new("sessions_by_created");
/// `(session, seq)` → [`agenthost_model::Message`].
pub(crate) const MESSAGES: TableDefinition<'_, (&str, u64), &[u8]> =
    TableDefinition::new("messages");
/// `(generation, session, seq)` → [`agenthost_model::Stored`]: events not yet folded into
/// [`EVENTS_MIDDLE`] or [`EVENTS`].
pub(crate) const EVENTS_FRONT: TableDefinition<'_, (u64, &str, u64), &[u8]> =
    TableDefinition::new("events_front");
/// `(epoch, session, seq)` → [`agenthost_model::Stored`]: events folded out of the front, an
/// epoch per fold, not yet merged into [`EVENTS`] (format 8; a store of an older format gains
/// the table when it is opened for writing).
pub(crate) const EVENTS_MIDDLE: TableDefinition<'_, (u64, &str, u64), &[u8]> =
    TableDefinition::new("events_middle");

/// `message id` → [`agenthost_model::IndexEntry`]: every admitted input and message.
pub(crate) const INDEX: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("message_index");
/// `session` → [`agenthost_model::InstructionState`].
pub(crate) const INSTRUCTIONS: TableDefinition<'_, &str, &[u8]> =
    TableDefinition::new("instructions");
/// `(session, schedule id)` → [`agenthost_model::Schedule`]: each session's schedules (format 6;
/// a store of an older format gains the table when it is opened for writing).
pub(crate) const SCHEDULES: TableDefinition<'_, (&str, &str), &[u8]> =
    TableDefinition::new("schedules");
/// `session` → (): every session that holds a claim or has pending input, and maybe some that
/// no longer do, so recovery finds its work without scanning sessions. A session joins when its
/// work starts and is not in the set yet; sessions that went idle are pruned when the front is
/// folded, so a busy session is not taken out and put back in on every turn.
pub(crate) const WORKING: TableDefinition<'_, &str, ()> = TableDefinition::new("working");

/// Key of the format version in [`META`].
pub(crate) const FORMAT_KEY: &str = "format_version";
