//! Hooks: embedders transform the prepared provider request and observe admission,
//! step settlement and tool execution. Request hooks apply to durable steps and to `generate`
//! alike; observers are never called for `generate`.

use std::fmt;

use agenthost_llm as llm;
use agenthost_model::{MessageId, SessionId};

/// Why a request is being prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A durable step of the agent loop.
    Step,
    /// A transient, session-aware `generate` call.
    Generate,
    /// The summary request of a compaction.
    Compaction,
}

/// What a hook sees about the request it may transform.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub session: SessionId,
    pub agent: String,
    pub step: u32,
    pub purpose: Purpose,
}

/// A settled step, for observers.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub session: SessionId,
    pub message: MessageId,
    pub step: u32,
    pub error: Option<String>,
}

/// A finished tool execution, for observers.
#[derive(Debug, Clone)]
pub struct ToolReport {
    pub session: SessionId,
    pub message: MessageId,
    pub call_id: String,
    pub name: String,
    pub ok: bool,
}

/// A tool call about to run, for a permission hook.
#[derive(Debug, Clone, Copy)]
pub struct ToolRequest<'a> {
    pub session: &'a SessionId,
    pub agent: &'a str,
    pub name: &'a str,
    /// The arguments, valid JSON (calls with invalid arguments are refused before any hook).
    pub input: &'a serde_json::Value,
}

/// What a permission hook decides for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// It runs.
    Allow,
    /// It waits for a person's approval.
    Ask,
    /// It does not run; the model gets this reason.
    Deny(String),
}

/// Every method has a no-op default; implement what you need. Hooks run inline on the drain
/// task: keep them fast, and never block.
pub trait Hook: Send + Sync + fmt::Debug {
    fn on_request(&self, _ctx: &RequestContext, _request: &mut llm::Request) {}
    /// Instruction sources this hook provides, sampled at every safe boundary: `(name, value)`,
    /// with `None` for a source that cannot be read right now.
    fn instructions(&self, _session: &SessionId) -> Vec<(String, Option<String>)> {
        Vec::new()
    }
    fn on_admitted(&self, _session: &SessionId, _id: &MessageId) {}
    fn on_step(&self, _report: &StepReport) {}
    fn on_tool(&self, _report: &ToolReport) {}
    /// Decides whether a call runs, waits for approval or is refused; `None` leaves it to the
    /// configured policy (the tool's `permission`, the agent's `ask` and `permission`). The
    /// first hook with an answer decides.
    fn permission(&self, _call: &ToolRequest<'_>) -> Option<Permission> {
        None
    }
}
