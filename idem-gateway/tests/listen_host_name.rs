//! Listening addresses given by host name (`localhost:0`: port 0 is any free port), in the
//! file and on the command line, for the gateway and its admin listener: each binds the first
//! address the name resolves to. Before, a name was refused ("write it like 127.0.0.1:8080").

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;

use common::{Fixture, Gateway, Http, Proc, idem_command};
use http::Method;
use idem_gateway::config::{self, Overrides};

/// The gateway and the admin listener of a file on `localhost:0` serve, each on a loopback
/// address of its own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_listens_on_a_host_name_from_the_file() {
    let fixture = Fixture::start();
    let text = format!(
        "[upstream]\nurl = \"http://{}\"\n\n[server]\nlisten = \"localhost:0\"\nshutdown_grace = \"5s\"\n\n[admin]\nlisten = \"localhost:0\"\n",
        fixture.addr
    );
    let config = config::from_str("listen.toml", &text, &Overrides::default()).unwrap();
    let gateway = Gateway::start(&config).await;
    let running = gateway.running.as_ref().unwrap();
    let admin = running.admin.unwrap();
    for addr in [running.listen, admin] {
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    }
    let http = Http::new();
    let reply = http.post_key(&gateway.url("/echo"), "name-1", "hi").await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(reply.text(), "hi");
    let health = http
        .send(Method::GET, &format!("http://{admin}/healthz"), &[], "")
        .await;
    assert_eq!(health.status, 200);
}

/// `idem serve --listen localhost:0 --admin-listen localhost:0` serves too, and says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_listens_on_a_host_name_from_the_flags() {
    let fixture = Fixture::start();
    let upstream = format!("http://{}", fixture.addr);
    let mut child = idem_command("serve")
        .args(["--upstream", &upstream, "--store", "memory"])
        .args(["--listen", "localhost:0", "--admin-listen", "localhost:0"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = |prefix: &str| -> SocketAddr {
        loop {
            let line = lines.next().expect("idem serve ended").unwrap();
            if let Some(addr) = line.trim().strip_prefix(prefix) {
                return addr.trim().parse().unwrap();
            }
        }
    };
    let listen = said("listening on");
    let admin = said("admin on");
    let proc = Proc { child };
    for addr in [listen, admin] {
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    }
    let http = Http::new();
    let reply = http
        .post_key(&format!("http://{listen}/echo"), "name-2", "hi")
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(reply.text(), "hi");
    let health = http
        .send(Method::GET, &format!("http://{admin}/healthz"), &[], "")
        .await;
    assert_eq!(health.status, 200);
    drop(proc);
}

/// `check-config` shows the address a name resolved to, and refuses a name that resolves to
/// nothing, naming where it is written.
#[test]
fn check_config_resolves_a_listening_name() {
    let output = idem_command("check-config")
        .args(["--upstream", "http://127.0.0.1:3000", "--json"])
        .args(["--listen", "localhost:0", "--admin-listen", "localhost:0"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for listen in [&summary["listen"], &summary["admin"]["listen"]] {
        let addr: SocketAddr = listen.as_str().unwrap().parse().unwrap();
        assert!(addr.ip().is_loopback() && addr.port() == 0, "{addr}");
    }
    // `.invalid` never resolves (RFC 6761).
    let output = idem_command("check-config")
        .args(["--upstream", "http://127.0.0.1:3000"])
        .args(["--listen", "idem-test.invalid:8080"])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    common::assert_one_error_line(
        &output,
        2,
        "--listen (or IDEM_LISTEN): cannot listen on idem-test.invalid:8080",
    );
}
