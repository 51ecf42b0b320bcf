//! Rows inside one write transaction: [`Tables`] implements the model's `Projection` over redb
//! tables, and [`Overlay`] buffers one operation's writes so that an operation refused half-way
//! leaves the shared group-commit transaction untouched.

use std::collections::HashMap;

use agenthost_model::{
    InboxRow, IndexEntry, InstructionState, Message, MessageId, Projection, Seq, SessionId,
    SessionRow, Stored,
};
use redb::{ReadableTable, Table, WriteTransaction};

use crate::codec::{decode, encode};
use crate::error::{Error, Result, storage};
use crate::tables::*;

type Bytes = &'static [u8];

/// Every table opened for writing in one transaction.
pub(crate) struct Tables<'t> {
    events: Table<'t, (&'static str, u64), Bytes>,
    sessions: Table<'t, &'static str, Bytes>,
    by_created: Table<'t, (u64, &'static str), ()>,
    messages: Table<'t, (&'static str, u64), Bytes>,
    inbox: Table<'t, (&'static str, u64), Bytes>,
    index: Table<'t, &'static str, Bytes>,
    instructions: Table<'t, &'static str, Bytes>,
    claims: Table<'t, &'static str, ()>,
    pending: Table<'t, &'static str, ()>,
}

impl<'t> Tables<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self> {
        Ok(Tables {
            events: txn.open_table(EVENTS).map_err(storage)?,
            sessions: txn.open_table(SESSIONS).map_err(storage)?,
            by_created: txn.open_table(SESSIONS_BY_CREATED).map_err(storage)?,
            messages: txn.open_table(MESSAGES).map_err(storage)?,
            inbox: txn.open_table(INBOX).map_err(storage)?,
            index: txn.open_table(INDEX).map_err(storage)?,
            instructions: txn.open_table(INSTRUCTIONS).map_err(storage)?,
            claims: txn.open_table(CLAIMS).map_err(storage)?,
            pending: txn.open_table(PENDING).map_err(storage)?,
        })
    }

    /// Pending inputs of a session in admission order.
    pub(crate) fn pending_inputs(&self, session: &SessionId) -> Result<Vec<InboxRow>> {
        let s = session.as_str();
        let mut rows = Vec::new();
        for entry in self.inbox.range((s, 0)..=(s, u64::MAX)).map_err(storage)? {
            let (_, value) = entry.map_err(storage)?;
            rows.push(decode("inbox row", value.value())?);
        }
        Ok(rows)
    }

    /// Writes a session row given the row it replaces, keeping the derived sets in step. The
    /// caller knows `previous` (the overlay read it), which saves decoding the old value.
    fn write_session(&mut self, row: &SessionRow, previous: Option<&SessionRow>) -> Result<()> {
        let id = row.id.as_str();
        self.sessions
            .insert(id, encode(row).as_slice())
            .map_err(storage)?;
        let (had_claim, had_pending) = match previous {
            None => {
                self.by_created
                    .insert((row.created.0, id), ())
                    .map_err(storage)?;
                (false, false)
            }
            Some(old) => (old.claim.is_some(), old.pending > 0),
        };
        // The recovery sets mirror the row, so boot finds its work without scanning sessions.
        // They are written only when membership changes: most events leave them alone.
        match (had_claim, row.claim.is_some()) {
            (false, true) => drop(self.claims.insert(id, ()).map_err(storage)?),
            (true, false) => drop(self.claims.remove(id).map_err(storage)?),
            _ => {}
        }
        match (had_pending, row.pending > 0) {
            (false, true) => drop(self.pending.insert(id, ()).map_err(storage)?),
            (true, false) => drop(self.pending.remove(id).map_err(storage)?),
            _ => {}
        }
        Ok(())
    }

    fn put_event(&mut self, session: &SessionId, stored: &Stored) -> Result<()> {
        let key = (session.as_str(), stored.seq.0);
        self.events
            .insert(key, encode(stored).as_slice())
            .map_err(storage)?;
        Ok(())
    }
}

impl Projection for Tables<'_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        let value = self.sessions.get(id.as_str()).map_err(storage)?;
        value.map(|v| decode("session row", v.value())).transpose()
    }

    fn put_session(&mut self, row: &SessionRow) -> Result<()> {
        let previous = self.session(&row.id)?;
        self.write_session(row, previous.as_ref())
    }

    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        let value = self
            .messages
            .get((session.as_str(), seq.0))
            .map_err(storage)?;
        value.map(|v| decode("message", v.value())).transpose()
    }

    fn put_message(&mut self, session: &SessionId, message: &Message) -> Result<()> {
        let key = (session.as_str(), message.seq().0);
        self.messages
            .insert(key, encode(message).as_slice())
            .map_err(storage)?;
        Ok(())
    }

    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        let value = self.inbox.get((session.as_str(), seq.0)).map_err(storage)?;
        value.map(|v| decode("inbox row", v.value())).transpose()
    }

    fn put_inbox(&mut self, session: &SessionId, row: &InboxRow) -> Result<()> {
        let key = (session.as_str(), row.admitted_seq.0);
        self.inbox
            .insert(key, encode(row).as_slice())
            .map_err(storage)?;
        Ok(())
    }

    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        self.inbox
            .remove((session.as_str(), seq.0))
            .map_err(storage)?;
        Ok(())
    }

    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        let value = self.index.get(id.as_str()).map_err(storage)?;
        value.map(|v| decode("index entry", v.value())).transpose()
    }

    fn put_index(&mut self, id: &MessageId, entry: &IndexEntry) -> Result<()> {
        self.index
            .insert(id.as_str(), encode(entry).as_slice())
            .map_err(storage)?;
        Ok(())
    }

    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        let value = self.instructions.get(session.as_str()).map_err(storage)?;
        value
            .map(|v| decode("instruction state", v.value()))
            .transpose()
    }

    fn put_instructions(&mut self, session: &SessionId, state: &InstructionState) -> Result<()> {
        self.instructions
            .insert(session.as_str(), encode(state).as_slice())
            .map_err(storage)?;
        Ok(())
    }
}

/// Buffers the rows one operation writes. Reads see the operation's own writes first, then the
/// transaction. [`Overlay::flush`] writes everything to the tables; dropping the overlay instead
/// discards the operation without a trace.
pub(crate) struct Overlay<'a, 't> {
    pub(crate) tables: &'a mut Tables<'t>,
    /// Rows as the transaction had them when first read: reads are served from here after the
    /// first, and the flush knows what each session row replaces.
    read_sessions: HashMap<SessionId, Option<SessionRow>>,
    read_index: HashMap<MessageId, Option<IndexEntry>>,
    sessions: HashMap<SessionId, SessionRow>,
    messages: HashMap<(SessionId, Seq), Message>,
    inbox: HashMap<(SessionId, Seq), Option<InboxRow>>,
    index: HashMap<MessageId, IndexEntry>,
    instructions: HashMap<SessionId, InstructionState>,
    events: Vec<(SessionId, Stored)>,
}

impl<'a, 't> Overlay<'a, 't> {
    pub(crate) fn new(tables: &'a mut Tables<'t>) -> Self {
        Overlay {
            tables,
            read_sessions: HashMap::new(),
            read_index: HashMap::new(),
            sessions: HashMap::new(),
            messages: HashMap::new(),
            inbox: HashMap::new(),
            index: HashMap::new(),
            instructions: HashMap::new(),
            events: Vec::new(),
        }
    }

    pub(crate) fn record(&mut self, session: &SessionId, stored: Stored) {
        self.events.push((session.clone(), stored));
    }

    /// Writes the buffered rows and returns the events, in the order they were recorded.
    pub(crate) fn flush(self) -> Result<Vec<(SessionId, Stored)>> {
        let tables = self.tables;
        for (session, stored) in &self.events {
            tables.put_event(session, stored)?;
        }
        for row in self.sessions.values() {
            match self.read_sessions.get(&row.id) {
                Some(previous) => tables.write_session(row, previous.as_ref())?,
                None => tables.put_session(row)?,
            }
        }
        for ((session, _), message) in &self.messages {
            tables.put_message(session, message)?;
        }
        for ((session, seq), row) in &self.inbox {
            match row {
                Some(row) => tables.put_inbox(session, row)?,
                None => tables.remove_inbox(session, *seq)?,
            }
        }
        for (id, entry) in &self.index {
            tables.put_index(id, entry)?;
        }
        for (session, state) in &self.instructions {
            tables.put_instructions(session, state)?;
        }
        Ok(self.events)
    }
}

impl Projection for Overlay<'_, '_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        if let Some(row) = self.sessions.get(id) {
            return Ok(Some(row.clone()));
        }
        if let Some(row) = self.read_sessions.get(id) {
            return Ok(row.clone());
        }
        let row = self.tables.session(id)?;
        self.read_sessions.insert(id.clone(), row.clone());
        Ok(row)
    }
    fn put_session(&mut self, row: &SessionRow) -> Result<()> {
        self.sessions.insert(row.id.clone(), row.clone());
        Ok(())
    }
    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        match self.messages.get(&(session.clone(), seq)) {
            Some(m) => Ok(Some(m.clone())),
            None => self.tables.message(session, seq),
        }
    }
    fn put_message(&mut self, session: &SessionId, message: &Message) -> Result<()> {
        self.messages
            .insert((session.clone(), message.seq()), message.clone());
        Ok(())
    }
    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        match self.inbox.get(&(session.clone(), seq)) {
            Some(row) => Ok(row.clone()),
            None => self.tables.inbox(session, seq),
        }
    }
    fn put_inbox(&mut self, session: &SessionId, row: &InboxRow) -> Result<()> {
        self.inbox
            .insert((session.clone(), row.admitted_seq), Some(row.clone()));
        Ok(())
    }
    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        self.inbox.insert((session.clone(), seq), None);
        Ok(())
    }
    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        if let Some(entry) = self.index.get(id) {
            return Ok(Some(entry.clone()));
        }
        if let Some(entry) = self.read_index.get(id) {
            return Ok(entry.clone());
        }
        let entry = self.tables.index(id)?;
        self.read_index.insert(id.clone(), entry.clone());
        Ok(entry)
    }
    fn put_index(&mut self, id: &MessageId, entry: &IndexEntry) -> Result<()> {
        self.index.insert(id.clone(), entry.clone());
        Ok(())
    }
    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        match self.instructions.get(session) {
            Some(state) => Ok(Some(state.clone())),
            None => self.tables.instructions(session),
        }
    }
    fn put_instructions(&mut self, session: &SessionId, state: &InstructionState) -> Result<()> {
        self.instructions.insert(session.clone(), state.clone());
        Ok(())
    }
}
