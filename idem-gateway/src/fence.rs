//! The fence downstream: every proxied request that holds a claim reaches the upstream with
//! the attempt's fence and number as request headers (`Idempotency-Fence: 17`,
//! `Idempotency-Attempt: 2` by default), and a client's own headers of those names are removed
//! from every proxied request, keyed or not, so an upstream can trust them.
//!
//! An upstream that keeps the highest fence it has applied per key, and refuses a write whose
//! fence is lower in the same transaction as the write, refuses the late write of an attempt
//! that was taken over (a gateway that died mid-request, whose request reaches the upstream
//! after the retry's). The fence strictly increases across every grant of a key
//! ([`idem_core::Fence`]); the attempt number is 1 for the first attempt and grows by one at
//! each takeover.
//!
//! The names are `[upstream] fence_header` and `attempt_header`: they are a contract with the
//! upstream, so they are set once for it, and removed on every route (`enabled = false` too).
//! `fence_headers = false` stops adding them; the client's copies are still removed, so an
//! upstream that still reads them never takes a client's value.

use http::Request;
use http::header::{self, HeaderName, HeaderValue};
use idem_http::IdempotencyContext;

/// `[upstream] fence_header`'s default.
pub(crate) const FENCE_HEADER: &str = "idempotency-fence";
/// `[upstream] attempt_header`'s default.
pub(crate) const ATTEMPT_HEADER: &str = "idempotency-attempt";

/// The headers that carry an attempt's fence and number to the upstream (`[upstream]
/// fence_headers`, `fence_header`, `attempt_header`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceHeaders {
    /// Whether a request that holds a claim gets them (`fence_headers`). A client's copies are
    /// removed either way.
    pub enabled: bool,
    /// The header of the fence (`fence_header`).
    pub fence: HeaderName,
    /// The header of the attempt number (`attempt_header`).
    pub attempt: HeaderName,
}

impl Default for FenceHeaders {
    /// On, `Idempotency-Fence` and `Idempotency-Attempt`.
    fn default() -> Self {
        FenceHeaders {
            enabled: true,
            fence: HeaderName::from_static(FENCE_HEADER),
            attempt: HeaderName::from_static(ATTEMPT_HEADER),
        }
    }
}

impl FenceHeaders {
    /// Removes the client's headers of both names from `request`, then, when on and the
    /// request holds a claim (the layer put its [`IdempotencyContext`] in the extensions),
    /// sets them to the claim's fence and attempt number.
    pub(crate) fn apply<B>(&self, request: &mut Request<B>) {
        let claim = request
            .extensions()
            .get::<IdempotencyContext>()
            .map(|ctx| (ctx.fence().get(), ctx.attempt()));
        let headers = request.headers_mut();
        if let (true, Some((fence, attempt))) = (self.enabled, claim) {
            // `insert` drops every value the client sent under the name.
            headers.insert(self.fence.clone(), HeaderValue::from(fence));
            headers.insert(self.attempt.clone(), HeaderValue::from(attempt));
        } else {
            headers.remove(&self.fence);
            headers.remove(&self.attempt);
        }
    }
}

/// Why `name` cannot carry a fence or an attempt number, if it cannot: a field of the message's
/// framing or of one connection (removed on the way, or rewritten by any proxy), or a header
/// the gateway sets itself on the way to the upstream.
#[must_use]
pub(crate) fn refused_name(name: &HeaderName) -> Option<&'static str> {
    if crate::config::lint::is_framing(name)
        || *name == header::PROXY_AUTHORIZATION
        || *name == header::PROXY_AUTHENTICATE
    {
        return Some(
            "it describes the message's framing or one connection, and proxies rewrite or drop it",
        );
    }
    if ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"].contains(&name.as_str()) {
        return Some("the gateway sets it itself on every request to the upstream");
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::{HeaderMap, Response};
    use http_body_util::{BodyExt, Full};
    use idem_core::{IdempotencyKey, RecordKey, Store};
    use idem_store_memory::MemoryStore;
    use tower_layer::Layer;
    use tower_service::Service;

    use super::*;

    /// An upstream behind the layer: it applies the fence headers as the proxy does and keeps
    /// the headers it got.
    #[derive(Clone)]
    struct Upstream {
        fence: FenceHeaders,
        seen: Arc<Mutex<Option<HeaderMap>>>,
    }

    impl Service<Request<Full<Bytes>>> for Upstream {
        type Response = Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, mut request: Request<Full<Bytes>>) -> Self::Future {
            self.fence.apply(&mut request);
            *self.seen.lock().unwrap() = Some(request.headers().clone());
            ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
        }
    }

    /// What the upstream got for a POST through the layer (a memory store, no scope) whose
    /// client sent its own fence (two lines) and attempt, with `key` when given; and the fence
    /// the store granted that key, if any.
    async fn through_the_layer(fence: FenceHeaders, key: Option<&str>) -> (HeaderMap, Option<u64>) {
        let store = Arc::new(MemoryStore::new());
        let config = idem_http::Config::builder().no_scope().build().unwrap();
        let seen = Arc::new(Mutex::new(None));
        let upstream = Upstream {
            fence,
            seen: seen.clone(),
        };
        let mut service =
            idem_http::IdempotencyLayer::from_arc(store.clone(), config).layer(upstream);
        let mut request = Request::post("/payments")
            .header("Idempotency-Fence", "18446744073709551615")
            .header("Idempotency-Fence", "1")
            .header("Idempotency-Attempt", "99")
            .header("X-Fence", "5");
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let request = request
            .body(Full::new(Bytes::from_static(b"10 EUR")))
            .unwrap();
        let response = service.call(request).await.unwrap();
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "ok"
        );
        let granted = match key {
            Some(key) => {
                let key = RecordKey::unscoped(IdempotencyKey::new(key).unwrap());
                store
                    .get(&key)
                    .await
                    .unwrap()
                    .map(|record| record.fence.get())
            }
            None => None,
        };
        let seen = seen.lock().unwrap().take().unwrap();
        (seen, granted)
    }

    fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_claimed_request_carries_its_fence_and_attempt_and_not_the_clients() {
        let (seen, granted) = through_the_layer(FenceHeaders::default(), Some("k1")).await;
        let granted = granted.expect("the key was claimed");
        assert_eq!(values(&seen, "idempotency-fence"), [granted.to_string()]);
        assert_eq!(values(&seen, "idempotency-attempt"), ["1"]);
        assert_eq!(values(&seen, "idempotency-key"), ["k1"]);
        assert_eq!(values(&seen, "x-fence"), ["5"], "other headers stay");
    }

    #[tokio::test]
    async fn a_request_without_a_claim_loses_the_clients_copies() {
        let (seen, _) = through_the_layer(FenceHeaders::default(), None).await;
        assert!(values(&seen, "idempotency-fence").is_empty());
        assert!(values(&seen, "idempotency-attempt").is_empty());
        assert_eq!(values(&seen, "x-fence"), ["5"], "other headers stay");
        // Without the layer at all (a route with `enabled = false`), the same.
        let mut plain = Request::post("/payments")
            .header("Idempotency-Attempt", "3")
            .body(())
            .unwrap();
        FenceHeaders::default().apply(&mut plain);
        assert!(plain.headers().is_empty());
    }

    #[tokio::test]
    async fn the_names_are_configurable() {
        let renamed = FenceHeaders {
            enabled: true,
            fence: HeaderName::from_static("x-fence"),
            attempt: HeaderName::from_static("x-attempt"),
        };
        let (seen, granted) = through_the_layer(renamed.clone(), Some("k1")).await;
        assert_eq!(values(&seen, "x-fence"), [granted.unwrap().to_string()]);
        assert_eq!(values(&seen, "x-attempt"), ["1"]);
        // The default names are not the gateway's any more: they pass as the client sent them.
        assert_eq!(values(&seen, "idempotency-attempt"), ["99"]);
        let (seen, _) = through_the_layer(renamed, None).await;
        assert!(
            values(&seen, "x-fence").is_empty(),
            "the client's x-fence goes"
        );
    }

    #[tokio::test]
    async fn off_adds_nothing_but_still_removes_the_clients_copies() {
        let off = FenceHeaders {
            enabled: false,
            ..FenceHeaders::default()
        };
        for key in [Some("k1"), None] {
            let (seen, _) = through_the_layer(off.clone(), key).await;
            assert!(values(&seen, "idempotency-fence").is_empty(), "{key:?}");
            assert!(values(&seen, "idempotency-attempt").is_empty(), "{key:?}");
        }
    }

    #[test]
    fn framing_hop_by_hop_and_forwarded_names_are_refused() {
        for name in [
            "content-length",
            "transfer-encoding",
            "connection",
            "te",
            "host",
            "proxy-authorization",
            "x-forwarded-for",
        ] {
            let name = HeaderName::from_static(name);
            assert!(refused_name(&name).is_some(), "{name}");
        }
        assert_eq!(refused_name(&HeaderName::from_static(FENCE_HEADER)), None);
    }
}
