//! The test kit of idem: the store conformance suite, the concurrency hammer, the model-based
//! property test, the service probes, a store with switchable faults ([`faulty`]) for the
//! tests of what sits on top of a store, a metrics recorder that counts ([`recorder`]), a capture
//! of log lines ([`logs`]), a client that trickles a request body ([`trickle`]), and private `redis-server` processes and Redis Clusters
//! (`redis_server`, feature `redis-server`). Every store crate runs the same suite from its own `tests/`:
//!
//! ```ignore
//! // idem-store-memory/tests/conformance.rs
//! async fn harness() -> Option<MemoryHarness> { Some(MemoryHarness::new()) }
//! idem_testkit::store_conformance!(harness);
//! ```
//!
//! The macro expands into one named `#[tokio::test]` per contract clause (see [`conformance`]),
//! so a failing test names the clause it breaks. A harness whose server is missing fails the
//! test with the reason (the probe that found it missing panics), or, when the run set
//! `IDEM_TEST_SKIP_MISSING=1` outside CI, returns `None` and the clause skips loudly (see
//! [`probe`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod conformance;
pub mod faulty;
pub mod hammer;
pub mod logs;
pub mod model;
pub mod probe;
pub mod recorder;
#[cfg(feature = "redis-server")]
pub mod redis_server;
pub mod trickle;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{RecordKey, Store};

/// What the suite needs from a store under test, besides the [`Store`] itself.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test. Every call returns a handle to the same records.
    fn store(&self) -> Arc<dyn Store>;

    /// Moves the store's clock forward by `by` (a manual clock, or a server-time offset).
    async fn advance(&self, by: Duration);

    /// Plants a broken record at `key`: one the store cannot decode, or one that breaks the
    /// record invariants. Every later operation on it must answer `StoreError::Corrupt`.
    async fn corrupt(&self, key: &RecordKey);

    /// How many round trips [`Harness::store`] (all its handles) has sent to the backend so
    /// far: what the round-trip clauses count on a remote store. `None` (the default): the
    /// store has no round trips to count (memory, redb), and those clauses do not apply.
    fn round_trips(&self) -> Option<u64> {
        None
    }

    /// A second handle on the same records whose local clock runs `skew` ahead of the first's
    /// (behind, when `ahead` is false), and that moves with [`Harness::advance`] like the
    /// first. `None` (the default): the store has one clock for every handle (memory, redb),
    /// and the skewed-clock clause does not apply.
    async fn skewed_store(&self, _skew: Duration, _ahead: bool) -> Option<Arc<dyn Store>> {
        None
    }
}

/// The system's clock, `skew` ahead (or behind): the local clock of a handle that disagrees
/// with the others, for [`Harness::skewed_store`].
#[derive(Clone, Copy, Debug)]
pub struct SkewedClock {
    /// How far off.
    pub skew: Duration,
    /// Ahead (`true`) or behind.
    pub ahead: bool,
}

impl idem_core::Clock for SkewedClock {
    fn now(&self) -> idem_core::Timestamp {
        let now = idem_core::Clock::now(&idem_core::SystemClock);
        if self.ahead {
            now.saturating_add(self.skew)
        } else {
            now.saturating_sub(self.skew)
        }
    }
}

/// Expands into one `#[tokio::test]` per clause of the store contract, plus the hammer and the
/// model-based property test.
///
/// `$make` names an `async fn() -> Option<H>` where `H: Harness`; it is called once per test,
/// and must give each call its own namespace (or schema) so tests do not see each other.
/// The calling crate needs `tokio` (features `macros`, `rt-multi-thread`) as a dev-dependency.
#[macro_export]
macro_rules! store_conformance {
    ($make:path) => {
        $crate::store_conformance!(@clauses $make;
            claim_on_an_absent_key_acquires,
            one_of_64_concurrent_claims_acquires,
            in_flight_answers_with_retry_after,
            completed_record_answers_with_its_result,
            mismatch_in_every_state_leaves_the_record_untouched,
            lapsed_lease_is_taken_over_with_a_higher_fence,
            lapsed_holder_not_taken_over_may_still_complete,
            stale_owner_is_rejected_after_takeover,
            fences_strictly_increase_also_after_delete,
            fences_strictly_increase_under_concurrent_grants,
            resent_complete_by_the_same_owner_is_ok,
            resent_claim_with_its_owner_gets_the_same_grant,
            retryable_fail_frees_the_key,
            permanent_fail_keeps_a_failed_record,
            get_returns_each_state_as_the_machine_leaves_it,
            release_frees_the_key,
            delete_answers_whether_a_live_record_was_there,
            heartbeat_extends_the_lease,
            retention_expiry_frees_the_key,
            scan_filters_by_state_and_age,
            scan_refuses_a_cursor_it_did_not_give,
            scopes_are_isolated,
            corrupt_record_is_reported_not_panicked,
            scan_reports_a_corrupt_record_beside_the_readable_ones,
            hammer_counts_one_execution_per_key,
            ping_answers,
            a_first_execution_takes_two_round_trips,
            a_replay_a_conflict_and_a_mismatch_take_one_round_trip,
            a_takeover_takes_at_most_two_round_trips,
            skewed_clocks_never_grant_a_live_lease_twice,
            settle_unknown_is_for_the_holder_only,
            a_claim_of_an_unknown_key_never_acquires_until_the_hold_lapses,
            resolve_completed_replays_the_result_from_then_on,
            resolve_released_lets_the_next_claim_run,
            a_resolution_after_a_newer_attempt_is_refused,
            unknown_records_are_deleted_and_scanned,
            concurrent_resolutions_apply_once,
        );

        #[test]
        fn model_based_interleavings_match_the_state_machine() {
            $crate::model::check(|| async { $make().await }, 256);
        }
    };
    (@clauses $make:path; $($clause:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $clause() {
                let Some(harness) = $make().await else { return };
                $crate::conformance::$clause(&harness).await;
            }
        )*
    };
}
