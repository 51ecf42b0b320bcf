//! The projector through real redb tables: random event sequences appended one operation at a
//! time, refusals included, must leave the tables equal to the in-memory projections and to a
//! replay of the stored log.

use agenthost_model::testing::Generator;
use agenthost_model::{Event, Seq, Stored, Timestamp};
use proptest::prelude::*;

use super::*;

async fn run(ops: Vec<(u8, u8)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let mut generator = Generator::default();
    for (action, pick) in ops {
        let (session, event) = generator.event(action, pick);
        let stored = Stored {
            seq: generator.next_seq(&session),
            time: Timestamp(1_700_000_000_000),
            event: event.clone(),
        };
        let accepted = generator.projections.apply(&session, &stored).is_ok();
        match event {
            Event::SessionCreated {
                agent,
                model,
                title,
            } => {
                let new = NewSession {
                    id: session.clone(),
                    agent,
                    model,
                    title,
                };
                let before = generator.projections.sessions.get(&session).cloned();
                let row = store
                    .create_session(new)
                    .await
                    .expect("create is idempotent");
                if let Some(before) = before.filter(|_| !accepted) {
                    assert_eq!(
                        row.last_seq, before.last_seq,
                        "an existing session is returned"
                    );
                }
            }
            event => {
                let result = store.append(session.clone(), vec![event]).await;
                assert_eq!(
                    result.is_ok(),
                    accepted,
                    "store and model disagree: {result:?}"
                );
                if let Ok(written) = result {
                    assert_eq!(written, vec![stored]);
                }
            }
        }
    }
    let (projections, _) = contents(&store);
    assert_eq!(projections, generator.projections);
    assert_replay_equal(&store);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn store_projections_equal_model_and_replay(
        ops in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..120)
    ) {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(run(ops));
    }
}

#[tokio::test]
async fn a_multi_event_append_is_all_or_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let s = sid("atomic");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    let before = contents(&store);
    let valid = Event::ExecutionStarted { forced: false };
    let invalid = Event::PromptPromoted { id: mid("nothing") };
    let err = store
        .append(s.clone(), vec![valid, invalid])
        .await
        .expect_err("refused");
    assert!(matches!(err, crate::Error::Violation(_)), "{err}");
    assert_eq!(
        contents(&store),
        before,
        "nothing of the refused append is visible"
    );
}

/// Writes of several events at once become runs, and folds join runs; every read of a range of
/// the log, from any seq and with any limit, still sees exactly the events in seq order.
async fn ranges(writes: Vec<(bool, u8)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let sessions = [sid("left"), sid("right")];
    for s in &sessions {
        store.create_session(new_session(s)).await.expect("created");
    }
    let usage = |n: u64| agenthost_model::Usage {
        input: n,
        ..Default::default()
    };
    let mut next = 0;
    let pending: Vec<_> = writes
        .into_iter()
        .map(|(right, count)| {
            let events = (0..count)
                .map(|_| {
                    next += 1;
                    Event::UsageRecorded { usage: usage(next) }
                })
                .collect();
            store.append(sessions[usize::from(right)].clone(), events)
        })
        .collect();
    // Sent together, so that several writes share a transaction.
    for written in futures::future::join_all(pending).await {
        written.expect("appended");
    }
    let snap = store.snapshot().expect("snapshot");
    for s in &sessions {
        let all = snap.events(s, Seq::ZERO, usize::MAX).expect("events");
        let seqs: Vec<u64> = all.iter().map(|e| e.seq.0).collect();
        assert_eq!(seqs, (0..all.len() as u64).collect::<Vec<_>>(), "{s}");
        for from in 0..=all.len() {
            for limit in 0..4 {
                let got = snap.events(s, Seq(from as u64), limit).expect("range");
                let want: Vec<_> = all.iter().skip(from).take(limit).cloned().collect();
                assert_eq!(got, want, "{s} from {from} limit {limit}");
            }
        }
    }
    assert_replay_equal(&store);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn any_range_of_the_log_reads_back_across_runs_and_folds(
        writes in proptest::collection::vec((any::<bool>(), 1u8..6), 1..30)
    ) {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(ranges(writes));
    }
}
