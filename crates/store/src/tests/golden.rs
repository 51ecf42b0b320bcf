//! The on-disk format: a store file written by each format version is committed
//! under `testdata/`; every later build must open it and read exactly the same content, or
//! refuse it with the version error. Bless the current version's file only together with a
//! format version bump: `AGENTHOST_BLESS=1 cargo test -p agenthost-store golden`.

use std::path::{Path, PathBuf};

use agenthost_model::promotion::Boundary;
use agenthost_model::{
    CatchUp, Delivery, Event, FileAttachment, Finish, Prompt, Schedule, ScheduleId, Seq, Timestamp,
    Usage, Verdict, When,
};

use super::*;
use crate::codec::{FORMAT_VERSION, OLDEST_READABLE};
use crate::{Error, tables};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

/// A copy of the golden store file of `version`, as `store.redb` in a directory of its own:
/// opening a redb file may write to it, and the committed files must stay as they are.
pub(super) fn golden_copy(version: u16) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    std::fs::copy(testdata(&format!("golden-v{version}.redb")), &path)
        .expect("the golden store file exists (bless it together with a format bump)");
    (dir, path)
}

/// A session that touches every table and most event kinds.
pub(super) async fn scenario(store: &RedbStore) {
    let s = sid("golden");
    store
        .create_session(new_session(&s))
        .await
        .expect("created");
    let with_file = Admission {
        session: s.clone(),
        id: mid("first"),
        prompt: Prompt {
            text: "look at this".into(),
            files: vec![FileAttachment {
                mime: "text/plain".into(),
                url: "data:text/plain;base64,aGk=".into(),
                filename: Some("hi.txt".into()),
            }],
        },
        delivery: Delivery::Steer,
        wake: true,
    };
    store.admit(with_file).await.expect("admitted");
    let mut queued = admission(&s, &mid("later"), "and then this");
    queued.delivery = Delivery::Queue;
    // Deferred (`resume: false`): format 4's appended record variant.
    queued.wake = false;
    store.admit(queued).await.expect("admitted");
    store
        .promote(s.clone(), Boundary::Idle)
        .await
        .expect("promoted");
    let a = mid("answer");
    let events = vec![
        Event::InstructionsUpdated {
            id: mid("system"),
            changed: vec![("agent".into(), "Be brief.".into())],
            text: "Be brief.".into(),
        },
        Event::ExecutionStarted { forced: false },
        Event::StepStarted {
            id: a.clone(),
            step: 1,
            agent: "default".into(),
            model: "mock".into(),
        },
        Event::ReasoningEnded {
            id: a.clone(),
            text: "hmm".into(),
            metadata: Some("sig".into()),
            incomplete: false,
        },
        Event::TextEnded {
            id: a.clone(),
            text: "Looking it up.".into(),
            incomplete: false,
        },
        Event::ToolCalled {
            id: a.clone(),
            call_id: "c1".into(),
            name: "lookup".into(),
            input: "{\"q\":\"hi\"}".into(),
        },
        Event::ToolSucceeded {
            id: a.clone(),
            call_id: "c1".into(),
            output: "found".into(),
            truncated: false,
        },
        Event::StepEnded {
            id: a.clone(),
            finish: Finish::ToolCalls,
            usage: Usage {
                input: 10,
                output: 5,
                reasoning: 2,
                cache_read: 3,
                cache_write: 1,
                cost_nanos: 99,
            },
        },
        Event::CompactionStarted {
            id: mid("compact"),
            auto: true,
        },
        Event::CompactionEnded {
            id: mid("compact"),
            summary: "they said hi".into(),
            kept_from: Seq(4),
            usage: Usage::default(),
        },
        Event::ExecutionSucceeded,
    ];
    store.append(s.clone(), events).await.expect("appended");

    // Format 5's records: a step whose calls wait for approvals, decided each way or not yet.
    let asked = mid("asked");
    let calls = [
        "ok",
        "denied",
        "expired",
        "cancelled",
        "approved",
        "waiting",
    ];
    let mut events = vec![
        Event::ExecutionStarted { forced: true },
        Event::StepStarted {
            id: asked.clone(),
            step: 2,
            agent: "default".into(),
            model: "mock".into(),
        },
    ];
    for call in calls {
        events.push(Event::ToolCalled {
            id: asked.clone(),
            call_id: call.into(),
            name: "shell".into(),
            input: format!("{{\"run\":\"{call}\"}}"),
        });
        events.push(Event::ApprovalRequested {
            id: asked.clone(),
            call_id: call.into(),
            name: "shell".into(),
            digest: format!("sha256:{call}"),
            expires_at: Timestamp(1_700_000_600_000),
        });
    }
    events.push(Event::StepEnded {
        id: asked.clone(),
        finish: Finish::ToolCalls,
        usage: Usage::default(),
    });
    let decided =
        |call: &str, verdict, by: Option<&str>, reason: Option<&str>| Event::ApprovalDecided {
            id: asked.clone(),
            call_id: call.into(),
            verdict,
            by: by.map(Into::into),
            reason: reason.map(Into::into),
        };
    let refused = |call: &str, error: &str| Event::ToolFailed {
        id: asked.clone(),
        call_id: call.into(),
        error: error.into(),
    };
    events.extend([
        decided("ok", Verdict::Approved, Some("alice"), None),
        Event::ToolStarted {
            id: asked.clone(),
            call_id: "ok".into(),
        },
        Event::ToolSucceeded {
            id: asked.clone(),
            call_id: "ok".into(),
            output: "done".into(),
            truncated: false,
        },
        decided("denied", Verdict::Denied, Some("bob"), Some("not today")),
        refused(
            "denied",
            "the call was denied by bob: not today; it did not run",
        ),
        decided("expired", Verdict::Expired, None, None),
        refused(
            "expired",
            "the call was not approved in time (the approval expired); it did not run",
        ),
        decided("cancelled", Verdict::Cancelled, None, Some("interrupted")),
        refused(
            "cancelled",
            "the call was cancelled: interrupted; it did not run",
        ),
        // Approved and not started yet; "waiting" is not decided.
        decided("approved", Verdict::Approved, Some("alice"), Some("fine")),
        // Releases the claim, so that the store holds no claimed session. (The runtime would
        // withdraw the held calls first; the store records whatever the log says.)
        Event::ExecutionInterrupted {
            reason: agenthost_model::InterruptReason::User,
        },
    ]);
    store.append(s.clone(), events).await.expect("appended");

    // Format 6's records: schedules set, fired (admitting, and skipped for the last time) and
    // cancelled; the daily one stays, moved on to its next time.
    let sch = |name: &str| ScheduleId::parse(&format!("sch_{name}")).expect("valid schedule id");
    let (daily, once, weekly) = (sch("daily"), sch("once"), sch("weekly"));
    let (first, then) = (Timestamp(1_700_031_600_000), Timestamp(1_700_118_000_000));
    let schedule =
        |id: &ScheduleId, prompt: Prompt, delivery, when, catch_up, next| Event::ScheduleSet {
            schedule: Schedule {
                id: id.clone(),
                prompt,
                delivery,
                when,
                catch_up,
                next,
            },
        };
    let stand_up = Prompt::text("what is on today?");
    let events = vec![
        schedule(
            &daily,
            stand_up.clone(),
            Delivery::Queue,
            When::Cron {
                expr: "0 9 * * 1-5".into(),
                tz: Some("Europe/Paris".into()),
            },
            CatchUp::Once,
            first,
        ),
        schedule(
            &once,
            Prompt::text("remind me"),
            Delivery::Steer,
            When::Once,
            CatchUp::Skip,
            Timestamp(1_700_000_300_000),
        ),
        schedule(
            &weekly,
            Prompt::text("weekly report"),
            Delivery::Queue,
            When::Cron {
                expr: "0 8 * * 1".into(),
                tz: None,
            },
            CatchUp::Once,
            Timestamp(1_700_380_800_000),
        ),
        // A firing admits its input in the same commit.
        Event::PromptAdmitted {
            id: daily.firing(first),
            delivery: Delivery::Queue,
            prompt: stand_up,
            wake: true,
        },
        Event::ScheduleFired {
            id: daily,
            at: first,
            next: Some(then),
            admitted: true,
        },
        Event::ScheduleFired {
            id: once,
            at: Timestamp(1_700_000_300_000),
            next: None,
            admitted: false,
        },
        Event::ScheduleCancelled { id: weekly },
    ];
    store.append(s.clone(), events).await.expect("appended");
    // Format 7: a budget of the session's own, and an exchange the budget blocked (and a user
    // then interrupted, releasing its claim).
    let events = vec![
        Event::BudgetSet {
            budget: agenthost_model::Budget {
                max_tokens: Some(200_000),
                max_cost_nanos: Some(1_500_000_000),
                turn_max_tokens: None,
                turn_max_cost_nanos: Some(100_000_000),
            },
        },
        Event::ExecutionStarted { forced: true },
        Event::BudgetExhausted {
            which: agenthost_model::Limit::TurnCost,
            spent: 99_000_000,
            limit: 100_000_000,
        },
        Event::ExecutionInterrupted {
            reason: agenthost_model::InterruptReason::User,
        },
        Event::InterruptRequested { by: "ops".into() },
    ];
    store.append(s, events).await.expect("appended");
}

/// A second session, written after the first one's events were merged into the base when the
/// golden file is blessed, so that its events fill the middle and the front; it has nothing
/// pending when done.
async fn more(store: &RedbStore) {
    let after = sid("after_merge");
    store
        .create_session(new_session(&after))
        .await
        .expect("created");
    for n in 0..6 {
        let id = mid(&format!("after_merge_{n}"));
        store
            .admit(admission(&after, &id, "once more"))
            .await
            .expect("admitted");
    }
    store
        .promote(after, Boundary::Idle)
        .await
        .expect("promoted");
}

fn render(store: &RedbStore) -> String {
    let (projections, logs) = contents(store);
    format!("{projections:#?}\n{logs}\n")
}

#[tokio::test]
async fn golden_store_opens_with_identical_content() {
    let golden = testdata(&format!("golden-v{FORMAT_VERSION}.redb"));
    let expected = testdata(&format!("golden-v{FORMAT_VERSION}.txt"));
    if std::env::var_os("AGENTHOST_BLESS").is_some() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        scenario(&store).await;
        store.close();
        drop(store);
        // Everything so far into the base, then a session whose events fill the middle and the
        // front: the file holds every tier of the log.
        {
            let db = redb::Database::open(dir.path().join("store.redb")).expect("reopen");
            let txn = db.begin_write().expect("write");
            crate::log::merge_all(&txn).expect("merged");
            txn.commit().expect("commit");
        }
        let store = open(dir.path());
        more(&store).await;
        std::fs::write(&expected, render(&store)).expect("write expected");
        store.close();
        drop(store);
        std::fs::copy(dir.path().join("store.redb"), &golden).expect("write golden");
    }
    for version in OLDEST_READABLE..=FORMAT_VERSION {
        let (dir, _) = golden_copy(version);
        let expected = std::fs::read_to_string(testdata(&format!("golden-v{version}.txt")))
            .expect("expected rendering exists");
        let store = open(dir.path());
        assert_eq!(
            render(&store),
            expected,
            "the version {version} golden store reads differently"
        );
        // Recovery finds the same work: the queued input is still pending, nothing is claimed.
        let snap = store.snapshot().expect("snapshot");
        assert_eq!(snap.with_pending().expect("pending"), [sid("golden")]);
        assert_eq!(snap.claimed().expect("claimed"), []);
        drop(snap);
        // Opening it kept its version.
        store.close();
        drop(store);
        let db = redb::Database::create(dir.path().join("store.redb")).expect("raw open");
        let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
        let meta = txn.open_table(tables::META).expect("meta");
        let stored = meta.get(tables::FORMAT_KEY).expect("get").expect("version");
        assert_eq!(stored.value(), FORMAT_VERSION.to_le_bytes().as_slice());
        // And it gained the tables of the formats after its own: format 6's schedules.
        txn.open_table(tables::SCHEDULES)
            .expect("opening created the schedules table");
    }
    let expected = std::fs::read_to_string(&expected).expect("expected rendering exists");

    // This build still writes exactly what the golden file holds.
    let fresh = tempfile::tempdir().expect("tempdir");
    let store = open(fresh.path());
    scenario(&store).await;
    more(&store).await;
    assert_eq!(
        render(&store),
        expected,
        "this build writes a different format: bump FORMAT_VERSION"
    );
}

#[test]
fn another_format_version_is_refused_naming_both() {
    let (_dir, path) = golden_copy(FORMAT_VERSION);
    {
        let db = redb::Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("txn");
        {
            let mut meta = txn.open_table(tables::META).expect("meta");
            let future = FORMAT_VERSION + 1;
            meta.insert(tables::FORMAT_KEY, future.to_le_bytes().as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
    }
    let err = RedbStore::open(Config::new(&path)).expect_err("refused");
    assert!(
        matches!(err, Error::FormatVersion { found, supported } if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&(FORMAT_VERSION + 1).to_string())
            && message.contains(&FORMAT_VERSION.to_string())
    );
}

#[test]
fn a_corrupt_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    std::fs::write(&path, vec![0x5a; 8192]).expect("garbage");
    let err = RedbStore::open(Config::new(&path)).expect_err("refused");
    assert!(
        matches!(err, Error::Storage(ref m) if m.contains("cannot open store")),
        "{err:?}"
    );
}

#[tokio::test]
async fn close_releases_the_file_for_the_next_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    store
        .create_session(new_session(&sid("x")))
        .await
        .expect("created");
    let snap = store.snapshot().expect("snapshot");
    drop(snap);
    store.close();
    assert!(matches!(store.snapshot(), Err(Error::Closed)));
    let again = open(dir.path());
    assert!(
        again
            .snapshot()
            .expect("snap")
            .session(&sid("x"))
            .expect("read")
            .is_some()
    );
}

/// The current version's golden file holds events in every tier of the log (the scenario runs
/// with a tiny fold size, see `open`), so that a change to any tier's layout shows there.
#[test]
fn the_golden_file_holds_every_tier_of_the_log() {
    use redb::{ReadableDatabase as _, ReadableTableMetadata as _};
    let (_dir, path) = golden_copy(FORMAT_VERSION);
    let db = redb::Database::open(&path).expect("the golden store opens");
    let txn = db.begin_read().expect("read");
    let base = txn.open_table(tables::EVENTS).expect("base");
    let middle = txn.open_table(tables::EVENTS_MIDDLE).expect("middle");
    let front = txn.open_table(tables::EVENTS_FRONT).expect("front");
    let rows = [
        base.len().expect("len"),
        middle.len().expect("len"),
        front.len().expect("len"),
    ];
    assert!(rows.iter().all(|&n| n > 0), "base, middle, front: {rows:?}");
}
