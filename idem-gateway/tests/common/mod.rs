//! Helpers of the end-to-end tests: the idem-fixture upstream (`--bare`) as a process, an HTTP
//! client, gateways in this process or as `idem serve` processes. Everything binds 127.0.0.1
//! port 0.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_gateway::RenderMetrics;
use idem_gateway::config::{self, Config, Overrides};
use idem_gateway::{Running, start_with_store};
use idem_store_memory::MemoryStore;

pub mod raw_http;
pub mod shared_store;
pub mod webdriver;

/// Percent-encodes `text` for a URL path segment or a query value of the key API: everything
/// but the unreserved characters of RFC 3986 (`A-Z a-z 0-9 - . _ ~`) is escaped.
pub fn encode(text: &str) -> String {
    const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, COMPONENT).to_string()
}

/// The idem-fixture binary of this test's target directory. `cargo test --workspace` has built
/// it; when it is missing (`cargo test -p idem-gateway` on a fresh target directory), it is
/// built here once. An existing binary is used as it is: rebuilding it here with another
/// feature set would replace the one the workspace's other tests run.
pub fn fixture_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/<test> -> target/<profile>
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let bin = profile_dir.join(format!("idem-fixture{}", std::env::consts::EXE_SUFFIX));
        if bin.exists() {
            return bin;
        }
        let target_dir = profile_dir.parent().unwrap().to_path_buf();
        let mut build = Command::new(env!("CARGO"));
        build
            .args([
                "build",
                "--quiet",
                "-p",
                "idem-fixture",
                "--bin",
                "idem-fixture",
            ])
            .env("CARGO_TARGET_DIR", &target_dir);
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build -p idem-fixture");
        assert!(status.success(), "cargo build -p idem-fixture failed");
        assert!(bin.exists(), "{} was not built", bin.display());
        bin
    })
    .clone()
}

/// The `idem` binary of this package.
pub fn idem_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_idem"))
}

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads stdout lines of `child` until one starts with `prefix`; returns the rest of it.
fn read_until(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut found = None;
    let mut line = String::new();
    while found.is_none() {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the process ended before printing {prefix:?}");
        if let Some(rest) = line.trim().strip_prefix(prefix) {
            found = Some(rest.trim().to_owned());
        }
    }
    drain(reader);
    found.unwrap()
}

/// Keeps reading a child's stdout on a thread of its own, so the child never blocks on a full
/// pipe.
pub fn drain(mut reader: BufReader<ChildStdout>) {
    std::thread::spawn(move || {
        let mut sink = String::new();
        while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
}

/// The idem-fixture upstream without the layer, counting its executions.
pub struct Fixture {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Fixture {
    /// On a free port.
    pub fn start() -> Fixture {
        Fixture::start_on("127.0.0.1:0")
    }

    /// On `listen`.
    pub fn start_on(listen: &str) -> Fixture {
        let mut child = Command::new(fixture_bin())
            .args(["--bare", "--listen", listen])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = read_until(&mut child, "").parse().unwrap();
        Fixture {
            proc: Proc { child },
            addr,
        }
    }

    /// How many requests the upstream executed.
    pub async fn count(&self) -> u64 {
        let reply = Http::new()
            .send(
                Method::GET,
                &format!("http://{}/counter", self.addr),
                &[],
                "",
            )
            .await;
        let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        value["count"].as_u64().unwrap()
    }
}

/// A free port on 127.0.0.1 (bound, then let go): for an upstream that starts later.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// A pooled HTTP/1 client.
#[derive(Clone)]
pub struct Http {
    client: HyperClient<HttpConnector, Full<Bytes>>,
    /// The `Host` of every request that names none.
    host: Option<&'static str>,
}

impl Http {
    pub fn new() -> Http {
        Http {
            client: HyperClient::builder(TokioExecutor::new()).build_http(),
            host: None,
        }
    }

    /// A client that reaches every gateway by one name, as clients behind a load balancer
    /// do: the host is part of a request's fingerprint.
    pub fn behind(host: &'static str) -> Http {
        Http {
            host: Some(host),
            ..Http::new()
        }
    }

    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        self.try_send(method, url, headers, body).await.unwrap()
    }

    pub async fn try_send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
        let mut request = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(host) = self.host {
            if !headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("host"))
            {
                request = request.header("host", host);
            }
        }
        let request = request.body(Full::new(body.into()))?;
        let response = self.client.request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// POST with an Idempotency-Key.
    pub async fn post_key(&self, url: &str, key: &str, body: &str) -> Reply {
        self.send(
            Method::POST,
            url,
            &[("idempotency-key", key)],
            body.to_owned(),
        )
        .await
    }
}

/// What a client library read: status, version, headers, body and trailers.
#[derive(Debug)]
pub struct Answer {
    pub status: http::StatusCode,
    pub version: http::Version,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// POSTs `10 EUR` to `url` with `headers`, over HTTP/2 (prior knowledge) when `http2`, else
/// HTTP/1.1, and reads the whole answer with its trailers; an error when the exchange or the
/// body breaks (an HTTP/2 stream reset).
pub async fn try_post(
    url: &str,
    headers: &[(&str, &str)],
    http2: bool,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    let client = HyperClient::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(Method::POST).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(Bytes::from_static(b"10 EUR")))?)
        .await?;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    Ok(Answer {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}

/// A configuration for a gateway in front of `upstream`, on free ports, plus `extra` TOML
/// (routes, sections).
pub fn config(upstream: SocketAddr, extra: &str) -> Config {
    config_with(upstream, extra, &Overrides::default())
}

/// [`config`] with `overrides` (an admin token, for instance).
pub fn config_with(upstream: SocketAddr, extra: &str, overrides: &Overrides) -> Config {
    config_text(upstream, "", extra, overrides)
}

/// [`config`] with `server` (lines of TOML) in its `[server]` section.
pub fn config_with_server(upstream: SocketAddr, server: &str, extra: &str) -> Config {
    config_text(upstream, server, extra, &Overrides::default())
}

fn config_text(upstream: SocketAddr, server: &str, extra: &str, overrides: &Overrides) -> Config {
    let text = format!(
        "[upstream]\nurl = \"http://{upstream}\"\n\n[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n{server}\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n{extra}"
    );
    config::from_str("test.toml", &text, overrides).unwrap()
}

/// The Prometheus recorder of this test process (installed once), as the admin listener
/// renders it.
pub fn metrics_recorder() -> RenderMetrics {
    static RENDER: OnceLock<RenderMetrics> = OnceLock::new();
    RENDER
        .get_or_init(|| {
            let handle = idem_gateway::install_prometheus().unwrap();
            Arc::new(move || handle.render())
        })
        .clone()
}

/// A gateway in this process over a memory store the test can inspect.
pub struct Gateway {
    pub running: Option<Running>,
    pub store: Arc<MemoryStore>,
    pub url: String,
    pub admin: Option<String>,
}

impl Gateway {
    pub async fn start(config: &Config) -> Gateway {
        Gateway::start_with_metrics(config, None).await
    }

    /// With the admin listener's `/metrics` rendered by `metrics`.
    pub async fn start_with_metrics(config: &Config, metrics: Option<RenderMetrics>) -> Gateway {
        Gateway::start_on(config, MemoryStore::new(), metrics).await
    }

    /// Over `store`.
    pub async fn start_on(
        config: &Config,
        store: MemoryStore,
        metrics: Option<RenderMetrics>,
    ) -> Gateway {
        let store = Arc::new(store);
        let dyn_store: Arc<dyn Store> = store.clone();
        let running = start_with_store(config, dyn_store, metrics, std::future::pending())
            .await
            .unwrap();
        Gateway {
            url: format!("http://{}", running.listen),
            admin: running.admin.map(|a| format!("http://{a}")),
            running: Some(running),
            store,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

/// The value of the Prometheus series `series` (a name with its labels, as rendered) on the
/// admin listener at `admin`, and the whole text for a failure message.
pub async fn metric_value(http: &Http, admin: &str, series: &str) -> (Option<f64>, String) {
    let text = http
        .send(Method::GET, &format!("{admin}/metrics"), &[], "")
        .await
        .text();
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok());
    (value, text)
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `idem` binary running `subcommand`, stdout piped, logging warnings only, and without
/// the `IDEM_*` variables of the environment the tests run in.
pub fn idem_command(subcommand: &str) -> Command {
    let mut command = Command::new(idem_bin());
    command
        .arg(subcommand)
        .stdout(Stdio::piped())
        .env("RUST_LOG", "warn");
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    // A secret, so that no warning of its absence is among what a test reads.
    command.env("IDEM_SCOPE_SECRET", "a scope secret of the tests");
    command
}

/// Asserts that a finished `idem` process exited with `code` and wrote exactly one stderr line,
/// starting with `error: {start}`.
pub fn assert_one_error_line(output: &std::process::Output, code: i32, start: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: {start}")), "{stderr}");
}

/// An `idem serve` process: `args` after `serve`; waits for its "listening on" line.
pub fn spawn_gateway(args: &[&str]) -> (Proc, SocketAddr) {
    let mut child = idem_command("serve").args(args).spawn().unwrap();
    let addr = read_until(&mut child, "listening on").parse().unwrap();
    (Proc { child }, addr)
}

/// Claims `key` and settles it unknown in `store`, as a gateway whose upstream lost its answer
/// does; returns the fence.
pub async fn an_unknown_record(store: &dyn Store, key: &str) -> u64 {
    let claimed = store
        .claim(&idem_core::ClaimRequest::new(
            RecordKey::unscoped(IdempotencyKey::new(key).unwrap()),
            idem_core::Fingerprint::of(&[b"t"]),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let idem_core::ClaimOutcome::Acquired { lease, .. } = claimed else {
        panic!("not acquired: {claimed:?}");
    };
    let lost = idem_core::UnknownOutcome::new("the upstream did not answer within 8s");
    store
        .settle_unknown(&lease, lost, None, Duration::from_secs(600))
        .await
        .unwrap();
    lease.fence.get()
}
