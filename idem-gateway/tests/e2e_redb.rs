//! End-to-end on the redb store (feature `redb`): a stored response survives a gateway killed
//! with `kill -9` and started again on the same file.

#![cfg(feature = "redb")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Fixture, Http, assert_one_error_line, idem_command, spawn_gateway};

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
