//! Turns per second at N sessions with what criterion does not show: writer operations and
//! commits per turn, CPU per thread (the store's writer against the async workers), and how a
//! turn's time splits between its admission and the rest.
//!
//! `cargo run --release -p agenthost-benches --example turn_probe -- [sessions] [turns each]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthost_actors::{Config, CreateSession, PromptRequest, Runtime};
use agenthost_benches::{process_cpu, thread_cpu, tokio_runtime};
use agenthost_model::SessionId;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (n, rounds) = (arg(1, 100), arg(2, 20));
    let rt = tokio_runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = agenthost_llm::Mock::new(agenthost_llm::mock::Config {
            latency: Duration::ZERO,
            tokens_per_second: 0.0,
            tool_call_ratio: 0.0,
            reply_tokens: 20,
            seed: 1,
        });
        let config = Config::new(dir.path().join("s.redb")).with_provider("mock", Arc::new(mock));
        let runtime = Runtime::start(config).await.expect("runtime");
        runtime.recovered().await;
        let ids: Vec<SessionId> =
            (0..n).map(|i| SessionId::parse(&format!("ses_p{i}")).expect("valid")).collect();
        for id in &ids {
            let create = CreateSession { id: Some(id.clone()), ..Default::default() };
            runtime.create_session(create).await.expect("created");
        }
        // Histories grow from pass to pass, and so does the cost of a step's request.
        for pass in 0..3 {
            let stats = runtime.store().stats();
            let (commits, ops) = (stats.commits.get(), stats.ops.get());
            let (cpu, threads) = (process_cpu(), thread_cpu());
            let start = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for s in &ids {
                let (runtime, s) = (runtime.clone(), s.clone());
                tasks.spawn(async move {
                    let (mut a, mut w) = (Duration::ZERO, Duration::ZERO);
                    for _ in 0..rounds {
                        let prompt = PromptRequest::new(&s, "summarize the plan in one line");
                        let t = Instant::now();
                        runtime.prompt(prompt).await.expect("admitted");
                        a += t.elapsed();
                        let t = Instant::now();
                        runtime.wait_idle(&s, Duration::from_secs(120)).await.expect("idle");
                        w += t.elapsed();
                    }
                    (a, w)
                });
            }
            let (mut a, mut w) = (Duration::ZERO, Duration::ZERO);
            while let Some(joined) = tasks.join_next().await {
                let (x, y) = joined.expect("task");
                a += x;
                w += y;
            }
            let per = (n * rounds) as u32;
            println!("    admission {:?} per turn, rest of the turn {:?}", a / per, w / per);
            let elapsed = start.elapsed();
            let turns = (n * rounds) as f64;
            let commits = (stats.commits.get() - commits) as f64;
            let ops = (stats.ops.get() - ops) as f64;
            println!(
                "pass {pass}: {:.0} turns/s, {:.0} µs CPU per turn, {:.1} writer ops per turn, {:.2} commits per turn, {:.2} ms per commit",
                turns / elapsed.as_secs_f64(),
                (process_cpu() - cpu).as_micros() as f64 / turns,
                ops / turns,
                commits / turns,
                elapsed.as_secs_f64() * 1000.0 / commits,
            );
            for (name, busy) in thread_cpu() {
                let busy = busy.saturating_sub(threads.get(&name).copied().unwrap_or_default());
                if !busy.is_zero() {
                    println!("    {name}: {:.0} % of one core", busy.as_secs_f64() / elapsed.as_secs_f64() * 100.0);
                }
            }
        }
    });
}
