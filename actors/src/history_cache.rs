//! The settled front of a session's active history, kept decoded by its session actor between
//! steps, so a step reads and decodes only what can still change (the messages from the first
//! unsettled one on) instead of the whole active history.
//!
//! Why it is safe: a user or system message never changes, and an assistant message never
//! changes once it is settled with no tool running or held for approval. Which messages are
//! active depends only on the row's compaction and `active_from`; the cache starts over when
//! either moves, or when the row is another one (its creation time). The cache lives in one
//! actor and goes with it (idle passivation, restart), and only the session's drain, one at a
//! time, uses it. Debug builds check every cached history against a full read.
//!
//! Its memory is bounded across all sessions by [`Budget`]: a history that does not fit is read
//! whole every step, as if there were no cache.
//!
//! An actor that gives its place up to a session waiting for one (ARCHITECTURE.md "Live
//! sessions") parks its cache in the budget instead of dropping it: the session is likely to
//! come back soon, and its next actor takes the cache up again rather than reading the whole
//! history cold. Parked caches stay charged to the budget; a cache that needs room evicts the
//! oldest parked ones, and the registry drops them all once nobody waits.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agenthost_model::history::{self, History, Mode};
use agenthost_model::{Message, Part, Seq, SessionId, SessionRow, ToolState};
use agenthost_store::Snapshot;

use crate::error::Result;

/// Bytes all caches may hold together (approximate: text and a fixed overhead per message),
/// the parked ones included.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
    /// A std mutex: held to move one cache in or out, never across an await.
    parked: std::sync::Mutex<Parked>,
}

/// Caches of sessions without an actor, oldest first. Each parking gets a ticket; an entry of
/// `order` whose ticket is not its session's cache's (taken up, or parked again since) is stale,
/// skipped by eviction and compacted away before stale entries outnumber live ones.
#[derive(Debug, Default)]
struct Parked {
    order: VecDeque<(SessionId, u64)>,
    caches: HashMap<SessionId, Kept>,
    tickets: u64,
}

impl Parked {
    fn is_current(&self, (session, ticket): &(SessionId, u64)) -> bool {
        self.caches
            .get(session)
            .is_some_and(|kept| kept.ticket == *ticket)
    }

    /// The oldest parked cache, removed.
    fn evict(&mut self) -> Option<Kept> {
        while let Some(entry) = self.order.pop_front() {
            if self.is_current(&entry) {
                return self.caches.remove(&entry.0);
            }
        }
        None
    }
}

/// What a cache holds, without its budget.
#[derive(Debug)]
struct Kept {
    key: Key,
    summary: Option<String>,
    messages: Vec<Message>,
    bytes: usize,
    next: Seq,
    ticket: u64,
}

/// The row a cached selection was made for: its creation time, compaction and `active_from`.
type Key = (agenthost_model::Timestamp, Option<Seq>, Seq);

impl Budget {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
            parked: Default::default(),
        })
    }

    /// Takes `bytes` more if they fit, evicting parked caches, oldest first, to make room.
    fn take(&self, bytes: usize) -> bool {
        loop {
            let taken = self
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_add(bytes).filter(|total| *total <= self.limit)
                })
                .is_ok();
            if taken || bytes > self.limit {
                return taken;
            }
            let evicted = lock(&self.parked).evict();
            match evicted {
                Some(kept) => self.give_back(kept.bytes),
                None => return false,
            }
        }
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Drops every parked cache: nobody waits for a place any more, so the sessions they
    /// belong to cost no memory again until they run.
    pub(crate) fn drop_parked(&self) {
        let parked = std::mem::take(&mut *lock(&self.parked));
        let bytes = parked.caches.values().map(|kept| kept.bytes).sum();
        self.give_back(bytes);
    }

    #[cfg(test)]
    fn parked(&self) -> usize {
        lock(&self.parked).caches.len()
    }

    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// A poisoned lock still guards consistent data: every critical section is a few map updates
/// that cannot panic halfway.
fn lock(parked: &std::sync::Mutex<Parked>) -> std::sync::MutexGuard<'_, Parked> {
    parked
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One session's cache.
#[derive(Debug)]
pub(crate) struct HistoryCache {
    budget: Arc<Budget>,
    /// The row the cached selection was made for; none while the messages are lent out by
    /// [`HistoryCache::load`], so a history never handed back (a panicking hook) makes the next
    /// step start over.
    key: Option<Key>,
    lent: Option<Key>,
    summary: Option<String>,
    /// Settled messages of the active history, in seq order.
    messages: Vec<Message>,
    /// What `messages` and `summary` are charged to the budget.
    bytes: usize,
    /// The first seq a step still has to read.
    next: Seq,
}

impl HistoryCache {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        HistoryCache {
            budget,
            key: None,
            lent: None,
            summary: None,
            messages: Vec::new(),
            bytes: 0,
            next: Seq::ZERO,
        }
    }

    /// The session's parked cache, taken up again, or an empty one.
    pub(crate) fn unpark(budget: Arc<Budget>, session: &SessionId) -> Self {
        let kept = lock(&budget.parked).caches.remove(session);
        match kept {
            Some(kept) => HistoryCache {
                budget,
                key: Some(kept.key),
                lent: None,
                summary: kept.summary,
                messages: kept.messages,
                bytes: kept.bytes,
                next: kept.next,
            },
            None => HistoryCache::new(budget),
        }
    }

    /// Parks what an actor's cache holds for the session's next actor, leaving it empty.
    pub(crate) fn park_shared(cache: &std::sync::Mutex<HistoryCache>, session: &SessionId) {
        // A poisoned cache is parked all the same: `keep` leaves it consistent or empty.
        let mut cache = cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let empty = HistoryCache::new(cache.budget.clone());
        std::mem::replace(&mut *cache, empty).park(session);
    }

    /// Parks what the cache holds for the session's next actor (see the module's docs). An
    /// empty cache, or one whose history is lent out, parks nothing.
    pub(crate) fn park(mut self, session: &SessionId) {
        let Some(key) = self.key.take() else {
            return;
        };
        if self.messages.is_empty() && self.summary.is_none() {
            return;
        }
        let mut parked = lock(&self.budget.parked);
        parked.tickets += 1;
        let ticket = parked.tickets;
        let kept = Kept {
            key,
            summary: self.summary.take(),
            messages: std::mem::take(&mut self.messages),
            bytes: std::mem::take(&mut self.bytes),
            next: self.next,
            ticket,
        };
        if let Some(old) = parked.caches.insert(session.clone(), kept) {
            // Two actors of one session never live at once; if they did, the older cache goes.
            self.budget.give_back(old.bytes);
        }
        parked.order.push_back((session.clone(), ticket));
        if parked.order.len() > 2 * parked.caches.len() + 64 {
            let order = std::mem::take(&mut parked.order);
            parked.order = order.into_iter().filter(|e| parked.is_current(e)).collect();
        }
    }

    /// The active history of `row` in `snap` (as `Snapshot::history` with [`Mode::All`] selects
    /// it). Hand it back with [`HistoryCache::keep`] once used.
    pub(crate) fn load(
        &mut self,
        snap: &dyn Snapshot,
        session: &SessionId,
        row: &SessionRow,
    ) -> Result<History> {
        let key = (row.created, row.compaction, row.active_from);
        if self.key != Some(key) {
            self.clear();
            self.key = Some(key);
            self.next = history::load_from(row);
        }
        let fresh = snap.messages(session, self.next, usize::MAX)?;
        let fresh = history::select(row, fresh, Mode::All);
        let mut messages = std::mem::take(&mut self.messages);
        messages.extend(fresh.messages);
        self.lent = self.key.take();
        Ok(History {
            summary: self.summary.clone().or(fresh.summary),
            messages,
        })
    }

    /// Whether the cache holds a history (its last step's) small enough that loading it and
    /// building a request from it is cheaper than a hop to the blocking pool.
    pub(crate) fn holds_a_short_history(&self) -> bool {
        const MESSAGES: usize = 256;
        const BYTES: usize = 64 * 1024;
        self.key.is_some() && self.messages.len() <= MESSAGES && self.bytes <= BYTES
    }

    /// Keeps the settled front of `history`, which [`HistoryCache::load`] returned.
    pub(crate) fn keep(&mut self, history: History) {
        let History {
            summary,
            mut messages,
        } = history;
        let Some(key) = self.lent.take() else {
            self.clear();
            return;
        };
        let settled = messages.iter().take_while(|m| is_final(m)).count();
        messages.truncate(settled);
        // What the cache keeps is what it is charged for: no spare capacity.
        messages.shrink_to_fit();
        let bytes = summary.as_ref().map_or(0, String::len)
            + messages.iter().map(approx_bytes).sum::<usize>();
        self.budget.give_back(self.bytes);
        self.bytes = 0;
        if !self.budget.take(bytes) {
            // Over budget: this session reads its whole history, as without a cache.
            self.clear();
            return;
        }
        self.bytes = bytes;
        self.key = Some(key);
        if let Some(last) = messages.last() {
            self.next = last.seq().next();
        }
        self.summary = summary;
        self.messages = messages;
    }

    /// Starts over; the dropped contents give their bytes back.
    fn clear(&mut self) {
        *self = HistoryCache::new(self.budget.clone());
    }
}

impl Drop for HistoryCache {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// Whether a message of the active history can no longer change.
fn is_final(message: &Message) -> bool {
    match message {
        Message::User { .. } | Message::System { .. } => true,
        // A call held for approval changes when it is decided, started or refused.
        Message::Assistant(a) => {
            a.is_settled() && a.running_tools().next().is_none() && a.held_tools().next().is_none()
        }
        // Never in an active history; a running one would still change.
        Message::Compaction { .. } => false,
    }
}

/// A message's inline and heap size, roughly: the message itself, its id, its text and a fixed
/// size per part.
fn approx_bytes(message: &Message) -> usize {
    const ID: usize = 48;
    std::mem::size_of::<Message>()
        + ID
        + match message {
            Message::User { prompt, .. } => {
                prompt.text.len()
                    + prompt
                        .files
                        .iter()
                        .map(|f| f.url.len() + f.mime.len() + 64)
                        .sum::<usize>()
            }
            Message::System { text, .. } => text.len(),
            Message::Compaction { .. } => 0,
            Message::Assistant(a) => {
                a.agent.len()
                    + a.model.len()
                    + a.parts
                        .iter()
                        .map(|part| match part {
                            Part::Text { text, .. } => text.len() + std::mem::size_of::<Part>(),
                            Part::Reasoning { text, metadata, .. } => {
                                text.len()
                                    + metadata.as_ref().map_or(0, String::len)
                                    + std::mem::size_of::<Part>()
                            }
                            Part::Tool(t) => {
                                let result = match &t.state {
                                    ToolState::Completed { output, .. } => output.len(),
                                    ToolState::Error { error } => error.len(),
                                    ToolState::Running | ToolState::Held => 0,
                                };
                                t.call_id.len()
                                    + t.name.len()
                                    + t.input.len()
                                    + result
                                    + std::mem::size_of::<Part>()
                                    + std::mem::size_of::<agenthost_model::ToolPart>()
                            }
                            Part::Approval(a) => {
                                a.call_id.len()
                                    + a.digest.len()
                                    + a.decision.as_ref().map_or(0, |d| {
                                        d.by.as_ref().map_or(0, String::len)
                                            + d.reason.as_ref().map_or(0, String::len)
                                    })
                                    + std::mem::size_of::<Part>()
                            }
                        })
                        .sum::<usize>()
            }
        }
}

#[cfg(test)]
mod tests {
    use agenthost_model::{
        AssistantMessage, Delivery, Finish, MessageId, Prompt, Timestamp, ToolPart, Usage,
    };

    use super::*;

    fn user(seq: u64, text: &str) -> Message {
        Message::User {
            id: MessageId::parse(&format!("msg_u{seq}")).expect("valid"),
            seq: Seq(seq),
            admitted_seq: Seq(seq),
            delivery: Delivery::Queue,
            prompt: Prompt::text(text),
            time: Timestamp(0),
        }
    }

    fn assistant(seq: u64, finished: bool, tool: Option<ToolState>) -> Message {
        let mut parts = vec![Part::Text {
            text: "answer".into(),
            incomplete: false,
        }];
        parts.extend(tool.map(|state| {
            Part::Tool(ToolPart {
                call_id: "c1".into(),
                name: "noop".into(),
                input: "{}".into(),
                state,
            })
        }));
        Message::Assistant(AssistantMessage {
            id: MessageId::parse(&format!("msg_a{seq}")).expect("valid"),
            seq: Seq(seq),
            step: 1,
            agent: "default".into(),
            model: "m".into(),
            parts,
            finish: finished.then_some(Finish::Stop),
            error: None,
            usage: Usage::default(),
            retries: 0,
            created: Timestamp(0),
            completed: None,
        })
    }

    /// As `load` leaves the cache: its messages lent out for the key of a row.
    fn lend(cache: &mut HistoryCache) -> &mut HistoryCache {
        cache.lent = Some((Timestamp(0), None, Seq::ZERO));
        cache
    }

    fn history(messages: Vec<Message>) -> History {
        History {
            summary: None,
            messages,
        }
    }

    #[test]
    fn keeps_the_settled_front_and_charges_it() {
        let budget = Budget::new(1 << 20);
        let mut cache = HistoryCache::new(budget.clone());
        let done = ToolState::Completed {
            output: "ok".into(),
            truncated: false,
        };
        lend(&mut cache).keep(history(vec![
            user(1, "one"),
            assistant(3, true, Some(done)),
            user(5, "two"),
            // Still running a tool: this and everything after it is read again.
            assistant(7, true, Some(ToolState::Running)),
            user(9, "three"),
        ]));
        assert_eq!(cache.messages.len(), 3);
        assert_eq!(cache.next, Seq(6));
        assert!(cache.holds_a_short_history());
        assert_eq!(budget.used(), cache.bytes);
        assert!(cache.bytes > 0);
        // Nor is a settled step whose call waits for its approval: the decision changes it.
        lend(&mut cache).keep(history(vec![
            user(1, "one"),
            assistant(3, true, Some(ToolState::Held)),
        ]));
        assert_eq!(cache.messages.len(), 1);
        assert_eq!(cache.next, Seq(2));
        // An unsettled step is not final either.
        lend(&mut cache).keep(history(vec![user(1, "one"), assistant(3, false, None)]));
        assert_eq!(cache.messages.len(), 1);
        assert_eq!(cache.next, Seq(2));
        assert_eq!(budget.used(), cache.bytes);
        // A history handed back without having been lent (its loan was lost) is not kept.
        cache.keep(history(vec![user(1, "one")]));
        assert!(cache.messages.is_empty() && cache.key.is_none());
        assert_eq!(budget.used(), 0);
        lend(&mut cache).keep(history(vec![user(1, "one")]));
        drop(cache);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_long_history_is_not_short() {
        let mut cache = HistoryCache::new(Budget::new(1 << 30));
        lend(&mut cache).keep(history(vec![user(1, &"x".repeat(70 * 1024))]));
        assert_eq!(cache.messages.len(), 1, "kept");
        assert!(!cache.holds_a_short_history(), "too many bytes");
        let many = (0..300).map(|n| user(n, "hi")).collect();
        lend(&mut cache).keep(history(many));
        assert!(!cache.holds_a_short_history(), "too many messages");
    }

    #[test]
    fn a_history_over_budget_is_not_kept() {
        let budget = Budget::new(400);
        let mut small = HistoryCache::new(budget.clone());
        lend(&mut small).keep(history(vec![user(1, "one")]));
        assert_eq!(small.messages.len(), 1);
        let mut large = HistoryCache::new(budget.clone());
        assert!(
            !large.holds_a_short_history(),
            "an empty cache holds nothing"
        );
        lend(&mut large).keep(history(vec![user(1, &"x".repeat(300))]));
        assert!(large.messages.is_empty());
        assert!(!large.holds_a_short_history());
        assert_eq!(large.next, Seq::ZERO);
        assert_eq!(budget.used(), small.bytes);
        // Off: nothing is ever kept.
        let off = Budget::new(0);
        let mut none = HistoryCache::new(off.clone());
        lend(&mut none).keep(history(vec![user(1, "one")]));
        assert!(none.messages.is_empty());
        assert_eq!(off.used(), 0);
    }

    fn session(n: u32) -> SessionId {
        SessionId::parse(&format!("ses_p{n}")).expect("valid")
    }

    #[test]
    fn a_parked_cache_is_taken_up_evicted_oldest_first_or_dropped() {
        let budget = Budget::new(1 << 20);
        let mut first = HistoryCache::new(budget.clone());
        lend(&mut first).keep(history(vec![user(1, "one"), user(2, "two")]));
        let charged = first.bytes;
        first.park(&session(1));
        assert_eq!(
            (budget.parked(), budget.used()),
            (1, charged),
            "still charged"
        );
        // The session's next actor takes it up whole; another session's starts empty.
        let again = HistoryCache::unpark(budget.clone(), &session(1));
        assert_eq!((again.messages.len(), again.next), (2, Seq(3)));
        assert!(again.holds_a_short_history());
        assert!(
            HistoryCache::unpark(budget.clone(), &session(2))
                .key
                .is_none()
        );
        assert_eq!((budget.parked(), budget.used()), (0, charged));
        drop(again);
        assert_eq!(budget.used(), 0);
        // An empty cache parks nothing.
        HistoryCache::new(budget.clone()).park(&session(3));
        assert_eq!(budget.parked(), 0);

        // A cache that needs room evicts parked ones, oldest first.
        let one = {
            let mut c = HistoryCache::new(budget.clone());
            lend(&mut c).keep(history(vec![user(1, "x")]));
            c.bytes
        };
        let tight = Budget::new(2 * one);
        for n in [1, 2] {
            let mut c = HistoryCache::new(tight.clone());
            lend(&mut c).keep(history(vec![user(1, "x")]));
            c.park(&session(n));
        }
        let mut live = HistoryCache::new(tight.clone());
        lend(&mut live).keep(history(vec![user(1, "y")]));
        assert_eq!(live.messages.len(), 1, "room was made");
        assert!(
            HistoryCache::unpark(tight.clone(), &session(1))
                .key
                .is_none(),
            "evicted"
        );
        assert!(
            HistoryCache::unpark(tight.clone(), &session(2))
                .key
                .is_some(),
            "kept"
        );
        // Parking the same session over and over keeps its stale tickets bounded.
        for _ in 0..1000 {
            let c = HistoryCache::unpark(tight.clone(), &session(2));
            c.park(&session(2));
        }
        assert!(
            lock(&tight.parked).order.len() <= 2 + 64 + 1,
            "one parked cache, its stale tickets compacted"
        );
        // Nobody waits any more: every parked cache goes, and gives its bytes back.
        drop(live);
        tight.drop_parked();
        assert_eq!((tight.parked(), tight.used()), (0, 0));
    }
}
