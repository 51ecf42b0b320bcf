//! Runtime configuration: where the store lives, which providers, models and agents exist, and
//! the bounds the runtime enforces. Every field has a default, so `Config::new(path)` runs a
//! session against the built-in mock provider with no other setup.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agenthost_llm as llm;

/// Everything `Runtime::start` needs.
#[derive(Clone)]
pub struct Config {
    pub store: agenthost_store::Config,
    /// Providers by name.
    pub providers: BTreeMap<String, Arc<dyn llm::Provider>>,
    /// Models by name.
    pub models: BTreeMap<String, Model>,
    /// Agents by name. A session names its agent at creation; `default_agent` otherwise.
    pub agents: BTreeMap<String, Agent>,
    pub default_agent: String,
    pub recovery: Recovery,
    pub supervision: Supervision,
    pub limits: Limits,
    /// An idle session actor stops after this long; the next message respawns it.
    pub passivate_after: Duration,
    /// Instruction sources sampled at every safe boundary.
    pub instructions: Vec<crate::instructions::Instruction>,
    pub compaction: Compaction,
}

/// Compaction of over-budget history.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// Compact automatically when the next request would not fit, and once on context overflow.
    pub auto: bool,
    /// Recent history kept verbatim, in estimated tokens.
    pub keep_tokens: u64,
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction {
            auto: true,
            keep_tokens: 8_000,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("store", &self.store)
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .field("models", &self.models)
            .field("agents", &self.agents)
            .field("default_agent", &self.default_agent)
            .field("recovery", &self.recovery)
            .field("supervision", &self.supervision)
            .field("limits", &self.limits)
            .field("passivate_after", &self.passivate_after)
            .field("instructions", &self.instructions)
            .field("compaction", &self.compaction)
            .finish()
    }
}

impl Config {
    /// A runtime storing in `store_path`, answering with the deterministic mock provider through
    /// one `default` model and one `default` agent.
    pub fn new(store_path: impl Into<PathBuf>) -> Self {
        let mock: Arc<dyn llm::Provider> = Arc::new(llm::Mock::new(llm::mock::Config::default()));
        Config {
            store: agenthost_store::Config::new(store_path),
            providers: BTreeMap::from([("mock".to_owned(), mock)]),
            models: BTreeMap::from([("default".to_owned(), Model::new("mock", "mock-1"))]),
            agents: BTreeMap::from([("default".to_owned(), Agent::default())]),
            default_agent: "default".into(),
            recovery: Recovery::default(),
            supervision: Supervision::default(),
            limits: Limits::default(),
            passivate_after: Duration::from_secs(300),
            instructions: Vec::new(),
            compaction: Compaction::default(),
        }
    }

    /// Replaces every provider with `provider`, keeping models pointed at it.
    pub fn with_provider(mut self, name: &str, provider: Arc<dyn llm::Provider>) -> Self {
        self.providers = BTreeMap::from([(name.to_owned(), provider)]);
        for model in self.models.values_mut() {
            model.provider = name.to_owned();
        }
        self
    }
}

/// A model: which provider serves it, under which name, and its limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub provider: String,
    /// The provider's model name.
    pub model: String,
    pub context_window: u32,
    pub max_output: Option<u32>,
    /// Price per million tokens in nano-dollars per token, for cost accounting.
    pub price: Price,
    /// Whether the server accepts `tool_choice: none`. The requests that must not call tools
    /// (an exchange's last step, `generate`, a compaction's summary) still advertise the agent's
    /// tools, because providers refuse tool calls and results in history without tool
    /// definitions; they forbid calls with `tool_choice: none`. A server that refuses that value
    /// gets `auto` instead, and a call it returns anyway is failed (a step) or ignored (the
    /// others), never executed.
    pub tool_choice_none: bool,
}

impl Model {
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        Model {
            provider: provider.into(),
            model: model.into(),
            context_window: 128_000,
            max_output: Some(16_384),
            price: Price::default(),
            tool_choice_none: true,
        }
    }
}

/// Nano-dollars per token, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

/// An agent: its model, system prompt, step budget and allowed tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    pub model: String,
    pub system: String,
    /// Steps per exchange; the last step may not call tools.
    pub steps: u32,
    /// Tool name patterns: `*`, `fs_*`, `!shell`. Later patterns win.
    pub tools: Vec<String>,
    /// Tool name patterns (the syntax of `tools`) of calls that wait for a person's approval
    /// before they run; a negated pattern lets a call run. A hook may decide per call instead
    /// ([`crate::Hook::permission`]).
    pub ask: Vec<String>,
    /// Rules after `ask`: a tool name pattern (`*`, a name, or one `*`) and what a call it
    /// matches does. The last matching rule decides, over `ask` and over the tool's own
    /// [`crate::Tool::permission`]; a hook decides over all of them.
    pub permission: Vec<(String, crate::Permission)>,
    /// How long an approval waits before it is settled as expired.
    pub approval_ttl: Duration,
    /// What new steering input does to approvals the session waits for.
    pub on_new_input: OnNewInput,
    pub temperature: Option<f64>,
    /// What the agent's sessions may spend; a session's own budget replaces its limits where set.
    pub budget: agenthost_model::Budget,
}

/// What new steering input does to the approvals a session waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnNewInput {
    /// They stay; the input waits behind them, as queued input does.
    #[default]
    Keep,
    /// They are withdrawn (the model sees them cancelled) and the input joins the exchange.
    Deny,
}

impl Default for Agent {
    fn default() -> Self {
        Agent {
            model: "default".into(),
            system: "You are a helpful agent.".into(),
            steps: 25,
            tools: vec!["*".into()],
            ask: Vec::new(),
            permission: Vec::new(),
            approval_ttl: DEFAULT_APPROVAL_TTL,
            on_new_input: OnNewInput::Keep,
            temperature: None,
            budget: agenthost_model::Budget::default(),
        }
    }
}

/// How long an approval waits by default: a day.
pub const DEFAULT_APPROVAL_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What to do at start with sessions a previous process left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Resume every claimed session and every session with pending input.
    #[default]
    Resume,
    /// Report claimed sessions; they wait for an explicit resume.
    Pause,
    /// Do nothing at start.
    Off,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    pub mode: RecoveryMode,
    /// Resumes of one session before it is failed as "interrupted repeatedly".
    pub max_attempts: u32,
    /// Sessions resumed at once by the boot sweep.
    pub concurrency: usize,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            mode: RecoveryMode::Resume,
            max_attempts: 10,
            concurrency: 64,
        }
    }
}

/// Restart policy for panicked session actors.
#[derive(Debug, Clone, PartialEq)]
pub struct Supervision {
    /// Restarts allowed within `window`; one more marks the session failed.
    pub max_restarts: usize,
    pub window: Duration,
    /// Delay before the first restart; doubles with each restart in the window.
    pub backoff: Duration,
}

impl Default for Supervision {
    fn default() -> Self {
        Supervision {
            max_restarts: 5,
            window: Duration::from_secs(60),
            backoff: Duration::from_millis(100),
        }
    }
}

/// Explicit bounds: ractor mailboxes are unbounded, so load is bounded here.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Provider calls open at once across all sessions (steps' streams, compactions' summaries and
    /// `generate`); further calls wait in FIFO order. A permit is held only while a call is open:
    /// never while tools run or during a retry's backoff, and never two at once.
    pub concurrent_streams: usize,
    /// Drains running at once across all sessions; further drains wait in FIFO order, holding
    /// nothing but their place, before they read or write anything. A drain gives its slot back
    /// while its tools run (a tool may wait on another session) and while it waits out a retry's
    /// backoff (a rate-limited provider must not hold up the others), and takes one again after. This
    /// bounds what a burst of sessions holds in memory: the state of a few hundred running
    /// drains, not of every session with work.
    pub concurrent_drains: usize,
    /// Session actors alive at once. At the bound a session without an actor waits in line for
    /// a place (a wake is kept for it; other callers wait for it within their timeout), and
    /// every idle actor passivates at once instead of after `passivate_after`. Restarts after a
    /// failure are not held back. This bounds what many sessions with work hold in memory: a
    /// live actor costs about 7 KiB before its history cache.
    pub live_sessions: usize,
    /// Admitted, unpromoted inputs a session may hold; more are refused as unavailable.
    pub pending_per_session: u32,
    /// Callers waiting on one session actor (joined resumes, idle waiters).
    pub waiters_per_session: usize,
    /// Tool output kept in history, in bytes; the rest is cut with a marker.
    pub tool_output: usize,
    /// Longest wait for a session actor to acknowledge a message.
    pub call_timeout: Duration,
    /// Longest graceful shutdown before drains are abandoned (claims stay for recovery).
    pub shutdown_timeout: Duration,
    /// How often the runtime looks for admitted input whose wake never ran (a caller that went
    /// away between the admission and the wake) and wakes its session.
    pub wake_sweep: Duration,
    /// Settled history that live session actors keep decoded between steps, in bytes
    /// (approximate) across all sessions; 0 turns the cache off. A session whose history does
    /// not fit reads it whole from the store at every step.
    pub history_cache: usize,
    /// Schedules one session may have at once.
    pub schedules_per_session: usize,
    /// How late a firing may be and still count as on time; a later one was missed while no
    /// process ran, and its schedule's catch-up rule decides.
    pub schedule_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            concurrent_streams: 512,
            concurrent_drains: 512,
            live_sessions: 1024,
            wake_sweep: Duration::from_secs(2),
            pending_per_session: 1024,
            waiters_per_session: 4096,
            tool_output: 32 * 1024,
            call_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(15),
            history_cache: 64 * 1024 * 1024,
            schedules_per_session: 100,
            schedule_grace: Duration::from_millis(crate::schedules::GRACE_MS),
        }
    }
}
