//! What the runtime counts, at the places where it happens: committed events (in the store's
//! commit hook, so nothing is missed however busy the bus), drains, steps by outcome, retries by
//! reason, tool calls by tool and outcome, actor restarts and passivations, recoveries.
//!
//! The values are OpenMetrics counters (`prometheus-client`), readable with `get` and
//! registered by whoever exports them (the server's `/metrics`). Labels are few and bounded: no
//! session or message ids, and a tool the model named but nobody registered counts as
//! `unknown`.

use agenthost_model::Event;
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
    pub(crate) fn committed(&self, event: &Event) {
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
