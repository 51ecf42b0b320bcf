//! Schedules (ARCHITECTURE.md, "Schedules"): when a schedule fires next, what a due schedule's
//! firing writes (decisions as data), and the runtime's one timeline of armed schedules. The
//! task that fires them, and the operations, are the runtime's (`runtime::schedules`).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::str::FromStr as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use agenthost_model::{CatchUp, Schedule, ScheduleId, SessionId, Timestamp, When};
use chrono::TimeZone as _;
use tokio::sync::Notify;

/// By default, a firing at most this late counts as on time (a busy machine, a slow start); one
/// later was missed, and the schedule's `catch_up` decides (`limits.schedule_grace`).
pub const GRACE_MS: u64 = 60_000;

/// A five-field cron expression in a time zone, checked.
#[derive(Debug, Clone)]
pub(crate) struct Cron {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
}

impl Cron {
    /// Parses `expr` (five fields: minute, hour, day of month, month, day of week; the
    /// smallest interval is a minute) in `tz` (an IANA zone; UTC when `None`). An error names
    /// the field at fault (`cron:` or `tz:`).
    pub(crate) fn parse(expr: &str, tz: Option<&str>) -> Result<Cron, String> {
        let fields = expr.split_whitespace().count();
        if fields != 5 && !expr.trim_start().starts_with('@') {
            return Err(format!(
                "cron: {expr:?} has {fields} fields; a cron expression has five (minute, hour, \
                 day of month, month, day of week)"
            ));
        }
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .year(croner::parser::Year::Disallowed)
            .build();
        let cron = parser
            .parse(expr)
            .map_err(|e| format!("cron: {expr:?} is not a cron expression: {e}"))?;
        let tz = match tz {
            None => chrono_tz::UTC,
            Some(name) => chrono_tz::Tz::from_str(name)
                .map_err(|_| format!("tz: {name:?} is not an IANA time zone"))?,
        };
        Ok(Cron { cron, tz })
    }

    /// The first time it names strictly after `after`.
    pub(crate) fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let start = self
            .tz
            .timestamp_millis_opt(i64::try_from(after.0).ok()?)
            .single()?;
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok().map(Timestamp)
    }
}

/// When `when` fires next after `after`: never again for a one-shot.
pub(crate) fn next_after(when: &When, after: Timestamp) -> Result<Option<Timestamp>, String> {
    match when {
        When::Once => Ok(None),
        When::Cron { expr, tz } => Ok(Cron::parse(expr, tz.as_deref())?.next_after(after)),
    }
}

/// What the firing of a due schedule writes: the firing time it consumes, whether it admits
/// the prompt (or skips a missed firing), and when the schedule fires next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Firing {
    pub at: Timestamp,
    pub admit: bool,
    pub next: Option<Timestamp>,
}

/// The firing of `schedule` at `now`, or `None` while it is not due. A firing more than `grace`
/// (ms) late was missed (no process ran): `CatchUp::Once` admits it once, `Skip` does not;
/// either way the next firing is the first after `now`, so however many were missed, at most
/// one is admitted.
pub(crate) fn firing(
    schedule: &Schedule,
    now: Timestamp,
    grace: u64,
) -> Result<Option<Firing>, String> {
    if schedule.next > now {
        return Ok(None);
    }
    let late = now.0 - schedule.next.0;
    let admit = late <= grace || schedule.catch_up == CatchUp::Once;
    let next = next_after(&schedule.when, now.max(schedule.next))?;
    Ok(Some(Firing {
        at: schedule.next,
        admit,
        next,
    }))
}

/// Keys ordered by a time, one time per key: the earliest first.
#[derive(Debug)]
pub(crate) struct Timeline<K> {
    by_time: BTreeSet<(Timestamp, K)>,
    by_key: HashMap<K, Timestamp>,
}

impl<K> Default for Timeline<K> {
    fn default() -> Self {
        Timeline {
            by_time: BTreeSet::new(),
            by_key: HashMap::new(),
        }
    }
}

impl<K: Ord + Hash + Clone> Timeline<K> {
    /// `key` is due at `at` (replacing when it was due before).
    pub(crate) fn set(&mut self, key: K, at: Timestamp) {
        self.clear(&key);
        self.by_time.insert((at, key.clone()));
        self.by_key.insert(key, at);
    }

    pub(crate) fn clear(&mut self, key: &K) {
        if let Some(at) = self.by_key.remove(key) {
            self.by_time.remove(&(at, key.clone()));
        }
    }

    #[cfg(test)]
    pub(crate) fn get(&self, key: &K) -> Option<Timestamp> {
        self.by_key.get(key).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_key.keys()
    }

    /// Takes the keys due at `now`, earliest first, and says when the next one is.
    pub(crate) fn due(&mut self, now: Timestamp) -> (Vec<K>, Option<Timestamp>) {
        let mut due = Vec::new();
        while let Some((at, key)) = self.by_time.first().cloned() {
            if at > now {
                return (due, Some(at));
            }
            self.clear(&key);
            due.push(key);
        }
        (due, None)
    }
}

/// A schedule by its session and id.
pub(crate) type Key = (SessionId, ScheduleId);

/// The runtime's armed schedules: one timeline and one task for all of them, never a task per
/// schedule. Fed from the store at start and on a takeover, and by every schedule set here.
#[derive(Debug, Default)]
pub(crate) struct Armed {
    timeline: Mutex<Timeline<Key>>,
    pub(crate) changed: Notify,
    count: AtomicUsize,
}

impl Armed {
    fn update<T>(&self, f: impl FnOnce(&mut Timeline<Key>) -> T) -> T {
        let mut timeline = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        let out = f(&mut timeline);
        self.count.store(timeline.len(), Ordering::Release);
        out
    }

    /// Arms `key` for `at`, waking the timer when it is the new earliest.
    pub(crate) fn arm(&self, key: Key, at: Timestamp) {
        self.update(|t| t.set(key, at));
        self.changed.notify_one();
    }

    pub(crate) fn disarm(&self, key: &Key) {
        self.update(|t| t.clear(key));
    }

    pub(crate) fn due(&self, now: Timestamp) -> (Vec<Key>, Option<Timestamp>) {
        self.update(|t| t.due(now))
    }

    /// Disarms every schedule whose session `keep` refuses (a partition this node lost).
    pub(crate) fn retain(&self, keep: impl Fn(&SessionId) -> bool) {
        self.update(|t| {
            let lost: Vec<Key> = t.keys().filter(|(s, _)| !keep(s)).cloned().collect();
            for key in &lost {
                t.clear(key);
            }
        });
    }

    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub(crate) fn when(&self, key: &Key) -> Option<Timestamp> {
        self.timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
    }
}

#[cfg(test)]
mod tests {
    use agenthost_model::{Delivery, Prompt};

    use super::*;

    /// 2026-12-03T10:00:00Z.
    const T: u64 = 1_796_292_000_000;
    const MINUTE: u64 = 60_000;

    fn schedule(when: When, next: u64, catch_up: CatchUp) -> Schedule {
        Schedule {
            id: ScheduleId::parse("sch_a").expect("id"),
            prompt: Prompt::text("wake up"),
            delivery: Delivery::Steer,
            when,
            catch_up,
            next: Timestamp(next),
        }
    }

    fn every_minute() -> When {
        When::Cron {
            expr: "* * * * *".into(),
            tz: None,
        }
    }

    #[test]
    fn cron_expressions_are_five_fields_in_a_time_zone() {
        let cron = Cron::parse("30 9 * * *", Some("Europe/Berlin")).expect("valid");
        // 10:00Z is 11:00 in Berlin: the next 09:30 there is 08:30Z the next day.
        assert_eq!(
            cron.next_after(Timestamp(T)),
            Some(Timestamp(T + 22 * 60 * MINUTE + 30 * MINUTE))
        );
        let utc = Cron::parse("*/15 * * * *", None).expect("valid");
        assert_eq!(
            utc.next_after(Timestamp(T)),
            Some(Timestamp(T + 15 * MINUTE))
        );
        assert_eq!(
            utc.next_after(Timestamp(T + 1)),
            Some(Timestamp(T + 15 * MINUTE))
        );
        for bad in ["* * * *", "* * * * * *", "61 * * * *", "nonsense"] {
            assert!(Cron::parse(bad, None).is_err(), "{bad}");
        }
        assert!(Cron::parse("* * * * *", Some("Mars/Olympus")).is_err());
    }

    #[test]
    fn a_due_firing_admits_once_and_moves_on_to_the_first_time_after_now() {
        let once = schedule(When::Once, T, CatchUp::Once);
        assert_eq!(firing(&once, Timestamp(T - 1), GRACE_MS), Ok(None));
        assert_eq!(
            firing(&once, Timestamp(T + 5), GRACE_MS),
            Ok(Some(Firing {
                at: Timestamp(T),
                admit: true,
                next: None
            }))
        );
        let cron = schedule(every_minute(), T, CatchUp::Once);
        assert_eq!(
            firing(&cron, Timestamp(T + 1), GRACE_MS),
            Ok(Some(Firing {
                at: Timestamp(T),
                admit: true,
                next: Some(Timestamp(T + MINUTE))
            }))
        );
    }

    #[test]
    fn missed_firings_are_caught_up_once_or_skipped() {
        // Down for an hour: sixty firings missed.
        let now = Timestamp(T + 60 * MINUTE + 10);
        let once = schedule(every_minute(), T, CatchUp::Once);
        assert_eq!(
            firing(&once, now, GRACE_MS),
            Ok(Some(Firing {
                at: Timestamp(T),
                admit: true,
                next: Some(Timestamp(T + 61 * MINUTE))
            }))
        );
        let skip = schedule(every_minute(), T, CatchUp::Skip);
        assert_eq!(
            firing(&skip, now, GRACE_MS),
            Ok(Some(Firing {
                at: Timestamp(T),
                admit: false,
                next: Some(Timestamp(T + 61 * MINUTE))
            }))
        );
        // Late within the grace: on time, whatever the catch-up.
        let late = schedule(When::Once, T, CatchUp::Skip);
        assert!(
            firing(&late, Timestamp(T + GRACE_MS), GRACE_MS)
                .expect("ok")
                .expect("due")
                .admit
        );
        assert!(
            !firing(&late, Timestamp(T + GRACE_MS + 1), GRACE_MS)
                .expect("ok")
                .expect("due")
                .admit
        );
    }

    #[test]
    fn the_timeline_hands_out_due_keys_in_order_and_keeps_one_time_per_key() {
        let mut t = Timeline::default();
        t.set("a", Timestamp(30));
        t.set("b", Timestamp(10));
        t.set("c", Timestamp(20));
        t.set("a", Timestamp(15));
        t.clear(&"c");
        assert_eq!(t.len(), 2);
        assert_eq!(t.due(Timestamp(9)), (vec![], Some(Timestamp(10))));
        assert_eq!(t.due(Timestamp(15)), (vec!["b", "a"], None));
        assert_eq!(t.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn arming_wakes_the_timer_and_a_lost_partition_disarms_its_schedules() {
        let armed = std::sync::Arc::new(Armed::default());
        let (s1, s2) = (
            SessionId::parse("ses_one").expect("id"),
            SessionId::parse("ses_two").expect("id"),
        );
        let id = ScheduleId::parse("sch_x").expect("id");
        let waiter = {
            let armed = armed.clone();
            tokio::spawn(async move { armed.changed.notified().await })
        };
        tokio::task::yield_now().await;
        armed.arm((s1.clone(), id.clone()), Timestamp(100));
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("the timer was woken")
            .expect("joined");
        armed.arm((s2.clone(), id.clone()), Timestamp(50));
        assert_eq!(armed.len(), 2);
        armed.retain(|s| *s == s1);
        assert_eq!(armed.len(), 1);
        assert_eq!(armed.when(&(s1.clone(), id.clone())), Some(Timestamp(100)));
        assert_eq!(armed.due(Timestamp(100)).0, vec![(s1, id)]);
    }
}
