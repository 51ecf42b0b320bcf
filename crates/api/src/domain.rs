//! Conversions from the domain types ([`agenthost_model`]) to the wire types, for the server
//! (the `domain` feature). A client does not need them.

use agenthost_model as model;
use serde_json::Value;

use crate::wire::*;

impl Session {
    pub fn from_row(row: &model::SessionRow, status: StatusType) -> Self {
        Session {
            id: row.id.to_string(),
            agent: row.agent.clone(),
            model: row.model.clone(),
            title: row.title.clone(),
            created: row.created.0,
            updated: row.updated.0,
            last_seq: row.last_seq.0,
            usage: Usage::from(&row.usage),
            status: Status::of(status),
            claimed: row.claim.is_some(),
            pending: row.pending,
            resume_attempts: row.resume_attempts,
            halted: row.halted.clone(),
            budget: None,
        }
    }

    /// With its budget: `limits` are the limits in force (its agent's, with its own over them).
    pub fn with_budget(mut self, row: &model::SessionRow, limits: &model::Budget) -> Self {
        let spent = model::Spend::of(&row.usage);
        let mut left = Budget::from(&limits.left(spent, model::Spend::default()));
        left.turn_max_tokens = None;
        left.turn_max_cost_usd = None;
        self.budget = Some(BudgetState {
            limits: limits.into(),
            own: (&row.budget).into(),
            spent_tokens: spent.tokens,
            spent_cost_usd: nanos_to_usd(spent.cost_nanos),
            left,
            blocked: row
                .claim
                .as_ref()
                .and(row.blocked)
                .map(|limit| limit.as_str().to_owned()),
        });
        if self.budget.as_ref().is_some_and(|b| b.blocked.is_some())
            && self.status.kind == StatusType::Idle
        {
            self.status = Status::of(StatusType::Blocked);
        }
        self
    }
}

impl From<&model::Usage> for Usage {
    fn from(u: &model::Usage) -> Self {
        Usage {
            input: u.input,
            output: u.output,
            reasoning: u.reasoning,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            cost_nanos: u.cost_nanos,
        }
    }
}

impl From<model::Delivery> for Delivery {
    fn from(d: model::Delivery) -> Self {
        match d {
            model::Delivery::Steer => Delivery::Steer,
            model::Delivery::Queue => Delivery::Queue,
        }
    }
}

impl From<&model::InboxRow> for InboxItem {
    fn from(row: &model::InboxRow) -> Self {
        InboxItem {
            id: row.id.to_string(),
            admitted_seq: row.admitted_seq.0,
            delivery: row.delivery.into(),
            text: row.prompt.text.clone(),
            files: files(&row.prompt),
        }
    }
}

impl From<&model::StepError> for StepError {
    fn from(e: &model::StepError) -> Self {
        StepError {
            kind: match e.kind {
                model::FailureKind::Aborted => FailureKind::Aborted,
                model::FailureKind::Restarted => FailureKind::Restarted,
                model::FailureKind::Provider => FailureKind::Provider,
                model::FailureKind::ContextOverflow => FailureKind::ContextOverflow,
                model::FailureKind::Internal => FailureKind::Internal,
            },
            message: e.message.clone(),
        }
    }
}

/// The wire name of a finish reason.
pub fn finish(f: &model::Finish) -> String {
    match f {
        model::Finish::Stop => "stop".into(),
        model::Finish::Length => "length".into(),
        model::Finish::ToolCalls => "tool_calls".into(),
        model::Finish::ContentFilter => "content_filter".into(),
        model::Finish::Other(other) => other.clone(),
    }
}

/// Tool input as JSON: parsed when valid, else the raw text.
pub fn tool_input(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

impl From<&model::Message> for Message {
    fn from(m: &model::Message) -> Self {
        match m {
            model::Message::User {
                id,
                seq,
                admitted_seq,
                delivery,
                prompt,
                time,
            } => Message::User {
                id: id.to_string(),
                seq: seq.0,
                text: prompt.text.clone(),
                files: files(prompt),
                admitted_seq: admitted_seq.0,
                delivery: (*delivery).into(),
                time: Time {
                    created: time.0,
                    completed: None,
                },
            },
            model::Message::Assistant(a) => Message::Assistant {
                id: a.id.to_string(),
                seq: a.seq.0,
                step: a.step,
                agent: a.agent.clone(),
                model: a.model.clone(),
                content: a.parts.iter().map(Part::from).collect(),
                finish: a.finish.as_ref().map(finish),
                error: a.error.as_ref().map(StepError::from),
                usage: Usage::from(&a.usage),
                retries: a.retries,
                time: Time {
                    created: a.created.0,
                    completed: a.completed.map(|t| t.0),
                },
            },
            model::Message::System {
                id,
                seq,
                text,
                time,
            } => Message::System {
                id: id.to_string(),
                seq: seq.0,
                text: text.clone(),
                time: Time {
                    created: time.0,
                    completed: None,
                },
            },
            model::Message::Compaction {
                id,
                seq,
                auto,
                state,
                time,
            } => Message::Compaction {
                id: id.to_string(),
                seq: seq.0,
                auto: *auto,
                state: match state {
                    model::CompactionState::Running => Compaction::Running,
                    model::CompactionState::Completed { summary, kept_from } => {
                        Compaction::Completed {
                            summary: summary.clone(),
                            kept_from: kept_from.0,
                        }
                    }
                    model::CompactionState::Failed { error } => Compaction::Failed {
                        error: error.clone(),
                    },
                },
                time: Time {
                    created: time.0,
                    completed: None,
                },
            },
        }
    }
}

impl From<&model::Part> for Part {
    fn from(p: &model::Part) -> Self {
        match p {
            model::Part::Text { text, incomplete } => Part::Text {
                text: text.clone(),
                incomplete: *incomplete,
            },
            model::Part::Reasoning {
                text, incomplete, ..
            } => Part::Reasoning {
                text: text.clone(),
                incomplete: *incomplete,
            },
            model::Part::Tool(t) => Part::Tool {
                call_id: t.call_id.clone(),
                name: t.name.clone(),
                input: tool_input(&t.input),
                state: match &t.state {
                    model::ToolState::Running => ToolState::Running,
                    model::ToolState::Completed { output, truncated } => ToolState::Completed {
                        output: output.clone(),
                        truncated: *truncated,
                    },
                    model::ToolState::Error { error } => ToolState::Error {
                        error: error.clone(),
                    },
                    model::ToolState::Held => ToolState::Waiting,
                },
            },
            model::Part::Approval(a) => Part::Approval {
                call_id: a.call_id.clone(),
                digest: a.digest.clone(),
                expires_at: a.expires_at.0,
                decision: a.decision.as_ref().map(ApprovalDecision::from),
            },
        }
    }
}

impl Approval {
    /// A pending approval as listed: the held call's message, id, tool and raw input.
    pub fn pending(
        message_id: &model::MessageId,
        call_id: String,
        name: String,
        input: &str,
        digest: String,
        expires_at: model::Timestamp,
    ) -> Self {
        Approval {
            message_id: message_id.to_string(),
            call_id,
            name,
            input: tool_input(input),
            digest,
            expires_at: expires_at.0,
        }
    }
}

impl From<&model::Schedule> for Schedule {
    fn from(s: &model::Schedule) -> Self {
        let (cron, tz) = match &s.when {
            model::When::Once => (None, None),
            model::When::Cron { expr, tz } => (Some(expr.clone()), tz.clone()),
        };
        Schedule {
            id: s.id.to_string(),
            text: s.prompt.text.clone(),
            delivery: s.delivery.into(),
            cron,
            tz,
            catch_up: match s.catch_up {
                model::CatchUp::Once => CatchUp::Once,
                model::CatchUp::Skip => CatchUp::Skip,
            },
            next: s.next.0,
            next_at: rfc3339(s.next.0),
        }
    }
}

/// A time as RFC 3339 in UTC, with milliseconds (`2026-12-03T10:00:00.000Z`).
fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

impl From<model::Verdict> for Verdict {
    fn from(v: model::Verdict) -> Self {
        match v {
            model::Verdict::Approved => Verdict::Approved,
            model::Verdict::Denied => Verdict::Denied,
            model::Verdict::Expired => Verdict::Expired,
            model::Verdict::Cancelled => Verdict::Cancelled,
        }
    }
}

impl From<&model::Decision> for ApprovalDecision {
    fn from(d: &model::Decision) -> Self {
        ApprovalDecision {
            decision: d.verdict.into(),
            by: d.by.clone(),
            reason: d.reason.clone(),
            time: d.time.0,
        }
    }
}

impl From<&model::Stored> for Event {
    fn from(stored: &model::Stored) -> Self {
        use model::Event as E;
        let body = match &stored.event {
            E::SessionCreated {
                agent,
                model,
                title,
            } => EventBody::SessionCreated {
                agent: agent.clone(),
                model: model.clone(),
                title: title.clone(),
            },
            E::PromptAdmitted {
                id,
                delivery,
                prompt,
                wake: _,
            } => EventBody::PromptAdmitted {
                id: id.to_string(),
                delivery: (*delivery).into(),
                text: prompt.text.clone(),
                files: files(prompt),
            },
            E::PromptPromoted { id } => EventBody::PromptPromoted { id: id.to_string() },
            E::InstructionsUpdated { id, changed, text } => EventBody::InstructionsUpdated {
                id: id.to_string(),
                changed: changed
                    .iter()
                    .map(|(source, value)| InstructionChange {
                        source: source.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                text: text.clone(),
            },
            E::ExecutionStarted { forced } => EventBody::ExecutionStarted { forced: *forced },
            E::ExecutionSucceeded => EventBody::ExecutionSucceeded,
            E::ExecutionFailed { error, halted } => EventBody::ExecutionFailed {
                error: error.clone(),
                halted: *halted,
            },
            E::ExecutionInterrupted { reason } => EventBody::ExecutionInterrupted {
                reason: match reason {
                    model::InterruptReason::User => InterruptReason::User,
                    model::InterruptReason::Shutdown => InterruptReason::Shutdown,
                },
            },
            E::RecoveryAttempted { attempt } => EventBody::RecoveryAttempted { attempt: *attempt },
            E::StepStarted {
                id,
                step,
                agent,
                model,
            } => EventBody::StepStarted {
                id: id.to_string(),
                step: *step,
                agent: agent.clone(),
                model: model.clone(),
            },
            E::TextEnded {
                id,
                text,
                incomplete,
            } => EventBody::TextEnded {
                id: id.to_string(),
                text: text.clone(),
                incomplete: *incomplete,
            },
            E::ReasoningEnded {
                id,
                text,
                incomplete,
                ..
            } => EventBody::ReasoningEnded {
                id: id.to_string(),
                text: text.clone(),
                incomplete: *incomplete,
            },
            E::ToolCalled {
                id,
                call_id,
                name,
                input,
            } => EventBody::ToolCalled {
                id: id.to_string(),
                call_id: call_id.clone(),
                name: name.clone(),
                input: tool_input(input),
            },
            E::ToolSucceeded {
                id,
                call_id,
                output,
                truncated,
            } => EventBody::ToolSucceeded {
                id: id.to_string(),
                call_id: call_id.clone(),
                output: output.clone(),
                truncated: *truncated,
            },
            E::ToolFailed { id, call_id, error } => EventBody::ToolFailed {
                id: id.to_string(),
                call_id: call_id.clone(),
                error: error.clone(),
            },
            E::StepEnded { id, finish, usage } => EventBody::StepEnded {
                id: id.to_string(),
                finish: self::finish(finish),
                usage: usage.into(),
            },
            E::StepFailed { id, error } => EventBody::StepFailed {
                id: id.to_string(),
                error: error.into(),
            },
            E::RetryScheduled {
                id,
                attempt,
                delay_ms,
                error,
            } => EventBody::RetryScheduled {
                id: id.to_string(),
                attempt: *attempt,
                delay_ms: *delay_ms,
                error: error.into(),
            },
            E::CompactionStarted { id, auto } => EventBody::CompactionStarted {
                id: id.to_string(),
                auto: *auto,
            },
            E::CompactionEnded {
                id,
                summary,
                kept_from,
                usage,
            } => EventBody::CompactionEnded {
                id: id.to_string(),
                summary: summary.clone(),
                kept_from: kept_from.0,
                usage: usage.into(),
            },
            E::CompactionFailed { id, error } => EventBody::CompactionFailed {
                id: id.to_string(),
                error: error.clone(),
            },
            E::UsageRecorded { usage } => EventBody::UsageRecorded {
                usage: usage.into(),
            },
            E::StepUsage { id, usage } => EventBody::StepUsage {
                id: id.to_string(),
                usage: usage.into(),
            },
            E::ToolOutput {
                id,
                call_id,
                output,
            } => EventBody::ToolOutput {
                id: id.to_string(),
                call_id: call_id.clone(),
                bytes: output.len() as u64,
            },
            E::ApprovalRequested {
                id,
                call_id,
                name,
                digest,
                expires_at,
            } => EventBody::ApprovalRequested {
                id: id.to_string(),
                call_id: call_id.clone(),
                name: name.clone(),
                digest: digest.clone(),
                expires_at: expires_at.0,
            },
            E::ApprovalDecided {
                id,
                call_id,
                verdict,
                by,
                reason,
            } => EventBody::ApprovalDecided {
                id: id.to_string(),
                call_id: call_id.clone(),
                decision: (*verdict).into(),
                by: by.clone(),
                reason: reason.clone(),
            },
            E::ToolStarted { id, call_id } => EventBody::ToolStarted {
                id: id.to_string(),
                call_id: call_id.clone(),
            },
            E::ScheduleSet { schedule } => EventBody::ScheduleSet {
                schedule: schedule.into(),
            },
            E::ScheduleFired {
                id,
                at,
                next,
                admitted,
            } => EventBody::ScheduleFired {
                id: id.to_string(),
                at: at.0,
                next: next.map(|n| n.0),
                admitted: *admitted,
            },
            E::ScheduleCancelled { id } => EventBody::ScheduleCancelled { id: id.to_string() },
            E::BudgetSet { budget } => EventBody::BudgetSet {
                budget: budget.into(),
            },
            E::BudgetExhausted {
                which,
                spent,
                limit,
            } => EventBody::BudgetExhausted {
                which: which.as_str().to_owned(),
                spent: *spent,
                limit: *limit,
            },
            E::InterruptRequested { by } => EventBody::InterruptRequested { by: by.clone() },
        };
        Event {
            seq: stored.seq.0,
            time: stored.time.0,
            body,
        }
    }
}

fn files(prompt: &model::Prompt) -> Vec<File> {
    prompt
        .files
        .iter()
        .map(|f| File {
            mime: f.mime.clone(),
            url: f.url.clone(),
            filename: f.filename.clone(),
        })
        .collect()
}

/// US dollars as billionths of one, the unit of every cost the runtime keeps.
pub fn usd_to_nanos(usd: f64) -> Option<u64> {
    let nanos = (usd * 1e9).round();
    (usd.is_finite() && (0.0..=1e18).contains(&nanos)).then_some(nanos as u64)
}

fn nanos_to_usd(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

impl From<&model::Budget> for Budget {
    fn from(b: &model::Budget) -> Self {
        Budget {
            max_tokens: b.max_tokens,
            max_cost_usd: b.max_cost_nanos.map(nanos_to_usd),
            turn_max_tokens: b.turn_max_tokens,
            turn_max_cost_usd: b.turn_max_cost_nanos.map(nanos_to_usd),
        }
    }
}

impl TryFrom<&Budget> for model::Budget {
    type Error = String;
    /// Fails on a cost that is negative, not a number, or past a billion dollars.
    fn try_from(b: &Budget) -> Result<Self, String> {
        let cost = |field: &str, usd: Option<f64>| {
            usd.map(|usd| {
                usd_to_nanos(usd).ok_or_else(|| {
                    format!("budget.{field} must be a number of US dollars from 0 to 1e9")
                })
            })
            .transpose()
        };
        Ok(model::Budget {
            max_tokens: b.max_tokens,
            max_cost_nanos: cost("max_cost_usd", b.max_cost_usd)?,
            turn_max_tokens: b.turn_max_tokens,
            turn_max_cost_nanos: cost("turn_max_cost_usd", b.turn_max_cost_usd)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenthost_model::{
        Event as E, FailureKind as F, Finish, InterruptReason as R, MessageId, Prompt, Seq,
        StepError as SE, Stored, Timestamp,
    };

    fn every_event() -> Vec<E> {
        let id = MessageId::parse("msg_1").expect("invariant: valid id");
        let err = SE {
            kind: F::Provider,
            message: "x".into(),
        };
        vec![
            E::SessionCreated {
                agent: "a".into(),
                model: None,
                title: None,
            },
            E::PromptAdmitted {
                id: id.clone(),
                delivery: model::Delivery::Queue,
                prompt: Prompt::text("hi"),
                wake: true,
            },
            E::PromptPromoted { id: id.clone() },
            E::InstructionsUpdated {
                id: id.clone(),
                changed: vec![("system".into(), "be brief".into())],
                text: "be brief".into(),
            },
            E::ExecutionStarted { forced: true },
            E::ExecutionSucceeded,
            E::ExecutionFailed {
                error: "e".into(),
                halted: false,
            },
            E::ExecutionInterrupted { reason: R::User },
            E::RecoveryAttempted { attempt: 2 },
            E::StepStarted {
                id: id.clone(),
                step: 1,
                agent: "a".into(),
                model: "m".into(),
            },
            E::TextEnded {
                id: id.clone(),
                text: "t".into(),
                incomplete: false,
            },
            E::ReasoningEnded {
                id: id.clone(),
                text: "r".into(),
                metadata: Some("sig".into()),
                incomplete: true,
            },
            E::ToolCalled {
                id: id.clone(),
                call_id: "c".into(),
                name: "n".into(),
                input: r#"{"q":1}"#.into(),
            },
            E::ToolSucceeded {
                id: id.clone(),
                call_id: "c".into(),
                output: "o".into(),
                truncated: false,
            },
            E::ToolFailed {
                id: id.clone(),
                call_id: "c".into(),
                error: "e".into(),
            },
            E::StepEnded {
                id: id.clone(),
                finish: Finish::ToolCalls,
                usage: model::Usage::default(),
            },
            E::StepFailed {
                id: id.clone(),
                error: err.clone(),
            },
            E::RetryScheduled {
                id: id.clone(),
                attempt: 1,
                delay_ms: 2000,
                error: err,
            },
            E::CompactionStarted {
                id: id.clone(),
                auto: true,
            },
            E::CompactionEnded {
                id: id.clone(),
                summary: "s".into(),
                kept_from: Seq(4),
                usage: model::Usage::default(),
            },
            E::CompactionFailed {
                id,
                error: "e".into(),
            },
            E::UsageRecorded {
                usage: model::Usage::default(),
            },
            E::StepUsage {
                id: MessageId::parse("msg_x").expect("id"),
                usage: model::Usage::default(),
            },
            E::ToolOutput {
                id: MessageId::parse("msg_x").expect("id"),
                call_id: "c".into(),
                output: "whole".into(),
            },
        ]
    }

    #[test]
    fn event_type_is_the_model_kind_and_round_trips() {
        for (n, event) in every_event().into_iter().enumerate() {
            let stored = Stored {
                seq: Seq(n as u64),
                time: Timestamp(1000 + n as u64),
                event: event.clone(),
            };
            let wire = Event::from(&stored);
            let json = serde_json::to_value(&wire).expect("invariant: serializable");
            assert_eq!(json["type"], event.kind(), "{json}");
            assert_eq!(json["seq"], n as u64);
            assert_eq!(json["time"], 1000 + n as u64);
            let back: Event = serde_json::from_value(json.clone()).expect("round trip");
            assert_eq!(back, wire, "{json}");
        }
    }

    #[test]
    fn rendering_is_stable() {
        let stored = Stored {
            seq: Seq(7),
            time: Timestamp(42),
            event: E::ToolCalled {
                id: MessageId::parse("msg_a").expect("invariant: valid id"),
                call_id: "c1".into(),
                name: "lookup".into(),
                input: r#"{"q":"x"}"#.into(),
            },
        };
        assert_eq!(
            serde_json::to_string(&Event::from(&stored)).expect("invariant: serializable"),
            r#"{"seq":7,"time":42,"type":"tool_called","id":"msg_a","call_id":"c1","name":"lookup","input":{"q":"x"}}"#
        );
        let invalid = tool_input("{not json");
        assert_eq!(invalid, Value::String("{not json".into()));
    }

    #[test]
    fn message_json_has_the_documented_fields() {
        let assistant = model::Message::Assistant(model::AssistantMessage {
            id: MessageId::parse("msg_b").expect("invariant: valid id"),
            seq: Seq(3),
            step: 1,
            agent: "default".into(),
            model: "m".into(),
            parts: vec![
                model::Part::Text {
                    text: "hi".into(),
                    incomplete: false,
                },
                model::Part::Tool(model::ToolPart {
                    call_id: "c1".into(),
                    name: "lookup".into(),
                    input: "{}".into(),
                    state: model::ToolState::Completed {
                        output: "ok".into(),
                        truncated: false,
                    },
                }),
            ],
            finish: Some(Finish::Stop),
            error: None,
            usage: model::Usage::default(),
            retries: 0,
            created: Timestamp(5),
            completed: Some(Timestamp(6)),
        });
        let json = serde_json::to_value(Message::from(&assistant)).expect("serializable");
        assert_eq!(json["type"], "assistant");
        assert_eq!(json["id"], "msg_b");
        assert_eq!(json["seq"], 3);
        assert_eq!(json["finish"], "stop");
        assert_eq!(json["error"], Value::Null);
        assert_eq!(json["time"]["completed"], 6);
        assert_eq!(json["content"][0]["type"], "text");
        assert_eq!(json["content"][1]["type"], "tool");
        assert_eq!(json["content"][1]["state"]["status"], "completed");
        assert_eq!(json["content"][1]["state"]["output"], "ok");
        assert_eq!(json["usage"]["input"], 0);
    }
}
