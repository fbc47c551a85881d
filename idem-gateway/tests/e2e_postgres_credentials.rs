//! A PostgreSQL server that refuses the URL's credentials, through the `idem` binary: a fake
//! server (a few bytes of the protocol) asks every connection for a password, and refuses any
//! it gets with `28P01`. A URL without the password, or with a wrong one, is exit 1 with one
//! line that says the credentials were refused; a server that comes up later and refuses them
//! ends the gateway's tries to connect instead of a retry every second.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Fixture, Http, assert_one_error_line, free_addr, idem_command, spawn_gateway};
use http::Method;

/// A server on `listener` that asks every connection for a cleartext password and refuses
/// whatever comes (`28P01`); counts the connections.
fn refusing_server(listener: TcpListener) -> Arc<AtomicUsize> {
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || refuse(stream));
        }
    });
    connections
}

fn read_exact(stream: &mut TcpStream, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0; len];
    stream.read_exact(&mut buf).ok()?;
    Some(buf)
}

fn be32(bytes: &[u8]) -> usize {
    usize::try_from(u32::from_be_bytes(bytes.try_into().unwrap())).unwrap()
}

/// The startup message (after an `SSLRequest`, answered `N`), `AuthenticationCleartextPassword`,
/// then an `ErrorResponse` 28P01 for the password, if one comes.
fn refuse(mut stream: TcpStream) {
    loop {
        let Some(head) = read_exact(&mut stream, 4) else {
            return;
        };
        let Some(body) = read_exact(&mut stream, be32(&head) - 4) else {
            return;
        };
        if body.get(..4) == Some(&[0x04, 0xd2, 0x16, 0x2f][..]) {
            let _ = stream.write_all(b"N");
            continue;
        }
        break;
    }
    if stream.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).is_err() {
        return;
    }
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

/// Runs `idem serve` on `store` and waits for it to exit (killing it after a generous limit,
/// which fails the test: a gateway that started on a store that refuses it).
fn serve_until_exit(store: &str) -> std::process::Output {
    let mut child = idem_command("serve")
        .args([
            "--store",
            store,
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--no-admin",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "idem serve still runs on {store}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A URL without a password, to a server that needs one: before, the gateway took the
/// driver's `password missing` for a server not reached yet, started, and answered 503
/// forever (`/readyz`: `not reached yet: ... password missing`). A wrong password was exit 1
/// already; both now say the credentials were refused.
#[test]
fn a_missing_or_wrong_password_is_exit_1_with_one_line() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = refusing_server(listener);
    for (userinfo, says) in [
        ("idem", "asks for a password and the URL has none"),
        (
            "idem:wrong",
            "password authentication failed for user \"idem\" (SQLSTATE 28P01)",
        ),
    ] {
        let store = format!("postgres://{userinfo}@{addr}/test");
        let output = serve_until_exit(&store);
        let shown = store.replace(":wrong@", ":***@");
        assert_one_error_line(&output, 1, &format!("store {shown}: "));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("the server refused the credentials") && stderr.contains(says),
            "{stderr}"
        );
        assert!(!stderr.contains("wrong"), "the password is shown: {stderr}");
    }
    assert!(connections.load(Ordering::SeqCst) >= 2);
}

/// The server is not up when the gateway starts (it starts on a deferred store), then comes
/// up and refuses the credentials: the try that met the refusal ends the tries. `/readyz`
/// says the credentials were refused (not "not reached yet"), and no request makes the
/// gateway connect again: before, it tried once a second, forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_comes_up_and_refuses_the_credentials_ends_the_tries() {
    let fixture = Fixture::start();
    let port = free_addr().port();
    let admin = free_addr();
    let store = format!("postgres://idem@127.0.0.1:{port}/test");
    let (_gateway, addr) = spawn_gateway(&[
        "--upstream",
        &format!("http://{}", fixture.addr),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        &admin.to_string(),
        "--store",
        &store,
    ]);
    let http = Http::new();
    let readyz = format!("http://{admin}/readyz");
    let early = http.send(Method::GET, &readyz, &[], "").await;
    assert_eq!(early.status, 503);
    assert!(early.text().contains("not reached"), "{}", early.text());

    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    let connections = refusing_server(listener);
    let refused = common::eventually(Duration::from_secs(30), || {
        let (http, readyz) = (http.clone(), readyz.clone());
        async move {
            let answer = http.send(Method::GET, &readyz, &[], "").await;
            answer.status == 503 && answer.text().contains("the server refused the credentials")
        }
    })
    .await;
    assert!(refused, "/readyz never said the credentials were refused");
    let ready = http.send(Method::GET, &readyz, &[], "").await;
    assert!(ready.text().contains("not tried again"), "{}", ready.text());
    let tried = connections.load(Ordering::SeqCst);
    assert!(tried >= 1);

    // Requests and probes for a while longer (a retry a second would connect again).
    let echo = format!("http://{addr}/echo");
    for i in 0..10 {
        let answer = http.post_key(&echo, &format!("after-{i}"), "x").await;
        assert!(answer.status >= 500, "{}", answer.status);
        assert_eq!(http.send(Method::GET, &readyz, &[], "").await.status, 503);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        tried,
        "the gateway tried again"
    );
    assert_eq!(fixture.count().await, 0);
}
