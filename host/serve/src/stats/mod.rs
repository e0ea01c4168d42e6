//! Experiment statistics: per-arm metrics whose intervals hold for
//! correlated samples ([`batch`]), the candidate-minus-control comparison
//! and its always-valid p-value ([`compare`]), balanced randomised
//! assignment with its sample-ratio check ([`assign`]), what an arm
//! measures and the guardrail's look ([`arms`]); and the fragmentation
//! measure the arms report.

pub mod arms;
pub mod assign;
pub mod batch;
pub mod compare;
pub mod dist;

pub use arms::{ArmStats, Comparison, JobStats, RoundStats, Verdict, look};
pub use assign::{Assigner, Balance, SRM_ALERT_P};
pub use batch::{BatchMeans, Estimate};
pub use compare::{AlwaysValidP, Difference};

use arbiter_policy_sdk::cluster::Cluster;
use arbiter_policy_sdk::plan::Plan;

/// Share of free GPU capacity that is stranded, in percent: free milli-GPU on
/// partly used GPUs, plus idle GPUs on nodes with fewer idle GPUs than
/// `demand` (GPUs per worker of the most demanding pending job, at least 1).
/// Measured on `plan`, i.e. after the decisions applied to it.
pub fn fragmentation_pct(plan: &Plan<'_>, demand: u32) -> f64 {
    let cluster = plan.cluster();
    let (mut free, mut stranded) = (0u64, 0u64);
    for node in cluster.nodes().filter(|n| n.is_ready()) {
        let idle = plan.node_idle_gpus(node.index());
        for gpu in node.gpu_range() {
            let f = u64::from(plan.free_milli(gpu));
            free += f;
            let whole = f == u64::from(arbiter_policy_sdk::model::FULL_GPU_MILLI);
            if !whole || idle < demand.max(1) {
                stranded += f;
            }
        }
    }
    if free == 0 {
        0.0
    } else {
        100.0 * stranded as f64 / free as f64
    }
}

/// GPUs per worker of the most demanding pending job (at least 1).
pub fn pending_demand(cluster: &Cluster) -> u32 {
    cluster
        .pending_jobs()
        .map(|j| j.gpus_per_worker())
        .max()
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::testing::TestCluster;

    #[test]
    fn fragmentation_counts_partial_gpus_and_short_nodes() {
        // Two nodes with two GPUs each; half a GPU used on node 0.
        let mut tc = TestCluster::new();
        tc.node("n0", "p", 64_000, 256_000, "A100", 80_000, 2);
        tc.node("n1", "p", 64_000, 256_000, "A100", 80_000, 2);
        let job = tc.job_spec(arbiter_policy_sdk::model::JobSpec {
            workers: 1,
            min_workers: 1,
            max_workers: 1,
            gpus_per_worker: 1,
            gpu_milli: 500,
            ..Default::default()
        });
        tc.run(
            job,
            vec![arbiter_policy_sdk::model::WorkerPlacement {
                node: 0,
                gpus: vec![0],
            }],
        );
        let cluster = tc.cluster();
        let plan = Plan::new(cluster);
        // Free: 500 (partial) + 1000 (n0 idle) + 2000 (n1) = 3500.
        // demand 1: only the partial 500 is stranded.
        assert!((fragmentation_pct(&plan, 1) - 100.0 * 500.0 / 3500.0).abs() < 1e-9);
        // demand 2: node 0's single idle GPU is stranded too.
        assert!((fragmentation_pct(&plan, 2) - 100.0 * 1500.0 / 3500.0).abs() < 1e-9);
    }
}
