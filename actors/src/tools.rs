//! Tools: the registry of tools embedders register, and agent permission patterns.
//!
//! A tool has a name, a description, JSON-schema parameters, an `idempotent` flag, a timeout and
//! an executor. The registry is immutable once the runtime starts, so lookups need no lock.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use agenthost_llm as llm;
use agenthost_model::{MessageId, SessionId};
use futures::future::BoxFuture;
use serde_json::Value;

use crate::hooks::Permission;

/// What a tool execution knows about its call.
#[derive(Debug, Clone)]
pub struct Call {
    pub session: SessionId,
    pub message: MessageId,
    pub call_id: String,
    pub name: String,
    pub input: Value,
}

impl Call {
    /// `<session>/<assistant message>/<call id>`: the same for every execution of one call, so a
    /// re-execution after a restart can be recognized downstream.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}/{}", self.session, self.message, self.call_id)
    }
}

/// Runs a tool. `Ok` is the output the model sees; `Err` a failure message the model sees.
pub trait Executor: Send + Sync + fmt::Debug {
    fn execute(&self, call: Call) -> BoxFuture<'static, Result<String, String>>;
}

/// A registered tool.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    /// Safe to run again with the same idempotency key after a crash.
    pub idempotent: bool,
    pub timeout: Duration,
    pub executor: Arc<dyn Executor>,
    /// One of the runtime's own tools: an agent has it only when its `tools` name it exactly
    /// (a glob such as `*` never matches it).
    pub builtin: bool,
    /// Whether a call runs, waits for a person's approval or is refused, unless the agent's
    /// rules or a hook say otherwise (ARCHITECTURE.md, "Approvals"). `Allow` by default.
    pub permission: Permission,
}

impl Tool {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        executor: Arc<dyn Executor>,
    ) -> Self {
        Tool {
            name: name.into(),
            description: description.into(),
            parameters,
            idempotent: false,
            timeout: Duration::from_secs(120),
            executor,
            builtin: false,
            permission: Permission::Allow,
        }
    }

    fn definition(&self) -> llm::Tool {
        llm::Tool {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }
}

/// Every tool the runtime can run, by name.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    tools: BTreeMap<String, Tool>,
}

/// The tools of a runtime: those given at start, and those sources publish as they come and go
/// (an MCP server's, listed once it is ready and again when its list changes). A step takes the
/// current set once, at its boundary, and uses that set for what it advertises, what it allows
/// and what it runs.
#[derive(Debug)]
pub struct Registry {
    fixed: Tools,
    state: Mutex<Sources>,
    current: RwLock<Arc<Tools>>,
    changed: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Sources {
    /// Each source's tools; `None` while it is not ready (starting, or restarting).
    by_source: BTreeMap<String, Option<Vec<Tool>>>,
    version: u64,
}

impl Registry {
    pub fn new(fixed: Tools) -> Self {
        Registry {
            current: RwLock::new(Arc::new(fixed.clone())),
            fixed,
            state: Mutex::default(),
            changed: tokio::sync::watch::channel(0).0,
        }
    }

    /// The tools now: a cheap, consistent snapshot.
    pub fn current(&self) -> Arc<Tools> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `source` will publish tools but has none yet (it starts, or restarts): recovery waits a
    /// while for a tool it may bring back (see [`Registry::find`]).
    pub fn expect(&self, source: &str) {
        self.update(source, None);
    }

    /// `source`'s tools are these now. A tool named like a tool given at start is left out (the
    /// one given at start wins), as is a later duplicate of an earlier source's name.
    pub fn publish(&self, source: &str, tools: Vec<Tool>) {
        self.update(source, Some(tools));
    }

    /// `source` is gone for good (the runtime stops it): its tools go, and nobody waits for it.
    pub fn remove(&self, source: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.by_source.remove(source);
        self.rebuild(&mut state);
    }

    fn update(&self, source: &str, tools: Option<Vec<Tool>>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.by_source.insert(source.to_owned(), tools);
        self.rebuild(&mut state);
    }

    fn rebuild(&self, state: &mut Sources) {
        let mut all = self.fixed.clone();
        for (source, tools) in &state.by_source {
            for tool in tools.iter().flatten() {
                if all.get(&tool.name).is_some() {
                    tracing::warn!(source = %source, tool = %tool.name, "a tool of this name exists already; this one is left out");
                    continue;
                }
                all.register(tool.clone());
            }
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(all);
        state.version += 1;
        self.changed.send_replace(state.version);
    }

    /// Whether a source that is not ready might still bring tools.
    fn pending(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.by_source.values().any(Option::is_none)
    }

    /// The tool `name`, waiting up to `wait` while a source that is not ready may still bring it
    /// (a restart recovering a call of a server that is still starting).
    pub(crate) async fn find(&self, name: &str, wait: Duration) -> Option<Tool> {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(tool) = self.current().get(name) {
                return Some(tool.clone());
            }
            if !self.pending() {
                return None;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }
}

impl Tools {
    pub fn register(&mut self, tool: Tool) {
        self.tools.insert(tool.name.clone(), tool);
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// Definitions of the tools `patterns` allow, in name order.
    pub fn advertised(&self, patterns: &[String]) -> Vec<llm::Tool> {
        self.tools
            .values()
            .filter(|t| permits(patterns, t))
            .map(Tool::definition)
            .collect()
    }
}

impl Tool {
    /// Runs `call` under the tool's timeout; a panic or a timeout is a failure the model sees.
    pub(crate) async fn run(&self, call: Call) -> Result<String, String> {
        use futures::FutureExt;
        let run = std::panic::AssertUnwindSafe(self.executor.execute(call)).catch_unwind();
        match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the tool panicked".to_owned()),
            Err(_) => Err(format!("the tool timed out after {:?}", self.timeout)),
        }
    }
}

/// Whether an agent's `patterns` give it `tool`: a built-in tool only when they name it
/// exactly (and no later pattern denies it).
pub fn permits(patterns: &[String], tool: &Tool) -> bool {
    allowed(patterns, &tool.name) && (!tool.builtin || patterns.contains(&tool.name))
}

/// Whether `patterns` allow the tool `name`. Patterns are `*`, a name, a prefix glob such as
/// `fs_*`, or any of those negated with `!`; the last matching pattern decides, and nothing
/// matching means denied.
pub fn allowed(patterns: &[String], name: &str) -> bool {
    last_match(patterns, name).unwrap_or(false)
}

/// What the last of `patterns` matching `name` says: `Some(true)` for a plain pattern,
/// `Some(false)` for a negated one, `None` when none matches.
pub(crate) fn last_match(patterns: &[String], name: &str) -> Option<bool> {
    let mut verdict = None;
    for pattern in patterns {
        let (allow, glob) = match pattern.strip_prefix('!') {
            Some(rest) => (false, rest),
            None => (true, pattern.as_str()),
        };
        if glob_match(glob, name) {
            verdict = Some(allow);
        }
    }
    verdict
}

pub(crate) fn glob_match(glob: &str, name: &str) -> bool {
    match glob.split_once('*') {
        None => glob == name,
        Some((prefix, suffix)) => {
            name.len() >= prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_patterns() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(allowed(&p(&["*"]), "shell"));
        assert!(!allowed(&p(&["*", "!shell"]), "shell"));
        assert!(allowed(&p(&["fs_*"]), "fs_read"));
        assert!(!allowed(&p(&["fs_*"]), "net_get"));
        assert!(!allowed(&p(&[]), "anything"));
        assert!(allowed(&p(&["!fs_*", "fs_read"]), "fs_read"));
        assert!(!allowed(&p(&["!fs_*", "fs_read"]), "fs_write"));
    }
}
