//! `agenthost serve`: loads the configuration, checks it completely, then binds, starts the
//! runtime over `<data_dir>/store.redb` and serves the API until SIGINT or SIGTERM.
//!
//! Order matters: configuration errors (exit 2) are found before anything touches the data
//! directory or the network; a non-loopback bind without a token is refused the same way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{Extensions, Runtime, Tools};
use agenthost_server::auth::{NamedToken, Tokens};
use agenthost_server::{Api, Options, metrics};
use anyhow::{Context, anyhow};
use clap::Parser;

use crate::config::{self, Settings};
use crate::{Classify, Failure};

#[derive(Debug, Parser)]
pub struct Args {
    /// The configuration file (TOML); every key is optional.
    #[arg(long, env = "AGENTHOST_CONFIG")]
    config: Option<PathBuf>,
    /// Where the store lives (`<dir>/store.redb`); overrides `data_dir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on; overrides `[server] bind`. Port 0 picks a free port.
    #[arg(long)]
    bind: Option<String>,
}

/// Loads and checks everything `serve` needs, without side effects.
pub fn settings(args: &Args) -> Result<Settings, Failure> {
    let (name, file) = match &args.config {
        Some(path) => (path.display().to_string(), config::load(path).usage()?),
        None => ("(defaults)".to_owned(), config::File::default()),
    };
    let mut settings = config::resolve(&name, file, &|var| std::env::var(var).ok()).usage()?;
    if let Some(dir) = &args.data_dir {
        settings.data_dir = dir.clone();
    }
    if let Some(bind) = &args.bind {
        settings.bind = config::parse_bind(bind)
            .map_err(|reason| Failure::Usage(anyhow!("--bind: {reason}")))?;
    }
    let tokens =
        settings.token.is_some() || !settings.tokens.is_empty() || settings.tokens_file.is_some();
    if !settings.bind.ip().is_loopback() && !tokens {
        return Err(Failure::Usage(anyhow!(
            "refusing to listen on {} without a token: anyone who can reach it could drive \
             your sessions. Set {} (or name another variable in [server] token_env), or bind a \
             loopback address such as 127.0.0.1",
            settings.bind,
            settings.token_env
        )));
    }
    Ok(settings)
}

pub async fn run(args: Args, log_json: bool) -> Result<(), Failure> {
    let settings = settings(&args)?;
    // Flushes the trace export when `serve` ends.
    let _telemetry = crate::telemetry::init(log_json, settings.telemetry.as_ref())
        .map_err(|e| Failure::Usage(anyhow!(e)))?;
    let providers = Arc::new(metrics::Providers::default());
    let mut config = settings.runtime(crate::store_path(&settings.data_dir));
    // Time every provider call for /metrics.
    config.providers = config
        .providers
        .iter()
        .map(|(name, p)| (name.clone(), providers.wrap(name, p.clone())))
        .collect();
    let mut tools = Tools::default();
    for spec in &settings.tools {
        tools.register(spec.build().usage()?);
    }

    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .with_context(|| format!("cannot listen on {}", settings.bind))
        .runtime()?;
    let addr = listener.local_addr().runtime()?;
    // In a cluster, other nodes reach this one at its advertised URL, and know it by its node
    // id: both default to the address it listens on.
    if let Some(pg) = &mut config.store.postgres {
        if pg.advertise_url.is_empty() {
            if addr.ip().is_unspecified() {
                return Err(Failure::Usage(anyhow!(
                    "[cluster] advertise_url must be set when listening on {addr}: other nodes \
                     need an address they can reach this one at"
                )));
            }
            pg.advertise_url = format!("http://{addr}");
        }
        if pg.node_id.is_empty() {
            pg.node_id = pg
                .advertise_url
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .to_owned();
        }
    }
    let store_name = match &config.store.postgres {
        Some(pg) => format!("PostgreSQL (schema {}, node {})", pg.schema, pg.node_id),
        None => crate::store_path(&settings.data_dir).display().to_string(),
    };
    if settings.builtin_mock {
        eprintln!(
            "agenthost: no provider configured, using the built-in mock provider (add \
             [providers.NAME] to the config file for a real model)"
        );
    }
    let runtime = Runtime::start_with(
        config,
        Extensions {
            tools,
            hooks: Vec::new(),
        },
    )
    .await
    .with_context(|| format!("cannot start the runtime over {store_name}"))
    .runtime()?;
    // MCP servers start beside the runtime without holding it up: their tools join as each is
    // ready.
    let mcp = match settings.mcp.is_empty() {
        true => None,
        false => Some(Arc::new(agenthost_mcp::Mcp::start(
            &runtime,
            settings.mcp.clone(),
        ))),
    };
    // Named tokens: the configuration's own, and the file's, read again whenever it changes.
    let tokens = match (&settings.tokens_file, settings.tokens.is_empty()) {
        (None, true) => None,
        (file, _) => {
            let mut list = settings.tokens.clone();
            if let Some(path) = file {
                list.extend(
                    config::read_tokens_file(path, &settings.tokens)
                        .map_err(|e| Failure::Usage(anyhow!("[server] tokens_file: {e}")))?,
                );
            }
            let tokens = Arc::new(Tokens::new(list));
            if let Some(path) = file.clone() {
                tokio::spawn(reload_tokens(path, settings.tokens.clone(), tokens.clone()));
            }
            Some(tokens)
        }
    };
    if settings.postgres.is_some() && settings.cluster_secret.is_none() {
        tracing::warn!(
            "no cluster secret ({} unset): this node neither forwards requests for sessions \
             other nodes own nor accepts forwarded ones",
            config::DEFAULT_CLUSTER_SECRET_ENV
        );
    }
    let mut options = Options {
        mcp,
        token: settings.token.clone(),
        tokens,
        cluster_secret: settings.cluster_secret.clone(),
        protect_metrics: settings.protect_metrics,
        protect_healthz: settings.protect_healthz,
        allowed_hosts: settings.allowed_hosts.clone(),
        providers: Some(providers),
        ..Options::default()
    };
    if let Some(limit) = settings.body_limit {
        options.body_limit = limit;
    }
    if let Some(timeout) = settings.header_timeout {
        options.header_timeout = timeout;
    }
    if let Some(timeout) = settings.body_timeout {
        options.body_timeout = timeout;
    }
    if let Some(max) = settings.max_connections {
        options.max_connections = max;
    }
    if let Some(max) = settings.max_streams {
        options.max_streams = max;
    }
    if let Some(max) = settings.max_streams_per_session {
        options.max_streams_per_session = max;
    }
    if let Some(interval) = settings.delta_interval {
        options.delta_interval = interval;
    }
    open_files(options.max_connections);
    let api = Api::new(runtime, options);
    tracing::info!(
        %addr,
        data_dir = %settings.data_dir.display(),
        auth = settings.token.is_some() || !settings.tokens.is_empty() || settings.tokens_file.is_some(),
        "serving"
    );
    // The one line on stdout: scripts and tests read the address from it.
    println!("agenthost listening on http://{addr}");
    api.serve(listener, crate::shutdown_signal())
        .await
        .context("the server failed")
        .runtime()?;
    tracing::info!("stopped");
    Ok(())
}

/// How often the tokens file is looked at for a change.
const TOKENS_POLL: Duration = Duration::from_secs(2);

/// Reads the tokens file again whenever it changes (its modification time or size): requests
/// from then on are checked against the new list. A file that cannot be read or is invalid
/// leaves the tokens as they were, and says why in the log.
async fn reload_tokens(path: PathBuf, own: Vec<NamedToken>, tokens: Arc<Tokens>) {
    let stamp = |path: &Path| {
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut seen = stamp(&path);
    loop {
        tokio::time::sleep(TOKENS_POLL).await;
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match config::read_tokens_file(&path, &own) {
            Ok(list) => {
                let names: Vec<String> = list
                    .iter()
                    .map(|t| format!("{} ({})", t.name, t.role.as_str()))
                    .collect();
                let mut all = own.clone();
                all.extend(list);
                tokens.replace(all);
                tracing::info!(file = %path.display(), tokens = ?names, "tokens file read again");
            }
            Err(e) => {
                tracing::error!(error = %e, "the tokens file changed but cannot be used; the tokens stay as they were");
            }
        }
    }
}

/// Open files a server needs besides its connections: the store, its log, the connections it
/// makes (providers, tools, MCP servers, other nodes).
const FILES_BESIDES_CONNECTIONS: u64 = 256;

/// Raises the open-file limit (see `files`) and says so; warns when the limit leaves less room
/// than `max_connections` asks for, since a server at its limit accepts nothing more.
fn open_files(max_connections: usize) {
    let limit = crate::files::raise();
    if limit.now != limit.before {
        tracing::debug!(before = ?limit.before, now = ?limit.now, "raised the open-file limit");
    }
    let needed = (max_connections as u64).saturating_add(FILES_BESIDES_CONNECTIONS);
    if let Some(now) = limit.now.filter(|&now| now < needed) {
        tracing::warn!(
            limit = now,
            max_connections,
            "the open-file limit leaves room for fewer connections than [server] \
             max_connections: once it is reached, new connections wait unanswered. Raise the \
             hard limit (ulimit -Hn, or LimitNOFILE= for a systemd service) or lower \
             max_connections"
        );
    }
}
