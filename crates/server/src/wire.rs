//! The wire types live in `agenthost-api` (re-exported here, so `crate::wire::Session` names
//! them); this module adds the conversions from the runtime's and the store's own types, which
//! that crate does not know.

pub use agenthost_api::wire::*;

use agenthost_actors::{Activity, DeltaKind, Outcome};
use agenthost_store::Receipt;

/// The admission receipt as the API shows it.
pub fn admitted(r: &Receipt) -> Admitted {
    Admitted {
        id: r.id.to_string(),
        session_id: r.session.to_string(),
        admitted_seq: r.admitted_seq.0,
        delivery: r.delivery.into(),
        promoted_seq: r.promoted_seq.map(|s| s.0),
    }
}

/// How a drain ended, as the API shows it.
pub fn outcome(o: Outcome) -> DrainOutcome {
    match o {
        Outcome::Idle => DrainOutcome::Idle,
        Outcome::Completed { steps } => DrainOutcome::Completed { steps },
        Outcome::Interrupted => DrainOutcome::Interrupted,
        Outcome::Compacted { kept_from } => DrainOutcome::Compacted {
            kept_from: kept_from.0,
        },
        Outcome::Waiting { expires_at } => DrainOutcome::Waiting {
            expires_at: expires_at.0,
        },
        Outcome::Blocked(which) => DrainOutcome::Blocked {
            which: which.as_str().to_owned(),
        },
    }
}

/// What a session is doing, as the API shows it.
pub fn status(a: Activity) -> StatusType {
    match a {
        Activity::Idle => StatusType::Idle,
        Activity::Running => StatusType::Running,
        Activity::Waiting => StatusType::Waiting,
        Activity::Blocked => StatusType::Blocked,
    }
}

/// A live delta's kind, as the API shows it.
pub fn delta_type(k: DeltaKind) -> DeltaType {
    match k {
        DeltaKind::Text => DeltaType::Text,
        DeltaKind::Reasoning => DeltaType::Reasoning,
        DeltaKind::ToolInput => DeltaType::ToolInput,
        DeltaKind::Summary => DeltaType::Summary,
    }
}
