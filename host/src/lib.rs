//! Arbiter host.
pub mod runtime;
pub mod state;
