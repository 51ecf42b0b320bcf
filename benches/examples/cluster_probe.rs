//! Durable admissions per second through 1, 2 or 3 cluster nodes over one PostgreSQL, or through
//! the embedded store for comparison. Each node is a `PgStore` with its own node id, writer and
//! leases, in this one process (on a 2-core machine, separate processes share the same cores).
//! Every admission goes to the node holding its session's partition, as forwarding would send
//! it.
//!
//! `AGENTHOST_PG_URL=… cargo run --release -p agenthost-benches --example cluster_probe -- [nodes|redb] [sessions] [seconds] [writers per node]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agenthost_benches::{entropy, message_id, tokio_runtime};
use agenthost_model::{Delivery, Prompt, SessionId};
use agenthost_store::{
    Admission, Config, NewSession, PgConfig, PgStore, RedbStore, Store, system_clock,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("1", String::as_str).to_owned();
    let sessions: usize = args.get(2).map_or(1024, |s| s.parse().expect("sessions"));
    let seconds: u64 = args.get(3).map_or(10, |s| s.parse().expect("seconds"));
    let writers: Option<usize> = args.get(4).map(|s| s.parse().expect("writers"));
    let rt = tokio_runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = format!("probe{}", std::process::id());
    let stores: Vec<Arc<dyn Store>> = if mode == "redb" {
        vec![Arc::new(
            RedbStore::open(Config::new(dir.path().join("p.redb"))).expect("redb"),
        )]
    } else {
        let url = std::env::var("AGENTHOST_PG_URL").expect("AGENTHOST_PG_URL names a server");
        let nodes: usize = mode.parse().expect("a node count or redb");
        (0..nodes)
            .map(|n| {
                let mut pg = PgConfig::new(url.clone());
                pg.schema = schema.clone();
                pg.node_id = format!("n{n}");
                pg.advertise_url = format!("http://n{n}.invalid");
                if let Some(writers) = writers {
                    pg.writers = writers;
                }
                Arc::new(PgStore::open(Config::new("unused"), pg).expect("pg")) as Arc<dyn Store>
            })
            .collect()
    };
    // Wait for the partitions to spread: every node holds a share, and together all of them.
    let deadline = Instant::now() + Duration::from_secs(60);
    while stores[0].ownership().is_some() {
        let held: Vec<usize> = stores
            .iter()
            .filter_map(|s| s.ownership())
            .map(|o| {
                let view = o.view();
                view.nodes
                    .iter()
                    .find(|n| n.id == o.node())
                    .map_or(0, |n| n.partitions.len())
            })
            .collect();
        let partitions = stores[0].ownership().map_or(0, |o| o.partitions() as usize);
        if held.iter().all(|h| *h > 0) && held.iter().sum::<usize>() == partitions {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "partitions did not spread: {held:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let owner = |id: &SessionId| -> Arc<dyn Store> {
        stores
            .iter()
            .find(|s| s.ownership().is_none_or(|o| o.owns(id)))
            .expect("an owner")
            .clone()
    };
    let ids: Vec<(SessionId, Arc<dyn Store>)> = (0..sessions)
        .map(|i| {
            let id = SessionId::mint(system_clock(), entropy(i));
            let store = owner(&id);
            (id, store)
        })
        .collect();
    rt.block_on(async {
        let mut creating = tokio::task::JoinSet::new();
        for (id, store) in &ids {
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
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    rt.block_on(async {
        let mut drivers = tokio::task::JoinSet::new();
        for (i, (id, store)) in ids.iter().enumerate() {
            let (store, id, admitted) = (store.clone(), id.clone(), admitted.clone());
            drivers.spawn(async move {
                let mut n = 0u64;
                while Instant::now() < stop {
                    let admission = Admission {
                        session: id.clone(),
                        id: message_id(i * 1_000_000 + n as usize),
                        prompt: Prompt::text("work"),
                        delivery: Delivery::Queue,
                        wake: true,
                    };
                    store.admit(admission).await.expect("admitted");
                    admitted.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            });
        }
        drivers.join_all().await;
    });
    let elapsed = started.elapsed();
    let total = admitted.load(Ordering::Relaxed);
    let commits: u64 = stores.iter().map(|s| s.stats().commits.get()).sum();
    println!(
        "{mode}: {sessions} sessions, {total} admissions in {elapsed:.1?}: {:.0} admissions/s, {:.0} per commit",
        total as f64 / elapsed.as_secs_f64(),
        total as f64 / commits.max(1) as f64
    );
    for store in &stores {
        store.close();
    }
    if mode != "redb" {
        let url = std::env::var("AGENTHOST_PG_URL").expect("url");
        rt.block_on(async move {
            let (client, connection) = tokio_postgres_connect(&url).await;
            tokio::spawn(connection);
            let _ = client
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await;
        });
    }
}

async fn tokio_postgres_connect(
    url: &str,
) -> (
    tokio_postgres::Client,
    tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
) {
    tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connects")
}
