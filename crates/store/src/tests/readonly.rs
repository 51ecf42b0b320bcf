//! Read-only opening and verification through the trait: what `agenthost inspect` relies on.

use std::path::Path;

use redb::ReadableTable as _;

use super::*;
use crate::{Error, FORMAT_VERSION, ReadOnlyStore, tables};

/// The golden scenario's store, closed, in `dir`.
async fn closed_store(dir: &Path) -> std::path::PathBuf {
    let store = open(dir);
    super::golden::scenario(&store).await;
    store.close();
    dir.join("store.redb")
}

#[tokio::test]
async fn a_read_only_open_reads_and_verifies_without_writing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path()).await;
    let before = std::fs::read(&path).expect("bytes");
    let store = ReadOnlyStore::open(&path).expect("opens read-only");
    let verified = crate::verify(&*store.snapshot().expect("snapshot")).expect("readable");
    assert!(verified.ok(), "{:#?}", verified.differences);
    assert_eq!(verified.sessions, 1);
    assert!(verified.events > 5);
    drop(store);
    assert!(
        std::fs::read(&path).expect("bytes") == before,
        "a read-only open wrote"
    );
}

/// A new store that never wrote a row has every table all the same: the store creates them when
/// it opens, not when a batch writes to them, and its readers (a read-only one too) find them.
#[test]
fn a_store_that_never_wrote_has_every_table() {
    use redb::ReadableDatabase as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    store.close();
    drop(store);
    let path = dir.path().join("store.redb");
    {
        let db = redb::Database::open(&path).expect("raw open");
        let txn = db.begin_read().expect("txn");
        let names: Vec<String> = (txn.list_tables().expect("tables"))
            .map(|t| redb::TableHandle::name(&t).to_owned())
            .collect();
        for table in [
            "meta",
            "events",
            "events_front",
            "events_middle",
            "sessions",
            "sessions_by_created",
            "working",
            "messages",
            "message_index",
            "instructions",
            "schedules",
        ] {
            assert!(
                names.iter().any(|n| n == table),
                "{table} missing: {names:?}"
            );
        }
    }
    let store = ReadOnlyStore::open(&path).expect("opens read-only");
    let snap = store.snapshot().expect("snapshot");
    assert!(snap.sessions(None, 10).expect("sessions").is_empty());
    assert!(snap.all_schedules().expect("schedules").is_empty());
    let s = sid("none");
    assert!(
        snap.messages(&s, Seq::ZERO, 10)
            .expect("messages")
            .is_empty()
    );
    assert!(snap.events(&s, Seq::ZERO, 10).expect("events").is_empty());
    assert!(crate::verify(&*snap).expect("readable").ok());
}

/// A store of a format before 6 has no schedules table, and one before 8 no middle tier of the
/// log; a read-only open creates neither: it reads as a store without schedules, its whole log
/// (verified against its projections), and writes nothing.
#[test]
fn a_read_only_open_of_an_older_format_reads_what_it_has() {
    for version in [5, 7] {
        let (_dir, path) = super::golden::golden_copy(version);
        let before = std::fs::read(&path).expect("bytes");
        let store = ReadOnlyStore::open(&path).expect("opens read-only");
        let snap = store.snapshot().expect("snapshot");
        if version < 6 {
            assert_eq!(snap.schedules(&sid("golden")).expect("schedules"), []);
            assert_eq!(snap.all_schedules().expect("all schedules"), []);
        }
        let events = snap
            .events(&sid("golden"), Seq(1), usize::MAX)
            .expect("events");
        assert!(!events.is_empty(), "format {version}");
        let verified = crate::verify(&*snap).expect("readable");
        assert!(verified.ok(), "{:#?}", verified.differences);
        drop(snap);
        drop(store);
        assert!(
            std::fs::read(&path).expect("bytes") == before,
            "a read-only open of format {version} wrote"
        );
    }
}

#[tokio::test]
async fn a_store_held_by_a_writer_is_refused_as_locked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let err = ReadOnlyStore::open(&dir.path().join("store.redb")).expect_err("locked");
    assert!(matches!(err, Error::Locked), "{err:?}");
    store.close();
}

#[tokio::test]
async fn another_version_or_another_file_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path()).await;
    {
        let db = redb::Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("txn");
        {
            let mut meta = txn.open_table(tables::META).expect("meta");
            meta.insert(
                tables::FORMAT_KEY,
                (FORMAT_VERSION + 1).to_le_bytes().as_slice(),
            )
            .expect("insert");
        }
        txn.commit().expect("commit");
    }
    let err = ReadOnlyStore::open(&path).expect_err("refused");
    assert!(matches!(err, Error::FormatVersion { .. }), "{err:?}");
    // A redb file that is not an agenthost store.
    let other = dir.path().join("other.redb");
    drop(redb::Database::create(&other).expect("empty redb"));
    let err = ReadOnlyStore::open(&other).expect_err("refused");
    assert!(err.to_string().contains("not an agenthost store"), "{err}");
    // Not a redb file at all.
    let garbage = dir.path().join("garbage.redb");
    std::fs::write(&garbage, vec![0x5a; 8192]).expect("garbage");
    let err = ReadOnlyStore::open(&garbage).expect_err("refused");
    assert!(matches!(err, Error::Storage(_)), "{err:?}");
}

#[tokio::test]
async fn verification_names_what_differs_from_a_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path()).await;
    // Damage a projection behind the store's back: drop one message row.
    {
        let db = redb::Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("txn");
        {
            let mut messages = txn.open_table(tables::MESSAGES).expect("messages");
            let key = {
                let mut rows = messages.iter().expect("iter");
                let (key, _) = rows.next().expect("a message").expect("row");
                let (session, seq) = key.value();
                (session.to_owned(), seq)
            };
            messages.remove((key.0.as_str(), key.1)).expect("removed");
        }
        txn.commit().expect("commit");
    }
    let store = ReadOnlyStore::open(&path).expect("opens");
    let snap = store.snapshot().expect("snapshot");
    let verified = crate::verify(&*snap).expect("readable");
    assert!(!verified.ok());
    assert!(
        verified
            .differences
            .iter()
            .any(|d| d.contains("messages differ")),
        "{:#?}",
        verified.differences
    );
    // Reading the damaged store still works.
    assert!(snap.session(&sid("golden")).expect("read").is_some());
}

#[tokio::test]
async fn verification_compares_each_sessions_schedules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = closed_store(dir.path()).await;
    {
        let store = ReadOnlyStore::open(&path).expect("opens");
        let snap = store.snapshot().expect("snapshot");
        let all = snap.all_schedules().expect("all schedules");
        assert_eq!(all.len(), 1, "the golden scenario keeps one schedule");
        assert_eq!(snap.schedules(&sid("golden")).expect("schedules").len(), 1);
    }
    // Damage the projection behind the store's back: drop the schedule row.
    {
        let db = redb::Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("txn");
        {
            let mut schedules = txn.open_table(tables::SCHEDULES).expect("schedules");
            schedules.retain(|_, _| false).expect("removed");
        }
        txn.commit().expect("commit");
    }
    let store = ReadOnlyStore::open(&path).expect("opens");
    let verified = crate::verify(&*store.snapshot().expect("snapshot")).expect("readable");
    assert_eq!(
        verified.differences,
        ["ses_golden: schedules differ from a replay (0 stored, 1 replayed)"]
    );
}
