//! Group commit on PostgreSQL: a writer thread takes every queued operation (up to `max_batch`)
//! of the partitions it serves,
//! runs them one after another in one transaction, each on the rows of those before it, and
//! answers each once the transaction committed. The transaction first takes `FOR SHARE` on the
//! lease rows of the partitions the batch touches and checks this node holds them at the
//! epochs it took them: an operation on any other partition fails with [`Error::NotOwner`],
//! and a takeover (which updates the lease row) waits for this transaction, so the new owner
//! reads everything this one committed and nothing of it can commit after.
//!
//! Another node may index a message id at the same moment (ids are global): the index insert
//! refuses to overwrite an entry of another session, and the batch runs again on what the
//! database holds then.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use agenthost_model::{MessageId, SessionId};
use tokio::sync::oneshot;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::lease::Leases;
use super::rows::{Batch, Cache, Changes, Encoded, Overlay};
use super::{Connector, Msg, Statements, db, wait};
use crate::error::{Error, Result};
use crate::ops::{self, Op, Outcome};
use crate::{Clock, CommitHook, Config, Stats};

/// Times a batch runs again after another node indexed one of its ids at the same moment.
const ATTEMPTS: usize = 4;

pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<Outcome>>,
}

pub(crate) struct Writer {
    connector: Connector,
    client: Option<Client>,
    /// The statements prepared on `client`.
    statements: Statements,
    cache: Cache,
    /// The version of this node's partitions the cache belongs to.
    cache_version: u64,
    leases: Arc<Leases>,
    /// This node's id, as the lease rows name their owner.
    node: String,
    stats: Arc<Stats>,
    max_batch: usize,
    pending_limit: u32,
    clock: Clock,
    on_commit: Option<CommitHook>,
    partitions: u32,
}

/// Why a batch did not commit.
enum Failed {
    /// Another node indexed an id of the batch concurrently: run it again.
    Again,
    Error(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Error(e)
    }
}

/// The epoch an operation is fenced to, if it carries one ([`crate::Action::Fence`]).
fn fence_of(op: &Op) -> Option<i64> {
    match op {
        Op::Write(_, actions) => actions.iter().find_map(|a| match a {
            crate::Action::Fence(epoch) => Some(*epoch),
            _ => None,
        }),
        Op::Create(_) | Op::Admit(_) => None,
    }
}

pub(crate) fn session_of(op: &Op) -> &SessionId {
    match op {
        Op::Create(new) => &new.id,
        Op::Admit(a) => &a.session,
        Op::Write(session, _) => session,
    }
}

impl Writer {
    pub(crate) fn new(
        connector: Connector,
        leases: Arc<Leases>,
        stats: Arc<Stats>,
        config: &Config,
        partitions: u32,
    ) -> Self {
        Writer {
            connector,
            client: None,
            statements: Statements::default(),
            cache: Cache::default(),
            cache_version: u64::MAX,
            node: crate::cluster::Ownership::node(&*leases).to_owned(),
            leases,
            stats,
            max_batch: config.max_batch.max(1),
            pending_limit: config.pending_limit,
            clock: config.clock.clone(),
            on_commit: config.on_commit.clone(),
            partitions,
        }
    }

    pub(crate) fn run(mut self, rx: mpsc::Receiver<Msg>) {
        if let Err(e) = super::local_runtime() {
            tracing::error!(error = %e, "the PostgreSQL writer cannot start");
            return;
        }
        let mut closing = false;
        while !closing {
            let mut batch = match rx.recv() {
                Ok(Msg::Request(request)) => vec![request],
                Ok(Msg::Close) | Err(_) => break,
            };
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(Msg::Request(request)) => batch.push(request),
                    Ok(Msg::Close) => {
                        closing = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
    }

    fn commit(&mut self, batch: Vec<Request>) {
        let started = Instant::now();
        let ops: Vec<Op> = batch.iter().map(|r| r.op.clone()).collect();
        let mut result = Err(Failed::Again);
        for _ in 0..ATTEMPTS {
            result = self.attempt(&ops);
            if !matches!(result, Err(Failed::Again)) {
                break;
            }
            self.cache.clear();
        }
        match result {
            Ok((outcomes, committed)) => {
                self.stats.record(batch.len(), started.elapsed());
                if let Some(hook) = &self.on_commit
                    && !committed.events.is_empty()
                {
                    hook(&committed.events);
                }
                self.cache.commit(committed);
                for (request, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = request.reply.send(outcome);
                }
            }
            Err(failed) => {
                self.stats.failed_commits.inc();
                self.cache.clear();
                let e = match failed {
                    Failed::Again => Error::Storage(
                        "the batch kept meeting concurrent writes to the message index".into(),
                    ),
                    Failed::Error(e) => e,
                };
                if e.is_io() {
                    // The connection may be broken: the next batch connects again.
                    self.client = None;
                }
                tracing::warn!(error = %e, ops = batch.len(), "a PostgreSQL commit failed");
                for request in batch {
                    let _ = request.reply.send(Err(again(&e)));
                }
            }
        }
    }

    /// Runs the batch in one transaction; the outcome of each operation and what committed.
    fn attempt(&mut self, ops: &[Op]) -> Result<(Vec<Result<Outcome>>, Changes), Failed> {
        let held = self.leases.held();
        if held.version != self.cache_version {
            self.cache.clear();
            self.cache_version = held.version;
        }
        let partitions = self.partitions;
        let mut sessions: Vec<SessionId> = Vec::new();
        let mut ids: Vec<MessageId> = Vec::new();
        let mut parts: HashSet<u32> = HashSet::new();
        for op in ops {
            let session = session_of(op);
            parts.insert(crate::partition_of(session, partitions));
            sessions.push(session.clone());
            match op {
                Op::Admit(a) => ids.push(a.id.clone()),
                Op::Write(_, actions) => ids.extend(actions.iter().filter_map(|a| match a {
                    crate::Action::Append(event) => event.message_id().cloned(),
                    _ => None,
                })),
                Op::Create(_) => {}
            }
        }
        sessions.sort_unstable();
        sessions.dedup();
        let mut client = match self.client.take() {
            Some(client) if !client.is_closed() => client,
            _ => {
                self.statements = Statements::default();
                // On this thread's own runtime (see `wait`).
                wait(self.connector.connect_async())?
            }
        };
        let result = self.run_on(&mut client, ops, held, parts, sessions, ids);
        self.client = Some(client);
        result
    }

    fn run_on(
        &mut self,
        client: &mut Client,
        ops: &[Op],
        held: Arc<super::lease::Held>,
        parts: HashSet<u32>,
        sessions: Vec<SessionId>,
        ids: Vec<MessageId>,
    ) -> Result<(Vec<Result<Outcome>>, Changes), Failed> {
        let now = (self.clock)();
        let (pending_limit, partitions) = (self.pending_limit, self.partitions);
        let txn = wait(client.transaction()).map_err(db)?;
        let parts: Vec<i32> = parts.into_iter().map(|p| p as i32).collect();
        // In partition order, as the lease rounds lock them, so the two never deadlock.
        let check = self.statements.get(
            &txn,
            "SELECT part, owner, epoch FROM leases WHERE part = ANY($1) ORDER BY part FOR SHARE",
        )?;
        let leases = wait(txn.query(&check, &[&parts])).map_err(|e| conflict(&e))?;
        // Each partition's epoch, where this node owns it now.
        let mut owned: HashMap<u32, i64> = HashMap::new();
        for row in leases {
            let part = row.get::<_, i32>(0) as u32;
            let owner: Option<&str> = row.get(1);
            let epoch: i64 = row.get(2);
            if owner == Some(self.node.as_str()) {
                owned.insert(part, epoch);
            }
        }
        let mut batch = Batch::new(&txn, &self.statements, &mut self.cache);
        batch.prefetch(sessions, ids)?;
        let mut outcomes = Vec::with_capacity(ops.len());
        for op in ops {
            let session = session_of(op).clone();
            let partition = crate::partition_of(&session, partitions);
            // At the epoch this node took the lease at, or the one the operation's claim was
            // taken under (a fenced drain's).
            let expected = fence_of(op).or_else(|| held.epochs.get(&partition).copied());
            let ours = owned.get(&partition).is_some_and(|e| Some(*e) == expected);
            if !ours {
                self.stats.fenced.inc();
                outcomes.push(Err(Error::NotOwner { session, partition }));
                continue;
            }
            let mut overlay = Overlay {
                batch: &mut batch,
                changes: Changes::default(),
            };
            match ops::execute(&mut overlay, op.clone(), now, pending_limit) {
                Ok(outcome) => {
                    let changes = overlay.changes;
                    batch.accept(changes);
                    outcomes.push(Ok(outcome));
                }
                // The database failed, not the operation: nothing of the batch commits.
                Err(e) if e.is_io() => return Err(e.into()),
                Err(e) => outcomes.push(Err(e)),
            }
        }
        let changes = std::mem::take(&mut batch.changes);
        drop(batch);
        if !changes.events.is_empty() {
            write(&txn, &self.statements, &changes, partitions)?;
        }
        wait(txn.commit()).map_err(|e| conflict(&e))?;
        Ok((outcomes, changes))
    }
}

/// The statements of a commit, one per table.
const INSERT_EVENTS: &str = "INSERT INTO events (session, seq, event)
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::bytea[])";
const UPSERT_SESSIONS: &str = "INSERT INTO sessions (id, part, created, claimed, pending, record)
     SELECT * FROM UNNEST($1::text[], $2::int4[], $3::int8[], $4::bool[], $5::bool[], $6::bytea[])
     ON CONFLICT (id) DO UPDATE SET claimed = excluded.claimed,
         pending = excluded.pending, record = excluded.record";
const UPSERT_MESSAGES: &str = "INSERT INTO messages (session, seq, message)
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::bytea[])
     ON CONFLICT (session, seq) DO UPDATE SET message = excluded.message";
/// An entry of another session is never overwritten: the count then falls short.
const UPSERT_INDEX: &str = "INSERT INTO message_index (id, session, entry)
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[])
     ON CONFLICT (id) DO UPDATE SET entry = excluded.entry
     WHERE message_index.session = excluded.session";
const UPSERT_INSTRUCTIONS: &str = "INSERT INTO instructions (session, state)
     SELECT * FROM UNNEST($1::text[], $2::bytea[])
     ON CONFLICT (session) DO UPDATE SET state = excluded.state";
const UPSERT_SCHEDULES: &str = "INSERT INTO schedules (session, id, schedule)
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[])
     ON CONFLICT (session, id) DO UPDATE SET schedule = excluded.schedule";
const DELETE_SCHEDULES: &str = "DELETE FROM schedules
     WHERE (session, id) IN (SELECT * FROM UNNEST($1::text[], $2::text[]))";

/// Writes a batch's rows with one statement per table, all sent at once (schedules, which few
/// batches change, with two more: one for the rows set, one for those removed).
fn write(
    txn: &tokio_postgres::Transaction<'_>,
    statements: &Statements,
    changes: &Changes,
    partitions: u32,
) -> Result<(), Failed> {
    let e = Encoded::new(changes, partitions);
    let events = statements.get(txn, INSERT_EVENTS)?;
    let sessions = statements.get(txn, UPSERT_SESSIONS)?;
    let messages = statements.get(txn, UPSERT_MESSAGES)?;
    let index = statements.get(txn, UPSERT_INDEX)?;
    let instructions = statements.get(txn, UPSERT_INSTRUCTIONS)?;
    let event_params: [&(dyn ToSql + Sync); 3] =
        [&e.event_sessions, &e.event_seqs, &e.event_bodies];
    let session_params: [&(dyn ToSql + Sync); 6] = [
        &e.session_ids,
        &e.session_parts,
        &e.session_created,
        &e.session_claimed,
        &e.session_pending,
        &e.session_records,
    ];
    let message_params: [&(dyn ToSql + Sync); 3] =
        [&e.message_sessions, &e.message_seqs, &e.message_bodies];
    let index_params: [&(dyn ToSql + Sync); 3] =
        [&e.index_ids, &e.index_sessions, &e.index_entries];
    let instruction_params: [&(dyn ToSql + Sync); 2] =
        [&e.instruction_sessions, &e.instruction_states];
    let schedule_params: [&(dyn ToSql + Sync); 3] =
        [&e.schedule_sessions, &e.schedule_ids, &e.schedule_bodies];
    let gone_params: [&(dyn ToSql + Sync); 2] = [&e.gone_sessions, &e.gone_ids];
    let schedules = if e.schedule_ids.is_empty() && e.gone_ids.is_empty() {
        None
    } else {
        Some((
            statements.get(txn, UPSERT_SCHEDULES)?,
            statements.get(txn, DELETE_SCHEDULES)?,
        ))
    };
    let schedules = async {
        match &schedules {
            Some((set, removed)) => {
                let (set, removed) = futures::future::join(
                    txn.execute(set, &schedule_params),
                    txn.execute(removed, &gone_params),
                )
                .await;
                set.and(removed).map(|_| ())
            }
            None => Ok(()),
        }
    };
    let ((events, sessions, messages, index, instructions), schedules) =
        wait(futures::future::join(
            futures::future::join5(
                txn.execute(&events, &event_params),
                txn.execute(&sessions, &session_params),
                txn.execute(&messages, &message_params),
                txn.execute(&index, &index_params),
                txn.execute(&instructions, &instruction_params),
            ),
            schedules,
        ));
    for result in [&events, &sessions, &messages, &instructions] {
        if let Err(err) = result {
            return Err(conflict(err));
        }
    }
    if let Err(err) = &schedules {
        return Err(conflict(err));
    }
    match index {
        Ok(n) if n as usize == e.index_ids.len() => Ok(()),
        Ok(_) => Err(Failed::Again),
        Err(err) => Err(conflict(&err)),
    }
}

/// A unique violation is a concurrent write this batch did not see (an index entry added by
/// another node or writer); a deadlock or serialization failure is a concurrent transaction in
/// the way: run again. Anything else fails the batch.
fn conflict(e: &tokio_postgres::Error) -> Failed {
    match e.code() {
        Some(code)
            if *code == SqlState::UNIQUE_VIOLATION
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::T_R_SERIALIZATION_FAILURE =>
        {
            Failed::Again
        }
        _ => Failed::Error(db_ref(e)),
    }
}

fn db_ref(e: &tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(d) => Error::Storage(format!("PostgreSQL: {}", d.message())),
        None => Error::Io(format!("PostgreSQL: {e}")),
    }
}

/// The same failure, for each waiter of a failed batch.
fn again(e: &Error) -> Error {
    match e {
        Error::DiskFull(m) => Error::DiskFull(m.clone()),
        Error::Io(m) => Error::Io(m.clone()),
        other => Error::Storage(other.to_string()),
    }
}
