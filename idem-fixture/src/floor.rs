//! `--floor`, for benchmarks only: the least any idempotency layer does on a request, in place
//! of idem-http's, as a second reference for `bench/http.sh`.
//!
//! It reads the key, reads the body whole and fingerprints it (SHA-256 of method, path and
//! body, as idem-http does), claims the key in one `Mutex<HashMap>`, calls the handler, reads
//! its response whole and keeps status, headers and body; a retry gets them back, a concurrent
//! one 409, another body 422. Nothing else: no scope, lease, heartbeat, fence or expiry, no
//! store behind a trait, no detached handler (a client that disconnects leaves its key in
//! flight forever), no header filtering, encoding or size caps, no metrics or logs. It is not
//! a usable layer: it is what the layer's work costs with everything that makes it one taken
//! out, so that `bench/http.sh` can say how much of the layer's cost any layer would pay.
//!
//! With `--store redis://...` it keeps its records in Redis instead, with the least any
//! Redis-backed layer sends: a claim is one `SET key in-flight NX GET PX lease` (a replay, a
//! conflict or a mismatch is answered from what it hands back), a completion one plain
//! `SET key response PX retention`. The same two round trips as the Redis store's first
//! execution and the same one as its replay, without its record layout, fence, clock,
//! compare-and-set or decoding checks.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_core::Fingerprint;
use idem_http::fingerprint::request_fingerprint;

/// What the floor keeps per key.
enum Entry {
    InFlight(Fingerprint),
    Done {
        fingerprint: Fingerprint,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
}

type Records = Arc<Mutex<HashMap<Bytes, Entry>>>;

/// Where the floor keeps its records.
#[derive(Clone)]
enum Keep {
    /// In this process.
    Memory(Records),
    /// In Redis, with its lease and retention.
    #[cfg(feature = "redis")]
    Redis(redis_keep::RedisKeep),
}

impl Default for Keep {
    fn default() -> Self {
        Keep::Memory(Records::default())
    }
}

impl Keep {
    /// Claims `key`: `None` if it is now this request's, else the answer it gets.
    async fn claim(&self, key: &Bytes, fingerprint: Fingerprint) -> Option<Response> {
        match self {
            Keep::Memory(records) => {
                let mut records = records.lock().unwrap_or_else(PoisonError::into_inner);
                match records.get(key) {
                    None => {
                        records.insert(key.clone(), Entry::InFlight(fingerprint));
                        None
                    }
                    Some(entry) => Some(entry.answer(fingerprint)),
                }
            }
            #[cfg(feature = "redis")]
            Keep::Redis(redis) => redis.claim(key, fingerprint).await,
        }
    }

    /// Keeps `entry` (a `Done`) for `key`.
    async fn settle(&self, key: Bytes, entry: Entry) {
        match self {
            Keep::Memory(records) => {
                records
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, entry);
            }
            #[cfg(feature = "redis")]
            Keep::Redis(redis) => redis.settle(&key, &entry).await,
        }
    }

    /// Frees `key` after a handler failed.
    async fn forget(&self, key: &Bytes) {
        match self {
            Keep::Memory(records) => {
                records
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(key);
            }
            #[cfg(feature = "redis")]
            Keep::Redis(redis) => redis.forget(key).await,
        }
    }
}

impl Entry {
    /// The answer to a request with `fingerprint` for a key that holds this entry.
    fn answer(&self, fingerprint: Fingerprint) -> Response {
        match self {
            Entry::InFlight(stored) if *stored != fingerprint => {
                StatusCode::UNPROCESSABLE_ENTITY.into_response()
            }
            Entry::InFlight(_) => StatusCode::CONFLICT.into_response(),
            Entry::Done {
                fingerprint: stored,
                status,
                headers,
                body,
            } => {
                if *stored != fingerprint {
                    return StatusCode::UNPROCESSABLE_ENTITY.into_response();
                }
                let mut replay = Response::new(Body::from(body.clone()));
                *replay.status_mut() = *status;
                *replay.headers_mut() = headers.clone();
                replay
            }
        }
    }
}

/// The floor as a tower layer.
#[derive(Clone, Default)]
pub(crate) struct FloorLayer {
    records: Keep,
}

impl FloorLayer {
    /// The floor keeping its records at the Redis server `url`, in keys under `prefix`.
    #[cfg(feature = "redis")]
    pub(crate) async fn redis(
        url: &str,
        prefix: &str,
        lease: std::time::Duration,
        retention: std::time::Duration,
    ) -> Result<Self, String> {
        let keep = redis_keep::RedisKeep::connect(url, prefix, lease, retention).await?;
        Ok(FloorLayer {
            records: Keep::Redis(keep),
        })
    }
}

impl<S> tower_layer::Layer<S> for FloorLayer {
    type Service = Floor<S>;

    fn layer(&self, inner: S) -> Floor<S> {
        Floor {
            inner,
            records: self.records.clone(),
        }
    }
}

/// The floor's service.
#[derive(Clone)]
pub(crate) struct Floor<S> {
    inner: S,
    records: Keep,
}

impl<S> tower_service::Service<Request<Body>> for Floor<S>
where
    S: tower_service::Service<Request<Body>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let records = self.records.clone();
        Box::pin(async move {
            let Some(key) = request
                .headers()
                .get("idempotency-key")
                .map(|value| Bytes::copy_from_slice(value.as_bytes()))
            else {
                return Ok(StatusCode::BAD_REQUEST.into_response());
            };
            let (parts, body) = request.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
                return Ok(StatusCode::PAYLOAD_TOO_LARGE.into_response());
            };
            // The layer's own fingerprint: the floor pays for the same hashing.
            let fingerprint = request_fingerprint(&parts.method, &parts.uri, &bytes);
            if let Some(answer) = records.claim(&key, fingerprint).await {
                return Ok(answer);
            }
            let response = inner
                .call(Request::from_parts(parts, Body::from(bytes)))
                .await?;
            let (parts, body) = response.into_parts();
            let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
                records.forget(&key).await;
                return Ok(StatusCode::INTERNAL_SERVER_ERROR.into_response());
            };
            // Copies: the body and header values may be slices of the connection's read buffer
            // (hyper parses without copying, and the echo answers with the request's own bytes),
            // which a record must not keep alive: any store copies the response into a record
            // of its own.
            let kept = Bytes::copy_from_slice(&body);
            let mut headers = HeaderMap::with_capacity(parts.headers.len());
            for (name, value) in &parts.headers {
                if let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) {
                    headers.append(name.clone(), value);
                }
            }
            let done = Entry::Done {
                fingerprint,
                status: parts.status,
                headers,
                body: kept,
            };
            records.settle(key, done).await;
            Ok(Response::from_parts(parts, Body::from(body)))
        })
    }
}

/// The floor's records in Redis: one string per key, `i` and the fingerprint while in flight,
/// `d`, the fingerprint, the status, the headers and the body once done.
#[cfg(feature = "redis")]
mod redis_keep {
    use std::time::Duration;

    use axum::body::Bytes;
    use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use axum::response::{IntoResponse, Response};
    use idem_core::Fingerprint;
    use redis::aio::MultiplexedConnection;

    use super::Entry;

    /// A connection and the floor's key prefix, lease and retention.
    #[derive(Clone)]
    pub(crate) struct RedisKeep {
        conn: MultiplexedConnection,
        prefix: String,
        lease_ms: u64,
        retention_ms: u64,
    }

    fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// A length as the two bytes that prefix a header name or value (at most 64 KiB).
    fn len16(bytes: &[u8]) -> [u8; 2] {
        u16::try_from(bytes.len()).unwrap_or(u16::MAX).to_be_bytes()
    }

    impl RedisKeep {
        pub(crate) async fn connect(
            url: &str,
            prefix: &str,
            lease: Duration,
            retention: Duration,
        ) -> Result<Self, String> {
            let client = redis::Client::open(url).map_err(|e| format!("--store {url}: {e}"))?;
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("--store {url}: {e}"))?;
            Ok(RedisKeep {
                conn,
                prefix: format!("{prefix}:floor:"),
                lease_ms: millis(lease),
                retention_ms: millis(retention),
            })
        }

        fn key(&self, key: &Bytes) -> Vec<u8> {
            [self.prefix.as_bytes(), key].concat()
        }

        pub(crate) async fn claim(
            &self,
            key: &Bytes,
            fingerprint: Fingerprint,
        ) -> Option<Response> {
            let value = [&b"i"[..], fingerprint.as_bytes()].concat();
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.key(key))
                .arg(value)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(self.lease_ms);
            let held: Option<Vec<u8>> = match cmd.query_async(&mut self.conn.clone()).await {
                Ok(held) => held,
                Err(_) => return Some(StatusCode::SERVICE_UNAVAILABLE.into_response()),
            };
            let held = held?;
            Some(match decode(&held) {
                Some(entry) => entry.answer(fingerprint),
                None => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            })
        }

        pub(crate) async fn settle(&self, key: &Bytes, entry: &Entry) {
            let Entry::Done {
                fingerprint,
                status,
                headers,
                body,
            } = entry
            else {
                return;
            };
            let mut value = Vec::with_capacity(64 + body.len());
            value.push(b'd');
            value.extend_from_slice(fingerprint.as_bytes());
            value.extend_from_slice(&status.as_u16().to_be_bytes());
            value.extend_from_slice(&[0, 0]); // the headers' length, set below
            for (name, header) in headers {
                value.extend_from_slice(&len16(name.as_str().as_bytes()));
                value.extend_from_slice(name.as_str().as_bytes());
                value.extend_from_slice(&len16(header.as_bytes()));
                value.extend_from_slice(header.as_bytes());
            }
            let headers_end = value.len();
            let headers_len = u16::try_from(headers_end - 37).unwrap_or(u16::MAX);
            value[35..37].copy_from_slice(&headers_len.to_be_bytes());
            value.extend_from_slice(body);
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.key(key))
                .arg(value)
                .arg("PX")
                .arg(self.retention_ms);
            // The floor keeps no promise: a lost write is a key that stays in flight.
            let _: Result<(), _> = cmd.query_async(&mut self.conn.clone()).await;
        }

        pub(crate) async fn forget(&self, key: &Bytes) {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(self.key(key));
            let _: Result<(), _> = cmd.query_async(&mut self.conn.clone()).await;
        }
    }

    /// The next length-prefixed part of `rest`, which moves past it.
    fn take<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
        let all: &'a [u8] = rest;
        let len = usize::from(u16::from_be_bytes(all.get(..2)?.try_into().ok()?));
        let part = all.get(2..2 + len)?;
        *rest = &all[2 + len..];
        Some(part)
    }

    /// The entry in `raw`, or `None` if it is not one the floor wrote.
    fn decode(raw: &[u8]) -> Option<Entry> {
        let fingerprint = |bytes: &[u8]| {
            <[u8; 32]>::try_from(bytes.get(1..33)?)
                .ok()
                .map(Fingerprint::from_bytes)
        };
        match raw.first()? {
            b'i' => Some(Entry::InFlight(fingerprint(raw)?)),
            b'd' => {
                let status = u16::from_be_bytes(raw.get(33..35)?.try_into().ok()?);
                let status = StatusCode::from_u16(status).ok()?;
                let headers_len =
                    usize::from(u16::from_be_bytes(raw.get(35..37)?.try_into().ok()?));
                let mut rest = raw.get(37..37 + headers_len)?;
                let mut headers = HeaderMap::new();
                while let Some(name) = take(&mut rest) {
                    let value = take(&mut rest)?;
                    headers.append(
                        HeaderName::from_bytes(name).ok()?,
                        HeaderValue::from_bytes(value).ok()?,
                    );
                }
                Some(Entry::Done {
                    fingerprint: fingerprint(raw)?,
                    status,
                    headers,
                    body: Bytes::copy_from_slice(raw.get(37 + headers_len..)?),
                })
            }
            _ => None,
        }
    }
}
