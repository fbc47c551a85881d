//! The transitions of the state machine as SQL over any client (a pooled connection, or the
//! caller's transaction): one statement per transition, owner and fence in every `WHERE`.

use std::time::{Duration, SystemTime};

use deadpool_postgres::GenericClient;
use deadpool_postgres::tokio_postgres::types::ToSql;
use idem_core::machine::{self, LeasePolicy, Step, Write};
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Lease, Record, StoreError, Timestamp,
};

#[cfg(doc)]
use idem_core::Store;

use crate::error::{from_pg, protocol};
use crate::row;
use crate::store::{PostgresStore, micros};

/// How often a transition re-reads a record that changed under it before giving up (only
/// concurrent transitions of one key ever need a second statement).
const CLAIM_ATTEMPTS: usize = 5;

/// A fence as the database stores it (a fence above `i64::MAX` matches no row).
fn fence_param(fence: Fence) -> i64 {
    i64::try_from(fence.get()).unwrap_or(-1)
}

/// What a holder's statement means: it wrote (then the database checked owner, fence, state
/// and lease on the latest row, exactly as the state machine does), or it did not and the state
/// machine, run on the row as the statement's snapshot saw it, gives the answer. If the machine
/// would have written, that row is older than the one the update saw: run the statement again.
fn settle<T>(
    decided: Result<Step<T>, StoreError>,
    written: Option<T>,
) -> Option<Result<T, StoreError>> {
    if let Some(answer) = written {
        return Some(Ok(answer));
    }
    match decided {
        Err(err) => Some(Err(err)),
        Ok(step) if matches!(step.write, Write::Nothing) => Some(Ok(step.answer)),
        Ok(_) => None,
    }
}

impl PostgresStore {
    pub(crate) async fn claim_on<C: GenericClient>(
        &self,
        client: &C,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        let key = &request.key;
        let fail = |e| from_pg("claim", Duration::ZERO, e);
        let statement = client
            .prepare_cached(&self.inner.sql.claim)
            .await
            .map_err(fail)?;
        let owner = request.grant_owner();
        for _ in 0..CLAIM_ATTEMPTS {
            let row = client
                .query_opt(
                    &statement,
                    &[
                        &key.scope.as_str(),
                        &key.key.as_str(),
                        &&request.fingerprint.as_bytes()[..],
                        &owner.to_string(),
                        &micros(request.lease),
                        &self.offset(),
                    ],
                )
                .await
                .map_err(fail)?;
            // No row: another claim inserted the record after this statement's snapshot was
            // taken (the insert waited for it). The next statement sees it.
            let Some(row) = row else { continue };
            let now = row::now(key, &row)?;
            let granted: bool = row
                .try_get(row::NOW + 1)
                .map_err(|e| protocol(e.to_string()))?;
            let record = row::record(key, &row)?
                .ok_or_else(|| protocol("a claim returned an empty record"))?;
            if granted {
                return Ok(ClaimOutcome::Acquired {
                    taken_over: record.attempt > 1,
                    lease: Lease {
                        key: key.clone(),
                        owner,
                        fence: record.fence,
                        until: record.lease_until,
                        attempt: record.attempt,
                        held: idem_core::atomic::Held::unknown(),
                    },
                });
            }
            // Not granted: the state machine says what the record means (in flight,
            // completed, failed, mismatch). If it would grant, the row read is older than the
            // one the update saw (another claim took it over meanwhile): read again.
            // A grant without a write is this claim's own, sent again: answer it.
            let step = machine::claim(Some(&record), request, now, Fence::MIN, owner)?;
            if !matches!(step.answer, ClaimOutcome::Acquired { .. })
                || matches!(step.write, Write::Nothing)
            {
                return Ok(step.answer);
            }
        }
        Err(StoreError::Backend {
            source: format!("the claim of {key} lost {CLAIM_ATTEMPTS} races in a row").into(),
            retryable: true,
        })
    }

    /// Runs a holder's statement (with `extra` parameters after the common six) and answers
    /// with [`settle`]: `decide` is the state machine's transition, `written` the answer when
    /// the statement wrote (it gets the new lease end).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn holder<C: GenericClient, T>(
        &self,
        client: &C,
        op: &'static str,
        sql: &str,
        lease: &Lease,
        extra: &[&(dyn ToSql + Sync)],
        decide: impl Fn(Option<&Record>, Timestamp) -> Result<Step<T>, StoreError>,
        written: impl Fn(Timestamp) -> T,
    ) -> Result<T, StoreError> {
        let key = &lease.key;
        let strict = self.inner.policy == LeasePolicy::Strict && op != "release";
        let scope = key.scope.as_str();
        let name = key.key.as_str();
        let owner = lease.owner.to_string();
        let fence = fence_param(lease.fence);
        let fail = |e| from_pg(op, Duration::ZERO, e);
        let statement = client.prepare_cached(sql).await.map_err(fail)?;
        for _ in 0..CLAIM_ATTEMPTS {
            let offset = self.offset();
            let mut params: Vec<&(dyn ToSql + Sync)> =
                vec![&scope, &name, &owner, &fence, &offset, &strict];
            params.extend_from_slice(extra);
            let row = client.query_one(&statement, &params).await.map_err(fail)?;
            let existing = row::record(key, &row)?;
            let now = row::now(key, &row)?;
            let until: Option<SystemTime> = row
                .try_get(row::NOW + 1)
                .map_err(|e| protocol(e.to_string()))?;
            let written = until
                .map(|until| row::timestamp(key, until))
                .transpose()?
                .map(&written);
            if let Some(answer) = settle(decide(existing.as_ref(), now), written) {
                return answer;
            }
        }
        Err(StoreError::Backend {
            source: format!("the {op} of {key} lost {CLAIM_ATTEMPTS} races in a row").into(),
            retryable: true,
        })
    }

    pub(crate) async fn heartbeat_on<C: GenericClient>(
        &self,
        client: &C,
        lease: &Lease,
        extend: Duration,
    ) -> Result<Lease, StoreError> {
        let policy = self.inner.policy;
        self.holder(
            client,
            "heartbeat",
            &self.inner.sql.heartbeat,
            lease,
            &[&micros(extend)],
            |existing, now| machine::heartbeat(existing, lease, extend, now, policy),
            |until| Lease {
                until,
                ..lease.clone()
            },
        )
        .await
    }

    pub(crate) async fn complete_on<C: GenericClient>(
        &self,
        client: &C,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let policy = self.inner.policy;
        let bytes: &[u8] = &result;
        self.holder(
            client,
            "complete",
            &self.inner.sql.complete,
            lease,
            &[&micros(retention), &bytes],
            // The machine only decides; the result it would store is not needed.
            |existing, now| {
                machine::complete(existing, lease, Bytes::new(), retention, now, policy)
            },
            |_| (),
        )
        .await
    }

    pub(crate) async fn fail_on<C: GenericClient>(
        &self,
        client: &C,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let policy = self.inner.policy;
        self.holder(
            client,
            "fail",
            &self.inner.sql.fail,
            lease,
            &[
                &micros(retention),
                &failure.retryable,
                &failure.message.as_str(),
            ],
            |existing, now| machine::fail(existing, lease, failure.clone(), retention, now, policy),
            |_| (),
        )
        .await
    }

    pub(crate) async fn release_on<C: GenericClient>(
        &self,
        client: &C,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        self.holder(
            client,
            "release",
            &self.inner.sql.release,
            lease,
            &[],
            |existing, now| machine::release(existing, lease, now),
            |_| (),
        )
        .await
    }
}
