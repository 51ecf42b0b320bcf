//! Runtime layer: complete turns per second through the actor runtime (admit → promote → one
//! streamed step → settle) at 1, 100 and 10 000 sessions, with and without a tool call, and the
//! process CPU they cost; wake throughput to 10 000 live session actors.
//!
//! The provider is the in-process mock at zero latency, so what is measured is the runtime and
//! the store (every turn commits durably, with real fsyncs, through group commit).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthost_benches::concurrently;

use agenthost_actors::{
    Call, Config, CreateSession, Executor, Extensions, PromptRequest, Runtime, Tool, Tools,
};
use agenthost_model::{Seq, SessionId};
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A tool that answers at once.
#[derive(Debug)]
struct Noop;

impl Executor for Noop {
    fn execute(
        &self,
        _call: Call,
    ) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'static>> {
        Box::pin(std::future::ready(Ok("done".to_owned())))
    }
}

/// A runtime over a temporary store.
struct Host {
    runtime: Runtime,
    /// Kept so the store outlives the runtime.
    _dir: tempfile::TempDir,
}

/// `live_sessions`: the bound on live actors (`None`: the default).
async fn start(
    tool_call_ratio: f64,
    passivate_after: Duration,
    live_sessions: Option<usize>,
) -> Host {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = agenthost_llm::Mock::new(agenthost_llm::mock::Config {
        latency: Duration::ZERO,
        tokens_per_second: 0.0,
        tool_call_ratio,
        reply_tokens: 20,
        seed: 1,
    });
    let mut config =
        Config::new(dir.path().join("store.redb")).with_provider("mock", Arc::new(mock));
    config.passivate_after = passivate_after;
    if let Some(live) = live_sessions {
        config.limits.live_sessions = live;
    }
    let mut extensions = Extensions::default();
    if tool_call_ratio > 0.0 {
        let mut tools = Tools::default();
        tools.register(Tool::new(
            "noop",
            "does nothing and says so",
            serde_json::json!({"type": "object", "properties": {"what": {"type": "string"}}}),
            Arc::new(Noop),
        ));
        extensions.tools = tools;
    }
    let runtime = Runtime::start_with(config, extensions)
        .await
        .expect("runtime starts");
    runtime.recovered().await;
    Host { runtime, _dir: dir }
}

/// Creates `n` sessions and spawns their actors (a wake with nothing to do), so the measured
/// turns pay neither.
async fn fresh_sessions(runtime: &Runtime, prefix: &str, n: usize) -> Arc<Vec<SessionId>> {
    let ids: Arc<Vec<SessionId>> = Arc::new(
        (0..n)
            .map(|i| SessionId::parse(&format!("ses_{prefix}x{i}")).expect("valid id"))
            .collect(),
    );
    let rt = runtime.clone();
    concurrently(ids.clone(), 512, move |ids, i| {
        let rt = rt.clone();
        async move {
            rt.create_session(CreateSession {
                id: Some(ids[i].clone()),
                ..Default::default()
            })
            .await
            .expect("created");
            rt.wake(&ids[i]).await.expect("woken");
        }
    })
    .await;
    quiesce(runtime).await;
    ids
}

/// Waits until no drain runs.
async fn quiesce(runtime: &Runtime) {
    while !runtime.active().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Every session takes `rounds` turns, one after another; sessions run concurrently.
async fn turns(runtime: &Runtime, sessions: &Arc<Vec<SessionId>>, rounds: u64) {
    let mut tasks = tokio::task::JoinSet::new();
    for s in sessions.iter() {
        let rt = runtime.clone();
        let s = s.clone();
        tasks.spawn(async move {
            for _ in 0..rounds {
                rt.prompt(PromptRequest::new(&s, "summarize the plan in one line"))
                    .await
                    .expect("admitted");
                rt.wait_idle(&s, Duration::from_secs(120))
                    .await
                    .expect("idle");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("turn task");
    }
}

/// Checks, untimed, that a session's log shows `rounds` settled executions of `steps` steps each,
/// the last of which answered in text.
fn check(runtime: &Runtime, session: &SessionId, rounds: u64, steps: u64) {
    let snap = runtime.snapshot().expect("snapshot");
    let log = snap.events(session, Seq::ZERO, usize::MAX).expect("events");
    let count = |kind: &str| log.iter().filter(|e| e.event.kind() == kind).count() as u64;
    assert_eq!(count("execution_succeeded"), rounds, "{session}");
    assert_eq!(count("step_ended"), rounds * steps, "{session}");
    assert_eq!(count("tool_succeeded"), rounds * (steps - 1), "{session}");
    assert_eq!(count("text_ended"), rounds, "{session}");
}

fn turn_benches(c: &mut Criterion) {
    let rt = tokio_runtime();
    let mut group = c.benchmark_group("turns");
    // An iteration is one round (one turn per session) and can take seconds at 10 000 sessions:
    // flat sampling keeps the iteration count (and the history each session grows) small.
    group.sampling_mode(SamplingMode::Flat);
    for (name, tool_call_ratio, steps, sizes) in [
        ("text", 0.0, 1, &[1usize, 100, 10_000][..]),
        ("tool_call", 1.0, 2, &[100usize][..]),
    ] {
        for &sessions in sizes {
            // Sessions of finished samples passivate instead of piling up; a session in use is
            // never idle this long.
            let host = rt.block_on(start(tool_call_ratio, Duration::from_secs(10), None));
            let mut sample = 0u64;
            let mut cpu = Duration::ZERO;
            let mut wall = Duration::ZERO;
            let mut done = 0u64;
            group.throughput(Throughput::Elements(sessions as u64));
            group.bench_with_input(BenchmarkId::new(name, sessions), &sessions, |b, &n| {
                b.iter_custom(|rounds| {
                    sample += 1;
                    rt.block_on(async {
                        // Fresh sessions per sample keep histories short and comparable.
                        let ids = fresh_sessions(&host.runtime, &format!("s{sample}"), n).await;
                        let cpu_start = agenthost_benches::process_cpu();
                        let start = Instant::now();
                        turns(&host.runtime, &ids, rounds).await;
                        let elapsed = start.elapsed();
                        cpu += agenthost_benches::process_cpu().saturating_sub(cpu_start);
                        wall += elapsed;
                        done += rounds * n as u64;
                        check(&host.runtime, &ids[0], rounds, steps);
                        check(&host.runtime, &ids[n - 1], rounds, steps);
                        elapsed
                    })
                })
            });
            eprintln!(
                "turns/{name}/{sessions}: {done} turns, {:.0} turns/s overall, process CPU {:.0} µs \
                 per turn ({:.2} cores busy)",
                done as f64 / wall.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / done as f64,
                cpu.as_secs_f64() / wall.as_secs_f64(),
            );
            rt.block_on(host.runtime.shutdown());
        }
    }
    group.finish();
}

fn wake_routing(c: &mut Criterion) {
    const SESSIONS: usize = 10_000;
    const TASKS: usize = 8;
    let rt = tokio_runtime();
    // Every session's actor stays live: this measures routing to live actors.
    let host = rt.block_on(start(0.0, Duration::from_secs(3600), Some(SESSIONS)));
    let ids = rt.block_on(fresh_sessions(&host.runtime, "wake", SESSIONS));
    assert_eq!(host.runtime.live(), SESSIONS);
    let mut group = c.benchmark_group("wake_routing");
    group.throughput(Throughput::Elements(1));
    let mut next = 0usize;
    group.bench_function(BenchmarkId::new("live_sessions", SESSIONS), |b| {
        b.iter_custom(|iters| {
            let base = next;
            next = next.wrapping_add(iters as usize);
            rt.block_on(async {
                let start = Instant::now();
                let mut tasks = tokio::task::JoinSet::new();
                for t in 0..TASKS {
                    let rt = host.runtime.clone();
                    let ids = ids.clone();
                    tasks.spawn(async move {
                        // Task t sends wakes t, t + TASKS, …: consecutive wakes of one task go
                        // to different sessions, and the tasks cycle over all of them.
                        let mut k = t as u64;
                        while k < iters {
                            let s = &ids[(base + k as usize) % ids.len()];
                            rt.wake(s).await.expect("woken");
                            k += TASKS as u64;
                        }
                    });
                }
                while let Some(joined) = tasks.join_next().await {
                    joined.expect("wake task");
                }
                let elapsed = start.elapsed();
                // Each wake of an idle session starts a drain that finds nothing to do; let them
                // end before the next sample.
                quiesce(&host.runtime).await;
                elapsed
            })
        })
    });
    group.finish();
    assert_eq!(host.runtime.live(), SESSIONS, "no actor was respawned");
    rt.block_on(host.runtime.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = turn_benches, wake_routing
}
criterion_main!(benches);
