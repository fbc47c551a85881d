//! End-to-end: an `https` upstream. The test makes a CA and certificates (rcgen), serves a TLS
//! upstream written here (tokio-rustls and hyper's HTTP/1.1 server) that counts its runs and
//! records what each handshake asked for, and runs the gateway in this process on the memory
//! store, with `[upstream] ca_file` naming the CA. Everything binds 127.0.0.1 port 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{Gateway, Http, assert_one_error_line, idem_command};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_gateway::config::{self, Config, Overrides};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA made for the test: its certificate (PEM) and what signs with its key.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (host names or IP addresses), signed by this CA.
    fn leaf(&self, names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let params = CertificateParams::new(names).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.der().clone(), PrivateKeyDer::from(key))
    }

    /// The CA's certificate in a PEM file of its own.
    fn file(&self, name: &str) -> PathBuf {
        write_file(name, &self.pem)
    }
}

/// Writes `text` to a file named `name` in this test's temporary directory.
fn write_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-gateway-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// What the TLS upstream saw of one handshake.
#[derive(Clone, Debug)]
struct Handshake {
    sni: Option<String>,
    alpn: Option<Vec<u8>>,
}

/// A TLS upstream whose every answer is `200 paid-N` (N counts its runs), echoing the
/// `x-forwarded-proto` it was sent.
struct TlsUpstream {
    addr: SocketAddr,
    runs: Arc<AtomicU64>,
    /// Every TCP connection it accepted (a handshake was tried on each).
    accepted: Arc<AtomicU64>,
    /// The handshakes that succeeded.
    handshakes: Arc<Mutex<Vec<Handshake>>>,
}

impl TlsUpstream {
    async fn start(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> TlsUpstream {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let runs = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let (counter, accepts, seen) = (runs.clone(), accepted.clone(), handshakes.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                accepts.fetch_add(1, Ordering::SeqCst);
                let (acceptor, counter, seen) = (acceptor.clone(), counter.clone(), seen.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing to serve.
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let session = stream.get_ref().1;
                    seen.lock().unwrap().push(Handshake {
                        sni: session.server_name().map(str::to_owned),
                        alpn: session.alpn_protocol().map(<[u8]>::to_vec),
                    });
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        let proto = request
                            .headers()
                            .get("x-forwarded-proto")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("none")
                            .to_owned();
                        async move {
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .header("x-seen-proto", proto)
                                    .body(Full::new(Bytes::from(format!("paid-{n}"))))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        TlsUpstream {
            addr,
            runs,
            accepted,
            handshakes,
        }
    }

    fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// A gateway's configuration in front of `url`, trusting the CA of `ca_file`, on free ports;
/// 5xx answers are stored, so that one the gateway itself gives would be too if it recorded
/// the key.
fn tls_config(url: &str, ca_file: &std::path::Path) -> Config {
    let text = format!(
        "[upstream]\nurl = \"{url}\"\nca_file = \"{}\"\nconnect_timeout = \"5s\"\n\n\
         [server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [idempotency]\nstore_server_errors = true\n",
        ca_file.display()
    );
    config::from_str("tls.toml", &text, &Overrides::default()).unwrap()
}

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

/// A request through the gateway reaches the https upstream (the name of the URL sent by SNI,
/// ALPN `http/1.1`, `X-Forwarded-Proto` about the client's side: `http`), and its retry is
/// replayed without a second run. Before, an `https` URL was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_and_a_retry_is_replayed() {
    let ca = Ca::new("idem test CA");
    let (cert, key) = ca.leaf(&["localhost"]);
    let upstream = TlsUpstream::start(cert, key).await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let gateway = Gateway::start(&tls_config(&url, &ca.file("ca.pem"))).await;
    let http = Http::new();

    let first = http.post_key(&gateway.url("/pay"), "tls-1", "10 EUR").await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.text(), "paid-1");
    assert!(!first.replayed());
    assert_eq!(first.header("x-seen-proto"), Some("http"));

    let retry = http.post_key(&gateway.url("/pay"), "tls-1", "10 EUR").await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.text(), "paid-1");
    assert!(retry.replayed(), "{:?}", retry.headers);
    assert_eq!(upstream.runs(), 1, "the retry did not reach the upstream");

    let handshakes = upstream.handshakes.lock().unwrap().clone();
    assert!(!handshakes.is_empty());
    for handshake in handshakes {
        assert_eq!(handshake.sni.as_deref(), Some("localhost"));
        assert_eq!(handshake.alpn.as_deref(), Some(&b"http/1.1"[..]));
    }
}

/// An upstream certificate to an IP address in the URL: verified against the address (no
/// SNI is sent for one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_named_by_its_ip_address_is_verified_against_it() {
    let ca = Ca::new("idem test CA");
    let (cert, key) = ca.leaf(&["127.0.0.1"]);
    let upstream = TlsUpstream::start(cert, key).await;
    let url = format!("https://{}", upstream.addr);
    let gateway = Gateway::start(&tls_config(&url, &ca.file("ca-ip.pem"))).await;
    let reply = Http::new()
        .post_key(&gateway.url("/pay"), "tls-ip", "10 EUR")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(upstream.runs(), 1);
}

/// The answer to a request whose upstream connection failed its TLS handshake: 502, and the
/// key is released (not recorded, though 5xx answers are stored), so the retry tries again.
async fn assert_refused(upstream: &TlsUpstream, gateway: &Gateway, key: &str) {
    let http = Http::new();
    for attempt in 1..=2 {
        let reply = http.post_key(&gateway.url("/pay"), key, "10 EUR").await;
        assert_eq!(reply.status, 502, "{}", reply.text());
        assert!(!reply.replayed());
        assert!(
            reply.text().contains("#variant.Unreachable"),
            "{}",
            reply.text()
        );
        assert!(
            upstream.accepted.load(Ordering::SeqCst) >= attempt,
            "the retry tried the upstream again"
        );
        assert!(
            gateway.store.get(&record_key(key)).await.unwrap().is_none(),
            "the key is released"
        );
    }
    assert_eq!(upstream.runs(), 0, "no request reached the upstream");
}

/// A certificate that the configured CA did not sign is refused: 502, the key released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_another_ca_signed_is_refused_with_502_and_the_key_released() {
    let trusted = Ca::new("idem test CA");
    let other = Ca::new("another CA");
    let (cert, key) = other.leaf(&["localhost"]);
    let upstream = TlsUpstream::start(cert, key).await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let gateway = Gateway::start(&tls_config(&url, &trusted.file("trusted.pem"))).await;
    assert_refused(&upstream, &gateway, "tls-other-ca").await;
}

/// A certificate of the right CA for another name than the URL's is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_refused_with_502() {
    let ca = Ca::new("idem test CA");
    let (cert, key) = ca.leaf(&["payments.example"]);
    let upstream = TlsUpstream::start(cert, key).await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let gateway = Gateway::start(&tls_config(&url, &ca.file("ca-name.pem"))).await;
    assert_refused(&upstream, &gateway, "tls-other-name").await;
}

/// `check-config` refuses a `ca_file` that is missing, cannot be read (a directory) or holds
/// no usable certificate, in one line naming the setting's position and the file.
#[test]
fn check_config_refuses_a_bad_ca_file() {
    let not_pem = write_file("not-pem.txt", "just text\n");
    let bad_cert = write_file(
        "bad-cert.pem",
        "-----BEGIN CERTIFICATE-----\nAAECAwQF\n-----END CERTIFICATE-----\n",
    );
    let missing = std::env::temp_dir().join("idem-gateway-tls-missing/ca.pem");
    let directory = not_pem.parent().unwrap().to_path_buf();
    let cases = [
        (missing, "cannot read ca_file"),
        (directory, "cannot read ca_file"),
        (not_pem, "holds no certificate"),
        (bad_cert, "is not a valid certificate"),
    ];
    for (index, (path, says)) in cases.into_iter().enumerate() {
        let file = write_file(
            &format!("bad-ca-{index}.toml"),
            &format!(
                "[upstream]\nurl = \"https://localhost:8443\"\nca_file = \"{}\"\n",
                path.display()
            ),
        );
        let output = idem_command("check-config")
            .arg(&file)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let location = format!("{}:3:11: ", file.display());
        assert_one_error_line(&output, 2, &location);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{says:?} not in {stderr}");
        assert!(
            stderr.contains(&path.display().to_string()),
            "the file is named: {stderr}"
        );
    }
}

/// A good `ca_file` passes `check-config`; with a plain `http` upstream it is warned of, as it
/// is not used.
#[test]
fn check_config_takes_a_good_ca_file_and_warns_of_one_http_does_not_use() {
    let ca = Ca::new("idem test CA").file("good-ca.pem");
    for (scheme, warned) in [("https", false), ("http", true)] {
        let file = write_file(
            &format!("good-ca-{scheme}.toml"),
            &format!(
                "[upstream]\nurl = \"{scheme}://localhost:8443\"\nca_file = \"{}\"\n",
                ca.display()
            ),
        );
        let output = idem_command("check-config")
            .arg(&file)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(
            stdout.contains(&format!("upstream {scheme}://localhost:8443")),
            "{stdout}"
        );
        assert_eq!(stderr.contains("ca_file is set but"), warned, "{stderr}");
    }
}

/// `idem` with `SSL_CERT_FILE` naming `roots` (the system's roots as rustls-native-certs
/// finds them) and no `SSL_CERT_DIR`.
fn idem_with_roots(subcommand: &str, roots: &std::path::Path) -> std::process::Command {
    let mut command = idem_command(subcommand);
    command
        .env("SSL_CERT_FILE", roots)
        .env_remove("SSL_CERT_DIR")
        .stderr(std::process::Stdio::piped());
    command
}

/// Without `ca_file`, the system's roots are trusted: a gateway whose system trust store holds
/// the test's CA reaches the upstream it signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ca_file_the_system_roots_are_trusted() {
    use std::io::BufRead;
    let ca = Ca::new("idem test system CA");
    let (cert, key) = ca.leaf(&["localhost"]);
    let upstream = TlsUpstream::start(cert, key).await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let mut child = idem_with_roots("serve", &ca.file("system-roots.pem"))
        .args(["--upstream", &url, "--listen", "127.0.0.1:0", "--no-admin"])
        .arg("--store")
        .arg("memory")
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listen = loop {
        let line = lines.next().expect("idem serve ended").unwrap();
        if let Some(addr) = line.trim().strip_prefix("listening on") {
            break addr.trim().to_owned();
        }
    };
    let proc = common::Proc { child };
    let reply = Http::new()
        .post_key(&format!("http://{listen}/pay"), "tls-system", "10 EUR")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(upstream.runs(), 1);
    drop(proc);
}

/// An https upstream on a system without root certificates (and no `ca_file`) is refused by
/// `check-config`, saying what to install or set.
#[test]
fn check_config_refuses_an_https_upstream_without_any_root() {
    let empty = write_file("no-roots.pem", "");
    let output = idem_with_roots("check-config", &empty)
        .args(["--upstream", "https://localhost:8443"])
        .output()
        .unwrap();
    assert_one_error_line(&output, 2, "the upstream is https, and no root certificate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ca_file"), "{stderr}");
}
