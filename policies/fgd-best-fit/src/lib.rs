//! `fgd-best-fit`: the FGD paper's BestFit baseline (distinct from the
//! generic `best-fit` policy): the node whose free CPU and GPU are left
//! smallest by the task, each normalised by the largest node spec (128 CPUs,
//! 8 GPUs) and weighted equally. Score, as in the reference simulator:
//! `⌊100 · (1 − ½ (cpu_free − cpu)/128000 − ½ (gpu_free − gpu)/8000)⌋`.
//! (The reference also min-max normalises scores over the nodes; with
//! integer scores in 0..=100 that keeps the set of best nodes unchanged, so
//! it is left out.) Within the node a sharing task takes the fitting GPU
//! with the least free capacity.

use arbiter_placement_core::{
    Greedy, MAX_NODE_SCORE, MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PlacementRule, Task,
};
use arbiter_policy_sdk::prelude::*;

pub struct FgdBestFitRule;

/// The reference's score of one node, from its free resources before the placement.
pub fn best_fit_score(cpu_free: u32, gpu_free_total: u32, task: &Task) -> i64 {
    let cpu_left = f64::from(cpu_free) - f64::from(task.cpu_milli);
    let gpu_left = f64::from(gpu_free_total) - f64::from(task.total_gpu_milli());
    let waste = cpu_left / MAX_SPEC_CPU_MILLI * 0.5 + gpu_left / MAX_SPEC_GPU_MILLI * 0.5;
    ((1.0 - waste) * MAX_NODE_SCORE as f64) as i64
}

impl PlacementRule for FgdBestFitRule {
    fn manifest() -> Manifest {
        manifest(
            "fgd-best-fit",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "FGD-paper baseline BestFit: least normalised CPU + GPU left on the node.",
        )
    }

    fn create() -> Self {
        FgdBestFitRule
    }

    fn score(&mut self, plan: &Plan<'_>, task: &Task, node: u32, _gpus: &[u32]) -> Option<f64> {
        Some(best_fit_score(plan.free_cpu(node), plan.node_free_milli(node), task) as f64)
    }

    /// The score reads only the node's free resources.
    fn memo_epoch(&self) -> Option<u64> {
        Some(0)
    }
}

/// The policy.
pub type FgdBestFit = Greedy<FgdBestFitRule>;

arbiter_policy_sdk::export_policy!(FgdBestFit);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_placement_core::testing::{place, schedule, worker_job};

    #[test]
    fn least_leftover_node_wins() {
        let mut c = TestCluster::new();
        let roomy = c.node("roomy", "p", 64_000, 512_000, "V100M32", 32_000, 8);
        let snug = c.node("snug", "p", 16_000, 512_000, "V100M32", 32_000, 2);
        let job = worker_job(&mut c, "one", 8000, 1, 1000);
        let task = Task::of(c.cluster().job(job));
        // roomy: ½·56/128 + ½·7000/8000 = 0.65625 → ⌊34.375⌋ = 34
        assert_eq!(best_fit_score(64_000, 8000, &task), 34);
        // snug: ½·8/128 + ½·1000/8000 = 0.09375 → ⌊90.625⌋ = 90
        assert_eq!(best_fit_score(16_000, 2000, &task), 90);
        let d = schedule::<FgdBestFit>(&c, None, 10);
        assert_eq!(d, vec![place(job, snug, vec![8])]);
        assert_ne!(roomy, snug);
    }

    #[test]
    fn the_memo_changes_no_decision() {
        arbiter_placement_core::testing::assert_memo_is_transparent::<FgdBestFitRule>("seed = 3");
    }
}
