//! The runtime's schedule operations (ARCHITECTURE.md, "Schedules"): set, list and cancel a
//! session's schedules, arm them from the store at start and on a takeover, and the one task that
//! fires every armed schedule when it is due: the prompt's admission and the firing in one
//! commit, then a wake.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use agenthost_model::{
    CatchUp, Delivery, Event, Prompt, Schedule, ScheduleId, SessionId, Timestamp, When,
};
use agenthost_store::Action;
use futures::future::BoxFuture;
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};
use crate::runtime::Runtime;
use crate::schedules::{Cron, Key, firing};
use crate::shared::Shared;
use crate::tools::{Call, Executor, Tool};

/// A schedule to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSchedule {
    /// A client-chosen id (an exact retry returns the schedule as it is); minted when absent.
    pub id: Option<ScheduleId>,
    pub text: String,
    pub delivery: Delivery,
    pub when: ScheduleAt,
    pub catch_up: CatchUp,
}

/// When a new schedule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleAt {
    /// Once, at this time.
    At(Timestamp),
    /// Once, this long from now.
    After(Duration),
    /// At every time a five-field cron expression names, in `tz` (an IANA zone; UTC when
    /// `None`).
    Cron { expr: String, tz: Option<String> },
}

/// The longest the timer sleeps before it looks at the wall clock again.
const LONGEST_NAP: Duration = Duration::from_secs(30);

impl Runtime {
    /// Sets a schedule of `session`; see [`set`].
    pub async fn set_schedule(&self, session: &SessionId, new: NewSchedule) -> Result<Schedule> {
        self.check_open()?;
        set(&self.shared, session, new).await
    }

    /// The session's schedules, in id order, each with its next firing.
    pub async fn schedules(&self, session: &SessionId) -> Result<Vec<Schedule>> {
        list(&self.shared, session).await
    }

    /// Cancels a schedule; `false` (and nothing written) when the session has none of that id.
    pub async fn cancel_schedule(&self, session: &SessionId, id: &ScheduleId) -> Result<bool> {
        self.check_open()?;
        cancel(&self.shared, session, id).await
    }

    /// Schedules armed in this process.
    pub fn armed_schedules(&self) -> usize {
        self.shared.schedules.len()
    }

    pub(crate) fn check_owner(&self, session: &SessionId) -> Result<()> {
        check_owner(&self.shared, session)
    }

    /// The fence of a write this node makes for `session`, in a cluster.
    pub(crate) fn fence(&self, session: &SessionId) -> Vec<Action> {
        fence(&self.shared, session)
    }
}

/// Sets a schedule of `session`. With an `id` that exists already: the same schedule again
/// (text, delivery, kind) returns it unchanged; another one is `Conflict`. Refused, with
/// nothing written: an invalid time, expression or zone, an empty or too large text, and a
/// session with `limits.schedules_per_session` schedules already.
pub(crate) async fn set(
    shared: &Shared,
    session: &SessionId,
    new: NewSchedule,
) -> Result<Schedule> {
    check_owner(shared, session)?;
    let now = agenthost_store::system_clock();
    let prompt = Prompt::text(new.text.clone());
    prompt.validate(shared.prompt_limit)?;
    let (when, next) = match &new.when {
        ScheduleAt::At(at) if *at < now => {
            return Err(Error::Invalid(format!("at: {} is in the past", at.0)));
        }
        ScheduleAt::At(at) => (When::Once, *at),
        ScheduleAt::After(after) => (
            When::Once,
            Timestamp(now.0.saturating_add(after.as_millis() as u64)),
        ),
        ScheduleAt::Cron { expr, tz } => {
            let cron = Cron::parse(expr, tz.as_deref()).map_err(Error::Invalid)?;
            let next = cron
                .next_after(now)
                .ok_or_else(|| Error::Invalid(format!("cron: {expr:?} names no time to come")))?;
            (
                When::Cron {
                    expr: expr.clone(),
                    tz: tz.clone(),
                },
                next,
            )
        }
    };
    let id = match new.id.clone() {
        Some(id) => id,
        None => crate::mint::schedule_id(),
    };
    if id.as_str().len() - ScheduleId::PREFIX.len() > ScheduleId::MAX_BODY {
        return Err(Error::Invalid(format!(
            "id: a schedule id has at most {} characters after `sch_`",
            ScheduleId::MAX_BODY
        )));
    }
    let schedule = Schedule {
        id: id.clone(),
        prompt,
        delivery: new.delivery,
        when,
        catch_up: new.catch_up,
        next,
    };
    let existing = list(shared, session).await?;
    if let Some(found) = existing.iter().find(|s| s.id == id) {
        let same = found.prompt == schedule.prompt
            && found.delivery == schedule.delivery
            && found.when == schedule.when
            && found.catch_up == schedule.catch_up;
        return match same {
            true => Ok(found.clone()),
            false => Err(Error::ScheduleConflict(format!(
                "schedule {id} exists with another text, delivery or time"
            ))),
        };
    }
    let limit = shared.limits.schedules_per_session;
    if existing.len() >= limit {
        return Err(Error::Invalid(format!(
            "session {session} has {} schedules, the most it may have \
                 (limits.schedules_per_session); cancel one first",
            existing.len()
        )));
    }
    let mut actions = fence(shared, session);
    actions.push(Action::Append(Event::ScheduleSet {
        schedule: schedule.clone(),
    }));
    shared.store.write(session.clone(), actions).await?;
    shared.schedules.arm((session.clone(), id), schedule.next);
    Ok(schedule)
}

/// The session's schedules, in id order.
pub(crate) async fn list(shared: &Shared, session: &SessionId) -> Result<Vec<Schedule>> {
    let (store, session) = (shared.store.clone(), session.clone());
    tokio::task::spawn_blocking(move || {
        let snap = store.snapshot()?;
        snap.session(&session)?
            .ok_or_else(|| Error::SessionNotFound(session.clone()))?;
        Ok(snap.schedules(&session)?)
    })
    .await
    .map_err(|e| Error::Unavailable(e.to_string()))?
}

/// Cancels a schedule; `false` (and nothing written) when the session has none of that id.
pub(crate) async fn cancel(shared: &Shared, session: &SessionId, id: &ScheduleId) -> Result<bool> {
    check_owner(shared, session)?;
    if !list(shared, session).await?.iter().any(|s| s.id == *id) {
        return Ok(false);
    }
    let mut actions = fence(shared, session);
    actions.push(Action::Append(Event::ScheduleCancelled { id: id.clone() }));
    match shared.store.write(session.clone(), actions).await {
        Ok(_) => {}
        // Fired for the last time, or cancelled, since the read: gone either way.
        Err(agenthost_store::Error::Violation(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    shared.schedules.disarm(&(session.clone(), id.clone()));
    Ok(true)
}

fn check_owner(shared: &Shared, session: &SessionId) -> Result<()> {
    match shared.store.ownership().is_none_or(|o| o.owns(session)) {
        true => Ok(()),
        false => Err(Error::Unavailable(format!(
            "this node does not own session {session}; another node runs it"
        ))),
    }
}

/// The fence of a write this node makes for `session`, in a cluster.
fn fence(shared: &Shared, session: &SessionId) -> Vec<Action> {
    shared
        .store
        .ownership()
        .and_then(|o| o.epoch(session))
        .map(Action::Fence)
        .into_iter()
        .collect()
}

/// Arms every schedule of a session this node owns, from the store: at start, and after a
/// takeover (arming again is harmless). One read for all of them, on the blocking pool.
pub(crate) async fn load(runtime: &Runtime) {
    let reader = runtime.clone();
    let all = tokio::task::spawn_blocking(move || -> Result<Vec<(SessionId, Schedule)>> {
        Ok(reader.snapshot()?.all_schedules()?)
    })
    .await;
    match all {
        Ok(Ok(all)) => {
            let mut armed = 0;
            for (session, schedule) in all {
                if runtime.owns(&session) {
                    runtime
                        .shared
                        .schedules
                        .arm((session, schedule.id), schedule.next);
                    armed += 1;
                }
            }
            if armed > 0 {
                tracing::info!(schedules = armed, "schedules armed");
            }
        }
        Ok(Err(e)) => tracing::error!(error = %e, "could not read the schedules"),
        Err(e) => tracing::error!(error = %e, "could not read the schedules"),
    }
}

/// The timer: fires every armed schedule when it is due, earliest first. Ends with the runtime.
pub(crate) async fn run(runtime: Runtime) {
    let armed = &runtime.shared.schedules;
    loop {
        let (due, next) = armed.due(agenthost_store::system_clock());
        for key in due {
            if let Err(e) = fire(&runtime, &key).await {
                tracing::warn!(session_id = %key.0, schedule = %key.1, error = %e, "a schedule could not fire; retrying");
                // Tried again shortly: the store may be full or away for a moment.
                let again = Timestamp(agenthost_store::system_clock().0 + 1_000);
                armed.arm(key, again);
            }
        }
        let nap = next.map_or(LONGEST_NAP, |at| {
            let now = agenthost_store::system_clock();
            Duration::from_millis(at.0.saturating_sub(now.0)).min(LONGEST_NAP)
        });
        tokio::select! {
            _ = runtime.shared.stopping.cancelled() => return,
            _ = armed.changed.notified() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// Fires the schedule `key` if it is due: its prompt's admission (id derived from the schedule
/// and the firing time) and the firing in one commit, then a wake; re-armed for its next time.
/// A schedule gone, not due, or fired by someone else meanwhile is left as the store has it.
async fn fire(runtime: &Runtime, key: &Key) -> Result<()> {
    let (session, id) = key;
    if !runtime.owns(session) || runtime.shared.is_shutting_down() {
        return Ok(());
    }
    let found = runtime
        .schedules(session)
        .await?
        .into_iter()
        .find(|s| s.id == *id);
    let Some(schedule) = found else {
        return Ok(());
    };
    let now = agenthost_store::system_clock();
    let grace = runtime.shared.limits.schedule_grace.as_millis() as u64;
    let Some(firing) = firing(&schedule, now, grace).map_err(Error::Invalid)? else {
        // Not due yet (armed early by a stale time): armed for when it is.
        runtime.shared.schedules.arm(key.clone(), schedule.next);
        return Ok(());
    };
    let mut actions = runtime.fence(session);
    let admitted = id.firing(firing.at);
    if firing.admit {
        actions.push(Action::Append(Event::PromptAdmitted {
            id: admitted.clone(),
            delivery: schedule.delivery,
            prompt: schedule.prompt.clone(),
            wake: true,
        }));
    }
    actions.push(Action::Append(Event::ScheduleFired {
        id: id.clone(),
        at: firing.at,
        next: firing.next,
        admitted: firing.admit,
    }));
    match runtime.shared.store.write(session.clone(), actions).await {
        Ok(_) => {}
        // Fired (or cancelled) by someone else since the read: what the store holds stands.
        Err(agenthost_store::Error::Violation(v)) => {
            tracing::info!(session_id = %session, schedule = %id, reason = %v, "the schedule moved on meanwhile");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(session_id = %session, schedule = %id, at = firing.at.0, admitted = firing.admit, "schedule fired");
    if let Some(next) = firing.next {
        runtime.shared.schedules.arm(key.clone(), next);
    }
    if firing.admit {
        for hook in &runtime.shared.hooks {
            hook.on_admitted(session, &admitted);
        }
        if let Err(e) = runtime.wake(session).await {
            tracing::warn!(session_id = %session, error = %e, "a schedule's input was admitted, but the wake failed; the sweep will wake it");
        }
    }
    Ok(())
}

/// Parses an RFC 3339 time (`2026-12-03T10:00:00Z`, or with an offset) into ms since the Unix
/// epoch.
pub fn parse_time(text: &str) -> std::result::Result<Timestamp, String> {
    let time = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
    u64::try_from(time.timestamp_millis())
        .map(Timestamp)
        .map_err(|_| format!("{text:?} is before 1970"))
}

/// A time as RFC 3339, in UTC with milliseconds.
pub fn format_time(time: Timestamp) -> String {
    i64::try_from(time.0)
        .ok()
        .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| time.0.to_string())
}

/// The runtime's shared state, for the built-in tools (set once the runtime exists; weak, so a
/// tool never keeps a stopped runtime alive).
pub(crate) type Handle = Arc<OnceLock<Weak<Shared>>>;

/// The built-in tools an agent may be given by naming them in its `tools` (a glob never
/// matches them): `schedule_wakeup {text, after_ms | at}` and `cancel_wakeup {id}`. A wake-up's
/// schedule id is derived from its call's idempotency key, so the call run again after a crash
/// sets the same schedule, once.
pub(crate) fn builtins(handle: &Handle) -> Vec<Tool> {
    let mut wakeup = Tool::new(
        "schedule_wakeup",
        "Schedules a message to yourself in this session, delivered later: after `after_ms` \
         milliseconds, or at `at` (an RFC 3339 time). Returns the wake-up's id.",
        serde_json::json!({
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "What the wake-up says to you."},
                "after_ms": {"type": "integer", "minimum": 1},
                "at": {"type": "string", "description": "An RFC 3339 time."}
            },
            "required": ["text"]
        }),
        Arc::new(Wakeup {
            handle: handle.clone(),
            cancel: false,
        }),
    );
    wakeup.builtin = true;
    wakeup.idempotent = true;
    let mut cancel = Tool::new(
        "cancel_wakeup",
        "Cancels a wake-up that `schedule_wakeup` scheduled, by its id.",
        serde_json::json!({
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"]
        }),
        Arc::new(Wakeup {
            handle: handle.clone(),
            cancel: true,
        }),
    );
    cancel.builtin = true;
    cancel.idempotent = true;
    vec![wakeup, cancel]
}

#[derive(Debug)]
struct Wakeup {
    handle: Handle,
    cancel: bool,
}

impl Executor for Wakeup {
    fn execute(&self, call: Call) -> BoxFuture<'static, std::result::Result<String, String>> {
        let shared = self.handle.get().and_then(Weak::upgrade);
        let cancel = self.cancel;
        Box::pin(async move {
            let shared = shared.ok_or_else(|| "the runtime is stopping".to_owned())?;
            let input = &call.input;
            if cancel {
                let id = input["id"]
                    .as_str()
                    .and_then(|id| ScheduleId::parse(id).ok())
                    .ok_or_else(|| "id: a wake-up id (`sch_…`) is required".to_owned())?;
                return match self::cancel(&shared, &call.session, &id).await {
                    Ok(true) => Ok(format!("cancelled {id}")),
                    Ok(false) => Ok(format!("no wake-up {id} is scheduled")),
                    Err(e) => Err(e.to_string()),
                };
            }
            let text = input["text"]
                .as_str()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| "text: required, and not empty".to_owned())?;
            let when = match (input.get("after_ms"), input.get("at")) {
                (Some(after), None) => ScheduleAt::After(Duration::from_millis(
                    after
                        .as_u64()
                        .filter(|ms| *ms > 0)
                        .ok_or_else(|| "after_ms: a positive integer".to_owned())?,
                )),
                (None, Some(at)) => ScheduleAt::At(parse_time(
                    at.as_str()
                        .ok_or_else(|| "at: an RFC 3339 time".to_owned())?,
                )?),
                _ => return Err("give exactly one of after_ms and at".to_owned()),
            };
            let digest = Sha256::digest(call.idempotency_key().as_bytes());
            let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
            let id = ScheduleId::parse(&format!("{}w{hex}", ScheduleId::PREFIX))
                .map_err(|e| e.to_string())?;
            let new = NewSchedule {
                id: Some(id),
                text: text.to_owned(),
                delivery: Delivery::Steer,
                when,
                catch_up: CatchUp::Once,
            };
            let schedule = set(&shared, &call.session, new)
                .await
                .map_err(|e| e.to_string())?;
            Ok(serde_json::json!({
                "id": schedule.id.to_string(),
                "at": format_time(schedule.next),
            })
            .to_string())
        })
    }
}
