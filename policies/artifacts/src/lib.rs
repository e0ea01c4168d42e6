//! The built-in policies as Wasm components, compiled from the crates under
//! `policies/` by this crate's build script (one command builds them all:
//! building this crate).
//!
//! ```
//! let fifo = arbiter_policies::get("fifo").expect("fifo is built in");
//! assert_eq!(&fifo[..4], b"\0asm");
//! assert!(arbiter_policies::names().any(|name| name == "best-fit"));
//! ```
//!
//! What a person types for a policy (`builtin:fifo`, a path, a bare built-in name) is
//! resolved by `arbiter_repro::read_policy`, the one rule every command uses.

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The component bytes of a built-in policy.
pub fn get(name: &str) -> Option<&'static [u8]> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}

/// Names of the built-in policies.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

/// The bytes of a test fixture component (see `policies/fixture-*`).
pub fn fixture(name: &str) -> Option<&'static [u8]> {
    FIXTURES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}
