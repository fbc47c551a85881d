//! What the PostgreSQL store adds to the contract: the caller's transaction, migrations,
//! sweep, errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{PgHarness, SchemaGuard, fresh_schema, server_up, url};
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fingerprint, IdempotencyKey, RecordKey, State,
    Store, StoreError,
};
use idem_store_postgres::{PostgresConfig, PostgresStore, migrate};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

fn request(name: &str) -> ClaimRequest {
    ClaimRequest::new(
        RecordKey::unscoped(IdempotencyKey::new(name).unwrap()),
        Fingerprint::of(&[name.as_bytes()]),
        LEASE,
    )
}

async fn effects_table(h: &PgHarness) -> String {
    let table = format!("{}.effects", h.schema.name);
    let client = h.store.pool().get().await.unwrap();
    client
        .batch_execute(&format!("CREATE TABLE {table} (job text NOT NULL)"))
        .await
        .unwrap();
    table
}

async fn count(h: &PgHarness, table: &str) -> i64 {
    let client = h.store.pool().get().await.unwrap();
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// Claims in a transaction, inserts one effect, completes, and commits or rolls back.
async fn effect_and_completion(
    store: &PostgresStore,
    table: &str,
    req: &ClaimRequest,
    commit: bool,
) {
    let mut client = store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let ClaimOutcome::Acquired { lease, .. } = store.claim_in(&tx, req).await.unwrap() else {
        panic!("not acquired")
    };
    tx.execute(&format!("INSERT INTO {table} VALUES ('a')"), &[])
        .await
        .unwrap();
    store
        .complete_in(&tx, &lease, Bytes::from_static(b"done"), RETENTION)
        .await
        .unwrap();
    if commit {
        store.commit(tx).await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_business_write_and_the_completion_commit_together() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let table = effects_table(&h).await;
    let store = &h.store;
    let req = request("tx-commit");

    // Rolled back: neither the effect nor the claim remains.
    effect_and_completion(store, &table, &req, false).await;
    assert_eq!(count(&h, &table).await, 0);
    assert!(
        store.get(&req.key).await.unwrap().is_none(),
        "the claim was rolled back"
    );

    // Committed: both are there, and a retry is answered from the record.
    effect_and_completion(store, &table, &req, true).await;
    assert_eq!(count(&h, &table).await, 1);
    match store.claim(&req).await.unwrap() {
        ClaimOutcome::Completed(record) => assert_eq!(record.result.as_deref(), Some(&b"done"[..])),
        other => panic!("expected Completed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_for_the_open_transaction_of_another() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = h.store.clone();
    let req = request("tx-wait");
    let mut client = store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let ClaimOutcome::Acquired { lease, .. } = store.claim_in(&tx, &req).await.unwrap() else {
        panic!("not acquired")
    };
    let duplicate = tokio::spawn({
        let store = store.clone();
        let req = req.clone();
        async move { store.claim(&req).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!duplicate.is_finished(), "the duplicate did not wait");
    store
        .complete_in(&tx, &lease, Bytes::from_static(b"r"), RETENTION)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    match duplicate.await.unwrap().unwrap() {
        ClaimOutcome::Completed(record) => assert_eq!(record.state, State::Completed),
        other => panic!("expected Completed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_and_release_in_a_transaction() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = &h.store;
    let mut client = store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let req = request("tx-fail");
    let ClaimOutcome::Acquired { lease, .. } = store.claim_in(&tx, &req).await.unwrap() else {
        panic!("not acquired")
    };
    store
        .fail_in(&tx, &lease, Failure::permanent("declined"), RETENTION)
        .await
        .unwrap();
    let req2 = request("tx-release");
    let ClaimOutcome::Acquired { lease: lease2, .. } = store.claim_in(&tx, &req2).await.unwrap()
    else {
        panic!("not acquired")
    };
    store.release_in(&tx, &lease2).await.unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        ClaimOutcome::Failed(_)
    ));
    assert!(store.get(&req2.key).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_also_when_raced() {
    if !server_up() {
        return;
    }
    let schema = SchemaGuard {
        name: fresh_schema("idem_mig"),
    };
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&schema.name)
        .unwrap();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let config = config.clone();
            tokio::spawn(async move { migrate(&config).await })
        })
        .collect();
    let mut applied = Vec::new();
    for run in runs {
        let report = run.await.unwrap().expect("migrate");
        assert_eq!(report.version, 3);
        applied.extend(report.applied);
    }
    assert_eq!(
        applied,
        vec![1, 2, 3],
        "each migration applied exactly once"
    );
    let again = migrate(&config).await.unwrap();
    assert!(again.applied.is_empty());
}

/// A schema at version 2 (before the unknown state) is migrated to 3 on connect and its rows
/// still read; a row of the new columns that breaks the record invariants is corrupt, never
/// written over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_schema_upgrades_and_its_rows_still_read() {
    if !server_up() {
        return;
    }
    let schema = SchemaGuard {
        name: fresh_schema("idem_v2"),
    };
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&schema.name)
        .unwrap();
    let store = PostgresStore::connect(config.clone()).await.unwrap();
    let req = request("before-the-upgrade");
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
        panic!("not acquired")
    };
    store
        .complete(&lease, Bytes::from_static(b"old"), RETENTION)
        .await
        .unwrap();
    // Back to version 2: the table as that build made it.
    let client = store.pool().get().await.unwrap();
    let name = &schema.name;
    client
        .batch_execute(&format!(
            "ALTER TABLE \"{name}\".idem_records DROP COLUMN unknown_reason,
                 DROP COLUMN unknown_request_sent, DROP COLUMN unknown_head_seen,
                 DROP COLUMN hold_until;
             DELETE FROM \"{name}\".idem_migrations WHERE version = 3;"
        ))
        .await
        .unwrap();
    drop(client);
    drop(store);
    let report = migrate(&config).await.unwrap();
    assert_eq!((report.applied, report.version), (vec![3], 3));
    let store = PostgresStore::connect(config).await.unwrap();
    match store.claim(&req).await.unwrap() {
        ClaimOutcome::Completed(record) => {
            assert_eq!(record.result.as_deref(), Some(&b"old"[..]));
            assert_eq!((record.unknown, record.hold_until), (None, None));
        }
        other => panic!("the old row did not read: {other:?}"),
    }

    // Unknown rows round trip; an unknown outcome on a completed row is corrupt.
    let req = request("after-the-upgrade");
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
        panic!("not acquired")
    };
    let outcome = idem_core::UnknownOutcome::new("reset").head_seen(true);
    store
        .settle_unknown(&lease, outcome.clone(), Some(LEASE), RETENTION)
        .await
        .unwrap();
    let unknown = store.get(&req.key).await.unwrap().unwrap();
    assert_eq!(unknown.state, State::Unknown);
    assert_eq!(unknown.unknown, Some(outcome));
    assert!(unknown.hold_until.is_some());
    let client = store.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "UPDATE \"{name}\".idem_records SET unknown_reason = 'stray' \
                 WHERE key = 'before-the-upgrade'"
        ))
        .await
        .unwrap();
    let err = store
        .get(&request("before-the-upgrade").key)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

/// A migration that waits past the operation timeout (another instance holds the schema's
/// migration lock) is a `Timeout` that names the timeout it ran into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_waiting_past_its_timeout_reports_that_timeout() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let schema = SchemaGuard {
        name: fresh_schema("idem_mig_wait"),
    };
    // Another instance is migrating this schema: it holds the lock in an open transaction.
    let mut holder = h.store.pool().get().await.unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&format!("idem.migrate.{}", schema.name)],
    )
    .await
    .unwrap();
    let timeout = Duration::from_millis(300);
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&schema.name)
        .unwrap()
        .with_op_timeout(timeout);
    let err = migrate(&config).await.unwrap_err();
    tx.rollback().await.unwrap();
    assert!(
        matches!(err, StoreError::Timeout { op: "migrate", after } if after == timeout),
        "{err:?}"
    );
}

/// A schema name that `with_schema` accepts but PostgreSQL reserves as a keyword (`user`,
/// `order`, `select`...) works: the store quotes it in every statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_named_like_a_keyword_works() {
    if !server_up() {
        return;
    }
    // Reserved keywords, so the name cannot be made unique: one test uses each.
    for name in ["order", "user"] {
        let schema = SchemaGuard {
            name: name.to_owned(),
        };
        let config = PostgresConfig::new(&url())
            .unwrap()
            .with_schema(&schema.name)
            .unwrap();
        let store = PostgresStore::connect(config.clone())
            .await
            .unwrap_or_else(|e| panic!("schema {name}: {e}"));
        assert!(migrate(&config).await.unwrap().applied.is_empty());
        let req = request("keyword-schema");
        let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
            panic!("not acquired")
        };
        store
            .complete(&lease, Bytes::from_static(b"r"), RETENTION)
            .await
            .unwrap();
        assert!(matches!(
            store.claim(&req).await.unwrap(),
            ClaimOutcome::Completed(_)
        ));
        assert!(store.delete(&req.key).await.unwrap());
        assert_eq!(store.sweep().await.unwrap(), 0);
        let page = store.scan(&idem_core::ScanQuery::all()).await.unwrap();
        assert!(page.records.is_empty());
        drop(store);
    }
}

/// A role with only the rights to use the records (no `CREATE` on the database or the
/// schema), on a schema a deploy step already migrated, connects with the default
/// configuration (migrations on connect): an up-to-date schema needs no DDL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_ddl_rights_connects_to_a_migrated_schema() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let role = fresh_schema("idem_app");
    let schema = &h.schema.name;
    let admin = h.store.pool().get().await.unwrap();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT USAGE ON SCHEMA {schema} TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};"
        ))
        .await
        .unwrap();
    let server: idem_store_postgres::tokio_postgres::Config = url().parse().unwrap();
    let host_port = common::host_port(&url());
    let (host, port) = host_port.split_once(':').unwrap();
    let dbname = server.get_dbname().unwrap_or("test");
    let config = PostgresConfig::new(&format!(
        "host={host} port={port} user={role} dbname={dbname}"
    ))
    .unwrap()
    .with_schema(schema)
    .unwrap();
    let connected = PostgresStore::connect(config).await;
    let outcome = match &connected {
        Ok(store) => Some(store.claim(&request("least-privilege")).await),
        Err(_) => None,
    };
    drop(connected);
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role};"))
        .await
        .unwrap();
    let outcome = outcome.expect("a role without DDL rights could not connect");
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Acquired { .. })),
        "{outcome:?}"
    );
}

/// A schema that a newer build migrated is refused with a clear, permanent error, by
/// `connect` and by `migrate`, and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_from_a_newer_build_is_refused() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let client = h.store.pool().get().await.unwrap();
    client
        .execute(
            &format!(
                "INSERT INTO {}.idem_migrations (version, description) VALUES (99, 'future')",
                h.schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&h.schema.name)
        .unwrap();
    for err in [
        PostgresStore::connect(config.clone()).await.unwrap_err(),
        migrate(&config).await.unwrap_err(),
    ] {
        assert!(!err.is_retryable(), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("version 99") && message.contains("newer"),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_expired_rows_and_fences_keep_rising() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = &h.store;
    let mut fences = Vec::new();
    for i in 0..30 {
        let req = request(&format!("sweep-{i}"));
        let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
            panic!("not acquired")
        };
        fences.push(lease.fence);
        match i % 3 {
            0 => store.release(&lease).await.unwrap(),
            1 => store
                .complete(&lease, Bytes::new(), Duration::from_secs(60))
                .await
                .unwrap(),
            _ => store
                .complete(&lease, Bytes::new(), RETENTION)
                .await
                .unwrap(),
        }
    }
    // A row is swept a minute after it expired: nothing yet; then the released rows (expired
    // at once); then the short retentions (expired after a minute).
    assert_eq!(store.sweep().await.unwrap(), 0);
    store.advance_clock(Duration::from_secs(61));
    assert_eq!(store.sweep().await.unwrap(), 10);
    store.advance_clock(Duration::from_secs(61));
    assert_eq!(store.sweep().await.unwrap(), 10);
    assert_eq!(store.sweep().await.unwrap(), 0);
    // Rows are gone, fences are not forgotten: a new grant is above every earlier one.
    let max = fences.iter().max().copied().unwrap();
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&request("sweep-0")).await.unwrap()
    else {
        panic!("not acquired")
    };
    assert!(lease.fence > max);
    let client = store.pool().get().await.unwrap();
    let rows: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {}.idem_records", h.schema.name),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_after_a_delete_even_if_the_clock_stood_still() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = &h.store;
    let req = request("floor");
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
        panic!("not acquired")
    };
    // Push the stored fence far above the clock, as a burst of grants within one microsecond
    // or a clock that stepped back would.
    let far = 9_000_000_000_000_000_i64;
    let client = store.pool().get().await.unwrap();
    client
        .execute(
            &format!(
                "UPDATE {}.idem_records SET fence = $1 WHERE key = 'floor'",
                h.schema.name
            ),
            &[&far],
        )
        .await
        .unwrap();
    assert!(lease.fence.get() < 9_000_000_000_000_000);
    assert!(store.delete(&req.key).await.unwrap());
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
        panic!("not acquired")
    };
    assert!(lease.fence.get() > 9_000_000_000_000_000, "{}", lease.fence);
}

/// A delete expires a live record's row instead of removing it (the next grant reads its fence
/// under the row's lock) and refuses its holder; a row that breaks the record invariants is
/// removed outright, so an operator can clear it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_expires_a_live_row_and_removes_a_corrupt_one() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = &h.store;
    let rows = async |key: &str| -> i64 {
        let client = store.pool().get().await.unwrap();
        client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {}.idem_records WHERE key = $1",
                    h.schema.name
                ),
                &[&key],
            )
            .await
            .unwrap()
            .get(0)
    };
    let req = request("tomb");
    let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.unwrap() else {
        panic!("not acquired")
    };
    assert!(store.delete(&req.key).await.unwrap());
    assert!(!store.delete(&req.key).await.unwrap(), "deleted twice");
    assert_eq!(store.get(&req.key).await.unwrap(), None);
    assert_eq!(rows("tomb").await, 1);
    let late = store.complete(&lease, Bytes::new(), RETENTION).await;
    assert!(matches!(late, Err(StoreError::Rejected(_))), "{late:?}");
    assert_eq!(store.get(&req.key).await.unwrap(), None);
    let ClaimOutcome::Acquired { lease: next, .. } = store.claim(&req).await.unwrap() else {
        panic!("not acquired")
    };
    assert!(next.fence > lease.fence);
    assert_eq!(next.attempt, 1);

    let broken = request("broken");
    let ClaimOutcome::Acquired { .. } = store.claim(&broken).await.unwrap() else {
        panic!("not acquired")
    };
    let client = store.pool().get().await.unwrap();
    client
        .execute(
            &format!(
                "UPDATE {}.idem_records SET state = 'completed' WHERE key = 'broken'",
                h.schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    assert!(matches!(
        store.get(&broken.key).await,
        Err(StoreError::Corrupt { .. })
    ));
    assert!(store.delete(&broken.key).await.unwrap());
    assert_eq!(rows("broken").await, 0);
    let ClaimOutcome::Acquired { .. } = store.claim(&broken).await.unwrap() else {
        panic!("not acquired after clearing a corrupt record")
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_server_is_unavailable_not_a_panic() {
    // A port nothing listens on.
    let config = PostgresConfig::new("postgres://postgres@127.0.0.1:9/test")
        .unwrap()
        .with_connect_timeout(Duration::from_millis(500))
        .with_op_timeout(Duration::from_secs(2));
    let err = PostgresStore::connect(config.clone()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        matches!(
            err,
            StoreError::Unavailable { .. } | StoreError::Timeout { .. }
        ),
        "{err:?}"
    );
    // Without migrations the store builds, and each operation answers the error.
    let store = PostgresStore::connect(config.with_migrate_on_connect(false))
        .await
        .unwrap();
    let err = store.claim(&request("down")).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    // The message says why, not only "error connecting to server".
    let message = err.to_string();
    assert!(message.contains("refused"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_schema_is_a_clear_error() {
    if !server_up() {
        return;
    }
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&fresh_schema("idem_none"))
        .unwrap()
        .with_migrate_on_connect(false);
    let store = PostgresStore::connect(config).await.unwrap();
    let err = store.claim(&request("nothing")).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Backend {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    // The message says what the server said, not only the driver's "db error".
    let message = err.to_string();
    assert!(message.contains("does not exist"), "{message}");
    assert!(message.contains("idem_records"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_over_its_timeout_is_a_timeout() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let req = request("slow");
    // An open transaction holds the key's row lock...
    let mut client = h.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        h.store.claim_in(&tx, &req).await.unwrap(),
        ClaimOutcome::Acquired { .. }
    ));
    // ...so a claim from a store with a short timeout waits past it.
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&h.schema.name)
        .unwrap()
        .with_op_timeout(Duration::from_millis(300));
    let impatient = PostgresStore::connect(config).await.unwrap();
    let started = std::time::Instant::now();
    let err = impatient.claim(&req).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Timeout { op: "claim", .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(3));
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_completion_racing_a_takeover_has_exactly_one_winner() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = h.store.clone();
    let mut holders = Vec::new();
    for i in 0..60 {
        let ClaimOutcome::Acquired { lease, .. } =
            store.claim(&request(&format!("race-{i}"))).await.unwrap()
        else {
            panic!("not acquired")
        };
        holders.push(lease);
    }
    // Every lease lapses; each late holder completes while a new attempt claims.
    store.advance_clock(LEASE + Duration::from_secs(1));
    let races: Vec<_> = holders
        .into_iter()
        .enumerate()
        .map(|(i, lease)| {
            let store = store.clone();
            tokio::spawn(async move {
                let late = {
                    let store = store.clone();
                    let lease = lease.clone();
                    tokio::spawn(async move {
                        store
                            .complete(&lease, Bytes::from_static(b"late"), RETENTION)
                            .await
                    })
                };
                let claim = store.claim(&request(&format!("race-{i}"))).await.unwrap();
                (late.await.unwrap(), claim)
            })
        })
        .collect();
    let (mut late_won, mut takeover_won) = (0, 0);
    for race in races {
        match race.await.unwrap() {
            (Ok(()), ClaimOutcome::Completed(record)) => {
                assert_eq!(record.result.as_deref(), Some(&b"late"[..]));
                late_won += 1;
            }
            (Err(StoreError::Rejected(_)), ClaimOutcome::Acquired { taken_over, .. }) => {
                assert!(taken_over);
                takeover_won += 1;
            }
            other => panic!("both or neither won: {other:?}"),
        }
    }
    eprintln!("late completions won {late_won}, takeovers won {takeover_won}");
}

/// A scan reports a row that does not decode, even one whose key breaks the key rules (named
/// as stored, `scope/key`, with no record key): pages of one entry step over it to the
/// readable row after it. A row with a state no version writes matches no state filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_reports_rows_that_do_not_decode() {
    let Some(h) = PgHarness::new().await else {
        return;
    };
    let store = &h.store;
    for name in ["bad-key", "bad-state", "good"] {
        let ClaimOutcome::Acquired { .. } = store.claim(&request(name)).await.unwrap() else {
            panic!("not acquired")
        };
    }
    let client = store.pool().get().await.unwrap();
    let table = format!("{}.idem_records", h.schema.name);
    // Oldest first, so the corrupt rows come first in the scan's order.
    client
        .batch_execute(&format!(
            "UPDATE {table} SET key = E'bad\\x01key', created_at = created_at - interval '2 s' \
                 WHERE key = 'bad-key';
             UPDATE {table} SET state = 'half-written', created_at = created_at - interval '1 s' \
                 WHERE key = 'bad-state';"
        ))
        .await
        .unwrap();
    let mut query = idem_core::ScanQuery::all().with_limit(1);
    let mut pages = Vec::new();
    loop {
        let page = store.scan(&query).await.unwrap();
        assert_eq!(page.len(), 1, "{page:?}");
        query.cursor = page.next_cursor.clone();
        pages.push(page);
        if query.cursor.is_none() {
            break;
        }
    }
    assert_eq!(pages.len(), 3, "{pages:?}");
    let bad_key = &pages[0].unreadable[0];
    assert_eq!(bad_key.stored_key, "/bad\u{1}key");
    assert_eq!(bad_key.key, None);
    assert_eq!(bad_key.reason, "the key breaks the key rules");
    let bad_state = &pages[1].unreadable[0];
    assert_eq!(bad_state.key, Some(request("bad-state").key));
    assert_eq!(bad_state.reason, "unknown state");
    assert_eq!(pages[2].records[0].key, request("good").key);
    // The state column is read by the query: an unknown state matches no state filter.
    let in_flight = idem_core::ScanQuery::all().with_state(State::InFlight);
    let page = store.scan(&in_flight).await.unwrap();
    assert_eq!(page.records.len(), 1);
    // The row with the broken key is in flight by its column: it is reported.
    assert_eq!(page.unreadable.len(), 1, "{page:?}");
    assert_eq!(page.unreadable[0].key, None);
}
