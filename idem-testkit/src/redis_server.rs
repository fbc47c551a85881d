//! Private Redis servers and Redis Clusters for tests (feature `redis-server`): `redis-server`
//! processes on free ports that die with the test process, a three-node Cluster made of them
//!, and [`command`], which asks them `PING`, `CLUSTER INFO` and the like
//! through redis-rs's blocking client.
//!
//! Where `redis-server` or `redis-cli` is not installed, [`have_redis_binaries`] fails the
//! test, or skips it loudly when the run set `IDEM_TEST_SKIP_MISSING=1` outside CI (see
//! [`probe`](crate::probe)).
//!
//! ```ignore
//! let Some(cluster) = Cluster::start() else { return };
//! let url = cluster.url(); // redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
//! ```

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::probe::missing;

/// `host:port` of a `redis://` URL (`redis://user:pass@host:port/db`), port 6379 when it names
/// none.
#[must_use]
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

/// Whether `redis-server` and `redis-cli` are installed; if not, the test fails, or skips
/// loudly when the run asked for it ([`missing`]).
///
/// # Panics
/// When either is missing, unless the run asked to skip (see [`crate::probe::decide`]).
#[must_use]
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
        missing("redis-server or redis-cli is not installed (apt-get install redis-server)");
    }
    found
}

/// A port on 127.0.0.1 that is free now (and, `with_bus`, whose Cluster bus port, +10000, is
/// too).
///
/// # Panics
/// When no such port is found in 100 tries.
#[must_use]
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

/// Sends one command to the server at `url` (`redis://[user:pass@]host:port`) on a connection
/// of its own (two seconds at most to connect) and reads its reply.
///
/// # Errors
/// The client's error: a connection that failed, or an error the server answered.
pub fn command(url: &str, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut command = redis::cmd(args.first().copied().unwrap_or("PING"));
    for arg in args.iter().skip(1) {
        command.arg(*arg);
    }
    command.query(&mut connection)
}

/// Whether `result` is the server's answer (a reply, or an error it answered such as
/// `NOAUTH`), as opposed to a connection that failed.
fn answered<T>(result: &redis::RedisResult<T>) -> bool {
    match result {
        Ok(_) => true,
        Err(err) => !err.is_io_error() && !err.is_connection_refusal(),
    }
}

/// The text of a simple or bulk string reply (lossy UTF-8); empty for the others.
fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::SimpleString(text) => text.clone(),
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } => text.clone(),
        _ => String::new(),
    }
}

/// A `redis-server` this test process started, on its own port and directory. A watchdog
/// shell stops it and removes its directory when the test process exits (even on a panic or
/// a kill); `Drop` does so at once.
pub struct ServerProcess {
    /// The server's port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    watchdogs: Mutex<Vec<Child>>,
}

impl ServerProcess {
    /// Starts a server on a free port (with a free Cluster bus port too when `extra` has
    /// `--cluster-enabled`), with `extra` arguments, and waits until it answers.
    ///
    /// # Panics
    /// When the server cannot be started or does not answer within 10 seconds.
    #[must_use]
    pub fn start(extra: &[&str]) -> ServerProcess {
        ServerProcess::start_on(free_port(extra.contains(&"--cluster-enabled")), extra)
    }

    /// Starts a server on `port`, with `extra` arguments, and waits until it answers.
    ///
    /// # Panics
    /// When the server cannot be started or does not answer within 10 seconds.
    #[must_use]
    pub fn start_on(port: u16, extra: &[&str]) -> ServerProcess {
        let dir =
            std::env::temp_dir().join(format!("idem-redis-test-{}-{port}", std::process::id()));
        let server = ServerProcess {
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            watchdogs: Mutex::new(Vec::new()),
        };
        server.spawn();
        server
    }

    /// The server's URL.
    #[must_use]
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
        self.watchdogs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(watchdog);
        self.wait_until_up();
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Any answer counts, a refusal to an anonymous client (NOAUTH) too.
            if answered(&command(&self.url(), &["PING"])) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// Kills the server (`SIGKILL`) and waits until its port is closed.
    pub fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.pid_file()) {
            let _ = Command::new("kill").arg("-9").arg(pid.trim()).status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`STOP`, `CONT`...) to the server.
    ///
    /// # Panics
    /// When the server's pid is unknown or `kill` fails.
    pub fn signal(&self, signal: &str) {
        let pid = std::fs::read_to_string(self.pid_file()).expect("the server's pid");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.trim())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&self) {
        self.spawn();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        let watchdogs = self
            .watchdogs
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for mut watchdog in watchdogs.drain(..) {
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster for the tests: seeds for a client, every primary's plain URL, and the
/// servers when the tests started them.
pub struct Cluster {
    /// The seed URLs (`redis://127.0.0.1:PORT`) a Cluster client starts from.
    pub seeds: Vec<String>,
    /// Every primary's plain URL; for a Cluster the tests started, in the order of its
    /// servers ([`Cluster::restart_node`] takes an index into it).
    pub nodes: Vec<String>,
    servers: Vec<ServerProcess>,
}

impl Cluster {
    /// A three-node Cluster of the calling test's own, or `None` (when the run skips a missing
    /// service, see [`crate::probe`]) without `redis-server`. Its nodes keep nothing on disk.
    #[must_use]
    pub fn start() -> Option<Cluster> {
        have_redis_binaries().then(|| start_cluster(&[]))
    }

    /// A three-node Cluster of the calling test's own (it may kill and restart its nodes), or
    /// `None` (when the run skips a missing service, see
    /// [`crate::probe`]) without `redis-server`. Its nodes
    /// keep their data in an append-only file written on every command, so a node killed and
    /// started again comes back with its records as well as its slots (`nodes.conf`).
    #[must_use]
    pub fn start_own() -> Option<Cluster> {
        have_redis_binaries()
            .then(|| start_cluster(&["--appendonly", "yes", "--appendfsync", "always"]))
    }

    /// The store URL of the Cluster, every seed named: `redis+cluster://h1:p1,h2:p2,...`.
    #[must_use]
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.seeds.iter().map(|seed| host_port(seed)).collect();
        format!("redis+cluster://{}", hosts.join(","))
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

    /// Waits until `CLUSTER INFO` on every node says `cluster_state:ok` with all 16384 slots
    /// (30 s at most).
    ///
    /// # Panics
    /// When the Cluster is not ok by then.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < deadline {
            let not_ok = self.nodes.iter().find_map(|node| {
                let info = command(node, &["CLUSTER", "INFO"])
                    .map_or_else(|err| format!("{err}"), |reply| text(&reply));
                let ok =
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384");
                (!ok).then(|| format!("{node}: {info}"))
            });
            match not_ok {
                None => return,
                Some(answer) => last = answer,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the test cluster never reached cluster_state:ok; last answer from {last}");
    }

    /// The index in [`Cluster::nodes`] of the node that holds the Redis key `redis_key`
    /// (answers `EXISTS` with 1; the others redirect).
    ///
    /// # Panics
    /// When a node does not answer, or not exactly one node holds the key.
    #[must_use]
    pub fn node_holding(&self, redis_key: &str) -> usize {
        let holders: Vec<usize> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, url)| {
                // A node that does not hold the key's slot answers with a redirect (an error).
                let reply = command(url, &["EXISTS", redis_key]);
                assert!(answered(&reply), "ask {url}: {reply:?}");
                matches!(reply, Ok(redis::Value::Int(1)))
            })
            .map(|(index, _)| index)
            .collect();
        assert_eq!(holders.len(), 1, "nodes holding {redis_key}: {holders:?}");
        holders[0]
    }
}

/// The test Cluster of this test binary: `IDEM_TEST_REDIS_CLUSTER` (comma-separated seed
/// URLs), or three `redis-server --cluster-enabled yes` processes started once per test binary
/// and stopped when it exits. `None` (when the run skips a missing service, see [`crate::probe`]) if
/// neither is there.
#[must_use]
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER.get_or_init(start_or_find_cluster).as_ref()
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
    Cluster::start()
}

/// Starts three `redis-server --cluster-enabled yes` processes (with `extra` arguments) and
/// makes them one Cluster with `redis-cli --cluster create`, each node a primary of a third of
/// the slots.
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
    // In the order of the servers: `node_holding` answers an index for `restart_node`.
    let nodes: Vec<String> = servers.iter().map(ServerProcess::url).collect();
    let cluster = Cluster {
        seeds: nodes.clone(),
        nodes,
        servers,
    };
    cluster.wait_until_ok();
    cluster
}

/// The primaries of the Cluster that `seed` belongs to, as plain URLs, from `CLUSTER SLOTS`.
fn cluster_primaries(seed: &str) -> Vec<String> {
    let slots = match command(seed, &["CLUSTER", "SLOTS"]) {
        Ok(redis::Value::Array(slots)) => slots,
        other => panic!("CLUSTER SLOTS on IDEM_TEST_REDIS_CLUSTER ({seed}): {other:?}"),
    };
    let mut nodes: Vec<String> = slots
        .iter()
        .filter_map(|range| match range {
            redis::Value::Array(parts) => match parts.get(2) {
                Some(redis::Value::Array(node)) => match (node.first(), node.get(1)) {
                    (Some(host @ redis::Value::BulkString(_)), Some(redis::Value::Int(port))) => {
                        Some(format!("redis://{}:{port}", text(host)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_reads_the_authority() {
        assert_eq!(host_port("redis://127.0.0.1:7000"), "127.0.0.1:7000");
        assert_eq!(host_port("redis://u:p@h/3"), "h:6379");
        assert_eq!(host_port("h:1"), "h:1");
    }
}
