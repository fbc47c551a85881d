//! The end-to-end tests that every shared store (Redis, a Redis Cluster, PostgreSQL) runs the
//! same way: the section-5 basics through the gateway, two `idem serve` processes on one
//! store under a storm of one key, and a gateway killed with `kill -9` mid-request whose key
//! the other one takes over after the lease. Each takes the `[store]` section (URL and a
//! namespace of the test's own) as TOML text.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use idem_core::{IdempotencyKey, RecordKey, State, Store};

use super::{Fixture, Http, Proc, config, spawn_gateway};

/// A name of the test's own (a namespace, a schema): `prefix` and a random suffix.
pub fn unique_name(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{prefix}{:016x}",
        RandomState::new().hash_one(std::process::id())
    )
}

/// The `[store]` section naming the store at `url` and `namespace`.
pub fn store_section(url: &str, namespace: &str) -> String {
    format!("[store]\nurl = \"{url}\"\nnamespace = \"{namespace}\"\n")
}

/// A config file in the temporary folder, removed when dropped.
pub struct ConfigFile(PathBuf);

impl ConfigFile {
    /// The file's path, as `idem serve --config` takes it.
    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A config file for `idem serve --config`: the `store` section, the admin listener off, a
/// retention of two minutes, then `extra` TOML. Named after `name`.
pub fn config_file(name: &str, store: &str, extra: &str) -> ConfigFile {
    let path = std::env::temp_dir().join(format!("idem-{name}.toml"));
    let text =
        format!("{store}\n[admin]\nenabled = false\n\n[idempotency]\nretention = \"2m\"\n{extra}");
    std::fs::write(&path, text).unwrap();
    ConfigFile(path)
}

/// Two `idem serve` processes on `store` (a config file named after `name`) in front of
/// `fixture`, each on a free port, with `extra` arguments.
fn two_gateways(
    name: &str,
    store: &str,
    fixture: &Fixture,
    extra: &[&str],
) -> [(Proc, SocketAddr); 2] {
    let file = config_file(name, store, "");
    let upstream = format!("http://{}", fixture.addr);
    let mut args = vec![
        "--config",
        file.path(),
        "--upstream",
        &upstream,
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    [spawn_gateway(&args), spawn_gateway(&args)]
}

/// A Redis store (one server or a Cluster, by `url`) in `namespace`, as the gateway opens it.
#[cfg(feature = "redis")]
pub async fn redis_store(url: &str, namespace: &str) -> Arc<dyn Store> {
    use idem_store_redis::{RedisConfig, RedisStore};
    let config = RedisConfig::from_url(url)
        .unwrap()
        .with_namespace(namespace)
        .unwrap();
    Arc::new(RedisStore::connect(config).await.unwrap())
}

/// DESIGN.md section 5 through a gateway (in this process) on `store`: the first call 201, a
/// retry the byte-identical replay with `Idempotent-Replayed: true`, a changed body 422, a
/// missing key 400 on a route that requires one, and a 500 (not stored) runs again.
pub async fn section_5_basics(store: &str) {
    let fixture = Fixture::start();
    let route = "[[route]]\nname = \"payments\"\npath = \"/echo\"\nkey = \"required\"\n";
    let config = config(
        fixture.addr,
        &format!("{store}\n[idempotency]\nretention = \"2m\"\n\n{route}"),
    );
    let running = idem_gateway::commands::start(&config, None, std::future::pending())
        .await
        .unwrap();
    let echo = format!("http://{}/echo", running.listen);
    let http = Http::new();
    let first = http.post_key(&echo, "k1", "a").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed());
    let replay = http.post_key(&echo, "k1", "a").await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("content-type"), first.header("content-type"));
    assert_eq!(http.post_key(&echo, "k1", "b").await.status, 422);
    let missing = http.send(Method::POST, &echo, &[], "a").await;
    assert_eq!(missing.status, 400, "{}", missing.text());
    let failing = format!("http://{}/status/500", running.listen);
    assert_eq!(http.post_key(&failing, "k5", "").await.status, 500);
    assert_eq!(http.post_key(&failing, "k5", "").await.status, 500);
    assert_eq!(
        fixture.count().await,
        3,
        "k1 once, the 500 twice, the 422 and the 400 never"
    );
    running.stop().await.unwrap();
}

/// Two `idem serve` processes on `store`, in front of one upstream: 200 concurrent requests
/// with one key, split across both, execute once; every other answer is a 409 or a replay of
/// the same bytes; afterwards both gateways replay. `name` names the config file.
pub async fn two_gateways_200_concurrent_same_key_requests_execute_once(name: &str, store: &str) {
    let fixture = Fixture::start();
    let [(_a, addr_a), (_b, addr_b)] = two_gateways(name, store, &fixture, &[]);
    let http = Http::new();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let http = http.clone();
        let addr = if i % 2 == 0 { addr_a } else { addr_b };
        tasks.push(tokio::spawn(async move {
            http.post_key(&format!("http://{addr}/slow?ms=200"), "once", "")
                .await
        }));
    }
    let mut executed = Vec::new();
    let mut replays = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            200 if reply.replayed() => replays.push(reply.body),
            200 => executed.push(reply.body),
            409 => conflicts += 1,
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    assert_eq!(
        executed.len(),
        1,
        "replayed {}, conflicts {conflicts}",
        replays.len()
    );
    assert_eq!(executed.len() + replays.len() + conflicts, 200);
    assert!(
        replays.iter().all(|body| *body == executed[0]),
        "a replay differs from the execution"
    );
    assert_eq!(fixture.count().await, 1, "the upstream counter");
    // Afterwards both gateways replay.
    for addr in [addr_a, addr_b] {
        let reply = http
            .post_key(&format!("http://{addr}/slow?ms=200"), "once", "")
            .await;
        assert!(reply.replayed(), "{}", reply.status);
        assert_eq!(reply.body, executed[0]);
    }
}

/// Two `idem serve` processes on `store` with a lease of two seconds: gateway A is killed
/// with `kill -9` while it runs a slow request. Its key stays held (409 through B) until the
/// lease lapses; then a retry through B takes over and runs once, and later ones replay.
/// `connect` opens the same store in the same namespace, to see A's claim; it is awaited once
/// both gateways run (a PostgreSQL gateway has migrated its schema by then). `name` names the
/// config file.
pub async fn a_gateway_killed_mid_request_is_taken_over_after_the_lease(
    name: &str,
    store: &str,
    connect: impl Future<Output = Arc<dyn Store>>,
) {
    let fixture = Fixture::start();
    let [(mut a, addr_a), (_b, addr_b)] = two_gateways(name, store, &fixture, &["--lease", "2s"]);
    let http = Http::new();
    let url_a = format!("http://{addr_a}/slow?ms=3000");
    let url_b = format!("http://{addr_b}/slow?ms=3000");
    let pending = tokio::spawn({
        let http = http.clone();
        async move {
            http.try_send(Method::POST, &url_a, &[("idempotency-key", "crash")], "")
                .await
        }
    });
    // Wait until A holds the key (read from the store, so nothing else claims it).
    let store = connect.await;
    let key = RecordKey::unscoped(IdempotencyKey::new("crash").unwrap());
    let mut held = false;
    for _ in 0..250 {
        if store
            .get(&key)
            .await
            .unwrap()
            .is_some_and(|record| record.state == State::InFlight)
        {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(held, "gateway A never claimed the key");
    let killed_at = Instant::now();
    // SIGKILL: no drain, no release.
    a.child.kill().unwrap();
    let _ = a.child.wait();
    assert!(
        pending.await.unwrap().is_err(),
        "the client of A lost its connection"
    );
    // Still held until the lease runs out.
    assert_eq!(http.post_key(&url_b, "crash", "").await.status, 409);
    // Retries through B: 409 until the lease lapses, then one takes over and runs; concurrent
    // retries meanwhile get 409, later ones the replay.
    let deadline = Instant::now() + Duration::from_secs(15);
    let taken_over = loop {
        let reply = http.post_key(&url_b, "crash", "").await;
        if reply.status != 409 {
            break reply;
        }
        assert!(Instant::now() < deadline, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        killed_at.elapsed() >= Duration::from_millis(1500),
        "taken over before the lease ended"
    );
    assert_eq!(taken_over.status, 200, "{}", taken_over.text());
    assert!(!taken_over.replayed());
    assert_eq!(
        fixture.count().await,
        1,
        "A's upstream call died with it; B's ran once"
    );
    let replay = http.post_key(&url_b, "crash", "").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken_over.body);
    assert_eq!(fixture.count().await, 1);
}
