//! The command line of the `idem` binary (clap derive; every override also reads an
//! environment variable).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;
use crate::store::Backends;

/// idem: idempotency in front of any HTTP service.
///
/// A retried POST runs once: idem records every Idempotency-Key and answers duplicates with the
/// stored response. Settings come from the config file, then the environment, then the flags.
#[derive(Debug, Parser)]
#[command(name = "idem", version, propagate_version = true)]
pub(crate) struct Cli {
    /// The configuration file (TOML; see idem.example.toml).
    #[arg(
        long,
        short = 'c',
        env = "IDEM_CONFIG",
        global = true,
        value_name = "PATH"
    )]
    pub config: Option<PathBuf>,

    /// Settings that win over the file.
    #[command(flatten)]
    pub overrides: OverrideArgs,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The flags that win over the configuration file. Values are checked with the file's parsers.
#[derive(Clone, Debug, Default, Args)]
pub(crate) struct OverrideArgs {
    /// The public address, e.g. 127.0.0.1:8080 or localhost:8080.
    #[arg(long, env = "IDEM_LISTEN", global = true, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The upstream service, e.g. http://127.0.0.1:3000 (https for TLS).
    #[arg(long, env = "IDEM_UPSTREAM", global = true, value_name = "URL")]
    pub upstream: Option<String>,
    /// The store: the forms of the stores this build has ([`Backends::forms`]).
    #[arg(
        long,
        env = "IDEM_STORE",
        global = true,
        value_name = "STORE",
        help = format!("The store: {}", Backends::COMPILED.forms())
    )]
    pub store: Option<String>,
    /// How long stored responses are kept, on every route (e.g. 24h).
    #[arg(long, env = "IDEM_RETENTION", global = true, value_name = "DURATION")]
    pub retention: Option<String>,
    /// The lease of a claim, on every route (e.g. 30s).
    #[arg(long, env = "IDEM_LEASE", global = true, value_name = "DURATION")]
    pub lease: Option<String>,
    /// The admin listener's address (metrics, health).
    #[arg(long, env = "IDEM_ADMIN_LISTEN", global = true, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// A bearer token the admin listener requires (and that `keys --admin` sends).
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        global = true,
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Run no admin listener.
    #[arg(long, global = true)]
    pub no_admin: bool,
    /// Open an existing empty redb file as a new store (refused otherwise: a store file is
    /// never empty, so an empty one lost its records). For one start, not a standing setting.
    #[arg(long, global = true)]
    pub redb_allow_empty: bool,
}

impl OverrideArgs {
    /// The overrides, to apply to the file.
    #[must_use]
    pub(crate) fn to_overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            store: self.store.clone(),
            retention: self.retention.clone(),
            lease: self.lease.clone(),
            admin_listen: self.admin_listen.clone(),
            admin_token: self.admin_token.clone(),
            scope_secret: std::env::var("IDEM_SCOPE_SECRET").ok(),
            no_admin: self.no_admin,
            redb_allow_empty: self.redb_allow_empty,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the gateway: proxy to the upstream with idempotency on the configured routes.
    Serve,
    /// Validate a configuration file; exit 2 with one line naming the problem.
    CheckConfig {
        /// The file (default: --config).
        path: Option<PathBuf>,
        /// Print the resolved configuration as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Inspect or remove records in the store, or through a running gateway (`--admin`).
    Keys {
        /// A running gateway's admin listener, e.g. http://127.0.0.1:9901: ask it instead of
        /// opening the store (the only way to a gateway's memory store). Its token comes from
        /// --admin-token, IDEM_ADMIN_TOKEN or the file's `[admin] token`.
        #[arg(long, env = "IDEM_ADMIN_URL", global = true, value_name = "URL")]
        admin: Option<String>,
        /// What to do.
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Store maintenance.
    Store {
        /// What to do.
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// A gateway and a built-in upstream on free ports, with curl lines to try.
    ///
    /// The gateway takes --listen, --admin-listen, --admin-token, --no-admin, --lease and
    /// --retention. It runs on the memory store in front of its own upstream: --config,
    /// --upstream and a --store other than memory (or their IDEM_* variables) are refused.
    Demo,
}

/// `idem keys ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Show one record: its state, owner, fence, attempt, times, stored status and failure,
    /// one `field: value` line each (the names of --json).
    Get {
        /// The idempotency key.
        key: String,
        /// The record's scope (see `keys list`; empty: no scope).
        #[arg(long, default_value = "")]
        scope: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// List records page by page in the store's order: oldest first on PostgreSQL, not by time
    /// on the other stores.
    List {
        /// Only records in this state: in_flight, completed, failed or unknown.
        #[arg(long)]
        state: Option<String>,
        /// Only records at least this old (e.g. 10m).
        #[arg(long, value_name = "DURATION")]
        older_than: Option<String>,
        /// At most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON output (one array).
        #[arg(long)]
        json: bool,
    },
    /// Resolve an unknown outcome: --release (the effect did not happen: the next request
    /// with the key runs it) or --status (it happened: every retry gets this response). Only
    /// a record still unknown is changed (at --fence, when given): anything else is exit 1.
    Resolve {
        /// The idempotency key.
        key: String,
        /// The record's scope (empty: no scope).
        #[arg(long, default_value = "")]
        scope: String,
        /// The effect did not happen: free the key.
        #[arg(long, conflicts_with_all = ["status", "header", "body"], required_unless_present = "status")]
        release: bool,
        /// The effect happened: settle the key with a response of this status.
        #[arg(long)]
        status: Option<u16>,
        /// A header of that response, `Name: value` (repeatable).
        #[arg(long, value_name = "NAME: VALUE", requires = "status")]
        header: Vec<String>,
        /// Its body: text, or `@FILE` to read it from a file (UTF-8).
        #[arg(long, requires = "status")]
        body: Option<String>,
        /// Resolve only at this fence (`keys get` shows it); default: the record's.
        #[arg(long)]
        fence: Option<u64>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Remove one record: the next request with the key runs again. No record at the key is
    /// no error (exit 0): the key is free either way.
    Delete {
        /// The idempotency key.
        key: String,
        /// The record's scope (empty: no scope).
        #[arg(long, default_value = "")]
        scope: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `idem store ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Create or upgrade the store's schema: PostgreSQL applies its migrations; redb creates
    /// the file with its tables, or checks an existing one.
    Migrate {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Remove expired records now (stores that keep them until swept).
    Sweep {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}
