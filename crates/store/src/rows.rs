//! Rows of one batch of operations, in two layers, and the writes they come to:
//!
//! - [`Tables`] is the batch's view. It reads through a read transaction (what is committed),
//!   under the rows of the batches still being committed ([`Changes`]) and the writer's caches,
//!   implements the model's `Projection`, and keeps the rows accepted operations changed in
//!   memory. [`Tables::finish`] encodes each changed row once into [`Writes`], which the commit
//!   thread inserts. A session that several operations of a batch touch (a step's start, its text
//!   and its end usually commit together) has its row and its assistant message encoded and
//!   written once, not once per operation.
//! - [`Overlay`] is one operation's view on top of it. It buffers that operation's writes, so an
//!   operation refused half-way leaves the batch untouched.
//!
//! Events are written to the front of the log when new; the fold (see `log`) moves the front
//! into the base. Messages, which every step reads back as history, stay in one table. Pending
//! inputs are listed in their session's record (see `record`), which names the events that
//! hold them. A schedule fired for the last time, or cancelled, is a row removed: a change
//! of a schedule is `None` when it removes the row.

use std::collections::BTreeMap;

use agenthost_model::{
    Event, InboxRow, IndexEntry, InstructionState, Message, MessageId, Projection, Schedule,
    ScheduleId, Seq, SessionId, SessionRow, Stored,
};
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, WriteTransaction};

/// The writer's in-memory maps: seeded, so client-chosen ids cannot be crafted to collide.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use crate::codec::{self, decode, encode};
use crate::error::{Error, Result, storage};
use crate::log::{self, BaseKey, Bytes};
use crate::ops::Rows;
use crate::record::{self, Inbox, SessionRecord};
use crate::tables::*;

/// What the writer keeps across batches, as of the last batch it planned: session records, so a
/// session's record is read from its B-tree and decoded once, not once per batch; and the
/// pending inputs it admitted or read, so a promotion a few commits after the admission does not
/// read the prompt back from the log; an input leaves it when a batch promotes it, so it holds
/// what is pending, not what was. Only the writer changes records, and an input's row never
/// changes, so the cache is exact. It runs ahead of what is durable by at most the batch being
/// committed; when a commit fails the writer drops the whole cache (nothing of that batch, or of
/// the one planned on top of it, took effect).
pub(crate) struct Committed {
    /// Each with how many admissions it is ahead of the record stored (see `record`).
    records: Recent<SessionId, (SessionRecord, u32)>,
    /// Rows of inputs that were pending when cached. Whether one still is comes from its
    /// session's inbox, never from here.
    inputs: Recent<(SessionId, Seq), InboxRow>,
}

/// Most sessions (and most inputs) one generation of the cache holds: the writer keeps at most
/// twice as many.
const CACHED_SESSIONS: usize = 65_536;
const CACHED_INPUTS: usize = 16_384;

impl Default for Committed {
    fn default() -> Self {
        Committed {
            records: Recent::new(CACHED_SESSIONS),
            inputs: Recent::new(CACHED_INPUTS),
        }
    }
}

impl Committed {
    /// Takes in the records a committed transaction read or wrote, and the inputs it admitted or
    /// read that were still pending at its end.
    #[cfg(test)]
    fn update(
        &mut self,
        records: impl ExactSizeIterator<Item = SessionRecord>,
        inputs: impl ExactSizeIterator<Item = ((SessionId, Seq), InboxRow)>,
    ) {
        let records = records.map(|record| (record.row.id.clone(), (record, 0)));
        self.records.extend(records.len(), records);
        self.inputs.extend(inputs.len(), inputs);
    }

    fn get(&self, id: &SessionId) -> Option<&SessionRecord> {
        self.records.get(id).map(|(record, _)| record)
    }

    /// Takes in what a batch read and wrote, once it is handed over; returns the batch's
    /// session entries emptied, for the next batch to fill without growing them again.
    pub(crate) fn take(&mut self, cached: Cached) -> SessionEntries {
        let mut sessions = cached.sessions;
        // Sessions the batch read and found missing have no record to keep.
        let most = sessions.len();
        let records =
            (sessions.entries.drain(..)).filter_map(|(id, e)| Some((id, (e.now?, e.trail))));
        self.records.extend(most, records);
        sessions.clear();
        self.inputs
            .extend(cached.inputs.len(), cached.inputs.into_iter());
        for key in &cached.promoted {
            self.inputs.remove(key);
        }
        sessions
    }
}

/// Two generations make an approximate LRU at the cost of a second lookup: entries go to
/// `recent`, which shadows `older`; when `recent` is full it becomes `older` and the previous
/// `older` is dropped. So the entries in use stay cached however many others come and go.
struct Recent<K, V> {
    recent: HashMap<K, V>,
    older: HashMap<K, V>,
    /// Most entries one generation holds.
    capacity: usize,
}

impl<K: std::hash::Hash + Eq, V> Recent<K, V> {
    fn new(capacity: usize) -> Self {
        Recent {
            recent: HashMap::default(),
            older: HashMap::default(),
            capacity,
        }
    }

    /// Takes in `entries`, at most `most` of them.
    fn extend(&mut self, most: usize, entries: impl Iterator<Item = (K, V)>) {
        if self.recent.len() + most > self.capacity {
            // The dropped generation's table, emptied, takes the new entries: it has grown to
            // a generation's size already, so they go in without a rehash.
            std::mem::swap(&mut self.older, &mut self.recent);
            self.recent.clear();
        }
        self.recent.extend(entries);
    }

    fn get(&self, key: &K) -> Option<&V> {
        self.recent.get(key).or_else(|| self.older.get(key))
    }

    fn remove(&mut self, key: &K) {
        self.recent.remove(key);
        self.older.remove(key);
    }
}

/// Reads a session's record as it is now, and how many admissions it is ahead of the record
/// stored: from the writer's cache, else from the table and the log after it.
fn load(
    committed: &Committed,
    sessions: &impl ReadableTable<&'static str, Bytes>,
    events: &log::ReadLog,
    id: &SessionId,
) -> Result<Option<(SessionRecord, u32)>> {
    if let Some(cached) = committed.records.get(id) {
        return Ok(Some(cached.clone()));
    }
    let Some(mut record) = read_record(sessions, id.as_str())? else {
        return Ok(None);
    };
    let trail = catch_up(&mut record, events)?;
    Ok(Some((record, trail)))
}

/// Applies to a stored record the admissions its log holds after it (see `record`); returns
/// how many.
pub(crate) fn catch_up(record: &mut SessionRecord, events: &log::ReadLog) -> Result<u32> {
    if !record.may_trail() {
        return Ok(0);
    }
    let mut trail = 0;
    let id = record.row.id.clone();
    events.for_each(id.as_str(), record.row.last_seq.0 + 1, |_, bytes| {
        record.admit(&decode::<Stored>("event", bytes)?)?;
        trail += 1;
        Ok(true)
    })?;
    Ok(trail)
}

fn read_record(
    sessions: &impl ReadableTable<&'static str, Bytes>,
    id: &str,
) -> Result<Option<SessionRecord>> {
    sessions
        .get(id)
        .map_err(storage)?
        .map(|v| decode("session record", v.value()))
        .transpose()
}

/// Takes out of the working set (`tables::WORKING`) every session that no longer holds a claim
/// or pending input, as the transaction has its record. Runs when the store opens; a batch that
/// folds the front lists its own (see [`Tables::finish`]). Returns how many were taken out.
pub(crate) fn prune_working(txn: &WriteTransaction) -> Result<usize> {
    let sessions = txn.open_table(SESSIONS).map_err(storage)?;
    let mut working = txn.open_table(WORKING).map_err(storage)?;
    let mut idle = Vec::new();
    for entry in working.iter().map_err(storage)? {
        let (key, _) = entry.map_err(storage)?;
        if !read_record(&sessions, key.value())?.is_some_and(|r| r.working()) {
            idle.push(key.value().to_owned());
        }
    }
    for id in &idle {
        working.remove(id.as_str()).map_err(storage)?;
    }
    Ok(idle.len())
}

/// A session's record as it is now in the transaction, and whether the session was working
/// when the transaction found it (`None`: it did not exist).
pub(crate) struct SessionEntry {
    found: Option<bool>,
    now: Option<SessionRecord>,
    /// Admissions `now` is ahead of the record stored, or of the one this batch writes.
    trail: u32,
    /// Changed by an operation whose rows are not encoded yet.
    dirty: bool,
    /// Listed in `sessions_by_created`, or put in the working set, by this batch already.
    listed: bool,
    joined: bool,
}

/// The rows a batch writes, encoded, for the commit thread to insert. Each table's rows are put
/// in key order when the batch is handed over, so that the committer inserts them page after
/// page as redb lays them out, and a row an operation changes again replaces its earlier
/// encoding.
#[derive(Default)]
pub(crate) struct Writes {
    /// Runs of events for the front: `(session, first seq)` → run, all in one generation.
    front: Written<(SessionId, Seq), Vec<u8>>,
    /// The generation of the front they go to (see `log::Front::place`).
    pub(crate) generation: u64,
    sessions: Written<SessionId, Vec<u8>>,
    by_created: Vec<(u64, SessionId)>,
    working: Vec<SessionId>,
    /// Sessions to take out of the working set, after the rows above (see [`Tables::finish`]).
    idle: Vec<SessionId>,
    messages: Written<(SessionId, Seq), Vec<u8>>,
    index: Written<MessageId, Vec<u8>>,
    instructions: Written<SessionId, Vec<u8>>,
    /// `None`: the schedule is removed.
    schedules: Written<(SessionId, ScheduleId), Option<Vec<u8>>>,
}

/// One table's rows as a batch wrote them, a key possibly more than once, until
/// [`Written::sort`] leaves each key once, with the value written last, in key order. (Pushing
/// and sorting once costs less than keeping an ordered map as the rows come.) Each row carries
/// its place in the order written.
pub(crate) struct Written<K, V>(Vec<(K, usize, V)>);

impl<K, V> Default for Written<K, V> {
    fn default() -> Self {
        Written(Vec::new())
    }
}

impl<K: Ord, V> Written<K, V> {
    fn with_capacity(capacity: usize) -> Self {
        Written(Vec::with_capacity(room(capacity)))
    }

    fn insert(&mut self, key: K, value: V) {
        let place = self.0.len();
        self.0.push((key, place, value));
    }

    fn sort(&mut self) {
        // A key's rows end up in the order written, so the last of each run of equal keys is
        // the one kept.
        self.0
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let rows = &mut self.0;
        let mut kept = 0;
        for i in 0..rows.len() {
            if i + 1 < rows.len() && rows[i].0 == rows[i + 1].0 {
                continue;
            }
            rows.swap(kept, i);
            kept += 1;
        }
        rows.truncate(kept);
    }

    fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(key, _, value)| (key, value))
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Writes {
    /// Room for as many rows as the last batch wrote.
    fn with_capacity(sizes: Sizes) -> Self {
        Writes {
            front: Written::with_capacity(sizes.sessions),
            sessions: Written::with_capacity(sizes.sessions),
            messages: Written::with_capacity(sizes.messages),
            index: Written::with_capacity(sizes.index),
            ..Writes::default()
        }
    }

    /// Puts each table's rows in key order, each row once (see [`Written`]).
    fn sort(&mut self) {
        self.front.sort();
        self.sessions.sort();
        self.messages.sort();
        self.index.sort();
        self.instructions.sort();
        self.schedules.sort();
    }

    /// Inserts every row into its table. Every table is opened, so that all of them exist for
    /// readers whatever the batch wrote.
    pub(crate) fn apply(&self, txn: &WriteTransaction) -> Result<()> {
        let mut front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
        let runs: Vec<_> = self
            .front
            .iter()
            .map(|((session, first), run)| {
                ((self.generation, session.as_str(), first.0), run.as_slice())
            })
            .collect();
        put_sorted(&mut front, &runs)?;
        put_by_id(
            txn,
            SESSIONS,
            self.sessions.iter().map(|(id, v)| (id.as_str(), v)),
        )?;
        let mut by_created = txn.open_table(SESSIONS_BY_CREATED).map_err(storage)?;
        for (created, id) in &self.by_created {
            by_created
                .insert((*created, id.as_str()), ())
                .map_err(storage)?;
        }
        let mut working = txn.open_table(WORKING).map_err(storage)?;
        for id in &self.working {
            working.insert(id.as_str(), ()).map_err(storage)?;
        }
        let mut messages = txn.open_table(MESSAGES).map_err(storage)?;
        for ((session, seq), message) in self.messages.iter() {
            messages
                .insert((session.as_str(), seq.0), message.as_slice())
                .map_err(storage)?;
        }
        put_by_id(
            txn,
            INDEX,
            self.index.iter().map(|(id, v)| (id.as_str(), v)),
        )?;
        put_by_id(
            txn,
            INSTRUCTIONS,
            self.instructions.iter().map(|(id, v)| (id.as_str(), v)),
        )?;
        let mut schedules = txn.open_table(SCHEDULES).map_err(storage)?;
        for ((session, id), schedule) in self.schedules.iter() {
            let key = (session.as_str(), id.as_str());
            match schedule {
                Some(schedule) => schedules.insert(key, schedule.as_slice()),
                None => schedules.remove(key),
            }
            .map_err(storage)?;
        }
        for id in &self.idle {
            working.remove(id.as_str()).map_err(storage)?;
        }
        txn.open_table(EVENTS).map_err(storage)?;
        txn.open_table(EVENTS_MIDDLE).map_err(storage)?;
        Ok(())
    }
}

/// Inserts rows given in ascending key order. Those above the table's greatest key (a new
/// generation of the front, minted ids in the index, new sessions) go in through one cursor at
/// the table's end, which redb splices in with one update of their parents instead of a descent
/// per row; the others (a row changed again, a key among the existing ones) one at a time.
fn put_sorted<'r, K: redb::Key + 'static>(
    table: &mut redb::Table<'_, K, Bytes>,
    rows: &[(K::SelfType<'r>, &'r [u8])],
) -> Result<()> {
    let last: Option<Vec<u8>> = table
        .last()
        .map_err(storage)?
        .map(|(key, _)| K::as_bytes(&key.value()).as_ref().to_vec());
    let above = rows.partition_point(|(key, _)| {
        last.as_deref().is_some_and(|last| {
            K::compare(K::as_bytes(key).as_ref(), last) != std::cmp::Ordering::Greater
        })
    });
    for (key, value) in &rows[..above] {
        table.insert(key, *value).map_err(storage)?;
    }
    if above < rows.len() {
        let mut end = table
            .upper_bound_mut(std::ops::Bound::<K::SelfType<'r>>::Unbounded)
            .map_err(storage)?;
        for (key, value) in &rows[above..] {
            end.insert_before(key, *value).map_err(storage)?;
        }
        end.close().map_err(storage)?;
    }
    Ok(())
}

/// Puts rows keyed by an id, given in key order, into one table (see [`put_sorted`]).
fn put_by_id<'a>(
    txn: &WriteTransaction,
    table: redb::TableDefinition<'static, &'static str, Bytes>,
    rows: impl Iterator<Item = (&'a str, &'a Vec<u8>)>,
) -> Result<()> {
    let rows: Vec<(&str, &[u8])> = rows.map(|(id, value)| (id, value.as_slice())).collect();
    put_sorted(&mut txn.open_table(table).map_err(storage)?, &rows)
}

/// The rows a batch changed, decoded: what the next batch, planned while this one is being
/// committed, reads in place of the tables. Session records and pending inputs are in the
/// writer's cache instead.
#[derive(Default)]
pub(crate) struct Changes {
    messages: HashMap<(SessionId, Seq), Message>,
    index: HashMap<MessageId, IndexEntry>,
    instructions: HashMap<SessionId, InstructionState>,
    /// `None`: the batch removed the schedule.
    schedules: HashMap<(SessionId, ScheduleId), Option<Schedule>>,
    /// Sessions the batch put in the working set.
    working: HashSet<SessionId>,
    /// Whether the batch's commit prunes the working set, so that which sessions are in it is
    /// not known until it is durable.
    pub(crate) prunes: bool,
}

/// How many rows of each kind a batch held in memory. The next batch's maps start as large as
/// the last one's ended, so that batches of a steady size do not rehash them as they fill.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Sizes {
    sessions: usize,
    inputs: usize,
    messages: usize,
    index: usize,
    read_index: usize,
}

/// Room for a batch a little larger than one of `rows`: a vector that has to grow copies what
/// it holds.
pub(crate) fn room(rows: usize) -> usize {
    rows + rows / 4
}

fn map_of<K, V>(capacity: usize) -> HashMap<K, V> {
    HashMap::with_capacity_and_hasher(capacity, Default::default())
}

/// What [`Tables::finish`] hands over.
pub(crate) struct Finished {
    /// Rows added to the front.
    pub(crate) front_rows: usize,
    pub(crate) writes: Writes,
    pub(crate) changes: Changes,
    /// The batch's work for the writer's caches, once the batch is handed over.
    pub(crate) cached: Cached,
    pub(crate) sizes: Sizes,
}

/// Every session record the batch read or wrote, as it will be once committed, and the pending
/// inputs it wrote or read.
pub(crate) struct Cached {
    sessions: SessionEntries,
    inputs: HashMap<(SessionId, Seq), InboxRow>,
    /// Inputs the batch took out of their inbox: no longer pending, so the cache lets them go.
    promoted: Vec<(SessionId, Seq)>,
}

/// The tables of one batch: read through a read transaction under the batches being
/// committed, and the rows changed so far.
pub(crate) struct Tables<'t> {
    events: log::ReadLog,
    sessions: ReadOnlyTable<&'static str, Bytes>,
    messages: ReadOnlyTable<BaseKey, Bytes>,
    index: ReadOnlyTable<&'static str, Bytes>,
    instructions: ReadOnlyTable<&'static str, Bytes>,
    schedules: ReadOnlyTable<(&'static str, &'static str), Bytes>,
    working: ReadOnlyTable<&'static str, ()>,
    writes: Writes,
    /// Rows this batch added to the front.
    front_rows: usize,
    committed: &'t Committed,
    /// The batches being committed, which the read transaction does not see yet, newest first.
    in_flight: Vec<&'t Changes>,
    /// Session records read or written in this batch (read ones are not rewritten).
    session_rows: SessionEntries,
    /// Rows changed by the current operation, encoded into `writes` when it is flushed (the
    /// sessions by their place in `session_rows`).
    dirty_sessions: Vec<usize>,
    dirty_messages: Vec<(SessionId, Seq)>,
    dirty_index: Vec<MessageId>,
    dirty_instructions: Vec<SessionId>,
    dirty_schedules: Vec<(SessionId, ScheduleId)>,
    /// Sessions this batch put in the working set.
    joined: HashSet<SessionId>,
    changed_messages: HashMap<(SessionId, Seq), Message>,
    /// Pending inputs whose event this batch wrote or read.
    inputs: HashMap<(SessionId, Seq), InboxRow>,
    /// Inputs this batch took out of their inbox.
    promoted: Vec<(SessionId, Seq)>,
    changed_index: HashMap<MessageId, IndexEntry>,
    /// Index entries read from the table (`None`: absent), as an admission checks its id and the
    /// projector checks it again.
    read_index: HashMap<MessageId, Option<IndexEntry>>,
    /// The greatest id in the index table when the read transaction began. Minted ids sort by
    /// time, so a new one is usually greater and known absent without a lookup.
    index_last: Option<String>,
    changed_instructions: HashMap<SessionId, InstructionState>,
    /// `None`: removed in this batch.
    changed_schedules: HashMap<(SessionId, ScheduleId), Option<Schedule>>,
    /// The current operation's own rows (see [`Overlay`]).
    op: OpRows,
}

impl<'t> Tables<'t> {
    /// Opens every table for reading. `in_flight` are the batches being committed, newest
    /// first: `txn` must have begun after every earlier batch was durable. `sizes` are the last
    /// batch's; `sessions` the entries an earlier batch handed back, empty (or new ones).
    pub(crate) fn open(
        txn: &ReadTransaction,
        committed: &'t Committed,
        in_flight: Vec<&'t Changes>,
        sizes: Sizes,
        mut sessions: SessionEntries,
    ) -> Result<Self> {
        sessions.reserve(sizes.sessions);
        let events = log::ReadLog::open(txn)?;
        let index: ReadOnlyTable<&'static str, Bytes> = txn.open_table(INDEX).map_err(storage)?;
        let index_last = index
            .last()
            .map_err(storage)?
            .map(|(key, _)| key.value().to_owned());
        Ok(Tables {
            events,
            sessions: txn.open_table(SESSIONS).map_err(storage)?,
            messages: txn.open_table(MESSAGES).map_err(storage)?,
            index,
            instructions: txn.open_table(INSTRUCTIONS).map_err(storage)?,
            schedules: txn.open_table(SCHEDULES).map_err(storage)?,
            working: txn.open_table(WORKING).map_err(storage)?,
            writes: Writes::with_capacity(sizes),
            front_rows: 0,
            committed,
            in_flight,
            session_rows: sessions,
            dirty_sessions: Vec::new(),
            dirty_messages: Vec::new(),
            dirty_index: Vec::new(),
            dirty_instructions: Vec::new(),
            dirty_schedules: Vec::new(),
            joined: HashSet::default(),
            changed_messages: map_of(sizes.messages),
            inputs: map_of(sizes.inputs),
            promoted: Vec::new(),
            changed_index: map_of(sizes.index),
            read_index: map_of(sizes.read_index),
            index_last,
            changed_instructions: HashMap::default(),
            changed_schedules: HashMap::default(),
            op: OpRows::default(),
        })
    }

    /// The session's entry, read once per transaction.
    fn entry(&mut self, id: &SessionId) -> Result<&mut SessionEntry> {
        entry_in(
            &mut self.session_rows,
            self.committed,
            &self.sessions,
            &self.events,
            id,
        )
    }

    /// Reads from the session's row without copying it.
    fn peek<T>(&mut self, id: &SessionId, f: impl FnOnce(&SessionRow) -> T) -> Result<Option<T>> {
        Ok(self.entry(id)?.now.as_ref().map(|record| f(&record.row)))
    }

    /// The session's record as this transaction has it, marked changed, for changing its
    /// inbox.
    fn inbox_of(&mut self, session: &SessionId) -> Result<&mut Inbox> {
        if self.entry(session)?.now.is_none() {
            return Err(Error::Corrupt {
                what: format!("inbox of {session}"),
                reason: "the session has no record".into(),
            });
        }
        let record = self.touch(session)?.now.as_mut();
        Ok(&mut record.expect("invariant: checked above").inbox)
    }

    /// Pending inputs of a session in admission order, as this transaction has them.
    fn pending_inputs(&mut self, session: &SessionId) -> Result<BTreeMap<Seq, InboxRow>> {
        let seqs: Vec<Seq> = match &self.entry(session)?.now {
            Some(record) => record.inbox.seqs().collect(),
            None => Vec::new(),
        };
        let mut rows = BTreeMap::new();
        for seq in seqs {
            if let Some(row) = self.inbox(session, seq)? {
                rows.insert(seq, row);
            }
        }
        Ok(rows)
    }

    /// Writes one operation's consecutive events of a session to the front, as one run.
    fn put_events(&mut self, session: &SessionId, events: &[(SessionId, Stored)]) -> Result<()> {
        let Some((_, first)) = events.first() else {
            return Ok(());
        };
        // A run of one event is the event's record itself (see `codec::run`): encoded once,
        // not copied.
        let value = match events {
            [(_, one)] => encode(one),
            _ => {
                let encoded: Vec<Vec<u8>> = events.iter().map(|(_, s)| encode(s)).collect();
                codec::run(&encoded.iter().map(Vec::as_slice).collect::<Vec<_>>())
            }
        };
        self.writes
            .front
            .insert((session.clone(), first.seq), value);
        self.front_rows += events.len();
        Ok(())
    }

    /// Marks a session's record changed by the current operation.
    fn touch(&mut self, id: &SessionId) -> Result<&mut SessionEntry> {
        let at = entry_at(
            &mut self.session_rows,
            self.committed,
            &self.sessions,
            &self.events,
            id,
        )?;
        let entry = &mut self.session_rows.entries[at].1;
        if !entry.dirty {
            entry.dirty = true;
            self.dirty_sessions.push(at);
        }
        Ok(entry)
    }

    /// Encodes the rows the operation just flushed changed, so that handing the batch over
    /// costs no encoding. `events` are the operation's. The lists of changed rows are emptied,
    /// not dropped: the next operation fills them again.
    fn encode_changed(&mut self, events: &[(SessionId, Stored)]) -> Result<()> {
        let admissions_only = events
            .iter()
            .all(|(_, stored)| matches!(stored.event, Event::PromptAdmitted { .. }));
        let mut sessions = std::mem::take(&mut self.dirty_sessions);
        for &at in &sessions {
            let id = &self.session_rows.entries[at].0;
            let admitted = match admissions_only {
                true => events.iter().filter(|(session, _)| session == id).count(),
                false => 0,
            };
            self.write_session(at, admitted as u32)?;
        }
        sessions.clear();
        self.dirty_sessions = sessions;
        for key in self.dirty_messages.drain(..) {
            if let Some(message) = self.changed_messages.get(&key) {
                self.writes.messages.insert(key, encode(message));
            }
        }
        for id in self.dirty_index.drain(..) {
            if let Some(entry) = self.changed_index.get(&id) {
                self.writes.index.insert(id, encode(entry));
            }
        }
        for session in self.dirty_instructions.drain(..) {
            if let Some(state) = self.changed_instructions.get(&session) {
                self.writes.instructions.insert(session, encode(state));
            }
        }
        for key in self.dirty_schedules.drain(..) {
            if let Some(schedule) = self.changed_schedules.get(&key) {
                self.writes
                    .schedules
                    .insert(key, schedule.as_ref().map(encode));
            }
        }
        Ok(())
    }

    /// Hands the batch over: its encoded rows, its changed rows for the next batch to read, and
    /// what the caches take. Called once, after the last operation. With `prune`, the batch also
    /// takes out of the working set every session that is idle once it commits, as the writer
    /// knows them: the batch folds the front, and that is when the set sheds idle sessions.
    pub(crate) fn finish(mut self, prune: bool) -> Result<Finished> {
        if prune {
            self.writes.idle = self.idle_sessions()?;
        }
        self.writes.sort();
        let sizes = Sizes {
            sessions: self.session_rows.len(),
            inputs: self.inputs.len(),
            messages: self.changed_messages.len(),
            index: self.changed_index.len(),
            read_index: self.read_index.len(),
        };
        Ok(Finished {
            sizes,
            front_rows: self.front_rows,
            writes: std::mem::take(&mut self.writes),
            changes: Changes {
                messages: std::mem::take(&mut self.changed_messages),
                index: std::mem::take(&mut self.changed_index),
                instructions: std::mem::take(&mut self.changed_instructions),
                schedules: std::mem::take(&mut self.changed_schedules),
                working: std::mem::take(&mut self.joined),
                prunes: false,
            },
            cached: Cached {
                sessions: std::mem::take(&mut self.session_rows),
                inputs: std::mem::take(&mut self.inputs),
                promoted: std::mem::take(&mut self.promoted),
            },
        })
    }

    /// Sessions in the working set, or put there by a batch not yet durable, that hold neither a
    /// claim nor pending input once this batch commits.
    fn idle_sessions(&mut self) -> Result<Vec<SessionId>> {
        let mut listed: HashSet<SessionId> = self
            .in_flight
            .iter()
            .flat_map(|changes| changes.working.iter().cloned())
            .collect();
        for entry in self.working.iter().map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            let id = SessionId::parse(key.value()).map_err(|e| Error::Corrupt {
                what: format!("working session {:?}", key.value()),
                reason: e.to_string(),
            })?;
            listed.insert(id);
        }
        let mut idle = Vec::new();
        for id in listed {
            let working = match self.session_rows.get(&id) {
                Some(entry) => entry.now.as_ref().is_some_and(SessionRecord::working),
                // A record that trails its log has pending input already, so the stored one
                // says whether the session works.
                None => match self.committed.get(&id) {
                    Some(record) => record.working(),
                    None => read_record(&self.sessions, id.as_str())?.is_some_and(|r| r.working()),
                },
            };
            if !working {
                idle.push(id);
            }
        }
        Ok(idle)
    }

    /// Encodes a session's record, lists a new session by creation time, and puts the session
    /// in the working set when its work starts: when it was not working as the batch found it
    /// and the set does not hold it already. (A later operation of the batch may leave it idle
    /// again; the next fold prunes it then.) `admitted`: how many admissions of the session the
    /// operation made, when it made nothing else. Admissions queued behind pending input write
    /// the record marked as trailing, or nothing when the record they follow is marked and
    /// stays within [`record::MAX_TRAIL`] of the log (see `record`).
    fn write_session(&mut self, at: usize, admitted: u32) -> Result<()> {
        let (id, entry) = &mut self.session_rows.entries[at];
        entry.dirty = false;
        let Some(record) = &mut entry.now else {
            return Ok(());
        };
        let id = id.clone();
        // Admissions queued behind pending input: the first writes the record marked, the
        // next ones leave it as it is.
        let queued = admitted > 0 && record.row.pending.saturating_sub(admitted) > 0;
        if queued && record.trails && entry.trail + admitted <= record::MAX_TRAIL {
            entry.trail += admitted;
        } else {
            record.trails = queued;
            entry.trail = 0;
            self.writes.sessions.insert(id.clone(), encode(&*record));
        }
        let record = &*record;
        if entry.found.is_none() && !entry.listed {
            entry.listed = true;
            self.writes
                .by_created
                .push((record.row.created.0, id.clone()));
        }
        // A session working when the batch began is in the set already. One whose work starts
        // now may still be there from an earlier turn: the set is pruned only when the front is
        // folded, so a busy session costs a lookup here, not a write per turn.
        let starts = record.working() && !entry.found.unwrap_or(false) && !entry.joined;
        if starts {
            entry.joined = true;
            if !self.in_working_set(&id)? {
                self.writes.working.push(id.clone());
                self.joined.insert(id);
            }
        }
        Ok(())
    }

    /// Whether the session is in the working set once the batches being committed are durable;
    /// false when one of them prunes the set, so that the session is put in again.
    fn in_working_set(&self, id: &SessionId) -> Result<bool> {
        for changes in &self.in_flight {
            if changes.working.contains(id) {
                return Ok(true);
            }
            if changes.prunes {
                return Ok(false);
            }
        }
        Ok(self.working.get(id.as_str()).map_err(storage)?.is_some())
    }

    /// A row the batches being committed changed, newest first.
    fn in_flight<'a, K, V>(
        &'a self,
        rows: impl Fn(&'a Changes) -> &'a HashMap<K, V>,
        key: &K,
    ) -> Option<&'a V>
    where
        K: std::hash::Hash + Eq + 'a,
        V: 'a,
    {
        self.in_flight
            .iter()
            .find_map(|changes| rows(changes).get(key))
    }
}

/// A session's entry in `rows`, read from the cache or the table the first time the batch
/// needs it.
fn entry_in<'m>(
    rows: &'m mut SessionEntries,
    committed: &Committed,
    sessions: &impl ReadableTable<&'static str, Bytes>,
    events: &log::ReadLog,
    id: &SessionId,
) -> Result<&'m mut SessionEntry> {
    let at = entry_at(rows, committed, sessions, events, id)?;
    Ok(&mut rows.entries[at].1)
}

/// The place of a session's entry in `rows` (see [`entry_in`]).
fn entry_at(
    rows: &mut SessionEntries,
    committed: &Committed,
    sessions: &impl ReadableTable<&'static str, Bytes>,
    events: &log::ReadLog,
    id: &SessionId,
) -> Result<usize> {
    if let Some(at) = rows.find(id) {
        return Ok(at);
    }
    let (found, trail) = match load(committed, sessions, events, id)? {
        Some((record, trail)) => (Some(record), trail),
        None => (None, 0),
    };
    Ok(rows.insert(
        id.clone(),
        SessionEntry {
            found: found.as_ref().map(SessionRecord::working),
            now: found,
            trail,
            dirty: false,
            listed: false,
            joined: false,
        },
    ))
}

/// The session entries of a batch, in the order it first needed them, found by id through a
/// map. The last one found is remembered: an operation looks its session up several times in a
/// row, and comparing ids costs less than hashing one. Handed from batch to batch emptied, so
/// that the vector and the map keep the room the largest batch needed.
pub(crate) struct SessionEntries {
    at: HashMap<SessionId, usize>,
    entries: Vec<(SessionId, SessionEntry)>,
    /// The place of the entry found last (`usize::MAX` before the first).
    last: usize,
}

impl Default for SessionEntries {
    fn default() -> Self {
        SessionEntries {
            at: HashMap::default(),
            entries: Vec::new(),
            last: usize::MAX,
        }
    }
}

impl SessionEntries {
    /// Room for `rows` entries (see [`room`]).
    fn reserve(&mut self, rows: usize) {
        let more = room(rows).saturating_sub(self.entries.len());
        self.entries.reserve(more);
        self.at.reserve(more);
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.at.clear();
        self.last = usize::MAX;
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry's place, remembered as the last one found.
    fn find(&mut self, id: &SessionId) -> Option<usize> {
        if self
            .entries
            .get(self.last)
            .is_some_and(|(last, _)| last == id)
        {
            return Some(self.last);
        }
        let at = *self.at.get(id)?;
        self.last = at;
        Some(at)
    }

    fn get(&self, id: &SessionId) -> Option<&SessionEntry> {
        self.at.get(id).map(|&at| &self.entries[at].1)
    }

    /// Adds the entry of a session the batch has none of yet; returns its place.
    fn insert(&mut self, id: SessionId, entry: SessionEntry) -> usize {
        let at = self.entries.len();
        self.at.insert(id.clone(), at);
        self.entries.push((id, entry));
        self.last = at;
        at
    }
}

impl Projection for Tables<'_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        Ok(self
            .entry(id)?
            .now
            .as_ref()
            .map(|record| record.row.clone()))
    }

    fn put_session(&mut self, row: SessionRow) -> Result<()> {
        let entry = self.touch(&row.id)?;
        match &mut entry.now {
            Some(record) => record.row = row,
            None => {
                entry.now = Some(SessionRecord {
                    row,
                    inbox: Default::default(),
                    trails: false,
                })
            }
        }
        Ok(())
    }

    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        let key = (session.clone(), seq);
        if let Some(message) = self
            .changed_messages
            .get(&key)
            .or_else(|| self.in_flight(|c| &c.messages, &key))
        {
            return Ok(Some(message.clone()));
        }
        let value = self
            .messages
            .get((session.as_str(), seq.0))
            .map_err(storage)?;
        value.map(|v| decode("message", v.value())).transpose()
    }

    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<()> {
        let key = (session.clone(), message.seq());
        // An operation changes a handful of rows: a scan is the cheap check.
        if !self.dirty_messages.contains(&key) {
            self.dirty_messages.push(key.clone());
        }
        self.changed_messages.insert(key, message);
        Ok(())
    }

    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        let waiting = self
            .entry(session)?
            .now
            .as_ref()
            .is_some_and(|record| record.inbox.waiting(seq));
        if !waiting {
            return Ok(None);
        }
        let key = (session.clone(), seq);
        if let Some(row) = self
            .inputs
            .get(&key)
            .or_else(|| self.committed.inputs.get(&key))
        {
            return Ok(Some(row.clone()));
        }
        let found = self.events.find(session.as_str(), seq.0)?;
        let Some(stored) = found.map(|b| decode::<Stored>("event", &b)).transpose()? else {
            return Err(Error::Corrupt {
                what: format!("pending input {session}/{seq}"),
                reason: "its event is missing from the log".into(),
            });
        };
        let row = record::inbox_row(session, stored)?;
        self.inputs.insert(key, row.clone());
        Ok(Some(row))
    }

    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<()> {
        self.inbox_of(session)?.add(row.admitted_seq);
        self.inputs.insert((session.clone(), row.admitted_seq), row);
        Ok(())
    }

    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        self.inbox_of(session)?.remove(seq);
        self.inputs.remove(&(session.clone(), seq));
        self.promoted.push((session.clone(), seq));
        Ok(())
    }

    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        if let Some(entry) = self
            .changed_index
            .get(id)
            .or_else(|| self.in_flight(|c| &c.index, id))
        {
            return Ok(Some(entry.clone()));
        }
        if let Some(found) = self.read_index.get(id) {
            return Ok(found.clone());
        }
        if self
            .index_last
            .as_deref()
            .is_none_or(|last| id.as_str() > last)
        {
            return Ok(None);
        }
        let value = self.index.get(id.as_str()).map_err(storage)?;
        let found: Option<IndexEntry> = value
            .map(|v| decode("index entry", v.value()))
            .transpose()?;
        self.read_index.insert(id.clone(), found.clone());
        Ok(found)
    }

    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<()> {
        self.changed_index.insert(id.clone(), entry);
        self.dirty_index.push(id.clone());
        Ok(())
    }

    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        if let Some(state) = self
            .changed_instructions
            .get(session)
            .or_else(|| self.in_flight(|c| &c.instructions, session))
        {
            return Ok(Some(state.clone()));
        }
        let value = self.instructions.get(session.as_str()).map_err(storage)?;
        value
            .map(|v| decode("instruction state", v.value()))
            .transpose()
    }

    fn put_instructions(&mut self, session: &SessionId, state: InstructionState) -> Result<()> {
        self.changed_instructions.insert(session.clone(), state);
        self.dirty_instructions.push(session.clone());
        Ok(())
    }

    fn schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<Option<Schedule>> {
        let key = (session.clone(), id.clone());
        if let Some(schedule) = self
            .changed_schedules
            .get(&key)
            .or_else(|| self.in_flight(|c| &c.schedules, &key))
        {
            return Ok(schedule.clone());
        }
        let value = self
            .schedules
            .get((session.as_str(), id.as_str()))
            .map_err(storage)?;
        value.map(|v| decode("schedule", v.value())).transpose()
    }

    fn put_schedule(&mut self, session: &SessionId, schedule: Schedule) -> Result<()> {
        let key = (session.clone(), schedule.id.clone());
        self.dirty_schedules.push(key.clone());
        self.changed_schedules.insert(key, Some(schedule));
        Ok(())
    }

    fn remove_schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<()> {
        let key = (session.clone(), id.clone());
        self.dirty_schedules.push(key.clone());
        self.changed_schedules.insert(key, None);
        Ok(())
    }
}

/// Buffers the rows one operation writes. Reads see the operation's own writes first, then the
/// batch's. [`Overlay::flush`] hands everything to the batch, encoded; dropping the overlay
/// instead discards the operation without a trace.
pub(crate) struct Overlay<'a, 't> {
    tables: &'a mut Tables<'t>,
}

/// The rows one operation wrote, not yet handed to its batch. The batch keeps them between
/// operations, empty, so that each operation reuses the maps of the one before it.
#[derive(Default)]
struct OpRows {
    /// The operation's events, in the order it recorded them.
    events: Vec<(SessionId, Stored)>,
    sessions: HashMap<SessionId, SessionRow>,
    messages: HashMap<(SessionId, Seq), Message>,
    inbox: HashMap<(SessionId, Seq), Option<InboxRow>>,
    index: HashMap<MessageId, IndexEntry>,
    instructions: HashMap<SessionId, InstructionState>,
    /// `None`: the operation removed the schedule.
    schedules: HashMap<(SessionId, ScheduleId), Option<Schedule>>,
}

impl OpRows {
    fn clear(&mut self) {
        fn empty<K, V>(map: &mut HashMap<K, V>) {
            if !map.is_empty() {
                map.clear();
            }
        }
        self.events.clear();
        empty(&mut self.sessions);
        empty(&mut self.messages);
        empty(&mut self.inbox);
        empty(&mut self.index);
        empty(&mut self.instructions);
        empty(&mut self.schedules);
    }
}

impl<'a, 't> Overlay<'a, 't> {
    pub(crate) fn new(tables: &'a mut Tables<'t>) -> Self {
        // What an operation dropped without flushing left behind goes now.
        tables.op.clear();
        Overlay { tables }
    }

    /// Hands the buffered rows to the transaction, writes the events to the log, and appends
    /// the events to `events` in the order they were recorded.
    pub(crate) fn flush(self, events: &mut Vec<(SessionId, Stored)>) -> Result<()> {
        let tables = self.tables;
        let mut op = std::mem::take(&mut tables.op);
        // An operation's events are one session's, in seq order: one run each time the session
        // changes.
        for chunk in op
            .events
            .chunk_by(|(a, x), (b, y)| a == b && x.seq.next() == y.seq)
        {
            tables.put_events(&chunk[0].0, chunk)?;
        }
        for (_, row) in op.sessions.drain() {
            tables.put_session(row)?;
        }
        for ((session, _), message) in op.messages.drain() {
            tables.put_message(&session, message)?;
        }
        for ((session, seq), row) in op.inbox.drain() {
            match row {
                Some(row) => tables.put_inbox(&session, row)?,
                None => tables.remove_inbox(&session, seq)?,
            }
        }
        for (id, entry) in op.index.drain() {
            tables.put_index(&id, entry)?;
        }
        for (session, state) in op.instructions.drain() {
            tables.put_instructions(&session, state)?;
        }
        for ((session, id), schedule) in op.schedules.drain() {
            match schedule {
                Some(schedule) => tables.put_schedule(&session, schedule)?,
                None => tables.remove_schedule(&session, &id)?,
            }
        }
        tables.encode_changed(&op.events)?;
        events.append(&mut op.events);
        tables.op = op;
        Ok(())
    }
}

impl Rows for Overlay<'_, '_> {
    fn record(&mut self, session: &SessionId, stored: Stored) {
        self.tables.op.events.push((session.clone(), stored));
    }

    fn recorded(&self) -> &[(SessionId, Stored)] {
        &self.tables.op.events
    }

    fn peek<T>(&mut self, id: &SessionId, f: impl FnOnce(&SessionRow) -> T) -> Result<Option<T>> {
        match self.tables.op.sessions.get(id) {
            Some(row) => Ok(Some(f(row))),
            None => self.tables.peek(id, f),
        }
    }

    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<InboxRow>> {
        let mut rows = self.tables.pending_inputs(session)?;
        for ((s, seq), row) in &self.tables.op.inbox {
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
}

impl Projection for Overlay<'_, '_> {
    type Error = Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>> {
        match self.tables.op.sessions.get(id) {
            Some(row) => Ok(Some(row.clone())),
            None => self.tables.session(id),
        }
    }
    fn put_session(&mut self, row: SessionRow) -> Result<()> {
        self.tables.op.sessions.insert(row.id.clone(), row);
        Ok(())
    }
    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>> {
        match self.tables.op.messages.get(&(session.clone(), seq)) {
            Some(m) => Ok(Some(m.clone())),
            None => self.tables.message(session, seq),
        }
    }
    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<()> {
        self.tables
            .op
            .messages
            .insert((session.clone(), message.seq()), message);
        Ok(())
    }
    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>> {
        match self.tables.op.inbox.get(&(session.clone(), seq)) {
            Some(row) => Ok(row.clone()),
            None => self.tables.inbox(session, seq),
        }
    }
    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<()> {
        self.tables
            .op
            .inbox
            .insert((session.clone(), row.admitted_seq), Some(row));
        Ok(())
    }
    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        self.tables.op.inbox.insert((session.clone(), seq), None);
        Ok(())
    }
    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>> {
        match self.tables.op.index.get(id) {
            Some(entry) => Ok(Some(entry.clone())),
            None => self.tables.index(id),
        }
    }
    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<()> {
        self.tables.op.index.insert(id.clone(), entry);
        Ok(())
    }
    fn instructions(&mut self, session: &SessionId) -> Result<Option<InstructionState>> {
        match self.tables.op.instructions.get(session) {
            Some(state) => Ok(Some(state.clone())),
            None => self.tables.instructions(session),
        }
    }
    fn put_instructions(&mut self, session: &SessionId, state: InstructionState) -> Result<()> {
        self.tables.op.instructions.insert(session.clone(), state);
        Ok(())
    }
    fn schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<Option<Schedule>> {
        match self.tables.op.schedules.get(&(session.clone(), id.clone())) {
            Some(schedule) => Ok(schedule.clone()),
            None => self.tables.schedule(session, id),
        }
    }
    fn put_schedule(&mut self, session: &SessionId, schedule: Schedule) -> Result<()> {
        self.tables
            .op
            .schedules
            .insert((session.clone(), schedule.id.clone()), Some(schedule));
        Ok(())
    }
    fn remove_schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<()> {
        self.tables
            .op
            .schedules
            .insert((session.clone(), id.clone()), None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use agenthost_model::Seq;

    use super::*;
    use crate::tests::session_row;

    fn record(id: &str, last: u64) -> SessionRecord {
        let mut row = session_row(id, 0, None);
        row.last_seq = Seq(last);
        SessionRecord {
            row,
            inbox: Default::default(),
            trails: false,
        }
    }

    proptest::proptest! {
        /// Rows put in key order land as a plain map says, whether they go above the table's
        /// greatest key (through the cursor at its end), among its keys, or replace one.
        #[test]
        fn rows_put_in_order_land_as_a_map_says(
            existing in proptest::collection::btree_map(0u32..400, 0u8..255, 0..60),
            batch in proptest::collection::btree_map(0u32..600, 0u8..255, 0..120),
        ) {
            const TABLE: redb::TableDefinition<'_, &str, &[u8]> = redb::TableDefinition::new("t");
            let key = |k: &u32| format!("k{k:05}");
            let dir = tempfile::tempdir().expect("tempdir");
            let db = redb::Database::create(dir.path().join("t.redb")).expect("db");
            let mut model = BTreeMap::new();
            for (k, v) in &existing {
                model.insert(key(k), vec![*v]);
            }
            let txn = db.begin_write().expect("write");
            {
                let mut table = txn.open_table(TABLE).expect("table");
                for (k, v) in &model {
                    table.insert(k.as_str(), v.as_slice()).expect("insert");
                }
            }
            txn.commit().expect("commit");
            let rows: Vec<(String, Vec<u8>)> =
                batch.iter().map(|(k, v)| (key(k), vec![*v, *v])).collect();
            let txn = db.begin_write().expect("write");
            {
                let mut table = txn.open_table(TABLE).expect("table");
                let sorted: Vec<(&str, &[u8])> =
                    rows.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
                put_sorted(&mut table, &sorted).expect("put");
            }
            txn.commit().expect("commit");
            model.extend(rows);
            let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
            let table = txn.open_table(TABLE).expect("table");
            let stored: BTreeMap<String, Vec<u8>> = table
                .iter()
                .expect("iter")
                .map(|entry| {
                    let (k, v) = entry.expect("entry");
                    (k.value().to_owned(), v.value().to_vec())
                })
                .collect();
            proptest::prop_assert_eq!(stored, model);
        }

        /// A batch's rows, sorted, are what an ordered map holds after the same inserts: each
        /// key once, with the value written last, in key order.
        #[test]
        fn written_rows_sort_as_a_map_says(
            inserts in proptest::collection::vec((0u8..16, proptest::prelude::any::<u32>()), 0..64),
        ) {
            let mut written = Written::default();
            let mut model = BTreeMap::new();
            for (key, value) in inserts {
                written.insert(key, value);
                model.insert(key, value);
            }
            written.sort();
            let sorted: Vec<(u8, u32)> = written.iter().map(|(k, v)| (*k, *v)).collect();
            proptest::prop_assert_eq!(sorted, model.into_iter().collect::<Vec<_>>());
        }
    }

    /// The batch keeps its operations' buffers between them (see `OpRows`): what a refused
    /// operation buffered is gone before the next one reads or flushes anything.
    #[test]
    fn an_operation_dropped_unflushed_leaves_nothing_to_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = redb::Database::create(dir.path().join("rows.redb")).expect("db");
        crate::init(&db).expect("init");
        let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
        let committed = Committed::default();
        let mut tables = Tables::open(
            &txn,
            &committed,
            Vec::new(),
            Sizes::default(),
            SessionEntries::default(),
        )
        .unwrap();
        let (s, id) = (
            SessionId::parse("ses_refused").unwrap(),
            MessageId::parse("msg_refused").unwrap(),
        );
        {
            let mut refused = Overlay::new(&mut tables);
            refused
                .put_session(session_row("ses_refused", 0, None))
                .unwrap();
            let entry = IndexEntry::Message {
                session: s.clone(),
                seq: Seq(1),
            };
            refused.put_index(&id, entry).unwrap();
            assert!(refused.session(&s).unwrap().is_some(), "sees its own rows");
        }
        let mut next = Overlay::new(&mut tables);
        assert!(next.session(&s).unwrap().is_none());
        assert!(next.index(&id).unwrap().is_none());
        let mut events = Vec::new();
        next.flush(&mut events).unwrap();
        assert!(events.is_empty());
        let finished = tables.finish(false).unwrap();
        assert!(finished.writes.sessions.is_empty() && finished.writes.index.is_empty());
        assert!(
            finished
                .cached
                .sessions
                .entries
                .iter()
                .all(|(_, e)| e.now.is_none())
        );
    }

    #[test]
    fn the_cache_keeps_recent_sessions_and_the_newest_record_of_each() {
        let mut cache = Committed {
            records: Recent::new(2),
            ..Committed::default()
        };
        let last = |cache: &Committed, id: &str| {
            cache
                .get(&SessionId::parse(id).expect("id"))
                .map(|r| r.row.last_seq.0)
        };
        cache.update(
            [record("ses_a", 1), record("ses_b", 1)].into_iter(),
            std::iter::empty(),
        );
        cache.update([record("ses_c", 1)].into_iter(), std::iter::empty());
        assert_eq!(
            last(&cache, "ses_a"),
            Some(1),
            "the older generation still answers"
        );
        cache.update([record("ses_a", 2)].into_iter(), std::iter::empty());
        assert_eq!(
            last(&cache, "ses_a"),
            Some(2),
            "the recent record shadows the older one"
        );
        cache.update([record("ses_d", 1)].into_iter(), std::iter::empty());
        assert_eq!(last(&cache, "ses_a"), Some(2));
        assert_eq!(last(&cache, "ses_c"), Some(1));
        assert_eq!(
            last(&cache, "ses_b"),
            None,
            "two rotations drop an unused session"
        );
    }

    #[test]
    fn an_input_leaves_the_cache_once_a_batch_promotes_it() {
        let mut cache = Committed::default();
        let session = SessionId::parse("ses_a").expect("id");
        let input = |seq: u64| {
            let row = InboxRow {
                id: MessageId::parse(&format!("msg_{seq}")).expect("id"),
                admitted_seq: Seq(seq),
                delivery: agenthost_model::Delivery::Steer,
                prompt: agenthost_model::Prompt::text("hi"),
                wake: true,
            };
            ((session.clone(), Seq(seq)), row)
        };
        let batch = |inputs: Vec<((SessionId, Seq), InboxRow)>, promoted| Cached {
            sessions: SessionEntries::default(),
            inputs: inputs.into_iter().collect(),
            promoted,
        };
        cache.take(batch(vec![input(1), input(2)], Vec::new()));
        assert!(cache.inputs.get(&(session.clone(), Seq(1))).is_some());
        // Promoted in a later batch, which admitted a third.
        cache.take(batch(vec![input(3)], vec![(session.clone(), Seq(1))]));
        assert!(cache.inputs.get(&(session.clone(), Seq(1))).is_none());
        assert!(cache.inputs.get(&(session.clone(), Seq(2))).is_some());
        assert!(cache.inputs.get(&(session.clone(), Seq(3))).is_some());
        // Admitted and promoted by the same batch: never cached.
        cache.take(batch(Vec::new(), vec![(session.clone(), Seq(4))]));
        assert_eq!(cache.inputs.recent.len() + cache.inputs.older.len(), 2);
    }
}
