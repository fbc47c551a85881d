//! [`Config`]: the validated settings of the layer, built with [`ConfigBuilder`].
//!
//! Every setting has a documented default:
//!
//! | setting | default |
//! |---|---|
//! | key header | `Idempotency-Key` |
//! | covered methods | POST and PATCH (others pass through untouched) |
//! | key | optional: a request without one passes through, nothing is stored |
//! | scope | a hash of the `Authorization` header when present, else none (see [`crate::scope`]) |
//! | lease | 30 s, extended by a heartbeat while the handler runs |
//! | heartbeat | every 10 s, or a third of the lease where that is shorter |
//! | retention | 24 h |
//! | request body limit | 1 MiB (413 above it) |
//! | request body timeout | 10 s to read the whole body (408 after it, nothing run) |
//! | response storage cap | 1 MiB, of the body as sent and of the record (compressed) |
//! | headers (and trailers) never stored | hop-by-hop, `Content-Length`, `Date`, `Set-Cookie`, `WWW-Authenticate`, `Proxy-Authenticate` |
//! | 5xx (and 600 to 999, which HTTP does not define) | released, not stored |
//! | store down | fail closed (503 + `Retry-After: 1`) |
//! | wait mode | off (409 while the original is in flight) |
//! | key syntax | lenient (a bare key is accepted) |
//! | rejections | RFC 9457 problem+json ([`ProblemJson`]) |
//! | keys in logs | as sent (not a digest) |
//! | `store` label of the store metrics | `store` |
//!
//! ```
//! use std::time::Duration;
//! use idem_http::Config;
//!
//! let config = Config::builder()
//!     .require_key()
//!     .scope_by_header("x-tenant")?
//!     .lease(Duration::from_secs(60))
//!     .heartbeat(Duration::from_secs(20))
//!     .build()?;
//! assert_eq!(config.lease(), Duration::from_secs(60));
//!
//! // A heartbeat that does not come before the lease ends is refused.
//! assert!(Config::builder().heartbeat(Duration::from_secs(30)).build().is_err());
//! # Ok::<(), idem_http::LayerConfigError>(())
//! ```

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method, StatusCode, header, request};
use idem_core::Scope;

use crate::fields::is_connection_or_framing;
use crate::rejection::{ProblemJson, RejectionHandler};
use crate::scope::{InvalidScope, ScopePart, ScopeSecret, ScopeSource};

/// 1 MiB.
const MIB: usize = 1024 * 1024;

/// Response headers not stored by default, which [`ConfigBuilder::allow_header`] may re-allow.
const DENIED_BY_DEFAULT: [HeaderName; 4] = [
    header::DATE,
    header::SET_COOKIE,
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
];

/// A setting was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerConfigError {
    /// Not a valid header name.
    InvalidHeaderName(String),
    /// A duration that must be positive is zero.
    ZeroDuration(&'static str),
    /// The heartbeat interval is not shorter than the lease: the lease would lapse between beats.
    HeartbeatNotBelowLease {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },
    /// No method is covered.
    NoMethods,
    /// The header can never be stored (hop-by-hop or `Content-Length`).
    NeverStored(String),
    /// Not a cookie name (an RFC 9110 token).
    InvalidCookieName(String),
    /// A combined scope of no source ([`ConfigBuilder::no_scope`] is the way to say none).
    EmptyScope,
    /// A scope secret shorter than [`ScopeSecret::MIN_LEN`](crate::scope::ScopeSecret::MIN_LEN)
    /// bytes.
    ShortScopeSecret,
}

impl fmt::Display for LayerConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerConfigError::InvalidHeaderName(name) => write!(f, "{name:?} is not a header name"),
            LayerConfigError::ZeroDuration(what) => write!(f, "{what} must be longer than zero"),
            LayerConfigError::HeartbeatNotBelowLease { heartbeat, lease } => write!(
                f,
                "the heartbeat interval ({heartbeat:?}) must be shorter than the lease ({lease:?})"
            ),
            LayerConfigError::NoMethods => f.write_str("at least one method must be covered"),
            LayerConfigError::NeverStored(name) => {
                write!(f, "{name} is a per-connection header and is never stored")
            }
            LayerConfigError::InvalidCookieName(name) => write!(f, "{name:?} is not a cookie name"),
            LayerConfigError::EmptyScope => {
                f.write_str("a combined scope needs at least one source (or no scope at all)")
            }
            LayerConfigError::ShortScopeSecret => write!(
                f,
                "a scope secret must be at least {} bytes",
                crate::scope::ScopeSecret::MIN_LEN
            ),
        }
    }
}

impl std::error::Error for LayerConfigError {}

/// What to do with a covered request that has no key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyPolicy {
    /// Pass it through untouched; nothing is stored. The default.
    #[default]
    Optional,
    /// Refuse it with 400.
    Required,
}

/// What to do when the store cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreFailure {
    /// Answer 503 with `Retry-After`; the handler does not run. The default.
    #[default]
    FailClosed,
    /// Run the handler without a record; the response carries `Idempotency-Status: unrecorded`
    /// and the outcome `store_error`. Without a claim there is no fence: the request carries
    /// no [`IdempotencyContext`](crate::IdempotencyContext), so a handler that extracts one
    /// takes `Option<IdempotencyContext>` (the plain extractor answers 500).
    FailOpen,
}

pub use crate::scope::ScopeFn;

/// The validated settings of the layer. Made by [`Config::builder`]; see the
/// [module docs](self) for the defaults.
#[derive(Clone)]
pub struct Config {
    pub(crate) header_name: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_policy: KeyPolicy,
    scope: ScopeSource,
    scope_secret: Option<ScopeSecret>,
    pub(crate) fingerprint_host: bool,
    pub(crate) unknown_hold: Option<Duration>,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) retention: Duration,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) storage_cap: usize,
    denied: Vec<HeaderName>,
    pub(crate) store_server_errors: bool,
    pub(crate) store_failure: StoreFailure,
    pub(crate) store_retry_after: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) strict: bool,
    pub(crate) store_label: &'static str,
    pub(crate) log_keys: bool,
    pub(crate) rejection: Arc<dyn RejectionHandler>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("header_name", &self.header_name)
            .field("methods", &self.methods)
            .field("key_policy", &self.key_policy)
            .field("scope", &self.scope)
            .field("scope_secret", &self.scope_secret)
            .field("fingerprint_host", &self.fingerprint_host)
            .field("unknown_hold", &self.unknown_hold)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .field("retention", &self.retention)
            .field("body_limit", &self.body_limit)
            .field("body_timeout", &self.body_timeout)
            .field("storage_cap", &self.storage_cap)
            .field("denied", &self.denied)
            .field("store_server_errors", &self.store_server_errors)
            .field("store_failure", &self.store_failure)
            .field("store_retry_after", &self.store_retry_after)
            .field("wait", &self.wait)
            .field("strict", &self.strict)
            .field("store_label", &self.store_label)
            .field("log_keys", &self.log_keys)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    /// The documented defaults (see the [module docs](self)).
    fn default() -> Self {
        Config {
            header_name: HeaderName::from_static("idempotency-key"),
            methods: vec![Method::POST, Method::PATCH],
            key_policy: KeyPolicy::Optional,
            scope: ScopeSource::Secret(header::AUTHORIZATION),
            scope_secret: None,
            fingerprint_host: true,
            unknown_hold: None,
            lease: Duration::from_secs(30),
            heartbeat: DEFAULT_HEARTBEAT,
            retention: Duration::from_secs(24 * 60 * 60),
            body_limit: MIB,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            storage_cap: MIB,
            denied: DENIED_BY_DEFAULT.to_vec(),
            store_server_errors: false,
            store_failure: StoreFailure::FailClosed,
            store_retry_after: Duration::from_secs(1),
            wait: None,
            strict: false,
            store_label: "store",
            log_keys: true,
            rejection: Arc::new(ProblemJson::default()),
        }
    }
}

impl Config {
    /// A builder starting from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Config::default(),
            heartbeat_set: false,
        }
    }

    /// The key header's name.
    #[must_use]
    pub fn header_name(&self) -> &HeaderName {
        &self.header_name
    }

    /// The lease of a claim.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The heartbeat interval.
    #[must_use]
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// How long a stored response is kept.
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The request body limit, in bytes.
    #[must_use]
    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// How long the layer waits for a request body, whole.
    #[must_use]
    pub fn body_timeout(&self) -> Duration {
        self.body_timeout
    }

    /// The response storage cap, in encoded bytes.
    #[must_use]
    pub fn storage_cap(&self) -> usize {
        self.storage_cap
    }

    /// Whether the layer handles requests with `method`.
    #[must_use]
    pub fn covers(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Whether `method` is not covered but a covered method spelled in another case (`post`
    /// where `POST` is covered): the layer refuses it ([`Rejection::MethodCase`]).
    ///
    /// [`Rejection::MethodCase`]: crate::Rejection::MethodCase
    #[must_use]
    pub fn covers_in_another_case(&self, method: &Method) -> bool {
        // The standard methods are all upper case: a method with no lower-case letter is
        // never another spelling of one.
        method.as_str().bytes().any(|b| b.is_ascii_lowercase())
            && self
                .methods
                .iter()
                .any(|covered| covered.as_str().eq_ignore_ascii_case(method.as_str()))
    }

    /// Whether a response with `status` is stored (else the claim is released so a retry runs).
    ///
    /// A status from 600 to 999 (which `http` represents but HTTP does not define) counts as a
    /// 5xx: RFC 9110 section 15 has a client treat a status outside 100..=599 as a server error,
    /// so storing it would replay an error the client retries.
    #[must_use]
    pub fn stores_status(&self, status: StatusCode) -> bool {
        match status.as_u16() {
            408 | 425 | 429 => false,
            500..=999 => self.store_server_errors,
            _ => !status.is_informational(),
        }
    }

    /// Whether a response header (or trailer) named `name` may be stored and replayed. Headers
    /// named in the response's `Connection` header are dropped as well, by the layer.
    /// Trailers go through the same lists as headers.
    #[must_use]
    pub fn stores_header(&self, name: &HeaderName) -> bool {
        !is_connection_or_framing(name) && !self.denied.contains(name)
    }

    /// The headers of `headers` to store, in order with repeats.
    pub(crate) fn storable_headers(
        &self,
        headers: &HeaderMap,
    ) -> Vec<(HeaderName, http::HeaderValue)> {
        let listed_in_connection = |name: &HeaderName| {
            headers.get_all(header::CONNECTION).iter().any(|value| {
                value.to_str().is_ok_and(|v| {
                    v.split(',')
                        .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
                })
            })
        };
        headers
            .iter()
            .filter(|(name, _)| self.stores_header(name) && !listed_in_connection(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }

    /// The scope of a request.
    pub(crate) fn scope_of(&self, parts: &request::Parts) -> Result<Scope, InvalidScope> {
        self.scope.scope_of(parts, self.scope_secret.as_ref())
    }
}

/// Builds a [`Config`]. Made by [`Config::builder`]; every method starts from the documented
/// default and [`ConfigBuilder::build`] checks the settings together.
#[derive(Clone, Debug)]
#[must_use]
pub struct ConfigBuilder {
    config: Config,
    /// Whether [`ConfigBuilder::heartbeat`] was called: an unset heartbeat follows a short
    /// lease.
    heartbeat_set: bool,
}

fn header_name(name: &str) -> Result<HeaderName, LayerConfigError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| LayerConfigError::InvalidHeaderName(name.to_owned()))
}

impl ConfigBuilder {
    /// The key header (default `Idempotency-Key`; matched case-insensitively).
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidHeaderName`].
    pub fn header_name(mut self, name: &str) -> Result<Self, LayerConfigError> {
        self.config.header_name = header_name(name)?;
        Ok(self)
    }

    /// The covered methods (default POST and PATCH). Others pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Refuse a covered request without a key with 400 (default: let it through).
    pub fn require_key(mut self) -> Self {
        self.config.key_policy = KeyPolicy::Required;
        self
    }

    /// Whether a key is required or optional.
    pub fn key_policy(mut self, policy: KeyPolicy) -> Self {
        self.config.key_policy = policy;
        self
    }

    /// Scope records by a hash of the `Authorization` header (the default): one credential can
    /// never see another's responses. A request without the header has no scope.
    pub fn scope_by_authorization(mut self) -> Self {
        self.config.scope = ScopeSource::Secret(header::AUTHORIZATION);
        self
    }

    /// Scope records by a tenant header's value (0 to 255 bytes of printable ASCII, else 400).
    /// A request without the header has no scope. A credential header (`Authorization`,
    /// `Proxy-Authorization`, `Cookie`) is hashed as [`scope_by_authorization`] does, so no
    /// credential is ever written to the store.
    ///
    /// [`scope_by_authorization`]: ConfigBuilder::scope_by_authorization
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidHeaderName`].
    pub fn scope_by_header(mut self, name: &str) -> Result<Self, LayerConfigError> {
        self.config.scope = ScopeSource::header(header_name(name)?);
        Ok(self)
    }

    /// Scope records by a hash of one named cookie's value (`session`): for an application
    /// that authenticates by a session cookie. A request without the cookie has no scope.
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidCookieName`].
    pub fn scope_by_cookie(self, name: &str) -> Result<Self, LayerConfigError> {
        self.scope_by_all([ScopePart::cookie(name)?])
    }

    /// Scope records by a hash of several sources together, in order: each header's value and
    /// each cookie's, and whether each is there at all (an absent source and an empty one are
    /// different scopes). A request that carries none of them has no scope. Nothing is stored
    /// as it was sent.
    ///
    /// ```
    /// use idem_http::{Config, scope::ScopePart};
    ///
    /// let config = Config::builder()
    ///     .scope_by_all([
    ///         ScopePart::authorization(),
    ///         ScopePart::cookie("session")?,
    ///         ScopePart::header("x-api-key")?,
    ///     ])?
    ///     .build()?;
    /// # let _ = config;
    /// # Ok::<(), idem_http::LayerConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`LayerConfigError::EmptyScope`] for no part; [`LayerConfigError::InvalidCookieName`].
    pub fn scope_by_all(
        mut self,
        parts: impl IntoIterator<Item = ScopePart>,
    ) -> Result<Self, LayerConfigError> {
        let parts: Vec<ScopePart> = parts.into_iter().collect();
        if parts.is_empty() {
            return Err(LayerConfigError::EmptyScope);
        }
        if let Some(ScopePart::Cookie(name)) = parts.iter().find(|part| !part.is_valid()) {
            return Err(LayerConfigError::InvalidCookieName(name.clone()));
        }
        self.config.scope = ScopeSource::Combined(parts);
        Ok(self)
    }

    /// Scope records by a closure over the request head; `None` refuses the request with 400.
    pub fn scope_with(
        mut self,
        derive: impl Fn(&request::Parts) -> Option<Scope> + Send + Sync + 'static,
    ) -> Self {
        self.config.scope = ScopeSource::Custom(Arc::new(derive));
        self
    }

    /// Keys the hash of a credential scope (HMAC-SHA256 under `secret`, at least 16 bytes)
    /// instead of a plain SHA-256 of the credential, which anyone who sees a scope (in a log, an
    /// admin page, the store) could check guessed credentials against offline. Every layer of
    /// one store must use the same secret; setting or changing it gives every credential a new
    /// scope, so records made before are not found by its retries.
    ///
    /// # Errors
    /// [`LayerConfigError::ShortScopeSecret`].
    pub fn scope_secret(mut self, secret: &[u8]) -> Result<Self, LayerConfigError> {
        self.config.scope_secret = Some(ScopeSecret::new(secret)?);
        Ok(self)
    }

    /// Whether the request's host (its `Host`, or the authority of an HTTP/2 request, in lower
    /// case) is part of its fingerprint (default: yes), so that a key used through one host
    /// and then another is a 422, never the first host's response: an upstream that serves
    /// tenants by host keeps their records apart.
    pub fn fingerprint_host(mut self, on: bool) -> Self {
        self.config.fingerprint_host = on;
        self
    }

    /// How long a key whose outcome is unknown stays held before a retry may run it again
    /// (default `None`: until the outcome is resolved, or the record's retention ends). The
    /// outcome is unknown when the handler's response says so ([`crate::OutcomeUnknown`] in its
    /// extensions: its own call to a provider timed out, say) or when the response body breaks
    /// off after the handler answered: the effect may have happened, so a retry meanwhile is
    /// answered [`crate::Rejection::OutcomeUnknown`] (409), never run. A short hold (the lease,
    /// say) is the "release" policy: the key is freed only after the grace, so a retry never
    /// runs beside an attempt that may still be going on.
    pub fn unknown_hold(mut self, hold: Option<Duration>) -> Self {
        self.config.unknown_hold = hold;
        self
    }

    /// No scope: every caller shares one namespace of keys.
    pub fn no_scope(mut self) -> Self {
        self.config.scope = ScopeSource::None;
        self
    }

    /// The lease of a claim (default 30 s): how long another request waits for a crashed
    /// holder before it may take the key over.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How often a running handler's lease is extended; shorter than the lease. Default: 10 s,
    /// or a third of the lease where that is shorter (a lease of 3 s beats every second).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.config.heartbeat = every;
        self.heartbeat_set = true;
        self
    }

    /// How long a stored response is kept (default 24 h). Keep it longer than the lease: a
    /// duplicate answered 409 is told to come back after up to a lease (`Retry-After`), and a
    /// retry that arrives after the retention finds no record and runs the request again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// The request body limit (default 1 MiB); a larger body is answered 413 before anything
    /// runs.
    pub fn body_limit(mut self, limit: NonZeroUsize) -> Self {
        self.config.body_limit = limit.get();
        self
    }

    /// How long the layer waits for the whole request body (default 10 s), counted from the
    /// moment it starts to read it. A body still incomplete then (a client that trickles it, one
    /// byte at a time) is answered 408 with nothing claimed and nothing run, and the connection
    /// is not held any longer. Keep it above the time the body limit takes on the slowest link
    /// the service must serve (1 MiB in 10 s is 100 KiB/s).
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.config.body_timeout = timeout;
        self
    }

    /// The largest response body stored, as sent, and the largest record, encoded and
    /// compressed (default 1 MiB). A response whose body is larger is streamed to the first
    /// caller at once (the layer captures no more than the cap of it) and stored as its status,
    /// headers and trailers: a retry gets those with `Idempotency-Replay: omitted` and an empty
    /// body.
    pub fn storage_cap(mut self, cap: NonZeroUsize) -> Self {
        self.config.storage_cap = cap.get();
        self
    }

    /// Never store the response header (or trailer) `name`, beside those never stored by
    /// default: the hop-by-hop ones, `Content-Length`, `Date`, `Set-Cookie`,
    /// `WWW-Authenticate` and `Proxy-Authenticate`.
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidHeaderName`].
    pub fn deny_header(mut self, name: &str) -> Result<Self, LayerConfigError> {
        let name = header_name(name)?;
        if !self.config.denied.contains(&name) {
            self.config.denied.push(name);
        }
        Ok(self)
    }

    /// Store the response header (or trailer) `name` after all (`Set-Cookie`, `Date`,
    /// `WWW-Authenticate` or `Proxy-Authenticate`, which are not stored by default, or one
    /// denied before).
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidHeaderName`]; [`LayerConfigError::NeverStored`] for a hop-by-hop header
    /// or `Content-Length`.
    pub fn allow_header(mut self, name: &str) -> Result<Self, LayerConfigError> {
        let name = header_name(name)?;
        if is_connection_or_framing(&name) {
            return Err(LayerConfigError::NeverStored(name.as_str().to_owned()));
        }
        self.config.denied.retain(|denied| *denied != name);
        Ok(self)
    }

    /// Store 5xx responses too, the way Stripe does (default: a 5xx releases the key so a
    /// retry runs again). A status from 600 to 999 counts as a 5xx.
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.config.store_server_errors = store;
        self
    }

    /// What to do when the store cannot be reached (default: fail closed).
    pub fn store_failure(mut self, mode: StoreFailure) -> Self {
        self.config.store_failure = mode;
        self
    }

    /// The `Retry-After` of a 503 when the store is down (default 1 s).
    pub fn store_retry_after(mut self, delay: Duration) -> Self {
        self.config.store_retry_after = delay;
        self
    }

    /// Bounded wait mode: a duplicate of an in-flight request waits up to `max` for the
    /// original and then gets its replay, instead of an immediate 409 (default: off).
    pub fn wait_for_in_flight(mut self, max: Duration) -> Self {
        self.config.wait = Some(max);
        self
    }

    /// Strict key syntax: only an RFC 8941 sf-string (`"abc"`) is accepted, not a bare key
    /// (default: lenient).
    pub fn strict(mut self, strict: bool) -> Self {
        self.config.strict = strict;
        self
    }

    /// The `store` label of the store metrics (default `store`).
    pub fn store_label(mut self, label: &'static str) -> Self {
        self.config.store_label = label;
        self
    }

    /// Whether logs carry the key as sent (default) or only a digest of scope and key. Off, a
    /// store error that names its record (a corrupt one) is logged without the key too.
    pub fn log_keys(mut self, log: bool) -> Self {
        self.config.log_keys = log;
        self
    }

    /// The rejection responses (default: [`ProblemJson`]).
    pub fn rejection_handler(mut self, handler: impl RejectionHandler) -> Self {
        self.config.rejection = Arc::new(handler);
        self
    }

    /// Checks the settings together.
    ///
    /// # Errors
    /// [`LayerConfigError`] naming the setting refused.
    pub fn build(self) -> Result<Config, LayerConfigError> {
        let mut config = self.config;
        if !self.heartbeat_set {
            config.heartbeat = default_heartbeat(config.lease);
        }
        for (value, what) in [
            (config.lease, "the lease"),
            (config.heartbeat, "the heartbeat interval"),
            (config.retention, "the retention"),
            (config.body_timeout, "the body timeout"),
        ] {
            if value.is_zero() {
                return Err(LayerConfigError::ZeroDuration(what));
            }
        }
        if config.wait.is_some_and(|wait| wait.is_zero()) {
            return Err(LayerConfigError::ZeroDuration("the wait"));
        }
        if config.heartbeat >= config.lease {
            return Err(LayerConfigError::HeartbeatNotBelowLease {
                heartbeat: config.heartbeat,
                lease: config.lease,
            });
        }
        if config.methods.is_empty() {
            return Err(LayerConfigError::NoMethods);
        }
        Ok(config)
    }
}

/// The heartbeat of a lease when none is set: every 10 s, or a third of the lease where that is
/// shorter, so the lease is extended at least twice before it would lapse.
fn default_heartbeat(lease: Duration) -> Duration {
    DEFAULT_HEARTBEAT.min(lease / 3)
}

/// How long the layer waits for a request body by default.
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The heartbeat of the default lease.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::builder().build().unwrap();
        assert_eq!(config.header_name(), "idempotency-key");
        assert!(config.covers(&Method::POST) && config.covers(&Method::PATCH));
        assert!(!config.covers(&Method::GET) && !config.covers(&Method::PUT));
        assert_eq!(config.lease(), Duration::from_secs(30));
        assert_eq!(config.heartbeat(), Duration::from_secs(10));
        assert_eq!(config.retention(), Duration::from_secs(86_400));
        // An unset heartbeat follows a short lease; a longer lease keeps 10 s.
        let short = Config::builder()
            .lease(Duration::from_secs(3))
            .build()
            .unwrap();
        assert_eq!(short.heartbeat(), Duration::from_secs(1));
        let long = Config::builder()
            .lease(Duration::from_secs(120))
            .build()
            .unwrap();
        assert_eq!(long.heartbeat(), Duration::from_secs(10));
        // One set is kept, and checked against the lease.
        let set = Config::builder()
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_secs(2))
            .build()
            .unwrap();
        assert_eq!(set.heartbeat(), Duration::from_secs(2));
        assert!(
            Config::builder()
                .lease(Duration::from_secs(3))
                .heartbeat(Duration::from_secs(3))
                .build()
                .is_err()
        );
        assert_eq!(config.body_limit(), MIB);
        assert_eq!(config.body_timeout(), Duration::from_secs(10));
        assert_eq!(config.storage_cap(), MIB);
        assert_eq!(config.key_policy, KeyPolicy::Optional);
        assert_eq!(config.store_failure, StoreFailure::FailClosed);
        assert!(config.wait.is_none() && !config.strict && !config.store_server_errors);
    }

    #[test]
    fn statuses_stored_and_released() {
        let config = Config::default();
        for stored in [200, 201, 204, 301, 400, 404, 409, 422] {
            assert!(
                config.stores_status(StatusCode::from_u16(stored).unwrap()),
                "{stored}"
            );
        }
        for released in [408, 425, 429, 500, 502, 503, 599, 600, 999] {
            assert!(
                !config.stores_status(StatusCode::from_u16(released).unwrap()),
                "{released}"
            );
        }
        let stripe = Config::builder().store_server_errors(true).build().unwrap();
        assert!(stripe.stores_status(StatusCode::BAD_GATEWAY));
        assert!(!stripe.stores_status(StatusCode::TOO_MANY_REQUESTS));
        assert!(stripe.stores_status(StatusCode::from_u16(600).unwrap()));
    }

    #[test]
    fn header_lists() {
        let config = Config::default();
        for never in [
            "connection",
            "transfer-encoding",
            "date",
            "set-cookie",
            "www-authenticate",
        ] {
            assert!(
                !config.stores_header(&HeaderName::from_static(never)),
                "{never}"
            );
        }
        assert!(config.stores_header(&header::ETAG));
        let config = Config::builder()
            .allow_header("Set-Cookie")
            .unwrap()
            .deny_header("x-request-id")
            .unwrap()
            .build()
            .unwrap();
        assert!(config.stores_header(&header::SET_COOKIE));
        assert!(!config.stores_header(&HeaderName::from_static("x-request-id")));
        assert_eq!(
            Config::builder().allow_header("connection").unwrap_err(),
            LayerConfigError::NeverStored("connection".into())
        );
    }

    #[test]
    fn invalid_settings_are_refused() {
        assert!(Config::builder().header_name("bad name").is_err());
        assert_eq!(
            Config::builder().lease(Duration::ZERO).build().unwrap_err(),
            LayerConfigError::ZeroDuration("the lease")
        );
        assert_eq!(
            Config::builder().methods([]).build().unwrap_err(),
            LayerConfigError::NoMethods
        );
    }
}
