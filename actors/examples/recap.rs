//! Recap: the first consumer of `generate`, kept outside the core.
//!
//! When a session goes idle, ask the model to summarize where the conversation left off, without
//! touching the session. If the session moved on while the recap was being written (its last seq
//! advanced), the recap is stale and dropped. The prompt and the output cleaning belong here, not
//! in the runtime.
//!
//! Run with `cargo run -p agenthost-actors --example recap` (uses the built-in mock provider).

use std::time::Duration;

use agenthost_actors::{Config, CreateSession, Live, PromptRequest, Runtime};
use agenthost_model::SessionId;

const RECAP_PROMPT: &str = "Summarize where we left off in two sentences: what was asked, what \
     was done, and what remains. Do not call tools.";

/// Trims whitespace and a leading "Summary:" label models like to add.
fn clean(text: &str) -> String {
    let text = text.trim();
    let text = text
        .strip_prefix("Summary:")
        .or_else(|| text.strip_prefix("Recap:"))
        .unwrap_or(text);
    text.trim().to_owned()
}

/// A recap of `session`, or `None` when the session advanced while it was written.
async fn recap(runtime: &Runtime, session: &SessionId) -> agenthost_actors::Result<Option<String>> {
    let seq_before = last_seq(runtime, session)?;
    let text = runtime.generate(session, RECAP_PROMPT).await?;
    if last_seq(runtime, session)? != seq_before {
        return Ok(None);
    }
    Ok(Some(clean(&text)))
}

fn last_seq(runtime: &Runtime, session: &SessionId) -> agenthost_actors::Result<u64> {
    let row = runtime
        .snapshot()?
        .session(session)?
        .ok_or_else(|| agenthost_actors::Error::SessionNotFound(session.clone()))?;
    Ok(row.last_seq.0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("agenthost-recap-{}", std::process::id()));
    let runtime = Runtime::start(Config::new(dir.join("store.redb"))).await?;
    let session = runtime.create_session(CreateSession::default()).await?.id;
    let mut live = runtime.subscribe();
    runtime
        .prompt(PromptRequest::new(
            &session,
            "Plan a three-day trip to Lisbon.",
        ))
        .await?;
    // Recap each time the session goes idle.
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), live.recv()).await??;
        if event.0 == session && event.1 == Live::Status(agenthost_actors::Activity::Idle) {
            match recap(&runtime, &session).await? {
                Some(text) => println!("recap: {text}"),
                None => println!("recap dropped: the session moved on"),
            }
            break;
        }
    }
    runtime.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
