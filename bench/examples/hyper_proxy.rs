//! The floor of a reverse proxy built on hyper: the least any hyper-based proxy does per request,
//! with none of idem's code. `bench/gateway.sh` and `bench/instructions.sh gateway` measure it
//! next to nginx and `idem serve`, in the same run.
//!
//! ```text
//! cargo run --release -p idem-bench --example hyper_proxy -- LISTEN UPSTREAM [WORKERS]
//! ```
//!
//! Each accepted connection gets one HTTP/1.1 connection to the upstream, opened when the
//! first request arrives and kept for the connection's life (no pool, no lock shared between
//! connections, TCP_NODELAY on both sides). Requests and responses go through as hyper reads
//! them: head and body unchanged, streamed, no header rewritten (not even hop-by-hop ones,
//! which a real proxy must remove). It prints `listening on ADDR` once it listens.

use std::process::ExitCode;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use idem_bench::BoxError;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

/// The upstream connection of one downstream connection, opened by its first request.
type Upstream = Arc<Mutex<Option<client::SendRequest<Incoming>>>>;

async fn forward(
    upstream: Upstream,
    addr: Arc<str>,
    request: Request<Incoming>,
) -> Result<Response<Incoming>, BoxError> {
    let mut slot = upstream.lock().await;
    let sender = match &mut *slot {
        Some(sender) if !sender.is_closed() => sender,
        _ => {
            let stream = TcpStream::connect(&*addr).await?;
            stream.set_nodelay(true)?;
            let (sender, connection) = client::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            slot.insert(sender)
        }
    };
    sender.ready().await?;
    let response = sender.send_request(request);
    drop(slot);
    Ok(response.await?)
}

async fn run() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        return Err("usage: hyper_proxy LISTEN UPSTREAM [WORKERS]".into());
    };
    let addr: Arc<str> = upstream.into();
    let listener = TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let addr = Arc::clone(&addr);
        tokio::spawn(async move {
            let upstream = Upstream::default();
            let service = service_fn(move |request| {
                forward(Arc::clone(&upstream), Arc::clone(&addr), request)
            });
            // A connection's error (the client went away) ends that connection only.
            let _ = server::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() -> ExitCode {
    let workers = std::env::args()
        .nth(3)
        .and_then(|workers| workers.parse().ok())
        .unwrap_or(2);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(workers);
    idem_bench::run_main(builder, run())
}
