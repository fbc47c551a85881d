//! Store time: [`Timestamp`] and the [`Clock`] that produces it.
//!
//! Remote stores use the server's clock; the in-memory store takes a [`Clock`] so tests can move
//! time by hand with a [`ManualClock`] instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in store time: microseconds since the UNIX epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The UNIX epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp from microseconds since the UNIX epoch.
    #[must_use]
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// Microseconds since the UNIX epoch.
    #[must_use]
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Milliseconds since the UNIX epoch (rounded down).
    #[must_use]
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000
    }

    /// This timestamp moved forward by `by`, saturating at the end of time.
    #[must_use]
    pub fn saturating_add(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_micros(by)))
    }

    /// This timestamp moved back by `by`, saturating at the epoch.
    #[must_use]
    pub fn saturating_sub(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_micros(by)))
    }

    /// How long after `earlier` this timestamp is; zero if it is not after it.
    #[must_use]
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// A duration in whole microseconds, saturating at `u64::MAX`.
#[must_use]
pub(crate) fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of store time.
///
/// Object safe: stores hold an `Arc<dyn Clock>`.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(duration_micros(since_epoch))
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
/// let other = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(other.now(), Timestamp::from_micros(3_000_000));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A manual clock standing at `start`.
    #[must_use]
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = duration_micros(by);
        // fetch_update with a closure that always returns Some never fails.
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |m| {
                Some(m.saturating_add(by))
            });
    }

    /// Sets the clock to `to` (it may move backwards: tests of clock skew use that).
    pub fn set(&self, to: Timestamp) {
        self.micros.store(to.as_micros(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.micros.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
