//! AntMan (Xiao et al., OSDI '20) on Arbiter: the global scheduler and the local
//! coordinator as one policy body with two roles.
//!
//! * `scheduler` ([`scheduler`]): Algorithm 1 with the §3.3 policies — per-tenant queues
//!   with fairness first, guarantee gangs placed on GPUs free of guaranteed work (one node
//!   when the job's locality asks for it), GPU-granular reservations for a gang that does not
//!   fit yet, opportunistic jobs on the least-loaded GPUs below the utilization threshold M
//!   (reserved GPUs included), long-queued jobs without quota run as opportunistic, and the
//!   all-or-nothing upgrade of an opportunistic job to guaranteed.
//! * `coordinator` ([`coordinator`]): per GPU, the opportunistic workloads' memory and SM
//!   held down when a guaranteed workload arrives, their SM share raised step by step while
//!   its mini-batch time holds and cut at once when it does not, memory moved to a
//!   guaranteed workload that surges, and memory shared by trial among opportunistic
//!   workloads alone.
//!
//! AntMan needs the operator's sharing rules on (`sharing-rules.oversub-milli` > 0, `arbiter
//! serve --oversub-milli`): that is what lets an opportunistic worker join a GPU a
//! guaranteed one holds and keeps it off its tenant's quota. With sharing off every worker
//! is guaranteed (contract 0.2 semantics): the scheduler still places quota-fair gangs with
//! reservations and puts qos ≥ 1 work on the least-loaded GPUs that have room, but neither
//! runs quota-less jobs as opportunistic nor upgrades.
//!
//! The paper's one number is M = 80 % over the last 10 s; everything else is a documented
//! parameter of ours ([`config`]).

pub mod config;
pub mod coordinator;
pub mod quota;
pub mod scheduler;

use arbiter_policy_sdk::prelude::*;
pub use config::{Config, CoordinatorConfig, DEFAULT_CONFIG, SchedulerConfig, Throttle};
pub use coordinator::Coordinator;

#[doc(hidden)]
pub use arbiter_policy_sdk as __sdk;

/// The policy: the scheduler is stateless; the coordinator keeps per-GPU state.
#[derive(Clone, Debug, Default)]
pub struct AntMan {
    cfg: Config,
    coordinator: Coordinator,
}

impl AntMan {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The coordinator's state (for inspection in tests and tools).
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }
}

impl Policy for AntMan {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "antman",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler, Role::Coordinator],
            "AntMan: quota-fair guarantee gangs with GPU reservations, opportunistic jobs on the least-loaded GPUs, upgrades; node-local memory and SM control of opportunistic work.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        AntMan::default()
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        self.cfg = Config::parse(config)?;
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(scheduler::schedule(&self.cfg.scheduler, cluster, round))
    }

    fn tick(&mut self, view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        Ok(self.coordinator.tick(&self.cfg.coordinator, view))
    }
}

#[cfg(test)]
mod tests;
