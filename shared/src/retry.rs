//! The retry policy, apart from the mechanism that carries it out.
//!
//! Delays grow exponentially from `HOOKINBOX_RETRY_BASE_MS` (`backon`),
//! are capped at `HOOKINBOX_RETRY_MAX_MS`, and only then jittered: each
//! delay `d` becomes a random value in `[d/2, d]`. Jitter after the cap
//! keeps retries at the cap spread out rather than in lockstep, and never
//! above the maximum. A handler's own "retry after" wins, bounded by the
//! same cap. The policy knows classes,
//! not error types; the mechanism — parked bodies, `next_attempt_at`, the
//! scheduler — lives in [`crate::deliveries`] and the worker's runtime.

use std::time::Duration;

use backon::BackoffBuilder;

use crate::deliveries::{ErrorClass, Failure};

/// When and how often a transient failure is retried.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// The first retry's delay (before jitter).
    pub base: Duration,
    /// No delay is longer than this.
    pub max: Duration,
    /// Takes allowed in all; the last failure is dead-lettered.
    pub max_attempts: i32,
}

impl RetryPolicy {
    /// The delay after the `attempt`-th take failed (1-based): `d =
    /// base·2^(attempt-1)`, capped at `max`, then a random value in
    /// `[d/2, d]`.
    pub fn delay(&self, attempt: i32) -> Duration {
        let n = usize::try_from(attempt.max(1)).unwrap_or(1);
        let capped = backon::ExponentialBuilder::default()
            .with_min_delay(self.base)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .with_max_times(n)
            .build()
            .nth(n - 1)
            .unwrap_or(self.max)
            .min(self.max);
        capped.mul_f64(rand::random_range(0.5..=1.0))
    }

    /// Decides how a failure of `class` after `attempts` takes is recorded:
    /// retried after a delay (the one the far side asked for, capped, or
    /// the policy's), or failed for good: permanent failures at once,
    /// others once attempts run out, as `max_attempts`.
    pub fn decide(
        &self,
        class: ErrorClass,
        message: String,
        retry_after: Option<Duration>,
        attempts: i32,
    ) -> Failure {
        decide(
            class,
            message,
            attempts,
            self.max_attempts,
            || match retry_after {
                Some(asked) => asked.min(self.max),
                None => self.delay(attempts),
            },
        )
    }
}

/// The one rule of both policies: a permanent failure is final at once, a
/// failure at `max_attempts` is final as `max_attempts`, and anything else
/// is retried after `delay()`.
fn decide(
    class: ErrorClass,
    message: String,
    attempts: i32,
    max_attempts: i32,
    delay: impl FnOnce() -> Duration,
) -> Failure {
    if class == ErrorClass::Permanent {
        return Failure {
            class,
            message,
            retry_in: None,
        };
    }
    if attempts >= max_attempts {
        return Failure {
            class: ErrorClass::MaxAttempts,
            message: format!("{attempts} attempts failed; last: {message}"),
            retry_in: None,
        };
    }
    Failure {
        class,
        message,
        retry_in: Some(delay()),
    }
}

/// A destination's schedule: the delay after each failed attempt, in
/// order, so that attempts = delays + 1. Each delay `d` is jittered to a
/// random value in `[0.8·d, d]`: enough to keep a fleet's retries apart,
/// little enough that a schedule meant to outlast an outage still does.
/// A far side's "retry after" wins, capped at the longest delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    delays: Vec<Duration>,
}

/// The least jitter leaves of a scheduled delay.
const SCHEDULE_JITTER_FLOOR: f64 = 0.8;

impl Schedule {
    /// A schedule of at least one delay.
    pub fn new(delays: Vec<Duration>) -> Option<Self> {
        (!delays.is_empty()).then_some(Self { delays })
    }

    /// A schedule from a fixed list, checked to be non-empty when compiled.
    pub fn of<const N: usize>(delays: [Duration; N]) -> Self {
        const { assert!(N > 0, "a schedule has at least one delay") };
        Self {
            delays: delays.to_vec(),
        }
    }

    /// The delays, in order.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// Attempts in all: one more than the delays.
    pub fn max_attempts(&self) -> i32 {
        i32::try_from(self.delays.len())
            .unwrap_or(i32::MAX - 1)
            .saturating_add(1)
    }

    /// The longest delay: the cap of a far side's "retry after".
    pub fn longest(&self) -> Duration {
        self.delays.iter().copied().max().unwrap_or_default()
    }

    /// The sum of the delays: how long retries span before the last attempt.
    pub fn span(&self) -> Duration {
        self.delays.iter().sum()
    }

    /// The delay after the `attempt`-th take failed (1-based), jittered.
    pub fn delay(&self, attempt: i32) -> Duration {
        let i = usize::try_from(attempt.max(1) - 1).unwrap_or(0);
        let d = self
            .delays
            .get(i)
            .or(self.delays.last())
            .copied()
            .unwrap_or_default();
        d.mul_f64(rand::random_range(SCHEDULE_JITTER_FLOOR..=1.0))
    }
}

/// How a destination retries: the exponential policy, or a schedule.
#[derive(Clone, Debug)]
pub enum Retries {
    /// Exponential backoff from the global settings.
    Exponential(RetryPolicy),
    /// The destination's own delays.
    Schedule(Schedule),
}

impl Retries {
    /// Takes allowed in all.
    pub fn max_attempts(&self) -> i32 {
        match self {
            Self::Exponential(policy) => policy.max_attempts,
            Self::Schedule(schedule) => schedule.max_attempts(),
        }
    }

    /// The longest single wait: the cap of a far side's "retry after".
    pub fn longest(&self) -> Duration {
        match self {
            Self::Exponential(policy) => policy.max,
            Self::Schedule(schedule) => schedule.longest(),
        }
    }

    /// How long a leg's retries may span: the schedule's delays in all,
    /// or the exponential policy's capped delays before the last attempt.
    /// A deferred leg's next time may not fall later than this after its
    /// first deferral.
    pub fn horizon(&self) -> Duration {
        match self {
            Self::Exponential(policy) => {
                // Doubling until the cap (at most 32 steps), then the cap
                // for each delay left.
                let delays = u32::try_from(policy.max_attempts.max(1) - 1).unwrap_or(0);
                let mut total = Duration::ZERO;
                let mut d = policy.base;
                let mut i = 0;
                while i < delays && d < policy.max && i < 32 {
                    total = total.saturating_add(d);
                    d = d.saturating_mul(2);
                    i += 1;
                }
                total.saturating_add(policy.max.saturating_mul(delays - i))
            }
            Self::Schedule(schedule) => schedule.span(),
        }
    }

    /// As [`RetryPolicy::decide`], under this destination's policy.
    pub fn decide(
        &self,
        class: ErrorClass,
        message: String,
        retry_after: Option<Duration>,
        attempts: i32,
    ) -> Failure {
        match self {
            Self::Exponential(policy) => policy.decide(class, message, retry_after, attempts),
            Self::Schedule(schedule) => decide(
                class,
                message,
                attempts,
                schedule.max_attempts(),
                || match retry_after {
                    Some(asked) => asked.min(schedule.longest()),
                    None => schedule.delay(attempts),
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_within_jitter_bounds_and_respect_the_cap() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
            max_attempts: 10,
        };
        for _ in 0..200 {
            for attempt in 1..=8 {
                let d = Duration::from_millis(100 * (1 << (attempt - 1))).min(policy.max);
                let got = policy.delay(attempt);
                assert!(got >= d / 2, "attempt {attempt}: {got:?} < {:?}", d / 2);
                assert!(got <= d, "attempt {attempt}: {got:?} > {d:?}");
            }
        }
    }

    #[test]
    fn delays_at_the_cap_are_spread_and_stay_within_the_maximum() {
        let policy = RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(600),
            max_attempts: 20,
        };
        // Attempt 15 would be 1 s·2^14, far past the cap.
        let delays: Vec<Duration> = (0..500).map(|_| policy.delay(15)).collect();
        assert!(
            delays
                .iter()
                .all(|d| *d <= policy.max && *d >= policy.max / 2)
        );
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 450, "{} distinct delays", distinct.len());
        let (low, high) = (delays.iter().min(), delays.iter().max());
        assert!(
            low.is_some_and(|d| *d < Duration::from_secs(360)),
            "{low:?}"
        );
        assert!(
            high.is_some_and(|d| *d > Duration::from_secs(540)),
            "{high:?}"
        );
    }

    #[test]
    fn retry_after_wins_but_is_capped() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_attempts: 5,
        };
        let asked = Some(Duration::from_secs(2));
        assert_eq!(
            policy
                .decide(ErrorClass::Transient, "busy".into(), asked, 1)
                .retry_in,
            Some(Duration::from_secs(2))
        );
        let greedy = Some(Duration::from_secs(3600));
        assert_eq!(
            policy
                .decide(ErrorClass::Transient, "busy".into(), greedy, 1)
                .retry_in,
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn a_schedule_follows_its_delays_within_its_jitter_then_ends() {
        let schedule =
            Schedule::new(vec![Duration::from_secs(5), Duration::from_secs(60)]).expect("delays");
        let retries = Retries::Schedule(schedule.clone());
        assert_eq!(retries.max_attempts(), 3);
        for _ in 0..200 {
            let first = retries
                .decide(ErrorClass::Transient, "down".into(), None, 1)
                .retry_in
                .expect("retried");
            assert!(first >= Duration::from_secs(4) && first <= Duration::from_secs(5));
            let second = retries
                .decide(ErrorClass::Timeout, "slow".into(), None, 2)
                .retry_in
                .expect("retried");
            assert!(second >= Duration::from_secs(48) && second <= Duration::from_secs(60));
        }
        let last = retries.decide(ErrorClass::Transient, "down".into(), None, 3);
        assert_eq!((last.class, last.retry_in), (ErrorClass::MaxAttempts, None));
        let asked = retries.decide(
            ErrorClass::Transient,
            "busy".into(),
            Some(Duration::from_secs(3600)),
            1,
        );
        assert_eq!(asked.retry_in, Some(Duration::from_secs(60)));
        assert_eq!(schedule.span(), Duration::from_secs(65));
        assert!(Schedule::new(Vec::new()).is_none());
    }

    #[test]
    fn permanent_is_never_retried_and_exhausted_is_max_attempts() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_attempts: 3,
        };
        let f = policy.decide(ErrorClass::Permanent, "no".into(), None, 1);
        assert_eq!((f.class, f.retry_in), (ErrorClass::Permanent, None));
        let f = policy.decide(ErrorClass::Transient, "later".into(), None, 3);
        assert_eq!((f.class, f.retry_in), (ErrorClass::MaxAttempts, None));
        let f = policy.decide(ErrorClass::Transient, "later".into(), None, 2);
        assert_eq!(f.class, ErrorClass::Transient);
        assert!(f.retry_in.is_some());
    }

    #[test]
    fn the_horizon_is_what_the_retries_span() {
        let schedule = Retries::Schedule(Schedule::of([
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(300),
        ]));
        assert_eq!(schedule.horizon(), Duration::from_secs(365));
        // 1, 2, 4, 8, 16, 32, then the cap: seven delays before the 8th take.
        let exponential = Retries::Exponential(RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
            max_attempts: 8,
        });
        assert_eq!(exponential.horizon(), Duration::from_secs(123));
        let once = Retries::Exponential(RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
            max_attempts: 1,
        });
        assert_eq!(once.horizon(), Duration::ZERO);
    }
}
