//! [`BeatTimer`]: one timer for the first heartbeat of many leases.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

/// One timer for the first heartbeat of many leases.
///
/// Most work under a lease ends long before its first heartbeat is due (a request answered in
/// milliseconds, under a heartbeat of seconds). Arming a timer of its own for each one (a
/// timer-wheel entry, the future that sleeps on it, and its removal) costs more than the rest
/// of what waiting adds to the work. Instead, each holder registers an instant and its waker in
/// one slot table; one task per [`BeatTimer`] wakes, every period, the holders whose instant has
/// passed, and runs only while some holder is registered. A holder is woken at most one period
/// after its instant, so it registers one period before its first beat
/// ([`BeatTimer::period`]) and, woken, starts its heartbeat for the beat's own instant
/// ([`crate::LeaseKeeper::heartbeat_at`]): its beats come exactly when they would with a timer
/// of its own, and only the work that runs that long pays for one.
///
/// ```
/// use std::time::Duration;
/// use idem_lease::BeatTimer;
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let timer = BeatTimer::new(Duration::from_millis(250));
/// let start = Instant::now();
/// let mut due = None;
/// std::future::poll_fn(|cx| {
///     let due = due.get_or_insert_with(|| timer.register(start + Duration::from_secs(1), cx));
///     due.poll_due(cx)
/// })
/// .await;
/// assert!(start.elapsed() >= Duration::from_secs(1));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct BeatTimer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    period: Duration,
    slots: Mutex<Slots>,
}

/// The registered holders, in slots reused once free.
#[derive(Debug, Default)]
struct Slots {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// How many slots are taken.
    taken: usize,
    /// Whether a task ticks for them.
    ticking: bool,
}

#[derive(Debug)]
struct Slot {
    due: Instant,
    waker: Waker,
}

fn lock(shared: &Shared) -> MutexGuard<'_, Slots> {
    shared
        .slots
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl BeatTimer {
    /// A timer that looks for due holders every `period` (at least 1 ms).
    #[must_use]
    pub fn new(period: Duration) -> Self {
        BeatTimer {
            shared: Arc::new(Shared {
                period: period.max(Duration::from_millis(1)),
                slots: Mutex::new(Slots::default()),
            }),
        }
    }

    /// The timer for heartbeats every `interval`: it looks every quarter of it.
    #[must_use]
    pub fn for_heartbeat(interval: Duration) -> Self {
        BeatTimer::new(interval / 4)
    }

    /// How often it looks for due holders: a holder is woken at most this long after its
    /// instant.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.shared.period
    }

    /// Registers a holder due at `due`, woken through `cx`'s waker once it is. Dropping the
    /// [`Due`] removes it. Without a tokio runtime, nothing ticks: the holder is woken by its
    /// own work only (and learns then that it is due).
    #[must_use]
    pub fn register(&self, due: Instant, cx: &Context<'_>) -> Due {
        let mut slots = lock(&self.shared);
        let slot = Slot {
            due,
            waker: cx.waker().clone(),
        };
        let index = match slots.free.pop() {
            Some(index) => {
                slots.slots[index] = Some(slot);
                index
            }
            None => {
                slots.slots.push(Some(slot));
                slots.slots.len() - 1
            }
        };
        slots.taken += 1;
        if !slots.ticking {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                slots.ticking = true;
                runtime.spawn(tick(self.shared.clone()));
            }
        }
        Due {
            shared: self.shared.clone(),
            index,
            due,
        }
    }
}

/// Wakes the due holders every period, until none is registered.
async fn tick(shared: Arc<Shared>) {
    // Dropped with the runtime, the task lets the next registration start another.
    let _ticking = Ticking(&shared);
    loop {
        tokio::time::sleep(shared.period).await;
        let now = Instant::now();
        let slots = lock(&shared);
        if slots.taken == 0 {
            return;
        }
        for slot in slots.slots.iter().flatten() {
            if slot.due <= now {
                slot.waker.wake_by_ref();
            }
        }
    }
}

/// Marks the ticking task gone when it ends, however it ends.
struct Ticking<'a>(&'a Shared);

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        lock(self.0).ticking = false;
    }
}

/// A holder registered with a [`BeatTimer`]; dropped, it is removed.
#[derive(Debug)]
pub struct Due {
    shared: Arc<Shared>,
    index: usize,
    due: Instant,
}

impl Due {
    /// Ready once the instant is due; else keeps `cx`'s waker to be woken by the timer.
    pub fn poll_due(&mut self, cx: &Context<'_>) -> Poll<()> {
        if Instant::now() >= self.due {
            return Poll::Ready(());
        }
        let mut slots = lock(&self.shared);
        if let Some(Some(slot)) = slots.slots.get_mut(self.index) {
            if !slot.waker.will_wake(cx.waker()) {
                slot.waker.clone_from(cx.waker());
            }
        }
        Poll::Pending
    }
}

impl Drop for Due {
    fn drop(&mut self) {
        let mut slots = lock(&self.shared);
        if let Some(slot) = slots.slots.get_mut(self.index) {
            if slot.take().is_some() {
                slots.taken -= 1;
                slots.free.push(self.index);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls a registration of `due` on `timer` until it is due; the instant it was.
    async fn woken_at(timer: &BeatTimer, due: Instant) -> Instant {
        let mut registered = None;
        std::future::poll_fn(|cx| {
            registered
                .get_or_insert_with(|| timer.register(due, cx))
                .poll_due(cx)
        })
        .await;
        Instant::now()
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_is_woken_within_a_period_of_its_instant() {
        let timer = BeatTimer::new(Duration::from_millis(100));
        let start = Instant::now();
        let due = start + Duration::from_millis(250);
        let woken = woken_at(&timer, due).await;
        assert!(woken >= due);
        assert!(
            woken <= due + Duration::from_millis(100),
            "{:?}",
            woken - due
        );
    }

    #[tokio::test(start_paused = true)]
    async fn many_holders_share_one_ticker_and_free_their_slots() {
        let timer = BeatTimer::new(Duration::from_millis(10));
        let start = Instant::now();
        let holders = (0..50u64).map(|n| {
            let timer = timer.clone();
            tokio::spawn(async move {
                woken_at(&timer, start + Duration::from_millis(n * 7)).await
                    >= start + Duration::from_millis(n * 7)
            })
        });
        for holder in holders.collect::<Vec<_>>() {
            assert!(holder.await.unwrap());
        }
        let slots = lock(&timer.shared);
        assert_eq!(slots.taken, 0);
        assert_eq!(slots.free.len(), slots.slots.len());
    }

    #[tokio::test(start_paused = true)]
    async fn the_ticker_stops_when_nobody_waits_and_starts_again() {
        let timer = BeatTimer::new(Duration::from_millis(10));
        let _ = woken_at(&timer, Instant::now() + Duration::from_millis(20)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!lock(&timer.shared).ticking);
        let due = Instant::now() + Duration::from_millis(20);
        assert!(woken_at(&timer, due).await >= due);
    }
}
