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
//!
//! ## Co-location by QoS (contract 0.3)
//!
//! With the operator's sharing rules on, an opportunistic job may join a GPU
//! a guaranteed job holds; the same [`Plan`] checks it (healthy GPU, the
//! shared caps, memory beside guaranteed use unless the host spills):
//!
//! ```
//! use arbiter_policy_sdk::prelude::*;
//!
//! let mut c = TestCluster::new();
//! c.node("n0", "p", 64_000, 512_000, "V100M32", 32_768, 1);
//! c.sharing(SharingRules { oversub_milli: 1000, max_shared_workers: 1, host_spill: true });
//! let guaranteed = c.job_on_one_gpu("resnet", "a", qos::GUARANTEED, 1000, 30_720);
//! let opportunistic = c.job_on_one_gpu("gcn", "b", qos::OPPORTUNISTIC, 1000, 3_584);
//! let on_gpu_0 = || vec![WorkerPlacement { node: 0, gpus: vec![0] }];
//! let another = c.job_on_one_gpu("bert", "a", qos::GUARANTEED, 1000, 0);
//! let mut plan = Plan::new(c.cluster());
//! plan.apply(Decision::Place(guaranteed, on_gpu_0())).unwrap();
//! plan.apply(Decision::Place(opportunistic, on_gpu_0())).unwrap();
//! // A second guaranteed job on the same GPU is genuinely impossible.
//! assert!(!plan.gpu_fits(another, 0));
//! assert!(plan.apply(Decision::Place(another, on_gpu_0())).is_err());
//! ```
//!
//! ## The other roles
//!
//! A `matcher` pairs offline jobs with online ones on one of the online
//! job's GPUs (the host turns each pairing into a validated placement); a
//! `coordinator` acts on one node's workloads; a `tenant` policy orders its
//! own queue; a `reclaim` policy picks servers to return. Each is one method
//! of [`Policy`], tested natively the same way:
//!
//! ```
//! use arbiter_policy_sdk::prelude::*;
//!
//! struct Roles;
//!
//! impl Policy for Roles {
//!     fn manifest() -> Manifest {
//!         manifest("roles", "0.1.0",
//!             &[Role::Matcher, Role::Coordinator, Role::Tenant, Role::Reclaim], "One of each.")
//!     }
//!     fn create() -> Self {
//!         Roles
//!     }
//!     // Matcher: the first offline job beside the first online job, on its first GPU.
//!     fn match_workloads(&mut self, cluster: &Cluster, r: &MatchRequest)
//!         -> Result<Vec<Pairing>, PolicyError> {
//!         let (Some(&online), Some(&offline)) = (r.online.first(), r.offline.first()) else {
//!             return Ok(Vec::new());
//!         };
//!         let Some(gpu) = cluster.job(online).placement().first().and_then(|w| w.gpus.first()) else {
//!             return Ok(Vec::new());
//!         };
//!         Ok(vec![Pairing { online, offline, gpu: *gpu, sm_percent: 30 }])
//!     }
//!     // Coordinator: offline workloads run at a fifth of the GPU.
//!     fn tick(&mut self, view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
//!         Ok(view.workloads.iter()
//!             .filter(|w| w.role == workload_role::OFFLINE && w.compute_share != 200)
//!             .map(|w| NodeAction::SetComputeShare(w.id, 200))
//!             .collect())
//!     }
//!     // Tenant: shortest estimate first, nothing held back.
//!     fn order(&mut self, view: &TenantView) -> Result<TenantVerdict, PolicyError> {
//!         let mut pending: Vec<&TenantJob> = view.jobs.iter().filter(|j| !j.running).collect();
//!         pending.sort_by_key(|j| (j.estimate_ms, j.position));
//!         Ok(TenantVerdict { order: pending.iter().map(|j| j.position).collect(), hold: Vec::new() })
//!     }
//!     // Reclaim: the first `count` candidates, preempting what runs there.
//!     fn reclaim(&mut self, cluster: &Cluster, r: &ReclaimRequest)
//!         -> Result<ReclaimPlan, PolicyError> {
//!         let nodes: Vec<u32> = r.candidates.iter().copied().take(r.count as usize).collect();
//!         let mut decisions: Vec<Decision> = nodes.iter()
//!             .flat_map(|&n| cluster.jobs_on(n).map(|j| Decision::Preempt(j.index())))
//!             .collect();
//!         decisions.dedup();
//!         Ok(ReclaimPlan { nodes, decisions })
//!     }
//! }
//!
//! let mut c = TestCluster::new();
//! c.node("n0", "p", 64_000, 512_000, "T4", 16_384, 2);
//! c.sharing(SharingRules { oversub_milli: 1000, max_shared_workers: 1, host_spill: false });
//! let online = c.job_on_one_gpu("serve", "a", qos::GUARANTEED, 1000, 0);
//! c.run(online, vec![WorkerPlacement { node: 0, gpus: vec![1] }]);
//! let offline = c.job_on_one_gpu("train", "b", qos::BEST_EFFORT, 300, 0);
//! let mut rt = Runtime::<Roles>::new();
//! rt.resync(c.snapshot()).unwrap();
//! let request = MatchRequest { epoch: 0, online: vec![online], offline: vec![offline], profiles: Vec::new() };
//! assert_eq!(rt.match_workloads(request).unwrap()[0].gpu, 1);
//!
//! let view = NodeView {
//!     workloads: vec![WorkloadStatus { id: 7, role: workload_role::OFFLINE, compute_share: 1000, ..Default::default() }],
//!     ..Default::default()
//! };
//! assert_eq!(rt.tick(view).unwrap(), vec![NodeAction::SetComputeShare(7, 200)]);
//!
//! let job = |position, estimate_ms| TenantJob { position, estimate_ms, ..Default::default() };
//! let tenant = TenantView { jobs: vec![job(0, 900), job(1, 100)], ..Default::default() };
//! assert_eq!(rt.order(tenant).unwrap().order, vec![1, 0]);
//!
//! let plan = rt.reclaim(ReclaimRequest { epoch: 0, candidates: vec![0], count: 1, max_decisions: 10 }).unwrap();
//! assert_eq!(plan.decisions, vec![Decision::Preempt(online)]);
//! ```

pub mod cluster;
pub mod convert;
pub mod model;
pub mod node_order;
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
