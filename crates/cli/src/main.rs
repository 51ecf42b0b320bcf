//! `agenthost`: the command-line front of agenthost.
//!
//! Commands: `serve` (the HTTP+SSE API over an embedded runtime), `mock-provider` (the
//! mock model server, OpenAI and Anthropic wire), `loadtest` (many sessions through an embedded runtime or a
//! running server, with a latency report), `inspect` (an offline dump and verification of a
//! store), `config check` (validate a configuration and print it, secrets redacted), and
//! `completions` and `man` (generated from the command definitions).
//!
//! It owns the configuration file ([`config`]), logging setup, signal handling and exit codes;
//! HTTP and JSON belong to `agenthost-server`, execution to `agenthost-actors`.
//!
//! Exit codes: 0 success; 1 runtime failure (cannot bind, cannot open the store, the server
//! failed); 2 usage or configuration error (bad flags, bad config file, refused bind); 3 a
//! check failed (`inspect` found projections that differ from a replay, `loadtest` had failed
//! turns).
//!
//! The binary runs on mimalloc (the default `mimalloc` feature), built without transparent huge
//! pages: glibc's malloc spent about a fifth of the store writer's time on redb's page buffers,
//! and with huge pages mimalloc faulted in and zeroed 2 MiB pages over and over. Its v2 returns
//! freed pages after 10 ms where v3 keeps them a second: the same CPU, about 20 MiB less resident
//! at the peak of a burst of 10 000 sessions (BENCHMARKS.md).
//! `--no-default-features` builds it on the system allocator; the library crates leave the
//! allocator to the embedder.

mod config;
mod files;
mod inspect;
mod loadtest;
mod mcp;
mod mock;
mod serve;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator (the default `mimalloc` feature): the store writer
/// allocates and frees a page buffer for every page a commit touches, and glibc's malloc spent a
/// fifth of the writer's time on them. mimalloc holds more memory after a burst, so a build
/// without the feature trades that CPU for a smaller resident set (BENCHMARKS.md). Embedders
/// choose their own allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "agenthost",
    version,
    about = "Durable LLM agent sessions: server, load test and tools"
)]
struct Cli {
    /// Log as JSON lines instead of text (logs go to stderr; filter with RUST_LOG).
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP+SSE API over an embedded runtime.
    Serve(serve::Args),
    /// Serve the mock model provider (OpenAI Chat Completions and Anthropic Messages wire formats).
    MockProvider(mock::Args),
    /// Drive many sessions and report throughput and latency.
    Loadtest(loadtest::Args),
    /// Dump a store offline and verify its projections against a replay.
    Inspect(inspect::Args),
    /// Check a configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Serve agenthost's MCP tools on stdio, driving the sessions of the server at --url: for
    /// MCP clients that only start processes.
    Mcp(mcp::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff) to stdout.
    Man,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a configuration (FILE, else AGENTHOST_CONFIG, else the defaults) with the
    /// environment it names, and print the effective configuration as JSON, secrets redacted.
    /// Exit 0 when valid, 2 when not.
    Check { file: Option<PathBuf> },
}

/// `agenthost config check [FILE]`.
fn check_config(file: Option<PathBuf>) -> Result<(), Failure> {
    let path = file.or_else(|| std::env::var_os("AGENTHOST_CONFIG").map(PathBuf::from));
    let load = || match &path {
        Some(path) => config::load(path).map(|f| (path.display().to_string(), f)),
        None => Ok(("(defaults)".to_owned(), config::File::default())),
    };
    let (name, file) = load().usage()?;
    let settings = config::resolve(&name, file, &|var| std::env::var(var).ok()).usage()?;
    let (_, file) = load().usage()?;
    let effective = config::effective(&name, &file, &settings);
    let text = serde_json::to_string_pretty(&effective).runtime()?;
    println!("{text}");
    Ok(())
}

/// A failure, with the exit code it maps to.
#[derive(Debug)]
pub enum Failure {
    /// Exit 1.
    Runtime(anyhow::Error),
    /// Exit 2.
    Usage(anyhow::Error),
    /// Exit 3.
    Check(anyhow::Error),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Runtime(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Check(_) => 3,
        }
    }

    fn error(&self) -> &anyhow::Error {
        match self {
            Failure::Runtime(e) | Failure::Usage(e) | Failure::Check(e) => e,
        }
    }
}

/// Shorthands for classifying errors.
pub trait Classify<T> {
    fn usage(self) -> Result<T, Failure>;
    fn runtime(self) -> Result<T, Failure>;
}

impl<T, E: Into<anyhow::Error>> Classify<T> for Result<T, E> {
    fn usage(self) -> Result<T, Failure> {
        self.map_err(|e| Failure::Usage(e.into()))
    }

    fn runtime(self) -> Result<T, Failure> {
        self.map_err(|e| Failure::Runtime(e.into()))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A panic the store catches and reports (redb on a damaged file) is said once, by the error
    // that reports it: no message and backtrace from inside redb before it.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !agenthost_store::panic_is_reported() {
            default(info);
        }
    }));
    // `serve` installs its subscriber once its configuration (and `[telemetry]`) is known.
    let _logs = match &cli.command {
        Command::Serve(_) => None,
        _ => telemetry::init(cli.log_json, None).ok(),
    };
    let tokio = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = tokio.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args, cli.log_json).await,
            Command::MockProvider(args) => mock::run(args).await,
            Command::Loadtest(args) => loadtest::run(args).await,
            Command::Inspect(args) => inspect::run(args).await,
            Command::Mcp(args) => mcp::run(args).await,
            Command::Config(ConfigCommand::Check { file }) => check_config(file),
            Command::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "agenthost", &mut std::io::stdout());
                Ok(())
            }
            Command::Man => {
                let command = <Cli as clap::CommandFactory>::command();
                match clap_mangen::Man::new(command).render(&mut std::io::stdout()) {
                    // A reader that stopped early (`| head`) is not a failure.
                    Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).runtime(),
                    _ => Ok(()),
                }
            }
        }
    });
    // Background tasks (connections, timers) must not hold the exit up.
    tokio.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {:#}", failure.error());
            ExitCode::from(failure.code())
        }
    }
}

/// The store file inside a data directory.
pub fn store_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("store.redb")
}

/// Resolves when the process receives SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            // Without a SIGTERM handler, Ctrl-C still works.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
