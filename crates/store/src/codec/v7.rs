//! Format 7: format 6 with the records of budgets and of who interrupted appended. Three event
//! variants (`BudgetSet`, `BudgetExhausted`, `InterruptRequested`) are new, with the budget and
//! its limits they hold, and the session record
//! has two more fields (the session's own budget and the limit that blocks it): a new shape, so a
//! session record is decoded by the format its value was written in (`SessionRecord::decode`),
//! and a format-3 to format-6 record reads as a session with no budget of its own, unblocked.
//! Every other record is format 6's (`v6`: schedules), format 5's (`v5`: messages) or format 3's
//! (`v3`), unchanged; the event record holds every variant of formats 3 to 7.
//!
//! bincode encodes an enum by its variant's position, so a variant appended at the end leaves
//! the bytes of every earlier one as they were: each event of formats 3 to 6 decodes with these
//! records exactly. As in `v3`: never change a type here; a new shape is a new format (see the
//! module docs of `codec`).

use std::borrow::Cow;

use agenthost_model as model;
use serde::{Deserialize, Serialize};

use super::v3::{
    Delivery, Finish, InterruptReason, MessageId, Prompt, Result, Seq, StepError, Timestamp, Usage,
    borrowed, borrowed_opt, owned_opt,
};
use super::v5::Verdict;
use super::v6::{Schedule, ScheduleId};

/// An event of the log, with its seq and time.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Stored<'a> {
    seq: Seq,
    time: Timestamp,
    event: Event<'a>,
}

impl<'a> From<&'a model::Stored> for Stored<'a> {
    fn from(stored: &'a model::Stored) -> Self {
        let model::Stored { seq, time, event } = stored;
        Stored {
            seq: (*seq).into(),
            time: (*time).into(),
            event: event.into(),
        }
    }
}

impl TryFrom<Stored<'_>> for model::Stored {
    type Error = model::Error;
    fn try_from(stored: Stored<'_>) -> Result<Self> {
        let Stored { seq, time, event } = stored;
        Ok(model::Stored {
            seq: seq.into(),
            time: time.into(),
            event: event.try_into()?,
        })
    }
}

/// Encoded by position, like every enum here: variants are never reordered or removed.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Event<'a> {
    SessionCreated {
        agent: Cow<'a, str>,
        model: Option<Cow<'a, str>>,
        title: Option<Cow<'a, str>>,
    },
    PromptAdmitted {
        id: MessageId<'a>,
        delivery: Delivery,
        prompt: Prompt<'a>,
    },
    PromptPromoted {
        id: MessageId<'a>,
    },
    InstructionsUpdated {
        id: MessageId<'a>,
        changed: Cow<'a, [(String, String)]>,
        text: Cow<'a, str>,
    },
    ExecutionStarted {
        forced: bool,
    },
    ExecutionSucceeded,
    ExecutionFailed {
        error: Cow<'a, str>,
        halted: bool,
    },
    ExecutionInterrupted {
        reason: InterruptReason,
    },
    RecoveryAttempted {
        attempt: u32,
    },
    StepStarted {
        id: MessageId<'a>,
        step: u32,
        agent: Cow<'a, str>,
        model: Cow<'a, str>,
    },
    TextEnded {
        id: MessageId<'a>,
        text: Cow<'a, str>,
        incomplete: bool,
    },
    ReasoningEnded {
        id: MessageId<'a>,
        text: Cow<'a, str>,
        metadata: Option<Cow<'a, str>>,
        incomplete: bool,
    },
    ToolCalled {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
        name: Cow<'a, str>,
        input: Cow<'a, str>,
    },
    ToolSucceeded {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
        output: Cow<'a, str>,
        truncated: bool,
    },
    ToolFailed {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
        error: Cow<'a, str>,
    },
    StepEnded {
        id: MessageId<'a>,
        finish: Finish<'a>,
        usage: Usage,
    },
    StepFailed {
        id: MessageId<'a>,
        error: StepError<'a>,
    },
    RetryScheduled {
        id: MessageId<'a>,
        attempt: u32,
        delay_ms: u64,
        error: StepError<'a>,
    },
    CompactionStarted {
        id: MessageId<'a>,
        auto: bool,
    },
    CompactionEnded {
        id: MessageId<'a>,
        summary: Cow<'a, str>,
        kept_from: Seq,
        usage: Usage,
    },
    CompactionFailed {
        id: MessageId<'a>,
        error: Cow<'a, str>,
    },
    UsageRecorded {
        usage: Usage,
    },
    StepUsage {
        id: MessageId<'a>,
        usage: Usage,
    },
    ToolOutput {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
        output: Cow<'a, str>,
    },
    // Format 4 from here on.
    /// An admission that asked for no wake (`resume: false`); `PromptAdmitted` asked for one,
    /// as every admission of format 3 did.
    PromptDeferred {
        id: MessageId<'a>,
        delivery: Delivery,
        prompt: Prompt<'a>,
    },
    // Format 5 from here on.
    ApprovalRequested {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
        name: Cow<'a, str>,
        digest: Cow<'a, str>,
        expires_at: Timestamp,
    },
    ApprovalDecided {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
        verdict: Verdict,
        by: Option<Cow<'a, str>>,
        reason: Option<Cow<'a, str>>,
    },
    ToolStarted {
        id: MessageId<'a>,
        call_id: Cow<'a, str>,
    },
    // Format 6 from here on.
    ScheduleSet {
        schedule: Schedule<'a>,
    },
    ScheduleFired {
        id: ScheduleId<'a>,
        at: Timestamp,
        next: Option<Timestamp>,
        admitted: bool,
    },
    ScheduleCancelled {
        id: ScheduleId<'a>,
    },
    // Format 7 from here on.
    BudgetSet {
        budget: Budget,
    },
    BudgetExhausted {
        which: Limit,
        spent: u64,
        limit: u64,
    },
    InterruptRequested {
        by: Cow<'a, str>,
    },
}

impl<'a> From<&'a model::Event> for Event<'a> {
    fn from(event: &'a model::Event) -> Self {
        use model::Event as M;
        match event {
            M::SessionCreated {
                agent,
                model,
                title,
            } => Event::SessionCreated {
                agent: borrowed(agent),
                model: borrowed_opt(model),
                title: borrowed_opt(title),
            },
            M::PromptAdmitted {
                id,
                delivery,
                prompt,
                wake: true,
            } => Event::PromptAdmitted {
                id: id.into(),
                delivery: (*delivery).into(),
                prompt: prompt.into(),
            },
            M::PromptAdmitted {
                id,
                delivery,
                prompt,
                wake: false,
            } => Event::PromptDeferred {
                id: id.into(),
                delivery: (*delivery).into(),
                prompt: prompt.into(),
            },
            M::PromptPromoted { id } => Event::PromptPromoted { id: id.into() },
            M::InstructionsUpdated { id, changed, text } => Event::InstructionsUpdated {
                id: id.into(),
                changed: Cow::Borrowed(changed.as_slice()),
                text: borrowed(text),
            },
            M::ExecutionStarted { forced } => Event::ExecutionStarted { forced: *forced },
            M::ExecutionSucceeded => Event::ExecutionSucceeded,
            M::ExecutionFailed { error, halted } => Event::ExecutionFailed {
                error: borrowed(error),
                halted: *halted,
            },
            M::ExecutionInterrupted { reason } => Event::ExecutionInterrupted {
                reason: (*reason).into(),
            },
            M::RecoveryAttempted { attempt } => Event::RecoveryAttempted { attempt: *attempt },
            M::StepStarted {
                id,
                step,
                agent,
                model,
            } => Event::StepStarted {
                id: id.into(),
                step: *step,
                agent: borrowed(agent),
                model: borrowed(model),
            },
            M::TextEnded {
                id,
                text,
                incomplete,
            } => Event::TextEnded {
                id: id.into(),
                text: borrowed(text),
                incomplete: *incomplete,
            },
            M::ReasoningEnded {
                id,
                text,
                metadata,
                incomplete,
            } => Event::ReasoningEnded {
                id: id.into(),
                text: borrowed(text),
                metadata: borrowed_opt(metadata),
                incomplete: *incomplete,
            },
            M::ToolCalled {
                id,
                call_id,
                name,
                input,
            } => Event::ToolCalled {
                id: id.into(),
                call_id: borrowed(call_id),
                name: borrowed(name),
                input: borrowed(input),
            },
            M::ToolSucceeded {
                id,
                call_id,
                output,
                truncated,
            } => Event::ToolSucceeded {
                id: id.into(),
                call_id: borrowed(call_id),
                output: borrowed(output),
                truncated: *truncated,
            },
            M::ToolFailed { id, call_id, error } => Event::ToolFailed {
                id: id.into(),
                call_id: borrowed(call_id),
                error: borrowed(error),
            },
            M::StepEnded { id, finish, usage } => Event::StepEnded {
                id: id.into(),
                finish: finish.into(),
                usage: usage.into(),
            },
            M::StepFailed { id, error } => Event::StepFailed {
                id: id.into(),
                error: error.into(),
            },
            M::RetryScheduled {
                id,
                attempt,
                delay_ms,
                error,
            } => Event::RetryScheduled {
                id: id.into(),
                attempt: *attempt,
                delay_ms: *delay_ms,
                error: error.into(),
            },
            M::CompactionStarted { id, auto } => Event::CompactionStarted {
                id: id.into(),
                auto: *auto,
            },
            M::CompactionEnded {
                id,
                summary,
                kept_from,
                usage,
            } => Event::CompactionEnded {
                id: id.into(),
                summary: borrowed(summary),
                kept_from: (*kept_from).into(),
                usage: usage.into(),
            },
            M::CompactionFailed { id, error } => Event::CompactionFailed {
                id: id.into(),
                error: borrowed(error),
            },
            M::UsageRecorded { usage } => Event::UsageRecorded {
                usage: usage.into(),
            },
            M::StepUsage { id, usage } => Event::StepUsage {
                id: id.into(),
                usage: usage.into(),
            },
            M::ToolOutput {
                id,
                call_id,
                output,
            } => Event::ToolOutput {
                id: id.into(),
                call_id: borrowed(call_id),
                output: borrowed(output),
            },
            M::ApprovalRequested {
                id,
                call_id,
                name,
                digest,
                expires_at,
            } => Event::ApprovalRequested {
                id: id.into(),
                call_id: borrowed(call_id),
                name: borrowed(name),
                digest: borrowed(digest),
                expires_at: (*expires_at).into(),
            },
            M::ApprovalDecided {
                id,
                call_id,
                verdict,
                by,
                reason,
            } => Event::ApprovalDecided {
                id: id.into(),
                call_id: borrowed(call_id),
                verdict: (*verdict).into(),
                by: borrowed_opt(by),
                reason: borrowed_opt(reason),
            },
            M::ToolStarted { id, call_id } => Event::ToolStarted {
                id: id.into(),
                call_id: borrowed(call_id),
            },
            M::ScheduleSet { schedule } => Event::ScheduleSet {
                schedule: schedule.into(),
            },
            M::ScheduleFired {
                id,
                at,
                next,
                admitted,
            } => Event::ScheduleFired {
                id: id.into(),
                at: (*at).into(),
                next: next.map(Into::into),
                admitted: *admitted,
            },
            M::ScheduleCancelled { id } => Event::ScheduleCancelled { id: id.into() },
            M::BudgetSet { budget } => Event::BudgetSet {
                budget: budget.into(),
            },
            M::BudgetExhausted {
                which,
                spent,
                limit,
            } => Event::BudgetExhausted {
                which: (*which).into(),
                spent: *spent,
                limit: *limit,
            },
            M::InterruptRequested { by } => Event::InterruptRequested { by: borrowed(by) },
        }
    }
}

impl TryFrom<Event<'_>> for model::Event {
    type Error = model::Error;
    fn try_from(event: Event<'_>) -> Result<Self> {
        use model::Event as M;
        Ok(match event {
            Event::SessionCreated {
                agent,
                model,
                title,
            } => M::SessionCreated {
                agent: agent.into_owned(),
                model: owned_opt(model),
                title: owned_opt(title),
            },
            Event::PromptAdmitted {
                id,
                delivery,
                prompt,
            } => M::PromptAdmitted {
                id: id.try_into()?,
                delivery: delivery.into(),
                prompt: prompt.into(),
                wake: true,
            },
            Event::PromptDeferred {
                id,
                delivery,
                prompt,
            } => M::PromptAdmitted {
                id: id.try_into()?,
                delivery: delivery.into(),
                prompt: prompt.into(),
                wake: false,
            },
            Event::PromptPromoted { id } => M::PromptPromoted { id: id.try_into()? },
            Event::InstructionsUpdated { id, changed, text } => M::InstructionsUpdated {
                id: id.try_into()?,
                changed: changed.into_owned(),
                text: text.into_owned(),
            },
            Event::ExecutionStarted { forced } => M::ExecutionStarted { forced },
            Event::ExecutionSucceeded => M::ExecutionSucceeded,
            Event::ExecutionFailed { error, halted } => M::ExecutionFailed {
                error: error.into_owned(),
                halted,
            },
            Event::ExecutionInterrupted { reason } => M::ExecutionInterrupted {
                reason: reason.into(),
            },
            Event::RecoveryAttempted { attempt } => M::RecoveryAttempted { attempt },
            Event::StepStarted {
                id,
                step,
                agent,
                model,
            } => M::StepStarted {
                id: id.try_into()?,
                step,
                agent: agent.into_owned(),
                model: model.into_owned(),
            },
            Event::TextEnded {
                id,
                text,
                incomplete,
            } => M::TextEnded {
                id: id.try_into()?,
                text: text.into_owned(),
                incomplete,
            },
            Event::ReasoningEnded {
                id,
                text,
                metadata,
                incomplete,
            } => M::ReasoningEnded {
                id: id.try_into()?,
                text: text.into_owned(),
                metadata: owned_opt(metadata),
                incomplete,
            },
            Event::ToolCalled {
                id,
                call_id,
                name,
                input,
            } => M::ToolCalled {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
                name: name.into_owned(),
                input: input.into_owned(),
            },
            Event::ToolSucceeded {
                id,
                call_id,
                output,
                truncated,
            } => M::ToolSucceeded {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
                output: output.into_owned(),
                truncated,
            },
            Event::ToolFailed { id, call_id, error } => M::ToolFailed {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
                error: error.into_owned(),
            },
            Event::StepEnded { id, finish, usage } => M::StepEnded {
                id: id.try_into()?,
                finish: finish.into(),
                usage: usage.into(),
            },
            Event::StepFailed { id, error } => M::StepFailed {
                id: id.try_into()?,
                error: error.into(),
            },
            Event::RetryScheduled {
                id,
                attempt,
                delay_ms,
                error,
            } => M::RetryScheduled {
                id: id.try_into()?,
                attempt,
                delay_ms,
                error: error.into(),
            },
            Event::CompactionStarted { id, auto } => M::CompactionStarted {
                id: id.try_into()?,
                auto,
            },
            Event::CompactionEnded {
                id,
                summary,
                kept_from,
                usage,
            } => M::CompactionEnded {
                id: id.try_into()?,
                summary: summary.into_owned(),
                kept_from: kept_from.into(),
                usage: usage.into(),
            },
            Event::CompactionFailed { id, error } => M::CompactionFailed {
                id: id.try_into()?,
                error: error.into_owned(),
            },
            Event::UsageRecorded { usage } => M::UsageRecorded {
                usage: usage.into(),
            },
            Event::StepUsage { id, usage } => M::StepUsage {
                id: id.try_into()?,
                usage: usage.into(),
            },
            Event::ToolOutput {
                id,
                call_id,
                output,
            } => M::ToolOutput {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
                output: output.into_owned(),
            },
            Event::ApprovalRequested {
                id,
                call_id,
                name,
                digest,
                expires_at,
            } => M::ApprovalRequested {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
                name: name.into_owned(),
                digest: digest.into_owned(),
                expires_at: expires_at.into(),
            },
            Event::ApprovalDecided {
                id,
                call_id,
                verdict,
                by,
                reason,
            } => M::ApprovalDecided {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
                verdict: verdict.into(),
                by: owned_opt(by),
                reason: owned_opt(reason),
            },
            Event::ToolStarted { id, call_id } => M::ToolStarted {
                id: id.try_into()?,
                call_id: call_id.into_owned(),
            },
            Event::ScheduleSet { schedule } => M::ScheduleSet {
                schedule: schedule.try_into()?,
            },
            Event::ScheduleFired {
                id,
                at,
                next,
                admitted,
            } => M::ScheduleFired {
                id: id.try_into()?,
                at: at.into(),
                next: next.map(Into::into),
                admitted,
            },
            Event::ScheduleCancelled { id } => M::ScheduleCancelled { id: id.try_into()? },
            Event::BudgetSet { budget } => M::BudgetSet {
                budget: budget.into(),
            },
            Event::BudgetExhausted {
                which,
                spent,
                limit,
            } => M::BudgetExhausted {
                which: which.into(),
                spent,
                limit,
            },
            Event::InterruptRequested { by } => M::InterruptRequested {
                by: by.into_owned(),
            },
        })
    }
}

/// A budget's limits; costs in billionths of a US dollar.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Budget {
    max_tokens: Option<u64>,
    max_cost_nanos: Option<u64>,
    turn_max_tokens: Option<u64>,
    turn_max_cost_nanos: Option<u64>,
}

impl From<&model::Budget> for Budget {
    fn from(budget: &model::Budget) -> Self {
        let model::Budget {
            max_tokens,
            max_cost_nanos,
            turn_max_tokens,
            turn_max_cost_nanos,
        } = *budget;
        Budget {
            max_tokens,
            max_cost_nanos,
            turn_max_tokens,
            turn_max_cost_nanos,
        }
    }
}

impl From<Budget> for model::Budget {
    fn from(budget: Budget) -> Self {
        let Budget {
            max_tokens,
            max_cost_nanos,
            turn_max_tokens,
            turn_max_cost_nanos,
        } = budget;
        model::Budget {
            max_tokens,
            max_cost_nanos,
            turn_max_tokens,
            turn_max_cost_nanos,
        }
    }
}

/// Encoded by position: never reordered or removed.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum Limit {
    Tokens,
    Cost,
    TurnTokens,
    TurnCost,
}

impl From<model::Limit> for Limit {
    fn from(limit: model::Limit) -> Self {
        match limit {
            model::Limit::Tokens => Limit::Tokens,
            model::Limit::Cost => Limit::Cost,
            model::Limit::TurnTokens => Limit::TurnTokens,
            model::Limit::TurnCost => Limit::TurnCost,
        }
    }
}

impl From<Limit> for model::Limit {
    fn from(limit: Limit) -> Self {
        match limit {
            Limit::Tokens => model::Limit::Tokens,
            Limit::Cost => model::Limit::Cost,
            Limit::TurnTokens => model::Limit::TurnTokens,
            Limit::TurnCost => model::Limit::TurnCost,
        }
    }
}

/// A session's record in format 7: format 3's (its row and inbox) with the row's budget fields.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SessionRecord<'a> {
    base: super::v3::SessionRecord<'a>,
    budget: Budget,
    blocked: Option<Limit>,
}

impl<'a> From<&'a crate::record::SessionRecord> for SessionRecord<'a> {
    fn from(record: &'a crate::record::SessionRecord) -> Self {
        SessionRecord {
            base: record.into(),
            budget: (&record.row.budget).into(),
            blocked: record.row.blocked.map(Into::into),
        }
    }
}

impl TryFrom<SessionRecord<'_>> for crate::record::SessionRecord {
    type Error = model::Error;
    fn try_from(record: SessionRecord<'_>) -> Result<Self> {
        let SessionRecord {
            base,
            budget,
            blocked,
        } = record;
        let mut record: crate::record::SessionRecord = base.try_into()?;
        record.row.budget = budget.into();
        record.row.blocked = blocked.map(Into::into);
        Ok(record)
    }
}
