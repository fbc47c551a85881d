//! The connection: a reconnecting multiplexed connection to one server, or a Redis Cluster
//! client; and how Redis errors become [`StoreError`]s.

use std::future::Future;
use std::time::Duration;

use idem_core::StoreError;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    Client, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, ServerErrorKind,
    Value,
};

use crate::config::{Nodes, RedisConfig, mask};

/// One server (reconnects by itself) or a Cluster (follows the topology and reconnects).
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A primary of the Cluster, by address; `None` for a single server.
pub(crate) type Node = Option<(String, u16)>;

impl Conn {
    /// Connects as `config` says, within the connect timeout (twice over, for one retry).
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Conn, StoreError> {
        install_tls_provider(config);
        let limit = config.connect_timeout * 2 + Duration::from_millis(500);
        let connecting = async {
            match &config.nodes {
                Nodes::Single(url) => connect_single(url, config).await,
                Nodes::Cluster(seeds) => connect_cluster(seeds, config).await,
            }
        };
        match tokio::time::timeout(limit, connecting).await {
            Ok(result) => result.map_err(|err| store_error("connect", limit, err)),
            Err(_) => Err(StoreError::Timeout {
                op: "connect",
                after: limit,
            }),
        }
    }

    /// The nodes to scan, in a stable order: every primary of a Cluster, or the one server.
    /// Re-sent once after a dropped connection.
    pub(crate) async fn scan_nodes(&mut self) -> Result<Vec<Node>, RedisError> {
        let Conn::Cluster(cluster) = self else {
            return Ok(vec![None]);
        };
        let slots = resending(cluster, |mut cluster| async move {
            cluster
                .route_command(
                    redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await
        })
        .await?;
        let mut primaries = primaries_of(&slots).ok_or_else(|| {
            RedisError::from((
                ErrorKind::Parse,
                "CLUSTER SLOTS answered with an unexpected shape",
            ))
        })?;
        primaries.sort();
        primaries.dedup();
        Ok(primaries.into_iter().map(Some).collect())
    }

    /// Runs `pipeline` (of `count` commands) on `node`; re-sent once after a dropped connection
    /// (scans send only reads).
    pub(crate) async fn pipeline_on(
        &mut self,
        node: &Node,
        pipeline: Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        resending(self, |conn| {
            conn.pipeline_once(node, pipeline.clone(), count)
        })
        .await
    }

    /// Runs `cmd` on `node`; re-sent once after a dropped connection (scans send only reads).
    pub(crate) async fn command_on(&mut self, node: &Node, cmd: Cmd) -> Result<Value, RedisError> {
        resending(self, |conn| conn.command_once(node, cmd.clone())).await
    }

    /// Sends `cmd`, on a Cluster to `node`.
    async fn command_once(mut self, node: &Node, cmd: Cmd) -> Result<Value, RedisError> {
        match (&mut self, node) {
            (Conn::Cluster(cluster), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                cluster
                    .route_command(cmd, RoutingInfo::SingleNode(route))
                    .await
            }
            _ => cmd.query_async(&mut self).await,
        }
    }

    /// Sends `pipeline` (of `count` commands), on a Cluster to `node`.
    async fn pipeline_once(
        mut self,
        node: &Node,
        pipeline: Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        match (&mut self, node) {
            (Conn::Cluster(cluster), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                cluster.route_pipeline(pipeline, 0, count, route).await
            }
            _ => pipeline.query_async(&mut self).await,
        }
    }
}

/// Runs `send` on a clone of `conn` and, after a dropped connection ([`resend_after`]), once
/// more on another clone (clones share the connection). For commands that are safe to send
/// twice.
pub(crate) async fn resending<C: Clone, T, F>(
    conn: &C,
    send: impl Fn(C) -> F,
) -> Result<T, RedisError>
where
    F: Future<Output = Result<T, RedisError>>,
{
    match send(conn.clone()).await {
        Err(err) if resend_after(&err) => send(conn.clone()).await,
        other => other,
    }
}

/// Whether a command that failed with `err` goes once more: after a dropped connection (the
/// server closed it: a broken pipe, a reset, an end of stream), on a single server and on a
/// Cluster alike. Never after a timeout (the command may still be running), a refusal (nothing
/// listens: a resend would be refused too) or an error the server answered.
///
/// The Cluster client retries a dropped connection by itself, but a retry whose node is still
/// reconnecting goes to another node's connection: after the whole Cluster restarted, those
/// are dead too, and its retries (three attempts in all) are spent on dead connections while
/// the reconnections are under way. The resend finds them repaired.
pub(crate) fn resend_after(err: &RedisError) -> bool {
    err.is_connection_dropped() && !err.is_timeout() && !err.is_connection_refusal()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(feature = "tls")]
fn install_tls_provider(_config: &RedisConfig) {
    // redis' rustls support needs a process-wide crypto provider; keep one already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(not(feature = "tls"))]
fn install_tls_provider(_config: &RedisConfig) {}

async fn connect_single(url: &str, config: &RedisConfig) -> Result<Conn, RedisError> {
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
    if let Some(username) = &config.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password);
    }
    if let Some(database) = config.database {
        settings = settings.set_db(i64::from(database));
    }
    let client = client(info.set_redis_settings(settings), config)?;
    // One quick retry: an operation while the server is down fails fast (Unavailable) instead
    // of waiting out a long backoff; the next operation reconnects.
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(200));
    let conn = ConnectionManager::new_with_config(client, manager).await?;
    Ok(Conn::Single(conn))
}

#[cfg(feature = "tls")]
fn client(info: redis::ConnectionInfo, config: &RedisConfig) -> Result<Client, RedisError> {
    match &config.tls_root {
        Some(root) => Client::build_with_tls(info, tls_certificates(root)),
        None => Client::open(info),
    }
}

#[cfg(not(feature = "tls"))]
fn client(info: redis::ConnectionInfo, _config: &RedisConfig) -> Result<Client, RedisError> {
    Client::open(info)
}

#[cfg(feature = "tls")]
fn tls_certificates(root: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root.to_vec()),
    }
}

async fn connect_cluster(seeds: &[String], config: &RedisConfig) -> Result<Conn, RedisError> {
    let mut builder = ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.command_timeout)
        .retries(2)
        .min_retry_wait(10)
        .max_retry_wait(200);
    if let Some(username) = &config.username {
        builder = builder.username(username);
    }
    if let Some(password) = &config.password {
        builder = builder.password(password);
    }
    #[cfg(feature = "tls")]
    if let Some(root) = &config.tls_root {
        builder = builder.certs(tls_certificates(root));
    }
    let client = builder.build()?;
    Ok(Conn::Cluster(client.get_async_connection().await?))
}

/// The primaries' addresses from a `CLUSTER SLOTS` reply.
fn primaries_of(slots: &Value) -> Option<Vec<(String, u16)>> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let Some(Value::Array(primary)) = parts.get(2) else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
                Value::SimpleString(text) => text.clone(),
                _ => return None,
            };
            let port = match primary.get(1)? {
                Value::Int(port) => u16::try_from(*port).ok()?,
                _ => return None,
            };
            Some((host, port))
        })
        .collect()
}

/// A Redis error as a [`StoreError`]: I/O and cluster-down errors are `Unavailable`, timeouts
/// `Timeout`, anything else `Backend` (retryable when Redis says a retry may help).
pub(crate) fn store_error(op: &'static str, after: Duration, err: RedisError) -> StoreError {
    if err.is_timeout() {
        return StoreError::Timeout { op, after };
    }
    let unavailable = err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || matches!(
            err.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::BusyLoading
                )
        );
    if unavailable {
        return StoreError::unavailable(err);
    }
    let retryable = matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::ReadOnly | ServerErrorKind::Moved | ServerErrorKind::Ask
        )
    ) || err.code() == Some("OOM");
    StoreError::Backend {
        source: Box::new(err),
        retryable,
    }
}

/// A masked description of the servers, for `Debug`.
pub(crate) fn describe(config: &RedisConfig) -> String {
    match &config.nodes {
        Nodes::Single(url) => mask(url),
        Nodes::Cluster(seeds) => format!(
            "cluster [{}]",
            seeds.iter().map(|s| mask(s)).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_are_parsed() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7001),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("127.0.0.1", 7002),
                node("127.0.0.1", 7003),
            ]),
        ]);
        assert_eq!(
            primaries_of(&slots),
            Some(vec![
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002)
            ])
        );
        assert_eq!(primaries_of(&Value::Int(1)), None);
    }

    #[test]
    fn errors_say_whether_to_retry() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let err = store_error("claim", Duration::from_secs(1), refused);
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let err = store_error("claim", Duration::from_secs(1), timed_out);
        assert!(
            matches!(err, StoreError::Timeout { op: "claim", .. }),
            "{err:?}"
        );
        let other = RedisError::from((ErrorKind::Client, "bad"));
        assert!(!store_error("claim", Duration::from_secs(1), other).is_retryable());
    }

    /// Sent again after a dropped connection only: not after a timeout, a refusal, or an
    /// answer of the server.
    #[test]
    fn only_a_dropped_connection_is_resent() {
        let io = |kind: std::io::ErrorKind| RedisError::from(std::io::Error::from(kind));
        for kind in [
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::ConnectionAborted,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            assert!(resend_after(&io(kind)), "{kind:?}");
        }
        assert!(resend_after(&RedisError::from((
            ErrorKind::Io,
            "connection dropped"
        ))));
        for kind in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::WouldBlock,
            std::io::ErrorKind::ConnectionRefused,
        ] {
            assert!(!resend_after(&io(kind)), "{kind:?}");
        }
        for err in [
            RedisError::from((ErrorKind::Server(ServerErrorKind::ClusterDown), "down")),
            RedisError::from((ErrorKind::Server(ServerErrorKind::TryAgain), "again")),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "none")),
            RedisError::from((ErrorKind::Client, "bad")),
        ] {
            assert!(!resend_after(&err), "{err:?}");
        }
    }
}
