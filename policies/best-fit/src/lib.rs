//! `best-fit`: jobs in arrival order; each worker on the node that its
//! placement leaves with the least free GPU capacity (then least free CPU),
//! and on that node the fullest GPUs that still fit.
//!
//! Packing tightly keeps whole nodes and whole GPUs free for large gangs and
//! for jobs that want an unshared GPU.

use arbiter_policy_sdk::node_order::NodeOrder;
use arbiter_policy_sdk::prelude::*;

pub struct BestFit;

/// The worker on the chosen node: its fullest GPUs that still fit, so
/// fractional workers fill partly used GPUs first.
fn worker_on(plan: &Plan<'_>, job: Job<'_>, node: u32) -> WorkerPlacement {
    let mut gpus: Vec<u32> = plan.fitting_gpus(job.index(), node).collect();
    gpus.sort_by_key(|&g| (plan.free_milli(g), g));
    gpus.truncate(job.gpus_per_worker() as usize);
    WorkerPlacement { node, gpus }
}

/// Below this many pending jobs a round scans every node per worker; above
/// it, the round builds a [`NodeOrder`] by leftover first (its
/// O(nodes · log nodes) build costs about what a handful of scans do). Both
/// answer the same.
const INDEX_FROM_PENDING: usize = 16;

/// A node's place in best-fit's order, as one integer that sorts like the
/// tuple (free milli-GPU, free CPU, node index). Subtracting a worker's
/// request from every node keeps that order, so the first node in it where
/// the worker fits is the node a scan of every node picks (least leftover,
/// lowest index on ties), and a round of `p` workers costs about
/// `p · log nodes` instead of `p · nodes` while most nodes fit.
fn order_key(plan: &Plan<'_>, node: u32) -> u128 {
    (u128::from(plan.node_free_milli(node)) << 64)
        | (u128::from(plan.free_cpu(node)) << 32)
        | u128::from(node)
}

/// For a node keyed `key` that did not fit: if it has less free CPU than the
/// worker asks, every node after it with the same free milli-GPU and less
/// free CPU cannot fit either — the walk goes on at (that milli-GPU, the
/// worker's CPU). Without this, a CPU-only worker walks past every node whose
/// GPUs are all allocated and whose CPU is short, and there are as many of
/// those as the cluster is large.
fn past_short_of_cpu(key: u128, cpu_milli: u32) -> Option<u128> {
    let free_cpu = (key >> 32) as u32;
    (free_cpu < cpu_milli).then(|| (key >> 64 << 64) | (u128::from(cpu_milli) << 32))
}

/// The best-fit node by a scan of every node.
fn best_by_scan(plan: &Plan<'_>, fit: &JobFit, need_milli: u32) -> Option<u32> {
    let mut best: Option<((u32, u32), u32)> = None;
    plan.each_fitting_node(fit, |n| {
        let leftover = (
            plan.node_free_milli(n) - need_milli,
            plan.free_cpu(n) - fit.cpu_milli,
        );
        if best.is_none_or(|(b, _)| leftover < b) {
            best = Some((leftover, n));
        }
    });
    best.map(|(_, n)| n)
}

impl Policy for BestFit {
    fn manifest() -> Manifest {
        manifest(
            "best-fit",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Arrival order; each worker where it leaves the least free capacity.",
        )
    }

    fn create() -> Self {
        BestFit
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(plan_round(cluster, round.max_decisions, None))
    }
}

/// One round: pending jobs in arrival order, each worker on its best-fit
/// node. `indexed` forces the node index on or off (tests); `None` chooses
/// by the number of pending jobs.
fn plan_round(cluster: &Cluster, max_decisions: u32, indexed: Option<bool>) -> Vec<Decision> {
    let pending = cluster.pending_by_arrival();
    let mut plan = Plan::new(cluster).with_max_decisions(max_decisions);
    let mut index = indexed
        .unwrap_or(pending.len() >= INDEX_FROM_PENDING)
        .then(|| NodeOrder::new(cluster.node_count() as u32, |n| order_key(&plan, n)));
    plan.place_each(pending, |plan, job| {
        let fit = plan.job_fit(job.index());
        let per_gpu = if fit.fractional_milli > 0 {
            fit.fractional_milli
        } else {
            FULL_GPU_MILLI
        };
        let need_milli = per_gpu.saturating_mul(fit.gpus);
        let node = match index.as_mut() {
            // Nodes with less free capacity than the worker needs cannot fit.
            Some(index) => index.first_fit_skipping(
                plan,
                &fit,
                (u128::from(need_milli) << 64)..u128::MAX,
                |n| order_key(plan, n),
                |k| past_short_of_cpu(k, fit.cpu_milli),
            ),
            None => best_by_scan(plan, &fit, need_milli),
        }?;
        Some(worker_on(plan, job, node))
    });
    plan.into_decisions()
}

arbiter_policy_sdk::export_policy!(BestFit);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_onto_the_fullest_node_and_gpu() {
        let mut c = TestCluster::new();
        let empty = c.node("empty", "default", 64_000, 512_000, "T4", 16_384, 2);
        let busy = c.node("busy", "default", 64_000, 512_000, "T4", 16_384, 2);
        let first = c.job("running", "t", 1, 1);
        let gpu = c.cluster().node(busy).gpu_range().start;
        c.run(
            first,
            vec![WorkerPlacement {
                node: busy,
                gpus: vec![gpu],
            }],
        );
        let name = c.intern("half");
        let tenant = c.intern("t");
        let half = c.job_spec(JobSpec {
            name,
            tenant,
            workers: 1,
            min_workers: 1,
            max_workers: 1,
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus_per_worker: 1,
            gpu_milli: 500,
            ..JobSpec::default()
        });
        let mut rt = Runtime::<BestFit>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(10)).unwrap();
        assert_eq!(
            d,
            vec![Decision::Place(
                half,
                vec![WorkerPlacement {
                    node: busy,
                    gpus: vec![gpu + 1]
                }]
            )]
        );
        assert_ne!(busy, empty);
    }

    /// The index and the scan decide alike: random clusters (mixed GPU
    /// counts, cordoned nodes, partly used GPUs) and queues of whole-GPU,
    /// fractional, CPU-only and gang jobs, several rounds each. CPU-only
    /// jobs on nodes short of CPU exercise the walk's skipping; the large
    /// clusters, the merging of moved keys.
    #[test]
    fn the_node_index_decides_as_the_scan_does() {
        use arbiter_policy_sdk::rng::SplitMix64;
        let mut decided = 0;
        for seed in 0..40u64 {
            let mut rng = SplitMix64::new(seed);
            let mut c = TestCluster::new();
            // Every eighth cluster is large enough for a round to merge its
            // order's moved keys into the base (past √nodes, at least 64).
            let large = seed % 8 == 0;
            let nodes = if large {
                200 + rng.below(200)
            } else {
                20 + rng.below(40)
            };
            for n in 0..nodes {
                let gpus = [0, 1, 2, 4, 8][rng.below(5) as usize];
                let cpu = 8_000 * (1 + rng.below(8) as u32);
                let node = c.node(&format!("n{n}"), "p", cpu, 256_000, "T4", 16_000, gpus);
                if rng.below(10) == 0 {
                    c.apply(Event::NodeStateChanged(node, node_state::CORDONED));
                }
            }
            let add_jobs = |c: &mut TestCluster, round: u64| {
                for j in 0..10 + u64::from(large) * 200 + rng.below(60) {
                    let (gpus, milli) = match rng.below(4) {
                        0 => (0, 0),
                        1 => (1, [250, 500, 700][rng.below(3) as usize]),
                        _ => (1 + rng.below(4) as u32, 1000),
                    };
                    let workers = 1 + u32::from(rng.below(4) == 0) * rng.below(3) as u32;
                    let spec = JobSpec {
                        cpu_milli: 1_000 * (1 + rng.below(6) as u32),
                        gpus_per_worker: gpus,
                        gpu_milli: milli,
                        submit_ms: rng.below(1000),
                        ..c.gang_spec(&format!("r{round}j{j}"), workers)
                    };
                    c.job_spec(spec);
                }
            };
            decided +=
                c.same_answer_both_ways(&format!("seed {seed}"), 4, add_jobs, |c, indexed| {
                    plan_round(c.cluster(), 10_000, Some(indexed))
                });
        }
        assert!(decided > 1000, "too few placements to compare: {decided}");
    }
}
