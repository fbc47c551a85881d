//! [`IdempotencyContext`]: what a handler learns about the claim it runs under.

use idem_core::{Fence, IdempotencyKey, Scope};

/// The key and the claim a handler runs under, put in the request extensions by the layer
/// (and extracted by axum handlers with the `axum` feature). Pass the key to a downstream
/// service that takes idempotency keys, and the fence to a store that refuses stale writes.
///
/// Only a request the layer holds a claim for has one: not a request without a key (an
/// optional key), and not one the layer runs unrecorded because the store could not be reached
/// ([`StoreFailure::FailOpen`](crate::StoreFailure::FailOpen): no claim, so no fence). A
/// handler that must run in those cases takes `Option<IdempotencyContext>`.
///
/// ```
/// use idem_http::IdempotencyContext;
///
/// fn charge(request: &http::Request<()>) -> Option<String> {
///     let ctx = request.extensions().get::<IdempotencyContext>()?;
///     Some(format!("psp-key={} fence={}", ctx.key(), ctx.fence()))
/// }
/// assert_eq!(charge(&http::Request::new(())), None); // not behind the layer
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyContext {
    pub(crate) key: IdempotencyKey,
    pub(crate) scope: Scope,
    pub(crate) fence: Fence,
    pub(crate) attempt: u32,
}

impl IdempotencyContext {
    /// The key of the request.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The scope the key lives in.
    #[must_use]
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The fence of this attempt: strictly greater than any earlier attempt's.
    #[must_use]
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The attempt number (1 for the first; a takeover of a crashed attempt adds one).
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use super::IdempotencyContext;

    /// The handler asked for an [`IdempotencyContext`] the request does not carry: the route
    /// is not behind the layer, its request had no key (an optional key), or the store could
    /// not be reached and the layer runs the handler unrecorded (fail open). Use
    /// `Option<IdempotencyContext>` where the handler must run without one. Answers 500 with
    /// an RFC 9457 `application/problem+json` body.
    #[derive(Clone, Copy, Debug)]
    pub struct MissingContext;

    /// The RFC 9457 body of [`MissingContext`], like the layer's own rejections.
    const MISSING_CONTEXT: &str = concat!(
        r#"{"type":"https://docs.rs/idem-http/latest/idem_http/struct.MissingContext.html","#,
        r#""title":"Idempotency context missing","status":500,"#,
        r#""detail":"the handler asked for the idempotency context, but the route is not behind IdempotencyLayer, its request had no key, or the idempotency store could not be reached and the request runs unrecorded (fail open): use Option<IdempotencyContext> where the handler must run without one"}"#
    );

    impl IntoResponse for MissingContext {
        fn into_response(self) -> Response {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/problem+json"),
                )],
                MISSING_CONTEXT,
            )
                .into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for IdempotencyContext {
        type Rejection = MissingContext;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<IdempotencyContext>()
                .cloned()
                .ok_or(MissingContext)
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyContext {
        type Rejection = std::convert::Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<IdempotencyContext>().cloned())
        }
    }
}

#[cfg(feature = "axum")]
pub use extract::MissingContext;
