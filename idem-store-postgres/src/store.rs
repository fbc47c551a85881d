//! [`PostgresStore`]: the [`Store`] on PostgreSQL, and the transition functions that run in the
//! caller's transaction.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool_postgres::tokio_postgres::types::ToSql;
use deadpool_postgres::tokio_postgres::{NoTls, Row};
use deadpool_postgres::{
    GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Transaction,
};
use idem_core::machine::{self, LeasePolicy, Step, Write};
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Lease, Record, RecordKey, ScanPage,
    ScanQuery, Store, StoreError, Timestamp, duration_micros,
};

use crate::config::PostgresConfig;
use crate::error::{from_pg, from_pool, protocol};
use crate::row;
use crate::schema::{self, MigrationReport, Statements};

/// The longest duration the store writes (100 years): longer leases and retentions are cut to
/// it, so no timestamp overflows.
const MAX_DURATION_MICROS: u64 = 100 * 365 * 86_400 * 1_000_000;

/// How often a transition re-reads a record that changed under it before giving up (only
/// concurrent transitions of one key ever need a second statement).
const CLAIM_ATTEMPTS: usize = 5;

/// How many expired rows one sweep statement deletes.
const SWEEP_BATCH: i64 = 1_000;

/// The PostgreSQL store. Cheap to clone: clones share the pool.
///
/// See the [crate docs](crate) for the table, the time source and the transaction functions.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: Pool,
    sql: Statements,
    schema: String,
    op_timeout: Duration,
    policy: LeasePolicy,
    /// Microseconds added to the server's clock: the test hook of [`PostgresStore::advance_clock`].
    offset: AtomicI64,
}

/// Applies the embedded migrations to the configured schema (creating it if needed) and
/// returns what it did. Safe to run from several processes at once: they serialize on an
/// advisory lock. This is what `idem store migrate` runs.
///
/// # Errors
/// [`StoreError::Unavailable`] if the server cannot be reached; [`StoreError::Backend`] if a
/// migration fails (nothing is applied then) or the schema is newer than this build.
pub async fn migrate(config: &PostgresConfig) -> Result<MigrationReport, StoreError> {
    let pool = build_pool(config)?;
    let mut client = pool
        .get()
        .await
        .map_err(|e| from_pool("migrate", config.op_timeout, e))?;
    schema::migrate(&mut client, &config.schema, config.op_timeout).await
}

fn build_pool(config: &PostgresConfig) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config.driver_config(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(config.pool_size.get())
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(config.op_timeout))
        .create_timeout(Some(config.connect_timeout))
        .recycle_timeout(Some(config.connect_timeout))
        .build()
        .map_err(|e| StoreError::Backend {
            source: Box::new(e),
            retryable: false,
        })
}

/// Converts a duration for the database, capped at [`MAX_DURATION_MICROS`].
fn micros(d: Duration) -> i64 {
    i64::try_from(duration_micros(d).min(MAX_DURATION_MICROS)).unwrap_or(i64::MAX)
}

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
    /// Connects a pool to the configured server and, unless turned off in the configuration,
    /// applies the migrations.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] or [`StoreError::Timeout`] if the server cannot be reached;
    /// the errors of [`migrate`].
    pub async fn connect(config: PostgresConfig) -> Result<Self, StoreError> {
        let pool = build_pool(&config)?;
        Self::with_pool(pool, config).await
    }

    /// A store on an existing pool (one the application also uses for its own queries), with
    /// the schema, timeouts and lease policy of `config` (its URL, pool size and connect timeout
    /// are not used). Applies the migrations unless turned off.
    ///
    /// The pool's connections keep their own settings: the operation timeout of `config`
    /// answers `Timeout` in time, but only a `statement_timeout` on the pool's connections
    /// (which [`PostgresStore::connect`] sets) also stops the statement in the server.
    ///
    /// # Errors
    /// The errors of [`migrate`].
    pub async fn with_pool(pool: Pool, config: PostgresConfig) -> Result<Self, StoreError> {
        if config.migrate {
            let mut client = pool
                .get()
                .await
                .map_err(|e| from_pool("migrate", config.op_timeout, e))?;
            schema::migrate(&mut client, &config.schema, config.op_timeout).await?;
        }
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                sql: Statements::new(&config.schema),
                schema: config.schema,
                pool,
                op_timeout: config.op_timeout,
                policy: config.lease_policy,
                offset: AtomicI64::new(0),
            }),
        })
    }

    /// The connection pool: take a connection from it to open the transaction that
    /// [`PostgresStore::claim_in`] and [`PostgresStore::complete_in`] take part in.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The schema that holds the store's tables.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Moves this store's clock forward by `by`, for every clone of it: the store adds the
    /// offset to the server's `clock_timestamp()` in every statement.
    ///
    /// This is the test hook that lets time-dependent tests (lease lapses, retention expiry)
    /// run without sleeping. In production the offset stays zero; moving it makes this process
    /// see leases lapse and records expire early, so never do it on a shared schema.
    pub fn advance_clock(&self, by: Duration) {
        self.inner.offset.fetch_add(micros(by), Ordering::SeqCst);
    }

    fn offset(&self) -> i64 {
        self.inner.offset.load(Ordering::SeqCst)
    }

    /// Removes every record that expired at least a minute ago (and the rows that released,
    /// retryably failed or deleted claims left behind), a thousand rows per statement; returns
    /// how many. Fences stay above those of the removed rows (the minute is what keeps them so
    /// against claims already running when the sweep commits). This is what `idem store sweep` runs; run it periodically (a cron job,
    /// a task every few minutes): expired records count as absent whether swept or not, so
    /// sweeping only keeps the table small.
    ///
    /// # Errors
    /// The connection errors of every operation.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let row = self
                .with_client("sweep", async |client| {
                    query_one(
                        client,
                        "sweep",
                        &self.inner.sql.sweep,
                        &[&self.offset(), &SWEEP_BATCH],
                    )
                    .await
                })
                .await?;
            let removed: i64 = row.try_get(0).map_err(|e| protocol(e.to_string()))?;
            total += u64::try_from(removed).unwrap_or(0);
            if removed < SWEEP_BATCH {
                return Ok(total);
            }
        }
    }

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
        self.timed("claim", self.claim_on(tx, request)).await
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
    /// # Errors
    /// As [`Store::complete`].
    pub async fn complete_in(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.timed("complete", self.complete_on(tx, lease, result, retention))
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
        self.timed("fail", self.fail_on(tx, lease, failure, retention))
            .await
    }

    /// [`Store::release`] inside the caller's transaction.
    ///
    /// # Errors
    /// As [`Store::release`].
    pub async fn release_in(&self, tx: &Transaction<'_>, lease: &Lease) -> Result<(), StoreError> {
        self.timed("release", self.release_on(tx, lease)).await
    }

    /// Runs `op` within the operation timeout.
    async fn timed<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let after = self.inner.op_timeout;
        tokio::time::timeout(after, fut)
            .await
            .unwrap_or(Err(StoreError::Timeout { op, after }))
    }

    /// Runs `f` on a pooled connection, within the operation timeout.
    async fn with_client<T>(
        &self,
        op: &'static str,
        f: impl AsyncFnOnce(&deadpool_postgres::Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.timed(op, async {
            let client = self
                .inner
                .pool
                .get()
                .await
                .map_err(|e| from_pool(op, self.inner.op_timeout, e))?;
            f(&client).await
        })
        .await
    }

    async fn claim_on<C: GenericClient>(
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
    async fn holder<C: GenericClient, T>(
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

    async fn heartbeat_on<C: GenericClient>(
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

    async fn complete_on<C: GenericClient>(
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

    async fn fail_on<C: GenericClient>(
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

    async fn release_on<C: GenericClient>(
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

/// Prepares (once per connection) and runs a statement that returns exactly one row.
async fn query_one<C: GenericClient>(
    client: &C,
    op: &'static str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, StoreError> {
    let fail = |e| from_pg(op, Duration::ZERO, e);
    let statement = client.prepare_cached(sql).await.map_err(fail)?;
    client.query_one(&statement, params).await.map_err(fail)
}

/// The cursor of a scan: the position after the last record of a page.
fn encode_cursor(created_micros: i64, scope: &str, key: &str) -> String {
    format!("{created_micros}:{}:{scope}{key}", scope.len())
}

fn decode_cursor(cursor: &str) -> Option<(i64, String, String)> {
    let (created, rest) = cursor.split_once(':')?;
    let (scope_len, rest) = rest.split_once(':')?;
    let scope_len: usize = scope_len.parse().ok()?;
    let scope = rest.get(..scope_len)?;
    let key = rest.get(scope_len..)?;
    Some((created.parse().ok()?, scope.to_owned(), key.to_owned()))
}

#[async_trait]
impl Store for PostgresStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.with_client("claim", async |client| self.claim_on(client, request).await)
            .await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.with_client("heartbeat", async |client| {
            self.heartbeat_on(client, lease, extend).await
        })
        .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_client("complete", async |client| {
            self.complete_on(client, lease, result, retention).await
        })
        .await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_client("fail", async |client| {
            self.fail_on(client, lease, failure, retention).await
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.with_client("release", async |client| {
            self.release_on(client, lease).await
        })
        .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.with_client("get", async |client| {
            let fail = |e| from_pg("get", Duration::ZERO, e);
            let statement = client
                .prepare_cached(&self.inner.sql.get)
                .await
                .map_err(fail)?;
            let row = client
                .query_opt(
                    &statement,
                    &[&key.scope.as_str(), &key.key.as_str(), &self.offset()],
                )
                .await
                .map_err(fail)?;
            let Some(row) = row else { return Ok(None) };
            let now = row::now(key, &row)?;
            Ok(row::record(key, &row)?.filter(|r| !r.is_expired(now)))
        })
        .await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.with_client("delete", async |client| {
            let row = query_one(
                client,
                "delete",
                &self.inner.sql.delete,
                &[&key.scope.as_str(), &key.key.as_str(), &self.offset()],
            )
            .await?;
            row.try_get(0).map_err(|e| protocol(e.to_string()))
        })
        .await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        let (created, scope, name) = match &query.cursor {
            Some(cursor) => {
                decode_cursor(cursor).ok_or_else(|| StoreError::invalid_cursor(cursor))?
            }
            None => (0, String::new(), String::new()),
        };
        let limit = query.page_size();
        let state = query.state.map(|s| s.as_str());
        let min_age = query.min_age.map(micros);
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let rows = self
            .with_client("scan", async |client| {
                let fail = |e| from_pg("scan", Duration::ZERO, e);
                let statement = client
                    .prepare_cached(&self.inner.sql.scan)
                    .await
                    .map_err(fail)?;
                client
                    .query(
                        &statement,
                        &[
                            &self.offset(),
                            &state,
                            &min_age,
                            &created,
                            &scope,
                            &name,
                            &fetch,
                        ],
                    )
                    .await
                    .map_err(fail)
            })
            .await?;
        let mut page = ScanPage::default();
        for row in rows.iter().take(limit) {
            let scope: &str = row
                .try_get(row::NOW + 1)
                .map_err(|e| protocol(e.to_string()))?;
            let name: &str = row
                .try_get(row::NOW + 2)
                .map_err(|e| protocol(e.to_string()))?;
            // A row that does not decode is reported, not an error: the query chose it by its
            // columns, so it takes its place on the page like any other.
            let key = idem_core::Scope::new(scope)
                .ok()
                .zip(idem_core::IdempotencyKey::new(name).ok())
                .map(|(s, k)| RecordKey::new(s, k));
            let read = match &key {
                Some(key) => row::record(key, row).and_then(|record| {
                    record
                        .map(Some)
                        .ok_or_else(|| protocol("a scan returned an empty row"))
                }),
                None => Err(StoreError::Corrupt {
                    key: format!("{scope}/{name}"),
                    reason: "the key breaks the key rules".to_owned(),
                }),
            };
            let now = row::clock(row).map_err(protocol)?;
            if let Some(entry) = query.entry(key.as_ref(), read, now)? {
                page.push(entry);
            }
            let created = row::created_micros(row).map_err(protocol)?;
            page.next_cursor = Some(encode_cursor(created, scope, name));
        }
        if rows.len() <= limit {
            page.next_cursor = None;
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        let cursor = encode_cursor(1_700_000_000_000_000, "a:b", "c:1:d");
        assert_eq!(
            decode_cursor(&cursor),
            Some((1_700_000_000_000_000, "a:b".to_owned(), "c:1:d".to_owned()))
        );
        assert_eq!(decode_cursor("x"), None);
        assert_eq!(decode_cursor("1:99:ab"), None);
    }

    #[test]
    fn durations_are_capped() {
        assert_eq!(micros(Duration::from_secs(1)), 1_000_000);
        assert_eq!(
            micros(Duration::MAX),
            i64::try_from(MAX_DURATION_MICROS).unwrap()
        );
    }
}
