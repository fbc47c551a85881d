//! End-to-end on the redb store (feature `redb`): a stored response survives a gateway killed
//! with `kill -9` and started again on the same file.

#![cfg(feature = "redb")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Fixture, Http, assert_one_error_line, idem_command, spawn_gateway};
use http::Method;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_stored_in_redb_is_replayed_after_kill_9_and_restart() {
    let fixture = Fixture::start();
    let dir = std::env::temp_dir().join(format!("idem-gw-redb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("redb:{}", dir.join("records.redb").display());
    let upstream = format!("http://{}", fixture.addr);
    let args = [
        "--store",
        &store,
        "--upstream",
        &upstream,
        "--listen",
        "127.0.0.1:0",
        "--no-admin",
    ];
    // One name for both processes (each listens on a port of its own).
    let http = Http::behind("idem.test");

    let (mut first, addr) = spawn_gateway(&args);
    let reply = http
        .post_key(&format!("http://{addr}/echo"), "durable", "kept")
        .await;
    assert_eq!(reply.status, 201);
    first.child.kill().unwrap();
    let _ = first.child.wait();

    let (_second, addr) = spawn_gateway(&args);
    let replay = http
        .post_key(&format!("http://{addr}/echo"), "durable", "kept")
        .await;
    assert!(replay.replayed(), "{}", replay.status);
    assert_eq!(replay.text(), "kept");
    assert_eq!(fixture.count().await, 1);
    drop(_second);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn store_migrate_creates_or_checks_the_file_and_fails_on_a_bad_path() {
    let migrate = |store: &str| {
        idem_command("store")
            .args(["migrate", "--store", store])
            .output()
            .unwrap()
    };
    let bad = migrate("redb:/nonexistent/dir/x.redb");
    assert_one_error_line(&bad, 1, "store redb:/nonexistent/dir/x.redb: ");

    let dir = std::env::temp_dir().join(format!("idem-gw-redb-migrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("records.redb");
    let store = format!("redb:{}", file.display());
    let created = migrate(&store);
    let out = String::from_utf8_lossy(&created.stdout);
    assert!(created.status.success(), "{out}");
    assert!(out.contains("created"), "{out}");
    assert!(file.exists());
    let checked = migrate(&store);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{out}");
    assert!(out.contains("checked"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn keys_commands_do_not_create_a_store_file() {
    let dir = std::env::temp_dir().join(format!("idem-gw-redb-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mistyped.redb");
    let store = format!("redb:{}", file.display());
    let got = idem_command("keys")
        .args(["get", "k", "--store", &store])
        .output()
        .unwrap();
    assert_one_error_line(&got, 1, &format!("store {store}: no such file"));
    assert!(!file.exists(), "idem keys created a store file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `idem keys` on a redb file a running gateway holds cannot open it (one owner at a time):
/// the one error line says so and points to the gateway's admin listener, which answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_a_file_a_gateway_holds_points_to_its_admin_listener() {
    let fixture = Fixture::start();
    let dir = std::env::temp_dir().join(format!("idem-gw-redb-held-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("redb:{}", dir.join("records.redb").display());
    let admin = common::free_addr().to_string();
    let (_gateway, addr) = spawn_gateway(&[
        "--store",
        &store,
        "--upstream",
        &format!("http://{}", fixture.addr),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        &admin,
    ]);
    let reply = Http::new()
        .post_key(&format!("http://{addr}/echo"), "held", "x")
        .await;
    assert_eq!(reply.status, 201);
    let direct = idem_command("keys")
        .args(["get", "held", "--store", &store])
        .output()
        .unwrap();
    assert_one_error_line(&direct, 1, &format!("store {store}: "));
    let stderr = String::from_utf8_lossy(&direct.stderr);
    assert!(stderr.contains("--admin http://ADMIN_ADDR"), "{stderr}");
    let asked = idem_command("keys")
        .args(["get", "held", "--admin", &format!("http://{admin}")])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&asked.stdout);
    assert!(asked.status.success(), "{out}");
    assert!(out.contains("state: completed"), "{out}");
    drop(_gateway);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of this test process, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("idem-gw-redb-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A store file at `path` holding `count` completed records under each of the prefixes.
async fn filled(path: &std::path::Path, prefixes: &[&str], count: usize) {
    use idem_core::Store as _;
    use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey};
    let store = idem::redb::RedbStore::open(path).unwrap();
    for prefix in prefixes {
        for i in 0..count {
            let name = format!("{prefix}-{i:05}");
            let request = ClaimRequest::new(
                RecordKey::unscoped(IdempotencyKey::new(name.as_str()).unwrap()),
                Fingerprint::of(&[name.as_bytes()]),
                Duration::from_secs(30),
            );
            let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await.unwrap() else {
                panic!("{name}: not acquired");
            };
            store
                .complete(
                    &lease,
                    Bytes::from(vec![b'r'; 300]),
                    Duration::from_secs(3600),
                )
                .await
                .unwrap();
        }
    }
}

/// `len` bytes that look random (xorshift from `seed`).
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed.to_le_bytes()[0]
        })
        .collect()
}

/// Overwrites the file at `path` from `offset` with `bytes`, through a descriptor of its own.
fn overwrite(path: &std::path::Path, offset: u64, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

/// A damaged store file (cut to half its length, or random bytes over its middle) is one
/// error line and exit 1 for `idem serve`, `idem keys list` and `idem store sweep`, and no
/// panic: before, each exited 101 with redb's panic (`assertion failed: storage.raw_file_len()?
/// >= header.layout().len()`, `entered unreachable code`) and a backtrace on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_is_one_error_line_and_exit_1_not_a_panic() {
    let dir = Scratch::new("damaged");
    let truncated = dir.path().join("truncated.redb");
    filled(&truncated, &["k"], 2000).await;
    let scrambled = dir.path().join("scrambled.redb");
    std::fs::copy(&truncated, &scrambled).unwrap();
    let len = std::fs::metadata(&truncated).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    overwrite(
        &scrambled,
        len / 4,
        &noise(usize::try_from(len / 2).unwrap(), 7),
    );

    for file in [&truncated, &scrambled] {
        let store = format!("redb:{}", file.display());
        let runs: [&[&str]; 3] = [
            &[
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
                "--no-admin",
            ],
            &["keys", "list"],
            &["store", "sweep"],
        ];
        for args in runs {
            let output = idem_command(args[0])
                .args(&args[1..])
                .args(["--store", &store])
                .env("RUST_BACKTRACE", "1")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
            assert_one_error_line(
                &output,
                1,
                &format!(
                    "store {store}: corrupt record at {}: the store file is damaged",
                    file.display()
                ),
            );
        }
    }
}

/// An existing empty store file is refused, exit 1 with one line that says how to start a new
/// store in it, and left empty: before, `idem serve` took it as a new store, and every
/// response it had stored was lost without a word. `--redb-allow-empty` starts one on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_file_is_refused_unless_redb_allow_empty() {
    let dir = Scratch::new("empty");
    let file = dir.path().join("records.redb");
    std::fs::File::create(&file).unwrap();
    let store = format!("redb:{}", file.display());
    let serve = [
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--no-admin",
    ];
    let refused = idem_command("serve")
        .args(serve)
        .args(["--store", &store])
        .output()
        .unwrap();
    assert_one_error_line(&refused, 1, &format!("store {store}: "));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("is empty (0 bytes)") && stderr.contains("--redb-allow-empty"),
        "{stderr}"
    );
    for args in [
        &["keys", "list"][..],
        &["store", "migrate"],
        &["store", "sweep"],
    ] {
        let output = idem_command(args[0])
            .args(&args[1..])
            .args(["--store", &store])
            .output()
            .unwrap();
        assert_one_error_line(&output, 1, &format!("store {store}: "));
    }
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        0,
        "the empty file was written"
    );

    let (gateway, _) =
        spawn_gateway(&[&serve[..], &["--store", &store, "--redb-allow-empty"]].concat());
    drop(gateway);
    assert!(std::fs::metadata(&file).unwrap().len() > 0);
    // A store file now: it opens without the flag.
    let checked = idem_command("store")
        .args(["migrate", "--store", &store])
        .output()
        .unwrap();
    assert!(checked.status.success(), "{checked:?}");
}

/// The file is damaged under a running gateway, where only the records of the `zz` keys lie.
/// Before, the request whose claim met the damage killed the store's writer thread, every
/// covered request was 503 `the redb writer stopped` from then on, and `/readyz` said ready
/// (its probe reads a key in an intact page). Now the store is damaged for good, and
/// `/readyz` says so with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_once_the_redb_store_fails() {
    let fixture = Fixture::start();
    let dir = Scratch::new("readyz");
    let file = dir.path().join("records.redb");
    filled(&file, &["aa", "zz"], 2000).await;
    // No page cache to speak of: every read goes to the file.
    let store = idem::redb::RedbStore::builder()
        .cache_size(0)
        .open(&file)
        .unwrap();
    let config = common::config(fixture.addr, "");
    let running = idem_gateway::start_with_store(
        &config,
        std::sync::Arc::new(store),
        None,
        std::future::pending(),
    )
    .await
    .unwrap();
    let admin = format!("http://{}", running.admin.unwrap());
    let url = format!("http://{}/echo", running.listen);
    let http = Http::new();
    let readyz = format!("{admin}/readyz");
    assert_eq!(http.send(Method::GET, &readyz, &[], "").await.status, 200);

    let bytes = std::fs::read(&file).unwrap();
    let mut pages: Vec<usize> = bytes
        .windows(3)
        .enumerate()
        .filter(|(_, window)| *window == b"zz-")
        .map(|(at, _)| at / 4096)
        .collect();
    pages.dedup();
    for page in &pages {
        let offset = u64::try_from(page * 4096).unwrap();
        overwrite(&file, offset, &noise(4096, offset + 1));
    }

    let damaged = http.post_key(&url, "zz-01000", "x").await;
    assert!(damaged.status >= 500, "{}", damaged.status);
    let ready = http.send(Method::GET, &readyz, &[], "").await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(
        ready.text().contains("the store file is damaged"),
        "{}",
        ready.text()
    );
    // The fixture never ran a request: the gateway refused before the upstream.
    assert_eq!(fixture.count().await, 0);
}
