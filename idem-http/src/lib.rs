//! Idempotency-Key HTTP semantics for idem as a tower Layer.
//!
//! Not yet built: this crate is a placeholder in the workspace layout of the design
//! (DESIGN.md section 2). It re-exports the contract it will implement.
//!
//! ```
//! use idem_http as _;
//! ```

pub use idem_core::Store;
