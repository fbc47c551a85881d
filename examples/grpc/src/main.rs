//! `payments.Payments` behind the idempotency layer on the memory store, with every call
//! requiring an `idempotency-key`.
//!
//! ```text
//! cargo run -p grpc-payments        # gRPC (plain HTTP/2) on 127.0.0.1:50051
//! ```
//!
//! `IDEM_GRPC_LISTEN` sets the address.

use std::sync::Arc;

use grpc_payments::{Payments, config, serve};
use idem_store_memory::MemoryStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = std::env::var("IDEM_GRPC_LISTEN").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("payments.Payments on http://{}", listener.local_addr()?);
    let config = config()?;
    let payments = Arc::new(Payments::default());
    tokio::select! {
        served = serve(listener, payments, MemoryStore::new(), config) => served?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
