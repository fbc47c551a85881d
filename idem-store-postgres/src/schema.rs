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
const MIGRATIONS: &[Migration] = &[Migration {
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
}];

/// The newest schema version this build knows.
pub(crate) const LATEST_VERSION: i32 = 1;

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
const COLUMNS: [&str; 12] = [
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
/// row that breaks them is never written over, and the decoder reports it as corrupt.
fn valid(t: &str) -> String {
    format!(
        "(({t}.state = 'in_flight' AND {t}.result IS NULL AND {t}.failure_message IS NULL \
            AND {t}.completed_at IS NULL) \
          OR ({t}.state = 'completed' AND {t}.result IS NOT NULL AND {t}.completed_at IS NOT NULL) \
          OR ({t}.state = 'failed' AND {t}.failure_message IS NOT NULL \
            AND {t}.failure_retryable IS NOT NULL AND {t}.completed_at IS NOT NULL)) \
         AND {t}.fence >= 1 AND {t}.attempt >= 1 AND octet_length({t}.fingerprint) = 32"
    )
}

/// `$n` microseconds as an interval.
fn micros(param: &str) -> String {
    format!("({param}::bigint * interval '1 microsecond')")
}

/// The owner of a deleted record's row: no holder has it.
const NO_OWNER: &str = "00000000-0000-0000-0000-000000000000";

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

/// The SQL of every operation on one schema.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    /// $1 scope, $2 key, $3 fingerprint, $4 owner, $5 lease µs, $6 clock offset µs.
    pub(crate) claim: String,
    /// $1 scope, $2 key, $3 owner, $4 fence, $5 clock offset µs, $6 strict, $7 extend µs.
    pub(crate) heartbeat: String,
    /// ... $7 retention µs, $8 result.
    pub(crate) complete: String,
    /// ... $7 retention µs, $8 retryable, $9 message.
    pub(crate) fail: String,
    /// $1 scope, $2 key, $3 owner, $4 fence, $5 clock offset µs, $6 strict (always false).
    pub(crate) release: String,
    /// $1 scope, $2 key, $3 clock offset µs.
    pub(crate) get: String,
    /// $1 scope, $2 key, $3 clock offset µs.
    pub(crate) delete: String,
    /// $1 clock offset µs, $2 state or NULL, $3 min age µs or NULL, $4 cursor created µs,
    /// $5 cursor scope, $6 cursor key, $7 limit.
    pub(crate) scan: String,
    /// $1 clock offset µs, $2 batch size.
    pub(crate) sweep: String,
}

impl Statements {
    pub(crate) fn new(schema: &str) -> Self {
        let schema = quote(schema);
        let table = format!("{schema}.idem_records");
        let floor = format!("{schema}.idem_fence_floor");
        let claim = format!(
            "WITH {clock},
ins AS (
    INSERT INTO {table} AS t (scope, key, state, fingerprint, owner, fence, lease_until, attempt,
                              created_at, completed_at, expires_at, result, failure_message,
                              failure_retryable)
    SELECT $1::text, $2::text, 'in_flight', $3::bytea, $4::text::uuid,
           greatest({now_micros}, (SELECT f.fence FROM {floor} f) + 1, 1),
           c.now + {lease}, 1, c.now, NULL, c.now + 2 * {lease}, NULL, NULL, NULL
    FROM c
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING {cols_t}
),
upd AS (
    UPDATE {table} t SET
        state = 'in_flight', fingerprint = $3::bytea, owner = $4::text::uuid,
        fence = greatest(t.fence + 1, {now_micros}),
        lease_until = c.now + {lease},
        attempt = CASE WHEN t.expires_at > c.now THEN t.attempt + 1 ELSE 1 END,
        created_at = CASE WHEN t.expires_at > c.now THEN t.created_at ELSE c.now END,
        completed_at = NULL, expires_at = c.now + 2 * {lease}, result = NULL,
        failure_message = NULL, failure_retryable = NULL
    FROM c
    WHERE t.scope = $1 AND t.key = $2 AND {valid_t}
      AND (t.expires_at <= c.now
           OR (t.fingerprint = $3::bytea AND t.state = 'in_flight' AND t.lease_until <= c.now))
    RETURNING {cols_t}
)
SELECT ins.*, (SELECT c.now FROM c), true FROM ins
UNION ALL
SELECT upd.*, (SELECT c.now FROM c), true FROM upd
UNION ALL
SELECT {cols_t}, c.now, false FROM {table} t, c
WHERE t.scope = $1 AND t.key = $2
  AND NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM upd)",
            clock = clock("$6"),
            lease = micros("$5"),
            now_micros = "(extract(epoch FROM c.now) * 1000000)::bigint",
            valid_t = valid("t"),
            cols_t = columns("t", false),
        );
        // The update writes only if the holder still holds the record; the read returns the
        // row as the statement's snapshot saw it, for the answer when nothing was written.
        let holder = |set: &str| {
            format!(
                "WITH {clock},
upd AS (
    UPDATE {table} t SET {set}
    FROM c
    WHERE t.scope = $1 AND t.key = $2 AND {valid_t} AND t.expires_at > c.now
      AND t.owner = $3::text::uuid AND t.fence = $4 AND t.state = 'in_flight'
      AND (NOT $6::boolean OR t.lease_until > c.now)
    RETURNING t.lease_until
)
SELECT {cols_t}, c.now, (SELECT upd.lease_until FROM upd)
FROM c LEFT JOIN {table} t ON t.scope = $1 AND t.key = $2",
                clock = clock("$5"),
                valid_t = valid("t"),
                cols_t = columns("t", true),
            )
        };
        let extend = micros("$7");
        let heartbeat = holder(&format!(
            "lease_until = greatest(c.now + {extend}, t.lease_until),
     expires_at = greatest(c.now + {extend}, t.lease_until) + {extend}"
        ));
        let retention = micros("$7");
        let complete = holder(&format!(
            "state = 'completed', completed_at = c.now, expires_at = c.now + {retention},
     result = $8::bytea"
        ));
        let fail = holder(&format!(
            "state = CASE WHEN $8::boolean THEN t.state ELSE 'failed' END,
     completed_at = CASE WHEN $8::boolean THEN NULL ELSE c.now END,
     expires_at = CASE WHEN $8::boolean THEN c.now ELSE c.now + {retention} END,
     failure_message = CASE WHEN $8::boolean THEN NULL ELSE $9::text END,
     failure_retryable = CASE WHEN $8::boolean THEN NULL ELSE false END"
        ));
        let release = holder("expires_at = c.now");
        let get = format!(
            "WITH {clock}
SELECT {cols_t}, c.now FROM c JOIN {table} t ON t.scope = $1 AND t.key = $2",
            clock = clock("$3"),
            cols_t = columns("t", false),
        );
        // A live record is not deleted but expired, with its owner cleared (so its holder's
        // late writes are refused): the row keeps its fence, and the next claim goes through
        // the claim's `upd`, which reads the fence under the row's lock. A deleted row's fence
        // reaches the next grant only through the floor, which a claim reads from its
        // statement's snapshot: a claim that started before a delete committed would miss it.
        // A row that breaks the record invariants is deleted outright (an operator clearing a
        // corrupt record), its fence raising the floor.
        let delete = format!(
            "WITH {clock},
tomb AS (UPDATE {table} t SET expires_at = c.now, owner = '{NO_OWNER}'::uuid
         FROM c
         WHERE t.scope = $1 AND t.key = $2 AND {valid_t} AND t.expires_at > c.now
         RETURNING t.fence),
d AS (DELETE FROM {table} t
      WHERE t.scope = $1 AND t.key = $2 AND NOT coalesce({valid_t}, false)
      RETURNING t.fence, t.expires_at),
f AS (UPDATE {floor} SET fence = greatest(fence, (SELECT max(d.fence) FROM d))
      WHERE EXISTS (SELECT 1 FROM d))
SELECT EXISTS (SELECT 1 FROM tomb)
    OR coalesce((SELECT bool_or(d.expires_at > c.now) FROM d), false)
FROM c",
            clock = clock("$3"),
            valid_t = valid("t"),
        );
        let scan = format!(
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
        );
        let sweep = format!(
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
        );
        Statements {
            claim,
            heartbeat,
            complete,
            fail,
            release,
            get,
            delete,
            scan,
            sweep,
        }
    }
}
