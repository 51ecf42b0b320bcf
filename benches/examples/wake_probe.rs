//! Wake-to-provider-request latency under load: with `live` session actors alive and `waiters`
//! callers waiting on one busy session, how long from a wake of an idle session holding admitted
//! input until its provider request starts. Samples are sequential, so each measures one wake
//! through the routing map, the actor, the drain's promotion and the request build.
//!
//! `cargo run --release -p agenthost-benches --example wake_probe -- [live] [waiters] [samples]`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthost_actors::{Config, CreateSession, PromptRequest, Runtime};
use agenthost_benches::tokio_runtime;
use agenthost_llm::{EventStream, Provider, Request};
use agenthost_model::SessionId;
use futures::StreamExt;

/// Records when each session's request starts, answers at once through the mock, and never
/// answers the busy session.
#[derive(Debug)]
struct Timed {
    inner: agenthost_llm::Mock,
    busy: String,
    started: Mutex<HashMap<String, tokio::sync::oneshot::Sender<Instant>>>,
}

impl Provider for Timed {
    fn stream(&self, request: Request) -> EventStream {
        let session = request.session_id.clone().unwrap_or_default();
        if session == self.busy {
            return futures::stream::pending().boxed();
        }
        if let Some(tx) = self.started.lock().expect("lock").remove(&session) {
            let _ = tx.send(Instant::now());
        }
        self.inner.stream(request)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (live, waiters, samples) = (arg(1, 10_000), arg(2, 1_000), arg(3, 2_000));
    let rt = tokio_runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = agenthost_llm::Mock::new(agenthost_llm::mock::Config {
            latency: Duration::ZERO,
            tokens_per_second: 0.0,
            tool_call_ratio: 0.0,
            reply_tokens: 4,
            seed: 1,
        });
        let busy = SessionId::parse("ses_busy").expect("id");
        let provider = Arc::new(Timed {
            inner: mock,
            busy: busy.to_string(),
            started: Mutex::new(HashMap::new()),
        });
        let mut config =
            Config::new(dir.path().join("s.redb")).with_provider("timed", provider.clone());
        // Every session's actor stays live: this measures a wake among that many live actors.
        config.limits.live_sessions = usize::MAX;
        let runtime = Runtime::start(config).await.expect("runtime");
        runtime.recovered().await;
        // `live` session actors, each woken once so its actor is alive.
        let ids: Vec<SessionId> = (0..live)
            .map(|i| SessionId::parse(&format!("ses_w{i}")).expect("id"))
            .collect();
        for id in &ids {
            let create = CreateSession {
                id: Some(id.clone()),
                ..Default::default()
            };
            runtime.create_session(create).await.expect("created");
            runtime.wake(id).await.expect("woken");
        }
        // One busy session with `waiters` callers waiting on it.
        let create = CreateSession {
            id: Some(busy.clone()),
            ..Default::default()
        };
        runtime.create_session(create).await.expect("created");
        runtime
            .prompt(PromptRequest::new(&busy, "never answered"))
            .await
            .expect("busy");
        let mut waiting = Vec::new();
        for _ in 0..waiters {
            let (r, s) = (runtime.clone(), busy.clone());
            waiting.push(tokio::spawn(async move {
                let _ = r.wait_idle(&s, Duration::from_secs(3600)).await;
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        println!(
            "live actors: {}, waiters on one session: {waiters}",
            runtime.live()
        );

        let mut histogram = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        for n in 0..samples {
            let s = &ids[(n * 7919) % ids.len()];
            let mut request = PromptRequest::new(s, "ping");
            request.resume = false;
            runtime.prompt(request).await.expect("admitted");
            let (tx, rx) = tokio::sync::oneshot::channel();
            provider
                .started
                .lock()
                .expect("lock")
                .insert(s.to_string(), tx);
            let woken = Instant::now();
            runtime.wake(s).await.expect("woken");
            let started = rx.await.expect("the request started");
            histogram
                .record(started.duration_since(woken).as_micros() as u64)
                .expect("recorded");
            runtime
                .wait_idle(s, Duration::from_secs(30))
                .await
                .expect("idle");
        }
        println!(
            "wake to provider request over {samples} wakes: p50 {} µs, p99 {} µs, max {} µs",
            histogram.value_at_quantile(0.5),
            histogram.value_at_quantile(0.99),
            histogram.max()
        );
        runtime.shutdown().await;
        for w in waiting {
            w.abort();
        }
    });
}
