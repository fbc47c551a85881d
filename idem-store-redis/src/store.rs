//! [`RedisStore`]: the [`Store`] contract on Redis: idem-core's driver on the primitives of
//! [`crate::primitives`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, ClockEstimate, Driven, Failure, Fence, Lease, Record,
    RecordKey, ScanPage, ScanQuery, Store, StoreError, UnknownOutcome,
};
use redis::Value;

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::primitives::Backend;
use crate::scripts::{SWAP_SOURCE, Swap};

/// What the clones of a store share.
pub(crate) type Shared = Driven<Backend>;

/// The Redis store. Cheap to clone: clones share the connection.
///
/// See the [crate docs](crate) for the layout, the commands and the guarantees.
#[derive(Clone, Debug)]
pub struct RedisStore {
    inner: Arc<Shared>,
}

impl RedisStore {
    /// Connects to the server (or the Cluster) of `config`, measures its clock, chooses how to
    /// send compare-and-set (`SET ... IFEQ` where the server has it, else the script, loaded
    /// now).
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
        let clock = ClockEstimate::new(config.local_clock.clone());
        let mut backend = Backend {
            conn,
            config,
            clock,
            swap: Swap::Script,
        };
        backend.swap = Swap::for_server(&server_info(&backend).await?);
        if backend.swap == Swap::Script {
            load_script(&backend).await?;
        }
        crate::clock::measure(&backend).await?;
        let inner = Arc::new(Driven::new(backend));
        tokio::spawn(crate::clock::refresh(Arc::downgrade(&inner)));
        Ok(RedisStore { inner })
    }

    /// The configuration the store was built from.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.primitives().config
    }

    /// The Redis key of the record at `key` (`idem:{<namespace>:<scope>:<digest>}`), for
    /// operators and tests.
    #[must_use]
    pub fn redis_key(&self, key: &RecordKey) -> String {
        self.inner.primitives().redis_key(key)
    }

    /// How many commands this store (and its clones) sent for its operations: one per
    /// round trip (the clock's refresh every 30 s and the reconnects are not counted). The
    /// conformance suite counts a transition's round trips with it.
    #[must_use]
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips()
    }

    /// The error bound of the store's clock estimate (see [`ClockEstimate`]).
    #[must_use]
    pub fn clock_bound(&self) -> Duration {
        self.inner.primitives().clock.bound()
    }
}

/// The `server` section of `INFO` (on a Cluster, of one node).
async fn server_info(backend: &Backend) -> Result<String, StoreError> {
    let mut conn = backend.conn.clone();
    let info = async move {
        redis::cmd("INFO")
            .arg("server")
            .query_async::<Value>(&mut conn)
            .await
    };
    let reply = backend.bounded("connect", info).await?;
    Ok(match reply {
        Value::BulkString(text) => String::from_utf8_lossy(&text).into_owned(),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => text,
        // A Cluster answers each node's section; any one tells the version.
        Value::Map(nodes) => nodes
            .into_iter()
            .find_map(|(_, v)| redis::from_redis_value::<String>(v).ok())
            .unwrap_or_default(),
        _ => String::new(),
    })
}

/// Loads the compare-and-set script (on every primary of a Cluster), so the first operations
/// need no reload. A script lost later (a restarted server) is reloaded on `NOSCRIPT`.
async fn load_script(backend: &Backend) -> Result<(), StoreError> {
    let mut conn = backend.conn.clone();
    let load = async move {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SWAP_SOURCE)
            .query_async::<Value>(&mut conn)
            .await
    };
    backend.bounded("load scripts", load).await.map(drop)
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.inner.heartbeat(lease, extend).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner.complete(lease, result, retention).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner.fail(lease, failure, retention).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release(lease).await
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner
            .settle_unknown(lease, outcome, hold, retention)
            .await
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner
            .resolve_completed(key, fence, result, retention)
            .await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.inner.resolve_released(key, fence).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.inner.scan(query).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}
