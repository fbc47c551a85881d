//! Embedded durable file store for idem, on redb.
//!
//! Not yet built: this crate is a placeholder in the workspace layout of the design
//! (DESIGN.md section 2). It re-exports the contract it will implement.
//!
//! ```
//! use idem_store_redb as _;
//! ```

pub use idem_core::Store;
