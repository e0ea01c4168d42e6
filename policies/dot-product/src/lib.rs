//! `dot-product`: the FGD paper's DotProd baseline (Tetris-style alignment,
//! Grandl et al. SIGCOMM'14), as the reference simulator configures it
//! (`-gpusel best -dimext merge -norm max`).
//!
//! A node's free resources `[cpu, Σ free milli-GPU]` and the task's request
//! `[cpu, num_gpu × gpu_milli]` are each divided by the largest node spec
//! (128 CPUs, 8 GPUs); the node whose normalised dot product with the request
//! is smallest wins, i.e. the score is `⌊100 · (1 − dot / 2)⌋`. The reference
//! truncates to an integer score and gives ties to the first node of its
//! seeded node order; so does this policy (`tie_break`). Within the node a
//! sharing task takes the fitting GPU with the least free capacity.

use arbiter_placement_core::{
    Greedy, MAX_NODE_SCORE, MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PlacementRule, Task,
};
use arbiter_policy_sdk::prelude::*;

pub struct DotProductRule;

/// The reference's score of one node: free resources before the placement.
pub fn dot_product_score(cpu_free: u32, gpu_free_total: u32, task: &Task) -> i64 {
    let node = [
        f64::from(cpu_free) / MAX_SPEC_CPU_MILLI,
        f64::from(gpu_free_total) / MAX_SPEC_GPU_MILLI,
    ];
    let request = [
        f64::from(task.cpu_milli) / MAX_SPEC_CPU_MILLI,
        f64::from(task.total_gpu_milli()) / MAX_SPEC_GPU_MILLI,
    ];
    let dot = node[0] * request[0] + node[1] * request[1];
    (MAX_NODE_SCORE as f64 * (1.0 - dot / 2.0)) as i64
}

impl PlacementRule for DotProductRule {
    fn manifest() -> Manifest {
        manifest(
            "dot-product",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "FGD-paper baseline DotProd: least dot product of free resources and request.",
        )
    }

    fn create() -> Self {
        DotProductRule
    }

    fn score(&mut self, plan: &Plan<'_>, task: &Task, node: u32, _gpus: &[u32]) -> Option<f64> {
        Some(dot_product_score(plan.free_cpu(node), plan.node_free_milli(node), task) as f64)
    }

    /// The score reads only the node's free resources.
    fn memo_epoch(&self) -> Option<u64> {
        Some(0)
    }
}

/// The policy.
pub type DotProduct = Greedy<DotProductRule>;

arbiter_policy_sdk::export_policy!(DotProduct);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_placement_core::testing::{place, schedule, worker_job};

    #[test]
    fn least_aligned_node_wins() {
        let mut c = TestCluster::new();
        // Node 0: 8 CPUs and one GPU free. Node 1: 32 CPUs and 4 GPUs free.
        let small = c.node("small", "p", 8000, 64_000, "T4", 16_000, 1);
        let big = c.node("big", "p", 32_000, 64_000, "T4", 16_000, 4);
        let job = worker_job(&mut c, "half", 1000, 1, 500);
        let task = Task::of(c.cluster().job(job));
        // dot = (8/128)(1/128) + (1000/8000)(500/8000) = 0.00830 → ⌊100(1 − 0.00415)⌋ = 99
        assert_eq!(dot_product_score(8000, 1000, &task), 99);
        // dot = (32/128)(1/128) + (4000/8000)(500/8000) = 0.03320 → ⌊98.34⌋ = 98
        assert_eq!(dot_product_score(32_000, 4000, &task), 98);
        let d = schedule::<DotProduct>(&c, None, 10);
        assert_eq!(d, vec![place(job, small, vec![0])]);
        assert_ne!(small, big);
    }

    #[test]
    fn the_memo_changes_no_decision() {
        arbiter_placement_core::testing::assert_memo_is_transparent::<DotProductRule>("seed = 3");
    }
}
