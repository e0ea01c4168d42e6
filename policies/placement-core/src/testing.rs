//! Test support shared by the placement policies' unit tests: one-worker
//! jobs, single-worker placements and a one-round run through the SDK
//! [`Runtime`]. Plain helpers over the SDK's [`TestCluster`]; nothing here is
//! used by the policies themselves.

use crate::driver::{Greedy, PlacementRule, TieBreak, Ties};
use crate::task::{GpuSelection, Task};
use arbiter_policy_sdk::prelude::*;

/// A pending one-worker job spec (`workers = min = max = 1`) asking for
/// `cpu_milli`, and `gpus` GPUs of `gpu_milli` each; every other field is the
/// default. Interns `name` in `c`.
pub fn worker_spec(
    c: &mut TestCluster,
    name: &str,
    cpu_milli: u32,
    gpus: u32,
    gpu_milli: u32,
) -> JobSpec {
    JobSpec {
        name: c.intern(name),
        workers: 1,
        min_workers: 1,
        max_workers: 1,
        cpu_milli,
        gpus_per_worker: gpus,
        gpu_milli,
        ..JobSpec::default()
    }
}

/// Adds the job of [`worker_spec`] to `c`; returns its index.
pub fn worker_job(
    c: &mut TestCluster,
    name: &str,
    cpu_milli: u32,
    gpus: u32,
    gpu_milli: u32,
) -> u32 {
    let spec = worker_spec(c, name, cpu_milli, gpus, gpu_milli);
    c.job_spec(spec)
}

/// One worker on `node` using `gpus`.
pub fn worker(node: u32, gpus: Vec<u32>) -> Vec<WorkerPlacement> {
    vec![WorkerPlacement { node, gpus }]
}

/// Marks `job` as running with one worker on `node` using `gpus`.
pub fn run_on(c: &mut TestCluster, job: u32, node: u32, gpus: Vec<u32>) {
    c.run(job, worker(node, gpus));
}

/// The decision placing `job`'s one worker on `node` using `gpus`.
pub fn place(job: u32, node: u32, gpus: Vec<u32>) -> Decision {
    Decision::Place(job, worker(node, gpus))
}

/// One scheduling round of a fresh `P` on `c`'s snapshot, after
/// `configure(config)` when a configuration is given.
pub fn schedule<P: Policy>(
    c: &TestCluster,
    config: Option<&str>,
    max_decisions: u32,
) -> Vec<Decision> {
    let mut rt = Runtime::<P>::new();
    if let Some(config) = config {
        rt.configure(config).unwrap();
    }
    rt.resync(c.snapshot()).unwrap();
    rt.schedule(c.round(max_decisions)).unwrap()
}

/// `R` with the driver's memo turned off: every candidate scored every time.
pub struct NoMemo<R>(pub R);

impl<R: PlacementRule> PlacementRule for NoMemo<R> {
    fn manifest() -> Manifest {
        R::manifest()
    }
    fn create() -> Self {
        NoMemo(R::create())
    }
    fn configure(&mut self, table: &mut toml::Table, seed: u64) -> Result<(), PolicyError> {
        self.0.configure(table, seed)
    }
    fn selection(&self) -> GpuSelection {
        self.0.selection()
    }
    fn begin_round(&mut self, plan: &Plan<'_>) {
        self.0.begin_round(plan)
    }
    fn score(&mut self, plan: &Plan<'_>, task: &Task, node: u32, gpus: &[u32]) -> Option<f64> {
        self.0.score(plan, task, node, gpus)
    }
    fn node_changed(&mut self, plan: &Plan<'_>, node: u32) {
        self.0.node_changed(plan, node)
    }
}

/// Drives `Greedy<R>` and `Greedy<NoMemo<R>>` through the same 300 rounds of
/// `churn` and asserts that every round's decisions are identical and that
/// the memo was actually used. Returns the memo hits.
pub fn assert_memo_is_transparent<R: PlacementRule>(config: &str) -> u64 {
    let mut memo = Greedy::<R>::create();
    let mut plain = Greedy::<NoMemo<R>>::create();
    memo.configure(config).unwrap();
    plain.configure(config).unwrap();
    churn(|round, cluster, info| {
        let with_memo = memo.schedule(cluster, info).unwrap();
        let without = plain.schedule(cluster, info).unwrap();
        assert_eq!(with_memo, without, "round {round}");
        with_memo
    });
    let hits = memo.memo_hits();
    assert!(hits > 0, "the memo was never used");
    assert_eq!(plain.memo_hits(), 0);
    hits
}

/// Asserts that whatever `R` carries from round to round (caches kept in
/// step incrementally) changes no decision: one instance kept for 300 rounds
/// of `churn` decides every round as a fresh instance does. For rules
/// that keep no random state across rounds (configure `tie_break = "first"`
/// or `"node-order"`).
pub fn assert_kept_state_is_transparent<R: PlacementRule>(config: &str) {
    let mut kept = Greedy::<R>::create();
    kept.configure(config).unwrap();
    churn(|round, cluster, info| {
        let mut fresh = Greedy::<R>::create();
        fresh.configure(config).unwrap();
        let decided = kept.schedule(cluster, info).unwrap();
        assert_eq!(
            decided,
            fresh.schedule(cluster, info).unwrap(),
            "round {round}"
        );
        decided
    });
}

/// 300 rounds on one evolving mirror of twelve nodes of three models:
/// arrivals from a small set of shapes (so they recur), two-worker gangs,
/// completions, evictions, cordons and reservations. `decide(round, cluster,
/// info)` answers each round; its placements are applied.
fn churn(mut decide: impl FnMut(usize, &Cluster, &RoundInfo) -> Vec<Decision>) {
    let mut c = TestCluster::new();
    for i in 0..12 {
        let (model, gpus, cpu) = [("T4", 2, 32_000), ("V100", 4, 48_000), ("G2", 8, 96_000)][i % 3];
        c.node(&format!("n{i}"), "p", cpu, 512_000, model, 16_000, gpus);
    }
    let shapes = [
        (4_000, 1, 500, 1),
        (2_000, 1, 250, 1),
        (8_000, 1, 1000, 1),
        (16_000, 2, 1000, 1),
        (6_000, 1, 460, 2),
        (1_000, 0, 0, 1),
        (12_000, 4, 1000, 1),
    ];
    let mut rng = crate::SplitMix64::new(7);
    let mut next = 0;
    for round in 0..300 {
        for _ in 0..1 + rng.below(3) {
            let (cpu, gpus, milli, workers) = shapes[rng.below(shapes.len() as u64) as usize];
            let mut spec = worker_spec(&mut c, &format!("j{next}"), cpu, gpus, milli);
            (spec.workers, spec.min_workers, spec.max_workers) = (workers, workers, workers);
            next += 1;
            c.job_spec(spec);
        }
        match rng.below(10) {
            0 => {
                let node = rng.below(12) as u32;
                let state = [node_state::READY, node_state::CORDONED][rng.below(2) as usize];
                c.apply(Event::NodeStateChanged(node, state));
            }
            1 => {
                let first_pending = c.cluster().pending_jobs().next().map(|j| j.index());
                if let Some(job) = first_pending {
                    c.apply(Event::JobReserved(job, vec![rng.below(12) as u32]));
                }
            }
            _ => {}
        }
        let info = c.round(1_000);
        for d in decide(round, c.cluster(), &info) {
            if let Decision::Place(job, workers) = d {
                c.run(job, workers);
            }
        }
        // Churn: finish or evict a few running jobs.
        let running: Vec<u32> = c.cluster().running_jobs().map(|j| j.index()).collect();
        for job in running.into_iter().rev() {
            match rng.below(8) {
                0 => c.apply(Event::JobRemoved(job)),
                1 => c.apply(Event::JobEvicted(job)),
                _ => {}
            }
        }
    }
}

/// Asserts that `P` (a policy whose scores tie on identical idle nodes, as
/// GpuClustering's and GpuPacking's do) gives ties to the first node of the
/// seeded node order, for seeds 1–12: six CPU-only tasks (score 0 everywhere)
/// and a whole-GPU task on eight identical idle nodes all go to that node.
/// Uniform draws per task would spread them (all on one node with
/// probability 8^-6), and the lowest index would not depend on the seed.
pub fn assert_ties_follow_the_node_order<P: Policy>() {
    let mut c = TestCluster::new();
    for i in 0..8 {
        c.node(&format!("n{i}"), "p", 64_000, 512_000, "T4", 16_000, 2);
    }
    for i in 0..6 {
        worker_job(&mut c, &format!("cpu{i}"), 1000, 0, 0);
    }
    worker_job(&mut c, "gpu", 1000, 1, 1000);
    let mut first_nodes = Vec::new();
    for seed in 1..=12u64 {
        let d = schedule::<P>(&c, Some(&format!("seed = {seed}")), 10);
        assert_eq!(d.len(), 7);
        let nodes: Vec<u32> = d
            .iter()
            .map(|d| match d {
                Decision::Place(_, workers) => workers[0].node,
                other => panic!("unexpected decision {other:?}"),
            })
            .collect();
        let mut ties = Ties::new(TieBreak::NodeOrder, seed);
        let first = ties.node_ranks(8).iter().position(|&r| r == 0).unwrap() as u32;
        assert!(nodes.iter().all(|&n| n == first), "seed {seed}: {nodes:?}");
        first_nodes.push(first);
    }
    // The order, and so the node, depends on the seed.
    first_nodes.sort_unstable();
    first_nodes.dedup();
    assert!(first_nodes.len() > 1, "{first_nodes:?}");
}
