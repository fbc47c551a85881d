//! [`IdempotencyLayer`]: applies the [`Idempotency`] middleware to a service.

use std::fmt;
use std::sync::Arc;

use idem_core::Store;
use idem_lease::{BeatTimer, KeeperConfig, Metered};
use tower_layer::Layer;

use crate::config::Config;
use crate::metrics::LayerMetrics;
use crate::recent::RecentDurations;
use crate::service::Idempotency;

/// The settings and the store, shared by every clone of the service.
pub(crate) struct Shared {
    /// The store, [`Metered`] under the configured store label.
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: Config,
    /// How each request's claim keeps its lease.
    pub(crate) keeper: Arc<KeeperConfig>,
    /// Wakes the claims whose first heartbeat is due.
    pub(crate) beats: BeatTimer,
    /// How long requests held their key lately: the `Retry-After` of a 409.
    pub(crate) durations: RecentDurations,
    /// The counters of every request.
    pub(crate) metrics: LayerMetrics,
}

impl Shared {
    pub(crate) fn new(store: Arc<dyn Store>, config: Config) -> Self {
        // A release is tried once: the caller waits for it before its answer (a retry finds
        // the key released, or lapsed with the lease).
        let keeper =
            KeeperConfig::new(config.lease, config.heartbeat).redact_keys(!config.log_keys);
        Shared {
            store: Arc::new(Metered::new(store, config.store_label)),
            beats: BeatTimer::for_heartbeat(config.heartbeat),
            config,
            keeper: Arc::new(keeper),
            durations: RecentDurations::default(),
            metrics: LayerMetrics::new(),
        }
    }
}

/// A tower [`Layer`][tower-layer] that gives the requests of a service the Idempotency-Key
/// semantics: the first request with a key runs the handler and stores its response; a retry
/// gets that response replayed; a concurrent retry gets 409; the key with another request gets
/// 422.
///
/// See the [crate docs](crate) for an example and [`Config`] for the settings.
///
/// [tower-layer]: https://docs.rs/tower-layer/0.3/tower_layer/trait.Layer.html
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.shared.store)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl IdempotencyLayer {
    /// A layer over `store` with the default settings.
    #[must_use]
    pub fn new(store: impl Store + 'static) -> Self {
        IdempotencyLayer::with_config(store, Config::default())
    }

    /// A layer over `store` with `config`.
    #[must_use]
    pub fn with_config(store: impl Store + 'static, config: Config) -> Self {
        IdempotencyLayer::from_arc(Arc::new(store), config)
    }

    /// A layer over a store chosen at run time.
    #[must_use]
    pub fn from_arc(store: Arc<dyn Store>, config: Config) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared::new(store, config)),
        }
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.shared.config
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_shared(inner, self.shared.clone())
    }
}
