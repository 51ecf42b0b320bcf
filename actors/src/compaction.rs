//! Compaction: replace the older part of an over-budget active history with a
//! structured summary, keeping recent messages verbatim. The full transcript stays durable; only
//! the active history (what the model sees) shrinks.
//!
//! Durable shape: `CompactionStarted` → exactly one summary request → `CompactionEnded`
//! (summary, `kept_from`, usage) or `CompactionFailed`. With nothing older than the kept part
//! there is nothing to compact: [`Error::NothingToCompact`], and no provider call.
//!
//! A manual compaction is an execution of its own: it takes the claim with `CompactionStarted`
//! and releases it with the compaction's end, so a compaction a crash or a shutdown cut is found
//! by recovery and settled (ARCHITECTURE.md, "Recovery: what a session owes"). An automatic one
//! runs inside a step's drain, under that drain's claim.

use agenthost_llm as llm;
use agenthost_model::history::{History, Mode};
use agenthost_model::{Event, Message, Seq};

use crate::drain::Drain;
use crate::error::{Error, Result};
use crate::hooks::Purpose;
use crate::mint;
use crate::prepare::{Inputs, convert, estimate, prepare};

/// The request that asks for the summary.
pub const SUMMARY_PROMPT: &str = "Summarize the conversation above for a continuation of this \
     session by someone who cannot see it. Use these sections: Goal; Decisions and facts \
     established; Work done (including tool results that matter); Open questions; Next steps. Be \
     specific (names, numbers, paths) and brief. Reply with the summary only.";

/// The request's size limit before compaction kicks in: the context window minus a reserve for
/// the answer (the model's output limit, or 20 000 tokens when unknown), and never more than half
/// the window, so a model whose output limit fills its window does not compact every step.
pub(crate) fn threshold(context_window: u32, max_output: Option<u32>) -> u64 {
    let window = u64::from(context_window);
    let reserve = u64::from(max_output.unwrap_or(20_000)).min(window / 2);
    window - reserve
}

/// Compacts the session's active history. Returns the new `kept_from`.
pub(crate) async fn compact(d: &Drain, auto: bool) -> Result<Seq> {
    let shared = &d.shared;
    // The history is read from the store: what the drain submitted (a promotion riding with the
    // step's start, say) must be in it.
    d.flush().await?;
    let (row, history) = {
        let snap = shared.store.snapshot()?;
        snap.history(&d.session, Mode::All)?
            .ok_or_else(|| Error::SessionNotFound(d.session.clone()))?
    };
    if !auto && row.claim.is_some() {
        // Work a stopped process left comes first: the recovery drain settles it.
        return Err(Error::Unavailable(format!(
            "session {} has unfinished work from a previous run; compact it once that resumed",
            d.session
        )));
    }
    let Some(split) = split(&history.messages, shared.compaction.keep_tokens) else {
        return Err(Error::NothingToCompact);
    };
    let kept_from = history.messages[split].seq();
    let older = History {
        summary: history.summary.clone(),
        messages: history.messages[..split].to_vec(),
    };
    let inputs = Inputs::of(shared, &row, &older, 1, Purpose::Compaction);
    let prepared = prepare(inputs, Some(SUMMARY_PROMPT))?;
    let id = mint::message_id();
    let started = Event::CompactionStarted {
        id: id.clone(),
        auto,
    };
    // A manual compaction's end releases the claim its start took.
    let (opening, closing) = match auto {
        true => (None, None),
        false => (
            Some(Event::ExecutionStarted { forced: false }),
            Some(Event::ExecutionSucceeded),
        ),
    };
    d.append(opening.into_iter().chain([started]).collect())
        .await?;
    // The summary call takes a stream permit of its own (the step holds none while it compacts),
    // and an interrupt or a shutdown ends the wait for it and the call itself.
    let call = async {
        let _permit = shared
            .streams
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::ShuttingDown)?;
        Ok::<_, Error>(prepared.provider.generate(prepared.request).await)
    };
    let response = tokio::select! {
        biased;
        _ = d.cancel.cancelled() => None,
        response = call => Some(response?),
    };
    let Some(response) = response else {
        let failed = Event::CompactionFailed {
            id,
            error: "interrupted".into(),
        };
        d.append([failed].into_iter().chain(closing).collect())
            .await?;
        return Err(Error::Interrupted);
    };
    match response {
        Ok(response) if !response.text.trim().is_empty() => {
            let usage = &response.usage;
            let ended = Event::CompactionEnded {
                id,
                summary: response.text.trim().to_owned(),
                kept_from,
                usage: crate::step::cost(usage, &prepared.model.price),
            };
            d.append([ended].into_iter().chain(closing).collect())
                .await?;
            Ok(kept_from)
        }
        Ok(_) => {
            let error = "the summary came back empty".to_owned();
            let failed = Event::CompactionFailed {
                id,
                error: error.clone(),
            };
            d.append([failed].into_iter().chain(closing).collect())
                .await?;
            Err(Error::Provider(llm::Error::invalid_output(error)))
        }
        Err(error) => {
            let failed = Event::CompactionFailed {
                id,
                error: error.to_string(),
            };
            d.append([failed].into_iter().chain(closing).collect())
                .await?;
            Err(Error::Provider(error))
        }
    }
}

/// Where the verbatim part starts: walking back from the newest message until about
/// `keep_tokens` are kept, then forward to a user message so the kept part opens a turn. `None`
/// when that leaves nothing older to summarize.
fn split(messages: &[Message], keep_tokens: u64) -> Option<usize> {
    let mut kept = 0;
    let mut at = messages.len();
    while at > 0 {
        let size = tokens(&messages[at - 1]);
        if kept + size > keep_tokens {
            break;
        }
        kept += size;
        at -= 1;
    }
    let start = (at..messages.len()).find(|&i| matches!(messages[i], Message::User { .. }))?;
    (start > 0).then_some(start)
}

fn tokens(message: &Message) -> u64 {
    let history = History {
        summary: None,
        messages: vec![message.clone()],
    };
    let mut request = llm::Request::new("");
    request.messages = convert(&history);
    estimate(&request)
}
