//! What a step does after one attempt's stream ended: a pure decision over what the attempt
//! produced, and the backoff schedule. `step` carries the decision out; these are tested without
//! a store, a provider or a clock.
//!
//! The policy: a context overflow before any output compacts once (when automatic compaction is
//! on) and rebuilds the same step; a retryable failure before any output retries the same
//! message; a retryable failure after output (a cut stream, a connection reset) keeps the partial
//! message and continues in a new one, unless a complete tool call was recorded, in which case
//! the tool settles and the step fails once; anything else, or a spent budget, fails the step.
//! Retries and continuations share one budget per step and do not consume steps.

use std::time::Duration;

/// Retries and continuations after a step's first attempt.
pub(crate) const MAX_RETRIES: u32 = 4;
const BASE: Duration = Duration::from_secs(2);
/// The longest wait a provider's `retry-after` can impose.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(15 * 60);

/// How an attempt's stream ended, as far as the decision needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Ended {
    /// The attempt's failure, if it did not end with a finish reason.
    pub failure: Option<Failure>,
    /// Whether the attempt produced output (durable parts, or streamed text not yet ended).
    pub output: bool,
    /// Whether a complete tool call was recorded.
    pub calls: bool,
    /// Retries and continuations this step already made.
    pub retries: u32,
    /// Whether this step already compacted after an overflow.
    pub compacted: bool,
    /// Whether automatic compaction is on.
    pub auto_compaction: bool,
}

/// A failed attempt, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failure {
    pub overflow: bool,
    pub retryable: bool,
}

/// What the step does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Run the recorded tools and end the step.
    Settle,
    /// Compact once, rebuild the same step, try again.
    Compact,
    /// Wait, then try the same message again.
    Retry,
    /// Keep the partial message and settle it as failed, wait, continue in a new message.
    Continue,
    /// Settle the step as failed (recorded tools still run) and end the drain.
    Fail,
}

pub(crate) fn next(ended: &Ended) -> Next {
    let Some(failure) = ended.failure else {
        return Next::Settle;
    };
    if failure.overflow && !ended.output && ended.auto_compaction && !ended.compacted {
        return Next::Compact;
    }
    if !failure.retryable || ended.retries >= MAX_RETRIES {
        return Next::Fail;
    }
    match (ended.output, ended.calls) {
        (false, false) => Next::Retry,
        (true, false) => Next::Continue,
        // A continuation would answer tool results the model never saw completed.
        (_, true) => Next::Fail,
    }
}

/// The wait before retry `attempt` (1-based): exponential from 2 s, times `jitter` (drawn in
/// 0.8..1.2 by the caller); a provider's `retry-after` is a minimum, capped at 15 minutes.
pub(crate) fn delay(attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    let base = BASE * 2u32.pow(attempt.saturating_sub(1).min(16));
    let delay = base.mul_f64(jitter);
    match retry_after {
        Some(after) => delay.max(after.min(RETRY_AFTER_CAP)),
        None => delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRYABLE: Failure = Failure {
        overflow: false,
        retryable: true,
    };
    const FINAL: Failure = Failure {
        overflow: false,
        retryable: false,
    };
    const OVERFLOW: Failure = Failure {
        overflow: true,
        retryable: false,
    };

    fn ended(failure: Option<Failure>) -> Ended {
        Ended {
            failure,
            auto_compaction: true,
            ..Ended::default()
        }
    }

    #[test]
    fn every_end_of_an_attempt_has_one_next_move() {
        let table = [
            (ended(None), Next::Settle),
            (
                Ended {
                    calls: true,
                    output: true,
                    ..ended(None)
                },
                Next::Settle,
            ),
            (ended(Some(OVERFLOW)), Next::Compact),
            (
                Ended {
                    compacted: true,
                    ..ended(Some(OVERFLOW))
                },
                Next::Fail,
            ),
            (
                Ended {
                    auto_compaction: false,
                    ..ended(Some(OVERFLOW))
                },
                Next::Fail,
            ),
            (
                Ended {
                    output: true,
                    ..ended(Some(OVERFLOW))
                },
                Next::Fail,
            ),
            (ended(Some(RETRYABLE)), Next::Retry),
            (
                Ended {
                    output: true,
                    ..ended(Some(RETRYABLE))
                },
                Next::Continue,
            ),
            (
                Ended {
                    output: true,
                    calls: true,
                    ..ended(Some(RETRYABLE))
                },
                Next::Fail,
            ),
            (
                Ended {
                    retries: MAX_RETRIES,
                    ..ended(Some(RETRYABLE))
                },
                Next::Fail,
            ),
            (
                Ended {
                    retries: MAX_RETRIES - 1,
                    output: true,
                    ..ended(Some(RETRYABLE))
                },
                Next::Continue,
            ),
            (ended(Some(FINAL)), Next::Fail),
        ];
        for (ended, expected) in table {
            assert_eq!(next(&ended), expected, "{ended:?}");
        }
    }

    #[test]
    fn the_backoff_doubles_from_two_seconds_and_honours_retry_after_up_to_a_cap() {
        assert_eq!(delay(1, None, 1.0), Duration::from_secs(2));
        assert_eq!(delay(3, None, 1.0), Duration::from_secs(8));
        assert_eq!(delay(1, None, 0.8), Duration::from_millis(1600));
        let after = Some(Duration::from_secs(30));
        assert_eq!(delay(1, after, 1.2), Duration::from_secs(30));
        let huge = Some(Duration::from_secs(3600));
        assert_eq!(delay(1, huge, 1.0), RETRY_AFTER_CAP);
    }
}
