//! Test support: harnesses on a single server and on a Redis Cluster, servers the tests start
//! and stop themselves, and cleanup of each harness's namespace.
#![allow(dead_code, unreachable_pub)] // each test binary uses a part of this module

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_core::{ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_redis::{ClockOffset, RedisConfig, RedisStore};
use idem_testkit::Harness;
use idem_testkit::hammer::{HammerConfig, hammer};
use idem_testkit::probe::{in_ci, require_tcp, service_url};
use redis::aio::ConnectionLike;

/// The lease of the tests' claims.
pub const LEASE: Duration = Duration::from_secs(30);
/// The retention of the tests' completions.
pub const RETENTION: Duration = Duration::from_secs(3600);

/// The unscoped record key `name`.
pub fn key(name: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(name).unwrap())
}

/// A claim of `key` for the same payload every time, with [`LEASE`].
pub fn request(key: &RecordKey) -> ClaimRequest {
    ClaimRequest::new(key.clone(), Fingerprint::of(&[b"payload"]), LEASE)
}

/// The single test server: `IDEM_TEST_REDIS_URL`, by default the machine's Redis.
pub fn single_url() -> String {
    service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// `host:port` of a `redis://` URL.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:6379")
    }
}

/// A fresh random namespace.
pub fn namespace() -> String {
    format!("t{:016x}", rand::random::<u64>())
}

/// Skips loudly (or fails under `CI=true`) for a missing tool or server.
pub fn skip(message: &str) {
    assert!(!in_ci(), "CI=true and {message}");
    eprintln!("\n!!!!! SKIPPED: {message} !!!!!\n");
}

/// A harness: a store in its own namespace, its clock offset, and a raw connection for
/// planting broken records. Its namespace is deleted when it is dropped.
pub struct RedisHarness {
    pub store: RedisStore,
    pub offset: ClockOffset,
    raw: RawConn,
    cleanup: Cleanup,
}

#[derive(Clone)]
enum RawConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl RawConn {
    pub async fn query(&self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self.clone() {
            RawConn::Single(mut c) => c.req_packed_command(cmd).await,
            RawConn::Cluster(mut c) => c.req_packed_command(cmd).await,
        }
    }
}

struct Cleanup {
    /// Plain (non-cluster) URLs of every node that may hold keys.
    nodes: Vec<String>,
    namespace: String,
}

impl RedisHarness {
    /// A raw command on the harness's server (routed by key on a Cluster).
    pub async fn raw(&self, cmd: &redis::Cmd) -> redis::Value {
        self.raw.query(cmd).await.expect("raw command")
    }
}

#[async_trait]
impl Harness for RedisHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        self.offset.advance(by);
    }

    async fn corrupt(&self, key: &RecordKey) {
        // A meta field no version of the store writes.
        self.raw(
            redis::cmd("HSET")
                .arg(self.store.redis_key(key))
                .arg("m")
                .arg("?"),
        )
        .await;
    }
}

impl Drop for RedisHarness {
    fn drop(&mut self) {
        let nodes = self.cleanup.nodes.clone();
        let pattern = format!("idem:{{{}:*", self.cleanup.namespace);
        // Synchronous cleanup on its own thread: Drop cannot await.
        let done = std::thread::spawn(move || {
            for url in nodes {
                let _ = delete_matching(&url, &pattern);
            }
        });
        let _ = done.join();
    }
}

fn delete_matching(url: &str, pattern: &str) -> redis::RedisResult<()> {
    let mut conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)?;
        for key in keys {
            redis::cmd("UNLINK").arg(key).exec(&mut conn)?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The configuration every harness uses: its own namespace and clock offset.
pub fn test_config(config: RedisConfig, offset: &ClockOffset) -> RedisConfig {
    config
        .with_namespace(namespace())
        .unwrap()
        .with_clock_offset(offset.clone())
        .with_command_timeout(Duration::from_secs(5))
        .unwrap()
}

/// A harness on the single server, or `None` (skipped loudly) if it is not there.
pub async fn single_harness() -> Option<RedisHarness> {
    single_harness_with(|config| config).await
}

/// A harness on the single server with settings of its own (`tune` changes the test
/// configuration), or `None` (skipped loudly) if the server is not there.
pub async fn single_harness_with(
    tune: impl FnOnce(RedisConfig) -> RedisConfig,
) -> Option<RedisHarness> {
    let url = single_url();
    if !require_tcp("Redis", &host_port(&url)) {
        return None;
    }
    let offset = ClockOffset::new();
    let config = tune(test_config(RedisConfig::new(url.clone()).unwrap(), &offset));
    let cleanup = Cleanup {
        nodes: vec![url.clone()],
        namespace: config.namespace().to_owned(),
    };
    let store = RedisStore::connect(config).await.expect("connect");
    let raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    Some(RedisHarness {
        store,
        offset,
        raw: RawConn::Single(raw),
        cleanup,
    })
}

/// A harness on the test Cluster, or `None` (skipped loudly) if none can be had.
pub async fn cluster_harness() -> Option<RedisHarness> {
    let cluster = cluster()?;
    let offset = ClockOffset::new();
    let config = test_config(
        RedisConfig::cluster(cluster.seeds.clone()).unwrap(),
        &offset,
    );
    let cleanup = Cleanup {
        nodes: cluster.nodes.clone(),
        namespace: config.namespace().to_owned(),
    };
    let store = RedisStore::connect(config)
        .await
        .expect("connect to the cluster");
    let raw = redis::cluster::ClusterClient::new(cluster.seeds.clone())
        .unwrap()
        .get_async_connection()
        .await
        .expect("raw cluster connection");
    Some(RedisHarness {
        store,
        offset,
        raw: RawConn::Cluster(raw),
        cleanup,
    })
}

/// A port that is free now (and, for a Cluster node, whose bus port, +10000, is too).
pub fn free_port(with_bus: bool) -> u16 {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port");
        let port = listener.local_addr().expect("local address").port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port")
}

/// Whether `redis-server` and `redis-cli` are installed; skips loudly (fails under CI) if not.
pub fn have_redis_binaries() -> bool {
    let found = ["redis-server", "redis-cli"].iter().all(|bin| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !found {
        skip("redis-server or redis-cli is not installed (apt-get install redis-server)");
    }
    found
}

/// A `redis-server` this test process started, on its own port and directory. A watchdog
/// shell stops it and removes its directory when the test process exits (even on a panic or
/// a kill); `Drop` does so at once.
pub struct ServerProcess {
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    watchdogs: std::sync::Mutex<Vec<std::process::Child>>,
}

impl ServerProcess {
    /// Starts a server on a free port.
    pub fn start(extra: &[&str]) -> ServerProcess {
        let with_bus = extra.contains(&"--cluster-enabled");
        let port = free_port(with_bus);
        let dir =
            std::env::temp_dir().join(format!("idem-redis-test-{}-{port}", std::process::id()));
        let server = ServerProcess {
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            watchdogs: std::sync::Mutex::new(Vec::new()),
        };
        server.spawn();
        server
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("redis.pid")
    }

    fn spawn(&self) {
        std::fs::create_dir_all(&self.dir).expect("server directory");
        let _ = std::fs::remove_file(self.pid_file());
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            "redis.log".into(),
        ];
        args.extend(self.extra.iter().cloned());
        // The watchdog: runs the server, records its pid, and kills it when the test process
        // is gone.
        let script = r#"parent=$1; dir=$2; pidfile=$3; shift 3
redis-server "$@" &
child=$!
echo "$child" > "$pidfile"
while kill -0 "$parent" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 0.2; done
kill -9 "$child" 2>/dev/null
if ! kill -0 "$parent" 2>/dev/null; then sleep 0.2; rm -rf "$dir"; fi
exit 0"#;
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("watchdog")
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .arg(self.pid_file())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.watchdogs.lock().unwrap().push(watchdog);
        self.wait_until_up();
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Any answer counts, a refusal to an anonymous client (NOAUTH) too.
            let answered = redis::Client::open(self.url()).is_ok_and(|client| {
                client
                    .get_connection_with_timeout(Duration::from_millis(200))
                    .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn))
                    .is_ok_or_else_server_error()
            });
            if answered {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// Kills the server (SIGKILL) and waits until its port is closed.
    pub fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.pid_file()) {
            let _ = Command::new("kill").arg("-9").arg(pid.trim()).status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`STOP`, `CONT`...) to the server.
    pub fn signal(&self, signal: &str) {
        let pid = std::fs::read_to_string(self.pid_file()).expect("the server's pid");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.trim())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Starts the server again on the same port.
    pub fn restart(&self) {
        self.spawn();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        for mut watchdog in self.watchdogs.lock().unwrap().drain(..) {
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster for the tests: seeds for the client, every node's plain URL, and the
/// servers when the tests started them.
pub struct Cluster {
    pub seeds: Vec<String>,
    pub nodes: Vec<String>,
    servers: Vec<ServerProcess>,
}

impl Cluster {
    /// A three-node Cluster of the calling test's own (it may kill and restart its nodes), or
    /// `None` (skipped loudly; a failure under `CI=true`) without `redis-server`. Its nodes
    /// keep their data in an append-only file written on every command, so a node killed and
    /// started again comes back with its records as well as its slots (`nodes.conf`).
    pub fn start_own() -> Option<Cluster> {
        if !have_redis_binaries() {
            return None;
        }
        Some(start_cluster(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ]))
    }

    /// Kills the node at `index` (`SIGKILL`) and starts it again on the same port, with the
    /// same directory (its `nodes.conf`: the same node id and slots).
    pub fn restart_node(&self, index: usize) {
        let server = &self.servers[index];
        server.kill();
        server.restart();
    }

    /// Kills every node, then starts every node again (same ports, same directories).
    pub fn restart_all(&self) {
        for server in &self.servers {
            server.kill();
        }
        for server in &self.servers {
            server.restart();
        }
    }

    /// Waits until `redis-cli CLUSTER INFO` on every node says `cluster_state:ok` with all
    /// 16384 slots (30 s at most).
    pub fn wait_until_ok(&self) {
        let ports: Vec<u16> = self.servers.iter().map(|s| s.port).collect();
        wait_for_cluster(&ports);
    }

    /// The index of the node that holds the Redis key `redis_key` (answers `EXISTS` with 1;
    /// the others redirect).
    pub fn node_holding(&self, redis_key: &str) -> usize {
        let holders: Vec<usize> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, url)| {
                let mut conn = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
                    .expect("connect to a node");
                redis::cmd("EXISTS")
                    .arg(redis_key)
                    .query::<i64>(&mut conn)
                    .is_ok_and(|n| n == 1)
            })
            .map(|(index, _)| index)
            .collect();
        assert_eq!(holders.len(), 1, "nodes holding {redis_key}: {holders:?}");
        holders[0]
    }
}

/// The test Cluster of this test binary: `IDEM_TEST_REDIS_CLUSTER` (comma-separated seed
/// URLs), or three `redis-server --cluster-enabled yes` processes started once per test binary
/// and stopped when it exits. `None` (skipped loudly; a failure under CI) if neither is there.
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            // Started on a plain thread: the caller may be inside a tokio runtime.
            std::thread::spawn(start_or_find_cluster)
                .join()
                .expect("cluster start-up panicked")
        })
        .as_ref()
}

fn start_or_find_cluster() -> Option<Cluster> {
    if let Ok(seeds) = std::env::var("IDEM_TEST_REDIS_CLUSTER") {
        let seeds: Vec<String> = seeds
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if !seeds.is_empty() {
            let nodes = cluster_primaries(&seeds[0]);
            return Some(Cluster {
                seeds,
                nodes,
                servers: Vec::new(),
            });
        }
    }
    if !have_redis_binaries() {
        return None;
    }
    Some(start_cluster(&[]))
}

/// Starts three `redis-server --cluster-enabled yes` processes (with `extra` arguments) and
/// makes them one Cluster, each node a primary of a third of the slots.
fn start_cluster(extra: &[&str]) -> Cluster {
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
    ];
    args.extend_from_slice(extra);
    let servers: Vec<ServerProcess> = (0..3).map(|_| ServerProcess::start(&args)).collect();
    let addresses: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let created = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        created.status.success(),
        "redis-cli --cluster create failed: {}",
        String::from_utf8_lossy(&created.stdout)
    );
    let nodes: Vec<String> = servers.iter().map(ServerProcess::url).collect();
    let cluster = Cluster {
        seeds: nodes.clone(),
        nodes,
        servers,
    };
    cluster.wait_until_ok();
    cluster
}

/// Waits until `redis-cli CLUSTER INFO` on every node of `ports` reports `cluster_state:ok`
/// and all 16384 slots (30 s at most).
fn wait_for_cluster(ports: &[u16]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        let mut ready = true;
        for port in ports {
            let info = Command::new("redis-cli")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "CLUSTER",
                    "INFO",
                ])
                .stdin(Stdio::null())
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
                .unwrap_or_default();
            if !(info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")) {
                last = format!("port {port}: {info}");
                ready = false;
                break;
            }
        }
        if ready {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the test cluster never reached cluster_state:ok; last answer from {last}");
}

/// The primaries of the cluster that `seed` belongs to, as plain URLs.
fn cluster_primaries(seed: &str) -> Vec<String> {
    let mut conn = redis::Client::open(seed)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connect to IDEM_TEST_REDIS_CLUSTER");
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .expect("CLUSTER SLOTS");
    let mut nodes: Vec<String> = slots
        .iter()
        .filter_map(|range| match range {
            redis::Value::Array(parts) => match parts.get(2) {
                Some(redis::Value::Array(node)) => match (node.first(), node.get(1)) {
                    (Some(redis::Value::BulkString(host)), Some(redis::Value::Int(port))) => {
                        Some(format!("redis://{}:{port}", String::from_utf8_lossy(host)))
                    }
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        })
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// Parses `INFO commandstats` into (command, calls).
pub fn command_calls(info: &str) -> std::collections::BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The big hammer of issue 3: 32 tasks x 2,000 keys must run exactly 2,000 executions.
pub async fn big_hammer(h: &RedisHarness, server: &str) {
    let config = HammerConfig {
        tasks: 32,
        keys: 2_000,
        ..HammerConfig::default()
    };
    let report = hammer(h.store(), config).await;
    eprintln!(
        "hammer 32 x 2000 on {server}: executions={} acquired={} released={} replayed={} in_flight={}",
        report.total_executions(),
        report.acquired,
        report.released,
        report.replayed,
        report.in_flight
    );
    report.assert_exactly_once();
    assert_eq!(report.total_executions(), 2_000);
}

/// Whether a result is an answer of the server (a success or a server error), as opposed to a
/// connection failure.
trait Answered {
    fn is_ok_or_else_server_error(&self) -> bool;
}

impl<T> Answered for redis::RedisResult<T> {
    fn is_ok_or_else_server_error(&self) -> bool {
        match self {
            Ok(_) => true,
            Err(err) => !err.is_io_error() && !err.is_connection_refusal(),
        }
    }
}
