//! One MCP server's supervisor: connect, list the tools and publish them, follow
//! `tools/list_changed`, and when the connection ends (the process exited, the endpoint went
//! away), withdraw the tools, fail what was in flight and connect again with backoff.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthost_actors::Runtime;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rmcp::model::{ClientConfig, Implementation};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{ServerConfig, Transport};

/// The first wait before a server is started again, and the longest.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server up this long has its backoff start over.
const STABLE: Duration = Duration::from_secs(60);
/// How long connecting (the process's start and the `initialize` handshake) and listing the
/// tools may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of a server's stderr kept for diagnosis, and their size.
const STDERR_LINES: usize = 50;
const STDERR_LINE_BYTES: usize = 1024;

/// Where a server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Connecting for the first time.
    Starting,
    /// Connected, its tools listed and published.
    Ready,
    /// The last attempt failed; another follows after the backoff.
    Failed,
    /// It was ready and its connection ended; connecting again.
    Restarting,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Failed => "failed",
            State::Restarting => "restarting",
        }
    }
}

/// A server's tool, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolInfo {
    /// The runtime's name (`<server>_<tool>`).
    pub name: String,
    /// The server's own name.
    pub original: String,
    pub description: String,
    pub read_only: Option<bool>,
    pub idempotent: Option<bool>,
    pub destructive: Option<bool>,
    /// A call a stop cut runs again (see the crash rule).
    pub reruns: bool,
}

/// What `GET /api/mcp` shows of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    pub name: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    pub trusted: bool,
    pub state: State,
    pub tools: Vec<ToolInfo>,
    pub last_error: Option<String>,
    /// Connections that ended or failed and were tried again.
    pub restarts: u64,
    /// The last lines the server wrote to stderr (stdio servers).
    pub stderr: Vec<String>,
}

/// How a call ended, for the metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Ok,
    Error,
    Timeout,
    /// The server stopped while the call ran.
    Stopped,
    /// The server was not running.
    Unavailable,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    server: String,
    outcome: &'static str,
}

/// Every server's counters; server names come from the configuration, so they may be labels.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    calls: Family<CallLabels, Counter>,
    restarts: Family<ServerLabel, Counter>,
}

impl Counters {
    pub(crate) fn register(&self, metrics: &mut prometheus_client::registry::Registry) {
        metrics.register(
            "agenthost_mcp_calls",
            "MCP tool calls, by server and outcome (ok, error, timeout, stopped, unavailable)",
            self.calls.clone(),
        );
        metrics.register(
            "agenthost_mcp_restarts",
            "MCP server connections that ended or failed and were tried again, by server",
            self.restarts.clone(),
        );
    }
}

/// One server: its configuration, its connection while it has one, and what its status shows.
#[derive(Debug)]
pub(crate) struct Server {
    config: ServerConfig,
    counters: Arc<Counters>,
    live: Mutex<Live>,
    /// `tools/list_changed` arrived.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct Live {
    state: State,
    peer: Option<Peer<RoleClient>>,
    tools: Vec<ToolInfo>,
    last_error: Option<String>,
    restarts: u64,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Server {
    pub(crate) fn new(config: ServerConfig, counters: Arc<Counters>) -> Server {
        Server {
            config,
            counters,
            live: Mutex::new(Live {
                state: State::Starting,
                peer: None,
                tools: Vec::new(),
                last_error: None,
                restarts: 0,
                stderr: Arc::default(),
            }),
            changed: Arc::default(),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The registry source this server publishes as.
    pub(crate) fn source(&self) -> String {
        format!("mcp:{}", self.config.name)
    }

    pub(crate) fn peer(&self) -> Option<Peer<RoleClient>> {
        self.live().peer.clone()
    }

    pub(crate) fn state(&self) -> State {
        self.live().state
    }

    pub(crate) fn count(&self, outcome: Outcome) {
        let outcome = match outcome {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Stopped => "stopped",
            Outcome::Unavailable => "unavailable",
        };
        self.counters
            .calls
            .get_or_create(&CallLabels {
                server: self.config.name.clone(),
                outcome,
            })
            .inc();
    }

    pub(crate) fn status(&self) -> ServerStatus {
        let live = self.live();
        let stderr = live
            .stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        ServerStatus {
            name: self.config.name.clone(),
            transport: self.config.transport.kind(),
            trusted: self.config.trusted,
            state: live.state,
            tools: live.tools.clone(),
            last_error: live.last_error.clone(),
            restarts: live.restarts,
            stderr,
        }
    }

    fn set(&self, f: impl FnOnce(&mut Live)) {
        f(&mut self.live());
    }
}

/// Receives the server's notifications: only `tools/list_changed` matters here.
#[derive(Debug, Clone)]
struct Handler {
    changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.changed.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.client_info = Implementation::new("agenthost", env!("CARGO_PKG_VERSION"));
        info
    }
}

/// Runs the server until `stop`: connects, publishes its tools, follows their changes, and
/// connects again with backoff whenever the connection fails or ends.
pub(crate) async fn supervise(server: Arc<Server>, runtime: Runtime, stop: CancellationToken) {
    let registry = runtime.tools();
    let source = server.source();
    let name = server.config.name.clone();
    let mut backoff = FIRST_BACKOFF;
    let mut first = true;
    loop {
        if !first {
            server.set(|live| live.restarts += 1);
            server
                .counters
                .restarts
                .get_or_create(&ServerLabel {
                    server: name.clone(),
                })
                .inc();
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        first = false;
        let connected = tokio::select! {
            _ = stop.cancelled() => break,
            connected = tokio::time::timeout(CONNECT_TIMEOUT, connect(&server)) => connected,
        };
        let mut running = match connected {
            Ok(Ok(running)) => running,
            Ok(Err(e)) => {
                tracing::warn!(server = %name, error = %e, "MCP server failed to start; retrying");
                server.set(|live| {
                    live.state = State::Failed;
                    live.last_error = Some(e);
                });
                continue;
            }
            Err(_) => {
                let e = format!("did not answer within {CONNECT_TIMEOUT:?}");
                tracing::warn!(server = %name, error = %e, "MCP server failed to start; retrying");
                server.set(|live| {
                    live.state = State::Failed;
                    live.last_error = Some(e);
                });
                continue;
            }
        };
        let up = Instant::now();
        let peer = running.peer().clone();
        if let Err(e) = list(&server, &peer, registry).await {
            tracing::warn!(server = %name, error = %e, "MCP server's tools could not be listed; restarting it");
            server.set(|live| {
                live.state = State::Failed;
                live.last_error = Some(e);
            });
            let _ = running.close().await;
            continue;
        }
        server.set(|live| {
            live.state = State::Ready;
            live.peer = Some(peer.clone());
        });
        tracing::info!(server = %name, tools = server.live().tools.len(), "MCP server ready");
        let ct = running.cancellation_token();
        let mut waiting = std::pin::pin!(running.waiting());
        let ended = loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    ct.cancel();
                    let _ = waiting.await;
                    break None;
                }
                quit = &mut waiting => break Some(format!("{quit:?}")),
                _ = server.changed.notified() => {
                    if let Err(e) = list(&server, &peer, registry).await {
                        tracing::warn!(server = %name, error = %e, "MCP server's changed tools could not be listed");
                    }
                }
            }
        };
        // Calls in flight fail as their transport closes; new ones find no peer.
        server.set(|live| live.peer = None);
        registry.expect(&source);
        let Some(reason) = ended else {
            break;
        };
        tracing::warn!(server = %name, reason = %reason, "MCP server connection ended; restarting it");
        server.set(|live| {
            live.state = State::Restarting;
            live.last_error = Some(format!("the connection ended ({reason})"));
        });
        if up.elapsed() >= STABLE {
            backoff = FIRST_BACKOFF;
        }
    }
    server.set(|live| live.peer = None);
    registry.remove(&source);
}

/// Lists the server's tools (every page) and publishes them.
async fn list(
    server: &Arc<Server>,
    peer: &Peer<RoleClient>,
    registry: &agenthost_actors::Registry,
) -> Result<(), String> {
    let tools = tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools())
        .await
        .map_err(|_| format!("tools/list did not answer within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("tools/list failed: {e}"))?;
    let info = tools
        .iter()
        .map(|tool| {
            let a = tool.annotations.as_ref();
            ToolInfo {
                name: crate::tool::tool_name(&server.config.name, &tool.name),
                original: tool.name.to_string(),
                description: tool.description.as_deref().unwrap_or_default().to_owned(),
                read_only: a.and_then(|a| a.read_only_hint),
                idempotent: a.and_then(|a| a.idempotent_hint),
                destructive: a.and_then(|a| a.destructive_hint),
                reruns: crate::tool::reruns(&server.config, tool),
            }
        })
        .collect();
    let runtime_tools = tools
        .iter()
        .map(|tool| crate::tool::runtime_tool(server, tool))
        .collect();
    server.set(|live| live.tools = info);
    registry.publish(&server.source(), runtime_tools);
    Ok(())
}

type Running = RunningService<RoleClient, Handler>;

/// Connects to the server and runs the `initialize` handshake.
async fn connect(server: &Server) -> Result<Running, String> {
    let handler = Handler {
        changed: server.changed.clone(),
    };
    match &server.config.transport {
        Transport::Stdio { command, env, cwd } => {
            let (program, args) = command
                .split_first()
                .ok_or_else(|| "the command is empty".to_owned())?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).envs(env);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {program:?}: {e}"))?;
            if let Some(stderr) = stderr {
                let tail = server.live().stderr.clone();
                tokio::spawn(keep_tail(stderr, tail));
            }
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("the MCP handshake failed: {e}"))
        }
        Transport::Http { url, headers } => {
            let client = agenthost_http::client_builder()
                .and_then(|b| b.build().map_err(|e| e.to_string()))
                .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
            let mut custom = std::collections::HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| format!("header {name:?}: {e}"))?;
                let value = reqwest::header::HeaderValue::from_str(value)
                    .map_err(|_| format!("the value of header {name} is not a valid header"))?;
                custom.insert(name, value);
            }
            let config =
                rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                    url.as_str(),
                )
                .custom_headers(custom);
            let transport =
                rmcp::transport::StreamableHttpClientTransport::with_client(client, config);
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("the MCP handshake failed: {e}"))
        }
    }
}

/// Keeps the last lines a server writes to stderr, each cut to a bound.
async fn keep_tail(stderr: tokio::process::ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(mut line)) = lines.next_line().await {
        if line.len() > STDERR_LINE_BYTES {
            let mut cut = STDERR_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == STDERR_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}
