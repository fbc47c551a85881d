//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers),
//! `/readyz` (the store answers). When a token is set, every request needs
//! `Authorization: Bearer TOKEN` (401 otherwise).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use idem_core::Store;
use tokio::net::TcpListener;

use crate::body::{GatewayBody, full};

/// Renders the metrics as Prometheus text (the binary passes its exporter's handle).
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// What the admin listener serves.
#[derive(Clone)]
pub struct Admin {
    store: Arc<dyn Store>,
    token: Option<Arc<str>>,
    metrics: Option<RenderMetrics>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("store", &self.store)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<GatewayBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Admin {
    /// The admin endpoints over `store`; `metrics` renders `/metrics` (404 without it).
    #[must_use]
    pub fn new(
        store: Arc<dyn Store>,
        token: Option<String>,
        metrics: Option<RenderMetrics>,
    ) -> Self {
        Admin {
            store,
            token: token.map(Into::into),
            metrics,
        }
    }

    fn authorized<B>(&self, request: &Request<B>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|given| same(given, token.as_bytes()))
    }

    /// Answers one admin request.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<GatewayBody> {
        if !self.authorized(&request) {
            let mut response = text(StatusCode::UNAUTHORIZED, "a bearer token is required\n");
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idem admin\""),
            );
            return response;
        }
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        match request.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => match tokio::time::timeout(READY_TIMEOUT, self.store.ping()).await {
                Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
                Ok(Err(err)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n")),
                Err(_) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("store: no answer within {READY_TIMEOUT:?}\n"),
                ),
            },
            "/metrics" => match &self.metrics {
                Some(render) => {
                    let mut response = text(StatusCode::OK, render());
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    response
                }
                None => text(StatusCode::NOT_FOUND, "no metrics recorder installed\n"),
            },
            _ => text(StatusCode::NOT_FOUND, "GET /metrics, /healthz or /readyz\n"),
        }
    }

    /// Serves the admin endpoints on `listener` until `shutdown` resolves.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let builder = auto::Builder::new(TokioExecutor::new());
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let admin = self.clone();
                    let service = service_fn(move |request: Request<Incoming>| {
                        let admin = admin.clone();
                        async move { Ok::<_, Infallible>(admin.handle(request).await) }
                    });
                    let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                }
                () = &mut shutdown => return,
            }
        }
    }
}
