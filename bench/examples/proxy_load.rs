//! Sends N requests over one keep-alive HTTP/1.1 connection, one after the other, and checks
//! that each is answered 2xx: the load of `bench/callgrind_per_request.py`, which counts the
//! instructions a proxy spends per request under valgrind's callgrind (`bench/instructions.sh`).
//!
//! ```text
//! cargo run --release -p idem-bench --example proxy_load -- ADDR N unique|replay RUN [PATH]
//! ```
//!
//! Each request is `POST PATH` (`/echo` unless given) with a 32-byte JSON body and an
//! `Idempotency-Key`: `"RUN-i"` for the i-th request in `unique` mode (every request a first
//! execution), `"replay-RUN"` in `replay` mode (after the first, every request a replay). The
//! same requests as `wrk` sends in `bench/gateway.sh`.

use std::process::ExitCode;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use idem_bench::BoxError;
use tokio::net::TcpStream;

const BODY: &[u8] = br#"{"amount":1250,"currency":"eur"}"#;

async fn run() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(count), Some(mode), Some(run)) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        return Err("usage: proxy_load ADDR N unique|replay RUN [PATH]".into());
    };
    let path = args.next().unwrap_or_else(|| "/echo".to_owned());
    let count: u64 = count.parse()?;
    let unique = match mode.as_str() {
        "unique" => true,
        "replay" => false,
        other => return Err(format!("unknown mode {other:?}: unique or replay").into()),
    };
    let stream = TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(connection);
    for i in 0..count {
        let key = if unique {
            format!("\"{run}-{i}\"")
        } else {
            format!("\"replay-{run}\"")
        };
        let request = Request::post(path.as_str())
            .header(hyper::header::HOST, addr.as_str())
            .header("idempotency-key", key)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(BODY)))?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            return Err(
                format!("request {i}: {status}: {}", String::from_utf8_lossy(&body)).into(),
            );
        }
    }
    drop(sender);
    driver.await??;
    Ok(())
}

fn main() -> ExitCode {
    idem_bench::run_main(tokio::runtime::Builder::new_current_thread(), run())
}
