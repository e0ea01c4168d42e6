//! `arbiter-host`: the host core that every deployment shares — the Wasm
//! policy runtime, policy slots and their generations, the role drivers, and
//! the cluster state they decide over.
//!
//! - [`runtime`]: compile, sandbox and call policy components (deadline,
//!   memory cap, fuel), or a native policy behind the same API.
//! - [`registry`]: slots of generations; hot swap, rollback, quarantine.
//! - [`roles`]: one driver per policy role over one fallback chain
//!   ([`roles::ask_chain`]); each role validates its answer in one place.
//! - [`state`]: [`state::ClusterState`], the truth policies mirror, its
//!   deltas, and the validator ([`state::ClusterState::validate`]).
//! - [`watch`]: a `policies.d/` directory reconciled into slots.
//!
//! Invariants: a round never applies an answer the validator refuses and
//! never goes without one (the native last resort is filtered through the
//! validator); a trapped instance is never re-entered; a quarantined
//! generation is never asked again nor rolled back to. The control plane,
//! the simulator and the node agent call the role drivers here instead of
//! keeping their own fallback or validation logic.
//!
//! ```
//! use arbiter_host::registry::PolicySlot;
//! use arbiter_host::roles::scheduler::{RoundDriver, Served};
//! use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
//! use std::sync::Arc;
//!
//! let mut state = ClusterState::new();
//! state.add_node(NodeRequest::gpus("n0", "default", "A100", 81_920, 8)).unwrap();
//! state.submit(JobRequest::gpus("train", "team-a", 1, 4)).unwrap();
//! // An empty slot: the native built-in answers, and its answer is valid.
//! let mut driver = RoundDriver::new(Arc::new(PolicySlot::new("default")));
//! let report = driver.run_round(&mut state);
//! assert_eq!(report.served, Served::Native);
//! assert_eq!(report.applied.started.len(), 1);
//! ```

pub mod files;
pub mod registry;
pub mod roles;
pub mod runtime;
pub mod state;
pub mod watch;
