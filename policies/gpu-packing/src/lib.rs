//! `gpu-packing`: the FGD paper's GpuPacking baseline: fill partly used GPUs
//! first, then free GPUs on partly used nodes, and open an idle node last.
//!
//! Scores, as in the reference simulator (higher wins):
//! * the task fits on already shared GPUs: `100 − Σ ⌊free‰ of those GPUs / 10⌋`
//!   (at least 50) — the fuller the GPU, the better;
//! * it needs fully free GPUs of a node already in use: `50 − GPUs taken` (at least 33);
//! * the node is entirely idle: `max(33 − its GPUs, its GPUs)`.
//!
//! The GPUs used are the fitting ones with the least free capacity. CPU-only
//! tasks score 0 everywhere (the first in the seeded node order, by `tie_break`).

use arbiter_placement_core::{Greedy, MAX_NODE_SCORE, PlacementRule, Task};
use arbiter_policy_sdk::prelude::*;

pub struct GpuPackingRule;

/// The reference's score: `node_free` are the free milli-GPU of all the
/// node's GPUs, `used_free` those of the GPUs the task would use.
pub fn packing_score(task: &Task, node_free: &[u32], used_free: &[u32]) -> i64 {
    if task.total_gpu_milli() == 0 {
        return 0;
    }
    let fully_free = node_free.iter().filter(|&&f| f == FULL_GPU_MILLI).count() as i64;
    if fully_free == node_free.len() as i64 {
        return (MAX_NODE_SCORE / 3 - fully_free).max(fully_free);
    }
    let fully_free_used = used_free.iter().filter(|&&f| f == FULL_GPU_MILLI).count() as i64;
    if fully_free_used > 0 {
        return (MAX_NODE_SCORE / 2 - fully_free_used).max(MAX_NODE_SCORE / 3);
    }
    let free_ratio: i64 = used_free
        .iter()
        .map(|&f| i64::from(f) * 100 / i64::from(FULL_GPU_MILLI))
        .sum();
    (MAX_NODE_SCORE - free_ratio / 10).max(MAX_NODE_SCORE / 2)
}

impl PlacementRule for GpuPackingRule {
    fn manifest() -> Manifest {
        manifest(
            "gpu-packing",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "FGD-paper baseline GpuPacking: shared GPUs first, then used nodes, then idle ones.",
        )
    }

    fn create() -> Self {
        GpuPackingRule
    }

    fn score(&mut self, plan: &Plan<'_>, task: &Task, node: u32, gpus: &[u32]) -> Option<f64> {
        let node_free: Vec<u32> = plan
            .cluster()
            .node(node)
            .gpu_range()
            .map(|g| plan.free_milli(g))
            .collect();
        let used_free: Vec<u32> = gpus.iter().map(|&g| plan.free_milli(g)).collect();
        Some(packing_score(task, &node_free, &used_free) as f64)
    }

    /// The score reads only the node's state (free GPU, and for clustering
    /// the shapes of the jobs running there): per-node answers stay valid
    /// while the node's version does.
    fn memo_epoch(&self) -> Option<u64> {
        Some(0)
    }
}

/// The policy.
pub type GpuPacking = Greedy<GpuPackingRule>;

arbiter_policy_sdk::export_policy!(GpuPacking);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_placement_core::testing::{place, run_on, schedule, worker_job};

    #[test]
    fn prefers_partly_used_gpus_then_used_nodes() {
        let mut c = TestCluster::new();
        let idle = c.node("idle", "p", 64_000, 512_000, "T4", 16_000, 2);
        let used = c.node("used", "p", 64_000, 512_000, "T4", 16_000, 2);
        let running = worker_job(&mut c, "running", 1000, 1, 500);
        run_on(&mut c, running, used, vec![2]);
        let quarter = worker_job(&mut c, "quarter", 1000, 1, 250);
        let whole = worker_job(&mut c, "whole", 1000, 1, 1000);
        let task = |milli| Task {
            job: 0,
            cpu_milli: 1000,
            memory_mib: 0,
            num_gpu: 1,
            gpu_milli: milli,
        };
        // Partly used GPU with 500 free: 100 − ⌊50 / 10⌋ = 95.
        assert_eq!(packing_score(&task(250), &[500, 1000], &[500]), 95);
        // A free GPU of a used node: 50 − 1; an idle 2-GPU node: max(33 − 2, 2).
        assert_eq!(packing_score(&task(1000), &[500, 1000], &[1000]), 49);
        assert_eq!(packing_score(&task(1000), &[1000, 1000], &[1000]), 31);
        let d = schedule::<GpuPacking>(&c, None, 10);
        assert_eq!(
            d,
            vec![place(quarter, used, vec![2]), place(whole, used, vec![3])]
        );
        assert_ne!(idle, used);
    }

    #[test]
    fn ties_go_to_the_first_node_of_the_seeded_order() {
        arbiter_placement_core::testing::assert_ties_follow_the_node_order::<GpuPacking>();
    }

    #[test]
    fn the_memo_changes_no_decision() {
        arbiter_placement_core::testing::assert_memo_is_transparent::<GpuPackingRule>("seed = 3");
    }
}
