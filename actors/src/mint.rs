//! Minting ids: the only place the runtime draws an id from the clock and fresh entropy (the
//! model crate takes both as inputs).

use agenthost_model::{MessageId, ScheduleId, SessionId};

/// Mints a message id from the system clock and fresh entropy.
pub(crate) fn message_id() -> MessageId {
    MessageId::mint(agenthost_store::system_clock(), rand::random())
}

/// Mints a schedule id from the system clock and fresh entropy.
pub(crate) fn schedule_id() -> ScheduleId {
    ScheduleId::mint(agenthost_store::system_clock(), rand::random())
}

/// Mints a session id from the system clock and fresh entropy.
pub(crate) fn session_id() -> SessionId {
    SessionId::mint(agenthost_store::system_clock(), rand::random())
}
