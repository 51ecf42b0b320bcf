//! What a session owes: one pure decision over its durable projection (ARCHITECTURE.md,
//! "Recovery: what a session owes").
//!
//! Every place that decides whether a session must run again asks [`owed`]: a drain as it
//! starts, recovery after a crash or a shutdown, and the supervisor when it gives up on a
//! session. The answer depends only on what is durable (the session row and its active history),
//! never on what a process remembers, so a restart at any commit boundary reaches the same
//! answer as the process that stopped there.
//!
//! The claim is what tells a user interrupt from a shutdown or a crash: an interrupt releases it
//! (`ExecutionInterrupted { User }`), a shutdown keeps it and a crash never gets to release it.
//! A step ends its drain explicitly (`StepFailed` in the same commit as `ExecutionFailed`), so a
//! failed step under a held claim is one whose retry or continuation was still to come.
//!
//! [`leftovers`] lists what a stopped execution left open (running tools, unsettled steps,
//! running compactions), and [`close`] turns them into the events that fail them, for the paths
//! that must not run anything again (giving up, a halt).

use crate::event::{Event, FailureKind, StepError};
use crate::ids::{MessageId, Timestamp};
use crate::message::{
    AssistantMessage, CompactionState, Decision, Finish, Message, Part, SessionRow, ToolPart,
    Verdict,
};
use crate::promotion::Boundary;

/// Limits the decision applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The session agent's step limit: a step at or past it owes no continuation.
    pub max_steps: u32,
    /// Recoveries in a row without a completed step before the session is failed for good.
    pub max_attempts: u32,
}

/// What a session owes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owed {
    /// Every admitted input is answered or explicitly failed: no model call is owed.
    Nothing,
    /// The session is halted: nothing runs until an explicit resume.
    Halted,
    /// Recovery gave up: the session must be failed explicitly, with this reason, and halted.
    Fail(String),
    /// The exchange waits for a person: a call of its last step waits for its approval. No call
    /// is owed (new input waits behind it) until every approval of the step is decided, or the
    /// earliest of them expires at `expires_at`.
    Waiting { expires_at: Timestamp },
    /// The exchange's next call would pass this limit of its budget: nothing is owed (new input
    /// waits behind it) until the budget changes (`BudgetSet`) or a user interrupts it.
    Blocked(crate::budget::Limit),
    /// A model call is owed, for this reason.
    Call(Why),
}

/// Why a model call is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Input is pending and no exchange is in progress.
    NewInput,
    /// A promoted user message has no answer yet.
    Unanswered,
    /// A step called tools and their results wait for the model.
    ToolResults,
    /// A step was cut by a crash or a shutdown before it settled.
    CutStep,
    /// A step failed and its retry or continuation was still to come.
    PendingRetry,
    /// A compaction was cut before it settled; the step it preceded is owed.
    Compaction,
    /// Every approval the last step asked for is decided: its held calls are started or refused,
    /// and their results are owed a call.
    Decided,
}

impl Owed {
    pub fn is_call(&self) -> bool {
        matches!(self, Owed::Call(_))
    }
}

impl Why {
    /// The boundary the call's drain promotes at. Pending input alone starts a new exchange
    /// (`Idle`: steers, or else one queued input). Anything else continues the exchange a stop
    /// cut, which a queued input waits out however the stop came (`Continuation`: only steers
    /// join, as they would have joined the live exchange).
    pub fn boundary(self) -> Boundary {
        match self {
            Why::NewInput => Boundary::Idle,
            Why::Unanswered
            | Why::ToolResults
            | Why::CutStep
            | Why::PendingRetry
            | Why::Compaction
            | Why::Decided => Boundary::Continuation,
        }
    }
}

/// Says what the session owes, from its row and its active history (in seq order).
///
/// The claim is read as left by an execution that is gone: call this where no execution of the
/// session is live (a drain's start, recovery, a halt).
pub fn owed(row: &SessionRow, messages: &[Message], policy: &Policy) -> Owed {
    if row.halted.is_some() {
        return Owed::Halted;
    }
    let claimed = row.claim.is_some();
    if claimed && row.resume_attempts >= policy.max_attempts {
        return Owed::Fail(format!(
            "interrupted repeatedly: {} recoveries in a row did not complete a step; resume to \
             retry",
            row.resume_attempts
        ));
    }
    if claimed && let Some(limit) = row.blocked {
        return Owed::Blocked(limit);
    }
    if claimed && let Some(expires_at) = waiting(messages) {
        return Owed::Waiting { expires_at };
    }
    match turn(messages, claimed, policy.max_steps) {
        Some(why) => Owed::Call(why),
        None if row.pending > 0 => Owed::Call(Why::NewInput),
        None => Owed::Nothing,
    }
}

/// Whether the history owes the model a call, ignoring pending input and attempts. `claimed`
/// says whether the session's claim is still held (a shutdown or a crash). Without it the last
/// execution ended on its own terms (an answer, a user interrupt, an explicit failure), and
/// whatever it left unanswered was ended with it: only pending input is owed then.
pub fn turn(messages: &[Message], claimed: bool, max_steps: u32) -> Option<Why> {
    if !claimed {
        return None;
    }
    // A manual compaction takes its claim with its start and releases it with its end, in the
    // same commits: a claim whose history holds one still running is that compaction's, and a
    // stop during it owes nothing of the turn before it (which ended on its own terms).
    let manual_compaction = messages.iter().any(|m| {
        matches!(
            m,
            Message::Compaction {
                auto: false,
                state: CompactionState::Running,
                ..
            }
        )
    });
    if manual_compaction {
        return None;
    }
    let cut_compaction = messages.iter().any(|m| {
        matches!(
            m,
            Message::Compaction {
                auto: true,
                state: CompactionState::Running,
                ..
            }
        )
    });
    let last = last_speaking(messages);
    if let Some(Some(a)) = last
        && a.held_tools().next().is_some()
    {
        // A step that asked for approvals: its calls wait (`waiting`) until every one is
        // decided, and then continue the exchange.
        let undecided = a.held_tools().any(|t| {
            a.approval(&t.call_id)
                .is_none_or(|approval| approval.decision.is_none())
        });
        return (!undecided).then_some(Why::Decided);
    }
    let why = match last {
        None => None,
        Some(None) => Some(Why::Unanswered),
        Some(Some(a)) => match (&a.finish, &a.error) {
            // Unsettled: the process stopped while the model streamed or tools ran.
            (None, None) => Some(Why::CutStep),
            (_, Some(error)) => Some(match error.kind {
                FailureKind::Aborted | FailureKind::Restarted => Why::CutStep,
                _ => Why::PendingRetry,
            }),
            (Some(finish), None) => {
                let called = a.parts.iter().any(|p| matches!(p, Part::Tool(_)));
                // A filtered answer ends the turn; so does the last step, whose calls failed.
                let continues =
                    called && a.step < max_steps && !matches!(finish, Finish::ContentFilter);
                continues.then_some(Why::ToolResults)
            }
        },
    };
    match why {
        Some(_) if cut_compaction => Some(Why::Compaction),
        other => other,
    }
}

/// The newest message that speaks (`Some(None)`: a user message): system updates and
/// compactions do not answer anything.
fn last_speaking(messages: &[Message]) -> Option<Option<&AssistantMessage>> {
    messages.iter().rev().find_map(|m| match m {
        Message::User { .. } => Some(None),
        Message::Assistant(a) => Some(Some(a)),
        Message::System { .. } | Message::Compaction { .. } => None,
    })
}

/// When the exchange waits for a person: the earliest expiry of the undecided approvals of its
/// last step, if it has any.
pub fn waiting(messages: &[Message]) -> Option<Timestamp> {
    let Some(Some(a)) = last_speaking(messages) else {
        return None;
    };
    a.held_tools()
        .filter_map(|t| a.approval(&t.call_id))
        .filter(|approval| approval.decision.is_none())
        .map(|approval| approval.expires_at)
        .min()
}

/// A call held for its approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub message: MessageId,
    pub tool: ToolPart,
    pub digest: String,
    pub expires_at: Timestamp,
    pub decision: Option<Decision>,
}

/// The held calls of `a` with their approvals, in call order.
pub fn held(a: &AssistantMessage) -> Vec<Held> {
    a.held_tools()
        .map(|tool| {
            let approval = a.approval(&tool.call_id);
            Held {
                message: a.id.clone(),
                tool: tool.clone(),
                digest: approval.map(|x| x.digest.clone()).unwrap_or_default(),
                expires_at: approval.map_or(Timestamp(0), |x| x.expires_at),
                decision: approval.and_then(|x| x.decision.clone()),
            }
        })
        .collect()
}

/// The events that settle held calls without running them, each as its decision says (a
/// refusal is the model's result), withdrawing the undecided ones first (`Cancelled` with
/// `reason`). An approved call not started yet fails with `reason` too: whatever ends the
/// exchange ends it before it ran.
pub fn withdraw(held: &[Held], reason: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for h in held {
        let decision = match &h.decision {
            Some(decision) => decision.clone(),
            None => {
                events.push(Event::ApprovalDecided {
                    id: h.message.clone(),
                    call_id: h.tool.call_id.clone(),
                    verdict: Verdict::Cancelled,
                    by: None,
                    reason: Some(reason.to_owned()),
                });
                Decision {
                    verdict: Verdict::Cancelled,
                    by: None,
                    reason: Some(reason.to_owned()),
                    time: Timestamp(0),
                }
            }
        };
        let error = decision
            .refusal()
            .unwrap_or_else(|| format!("the call was approved, but not run: {reason}"));
        events.push(Event::ToolFailed {
            id: h.message.clone(),
            call_id: h.tool.call_id.clone(),
            error,
        });
    }
    events
}

/// What a stopped execution left open, in history order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Tool calls recorded as called and never settled, with their assistant message.
    pub tools: Vec<(MessageId, ToolPart)>,
    /// Tool calls held for an approval (decided or not) and never started.
    pub held: Vec<Held>,
    /// Assistant messages never settled.
    pub steps: Vec<MessageId>,
    /// Compactions started and never settled.
    pub compactions: Vec<MessageId>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
            && self.held.is_empty()
            && self.steps.is_empty()
            && self.compactions.is_empty()
    }
}

/// Lists what is open in `messages`.
pub fn leftovers(messages: &[Message]) -> Leftovers {
    let mut left = Leftovers::default();
    for message in messages {
        match message {
            Message::Assistant(a) => {
                left.tools
                    .extend(a.running_tools().map(|t| (a.id.clone(), t.clone())));
                left.held.extend(held(a));
                if !a.is_settled() {
                    left.steps.push(a.id.clone());
                }
            }
            Message::Compaction {
                id,
                state: CompactionState::Running,
                ..
            } => left.compactions.push(id.clone()),
            _ => {}
        }
    }
    left
}

/// The step error of a step a stopped process left open.
pub fn restarted() -> StepError {
    StepError {
        kind: FailureKind::Restarted,
        message: "interrupted by restart".into(),
    }
}

/// The step error of a step a user interrupt (or a shutdown) cut.
pub fn aborted() -> StepError {
    StepError {
        kind: FailureKind::Aborted,
        message: "aborted".into(),
    }
}

/// What a running tool a user interrupt cut is settled with.
pub const INTERRUPTED_TOOL: &str = "interrupted";

/// The events that end what a stopped execution left as a user interrupt of it would have: tools
/// failed "interrupted", approvals withdrawn, steps aborted, compactions failed, and the claim
/// released (`ExecutionInterrupted { User }`). For an interrupt that reaches a session whose
/// execution is gone before recovery ran it, or one that waits for approvals: the interrupt
/// wins, and nothing is run again.
pub fn interrupt(left: &Leftovers) -> Vec<Event> {
    let held = withdraw(&left.held, INTERRUPTED_TOOL);
    let tools = left.tools.iter().map(|(id, tool)| Event::ToolFailed {
        id: id.clone(),
        call_id: tool.call_id.clone(),
        error: INTERRUPTED_TOOL.to_owned(),
    });
    let steps = left.steps.iter().map(|id| Event::StepFailed {
        id: id.clone(),
        error: aborted(),
    });
    let compactions = left.compactions.iter().map(|id| Event::CompactionFailed {
        id: id.clone(),
        error: INTERRUPTED_TOOL.to_owned(),
    });
    held.into_iter()
        .chain(tools)
        .chain(steps)
        .chain(compactions)
        .chain([Event::ExecutionInterrupted {
            reason: crate::event::InterruptReason::User,
        }])
        .collect()
}

/// The events that close every leftover without running anything: tools failed with `tool_error`,
/// held calls settled as their decisions say (undecided ones withdrawn), steps failed as
/// restarted, compactions failed.
pub fn close(left: &Leftovers, tool_error: &str) -> Vec<Event> {
    let held = withdraw(&left.held, "the session was stopped");
    let tools = left.tools.iter().map(|(id, tool)| Event::ToolFailed {
        id: id.clone(),
        call_id: tool.call_id.clone(),
        error: tool_error.to_owned(),
    });
    let steps = left.steps.iter().map(|id| Event::StepFailed {
        id: id.clone(),
        error: restarted(),
    });
    held.into_iter()
        .chain(tools)
        .chain(steps)
        .chain(close_compactions(left))
        .collect()
}

/// The events that fail the compactions a stopped process left running.
pub fn close_compactions(left: &Leftovers) -> impl Iterator<Item = Event> + '_ {
    left.compactions.iter().map(|id| Event::CompactionFailed {
        id: id.clone(),
        error: "interrupted by restart".into(),
    })
}

#[cfg(test)]
mod tests {
    //! Table tests for every reason, and a property test over logs shaped as drains write them:
    //! at every prefix (every place a process can stop), the decision is total and never
    //! `Nothing` while an admitted input is neither answered nor explicitly failed.

    use proptest::prelude::*;

    use super::*;
    use crate::event::{InterruptReason, Stored};
    use crate::ids::{Seq, SessionId, Timestamp};
    use crate::memory::Projections;
    use crate::message::{InboxRow, Usage, Verdict};
    use crate::prompt::{Delivery, Prompt};

    const POLICY: Policy = Policy {
        max_steps: 4,
        max_attempts: 3,
    };

    /// Builds logs event by event, shaped as drains write them.
    #[derive(Default)]
    struct Log {
        events: Vec<Event>,
        minted: u64,
        /// Inputs admitted and not promoted, in admission order.
        pending: Vec<(MessageId, Delivery)>,
        /// The budget was raised since the exchange was blocked: its next call fits.
        raised: bool,
    }

    impl Log {
        fn id(&mut self) -> MessageId {
            self.minted += 1;
            MessageId::mint(Timestamp(self.minted), u128::from(self.minted))
        }

        fn push(&mut self, events: impl IntoIterator<Item = Event>) {
            self.events.extend(events);
        }

        fn admit(&mut self) {
            self.admit_as(Delivery::Steer);
        }

        fn admit_as(&mut self, delivery: Delivery) {
            let id = self.id();
            self.pending.push((id.clone(), delivery));
            self.push([Event::PromptAdmitted {
                id,
                delivery,
                prompt: Prompt::text("task"),
                wake: true,
            }]);
        }

        /// Promotes what `boundary` selects, as the runtime does; whether it promoted anything.
        fn promote(&mut self, boundary: Boundary) -> bool {
            let inbox: Vec<InboxRow> = self
                .pending
                .iter()
                .enumerate()
                .map(|(n, (id, delivery))| InboxRow {
                    id: id.clone(),
                    admitted_seq: Seq(n as u64),
                    delivery: *delivery,
                    prompt: Prompt::text("task"),
                    wake: true,
                })
                .collect();
            let selected = crate::promotion::select(&inbox, boundary);
            self.pending.retain(|(id, _)| !selected.contains(id));
            let promoted = !selected.is_empty();
            self.push(selected.into_iter().map(|id| Event::PromptPromoted { id }));
            promoted
        }

        /// A step that answers with text.
        fn answer(&mut self) {
            let a = self.start(1);
            self.text(&a, false);
            self.end(&a, Finish::Stop);
        }

        /// What a drain does once its exchange is answered: each idle boundary promotes (steers,
        /// or one queued input) and answers, until nothing is pending.
        fn answer_the_rest(&mut self) {
            while self.promote(Boundary::Idle) {
                self.answer();
            }
        }

        fn start(&mut self, step: u32) -> MessageId {
            let id = self.id();
            self.push([Event::StepStarted {
                id: id.clone(),
                step,
                agent: "a".into(),
                model: "m".into(),
            }]);
            id
        }

        fn text(&mut self, id: &MessageId, incomplete: bool) {
            self.push([Event::TextEnded {
                id: id.clone(),
                text: "t".into(),
                incomplete,
            }]);
        }

        fn end(&mut self, id: &MessageId, finish: Finish) {
            self.push([Event::StepEnded {
                id: id.clone(),
                finish,
                usage: Usage::default(),
            }]);
        }

        fn tools(&mut self, id: &MessageId, n: usize) {
            for call in 0..n {
                self.push([Event::ToolCalled {
                    id: id.clone(),
                    call_id: format!("c{call}"),
                    name: "t".into(),
                    input: "{}".into(),
                }]);
            }
            for call in 0..n {
                self.push([Event::ToolSucceeded {
                    id: id.clone(),
                    call_id: format!("c{call}"),
                    output: "ok".into(),
                    truncated: false,
                }]);
            }
        }

        fn provider_error() -> StepError {
            StepError {
                kind: FailureKind::Provider,
                message: "503".into(),
            }
        }

        /// One whole drain of the given shape.
        fn drain(&mut self, shape: Shape) {
            self.push([Event::ExecutionStarted { forced: false }]);
            self.promote(Boundary::Idle);
            match shape {
                Shape::Text => {
                    let a = self.start(1);
                    self.text(&a, false);
                    self.end(&a, Finish::Stop);
                }
                Shape::Tools => {
                    let a = self.start(1);
                    self.tools(&a, 2);
                    self.end(&a, Finish::ToolCalls);
                    let b = self.start(2);
                    self.text(&b, false);
                    self.end(&b, Finish::Stop);
                }
                Shape::RetryBeforeOutput => {
                    let a = self.start(1);
                    self.push([Event::RetryScheduled {
                        id: a.clone(),
                        attempt: 1,
                        delay_ms: 2000,
                        error: Log::provider_error(),
                    }]);
                    self.text(&a, false);
                    self.end(&a, Finish::Stop);
                }
                Shape::CutAfterOutput => {
                    let a = self.start(1);
                    self.text(&a, true);
                    self.push([
                        Event::RetryScheduled {
                            id: a.clone(),
                            attempt: 1,
                            delay_ms: 2000,
                            error: Log::provider_error(),
                        },
                        Event::StepFailed {
                            id: a,
                            error: Log::provider_error(),
                        },
                    ]);
                    let b = self.start(1);
                    self.text(&b, false);
                    self.end(&b, Finish::Stop);
                }
                Shape::Compaction => {
                    let c = self.id();
                    self.push([
                        Event::CompactionStarted {
                            id: c.clone(),
                            auto: true,
                        },
                        Event::CompactionEnded {
                            id: c,
                            summary: "s".into(),
                            kept_from: Seq(1),
                            usage: Usage::default(),
                        },
                    ]);
                    let a = self.start(1);
                    self.text(&a, false);
                    self.end(&a, Finish::Stop);
                }
                Shape::Failed => {
                    let a = self.start(1);
                    self.push([
                        Event::StepFailed {
                            id: a,
                            error: Log::provider_error(),
                        },
                        Event::ExecutionFailed {
                            error: "503".into(),
                            halted: false,
                        },
                    ]);
                    return;
                }
                Shape::ToolThenError => {
                    let a = self.start(1);
                    self.tools(&a, 1);
                    self.push([
                        Event::StepFailed {
                            id: a,
                            error: Log::provider_error(),
                        },
                        Event::ExecutionFailed {
                            error: "503".into(),
                            halted: false,
                        },
                    ]);
                    return;
                }
                Shape::StepLimit => {
                    let a = self.start(POLICY.max_steps);
                    self.push([
                        Event::ToolCalled {
                            id: a.clone(),
                            call_id: "c".into(),
                            name: "t".into(),
                            input: "{}".into(),
                        },
                        Event::ToolFailed {
                            id: a.clone(),
                            call_id: "c".into(),
                            error: "tool calls are disabled on the last step".into(),
                        },
                    ]);
                    self.end(&a, Finish::ToolCalls);
                }
                Shape::Filtered => {
                    let a = self.start(1);
                    self.tools(&a, 1);
                    self.end(&a, Finish::ContentFilter);
                }
                Shape::Blocks => {
                    // A step calls a tool; the call its result owes would pass the budget: not
                    // made, and the drain ends, the claim kept with the exchange.
                    let a = self.start(1);
                    self.tools(&a, 1);
                    self.end(&a, Finish::ToolCalls);
                    self.push([Log::exhausted()]);
                    return;
                }
                Shape::Asks => {
                    // One call runs, one is held for approval in the same commit as its record;
                    // the step settles and the drain ends, the claim kept with the exchange.
                    let a = self.start(1);
                    self.tools(&a, 1);
                    self.push([
                        Event::ToolCalled {
                            id: a.clone(),
                            call_id: "asked".into(),
                            name: "t".into(),
                            input: "{}".into(),
                        },
                        Event::ApprovalRequested {
                            id: a.clone(),
                            call_id: "asked".into(),
                            name: "t".into(),
                            digest: "sha256:0".into(),
                            expires_at: Timestamp(1_000),
                        },
                    ]);
                    self.end(&a, Finish::ToolCalls);
                    return;
                }
            }
            self.answer_the_rest();
            self.push([Event::ExecutionSucceeded]);
        }

        /// The events a whole drain of `shape` would write from here, in a scratch log.
        fn whole(&self, shape: Shape) -> Log {
            let mut whole = Log {
                minted: self.minted,
                pending: self.pending.clone(),
                ..Log::default()
            };
            whole.drain(shape);
            whole
        }

        /// A drain cut after `at` of its events by a user interrupt or a shutdown: what the
        /// drain writes when cancelled (a shutdown leaves running tools to recovery).
        fn cut(&mut self, shape: Shape, at: usize, reason: InterruptReason) {
            let whole = self.whole(shape);
            let at = at % whole.events.len();
            let mut state = self.replay();
            let session = session();
            for event in &whole.events[..at] {
                self.push([event.clone()]);
                let seq = state.sessions[&session].last_seq.next();
                state
                    .apply(&session, &stored(seq, event.clone()))
                    .expect("valid");
            }
            self.minted = whole.minted;
            self.pending.clear();
            self.pending.extend(
                state
                    .pending(&session)
                    .into_iter()
                    .map(|i| (i.id, i.delivery)),
            );
            let row = &state.sessions[&session];
            if row.claim.is_none() {
                // Cut before the drain took the claim (or after it let it go): nothing to write.
                return;
            }
            let left = leftovers(&state.session_messages(&session));
            let (tools, held) = match reason {
                InterruptReason::User => (&left.tools[..], &left.held[..]),
                InterruptReason::Shutdown => (&[][..], &[][..]),
            };
            // A user's interrupt withdraws the approvals the step asked for, as it fails the
            // tools it cut; a shutdown leaves both to the next process.
            let mut events = withdraw(held, INTERRUPTED_TOOL);
            events.extend(tools.iter().map(|(id, t)| Event::ToolFailed {
                id: id.clone(),
                call_id: t.call_id.clone(),
                error: "interrupted".into(),
            }));
            events.extend(left.steps.iter().map(|id| Event::StepFailed {
                id: id.clone(),
                error: StepError {
                    kind: FailureKind::Aborted,
                    message: "aborted".into(),
                },
            }));
            events.extend(close_compactions(&left));
            events.push(Event::ExecutionInterrupted { reason });
            self.push(events);
        }

        /// A crash after `at` events of a drain, then the recovery drain the next process runs.
        fn crash(&mut self, shape: Shape, at: usize) {
            let whole = self.whole(shape);
            let at = at % whole.events.len();
            self.push(whole.events[..at].iter().cloned());
            self.minted = whole.minted;
            let state = self.replay();
            let session = session();
            self.pending = state
                .pending(&session)
                .into_iter()
                .map(|i| (i.id, i.delivery))
                .collect();
            self.recover(&state);
        }

        /// A person (or the expiry) decides every approval the session waits for, and the
        /// drain the decision wakes carries the exchange on, as the runtime does.
        fn decide(&mut self, verdict: Verdict) {
            let state = self.replay();
            let row = state.sessions[&session()].clone();
            let messages = state.session_messages(&session());
            if !matches!(owed(&row, &messages, &POLICY), Owed::Waiting { .. }) {
                return;
            }
            let held = leftovers(&messages).held;
            self.push(held.iter().filter(|h| h.decision.is_none()).map(|h| {
                Event::ApprovalDecided {
                    id: h.message.clone(),
                    call_id: h.tool.call_id.clone(),
                    verdict,
                    by: Some("ann".into()),
                    reason: None,
                }
            }));
            self.recover(&self.replay());
        }

        fn exhausted() -> Event {
            Event::BudgetExhausted {
                which: crate::budget::Limit::Tokens,
                spent: 900,
                limit: 1000,
            }
        }

        /// The session's budget is raised, and the drain that wakes carries the exchange on.
        fn raise(&mut self) {
            self.push([Event::BudgetSet {
                budget: crate::budget::Budget::default(),
            }]);
            self.raised = self.replay().sessions[&session()].blocked.is_some();
            self.recover(&self.replay());
        }

        /// Starts or refuses the held calls as decided, as the runtime's drain does; one still
        /// undecided (an exchange that moved on without it) is withdrawn.
        fn start_held(&mut self, held: &[Held]) {
            for h in held {
                let (id, call_id) = (h.message.clone(), h.tool.call_id.clone());
                let Some(decision) = h.decision.as_ref() else {
                    self.push(withdraw(std::slice::from_ref(h), "the exchange moved on"));
                    continue;
                };
                match decision.refusal() {
                    Some(error) => self.push([Event::ToolFailed { id, call_id, error }]),
                    None => self.push([
                        Event::ToolStarted {
                            id: id.clone(),
                            call_id: call_id.clone(),
                        },
                        Event::ToolSucceeded {
                            id,
                            call_id,
                            output: "ran".into(),
                            truncated: false,
                        },
                    ]),
                }
            }
        }

        /// A user interrupt of a session with no drain (one that waits, or one a stop left):
        /// what `drain::release` writes.
        fn interrupt(&mut self) {
            let state = self.replay();
            if state.sessions[&session()].claim.is_none() {
                return;
            }
            self.push(interrupt(&leftovers(&state.session_messages(&session()))));
        }

        /// What a recovering drain writes, as the runtime does: attempt, settle, then either
        /// give up or carry on until answered.
        fn recover(&mut self, state: &Projections) {
            let session = session();
            let row = state.sessions[&session].clone();
            if row.claim.is_none() {
                return;
            }
            let messages = state.session_messages(&session);
            let left = leftovers(&messages);
            let cut =
                !(left.tools.is_empty() && left.steps.is_empty() && left.compactions.is_empty());
            match owed(&row, &messages, &POLICY) {
                // Nothing is written while a person decides.
                Owed::Halted | Owed::Waiting { .. } => {}
                // A blocked exchange goes on where it stopped, no attempt counted: its call is
                // made once the budget allows it, and blocked again before it otherwise.
                Owed::Blocked(_) if !cut => {
                    let mut unblocked = row.clone();
                    unblocked.blocked = None;
                    self.push([Event::ExecutionStarted { forced: false }]);
                    match owed(&unblocked, &messages, &POLICY) {
                        Owed::Call(why) => {
                            self.promote(why.boundary());
                            if !std::mem::take(&mut self.raised) {
                                self.push([Log::exhausted()]);
                                return;
                            }
                            self.answer();
                            self.answer_the_rest();
                            self.push([Event::ExecutionSucceeded]);
                        }
                        _ => self.push([Event::ExecutionSucceeded]),
                    }
                }
                Owed::Blocked(_) => unreachable!("a drain blocks only between steps"),
                // Every approval decided and nothing cut: the exchange goes on, no attempt
                // counted.
                Owed::Call(Why::Decided) if !cut => {
                    self.start_held(&left.held);
                    self.promote(Boundary::Continuation);
                    self.answer();
                    self.answer_the_rest();
                    self.push([Event::ExecutionSucceeded]);
                }
                Owed::Fail(reason) => {
                    let mut events = vec![Event::RecoveryAttempted {
                        attempt: row.resume_attempts + 1,
                    }];
                    events.extend(close(&leftovers(&messages), "stopped"));
                    events.push(Event::ExecutionFailed {
                        error: reason,
                        halted: true,
                    });
                    self.push(events);
                }
                Owed::Nothing => self.push([
                    Event::ExecutionStarted { forced: false },
                    Event::RecoveryAttempted {
                        attempt: row.resume_attempts + 1,
                    },
                    Event::ExecutionSucceeded,
                ]),
                Owed::Call(why) => {
                    self.push([
                        Event::ExecutionStarted { forced: false },
                        Event::RecoveryAttempted {
                            attempt: row.resume_attempts + 1,
                        },
                    ]);
                    let closing = Leftovers {
                        held: Vec::new(),
                        ..left.clone()
                    };
                    self.push(close(&closing, "stopped"));
                    self.start_held(&left.held);
                    self.promote(why.boundary());
                    self.answer();
                    self.answer_the_rest();
                    self.push([Event::ExecutionSucceeded]);
                }
            }
        }

        fn replay(&self) -> Projections {
            replay(&self.events)
        }
    }

    fn session() -> SessionId {
        SessionId::mint(Timestamp(1), 1)
    }

    fn stored(seq: Seq, event: Event) -> Stored {
        Stored {
            seq,
            time: Timestamp(seq.0),
            event,
        }
    }

    /// Projections of `events` after the session's creation.
    fn replay(events: &[Event]) -> Projections {
        let session = session();
        let mut p = Projections::default();
        let created = Event::SessionCreated {
            agent: "a".into(),
            model: None,
            title: None,
        };
        p.apply(&session, &stored(Seq::ZERO, created))
            .expect("created");
        for (n, event) in events.iter().enumerate() {
            let seq = Seq(n as u64 + 1);
            if let Err(e) = p.apply(&session, &stored(seq, event.clone())) {
                panic!("event {n} {event:?} refused: {e}\n{events:#?}");
            }
        }
        p
    }

    fn decide(events: &[Event]) -> Owed {
        let p = replay(events);
        let session = session();
        owed(
            &p.sessions[&session],
            &p.session_messages(&session),
            &POLICY,
        )
    }

    /// The reference, read straight off the log: inputs pending, whether an exchange is open (a
    /// promoted input not yet answered: answered by a step that ends without tool calls to
    /// continue from, ended by a failed execution or a user interrupt), and a halt.
    #[derive(Default)]
    struct Reference {
        pending: usize,
        open: bool,
        halted: bool,
        called: std::collections::HashMap<MessageId, (u32, bool)>,
        queued: std::collections::HashSet<MessageId>,
    }

    impl Reference {
        fn apply(&mut self, event: &Event) {
            match event {
                Event::PromptAdmitted { id, delivery, .. } => {
                    self.pending += 1;
                    if *delivery == Delivery::Queue {
                        self.queued.insert(id.clone());
                    }
                }
                Event::PromptPromoted { .. } => {
                    self.pending -= 1;
                    self.open = true;
                }
                Event::StepStarted { id, step, .. } => {
                    self.called.insert(id.clone(), (*step, false));
                }
                Event::ToolCalled { id, .. } => {
                    self.called.get_mut(id).expect("started").1 = true;
                }
                Event::StepEnded { id, finish, .. } => {
                    let (step, tools) = self.called[id];
                    let continues = tools
                        && step < POLICY.max_steps
                        && !matches!(finish, Finish::ContentFilter);
                    if !continues {
                        self.open = false;
                    }
                }
                Event::ExecutionFailed { halted, .. } => {
                    self.open = false;
                    self.halted |= *halted;
                }
                Event::ExecutionInterrupted {
                    reason: InterruptReason::User,
                } => self.open = false,
                Event::ExecutionStarted { .. } => self.halted = false,
                _ => {}
            }
        }

        fn unanswered(&self) -> bool {
            !self.halted && (self.open || self.pending > 0)
        }
    }

    fn unanswered(events: &[Event]) -> bool {
        let mut reference = Reference::default();
        events.iter().for_each(|e| reference.apply(e));
        reference.unanswered()
    }

    /// The queue law: a queued input is promoted only when no exchange is open, however the last
    /// process stopped. `Err` names the event that broke it.
    fn queue_waits_for_the_open_exchange(events: &[Event]) -> Result<(), usize> {
        let mut reference = Reference::default();
        for (n, event) in events.iter().enumerate() {
            if let Event::PromptPromoted { id } = event
                && reference.queued.contains(id)
                && reference.open
            {
                return Err(n);
            }
            reference.apply(event);
        }
        Ok(())
    }

    #[derive(Debug, Clone, Copy)]
    enum Shape {
        Text,
        Tools,
        RetryBeforeOutput,
        CutAfterOutput,
        Compaction,
        Failed,
        ToolThenError,
        StepLimit,
        Filtered,
        Asks,
        Blocks,
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Admit(Delivery),
        Drain(Shape),
        Cut(Shape, usize, InterruptReason),
        Crash(Shape, usize),
        /// Every approval the session waits for is decided so.
        Decide(Verdict),
        /// A user interrupt that finds no drain.
        Interrupt,
        /// The session's budget is raised.
        Raise,
    }

    fn shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            Just(Shape::Text),
            Just(Shape::Tools),
            Just(Shape::RetryBeforeOutput),
            Just(Shape::CutAfterOutput),
            Just(Shape::Compaction),
            Just(Shape::Failed),
            Just(Shape::ToolThenError),
            Just(Shape::StepLimit),
            Just(Shape::Filtered),
            Just(Shape::Asks),
            Just(Shape::Blocks),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let reason = prop_oneof![Just(InterruptReason::User), Just(InterruptReason::Shutdown)];
        prop_oneof![
            2 => prop_oneof![Just(Delivery::Steer), Just(Delivery::Queue)].prop_map(Op::Admit),
            2 => shape().prop_map(Op::Drain),
            1 => (shape(), 0..40usize, reason).prop_map(|(s, at, r)| Op::Cut(s, at, r)),
            2 => (shape(), 0..40usize).prop_map(|(s, at)| Op::Crash(s, at)),
            2 => prop_oneof![
                Just(Verdict::Approved),
                Just(Verdict::Denied),
                Just(Verdict::Expired),
            ]
            .prop_map(Op::Decide),
            1 => Just(Op::Interrupt),
            1 => Just(Op::Raise),
        ]
    }

    fn build(ops: &[Op]) -> Log {
        let mut log = Log::default();
        for op in ops {
            let claimed = log.replay().sessions[&session()].claim.is_some();
            match *op {
                Op::Admit(delivery) => log.admit_as(delivery),
                Op::Decide(verdict) => log.decide(verdict),
                Op::Interrupt => log.interrupt(),
                Op::Raise => log.raise(),
                // A new process recovers a claimed session before anything else runs it.
                _ if claimed => {
                    let state = log.replay();
                    log.recover(&state);
                }
                // A drain with nothing pending writes nothing.
                _ if log.pending.is_empty() => {}
                Op::Drain(shape) => log.drain(shape),
                Op::Cut(shape, at, reason) => log.cut(shape, at, reason),
                Op::Crash(shape, at) => log.crash(shape, at),
            }
        }
        log
    }

    /// Found by the property below: a user's interrupt of a step that asked for an approval,
    /// then a crash of the next drain.
    #[test]
    fn an_interrupted_ask_then_a_crash_leaves_nothing_waiting() {
        let ops = [
            Op::Admit(Delivery::Steer),
            Op::Admit(Delivery::Steer),
            Op::Admit(Delivery::Steer),
            Op::Cut(Shape::Asks, 9, InterruptReason::User),
            Op::Admit(Delivery::Steer),
            Op::Crash(Shape::Asks, 2),
        ];
        let log = build(&ops);
        let state = log.replay();
        let messages = state.session_messages(&session());
        let undecided = leftovers(&messages)
            .held
            .iter()
            .filter(|h| h.decision.is_none())
            .count();
        assert_eq!(undecided, 0, "{:#?}", log.events);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn owed_exactly_while_an_input_is_unanswered(ops in proptest::collection::vec(op(), 1..12)) {
            let log = build(&ops);
            if let Err(n) = queue_waits_for_the_open_exchange(&log.events) {
                prop_assert!(false, "event {n} promoted a queued input into an open exchange\n{:#?}", log.events);
            }
            for end in 0..=log.events.len() {
                let prefix = &log.events[..end];
                let decision = decide(prefix);
                if unanswered(prefix) {
                    prop_assert!(
                        decision != Owed::Nothing,
                        "prefix of {end} events owes an answer, decided {decision:?}\n{prefix:#?}"
                    );
                } else {
                    // And nothing runs for an input already answered or explicitly ended.
                    prop_assert!(
                        matches!(decision, Owed::Nothing | Owed::Halted),
                        "prefix of {end} events owes nothing, decided {decision:?}\n{prefix:#?}"
                    );
                }
            }
        }
    }

    /// The decision at the end of `events`, checked against `expected`.
    fn check(events: &[Event], expected: Owed) {
        assert_eq!(decide(events), expected, "{events:#?}");
    }

    fn drained(shape: Shape) -> Log {
        let mut log = Log::default();
        log.admit();
        log.drain(shape);
        log
    }

    #[test]
    fn answered_and_failed_sessions_owe_nothing() {
        for shape in [
            Shape::Text,
            Shape::Tools,
            Shape::RetryBeforeOutput,
            Shape::CutAfterOutput,
            Shape::Compaction,
            Shape::Failed,
            Shape::ToolThenError,
            Shape::StepLimit,
            Shape::Filtered,
        ] {
            check(&drained(shape).events, Owed::Nothing);
        }
    }

    #[test]
    fn an_exchange_waits_for_its_approvals_then_owes_the_continuation() {
        let mut log = drained(Shape::Asks);
        check(
            &log.events,
            Owed::Waiting {
                expires_at: Timestamp(1_000),
            },
        );
        // New input waits behind the approvals, steering or not.
        log.admit();
        assert!(matches!(decide(&log.events), Owed::Waiting { .. }));
        let state = log.replay();
        let held = leftovers(&state.session_messages(&session())).held;
        assert_eq!(held.len(), 1);
        log.push([Event::ApprovalDecided {
            id: held[0].message.clone(),
            call_id: "asked".into(),
            verdict: Verdict::Denied,
            by: Some("ann".into()),
            reason: Some("no".into()),
        }]);
        check(&log.events, Owed::Call(Why::Decided));
        assert_eq!(Why::Decided.boundary(), Boundary::Continuation);
        // The drain refuses it, and the model is owed the results.
        let refusal = leftovers(&log.replay().session_messages(&session())).held[0]
            .decision
            .as_ref()
            .and_then(Decision::refusal)
            .expect("a denial is a refusal");
        assert!(refusal.contains("denied by ann: no"), "{refusal}");
        log.push([Event::ToolFailed {
            id: held[0].message.clone(),
            call_id: "asked".into(),
            error: refusal,
        }]);
        check(&log.events, Owed::Call(Why::ToolResults));
    }

    #[test]
    fn an_interrupt_withdraws_the_approvals_and_owes_nothing_of_the_exchange() {
        let mut log = drained(Shape::Asks);
        log.interrupt();
        let state = log.replay();
        assert!(state.sessions[&session()].claim.is_none());
        assert!(leftovers(&state.session_messages(&session())).is_empty());
        check(&log.events, Owed::Nothing);
        let decided = log.events.iter().any(|e| {
            matches!(
                e,
                Event::ApprovalDecided {
                    verdict: Verdict::Cancelled,
                    ..
                }
            )
        });
        assert!(decided, "the approval is withdrawn as cancelled");
    }

    #[test]
    fn pending_input_is_owed() {
        let mut log = Log::default();
        log.admit();
        check(&log.events, Owed::Call(Why::NewInput));
        // A promoted input with no answer yet (the drain stopped right after promoting).
        log.push([Event::ExecutionStarted { forced: false }]);
        let (id, _) = log.pending.pop().expect("admitted");
        log.push([Event::PromptPromoted { id }]);
        check(&log.events, Owed::Call(Why::Unanswered));
    }

    /// The log of a drain that stopped after `take` of its events.
    fn stopped(shape: Shape, take: usize) -> Vec<Event> {
        let mut log = drained(shape);
        log.events.truncate(take);
        log.events
    }

    #[test]
    fn tool_results_are_owed_a_call() {
        // Admitted, started, promoted, step, two calls, two results, step ended.
        check(&stopped(Shape::Tools, 9), Owed::Call(Why::ToolResults));
    }

    #[test]
    fn a_step_cut_by_a_crash_or_a_shutdown_is_owed() {
        // The step started and streamed text, then the process died.
        check(&stopped(Shape::Text, 5), Owed::Call(Why::CutStep));
        // Shutdown: the step aborted, the claim kept.
        let mut log = Log::default();
        log.admit();
        log.cut(Shape::Text, 4, InterruptReason::Shutdown);
        check(&log.events, Owed::Call(Why::CutStep));
        // A user interrupt releases the claim and owes nothing.
        let mut log = Log::default();
        log.admit();
        log.cut(Shape::Text, 4, InterruptReason::User);
        check(&log.events, Owed::Nothing);
        // Nor after a step that called tools: the interrupt ended the turn, results and all.
        let mut log = Log::default();
        log.admit();
        log.cut(Shape::Tools, 8, InterruptReason::User);
        assert!(
            matches!(log.events[log.events.len() - 2], Event::StepEnded { .. }),
            "{:#?}",
            log.events
        );
        check(&log.events, Owed::Nothing);
    }

    #[test]
    fn a_pending_retry_or_continuation_is_owed() {
        // The cut-off message failed and its continuation was scheduled, then a crash.
        check(
            &stopped(Shape::CutAfterOutput, 7),
            Owed::Call(Why::PendingRetry),
        );
        // A retry before output: the message is still open.
        check(
            &stopped(Shape::RetryBeforeOutput, 5),
            Owed::Call(Why::CutStep),
        );
    }

    #[test]
    fn an_unsettled_compaction_is_owed_with_its_step() {
        check(&stopped(Shape::Compaction, 4), Owed::Call(Why::Compaction));
        let left = leftovers(&replay(&stopped(Shape::Compaction, 4)).session_messages(&session()));
        assert_eq!(left.compactions.len(), 1);
    }

    /// A stop during a manual compaction owes nothing of the turn before it, however that turn
    /// ended (answered, interrupted by the user, failed): the claim was the compaction's.
    #[test]
    fn a_stop_during_a_manual_compaction_owes_only_pending_input() {
        for ended in [Shape::Text, Shape::Failed] {
            let mut log = drained(ended);
            let c = log.id();
            log.push([
                Event::ExecutionStarted { forced: false },
                Event::CompactionStarted { id: c, auto: false },
            ]);
            check(&log.events, Owed::Nothing);
            let left = leftovers(&log.replay().session_messages(&session()));
            assert_eq!(left.compactions.len(), 1, "closed by recovery");
            log.admit();
            check(&log.events, Owed::Call(Why::NewInput));
        }
        let mut log = Log::default();
        log.admit();
        log.cut(Shape::Text, 5, InterruptReason::User);
        let c = log.id();
        log.push([
            Event::ExecutionStarted { forced: false },
            Event::CompactionStarted { id: c, auto: false },
        ]);
        check(&log.events, Owed::Nothing);
    }

    #[test]
    fn the_step_limit_and_a_filtered_answer_end_the_turn() {
        check(&stopped(Shape::StepLimit, 7), Owed::Nothing);
        check(&stopped(Shape::Filtered, 7), Owed::Nothing);
    }

    #[test]
    fn recovery_gives_up_after_attempts_in_a_row_without_progress() {
        let mut events = stopped(Shape::Tools, 5);
        for attempt in 1..=POLICY.max_attempts {
            events.push(Event::RecoveryAttempted { attempt });
        }
        assert!(matches!(decide(&events), Owed::Fail(_)));
        // A completed step resets the count.
        let mut log = drained(Shape::Tools);
        log.events.truncate(4);
        log.push([Event::RecoveryAttempted { attempt: 3 }]);
        log.push([Event::ToolCalled {
            id: match &log.events[3] {
                Event::StepStarted { id, .. } => id.clone(),
                other => panic!("{other:?}"),
            },
            call_id: "x".into(),
            name: "t".into(),
            input: "{}".into(),
        }]);
        assert!(matches!(decide(&log.events), Owed::Fail(_)));
        let mut log = drained(Shape::Tools);
        log.events.truncate(9);
        log.events
            .insert(4, Event::RecoveryAttempted { attempt: 3 });
        check(&log.events, Owed::Call(Why::ToolResults));
    }

    #[test]
    fn a_halted_session_waits_for_a_resume() {
        let mut log = Log::default();
        log.admit();
        log.push([
            Event::ExecutionStarted { forced: false },
            Event::ExecutionFailed {
                error: "gave up".into(),
                halted: true,
            },
        ]);
        log.admit();
        check(&log.events, Owed::Halted);
    }

    #[test]
    fn close_fails_every_leftover() {
        let events = stopped(Shape::Tools, 6);
        let p = replay(&events);
        let left = leftovers(&p.session_messages(&session()));
        assert_eq!((left.tools.len(), left.steps.len()), (2, 1));
        let mut all = events.clone();
        all.extend(close(&left, "stopped"));
        let p = replay(&all);
        assert!(leftovers(&p.session_messages(&session())).is_empty());
    }
}
