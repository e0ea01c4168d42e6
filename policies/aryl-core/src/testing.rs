//! Test support shared by the Aryl tests (`aryl-core`'s own and the policy
//! crates'): training and loaned servers, jobs, worker placements, a
//! resynced [`Runtime`] and checks that decisions apply to a [`Plan`]. Plain
//! helpers over the SDK's [`TestCluster`]; the policies never call them.

use arbiter_policy_sdk::prelude::*;

/// A training server: 96 CPUs, 8 × V100 (32 GiB).
pub fn training(c: &mut TestCluster, name: &str) -> u32 {
    c.node(name, "training", 96_000, 350_000, "V100", 32_768, 8)
}

/// An inference server (96 CPUs, 8 × T4), on loan to training.
pub fn loaned(c: &mut TestCluster, name: &str) -> u32 {
    let n = c.node(name, "inference", 96_000, 210_000, "T4", 16_384, 8);
    c.apply(Event::NodeLoanChanged(n, true));
    n
}

/// A pending job of tenant `t`: `workers` (between `min` and `max`) of
/// `gpus_per_worker` whole GPUs, 1 CPU and 1 GiB each, submitted in index
/// order.
#[allow(clippy::too_many_arguments)]
pub fn job(
    c: &mut TestCluster,
    name: &str,
    min: u32,
    max: u32,
    workers: u32,
    gpus_per_worker: u32,
    estimate_ms: u64,
) -> u32 {
    let spec = JobSpec {
        name: c.intern(name),
        tenant: c.intern("t"),
        workers,
        min_workers: min,
        max_workers: max,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker,
        gpu_milli: FULL_GPU_MILLI,
        submit_ms: c.cluster().job_count() as u64,
        estimate_ms,
        ..JobSpec::default()
    };
    c.job_spec(spec)
}

/// Worker placements taking `gpus` GPUs each from `node`, starting at its
/// `first`-th GPU.
pub fn on(c: &TestCluster, node: u32, first: u32, workers: u32, gpus: u32) -> Vec<WorkerPlacement> {
    let start = c.cluster().node(node).gpu_range().start + first;
    (0..workers)
        .map(|w| WorkerPlacement {
            node,
            gpus: (0..gpus).map(|g| start + w * gpus + g).collect(),
        })
        .collect()
}

/// Marks `job` as running on the workers of each `(node, first, workers,
/// gpus)` group in turn (see [`on`]).
pub fn run_on(c: &mut TestCluster, job: u32, groups: &[(u32, u32, u32, u32)]) {
    let w = groups
        .iter()
        .flat_map(|&(node, first, workers, gpus)| on(c, node, first, workers, gpus))
        .collect();
    c.run(job, w);
}

/// A fresh `P`, resynced to `c`.
pub fn runtime<P: Policy>(c: &TestCluster) -> Runtime<P> {
    let mut rt = Runtime::<P>::new();
    rt.resync(c.snapshot()).unwrap();
    rt
}

/// One scheduling round of a fresh `P` on `c`, its decisions checked with
/// [`assert_valid`].
pub fn schedule_valid<P: Policy>(c: &TestCluster, max_decisions: u32) -> Vec<Decision> {
    let d = runtime::<P>(c).schedule(c.round(max_decisions)).unwrap();
    assert_valid(c, &d);
    d
}

/// Every decision applies to a fresh `Plan` of the same cluster; returns
/// that plan.
pub fn assert_valid<'c>(c: &'c TestCluster, decisions: &[Decision]) -> Plan<'c> {
    let mut plan = Plan::new(c.cluster());
    for d in decisions {
        plan.apply(d.clone())
            .unwrap_or_else(|e| panic!("{d:?} rejected: {e}"));
    }
    plan
}

/// Where `job` is placed by `decisions`; panics when it is not.
pub fn placed(decisions: &[Decision], job: u32) -> Vec<WorkerPlacement> {
    decisions
        .iter()
        .find_map(|d| match d {
            Decision::Place(j, w) if *j == job => Some(w.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("job {job} not placed: {decisions:?}"))
}

/// A reclaim request at `c`'s epoch.
pub fn request(c: &TestCluster, candidates: Vec<u32>, count: u32) -> ReclaimRequest {
    ReclaimRequest {
        epoch: c.round(0).epoch,
        candidates,
        count,
        max_decisions: 10_000,
    }
}

/// Applies a reclaim plan to a `Plan` and checks the returned servers end up
/// empty.
pub fn assert_plan_empties(c: &TestCluster, plan: &ReclaimPlan) {
    let p = assert_valid(c, &plan.decisions);
    for &n in &plan.nodes {
        let gpus = c.cluster().node(n).gpu_range().len() as u32;
        assert_eq!(
            p.node_free_milli(n),
            gpus * FULL_GPU_MILLI,
            "node {n} not emptied"
        );
    }
}

/// How many jobs a reclaim plan preempts.
pub fn preempted(plan: &ReclaimPlan) -> usize {
    plan.decisions
        .iter()
        .filter(|d| matches!(d, Decision::Preempt(_)))
        .count()
}
