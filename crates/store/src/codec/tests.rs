//! The record format: version headers, runs, and every record shape through its conversions.

use std::collections::{BTreeMap, BTreeSet};

use agenthost_model::message::Claim;
use agenthost_model::{
    AssistantMessage, CompactionState, Delivery, Event, FailureKind, FileAttachment, Finish,
    IndexEntry, InstructionState, InterruptReason, Message, MessageId, Part, Prompt, Seq,
    SessionId, SessionRow, StepError, Stored, Timestamp, ToolPart, ToolState, Usage,
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
    future[..2].copy_from_slice(&7u16.to_le_bytes());
    assert!(matches!(
        decode::<Stored>("event", &future),
        Err(Error::FormatVersion {
            found: 7,
            supported: FORMAT_VERSION
        })
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

/// Each variant of every enum an event holds, at least once.
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
    }
}
const EVENT_VARIANTS: usize = 24;

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

/// Every message variant, compaction state, part and tool state.
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
    ]
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
const MESSAGE_SHAPES: usize = 12;

fn round_trip<T: Record + PartialEq + std::fmt::Debug>(what: &str, value: &T) {
    let bytes = encode(value);
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
        },
        SessionRecord {
            row: row(None, None),
            inbox: Inbox::default(),
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
        let _ = records("event", &raw);
        // With a valid version header, the body is all the decoder sees.
        let mut versioned = FORMAT_VERSION.to_le_bytes().to_vec();
        versioned.extend_from_slice(&raw);
        let _ = decode::<Stored>("event", &versioned);
        let _ = decode::<crate::record::SessionRecord>("session record", &versioned);
        let _ = decode::<InstructionState>("instruction state", &versioned);
    }
}
