//! `agenthost-server`: the HTTP+SSE API over the agenthost runtime.
//!
//! **Owns**: the conversions to the wire types ([`wire`]), the axum router ([`Api`]),
//! the one error-to-status mapping ([`ApiError`]), the JSON/query/path extractors that give
//! malformed input our error shape ([`extract`]), bearer-token authentication ([`auth`]), the
//! SSE event stream with replay and resume (module `events`, whose doc specifies the frames),
//! OpenMetrics metrics ([`metrics`]), the generated OpenAPI document ([`openapi`]) and HTTP tools
//! ([`tools`]). The wire types and the typed client live in `agenthost-api`, which this crate
//! serves.
//!
//! **Must not**: decide execution or touch storage directly (everything goes through
//! [`agenthost_actors::Runtime`] and read-only snapshots); read configuration files or the
//! environment (the CLI does, and hands over [`Options`]); print a secret (tokens are
//! [`Token`]s with a redacted `Debug`).
//!
//! Main types: [`Api`] (router and graceful serving), [`Options`], [`ApiError`] and
//! [`ErrorType`], [`Token`], [`tools::Http`], [`metrics::Timed`].
//!

mod api;
pub mod auth;
mod console;
mod error;
mod events;
pub mod extract;
pub mod forward;
mod listen;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod tools;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::Runtime;
use agenthost_store::Snapshot;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use auth::Token;
pub use error::{ApiError, ErrorType};

/// The README's Rust examples (embedding, the client), compiled and run as doctests so they
/// cannot rot.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The default bind address: loopback only.
pub const DEFAULT_BIND: &str = "127.0.0.1:4096";

/// How the API behaves. Every field has a default suited to `agenthost serve`.
#[derive(Debug, Clone)]
pub struct Options {
    /// When set, every `/api` route needs `Authorization: Bearer <token>`: this one, with every
    /// right, or one of `tokens`.
    pub token: Option<Token>,
    /// Named tokens with roles (see [`auth::Role`]), replaceable while serving. When set, a token
    /// is required even if the list is empty.
    pub tokens: Option<Arc<auth::Tokens>>,
    /// The cluster's shared secret: requests for sessions another node owns are forwarded signed
    /// with it, and forwarded requests are accepted only with a valid signature. Without it
    /// this node neither forwards nor accepts forwarded requests.
    pub cluster_secret: Option<forward::ClusterSecret>,
    /// Names (`agents.example.com`, `*.example.com`) besides IP literals and `localhost` that
    /// requests may name in `Host`. Without a token every request's `Host` is checked; with
    /// one, only when this lists names (see [`auth`]).
    pub allowed_hosts: Vec<String>,
    /// Largest request body in bytes; larger bodies get `payload_too_large`. The default leaves
    /// room for a maximal prompt (1 MiB) even when JSON escaping doubles it.
    pub body_limit: usize,
    /// Interval of SSE keep-alive comments, so idle streams survive proxies.
    pub keep_alive: Duration,
    /// The shortest time between two writes of deltas alone on an event stream: the first
    /// delta of a burst goes at once, the next ones together after this (zero: each delta
    /// as it comes). Other frames never wait.
    pub delta_interval: Duration,
    /// Upper bound of `timeout_ms` on `POST /api/session/{id}/wait`.
    pub max_wait: Duration,
    /// How long a graceful shutdown waits for in-flight requests after the runtime stopped.
    pub drain_timeout: Duration,
    /// How long a connection may take to send a request's head; slower ones are closed.
    pub header_timeout: Duration,
    /// How long a request body may take to arrive, whole; slower ones get `408`.
    pub body_timeout: Duration,
    /// Connections open at once; one more gets `503` and is closed.
    pub max_connections: usize,
    /// Whether `/metrics` and `/healthz` need the token too (they are open by default, for
    /// scrapers and load balancers).
    pub protect_metrics: bool,
    pub protect_healthz: bool,
    /// Event streams open at once, in all and on one session; one more gets `503`.
    pub max_streams: usize,
    pub max_streams_per_session: usize,
    /// Provider timings, when the providers were wrapped in [`metrics::Timed`].
    pub providers: Option<Arc<metrics::Providers>>,
    /// The runtime's MCP servers: `GET /api/mcp` shows them, `/metrics` counts their calls,
    /// and they stop after the runtime at shutdown.
    pub mcp: Option<Arc<agenthost_mcp::Mcp>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            tokens: None,
            cluster_secret: None,
            allowed_hosts: Vec::new(),
            body_limit: 4 * 1024 * 1024,
            keep_alive: Duration::from_secs(15),
            delta_interval: Duration::from_millis(10),
            max_wait: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            protect_metrics: false,
            protect_healthz: false,
            max_streams: 10_000,
            max_streams_per_session: 256,
            providers: None,
            mcp: None,
        }
    }
}

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub runtime: Runtime,
    pub options: Options,
    /// Cancelled when shutdown begins: SSE streams end, `/healthz` turns 503.
    pub closing: CancellationToken,
    /// Background work started by requests (`resume` without `wait`);
    /// shutdown waits for it.
    pub tasks: TaskTracker,
    pub counters: metrics::Counters,
    pub metrics: metrics::Metrics,
    /// Event streams open per session, for `max_streams_per_session`.
    pub streams: events::Streams,
    /// Frames of durable events being sent, rendered once for all the streams sending them.
    pub renders: events::Renders,
    /// Nonces of forwarded requests accepted within the signature window: a replay is refused.
    pub nonces: forward::Nonces,
    /// Forwards requests for sessions another node of the cluster owns (or why it cannot).
    pub forwarder: Result<reqwest::Client, String>,
    /// Snapshot reads running at once ([`read`]).
    pub reads: Arc<tokio::sync::Semaphore>,
}

/// The HTTP API over one runtime. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Api {
    shared: Arc<Shared>,
}

impl Api {
    /// An API over `runtime`.
    pub fn new(runtime: Runtime, options: Options) -> Api {
        let counters = metrics::Counters::default();
        let metrics = metrics::Metrics::new(
            &runtime,
            &counters,
            options.providers.as_deref(),
            options.mcp.as_deref(),
        );
        let shared = Arc::new(Shared {
            runtime,
            options,
            closing: CancellationToken::new(),
            tasks: TaskTracker::new(),
            counters,
            metrics,
            streams: Default::default(),
            renders: Default::default(),
            nonces: Default::default(),
            forwarder: forward::client(),
            reads: Arc::new(tokio::sync::Semaphore::new(concurrent_reads())),
        });
        Api { shared }
    }

    pub fn runtime(&self) -> &Runtime {
        &self.shared.runtime
    }

    /// The named tokens the API accepts, to replace while it serves.
    pub fn tokens(&self) -> Option<&Arc<auth::Tokens>> {
        self.shared.options.tokens.as_ref()
    }

    /// The router: `/healthz`, `/metrics`, `/openapi.json` and the `/api` routes (behind the
    /// token when one is configured; `/metrics` and `/healthz` too when asked), with the body limit and our error shape for unknown
    /// routes and methods.
    pub fn router(&self) -> Router {
        // Authentication runs first (on the node the request reached), then forwarding.
        let api = api::routes()
            .route_layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                forward::route,
            ))
            .route_layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                auth::require,
            ))
            .with_state(self.shared.clone());
        let guard = || axum::middleware::from_fn_with_state(self.shared.clone(), auth::require);
        let mut healthz = Router::new().route("/healthz", axum::routing::get(api::healthz));
        if self.shared.options.protect_healthz {
            healthz = healthz.route_layer(guard());
        }
        let mut metrics = Router::new().route("/metrics", axum::routing::get(metrics::render));
        if self.shared.options.protect_metrics {
            metrics = metrics.route_layer(guard());
        }
        Router::new()
            .route("/openapi.json", axum::routing::get(openapi::serve))
            .route("/console", axum::routing::get(console::index))
            .route("/console/{file}", axum::routing::get(console::asset))
            .merge(healthz)
            .merge(metrics)
            .with_state(self.shared.clone())
            .merge(api)
            .fallback(api::not_found)
            .method_not_allowed_fallback(api::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                auth::host,
            ))
            .layer(DefaultBodyLimit::max(self.shared.options.body_limit))
            .layer(axum::Extension(extract::BodyTimeout(
                self.shared.options.body_timeout,
            )))
            // A span per request (method, path, version) and its status and latency, at debug
            // (`RUST_LOG=tower_http=debug`); failures are logged where they happen, with more
            // to say (a 500 at error, under its request id).
            .layer(tower_http::trace::TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ))
    }

    /// `/mcp`: agenthost as a streamable-HTTP MCP server, behind the token and the `Host` check
    /// as `/api` is. Its tools call this node's own API at `addr` with the caller's token (see
    /// [`mcp`]).
    fn mcp_router(&self, addr: std::net::SocketAddr) -> Router {
        use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
        use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
        let ip = match addr.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => std::net::Ipv4Addr::LOCALHOST.into(),
            ip if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            ip => ip,
        };
        let base = format!("http://{}", std::net::SocketAddr::new(ip, addr.port()));
        let client = match agenthost_api::Client::new(&base) {
            Ok(client) => client,
            Err(e) => {
                tracing::error!(error = %e, "cannot serve /mcp");
                return Router::new();
            }
        };
        let handler = mcp::Handler::with_callers_token(client);
        // `Host` is checked for /mcp as for every route (`auth::host`), so rmcp's own check,
        // which knows neither `allowed_hosts` nor IP literals, is off.
        let mut config = StreamableHttpServerConfig::default().disable_allowed_hosts();
        config.cancellation_token = self.shared.closing.child_token();
        let service = StreamableHttpService::new(
            move || Ok(handler.clone()),
            std::sync::Arc::new(LocalSessionManager::default()),
            config,
        );
        Router::new().route_service("/mcp", service).route_layer(
            axum::middleware::from_fn_with_state(self.shared.clone(), auth::require),
        )
    }

    /// Serves until `shutdown` resolves, then shuts down gracefully and boundedly: SSE streams
    /// end, the runtime shuts down (drains are interrupted and keep their claims, the store is
    /// flushed), background tasks are awaited, and in-flight requests get up to
    /// [`Options::drain_timeout`] to finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let router = match listener.local_addr() {
            Ok(addr) => self.router().merge(self.mcp_router(addr).layer(
                axum::middleware::from_fn_with_state(self.shared.clone(), auth::host),
            )),
            Err(_) => self.router(),
        };
        let shared = self.shared.clone();
        let stop = CancellationToken::new();
        let limits = listen::Limits {
            header_timeout: shared.options.header_timeout,
            max_connections: shared.options.max_connections,
        };
        // On a worker of its own runtime, not on the caller's thread (a binary's `block_on` runs
        // on the main thread, which drives no I/O): an accepted connection's task then starts on
        // the worker that accepted it, instead of two threads waking each other per connection.
        // It stops when this future is dropped, as it did when it was part of it.
        let mut server = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(listen::serve(
            listener,
            router,
            limits,
            stop.clone(),
        )));
        let graceful = async {
            shutdown.await;
            tracing::info!("shutting down");
            shared.closing.cancel();
            shared.runtime.shutdown().await;
            // After the runtime: a call the shutdown cut is left to recovery as a crash leaves
            // it, and only then do the servers go.
            if let Some(mcp) = &shared.options.mcp {
                mcp.stop(shared.options.drain_timeout).await;
            }
            shared.tasks.close();
            let _ = tokio::time::timeout(shared.options.drain_timeout, shared.tasks.wait()).await;
        };
        tokio::select! {
            ended = &mut server => return ended.map_err(std::io::Error::other),
            () = graceful => stop.cancel(),
        }
        // Bound the wait for open connections once shutdown has begun: a client holding a
        // keep-alive connection must not keep the process alive.
        if tokio::time::timeout(shared.options.drain_timeout, &mut server)
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the drain timeout; closing them");
        }
        Ok(())
    }
}

/// Runs a snapshot read on the blocking pool: redb reads can touch the disk, and the async
/// workers must not wait on it. At most [`concurrent_reads`] run at once, the others wait their
/// turn: what one read holds is bounded (a page of rows, or one large event), and so is what
/// all of them hold together, however many clients ask at the same moment (500 event streams
/// opened at once each replay their session's log).
pub(crate) async fn read<T: Send + 'static>(
    shared: &Shared,
    f: impl FnOnce(&dyn Snapshot) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    // The turn goes with the read: a caller that stops waiting does not stop the read.
    let turn = shared
        .reads
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::internal(format!("snapshot read failed: {e}")))?;
    let runtime = shared.runtime.clone();
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let snapshot = runtime.snapshot()?;
        f(&*snapshot)
    })
    .await
    .map_err(|e| ApiError::internal(format!("snapshot read failed: {e}")))?
}

/// Snapshot reads the API runs at once: twice the cores, at least four. A read is CPU work on
/// pages the store's cache or the operating system's already holds, so more at once would only
/// hold more memory.
fn concurrent_reads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| (2 * n.get()).max(4))
}
