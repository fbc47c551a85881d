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

/// The floor as a tower layer.
#[derive(Clone, Default)]
pub(crate) struct FloorLayer {
    records: Records,
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
    records: Records,
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
            {
                let mut records = records.lock().unwrap_or_else(PoisonError::into_inner);
                match records.get(&key) {
                    None => {
                        records.insert(key.clone(), Entry::InFlight(fingerprint));
                    }
                    Some(Entry::InFlight(stored)) if *stored != fingerprint => {
                        return Ok(StatusCode::UNPROCESSABLE_ENTITY.into_response());
                    }
                    Some(Entry::InFlight(_)) => return Ok(StatusCode::CONFLICT.into_response()),
                    Some(Entry::Done {
                        fingerprint: stored,
                        status,
                        headers,
                        body,
                    }) => {
                        if *stored != fingerprint {
                            return Ok(StatusCode::UNPROCESSABLE_ENTITY.into_response());
                        }
                        let mut replay = Response::new(Body::from(body.clone()));
                        *replay.status_mut() = *status;
                        *replay.headers_mut() = headers.clone();
                        return Ok(replay);
                    }
                }
            }
            let response = inner
                .call(Request::from_parts(parts, Body::from(bytes)))
                .await?;
            let (parts, body) = response.into_parts();
            let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
                records
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
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
            records
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    key,
                    Entry::Done {
                        fingerprint,
                        status: parts.status,
                        headers,
                        body: kept,
                    },
                );
            Ok(Response::from_parts(parts, Body::from(body)))
        })
    }
}
