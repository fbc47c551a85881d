//! [`Reconciler`]: learns an unknown outcome from the upstream. A route with `reconcile =
//! "/payments/by-key/{key}"` has the gateway ask that path (`GET`, the key percent-encoded in
//! the path and sent in the route's key header) after an exchange lost its answer, and again
//! with a growing pause until the upstream knows:
//!
//! - a 2xx answer settles the key as completed with that answer (status, the headers the
//!   route stores, body up to `storage_cap`), replayed to every retry from then on;
//! - a 404 frees the key: the effect did not happen, and a retry runs it;
//! - anything else (a 409 or 202 while the operation still runs, a 5xx, no answer) keeps the
//!   key unknown, and the gateway asks again later.
//!
//! Each resolution is fenced: it applies only to the record still unknown at the fence of the
//! attempt that lost its answer, so a reconciler never overwrites an operator's resolution or a
//! newer attempt. A retry answered `outcome-unknown` starts a reconciler too (if none runs for
//! its key on this serving thread), so an unknown key left by another gateway, or by this one
//! before a restart, is reconciled as soon as a client asks for it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{Fence, RecordKey, Store, StoreError};
use idem_http::codec::{StoredResponse, encode};
use metrics::Counter;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::body::RequestBody;
use crate::proxy::Proxy;
use crate::unknowns::UnknownBook;

/// What a key is percent-encoded against in a path: everything but letters, digits, `-`, `_`
/// and `~` (RFC 3986's unreserved characters less `.`, so that a key `..` is never a dot
/// segment the upstream resolves).
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');

/// The pause before the first try and the most between two: the first waits for the
/// upstream to finish what it may still be running, the rest back off to a minute.
const FIRST: Duration = Duration::from_secs(1);
const MOST: Duration = Duration::from_secs(60);
/// How many tries a reconciler makes before it leaves the key to an operator (about an
/// hour with the pauses above).
const TRIES: u32 = 64;

/// Resolutions by way, as `idem_gateway_unknown_resolutions_total{way}` counts them.
pub(crate) const RESOLUTIONS: &str = "idem_gateway_unknown_resolutions_total";
/// The ways of [`RESOLUTIONS`], each registered at zero.
pub(crate) const WAYS: [&str; 5] = [
    "reconcile_completed",
    "reconcile_released",
    "operator_completed",
    "operator_released",
    "hold_lapsed",
];

/// The counter of a resolution `way` (one of [`WAYS`]).
pub(crate) fn resolved(way: &'static str) -> Counter {
    metrics::counter!(RESOLUTIONS, "way" => way)
}

/// Asks a route's upstream for the outcome of its unknown keys. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Reconciler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    route: String,
    proxy: Proxy,
    store: Arc<dyn Store>,
    template: String,
    header: HeaderName,
    retention: Duration,
    storage_cap: usize,
    layer: idem_http::Config,
    unknowns: Arc<UnknownBook>,
    /// The keys a reconciler runs for on this serving thread.
    running: Mutex<HashSet<RecordKey>>,
}

/// What one try learnt.
enum Learnt {
    /// The upstream's answer: the effect happened.
    Completed(StoredResponse),
    /// A 404: it did not.
    NotFound,
    /// Not yet known.
    Unknown(String),
}

impl Reconciler {
    /// A reconciler for the route `route`, asking `template` on `proxy`'s upstream.
    #[must_use]
    pub(crate) fn new(
        route: &str,
        proxy: Proxy,
        store: Arc<dyn Store>,
        template: &str,
        settings: &crate::config::RouteSettings,
        layer: idem_http::Config,
        unknowns: Arc<UnknownBook>,
    ) -> Self {
        Reconciler {
            inner: Arc::new(Inner {
                route: route.to_owned(),
                proxy,
                store,
                template: template.to_owned(),
                header: settings.header.clone(),
                retention: settings.retention,
                storage_cap: settings.storage_cap.get(),
                layer,
                unknowns,
                running: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// Starts reconciling `key`, unknown at `fence`, unless a reconciler runs for it already.
    pub(crate) fn start(&self, key: RecordKey, fence: Fence) {
        {
            let mut running = self
                .inner
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !running.insert(key.clone()) {
                return;
            }
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            inner.run(&key, fence).await;
            inner
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&key);
        });
    }
}

impl Inner {
    async fn run(&self, key: &RecordKey, fence: Fence) {
        let mut pause = FIRST;
        for _ in 0..TRIES {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOST);
            let learnt = match self.ask(key).await {
                Ok(learnt) => learnt,
                Err(why) => Learnt::Unknown(why),
            };
            let (settled, way) = match learnt {
                Learnt::Completed(response) => (
                    self.store
                        .resolve_completed(key, fence, encode(&response), self.retention)
                        .await,
                    "reconcile_completed",
                ),
                Learnt::NotFound => (
                    self.store.resolve_released(key, fence).await,
                    "reconcile_released",
                ),
                Learnt::Unknown(why) => {
                    tracing::debug!(route = %self.route, %key, fence = fence.get(), "reconcile: still unknown: {why}");
                    continue;
                }
            };
            match settled {
                Ok(()) => {
                    resolved(way).increment(1);
                    self.unknowns.resolved(key);
                    tracing::info!(route = %self.route, %key, fence = fence.get(), way, "an unknown outcome was reconciled");
                    return;
                }
                // Resolved by someone else, or a newer attempt holds the key: nothing to do.
                Err(StoreError::Rejected(rejection)) => {
                    tracing::debug!(route = %self.route, %key, "reconcile: {rejection}");
                    return;
                }
                Err(error) => {
                    tracing::warn!(route = %self.route, %key, %error, "reconcile: the store did not take the resolution");
                }
            }
        }
        tracing::warn!(route = %self.route, %key, fence = fence.get(), "an unknown outcome is still unknown after every reconcile try: resolve it with `idem keys resolve`");
    }

    /// One reconcile request: the template's path with the key, `GET`, the key header set.
    async fn ask(&self, key: &RecordKey) -> Result<Learnt, String> {
        let sent = key.key.as_str();
        let encoded = utf8_percent_encode(sent, PATH_SEGMENT).to_string();
        let path = self.template.replacen("{key}", &encoded, 1);
        let value = HeaderValue::from_str(sent).map_err(|err| err.to_string())?;
        let request = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(&self.header, value)
            .body(RequestBody::from(Bytes::new()))
            .map_err(|err| err.to_string())?;
        let response = self
            .proxy
            .forward(request)
            .await
            .map_err(|err| err.public_detail())?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(Learnt::NotFound);
        }
        if !status.is_success() {
            return Ok(Learnt::Unknown(format!("the upstream answered {status}")));
        }
        let (parts, body) = response.into_parts();
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| self.layer.stores_header(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        // A body over the storage cap is stored without it, as the layer stores one; a body
        // that breaks off is no answer.
        let body = match Limited::new(body, self.storage_cap).collect().await {
            Ok(collected) => Some(collected.to_bytes()),
            Err(err) if err.is::<LengthLimitError>() => None,
            Err(err) => return Err(format!("the answer's body broke off: {err}")),
        };
        Ok(Learnt::Completed(StoredResponse {
            status,
            headers,
            body,
            trailers: Vec::new(),
        }))
    }
}

/// Once `hold` has passed, logs and counts (`hold_lapsed`) the release of `key` if it is still
/// unknown at `fence`: the next claim runs it again.
pub(crate) fn note_lapse(store: Arc<dyn Store>, key: RecordKey, fence: Fence, hold: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        let still = store.get(&key).await.ok().flatten().is_some_and(|record| {
            record.state == idem_core::State::Unknown && record.fence == fence
        });
        if still {
            resolved("hold_lapsed").increment(1);
            tracing::warn!(%key, fence = fence.get(), "the hold of an unknown outcome lapsed: the key is free, and a retry runs again");
        }
    });
}
