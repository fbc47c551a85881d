//! [`PostgresStore`]: the [`Store`] on PostgreSQL: its pool, its migrations and its clock;
//! the transitions are idem-core's driver on the primitives of `primitives.rs`, the functions
//! that run in the caller's transaction in `transaction.rs`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::tokio_postgres::types::ToSql;
use deadpool_postgres::tokio_postgres::{NoTls, Row};
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use idem_core::machine::LeasePolicy;
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, ClockEstimate, Driven, Failure, Fence, Lease, Record,
    RecordKey, ScanPage, ScanQuery, Store, StoreError, Timestamp, UnknownOutcome,
};

use crate::config::PostgresConfig;
use crate::error::{from_pg, from_pool, protocol};
use crate::primitives::PgPrimitives;
use crate::row;
use crate::schema::{self, MigrationReport, Statements};

/// The longest duration the store writes (100 years): longer leases and retentions are cut to
/// it, so no timestamp overflows.
const MAX_DURATION_MICROS: u64 = 100 * 365 * 86_400 * 1_000_000;

/// How many expired rows one sweep statement deletes.
const SWEEP_BATCH: i64 = 1_000;

/// The PostgreSQL store. Cheap to clone: clones share the pool.
///
/// See the [crate docs](crate) for the table, the time source and the transaction functions.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Statements,
    pub(crate) schema: String,
    pub(crate) op_timeout: Duration,
    pub(crate) policy: LeasePolicy,
    /// Microseconds added to the server's clock: the test hook of [`PostgresStore::advance_clock`].
    offset: AtomicI64,
    /// The server's clock, estimated (see [`ClockEstimate`]).
    pub(crate) clock: ClockEstimate,
    /// Whether the estimate was measured once (a store built while the server was down
    /// measures before its first operation).
    measured: AtomicBool,
    /// The statements the primitives sent: what the round-trip clauses count.
    round_trips: AtomicU64,
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
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros().min(u128::from(MAX_DURATION_MICROS))).unwrap_or(i64::MAX)
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
        let store = PostgresStore {
            inner: Arc::new(Inner {
                sql: Statements::new(&config.schema),
                schema: config.schema,
                pool,
                op_timeout: config.op_timeout,
                policy: config.lease_policy,
                offset: AtomicI64::new(0),
                clock: ClockEstimate::new(config.local_clock.clone()),
                measured: AtomicBool::new(false),
                round_trips: AtomicU64::new(0),
            }),
        };
        // A server that is down now is measured before the first operation instead.
        let _ = store.ensure_clock().await;
        tokio::spawn(refresh_clock(Arc::downgrade(&store.inner)));
        Ok(store)
    }

    /// Measures the server's clock unless that was done: every operation waits for it, so
    /// none decides on the local clock alone.
    pub(crate) async fn ensure_clock(&self) -> Result<(), StoreError> {
        if self.inner.measured.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.measure_clock().await
    }

    /// Reads the server's `clock_timestamp()` into the store's clock estimate.
    async fn measure_clock(&self) -> Result<(), StoreError> {
        self.on_pooled("clock", async |client| {
            let sent = self.inner.clock.local_now();
            let row = query_one(client, "clock", "SELECT clock_timestamp()", &[]).await?;
            let received = self.inner.clock.local_now();
            let server = row::clock_at(&row, 0).map_err(protocol)?;
            self.inner.clock.measured(sent, server, received);
            self.inner.measured.store(true, Ordering::SeqCst);
            Ok(())
        })
        .await
    }

    /// The store's time: the estimate of the server's clock plus the test offset.
    pub(crate) fn now(&self) -> Timestamp {
        let now = self.inner.clock.now().as_micros();
        Timestamp::from_micros(now.saturating_add_signed(self.offset()))
    }

    /// How many statements this store (and its clones) sent for its transitions, `get` and
    /// `delete`: one per round trip. The conformance suite counts a transition's round trips
    /// with it.
    #[must_use]
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    pub(crate) fn count_round_trip(&self) {
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// The error bound of the store's clock estimate (see [`ClockEstimate`]).
    #[must_use]
    pub fn clock_bound(&self) -> Duration {
        self.inner.clock.bound()
    }

    /// idem-core's driver on the primitives over `client`.
    pub(crate) fn driven<'a, C: GenericClient + Sync>(
        &'a self,
        client: &'a C,
    ) -> Driven<PgPrimitives<'a, C>> {
        Driven::new(PgPrimitives {
            store: self,
            client,
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

    /// The SQL of the create-if-absent and compare-and-set primitives, as the store prepares
    /// them: for `bench/stores.sh`, which drives them by hand to measure what the statements
    /// cost without the store's Rust around them. Their parameters are described in the
    /// crate's source (`schema.rs`); they are no stable interface.
    #[doc(hidden)]
    #[must_use]
    pub fn primitive_sql(&self) -> (&str, &str) {
        (&self.inner.sql.create, &self.inner.sql.swap)
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

    pub(crate) fn offset(&self) -> i64 {
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

    /// Runs `op` within the operation timeout.
    pub(crate) async fn timed<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let after = self.inner.op_timeout;
        tokio::time::timeout(after, fut)
            .await
            .unwrap_or(Err(StoreError::Timeout { op, after }))
    }

    /// Runs `f` on a pooled connection, within the operation timeout (after measuring the
    /// server's clock, the first time).
    pub(crate) async fn with_client<T>(
        &self,
        op: &'static str,
        f: impl AsyncFnOnce(&deadpool_postgres::Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.ensure_clock().await?;
        self.on_pooled(op, f).await
    }

    /// Runs `f` on a pooled connection, within the operation timeout.
    async fn on_pooled<T>(
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
}

/// Prepares (once per connection) and runs a statement that returns exactly one row.
pub(crate) async fn query_one<C: GenericClient>(
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

/// Measures the clock again every [`ClockEstimate::REFRESH`] while the store lives; a failed
/// measurement keeps the last one.
async fn refresh_clock(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(ClockEstimate::REFRESH).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let _ = PostgresStore { inner }.measure_clock().await;
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.with_client("claim", async |client| {
            self.driven(client).claim(request).await
        })
        .await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.with_client("heartbeat", async |client| {
            self.driven(client).heartbeat(lease, extend).await
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
            self.driven(client).complete(lease, result, retention).await
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
            self.driven(client).fail(lease, failure, retention).await
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.with_client("release", async |client| {
            self.driven(client).release(lease).await
        })
        .await
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_client("settle_unknown", async |client| {
            self.driven(client)
                .settle_unknown(lease, outcome, hold, retention)
                .await
        })
        .await
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_client("resolve_completed", async |client| {
            self.driven(client)
                .resolve_completed(key, fence, result, retention)
                .await
        })
        .await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.with_client("resolve_released", async |client| {
            self.driven(client).resolve_released(key, fence).await
        })
        .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.with_client("get", async |client| self.driven(client).get(key).await)
            .await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.with_client("delete", async |client| {
            self.driven(client).delete(key).await
        })
        .await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.with_client("scan", async |client| self.scan_on(client, query).await)
            .await
    }
}

impl PostgresStore {
    /// A page of `query` read on `client`.
    pub(crate) async fn scan_on<C: GenericClient>(
        &self,
        client: &C,
        query: &ScanQuery,
    ) -> Result<ScanPage, StoreError> {
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
        let fail = |e| from_pg("scan", Duration::ZERO, e);
        let statement = client
            .prepare_cached(&self.inner.sql.scan)
            .await
            .map_err(fail)?;
        let rows = client
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
            .map_err(fail)?;
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
