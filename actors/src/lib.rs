//! The agenthost runtime: ractor actors that own execution over the store and the providers.
//!
//! It owns *when* things run: the registry routes to one session actor per live session; each
//! session actor serializes its drains and coalesces wakes; a drain runs the agent loop (steps,
//! tools, retries) in a task the actor owns; the registry supervises session actors; the boot
//! sweep resumes what a previous process left. It also holds the one request-preparation seam
//! ([`prepare`]) that durable steps and `generate` share.
//!
//! It must not touch redb or an HTTP type: storage is the `agenthost_store::Store` trait,
//! providers the `agenthost_llm::Provider` trait.
//!
//! Main types: [`Runtime`] (the handle), [`Config`], [`Outcome`], [`Error`], [`Live`] events,
//! [`Hook`], [`Tools`].

mod admitted;
mod approvals;
pub mod bus;
mod catalog;
pub mod config;
mod drain;
mod error;
mod generate;
mod history_cache;
pub mod hooks;
pub mod instructions;
mod metrics;
mod mint;
pub mod prepare;
mod registry;
mod retry;
mod runtime;
mod schedules;
mod session;
mod shared;
mod summary;
pub mod tools;

/// The runtime's concurrent maps by id, with a fast seeded hasher: the bus looks a session up
/// for every streamed delta.
pub(crate) type IdMap<K, V> = dashmap::DashMap<K, V, foldhash::fast::RandomState>;

pub use approvals::{Decide, PendingApproval, digest};
pub use bus::{Activity, DeltaKind, Live, SESSION_BYTES, Subscription};
pub use config::{
    Agent, Compaction, Config, DEFAULT_APPROVAL_TTL, Limits, Model, OnNewInput, Price, Recovery,
    RecoveryMode, Supervision,
};
pub use drain::Outcome;
pub use drain::settle::{RESTART_NOTE, STOPPED_TOOL};
pub use drain::step::{CONTINUE_NOTE, CUT as TOOL_OUTPUT_CUT, MAX_STEP_OUTPUT};
pub use error::{Error, Result};
pub use hooks::{Hook, Permission, Purpose, RequestContext, StepReport, ToolReport, ToolRequest};
pub use instructions::Instruction;
pub use metrics::Metrics;
pub use runtime::schedules::{NewSchedule, ScheduleAt, format_time, parse_time};
pub use runtime::{CreateSession, Extensions, PromptRequest, Runtime, ToolOutput};
pub use schedules::GRACE_MS as SCHEDULE_GRACE_MS;
pub use summary::{
    OFF_TEMPLATE as SUMMARY_OFF_TEMPLATE, SECTIONS as SUMMARY_SECTIONS, SUMMARY_REQUEST,
};
pub use tools::{Call, Executor, Registry, Tool, Tools};
