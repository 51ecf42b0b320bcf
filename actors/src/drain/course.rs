//! The drain's decisions as a sans-IO machine: what the drain does next at each boundary, given
//! what it observed (a cancellation, pending input, a promotion, a step's end, a settlement).
//! `drain::agent_loop` is the async shell that reads, writes and runs steps; this module only
//! decides, so it is tested without a store, a provider or a clock.

use agenthost_model::promotion::Boundary;

/// How a drain ended, delivered to every caller that joined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was owed; nothing was written.
    Idle,
    /// Ran `steps` steps and settled.
    Completed { steps: u32 },
    /// Stopped by `interrupt` (or shutdown) after durable cleanup.
    Interrupted,
    /// A manual compaction finished; history before `kept_from` is now summarized.
    Compacted { kept_from: agenthost_model::Seq },
    /// The exchange waits for a person's approval of a call; the earliest approval expires at
    /// `expires_at`. The claim stays with the exchange; the drain's slot is given back.
    Waiting {
        expires_at: agenthost_model::Timestamp,
    },
    /// The exchange's next call would pass this limit of the session's budget: it was not made.
    /// The claim and the input stay with the exchange until the budget changes or a user
    /// interrupts it; the drain's slot is given back.
    Blocked(agenthost_model::Limit),
}

/// Where a drain stands between boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Course {
    /// The claim is still to be taken: `ExecutionStarted` rides with the drain's first write.
    opening: bool,
    /// A model call is owed (a forced drain, recovered work, or input just promoted).
    owed: bool,
    /// The last step called tools: their results are owed a call.
    continuation: bool,
    /// The next step's number within its exchange.
    step: u32,
    /// Steps this drain ran.
    steps_run: u32,
}

/// What the drain does at a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtBoundary {
    /// Stop: cancelled. `record` says whether the drain wrote anything (then it records the
    /// interrupt; before its first write it writes nothing and the input stays pending).
    Stop { record: bool },
    /// Look for pending input and promote at this boundary.
    Promote(Boundary),
}

/// What the drain does once the boundary's promotion is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterPromotion {
    /// Nothing is owed: settle the drain if no input arrived meanwhile.
    Settle,
    /// Run this step.
    Step(u32),
}

/// How a step ended, as far as the course needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stepped {
    Done {
        continuation: bool,
    },
    /// Settled, and some of its calls wait for approval.
    Waiting,
    /// Its call, or its next one, would pass the budget: not made.
    Blocked,
    Interrupted,
    Failed,
}

/// What the drain does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterStep {
    /// Back to the next boundary.
    Continue,
    /// Record the interrupt and stop.
    Stop,
    /// The step failed and recorded the drain's failure: stop with its error.
    Fail,
    /// The step's calls wait for approval: end the drain, keeping the claim for the exchange.
    Wait,
    /// The budget blocks the exchange: record it and end the drain, keeping the claim.
    Block,
}

impl Course {
    /// A drain's course. `opening`: the claim is still to be taken; `owed`: a call is owed from
    /// the start (forced, or recovered work), at step `step`.
    pub(crate) fn new(opening: bool, owed: bool, step: u32) -> Course {
        Course {
            opening,
            owed,
            continuation: false,
            step,
            steps_run: 0,
        }
    }

    /// The course of a drain that recovered a claim and owes a call at step `step`. Its first
    /// boundary is the one recovery names: a continuation unless only new input is owed, so a
    /// queued input never joins an exchange a stop cut.
    pub(crate) fn recovered(step: u32, boundary: Boundary) -> Course {
        Course {
            continuation: boundary == Boundary::Continuation,
            ..Course::new(false, true, step)
        }
    }

    pub(crate) fn at_boundary(&self, cancelled: bool) -> AtBoundary {
        if cancelled {
            return AtBoundary::Stop {
                record: !self.opening,
            };
        }
        AtBoundary::Promote(match self.continuation {
            true => Boundary::Continuation,
            false => Boundary::Idle,
        })
    }

    /// Whether instruction sources must be sampled before promoting: only where a step may
    /// follow, so an idle drain samples nothing.
    pub(crate) fn samples_instructions(&self, pending: bool) -> bool {
        self.owed || self.continuation || pending
    }

    /// Takes the opening: true exactly once, for the drain's first write.
    pub(crate) fn take_opening(&mut self) -> bool {
        std::mem::take(&mut self.opening)
    }

    /// Whether only a promotion at this boundary would give the drain a step: nothing is owed
    /// and no tool results wait for a call. Otherwise a step follows whatever is promoted.
    pub(crate) fn settles_unless_promoted(&self) -> bool {
        !self.owed && !self.continuation
    }

    /// The boundary's promotion is done; `promoted` says whether it promoted input (new input
    /// starts a new exchange: the step count starts over).
    pub(crate) fn promoted(&mut self, promoted: bool) -> AfterPromotion {
        if promoted {
            self.step = 1;
            self.owed = true;
        }
        if self.settles_unless_promoted() {
            return AfterPromotion::Settle;
        }
        self.owed = false;
        AfterPromotion::Step(self.step)
    }

    /// The settlement was tried: it succeeded (the drain is done) or input arrived meanwhile (go
    /// round again).
    pub(crate) fn settled(&self, succeeded: bool) -> Option<Outcome> {
        succeeded.then_some(Outcome::Completed {
            steps: self.steps_run,
        })
    }

    pub(crate) fn stepped(&mut self, end: Stepped) -> AfterStep {
        match end {
            Stepped::Done { continuation } => {
                self.continuation = continuation;
                self.steps_run += 1;
                self.step += 1;
                AfterStep::Continue
            }
            Stepped::Waiting => {
                self.steps_run += 1;
                self.step += 1;
                AfterStep::Wait
            }
            // Nothing more of the exchange runs in this drain; the call stays owed.
            Stepped::Blocked => AfterStep::Block,
            Stepped::Interrupted => AfterStep::Stop,
            Stepped::Failed => AfterStep::Fail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `course` through boundaries, answering each promotion from `promotions` and each
    /// step from `steps`, until it settles; returns the steps it ran and the outcome.
    fn drive(
        mut course: Course,
        mut promotions: Vec<bool>,
        mut steps: Vec<Stepped>,
    ) -> (Vec<u32>, Option<Outcome>, Vec<Boundary>) {
        let (mut ran, mut boundaries) = (Vec::new(), Vec::new());
        promotions.reverse();
        steps.reverse();
        for _ in 0..20 {
            let AtBoundary::Promote(boundary) = course.at_boundary(false) else {
                unreachable!("not cancelled")
            };
            boundaries.push(boundary);
            course.take_opening();
            match course.promoted(promotions.pop().unwrap_or(false)) {
                AfterPromotion::Settle => return (ran, course.settled(true), boundaries),
                AfterPromotion::Step(step) => {
                    ran.push(step);
                    match course.stepped(steps.pop().expect("a step was scripted")) {
                        AfterStep::Continue => {}
                        AfterStep::Stop | AfterStep::Fail | AfterStep::Wait | AfterStep::Block => {
                            return (ran, None, boundaries);
                        }
                    }
                }
            }
        }
        panic!("the course never settled")
    }

    const ANSWER: Stepped = Stepped::Done {
        continuation: false,
    };
    const TOOLS: Stepped = Stepped::Done { continuation: true };

    #[test]
    fn a_blocked_step_ends_the_course_with_its_exchange_open() {
        let mut course = Course::new(true, false, 1);
        course.promoted(true);
        assert_eq!(course.stepped(TOOLS), AfterStep::Continue);
        assert_eq!(course.stepped(Stepped::Blocked), AfterStep::Block);
        // Nothing more runs in this drain: the step it would have run is still owed.
        let (ran, outcome, _) = drive(
            Course::new(true, false, 1),
            vec![true],
            vec![TOOLS, Stepped::Blocked],
        );
        assert_eq!(ran, [1, 2]);
        assert_eq!(outcome, None);
    }

    #[test]
    fn input_is_answered_and_the_drain_settles() {
        let (ran, outcome, boundaries) =
            drive(Course::new(true, false, 1), vec![true], vec![ANSWER]);
        assert_eq!(ran, [1]);
        assert_eq!(outcome, Some(Outcome::Completed { steps: 1 }));
        assert_eq!(boundaries, [Boundary::Idle, Boundary::Idle]);
    }

    #[test]
    fn tool_results_continue_at_a_continuation_boundary_with_the_next_step() {
        let (ran, outcome, boundaries) = drive(
            Course::new(true, false, 1),
            vec![true],
            vec![TOOLS, TOOLS, ANSWER],
        );
        assert_eq!(ran, [1, 2, 3]);
        assert_eq!(outcome, Some(Outcome::Completed { steps: 3 }));
        assert_eq!(
            boundaries[1..3],
            [Boundary::Continuation, Boundary::Continuation]
        );
    }

    #[test]
    fn new_input_between_steps_starts_the_count_over() {
        let (ran, _, _) = drive(
            Course::new(true, false, 1),
            vec![true, true],
            vec![TOOLS, ANSWER],
        );
        assert_eq!(ran, [1, 1]);
    }

    #[test]
    fn owed_work_runs_without_input_from_the_step_recovery_names() {
        let (ran, outcome, _) = drive(Course::new(false, true, 3), vec![], vec![ANSWER]);
        assert_eq!(ran, [3]);
        assert_eq!(outcome, Some(Outcome::Completed { steps: 1 }));
    }

    #[test]
    fn a_recovered_exchange_runs_before_new_exchanges_at_the_step_recovery_names() {
        let mut course = Course::recovered(3, Boundary::Continuation);
        assert_eq!(
            course.at_boundary(false),
            AtBoundary::Promote(Boundary::Continuation),
            "a queued input waits"
        );
        assert_eq!(course.promoted(false), AfterPromotion::Step(3));
        assert_eq!(course.stepped(ANSWER), AfterStep::Continue);
        assert_eq!(
            course.at_boundary(false),
            AtBoundary::Promote(Boundary::Idle),
            "then the session would go idle: a queued input may start"
        );
        // Only new input owed: the first boundary is already idle.
        let course = Course::recovered(1, Boundary::Idle);
        assert_eq!(
            course.at_boundary(false),
            AtBoundary::Promote(Boundary::Idle)
        );
    }

    #[test]
    fn only_a_promotion_gives_a_step_where_nothing_is_owed() {
        let mut course = Course::new(true, false, 1);
        assert!(
            course.settles_unless_promoted(),
            "an idle drain waits on input"
        );
        assert_eq!(course.promoted(true), AfterPromotion::Step(1));
        course.stepped(TOOLS);
        assert!(
            !course.settles_unless_promoted(),
            "tool results are owed a call"
        );
        course.promoted(false);
        course.stepped(ANSWER);
        assert!(
            course.settles_unless_promoted(),
            "an answered exchange settles"
        );
        assert!(
            !Course::new(false, true, 3).settles_unless_promoted(),
            "recovered work"
        );
        assert!(!Course::recovered(2, Boundary::Continuation).settles_unless_promoted());
    }

    #[test]
    fn nothing_owed_settles_at_once() {
        let (ran, outcome, _) = drive(Course::new(true, false, 1), vec![], vec![]);
        assert!(ran.is_empty());
        assert_eq!(outcome, Some(Outcome::Completed { steps: 0 }));
    }

    #[test]
    fn a_cancel_before_the_first_write_records_nothing() {
        let mut course = Course::new(true, false, 1);
        assert_eq!(course.at_boundary(true), AtBoundary::Stop { record: false });
        assert!(course.take_opening());
        assert!(!course.take_opening(), "the opening is taken once");
        assert_eq!(course.at_boundary(true), AtBoundary::Stop { record: true });
    }

    #[test]
    fn instructions_are_sampled_only_where_a_step_may_follow() {
        let course = Course::new(true, false, 1);
        assert!(!course.samples_instructions(false));
        assert!(course.samples_instructions(true));
        assert!(Course::new(true, true, 1).samples_instructions(false));
    }

    #[test]
    fn input_arriving_before_the_settlement_goes_round_again() {
        let course = Course::new(false, false, 1);
        assert_eq!(course.settled(false), None);
    }

    #[test]
    fn a_failed_or_interrupted_step_stops_the_course() {
        let (ran, outcome, _) = drive(
            Course::new(true, false, 1),
            vec![true],
            vec![Stepped::Failed],
        );
        assert_eq!((ran, outcome), (vec![1], None));
        let mut course = Course::new(false, true, 1);
        assert_eq!(course.stepped(Stepped::Interrupted), AfterStep::Stop);
    }

    #[test]
    fn a_step_whose_calls_wait_for_approval_ends_the_course() {
        let (ran, outcome, _) = drive(
            Course::new(true, false, 1),
            vec![true],
            vec![TOOLS, Stepped::Waiting],
        );
        assert_eq!((ran, outcome), (vec![1, 2], None));
    }
}
