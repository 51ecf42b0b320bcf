//! Admissions per second at N concurrent sessions, with what criterion does not show: bytes
//! written per admission (redb's copy-on-write pages) and operations per commit.
//!
//! `cargo run --release -p agenthost-benches --example admit_probe -- [sessions] [per round] [minted|named] [rounds]`
//!
//! `minted` uses sortable ids as the runtime mints them; `named` uses client-chosen ids in
//! the store bench's pattern.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use agenthost_benches::{entropy, thread_cpu, tokio_runtime, written_bytes};
use agenthost_model::{Delivery, MessageId, Prompt, SessionId};
use agenthost_store::{Admission, Config, NewSession, RedbStore, Store, system_clock};

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
    let store = Arc::new(RedbStore::open(Config::new(dir.path().join("p.redb"))).expect("store"));
    let ids: Vec<SessionId> = (0..sessions)
        .map(|i| SessionId::mint(system_clock(), entropy(i)))
        .collect();
    rt.block_on(async {
        for id in &ids {
            let new = NewSession {
                id: id.clone(),
                agent: "default".into(),
                model: None,
                title: None,
            };
            store.create_session(new).await.expect("created");
        }
    });
    let fold_stats = |store: &RedbStore| {
        let stats = store.stats();
        (
            stats.folds.load(Ordering::Relaxed),
            stats.fold_micros.load(Ordering::Relaxed),
        )
    };
    for round in 0..rounds {
        let (folds, fold_micros) = fold_stats(&store);
        let (written, commits) = (
            written_bytes(),
            store.stats().commits.load(Ordering::Relaxed),
        );
        let writer = || {
            thread_cpu()
                .get("agenthost-store")
                .copied()
                .unwrap_or_default()
        };
        let writer_cpu = writer();
        let start = Instant::now();
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for (s, id) in ids.iter().enumerate() {
                let (store, id) = (store.clone(), id.clone());
                tasks.spawn(async move {
                    for i in 0..per {
                        let mid = match minted {
                            true => MessageId::mint(
                                system_clock(),
                                entropy((round * sessions + s) * per + i),
                            ),
                            false => {
                                MessageId::parse(&format!("msg_r{round}s{s}i{i}")).expect("valid")
                            }
                        };
                        let admission = Admission {
                            session: id.clone(),
                            id: mid,
                            prompt: Prompt::text("benchmark prompt"),
                            delivery: Delivery::Steer,
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
        let commits = store.stats().commits.load(Ordering::Relaxed) - commits;
        println!(
            "round {round}: {:.1} k admissions/s, writer CPU {:.1} µs per admission, {:.0} B written per admission, {:.0} per commit",
            n / start.elapsed().as_secs_f64() / 1000.0,
            (writer() - writer_cpu).as_secs_f64() * 1e6 / n,
            (written_bytes() - written) as f64 / n,
            n / commits as f64
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
