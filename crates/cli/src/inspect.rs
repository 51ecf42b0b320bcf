//! `agenthost inspect`: an offline look into a store. Without a session it lists every session,
//! newest first; with one it dumps its row, messages, pending inputs and event log (events as
//! the API's JSON). Either way it then verifies the store: the projections must equal a replay
//! of every event log through the model's projector (`Projections::replay`).
//!
//! Offline means the server must not be running on the same data directory (redb takes a lock
//! on the file); inspect never creates a store.

use std::path::PathBuf;

use agenthost_model::{Projections, Seq, SessionId};
use agenthost_server::wire;
use agenthost_store::{RedbStore, Snapshot, Store};
use anyhow::{Context, anyhow};
use clap::Parser;

use crate::{Classify, Failure};

#[derive(Debug, Parser)]
pub struct Args {
    /// The data directory holding `store.redb`.
    #[arg(long, default_value = crate::config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// A session to dump (`ses_…`).
    session: Option<String>,
}

pub async fn run(args: Args) -> Result<(), Failure> {
    let path = crate::store_path(&args.data_dir);
    if !path.is_file() {
        return Err(Failure::Usage(anyhow!(
            "no store at {} (is --data-dir right?)",
            path.display()
        )));
    }
    let session = args
        .session
        .as_deref()
        .map(SessionId::parse)
        .transpose()
        .usage()?;
    let store = RedbStore::open(agenthost_store::Config::new(&path))
        .with_context(|| {
            format!(
                "cannot open {} (a server running on this data directory holds it)",
                path.display()
            )
        })
        .runtime()?;
    let result = tokio::task::spawn_blocking(move || {
        let out = report(&store, session.as_ref());
        store.close();
        out
    })
    .await
    .context("inspect panicked")
    .runtime()?;
    let (text, verified) = result?;
    print!("{text}");
    verified.map_err(Failure::Check)
}

/// The report, and the verification's verdict.
fn report(
    store: &RedbStore,
    session: Option<&SessionId>,
) -> Result<(String, Result<(), anyhow::Error>), Failure> {
    let snap = store.snapshot().runtime()?;
    let mut out = String::new();
    match session {
        None => list(&*snap, &mut out)?,
        Some(id) => dump(&*snap, id, &mut out)?,
    }
    let verdict = verify(&*snap).runtime()?;
    match &verdict {
        Ok(summary) => out.push_str(&format!("verified: {summary}\n")),
        Err(e) => out.push_str(&format!("VERIFICATION FAILED: {e:#}\n")),
    }
    Ok((out, verdict.map(|_| ())))
}

fn list(snap: &dyn Snapshot, out: &mut String) -> Result<(), Failure> {
    out.push_str(&format!(
        "{:<32} {:<12} {:>8} {:>7} {:>7} {:>10} {:>10}  {}\n",
        "session", "agent", "last_seq", "pending", "claimed", "input", "output", "halted"
    ));
    let mut cursor = None;
    let mut count = 0;
    loop {
        let page = snap.sessions(cursor.clone(), 500).runtime()?;
        for row in &page {
            count += 1;
            out.push_str(&format!(
                "{:<32} {:<12} {:>8} {:>7} {:>7} {:>10} {:>10}  {}\n",
                row.id.to_string(),
                row.agent,
                row.last_seq.0,
                row.pending,
                if row.claim.is_some() { "yes" } else { "no" },
                row.usage.input + row.usage.cache_read + row.usage.cache_write,
                row.usage.output,
                row.halted.as_deref().unwrap_or("")
            ));
        }
        match page.last() {
            Some(last) if page.len() == 500 => cursor = Some((last.created, last.id.clone())),
            _ => break,
        }
    }
    out.push_str(&format!("{count} sessions\n"));
    Ok(())
}

fn dump(snap: &dyn Snapshot, id: &SessionId, out: &mut String) -> Result<(), Failure> {
    let row = snap
        .session(id)
        .runtime()?
        .ok_or_else(|| Failure::Usage(anyhow!("no session {id} in this store")))?;
    out.push_str("session:\n");
    out.push_str(&format!(
        "  {}\n",
        json(&wire::Session::from_row(&row, false))
    ));
    out.push_str("messages:\n");
    for m in snap.messages(id, Seq::ZERO, usize::MAX).runtime()? {
        out.push_str(&format!("  {}\n", json(&wire::Message::from(&m))));
    }
    out.push_str("pending:\n");
    for p in snap.pending(id).runtime()? {
        out.push_str(&format!("  {}\n", json(&wire::InboxItem::from(&p))));
    }
    out.push_str("events:\n");
    for e in snap.events(id, Seq::ZERO, usize::MAX).runtime()? {
        out.push_str(&format!(
            "  {:>6}  {:<22} {}\n",
            e.seq.0,
            e.event.kind(),
            json(&wire::Event::from(&e))
        ));
    }
    Ok(())
}

/// Replays every log and compares with the stored projections.
fn verify(snap: &dyn Snapshot) -> Result<Result<String, anyhow::Error>, agenthost_store::Error> {
    let logs = snap.logs()?;
    let stored = snap.projections()?;
    let events: usize = logs.values().map(Vec::len).sum();
    let replayed = match Projections::replay(logs.iter().map(|(id, log)| (id, log.as_slice()))) {
        Ok(p) => p,
        Err(v) => return Ok(Err(anyhow!("the event log does not replay: {v}"))),
    };
    if replayed == stored {
        return Ok(Ok(format!(
            "projections equal a replay of {} sessions and {events} events",
            logs.len()
        )));
    }
    let mut differences = Vec::new();
    let mut diff = |what: &str, a: usize, b: usize| {
        if a != b {
            differences.push(format!("{what}: {a} stored, {b} replayed"));
        }
    };
    diff("sessions", stored.sessions.len(), replayed.sessions.len());
    diff("messages", stored.messages.len(), replayed.messages.len());
    diff("inbox rows", stored.inbox.len(), replayed.inbox.len());
    diff("index entries", stored.index.len(), replayed.index.len());
    diff(
        "instruction states",
        stored.instructions.len(),
        replayed.instructions.len(),
    );
    for (id, row) in &stored.sessions {
        if replayed.sessions.get(id) != Some(row) {
            differences.push(format!("session row {id} differs"));
        }
    }
    for (key, message) in &stored.messages {
        if replayed.messages.get(key) != Some(message) {
            differences.push(format!("message {} of {} differs", key.1, key.0));
        }
    }
    if differences.is_empty() {
        differences.push("index, inbox or instruction rows differ".into());
    }
    Ok(Err(anyhow!(
        "projections differ from a replay: {}",
        differences.join("; ")
    )))
}

/// A wire value as one JSON line.
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("<unrenderable: {e}>"))
}
