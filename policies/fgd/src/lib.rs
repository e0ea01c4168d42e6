//! `fgd`: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).
//!
//! Each task goes where the expected GPU fragmentation F_n(M) of the target
//! workload M grows least (`arbiter_placement_core::frag`); a sharing task
//! considers every GPU of every node. The reference simulator ranks
//! candidates by `⌊100 · sigmoid(−ΔF / 1000)⌋` (ΔF in milli-GPU) and breaks
//! the resulting ties at random; that is the default here too. With
//! `exact = true` candidates are ranked by ΔF itself.
//!
//! Configuration (TOML):
//!
//! ```toml
//! seed = 42
//! exact = false
//! [[workload]]             # the target workload; see TargetWorkload::to_config
//! cpu_milli = 6000
//! num_gpu = 1
//! gpu_milli = 460
//! gpu_models = ["T4"]      # optional; empty = any model
//! weight = 0.3             # popularity; normalised over the classes
//! ```
//!
//! Without `[[workload]]` the policy estimates M online from the jobs it has
//! seen (the reference simulator's "typical pods" rule over the mirror's
//! jobs), rebuilt whenever their number has changed by more than 10%.

use arbiter_placement_core::{
    DEFAULT_POPULARITY, FragIndex, GpuSelection, Greedy, PlacementRule, TargetWorkload, Task,
    TaskShape, take_key,
};
use arbiter_policy_sdk::prelude::*;

#[derive(Default)]
pub struct FgdRule {
    index: FragIndex,
    exact: bool,
    /// Whether the workload came from the configuration (else estimated).
    configured: bool,
    /// Job count the estimated workload was built from.
    estimated_from: usize,
    /// Bumped whenever the target workload (and so every score) changes.
    workload_epoch: u64,
}

/// The reference's integer score for a fragmentation increase of `delta` milli-GPU.
pub fn sigmoid_score(delta: f64) -> i64 {
    let x = -delta / 1000.0;
    (100.0 / (1.0 + (-x).exp())) as i64
}

fn shape_of(cluster: &Cluster, job: Job<'_>) -> TaskShape {
    let task = Task::of(job);
    let mask = job.gpu_model_mask();
    let gpu_models = if mask == 0 {
        Vec::new()
    } else {
        cluster
            .gpu_models()
            .iter()
            .enumerate()
            .filter(|(slot, _)| *slot < 64 && mask & (1u64 << slot) != 0)
            .map(|(_, &id)| cluster.string(id).to_string())
            .collect()
    };
    TaskShape {
        cpu_milli: task.cpu_milli,
        num_gpu: task.num_gpu,
        gpu_milli: task.gpu_milli,
        gpu_models,
    }
}

impl FgdRule {
    /// The fragmentation index (for inspection and tests).
    pub fn index(&self) -> &FragIndex {
        &self.index
    }

    fn estimate_workload(&mut self, cluster: &Cluster) {
        let jobs = cluster.job_count();
        let stale = self.estimated_from == 0
            || jobs.abs_diff(self.estimated_from) * 10 > self.estimated_from;
        if jobs == 0 || !stale {
            return;
        }
        let shapes: Vec<TaskShape> = cluster.jobs().map(|j| shape_of(cluster, j)).collect();
        self.index
            .set_workload(TargetWorkload::from_tasks(shapes, DEFAULT_POPULARITY));
        self.estimated_from = jobs;
        self.workload_epoch += 1;
    }
}

impl PlacementRule for FgdRule {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "fgd",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Fragmentation Gradient Descent: least growth of expected GPU fragmentation.",
        );
        m.default_config = "seed = 42\nexact = false\n".into();
        m
    }

    fn create() -> Self {
        FgdRule::default()
    }

    fn configure(&mut self, table: &mut toml::Table, _seed: u64) -> Result<(), PolicyError> {
        self.exact = take_key::<bool>(table, "exact")?.unwrap_or(false);
        if let Some(value) = table.remove("workload") {
            self.index = FragIndex::new(TargetWorkload::from_value(value)?);
            self.configured = true;
        }
        Ok(())
    }

    fn selection(&self) -> GpuSelection {
        GpuSelection::EachFreeLevel
    }

    fn begin_round(&mut self, plan: &Plan<'_>) {
        if !self.configured {
            self.estimate_workload(plan.cluster());
        }
        self.index.sync(plan.cluster());
    }

    fn score(&mut self, _plan: &Plan<'_>, task: &Task, node: u32, gpus: &[u32]) -> Option<f64> {
        let delta = self.index.delta(node, task.cpu_milli, gpus, task.gpu_milli);
        if delta.is_nan() {
            return None;
        }
        Some(if self.exact {
            -delta
        } else {
            sigmoid_score(delta) as f64
        })
    }

    fn node_changed(&mut self, plan: &Plan<'_>, node: u32) {
        self.index.refresh(plan, node);
    }

    /// ΔF reads only the node's CPU and GPU state and the target workload.
    fn memo_epoch(&self) -> Option<u64> {
        Some(self.workload_epoch)
    }
}

/// The policy.
pub type Fgd = Greedy<FgdRule>;

arbiter_policy_sdk::export_policy!(Fgd);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_placement_core::testing::{place, run_on, schedule, worker_job};

    const WORKLOAD: &str = "tie_break = \"first\"
[[workload]]
cpu_milli = 1000
num_gpu = 1
gpu_milli = 1000
weight = 1.0
[[workload]]
cpu_milli = 1000
num_gpu = 1
gpu_milli = 500
weight = 1.0
";

    fn half(c: &mut TestCluster, name: &str) -> u32 {
        worker_job(c, name, 1000, 1, 500)
    }

    #[test]
    fn chooses_the_least_fragmentation_increase() {
        // M: half whole-GPU tasks, half 0.5-GPU tasks.
        let mut c = TestCluster::new();
        let a = c.node("a", "p", 64_000, 512_000, "T4", 16_000, 2);
        let b = c.node("b", "p", 64_000, 512_000, "T4", 16_000, 2);
        let running = half(&mut c, "running");
        run_on(&mut c, running, a, vec![0]);
        let new = half(&mut c, "new");
        // Free GPUs: a = [500, 1000], b = [1000, 1000]; F(a) = F(b) = 0.
        // 0.5 on a/GPU0 → [0, 1000]: both classes use the free GPU: ΔF = 0.
        // 0.5 on a/GPU1 → [500, 500]: no whole GPU left: ΔF = ½·1000 = 500.
        // 0.5 on b/GPU2 → [500, 1000]: whole class loses the 500: ΔF = ½·500 = 250.
        let d = schedule::<Fgd>(&c, Some(&format!("exact = true\n{WORKLOAD}")), 10);
        assert_eq!(d, vec![place(new, a, vec![0])]);
        // The reference's integer score orders them the same way.
        assert_eq!(sigmoid_score(0.0), 50);
        assert_eq!(sigmoid_score(250.0), 43);
        assert_eq!(sigmoid_score(500.0), 37);
        assert_ne!(a, b);
    }

    #[test]
    fn bad_configuration_is_an_error() {
        let mut rt = Runtime::<Fgd>::new();
        assert!(rt.configure("exakt = true").is_err());
        assert!(rt.configure("tie_break = \"sometimes\"").is_err());
        assert!(
            rt.configure("[[workload]]\ncpu_milli = 1\nweight = 0.0")
                .is_err()
        );
        assert!(rt.configure("seed = 7\nexact = true").is_ok());
        assert!(rt.configure("").is_ok());
    }

    #[test]
    fn estimates_the_workload_without_configuration() {
        let mut c = TestCluster::new();
        c.node("a", "p", 64_000, 512_000, "T4", 16_000, 2);
        let job = half(&mut c, "x");
        let d = schedule::<Fgd>(&c, None, 10);
        assert!(matches!(&d[..], [Decision::Place(j, _)] if *j == job));
    }

    #[test]
    fn the_memo_changes_no_decision() {
        // Configured workload, both score modes, and the online estimate
        // (which moves the memo epoch as the job count grows).
        let hits = arbiter_placement_core::testing::assert_memo_is_transparent::<FgdRule>(
            &format!("seed = 3\n{WORKLOAD}"),
        );
        assert!(hits > 1_000, "{hits} memo hits");
        arbiter_placement_core::testing::assert_memo_is_transparent::<FgdRule>(&format!(
            "exact = true\n{WORKLOAD}"
        ));
        arbiter_placement_core::testing::assert_memo_is_transparent::<FgdRule>("seed = 5");
    }
}
