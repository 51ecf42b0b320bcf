//! Compaction: replace the older part of an over-budget active history with a
//! structured summary, keeping recent messages verbatim. The full transcript stays durable; only
//! the active history (what the model sees) shrinks.
//!
//! Durable shape: `CompactionStarted` → the summary call → `CompactionEnded` (summary,
//! `kept_from`, usage) or `CompactionFailed`. With nothing older than the kept part there is
//! nothing to compact: [`Error::NothingToCompact`], and no provider call.
//!
//! The kept window starts at any message boundary (so a long tool loop after one prompt
//! compacts too), and the latest user request stays visible: in the kept window, or quoted in
//! the summary by the runtime. The summary call sends older history serialized as text (tool
//! output cut, the oldest dropped with a marker to fit the model), follows the step's retry
//! policy, shrinks its request on a context overflow, and a reply that breaks the template gets
//! one reminder, after which it is kept marked as off the template (`summary`); only a reply
//! with no text fails the compaction. Its text streams live as `summary` deltas of the
//! compaction message.
//!
//! A manual compaction is an execution of its own: it takes the claim with `CompactionStarted`
//! and releases it with the compaction's end, so a compaction a crash or a shutdown cut is found
//! by recovery and settled (ARCHITECTURE.md, "Recovery: what a session owes"). An automatic one
//! runs inside a step's drain, under that drain's claim.

use agenthost_llm as llm;
use agenthost_model::history::{History, Mode};
use agenthost_model::{Event, Message, MessageId, Seq, SessionRow, Usage};
use futures::StreamExt as _;

use crate::bus::{DeltaKind, Live};
use crate::drain::Drain;
use crate::error::{Error, Result};
use crate::hooks::Purpose;
use crate::mint;
use crate::prepare::{Inputs, Prepared, convert, estimate, prepare};
use crate::summary;

/// Times a summary request is halved after the provider said it overflows.
const SHRINKS: u32 = 3;

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
    let (row, history) = d
        .read(|snap, session| {
            snap.history(session, Mode::All)?
                .ok_or_else(|| Error::SessionNotFound(session.clone()))
        })
        .await?;
    if !auto && row.claim.is_some() {
        // Work a stopped process left comes first: the recovery drain settles it. An exchange
        // waiting for approvals keeps them intact: it is compacted once it goes on.
        return Err(Error::Busy(format!(
            "session {} has an unfinished exchange (work from a previous run, or calls waiting \
             for approval); compact it once that is done",
            d.session
        )));
    }
    let (_, model, _) = shared.catalog.resolve(&row.agent, row.model.as_deref())?;
    let limit = threshold(model.context_window, model.max_output);
    // What is kept must leave room to grow, or the next step compacts again at once.
    let keep = shared.compaction.keep_tokens.min(limit / 2);
    let messages = &history.messages;
    let Some(split) = summary::split(messages.len(), keep, |i| tokens(&messages[i])) else {
        return Err(Error::NothingToCompact);
    };
    let (older, kept) = history.messages.split_at(split);
    let kept_from = kept[0].seq();
    let quote = match summary::latest_request(kept) {
        Some(_) => None,
        None => summary::latest_request(older)
            .map(str::to_owned)
            .or_else(|| history.summary.as_deref().and_then(summary::quoted_request)),
    };
    // The request's own overhead (system, tool definitions) comes off the model's budget; a
    // quarter of the rest stays free for the estimate's error and a reminder round.
    let tools = shared.tools.current();
    let overhead = prepare(
        Inputs::of(
            shared,
            &tools,
            &row,
            &History::default(),
            1,
            Purpose::Compaction,
        ),
        Some(""),
    )?
    .estimated_tokens;
    let budget =
        usize::try_from(limit.saturating_sub(overhead).saturating_mul(3)).unwrap_or(usize::MAX);
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
    let ask = Ask {
        row: &row,
        previous: history.summary.as_deref(),
        older,
        budget,
    };
    let mut spent = llm::Usage::default();
    let result = summarize(d, &id, &ask, &mut spent).await;
    let usage = crate::drain::step::cost(&spent, &model.price);
    d.shared.metrics.spent(&row.agent, &model.model, &usage);
    let mut events = match &result {
        Ok(reply) => vec![Event::CompactionEnded {
            id,
            summary: summary::stored(reply, quote.as_deref()),
            kept_from,
            usage,
        }],
        Err(error) => {
            let error = match error {
                Error::Interrupted => "interrupted".to_owned(),
                other => other.to_string(),
            };
            // Calls that did not end in a summary still cost what they cost.
            let spent = (usage != Usage::default()).then_some(Event::UsageRecorded { usage });
            [Event::CompactionFailed { id, error }]
                .into_iter()
                .chain(spent)
                .collect()
        }
    };
    events.extend(closing);
    d.append(events).await?;
    result.map(|_| kept_from)
}

/// What a summary request is built from.
struct Ask<'a> {
    row: &'a SessionRow,
    previous: Option<&'a str>,
    older: &'a [Message],
    /// Bytes the request text may take.
    budget: usize,
}

/// Asks for the summary until a reply follows the template: retryable failures back off as a
/// step's do, an overflow halves the request, a reply off the template gets one reminder. Small
/// and local models often ignore templates, and the turn must go on: a reply still off the
/// template after the reminder is kept, marked as such ([`summary::off_template`]), and only a
/// reply with no text at all fails the compaction. `usage` sums every call's raw usage.
async fn summarize(
    d: &Drain,
    id: &MessageId,
    ask: &Ask<'_>,
    usage: &mut llm::Usage,
) -> Result<String> {
    let (mut budget, mut shrinks, mut retries) = (ask.budget, 0, 0);
    let mut reminded: Option<(String, String)> = None;
    loop {
        let text = summary::request(ask.previous, ask.older, budget);
        let tools = d.shared.tools.current();
        let mut prepared = prepare(
            Inputs::of(
                &d.shared,
                &tools,
                ask.row,
                &History::default(),
                1,
                Purpose::Compaction,
            ),
            Some(&text),
        )?;
        if let Some((reply, problem)) = &reminded {
            let messages = &mut prepared.request.messages;
            messages.push(llm::Message::assistant(reply.clone()));
            messages.push(llm::Message::user(summary::reminder(problem)));
            prepared.estimated_tokens = estimate(&prepared.request);
        }
        // The summary's calls count against the session's life budget, those made so far too.
        let so_far =
            agenthost_model::Spend::of(&crate::drain::step::cost(usage, &prepared.model.price));
        if let Some(exceeded) = prepared.over_life_budget(so_far) {
            return Err(exceeded.into());
        }
        let error = match call(d, id, prepared).await? {
            Ok(response) => {
                *usage += response.usage;
                match (summary::check(&response.text), &reminded) {
                    (Ok(()), _) => return Ok(response.text),
                    (Err(problem), None) => {
                        reminded = Some((response.text, problem));
                        continue;
                    }
                    (Err(problem), Some((first, first_problem))) => {
                        let (reply, problem) = match response.text.trim().is_empty() {
                            false => (&response.text, &problem),
                            true => (first, first_problem),
                        };
                        if reply.trim().is_empty() {
                            return Err(Error::Provider(llm::Error::invalid_output(
                                "the model answered the summary request with no text, twice",
                            )));
                        }
                        tracing::warn!(session_id = %d.session, problem = %problem, "the summary does not follow the template after a reminder; kept as it is");
                        return Ok(summary::off_template(reply, problem));
                    }
                }
            }
            Err(error) => error,
        };
        if error.kind() == llm::ErrorKind::ContextOverflow && shrinks < SHRINKS {
            shrinks += 1;
            budget /= 2;
            continue;
        }
        if !error.retryable() || retries >= crate::retry::MAX_RETRIES {
            return Err(Error::Provider(error));
        }
        retries += 1;
        let delay = crate::drain::step::backoff(retries, &error);
        tracing::warn!(session_id = %d.session, error = %error, ?delay, "summary call failed; retrying");
        tokio::select! {
            biased;
            _ = d.cancel.cancelled() => return Err(Error::Interrupted),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One summary call: it takes a stream permit of its own (the step holds none while it
/// compacts), streams its text live, and an interrupt or a shutdown ends the wait for the permit
/// and the call itself.
async fn call(
    d: &Drain,
    id: &MessageId,
    prepared: Prepared,
) -> Result<std::result::Result<llm::Response, llm::Error>> {
    let shared = &d.shared;
    let run = async {
        let _permit = shared
            .streams
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let mut stream = prepared.provider.stream(prepared.request);
        let mut collector = llm::Collector::new();
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(error) => return Ok(Err(error)),
            };
            if let llm::Event::TextDelta { part, delta } = &event {
                shared.bus.publish(
                    &d.session,
                    Live::Delta {
                        message: id.clone(),
                        kind: DeltaKind::Summary,
                        part: *part,
                        delta: delta.clone(),
                    },
                );
            }
            if let Err(error) = collector.push(&event) {
                return Ok(Err(error));
            }
        }
        Ok(collector.finish())
    };
    tokio::select! {
        biased;
        _ = d.cancel.cancelled() => Err(Error::Interrupted),
        result = run => result,
    }
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

#[cfg(test)]
mod tests {
    use super::threshold;

    #[test]
    fn the_threshold_reserves_the_output_limit_up_to_half_the_window() {
        // The model's output limit is reserved.
        assert_eq!(threshold(200_000, Some(8_192)), 191_808);
        // 20 000 when the limit is unknown.
        assert_eq!(threshold(200_000, None), 180_000);
        // Never more than half the window, known or not.
        assert_eq!(threshold(32_000, None), 16_000);
        assert_eq!(threshold(100_000, Some(64_000)), 50_000);
        // An output limit that fills the window leaves half: no compaction before every step.
        assert_eq!(threshold(8_192, Some(8_192)), 4_096);
        assert_eq!(threshold(0, None), 0);
    }
}
