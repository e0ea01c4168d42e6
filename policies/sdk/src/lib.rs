//! # Arbiter policy SDK
//!
//! Write a GPU-cluster policy in plain Rust; build it for `wasm32-wasip2`;
//! drop the `.wasm` into an Arbiter host.
//!
//! The host sends a policy one columnar snapshot of the cluster and then a
//! small delta per round (see `wit/policy.wit`). This crate keeps the mirror
//! ([`Cluster`]) up to date from those, so a policy only ever sees a
//! ready-to-query cluster, and gives it a [`Plan`] to build decisions that
//! cannot overcommit anything.
//!
//! ## A first-fit scheduler in a screenful
//!
//! ```
//! use arbiter_policy_sdk::prelude::*;
//!
//! struct FirstFit;
//!
//! impl Policy for FirstFit {
//!     fn manifest() -> Manifest {
//!         manifest("first-fit", "0.1.0", &[Role::Scheduler], "Oldest job first, first node that fits.")
//!     }
//!     fn create() -> Self {
//!         FirstFit
//!     }
//!     fn schedule(&mut self, cluster: &Cluster, round: &RoundInfo) -> Result<Vec<Decision>, PolicyError> {
//!         let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
//!         let mut pending: Vec<_> = cluster.pending_jobs().collect();
//!         pending.sort_by_key(|j| (j.submit_ms(), j.index()));
//!         // Each worker goes to the first node with room; a gang gets all its
//!         // workers or waits for a later round.
//!         plan.place_each(pending, |plan, job| plan.first_fit_anywhere(job.index()));
//!         Ok(plan.into_decisions())
//!     }
//! }
//!
//! // In a policy crate: `arbiter_policy_sdk::export_policy!(FirstFit);`
//!
//! // The same policy runs natively too, which is how it is tested:
//! let mut cluster = TestCluster::new();
//! let node = cluster.node("n0", "default", 32_000, 256_000, "A100", 81_920, 8);
//! let job = cluster.job("train", "team-a", 2, 4);
//! let mut runtime = Runtime::<FirstFit>::new();
//! runtime.resync(cluster.snapshot()).unwrap();
//! let decisions = runtime.schedule(cluster.round(100)).unwrap();
//! assert_eq!(decisions.len(), 1);
//! assert!(matches!(&decisions[0], Decision::Place(j, w) if *j == job && w.len() == 2 && w[0].node == node));
//! ```
//!
//! Export it with [`export_policy!`]; build with
//! `cargo build --target wasm32-wasip2 --profile policy` (see `docs/writing-policies.md`).

pub mod cluster;
pub mod convert;
pub mod model;
pub mod plan;
pub mod rng;
pub mod runtime;
pub mod testing;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod guest;

pub use cluster::{Cluster, Gpu, Job, MirrorError, Node};
pub use model::*;
pub use plan::{DecisionError, JobFit, Plan};
pub use runtime::{Policy, Runtime};

/// Everything a policy author needs, in one import.
pub mod prelude {
    pub use crate::cluster::{Cluster, Gpu, Job, Node};
    pub use crate::model::*;
    pub use crate::plan::{DecisionError, JobFit, Plan};
    pub use crate::runtime::{Policy, Runtime};
    pub use crate::testing::TestCluster;
    pub use crate::{LogLevel, log, manifest};
}

/// Severity of a [`log`] line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Logs through the host. In a component the host records the line with the
/// policy's name and generation; natively (the host's built-in policies, tests)
/// warnings and errors go to standard error.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    guest::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    if level >= LogLevel::Warn {
        eprintln!("[policy {level:?}] {message}");
    }
}

/// Builds a [`Manifest`] with an empty default configuration.
pub fn manifest(name: &str, version: &str, roles: &[Role], description: &str) -> Manifest {
    Manifest {
        name: name.into(),
        version: version.into(),
        roles: roles.iter().map(|r| r.as_str().to_string()).collect(),
        description: description.into(),
        default_config: String::new(),
    }
}

/// Exports a [`Policy`] type as the component's implementation of the
/// `arbiter:policy/policy` world. Does nothing when not building for `wasm32`,
/// so the same crate also builds natively for tests and benchmarks.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type ArbiterPolicyExport = $crate::guest::Export<$policy>;
            $crate::guest::bindings::export_policy_world!(
                ArbiterPolicyExport with_types_in $crate::guest::bindings
            );
        };
    };
}
