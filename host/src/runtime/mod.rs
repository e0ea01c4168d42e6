//! The Wasm policy runtime: one engine, compiled components, sandboxed instances.
//!
//! Invariants:
//! * one [`wasmtime::Engine`] per host; compiled artifacts are cached on disk
//!   by wasmtime's cache (keyed by the component's hash and the engine's
//!   compiler settings) and in memory by sha256;
//! * every guest call runs under a wall-clock deadline (epoch interruption,
//!   ticked by a host thread) and a memory cap (`StoreLimits`);
//! * after any fault an instance is discarded, never re-entered.

pub mod bindings;
mod contract;
mod engine;
mod fault;
mod inspect;
mod instance;
mod ticker;

pub use contract::SERVED_VERSIONS;
pub use engine::{CompiledPolicy, PolicyEngine, RuntimeConfig};
pub use fault::PolicyFault;
pub use inspect::{ImportClass, Inspection, inspect_component};
pub use instance::{CallStats, NativePolicy, PolicyInstance};
