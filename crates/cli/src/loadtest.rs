//! `agenthost loadtest`: N sessions × M prompts, all sessions at once, each session's prompts one
//! after another (a turn is admit → promote → steps → settle). By default it drives an embedded
//! runtime with the in-process mock provider; with `--url` it drives a running server through
//! the HTTP API and its event streams.
//!
//! Measured per turn, from just before the prompt is sent:
//! - admission: until the prompt call returned (the input is durable and the session woken);
//! - first token: until the first streamed delta of the turn arrived;
//! - full turn: until the execution that answered it settled (`execution_succeeded`).
//!
//! A turn fails when its prompt is refused, its execution fails or is interrupted, or it does
//! not settle within `--turn-timeout-secs`. The report ends with our overhead (turn latency
//! minus the provider's own time per turn, timed around every provider call), the CPU time per
//! turn (the server's, from its `/metrics`, with `--url`) and the resident memory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthost_actors::{
    Call, Config, CreateSession, Executor, Extensions, Live, PromptRequest, Runtime, Tool, Tools,
};
use agenthost_api::{Client, Events, Frame, wire};
use agenthost_llm as llm;
use agenthost_model::{Event, Seq, SessionId};
use anyhow::{Context, anyhow};
use clap::Parser;
use futures::FutureExt;
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;

use crate::{Classify, Failure};

#[derive(Debug, Parser)]
pub struct Args {
    /// Concurrent sessions.
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Prompts per session, sent one after another.
    #[arg(long, default_value_t = 5)]
    prompts: usize,
    /// Drive the server at this URL (`http://127.0.0.1:4096`) instead of an embedded runtime.
    #[arg(long)]
    url: Option<String>,
    /// With `--url`: the environment variable holding the server's token, if it has one.
    #[arg(long, default_value = crate::config::DEFAULT_TOKEN_ENV)]
    token_env: String,
    /// Embedded: the data directory (default: a temporary one, removed afterwards).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Embedded: call an OpenAI-wire provider at this base URL (`http://127.0.0.1:8080/v1`,
    /// `agenthost mock-provider` or a real one; model `mock-1`) instead of the in-process mock.
    #[arg(long)]
    provider_url: Option<String>,
    /// Embedded: the store's page cache, in MiB.
    #[arg(long, default_value_t = crate::config::DEFAULT_CACHE_MIB)]
    cache_mib: usize,
    /// Embedded: session actors alive at once (`[limits] live_sessions`; default: the runtime's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    live_sessions: Option<u64>,
    /// Embedded: the mock's delay before the first token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Embedded: the mock's tokens per second; 0 streams as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    tokens_per_sec: f64,
    /// Embedded: share of steps answered with a tool call (to a built-in `echo` tool).
    #[arg(long, default_value_t = 0.0)]
    tool_ratio: f64,
    /// Embedded: tokens in a mock reply.
    #[arg(long, default_value_t = 24)]
    reply_tokens: u32,
    /// A turn that has not settled after this long counts as failed.
    #[arg(long, default_value_t = 120)]
    turn_timeout_secs: u64,
    /// Start the sessions evenly over this many milliseconds instead of all at once. With a
    /// provider of constant latency, sessions started together take their turns in lockstep,
    /// so every turn arrives in a burst of `--sessions` requests; a ramp-up of one provider
    /// latency spreads them, as independent clients would be.
    #[arg(long, default_value_t = 0)]
    ramp_up_ms: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// What the driver of a session hears about it.
#[derive(Debug, Clone, Copy)]
enum Signal {
    /// A streamed delta.
    Token,
    /// An execution settled at `seq`.
    End { seq: u64, ok: bool },
    /// Signals may have been lost; check the store.
    Resync,
}

/// What the load is driven through.
enum Target {
    Embedded { runtime: Runtime },
    Remote { client: Client },
}

/// A session under load and what its driver hears about it. The driver reads the events
/// itself, so a session under load costs no task and no channel of its own besides the
/// runtime's.
struct Session {
    id: SessionId,
    feed: Feed,
}

enum Feed {
    /// The runtime's queue of the session's live events.
    Embedded(agenthost_actors::Subscription),
    /// The server's event stream, which reconnects by itself after the last seen seq.
    Remote(Box<Events>),
}

impl Feed {
    /// The next signal; `None` once the events ended.
    async fn next(&mut self) -> Option<Signal> {
        loop {
            let signal = match self {
                Feed::Embedded(live) => match live.recv().await {
                    Ok(message) => match &message.1 {
                        Live::Delta { .. } => Signal::Token,
                        Live::Event(stored) => match end(&stored.event) {
                            Some(ok) => Signal::End {
                                seq: stored.seq.0,
                                ok,
                            },
                            None => continue,
                        },
                        Live::Status(_) => continue,
                    },
                    Err(RecvError::Lagged(_)) => Signal::Resync,
                    Err(RecvError::Closed) => return None,
                },
                Feed::Remote(events) => match Box::pin(events.next()).await? {
                    Ok(Frame::Delta(_)) => Signal::Token,
                    Ok(Frame::Event(event)) => match event.body {
                        wire::EventBody::ExecutionSucceeded => Signal::End {
                            seq: event.seq,
                            ok: true,
                        },
                        wire::EventBody::ExecutionFailed { .. }
                        | wire::EventBody::ExecutionInterrupted { .. } => Signal::End {
                            seq: event.seq,
                            ok: false,
                        },
                        _ => continue,
                    },
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "the event stream ended");
                        return None;
                    }
                },
            };
            return Some(signal);
        }
    }
}

impl Target {
    async fn open(&self) -> anyhow::Result<Session> {
        match self {
            Target::Embedded { runtime } => {
                let row = runtime.create_session(CreateSession::default()).await?;
                // The session's own queue, subscribed before the first prompt: another
                // session's traffic can never make this one lag.
                let live = runtime.subscribe_session(&row.id);
                Ok(Session {
                    id: row.id,
                    feed: Feed::Embedded(live),
                })
            }
            Target::Remote { client } => {
                // The client's futures are boxed so that an embedded driver does not carry their
                // size.
                let session =
                    Box::pin(client.create_session(&wire::CreateSession::default())).await?;
                let id = SessionId::parse(&session.id)?;
                // Opened before the first prompt: the server subscribes before it answers.
                let mut events = client.events(&session.id, Some(session.last_seq));
                Box::pin(events.open()).await?;
                Ok(Session {
                    id,
                    feed: Feed::Remote(Box::new(events)),
                })
            }
        }
    }

    /// Sends a prompt; the admitted seq.
    async fn prompt(&self, session: &SessionId, text: String) -> anyhow::Result<u64> {
        match self {
            Target::Embedded { runtime, .. } => {
                let receipt = runtime.prompt(PromptRequest::new(session, text)).await?;
                Ok(receipt.admitted_seq.0)
            }
            Target::Remote { client } => {
                let body = wire::Prompt {
                    text,
                    ..wire::Prompt::default()
                };
                Ok(Box::pin(client.prompt(session.as_str(), &body))
                    .await?
                    .admitted_seq)
            }
        }
    }

    /// After lost signals: whether an execution settled after `after`, and how.
    async fn settled(&self, session: &SessionId, after: u64) -> anyhow::Result<Option<bool>> {
        let Target::Embedded { runtime, .. } = self else {
            return Ok(None);
        };
        let runtime = runtime.clone();
        let session = session.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<Option<bool>> {
            let events = runtime
                .snapshot()?
                .events(&session, Seq(after + 1), usize::MAX)?;
            Ok(events.iter().find_map(|e| end(&e.event)))
        })
        .await?
    }
}

/// Whether `event` settles an execution, and successfully.
fn end(event: &Event) -> Option<bool> {
    match event {
        Event::ExecutionSucceeded => Some(true),
        Event::ExecutionFailed { .. } | Event::ExecutionInterrupted { .. } => Some(false),
        _ => None,
    }
}

/// Latencies one session recorded, in microseconds. A session records only a few, so it keeps
/// them as a list; a histogram per session would cost about 190 KiB each and dominate the
/// report's own memory at a thousand sessions.
#[derive(Default)]
struct Samples(Vec<u64>);

impl Samples {
    fn saturating_record(&mut self, micros: u64) {
        self.0.push(micros);
    }
}

/// What one session's driver saw.
#[derive(Default)]
struct Seen {
    admission: Samples,
    first_token: Samples,
    turn: Samples,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Seen {
    fn error(&mut self, message: String) {
        self.errors += 1;
        self.first_error.get_or_insert(message);
    }
}

/// Latencies of the whole run, in microseconds.
struct Stats {
    admission: Histogram<u64>,
    first_token: Histogram<u64>,
    turn: Histogram<u64>,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Stats {
    fn new() -> Stats {
        // Fixed bounds (1 µs to 1 h), because `saturating_record` clamps rather than grows an
        // auto-resizing histogram; a turn longer than an hour is recorded as one hour.
        let h = || {
            Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
                .expect("invariant: 1 µs to 1 h at 3 significant figures is a valid range")
        };
        Stats {
            admission: h(),
            first_token: h(),
            turn: h(),
            ok: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, message: String) {
        self.errors += 1;
        self.first_error.get_or_insert(message);
    }

    fn merge(&mut self, other: &Seen) {
        for (histogram, samples) in [
            (&mut self.admission, &other.admission),
            (&mut self.first_token, &other.first_token),
            (&mut self.turn, &other.turn),
        ] {
            for &micros in &samples.0 {
                histogram.saturating_record(micros);
            }
        }
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}

/// When session `n` of `sessions` starts: evenly over `ramp`, the first at once.
fn ramp_up(ramp: Duration, n: usize, sessions: usize) -> Duration {
    let offset = ramp.as_nanos() * n as u128 / sessions.max(1) as u128;
    Duration::from_nanos(offset.min(u64::MAX as u128) as u64)
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

async fn drive(
    target: Arc<Target>,
    n: usize,
    prompts: usize,
    timeout: Duration,
    start: Duration,
    bar: ProgressBar,
) -> Seen {
    tokio::time::sleep(start).await;
    let mut stats = Seen::default();
    // Boxed, like every call below: the driver's own future stays small with 10 000 of them
    // alive, whichever target they drive.
    let mut session = match Box::pin(target.open()).await {
        Ok(s) => s,
        Err(e) => {
            for _ in 0..prompts {
                stats.error(format!("cannot create a session: {e:#}"));
                bar.inc(1);
            }
            return stats;
        }
    };
    for k in 0..prompts {
        let started = Instant::now();
        let text = format!("load test: session {n}, prompt {k}. Please answer briefly.");
        let admitted = match Box::pin(target.prompt(&session.id, text)).await {
            Ok(seq) => seq,
            Err(e) => {
                stats.error(format!("prompt refused: {e:#}"));
                bar.inc(1);
                continue;
            }
        };
        stats.admission.saturating_record(micros(started.elapsed()));
        let deadline = tokio::time::Instant::from_std(started + timeout);
        let mut first = None;
        loop {
            let signal = match tokio::time::timeout_at(deadline, session.feed.next()).await {
                Err(_) => {
                    stats.error(format!("turn did not settle within {timeout:?}"));
                    break;
                }
                Ok(None) => {
                    stats.error("the event stream ended".into());
                    break;
                }
                Ok(Some(signal)) => signal,
            };
            let settled = match signal {
                Signal::Token => {
                    first.get_or_insert_with(|| started.elapsed());
                    continue;
                }
                Signal::End { seq, ok } if seq > admitted => Some(ok),
                Signal::End { .. } => continue,
                Signal::Resync => match Box::pin(target.settled(&session.id, admitted)).await {
                    Ok(found) => found,
                    Err(e) => {
                        stats.error(format!("cannot read the store: {e:#}"));
                        break;
                    }
                },
            };
            match settled {
                Some(true) => {
                    stats.turn.saturating_record(micros(started.elapsed()));
                    if let Some(first) = first {
                        stats.first_token.saturating_record(micros(first));
                    }
                    stats.ok += 1;
                    break;
                }
                Some(false) => {
                    stats.error("the execution failed or was interrupted".into());
                    break;
                }
                None => {}
            }
        }
        bar.inc(1);
    }
    stats
}

/// The built-in tool the mock can call in embedded mode.
#[derive(Debug)]
struct Echo;

impl Executor for Echo {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>> {
        async move { Ok(call.input.to_string()) }.boxed()
    }
}

pub async fn run(args: Args) -> Result<(), Failure> {
    if args.sessions == 0 || args.prompts == 0 {
        return Err(Failure::Usage(anyhow!(
            "--sessions and --prompts must be at least 1"
        )));
    }
    // A session against a server holds an event stream and a request connection.
    crate::files::raise();
    if !(0.0..=1.0).contains(&args.tool_ratio) {
        return Err(Failure::Usage(anyhow!(
            "--tool-ratio must be between 0 and 1"
        )));
    }
    if !(args.tokens_per_sec.is_finite() && args.tokens_per_sec >= 0.0) {
        return Err(Failure::Usage(anyhow!(
            "--tokens-per-sec must be 0 or more"
        )));
    }
    let embedded_flags = args.data_dir.is_some()
        || args.provider_url.is_some()
        || args.cache_mib != crate::config::DEFAULT_CACHE_MIB
        || args.latency_ms != 0
        || args.tokens_per_sec != 0.0
        || args.tool_ratio != 0.0
        || args.reply_tokens != 24;
    if args.url.is_some() && embedded_flags {
        return Err(Failure::Usage(anyhow!(
            "--data-dir, --provider-url, --cache-mib, --latency-ms, --tokens-per-sec, \
             --tool-ratio and --reply-tokens configure the embedded runtime; with --url, \
             configure the server instead"
        )));
    }

    let mut temp = None;
    // Embedded: the provider's own time, to tell it from ours.
    let timings = agenthost_server::metrics::Providers::default();
    let target = match &args.url {
        Some(url) => {
            let mut client = Client::new(url).usage()?;
            if let Some(token) = std::env::var(&args.token_env)
                .ok()
                .filter(|t| !t.is_empty())
            {
                client = client.with_token(token);
            }
            Target::Remote { client }
        }
        None => {
            let dir = match &args.data_dir {
                Some(dir) => dir.clone(),
                None => {
                    let dir = tempfile::tempdir()
                        .context("cannot create a temporary data directory")
                        .runtime()?;
                    let path = dir.path().to_owned();
                    temp = Some(dir);
                    path
                }
            };
            let provider: Arc<dyn llm::Provider> = match &args.provider_url {
                Some(url) => {
                    let mut provider = llm::Config::new(llm::Kind::Openai);
                    provider.base_url = Some(url.clone());
                    provider
                        .build()
                        .map_err(|e| anyhow!("--provider-url: {e}"))
                        .usage()?
                }
                None => Arc::new(llm::Mock::new(llm::mock::Config {
                    latency: Duration::from_millis(args.latency_ms),
                    tokens_per_second: args.tokens_per_sec,
                    tool_call_ratio: args.tool_ratio,
                    reply_tokens: args.reply_tokens,
                    seed: 0,
                })),
            };
            let mut config = Config::new(crate::store_path(&dir))
                .with_provider("mock", timings.wrap("mock", provider));
            config.store.cache_size = Some(args.cache_mib << 20);
            if let Some(live) = args.live_sessions {
                config.limits.live_sessions = usize::try_from(live).unwrap_or(usize::MAX);
            }
            let mut tools = Tools::default();
            if args.tool_ratio > 0.0 {
                tools.register(Tool::new(
                    "echo",
                    "Echoes its input.",
                    serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}}),
                    Arc::new(Echo),
                ));
            }
            let runtime = Runtime::start_with(
                config,
                Extensions {
                    tools,
                    hooks: Vec::new(),
                },
            )
            .await
            .context("cannot start the runtime")
            .runtime()?;
            Target::Embedded { runtime }
        }
    };
    let target = Arc::new(target);

    let total = (args.sessions * args.prompts) as u64;
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} turns ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let timeout = Duration::from_secs(args.turn_timeout_secs.max(1));
    let before = Usage::read(&target, &timings).await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for n in 0..args.sessions {
        let start = ramp_up(Duration::from_millis(args.ramp_up_ms), n, args.sessions);
        tasks.spawn(drive(
            target.clone(),
            n,
            args.prompts,
            timeout,
            start,
            bar.clone(),
        ));
    }
    let mut stats = Stats::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(s) => stats.merge(&s),
            Err(e) => stats.error(format!("a session driver panicked: {e}")),
        }
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let memory = Memory::read();
    let usage = Usage::read(&target, &timings).await.since(&before);

    if let Target::Embedded { runtime, .. } = &*target {
        runtime.shutdown().await;
    }
    drop(temp);

    let report = Report {
        mode: if args.url.is_some() {
            "server"
        } else {
            "embedded"
        },
        sessions: args.sessions,
        prompts: args.prompts,
        elapsed,
        stats: &stats,
        memory,
        usage,
    };
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    if stats.errors > 0 {
        return Err(Failure::Check(anyhow!(
            "{} of {total} turns failed (first: {})",
            stats.errors,
            stats.first_error.as_deref().unwrap_or("unknown")
        )));
    }
    Ok(())
}

/// Resident memory of this process, from `/proc/self/status` (Linux).
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    rss_kib: Option<u64>,
    peak_kib: Option<u64>,
}

impl Memory {
    fn read() -> Memory {
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            return Memory::default();
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        };
        Memory {
            rss_kib: field("VmRSS:"),
            peak_kib: field("VmHWM:"),
        }
    }
}

/// CPU and provider time over the run: the server's, from its `/metrics`, with `--url`; this
/// process's (runtime and load generator together) and its provider wrapper's, embedded.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cpu_seconds: Option<f64>,
    /// The server's resident memory (with `--url`).
    server_rss_bytes: Option<f64>,
    /// Provider calls, and the seconds they took from request to the end of the response.
    provider_calls: f64,
    provider_seconds: f64,
}

impl Usage {
    async fn read(target: &Target, timings: &agenthost_server::metrics::Providers) -> Usage {
        let text = match target {
            Target::Remote { client } => client.metrics().await.ok(),
            Target::Embedded { .. } => Some(timings.render()),
        };
        let text = text.unwrap_or_default();
        let sum = |name: &str| -> Option<f64> {
            let values: Vec<f64> = text
                .lines()
                .filter(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                })
                .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
                .collect();
            (!values.is_empty()).then(|| values.iter().sum())
        };
        Usage {
            cpu_seconds: match target {
                Target::Remote { .. } => sum("process_cpu_seconds_total"),
                Target::Embedded { .. } => agenthost_server::metrics::cpu_seconds(),
            },
            server_rss_bytes: sum("process_resident_memory_bytes"),
            provider_calls: sum("agenthost_provider_call_seconds_count").unwrap_or(0.0),
            provider_seconds: sum("agenthost_provider_call_seconds_sum").unwrap_or(0.0),
        }
    }

    /// What happened between `before` and this reading.
    fn since(self, before: &Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds.zip(before.cpu_seconds).map(|(a, b)| a - b),
            server_rss_bytes: self.server_rss_bytes,
            provider_calls: self.provider_calls - before.provider_calls,
            provider_seconds: self.provider_seconds - before.provider_seconds,
        }
    }
}

struct Report<'a> {
    mode: &'static str,
    sessions: usize,
    prompts: usize,
    elapsed: Duration,
    stats: &'a Stats,
    memory: Memory,
    usage: Usage,
}

impl Report<'_> {
    fn rate(&self) -> f64 {
        self.stats.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn cpu_ms_per_turn(&self) -> Option<f64> {
        let turns = self.stats.ok.max(1) as f64;
        self.usage.cpu_seconds.map(|s| s * 1000.0 / turns)
    }

    /// The provider's own time per turn (from request to the end of its response), when the
    /// provider was timed.
    fn provider_ms_per_turn(&self) -> Option<f64> {
        (self.usage.provider_calls > 0.0)
            .then(|| self.usage.provider_seconds * 1000.0 / self.stats.ok.max(1) as f64)
    }

    /// Turn latency minus the provider's mean time per turn, at p50 and p99: exact when the
    /// provider's time is the same for every turn, as a mock's is.
    fn overhead_ms(&self) -> Option<(f64, f64)> {
        let provider = self.provider_ms_per_turn()?;
        let h = &self.stats.turn;
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0 - provider;
        (!h.is_empty()).then(|| (ms(0.5), ms(0.99)))
    }

    fn rows(&self) -> [(&'static str, &Histogram<u64>); 3] {
        [
            ("admission", &self.stats.admission),
            ("first_token", &self.stats.first_token),
            ("turn", &self.stats.turn),
        ]
    }

    fn text(&self) -> String {
        let mut out = format!(
            "{} sessions x {} prompts ({}): {} turns ok, {} failed in {:.2} s = {:.1} turns/s\n",
            self.sessions,
            self.prompts,
            self.mode,
            self.stats.ok,
            self.stats.errors,
            self.elapsed.as_secs_f64(),
            self.rate()
        );
        out.push_str(&format!(
            "{:<12} {:>10} {:>10} {:>10} {:>10} {:>8}\n",
            "latency ms", "p50", "p90", "p99", "max", "count"
        ));
        for (name, h) in self.rows() {
            let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            out.push_str(&format!(
                "{:<12} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>8}\n",
                name.replace('_', " "),
                ms(0.5),
                ms(0.9),
                ms(0.99),
                h.max() as f64 / 1000.0,
                h.len()
            ));
        }
        let mib = |k: Option<u64>| {
            k.map_or("n/a".to_owned(), |k| {
                format!("{:.1} MiB", k as f64 / 1024.0)
            })
        };
        if let Some((p50, p99)) = self.overhead_ms() {
            out.push_str(&format!(
                "overhead ms  {p50:>10.2} (p50) {p99:>10.2} (p99): turn latency minus the provider's \
                 own time per turn ({:.2} ms)\n",
                self.provider_ms_per_turn().unwrap_or(0.0)
            ));
        }
        if let Some(cpu) = self.cpu_ms_per_turn() {
            let whose = match self.mode {
                "server" => "the server's",
                _ => "this process's (runtime and load generator)",
            };
            out.push_str(&format!("cpu: {cpu:.3} ms per turn, {whose}\n"));
        }
        out.push_str(&format!(
            "memory: rss {} (peak {})\n",
            mib(self.memory.rss_kib),
            mib(self.memory.peak_kib)
        ));
        if let Some(rss) = self.usage.server_rss_bytes {
            out.push_str(&format!("server memory: rss {:.1} MiB\n", rss / 1048576.0));
        }
        if let Some(e) = &self.stats.first_error {
            out.push_str(&format!("first error: {e}\n"));
        }
        out
    }

    fn json(&self) -> String {
        let mut latency = serde_json::Map::new();
        for (name, h) in self.rows() {
            let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            latency.insert(
                name.to_owned(),
                serde_json::json!({
                    "p50_ms": ms(0.5), "p90_ms": ms(0.9), "p99_ms": ms(0.99),
                    "max_ms": h.max() as f64 / 1000.0, "count": h.len(),
                }),
            );
        }
        serde_json::json!({
            "mode": self.mode,
            "sessions": self.sessions,
            "prompts": self.prompts,
            "turns_ok": self.stats.ok,
            "turns_failed": self.stats.errors,
            "seconds": self.elapsed.as_secs_f64(),
            "turns_per_second": self.rate(),
            "latency": latency,
            "rss_kib": self.memory.rss_kib,
            "peak_rss_kib": self.memory.peak_kib,
            "cpu_ms_per_turn": self.cpu_ms_per_turn(),
            "server_rss_kib": self.usage.server_rss_bytes.map(|b| (b / 1024.0) as u64),
            "provider_ms_per_turn": self.provider_ms_per_turn(),
            "overhead_ms": self.overhead_ms().map(|(p50, p99)| serde_json::json!({"p50": p50, "p99": p99})),
            "first_error": self.stats.first_error,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_up_spreads_the_starts_evenly() {
        let ramp = Duration::from_millis(200);
        let starts: Vec<_> = (0..4).map(|n| ramp_up(ramp, n, 4)).collect();
        assert_eq!(
            starts,
            [0, 50, 100, 150].map(Duration::from_millis).to_vec(),
            "the first at once, the last one step short of the ramp's end"
        );
        assert_eq!(ramp_up(Duration::ZERO, 3, 4), Duration::ZERO);
        assert_eq!(
            ramp_up(Duration::from_secs(3600), 9_999, 10_000),
            Duration::from_millis(3_599_640)
        );
    }
}
