//! Consistent reads. A [`Snapshot`] sees exactly the commits that were durable when it was taken,
//! however long it is held; redb's MVCC means it never blocks the writer and the writer never
//! blocks it.

use std::cell::OnceCell;

use agenthost_model::history::{self, History, Mode};
use agenthost_model::{
    InboxRow, IndexEntry, InstructionState, Message, MessageId, Schedule, Seq, SessionId,
    SessionRow, Stored, Timestamp,
};
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, TableError};

use crate::codec::decode;
use crate::error::{Result, storage};
use crate::log::{self, Bytes};
use crate::record::{self, Inbox, SessionRecord};
use crate::tables::*;

/// Read access to one consistent state of the store.
pub trait Snapshot: Send {
    fn session(&self, id: &SessionId) -> Result<Option<SessionRow>>;
    /// Sessions newest first, starting after `cursor` (the `(created, id)` of the last one seen).
    fn sessions(
        &self,
        cursor: Option<(Timestamp, SessionId)>,
        limit: usize,
    ) -> Result<Vec<SessionRow>>;
    /// Messages with `seq >= from`, in seq order, at most `limit`.
    fn messages(&self, id: &SessionId, from: Seq, limit: usize) -> Result<Vec<Message>>;
    /// Pending (admitted, unpromoted) inputs in admission order.
    fn pending(&self, id: &SessionId) -> Result<Vec<InboxRow>>;
    /// The admitted seqs of the pending inputs, in order: [`Snapshot::pending`] without reading
    /// the prompts.
    fn pending_seqs(&self, id: &SessionId) -> Result<Vec<Seq>>;
    /// A session's row and, when it has any, its pending inputs: [`Snapshot::session`] and
    /// [`Snapshot::pending`] in one read of the session.
    fn session_and_pending(&self, id: &SessionId) -> Result<Option<(SessionRow, Vec<InboxRow>)>> {
        let Some(row) = self.session(id)? else {
            return Ok(None);
        };
        let inputs = match row.pending {
            0 => Vec::new(),
            _ => self.pending(id)?,
        };
        Ok(Some((row, inputs)))
    }
    /// [`Snapshot::session_and_pending`], taking the row of a pending input from `known` (by its
    /// admitted seq) where it has it instead of reading the event that admitted it: an input's
    /// row never changes once it is durable, so a caller that kept the rows it admitted spares
    /// the read. `known` must only give rows of durable admissions of this session.
    fn session_and_pending_known(
        &self,
        id: &SessionId,
        known: &mut dyn FnMut(Seq) -> Option<InboxRow>,
    ) -> Result<Option<(SessionRow, Vec<InboxRow>)>> {
        let _ = known;
        self.session_and_pending(id)
    }
    fn instructions(&self, id: &SessionId) -> Result<InstructionState>;
    fn index(&self, id: &MessageId) -> Result<Option<IndexEntry>>;
    /// Events with `seq >= from`, in seq order, at most `limit`.
    fn events(&self, id: &SessionId, from: Seq, limit: usize) -> Result<Vec<Stored>>;
    /// [`Snapshot::events`], stopping early once the events read are about `max_bytes` large
    /// (at least one is read): a reader that renders them a page at a time holds a bounded
    /// amount, however large single events are.
    fn events_within(
        &self,
        id: &SessionId,
        from: Seq,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Stored>> {
        let _ = max_bytes;
        self.events(id, from, limit)
    }
    /// Pending inputs admitted after `after` (all when `None`), in admission order: at most
    /// `limit`, stopping early once their prompts pass about `max_bytes` (at least one is read).
    /// A page of [`Snapshot::pending`], which a reader of a deep inbox of large prompts cannot
    /// hold at once.
    fn pending_page(
        &self,
        id: &SessionId,
        after: Option<Seq>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<InboxRow>> {
        let mut page = Vec::new();
        let mut bytes = 0usize;
        for seq in self.pending_seqs(id)? {
            if after.is_some_and(|after| seq <= after) {
                continue;
            }
            if page.len() >= limit || (!page.is_empty() && bytes >= max_bytes) {
                break;
            }
            let Some(stored) = self.events(id, seq, 1)?.into_iter().next() else {
                break;
            };
            let row = record::inbox_row(id, stored)?;
            bytes = bytes.saturating_add(
                row.prompt.text.len() + row.prompt.files.iter().map(|f| f.url.len()).sum::<usize>(),
            );
            page.push(row);
        }
        Ok(page)
    }
    /// Sessions holding a claim.
    fn claimed(&self) -> Result<Vec<SessionId>>;
    /// Sessions with pending input.
    fn with_pending(&self) -> Result<Vec<SessionId>>;
    /// The rows of the sessions with pending input, in the order of [`Snapshot::with_pending`]:
    /// what a sweep over them reads, each row read once.
    fn pending_rows(&self) -> Result<Vec<SessionRow>> {
        let mut rows = Vec::new();
        for id in self.with_pending()? {
            if let Some(row) = self.session(&id)? {
                rows.push(row);
            }
        }
        Ok(rows)
    }
    /// The session's schedules (its durable wake-ups), in schedule id order; none for a session
    /// that does not exist.
    fn schedules(&self, id: &SessionId) -> Result<Vec<Schedule>>;
    /// Every schedule of every session, by session and then schedule id: what the runtime arms
    /// its timers from when it starts. One read of the whole table (one range scan, one query),
    /// however many sessions hold schedules.
    fn all_schedules(&self) -> Result<Vec<(SessionId, Schedule)>>;

    /// The session with its active history: reads only from the latest compaction on, so the
    /// cost follows the active history, not the log.
    fn history(&self, id: &SessionId, mode: Mode) -> Result<Option<(SessionRow, History)>> {
        let Some(row) = self.session(id)? else {
            return Ok(None);
        };
        let messages = self.messages(id, history::load_from(&row), usize::MAX)?;
        let history = history::select(&row, messages, mode);
        Ok(Some((row, history)))
    }
}

/// A redb read transaction, with the tables its reads open most kept open for its life: one
/// snapshot often serves several reads (a drain reads a session's record and its pending inputs
/// together), and opening a table looks its definition up and checks its types each time.
pub(crate) struct RedbSnapshot {
    pub(crate) txn: ReadTransaction,
    sessions: OnceCell<ReadOnlyTable<&'static str, Bytes>>,
    log: OnceCell<log::ReadLog>,
}

impl RedbSnapshot {
    pub(crate) fn new(txn: ReadTransaction) -> Self {
        RedbSnapshot {
            txn,
            sessions: OnceCell::new(),
            log: OnceCell::new(),
        }
    }

    /// The sessions table, opened on first use.
    fn sessions_table(&self) -> Result<&ReadOnlyTable<&'static str, Bytes>> {
        if let Some(table) = self.sessions.get() {
            return Ok(table);
        }
        let table = self.txn.open_table(SESSIONS).map_err(storage)?;
        Ok(self.sessions.get_or_init(|| table))
    }

    /// The log's tables and parts, opened on first use.
    fn log(&self) -> Result<&log::ReadLog> {
        if let Some(log) = self.log.get() {
            return Ok(log);
        }
        let log = log::ReadLog::open(&self.txn)?;
        Ok(self.log.get_or_init(|| log))
    }

    /// A session's events with `seq >= from`, in seq order, at most `limit`, stopping once the
    /// events read hold `max_bytes` encoded (at least one is read).
    fn events_range(
        &self,
        id: &SessionId,
        from: Seq,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Stored>> {
        let mut out = Vec::new();
        let mut read = 0usize;
        if limit == 0 {
            return Ok(out);
        }
        self.log()?.for_each(id.as_str(), from.0, |_, bytes| {
            out.push(decode("event", bytes)?);
            read = read.saturating_add(bytes.len());
            Ok(out.len() < limit && read < max_bytes)
        })?;
        Ok(out)
    }

    /// Every event of the store, each session's in seq order.
    #[cfg(test)]
    fn all_events(&self, mut each: impl FnMut(SessionId, Stored)) -> Result<()> {
        self.log()?.for_all(|session, _, bytes| {
            each(session_key(session)?, decode("event", bytes)?);
            Ok(())
        })
    }

    /// A session's record as of this snapshot: the stored one, caught up with the admissions
    /// the log holds after it (see `record`).
    fn record(&self, id: &SessionId) -> Result<Option<SessionRecord>> {
        let value = self.sessions_table()?.get(id.as_str()).map_err(storage)?;
        let Some(mut record) = value
            .map(|v| decode::<SessionRecord>("session record", v.value()))
            .transpose()?
        else {
            return Ok(None);
        };
        if record.may_trail() {
            crate::rows::catch_up(&mut record, self.log()?)?;
        }
        Ok(Some(record))
    }

    /// The schedules table, `None` in a store of a format before 6 opened read-only: opening
    /// for writing creates it, a read-only open never writes.
    fn schedules_table(
        &self,
    ) -> Result<Option<ReadOnlyTable<(&'static str, &'static str), Bytes>>> {
        match self.txn.open_table(SCHEDULES) {
            Ok(table) => Ok(Some(table)),
            Err(TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(storage(e)),
        }
    }

    /// The rows of the working set's sessions that pass `keep`, in key order.
    fn working(&self, keep: fn(&SessionRow) -> bool) -> Result<Vec<SessionRow>> {
        let table = self.txn.open_table(WORKING).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            let id = session_key(key.value())?;
            if let Some(row) = self.session(&id)?
                && keep(&row)
            {
                out.push(row);
            }
        }
        Ok(out)
    }

    /// The pending inputs an inbox names: from `known` where it has them, else read from the
    /// events that admitted them. Debug builds check every known row against its event.
    fn inputs(
        &self,
        id: &SessionId,
        inbox: &Inbox,
        known: &mut dyn FnMut(Seq) -> Option<InboxRow>,
    ) -> Result<Vec<InboxRow>> {
        let mut out = Vec::new();
        for seq in inbox.seqs() {
            match known(seq) {
                Some(row) => {
                    #[cfg(debug_assertions)]
                    assert_eq!(
                        row,
                        self.input(id, seq)?,
                        "a known input differs from the log"
                    );
                    out.push(row);
                }
                None => out.push(self.input(id, seq)?),
            }
        }
        Ok(out)
    }

    /// The pending input admitted at `seq`, read from its event.
    fn input(&self, id: &SessionId, seq: Seq) -> Result<InboxRow> {
        let Some(bytes) = self.log()?.find(id.as_str(), seq.0)? else {
            return Err(crate::Error::Corrupt {
                what: format!("pending input {id}/{seq}"),
                reason: "its event is missing from the log".into(),
            });
        };
        record::inbox_row(id, decode("event", &bytes)?)
    }

    #[cfg(test)]
    fn all<K: redb::Key + 'static, T: crate::codec::Record>(
        &self,
        table: redb::TableDefinition<'_, K, &[u8]>,
        what: &str,
        mut each: impl FnMut(K::SelfType<'_>, T) -> Result<()>,
    ) -> Result<()> {
        let table = self.txn.open_table(table).map_err(storage)?;
        for entry in table.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            each(key.value(), decode(what, value.value())?)?;
        }
        Ok(())
    }
}

fn session_key(raw: &str) -> Result<SessionId> {
    SessionId::parse(raw).map_err(|e| crate::Error::Corrupt {
        what: format!("session key {raw:?}"),
        reason: e.to_string(),
    })
}

impl Snapshot for RedbSnapshot {
    fn session(&self, id: &SessionId) -> Result<Option<SessionRow>> {
        Ok(self.record(id)?.map(|record| record.row))
    }

    fn sessions(
        &self,
        cursor: Option<(Timestamp, SessionId)>,
        limit: usize,
    ) -> Result<Vec<SessionRow>> {
        let by_created = self.txn.open_table(SESSIONS_BY_CREATED).map_err(storage)?;
        let range = match &cursor {
            Some((created, id)) => by_created.range(..(created.0, id.as_str())),
            None => by_created.range::<(u64, &str)>(..),
        }
        .map_err(storage)?;
        let mut out = Vec::new();
        for entry in range.rev().take(limit) {
            let (key, _) = entry.map_err(storage)?;
            let id = session_key(key.value().1)?;
            if let Some(row) = self.session(&id)? {
                out.push(row);
            }
        }
        Ok(out)
    }

    fn messages(&self, id: &SessionId, from: Seq, limit: usize) -> Result<Vec<Message>> {
        let table = self.txn.open_table(MESSAGES).map_err(storage)?;
        let s = id.as_str();
        let mut out = Vec::new();
        for entry in table.range((s, from.0)..=(s, u64::MAX)).map_err(storage)? {
            if out.len() >= limit {
                break;
            }
            let (_, value) = entry.map_err(storage)?;
            out.push(decode("message", value.value())?);
        }
        Ok(out)
    }

    fn pending(&self, id: &SessionId) -> Result<Vec<InboxRow>> {
        match self.record(id)? {
            Some(record) => self.inputs(id, &record.inbox, &mut |_| None),
            None => Ok(Vec::new()),
        }
    }

    fn session_and_pending(&self, id: &SessionId) -> Result<Option<(SessionRow, Vec<InboxRow>)>> {
        self.session_and_pending_known(id, &mut |_| None)
    }

    fn session_and_pending_known(
        &self,
        id: &SessionId,
        known: &mut dyn FnMut(Seq) -> Option<InboxRow>,
    ) -> Result<Option<(SessionRow, Vec<InboxRow>)>> {
        let Some(record) = self.record(id)? else {
            return Ok(None);
        };
        let inputs = self.inputs(id, &record.inbox, known)?;
        Ok(Some((record.row, inputs)))
    }

    fn pending_seqs(&self, id: &SessionId) -> Result<Vec<Seq>> {
        Ok(self
            .record(id)?
            .map(|record| record.inbox.seqs().collect())
            .unwrap_or_default())
    }

    fn instructions(&self, id: &SessionId) -> Result<InstructionState> {
        let table = self.txn.open_table(INSTRUCTIONS).map_err(storage)?;
        let value = table.get(id.as_str()).map_err(storage)?;
        Ok(value
            .map(|v| decode("instruction state", v.value()))
            .transpose()?
            .unwrap_or_default())
    }

    fn index(&self, id: &MessageId) -> Result<Option<IndexEntry>> {
        let table = self.txn.open_table(INDEX).map_err(storage)?;
        let value = table.get(id.as_str()).map_err(storage)?;
        value.map(|v| decode("index entry", v.value())).transpose()
    }

    fn events(&self, id: &SessionId, from: Seq, limit: usize) -> Result<Vec<Stored>> {
        self.events_range(id, from, limit, usize::MAX)
    }

    fn events_within(
        &self,
        id: &SessionId,
        from: Seq,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Stored>> {
        self.events_range(id, from, limit, max_bytes)
    }

    fn claimed(&self) -> Result<Vec<SessionId>> {
        let rows = self.working(|row| row.claim.is_some())?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    fn with_pending(&self) -> Result<Vec<SessionId>> {
        let rows = self.pending_rows()?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    fn pending_rows(&self) -> Result<Vec<SessionRow>> {
        self.working(|row| row.pending > 0)
    }

    fn schedules(&self, id: &SessionId) -> Result<Vec<Schedule>> {
        let Some(table) = self.schedules_table()? else {
            return Ok(Vec::new());
        };
        let s = id.as_str();
        let mut out = Vec::new();
        // A session's rows are one contiguous range: from its smallest key to the next session.
        for entry in table.range((s, "")..).map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            if key.value().0 != s {
                break;
            }
            out.push(decode("schedule", value.value())?);
        }
        Ok(out)
    }

    fn all_schedules(&self) -> Result<Vec<(SessionId, Schedule)>> {
        let Some(table) = self.schedules_table()? else {
            return Ok(Vec::new());
        };
        let mut out: Vec<(SessionId, Schedule)> = Vec::new();
        for entry in table.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (session, _) = key.value();
            // Consecutive rows share their session: parse its id once, share the copy.
            let id = match out.last() {
                Some((last, _)) if last.as_str() == session => last.clone(),
                _ => session_key(session)?,
            };
            out.push((id, decode("schedule", value.value())?));
        }
        Ok(out)
    }
}

#[cfg(test)]
impl RedbSnapshot {
    /// Every projection row of the whole store, for its own tests.
    pub(crate) fn projections(&self) -> Result<agenthost_model::Projections> {
        let mut p = agenthost_model::Projections::default();
        let mut inboxes = Vec::new();
        let log = self.log()?;
        self.all(
            SESSIONS,
            "session record",
            |_, mut record: SessionRecord| {
                crate::rows::catch_up(&mut record, log)?;
                if !record.inbox.is_empty() {
                    inboxes.push((record.row.id.clone(), record.inbox));
                }
                p.sessions.insert(record.row.id.clone(), record.row);
                Ok(())
            },
        )?;
        for (s, inbox) in inboxes {
            for row in self.inputs(&s, &inbox, &mut |_| None)? {
                p.inbox.insert((s.clone(), row.admitted_seq), row);
            }
        }
        self.all(MESSAGES, "message", |(s, seq), m: Message| {
            p.messages.insert((session_key(s)?, Seq(seq)), m);
            Ok(())
        })?;
        self.all(INDEX, "index entry", |id, entry: IndexEntry| {
            let id = MessageId::parse(id).map_err(|e| crate::Error::Corrupt {
                what: format!("index key {id:?}"),
                reason: e.to_string(),
            })?;
            p.index.insert(id, entry);
            Ok(())
        })?;
        self.all(
            INSTRUCTIONS,
            "instruction state",
            |s, state: InstructionState| {
                p.instructions.insert(session_key(s)?, state);
                Ok(())
            },
        )?;
        for (s, schedule) in self.all_schedules()? {
            p.schedules.insert((s, schedule.id.clone()), schedule);
        }
        Ok(p)
    }

    /// Every session's whole log, for the store's own tests.
    pub(crate) fn logs(&self) -> Result<std::collections::BTreeMap<SessionId, Vec<Stored>>> {
        let mut logs: std::collections::BTreeMap<SessionId, Vec<Stored>> = Default::default();
        self.all_events(|s, stored| {
            logs.entry(s).or_default().push(stored);
        })?;
        Ok(logs)
    }
}
