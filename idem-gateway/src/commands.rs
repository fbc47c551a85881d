//! The subcommands of `idem`. Each returns `Ok` or a [`Failure`] that carries its exit code:
//! 2 for a configuration or usage error, 1 for anything that went wrong while running.

use std::fmt;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use idem_core::{RecordKey, ScanQuery, Store, StoreError};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::admin::client::AdminClient;
use crate::admin::{Admin, RenderMetrics};
use crate::cli::{Cli, Command, KeysCommand, StoreCommand};
use crate::config::toml::OnStoreError;
use crate::config::{self, Config, GatewayConfigError, StoreSpec};
use crate::gateway::{Gateway, check_routes};
use crate::in_flight::{InFlightIndex, Watched};
use crate::proxy::Tracker;
use crate::records::{
    ArgNames, page_json, record_json, record_key, record_line, record_text, scan_query,
};
use crate::resolve::ResolveRequest;
use crate::server::{Drained, Worker, run_on, serve_workers};
use crate::unknowns::UnknownBook;

/// Why a command failed, and the exit code that says so.
#[derive(Debug)]
pub enum Failure {
    /// The configuration or the command line is wrong: exit 2.
    Config(GatewayConfigError),
    /// The command ran and failed (a store error, a port in use): exit 1.
    Runtime(String),
}

impl Failure {
    /// The process exit code: 2 for a configuration error, 1 otherwise.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) => 2,
            Failure::Runtime(_) => 1,
        }
    }

    /// A runtime failure, said in one line (an error of a store's client may span several).
    pub fn runtime(message: impl fmt::Display) -> Self {
        let message = message.to_string();
        Failure::Runtime(
            message
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Config(err) => err.fmt(f),
            Failure::Runtime(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Failure {}

impl From<GatewayConfigError> for Failure {
    fn from(err: GatewayConfigError) -> Self {
        Failure::Config(err)
    }
}

/// Runs the command the command line names. `install_metrics` installs the binary's metrics
/// recorder and returns what renders it (served on the admin listener's `/metrics`); it is
/// called only by the commands that serve, and only when the admin listener runs: without a
/// place to read them, metrics are not recorded at all.
///
/// # Errors
/// [`Failure`], with the exit code to end with.
pub(crate) fn run(
    cli: Cli,
    install_metrics: &dyn Fn() -> Option<RenderMetrics>,
) -> Result<(), Failure> {
    let metrics_for = |config: &Config| config.admin.as_ref().and_then(|_| install_metrics());
    let overrides = cli.overrides.to_overrides();
    match cli.command {
        Command::CheckConfig { path, json } => {
            let path = path.or(cli.config);
            let config = config::load(path.as_deref(), &overrides);
            check_config(config, json)
        }
        Command::Serve => {
            let config = config::load(cli.config.as_deref(), &overrides)?;
            config.require_upstream()?;
            check_routes(&config)?;
            let metrics = metrics_for(&config);
            runtime()?.block_on(serve(config, metrics))
        }
        Command::Demo => {
            crate::demo::check_flags(cli.config.as_deref(), &overrides)?;
            let metrics = if overrides.no_admin {
                None
            } else {
                install_metrics()
            };
            runtime()?.block_on(crate::demo::run(&overrides, metrics))
        }
        Command::Keys { admin, command } => {
            let config = config::load(cli.config.as_deref(), &overrides)?;
            runtime()?.block_on(keys(&config, admin.as_deref(), command))
        }
        Command::Store { command } => {
            let config = config::load(cli.config.as_deref(), &overrides)?;
            runtime()?.block_on(store_command(&config, command))
        }
    }
}

/// Runs the `idem` command line of this process's arguments: parses them and runs the
/// subcommand (clap prints the help, the version or a usage error itself, and exits).
/// `install_metrics` installs a recorder and returns what renders it for `/metrics`; it is
/// called only by the commands that serve, and only when the admin listener runs.
///
/// # Errors
/// [`Failure`], with the exit code to end with.
pub fn run_command_line(
    install_metrics: &dyn Fn() -> Option<RenderMetrics>,
) -> Result<(), Failure> {
    run(<Cli as clap::Parser>::parse(), install_metrics)
}

/// The multi-threaded runtime every networked command runs on.
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| Failure::runtime(format!("cannot start the runtime: {err}")))
}

/// Binds a listener, or says which address is taken.
pub(crate) async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, Failure> {
    TcpListener::bind(addr)
        .await
        .map_err(|err| Failure::runtime(format!("cannot listen on {addr} ({what}): {err}")))
}

/// A running gateway: its addresses and the handles to stop it.
#[derive(Debug)]
pub struct Running {
    /// The public address.
    pub listen: SocketAddr,
    /// The admin address, when the admin listener runs.
    pub admin: Option<SocketAddr>,
    task: tokio::task::JoinHandle<Drained>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Running {
    /// Stops accepting, drains (as on SIGTERM) and reports how the drain went.
    ///
    /// # Errors
    /// [`Failure::Runtime`] if the serving task failed.
    pub async fn stop(self) -> Result<Drained, Failure> {
        self.stop.send_replace(true);
        self.task
            .await
            .map_err(|err| Failure::runtime(format!("the gateway task failed: {err}")))
    }

    /// Waits until the gateway stops by itself (it never does before `shutdown` resolves).
    ///
    /// # Errors
    /// [`Failure::Runtime`] if the serving task failed.
    pub async fn wait(self) -> Result<Drained, Failure> {
        let Running { task, stop, .. } = self;
        let drained = task
            .await
            .map_err(|err| Failure::runtime(format!("the gateway task failed: {err}")));
        drop(stop);
        drained
    }
}

/// Starts a gateway for `config`: opens the store, binds both listeners, and serves until
/// `shutdown` resolves or [`Running::stop`] is called.
///
/// # Errors
/// [`Failure`]: the configuration is incomplete, the store cannot be opened, or an address is
/// taken.
pub async fn start(
    config: &Config,
    metrics: Option<RenderMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, Failure> {
    let store = crate::store::open_to_serve(&config.store, true).await?;
    // A Redis connection is driven by a task of the runtime that made it: each serving thread
    // gets its own, so that a store call does not wake another thread and wait for it (on
    // the memory, redb and PostgreSQL stores the serving threads share the one store).
    let own_stores = matches!(config.store.spec, StoreSpec::Redis(_));
    serve_gateway(config, store, own_stores, metrics, shutdown).await
}

/// [`start`] over a store the caller opened (tests inspect it; an embedder shares it).
///
/// # Errors
/// [`Failure`]: the configuration is incomplete, or an address is taken.
pub async fn start_with_store(
    config: &Config,
    store: Arc<dyn Store>,
    metrics: Option<RenderMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, Failure> {
    serve_gateway(config, store, false, metrics, shutdown).await
}

/// [`start`] and [`start_with_store`]: `store` serves the admin listener, and the serving
/// threads too unless `own_stores`, where each opens its own connection to the configured
/// store.
async fn serve_gateway(
    config: &Config,
    store: Arc<dyn Store>,
    own_stores: bool,
    metrics: Option<RenderMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, Failure> {
    crate::telemetry::register_metrics(config.store.spec.kind());
    crate::server::raise_open_files(config.server.max_connections);
    // The claims made through this gateway, kept as they happen: what `/metrics` reports
    // without scanning the store.
    let in_flight = Arc::new(InFlightIndex::new());
    let store: Arc<dyn Store> = Arc::new(Watched::new(store, in_flight.clone()));
    let tracker = Tracker::new();
    let addr = config.server.listen;
    let listeners = crate::server::bind_workers(addr, config.server.workers)
        .map_err(|err| Failure::runtime(format!("cannot listen on {addr} (the gateway): {err}")))?;
    let listen = listeners[0]
        .local_addr()
        .map_err(|err| Failure::runtime(format!("cannot read the bound address: {err}")))?;
    // The admin listener is bound before the serving threads' runtimes are made: a runtime
    // dropped inside this one (an error returned past it) would panic.
    let admin_listener = match &config.admin {
        Some(settings) => {
            let listener = bind(settings.listen, "the admin listener").await?;
            let addr = listener
                .local_addr()
                .map_err(|err| Failure::runtime(format!("cannot read the bound address: {err}")))?;
            Some((settings, listener, addr))
        }
        None => None,
    };
    let routes = config.routes.iter().filter(|route| route.settings.enabled);
    let unknowns = Arc::new(UnknownBook::new(routes.map(|route| route.name.as_str())));
    let workers = workers(
        config, &store, own_stores, &in_flight, &tracker, &unknowns, listeners,
    )?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // The admin listener outlives the drain (it answers `/readyz` 503 meanwhile): it stops on
    // a channel of its own, once the serving threads are done.
    let (admin_stop, admin_stopped) = tokio::sync::watch::channel(false);
    let (admin, draining) = match admin_listener {
        Some((settings, admin_listener, addr)) => {
            let retention = config
                .routes
                .iter()
                .map(|route| route.settings.retention)
                .max();
            let admin = Admin::new(store.clone(), settings.token.clone(), metrics)
                .with_in_flight(in_flight)
                .with_unknowns(unknowns)
                .with_retention(retention.unwrap_or(crate::config::internal::defaults::RETENTION));
            let draining = admin.clone();
            let mut admin_stopped = admin_stopped;
            tokio::spawn(admin.serve(admin_listener, async move {
                let _ = admin_stopped.wait_for(|stop| *stop).await;
            }));
            (Some(addr), Some(draining))
        }
        None => (None, None),
    };
    let server = config.server.clone();
    let mut stopped_by_call = stopped;
    // Held by the task, so that dropping the [`Running`] handle does not stop the gateway.
    let stop_for_task = stop.clone();
    let task = tokio::spawn(async move {
        let stop_signal = async move {
            tokio::select! {
                () = shutdown => {}
                _ = stopped_by_call.wait_for(|stop| *stop) => {}
            }
            // Not ready from here on: the listeners close, the in-flight requests finish.
            if let Some(admin) = &draining {
                admin.start_draining();
            }
        };
        let drained = serve_workers(workers, &server, tracker, stop_signal).await;
        admin_stop.send_replace(true);
        drop(stop_for_task);
        drained
    });
    Ok(Running {
        listen,
        admin,
        task,
        stop,
    })
}

/// One [`Worker`] per listener, each with its own runtime and [`Gateway`] (and its own store
/// connection when `own_stores`, which keeps its claims in `in_flight` too). On a failure the runtimes made so far are shut down without
/// blocking, so this may be called from inside a runtime (dropping one there would panic).
fn workers(
    config: &Config,
    store: &Arc<dyn Store>,
    own_stores: bool,
    in_flight: &Arc<InFlightIndex>,
    tracker: &Tracker,
    unknowns: &Arc<UnknownBook>,
    listeners: Vec<std::net::TcpListener>,
) -> Result<Vec<Worker>, Failure> {
    let mut workers = Vec::with_capacity(listeners.len());
    for listener in listeners {
        let runtime = match Worker::runtime() {
            Ok(runtime) => runtime,
            Err(err) => {
                workers.into_iter().for_each(Worker::discard);
                return Err(Failure::runtime(format!(
                    "cannot start a serving thread's runtime: {err}"
                )));
            }
        };
        let worker_store = if own_stores {
            run_on(&runtime, crate::store::open_to_serve(&config.store, false))
                .map_err(Failure::runtime)
                .and_then(|opened| opened)
                .map(|store| -> Arc<dyn Store> { Arc::new(Watched::new(store, in_flight.clone())) })
        } else {
            Ok(store.clone())
        };
        let gateway = worker_store.and_then(|store| {
            Gateway::new(config, store, tracker.clone(), unknowns.clone()).map_err(Failure::from)
        });
        match gateway {
            Ok(gateway) => workers.push(Worker::new(runtime, listener, gateway)),
            Err(failure) => {
                runtime.shutdown_background();
                workers.into_iter().for_each(Worker::discard);
                return Err(failure);
            }
        }
    }
    Ok(workers)
}

/// `idem serve`.
async fn serve(config: Config, metrics: Option<RenderMetrics>) -> Result<(), Failure> {
    crate::telemetry::init_logs(&config.log);
    for warning in &config.warnings {
        tracing::warn!(%warning, "a setting that is most likely a mistake");
    }
    let running = start(&config, metrics, crate::server::shutdown_signal()).await?;
    let upstream = config.require_upstream()?;
    say(&format!("listening on {}", running.listen));
    if let Some(admin) = running.admin {
        say(&format!("admin on {admin}"));
    }
    tracing::info!(
        listen = %running.listen,
        admin = %running.admin.map_or_else(|| "off".to_owned(), |admin| admin.to_string()),
        upstream = %upstream.url,
        store = %config.store.spec,
        routes = config.routes.len(),
        "idem gateway started"
    );
    let drained = running.wait().await?;
    if drained.abandoned > 0 {
        return Err(Failure::runtime(format!(
            "stopped with {} request(s) still in flight after the grace period",
            drained.abandoned
        )));
    }
    Ok(())
}

/// The store of an admin command: a shared one (the memory store of a running gateway lives in
/// that process, out of reach but through its admin listener).
async fn admin_store(config: &Config) -> Result<Arc<dyn Store>, Failure> {
    if config.store.spec == StoreSpec::Memory {
        return Err(Failure::Config(GatewayConfigError::new(
            None,
            "the memory store lives inside each `idem serve` process and cannot be opened from another: pass --admin http://ADMIN_ADDR to ask the running gateway's admin listener, or point --store (or [store] url) at the gateway's shared store (redis, postgres or redb)",
        )));
    }
    crate::store::open_existing(&config.store).await
}

fn store_failure(err: StoreError) -> Failure {
    Failure::runtime(format!("store: {err}"))
}

/// Where `idem keys` reads and deletes records: the store itself, or a running gateway's admin
/// listener. Both give records as [`record_json`] renders them, so the output is the same.
enum KeySource {
    Store(Arc<dyn Store>),
    Admin(Box<AdminClient>),
}

impl KeySource {
    async fn open(config: &Config, admin: Option<&str>) -> Result<Self, Failure> {
        match admin {
            Some(url) => {
                let token = config.admin.as_ref().and_then(|a| a.token.clone());
                Ok(KeySource::Admin(Box::new(AdminClient::new(url, token)?)))
            }
            None => Ok(KeySource::Store(admin_store(config).await?)),
        }
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Value>, Failure> {
        match self {
            KeySource::Store(store) => Ok(store
                .get(key)
                .await
                .map_err(store_failure)?
                .as_ref()
                .map(record_json)),
            KeySource::Admin(client) => client.get(key).await,
        }
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, Failure> {
        match self {
            KeySource::Store(store) => store.delete(key).await.map_err(store_failure),
            KeySource::Admin(client) => client.delete(key).await,
        }
    }

    async fn resolve(
        &self,
        config: &Config,
        key: &RecordKey,
        request: ResolveRequest,
    ) -> Result<Value, Failure> {
        match self {
            KeySource::Store(store) => {
                let (resolution, fence) = request.parse().map_err(usage)?;
                let retention = config.routes.iter().map(|r| r.settings.retention).max();
                let retention = retention.unwrap_or(crate::config::internal::defaults::RETENTION);
                let fence = crate::resolve::resolve(&**store, key, fence, &resolution, retention)
                    .await
                    .map_err(|err| Failure::runtime(err.to_string()))?;
                Ok(crate::resolve::resolved_json(key, fence, &resolution))
            }
            KeySource::Admin(client) => client.resolve(key, &request).await,
        }
    }

    async fn scan(&self, query: &ScanQuery) -> Result<(Vec<Value>, Option<String>), Failure> {
        match self {
            KeySource::Store(store) => {
                let page = store.scan(query).await.map_err(store_failure)?;
                Ok((page_json(&page), page.next_cursor))
            }
            KeySource::Admin(client) => client.scan(query).await,
        }
    }
}

/// `idem keys get|list|delete`, on the store or through `--admin`.
async fn keys(config: &Config, admin: Option<&str>, command: KeysCommand) -> Result<(), Failure> {
    match command {
        KeysCommand::Get { key, scope, json } => {
            let key = record_key(&key, &scope, ArgNames::FLAGS)?;
            let source = KeySource::open(config, admin).await?;
            match source.get(&key).await? {
                Some(record) if json => say(&record.to_string()),
                Some(record) => say(&record_text(&record)),
                None => {
                    // Exit 1 either way, so a script learns "no record" from the exit code
                    // whatever the format; `--json` also prints `null` for a JSON reader.
                    if json {
                        say("null");
                    }
                    return Err(Failure::runtime(format!("no record at {key}")));
                }
            }
            Ok(())
        }
        KeysCommand::Resolve {
            key,
            scope,
            release,
            status,
            header,
            body,
            fence,
            json,
        } => {
            let key = record_key(&key, &scope, ArgNames::FLAGS)?;
            let request = resolve_request(release, status, &header, body.as_deref(), fence)?;
            let source = KeySource::open(config, admin).await?;
            let resolved = source.resolve(config, &key, request).await?;
            if json {
                say(&resolved.to_string());
            } else {
                say(&format!(
                    "{} {key} at fence {}",
                    resolved["resolved"].as_str().unwrap_or("resolved"),
                    resolved["fence"],
                ));
            }
            Ok(())
        }
        KeysCommand::Delete { key, scope, json } => {
            let key = record_key(&key, &scope, ArgNames::FLAGS)?;
            let source = KeySource::open(config, admin).await?;
            let deleted = source.delete(&key).await?;
            if json {
                say(&json!({ "deleted": deleted }).to_string());
            } else if deleted {
                say(&format!("deleted {key}"));
            } else {
                say(&format!("no record at {key}"));
            }
            Ok(())
        }
        KeysCommand::List {
            state,
            older_than,
            limit,
            json,
        } => {
            let mut query = scan_query(
                state.as_deref(),
                older_than.as_deref(),
                limit,
                ArgNames::FLAGS,
            )?;
            let source = KeySource::open(config, admin).await?;
            // Records and unreadable ones alike: `limit` counts both, as a page does.
            let mut records = Vec::new();
            loop {
                let (page, cursor) = source.scan(&query).await?;
                records.extend(page);
                match cursor {
                    Some(cursor) if records.len() < limit => {
                        query.cursor = Some(cursor);
                        // No page asks for more than is left, so none is cut short.
                        query.limit = query.page_size().min(limit - records.len());
                    }
                    _ => break,
                }
            }
            records.truncate(limit);
            if json {
                say(&Value::Array(records).to_string());
            } else {
                for record in &records {
                    say(&record_line(record));
                }
            }
            Ok(())
        }
    }
}

/// A command line that is wrong: exit 2.
fn usage(message: impl Into<String>) -> Failure {
    Failure::Config(GatewayConfigError::new(None, message.into()))
}

/// The resolution `idem keys resolve` asks for, from its flags: `--body @FILE` is read here.
///
/// # Errors
/// [`Failure::Config`] (exit 2) for a header without `: `, a body file that cannot be read or
/// is not UTF-8, or a status or header the key API would refuse.
fn resolve_request(
    release: bool,
    status: Option<u16>,
    headers: &[String],
    body: Option<&str>,
    fence: Option<u64>,
) -> Result<ResolveRequest, Failure> {
    let headers = headers
        .iter()
        .map(|line| {
            line.split_once(':')
                .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
                .ok_or_else(|| usage(format!("--header {line:?}: NAME: VALUE")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let body = match body {
        Some(path) if path.starts_with('@') => {
            let path = &path[1..];
            let bytes =
                std::fs::read(path).map_err(|err| usage(format!("--body @{path}: {err}")))?;
            String::from_utf8(bytes)
                .map_err(|_| usage(format!("--body @{path}: not UTF-8 text")))?
        }
        Some(text) => text.to_owned(),
        None => String::new(),
    };
    let request = ResolveRequest {
        resolve: if release { "release" } else { "completed" }.to_owned(),
        fence,
        status,
        headers,
        body,
    };
    // Checked here too, so a bad flag is exit 2 before anything is asked.
    request.clone().parse().map_err(usage)?;
    Ok(request)
}

/// `idem store migrate|sweep`.
async fn store_command(config: &Config, command: StoreCommand) -> Result<(), Failure> {
    let (verb, json) = match command {
        StoreCommand::Migrate { json } => ("migrate", json),
        StoreCommand::Sweep { json } => ("sweep", json),
    };
    let message = crate::store::maintain(&config.store, verb == "migrate").await?;
    if json {
        say(
            &json!({ "store": config.store.spec.kind(), "command": verb, "message": message })
                .to_string(),
        );
    } else {
        say(&message);
    }
    Ok(())
}

/// `idem check-config`: prints a summary of a valid configuration (or one JSON object), or
/// fails with the one-line error.
fn check_config(config: Result<Config, GatewayConfigError>, json: bool) -> Result<(), Failure> {
    let config = match config {
        Ok(config) => config,
        Err(err) if json => {
            say(&json!({ "ok": false, "error": err.to_string() }).to_string());
            return Err(Failure::Config(err));
        }
        Err(err) => return Err(Failure::Config(err)),
    };
    let upstream = config
        .require_upstream()
        .and_then(|u| check_routes(&config).map(|()| u.url.to_string()));
    if json {
        let mut summary = summary(&config);
        summary["ok"] = Value::Bool(upstream.is_ok());
        if let Err(err) = &upstream {
            summary["error"] = Value::String(err.to_string());
        }
        say(&summary.to_string());
        return upstream.map(|_| ()).map_err(Failure::Config);
    }
    let upstream = upstream?;
    for warning in &config.warnings {
        warn(&format!("warning: {warning}"));
    }
    say(&format!(
        "ok: listen {}, upstream {upstream}, store {}, {} route(s), admin {}",
        config.server.listen,
        config.store.spec,
        config.routes.len(),
        config
            .admin
            .as_ref()
            .map_or_else(|| "off".to_owned(), |a| a.listen.to_string()),
    ));
    Ok(())
}

/// The resolved configuration as JSON (the admin token is never shown).
#[must_use]
pub(crate) fn summary(config: &Config) -> Value {
    let routes: Vec<Value> = config
        .routes
        .iter()
        .map(|route| {
            let s = &route.settings;
            json!({
                "name": route.name,
                "path": route.path.to_string(),
                "case_insensitive": route.path.case_insensitive(),
                "enabled": s.enabled,
                "header": s.header.as_str(),
                "methods": s.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "key": format!("{:?}", s.key).to_lowercase(),
                "scope": s.scope.to_string(),
                "lease_ms": millis(s.lease),
                "heartbeat_ms": millis(s.heartbeat),
                "retention_ms": millis(s.retention),
                "wait_ms": s.wait.map(millis),
                "request_body_limit": s.request_body_limit.get(),
                "request_body_timeout_ms": millis(s.request_body_timeout),
                "storage_cap": s.storage_cap.get(),
                "store_server_errors": s.store_server_errors,
                "on_store_error": match s.on_store_error {
                    OnStoreError::FailClosed => "fail_closed",
                    OnStoreError::FailOpen => "fail_open",
                },
                "strict_keys": s.strict_keys,
                "allow_headers": s.allow_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
                "deny_headers": s.deny_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
                "log_keys": s.log_keys,
            })
        })
        .collect();
    json!({
        "listen": config.server.listen.to_string(),
        "upstream": config.upstream.as_ref().map(|u| u.url.to_string()),
        "fence_headers": config.upstream.as_ref().map(|u| json!({
            "enabled": u.fence.enabled,
            "fence_header": u.fence.fence.as_str(),
            "attempt_header": u.fence.attempt.as_str(),
        })),
        "store": config.store.spec.to_string(),
        "namespace": config.store.namespace,
        "admin": config.admin.as_ref().map(|a| json!({
            "listen": a.listen.to_string(),
            "token": a.token.is_some(),
        })),
        "routes": routes,
        "warnings": config.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

/// A duration in whole milliseconds, saturating.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Writes a line to stderr (a warning: stdout keeps what a script reads).
fn warn(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stderr().lock();
    let _ = writeln!(out, "{line}");
}

/// Writes a line to stdout; a closed stdout (`idem ... | head`) is not an error worth a panic.
pub(crate) fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}
