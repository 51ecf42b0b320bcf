//! The PostgreSQL backend: several `agenthost serve` nodes over one shared database.
//!
//! The database holds everything shared: the event log, the projections (session records,
//! messages, the message-id index, instruction state, schedules), node membership and partition
//! leases.
//! Values are the records of `codec`, exactly as the embedded store writes them.
//!
//! - **Partitions and leases** (`lease`). Sessions hash into a fixed number of partitions
//!   ([`crate::partition_of`]); a node holds a lease per partition `(owner, epoch, expires_at)`, renews
//!   its own, takes free or expired ones up to its share of the live nodes, hands back what is
//!   beyond its share, and bumps the epoch on every takeover.
//! - **Fencing.** Every write transaction takes `FOR SHARE` on the lease rows of the partitions
//!   it touches and checks that this node still holds them at the epochs it acquired (`writer`):
//!   a stale owner can never commit after a takeover, whatever the clocks say. Operations on a
//!   session whose partition this node does not hold fail with [`Error::NotOwner`].
//! - **Group commit** (`writer`): a few writer threads, each with its own connection and a
//!   share of the partitions, batch concurrent operations into one transaction, as the embedded
//!   writer does, running the same operations (`ops`).
//! - **Snapshots** (`snapshot`): a `REPEATABLE READ` read-only transaction on a connection of a
//!   bounded pool.
//!
//! Each writer thread drives its own connection on a runtime of its own thread; every other
//! connection (snapshots, the lease rounds) runs on the store's small tokio runtime, so the
//! synchronous [`Snapshot`] methods block on it from any thread, inside another runtime or not.

mod lease;
mod rows;
mod snapshot;
mod writer;

use std::fmt;
use std::str::FromStr as _;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use agenthost_model::SessionId;
use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio_postgres::{Client, GenericClient, NoTls, Statement};

use crate::cluster::Ownership;
use crate::error::{Error, Result};
use crate::ops::{Op, Outcome};
use crate::{Admission, Config, NewSession, Receipt, Snapshot, Stats, Store, lock};

/// The schema of the tables, created on first open. Changing it is a format change; a table
/// added with a new format (`schedules`, format 6) is created when missing, so an older schema
/// gains it when a build of that format opens it, and the schema version stays.
const SCHEMA_VERSION: &str = "1";

/// How to reach the database and take part in the cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// A PostgreSQL connection URL (`postgresql://user@host:port/db`). Never logged.
    pub url: String,
    /// The PostgreSQL schema holding agenthost's tables; created when missing.
    pub schema: String,
    /// This node's name in the lease table; unique per node, stable across its restarts (a
    /// restarted node takes its own leases back at once).
    pub node_id: String,
    /// How other nodes reach this one over HTTP (`http://host:port`).
    pub advertise_url: String,
    /// Partitions sessions hash into. Every node of a cluster uses the same number.
    pub partitions: u32,
    /// How long a lease lasts without renewal; renewed every third of it.
    pub lease_ttl: Duration,
    /// Connections for snapshots, at most, per node: a snapshot waits for one when all are in
    /// use. With the writers' and the lease rounds', a node opens at most `pool_size +
    /// writers + 1` connections.
    pub pool_size: usize,
    /// Group-commit writers, each with its own connection; a partition's operations always go
    /// to the same writer, so they stay in order.
    pub writers: usize,
}

impl PgConfig {
    pub fn new(url: impl Into<String>) -> Self {
        PgConfig {
            url: url.into(),
            schema: "agenthost".into(),
            node_id: "node-1".into(),
            advertise_url: String::new(),
            partitions: 64,
            lease_ttl: Duration::from_secs(10),
            pool_size: 16,
            writers: 4,
        }
    }
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &"<redacted>")
            .field("schema", &self.schema)
            .field("node_id", &self.node_id)
            .field("advertise_url", &self.advertise_url)
            .field("partitions", &self.partitions)
            .field("lease_ttl", &self.lease_ttl)
            .finish_non_exhaustive()
    }
}

/// A database failure, as the store's error: the connection or the server, not the request.
pub(crate) fn db(e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(d) if d.code() == &tokio_postgres::error::SqlState::DISK_FULL => {
            Error::DiskFull(format!("PostgreSQL: {}", d.message()))
        }
        Some(d) => Error::Storage(format!("PostgreSQL: {}", d.message())),
        None => Error::Io(format!("PostgreSQL: {e}")),
    }
}

/// Connects to the database: [`Connector::connect`] drives the connection on the store's
/// runtime, [`Connector::connect_async`] on the caller's.
#[derive(Clone)]
pub(crate) struct Connector {
    config: tokio_postgres::Config,
    rt: tokio::runtime::Handle,
}

impl Connector {
    fn new(config: &PgConfig, rt: tokio::runtime::Handle) -> Result<Self> {
        let mut pg = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| Error::Storage(format!("the PostgreSQL URL is not valid: {e}")))?;
        if !valid_schema(&config.schema) {
            return Err(Error::Storage(format!(
                "the PostgreSQL schema name {:?} is not valid: use letters, digits and _",
                config.schema
            )));
        }
        pg.options(format!("-c search_path={}", config.schema));
        pg.application_name("agenthost");
        pg.connect_timeout(Duration::from_secs(10));
        Ok(Connector { config: pg, rt })
    }

    /// A new connection, from any thread.
    pub(crate) fn connect(&self) -> Result<Client> {
        let connector = self.clone();
        let task = self
            .rt
            .spawn(async move { connector.connect_async().await });
        wait(task).map_err(|e| Error::Io(format!("PostgreSQL: {e}")))?
    }

    /// A new connection, from a task on the store's runtime.
    pub(crate) async fn connect_async(&self) -> Result<Client> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(db)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL connection ended");
            }
        });
        Ok(client)
    }
}

fn valid_schema(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// The statements prepared on one connection: each is prepared (one round trip) the first time
/// it is used there, and then only bound and executed.
#[derive(Default)]
pub(crate) struct Statements(Mutex<std::collections::HashMap<&'static str, Statement>>);

impl Statements {
    pub(crate) fn get(&self, client: &impl GenericClient, sql: &'static str) -> Result<Statement> {
        if let Some(statement) = lock(&self.0).get(sql) {
            return Ok(statement.clone());
        }
        let statement = wait(client.prepare(sql)).map_err(db)?;
        lock(&self.0).insert(sql, statement.clone());
        Ok(statement)
    }
}

thread_local! {
    /// A writer thread's own runtime, which drives its connection: a round trip then wakes no
    /// other thread.
    static LOCAL: std::cell::OnceCell<tokio::runtime::Runtime> = const { std::cell::OnceCell::new() };
}

/// Gives the current thread a runtime of its own for [`wait`] (a writer thread).
pub(crate) fn local_runtime() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Storage(format!("cannot start a writer's runtime: {e}")))?;
    LOCAL.with(|cell| {
        let _ = cell.set(runtime);
    });
    Ok(())
}

/// Waits for a future on the current thread. On a thread with its own runtime (a writer), the
/// runtime drives the future and the thread's connection. Elsewhere the I/O runs on the
/// store's runtime; on a worker of a multi-threaded tokio runtime (a snapshot read in a
/// session's drain, say), the worker first hands its other tasks to another thread, so a
/// database round trip blocks only the caller.
pub(crate) fn wait<F: Future>(f: F) -> F::Output {
    use tokio::runtime::{Handle, RuntimeFlavor};
    LOCAL.with(|cell| match cell.get() {
        Some(local) => local.block_on(f),
        None => match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| futures::executor::block_on(f))
            }
            _ => futures::executor::block_on(f),
        },
    })
}

/// Runs a blocking call (a wait for a pooled connection); on a worker of a multi-threaded tokio
/// runtime, the worker first hands its other tasks to another thread.
pub(crate) fn wait_for<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Creates the schema and its tables when missing and checks what an existing one holds: the
/// schema version, the record format and the partition count.
fn init(client: &mut Client, config: &PgConfig) -> Result<()> {
    let create = format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL);
         CREATE TABLE IF NOT EXISTS sessions (
             id text COLLATE \"C\" PRIMARY KEY,
             part int NOT NULL,
             created bigint NOT NULL,
             claimed boolean NOT NULL,
             pending boolean NOT NULL,
             record bytea NOT NULL);
         CREATE INDEX IF NOT EXISTS sessions_by_created ON sessions (created DESC, id DESC);
         CREATE INDEX IF NOT EXISTS sessions_working ON sessions (id) WHERE claimed OR pending;
         CREATE TABLE IF NOT EXISTS events (
             session text COLLATE \"C\" NOT NULL,
             seq bigint NOT NULL,
             event bytea NOT NULL,
             PRIMARY KEY (session, seq));
         CREATE TABLE IF NOT EXISTS messages (
             session text COLLATE \"C\" NOT NULL,
             seq bigint NOT NULL,
             message bytea NOT NULL,
             PRIMARY KEY (session, seq));
         CREATE TABLE IF NOT EXISTS message_index (
             id text COLLATE \"C\" PRIMARY KEY,
             session text COLLATE \"C\" NOT NULL,
             entry bytea NOT NULL);
         CREATE TABLE IF NOT EXISTS instructions (
             session text COLLATE \"C\" PRIMARY KEY,
             state bytea NOT NULL);
         CREATE TABLE IF NOT EXISTS schedules (
             session text COLLATE \"C\" NOT NULL,
             id text COLLATE \"C\" NOT NULL,
             schedule bytea NOT NULL,
             PRIMARY KEY (session, id));
         CREATE TABLE IF NOT EXISTS leases (
             part int PRIMARY KEY,
             owner text,
             epoch bigint NOT NULL,
             expires_at timestamptz NOT NULL);
         CREATE TABLE IF NOT EXISTS nodes (
             node text PRIMARY KEY,
             url text NOT NULL,
             seen_at timestamptz NOT NULL);",
        schema = config.schema
    );
    let txn = wait(client.transaction()).map_err(db)?;
    // Concurrent first starts of several nodes create the schema once.
    wait(txn.execute("SELECT pg_advisory_xact_lock(7300417)", &[])).map_err(db)?;
    wait(txn.batch_execute(&create)).map_err(db)?;
    let expected = [
        ("schema", SCHEMA_VERSION.to_owned()),
        ("format", crate::FORMAT_VERSION.to_string()),
        ("partitions", config.partitions.to_string()),
    ];
    for (key, value) in &expected {
        let found = wait(txn.query_opt("SELECT value FROM meta WHERE key = $1", &[key]))
            .map_err(db)?
            .map(|row| row.get::<_, String>(0));
        match found {
            None => {
                wait(txn.execute(
                    "INSERT INTO meta (key, value) VALUES ($1, $2)",
                    &[key, value],
                ))
                .map_err(db)?;
            }
            Some(found) if found == *value => {}
            // An older readable format: its values decode with the current records, so the
            // upgrade rewrites only the version (nodes of the older build then refuse to start).
            Some(found)
                if *key == "format"
                    && found.parse::<u16>().is_ok_and(|v| {
                        (crate::codec::OLDEST_READABLE..crate::FORMAT_VERSION).contains(&v)
                    }) =>
            {
                wait(txn.execute("UPDATE meta SET value = $2 WHERE key = $1", &[key, value]))
                    .map_err(db)?;
            }
            Some(found) => {
                return Err(match *key {
                    "partitions" => Error::Storage(format!(
                        "the cluster in PostgreSQL schema {} uses {found} partitions and this \
                         node is configured with {value}: every node of a cluster must use the \
                         same [cluster] partitions",
                        config.schema
                    )),
                    "format" => Error::FormatVersion {
                        found: found.parse().unwrap_or(0),
                        supported: crate::FORMAT_VERSION,
                    },
                    _ => Error::Storage(format!(
                        "PostgreSQL schema {} holds agenthost tables of schema version {found}; \
                         this build uses {value}",
                        config.schema
                    )),
                });
            }
        }
    }
    let partitions = i32::try_from(config.partitions)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| Error::Storage("partitions must be between 1 and 2^31".into()))?;
    wait(txn.execute(
        "INSERT INTO leases (part, owner, epoch, expires_at)
         SELECT p, NULL, 0, now() FROM generate_series(0, $1 - 1) AS p
         ON CONFLICT (part) DO NOTHING",
        &[&partitions],
    ))
    .map_err(db)?;
    wait(txn.commit()).map_err(db)
}

enum Msg {
    Request(writer::Request),
    Close,
}

/// The PostgreSQL store. Cheap to share behind an `Arc`; [`Store::close`] commits what is
/// queued, releases this node's leases and disconnects.
pub struct PgStore {
    /// One queue per writer; a session's operations always go to the same one.
    tx: Mutex<Option<Vec<mpsc::Sender<Msg>>>>,
    writers: Mutex<Vec<JoinHandle<()>>>,
    partitions: u32,
    stats: Arc<Stats>,
    prompt_limit: usize,
    pool: Arc<snapshot::Pool>,
    leases: Arc<lease::Leases>,
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    schema: String,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .field("node", &self.leases.node())
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects, creates or checks the schema, joins the cluster and takes the partitions this
    /// node's share allows (all of them when it is alone) before returning.
    pub fn open(config: Config, pg: PgConfig) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("store-pg")
            .enable_all()
            .build()
            .map_err(|e| Error::Storage(format!("cannot start the store's runtime: {e}")))?;
        let connector = Connector::new(&pg, rt.handle().clone())?;
        let mut client = connector.connect()?;
        init(&mut client, &pg)?;
        let stats = Arc::new(Stats::default());
        let leases = Arc::new(lease::Leases::new(&pg));
        leases.start(&connector, client)?;
        let pool = Arc::new(snapshot::Pool::new(connector.clone(), pg.pool_size));
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for n in 0..pg.writers.max(1) {
            let writer = writer::Writer::new(
                connector.clone(),
                leases.clone(),
                stats.clone(),
                &config,
                pg.partitions,
            );
            let (tx, rx) = mpsc::channel();
            let handle = std::thread::Builder::new()
                .name(format!("store-pg-writer-{n}"))
                .spawn(move || writer.run(rx))
                .map_err(|e| Error::Storage(format!("cannot start a writer thread: {e}")))?;
            senders.push(tx);
            handles.push(handle);
        }
        Ok(PgStore {
            tx: Mutex::new(Some(senders)),
            writers: Mutex::new(handles),
            partitions: pg.partitions,
            stats,
            prompt_limit: config.prompt_limit,
            pool,
            leases,
            rt: Mutex::new(Some(rt)),
            schema: pg.schema,
        })
    }

    fn submit(&self, op: Op) -> BoxFuture<'static, Result<Outcome>> {
        let (reply, rx) = oneshot::channel();
        let partition = crate::partition_of(writer::session_of(&op), self.partitions) as usize;
        let sent = match lock(&self.tx).as_ref() {
            Some(txs) => txs[partition % txs.len()]
                .send(Msg::Request(writer::Request { op, reply }))
                .is_ok(),
            None => false,
        };
        Box::pin(async move {
            if !sent {
                return Err(Error::Closed);
            }
            rx.await.map_err(|_| Error::Closed)?
        })
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.close();
    }
}

impl Store for PgStore {
    fn create_session(
        &self,
        new: NewSession,
    ) -> BoxFuture<'static, Result<agenthost_model::SessionRow>> {
        crate::expect_outcome(self.submit(Op::Create(new)), |o| match o {
            Outcome::Session(row) => Some(*row),
            _ => None,
        })
    }

    fn admit(&self, admission: Admission) -> BoxFuture<'static, Result<Receipt>> {
        if let Err(e) = admission.prompt.validate(self.prompt_limit) {
            return Box::pin(async move { Err(Error::Invalid(e)) });
        }
        crate::expect_outcome(self.submit(Op::Admit(admission)), |o| match o {
            Outcome::Receipt(r) => Some(r),
            _ => None,
        })
    }

    fn write(
        &self,
        session: SessionId,
        actions: Vec<crate::Action>,
    ) -> BoxFuture<'static, Result<Vec<agenthost_model::Stored>>> {
        crate::expect_outcome(self.submit(Op::Write(session, actions)), crate::events)
    }

    fn snapshot(&self) -> Result<Box<dyn Snapshot>> {
        self.stats.snapshots.inc();
        Ok(Box::new(snapshot::PgSnapshot::begin(self.pool.clone())?))
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn health(&self) -> crate::Health {
        self.leases.health()
    }

    fn local_reads(&self) -> bool {
        false
    }

    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        Some(self.leases.clone())
    }

    fn close(&self) {
        for tx in lock(&self.tx).take().unwrap_or_default() {
            let _ = tx.send(Msg::Close);
        }
        for handle in std::mem::take(&mut *lock(&self.writers)) {
            if handle.join().is_err() {
                tracing::error!("a PostgreSQL writer thread panicked");
            }
        }
        self.leases.stop();
        self.pool.close();
        if let Some(rt) = lock(&self.rt).take() {
            rt.shutdown_background();
        }
    }
}
