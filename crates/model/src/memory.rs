//! In-memory projections: the reference the store is compared against, and the target of replay.

use std::collections::BTreeMap;
use std::convert::Infallible;

use crate::error::Violation;
use crate::event::Stored;
use crate::ids::{MessageId, ScheduleId, Seq, SessionId};
use crate::message::{InboxRow, IndexEntry, InstructionState, Message, SessionRow};
use crate::projection::{ApplyError, Projection, apply};
use crate::schedule::Schedule;

/// Every projection table as ordered maps with the store's keys. Two stores hold the same
/// projections exactly when their `Projections` are equal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projections {
    pub sessions: BTreeMap<SessionId, SessionRow>,
    pub messages: BTreeMap<(SessionId, Seq), Message>,
    pub inbox: BTreeMap<(SessionId, Seq), InboxRow>,
    pub index: BTreeMap<MessageId, IndexEntry>,
    pub instructions: BTreeMap<SessionId, InstructionState>,
    pub schedules: BTreeMap<(SessionId, ScheduleId), Schedule>,
}

impl Projections {
    /// Applies one event; a refused event leaves `self` unchanged.
    pub fn apply(&mut self, session: &SessionId, stored: &Stored) -> Result<(), Violation> {
        apply(self, session, stored).map_err(|e| match e {
            ApplyError::Violation(v) => v,
            ApplyError::Backend(never) => match never {},
        })
    }

    /// Replays logs into empty projections. Logs of different sessions are independent except
    /// for the global message-id index, so any interleaving of whole logs gives the same result.
    pub fn replay<'a>(
        logs: impl IntoIterator<Item = (&'a SessionId, &'a [Stored])>,
    ) -> Result<Self, Violation> {
        let mut p = Projections::default();
        for (session, events) in logs {
            for stored in events {
                p.apply(session, stored)?;
            }
        }
        Ok(p)
    }

    /// Pending inputs of a session in admission order.
    pub fn pending(&self, session: &SessionId) -> Vec<InboxRow> {
        self.inbox
            .range((session.clone(), Seq::ZERO)..=(session.clone(), Seq(u64::MAX)))
            .map(|(_, row)| row.clone())
            .collect()
    }

    /// Messages of a session in seq order.
    pub fn session_messages(&self, session: &SessionId) -> Vec<Message> {
        self.messages
            .range((session.clone(), Seq::ZERO)..=(session.clone(), Seq(u64::MAX)))
            .map(|(_, m)| m.clone())
            .collect()
    }
}

impl Projection for Projections {
    type Error = Infallible;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>, Infallible> {
        Ok(self.sessions.get(id).cloned())
    }
    fn put_session(&mut self, row: SessionRow) -> Result<(), Infallible> {
        self.sessions.insert(row.id.clone(), row);
        Ok(())
    }
    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>, Infallible> {
        Ok(self.messages.get(&(session.clone(), seq)).cloned())
    }
    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<(), Infallible> {
        self.messages
            .insert((session.clone(), message.seq()), message);
        Ok(())
    }
    fn inbox(&mut self, session: &SessionId, seq: Seq) -> Result<Option<InboxRow>, Infallible> {
        Ok(self.inbox.get(&(session.clone(), seq)).cloned())
    }
    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<(), Infallible> {
        self.inbox.insert((session.clone(), row.admitted_seq), row);
        Ok(())
    }
    fn remove_inbox(&mut self, session: &SessionId, seq: Seq) -> Result<(), Infallible> {
        self.inbox.remove(&(session.clone(), seq));
        Ok(())
    }
    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>, Infallible> {
        Ok(self.index.get(id).cloned())
    }
    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<(), Infallible> {
        self.index.insert(id.clone(), entry);
        Ok(())
    }
    fn instructions(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<InstructionState>, Infallible> {
        Ok(self.instructions.get(session).cloned())
    }
    fn put_instructions(
        &mut self,
        session: &SessionId,
        state: InstructionState,
    ) -> Result<(), Infallible> {
        self.instructions.insert(session.clone(), state);
        Ok(())
    }
    fn schedule(
        &mut self,
        session: &SessionId,
        id: &ScheduleId,
    ) -> Result<Option<Schedule>, Infallible> {
        Ok(self.schedules.get(&(session.clone(), id.clone())).cloned())
    }
    fn put_schedule(&mut self, session: &SessionId, schedule: Schedule) -> Result<(), Infallible> {
        self.schedules
            .insert((session.clone(), schedule.id.clone()), schedule);
        Ok(())
    }
    fn remove_schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<(), Infallible> {
        self.schedules.remove(&(session.clone(), id.clone()));
        Ok(())
    }
}
