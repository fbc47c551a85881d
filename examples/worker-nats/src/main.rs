//! The JetStream worker example: `publish` puts jobs on the stream (a fifth of them twice),
//! `work` consumes them through the guard on the memory store, or on the durable redb store
//! with `--redb PATH`, and prints a summary on Ctrl-C (processed, shipped, duplicates answered).
//! See the README for what to expect.
//!
//! ```text
//! cargo run -p worker-nats -- publish 100
//! cargo run -p worker-nats -- work
//! cargo run -p worker-nats -- work --redb shipped.redb
//! ```
//!
//! `IDEM_TEST_NATS_URL` (or `NATS_URL`) names the server (default `127.0.0.1:4222`).

use std::time::Duration;

use queue_common::{ctrl_c, demo_orders, demo_store, ship_orders};
use worker_nats::{Error, consume, ensure_consumer};

const STREAM: &str = "IDEM_EXAMPLE_JOBS";
const SUBJECTS: &str = "idem.example.jobs.>";

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let url = std::env::var("IDEM_TEST_NATS_URL")
        .or_else(|_| std::env::var("NATS_URL"))
        .unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url).await?;
    // The stream must exist before anything is published on it.
    let consumer = ensure_consumer(
        &client,
        STREAM,
        SUBJECTS,
        "example",
        10,
        Duration::from_secs(10),
    )
    .await?;
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("publish") => {
            let count: u64 = args.next().map_or(Ok(100), |n| n.parse())?;
            let js = async_nats::jetstream::new(client);
            let orders = demo_orders(count);
            let messages = orders
                .iter()
                .map(|(key, payload)| (Some(key.clone()), payload.clone().into()));
            worker_nats::publish(&js, "idem.example.jobs.ship", messages).await?;
            println!("published {count} jobs ({} messages)", orders.len());
        }
        Some("work") => {
            let (store, label) = demo_store(args)?;
            let (job, tally) = ship_orders(store, label)?;
            println!("working on the {label} store; Ctrl-C to stop");
            consume(consumer, 16, ctrl_c(), job).await?;
            println!("{}", tally.summary());
        }
        _ => {
            eprintln!("usage: worker-nats publish [COUNT] | work [--redb PATH]");
            std::process::exit(2);
        }
    }
    Ok(())
}
