//! The record format: version headers, runs, and every record shape through its conversions.

use std::collections::{BTreeMap, BTreeSet};

use agenthost_model::message::Claim;
use agenthost_model::{
    Approval, AssistantMessage, Budget, CatchUp, CompactionState, Decision, Delivery, Event,
    FailureKind, FileAttachment, Finish, IndexEntry, InstructionState, InterruptReason, Limit,
    Message, MessageId, Part, Prompt, Schedule, ScheduleId, Seq, SessionId, SessionRow, StepError,
    Stored, Timestamp, ToolPart, ToolState, Usage, Verdict, When,
};

use super::*;
use crate::record::Inbox;

#[test]
fn round_trip_and_version_check() {
    let stored = Stored {
        seq: Seq(3),
        time: Timestamp(9),
        event: Event::ExecutionStarted { forced: true },
    };
    let bytes = encode(&stored);
    assert_eq!(decode::<Stored>("event", &bytes).expect("decodes"), stored);

    let mut future = bytes.clone();
    future[..2].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        decode::<Stored>("event", &future),
        Err(Error::FormatVersion {
            found,
            supported: FORMAT_VERSION
        }) if found == FORMAT_VERSION + 1
    ));
    assert!(matches!(
        decode::<Stored>("event", &bytes[..1]),
        Err(Error::Corrupt { .. })
    ));
    let mut trailing = bytes;
    trailing.push(0);
    assert!(matches!(
        decode::<Stored>("event", &trailing),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn runs_frame_records_and_a_bare_record_is_a_run_of_one() {
    let a = encode(&Stored {
        seq: Seq(1),
        time: Timestamp(2),
        event: Event::ExecutionSucceeded,
    });
    let b = encode(&Stored {
        seq: Seq(2),
        time: Timestamp(2),
        event: Event::ExecutionStarted { forced: false },
    });
    let framed = run(&[&a, &b]);
    assert_eq!(records("run", &framed).expect("run"), [&a[..], &b[..]]);
    assert_eq!(run(&[&a]), a);
    assert_eq!(records("run", &a).expect("bare"), [&a[..]]);
    for cut in 1..framed.len() {
        assert!(
            matches!(records("run", &framed[..cut]), Err(Error::Corrupt { .. })),
            "cut at {cut}"
        );
    }
    let mut builder = RunBuilder::default();
    for records in [&[&a[..], &b[..]][..], &[&a[..]], &[&b[..], &a[..], &b[..]]] {
        for record in records {
            builder.push(record);
        }
        assert_eq!(builder.count(), records.len());
        assert_eq!(
            builder.bytes(),
            records.iter().map(|r| r.len()).sum::<usize>()
        );
        assert_eq!(builder.finish(), run(records), "built as run() frames it");
    }
    let mut long = framed;
    long.push(7);
    assert!(matches!(records("run", &long), Err(Error::Corrupt { .. })));
}

fn mid(s: &str) -> MessageId {
    MessageId::parse(&format!("msg_{s}")).expect("valid message id")
}

fn sid(s: &str) -> SessionId {
    SessionId::parse(&format!("ses_{s}")).expect("valid session id")
}

fn sch(s: &str) -> ScheduleId {
    ScheduleId::parse(&format!("sch_{s}")).expect("valid schedule id")
}

/// Every field non-zero, so that a field dropped or swapped by a conversion shows.
fn usage(n: u64) -> Usage {
    Usage {
        input: n,
        output: n + 1,
        reasoning: n + 2,
        cache_read: n + 3,
        cache_write: n + 4,
        cost_nanos: n + 5,
    }
}

fn step_error(kind: FailureKind) -> StepError {
    StepError {
        kind,
        message: format!("{kind:?} went wrong"),
    }
}

fn prompt_with_files() -> Prompt {
    Prompt {
        text: "look".into(),
        files: vec![
            FileAttachment {
                mime: "text/plain".into(),
                url: "data:text/plain;base64,aGk=".into(),
                filename: Some("hi.txt".into()),
            },
            FileAttachment {
                mime: "image/png".into(),
                url: "https://example.invalid/a.png".into(),
                filename: None,
            },
        ],
    }
}

const VERDICTS: [Verdict; 4] = [
    Verdict::Approved,
    Verdict::Denied,
    Verdict::Expired,
    Verdict::Cancelled,
];

/// Every `When` with every `CatchUp`, each field set apart from the others.
fn schedules() -> Vec<Schedule> {
    vec![
        Schedule {
            id: sch("daily"),
            prompt: prompt_with_files(),
            delivery: Delivery::Queue,
            when: When::Cron {
                expr: "0 9 * * 1-5".into(),
                tz: Some("Europe/Paris".into()),
            },
            catch_up: CatchUp::Once,
            next: Timestamp(1_700_003_600_000),
        },
        Schedule {
            id: sch("hourly"),
            prompt: Prompt::text("check the queue"),
            delivery: Delivery::Steer,
            when: When::Cron {
                expr: "0 * * * *".into(),
                tz: None,
            },
            catch_up: CatchUp::Skip,
            next: Timestamp(1_700_000_360_000),
        },
        Schedule {
            id: sch("later"),
            prompt: Prompt::text("remind me"),
            delivery: Delivery::Steer,
            when: When::Once,
            catch_up: CatchUp::Once,
            next: Timestamp(1_700_000_900_000),
        },
        Schedule {
            id: sch("missed"),
            prompt: Prompt::text("only if on time"),
            delivery: Delivery::Queue,
            when: When::Once,
            catch_up: CatchUp::Skip,
            next: Timestamp(1),
        },
    ]
}

/// The shape of a schedule. No wildcard: a new variant fails to compile here until it has a
/// sample in [`schedules`].
fn schedule_shape(schedule: &Schedule) -> (&'static str, &'static str) {
    let when = match &schedule.when {
        When::Once => "once",
        When::Cron { tz: Some(_), .. } => "cron in a zone",
        When::Cron { tz: None, .. } => "cron in UTC",
    };
    let catch_up = match schedule.catch_up {
        CatchUp::Once => "catch up once",
        CatchUp::Skip => "skip",
    };
    (when, catch_up)
}
const SCHEDULE_SHAPES: usize = 4;

/// Each variant of every enum an event holds, at least once. The samples format 4 can express
/// come first, in the order of [`FORMAT_4_EVENTS`], then those format 5 can, in the order of
/// [`FORMAT_5_EVENTS`]; add new ones at the end.
fn events() -> Vec<Event> {
    let a = mid("a");
    let mut events = vec![
        Event::SessionCreated {
            agent: "default".into(),
            model: Some("mock".into()),
            title: Some("A title".into()),
        },
        Event::SessionCreated {
            agent: "default".into(),
            model: None,
            title: None,
        },
        Event::PromptAdmitted {
            id: mid("p1"),
            delivery: Delivery::Steer,
            prompt: prompt_with_files(),
            wake: true,
        },
        Event::PromptAdmitted {
            id: mid("p2"),
            delivery: Delivery::Queue,
            prompt: Prompt::text("later"),
            // Stored as format 4's appended record variant.
            wake: false,
        },
        Event::PromptPromoted { id: mid("p1") },
        Event::InstructionsUpdated {
            id: mid("sys"),
            changed: vec![
                ("agent".into(), "Be brief.".into()),
                ("project".into(), String::new()),
            ],
            text: "Be brief.".into(),
        },
        Event::ExecutionStarted { forced: true },
        Event::ExecutionSucceeded,
        Event::ExecutionFailed {
            error: "boom".into(),
            halted: true,
        },
        Event::RecoveryAttempted { attempt: 3 },
        Event::StepStarted {
            id: a.clone(),
            step: 7,
            agent: "default".into(),
            model: "mock".into(),
        },
        Event::TextEnded {
            id: a.clone(),
            text: "hello".into(),
            incomplete: true,
        },
        Event::ReasoningEnded {
            id: a.clone(),
            text: "hmm".into(),
            metadata: Some("sig".into()),
            incomplete: false,
        },
        Event::ReasoningEnded {
            id: a.clone(),
            text: "hmm".into(),
            metadata: None,
            incomplete: true,
        },
        Event::ToolCalled {
            id: a.clone(),
            call_id: "c1".into(),
            name: "lookup".into(),
            input: "{\"q\":1}".into(),
        },
        Event::ToolSucceeded {
            id: a.clone(),
            call_id: "c1".into(),
            output: "found".into(),
            truncated: true,
        },
        Event::ToolFailed {
            id: a.clone(),
            call_id: "c2".into(),
            error: "no such tool".into(),
        },
        Event::RetryScheduled {
            id: a.clone(),
            attempt: 2,
            delay_ms: 1500,
            error: step_error(FailureKind::Provider),
        },
        Event::CompactionStarted {
            id: mid("c"),
            auto: true,
        },
        Event::CompactionEnded {
            id: mid("c"),
            summary: "they said hi".into(),
            kept_from: Seq(12),
            usage: usage(20),
        },
        Event::CompactionFailed {
            id: mid("c"),
            error: "too long".into(),
        },
        Event::UsageRecorded { usage: usage(30) },
        Event::StepUsage {
            id: a.clone(),
            usage: usage(40),
        },
        Event::ToolOutput {
            id: a.clone(),
            call_id: "c1".into(),
            output: "the whole output".into(),
        },
    ];
    events.extend(
        [InterruptReason::User, InterruptReason::Shutdown]
            .map(|reason| Event::ExecutionInterrupted { reason }),
    );
    events.extend(
        [
            Finish::Stop,
            Finish::Length,
            Finish::ToolCalls,
            Finish::ContentFilter,
            Finish::Other("pause".into()),
        ]
        .map(|finish| Event::StepEnded {
            id: a.clone(),
            finish,
            usage: usage(10),
        }),
    );
    events.extend(
        [
            FailureKind::Aborted,
            FailureKind::Restarted,
            FailureKind::Provider,
            FailureKind::ContextOverflow,
            FailureKind::Internal,
        ]
        .map(|kind| Event::StepFailed {
            id: a.clone(),
            error: step_error(kind),
        }),
    );
    // Format 5 from here on.
    events.push(Event::ApprovalRequested {
        id: a.clone(),
        call_id: "c4".into(),
        name: "pay".into(),
        digest: "sha256:4a1f".into(),
        expires_at: Timestamp(1_700_000_600_000),
    });
    events.extend(VERDICTS.map(|verdict| Event::ApprovalDecided {
        id: a.clone(),
        call_id: "c4".into(),
        verdict,
        by: Some("alice".into()),
        reason: Some(format!("{verdict:?} for a reason")),
    }));
    events.push(Event::ApprovalDecided {
        id: a.clone(),
        call_id: "c5".into(),
        verdict: Verdict::Expired,
        by: None,
        reason: None,
    });
    events.push(Event::ToolStarted {
        id: a.clone(),
        call_id: "c4".into(),
    });
    // Format 6 from here on.
    events.extend(
        schedules()
            .into_iter()
            .map(|schedule| Event::ScheduleSet { schedule }),
    );
    events.extend([
        Event::ScheduleFired {
            id: sch("daily"),
            at: Timestamp(1_700_003_600_000),
            next: Some(Timestamp(1_700_090_000_000)),
            admitted: true,
        },
        Event::ScheduleFired {
            id: sch("missed"),
            at: Timestamp(1),
            next: None,
            admitted: false,
        },
        Event::ScheduleCancelled { id: sch("hourly") },
    ]);
    // Format 7 from here on.
    events.extend([
        Event::BudgetSet {
            budget: Budget {
                max_tokens: Some(100_000),
                max_cost_nanos: Some(2_500_000_000),
                turn_max_tokens: None,
                turn_max_cost_nanos: Some(50_000_000),
            },
        },
        Event::BudgetSet {
            budget: Budget::default(),
        },
    ]);
    events.push(Event::InterruptRequested { by: "ops".into() });
    events.extend(
        [
            Limit::Tokens,
            Limit::Cost,
            Limit::TurnTokens,
            Limit::TurnCost,
        ]
        .map(|which| Event::BudgetExhausted {
            which,
            spent: 99_000,
            limit: 100_000,
        }),
    );
    events
}

/// Which variant an event is. No wildcard: a new variant fails to compile here until it has a
/// sample in [`events`].
fn variant(event: &Event) -> usize {
    match event {
        Event::SessionCreated { .. } => 0,
        Event::PromptAdmitted { .. } => 1,
        Event::PromptPromoted { .. } => 2,
        Event::InstructionsUpdated { .. } => 3,
        Event::ExecutionStarted { .. } => 4,
        Event::ExecutionSucceeded => 5,
        Event::ExecutionFailed { .. } => 6,
        Event::ExecutionInterrupted { .. } => 7,
        Event::RecoveryAttempted { .. } => 8,
        Event::StepStarted { .. } => 9,
        Event::TextEnded { .. } => 10,
        Event::ReasoningEnded { .. } => 11,
        Event::ToolCalled { .. } => 12,
        Event::ToolSucceeded { .. } => 13,
        Event::ToolFailed { .. } => 14,
        Event::StepEnded { .. } => 15,
        Event::StepFailed { .. } => 16,
        Event::RetryScheduled { .. } => 17,
        Event::CompactionStarted { .. } => 18,
        Event::CompactionEnded { .. } => 19,
        Event::CompactionFailed { .. } => 20,
        Event::UsageRecorded { .. } => 21,
        Event::StepUsage { .. } => 22,
        Event::ToolOutput { .. } => 23,
        Event::ApprovalRequested { .. } => 24,
        Event::ApprovalDecided { .. } => 25,
        Event::ToolStarted { .. } => 26,
        Event::ScheduleSet { .. } => 27,
        Event::ScheduleFired { .. } => 28,
        Event::ScheduleCancelled { .. } => 29,
        Event::BudgetSet { .. } => 30,
        Event::BudgetExhausted { .. } => 31,
        Event::InterruptRequested { .. } => 32,
    }
}
const EVENT_VARIANTS: usize = 33;

fn assistant(parts: Vec<Part>, settled: bool) -> AssistantMessage {
    AssistantMessage {
        id: mid("a"),
        seq: Seq(9),
        step: 2,
        agent: "default".into(),
        model: "mock".into(),
        parts,
        finish: settled.then(|| Finish::Other("pause".into())),
        error: settled.then(|| step_error(FailureKind::ContextOverflow)),
        usage: usage(50),
        retries: 4,
        created: Timestamp(100),
        completed: settled.then_some(Timestamp(200)),
    }
}

/// Every message variant, compaction state, part, tool state and verdict. The samples format 4
/// can express come first, in the order of [`FORMAT_4_MESSAGES`], then those format 5 can, in
/// the order of [`FORMAT_5_MESSAGES`]; add new ones at the end.
fn messages() -> Vec<Message> {
    let tool = |call_id: &str, state| {
        Part::Tool(ToolPart {
            call_id: call_id.into(),
            name: "lookup".into(),
            input: "{}".into(),
            state,
        })
    };
    let compaction = |state| Message::Compaction {
        id: mid("c"),
        seq: Seq(30),
        auto: true,
        state,
        time: Timestamp(300),
    };
    vec![
        Message::User {
            id: mid("p1"),
            seq: Seq(2),
            admitted_seq: Seq(1),
            delivery: Delivery::Queue,
            prompt: prompt_with_files(),
            time: Timestamp(5),
        },
        Message::System {
            id: mid("sys"),
            seq: Seq(3),
            text: "Be brief.".into(),
            time: Timestamp(6),
        },
        Message::Assistant(assistant(Vec::new(), false)),
        Message::Assistant(assistant(
            vec![
                Part::Reasoning {
                    text: "hmm".into(),
                    metadata: Some("sig".into()),
                    incomplete: false,
                },
                Part::Reasoning {
                    text: "hm".into(),
                    metadata: None,
                    incomplete: true,
                },
                Part::Text {
                    text: "Looking.".into(),
                    incomplete: false,
                },
                tool("c1", ToolState::Running),
                tool(
                    "c2",
                    ToolState::Completed {
                        output: "found".into(),
                        truncated: true,
                    },
                ),
                tool("c3", ToolState::Error { error: "no".into() }),
            ],
            true,
        )),
        compaction(CompactionState::Running),
        compaction(CompactionState::Completed {
            summary: "they said hi".into(),
            kept_from: Seq(20),
        }),
        compaction(CompactionState::Failed {
            error: "too long".into(),
        }),
        // Format 5 from here on: calls held for their approvals, decided or not.
        Message::Assistant(assistant(
            [
                tool("c1", ToolState::Held),
                approval("c1", None),
                tool("c2", ToolState::Held),
                approval(
                    "c2",
                    Some(Decision {
                        verdict: Verdict::Approved,
                        by: None,
                        reason: None,
                        time: Timestamp(250),
                    }),
                ),
            ]
            .into_iter()
            .chain(VERDICTS.into_iter().enumerate().flat_map(|(n, verdict)| {
                let call_id = format!("d{n}");
                let decision = Decision {
                    verdict,
                    by: Some("alice".into()),
                    reason: Some(format!("{verdict:?} for a reason")),
                    time: Timestamp(260 + n as u64),
                };
                [
                    tool(&call_id, ToolState::Error { error: "no".into() }),
                    approval(&call_id, Some(decision)),
                ]
            }))
            .collect(),
            true,
        )),
    ]
}

fn approval(call_id: &str, decision: Option<Decision>) -> Part {
    Part::Approval(Approval {
        call_id: call_id.into(),
        digest: format!("sha256:{call_id}"),
        expires_at: Timestamp(1_700_000_600_000),
        decision,
    })
}

/// The shapes a message holds. No wildcard: a new variant fails to compile here until it has a
/// sample in [`messages`].
fn shapes(message: &Message, out: &mut BTreeSet<&'static str>) {
    match message {
        Message::User { .. } => out.insert("user"),
        Message::System { .. } => out.insert("system"),
        Message::Compaction { state, .. } => out.insert(match state {
            CompactionState::Running => "compaction running",
            CompactionState::Completed { .. } => "compaction completed",
            CompactionState::Failed { .. } => "compaction failed",
        }),
        Message::Assistant(a) => {
            for part in &a.parts {
                out.insert(match part {
                    Part::Text { .. } => "text",
                    Part::Reasoning { .. } => "reasoning",
                    Part::Tool(tool) => match tool.state {
                        ToolState::Running => "tool running",
                        ToolState::Completed { .. } => "tool completed",
                        ToolState::Error { .. } => "tool error",
                        ToolState::Held => "tool held",
                    },
                    Part::Approval(approval) => match &approval.decision {
                        None => "approval undecided",
                        Some(decision) => match decision.verdict {
                            Verdict::Approved => "approval approved",
                            Verdict::Denied => "approval denied",
                            Verdict::Expired => "approval expired",
                            Verdict::Cancelled => "approval cancelled",
                        },
                    },
                });
            }
            out.insert(if a.is_settled() {
                "assistant settled"
            } else {
                "assistant open"
            })
        }
    };
}
const MESSAGE_SHAPES: usize = 18;

fn round_trip<T: Record + PartialEq + std::fmt::Debug>(what: &str, value: &T) {
    let bytes = encode(value);
    // Whatever writer the codec hands bincode, the bytes are bincode's own encoding.
    let mut expected = FORMAT_VERSION.to_le_bytes().to_vec();
    expected.extend(bincode::serde::encode_to_vec(value.to_stored(), super::config()).unwrap());
    assert_eq!(bytes, expected, "{what}");
    assert_eq!(&decode::<T>(what, &bytes).expect("decodes"), value);
}

#[test]
fn every_record_shape_round_trips() {
    let events = events();
    let covered: BTreeSet<usize> = events.iter().map(variant).collect();
    assert_eq!(
        covered.len(),
        EVENT_VARIANTS,
        "a sample of every event variant"
    );
    for (n, event) in events.into_iter().enumerate() {
        let stored = Stored {
            seq: Seq(n as u64),
            time: Timestamp(1_700_000_000_000 + n as u64),
            event,
        };
        round_trip("event", &stored);
    }

    let messages = messages();
    let mut covered = BTreeSet::new();
    for message in &messages {
        shapes(message, &mut covered);
        round_trip("message", message);
    }
    assert_eq!(
        covered.len(),
        MESSAGE_SHAPES,
        "a sample of every message shape"
    );

    let mut inbox = Inbox::default();
    for seq in [4, 5, 9] {
        inbox.add(Seq(seq));
    }
    let row = |claim, optional: Option<&str>| SessionRow {
        id: sid("s"),
        agent: "default".into(),
        model: optional.map(Into::into),
        title: optional.map(Into::into),
        created: Timestamp(1),
        updated: Timestamp(2),
        last_seq: Seq(9),
        usage: usage(60),
        claim,
        resume_attempts: 3,
        halted: optional.map(Into::into),
        active_from: Seq(4),
        compaction: optional.map(|_| Seq(5)),
        pending: 3,
        budget: optional.map_or_else(Budget::default, |_| Budget {
            max_tokens: Some(10),
            max_cost_nanos: None,
            turn_max_tokens: Some(5),
            turn_max_cost_nanos: Some(1),
        }),
        blocked: optional.map(|_| Limit::TurnCost),
    };
    for record in [
        SessionRecord {
            row: row(
                Some(Claim {
                    seq: Seq(7),
                    forced: true,
                }),
                Some("set"),
            ),
            inbox,
            trails: true,
        },
        SessionRecord {
            row: row(None, None),
            inbox: Inbox::default(),
            trails: false,
        },
    ] {
        round_trip("session record", &record);
    }

    for entry in [
        IndexEntry::Prompt {
            session: sid("s"),
            admitted_seq: Seq(1),
            promoted_seq: Some(Seq(2)),
        },
        IndexEntry::Prompt {
            session: sid("s"),
            admitted_seq: Seq(1),
            promoted_seq: None,
        },
        IndexEntry::Message {
            session: sid("s"),
            seq: Seq(3),
        },
    ] {
        round_trip("index entry", &entry);
    }

    let schedules = schedules();
    let covered: BTreeSet<_> = schedules.iter().map(schedule_shape).collect();
    assert_eq!(
        covered.len(),
        SCHEDULE_SHAPES,
        "a sample of every schedule shape"
    );
    for schedule in &schedules {
        round_trip("schedule", schedule);
    }

    round_trip("instruction state", &InstructionState::default());
    round_trip(
        "instruction state",
        &InstructionState {
            sources: BTreeMap::from([
                ("agent".into(), "Be brief.".into()),
                ("project".into(), "Use tabs.".into()),
            ]),
        },
    );
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The values of [`events`] (each as a [`Stored`] at seq `n`) and [`messages`] that format 4
/// can express, as the format-4 build (commit fd152be) encoded them, in hex.
const FORMAT_4_EVENTS: [&str; 36] = [
    "040000fd0068e5cf8b010000000764656661756c7401046d6f636b010741207469746c65",
    "040001fd0168e5cf8b010000000764656661756c740000",
    "040002fd0268e5cf8b01000001066d73675f703100046c6f6f6b020a746578742f706c61696e1b64\
     6174613a746578742f706c61696e3b6261736536342c61476b3d010668692e74787409696d616765\
     2f706e671d68747470733a2f2f6578616d706c652e696e76616c69642f612e706e6700",
    "040003fd0368e5cf8b01000018066d73675f703201056c6174657200",
    "040004fd0468e5cf8b01000002066d73675f7031",
    "040005fd0568e5cf8b01000003076d73675f73797302056167656e740942652062726965662e0770\
     726f6a656374000942652062726965662e",
    "040006fd0668e5cf8b0100000401",
    "040007fd0768e5cf8b01000005",
    "040008fd0868e5cf8b0100000604626f6f6d01",
    "040009fd0968e5cf8b0100000803",
    "04000afd0a68e5cf8b01000009056d73675f61070764656661756c74046d6f636b",
    "04000bfd0b68e5cf8b0100000a056d73675f610568656c6c6f01",
    "04000cfd0c68e5cf8b0100000b056d73675f6103686d6d010373696700",
    "04000dfd0d68e5cf8b0100000b056d73675f6103686d6d0001",
    "04000efd0e68e5cf8b0100000c056d73675f61026331066c6f6f6b7570077b2271223a317d",
    "04000ffd0f68e5cf8b0100000d056d73675f6102633105666f756e6401",
    "040010fd1068e5cf8b0100000e056d73675f610263320c6e6f207375636820746f6f6c",
    "040011fd1168e5cf8b01000011056d73675f6102fbdc05021350726f76696465722077656e742077\
     726f6e67",
    "040012fd1268e5cf8b01000012056d73675f6301",
    "040013fd1368e5cf8b01000013056d73675f630c7468657920736169642068690c141516171819",
    "040014fd1468e5cf8b01000014056d73675f6308746f6f206c6f6e67",
    "040015fd1568e5cf8b010000151e1f20212223",
    "040016fd1668e5cf8b01000016056d73675f6128292a2b2c2d",
    "040017fd1768e5cf8b01000017056d73675f61026331107468652077686f6c65206f7574707574",
    "040018fd1868e5cf8b0100000700",
    "040019fd1968e5cf8b0100000701",
    "04001afd1a68e5cf8b0100000f056d73675f61000a0b0c0d0e0f",
    "04001bfd1b68e5cf8b0100000f056d73675f61010a0b0c0d0e0f",
    "04001cfd1c68e5cf8b0100000f056d73675f61020a0b0c0d0e0f",
    "04001dfd1d68e5cf8b0100000f056d73675f61030a0b0c0d0e0f",
    "04001efd1e68e5cf8b0100000f056d73675f61040570617573650a0b0c0d0e0f",
    "04001ffd1f68e5cf8b01000010056d73675f61001241626f727465642077656e742077726f6e67",
    "040020fd2068e5cf8b01000010056d73675f6101145265737461727465642077656e742077726f6e\
     67",
    "040021fd2168e5cf8b01000010056d73675f61021350726f76696465722077656e742077726f6e67",
    "040022fd2268e5cf8b01000010056d73675f61031a436f6e746578744f766572666c6f772077656e\
     742077726f6e67",
    "040023fd2368e5cf8b01000010056d73675f610413496e7465726e616c2077656e742077726f6e67",
];

const FORMAT_4_MESSAGES: [&str; 7] = [
    "040000066d73675f7031020101046c6f6f6b020a746578742f706c61696e1b646174613a74657874\
     2f706c61696e3b6261736536342c61476b3d010668692e74787409696d6167652f706e671d687474\
     70733a2f2f6578616d706c652e696e76616c69642f612e706e670005",
    "040002076d73675f737973030942652062726965662e06",
    "040001056d73675f6109020764656661756c74046d6f636b000000323334353637046400",
    "040001056d73675f6109020764656661756c74046d6f636b060103686d6d0103736967000102686d\
     000100084c6f6f6b696e672e0002026331066c6f6f6b7570027b7d0002026332066c6f6f6b757002\
     7b7d0105666f756e640102026333066c6f6f6b7570027b7d02026e6f010405706175736501031a43\
     6f6e746578744f766572666c6f772077656e742077726f6e67323334353637046401c8",
    "040003056d73675f631e0100fb2c01",
    "040003056d73675f631e01010c74686579207361696420686914fb2c01",
    "040003056d73675f631e010208746f6f206c6f6e67fb2c01",
];

/// Every value of format `version` (`events` and `messages`, in hex, the first samples of
/// [`events`] and [`messages`]) decodes with this build's records to what that format's build
/// encoded, and this build writes the same bytes after its own version.
fn older_records_decode_unchanged(version: u16, old_events: &[&str], old_messages: &[&str]) {
    let (events, messages) = (events(), messages());
    assert!(events.len() > old_events.len() && messages.len() >= old_messages.len());
    for (n, (event, hex)) in events.into_iter().zip(old_events).enumerate() {
        let stored = Stored {
            seq: Seq(n as u64),
            time: Timestamp(1_700_000_000_000 + n as u64),
            event,
        };
        let old = unhex(hex);
        assert_eq!(old[..2], version.to_le_bytes(), "a format-{version} record");
        assert_eq!(
            decode::<Stored>("event", &old).expect("decodes"),
            stored,
            "format {version}: event sample {n}"
        );
        assert_eq!(
            encode(&stored)[2..],
            old[2..],
            "format {version}: event sample {n}"
        );
    }
    for (n, (message, hex)) in messages.into_iter().zip(old_messages).enumerate() {
        let old = unhex(hex);
        assert_eq!(old[..2], version.to_le_bytes(), "a format-{version} record");
        assert_eq!(
            decode::<Message>("message", &old).expect("decodes"),
            message,
            "format {version}: message sample {n}"
        );
        assert_eq!(
            encode(&message)[2..],
            old[2..],
            "format {version}: message sample {n}"
        );
    }
}

/// Formats 5 and 6 append variants only: every format-4 value decodes unchanged. The same holds
/// of format 3 (format 4 appended one event variant), which the golden stores show.
#[test]
fn format_4_records_decode_unchanged() {
    older_records_decode_unchanged(4, &FORMAT_4_EVENTS, &FORMAT_4_MESSAGES);
}

/// The values of [`events`] (each as a [`Stored`] at seq `n`) and [`messages`] that format 5
/// can express, as the format-5 build (commit 23e1838) encoded them, in hex.
const FORMAT_5_EVENTS: [&str; 43] = [
    "050000fd0068e5cf8b010000000764656661756c7401046d6f636b010741207469746c65",
    "050001fd0168e5cf8b010000000764656661756c740000",
    "050002fd0268e5cf8b01000001066d73675f703100046c6f6f6b020a746578742f706c61696e1b64\
     6174613a746578742f706c61696e3b6261736536342c61476b3d010668692e74787409696d616765\
     2f706e671d68747470733a2f2f6578616d706c652e696e76616c69642f612e706e6700",
    "050003fd0368e5cf8b01000018066d73675f703201056c6174657200",
    "050004fd0468e5cf8b01000002066d73675f7031",
    "050005fd0568e5cf8b01000003076d73675f73797302056167656e740942652062726965662e0770\
     726f6a656374000942652062726965662e",
    "050006fd0668e5cf8b0100000401",
    "050007fd0768e5cf8b01000005",
    "050008fd0868e5cf8b0100000604626f6f6d01",
    "050009fd0968e5cf8b0100000803",
    "05000afd0a68e5cf8b01000009056d73675f61070764656661756c74046d6f636b",
    "05000bfd0b68e5cf8b0100000a056d73675f610568656c6c6f01",
    "05000cfd0c68e5cf8b0100000b056d73675f6103686d6d010373696700",
    "05000dfd0d68e5cf8b0100000b056d73675f6103686d6d0001",
    "05000efd0e68e5cf8b0100000c056d73675f61026331066c6f6f6b7570077b2271223a317d",
    "05000ffd0f68e5cf8b0100000d056d73675f6102633105666f756e6401",
    "050010fd1068e5cf8b0100000e056d73675f610263320c6e6f207375636820746f6f6c",
    "050011fd1168e5cf8b01000011056d73675f6102fbdc05021350726f76696465722077656e742077\
     726f6e67",
    "050012fd1268e5cf8b01000012056d73675f6301",
    "050013fd1368e5cf8b01000013056d73675f630c7468657920736169642068690c141516171819",
    "050014fd1468e5cf8b01000014056d73675f6308746f6f206c6f6e67",
    "050015fd1568e5cf8b010000151e1f20212223",
    "050016fd1668e5cf8b01000016056d73675f6128292a2b2c2d",
    "050017fd1768e5cf8b01000017056d73675f61026331107468652077686f6c65206f7574707574",
    "050018fd1868e5cf8b0100000700",
    "050019fd1968e5cf8b0100000701",
    "05001afd1a68e5cf8b0100000f056d73675f61000a0b0c0d0e0f",
    "05001bfd1b68e5cf8b0100000f056d73675f61010a0b0c0d0e0f",
    "05001cfd1c68e5cf8b0100000f056d73675f61020a0b0c0d0e0f",
    "05001dfd1d68e5cf8b0100000f056d73675f61030a0b0c0d0e0f",
    "05001efd1e68e5cf8b0100000f056d73675f61040570617573650a0b0c0d0e0f",
    "05001ffd1f68e5cf8b01000010056d73675f61001241626f727465642077656e742077726f6e67",
    "050020fd2068e5cf8b01000010056d73675f6101145265737461727465642077656e742077726f6e\
     67",
    "050021fd2168e5cf8b01000010056d73675f61021350726f76696465722077656e742077726f6e67",
    "050022fd2268e5cf8b01000010056d73675f61031a436f6e746578744f766572666c6f772077656e\
     742077726f6e67",
    "050023fd2368e5cf8b01000010056d73675f610413496e7465726e616c2077656e742077726f6e67",
    "050024fd2468e5cf8b01000019056d73675f61026334037061790b7368613235363a34613166fdc0\
     8feecf8b010000",
    "050025fd2568e5cf8b0100001a056d73675f61026334000105616c6963650115417070726f766564\
     20666f72206120726561736f6e",
    "050026fd2668e5cf8b0100001a056d73675f61026334010105616c696365011344656e6965642066\
     6f72206120726561736f6e",
    "050027fd2768e5cf8b0100001a056d73675f61026334020105616c69636501144578706972656420\
     666f72206120726561736f6e",
    "050028fd2868e5cf8b0100001a056d73675f61026334030105616c696365011643616e63656c6c65\
     6420666f72206120726561736f6e",
    "050029fd2968e5cf8b0100001a056d73675f61026335020000",
    "05002afd2a68e5cf8b0100001b056d73675f61026334",
];

const FORMAT_5_MESSAGES: [&str; 8] = [
    "050000066d73675f7031020101046c6f6f6b020a746578742f706c61696e1b646174613a74657874\
     2f706c61696e3b6261736536342c61476b3d010668692e74787409696d6167652f706e671d687474\
     70733a2f2f6578616d706c652e696e76616c69642f612e706e670005",
    "050002076d73675f737973030942652062726965662e06",
    "050001056d73675f6109020764656661756c74046d6f636b000000323334353637046400",
    "050001056d73675f6109020764656661756c74046d6f636b060103686d6d0103736967000102686d\
     000100084c6f6f6b696e672e0002026331066c6f6f6b7570027b7d0002026332066c6f6f6b757002\
     7b7d0105666f756e640102026333066c6f6f6b7570027b7d02026e6f010405706175736501031a43\
     6f6e746578744f766572666c6f772077656e742077726f6e67323334353637046401c8",
    "050003056d73675f631e0100fb2c01",
    "050003056d73675f631e01010c74686579207361696420686914fb2c01",
    "050003056d73675f631e010208746f6f206c6f6e67fb2c01",
    "050001056d73675f6109020764656661756c74046d6f636b0c02026331066c6f6f6b7570027b7d03\
     03026331097368613235363a6331fdc08feecf8b0100000002026332066c6f6f6b7570027b7d0303\
     026332097368613235363a6332fdc08feecf8b01000001000000fa02026430066c6f6f6b7570027b\
     7d02026e6f03026430097368613235363a6430fdc08feecf8b01000001000105616c696365011541\
     7070726f76656420666f72206120726561736f6efb040102026431066c6f6f6b7570027b7d02026e\
     6f03026431097368613235363a6431fdc08feecf8b01000001010105616c696365011344656e6965\
     6420666f72206120726561736f6efb050102026432066c6f6f6b7570027b7d02026e6f0302643209\
     7368613235363a6432fdc08feecf8b01000001020105616c69636501144578706972656420666f72\
     206120726561736f6efb060102026433066c6f6f6b7570027b7d02026e6f03026433097368613235\
     363a6433fdc08feecf8b01000001030105616c696365011643616e63656c6c656420666f72206120\
     726561736f6efb0701010405706175736501031a436f6e746578744f766572666c6f772077656e74\
     2077726f6e67323334353637046401c8",
];

/// Format 6 appends variants only: every format-5 value decodes unchanged.
#[test]
fn format_5_records_decode_unchanged() {
    older_records_decode_unchanged(5, &FORMAT_5_EVENTS, &FORMAT_5_MESSAGES);
}

/// Format 5's variants come after format 4's: its events after the 25 of format 4, its tool
/// state after 3 and its part after 3 of format 3, and the verdicts in their order.
#[test]
fn format_5_variants_are_appended() {
    // A stored event at seq 0 and time 0: the seq, the time, then the event's variant.
    let position = |event: Event| {
        encode(&Stored {
            seq: Seq(0),
            time: Timestamp(0),
            event,
        })[2..5]
            .to_vec()
    };
    let a = mid("a");
    assert_eq!(
        position(Event::ApprovalRequested {
            id: a.clone(),
            call_id: "c".into(),
            name: "t".into(),
            digest: "d".into(),
            expires_at: Timestamp(1),
        }),
        [0, 0, 25]
    );
    for (n, verdict) in VERDICTS.into_iter().enumerate() {
        let bytes = encode(&Stored {
            seq: Seq(0),
            time: Timestamp(0),
            event: Event::ApprovalDecided {
                id: a.clone(),
                call_id: "c".into(),
                verdict,
                by: None,
                reason: None,
            },
        });
        // The variant, the id (its length, "msg_a"), the call id (its length, "c"), the verdict.
        assert_eq!(bytes[2..5], [0, 0, 26]);
        assert_eq!(bytes[5 + 6 + 2], n as u8, "{verdict:?}");
    }
    assert_eq!(
        position(Event::ToolStarted {
            id: a,
            call_id: "c".into(),
        }),
        [0, 0, 27]
    );
    // An assistant message with one part: its variant follows the message's fixed fields.
    let held = encode(&Message::Assistant(assistant(
        vec![Part::Tool(ToolPart {
            call_id: "c".into(),
            name: "n".into(),
            input: "i".into(),
            state: ToolState::Held,
        })],
        false,
    )));
    let approval = encode(&Message::Assistant(assistant(
        vec![approval("c", None)],
        false,
    )));
    let empty = encode(&Message::Assistant(assistant(Vec::new(), false)));
    // The parts begin where the empty message has its part count (0); then the part's variant.
    let at = empty
        .iter()
        .zip(&held)
        .position(|(a, b)| a != b)
        .expect("the part count differs");
    assert_eq!(
        (empty[at], held[at], held[at + 1]),
        (0, 1, 2),
        "a tool part"
    );
    // The tool part: call id, name, input (each a length and one byte), then its state.
    assert_eq!(held[at + 2..at + 8], *b"\x01c\x01n\x01i");
    assert_eq!(held[at + 8], 3, "Held after Running, Completed, Error");
    assert_eq!(approval[at + 1], 3, "Approval after Text, Reasoning, Tool");
}

/// Format 6's event variants come after format 5's (the 24 of format 3, `PromptDeferred` of
/// format 4, the three of format 5), and a schedule is its fields in order, `When` and
/// `CatchUp` by their variants' positions.
#[test]
fn format_6_variants_are_appended() {
    let at_zero = |event: Event| {
        encode(&Stored {
            seq: Seq(0),
            time: Timestamp(0),
            event,
        })
    };
    let schedule = Schedule {
        id: sch("a"),
        prompt: Prompt::text("p"),
        delivery: Delivery::Queue,
        when: When::Once,
        catch_up: CatchUp::Skip,
        next: Timestamp(5),
    };
    // The id (its length, "sch_a"), the prompt (its text's length, "p", no files), the
    // delivery, `When::Once`, `CatchUp::Skip`, the next time.
    let fields = [&[5][..], b"sch_a", &[1], b"p", &[0], &[1], &[0], &[1], &[5]].concat();
    let set = at_zero(Event::ScheduleSet {
        schedule: schedule.clone(),
    });
    // The version, the seq, the time, then the event's variant.
    let version = FORMAT_VERSION as u8;
    assert_eq!(set[..5], [version, 0, 0, 0, 28]);
    assert_eq!(set[5..], fields[..]);
    assert_eq!(encode(&schedule), [&[version, 0][..], &fields].concat());
    let cron = encode(&Schedule {
        when: When::Cron {
            expr: "* * * * *".into(),
            tz: None,
        },
        catch_up: CatchUp::Once,
        ..schedule
    });
    // After the id, the prompt and the delivery: `When::Cron`, its expression, no zone, then
    // `CatchUp::Once`.
    assert_eq!(cron[2 + 6 + 3 + 1..][..3], [1, 9, b'*']);
    assert_eq!(cron[2 + 6 + 3 + 1 + 1 + 10..][..2], [0, 0]);
    let fired = at_zero(Event::ScheduleFired {
        id: sch("a"),
        at: Timestamp(5),
        next: Some(Timestamp(7)),
        admitted: true,
    });
    assert_eq!(
        fired[2..],
        [&[0, 0, 29, 5][..], b"sch_a", &[5, 1, 7, 1]].concat()[..]
    );
    let cancelled = at_zero(Event::ScheduleCancelled { id: sch("a") });
    assert_eq!(cancelled[2..], [&[0, 0, 30, 5][..], b"sch_a"].concat()[..]);
}

#[test]
fn format_7_budgets_are_appended_and_older_session_records_read_without_one() {
    let at_zero = |event: Event| {
        encode(&Stored {
            seq: Seq(0),
            time: Timestamp(0),
            event,
        })
    };
    // The seq, the time, then the event's variant after format 6's last (`ScheduleCancelled`,
    // 30): the budget's four optional limits, or the limit, the spend and the cap.
    let set = at_zero(Event::BudgetSet {
        budget: Budget {
            max_tokens: Some(3),
            ..Budget::default()
        },
    });
    assert_eq!(set[2..], [0, 0, 31, 1, 3, 0, 0, 0]);
    let exhausted = at_zero(Event::BudgetExhausted {
        which: Limit::TurnCost,
        spent: 5,
        limit: 9,
    });
    assert_eq!(exhausted[2..], [0, 0, 32, 3, 5, 9]);
    let by = at_zero(Event::InterruptRequested { by: "ops".into() });
    assert_eq!(by[2..], [&[0, 0, 33, 3][..], b"ops"].concat()[..]);

    // A session record of format 6 is format 3's: without the budget's fields after it. It
    // reads as a session with no budget of its own, unblocked.
    let mut inbox = Inbox::default();
    inbox.add(Seq(2));
    let record = SessionRecord {
        row: agenthost_model::SessionRow {
            budget: Budget::default(),
            blocked: None,
            ..crate::tests::session_row("ses_old", 1, None)
        },
        inbox,
        trails: false,
    };
    let now = encode(&record);
    // Format 9's record ends with whether it trails; without it, it is format 7's.
    assert_eq!(now[now.len() - 1], 0);
    let seven = [&7u16.to_le_bytes()[..], &now[2..now.len() - 1]].concat();
    assert_eq!(
        decode::<SessionRecord>("session", &seven).expect("decodes"),
        record
    );
    // No budget of its own (four absent limits), no block.
    assert_eq!(seven[seven.len() - 5..], [0, 0, 0, 0, 0]);
    let six = [&6u16.to_le_bytes()[..], &seven[2..seven.len() - 5]].concat();
    assert_eq!(
        decode::<SessionRecord>("session", &six).expect("decodes"),
        record
    );
    // Format 7's own record carries them.
    let blocked = SessionRecord {
        row: agenthost_model::SessionRow {
            budget: Budget {
                turn_max_tokens: Some(4),
                ..Budget::default()
            },
            blocked: Some(Limit::Cost),
            ..record.row.clone()
        },
        inbox: record.inbox.clone(),
        trails: false,
    };
    round_trip("session record", &blocked);
    // A format-6 value cut short of its fields, or a format-7 value without them, is corrupt.
    assert!(decode::<SessionRecord>("session", &six[..six.len() - 1]).is_err());
    let seven_short = [&FORMAT_VERSION.to_le_bytes()[..], &now[2..now.len() - 5]].concat();
    assert!(decode::<SessionRecord>("session", &seven_short).is_err());
}

#[test]
fn an_invalid_schedule_id_in_a_record_is_corrupt() {
    let bytes = encode(&schedules()[0]);
    let at = bytes
        .windows(4)
        .position(|w| w == b"sch_")
        .expect("the id is in the record");
    let mut bad = bytes;
    bad[at..at + 4].copy_from_slice(b"msg_");
    assert!(matches!(
        decode::<Schedule>("schedule", &bad),
        Err(Error::Corrupt { reason, .. }) if reason.contains("invalid schedule id")
    ));
}

#[test]
fn an_invalid_id_in_a_record_is_corrupt() {
    let bytes = encode(&Stored {
        seq: Seq(1),
        time: Timestamp(2),
        event: Event::PromptPromoted { id: mid("x") },
    });
    let at = bytes
        .windows(4)
        .position(|w| w == b"msg_")
        .expect("the id is in the record");
    let mut bad = bytes;
    bad[at..at + 4].copy_from_slice(b"ses_");
    assert!(matches!(
        decode::<Stored>("event", &bad),
        Err(Error::Corrupt { reason, .. }) if reason.contains("invalid message id")
    ));
}

fn fuzz_cases() -> u32 {
    if std::env::var_os("AGENTHOST_SOAK").is_some() {
        20_000
    } else {
        256
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(fuzz_cases()))]

    /// Damaged records (bytes flipped, cut or appended) and arbitrary bytes decode to a value or
    /// an error, never a panic, and never allocate beyond the record limit.
    #[test]
    fn damaged_records_are_errors_not_panics(
        which in 0usize..64,
        flips in proptest::collection::vec((proptest::prelude::any::<usize>(), 1u8..=255), 0..8),
        cut in proptest::option::of(proptest::prelude::any::<usize>()),
        tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..16),
        raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
    ) {
        let events = events();
        let messages = messages();
        let mut bytes = match which % 2 {
            0 => encode(&Stored {
                seq: Seq(which as u64),
                time: Timestamp(7),
                event: events[which % events.len()].clone(),
            }),
            _ => encode(&messages[which % messages.len()]),
        };
        for (at, mask) in &flips {
            let len = bytes.len();
            bytes[at % len] ^= mask;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % (bytes.len() + 1));
        }
        bytes.extend_from_slice(&tail);
        let _ = decode::<Stored>("event", &bytes);
        let _ = decode::<Message>("message", &bytes);
        let _ = records("event", &bytes);
        let _ = decode::<Stored>("event", &raw);
        let _ = decode::<Message>("message", &raw);
        let _ = decode::<IndexEntry>("index entry", &raw);
        let _ = decode::<Schedule>("schedule", &raw);
        let _ = records("event", &raw);
        // With a valid version header, the body is all the decoder sees.
        let mut versioned = FORMAT_VERSION.to_le_bytes().to_vec();
        versioned.extend_from_slice(&raw);
        let _ = decode::<Stored>("event", &versioned);
        let _ = decode::<crate::record::SessionRecord>("session record", &versioned);
        let _ = decode::<InstructionState>("instruction state", &versioned);
        let _ = decode::<Schedule>("schedule", &versioned);
    }
}
