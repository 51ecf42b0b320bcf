//! The boot sweep (SPEC §12.3): at start, find every session a previous process left with a claim
//! or with pending input and resume it, with bounded concurrency.
//!
//! Before each resume of a claimed session, `resume_attempts` is incremented durably
//! (`RecoveryAttempted`); past `max_attempts` the session is failed as interrupted repeatedly and
//! its claim released. A resumed session gets one synthetic note that the server restarted.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use agenthost_model::{Event, SessionId};
use futures::StreamExt;

use crate::config::{Recovery, RecoveryMode};
use crate::drain::{Cancel, Drain, mint_message_id, settle_leftovers};
use crate::error::Result;
use crate::runtime::Runtime;

/// The note a resumed session's model sees.
pub const RESTART_NOTE: &str = "The server restarted while you were working on this session. \
     Continue where you left off; do not repeat work that is already complete.";

pub(crate) async fn sweep(runtime: &Runtime, config: &Recovery) {
    if config.mode == RecoveryMode::Off {
        return;
    }
    let found = match candidates(runtime) {
        Ok(found) => found,
        Err(e) => {
            tracing::error!(error = %e, "recovery sweep could not read the store");
            return;
        }
    };
    if found.is_empty() {
        return;
    }
    if config.mode == RecoveryMode::Pause {
        for session in &found {
            tracing::warn!(session_id = %session, "paused: left running by a previous process; resume it explicitly");
        }
        return;
    }
    tracing::info!(sessions = found.len(), "recovering sessions");
    futures::stream::iter(found)
        .for_each_concurrent(config.concurrency.max(1), |session| async move {
            if let Err(e) = recover(runtime, config, &session).await {
                tracing::error!(session_id = %session, error = %e, "recovery failed");
            }
        })
        .await;
}

fn candidates(runtime: &Runtime) -> Result<BTreeSet<SessionId>> {
    let snap = runtime.snapshot()?;
    let mut found: BTreeSet<SessionId> = snap.claimed()?.into_iter().collect();
    found.extend(snap.with_pending()?);
    Ok(found)
}

async fn recover(runtime: &Runtime, config: &Recovery, session: &SessionId) -> Result<()> {
    let Some(row) = runtime.snapshot()?.session(session)? else {
        return Ok(());
    };
    if row.halted.is_some() {
        return Ok(());
    }
    if row.claim.is_some() {
        let attempt = row.resume_attempts + 1;
        let store = runtime.store();
        if attempt > config.max_attempts {
            // Close what the last process left before giving up, so nothing stays half-done.
            let drain = Drain {
                session: session.clone(),
                shared: runtime.shared().clone(),
                forced: false,
                compact: false,
                cancel: Cancel::default(),
                in_flight: Default::default(),
                history: None,
            };
            settle_leftovers(&drain).await?;
            let event = Event::ExecutionFailed {
                error: format!(
                    "interrupted repeatedly: {} recoveries did not complete; resume to retry",
                    row.resume_attempts
                ),
                halted: true,
            };
            store.append(session.clone(), vec![event]).await?;
            return Ok(());
        }
        let note = Event::InstructionsUpdated {
            id: mint_message_id(),
            changed: Vec::new(),
            text: RESTART_NOTE.into(),
        };
        store
            .append(
                session.clone(),
                vec![Event::RecoveryAttempted { attempt }, note],
            )
            .await?;
    }
    runtime
        .shared()
        .metrics
        .recovered
        .fetch_add(1, Ordering::Relaxed);
    runtime.wake(session).await
}
