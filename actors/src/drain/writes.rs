//! The drain's writes: what it submitted to the store and has not waited for yet. Events are
//! submitted without waiting and sent in bursts (see [`Drain::submit`]); a write or a flush waits
//! for everything before it.
//!
//! Events nothing waits on before the step's next durable boundary (the step's start, a part that
//! ended, a tool call, the step's end) are submitted without waiting and sent to the writer as one
//! operation whenever the step is about to wait (for the provider or a stream permit; the ends
//! of parts alone wait up to `step::PART_END_GRACE` for the stream's end) and with every write
//! and flush, where they ride ahead of that write's own actions. Every `append` first
//! waits for all earlier submissions, and so does every point that needs them durable: before
//! tools run, before the next step reads its snapshot, before compaction reads the history, before
//! interrupt cleanup, before observers see a settled step.
//!
//! `StepStarted` is submitted too, so the provider call starts before it is durable. Live
//! subscribers must still never see a delta of a message they were not told about: the step holds
//! the message on the bus (`Bus::hold`) until the commit hook publishes its `step_started`. The
//! hold lives until the drain's next flush or write has waited for every write sent so far.

use agenthost_model::{Event, Stored};
use agenthost_store::Action;

use crate::bus::Hold;
use crate::drain::Drain;
use crate::error::Result;

/// What a drain submitted and has not yet waited for.
#[derive(Default)]
pub(crate) struct Submitted {
    /// Events submitted and not yet sent to the store, in order (see [`Drain::send`]).
    unsent: Vec<Event>,
    /// Writes sent, in order.
    writes: Vec<InFlight>,
    /// Deltas held on the bus until a submitted `StepStarted` is published: released by the
    /// next flush, once that write has either committed (and been published) or failed.
    holds: Vec<Hold>,
}

/// A write submitted to the store, not yet awaited.
pub(crate) type InFlight =
    futures::future::BoxFuture<'static, agenthost_store::Result<Vec<agenthost_model::Stored>>>;

impl Drain {
    /// `actions` behind the drain's fence, when its store has lease epochs: every write of a
    /// drain carries the epoch its claim was taken in.
    fn fenced(&self, actions: impl Iterator<Item = Action>) -> Vec<Action> {
        self.fence
            .map(Action::Fence)
            .into_iter()
            .chain(actions)
            .collect()
    }

    /// Appends and waits until these events, and every event submitted before them, are
    /// durable.
    pub(crate) async fn append(&self, events: Vec<Event>) -> Result<()> {
        self.submit(events);
        self.flush().await
    }

    /// Runs `actions` in one transaction after everything submitted before, waits until all of
    /// it is durable, and returns the events the actions wrote. Events submitted and not sent
    /// yet ride in the same transaction, ahead of the actions.
    pub(crate) async fn write(&self, actions: Vec<Action>) -> Result<Vec<Stored>> {
        let (unsent, writes, holds) = {
            let mut submitted = self.submitted();
            let unsent = std::mem::take(&mut submitted.unsent);
            let writes = std::mem::take(&mut submitted.writes);
            let holds = std::mem::take(&mut submitted.holds);
            (unsent, writes, holds)
        };
        let ahead = unsent.len();
        let all = self.fenced(unsent.into_iter().map(Action::Append).chain(actions));
        let write = self.shared.store.write(self.session.clone(), all);
        let earlier = wait(writes).await;
        let written = write.await;
        // Held deltas go out only once the write that may carry their `StepStarted` is done.
        drop(holds);
        earlier?;
        let mut written = written?;
        // Each append wrote exactly its one event.
        written.drain(..ahead);
        Ok(written)
    }

    /// Submits events without waiting for them. They go to the store with the next
    /// [`Drain::send`], which the step calls whenever it is about to wait for the provider, and
    /// with every write and flush, so an event is on its way as soon as the drain would
    /// otherwise sit idle, and the events of a burst (a part's end, the step's end, the drain's
    /// settlement) share one operation. Used for events nothing waits on before the step's next
    /// durable boundary (the step's start, parts that ended, the step's end).
    pub(crate) fn submit(&self, events: Vec<Event>) {
        self.submitted().unsent.extend(events);
    }

    /// Whether something is submitted and not sent, and all of it records parts that ended
    /// (text, reasoning, tool calls): what may wait a moment for the step's end (see
    /// `step::PART_END_GRACE`).
    pub(crate) fn unsent_only_part_ends(&self) -> bool {
        let submitted = self.submitted();
        !submitted.unsent.is_empty()
            && submitted.unsent.iter().all(|event| {
                matches!(
                    event,
                    Event::TextEnded { .. }
                        | Event::ReasoningEnded { .. }
                        | Event::ToolCalled { .. }
                )
            })
    }

    /// Sends the events submitted so far to the store as one operation, without waiting.
    pub(crate) fn send(&self) {
        let mut submitted = self.submitted();
        if submitted.unsent.is_empty() {
            return;
        }
        let events = std::mem::take(&mut submitted.unsent);
        let actions = self.fenced(events.into_iter().map(Action::Append));
        let write = self.shared.store.write(self.session.clone(), actions);
        submitted.writes.push(write);
    }

    /// Keeps `hold` until every write submitted so far has been waited for.
    pub(crate) fn keep(&self, hold: Hold) {
        self.submitted().holds.push(hold);
    }

    /// Whether everything the drain submitted is durable (or failed and was reported).
    pub(crate) fn nothing_submitted(&self) -> bool {
        let submitted = self.submitted();
        submitted.unsent.is_empty() && submitted.writes.is_empty()
    }

    fn submitted(&self) -> std::sync::MutexGuard<'_, Submitted> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends what is unsent and waits for every submitted write; the first failure is returned.
    pub(crate) async fn flush(&self) -> Result<()> {
        self.send();
        let (writes, holds) = {
            let mut submitted = self.submitted();
            let writes = std::mem::take(&mut submitted.writes);
            let holds = std::mem::take(&mut submitted.holds);
            (writes, holds)
        };
        let result = wait(writes).await;
        drop(holds);
        result
    }
}

/// Waits for every write; the first failure is returned.
async fn wait(writes: Vec<InFlight>) -> Result<()> {
    let mut result = Ok(());
    for write in writes {
        if let Err(e) = write.await
            && result.is_ok()
        {
            result = Err(e.into());
        }
    }
    result
}
