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

use super::{Fixture, Http, Proc, Reply, config, read_until, spawn_gateway};

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

/// Two `idem serve` processes on `store` (a config file named after `name`), the first in front
/// of `upstreams[0]` and the second of `upstreams[1]`, each on a free port, with `extra`
/// arguments.
fn two_gateways(
    name: &str,
    store: &str,
    upstreams: [SocketAddr; 2],
    extra: &[&str],
) -> [(Proc, SocketAddr); 2] {
    let file = config_file(name, store, "");
    upstreams.map(|upstream| {
        let upstream = format!("http://{upstream}");
        let mut args = vec![
            "--config",
            file.path(),
            "--upstream",
            &upstream,
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        spawn_gateway(&args)
    })
}

/// A Redis store (one server or a Cluster, by `url`) in `namespace`, as the gateway opens it.
#[cfg(feature = "redis")]
pub async fn redis_store(url: &str, namespace: &str) -> Arc<dyn Store> {
    let spec: idem::StoreSpec = url.parse().unwrap();
    idem::OpenOptions::new(namespace)
        .open(&spec)
        .await
        .unwrap()
        .store
}

/// The layer's behaviours (idem-http's README) through a gateway (in this process) on `store`: the first call 201, a
/// retry the byte-identical replay with `Idempotent-Replayed: true`, a changed body 422, a
/// missing key 400 on a route that requires one, and a 500 (not stored) runs again.
pub async fn section_5_basics(store: &str) {
    let fixture = Fixture::start();
    let route = "[[route]]\nname = \"payments\"\npath = \"/echo\"\nkey = \"required\"\n";
    let config = config(
        fixture.addr,
        &format!("{store}\n[idempotency]\nretention = \"2m\"\n\n{route}"),
    );
    let running = idem_gateway::start(&config, None, std::future::pending())
        .await
        .unwrap();
    let echo = format!("http://{}/echo", running.listen);
    let http = Http::behind("idem.test");
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
    let [(_a, addr_a), (_b, addr_b)] = two_gateways(name, store, [fixture.addr; 2], &[]);
    let http = Http::behind("idem.test");
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
    let [(mut a, addr_a), (_b, addr_b)] =
        two_gateways(name, store, [fixture.addr; 2], &["--lease", "2s"]);
    let http = Http::behind("idem.test");
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
    let taken_over = kill_and_take_over(&mut a, pending, &http, &url_b, "crash", "").await;
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

/// A client's request to gateway A, spawned.
type Pending = tokio::task::JoinHandle<Result<Reply, Box<dyn std::error::Error + Send + Sync>>>;

/// Kills gateway `a` with SIGKILL (no drain, no release) while it holds `key` for the client
/// `pending`, then retries POST `url_b` (gateway B) with `key` and `body`: 409 while A's lease
/// holds, until the lease lapses and one retry takes the key over. Returns that retry's answer.
async fn kill_and_take_over(
    a: &mut Proc,
    pending: Pending,
    http: &Http,
    url_b: &str,
    key: &str,
    body: &str,
) -> Reply {
    a.child.kill().unwrap();
    let _ = a.child.wait();
    assert!(
        pending.await.unwrap().is_err(),
        "the client of A lost its connection"
    );
    // Still held until the lease runs out.
    assert_eq!(http.post_key(url_b, key, body).await.status, 409);
    // Retries through B: 409 until the lease lapses, then one takes over and runs; concurrent
    // retries meanwhile get 409, later ones the replay.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let reply = http.post_key(url_b, key, body).await;
        if reply.status != 409 {
            return reply;
        }
        assert!(Instant::now() < deadline, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The fenced upstream of `examples/fenced-upstream` (Python's standard library and SQLite)
/// as a process, on a free port, with a database file of its own; `None` (the test then ends)
/// when `python3` is missing and the run asked to skip (under CI it fails the test, see
/// `idem_testkit::probe`).
pub struct FencedUpstream {
    process: Proc,
    pub addr: SocketAddr,
    db: PathBuf,
}

impl FencedUpstream {
    pub fn start(name: &str) -> Option<FencedUpstream> {
        let db = std::env::temp_dir().join(format!("idem-{name}.sqlite3"));
        FencedUpstream::remove(&db);
        let (child, addr) = FencedUpstream::spawn(&db, "127.0.0.1:0")?;
        Some(FencedUpstream {
            process: Proc { child },
            addr,
            db,
        })
    }

    /// The script on `listen` over the database `db`, and the address it listens on.
    fn spawn(db: &std::path::Path, listen: &str) -> Option<(std::process::Child, SocketAddr)> {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/fenced-upstream/fenced_upstream.py"
        );
        let spawned = std::process::Command::new("python3")
            .arg(script)
            .args(["--listen", listen, "--quiet", "--db"])
            .arg(db)
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(err) => {
                idem_testkit::probe::missing(&format!(
                    "python3 cannot be run ({err}): the fenced upstream example needs it"
                ));
                return None;
            }
        };
        let addr = read_until(&mut child, "listening on").parse().unwrap();
        Some((child, addr))
    }

    /// Kills the process with `SIGKILL` (its database stays), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
    }

    /// Starts the process again on the same address and database.
    pub fn restart(&mut self) {
        let listen = self.addr.to_string();
        let (child, _) = FencedUpstream::spawn(&self.db, &listen).unwrap();
        self.process = Proc { child };
    }

    /// The payments made for `key`.
    pub async fn payments(&self, key: &str) -> Vec<serde_json::Value> {
        let url = format!("http://{}/payments?key={key}", self.addr);
        let reply = Http::new().send(Method::GET, &url, &[], "").await;
        let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        value["payments"].as_array().unwrap().clone()
    }

    fn remove(db: &std::path::Path) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = db.as_os_str().to_owned();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for FencedUpstream {
    fn drop(&mut self) {
        FencedUpstream::remove(&self.db);
    }
}

/// A gate on the way to an upstream, for the one request of a gateway that will be killed: it
/// takes the request whole and holds it, tells the test it [arrived](Gate::arrived), and
/// passes it on only when the test [opens](Gate::open) it: the request reaches the upstream
/// as late as a packet stuck in a network, after its gateway died.
pub struct Gate {
    pub addr: SocketAddr,
    arrived: Option<tokio::sync::oneshot::Receiver<Vec<u8>>>,
    open: Option<tokio::sync::oneshot::Sender<()>>,
    answer: Option<tokio::sync::oneshot::Receiver<Vec<u8>>>,
}

impl Gate {
    /// A gate in front of `upstream`, on a free port.
    pub async fn start(upstream: SocketAddr) -> Gate {
        use tokio::sync::oneshot;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (arrived_tx, arrived) = oneshot::channel();
        let (open, open_rx) = oneshot::channel::<()>();
        let (answer_tx, answer) = oneshot::channel();
        tokio::spawn(async move {
            let (mut client, _) = listener.accept().await.unwrap();
            let request = read_message(&mut client).await;
            let _ = arrived_tx.send(request.clone());
            open_rx.await.unwrap();
            let mut upstream = tokio::net::TcpStream::connect(upstream).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut upstream, &request)
                .await
                .unwrap();
            let _ = answer_tx.send(read_message(&mut upstream).await);
        });
        Gate {
            addr,
            arrived: Some(arrived),
            open: Some(open),
            answer: Some(answer),
        }
    }

    /// Waits until the request has come whole; returns it as it came.
    pub async fn arrived(&mut self) -> String {
        text_within(self.arrived.take().unwrap(), "no request reached the gate").await
    }

    /// Passes the held request on; returns the upstream's answer as it came.
    pub async fn open(&mut self) -> String {
        self.open.take().unwrap().send(()).unwrap();
        let answer = self.answer.take().unwrap();
        text_within(answer, "the upstream did not answer the held request").await
    }
}

/// The message `message` brings, as text, within 30 seconds (else the test fails with `late`).
async fn text_within(message: tokio::sync::oneshot::Receiver<Vec<u8>>, late: &str) -> String {
    let bytes = tokio::time::timeout(Duration::from_secs(30), message)
        .await
        .expect(late)
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

/// One HTTP/1.1 message read from `stream`: its head and a body of its `Content-Length` (none
/// without one).
async fn read_message(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut message = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = message.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&message[..end]).into_owned();
            let length: usize =
                header_value(&head, "content-length").map_or(0, |v| v.parse().unwrap());
            if message.len() >= end + 4 + length {
                return message;
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed mid-message: {message:?}");
        message.extend_from_slice(&chunk[..n]);
    }
}

/// The value of the field `name` (lower case) in an HTTP/1.1 head.
pub fn header_value<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The fenced upstream under a gateway killed with `kill -9` mid-request, on `store`: gateway
/// A's request reaches the fenced upstream (the Python example) only AFTER the takeover's, as
/// a request held in the network would. Gateway B takes the key over after A's lease (two
/// seconds) and its attempt, with a higher fence and attempt 2, makes the payment; then A's
/// held attempt arrives and the upstream refuses it by its fence (409). One payment for the
/// key: no double effect. The order is set by a gate the test opens, not by timing. `name`
/// names the config and database files.
pub async fn a_killed_gateways_late_attempt_is_refused_by_a_fenced_upstream(
    name: &str,
    store: &str,
) {
    let Some(upstream) = FencedUpstream::start(name) else {
        return;
    };
    let mut gate = Gate::start(upstream.addr).await;
    let [(mut a, addr_a), (_b, addr_b)] =
        two_gateways(name, store, [gate.addr, upstream.addr], &["--lease", "2s"]);
    let http = Http::behind("idem.test");
    let (key, body) = ("fenced", "10 EUR");
    let pending = tokio::spawn({
        let http = http.clone();
        let url_a = format!("http://{addr_a}/payments");
        // The client forges a fence above any real one: the gateway replaces it.
        let headers = [
            ("idempotency-key", key),
            ("idempotency-fence", "9223372036854775807"),
        ];
        async move { http.try_send(Method::POST, &url_a, &headers, body).await }
    });
    let held = gate.arrived().await;
    let fence_a: u64 = header_value(&held, "idempotency-fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        header_value(&held, "idempotency-attempt"),
        Some("1"),
        "{held}"
    );
    assert_eq!(
        held.matches("idempotency-fence").count(),
        1,
        "the client's copy went: {held}"
    );
    let url_b = format!("http://{addr_b}/payments");
    let taken_over = kill_and_take_over(&mut a, pending, &http, &url_b, key, body).await;
    assert_eq!(taken_over.status, 201, "{}", taken_over.text());
    let applied: serde_json::Value = serde_json::from_slice(&taken_over.body).unwrap();
    let fence_b = applied["fence"].as_u64().unwrap();
    assert!(
        fence_b > fence_a,
        "the takeover's fence {fence_b} is not above {fence_a}"
    );
    assert_eq!(applied["attempt"], 2, "{applied}");
    // Now A's attempt reaches the upstream, after the takeover's: refused by its fence.
    let late = gate.open().await;
    assert!(late.starts_with("HTTP/1.1 409"), "{late}");
    assert!(late.contains("stale fence"), "{late}");
    assert!(
        late.contains(&format!("\"highest_fence\": {fence_b}")),
        "{late}"
    );
    let payments = upstream.payments(key).await;
    assert_eq!(payments.len(), 1, "one payment for the key: {payments:?}");
    assert_eq!(payments[0]["fence"].as_u64(), Some(fence_b), "{payments:?}");
    let replay = http.post_key(&url_b, key, body).await;
    assert!(replay.replayed(), "{}", replay.status);
    assert_eq!(replay.body, taken_over.body);
    assert_eq!(upstream.payments(key).await.len(), 1);
}
