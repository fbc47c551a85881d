//! [`LeaseKeeper`]: a heartbeat that fails with a retryable error for a whole lease loses the
//! lease when it ends (counted once), a refused settle counts once too, and a keeper dropped
//! unsettled releases its claim. Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_lease::{KeeperConfig, LeaseKeeper};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use idem_testkit::recorder::CountingRecorder;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(3);
const BEAT: Duration = Duration::from_secs(1);

/// The keeper of a fresh claim of "k".
async fn claimed(store: &Arc<FaultyStore<MemoryStore>>, config: KeeperConfig) -> LeaseKeeper {
    claimed_key(store, config, "k").await
}

/// The keeper of a fresh claim of `key`.
async fn claimed_key(
    store: &Arc<FaultyStore<MemoryStore>>,
    config: KeeperConfig,
    key: &str,
) -> LeaseKeeper {
    let key = RecordKey::unscoped(IdempotencyKey::new(key).unwrap());
    let request = ClaimRequest::new(key, Fingerprint::of(&[b"x"]), LEASE);
    let sent = Instant::now();
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh key is free");
    };
    LeaseKeeper::new(store.clone(), Arc::new(config), lease, sent)
}

#[tokio::test(start_paused = true)]
async fn a_store_unreachable_for_a_whole_lease_loses_it_when_it_ends() {
    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    store.faults.heartbeat_down.store(true, Ordering::SeqCst);
    let keeper = claimed(
        &store,
        KeeperConfig::new(LEASE, BEAT).loss_label("job_type", "t"),
    )
    .await;
    let started = Instant::now();
    keeper.heartbeat().await;
    let lost_after = started.elapsed();
    assert!(keeper.is_lost());
    assert!(
        lost_after >= LEASE - Duration::from_millis(10) && lost_after <= LEASE,
        "lost {lost_after:?} after the claim (lease {LEASE:?})"
    );
    // Tried at every beat until the end: at 1 s, 2 s and 3 s.
    assert_eq!(store.faults.heartbeats.load(Ordering::SeqCst), 3);
    assert_eq!(recorder.get("idem_lease_losses_total{job_type=t}"), 1);
    // A settle refused afterwards does not count the same loss again.
    keeper.lose(&idem_core::StoreError::Rejected(
        idem_core::TransitionRejection::LeaseExpired,
    ));
    assert_eq!(recorder.get("idem_lease_losses_total{job_type=t}"), 1);
    assert!(matches!(
        keeper.take_loss(),
        idem_core::StoreError::Unavailable { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_that_recovers_before_the_lease_ends_keeps_it() {
    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    store.faults.heartbeat_down.store(true, Ordering::SeqCst);
    let keeper = claimed(&store, KeeperConfig::new(LEASE, BEAT)).await;
    let faults = store.faults.clone();
    tokio::spawn(async move {
        tokio::time::sleep(BEAT * 2 + BEAT / 2).await;
        faults.heartbeat_down.store(false, Ordering::SeqCst);
    });
    let beating = tokio::time::timeout(LEASE * 3, keeper.heartbeat()).await;
    assert!(beating.is_err(), "the heartbeat ended: the lease was lost");
    assert!(!keeper.is_lost());
    assert_eq!(recorder.get("idem_lease_losses_total{}"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_keeper_dropped_unsettled_releases_its_claim() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let keeper = claimed(&store, KeeperConfig::new(LEASE, BEAT)).await;
    drop(keeper);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(store.faults.releases.load(Ordering::SeqCst), 1);

    // Settled, it does not.
    let mut keeper = claimed(&store, KeeperConfig::new(LEASE, BEAT)).await;
    let lease = keeper.lease().clone();
    keeper
        .settle_with(3, || store.complete(&lease, "r".into(), LEASE))
        .await
        .unwrap();
    drop(keeper);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(store.faults.releases.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_settle_is_tried_again_on_a_retryable_error_up_to_its_tries() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let mut keeper = claimed(&store, KeeperConfig::new(LEASE, BEAT)).await;
    let lease = keeper.lease().clone();
    store.faults.complete_failures.store(2, Ordering::SeqCst);
    keeper
        .settle_with(3, || store.complete(&lease, "r".into(), LEASE))
        .await
        .unwrap();

    let mut keeper = claimed_key(&store, KeeperConfig::new(LEASE, BEAT), "other").await;
    let lease = keeper.lease().clone();
    store.faults.complete_failures.store(5, Ordering::SeqCst);
    let refused = keeper
        .settle_with(3, || store.complete(&lease, "r".into(), LEASE))
        .await;
    assert!(refused.is_err_and(|error| error.is_retryable()));
    assert_eq!(store.faults.complete_failures.load(Ordering::SeqCst), 2);
}

/// Many settles refused at once (and the heartbeat among them) count one loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_noticed_by_many_at_once_counts_once() {
    let recorder = CountingRecorder::default();
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    for round in 0..50 {
        let keeper = claimed_key(
            &store,
            KeeperConfig::new(LEASE, BEAT).loss_label("round", round.to_string()),
            &format!("k{round}"),
        )
        .await;
        let refused = idem_core::StoreError::Rejected(idem_core::TransitionRejection::LeaseExpired);
        std::thread::scope(|threads| {
            for _ in 0..8 {
                threads.spawn(|| {
                    metrics::with_local_recorder(&recorder, || keeper.lose(&refused));
                });
            }
        });
        assert!(keeper.is_lost());
        assert_eq!(
            recorder.get(&format!("idem_lease_losses_total{{round={round}}}")),
            1
        );
        let mut keeper = keeper;
        keeper.disarm();
    }
}
