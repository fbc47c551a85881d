//! [`BoundCounter`] and [`BoundHistogram`]: a metric key with the handle the recorder in use
//! gave for it, so that a request records into the handle instead of looking its key up in the
//! recorder's registry every time (hashing the key and its labels, comparing them, taking the
//! registry's lock: about a thousand instructions per metric and request under
//! `metrics-exporter-prometheus`).
//!
//! A handle belongs to the recorder that made it. Each use asks `metrics` which recorder is in
//! use now (the global one, or a thread's local one) and records into the kept handle only when
//! that is the recorder the handle came from; under any other recorder it looks the key up as
//! `metrics::counter!` would. So installing a recorder after the metric was first used, or a
//! test's local recorder, sees every increment: caching changes the cost, never the counts.

use std::sync::OnceLock;

use metrics::{Counter, Histogram, Key, Level, Metadata, Recorder};

/// What idem's metrics say of themselves to the recorder (as `metrics::counter!` would).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Which recorder `recorder` is: its address. `None` for a recorder of no size (`metrics`'
/// no-op recorder, say), whose address says nothing and whose lookups cost nothing anyway.
///
/// A global recorder lives for the rest of the program, so its address is never another's. A
/// local recorder's address can be taken by a later local recorder once it is dropped (tests
/// make one per test, on stacks that the next test's thread reuses), and a handle kept from the
/// first would then count into the dropped one: keep a bound metric with the service that
/// records into it (made per test), not in a `static`.
fn recorder_id(recorder: &dyn Recorder) -> Option<usize> {
    if std::mem::size_of_val(recorder) == 0 {
        return None;
    }
    Some(std::ptr::from_ref(recorder).cast::<()>() as usize)
}

/// A handle kept with the recorder it came from.
#[derive(Debug)]
struct Kept<H> {
    recorder: usize,
    handle: H,
}

/// The handle of `key` under the recorder in use: the kept one when it came from that
/// recorder, else a new one from `register` (kept if none was).
fn with_handle<H: Clone>(
    key: &Key,
    kept: &OnceLock<Kept<H>>,
    register: fn(&dyn Recorder, &Key, &Metadata<'_>) -> H,
    use_handle: impl FnOnce(&H),
) {
    metrics::with_recorder(|recorder| {
        let id = recorder_id(recorder);
        if let (Some(id), Some(handle)) = (id, kept.get()) {
            if handle.recorder == id {
                return use_handle(&handle.handle);
            }
        }
        let handle = register(recorder, key, &METADATA);
        use_handle(&handle);
        if let Some(id) = id {
            let _ = kept.set(Kept {
                recorder: id,
                handle,
            });
        }
    });
}

/// A counter's key and the handle the recorder gave for it. Each increment goes to the
/// recorder in use (a recorder installed later, or a test's local one, sees every count); the
/// handle is reused only under the recorder it came from, known by its address. Keep it with
/// the service that counts into it, not in a `static`: a dropped local recorder's address can
/// be taken by the next one, which would then miss the counts.
///
/// ```
/// use idem_lease::BoundCounter;
/// use metrics::Key;
///
/// let orders = BoundCounter::new(Key::from_static_name("orders_total"));
/// orders.increment(1); // no recorder installed: counts nowhere, costs next to nothing
/// assert_eq!(orders.key().name(), "orders_total");
/// ```
#[derive(Debug)]
pub struct BoundCounter {
    key: Key,
    kept: OnceLock<Kept<Counter>>,
}

impl BoundCounter {
    /// The counter `key`; its handle is taken on first use.
    #[must_use]
    pub const fn new(key: Key) -> Self {
        BoundCounter {
            key,
            kept: OnceLock::new(),
        }
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Adds `value` to the counter in the recorder in use.
    pub fn increment(&self, value: u64) {
        with_handle(
            &self.key,
            &self.kept,
            |recorder, key, metadata| recorder.register_counter(key, metadata),
            |counter| counter.increment(value),
        );
    }
}

/// A histogram's key and the handle the recorder gave for it. Keep it with the service that
/// records into it, as [`BoundCounter`].
#[derive(Debug)]
pub struct BoundHistogram {
    key: Key,
    kept: OnceLock<Kept<Histogram>>,
}

impl BoundHistogram {
    /// The histogram `key`; its handle is taken on first use.
    #[must_use]
    pub const fn new(key: Key) -> Self {
        BoundHistogram {
            key,
            kept: OnceLock::new(),
        }
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Records `value` into the histogram in the recorder in use.
    pub fn record(&self, value: f64) {
        with_handle(
            &self.key,
            &self.kept,
            |recorder, key, metadata| recorder.register_histogram(key, metadata),
            |histogram| histogram.record(value),
        );
    }
}

#[cfg(test)]
mod tests {
    use idem_testkit::recorder::CountingRecorder;

    use super::*;

    #[test]
    fn every_increment_reaches_the_recorder_in_use_whichever_it_is() {
        let counter = BoundCounter::new(Key::from_static_name("bound_total"));
        let histogram = BoundHistogram::new(Key::from_static_name("bound_seconds"));
        counter.increment(1); // the no-op recorder: nothing kept
        let first = CountingRecorder::default();
        let second = CountingRecorder::default();
        metrics::with_local_recorder(&first, || {
            counter.increment(1);
            counter.increment(2);
            histogram.record(0.5);
        });
        metrics::with_local_recorder(&second, || {
            counter.increment(5);
            histogram.record(0.5);
        });
        metrics::with_local_recorder(&first, || counter.increment(4));
        assert_eq!(first.get("bound_total{}"), 7);
        assert_eq!(second.get("bound_total{}"), 5);
        assert_eq!(first.get("bound_seconds{}"), 1);
        assert_eq!(second.get("bound_seconds{}"), 1);
    }
}
