//! [`TxStore`]: the PostgreSQL store as the layer sees it, with the leases of the requests
//! whose handler runs in a transaction, and how each one's transaction ended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{
    ClaimOutcome, ClaimRequest, Failure, Fence, Lease, Record, RecordKey, ScanPage, ScanQuery,
    Store, StoreError, StoreStats, TransitionRejection, UnknownOutcome,
};
use idem_store_postgres::PostgresStore;

/// How the transaction of a held lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// No transaction ended yet (none was opened, or the handler runs).
    Open,
    /// The handler's writes and the response record committed together.
    Committed,
    /// The handler's writes were rolled back; nothing of the response is recorded.
    RolledBack,
    /// The commit was sent and its answer lost: the record is completed or still in flight
    /// under this lease, which settles it when it ends.
    Unknown,
}

/// The leases granted through the layer, by key and fence, until the layer settles them.
#[derive(Debug, Default)]
pub(crate) struct Leases(Mutex<HashMap<(RecordKey, Fence), (Lease, Settled)>>);

impl Leases {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(RecordKey, Fence), (Lease, Settled)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, lease: &Lease) {
        self.map().insert(
            (lease.key.clone(), lease.fence),
            (lease.clone(), Settled::Open),
        );
    }

    /// The lease granted for `key` at `fence`, if the layer holds it.
    pub(crate) fn lease(&self, key: &RecordKey, fence: Fence) -> Option<Lease> {
        self.map()
            .get(&(key.clone(), fence))
            .map(|(lease, _)| lease.clone())
    }

    /// Records how the transaction of `lease` ended.
    pub(crate) fn settle(&self, lease: &Lease, settled: Settled) {
        if let Some(entry) = self.map().get_mut(&(lease.key.clone(), lease.fence)) {
            entry.1 = settled;
        }
    }

    /// Forgets `lease`: the layer settles it now. How its transaction ended, if it had one.
    fn take(&self, lease: &Lease) -> Settled {
        self.map()
            .remove(&(lease.key.clone(), lease.fence))
            .map_or(Settled::Open, |(_, settled)| settled)
    }
}

/// The PostgreSQL store, with each lease's transaction in mind: the layer's completion of a
/// response already recorded in the handler's transaction is acknowledged without a write,
/// and a response whose writes rolled back is never recorded.
#[derive(Clone, Debug)]
pub(crate) struct TxStore {
    pub(crate) store: PostgresStore,
    pub(crate) leases: Arc<Leases>,
}

#[async_trait]
impl Store for TxStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.store.claim(request).await?;
        if let ClaimOutcome::Acquired { lease, .. } = &outcome {
            self.leases.insert(lease);
        }
        Ok(outcome)
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.store.heartbeat(lease, extend).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        match self.leases.take(lease) {
            // Recorded by the handler's transaction, with its writes.
            Settled::Committed => Ok(()),
            Settled::Open => self.store.complete(lease, result, retention).await,
            // A response whose writes rolled back is never recorded: the key is given back.
            Settled::RolledBack => {
                self.store.release(lease).await?;
                Err(StoreError::Rejected(TransitionRejection::NotFound))
            }
            // Left to the lease: the record is completed, or in flight until the lease ends.
            Settled::Unknown => Err(StoreError::Rejected(TransitionRejection::LeaseExpired)),
        }
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        match self.leases.take(lease) {
            Settled::Committed => Err(StoreError::Rejected(TransitionRejection::AlreadySettled {
                state: idem_core::State::Completed,
            })),
            Settled::Unknown => Err(StoreError::Rejected(TransitionRejection::LeaseExpired)),
            Settled::Open | Settled::RolledBack => self.store.fail(lease, failure, retention).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        match self.leases.take(lease) {
            // Completed: nothing to give back. Unknown: the lease settles it (a release could
            // only be refused by a committed completion, but it would wait behind the commit).
            Settled::Committed | Settled::Unknown => Ok(()),
            Settled::Open | Settled::RolledBack => self.store.release(lease).await,
        }
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        match self.leases.take(lease) {
            Settled::Committed => Err(StoreError::Rejected(TransitionRejection::AlreadySettled {
                state: idem_core::State::Completed,
            })),
            Settled::Unknown => Err(StoreError::Rejected(TransitionRejection::LeaseExpired)),
            Settled::Open | Settled::RolledBack => {
                self.store
                    .settle_unknown(lease, outcome, hold, retention)
                    .await
            }
        }
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.store
            .resolve_completed(key, fence, result, retention)
            .await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.store.resolve_released(key, fence).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.store.get(key).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.store.delete(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.store.scan(query).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    fn stats(&self) -> Option<StoreStats> {
        self.store.stats()
    }
}
