//! The RabbitMQ worker example: `publish` puts jobs on the queue (a fifth of them twice),
//! `work` consumes them through the guard on the memory store.
//!
//! ```text
//! cargo run -p worker-rabbitmq -- publish 100
//! cargo run -p worker-rabbitmq -- work
//! ```
//!
//! `IDEM_TEST_AMQP_URL` (or `AMQP_ADDR`) names the broker (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`).

use lapin::options::ConfirmSelectOptions;
use lapin::{Connection, ConnectionProperties};
use queue_common::{ctrl_c, demo_orders, ship_orders};
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
            println!("working; Ctrl-C to stop");
            consume(&connection, QUEUE, 16, ctrl_c(), ship_orders()?).await?;
        }
        _ => {
            eprintln!("usage: worker-rabbitmq publish [COUNT] | work");
            std::process::exit(2);
        }
    }
    Ok(())
}
