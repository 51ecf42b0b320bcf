//! The durable operations, the same for every backend. Each runs inside the group-commit
//! transaction against the backend's [`Rows`] (an overlay of the operation's own changes),
//! decides its events from the rows it reads, and applies them through the model's projector.
//! Either all of an operation's events and row changes are written or none are.
//!
//! Admission. `prompt` input is validated before it reaches the writer. In the writer, admission
//! looks the id up in the message-id index as the batch sees it (the rows of batches not yet
//! durable included). Unknown id: one `PromptAdmitted` and its inbox entry. The same id from the
//! same session with a byte-identical prompt and the same delivery: the original receipt, nothing
//! written. Anything else: `PromptConflict`, nothing written. The planner runs operations one
//! after another, each on the rows of every one before it, so concurrent identical retries write
//! exactly one event. A session at `pending_limit` refuses a new input with `Error::Full`, checked
//! after the id lookup (an exact retry is still answered) in the admission's own transaction.
//!
//! Promotion. `Promote(boundary)` reads the pending inputs and applies `model::promotion::select`
//! inside the transaction that records the `PromptPromoted` events; a drain may also choose the
//! inputs from a complete snapshot and append the events itself. Either way the projector refuses
//! to promote an input that is not pending, so an input is promoted once. `SucceedIfIdle` appends
//! `ExecutionSucceeded` only if nothing is pending at that point of the transaction, so a drain
//! never settles over input it has not seen.

use agenthost_model::promotion::{self, Boundary};
use agenthost_model::{
    Delivery, Event, InboxRow, IndexEntry, Message, MessageId, Projection, Prompt, Seq, SessionId,
    SessionRow, Stored, Timestamp, apply,
};

use crate::error::{Error, Result};

/// Creates a session, or returns the existing one with that id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    pub id: SessionId,
    pub agent: String,
    pub model: Option<String>,
    pub title: Option<String>,
}

/// A prompt to admit. `id` is always set here: the caller mints one when the user
/// supplied none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub session: SessionId,
    pub id: MessageId,
    pub prompt: Prompt,
    pub delivery: Delivery,
    /// The admission asks for a wake (`resume`): a sweep wakes the session for this input if
    /// the wake that follows the admission is lost. Not part of the input's identity: an exact
    /// retry that differs only here returns the original receipt.
    pub wake: bool,
}

/// Proof of admission. An exact retry returns a receipt equal to the original one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub id: MessageId,
    pub session: SessionId,
    pub admitted_seq: Seq,
    pub delivery: Delivery,
    pub promoted_seq: Option<Seq>,
}

/// One step of a [`crate::Store::write`]: the actions of one write run in order, in one
/// transaction, and all of them take effect or none does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Appends the event with the session's next seq.
    Append(Event),
    /// Promotes the pending inputs the boundary selects; nothing when none qualify.
    Promote(Boundary),
    /// Refuses the whole write ([`Error::NotOwner`], nothing written) unless this node holds the
    /// session's partition at `epoch` (see [`crate::Ownership::epoch`]): a drain writes only under
    /// the lease epoch its claim was taken in, so a drain that outlived a lease lost and taken
    /// again cannot write over what the partition's owner in between recovered. The embedded
    /// store has no epochs and ignores it.
    Fence(i64),
    /// Appends `ExecutionSucceeded` only if no input is pending at this point of the
    /// transaction. An input admitted after the caller last looked is therefore never left
    /// behind a drain that already settled: the drain sees no `ExecutionSucceeded` come back
    /// and goes on to promote it.
    SucceedIfIdle,
}

/// What an operation reads and writes through: the backend's view of the rows, this operation's
/// own changes first. Dropping it without flushing discards the operation without a trace.
pub(crate) trait Rows: Projection<Error = Error> {
    /// Reads from the session's row without copying it.
    fn peek<T>(&mut self, id: &SessionId, f: impl FnOnce(&SessionRow) -> T) -> Result<Option<T>>;
    /// Pending inputs of a session in admission order.
    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<InboxRow>>;
    /// Records an event the operation wrote (its rows are already put).
    fn record(&mut self, session: &SessionId, stored: Stored);
    /// The events this operation recorded so far, in order.
    fn recorded(&self) -> &[(SessionId, Stored)];
}

/// One request to the writer.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Create(NewSession),
    Admit(Admission),
    Write(SessionId, Vec<Action>),
}

/// What an operation returns, besides the events it wrote.
#[derive(Debug)]
pub(crate) enum Outcome {
    Session(Box<SessionRow>),
    Receipt(Receipt),
    Events(Vec<Stored>),
}

/// Runs one operation. `pending_limit` bounds the pending inputs of a session (see
/// [`crate::Config::pending_limit`]).
pub(crate) fn execute(
    ov: &mut impl Rows,
    op: Op,
    now: Timestamp,
    pending_limit: u32,
) -> Result<Outcome> {
    match op {
        Op::Create(new) => create(ov, new, now).map(|row| Outcome::Session(Box::new(row))),
        Op::Admit(admission) => admit(ov, admission, now, pending_limit).map(Outcome::Receipt),
        Op::Write(session, actions) => write(ov, &session, actions, now).map(Outcome::Events),
    }
}

fn write(
    ov: &mut impl Rows,
    session: &SessionId,
    actions: Vec<Action>,
    now: Timestamp,
) -> Result<Vec<Stored>> {
    pending(ov, session)?;
    for action in actions {
        match action {
            Action::Append(event) => {
                push(ov, session, event, now)?;
            }
            Action::Promote(boundary) => promote(ov, session, boundary, now)?,
            // Checked by a backend with epochs before the operation runs.
            Action::Fence(_) => {}
            Action::SucceedIfIdle => {
                if pending(ov, session)? == 0 {
                    push(ov, session, Event::ExecutionSucceeded, now)?;
                }
            }
        }
    }
    Ok(ov
        .recorded()
        .iter()
        .map(|(_, stored)| stored.clone())
        .collect())
}

/// Appends one event with the session's next seq, through the projector, and returns the seq.
fn push(ov: &mut impl Rows, session: &SessionId, event: Event, now: Timestamp) -> Result<Seq> {
    let seq = ov
        .peek(session, |row| row.last_seq.next())?
        .unwrap_or(Seq::ZERO);
    let stored = Stored {
        seq,
        time: now,
        event,
    };
    apply(ov, session, &stored).map_err(|e| match e {
        agenthost_model::ApplyError::Violation(v) => Error::Violation(v),
        agenthost_model::ApplyError::Backend(e) => e,
    })?;
    ov.record(session, stored);
    Ok(seq)
}

/// How many inputs of the session are pending; an error if there is no such session.
fn pending(ov: &mut impl Rows, session: &SessionId) -> Result<u32> {
    ov.peek(session, |row| row.pending)?
        .ok_or_else(|| Error::SessionNotFound(session.clone()))
}

fn require_session(ov: &mut impl Rows, session: &SessionId) -> Result<SessionRow> {
    ov.session(session)?
        .ok_or_else(|| Error::SessionNotFound(session.clone()))
}

fn create(ov: &mut impl Rows, new: NewSession, now: Timestamp) -> Result<SessionRow> {
    if let Some(row) = ov.session(&new.id)? {
        return Ok(row);
    }
    let event = Event::SessionCreated {
        agent: new.agent,
        model: new.model,
        title: new.title,
    };
    push(ov, &new.id, event, now)?;
    require_session(ov, &new.id)
}

fn admit(ov: &mut impl Rows, a: Admission, now: Timestamp, pending_limit: u32) -> Result<Receipt> {
    let held = pending(ov, &a.session)?;
    let conflict = |reason| Error::PromptConflict {
        id: a.id.clone(),
        reason,
    };
    match ov.index(&a.id)? {
        None => {}
        Some(IndexEntry::Message { .. }) => return Err(conflict("the id belongs to a message")),
        Some(IndexEntry::Prompt { session, .. }) if session != a.session => {
            return Err(conflict("the id belongs to another session"));
        }
        Some(IndexEntry::Prompt {
            admitted_seq,
            promoted_seq,
            ..
        }) => {
            let (prompt, delivery) = original_input(ov, &a.session, admitted_seq, promoted_seq)?;
            if prompt != a.prompt || delivery != a.delivery {
                return Err(conflict(
                    "the id was admitted with a different prompt or delivery",
                ));
            }
            return Ok(Receipt {
                id: a.id,
                session: a.session,
                admitted_seq,
                delivery,
                promoted_seq,
            });
        }
    }
    if held >= pending_limit {
        return Err(Error::Full {
            session: a.session,
            pending: held,
        });
    }
    let event = Event::PromptAdmitted {
        id: a.id.clone(),
        delivery: a.delivery,
        prompt: a.prompt,
        wake: a.wake,
    };
    let admitted_seq = push(ov, &a.session, event, now)?;
    Ok(Receipt {
        id: a.id,
        session: a.session,
        admitted_seq,
        delivery: a.delivery,
        promoted_seq: None,
    })
}

/// The prompt and delivery an input was admitted with: from the inbox while pending, from its
/// user message once promoted.
fn original_input(
    ov: &mut impl Rows,
    session: &SessionId,
    admitted_seq: Seq,
    promoted_seq: Option<Seq>,
) -> Result<(Prompt, Delivery)> {
    let missing = || Error::Corrupt {
        what: format!("input admitted at {session}/{admitted_seq}"),
        reason: "indexed but missing from inbox and messages".into(),
    };
    match promoted_seq {
        None => {
            let row = ov.inbox(session, admitted_seq)?.ok_or_else(missing)?;
            Ok((row.prompt, row.delivery))
        }
        Some(seq) => match ov.message(session, seq)? {
            Some(Message::User {
                prompt, delivery, ..
            }) => Ok((prompt, delivery)),
            _ => Err(missing()),
        },
    }
}

fn promote(
    ov: &mut impl Rows,
    session: &SessionId,
    boundary: Boundary,
    now: Timestamp,
) -> Result<()> {
    if pending(ov, session)? == 0 {
        return Ok(());
    }
    let pending = ov.pending_inputs(session)?;
    for id in promotion::select(&pending, boundary) {
        push(ov, session, Event::PromptPromoted { id }, now)?;
    }
    Ok(())
}
