//! Admissions per second at N concurrent sessions, with what criterion does not show: bytes
//! written per admission (redb's copy-on-write pages) and operations per commit.
//!
//! `cargo run --release -p agenthost-benches --example admit_probe -- [sessions] [per round] [minted|named] [rounds] [linger ms] [max batch] [fold rows] [cache MiB]`
//!
//! The linger is the store's default (`DEFAULT_LINGER`, 1 ms, as `serve` runs) unless given; 0
//! never lingers. A long one makes batches full even when the threads run one at a time, as
//! under callgrind, so an instruction count sees the batch sizes of a real run.
//!
//! `minted` uses sortable ids as the runtime mints them; `named` uses client-chosen ids in
//! the store bench's pattern.

use std::sync::Arc;
use std::time::Instant;

use agenthost_benches::{message_id, session_id, thread_cpu, tokio_runtime, written_bytes};
use agenthost_model::{Delivery, MessageId, Prompt, SessionId};
use agenthost_store::{Admission, Config, NewSession, RedbStore, Store};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (sessions, per, rounds) = (arg(1, 1024), arg(2, 50), arg(4, 3));
    let minted = args.get(3).is_none_or(|s| s == "minted");
    let rt = tokio_runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("p.redb"));
    // The store's own linger unless given: what `serve` and an embedding program run with.
    if let Some(ms) = args.get(5) {
        config.max_wait = std::time::Duration::from_millis(ms.parse().expect("a number"));
    }
    config.max_batch = arg(6, config.max_batch);
    config.fold_rows = arg(7, config.fold_rows);
    // The page cache: redb's own default (1 GiB) unless given, as `serve` gives its own.
    if let Some(mib) = args.get(8) {
        config.cache_size = Some(mib.parse::<usize>().expect("a number") << 20);
    }
    let store = Arc::new(RedbStore::open(config).expect("store"));
    let ids: Vec<SessionId> = (0..sessions).map(session_id).collect();
    // Created concurrently, so that they share commits as the admissions will.
    rt.block_on(async {
        let mut creating = tokio::task::JoinSet::new();
        for id in &ids {
            let (store, id) = (store.clone(), id.clone());
            creating.spawn(async move {
                let new = NewSession {
                    id,
                    agent: "default".into(),
                    model: None,
                    title: None,
                };
                store.create_session(new).await.expect("created");
            });
        }
        creating.join_all().await;
    });
    let fold_stats = |store: &RedbStore| {
        let stats = store.stats();
        (stats.maintenance_runs.get(), stats.maintenance_micros.get())
    };
    for round in 0..rounds {
        let (folds, fold_micros) = fold_stats(&store);
        let (written, commits, commit_micros) = (
            written_bytes(),
            store.stats().commits.get(),
            store.stats().commit_micros.get(),
        );
        // The writer's threads: the planner runs operations, the committer writes them, the
        // folder prepares folds of the log's front.
        let writer = || {
            let cpu = thread_cpu();
            let of = |name: &str| cpu.get(name).copied().unwrap_or_default();
            (
                of("store-planner"),
                of("store-committer"),
                of("store-folder"),
            )
        };
        let writer_cpu = writer();
        let all_cpu = thread_cpu();
        let start = Instant::now();
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for (s, id) in ids.iter().enumerate() {
                let (store, id) = (store.clone(), id.clone());
                tasks.spawn(async move {
                    for i in 0..per {
                        let mid = match minted {
                            true => message_id((round * sessions + s) * per + i),
                            false => {
                                MessageId::parse(&format!("msg_r{round}s{s}i{i}")).expect("valid")
                            }
                        };
                        let admission = Admission {
                            session: id.clone(),
                            id: mid,
                            prompt: Prompt::text("benchmark prompt"),
                            delivery: Delivery::Steer,
                            wake: true,
                        };
                        store.admit(admission).await.expect("admitted");
                    }
                });
            }
            while let Some(joined) = tasks.join_next().await {
                joined.expect("task");
            }
        });
        let n = (sessions * per) as f64;
        let commits = store.stats().commits.get() - commits;
        let (planner, committer, folder) = writer();
        let per = |now: std::time::Duration, then: std::time::Duration| {
            (now - then).as_secs_f64() * 1e6 / n
        };
        println!(
            "round {round}: {:.1} k admissions/s, writer CPU {:.1} + {:.1} + {:.1} µs per admission (planner + committer + folder), {:.0} B written per admission, {:.0} per commit",
            n / start.elapsed().as_secs_f64() / 1000.0,
            per(planner, writer_cpu.0),
            per(committer, writer_cpu.1),
            per(folder, writer_cpu.2),
            (written_bytes() - written) as f64 / n,
            n / commits as f64
        );
        let mut others = std::time::Duration::ZERO;
        for (name, cpu) in thread_cpu() {
            if !name.starts_with("store-") {
                others += cpu - all_cpu.get(&name).copied().unwrap_or_default();
            }
        }
        println!(
            "    other threads (the admitting tasks): {:.1} µs per admission; {:.2} ms per commit in redb's commit (writes and fsync)",
            others.as_secs_f64() * 1e6 / n,
            (store.stats().commit_micros.get() - commit_micros) as f64 / 1000.0 / commits as f64
        );
        let (folds_now, micros_now) = fold_stats(&store);
        if folds_now > folds {
            println!(
                "    {} folds of the front, {:.1} ms each on average",
                folds_now - folds,
                (micros_now - fold_micros) as f64 / 1000.0 / (folds_now - folds) as f64
            );
        }
    }
}
