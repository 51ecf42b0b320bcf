//! Store layer: durable admissions per second with and without group commit, at 1, 64 and 1024
//! concurrent sessions, and snapshot reads of an active history.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agenthost_benches::message_id;
use agenthost_model::history::Mode;
use agenthost_model::{Delivery, Event, MessageId, Prompt, SessionId};
use agenthost_store::{Admission, Config, NewSession, RedbStore, Store};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Ids minted so far, so that every admission of every sample has its own.
static MINTED: AtomicUsize = AtomicUsize::new(0);

fn runtime() -> tokio::runtime::Runtime {
    agenthost_benches::tokio_runtime()
}

fn session(i: usize) -> SessionId {
    SessionId::parse(&format!("ses_bench{i}")).expect("valid")
}

async fn create_sessions(store: &RedbStore, n: usize) {
    let futures: Vec<_> = (0..n)
        .map(|i| {
            store.create_session(NewSession {
                id: session(i),
                agent: "default".into(),
                model: None,
                title: None,
            })
        })
        .collect();
    for f in futures {
        f.await.expect("created");
    }
}

fn admissions(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("admit");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));
    for (mode, max_batch) in [("group_commit", 4096), ("commit_per_admission", 1)] {
        for sessions in [1usize, 64, 1024] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut config = Config::new(dir.path().join("bench.redb"));
            config.max_batch = max_batch;
            let store = Arc::new(RedbStore::open(config).expect("store"));
            rt.block_on(create_sessions(&store, sessions));
            group.bench_with_input(
                BenchmarkId::new(mode, sessions),
                &sessions,
                |b, &sessions| {
                    b.iter_custom(|iters| {
                        let store = store.clone();
                        rt.block_on(async move {
                            let per_session = (iters as usize).div_ceil(sessions);
                            let start = Instant::now();
                            let tasks: Vec<_> = (0..sessions)
                                .map(|s| {
                                    let store = store.clone();
                                    // A writer holds the id of the session it admits to.
                                    let s = session(s);
                                    tokio::spawn(async move {
                                        for _ in 0..per_session {
                                            // Minted as the runtime mints an id the client
                                            // did not supply.
                                            let n = MINTED.fetch_add(1, Ordering::Relaxed);
                                            let id = message_id(n);
                                            let admission = Admission {
                                                session: s.clone(),
                                                id,
                                                prompt: Prompt::text("benchmark prompt"),
                                                delivery: Delivery::Steer,
                                                wake: true,
                                            };
                                            store.admit(admission).await.expect("admitted");
                                        }
                                    })
                                })
                                .collect();
                            for t in tasks {
                                t.await.expect("joined");
                            }
                            // Scale to the iterations asked for (rounding up may do a few more).
                            start
                                .elapsed()
                                .mul_f64(iters as f64 / (per_session * sessions) as f64)
                        })
                    })
                },
            );
        }
    }
    group.finish();
}

fn snapshot_reads(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("snapshot_history");
    group.sample_size(20);
    for messages in [1_000usize, 10_000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(Config::new(dir.path().join("bench.redb"))).expect("store");
        let s = session(0);
        rt.block_on(async {
            create_sessions(&store, 1).await;
            for chunk in 0..messages / 100 {
                let events = (0..100)
                    .map(|i| Event::InstructionsUpdated {
                        id: MessageId::parse(&format!("msg_c{chunk}i{i}")).expect("valid"),
                        changed: vec![],
                        text: "a message of ordinary length, about a sentence or two long.".into(),
                    })
                    .collect();
                store.append(s.clone(), events).await.expect("appended");
            }
        });
        group.throughput(Throughput::Elements(messages as u64));
        group.bench_with_input(BenchmarkId::from_parameter(messages), &messages, |b, _| {
            b.iter(|| {
                let snap = store.snapshot().expect("snapshot");
                let (_, history) = snap.history(&s, Mode::All).expect("read").expect("exists");
                assert_eq!(history.messages.len(), messages);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, admissions, snapshot_reads);
criterion_main!(benches);
