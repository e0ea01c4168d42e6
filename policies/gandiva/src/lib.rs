//! `gandiva`: Gandiva's packing (Xiao et al., OSDI '18) as AntMan (OSDI '20, §5.1–5.2)
//! compares against it: "greedily schedules jobs to the GPUs with lowest GPU utilization
//! and sufficient GPU memory", without AntMan's performance isolation. Gandiva's migration
//! and time-slicing are left out, as AntMan leaves them out ("orthogonal").
//!
//! * **FIFO** over all jobs (arrival, then index); a job that cannot start waits and the
//!   jobs behind it may go ahead (greedy backfill, like `fifo`).
//! * **Free GPUs first.** A gang that fits on GPUs nothing runs on goes there, on one node
//!   when one has room (the node it fills best), else over the fewest nodes.
//! * **Otherwise pack**: each worker on the least-loaded GPUs that take it — reported
//!   utilization plus what this round's placements add (a whole-GPU worker 100 %), then
//!   fewest residents, then least memory held — below `max_jobs_per_gpu` residents and,
//!   with `memory_check`, with room for the job's declared memory beside the residents'.
//! * **Uncontrolled sharing.** Nothing limits a packed job's memory or compute on the node:
//!   run Gandiva without a coordinator policy (AntMan's Table 2 "Pack", Fig. 12 "packing").
//!
//! ## What the validator lets it pack
//!
//! The policy never changes a job's QoS, so a packed worker must fit the GPU in the
//! account its QoS is charged to ([`Plan`]'s GPU rules), and it packs only where the plan
//! accepts:
//!
//! * sharing on (`oversub-milli` > 0): a qos ≥ 1 worker joins any healthy GPU within the
//!   shared caps (`oversub-milli`, `max-shared-workers`, memory beside guaranteed use
//!   unless the host spills); a qos-0 worker joins a GPU only while its guaranteed use
//!   leaves room — beside shared work, never beside another whole-GPU guaranteed worker;
//! * sharing off: every worker is guaranteed, so only fractional workers (`gpu-milli` <
//!   1000) pack, within the GPU's milli-GPU and memory; whole-GPU jobs get GPUs of their
//!   own.
//!
//! Gandiva oversubscribes GPUs with no notion of QoS; the contract cannot put two
//! guaranteed whole-GPU jobs on one GPU, and we do not relabel jobs to make it.

pub mod config;
pub mod schedule;

use arbiter_policy_sdk::prelude::*;
pub use config::{Config, DEFAULT_CONFIG};

/// The policy: stateless between rounds (everything comes from the view).
#[derive(Clone, Debug, Default)]
pub struct Gandiva {
    cfg: Config,
}

impl Gandiva {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

impl Policy for Gandiva {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "gandiva",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Gandiva packing (AntMan's baseline): FIFO, free GPUs first, else packed onto the least-loaded GPUs with room, no isolation.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        Gandiva::default()
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
        Ok(schedule::schedule(&self.cfg, cluster, round))
    }
}

arbiter_policy_sdk::export_policy!(Gandiva);

#[cfg(test)]
mod tests;
