//! The RabbitMQ worker example: `publish` puts jobs on the queue (a fifth of them twice),
//! `work` consumes them through the guard on the memory store, or on the durable redb store
//! with `--redb PATH`, and prints a summary on Ctrl-C (processed, shipped, duplicates answered).
//! See the README for what to expect.
//!
//! ```text
//! cargo run -p worker-rabbitmq -- publish 100
//! cargo run -p worker-rabbitmq -- work
//! cargo run -p worker-rabbitmq -- work --redb shipped.redb
//! ```
//!
//! `IDEM_TEST_AMQP_URL` (or `AMQP_ADDR`) names the broker (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`).

use lapin::options::ConfirmSelectOptions;
use lapin::{Connection, ConnectionProperties};
use queue_common::{ctrl_c, demo_orders, demo_store, ship_orders};
use worker_rabbitmq::{Error, consume, declare, publish};

const QUEUE: &str = "idem.example.jobs";

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let url = std::env::var("IDEM_TEST_AMQP_URL")
        .or_else(|_| std::env::var("AMQP_ADDR"))
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    declare(&channel, QUEUE).await?;
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("publish") => {
            let count: u64 = args.next().map_or(Ok(100), |n| n.parse())?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            let orders = demo_orders(count);
            for (key, payload) in &orders {
                publish(&channel, QUEUE, Some(key), payload.as_bytes()).await?;
            }
            println!("published {count} jobs ({} messages)", orders.len());
        }
        Some("work") => {
            let (store, label) = demo_store(args)?;
            let (job, tally) = ship_orders(store, label)?;
            println!("working on the {label} store; Ctrl-C to stop");
            consume(&connection, QUEUE, 16, ctrl_c(), job).await?;
            println!("{}", tally.summary());
        }
        _ => {
            eprintln!("usage: worker-rabbitmq publish [COUNT] | work [--redb PATH]");
            std::process::exit(2);
        }
    }
    Ok(())
}
