//! Settling what a stopped execution left, inside the session's own drain (ARCHITECTURE.md,
//! "Recovery: what a session owes"): counting the attempt, asking what the session owes, running
//! idempotent tools again, failing the rest, and the one restart note.

use agenthost_model::owed::{self, Held, Owed, Policy, Why};
use agenthost_model::promotion::Boundary;
use agenthost_model::{Event, Message, MessageId, SessionRow, Timestamp, ToolPart, Verdict};

use crate::config::OnNewInput;
use crate::drain::Drain;
use crate::error::Result;
use crate::mint;
use crate::shared::Shared;
use crate::tools::Call;

/// The note a resumed session's model sees.
pub const RESTART_NOTE: &str = "The server restarted while you were working on this session. \
     Continue where you left off; do not repeat work that is already complete.";

/// The "may or may not have taken effect" result of a tool a stopped process was running.
pub const STOPPED_TOOL: &str = "the process stopped while this tool ran; it may or may not have \
     taken effect. Check before repeating it.";

/// How long recovery waits for a tool a source that is still starting may bring back (an MCP
/// server started with the runtime) before it settles the call without it.
const TOOL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What recovery found.
pub(crate) enum Recovered {
    /// Too many recoveries in a row without progress: the session is failed and halted.
    GaveUp(String),
    /// A model call is owed; the drain runs `next_step` next, promoting at `boundary` first (a
    /// queued input waits out an exchange the stop cut).
    Owes { next_step: u32, boundary: Boundary },
    /// Nothing is owed: the drain settles.
    Answered,
    /// The exchange waits for approvals, the earliest expiring at this time: the drain ends,
    /// writing nothing, and the claim stays with the exchange.
    Waiting(Timestamp),
    /// Interrupted while it ran approved calls; the interrupt's cleanup is done.
    Interrupted,
}

/// The step a call owed for `why` runs as: the step a stop cut (or whose retry is owed) again
/// under its number; tool results continue to the next; a user message last starts an exchange.
fn next_step(why: Why, messages: &[Message]) -> u32 {
    match (why, last_step(messages)) {
        (Why::ToolResults | Why::Decided, Some(step)) => step + 1,
        (Why::CutStep | Why::PendingRetry | Why::Compaction, Some(step)) => step,
        _ => 1,
    }
}

/// Recovers a session whose claim an execution that is gone left (ARCHITECTURE.md, "Recovery:
/// what a session owes"). It runs inside the session's own drain, so nothing else of the
/// session runs meanwhile. It counts the attempt durably with the claim it takes over, then
/// asks [`agenthost_model::owed`] what the session owes: past the attempt limit, everything
/// left open is failed without running anything and the session is halted, in one commit;
/// otherwise the leftovers are settled (an idempotent tool runs again with the same key, any
/// other is failed as stopped), and when a model call is owed, one note tells the model the
/// server restarted.
///
/// A claim an exchange keeps while it waits for approvals is no stop: while an approval is
/// undecided, the drain only settles what expired (or, with `on_new_input = "deny"`, what
/// steering input withdraws) and ends; once every approval is decided, the exchange goes on
/// (refused calls settle, approved ones start and run) with no attempt counted and no note,
/// unless a stop also cut something.
pub(crate) async fn recover(d: &Drain, row: &SessionRow, steering: bool) -> Result<Recovered> {
    let policy = policy(&d.shared, row);
    let mut messages = messages(d, row).await?;
    let mut decision = owed::owed(row, &messages, &policy);
    if let Owed::Waiting { expires_at } = decision {
        let now = agenthost_store::system_clock();
        let withdraw = steering && on_new_input(&d.shared, row) == OnNewInput::Deny;
        let decided = settle_waiting(&messages, now, withdraw);
        if decided.is_empty() {
            return Ok(Recovered::Waiting(expires_at));
        }
        d.append(decided).await?;
        messages = self::messages(d, row).await?;
        decision = owed::owed(row, &messages, &policy);
        if let Owed::Waiting { expires_at } = decision {
            return Ok(Recovered::Waiting(expires_at));
        }
    }
    let attempt = row.resume_attempts + 1;
    let left = owed::leftovers(&messages);
    let cut = !(left.tools.is_empty() && left.steps.is_empty() && left.compactions.is_empty());
    if let Owed::Blocked(_) = decision {
        // The budget blocked the exchange and the drain ended there: it goes on where it
        // stopped, with no attempt counted and no note (its next call is checked again before
        // it is made). The claim's new start unblocks the row.
        let mut unblocked = row.clone();
        unblocked.blocked = None;
        decision = owed::owed(&unblocked, &messages, &policy);
        if !cut {
            d.append(vec![Event::ExecutionStarted { forced: d.forced }])
                .await?;
            tracing::info!(session_id = %d.session, ?decision, "the budget's block is lifted: the exchange goes on");
            return Ok(match decision {
                Owed::Call(why) => Recovered::Owes {
                    next_step: next_step(why, &messages),
                    boundary: why.boundary(),
                },
                Owed::Waiting { expires_at } => Recovered::Waiting(expires_at),
                _ => Recovered::Answered,
            });
        }
    }
    if decision == Owed::Call(Why::Decided) && !cut {
        // The exchange waited for approvals, and every one is decided: it goes on.
        tracing::info!(session_id = %d.session, "approvals decided: the exchange goes on");
        if !start_held(d, &left.held).await? {
            return Ok(Recovered::Interrupted);
        }
        return Ok(Recovered::Owes {
            next_step: last_step(&messages).map_or(1, |step| step + 1),
            boundary: Boundary::Continuation,
        });
    }
    tracing::info!(session_id = %d.session, attempt, ?decision, "recovering");
    d.shared.metrics.recoveries.inc();
    if let Owed::Fail(reason) = decision {
        let mut events = vec![Event::RecoveryAttempted { attempt }];
        events.extend(owed::close(&left, STOPPED_TOOL));
        events.push(Event::ExecutionFailed {
            error: reason.clone(),
            halted: true,
        });
        d.append(events).await?;
        return Ok(Recovered::GaveUp(reason));
    }
    d.append(vec![
        Event::ExecutionStarted { forced: d.forced },
        Event::RecoveryAttempted { attempt },
    ])
    .await?;
    for (message, tool) in &left.tools {
        settle_orphaned_tool(d, message, tool).await?;
    }
    if !start_held(d, &left.held).await? {
        return Ok(Recovered::Interrupted);
    }
    let mut closing: Vec<Event> = left
        .steps
        .iter()
        .map(|id| Event::StepFailed {
            id: id.clone(),
            error: owed::restarted(),
        })
        .collect();
    closing.extend(owed::close_compactions(&left));
    let Owed::Call(why) = decision else {
        if !closing.is_empty() {
            d.append(closing).await?;
        }
        return Ok(Recovered::Answered);
    };
    closing.push(Event::InstructionsUpdated {
        id: mint::message_id(),
        changed: Vec::new(),
        text: RESTART_NOTE.into(),
    });
    d.append(closing).await?;
    let next_step = next_step(why, &messages);
    Ok(Recovered::Owes {
        next_step,
        boundary: why.boundary(),
    })
}

/// Every message from where the active history loads, compactions included (the history the
/// model sees leaves them out).
async fn messages(d: &Drain, row: &SessionRow) -> Result<Vec<Message>> {
    let from = agenthost_model::history::load_from(row);
    d.read(move |snap, session| Ok(snap.messages(session, from, usize::MAX)?))
        .await
}

/// The step number of the newest message that speaks, if an assistant message.
fn last_step(messages: &[Message]) -> Option<u32> {
    messages
        .iter()
        .rev()
        .find(|m| matches!(m, Message::Assistant(_) | Message::User { .. }))
        .and_then(|m| match m {
            Message::Assistant(a) => Some(a.step),
            _ => None,
        })
}

/// The decisions the runtime makes itself on the approvals an exchange waits for, at `now`:
/// expired ones are settled `Expired`; with `withdraw` (steering input arrived and the agent
/// says `on_new_input = "deny"`) every undecided one is `Cancelled`. Decisions as data: the
/// drain writes what comes out.
fn settle_waiting(messages: &[Message], now: Timestamp, withdraw: bool) -> Vec<Event> {
    let Some(a) = messages.iter().rev().find_map(|m| match m {
        Message::Assistant(a) => Some(a),
        _ => None,
    }) else {
        return Vec::new();
    };
    owed::held(a)
        .into_iter()
        .filter(|h| h.decision.is_none())
        .filter_map(|h| {
            let (verdict, reason) = if h.expires_at <= now {
                (Verdict::Expired, None)
            } else if withdraw {
                (Verdict::Cancelled, Some("new input arrived".to_owned()))
            } else {
                return None;
            };
            Some(Event::ApprovalDecided {
                id: h.message,
                call_id: h.tool.call_id,
                verdict,
                by: None,
                reason,
            })
        })
        .collect()
}

/// Starts or refuses what an exchange held for approval, as decided: refused calls settle with
/// their refusal, approved ones are recorded as started (in one commit, before any of them runs)
/// and run concurrently, each settling as it finishes. The drain's slot is given back while
/// they run. `false` when interrupted meanwhile: a user's interrupt settles what it cut (as
/// [`crate::drain::release`] does), a shutdown leaves the started calls to recovery's crash rule.
async fn start_held(d: &Drain, held: &[Held]) -> Result<bool> {
    let approved: Vec<&Held> = held
        .iter()
        .filter(|h| {
            h.decision
                .as_ref()
                .is_some_and(|x| x.verdict == Verdict::Approved)
        })
        .collect();
    // One still undecided belongs to an exchange that moved on without it (the one that waits is
    // never recovered): it is withdrawn, so no call is left without a result.
    let undecided: Vec<Held> = held
        .iter()
        .filter(|h| h.decision.is_none())
        .cloned()
        .collect();
    let mut events = owed::withdraw(&undecided, "the exchange moved on");
    events.extend(held.iter().filter_map(|h| {
        let refusal = h.decision.as_ref()?.refusal()?;
        Some(Event::ToolFailed {
            id: h.message.clone(),
            call_id: h.tool.call_id.clone(),
            error: refusal,
        })
    }));
    events.extend(approved.iter().map(|h| Event::ToolStarted {
        id: h.message.clone(),
        call_id: h.tool.call_id.clone(),
    }));
    if events.is_empty() {
        return Ok(true);
    }
    d.append(events).await?;
    if approved.is_empty() {
        return Ok(true);
    }
    let shared = &d.shared;
    let runs = approved.iter().map(|h| async move {
        let tool = &h.tool;
        let registered = shared.tools.find(&tool.name, TOOL_WAIT).await;
        let input = serde_json::from_str(&tool.input);
        let result = match (registered, input) {
            (Some(t), Ok(input)) => {
                let call = Call {
                    session: d.session.clone(),
                    message: h.message.clone(),
                    call_id: tool.call_id.clone(),
                    name: tool.name.clone(),
                    input,
                };
                t.run(call).await
            }
            (None, _) => Err(format!("unknown tool {:?}", tool.name)),
            (_, Err(e)) => Err(format!("invalid JSON arguments: {e}")),
        };
        shared
            .metrics
            .tool_call(&tool.name, if result.is_ok() { "ok" } else { "failed" });
        let events = crate::drain::step::settled(
            &h.message,
            &tool.call_id,
            &result,
            shared.limits.tool_output,
        );
        d.append(events).await
    });
    d.slot.release();
    let ran = tokio::select! {
        biased;
        _ = d.cancel.cancelled() => None,
        ran = futures::future::try_join_all(runs) => Some(ran),
    };
    match ran {
        Some(ran) => {
            ran?;
            d.slot.take(shared, &d.cancel).await;
            Ok(true)
        }
        None if d.cancel.reason() == agenthost_model::InterruptReason::User => {
            crate::drain::release(d).await?;
            Ok(false)
        }
        None => Ok(false),
    }
}

fn on_new_input(shared: &Shared, row: &SessionRow) -> OnNewInput {
    shared
        .catalog
        .agents
        .get(&row.agent)
        .map_or(OnNewInput::Keep, |a| a.on_new_input)
}

/// The limits [`agenthost_model::owed`] applies to this session.
fn policy(shared: &Shared, row: &agenthost_model::SessionRow) -> Policy {
    Policy {
        // An agent no longer configured owes a call: the step then fails with the reason.
        max_steps: shared
            .catalog
            .agents
            .get(&row.agent)
            .map_or(u32::MAX, |a| a.steps),
        max_attempts: shared.recovery.max_attempts,
    }
}

/// Settles a tool a stopped process left running: re-executed with the same idempotency key if
/// the tool is idempotent, otherwise failed with [`STOPPED_TOOL`].
pub(crate) async fn settle_orphaned_tool(
    d: &Drain,
    message: &MessageId,
    tool: &ToolPart,
) -> Result<()> {
    let registered = d
        .shared
        .tools
        .find(&tool.name, TOOL_WAIT)
        .await
        .filter(|t| t.idempotent);
    let input = serde_json::from_str(&tool.input).ok();
    let result = match (registered, input) {
        (Some(t), Some(input)) => {
            let call = Call {
                session: d.session.clone(),
                message: message.clone(),
                call_id: tool.call_id.clone(),
                name: tool.name.clone(),
                input,
            };
            t.run(call).await
        }
        _ => Err(STOPPED_TOOL.to_owned()),
    };
    let events =
        crate::drain::step::settled(message, &tool.call_id, &result, d.shared.limits.tool_output);
    d.append(events).await
}

#[cfg(test)]
mod tests {
    use agenthost_model::{
        Approval, AssistantMessage, Finish, Part, Seq, ToolPart, ToolState, Usage,
    };

    use super::*;

    /// A settled step with two calls held for approvals expiring at 100 and 300.
    fn waiting() -> Vec<Message> {
        let id = MessageId::parse("msg_a").expect("id");
        let mut parts = Vec::new();
        for (call, expires) in [("c1", 100), ("c2", 300)] {
            parts.push(Part::Tool(ToolPart {
                call_id: call.into(),
                name: "pay".into(),
                input: "{}".into(),
                state: ToolState::Held,
            }));
            parts.push(Part::Approval(Approval {
                call_id: call.into(),
                digest: "sha256:0".into(),
                expires_at: Timestamp(expires),
                decision: None,
            }));
        }
        vec![Message::Assistant(AssistantMessage {
            id,
            seq: Seq(3),
            step: 1,
            agent: "a".into(),
            model: "m".into(),
            parts,
            finish: Some(Finish::ToolCalls),
            error: None,
            usage: Usage::default(),
            retries: 0,
            created: Timestamp(0),
            completed: Some(Timestamp(0)),
        })]
    }

    fn verdicts(events: &[Event]) -> Vec<(String, Verdict)> {
        events
            .iter()
            .map(|e| match e {
                Event::ApprovalDecided {
                    call_id, verdict, ..
                } => (call_id.clone(), *verdict),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_runtime_decides_only_what_expired_or_what_new_input_withdraws() {
        let messages = waiting();
        assert!(settle_waiting(&messages, Timestamp(99), false).is_empty());
        assert_eq!(
            verdicts(&settle_waiting(&messages, Timestamp(100), false)),
            [("c1".to_owned(), Verdict::Expired)]
        );
        assert_eq!(
            verdicts(&settle_waiting(&messages, Timestamp(100), true)),
            [
                ("c1".to_owned(), Verdict::Expired),
                ("c2".to_owned(), Verdict::Cancelled)
            ]
        );
        assert_eq!(
            verdicts(&settle_waiting(&messages, Timestamp(300), false)),
            [
                ("c1".to_owned(), Verdict::Expired),
                ("c2".to_owned(), Verdict::Expired)
            ]
        );
    }
}
