//! The boot sweep: at start, find every session a previous process left with a claim or with
//! pending input that asked for a wake, and wake it, with bounded concurrency (ARCHITECTURE.md,
//! "Recovery: what a session owes"). Input admitted with `resume: false` asked for none: it
//! waits for a wake or a resume that comes for another reason, restart or not.
//!
//! The sweep only wakes. Counting the attempt, giving up past `max_attempts`, settling leftovers
//! and the one note that the server restarted all happen in the session's own drain, inside its
//! actor, so a sweep can never interleave with a drain of the same session.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use agenthost_model::{Seq, SessionId};
use futures::StreamExt;

use crate::config::{Recovery, RecoveryMode};
use crate::error::Result;
use crate::runtime::Runtime;

/// How long the sweep waits for one recovered session before it frees its slot for the next: a
/// session that stays busy longer keeps running, it only stops holding up the sweep.
const RECOVERY_WAIT: Duration = Duration::from_secs(60);

/// Sweeps the sessions of partitions this node just took over. `listing` is released once the
/// sessions owed recovery are known, each of them until it is recovered: until then `wait_idle`
/// on them waits (a session owed recovery is not idle).
pub(crate) async fn sweep(runtime: &Runtime, config: &Recovery, listing: Listing) {
    let found = owed(runtime).await;
    resume(runtime, config, found, Some(listing)).await;
}

/// What the sessions this node owns owe recovery: those holding a claim or pending input that
/// asked for a wake. The read also seeds the in-memory counts of pending inputs and claims,
/// whatever the mode. The boot sweep reads this before its runtime admits anything, so it finds
/// exactly what a previous process left and its seeds are never older than a live commit.
pub(crate) async fn owed(runtime: &Runtime) -> BTreeSet<SessionId> {
    // Store reads, one per pending session: on the blocking pool.
    match blocking(runtime, candidates).await {
        Ok(found) => found,
        Err(e) => {
            tracing::error!(error = %e, "recovery sweep could not read the store");
            BTreeSet::new()
        }
    }
}

/// Wakes each session `found` owed recovery, with bounded concurrency (`resume` mode), or
/// reports them (`pause`). `listing`, a takeover's, is released once they are marked owed.
pub(crate) async fn resume(
    runtime: &Runtime,
    config: &Recovery,
    found: BTreeSet<SessionId>,
    listing: Option<Listing>,
) {
    if found.is_empty() || config.mode == RecoveryMode::Off {
        return;
    }
    if config.mode == RecoveryMode::Pause {
        for session in &found {
            tracing::warn!(session_id = %session, "paused: left running by a previous process; resume it explicitly");
        }
        return;
    }
    let sweeps = &runtime.sweeps;
    sweeps.owe(&found);
    drop(listing);
    tracing::info!(sessions = found.len(), "recovering sessions");
    futures::stream::iter(found)
        .for_each_concurrent(config.concurrency.max(1), |session| async move {
            if let Err(e) = recover(runtime, &session).await {
                tracing::error!(session_id = %session, error = %e, "recovery failed");
            }
            sweeps.recovered(&session);
        })
        .await;
}

/// Runs `read` of the runtime's store on the blocking pool: a sweep's reads grow with the store
/// (and on PostgreSQL are round trips), so they never hold a runtime thread.
async fn blocking<T: Send + 'static>(
    runtime: &Runtime,
    read: fn(&Runtime) -> Result<T>,
) -> Result<T> {
    let reader = runtime.clone();
    tokio::task::spawn_blocking(move || read(&reader))
        .await
        .map_err(|e| crate::Error::Unavailable(e.to_string()))?
}

/// What recovery sweeps still owe: sessions listed and not yet woken and settled, and takeover
/// sweeps that have not listed theirs yet.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sweeps {
    inner: std::sync::Arc<SweepsInner>,
}

#[derive(Debug, Default)]
struct SweepsInner {
    /// A std mutex: held for a set update, never across an await.
    state: std::sync::Mutex<Owed>,
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Owed {
    listing: usize,
    sessions: BTreeSet<SessionId>,
    /// The ownership version whose change `follow` has handled (a takeover's sweep is listing
    /// from then on).
    handled: u64,
}

/// A takeover sweep that has not listed its sessions yet; released when dropped.
#[derive(Debug)]
pub(crate) struct Listing(Sweeps);

impl Drop for Listing {
    fn drop(&mut self) {
        self.0.update(|owed| owed.listing -= 1);
    }
}

impl Sweeps {
    fn update(&self, f: impl FnOnce(&mut Owed)) {
        f(&mut self.inner.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.inner.changed.notify_waiters();
    }

    /// A takeover sweep starts: until it has listed its sessions, any session may be owed.
    pub(crate) fn listing(&self) -> Listing {
        self.update(|owed| owed.listing += 1);
        Listing(self.clone())
    }

    fn owe(&self, sessions: &BTreeSet<SessionId>) {
        self.update(|owed| owed.sessions.extend(sessions.iter().cloned()));
    }

    fn recovered(&self, session: &SessionId) {
        self.update(|owed| {
            owed.sessions.remove(session);
        });
    }

    /// `follow` has handled the ownership change that made `version`.
    pub(crate) fn handled(&self, version: u64) {
        self.update(|owed| owed.handled = owed.handled.max(version));
    }

    /// Whether a sweep may still owe `session` recovery: one is listing, it is listed, or the
    /// partitions changed (at `version`) and `follow` has not handled it yet.
    fn owes(&self, session: &SessionId, version: u64) -> bool {
        let owed = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        owed.listing > 0 || owed.sessions.contains(session) || owed.handled < version
    }

    /// Waits until no sweep owes `session` recovery; `false` when `timeout` passed first.
    /// `version` reads the ownership's version (0 on the embedded store).
    pub(crate) async fn settled(
        &self,
        session: &SessionId,
        version: impl Fn() -> u64,
        timeout: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the check, so a change in between is not missed.
            let changed = self.inner.changed.notified();
            if !self.owes(session, version()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }
}

/// Sessions this node owns that hold a claim or pending input that asked for a wake. What it
/// reads of the sessions this node owns seeds the in-memory counts `/metrics` shows.
fn candidates(runtime: &Runtime) -> Result<BTreeSet<SessionId>> {
    let snap = runtime.snapshot()?;
    let claimed: BTreeSet<SessionId> = snap.claimed()?.into_iter().collect();
    let mut found = claimed.clone();
    let held = &runtime.shared.metrics.held;
    for row in snap.pending_rows()? {
        let session = row.id;
        if !runtime.owns(&session) {
            continue;
        }
        held.seed(&session, row.pending, claimed.contains(&session));
        if !found.contains(&session) && asked_for_a_wake(&*snap, &session)? {
            found.insert(session);
        }
    }
    found.retain(|s| runtime.owns(s));
    for session in &found {
        if claimed.contains(session) {
            held.seed_claim(session);
        }
    }
    Ok(found)
}

/// Whether any pending input of `session` was admitted asking for a wake.
fn asked_for_a_wake(snap: &dyn agenthost_store::Snapshot, session: &SessionId) -> Result<bool> {
    Ok(snap.pending(session)?.iter().any(|input| input.wake))
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
        let sweeps = &runtime.sweeps;
        match change {
            Ok(Lease::Lost(_, version)) => {
                runtime.stop_unowned().await;
                sweeps.handled(version);
            }
            Ok(Lease::Gained(parts, version)) => {
                tracing::info!(partitions = ?parts, "recovering the sessions of taken partitions");
                let listing = sweeps.listing();
                sweeps.handled(version);
                let (runtime, config) = (runtime.clone(), runtime.shared.recovery.clone());
                tokio::spawn(async move {
                    // Their schedules are this node's to fire now.
                    crate::runtime::schedules::load(&runtime).await;
                    sweep(&runtime, &config, listing).await
                });
            }
            // Missed changes: make the actors match what is held, and sweep what may be new.
            Err(RecvError::Lagged(_)) => {
                let version = runtime.ownership_version();
                runtime.stop_unowned().await;
                let listing = sweeps.listing();
                sweeps.handled(version);
                let (runtime, config) = (runtime.clone(), runtime.shared.recovery.clone());
                tokio::spawn(async move {
                    crate::runtime::schedules::load(&runtime).await;
                    sweep(&runtime, &config, listing).await
                });
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

/// The lost-wake sweep: every `limits.wake_sweep`, wakes each session whose newest event has
/// been the same admission since the previous sweep, with no drain of this process running it,
/// and with pending input that asked for a wake (a deferred input, `resume: false`, is left
/// alone: it was never owed a wake).
/// That is exactly an input admitted and never woken (its caller went away between the two); an
/// admission whose wake is merely on its way (queued behind others, under load) is picked up by
/// that wake before the next sweep, so it is not woken twice. A session that ran a drain since
/// its last admission is not woken again, so input a drain left pending on purpose (an
/// instruction source with no value yet, a halted session) is not retried in a loop. Ends with
/// the runtime.
pub(crate) async fn watch(runtime: &Runtime) {
    let every = runtime.shared.limits.wake_sweep;
    if every.is_zero() {
        return;
    }
    let mut unwoken = Unwoken::default();
    loop {
        tokio::select! {
            _ = runtime.shared.stopping.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // Store reads: on the blocking pool, like every read that grows with the store.
        let reader = runtime.clone();
        let swept = tokio::task::spawn_blocking(move || {
            let owed = lost_wakes(&reader, &mut unwoken);
            (unwoken, owed)
        })
        .await;
        let owed = match swept {
            Ok((kept, Ok(owed))) => {
                unwoken = kept;
                owed
            }
            Ok((kept, Err(e))) => {
                unwoken = kept;
                tracing::warn!(error = %e, "the lost-wake sweep could not read the store");
                continue;
            }
            Err(e) => {
                unwoken = Unwoken::default();
                tracing::warn!(error = %e, "the lost-wake sweep could not read the store");
                continue;
            }
        };
        for session in owed {
            // Waiting in line for a place: the registry holds its wake already.
            if runtime.shared.parked.contains_key(&session) {
                continue;
            }
            tracing::info!(session_id = %session, "waking admitted input that was never woken");
            if let Err(e) = runtime.wake(&session).await {
                tracing::warn!(session_id = %session, error = %e, "lost-wake sweep");
            }
        }
    }
}

/// Why a session may be owed a wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// It has pending input, no claim and no drain here: owed one if its newest event is an
    /// admission that asked for a wake (read only once the session is due, see [`Unwoken`]).
    Input,
    /// Its newest event is an approval decided since it began to wait.
    Decision,
}

/// Which sessions the lost-wake sweep wakes: those found with the same newest event (by its seq)
/// in two sweeps in a row, and owed a wake. The same newest event means the same log, so what
/// is read to tell whether a session is owed a wake is read only for a session due, not for
/// every session with pending input at every sweep. Decisions as data: the sweep's reads go in,
/// sessions to check come out.
#[derive(Debug, Default)]
struct Unwoken {
    /// What the previous sweep found: each session and the seq of its newest event.
    seen: HashMap<SessionId, Seq>,
}

impl Unwoken {
    fn due(&mut self, found: Vec<(SessionId, Seq, Wake)>) -> Vec<(SessionId, Wake)> {
        let due = found
            .iter()
            .filter(|(session, seq, _)| self.seen.get(session) == Some(seq))
            .map(|(session, _, wake)| (session.clone(), *wake))
            .collect();
        self.seen = found
            .into_iter()
            .map(|(session, seq, _)| (session, seq))
            .collect();
        due
    }
}

/// One lost-wake sweep's reads, in one snapshot: the sessions found go into `unwoken`, and the
/// sessions due that are owed a wake come out.
fn lost_wakes(runtime: &Runtime, unwoken: &mut Unwoken) -> Result<Vec<SessionId>> {
    let snap = runtime.snapshot()?;
    let mut found = waiting(runtime, &*snap)?;
    found.extend(decided_last(runtime, &*snap)?);
    let mut owed = Vec::new();
    for (session, why) in unwoken.due(found) {
        // Waiting in line for a place: the registry holds its wake already.
        if runtime.shared.parked.contains_key(&session) {
            continue;
        }
        if why == Wake::Decision || admitted_last(&*snap, &session)? {
            owed.push(session);
        }
    }
    Ok(owed)
}

/// Sessions with pending input, no claim, not halted and no drain in this process, with the
/// seq of their newest event: one read of each session's row.
fn waiting(
    runtime: &Runtime,
    snap: &dyn agenthost_store::Snapshot,
) -> Result<Vec<(SessionId, Seq, Wake)>> {
    let mut found = Vec::new();
    for row in snap.pending_rows()? {
        let session = row.id;
        if runtime.shared.active.contains_key(&session) || !runtime.owns(&session) {
            continue;
        }
        if row.pending == 0 || row.claim.is_some() || row.halted.is_some() {
            continue;
        }
        found.push((session, row.last_seq, Wake::Input));
    }
    Ok(found)
}

/// Whether the newest event of `session` is an admission (or a schedule's firing that admitted
/// in the same commit), with pending input that asked for a wake.
fn admitted_last(snap: &dyn agenthost_store::Snapshot, session: &SessionId) -> Result<bool> {
    let Some(row) = snap.session(session)? else {
        return Ok(false);
    };
    let newest = snap.events(session, row.last_seq, 1)?;
    let admitted = newest.first().is_some_and(|e| {
        matches!(
            e.event,
            agenthost_model::Event::PromptAdmitted { .. }
                | agenthost_model::Event::ScheduleFired { admitted: true, .. }
        )
    });
    Ok(admitted && asked_for_a_wake(snap, session)?)
}

/// Sessions waiting for approvals here, with no drain in this process, whose newest event is a
/// decision made since the session began to wait, with that event's seq: a decision whose wake
/// never ran (its caller went away between the two) is woken like an admission's.
fn decided_last(
    runtime: &Runtime,
    snap: &dyn agenthost_store::Snapshot,
) -> Result<Vec<(SessionId, Seq, Wake)>> {
    let mut found = Vec::new();
    for (session, since) in runtime.shared.deadlines.sessions() {
        if runtime.shared.active.contains_key(&session) || !runtime.owns(&session) {
            continue;
        }
        let Some(row) = snap.session(&session)? else {
            continue;
        };
        let newest = snap.events(&session, row.last_seq, 1)?;
        if newest.first().is_some_and(|e| {
            e.time >= since && matches!(e.event, agenthost_model::Event::ApprovalDecided { .. })
        }) {
            found.push((session, row.last_seq, Wake::Decision));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An admission is woken by the sweep only once it has been the newest event for a whole
    /// sweep interval: one whose wake is on its way is left to that wake.
    #[test]
    fn the_lost_wake_sweep_wakes_an_admission_only_when_two_sweeps_found_it() {
        let a = SessionId::parse("ses_a").expect("id");
        let b = SessionId::parse("ses_b").expect("id");
        let mut unwoken = Unwoken::default();
        let input = Wake::Input;
        assert!(
            unwoken.due(vec![(a.clone(), Seq(3), input)]).is_empty(),
            "just admitted"
        );
        assert_eq!(
            unwoken.due(vec![
                (a.clone(), Seq(3), input),
                (b.clone(), Seq(7), Wake::Decision)
            ]),
            vec![(a.clone(), input)],
            "still unwoken a sweep later"
        );
        // `a` admitted again meanwhile (a newer seq): its wake may be on its way.
        assert_eq!(
            unwoken.due(vec![
                (a.clone(), Seq(5), input),
                (b.clone(), Seq(7), Wake::Decision)
            ]),
            vec![(b.clone(), Wake::Decision)]
        );
        // A session missing from one sweep (a drain picked it up) starts over.
        assert!(unwoken.due(vec![]).is_empty());
        assert!(unwoken.due(vec![(b.clone(), Seq(9), input)]).is_empty());
    }

    /// A session is not settled while a takeover's sweep is listing, while it is listed and not
    /// yet recovered, or while a partition change has not been handled.
    #[tokio::test(start_paused = true)]
    async fn wait_idle_waits_for_what_a_sweep_owes() {
        let sweeps = Sweeps::default();
        let s = SessionId::parse("ses_owed").expect("id");
        let other = SessionId::parse("ses_other").expect("id");
        let short = Duration::from_millis(10);
        assert!(sweeps.settled(&s, || 0, short).await);

        // A partition change not handled yet: anything may be owed.
        assert!(!sweeps.settled(&s, || 1, short).await);
        let listing = sweeps.listing();
        sweeps.handled(1);
        assert!(!sweeps.settled(&s, || 1, short).await, "still listing");

        // Listed: only the listed session waits, until it is recovered.
        sweeps.owe(&BTreeSet::from([s.clone()]));
        drop(listing);
        assert!(sweeps.settled(&other, || 1, short).await);
        let waiter = {
            let sweeps = sweeps.clone();
            let s = s.clone();
            tokio::spawn(async move { sweeps.settled(&s, || 1, Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        sweeps.recovered(&s);
        assert!(waiter.await.expect("waiter"), "woken when recovered");
    }
}
