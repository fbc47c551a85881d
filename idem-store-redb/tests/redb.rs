//! What the redb store adds to the contract: the file outlives the process, sweep and compact,
//! one process per file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, Lease, ManualClock, RecordKey,
    Store, StoreError, Timestamp,
};
use idem_store_redb::RedbStore;

fn request(name: &str) -> ClaimRequest {
    ClaimRequest::new(
        RecordKey::unscoped(IdempotencyKey::new(name).unwrap()),
        Fingerprint::of(&[name.as_bytes()]),
        Duration::from_secs(30),
    )
}

async fn acquire(store: &RedbStore, name: &str) -> Lease {
    match store.claim(&request(name)).await.unwrap() {
        ClaimOutcome::Acquired { lease, .. } => lease,
        other => panic!("{name}: not acquired: {other:?}"),
    }
}

fn open(path: &std::path::Path, clock: &ManualClock) -> RedbStore {
    RedbStore::builder()
        .clock(clock.clone())
        .open(path)
        .unwrap()
}

#[tokio::test]
async fn records_and_fences_survive_a_reopen_even_with_a_stopped_clock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = open(&path, &clock);
    let first = acquire(&store, "k").await;
    store
        .complete(&first, Bytes::from_static(b"r"), Duration::from_secs(60))
        .await
        .unwrap();
    let in_flight = acquire(&store, "in-flight").await;
    drop(store);

    let store = open(&path, &clock);
    match store.claim(&request("k")).await.unwrap() {
        ClaimOutcome::Completed(record) => assert_eq!(record.result.as_deref(), Some(&b"r"[..])),
        other => panic!("expected Completed, got {other:?}"),
    }
    // The holder of a claim made before the restart still holds it.
    store
        .complete(&in_flight, Bytes::new(), Duration::from_secs(60))
        .await
        .unwrap();
    // Deleted, reopened, claimed again at the same instant: the fence still rises.
    assert!(store.delete(&first.key).await.unwrap());
    drop(store);
    let store = open(&path, &clock);
    let second = acquire(&store, "k").await;
    assert!(
        second.fence > first.fence,
        "{} <= {}",
        second.fence,
        first.fence
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_expired_records_and_compact_gives_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = open(&path, &clock);
    let big = Bytes::from(vec![7u8; 4096]);
    // 30 tasks at once, so the writer commits them in batches.
    let tasks: Vec<_> = (0..30)
        .map(|task| {
            let store = store.clone();
            let big = big.clone();
            tokio::spawn(async move {
                for i in (task..1_500).step_by(30) {
                    let lease = acquire(&store, &format!("k{i}")).await;
                    let retention = if i < 1_200 { 60 } else { 3600 };
                    store
                        .complete(&lease, big.clone(), Duration::from_secs(retention))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(store.sweep().await.unwrap(), 0, "nothing expired yet");
    let records = |store: &RedbStore| store.stats().expect("redb counts its records").records;
    assert_eq!(records(&store), 1_500);
    clock.advance(Duration::from_secs(61));
    assert!(
        store.get(&request("k0").key).await.unwrap().is_none(),
        "expired on read"
    );
    assert_eq!(records(&store), 1_500, "expired records count until swept");
    assert_eq!(store.sweep().await.unwrap(), 1_200);
    assert_eq!(records(&store), 300);
    assert!(store.get(&request("k1300").key).await.unwrap().is_some());
    let before = std::fs::metadata(&path).unwrap().len();
    assert!(store.compact().await.unwrap());
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        after < before,
        "compaction shrank nothing: {before} -> {after}"
    );
    // Still a working store.
    acquire(&store, "after-compaction").await;
    assert_eq!(
        store
            .get(&request("k1499").key)
            .await
            .unwrap()
            .unwrap()
            .result,
        Some(big)
    );
}

#[tokio::test]
async fn a_file_has_one_owner_and_is_free_once_the_store_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let store = RedbStore::open(&path).unwrap();
    let err = RedbStore::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let clone = store.clone();
    drop(store);
    acquire(&clone, "still open").await;
    drop(clone);
    RedbStore::open(&path).unwrap();
}

/// Set in the child's environment: the file the child holds open.
const HOLDER_FILE: &str = "IDEM_REDB_HOLDER_FILE";

/// The child of `a_file_open_in_another_process_is_a_clear_error`: opens the store, says so,
/// and holds it until its stdin closes.
#[test]
#[ignore = "the child process of a_file_open_in_another_process_is_a_clear_error"]
fn child_process_holding_the_file() {
    let Ok(path) = std::env::var(HOLDER_FILE) else {
        return;
    };
    let store = RedbStore::open(&path).unwrap();
    println!("OPEN .");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(store);
}

#[test]
fn a_file_open_in_another_process_is_a_clear_error() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_process_holding_the_file",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_FILE, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let opened = stdout
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("OPEN ."));
    assert!(opened, "the child did not open the file");

    let err = RedbStore::open(&path).unwrap_err();
    child.kill().unwrap();
    child.wait().unwrap();
    // Retryable (the other process may be on its way out), and the message says which file
    // and why.
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()),
        "the message names the file: {message}"
    );
    assert!(
        message.contains("another process"),
        "the message says why: {message}"
    );
    // Once the holder is gone (even killed), the file opens.
    RedbStore::open(&path).unwrap();
}

#[tokio::test]
async fn a_file_that_is_not_a_store_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.redb");
    std::fs::write(&path, vec![0xabu8; 8192]).unwrap();
    let err = RedbStore::open(&path).unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()),
        "the message names the file: {message}"
    );
}
