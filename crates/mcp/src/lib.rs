//! Tools from Model Context Protocol servers, through the official Rust SDK (`rmcp`), for the
//! agenthost runtime (ARCHITECTURE.md, "MCP tool servers").
//!
//! [`Mcp::start`] starts one supervisor per configured server, without blocking: a stdio server
//! is a child process, a streamable-HTTP server a URL reached with agenthost's own reqwest
//! client. Once a server is ready its tools are published to the runtime's tool
//! [`Registry`](agenthost_actors::Registry) as `<server>_<tool>`, listed again on
//! `tools/list_changed`, and withdrawn while the server restarts; a server that fails or exits
//! is restarted with backoff. [`Mcp::status`] is what `GET /api/mcp` shows.
//!
//! Calls run through [`tool::McpTool`]: one `tools/call` with the call's idempotency key in
//! `_meta["agenthost/idempotency-key"]`, under the server's deadline; a call given up (its
//! deadline, an interrupt, a shutdown) is cancelled with `notifications/cancelled`.

mod server;
#[cfg(feature = "testing")]
pub mod testing;
mod tool;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::Runtime;
use prometheus_client::registry::Registry as Metrics;

pub use server::{ServerStatus, State, ToolInfo};
pub use tool::{META_KEY, tool_name};

/// How long a call may run unless the server's configuration says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// One configured server (`[mcp.NAME]`).
#[derive(Clone)]
pub struct ServerConfig {
    /// The server's name: its tools are `<name>_<tool>`.
    pub name: String,
    pub transport: Transport,
    /// Its tools' annotations (`readOnlyHint`, `idempotentHint`) may decide whether a call a stop
    /// cut runs again. An untrusted server's annotations decide nothing.
    pub trusted: bool,
    /// Every call's deadline.
    pub call_timeout: Duration,
    /// Patterns (the syntax of an agent's `tools`) over the server's own tool names: calls of
    /// these tools run again after a stop, whatever the annotations say.
    pub idempotent: Vec<String>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("name", &self.name)
            .field("transport", &self.transport)
            .field("trusted", &self.trusted)
            .field("call_timeout", &self.call_timeout)
            .field("idempotent", &self.idempotent)
            .finish()
    }
}

/// How a server is reached.
#[derive(Clone)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
        /// Its environment, on top of agenthost's own (values may be secrets: never printed).
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        url: String,
        /// Headers sent with every request (values may be secrets: never printed).
        headers: BTreeMap<String, String>,
    },
}

impl Transport {
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { command, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Transport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// The MCP servers of one runtime. Dropping it stops them.
#[derive(Debug)]
pub struct Mcp {
    servers: Vec<Arc<server::Server>>,
    stop: tokio_util::sync::CancellationToken,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    counters: Arc<server::Counters>,
}

impl Mcp {
    /// Starts a supervisor for every server; returns at once. Each server's tools join the
    /// runtime's registry when it is ready.
    pub fn start(runtime: &Runtime, configs: Vec<ServerConfig>) -> Mcp {
        let stop = tokio_util::sync::CancellationToken::new();
        let counters = Arc::new(server::Counters::default());
        let mut servers = Vec::new();
        let mut tasks = Vec::new();
        for config in configs {
            let server = Arc::new(server::Server::new(config, counters.clone()));
            runtime.tools().expect(&server.source());
            tasks.push(tokio::spawn(server::supervise(
                server.clone(),
                runtime.clone(),
                stop.clone(),
            )));
            servers.push(server);
        }
        Mcp {
            servers,
            stop,
            tasks: std::sync::Mutex::new(tasks),
            counters,
        }
    }

    /// Every server's status, in configuration order.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.servers.iter().map(|s| s.status()).collect()
    }

    /// Registers the servers' metrics (calls, errors, timeouts and restarts, by server).
    pub fn register(&self, metrics: &mut Metrics) {
        self.counters.register(metrics);
    }

    /// Stops every server (a child process is killed with its connection) and waits, at most
    /// `timeout`, for their supervisors to end.
    pub async fn stop(&self, timeout: Duration) {
        self.stop.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = tokio::time::timeout(timeout, futures::future::join_all(tasks)).await;
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
