//! Admission and promotion: a model-based test against a small reference, the
//! concurrent-retry law, and bad input that must change nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use agenthost_model::promotion::Boundary;
use agenthost_model::{Delivery, Event, Message, MessageId, Prompt, Seq, SessionId, Usage};
use proptest::prelude::*;

use super::*;
use crate::{Error, Receipt};

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Prompt {
        session: u8,
        id: Option<u8>,
        text: u8,
        queue: bool,
    },
    Promote {
        session: u8,
        idle: bool,
    },
    Assistant {
        session: u8,
        id: u8,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..3).prop_map(Op::Create),
        6 => (0u8..4, proptest::option::of(0u8..8), 0u8..3, any::<bool>())
            .prop_map(|(session, id, text, queue)| Op::Prompt { session, id, text, queue }),
        3 => (0u8..3, any::<bool>()).prop_map(|(session, idle)| Op::Promote { session, idle }),
        1 => (0u8..3, 0u8..8).prop_map(|(session, id)| Op::Assistant { session, id }),
        1 => Just(Op::Reopen),
    ]
}

/// What one input is, in the reference.
#[derive(Debug, Clone)]
struct Input {
    session: SessionId,
    prompt: Prompt,
    delivery: Delivery,
    admitted_seq: u64,
    promoted_seq: Option<u64>,
}

#[derive(Debug, Default)]
struct Reference {
    next_seq: BTreeMap<SessionId, u64>,
    /// Every id in use: inputs, and `None` for assistant messages.
    ids: BTreeMap<MessageId, Option<Input>>,
    /// Pending input ids per session, in admission order.
    pending: BTreeMap<SessionId, Vec<MessageId>>,
    /// Promoted input ids per session, in promotion order.
    promoted: BTreeMap<SessionId, Vec<MessageId>>,
}

impl Reference {
    fn seq(&mut self, s: &SessionId) -> u64 {
        let next = self.next_seq.get_mut(s).expect("session exists");
        *next += 1;
        *next - 1
    }

    fn receipt(&self, id: &MessageId) -> Receipt {
        let input = self.ids[id].as_ref().expect("an input");
        Receipt {
            id: id.clone(),
            session: input.session.clone(),
            admitted_seq: Seq(input.admitted_seq),
            delivery: input.delivery,
            promoted_seq: input.promoted_seq.map(Seq),
        }
    }

    /// The promotion rules written out independently of `model::promotion`.
    fn promote(&mut self, s: &SessionId, idle: bool) -> Vec<MessageId> {
        let pending = self.pending.get(s).cloned().unwrap_or_default();
        let delivery = |id: &MessageId| self.ids[id].as_ref().expect("input").delivery;
        let steers: Vec<MessageId> = pending
            .iter()
            .filter(|id| delivery(id) == Delivery::Steer)
            .cloned()
            .collect();
        let chosen = if !steers.is_empty() || !idle {
            steers
        } else {
            pending
                .iter()
                .find(|id| delivery(id) == Delivery::Queue)
                .cloned()
                .into_iter()
                .collect()
        };
        for id in &chosen {
            let seq = self.seq(s);
            self.ids
                .get_mut(id)
                .and_then(Option::as_mut)
                .expect("input")
                .promoted_seq = Some(seq);
            self.pending
                .get_mut(s)
                .expect("pending")
                .retain(|p| p != id);
            self.promoted.entry(s.clone()).or_default().push(id.clone());
        }
        chosen
    }
}

async fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(dir.path());
    let mut reference = Reference::default();
    let session = |n: u8| sid(&format!("s{n}"));
    let mut minted = 0;
    for op in ops {
        match op {
            Op::Create(n) => {
                let s = session(n);
                let row = store.create_session(new_session(&s)).await.expect("create");
                if reference.next_seq.contains_key(&s) {
                    assert_eq!(row.last_seq.0 + 1, reference.next_seq[&s]);
                } else {
                    reference.next_seq.insert(s.clone(), 1);
                }
            }
            Op::Prompt {
                session: n,
                id,
                text,
                queue,
            } => {
                let s = session(n);
                let id = match id {
                    Some(i) => mid(&format!("p{i}")),
                    None => {
                        minted += 1;
                        mid(&format!("auto{minted}"))
                    }
                };
                let delivery = if queue {
                    Delivery::Queue
                } else {
                    Delivery::Steer
                };
                let prompt = Prompt::text(format!("text {text}"));
                let a = Admission {
                    session: s.clone(),
                    id: id.clone(),
                    prompt: prompt.clone(),
                    delivery,
                    wake: true,
                };
                let got = store.admit(a).await;
                if !reference.next_seq.contains_key(&s) {
                    assert!(matches!(got, Err(Error::SessionNotFound(_))), "{got:?}");
                    continue;
                }
                match reference.ids.get(&id).cloned() {
                    None => {
                        let seq = reference.seq(&s);
                        reference.ids.insert(
                            id.clone(),
                            Some(Input {
                                session: s.clone(),
                                prompt,
                                delivery,
                                admitted_seq: seq,
                                promoted_seq: None,
                            }),
                        );
                        reference
                            .pending
                            .entry(s.clone())
                            .or_default()
                            .push(id.clone());
                        assert_eq!(got.expect("admitted"), reference.receipt(&id));
                    }
                    Some(Some(input))
                        if input.session == s
                            && input.prompt == prompt
                            && input.delivery == delivery =>
                    {
                        assert_eq!(got.expect("exact retry"), reference.receipt(&id));
                    }
                    Some(_) => assert!(matches!(got, Err(Error::PromptConflict { .. })), "{got:?}"),
                }
            }
            Op::Promote { session: n, idle } => {
                let s = session(n);
                let boundary = if idle {
                    Boundary::Idle
                } else {
                    Boundary::Continuation
                };
                let got = store.promote(s.clone(), boundary).await;
                if !reference.next_seq.contains_key(&s) {
                    assert!(matches!(got, Err(Error::SessionNotFound(_))), "{got:?}");
                    continue;
                }
                let want = reference.promote(&s, idle);
                let got: Vec<MessageId> = got
                    .expect("promote")
                    .into_iter()
                    .map(|stored| match stored.event {
                        Event::PromptPromoted { id } => id,
                        other => panic!("unexpected {other:?}"),
                    })
                    .collect();
                assert_eq!(got, want);
            }
            Op::Assistant { session: n, id } => {
                let s = session(n);
                let id = mid(&format!("p{id}"));
                let event = Event::StepStarted {
                    id: id.clone(),
                    step: 1,
                    agent: "a".into(),
                    model: "m".into(),
                };
                let got = store.append(s.clone(), vec![event]).await;
                match (
                    reference.next_seq.contains_key(&s),
                    reference.ids.contains_key(&id),
                ) {
                    (false, _) => assert!(matches!(got, Err(Error::SessionNotFound(_))), "{got:?}"),
                    (true, true) => assert!(matches!(got, Err(Error::Violation(_))), "{got:?}"),
                    (true, false) => {
                        reference.seq(&s);
                        reference.ids.insert(id, None);
                        got.expect("step started");
                    }
                }
            }
            Op::Reopen => {
                drop(store);
                store = open(dir.path());
            }
        }
        // After every operation the store's inbox and user messages match the reference.
        let snap = store.snapshot().expect("snapshot");
        for s in reference.next_seq.keys() {
            let pending: Vec<MessageId> = snap
                .pending(s)
                .expect("pending")
                .into_iter()
                .map(|r| r.id)
                .collect();
            assert_eq!(&pending, reference.pending.get(s).unwrap_or(&Vec::new()));
            let users: Vec<MessageId> = snap
                .messages(s, Seq::ZERO, usize::MAX)
                .expect("messages")
                .into_iter()
                .filter(|m| matches!(m, Message::User { .. }))
                .map(|m| m.id().clone())
                .collect();
            assert_eq!(&users, reference.promoted.get(s).unwrap_or(&Vec::new()));
        }
        // Recovery finds exactly the sessions with pending input, however stale the working
        // set is between folds.
        let with_pending: Vec<SessionId> = reference
            .pending
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(s, _)| s.clone())
            .collect();
        assert_eq!(snap.with_pending().expect("with pending"), with_pending);
    }
    assert_replay_equal(&store);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn admission_and_promotion_match_the_reference(ops in proptest::collection::vec(op(), 1..60)) {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(run(ops));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_retries_write_one_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(open(dir.path()));
    let s = sid("c");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = store.clone();
            let a = admission(&s, &mid("same"), "hello");
            tokio::spawn(async move { store.admit(a).await })
        })
        .collect();
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await.expect("joined").expect("admitted"));
    }
    assert!(
        receipts.iter().all(|r| *r == receipts[0]),
        "64 equal receipts"
    );
    let events = store
        .snapshot()
        .expect("snap")
        .events(&s, Seq::ZERO, usize::MAX)
        .expect("events");
    let admitted = events
        .iter()
        .filter(|e| matches!(e.event, Event::PromptAdmitted { .. }))
        .count();
    assert_eq!(admitted, 1);
    assert_eq!(receipts[0].admitted_seq, Seq(1));
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("store.redb"));
    config.prompt_limit = 64;
    let store = RedbStore::open(config).expect("opens");
    let (a, b) = (sid("a"), sid("b"));
    store.create_session(new_session(&a)).await.expect("a");
    store.create_session(new_session(&b)).await.expect("b");
    store
        .admit(admission(&a, &mid("taken"), "first"))
        .await
        .expect("admitted");
    let step = Event::StepStarted {
        id: mid("assistant"),
        step: 1,
        agent: "a".into(),
        model: "m".into(),
    };
    store.append(a.clone(), vec![step]).await.expect("step");
    let before = contents(&store);

    let empty = store.admit(admission(&a, &mid("x1"), "   ")).await;
    assert!(
        matches!(
            empty,
            Err(Error::Invalid(agenthost_model::Error::EmptyPrompt))
        ),
        "{empty:?}"
    );
    let big = store
        .admit(admission(&a, &mid("x2"), &"y".repeat(65)))
        .await;
    assert!(
        matches!(
            big,
            Err(Error::Invalid(agenthost_model::Error::PromptTooLarge {
                size: 65,
                limit: 64
            }))
        ),
        "{big:?}"
    );
    let unknown = store.admit(admission(&sid("nope"), &mid("x3"), "hi")).await;
    assert!(
        matches!(unknown, Err(Error::SessionNotFound(_))),
        "{unknown:?}"
    );
    let changed_text = store.admit(admission(&a, &mid("taken"), "second")).await;
    assert!(
        matches!(changed_text, Err(Error::PromptConflict { .. })),
        "{changed_text:?}"
    );
    let mut queued = admission(&a, &mid("taken"), "first");
    queued.delivery = Delivery::Queue;
    let changed_delivery = store.admit(queued).await;
    assert!(
        matches!(changed_delivery, Err(Error::PromptConflict { .. })),
        "{changed_delivery:?}"
    );
    let other_session = store.admit(admission(&b, &mid("taken"), "first")).await;
    assert!(
        matches!(other_session, Err(Error::PromptConflict { .. })),
        "{other_session:?}"
    );
    let message_id = store.admit(admission(&a, &mid("assistant"), "first")).await;
    assert!(
        matches!(message_id, Err(Error::PromptConflict { .. })),
        "{message_id:?}"
    );
    let unknown_promote = store.promote(sid("nope"), Boundary::Idle).await;
    assert!(
        matches!(unknown_promote, Err(Error::SessionNotFound(_))),
        "{unknown_promote:?}"
    );
    assert!(MessageId::parse("bad id").is_err());
    assert!("later".parse::<Delivery>().is_err());

    assert_eq!(contents(&store), before, "refused input changed the store");
}

/// A write's actions share one transaction: the drain's start (claim, then promotion) and its
/// end (settle only when nothing is pending) each cost one commit, and a refused action takes
/// the whole write back with it.
#[tokio::test]
async fn write_runs_its_actions_in_one_transaction() {
    use crate::Action;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let s = sid("w");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    store
        .admit(admission(&s, &mid("first"), "one"))
        .await
        .expect("admitted");

    let commits = store.stats().commits.get();
    let written = store
        .write(
            s.clone(),
            vec![
                Action::Append(Event::ExecutionStarted { forced: false }),
                Action::Promote(Boundary::Idle),
            ],
        )
        .await
        .expect("written");
    let kinds: Vec<_> = written.iter().map(|e| e.event.kind()).collect();
    assert_eq!(kinds, ["execution_started", "prompt_promoted"]);
    assert_eq!(store.stats().commits.get(), commits + 1);

    // Something is pending: no success is written, and nothing else either.
    store
        .admit(admission(&s, &mid("second"), "two"))
        .await
        .expect("admitted");
    let refused = store
        .write(s.clone(), vec![Action::SucceedIfIdle])
        .await
        .expect("written");
    assert!(refused.is_empty(), "{refused:?}");
    let promoted_and_settled = store
        .write(
            s.clone(),
            vec![Action::Promote(Boundary::Idle), Action::SucceedIfIdle],
        )
        .await
        .expect("written");
    let kinds: Vec<_> = promoted_and_settled
        .iter()
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(kinds, ["prompt_promoted", "execution_succeeded"]);
    let row = store.snapshot().unwrap().session(&s).unwrap().unwrap();
    assert!(row.claim.is_none(), "success releases the claim");

    // A refused action refuses the write: the promotion before it is not kept.
    store
        .admit(admission(&s, &mid("third"), "three"))
        .await
        .expect("admitted");
    let before = contents(&store);
    let bad = store
        .write(
            s.clone(),
            vec![
                Action::Promote(Boundary::Idle),
                Action::Append(Event::TextEnded {
                    id: mid("no_such_message"),
                    text: "x".into(),
                    incomplete: false,
                }),
            ],
        )
        .await;
    assert!(matches!(bad, Err(Error::Violation(_))), "{bad:?}");
    assert_eq!(
        contents(&store),
        before,
        "a refused write changed the store"
    );

    // Each promotion sees the ones before it in the same write: two idle boundaries promote
    // two queued inputs, one each, in admission order.
    for id in ["q1", "q2"] {
        let mut queued = admission(&s, &mid(id), id);
        queued.delivery = Delivery::Queue;
        store.admit(queued).await.expect("admitted");
    }
    let written = store
        .write(
            s.clone(),
            vec![
                Action::Promote(Boundary::Idle),
                Action::Promote(Boundary::Idle),
                Action::Promote(Boundary::Idle),
            ],
        )
        .await
        .expect("written");
    let promoted: Vec<_> = written
        .iter()
        .map(|e| match &e.event {
            Event::PromptPromoted { id } => id.as_str().to_owned(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(promoted, ["msg_third", "msg_q1", "msg_q2"]);
    assert_replay_equal(&store);
    // The test store folds every few rows: these writes went through folds, and were read back
    // across them.
    let stats = store.stats();
    assert!(stats.maintenance_runs.get() > 0);
    assert!(stats.maintenance_rows.get() > 0);
}

#[tokio::test]
async fn the_working_set_keeps_busy_sessions_and_sheds_idle_ones_at_folds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let (busy, done) = (sid("busy"), sid("done"));
    for s in [&busy, &done] {
        store.create_session(new_session(s)).await.expect("created");
    }
    store
        .admit(admission(&busy, &mid("b1"), "wait"))
        .await
        .expect("admitted");
    store
        .admit(admission(&done, &mid("d1"), "go"))
        .await
        .expect("admitted");
    store
        .promote(done.clone(), Boundary::Idle)
        .await
        .expect("promoted");
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(
        snap.with_pending().expect("pending"),
        std::slice::from_ref(&busy)
    );
    assert_eq!(snap.claimed().expect("claimed"), []);
    drop(snap);
    let listed = |store: RedbStore| {
        store.close();
        drop(store);
        let db = redb::Database::create(dir.path().join("store.redb")).expect("raw open");
        let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
        let table = txn.open_table(crate::tables::WORKING).expect("working");
        let keys: Vec<String> = redb::ReadableTable::iter(&table)
            .expect("iter")
            .map(|e| e.expect("entry").0.value().to_owned())
            .collect();
        keys
    };
    // Enough events to fold the front (every 5 rows in tests) prune the idle session.
    for i in 0..6 {
        store
            .append(
                busy.clone(),
                vec![Event::UsageRecorded {
                    usage: Usage::default(),
                }],
            )
            .await
            .unwrap_or_else(|e| panic!("append {i}: {e}"));
    }
    assert_eq!(listed(store), ["ses_busy"]);
    let store = open(dir.path());
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(
        snap.with_pending().expect("pending"),
        std::slice::from_ref(&busy)
    );
}

#[tokio::test]
async fn a_session_at_its_pending_limit_refuses_new_input_but_answers_retries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("store.redb"));
    config.pending_limit = 2;
    let store = RedbStore::open(config).expect("opens");
    let a = sid("a");
    store.create_session(new_session(&a)).await.expect("a");
    let first = store
        .admit(admission(&a, &mid("one"), "first"))
        .await
        .expect("one");
    store
        .admit(admission(&a, &mid("two"), "second"))
        .await
        .expect("two");
    let before = contents(&store);
    let full = store.admit(admission(&a, &mid("three"), "third")).await;
    assert!(
        matches!(full, Err(Error::Full { pending: 2, .. })),
        "{full:?}"
    );
    assert_eq!(
        contents(&store),
        before,
        "a refused admission writes nothing"
    );
    let retry = store
        .admit(admission(&a, &mid("one"), "first"))
        .await
        .expect("an exact retry is answered");
    assert_eq!(retry, first);
    // Promotion frees a place.
    store
        .promote(a.clone(), Boundary::Idle)
        .await
        .expect("promoted");
    store
        .admit(admission(&a, &mid("three"), "third"))
        .await
        .expect("room again");
}

/// Admissions queued behind pending input do not rewrite the session's record, up to
/// `record::MAX_TRAIL` of them (format 9); every reader, and the writer after a restart, sees the
/// record caught up with them.
#[tokio::test]
async fn queued_admissions_trail_the_stored_record_and_every_reader_catches_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let s = sid("queue");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    let queued = 40u64;
    for i in 0..queued {
        store
            .admit(admission(&s, &mid(&format!("q{i}")), "later"))
            .await
            .expect("admitted");
    }
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read");
    let row = row.expect("the session");
    assert_eq!((row.last_seq, row.pending), (Seq(queued), queued as u32));
    assert_replay_equal(&store);

    // The stored record trails the log, by at most the bound.
    store.close();
    drop(store);
    {
        let db = redb::Database::create(dir.path().join("store.redb")).expect("raw open");
        let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
        let table = txn.open_table(crate::tables::SESSIONS).expect("sessions");
        let value = redb::ReadableTable::get(&table, s.as_str()).expect("get");
        let stored: crate::record::SessionRecord =
            crate::codec::decode("session record", value.expect("stored").value())
                .expect("decodes");
        let trail = queued - stored.row.last_seq.0;
        assert!(trail > 0, "the record trails its log");
        assert!(
            trail <= u64::from(crate::record::MAX_TRAIL),
            "by at most the bound: {trail}"
        );
    }

    // After a restart the writer reads the record caught up too: more input, then promotions.
    let store = open(dir.path());
    store
        .admit(admission(&s, &mid("after"), "more"))
        .await
        .expect("admitted");
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read");
    assert_eq!(row.expect("the session").pending, queued as u32 + 1);
    store
        .promote(s.clone(), Boundary::Idle)
        .await
        .expect("promoted");
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read");
    assert_eq!(row.expect("the session").pending, 0);
    assert_replay_equal(&store);
}

/// A reader that kept the rows of inputs it admitted gives them to the read of a session's
/// pending inputs, which reads only the others from the log; debug builds check each row given
/// against the log.
#[tokio::test]
async fn pending_inputs_come_from_the_rows_a_reader_kept_where_it_has_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let s = sid("known");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    for (id, text) in [("one", "first"), ("two", "second"), ("three", "third")] {
        store
            .admit(admission(&s, &mid(id), text))
            .await
            .expect("admitted");
    }
    let snap = store.snapshot().expect("snapshot");
    let (row, inputs) = snap.session_and_pending(&s).expect("read").expect("exists");
    assert_eq!(inputs.len(), 3);
    let kept = inputs[1].clone();
    let mut asked = Vec::new();
    let (known_row, known_inputs) = snap
        .session_and_pending_known(&s, &mut |seq| {
            asked.push(seq);
            (seq == kept.admitted_seq).then(|| kept.clone())
        })
        .expect("read")
        .expect("exists");
    assert_eq!((known_row, known_inputs), (row, inputs.clone()));
    let seqs: Vec<Seq> = inputs.iter().map(|input| input.admitted_seq).collect();
    assert_eq!(
        asked, seqs,
        "each pending input is asked for once, in order"
    );
}

/// A row given for a pending input that is not what the log holds is a bug in the reader that
/// kept it: debug builds stop there.
#[cfg(debug_assertions)]
#[tokio::test]
#[should_panic(expected = "a known input differs from the log")]
async fn a_kept_row_that_differs_from_the_log_is_caught_in_debug_builds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let s = sid("wrong");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    store
        .admit(admission(&s, &mid("one"), "first"))
        .await
        .expect("admitted");
    let snap = store.snapshot().expect("snapshot");
    let (_, inputs) = snap.session_and_pending(&s).expect("read").expect("exists");
    let mut wrong = inputs[0].clone();
    wrong.wake = !wrong.wake;
    let _ = snap.session_and_pending_known(&s, &mut |_| Some(wrong.clone()));
}
