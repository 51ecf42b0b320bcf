//! Minting ids: the only place the runtime draws an id from the clock and fresh entropy (the
//! model crate takes both as inputs). Each kind has its own [`Monotonic`] minter, so the ids
//! this process mints sort in the order it minted them, within a millisecond too.

use std::sync::Mutex;

use agenthost_model::{MessageId, Monotonic, ScheduleId, SessionId, Timestamp};

static MESSAGES: Mutex<Monotonic> = Mutex::new(Monotonic::new());
static SCHEDULES: Mutex<Monotonic> = Mutex::new(Monotonic::new());
static SESSIONS: Mutex<Monotonic> = Mutex::new(Monotonic::new());

/// The time and entropy of the next id `minter` makes.
fn next(minter: &Mutex<Monotonic>) -> (Timestamp, u128) {
    // A poisoned minter only means a thread panicked between two plain assignments.
    minter
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .next(agenthost_store::system_clock(), rand::random())
}

/// Mints a message id from the system clock and fresh entropy.
pub(crate) fn message_id() -> MessageId {
    let (now, entropy) = next(&MESSAGES);
    MessageId::mint(now, entropy)
}

/// Mints a schedule id from the system clock and fresh entropy.
pub(crate) fn schedule_id() -> ScheduleId {
    let (now, entropy) = next(&SCHEDULES);
    ScheduleId::mint(now, entropy)
}

/// Mints a session id from the system clock and fresh entropy.
pub(crate) fn session_id() -> SessionId {
    let (now, entropy) = next(&SESSIONS);
    SessionId::mint(now, entropy)
}
