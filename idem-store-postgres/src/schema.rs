//! The table, its embedded migrations, and the SQL of every operation.
//!
//! Every statement is built once per store from the schema name and prepared once per
//! connection. The name is a checked plain identifier (`a-z`, `0-9`, `_`), so it can be written
//! between double quotes as it is; it is always quoted, because a plain identifier may still be
//! a keyword PostgreSQL reserves (`user`, `order`), which breaks the statement unquoted.

use deadpool_postgres::tokio_postgres::Client;
use idem_core::StoreError;

use crate::error::from_pg;

/// One embedded migration.
struct Migration {
    version: i32,
    description: &'static str,
    /// The SQL, with `{schema}` standing for the quoted schema name.
    sql: &'static str,
}

/// The embedded migrations, in order. A released migration is never edited: a change is a new
/// one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "records table, scan and expiry indexes, fence floor",
        sql: r#"
CREATE TABLE {schema}.idem_records (
    scope             text COLLATE "C" NOT NULL,
    key               text COLLATE "C" NOT NULL,
    state             text NOT NULL,
    fingerprint       bytea NOT NULL,
    owner             uuid NOT NULL,
    fence             bigint NOT NULL,
    lease_until       timestamptz NOT NULL,
    attempt           integer NOT NULL,
    created_at        timestamptz NOT NULL,
    completed_at      timestamptz,
    expires_at        timestamptz NOT NULL,
    result            bytea,
    failure_message   text,
    failure_retryable boolean,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idem_records_state_age ON {schema}.idem_records (state, created_at);
CREATE INDEX idem_records_expiry ON {schema}.idem_records (expires_at);
COMMENT ON TABLE {schema}.idem_records IS
    'idem: one record per (scope, key). A row whose expires_at has passed counts as absent; '
    'release and retryable failures expire their row at once so its fence survives. '
    'Only sweep deletes rows.';
CREATE TABLE {schema}.idem_fence_floor (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    fence bigint NOT NULL
);
COMMENT ON TABLE {schema}.idem_fence_floor IS
    'idem: the highest fence of a deleted row; new grants start above it.';
INSERT INTO {schema}.idem_fence_floor (id, fence) VALUES (true, 0);
"#,
    },
    Migration {
        version: 2,
        description: "a version per row, for compare-and-set",
        sql: r#"
ALTER TABLE {schema}.idem_records ADD COLUMN version bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN {schema}.idem_records.version IS
    'idem: raised by every write; a write names the version it read (compare-and-set).';
"#,
    },
    Migration {
        version: 3,
        description: "the unknown state: what is known of a lost outcome, and its hold",
        sql: r#"
ALTER TABLE {schema}.idem_records
    ADD COLUMN unknown_reason       text,
    ADD COLUMN unknown_request_sent boolean,
    ADD COLUMN unknown_head_seen    boolean,
    ADD COLUMN hold_until           timestamptz;
COMMENT ON COLUMN {schema}.idem_records.unknown_reason IS
    'idem: for a row in state unknown (its attempt lost the answer of its side effect), what '
    'happened; NULL in every other state.';
COMMENT ON COLUMN {schema}.idem_records.hold_until IS
    'idem: for a row in state unknown, when a claim may take the key over; NULL: until resolved.';
"#,
    },
];

/// The newest schema version this build knows.
pub(crate) const LATEST_VERSION: i32 = 3;

/// What [`crate::migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationReport {
    /// The schema migrated.
    pub schema: String,
    /// The versions applied by this call, in order (empty if the schema was up to date).
    pub applied: Vec<i32>,
    /// The schema's version after the call.
    pub version: i32,
}

/// Applies the missing migrations to `schema` in one transaction, under a transaction-level
/// advisory lock keyed by the schema name, so concurrent callers (several instances starting at
/// once) apply each migration exactly once and never see a half-built schema.
///
/// A schema already at this build's version is answered after two reads, without the lock and
/// without DDL, so a role that may only use the records (no `CREATE` on the database) connects
/// with migrations on.
///
/// `after` is the connection's `statement_timeout`, which a cancelled statement's
/// [`StoreError::Timeout`] reports.
pub(crate) async fn migrate(
    client: &mut Client,
    schema: &str,
    after: std::time::Duration,
) -> Result<MigrationReport, StoreError> {
    let fail = |e| from_pg("migrate", after, e);
    let quoted = quote(schema);
    if let Some(current) = committed_version(client, &quoted).await {
        if current > LATEST_VERSION {
            return Err(newer(schema, current));
        }
        if current == LATEST_VERSION {
            return Ok(MigrationReport {
                schema: schema.to_owned(),
                applied: Vec::new(),
                version: current,
            });
        }
    }
    let tx = client.transaction().await.map_err(fail)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&format!("idem.migrate.{schema}")],
    )
    .await
    .map_err(fail)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {quoted};
         CREATE TABLE IF NOT EXISTS {quoted}.idem_migrations (
             version     integer PRIMARY KEY,
             description text NOT NULL,
             applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    ))
    .await
    .map_err(fail)?;
    let row = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {quoted}.idem_migrations"),
            &[],
        )
        .await
        .map_err(fail)?;
    let current: i32 = row.try_get(0).map_err(fail)?;
    if current > LATEST_VERSION {
        return Err(newer(schema, current));
    }
    let mut applied = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.batch_execute(&migration.sql.replace("{schema}", &quoted))
            .await
            .map_err(fail)?;
        tx.execute(
            &format!("INSERT INTO {quoted}.idem_migrations (version, description) VALUES ($1, $2)"),
            &[&migration.version, &migration.description],
        )
        .await
        .map_err(fail)?;
        applied.push(migration.version);
    }
    tx.commit().await.map_err(fail)?;
    Ok(MigrationReport {
        schema: schema.to_owned(),
        applied,
        version: current.max(LATEST_VERSION),
    })
}

/// The version of the schema's committed migrations, read without a lock, or `None` if there
/// is no bookkeeping table yet or it cannot be read (the locked path then answers). A migration
/// in progress elsewhere is not visible until it commits, and then it is complete.
async fn committed_version(client: &Client, quoted: &str) -> Option<i32> {
    let table = format!("{quoted}.idem_migrations");
    let exists = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .ok()?
        .try_get::<_, bool>(0)
        .ok()?;
    if !exists {
        return None;
    }
    client
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {table}"),
            &[],
        )
        .await
        .ok()?
        .try_get(0)
        .ok()
}

/// The error for a schema that a newer build migrated.
fn newer(schema: &str, current: i32) -> StoreError {
    StoreError::Backend {
        source: format!(
            "schema {schema} is at version {current}, newer than this build knows \
             ({LATEST_VERSION}): upgrade idem"
        )
        .into(),
        retryable: false,
    }
}

/// `schema` as a quoted identifier. The name is checked to hold only `a-z`, `0-9` and `_`
/// ([`crate::PostgresConfig::with_schema`]), so it needs no escaping inside the quotes.
pub(crate) fn quote(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// The record columns every statement returns, in this order (see `crate::row`).
const COLUMNS: [&str; 16] = [
    "state",
    "fingerprint",
    "owner",
    "fence",
    "lease_until",
    "attempt",
    "created_at",
    "completed_at",
    "expires_at",
    "result",
    "failure_message",
    "failure_retryable",
    "unknown_reason",
    "unknown_request_sent",
    "unknown_head_seen",
    "hold_until",
];

/// The record columns of table alias `t`, as the row decoder reads them. `light`: the result is
/// replaced by an empty value (or NULL), for answers that need to know only whether there is one.
fn columns(t: &str, light: bool) -> String {
    COLUMNS
        .iter()
        .map(|column| match *column {
            "owner" => format!("{t}.owner::text"),
            "result" if light => {
                format!("CASE WHEN {t}.result IS NULL THEN NULL ELSE ''::bytea END")
            }
            other => format!("{t}.{other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The record invariants of `idem_core::Record::validate`, plus decodability, on alias `t`: a
/// row that breaks them is never written over (a compare-and-set against it loses, and the
/// reader reports it as corrupt).
fn valid(t: &str) -> String {
    format!(
        "(({t}.state = 'in_flight' AND {t}.result IS NULL AND {t}.failure_message IS NULL \
            AND {t}.completed_at IS NULL) \
          OR ({t}.state = 'completed' AND {t}.result IS NOT NULL AND {t}.completed_at IS NOT NULL) \
          OR ({t}.state = 'failed' AND {t}.failure_message IS NOT NULL \
            AND {t}.failure_retryable IS NOT NULL AND {t}.completed_at IS NOT NULL) \
          OR ({t}.state = 'unknown' AND {t}.unknown_reason IS NOT NULL \
            AND {t}.unknown_request_sent IS NOT NULL AND {t}.unknown_head_seen IS NOT NULL \
            AND {t}.result IS NULL AND {t}.failure_message IS NULL \
            AND {t}.completed_at IS NOT NULL)) \
         AND ({t}.state = 'unknown' OR ({t}.unknown_reason IS NULL \
            AND {t}.unknown_request_sent IS NULL AND {t}.unknown_head_seen IS NULL \
            AND {t}.hold_until IS NULL)) \
         AND {t}.fence >= 1 AND {t}.attempt >= 1 AND octet_length({t}.fingerprint) = 32"
    )
}

/// `$n` microseconds as an interval.
fn micros(param: &str) -> String {
    format!("({param}::bigint * interval '1 microsecond')")
}

/// How long a row stays after it expired before a sweep deletes it. A deleted row's fence
/// reaches later grants only through the fence floor, which a claim reads from its statement's
/// snapshot; a claim statement that began before the sweep committed, and inserts after, would
/// miss the floor. Such a claim started at most a few seconds earlier (`statement_timeout`), and
/// its clock reading is then already past every fence granted before the row expired a minute
/// ago. The Redis store keeps its tombstones as long, for the same reason.
pub(crate) const SWEEP_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// The store's clock: the server's `clock_timestamp()` plus the test offset in `param`.
fn clock(param: &str) -> String {
    format!(
        "c AS MATERIALIZED (SELECT clock_timestamp() + {} AS now)",
        micros(param)
    )
}

/// The SQL of every operation on one schema. The primitives ($1 scope, $2 key every time)
/// compare a version and write what idem-core's machine decided; none names a state or
/// computes an expiry or a fence.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    /// The record columns, then its version (column 16).
    pub(crate) read: String,
    /// $3..$18 the record columns; inserts if the key is absent and $6 (the fence) is above
    /// the fence floor. Answers whether it inserted (column 17); when it did not, also the
    /// columns of the row the statement's snapshot saw (NULL: none), its version and the floor
    /// (column 18).
    pub(crate) create: String,
    /// $3..$18 the record columns, $19 the version read. Answers the new version if it wrote
    /// (column 17), else NULL there and the columns and version of the row the snapshot saw.
    pub(crate) swap: String,
    /// $3 the time from which the row counts as absent (its fence stays), $4 the version read.
    /// Writes only over a row that keeps the record invariants.
    /// Answers as `swap`.
    pub(crate) bury: String,
    /// Deletes the row whatever it holds, its fence raising the floor; answers how many rows.
    pub(crate) remove: String,
    /// $1 clock offset µs, $2 state or NULL, $3 min age µs or NULL, $4 cursor created µs,
    /// $5 cursor scope, $6 cursor key, $7 limit.
    pub(crate) scan: String,
    /// $1 clock offset µs, $2 batch size.
    pub(crate) sweep: String,
}

/// The record columns as parameters $3 to $18, in [`COLUMNS`] order.
const VALUES: &str = "$3::text, $4::bytea, $5::text::uuid, $6::bigint, $7::timestamptz, \
    $8::integer, $9::timestamptz, $10::timestamptz, $11::timestamptz, $12::bytea, $13::text, \
    $14::boolean, $15::text, $16::boolean, $17::boolean, $18::timestamptz";

impl Statements {
    pub(crate) fn new(schema: &str) -> Self {
        let schema = quote(schema);
        let table = format!("{schema}.idem_records");
        let floor = format!("{schema}.idem_fence_floor");
        let cols_t = columns("t", false);
        let names = COLUMNS.join(", ");
        let read =
            format!("SELECT {cols_t}, t.version FROM {table} t WHERE t.scope = $1 AND t.key = $2");
        // The answer of a write whose CTE `cte` answers `mark` (column 17) when it wrote: that
        // row alone, the record columns NULL; else the row the statement's snapshot saw, and
        // `lost` as columns 17 on. Only a write that did not happen reads the row (a gate that
        // PostgreSQL evaluates once), and the common answer is one narrow row.
        let nulls = "NULL::text, NULL::bytea, NULL::text, NULL::bigint, NULL::timestamptz, \
            NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bytea, \
            NULL::text, NULL::boolean, NULL::text, NULL::boolean, NULL::boolean, \
            NULL::timestamptz, NULL::bigint";
        let seen = |cte: &str, mark: &str, lost: &str| {
            format!(
                "SELECT {nulls}, {mark} FROM {cte}
UNION ALL
SELECT {cols_t}, t.version, {lost}
FROM (SELECT 1) one LEFT JOIN {table} t ON t.scope = $1 AND t.key = $2
WHERE NOT EXISTS (SELECT 1 FROM {cte})"
            )
        };
        let create = format!(
            "WITH ins AS (
    INSERT INTO {table} (scope, key, {names}, version)
    SELECT $1::text, $2::text, {VALUES}, 0
    WHERE $6::bigint > (SELECT f.fence FROM {floor} f)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING 1
)
{}",
            seen(
                "ins",
                "true, NULL::bigint",
                &format!("false, (SELECT f.fence FROM {floor} f)")
            )
        );
        let set = COLUMNS
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let value = VALUES.split(", ").nth(i).unwrap_or("NULL");
                format!("{c} = {value}")
            })
            .collect::<Vec<_>>()
            .join(", ");
        // A compare-and-set: `set` the row if it is still at the version in `$version` and
        // keeps the record invariants; answer the row the statement saw and the new version.
        let compare_and_set = |set: &str, version: &str| {
            format!(
                "WITH upd AS (
    UPDATE {table} t SET {set}, version = t.version + 1
    WHERE t.scope = $1 AND t.key = $2 AND t.version = {version}::bigint AND {valid_t}
    RETURNING t.version
)
{}",
                seen("upd", "upd.version", "NULL::bigint"),
                valid_t = valid("t"),
            )
        };
        let swap = compare_and_set(&set, "$19");
        let bury = compare_and_set("expires_at = $3::timestamptz", "$4");
        let remove = format!(
            "WITH d AS (DELETE FROM {table} t WHERE t.scope = $1 AND t.key = $2 RETURNING t.fence),
f AS (UPDATE {floor} SET fence = greatest(fence, (SELECT max(d.fence) FROM d))
      WHERE EXISTS (SELECT 1 FROM d))
SELECT count(*) FROM d"
        );
        let scan = scan(&table);
        let sweep = sweep(&table, &floor);
        Statements {
            read,
            create,
            swap,
            bury,
            remove,
            scan,
            sweep,
        }
    }
}

/// [`Statements::scan`] on `table`.
fn scan(table: &str) -> String {
    format!(
        "WITH {clock}
SELECT {cols_t}, c.now, t.scope, t.key
FROM {table} t, c
WHERE t.expires_at > c.now
  AND ($2::text IS NULL OR t.state = $2::text)
  AND ($3::bigint IS NULL OR t.created_at <= c.now - {min_age})
  AND (t.created_at, t.scope, t.key) >
      (timestamptz 'epoch' + {cursor}, $5::text COLLATE \"C\", $6::text COLLATE \"C\")
ORDER BY t.created_at, t.scope, t.key
LIMIT $7",
        clock = clock("$1"),
        cols_t = columns("t", false),
        min_age = micros("$3"),
        cursor = micros("$4"),
    )
}

/// [`Statements::sweep`] on `table`, raising the fence floor in `floor`.
fn sweep(table: &str, floor: &str) -> String {
    format!(
        "WITH {clock},
victims AS (SELECT v.ctid FROM {table} v
            WHERE v.expires_at <= (SELECT c.now FROM c) - {grace} LIMIT $2),
d AS (DELETE FROM {table} t USING c
      WHERE t.ctid IN (SELECT victims.ctid FROM victims) AND t.expires_at <= c.now - {grace}
      RETURNING t.fence),
f AS (UPDATE {floor} SET fence = greatest(fence, (SELECT max(d.fence) FROM d))
      WHERE EXISTS (SELECT 1 FROM d))
SELECT count(*) FROM d",
        clock = clock("$1"),
        grace = format!("interval '{} seconds'", SWEEP_GRACE.as_secs()),
    )
}
