//! The rows an operation reads and writes on PostgreSQL, in three layers: the operation's own
//! changes, then the batch's (operations committed together, before this one), then what this
//! node knows committed (`Cache`, valid while it holds the session's partition at the same
//! epoch), then the database, read inside the batch's transaction.

use std::collections::HashMap;

use agenthost_model::{
    InboxRow, IndexEntry, InstructionState, Message, MessageId, Projection, Schedule, ScheduleId,
    Seq, SessionId, SessionRow, Stored,
};
use tokio_postgres::Transaction;

use super::{Statements, db, wait};
use crate::codec::decode;
use crate::error::{Error, Result};
use crate::ops::Rows;
use crate::record::{self, SessionRecord};

/// Sessions, and index entries, whose rows the cache holds at most; beyond either it starts
/// again empty.
const CACHED_SESSIONS: usize = 100_000;
const CACHED_INDEX: usize = 1_000_000;

/// Rows changed (by an operation, or by the operations of a batch so far).
#[derive(Debug, Default)]
pub(crate) struct Changes {
    pub(crate) records: HashMap<SessionId, SessionRecord>,
    pub(crate) messages: HashMap<(SessionId, Seq), Message>,
    pub(crate) inputs: HashMap<(SessionId, Seq), InboxRow>,
    pub(crate) index: HashMap<MessageId, IndexEntry>,
    pub(crate) instructions: HashMap<SessionId, InstructionState>,
    /// `None`: the schedule is removed.
    pub(crate) schedules: HashMap<(SessionId, ScheduleId), Option<Schedule>>,
    pub(crate) events: Vec<(SessionId, Stored)>,
}

impl Changes {
    fn absorb(&mut self, other: Changes) {
        self.records.extend(other.records);
        self.messages.extend(other.messages);
        self.inputs.extend(other.inputs);
        self.index.extend(other.index);
        self.instructions.extend(other.instructions);
        self.schedules.extend(other.schedules);
        self.events.extend(other.events);
    }
}

/// Committed rows this node wrote or read, for the sessions of the partitions it holds. Only
/// this node writes them while it holds the partition, so they stay true until the partition
/// changes hands (the writer clears the cache whenever this node's partitions change).
#[derive(Debug, Default)]
pub(crate) struct Cache {
    records: HashMap<SessionId, SessionRecord>,
    /// Pending inputs by session, read back at promotion.
    inputs: HashMap<SessionId, HashMap<Seq, InboxRow>>,
    instructions: HashMap<SessionId, Option<InstructionState>>,
    /// The newest message of each session: the one a step updates.
    latest: HashMap<SessionId, Message>,
    /// Index entries of this node's sessions (an entry never moves to another session, and only
    /// the session's owner changes it).
    index: HashMap<MessageId, IndexEntry>,
}

impl Cache {
    pub(crate) fn clear(&mut self) {
        *self = Cache::default();
    }

    /// Takes in what a batch committed.
    pub(crate) fn commit(&mut self, changes: Changes) {
        if self.records.len() > CACHED_SESSIONS || self.index.len() > CACHED_INDEX {
            self.clear();
        }
        self.index.extend(changes.index);
        for ((session, seq), message) in changes.messages {
            let newer = self.latest.get(&session).is_none_or(|m| m.seq() <= seq);
            if newer {
                self.latest.insert(session, message);
            }
        }
        for ((session, seq), row) in changes.inputs {
            self.inputs.entry(session).or_default().insert(seq, row);
        }
        for (session, state) in changes.instructions {
            self.instructions.insert(session, Some(state));
        }
        for (session, record) in changes.records {
            if let Some(inputs) = self.inputs.get_mut(&session) {
                inputs.retain(|seq, _| record.inbox.waiting(*seq));
            }
            self.records.insert(session, record);
        }
    }
}

/// A batch in its transaction: the operations committed so far and the rows they read.
pub(crate) struct Batch<'a> {
    pub(crate) txn: &'a Transaction<'a>,
    pub(crate) statements: &'a Statements,
    pub(crate) cache: &'a mut Cache,
    pub(crate) changes: Changes,
    /// Index entries read for this batch, absent ones included (another node may add an entry
    /// at any time, so an absence is never cached beyond the batch).
    pub(crate) index: HashMap<MessageId, Option<IndexEntry>>,
    /// Sessions found missing in this batch.
    pub(crate) missing: std::collections::HashSet<SessionId>,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(
        txn: &'a Transaction<'a>,
        statements: &'a Statements,
        cache: &'a mut Cache,
    ) -> Self {
        Batch {
            txn,
            statements,
            cache,
            changes: Changes::default(),
            index: HashMap::new(),
            missing: Default::default(),
        }
    }

    /// Reads the records of `sessions` and the index entries of `ids` (those the cache does not
    /// hold) in two queries, so the operations that follow rarely wait for the database.
    pub(crate) fn prefetch(&mut self, sessions: Vec<SessionId>, ids: Vec<MessageId>) -> Result<()> {
        let unknown: Vec<&str> = sessions
            .iter()
            .filter(|s| !self.cache.records.contains_key(*s))
            .map(SessionId::as_str)
            .collect();
        if !unknown.is_empty() {
            let rows = wait(self.txn.query(
                &self.statements.get(
                    self.txn,
                    "SELECT id, record FROM sessions WHERE id = ANY($1)",
                )?,
                &[&unknown],
            ))
            .map_err(db)?;
            for row in rows {
                let id = session_id(row.get(0))?;
                let record: SessionRecord = decode("session record", row.get(1))?;
                self.cache.records.insert(id, record);
            }
            for s in &sessions {
                if !self.cache.records.contains_key(s) {
                    self.missing.insert(s.clone());
                }
            }
        }
        let ids: Vec<MessageId> = ids
            .into_iter()
            .filter(|id| !self.cache.index.contains_key(id))
            .collect();
        if !ids.is_empty() {
            let keys: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
            let rows = wait(self.txn.query(
                &self.statements.get(
                    self.txn,
                    "SELECT id, entry FROM message_index WHERE id = ANY($1)",
                )?,
                &[&keys],
            ))
            .map_err(db)?;
            for id in ids {
                self.index.insert(id, None);
            }
            for row in rows {
                let id = MessageId::parse(row.get::<_, &str>(0)).map_err(|e| Error::Corrupt {
                    what: "message index key".into(),
                    reason: e.to_string(),
                })?;
                self.index
                    .insert(id, Some(decode("index entry", row.get(1))?));
            }
        }
        Ok(())
    }

    fn record(&mut self, id: &SessionId) -> Result<Option<&SessionRecord>> {
        if self.changes.records.contains_key(id) {
            return Ok(self.changes.records.get(id));
        }
        if !self.cache.records.contains_key(id) {
            if self.missing.contains(id) {
                return Ok(None);
            }
            let statement = self
                .statements
                .get(self.txn, "SELECT record FROM sessions WHERE id = $1")?;
            let row = wait(self.txn.query_opt(&statement, &[&id.as_str()])).map_err(db)?;
            match row {
                Some(row) => {
                    let record = decode("session record", row.get(0))?;
                    self.cache.records.insert(id.clone(), record);
                }
                None => {
                    self.missing.insert(id.clone());
                    return Ok(None);
                }
            }
        }
        Ok(self.cache.records.get(id))
    }

    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        if let Some(m) = self.changes.messages.get(&(session.clone(), seq)) {
            return Ok(Some(m.clone()));
        }
        if let Some(m) = self.cache.latest.get(session).filter(|m| m.seq() == seq) {
            return Ok(Some(m.clone()));
        }
        let row = wait(self.txn.query_opt(
            &self.statements.get(
                self.txn,
                "SELECT message FROM messages WHERE session = $1 AND seq = $2",
            )?,
            &[&session.as_str(), &(seq.0 as i64)],
        ))
        .map_err(db)?;
        row.map(|r| decode("message", r.get(0))).transpose()
    }

    fn input(&mut self, session: &SessionId, seq: Seq) -> Result<InboxRow> {
        let key = (session.clone(), seq);
        if let Some(row) = self.changes.inputs.get(&key).or_else(|| {
            self.cache
                .inputs
                .get(session)
                .and_then(|inputs| inputs.get(&seq))
        }) {
            return Ok(row.clone());
        }
        let row = wait(self.txn.query_opt(
            &self.statements.get(
                self.txn,
                "SELECT event FROM events WHERE session = $1 AND seq = $2",
            )?,
            &[&session.as_str(), &(seq.0 as i64)],
        ))
        .map_err(db)?
        .ok_or_else(|| Error::Corrupt {
            what: format!("pending input {session}/{seq}"),
            reason: "its event is missing from the log".into(),
        })?;
        let row = record::inbox_row(session, decode::<Stored>("event", row.get(0))?)?;
        self.cache
            .inputs
            .entry(session.clone())
            .or_default()
            .insert(seq, row.clone());
        Ok(row)
    }

    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        if let Some(entry) = self.changes.index.get(id) {
            return Ok(Some(entry.clone()));
        }
        if let Some(found) = self.index.get(id) {
            return Ok(found.clone());
        }
        if let Some(entry) = self.cache.index.get(id) {
            return Ok(Some(entry.clone()));
        }
        let row = wait(
            self.txn.query_opt(
                &self
                    .statements
                    .get(self.txn, "SELECT entry FROM message_index WHERE id = $1")?,
                &[&id.as_str()],
            ),
        )
        .map_err(db)?;
        let found: Option<IndexEntry> = row.map(|r| decode("index entry", r.get(0))).transpose()?;
        self.index.insert(id.clone(), found.clone());
        Ok(found)
    }

    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        if let Some(state) = self.changes.instructions.get(session) {
            return Ok(Some(state.clone()));
        }
        if let Some(state) = self.cache.instructions.get(session) {
            return Ok(state.clone());
        }
        let row = wait(self.txn.query_opt(
            &self.statements.get(
                self.txn,
                "SELECT state FROM instructions WHERE session = $1",
            )?,
            &[&session.as_str()],
        ))
        .map_err(db)?;
        let state: Option<InstructionState> = row
            .map(|r| decode("instruction state", r.get(0)))
            .transpose()?;
        self.cache
            .instructions
            .insert(session.clone(), state.clone());
        Ok(state)
    }

    /// A schedule as the batch has it: its own change first, else the database's row (schedules
    /// change seldom, so the cache does not hold them).
    fn schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<Option<Schedule>> {
        if let Some(schedule) = self.changes.schedules.get(&(session.clone(), id.clone())) {
            return Ok(schedule.clone());
        }
        let row = wait(self.txn.query_opt(
            &self.statements.get(
                self.txn,
                "SELECT schedule FROM schedules WHERE session = $1 AND id = $2",
            )?,
            &[&session.as_str(), &id.as_str()],
        ))
        .map_err(db)?;
        row.map(|r| decode("schedule", r.get(0))).transpose()
    }

    /// Takes in an operation that succeeded.
    pub(crate) fn accept(&mut self, op: Changes) {
        self.changes.absorb(op);
    }
}

pub(crate) fn session_id(key: &str) -> Result<SessionId> {
    SessionId::parse(key).map_err(|e| Error::Corrupt {
        what: format!("session key {key:?}"),
        reason: e.to_string(),
    })
}

/// One operation's view: its own changes over the batch's.
pub(crate) struct Overlay<'b, 'a> {
    pub(crate) batch: &'b mut Batch<'a>,
    pub(crate) changes: Changes,
}

impl Overlay<'_, '_> {
    fn record(&mut self, id: &SessionId) -> Result<Option<&SessionRecord>> {
        if self.changes.records.contains_key(id) {
            return Ok(self.changes.records.get(id));
        }
        self.batch.record(id)
    }

    /// The session's record, copied into this operation's changes for writing.
    fn record_mut(&mut self, id: &SessionId) -> Result<Option<&mut SessionRecord>> {
        if !self.changes.records.contains_key(id) {
            let Some(record) = self.batch.record(id)?.cloned() else {
                return Ok(None);
            };
            self.changes.records.insert(id.clone(), record);
        }
        Ok(self.changes.records.get_mut(id))
    }
}

impl Rows for Overlay<'_, '_> {
    fn peek<T>(&mut self, id: &SessionId, f: impl FnOnce(&SessionRow) -> T) -> Result<Option<T>> {
        Ok(self.record(id)?.map(|r| f(&r.row)))
    }

    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<InboxRow>> {
        let seqs: Vec<Seq> = match self.record(session)? {
            Some(record) => record.inbox.seqs().collect(),
            None => return Ok(Vec::new()),
        };
        seqs.into_iter()
            .map(|seq| self.inbox(session, seq).map(|row| row.into_iter()))
            .collect::<Result<Vec<_>>>()
            .map(|rows| rows.into_iter().flatten().collect())
    }

    fn record(&mut self, session: &SessionId, stored: Stored) {
        self.changes.events.push((session.clone(), stored));
    }

    fn recorded(&self) -> &[(SessionId, Stored)] {
        &self.changes.events
    }
}

impl Projection for Overlay<'_, '_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        Ok(Overlay::record(self, id)?.map(|r| r.row.clone()))
    }

    fn put_session(&mut self, row: SessionRow) -> Result<()> {
        match self.record_mut(&row.id)? {
            Some(record) => record.row = row,
            None => {
                self.changes.records.insert(
                    row.id.clone(),
                    SessionRecord {
                        row,
                        inbox: Default::default(),
                        trails: false,
                    },
                );
            }
        }
        Ok(())
    }

    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        match self.changes.messages.get(&(session.clone(), seq)) {
            Some(m) => Ok(Some(m.clone())),
            None => self.batch.message(session, seq),
        }
    }

    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<()> {
        self.changes
            .messages
            .insert((session.clone(), message.seq()), message);
        Ok(())
    }

    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        let waiting = Overlay::record(self, session)?.is_some_and(|r| r.inbox.waiting(seq));
        if !waiting {
            return Ok(None);
        }
        if let Some(row) = self.changes.inputs.get(&(session.clone(), seq)) {
            return Ok(Some(row.clone()));
        }
        self.batch.input(session, seq).map(Some)
    }

    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<()> {
        if let Some(record) = self.record_mut(session)? {
            record.inbox.add(row.admitted_seq);
        }
        self.changes
            .inputs
            .insert((session.clone(), row.admitted_seq), row);
        Ok(())
    }

    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        if let Some(record) = self.record_mut(session)? {
            record.inbox.remove(seq);
        }
        self.changes.inputs.remove(&(session.clone(), seq));
        Ok(())
    }

    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        match self.changes.index.get(id) {
            Some(entry) => Ok(Some(entry.clone())),
            None => self.batch.index(id),
        }
    }

    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<()> {
        self.changes.index.insert(id.clone(), entry);
        Ok(())
    }

    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        match self.changes.instructions.get(session) {
            Some(state) => Ok(Some(state.clone())),
            None => self.batch.instructions(session),
        }
    }

    fn put_instructions(&mut self, session: &SessionId, state: InstructionState) -> Result<()> {
        self.changes.instructions.insert(session.clone(), state);
        Ok(())
    }

    fn schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<Option<Schedule>> {
        match self.changes.schedules.get(&(session.clone(), id.clone())) {
            Some(schedule) => Ok(schedule.clone()),
            None => self.batch.schedule(session, id),
        }
    }

    fn put_schedule(&mut self, session: &SessionId, schedule: Schedule) -> Result<()> {
        self.changes
            .schedules
            .insert((session.clone(), schedule.id.clone()), Some(schedule));
        Ok(())
    }

    fn remove_schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<()> {
        self.changes
            .schedules
            .insert((session.clone(), id.clone()), None);
        Ok(())
    }
}

/// Encoded rows, ready for the bulk statements of a commit.
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    pub(crate) event_sessions: Vec<String>,
    pub(crate) event_seqs: Vec<i64>,
    pub(crate) event_bodies: Vec<Vec<u8>>,
    pub(crate) session_ids: Vec<String>,
    pub(crate) session_parts: Vec<i32>,
    pub(crate) session_created: Vec<i64>,
    pub(crate) session_claimed: Vec<bool>,
    pub(crate) session_pending: Vec<bool>,
    pub(crate) session_records: Vec<Vec<u8>>,
    pub(crate) message_sessions: Vec<String>,
    pub(crate) message_seqs: Vec<i64>,
    pub(crate) message_bodies: Vec<Vec<u8>>,
    pub(crate) index_ids: Vec<String>,
    pub(crate) index_sessions: Vec<String>,
    pub(crate) index_entries: Vec<Vec<u8>>,
    pub(crate) instruction_sessions: Vec<String>,
    pub(crate) instruction_states: Vec<Vec<u8>>,
    pub(crate) schedule_sessions: Vec<String>,
    pub(crate) schedule_ids: Vec<String>,
    pub(crate) schedule_bodies: Vec<Vec<u8>>,
    /// Schedules removed.
    pub(crate) gone_sessions: Vec<String>,
    pub(crate) gone_ids: Vec<String>,
}

impl Encoded {
    pub(crate) fn new(changes: &Changes, partitions: u32) -> Self {
        let mut out = Encoded::default();
        for (session, stored) in &changes.events {
            out.event_sessions.push(session.as_str().to_owned());
            out.event_seqs.push(stored.seq.0 as i64);
            out.event_bodies.push(crate::codec::encode(stored));
        }
        for (id, record) in &changes.records {
            out.session_ids.push(id.as_str().to_owned());
            out.session_parts
                .push(crate::partition_of(id, partitions) as i32);
            out.session_created.push(record.row.created.0 as i64);
            out.session_claimed.push(record.row.claim.is_some());
            out.session_pending.push(record.row.pending > 0);
            out.session_records.push(crate::codec::encode(record));
        }
        for ((session, seq), message) in &changes.messages {
            out.message_sessions.push(session.as_str().to_owned());
            out.message_seqs.push(seq.0 as i64);
            out.message_bodies.push(crate::codec::encode(message));
        }
        for (id, entry) in &changes.index {
            out.index_ids.push(id.as_str().to_owned());
            out.index_sessions.push(entry.session().as_str().to_owned());
            out.index_entries.push(crate::codec::encode(entry));
        }
        for (session, state) in &changes.instructions {
            out.instruction_sessions.push(session.as_str().to_owned());
            out.instruction_states.push(crate::codec::encode(state));
        }
        for ((session, id), schedule) in &changes.schedules {
            match schedule {
                Some(schedule) => {
                    out.schedule_sessions.push(session.as_str().to_owned());
                    out.schedule_ids.push(id.as_str().to_owned());
                    out.schedule_bodies.push(crate::codec::encode(schedule));
                }
                None => {
                    out.gone_sessions.push(session.as_str().to_owned());
                    out.gone_ids.push(id.as_str().to_owned());
                }
            }
        }
        out
    }
}
