//! The configuration file: one TOML file, every key optional.
//!
//! Loading is two steps. [`parse`] turns the text into [`File`], refusing unknown keys and
//! values of the wrong type (serde's `deny_unknown_fields`; toml's messages carry the line and
//! column). [`resolve`] checks what types cannot (references between sections, ranges, URLs,
//! names), reads the secrets from the environment variables the file names, and builds the
//! runtime's configuration. Every error names the file, the key and the reason, and nothing
//! touches the data directory before both steps succeeded.
//!
//! Relative paths (`data_dir`) are relative to the current directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors as actors;
use agenthost_llm as llm;
use agenthost_server::auth::{NamedToken, Role};
use agenthost_server::forward::ClusterSecret;
use agenthost_server::{DEFAULT_BIND, Token, tools};
use serde::Deserialize;

/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = ".agenthost";
/// The environment variable holding the API token unless `[server] token_env` names another.
pub const DEFAULT_TOKEN_ENV: &str = "AGENTHOST_TOKEN";

/// The longest `[store] commit_linger_us` accepted: a second.
const MAX_COMMIT_LINGER_US: u64 = 1_000_000;

/// The embedded store's page cache, in MiB, unless `[store] cache_mib` says otherwise. redb's
/// own default (1 GiB) suits a desktop database; a server keeps its hot pages (the log's front,
/// the busy sessions' rows) in far less, and its memory for sessions. A page it misses is read
/// from the operating system's cache of the file (ARCHITECTURE.md, the store's decisions).
pub const DEFAULT_CACHE_MIB: usize = 8;

/// A configuration error: where and why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("config file {file}: {message}")]
    Parse { file: String, message: String },
    #[error("config file {file}: `{key}`: {reason}")]
    Invalid {
        file: String,
        key: String,
        reason: String,
    },
}

// ---------------------------------------------------------------------------------------------
// The file, as written.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    data_dir: Option<PathBuf>,
    /// The agent of sessions created without one; `default`, or the only agent.
    default_agent: Option<String>,
    #[serde(default)]
    server: Server,
    #[serde(default)]
    providers: BTreeMap<String, Provider>,
    #[serde(default)]
    models: BTreeMap<String, Model>,
    #[serde(default)]
    agents: BTreeMap<String, Agent>,
    #[serde(default)]
    tools: Vec<Tool>,
    #[serde(default)]
    mcp: BTreeMap<String, McpServer>,
    #[serde(default)]
    recovery: Recovery,
    #[serde(default)]
    compaction: Compaction,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    store: StoreSection,
    #[serde(default)]
    cluster: Cluster,
    #[serde(default)]
    telemetry: TelemetrySection,
}

/// `[mcp.NAME]`: a Model Context Protocol server whose tools the agents may use, as
/// `<NAME>_<tool>`: a child process (`command`) or a streamable-HTTP endpoint (`url`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpServer {
    command: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Variables of the child's environment read from these variables of agenthost's.
    #[serde(default)]
    env_from: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Headers whose values are read from these environment variables.
    #[serde(default)]
    headers_from: BTreeMap<String, String>,
    #[serde(default)]
    trusted: bool,
    call_timeout_ms: Option<u64>,
    #[serde(default)]
    idempotent: Vec<String>,
}

/// `[telemetry]`: export traces to an OpenTelemetry collector.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetrySection {
    /// The collector's OTLP/HTTP base URL; traces go to `<otlp_endpoint>/v1/traces`.
    otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans (default `agenthost`).
    service_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    /// `redb` (the embedded store, the default) or `postgres` (shared by several nodes).
    kind: Option<StoreKind>,
    /// Check the whole store file when opening it (default true; redb only).
    check_on_start: Option<bool>,
    /// The embedded store's page cache in MiB (redb only).
    cache_mib: Option<usize>,
    /// How long a busy writer's batch waits for more operations, in µs (redb only).
    commit_linger_us: Option<u64>,
    /// PostgreSQL: the environment variable holding the connection URL.
    url_env: Option<String>,
    /// PostgreSQL: the schema of agenthost's tables.
    schema: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoreKind {
    Redb,
    Postgres,
}

/// `[cluster]`: how this node takes part in a cluster over PostgreSQL.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cluster {
    /// The variable holding the cluster's shared secret.
    secret_env: Option<String>,
    node_id: Option<String>,
    advertise_url: Option<String>,
    partitions: Option<u32>,
    lease_ttl_ms: Option<u64>,
}

/// The environment variable holding the PostgreSQL URL unless `[store] url_env` names another.
pub const DEFAULT_PG_URL_ENV: &str = "AGENTHOST_PG_URL";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Server {
    bind: Option<String>,
    token_env: Option<String>,
    /// Largest request body in bytes.
    body_limit_bytes: Option<usize>,
    /// How long a connection may take to send a request head, and a request body.
    header_timeout_ms: Option<u64>,
    body_timeout_ms: Option<u64>,
    /// Connections open at once.
    max_connections: Option<usize>,
    /// Whether `/metrics` and `/healthz` need the token too.
    protect_metrics: Option<bool>,
    protect_healthz: Option<bool>,
    /// Event streams open at once, in all and on one session.
    max_streams: Option<usize>,
    max_streams_per_session: Option<usize>,
    /// The shortest time between two writes of deltas alone on an event stream.
    delta_interval_ms: Option<u64>,
    /// Names requests may give in `Host` besides IP literals and `localhost`.
    allowed_hosts: Option<Vec<String>>,
    /// Named tokens with roles, from the environment.
    #[serde(default)]
    tokens: BTreeMap<String, TokenSection>,
    /// A file of named tokens with roles, read again when it changes.
    tokens_file: Option<PathBuf>,
}

/// `[server.tokens.NAME]`: a token from the environment, with its role.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenSection {
    role: String,
    token_env: String,
}

/// A tokens file: `[tokens.NAME] role = "read" | "write" | "admin"`, `token = "…"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: BTreeMap<String, FileToken>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    role: String,
    token: String,
}

/// A token's name: what approvals record and logs show.
fn valid_token_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

fn role(text: &str) -> Result<Role, String> {
    Role::parse(text).ok_or_else(|| format!("{text:?} is not a role (read, write or admin)"))
}

/// Reads and checks a tokens file: every name valid, every role known, every token non-empty,
/// and no name or token used twice (with `taken`, the names of the configuration's own).
pub fn read_tokens_file(path: &Path, taken: &[NamedToken]) -> Result<Vec<NamedToken>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file: TokensFile =
        toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    let mut list: Vec<NamedToken> = Vec::new();
    for (name, entry) in file.tokens {
        let at = |reason: String| format!("{}: tokens.{name}: {reason}", path.display());
        if !valid_token_name(&name) {
            return Err(at(
                "a name is 1 to 64 letters, digits, `-`, `_`, `.` or `@`".into(),
            ));
        }
        let role = role(&entry.role).map_err(at)?;
        let token = Token::new(entry.token).ok_or_else(|| at("the token is empty".into()))?;
        list.push(NamedToken { name, role, token });
    }
    unique(taken.iter().chain(&list)).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(list)
}

/// No two tokens with one name or one value.
fn unique<'a>(tokens: impl Iterator<Item = &'a NamedToken> + Clone) -> Result<(), String> {
    for (i, a) in tokens.clone().enumerate() {
        for b in tokens.clone().skip(i + 1) {
            if a.name == b.name {
                return Err(format!("two tokens are named {:?}", a.name));
            }
            if a.token == b.token {
                return Err(format!(
                    "tokens {:?} and {:?} are the same token",
                    a.name, b.name
                ));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Provider {
    kind: llm::Kind,
    base_url: Option<String>,
    api_key_env: Option<String>,
    /// Milliseconds of silence tolerated while streaming.
    idle_timeout_ms: Option<u64>,
    /// HTTP/2 without negotiation (h2c for `http://`).
    http2_prior_knowledge: Option<bool>,
    /// Calls multiplexed on one HTTP/2 connection at most.
    streams_per_connection: Option<u64>,
    // Behaviour of `kind = "mock"` only.
    latency_ms: Option<u64>,
    tokens_per_sec: Option<f64>,
    tool_ratio: Option<f64>,
    reply_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Model {
    provider: Option<String>,
    model: Option<String>,
    context_window: Option<u32>,
    max_output: Option<u32>,
    tool_choice_none: Option<bool>,
    /// US dollars per million tokens.
    #[serde(default)]
    price: Price,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Price {
    input: Option<f64>,
    output: Option<f64>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Agent {
    model: Option<String>,
    system: Option<String>,
    steps: Option<u32>,
    tools: Option<Vec<String>>,
    ask: Option<Vec<String>>,
    permission: Option<Rules>,
    approval_ttl_ms: Option<u64>,
    on_new_input: Option<String>,
    temperature: Option<f64>,
    /// What each session of the agent may spend.
    budget: Option<agenthost_api::wire::Budget>,
}

/// An agent's `permission`: one decision for every tool (`permission = "ask"`), or a table of
/// tool name patterns to decisions, in the file's order: the last pattern matching a call
/// decides.
#[derive(Debug)]
enum Rules {
    All(String),
    Each(Vec<(String, String)>),
}

impl<'de> Deserialize<'de> for Rules {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Rules;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "\"allow\", \"ask\" or \"deny\", or a table of tool name patterns to one \
                     of them",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Rules, E> {
                Ok(Rules::All(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Rules, A::Error> {
                let mut rules = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    rules.push(entry);
                }
                Ok(Rules::Each(rules))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `"allow"`, `"ask"` or `"deny"`; a denial tells the model `denied`.
fn decision(value: &str, denied: impl FnOnce() -> String) -> Result<actors::Permission, String> {
    match value {
        "allow" => Ok(actors::Permission::Allow),
        "ask" => Ok(actors::Permission::Ask),
        "deny" => Ok(actors::Permission::Deny(denied())),
        other => Err(format!(
            "unknown value {other:?}; expected \"allow\", \"ask\" or \"deny\""
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tool {
    name: String,
    kind: ToolKind,
    url: String,
    #[serde(default)]
    idempotent: bool,
    permission: Option<String>,
    #[serde(default)]
    description: String,
    parameters: Option<serde_json::Value>,
    timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ToolKind {
    Http,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Recovery {
    mode: Option<RecoveryMode>,
    max_attempts: Option<u32>,
    concurrency: Option<usize>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RecoveryMode {
    Resume,
    Pause,
    Off,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Compaction {
    auto: Option<bool>,
}

/// `[limits]`: every bound the runtime keeps, with its unit in its name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    concurrent_streams: Option<usize>,
    concurrent_drains: Option<usize>,
    live_sessions: Option<usize>,
    pending_per_session: Option<u32>,
    waiters_per_session: Option<usize>,
    schedules_per_session: Option<usize>,
    schedule_grace_ms: Option<u64>,
    tool_output_bytes: Option<usize>,
    history_cache_bytes: Option<usize>,
    call_timeout_ms: Option<u64>,
    shutdown_timeout_ms: Option<u64>,
    wake_sweep_ms: Option<u64>,
    passivate_after_ms: Option<u64>,
}

// ---------------------------------------------------------------------------------------------
// Loading.

/// Reads and parses `path`.
pub fn load(path: &Path) -> Result<File, Error> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Read {
        file: name.clone(),
        reason: e.to_string(),
    })?;
    parse(&name, &text)
}

/// Parses configuration text; `file` names it in errors.
pub fn parse(file: &str, text: &str) -> Result<File, Error> {
    toml::from_str(text).map_err(|e| Error::Parse {
        file: file.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })
}

/// Everything `serve` needs, checked.
pub struct Settings {
    pub data_dir: PathBuf,
    pub bind: SocketAddr,
    /// Where the token came from, for messages.
    pub token_env: String,
    pub token: Option<Token>,
    pub body_limit: Option<usize>,
    pub header_timeout: Option<Duration>,
    pub body_timeout: Option<Duration>,
    pub max_connections: Option<usize>,
    pub max_streams: Option<usize>,
    pub max_streams_per_session: Option<usize>,
    pub delta_interval: Option<Duration>,
    pub protect_metrics: bool,
    pub protect_healthz: bool,
    pub allowed_hosts: Vec<String>,
    /// Named tokens with roles from the environment (`[server.tokens.NAME]`).
    pub tokens: Vec<NamedToken>,
    /// The file of named tokens, read at start and again whenever it changes.
    pub tokens_file: Option<PathBuf>,
    /// The cluster's shared secret (PostgreSQL store only).
    pub cluster_secret: Option<ClusterSecret>,
    /// Check the whole store file when opening it.
    pub check_on_start: bool,
    /// The embedded store's page cache, in MiB.
    pub cache_mib: usize,
    /// How long a busy embedded writer's batch waits for more operations.
    pub commit_linger: Duration,
    /// The PostgreSQL store, when `[store] kind = "postgres"`. An empty `advertise_url` means
    /// `http://` and the address `serve` listens on.
    pub postgres: Option<agenthost_store::PgConfig>,
    /// No provider was configured: the built-in mock answers.
    pub builtin_mock: bool,
    pub providers: BTreeMap<String, Arc<dyn llm::Provider>>,
    pub models: BTreeMap<String, actors::Model>,
    pub agents: BTreeMap<String, actors::Agent>,
    pub default_agent: String,
    pub recovery: actors::Recovery,
    pub compaction_auto: bool,
    pub tools: Vec<tools::Spec>,
    /// `[mcp.NAME]` servers, secrets resolved.
    pub mcp: Vec<agenthost_mcp::ServerConfig>,
    pub limits: actors::Limits,
    pub passivate_after: Option<Duration>,
    /// Where traces go, when `[telemetry] otlp_endpoint` is set.
    pub telemetry: Option<crate::telemetry::Telemetry>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("data_dir", &self.data_dir)
            .field("bind", &self.bind)
            .field("token", &self.token)
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .field("models", &self.models)
            .field("agents", &self.agents)
            .field("default_agent", &self.default_agent)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The runtime configuration storing at `store`.
    pub fn runtime(&self, store: PathBuf) -> actors::Config {
        let mut config = actors::Config::new(store);
        config.providers = self.providers.clone();
        config.models = self.models.clone();
        config.agents = self.agents.clone();
        config.default_agent = self.default_agent.clone();
        config.recovery = self.recovery.clone();
        config.compaction.auto = self.compaction_auto;
        config.limits = self.limits.clone();
        if let Some(after) = self.passivate_after {
            config.passivate_after = after;
        }
        config.store.check_on_open = self.check_on_start;
        config.store.cache_size = Some(self.cache_mib << 20);
        config.store.max_wait = self.commit_linger;
        config.store.postgres = self.postgres.clone();
        config
    }
}

/// Checks `file` and builds the settings, reading secrets through `env`: one check per section,
/// in the order a reader meets them.
pub fn resolve(
    name: &str,
    file: File,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, Error> {
    let (bind, token_env, token) = server(name, &file.server, env)?;
    let named = named_tokens(name, &file.server, token.as_ref(), env)?;
    let cluster_secret = cluster_secret(name, &file.store, &file.cluster, env)?;
    let (providers, kinds) = providers(name, &file.providers, env)?;
    let builtin_mock = file.providers.is_empty();
    let models = models(name, &file.models, &providers, &kinds, builtin_mock)?;
    let (agents, default_agent) = agents(name, &file.agents, file.default_agent.as_ref(), &models)?;
    let specs = tools(name, &file.tools)?;
    let mcp = mcp(name, &file.mcp, env)?;
    let recovery = recovery(name, &file.recovery)?;
    let (limits, passivate_after) = limits(name, &file.limits)?;
    let postgres = postgres(name, &file.store, &file.cluster, env)?;
    let (cache_mib, commit_linger) = store(name, &file.store)?;
    let telemetry = telemetry(name, &file.telemetry)?;
    Ok(Settings {
        data_dir: file
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
        bind,
        token_env,
        token,
        body_limit: file.server.body_limit_bytes,
        header_timeout: file.server.header_timeout_ms.map(Duration::from_millis),
        body_timeout: file.server.body_timeout_ms.map(Duration::from_millis),
        max_connections: file.server.max_connections,
        max_streams: file.server.max_streams,
        max_streams_per_session: file.server.max_streams_per_session,
        delta_interval: file.server.delta_interval_ms.map(Duration::from_millis),
        protect_metrics: file.server.protect_metrics.unwrap_or(false),
        protect_healthz: file.server.protect_healthz.unwrap_or(false),
        allowed_hosts: file.server.allowed_hosts.clone().unwrap_or_default(),
        tokens: named,
        tokens_file: file.server.tokens_file.clone(),
        cluster_secret,
        check_on_start: file.store.check_on_start.unwrap_or(true),
        cache_mib,
        commit_linger,
        postgres,
        builtin_mock,
        providers,
        models,
        agents,
        default_agent,
        recovery,
        compaction_auto: file.compaction.auto.unwrap_or(true),
        tools: specs,
        mcp,
        limits,
        passivate_after,
        telemetry,
    })
}

/// What a section's check answers with: the error naming the file and the key.
fn invalid_in(file: &str) -> impl Fn(&str, String) -> Error + '_ {
    move |key, reason| Error::Invalid {
        file: file.to_owned(),
        key: key.to_owned(),
        reason,
    }
}

/// `[server]`: the address, the token and the request bounds.
fn server(
    name: &str,
    server: &Server,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(SocketAddr, String, Option<Token>), Error> {
    let invalid = invalid_in(name);
    let bind_text = server.bind.as_deref().unwrap_or(DEFAULT_BIND);
    let bind = parse_bind(bind_text).map_err(|reason| invalid("server.bind", reason))?;
    let (token_env, explicit) = match &server.token_env {
        Some(var) => (var.clone(), true),
        None => (DEFAULT_TOKEN_ENV.to_owned(), false),
    };
    let token = env(&token_env).and_then(Token::new);
    if explicit && token.is_none() {
        return Err(invalid(
            "server.token_env",
            format!("environment variable {token_env} is not set (or empty)"),
        ));
    }
    for (key, zero) in [
        (
            "server.body_limit_bytes",
            server.body_limit_bytes == Some(0),
        ),
        (
            "server.header_timeout_ms",
            server.header_timeout_ms == Some(0),
        ),
        ("server.body_timeout_ms", server.body_timeout_ms == Some(0)),
        ("server.max_connections", server.max_connections == Some(0)),
    ] {
        if zero {
            return Err(invalid(key, "must be at least 1".into()));
        }
    }

    for host in server.allowed_hosts.iter().flatten() {
        let name = host.strip_prefix("*.").unwrap_or(host);
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(invalid(
                "server.allowed_hosts",
                format!(
                    "{host:?} is not a host name (a name like agents.example.com, or *.example.com \
                     for the names under it; no port, no scheme)"
                ),
            ));
        }
    }
    Ok((bind, token_env, token))
}

/// `[server.tokens.NAME]` from the environment, and a first read of `[server] tokens_file`
/// (so that a broken file stops the start).
fn named_tokens(
    name: &str,
    server: &Server,
    single: Option<&Token>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<NamedToken>, Error> {
    let invalid = invalid_in(name);
    let mut list = Vec::new();
    for (token_name, section) in &server.tokens {
        let key = format!("server.tokens.{token_name}");
        if !valid_token_name(token_name) {
            return Err(invalid(
                &key,
                "a name is 1 to 64 letters, digits, `-`, `_`, `.` or `@`".into(),
            ));
        }
        let role = role(&section.role).map_err(|r| invalid(&format!("{key}.role"), r))?;
        let token = env(&section.token_env)
            .and_then(Token::new)
            .ok_or_else(|| {
                invalid(
                    &format!("{key}.token_env"),
                    format!(
                        "environment variable {} is not set (or empty)",
                        section.token_env
                    ),
                )
            })?;
        list.push(NamedToken {
            name: token_name.clone(),
            role,
            token,
        });
    }
    unique(list.iter()).map_err(|e| invalid("server.tokens", e))?;
    if let Some(single) = single
        && list.iter().any(|t| &t.token == single)
    {
        return Err(invalid(
            "server.tokens",
            "a named token is the same as the [server] token_env token".into(),
        ));
    }
    if let Some(path) = &server.tokens_file {
        read_tokens_file(path, &list).map_err(|e| invalid("server.tokens_file", e))?;
    }
    Ok(list)
}

/// `[cluster] secret_env`: the cluster's shared secret, for the PostgreSQL store. Named
/// explicitly, it must be set; the default variable may be unset (the node then neither
/// forwards nor accepts forwarded requests).
fn cluster_secret(
    name: &str,
    store: &StoreSection,
    cluster: &Cluster,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ClusterSecret>, Error> {
    let invalid = invalid_in(name);
    if store.kind != Some(StoreKind::Postgres) {
        if cluster.secret_env.is_some() {
            return Err(invalid(
                "cluster.secret_env",
                "applies only to the PostgreSQL store: set [store] kind = \"postgres\"".into(),
            ));
        }
        return Ok(None);
    }
    let var = cluster
        .secret_env
        .as_deref()
        .unwrap_or(DEFAULT_CLUSTER_SECRET_ENV);
    match env(var).filter(|v| !v.trim().is_empty()) {
        None if cluster.secret_env.is_some() => Err(invalid(
            "cluster.secret_env",
            format!("environment variable {var} is not set (or empty)"),
        )),
        None => Ok(None),
        Some(secret) => ClusterSecret::new(&secret).map(Some).ok_or_else(|| {
            invalid(
                "cluster.secret_env",
                format!(
                    "the secret in {var} is shorter than {} bytes",
                    ClusterSecret::MIN_LEN
                ),
            )
        }),
    }
}

/// The environment variable holding the cluster's secret unless `[cluster] secret_env` names
/// another.
pub const DEFAULT_CLUSTER_SECRET_ENV: &str = "AGENTHOST_CLUSTER_SECRET";

/// Built providers by name.
type Providers = BTreeMap<String, Arc<dyn llm::Provider>>;

/// `[providers.NAME]`, built, with their kinds; the built-in mock alone when none is configured.
fn providers(
    name: &str,
    file: &BTreeMap<String, Provider>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Providers, BTreeMap<String, llm::Kind>), Error> {
    let invalid = invalid_in(name);
    let builtin_mock = file.is_empty();
    let mut providers: Providers = BTreeMap::new();
    if builtin_mock {
        providers.insert(
            "mock".into(),
            Arc::new(llm::Mock::new(llm::mock::Config::default())),
        );
    }
    let mut kinds = BTreeMap::new();
    for (pname, p) in file {
        let key = |field: &str| format!("providers.{pname}.{field}");
        check_name(pname).map_err(|reason| invalid(&format!("providers.{pname}"), reason))?;
        let mut config = llm::Config::new(p.kind);
        if let Some(url) = &p.base_url {
            check_url(url).map_err(|reason| invalid(&key("base_url"), reason))?;
            config.base_url = Some(url.clone());
        }
        if let Some(var) = &p.api_key_env {
            let secret = env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                invalid(
                    &key("api_key_env"),
                    format!("environment variable {var} is not set (or empty)"),
                )
            })?;
            config.api_key = Some(llm::ApiKey::new(secret));
        }
        if let Some(ms) = p.idle_timeout_ms {
            if ms == 0 {
                return Err(invalid(
                    &key("idle_timeout_ms"),
                    "must be at least 1".into(),
                ));
            }
            config.idle_timeout = Duration::from_millis(ms);
        }
        if let Some(h2) = p.http2_prior_knowledge {
            config.http2_prior_knowledge = h2;
        }
        if let Some(n) = p.streams_per_connection {
            if n == 0 {
                return Err(invalid(
                    &key("streams_per_connection"),
                    "must be at least 1".into(),
                ));
            }
            config.streams_per_connection = usize::try_from(n).unwrap_or(usize::MAX);
        }
        let mock_keys = [
            ("latency_ms", p.latency_ms.is_some()),
            ("tokens_per_sec", p.tokens_per_sec.is_some()),
            ("tool_ratio", p.tool_ratio.is_some()),
            ("reply_tokens", p.reply_tokens.is_some()),
        ];
        if p.kind != llm::Kind::Mock {
            if let Some((field, _)) = mock_keys.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    &key(field),
                    "only applies to kind = \"mock\"".into(),
                ));
            }
        } else {
            let remote_keys = [
                ("base_url", p.base_url.is_some()),
                ("api_key_env", p.api_key_env.is_some()),
                ("http2_prior_knowledge", p.http2_prior_knowledge.is_some()),
                ("streams_per_connection", p.streams_per_connection.is_some()),
            ];
            if let Some((field, _)) = remote_keys.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    &key(field),
                    "does not apply to kind = \"mock\" (it runs in-process)".into(),
                ));
            }
            if let Some(ms) = p.latency_ms {
                config.mock.latency = Duration::from_millis(ms);
            }
            if let Some(rate) = p.tokens_per_sec {
                if !(rate.is_finite() && rate >= 0.0) {
                    return Err(invalid(&key("tokens_per_sec"), "must be 0 or more".into()));
                }
                config.mock.tokens_per_second = rate;
            }
            if let Some(ratio) = p.tool_ratio {
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(invalid(
                        &key("tool_ratio"),
                        "must be between 0 and 1".into(),
                    ));
                }
                config.mock.tool_call_ratio = ratio;
            }
            if let Some(tokens) = p.reply_tokens {
                config.mock.reply_tokens = tokens;
            }
        }
        let built = config
            .build()
            .map_err(|e| invalid(&format!("providers.{pname}"), e.to_string()))?;
        providers.insert(pname.clone(), built);
        kinds.insert(pname.clone(), p.kind);
    }

    Ok((providers, kinds))
}

/// `[models.NAME]`, each on a configured provider.
fn models(
    name: &str,
    file: &BTreeMap<String, Model>,
    providers: &Providers,
    kinds: &BTreeMap<String, llm::Kind>,
    builtin_mock: bool,
) -> Result<BTreeMap<String, actors::Model>, Error> {
    let invalid = invalid_in(name);
    let mut models = BTreeMap::new();
    let only_provider = (providers.len() == 1)
        .then(|| providers.keys().next().cloned())
        .flatten();
    if file.is_empty() {
        if builtin_mock {
            models.insert("default".to_owned(), actors::Model::new("mock", "mock-1"));
        } else {
            return Err(invalid(
                "models",
                "define at least one [models.NAME] to use the configured providers".into(),
            ));
        }
    }
    for (mname, m) in file {
        let key = |field: &str| format!("models.{mname}.{field}");
        check_name(mname).map_err(|reason| invalid(&format!("models.{mname}"), reason))?;
        let provider = match (&m.provider, &only_provider) {
            (Some(p), _) => p.clone(),
            (None, Some(only)) => only.clone(),
            (None, None) => {
                return Err(invalid(
                    &key("provider"),
                    "required when several providers are configured".into(),
                ));
            }
        };
        if !providers.contains_key(&provider) {
            return Err(invalid(
                &key("provider"),
                format!(
                    "unknown provider {provider:?} (configured: {})",
                    list(providers.keys())
                ),
            ));
        }
        let is_mock = builtin_mock || kinds.get(&provider) == Some(&llm::Kind::Mock);
        let model_name = match (&m.model, is_mock) {
            (Some(name), _) if name.trim().is_empty() => {
                return Err(invalid(&key("model"), "must not be empty".into()));
            }
            (Some(name), _) => name.clone(),
            (None, true) => "mock-1".to_owned(),
            (None, false) => {
                return Err(invalid(
                    &key("model"),
                    "required: the provider's name of the model".into(),
                ));
            }
        };
        let mut model = actors::Model::new(provider, model_name);
        if let Some(supported) = m.tool_choice_none {
            model.tool_choice_none = supported;
        }
        if let Some(window) = m.context_window {
            if window == 0 {
                return Err(invalid(&key("context_window"), "must be at least 1".into()));
            }
            model.context_window = window;
        }
        if let Some(max) = m.max_output {
            if max == 0 {
                return Err(invalid(&key("max_output"), "must be at least 1".into()));
            }
            model.max_output = Some(max);
        }
        if model
            .max_output
            .is_some_and(|max| max > model.context_window)
        {
            return Err(invalid(
                &key("max_output"),
                format!(
                    "{} is larger than context_window {}",
                    model.max_output.unwrap_or_default(),
                    model.context_window
                ),
            ));
        }
        let per_token = |field: &str, usd: Option<f64>| -> Result<u64, Error> {
            match usd {
                None => Ok(0),
                // Dollars per million tokens are nano-dollars per thousandth of a token:
                // $1 / 1e6 tokens = 1e9 n$ / 1e6 tokens = 1000 n$ per token.
                Some(v) if v.is_finite() && v >= 0.0 => Ok((v * 1000.0).round() as u64),
                Some(_) => Err(invalid(
                    &key(&format!("price.{field}")),
                    "must be 0 or more".into(),
                )),
            }
        };
        model.price = actors::Price {
            input: per_token("input", m.price.input)?,
            output: per_token("output", m.price.output)?,
            cache_read: per_token("cache_read", m.price.cache_read)?,
            cache_write: per_token("cache_write", m.price.cache_write)?,
        };
        models.insert(mname.clone(), model);
    }

    Ok(models)
}

/// `[agents.NAME]`, each on a configured model, and `default_agent`.
fn agents(
    name: &str,
    file: &BTreeMap<String, Agent>,
    default_agent: Option<&String>,
    models: &BTreeMap<String, actors::Model>,
) -> Result<(BTreeMap<String, actors::Agent>, String), Error> {
    let invalid = invalid_in(name);
    let only_model = (models.len() == 1)
        .then(|| models.keys().next().cloned())
        .flatten();
    let mut agents = BTreeMap::new();
    if file.is_empty() {
        let model = if models.contains_key("default") {
            "default".to_owned()
        } else if let Some(only) = &only_model {
            only.clone()
        } else {
            return Err(invalid(
                "agents",
                "with several models and none named \"default\", define [agents.default] \
                 and choose its model"
                    .into(),
            ));
        };
        agents.insert(
            "default".to_owned(),
            actors::Agent {
                model,
                ..actors::Agent::default()
            },
        );
    }
    for (aname, a) in file {
        let key = |field: &str| format!("agents.{aname}.{field}");
        check_name(aname).map_err(|reason| invalid(&format!("agents.{aname}"), reason))?;
        let model = match (&a.model, &only_model) {
            (Some(m), _) => m.clone(),
            (None, _) if models.contains_key("default") => "default".to_owned(),
            (None, Some(only)) => only.clone(),
            (None, None) => {
                return Err(invalid(
                    &key("model"),
                    "required: no model is named \"default\"".into(),
                ));
            }
        };
        if !models.contains_key(&model) {
            return Err(invalid(
                &key("model"),
                format!(
                    "unknown model {model:?} (configured: {})",
                    list(models.keys())
                ),
            ));
        }
        let mut agent = actors::Agent {
            model,
            ..actors::Agent::default()
        };
        if let Some(system) = &a.system {
            agent.system = system.clone();
        }
        if let Some(steps) = a.steps {
            if steps == 0 {
                return Err(invalid(&key("steps"), "must be at least 1".into()));
            }
            agent.steps = steps;
        }
        if let Some(patterns) = &a.tools {
            check_patterns(&invalid, &key("tools"), patterns)?;
            agent.tools = patterns.clone();
        }
        if let Some(patterns) = &a.ask {
            check_patterns(&invalid, &key("ask"), patterns)?;
            agent.ask = patterns.clone();
        }
        let denied = || format!("the policy of agent {aname:?} denies it");
        agent.permission = match &a.permission {
            None => Vec::new(),
            Some(Rules::All(value)) => vec![(
                "*".to_owned(),
                decision(value, denied).map_err(|reason| invalid(&key("permission"), reason))?,
            )],
            Some(Rules::Each(rules)) => {
                let mut out = Vec::with_capacity(rules.len());
                for (pattern, value) in rules {
                    let at = key(&format!("permission.{pattern:?}"));
                    if pattern.starts_with('!') {
                        return Err(invalid(
                            &at,
                            "a rule's pattern is not negated: give it the decision instead".into(),
                        ));
                    }
                    check_patterns(&invalid, &at, std::slice::from_ref(pattern))?;
                    let rule = decision(value, denied).map_err(|reason| invalid(&at, reason))?;
                    out.push((pattern.clone(), rule));
                }
                out
            }
        };
        if let Some(ttl) = a.approval_ttl_ms {
            // Up to a year: an approval that may wait longer is one nobody will decide.
            if !(1..=365 * 24 * 3_600_000).contains(&ttl) {
                return Err(invalid(
                    &key("approval_ttl_ms"),
                    "must be between 1 and 31536000000 (a year)".into(),
                ));
            }
            agent.approval_ttl = Duration::from_millis(ttl);
        }
        if let Some(mode) = &a.on_new_input {
            agent.on_new_input = match mode.as_str() {
                "keep" => actors::OnNewInput::Keep,
                "deny" => actors::OnNewInput::Deny,
                other => {
                    return Err(invalid(
                        &key("on_new_input"),
                        format!("unknown value {other:?}; expected \"keep\" or \"deny\""),
                    ));
                }
            };
        }
        if let Some(budget) = &a.budget {
            agent.budget = agenthost_model::Budget::try_from(budget)
                .map_err(|reason| invalid(&key("budget"), reason))?;
        }
        if let Some(t) = a.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(invalid(
                    &key("temperature"),
                    "must be between 0 and 2".into(),
                ));
            }
            agent.temperature = Some(t);
        }
        agents.insert(aname.clone(), agent);
    }
    let default_agent = match default_agent {
        Some(a) if agents.contains_key(a) => a.clone(),
        Some(a) => {
            return Err(invalid(
                "default_agent",
                format!("unknown agent {a:?} (configured: {})", list(agents.keys())),
            ));
        }
        None if agents.contains_key("default") => "default".to_owned(),
        None if agents.len() == 1 => agents.keys().next().cloned().unwrap_or_default(),
        None => {
            return Err(invalid(
                "default_agent",
                "required when several agents exist and none is named \"default\"".into(),
            ));
        }
    };

    Ok((agents, default_agent))
}

/// Tool name patterns (`tools`, `ask`): a name, `*`, or a name with one `*`, optionally negated.
fn check_patterns(
    invalid: &impl Fn(&str, String) -> Error,
    key: &str,
    patterns: &[String],
) -> Result<(), Error> {
    for pattern in patterns {
        let glob = pattern.strip_prefix('!').unwrap_or(pattern);
        if glob.is_empty() || glob.matches('*').count() > 1 {
            return Err(invalid(
                key,
                format!(
                    "pattern {pattern:?} must be a name, `*`, or a name with one `*`, \
                     optionally negated with `!`"
                ),
            ));
        }
    }
    Ok(())
}

/// `[mcp.NAME]`: each server exactly one of `command` and `url`, its secrets read from the
/// environment variables it names (each must be set), its patterns checked.
fn mcp(
    name: &str,
    servers: &BTreeMap<String, McpServer>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<agenthost_mcp::ServerConfig>, Error> {
    let invalid = invalid_in(name);
    let mut out = Vec::new();
    for (server, s) in servers {
        let key = |field: &str| format!("mcp.{server}.{field}");
        let valid_name = !server.is_empty()
            && server.len() <= 32
            && server
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(invalid(
                &format!("mcp.{server}"),
                "a server's name is 1 to 32 characters of a-z, A-Z, 0-9, `_` and `-` (its \
                 tools are named `<server>_<tool>`)"
                    .into(),
            ));
        }
        let from_env = |field: &str, vars: &BTreeMap<String, String>| {
            vars.iter()
                .map(|(k, var)| {
                    let value = env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                        invalid(
                            &key(field),
                            format!("{k}: environment variable {var} is not set"),
                        )
                    })?;
                    Ok((k.clone(), value))
                })
                .collect::<Result<BTreeMap<_, _>, Error>>()
        };
        let transport = match (&s.command, &s.url) {
            (Some(command), None) => {
                if command.is_empty() || command[0].is_empty() {
                    return Err(invalid(&key("command"), "must name a program".into()));
                }
                if !s.headers.is_empty() || !s.headers_from.is_empty() {
                    return Err(invalid(
                        &key("headers"),
                        "headers are for a `url` server".into(),
                    ));
                }
                let mut vars = s.env.clone();
                vars.extend(from_env("env_from", &s.env_from)?);
                agenthost_mcp::Transport::Stdio {
                    command: command.clone(),
                    env: vars,
                    cwd: s.cwd.clone(),
                }
            }
            (None, Some(url)) => {
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| invalid(&key("url"), format!("{url:?}: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(invalid(&key("url"), "must be http:// or https://".into()));
                }
                if !s.env.is_empty() || !s.env_from.is_empty() || s.cwd.is_some() {
                    return Err(invalid(
                        &key("env"),
                        "env, env_from and cwd are for a `command` server".into(),
                    ));
                }
                let mut headers = s.headers.clone();
                headers.extend(from_env("headers_from", &s.headers_from)?);
                agenthost_mcp::Transport::Http {
                    url: url.clone(),
                    headers,
                }
            }
            _ => {
                return Err(invalid(
                    &format!("mcp.{server}"),
                    "give exactly one of `command` (a stdio server) and `url` (a \
                     streamable-HTTP server)"
                        .into(),
                ));
            }
        };
        let call_timeout = match s.call_timeout_ms {
            None => agenthost_mcp::DEFAULT_CALL_TIMEOUT,
            Some(ms) if (1..=86_400_000).contains(&ms) => Duration::from_millis(ms),
            Some(_) => {
                return Err(invalid(
                    &key("call_timeout_ms"),
                    "must be between 1 and 86400000 (a day)".into(),
                ));
            }
        };
        check_patterns(&invalid, &key("idempotent"), &s.idempotent)?;
        out.push(agenthost_mcp::ServerConfig {
            name: server.clone(),
            transport,
            trusted: s.trusted,
            call_timeout,
            idempotent: s.idempotent.clone(),
        });
    }
    Ok(out)
}

/// `[[tools]]`: HTTP tools, each built once so that one that cannot be built is an error here.
fn tools(name: &str, file: &[Tool]) -> Result<Vec<tools::Spec>, Error> {
    let invalid = invalid_in(name);
    let mut specs: Vec<tools::Spec> = Vec::new();
    for (n, t) in file.iter().enumerate() {
        let key = |field: &str| format!("tools[{n}].{field}");
        let ToolKind::Http = t.kind;
        check_name(&t.name).map_err(|reason| invalid(&key("name"), reason))?;
        if specs.iter().any(|s| s.name == t.name) {
            return Err(invalid(
                &key("name"),
                format!("tool {:?} is declared twice", t.name),
            ));
        }
        check_url(&t.url).map_err(|reason| invalid(&key("url"), reason))?;
        let parameters = t
            .parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        if parameters.get("type").and_then(|v| v.as_str()) != Some("object") {
            return Err(invalid(
                &key("parameters"),
                "must be a JSON schema of type \"object\"".into(),
            ));
        }
        let timeout = match t.timeout_ms {
            Some(0) => return Err(invalid(&key("timeout_ms"), "must be at least 1".into())),
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(120),
        };
        let permission = match &t.permission {
            None => actors::Permission::Allow,
            Some(value) => decision(value, || {
                format!("the configuration of tool {:?} denies it", t.name)
            })
            .map_err(|reason| invalid(&key("permission"), reason))?,
        };
        let spec = tools::Spec {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters,
            url: t.url.clone(),
            idempotent: t.idempotent,
            timeout,
            permission,
        };
        // Build once here so that a tool that cannot be built is a configuration error.
        spec.build()
            .map_err(|e| invalid(&key("url"), e.to_string()))?;
        specs.push(spec);
    }

    Ok(specs)
}

/// `[recovery]`.
fn recovery(name: &str, file: &Recovery) -> Result<actors::Recovery, Error> {
    let invalid = invalid_in(name);
    let mut recovery = actors::Recovery::default();
    if let Some(mode) = file.mode {
        recovery.mode = match mode {
            RecoveryMode::Resume => actors::RecoveryMode::Resume,
            RecoveryMode::Pause => actors::RecoveryMode::Pause,
            RecoveryMode::Off => actors::RecoveryMode::Off,
        };
    }
    if let Some(max) = file.max_attempts {
        if max == 0 {
            return Err(invalid(
                "recovery.max_attempts",
                "must be at least 1".into(),
            ));
        }
        recovery.max_attempts = max;
    }
    if let Some(c) = file.concurrency {
        if c == 0 {
            return Err(invalid("recovery.concurrency", "must be at least 1".into()));
        }
        recovery.concurrency = c;
    }

    Ok(recovery)
}

/// `[store]` of the embedded store: its page cache and its commit linger.
fn store(name: &str, file: &StoreSection) -> Result<(usize, Duration), Error> {
    let invalid = invalid_in(name);
    let cache_mib = file.cache_mib.unwrap_or(DEFAULT_CACHE_MIB);
    if !(1..=1 << 20).contains(&cache_mib) {
        return Err(invalid(
            "store.cache_mib",
            "must be between 1 and 1048576".into(),
        ));
    }
    let commit_linger = match file.commit_linger_us {
        None => agenthost_store::DEFAULT_LINGER,
        Some(us) if us <= MAX_COMMIT_LINGER_US => Duration::from_micros(us),
        Some(_) => {
            return Err(invalid(
                "store.commit_linger_us",
                format!("must be between 0 and {MAX_COMMIT_LINGER_US}"),
            ));
        }
    };
    Ok((cache_mib, commit_linger))
}

/// `[telemetry]`: where traces are exported, if anywhere.
fn telemetry(
    name: &str,
    file: &TelemetrySection,
) -> Result<Option<crate::telemetry::Telemetry>, Error> {
    let invalid = invalid_in(name);
    let telemetry = match (&file.otlp_endpoint, &file.service_name) {
        (Some(endpoint), service) => {
            check_url(endpoint).map_err(|reason| invalid("telemetry.otlp_endpoint", reason))?;
            if cfg!(not(feature = "otlp")) {
                return Err(invalid(
                    "telemetry.otlp_endpoint",
                    "this agenthost was built without the otlp feature".into(),
                ));
            }
            let service_name = service.clone().unwrap_or_else(|| "agenthost".to_owned());
            if service_name.trim().is_empty() {
                return Err(invalid(
                    "telemetry.service_name",
                    "must not be empty".into(),
                ));
            }
            Some(crate::telemetry::Telemetry {
                otlp_endpoint: endpoint.clone(),
                service_name,
            })
        }
        (None, Some(_)) => {
            return Err(invalid(
                "telemetry.service_name",
                "needs telemetry.otlp_endpoint (nothing is exported without it)".into(),
            ));
        }
        (None, None) => None,
    };

    Ok(telemetry)
}

/// The PostgreSQL store from `[store]` and `[cluster]`, when `kind = "postgres"`. The URL comes
/// from the environment (never the file); `[cluster]` keys without `kind = "postgres"` are an
/// error, not silently ignored.
fn postgres(
    name: &str,
    store: &StoreSection,
    cluster: &Cluster,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<agenthost_store::PgConfig>, Error> {
    let invalid = |key: &str, reason: String| Error::Invalid {
        file: name.to_owned(),
        key: key.to_owned(),
        reason,
    };
    if store.kind != Some(StoreKind::Postgres) {
        let stray = [
            ("store.url_env", store.url_env.is_some()),
            ("store.schema", store.schema.is_some()),
            ("cluster.node_id", cluster.node_id.is_some()),
            ("cluster.advertise_url", cluster.advertise_url.is_some()),
            ("cluster.partitions", cluster.partitions.is_some()),
            ("cluster.lease_ttl_ms", cluster.lease_ttl_ms.is_some()),
        ];
        if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(invalid(
                key,
                "applies only to the PostgreSQL store: set [store] kind = \"postgres\"".into(),
            ));
        }
        return Ok(None);
    }
    if store.cache_mib.is_some() {
        return Err(invalid(
            "store.cache_mib",
            "applies only to the embedded store (redb); PostgreSQL caches on its own".into(),
        ));
    }
    if store.commit_linger_us.is_some() {
        return Err(invalid(
            "store.commit_linger_us",
            "applies only to the embedded store (redb)".into(),
        ));
    }
    let url_env = store.url_env.as_deref().unwrap_or(DEFAULT_PG_URL_ENV);
    let url = env(url_env).filter(|v| !v.is_empty()).ok_or_else(|| {
        invalid(
            "store.url_env",
            format!("environment variable {url_env} is not set (or empty): it must hold the PostgreSQL URL"),
        )
    })?;
    let mut pg = agenthost_store::PgConfig::new(url);
    if let Some(schema) = &store.schema {
        pg.schema = schema.clone();
    }
    if let Some(url) = &cluster.advertise_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "cluster.advertise_url",
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
        pg.advertise_url = url.trim_end_matches('/').to_owned();
    } else {
        pg.advertise_url = String::new();
    }
    pg.node_id = match &cluster.node_id {
        Some(id) if !id.trim().is_empty() => id.clone(),
        Some(_) => return Err(invalid("cluster.node_id", "must not be empty".into())),
        None => String::new(),
    };
    if let Some(p) = cluster.partitions {
        if p == 0 || p > 65_536 {
            return Err(invalid(
                "cluster.partitions",
                "must be between 1 and 65536".into(),
            ));
        }
        pg.partitions = p;
    }
    if let Some(ms) = cluster.lease_ttl_ms {
        if ms < 300 {
            return Err(invalid(
                "cluster.lease_ttl_ms",
                "must be at least 300 (renewed every third of it)".into(),
            ));
        }
        pg.lease_ttl = Duration::from_millis(ms);
    }
    Ok(Some(pg))
}

/// How `config check` shows a permission: its configured word.
fn permission_name(permission: &actors::Permission) -> &'static str {
    match permission {
        actors::Permission::Allow => "allow",
        actors::Permission::Ask => "ask",
        actors::Permission::Deny(_) => "deny",
    }
}

/// The effective configuration `settings` (resolved from `file`, named `name`) describe, as
/// JSON, for `agenthost config check`. Secrets never appear: a token, an API key or a database
/// URL shows only the variable it comes from and whether it is set.
pub fn effective(name: &str, file: &File, settings: &Settings) -> serde_json::Value {
    use serde_json::json;
    let secret = |var: &str, set: bool| json!({"from_env": var, "set": set, "value": if set { "<redacted>" } else { "" }});
    let ms = |d: Duration| d.as_millis() as u64;
    let providers: serde_json::Map<String, serde_json::Value> = if settings.builtin_mock {
        [("mock".to_owned(), json!({"kind": "mock", "builtin": true}))]
            .into_iter()
            .collect()
    } else {
        file.providers
            .iter()
            .map(|(name, p)| {
                let key = p
                    .api_key_env
                    .as_deref()
                    .map(|var| secret(var, std::env::var(var).is_ok_and(|v| !v.is_empty())));
                let value = json!({
                    "kind": format!("{:?}", p.kind).to_lowercase(),
                    "base_url": p.base_url,
                    "api_key": key,
                    "idle_timeout_ms": p.idle_timeout_ms,
                    "http2_prior_knowledge": p.http2_prior_knowledge,
                    "streams_per_connection": p.streams_per_connection,
                });
                (name.clone(), value)
            })
            .collect()
    };
    let models: serde_json::Map<String, serde_json::Value> = settings
        .models
        .iter()
        .map(|(name, m)| {
            let value = json!({
                "provider": m.provider,
                "model": m.model,
                "context_window": m.context_window,
                "max_output": m.max_output,
                "tool_choice_none": m.tool_choice_none,
                "price": {"input": m.price.input, "output": m.price.output,
                          "cache_read": m.price.cache_read, "cache_write": m.price.cache_write},
            });
            (name.clone(), value)
        })
        .collect();
    let agents: serde_json::Map<String, serde_json::Value> = settings
        .agents
        .iter()
        .map(|(name, a)| {
            let value = json!({
                "model": a.model,
                "system": a.system,
                "steps": a.steps,
                "tools": a.tools,
                "ask": a.ask,
                "permission": a
                    .permission
                    .iter()
                    .map(|(pattern, rule)| json!([pattern, permission_name(rule)]))
                    .collect::<Vec<_>>(),
                "approval_ttl_ms": a.approval_ttl.as_millis() as u64,
                "on_new_input": match a.on_new_input {
                    actors::OnNewInput::Keep => "keep",
                    actors::OnNewInput::Deny => "deny",
                },
                "temperature": a.temperature,
                "budget": agenthost_api::wire::Budget::from(&a.budget),
            });
            (name.clone(), value)
        })
        .collect();
    let store = match &settings.postgres {
        None => json!({
            "kind": "redb",
            "path": crate::store_path(&settings.data_dir),
            "check_on_start": settings.check_on_start,
            "cache_mib": settings.cache_mib,
            "commit_linger_us": settings.commit_linger.as_micros() as u64,
        }),
        Some(pg) => {
            let url_env = file.store.url_env.as_deref().unwrap_or(DEFAULT_PG_URL_ENV);
            json!({
                "kind": "postgres",
                "url": secret(url_env, true),
                "schema": pg.schema,
                "node_id": if pg.node_id.is_empty() { "(the listen address)" } else { &pg.node_id },
                "advertise_url": if pg.advertise_url.is_empty() { "(http:// and the listen address)" } else { &pg.advertise_url },
                "partitions": pg.partitions,
                "lease_ttl_ms": ms(pg.lease_ttl),
                "secret": secret(
                    file.cluster.secret_env.as_deref().unwrap_or(DEFAULT_CLUSTER_SECRET_ENV),
                    settings.cluster_secret.is_some(),
                ),
            })
        }
    };
    let l = &settings.limits;
    let server = agenthost_server::Options::default();
    json!({
        "file": name,
        "data_dir": settings.data_dir,
        "server": {
            "bind": settings.bind.to_string(),
            "token": secret(&settings.token_env, settings.token.is_some()),
            "body_limit_bytes": settings.body_limit.unwrap_or(server.body_limit),
            "header_timeout_ms": ms(settings.header_timeout.unwrap_or(server.header_timeout)),
            "body_timeout_ms": ms(settings.body_timeout.unwrap_or(server.body_timeout)),
            "max_connections": settings.max_connections.unwrap_or(server.max_connections),
            "max_streams": settings.max_streams.unwrap_or(server.max_streams),
            "max_streams_per_session": settings
                .max_streams_per_session
                .unwrap_or(server.max_streams_per_session),
            "delta_interval_ms": ms(settings.delta_interval.unwrap_or(server.delta_interval)),
            "protect_metrics": settings.protect_metrics,
            "protect_healthz": settings.protect_healthz,
            "allowed_hosts": settings.allowed_hosts,
            "tokens": file.server.tokens.iter().map(|(name, t)| json!({
                "name": name,
                "role": t.role,
                "token": secret(&t.token_env, true),
            })).collect::<Vec<_>>(),
            "tokens_file": settings.tokens_file,
        },
        "store": store,
        "telemetry": settings.telemetry.as_ref().map(|t| json!({
            "otlp_endpoint": t.otlp_endpoint,
            "service_name": t.service_name,
        })),
        "providers": providers,
        "models": models,
        "agents": agents,
        "default_agent": settings.default_agent,
        "tools": settings.tools.iter().map(|t| json!({
            "name": t.name,
            "url": t.url,
            "idempotent": t.idempotent,
            "permission": permission_name(&t.permission),
            "timeout_ms": ms(t.timeout),
        })).collect::<Vec<_>>(),
        // Which environment variables and headers are set, never their values.
        "mcp": settings.mcp.iter().map(|m| {
            let transport = match &m.transport {
                agenthost_mcp::Transport::Stdio { command, env, cwd } => json!({
                    "command": command,
                    "env": env.keys().collect::<Vec<_>>(),
                    "cwd": cwd,
                }),
                agenthost_mcp::Transport::Http { url, headers } => json!({
                    "url": url,
                    "headers": headers.keys().collect::<Vec<_>>(),
                }),
            };
            json!({
                "name": m.name,
                "transport": transport,
                "trusted": m.trusted,
                "call_timeout_ms": ms(m.call_timeout),
                "idempotent": m.idempotent,
            })
        }).collect::<Vec<_>>(),
        "recovery": {
            "mode": format!("{:?}", settings.recovery.mode).to_lowercase(),
            "max_attempts": settings.recovery.max_attempts,
            "concurrency": settings.recovery.concurrency,
        },
        "compaction": {"auto": settings.compaction_auto},
        "limits": {
            "concurrent_streams": l.concurrent_streams,
            "concurrent_drains": l.concurrent_drains,
            "live_sessions": l.live_sessions,
            "pending_per_session": l.pending_per_session,
            "waiters_per_session": l.waiters_per_session,
            "schedules_per_session": l.schedules_per_session,
            "schedule_grace_ms": ms(l.schedule_grace),
            "tool_output_bytes": l.tool_output,
            "history_cache_bytes": l.history_cache,
            "call_timeout_ms": ms(l.call_timeout),
            "shutdown_timeout_ms": ms(l.shutdown_timeout),
            "wake_sweep_ms": ms(l.wake_sweep),
            "passivate_after_ms": ms(settings
                .passivate_after
                .unwrap_or(actors::Config::new("").passivate_after)),
        },
    })
}

/// The runtime's limits from `[limits]`: counts and sizes must be at least 1, except
/// `history_cache_bytes` (0 turns the cache off) and `wake_sweep_ms` (0 turns the sweep off).
fn limits(name: &str, file: &Limits) -> Result<(actors::Limits, Option<Duration>), Error> {
    let mut limits = actors::Limits::default();
    let positive = |key: &str, value: u64| match value {
        0 => Err(Error::Invalid {
            file: name.to_owned(),
            key: format!("limits.{key}"),
            reason: "must be at least 1".into(),
        }),
        _ => Ok(value),
    };
    if let Some(n) = file.concurrent_streams {
        limits.concurrent_streams = positive("concurrent_streams", n as u64)? as usize;
    }
    if let Some(n) = file.concurrent_drains {
        limits.concurrent_drains = positive("concurrent_drains", n as u64)? as usize;
    }
    if let Some(n) = file.live_sessions {
        limits.live_sessions = positive("live_sessions", n as u64)? as usize;
    }
    if let Some(n) = file.pending_per_session {
        limits.pending_per_session = positive("pending_per_session", u64::from(n))? as u32;
    }
    if let Some(n) = file.waiters_per_session {
        limits.waiters_per_session = positive("waiters_per_session", n as u64)? as usize;
    }
    if let Some(n) = file.schedules_per_session {
        limits.schedules_per_session = positive("schedules_per_session", n as u64)? as usize;
    }
    if let Some(ms) = file.schedule_grace_ms {
        limits.schedule_grace = Duration::from_millis(ms);
    }
    if let Some(n) = file.tool_output_bytes {
        limits.tool_output = positive("tool_output_bytes", n as u64)? as usize;
    }
    if let Some(n) = file.history_cache_bytes {
        limits.history_cache = n;
    }
    if let Some(ms) = file.call_timeout_ms {
        limits.call_timeout = Duration::from_millis(positive("call_timeout_ms", ms)?);
    }
    if let Some(ms) = file.shutdown_timeout_ms {
        limits.shutdown_timeout = Duration::from_millis(positive("shutdown_timeout_ms", ms)?);
    }
    if let Some(ms) = file.wake_sweep_ms {
        limits.wake_sweep = Duration::from_millis(ms);
    }
    let passivate_after = match file.passivate_after_ms {
        Some(ms) => Some(Duration::from_millis(positive("passivate_after_ms", ms)?)),
        None => None,
    };
    Ok((limits, passivate_after))
}

/// An `ip:port` address.
pub fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>().map_err(|_| {
        format!("{text:?} is not an address of the form IP:PORT (for example 127.0.0.1:4096)")
    })
}

/// Names of providers, models, agents and tools: what ids and prompts can carry safely.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {name:?} must be 1 to 64 of ASCII letters, digits, '_', '-' and '.'"
        ))
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
    let host_ok = url
        .split_once("://")
        .is_some_and(|(_, rest)| !rest.is_empty() && !rest.starts_with('/'));
    if scheme_ok && host_ok && !url.contains(char::is_whitespace) {
        Ok(())
    } else {
        Err(format!("{url:?} is not an http:// or https:// URL"))
    }
}

fn list<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    fn settings(text: &str) -> Result<Settings, Error> {
        let file = parse("test.toml", text)?;
        resolve("test.toml", file, &env(&[("KEY", "sk-1"), ("TOK", "t0k")]))
    }

    #[test]
    fn empty_file_means_the_builtin_mock() {
        let s = settings("").expect("defaults");
        assert!(s.builtin_mock);
        assert_eq!(s.bind.to_string(), DEFAULT_BIND);
        assert_eq!(s.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert!(s.token.is_none());
        assert_eq!(s.default_agent, "default");
        assert_eq!(s.models["default"].provider, "mock");
        assert!(s.compaction_auto);
        assert_eq!(s.recovery, actors::Recovery::default());
    }

    #[test]
    fn the_spec_example_resolves() {
        let text = r#"
data_dir = "/tmp/x"
[server]
bind = "127.0.0.1:4096"
token_env = "TOK"
[providers.local]
kind = "openai"
base_url = "http://127.0.0.1:8080/v1"
api_key_env = "KEY"
[models.default]
provider = "local"
model = "gpt-4o-mini"
context_window = 128000
max_output = 16384
price = { input = 0.15, output = 0.6 }
[agents.default]
model = "default"
system = "You are a helpful agent."
steps = 25
tools = ["*", "!shell"]
[[tools]]
name = "lookup"
kind = "http"
url = "http://127.0.0.1:9000/lookup"
idempotent = false
description = "Look a thing up"
parameters = { type = "object", properties = { q = { type = "string" } } }
[recovery]
mode = "pause"
max_attempts = 3
[compaction]
auto = false
"#;
        let s = settings(text).expect("valid");
        assert!(!s.builtin_mock);
        assert_eq!(s.token.as_ref().map(Token::expose), Some("t0k"));
        assert_eq!(s.models["default"].model, "gpt-4o-mini");
        assert_eq!(s.models["default"].price.input, 150);
        assert_eq!(s.models["default"].price.output, 600);
        assert_eq!(s.agents["default"].tools, ["*", "!shell"]);
        assert_eq!(s.tools[0].name, "lookup");
        assert_eq!(s.tools[0].parameters["properties"]["q"]["type"], "string");
        assert_eq!(s.recovery.mode, actors::RecoveryMode::Pause);
        assert_eq!(s.recovery.max_attempts, 3);
        assert!(!s.compaction_auto);
        let runtime = s.runtime(PathBuf::from("/tmp/x/store.redb"));
        assert!(!runtime.compaction.auto);
        assert_eq!(runtime.default_agent, "default");
    }

    /// Each bad file, and a fragment of the message it must produce.
    #[test]
    fn limits_take_units_in_their_names() {
        let s = settings(
            "[limits]\nconcurrent_streams = 3\nconcurrent_drains = 4\npending_per_session = 7\n\
             waiters_per_session = 9\nlive_sessions = 5\n\
             tool_output_bytes = 1000\nhistory_cache_bytes = 0\ncall_timeout_ms = 1500\n\
             shutdown_timeout_ms = 2500\nwake_sweep_ms = 0\npassivate_after_ms = 60000\n\
             [server]\nbody_limit_bytes = 2048\n[store]\ncommit_linger_us = 250\n",
        )
        .expect("valid");
        assert_eq!(s.limits.concurrent_streams, 3);
        assert_eq!(s.limits.concurrent_drains, 4);
        assert_eq!(s.limits.pending_per_session, 7);
        assert_eq!(s.limits.waiters_per_session, 9);
        assert_eq!(s.limits.live_sessions, 5);
        assert_eq!(s.limits.tool_output, 1000);
        assert_eq!(s.limits.history_cache, 0);
        assert_eq!(s.limits.call_timeout, Duration::from_millis(1500));
        assert_eq!(s.limits.shutdown_timeout, Duration::from_millis(2500));
        assert_eq!(s.limits.wake_sweep, Duration::ZERO);
        assert_eq!(s.passivate_after, Some(Duration::from_secs(60)));
        assert_eq!(s.body_limit, Some(2048));
        let runtime = s.runtime(PathBuf::from("x.redb"));
        assert_eq!(runtime.limits, s.limits);
        assert_eq!(runtime.passivate_after, Duration::from_secs(60));
        assert_eq!(runtime.store.max_wait, Duration::from_micros(250));
        let defaults = settings("")
            .expect("defaults")
            .runtime(PathBuf::from("x.redb"));
        assert_eq!(defaults.store.max_wait, agenthost_store::DEFAULT_LINGER);
    }

    #[test]
    fn the_postgres_store_takes_its_url_from_the_environment() {
        let file = parse(
            "test.toml",
            "[store]\nkind = \"postgres\"\nschema = \"prod\"\n[cluster]\nnode_id = \"a\"\n\
             advertise_url = \"http://10.0.0.1:4096/\"\npartitions = 8\nlease_ttl_ms = 3000",
        )
        .expect("parses");
        let s = resolve(
            "test.toml",
            file,
            &env(&[("AGENTHOST_PG_URL", "postgresql://u:secret@db/agents")]),
        )
        .expect("valid");
        let pg = s.postgres.clone().expect("postgres");
        assert_eq!(pg.url, "postgresql://u:secret@db/agents");
        assert_eq!(
            (pg.schema.as_str(), pg.node_id.as_str(), pg.partitions),
            ("prod", "a", 8)
        );
        assert_eq!(pg.advertise_url, "http://10.0.0.1:4096");
        assert_eq!(pg.lease_ttl, Duration::from_secs(3));
        assert!(
            !format!("{s:?}{pg:?}").contains("secret"),
            "the URL is never printed"
        );
        assert_eq!(s.runtime(PathBuf::from("x")).store.postgres, Some(pg));
        assert!(settings("").expect("defaults").postgres.is_none());
    }

    #[test]
    fn an_agent_asks_before_the_tools_its_patterns_name() {
        let s = settings(
            "[agents.default]\nask = [\"pay_*\", \"!pay_view\"]\napproval_ttl_ms = 60000\n\
             on_new_input = \"deny\"",
        )
        .expect("valid");
        let agent = &s.runtime(PathBuf::from("x")).agents["default"];
        assert_eq!(agent.ask, ["pay_*", "!pay_view"]);
        assert_eq!(agent.approval_ttl, Duration::from_secs(60));
        assert_eq!(agent.on_new_input, actors::OnNewInput::Deny);
        let defaults = settings("").expect("defaults");
        let agent = &defaults.runtime(PathBuf::from("x")).agents["default"];
        assert!(agent.ask.is_empty());
        assert_eq!(agent.approval_ttl, actors::DEFAULT_APPROVAL_TTL);
        assert_eq!(agent.on_new_input, actors::OnNewInput::Keep);
    }

    #[test]
    fn permission_rules_keep_the_files_order_and_tools_carry_their_own() {
        let s = settings(
            "[agents.default.permission]\n\"*\" = \"ask\"\n\"read_*\" = \"allow\"\n\
             \"delete_all\" = \"deny\"\n\"a_*\" = \"ask\"\n\
             [agents.solo]\npermission = \"deny\"\n\
             [[tools]]\nname = \"pay\"\nkind = \"http\"\nurl = \"http://127.0.0.1:9/pay\"\n\
             permission = \"ask\"",
        )
        .expect("valid");
        let runtime = s.runtime(PathBuf::from("x"));
        let denied = actors::Permission::Deny("the policy of agent \"default\" denies it".into());
        assert_eq!(
            runtime.agents["default"].permission,
            [
                ("*".to_owned(), actors::Permission::Ask),
                ("read_*".to_owned(), actors::Permission::Allow),
                ("delete_all".to_owned(), denied),
                ("a_*".to_owned(), actors::Permission::Ask),
            ],
            "in the file's order, not sorted"
        );
        assert_eq!(
            runtime.agents["solo"].permission,
            [(
                "*".to_owned(),
                actors::Permission::Deny("the policy of agent \"solo\" denies it".into())
            )]
        );
        assert_eq!(s.tools[0].permission, actors::Permission::Ask);
        let defaults = settings("").expect("defaults");
        assert!(
            defaults.runtime(PathBuf::from("x")).agents["default"]
                .permission
                .is_empty()
        );
    }

    #[test]
    fn an_agents_budget_is_read_in_dollars_and_kept_in_billionths() {
        let s = settings(
            "[agents.default]\nbudget = { max_tokens = 5000, max_cost_usd = 0.25, \
             turn_max_cost_usd = 0.01 }",
        )
        .expect("valid");
        let agent = &s.runtime(PathBuf::from("x")).agents["default"];
        assert_eq!(
            agent.budget,
            agenthost_model::Budget {
                max_tokens: Some(5000),
                max_cost_nanos: Some(250_000_000),
                turn_max_tokens: None,
                turn_max_cost_nanos: Some(10_000_000),
            }
        );
        for (text, expected) in [
            (
                "budget = { max_cost_usd = -1.0 }",
                "`agents.default.budget`",
            ),
            ("budget = { max_token = 5 }", "unknown field `max_token`"),
        ] {
            let error = settings(&format!("[agents.default]\n{text}"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn mcp_servers_take_their_secrets_from_the_environment_and_never_print_them() {
        let file = parse(
            "test.toml",
            "[mcp.files]\ncommand = [\"python3\", \"server.py\"]\nenv = { LOG = \"info\" }\n\
             env_from = { API_KEY = \"FILES_KEY\" }\ncwd = \"/srv\"\ntrusted = true\n\
             call_timeout_ms = 5000\nidempotent = [\"read_*\"]\n\
             [mcp.search]\nurl = \"https://search.example/mcp\"\n\
             headers_from = { Authorization = \"SEARCH_AUTH\" }",
        )
        .expect("parses");
        let s = resolve(
            "test.toml",
            file,
            &env(&[
                ("FILES_KEY", "k-secret"),
                ("SEARCH_AUTH", "Bearer s-secret"),
            ]),
        )
        .expect("valid");
        assert_eq!(s.mcp.len(), 2);
        let files = &s.mcp[0];
        assert_eq!((files.name.as_str(), files.trusted), ("files", true));
        assert_eq!(files.call_timeout, Duration::from_secs(5));
        assert_eq!(files.idempotent, ["read_*"]);
        match &files.transport {
            agenthost_mcp::Transport::Stdio { command, env, cwd } => {
                assert_eq!(command, &["python3", "server.py"]);
                assert_eq!(env["LOG"], "info");
                assert_eq!(env["API_KEY"], "k-secret");
                assert_eq!(cwd.as_deref(), Some(std::path::Path::new("/srv")));
            }
            other => panic!("{other:?}"),
        }
        let search = &s.mcp[1];
        assert!(!search.trusted);
        assert_eq!(search.call_timeout, agenthost_mcp::DEFAULT_CALL_TIMEOUT);
        match &search.transport {
            agenthost_mcp::Transport::Http { url, headers } => {
                assert_eq!(url, "https://search.example/mcp");
                assert_eq!(headers["Authorization"], "Bearer s-secret");
            }
            other => panic!("{other:?}"),
        }
        let shown = format!("{s:?}{:?}", s.mcp);
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn bad_files_say_where_and_why() {
        let cases: &[(&str, &str)] = &[
            ("colour = 1", "unknown field `colour`"),
            ("[limits]\nstreams = 1", "unknown field `streams`"),
            (
                "[limits]\nconcurrent_streams = 0",
                "`limits.concurrent_streams`",
            ),
            (
                "[limits]\nconcurrent_drains = 0",
                "`limits.concurrent_drains`",
            ),
            ("[limits]\nlive_sessions = 0", "`limits.live_sessions`"),
            ("[limits]\ncall_timeout_ms = 0", "`limits.call_timeout_ms`"),
            ("[server]\nbody_limit = 10", "unknown field `body_limit`"),
            ("[store]\ncache_mib = 0", "`store.cache_mib`"),
            (
                "[store]\ncommit_linger_us = 1000001",
                "`store.commit_linger_us`",
            ),
            (
                "[telemetry]\notlp_endpoint = \"localhost:4318\"",
                "`telemetry.otlp_endpoint`",
            ),
            (
                "[telemetry]\nservice_name = \"x\"",
                "`telemetry.service_name`",
            ),
            (
                "[telemetry]\nendpoint = \"http://x\"",
                "unknown field `endpoint`",
            ),
            (
                "[providers.p]\nkind = \"openai\"\nidle_timeout_secs = 5",
                "unknown field `idle_timeout_secs`",
            ),
            (
                "[providers.p]\nkind = \"openai\"\nstreams_per_connection = 0",
                "`providers.p.streams_per_connection`: must be at least 1",
            ),
            (
                "[providers.p]\nkind = \"openai\"\nhttp2_prior_knowledge = \"yes\"",
                "invalid type: string \"yes\", expected a boolean",
            ),
            (
                "[providers.m]\nkind = \"mock\"\nhttp2_prior_knowledge = true",
                "`providers.m.http2_prior_knowledge`: does not apply to kind = \"mock\"",
            ),
            ("[server]\nport = 1", "unknown field `port`"),
            ("[server]\nbind = \"localhost\"", "`server.bind`"),
            ("[server]\ntoken_env = \"MISSING\"", "MISSING is not set"),
            (
                "[server]\nallowed_hosts = [\"agents.example.com:443\"]",
                "`server.allowed_hosts`",
            ),
            (
                "[server]\nallowed_hosts = [\"http://x\"]",
                "is not a host name",
            ),
            (
                "[server.tokens.ci]\nrole = \"boss\"\ntoken_env = \"KEY\"",
                "`server.tokens.ci.role`: \"boss\" is not a role",
            ),
            (
                "[server.tokens.ci]\nrole = \"read\"\ntoken_env = \"MISSING\"",
                "`server.tokens.ci.token_env`: environment variable MISSING is not set",
            ),
            (
                "[server.tokens.\"a b\"]\nrole = \"read\"\ntoken_env = \"KEY\"",
                "`server.tokens.a b`",
            ),
            (
                "[server]\ntokens_file = \"/nonexistent/tokens.toml\"",
                "`server.tokens_file`: cannot read /nonexistent/tokens.toml",
            ),
            (
                "[cluster]\nsecret_env = \"KEY\"",
                "`cluster.secret_env`: applies only to the PostgreSQL store",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"KEY\"\n[cluster]\nsecret_env = \"MISSING\"",
                "`cluster.secret_env`: environment variable MISSING is not set",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"KEY\"\n[cluster]\nsecret_env = \"KEY\"",
                "shorter than 16 bytes",
            ),
            (
                "[store]\nkind = \"postgres\"",
                "`store.url_env`: environment variable AGENTHOST_PG_URL is not set",
            ),
            ("[store]\nkind = \"sqlite\"", "unknown variant `sqlite`"),
            (
                "[cluster]\nnode_id = \"a\"",
                "`cluster.node_id`: applies only to the PostgreSQL store",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"KEY\"\ncommit_linger_us = 0",
                "`store.commit_linger_us`: applies only to the embedded store",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"KEY\"\n[cluster]\npartitions = 0",
                "`cluster.partitions`",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"KEY\"\n[cluster]\nadvertise_url = \"x:1\"",
                "`cluster.advertise_url`",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"KEY\"\n[cluster]\nlease_ttl_ms = 10",
                "`cluster.lease_ttl_ms`",
            ),
            (
                "[providers.p]\nkind = \"gemini\"",
                "unknown variant `gemini`",
            ),
            (
                "[providers.p]\nkind = \"openai\"",
                "`models`: define at least one",
            ),
            (
                "[providers.p]\nkind = \"openai\"\napi_key_env = \"NOPE\"",
                "`providers.p.api_key_env`: environment variable NOPE is not set",
            ),
            (
                "[providers.p]\nkind = \"openai\"\nbase_url = \"ftp://x\"",
                "`providers.p.base_url`",
            ),
            (
                "[providers.p]\nkind = \"openai\"\nlatency_ms = 5",
                "`providers.p.latency_ms`: only applies to kind = \"mock\"",
            ),
            (
                "[models.m]\nprovider = \"ghost\"",
                "unknown provider \"ghost\"",
            ),
            (
                "[providers.p]\nkind = \"openai\"\n[models.m]\nprovider = \"p\"",
                "`models.m.model`: required",
            ),
            (
                "[models.default]\ncontext_window = 0",
                "`models.default.context_window`",
            ),
            (
                "[models.default]\ncontext_window = 100\nmax_output = 200",
                "larger than context_window",
            ),
            ("[models.default]\ncontext_window = \"big\"", "invalid type"),
            (
                "[agents.a]\nmodel = \"nope\"",
                "`agents.a.model`: unknown model \"nope\"",
            ),
            ("[agents.a]\nsteps = 0", "`agents.a.steps`"),
            ("[agents.a]\ntools = [\"a*b*\"]", "`agents.a.tools`"),
            ("[agents.a]\nstep = 3", "unknown field `step`"),
            ("default_agent = \"x\"", "`default_agent`: unknown agent"),
            (
                "[[tools]]\nname = \"t\"\nkind = \"grpc\"\nurl = \"http://x\"",
                "unknown variant `grpc`",
            ),
            (
                "[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"x\"",
                "`tools[0].url`",
            ),
            (
                "[[tools]]\nname = \"t\"\nkind = \"http\"",
                "missing field `url`",
            ),
            (
                "[[tools]]\nname = \"t t\"\nkind = \"http\"\nurl = \"http://x\"",
                "`tools[0].name`",
            ),
            (
                "[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"http://x\"\n[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"http://y\"",
                "declared twice",
            ),
            (
                "[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"http://x\"\nparameters = { type = \"string\" }",
                "`tools[0].parameters`",
            ),
            ("[recovery]\nmode = \"later\"", "unknown variant `later`"),
            ("[recovery]\nmax_attempts = 0", "`recovery.max_attempts`"),
            ("[agents.default]\nask = [\"a*b*\"]", "`agents.default.ask`"),
            (
                "[agents.default]\npermission = \"maybe\"",
                "`agents.default.permission`",
            ),
            (
                "[agents.default]\npermission = 3",
                "a table of tool name patterns",
            ),
            (
                "[agents.default.permission]\n\"pay\" = \"sometimes\"",
                "`agents.default.permission.\"pay\"`",
            ),
            (
                "[agents.default.permission]\n\"!pay\" = \"ask\"",
                "is not negated",
            ),
            (
                "[agents.default.permission]\n\"a*b*\" = \"ask\"",
                "`agents.default.permission.\"a*b*\"`",
            ),
            (
                "[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"http://x\"\npermission = \"never\"",
                "`tools[0].permission`",
            ),
            (
                "[agents.default]\napproval_ttl_ms = 0",
                "`agents.default.approval_ttl_ms`",
            ),
            (
                "[agents.default]\non_new_input = \"drop\"",
                "`agents.default.on_new_input`",
            ),
            ("[mcp.x]\ntrusted = true", "`mcp.x`"),
            (
                "[mcp.x]\ncommand = [\"a\"]\nurl = \"http://h/mcp\"",
                "`mcp.x`",
            ),
            ("[mcp.x]\ncommand = []", "`mcp.x.command`"),
            ("[mcp.x]\nurl = \"ftp://h/mcp\"", "`mcp.x.url`"),
            (
                "[mcp.x]\ncommand = [\"a\"]\nenv_from = { K = \"AGENTHOST_UNSET_VAR\" }",
                "`mcp.x.env_from`",
            ),
            (
                "[mcp.x]\ncommand = [\"a\"]\ncall_timeout_ms = 0",
                "`mcp.x.call_timeout_ms`",
            ),
            ("[mcp.\"a b\"]\ncommand = [\"a\"]", "`mcp.a b`"),
            (
                "[mcp.x]\ncommand = [\"a\"]\nport = 1",
                "unknown field `port`",
            ),
            ("[compaction]\nauto = \"yes\"", "invalid type"),
            ("[compaction]\nkeep = 1", "unknown field `keep`"),
            ("data_dir = ", "config file test.toml"),
        ];
        for (text, expected) in cases {
            let error = match settings(text) {
                Ok(_) => panic!("accepted:\n{text}"),
                Err(e) => e.to_string(),
            };
            assert!(
                error.contains(expected),
                "{text:?}\n  gave: {error}\n  expected: {expected}"
            );
            assert!(error.contains("test.toml"), "the file is named: {error}");
        }
    }

    /// Pieces a config file is made of, so generated files get past the TOML parser often.
    fn piece() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("[server]\n".to_owned()),
            Just("[limits]\n".to_owned()),
            Just("[providers.p]\nkind = \"openai\"\n".to_owned()),
            Just("[models.m]\n".to_owned()),
            Just("[agents.a]\n".to_owned()),
            Just("[[tools]]\nname = \"t\"\nkind = \"http\"\n".to_owned()),
            Just("[recovery]\n".to_owned()),
            Just("[compaction]\n".to_owned()),
            "[a-z_]{1,24}".prop_map(|k| format!("{k} = 1\n")),
            ("[a-z_]{1,24}", "[ -~]{0,24}").prop_map(|(k, v)| format!("{k} = {v:?}\n")),
            ("[a-z_]{1,24}", any::<i64>()).prop_map(|(k, v)| format!("{k} = {v}\n")),
            "[ -~\n]{0,40}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            if std::env::var_os("AGENTHOST_SOAK").is_some() { 20_000 } else { 256 }
        ))]

        /// Any file, valid TOML or not: a setting or an error naming the file, never a panic.
        #[test]
        fn any_config_file_is_settings_or_a_clear_error(
            pieces in proptest::collection::vec(piece(), 0..12),
        ) {
            let text: String = pieces.concat();
            if let Err(error) = settings(&text) {
                proptest::prop_assert!(error.to_string().contains("test.toml"), "{error}");
            }
        }
    }
}
