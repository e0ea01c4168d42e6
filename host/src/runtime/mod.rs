//! The Wasm policy runtime: one engine, compiled components, sandboxed instances.
//!
//! Invariants:
//! * one [`wasmtime::Engine`] per host; compiled artifacts are cached on disk
//!   by wasmtime's cache (keyed by the component's hash and the engine's
//!   compiler settings) and in memory by sha256;
//! * every guest call runs under a wall-clock deadline (epoch interruption,
//!   ticked by a host thread) and a memory budget over all its memories and
//!   tables (`budget.rs`);
//! * compilation is bounded before it starts (`CompileLimits`), and only
//!   components that passed every check are cached;
//! * text from a guest is bounded and escaped where it enters (`guest_text`);
//! * after any fault an instance is discarded, never re-entered.

pub mod bindings;
mod budget;
mod contract;
mod engine;
mod fault;
mod guest_text;
mod inspect;
mod instance;
mod ticker;

pub use budget::{BudgetExceeded, MemoryAccount, TABLE_ELEMENT_BYTES};
pub use contract::SERVED_VERSIONS;
pub use engine::{CompiledPolicy, PolicyEngine, RuntimeConfig};
pub use fault::{FaultLimits, PolicyFault};
pub use guest_text::{MAX_ERROR_TEXT, MAX_NAME_TEXT, guest_text, is_plain};
pub use inspect::{CodeStats, CompileLimits, ImportClass, Inspection, inspect_component};
pub use instance::{CallStats, NativePolicy, PolicyInstance};
