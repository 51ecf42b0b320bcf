//! `agenthost inspect`: an offline, read-only look into a store. Without a session it lists every
//! session, newest first; with one it dumps its row, messages, pending inputs and event log
//! (events as the API's JSON). Either way it then verifies the store session by session: each
//! log must be gap-free and replay through the model's projector into exactly what is stored
//! (`agenthost_store::verify`). `--verify` only verifies, and checks the file itself too (redb's
//! page checksums and tree structure, on a copy); `--json` prints one JSON document.
//!
//! The store is opened read-only and never changed: not upgraded, folded or recovered. A store
//! a crash left needing recovery is inspected through a recovered copy in a temporary
//! directory. Exit codes: 0 verified, 3 the verification failed, 2 a usage error (no store, an
//! unknown session), 1 the store cannot be read (a server holds it, another format, damage).

use std::path::PathBuf;

use agenthost_model::{Seq, SessionId};
use agenthost_server::wire;
use agenthost_store::{Integrity, ReadOnlyStore, Snapshot, Verified};
use anyhow::{Context, anyhow};
use clap::Parser;
use serde_json::{Value, json};

use crate::{Classify, Failure};

#[derive(Debug, Parser)]
pub struct Args {
    /// The data directory holding `store.redb`.
    #[arg(long, default_value = crate::config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Only verify: one line (or one JSON object) and the exit code.
    #[arg(long)]
    verify: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
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
    // Quietly: a panic inside redb is reported here, once, not printed with a backtrace first.
    let read = move || agenthost_store::quietly(|| inspect(&path, &args, session));
    let (text, verified) = match tokio::task::spawn_blocking(read).await {
        Ok(Ok(done)) => done?,
        // redb may panic on a page it cannot make sense of: that is a damaged file, not a bug
        // of the check.
        Ok(Err(panic)) => {
            return Err(Failure::Check(anyhow!(
                "the store file is damaged: reading it failed ({}); `agenthost inspect --verify` \
                 checks the file itself",
                agenthost_store::panic_message(&*panic)
            )));
        }
        Err(e) => return Err(Failure::Runtime(anyhow!("inspect stopped: {e}"))),
    };
    print!("{text}");
    match verified.ok() {
        true => Ok(()),
        false => Err(Failure::Check(anyhow!(
            "the store does not verify: {}",
            verified.differences.join("; ")
        ))),
    }
}

/// Opens the store read-only (through a recovered copy if a crash left it needing recovery),
/// renders what was asked, and verifies.
fn inspect(
    path: &std::path::Path,
    args: &Args,
    session: Option<SessionId>,
) -> Result<(String, Verified), Failure> {
    let scratch;
    let (store, recovered) = match ReadOnlyStore::open(path) {
        Ok(store) => (store, false),
        Err(agenthost_store::Error::NeedsRecovery) => {
            scratch = tempfile::tempdir()
                .context("cannot make a scratch directory")
                .runtime()?;
            let store = ReadOnlyStore::open_recovered_copy(path, scratch.path())
                .with_context(|| format!("cannot recover a copy of {}", path.display()))
                .runtime()?;
            (store, true)
        }
        Err(agenthost_store::Error::Locked) => {
            return Err(Failure::Runtime(
                anyhow::Error::new(agenthost_store::Error::Locked)
                    .context(format!("cannot open {}", path.display())),
            ));
        }
        Err(e) if !matches!(e, agenthost_store::Error::FormatVersion { .. }) => {
            // Unreadable as a store: what the file check finds decides whether that is damage
            // (a check failure) or something else (a missing file, a permission).
            let integrity = file_check(path)?;
            if args.verify || integrity != Integrity::Intact {
                return Err(Failure::Check(anyhow!(
                    "cannot read {} as a store ({e}); the file check says: {}",
                    path.display(),
                    describe(&integrity)
                )));
            }
            return Err(Failure::Runtime(
                anyhow::Error::new(e).context(format!("cannot open {}", path.display())),
            ));
        }
        Err(e) => {
            return Err(Failure::Runtime(
                anyhow::Error::new(e).context(format!("cannot open {}", path.display())),
            ));
        }
    };
    let snap = store.snapshot().runtime()?;
    let mut doc = serde_json::Map::new();
    let mut out = String::new();
    if recovered {
        out.push_str(
            "note: the store was not closed cleanly; this is a recovered copy (the file itself \
             was not changed)\n",
        );
    }
    doc.insert("recovered_copy".into(), json!(recovered));
    if !args.verify {
        match &session {
            None => list(&*snap, &mut out, &mut doc)?,
            Some(id) => dump(&*snap, id, &mut out, &mut doc)?,
        }
    }
    let mut verified = match agenthost_store::verify(&*snap) {
        Ok(verified) => verified,
        // Unreadable records where a store must be readable: damage, for a check.
        Err(e) if args.verify => {
            return Err(Failure::Check(anyhow!(
                "the store is damaged: reading it failed ({e}); the file check says: {}",
                describe(&file_check(path)?)
            )));
        }
        Err(e) => return Err(Failure::Runtime(e.into())),
    };
    if args.verify {
        // The file itself too, through a copy: redb's page checksums and tree structure.
        let integrity = file_check(path)?;
        let state = match integrity {
            Integrity::Intact => "intact",
            Integrity::Repairable => "repairable",
            Integrity::Damaged(_) => "damaged",
        };
        let problem = (integrity != Integrity::Intact).then(|| describe(&integrity));
        out.push_str(&format!("file: {state}\n"));
        doc.insert("file".into(), json!(state));
        verified.differences.extend(problem);
    }
    match verified.ok() {
        true => out.push_str(&format!(
            "verified: projections equal a replay of {} sessions and {} events\n",
            verified.sessions, verified.events
        )),
        false => out.push_str(&format!(
            "VERIFICATION FAILED: {}\n",
            verified.differences.join("; ")
        )),
    }
    doc.insert(
        "verification".into(),
        json!({
            "ok": verified.ok(),
            "sessions": verified.sessions,
            "events": verified.events,
            "differences": verified.differences,
        }),
    );
    if args.json {
        out = format!("{}\n", Value::Object(doc));
    }
    Ok((out, verified))
}

fn list(
    snap: &dyn Snapshot,
    out: &mut String,
    doc: &mut serde_json::Map<String, Value>,
) -> Result<(), Failure> {
    out.push_str(&format!(
        "{:<32} {:<12} {:>8} {:>7} {:>7} {:>10} {:>10}  {}\n",
        "session", "agent", "last_seq", "pending", "claimed", "input", "output", "halted"
    ));
    let mut cursor = None;
    let mut sessions = Vec::new();
    loop {
        let page = snap.sessions(cursor.clone(), 500).runtime()?;
        for row in &page {
            sessions.push(json_value(&wire::Session::from_row(
                row,
                wire::StatusType::Idle,
            )));
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
    out.push_str(&format!("{} sessions\n", sessions.len()));
    doc.insert("sessions".into(), Value::Array(sessions));
    Ok(())
}

fn dump(
    snap: &dyn Snapshot,
    id: &SessionId,
    out: &mut String,
    doc: &mut serde_json::Map<String, Value>,
) -> Result<(), Failure> {
    let row = snap
        .session(id)
        .runtime()?
        .ok_or_else(|| Failure::Usage(anyhow!("no session {id} in this store")))?;
    let session = json_value(&wire::Session::from_row(&row, wire::StatusType::Idle));
    out.push_str(&format!("session:\n  {session}\n"));
    doc.insert("session".into(), session);
    let messages: Vec<Value> = snap
        .messages(id, Seq::ZERO, usize::MAX)
        .runtime()?
        .iter()
        .map(|m| json_value(&wire::Message::from(m)))
        .collect();
    out.push_str("messages:\n");
    for m in &messages {
        out.push_str(&format!("  {m}\n"));
    }
    doc.insert("messages".into(), Value::Array(messages));
    let pending: Vec<Value> = snap
        .pending(id)
        .runtime()?
        .iter()
        .map(|p| json_value(&wire::InboxItem::from(p)))
        .collect();
    out.push_str("pending:\n");
    for p in &pending {
        out.push_str(&format!("  {p}\n"));
    }
    doc.insert("pending".into(), Value::Array(pending));
    out.push_str("events:\n");
    let mut events = Vec::new();
    for e in snap.events(id, Seq::ZERO, usize::MAX).runtime()? {
        let value = json_value(&wire::Event::from(&e));
        out.push_str(&format!(
            "  {:>6}  {:<22} {value}\n",
            e.seq.0,
            e.event.kind()
        ));
        events.push(value);
    }
    doc.insert("events".into(), Value::Array(events));
    Ok(())
}

/// redb's integrity check of the file at `path`, on a copy in a scratch directory.
fn file_check(path: &std::path::Path) -> Result<Integrity, Failure> {
    let scratch = tempfile::tempdir()
        .context("cannot make a scratch directory")
        .runtime()?;
    agenthost_store::check_integrity(path, scratch.path()).runtime()
}

/// What a file check found, for a person.
fn describe(integrity: &Integrity) -> String {
    match integrity {
        Integrity::Intact => "the file is intact".into(),
        Integrity::Repairable => {
            "the file is damaged, but redb can repair it (the next `agenthost serve` does)".into()
        }
        Integrity::Damaged(reason) => {
            format!("the file is damaged beyond repair ({reason}); restore it from a backup")
        }
    }
}

/// A wire value as JSON.
fn json_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| json!(format!("<unrenderable: {e}>")))
}
