//! The boot sweep: at start, find every session a previous process left with a claim or with
//! pending input and wake it, with bounded concurrency (ARCHITECTURE.md, "Recovery: what a
//! session owes").
//!
//! The sweep only wakes. Counting the attempt, giving up past `max_attempts`, settling leftovers
//! and the one note that the server restarted all happen in the session's own drain, inside its
//! actor, so a sweep can never interleave with a drain of the same session.

use std::collections::BTreeSet;
use std::time::Duration;

use agenthost_model::SessionId;
use futures::StreamExt;

use crate::config::{Recovery, RecoveryMode};
use crate::error::Result;
use crate::runtime::Runtime;

/// How long the sweep waits for one recovered session before it frees its slot for the next: a
/// session that stays busy longer keeps running, it only stops holding up the sweep.
const RECOVERY_WAIT: Duration = Duration::from_secs(60);

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
            if let Err(e) = recover(runtime, &session).await {
                tracing::error!(session_id = %session, error = %e, "recovery failed");
            }
        })
        .await;
}

/// Sessions this node owns that hold a claim or pending input.
fn candidates(runtime: &Runtime) -> Result<BTreeSet<SessionId>> {
    let snap = runtime.snapshot()?;
    let mut found: BTreeSet<SessionId> = snap.claimed()?.into_iter().collect();
    found.extend(snap.with_pending()?);
    found.retain(|s| runtime.owns(s));
    Ok(found)
}

/// In a cluster, follows this node's partitions: a partition taken (at a new epoch) gets the
/// same sweep as a boot, for the sessions now owned here; a partition lost stops its session
/// actors at once (their writes are already refused: the store fences them), leaving their
/// claims for the new owner's sweep. Ends with the runtime.
pub(crate) async fn follow(
    runtime: &Runtime,
    mut changes: tokio::sync::broadcast::Receiver<agenthost_store::Lease>,
) {
    use agenthost_store::Lease;
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let change = tokio::select! {
            _ = runtime.shared.stopping.cancelled() => return,
            change = changes.recv() => change,
        };
        match change {
            Ok(Lease::Lost(_)) => runtime.stop_unowned().await,
            Ok(Lease::Gained(parts)) => {
                tracing::info!(partitions = ?parts, "recovering the sessions of taken partitions");
                let (runtime, config) = (runtime.clone(), runtime.shared.recovery.clone());
                tokio::spawn(async move { sweep(&runtime, &config).await });
            }
            // Missed changes: make the actors match what is held, and sweep what may be new.
            Err(RecvError::Lagged(_)) => {
                runtime.stop_unowned().await;
                let (runtime, config) = (runtime.clone(), runtime.shared.recovery.clone());
                tokio::spawn(async move { sweep(&runtime, &config).await });
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Wakes the session and waits until it is idle again, which bounds how many recoveries run at
/// once. Everything else happens in the session's own drain: it sees the claim, counts the
/// attempt, settles what was left and runs what is owed (see `drain::recover`).
async fn recover(runtime: &Runtime, session: &SessionId) -> Result<()> {
    runtime.wake(session).await?;
    match runtime.idle(session, RECOVERY_WAIT).await {
        Err(crate::Error::Timeout { .. }) => Ok(()),
        other => other,
    }
}

/// The lost-wake sweep: every `limits.wake_sweep`, wakes each session whose newest event is an
/// admission and that no drain of this process is running. That is exactly an input admitted
/// and never woken (its caller went away between the two); a session that ran a drain since
/// its last admission is not woken again, so input a drain left pending on purpose (an
/// instruction source with no value yet, a halted session) is not retried in a loop. Ends with
/// the runtime.
pub(crate) async fn watch(runtime: &Runtime) {
    let every = runtime.shared.limits.wake_sweep;
    if every.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = runtime.shared.stopping.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // Store reads: on the blocking pool, like every read that grows with the store.
        let reader = runtime.clone();
        let read = tokio::task::spawn_blocking(move || unwoken(&reader))
            .await
            .map_err(|e| crate::Error::Unavailable(e.to_string()))
            .and_then(|read| read);
        let lost = match read {
            Ok(lost) => lost,
            Err(e) => {
                tracing::warn!(error = %e, "the lost-wake sweep could not read the store");
                continue;
            }
        };
        for session in lost {
            tracing::info!(session_id = %session, "waking admitted input that was never woken");
            if let Err(e) = runtime.wake(&session).await {
                tracing::warn!(session_id = %session, error = %e, "lost-wake sweep");
            }
        }
    }
}

/// Sessions with pending input, no drain in this process, and an admission as newest event.
fn unwoken(runtime: &Runtime) -> Result<Vec<SessionId>> {
    let snap = runtime.snapshot()?;
    let mut lost = Vec::new();
    for session in snap.with_pending()? {
        if runtime.shared.active.contains_key(&session) || !runtime.owns(&session) {
            continue;
        }
        let Some(row) = snap.session(&session)? else {
            continue;
        };
        if row.pending == 0 || row.claim.is_some() || row.halted.is_some() {
            continue;
        }
        let newest = snap.events(&session, row.last_seq, 1)?;
        if newest
            .first()
            .is_some_and(|e| matches!(e.event, agenthost_model::Event::PromptAdmitted { .. }))
        {
            lost.push(session);
        }
    }
    Ok(lost)
}
