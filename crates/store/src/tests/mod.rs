//! Tests of the store against the model: admission and promotion against a reference model,
//! the projector through real tables, concurrency, crashes, the on-disk format and bad input.

mod admission;
mod conformance;
mod crash;
mod faults;
mod golden;
mod pipeline;
mod postgres;
mod projection;
mod readonly;

use std::sync::Arc;

use agenthost_model::message::Claim;
use agenthost_model::{Delivery, MessageId, Prompt, Seq, SessionId, SessionRow, Timestamp, Usage};

use crate::{Admission, Config, NewSession, RedbStore, Store};

pub(crate) fn sid(s: &str) -> SessionId {
    SessionId::parse(&format!("ses_{s}")).expect("valid session id")
}

pub(crate) fn mid(s: &str) -> MessageId {
    MessageId::parse(&format!("msg_{s}")).expect("valid message id")
}

/// A store in `dir` with a pinned clock, so contents are deterministic, and a front that folds
/// every few rows, so every test reads and rewrites rows in both tiers and across generations.
pub(crate) fn open(dir: &std::path::Path) -> RedbStore {
    let mut config = Config::new(dir.join("store.redb"));
    config.clock = Arc::new(|| Timestamp(1_700_000_000_000));
    config.fold_rows = 5;
    RedbStore::open(config).expect("store opens")
}

/// A session row with `pending` inputs and the given claim, for tests that build store values
/// directly.
pub(crate) fn session_row(id: &str, pending: u32, claim: Option<Claim>) -> SessionRow {
    SessionRow {
        id: SessionId::parse(id).expect("id"),
        agent: "default".into(),
        model: None,
        title: None,
        created: Timestamp(1),
        updated: Timestamp(2),
        last_seq: Seq(3),
        usage: Usage::default(),
        claim,
        resume_attempts: 0,
        halted: None,
        active_from: Seq::ZERO,
        compaction: None,
        pending,
        budget: Default::default(),
        blocked: None,
    }
}

pub(crate) fn new_session(id: &SessionId) -> NewSession {
    NewSession {
        id: id.clone(),
        agent: "default".into(),
        model: None,
        title: None,
    }
}

pub(crate) fn admission(session: &SessionId, id: &MessageId, text: &str) -> Admission {
    Admission {
        session: session.clone(),
        id: id.clone(),
        prompt: Prompt::text(text),
        delivery: Delivery::Steer,
        wake: true,
    }
}

/// Everything a store holds, as comparable values.
pub(crate) fn contents(store: &RedbStore) -> (agenthost_model::Projections, String) {
    let snap = store.redb_snapshot().expect("snapshot");
    let projections = snap.projections().expect("projections");
    let logs = format!("{:?}", snap.logs().expect("logs"));
    (projections, logs)
}

/// Asserts the store's projections equal a replay of its own log.
pub(crate) fn assert_replay_equal(store: &RedbStore) {
    // Through the trait, session by session, as any backend is verified.
    let verified = crate::verify(&*store.snapshot().expect("snapshot")).expect("readable");
    assert!(verified.ok(), "{:#?}", verified.differences);
    // And the whole store at once, orphan rows included.
    let snap = store.redb_snapshot().expect("snapshot");
    let logs = snap.logs().expect("logs");
    for log in logs.values() {
        for (i, stored) in log.iter().enumerate() {
            assert_eq!(stored.seq.0, i as u64, "seqs are gap-free");
        }
    }
    let replayed =
        agenthost_model::Projections::replay(logs.iter().map(|(s, l)| (s, l.as_slice())))
            .expect("the log replays");
    assert_eq!(snap.projections().expect("projections"), replayed);
}
