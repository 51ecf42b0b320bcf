//! Every redb table of the store, in one place. Keys are `(session id, seq)` tuples where rows
//! belong to a session's log, so a session's rows are one contiguous range.

use redb::TableDefinition;

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
