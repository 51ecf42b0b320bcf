//! Format 6: format 5 with the records of schedules appended. Three event variants
//! (`ScheduleSet`, `ScheduleFired`, `ScheduleCancelled`, now in `v7`'s event record, which
//! holds every variant) are new, and so is the schedule itself (`Schedule`, with its
//! `ScheduleId`, `When` and `CatchUp`), which the event that sets it holds and the schedules
//! projection stores, unchanged in format 7. As in `v3`: never change a type here; a new shape is
//! a new format (see the module docs of `codec`).

use std::borrow::Cow;

use agenthost_model as model;
use serde::{Deserialize, Serialize};

use super::v3::{Delivery, Prompt, Result, Timestamp, borrowed, borrowed_opt, owned_opt};

/// A schedule id: its text, as the model's `#[serde(into = "String")]` writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct ScheduleId<'a>(Cow<'a, str>);

impl<'a> From<&'a model::ScheduleId> for ScheduleId<'a> {
    fn from(id: &'a model::ScheduleId) -> Self {
        ScheduleId(borrowed(id.as_str()))
    }
}

impl TryFrom<ScheduleId<'_>> for model::ScheduleId {
    type Error = model::Error;
    fn try_from(id: ScheduleId<'_>) -> Result<Self> {
        model::ScheduleId::try_from(id.0.into_owned())
    }
}

/// A session's schedule: in the event that sets it, and as the schedules projection stores it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Schedule<'a> {
    id: ScheduleId<'a>,
    prompt: Prompt<'a>,
    delivery: Delivery,
    when: When<'a>,
    catch_up: CatchUp,
    next: Timestamp,
}

impl<'a> From<&'a model::Schedule> for Schedule<'a> {
    fn from(schedule: &'a model::Schedule) -> Self {
        let model::Schedule {
            id,
            prompt,
            delivery,
            when,
            catch_up,
            next,
        } = schedule;
        Schedule {
            id: id.into(),
            prompt: prompt.into(),
            delivery: (*delivery).into(),
            when: when.into(),
            catch_up: (*catch_up).into(),
            next: (*next).into(),
        }
    }
}

impl TryFrom<Schedule<'_>> for model::Schedule {
    type Error = model::Error;
    fn try_from(schedule: Schedule<'_>) -> Result<Self> {
        let Schedule {
            id,
            prompt,
            delivery,
            when,
            catch_up,
            next,
        } = schedule;
        Ok(model::Schedule {
            id: id.try_into()?,
            prompt: prompt.into(),
            delivery: delivery.into(),
            when: when.into(),
            catch_up: catch_up.into(),
            next: next.into(),
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum When<'a> {
    Once,
    Cron {
        expr: Cow<'a, str>,
        tz: Option<Cow<'a, str>>,
    },
}

impl<'a> From<&'a model::When> for When<'a> {
    fn from(when: &'a model::When) -> Self {
        match when {
            model::When::Once => When::Once,
            model::When::Cron { expr, tz } => When::Cron {
                expr: borrowed(expr),
                tz: borrowed_opt(tz),
            },
        }
    }
}

impl From<When<'_>> for model::When {
    fn from(when: When<'_>) -> Self {
        match when {
            When::Once => model::When::Once,
            When::Cron { expr, tz } => model::When::Cron {
                expr: expr.into_owned(),
                tz: owned_opt(tz),
            },
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum CatchUp {
    Once,
    Skip,
}

impl From<model::CatchUp> for CatchUp {
    fn from(catch_up: model::CatchUp) -> Self {
        match catch_up {
            model::CatchUp::Once => CatchUp::Once,
            model::CatchUp::Skip => CatchUp::Skip,
        }
    }
}

impl From<CatchUp> for model::CatchUp {
    fn from(catch_up: CatchUp) -> Self {
        match catch_up {
            CatchUp::Once => model::CatchUp::Once,
            CatchUp::Skip => model::CatchUp::Skip,
        }
    }
}
