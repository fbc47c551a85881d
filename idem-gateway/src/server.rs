//! The public listener: accepts connections (HTTP/1.1 and HTTP/2, hyper-util's auto server),
//! hands each request to the [`Gateway`], and shuts down gracefully: stop accepting, let
//! in-flight requests finish within the grace period, then make the rest give up so their keys
//! are released.
//!
//! The gateway serves on `[server] workers` threads ([`serve_workers`]), each a current-thread
//! runtime with its own listener on the shared port ([`bind_workers`]) and its own upstream
//! pool: a connection, its requests and their upstream exchanges stay on one thread. The store
//! and the admin listener stay on the runtime that started the gateway.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};

use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::proxy::Tracker;

/// hyper's own limit on the header fields of an HTTP/1 request, used when none is set.
const HYPER_MAX_HEADERS: usize = 100;

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
pub(crate) async fn serve(
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
        .header_read_timeout(Duration::from_secs(30));
    if settings.max_headers != HYPER_MAX_HEADERS {
        // Set, hyper fills an array of that many header slots for every request it parses
        // (about 1,000 instructions per request); left at its default, it parses into
        // uninitialised slots on the stack, with the same limit.
        builder.http1().max_headers(settings.max_headers);
    }
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
    // The shutdown is logged once for all serving threads, by `serve_workers`.
    let deadline = deadline_after(settings.shutdown_grace);
    let connections_closed = tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_ok();
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    // A request whose client left runs on detached: wait for those too.
    let idle = tracker.wait_idle(remaining).await;
    if connections_closed && idle {
        return Drained {
            clean: true,
            abandoned: 0,
        };
    }
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

/// The instant `limit` from now, or a year from now when that is sooner: a deadline that far
/// is never reached, and `Instant + Duration` panics past the clock's range.
fn deadline_after(limit: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);
    tokio::time::Instant::now() + limit.min(FAR)
}

/// Binds `count` listeners on `addr`, all on one port (the port of the first when `addr` asks
/// for port 0). With more than one, each is bound with `SO_REUSEPORT` and the kernel spreads
/// the connections over them (on Linux, only sockets of the same user can share the port).
///
/// `SO_REUSEPORT` would also let this process join a port another one already listens on with
/// it (a second `idem serve` on the same address): the kernel would then split connections
/// between the two processes, and on the memory store a key would run once in each. So when
/// the port is not 0, a probe socket without `SO_REUSEPORT` is bound on `addr` first; it fails
/// with "address in use" if anything listens there, another gateway included, and is closed
/// before the shared listeners are bound. (A process that binds the port between the two steps
/// is not caught; the probe is for the mistake of starting a gateway twice, not a lock.)
///
/// # Errors
/// The first bind that fails (the address is taken, or not this machine's).
pub(crate) fn bind_workers(
    addr: SocketAddr,
    count: NonZeroUsize,
) -> io::Result<Vec<std::net::TcpListener>> {
    let shared = count.get() > 1;
    if shared && addr.port() != 0 {
        drop(bind_socket(addr, false)?);
    }
    let bind = |addr: SocketAddr| -> io::Result<std::net::TcpListener> {
        bind_socket(addr, shared)?.listen(1024)?.into_std()
    };
    let first = bind(addr)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..count.get() {
        listeners.push(bind(addr)?);
    }
    Ok(listeners)
}

/// A socket bound on `addr` (`SO_REUSEADDR`, and `SO_REUSEPORT` when `reuse_port`), not yet
/// listening.
fn bind_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    Ok(socket)
}

/// One serving thread: a current-thread runtime, its listener and its own [`Gateway`] (so its
/// own upstream pool). A request, its layer and its upstream connection stay on one thread:
/// on a machine whose cores the proxy shares, hopping between threads cost a fifth of the CPU
/// per request.
#[derive(Debug)]
pub(crate) struct Worker {
    runtime: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    gateway: Gateway,
}

impl Worker {
    /// A serving thread's runtime, for [`Worker::new`] (and for opening a store connection on
    /// it first, with [`run_on`]).
    ///
    /// # Errors
    /// The runtime cannot be built.
    pub(crate) fn runtime() -> io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }

    /// A worker serving `gateway` on `listener` from `runtime`.
    #[must_use]
    pub(crate) fn new(
        runtime: tokio::runtime::Runtime,
        listener: std::net::TcpListener,
        gateway: Gateway,
    ) -> Self {
        Worker {
            runtime,
            listener,
            gateway,
        }
    }

    /// Lets go of a worker that will not serve (the gateway failed to start) without blocking:
    /// its runtime is shut down in the background, so this may be called from inside another
    /// runtime, where dropping a runtime panics.
    pub(crate) fn discard(self) {
        self.runtime.shutdown_background();
    }
}

/// Runs `future` to its end on `runtime`, from a thread of its own (so also from inside
/// another runtime): what it spawns (a store connection's driver) stays on `runtime`.
///
/// # Errors
/// The thread panicked.
pub(crate) fn run_on<F>(runtime: &tokio::runtime::Runtime, future: F) -> Result<F::Output, String>
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime.block_on(future))
            .join()
            .map_err(|_| "the thread opening a serving thread's store panicked".to_owned())
    })
}

/// Serves on each worker's thread until `shutdown` resolves, then drains them all (as
/// [`serve`] does) and reports the worst of their drains.
pub(crate) async fn serve_workers(
    workers: Vec<Worker>,
    settings: &ServerConfig,
    tracker: Tracker,
    shutdown: impl Future<Output = ()>,
) -> Drained {
    let (stop, stopped) = watch::channel(false);
    let mut results = Vec::with_capacity(workers.len());
    for (index, worker) in workers.into_iter().enumerate() {
        let (done, result) = oneshot::channel();
        let settings = settings.clone();
        let tracker = tracker.clone();
        let mut stopped = stopped.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("idem-serve-{index}"))
            .spawn(move || {
                let Worker {
                    runtime,
                    listener,
                    gateway,
                } = worker;
                let drained = runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(err) => {
                            tracing::error!(error = %err, "a serving thread cannot use its listener");
                            return Drained {
                                clean: true,
                                abandoned: 0,
                            };
                        }
                    };
                    let stop = async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    };
                    let drained = serve(listener, gateway, &settings, tracker, stop).await;
                    settle_tasks(SETTLE).await;
                    drained
                });
                let _ = done.send(drained);
            });
        match spawned {
            Ok(_) => results.push(result),
            Err(err) => tracing::error!(error = %err, "cannot start a serving thread"),
        }
    }
    shutdown.await;
    tracing::info!(
        in_flight = tracker.in_flight(),
        grace = %humantime::format_duration(settings.shutdown_grace),
        "shutting down: no new connections; in-flight requests may finish"
    );
    stop.send_replace(true);
    let mut drained = Drained {
        clean: true,
        abandoned: 0,
    };
    for result in results {
        match result.await {
            Ok(one) => {
                drained.clean &= one.clean;
                drained.abandoned = drained.abandoned.max(one.abandoned);
            }
            // The thread panicked: its requests were not drained.
            Err(_) => drained.clean = false,
        }
    }
    if drained.clean {
        tracing::info!("shutdown: every in-flight request finished");
    } else {
        tracing::warn!(
            abandoned = drained.abandoned,
            "shutdown: grace period over; the requests still waiting for the upstream were aborted (their keys released)"
        );
    }
    drained
}

/// Lets the tasks still alive on this thread's runtime (a response being stored after its
/// client left, a claim being released) finish, for up to `limit`, before the runtime goes.
async fn settle_tasks(limit: Duration) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = tokio::time::Instant::now() + limit;
    while metrics.num_alive_tasks() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub(crate) async fn shutdown_signal() {
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
