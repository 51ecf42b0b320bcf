//! One step: prepare the request from a fresh snapshot, run exactly one provider stream
//! per attempt, record its output durably as parts end, run the tools it called, and settle the
//! step exactly once.
//!
//! An attempt records each part durably when it ends (`TextEnded`, `ReasoningEnded`) and each tool
//! call as `ToolCalled` the moment it is complete, before anything runs it. What follows an
//! attempt is decided by `retry::next`. On success the tools run concurrently (unknown, denied,
//! invalid-JSON and last-step calls fail without running; identical duplicates run once), each
//! settles as it finishes, and `StepEnded` carries usage and cost, which the projector adds to the
//! session totals exactly there. An interrupt keeps partial output (incomplete), fails running
//! tools "interrupted" (a shutdown leaves them to recovery) and records exactly one
//! `StepFailed { Aborted }`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use agenthost_llm as llm;
use agenthost_model::history::{self, Mode};
use agenthost_model::owed;
use agenthost_model::{
    Event, FailureKind, Finish, InboxRow, InterruptReason, Message, MessageId, StepError,
    Timestamp, Usage,
};
use futures::StreamExt;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::approvals::{Gate, Policy};
use crate::bus::{DeltaKind, Live};
use crate::config::Price;
use crate::drain::compaction::{self, threshold};
use crate::drain::{Drain, Opening};
use crate::error::{Error, Result};
use crate::history_cache::HistoryCache;
use crate::hooks::{Purpose, StepReport, ToolReport};
use crate::mint;
use crate::prepare::{Inputs, Prepared, prepare};
use crate::retry;
use crate::tools::{Call, Tools};
use agenthost_model::Spend;
use agenthost_model::budget::Exceeded;

/// How a step ended.
#[derive(Debug)]
pub(crate) enum StepEnd {
    /// Settled; `continuation` is owed when local tools ran and no provider error occurred.
    Done { continuation: bool },
    /// Settled, and some of its calls are held for approval, the earliest expiring at
    /// `expires_at`: the exchange waits.
    Waiting { expires_at: Timestamp },
    /// Cancelled; the step's durable cleanup is done.
    Interrupted,
    /// The step's next call would pass this limit of the session's budget: it was not made, and
    /// whatever of the step was started is settled (as failed, so that the call is owed again).
    Blocked(agenthost_model::budget::Exceeded),
    /// The step failed and was settled as failed; the drain ends with this error.
    Failed(Error),
}

/// The most one attempt of a step may stream (text, reasoning and tool inputs together), in
/// bytes. Real answers are far below it; past it the provider is broken or hostile, and the step
/// fails with invalid output instead of growing a message without bound.
pub const MAX_STEP_OUTPUT: usize = 8 * 1024 * 1024;

/// In the marker of a tool output history keeps a preview of: what follows names the whole.
pub const CUT: &str = ": the whole output is stored as tool output ";

/// How long the events of a part that ended may wait for the stream's end before they go to the
/// store on their own. A provider ends its last part with its finish and sends only usage and its
/// end marker after it: the part's end then rides in the step's last write instead of a write of
/// its own. A part followed by more output (reasoning, then text) is durable this much later than
/// its end.
const PART_END_GRACE: Duration = Duration::from_millis(2);

/// The note that continues a response a broken stream cut off.
pub const CONTINUE_NOTE: &str = "Your previous response was cut off by a network error. Continue \
     exactly where it stopped, without repeating anything you already said.";

/// The step's request from a fresh snapshot.
async fn build(d: &Drain, step: u32) -> Result<Prepared> {
    build_with(d, step, None, Vec::new(), None).await
}

/// Records the step's assistant message. The event is submitted, not awaited: the provider
/// call starts at once, the event goes to the store as soon as the step waits for the provider
/// (or with the step's next write), and the message's deltas wait on the bus until its
/// `step_started` event is published. Everything that depends on the message being durable
/// (tool calls running, the step's settlement) waits for its own writes, which the writer
/// applies after this one.
fn start(d: &Drain, step: u32, prepared: &Prepared) -> MessageId {
    let message = mint::message_id();
    d.keep(d.shared.bus.hold(&message));
    d.submit(vec![Event::StepStarted {
        id: message.clone(),
        step,
        agent: prepared.agent.clone(),
        model: prepared.model.model.clone(),
    }]);
    message
}

/// Usage a failed attempt reported before failing: tokens are spent even when this attempt does
/// not end the step, so they count on the step's message and in the session totals.
fn spent(d: &Drain, message: &MessageId, a: &Attempt, prepared: &Prepared) -> Vec<Event> {
    if a.usage == llm::Usage::default() {
        return Vec::new();
    }
    let usage = cost(&a.usage, &prepared.model.price);
    d.shared
        .metrics
        .spent(&prepared.agent, &prepared.model.model, &usage);
    vec![Event::StepUsage {
        id: message.clone(),
        usage,
    }]
}

/// The snapshot read and the request build (hooks included) are blocking work: they run on the
/// blocking pool, not on an async worker, unless they are small. They are when no hook runs (a
/// hook is code we do not know) and the session's history cache holds a short history: the read
/// is then the row and the few newest messages, and the build copies a few kilobytes. The hop to
/// the blocking pool costs more than that build.
///
/// `ahead` are inputs the drain promoted in events it submitted and has not written yet: they
/// join the history as the user messages those events create. `opening` is the snapshot they
/// were chosen from, when the drain kept it: the build reads it instead of a fresh one.
async fn build_with(
    d: &Drain,
    step: u32,
    note: Option<&'static str>,
    ahead: Vec<InboxRow>,
    opening: Option<Opening>,
) -> Result<Prepared> {
    // Inline only where that blocks nothing: no hook to run, the store's reads local, and a
    // short cached history.
    let small = d.shared.hooks.is_empty()
        && d.shared.store.local_reads()
        && d.history
            .as_ref()
            .is_some_and(|cache| lock(cache).holds_a_short_history());
    if small {
        return build_blocking(d, step, note, ahead, opening);
    }
    let d = d.clone();
    tokio::task::spawn_blocking(move || build_blocking(&d, step, note, ahead, opening))
        .await
        .map_err(|e| match e.try_into_panic() {
            // A panicking hook fails the drain like any panic in it.
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Error::Unavailable(e.to_string()),
        })?
}

fn build_blocking(
    d: &Drain,
    step: u32,
    note: Option<&str>,
    ahead: Vec<InboxRow>,
    opening: Option<Opening>,
) -> Result<Prepared> {
    let shared = &d.shared;
    let not_found = || Error::SessionNotFound(d.session.clone());
    let (snap, row) = match opening {
        Some(Opening { snap, row }) => (snap, row),
        None => {
            let snap = shared.store.snapshot()?;
            let row = snap.session(&d.session)?.ok_or_else(not_found)?;
            (snap, row)
        }
    };
    let mut cache = d.history.as_ref().map(lock);
    let mut history = match cache.as_mut() {
        Some(cache) => {
            let history = cache.load(&*snap, &d.session, &row)?;
            #[cfg(debug_assertions)]
            {
                let (_, whole) = snap.history(&d.session, Mode::All)?.ok_or_else(not_found)?;
                assert_eq!(
                    history, whole,
                    "the cached history of {} differs from the store",
                    d.session
                );
            }
            history
        }
        None => {
            let messages = snap.messages(&d.session, history::load_from(&row), usize::MAX)?;
            history::select(&row, messages, Mode::All)
        }
    };
    drop(snap);
    // Their seqs are not assigned until the write; the ones given here follow the row's last
    // seq in order, which is all preparation reads of them.
    let read = history.messages.len();
    let time = agenthost_store::system_clock();
    let mut seq = row.last_seq;
    for input in ahead {
        seq = seq.next();
        history.messages.push(Message::User {
            id: input.id,
            seq,
            admitted_seq: input.admitted_seq,
            delivery: input.delivery,
            prompt: input.prompt,
            time,
        });
    }
    let tools = shared.tools.current();
    let inputs = Inputs::of(shared, &tools, &row, &history, step, Purpose::Step);
    let prepared = prepare(inputs, note);
    if let Some(cache) = cache.as_mut() {
        // Not durable yet: the promoted inputs stay out of the cache.
        history.messages.truncate(read);
        cache.keep(history);
    }
    prepared
}

/// Runs step `step`. `ahead` are the inputs promoted in events the drain submitted just before
/// (see `drain::run`); everything else the drain submitted is durable already. `opening` is the
/// snapshot `ahead` was chosen from, when the drain kept it ([`Opening`]).
pub(crate) async fn run(
    d: &Drain,
    step: u32,
    ahead: Vec<InboxRow>,
    opening: Option<Opening>,
) -> Result<StepEnd> {
    let span = tracing::info_span!(
        "step",
        session_id = %d.session,
        step,
        outcome = tracing::field::Empty
    );
    let end = run_step(d, step, ahead, opening)
        .instrument(span.clone())
        .await;
    let outcome = match &end {
        Ok(StepEnd::Done { continuation: true }) => "continue",
        Ok(StepEnd::Done {
            continuation: false,
        }) => "done",
        Ok(StepEnd::Waiting { .. }) => "waiting",
        Ok(StepEnd::Interrupted) => "interrupted",
        Ok(StepEnd::Blocked(_)) => "blocked",
        Ok(StepEnd::Failed(_)) | Err(_) => "failed",
    };
    span.record("outcome", outcome);
    d.shared.metrics.step(outcome);
    end
}

async fn run_step(
    d: &Drain,
    step: u32,
    ahead: Vec<InboxRow>,
    opening: Option<Opening>,
) -> Result<StepEnd> {
    if ahead.is_empty() {
        // The previous step's settlement must be in the snapshot this step is built from.
        d.flush().await?;
    }
    let shared = &d.shared;
    let mut prepared = build_with(d, step, None, ahead, opening).await?;
    // Compaction check: compact before the request when it would not fit.
    let limit = threshold(prepared.model.context_window, prepared.model.max_output);
    let mut compacted = false;
    if shared.compaction.auto && prepared.estimated_tokens > limit {
        match Box::pin(compaction::compact(d, true)).await {
            Ok(_) => {
                compacted = true;
                prepared = build(d, step).await?;
            }
            // Nothing older to summarize: send as is and let the provider decide.
            Err(Error::NothingToCompact) => {}
            // Nothing of this step is written yet.
            Err(Error::Interrupted) => return Ok(StepEnd::Interrupted),
            Err(Error::BudgetExhausted {
                which,
                spent,
                limit,
            }) => {
                return Ok(StepEnd::Blocked(Exceeded {
                    which,
                    spent,
                    limit,
                }));
            }
            Err(e) => return Ok(StepEnd::Failed(e)),
        }
    }
    // The call is made only if its worst case fits the budget; nothing of the step is written.
    if let Some(exceeded) = prepared.over_budget(Spend::default()) {
        return Ok(StepEnd::Blocked(exceeded));
    }

    let mut message = start(d, step, &prepared);
    // What the step's earlier attempts spent since `prepared` read the session's spend.
    let mut extra = Spend::default();

    let mut attempt = 0;
    loop {
        let permit = match shared.streams.clone().try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::ShuttingDown),
            // Waiting for a stream permit: the step's start goes to the store meanwhile.
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                d.send();
                tokio::select! {
                    biased;
                    _ = d.cancel.cancelled() => {
                        return Box::pin(abort(d, &message, &mut Attempt::default())).await;
                    }
                    permit = shared.streams.clone().acquire_owned() => permit,
                }
            }
        };
        let Ok(permit) = permit else {
            return Err(Error::ShuttingDown);
        };
        let mut a = Attempt::default();
        // What the attempt's calls may do: decided by the tools its request advertised.
        let policy = Policy {
            shared,
            tools: &prepared.tools,
            session: &d.session,
            agent_name: &prepared.agent,
            agent: shared.catalog.agents.get(&prepared.agent),
            last_step: prepared.last_step,
        };
        let mut stream = prepared.provider.stream_ref(&prepared.request);
        let call = tracing::info_span!(
            "provider_call",
            session_id = %d.session,
            step,
            model = %prepared.model.model,
            attempt,
            outcome = tracing::field::Empty
        );
        let streamed = async {
            let cancelled = d.cancel.cancelled();
            let mut cancelled = std::pin::pin!(cancelled);
            let mut grace: Option<Pin<Box<tokio::time::Sleep>>> = None;
            Ok::<bool, Error>(loop {
                // What the stream has ready is handled at once; before waiting for more, its
                // deltas go live (those of one part joined into one) and what the step submitted
                // goes to the store: the step's start at once, the events of parts that ended
                // after [`PART_END_GRACE`] (see there). One poll per event: the stream is not
                // polled once to see whether it is ready and again to wait. A cancellation is
                // seen before every event; the step waits for one only when it waits for the
                // stream.
                let next = std::future::poll_fn(|cx| {
                    if d.cancel.is_cancelled() {
                        return Poll::Ready(None);
                    }
                    match stream.poll_next_unpin(cx) {
                        Poll::Ready(next) => Poll::Ready(Some(next)),
                        Poll::Pending => {
                            if cancelled.as_mut().poll(cx).is_ready() {
                                return Poll::Ready(None);
                            }
                            // What the stream had ready goes live before the step waits.
                            a.publish(d, &message);
                            let wait = d.unsent_only_part_ends()
                                && grace
                                    .get_or_insert_with(|| {
                                        Box::pin(tokio::time::sleep(PART_END_GRACE))
                                    })
                                    .as_mut()
                                    .poll(cx)
                                    .is_pending();
                            if !wait {
                                grace = None;
                                d.send();
                            }
                            Poll::Pending
                        }
                    }
                })
                .await;
                let Some(next) = next else {
                    break true;
                };
                match next {
                    None => break false,
                    Some(Ok(event)) => {
                        a.on_event(d, &message, &policy, event);
                        if a.streamed > MAX_STEP_OUTPUT {
                            a.error = Some(llm::Error::invalid_output(format!(
                                "the model's answer passed {MAX_STEP_OUTPUT} bytes"
                            )));
                            break false;
                        }
                    }
                    Some(Err(error)) => {
                        a.error = Some(error);
                        break false;
                    }
                }
            })
        };
        let cancelled = streamed.instrument(call.clone()).await?;
        a.publish(d, &message);
        call.record(
            "outcome",
            match (&a.error, cancelled) {
                (_, true) => "cancelled",
                (Some(e), _) => e.kind().as_str(),
                (None, false) => "ok",
            },
        );
        drop(stream);
        // A permit covers an open stream only: tools, backoffs and compaction run without one,
        // so they never hold up other sessions, and no path ever holds two.
        drop(permit);
        if cancelled {
            return Box::pin(abort(d, &message, &mut a)).await;
        }
        if a.error.is_none() && a.finish.is_none() {
            a.error = Some(llm::Error::incomplete(
                "the stream ended before the step finished",
            ));
        }

        let ended = retry::Ended {
            failure: a.error.as_ref().map(|e| retry::Failure {
                overflow: e.kind() == llm::ErrorKind::ContextOverflow,
                retryable: e.retryable(),
            }),
            output: a.has_output(),
            calls: !a.calls.is_empty(),
            retries: attempt,
            compacted,
            auto_compaction: shared.compaction.auto,
        };
        match (retry::next(&ended), a.error.take()) {
            (retry::Next::Compact, Some(error)) => {
                compacted = true;
                match Box::pin(compaction::compact(d, true)).await {
                    Ok(_) => {
                        prepared = build(d, step).await?;
                        extra = Spend::default();
                        if let Some(exceeded) = prepared.over_budget(extra) {
                            return blocked(d, &message, exceeded, &error).await;
                        }
                    }
                    Err(Error::Interrupted) => return Box::pin(abort(d, &message, &mut a)).await,
                    Err(Error::BudgetExhausted {
                        which,
                        spent,
                        limit,
                    }) => {
                        let exceeded = Exceeded {
                            which,
                            spent,
                            limit,
                        };
                        return blocked(d, &message, exceeded, &error).await;
                    }
                    Err(_) => {
                        // Terminal, with the original error.
                        a.error = Some(error);
                        return Box::pin(fail(d, &message, step, &mut a, &prepared)).await;
                    }
                }
            }
            (retry::Next::Retry, Some(error)) => {
                attempt += 1;
                shared.metrics.retry(error.kind().as_str());
                let delay = backoff(attempt, &error);
                tracing::warn!(session_id = %d.session, step, attempt, delay_ms = delay.as_millis() as u64, reason = error.kind().as_str(), error = %error, "provider call failed; retrying");
                let mut events = spent(d, &message, &a, &prepared);
                extra = add(extra, &cost(&a.usage, &prepared.model.price));
                events.push(Event::RetryScheduled {
                    id: message.clone(),
                    attempt,
                    delay_ms: delay.as_millis() as u64,
                    error: provider_failure(&error),
                });
                d.append(events).await?;
                if back_off(d, delay).await {
                    return Box::pin(abort(d, &message, &mut a)).await;
                }
                // A retry is a call like any other: its worst case must fit what is left.
                if let Some(exceeded) = prepared.over_budget(extra) {
                    return blocked(d, &message, exceeded, &error).await;
                }
            }
            // Cut off after output: keep the partial message, settle it, and continue in a new
            // message with a fixed note, under the same retry budget and step number.
            (retry::Next::Continue, Some(error)) => {
                attempt += 1;
                shared.metrics.retry(error.kind().as_str());
                let delay = backoff(attempt, &error);
                tracing::warn!(session_id = %d.session, step, attempt, delay_ms = delay.as_millis() as u64, reason = error.kind().as_str(), error = %error, "provider stream cut after output; continuing");
                a.flush_partials(d, &message).await?;
                let mut events = spent(d, &message, &a, &prepared);
                events.push(Event::RetryScheduled {
                    id: message.clone(),
                    attempt,
                    delay_ms: delay.as_millis() as u64,
                    error: provider_failure(&error),
                });
                events.push(Event::StepFailed {
                    id: message.clone(),
                    error: provider_failure(&error),
                });
                d.append(events).await?;
                if back_off(d, delay).await {
                    // The partial message is settled: nothing is left open to clean up.
                    return Ok(StepEnd::Interrupted);
                }
                prepared = build_with(d, step, Some(CONTINUE_NOTE), Vec::new(), None).await?;
                extra = Spend::default();
                // The partial message is settled: a continuation the budget does not allow is
                // owed again once it does.
                if let Some(exceeded) = prepared.over_budget(extra) {
                    return Ok(StepEnd::Blocked(exceeded));
                }
                message = start(d, step, &prepared);
            }
            (_, Some(error)) => {
                tracing::warn!(session_id = %d.session, step, attempts = attempt + 1, reason = error.kind().as_str(), error = %error, "provider call failed; the step fails");
                a.error = Some(error);
                return Box::pin(fail(d, &message, step, &mut a, &prepared)).await;
            }
            (_, None) => {
                if Box::pin(run_tools(d, &message, &a, &prepared.tools)).await? {
                    return Box::pin(abort(d, &message, &mut a)).await;
                }
                let usage = cost(&a.usage, &prepared.model.price);
                shared
                    .metrics
                    .spent(&prepared.agent, &prepared.model.model, &usage);
                let finish = a.finish.take().unwrap_or(Finish::Stop);
                d.submit(vec![Event::StepEnded {
                    id: message.clone(),
                    finish,
                    usage,
                }]);
                if !d.shared.hooks.is_empty() {
                    // Observers see settled steps only once they are durable.
                    d.flush().await?;
                }
                report_step(d, &message, step, None);
                if let Some(expires_at) = a.asked.iter().map(|(_, at)| *at).min() {
                    return Ok(StepEnd::Waiting { expires_at });
                }
                let continuation = !a.calls.is_empty() && !prepared.last_step;
                return Ok(StepEnd::Done { continuation });
            }
        }
    }
}

/// Ends a step whose next call (a retry, or the call after a compaction) its budget does not
/// allow: the started message settles as failed, so that the call is owed again, as a retry of
/// the step, once the budget allows it.
async fn blocked(
    d: &Drain,
    message: &MessageId,
    exceeded: Exceeded,
    error: &llm::Error,
) -> Result<StepEnd> {
    let mut failure = provider_failure(error);
    failure.message = format!(
        "{}; the budget's {} limit does not allow another call",
        failure.message,
        exceeded.which.as_str()
    );
    d.append(vec![Event::StepFailed {
        id: message.clone(),
        error: failure,
    }])
    .await?;
    Ok(StepEnd::Blocked(exceeded))
}

/// `spend` plus a usage's tokens and cost.
fn add(spend: Spend, usage: &agenthost_model::Usage) -> Spend {
    let more = Spend::of(usage);
    Spend {
        tokens: spend.tokens.saturating_add(more.tokens),
        cost_nanos: spend.cost_nanos.saturating_add(more.cost_nanos),
    }
}

/// Settles a step whose provider call failed for good: partial output kept as incomplete, tools
/// the model called before the error run and settle, exactly one `StepFailed`.
async fn fail(
    d: &Drain,
    message: &MessageId,
    step: u32,
    a: &mut Attempt,
    prepared: &Prepared,
) -> Result<StepEnd> {
    let error = a
        .error
        .take()
        .expect("invariant: fail is called with the attempt's error");
    a.flush_partials(d, message).await?;
    if run_tools(d, message, a, &prepared.tools).await? {
        return abort(d, message, a).await;
    }
    let failure = provider_failure(&error);
    // Calls held for approval are withdrawn with the step: the execution ends here, and nothing
    // may wait on a step that failed.
    let mut events = withdraw_asked(message, a, "the model's answer failed before it ended");
    events.extend(spent(d, message, a, prepared));
    events.push(Event::StepFailed {
        id: message.clone(),
        error: failure.clone(),
    });
    let error = match error.kind() {
        llm::ErrorKind::ContextOverflow => Error::ContextOverflow(error.to_string()),
        _ => Error::Provider(error),
    };
    // The step's failure ends the drain in the same commit: a failed step under a held claim
    // then always means its retry or continuation was still to come (ARCHITECTURE.md,
    // "Recovery: what a session owes").
    events.push(Event::ExecutionFailed {
        error: error.to_string(),
        halted: false,
    });
    d.append(events).await?;
    report_step(d, message, step, Some(failure.message));
    Ok(StepEnd::Failed(error))
}

fn report_step(d: &Drain, message: &MessageId, step: u32, error: Option<String>) {
    let report = StepReport {
        session: d.session.clone(),
        message: message.clone(),
        step,
        error,
    };
    for hook in &d.shared.hooks {
        hook.on_step(&report);
    }
}

/// Waits out a retry's backoff without holding a drain slot, then takes one again; `true` when
/// cancelled first.
async fn back_off(d: &Drain, delay: Duration) -> bool {
    d.slot.release();
    tokio::select! {
        biased;
        _ = d.cancel.cancelled() => return true,
        _ = tokio::time::sleep(delay) => {}
    }
    !d.slot.take(&d.shared, &d.cancel).await
}

/// The wait before retry `attempt`, with ±20 % jitter (see [`retry::delay`]).
pub(crate) fn backoff(attempt: u32, error: &llm::Error) -> Duration {
    retry::delay(
        attempt,
        error.retry_after(),
        0.8 + rand::random::<f64>() * 0.4,
    )
}

fn provider_failure(error: &llm::Error) -> StepError {
    let kind = match error.kind() {
        llm::ErrorKind::ContextOverflow => FailureKind::ContextOverflow,
        _ => FailureKind::Provider,
    };
    StepError {
        kind,
        message: error.to_string(),
    }
}

pub(crate) fn cost(usage: &llm::Usage, price: &Price) -> Usage {
    Usage {
        input: usage.input,
        output: usage.output,
        reasoning: usage.reasoning,
        cache_read: usage.cache_read,
        cache_write: usage.cache_write,
        cost_nanos: usage.input * price.input
            + usage.output * price.output
            + usage.cache_read * price.cache_read
            + usage.cache_write * price.cache_write,
    }
}

/// Settles an interrupted step: partial output kept as incomplete, exactly one `StepFailed`, and
/// after a user interrupt unsettled tools failed "interrupted". A shutdown knows no more than a
/// crash about a tool it cut, so it leaves the call open: recovery settles it as after a crash
/// (an idempotent tool runs again with the same key, any other is reported to the model as
/// "may or may not have taken effect").
async fn abort(d: &Drain, message: &MessageId, a: &mut Attempt) -> Result<StepEnd> {
    // The snapshot below must see every tool call this step submitted.
    d.flush().await?;
    a.flush_partials(d, message).await?;
    if d.cancel.reason() == InterruptReason::Shutdown {
        d.append(vec![aborted(message)]).await?;
        return Ok(StepEnd::Interrupted);
    }
    let id = message.clone();
    let (running, held): (Vec<String>, Vec<owed::Held>) = d
        .read(move |snap, session| {
            Ok(snap
                .history(session, Mode::All)?
                .and_then(|(_, h)| {
                    h.messages.into_iter().find_map(|m| match m {
                        agenthost_model::Message::Assistant(x) if x.id == id => Some((
                            x.running_tools().map(|t| t.call_id.clone()).collect(),
                            owed::held(&x),
                        )),
                        _ => None,
                    })
                })
                .unwrap_or_default())
        })
        .await?;
    let mut events = owed::withdraw(&held, owed::INTERRUPTED_TOOL);
    events.extend(running.into_iter().map(|call_id| Event::ToolFailed {
        id: message.clone(),
        call_id,
        error: owed::INTERRUPTED_TOOL.into(),
    }));
    events.push(aborted(message));
    d.append(events).await?;
    Ok(StepEnd::Interrupted)
}

fn aborted(message: &MessageId) -> Event {
    Event::StepFailed {
        id: message.clone(),
        error: owed::aborted(),
    }
}

/// The most bytes of deltas joined into one for the bus (see [`Attempt::delta`]).
const JOINED_DELTA: usize = 16 * 1024;

/// What one attempt's stream produced so far.
#[derive(Debug, Default)]
struct Attempt {
    /// Open text and reasoning parts by stream part index, in arrival order.
    text: Option<(u32, String)>,
    reasoning: Option<(u32, String)>,
    calls: Vec<llm::ToolCall>,
    /// Calls the gate refused, with the reason the model gets.
    refused: HashMap<String, String>,
    /// Calls held for approval, with when their approval expires.
    asked: Vec<(String, Timestamp)>,
    finish: Option<Finish>,
    usage: llm::Usage,
    error: Option<llm::Error>,
    /// Whether any part of this attempt is durable; retrying would then duplicate output.
    durable_output: bool,
    /// Bytes streamed so far (text, reasoning, tool inputs), against [`MAX_STEP_OUTPUT`].
    streamed: usize,
    /// Deltas of one part the stream had ready together, joined, not yet published: they go
    /// to the bus as one before the step waits for the stream, and before any other event.
    unpublished: Option<(DeltaKind, u32, String)>,
}

impl Attempt {
    /// Whether this attempt produced anything: durable parts, or streamed text or reasoning not
    /// yet ended. Retrying from scratch would then repeat or lose what was already shown.
    fn has_output(&self) -> bool {
        let open = |part: &Option<(u32, String)>| part.as_ref().is_some_and(|(_, t)| !t.is_empty());
        self.durable_output || open(&self.text) || open(&self.reasoning)
    }

    /// Counts `delta` against [`MAX_STEP_OUTPUT`]; `true` (and nothing kept) once past it.
    fn over(&mut self, delta: &str) -> bool {
        self.streamed = self.streamed.saturating_add(delta.len());
        self.streamed > MAX_STEP_OUTPUT
    }

    /// Queues a delta for the bus, joined to the one before it when it continues that part. A
    /// joined delta goes once it holds [`JOINED_DELTA`] bytes, so what the bus holds for a
    /// reader stays counted in pieces of a bounded size.
    fn delta(&mut self, d: &Drain, message: &MessageId, kind: DeltaKind, part: u32, text: String) {
        match &mut self.unpublished {
            Some((k, p, joined)) if *k == kind && *p == part => joined.push_str(&text),
            _ => {
                self.publish(d, message);
                self.unpublished = Some((kind, part, text));
            }
        }
        if self
            .unpublished
            .as_ref()
            .is_some_and(|(_, _, joined)| joined.len() >= JOINED_DELTA)
        {
            self.publish(d, message);
        }
    }

    /// Publishes the queued delta, if any. Publishing checks for subscribers first: a delta
    /// nobody watches goes no further.
    fn publish(&mut self, d: &Drain, message: &MessageId) {
        if let Some((kind, part, delta)) = self.unpublished.take() {
            d.shared.bus.publish(
                &d.session,
                Live::Delta {
                    message: message.clone(),
                    kind,
                    part,
                    delta,
                },
            );
        }
    }

    fn on_event(&mut self, d: &Drain, message: &MessageId, policy: &Policy<'_>, event: llm::Event) {
        let is_delta = matches!(
            event,
            llm::Event::TextDelta { .. }
                | llm::Event::ReasoningDelta { .. }
                | llm::Event::ToolInputDelta { .. }
        );
        if !is_delta {
            // Deltas go out ahead of whatever follows them.
            self.publish(d, message);
        }
        match event {
            llm::Event::StepStart { .. } => {}
            llm::Event::TextStart { part } => self.text = Some((part, String::new())),
            llm::Event::TextDelta { part, delta: text } => {
                if self.over(&text) {
                    return;
                }
                grow(&mut self.text, part, &text);
                self.delta(d, message, DeltaKind::Text, part, text);
            }
            llm::Event::TextEnd { .. } => {
                if let Some((_, text)) = self.text.take() {
                    self.durable_output = true;
                    d.submit(vec![Event::TextEnded {
                        id: message.clone(),
                        text,
                        incomplete: false,
                    }]);
                }
            }
            llm::Event::ReasoningStart { part } => self.reasoning = Some((part, String::new())),
            llm::Event::ReasoningDelta { part, delta: text } => {
                if self.over(&text) {
                    return;
                }
                grow(&mut self.reasoning, part, &text);
                self.delta(d, message, DeltaKind::Reasoning, part, text);
            }
            llm::Event::ReasoningEnd { metadata, .. } => {
                let text = self.reasoning.take().map(|(_, t)| t).unwrap_or_default();
                self.durable_output = true;
                d.submit(vec![Event::ReasoningEnded {
                    id: message.clone(),
                    text,
                    metadata: metadata.and_then(|m| serde_json::to_string(&m).ok()),
                    incomplete: false,
                }]);
            }
            llm::Event::ToolInputStart { .. } | llm::Event::ToolInputEnd { .. } => {}
            llm::Event::ToolInputDelta { part, delta: text } => {
                if !self.over(&text) {
                    self.delta(d, message, DeltaKind::ToolInput, part, text)
                }
            }
            llm::Event::ToolCall { call, .. } => {
                // Recorded before anything runs it: tools start only after the
                // stream ended and every submitted write is durable (`run_tools` flushes). A
                // call that needs approval is held in the same commit, so no stop can leave it
                // recorded as started without its approval.
                self.durable_output = true;
                let mut events = vec![Event::ToolCalled {
                    id: message.clone(),
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    input: call.input.clone(),
                }];
                match policy.gate(&call) {
                    Gate::Run => {}
                    Gate::Refuse(reason) => {
                        self.refused.insert(call.id.clone(), reason);
                    }
                    Gate::Ask { digest } => {
                        let expires_at = policy.expires_at(agenthost_store::system_clock());
                        events.push(Event::ApprovalRequested {
                            id: message.clone(),
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            digest,
                            expires_at,
                        });
                        self.asked.push((call.id.clone(), expires_at));
                    }
                }
                d.submit(events);
                self.calls.push(call);
            }
            llm::Event::StepFinish { reason, usage, .. } => {
                self.finish = Some(finish(reason));
                self.usage = usage;
            }
        }
    }

    /// Keeps partial text and reasoning of a failed or interrupted stream, marked incomplete.
    async fn flush_partials(&mut self, d: &Drain, message: &MessageId) -> Result<()> {
        let mut events = Vec::new();
        if let Some((_, text)) = self.reasoning.take().filter(|(_, t)| !t.is_empty()) {
            events.push(Event::ReasoningEnded {
                id: message.clone(),
                text,
                metadata: None,
                incomplete: true,
            });
        }
        if let Some((_, text)) = self.text.take().filter(|(_, t)| !t.is_empty()) {
            events.push(Event::TextEnded {
                id: message.clone(),
                text,
                incomplete: true,
            });
        }
        if !events.is_empty() {
            self.durable_output = true;
            d.append(events).await?;
        }
        Ok(())
    }
}

/// Appends a delta to an open part, opening it if the provider skipped the start event.
fn grow(slot: &mut Option<(u32, String)>, part: u32, text: &str) {
    match slot {
        Some((_, buf)) => buf.push_str(text),
        None => *slot = Some((part, text.to_owned())),
    }
}

fn finish(reason: llm::FinishReason) -> Finish {
    match reason {
        llm::FinishReason::Stop => Finish::Stop,
        llm::FinishReason::Length => Finish::Length,
        llm::FinishReason::ToolCalls => Finish::ToolCalls,
        llm::FinishReason::ContentFilter => Finish::ContentFilter,
        other => Finish::Other(other.as_str().to_owned()),
    }
}

/// The events that withdraw the calls this attempt held for approval (`Cancelled`, with the
/// refusal the model sees).
fn withdraw_asked(message: &MessageId, a: &Attempt, reason: &str) -> Vec<Event> {
    let held: Vec<owed::Held> = a
        .asked
        .iter()
        .filter_map(|(call_id, expires_at)| {
            let call = a.calls.iter().find(|c| c.id == *call_id)?;
            Some(owed::Held {
                message: message.clone(),
                tool: agenthost_model::ToolPart {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    input: call.input.clone(),
                    state: agenthost_model::ToolState::Held,
                },
                digest: String::new(),
                expires_at: *expires_at,
                decision: None,
            })
        })
        .collect();
    owed::withdraw(&held, reason)
}

/// Runs the step's recorded tool calls concurrently and settles each durably as it finishes.
/// Calls the gate refused (last step, unknown tool, denied, invalid JSON) fail without running;
/// calls held for approval wait. An identical duplicate call (same name and arguments) runs once
/// and both get its result. Returns true when cancelled before every call settled.
async fn run_tools(d: &Drain, message: &MessageId, a: &Attempt, tools: &Tools) -> Result<bool> {
    if a.calls.is_empty() {
        return Ok(false);
    }
    d.flush().await?;
    let shared = &d.shared;
    let mut refused = Vec::new();
    let mut tasks = JoinSet::new();
    // (name, input) → call ids sharing one execution.
    let mut shared_runs: HashMap<(String, String), Vec<String>> = HashMap::new();
    for call in &a.calls {
        if a.asked.iter().any(|(id, _)| *id == call.id) {
            continue;
        }
        if let Some(error) = a.refused.get(&call.id).cloned() {
            let tool = match tools.get(&call.name) {
                Some(_) => call.name.as_str(),
                None => "unknown",
            };
            shared.metrics.tool_call(tool, "refused");
            refused.push(Event::ToolFailed {
                id: message.clone(),
                call_id: call.id.clone(),
                error,
            });
            continue;
        }
        let key = (call.name.clone(), call.input.clone());
        if let Some(ids) = shared_runs.get_mut(&key) {
            ids.push(call.id.clone());
            continue;
        }
        shared_runs.insert(key.clone(), vec![call.id.clone()]);
        let tool = tools
            .get(&call.name)
            .cloned()
            .expect("invariant: checked above");
        let input = serde_json::from_str(&call.input).expect("invariant: parsed above");
        let call = Call {
            session: d.session.clone(),
            message: message.clone(),
            call_id: call.id.clone(),
            name: call.name.clone(),
            input,
        };
        let span = tracing::info_span!(
            "tool_call",
            session_id = %d.session,
            tool = %call.name,
            call_id = %call.call_id,
            outcome = tracing::field::Empty
        );
        tasks.spawn(
            async move {
                let result = tool.run(call).await;
                let span = tracing::Span::current();
                span.record("outcome", if result.is_ok() { "ok" } else { "failed" });
                (key, result)
            }
            .instrument(span),
        );
    }
    if !refused.is_empty() {
        d.append(refused).await?;
    }
    let limit = shared.limits.tool_output;
    // Tools may wait on other sessions: while they run, this drain's slot serves another drain.
    let running = !tasks.is_empty();
    if running {
        d.slot.release();
    }
    loop {
        let joined = tokio::select! {
            biased;
            _ = d.cancel.cancelled() => {
                tasks.abort_all();
                return Ok(true);
            }
            joined = tasks.join_next() => joined,
        };
        let Some(joined) = joined else {
            // A slot again before going on; cancelled meanwhile, the drain stops at its next
            // boundary without one.
            if running {
                d.slot.take(shared, &d.cancel).await;
            }
            return Ok(false);
        };
        let ((name, input), result) = joined.map_err(|e| Error::Panicked(e.to_string()))?;
        let ids = shared_runs
            .remove(&(name.clone(), input))
            .unwrap_or_default();
        let events = ids
            .iter()
            .flat_map(|call_id| settled(message, call_id, &result, limit))
            .collect();
        d.append(events).await?;
        for call_id in ids {
            let outcome = if result.is_ok() { "ok" } else { "failed" };
            shared.metrics.tool_call(&name, outcome);
            let report = ToolReport {
                session: d.session.clone(),
                message: message.clone(),
                call_id,
                name: name.clone(),
                ok: result.is_ok(),
            };
            for hook in &shared.hooks {
                hook.on_tool(&report);
            }
        }
    }
}

/// The durable settlement of one call. Output (or an error) above `limit` bytes keeps a head and
/// tail preview in history, with a marker saying how much was cut and where the whole is; the
/// whole goes into a `ToolOutput` event of the same commit.
pub(crate) fn settled(
    message: &MessageId,
    call_id: &str,
    result: &Result<String, String>,
    limit: usize,
) -> Vec<Event> {
    let text = match result {
        Ok(output) | Err(output) => output,
    };
    let (kept, cut) = match crate::summary::head_and_tail(text, limit) {
        Some((head, tail, cut)) => (
            format!(
                "{head}\n[… {cut} of {} bytes cut{CUT}{message}/{call_id} …]\n{tail}",
                text.len()
            ),
            true,
        ),
        None => (text.clone(), false),
    };
    let whole = cut.then(|| Event::ToolOutput {
        id: message.clone(),
        call_id: call_id.to_owned(),
        output: text.clone(),
    });
    let settle = match result {
        Ok(_) => Event::ToolSucceeded {
            id: message.clone(),
            call_id: call_id.to_owned(),
            output: kept,
            truncated: cut,
        },
        Err(_) => Event::ToolFailed {
            id: message.clone(),
            call_id: call_id.to_owned(),
            error: kept,
        },
    };
    whole.into_iter().chain([settle]).collect()
}

fn lock(cache: &Arc<Mutex<HistoryCache>>) -> MutexGuard<'_, HistoryCache> {
    cache.lock().unwrap_or_else(|e| e.into_inner())
}
