//! # Shared logic of the FGD-paper placement policies
//!
//! The six policies compared by Weng et al., "Beware of Fragmentation:
//! Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
//! (USENIX ATC'23) — Random, DotProd, GpuClustering, GpuPacking, BestFit and
//! FGD — differ only in how they score a candidate placement. This crate holds
//! everything else, once:
//!
//! * [`Task`]: one worker's request; [`node_candidates`]: the feasible
//!   (node, GPU set) choices for it under a [`GpuSelection`];
//! * [`PlacementRule`] + [`Greedy`]: the one-by-one greedy driver (arrival
//!   order, best candidate per worker, seeded tie-breaking) as an SDK policy;
//! * [`TargetWorkload`]: the task classes and popularity the fragmentation is
//!   measured against, built from a trace with [`TargetWorkload::from_tasks`]
//!   and passed to the FGD policy as configuration ([`fgd_config`]);
//! * [`node_fragmentation`] (the definition) and [`FragIndex`] (the same
//!   measure, cached per node and updated only where a placement lands);
//! * [`SplitMix64`]: the deterministic generator behind `seed`;
//! * [`testing`]: helpers for the policies' unit tests.
//!
//! This is a library, not a policy: it exports no component.
//!
//! ## Configuration (TOML), common to the six policies
//!
//! ```toml
//! seed = 42             # tie-breaking (and Random's choices)
//! tie_break = "node-order"  # the first tied node of a node order shuffled
//!                           # with the seed (the reference simulator's rule);
//!                           # "random": uniform among ties; "first": lowest index
//! ```

pub mod driver;
pub mod frag;
pub mod task;
pub mod testing;
pub mod workload;

/// The generator lives in the SDK so the simulator's task order and the
/// policies' tie-breaking share one definition.
pub use arbiter_policy_sdk::rng::SplitMix64;
pub use driver::{
    COMMON_KEYS, DEFAULT_SEED, Greedy, PlacementRule, Search, TieBreak, Ties, best_candidate,
    config_error, take_key,
};
pub use frag::{FragIndex, node_fragmentation};
pub use task::{GpuSelection, Task, fitting_gpus, node_admits, node_candidates};
pub use workload::{DEFAULT_POPULARITY, TargetWorkload, TaskClass, TaskShape, fgd_config};

/// The reference simulator normalises CPU by this node size (128 cores)…
pub const MAX_SPEC_CPU_MILLI: f64 = 128_000.0;
/// …and GPU by this one (8 GPUs), in `DotProd` and `BestFit` scores.
pub const MAX_SPEC_GPU_MILLI: f64 = 8_000.0;

/// Kubernetes' score range, which the reference scores are expressed in.
pub const MAX_NODE_SCORE: i64 = 100;
