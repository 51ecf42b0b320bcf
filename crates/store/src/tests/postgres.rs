//! The PostgreSQL backend passes the conformance suite unchanged, keeps every acknowledged
//! write across SIGKILL, and fences a node whose lease was taken over.
//!
//! These tests need a PostgreSQL server: `AGENTHOST_PG_URL` names it (`.ci/with-postgres`
//! starts a throwaway one). Without it each returns at once and one line says they were left
//! out; with `AGENTHOST_REQUIRE_SERVICES` set (as `.ci/run` does) they fail instead, saying how
//! to start one. Each store lives in a schema of its own, dropped when the test ends.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conformance::Backend;
use crate::{Config, PgConfig, PgStore, Store};

/// Whether a server is there; without one each test returns at once, and one line says they
/// were left out (a failure when `AGENTHOST_REQUIRE_SERVICES` is set, as in CI).
fn available() -> bool {
    crate::testing::postgres_url("the PostgreSQL store tests").is_some()
}

/// The server's URL (see [`available`]).
pub(crate) fn url() -> String {
    crate::testing::postgres_url("the PostgreSQL store tests")
        .expect("invariant: tests check `available` first")
}

/// A schema name no other test (or test process) uses.
pub(crate) fn schema() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    )
}

pub(crate) fn config(schema: &str, node: &str) -> PgConfig {
    let mut pg = PgConfig::new(url());
    pg.schema = schema.to_owned();
    pg.node_id = node.to_owned();
    pg.advertise_url = format!("http://{node}.invalid");
    pg.partitions = 8;
    pg.lease_ttl = Duration::from_secs(2);
    pg
}

pub(crate) fn open(schema: &str, node: &str) -> PgStore {
    PgStore::open(Config::new("unused"), config(schema, node)).expect("the PostgreSQL store opens")
}

/// The store's partition ownership (a PostgreSQL store always has one).
fn cluster(store: &PgStore) -> Arc<dyn crate::Ownership> {
    store
        .ownership()
        .expect("a PostgreSQL store is part of a cluster")
}

/// Drops a test's schema.
pub(crate) fn drop_schema(schema: &str) {
    sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
}

/// Runs SQL on a connection of its own (from any thread, inside a runtime or not).
fn sql(statement: &str) {
    let statement = statement.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
                .await
                .expect("connects");
            tokio::spawn(connection);
            client
                .batch_execute(&statement)
                .await
                .expect("statement runs");
        });
    })
    .join()
    .expect("sql");
}

/// Fresh stores, each in its own schema.
#[derive(Default)]
struct Postgres {
    schemas: Mutex<Vec<String>>,
}

impl Backend for Postgres {
    fn fresh(&self) -> Arc<dyn Store> {
        let schema = schema();
        let store = open(&schema, "node-a");
        self.schemas.lock().expect("lock").push(schema);
        Arc::new(store)
    }

    fn reopen(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        store.close();
        drop(store);
        let schema = self
            .schemas
            .lock()
            .expect("lock")
            .last()
            .expect("a store")
            .clone();
        Arc::new(open(&schema, "node-a"))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        for schema in self.schemas.lock().expect("lock").drain(..) {
            drop_schema(&schema);
        }
    }
}

crate::conformance_tests!(Postgres::default(), if available());

const CHILD_ENV: &str = "AGENTHOST_PG_CRASH_CHILD";

/// Entry point of the child process; does nothing in a normal test run.
#[test]
fn crash_child_entry() {
    let Ok(schema) = std::env::var(CHILD_ENV) else {
        return;
    };
    crate::conformance::crash_child(|| Arc::new(open(&schema, "node-a")));
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    if !available() {
        return;
    }
    let rounds = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        20
    } else {
        2
    };
    let schema = schema();
    let exe = std::env::current_exe().expect("test binary");
    crate::conformance::crash_rounds(
        rounds,
        |round| {
            Command::new(&exe)
                .args([
                    "tests::postgres::crash_child_entry",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &schema)
                .env("AGENTHOST_CRASH_ROUND", round.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("child starts")
        },
        // The same node id: a restarted node takes its own leases back at once.
        || Arc::new(open(&schema, "node-a")),
    );
    drop_schema(&schema);
}

/// Creates session `ses_<name>` on `store`; the admissions of it are `msg_<name><n>`.
async fn session_on(store: &PgStore, name: &str) -> agenthost_model::SessionId {
    let s = super::sid(name);
    store
        .create_session(crate::NewSession {
            id: s.clone(),
            agent: "default".into(),
            model: None,
            title: None,
        })
        .await
        .expect("created");
    s
}

fn admission(
    s: &agenthost_model::SessionId,
    name: &str,
    n: u32,
    delivery: agenthost_model::Delivery,
) -> crate::Admission {
    crate::Admission {
        session: s.clone(),
        id: super::mid(&format!("{name}{n}")),
        prompt: agenthost_model::Prompt::text("work"),
        delivery,
        wake: true,
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// A node whose lease was taken over cannot commit, even before it noticed: every write
/// transaction checks the epoch under `FOR SHARE`. It then notices at its next renewal and
/// says so; the new owner reads everything the old one committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_cannot_commit_after_a_takeover() {
    if !available() {
        return;
    }
    use crate::Lease;
    let schema = schema();
    let a = open(&schema, "node-a");
    let s = session_on(&a, "fenced").await;
    let admit = |n| admission(&s, "f", n, agenthost_model::Delivery::Steer);
    a.admit(admit(0)).await.expect("admitted while owner");
    let ownership = cluster(&a);
    let mut changes = ownership.subscribe();
    let part = ownership.partition(&s);
    assert!(ownership.owns(&s));
    // Another node takes the partition over (as after this one paused past its TTL).
    sql(&format!(
        "UPDATE {schema}.leases SET owner = 'node-b', epoch = epoch + 1, \
         expires_at = now() + interval '1 hour' WHERE part = {part}"
    ));
    let refused = a.admit(admit(1)).await;
    assert!(
        matches!(refused, Err(crate::Error::NotOwner { partition, .. }) if partition == part),
        "{refused:?}"
    );
    let log = a
        .snapshot()
        .expect("snapshot")
        .events(&s, agenthost_model::Seq::ZERO, 100)
        .expect("events");
    assert_eq!(log.len(), 2, "nothing of the refused write is in the log");
    // The next renewal notices.
    let lost = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Lease::Lost(parts, _) = changes.recv().await.expect("changes") {
                return parts;
            }
        }
    })
    .await
    .expect("the loss is noticed");
    assert!(lost.contains(&part));
    assert!(!ownership.owns(&s));
    a.close();
    // The new owner (here: a process with that node id) holds it and writes after what the old
    // owner committed.
    let b = open(&schema, "node-b");
    assert!(cluster(&b).owns(&s));
    let receipt = b.admit(admit(1)).await.expect("the new owner admits");
    assert_eq!(receipt.admitted_seq, agenthost_model::Seq(2));
    b.close();
    drop_schema(&schema);
}

/// A write fenced to the lease epoch its claim was taken in is refused once the partition was
/// lost, even after this node took it again at a newer epoch (the owner in between may have
/// recovered the session); an unfenced write, or one fenced to the new epoch, goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_fenced_to_an_old_epoch_is_refused_after_the_lease_was_taken_again() {
    if !available() {
        return;
    }
    use crate::Action;
    use agenthost_model::{Event, Usage};
    let schema = schema();
    let a = open(&schema, "node-a");
    let s = session_on(&a, "epoch").await;
    let ownership = cluster(&a);
    let part = ownership.partition(&s);
    let first = ownership.epoch(&s).expect("held");
    let usage = |fence: Option<i64>| -> Vec<Action> {
        fence
            .map(Action::Fence)
            .into_iter()
            .chain([Action::Append(Event::UsageRecorded {
                usage: Usage::default(),
            })])
            .collect()
    };
    a.write(s.clone(), usage(Some(first)))
        .await
        .expect("written under its epoch");
    // Another node took it over, then let it expire: this node takes it again.
    sql(&format!(
        "UPDATE {schema}.leases SET owner = 'node-b', epoch = epoch + 1, \
         expires_at = now() - interval '1 second' WHERE part = {part}"
    ));
    until("taken again at a newer epoch", || {
        ownership.epoch(&s).is_some_and(|e| e > first + 1)
    })
    .await;
    let refused = a.write(s.clone(), usage(Some(first))).await;
    assert!(
        matches!(refused, Err(crate::Error::NotOwner { partition, .. }) if partition == part),
        "{refused:?}"
    );
    let now = ownership.epoch(&s).expect("held");
    a.write(s.clone(), usage(Some(now)))
        .await
        .expect("written under the new epoch");
    a.write(s.clone(), usage(None)).await.expect("unfenced");
    let log = a
        .snapshot()
        .expect("snapshot")
        .events(&s, agenthost_model::Seq::ZERO, 100)
        .expect("events");
    assert_eq!(log.len(), 4, "created, and three of the four writes");
    a.close();
    drop_schema(&schema);
}

/// Two nodes share the partitions: the first takes all, and hands half back once the second
/// is alive; the second takes them. A closed node hands its partitions back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_share_the_partitions() {
    if !available() {
        return;
    }
    let schema = schema();
    let a = open(&schema, "node-a");
    let held = |o: &dyn crate::Ownership, node: &str| {
        o.view()
            .nodes
            .iter()
            .find(|n| n.id == node)
            .map_or(0, |n| n.partitions.len())
    };
    assert_eq!(held(&*cluster(&a), "node-a"), 8);
    let b = open(&schema, "node-b");
    let (oa, ob) = (cluster(&a), cluster(&b));
    until("each node holds half", || {
        held(&*oa, "node-a") == 4 && held(&*ob, "node-b") == 4 && held(&*ob, "node-a") == 4
    })
    .await;
    let view = ob.view();
    assert_eq!(view.partitions, 8);
    assert!(
        view.nodes
            .iter()
            .all(|n| n.alive && n.url.ends_with(".invalid"))
    );
    a.close();
    until("the survivor holds all", || held(&*ob, "node-b") == 8).await;
    b.close();
    drop_schema(&schema);
}

/// Every node of a cluster must agree on the partition count.
#[test]
fn a_partition_count_mismatch_stops_the_start() {
    if !available() {
        return;
    }
    let schema = schema();
    let a = open(&schema, "node-a");
    let mut other = config(&schema, "node-b");
    other.partitions = 16;
    let refused = PgStore::open(Config::new("unused"), other).expect_err("refused");
    assert!(refused.to_string().contains("partitions"), "{refused}");
    a.close();
    drop_schema(&schema);
}

/// A schema of an older readable format (before 6, without the schedules table) is upgraded
/// when a node of this build opens it: the table is created, the format rewritten, and what
/// the schema held reads as it was. A newer format is refused, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_format_gains_the_schedules_table_and_a_newer_one_is_refused() {
    if !available() {
        return;
    }
    use agenthost_model::{
        CatchUp, Delivery, Event, Prompt, Schedule, ScheduleId, Timestamp, When,
    };
    let schema = schema();
    let store = open(&schema, "node-a");
    let s = session_on(&store, "older").await;
    store
        .admit(admission(&s, "o", 0, Delivery::Steer))
        .await
        .expect("admitted");
    let log = |store: &PgStore| {
        store
            .snapshot()
            .expect("snapshot")
            .events(&s, agenthost_model::Seq::ZERO, 100)
            .expect("events")
    };
    let before = log(&store);
    store.close();
    // As a format-5 build left it.
    sql(&format!(
        "DROP TABLE {schema}.schedules; UPDATE {schema}.meta SET value = '5' WHERE key = 'format'"
    ));
    let store = open(&schema, "node-a");
    assert_eq!(log(&store), before);
    sql(&format!(
        "DO $$ BEGIN IF (SELECT value FROM {schema}.meta WHERE key = 'format') <> '{}' THEN \
         RAISE EXCEPTION 'the format was not rewritten'; END IF; END $$",
        crate::FORMAT_VERSION
    ));
    let schedule = Schedule {
        id: ScheduleId::parse("sch_upgraded").expect("id"),
        prompt: Prompt::text("hello"),
        delivery: Delivery::Queue,
        when: When::Once,
        catch_up: CatchUp::Once,
        next: Timestamp(1_000),
    };
    store
        .append(
            s.clone(),
            vec![Event::ScheduleSet {
                schedule: schedule.clone(),
            }],
        )
        .await
        .expect("a schedule is set in the table the upgrade created");
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(snap.schedules(&s).expect("schedules"), [schedule]);
    drop(snap);
    store.close();
    sql(&format!(
        "UPDATE {schema}.meta SET value = '{}' WHERE key = 'format'",
        crate::FORMAT_VERSION + 1
    ));
    // On a thread of its own: a store that fails to open drops its runtime, which a runtime's
    // worker may not do.
    let pg = config(&schema, "node-a");
    let refused = std::thread::spawn(move || PgStore::open(Config::new("unused"), pg))
        .join()
        .expect("the open returns")
        .expect_err("a newer format is refused");
    assert!(
        matches!(refused, crate::Error::FormatVersion { found, supported }
            if found == crate::FORMAT_VERSION + 1 && supported == crate::FORMAT_VERSION),
        "{refused:?}"
    );
    drop_schema(&schema);
}

/// A TCP proxy in front of the database that can cut every connection and refuse new ones
/// (the database gone: restarted, or the network between) and let them through again.
struct Proxy {
    url: String,
    up: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    async fn start() -> Proxy {
        use std::sync::atomic::AtomicBool;
        let config: tokio_postgres::Config = url().parse().expect("a PostgreSQL URL");
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy binds");
        let local = listener.local_addr().expect("addr");
        let user = config.get_user().unwrap_or("postgres");
        let password = config
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        let db = config.get_dbname().unwrap_or(user);
        let url = format!("postgresql://{user}{password}@{local}/{db}");
        let up = Arc::new(AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let accepting = up.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !accepting.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = format!("{host}:{port}");
                let mut cuts = cuts.clone();
                cuts.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Proxy { url, up, cut }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// The database goes away and comes back: while it is gone, writes fail with a storage error
/// (503 through the API), never a success, snapshots fail instead of hanging, and the store
/// reports itself unreachable; once it is back, writes resume by themselves and every
/// acknowledged write, and nothing refused, is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_by_themselves_when_the_database_comes_back() {
    if !available() {
        return;
    }
    use crate::Health;
    let proxy = Proxy::start().await;
    let schema = schema();
    let mut pg = config(&schema, "node-a");
    pg.url = proxy.url.clone();
    pg.lease_ttl = Duration::from_millis(900);
    let store = PgStore::open(Config::new("unused"), pg).expect("opens through the proxy");
    let s = session_on(&store, "outage").await;
    let admit = |n| admission(&s, "o", n, agenthost_model::Delivery::Queue);
    store.admit(admit(0)).await.expect("admitted");
    proxy.down();
    let refused = store.admit(admit(1)).await;
    assert!(
        matches!(&refused, Err(e) if e.is_io()),
        "a storage error, not a success: {refused:?}"
    );
    assert!(
        store.snapshot().is_err(),
        "a snapshot fails instead of hanging"
    );
    until("the store says the database is unreachable", || {
        matches!(store.health(), Health::Unreachable(_))
    })
    .await;
    proxy.restore();
    let mut resumed = None;
    for _ in 0..100 {
        match store.admit(admit(2)).await {
            Ok(receipt) => {
                resumed = Some(receipt);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let receipt = resumed.expect("writes resume once the database is back");
    until("the store is healthy again", || {
        store.health() == Health::Ok
    })
    .await;
    let snap = store.snapshot().expect("snapshot");
    assert!(snap.index(&super::mid("o0")).expect("index").is_some());
    assert!(
        snap.index(&super::mid("o1")).expect("index").is_none(),
        "the refused admission wrote nothing"
    );
    assert_eq!(snap.pending(&s).expect("pending").len(), 2);
    assert_eq!(receipt.admitted_seq, agenthost_model::Seq(2));
    drop(snap);
    store.close();
    drop_schema(&schema);
}

/// Snapshots share a bounded pool of connections: with every connection lent, the next
/// snapshot waits for one to come back instead of opening another.
#[test]
fn snapshots_wait_for_a_pooled_connection() {
    if !available() {
        return;
    }
    let schema = schema();
    let mut pg = config(&schema, "node-a");
    pg.pool_size = 2;
    let store = Arc::new(PgStore::open(Config::new("unused"), pg).expect("opens"));
    let held = [
        store.snapshot().expect("first"),
        store.snapshot().expect("second"),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = store.clone();
    let third = std::thread::spawn(move || {
        let snap = waiting.snapshot();
        tx.send(()).expect("send");
        snap.map(|_| ())
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a third snapshot opened a third connection"
    );
    drop(held);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the third snapshot got a connection back");
    third.join().expect("thread").expect("snapshot");
    store.close();
    drop_schema(&schema);
}
