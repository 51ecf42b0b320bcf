//! A generator of plausible event sequences for property tests of the projector and the store.
//! Compiled only for tests and with the `testing` feature; never part of the runtime.
//!
//! Each op code picks an action; the generator turns it into an event that is valid against the
//! current projections most of the time and deliberately invalid otherwise (a stale id, a settled
//! message, a duplicate creation), so tests cover refusals too.

use crate::event::{Event, FailureKind, InterruptReason, StepError};
use crate::ids::{MessageId, Seq, SessionId, Timestamp};
use crate::memory::Projections;
use crate::message::{Finish, Message, Usage};
use crate::prompt::{Delivery, Prompt};

/// Produces `(session, event)` pairs from op codes, tracking state through its own projections.
#[derive(Debug, Default)]
pub struct Generator {
    pub projections: Projections,
    minted: u64,
}

impl Generator {
    fn mint(&mut self) -> MessageId {
        self.minted += 1;
        MessageId::mint(Timestamp(self.minted), u128::from(self.minted))
    }

    fn sessions(&self) -> Vec<SessionId> {
        self.projections.sessions.keys().cloned().collect()
    }

    /// The unsettled assistant message with the highest seq of `session`.
    fn open_assistant(&self, session: &SessionId) -> Option<(MessageId, Vec<String>)> {
        self.projections
            .session_messages(session)
            .into_iter()
            .rev()
            .find_map(|m| match m {
                Message::Assistant(a) if !a.is_settled() => {
                    let running = a.running_tools().map(|t| t.call_id.clone()).collect();
                    Some((a.id, running))
                }
                _ => None,
            })
    }

    /// Turns op codes `(action, pick)` into the next event for some session.
    pub fn event(&mut self, action: u8, pick: u8) -> (SessionId, Event) {
        let sessions = self.sessions();
        let pick = usize::from(pick);
        if sessions.is_empty() || action.is_multiple_of(23) {
            // Creating an existing session is refused; the op mixes both.
            let session = if action.is_multiple_of(2) || sessions.is_empty() {
                SessionId::mint(
                    Timestamp(u64::from(action)),
                    pick as u128 + self.minted as u128,
                )
            } else {
                sessions[pick % sessions.len()].clone()
            };
            self.minted += 1;
            let event = Event::SessionCreated {
                agent: "default".into(),
                model: None,
                title: None,
            };
            return (session, event);
        }
        let session = sessions[pick % sessions.len()].clone();
        let open = self.open_assistant(&session);
        let event = match action % 22 {
            0..=3 => Event::PromptAdmitted {
                id: self.mint(),
                delivery: if pick % 3 == 0 {
                    Delivery::Queue
                } else {
                    Delivery::Steer
                },
                prompt: Prompt::text(format!("prompt {pick}")),
                wake: pick % 5 != 0,
            },
            4..=6 => {
                let pending = self.projections.pending(&session);
                match pending.get(pick % pending.len().max(1)) {
                    Some(row) => Event::PromptPromoted { id: row.id.clone() },
                    None => Event::PromptPromoted { id: self.mint() },
                }
            }
            7 => Event::InstructionsUpdated {
                id: self.mint(),
                changed: vec![("system".into(), format!("be brief {pick}"))],
                text: format!("be brief {pick}"),
            },
            8 => Event::ExecutionStarted {
                forced: pick % 2 == 0,
            },
            9 => match pick % 4 {
                0 => Event::ExecutionSucceeded,
                1 => Event::ExecutionFailed {
                    error: "boom".into(),
                    halted: pick % 8 == 1,
                },
                2 => Event::ExecutionInterrupted {
                    reason: InterruptReason::User,
                },
                _ => Event::ExecutionInterrupted {
                    reason: InterruptReason::Shutdown,
                },
            },
            10 => Event::RecoveryAttempted {
                attempt: (pick % 5) as u32,
            },
            11 | 12 => Event::StepStarted {
                id: self.mint(),
                step: (pick % 4) as u32 + 1,
                agent: "default".into(),
                model: "mock".into(),
            },
            13 => Event::TextEnded {
                id: open.map(|o| o.0).unwrap_or_else(|| self.mint()),
                text: format!("text {pick}"),
                incomplete: pick % 5 == 0,
            },
            14 => Event::ReasoningEnded {
                id: open.map(|o| o.0).unwrap_or_else(|| self.mint()),
                text: "thinking".into(),
                metadata: Some(format!("sig{pick}")),
                incomplete: false,
            },
            15 => Event::ToolCalled {
                id: open.map(|o| o.0).unwrap_or_else(|| self.mint()),
                call_id: format!("call_{}", pick % 3),
                name: "lookup".into(),
                input: "{\"q\":1}".into(),
            },
            16 => {
                let (id, running) = open.unwrap_or_else(|| (self.mint(), Vec::new()));
                let call_id = running.first().cloned().unwrap_or_else(|| "call_x".into());
                if pick % 5 == 4 {
                    Event::ToolOutput {
                        id,
                        call_id,
                        output: format!("the whole output {pick}"),
                    }
                } else if pick % 2 == 0 {
                    Event::ToolSucceeded {
                        id,
                        call_id,
                        output: "ok".into(),
                        truncated: false,
                    }
                } else {
                    Event::ToolFailed {
                        id,
                        call_id,
                        error: "failed".into(),
                    }
                }
            }
            17 => Event::StepEnded {
                id: open.map(|o| o.0).unwrap_or_else(|| self.mint()),
                finish: Finish::Stop,
                usage: Usage {
                    input: pick as u64,
                    output: 3,
                    cost_nanos: 7,
                    ..Usage::default()
                },
            },
            18 => Event::StepFailed {
                id: open.map(|o| o.0).unwrap_or_else(|| self.mint()),
                error: StepError {
                    kind: FailureKind::Provider,
                    message: "rate limited".into(),
                },
            },
            19 => Event::RetryScheduled {
                id: open.map(|o| o.0).unwrap_or_else(|| self.mint()),
                attempt: 1,
                delay_ms: 2000,
                error: StepError {
                    kind: FailureKind::Provider,
                    message: "overloaded".into(),
                },
            },
            20 => {
                let running = self
                    .projections
                    .session_messages(&session)
                    .into_iter()
                    .find_map(|m| match m {
                        Message::Compaction {
                            id,
                            state: crate::message::CompactionState::Running,
                            ..
                        } => Some(id),
                        _ => None,
                    });
                match (running, pick % 3) {
                    (Some(id), 0) => Event::CompactionFailed {
                        id,
                        error: "nothing".into(),
                    },
                    (Some(id), _) => {
                        let last = self.projections.sessions[&session].last_seq;
                        Event::CompactionEnded {
                            id,
                            summary: format!("summary {pick}"),
                            kept_from: Seq(last.0.saturating_sub(2)),
                            usage: Usage {
                                output: 5,
                                ..Usage::default()
                            },
                        }
                    }
                    (None, _) => Event::CompactionStarted {
                        id: self.mint(),
                        auto: pick % 2 == 0,
                    },
                }
            }
            _ => Event::UsageRecorded {
                usage: Usage {
                    input: 1,
                    ..Usage::default()
                },
            },
        };
        (session, event)
    }

    /// Seq the next event of `session` must carry (0 for a new session).
    pub fn next_seq(&self, session: &SessionId) -> Seq {
        self.projections
            .sessions
            .get(session)
            .map_or(Seq::ZERO, |row| row.last_seq.next())
    }
}
