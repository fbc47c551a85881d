//! [`RecentDurations`]: how long the layer's requests held their key lately, to tell a
//! duplicate answered 409 when to come back.
//!
//! The rule (`Retry-After` of a 409): the layer keeps a moving average of how long its requests
//! held their key, from the claim to the stored response or the release (an exponentially
//! weighted average, each new duration weighing a quarter). A duplicate is told that average
//! minus how long the original has run. When the original has already run longer than the
//! average (or there is no history yet), the average says nothing about it: the duplicate is
//! told the original's age instead (a request that has run 4 s is likely to need about as
//! long again), so a slow request's duplicates come back less and less often rather than
//! every second. Either is bounded by the time left on the original's lease, and at least one
//! second (`Retry-After` is in whole seconds, rounded up). How long the original has run is read
//! from its lease: the lease minus the time left on it, which is exact until the original's
//! first heartbeat and a lower bound after it (a heartbeat renews the lease), so a long
//! request's estimate may come late but never after its lease.
//!
//! One atomic word, read on a 409 and written once per request that held a key: no lock on
//! the request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The moving average of how long requests held their key, in microseconds; 0: no history.
#[derive(Debug, Default)]
pub(crate) struct RecentDurations {
    average_micros: AtomicU64,
}

impl RecentDurations {
    /// Adds the duration of a request that held its key.
    pub(crate) fn record(&self, held: Duration) {
        let sample = u64::try_from(held.as_micros()).unwrap_or(u64::MAX).max(1);
        // A lost update between two requests that finish at once only skips one sample.
        let old = self.average_micros.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 4 + sample / 4
        };
        self.average_micros.store(new.max(1), Ordering::Relaxed);
    }

    /// When a duplicate should come back, given the lease of the original (`lease`) and the
    /// time left on it (`lease_left`).
    pub(crate) fn retry_after(&self, lease: Duration, lease_left: Duration) -> Duration {
        let average = Duration::from_micros(self.average_micros.load(Ordering::Relaxed));
        let ran = lease.saturating_sub(lease_left);
        let estimate = if average > ran { average - ran } else { ran };
        estimate.min(lease_left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn no_history_gives_the_originals_age() {
        let recent = RecentDurations::default();
        assert_eq!(recent.retry_after(LEASE, secs(26)), secs(4));
        // Just started: the header says 1.
        assert_eq!(recent.retry_after(LEASE, LEASE), Duration::ZERO);
        // Bounded by the lease left.
        assert_eq!(recent.retry_after(LEASE, secs(10)), secs(10));
    }

    #[test]
    fn the_average_less_what_the_original_ran_bounded_by_the_lease_left() {
        let recent = RecentDurations::default();
        recent.record(secs(5));
        // The original started 1 s ago: 4 s to go.
        assert_eq!(recent.retry_after(LEASE, secs(29)), secs(4));
        // It ran past the average: as long again as it has run.
        assert_eq!(recent.retry_after(LEASE, secs(20)), secs(10));
        // A longer average is bounded by the lease left.
        let slow = RecentDurations::default();
        slow.record(secs(100));
        assert_eq!(slow.retry_after(LEASE, secs(25)), secs(25));
        // A lease left longer than this layer's lease (another instance's): nothing ran yet.
        assert_eq!(recent.retry_after(LEASE, secs(60)), secs(5));
    }

    #[test]
    fn recent_durations_weigh_a_quarter() {
        let recent = RecentDurations::default();
        recent.record(secs(8));
        recent.record(secs(4));
        assert_eq!(recent.retry_after(LEASE, LEASE), secs(7));
        recent.record(Duration::MAX);
        assert!(recent.retry_after(LEASE, LEASE) <= LEASE);
        recent.record(Duration::ZERO);
    }
}
