//! `idem demo`: a gateway on the memory store in front of a built-in payments upstream, both on
//! free ports, with curl lines to try.
//!
//! The flags that shape the gateway apply (`--listen`, `--admin-listen`, `--admin-token`,
//! `--no-admin`, `--lease`, `--retention`); the ones that would replace what the demo is made
//! of (`--config`, `--upstream`, a `--store` other than `memory`) are refused by
//! [`check_flags`] rather than ignored.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;

use crate::admin::RenderMetrics;
use crate::body::{GatewayBody, full};
use crate::commands::{Failure, bind, say, start};
use crate::config::{self, Config, GatewayConfigError, Overrides, StoreSpec};

/// The built-in upstream: `POST /payments[?delay=2s]` charges (counts an execution, answers
/// 201 with a payment id) after an optional delay; `GET /executions` tells how many ran.
#[derive(Clone, Debug, Default)]
pub(crate) struct DemoUpstream {
    executions: Arc<AtomicU64>,
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<GatewayBody> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

impl DemoUpstream {
    /// How many payments ran.
    #[must_use]
    pub(crate) fn executions(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }

    /// Answers one request.
    pub(crate) async fn handle(&self, request: Request<Incoming>) -> Response<GatewayBody> {
        match (request.method(), request.uri().path()) {
            (&Method::POST, "/payments") => {
                let delay = request
                    .uri()
                    .query()
                    .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("delay=")))
                    .and_then(|d| humantime::parse_duration(d).ok())
                    .unwrap_or(Duration::ZERO)
                    .min(Duration::from_secs(60));
                let body = match Limited::new(request.into_body(), 64 * 1024).collect().await {
                    Ok(body) => body.to_bytes(),
                    Err(_) => {
                        return json_response(
                            StatusCode::BAD_REQUEST,
                            json!({ "error": "unreadable body" }),
                        );
                    }
                };
                tokio::time::sleep(delay).await;
                let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
                let mut response = json_response(
                    StatusCode::CREATED,
                    json!({
                        "payment": format!("pay_{n}"),
                        "request": String::from_utf8_lossy(&body),
                        "execution": n,
                    }),
                );
                if let Ok(location) = HeaderValue::from_str(&format!("/payments/pay_{n}")) {
                    response.headers_mut().insert(header::LOCATION, location);
                }
                response
            }
            (&Method::GET, "/executions") => {
                json_response(StatusCode::OK, json!({ "executions": self.executions() }))
            }
            _ => json_response(
                StatusCode::NOT_FOUND,
                json!({ "error": "POST /payments or GET /executions" }),
            ),
        }
    }

    /// Serves on `listener` for as long as the task runs.
    pub(crate) async fn serve(self, listener: TcpListener) {
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let upstream = self.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let upstream = upstream.clone();
                async move { Ok::<_, Infallible>(upstream.handle(request).await) }
            });
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
    }
}

/// Refuses the settings `idem demo` cannot honour: a configuration file (`config`), an upstream
/// or a store other than `memory`. From a flag or its environment variable alike: the demo is
/// its own upstream on the memory store, and `idem serve` is the gateway for the rest.
///
/// # Errors
/// [`GatewayConfigError`] naming the flag and its variable.
pub(crate) fn check_flags(
    config: Option<&Path>,
    overrides: &Overrides,
) -> Result<(), GatewayConfigError> {
    let refuse = |flag: &str, variable: &str| {
        Err(GatewayConfigError::new(
            Some(format!("{flag} (or {variable})")),
            "idem demo runs its own upstream on the memory store and takes no config file, upstream or store: unset it, or run idem serve",
        ))
    };
    if config.is_some() {
        return refuse("--config", "IDEM_CONFIG");
    }
    if overrides.upstream.is_some() {
        return refuse("--upstream", "IDEM_UPSTREAM");
    }
    if let Some(store) = &overrides.store {
        if store.parse::<StoreSpec>().ok() != Some(StoreSpec::Memory) {
            return refuse("--store", "IDEM_STORE");
        }
    }
    Ok(())
}

/// The demo's configuration: the payments route requires a key and is scoped by the bearer
/// token and the session cookie (an API that takes either must scope by both); everything else
/// is default.
fn demo_config(upstream: SocketAddr, overrides: &Overrides) -> Result<Config, Failure> {
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shutdown_grace = "5s"

[upstream]
url = "http://{upstream}"

[store]
url = "memory"

[admin]
listen = "127.0.0.1:0"

[[route]]
name = "payments"
path = "/payments"
key = "required"
scope = ["authorization", "cookie:session"]
"#
    );
    let overrides = Overrides {
        store: None,
        upstream: None,
        ..overrides.clone()
    };
    Ok(config::from_str("demo", &text, &overrides)?)
}

/// `text` as one word of a POSIX shell: in single quotes, a `'` in it closed, escaped and
/// reopened.
fn shell_word(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The curl lines the demo prints; the admin listener's carry its `token`, when one is set, so
/// that they work as printed.
#[must_use]
pub(crate) fn instructions(
    gateway: SocketAddr,
    upstream: SocketAddr,
    admin: Option<SocketAddr>,
    token: Option<&str>,
) -> String {
    let gw = format!("http://{gateway}");
    let mut text = format!(
        "idem demo: a payments API at http://{upstream} behind the idem gateway at {gw}
(memory store; POST /payments requires an Idempotency-Key). Try:

  # 1. a payment: 201, executed
  curl -i {gw}/payments -H 'Idempotency-Key: order-1' -d '{{\"amount\": 10}}'

  # 2. the client retries: the same 201 and body, replayed (Idempotent-Replayed: true); the
  #    upstream did not run again
  curl -i {gw}/payments -H 'Idempotency-Key: order-1' -d '{{\"amount\": 10}}'

  # 3. the same key with another payload: 422
  curl -i {gw}/payments -H 'Idempotency-Key: order-1' -d '{{\"amount\": 99}}'

  # 4. no key: 400
  curl -i {gw}/payments -d '{{\"amount\": 10}}'

  # 5. a retry while the first attempt still runs: 409 with Retry-After (when it should end)
  curl -s {gw}/payments?delay=5s -H 'Idempotency-Key: order-2' -d x & sleep 1; curl -i {gw}/payments?delay=5s -H 'Idempotency-Key: order-2' -d x; wait

  # 6. the request of 1. from another session: its own payment, executed (records are scoped
  #    by Authorization and the session cookie)
  curl -i {gw}/payments -H 'Idempotency-Key: order-1' -H 'Cookie: session=bob' -d '{{\"amount\": 10}}'

  # how many payments really ran
  curl -s http://{upstream}/executions
"
    );
    if let Some(admin) = admin {
        let auth = token
            .map(|token| {
                format!(
                    " -H {}",
                    shell_word(&format!("Authorization: Bearer {token}"))
                )
            })
            .unwrap_or_default();
        text.push_str(&format!(
            "\n  # metrics and health\n  curl -s{auth} http://{admin}/metrics | grep '^idem_'\n  curl -s{auth} http://{admin}/readyz\n"
        ));
    }
    text.push_str("\nCtrl-C stops the demo.");
    text
}

/// `idem demo`: runs until Ctrl-C (or SIGTERM). Call [`check_flags`] first.
///
/// # Errors
/// [`Failure`]: a bad override, or a port that cannot be bound.
pub(crate) async fn run(
    overrides: &Overrides,
    metrics: Option<RenderMetrics>,
) -> Result<(), Failure> {
    let upstream_listener =
        bind(config::internal::loopback_any_port(), "the demo upstream").await?;
    let upstream_addr = upstream_listener
        .local_addr()
        .map_err(|err| Failure::runtime(format!("cannot read the bound address: {err}")))?;
    let upstream = DemoUpstream::default();
    tokio::spawn(upstream.clone().serve(upstream_listener));
    let config = demo_config(upstream_addr, overrides)?;
    crate::telemetry::init_logs(&config.log);
    let running = start(&config, metrics, crate::server::shutdown_signal()).await?;
    let token = config
        .admin
        .as_ref()
        .and_then(|admin| admin.token.as_deref());
    say(&instructions(
        running.listen,
        upstream_addr,
        running.admin,
        token,
    ));
    running.wait().await?;
    say(&format!(
        "demo stopped; the upstream ran {} payment(s)",
        upstream.executions()
    ));
    Ok(())
}
