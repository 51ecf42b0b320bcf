//! Schedules through the runtime (ARCHITECTURE.md, "Schedules"): a firing admits its prompt once
//! and the session answers it; cron schedules move on to their next time and stop when
//! cancelled; a restart fires what came due meanwhile, catching missed firings up once or
//! skipping them; the built-in wake-up tool; and every bad request refused with nothing written.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Error, Extensions, NewSchedule, PromptRequest, Runtime, ScheduleAt};
use agenthost_llm::FinishReason;
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_model::{
    CatchUp, Delivery, Event, Prompt, Schedule, ScheduleId, SessionId, Timestamp, When,
};
use agenthost_store::{Config as StoreConfig, RedbStore, Store};

use crate::harness::{self, Harness, text, user_texts};

fn once(text: &str, after_ms: u64) -> NewSchedule {
    NewSchedule {
        id: None,
        text: text.into(),
        delivery: Delivery::Steer,
        when: ScheduleAt::After(Duration::from_millis(after_ms)),
        catch_up: CatchUp::Once,
    }
}

fn log(runtime: &Runtime, s: &SessionId) -> Vec<Event> {
    runtime
        .snapshot()
        .expect("snap")
        .events(s, agenthost_model::Seq::ZERO, usize::MAX)
        .expect("events")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn admissions(events: &[Event]) -> Vec<agenthost_model::MessageId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PromptAdmitted { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_schedule_fires_once_and_is_answered() {
    let h = Harness::start([text("good morning")]).await;
    let s = h.session().await;
    let schedule = h
        .runtime
        .set_schedule(&s, once("wake up", 200))
        .await
        .expect("set");
    let listed = h.runtime.schedules(&s).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0], schedule);
    until("the firing's answer", || h.provider.calls() == 1).await;
    h.idle(&s).await;
    assert_eq!(user_texts(&h.provider.requests()[0]), ["wake up"]);
    let events = h.log(&s);
    assert_eq!(admissions(&events), [schedule.id.firing(schedule.next)]);
    assert!(events.iter().any(|e| matches!(
        e,
        Event::ScheduleFired {
            next: None,
            admitted: true,
            ..
        }
    )));
    assert!(h.runtime.schedules(&s).await.expect("list").is_empty());
    assert_eq!(h.runtime.armed_schedules(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_and_change_nothing() {
    let h = Harness::start_with(
        [],
        |c| c.limits.schedules_per_session = 2,
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    let seq = h.row(&s).last_seq;
    let cron = |expr: &str, tz: Option<&str>| NewSchedule {
        when: ScheduleAt::Cron {
            expr: expr.into(),
            tz: tz.map(str::to_owned),
        },
        ..once("tick", 1)
    };
    for bad in [
        cron("* * * *", None),
        cron("* * * * * *", None),
        cron("* * * * *", Some("Nowhere/Special")),
        NewSchedule {
            when: ScheduleAt::At(Timestamp(1_000)),
            ..once("late", 1)
        },
        once("", 100),
        NewSchedule {
            id: Some(ScheduleId::parse(&format!("sch_{}", "x".repeat(41))).expect("id")),
            ..once("long id", 100)
        },
    ] {
        let refused = h.runtime.set_schedule(&s, bad.clone()).await;
        assert!(
            matches!(refused, Err(Error::Invalid(_))),
            "{bad:?} gave {refused:?}"
        );
    }
    // Each refusal names the field at fault.
    for (bad, field) in [
        (cron("* * * *", None), "cron:"),
        (cron("* * * * *", Some("Nowhere/Special")), "tz:"),
    ] {
        let refused = h.runtime.set_schedule(&s, bad).await;
        assert!(
            matches!(&refused, Err(Error::Invalid(m)) if m.starts_with(field)),
            "{refused:?} does not start with {field}"
        );
    }
    assert_eq!(h.row(&s).last_seq, seq, "nothing was written");
    // An exact retry returns the schedule; the same id with another text is a conflict.
    let id = ScheduleId::parse("sch_daily").expect("id");
    let daily = NewSchedule {
        id: Some(id.clone()),
        ..cron("0 9 * * *", Some("Europe/Berlin"))
    };
    let set = h
        .runtime
        .set_schedule(&s, daily.clone())
        .await
        .expect("set");
    assert_eq!(
        h.runtime.set_schedule(&s, daily.clone()).await,
        Ok(set.clone())
    );
    let other = NewSchedule {
        text: "another".into(),
        ..daily.clone()
    };
    assert!(matches!(
        h.runtime.set_schedule(&s, other).await,
        Err(Error::ScheduleConflict(_))
    ));
    h.runtime
        .set_schedule(&s, once("second", 60_000))
        .await
        .expect("set");
    let third = h.runtime.set_schedule(&s, once("third", 60_000)).await;
    assert!(matches!(third, Err(Error::Invalid(_))), "{third:?}");
    // Cancelling is idempotent.
    assert!(h.runtime.cancel_schedule(&s, &id).await.expect("cancel"));
    assert!(!h.runtime.cancel_schedule(&s, &id).await.expect("cancel"));
    assert_eq!(h.runtime.schedules(&s).await.expect("list").len(), 1);
}

/// A store whose session has `schedule`, as a process left it.
async fn stored(path: &Path, schedule: Schedule) -> SessionId {
    let store = RedbStore::open(StoreConfig::new(path)).expect("store");
    let s = SessionId::parse("ses_scheduled").expect("id");
    store
        .create_session(agenthost_store::NewSession {
            id: s.clone(),
            agent: "default".into(),
            model: None,
            title: None,
        })
        .await
        .expect("session");
    store
        .append(s.clone(), vec![Event::ScheduleSet { schedule }])
        .await
        .expect("set");
    store.close();
    s
}

fn cron_schedule(next: Timestamp, catch_up: CatchUp) -> Schedule {
    Schedule {
        id: ScheduleId::parse("sch_every_minute").expect("id"),
        prompt: Prompt::text("tick"),
        delivery: Delivery::Queue,
        when: When::Cron {
            expr: "* * * * *".into(),
            tz: None,
        },
        catch_up,
        next,
    }
}

async fn start(dir: &Path, provider: Arc<Scripted>) -> Runtime {
    let runtime = Runtime::start_with(harness::config(dir, provider), Extensions::default())
        .await
        .expect("start");
    runtime.recovered().await;
    runtime
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_schedule_fires_and_moves_on_to_its_next_minute_until_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = agenthost_store::system_clock();
    let first = Timestamp(now.0 + 300);
    let s = stored(
        &dir.path().join("store.redb"),
        cron_schedule(first, CatchUp::Once),
    )
    .await;
    let provider = Arc::new(Scripted::new([text("tock")]));
    let runtime = start(dir.path(), provider.clone()).await;
    // Armed from the store at start: it fires with no request.
    until("the firing", || provider.calls() == 1).await;
    let listed = runtime.schedules(&s).await.expect("list");
    let next = listed[0].next;
    assert!(
        next.0 > first.0 && next.0 % 60_000 == 0,
        "the next minute: {next:?}"
    );
    assert_eq!(admissions(&log(&runtime, &s)), [listed[0].id.firing(first)]);
    assert!(
        runtime
            .cancel_schedule(&s, &listed[0].id)
            .await
            .expect("cancel")
    );
    assert_eq!(runtime.armed_schedules(), 0);
    assert!(runtime.schedules(&s).await.expect("list").is_empty());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firings_missed_while_no_process_ran_are_caught_up_once_or_skipped() {
    // Two hours down: 120 firings missed.
    let missed = Timestamp(agenthost_store::system_clock().0 - 2 * 3_600_000);
    for (catch_up, admitted) in [(CatchUp::Once, 1), (CatchUp::Skip, 0)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = stored(
            &dir.path().join("store.redb"),
            cron_schedule(missed, catch_up),
        )
        .await;
        let provider = Arc::new(Scripted::new([text("caught up")]));
        let runtime = start(dir.path(), provider.clone()).await;
        until("the firing", || {
            log(&runtime, &s)
                .iter()
                .any(|e| matches!(e, Event::ScheduleFired { .. }))
        })
        .await;
        runtime
            .wait_idle(&s, Duration::from_secs(30))
            .await
            .expect("idle");
        let events = log(&runtime, &s);
        assert_eq!(admissions(&events).len(), admitted, "{catch_up:?}");
        assert_eq!(provider.calls(), admitted, "{catch_up:?}");
        let fired: Vec<_> = events
            .iter()
            .filter(|e| matches!(e, Event::ScheduleFired { .. }))
            .collect();
        assert_eq!(
            fired.len(),
            1,
            "one firing for all that were missed: {fired:?}"
        );
        let next = runtime.schedules(&s).await.expect("list")[0].next;
        assert!(
            next > agenthost_store::system_clock(),
            "moved past now: {next:?}"
        );
        runtime.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_setting_and_firing_fires_once_after_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = Arc::new(Scripted::new([]));
    let runtime = start(dir.path(), provider).await;
    let s = runtime
        .create_session(Default::default())
        .await
        .expect("session")
        .id;
    let schedule = runtime
        .set_schedule(&s, once("after the restart", 400))
        .await
        .expect("set");
    runtime.shutdown().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let provider = Arc::new(Scripted::new([text("here")]));
    let runtime = start(dir.path(), provider.clone()).await;
    until("the firing", || provider.calls() == 1).await;
    runtime
        .wait_idle(&s, Duration::from_secs(30))
        .await
        .expect("idle");
    assert_eq!(
        admissions(&log(&runtime, &s)),
        [schedule.id.firing(schedule.next)]
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_the_wakeup_tool_wakes_itself_later() {
    let h = Harness::start_with(
        [
            Script::new()
                .tool_call(
                    "c1",
                    "schedule_wakeup",
                    r#"{"after_ms": 300, "text": "check the build again"}"#,
                )
                .finish(FinishReason::ToolCalls),
            text("I will check later"),
            text("the build is green"),
        ],
        |c| {
            if let Some(agent) = c.agents.get_mut("default") {
                agent.tools = vec!["*".into(), "schedule_wakeup".into()];
            }
        },
        Extensions::default(),
    )
    .await;
    let s = h.session().await;
    h.prompt(&s, "watch the build").await;
    h.idle(&s).await;
    let first = &h.provider.requests()[0];
    assert!(first.tools.iter().any(|t| t.name == "schedule_wakeup"));
    assert!(
        !first.tools.iter().any(|t| t.name == "cancel_wakeup"),
        "a built-in tool is given only by name, never by a glob"
    );
    until("the wake-up's turn", || h.provider.calls() == 3).await;
    h.idle(&s).await;
    assert_eq!(
        user_texts(&h.provider.requests()[2])
            .last()
            .map(String::as_str),
        Some("check the build again")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wakeup_tool_is_not_given_to_an_agent_that_does_not_name_it() {
    let h = Harness::start([text("hi")]).await;
    let s = h.session().await;
    h.runtime
        .prompt(PromptRequest::new(&s, "hello"))
        .await
        .expect("admitted");
    h.idle(&s).await;
    let tools = &h.provider.requests()[0].tools;
    assert!(
        !tools.iter().any(|t| t.name.ends_with("_wakeup")),
        "{tools:?}"
    );
}
