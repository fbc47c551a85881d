//! Idempotency-Key HTTP semantics for idem, as a tower [`Layer`][tower-layer].
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-http = "0.1"
//! idem-store-memory = "0.1" # or idem-store-redis, idem-store-postgres, idem-store-redb
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! # the example below also sends requests by hand:
//! http = "1"
//! tower = { version = "0.5", features = ["util"] }
//! ```
//!
//! ```
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use idem_http::{Config, IdempotencyLayer};
//! use idem_store_memory::MemoryStore;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::builder().require_key().build()?;
//! let app = Router::new()
//!     .route("/payments", post(|body: String| async move { format!("charged {body}") }))
//!     .layer(IdempotencyLayer::with_config(MemoryStore::new(), config));
//!
//! let pay = || Request::post("/payments").header("Idempotency-Key", r#""pay-1""#).body(Body::from("10 EUR"));
//! let first = app.clone().oneshot(pay()?).await?;
//! assert_eq!(first.status(), 200);
//!
//! // The retry is answered from the store: the handler does not run again.
//! let retry = app.clone().oneshot(pay()?).await?;
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let body = axum::body::to_bytes(Body::new(retry.into_body()), 1024).await?;
//! assert_eq!(body, "charged 10 EUR");
//!
//! // The same key with another body is refused.
//! let other = Request::post("/payments").header("Idempotency-Key", r#""pay-1""#).body(Body::from("99 EUR"))?;
//! assert_eq!(app.oneshot(other).await?.status(), 422);
//! # Ok(())
//! # }
//! ```
//!
//! The semantics follow draft-ietf-httpapi-idempotency-key-header-07 and Stripe:
//!
//! - The key is the `Idempotency-Key` header, an RFC 8941 sf-string (`"abc"`), or a bare key
//!   (`abc`) unless strict (see [`header`]). An invalid key is 400, never 500.
//! - Covered methods (POST and PATCH by default) are handled; others pass through untouched.
//!   Without a key, a request passes through (optional key, the default) or is refused with 400
//!   ([`ConfigBuilder::require_key`]).
//! - Records are scoped by a hash of the `Authorization` header by default: one principal can
//!   never read another's stored response. An application that authenticates by a cookie or
//!   an API-key header must scope by it ([`ConfigBuilder::scope_by_cookie`],
//!   [`ConfigBuilder::scope_by_all`]): else a caller who sends another's key and body is
//!   replayed the other's response.
//! - The request is fingerprinted (SHA-256 of method, path and query, and the body bytes as
//!   received; see [`fingerprint`]; behind axum's `Router::nest`, the path as sent with the
//!   `axum` feature) before the handler runs. The same key with another
//!   fingerprint is 422, also while the first request is in flight, and the record is untouched.
//! - While the first request runs, a retry gets 409 with `Retry-After`: an estimate of when
//!   the first finishes, from the recent durations of the layer's requests, bounded by the
//!   seconds left on its lease, at least 1 ([`ConfigBuilder::lease`]); or it waits for the
//!   result in bounded wait mode.
//! - A retry after it completed gets the stored response: same status, byte-identical body,
//!   headers in order with repeats, plus `Idempotent-Replayed: true`. Hop-by-hop headers,
//!   `Content-Length`, `Date`, `Set-Cookie`, `WWW-Authenticate` and `Proxy-Authenticate` are
//!   never stored (configurable).
//! - 2xx, 3xx and 4xx are stored, except 408, 425 and 429. Those, 5xx (unless
//!   [`ConfigBuilder::store_server_errors`]; a status from 600 to 999, which HTTP does not
//!   define, counts as a 5xx), a handler error or panic release the key so a retry runs the
//!   handler again.
//! - The handler runs in a task of its own: a client that disconnects never causes a second
//!   execution; the handler finishes and its response is stored. A heartbeat keeps the lease of
//!   a long handler.
//! - A request body over the limit (1 MiB) is 413 before anything runs; one that is not read
//!   whole within the body timeout (10 s) is 408, and nothing runs either. A response whose
//!   body is over the storage cap (1 MiB, as sent; its record, compressed, must fit in it too)
//!   is streamed to the first caller at once, in full, and stored as status and headers: a
//!   retry gets them with `Idempotency-Replay: omitted` and an empty body, and the handler never
//!   runs again. A response complete within the cap goes out whole while it is stored.
//! - Response trailers are stored, filtered like headers, and a replay ends with them (even
//!   one whose body was omitted), named in its `Trailer` header for HTTP/1.1: a gRPC response
//!   (`grpc-status` in its trailers) replays as it was answered, an error status included.
//!   A handler's trailers lose their hop-by-hop and framing fields on the way to the first
//!   caller and the record ([`fields`]), so the replay's trailers are the first caller's.
//! - Only the layer sets `Idempotent-Replayed`, `Idempotency-Replay` and `Idempotency-Status`:
//!   a handler's own are removed from every response of a fresh run and never stored.
//! - A store that cannot be reached is 503 with `Retry-After`, the handler not run (fail
//!   closed), or the handler runs and the response carries `Idempotency-Status: unrecorded`
//!   ([`StoreFailure::FailOpen`]).
//! - Refusals are RFC 9457 problem+json ([`rejection`]), replaceable. Every response carries
//!   its [`Outcome`] in its extensions; the handler finds an [`IdempotencyContext`] (key, scope,
//!   fence) in its request's, or extracts it with the `axum` feature (none when the request
//!   runs unrecorded, fail open).
//!
//! The request body type must be buildable from [`Bytes`][bytes] (axum's `Body`,
//! `http_body_util::Full<Bytes>`), since the layer reads the body before the handler runs.
//! In plain hyper 1, whose `Incoming` is not, wrap the request body on the way in into a
//! [`RequestBody`] (`request.map(RequestBody::new)`; the crate's `tests/hyper.rs` serves a
//! `service_fn` that way through hyper-util's `TowerToHyperService`).
//! Metrics names are listed in [`metrics`].
//!
// Links to crates outside the workspace are URLs: an intra-doc link to one renders as literal
// text under `cargo doc --no-deps`, which does not document it.
//! [tower-layer]: https://docs.rs/tower-layer/0.3/tower_layer/trait.Layer.html
//! [bytes]: https://docs.rs/bytes/1/bytes/struct.Bytes.html

mod body;
mod claim;
pub mod codec;
pub mod config;
mod context;
mod detach;
pub mod fields;
pub mod fingerprint;
mod future;
pub mod header;
pub mod key_source;
mod layer;
pub mod metrics;
mod outcome;
mod recent;
pub mod rejection;
mod replay;
mod request_body;
pub mod scope;
mod service;
pub mod signature;
mod unknown;

pub use body::ResponseBody;
pub use config::{Config, ConfigBuilder, KeyPolicy, LayerConfigError, StoreFailure};
pub use context::IdempotencyContext;
#[cfg(feature = "axum")]
pub use context::MissingContext;
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use outcome::Outcome;
pub use rejection::{Problem, ProblemJson, Rejection, RejectionHandler};
pub use request_body::RequestBody;
pub use scope::ScopePart;
pub use service::{Idempotency, REPLAY_HEADER, REPLAYED_HEADER, STATUS_HEADER};
pub use unknown::OutcomeUnknown;

#[doc(no_inline)]
pub use idem_core::{IdempotencyKey, Scope, Store};

/// The README's code blocks, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
