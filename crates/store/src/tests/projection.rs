//! The projector through real redb tables: random event sequences appended one operation at a
//! time, refusals included, must leave the tables equal to the in-memory projections and to a
//! replay of the stored log.

use agenthost_model::testing::Generator;
use agenthost_model::{Event, Stored, Timestamp};
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
