//! The writer's third thread, the *folder*, and the planner's side of a fold of the front.
//!
//! A fold of the log's front (see `log`) reads every event the front holds and joins each
//! session's runs. Done by the commit that carries it, that work holds up every batch behind it
//! for the length of the fold. So a fold into the middle is prepared off the commit path:
//!
//! 1. When the front is due, the planner *freezes* its generations so far (`Front::freeze`):
//!    later batches go to higher generations.
//! 2. Once the last batch that wrote a frozen generation is durable, the folder reads them from
//!    a snapshot and joins their runs (`log::prepare`). Nothing changes them any more, so the
//!    snapshot holds exactly what the commit will fold.
//! 3. The next batch carries the joined runs: its commit inserts them into the middle and drops
//!    the frozen rows, keeping the front's later ones (`log::apply`), in one transaction.
//!
//! A fold the folder cannot prepare (the middle is full and merges into the base, or the front is
//! too large to hold in memory) is done whole by the commit that carries it, as before. If any
//! commit fails meanwhile, the fold is given up and the frozen generations count towards the
//! next one: nothing of a fold takes effect but by the commit that applies it.
//!
//! [`Folding`] decides from batch numbers alone what happens next; the planner does the I/O.

use std::sync::Arc;
use std::sync::mpsc;

use crate::error::{Result, storage};
use crate::log::{Front, Frozen, Prepared, Runs};
use crate::slot::Slot;

/// What a batch's commit does about the front.
pub(crate) enum Fold {
    None,
    /// Fold the whole front in the commit (`log::fold`).
    InCommit,
    /// Apply a fold the folder prepared (`log::apply`).
    Prepared(Box<Runs>),
}

impl Fold {
    /// Whether the commit folds: the batch then also prunes the working set.
    pub(crate) fn folds(&self) -> bool {
        !matches!(self, Fold::None)
    }
}

/// A fold for the folder to prepare: the front's generations up to `upto`, read from a snapshot
/// begun after every batch that wrote them is durable.
pub(crate) struct Job {
    pub(crate) id: u64,
    pub(crate) upto: u64,
}

/// A job's outcome.
pub(crate) type Done = (u64, Result<Prepared>);

/// Runs jobs until the planner is gone.
pub(crate) fn run(db: Arc<Slot>, jobs: mpsc::Receiver<Job>, done: mpsc::Sender<Done>) {
    while let Ok(job) = jobs.recv() {
        let prepared = (db.get())
            .and_then(|db| redb::ReadableDatabase::begin_read(&*db).map_err(storage))
            .and_then(|txn| crate::log::prepare(&txn, job.upto));
        if done.send((job.id, prepared)).is_err() {
            return;
        }
    }
}

/// Where the next fold of the front is.
#[derive(Default)]
pub(crate) enum Folding {
    #[default]
    Idle,
    /// The front's generations up to `frozen.upto` take no more batches; batch `last` was the
    /// last handed over before they froze.
    Frozen { frozen: Frozen, last: u64 },
    /// The folder is preparing them, as job `job`.
    Preparing { frozen: Frozen, job: u64 },
    /// Ready to go with the next batch.
    Ready { frozen: Frozen, fold: Fold },
}

impl Folding {
    /// Before a batch is planned, with batches up to `handed` handed over and up to `done`
    /// committed, none of them failed: freezes the front when it is due, and returns the job
    /// to send the folder once the frozen generations are durable. `jobs` numbers the jobs.
    /// Without a folder (`folder` false: its thread is gone) the commit folds instead.
    pub(crate) fn step(
        &mut self,
        front: &mut Front,
        handed: u64,
        done: u64,
        folder: bool,
        jobs: &mut u64,
    ) -> Option<Job> {
        if let Folding::Idle = self
            && front.due()
        {
            *self = Folding::Frozen {
                frozen: front.freeze(),
                last: handed,
            };
        }
        match *self {
            Folding::Frozen { frozen, .. } if !folder => {
                *self = Folding::Ready {
                    frozen,
                    fold: Fold::InCommit,
                };
                None
            }
            Folding::Frozen { frozen, last } if done >= last => {
                *jobs += 1;
                *self = Folding::Preparing { frozen, job: *jobs };
                Some(Job {
                    id: *jobs,
                    upto: frozen.upto,
                })
            }
            _ => None,
        }
    }

    /// The folder's outcome of job `job`; one for a job given up is ignored.
    pub(crate) fn prepared(&mut self, job: u64, outcome: Result<Prepared>, front: &mut Front) {
        let Folding::Preparing { frozen, job: ours } = *self else {
            return;
        };
        if job != ours {
            return;
        }
        *self = match outcome {
            Ok(Prepared::Runs(runs)) => Folding::Ready {
                frozen,
                fold: Fold::Prepared(Box::new(runs)),
            },
            Ok(Prepared::InCommit) => Folding::Ready {
                frozen,
                fold: Fold::InCommit,
            },
            Err(e) => {
                tracing::warn!(error = %e, "preparing a fold of the log failed; trying again later");
                front.thaw(frozen);
                Folding::Idle
            }
        };
    }

    /// The folder's thread is gone: a fold it was preparing is the commit's to do.
    pub(crate) fn folder_gone(&mut self) {
        if let Folding::Preparing { frozen, .. } = *self {
            *self = Folding::Ready {
                frozen,
                fold: Fold::InCommit,
            };
        }
    }

    /// What the batch being planned does about the front; with the generations it folds, to
    /// thaw if the batch is not handed over.
    pub(crate) fn carried(&mut self) -> (Fold, Option<Frozen>) {
        match std::mem::take(self) {
            Folding::Ready { frozen, fold } => (fold, Some(frozen)),
            other => {
                *self = other;
                (Fold::None, None)
            }
        }
    }

    /// A commit failed, or a batch was not handed over: the fold on its way, if any, is given
    /// up (`carried`: the frozen generations of a fold taken for a batch that did not go).
    pub(crate) fn give_up(&mut self, front: &mut Front, carried: Option<Frozen>) {
        let frozen = match std::mem::take(self) {
            Folding::Idle => carried,
            Folding::Frozen { frozen, .. }
            | Folding::Preparing { frozen, .. }
            | Folding::Ready { frozen, .. } => Some(frozen),
        };
        if let Some(frozen) = frozen {
            front.thaw(frozen);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// A front due for a fold at once (one event is enough).
    fn due_front() -> Front {
        let mut front = Front::new(1);
        front.place(false, 1);
        assert!(front.due());
        front
    }

    fn carried_runs(folding: &mut Folding) -> Option<u64> {
        match folding.carried() {
            (Fold::Prepared(runs), Some(_)) => Some(runs.upto()),
            (Fold::None, None) => None,
            (Fold::InCommit, _) => panic!("folded in the commit"),
            _ => panic!("a fold without its frozen generations"),
        }
    }

    #[test]
    fn a_fold_is_prepared_once_its_generations_are_durable_and_goes_with_the_next_batch() {
        let mut front = due_front();
        let (mut folding, mut jobs) = (Folding::default(), 0);
        // Batch 3 was the last handed over; only 2 is durable: the job waits.
        assert!(folding.step(&mut front, 3, 2, true, &mut jobs).is_none());
        assert!(!front.due(), "the frozen events no longer count");
        assert_eq!(
            front.place(false, 1),
            1,
            "later batches go above the frozen generations"
        );
        assert_eq!(carried_runs(&mut folding), None, "nothing to carry yet");
        let job = folding
            .step(&mut front, 4, 3, true, &mut jobs)
            .expect("a job");
        assert_eq!((job.id, job.upto), (1, 0));
        assert!(
            folding.step(&mut front, 5, 4, true, &mut jobs).is_none(),
            "one at a time"
        );
        folding.prepared(
            job.id,
            Ok(Prepared::Runs(Runs::empty(job.upto))),
            &mut front,
        );
        assert_eq!(carried_runs(&mut folding), Some(0));
        assert_eq!(carried_runs(&mut folding), None, "carried once");
    }

    #[test]
    fn an_outcome_of_a_job_given_up_is_ignored() {
        let mut front = due_front();
        let (mut folding, mut jobs) = (Folding::default(), 0);
        let first = folding
            .step(&mut front, 1, 1, true, &mut jobs)
            .expect("a job");
        folding.give_up(&mut front, None);
        assert!(front.due(), "given up, the frozen events count again");
        let second = folding
            .step(&mut front, 2, 2, true, &mut jobs)
            .expect("a job");
        assert_ne!(first.id, second.id);
        folding.prepared(
            first.id,
            Ok(Prepared::Runs(Runs::empty(first.upto))),
            &mut front,
        );
        assert_eq!(
            carried_runs(&mut folding),
            None,
            "the first job's outcome is stale"
        );
        folding.prepared(
            second.id,
            Ok(Prepared::Runs(Runs::empty(second.upto))),
            &mut front,
        );
        assert_eq!(carried_runs(&mut folding), Some(second.upto));
    }

    #[test]
    fn a_fold_the_folder_cannot_prepare_is_the_commits() {
        let mut front = due_front();
        let (mut folding, mut jobs) = (Folding::default(), 0);
        // The middle is full.
        let job = folding
            .step(&mut front, 1, 1, true, &mut jobs)
            .expect("a job");
        folding.prepared(job.id, Ok(Prepared::InCommit), &mut front);
        assert!(matches!(folding.carried(), (Fold::InCommit, Some(_))));
        // The folder failed: the events count again, and the next fold is tried later.
        front.place(true, 1);
        let job = folding
            .step(&mut front, 2, 2, true, &mut jobs)
            .expect("a job");
        let failed = Err(Error::Storage("read failed".into()));
        folding.prepared(job.id, failed, &mut front);
        assert!(matches!(folding, Folding::Idle));
        assert!(front.due());
        // The folder's thread is gone: what it was preparing, and every later fold, is the
        // commit's.
        folding
            .step(&mut front, 3, 3, true, &mut jobs)
            .expect("a job");
        folding.folder_gone();
        assert!(matches!(folding.carried(), (Fold::InCommit, Some(_))));
        front.place(true, 1);
        assert!(folding.step(&mut front, 4, 3, false, &mut jobs).is_none());
        assert!(matches!(folding.carried(), (Fold::InCommit, Some(_))));
    }

    #[test]
    fn a_fold_taken_for_a_batch_that_did_not_go_is_given_up() {
        let mut front = due_front();
        let (mut folding, mut jobs) = (Folding::default(), 0);
        let job = folding
            .step(&mut front, 1, 1, true, &mut jobs)
            .expect("a job");
        folding.prepared(
            job.id,
            Ok(Prepared::Runs(Runs::empty(job.upto))),
            &mut front,
        );
        let (fold, frozen) = folding.carried();
        assert!(fold.folds() && !front.due());
        folding.give_up(&mut front, frozen);
        assert!(front.due());
    }
}
