//! The agenthost domain, pure: ids, prompts, messages, durable events, the projector, the
//! promotion rules of delivery, history selection after compaction, and what a session owes.
//!
//! This crate owns the *meaning* of a session's event log. It does no I/O, spawns nothing, reads
//! no clock and draws no randomness: time and entropy are parameters (see [`ids`]), so replay and
//! live processing run the same code ([`projection::apply`]) and tests are deterministic.
//!
//! Main types: [`SessionId`], [`MessageId`], [`Seq`], [`Event`], [`Stored`], [`Message`],
//! [`SessionRow`], [`InboxRow`], the [`Projection`] trait with its in-memory implementation
//! [`Projections`], and the pure rules [`promotion::select`], [`history::select`] and [`owed()`].

pub mod budget;
pub mod error;
pub mod event;
pub mod history;
pub mod ids;
pub mod memory;
pub mod message;
pub mod owed;
pub mod projection;
pub mod promotion;
pub mod prompt;
pub mod schedule;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use budget::{Budget, Limit, Spend};
pub use error::{Error, Violation};
pub use event::{Event, FailureKind, InterruptReason, StepError, Stored};
pub use ids::{MessageId, Monotonic, ScheduleId, Seq, SessionId, Timestamp};
pub use memory::Projections;
pub use message::{
    Approval, AssistantMessage, CompactionState, Decision, Finish, InboxRow, IndexEntry,
    InstructionState, Message, Part, SessionRow, ToolPart, ToolState, Usage, Verdict,
};
pub use owed::{Owed, Policy, Why, owed};
pub use projection::{ApplyError, Projection, apply};
pub use prompt::{Delivery, FileAttachment, Prompt};
pub use schedule::{CatchUp, Schedule, When};
