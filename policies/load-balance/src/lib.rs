//! `load-balance`: jobs in arrival order; each worker on the node with the
//! lowest allocation rate that fits it — the baseline "MLaaS in the Wild"
//! (NSDI '22, §6.3) compares reserving-and-packing against. The allocation
//! rate is the mean of the node's allocated shares of CPU, memory and GPU
//! (equal weights: the paper says "weighted" and gives none), so work
//! spreads over every machine, high-end ones included; GPU model plays no
//! part. Ties go to the lower node index.

use arbiter_policy_sdk::node_order::NodeOrder;
use arbiter_policy_sdk::prelude::*;

pub struct LoadBalance;

/// Allocated share of a resource, 0 for a node without any of it.
fn share(free: u32, total: u32) -> f64 {
    if total == 0 {
        0.0
    } else {
        1.0 - f64::from(free) / f64::from(total)
    }
}

/// The node's allocation rate under the plan: mean of its allocated CPU,
/// memory and GPU shares (never negative).
pub fn allocation_rate(plan: &Plan<'_>, node: u32) -> f64 {
    let n = plan.cluster().node(node);
    let gpu_total = n.gpu_range().len() as u32 * FULL_GPU_MILLI;
    let rate = (share(plan.free_cpu(node), n.cpu_milli())
        + share(plan.free_memory(node), n.memory_mib())
        + share(plan.node_free_milli(node), gpu_total))
        / 3.0;
    if rate > 0.0 { rate } else { 0.0 }
}

/// Below this many pending jobs a round scans every node per worker; above
/// it, it walks a [`NodeOrder`] by allocation rate. Both answer the same.
const INDEX_FROM_PENDING: usize = 16;

/// A node's place in the order, as one integer that sorts like (allocation
/// rate, node index): a non-negative `f64`'s bits sort as the number does.
fn order_key(plan: &Plan<'_>, node: u32) -> u128 {
    (u128::from(allocation_rate(plan, node).to_bits()) << 64) | u128::from(node)
}

/// The fitting node with the lowest allocation rate, by a scan.
fn least_loaded(plan: &Plan<'_>, fit: &JobFit) -> Option<u32> {
    let mut best: Option<(f64, u32)> = None;
    plan.each_fitting_node(fit, |node| {
        let rate = allocation_rate(plan, node);
        if best.is_none_or(|(r, _)| rate < r) {
            best = Some((rate, node));
        }
    });
    best.map(|(_, node)| node)
}

impl Policy for LoadBalance {
    fn manifest() -> Manifest {
        manifest(
            "load-balance",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Arrival order; each worker on the least-allocated node that fits.",
        )
    }

    fn create() -> Self {
        LoadBalance
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(plan_round(cluster, round.max_decisions, None))
    }
}

/// One round: pending jobs in arrival order, each worker on the least
/// allocated node where it fits. `indexed` forces the node order on or off
/// (tests); `None` chooses by the number of pending jobs.
fn plan_round(cluster: &Cluster, max_decisions: u32, indexed: Option<bool>) -> Vec<Decision> {
    let pending = cluster.pending_by_arrival();
    let mut plan = Plan::new(cluster).with_max_decisions(max_decisions);
    let mut order = indexed
        .unwrap_or(pending.len() >= INDEX_FROM_PENDING)
        .then(|| NodeOrder::new(cluster.node_count() as u32, |n| order_key(&plan, n)));
    plan.place_each(pending, |plan, job| {
        let fit = plan.job_fit(job.index());
        let node = match order.as_mut() {
            Some(order) => order.first_fit(plan, &fit, 0..u128::MAX, |n| order_key(plan, n)),
            None => least_loaded(plan, &fit),
        }?;
        plan.first_fit_worker(job.index(), node)
    });
    plan.into_decisions()
}

arbiter_policy_sdk::export_policy!(LoadBalance);

#[cfg(test)]
mod tests {
    use super::*;

    /// The node order decides as the scan does: random clusters (mixed GPU
    /// counts, CPU and memory) and queues of whole-GPU, fractional, CPU-only
    /// and gang jobs, several rounds each.
    #[test]
    fn the_node_order_decides_as_the_scan_does() {
        use arbiter_policy_sdk::rng::SplitMix64;
        let mut decided = 0;
        for seed in 0..30u64 {
            let mut rng = SplitMix64::new(seed);
            let mut c = TestCluster::new();
            for n in 0..20 + rng.below(40) {
                let gpus = [0, 2, 8][rng.below(3) as usize];
                let cpu = 16_000 * (1 + rng.below(6) as u32);
                let memory = 64_000 * (1 + rng.below(8) as u32);
                c.node(&format!("n{n}"), "p", cpu, memory, "T4", 16_384, gpus);
            }
            let add_jobs = |c: &mut TestCluster, round: u64| {
                for j in 0..10 + rng.below(60) {
                    let (gpus, milli) = match rng.below(4) {
                        0 => (0, 0),
                        1 => (1, [250, 500][rng.below(2) as usize]),
                        _ => (1 + rng.below(4) as u32, 1000),
                    };
                    let spec = JobSpec {
                        cpu_milli: 1_000 * (1 + rng.below(12) as u32),
                        memory_mib: 4_096 * (1 + rng.below(8) as u32),
                        gpus_per_worker: gpus,
                        gpu_milli: milli,
                        submit_ms: rng.below(1000),
                        ..c.gang_spec(&format!("r{round}j{j}"), 1 + rng.below(3) as u32)
                    };
                    c.job_spec(spec);
                }
            };
            decided +=
                c.same_answer_both_ways(&format!("seed {seed}"), 4, add_jobs, |c, indexed| {
                    plan_round(c.cluster(), 10_000, Some(indexed))
                });
        }
        assert!(decided > 500, "too few placements to compare: {decided}");
    }

    #[test]
    fn work_spreads_to_the_least_allocated_node() {
        let mut c = TestCluster::new();
        c.node("busy", "p", 64_000, 512_000, "V100", 32_768, 8);
        c.node("idle", "p", 64_000, 512_000, "T4", 16_384, 8);
        let running = c.job("running", "t", 1, 4);
        c.run(
            running,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![0, 1, 2, 3],
            }],
        );
        let a = c.job("a", "t", 1, 1);
        let b = c.job("b", "t", 1, 1);
        let mut rt = Runtime::<LoadBalance>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(10)).unwrap();
        // Both go to the idle node: after `a` it is still far less allocated.
        assert_eq!(d.len(), 2);
        for (decision, job) in d.iter().zip([a, b]) {
            assert!(
                matches!(decision, Decision::Place(j, w) if *j == job && w[0].node == 1),
                "{decision:?}"
            );
        }
    }
}
