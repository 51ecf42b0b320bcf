//! `GET /metrics`: OpenMetrics text, encoded by `prometheus-client` from counters and histograms
//! updated where things happen:
//! - the runtime ([`agenthost_actors::Metrics`]): admissions, promotions, durable events by kind
//!   (counted in the store's commit hook), drains, steps by outcome, retries by reason, tool
//!   calls by tool and outcome, actor restarts and passivations, recoveries;
//! - the store ([`agenthost_store::Stats`]): commits, operations, failures, fencing, batch size
//!   and commit time histograms, maintenance;
//! - the providers, when wrapped in [`Timed`]: calls, errors, time to the first token and to
//!   the end of the response, by provider;
//! - the server: open event streams, and how often one lagged behind the bus;
//! - the process: CPU time, resident memory, open file descriptors (from `/proc`).
//!
//! Gauges of state (live actors, drains running, store health, open streams) are read when
//! scraped. Labels are few and bounded: no session ids. Counters count from this process's
//! start.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use agenthost_actors::Runtime;
use agenthost_llm as llm;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::Shared;

/// The OpenMetrics content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the server counts itself.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    sse_open: Gauge,
    sse_lagged: Counter,
}

impl Counters {
    pub(crate) fn sse_opened(&self) {
        self.sse_open.inc();
    }

    pub(crate) fn sse_closed(&self) {
        self.sse_open.dec();
    }

    pub(crate) fn sse_lagged(&self) {
        self.sse_lagged.inc();
    }
}

/// Every metric of one server, registered once.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Read at each scrape.
    live: Gauge,
    active: Gauge,
    waiting: Gauge,
    parked: Gauge,
    approvals: Gauge,
    blocked: Gauge,
    health: Gauge,
    pending: Gauge,
    claimed: Gauge,
}

impl Metrics {
    pub(crate) fn new(
        runtime: &Runtime,
        counters: &Counters,
        providers: Option<&Providers>,
        mcp: Option<&agenthost_mcp::Mcp>,
    ) -> Metrics {
        let mut r = Registry::default();
        let metrics = Metrics {
            live: Gauge::default(),
            active: Gauge::default(),
            waiting: Gauge::default(),
            parked: Gauge::default(),
            approvals: Gauge::default(),
            blocked: Gauge::default(),
            health: Gauge::default(),
            pending: Gauge::default(),
            claimed: Gauge::default(),
            registry: Registry::default(),
        };
        r.register(
            "agenthost_sessions_live",
            "Session actors alive (passivated sessions are not counted)",
            metrics.live.clone(),
        );
        r.register(
            "agenthost_sessions_active",
            "Sessions with a drain in progress on this node (running, or waiting for a slot)",
            metrics.active.clone(),
        );
        r.register(
            "agenthost_drains_waiting",
            "Drains waiting for a slot among those running at once (limits.concurrent_drains)",
            metrics.waiting.clone(),
        );
        r.register(
            "agenthost_sessions_waiting_place",
            "Sessions waiting for a place among the live session actors (limits.live_sessions)",
            metrics.parked.clone(),
        );
        r.register(
            "agenthost_sessions_waiting_approval",
            "Sessions of this node whose last step waits for a person's approval (they hold no drain)",
            metrics.approvals.clone(),
        );
        r.register(
            "agenthost_inputs_pending",
            "Inputs admitted and not yet promoted, of the sessions this node owns",
            metrics.pending.clone(),
        );
        r.register(
            "agenthost_sessions_claimed",
            "Sessions of this node holding a claim (a drain running, or one a crash left to recover)",
            metrics.claimed.clone(),
        );
        r.register(
            "agenthost_sessions_blocked_by_budget",
            "Sessions of this node whose next model call would pass their budget (they hold no drain)",
            metrics.blocked.clone(),
        );
        let m = runtime.metrics();
        r.register(
            "agenthost_spend_tokens",
            "Tokens spent on model calls (steps and failed attempts, compactions, generate), by agent and model",
            m.spend_tokens.clone(),
        );
        r.register(
            "agenthost_spend_cost_nanos",
            "Cost of model calls in billionths of a US dollar, by agent and model",
            m.spend_cost_nanos.clone(),
        );
        r.register(
            "agenthost_admissions",
            "Inputs admitted durably (an exact retry writes nothing and is not counted)",
            m.admissions.clone(),
        );
        r.register(
            "agenthost_promotions",
            "Admitted inputs promoted into history",
            m.promotions.clone(),
        );
        r.register(
            "agenthost_events",
            "Durable events committed, by kind",
            m.events.clone(),
        );
        r.register(
            "agenthost_drains",
            "Drains that started executing (execution_started written)",
            m.drains.clone(),
        );
        r.register(
            "agenthost_steps",
            "Steps of the agent loop that ended, by outcome (done, continue, failed, interrupted)",
            m.steps.clone(),
        );
        r.register(
            "agenthost_retries",
            "Provider calls retried or continued after a cut, by the failure's kind",
            m.retries.clone(),
        );
        r.register(
            "agenthost_tool_calls",
            "Tool calls by tool and outcome (ok, failed, refused; unregistered tools count as unknown)",
            m.tool_calls.clone(),
        );
        r.register(
            "agenthost_actor_restarts",
            "Session actors restarted after a panic",
            m.restarts.clone(),
        );
        r.register(
            "agenthost_actor_passivations",
            "Session actors stopped after being idle",
            m.passivations.clone(),
        );
        r.register(
            "agenthost_sessions_recovered",
            "Sessions settled and resumed after a crash or a takeover",
            m.recoveries.clone(),
        );
        r.register(
            "agenthost_inputs_from_memory",
            "Pending inputs a drain took from the rows kept at their admission instead of reading \
             them from the store",
            m.inputs_from_memory.clone(),
        );

        r.register(
            "agenthost_store_health",
            "0: writes work; 1: the disk is full (writes refused until there is space); 2: an I/O \
             error stopped writes until a restart; 3: the shared database is unreachable",
            metrics.health.clone(),
        );
        let stats = runtime.store().stats();
        r.register(
            "agenthost_store_commits",
            "Write transactions committed",
            stats.commits.clone(),
        );
        r.register(
            "agenthost_store_operations",
            "Operations (admissions, appends, promotions, creations) committed",
            stats.ops.clone(),
        );
        r.register(
            "agenthost_store_failed_commits",
            "Write transactions that failed as a whole",
            stats.failed_commits.clone(),
        );
        r.register(
            "agenthost_store_fenced",
            "Operations refused because this node did not hold the session's partition at the \
             epoch it took it (always 0 on the embedded store)",
            stats.fenced.clone(),
        );
        r.register(
            "agenthost_store_commit_batch_size",
            "Operations per commit (group commit)",
            stats.batch_size.clone(),
        );
        r.register_with_unit(
            "agenthost_store_commit",
            "Time one commit took (page writes and the fsync; on PostgreSQL, the round trips)",
            Unit::Seconds,
            stats.commit_seconds.clone(),
        );
        r.register(
            "agenthost_store_lingered_batches",
            "Batches that waited for more operations before their commit (a busy writer's)",
            stats.lingered.clone(),
        );
        r.register(
            "agenthost_store_maintenance",
            "Maintenance runs inside commits (the embedded store's folds of its log front)",
            stats.maintenance_runs.clone(),
        );
        r.register(
            "agenthost_store_maintenance_rows",
            "Rows moved by maintenance",
            stats.maintenance_rows.clone(),
        );
        r.register(
            "agenthost_store_snapshots",
            "Read views of the store opened (API reads, drains, sweeps; never a scrape)",
            stats.snapshots.clone(),
        );

        r.register(
            "agenthost_sse_streams",
            "Open event streams",
            counters.sse_open.clone(),
        );
        r.register(
            "agenthost_sse_lagged",
            "Event streams closed because their client fell further behind than a stream may hold",
            counters.sse_lagged.clone(),
        );
        if let Some(mcp) = mcp {
            mcp.register(&mut r);
        }
        if let Some(providers) = providers {
            providers.register(&mut r);
        }
        r.register_collector(Box::new(Process));
        Metrics {
            registry: r,
            ..metrics
        }
    }

    fn render(&self, runtime: &Runtime) -> String {
        self.live.set(runtime.live() as i64);
        self.active.set(runtime.active().len() as i64);
        self.waiting.set(runtime.drains_waiting() as i64);
        self.parked.set(runtime.sessions_waiting() as i64);
        self.approvals.set(runtime.waiting() as i64);
        self.blocked.set(runtime.blocked() as i64);
        // From memory: a scrape reads no store.
        let (pending, claimed) = runtime.held();
        self.pending.set(pending as i64);
        self.claimed.set(claimed as i64);
        self.health.set(match runtime.store().health() {
            agenthost_store::Health::Ok => 0,
            agenthost_store::Health::DiskFull(_) => 1,
            agenthost_store::Health::Failed(_) => 2,
            agenthost_store::Health::Unreachable(_) => 3,
        });
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("invariant: writing to a String cannot fail");
        out
    }
}

/// The process's CPU time, resident memory and open file descriptors, read from `/proc` at each
/// scrape (Linux; elsewhere they are left out). What `loadtest --url` divides by turns.
#[derive(Debug)]
struct Process;

/// `/proc` counts CPU time in USER_HZ ticks, 100 per second on Linux's every architecture.
const TICKS_PER_SECOND: f64 = 100.0;

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        if let Some(cpu) = cpu_seconds() {
            let cpu = ConstCounter::new(cpu);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "User and system CPU time of this process",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?;
            cpu.encode(metric)?;
        }
        if let Some(rss) = resident_bytes() {
            let rss = ConstGauge::new(rss);
            let metric = encoder.encode_descriptor(
                "process_resident_memory",
                "Resident memory of this process",
                Some(&Unit::Bytes),
                rss.metric_type(),
            )?;
            rss.encode(metric)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let fds = ConstGauge::new(fds.count() as i64);
            let metric = encoder.encode_descriptor(
                "process_open_fds",
                "Open file descriptors (connections, the store, logs)",
                None,
                fds.metric_type(),
            )?;
            fds.encode(metric)?;
        }
        Ok(())
    }
}

/// This process's CPU time: utime + stime of `/proc/self/stat` (fields 14 and 15; the command
/// name before them may hold spaces, so fields are counted after its closing parenthesis).
/// `None` where there is no `/proc`.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn resident_bytes() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Renders every metric.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "meta",
    responses((status = 200, description = "OpenMetrics text format 1.0.0", content_type = "application/openmetrics-text", body = String)))]
pub(crate) async fn render(State(shared): State<Arc<Shared>>) -> Response {
    let text = shared.metrics.render(&shared.runtime);
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}

/// The `provider` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

/// Latency buckets in seconds, from a fast local model to a long generation.
fn seconds() -> std::vec::IntoIter<f64> {
    vec![
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ]
    .into_iter()
}

/// Timings of every provider wrapped through [`Providers::wrap`], by provider name.
#[derive(Debug)]
pub struct Providers {
    requests: Family<ProviderLabel, Counter>,
    errors: Family<ProviderLabel, Counter>,
    first_token: Family<ProviderLabel, Histogram>,
    complete: Family<ProviderLabel, Histogram>,
}

impl Default for Providers {
    fn default() -> Self {
        let histogram = || Histogram::new(seconds());
        Providers {
            requests: Family::default(),
            errors: Family::default(),
            first_token: Family::new_with_constructor(histogram),
            complete: Family::new_with_constructor(histogram),
        }
    }
}

/// One provider's share of [`Providers`].
#[derive(Debug, Clone)]
struct ProviderStats {
    requests: Counter,
    errors: Counter,
    first_token: Histogram,
    complete: Histogram,
}

impl Providers {
    /// Wraps `provider` so that its calls are timed under `name`.
    pub fn wrap(&self, name: &str, provider: Arc<dyn llm::Provider>) -> Arc<dyn llm::Provider> {
        let label = ProviderLabel {
            provider: name.to_owned(),
        };
        let stats = ProviderStats {
            requests: self.requests.get_or_create(&label).clone(),
            errors: self.errors.get_or_create(&label).clone(),
            first_token: self.first_token.get_or_create(&label).clone(),
            complete: self.complete.get_or_create(&label).clone(),
        };
        Arc::new(Timed {
            inner: provider,
            stats,
        })
    }

    /// These timings alone, as OpenMetrics text (for `loadtest`, which has no server).
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("invariant: writing to a String cannot fail");
        out
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "agenthost_provider_requests",
            "Provider calls (attempts), by provider",
            self.requests.clone(),
        );
        r.register(
            "agenthost_provider_errors",
            "Provider calls that ended with an error, by provider",
            self.errors.clone(),
        );
        r.register_with_unit(
            "agenthost_provider_first_token",
            "Time from sending a provider request to its first token (text, reasoning or tool input)",
            Unit::Seconds,
            self.first_token.clone(),
        );
        r.register_with_unit(
            "agenthost_provider_call",
            "Time from sending a provider request to the end of its response",
            Unit::Seconds,
            self.complete.clone(),
        );
    }
}

/// A provider decorator that times calls. It changes nothing else: one call is still one
/// request of the wrapped provider, sent when the stream is first polled.
#[derive(Debug)]
pub struct Timed {
    inner: Arc<dyn llm::Provider>,
    stats: ProviderStats,
}

impl Timed {
    fn timed(&self, inner: llm::EventStream) -> llm::EventStream {
        Box::pin(TimedStream {
            inner,
            stats: self.stats.clone(),
            started: None,
            first: false,
            ended: false,
        })
    }
}

impl llm::Provider for Timed {
    fn stream(&self, request: llm::Request) -> llm::EventStream {
        self.timed(self.inner.stream(request))
    }

    fn stream_ref(&self, request: &llm::Request) -> llm::EventStream {
        self.timed(self.inner.stream_ref(request))
    }

    fn generate(
        &self,
        request: llm::Request,
    ) -> BoxFuture<'static, Result<llm::Response, llm::Error>> {
        let call = self.inner.generate(request);
        let stats = self.stats.clone();
        async move {
            stats.requests.inc();
            let started = Instant::now();
            let result = call.await;
            stats.complete.observe(started.elapsed().as_secs_f64());
            if result.is_err() {
                stats.errors.inc();
            }
            result
        }
        .boxed()
    }
}

struct TimedStream {
    inner: llm::EventStream,
    stats: ProviderStats,
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
            this.stats.requests.inc();
            Instant::now()
        });
        let polled = this.inner.as_mut().poll_next(cx);
        if let Poll::Ready(item) = &polled {
            if !this.first
                && let Some(Ok(
                    llm::Event::TextDelta { .. }
                    | llm::Event::ReasoningDelta { .. }
                    | llm::Event::ToolInputDelta { .. },
                )) = item
            {
                this.first = true;
                this.stats
                    .first_token
                    .observe(started.elapsed().as_secs_f64());
            }
            match item {
                Some(Err(_)) => {
                    this.stats.errors.inc();
                }
                None if !this.ended => {
                    this.ended = true;
                    this.stats.complete.observe(started.elapsed().as_secs_f64());
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
        let mut registry = Registry::default();
        providers.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "agenthost_provider_requests_total{provider=\"p\"} 2",
            "agenthost_provider_errors_total{provider=\"p\"} 1",
            "agenthost_provider_first_token_seconds_count{provider=\"p\"} 1",
            "agenthost_provider_call_seconds_count{provider=\"p\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from {text}"
            );
        }
    }
}
