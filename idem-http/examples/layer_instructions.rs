//! Requests through the layer (on the memory store) or through the bare handler, in one
//! thread and without a network, for counting instructions with valgrind's callgrind:
//!
//! ```text
//! cargo build --release -p idem-http --example layer_instructions
//! valgrind --tool=callgrind target/release/examples/layer_instructions layer 20000
//! valgrind --tool=callgrind target/release/examples/layer_instructions bare 20000
//! valgrind --tool=callgrind target/release/examples/layer_instructions replay 20000
//! ```
//!
//! `layer` sends a new key each request (first executions), `replay` one key throughout (one
//! first execution, then replays). `layer-pending` and `bare-pending` do as `layer` and `bare`
//! around a handler that pends once before it answers (as every handler that does I/O does):
//! the layer's cost around such a handler, against one answered on its first poll. `bench/instructions.sh` runs each with 0 and N requests and
//! prints the cost of one request.

use std::convert::Infallible;
use std::process::ExitCode;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_http::IdempotencyLayer;
use idem_store_memory::MemoryStore;
use tower::{Layer, Service, ServiceExt, service_fn};

/// The handler of `POST /echo` in the fixture: 201 with the request body.
async fn echo(request: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let content_type = request.headers().get(http::header::CONTENT_TYPE).cloned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::CREATED;
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, content_type);
    }
    Ok(response)
}

/// [`echo`], after pending once (woken at once).
async fn echo_pending(request: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    tokio::task::yield_now().await;
    echo(request).await
}

/// `POST /echo` under key `n`.
fn request(n: u64) -> Request<Full<Bytes>> {
    let mut request = Request::post("/echo")
        .header("content-type", "application/json")
        .header("idempotency-key", format!("\"key-{n:016}\""))
        .body(Full::new(Bytes::from_static(
            br#"{"amount":1000,"currency":"eur"}"#,
        )))
        .unwrap_or_default();
    *request.method_mut() = http::Method::POST;
    request
}

/// Sends `requests` requests, each under the key `key(n)`, and sums the response sizes.
async fn run<S>(mut service: S, requests: u64, key: fn(u64) -> u64) -> u64
where
    S: Service<Request<Full<Bytes>>> + Clone,
    S::Response: http_body::Body,
{
    let mut bytes = 0;
    for n in 0..requests {
        let Ok(ready) = service.ready().await else {
            return bytes;
        };
        if let Ok(response) = ready.call(request(key(n))).await {
            bytes += http_body::Body::size_hint(&response).lower();
        }
    }
    bytes
}

const USAGE: &str =
    "usage: layer_instructions layer|replay|bare|layer-pending|bare-pending REQUESTS";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let Some(requests) = args.next().and_then(|n| n.parse::<u64>().ok()) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    let bytes = runtime.block_on(async {
        let handler = service_fn(echo);
        let layered = || IdempotencyLayer::new(MemoryStore::new()).layer(handler);
        match mode.as_str() {
            "layer" => run(layered(), requests, |n| n).await,
            "replay" => {
                // The first execution is not counted: it runs in both the 0 and the N run.
                let service = layered();
                let _ = run(service.clone(), 1, |_| 0).await;
                run(service, requests, |_| 0).await
            }
            "bare" => run(handler, requests, |n| n).await,
            "layer-pending" => {
                let pending = service_fn(echo_pending);
                run(
                    IdempotencyLayer::new(MemoryStore::new()).layer(pending),
                    requests,
                    |n| n,
                )
                .await
            }
            "bare-pending" => run(service_fn(echo_pending), requests, |n| n).await,
            _ => u64::MAX,
        }
    });
    if bytes == u64::MAX {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    println!("{requests} requests, {bytes} response bytes");
    ExitCode::SUCCESS
}
