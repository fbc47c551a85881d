//! The transitions in the caller's own transaction: [`PostgresStore::claim_in`] and its
//! siblings, so that a business write and the record's claim or completion commit together.

use std::time::Duration;

use deadpool_postgres::{GenericClient, Transaction};
use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Failure, Lease, Store, StoreError};

use crate::error::from_pg;
use crate::store::PostgresStore;

impl PostgresStore {
    /// [`Store::claim`] inside the caller's transaction: the claim becomes visible (and
    /// binding) only when `tx` commits, together with the caller's own writes; a rollback
    /// undoes it. While `tx` is open, other claims of the same key wait for it.
    ///
    /// `tx` must run at `READ COMMITTED` (PostgreSQL's default): a claim that lost a race
    /// re-reads the record, which a repeatable-read snapshot would not show.
    ///
    /// # Errors
    /// As [`Store::claim`].
    pub async fn claim_in(
        &self,
        tx: &Transaction<'_>,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        self.ensure_clock().await?;
        self.timed("claim", self.driven(tx).claim(request)).await
    }

    /// Commits `tx`, the caller's transaction that [`PostgresStore::claim_in`] and its siblings
    /// took part in, within the operation timeout, its errors mapped as every operation's. A
    /// commit that fails or times out may or may not have taken effect.
    ///
    /// # Errors
    /// [`StoreError::Timeout`] past the operation timeout, [`StoreError::Unavailable`] for a
    /// lost connection, [`StoreError::Backend`] for what the server refused (a serialization
    /// failure is retryable).
    pub async fn commit(&self, tx: Transaction<'_>) -> Result<(), StoreError> {
        let after = self.inner.op_timeout;
        self.timed("commit", async move {
            tx.commit().await.map_err(|e| from_pg("commit", after, e))
        })
        .await
    }

    /// [`Store::complete`] inside the caller's transaction: the result is recorded if and only
    /// if `tx` commits, so the business write made in `tx` and the completion commit together.
    ///
    /// `tx` is a [`Transaction`][deadpool-transaction], or a pooled connection on which the
    /// caller ran `BEGIN` (a transaction that must outlive the borrow of its connection, as
    /// idem-http-postgres's).
    ///
    /// [deadpool-transaction]: https://docs.rs/deadpool-postgres/latest/deadpool_postgres/struct.Transaction.html
    ///
    /// # Errors
    /// As [`Store::complete`].
    pub async fn complete_in<C: GenericClient + Sync>(
        &self,
        tx: &C,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.ensure_clock().await?;
        self.timed(
            "complete",
            self.driven(tx).complete(lease, result, retention),
        )
        .await
    }

    /// [`Store::fail`] inside the caller's transaction.
    ///
    /// # Errors
    /// As [`Store::fail`].
    pub async fn fail_in(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.ensure_clock().await?;
        self.timed("fail", self.driven(tx).fail(lease, failure, retention))
            .await
    }

    /// [`Store::release`] inside the caller's transaction.
    ///
    /// # Errors
    /// As [`Store::release`].
    pub async fn release_in(&self, tx: &Transaction<'_>, lease: &Lease) -> Result<(), StoreError> {
        self.ensure_clock().await?;
        self.timed("release", self.driven(tx).release(lease)).await
    }
}
