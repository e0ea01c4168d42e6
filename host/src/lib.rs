//! Arbiter host.
pub mod registry;
pub mod rounds;
pub mod runtime;
pub mod state;
pub mod watch;
