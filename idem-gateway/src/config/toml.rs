//! The configuration file as written: serde types with `deny_unknown_fields`. Every field is
//! optional here; [`super::internal`] applies the defaults and checks the settings together.
//!
//! `idem.example.toml` at the root of this crate documents every key with its default.

use idem::StoreSpec;
use serde::Deserialize;
use toml::Spanned;

use super::value::{
    ByteSize, HumanDuration, ListenAddr, MethodName, PathPattern, ScopeSpec, UpstreamUrl,
};

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct FileConfig {
    /// `[server]`: the public listener.
    pub server: ServerSection,
    /// `[upstream]`: the service behind the gateway.
    pub upstream: UpstreamSection,
    /// `[store]`: where records are kept.
    pub store: StoreSection,
    /// `[admin]`: the admin listener.
    pub admin: AdminSection,
    /// `[log]`: logs.
    pub log: LogSection,
    /// `[idempotency]`: the settings of every route, unless a route sets its own.
    pub idempotency: Option<Spanned<RouteSection>>,
    /// `[[route]]`: routes, matched in order; the first that covers the path wins.
    #[serde(rename = "route")]
    pub routes: Vec<Spanned<RouteSection>>,
}

/// `[server]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerSection {
    /// The public address.
    pub listen: Option<Spanned<ListenAddr>>,
    /// The largest request head (request line and headers); larger -> 431.
    pub max_header_bytes: Option<Spanned<ByteSize>>,
    /// The most header lines in a request; more -> 431.
    pub max_headers: Option<Spanned<usize>>,
    /// How long in-flight requests may run on after SIGTERM or SIGINT.
    pub shutdown_grace: Option<HumanDuration>,
    /// Serving threads (default: one per core).
    pub workers: Option<Spanned<usize>>,
    /// The most client connections open at once.
    pub max_connections: Option<Spanned<usize>>,
    /// The limit from accept to a complete request head, and for each later head.
    pub header_timeout: Option<Spanned<HumanDuration>>,
    /// Whether header names with an underscore are forwarded (default: dropped).
    pub underscores_in_headers: Option<bool>,
    /// Whether paths that servers resolve differently are forwarded (default: 400).
    pub allow_ambiguous_paths: Option<bool>,
}

/// `[upstream]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpstreamSection {
    /// `http://HOST[:PORT]` or `https://HOST[:PORT]`.
    pub url: Option<UpstreamUrl>,
    /// The PEM file of the CA an `https` upstream's certificate is verified against, instead
    /// of the system's roots.
    pub ca_file: Option<Spanned<String>>,
    /// The limit to open a connection (504 after it, the key released).
    pub connect_timeout: Option<Spanned<HumanDuration>>,
    /// The limit for the upstream's response head (504 after it).
    pub timeout: Option<Spanned<HumanDuration>>,
    /// The longest pause within the upstream's response body.
    pub body_idle_timeout: Option<Spanned<HumanDuration>>,
    /// How long an idle pooled connection is kept.
    pub pool_idle_timeout: Option<HumanDuration>,
    /// The most idle pooled connections kept.
    pub pool_max_idle: Option<usize>,
    /// Whether a request that holds a claim gets the fence and attempt headers.
    pub fence_headers: Option<bool>,
    /// The header of the attempt's fence.
    pub fence_header: Option<Spanned<String>>,
    /// The header of the attempt number.
    pub attempt_header: Option<Spanned<String>>,
}

/// `[store]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoreSection {
    /// `memory`, `redis://...`, `postgres://...` or `redb:PATH`.
    pub url: Option<Spanned<StoreSpec>>,
    /// A prefix that separates this gateway's records from others' in a shared store.
    pub namespace: Option<Spanned<String>>,
    /// The memory store's most records.
    pub memory_capacity: Option<Spanned<usize>>,
    /// The most bytes the memory store's records hold.
    pub memory_max_bytes: Option<Spanned<ByteSize>>,
    /// A file whose content keys the hash of credential scopes (else `IDEM_SCOPE_SECRET`).
    pub scope_secret_file: Option<Spanned<String>>,
}

/// `[admin]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdminSection {
    /// Whether the admin listener runs.
    pub enabled: Option<bool>,
    /// Its address.
    pub listen: Option<Spanned<ListenAddr>>,
    /// A bearer token every admin request must carry.
    pub token: Option<Spanned<String>>,
}

/// `[log]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogSection {
    /// `text` or `json`.
    pub format: Option<LogFormat>,
    /// A tracing filter (`info`, `idem=debug,info`); `RUST_LOG` wins over it.
    pub level: Option<Spanned<String>>,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether a covered request must carry a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyMode {
    /// Without a key the request passes through; nothing is stored.
    #[default]
    Optional,
    /// Without a key the request is refused with 400.
    Required,
}

/// What the gateway does with a key whose outcome is unknown: the upstream had the request and
/// its answer was lost (a timeout after the request was sent, a connection that broke before
/// the head, a body broken off after it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    /// Hold the key (for `unknown_hold`, or until it is resolved): a retry is answered 409
    /// `outcome-unknown`, never run.
    #[default]
    Hold,
    /// Free the key once `release_grace` has passed after the exchange was given up: a retry
    /// after that runs again.
    Release,
}

/// What to do when the store cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// 503 with `Retry-After`; the upstream is not called.
    #[default]
    FailClosed,
    /// Call the upstream without a record; the response is marked unrecorded.
    FailOpen,
}

/// `[idempotency]` and each `[[route]]`: the idempotency settings of a path. `name` and `path`
/// are for routes only. The settings that are checked beyond their syntax keep their position
/// in the file, so an error names the line of the value.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteSection {
    /// A name for logs and metrics (default: the path).
    pub name: Option<String>,
    /// The path prefix or glob the route covers (routes only; required there).
    pub path: Option<PathPattern>,
    /// Match the path without regard to ASCII case, for an upstream that folds case (routes
    /// only; default `false`).
    pub case_insensitive: Option<bool>,
    /// `false` proxies the route untouched.
    pub enabled: Option<bool>,
    /// The key header's name.
    pub header: Option<Spanned<String>>,
    /// The methods the layer covers; others pass through.
    pub methods: Option<Spanned<Vec<MethodName>>>,
    /// `optional` or `required`.
    pub key: Option<KeyMode>,
    /// `authorization`, `none`, `header:NAME`, `cookie:NAME`, or a list of sources hashed
    /// together (`["authorization", "cookie:session"]`).
    pub scope: Option<ScopeSpec>,
    /// How long a claim holds before another request may take it over.
    pub lease: Option<Spanned<HumanDuration>>,
    /// How often a running request's lease is extended.
    pub heartbeat: Option<Spanned<HumanDuration>>,
    /// How long a stored response is kept.
    pub retention: Option<Spanned<HumanDuration>>,
    /// Wait up to this long for an in-flight original instead of answering 409 (`0s`: off).
    pub wait: Option<HumanDuration>,
    /// The largest request body on covered requests; larger -> 413.
    pub request_body_limit: Option<Spanned<ByteSize>>,
    /// How long a covered request's whole body may take to arrive; longer -> 408.
    pub request_body_timeout: Option<Spanned<HumanDuration>>,
    /// The largest response body stored (as sent; its record, compressed, must fit too).
    pub storage_cap: Option<Spanned<ByteSize>>,
    /// Store 5xx responses too (Stripe's way).
    pub store_server_errors: Option<bool>,
    /// `fail_closed` or `fail_open`.
    pub on_store_error: Option<OnStoreError>,
    /// Accept only RFC 8941 sf-string keys (`"abc"`), not bare ones.
    pub strict_keys: Option<bool>,
    /// Response headers stored after all (`set-cookie`, `date`, ...).
    pub allow_headers: Option<Spanned<Vec<String>>>,
    /// Response headers never stored.
    pub deny_headers: Option<Spanned<Vec<String>>>,
    /// Whether logs carry keys as sent (`true`) or only their digest.
    pub log_keys: Option<bool>,
    /// Whether the request's host is part of its fingerprint.
    pub fingerprint_host: Option<bool>,
    /// `hold` or `release`: what a key whose outcome is unknown gets.
    pub on_unknown: Option<OnUnknown>,
    /// How long `hold` holds an unknown key before it is freed (`0s` or absent: until it is
    /// resolved, or its retention ends).
    pub unknown_hold: Option<HumanDuration>,
    /// How long after a lost exchange `release` frees its key (default: the lease).
    pub release_grace: Option<Spanned<HumanDuration>>,
    /// A path template on the upstream (`/payments/by-key/{key}`) the gateway asks with `GET`
    /// to learn an unknown outcome: 2xx settles the key with that answer, 404 frees it.
    pub reconcile: Option<Spanned<String>>,
}
