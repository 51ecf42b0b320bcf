//! Property tests of the projector: random event sequences, replay equals live, refusals change
//! nothing, and the derived counters agree with the rows.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::Violation;
use crate::event::{Event, Stored};
use crate::ids::{Seq, SessionId, Timestamp};
use crate::memory::Projections;
use crate::message::{IndexEntry, Message, Usage};
use crate::testing::Generator;

fn run(ops: &[(u8, u8)]) -> (Generator, BTreeMap<SessionId, Vec<Stored>>, usize) {
    let mut generator = Generator::default();
    let mut logs: BTreeMap<SessionId, Vec<Stored>> = BTreeMap::new();
    let mut refused = 0;
    for (i, &(action, pick)) in ops.iter().enumerate() {
        let (session, event) = generator.event(action, pick);
        let stored = Stored {
            seq: generator.next_seq(&session),
            time: Timestamp(i as u64),
            event,
        };
        let before = generator.projections.clone();
        match generator.projections.apply(&session, &stored) {
            Ok(()) => logs.entry(session).or_default().push(stored),
            Err(_) => {
                refused += 1;
                assert_eq!(
                    generator.projections, before,
                    "a refused event changed state"
                );
            }
        }
    }
    (generator, logs, refused)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn replay_equals_live(ops in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..300)) {
        let (generator, logs, _) = run(&ops);
        let live = &generator.projections;

        // Seqs are 0, 1, 2, … per session.
        for log in logs.values() {
            for (i, stored) in log.iter().enumerate() {
                prop_assert_eq!(stored.seq, Seq(i as u64));
            }
        }
        let replayed = Projections::replay(logs.iter().map(|(s, l)| (s, l.as_slice())))
            .expect("an accepted log replays");
        prop_assert_eq!(&replayed, live);

        // Derived counters agree with the rows they summarize.
        for (id, row) in &live.sessions {
            prop_assert_eq!(row.pending as usize, live.pending(id).len());
            prop_assert_eq!(row.last_seq, logs[id].last().expect("non-empty").seq);
            let mut usage = Usage::default();
            for stored in &logs[id] {
                match &stored.event {
                    Event::StepEnded { usage: u, .. }
                    | Event::CompactionEnded { usage: u, .. }
                    | Event::UsageRecorded { usage: u }
                    | Event::StepUsage { usage: u, .. } => usage.add(u),
                    _ => {}
                }
            }
            prop_assert_eq!(row.usage, usage);
        }
        for ((session, seq), message) in &live.messages {
            prop_assert_eq!(*seq, message.seq());
            let entry = live.index.get(message.id()).expect("every message is indexed");
            prop_assert_eq!(entry.session(), session);
            if let Message::User { admitted_seq, .. } = message {
                let want = IndexEntry::Prompt {
                    session: session.clone(),
                    admitted_seq: *admitted_seq,
                    promoted_seq: Some(*seq),
                };
                prop_assert_eq!(entry, &want);
            }
        }
    }
}

#[test]
fn generator_exercises_refusals_and_acceptance() {
    let ops: Vec<(u8, u8)> = (0..2000u32)
        .map(|i| ((i * 7 % 251) as u8, (i * 13 % 253) as u8))
        .collect();
    let (generator, logs, refused) = run(&ops);
    let accepted: usize = logs.values().map(Vec::len).sum();
    assert!(accepted > 1000, "only {accepted} accepted");
    assert!(refused > 50, "only {refused} refused");
    assert!(generator.projections.messages.len() > 100);
}

#[test]
fn gaps_and_duplicates_are_refused() {
    let mut p = Projections::default();
    let s = SessionId::parse("ses_a").expect("valid");
    let created = Event::SessionCreated {
        agent: "default".into(),
        model: None,
        title: None,
    };
    let at = |seq, event| Stored {
        seq: Seq(seq),
        time: Timestamp(0),
        event,
    };
    p.apply(&s, &at(0, created.clone())).expect("created");
    assert_eq!(
        p.apply(&s, &at(0, created)),
        Err(Violation::SessionExists(s.clone()))
    );
    let usage = Event::UsageRecorded {
        usage: Usage::default(),
    };
    assert!(matches!(
        p.apply(&s, &at(2, usage.clone())),
        Err(Violation::SeqGap {
            expected: Seq(1),
            got: Seq(2),
            ..
        })
    ));
    p.apply(&s, &at(1, usage)).expect("next seq accepted");
}
