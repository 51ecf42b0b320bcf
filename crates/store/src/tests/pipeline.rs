//! The writer's two threads: a batch is planned on the rows of the one being committed, so a
//! failed commit must take down the batch planned on it, and the planner must start over from
//! what is durable.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agenthost_model::{IndexEntry, MessageId, SessionId};

use super::*;
use crate::{Error, Receipt, Result};

type Answer = (SessionId, MessageId, Result<Receipt>);

/// A store in `dir` holding `n` new sessions.
async fn with_sessions(dir: &std::path::Path, n: usize) -> (Arc<RedbStore>, Vec<SessionId>) {
    let store = Arc::new(open(dir));
    let sessions: Vec<SessionId> = (0..n).map(|i| sid(&format!("p{i}"))).collect();
    for s in &sessions {
        store.create_session(new_session(s)).await.expect("created");
    }
    (store, sessions)
}

/// Admits `each` prompts to every session at once, and returns every answer.
async fn admit_all(
    store: &Arc<RedbStore>,
    sessions: &[SessionId],
    each: usize,
    tag: &str,
) -> Vec<Answer> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, s) in sessions.iter().enumerate() {
        for j in 0..each {
            let (store, s) = (store.clone(), s.clone());
            let id = mid(&format!("{tag}{i}x{j}"));
            tasks.spawn(async move {
                let result = store.admit(admission(&s, &id, "hello")).await;
                (s, id, result)
            });
        }
    }
    tasks.join_all().await
}

/// Every answer is true: an admitted input is indexed at the seq its receipt names, and a
/// refused one left no trace.
fn assert_answers_hold(store: &RedbStore, answers: &[Answer]) {
    let snap = store.snapshot().expect("snapshot");
    for (s, id, result) in answers {
        let entry = snap.index(id).expect("index read");
        match result {
            Ok(receipt) => assert_eq!(
                entry,
                Some(IndexEntry::Prompt {
                    session: s.clone(),
                    admitted_seq: receipt.admitted_seq,
                    promoted_seq: None,
                }),
                "{id} was admitted"
            ),
            Err(e) => {
                assert!(matches!(e, Error::Storage(_)), "{id}: {e}");
                assert_eq!(entry, None, "{id} failed and wrote nothing");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_fails_its_batch_and_the_planner_starts_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, sessions) = with_sessions(dir.path(), 8).await;
    let before = admit_all(&store, &sessions, 20, "a").await;
    assert!(before.iter().all(|(_, _, r)| r.is_ok()));

    store.fail_commits.store(1, Ordering::SeqCst);
    let during = admit_all(&store, &sessions, 20, "b").await;
    assert_eq!(store.stats().failed_commits.get(), 1);
    assert!(
        during.iter().any(|(_, _, r)| r.is_err()),
        "the failed commit's batch is refused"
    );
    assert_answers_hold(&store, &before);
    assert_answers_hold(&store, &during);
    // Seqs stay gap-free: nothing was planned on seqs the failed batch had taken.
    assert_replay_equal(&store);

    let after = admit_all(&store, &sessions, 5, "c").await;
    assert!(after.iter().all(|(_, _, r)| r.is_ok()));
    assert_answers_hold(&store, &after);
    assert_replay_equal(&store);

    let kept = contents(&store);
    store.close();
    let reopened = open(dir.path());
    assert_eq!(
        contents(&reopened),
        kept,
        "what was answered is what is durable"
    );
}

/// Folds prepared off the commit path meet failed commits at every stage (frozen, being
/// prepared, carried by the batch that fails or by one dropped on top of it): whatever fails,
/// every answer holds, the log reads as a replay of what was answered, and the store opens
/// again to the same contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folds_prepared_across_failed_commits_lose_and_repeat_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, sessions) = with_sessions(dir.path(), 8).await;
    let folds = store.stats().maintenance_runs.get();
    let mut answers = Vec::new();
    // Small rounds, so that commits are many: a fold takes three (the one it freezes after,
    // the one whose plan sends it to the folder, the one that carries it).
    for round in 0..40 {
        if round % 3 == 1 {
            store.fail_commits.store(1, Ordering::SeqCst);
        }
        let tag = format!("f{round}x");
        answers.extend(admit_all(&store, &sessions, 2, &tag).await);
        assert_answers_hold(&store, &answers);
        assert_replay_equal(&store);
    }
    assert!(store.stats().failed_commits.get() >= 10);
    let folded = store.stats().maintenance_runs.get() - folds;
    assert!(folded >= 5, "the front folded as the rounds went: {folded}");
    let kept = contents(&store);
    store.close();
    let reopened = open(dir.path());
    assert_eq!(contents(&reopened), kept);
    assert_answers_hold(&reopened, &answers);
}

/// A batch changes the writer's caches in place, and the batches still being committed are
/// known only there: a batch that fails while it is planned (a read of redb failed) must drop
/// what it changed without losing theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_failed_while_planned_loses_nothing_of_the_batches_being_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, sessions) = with_sessions(dir.path(), 8).await;
    let (mut answers, mut injected) = (Vec::new(), 0);
    for round in 0..12 {
        if round % 2 == 1 {
            store.fail_plans.store(1, Ordering::SeqCst);
        }
        answers.extend(admit_all(&store, &sessions, 20, &format!("p{round}x")).await);
        // The failure waits for a batch planned while another is being committed, which a
        // round almost always has.
        if round % 2 == 1 && store.fail_plans.swap(0, Ordering::SeqCst) == 0 {
            injected += 1;
        }
        assert_answers_hold(&store, &answers);
        assert_replay_equal(&store);
    }
    let failed = answers.iter().filter(|(_, _, r)| r.is_err()).count();
    assert!(
        injected >= 1 && failed >= injected,
        "{injected} batches failed, {failed} admissions"
    );
    let kept = contents(&store);
    store.close();
    let reopened = open(dir.path());
    assert_eq!(contents(&reopened), kept);
    assert_answers_hold(&reopened, &answers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_promotions_see_the_batches_still_being_committed() {
    use agenthost_model::promotion::Boundary;

    let dir = tempfile::tempdir().expect("tempdir");
    let (store, sessions) = with_sessions(dir.path(), 6).await;
    for round in 0..4 {
        let mut admissions = tokio::task::JoinSet::new();
        let mut promotions = tokio::task::JoinSet::new();
        for (i, s) in sessions.iter().enumerate() {
            for j in 0..10 {
                let id = mid(&format!("r{round}s{i}m{j}"));
                // Submitted back to back, so the retries often land in the batch after the
                // admission's, planned while the admission's is being committed.
                let first = store.admit(admission(s, &id, "hello"));
                let retry = store.admit(admission(s, &id, "hello"));
                let other = store.admit(admission(s, &id, "something else"));
                admissions.spawn(async move { (id, first.await, retry.await, other.await) });
            }
            let promote = store.promote(s.clone(), Boundary::Idle);
            promotions.spawn(promote);
        }
        for (id, first, retry, other) in admissions.join_all().await {
            let first = first.expect("admitted");
            let retry = retry.expect("an exact retry is answered");
            assert_eq!(
                (&retry.id, &retry.session, retry.admitted_seq),
                (&first.id, &first.session, first.admitted_seq),
                "{id}: the retry names the original admission"
            );
            assert!(
                matches!(other, Err(Error::PromptConflict { .. })),
                "{id}: a different prompt under the same id conflicts: {other:?}"
            );
        }
        for promoted in promotions.join_all().await {
            promoted.expect("promoted");
        }
        assert_replay_equal(&store);
    }
    let kept = contents(&store);
    store.close();
    assert_eq!(contents(&open(dir.path())), kept);
}

/// Closing releases the file even while a reader still holds a snapshot on another thread (redb
/// closes the file under it), so the same process can open the store again at once; the old
/// store's snapshots then fail as closed.
#[test]
fn a_snapshot_held_elsewhere_does_not_keep_the_file_from_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = super::open(dir.path());
    let snap = store.snapshot().expect("snapshot");
    let reader = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(snap);
    });
    store.close();
    let reopened = super::open(dir.path());
    reader.join().expect("reader");
    assert!(matches!(store.snapshot(), Err(crate::Error::Closed)));
    reopened.close();
}

/// A store whose writer, busy once its last batch held `linger_after` operations or more (and it
/// has had work for `busy_for`), lets a batch linger for up to a minute while operations keep
/// coming, and commits two operations at most at once.
fn lingering_after(
    dir: &std::path::Path,
    linger_after: usize,
    busy_for: std::time::Duration,
) -> Arc<RedbStore> {
    let mut config = Config::new(dir.join("store.redb"));
    config.clock = Arc::new(|| agenthost_model::Timestamp(1_700_000_000_000));
    config.max_batch = 2;
    config.max_wait = std::time::Duration::from_secs(60);
    config.linger_after = linger_after;
    config.busy_for = busy_for;
    Arc::new(RedbStore::open(config).expect("store opens"))
}

/// [`lingering_after`], busy on the size of the last batch alone.
fn lingering(dir: &std::path::Path, linger_after: usize) -> Arc<RedbStore> {
    lingering_after(dir, linger_after, std::time::Duration::ZERO)
}

/// Admits `id` to `session` on a task of its own.
fn admit_later(
    store: &Arc<RedbStore>,
    session: &SessionId,
    id: &str,
) -> tokio::task::JoinHandle<Result<Receipt>> {
    let (store, session, id) = (store.clone(), session.clone(), mid(id));
    tokio::spawn(async move { store.admit(admission(&session, &id, "hello")).await })
}

/// Far below the linger of [`lingering`]: what finishes within it did not wait the linger out.
const LONG: std::time::Duration = std::time::Duration::from_secs(30);

/// A new session `name` in `store`.
async fn session_in(store: &Arc<RedbStore>, name: &str) -> SessionId {
    let s = sid(name);
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    s
}

/// Admits `id` to `session` well within [`LONG`], or fails saying `why` it should have been.
async fn admit_in_time(store: &Arc<RedbStore>, session: &SessionId, id: &str, why: &str) {
    tokio::time::timeout(LONG, admit_later(store, session, id))
        .await
        .expect(why)
        .expect("task")
        .expect("admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_writer_commits_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = lingering(dir.path(), 8);
    let s = session_in(&store, "quiet").await;
    admit_in_time(
        &store,
        &s,
        "alone",
        "a batch after a small one does not linger",
    )
    .await;
    assert_eq!(store.stats().commits.get(), 2);
    assert_eq!(store.stats().lingered.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_has_not_worked_long_enough_commits_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = lingering_after(dir.path(), 1, std::time::Duration::from_secs(60));
    let s = session_in(&store, "burst").await;
    for i in 0..3 {
        admit_in_time(
            &store,
            &s,
            &format!("m{i}"),
            "a short burst does not linger",
        )
        .await;
    }
    assert_eq!(store.stats().lingered.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_writer_stops_lingering_when_nothing_more_comes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = lingering(dir.path(), 1);
    // A batch of one: the writer is busy from now on.
    let s = session_in(&store, "busy").await;
    admit_in_time(&store, &s, "alone", "a linger that brings nothing ends").await;
    assert_eq!(store.stats().commits.get(), 2);
    assert_eq!(store.stats().lingered.get(), 1, "the batch lingered");

    admit_in_time(&store, &s, "next", "a paused linger does not wait").await;
    assert_eq!(
        store.stats().lingered.get(),
        1,
        "a linger that brought nothing pauses lingering"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_filling_batches_while_the_writer_lingers_are_all_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = lingering(dir.path(), 1);
    let s = session_in(&store, "full").await;
    // Two fill a batch; six come at once, on a writer that lingers after every batch.
    let admissions: Vec<_> = (0..6)
        .map(|i| admit_later(&store, &s, &format!("m{i}")))
        .collect();
    let answers = tokio::time::timeout(LONG, futures::future::join_all(admissions))
        .await
        .expect("no batch waits out the linger");
    for answer in answers {
        answer.expect("task").expect("admitted");
    }
    let stats = store.stats();
    assert!(stats.commits.get() <= 7, "{} commits", stats.commits.get());
    assert_eq!(stats.ops.get(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_while_the_writer_lingers_commits_what_was_queued() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = lingering(dir.path(), 1);
    let s = session_in(&store, "closing").await;
    // Queued when `admit` returns (its future only awaits the answer), so queued before the
    // close whatever the scheduler does with the tasks.
    let last = store.admit(admission(&s, &mid("last"), "hello"));
    let closing = store.clone();
    tokio::task::spawn_blocking(move || closing.close())
        .await
        .expect("closed");
    let receipt = tokio::time::timeout(LONG, last)
        .await
        .expect("closing does not wait out a linger")
        .expect("what was queued at close is committed");
    let reopened = open(dir.path());
    let entry = reopened.snapshot().expect("snapshot").index(&receipt.id);
    assert!(
        matches!(entry, Ok(Some(IndexEntry::Prompt { .. }))),
        "the admission is durable: {entry:?}"
    );
}
