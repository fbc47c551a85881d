//! The public listener: accepts connections (HTTP/1.1 and HTTP/2, hyper-util's auto server),
//! hands each request to the [`Gateway`], and shuts down gracefully: stop accepting, let
//! in-flight requests finish within the grace period, then make the rest give up so their keys
//! are released.
//!
//! A connection must bring its first complete request head within `header_timeout` of its
//! accept, on either protocol (hyper-util's protocol detection and HTTP/2 wait without a
//! limit: a socket that sends nothing, or only the HTTP/2 preface, would stay open forever);
//! later heads are bounded by hyper's own header timeout, and an HTTP/2 peer that stops
//! answering pings is closed. At most `max_connections` are open at once, over all serving
//! threads: at the cap a thread accepts no new connection until one closes, and says so in
//! the log at most once per [`LOG_EVERY`].
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};

use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::proxy::Tracker;

/// hyper's own limit on the header fields of an HTTP/1 request, used when none is set.
const HYPER_MAX_HEADERS: usize = 100;

/// After the grace period, how long aborted requests get to settle their keys (released, or
/// left unknown where the upstream had the request).
const SETTLE: Duration = Duration::from_secs(5);

/// The shortest interval between two log lines of one kind about refused or failed accepts.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// How long an HTTP/2 peer has to answer a ping before its connection is closed.
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// A log line that is written at most once per [`LOG_EVERY`], with the count of the
/// occurrences it stood for.
#[derive(Debug, Default)]
struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    /// Whether to log now, and how many occurrences went unlogged since the last line.
    fn due(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_EVERY)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// How a shutdown went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// Whether every in-flight request finished within the grace period.
    pub clean: bool,
    /// Requests still in flight when the gateway stopped waiting (0 when clean or settled).
    pub abandoned: usize,
}

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains. Each connection
/// holds one of `permits` (`max_connections`, shared by every serving thread) while it is open.
pub(crate) async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    settings: &ServerConfig,
    tracker: Tracker,
    permits: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) -> Drained {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(settings.max_header_bytes)
        .header_read_timeout(settings.header_timeout);
    if settings.max_headers != HYPER_MAX_HEADERS {
        // Set, hyper fills an array of that many header slots for every request it parses
        // (about 1,000 instructions per request); left at its default, it parses into
        // uninitialised slots on the stack, with the same limit.
        builder.http1().max_headers(settings.max_headers);
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(settings.header_timeout)
        .keep_alive_timeout(PING_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let (mut at_cap, mut accept_failed) = (Throttled::default(), Throttled::default());
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if let Some(suppressed) = at_cap.due() {
                    tracing::warn!(
                        max_connections = settings.max_connections.get(),
                        since_last_line = suppressed,
                        "max_connections reached: new connections wait until one closes"
                    );
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // Never closed while the gateway serves.
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors or a connection reset before accept: pause
                        // and go on.
                        if let Some(suppressed) = accept_failed.due() {
                            tracing::warn!(error = %err, since_last_line = suppressed, "accept failed");
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                serve_connection(&builder, &graceful, &gateway, stream, peer, permit, settings.header_timeout);
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

/// Raises the soft limit of open files to the hard one (on Unix), so that `max_connections`
/// is what bounds the connections, not a soft limit of 1,024 that the operator never chose;
/// warns when even the hard limit leaves less than `max_connections` plus room for the
/// upstream and store connections.
pub(crate) fn raise_open_files(max_connections: NonZeroUsize) {
    #[cfg(unix)]
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            let wanted = u64::try_from(max_connections.get())
                .unwrap_or(u64::MAX)
                .saturating_mul(2);
            if limit < wanted {
                tracing::warn!(
                    open_files = limit,
                    max_connections = max_connections.get(),
                    "the limit of open files is below twice max_connections (each client connection may need an upstream one): raise the hard limit (ulimit -Hn) or lower max_connections"
                );
            } else {
                tracing::debug!(open_files = limit, "limit of open files");
            }
        }
        Err(err) => tracing::warn!(error = %err, "cannot raise the limit of open files"),
    }
    #[cfg(not(unix))]
    let _ = max_connections;
}

/// Serves one accepted connection on a task of its own, holding `permit` until it closes.
/// The connection is closed if no request head is complete within `header_timeout` of now.
fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    gateway: &Gateway,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    header_timeout: Duration,
) {
    let gateway = gateway.clone();
    let started = Arc::new(AtomicBool::new(false));
    let first = started.clone();
    let service = service_fn(move |request: hyper::Request<Incoming>| {
        first.store(true, Ordering::Relaxed);
        let gateway = gateway.clone();
        async move { Ok::<_, Infallible>(gateway.handle(request, peer).await) }
    });
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .into_owned();
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        let _permit = permit;
        let mut connection = std::pin::pin!(connection);
        let result = tokio::select! {
            result = &mut connection => result,
            () = tokio::time::sleep(header_timeout) => {
                if !started.load(Ordering::Relaxed) {
                    tracing::debug!(%peer, "no request head within header_timeout: connection closed");
                    return;
                }
                connection.await
            }
        };
        if let Err(err) = result {
            tracing::debug!(error = %err, %peer, "connection ended with an error");
        }
    });
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
    let permits = Arc::new(Semaphore::new(
        settings.max_connections.get().min(Semaphore::MAX_PERMITS),
    ));
    let mut results = Vec::with_capacity(workers.len());
    for (index, worker) in workers.into_iter().enumerate() {
        let (done, result) = oneshot::channel();
        let settings = settings.clone();
        let tracker = tracker.clone();
        let permits = permits.clone();
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
                    let drained =
                        serve(listener, gateway, &settings, tracker, permits, stop).await;
                    // Idle upstream connections would keep their drivers (tasks of this
                    // thread) alive until their idle timeout, and the wait below for them.
                    crate::pool::close_idle();
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
            "shutdown: grace period over; the requests still waiting for the upstream were aborted (their keys released, or left unknown where the upstream had the request)"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_line_is_written_once_per_interval_with_what_it_stood_for() {
        let mut throttled = Throttled::default();
        assert_eq!(throttled.due(), Some(0));
        assert_eq!(throttled.due(), None);
        assert_eq!(throttled.due(), None);
        // As if the interval had passed.
        throttled.last = Instant::now().checked_sub(LOG_EVERY);
        assert_eq!(throttled.due(), Some(2));
    }
}
