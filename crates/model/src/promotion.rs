//! Which pending inputs a boundary promotes. Pure: the store runs it inside the write
//! transaction that records the promotions, so concurrent attempts promote an input once.

use crate::ids::MessageId;
use crate::message::InboxRow;
use crate::prompt::Delivery;

/// The kind of safe boundary the drain has reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// Continuation is owed (tool results to answer): only steers join.
    Continuation,
    /// The session would otherwise go idle: steers, or else exactly one queued input.
    Idle,
}

/// Returns the ids to promote, in admission order. `pending` must be in admission order.
///
/// - At a continuation boundary every pending steer is promoted in one batch; queued inputs
///   never promote while continuation is owed.
/// - At an idle boundary pending steers go first, all of them; if there are none, exactly one
///   queued input (the oldest) starts the next exchange. The next queued input waits for the
///   next idle boundary.
pub fn select(pending: &[InboxRow], boundary: Boundary) -> Vec<MessageId> {
    let steers: Vec<MessageId> = pending
        .iter()
        .filter(|row| row.delivery == Delivery::Steer)
        .map(|row| row.id.clone())
        .collect();
    if !steers.is_empty() || boundary == Boundary::Continuation {
        return steers;
    }
    pending
        .iter()
        .find(|row| row.delivery == Delivery::Queue)
        .map(|row| vec![row.id.clone()])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Seq;
    use crate::prompt::Prompt;

    fn row(n: u64, delivery: Delivery) -> InboxRow {
        InboxRow {
            id: MessageId::parse(&format!("msg_{n}")).expect("valid"),
            admitted_seq: Seq(n),
            delivery,
            prompt: Prompt::text(format!("p{n}")),
            wake: true,
        }
    }

    fn ids(v: Vec<MessageId>) -> Vec<String> {
        v.into_iter().map(String::from).collect()
    }

    #[test]
    fn continuation_promotes_all_steers_and_no_queue() {
        let p = [
            row(1, Delivery::Queue),
            row(2, Delivery::Steer),
            row(3, Delivery::Steer),
        ];
        assert_eq!(ids(select(&p, Boundary::Continuation)), ["msg_2", "msg_3"]);
        assert!(select(&p[..1], Boundary::Continuation).is_empty());
    }

    #[test]
    fn idle_promotes_steers_first_else_one_queued() {
        let p = [
            row(1, Delivery::Queue),
            row(2, Delivery::Queue),
            row(3, Delivery::Steer),
        ];
        assert_eq!(ids(select(&p, Boundary::Idle)), ["msg_3"]);
        assert_eq!(ids(select(&p[..2], Boundary::Idle)), ["msg_1"]);
        assert_eq!(ids(select(&p[1..2], Boundary::Idle)), ["msg_2"]);
        assert!(select(&[], Boundary::Idle).is_empty());
    }
}
