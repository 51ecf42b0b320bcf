//! Every redb table of the store, in one place. Keys are `(session id, seq)` tuples where rows
//! belong to a session's log, so a session's rows are one contiguous range. The event log has a
//! *front* table besides, keyed `(generation, session, seq)`, that takes new events until the
//! writer folds them into the base table (see `tiers`).

use redb::TableDefinition;

use crate::tiers::Tiered;

/// `"format_version"` → u16 (little-endian). Written once when the store is created.
pub const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
/// `(session, seq)` → [`agenthost_model::Stored`]: the event log, the source of truth.
pub const EVENTS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("events");
/// `session` → `record::SessionRecord`: the session row and its inbox.
pub const SESSIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("sessions");
/// `(created ms, session)` → (): sessions in creation order, for listing newest first.
pub const SESSIONS_BY_CREATED: TableDefinition<'_, (u64, &str), ()> =
    TableDefinition::new("sessions_by_created");
/// `(session, seq)` → [`agenthost_model::Message`].
pub const MESSAGES: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("messages");
/// `(generation, session, seq)` → [`agenthost_model::Stored`]: events not yet folded into
/// [`EVENTS`].
pub const EVENTS_FRONT: TableDefinition<'_, (u64, &str, u64), &[u8]> =
    TableDefinition::new("events_front");

pub(crate) const EVENT_TIERS: Tiered = Tiered {
    what: "event",
    base: EVENTS,
    front: EVENTS_FRONT,
};
/// `message id` → [`agenthost_model::IndexEntry`]: every admitted input and message.
pub const INDEX: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("message_index");
/// `session` → [`agenthost_model::InstructionState`].
pub const INSTRUCTIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("instructions");
/// `session` → (): every session that holds a claim or has pending input, and maybe some that
/// no longer do, so recovery finds its work without scanning sessions. A session joins when its
/// work starts and is not in the set yet; sessions that went idle are pruned when the front is
/// folded, so a busy session is not taken out and put back in on every turn.
pub const WORKING: TableDefinition<'_, &str, ()> = TableDefinition::new("working");

/// Tables of older formats, read once when such a store is upgraded (see `init` in the crate
/// root) and then deleted.
pub(crate) mod legacy {
    use redb::TableDefinition;

    /// Formats 1–2: `(session, admitted seq)` → [`agenthost_model::InboxRow`].
    pub(crate) const INBOX: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("inbox");
    /// Format 2: `(generation, session, admitted seq)` → [`agenthost_model::InboxRow`].
    pub(crate) const INBOX_FRONT: TableDefinition<'_, (u64, &str, u64), &[u8]> =
        TableDefinition::new("inbox_front");
    /// Formats 1–2: `session` → (), sessions holding a claim.
    pub(crate) const CLAIMS: TableDefinition<'_, &str, ()> = TableDefinition::new("claims");
    /// Formats 1–2: `session` → (), sessions with pending input.
    pub(crate) const PENDING: TableDefinition<'_, &str, ()> = TableDefinition::new("pending");
}

/// Key of the format version in [`META`].
pub const FORMAT_KEY: &str = "format_version";
