//! The log against a plain map: random appends of runs into the front, new generations and
//! folds (into the middle, or merges into the base, with the middle's bound drawn too; done in
//! one transaction, or prepared from a snapshot while appends go on and applied later), and
//! after each, every way of reading (a session from any seq, one event, everything) gives
//! exactly what the map holds.

use std::collections::BTreeMap;

use proptest::prelude::*;
use redb::{Database, ReadableDatabase as _};

use super::fold::{Prepared, apply, fold_within, prepare_within};
use super::{ReadLog, generations};
use crate::codec;
use crate::tables::{EVENTS, EVENTS_FRONT, EVENTS_MIDDLE};

#[derive(Debug, Clone)]
enum Op {
    /// A run of `sizes.len()` events of session `session`, of these sizes.
    Append {
        session: usize,
        sizes: Vec<usize>,
    },
    NextGeneration,
    Fold,
    /// Freezes the front's generations so far and prepares their fold from a snapshot, as the
    /// writer's folder does; later appends go to new generations.
    Prepare,
    /// Applies the prepared fold, if there is one, as the commit that carries it does.
    Apply,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..SESSIONS.len(), prop::collection::vec(prop_oneof![3 => 1usize..64, 1 => 4_000usize..9_000], 1..6))
            .prop_map(|(session, sizes)| Op::Append { session, sizes }),
        2 => Just(Op::NextGeneration),
        1 => Just(Op::Fold),
        1 => Just(Op::Prepare),
        1 => Just(Op::Apply),
    ]
}

/// Short ids, and long ones that share their first 16 bytes or more (one is a prefix of
/// another), as minted ids do.
const SESSIONS: [&str; 6] = [
    "ses_a",
    "ses_b",
    "ses_c",
    "ses_01KBX7Q2M4ZT9",
    "ses_01KBX7Q2M4ZT9R0",
    "ses_01KBX7Q2M4ZT9QZ",
];

/// The record of `session`'s event `seq`, `size` bytes long.
fn record(session: &str, seq: u64, size: usize) -> Vec<u8> {
    let mut bytes = format!("{session}/{seq}:").into_bytes();
    bytes.resize(size.max(bytes.len()), b'.');
    bytes
}

/// Reads everything every way and compares with `model`.
fn check(db: &Database, model: &BTreeMap<&'static str, Vec<Vec<u8>>>) -> Result<(), TestCaseError> {
    let txn = db.begin_read().expect("read");
    let log = ReadLog::open(&txn).expect("log");
    for (session, events) in model {
        for from in 0..=events.len() as u64 {
            let mut read = Vec::new();
            log.for_each(session, from, |seq, bytes| {
                read.push((seq, bytes.to_vec()));
                Ok(true)
            })
            .expect("for_each");
            let expected: Vec<(u64, Vec<u8>)> = (from..)
                .zip(events[from as usize..].iter().cloned())
                .collect();
            prop_assert_eq!(read, expected, "{} from {}", session, from);
        }
        for (seq, event) in events.iter().enumerate() {
            let found = log.find(session, seq as u64).expect("find");
            prop_assert_eq!(found.as_ref(), Some(event), "{} at {}", session, seq);
        }
        let past = log.find(session, events.len() as u64).expect("find");
        prop_assert!(past.is_none());
    }
    let mut all: BTreeMap<String, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    log.for_all(|session, seq, bytes| {
        all.entry(session.to_owned())
            .or_default()
            .push((seq, bytes.to_vec()));
        Ok(())
    })
    .expect("for_all");
    for (session, events) in model {
        let listed = all.remove(*session).unwrap_or_default();
        prop_assert_eq!(listed.len(), events.len(), "{}", session);
        for (n, (seq, bytes)) in listed.iter().enumerate() {
            prop_assert_eq!(*seq, n as u64);
            prop_assert_eq!(bytes, &events[n]);
        }
    }
    prop_assert!(all.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_read_matches_a_plain_map(
        ops in prop::collection::vec(op(), 1..40),
        most_epochs in 0usize..4,
        // A prepared fold's bound in bytes: mostly none, else small enough that some folds are
        // left to the commit.
        most_bytes in prop_oneof![3 => Just(usize::MAX), 1 => 1usize..20_000],
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(dir.path().join("log.redb")).expect("db");
        {
            let txn = db.begin_write().expect("write");
            txn.open_table(EVENTS).expect("base");
            txn.open_table(EVENTS_FRONT).expect("front");
            txn.open_table(EVENTS_MIDDLE).expect("middle");
            txn.commit().expect("commit");
        }
        let mut model: BTreeMap<&'static str, Vec<Vec<u8>>> = BTreeMap::new();
        let mut generation = 0u64;
        let mut prepared: Option<Prepared> = None;
        for op in ops {
            if let Op::Prepare = op {
                if prepared.is_none() {
                    let upto = generation;
                    generation += 1;
                    let txn = db.begin_read().expect("read");
                    prepared = Some(prepare_within(&txn, upto, most_epochs, most_bytes).expect("prepare"));
                }
                continue;
            }
            let txn = db.begin_write().expect("write");
            match op {
                Op::Append { session, sizes } => {
                    let name = SESSIONS[session];
                    let events = model.entry(name).or_default();
                    let first = events.len() as u64;
                    let records: Vec<Vec<u8>> = sizes
                        .iter()
                        .enumerate()
                        .map(|(i, size)| record(name, first + i as u64, *size))
                        .collect();
                    let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                    let mut front = txn.open_table(EVENTS_FRONT).expect("front");
                    front
                        .insert((generation, name, first), codec::run(&slices).as_slice())
                        .expect("insert");
                    events.extend(records);
                }
                Op::NextGeneration => generation += 1,
                // The writer folds once at a time: a prepared fold goes first.
                Op::Fold | Op::Apply => match prepared.take() {
                    Some(Prepared::Runs(runs)) => {
                        apply(&txn, &runs).expect("apply");
                    }
                    Some(Prepared::InCommit) => {
                        fold_within(&txn, most_epochs).expect("fold");
                        generation += 1;
                    }
                    None if matches!(op, Op::Fold) => {
                        fold_within(&txn, most_epochs).expect("fold");
                        generation += 1;
                    }
                    None => {}
                },
                Op::Prepare => unreachable!("prepared above"),
            }
            txn.commit().expect("commit");
            check(&db, &model)?;
        }
        // The middle never holds more than its bound; a merge leaves everything in the base,
        // still read the same.
        {
            let txn = db.begin_read().expect("read");
            let middle = txn.open_table(EVENTS_MIDDLE).expect("middle");
            prop_assert!(generations(&middle).expect("epochs").len() <= most_epochs);
        }
        let txn = db.begin_write().expect("write");
        fold_within(&txn, 0).expect("merge");
        txn.commit().expect("commit");
        check(&db, &model)?;
        let txn = db.begin_read().expect("read");
        for table in [EVENTS_FRONT, EVENTS_MIDDLE] {
            let table = txn.open_table(table).expect("table");
            prop_assert!(generations(&table).expect("generations").is_empty());
        }
    }
}

proptest! {
    /// Batches placed as the writer places them, folding when the front says so: generations
    /// only grow; a large batch has a generation to itself, new, so its keys are above every
    /// row the front holds; and a fold's worth of generations stays bounded.
    #[test]
    fn the_front_places_large_batches_in_generations_of_their_own(
        fold_rows in 1usize..2_000,
        batches in prop::collection::vec(prop_oneof![2 => 0usize..40, 1 => 0usize..600], 1..300),
    ) {
        let mut front = super::Front::new(fold_rows);
        // Generations used since the last fold, with the batches in each.
        let mut used: BTreeMap<u64, usize> = BTreeMap::new();
        let mut newest: Option<u64> = None;
        let mut own_before = false;
        for added in batches {
            let fold = front.due();
            if fold {
                used.clear();
            }
            let generation = front.place(fold, added);
            if added == 0 {
                continue;
            }
            prop_assert!(newest.is_none_or(|n| generation >= n));
            let own = added >= front.own_rows;
            if own || own_before {
                prop_assert!(!used.contains_key(&generation), "a large batch shares a generation");
            }
            *used.entry(generation).or_default() += 1;
            prop_assert!(used.len() <= super::FOLD_GENERATIONS);
            newest = Some(generation);
            own_before = own;
        }
    }
}

proptest! {
    /// Freezing the front for a prepared fold: every batch placed after it goes to a generation
    /// above the frozen ones, generations only grow, and a thaw counts the frozen events again,
    /// so that the front is as due as it was before the freeze.
    #[test]
    fn batches_after_a_freeze_go_above_it(
        fold_rows in 1usize..2_000,
        steps in prop::collection::vec(prop_oneof![4 => (0usize..600).prop_map(Some), 1 => Just(None)], 1..200),
    ) {
        let mut front = super::Front::new(fold_rows);
        let mut newest = 0;
        let mut frozen: Option<super::Frozen> = None;
        for step in steps {
            match step {
                Some(added) => {
                    let generation = front.place(false, added);
                    prop_assert!(generation >= newest);
                    if let Some(frozen) = frozen {
                        prop_assert!(generation > frozen.upto);
                    }
                    newest = generation;
                }
                None => match frozen.take() {
                    Some(earlier) => {
                        let due = front.due();
                        front.thaw(earlier);
                        prop_assert!(front.due() || !due);
                    }
                    None => {
                        let due = front.due();
                        let mut copy = front;
                        let ice = front.freeze();
                        prop_assert!(ice.upto >= newest);
                        copy.freeze();
                        copy.thaw(ice);
                        prop_assert_eq!(copy.due(), due);
                        frozen = Some(ice);
                    }
                },
            }
        }
    }
}
