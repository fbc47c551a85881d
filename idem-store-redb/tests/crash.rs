//! Crash safety: a child process completes records as fast as it can and prints each one that
//! was acknowledged; it is killed with SIGKILL at a random moment, 24 times. After each kill
//! the file must open without a repair pass, pass redb's integrity check, and hold every
//! acknowledged completion, with nothing half-written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, ScanQuery, State,
    Store,
};
use idem_store_redb::RedbStore;
use rand::Rng;

/// Set in the child's environment: the file to write.
const CHILD_FILE: &str = "IDEM_REDB_CRASH_FILE";
/// Set in the child's environment: the round, so every round writes new keys.
const CHILD_ROUND: &str = "IDEM_REDB_CRASH_ROUND";
const KILLS: usize = 24;
const CHILD_TASKS: usize = 8;

fn key(name: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(name).unwrap())
}

/// The child: claims and completes fresh keys from 8 tasks until it is killed, printing
/// `ACK <key> .` once `complete` has returned.
#[test]
#[ignore = "the child process of acknowledged_completions_survive_kill_9"]
fn child_process_of_the_crash_test() {
    let (Ok(path), Ok(round)) = (std::env::var(CHILD_FILE), std::env::var(CHILD_ROUND)) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = RedbStore::open(&path).unwrap();
        println!("OPEN {round} .");
        let tasks: Vec<_> = (0..CHILD_TASKS)
            .map(|task| {
                let store = store.clone();
                let round = round.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let name = format!("r{round}-t{task}-{i}");
                        let request = ClaimRequest::new(
                            key(&name),
                            Fingerprint::of(&[name.as_bytes()]),
                            Duration::from_secs(60),
                        );
                        let ClaimOutcome::Acquired { lease, .. } =
                            store.claim(&request).await.unwrap()
                        else {
                            panic!("{name} not acquired")
                        };
                        store
                            .complete(&lease, Bytes::from(name.clone()), Duration::from_secs(3600))
                            .await
                            .unwrap();
                        println!("ACK {name} .");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// Runs the child on `path` for `run_for`, kills it with SIGKILL, and returns the keys it
/// acknowledged (complete lines only).
fn run_and_kill(path: &std::path::Path, round: usize, run_for: Duration) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_process_of_the_crash_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_FILE, path)
        .env(CHILD_ROUND, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut acked = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains("OPEN ") {
                let _ = opened_tx.send(());
            }
            if let Some(name) = line.strip_prefix("ACK ").and_then(|l| l.strip_suffix(" .")) {
                acked.push(name.to_owned());
            }
        }
        acked
    });
    // The random moment counts from the open, so every kill lands while it writes.
    opened_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the child opened the file");
    std::thread::sleep(run_for);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child ended by itself: {status}");
    reader.join().unwrap()
}

#[test]
fn acknowledged_completions_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let mut rng = rand::rng();
    let mut acked: HashSet<String> = HashSet::new();
    let started = Instant::now();
    for round in 0..KILLS {
        let run_for = Duration::from_millis(rng.random_range(5..250));
        let new = run_and_kill(&path, round, run_for);
        acked.extend(new.iter().cloned());

        // Opens without a repair pass, and passes redb's own integrity check.
        let repaired = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&repaired);
        let mut db = redb::Database::builder()
            .set_repair_callback(move |_| flag.store(true, Ordering::SeqCst))
            .open(&path)
            .unwrap();
        assert!(
            !repaired.load(Ordering::SeqCst),
            "round {round}: the file needed a repair"
        );
        assert!(
            db.check_integrity().unwrap(),
            "round {round}: integrity check failed"
        );
        drop(db);

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = RedbStore::open(&path).unwrap();
            // Every acknowledged completion is there, with its result.
            for name in &acked {
                let record = store.get(&key(name)).await.unwrap();
                let record = record.unwrap_or_else(|| panic!("round {round}: {name} lost"));
                assert_eq!(record.state, State::Completed, "round {round}: {name}");
                assert_eq!(record.result.as_deref(), Some(name.as_bytes()));
            }
            // Nothing half-written: every record decodes (a scan reports a corrupt one as
            // unreadable), and is either completed with its own name or still in flight.
            let mut query = ScanQuery::all().with_limit(1_000);
            let mut records = 0;
            loop {
                let page = store.scan(&query).await.unwrap();
                assert!(page.unreadable.is_empty(), "{:?}", page.unreadable);
                for record in &page.records {
                    records += 1;
                    match record.state {
                        State::Completed => assert_eq!(
                            record.result.as_deref(),
                            Some(record.key.key.as_str().as_bytes())
                        ),
                        State::InFlight => {}
                        State::Failed | State::Unknown => {
                            panic!("a {} record nobody wrote", record.state)
                        }
                    }
                }
                match page.next_cursor {
                    Some(cursor) => query.cursor = Some(cursor),
                    None => break,
                }
            }
            assert!(records >= acked.len());
        });
        eprintln!(
            "round {round}: killed after {run_for:?}, {} new acknowledged completions, {} in all",
            new.len(),
            acked.len()
        );
    }
    assert!(
        acked.len() > KILLS,
        "the child acknowledged too little to prove anything"
    );
    eprintln!(
        "{KILLS} kills in {:.1?}: every one of {} acknowledged completions survived, no repair",
        started.elapsed(),
        acked.len()
    );
}
