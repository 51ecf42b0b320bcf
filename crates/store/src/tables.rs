//! Every redb table of the store, in one place. Keys are `(session id, seq)` tuples where rows
//! belong to a session's log, so a session's rows are one contiguous range. The event log and
//! the inbox each have a *front* table besides, keyed `(generation, session, seq)`, that takes
//! new rows until the writer folds them into the base table (see `tiers`).

use redb::TableDefinition;

use crate::tiers::Tiered;

/// `"format_version"` → u16 (little-endian). Written once when the store is created.
pub const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
/// `(session, seq)` → [`agenthost_model::Stored`]: the event log, the source of truth.
pub const EVENTS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("events");
/// `session` → [`agenthost_model::SessionRow`].
pub const SESSIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("sessions");
/// `(created ms, session)` → (): sessions in creation order, for listing newest first.
pub const SESSIONS_BY_CREATED: TableDefinition<'_, (u64, &str), ()> =
    TableDefinition::new("sessions_by_created");
/// `(session, seq)` → [`agenthost_model::Message`].
pub const MESSAGES: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("messages");
/// `(session, admitted seq)` → [`agenthost_model::InboxRow`]: pending inputs only.
pub const INBOX: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("inbox");
/// `(generation, session, seq)` → [`agenthost_model::Stored`]: events not yet folded into
/// [`EVENTS`].
pub const EVENTS_FRONT: TableDefinition<'_, (u64, &str, u64), &[u8]> =
    TableDefinition::new("events_front");
/// `(generation, session, admitted seq)` → [`agenthost_model::InboxRow`], not yet folded into
/// [`INBOX`].
pub const INBOX_FRONT: TableDefinition<'_, (u64, &str, u64), &[u8]> =
    TableDefinition::new("inbox_front");

pub(crate) const EVENT_TIERS: Tiered = Tiered {
    what: "event",
    base: EVENTS,
    front: EVENTS_FRONT,
};
pub(crate) const INBOX_TIERS: Tiered = Tiered {
    what: "inbox row",
    base: INBOX,
    front: INBOX_FRONT,
};
/// `message id` → [`agenthost_model::IndexEntry`]: every admitted input and message.
pub const INDEX: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("message_index");
/// `session` → [`agenthost_model::InstructionState`].
pub const INSTRUCTIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("instructions");
/// `session` → (): sessions holding a claim (derived from session rows, for recovery).
pub const CLAIMS: TableDefinition<'_, &str, ()> = TableDefinition::new("claims");
/// `session` → (): sessions with pending input (derived from session rows, for recovery).
pub const PENDING: TableDefinition<'_, &str, ()> = TableDefinition::new("pending");

/// Key of the format version in [`META`].
pub const FORMAT_KEY: &str = "format_version";
