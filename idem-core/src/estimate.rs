//! [`ClockEstimate`]: a remote store's clock, estimated from a local clock and a measured
//! offset, with a bounded error.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::time::{Clock, Timestamp, duration_micros};

/// A remote store's clock as `local` clock plus an offset measured against the server (Redis
/// `TIME`, PostgreSQL `now()`).
///
/// The error bound of [`ClockEstimate::now`] is half the round trip of the last measurement
/// (the server read its clock somewhere within it) plus [`ClockEstimate::DRIFT_ALLOWANCE`],
/// provided the store measures again every [`ClockEstimate::REFRESH`] and the local clock is not stepped in between (a
/// step of the local wall clock moves the estimate until the next measurement). Every handle of
/// a key decides on such an estimate of the one server clock, so two handles whose local clocks
/// disagree by hours still agree within the sum of their bounds.
#[derive(Debug)]
pub struct ClockEstimate {
    local: Arc<dyn Clock>,
    offset_micros: AtomicI64,
    bound_micros: AtomicU64,
}

impl ClockEstimate {
    /// What the local clock may drift from the server's between two measurements: 100 ppm (a
    /// poor quartz) over [`ClockEstimate::REFRESH`] is 3 ms; 5 ms leaves room.
    pub const DRIFT_ALLOWANCE: Duration = Duration::from_millis(5);

    /// How often a store measures the offset again.
    pub const REFRESH: Duration = Duration::from_secs(30);

    /// An estimate on `local`, with no offset measured yet (a bound of zero).
    #[must_use]
    pub fn new(local: Arc<dyn Clock>) -> Self {
        ClockEstimate {
            local,
            offset_micros: AtomicI64::new(0),
            bound_micros: AtomicU64::new(0),
        }
    }

    /// The local clock's time (read it just before and just after asking the server).
    #[must_use]
    pub fn local_now(&self) -> Timestamp {
        self.local.now()
    }

    /// Records a measurement: the local clock read `sent` before the question and `received`
    /// after the answer, and the server answered `server`.
    pub fn measured(&self, sent: Timestamp, server: Timestamp, received: Timestamp) {
        let half_trip = received.saturating_since(sent) / 2;
        let midpoint = sent.saturating_add(half_trip);
        let offset = i128::from(server.as_micros()) - i128::from(midpoint.as_micros());
        let offset = i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX });
        let bound = duration_micros(half_trip.saturating_add(Self::DRIFT_ALLOWANCE));
        self.offset_micros.store(offset, Ordering::SeqCst);
        self.bound_micros.store(bound, Ordering::SeqCst);
    }

    /// The estimated server time.
    #[must_use]
    pub fn now(&self) -> Timestamp {
        let local = i128::from(self.local.now().as_micros());
        let offset = i128::from(self.offset_micros.load(Ordering::SeqCst));
        let micros = (local + offset).clamp(0, i128::from(u64::MAX));
        Timestamp::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// How far [`ClockEstimate::now`] may be from the server's clock.
    #[must_use]
    pub fn bound(&self) -> Duration {
        Duration::from_micros(self.bound_micros.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ManualClock;

    #[test]
    fn skewed_local_clocks_estimate_the_same_server_time() {
        let server = Timestamp::from_micros(5_000_000_000);
        let fast = ManualClock::new(Timestamp::from_micros(9_000_000_000));
        let slow = ManualClock::new(Timestamp::from_micros(1_000_000_000));
        let estimates = [fast.clone(), slow.clone()].map(|clock| {
            let estimate = ClockEstimate::new(Arc::new(clock.clone()));
            let sent = estimate.local_now();
            clock.advance(Duration::from_millis(2));
            let received = estimate.local_now();
            estimate.measured(
                sent,
                server.saturating_add(Duration::from_millis(1)),
                received,
            );
            estimate
        });
        for estimate in &estimates {
            // The server read its clock half way through the round trip: 1 ms before now.
            assert_eq!(
                estimate.now(),
                server.saturating_add(Duration::from_millis(2))
            );
            assert_eq!(
                estimate.bound(),
                Duration::from_millis(1) + ClockEstimate::DRIFT_ALLOWANCE
            );
        }
        fast.advance(Duration::from_secs(3));
        assert_eq!(
            estimates[0].now(),
            server.saturating_add(Duration::from_millis(3_002))
        );
    }
}
