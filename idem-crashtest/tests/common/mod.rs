//! What the crash tests share: the PostgreSQL server they run against, a schema of their own,
//! and the child process (the test binary, run as one of its own ignored tests) they kill.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use idem_store_postgres::tokio_postgres::{self, NoTls};
use idem_testkit::probe::{require_tcp, service_url};

pub(crate) fn url() -> String {
    service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// Whether the server answers (else the test is skipped, or fails in CI).
pub(crate) fn postgres_up() -> bool {
    let config: tokio_postgres::Config = url().parse().expect("IDEM_TEST_POSTGRES_URL parses");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    require_tcp("PostgreSQL", &format!("{host}:{port}"))
}

pub(crate) async fn connect() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A schema of the test's own, made by `tables` (SQL, `{schema}` standing for its name), and
/// dropped with everything in it at the end.
pub(crate) struct TestSchema(pub(crate) String);

impl TestSchema {
    pub(crate) fn create(prefix: &str, tables: &str) -> Self {
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        let sql = format!(
            "CREATE SCHEMA {name}; {}",
            tables.replace("{schema}", &name)
        );
        runtime().block_on(async { connect().await.batch_execute(&sql).await.unwrap() });
        TestSchema(name)
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let name = self.0.clone();
        let dropped = std::thread::spawn(move || {
            runtime().block_on(async {
                connect()
                    .await
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                    .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}: {dropped:?}", self.0);
        }
    }
}

/// Runs the ignored test `name` of this binary as a child process with `envs`; its stdout,
/// line by line, comes through the receiver (a line may start with the harness's `test ...`).
pub(crate) fn spawn_child(name: &str, envs: &[(&str, &str)]) -> (Child, mpsc::Receiver<String>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (key, value) in envs {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (child, received)
}
