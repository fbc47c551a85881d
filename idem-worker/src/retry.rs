//! [`RetryPolicy`] and the [`Disposition`] a queue consumer applies to a message.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

/// What the consumer should do with the message it ran the job for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Done (executed or replayed): acknowledge the message.
    Ack,
    /// Deliver the message again after `after` (NATS: `nak` with a delay; RabbitMQ: a delayed
    /// republish or `nack` with requeue).
    Retry {
        /// How long to wait before the next delivery.
        after: Duration,
    },
    /// Give up on the message: a permanent failure, a key reused with another payload, or
    /// the retry budget spent (NATS: `term`; RabbitMQ: `nack` without requeue into a
    /// dead-letter exchange).
    DeadLetter,
}

impl Disposition {
    /// `ack`, `retry` or `dead_letter`: a stable name for metrics labels and logs.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Disposition::Ack => "ack",
            Disposition::Retry { .. } => "retry",
            Disposition::DeadLetter => "dead_letter",
        }
    }
}

impl fmt::Display for Disposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disposition::Retry { after } => write!(f, "retry after {after:?}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// A [`RetryPolicy`] setting was out of range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// The multiplier is below 1 or not a finite number.
    #[error("the backoff multiplier is {0}: it must be a finite number of at least 1")]
    Multiplier(f64),
    /// The initial delay is longer than the maximum delay.
    #[error("the initial delay {initial:?} is longer than the maximum delay {max:?}")]
    InitialOverMax {
        /// The initial delay.
        initial: Duration,
        /// The maximum delay.
        max: Duration,
    },
    /// The jitter fraction is outside `0.0..=1.0`.
    #[error("the jitter is {0}: it must be between 0 and 1")]
    Jitter(f64),
}

/// Exponential backoff with jitter and a bounded number of attempts.
///
/// The delay before delivery `n + 1` (after delivery `n` failed) is
/// `base(n) = min(max_delay, initial * multiplier^(n - 1))`, of which the `jitter` fraction is
/// random: the delay lies in `[base * (1 - jitter), base]`. Once delivery `max_attempts` has
/// failed, the message is dead-lettered instead.
///
/// Defaults: initial 1 s, multiplier 2, max delay 5 min, jitter 0.5, 10 attempts.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use idem_worker::{Disposition, RetryPolicy};
///
/// let policy = RetryPolicy::default()
///     .with_initial_delay(Duration::from_millis(100))
///     .with_max_attempts(NonZeroU32::new(3).unwrap());
/// assert!(matches!(policy.after_failure(1), Disposition::Retry { after } if after <= Duration::from_millis(100)));
/// assert_eq!(policy.after_failure(3), Disposition::DeadLetter);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct RetryPolicy {
    initial: Duration,
    multiplier: f64,
    max_delay: Duration,
    jitter: f64,
    max_attempts: NonZeroU32,
}

impl Default for RetryPolicy {
    /// Initial 1 s, multiplier 2, max delay 5 min, jitter 0.5, 10 attempts.
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: 0.5,
            max_attempts: NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN),
        }
    }
}

impl RetryPolicy {
    /// The delay after the first failure (before jitter). Capped at the maximum delay.
    pub fn with_initial_delay(mut self, initial: Duration) -> Self {
        self.initial = initial.min(self.max_delay);
        self
    }

    /// How much each further failure multiplies the delay by.
    ///
    /// # Errors
    /// [`RetryPolicyError::Multiplier`] unless `multiplier` is finite and at least 1.
    pub fn with_multiplier(mut self, multiplier: f64) -> Result<Self, RetryPolicyError> {
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(RetryPolicyError::Multiplier(multiplier));
        }
        self.multiplier = multiplier;
        Ok(self)
    }

    /// The longest delay.
    ///
    /// # Errors
    /// [`RetryPolicyError::InitialOverMax`] if it is shorter than the initial delay.
    pub fn with_max_delay(mut self, max_delay: Duration) -> Result<Self, RetryPolicyError> {
        if max_delay < self.initial {
            return Err(RetryPolicyError::InitialOverMax {
                initial: self.initial,
                max: max_delay,
            });
        }
        self.max_delay = max_delay;
        Ok(self)
    }

    /// The random fraction of each delay: 0 for none, 1 for "full jitter".
    ///
    /// # Errors
    /// [`RetryPolicyError::Jitter`] outside `0.0..=1.0`.
    pub fn with_jitter(mut self, jitter: f64) -> Result<Self, RetryPolicyError> {
        if !(0.0..=1.0).contains(&jitter) {
            return Err(RetryPolicyError::Jitter(jitter));
        }
        self.jitter = jitter;
        Ok(self)
    }

    /// How many deliveries a message gets before it is dead-lettered.
    pub fn with_max_attempts(mut self, max_attempts: NonZeroU32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The number of deliveries before a message is dead-lettered.
    #[must_use]
    pub fn max_attempts(&self) -> NonZeroU32 {
        self.max_attempts
    }

    /// The longest delay.
    #[must_use]
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The delay after failed delivery `delivery` (1-based) before jitter.
    #[must_use]
    pub fn base_delay(&self, delivery: u32) -> Duration {
        let exponent = i32::try_from(delivery.saturating_sub(1)).unwrap_or(i32::MAX);
        let seconds = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        if seconds.is_nan() {
            // 0 x infinity: a zero initial delay stays zero, however many deliveries.
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(seconds)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }

    /// The delay after failed delivery `delivery`, with the jitter drawn from `unit` (a number
    /// in `0.0..=1.0`; values outside are clamped).
    #[must_use]
    pub fn delay_with(&self, delivery: u32, unit: f64) -> Duration {
        let base = self.base_delay(delivery);
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        let cut = (self.jitter * unit).clamp(0.0, 1.0);
        base.mul_f64(1.0 - cut).min(base)
    }

    /// The delay after failed delivery `delivery`, with random jitter.
    #[must_use]
    pub fn delay(&self, delivery: u32) -> Duration {
        self.delay_with(delivery, rand::random::<f64>())
    }

    /// What to do after delivery `delivery` (1-based) failed in a way a retry may cure:
    /// retry after a backoff delay, or dead-letter once the attempts are spent.
    #[must_use]
    pub fn after_failure(&self, delivery: u32) -> Disposition {
        self.after_failure_with(delivery, rand::random::<f64>())
    }

    /// [`RetryPolicy::after_failure`] with the jitter drawn from `unit`.
    #[must_use]
    pub fn after_failure_with(&self, delivery: u32, unit: f64) -> Disposition {
        if delivery >= self.max_attempts.get() {
            Disposition::DeadLetter
        } else {
            Disposition::Retry {
                after: self.delay_with(delivery, unit),
            }
        }
    }

    /// What to do after delivery `delivery` failed but the job must wait `at_least` (a lease to
    /// run out) before it can run again: retry after the longer of the backoff and `at_least`,
    /// or dead-letter once the attempts are spent.
    #[must_use]
    pub fn after_failure_waiting(&self, delivery: u32, at_least: Duration) -> Disposition {
        match self.after_failure(delivery) {
            Disposition::Retry { after } => Disposition::Retry {
                after: after.max(at_least),
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> impl Strategy<Value = RetryPolicy> {
        (
            0u64..10_000,
            1.0f64..10.0,
            0u64..1_000_000,
            0.0f64..=1.0,
            1u32..50,
        )
            .prop_map(|(initial, multiplier, extra, jitter, attempts)| {
                let initial = Duration::from_millis(initial);
                RetryPolicy::default()
                    .with_max_delay(Duration::from_secs(3_600))
                    .unwrap()
                    .with_initial_delay(initial)
                    .with_max_delay(initial + Duration::from_millis(extra))
                    .unwrap()
                    .with_multiplier(multiplier)
                    .unwrap()
                    .with_jitter(jitter)
                    .unwrap()
                    .with_max_attempts(NonZeroU32::new(attempts).unwrap())
            })
    }

    #[test]
    fn defaults_back_off_exponentially() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.base_delay(1), Duration::from_secs(1));
        assert_eq!(policy.base_delay(2), Duration::from_secs(2));
        assert_eq!(policy.base_delay(4), Duration::from_secs(8));
        assert_eq!(policy.base_delay(100), Duration::from_secs(300));
        assert_eq!(policy.base_delay(u32::MAX), Duration::from_secs(300));
        assert_eq!(policy.delay_with(2, 1.0), Duration::from_secs(1));
        assert_eq!(policy.after_failure(10), Disposition::DeadLetter);
    }

    #[test]
    fn a_zero_initial_delay_stays_zero_for_every_delivery() {
        let policy = RetryPolicy::default().with_initial_delay(Duration::ZERO);
        for delivery in [0, 1, 2, 1_000, 1_100, u32::MAX] {
            assert_eq!(
                policy.base_delay(delivery),
                Duration::ZERO,
                "delivery {delivery}"
            );
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(RetryPolicy::default().with_multiplier(0.5).is_err());
        assert!(RetryPolicy::default().with_multiplier(f64::NAN).is_err());
        assert!(RetryPolicy::default().with_jitter(1.5).is_err());
        assert!(
            RetryPolicy::default()
                .with_max_delay(Duration::from_millis(1))
                .is_err()
        );
    }

    proptest! {
        #[test]
        fn delays_stay_within_the_bounds(policy in policy(), delivery in 0u32..200, unit in -1.0f64..2.0) {
            let delay = policy.delay_with(delivery, unit);
            let base = policy.base_delay(delivery);
            prop_assert!(delay <= base);
            prop_assert!(delay <= policy.max_delay());
            let floor = base.mul_f64(1.0 - policy.jitter);
            // One microsecond of slack for float rounding.
            prop_assert!(delay + Duration::from_micros(1) >= floor, "{delay:?} < {floor:?}");
        }

        #[test]
        fn base_delays_never_shrink(policy in policy(), delivery in 1u32..200) {
            prop_assert!(policy.base_delay(delivery + 1) >= policy.base_delay(delivery));
        }

        #[test]
        fn attempts_are_bounded(policy in policy(), delivery in 0u32..100) {
            let disposition = policy.after_failure(delivery);
            if delivery >= policy.max_attempts().get() {
                prop_assert_eq!(disposition, Disposition::DeadLetter);
            } else {
                let bounded = matches!(disposition, Disposition::Retry { after } if after <= policy.max_delay());
                prop_assert!(bounded, "{:?}", disposition);
            }
        }

        #[test]
        fn waiting_retries_wait_at_least(policy in policy(), delivery in 0u32..100, wait in 0u64..100_000) {
            let wait = Duration::from_millis(wait);
            match policy.after_failure_waiting(delivery, wait) {
                Disposition::Retry { after } => prop_assert!(after >= wait),
                Disposition::DeadLetter => prop_assert!(delivery >= policy.max_attempts().get()),
                Disposition::Ack => prop_assert!(false, "a failure is never acked"),
            }
        }
    }
}
