//! Settling what a stopped execution left, inside the session's own drain (ARCHITECTURE.md,
//! "Recovery: what a session owes"): counting the attempt, asking what the session owes, running
//! idempotent tools again, failing the rest, and the one restart note.

use agenthost_model::owed::{self, Owed, Policy, Why};
use agenthost_model::promotion::Boundary;
use agenthost_model::{Event, Message, MessageId, ToolPart};
use futures::FutureExt;

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

/// What recovery found.
pub(crate) enum Recovered {
    /// Too many recoveries in a row without progress: the session is failed and halted.
    GaveUp(String),
    /// A model call is owed; the drain runs `next_step` next, promoting at `boundary` first (a
    /// queued input waits out an exchange the stop cut).
    Owes { next_step: u32, boundary: Boundary },
    /// Nothing is owed: the drain settles.
    Answered,
}

/// Recovers a session whose claim an execution that is gone left (ARCHITECTURE.md, "Recovery:
/// what a session owes"). It runs inside the session's own drain, so nothing else of the
/// session runs meanwhile. It counts the attempt durably with the claim it takes over, then
/// asks [`agenthost_model::owed`] what the session owes: past the attempt limit, everything
/// left open is failed without running anything and the session is halted, in one commit;
/// otherwise the leftovers are settled (an idempotent tool runs again with the same key, any
/// other is failed as stopped), and when a model call is owed, one note tells the model the
/// server restarted.
pub(crate) async fn recover(d: &Drain, row: &agenthost_model::SessionRow) -> Result<Recovered> {
    // Every message from where the active history loads, compactions included (the history the
    // model sees leaves them out).
    let from = agenthost_model::history::load_from(row);
    let messages = d
        .read(move |snap, session| Ok(snap.messages(session, from, usize::MAX)?))
        .await?;
    let policy = policy(&d.shared, row);
    let attempt = row.resume_attempts + 1;
    let left = owed::leftovers(&messages);
    let decision = owed::owed(row, &messages, &policy);
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
    // The step a stop cut is run again under its number; tool results continue to the next; a
    // user message last starts an exchange.
    let last = messages
        .iter()
        .rev()
        .find(|m| matches!(m, Message::Assistant(_) | Message::User { .. }))
        .and_then(|m| match m {
            Message::Assistant(a) => Some(a.step),
            _ => None,
        });
    let next_step = match (why, last) {
        (Why::ToolResults, Some(step)) => step + 1,
        (Why::CutStep | Why::PendingRetry | Why::Compaction, Some(step)) => step,
        _ => 1,
    };
    Ok(Recovered::Owes {
        next_step,
        boundary: why.boundary(),
    })
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
        .get(&tool.name)
        .filter(|t| t.idempotent)
        .cloned();
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
            let run = std::panic::AssertUnwindSafe(t.executor.execute(call)).catch_unwind();
            match tokio::time::timeout(t.timeout, run).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err("the tool panicked".to_owned()),
                Err(_) => Err(format!("the tool timed out after {:?}", t.timeout)),
            }
        }
        _ => Err(STOPPED_TOOL.to_owned()),
    };
    let events =
        crate::drain::step::settled(message, &tool.call_id, &result, d.shared.limits.tool_output);
    d.append(events).await
}
