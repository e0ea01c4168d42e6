//! `random`: the FGD paper's Random baseline. Each task goes to a node drawn
//! uniformly from the nodes that can take it; a GPU-sharing task then gets a
//! GPU drawn uniformly from the node's GPUs with room for it, whole-GPU tasks
//! the lowest-index free GPUs (as the reference simulator's `random` GPU
//! selection does). Deterministic for a given `seed`.
//!
//! Configuration: `seed = 42` (see `arbiter-placement-core`).

use arbiter_placement_core::{Greedy, PlacementRule, Search, SplitMix64, Task, fitting_gpus};
use arbiter_policy_sdk::prelude::*;

pub struct RandomRule {
    rng: SplitMix64,
}

/// Decorrelates the placement stream from the tie-breaking stream of the same seed.
const STREAM: u64 = 0x5EED_0FBA_5E00_u64;

impl PlacementRule for RandomRule {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "random",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "FGD-paper baseline: a uniformly random feasible node (and GPU), seeded.",
        );
        m.default_config = "seed = 42\n".into();
        m
    }

    fn create() -> Self {
        RandomRule {
            rng: SplitMix64::new(arbiter_placement_core::DEFAULT_SEED ^ STREAM),
        }
    }

    fn configure(&mut self, _table: &mut toml::Table, seed: u64) -> Result<(), PolicyError> {
        self.rng = SplitMix64::new(seed ^ STREAM);
        Ok(())
    }

    fn score(&mut self, _: &Plan<'_>, _: &Task, _: u32, _: &[u32]) -> Option<f64> {
        // Every feasible candidate is as good as any other.
        Some(0.0)
    }

    fn choose(&mut self, plan: &Plan<'_>, task: &Task, _: &mut Search) -> Option<WorkerPlacement> {
        // The nodes where one worker fits, as the validator judges it (the
        // SDK's packed node scan; a property test in the SDK holds the two
        // equal), in index order.
        let mut feasible = Vec::new();
        plan.each_fitting_node(&plan.job_fit(task.job), |node| feasible.push(node));
        if feasible.is_empty() {
            return None;
        }
        let node = feasible[self.rng.below(feasible.len() as u64) as usize];
        let mut gpus = Vec::new();
        fitting_gpus(plan, task, node, &mut gpus);
        if task.is_sharing() {
            let pick = self.rng.below(gpus.len().max(1) as u64) as usize;
            gpus = vec![*gpus.get(pick)?];
        } else if gpus.len() >= task.num_gpu as usize {
            gpus.truncate(task.num_gpu as usize);
        } else {
            return None;
        }
        Some(WorkerPlacement { node, gpus })
    }
}

/// The policy.
pub type RandomPlacement = Greedy<RandomRule>;

arbiter_policy_sdk::export_policy!(RandomPlacement);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_placement_core::testing::{schedule, worker_spec};

    fn place(seed: u64) -> Vec<Decision> {
        let mut c = TestCluster::new();
        c.node("full", "p", 1000, 1024, "T4", 16_000, 1);
        c.node("a", "p", 64_000, 512_000, "T4", 16_000, 4);
        c.node("b", "p", 64_000, 512_000, "T4", 16_000, 4);
        c.node("c", "p", 64_000, 512_000, "T4", 16_000, 4);
        for i in 0..6 {
            let spec = worker_spec(&mut c, &format!("j{i}"), 2000, 1, 300);
            c.job_spec(JobSpec {
                memory_mib: 1024,
                submit_ms: i,
                ..spec
            });
        }
        schedule::<RandomPlacement>(&c, Some(&format!("seed = {seed}")), 100)
    }

    #[test]
    fn seeded_uniform_choice_among_feasible_nodes() {
        assert_eq!(place(7), place(7), "same seed, same decisions");
        let mut nodes_seen = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let d = place(seed);
            assert_eq!(d.len(), 6);
            for decision in d {
                let Decision::Place(_, w) = decision else {
                    panic!()
                };
                // Node 0 has too little CPU: never chosen.
                assert_ne!(w[0].node, 0);
                nodes_seen.insert(w[0].node);
            }
        }
        assert_eq!(
            nodes_seen.len(),
            3,
            "every feasible node gets picked some time"
        );
    }
}
