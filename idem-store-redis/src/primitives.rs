//! [`Backend`]: the atomic primitives of idem-core on Redis, each one plain command (or the
//! compare-and-set script) on one key. idem-core's machine decides; nothing here does.
//!
//! | primitive | command |
//! |---|---|
//! | read | `GET key` |
//! | create-if-absent | `SET key value NX GET PX ttl` |
//! | compare-and-set | `EVALSHA <swap> 1 key expected value ttl`, or `SET key value IFEQ expected PX ttl` |
//! | remove | `DEL key` |

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::atomic::{Created, Primitives, Slot, Swapped, Version, Versioned};
use idem_core::machine::LeasePolicy;
use idem_core::{
    Bytes, ClockEstimate, Record, RecordKey, ScanPage, ScanQuery, StoreError, Timestamp,
};
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::codec::{decode_value, encode_tombstone, encode_value};
use crate::config::RedisConfig;
use crate::conn::{Conn, describe, resending, store_error};
use crate::layout;
use crate::scripts::{SWAP, SWAP_SOURCE, Swap};

/// The connection, the configuration and the clock estimate of one store.
pub(crate) struct Backend {
    pub(crate) conn: Conn,
    pub(crate) config: RedisConfig,
    pub(crate) clock: ClockEstimate,
    pub(crate) swap: Swap,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &describe(&self.config))
            .field("namespace", &self.config.namespace)
            .field("swap", &self.swap)
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// Runs `fut` within the command timeout.
    pub(crate) async fn bounded<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        let after = self.config.command_timeout;
        match tokio::time::timeout(after, fut).await {
            Ok(result) => result.map_err(|err| store_error(op, after, err)),
            Err(_) => Err(StoreError::Timeout { op, after }),
        }
    }

    /// Sends `cmd` about `key` within the command timeout, once more after a dropped
    /// connection (every primitive is safe to re-send). A key that holds no string is
    /// `Corrupt`.
    async fn send(
        &self,
        op: &'static str,
        key: &RecordKey,
        cmd: &Cmd,
    ) -> Result<Value, StoreError> {
        let sent = self.bounded(
            op,
            resending(&self.conn, |mut conn| async move {
                send_once(&mut conn, cmd).await
            }),
        );
        match sent.await {
            Err(StoreError::Backend { source, .. }) if source.to_string().contains("WRONGTYPE") => {
                Err(StoreError::corrupt(key, "the key holds no record value"))
            }
            other => other,
        }
    }

    pub(crate) fn redis_key(&self, key: &RecordKey) -> String {
        layout::redis_key(&self.config.namespace, key)
    }

    pub(crate) fn max_result(&self) -> usize {
        self.config.max_result_size.get()
    }

    fn encode(&self, slot: &Slot) -> Result<Vec<u8>, StoreError> {
        match slot {
            Slot::Tombstone(fence) => Ok(encode_tombstone(*fence)),
            Slot::Record(record) => self.encode_record(record),
        }
    }

    fn encode_record(&self, record: &Record) -> Result<Vec<u8>, StoreError> {
        let size = record.result.as_ref().map_or(0, Bytes::len);
        if size > self.max_result() {
            return Err(StoreError::TooLarge {
                size,
                limit: self.max_result(),
            });
        }
        encode_value(record, self.config.compression_threshold)
    }

    /// What a reply about `key` holds: `None` for nil, else the decoded value.
    fn versioned(&self, key: &RecordKey, value: Value) -> Result<Option<Versioned>, StoreError> {
        match value {
            Value::Nil => Ok(None),
            Value::BulkString(raw) => {
                let stored = || self.redis_key(key);
                let slot = decode_value(&stored, Some(key), &raw, self.max_result())?;
                Ok(Some(Versioned {
                    slot,
                    version: Version::new(raw),
                }))
            }
            other => Err(unexpected(&other)),
        }
    }
}

/// Sends `cmd`; an `EVALSHA` that finds no script (a restarted server) loads it and goes again.
async fn send_once(conn: &mut Conn, cmd: &Cmd) -> Result<Value, RedisError> {
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(SWAP_SOURCE)
                .query_async::<Value>(conn)
                .await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// A TTL in whole milliseconds, at least one.
fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn unexpected(value: &Value) -> StoreError {
    StoreError::Backend {
        source: format!("Redis answered with an unexpected shape: {value:?}").into(),
        retryable: false,
    }
}

#[async_trait]
impl Primitives for Backend {
    async fn read(&self, key: &RecordKey) -> Result<Option<Versioned>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.redis_key(key));
        let value = self.send("get", key, &cmd).await?;
        self.versioned(key, value)
    }

    async fn create(&self, record: &Record, ttl: Duration) -> Result<Created, StoreError> {
        let value = self.encode_record(record)?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.redis_key(&record.key))
            .arg(&value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(millis(ttl));
        match self.versioned(&record.key, self.send("claim", &record.key, &cmd).await?)? {
            None => Ok(Created::Created(Version::new(value))),
            Some(found) => Ok(Created::Present(found)),
        }
    }

    async fn swap(
        &self,
        key: &RecordKey,
        expected: &Version,
        slot: &Slot,
        ttl: Duration,
    ) -> Result<Swapped, StoreError> {
        let value = self.encode(slot)?;
        let redis_key = self.redis_key(key);
        let mut cmd;
        match self.swap {
            Swap::Script => {
                cmd = redis::cmd("EVALSHA");
                cmd.arg(SWAP.get_hash()).arg(1).arg(&redis_key);
                cmd.arg(&expected.as_bytes()[..])
                    .arg(&value)
                    .arg(millis(ttl));
            }
            Swap::IfEq => {
                cmd = redis::cmd("SET");
                cmd.arg(&redis_key).arg(&value).arg("IFEQ");
                cmd.arg(&expected.as_bytes()[..]).arg("PX").arg(millis(ttl));
            }
        }
        match self.send("swap", key, &cmd).await? {
            Value::Int(1) | Value::Okay => Ok(Swapped::Swapped(Version::new(value))),
            Value::Nil if self.swap == Swap::IfEq => Ok(Swapped::Lost(self.read(key).await?)),
            won => Ok(Swapped::Lost(self.versioned(key, won)?)),
        }
    }

    async fn remove(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.redis_key(key));
        match self.send("delete", key, &cmd).await? {
            Value::Int(n) => Ok(n > 0),
            other => Err(unexpected(&other)),
        }
    }

    async fn scan(&self, query: &ScanQuery, now: Timestamp) -> Result<ScanPage, StoreError> {
        crate::scan::scan(self, query, now).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let ping = resending(&self.conn, |mut conn| async move {
            redis::cmd("PING").query_async::<Value>(&mut conn).await
        });
        self.bounded("ping", ping).await.map(drop)
    }

    fn now(&self) -> Timestamp {
        let now = self.clock.now();
        let offset = self.config.clock_offset.micros();
        Timestamp::from_micros(now.as_micros().saturating_add_signed(offset))
    }

    fn clock_bound(&self) -> Duration {
        self.clock.bound()
    }

    fn lease_policy(&self) -> LeasePolicy {
        self.config.lease_policy
    }

    fn fence_memory(&self) -> Duration {
        self.config.fence_memory
    }
}
