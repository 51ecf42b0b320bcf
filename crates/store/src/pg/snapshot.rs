//! Snapshots on PostgreSQL: a `REPEATABLE READ READ ONLY` transaction on a pooled connection,
//! begun (and its snapshot taken) before [`PgSnapshot::begin`] returns, ended when the snapshot
//! is dropped, after which the connection goes back to the pool.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use agenthost_model::{
    InboxRow, IndexEntry, InstructionState, Message, MessageId, Schedule, Seq, SessionId,
    SessionRow, Stored, Timestamp,
};
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use super::rows::session_id;
use super::{Connector, Statements, db, wait, wait_for};
use crate::codec::decode;
use crate::error::{Error, Result};
use crate::lock;
use crate::record::{self, SessionRecord};
use crate::snapshot::Snapshot;

/// Connections for snapshots: at most `size` at once, kept open between snapshots. A snapshot
/// waits (up to [`POOL_WAIT`]) for a connection when all are in use, so a node never opens more
/// than `size` of them, whatever the load.
pub(crate) struct Pool {
    connector: Connector,
    state: Mutex<Slots>,
    freed: Condvar,
    size: usize,
}

struct Slots {
    idle: Vec<Conn>,
    /// Connections lent out.
    lent: usize,
    closed: bool,
}

/// How long a snapshot waits for a connection before it fails.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// A pooled connection and the statements prepared on it.
pub(crate) struct Conn {
    client: Client,
    statements: Statements,
}

impl Pool {
    pub(crate) fn new(connector: Connector, size: usize) -> Self {
        Pool {
            connector,
            state: Mutex::new(Slots {
                idle: Vec::new(),
                lent: 0,
                closed: false,
            }),
            freed: Condvar::new(),
            size: size.max(1),
        }
    }

    /// Lends a connection: an idle one, or a new one while fewer than `size` are open.
    fn get(&self) -> Result<Conn> {
        let idle = {
            let mut slots = lock(&self.state);
            let deadline = Instant::now() + POOL_WAIT;
            loop {
                if slots.closed {
                    return Err(Error::Closed);
                }
                if slots.lent + slots.idle.len() < self.size || !slots.idle.is_empty() {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Io(format!(
                        "PostgreSQL: all {} snapshot connections stayed busy for {POOL_WAIT:?}",
                        self.size
                    )));
                }
                slots = self
                    .freed
                    .wait_timeout(slots, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            slots.lent += 1;
            slots.idle.pop()
        };
        let conn = match idle {
            Some(conn) if !conn.client.is_closed() => Ok(conn),
            _ => self.connector.connect().map(|client| Conn {
                client,
                statements: Statements::default(),
            }),
        };
        if conn.is_err() {
            self.give_back(None);
        }
        conn
    }

    /// Takes a lent connection back (`None`: it is gone).
    fn give_back(&self, conn: Option<Conn>) {
        let mut slots = lock(&self.state);
        slots.lent = slots.lent.saturating_sub(1);
        if let Some(conn) = conn
            && !slots.closed
            && !conn.client.is_closed()
        {
            slots.idle.push(conn);
        }
        drop(slots);
        self.freed.notify_one();
    }

    pub(crate) fn close(&self) {
        let mut slots = lock(&self.state);
        slots.closed = true;
        slots.idle.clear();
        drop(slots);
        self.freed.notify_all();
    }
}

pub(crate) struct PgSnapshot {
    conn: Option<Conn>,
    pool: Arc<Pool>,
}

/// Rows read per query when reading a log in pages.
const PAGE: i64 = 256;

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PgSnapshot {
    pub(crate) fn begin(pool: Arc<Pool>) -> Result<Self> {
        let conn = wait_for(|| pool.get())?;
        // The snapshot is taken by the first statement of the transaction: run one now, so
        // the snapshot sees what was durable when it was asked for and nothing later.
        let begun = wait(
            conn.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1"),
        );
        if let Err(e) = begun {
            pool.give_back(None);
            return Err(db(e));
        }
        Ok(PgSnapshot {
            conn: Some(conn),
            pool,
        })
    }

    fn conn(&self) -> &Conn {
        self.conn
            .as_ref()
            .expect("invariant: the connection is taken only on drop")
    }

    fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let conn = self.conn();
        let statement = conn.statements.get(&conn.client, sql)?;
        wait(conn.client.query(&statement, params)).map_err(db)
    }

    fn record(&self, id: &SessionId) -> Result<Option<SessionRecord>> {
        let rows = self.query("SELECT record FROM sessions WHERE id = $1", &[&id.as_str()])?;
        rows.first()
            .map(|r| decode("session record", r.get(0)))
            .transpose()
    }

    fn ids(&self, sql: &'static str) -> Result<Vec<SessionId>> {
        self.query(sql, &[])?
            .iter()
            .map(|r| session_id(r.get(0)))
            .collect()
    }
}

impl Drop for PgSnapshot {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // End the transaction on the store's runtime, so that dropping never waits.
        let pool = self.pool.clone();
        pool.connector.rt.clone().spawn(async move {
            let ended = conn.client.batch_execute("ROLLBACK").await.is_ok();
            pool.give_back(ended.then_some(conn));
        });
    }
}

impl Snapshot for PgSnapshot {
    fn session(&self, id: &SessionId) -> Result<Option<SessionRow>> {
        Ok(self.record(id)?.map(|r| r.row))
    }

    fn sessions(
        &self,
        cursor: Option<(Timestamp, SessionId)>,
        limit_to: usize,
    ) -> Result<Vec<SessionRow>> {
        let n = limit(limit_to);
        let rows = match &cursor {
            Some((created, id)) => self.query(
                "SELECT record FROM sessions WHERE (created, id) < ($1, $2)
                 ORDER BY created DESC, id DESC LIMIT $3",
                &[&(created.0 as i64), &id.as_str(), &n],
            )?,
            None => self.query(
                "SELECT record FROM sessions ORDER BY created DESC, id DESC LIMIT $1",
                &[&n],
            )?,
        };
        rows.iter()
            .map(|r| decode::<SessionRecord>("session record", r.get(0)).map(|r| r.row))
            .collect()
    }

    fn messages(&self, id: &SessionId, from: Seq, limit_to: usize) -> Result<Vec<Message>> {
        self.query(
            "SELECT message FROM messages WHERE session = $1 AND seq >= $2
             ORDER BY seq LIMIT $3",
            &[&id.as_str(), &(from.0 as i64), &limit(limit_to)],
        )?
        .iter()
        .map(|r| decode("message", r.get(0)))
        .collect()
    }

    fn pending(&self, id: &SessionId) -> Result<Vec<InboxRow>> {
        let seqs: Vec<i64> = self.pending_seqs(id)?.iter().map(|s| s.0 as i64).collect();
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self.query(
            "SELECT event FROM events WHERE session = $1 AND seq = ANY($2) ORDER BY seq",
            &[&id.as_str(), &seqs],
        )?;
        if rows.len() != seqs.len() {
            return Err(Error::Corrupt {
                what: format!("pending inputs of {id}"),
                reason: "an admission is missing from the log".into(),
            });
        }
        rows.iter()
            .map(|r| record::inbox_row(id, decode::<Stored>("event", r.get(0))?))
            .collect()
    }

    fn pending_seqs(&self, id: &SessionId) -> Result<Vec<Seq>> {
        Ok(self
            .record(id)?
            .map(|r| r.inbox.seqs().collect())
            .unwrap_or_default())
    }

    fn instructions(&self, id: &SessionId) -> Result<InstructionState> {
        let rows = self.query(
            "SELECT state FROM instructions WHERE session = $1",
            &[&id.as_str()],
        )?;
        Ok(rows
            .first()
            .map(|r| decode("instruction state", r.get(0)))
            .transpose()?
            .unwrap_or_default())
    }

    fn index(&self, id: &MessageId) -> Result<Option<IndexEntry>> {
        let rows = self.query(
            "SELECT entry FROM message_index WHERE id = $1",
            &[&id.as_str()],
        )?;
        rows.first()
            .map(|r| decode("index entry", r.get(0)))
            .transpose()
    }

    fn events(&self, id: &SessionId, from: Seq, limit_to: usize) -> Result<Vec<Stored>> {
        self.events_within(id, from, limit_to, usize::MAX)
    }

    fn events_within(
        &self,
        id: &SessionId,
        from: Seq,
        limit_to: usize,
        max_bytes: usize,
    ) -> Result<Vec<Stored>> {
        let mut out = Vec::new();
        let mut read = 0usize;
        let mut next = from.0 as i64;
        while out.len() < limit_to && read < max_bytes {
            let page = PAGE.min(limit(limit_to - out.len()));
            let rows = self.query(
                "SELECT seq, event FROM events WHERE session = $1 AND seq >= $2
                 ORDER BY seq LIMIT $3",
                &[&id.as_str(), &next, &page],
            )?;
            for row in &rows {
                let bytes: &[u8] = row.get(1);
                out.push(decode("event", bytes)?);
                read = read.saturating_add(bytes.len());
                next = row.get::<_, i64>(0) + 1;
                if read >= max_bytes {
                    break;
                }
            }
            if (rows.len() as i64) < page {
                break;
            }
        }
        Ok(out)
    }

    fn claimed(&self) -> Result<Vec<SessionId>> {
        self.ids("SELECT id FROM sessions WHERE claimed ORDER BY id")
    }

    fn with_pending(&self) -> Result<Vec<SessionId>> {
        self.ids("SELECT id FROM sessions WHERE pending ORDER BY id")
    }

    fn schedules(&self, id: &SessionId) -> Result<Vec<Schedule>> {
        self.query(
            "SELECT schedule FROM schedules WHERE session = $1 ORDER BY id",
            &[&id.as_str()],
        )?
        .iter()
        .map(|r| decode("schedule", r.get(0)))
        .collect()
    }

    fn all_schedules(&self) -> Result<Vec<(SessionId, Schedule)>> {
        let rows = self.query(
            "SELECT session, schedule FROM schedules ORDER BY session, id",
            &[],
        )?;
        let mut out: Vec<(SessionId, Schedule)> = Vec::with_capacity(rows.len());
        for row in &rows {
            let session: &str = row.get(0);
            // Consecutive rows share their session: parse its id once, share the copy.
            let id = match out.last() {
                Some((last, _)) if last.as_str() == session => last.clone(),
                _ => session_id(session)?,
            };
            out.push((id, decode("schedule", row.get(1))?));
        }
        Ok(out)
    }
}
