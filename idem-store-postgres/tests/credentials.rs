//! Credentials the server refuses are a permanent error that says so, never `Unavailable`
//! (which the gateway takes for a server that is not up yet, and retries forever). A tiny
//! fake server speaks the start of the protocol: it answers the startup message with a
//! password request (cleartext, MD5 or SCRAM, as a server with `password`, `md5` or
//! `scram-sha-256` in `pg_hba.conf` does), and a password with `28P01`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::StoreError;
use idem_store_postgres::{CredentialsRefused, PostgresConfig, PostgresStore};

/// How the fake server asks for the password.
#[derive(Clone, Copy, Debug)]
enum Ask {
    Cleartext,
    Md5,
    Scram,
}

/// A server on a free port that asks every connection for a password as `ask` says, and
/// refuses whatever password comes (`28P01`); counts the connections.
struct FakeServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl FakeServer {
    fn start(ask: Ask) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve(stream, ask));
            }
        });
        FakeServer { addr, connections }
    }

    fn url(&self, userinfo: &str) -> String {
        format!("postgres://{userinfo}@{}/test", self.addr)
    }
}

/// Reads `len` bytes, or `None` at the end of the stream.
fn read_exact(stream: &mut TcpStream, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0; len];
    stream.read_exact(&mut buf).ok()?;
    Some(buf)
}

fn be32(bytes: &[u8]) -> usize {
    usize::try_from(u32::from_be_bytes(bytes.try_into().unwrap())).unwrap()
}

/// One connection: the startup message (after an `SSLRequest`, answered `N`), the password
/// request, then an `ErrorResponse` 28P01 for any answer.
fn serve(mut stream: TcpStream, ask: Ask) {
    loop {
        let Some(head) = read_exact(&mut stream, 4) else {
            return;
        };
        let Some(body) = read_exact(&mut stream, be32(&head) - 4) else {
            return;
        };
        // SSLRequest: 80877103.
        if body.get(..4) == Some(&[0x04, 0xd2, 0x16, 0x2f][..]) {
            let _ = stream.write_all(b"N");
            continue;
        }
        break;
    }
    let mut request = vec![b'R'];
    let payload: Vec<u8> = match ask {
        Ask::Cleartext => 3u32.to_be_bytes().to_vec(),
        Ask::Md5 => [&5u32.to_be_bytes()[..], &[1, 2, 3, 4]].concat(),
        Ask::Scram => [&10u32.to_be_bytes()[..], b"SCRAM-SHA-256\0\0"].concat(),
    };
    request.extend_from_slice(&u32::try_from(payload.len() + 4).unwrap().to_be_bytes());
    request.extend_from_slice(&payload);
    if stream.write_all(&request).is_err() {
        return;
    }
    // The client's answer ('p'), unless it gave up (no password to send).
    let Some(head) = read_exact(&mut stream, 5) else {
        return;
    };
    if read_exact(&mut stream, be32(&head[1..]) - 4).is_none() {
        return;
    }
    let mut fields = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28P01"),
        (b'M', "password authentication failed for user \"idem\""),
    ] {
        fields.push(tag);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut error = vec![b'E'];
    error.extend_from_slice(&u32::try_from(fields.len() + 4).unwrap().to_be_bytes());
    error.extend_from_slice(&fields);
    let _ = stream.write_all(&error);
}

async fn connect(url: &str) -> StoreError {
    let config = PostgresConfig::new(url)
        .unwrap()
        .with_connect_timeout(Duration::from_secs(10));
    match PostgresStore::connect(config).await {
        Ok(_) => panic!("{url}: connected to a server that refuses every password"),
        Err(err) => err,
    }
}

/// A URL without a password, to a server that asks for one (by any of the three methods):
/// before, the driver's `password missing` was `Unavailable` (no SQLSTATE, so taken for a
/// connection problem), and the gateway started and answered 503 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_the_server_asks_for_and_the_url_lacks_is_refused_for_good() {
    for ask in [Ask::Cleartext, Ask::Md5, Ask::Scram] {
        let server = FakeServer::start(ask);
        let err = connect(&server.url("idem")).await;
        assert!(!err.is_retryable(), "{ask:?}: {err:?}");
        assert!(
            matches!(err, StoreError::Backend { .. }),
            "{ask:?}: {err:?}"
        );
        let refused = CredentialsRefused::of(&err).expect("a CredentialsRefused source");
        assert!(refused.password_missing(), "{ask:?}: {refused}");
        let message = err.to_string();
        assert!(
            message.contains("the server refused the credentials")
                && message.contains("asks for a password and the URL has none"),
            "{ask:?}: {message}"
        );
        assert!(server.connections.load(Ordering::SeqCst) >= 1);
    }
}

/// A wrong password: permanent, and says so with the server's words and SQLSTATE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_for_good_with_the_servers_words() {
    for ask in [Ask::Cleartext, Ask::Md5, Ask::Scram] {
        let server = FakeServer::start(ask);
        let err = connect(&server.url("idem:wrong")).await;
        assert!(!err.is_retryable(), "{ask:?}: {err:?}");
        let refused = CredentialsRefused::of(&err).expect("a CredentialsRefused source");
        assert!(!refused.password_missing());
        let message = err.to_string();
        assert!(
            message.contains("the server refused the credentials")
                && message.contains("password authentication failed for user \"idem\"")
                && message.contains("SQLSTATE 28P01"),
            "{ask:?}: {message}"
        );
    }
}

/// A server that does not answer at all is still `Unavailable`: a retry may find it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_up_is_still_unavailable() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = connect(&format!("postgres://idem@{addr}/test")).await;
    assert!(err.is_retryable(), "{err:?}");
    assert!(CredentialsRefused::of(&err).is_none());
}
