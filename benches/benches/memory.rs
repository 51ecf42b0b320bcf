//! Memory per live idle session actor (RSS delta at 10 000 and 100 000 live actors), RSS after
//! those actors passivate, boot recovery time for 10 000 claimed sessions, and the cost of
//! 100 000 pending schedules (the time to arm them at start, and the memory they hold).
//!
//! Not criterion: each figure is one measurement, printed. Each part runs in a process of its
//! own; `cargo bench -p agenthost-benches --bench memory [-- live|passivation|recovery|schedules]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use agenthost_benches::concurrently;

use agenthost_actors::{Config, CreateSession, Runtime};
use agenthost_llm::scripted::{Script, Scripted};
use agenthost_model::{Delivery, Event, MessageId, Prompt, SessionId};
use agenthost_store::{Admission, Config as StoreConfig, NewSession, RedbStore, Store};

const PARTS: [&str; 4] = ["live", "passivation", "recovery", "schedules"];

fn main() {
    // `cargo bench` passes `--bench`; a bare word selects one part.
    let parts: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if parts.is_empty() {
        // Each part in a process of its own: freed memory stays with the allocator, so a part
        // run after another would start from the other's high-water mark.
        let exe = std::env::current_exe().expect("own path");
        for part in PARTS {
            let status = std::process::Command::new(&exe)
                .arg(part)
                .status()
                .expect("part runs");
            assert!(status.success(), "part {part} failed: {status}");
        }
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    for part in &parts {
        match part.as_str() {
            "live" => rt.block_on(live()),
            "passivation" => rt.block_on(passivation()),
            "recovery" => rt.block_on(recovery(10_000)),
            "schedules" => rt.block_on(schedules(10_000, 10)),
            other => panic!("unknown part {other:?}; parts are {PARTS:?}"),
        }
    }
}

/// Resident set size of this process in KiB, from `/proc/self/status`.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ids(prefix: &str, n: usize) -> Arc<Vec<SessionId>> {
    Arc::new(
        (0..n)
            .map(|i| SessionId::parse(&format!("ses_{prefix}{i}")).expect("valid id"))
            .collect(),
    )
}

/// Wakes every session (spawning its actor if needed) and waits until no drain runs.
async fn wake_all(runtime: &Runtime, sessions: Arc<Vec<SessionId>>) {
    let rt = runtime.clone();
    concurrently(sessions, 256, move |s, i| {
        let rt = rt.clone();
        async move { rt.wake(&s[i]).await.expect("woken") }
    })
    .await;
    while !runtime.active().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Lets the allocator and the passivation timers settle before reading RSS.
async fn settle() -> u64 {
    tokio::time::sleep(Duration::from_millis(500)).await;
    rss_kib()
}

const TOTAL: usize = 100_000;

/// A runtime with `passivate_after` over a new store holding [`TOTAL`] sessions, none live, and
/// the RSS once the store's read cache is warm.
async fn stored_sessions(
    passivate_after: Duration,
) -> (tempfile::TempDir, Runtime, Arc<Vec<SessionId>>, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path().join("store.redb"));
    config.passivate_after = passivate_after;
    // Every woken session's actor stays live: this measures what a live actor costs.
    config.limits.live_sessions = TOTAL;
    let runtime = Runtime::start(config).await.expect("runtime starts");
    runtime.recovered().await;
    let sessions = ids("mem", TOTAL);
    let t = Instant::now();
    let rt = runtime.clone();
    concurrently(sessions.clone(), 1024, move |s, i| {
        let rt = rt.clone();
        async move {
            rt.create_session(CreateSession {
                id: Some(s[i].clone()),
                ..Default::default()
            })
            .await
            .expect("created");
        }
    })
    .await;
    let created = t.elapsed();
    // Read every session row once, so the store's read cache is warm and not counted as actors.
    {
        let snap = runtime.snapshot().expect("snapshot");
        for s in sessions.iter() {
            snap.session(s).expect("read").expect("exists");
        }
    }
    let base = settle().await;
    println!(
        "created {TOTAL} sessions in {:.2} s; RSS with no actor live {:.1} MiB",
        created.as_secs_f64(),
        mib(base)
    );
    (dir, runtime, sessions, base)
}

/// RSS per live idle session actor at 10 000 and 100 000 actors.
async fn live() {
    const FIRST: usize = 10_000;
    print!("live: ");
    let (_dir, runtime, sessions, base) = stored_sessions(Duration::from_secs(3600)).await;

    let t = Instant::now();
    wake_all(&runtime, Arc::new(sessions[..FIRST].to_vec())).await;
    let spawn_first = t.elapsed();
    assert_eq!(runtime.live(), FIRST);
    let rss_first = settle().await;
    println!(
        "live: {FIRST} live idle actors (spawned in {:.2} s): RSS {:.1} MiB, +{:.1} MiB, \
         {:.2} KiB per actor",
        spawn_first.as_secs_f64(),
        mib(rss_first),
        mib(rss_first.saturating_sub(base)),
        rss_first.saturating_sub(base) as f64 / FIRST as f64
    );

    let t = Instant::now();
    wake_all(&runtime, Arc::new(sessions[FIRST..].to_vec())).await;
    let spawn_rest = t.elapsed();
    assert_eq!(runtime.live(), TOTAL);
    let rss_total = settle().await;
    println!(
        "live: {TOTAL} live idle actors (last {} spawned in {:.2} s): RSS {:.1} MiB, +{:.1} MiB, \
         {:.2} KiB per actor",
        TOTAL - FIRST,
        spawn_rest.as_secs_f64(),
        mib(rss_total),
        mib(rss_total.saturating_sub(base)),
        rss_total.saturating_sub(base) as f64 / TOTAL as f64
    );

    let t = Instant::now();
    runtime.shutdown().await;
    println!(
        "live: shutdown with {TOTAL} live actors took {:.2} s; RSS after {:.1} MiB; live() = {}",
        t.elapsed().as_secs_f64(),
        mib(settle().await),
        runtime.live()
    );
}

/// RSS after every session's actor passivated (`passivate_after` = 50 ms), twice over.
async fn passivation() {
    print!("passivation: ");
    let (_dir, runtime, sessions, base) = stored_sessions(Duration::from_millis(50)).await;
    for round in 1..=2 {
        let peak = Arc::new(AtomicUsize::new(0));
        let watcher = {
            let rt = runtime.clone();
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(rt.live(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        let t = Instant::now();
        wake_all(&runtime, sessions.clone()).await;
        let woken = t.elapsed();
        let deadline = Instant::now() + Duration::from_secs(120);
        while runtime.live() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let passivated = t.elapsed();
        watcher.abort();
        let after = settle().await;
        println!(
            "passivation: round {round}: {TOTAL} wakes took {:.2} s (peak live {}); live() = {} \
             after {:.2} s; RSS {:.1} MiB, {:+.1} MiB over no actor live ({:+.3} KiB per \
             passivated session)",
            woken.as_secs_f64(),
            peak.load(Ordering::Relaxed),
            runtime.live(),
            passivated.as_secs_f64(),
            mib(after),
            (after as f64 - base as f64) / 1024.0,
            (after as f64 - base as f64) / TOTAL as f64
        );
    }
    runtime.shutdown().await;
}

/// Leaves `n` sessions claimed with one pending prompt each, as a crashed process would, then
/// measures a new runtime's boot sweep until each has issued its first provider request.
/// `sessions` sessions with `each` schedules a day out: the time a runtime takes at start to arm
/// all of them, and what they hold in memory (RSS before and after).
async fn schedules(sessions: usize, each: usize) {
    use agenthost_model::{CatchUp, Schedule, ScheduleId, Timestamp, When};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let ids = ids("sch", sessions);
    {
        let store = Arc::new(RedbStore::open(StoreConfig::new(&path)).expect("store"));
        let t = Instant::now();
        let day = agenthost_store::system_clock().0 + 86_400_000;
        let st = store.clone();
        concurrently(ids.clone(), 1024, move |s, i| {
            let store = st.clone();
            async move {
                let id = s[i].clone();
                store
                    .create_session(NewSession {
                        id: id.clone(),
                        agent: "default".into(),
                        model: None,
                        title: None,
                    })
                    .await
                    .expect("created");
                let events = (0..each)
                    .map(|k| Event::ScheduleSet {
                        schedule: Schedule {
                            id: ScheduleId::parse(&format!("sch_{k}")).expect("id"),
                            prompt: Prompt::text("check back on this"),
                            delivery: Delivery::Steer,
                            when: When::Once,
                            catch_up: CatchUp::Once,
                            next: Timestamp(day + (i * each + k) as u64),
                        },
                    })
                    .collect();
                store.append(id, events).await.expect("scheduled");
            }
        })
        .await;
        store.close();
        println!(
            "schedules: set {} schedules in {sessions} sessions in {:.2} s",
            sessions * each,
            t.elapsed().as_secs_f64()
        );
    }
    let before = rss_kib();
    let t = Instant::now();
    let runtime = Runtime::start(Config::new(&path)).await.expect("start");
    let total = sessions * each;
    while runtime.armed_schedules() < total {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let armed = t.elapsed();
    let after = rss_kib();
    println!(
        "schedules: {total} armed {:.2} s after the start; RSS {} MiB before, {} MiB after \
         ({:.0} bytes per schedule)",
        armed.as_secs_f64(),
        before / 1024,
        after / 1024,
        (after.saturating_sub(before) * 1024) as f64 / total as f64
    );
    runtime.shutdown().await;
}

async fn recovery(n: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let sessions = ids("rec", n);
    {
        let store = Arc::new(RedbStore::open(StoreConfig::new(&path)).expect("store"));
        let t = Instant::now();
        let st = store.clone();
        concurrently(sessions.clone(), 1024, move |s, i| {
            let store = st.clone();
            async move {
                let id = s[i].clone();
                store
                    .create_session(NewSession {
                        id: id.clone(),
                        agent: "default".into(),
                        model: None,
                        title: None,
                    })
                    .await
                    .expect("created");
                store
                    .admit(Admission {
                        session: id.clone(),
                        id: MessageId::parse(&format!("msg_lost{i}")).expect("valid id"),
                        prompt: Prompt::text("finish this"),
                        delivery: Delivery::Steer,
                        wake: true,
                    })
                    .await
                    .expect("admitted");
                store
                    .append(id, vec![Event::ExecutionStarted { forced: false }])
                    .await
                    .expect("claimed");
            }
        })
        .await;
        store.close();
        println!(
            "recovery: left {n} claimed sessions in {:.2} s",
            t.elapsed().as_secs_f64()
        );
    }

    let calls = Arc::new(AtomicUsize::new(0));
    let all_asked: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let provider = {
        let calls = calls.clone();
        let all_asked = all_asked.clone();
        Scripted::from_fn(move |_request| {
            if calls.fetch_add(1, Ordering::SeqCst) + 1 == n {
                let _ = all_asked.set(Instant::now());
            }
            Some(
                Script::new()
                    .text("continuing")
                    .finish(agenthost_llm::FinishReason::Stop),
            )
        })
    };
    let config = Config::new(&path).with_provider("scripted", Arc::new(provider.clone()));

    let start = Instant::now();
    let runtime = Runtime::start(config).await.expect("runtime starts");
    let started = start.elapsed();
    runtime.recovered().await;
    let swept = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while all_asked.get().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let asked = all_asked.get().map(|t| t.duration_since(start));
    let settled = loop {
        let claimed = runtime
            .snapshot()
            .expect("snapshot")
            .claimed()
            .expect("claims");
        if (claimed.is_empty() && runtime.active().is_empty()) || Instant::now() > deadline {
            break start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let claimed = runtime
        .snapshot()
        .expect("snapshot")
        .claimed()
        .expect("claims")
        .len();
    match asked {
        Some(asked) => println!(
            "recovery: {n} claimed sessions: Runtime::start returned after {:.3} s, every session's \
             first provider request after {:.2} s ({:.0} sessions/s), sweep done (recovered()) \
             after {:.2} s, every claim released after {:.2} s; provider calls {}, claims left {claimed}",
            started.as_secs_f64(),
            asked.as_secs_f64(),
            n as f64 / asked.as_secs_f64(),
            swept.as_secs_f64(),
            settled.as_secs_f64(),
            provider.calls(),
        ),
        None => println!(
            "recovery: only {} of {n} sessions asked the provider within the deadline; claims left {claimed}",
            calls.load(Ordering::SeqCst)
        ),
    }
    runtime.shutdown().await;
}
