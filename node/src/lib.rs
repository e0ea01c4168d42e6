//! `arbiter-node`: the node enforcer (see `ARCHITECTURE.md`, "node").
//!
//! Module map:
//! * [`agent`] — the node agent: the gRPC link to the control plane (`arbiter node`);
//! * [`gpu`] — the [`gpu::GpuBackend`] trait, sample types and the simulated
//!   backend; [`nvml`] — the NVML backend (`nvml-wrapper`);
//! * [`mps`] — one `nvidia-cuda-mps-control` daemon per GPU behind [`mps::MpsControl`];
//! * [`supervisor`] — launch under `LD_PRELOAD` of the interposer with a per-workload control
//!   block, persist, adopt after a restart, reap, evict;
//! * [`coordinator`] — the node-local policy runtime: a `coordinator` policy (Wasm through
//!   `arbiter_host::runtime`, or native) run every control period against the [`Node`], its
//!   answers validated before they are applied, a native fallback after repeated faults;
//! * [`enforcer`] — the node-local policy data path: [`Node::view`](enforcer::Node::view)
//!   builds the SDK's `NodeView`, [`Node::apply_actions`](enforcer::Node::apply_actions)
//!   carries out `NodeAction`s;
//! * [`policies_dir`] — the node's watched directory (`coordinator.wasm` hot-swapped into the
//!   coordinator's slot through the host core's `PolicyDirectory`);
//! * [`procfs`] — process identity (`/proc/<pid>/stat`) and signals.
//! * [`hostload`] — host memory, swap-in rate and CPU use from `/proc` for the node view.
//!
//! The crate has no `unsafe`: NVML goes through `nvml-wrapper`, the control block through
//! `arbiter_interpose::control`, signals through `rustix`.

#![forbid(unsafe_code)]

pub mod agent;
pub mod coordinator;
pub mod enforcer;
pub mod gpu;
pub mod hostload;
pub mod jobstats;
pub mod mps;
pub mod nvml;
pub mod policies_dir;
pub mod procfs;
pub mod supervisor;

pub use agent::{AgentConfig, run_agent};
pub use coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, StepReport};
pub use enforcer::{ActionError, ActionOutcome, Applied, Node, NodeConfig};
pub use gpu::{GpuBackend, GpuError, SimBackend};
pub use mps::{MpsConfig, MpsControl, MpsManager};
pub use nvml::NvmlBackend;
pub use supervisor::{ShareTerms, Supervisor, SupervisorConfig, WorkloadSpec};
