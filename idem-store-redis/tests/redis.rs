//! What only a Redis store has to prove: one command per transition (from the server's own
//! counters), behaviour while the server is down and after it is back, memory per record,
//! compression, the key layout, fences under a clock that steps back, and the big hammer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use common::{
    LEASE, RETENTION, RedisHarness, command_calls, key, namespace, request, single_harness,
    single_harness_with,
};
use idem_core::machine::LeasePolicy;
use idem_core::{
    Bytes, ClaimOutcome, Failure, IdempotencyKey, Lease, RecordKey, ScanQuery, Scope, State, Store,
    StoreError, TransitionRejection,
};
use idem_store_redis::{ClockOffset, RedisConfig, RedisStore};
use idem_testkit::Harness;
use idem_testkit::redis_server::{ServerProcess, have_redis_binaries};

/// An operation's error, to be awaited.
type PendingError<'a> = std::pin::Pin<Box<dyn Future<Output = Option<StoreError>> + Send + 'a>>;

async fn acquire(store: &RedisStore, key: &RecordKey) -> Lease {
    match store.claim(&request(key)).await.unwrap() {
        ClaimOutcome::Acquired { lease, .. } => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn connect(url: &str, tune: impl FnOnce(RedisConfig) -> RedisConfig) -> RedisStore {
    let config = RedisConfig::new(url)
        .unwrap()
        .with_namespace(namespace())
        .unwrap();
    RedisStore::connect(tune(config)).await.unwrap()
}

fn commandstats(conn: &mut redis::Connection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    command_calls(&info)
}

/// Runs `op` and answers the commands the server counted meanwhile (the test's own `INFO`
/// left out).
async fn counted<T>(
    conn: &mut redis::Connection,
    op: impl Future<Output = T>,
) -> (T, BTreeMap<String, u64>) {
    let before = commandstats(conn);
    let out = op.await;
    let after = commandstats(conn);
    let delta = after
        .into_iter()
        .filter(|(name, _)| name != "info")
        .filter_map(|(name, calls)| {
            let diff = calls - before.get(&name).copied().unwrap_or(0);
            (diff > 0).then_some((name, diff))
        })
        .collect();
    (out, delta)
}

/// Each transition sends the fewest commands, by the server's own counters (`INFO
/// commandstats`): a claim and a replay one `SET ... NX GET`; a holder's step one `EVALSHA` of
/// the compare-and-set (which runs one `GET` and one `SET` inside the server); a `get` one
/// `GET`; a `delete` a `GET` and an `EVALSHA`. And the store's own count of round trips agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transition_is_the_fewest_commands() {
    if !have_redis_binaries() {
        return;
    }
    let server = ServerProcess::start(&[]);
    let store = connect(&server.url(), |c| c).await;
    let mut info = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let set = BTreeMap::from([("set".to_owned(), 1)]);
    let swap = BTreeMap::from([
        ("evalsha".to_owned(), 1),
        ("get".to_owned(), 1),
        ("set".to_owned(), 1),
    ]);
    let mut report = Vec::new();
    let mut check = |op: &str, delta: BTreeMap<String, u64>, want: &BTreeMap<String, u64>| {
        assert_eq!(&delta, want, "{op}");
        report.push(format!("{op}: {delta:?}"));
    };

    let k = key("budget");
    let (lease, delta) = counted(&mut info, acquire(&store, &k)).await;
    check("claim", delta, &set);
    let (lease, delta) = counted(&mut info, store.heartbeat(&lease, LEASE)).await;
    check("heartbeat", delta, &swap);
    let lease = lease.unwrap();
    let (done, delta) = counted(
        &mut info,
        store.complete(&lease, Bytes::from(vec![b'r'; 200]), RETENTION),
    )
    .await;
    done.unwrap();
    check("complete", delta, &swap);
    let (replay, delta) = counted(&mut info, store.claim(&request(&k))).await;
    assert!(matches!(replay.unwrap(), ClaimOutcome::Completed(_)));
    check("replayed claim", delta, &set);

    let lease = acquire(&store, &key("budget-fail")).await;
    let (failed, delta) = counted(
        &mut info,
        store.fail(&lease, Failure::permanent("no"), RETENTION),
    )
    .await;
    failed.unwrap();
    check("fail (permanent)", delta, &swap);
    let lease = acquire(&store, &key("budget-retry")).await;
    let (failed, delta) = counted(
        &mut info,
        store.fail(&lease, Failure::retryable("later"), RETENTION),
    )
    .await;
    failed.unwrap();
    check("fail (retryable)", delta, &swap);
    let lease = acquire(&store, &key("budget-release")).await;
    let (released, delta) = counted(&mut info, store.release(&lease)).await;
    released.unwrap();
    check("release", delta, &swap);
    let (got, delta) = counted(&mut info, store.get(&k)).await;
    assert!(got.unwrap().is_some());
    check("get", delta, &BTreeMap::from([("get".to_owned(), 1)]));
    let (deleted, delta) = counted(&mut info, store.delete(&k)).await;
    assert!(deleted.unwrap());
    check(
        "delete",
        delta,
        &BTreeMap::from([
            ("evalsha".to_owned(), 1),
            ("get".to_owned(), 2),
            ("set".to_owned(), 1),
        ]),
    );
    eprintln!("commands per operation:\n  {}", report.join("\n  "));
}

/// The compare-and-set method follows what the server takes, asked of the server itself: a
/// `SET ... IFEQ` probe. Where it takes `IFEQ` (Redis 8.4, Valkey 8.1), a completion is one plain
/// `SET` (and a lost one a `GET` after it); where it does not (this machine's Redis 7.0), the
/// store falls back to the script, and a completion is one `EVALSHA` (one `GET` and one `SET`
/// inside). Both ways the completed record replays. With no `IFEQ` server here, the `IFEQ` path
/// runs only where `redis-server` is 8.4 or later; the test says so on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_uses_ifeq_only_where_the_server_takes_it() {
    if !have_redis_binaries() {
        return;
    }
    let server = ServerProcess::start(&[]);
    let store = connect(&server.url(), |c| c).await;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let probe: redis::RedisResult<redis::Value> = redis::cmd("SET")
        .arg("ifeq-probe")
        .arg("v")
        .arg("IFEQ")
        .arg("w")
        .query(&mut conn);
    let takes_ifeq = probe.is_ok();
    let chosen = format!("{store:?}");
    let (method, want) = if takes_ifeq {
        ("IfEq", BTreeMap::from([("set".to_owned(), 1)]))
    } else {
        (
            "Script",
            BTreeMap::from([
                ("evalsha".to_owned(), 1),
                ("get".to_owned(), 1),
                ("set".to_owned(), 1),
            ]),
        )
    };
    assert!(
        chosen.contains(&format!("swap: {method}")),
        "the server {} IFEQ, the store chose: {chosen}",
        if takes_ifeq { "takes" } else { "refuses" }
    );
    let k = key("ifeq");
    let lease = acquire(&store, &k).await;
    let (done, delta) = counted(
        &mut conn,
        store.complete(&lease, Bytes::from_static(b"result"), RETENTION),
    )
    .await;
    done.unwrap();
    assert_eq!(delta, want, "a completion with {method}");
    let replay = store.claim(&request(&k)).await.unwrap();
    assert!(matches!(replay, ClaimOutcome::Completed(_)), "{replay:?}");
    if !takes_ifeq {
        eprintln!(
            "note: this redis-server has no SET IFEQ: the script fallback ran, the IFEQ path did not"
        );
    }
}

/// With the server killed mid-test, every operation answers `Unavailable` or `Timeout` within
/// the command timeout; after it is back on the same port, the same store value works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_unavailable_then_the_same_store_recovers() {
    if !have_redis_binaries() {
        return;
    }
    let server = ServerProcess::start(&[]);
    let timeout = Duration::from_millis(500);
    let store = connect(&server.url(), |c| {
        c.with_command_timeout(timeout)
            .unwrap()
            .with_connect_timeout(Duration::from_millis(300))
            .unwrap()
    })
    .await;
    let held = acquire(&store, &key("before")).await;

    server.kill();
    let slack = Duration::from_millis(500);
    for round in 0..3 {
        let k = key("during");
        let ops: Vec<(&str, PendingError<'_>)> = vec![
            (
                "claim",
                Box::pin(async { store.claim(&request(&k)).await.err() }),
            ),
            (
                "heartbeat",
                Box::pin(async { store.heartbeat(&held, LEASE).await.err() }),
            ),
            (
                "complete",
                Box::pin(async { store.complete(&held, Bytes::new(), RETENTION).await.err() }),
            ),
            (
                "fail",
                Box::pin(async {
                    store
                        .fail(&held, Failure::permanent("x"), RETENTION)
                        .await
                        .err()
                }),
            ),
            (
                "release",
                Box::pin(async { store.release(&held).await.err() }),
            ),
            ("get", Box::pin(async { store.get(&k).await.err() })),
            ("delete", Box::pin(async { store.delete(&k).await.err() })),
            (
                "scan",
                Box::pin(async { store.scan(&ScanQuery::all()).await.err() }),
            ),
            ("ping", Box::pin(async { store.ping().await.err() })),
        ];
        for (op, fut) in ops {
            let started = Instant::now();
            let err = fut.await;
            let took = started.elapsed();
            assert!(
                matches!(
                    err,
                    Some(StoreError::Unavailable { .. } | StoreError::Timeout { .. })
                ),
                "round {round}, {op} while the server is down: {err:?}"
            );
            assert!(err.as_ref().is_some_and(StoreError::is_retryable));
            if round == 0 {
                eprintln!(
                    "server down: {op} answered {} in {took:?}",
                    err.as_ref().map_or("nothing", StoreError::kind)
                );
            }
            assert!(
                took <= timeout + slack,
                "round {round}, {op} took {took:?}, over the timeout of {timeout:?}"
            );
        }
    }

    server.restart();
    recover(&store, "after a restart").await;

    // A server that hangs (SIGSTOP) is a Timeout within the command timeout, and the store
    // works again once it answers.
    server.signal("STOP");
    for op in ["claim", "get"] {
        let started = Instant::now();
        let err = match op {
            "claim" => store.claim(&request(&key("hung"))).await.err(),
            _ => store.get(&key("hung")).await.err(),
        };
        let took = started.elapsed();
        server_is_hung_check(op, err, took, timeout + slack);
    }
    server.signal("CONT");
    recover(&store, "after a hang").await;
}

/// A server restarted while the store was idle: the store's connection is dead, but the first
/// operation after the restart succeeds all the same (it reconnects and sends again), for every
/// kind of operation, so that no caller is failed for a connection that was already gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_operations_after_an_idle_restart_succeed() {
    if !have_redis_binaries() {
        return;
    }
    let server = ServerProcess::start(&[]);
    let store = connect(&server.url(), |c| c).await;
    let held = acquire(&store, &key("before-restart")).await;
    drop(held);

    server.kill();
    server.restart();
    let lease = match store.claim(&request(&key("first-after-restart"))).await {
        Ok(ClaimOutcome::Acquired { lease, .. }) => lease,
        other => panic!("the first claim after a restart: {other:?}"),
    };

    server.kill();
    server.restart();
    let record = store
        .get(&lease.key)
        .await
        .expect("the first get after a restart");
    // Redis runs without persistence here: the restarted server lost the record.
    assert!(record.is_none(), "{record:?}");

    server.kill();
    server.restart();
    // Releasing a record that is gone is answered Ok.
    store
        .release(&lease)
        .await
        .expect("the first release after a restart");

    server.kill();
    server.restart();
    store.ping().await.expect("the first ping after a restart");
}

fn server_is_hung_check(op: &str, err: Option<StoreError>, took: Duration, limit: Duration) {
    assert!(
        matches!(err, Some(StoreError::Timeout { .. })),
        "{op} on a hung server: {err:?}"
    );
    assert!(took <= limit, "{op} on a hung server took {took:?}");
}

/// Claims and completes a fresh key with the same store value until it works (10 s at most).
async fn recover(store: &RedisStore, when: &str) {
    // The same store value: the first operations may still see the old connection fail. A
    // fresh key each time: a claim that timed out may still have been applied.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (k, lease) = loop {
        let k = key(&format!("recovered-{}", rand::random::<u64>()));
        match store.claim(&request(&k)).await {
            Ok(ClaimOutcome::Acquired { lease, .. }) => break (k, lease),
            Ok(other) => panic!("{when}: a fresh key answered {other:?}"),
            Err(err) => {
                assert!(err.is_retryable(), "{when}: {err:?}");
                assert!(
                    Instant::now() < deadline,
                    "{when}: never recovered: {err:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    store
        .complete(&lease, Bytes::from_static(b"back"), RETENTION)
        .await
        .unwrap();
    match store.claim(&request(&k)).await.unwrap() {
        ClaimOutcome::Completed(record) => assert_eq!(record.result.as_deref(), Some(&b"back"[..])),
        other => panic!("expected the stored result, got {other:?}"),
    }
}

/// `MEMORY USAGE` of a completed record with a 200-byte result: at most 392 bytes, with a
/// namespace as long as the default one (`default`, 7 bytes), no scope and a short key.
///
/// Redis counts the key's entry and object, plus the key's allocation and the value's string,
/// both rounded up to jemalloc's size classes (..., 32, 48, 64, ... 256, 320, 384 bytes): the
/// key must stay within 30 bytes (32 allocated) and the value (a 311-byte string of the
/// record layout) within 320.
#[tokio::test]
async fn a_completed_record_with_a_200_byte_result_is_small() {
    let Some(h) = single_harness().await else {
        return;
    };
    // 200 bytes that do not compress.
    let result: Vec<u8> = (0..200u32).map(|i| (i * 97 + 13) as u8).collect();
    let short = format!("m{:06x}", rand::random::<u32>() & 0x00ff_ffff);
    let short_store = connect(&common::single_url(), |c| c.with_namespace(short).unwrap()).await;
    let mut figures = Vec::new();
    for (store, what) in [
        (&short_store, "a 7-byte namespace"),
        (&h.store, "the tests' 17-byte namespace"),
    ] {
        let k = key("memory");
        let lease = acquire(store, &k).await;
        let redis_key = store.redis_key(&k);
        let in_flight = memory_usage(&h, &redis_key).await;
        store
            .complete(&lease, Bytes::from(result.clone()), RETENTION)
            .await
            .unwrap();
        let bytes = memory_usage(&h, &redis_key).await;
        let encoding = h
            .raw(redis::cmd("OBJECT").arg("ENCODING").arg(&redis_key))
            .await;
        assert_eq!(encoding, redis::Value::BulkString(b"raw".to_vec()));
        let record = store.get(&k).await.unwrap().unwrap();
        assert_eq!(record.result.as_deref(), Some(&result[..]));
        // A settled record keeps the owner and the lease of the attempt that settled it.
        assert_eq!(record.owner, lease.owner);
        assert_eq!(record.lease_until, lease.until);
        assert_eq!(record.fence, lease.fence);
        eprintln!(
            "MEMORY USAGE with {what} (key {} bytes): in flight {in_flight} bytes, completed \
             with a 200-byte result {bytes} bytes",
            redis_key.len()
        );
        figures.push((redis_key.len(), bytes));
        h.raw(redis::cmd("DEL").arg(&redis_key)).await;
    }
    let (key_len, bytes) = figures[0];
    assert_eq!(key_len, 30, "idem:{{<7 bytes>::<14 digest characters>}}");
    assert!(bytes <= 392, "{bytes} bytes");
    // A longer key costs one size class more (48 bytes instead of 32), no more.
    assert!(figures[1].1 <= bytes + 16, "{figures:?}");
}

async fn memory_usage(h: &common::RedisHarness, redis_key: &str) -> i64 {
    let usage = h
        .raw(redis::cmd("MEMORY").arg("USAGE").arg(redis_key))
        .await;
    let redis::Value::Int(bytes) = usage else {
        panic!("MEMORY USAGE answered {usage:?}")
    };
    bytes
}

/// The big hammer on the single server: 32 tasks x 2,000 keys, exactly 2,000 executions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hammer_32_tasks_2000_keys() {
    let Some(h) = single_harness().await else {
        return;
    };
    common::big_hammer(&h, "a single server").await;
}

/// A key holding something that is not a record value of this layout (a string of no layout,
/// a hash, a hash of the earlier layouts, a garbled record, a tombstone with a zero fence) is
/// `Corrupt` for every operation, and `delete` clears it.
#[tokio::test]
async fn foreign_values_are_corrupt_and_deletable() {
    let Some(h) = single_harness().await else {
        return;
    };
    let k = key("foreign");
    let redis_key = h.store.redis_key(&k);
    for case in [
        "another type",
        "missing fields",
        "earlier format",
        "garbled meta",
        "zero fence",
    ] {
        let lease = acquire(&h.store, &k).await;
        match case {
            "another type" => {
                h.raw(redis::cmd("DEL").arg(&redis_key)).await;
                h.raw(redis::cmd("SET").arg(&redis_key).arg("not a hash"))
                    .await;
            }
            "missing fields" => {
                h.raw(redis::cmd("DEL").arg(&redis_key)).await;
                h.raw(redis::cmd("HSET").arg(&redis_key).arg("s").arg("c"))
                    .await;
            }
            "earlier format" => {
                // A completed record as 0.x wrote it before the meta field.
                h.raw(redis::cmd("DEL").arg(&redis_key)).await;
                h.raw(redis::cmd("HSET").arg(&redis_key).arg(&[
                    "s",
                    "c",
                    "p",
                    &"p".repeat(32),
                    "o",
                    &"o".repeat(16),
                    "n",
                    "1700000000000000",
                    "l",
                    "1700000030000000",
                    "a",
                    "1",
                    "c",
                    "1700000000000000",
                    "d",
                    "1700000001000000",
                    "x",
                    "9700003600000000",
                    "k",
                    "foreign",
                    "0",
                    "result",
                ]))
                .await;
            }
            "garbled meta" => {
                // This layout's header, then garbage.
                h.raw(redis::cmd("SET").arg(&redis_key).arg(b"\x01r\x00garbage"))
                    .await;
            }
            _ => {
                // A tombstone of this layout, but fence 0.
                let mut value = b"\x01t".to_vec();
                value.extend_from_slice(&[0; 8]);
                h.raw(redis::cmd("SET").arg(&redis_key).arg(value)).await;
            }
        }
        let is_corrupt = |r: Option<StoreError>| matches!(r, Some(StoreError::Corrupt { .. }));
        assert!(
            is_corrupt(h.store.claim(&request(&k)).await.err()),
            "{case}"
        );
        assert!(is_corrupt(h.store.get(&k).await.err()), "{case}");
        assert!(
            is_corrupt(h.store.heartbeat(&lease, LEASE).await.err()),
            "{case}"
        );
        assert!(is_corrupt(h.store.release(&lease).await.err()), "{case}");
        // A scan reports the broken record, named by its Redis key, filtered or not.
        let filtered = ScanQuery::all().with_state(idem_core::State::Completed);
        for query in [ScanQuery::all(), filtered] {
            let page = h.store.scan(&query).await.unwrap();
            assert!(page.records.is_empty(), "{case}");
            assert_eq!(page.unreadable.len(), 1, "{case}: {page:?}");
            assert_eq!(page.unreadable[0].stored_key, redis_key, "{case}");
            assert_eq!(page.unreadable[0].key, None, "{case}");
        }
        assert!(h.store.delete(&k).await.unwrap(), "{case}");
        let lease = acquire(&h.store, &k).await;
        h.store.release(&lease).await.unwrap();
    }
}

/// The Redis key holds no raw client input; the record keeps the key and scope as fields, so
/// a scan can name them.
#[tokio::test]
async fn keys_are_digests_inside_one_hash_tag() {
    let Some(h) = single_harness().await else {
        return;
    };
    let k = RecordKey::new(
        Scope::new("tenant {7}: *").unwrap(),
        IdempotencyKey::new("payment}{42:*capture*").unwrap(),
    );
    acquire(&h.store, &k).await;
    let redis_key = h.store.redis_key(&k);
    assert!(!redis_key.contains("payment"), "{redis_key}");
    assert_eq!(redis_key.matches('{').count(), 1);
    assert_eq!(redis_key.matches('}').count(), 1);
    assert!(redis_key.ends_with('}'));
    let exists = h.raw(redis::cmd("EXISTS").arg(&redis_key)).await;
    assert_eq!(exists, redis::Value::Int(1));
    let page = h.store.scan(&ScanQuery::all()).await.unwrap();
    assert_eq!(page.records.len(), 1);
    assert_eq!(page.records[0].key, k);
    // A TTL is always set: retention is the key's expiry.
    let ttl = h.raw(redis::cmd("PTTL").arg(&redis_key)).await;
    assert!(matches!(ttl, redis::Value::Int(ms) if ms > 0), "{ttl:?}");
}

/// Two keys that share a digest (made here by copying one record under the other's Redis key)
/// never answer each other's record: claim, `get` and `scan` report `Corrupt`, and the holder
/// of the real record is not disturbed.
#[tokio::test]
async fn a_shared_digest_is_corrupt_not_a_wrong_answer() {
    let Some(h) = single_harness().await else {
        return;
    };
    let (a, b) = (key("digest-a"), key("digest-b"));
    let lease = acquire(&h.store, &a).await;
    h.store
        .complete(&lease, Bytes::from_static(b"a's result"), RETENTION)
        .await
        .unwrap();
    let copied = h
        .raw(
            redis::cmd("COPY")
                .arg(h.store.redis_key(&a))
                .arg(h.store.redis_key(&b)),
        )
        .await;
    assert_eq!(copied, redis::Value::Int(1));
    let is_corrupt = |r: Option<StoreError>| matches!(r, Some(StoreError::Corrupt { .. }));
    assert!(is_corrupt(h.store.claim(&request(&b)).await.err()));
    assert!(is_corrupt(h.store.get(&b).await.err()));
    // A scan returns the real record and reports the copy under the other key.
    let page = h.store.scan(&ScanQuery::all()).await.unwrap();
    assert_eq!(page.records.len(), 1, "{page:?}");
    assert_eq!(page.records[0].key, a);
    assert_eq!(page.unreadable.len(), 1, "{page:?}");
    assert_eq!(page.unreadable[0].stored_key, h.store.redis_key(&b));
    assert_eq!(
        page.unreadable[0].reason,
        "the value holds the record of another key"
    );
    // The same for a record in flight.
    let held = acquire(&h.store, &key("digest-c")).await;
    h.raw(
        redis::cmd("COPY")
            .arg(h.store.redis_key(&held.key))
            .arg(h.store.redis_key(&b))
            .arg("REPLACE"),
    )
    .await;
    assert!(is_corrupt(h.store.claim(&request(&b)).await.err()));
    assert!(is_corrupt(h.store.get(&b).await.err()));
    h.store.heartbeat(&held, LEASE).await.unwrap();
    assert!(h.store.delete(&b).await.unwrap());
    match h.store.claim(&request(&a)).await.unwrap() {
        ClaimOutcome::Completed(record) => {
            assert_eq!(record.result.as_deref(), Some(&b"a's result"[..]));
        }
        other => panic!("expected a's record, got {other:?}"),
    }
}

/// The codec byte of `k`'s stored value (its third byte: 0 as it is, 1 lz4).
async fn result_codec(h: &RedisHarness, k: &RecordKey) -> Option<u8> {
    let flag = h
        .raw(
            redis::cmd("GETRANGE")
                .arg(h.store.redis_key(k))
                .arg(2)
                .arg(2),
        )
        .await;
    match flag {
        redis::Value::BulkString(value) => value.first().copied(),
        _ => None,
    }
}

/// With a compression threshold set, results over it are stored lz4-compressed (flagged in the
/// value) and read back byte for byte; results that do not shrink are stored as they are. By
/// default the store compresses nothing: idem-http compresses a response's body itself, and a
/// second pass over it cost time for nothing (before, every result over 1 KiB went through lz4
/// again here).
#[tokio::test]
async fn large_results_are_compressed_over_a_threshold_and_by_default_not_at_all() {
    let Some(h) = single_harness_with(|c| c.with_compression_threshold(1024)).await else {
        return;
    };
    let k = key("big");
    let lease = acquire(&h.store, &k).await;
    let result = Bytes::from(br#"{"id":"ch_1","status":"succeeded","amount":1000}"#.repeat(400));
    h.store
        .complete(&lease, result.clone(), RETENTION)
        .await
        .unwrap();
    assert_eq!(result_codec(&h, &k).await, Some(1));
    let stored = h.raw(redis::cmd("STRLEN").arg(h.store.redis_key(&k))).await;
    let redis::Value::Int(stored) = stored else {
        panic!("{stored:?}")
    };
    assert!(
        (stored as usize) < result.len() / 10,
        "{stored} bytes stored"
    );
    assert_eq!(
        h.store.get(&k).await.unwrap().unwrap().result,
        Some(result.clone())
    );

    let k = key("small");
    let lease = acquire(&h.store, &k).await;
    h.store
        .complete(&lease, Bytes::from_static(b"short"), RETENTION)
        .await
        .unwrap();
    assert_eq!(result_codec(&h, &k).await, Some(0));

    let Some(h) = single_harness().await else {
        return;
    };
    let k = key("big-default");
    let lease = acquire(&h.store, &k).await;
    h.store
        .complete(&lease, result.clone(), RETENTION)
        .await
        .unwrap();
    assert_eq!(result_codec(&h, &k).await, Some(0));
    assert_eq!(h.store.get(&k).await.unwrap().unwrap().result, Some(result));
}

/// A result over the configured limit is refused with `TooLarge`, and the claim stays held.
#[tokio::test]
async fn results_over_the_limit_are_too_large() {
    let Some(h) = single_harness().await else {
        return;
    };
    let store = connect(&common::single_url(), |c| {
        c.with_max_result_size(NonZeroUsize::new(1000).unwrap())
    })
    .await;
    let k = key("too-large");
    let lease = acquire(&store, &k).await;
    let err = store
        .complete(&lease, Bytes::from(vec![0u8; 1001]), RETENTION)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TooLarge {
                size: 1001,
                limit: 1000
            }
        ),
        "{err:?}"
    );
    store.release(&lease).await.unwrap();
    drop(h);
}

/// Fences keep rising when the server's clock steps back after a release, a retryable failure,
/// a delete or an expiry: the key remembers its last fence.
#[tokio::test]
async fn fences_rise_when_the_clock_steps_back() {
    let Some(h) = single_harness().await else {
        return;
    };
    let k = key("skew");
    let mut last = acquire(&h.store, &k).await;
    for round in 0..4 {
        match round {
            0 => h.store.release(&last).await.unwrap(),
            1 => h
                .store
                .fail(&last, Failure::retryable("t"), RETENTION)
                .await
                .unwrap(),
            2 => {
                h.store
                    .complete(&last, Bytes::new(), RETENTION)
                    .await
                    .unwrap();
                assert!(h.store.delete(&k).await.unwrap());
            }
            _ => {
                h.store
                    .complete(&last, Bytes::new(), Duration::from_secs(1))
                    .await
                    .unwrap();
                // Long enough that the step back below leaves it expired.
                h.advance(Duration::from_secs(20)).await;
                assert!(h.store.get(&k).await.unwrap().is_none());
            }
        }
        // The clock steps back 10 seconds.
        h.offset.set_micros(h.offset.micros() - 10_000_000);
        let next = acquire(&h.store, &k).await;
        assert!(
            next.fence > last.fence,
            "round {round}: fence {} after {}",
            next.fence,
            last.fence
        );
        last = next;
    }
}

/// In strict mode a holder whose lease lapsed is refused even if nobody took the key over.
#[tokio::test]
async fn strict_mode_refuses_a_lapsed_holder() {
    let Some(h) = single_harness().await else {
        return;
    };
    let offset = ClockOffset::new();
    let store = connect(&common::single_url(), |c| {
        c.with_lease_policy(LeasePolicy::Strict)
            .with_clock_offset(offset.clone())
    })
    .await;
    let lease = acquire(&store, &key("strict")).await;
    offset.advance(LEASE + Duration::from_secs(1));
    let err = store
        .complete(&lease, Bytes::new(), RETENTION)
        .await
        .unwrap_err();
    assert_eq!(err.rejection(), Some(TransitionRejection::LeaseExpired));
    let err = store.heartbeat(&lease, LEASE).await.unwrap_err();
    assert_eq!(err.rejection(), Some(TransitionRejection::LeaseExpired));
    // A lenient store on the same records lets the holder finish.
    store.release(&lease).await.unwrap();
    drop(h);
}

/// The database setting is honoured: the record lands in that database.
#[tokio::test]
async fn the_database_setting_is_used() {
    let Some(h) = single_harness().await else {
        return;
    };
    let store = connect(&common::single_url(), |c| c.with_database(7).unwrap()).await;
    let k = key("db7");
    let lease = acquire(&store, &k).await;
    let mut conn = redis::Client::open(format!("{}/7", common::single_url()))
        .unwrap()
        .get_connection()
        .unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(store.redis_key(&k))
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, 1);
    store.release(&lease).await.unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(store.redis_key(&k))
        .query(&mut conn)
        .unwrap();
    drop(h);
}

/// A settled record answers every state-changing step of its old holder as the machine says.
#[tokio::test]
async fn a_failed_record_is_replayed_with_its_failure() {
    let Some(h) = single_harness().await else {
        return;
    };
    let k = key("failed");
    let lease = acquire(&h.store, &k).await;
    h.store
        .fail(
            &lease,
            Failure::permanent("card declined: {\"code\":51}"),
            RETENTION,
        )
        .await
        .unwrap();
    match h.store.claim(&request(&k)).await.unwrap() {
        ClaimOutcome::Failed(record) => {
            assert_eq!(record.state, State::Failed);
            assert_eq!(
                record.failure,
                Some(Failure::permanent("card declined: {\"code\":51}"))
            );
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// The user name and password are sent; a wrong password is an error a retry cannot fix.
#[tokio::test]
async fn credentials_are_used() {
    if !have_redis_binaries() {
        return;
    }
    let server = ServerProcess::start(&[
        "--user", "default", "off", "--user", "app", "on", ">s3cret", "~*", "&*", "+@all",
    ]);
    let url = server.url();
    let wrong = RedisConfig::new(url.clone())
        .unwrap()
        .with_username("app")
        .with_password("wrong");
    let err = RedisStore::connect(wrong).await.unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    for config in [
        RedisConfig::new(url.clone())
            .unwrap()
            .with_username("app")
            .with_password("s3cret"),
        RedisConfig::new(format!("redis://app:s3cret@127.0.0.1:{}", server.port)).unwrap(),
    ] {
        let store = RedisStore::connect(config).await.unwrap();
        let lease = acquire(&store, &key("authenticated")).await;
        store.release(&lease).await.unwrap();
    }
}

/// `rediss://` connects over TLS to a server with a self-signed certificate, trusted as the
/// configured root.
#[cfg(feature = "tls")]
#[tokio::test]
async fn rediss_connects_over_tls() {
    if !have_redis_binaries() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("idem-redis-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A test CA, and a server certificate for localhost signed by it.
    let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=idem-test-ca -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout key.pem -out server.csr
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > ext.cnf
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf -out cert.pem"#;
    let made = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !made.is_ok_and(|s| s.success()) {
        idem_testkit::probe::missing("openssl could not make a test certificate");
        return;
    }
    let (ca, cert, key_file) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    let tls_port = idem_testkit::redis_server::free_port(false).to_string();
    let (cert, key_file) = (cert.display().to_string(), key_file.display().to_string());
    let _server = ServerProcess::start(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key_file,
        "--tls-ca-cert-file",
        &ca.display().to_string(),
        "--tls-auth-clients",
        "no",
    ]);
    let config = RedisConfig::new(format!("rediss://localhost:{tls_port}"))
        .unwrap()
        .with_namespace(namespace())
        .unwrap()
        .with_tls_root_certificate(std::fs::read(&ca).unwrap());
    let store = RedisStore::connect(config).await.unwrap();
    let k = key("over-tls");
    let lease = acquire(&store, &k).await;
    store
        .complete(&lease, Bytes::from_static(b"secret"), RETENTION)
        .await
        .unwrap();
    assert!(matches!(
        store.claim(&request(&k)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Paging returns every record once while other keys come and go around it: a page that ends
/// in the middle of a `SCAN` batch carries the rest in its cursor instead of scanning again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_page_through_a_busy_keyspace_once() {
    let Some(h) = single_harness().await else {
        return;
    };
    let mut expected = std::collections::HashSet::new();
    for i in 0..150 {
        let k = key(&format!("paged-{i}"));
        let lease = acquire(&h.store, &k).await;
        h.store
            .complete(&lease, Bytes::new(), RETENTION)
            .await
            .unwrap();
        expected.insert(k);
    }
    // Churn: another namespace grows and shrinks meanwhile.
    let Some(other) = single_harness().await else {
        return;
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (store, stop) = (other.store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let lease = acquire(&store, &key(&format!("churn-{i}"))).await;
                if i.is_multiple_of(2) {
                    store.release(&lease).await.unwrap();
                    store.delete(&lease.key).await.unwrap();
                }
            }
        })
    };
    for limit in [1, 7, 100] {
        let query = ScanQuery::all().with_limit(limit);
        assert_eq!(keys_once(&h.store, &query).await, expected, "limit {limit}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.await.unwrap();
}

/// A filter that few records pass (a handful in flight among many completed) reads the other
/// records' meta only, in growing `SCAN` batches; paging through it still returns each match
/// once, and so does a filter that most records pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_filter_pages_through_every_match_once() {
    let Some(h) = single_harness().await else {
        return;
    };
    let mut completed = std::collections::HashSet::new();
    for i in 0..1200 {
        let k = key(&format!("sparse-done-{i}"));
        let lease = acquire(&h.store, &k).await;
        h.store
            .complete(&lease, Bytes::new(), RETENTION)
            .await
            .unwrap();
        completed.insert(k);
    }
    let mut in_flight = std::collections::HashSet::new();
    for i in 0..5 {
        let k = key(&format!("sparse-held-{i}"));
        acquire(&h.store, &k).await;
        in_flight.insert(k);
    }
    for limit in [1, 2, 100] {
        let query = ScanQuery::all()
            .with_state(idem_core::State::InFlight)
            .with_limit(limit);
        assert_eq!(
            keys_once(&h.store, &query).await,
            in_flight,
            "in flight, limit {limit}"
        );
    }
    for limit in [7, 100] {
        let query = ScanQuery::all()
            .with_state(idem_core::State::Completed)
            .with_limit(limit);
        assert_eq!(
            keys_once(&h.store, &query).await,
            completed,
            "completed, limit {limit}"
        );
    }
    // An age no record has reached leaves out every one.
    let query = ScanQuery::all().with_min_age(Duration::from_secs(3600));
    assert!(keys_once(&h.store, &query).await.is_empty());
}

/// The keys of every record `query` finds, paging; each must come once.
async fn keys_once(store: &RedisStore, query: &ScanQuery) -> std::collections::HashSet<RecordKey> {
    let all = idem_testkit::conformance::scan_all(store, query).await;
    let keys: Vec<RecordKey> = all.into_iter().map(|r| r.key).collect();
    let unique: std::collections::HashSet<RecordKey> = keys.iter().cloned().collect();
    assert_eq!(keys.len(), unique.len(), "a record twice");
    unique
}
