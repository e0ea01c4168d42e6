//! Arbiter host.
