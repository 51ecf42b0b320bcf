//! The conformance suite every [`Store`] backend passes unchanged, written against the traits
//! alone. A backend's tests implement [`Backend`] and expand [`conformance_tests!`] (the embedded
//! backend does so in this crate's tests); each check is one test.
//!
//! Available with the `conformance` feature (and in this crate's own tests).

use std::sync::Arc;

use agenthost_model::promotion::{self, Boundary};
use agenthost_model::{
    CatchUp, Delivery, Event, Finish, MessageId, Prompt, Schedule, ScheduleId, Seq, SessionId,
    Timestamp, Usage, When,
};

use crate::{Action, Admission, Error, NewSession, Store};

/// A backend under test.
pub trait Backend: Send + Sync {
    /// A new, empty store.
    fn fresh(&self) -> Arc<dyn Store>;
    /// Closes `store` and opens the same storage again.
    fn reopen(&self, store: Arc<dyn Store>) -> Arc<dyn Store>;
}

/// One test per check for `$backend` (an expression of a type implementing [`Backend`]).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_tests!($backend, if true);
    };
    // `if $available`: the backend's service is there (else each test returns at once).
    ($backend:expr, if $available:expr) => {
        $crate::conformance_tests!(@each $backend, $available;
            admission_is_idempotent_even_when_concurrent,
            a_refused_admission_changes_nothing,
            promotion_follows_the_rules_exactly_once,
            claims_are_taken_and_released_by_events,
            seqs_have_no_gaps_and_writes_are_all_or_nothing,
            snapshots_are_isolated_from_later_writes,
            every_acknowledged_write_survives_a_reopen,
            schedules_are_set_fired_and_cancelled_by_events,
        );
    };
    (@each $backend:expr, $available:expr; $($check:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                if !$available {
                    return;
                }
                $crate::conformance::$check(&$backend).await;
            }
        )*
    };
}

fn session(name: &str) -> SessionId {
    SessionId::parse(&format!("ses_{name}")).expect("valid session id")
}

fn message(name: &str) -> MessageId {
    MessageId::parse(&format!("msg_{name}")).expect("valid message id")
}

fn admission(s: &SessionId, id: &MessageId, text: &str, delivery: Delivery) -> Admission {
    Admission {
        session: s.clone(),
        id: id.clone(),
        prompt: Prompt::text(text),
        delivery,
        wake: true,
    }
}

async fn created(store: &dyn Store, name: &str) -> SessionId {
    let s = session(name);
    store
        .create_session(NewSession {
            id: s.clone(),
            agent: "default".into(),
            model: None,
            title: None,
        })
        .await
        .expect("session created");
    s
}

fn log(store: &dyn Store, s: &SessionId) -> Vec<agenthost_model::Stored> {
    store
        .snapshot()
        .expect("snapshot")
        .events(s, Seq::ZERO, usize::MAX)
        .expect("events")
}

fn assert_verifies(store: &dyn Store) {
    let verified = crate::verify(&*store.snapshot().expect("snapshot")).expect("readable");
    assert!(verified.ok(), "{:#?}", verified.differences);
}

/// An admission is durable once and only once: an exact retry, concurrent or not, gets the
/// original receipt and writes nothing.
pub async fn admission_is_idempotent_even_when_concurrent(backend: &dyn Backend) {
    let store = backend.fresh();
    let s = created(&*store, "idem").await;
    let id = message("once");
    let first = store
        .admit(admission(&s, &id, "hello", Delivery::Steer))
        .await
        .expect("admitted");
    assert_eq!(first.id, id);
    assert_eq!(first.admitted_seq, Seq(1));
    let retries = (0..16).map(|_| store.admit(admission(&s, &id, "hello", Delivery::Steer)));
    for receipt in futures::future::join_all(retries).await {
        assert_eq!(receipt.expect("answered"), first);
    }
    let admitted = log(&*store, &s)
        .iter()
        .filter(|e| matches!(e.event, Event::PromptAdmitted { .. }))
        .count();
    assert_eq!(admitted, 1);
    assert_verifies(&*store);
}

/// A conflicting id, an unknown session and invalid input are refused, and nothing changes.
pub async fn a_refused_admission_changes_nothing(backend: &dyn Backend) {
    let store = backend.fresh();
    let (a, b) = (
        created(&*store, "refuse_a").await,
        created(&*store, "refuse_b").await,
    );
    let id = message("taken");
    store
        .admit(admission(&a, &id, "original", Delivery::Steer))
        .await
        .expect("admitted");
    let before = (log(&*store, &a), log(&*store, &b));
    let refusals = [
        admission(&a, &id, "other text", Delivery::Steer),
        admission(&a, &id, "original", Delivery::Queue),
        admission(&b, &id, "original", Delivery::Steer),
    ];
    for refused in refusals {
        let err = store.admit(refused).await.expect_err("conflict");
        assert!(matches!(err, Error::PromptConflict { .. }), "{err:?}");
    }
    let err = store
        .admit(admission(
            &session("ghost"),
            &message("new"),
            "hi",
            Delivery::Steer,
        ))
        .await
        .expect_err("unknown session");
    assert!(matches!(err, Error::SessionNotFound(_)), "{err:?}");
    let err = store
        .admit(admission(&a, &message("empty"), "", Delivery::Steer))
        .await
        .expect_err("empty prompt");
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    assert_eq!((log(&*store, &a), log(&*store, &b)), before);
    assert!(
        store
            .snapshot()
            .expect("snapshot")
            .index(&message("empty"))
            .expect("index")
            .is_none()
    );
    assert_verifies(&*store);
}

/// `Promote` promotes what the model's rule selects from the pending inputs, in one transaction,
/// and an input is promoted once: promoting it again is refused and writes nothing.
pub async fn promotion_follows_the_rules_exactly_once(backend: &dyn Backend) {
    let store = backend.fresh();
    let s = created(&*store, "promote").await;
    for (name, delivery) in [
        ("q1", Delivery::Queue),
        ("s1", Delivery::Steer),
        ("q2", Delivery::Queue),
    ] {
        store
            .admit(admission(&s, &message(name), name, delivery))
            .await
            .expect("admitted");
    }
    for boundary in [
        Boundary::Continuation,
        Boundary::Continuation,
        Boundary::Idle,
        Boundary::Idle,
    ] {
        let snap = store.snapshot().expect("snapshot");
        let pending = snap.pending(&s).expect("pending");
        // The row and the inputs read together are the two read apart.
        let together = snap.session_and_pending(&s).expect("session and pending");
        let apart = snap
            .session(&s)
            .expect("session")
            .map(|row| (row, pending.clone()));
        assert_eq!(together, apart, "at {boundary:?}");
        drop(snap);
        let expected = promotion::select(&pending, boundary);
        let written = store.promote(s.clone(), boundary).await.expect("promoted");
        let promoted: Vec<MessageId> = written
            .iter()
            .map(|e| match &e.event {
                Event::PromptPromoted { id } => id.clone(),
                other => panic!("promotion wrote {other:?}"),
            })
            .collect();
        assert_eq!(promoted, expected, "at {boundary:?}");
    }
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read")
        .expect("row");
    assert_eq!(row.pending, 0);
    let before = log(&*store, &s);
    let again = store
        .append(s.clone(), vec![Event::PromptPromoted { id: message("s1") }])
        .await;
    assert!(matches!(again, Err(Error::Violation(_))), "{again:?}");
    assert_eq!(log(&*store, &s), before);
    assert_verifies(&*store);
}

/// `ExecutionStarted` takes the claim and every end of an execution releases it; `claimed` and
/// `with_pending` list exactly the sessions with work; `SucceedIfIdle` never settles over input.
pub async fn claims_are_taken_and_released_by_events(backend: &dyn Backend) {
    let store = backend.fresh();
    let s = created(&*store, "claims").await;
    let idle = created(&*store, "idle").await;
    let started = store
        .append(s.clone(), vec![Event::ExecutionStarted { forced: false }])
        .await
        .expect("started");
    let snap = store.snapshot().expect("snapshot");
    let claim = snap.session(&s).expect("read").expect("row").claim;
    assert_eq!(claim.map(|c| c.seq), Some(started[0].seq));
    assert_eq!(snap.claimed().expect("claimed"), std::slice::from_ref(&s));
    assert!(!snap.claimed().expect("claimed").contains(&idle));
    drop(snap);
    store
        .admit(admission(&s, &message("late"), "late", Delivery::Steer))
        .await
        .expect("admitted");
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(
        snap.with_pending().expect("pending"),
        std::slice::from_ref(&s)
    );
    // The same sessions' rows, each as `session` reads it.
    let rows = snap.pending_rows().expect("pending rows");
    assert_eq!(
        rows,
        [snap.session(&s).expect("read").expect("row")],
        "the rows of the sessions with pending input"
    );
    assert!(rows[0].pending > 0);
    drop(snap);
    // Input is pending: nothing is settled.
    let written = store
        .write(s.clone(), vec![Action::SucceedIfIdle])
        .await
        .expect("written");
    assert!(written.is_empty(), "{written:?}");
    // Promoted in the same transaction, it no longer holds the settlement back.
    let written = store
        .write(
            s.clone(),
            vec![Action::Promote(Boundary::Idle), Action::SucceedIfIdle],
        )
        .await
        .expect("written");
    assert!(matches!(
        written.last().map(|e| &e.event),
        Some(Event::ExecutionSucceeded)
    ));
    let snap = store.snapshot().expect("snapshot");
    assert!(
        snap.session(&s)
            .expect("read")
            .expect("row")
            .claim
            .is_none()
    );
    assert!(snap.claimed().expect("claimed").is_empty());
    assert!(snap.with_pending().expect("pending").is_empty());
    assert!(snap.pending_rows().expect("pending rows").is_empty());
    for end in [
        Event::ExecutionFailed {
            error: "boom".into(),
            halted: false,
        },
        Event::ExecutionInterrupted {
            reason: agenthost_model::InterruptReason::User,
        },
    ] {
        store
            .append(
                s.clone(),
                vec![Event::ExecutionStarted { forced: true }, end],
            )
            .await
            .expect("started and ended");
        let row = store
            .snapshot()
            .expect("snapshot")
            .session(&s)
            .expect("read")
            .expect("row");
        assert!(row.claim.is_none());
    }
    assert_verifies(&*store);
}

/// Every session's log is numbered from 0 without gaps, `last_seq` is its last seq, and a write
/// one of whose events is refused writes none of them.
pub async fn seqs_have_no_gaps_and_writes_are_all_or_nothing(backend: &dyn Backend) {
    let store = backend.fresh();
    let s = created(&*store, "seqs").await;
    store
        .admit(admission(&s, &message("p"), "go", Delivery::Steer))
        .await
        .expect("admitted");
    let a = message("a");
    let before_refused = {
        store
            .write(
                s.clone(),
                vec![
                    Action::Append(Event::ExecutionStarted { forced: false }),
                    Action::Promote(Boundary::Idle),
                    Action::Append(Event::StepStarted {
                        id: a.clone(),
                        step: 1,
                        agent: "default".into(),
                        model: "m".into(),
                    }),
                ],
            )
            .await
            .expect("written");
        log(&*store, &s)
    };
    // The second event is refused (the step already started): neither is written.
    let refused = store
        .append(
            s.clone(),
            vec![
                Event::TextEnded {
                    id: a.clone(),
                    text: "hi".into(),
                    incomplete: false,
                },
                Event::StepStarted {
                    id: a.clone(),
                    step: 1,
                    agent: "default".into(),
                    model: "m".into(),
                },
            ],
        )
        .await;
    assert!(refused.is_err());
    assert_eq!(log(&*store, &s), before_refused);
    store
        .append(
            s.clone(),
            vec![
                Event::TextEnded {
                    id: a.clone(),
                    text: "hi".into(),
                    incomplete: false,
                },
                Event::StepEnded {
                    id: a,
                    finish: Finish::Stop,
                    usage: Usage::default(),
                },
                Event::ExecutionSucceeded,
            ],
        )
        .await
        .expect("appended");
    let events = log(&*store, &s);
    for (n, stored) in events.iter().enumerate() {
        assert_eq!(stored.seq, Seq(n as u64));
    }
    let row = store
        .snapshot()
        .expect("snapshot")
        .session(&s)
        .expect("read")
        .expect("row");
    assert_eq!(row.last_seq, events.last().expect("events").seq);
    // Paging reads the same log.
    let snap = store.snapshot().expect("snapshot");
    let mut paged = Vec::new();
    loop {
        let from = paged
            .last()
            .map_or(Seq::ZERO, |e: &agenthost_model::Stored| e.seq.next());
        let page = snap.events(&s, from, 2).expect("page");
        if page.is_empty() {
            break;
        }
        paged.extend(page);
    }
    assert_eq!(paged, events);
    assert_verifies(&*store);
}

/// A snapshot sees exactly the writes durable when it was taken, however long it is held.
pub async fn snapshots_are_isolated_from_later_writes(backend: &dyn Backend) {
    let store = backend.fresh();
    let s = created(&*store, "isolated").await;
    let old = store.snapshot().expect("snapshot");
    store
        .admit(admission(&s, &message("later"), "later", Delivery::Steer))
        .await
        .expect("admitted");
    let other = created(&*store, "newer").await;
    let row = old.session(&s).expect("read").expect("row");
    assert_eq!(row.pending, 0);
    assert_eq!(row.last_seq, Seq::ZERO);
    assert_eq!(
        old.events(&s, Seq::ZERO, usize::MAX).expect("events").len(),
        1
    );
    assert!(old.pending(&s).expect("pending").is_empty());
    assert!(old.session(&other).expect("read").is_none());
    assert!(old.index(&message("later")).expect("index").is_none());
    let new = store.snapshot().expect("snapshot");
    assert_eq!(new.session(&s).expect("read").expect("row").pending, 1);
    assert!(new.session(&other).expect("read").is_some());
    // Newest first, paged by cursor.
    let first = new.sessions(None, 1).expect("page");
    let rest = new
        .sessions(Some((first[0].created, first[0].id.clone())), 10)
        .expect("page");
    assert_eq!(first.len() + rest.len(), 2);
    assert!(rest.iter().all(|r| r.id != first[0].id));
}

/// What a write returned is durable: it is there, whole, after the store is reopened.
pub async fn every_acknowledged_write_survives_a_reopen(backend: &dyn Backend) {
    let store = backend.fresh();
    let s = created(&*store, "durable").await;
    let mut receipts = Vec::new();
    for n in 0..20 {
        let delivery = if n % 2 == 0 {
            Delivery::Steer
        } else {
            Delivery::Queue
        };
        receipts.push(
            store
                .admit(admission(&s, &message(&format!("d{n}")), "work", delivery))
                .await
                .expect("admitted"),
        );
        if n % 5 == 4 {
            store
                .promote(s.clone(), Boundary::Idle)
                .await
                .expect("promoted");
        }
    }
    let before = log(&*store, &s);
    let store = backend.reopen(store);
    assert_eq!(log(&*store, &s), before);
    let snap = store.snapshot().expect("snapshot");
    for receipt in receipts {
        assert!(
            snap.index(&receipt.id).expect("index").is_some(),
            "{receipt:?}"
        );
    }
    drop(snap);
    assert_verifies(&*store);
}

fn schedule_id(name: &str) -> ScheduleId {
    ScheduleId::parse(&format!("sch_{name}")).expect("valid schedule id")
}

fn schedule(name: &str, when: When, next: u64) -> Schedule {
    Schedule {
        id: schedule_id(name),
        prompt: Prompt::text(name),
        delivery: Delivery::Queue,
        when,
        catch_up: CatchUp::Once,
        next: Timestamp(next),
    }
}

fn cron(expr: &str, tz: Option<&str>) -> When {
    When::Cron {
        expr: expr.into(),
        tz: tz.map(Into::into),
    }
}

fn fired(name: &str, at: u64, next: Option<u64>, admitted: bool) -> Event {
    Event::ScheduleFired {
        id: schedule_id(name),
        at: Timestamp(at),
        next: next.map(Timestamp),
        admitted,
    }
}

/// A session's schedules are its `ScheduleSet`, `ScheduleFired` and `ScheduleCancelled` events
/// applied: a firing moves the schedule to its next time or, without one, removes it, and only
/// the firing the schedule waits for (`at` its `next`) is accepted; a refused event writes
/// nothing of its write, schedules included. A write sees its own schedules and those of the
/// writes before it, committed together or not. `all_schedules` lists every session's, and all
/// of it survives a reopen.
pub async fn schedules_are_set_fired_and_cancelled_by_events(backend: &dyn Backend) {
    let store = backend.fresh();
    let (a, b) = (
        created(&*store, "sched_a").await,
        created(&*store, "sched_b").await,
    );
    let schedules = |store: &dyn Store, s: &SessionId| {
        store
            .snapshot()
            .expect("snapshot")
            .schedules(s)
            .expect("schedules")
    };
    let daily = schedule("daily", cron("0 9 * * *", Some("Europe/Paris")), 1_000);
    let once = schedule("once", When::Once, 2_000);
    store
        .append(
            a.clone(),
            vec![
                // Set out of id order: read back in id order.
                Event::ScheduleSet {
                    schedule: once.clone(),
                },
                Event::ScheduleSet {
                    schedule: daily.clone(),
                },
            ],
        )
        .await
        .expect("set");
    assert_eq!(schedules(&*store, &a), [daily.clone(), once.clone()]);
    assert!(schedules(&*store, &b).is_empty());

    // A firing that admits its input: the schedule moves on to its next time.
    store
        .append(
            a.clone(),
            vec![
                Event::PromptAdmitted {
                    id: daily.id.firing(daily.next),
                    delivery: daily.delivery,
                    prompt: daily.prompt.clone(),
                    wake: true,
                },
                fired("daily", 1_000, Some(87_400), true),
            ],
        )
        .await
        .expect("fired");
    let moved = Schedule {
        next: Timestamp(87_400),
        ..daily.clone()
    };
    assert_eq!(schedules(&*store, &a), [moved.clone(), once.clone()]);
    assert_eq!(
        store
            .snapshot()
            .expect("snapshot")
            .pending(&a)
            .expect("pending")
            .len(),
        1
    );

    // Refused, each writing nothing: the same firing again (the schedule moved on), a firing
    // of another time, a cancellation or a firing of a schedule that does not exist, a schedule
    // set twice, and a write whose schedule changes come before its refused event.
    let before = (log(&*store, &a), schedules(&*store, &a));
    let refusals = [
        vec![fired("daily", 1_000, Some(87_400), true)],
        vec![fired("once", 1_999, None, true)],
        vec![Event::ScheduleCancelled {
            id: schedule_id("ghost"),
        }],
        vec![fired("ghost", 1_000, None, false)],
        vec![Event::ScheduleSet {
            schedule: Schedule {
                next: Timestamp(5),
                ..once.clone()
            },
        }],
        vec![
            Event::ScheduleCancelled {
                id: once.id.clone(),
            },
            fired("daily", 87_400, None, false),
            Event::ScheduleSet {
                schedule: schedule("new", When::Once, 9),
            },
            fired("daily", 1_000, None, false),
        ],
    ];
    for events in refusals {
        let refused = store.append(a.clone(), events.clone()).await;
        assert!(
            matches!(refused, Err(Error::Violation(_))),
            "{events:?}: {refused:?}"
        );
        assert_eq!((log(&*store, &a), schedules(&*store, &a)), before);
    }

    // A firing without a next time removes the schedule.
    store
        .append(a.clone(), vec![fired("once", 2_000, None, false)])
        .await
        .expect("fired for the last time");
    assert_eq!(schedules(&*store, &a), std::slice::from_ref(&moved));

    // One write sets a schedule and fires it (it sees its own change); two writes sent at once
    // (committed together, or one after the other) set one and cancel it; another is set and
    // cancelled in one write.
    let weekly = schedule("weekly", cron("0 8 * * 1", None), 3_000);
    store
        .append(
            b.clone(),
            vec![
                Event::ScheduleSet {
                    schedule: weekly.clone(),
                },
                fired("weekly", 3_000, Some(607_800), false),
            ],
        )
        .await
        .expect("set and fired");
    let set = store.append(
        b.clone(),
        vec![Event::ScheduleSet {
            schedule: schedule("brief", When::Once, 4_000),
        }],
    );
    let cancelled = store.append(
        b.clone(),
        vec![Event::ScheduleCancelled {
            id: schedule_id("brief"),
        }],
    );
    let (set, cancelled) = futures::future::join(set, cancelled).await;
    set.expect("set");
    cancelled.expect("cancelled, after the write that set it");
    store
        .append(
            b.clone(),
            vec![
                Event::ScheduleSet {
                    schedule: schedule("fleeting", When::Once, 5_000),
                },
                Event::ScheduleCancelled {
                    id: schedule_id("fleeting"),
                },
            ],
        )
        .await
        .expect("set and cancelled");
    let weekly = Schedule {
        next: Timestamp(607_800),
        ..weekly
    };
    assert_eq!(schedules(&*store, &b), std::slice::from_ref(&weekly));

    // Every session's, by session and then id.
    let all = vec![(a.clone(), moved.clone()), (b.clone(), weekly.clone())];
    assert_eq!(
        store
            .snapshot()
            .expect("snapshot")
            .all_schedules()
            .expect("all schedules"),
        all
    );
    // Cancelled: gone.
    store
        .append(
            b.clone(),
            vec![Event::ScheduleCancelled {
                id: weekly.id.clone(),
            }],
        )
        .await
        .expect("cancelled");
    assert!(schedules(&*store, &b).is_empty());
    store
        .append(
            b.clone(),
            vec![Event::ScheduleSet {
                schedule: weekly.clone(),
            }],
        )
        .await
        .expect("set again, once cancelled");
    assert_verifies(&*store);

    let logs = (log(&*store, &a), log(&*store, &b));
    let store = backend.reopen(store);
    assert_eq!((log(&*store, &a), log(&*store, &b)), logs);
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(snap.schedules(&a).expect("schedules"), [moved]);
    assert_eq!(
        snap.all_schedules().expect("all schedules"),
        [(a.clone(), all[0].1.clone()), (b.clone(), weekly)]
    );
    drop(snap);
    assert_verifies(&*store);
}

/// The child's side of the crash check: eight sessions admitting, promoting and appending at
/// once, printing `ack <session> <id> <seq>` on stdout for every admission acknowledged. Runs
/// until the parent kills the process.
pub async fn crash_workload(store: Arc<dyn Store>, round: u32) {
    use std::io::Write as _;
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let s = created(&*store, &format!("crash_w{w}")).await;
                for i in 0u64.. {
                    let id = message(&format!("r{round}w{w}i{i}"));
                    let receipt = store
                        .admit(admission(&s, &id, "work", Delivery::Steer))
                        .await
                        .expect("admit");
                    {
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ack {s} {id} {}", receipt.admitted_seq).expect("stdout");
                        out.flush().expect("flush");
                    }
                    if i % 3 == 0 {
                        store
                            .promote(s.clone(), Boundary::Idle)
                            .await
                            .expect("promote");
                    }
                    if i % 5 == 0 {
                        let events = vec![
                            Event::ExecutionStarted { forced: false },
                            Event::UsageRecorded {
                                usage: Usage::default(),
                            },
                        ];
                        store.append(s.clone(), events).await.expect("append");
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
}

/// The child process's entry: runs [`crash_workload`] on the store `open` returns (opened on a
/// two-worker runtime of its own), for the round named by `AGENTHOST_CRASH_ROUND`.
pub fn crash_child(open: impl FnOnce() -> Arc<dyn Store>) {
    let round: u32 = std::env::var("AGENTHOST_CRASH_ROUND")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move { crash_workload(open(), round).await });
}

/// The parent's side: `rounds` times, starts a child running [`crash_workload`] (`spawn(round)`
/// must pipe its stdout), kills it with SIGKILL after a varied number of acknowledgements, opens
/// the store again (`open`) and checks that every admission ever acknowledged is there at the
/// seq it was acknowledged with, and that the store verifies.
pub fn crash_rounds(
    rounds: u32,
    spawn: impl Fn(u32) -> std::process::Child,
    open: impl Fn() -> Arc<dyn Store>,
) {
    use std::collections::BTreeMap;
    use std::io::BufRead as _;
    let parse = |line: &str| -> Option<(SessionId, MessageId, Seq)> {
        let mut parts = line.strip_prefix("ack ")?.split(' ');
        let s = SessionId::parse(parts.next()?).ok()?;
        let id = MessageId::parse(parts.next()?).ok()?;
        let seq = parts.next()?.parse().ok()?;
        Some((s, id, Seq(seq)))
    };
    let mut acked: BTreeMap<MessageId, (SessionId, Seq)> = BTreeMap::new();
    // A fixed LCG keeps kill points varied but reproducible.
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..rounds {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let kill_after = 5 + (rng >> 33) % 400;
        let mut child = spawn(round);
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(ack) = parse(&line)
                    && tx.send(ack).is_err()
                {
                    break;
                }
            }
        });
        let mut seen = 0;
        while seen < kill_after {
            match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok((s, id, seq)) => {
                    acked.insert(id, (s, seq));
                    seen += 1;
                }
                Err(_) => panic!("the child stopped acknowledging (round {round})"),
            }
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        reader.join().expect("reader");
        // Acks printed before the kill are acknowledged too.
        for (s, id, seq) in rx.try_iter() {
            acked.insert(id, (s, seq));
        }
        let store = open();
        let snap = store.snapshot().expect("snapshot");
        for (id, (s, seq)) in &acked {
            match snap.index(id).expect("index") {
                Some(agenthost_model::IndexEntry::Prompt {
                    session,
                    admitted_seq,
                    ..
                }) => assert_eq!((&session, admitted_seq), (s, *seq), "{id} moved"),
                other => panic!("acknowledged {id} lost after SIGKILL in round {round}: {other:?}"),
            }
        }
        drop(snap);
        assert_verifies(&*store);
        store.close();
    }
    assert!(
        acked.len() as u64 >= 5 * u64::from(rounds),
        "the child made progress"
    );
}
