//! Format 5: format 4 with the records of tool-call approvals appended. Three event variants
//! (`ApprovalRequested`, `ApprovalDecided`, `ToolStarted`), a tool state (`Held`) and a part
//! (`Approval`, with its `Decision` and `Verdict`) are new; the messages that hold those parts
//! are format 3's records with the same fields. Format 4 was format 3 with one event variant
//! appended (`PromptDeferred`). Every other record is format 3's, unchanged (`v3`).
//!
//! bincode encodes an enum by its variant's position, so a variant appended at the end leaves
//! the bytes of every earlier one as they were: each format-3 or format-4 value decodes with
//! these records exactly, and that is the whole upgrade from either. As in `v3`: never change a
//! type here; a new shape is a new format (see the module docs of `codec`).

use std::borrow::Cow;

use agenthost_model as model;
use serde::{Deserialize, Serialize};

use super::v3::{
    CompactionState, Delivery, Finish, InterruptReason, MessageId, Prompt, Result, Seq, StepError,
    Timestamp, Usage, borrowed, borrowed_opt, owned_opt,
};

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
        })
    }
}

// The messages: format 3's records field for field, holding format 5's parts and tool states.

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Message<'a> {
    User {
        id: MessageId<'a>,
        seq: Seq,
        admitted_seq: Seq,
        delivery: Delivery,
        prompt: Prompt<'a>,
        time: Timestamp,
    },
    Assistant(AssistantMessage<'a>),
    System {
        id: MessageId<'a>,
        seq: Seq,
        text: Cow<'a, str>,
        time: Timestamp,
    },
    Compaction {
        id: MessageId<'a>,
        seq: Seq,
        auto: bool,
        state: CompactionState<'a>,
        time: Timestamp,
    },
}

impl<'a> From<&'a model::Message> for Message<'a> {
    fn from(message: &'a model::Message) -> Self {
        use model::Message as M;
        match message {
            M::User {
                id,
                seq,
                admitted_seq,
                delivery,
                prompt,
                time,
            } => Message::User {
                id: id.into(),
                seq: (*seq).into(),
                admitted_seq: (*admitted_seq).into(),
                delivery: (*delivery).into(),
                prompt: prompt.into(),
                time: (*time).into(),
            },
            M::Assistant(assistant) => Message::Assistant(assistant.into()),
            M::System {
                id,
                seq,
                text,
                time,
            } => Message::System {
                id: id.into(),
                seq: (*seq).into(),
                text: borrowed(text),
                time: (*time).into(),
            },
            M::Compaction {
                id,
                seq,
                auto,
                state,
                time,
            } => Message::Compaction {
                id: id.into(),
                seq: (*seq).into(),
                auto: *auto,
                state: state.into(),
                time: (*time).into(),
            },
        }
    }
}

impl TryFrom<Message<'_>> for model::Message {
    type Error = model::Error;
    fn try_from(message: Message<'_>) -> Result<Self> {
        use model::Message as M;
        Ok(match message {
            Message::User {
                id,
                seq,
                admitted_seq,
                delivery,
                prompt,
                time,
            } => M::User {
                id: id.try_into()?,
                seq: seq.into(),
                admitted_seq: admitted_seq.into(),
                delivery: delivery.into(),
                prompt: prompt.into(),
                time: time.into(),
            },
            Message::Assistant(assistant) => M::Assistant(assistant.try_into()?),
            Message::System {
                id,
                seq,
                text,
                time,
            } => M::System {
                id: id.try_into()?,
                seq: seq.into(),
                text: text.into_owned(),
                time: time.into(),
            },
            Message::Compaction {
                id,
                seq,
                auto,
                state,
                time,
            } => M::Compaction {
                id: id.try_into()?,
                seq: seq.into(),
                auto,
                state: state.into(),
                time: time.into(),
            },
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AssistantMessage<'a> {
    id: MessageId<'a>,
    seq: Seq,
    step: u32,
    agent: Cow<'a, str>,
    model: Cow<'a, str>,
    parts: Vec<Part<'a>>,
    finish: Option<Finish<'a>>,
    error: Option<StepError<'a>>,
    usage: Usage,
    retries: u32,
    created: Timestamp,
    completed: Option<Timestamp>,
}

impl<'a> From<&'a model::AssistantMessage> for AssistantMessage<'a> {
    fn from(message: &'a model::AssistantMessage) -> Self {
        let model::AssistantMessage {
            id,
            seq,
            step,
            agent,
            model,
            parts,
            finish,
            error,
            usage,
            retries,
            created,
            completed,
        } = message;
        AssistantMessage {
            id: id.into(),
            seq: (*seq).into(),
            step: *step,
            agent: borrowed(agent),
            model: borrowed(model),
            parts: parts.iter().map(Into::into).collect(),
            finish: finish.as_ref().map(Into::into),
            error: error.as_ref().map(Into::into),
            usage: usage.into(),
            retries: *retries,
            created: (*created).into(),
            completed: completed.map(Into::into),
        }
    }
}

impl TryFrom<AssistantMessage<'_>> for model::AssistantMessage {
    type Error = model::Error;
    fn try_from(message: AssistantMessage<'_>) -> Result<Self> {
        let AssistantMessage {
            id,
            seq,
            step,
            agent,
            model,
            parts,
            finish,
            error,
            usage,
            retries,
            created,
            completed,
        } = message;
        Ok(model::AssistantMessage {
            id: id.try_into()?,
            seq: seq.into(),
            step,
            agent: agent.into_owned(),
            model: model.into_owned(),
            parts: parts.into_iter().map(Into::into).collect(),
            finish: finish.map(Into::into),
            error: error.map(Into::into),
            usage: usage.into(),
            retries,
            created: created.into(),
            completed: completed.map(Into::into),
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Part<'a> {
    Text {
        text: Cow<'a, str>,
        incomplete: bool,
    },
    Reasoning {
        text: Cow<'a, str>,
        metadata: Option<Cow<'a, str>>,
        incomplete: bool,
    },
    Tool(ToolPart<'a>),
    // Format 5 from here on.
    Approval(Approval<'a>),
}

impl<'a> From<&'a model::Part> for Part<'a> {
    fn from(part: &'a model::Part) -> Self {
        match part {
            model::Part::Text { text, incomplete } => Part::Text {
                text: borrowed(text),
                incomplete: *incomplete,
            },
            model::Part::Reasoning {
                text,
                metadata,
                incomplete,
            } => Part::Reasoning {
                text: borrowed(text),
                metadata: borrowed_opt(metadata),
                incomplete: *incomplete,
            },
            model::Part::Tool(tool) => Part::Tool(tool.into()),
            model::Part::Approval(approval) => Part::Approval(approval.into()),
        }
    }
}

impl From<Part<'_>> for model::Part {
    fn from(part: Part<'_>) -> Self {
        match part {
            Part::Text { text, incomplete } => model::Part::Text {
                text: text.into_owned(),
                incomplete,
            },
            Part::Reasoning {
                text,
                metadata,
                incomplete,
            } => model::Part::Reasoning {
                text: text.into_owned(),
                metadata: owned_opt(metadata),
                incomplete,
            },
            Part::Tool(tool) => model::Part::Tool(tool.into()),
            Part::Approval(approval) => model::Part::Approval(approval.into()),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ToolPart<'a> {
    call_id: Cow<'a, str>,
    name: Cow<'a, str>,
    input: Cow<'a, str>,
    state: ToolState<'a>,
}

impl<'a> From<&'a model::ToolPart> for ToolPart<'a> {
    fn from(tool: &'a model::ToolPart) -> Self {
        let model::ToolPart {
            call_id,
            name,
            input,
            state,
        } = tool;
        ToolPart {
            call_id: borrowed(call_id),
            name: borrowed(name),
            input: borrowed(input),
            state: state.into(),
        }
    }
}

impl From<ToolPart<'_>> for model::ToolPart {
    fn from(tool: ToolPart<'_>) -> Self {
        let ToolPart {
            call_id,
            name,
            input,
            state,
        } = tool;
        model::ToolPart {
            call_id: call_id.into_owned(),
            name: name.into_owned(),
            input: input.into_owned(),
            state: state.into(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToolState<'a> {
    Running,
    Completed {
        output: Cow<'a, str>,
        truncated: bool,
    },
    Error {
        error: Cow<'a, str>,
    },
    // Format 5 from here on.
    Held,
}

impl<'a> From<&'a model::ToolState> for ToolState<'a> {
    fn from(state: &'a model::ToolState) -> Self {
        match state {
            model::ToolState::Running => ToolState::Running,
            model::ToolState::Completed { output, truncated } => ToolState::Completed {
                output: borrowed(output),
                truncated: *truncated,
            },
            model::ToolState::Error { error } => ToolState::Error {
                error: borrowed(error),
            },
            model::ToolState::Held => ToolState::Held,
        }
    }
}

impl From<ToolState<'_>> for model::ToolState {
    fn from(state: ToolState<'_>) -> Self {
        match state {
            ToolState::Running => model::ToolState::Running,
            ToolState::Completed { output, truncated } => model::ToolState::Completed {
                output: output.into_owned(),
                truncated,
            },
            ToolState::Error { error } => model::ToolState::Error {
                error: error.into_owned(),
            },
            ToolState::Held => model::ToolState::Held,
        }
    }
}

/// A tool call's approval (format 5).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Approval<'a> {
    call_id: Cow<'a, str>,
    digest: Cow<'a, str>,
    expires_at: Timestamp,
    decision: Option<Decision<'a>>,
}

impl<'a> From<&'a model::Approval> for Approval<'a> {
    fn from(approval: &'a model::Approval) -> Self {
        let model::Approval {
            call_id,
            digest,
            expires_at,
            decision,
        } = approval;
        Approval {
            call_id: borrowed(call_id),
            digest: borrowed(digest),
            expires_at: (*expires_at).into(),
            decision: decision.as_ref().map(Into::into),
        }
    }
}

impl From<Approval<'_>> for model::Approval {
    fn from(approval: Approval<'_>) -> Self {
        let Approval {
            call_id,
            digest,
            expires_at,
            decision,
        } = approval;
        model::Approval {
            call_id: call_id.into_owned(),
            digest: digest.into_owned(),
            expires_at: expires_at.into(),
            decision: decision.map(Into::into),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Decision<'a> {
    verdict: Verdict,
    by: Option<Cow<'a, str>>,
    reason: Option<Cow<'a, str>>,
    time: Timestamp,
}

impl<'a> From<&'a model::Decision> for Decision<'a> {
    fn from(decision: &'a model::Decision) -> Self {
        let model::Decision {
            verdict,
            by,
            reason,
            time,
        } = decision;
        Decision {
            verdict: (*verdict).into(),
            by: borrowed_opt(by),
            reason: borrowed_opt(reason),
            time: (*time).into(),
        }
    }
}

impl From<Decision<'_>> for model::Decision {
    fn from(decision: Decision<'_>) -> Self {
        let Decision {
            verdict,
            by,
            reason,
            time,
        } = decision;
        model::Decision {
            verdict: verdict.into(),
            by: owned_opt(by),
            reason: owned_opt(reason),
            time: time.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum Verdict {
    Approved,
    Denied,
    Expired,
    Cancelled,
}

impl From<model::Verdict> for Verdict {
    fn from(verdict: model::Verdict) -> Self {
        match verdict {
            model::Verdict::Approved => Verdict::Approved,
            model::Verdict::Denied => Verdict::Denied,
            model::Verdict::Expired => Verdict::Expired,
            model::Verdict::Cancelled => Verdict::Cancelled,
        }
    }
}

impl From<Verdict> for model::Verdict {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Approved => model::Verdict::Approved,
            Verdict::Denied => model::Verdict::Denied,
            Verdict::Expired => model::Verdict::Expired,
            Verdict::Cancelled => model::Verdict::Cancelled,
        }
    }
}
