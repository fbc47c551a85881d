//! Starts the fixture binary on 127.0.0.1:0 and talks to it with a real HTTP client.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running fixture, killed when dropped.
pub struct Fixture {
    child: Child,
    pub addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer, with its headers in the order they came, repeats kept.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
}

impl Answer {
    /// The first value of `name`, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed").as_deref() == Some("true")
    }

    /// The headers but those that change per response (date, the replay marker).
    pub fn stable_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .filter(|(n, _)| n != "date" && n != "idempotent-replayed")
            .cloned()
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A key prefix no other test (or run, on a shared Redis) uses.
pub fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The quoted (sf-string) form of a key.
pub fn quoted(key: &str) -> String {
    format!("\"{key}\"")
}

impl Fixture {
    /// Starts the fixture with `--store store` and the extra `args`. On a shared store (Redis),
    /// records are kept 2 minutes unless `args` say otherwise, so the tests clean up after
    /// themselves.
    pub fn start(store: &str, args: &[&str]) -> Fixture {
        let retention: &[&str] = if store != "memory" && !args.contains(&"--retention-ms") {
            &["--retention-ms", "120000"]
        } else {
            &[]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem-fixture"))
            .args(["--listen", "127.0.0.1:0", "--store", store])
            .args(retention)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the fixture");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the address");
        let addr = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the fixture's first line is not an address: {line:?}")
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Fixture {
            child,
            addr,
            client,
        }
    }

    /// Sends a request with `headers` (raw values, repeats allowed) and reads the whole answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &[u8])],
        body: impl Into<Bytes>,
    ) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .body(Full::new(body.into()))
            .unwrap();
        for (name, value) in headers {
            request.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        // One host for every request, the raw ones too ("Host: x"), as a service's clients
        // reach it by one name whichever fixture process answers: the host is part of a
        // request's fingerprint.
        if !request.headers().contains_key(http::header::HOST) {
            request
                .headers_mut()
                .insert(http::header::HOST, HeaderValue::from_static("x"));
        }
        let response = self
            .client
            .request(request)
            .await
            .expect("send the request");
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("read the body")
            .to_bytes();
        Answer {
            status,
            headers,
            body,
        }
    }

    /// POST `path` with the key `key` (sent quoted) and `body`.
    pub async fn post(&self, path: &str, key: &str, body: impl Into<Bytes>) -> Answer {
        let key = quoted(key);
        self.send(
            Method::POST,
            path,
            &[("idempotency-key", key.as_bytes())],
            body,
        )
        .await
    }

    /// The executions counted by the fixture.
    pub async fn counter(&self) -> u64 {
        let answer = self.send(Method::GET, "/counter", &[], Bytes::new()).await;
        assert_eq!(answer.status, StatusCode::OK);
        let text = answer.text();
        text.trim_start_matches("{\"count\": ")
            .trim_end_matches('}')
            .parse()
            .unwrap_or_else(|_| panic!("counter answered {text:?}"))
    }

    /// Waits until the counter reaches `n` (at most 10 s).
    pub async fn wait_for_counter(&self, n: u64) {
        for _ in 0..200 {
            if self.counter().await >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the counter never reached {n}: it is {}",
            self.counter().await
        );
    }

    /// Writes `raw` on a new connection and reads until the server closes it; returns the
    /// status code of the answer.
    pub async fn raw(&self, raw: &[u8]) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        // A server that refuses a request early (413) may close before the whole request is
        // written: the write then fails, and the answer is still there to read.
        let _ = stream.write_all(raw).await;
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        (status, text)
    }
}

/// The Redis URL for the tests, if a server answers there (loud skip outside CI, failure
/// under CI=true).
pub fn redis_url() -> Option<String> {
    let url = idem_testkit::probe::service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let host_port = url
        .trim_start_matches("redis://")
        .trim_start_matches("rediss://")
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    idem_testkit::probe::require_tcp("Redis", &host_port).then_some(url)
}

/// The PostgreSQL URL for the tests, if a server answers there (loud skip outside CI, failure
/// under CI=true).
pub fn postgres_url() -> Option<String> {
    let url = idem_testkit::probe::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let host_port = url
        .split('@')
        .next_back()
        .unwrap_or_default()
        .trim_start_matches("postgres://")
        .trim_start_matches("postgresql://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    idem_testkit::probe::require_tcp("PostgreSQL", &host_port).then_some(url)
}

/// A file path in the temporary directory, removed when dropped.
pub struct TempFile(std::path::PathBuf);

impl TempFile {
    pub fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("{}.redb", unique(name))))
    }

    pub fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
