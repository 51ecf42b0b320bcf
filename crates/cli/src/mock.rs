//! `agenthost mock-provider`: the mock model server (OpenAI Chat Completions and Anthropic
//! Messages over HTTP/1.1 and h2c, from `agenthost_llm::mock::server`), for load tests and
//! end-to-end tests through the real client. Point a provider of `kind = "openai"` at the
//! printed base URL (with `http2_prior_knowledge = true` to call it over HTTP/2).

use std::time::Duration;

use agenthost_llm::mock::{self, server};
use anyhow::{Context, anyhow};
use clap::Parser;

use crate::{Classify, Failure};

#[derive(Debug, Parser)]
pub struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: String,
    /// Delay before the first token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Tokens per second after the first; 0 streams as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    tokens_per_sec: f64,
    /// Share of requests offering tools that get a tool call (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    tool_ratio: f64,
    /// Share of requests that fail with an injected error (0 to 1): rate limits, 5xx,
    /// overloads and truncated streams.
    #[arg(long, default_value_t = 0.0)]
    fail_ratio: f64,
    /// Tokens in a text reply.
    #[arg(long, default_value_t = 24)]
    reply_tokens: u32,
    /// Mixed into every decision; different seeds give different reproducible runs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Close every HTTP/1.1 connection after its answer (`connection: close`) instead of
    /// keeping it alive, as some gateways do.
    #[arg(long)]
    close: bool,
}

pub async fn run(args: Args) -> Result<(), Failure> {
    crate::files::raise();
    let bind = crate::config::parse_bind(&args.bind)
        .map_err(|reason| Failure::Usage(anyhow!("--bind: {reason}")))?;
    for (flag, ratio) in [
        ("--tool-ratio", args.tool_ratio),
        ("--fail-ratio", args.fail_ratio),
    ] {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(Failure::Usage(anyhow!("{flag} must be between 0 and 1")));
        }
    }
    if !(args.tokens_per_sec.is_finite() && args.tokens_per_sec >= 0.0) {
        return Err(Failure::Usage(anyhow!(
            "--tokens-per-sec must be 0 or more"
        )));
    }
    let config = server::Config {
        mock: mock::Config {
            latency: Duration::from_millis(args.latency_ms),
            tokens_per_second: args.tokens_per_sec,
            tool_call_ratio: args.tool_ratio,
            reply_tokens: args.reply_tokens,
            seed: args.seed,
        },
        fail_ratio: args.fail_ratio,
        close_connections: args.close,
        ..server::Config::default()
    };
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("cannot listen on {bind}"))
        .runtime()?;
    let handle = server::serve(listener, config).runtime()?;
    println!("mock provider listening on {}", handle.base_url());
    crate::shutdown_signal().await;
    let requests = handle.requests();
    // Stalled streams end on shutdown; bound the wait for the rest.
    match tokio::time::timeout(Duration::from_secs(10), handle.shutdown()).await {
        Ok(result) => result.context("the mock server failed").runtime()?,
        Err(_) => tracing::warn!("open responses did not finish in 10 s"),
    }
    tracing::info!(requests, "mock provider stopped");
    Ok(())
}
