//! Budgets: what a session may spend on model calls, over its life and per user turn, and the
//! one check made before every call (ARCHITECTURE.md, "Budgets").
//!
//! Spend is the usage the session's events recorded (`StepEnded`, `StepUsage`, `UsageRecorded`,
//! `CompactionEnded`): durable, counted once, exact (costs are integers, in billionths of a US
//! dollar). A call is made only if its worst case (its input estimate plus its `max_output`,
//! priced at its model's price) fits what is left of every limit; otherwise the session records
//! [`crate::Event::BudgetExhausted`] and is blocked until its budget changes.

use serde::{Deserialize, Serialize};

use crate::message::Usage;

/// Limits on spend; `None` is no limit. Costs in billionths of a US dollar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Budget {
    /// Tokens over the session's life.
    pub max_tokens: Option<u64>,
    /// Cost over the session's life.
    pub max_cost_nanos: Option<u64>,
    /// Tokens of one user turn (everything since the latest user message).
    pub turn_max_tokens: Option<u64>,
    /// Cost of one user turn.
    pub turn_max_cost_nanos: Option<u64>,
}

/// One of a budget's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Limit {
    Tokens,
    Cost,
    TurnTokens,
    TurnCost,
}

impl Limit {
    /// The wire name: the budget field that set the limit.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Tokens => "max_tokens",
            Limit::Cost => "max_cost",
            Limit::TurnTokens => "turn_max_tokens",
            Limit::TurnCost => "turn_max_cost",
        }
    }
}

/// What was spent, or what a call may spend at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    pub tokens: u64,
    pub cost_nanos: u64,
}

impl Spend {
    /// The tokens and cost of a usage: every token of the prompt (cached or not) and of the
    /// output (reasoning is part of it).
    pub fn of(usage: &Usage) -> Spend {
        Spend {
            tokens: usage.input + usage.cache_read + usage.cache_write + usage.output,
            cost_nanos: usage.cost_nanos,
        }
    }
}

/// What the current user turn spent: the usage of the steps since the latest user message of
/// the active history (their failed attempts included).
pub fn turn_spend(messages: &[crate::message::Message]) -> Spend {
    use crate::message::Message;
    let start = messages
        .iter()
        .rposition(|m| matches!(m, Message::User { .. }))
        .map_or(0, |i| i + 1);
    let mut usage = Usage::default();
    for message in &messages[start..] {
        if let Message::Assistant(a) = message {
            usage.add(&a.usage);
        }
    }
    Spend::of(&usage)
}

/// A limit a call could pass: what was spent against it and the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    pub which: Limit,
    pub spent: u64,
    pub limit: u64,
}

impl Budget {
    /// This budget with the limits `over` sets replacing its own (a session's own budget over
    /// its agent's).
    pub fn with(&self, over: &Budget) -> Budget {
        Budget {
            max_tokens: over.max_tokens.or(self.max_tokens),
            max_cost_nanos: over.max_cost_nanos.or(self.max_cost_nanos),
            turn_max_tokens: over.turn_max_tokens.or(self.turn_max_tokens),
            turn_max_cost_nanos: over.turn_max_cost_nanos.or(self.turn_max_cost_nanos),
        }
    }

    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        *self != Budget::default()
    }

    /// The first limit a call spending at most `worst` could pass, given what the session spent
    /// in all (`life`) and in this turn (`turn`); `None` when the call fits every limit.
    pub fn check(&self, life: Spend, turn: Spend, worst: Spend) -> Option<Exceeded> {
        let limits = [
            (Limit::Tokens, self.max_tokens, life.tokens, worst.tokens),
            (
                Limit::Cost,
                self.max_cost_nanos,
                life.cost_nanos,
                worst.cost_nanos,
            ),
            (
                Limit::TurnTokens,
                self.turn_max_tokens,
                turn.tokens,
                worst.tokens,
            ),
            (
                Limit::TurnCost,
                self.turn_max_cost_nanos,
                turn.cost_nanos,
                worst.cost_nanos,
            ),
        ];
        limits.into_iter().find_map(|(which, limit, spent, worst)| {
            let limit = limit?;
            (spent.saturating_add(worst) > limit).then_some(Exceeded {
                which,
                spent,
                limit,
            })
        })
    }

    /// What is left of each limit after `life` and `turn`: `None` where there is no limit.
    pub fn left(&self, life: Spend, turn: Spend) -> Budget {
        Budget {
            max_tokens: self.max_tokens.map(|l| l.saturating_sub(life.tokens)),
            max_cost_nanos: self
                .max_cost_nanos
                .map(|l| l.saturating_sub(life.cost_nanos)),
            turn_max_tokens: self.turn_max_tokens.map(|l| l.saturating_sub(turn.tokens)),
            turn_max_cost_nanos: self
                .turn_max_cost_nanos
                .map(|l| l.saturating_sub(turn.cost_nanos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(tokens: u64, cost_nanos: u64) -> Spend {
        Spend { tokens, cost_nanos }
    }

    #[test]
    fn a_call_is_checked_against_every_limit_at_its_worst() {
        let budget = Budget {
            max_tokens: Some(1000),
            max_cost_nanos: Some(5_000),
            turn_max_tokens: Some(300),
            turn_max_cost_nanos: None,
        };
        // Fits: exactly at a limit is allowed.
        assert_eq!(
            budget.check(spend(700, 0), spend(0, 0), spend(300, 10)),
            None
        );
        // One token over the life limit.
        assert_eq!(
            budget.check(spend(701, 0), spend(0, 0), spend(300, 10)),
            Some(Exceeded {
                which: Limit::Tokens,
                spent: 701,
                limit: 1000
            })
        );
        // The turn's limit.
        assert_eq!(
            budget
                .check(spend(100, 0), spend(100, 0), spend(201, 0))
                .map(|e| e.which),
            Some(Limit::TurnTokens)
        );
        // The cost.
        assert_eq!(
            budget
                .check(spend(0, 4_990), spend(0, 0), spend(1, 11))
                .map(|e| e.which),
            Some(Limit::Cost)
        );
        // No limits, no refusal, whatever the spend.
        assert_eq!(
            Budget::default().check(spend(u64::MAX, u64::MAX), spend(0, 0), spend(u64::MAX, 1)),
            None
        );
    }

    #[test]
    fn a_sessions_limits_replace_its_agents_one_by_one() {
        let agent = Budget {
            max_tokens: Some(10),
            turn_max_tokens: Some(5),
            ..Budget::default()
        };
        let session = Budget {
            max_tokens: Some(20),
            max_cost_nanos: Some(7),
            ..Budget::default()
        };
        assert_eq!(
            agent.with(&session),
            Budget {
                max_tokens: Some(20),
                max_cost_nanos: Some(7),
                turn_max_tokens: Some(5),
                turn_max_cost_nanos: None,
            }
        );
        assert_eq!(
            agent.with(&session).left(spend(25, 3), spend(4, 0)),
            Budget {
                max_tokens: Some(0),
                max_cost_nanos: Some(4),
                turn_max_tokens: Some(1),
                turn_max_cost_nanos: None,
            }
        );
    }
}
