//! `GET /metrics`: Prometheus text exposition (format 0.0.4).
//!
//! Sources:
//! - the runtime: live session actors, sessions with a drain in progress, drains, steps, actor
//!   restarts and recovered sessions ([`agenthost_actors::Metrics`]);
//! - the store: commits, operations, failed commits, the batch-size histogram, commit time and
//!   the backend's maintenance inside commits (count, rows, time) ([`agenthost_store::Stats`]);
//! - a listener on the runtime's bus, started with the [`crate::Api`]: durable events by kind;
//! - the providers, when wrapped in [`Timed`]: requests, errors, time to the first event and
//!   to the end of the stream.
//! - the server itself: open SSE streams and how often one lagged behind the bus.
//!
//! Counters count from this process's start.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use agenthost_actors::Live;
use agenthost_llm as llm;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use tokio::sync::broadcast::error::RecvError;

use crate::Shared;

/// Counters the server keeps.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sse_open: AtomicI64,
    sse_lagged: AtomicU64,
    /// Durable events by kind. A std mutex: held for one map update, never across an await.
    events: Mutex<BTreeMap<&'static str, u64>>,
    deltas: AtomicU64,
    /// Bus messages the listener lost by lagging.
    missed: AtomicU64,
}

impl Counters {
    pub(crate) fn sse_opened(&self) {
        self.inner.sse_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sse_closed(&self) {
        self.inner.sse_open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn sse_lagged(&self) {
        self.inner.sse_lagged.fetch_add(1, Ordering::Relaxed);
    }
}

/// Starts the bus listener. It holds only the counters (not the runtime), so it ends when the
/// runtime's bus closes or shutdown begins.
pub(crate) fn listen(shared: &Shared) {
    let mut rx = shared.runtime.subscribe();
    let inner = shared.counters.inner.clone();
    let closing = shared.closing.clone();
    shared.tasks.spawn(async move {
        loop {
            let received = tokio::select! {
                () = closing.cancelled() => return,
                received = rx.recv() => received,
            };
            match received {
                Ok(message) => match &message.1 {
                    Live::Event(stored) => {
                        let mut events = inner.events.lock().unwrap_or_else(|e| e.into_inner());
                        *events.entry(stored.event.kind()).or_default() += 1;
                    }
                    Live::Delta { .. } => {
                        inner.deltas.fetch_add(1, Ordering::Relaxed);
                    }
                    Live::Status { .. } => {}
                },
                Err(RecvError::Lagged(n)) => {
                    inner.missed.fetch_add(n, Ordering::Relaxed);
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
}

/// Renders every metric.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4", content_type = "text/plain", body = String)))]
pub(crate) async fn render(State(shared): State<Arc<Shared>>) -> Response {
    let mut out = Text::default();
    let runtime = &shared.runtime;
    out.gauge(
        "agenthost_sessions_live",
        "Session actors alive (passivated sessions are not counted).",
        runtime.live() as f64,
    );
    out.gauge(
        "agenthost_sessions_active",
        "Sessions with a drain in progress.",
        runtime.active().len() as f64,
    );
    let m = runtime.metrics();
    out.counter(
        "agenthost_actor_restarts_total",
        "Session actors restarted after a panic.",
        m.restarts.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_sessions_recovered_total",
        "Sessions resumed by the boot recovery sweep.",
        m.recovered.load(Ordering::Relaxed),
    );

    let health = match runtime.store().health() {
        agenthost_store::Health::Ok => 0.0,
        agenthost_store::Health::DiskFull(_) => 1.0,
        agenthost_store::Health::Failed(_) => 2.0,
        agenthost_store::Health::Unreachable(_) => 3.0,
    };
    out.gauge(
        "agenthost_store_health",
        "0: writes work; 1: the disk is full (writes refused until there is space); 2: an I/O \
         error stopped writes until a restart.",
        health,
    );
    let stats = runtime.store().stats();
    out.counter(
        "agenthost_store_commits_total",
        "Write transactions committed by the store writer.",
        stats.commits.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_store_operations_total",
        "Operations (admissions, appends, promotions, creations) committed.",
        stats.ops.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_store_failed_commits_total",
        "Write transactions that failed as a whole.",
        stats.failed_commits.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_store_fenced_total",
        "Operations refused because this node did not hold the session's partition at the \
         epoch it took it (a cluster's fencing; always 0 on the embedded store).",
        stats.fenced.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_store_maintenance_total",
        "Maintenance runs inside commits (the embedded store's folds of its log front).",
        stats.maintenance_runs.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_store_maintenance_rows_total",
        "Rows moved by maintenance.",
        stats.maintenance_rows.load(Ordering::Relaxed),
    );
    out.counter_f64(
        "agenthost_store_maintenance_seconds_total",
        "Time maintenance took inside commits.",
        stats.maintenance_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
    out.counter_f64(
        "agenthost_store_commit_seconds_total",
        "Time spent committing: page writes and the fsync.",
        stats.commit_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
    // Bucket i holds batches of 2^i ..= 2^(i+1)-1 operations; the last is open-ended.
    let counts: Vec<u64> = stats
        .batch_sizes
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let bounds: Vec<String> = (0..counts.len() - 1)
        .map(|i| ((1u64 << (i + 1)) - 1).to_string())
        .collect();
    out.histogram(
        "agenthost_store_commit_batch_size",
        "Operations per commit (group commit).",
        "",
        &bounds,
        &counts,
        stats.ops.load(Ordering::Relaxed) as f64,
    );

    let inner = &shared.counters.inner;
    let events = inner
        .events
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    out.counter(
        "agenthost_drains_total",
        "Drains that started executing (execution_started written).",
        m.drains.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_steps_total",
        "Steps of the agent loop started.",
        m.steps.load(Ordering::Relaxed),
    );
    out.header(
        "agenthost_events_total",
        "Durable events committed, by kind.",
        "counter",
    );
    for (kind, n) in &events {
        let _ = writeln!(out.0, "agenthost_events_total{{kind=\"{kind}\"}} {n}");
    }
    out.counter(
        "agenthost_deltas_total",
        "Streamed deltas broadcast live.",
        inner.deltas.load(Ordering::Relaxed),
    );
    out.counter(
        "agenthost_metrics_events_missed_total",
        "Bus messages the metrics listener lost by lagging (counts above are low by this much).",
        inner.missed.load(Ordering::Relaxed),
    );
    out.gauge(
        "agenthost_sse_streams",
        "Open event streams.",
        inner.sse_open.load(Ordering::Relaxed) as f64,
    );
    out.counter(
        "agenthost_sse_lagged_total",
        "Times an event stream fell behind the bus and caught up from the store.",
        inner.sse_lagged.load(Ordering::Relaxed),
    );

    if let Some(providers) = &shared.options.providers {
        providers.render(&mut out);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out.0,
    )
        .into_response()
}

/// Prometheus text, written metric by metric.
#[derive(Default)]
struct Text(String);

impl Text {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "gauge");
        let _ = writeln!(self.0, "{name} {value}");
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.counter_f64(name, help, value as f64);
    }

    fn counter_f64(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, help, "counter");
        let _ = writeln!(self.0, "{name} {value}");
    }

    /// A histogram from per-bucket (not cumulative) counts; `counts` has one more entry than
    /// `bounds`, for the open-ended bucket. `labels` is empty or `key="value",`.
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &str,
        bounds: &[String],
        counts: &[u64],
        sum: f64,
    ) {
        if !self.0.contains(&format!("# TYPE {name} ")) {
            self.header(name, help, "histogram");
        }
        let mut cumulative = 0;
        for (bound, count) in bounds.iter().zip(counts) {
            cumulative += count;
            let _ = writeln!(
                self.0,
                "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += counts.last().copied().unwrap_or(0);
        let _ = writeln!(self.0, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
        let bare = labels.trim_end_matches(',');
        let bare = if bare.is_empty() {
            String::new()
        } else {
            format!("{{{bare}}}")
        };
        let _ = writeln!(self.0, "{name}_sum{bare} {sum}");
        let _ = writeln!(self.0, "{name}_count{bare} {cumulative}");
    }
}

/// Latency buckets in seconds, from a fast local model to a long generation.
const SECONDS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A latency histogram over [`SECONDS`], lock-free.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; SECONDS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    fn record(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let bucket = SECONDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(SECONDS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut Text, name: &str, help: &str, labels: &str) {
        let bounds: Vec<String> = SECONDS.iter().map(|b| b.to_string()).collect();
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        out.histogram(name, help, labels, &bounds, &counts, sum);
    }
}

/// Timings of one provider.
#[derive(Debug, Default)]
struct ProviderStats {
    requests: AtomicU64,
    errors: AtomicU64,
    first_event: Histogram,
    complete: Histogram,
}

/// Timings of every provider wrapped through [`Providers::wrap`].
#[derive(Debug, Default)]
pub struct Providers {
    by_name: Mutex<BTreeMap<String, Arc<ProviderStats>>>,
}

impl Providers {
    /// Wraps `provider` so that its calls are timed under `name`.
    pub fn wrap(&self, name: &str, provider: Arc<dyn llm::Provider>) -> Arc<dyn llm::Provider> {
        let stats = self
            .by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone();
        Arc::new(Timed {
            inner: provider,
            stats,
        })
    }

    fn render(&self, out: &mut Text) {
        let by_name = self
            .by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        out.header(
            "agenthost_provider_requests_total",
            "Provider calls (attempts), by provider.",
            "counter",
        );
        for (name, s) in &by_name {
            let _ = writeln!(
                out.0,
                "agenthost_provider_requests_total{{provider=\"{}\"}} {}",
                escape(name),
                s.requests.load(Ordering::Relaxed)
            );
        }
        out.header(
            "agenthost_provider_errors_total",
            "Provider calls that ended with an error, by provider.",
            "counter",
        );
        for (name, s) in &by_name {
            let _ = writeln!(
                out.0,
                "agenthost_provider_errors_total{{provider=\"{}\"}} {}",
                escape(name),
                s.errors.load(Ordering::Relaxed)
            );
        }
        for (name, s) in &by_name {
            let labels = format!("provider=\"{}\",", escape(name));
            s.first_event.render(
                out,
                "agenthost_provider_first_event_seconds",
                "Time from sending a provider request to its first event.",
                &labels,
            );
        }
        for (name, s) in &by_name {
            let labels = format!("provider=\"{}\",", escape(name));
            s.complete.render(
                out,
                "agenthost_provider_call_seconds",
                "Time from sending a provider request to the end of its response.",
                &labels,
            );
        }
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A provider decorator that times calls. It changes nothing else: one call is still one
/// request of the wrapped provider, sent when the stream is first polled.
#[derive(Debug)]
pub struct Timed {
    inner: Arc<dyn llm::Provider>,
    stats: Arc<ProviderStats>,
}

impl llm::Provider for Timed {
    fn stream(&self, request: llm::Request) -> llm::EventStream {
        Box::pin(TimedStream {
            inner: self.inner.stream(request),
            stats: self.stats.clone(),
            started: None,
            first: false,
            ended: false,
        })
    }

    fn generate(
        &self,
        request: llm::Request,
    ) -> BoxFuture<'static, Result<llm::Response, llm::Error>> {
        let call = self.inner.generate(request);
        let stats = self.stats.clone();
        async move {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            let result = call.await;
            stats.complete.record(started.elapsed());
            if result.is_err() {
                stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            result
        }
        .boxed()
    }
}

struct TimedStream {
    inner: llm::EventStream,
    stats: Arc<ProviderStats>,
    /// Set at first poll, when the wrapped provider sends its request.
    started: Option<Instant>,
    first: bool,
    ended: bool,
}

impl Stream for TimedStream {
    type Item = Result<llm::Event, llm::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let started = *this.started.get_or_insert_with(|| {
            this.stats.requests.fetch_add(1, Ordering::Relaxed);
            Instant::now()
        });
        let polled = this.inner.as_mut().poll_next(cx);
        if let Poll::Ready(item) = &polled {
            if !this.first && item.is_some() {
                this.first = true;
                this.stats.first_event.record(started.elapsed());
            }
            match item {
                Some(Err(_)) => {
                    this.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
                None if !this.ended => {
                    this.ended = true;
                    this.stats.complete.record(started.elapsed());
                }
                _ => {}
            }
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenthost_llm::scripted::{Script, Scripted};
    use futures::StreamExt;

    #[tokio::test]
    async fn timed_counts_requests_errors_and_latency() {
        let providers = Providers::default();
        let scripted = Scripted::new([
            Script::new().text("hello"),
            Script::new().error(llm::Error::new(llm::ErrorKind::RateLimit, "slow")),
        ]);
        let timed = providers.wrap("p", Arc::new(scripted));
        let events: Vec<_> = timed.stream(llm::Request::new("m")).collect().await;
        assert!(events.iter().all(Result::is_ok));
        assert!(timed.generate(llm::Request::new("m")).await.is_err());
        let mut out = Text::default();
        providers.render(&mut out);
        let text = out.0;
        assert!(
            text.contains("agenthost_provider_requests_total{provider=\"p\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("agenthost_provider_errors_total{provider=\"p\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("agenthost_provider_first_event_seconds_count{provider=\"p\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("agenthost_provider_call_seconds_count{provider=\"p\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn histogram_is_cumulative() {
        let mut out = Text::default();
        let bounds = vec!["1".to_owned(), "3".to_owned()];
        out.histogram("h", "help", "", &bounds, &[2, 1, 4], 20.0);
        assert_eq!(
            out.0,
            "# HELP h help\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"3\"} 3\n\
             h_bucket{le=\"+Inf\"} 7\nh_sum 20\nh_count 7\n"
        );
    }
}
