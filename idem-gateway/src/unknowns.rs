//! [`UnknownBook`]: the unknown outcomes this gateway knows of, by route, for the gauges
//! `idem_gateway_unknown_records{route}` and `idem_gateway_oldest_unknown_seconds{route}`.
//!
//! A key enters the book when an exchange of this gateway loses its answer, or when a retry
//! here is answered `outcome-unknown` (a key another gateway, or this one before a restart,
//! left unknown). It leaves when it is resolved here (reconcile, the key API, `/ui`), and at
//! each scrape the keys still in the book are read from the store (one read per key, no scan):
//! a key resolved elsewhere, expired, freed by its hold or taken by a newer attempt leaves
//! then. So the gauges count what this gateway has seen, not a scan of the whole store; `idem
//! keys list --state unknown` lists them all.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use idem_core::{Clock, Fence, RecordKey, State, Store, SystemClock, Timestamp};

/// The unknown records this gateway has seen and not seen resolved, by route, gauge.
pub(crate) const UNKNOWN_RECORDS: &str = "idem_gateway_unknown_records";
/// The age of the oldest of them, in seconds (0 when there is none), by route, gauge.
pub(crate) const OLDEST_UNKNOWN: &str = "idem_gateway_oldest_unknown_seconds";

/// At most this many keys are kept per route (beyond it, new ones are not tracked: the gauge
/// then says at least this many).
const MOST: usize = 1_000;

/// One key in the book: its fence, and when it became unknown.
#[derive(Clone, Copy, Debug)]
struct Entry {
    fence: Fence,
    since: Timestamp,
}

/// The unknown outcomes seen, by route. Shared by the serving threads.
#[derive(Debug, Default)]
pub(crate) struct UnknownBook {
    routes: Mutex<HashMap<String, HashMap<RecordKey, Entry>>>,
}

impl UnknownBook {
    /// A book with every route in `routes` at zero (so the gauges exist before the first).
    #[must_use]
    pub(crate) fn new<'a>(routes: impl IntoIterator<Item = &'a str>) -> Self {
        let routes = routes
            .into_iter()
            .map(|route| (route.to_owned(), HashMap::new()))
            .collect();
        let book = UnknownBook {
            routes: Mutex::new(routes),
        };
        book.export();
        book
    }

    /// `key` of `route` is unknown at `fence`, since `since` (the record's creation, or now).
    pub(crate) fn held(&self, route: &str, key: &RecordKey, fence: Fence, since: Timestamp) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let keys = routes.entry(route.to_owned()).or_default();
        if keys.len() < MOST || keys.contains_key(key) {
            keys.entry(key.clone())
                .and_modify(|entry| entry.fence = entry.fence.max(fence))
                .or_insert(Entry { fence, since });
        }
    }

    /// `key` was resolved here: it leaves the book, whatever its route.
    pub(crate) fn resolved(&self, key: &RecordKey) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        for keys in routes.values_mut() {
            keys.remove(key);
        }
    }

    /// Reads every key of the book from `store` and keeps those still unknown at their fence
    /// (a key the store cannot be asked about now stays), then sets the gauges.
    pub(crate) async fn refresh(&self, store: &dyn Store) {
        let tracked: Vec<(RecordKey, Fence)> = {
            let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            routes
                .values()
                .flat_map(|keys| keys.iter().map(|(key, entry)| (key.clone(), entry.fence)))
                .collect()
        };
        let now = SystemClock.now();
        let mut gone = Vec::new();
        for (key, fence) in tracked {
            if let Ok(record) = store.get(&key).await {
                let still = record.is_some_and(|record| {
                    record.state == State::Unknown
                        && record.fence == fence
                        && !record.hold_lapsed(now)
                });
                if !still {
                    gone.push(key);
                }
            }
        }
        for key in &gone {
            self.resolved(key);
        }
        self.export();
    }

    /// Sets the gauges from the book.
    #[allow(clippy::cast_precision_loss)]
    fn export(&self) {
        let now = SystemClock.now();
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        for (route, keys) in routes.iter() {
            let oldest = keys.values().map(|entry| entry.since).min();
            let age = oldest.map_or(0.0, |since| now.saturating_since(since).as_secs_f64());
            metrics::gauge!(UNKNOWN_RECORDS, "route" => route.clone()).set(keys.len() as f64);
            metrics::gauge!(OLDEST_UNKNOWN, "route" => route.clone()).set(age);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idem_core::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, UnknownOutcome};
    use idem_store_memory::MemoryStore;

    use super::*;

    fn key(text: &str) -> RecordKey {
        RecordKey::unscoped(IdempotencyKey::new(text).unwrap())
    }

    fn count(book: &UnknownBook, route: &str) -> usize {
        let routes = book.routes.lock().unwrap();
        routes.get(route).map_or(0, HashMap::len)
    }

    #[tokio::test]
    async fn keys_leave_the_book_when_resolved_here_or_elsewhere() {
        let store = MemoryStore::new();
        let book = UnknownBook::new(["pay"]);
        let request = ClaimRequest::new(key("a"), Fingerprint::of(&[b"x"]), Duration::from_secs(9));
        let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await.unwrap() else {
            panic!("not acquired");
        };
        let lost = UnknownOutcome::new("lost");
        store
            .settle_unknown(&lease, lost, None, Duration::from_secs(60))
            .await
            .unwrap();
        book.held("pay", &key("a"), lease.fence, SystemClock.now());
        book.held("pay", &key("b"), lease.fence, SystemClock.now());
        assert_eq!(count(&book, "pay"), 2);
        // "b" is not in the store: it leaves at the refresh; "a" is still unknown and stays.
        book.refresh(&store).await;
        assert_eq!(count(&book, "pay"), 1);
        store
            .resolve_released(&key("a"), lease.fence)
            .await
            .unwrap();
        book.refresh(&store).await;
        assert_eq!(count(&book, "pay"), 0);
        book.held("pay", &key("c"), lease.fence, SystemClock.now());
        book.resolved(&key("c"));
        assert_eq!(count(&book, "pay"), 0);
    }
}
