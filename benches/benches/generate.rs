//! Generate layer: preparation time (one snapshot + the shared request build,
//! provider excluded) against active-history length, including a long log whose active history
//! after compaction is short; and generate throughput with concurrent callers while drains run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthost_actors::prepare::{Catalog, Inputs, prepare};
use agenthost_actors::{Config, CreateSession, PromptRequest, Purpose, Runtime, Tools};
use agenthost_model::history::Mode;
use agenthost_model::{Event, Finish, MessageId, Seq, SessionId, Usage};
use agenthost_store::{NewSession, RedbStore, Store};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn runtime() -> tokio::runtime::Runtime {
    agenthost_benches::tokio_runtime()
}

fn id(prefix: &str, n: usize) -> MessageId {
    MessageId::parse(&format!("msg_{prefix}{n}")).expect("valid")
}

/// Appends `exchanges` user/assistant pairs (two messages each, six events) to `s`.
async fn grow(store: &RedbStore, s: &SessionId, exchanges: usize, tag: &str) {
    for chunk in (0..exchanges).collect::<Vec<_>>().chunks(200) {
        let mut events = Vec::new();
        for &n in chunk {
            let a = id(&format!("{tag}a"), n);
            events.push(Event::InstructionsUpdated {
                id: id(&format!("{tag}u"), n),
                changed: Vec::new(),
                text: "a user turn of ordinary length, a sentence or two about the task".into(),
            });
            events.push(Event::StepStarted {
                id: a.clone(),
                step: 1,
                agent: "default".into(),
                model: "m".into(),
            });
            events.push(Event::TextEnded {
                id: a.clone(),
                text: "an answer of ordinary length, two or three sentences about what was done"
                    .into(),
                incomplete: false,
            });
            events.push(Event::StepEnded {
                id: a,
                finish: Finish::Stop,
                usage: Usage::default(),
            });
        }
        store.append(s.clone(), events).await.expect("appended");
    }
}

fn preparation(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RedbStore::open(agenthost_store::Config::new(dir.path().join("bench.redb")))
        .expect("store");
    let config = Config::new(dir.path().join("unused.redb"));
    let catalog = Catalog {
        providers: config.providers.clone(),
        models: config.models.clone(),
        agents: config.agents.clone(),
        default_agent: config.default_agent.clone(),
    };
    let tools = std::sync::Arc::new(Tools::default());
    let mut cases: Vec<(String, SessionId, usize)> = Vec::new();
    rt.block_on(async {
        for messages in [10usize, 1_000, 10_000] {
            let s = SessionId::parse(&format!("ses_h{messages}")).expect("valid");
            store
                .create_session(NewSession {
                    id: s.clone(),
                    agent: "default".into(),
                    model: None,
                    title: None,
                })
                .await
                .expect("created");
            grow(&store, &s, messages / 2, &format!("h{messages}")).await;
            cases.push((format!("{messages}_messages"), s, messages));
        }
        // 100 000 events, of which the active history after compaction is the last 100 messages.
        let s = SessionId::parse("ses_compacted").expect("valid");
        store
            .create_session(NewSession {
                id: s.clone(),
                agent: "default".into(),
                model: None,
                title: None,
            })
            .await
            .expect("created");
        grow(&store, &s, 25_000, "c").await;
        let last = store
            .snapshot()
            .expect("snap")
            .session(&s)
            .expect("read")
            .expect("row")
            .last_seq;
        let kept_from = Seq(last.0 - 200 + 1);
        let compaction = id("compaction", 0);
        let events = vec![
            Event::CompactionStarted {
                id: compaction.clone(),
                auto: true,
            },
            Event::CompactionEnded {
                id: compaction,
                summary: "what happened before".into(),
                kept_from,
                usage: Usage::default(),
            },
        ];
        store.append(s.clone(), events).await.expect("compacted");
        cases.push(("100k_events_100_active".into(), s, 100));
    });

    let mut group = c.benchmark_group("prepare_generate");
    group.sample_size(20);
    for (name, s, messages) in &cases {
        group.throughput(Throughput::Elements(*messages as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                let snap = store.snapshot().expect("snapshot");
                let (row, history) = snap
                    .history(s, Mode::Settled)
                    .expect("read")
                    .expect("exists");
                let inputs = Inputs {
                    catalog: &catalog,
                    tools: &tools,
                    hooks: &[],
                    row: &row,
                    history: &history,
                    step: 1,
                    purpose: Purpose::Generate,
                };
                let prepared =
                    prepare(inputs, Some("summarize where we left off")).expect("prepared");
                assert!(prepared.request.messages.len() >= *messages / 2);
                prepared
            })
        });
    }
    group.finish();
}

fn throughput(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = rt
        .block_on(Runtime::start(Config::new(dir.path().join("bench.redb"))))
        .expect("runtime");
    let sessions: Vec<SessionId> = rt.block_on(async {
        let mut sessions = Vec::new();
        for _ in 0..64 {
            let s = runtime
                .create_session(CreateSession::default())
                .await
                .expect("session")
                .id;
            runtime
                .prompt(PromptRequest::new(&s, "start"))
                .await
                .expect("admitted");
            sessions.push(s);
        }
        for s in &sessions {
            runtime
                .wait_idle(s, Duration::from_secs(60))
                .await
                .expect("idle");
        }
        sessions
    });
    let sessions = Arc::new(sessions);
    let mut group = c.benchmark_group("generate");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));
    group.bench_function("64_callers_with_drains", |b| {
        b.iter_custom(|iters| {
            let runtime = runtime.clone();
            let sessions = sessions.clone();
            rt.block_on(async move {
                // Drains run on the same sessions while generate is measured.
                for s in sessions.iter() {
                    runtime
                        .prompt(PromptRequest::new(s, "keep working"))
                        .await
                        .expect("admitted");
                }
                let per = (iters as usize).div_ceil(sessions.len());
                let start = Instant::now();
                let callers: Vec<_> = sessions
                    .iter()
                    .cloned()
                    .map(|s| {
                        let runtime = runtime.clone();
                        tokio::spawn(async move {
                            for _ in 0..per {
                                runtime.generate(&s, "recap").await.expect("generated");
                            }
                        })
                    })
                    .collect();
                for caller in callers {
                    caller.await.expect("joined");
                }
                let elapsed = start.elapsed();
                for s in sessions.iter() {
                    runtime
                        .wait_idle(s, Duration::from_secs(60))
                        .await
                        .expect("idle");
                }
                elapsed.mul_f64(iters as f64 / (per * sessions.len()) as f64)
            })
        })
    });
    group.finish();
    rt.block_on(runtime.shutdown());
}

criterion_group!(benches, preparation, throughput);
criterion_main!(benches);
