//! `gpu-clustering`: the FGD paper's GpuClustering baseline: keep tasks of
//! the same GPU shape together, so that sharing tasks and whole-GPU tasks of
//! each size cluster on their own nodes.
//!
//! A task's tag is "share" (a fraction of one GPU) or "k-gpu" (k whole GPUs);
//! a node's tags are those of the tasks running on it. Following the
//! reference simulator, with `used = ⌊25 · (8000 − free milli-GPU) / 8000⌋`:
//! * 75 + used: the node runs only tasks with the task's tag;
//! * 50 + used: it runs tasks with the task's tag among others;
//! * 25 + used: it runs no GPU task;
//! * used: it runs only other tags.
//!
//! CPU-only tasks score 0 everywhere (the first in the seeded node order, by `tie_break`).
//! Within the node a sharing task takes the fitting GPU with the least free
//! capacity.

use arbiter_placement_core::{Greedy, MAX_NODE_SCORE, MAX_SPEC_GPU_MILLI, PlacementRule, Task};
use arbiter_policy_sdk::prelude::*;

/// A task's GPU shape as a bit of a node's tag set; 0 for a CPU-only task.
pub fn tag(num_gpu: u32, sharing: bool) -> u64 {
    if num_gpu == 0 {
        0
    } else if sharing {
        1
    } else {
        // k-gpu for k = 1..=62; larger gangs share the last bit.
        1u64 << num_gpu.min(63)
    }
}

/// The reference's score of a node with these tags and this much free GPU.
pub fn clustering_score(task_tag: u64, node_tags: u64, gpu_free_total: u32) -> i64 {
    if task_tag == 0 {
        return 0;
    }
    let spec = MAX_SPEC_GPU_MILLI as i64;
    let used = (MAX_NODE_SCORE / 4) * (spec - i64::from(gpu_free_total)) / spec;
    let quarter = MAX_NODE_SCORE / 4;
    if node_tags & task_tag != 0 {
        if node_tags.count_ones() == 1 {
            used + 3 * quarter
        } else {
            used + 2 * quarter
        }
    } else if node_tags == 0 {
        used + quarter
    } else {
        used
    }
}

#[derive(Default)]
pub struct GpuClusteringRule {
    /// Per node: tags of the tasks running there (committed + this round).
    node_tags: Vec<u64>,
    /// Per node: the committed node version `node_tags` was computed at; 0
    /// (a version never handed out) once this round's decisions were folded
    /// in, so that the next round recomputes the node from the mirror
    /// whether or not the host applied them.
    tag_version: Vec<u64>,
    /// Decisions of the current round already folded into `node_tags`.
    seen_decisions: usize,
}

fn job_tag(job: Job<'_>) -> u64 {
    tag(job.gpus_per_worker(), job.is_fractional())
}

impl GpuClusteringRule {
    fn fold(&mut self, node: u32, t: u64) {
        if let Some(tags) = self.node_tags.get_mut(node as usize) {
            *tags |= t;
            self.tag_version[node as usize] = 0;
        }
    }
}

impl PlacementRule for GpuClusteringRule {
    fn manifest() -> Manifest {
        manifest(
            "gpu-clustering",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "FGD-paper baseline GpuClustering: tasks of one GPU shape on the same nodes.",
        )
    }

    fn create() -> Self {
        GpuClusteringRule::default()
    }

    /// Recomputes the tags of the nodes whose state moved since the last
    /// round (a node's tags are a function of the jobs on it, and any
    /// placement or release there moves its version): one placement per
    /// round touches one node, not every running job.
    fn begin_round(&mut self, plan: &Plan<'_>) {
        let cluster = plan.cluster();
        let nodes = cluster.node_count();
        self.node_tags.resize(nodes, 0);
        self.tag_version.resize(nodes, 0);
        self.seen_decisions = 0;
        for node in 0..nodes {
            let version = cluster.node_version(node as u32);
            if self.tag_version[node] != version {
                self.node_tags[node] = cluster
                    .jobs_on(node as u32)
                    .fold(0, |tags, job| tags | job_tag(job));
                self.tag_version[node] = version;
            }
        }
    }

    fn node_changed(&mut self, plan: &Plan<'_>, _node: u32) {
        // Fold in the placements decided since the last call.
        let decisions = plan.decisions();
        for decision in decisions.iter().skip(self.seen_decisions) {
            if let Decision::Place(job, workers) = decision {
                let t = job_tag(plan.cluster().job(*job));
                for worker in workers {
                    self.fold(worker.node, t);
                }
            }
        }
        self.seen_decisions = decisions.len();
    }

    fn score(&mut self, plan: &Plan<'_>, task: &Task, node: u32, _gpus: &[u32]) -> Option<f64> {
        let tags = self.node_tags.get(node as usize).copied().unwrap_or(0);
        let t = tag(task.num_gpu, task.is_sharing());
        Some(clustering_score(t, tags, plan.node_free_milli(node)) as f64)
    }

    /// The score reads only the node's state (free GPU, and for clustering
    /// the shapes of the jobs running there): per-node answers stay valid
    /// while the node's version does.
    fn memo_epoch(&self) -> Option<u64> {
        Some(0)
    }
}

/// The policy.
pub type GpuClustering = Greedy<GpuClusteringRule>;

arbiter_policy_sdk::export_policy!(GpuClustering);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_placement_core::testing::{place, run_on, schedule, worker_job};

    #[test]
    fn tasks_join_nodes_of_their_own_shape() {
        let mut c = TestCluster::new();
        let shared = c.node("shared", "p", 64_000, 512_000, "T4", 16_000, 4);
        let whole = c.node("whole", "p", 64_000, 512_000, "T4", 16_000, 4);
        let idle = c.node("idle", "p", 64_000, 512_000, "T4", 16_000, 4);
        let running_share = worker_job(&mut c, "s", 1000, 1, 500);
        let running_whole = worker_job(&mut c, "w", 1000, 1, 1000);
        run_on(&mut c, running_share, shared, vec![0]);
        run_on(&mut c, running_whole, whole, vec![4]);
        let new_share = worker_job(&mut c, "new-share", 1000, 1, 250);
        let new_whole = worker_job(&mut c, "new-whole", 1000, 1, 1000);
        // Shared node: only "share" tasks, 3500 free: ⌊25·4500/8000⌋ + 75 = 89.
        assert_eq!(clustering_score(tag(1, true), tag(1, true), 3500), 89);
        // Idle node for a share task: ⌊25·4000/8000⌋ + 25 = 37; other tags only: 12 + 0.
        assert_eq!(clustering_score(tag(1, true), 0, 4000), 37);
        assert_eq!(clustering_score(tag(1, true), tag(1, false), 3000), 15);
        let d = schedule::<GpuClustering>(&c, Some("tie_break = \"first\""), 10);
        assert_eq!(
            d,
            vec![
                // Best-fit GPU on the shared node: GPU 0 has 500 free.
                place(new_share, shared, vec![0]),
                place(new_whole, whole, vec![5]),
            ]
        );
        assert_ne!(idle, shared);
    }

    #[test]
    fn ties_go_to_the_first_node_of_the_seeded_order() {
        arbiter_placement_core::testing::assert_ties_follow_the_node_order::<GpuClustering>();
    }

    #[test]
    fn the_memo_changes_no_decision() {
        arbiter_placement_core::testing::assert_memo_is_transparent::<GpuClusteringRule>(
            "seed = 3",
        );
    }

    #[test]
    fn tags_kept_across_rounds_change_no_decision() {
        // Completions and evictions must clear a node's tags; placements
        // the host did not apply must not stay in them.
        arbiter_placement_core::testing::assert_kept_state_is_transparent::<GpuClusteringRule>(
            "tie_break = \"first\"",
        );
    }
}
