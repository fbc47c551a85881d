//! [`RedisStore`]: the [`Store`] contract on Redis, one script per transition.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::LeasePolicy;
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Lease, OwnerToken, Record, RecordKey,
    ScanPage, ScanQuery, State, Store, StoreError, Timestamp, duration_micros,
};
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::codec::{decode_record, encode_result};
use crate::config::RedisConfig;
use crate::conn::{Conn, describe, resending, store_error};
use crate::layout;
use crate::scripts::{Lua, Reply, SCRIPTS, Scripts};

/// The longest duration a script is given, in microseconds (about 31 years): every sum of
/// times stays below 2^53, where Lua's numbers are still exact.
const MAX_DURATION_MICROS: u64 = 1_000_000_000_000_000;

/// The Redis store. Cheap to clone: clones share the connection.
///
/// See the [crate docs](crate) for the layout, the scripts and the guarantees.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) config: RedisConfig,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &describe(&self.inner.config))
            .field("namespace", &self.inner.config.namespace)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server (or the Cluster) of `config`, and loads the scripts.
    ///
    /// The store reconnects by itself after a lost connection: a store value keeps working
    /// once the server is back, without being rebuilt.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] or [`StoreError::Timeout`] if the server cannot be reached
    /// within the connect timeout; [`StoreError::Backend`] if it refuses the connection (bad
    /// credentials, no such database).
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let conn = Conn::connect(&config).await?;
        let store = RedisStore {
            inner: Arc::new(Inner { conn, config }),
        };
        store.load_scripts().await?;
        Ok(store)
    }

    /// The configuration the store was built from.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The Redis key of the record at `key` (`idem:{<namespace>:<scope>:<digest>}`), for
    /// operators and tests.
    #[must_use]
    pub fn redis_key(&self, key: &RecordKey) -> String {
        layout::redis_key(&self.inner.config.namespace, key)
    }

    /// Loads every script on the server (on every node of a Cluster), so the first operations
    /// need no reload. Scripts lost later (a restarted server) are reloaded on `NOSCRIPT`.
    async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        self.bounded("load scripts", async move {
            for source in Scripts::SOURCES {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(source)
                    .query_async::<redis::Value>(&mut conn)
                    .await?;
            }
            Ok(())
        })
        .await
    }

    /// Runs `fut` within the command timeout.
    pub(crate) async fn bounded<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        let after = self.inner.config.command_timeout;
        match tokio::time::timeout(after, fut).await {
            Ok(result) => result.map_err(|err| store_error(op, after, err)),
            Err(_) => Err(StoreError::Timeout { op, after }),
        }
    }

    /// Runs the script `lua` on the record at `key`: `EVALSHA` with the clock offset as `ARGV[1]`,
    /// then the arguments `args` adds; after a `NOSCRIPT` (a restarted server), loads the
    /// script and sends it again.
    async fn eval(
        &self,
        op: &'static str,
        lua: &Lua,
        key: &RecordKey,
        args: impl FnOnce(&mut Cmd),
    ) -> Result<Reply, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(lua.hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(self.offset_arg());
        args(&mut cmd);
        let cmd = &cmd;
        // A connection found dead (the server, or the whole Cluster, restarted since the last
        // operation) reconnects, and the script goes again on the new one, so the first
        // operation after a restart is not failed for a connection that was already gone. Every
        // script is safe to re-send: a claim carries its owner (the same grant is answered),
        // the other transitions are no-ops when repeated.
        let parts = self
            .bounded(
                op,
                resending(&self.inner.conn, |mut conn| async move {
                    send_script(&mut conn, cmd, lua).await
                }),
            )
            .await?;
        Ok(Reply { op, parts })
    }

    /// The clock offset in microseconds (`ARGV[1]` of every script).
    pub(crate) fn offset_arg(&self) -> i64 {
        self.inner.config.clock_offset.micros()
    }

    /// The fence memory in milliseconds.
    fn memory_arg(&self) -> u64 {
        let millis = self.inner.config.fence_memory.as_millis();
        u64::try_from(millis.min(u128::from(MAX_DURATION_MICROS / 1000))).unwrap_or(u64::MAX)
    }

    fn strict_arg(&self) -> &'static [u8] {
        match self.inner.config.lease_policy {
            LeasePolicy::Strict => b"1",
            LeasePolicy::Lenient => b"0",
        }
    }

    pub(crate) fn max_result(&self) -> usize {
        self.inner.config.max_result_size.get()
    }

    /// Claims `request` for the attempt `owner`. Sending the same claim again (same owner)
    /// after a lost reply answers the same grant.
    async fn claim_as(
        &self,
        request: &ClaimRequest,
        owner: OwnerToken,
    ) -> Result<ClaimOutcome, StoreError> {
        let reply = self
            .eval("claim", &SCRIPTS.claim, &request.key, |cmd| {
                cmd.arg(request.fingerprint.as_bytes())
                    .arg(&owner_arg(owner)[..])
                    .arg(micros_arg(request.lease))
                    .arg(self.memory_arg())
                    .arg(request.key.key.as_str())
                    .arg(request.key.scope.as_str());
            })
            .await?;
        self.claimed(request, owner, &reply)
    }

    fn claimed(
        &self,
        request: &ClaimRequest,
        owner: OwnerToken,
        reply: &Reply,
    ) -> Result<ClaimOutcome, StoreError> {
        match reply.tag() {
            b"acquired" => {
                let meta = reply.meta(1)?;
                if meta.state != State::InFlight || meta.owner != owner.as_u128() {
                    return Err(reply.unexpected());
                }
                Ok(ClaimOutcome::Acquired {
                    lease: Lease {
                        key: request.key.clone(),
                        owner,
                        fence: Fence::new(meta.fence),
                        until: Timestamp::from_micros(meta.time),
                        attempt: meta.attempt,
                    },
                    taken_over: reply.text(2)? == "1",
                })
            }
            b"in_flight" => Ok(ClaimOutcome::InFlight {
                retry_after: Duration::from_micros(reply.packed(1)?),
            }),
            b"completed" | b"failed" => {
                let fields = reply.parts.get(1..).ok_or_else(|| reply.unexpected())?;
                let record = decode_record(Some(&request.key), fields, self.max_result())?;
                match record.state {
                    State::Completed => Ok(ClaimOutcome::Completed(record)),
                    State::Failed => Ok(ClaimOutcome::Failed(record)),
                    State::InFlight => Err(reply.unexpected()),
                }
            }
            b"mismatch" => Ok(ClaimOutcome::Mismatch),
            b"corrupt" => Err(StoreError::corrupt(&request.key, reply.text(1)?)),
            _ => Err(reply.unexpected()),
        }
    }
}

/// Sends the `EVALSHA` `cmd` of `lua`; after a `NOSCRIPT` (a restarted server), loads the
/// script and sends it again.
async fn send_script(conn: &mut Conn, cmd: &Cmd, lua: &Lua) -> Result<Vec<Vec<u8>>, RedisError> {
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(lua.source)
                .query_async::<Value>(conn)
                .await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// A duration for a script, in whole microseconds, clamped to about 31 years.
fn micros_arg(d: Duration) -> u64 {
    duration_micros(d).min(MAX_DURATION_MICROS)
}

fn owner_arg(owner: OwnerToken) -> [u8; 16] {
    owner.as_u128().to_be_bytes()
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_as(request, request.grant_owner()).await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let reply = self
            .eval("heartbeat", &SCRIPTS.heartbeat, &lease.key, |cmd| {
                cmd.arg(&owner_arg(lease.owner)[..])
                    .arg(lease.fence.get())
                    .arg(micros_arg(extend))
                    .arg(self.strict_arg())
                    .arg(self.memory_arg());
            })
            .await?;
        let extended = Reply {
            op: "heartbeat",
            parts: reply.settle(&lease.key)?,
        };
        let meta = extended.meta(0)?;
        if meta.fence != lease.fence.get() {
            return Err(extended.unexpected());
        }
        Ok(Lease {
            until: Timestamp::from_micros(meta.time),
            ..lease.clone()
        })
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if result.len() > self.max_result() {
            return Err(StoreError::TooLarge {
                size: result.len(),
                limit: self.max_result(),
            });
        }
        let stored = encode_result(&result, self.inner.config.compression_threshold);
        self.eval("complete", &SCRIPTS.complete, &lease.key, |cmd| {
            cmd.arg(&owner_arg(lease.owner)[..])
                .arg(lease.fence.get())
                .arg(micros_arg(retention))
                .arg(self.strict_arg())
                .arg(self.memory_arg())
                .arg(stored.codec);
            for (name, piece) in layout::PIECE_NAMES
                .iter()
                .zip(layout::pieces(&stored.bytes))
            {
                cmd.arg(*name).arg(piece);
            }
        })
        .await?
        .settle(&lease.key)
        .map(drop)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let retryable: &[u8] = if failure.retryable { b"1" } else { b"0" };
        self.eval("fail", &SCRIPTS.fail, &lease.key, |cmd| {
            cmd.arg(&owner_arg(lease.owner)[..])
                .arg(lease.fence.get())
                .arg(micros_arg(retention))
                .arg(self.strict_arg())
                .arg(self.memory_arg())
                .arg(retryable)
                .arg(failure.message.as_bytes());
        })
        .await?
        .settle(&lease.key)
        .map(drop)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.eval("release", &SCRIPTS.release, &lease.key, |cmd| {
            cmd.arg(&owner_arg(lease.owner)[..])
                .arg(lease.fence.get())
                .arg(self.memory_arg());
        })
        .await?
        .settle(&lease.key)
        .map(drop)
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        let reply = self.eval("get", &SCRIPTS.get, key, |_| {}).await?;
        match reply.tag() {
            b"record" => {
                let fields = reply.parts.get(2..).ok_or_else(|| reply.unexpected())?;
                decode_record(Some(key), fields, self.max_result()).map(Some)
            }
            b"none" => Ok(None),
            b"corrupt" => Err(StoreError::corrupt(key, reply.text(1)?)),
            _ => Err(reply.unexpected()),
        }
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let reply = self
            .eval("delete", &SCRIPTS.delete, key, |cmd| {
                cmd.arg(self.memory_arg());
            })
            .await?;
        match (reply.tag(), reply.number(1)?) {
            (b"deleted", 0) => Ok(false),
            (b"deleted", 1) => Ok(true),
            _ => Err(reply.unexpected()),
        }
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        crate::scan::scan(self, query).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // Re-sent after a dropped connection, like every script (see `eval`).
        let ping = resending(&self.inner.conn, |mut conn| async move {
            redis::cmd("PING").query_async::<Value>(&mut conn).await
        });
        self.bounded("ping", ping).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Fingerprint, IdempotencyKey};

    /// A claim sent twice by the same attempt (the cluster client re-sends after a dropped
    /// connection) gets the same grant back, not "in flight".
    #[tokio::test]
    async fn a_resent_claim_gets_the_same_grant() {
        let url = idem_testkit::probe::service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let host_port = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        if !idem_testkit::probe::require_tcp("Redis", &host_port) {
            return;
        }
        let namespace = format!("t{:016x}", OwnerToken::random().as_u128() as u64);
        let config = RedisConfig::new(url)
            .unwrap()
            .with_namespace(namespace)
            .unwrap();
        let store = RedisStore::connect(config).await.unwrap();
        let request = ClaimRequest::new(
            RecordKey::unscoped(IdempotencyKey::new("resent").unwrap()),
            Fingerprint::of(&[b"x"]),
            Duration::from_secs(30),
        );
        let owner = OwnerToken::random();
        let first = store.claim_as(&request, owner).await.unwrap();
        let again = store.claim_as(&request, owner).await.unwrap();
        assert!(matches!(first, ClaimOutcome::Acquired { .. }), "{first:?}");
        assert_eq!(first, again);
        // Another attempt is told the key is in flight.
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ));
        let ClaimOutcome::Acquired { lease, .. } = first else {
            unreachable!()
        };
        store.release(&lease).await.unwrap();
        store.delete(&request.key).await.unwrap();
    }
}
