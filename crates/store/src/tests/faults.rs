//! Storage faults, injected through the fault-injecting backend: a full disk refuses writes and
//! they resume by themselves once there is space; a failed sync or write stops writes until a
//! restart; a failed read is an error, never a panic. Whatever happens, nothing is acknowledged
//! that is not durable, and a restart finds every acknowledged write and nothing else.

use std::sync::Arc;

use super::*;
use crate::faults::{Fault, Faults};
use crate::{Error, Health};

fn open_faulty(dir: &std::path::Path, faults: &Arc<Faults>) -> RedbStore {
    let mut config = Config::new(dir.join("store.redb"));
    config.fold_rows = 5;
    config.faults = Some(faults.clone());
    RedbStore::open(config).expect("store opens")
}

/// Admits `ids` in order; returns the ids acknowledged and the errors of the others.
async fn admit_each(
    store: &RedbStore,
    s: &SessionId,
    ids: &[&str],
) -> (Vec<MessageId>, Vec<Error>) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for id in ids {
        match store.admit(admission(s, &mid(id), "work")).await {
            Ok(receipt) => ok.push(receipt.id),
            Err(e) => failed.push(e),
        }
    }
    (ok, failed)
}

/// After a restart without faults: every acknowledged admission is there, nothing `refused`
/// is, and an admission `in_doubt` (its sync failed: the kernel may have written it anyway) is
/// either absent or whole, and an exact retry of it gets its receipt.
async fn assert_after_restart(
    dir: &std::path::Path,
    s: &SessionId,
    acknowledged: &[MessageId],
    refused: &[&str],
    in_doubt: &[&str],
) {
    let store = open(dir);
    let snap = store.snapshot().expect("snapshot");
    for id in acknowledged {
        assert!(
            snap.index(id).expect("index").is_some(),
            "acknowledged {id} lost"
        );
    }
    for id in refused {
        assert!(
            snap.index(&mid(id)).expect("index").is_none(),
            "refused {id} was written"
        );
    }
    drop(snap);
    assert_replay_equal(&store);
    for id in in_doubt {
        store
            .admit(admission(s, &mid(id), "work"))
            .await
            .expect("a retry of an input in doubt is answered");
    }
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(s)
        .expect("read")
        .expect("row");
    assert_eq!(row.pending as usize, acknowledged.len() + in_doubt.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_then_they_resume_by_themselves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let store = open_faulty(dir.path(), &faults);
    let s = sid("full");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    let (mut acknowledged, failed) = admit_each(&store, &s, &["a1", "a2", "a3"]).await;
    assert!(failed.is_empty());

    faults.fail_writes(Fault::NoSpace);
    let (ok, failed) = admit_each(&store, &s, &["f1", "f2", "f3"]).await;
    assert!(ok.is_empty(), "acknowledged on a full disk: {ok:?}");
    assert_eq!(failed.len(), 3);
    for e in &failed {
        assert!(matches!(e, Error::DiskFull(_)), "{e:?}");
        assert!(e.to_string().contains("disk is full"), "{e}");
    }
    assert!(
        matches!(store.health(), Health::DiskFull(_)),
        "{:?}",
        store.health()
    );
    // Reads go on.
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read")
        .expect("row");
    assert_eq!(row.pending, 3);

    // Space is back: the next write reopens the database and commits, without a restart.
    faults.clear();
    let (ok, failed) = admit_each(&store, &s, &["b1", "b2"]).await;
    assert!(failed.is_empty(), "{failed:?}");
    acknowledged.extend(ok);
    assert_eq!(store.health(), Health::Ok);
    store.close();
    drop(store);
    assert_after_restart(dir.path(), &s, &acknowledged, &["f1", "f2", "f3"], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_stops_writes_until_a_restart() {
    for fault in [Fault::Io, Fault::NoSpace] {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Arc::new(Faults::default());
        let store = open_faulty(dir.path(), &faults);
        let s = sid("sync");
        store
            .create_session(new_session(&s))
            .await
            .expect("created");
        let (acknowledged, _) = admit_each(&store, &s, &["a1", "a2"]).await;
        assert_eq!(acknowledged.len(), 2);

        faults.fail_syncs(fault);
        let (ok, failed) = admit_each(&store, &s, &["f1"]).await;
        assert!(ok.is_empty(), "acknowledged without a sync: {ok:?}");
        assert!(matches!(failed[0], Error::Io(_)), "{:?}", failed[0]);
        assert!(
            matches!(store.health(), Health::Failed(_)),
            "{:?}",
            store.health()
        );
        // The disk works again, but a failed sync may have lost pages: no more writes until a
        // restart.
        faults.clear();
        let (ok, failed) = admit_each(&store, &s, &["f2"]).await;
        assert!(ok.is_empty());
        assert!(matches!(failed[0], Error::Stopped(_)), "{:?}", failed[0]);
        assert!(failed[0].to_string().contains("restart"), "{}", failed[0]);
        // Reads go on where they can.
        if let Ok(snap) = store.snapshot() {
            let _ = snap.session(&s);
        }
        store.close();
        drop(store);
        assert_after_restart(dir.path(), &s, &acknowledged, &["f2"], &["f1"]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_stops_writes_and_a_failed_read_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let store = open_faulty(dir.path(), &faults);
    let s = sid("eio");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    let (acknowledged, _) = admit_each(&store, &s, &["a1"]).await;
    faults.fail_writes(Fault::Io);
    let (ok, failed) = admit_each(&store, &s, &["f1"]).await;
    assert!(ok.is_empty());
    assert!(failed[0].is_io(), "{:?}", failed[0]);
    assert!(matches!(store.health(), Health::Failed(_)));
    faults.clear();
    // A read that fails is an error, never a panic or a wrong answer (pages redb cached may
    // still answer, and then with the truth).
    let truth = store
        .snapshot()
        .expect("snapshot")
        .events(&s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events");
    faults.fail_reads(Fault::Io);
    match store
        .snapshot()
        .and_then(|snap| snap.events(&s, agenthost_model::Seq::ZERO, usize::MAX))
    {
        Ok(events) => assert_eq!(events, truth),
        Err(e) => assert!(e.is_io(), "{e:?}"),
    }
    faults.clear();
    store.close();
    drop(store);
    assert_after_restart(dir.path(), &s, &acknowledged, &["f1"], &[]).await;
}
