//! Verification through the [`Snapshot`] trait alone, so it checks any backend the same way:
//! session by session, the log must be gap-free and replay through the model's projector into
//! exactly what the snapshot reads back (row, messages, pending inputs, instruction state,
//! schedules and every index entry of the session). Memory follows the largest session, not the
//! store.

use agenthost_model::{Projections, Seq, SessionId, Stored};

use crate::error::Result;
use crate::snapshot::Snapshot;

/// Sessions read per page, and events per read.
const PAGE: usize = 512;

/// What a verification saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    pub sessions: usize,
    pub events: usize,
    /// What differs, one line each; empty when the store verified.
    pub differences: Vec<String>,
}

impl Verified {
    pub fn ok(&self) -> bool {
        self.differences.is_empty()
    }
}

/// Verifies every session of `snap`. `Err` only when the store cannot be read; what differs is
/// in [`Verified::differences`].
pub fn verify(snap: &dyn Snapshot) -> Result<Verified> {
    let mut verified = Verified::default();
    let mut cursor = None;
    loop {
        let page = snap.sessions(cursor.clone(), PAGE)?;
        for row in &page {
            verified.sessions += 1;
            verified.events += session(snap, &row.id, &mut verified.differences)?;
        }
        match page.last() {
            Some(last) if page.len() == PAGE => cursor = Some((last.created, last.id.clone())),
            _ => return Ok(verified),
        }
    }
}

/// Verifies one session; returns its event count.
pub fn session(
    snap: &dyn Snapshot,
    id: &SessionId,
    differences: &mut Vec<String>,
) -> Result<usize> {
    let log = log(snap, id)?;
    let mut differ = |what: String| differences.push(format!("{id}: {what}"));
    if let Some((n, stored)) = log
        .iter()
        .enumerate()
        .find(|(n, stored)| stored.seq.0 != *n as u64)
    {
        differ(format!(
            "event {n} has seq {}: the log has a gap",
            stored.seq.0
        ));
        return Ok(log.len());
    }
    let replayed = match Projections::replay([(id, log.as_slice())]) {
        Ok(replayed) => replayed,
        Err(violation) => {
            differ(format!("the log does not replay: {violation}"));
            return Ok(log.len());
        }
    };
    if snap.session(id)?.as_ref() != replayed.sessions.get(id) {
        differ("the session row differs from a replay".into());
    }
    let messages = snap.messages(id, Seq::ZERO, usize::MAX)?;
    if !messages.iter().eq(replayed.messages.values()) {
        differ(format!(
            "messages differ from a replay ({} stored, {} replayed)",
            messages.len(),
            replayed.messages.len()
        ));
    }
    let pending = snap.pending(id)?;
    if !pending.iter().eq(replayed.inbox.values()) {
        differ(format!(
            "pending inputs differ from a replay ({} stored, {} replayed)",
            pending.len(),
            replayed.inbox.len()
        ));
    }
    let instructions = replayed.instructions.get(id).cloned().unwrap_or_default();
    if snap.instructions(id)? != instructions {
        differ("the instruction state differs from a replay".into());
    }
    let schedules = snap.schedules(id)?;
    if !schedules.iter().eq(replayed.schedules.values()) {
        differ(format!(
            "schedules differ from a replay ({} stored, {} replayed)",
            schedules.len(),
            replayed.schedules.len()
        ));
    }
    for (message, entry) in &replayed.index {
        if snap.index(message)?.as_ref() != Some(entry) {
            differ(format!(
                "the index entry of {message} differs from a replay"
            ));
        }
    }
    Ok(log.len())
}

/// A session's whole log, read a page at a time.
fn log(snap: &dyn Snapshot, id: &SessionId) -> Result<Vec<Stored>> {
    let mut log: Vec<Stored> = Vec::new();
    loop {
        let from = log.last().map_or(Seq::ZERO, |last| Seq(last.seq.0 + 1));
        let page = snap.events(id, from, PAGE)?;
        let full = page.len() == PAGE;
        log.extend(page);
        if !full {
            return Ok(log);
        }
    }
}
