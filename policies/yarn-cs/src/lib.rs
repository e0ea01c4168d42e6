//! `yarn-cs`: Apache YARN's capacity scheduler as AntMan (Xiao et al., OSDI '20, §5.2) uses
//! it as its production baseline ("YARN-CS", the scheduler of Microsoft's Philly), with the
//! optional preemption of its "YARN-CS-preempt" run.
//!
//! * **Queues.** One queue per tenant, FIFO within it (priority, then arrival, as YARN's
//!   FIFO ordering policy compares them). A queue's head blocks the jobs behind it: a gang
//!   starts only when all its GPUs fit.
//! * **Capacity.** A tenant's capacity is its quota row (`tenants` in the view, milli-GPU);
//!   a tenant without a row has capacity 0: it runs only on GPUs nobody within capacity
//!   wants (the paper's quota-less Tenant-B). A tenant's use is every GPU its running jobs
//!   hold, whatever their QoS: YARN knows no sharing.
//! * **Fairest queue first.** Jobs within their tenant's capacity go first, the queue with
//!   the lowest used/capacity next, one job at a time; then, if no such job waits for GPUs
//!   (`hold_idle_for_quota`), jobs beyond their tenant's capacity borrow idle GPUs
//!   (elastic capacity), again lowest used/capacity first, tenants without capacity last.
//! * **Exclusive whole GPUs.** A worker gets GPUs nothing runs on (no guaranteed *and* no
//!   shared work), whatever the sharing rules would allow, and nothing is placed beside it
//!   later. A fractional request still gets a GPU of its own.
//! * **Locality.** A gang goes on one node when one has room (the node it fills best),
//!   otherwise over as few nodes as possible (fullest first); a job that requires one node
//!   waits for one.
//! * **Preemption** (`preemption = true`): see [`schedule`].
//!
//! ## The contract's accounts
//!
//! YARN-CS lets a tenant exceed its quota; the validator's quota is a hard cap on work
//! charged as guaranteed. So the account a placement is charged to follows YARN's notion:
//! with sharing on (`oversub-milli` > 0), a job within its tenant's capacity is placed as
//! guaranteed work (`set-qos(job, 0)` first if it was submitted with qos ≥ 1), and a job
//! beyond it keeps its own QoS where the validator takes it that way — qos ≥ 1 work is
//! charged to the shared account, a qos-0 job of a tenant without a quota row is unlimited
//! — and otherwise moves to the other account (`set-qos`) for that placement. Either way it
//! holds whole GPUs alone. With sharing off every worker is guaranteed and counts toward the
//! validator's quota, so a tenant *with* a quota row cannot borrow beyond it: such a job
//! waits (the one part of YARN-CS's elasticity the contract cannot express without sharing).

pub mod config;
pub mod schedule;

use arbiter_policy_sdk::prelude::*;
pub use config::{Config, DEFAULT_CONFIG};

/// The policy: stateless between rounds (everything comes from the view).
#[derive(Clone, Debug, Default)]
pub struct YarnCs {
    cfg: Config,
}

impl YarnCs {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

impl Policy for YarnCs {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "yarn-cs",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "YARN capacity scheduler (AntMan's production baseline): per-tenant FIFO queues, fairest queue first, exclusive whole GPUs, elastic capacity on idle GPUs, optional preemption of over-quota work.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        YarnCs::default()
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

arbiter_policy_sdk::export_policy!(YarnCs);

#[cfg(test)]
mod tests;
