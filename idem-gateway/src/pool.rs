//! The upstream connections of the [`Proxy`](crate::proxy::Proxy): HTTP/1.1 connections
//! (hyper's `client::conn::http1`, `TCP_NODELAY` set; over TLS for an `https` upstream), kept
//! alive between requests in a list
//! that belongs to the thread (a `thread_local`), so that taking a connection and giving it
//! back takes no lock and no atomic operation, and spawns no task.
//!
//! Each serving thread of the gateway runs its connections and their requests on its own
//! runtime ([`crate::server`]), so a thread's idle connections are the ones its own requests
//! left. A connection goes back to the list when its response body has ended (it is then
//! ready for the next request, or closed) and is dropped (closed) when the body is dropped
//! before its end. The list keeps at most `pool_max_idle` connections per upstream and
//! thread (the oldest goes first), each for at most `pool_idle_timeout`; a request takes the
//! one that went idle last. A request that finds the connection it took closed before it was
//! sent is sent again on another one, as hyper-util's pooled client does.
//!
//! To an `https` upstream, each new connection makes its TLS handshake (tokio-rustls, with
//! the [`UpstreamTls`](crate::config::UpstreamTls) of the configuration) before its HTTP/1 one, all within
//! `connect_timeout`: the name sent by SNI and checked against the certificate is the host of
//! the upstream's URL, and ALPN offers `http/1.1` alone. A handshake that fails (a certificate
//! the roots do not vouch for, one for another name) is a [`ConnectError::Tls`]: the request
//! was not sent.

use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::body::{Delivered, RequestBody, SettledTrailers};
use crate::config::UpstreamConfig;

/// The body of a request as it goes to the upstream.
pub(crate) type UpstreamRequestBody = Delivered<SettledTrailers<RequestBody>>;

/// The sending half of one upstream connection (its driver runs as a task of its own).
pub(crate) type Sender = SendRequest<UpstreamRequestBody>;

/// The TCP keep-alive probe interval of upstream connections.
const KEEPALIVE: Duration = Duration::from_secs(60);

/// One pool's idle connections on one thread, the one that went idle last at the end.
struct Slot {
    pool: u64,
    idle: Vec<(Sender, Instant)>,
}

thread_local! {
    /// This thread's idle connections, by pool (one slot per upstream the thread has used).
    static IDLE: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

/// Closes this thread's idle connections (of every pool): at shutdown, so that their drivers
/// end at once rather than at their idle timeout.
pub(crate) fn close_idle() {
    IDLE.with_borrow_mut(Vec::clear);
}

/// Tells pools apart in a thread's list.
static NEXT_POOL: AtomicU64 = AtomicU64::new(0);

/// Where the upstream is.
#[derive(Debug)]
enum Target {
    /// An address: no resolution.
    Addr(SocketAddr),
    /// A name to resolve on each new connection, and its port.
    Name(String, u16),
}

/// How a new connection to an `https` upstream makes its TLS handshake: with the roots of
/// the configuration, sending and checking the host of the URL.
enum Tls {
    /// Ready.
    Ready {
        connector: TlsConnector,
        name: ServerName<'static>,
    },
    /// Every connection fails, for this reason: the configuration has no TLS settings or
    /// the host is no name a certificate carries (the configuration refuses both, so only
    /// an [`UpstreamConfig`] made by hand has them).
    Unusable(&'static str),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tls::Ready { name, .. } => f
                .debug_struct("Ready")
                .field("name", name)
                .finish_non_exhaustive(),
            Tls::Unusable(why) => f.debug_tuple("Unusable").field(why).finish(),
        }
    }
}

/// The connections to one upstream (per thread; see the module's documentation).
#[derive(Debug)]
pub(crate) struct Pool {
    id: u64,
    target: Target,
    /// `Some` for an `https` upstream.
    tls: Option<Tls>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
}

/// A connection taken from the pool or made for a request.
pub(crate) struct Conn {
    /// The connection.
    pub sender: Sender,
    /// Whether it carried a request before (a request it returns unsent may go on another).
    pub reused: bool,
}

/// Why no connection was made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// Not within `connect_timeout`.
    #[error("connect timed out")]
    Timeout,
    /// Refused, unreachable, or a name that does not resolve.
    #[error("tcp connect error: {0}")]
    Io(io::Error),
    /// The TLS handshake with an `https` upstream failed: its certificate was not verified
    /// (not signed by a trusted root, for another name, expired), or the upstream does not
    /// speak TLS.
    #[error("tls handshake error: {0}")]
    Tls(io::Error),
    /// The HTTP/1 handshake failed.
    #[error("handshake error: {0}")]
    Handshake(hyper::Error),
}

impl Pool {
    /// The connections to `upstream`.
    pub(crate) fn new(upstream: &UpstreamConfig) -> Self {
        let url = &upstream.url;
        let port = url.port();
        let host = url.authority.host();
        let target = match url.host().parse::<IpAddr>() {
            Ok(ip) => Target::Addr(SocketAddr::new(ip, port)),
            Err(_) => Target::Name(host.to_owned(), port),
        };
        let tls = url.is_https().then(|| {
            match (&upstream.tls, ServerName::try_from(url.host().to_owned())) {
                (Some(tls), Ok(name)) => Tls::Ready {
                    connector: TlsConnector::from(tls.client()),
                    name,
                },
                (None, _) => Tls::Unusable("no TLS settings for the https upstream"),
                (Some(_), Err(_)) => {
                    Tls::Unusable("the upstream's host is not a name a certificate can carry")
                }
            }
        });
        Pool {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            target,
            tls,
            connect_timeout: upstream.connect_timeout,
            idle_timeout: upstream.pool_idle_timeout,
            max_idle: upstream.pool_max_idle,
        }
    }

    /// The connection of this thread that went idle last, or a new one. `now` is about now
    /// (an idle connection older than `pool_idle_timeout` at `now` is closed, not used).
    ///
    /// # Errors
    /// [`ConnectError`] when a new connection cannot be made.
    pub(crate) async fn checkout(&self, now: Instant) -> Result<Conn, ConnectError> {
        while let Some(mut sender) = self.take_idle(now) {
            // Ready, unless its driver has not yet taken in the end of the last response
            // (then it is within a poll of being ready, or closed).
            if sender.is_ready() || sender.ready().await.is_ok() {
                return Ok(Conn {
                    sender,
                    reused: true,
                });
            }
        }
        let sender = self.connect().await?;
        Ok(Conn {
            sender,
            reused: false,
        })
    }

    /// Takes the connection that went idle last, dropping those that have been idle too long
    /// or were closed.
    fn take_idle(&self, now: Instant) -> Option<Sender> {
        IDLE.with_borrow_mut(|slots| {
            let slot = slots.iter_mut().find(|slot| slot.pool == self.id)?;
            while let Some((sender, since)) = slot.idle.pop() {
                if now.saturating_duration_since(since) >= self.idle_timeout {
                    // The rest went idle before it: all too old.
                    slot.idle.clear();
                    return None;
                }
                if !sender.is_closed() {
                    return Some(sender);
                }
            }
            None
        })
    }

    /// Gives back a connection whose response has ended: it waits in this thread's list for
    /// the next request (unless it is closed or the pool keeps no idle connection).
    pub(crate) fn put(&self, sender: Sender) {
        if self.max_idle == 0 || sender.is_closed() {
            return;
        }
        let now = Instant::now();
        IDLE.with_borrow_mut(|slots| {
            let at = match slots.iter().position(|slot| slot.pool == self.id) {
                Some(at) => at,
                None => {
                    slots.push(Slot {
                        pool: self.id,
                        idle: Vec::new(),
                    });
                    slots.len() - 1
                }
            };
            let idle = &mut slots[at].idle;
            // The oldest goes when the list is full, or too old (one a call keeps the list
            // from holding connections a busy moment left behind).
            if idle.len() >= self.max_idle
                || idle.first().is_some_and(|(_, since)| {
                    now.saturating_duration_since(*since) >= self.idle_timeout
                })
            {
                idle.remove(0);
            }
            idle.push((sender, now));
        });
    }

    /// A new connection: resolved (a name), connected, `TCP_NODELAY` and TCP keep-alive set,
    /// its TLS handshake made (`https`), all within `connect_timeout`; its HTTP/1 driver
    /// spawned.
    async fn connect(&self) -> Result<Sender, ConnectError> {
        tokio::time::timeout(self.connect_timeout, self.open())
            .await
            .map_err(|_elapsed| ConnectError::Timeout)?
    }

    /// [`Pool::connect`] without its time limit.
    async fn open(&self) -> Result<Sender, ConnectError> {
        let tls = match &self.tls {
            None => None,
            Some(Tls::Ready { connector, name }) => Some((connector, name)),
            Some(Tls::Unusable(why)) => {
                return Err(ConnectError::Tls(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    *why,
                )));
            }
        };
        let stream = self.tcp().await.map_err(ConnectError::Io)?;
        stream.set_nodelay(true).map_err(ConnectError::Io)?;
        let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE);
        // Keep-alive probes only find a dead peer sooner: a socket without them still works.
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let Some((connector, name)) = tls else {
            return http1_over(stream).await;
        };
        let stream = connector
            .connect(name.clone(), stream)
            .await
            .map_err(ConnectError::Tls)?;
        http1_over(stream).await
    }

    /// A TCP connection to the first address of the target that takes one.
    async fn tcp(&self) -> io::Result<TcpStream> {
        let (host, port) = match &self.target {
            Target::Addr(addr) => return TcpStream::connect(*addr).await,
            Target::Name(host, port) => (host.as_str(), *port),
        };
        let mut last = None;
        for addr in tokio::net::lookup_host((host, port)).await? {
            match TcpStream::connect(addr).await {
                Ok(stream) => return Ok(stream),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} resolves to no address"),
            )
        }))
    }
}

/// The HTTP/1 handshake over `stream` (TCP, or TLS over it); the connection's driver is
/// spawned on this thread's runtime.
async fn http1_over<S>(stream: S) -> Result<Sender, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %crate::proxy::error_chain(&err), "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str, max_idle: usize) -> UpstreamConfig {
        let mut config = crate::config::from_str(
            "idem.toml",
            &format!("[upstream]\nurl = \"{url}\"\n"),
            &crate::config::Overrides::default(),
        )
        .unwrap()
        .require_upstream()
        .unwrap()
        .clone();
        config.pool_max_idle = max_idle;
        config
    }

    #[test]
    fn an_address_is_not_resolved_and_a_name_is() {
        let pool = Pool::new(&upstream("http://127.0.0.1:3000", 1));
        assert!(matches!(pool.target, Target::Addr(addr) if addr.port() == 3000));
        let pool = Pool::new(&upstream("http://[::1]", 1));
        assert!(matches!(pool.target, Target::Addr(addr) if addr.port() == 80 && addr.is_ipv6()));
        let pool = Pool::new(&upstream("http://localhost:8080", 1));
        assert!(matches!(&pool.target, Target::Name(host, 8080) if host == "localhost"));
    }

    /// A listener that answers every request on a connection 200 and counts connections.
    async fn upstream_server() -> (SocketAddr, std::sync::Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let service = hyper::service::service_fn(|_| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                    ))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (addr, accepted)
    }

    /// The connections the server has accepted, once it has accepted `at_least` (or a second
    /// has passed: the count is then checked as it is).
    async fn accepted_count(accepted: &AtomicU64, at_least: u64) -> u64 {
        for _ in 0..100 {
            if accepted.load(Ordering::Relaxed) >= at_least {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        accepted.load(Ordering::Relaxed)
    }

    async fn exchange(pool: &Pool) -> Sender {
        use http_body_util::BodyExt;
        let mut conn = pool.checkout(Instant::now()).await.unwrap();
        let request = http::Request::get("/")
            .header(http::header::HOST, "x")
            .body(crate::body::Delivered::new(
                SettledTrailers::new(RequestBody::from(bytes::Bytes::new())),
                None,
            ))
            .unwrap();
        let response = conn.sender.send_request(request).await.unwrap();
        response.into_body().collect().await.unwrap();
        conn.sender
    }

    #[tokio::test]
    async fn a_connection_given_back_is_used_again_and_the_list_is_bounded() {
        let (addr, accepted) = upstream_server().await;
        let pool = Pool::new(&upstream(&format!("http://{addr}"), 1));
        let sender = exchange(&pool).await;
        pool.put(sender);
        let sender = exchange(&pool).await;
        assert_eq!(
            accepted_count(&accepted, 1).await,
            1,
            "the idle connection is reused"
        );
        // Two at once: a second connection; only one of them is kept.
        let first = pool.checkout(Instant::now()).await.unwrap();
        assert!(!first.reused);
        assert_eq!(accepted_count(&accepted, 2).await, 2);
        pool.put(sender);
        pool.put(first.sender);
        let kept = IDLE.with_borrow(|slots| {
            slots
                .iter()
                .find(|slot| slot.pool == pool.id)
                .map_or(0, |slot| slot.idle.len())
        });
        assert_eq!(kept, 1);
    }

    #[tokio::test]
    async fn an_idle_connection_past_the_timeout_is_not_used() {
        let (addr, accepted) = upstream_server().await;
        let pool = Pool::new(&upstream(&format!("http://{addr}"), 4));
        let sender = exchange(&pool).await;
        pool.put(sender);
        let later = Instant::now() + pool.idle_timeout;
        let conn = pool.checkout(later).await.unwrap();
        assert!(!conn.reused);
        assert_eq!(accepted_count(&accepted, 2).await, 2);
    }

    /// At shutdown the idle connections close at once (before, their drivers lived until
    /// their idle timeout, and the drain waited for them).
    #[tokio::test]
    async fn idle_connections_close_when_asked() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (closed, on_close) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 4096];
            let _ = stream.read(&mut buffer).await;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            // The next read ends when the gateway closes the connection.
            while stream.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
            let _ = closed.send(());
        });
        let pool = Pool::new(&upstream(&format!("http://{addr}"), 4));
        let sender = exchange(&pool).await;
        pool.put(sender);
        close_idle();
        let closed = tokio::time::timeout(Duration::from_secs(20), on_close).await;
        assert!(closed.is_ok(), "the idle connection stayed open");
    }

    /// An `https` upstream trusting a CA made here (so not the system's roots).
    fn https_upstream(url: &str) -> UpstreamConfig {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let dir = std::env::temp_dir().join(format!("idem-gateway-pool-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!(
            "ca-{}.pem",
            NEXT_POOL.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, ca.pem()).unwrap();
        let text = format!(
            "[upstream]\nurl = \"{url}\"\nca_file = \"{}\"\nconnect_timeout = \"200ms\"\n",
            path.display()
        );
        crate::config::from_str("idem.toml", &text, &crate::config::Overrides::default())
            .unwrap()
            .require_upstream()
            .unwrap()
            .clone()
    }

    #[test]
    fn an_https_upstream_is_on_port_443_unless_written_and_makes_tls_connections() {
        let pool = Pool::new(&https_upstream("https://localhost"));
        assert!(matches!(&pool.target, Target::Name(host, 443) if host == "localhost"));
        assert!(matches!(&pool.tls, Some(Tls::Ready { name, .. }) if name.to_str() == "localhost"));
        let pool = Pool::new(&https_upstream("https://[::1]:8443"));
        assert!(matches!(pool.target, Target::Addr(addr) if addr.port() == 8443));
        assert!(matches!(
            &pool.tls,
            Some(Tls::Ready {
                name: ServerName::IpAddress(_),
                ..
            })
        ));
        let pool = Pool::new(&upstream("http://localhost", 1));
        assert!(matches!(&pool.target, Target::Name(_, 80)));
        assert!(pool.tls.is_none());
    }

    /// A server that accepts and never answers the TLS handshake: the handshake is within
    /// `connect_timeout`, so it is a connect timeout (504), not a wait for the upstream's
    /// response.
    #[tokio::test]
    async fn a_stalled_tls_handshake_is_a_connect_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let pool = Pool::new(&https_upstream(&format!("https://{addr}")));
        let err = pool.checkout(Instant::now()).await.err().unwrap();
        assert!(matches!(err, ConnectError::Timeout), "{err:?}");
    }

    /// A plain HTTP server behind an `https` URL: the handshake fails, nothing is sent.
    #[tokio::test]
    async fn a_server_that_does_not_speak_tls_is_a_tls_error() {
        let (addr, _) = upstream_server().await;
        let pool = Pool::new(&https_upstream(&format!("https://{addr}")));
        let err = pool.checkout(Instant::now()).await.err().unwrap();
        assert!(matches!(err, ConnectError::Tls(_)), "{err:?}");
        assert!(err.to_string().starts_with("tls handshake error"), "{err}");
    }

    /// An `https` configuration made without TLS settings never falls back to plain TCP.
    #[tokio::test]
    async fn an_https_upstream_without_tls_settings_is_never_spoken_to_in_the_clear() {
        let (addr, accepted) = upstream_server().await;
        let mut config = https_upstream(&format!("https://{addr}"));
        config.tls = None;
        let pool = Pool::new(&config);
        let err = pool.checkout(Instant::now()).await.err().unwrap();
        assert!(matches!(err, ConnectError::Tls(_)), "{err:?}");
        assert_eq!(
            accepted.load(Ordering::Relaxed),
            0,
            "no connection was opened"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_io_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let pool = Pool::new(&upstream(&format!("http://{addr}"), 4));
        let err = pool.checkout(Instant::now()).await.err().unwrap();
        assert!(matches!(err, ConnectError::Io(_)), "{err:?}");
    }
}
