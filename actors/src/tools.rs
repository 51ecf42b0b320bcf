//! Tools: the registry of tools embedders register, and agent permission patterns.
//!
//! A tool has a name, a description, JSON-schema parameters, an `idempotent` flag, a timeout and
//! an executor. The registry is immutable once the runtime starts, so lookups need no lock.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agenthost_llm as llm;
use agenthost_model::{MessageId, SessionId};
use futures::future::BoxFuture;
use serde_json::Value;

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
            .filter(|t| allowed(patterns, &t.name))
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

/// Whether `patterns` allow the tool `name`. Patterns are `*`, a name, a prefix glob such as
/// `fs_*`, or any of those negated with `!`; the last matching pattern decides, and nothing
/// matching means denied.
pub fn allowed(patterns: &[String], name: &str) -> bool {
    let mut verdict = false;
    for pattern in patterns {
        let (allow, glob) = match pattern.strip_prefix('!') {
            Some(rest) => (false, rest),
            None => (true, pattern.as_str()),
        };
        if glob_match(glob, name) {
            verdict = allow;
        }
    }
    verdict
}

fn glob_match(glob: &str, name: &str) -> bool {
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
