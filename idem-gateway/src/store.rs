//! Opens the store the configuration names, as an `Arc<dyn Store>`.

use std::sync::Arc;

use idem_core::Store;
use idem_store_memory::MemoryStore;

use crate::commands::Failure;
use crate::config::{ConfigError, StoreConfig, StoreSpec};

/// Opens (connects to) the store.
///
/// # Errors
/// [`Failure::Config`] (exit 2) when this build has no such store; [`Failure::Runtime`] when
/// the store cannot be reached.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn Store>, Failure> {
    match &config.spec {
        StoreSpec::Memory => Ok(Arc::new(
            MemoryStore::builder()
                .capacity(config.memory_capacity)
                .build(),
        )),
        other => Err(Failure::Config(unavailable(other))),
    }
}

/// The error for a store this build cannot open.
fn unavailable(spec: &StoreSpec) -> ConfigError {
    let kind = spec.kind();
    ConfigError::new(
        Some("store".to_owned()),
        format!(
            "the {kind} store is not available in this build of idem: build it with `cargo build --release -p idem-gateway --features {kind}`"
        ),
    )
}
