//! The atomic primitives of idem-core on PostgreSQL, over any client (a pooled connection, or
//! the caller's transaction): each is one statement on one row, and decides nothing.
//!
//! | primitive | statement |
//! |---|---|
//! | read | `SELECT ... WHERE (scope, key)` |
//! | create-if-absent | `INSERT ... ON CONFLICT DO NOTHING`, and the row the statement saw |
//! | compare-and-set | `UPDATE ... WHERE (scope, key) AND version = $v`, and the row it saw |
//! | remove | `DELETE` (a row that does not decode), its fence raising the floor |
//!
//! A freed key (released, retryably failed, deleted) keeps its row, expired from that moment:
//! its fence stays, and the machine reads an expired record as absent. A row swept away leaves
//! its fence in the fence floor, which a create only inserts above.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use deadpool_postgres::tokio_postgres::Row;
use deadpool_postgres::tokio_postgres::types::ToSql;
use idem_core::atomic::{Created, Primitives, Slot, Swapped, Version, Versioned};
use idem_core::machine::LeasePolicy;
use idem_core::{Fence, Record, RecordKey, ScanPage, ScanQuery, StoreError, Timestamp};

use crate::error::{from_pg, protocol};
use crate::row;
use crate::store::PostgresStore;

/// The version of a key with no row: a compare-and-set against it inserts.
const ABSENT: i64 = -1;

/// The primitives of `store` on `client`.
pub(crate) struct PgPrimitives<'a, C> {
    pub(crate) store: &'a PostgresStore,
    pub(crate) client: &'a C,
}

impl<C> std::fmt::Debug for PgPrimitives<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.store.fmt(f)
    }
}

fn time(at: Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(at.as_micros())
}

fn version_of(version: &Version) -> i64 {
    <[u8; 8]>::try_from(&version.as_bytes()[..]).map_or(ABSENT, i64::from_be_bytes)
}

fn version(v: i64) -> Version {
    Version::new(v.to_be_bytes().to_vec())
}

/// The row's fence as the database stores it (a fence above `i64::MAX` is refused).
fn fence_param(fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| protocol("a fence over i64::MAX"))
}

impl<C: GenericClient + Sync> PgPrimitives<'_, C> {
    async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        self.store.count_round_trip();
        let fail = |e| from_pg(op, Duration::ZERO, e);
        let statement = self.client.prepare_cached(sql).await.map_err(fail)?;
        self.client
            .query_opt(&statement, params)
            .await
            .map_err(fail)
    }

    /// The row in columns 0 to 16 (the record and its version), if any.
    fn seen(key: &RecordKey, row: &Row) -> Result<Option<Versioned>, StoreError> {
        let Some(record) = row::record(key, row)? else {
            return Ok(None);
        };
        let v: i64 = row.try_get(16).map_err(|e| protocol(e.to_string()))?;
        Ok(Some(Versioned {
            slot: Slot::Record(record),
            version: version(v),
        }))
    }

    /// Runs `sql` ($1 scope, $2 key, then `values`) and answers the row it saw and column 17.
    async fn write<T: for<'r> deadpool_postgres::tokio_postgres::types::FromSql<'r>>(
        &self,
        op: &'static str,
        sql: &str,
        key: &RecordKey,
        values: &[&(dyn ToSql + Sync)],
    ) -> Result<(Option<Versioned>, T, Row), StoreError> {
        let (scope, name) = (key.scope.as_str(), key.key.as_str());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&scope, &name];
        params.extend_from_slice(values);
        let row = self
            .query(op, sql, &params)
            .await?
            .ok_or_else(|| protocol("a write answered no row"))?;
        let written: T = row.try_get(17).map_err(|e| protocol(e.to_string()))?;
        Ok((Self::seen(key, &row)?, written, row))
    }

    /// Inserts `record` if its key has no row and its fence is above the floor.
    async fn insert(&self, record: &Record) -> Result<Created, StoreError> {
        let sql = &self.store.inner.sql.create;
        let values = Values::of(record)?;
        let (seen, inserted, row) = self
            .write::<bool>("claim", sql, &record.key, &values.params())
            .await?;
        if inserted {
            return Ok(Created::Created(version(0)));
        }
        if let Some(found) = seen {
            return Ok(Created::Present(found));
        }
        let floor: i64 = row.try_get(18).map_err(|e| protocol(e.to_string()))?;
        if values.fence <= floor {
            // Absent, but fences of swept rows reach this high: a grant must go above.
            let floor = Fence::new(u64::try_from(floor).unwrap_or(0));
            return Ok(Created::Present(Versioned {
                slot: Slot::Tombstone(floor),
                version: version(ABSENT),
            }));
        }
        // Another claim inserted the row after this statement's snapshot (the insert waited
        // for it): a new statement sees it.
        match self.read(&record.key).await? {
            Some(found) => Ok(Created::Present(found)),
            None => Err(protocol("a conflicting row vanished")),
        }
    }
}

/// The record columns of a row as parameters $3 to $18.
struct Values {
    state: &'static str,
    fingerprint: Vec<u8>,
    owner: String,
    fence: i64,
    lease_until: SystemTime,
    attempt: i32,
    created_at: SystemTime,
    completed_at: Option<SystemTime>,
    expires_at: SystemTime,
    result: Option<Vec<u8>>,
    message: Option<String>,
    retryable: Option<bool>,
    reason: Option<String>,
    request_sent: Option<bool>,
    head_seen: Option<bool>,
    hold_until: Option<SystemTime>,
}

impl Values {
    fn of(record: &Record) -> Result<Values, StoreError> {
        Ok(Values {
            state: record.state.as_str(),
            fingerprint: record.fingerprint.as_bytes().to_vec(),
            owner: record.owner.to_string(),
            fence: fence_param(record.fence)?,
            lease_until: time(record.lease_until),
            attempt: i32::try_from(record.attempt).unwrap_or(i32::MAX),
            created_at: time(record.created_at),
            completed_at: record.completed_at.map(time),
            expires_at: time(record.expires_at),
            result: record.result.as_ref().map(|r| r.to_vec()),
            message: record.failure.as_ref().map(|f| f.message.clone()),
            retryable: record.failure.as_ref().map(|f| f.retryable),
            reason: record.unknown.as_ref().map(|u| u.reason.clone()),
            request_sent: record.unknown.as_ref().map(|u| u.request_sent),
            head_seen: record.unknown.as_ref().map(|u| u.head_seen),
            hold_until: record.hold_until.map(time),
        })
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.state,
            &self.fingerprint,
            &self.owner,
            &self.fence,
            &self.lease_until,
            &self.attempt,
            &self.created_at,
            &self.completed_at,
            &self.expires_at,
            &self.result,
            &self.message,
            &self.retryable,
            &self.reason,
            &self.request_sent,
            &self.head_seen,
            &self.hold_until,
        ]
    }
}

fn swapped(seen: Option<Versioned>, written: Option<i64>) -> Swapped {
    match written {
        Some(v) => Swapped::Swapped(version(v)),
        None => Swapped::Lost(seen),
    }
}

#[async_trait]
impl<C: GenericClient + Sync> Primitives for PgPrimitives<'_, C> {
    async fn read(&self, key: &RecordKey) -> Result<Option<Versioned>, StoreError> {
        let (scope, name) = (key.scope.as_str(), key.key.as_str());
        let row = self
            .query("get", &self.store.inner.sql.read, &[&scope, &name])
            .await?;
        match row {
            Some(row) => Self::seen(key, &row),
            None => Ok(None),
        }
    }

    async fn create(&self, record: &Record, _ttl: Duration) -> Result<Created, StoreError> {
        self.insert(record).await
    }

    async fn swap(
        &self,
        key: &RecordKey,
        expected: &Version,
        slot: &Slot,
        _ttl: Duration,
    ) -> Result<Swapped, StoreError> {
        let expected = version_of(expected);
        match slot {
            Slot::Record(record) if expected == ABSENT => Ok(match self.insert(record).await? {
                Created::Created(v) => Swapped::Swapped(v),
                Created::Present(found) => Swapped::Lost(Some(found)),
            }),
            Slot::Record(record) => {
                let values = Values::of(record)?;
                let mut params = values.params();
                params.push(&expected);
                let sql = &self.store.inner.sql.swap;
                let (seen, written, _) = self.write("swap", sql, key, &params).await?;
                Ok(swapped(seen, written))
            }
            // The row stays, expired: its fence is the tombstone. Expired as of the earliest
            // time any handle's clock estimate may read now (two bounds back), so that every
            // handle reads the key as free from now on.
            Slot::Tombstone(_) => {
                let bound = self.clock_bound().saturating_mul(2);
                let now = time(self.now().saturating_sub(bound));
                let sql = &self.store.inner.sql.bury;
                let (seen, written, _) = self.write("swap", sql, key, &[&now, &expected]).await?;
                Ok(swapped(seen, written))
            }
        }
    }

    async fn remove(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let (scope, name) = (key.scope.as_str(), key.key.as_str());
        let row = self
            .query("delete", &self.store.inner.sql.remove, &[&scope, &name])
            .await?
            .ok_or_else(|| protocol("a delete answered no row"))?;
        let removed: i64 = row.try_get(0).map_err(|e| protocol(e.to_string()))?;
        Ok(removed > 0)
    }

    async fn scan(&self, query: &ScanQuery, _now: Timestamp) -> Result<ScanPage, StoreError> {
        self.store.scan_on(self.client, query).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.query("ping", "SELECT 1", &[]).await.map(drop)
    }

    fn now(&self) -> Timestamp {
        self.store.now()
    }

    fn clock_bound(&self) -> Duration {
        self.store.inner.clock.bound()
    }

    fn lease_policy(&self) -> LeasePolicy {
        self.store.inner.policy
    }

    fn fence_memory(&self) -> Duration {
        // Rows are never removed by a transition (only by a sweep, which keeps the floor).
        Duration::ZERO
    }
}
