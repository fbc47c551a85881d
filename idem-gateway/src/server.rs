//! The public listener: accepts connections (HTTP/1.1 and HTTP/2, hyper-util's auto server),
//! hands each request to the [`Gateway`], and shuts down gracefully: stop accepting, let
//! in-flight requests finish within the grace period, then make the rest give up so their keys
//! are released.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::proxy::Tracker;

/// After the grace period, how long aborted requests get to release their keys.
const SETTLE: Duration = Duration::from_secs(5);

/// How a shutdown went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// Whether every in-flight request finished within the grace period.
    pub clean: bool,
    /// Requests still in flight when the gateway stopped waiting (0 when clean or settled).
    pub abandoned: usize,
}

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    settings: &ServerConfig,
    tracker: Tracker,
    shutdown: impl Future<Output = ()>,
) -> Drained {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(settings.max_header_bytes)
        .max_headers(settings.max_headers)
        .header_read_timeout(Duration::from_secs(30));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors or a connection reset before accept: pause
                        // and go on.
                        tracing::warn!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let gateway = gateway.clone();
                let service = service_fn(move |request: hyper::Request<Incoming>| {
                    let gateway = gateway.clone();
                    async move { Ok::<_, Infallible>(gateway.handle(request, peer).await) }
                });
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(err) = connection.await {
                        tracing::debug!(error = %err, %peer, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let grace = settings.shutdown_grace;
    tracing::info!(
        in_flight = tracker.in_flight(),
        grace = %humantime::format_duration(grace),
        "shutting down: no new connections; in-flight requests may finish"
    );
    let deadline = tokio::time::Instant::now() + grace;
    let connections_closed = tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_ok();
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    // A request whose client left runs on detached: wait for those too.
    let idle = tracker.wait_idle(remaining).await;
    if connections_closed && idle {
        tracing::info!("shutdown: every in-flight request finished");
        return Drained {
            clean: true,
            abandoned: 0,
        };
    }
    tracing::warn!(
        in_flight = tracker.in_flight(),
        "shutdown: grace period over; aborting the requests still waiting for the upstream (their keys are released)"
    );
    tracker.abort();
    let settled = tracker.wait_idle(SETTLE).await;
    // The layer releases a key right after its upstream call ends: give those releases a moment
    // to reach the store.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Drained {
        clean: false,
        abandoned: if settled { 0 } else { tracker.in_flight() },
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM; SIGINT only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
