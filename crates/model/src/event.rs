//! The durable events of a session's log.
//!
//! The store persists these through its own record types (`agenthost-store`'s codec): a new
//! variant or field fails to compile there until the store decides how to keep it.
//! Ephemeral events (deltas, tool progress) are not here; they are broadcast live only.

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Limit};
use crate::ids::{MessageId, ScheduleId, Seq, Timestamp};
use crate::message::{Finish, Usage, Verdict};
use crate::prompt::{Delivery, Prompt};
use crate::schedule::Schedule;

/// An event as stored: its position in the session's log, when it was written and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub seq: Seq,
    pub time: Timestamp,
    pub event: Event,
}

/// Every durable change to a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// Always seq 0.
    SessionCreated {
        agent: String,
        model: Option<String>,
        title: Option<String>,
    },
    /// Input recorded in the inbox, not yet visible to the model. `wake`: the admission asked
    /// for the input to run (`resume`, the default); without it the input only waits for a wake
    /// or a resume that comes for another reason, and no sweep runs it on its own.
    PromptAdmitted {
        id: MessageId,
        delivery: Delivery,
        prompt: Prompt,
        wake: bool,
    },
    /// The admitted input `id` becomes a user message at this event's seq.
    PromptPromoted {
        id: MessageId,
    },
    /// Instruction sources changed: `changed` holds the new value of each changed source, and
    /// `text` is the system message rendered from them.
    InstructionsUpdated {
        id: MessageId,
        changed: Vec<(String, String)>,
        text: String,
    },
    /// A drain began executing; takes the claim.
    ExecutionStarted {
        forced: bool,
    },
    /// Releases the claim.
    ExecutionSucceeded,
    /// Releases the claim. `halted` stops automatic resumption until an explicit resume.
    ExecutionFailed {
        error: String,
        halted: bool,
    },
    /// A user interrupt releases the claim; a shutdown keeps it so recovery resumes the session.
    ExecutionInterrupted {
        reason: InterruptReason,
    },
    /// Recovery is about to resume the session for the `attempt`-th time.
    RecoveryAttempted {
        attempt: u32,
    },
    /// Creates the assistant message `id` for one step.
    StepStarted {
        id: MessageId,
        step: u32,
        agent: String,
        model: String,
    },
    TextEnded {
        id: MessageId,
        text: String,
        incomplete: bool,
    },
    ReasoningEnded {
        id: MessageId,
        text: String,
        metadata: Option<String>,
        incomplete: bool,
    },
    /// Recorded before the tool runs.
    ToolCalled {
        id: MessageId,
        call_id: String,
        name: String,
        input: String,
    },
    ToolSucceeded {
        id: MessageId,
        call_id: String,
        output: String,
        truncated: bool,
    },
    ToolFailed {
        id: MessageId,
        call_id: String,
        error: String,
    },
    /// Settles the step; its usage is added to the session totals exactly here.
    StepEnded {
        id: MessageId,
        finish: Finish,
        usage: Usage,
    },
    StepFailed {
        id: MessageId,
        error: StepError,
    },
    /// A retryable failure before any durable output; the same assistant message is retried.
    RetryScheduled {
        id: MessageId,
        attempt: u32,
        delay_ms: u64,
        error: StepError,
    },
    CompactionStarted {
        id: MessageId,
        auto: bool,
    },
    /// History before `kept_from` is replaced by `summary`; `usage` is the summary call's.
    CompactionEnded {
        id: MessageId,
        summary: String,
        kept_from: Seq,
        usage: Usage,
    },
    CompactionFailed {
        id: MessageId,
        error: String,
    },
    /// Usage of a model call that is not a step (added to the session totals).
    UsageRecorded {
        usage: Usage,
    },
    /// Usage of an attempt of step `id` that did not end it (retried, cut off or failed): added
    /// to the message's usage and to the session totals, so the totals always equal the sum of
    /// what messages (and compactions and transient calls) show.
    StepUsage {
        id: MessageId,
        usage: Usage,
    },
    /// The whole output of tool call `call_id` when history keeps only a preview of it; written
    /// with (just before) the call's settlement. Read back through the tool-output API, never
    /// sent to the model.
    ToolOutput {
        id: MessageId,
        call_id: String,
        output: String,
    },
    /// Tool call `call_id`, recorded in the same commit, is held for a person's approval of
    /// exactly what it asks (`digest`) until `expires_at`.
    ApprovalRequested {
        id: MessageId,
        call_id: String,
        /// The call's tool, as recorded with it.
        name: String,
        digest: String,
        expires_at: Timestamp,
    },
    /// The approval of `call_id` is decided, once. The call stays held until a drain starts it
    /// (approved) or settles it with the refusal (any other verdict).
    ApprovalDecided {
        id: MessageId,
        call_id: String,
        verdict: Verdict,
        by: Option<String>,
        reason: Option<String>,
    },
    /// An approved call starts: recorded before anything runs it, so a stop after this point
    /// follows the crash rule of a started call.
    ToolStarted {
        id: MessageId,
        call_id: String,
    },
    /// A schedule is set (its id is new in the session).
    ScheduleSet {
        schedule: Schedule,
    },
    /// The schedule `id` fired for its time `at` (its `next`): with `admitted`, the input
    /// `id.firing(at)` was admitted in the same commit; without, the firing was skipped (missed
    /// while no process ran, `CatchUp::Skip`). It fires next at `next`, or never again.
    ScheduleFired {
        id: ScheduleId,
        at: Timestamp,
        next: Option<Timestamp>,
        admitted: bool,
    },
    /// The schedule `id` is cancelled.
    ScheduleCancelled {
        id: ScheduleId,
    },
    /// The session's own budget: its limits replace its agent's where set (see
    /// [`crate::budget`]). A session a budget blocked is woken to check its next call again.
    BudgetSet {
        budget: Budget,
    },
    /// A model call was not made: at its worst it would have passed the `which` limit, of which
    /// `spent` was spent. The exchange keeps its claim and its input, and waits (blocked) until
    /// the budget changes or a user interrupts it; the exchange's next start lifts the block.
    BudgetExhausted {
        which: Limit,
        spent: u64,
        limit: u64,
    },
    /// Who interrupted the exchange (a named token), recorded right after the interrupt.
    InterruptRequested {
        by: String,
    },
}

impl Event {
    /// About how many bytes the event holds: its fixed size plus its text (prompts, outputs,
    /// summaries, errors), which is what can make one event large. For bounding what a queue of
    /// events holds in bytes rather than in events.
    pub fn weight(&self) -> usize {
        let text = match self {
            Event::PromptAdmitted { prompt, .. } => prompt.size(),
            Event::InstructionsUpdated { changed, text, .. } => {
                text.len()
                    + changed
                        .iter()
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>()
            }
            Event::ExecutionFailed { error, .. }
            | Event::ToolFailed { error, .. }
            | Event::CompactionFailed { error, .. } => error.len(),
            Event::TextEnded { text, .. } => text.len(),
            Event::ReasoningEnded { text, metadata, .. } => {
                text.len() + metadata.as_ref().map_or(0, String::len)
            }
            Event::ToolCalled { input, name, .. } => input.len() + name.len(),
            Event::ToolSucceeded { output, .. } | Event::ToolOutput { output, .. } => output.len(),
            Event::CompactionEnded { summary, .. } => summary.len(),
            Event::ApprovalDecided { by, reason, .. } => {
                by.as_ref().map_or(0, String::len) + reason.as_ref().map_or(0, String::len)
            }
            Event::ScheduleSet { schedule } => schedule.prompt.size(),
            Event::InterruptRequested { by } => by.len(),
            _ => 0,
        };
        std::mem::size_of::<Event>() + text
    }

    /// The message (or admitted input) the event is about, if any.
    pub fn message_id(&self) -> Option<&MessageId> {
        match self {
            Event::PromptAdmitted { id, .. }
            | Event::PromptPromoted { id }
            | Event::InstructionsUpdated { id, .. }
            | Event::StepStarted { id, .. }
            | Event::TextEnded { id, .. }
            | Event::ReasoningEnded { id, .. }
            | Event::ToolCalled { id, .. }
            | Event::ToolSucceeded { id, .. }
            | Event::ToolFailed { id, .. }
            | Event::StepEnded { id, .. }
            | Event::StepFailed { id, .. }
            | Event::RetryScheduled { id, .. }
            | Event::CompactionStarted { id, .. }
            | Event::CompactionEnded { id, .. }
            | Event::CompactionFailed { id, .. }
            | Event::StepUsage { id, .. }
            | Event::ToolOutput { id, .. }
            | Event::ApprovalRequested { id, .. }
            | Event::ApprovalDecided { id, .. }
            | Event::ToolStarted { id, .. } => Some(id),
            Event::ScheduleSet { .. }
            | Event::ScheduleFired { .. }
            | Event::ScheduleCancelled { .. }
            | Event::BudgetSet { .. }
            | Event::BudgetExhausted { .. }
            | Event::InterruptRequested { .. } => None,
            Event::SessionCreated { .. }
            | Event::ExecutionStarted { .. }
            | Event::ExecutionSucceeded
            | Event::ExecutionFailed { .. }
            | Event::ExecutionInterrupted { .. }
            | Event::RecoveryAttempted { .. }
            | Event::UsageRecorded { .. } => None,
        }
    }

    /// A short stable name, for logs, metrics and SSE event types.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionCreated { .. } => "session_created",
            Event::PromptAdmitted { .. } => "prompt_admitted",
            Event::PromptPromoted { .. } => "prompt_promoted",
            Event::InstructionsUpdated { .. } => "instructions_updated",
            Event::ExecutionStarted { .. } => "execution_started",
            Event::ExecutionSucceeded => "execution_succeeded",
            Event::ExecutionFailed { .. } => "execution_failed",
            Event::ExecutionInterrupted { .. } => "execution_interrupted",
            Event::RecoveryAttempted { .. } => "recovery_attempted",
            Event::StepStarted { .. } => "step_started",
            Event::TextEnded { .. } => "text_ended",
            Event::ReasoningEnded { .. } => "reasoning_ended",
            Event::ToolCalled { .. } => "tool_called",
            Event::ToolSucceeded { .. } => "tool_succeeded",
            Event::ToolFailed { .. } => "tool_failed",
            Event::StepEnded { .. } => "step_ended",
            Event::StepFailed { .. } => "step_failed",
            Event::RetryScheduled { .. } => "retry_scheduled",
            Event::CompactionStarted { .. } => "compaction_started",
            Event::CompactionEnded { .. } => "compaction_ended",
            Event::CompactionFailed { .. } => "compaction_failed",
            Event::UsageRecorded { .. } => "usage_recorded",
            Event::StepUsage { .. } => "step_usage",
            Event::ToolOutput { .. } => "tool_output",
            Event::ApprovalRequested { .. } => "approval_requested",
            Event::ApprovalDecided { .. } => "approval_decided",
            Event::ToolStarted { .. } => "tool_started",
            Event::ScheduleSet { .. } => "schedule_set",
            Event::ScheduleFired { .. } => "schedule_fired",
            Event::ScheduleCancelled { .. } => "schedule_cancelled",
            Event::BudgetSet { .. } => "budget_set",
            Event::BudgetExhausted { .. } => "budget_exhausted",
            Event::InterruptRequested { .. } => "interrupt_requested",
        }
    }
}

/// Why an execution was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InterruptReason {
    /// Asked for by a user; the claim is released.
    User,
    /// The runtime is shutting down; the claim is kept so recovery resumes the session.
    Shutdown,
}

/// Why a step failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    pub kind: FailureKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// Interrupted by the user or a shutdown.
    Aborted,
    /// Left incomplete by a process that stopped; closed by recovery.
    Restarted,
    /// The provider returned an error (classification in the message).
    Provider,
    /// The request did not fit the model's context window.
    ContextOverflow,
    /// Anything else the runtime could not complete.
    Internal,
}
