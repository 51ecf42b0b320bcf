//! Format 5: format 4 with the records of tool-call approvals appended. Three event variants
//! (`ApprovalRequested`, `ApprovalDecided`, `ToolStarted`), a tool state (`Held`) and a part
//! (`Approval`, with its `Decision` and `Verdict`) are new; the messages that hold those parts
//! are format 3's records with the same fields. Format 4 was format 3 with one event variant
//! appended (`PromptDeferred`). Every other record is format 3's, unchanged (`v3`). The event
//! records, which format 6 extended again, are that format's now (`v6`).
//!
//! bincode encodes an enum by its variant's position, so a variant appended at the end leaves
//! the bytes of every earlier one as they were: each format-3 or format-4 value decodes with
//! these records exactly, and that is the whole upgrade from either. As in `v3`: never change a
//! type here; a new shape is a new format (see the module docs of `codec`).

use std::borrow::Cow;

use agenthost_model as model;
use serde::{Deserialize, Serialize};

use super::v3::{
    CompactionState, Delivery, Finish, MessageId, Prompt, Result, Seq, StepError, Timestamp, Usage,
    borrowed, borrowed_opt, owned_opt,
};

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
