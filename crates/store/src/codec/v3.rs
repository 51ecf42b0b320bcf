//! Format 3: the records this version stores, and their conversions from and to the model.
//!
//! Each type mirrors the model type of the same name as it was when format 3 shipped: the same
//! variants in the same order, the same fields in the same order with the same encodings, so
//! bincode writes exactly the bytes of `testdata/golden-v3.redb`. Never change a type here; a
//! new shape is a new format (see the module docs of `codec`). The records a later format
//! extended (the events, and the messages with their parts) are that format's now (`v5`, and
//! for the events `v6`).
//!
//! Strings are `Cow`s: encoding borrows them from the model value, decoding owns them, so
//! neither copies a string twice. The conversions destructure every struct and match every
//! variant without wildcards, so a model change fails to compile here until the store decides
//! how to store it. Ids are validated again as they are decoded, as the model's own
//! `Deserialize` did.

use std::borrow::Cow;
use std::collections::BTreeMap;

use agenthost_model as model;
use agenthost_model::message::Claim as ModelClaim;
use serde::{Deserialize, Serialize};

use crate::record::{self, Inbox};

/// The model's conversions fail only on an invalid id.
pub(super) type Result<T> = std::result::Result<T, model::Error>;

pub(super) fn borrowed(s: &str) -> Cow<'_, str> {
    Cow::Borrowed(s)
}

pub(super) fn borrowed_opt(s: &Option<String>) -> Option<Cow<'_, str>> {
    s.as_deref().map(Cow::Borrowed)
}

pub(super) fn owned_opt(s: Option<Cow<'_, str>>) -> Option<String> {
    s.map(Cow::into_owned)
}

/// A session id: its text, as the model's `#[serde(into = "String")]` writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct SessionId<'a>(Cow<'a, str>);

impl<'a> From<&'a model::SessionId> for SessionId<'a> {
    fn from(id: &'a model::SessionId) -> Self {
        SessionId(borrowed(id.as_str()))
    }
}

impl TryFrom<SessionId<'_>> for model::SessionId {
    type Error = model::Error;
    fn try_from(id: SessionId<'_>) -> Result<Self> {
        model::SessionId::try_from(id.0.into_owned())
    }
}

/// A message id: its text, as the model's `#[serde(into = "String")]` writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct MessageId<'a>(Cow<'a, str>);

impl<'a> From<&'a model::MessageId> for MessageId<'a> {
    fn from(id: &'a model::MessageId) -> Self {
        MessageId(borrowed(id.as_str()))
    }
}

impl TryFrom<MessageId<'_>> for model::MessageId {
    type Error = model::Error;
    fn try_from(id: MessageId<'_>) -> Result<Self> {
        model::MessageId::try_from(id.0.into_owned())
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Seq(u64);

impl From<model::Seq> for Seq {
    fn from(model::Seq(seq): model::Seq) -> Self {
        Seq(seq)
    }
}

impl From<Seq> for model::Seq {
    fn from(Seq(seq): Seq) -> Self {
        model::Seq(seq)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Timestamp(u64);

impl From<model::Timestamp> for Timestamp {
    fn from(model::Timestamp(ms): model::Timestamp) -> Self {
        Timestamp(ms)
    }
}

impl From<Timestamp> for model::Timestamp {
    fn from(Timestamp(ms): Timestamp) -> Self {
        model::Timestamp(ms)
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Prompt<'a> {
    text: Cow<'a, str>,
    files: Vec<FileAttachment<'a>>,
}

impl<'a> From<&'a model::Prompt> for Prompt<'a> {
    fn from(prompt: &'a model::Prompt) -> Self {
        let model::Prompt { text, files } = prompt;
        Prompt {
            text: borrowed(text),
            files: files.iter().map(Into::into).collect(),
        }
    }
}

impl From<Prompt<'_>> for model::Prompt {
    fn from(prompt: Prompt<'_>) -> Self {
        let Prompt { text, files } = prompt;
        model::Prompt {
            text: text.into_owned(),
            files: files.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FileAttachment<'a> {
    mime: Cow<'a, str>,
    url: Cow<'a, str>,
    filename: Option<Cow<'a, str>>,
}

impl<'a> From<&'a model::FileAttachment> for FileAttachment<'a> {
    fn from(file: &'a model::FileAttachment) -> Self {
        let model::FileAttachment {
            mime,
            url,
            filename,
        } = file;
        FileAttachment {
            mime: borrowed(mime),
            url: borrowed(url),
            filename: borrowed_opt(filename),
        }
    }
}

impl From<FileAttachment<'_>> for model::FileAttachment {
    fn from(file: FileAttachment<'_>) -> Self {
        let FileAttachment {
            mime,
            url,
            filename,
        } = file;
        model::FileAttachment {
            mime: mime.into_owned(),
            url: url.into_owned(),
            filename: owned_opt(filename),
        }
    }
}

/// Renamed as the model's is; bincode writes the position, not the name.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Delivery {
    Steer,
    Queue,
}

impl From<model::Delivery> for Delivery {
    fn from(delivery: model::Delivery) -> Self {
        match delivery {
            model::Delivery::Steer => Delivery::Steer,
            model::Delivery::Queue => Delivery::Queue,
        }
    }
}

impl From<Delivery> for model::Delivery {
    fn from(delivery: Delivery) -> Self {
        match delivery {
            Delivery::Steer => model::Delivery::Steer,
            Delivery::Queue => model::Delivery::Queue,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum InterruptReason {
    User,
    Shutdown,
}

impl From<model::InterruptReason> for InterruptReason {
    fn from(reason: model::InterruptReason) -> Self {
        match reason {
            model::InterruptReason::User => InterruptReason::User,
            model::InterruptReason::Shutdown => InterruptReason::Shutdown,
        }
    }
}

impl From<InterruptReason> for model::InterruptReason {
    fn from(reason: InterruptReason) -> Self {
        match reason {
            InterruptReason::User => model::InterruptReason::User,
            InterruptReason::Shutdown => model::InterruptReason::Shutdown,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Finish<'a> {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Other(Cow<'a, str>),
}

impl<'a> From<&'a model::Finish> for Finish<'a> {
    fn from(finish: &'a model::Finish) -> Self {
        match finish {
            model::Finish::Stop => Finish::Stop,
            model::Finish::Length => Finish::Length,
            model::Finish::ToolCalls => Finish::ToolCalls,
            model::Finish::ContentFilter => Finish::ContentFilter,
            model::Finish::Other(other) => Finish::Other(borrowed(other)),
        }
    }
}

impl From<Finish<'_>> for model::Finish {
    fn from(finish: Finish<'_>) -> Self {
        match finish {
            Finish::Stop => model::Finish::Stop,
            Finish::Length => model::Finish::Length,
            Finish::ToolCalls => model::Finish::ToolCalls,
            Finish::ContentFilter => model::Finish::ContentFilter,
            Finish::Other(other) => model::Finish::Other(other.into_owned()),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Usage {
    input: u64,
    output: u64,
    reasoning: u64,
    cache_read: u64,
    cache_write: u64,
    cost_nanos: u64,
}

impl From<&model::Usage> for Usage {
    fn from(usage: &model::Usage) -> Self {
        let model::Usage {
            input,
            output,
            reasoning,
            cache_read,
            cache_write,
            cost_nanos,
        } = *usage;
        Usage {
            input,
            output,
            reasoning,
            cache_read,
            cache_write,
            cost_nanos,
        }
    }
}

impl From<Usage> for model::Usage {
    fn from(usage: Usage) -> Self {
        let Usage {
            input,
            output,
            reasoning,
            cache_read,
            cache_write,
            cost_nanos,
        } = usage;
        model::Usage {
            input,
            output,
            reasoning,
            cache_read,
            cache_write,
            cost_nanos,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StepError<'a> {
    kind: FailureKind,
    message: Cow<'a, str>,
}

impl<'a> From<&'a model::StepError> for StepError<'a> {
    fn from(error: &'a model::StepError) -> Self {
        let model::StepError { kind, message } = error;
        StepError {
            kind: (*kind).into(),
            message: borrowed(message),
        }
    }
}

impl From<StepError<'_>> for model::StepError {
    fn from(error: StepError<'_>) -> Self {
        let StepError { kind, message } = error;
        model::StepError {
            kind: kind.into(),
            message: message.into_owned(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum FailureKind {
    Aborted,
    Restarted,
    Provider,
    ContextOverflow,
    Internal,
}

impl From<model::FailureKind> for FailureKind {
    fn from(kind: model::FailureKind) -> Self {
        match kind {
            model::FailureKind::Aborted => FailureKind::Aborted,
            model::FailureKind::Restarted => FailureKind::Restarted,
            model::FailureKind::Provider => FailureKind::Provider,
            model::FailureKind::ContextOverflow => FailureKind::ContextOverflow,
            model::FailureKind::Internal => FailureKind::Internal,
        }
    }
}

impl From<FailureKind> for model::FailureKind {
    fn from(kind: FailureKind) -> Self {
        match kind {
            FailureKind::Aborted => model::FailureKind::Aborted,
            FailureKind::Restarted => model::FailureKind::Restarted,
            FailureKind::Provider => model::FailureKind::Provider,
            FailureKind::ContextOverflow => model::FailureKind::ContextOverflow,
            FailureKind::Internal => model::FailureKind::Internal,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum CompactionState<'a> {
    Running,
    Completed {
        summary: Cow<'a, str>,
        kept_from: Seq,
    },
    Failed {
        error: Cow<'a, str>,
    },
}

impl<'a> From<&'a model::CompactionState> for CompactionState<'a> {
    fn from(state: &'a model::CompactionState) -> Self {
        match state {
            model::CompactionState::Running => CompactionState::Running,
            model::CompactionState::Completed { summary, kept_from } => {
                CompactionState::Completed {
                    summary: borrowed(summary),
                    kept_from: (*kept_from).into(),
                }
            }
            model::CompactionState::Failed { error } => CompactionState::Failed {
                error: borrowed(error),
            },
        }
    }
}

impl From<CompactionState<'_>> for model::CompactionState {
    fn from(state: CompactionState<'_>) -> Self {
        match state {
            CompactionState::Running => model::CompactionState::Running,
            CompactionState::Completed { summary, kept_from } => {
                model::CompactionState::Completed {
                    summary: summary.into_owned(),
                    kept_from: kept_from.into(),
                }
            }
            CompactionState::Failed { error } => model::CompactionState::Failed {
                error: error.into_owned(),
            },
        }
    }
}

/// A session's record: its row and its inbox (the inbox is the store's own type already).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SessionRecord<'a> {
    row: SessionRow<'a>,
    inbox: Cow<'a, Inbox>,
}

impl<'a> From<&'a record::SessionRecord> for SessionRecord<'a> {
    fn from(record: &'a record::SessionRecord) -> Self {
        let record::SessionRecord { row, inbox, .. } = record;
        SessionRecord {
            row: row.into(),
            inbox: Cow::Borrowed(inbox),
        }
    }
}

impl TryFrom<SessionRecord<'_>> for record::SessionRecord {
    type Error = model::Error;
    fn try_from(record: SessionRecord<'_>) -> Result<Self> {
        let SessionRecord { row, inbox } = record;
        Ok(record::SessionRecord {
            row: row.try_into()?,
            inbox: inbox.into_owned(),
            trails: false,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SessionRow<'a> {
    id: SessionId<'a>,
    agent: Cow<'a, str>,
    model: Option<Cow<'a, str>>,
    title: Option<Cow<'a, str>>,
    created: Timestamp,
    updated: Timestamp,
    last_seq: Seq,
    usage: Usage,
    claim: Option<Claim>,
    resume_attempts: u32,
    halted: Option<Cow<'a, str>>,
    active_from: Seq,
    compaction: Option<Seq>,
    pending: u32,
}

impl<'a> From<&'a model::SessionRow> for SessionRow<'a> {
    fn from(row: &'a model::SessionRow) -> Self {
        let model::SessionRow {
            id,
            agent,
            model,
            title,
            created,
            updated,
            last_seq,
            usage,
            claim,
            resume_attempts,
            halted,
            active_from,
            compaction,
            pending,
            // Format 7's, kept beside this record (see `v7::SessionRecord`).
            budget: _,
            blocked: _,
        } = row;
        SessionRow {
            id: id.into(),
            agent: borrowed(agent),
            model: borrowed_opt(model),
            title: borrowed_opt(title),
            created: (*created).into(),
            updated: (*updated).into(),
            last_seq: (*last_seq).into(),
            usage: usage.into(),
            claim: claim.as_ref().map(Into::into),
            resume_attempts: *resume_attempts,
            halted: borrowed_opt(halted),
            active_from: (*active_from).into(),
            compaction: compaction.map(Into::into),
            pending: *pending,
        }
    }
}

impl TryFrom<SessionRow<'_>> for model::SessionRow {
    type Error = model::Error;
    fn try_from(row: SessionRow<'_>) -> Result<Self> {
        let SessionRow {
            id,
            agent,
            model,
            title,
            created,
            updated,
            last_seq,
            usage,
            claim,
            resume_attempts,
            halted,
            active_from,
            compaction,
            pending,
        } = row;
        Ok(model::SessionRow {
            id: id.try_into()?,
            agent: agent.into_owned(),
            model: owned_opt(model),
            title: owned_opt(title),
            created: created.into(),
            updated: updated.into(),
            last_seq: last_seq.into(),
            usage: usage.into(),
            claim: claim.map(Into::into),
            resume_attempts,
            halted: owned_opt(halted),
            active_from: active_from.into(),
            compaction: compaction.map(Into::into),
            pending,
            budget: model::Budget::default(),
            blocked: None,
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Claim {
    seq: Seq,
    forced: bool,
}

impl From<&ModelClaim> for Claim {
    fn from(claim: &ModelClaim) -> Self {
        let ModelClaim { seq, forced } = *claim;
        Claim {
            seq: seq.into(),
            forced,
        }
    }
}

impl From<Claim> for ModelClaim {
    fn from(claim: Claim) -> Self {
        let Claim { seq, forced } = claim;
        ModelClaim {
            seq: seq.into(),
            forced,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum IndexEntry<'a> {
    Prompt {
        session: SessionId<'a>,
        admitted_seq: Seq,
        promoted_seq: Option<Seq>,
    },
    Message {
        session: SessionId<'a>,
        seq: Seq,
    },
}

impl<'a> From<&'a model::IndexEntry> for IndexEntry<'a> {
    fn from(entry: &'a model::IndexEntry) -> Self {
        match entry {
            model::IndexEntry::Prompt {
                session,
                admitted_seq,
                promoted_seq,
            } => IndexEntry::Prompt {
                session: session.into(),
                admitted_seq: (*admitted_seq).into(),
                promoted_seq: promoted_seq.map(Into::into),
            },
            model::IndexEntry::Message { session, seq } => IndexEntry::Message {
                session: session.into(),
                seq: (*seq).into(),
            },
        }
    }
}

impl TryFrom<IndexEntry<'_>> for model::IndexEntry {
    type Error = model::Error;
    fn try_from(entry: IndexEntry<'_>) -> Result<Self> {
        Ok(match entry {
            IndexEntry::Prompt {
                session,
                admitted_seq,
                promoted_seq,
            } => model::IndexEntry::Prompt {
                session: session.try_into()?,
                admitted_seq: admitted_seq.into(),
                promoted_seq: promoted_seq.map(Into::into),
            },
            IndexEntry::Message { session, seq } => model::IndexEntry::Message {
                session: session.try_into()?,
                seq: seq.into(),
            },
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct InstructionState<'a> {
    sources: Cow<'a, BTreeMap<String, String>>,
}

impl<'a> From<&'a model::InstructionState> for InstructionState<'a> {
    fn from(state: &'a model::InstructionState) -> Self {
        let model::InstructionState { sources } = state;
        InstructionState {
            sources: Cow::Borrowed(sources),
        }
    }
}

impl From<InstructionState<'_>> for model::InstructionState {
    fn from(state: InstructionState<'_>) -> Self {
        let InstructionState { sources } = state;
        model::InstructionState {
            sources: sources.into_owned(),
        }
    }
}
