//! `elastic-share`: DynamoML's elastic GPU sharing (CLOSER '21 §3.1) as a node-local
//! `coordinator` policy.
//!
//! A workload on a shared GPU carries a share request and limit (contract 0.3
//! `workload-status.request-permille` / `limit-permille`, sent by the host from the job's
//! `gpu-milli` and `gpu-milli-limit`). Every control period this policy sets each workload's
//! compute share (`set-compute-share`, enforced by the interposer's launch pacing) so that
//!
//! * a workload that is launching gets at least its request — guaranteed;
//! * capacity its owner leaves idle flows to neighbours that want more, up to their limits —
//!   work-conserving;
//! * and comes back on the next period once the owner launches again.
//!
//! Demand is read from the counters the interposer reports: no launches for `idle_periods`
//! periods is **idle**; pacing delay above `throttled_delay_pct` of the period is
//! **throttled** (the pacer made it wait: it would use more); anything else is **satisfied**.
//! The arithmetic is in [`allocate`](mod@allocate).
//!
//! **How this compares with DynamoML's mechanism.** DynamoML (through KubeShare/Gemini)
//! blocks intercepted calls until a token arrives and passes the token among containers in
//! time slices sized by their demand. Ours does not hand over the GPU in slices: each
//! workload's launches are spaced so that its device time stays within its share, and the
//! shares are re-divided every control period. The bounds hold the same way — a workload
//! cannot exceed its share (the pacer), its request is never lent away while it is active —
//! but the reaction to an owner coming back is one control period (100 ms by default), not
//! one token slice, and the share of device time is approximate where kernels of different
//! workloads overlap on the GPU. Capacity an active owner leaves unused below its request is
//! not lent (the view has no per-workload utilization); capacity of idle owners and of
//! unrequested GPU is.
//!
//! Workloads whose request is the whole GPU are left alone (nothing to share); while active
//! they leave nothing to lend either.

pub mod allocate;
pub mod config;

use allocate::{Claim, Demand, GPU_PERMILLE, allocate};
use arbiter_policy_sdk::prelude::*;
use config::Config;
use std::collections::BTreeMap;

pub use config::DEFAULT_CONFIG;

/// What the policy remembers of a workload between periods.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    launches: u64,
    pacing_delay_us: u64,
    /// Consecutive periods without a launch.
    quiet_periods: u32,
}

/// The policy.
#[derive(Clone, Debug, Default)]
pub struct ElasticShare {
    config: Config,
    seen: BTreeMap<u32, Seen>,
    last_monotonic_ms: Option<u64>,
}

impl ElasticShare {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the workload did since the last period (and remember its counters).
    fn demand(&mut self, w: &WorkloadStatus, period_ms: u64) -> Demand {
        let prev = self.seen.get(&w.id).copied();
        let entry = self.seen.entry(w.id).or_default();
        entry.launches = w.launches;
        entry.pacing_delay_us = w.pacing_delay_us;
        let Some(prev) = prev else {
            // First sight: nothing to compare with; it keeps its share within its bounds.
            return Demand::Satisfied;
        };
        if w.frozen || w.launches <= prev.launches {
            entry.quiet_periods = entry.quiet_periods.saturating_add(1);
        } else {
            entry.quiet_periods = 0;
        }
        if entry.quiet_periods >= self.config.idle_periods {
            return Demand::Idle;
        }
        let waited_us = w.pacing_delay_us.saturating_sub(prev.pacing_delay_us);
        let period_us = period_ms.max(1) * 1000;
        if waited_us as f64 >= period_us as f64 * self.config.throttled_delay_pct / 100.0
            && waited_us > 0
        {
            Demand::Throttled
        } else {
            Demand::Satisfied
        }
    }
}

impl Policy for ElasticShare {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "elastic-share",
            env!("CARGO_PKG_VERSION"),
            &[Role::Coordinator],
            "DynamoML elastic GPU sharing: compute shares within (request, limit), idle share lent to busy neighbours and returned.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        ElasticShare::default()
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        self.config = Config::parse(config).map_err(PolicyError::Failed)?;
        Ok(())
    }

    fn tick(&mut self, view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        // A host before contract 0.3 sends no monotonic clock: use the wall clock then.
        let now = match view.monotonic_ms {
            0 => view.now_ms,
            t => t,
        };
        let period_ms = self
            .last_monotonic_ms
            .map_or(self.config.nominal_period_ms, |t| now.saturating_sub(t));
        self.last_monotonic_ms = Some(now);

        let mut by_gpu: BTreeMap<u32, Vec<&WorkloadStatus>> = BTreeMap::new();
        for w in &view.workloads {
            by_gpu.entry(w.gpu).or_default().push(w);
        }
        self.seen
            .retain(|id, _| view.workloads.iter().any(|w| w.id == *id));

        let mut out = Vec::new();
        for list in by_gpu.values_mut() {
            list.sort_by_key(|w| w.id);
            list.dedup_by_key(|w| w.id);
            // Whole-GPU workloads are claims too (an active one leaves nothing to lend), but
            // never get an action.
            let claims: Vec<Claim> = list
                .iter()
                .map(|w| Claim {
                    id: w.id,
                    request: w.request_permille,
                    limit: w.limit_permille,
                    current: w.compute_share,
                    guaranteed: w.qos == qos::GUARANTEED,
                    demand: self.demand(w, period_ms),
                })
                .collect();
            for (c, share) in claims.iter().zip(allocate(&claims)) {
                if c.request >= GPU_PERMILLE {
                    continue;
                }
                let to_request = share == c.request.min(GPU_PERMILLE);
                if share != c.current
                    && (to_request || share.abs_diff(c.current) >= self.config.min_step)
                {
                    out.push(NodeAction::SetComputeShare(c.id, share));
                }
            }
        }
        Ok(out)
    }
}

arbiter_policy_sdk::export_policy!(ElasticShare);

#[cfg(test)]
mod tests;
