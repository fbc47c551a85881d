//! Job guard for queue consumers and webhook receivers, on idem.
//!
//! Not yet built: this crate is a placeholder in the workspace layout of the design
//! (DESIGN.md section 2). It re-exports the contract it will implement.
//!
//! ```
//! use idem_worker as _;
//! ```

pub use idem_core::Store;
