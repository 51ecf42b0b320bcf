//! The runtime's approval operations (ARCHITECTURE.md, "Approvals"): what a session is doing,
//! the approvals it waits for, and deciding one. A decision is one durable event the projector
//! accepts once, written by whoever asks (never through the session's actor, which holds no
//! drain while it waits), then a wake: the session's next drain starts or refuses the call.

use agenthost_model::{Decision, Event, Message, MessageId, SessionId};
use agenthost_store::{Action, Snapshot};

use crate::approvals::{Decide, PendingApproval, pending};
use crate::bus::Activity;
use crate::error::{Error, Result};
use crate::runtime::{Runtime, message_seq};

impl Runtime {
    /// What the session is doing as far as this process knows: a drain running, waiting for
    /// approvals, or idle.
    pub fn activity(&self, session: &SessionId) -> Activity {
        if self.shared.active.contains_key(session) {
            Activity::Running
        } else if self.shared.deadlines.is_waiting(session) {
            Activity::Waiting
        } else if self.shared.blocked.contains_key(session) {
            Activity::Blocked
        } else {
            Activity::Idle
        }
    }

    /// Sessions of this process that wait for approvals.
    pub fn waiting(&self) -> usize {
        self.shared.deadlines.len()
    }

    /// The approvals the session waits for, in call order.
    pub async fn approvals(&self, session: &SessionId) -> Result<Vec<PendingApproval>> {
        let session = session.clone();
        self.read(move |snap| {
            let row = snap
                .session(&session)?
                .ok_or_else(|| Error::SessionNotFound(session.clone()))?;
            // Only an exchange that keeps its claim can wait.
            if row.claim.is_none() {
                return Ok(Vec::new());
            }
            let from = agenthost_model::history::load_from(&row);
            Ok(pending(&snap.messages(&session, from, usize::MAX)?))
        })
        .await
    }

    /// Decides the approval of tool call `call_id` of assistant message `message`, durably and
    /// once, then wakes the session. A second decision is `AlreadyDecided` with the first; a
    /// digest that is not the call's is `DigestMismatch`; a call that asked for no approval (or
    /// does not exist) is `NotFound`. Nothing is written in any of those cases.
    pub async fn decide(
        &self,
        session: &SessionId,
        message: &MessageId,
        call_id: &str,
        decide: Decide,
    ) -> Result<Decision> {
        self.check_open()?;
        self.check_owner(session)?;
        let verdict = decide.verdict();
        {
            let (s, m, c, digest) = (
                session.clone(),
                message.clone(),
                call_id.to_owned(),
                decide.digest.clone(),
            );
            self.read(move |snap| undecided(snap, &s, &m, &c, &digest))
                .await?;
        }
        let mut actions = self.fence(session);
        actions.push(Action::Append(Event::ApprovalDecided {
            id: message.clone(),
            call_id: call_id.to_owned(),
            verdict,
            by: decide.by.clone(),
            reason: decide.reason.clone(),
        }));
        match self.shared.store.write(session.clone(), actions).await {
            Ok(_) => {}
            // Decided by someone else (another decision, an interrupt, the expiry) since the
            // check: the first decision stands, and is the answer.
            Err(agenthost_store::Error::Violation(_)) => {
                undecided(
                    &*self.snapshot()?,
                    session,
                    message,
                    call_id,
                    &decide.digest,
                )?;
                return Err(Error::Unavailable(format!(
                    "the approval of tool call {call_id} could not be decided; retry"
                )));
            }
            Err(e) => return Err(e.into()),
        }
        // The wake runs in a task of its own, as an admission's does: the decision is durable
        // whatever happens to the caller, and the boot sweep finds a claimed session anyway.
        let (runtime, woken) = (self.clone(), session.clone());
        let wake = tokio::spawn(async move { runtime.wake(&woken).await });
        match wake.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(session_id = %session, error = %e, "decided, but the wake failed")
            }
            Err(e) => {
                tracing::warn!(session_id = %session, error = %e, "decided, but the wake task failed")
            }
        }
        let snap = self.snapshot()?;
        approval(&*snap, session, message, call_id)?
            .decision
            .filter(|d| d.verdict == verdict)
            .ok_or_else(|| Error::Unavailable("the decision is not readable yet".into()))
    }

    /// Runs `read` on a snapshot on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&dyn Snapshot) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let runtime = self.clone();
        tokio::task::spawn_blocking(move || read(&*runtime.snapshot()?))
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?
    }
}

/// The approval of call `call_id` of message `message` in `session`, read from its message:
/// `NotFound` when there is no such call, or it asked for no approval.
fn approval(
    snap: &dyn Snapshot,
    session: &SessionId,
    message: &MessageId,
    call_id: &str,
) -> Result<agenthost_model::Approval> {
    let missing = || {
        Error::NotFound(format!(
            "approval of tool call {call_id} of message {message}"
        ))
    };
    let seq = message_seq(snap, session, message)?.ok_or_else(missing)?;
    let found = snap.messages(session, seq, 1)?.into_iter().next();
    let Some(Message::Assistant(a)) = found else {
        return Err(missing());
    };
    a.approval(call_id)
        .filter(|_| a.tool(call_id).is_some())
        .cloned()
        .ok_or_else(missing)
}

/// `Ok` when call `call_id` waits for a decision and `digest` is what it asks.
fn undecided(
    snap: &dyn Snapshot,
    session: &SessionId,
    message: &MessageId,
    call_id: &str,
    digest: &str,
) -> Result<()> {
    let approval = approval(snap, session, message, call_id)?;
    if let Some(decision) = approval.decision {
        return Err(Error::AlreadyDecided {
            call_id: call_id.to_owned(),
            decision: Box::new(decision),
        });
    }
    if approval.digest != digest {
        return Err(Error::DigestMismatch {
            call_id: call_id.to_owned(),
            given: digest.to_owned(),
            asked: approval.digest,
        });
    }
    Ok(())
}
