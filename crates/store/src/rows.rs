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
use indexmap::IndexMap;
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, WriteTransaction};

/// The writer's in-memory maps: seeded, so client-chosen ids cannot be crafted to collide.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use crate::codec::{self, decode, encode};
use crate::error::{Error, Result, storage};
use crate::log::{self, BaseKey, Bytes};
use crate::ops::Rows;
use crate::record::{self, SessionRecord};
use crate::tables::*;

/// What the writer keeps across batches, as the batches it planned left it: session records,
/// so that a session's record is read from its B-tree and decoded once, not once per batch; and,
/// with each record, the rows of pending inputs it admitted or read, so that a promotion a few
/// commits after the admission does not read the prompt back from the log (an input leaves once
/// a batch promotes it, so they are what is pending, not what was). A batch changes both in
/// place as its operations are accepted. Only the writer changes records, and an input's row
/// never changes, so the cache is exact. It runs ahead of what is durable by the batches not
/// yet committed, which are known only here: when a batch fails, the writer drops the whole
/// cache, once no batch it could hold is still being committed (see `writer`).
pub(crate) struct Committed {
    /// Session records by id. A batch finds a session by id once and then by its place, which
    /// stays the same until the batch is handed over.
    records: IndexMap<SessionId, SessionEntry, foldhash::fast::RandomState>,
    /// Records stay for the sessions used in this era or the last: an era ends, between two
    /// batches, once `capacity` sessions were used in it for the first time, and the sessions
    /// the ending era did not use go then, unless a batch not yet durable used them. So the
    /// sessions in use stay cached however many others come and go, and at most about twice
    /// `capacity` are kept (more only while batches larger than an era are in flight).
    era: u32,
    fresh: usize,
    capacity: usize,
    /// Input rows the records hold, and the most they may: past that, an input is not cached
    /// until others leave (promoted, or with their session).
    inputs: usize,
    most_inputs: usize,
}

/// Most sessions one era of the cache takes in (the writer keeps at most about twice as many),
/// and most input rows the cache holds.
const CACHED_SESSIONS: usize = 65_536;
const CACHED_INPUTS: usize = 32_768;

impl Default for Committed {
    fn default() -> Self {
        Committed::new(CACHED_SESSIONS, CACHED_INPUTS)
    }
}

impl Committed {
    fn new(sessions: usize, inputs: usize) -> Self {
        Committed {
            records: IndexMap::default(),
            era: 0,
            fresh: 0,
            capacity: sessions,
            inputs: 0,
            most_inputs: inputs,
        }
    }

    /// The row of the session's pending input at `seq`, if the entry at `at` holds it.
    fn input(&self, at: usize, seq: Seq) -> Option<&InboxRow> {
        let rows = &self.records[at].inputs;
        let i = rows
            .binary_search_by_key(&seq, |row| row.admitted_seq)
            .ok()?;
        Some(&rows[i])
    }

    /// Keeps the row of a pending input with its session's entry, at `at`, while there is room.
    fn keep_input(&mut self, at: usize, row: InboxRow) {
        if self.inputs >= self.most_inputs {
            return;
        }
        let rows = &mut self.records[at].inputs;
        // Admitted in seq order, so a new input goes last.
        let i = match rows.last() {
            Some(last) if last.admitted_seq >= row.admitted_seq => {
                match rows.binary_search_by_key(&row.admitted_seq, |r| r.admitted_seq) {
                    Ok(_) => return,
                    Err(i) => i,
                }
            }
            _ => rows.len(),
        };
        rows.insert(i, row);
        self.inputs += 1;
    }

    /// Lets go of the row of an input no longer pending.
    fn drop_input(&mut self, at: usize, seq: Seq) {
        let rows = &mut self.records[at].inputs;
        if let Ok(i) = rows.binary_search_by_key(&seq, |row| row.admitted_seq) {
            rows.remove(i);
            self.inputs -= 1;
        }
    }

    #[cfg(test)]
    fn get(&self, id: &SessionId) -> Option<&SessionRecord> {
        self.records.get(id).and_then(|entry| entry.now.as_ref())
    }

    /// The place of the session's entry for batch number `batch`, which used the entries at
    /// `touched`; the place stays the same until the batch ends. `load` reads the record when
    /// the cache has none. The first time the batch uses an entry, it notes how it found the
    /// session.
    fn find(
        &mut self,
        id: &SessionId,
        batch: u64,
        touched: &mut Vec<usize>,
        load: impl FnOnce() -> Result<Option<(SessionRecord, u32)>>,
    ) -> Result<usize> {
        let at = match self.records.get_index_of(id) {
            Some(at) => at,
            None => {
                let (now, trail) = match load()? {
                    Some((record, trail)) => (Some(record), trail),
                    None => (None, 0),
                };
                let entry = SessionEntry {
                    now,
                    trail,
                    inputs: Vec::new(),
                    // Used in this era for the first time below.
                    era: self.era.wrapping_sub(1),
                    batch,
                    in_batch: false,
                    found: None,
                    dirty: false,
                    listed: false,
                    joined: false,
                };
                self.records.insert_full(id.clone(), entry).0
            }
        };
        let entry = &mut self.records[at];
        if !entry.in_batch {
            entry.in_batch = true;
            entry.batch = batch;
            entry.found = entry.now.as_ref().map(SessionRecord::working);
            touched.push(at);
            if entry.era != self.era {
                entry.era = self.era;
                self.fresh += 1;
            }
        }
        Ok(at)
    }

    /// Ends the batch that used the entries at `touched`: they are nobody's any more, those of
    /// sessions it found missing (and did not create) go, and so do, at the end of an era, the
    /// sessions the era did not use. Batches up to number `durable` are durable: a record a
    /// later one changed is known only here, so it stays whatever its era.
    fn end_batch(&mut self, touched: &[usize], durable: u64) {
        let mut missing = Vec::new();
        for &at in touched {
            let (id, entry) = self
                .records
                .get_index_mut(at)
                .expect("invariant: a batch's entries stay in place until it ends");
            entry.in_batch = false;
            entry.dirty = false;
            entry.listed = false;
            entry.joined = false;
            if entry.now.is_none() {
                missing.push(id.clone());
            }
        }
        for id in &missing {
            if let Some(entry) = self.records.swap_remove(id) {
                self.inputs -= entry.inputs.len();
            }
        }
        if self.fresh >= self.capacity {
            let (era, inputs) = (self.era, &mut self.inputs);
            self.records.retain(|_, entry| {
                let keep = entry.era == era || entry.batch > durable;
                if !keep {
                    *inputs -= entry.inputs.len();
                }
                keep
            });
            self.era = era.wrapping_add(1);
            self.fresh = 0;
        }
    }
}

/// Reads a session's stored record, brought up to date, and how many admissions it is ahead of
/// the record stored.
fn load(
    sessions: &impl ReadableTable<&'static str, Bytes>,
    events: &log::ReadLog,
    id: &SessionId,
) -> Result<Option<(SessionRecord, u32)>> {
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

/// A session's record as the batches planned so far left it, and what the batch being planned
/// did with it.
pub(crate) struct SessionEntry {
    /// `None`: the session does not exist (kept only until the batch that found so ends).
    now: Option<SessionRecord>,
    /// Admissions `now` is ahead of the record stored, or of the one the batch writes.
    trail: u32,
    /// Rows of some of the session's pending inputs, in seq order (see [`Committed`]).
    inputs: Vec<InboxRow>,
    /// The cache's era when a batch last used the entry, and that batch's number.
    era: u32,
    batch: u64,
    /// Used by the batch being planned. The fields below are that batch's, and are reset when
    /// it ends.
    in_batch: bool,
    /// Whether the session was working when the batch found it (`None`: it did not exist).
    found: Option<bool>,
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
            front: Written::with_capacity(sizes.front),
            sessions: Written::with_capacity(sizes.records),
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

    /// Inserts every row into its table. Only the tables the batch writes are opened: each one
    /// opened costs the commit a lookup in redb's tree of tables, and every table exists
    /// already ([`create_tables`], when the store opens).
    pub(crate) fn apply(&self, txn: &WriteTransaction) -> Result<()> {
        if !self.front.0.is_empty() {
            let mut front = txn.open_table(EVENTS_FRONT).map_err(storage)?;
            let runs: Vec<_> = self
                .front
                .iter()
                .map(|((session, first), run)| {
                    ((self.generation, session.as_str(), first.0), run.as_slice())
                })
                .collect();
            put_sorted(&mut front, &runs)?;
        }
        put_by_id(
            txn,
            SESSIONS,
            self.sessions.iter().map(|(id, v)| (id.as_str(), v)),
        )?;
        if !self.by_created.is_empty() {
            let mut by_created = txn.open_table(SESSIONS_BY_CREATED).map_err(storage)?;
            for (created, id) in &self.by_created {
                by_created
                    .insert((*created, id.as_str()), ())
                    .map_err(storage)?;
            }
        }
        if !self.working.is_empty() || !self.idle.is_empty() {
            let mut working = txn.open_table(WORKING).map_err(storage)?;
            for id in &self.working {
                working.insert(id.as_str(), ()).map_err(storage)?;
            }
            // After the rows above (see [`Tables::finish`]).
            for id in &self.idle {
                working.remove(id.as_str()).map_err(storage)?;
            }
        }
        if !self.messages.0.is_empty() {
            let mut messages = txn.open_table(MESSAGES).map_err(storage)?;
            for ((session, seq), message) in self.messages.iter() {
                messages
                    .insert((session.as_str(), seq.0), message.as_slice())
                    .map_err(storage)?;
            }
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
        if !self.schedules.0.is_empty() {
            let mut schedules = txn.open_table(SCHEDULES).map_err(storage)?;
            for ((session, id), schedule) in self.schedules.iter() {
                let key = (session.as_str(), id.as_str());
                match schedule {
                    Some(schedule) => schedules.insert(key, schedule.as_slice()),
                    None => schedules.remove(key),
                }
                .map_err(storage)?;
            }
        }
        Ok(())
    }
}

/// Creates every table a store has that `txn`'s store lacks, so that readers never meet a
/// missing one: a new store, or one of an older format opened for writing.
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(EVENTS).map_err(storage)?;
    txn.open_table(EVENTS_MIDDLE).map_err(storage)?;
    txn.open_table(EVENTS_FRONT).map_err(storage)?;
    txn.open_table(SESSIONS).map_err(storage)?;
    txn.open_table(SESSIONS_BY_CREATED).map_err(storage)?;
    txn.open_table(WORKING).map_err(storage)?;
    txn.open_table(MESSAGES).map_err(storage)?;
    txn.open_table(INDEX).map_err(storage)?;
    txn.open_table(INSTRUCTIONS).map_err(storage)?;
    txn.open_table(SCHEDULES).map_err(storage)?;
    Ok(())
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

/// Puts rows keyed by an id, given in key order, into one table (see [`put_sorted`]); opens the
/// table only when there are rows.
fn put_by_id<'a>(
    txn: &WriteTransaction,
    table: redb::TableDefinition<'static, &'static str, Bytes>,
    rows: impl Iterator<Item = (&'a str, &'a Vec<u8>)>,
) -> Result<()> {
    let rows: Vec<(&str, &[u8])> = rows.map(|(id, value)| (id, value.as_slice())).collect();
    if rows.is_empty() {
        return Ok(());
    }
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

/// How many operations, events and rows of each kind a batch held in memory. The next batch's
/// vectors and maps start with room for as many, so that batches of a steady size do not grow
/// them as they fill.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) ops: usize,
    pub(crate) events: usize,
    sessions: usize,
    front: usize,
    records: usize,
    messages: usize,
    index: usize,
    read_index: usize,
}

impl Sizes {
    /// What the next batch starts with room for after `batch`: the larger of its sizes and of
    /// the earlier batches', which fade by an eighth a batch. Batch sizes swing with the commit
    /// that each one waits for, and a batch larger than the one before it would otherwise grow
    /// (copy) its vectors again.
    pub(crate) fn after(self, batch: Sizes) -> Sizes {
        let keep = |earlier: usize, now: usize| now.max(earlier - earlier / 8);
        Sizes {
            ops: keep(self.ops, batch.ops),
            events: keep(self.events, batch.events),
            sessions: keep(self.sessions, batch.sessions),
            front: keep(self.front, batch.front),
            records: keep(self.records, batch.records),
            messages: keep(self.messages, batch.messages),
            index: keep(self.index, batch.index),
            read_index: keep(self.read_index, batch.read_index),
        }
    }
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
    pub(crate) sizes: Sizes,
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
    /// The writer's caches, which the batch changes in place (see [`Committed`]).
    committed: &'t mut Committed,
    /// The batches being committed, which the read transaction does not see yet, newest first.
    in_flight: Vec<&'t Changes>,
    /// The batch's number (see `writer`).
    batch: u64,
    /// The places of the session entries this batch used, in `committed`, and of the one it
    /// found last: an operation looks its session up several times in a row, and comparing ids
    /// costs less than hashing one.
    touched: Vec<usize>,
    last: usize,
    /// Rows changed by the current operation, encoded into `writes` when it is flushed (the
    /// sessions by their place).
    dirty_sessions: Vec<usize>,
    dirty_messages: Vec<(SessionId, Seq)>,
    dirty_index: Vec<MessageId>,
    dirty_instructions: Vec<SessionId>,
    dirty_schedules: Vec<(SessionId, ScheduleId)>,
    /// Sessions this batch put in the working set.
    joined: HashSet<SessionId>,
    changed_messages: HashMap<(SessionId, Seq), Message>,
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
    /// batch's; `batch` the batch's number.
    pub(crate) fn open(
        txn: &ReadTransaction,
        committed: &'t mut Committed,
        in_flight: Vec<&'t Changes>,
        sizes: Sizes,
        batch: u64,
    ) -> Result<Self> {
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
            batch,
            touched: Vec::with_capacity(room(sizes.sessions)),
            last: usize::MAX,
            dirty_sessions: Vec::new(),
            dirty_messages: Vec::new(),
            dirty_index: Vec::new(),
            dirty_instructions: Vec::new(),
            dirty_schedules: Vec::new(),
            joined: HashSet::default(),
            changed_messages: map_of(sizes.messages),
            changed_index: map_of(sizes.index),
            read_index: map_of(sizes.read_index),
            index_last,
            changed_instructions: HashMap::default(),
            changed_schedules: HashMap::default(),
            op: OpRows::default(),
        })
    }

    /// The session's entry, read from the tables the first time the writer needs it.
    fn entry(&mut self, id: &SessionId) -> Result<&mut SessionEntry> {
        let at = self.entry_at(id)?;
        Ok(&mut self.committed.records[at])
    }

    /// The place of the session's entry in the cache (see [`Committed::find`]).
    fn entry_at(&mut self, id: &SessionId) -> Result<usize> {
        if let Some((last, _)) = self.committed.records.get_index(self.last)
            && last == id
        {
            return Ok(self.last);
        }
        let (sessions, events) = (&self.sessions, &self.events);
        let load = || load(sessions, events, id);
        let at = (self.committed).find(id, self.batch, &mut self.touched, load)?;
        self.last = at;
        Ok(at)
    }

    /// Reads from the session's row without copying it.
    fn peek<T>(&mut self, id: &SessionId, f: impl FnOnce(&SessionRow) -> T) -> Result<Option<T>> {
        Ok(self.entry(id)?.now.as_ref().map(|record| f(&record.row)))
    }

    /// The place of the session's entry, its record marked changed, for changing its inbox.
    fn inbox_of(&mut self, session: &SessionId) -> Result<usize> {
        if self.entry(session)?.now.is_none() {
            return Err(Error::Corrupt {
                what: format!("inbox of {session}"),
                reason: "the session has no record".into(),
            });
        }
        self.touch(session)
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
    fn touch(&mut self, id: &SessionId) -> Result<usize> {
        let at = self.entry_at(id)?;
        let entry = &mut self.committed.records[at];
        if !entry.dirty {
            entry.dirty = true;
            self.dirty_sessions.push(at);
        }
        Ok(at)
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
            let (id, _) = self
                .committed
                .records
                .get_index(at)
                .expect("invariant: in place");
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
    /// Batches up to number `durable` are durable.
    pub(crate) fn finish(mut self, prune: bool, durable: u64) -> Result<Finished> {
        if prune {
            self.writes.idle = self.idle_sessions()?;
        }
        let (front, records) = (self.writes.front.0.len(), self.writes.sessions.0.len());
        self.writes.sort();
        self.committed.end_batch(&self.touched, durable);
        let sizes = Sizes {
            ops: 0,
            events: 0,
            sessions: self.touched.len(),
            front,
            records,
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
            let working = match self.committed.records.get(&id) {
                Some(entry) => entry.now.as_ref().is_some_and(SessionRecord::working),
                // A record that trails its log has pending input already, so the stored one
                // says whether the session works.
                None => read_record(&self.sessions, id.as_str())?.is_some_and(|r| r.working()),
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
        let (id, entry) = (self.committed.records.get_index_mut(at))
            .expect("invariant: a batch's entries stay in place until it ends");
        entry.dirty = false;
        let Some(record) = &mut entry.now else {
            return Ok(());
        };
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
        if !starts {
            return Ok(());
        }
        entry.joined = true;
        let id = id.clone();
        if !self.in_working_set(&id)? {
            self.writes.working.push(id.clone());
            self.joined.insert(id);
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
        let at = self.touch(&row.id)?;
        let entry = &mut self.committed.records[at];
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
        let at = self.entry_at(session)?;
        let waiting = (self.committed.records[at].now.as_ref())
            .is_some_and(|record| record.inbox.waiting(seq));
        if !waiting {
            return Ok(None);
        }
        if let Some(row) = self.committed.input(at, seq) {
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
        self.committed.keep_input(at, row.clone());
        Ok(Some(row))
    }

    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<()> {
        let at = self.inbox_of(session)?;
        let record = self.committed.records[at].now.as_mut();
        record
            .expect("invariant: an inbox has a record")
            .inbox
            .add(row.admitted_seq);
        self.committed.keep_input(at, row);
        Ok(())
    }

    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<()> {
        let at = self.inbox_of(session)?;
        let record = self.committed.records[at].now.as_mut();
        record
            .expect("invariant: an inbox has a record")
            .inbox
            .remove(seq);
        self.committed.drop_input(at, seq);
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
/// operations, empty, so that each operation reuses the room of the one before it.
#[derive(Default)]
struct OpRows {
    /// The operation's events, in the order it recorded them.
    events: Vec<(SessionId, Stored)>,
    sessions: OpMap<SessionId, SessionRow>,
    messages: OpMap<(SessionId, Seq), Message>,
    inbox: OpMap<(SessionId, Seq), Option<InboxRow>>,
    index: OpMap<MessageId, IndexEntry>,
    instructions: OpMap<SessionId, InstructionState>,
    /// `None`: the operation removed the schedule.
    schedules: OpMap<(SessionId, ScheduleId), Option<Schedule>>,
    /// The batch's index entry for the id the operation looked up last (`None`: absent). The
    /// batch's rows stay as they are while an operation runs, and an admission looks its id up
    /// twice: to check it, and in the projector.
    looked_up: Option<(MessageId, Option<IndexEntry>)>,
}

impl OpRows {
    fn clear(&mut self) {
        self.events.clear();
        self.sessions.clear();
        self.messages.clear();
        self.inbox.clear();
        self.index.clear();
        self.instructions.clear();
        self.schedules.clear();
        self.looked_up = None;
    }
}

/// One kind of row an operation wrote, in the order first written. An operation writes a
/// handful, so a row is found by comparing keys (an id and its clones share their text, so that
/// usually compares two pointers) instead of hashing one; past [`OpMap::SCAN`] rows a map finds
/// them.
struct OpMap<K, V> {
    rows: Vec<(K, V)>,
    /// Each key's place in `rows`, once there are more than [`OpMap::SCAN`].
    at: Option<HashMap<K, usize>>,
}

impl<K, V> Default for OpMap<K, V> {
    fn default() -> Self {
        OpMap {
            rows: Vec::new(),
            at: None,
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, V> OpMap<K, V> {
    const SCAN: usize = 16;

    fn find(&self, key: &K) -> Option<usize> {
        match &self.at {
            Some(at) => at.get(key).copied(),
            None => self.rows.iter().position(|(k, _)| k == key),
        }
    }

    fn get(&self, key: &K) -> Option<&V> {
        self.find(key).map(|i| &self.rows[i].1)
    }

    fn insert(&mut self, key: K, value: V) {
        if let Some(i) = self.find(&key) {
            self.rows[i].1 = value;
            return;
        }
        match &mut self.at {
            Some(at) => {
                at.insert(key.clone(), self.rows.len());
            }
            None if self.rows.len() == Self::SCAN => {
                let mut at: HashMap<K, usize> = map_of(2 * Self::SCAN);
                at.extend(
                    self.rows
                        .iter()
                        .enumerate()
                        .map(|(i, (k, _))| (k.clone(), i)),
                );
                at.insert(key.clone(), self.rows.len());
                self.at = Some(at);
            }
            None => {}
        }
        self.rows.push((key, value));
    }

    fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.rows.iter().map(|(k, v)| (k, v))
    }

    /// Takes every row out, in the order first written, keeping the room.
    fn drain(&mut self) -> std::vec::Drain<'_, (K, V)> {
        self.at = None;
        self.rows.drain(..)
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.at = None;
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
        for ((s, seq), row) in self.tables.op.inbox.iter() {
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
        let op = &self.tables.op;
        if let Some(entry) = op.index.get(id) {
            return Ok(Some(entry.clone()));
        }
        if let Some((last, found)) = &op.looked_up
            && last == id
        {
            return Ok(found.clone());
        }
        let found = self.tables.index(id)?;
        self.tables.op.looked_up = Some((id.clone(), found.clone()));
        Ok(found)
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
        /// key once, with the value written last, in key order. Keys begin alike or not (a
        /// shared stem), and begin one another.
        #[test]
        fn written_rows_sort_as_a_map_says(
            stem in proptest::sample::select(vec!["", "0", "01234567", "0123456789abcdef"]),
            inserts in proptest::collection::vec(
                ("[ab]{0,11}", 0u64..3, proptest::prelude::any::<u32>()),
                0..64,
            ),
        ) {
            let mut written = Written::default();
            let mut model = BTreeMap::new();
            for (body, seq, value) in inserts {
                let id = SessionId::parse(&format!("ses_{stem}x{body}")).expect("id");
                written.insert((id.clone(), Seq(seq)), value);
                model.insert((id, Seq(seq)), value);
            }
            written.sort();
            let sorted: Vec<_> = written.iter().map(|(k, v)| (k.clone(), *v)).collect();
            proptest::prop_assert_eq!(sorted, model.into_iter().collect::<Vec<_>>());
        }

        /// An operation's rows of one kind are what a map holds after the same inserts, found
        /// by scanning and, past a handful, through their map; they drain in the order first
        /// written, with the value written last.
        #[test]
        fn op_rows_are_found_as_a_map_says(
            inserts in proptest::collection::vec((0u8..40, proptest::prelude::any::<u32>()), 0..80),
        ) {
            let mut rows = OpMap::default();
            let mut model = std::collections::HashMap::new();
            let mut order = Vec::new();
            for (key, value) in inserts {
                rows.insert(key, value);
                if model.insert(key, value).is_none() {
                    order.push(key);
                }
                for k in 0u8..40 {
                    proptest::prop_assert_eq!(rows.get(&k), model.get(&k));
                }
            }
            let drained: Vec<(u8, u32)> = rows.drain().collect();
            let expected: Vec<(u8, u32)> = order.iter().map(|k| (*k, model[k])).collect();
            proptest::prop_assert_eq!(drained, expected);
            proptest::prop_assert!(rows.get(&0).is_none() && rows.at.is_none());
        }
    }

    /// Runs `f` on a batch's tables over an empty store; returns the writer's cache after it.
    fn on_empty_store(f: impl FnOnce(Tables<'_>)) -> Committed {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = redb::Database::create(dir.path().join("rows.redb")).expect("db");
        crate::init(&db).expect("init");
        let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
        let mut committed = Committed::default();
        f(Tables::open(&txn, &mut committed, Vec::new(), Sizes::default(), 1).expect("tables"));
        committed
    }

    /// The batch keeps its operations' buffers between them (see `OpRows`): what a refused
    /// operation buffered is gone before the next one reads or flushes anything.
    #[test]
    fn an_operation_dropped_unflushed_leaves_nothing_to_the_next() {
        let (s, id) = (
            SessionId::parse("ses_refused").unwrap(),
            MessageId::parse("msg_refused").unwrap(),
        );
        let committed = on_empty_store(|mut tables| {
            {
                let mut refused = Overlay::new(&mut tables);
                let row = session_row("ses_refused", 0, None);
                refused.put_session(row).unwrap();
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
            let finished = tables.finish(false, 0).unwrap();
            assert!(finished.writes.sessions.is_empty() && finished.writes.index.is_empty());
        });
        assert!(
            committed.records.is_empty(),
            "a session the batch found missing is not kept"
        );
    }

    /// An operation's lookups in the index are remembered for the operation only: the next
    /// one sees what the last one wrote.
    #[test]
    fn the_next_operation_sees_the_index_entry_the_last_one_wrote() {
        let id = MessageId::parse("msg_a").unwrap();
        let entry = IndexEntry::Message {
            session: SessionId::parse("ses_a").unwrap(),
            seq: Seq(1),
        };
        on_empty_store(|mut tables| {
            let mut first = Overlay::new(&mut tables);
            assert_eq!(first.index(&id).unwrap(), None);
            first.put_index(&id, entry.clone()).unwrap();
            assert_eq!(
                first.index(&id).unwrap(),
                Some(entry.clone()),
                "its own write"
            );
            first.flush(&mut Vec::new()).unwrap();
            let mut next = Overlay::new(&mut tables);
            assert_eq!(next.index(&id).unwrap(), Some(entry));
        });
    }

    /// The use of the cache by batch number `n` while those up to `durable` are: each session
    /// in `used` is found (read as `record(id, 1)` when the cache has none) and its record set
    /// to `last`.
    fn batch_of(cache: &mut Committed, n: u64, durable: u64, used: &[(&str, u64)]) {
        let mut touched = Vec::new();
        for &(id, last) in used {
            let id = SessionId::parse(id).expect("id");
            let at = cache
                .find(&id, n, &mut touched, || {
                    Ok(Some((record(id.as_str(), 1), 0)))
                })
                .expect("found");
            let entry = &mut cache.records[at];
            assert!(entry.in_batch && entry.found == Some(false));
            entry.now.as_mut().expect("record").row.last_seq = Seq(last);
        }
        cache.end_batch(&touched, durable);
        assert!(cache.records.values().all(|entry| !entry.in_batch));
    }

    #[test]
    fn a_batch_starts_with_room_for_the_larger_of_the_last_and_the_fading_peak() {
        let sizes = |ops| Sizes {
            ops,
            ..Sizes::default()
        };
        assert_eq!(
            sizes(800).after(sizes(100)).ops,
            700,
            "the peak fades by an eighth"
        );
        assert_eq!(
            sizes(800).after(sizes(750)).ops,
            750,
            "a larger batch sets it"
        );
        assert_eq!(sizes(0).after(sizes(30)).ops, 30);
        let mut room = sizes(800);
        for _ in 0..40 {
            room = room.after(sizes(10));
        }
        assert_eq!(room.ops, 10, "small batches bring it down to their size");
    }

    /// One batch's use of the cache once every batch before it is durable.
    fn batch(cache: &mut Committed, used: &[(&str, u64)]) {
        batch_of(cache, 1, 1, used);
    }

    /// An era may end while the batches that changed a record in the last one are still being
    /// committed: the record is known only in the cache then, so it stays.
    #[test]
    fn the_end_of_an_era_keeps_what_batches_not_yet_durable_changed() {
        let mut cache = Committed::new(2, 2);
        let last = |cache: &Committed, id: &str| {
            cache
                .get(&SessionId::parse(id).expect("id"))
                .map(|r| r.row.last_seq.0)
        };
        batch_of(&mut cache, 1, 0, &[("ses_a", 5), ("ses_b", 5)]);
        batch_of(&mut cache, 2, 0, &[("ses_c", 1), ("ses_d", 1)]);
        assert_eq!(last(&cache, "ses_a"), Some(5), "batch 1 is not durable yet");
        batch_of(&mut cache, 3, 2, &[("ses_e", 1), ("ses_f", 1)]);
        assert_eq!(
            last(&cache, "ses_a"),
            None,
            "durable now, and unused for an era"
        );
        assert_eq!(last(&cache, "ses_e"), Some(1));
    }

    #[test]
    fn the_cache_keeps_the_sessions_in_use_and_the_newest_record_of_each() {
        let mut cache = Committed::new(2, 2);
        let last = |cache: &Committed, id: &str| {
            cache
                .get(&SessionId::parse(id).expect("id"))
                .map(|r| r.row.last_seq.0)
        };
        batch(&mut cache, &[("ses_a", 1), ("ses_b", 1)]);
        batch(&mut cache, &[("ses_c", 1)]);
        assert_eq!(last(&cache, "ses_a"), Some(1), "the last era's stay");
        batch(&mut cache, &[("ses_a", 2)]);
        assert_eq!(last(&cache, "ses_a"), Some(2), "changed in place");
        assert_eq!(
            last(&cache, "ses_b"),
            None,
            "an era without use drops a session"
        );
        assert_eq!(last(&cache, "ses_c"), Some(1));
        batch(&mut cache, &[("ses_d", 1)]);
        batch(&mut cache, &[("ses_e", 1), ("ses_d", 3)]);
        assert_eq!(last(&cache, "ses_d"), Some(3));
        assert_eq!(last(&cache, "ses_e"), Some(1));
        assert_eq!(last(&cache, "ses_a"), None);
        assert!(cache.records.len() <= 4, "about twice an era at most");

        let missing = SessionId::parse("ses_missing").expect("id");
        let mut touched = Vec::new();
        let at = (cache.find(&missing, 1, &mut touched, || Ok(None))).expect("found");
        assert_eq!(cache.records[at].found, None, "found missing");
        cache.end_batch(&touched, 1);
        assert!(cache.records.get(&missing).is_none(), "not kept");
        assert_eq!(last(&cache, "ses_d"), Some(3), "the others stay in place");
    }

    #[test]
    fn input_rows_stay_in_seq_order_within_their_budget_and_leave_with_their_session() {
        let mut cache = Committed::new(2, 3);
        let input = |seq: u64| InboxRow {
            id: MessageId::parse(&format!("msg_{seq}")).expect("id"),
            admitted_seq: Seq(seq),
            delivery: agenthost_model::Delivery::Steer,
            prompt: agenthost_model::Prompt::text("hi"),
            wake: true,
        };
        let mut touched = Vec::new();
        let mut find = |cache: &mut Committed, id: &str| {
            let found = || Ok(Some((record(id, 1), 0)));
            let id = SessionId::parse(id).expect("id");
            cache.find(&id, 1, &mut touched, found).expect("found")
        };
        let (a, b) = (find(&mut cache, "ses_a"), find(&mut cache, "ses_b"));
        let seqs = |cache: &Committed, at: usize| -> Vec<u64> {
            cache.records[at]
                .inputs
                .iter()
                .map(|row| row.admitted_seq.0)
                .collect()
        };
        cache.keep_input(a, input(5));
        cache.keep_input(a, input(3));
        cache.keep_input(a, input(5));
        assert_eq!(seqs(&cache, a), [3, 5], "in seq order, each once");
        cache.keep_input(b, input(1));
        cache.keep_input(b, input(2));
        assert_eq!(cache.inputs, 3);
        assert!(cache.input(b, Seq(2)).is_none(), "past the budget");
        assert_eq!(
            cache.input(a, Seq(5)).map(|row| row.admitted_seq),
            Some(Seq(5))
        );
        cache.drop_input(a, Seq(3));
        cache.drop_input(a, Seq(9));
        assert_eq!((seqs(&cache, a), cache.inputs), (vec![5], 2));
        cache.keep_input(b, input(2));
        assert_eq!(seqs(&cache, b), [1, 2], "room again");
        cache.end_batch(&touched, 1);
        batch(&mut cache, &[("ses_c", 1), ("ses_d", 1)]);
        assert!(cache.get(&SessionId::parse("ses_a").expect("id")).is_none());
        assert_eq!(cache.inputs, 0, "their inputs left with them");
    }
}
