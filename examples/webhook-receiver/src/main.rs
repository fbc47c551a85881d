//! The webhook receiver on the memory store, with a demo processor that takes 2 s per event.
//!
//! ```text
//! cargo run -p webhook-receiver
//! curl -i -X POST localhost:3000/webhooks/shop -H 'X-Event-Id: evt_1' -d '{"amount":10}'   # 202
//! curl -i -X POST localhost:3000/webhooks/shop -H 'X-Event-Id: evt_1' -d '{"amount":10}'   # 409, then 200 (replay)
//! ```
//!
//! `IDEM_WEBHOOK_LISTEN` sets the address (default `127.0.0.1:3000`).

use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use idem_store_memory::MemoryStore;
use idem_worker::JobGuard;
use webhook_receiver::{Config, app, processor};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let listen =
        std::env::var("IDEM_WEBHOOK_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("webhook")
        .store_label("memory")
        .build()?;
    let process = processor(|event, ctx| async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(serde_json::json!({
            "processed": event.id,
            "source": event.source,
            "fence": ctx.fence().get(),
        }))
    });
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("webhook receiver on http://{}", listener.local_addr()?);
    // As a production server does (the guard's answers do not depend on it).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app(guard, Config::default(), process))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
