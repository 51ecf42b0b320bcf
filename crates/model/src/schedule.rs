//! Schedules: a session's durable wake-ups. A schedule admits its prompt at its next firing time;
//! the runtime computes those times (a cron expression needs a clock and a time zone database,
//! which the model does not read), the model keeps them.

use serde::{Deserialize, Serialize};

use crate::ids::{ScheduleId, Timestamp};
use crate::prompt::{Delivery, Prompt};

/// A schedule as its session keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub id: ScheduleId,
    /// What each firing admits.
    pub prompt: Prompt,
    pub delivery: Delivery,
    pub when: When,
    pub catch_up: CatchUp,
    /// The next firing time, ms since the Unix epoch.
    pub next: Timestamp,
}

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum When {
    /// Once, at `next` (set from `at` or `after_ms`).
    Once,
    /// At every time a five-field cron expression names, in `tz` (an IANA zone; UTC when
    /// `None`).
    Cron { expr: String, tz: Option<String> },
}

/// What a schedule does about firings missed while no process ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CatchUp {
    /// One firing for all that were missed.
    #[default]
    Once,
    /// None: the next firing is the first one to come.
    Skip,
}
