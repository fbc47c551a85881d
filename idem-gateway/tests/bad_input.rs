//! Bad input to the `idem` binary: each gives one clear error line and exit code 2, never a
//! panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `idem` with `args`, without any IDEM_* variable of the caller's environment but a
/// scope secret (whose absence is a warning of its own: [`no_scope_secret_is_warned_about`]).
fn idem(args: &[&str]) -> Output {
    idem_with(args, &[("IDEM_SCOPE_SECRET", SCOPE_SECRET)])
}

const SCOPE_SECRET: &str = "a scope secret of the tests";

/// [`idem`] with exactly the IDEM_* variables `vars`.
fn idem_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.args(args).env("RUST_BACKTRACE", "0");
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command.envs(vars.iter().copied());
    command.output().expect("run idem")
}

/// Without a scope secret, `check-config` warns that scopes are unkeyed hashes (on a config
/// whose routes scope by anything); with one, from the environment or a file, it does not. A
/// secret that is too short, unreadable, or given both ways is refused.
#[test]
fn no_scope_secret_is_warned_about() {
    let config = file(
        "scope-secret.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    let warned = idem_with(&["check-config", path(&config)], &[]);
    assert!(warned.status.success());
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(stderr.contains("no scope secret"), "{stderr}");
    let quiet = idem(&["check-config", path(&config)]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("no scope secret"));
    let unscoped = file(
        "scope-none.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[idempotency]\nscope = \"none\"\n",
    );
    let none = idem_with(&["check-config", path(&unscoped)], &[]);
    assert!(!String::from_utf8_lossy(&none.stderr).contains("no scope secret"));
    let secret = file("scope.secret", "0123456789abcdef0123\n");
    let from_file = file(
        "scope-file.toml",
        &format!(
            "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[store]\nscope_secret_file = {:?}\n",
            path(&secret)
        ),
    );
    let filed = idem_with(&["check-config", path(&from_file)], &[]);
    assert!(filed.status.success(), "{filed:?}");
    assert!(!String::from_utf8_lossy(&filed.stderr).contains("no scope secret"));
    assert_one_line_error(
        &idem(&["check-config", path(&from_file)]),
        &["scope_secret_file", "IDEM_SCOPE_SECRET", "keep one"],
    );
    assert_one_line_error(
        &idem_with(
            &["check-config", path(&config)],
            &[("IDEM_SCOPE_SECRET", "short")],
        ),
        &["at least 16 bytes"],
    );
    let missing = file(
        "scope-missing.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[store]\nscope_secret_file = \"/nonexistent/secret\"\n",
    );
    assert_one_line_error(
        &idem_with(&["check-config", path(&missing)], &[]),
        &["cannot read scope_secret_file"],
    );
    // The secret itself is never shown.
    let shown = idem(&["check-config", "--json", path(&config)]);
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(!out.contains(SCOPE_SECRET), "{out}");
}

/// Writes `text` to a fresh file named `name` in a temporary directory of this test.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-gateway-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Asserts exit code 2 and exactly one stderr line containing every one of `needles`.
fn assert_one_line_error(output: &Output, needles: &[&str]) {
    assert_one_line_exit(output, 2, needles);
}

/// Asserts exit code `code` and exactly one stderr line containing every one of `needles`.
fn assert_one_line_exit(output: &Output, code: i32, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "one line expected, got: {stderr}"
    );
    assert!(stderr.starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_shipped_example_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/idem.example.toml");
    let output = idem(&["check-config", example]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("ok: "));
    let json = idem(&["check-config", "--json", example]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["ok"], true);
    assert_eq!(value["routes"][0]["name"], "payments");
    assert_eq!(value["routes"][0]["key"], "required");
    assert_eq!(
        value["routes"][0]["scope"],
        "[\"authorization\", \"cookie:session\"]"
    );
    assert_eq!(value["routes"][0]["request_body_timeout_ms"], 10_000);
}

/// The example repeats the defaults, so a lease given on the command line or in the
/// environment works with it as it does without a file: an unset heartbeat follows a short
/// lease (a third of it), where a heartbeat written into the file would refuse it.
#[test]
fn the_shipped_example_takes_a_short_lease_as_the_defaults_do() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/idem.example.toml");
    let output = idem(&["--lease", "5s", "check-config", "--json", example]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let routes = value["routes"].as_array().unwrap();
    assert!(!routes.is_empty());
    for route in routes {
        assert_eq!(route["lease_ms"], 5000, "{route}");
        assert_eq!(route["heartbeat_ms"], 1666, "{route}");
    }
    let without_file = idem(&[
        "--lease",
        "5s",
        "--upstream",
        "http://127.0.0.1:3000",
        "check-config",
        "--json",
    ]);
    let value: serde_json::Value = serde_json::from_slice(&without_file.stdout).unwrap();
    assert_eq!(value["routes"][0]["heartbeat_ms"], 1666, "{value}");
}

#[test]
fn malformed_toml_names_the_position() {
    let bad = file(
        "malformed.toml",
        "[upstream\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["malformed.toml:1:", "expected `]`"],
    );
}

#[test]
fn unknown_key_names_the_position() {
    let bad = file(
        "unknown.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\nretries = 3\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["unknown.toml:3:1", "unknown field `retries`"],
    );
    let bad = file(
        "unknown-route.toml",
        "[upstream]\nurl = \"http://h:1\"\n[[route]]\npath = \"/x\"\nleese = \"1s\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["unknown-route.toml:5:1", "`leese`"],
    );
}

#[test]
fn bad_duration_in_the_file_and_in_a_flag() {
    let bad = file(
        "duration.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\ntimeout = \"3 fortnights\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["duration.toml:3:11", "invalid duration \"3 fortnights\""],
    );
    let ok = file("ok.toml", "[upstream]\nurl = \"http://127.0.0.1:3000\"\n");
    assert_one_line_error(
        &idem(&["check-config", path(&ok), "--lease", "30 parsecs"]),
        &["--lease", "invalid duration"],
    );
    assert_one_line_error(
        &idem(&["--retention", "0s", "check-config", path(&ok)]),
        &["--retention", "longer than zero"],
    );
}

#[test]
fn bad_store_url_in_the_file_and_in_a_flag() {
    let bad = file("store.toml", "[store]\nurl = \"mysql://localhost/idem\"\n");
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["store.toml:2:7", "unknown store scheme \"mysql\""],
    );
    let ok = file(
        "ok-store.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&ok), "--store", "redis://h:99999"]),
        &["--store", "port"],
    );
    // serve refuses it the same way before it binds anything.
    assert_one_line_error(
        &idem(&[
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--store",
            "nosuchstore",
        ]),
        &["--store", "unknown store"],
    );
}

#[test]
fn settings_checked_together() {
    refused(
        "heartbeat.toml",
        "[upstream]\nurl = \"http://h:1\"\n\n[[route]]\npath = \"/p\"\nlease = \"3s\"\nheartbeat = \"5s\"\n",
        &["heartbeat.toml:7:13", "shorter than the lease"],
    );
    // A heartbeat the file sets, against a lease from the command line: the flag is named.
    let beat = file(
        "beat.toml",
        "[upstream]\nurl = \"http://h:1\"\n[idempotency]\nheartbeat = \"10s\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&beat), "--lease", "5s"]),
        &["beat.toml:4:13", "lease (5s, set by --lease or IDEM_LEASE)"],
    );
    // A value checked beyond its syntax is named by its own position, not its section's.
    refused(
        "zero-lease.toml",
        "[upstream]\nurl = \"http://h:1\"\n[idempotency]\nkey = \"required\"\nlease = \"0s\"\n",
        &["zero-lease.toml:5:9", "the lease must be longer than zero"],
    );
    refused(
        "header.toml",
        "[upstream]\nurl = \"http://h:1\"\n[[route]]\npath = \"/p\"\nheader = \"Bad Header\"\n",
        &["header.toml:5:10", "is not a header name"],
    );
    refused(
        "cap.toml",
        "[upstream]\nurl = \"http://h:1\"\n[idempotency]\nstorage_cap = 0\n",
        &["cap.toml:4:15", "storage_cap must be at least 1 byte"],
    );
    refused(
        "nopath.toml",
        "[upstream]\nurl = \"http://h:1\"\n[[route]]\nkey = \"required\"\n",
        &["nopath.toml:3:1", "no path"],
    );
    refused(
        "headers.toml",
        "[upstream]\nurl = \"http://h:1\"\n[server]\nmax_header_bytes = 100\n",
        &["headers.toml:4:20", "at least 8192"],
    );
    refused(
        "workers.toml",
        "[upstream]\nurl = \"http://h:1\"\n[server]\nworkers = 0\n",
        &["workers.toml:4:11", "workers must be 1 to 1024"],
    );
    refused(
        "many.toml",
        "[upstream]\nurl = \"http://h:1\"\n[server]\nworkers = 100000\n",
        &["many.toml:4:11", "workers must be 1 to 1024"],
    );
    refused(
        "budget.toml",
        "[upstream]\nurl = \"http://h:1\"\n[store]\nmemory_max_bytes = \"0MiB\"\n",
        &[
            "budget.toml:4:20",
            "memory_max_bytes must be at least 1 byte",
        ],
    );
    refused(
        "budget-unit.toml",
        "[upstream]\nurl = \"http://h:1\"\n[store]\nmemory_max_bytes = \"1 TB\"\n",
        &["budget-unit.toml:4:20", "invalid size"],
    );
    refused(
        "small-budget.toml",
        "[upstream]\nurl = \"http://h:1\"\n[store]\nmemory_max_bytes = \"64KiB\"\n",
        &[
            "small-budget.toml:4:20",
            "memory_max_bytes must be at least 1MiB",
        ],
    );
}

/// `check-config` refuses the file `name` holding `text` in one line that says each of `says`.
fn refused(name: &str, text: &str, says: &[&str]) {
    let bad = file(name, text);
    assert_one_line_error(&idem(&["check-config", path(&bad)]), says);
}

#[test]
fn missing_file_and_missing_upstream() {
    assert_one_line_error(
        &idem(&["check-config", "/nonexistent/idem.toml"]),
        &["cannot read the config"],
    );
    let empty = file("empty.toml", "");
    assert_one_line_error(&idem(&["check-config", path(&empty)]), &["no upstream"]);
    assert_one_line_error(
        &idem(&["check-config", path(&empty), "--upstream", "ftp://x"]),
        &["--upstream", "http or https"],
    );
}

#[test]
fn upstream_port_out_of_range_in_the_file_and_in_a_flag() {
    for port in ["99999", "0"] {
        let bad = file(
            &format!("upstream-port-{port}.toml"),
            &format!("[upstream]\nurl = \"http://127.0.0.1:{port}\"\n"),
        );
        assert_one_line_error(
            &idem(&["check-config", path(&bad)]),
            &[
                &format!("upstream-port-{port}.toml:2:7"),
                &format!("port \"{port}\" is not a number from 1 to 65535"),
            ],
        );
        let empty = file("no-upstream.toml", "");
        let url = format!("http://127.0.0.1:{port}");
        assert_one_line_error(
            &idem(&["check-config", path(&empty), "--upstream", &url]),
            &["--upstream", "is not a number from 1 to 65535"],
        );
    }
}

#[test]
fn json_errors_are_one_object() {
    let bad = file("json.toml", "[upstream]\nurl = 5\n");
    let output = idem(&["check-config", "--json", path(&bad)]);
    assert_eq!(output.status.code(), Some(2));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["ok"], false);
    assert!(value["error"].as_str().unwrap().starts_with(path(&bad)));
}

#[test]
fn admin_commands_refuse_the_memory_store_and_bad_arguments() {
    assert_one_line_error(
        &idem(&["keys", "list"]),
        &["memory store lives inside each"],
    );
    assert_one_line_error(
        &idem(&[
            "--store",
            "redis://127.0.0.1:6379",
            "keys",
            "get",
            "bad\u{1}key",
        ]),
        &["KEY", "printable ASCII"],
    );
    assert_one_line_error(
        &idem(&[
            "--store",
            "redis://127.0.0.1:6379",
            "keys",
            "list",
            "--older-than",
            "soon",
        ]),
        &["--older-than", "invalid duration"],
    );
}

#[test]
fn serve_without_an_upstream_says_so() {
    assert_one_line_error(&idem(&["serve", "--no-admin"]), &["no upstream"]);
}

#[test]
fn admin_address_in_use_is_one_line_and_exit_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let admin = format!("127.0.0.1:{port}");
    // One serving thread and several: the serving threads' runtimes exist when the admin
    // address is refused, and must not be dropped inside the main one (that panicked).
    for workers in ["1", "3"] {
        let config = file(
            &format!("admin-in-use-{workers}.toml"),
            &format!("[server]\nworkers = {workers}\n"),
        );
        let output = idem(&[
            "--config",
            path(&config),
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            &admin,
        ]);
        assert_one_line_exit(&output, 1, &["cannot listen on", &admin, "admin"]);
    }
}

/// What the PostgreSQL store refuses before connecting, check-config refuses too: a namespace
/// that is no schema name, and a URL its client cannot parse (both accepted by `serve`'s own
/// parsers, then refused when it opened the store).
#[cfg(feature = "postgres")]
#[test]
fn check_config_refuses_what_the_postgres_store_refuses() {
    let bad = file(
        "pg-namespace.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[store]\nurl = \"postgres://u@127.0.0.1/db\"\nnamespace = \"my-app\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["pg-namespace.toml:5:13", "invalid schema name \"my-app\""],
    );
    let ok = file(
        "pg-ok.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&[
            "check-config",
            path(&ok),
            "--store",
            "postgres://u@127.0.0.1/db?no_such_option=1",
        ]),
        &["--store", "invalid PostgreSQL URL"],
    );
}

/// The same for the Redis store: a URL its client refuses (a database that is not a number).
#[cfg(feature = "redis")]
#[test]
fn check_config_refuses_what_the_redis_store_refuses() {
    let bad = file(
        "redis-db.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[store]\nurl = \"redis://127.0.0.1:6379/x\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["redis-db.toml:4:7", "invalid Redis URL", "database"],
    );
}

/// `check-config --json` shows every resolved setting of a route, the store-failure mode,
/// key syntax, header lists and key logging included.
#[test]
fn check_config_json_shows_every_route_setting() {
    let routes = file(
        "routes-json.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[idempotency]\nlog_keys = false\n\
         [[route]]\npath = \"/p\"\non_store_error = \"fail_open\"\nstrict_keys = true\n\
         allow_headers = [\"set-cookie\"]\ndeny_headers = [\"etag\"]\n",
    );
    let output = idem(&["check-config", "--json", path(&routes)]);
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let route = &value["routes"][0];
    assert_eq!(route["on_store_error"], "fail_open", "{value}");
    assert_eq!(route["strict_keys"], true, "{value}");
    assert_eq!(
        route["allow_headers"],
        serde_json::json!(["set-cookie"]),
        "{value}"
    );
    assert_eq!(
        route["deny_headers"],
        serde_json::json!(["etag"]),
        "{value}"
    );
    assert_eq!(route["log_keys"], false, "{value}");
    let default = &value["routes"][1];
    assert_eq!(default["on_store_error"], "fail_closed", "{value}");
    assert_eq!(default["strict_keys"], false, "{value}");
}

/// Route paths are put in the normal form requests are matched in when the config is loaded,
/// and `check-config --json` shows that form; a path with a `..` segment is refused, at its
/// position.
#[test]
fn route_paths_are_shown_in_normal_form_and_dot_dot_is_refused() {
    let routes = file(
        "routes-normal.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n\
         [[route]]\npath = \"//payments/\"\n\
         [[route]]\npath = \"/v1/./%2a/%6Frders/*/\"\n",
    );
    let output = idem(&["check-config", "--json", path(&routes)]);
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["routes"][0]["path"], "/payments", "{value}");
    assert_eq!(value["routes"][0]["name"], "/payments", "{value}");
    assert_eq!(value["routes"][1]["path"], "/v1/%2A/orders/*", "{value}");
    for bad in ["/a/../payments", "/../payments", "/v1/*/%2E%2E"] {
        let config = file(
            "routes-dot-dot.toml",
            &format!("[upstream]\nurl = \"http://127.0.0.1:3000\"\n[[route]]\npath = \"{bad}\"\n"),
        );
        assert_one_line_error(
            &idem(&["check-config", path(&config)]),
            &["routes-dot-dot.toml:4:8", "invalid path", "no .. segment"],
        );
    }
}

/// A bad value from an environment variable is named by it too, not by a flag the user never
/// passed.
#[test]
fn a_bad_environment_variable_is_named() {
    let ok = file(
        "env-ok.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    for (variable, value) in [
        ("IDEM_RETENTION", "3 fortnights"),
        ("IDEM_LEASE", "0s"),
        ("IDEM_STORE", "mysql://h/db"),
        ("IDEM_LISTEN", "nowhere"),
        ("IDEM_UPSTREAM", "ftp://h"),
        ("IDEM_ADMIN_LISTEN", "nowhere"),
        ("IDEM_ADMIN_TOKEN", "two words"),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
        for (name, _) in std::env::vars() {
            if name.starts_with("IDEM_") {
                command.env_remove(name);
            }
        }
        let output = command
            .args(["check-config", path(&ok)])
            .env(variable, value)
            .output()
            .unwrap();
        assert_one_line_error(&output, &[variable]);
    }
}

/// A duration longer than 100 years is refused, in the file and in a flag: it is a typing
/// mistake, and one of about 292 billion years made `idem serve` panic when it shut down (the
/// grace's deadline did not fit the clock).
#[test]
fn a_duration_over_100_years_is_refused() {
    let bad = file(
        "huge-grace.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n\n[server]\nshutdown_grace = \"500000000000y\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &["huge-grace.toml:5:18", "longer than 100 years"],
    );
    assert_one_line_error(
        &idem(&["serve", "--config", path(&bad), "--no-admin"]),
        &["huge-grace.toml:5:18", "longer than 100 years"],
    );
    let ok = file(
        "ok-huge.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&ok), "--retention", "101y"]),
        &["--retention", "longer than 100 years"],
    );
    assert_one_line_error(
        &idem(&["keys", "list", "--older-than", "1000000y"]),
        &["--older-than", "longer than 100 years"],
    );
    // 100 years itself is taken.
    let output = idem(&["check-config", path(&ok), "--lease", "100y"]);
    assert!(output.status.success(), "{output:?}");
}

/// The gateway and its admin listener on one port cannot both listen: `check-config` says so
/// (exit 2, naming where the address was set) instead of `serve` failing to bind (exit 1).
#[test]
fn the_gateway_and_the_admin_listener_on_one_port_is_refused() {
    let clash = file(
        "clash.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n\n[server]\nlisten = \"0.0.0.0:18080\"\n\n[admin]\nlisten = \"127.0.0.1:18080\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&clash)]),
        &["clash.toml:8:10", "cannot share a port"],
    );
    assert_one_line_error(
        &idem(&["serve", "--config", path(&clash)]),
        &["clash.toml:8:10", "cannot share a port"],
    );
    let ok = file(
        "ok-ports.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&ok), "--listen", "127.0.0.1:9901"]),
        &["--listen", "cannot share a port"],
    );
    // Another port, another address, port 0 or no admin listener: fine.
    for args in [
        ["--listen", "127.0.0.1:9902"],
        ["--listen", "127.0.0.2:9901"],
        ["--admin-listen", "127.0.0.1:0"],
    ] {
        let output = idem(&["check-config", path(&ok), args[0], args[1]]);
        assert!(output.status.success(), "{args:?}: {output:?}");
    }
    let output = idem(&[
        "check-config",
        path(&ok),
        "--listen",
        "127.0.0.1:9901",
        "--no-admin",
    ]);
    assert!(output.status.success(), "{output:?}");
}

/// A listening address that is not an IP address or a host name, and a port, says how to
/// write one, in the file as in a flag.
#[test]
fn a_bad_listening_address_says_how_to_write_one() {
    let bad = file(
        "listen.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n\n[server]\nlisten = \"8080\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&bad)]),
        &[
            "listen.toml:5:10",
            "invalid address \"8080\"",
            "127.0.0.1:8080",
            "localhost:8080",
        ],
    );
    let ok = file(
        "ok-listen.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&[
            "check-config",
            path(&ok),
            "--admin-listen",
            "127.0.0.1:99999",
        ]),
        &["--admin-listen", "invalid address", "127.0.0.1:8080"],
    );
}

/// Two routes of one name, or a route named `default` like the catch-all, would count as one in
/// the metrics (`idem_gateway_requests_total{route}`) and the logs: refused, with the position
/// of the second route. Before, both were accepted; so were two routes of one path and no name
/// (the name is then the path), the second of which no request can reach.
#[test]
fn two_routes_of_one_name_are_refused() {
    for (name, text, position) in [
        (
            "same-name.toml",
            "[upstream]\nurl = \"http://h:1\"\n[[route]]\nname = \"a\"\npath = \"/a\"\n\
             [[route]]\nname = \"a\"\npath = \"/b\"\n",
            ":6:1",
        ),
        (
            "default-name.toml",
            "[upstream]\nurl = \"http://h:1\"\n[[route]]\nname = \"default\"\npath = \"/a\"\n",
            ":3:1",
        ),
        (
            "same-path.toml",
            "[upstream]\nurl = \"http://h:1\"\n[[route]]\npath = \"/a\"\n[[route]]\npath = \"/a/\"\n",
            ":5:1",
        ),
    ] {
        let config = file(name, text);
        assert_one_line_error(
            &idem(&["check-config", path(&config)]),
            &[&format!("{name}{position}"), "is taken"],
        );
    }
}

/// An admin token shorter than 16 bytes is refused, from the file and from the flag, with the
/// reason: the right token is accepted even from an address whose wrong tokens are throttled,
/// which is safe only for a token too long to guess.
#[test]
fn a_short_admin_token_is_refused() {
    let short = file(
        "short-token.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n\n[admin]\ntoken = \"fifteen-bytes!!\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&short)]),
        &["short-token.toml:5:9", "15 bytes", "at least 16"],
    );
    assert_one_line_error(
        &idem(&["serve", "--config", path(&short)]),
        &["short-token.toml:5:9", "at least 16"],
    );
    let ok = file(
        "token-ok.toml",
        "[upstream]\nurl = \"http://127.0.0.1:3000\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&ok), "--admin-token", "short"]),
        &["--admin-token", "5 bytes", "at least 16"],
    );
    let output = idem(&[
        "check-config",
        path(&ok),
        "--admin-token",
        "sixteen-bytes-ok",
    ]);
    assert!(output.status.success(), "{output:?}");
}

/// A config with `[upstream]` and then `rest`, in a file named `name`.
fn with_upstream(name: &str, rest: &str) -> PathBuf {
    file(
        name,
        &format!("[upstream]\nurl = \"http://127.0.0.1:3000\"\n{rest}"),
    )
}

/// `check-config` on `config`: it passes, and its stderr is the warnings it printed.
fn warnings_of(config: &Path) -> String {
    let output = idem(&["check-config", path(config)]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("ok: "));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// An admin listener that other machines reach, without a token, is refused, by `check-config`
/// and `serve` alike (both build the configuration): before, both took it, and anyone on the
/// network could list and delete records.
#[test]
fn a_public_admin_listener_without_a_token_is_refused() {
    let open = with_upstream("admin-open.toml", "[admin]\nlisten = \"0.0.0.0:19901\"\n");
    for command in [
        vec!["check-config", path(&open)],
        vec!["serve", "--config", path(&open)],
    ] {
        assert_one_line_error(
            &idem(&command),
            &[
                "admin-open.toml:4:10",
                "not on a loopback address",
                "has no token",
            ],
        );
    }
    assert_one_line_error(
        &idem(&["check-config", path(&open), "--admin-listen", "[::]:19901"]),
        &["--admin-listen", "has no token"],
    );
    let tokened = idem(&[
        "check-config",
        path(&open),
        "--admin-token",
        "a-token-of-16-bytes",
    ]);
    assert!(tokened.status.success(), "{tokened:?}");
    assert_eq!(warnings_of(&with_upstream("admin-local.toml", "")), "");
}

/// A key header that is a framing or hop-by-hop field is refused at its line: before, it was
/// taken, and the gateway keyed requests by their length or their host.
#[test]
fn a_framing_field_as_the_key_header_is_refused() {
    for header in [
        "Content-Length",
        "Host",
        "Transfer-Encoding",
        "Connection",
        "te",
    ] {
        let config = with_upstream(
            "key-header.toml",
            &format!("[[route]]\npath = \"/p\"\nheader = \"{header}\"\n"),
        );
        assert_one_line_error(
            &idem(&["check-config", path(&config)]),
            &["key-header.toml:5:10", "cannot carry the idempotency key"],
        );
    }
}

/// Covered methods: HEAD, OPTIONS, CONNECT and TRACE are refused, GET is taken with a warning,
/// and a method not in upper case is refused with the name to write (before, all were taken
/// silently, and `post` was read as `POST`).
#[test]
fn covered_methods_that_are_no_candidates_are_refused_or_warned_about() {
    for method in ["HEAD", "OPTIONS", "CONNECT", "TRACE"] {
        let config = with_upstream(
            "methods.toml",
            &format!("[idempotency]\nmethods = [\"POST\", \"{method}\"]\n"),
        );
        assert_one_line_error(
            &idem(&["check-config", path(&config)]),
            &[
                "methods.toml:4:11",
                &format!("{method} is not an idempotency candidate"),
            ],
        );
    }
    let lower = with_upstream(
        "methods-lower.toml",
        "[[route]]\npath = \"/p\"\nmethods = [\"post\"]\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&lower)]),
        &[
            "methods-lower.toml:5:12",
            "not in upper case",
            "write \"POST\"",
        ],
    );
    let get = with_upstream(
        "methods-get.toml",
        "[[route]]\npath = \"/p\"\nmethods = [\"GET\", \"POST\"]\n",
    );
    let warnings = warnings_of(&get);
    assert_eq!(warnings.lines().count(), 1, "{warnings}");
    assert!(
        warnings.starts_with("warning: ")
            && warnings.contains("methods-get.toml:5:11: GET is covered"),
        "{warnings}"
    );
    let json = idem(&["check-config", "--json", path(&get)]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["ok"], true);
    assert!(
        value["warnings"][0]
            .as_str()
            .unwrap()
            .contains("GET is covered"),
        "{value}"
    );
}

/// An `allow_headers` entry for a header that is never denied changes nothing: a warning says
/// so. One that re-allows a header denied by default passes without a word.
#[test]
fn allowing_a_header_that_is_never_denied_is_warned_about() {
    let noop = with_upstream(
        "allow.toml",
        "[idempotency]\nallow_headers = [\"x-request-id\"]\n",
    );
    let warnings = warnings_of(&noop);
    assert!(
        warnings.starts_with("warning: ")
            && warnings.contains(
                "allow.toml:4:17: allow_headers names x-request-id, which is never denied"
            ),
        "{warnings}"
    );
    let denied = with_upstream(
        "allow-denied.toml",
        "[idempotency]\nallow_headers = [\"x-a\"]\ndeny_headers = [\"x-a\"]\n",
    );
    assert!(warnings_of(&denied).contains("deny wins"));
    let useful = with_upstream(
        "allow-ok.toml",
        "[idempotency]\nallow_headers = [\"Set-Cookie\", \"date\"]\n",
    );
    assert_eq!(warnings_of(&useful), "");
}

/// The fence headers' names are refused at their line when they cannot carry a value to the
/// upstream (a framing or hop-by-hop field, a header the gateway sets), when both are one
/// header, and when one is a route's key header (the gateway removes a client's copies of the
/// fence headers from every request, so the upstream would lose the key).
#[test]
fn fence_header_names_that_cannot_work_are_refused() {
    for header in ["Content-Length", "Connection", "te", "X-Forwarded-For"] {
        let config = with_upstream(
            "fence-header.toml",
            &format!("fence_header = \"{header}\"\n"),
        );
        assert_one_line_error(
            &idem(&["check-config", path(&config)]),
            &[
                "fence-header.toml:3:16",
                "cannot carry the fence or the attempt number",
            ],
        );
    }
    let same = with_upstream(
        "fence-same.toml",
        "fence_header = \"X-Fence\"\nattempt_header = \"x-fence\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&same)]),
        &["fence-same.toml:4:18", "both x-fence"],
    );
    let key = with_upstream(
        "fence-key.toml",
        "attempt_header = \"X-Request-Key\"\n[[route]]\nname = \"pay\"\npath = \"/p\"\nheader = \"X-Request-Key\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&key)]),
        &[
            "fence-key.toml:3:18",
            "attempt_header \"x-request-key\" is the key header of route \"pay\"",
        ],
    );
    // The default names clash too: the error names the section.
    let default = with_upstream(
        "fence-default.toml",
        "[idempotency]\nheader = \"Idempotency-Fence\"\n",
    );
    assert_one_line_error(
        &idem(&["check-config", path(&default)]),
        &[
            "fence-default.toml",
            "fence_header \"idempotency-fence\" is the key header",
        ],
    );
    let renamed = with_upstream(
        "fence-renamed.toml",
        "fence_header = \"X-Fence\"\nattempt_header = \"X-Attempt\"\nfence_headers = false\n",
    );
    assert_eq!(warnings_of(&renamed), "");
    let output = idem(&["check-config", "--json", path(&renamed)]);
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        value["fence_headers"],
        serde_json::json!({"enabled": false, "fence_header": "x-fence", "attempt_header": "x-attempt"}),
        "{value}"
    );
}
