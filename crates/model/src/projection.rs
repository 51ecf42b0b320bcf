//! The projector: `apply(projection, session, event)` folds one stored event into the
//! projections.
//!
//! It is written against the [`Projection`] trait, so the same code updates the store's tables
//! inside a write transaction and the in-memory [`crate::Projections`] used for replay and
//! reference models. Replay and live processing therefore cannot drift apart. Every invariant of
//! the log is checked here, before anything is written: a refused event leaves the projection
//! untouched.

use crate::error::Violation;
use crate::event::{Event, InterruptReason, Stored};
use crate::ids::{MessageId, ScheduleId, Seq, SessionId};
use crate::message::{
    Approval, AssistantMessage, CompactionState, Decision, InboxRow, IndexEntry, InstructionState,
    Message, Part, SessionRow, ToolPart, ToolState, Usage, Verdict,
};
use crate::schedule::Schedule;

/// Row-level access to projections. Implementations decide where rows live; the projector only
/// reads and writes whole rows by key.
pub trait Projection {
    type Error;

    fn session(&mut self, id: &SessionId) -> Result<Option<SessionRow>, Self::Error>;
    fn put_session(&mut self, row: SessionRow) -> Result<(), Self::Error>;
    fn message(&mut self, session: &SessionId, seq: Seq) -> Result<Option<Message>, Self::Error>;
    fn put_message(&mut self, session: &SessionId, message: Message) -> Result<(), Self::Error>;
    fn inbox(
        &mut self,
        session: &SessionId,
        admitted_seq: Seq,
    ) -> Result<Option<InboxRow>, Self::Error>;
    fn put_inbox(&mut self, session: &SessionId, row: InboxRow) -> Result<(), Self::Error>;
    fn remove_inbox(&mut self, session: &SessionId, admitted_seq: Seq) -> Result<(), Self::Error>;
    fn index(&mut self, id: &MessageId) -> Result<Option<IndexEntry>, Self::Error>;
    fn put_index(&mut self, id: &MessageId, entry: IndexEntry) -> Result<(), Self::Error>;
    fn instructions(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<InstructionState>, Self::Error>;
    fn put_instructions(
        &mut self,
        session: &SessionId,
        state: InstructionState,
    ) -> Result<(), Self::Error>;
    fn schedule(
        &mut self,
        session: &SessionId,
        id: &ScheduleId,
    ) -> Result<Option<Schedule>, Self::Error>;
    fn put_schedule(&mut self, session: &SessionId, schedule: Schedule) -> Result<(), Self::Error>;
    fn remove_schedule(&mut self, session: &SessionId, id: &ScheduleId) -> Result<(), Self::Error>;
}

/// Why an event could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError<E> {
    #[error(transparent)]
    Violation(#[from] Violation),
    #[error("projection backend failed: {0}")]
    Backend(E),
}

/// Applies one event of `session`. Checks that `stored.seq` is the next seq and that the event is
/// valid for the current rows, then writes every row it changes. All reads happen before the
/// first write, so a refused event changes nothing.
pub fn apply<P: Projection>(
    p: &mut P,
    session: &SessionId,
    stored: &Stored,
) -> Result<(), ApplyError<P::Error>> {
    let seq = stored.seq;
    let time = stored.time;
    let be = ApplyError::Backend;

    if let Event::SessionCreated {
        agent,
        model,
        title,
    } = &stored.event
    {
        if p.session(session).map_err(be)?.is_some() {
            return Err(Violation::SessionExists(session.clone()).into());
        }
        if seq != Seq::ZERO {
            return Err(Violation::SeqGap {
                session: session.clone(),
                expected: Seq::ZERO,
                got: seq,
            }
            .into());
        }
        let row = SessionRow {
            id: session.clone(),
            agent: agent.clone(),
            model: model.clone(),
            title: title.clone(),
            created: time,
            updated: time,
            last_seq: seq,
            usage: Usage::default(),
            claim: None,
            resume_attempts: 0,
            halted: None,
            active_from: Seq::ZERO,
            compaction: None,
            pending: 0,
            budget: crate::budget::Budget::default(),
            blocked: None,
        };
        p.put_session(row).map_err(be)?;
        return Ok(());
    }

    let mut row = p
        .session(session)
        .map_err(be)?
        .ok_or_else(|| Violation::NoSession(session.clone()))?;
    let expected = row.last_seq.next();
    if seq != expected {
        return Err(Violation::SeqGap {
            session: session.clone(),
            expected,
            got: seq,
        }
        .into());
    }
    row.last_seq = seq;
    row.updated = time;

    match &stored.event {
        Event::SessionCreated { .. } => unreachable!("handled above"),
        Event::PromptAdmitted {
            id,
            delivery,
            prompt,
            wake,
        } => {
            fresh_id(p, id)?;
            row.pending += 1;
            let inbox = InboxRow {
                id: id.clone(),
                admitted_seq: seq,
                delivery: *delivery,
                prompt: prompt.clone(),
                wake: *wake,
            };
            p.put_inbox(session, inbox).map_err(be)?;
            let entry = IndexEntry::Prompt {
                session: session.clone(),
                admitted_seq: seq,
                promoted_seq: None,
            };
            p.put_index(id, entry).map_err(be)?;
        }
        Event::PromptPromoted { id } => {
            let not_pending = || Violation::NotPending {
                session: session.clone(),
                id: id.clone(),
            };
            let admitted_seq = match p.index(id).map_err(be)? {
                Some(IndexEntry::Prompt {
                    session: owner,
                    admitted_seq,
                    promoted_seq: None,
                }) if owner == *session => admitted_seq,
                _ => return Err(not_pending().into()),
            };
            let inbox = p
                .inbox(session, admitted_seq)
                .map_err(be)?
                .ok_or_else(not_pending)?;
            row.pending -= 1;
            p.remove_inbox(session, admitted_seq).map_err(be)?;
            let message = Message::User {
                id: id.clone(),
                seq,
                admitted_seq,
                delivery: inbox.delivery,
                prompt: inbox.prompt,
                time,
            };
            p.put_message(session, message).map_err(be)?;
            let entry = IndexEntry::Prompt {
                session: session.clone(),
                admitted_seq,
                promoted_seq: Some(seq),
            };
            p.put_index(id, entry).map_err(be)?;
        }
        Event::InstructionsUpdated { id, changed, text } => {
            fresh_id(p, id)?;
            let mut state = p.instructions(session).map_err(be)?.unwrap_or_default();
            for (source, value) in changed {
                state.sources.insert(source.clone(), value.clone());
            }
            let message = Message::System {
                id: id.clone(),
                seq,
                text: text.clone(),
                time,
            };
            p.put_message(session, message).map_err(be)?;
            index_message(p, session, id, seq)?;
            p.put_instructions(session, state).map_err(be)?;
        }
        Event::ExecutionStarted { forced } => {
            row.claim = Some(crate::message::Claim {
                seq,
                forced: *forced,
            });
            row.halted = None;
            // A new start of the exchange lifts a budget's block: its next call is checked again.
            row.blocked = None;
        }
        Event::ExecutionSucceeded => {
            row.claim = None;
            row.resume_attempts = 0;
            row.blocked = None;
        }
        Event::ExecutionFailed { error, halted } => {
            row.claim = None;
            row.resume_attempts = 0;
            row.blocked = None;
            if *halted {
                row.halted = Some(error.clone());
            }
        }
        Event::ExecutionInterrupted { reason } => match reason {
            InterruptReason::User => {
                row.claim = None;
                row.resume_attempts = 0;
                row.blocked = None;
            }
            InterruptReason::Shutdown => {}
        },
        Event::RecoveryAttempted { attempt } => row.resume_attempts = *attempt,
        Event::StepStarted {
            id,
            step,
            agent,
            model,
        } => {
            fresh_id(p, id)?;
            let message = Message::Assistant(AssistantMessage {
                id: id.clone(),
                seq,
                step: *step,
                agent: agent.clone(),
                model: model.clone(),
                parts: Vec::new(),
                finish: None,
                error: None,
                usage: Usage::default(),
                retries: 0,
                created: time,
                completed: None,
            });
            p.put_message(session, message).map_err(be)?;
            index_message(p, session, id, seq)?;
        }
        Event::TextEnded {
            id,
            text,
            incomplete,
        } => {
            let mut a = open_assistant(p, session, id)?;
            a.parts.push(Part::Text {
                text: text.clone(),
                incomplete: *incomplete,
            });
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::ReasoningEnded {
            id,
            text,
            metadata,
            incomplete,
        } => {
            let mut a = open_assistant(p, session, id)?;
            a.parts.push(Part::Reasoning {
                text: text.clone(),
                metadata: metadata.clone(),
                incomplete: *incomplete,
            });
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::ToolCalled {
            id,
            call_id,
            name,
            input,
        } => {
            let mut a = open_assistant(p, session, id)?;
            if a.tool(call_id).is_some() {
                return Err(Violation::DuplicateToolCall {
                    session: session.clone(),
                    id: id.clone(),
                    call_id: call_id.clone(),
                }
                .into());
            }
            a.parts.push(Part::Tool(ToolPart {
                call_id: call_id.clone(),
                name: name.clone(),
                input: input.clone(),
                state: ToolState::Running,
            }));
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::ToolSucceeded {
            id,
            call_id,
            output,
            truncated,
        } => {
            let state = ToolState::Completed {
                output: output.clone(),
                truncated: *truncated,
            };
            settle_tool(p, session, id, call_id, state, false)?;
        }
        Event::ToolOutput { id, call_id, .. } => {
            // Only for a call still running: its settlement follows in the same commit.
            let running = matches!(
                message_by_id(p, session, id)?,
                Some(Message::Assistant(a))
                    if a.tool(call_id).is_some_and(|t| t.state == ToolState::Running)
            );
            if !running {
                return Err(Violation::NoRunningTool {
                    session: session.clone(),
                    id: id.clone(),
                    call_id: call_id.clone(),
                }
                .into());
            }
        }
        Event::ToolFailed { id, call_id, error } => {
            let state = ToolState::Error {
                error: error.clone(),
            };
            // A held call never ran: only a refusal (or a close) settles it, and only as failed.
            settle_tool(p, session, id, call_id, state, true)?;
        }
        Event::StepEnded { id, finish, usage } => {
            let mut a = open_assistant(p, session, id)?;
            a.finish = Some(finish.clone());
            // Added: attempts before the one that ended the step may have recorded usage.
            a.usage.add(usage);
            a.completed = Some(time);
            row.usage.add(usage);
            // Progress: recovery counts attempts in a row without a completed step.
            row.resume_attempts = 0;
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::StepFailed { id, error } => {
            let mut a = open_assistant(p, session, id)?;
            a.error = Some(error.clone());
            a.completed = Some(time);
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::RetryScheduled { id, .. } => {
            let mut a = open_assistant(p, session, id)?;
            a.retries += 1;
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::CompactionStarted { id, auto } => {
            fresh_id(p, id)?;
            let message = Message::Compaction {
                id: id.clone(),
                seq,
                auto: *auto,
                state: CompactionState::Running,
                time,
            };
            p.put_message(session, message).map_err(be)?;
            index_message(p, session, id, seq)?;
        }
        Event::CompactionEnded {
            id,
            summary,
            kept_from,
            usage,
        } => {
            let (at, auto, created) = running_compaction(p, session, id)?;
            let state = CompactionState::Completed {
                summary: summary.clone(),
                kept_from: *kept_from,
            };
            row.active_from = *kept_from;
            row.compaction = Some(at);
            row.usage.add(usage);
            let message = Message::Compaction {
                id: id.clone(),
                seq: at,
                auto,
                state,
                time: created,
            };
            p.put_message(session, message).map_err(be)?;
        }
        Event::CompactionFailed { id, error } => {
            let (at, auto, created) = running_compaction(p, session, id)?;
            let message = Message::Compaction {
                id: id.clone(),
                seq: at,
                auto,
                state: CompactionState::Failed {
                    error: error.clone(),
                },
                time: created,
            };
            p.put_message(session, message).map_err(be)?;
        }
        Event::ApprovalRequested {
            id,
            call_id,
            name,
            digest,
            expires_at,
        } => {
            // With its call, in the step's own (open) message.
            let mut a = open_assistant(p, session, id)?;
            let fresh = a.approval(call_id).is_none()
                && a.tool(call_id)
                    .is_some_and(|t| t.state == ToolState::Running && t.name == *name);
            if !fresh {
                return Err(no_approval(session, id, call_id).into());
            }
            set_tool_state(&mut a, call_id, ToolState::Held);
            a.parts.push(Part::Approval(Approval {
                call_id: call_id.clone(),
                digest: digest.clone(),
                expires_at: *expires_at,
                decision: None,
            }));
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::ApprovalDecided {
            id,
            call_id,
            verdict,
            by,
            reason,
        } => {
            let mut a = held_assistant(p, session, id, call_id)?;
            let approval = a
                .parts
                .iter_mut()
                .find_map(|part| match part {
                    Part::Approval(x) if x.call_id == *call_id && x.decision.is_none() => Some(x),
                    _ => None,
                })
                .ok_or_else(|| no_approval(session, id, call_id))?;
            approval.decision = Some(Decision {
                verdict: *verdict,
                by: by.clone(),
                reason: reason.clone(),
                time,
            });
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::ToolStarted { id, call_id } => {
            let mut a = held_assistant(p, session, id, call_id)?;
            let approved = a
                .approval(call_id)
                .and_then(|x| x.decision.as_ref())
                .is_some_and(|d| d.verdict == Verdict::Approved);
            if !approved {
                return Err(no_approval(session, id, call_id).into());
            }
            set_tool_state(&mut a, call_id, ToolState::Running);
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
        Event::ScheduleSet { schedule } => {
            if p.schedule(session, &schedule.id).map_err(be)?.is_some() {
                return Err(Violation::ScheduleExists {
                    session: session.clone(),
                    id: schedule.id.clone(),
                }
                .into());
            }
            p.put_schedule(session, schedule.clone()).map_err(be)?;
        }
        Event::ScheduleFired {
            id,
            at,
            next,
            admitted: _,
        } => {
            // Only the firing it waits for: a second attempt of the same firing finds the
            // schedule moved on (or gone) and is refused, whatever raced it.
            let mut schedule = p
                .schedule(session, id)
                .map_err(be)?
                .filter(|s| s.next == *at)
                .ok_or_else(|| Violation::NoSchedule {
                    session: session.clone(),
                    id: id.clone(),
                })?;
            match next {
                Some(next) => {
                    schedule.next = *next;
                    p.put_schedule(session, schedule).map_err(be)?;
                }
                None => p.remove_schedule(session, id).map_err(be)?,
            }
        }
        Event::ScheduleCancelled { id } => {
            if p.schedule(session, id).map_err(be)?.is_none() {
                return Err(Violation::NoSchedule {
                    session: session.clone(),
                    id: id.clone(),
                }
                .into());
            }
            p.remove_schedule(session, id).map_err(be)?;
        }
        // The block stays until the exchange starts again (or its claim goes): the drain the new
        // budget wakes goes on where the block stopped it, which only the block tells.
        Event::BudgetSet { budget } => row.budget = *budget,
        Event::BudgetExhausted { which, .. } => {
            if row.claim.is_none() {
                return Err(Violation::NotClaimed {
                    session: session.clone(),
                    what: "budget_exhausted",
                }
                .into());
            }
            row.blocked = Some(*which);
        }
        // A record of who asked; the interrupt itself is `ExecutionInterrupted`.
        Event::InterruptRequested { .. } => {}
        Event::UsageRecorded { usage } => row.usage.add(usage),
        Event::StepUsage { id, usage } => {
            let mut a = open_assistant(p, session, id)?;
            a.usage.add(usage);
            row.usage.add(usage);
            p.put_message(session, Message::Assistant(a)).map_err(be)?;
        }
    }
    p.put_session(row).map_err(be)?;
    Ok(())
}

fn fresh_id<P: Projection>(p: &mut P, id: &MessageId) -> Result<(), ApplyError<P::Error>> {
    match p.index(id).map_err(ApplyError::Backend)? {
        Some(_) => Err(Violation::DuplicateMessage(id.clone()).into()),
        None => Ok(()),
    }
}

fn index_message<P: Projection>(
    p: &mut P,
    session: &SessionId,
    id: &MessageId,
    seq: Seq,
) -> Result<(), ApplyError<P::Error>> {
    let entry = IndexEntry::Message {
        session: session.clone(),
        seq,
    };
    p.put_index(id, entry).map_err(ApplyError::Backend)
}

fn message_by_id<P: Projection>(
    p: &mut P,
    session: &SessionId,
    id: &MessageId,
) -> Result<Option<Message>, ApplyError<P::Error>> {
    match p.index(id).map_err(ApplyError::Backend)? {
        Some(IndexEntry::Message {
            session: owner,
            seq,
        }) if owner == *session => p.message(session, seq).map_err(ApplyError::Backend),
        _ => Ok(None),
    }
}

/// The unsettled assistant message `id`, or the violation that forbids touching it.
fn open_assistant<P: Projection>(
    p: &mut P,
    session: &SessionId,
    id: &MessageId,
) -> Result<AssistantMessage, ApplyError<P::Error>> {
    match message_by_id(p, session, id)? {
        Some(Message::Assistant(a)) if !a.is_settled() => Ok(a),
        Some(Message::Assistant(_)) => Err(Violation::AssistantSettled {
            session: session.clone(),
            id: id.clone(),
        }
        .into()),
        _ => Err(Violation::NoAssistant {
            session: session.clone(),
            id: id.clone(),
        }
        .into()),
    }
}

fn no_approval(session: &SessionId, id: &MessageId, call_id: &str) -> Violation {
    Violation::NoApproval {
        session: session.clone(),
        id: id.clone(),
        call_id: call_id.to_owned(),
    }
}

fn set_tool_state(a: &mut AssistantMessage, call_id: &str, state: ToolState) {
    for part in &mut a.parts {
        if let Part::Tool(t) = part
            && t.call_id == call_id
        {
            t.state = state;
            return;
        }
    }
}

/// The assistant message `id` (settled or not: a step that asked ends before its approvals are
/// decided) whose call `call_id` is held.
fn held_assistant<P: Projection>(
    p: &mut P,
    session: &SessionId,
    id: &MessageId,
    call_id: &str,
) -> Result<AssistantMessage, ApplyError<P::Error>> {
    match message_by_id(p, session, id)? {
        Some(Message::Assistant(a))
            if a.tool(call_id).is_some_and(|t| t.state == ToolState::Held) =>
        {
            Ok(a)
        }
        _ => Err(no_approval(session, id, call_id).into()),
    }
}

/// Settles a running tool call (or, with `held`, one held for its approval). Tools may settle
/// after their step failed or ended (a provider error after a tool call still lets the tool
/// settle, and a held call settles after its step), so the message need not be open.
fn settle_tool<P: Projection>(
    p: &mut P,
    session: &SessionId,
    id: &MessageId,
    call_id: &str,
    state: ToolState,
    held: bool,
) -> Result<(), ApplyError<P::Error>> {
    let no_tool = || Violation::NoRunningTool {
        session: session.clone(),
        id: id.clone(),
        call_id: call_id.to_owned(),
    };
    let Some(Message::Assistant(mut a)) = message_by_id(p, session, id)? else {
        return Err(no_tool().into());
    };
    let tool = a
        .parts
        .iter_mut()
        .find_map(|part| match part {
            Part::Tool(t)
                if t.call_id == call_id
                    && (t.state == ToolState::Running || (held && t.state == ToolState::Held)) =>
            {
                Some(t)
            }
            _ => None,
        })
        .ok_or_else(no_tool)?;
    tool.state = state;
    p.put_message(session, Message::Assistant(a))
        .map_err(ApplyError::Backend)
}

fn running_compaction<P: Projection>(
    p: &mut P,
    session: &SessionId,
    id: &MessageId,
) -> Result<(Seq, bool, crate::ids::Timestamp), ApplyError<P::Error>> {
    match message_by_id(p, session, id)? {
        Some(Message::Compaction {
            seq,
            auto,
            state: CompactionState::Running,
            time,
            ..
        }) => Ok((seq, auto, time)),
        _ => Err(Violation::NoCompaction {
            session: session.clone(),
            id: id.clone(),
        }
        .into()),
    }
}
