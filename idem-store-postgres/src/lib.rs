//! PostgreSQL store for idem.
//!
//! Not yet built: this crate is a placeholder in the workspace layout of the design
//! (DESIGN.md section 2). It re-exports the contract it will implement.
//!
//! ```
//! use idem_store_postgres as _;
//! ```

pub use idem_core::Store;
