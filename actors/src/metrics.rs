//! What the runtime counts, at the places where it happens: committed events (in the store's
//! commit hook, so nothing is missed however busy the bus), drains, steps by outcome, retries by
//! reason, tool calls by tool and outcome, actor restarts and passivations, recoveries.
//!
//! The values are OpenMetrics counters (`prometheus-client`), readable with `get` and
//! registered by whoever exports them (the server's `/metrics`). Labels are few and bounded: no
//! session or message ids, and a tool the model named but nobody registered counts as
//! `unknown`.

use std::sync::Arc;

use agenthost_model::{Event, InterruptReason, SessionId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The runtime's counters. Clones share their values.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Inputs admitted (`prompt_admitted` committed; an exact retry writes nothing and is not
    /// counted).
    pub admissions: Counter,
    /// Inputs promoted into history (`prompt_promoted` committed).
    pub promotions: Counter,
    /// Durable events committed, by kind.
    pub events: Family<Kind, Counter>,
    /// Drains that started executing (`execution_started` written).
    pub drains: Counter,
    /// Steps of the agent loop that ended, by outcome: `done`, `continue` (tool results to send
    /// back), `failed`, `interrupted`.
    pub steps: Family<Outcome, Counter>,
    /// Provider calls retried (or continued after a cut), by the failure's kind.
    pub retries: Family<Reason, Counter>,
    /// Tool calls, by tool and outcome: `ok`, `failed` (an error, a timeout, a panic) or
    /// `refused` (unknown, not allowed, invalid arguments, or on the last step).
    pub tool_calls: Family<ToolCall, Counter>,
    /// Session actors restarted after a panic.
    pub restarts: Counter,
    /// Session actors stopped after being idle (their sessions stay in the store).
    pub passivations: Counter,
    /// Sessions the runtime settled and resumed after a crash or a takeover.
    pub recoveries: Counter,
    /// Pending inputs a drain took from the rows kept at their admission instead of reading
    /// them from the store.
    pub inputs_from_memory: Counter,
    /// Pending inputs and claims, kept in memory from the commits (see [`Held`]).
    pub(crate) held: Arc<Held>,
    /// Tokens and cost (billionths of a US dollar) spent on model calls, by agent and model:
    /// steps and their failed attempts, compactions, `generate`.
    pub spend_tokens: Family<Spender, Counter>,
    pub spend_cost_nanos: Family<Spender, Counter>,
}

/// The labels of spend: an agent and a model of the configuration (never a session).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Spender {
    pub agent: String,
    pub model: String,
}

/// What the store holds of pending inputs and claims, kept in memory so that a scrape reads
/// no store: seeded from the store where the recovery sweep reads it anyway (at start and at a
/// takeover), then moved by every committed event exactly as the projector moves a session's
/// row (`prompt_admitted` +1 and `prompt_promoted` −1 pending; `execution_started` claims, a
/// settled or user-interrupted execution releases).
#[derive(Debug, Default)]
pub(crate) struct Held {
    pending: crate::IdMap<SessionId, u32>,
    claimed: crate::IdMap<SessionId, ()>,
}

impl Held {
    fn committed(&self, session: &SessionId, event: &Event) {
        match event {
            Event::PromptAdmitted { .. } => *self.pending.entry(session.clone()).or_default() += 1,
            Event::PromptPromoted { .. } => {
                let emptied = self.pending.get_mut(session).is_some_and(|mut n| {
                    *n = n.saturating_sub(1);
                    *n == 0
                });
                if emptied {
                    self.pending.remove_if(session, |_, n| *n == 0);
                }
            }
            Event::ExecutionStarted { .. } => {
                self.claimed.insert(session.clone(), ());
            }
            Event::ExecutionSucceeded
            | Event::ExecutionFailed { .. }
            | Event::ExecutionInterrupted {
                reason: InterruptReason::User,
            } => {
                self.claimed.remove(session);
            }
            _ => {}
        }
    }

    /// What the store says of one session now (a read of the recovery sweep).
    pub(crate) fn seed(&self, session: &SessionId, pending: u32, claimed: bool) {
        if pending == 0 {
            self.pending.remove(session);
        } else {
            self.pending.insert(session.clone(), pending);
        }
        if claimed {
            self.claimed.insert(session.clone(), ());
        } else {
            self.claimed.remove(session);
        }
    }

    /// A claim the store holds (a session without pending input, read by the recovery sweep).
    pub(crate) fn seed_claim(&self, session: &SessionId) {
        self.claimed.insert(session.clone(), ());
    }

    /// Pending inputs and claimed sessions among the sessions `owns` accepts.
    pub(crate) fn count(&self, owns: impl Fn(&SessionId) -> bool) -> (u64, u64) {
        let pending = self
            .pending
            .iter()
            .filter(|e| owns(e.key()))
            .map(|e| u64::from(*e.value()))
            .sum();
        let claimed = self.claimed.iter().filter(|e| owns(e.key())).count();
        (pending, claimed as u64)
    }
}

/// The `kind` label: an event's wire name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolCall {
    pub tool: String,
    pub outcome: &'static str,
}

impl Metrics {
    /// Counts one committed event (called from the store's commit hook).
    pub(crate) fn committed(&self, session: &SessionId, event: &Event) {
        self.held.committed(session, event);
        self.events
            .get_or_create(&Kind { kind: event.kind() })
            .inc();
        match event {
            Event::PromptAdmitted { .. } => {
                self.admissions.inc();
            }
            Event::PromptPromoted { .. } => {
                self.promotions.inc();
            }
            _ => {}
        }
    }

    /// Counts what a model call spent (a usage as recorded, priced).
    pub(crate) fn spent(&self, agent: &str, model: &str, usage: &agenthost_model::Usage) {
        let spend = agenthost_model::Spend::of(usage);
        if spend == agenthost_model::Spend::default() {
            return;
        }
        let labels = Spender {
            agent: agent.to_owned(),
            model: model.to_owned(),
        };
        self.spend_tokens
            .get_or_create(&labels)
            .inc_by(spend.tokens);
        self.spend_cost_nanos
            .get_or_create(&labels)
            .inc_by(spend.cost_nanos);
    }

    pub(crate) fn step(&self, outcome: &'static str) {
        self.steps.get_or_create(&Outcome { outcome }).inc();
    }

    pub(crate) fn retry(&self, reason: &'static str) {
        self.retries.get_or_create(&Reason { reason }).inc();
    }

    pub(crate) fn tool_call(&self, tool: &str, outcome: &'static str) {
        self.tool_calls
            .get_or_create(&ToolCall {
                tool: tool.to_owned(),
                outcome,
            })
            .inc();
    }
}
