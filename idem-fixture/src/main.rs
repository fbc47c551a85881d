//! The HTTP conformance fixture of idem: a small server whose routes count their executions,
//! behind the idempotency layer (or not, with `--bare`), for black-box tests and benchmarks.
//!
//! ```text
//! idem-fixture [--listen ADDR] [--store URL] [--namespace NAME] [--retention-ms N]
//!              [--lease-ms N] [--memory-capacity N] [--bare | --floor]
//! idem-fixture --help
//! ```
//!
//! - `--listen ADDR`: where to listen (default `127.0.0.1:0`; port 0 picks a free port). The
//!   first line on stdout is the bound address.
//! - `--store URL`: `memory` (the default), `redis://HOST:PORT[/DB]` (namespace
//!   `idem_fixture`), `redis+cluster://HOST:PORT,HOST:PORT` (a Redis Cluster, any nodes of it
//!   as seeds), `postgres://USER@HOST/DB` (schema `idem_fixture`, migrated on connect)
//!   or `redb:PATH` (each behind the cargo feature of its name, all on by default). A Redis or
//!   PostgreSQL server that does not answer at start (down, or a closed port) does not stop the
//!   fixture: the routes behind the layer answer 503 with `Retry-After` and run nothing until it
//!   answers (a try to connect at most once a second; a line on stderr says so at start), as
//!   they do when it goes down later. A bad URL, or a redb file that cannot be opened, is an
//!   error at start (exit 2).
//! - `--namespace NAME`: the Redis namespace or PostgreSQL schema instead of `idem_fixture`
//!   (letters, digits and `_`), so fixtures sharing a server keep their records apart; refused
//!   with the memory and redb stores, whose records are the fixture's own already.
//! - `--retention-ms N`: how long a response is kept (default 86400000, 24 h).
//! - `--lease-ms N`: the lease of a claim (default 30000); the heartbeat runs every third of it.
//! - `--memory-capacity N`: bound the memory store to N records (default: unbounded). Once it
//!   is full every claim evicts the oldest settled record: the store at its steady size, as
//!   one with a retention runs in a long-lived process (`bench/http.sh` measures both).
//! - `--bare`: no layer (the baseline of the benchmarks).
//! - `--floor`: for benchmarks only, a minimal stand-in for the layer (see `floor.rs`): what any
//!   idempotency layer does on a request, with everything that makes idem-http a usable one
//!   taken out; `bench/http.sh` measures it as a second reference. Its records are in memory,
//!   or with `--store redis://...` in Redis (the least a Redis-backed layer sends).
//! - `--help`: this usage on stdout, exit 0. A bad flag or value is an error on stderr, exit 2.
//!
//! Routes: the five routes of the table below `/counter` are behind the layer, which covers
//! POST and PATCH and requires a key; they answer every method alike, so a PATCH is run once
//! and replayed like a POST, and a GET, PUT or DELETE passes through the layer untouched (run
//! every time, never stored). `/counter` and `/reset` are outside the layer. Any other path is
//! 404 outside the layer too: no key needed, nothing stored. A bad argument (`/status/abc`,
//! `/slow?ms=abc`, `/large?bytes=-1`) is a 400 `text/plain` from the route, which counts
//! nothing (and, being a 4xx, is stored).
//!
//! | route | behaviour |
//! |---|---|
//! | `POST /echo` | 201, echoes the body and its Content-Type (default application/octet-stream); counter +1 |
//! | `POST /status/{code}` | answers `{code}` (200 to 599) with body `status:{code}` text/plain (204 and 304 with no body); counter +1 |
//! | `POST /slow?ms=N` | reads the body, waits N ms, then 200 `slept:N` text/plain; counter +1 |
//! | `POST /large?bytes=N` | 200 with N bytes of `x`, application/octet-stream; counter +1 |
//! | `POST /headers` | 201 with Location, ETag, two Set-Cookie, two X-Multi, body `{"ok":true}`; counter +1 |
//! | `GET /counter` | 200 `{"count": n}` |
//! | `POST /reset` | 204, counter set to 0 |

use std::io::Write as _;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use idem_core::Store;
use idem_http::{Config, IdempotencyLayer};

mod floor;

/// mimalloc, as the `idem` gateway uses: the fixture is what `bench/http.sh` measures, with
/// and without the layer, so both sides run on the allocator a server would ship with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The largest `/large` and `/slow` arguments, so a typo cannot exhaust the machine.
const MAX_LARGE: usize = 256 * 1024 * 1024;
const MAX_SLOW_MS: u64 = 600_000;

const USAGE: &str = "usage: idem-fixture [--listen ADDR] [--store memory|redis://HOST:PORT|redis+cluster://HOST:PORT,HOST:PORT|postgres://USER@HOST/DB|redb:PATH] [--namespace NAME] [--retention-ms N] [--lease-ms N] [--memory-capacity N] [--bare | --floor]";

/// The Redis namespace and PostgreSQL schema unless `--namespace` names another.
const NAMESPACE: &str = "idem_fixture";

const NAMESPACE_SHARED_ONLY: &str =
    "--namespace applies to the redis:// and postgres:// stores only";

/// What the command line asks for.
#[derive(Debug)]
enum Command {
    /// Serve.
    Run(Args),
    /// Print the usage and exit 0.
    Help,
}

/// The command line.
#[derive(Debug)]
struct Args {
    listen: String,
    store: String,
    namespace: Option<String>,
    retention: Duration,
    lease: Duration,
    memory_capacity: Option<NonZeroUsize>,
    bare: bool,
    floor: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let mut parsed = Args {
        listen: "127.0.0.1:0".to_owned(),
        store: "memory".to_owned(),
        namespace: None,
        retention: Duration::from_secs(24 * 60 * 60),
        lease: Duration::from_secs(30),
        memory_capacity: None,
        bare: false,
        floor: false,
    };
    while let Some(flag) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let millis = |name: &str, text: String| {
            text.parse::<u64>()
                .ok()
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    format!("{name} takes a positive number of milliseconds, not {text:?}")
                })
        };
        match flag.as_str() {
            "--listen" => parsed.listen = value("--listen")?,
            "--store" => parsed.store = value("--store")?,
            "--namespace" => parsed.namespace = Some(value("--namespace")?),
            "--retention-ms" => {
                parsed.retention = millis("--retention-ms", value("--retention-ms")?)?
            }
            "--lease-ms" => parsed.lease = millis("--lease-ms", value("--lease-ms")?)?,
            "--memory-capacity" => {
                let text = value("--memory-capacity")?;
                let capacity = text.parse::<NonZeroUsize>().map_err(|_| {
                    format!("--memory-capacity takes a positive number of records, not {text:?}")
                })?;
                parsed.memory_capacity = Some(capacity);
            }
            "--bare" => parsed.bare = true,
            "--floor" => parsed.floor = true,
            "-h" | "--help" => return Ok(Command::Help),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if parsed.bare && parsed.floor {
        return Err("--bare and --floor exclude each other".to_owned());
    }
    Ok(Command::Run(parsed))
}

/// The executions counted by the routes.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicU64>);

impl Counter {
    fn bump(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The value of `name` in a query string.
fn query_number<T: std::str::FromStr>(query: Option<&str>, name: &str) -> Option<T> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .and_then(|(_, value)| value.parse().ok())
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

async fn echo(State(counter): State<Counter>, headers: HeaderMap, body: Bytes) -> Response {
    counter.bump();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response()
}

async fn status(State(counter): State<Counter>, Path(code): Path<String>) -> Response {
    // 1xx is not a final answer, and HTTP defines no status above 599 (RFC 9110 section 15),
    // though `http` would send one up to 999.
    let Some(status) = code
        .parse::<u16>()
        .ok()
        .filter(|code| (200..=599).contains(code))
        .and_then(|code| StatusCode::from_u16(code).ok())
    else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("not a final status (200 to 599): {code}"),
        );
    };
    counter.bump();
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        // These carry no content (RFC 9110 sections 15.3.5 and 15.4.5).
        return status.into_response();
    }
    text(status, format!("status:{}", status.as_u16()))
}

async fn slow(State(counter): State<Counter>, RawQuery(query): RawQuery, body: Body) -> Response {
    // The body is read first, as a handler of a POST does (and as the layer does before a
    // handler runs): the cost of the wait is then all the route adds to `/echo`'s.
    let _ = axum::body::to_bytes(body, usize::MAX).await;
    let Some(ms) = query_number::<u64>(query.as_deref(), "ms").filter(|&ms| ms <= MAX_SLOW_MS)
    else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("slow takes ?ms=0..={MAX_SLOW_MS}"),
        );
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    counter.bump();
    text(StatusCode::OK, format!("slept:{ms}"))
}

async fn large(State(counter): State<Counter>, RawQuery(query): RawQuery) -> Response {
    let Some(bytes) = query_number::<usize>(query.as_deref(), "bytes").filter(|&n| n <= MAX_LARGE)
    else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("large takes ?bytes=0..={MAX_LARGE}"),
        );
    };
    counter.bump();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(vec![b'x'; bytes]),
    )
        .into_response()
}

async fn headers(State(counter): State<Counter>) -> Response {
    counter.bump();
    let mut response = (StatusCode::CREATED, r#"{"ok":true}"#).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::LOCATION, HeaderValue::from_static("/things/1"));
    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    headers.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
    headers.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two"));
    response
}

async fn count(State(counter): State<Counter>) -> Response {
    let n = counter.0.load(Ordering::SeqCst);
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{{\"count\": {n}}}"),
    )
        .into_response()
}

async fn reset(State(counter): State<Counter>) -> StatusCode {
    counter.0.store(0, Ordering::SeqCst);
    StatusCode::NO_CONTENT
}

/// Any path the fixture does not serve: 404, outside the layer.
async fn not_found(method: Method, uri: Uri) -> Response {
    text(
        StatusCode::NOT_FOUND,
        format!(
            "no route {method} {uri}: the routes are /echo, /status/{{code}}, /slow, /large, \
             /headers, /counter and /reset"
        ),
    )
}

/// The layer for `args`, or why it cannot be built.
async fn layer(args: &Args) -> Result<IdempotencyLayer, String> {
    let (store, label) = match args.memory_capacity {
        Some(_) if args.namespace.is_some() => return Err(NAMESPACE_SHARED_ONLY.to_owned()),
        Some(capacity) if args.store == "memory" => {
            let store = idem::MemoryStore::builder().capacity(capacity).build();
            (Arc::new(store) as Arc<dyn Store>, "memory")
        }
        Some(_) => return Err("--memory-capacity bounds the memory store only".to_owned()),
        None => open_store(&args.store, args.namespace.as_deref()).await?,
    };
    let config = Config::builder()
        .require_key()
        .lease(args.lease)
        .heartbeat(args.lease / 3)
        .retention(args.retention)
        .store_label(label)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(IdempotencyLayer::from_arc(store, config))
}

/// The store `--store` names (under `--namespace`, if given), and its metrics label.
async fn open_store(
    spec: &str,
    namespace: Option<&str>,
) -> Result<(Arc<dyn Store>, &'static str), String> {
    let parsed: idem::StoreSpec = spec
        .parse()
        .map_err(|e| format!("--{}", idem::OpenError::from(e)))?;
    let shared = parsed.is_network();
    if namespace.is_some() && !shared {
        return Err(NAMESPACE_SHARED_ONLY.to_owned());
    }
    let opened = idem::OpenOptions::new(namespace.unwrap_or(NAMESPACE))
        .open_or_defer(&parsed)
        .await
        .map_err(|e| format!("--{e}"))?;
    if shared {
        if let Err(e) = opened.store.ping().await {
            // Not fatal: the layer answers 503 until the server answers. Said once, for a
            // mistyped port.
            eprintln!("idem-fixture: --store {spec}: {e}: answering 503 until it connects");
        }
    }
    Ok((opened.store, opened.label))
}

/// `--floor`'s layer: its records in this process, or in Redis with `--store redis://...`.
async fn floor_layer(args: &Args) -> Result<floor::FloorLayer, String> {
    #[cfg(feature = "redis")]
    if args.store.starts_with("redis://") {
        let prefix = args.namespace.as_deref().unwrap_or(NAMESPACE);
        return floor::FloorLayer::redis(&args.store, prefix, args.lease, args.retention).await;
    }
    match args.store.as_str() {
        "memory" => Ok(floor::FloorLayer::default()),
        other => Err(format!(
            "--floor keeps its records in memory or redis://, not {other}"
        )),
    }
}

async fn app(args: &Args) -> Result<Router, String> {
    let counter = Counter::default();
    // Every method reaches the handler; the layer decides which it covers (POST and PATCH).
    let covered = Router::new()
        .route("/echo", any(echo))
        .route("/status/{code}", any(status))
        .route("/slow", any(slow))
        .route("/large", any(large))
        .route("/headers", any(headers));
    // A route layer, so a path no route serves is 404 without a key, and nothing is stored.
    let covered = if args.bare {
        covered
    } else if args.floor {
        covered.route_layer(floor_layer(args).await?)
    } else {
        covered.route_layer(layer(args).await?)
    };
    Ok(covered
        .route("/counter", get(count))
        .route("/reset", post(reset))
        .fallback(not_found)
        .with_state(counter))
}

async fn serve(args: Args) -> Result<(), String> {
    let app = app(&args).await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{address}")
        .and_then(|()| stdout.flush())
        .map_err(|e| e.to_string())?;
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let result = parse_args(std::env::args().skip(1)).and_then(|command| match command {
        Command::Help => {
            let mut stdout = std::io::stdout();
            writeln!(stdout, "{USAGE}").map_err(|e| e.to_string())
        }
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(serve(args)),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("idem-fixture: {message}");
            ExitCode::from(2)
        }
    }
}
