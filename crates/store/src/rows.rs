//! Rows inside one write transaction, in two layers over the redb tables:
//!
//! - [`Tables`] is the transaction's view. It implements the model's `Projection` and keeps the
//!   rows accepted operations changed in memory, writing each changed row to redb once, when the
//!   batch is done ([`Tables::finish`]). A session that several operations of a batch touch (a
//!   step's start, its text and its end usually commit together) has its row and its assistant
//!   message encoded and inserted once, not once per operation.
//! - [`Overlay`] is one operation's view on top of it. It buffers that operation's writes, so an
//!   operation refused half-way leaves the shared group-commit transaction untouched.
//!
//! Events are the exception: each is inserted into the log when its operation is accepted, as
//! the log is append-only and nothing ever rewrites an event.
//!
//! Events and inbox rows are written to the front of their table when new (see `tiers`);
//! [`fold`] moves the front into the base. Messages, which every step reads back as
//! history, stay in one table.

use std::collections::BTreeMap;

use agenthost_model::{
    InboxRow, IndexEntry, InstructionState, Message, MessageId, Projection, Seq, SessionId,
    SessionRow, Stored,
};
use redb::{ReadableTable, Table, WriteTransaction};

/// The writer's in-memory maps: seeded, so client-chosen ids cannot be crafted to collide.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use crate::codec::{decode, encode};
use crate::error::{Error, Result, storage};
use crate::tables::*;
use crate::tiers::{self, BaseKey, Bytes, FrontKey, Tier, Tiered};

/// One session-keyed table opened for writing, in its two tiers.
struct Pair<'t> {
    what: &'static str,
    base: Table<'t, BaseKey, Bytes>,
    front: Table<'t, FrontKey, Bytes>,
}

impl<'t> Pair<'t> {
    fn open(txn: &'t WriteTransaction, tiers: Tiered) -> Result<Self> {
        Ok(Pair {
            what: tiers.what,
            base: txn.open_table(tiers.base).map_err(storage)?,
            front: txn.open_table(tiers.front).map_err(storage)?,
        })
    }

    fn get<T: serde::de::DeserializeOwned>(
        &self,
        generations: &[u64],
        session: &SessionId,
        seq: Seq,
    ) -> Result<Option<(Tier, T)>> {
        tiers::find(
            &self.base,
            &self.front,
            generations,
            session.as_str(),
            seq.0,
        )?
        .map(|(tier, bytes)| Ok((tier, decode(self.what, &bytes)?)))
        .transpose()
    }

    fn put(&mut self, tier: Tier, session: &SessionId, seq: Seq, bytes: &[u8]) -> Result<()> {
        match tier {
            Tier::Base => self.base.insert((session.as_str(), seq.0), bytes),
            Tier::Front(g) => self.front.insert((g, session.as_str(), seq.0), bytes),
        }
        .map_err(storage)?;
        Ok(())
    }

    fn remove(&mut self, tier: Tier, session: &SessionId, seq: Seq) -> Result<()> {
        match tier {
            Tier::Base => self.base.remove((session.as_str(), seq.0)),
            Tier::Front(g) => self.front.remove((g, session.as_str(), seq.0)),
        }
        .map_err(storage)?;
        Ok(())
    }
}

/// Moves the whole front of the event log and the inbox into their base tables, in base key
/// order so that each base page is copied once, and drops the emptied front tables whole
/// (they are created again, empty, when next opened). Returns how many rows moved. Runs before
/// [`Tables::open`] in the transaction.
pub(crate) fn fold(txn: &WriteTransaction) -> Result<usize> {
    let mut moved = 0;
    for tiers in [EVENT_TIERS, INBOX_TIERS] {
        let mut rows = Vec::new();
        {
            let front = txn.open_table(tiers.front).map_err(storage)?;
            for entry in front.iter().map_err(storage)? {
                let (key, value) = entry.map_err(storage)?;
                let (_, session, seq) = key.value();
                rows.push((session.to_owned(), seq, value.value().to_vec()));
            }
        }
        if rows.is_empty() {
            continue;
        }
        txn.delete_table(tiers.front).map_err(storage)?;
        rows.sort_unstable_by(|a, b| (a.0.as_str(), a.1).cmp(&(b.0.as_str(), b.1)));
        let mut base = txn.open_table(tiers.base).map_err(storage)?;
        for (session, seq, value) in &rows {
            base.insert((session.as_str(), *seq), value.as_slice())
                .map_err(storage)?;
        }
        moved += rows.len();
    }
    Ok(moved)
}

/// Session rows as last committed, kept by the writer across transactions: a session's row is
/// read from a B-tree and decoded once, not once per batch. Only the writer changes rows, so
/// the cache is exact; the writer updates it after each commit and leaves it alone when a
/// commit fails (nothing of that transaction took effect).
pub(crate) type Committed = HashMap<SessionId, SessionRow>;

/// A session row as it is now in the transaction, and what the derived sets held for it when
/// the transaction found it (`None`: the session did not exist).
struct SessionEntry {
    found: Option<Membership>,
    now: Option<SessionRow>,
    changed: bool,
}

/// Whether a session row has a claim and pending input: what the recovery sets mirror.
#[derive(Clone, Copy)]
struct Membership {
    claim: bool,
    pending: bool,
}

impl Membership {
    fn of(row: &SessionRow) -> Self {
        Membership {
            claim: row.claim.is_some(),
            pending: row.pending > 0,
        }
    }
}

/// Every table opened for writing in one transaction, and the rows changed so far.
pub(crate) struct Tables<'t> {
    events: Pair<'t>,
    sessions: Table<'t, &'static str, Bytes>,
    by_created: Table<'t, (u64, &'static str), ()>,
    messages: Table<'t, BaseKey, Bytes>,
    inbox: Pair<'t>,
    index: Table<'t, &'static str, Bytes>,
    instructions: Table<'t, &'static str, Bytes>,
    claims: Table<'t, &'static str, ()>,
    pending: Table<'t, &'static str, ()>,
    /// The front's generations, oldest first; the last is the one new rows go to.
    generations: Vec<u64>,
    /// Rows this transaction added to the front.
    front_rows: usize,
    committed: &'t Committed,
    /// Session rows read or written in this transaction (read ones are cached, not rewritten).
    session_rows: HashMap<SessionId, SessionEntry>,
    changed_messages: HashMap<(SessionId, Seq), Message>,
    /// Where the inbox rows read so far live.
    read_inbox: HashMap<(SessionId, Seq), Tier>,
    /// `None` removes the row.
    changed_inbox: BTreeMap<(SessionId, Seq), Option<InboxRow>>,
    changed_index: HashMap<MessageId, IndexEntry>,
    changed_instructions: HashMap<SessionId, InstructionState>,
}

impl<'t> Tables<'t> {
    /// Opens every table; new rows go to front generation `generation`.
    pub(crate) fn open(
        txn: &'t WriteTransaction,
        generation: u64,
        committed: &'t Committed,
    ) -> Result<Self> {
        let events = Pair::open(txn, EVENT_TIERS)?;
        let inbox = Pair::open(txn, INBOX_TIERS)?;
        let mut generations = Vec::new();
        for pair in [&events, &inbox] {
            generations.extend(tiers::generations(&pair.front)?);
        }
        generations.push(generation);
        generations.sort_unstable();
        generations.dedup();
        Ok(Tables {
            events,
            sessions: txn.open_table(SESSIONS).map_err(storage)?,
            by_created: txn.open_table(SESSIONS_BY_CREATED).map_err(storage)?,
            messages: txn.open_table(MESSAGES).map_err(storage)?,
            inbox,
            index: txn.open_table(INDEX).map_err(storage)?,
            instructions: txn.open_table(INSTRUCTIONS).map_err(storage)?,
            claims: txn.open_table(CLAIMS).map_err(storage)?,
            pending: txn.open_table(PENDING).map_err(storage)?,
            generations,
            front_rows: 0,
            committed,
            session_rows: HashMap::default(),
            changed_messages: HashMap::default(),
            read_inbox: HashMap::default(),
            changed_inbox: BTreeMap::new(),
            changed_index: HashMap::default(),
            changed_instructions: HashMap::default(),
        })
    }

    /// Pending inputs of a session in admission order, as this transaction has them.
    fn pending_inputs(&self, session: &SessionId) -> Result<BTreeMap<Seq, InboxRow>> {
        let mut rows = BTreeMap::new();
        let (base, front) = (&self.inbox.base, &self.inbox.front);
        tiers::for_each(
            base,
            front,
            &self.generations,
            session.as_str(),
            0,
            |seq, bytes| {
                rows.insert(Seq(seq), decode("inbox row", bytes)?);
                Ok(true)
            },
        )?;
        let changed = (session.clone(), Seq::ZERO)..=(session.clone(), Seq(u64::MAX));
        for ((_, seq), row) in self.changed_inbox.range(changed) {
            match row {
                Some(row) => rows.insert(*seq, row.clone()),
                None => rows.remove(seq),
            };
        }
        Ok(rows)
    }

    /// The generation new rows go to.
    fn newest(&self) -> Tier {
        Tier::Front(
            *self
                .generations
                .last()
                .expect("invariant: the current generation"),
        )
    }

    fn put_event(&mut self, session: &SessionId, stored: &Stored) -> Result<()> {
        let newest = self.newest();
        self.events
            .put(newest, session, stored.seq, &encode(stored))?;
        self.front_rows += 1;
        Ok(())
    }

    /// Writes every row changed in this transaction to its table. Called once, after the last
    /// operation of the batch. Returns how many rows the transaction added to the front, and
    /// every session row it read or wrote, as it will be once committed.
    pub(crate) fn finish(mut self) -> Result<(usize, Vec<SessionRow>)> {
        let mut rows = Vec::with_capacity(self.session_rows.len());
        for (id, entry) in std::mem::take(&mut self.session_rows) {
            if let Some(row) = &entry.now
                && entry.changed
            {
                self.write_session(&id, row, entry.found)?;
            }
            rows.extend(entry.now);
        }
        let newest = self.newest();
        for ((session, seq), message) in std::mem::take(&mut self.changed_messages) {
            self.messages
                .insert((session.as_str(), seq.0), encode(&message).as_slice())
                .map_err(storage)?;
        }
        for ((session, seq), row) in std::mem::take(&mut self.changed_inbox) {
            let lives = self.read_inbox.get(&(session.clone(), seq)).copied();
            match (row, lives) {
                (Some(row), lives) => {
                    if lives.is_none() {
                        self.front_rows += 1;
                    }
                    let tier = lives.unwrap_or(newest);
                    self.inbox.put(tier, &session, seq, &encode(&row))?;
                }
                (None, Some(tier)) => self.inbox.remove(tier, &session, seq)?,
                // Added and removed within the batch: never written.
                (None, None) => {}
            }
        }
        for (id, entry) in std::mem::take(&mut self.changed_index) {
            self.index
                .insert(id.as_str(), encode(&entry).as_slice())
                .map_err(storage)?;
        }
        for (session, state) in std::mem::take(&mut self.changed_instructions) {
            self.instructions
                .insert(session.as_str(), encode(&state).as_slice())
                .map_err(storage)?;
        }
        Ok((self.front_rows, rows))
    }

    /// Writes a session row given what the derived sets held for it when the transaction
    /// started, keeping them in step.
    fn write_session(
        &mut self,
        id: &SessionId,
        row: &SessionRow,
        found: Option<Membership>,
    ) -> Result<()> {
        let id = id.as_str();
        self.sessions
            .insert(id, encode(row).as_slice())
            .map_err(storage)?;
        let (had_claim, had_pending) = match found {
            None => {
                self.by_created
                    .insert((row.created.0, id), ())
                    .map_err(storage)?;
                (false, false)
            }
            Some(found) => (found.claim, found.pending),
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
}

impl Projection for Tables<'_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        if let Some(entry) = self.session_rows.get(id) {
            return Ok(entry.now.clone());
        }
        let row: Option<SessionRow> = match self.committed.get(id) {
            Some(row) => Some(row.clone()),
            None => self
                .sessions
                .get(id.as_str())
                .map_err(storage)?
                .map(|v| decode("session row", v.value()))
                .transpose()?,
        };
        self.session_rows.insert(
            id.clone(),
            SessionEntry {
                found: row.as_ref().map(Membership::of),
                now: row.clone(),
                changed: false,
            },
        );
        Ok(row)
    }

    fn put_session(&mut self, row: SessionRow) -> Result<()> {
        if !self.session_rows.contains_key(&row.id) {
            self.session(&row.id)?;
        }
        let entry = self
            .session_rows
            .get_mut(&row.id)
            .expect("invariant: the entry was just read");
        entry.now = Some(row);
        entry.changed = true;
        Ok(())
    }

    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        if let Some(message) = self.changed_messages.get(&(session.clone(), seq)) {
            return Ok(Some(message.clone()));
        }
        let value = self
            .messages
            .get((session.as_str(), seq.0))
            .map_err(storage)?;
        value.map(|v| decode("message", v.value())).transpose()
    }

    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<()> {
        self.changed_messages
            .insert((session.clone(), message.seq()), message);
        Ok(())
    }

    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        let key = (session.clone(), seq);
        if let Some(row) = self.changed_inbox.get(&key) {
            return Ok(row.clone());
        }
        let found = self.inbox.get(&self.generations, session, seq)?;
        Ok(found.map(|(tier, row)| {
            self.read_inbox.insert(key, tier);
            row
        }))
    }

    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<()> {
        self.changed_inbox
            .insert((session.clone(), row.admitted_seq), Some(row));
        Ok(())
    }

    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        // Where the row lives must be known when the batch is written.
        if !self.changed_inbox.contains_key(&(session.clone(), seq)) {
            self.inbox(session, seq)?;
        }
        self.changed_inbox.insert((session.clone(), seq), None);
        Ok(())
    }

    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        if let Some(entry) = self.changed_index.get(id) {
            return Ok(Some(entry.clone()));
        }
        let value = self.index.get(id.as_str()).map_err(storage)?;
        value.map(|v| decode("index entry", v.value())).transpose()
    }

    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<()> {
        self.changed_index.insert(id.clone(), entry);
        Ok(())
    }

    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        if let Some(state) = self.changed_instructions.get(session) {
            return Ok(Some(state.clone()));
        }
        let value = self.instructions.get(session.as_str()).map_err(storage)?;
        value
            .map(|v| decode("instruction state", v.value()))
            .transpose()
    }

    fn put_instructions(&mut self, session: &SessionId, state: InstructionState) -> Result<()> {
        self.changed_instructions.insert(session.clone(), state);
        Ok(())
    }
}

/// Buffers the rows one operation writes. Reads see the operation's own writes first, then the
/// transaction. [`Overlay::flush`] hands everything to the transaction; dropping the overlay
/// instead discards the operation without a trace.
pub(crate) struct Overlay<'a, 't> {
    tables: &'a mut Tables<'t>,
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
            sessions: HashMap::default(),
            messages: HashMap::default(),
            inbox: HashMap::default(),
            index: HashMap::default(),
            instructions: HashMap::default(),
            events: Vec::new(),
        }
    }

    pub(crate) fn record(&mut self, session: &SessionId, stored: Stored) {
        self.events.push((session.clone(), stored));
    }

    /// The events this operation recorded so far, in order.
    pub(crate) fn recorded(&self) -> impl Iterator<Item = &(SessionId, Stored)> {
        self.events.iter()
    }

    /// Pending inputs of a session in admission order, this operation's changes included.
    pub(crate) fn pending_inputs(&self, session: &SessionId) -> Result<Vec<InboxRow>> {
        let mut rows = self.tables.pending_inputs(session)?;
        for ((s, seq), row) in &self.inbox {
            if s != session {
                continue;
            }
            match row {
                Some(row) => rows.insert(*seq, row.clone()),
                None => rows.remove(seq),
            };
        }
        Ok(rows.into_values().collect())
    }

    /// Hands the buffered rows to the transaction, writes the events to the log, and returns
    /// the events in the order they were recorded.
    pub(crate) fn flush(self) -> Result<Vec<(SessionId, Stored)>> {
        let tables = self.tables;
        for (session, stored) in &self.events {
            tables.put_event(session, stored)?;
        }
        for (_, row) in self.sessions {
            tables.put_session(row)?;
        }
        for ((session, _), message) in self.messages {
            tables.put_message(&session, message)?;
        }
        for ((session, seq), row) in self.inbox {
            match row {
                Some(row) => tables.put_inbox(&session, row)?,
                None => tables.remove_inbox(&session, seq)?,
            }
        }
        for (id, entry) in self.index {
            tables.put_index(&id, entry)?;
        }
        for (session, state) in self.instructions {
            tables.put_instructions(&session, state)?;
        }
        Ok(self.events)
    }
}

impl Projection for Overlay<'_, '_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        match self.sessions.get(id) {
            Some(row) => Ok(Some(row.clone())),
            None => self.tables.session(id),
        }
    }
    fn put_session(&mut self, row: SessionRow) -> Result<()> {
        self.sessions.insert(row.id.clone(), row);
        Ok(())
    }
    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        match self.messages.get(&(session.clone(), seq)) {
            Some(m) => Ok(Some(m.clone())),
            None => self.tables.message(session, seq),
        }
    }
    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<()> {
        self.messages
            .insert((session.clone(), message.seq()), message);
        Ok(())
    }
    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        match self.inbox.get(&(session.clone(), seq)) {
            Some(row) => Ok(row.clone()),
            None => self.tables.inbox(session, seq),
        }
    }
    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<()> {
        self.inbox
            .insert((session.clone(), row.admitted_seq), Some(row));
        Ok(())
    }
    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        self.inbox.insert((session.clone(), seq), None);
        Ok(())
    }
    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        match self.index.get(id) {
            Some(entry) => Ok(Some(entry.clone())),
            None => self.tables.index(id),
        }
    }
    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<()> {
        self.index.insert(id.clone(), entry);
        Ok(())
    }
    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        match self.instructions.get(session) {
            Some(state) => Ok(Some(state.clone())),
            None => self.tables.instructions(session),
        }
    }
    fn put_instructions(&mut self, session: &SessionId, state: InstructionState) -> Result<()> {
        self.instructions.insert(session.clone(), state);
        Ok(())
    }
}
