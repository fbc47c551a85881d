//! [`IdempotencyContext`]: what a handler learns about the claim it runs under.

use idem_core::{Fence, IdempotencyKey, Scope};

/// The key and the claim a handler runs under, put in the request extensions by the layer
/// (and extracted by axum handlers with the `axum` feature). Pass the key to a downstream
/// service that takes idempotency keys, and the fence to a store that refuses stale writes.
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

    /// The route is not behind the layer, or its request had no key (an optional key): use
    /// `Option<IdempotencyContext>` where the key is optional. Answers 500.
    #[derive(Clone, Copy, Debug)]
    pub struct MissingContext;

    impl IntoResponse for MissingContext {
        fn into_response(self) -> Response {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the idempotency context is missing: is the route behind IdempotencyLayer?",
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
