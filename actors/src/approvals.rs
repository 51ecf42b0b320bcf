//! Human approval of tool calls (ARCHITECTURE.md, "Approvals"): the gate that decides whether a
//! call runs, waits for a person or is refused; the digest that binds a decision to exactly what
//! was asked; the runtime's one timer of approval expiries; and the reads behind listing and
//! deciding approvals.
//!
//! The durable part is in the model: a call that waits is `Held`, with its `Approval` part
//! beside it in the same message; `owed` says a session whose last step holds an undecided
//! approval is `Waiting`, and one whose approvals are all decided owes the continuation. Deciding
//! is one event the projector accepts once; everything after it (starting an approved call,
//! settling a refused one, expiring) runs in the session's own drain.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agenthost_llm as llm;
use agenthost_model::owed::{self, Held};
use agenthost_model::{Message, MessageId, SessionId, Timestamp, Verdict};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;

use crate::config::Agent;
use crate::hooks::{Permission, ToolRequest};
use crate::shared::Shared;
use crate::tools::{Tool, Tools, glob_match, last_match, permits};

/// The digest of a call: SHA-256 over the tool's name, a newline and its input as canonical JSON
/// (object keys sorted, no whitespace), as `sha256:<hex>`. Two calls with the same name and the
/// same arguments, however the model spaced or ordered them, have the same digest.
pub fn digest(name: &str, input: &Value) -> String {
    let mut text = String::with_capacity(name.len() + 64);
    text.push_str(name);
    text.push('\n');
    canonical(input, &mut text);
    let hash = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in hash.iter() {
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    out
}

fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (n, key) in keys.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// What a step does with a call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// It runs now.
    Run,
    /// It is held for a person's approval of exactly `digest`.
    Ask { digest: String },
    /// It fails without running; the model gets the reason.
    Refuse(String),
}

/// The checks every call of one step passes, decided once per step.
pub(crate) struct Policy<'a> {
    pub shared: &'a Shared,
    /// The tools the step advertised.
    pub tools: &'a Tools,
    pub session: &'a SessionId,
    pub agent_name: &'a str,
    pub agent: Option<&'a Agent>,
    /// The exchange's last step may not call tools.
    pub last_step: bool,
}

impl Policy<'_> {
    /// Decides a call: refused (last step, unknown tool, not allowed, invalid JSON, a denial by
    /// policy or by a hook), held for approval (by policy, or a hook), or run.
    pub(crate) fn gate(&self, call: &llm::ToolCall) -> Gate {
        let shared = self.shared;
        if self.last_step {
            return Gate::Refuse("tool calls are disabled on the last step".to_owned());
        }
        let Some(tool) = self.tools.get(&call.name) else {
            return Gate::Refuse(format!("unknown tool {:?}", call.name));
        };
        let (patterns, ask, rules) = match self.agent {
            Some(agent) => (
                agent.tools.as_slice(),
                agent.ask.as_slice(),
                agent.permission.as_slice(),
            ),
            None => (&[][..], &[][..], &[][..]),
        };
        if !permits(patterns, tool) {
            return Gate::Refuse(format!(
                "permission denied: this agent may not use {:?}",
                call.name
            ));
        }
        let input = match serde_json::from_str::<Value>(&call.input) {
            Ok(input) => input,
            Err(e) => return Gate::Refuse(format!("invalid JSON arguments: {e}")),
        };
        let request = ToolRequest {
            session: self.session,
            agent: self.agent_name,
            name: &call.name,
            input: &input,
        };
        let decided = shared.hooks.iter().find_map(|h| h.permission(&request));
        let permission = decided.unwrap_or_else(|| policy(tool, ask, rules));
        match permission {
            Permission::Allow => Gate::Run,
            Permission::Ask => Gate::Ask {
                digest: digest(&call.name, &input),
            },
            Permission::Deny(reason) => Gate::Refuse(format!("permission denied: {reason}")),
        }
    }

    /// When an approval asked now expires.
    pub(crate) fn expires_at(&self, now: Timestamp) -> Timestamp {
        let ttl = self
            .agent
            .map_or(crate::config::DEFAULT_APPROVAL_TTL, |a| a.approval_ttl);
        Timestamp(now.0.saturating_add(ttl.as_millis() as u64))
    }
}

/// What configuration says of a call of `tool`: the tool's own permission, then the agent's
/// `ask` patterns, then its rules; the last that matches decides.
fn policy(tool: &Tool, ask: &[String], rules: &[(String, Permission)]) -> Permission {
    let mut permission = match last_match(ask, &tool.name) {
        Some(true) => Permission::Ask,
        Some(false) => Permission::Allow,
        None => tool.permission.clone(),
    };
    for (pattern, rule) in rules {
        if glob_match(pattern, &tool.name) {
            permission = rule.clone();
        }
    }
    permission
}

/// A pending approval, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingApproval {
    pub message: MessageId,
    pub call_id: String,
    pub name: String,
    /// The call's arguments, as the model sent them.
    pub input: String,
    pub digest: String,
    pub expires_at: Timestamp,
}

impl From<Held> for PendingApproval {
    fn from(held: Held) -> Self {
        PendingApproval {
            message: held.message,
            call_id: held.tool.call_id,
            name: held.tool.name,
            input: held.tool.input,
            digest: held.digest,
            expires_at: held.expires_at,
        }
    }
}

/// A decision asked for through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decide {
    pub approve: bool,
    /// The digest of the call as listed: a decision approves exactly what was asked.
    pub digest: String,
    pub reason: Option<String>,
    pub by: Option<String>,
}

impl Decide {
    pub(crate) fn verdict(&self) -> Verdict {
        match self.approve {
            true => Verdict::Approved,
            false => Verdict::Denied,
        }
    }
}

/// The held calls of every message of `messages` that still wait for a decision.
pub(crate) fn pending(messages: &[Message]) -> Vec<PendingApproval> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => Some(owed::held(a)),
            _ => None,
        })
        .flatten()
        .filter(|h| h.decision.is_none())
        .map(PendingApproval::from)
        .collect()
}

/// The runtime's approval deadlines: each waiting session with the earliest expiry of its
/// approvals. One map and one task for every waiting session, never a task per approval; it is
/// fed by the drains that end waiting (at boot, by the sweep's drains), so it survives restarts
/// and takeovers through the store. It doubles as the set of sessions whose status is `waiting`.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    state: Mutex<DeadlineState>,
    changed: Notify,
    /// How many sessions wait, kept under the lock: every drain's end asks, and while none
    /// waits the answer costs no lock.
    waiting: AtomicUsize,
}

#[derive(Debug, Default)]
struct DeadlineState {
    by_time: BTreeSet<(Timestamp, SessionId)>,
    /// Each waiting session's earliest expiry, and since when it waits (wall clock).
    by_session: HashMap<SessionId, (Timestamp, Timestamp)>,
}

impl DeadlineState {
    fn clear(&mut self, session: &SessionId) -> bool {
        match self.by_session.remove(session) {
            Some((at, _)) => {
                self.by_time.remove(&(at, session.clone()));
                true
            }
            None => false,
        }
    }
}

impl Deadlines {
    fn lock(&self) -> std::sync::MutexGuard<'_, DeadlineState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn none(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
    }

    /// Runs `f` on the state under the lock and recounts.
    fn update<T>(&self, f: impl FnOnce(&mut DeadlineState) -> T) -> T {
        let mut state = self.lock();
        let out = f(&mut state);
        self.waiting
            .store(state.by_session.len(), Ordering::Release);
        out
    }

    /// The session waits for approvals, the earliest expiring at `at`.
    pub(crate) fn set(&self, session: &SessionId, at: Timestamp) {
        self.update(|state| {
            state.clear(session);
            state.by_time.insert((at, session.clone()));
            state
                .by_session
                .insert(session.clone(), (at, agenthost_store::system_clock()));
        });
        self.changed.notify_one();
    }

    /// The session waits no more.
    pub(crate) fn clear(&self, session: &SessionId) {
        if !self.none() {
            self.update(|state| state.clear(session));
        }
    }

    pub(crate) fn is_waiting(&self, session: &SessionId) -> bool {
        !self.none() && self.lock().by_session.contains_key(session)
    }

    /// The waiting sessions, each with when it began to wait (wall clock).
    pub(crate) fn sessions(&self) -> Vec<(SessionId, Timestamp)> {
        self.lock()
            .by_session
            .iter()
            .map(|(session, (_, since))| (session.clone(), *since))
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Takes the sessions due at `now`, and says when the next one is.
    fn due(&self, now: Timestamp) -> (Vec<SessionId>, Option<Timestamp>) {
        self.update(|state| {
            let mut due = Vec::new();
            while let Some((at, session)) = state.by_time.first().cloned() {
                if at > now {
                    return (due, Some(at));
                }
                state.clear(&session);
                due.push(session);
            }
            (due, None)
        })
    }
}

/// The longest the timer sleeps before it looks at the wall clock again: a clock that jumps
/// moves a deadline by at most this much.
const LONGEST_NAP: Duration = Duration::from_secs(30);

/// The timer: wakes each waiting session once its earliest approval expires; the session's drain
/// settles what expired (and puts the session back with its next deadline if more wait). Ends
/// with the runtime.
pub(crate) async fn expire(runtime: crate::Runtime) {
    let deadlines = &runtime.shared.deadlines;
    loop {
        let (due, next) = deadlines.due(agenthost_store::system_clock());
        for session in due {
            // A session this node no longer owns is its new owner's to expire.
            if let Err(e) = runtime.wake(&session).await {
                tracing::warn!(session_id = %session, error = %e, "could not wake a session whose approval expired");
            }
        }
        let nap = next.map_or(LONGEST_NAP, |at| {
            let now = agenthost_store::system_clock();
            Duration::from_millis(at.0.saturating_sub(now.0)).min(LONGEST_NAP)
        });
        tokio::select! {
            _ = runtime.shared.stopping.cancelled() => return,
            _ = deadlines.changed.notified() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_ignores_key_order_and_spacing_but_not_values_or_names() {
        let a: Value =
            serde_json::from_str(r#"{"to": "a@b", "n": [1, {"y": 2, "x": 1}]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"n":[1,{"x":1,"y":2}],"to":"a@b"}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"n":[1,{"x":1,"y":3}],"to":"a@b"}"#).unwrap();
        assert_eq!(digest("send", &a), digest("send", &b));
        assert_ne!(digest("send", &a), digest("send", &c));
        assert_ne!(digest("send", &a), digest("mail", &a));
        assert!(digest("send", &a).starts_with("sha256:"));
        assert_eq!(digest("send", &a).len(), 7 + 64);
    }

    #[test]
    fn the_last_matching_rule_decides_over_ask_and_over_the_tools_own_permission() {
        #[derive(Debug)]
        struct Nothing;
        impl crate::Executor for Nothing {
            fn execute(
                &self,
                _call: crate::Call,
            ) -> futures::future::BoxFuture<'static, Result<String, String>> {
                Box::pin(async { Ok(String::new()) })
            }
        }
        let tool = |name: &str, permission: Permission| Tool {
            permission,
            ..Tool::new(
                name,
                "",
                serde_json::json!({}),
                std::sync::Arc::new(Nothing),
            )
        };
        let ask = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let deny = Permission::Deny("by policy".into());
        let rules = |v: &[(&str, &Permission)]| {
            v.iter()
                .map(|(p, r)| (p.to_string(), (*r).clone()))
                .collect::<Vec<_>>()
        };
        let plain = tool("read_file", Permission::Allow);
        assert_eq!(policy(&plain, &[], &[]), Permission::Allow, "the default");
        let asks = tool("pay", Permission::Ask);
        assert_eq!(policy(&asks, &[], &[]), Permission::Ask, "the tool's own");
        assert_eq!(
            policy(&asks, &ask(&["!pay"]), &[]),
            Permission::Allow,
            "a negated ask lets it run"
        );
        assert_eq!(
            policy(&plain, &ask(&["read_*"]), &[]),
            Permission::Ask,
            "ask over the tool"
        );
        let ordered = rules(&[
            ("*", &Permission::Ask),
            ("read_*", &Permission::Allow),
            ("rm", &deny),
        ]);
        assert_eq!(policy(&plain, &[], &ordered), Permission::Allow);
        assert_eq!(policy(&asks, &[], &ordered), Permission::Ask);
        assert_eq!(policy(&tool("rm", Permission::Allow), &[], &ordered), deny);
        assert_eq!(
            policy(&plain, &ask(&["*"]), &rules(&[("read_file", &deny)])),
            deny,
            "rules come after ask"
        );
        let reversed = rules(&[("read_*", &Permission::Allow), ("*", &Permission::Ask)]);
        assert_eq!(
            policy(&plain, &[], &reversed),
            Permission::Ask,
            "the last match wins"
        );
    }

    #[test]
    fn deadlines_keep_one_entry_per_session_and_hand_out_the_due_ones_in_order() {
        let d = Deadlines::default();
        let (s1, s2, s3) = (
            SessionId::mint(Timestamp(1), 1),
            SessionId::mint(Timestamp(1), 2),
            SessionId::mint(Timestamp(1), 3),
        );
        d.set(&s1, Timestamp(300));
        d.set(&s2, Timestamp(100));
        d.set(&s3, Timestamp(200));
        d.set(&s1, Timestamp(150));
        d.clear(&s3);
        assert_eq!(d.len(), 2);
        assert!(d.is_waiting(&s1) && !d.is_waiting(&s3));
        assert_eq!(d.due(Timestamp(99)), (vec![], Some(Timestamp(100))));
        assert_eq!(d.due(Timestamp(150)), (vec![s2, s1], None));
        assert_eq!(d.len(), 0);
    }
}
