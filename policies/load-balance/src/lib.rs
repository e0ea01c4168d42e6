//! `load-balance`: jobs in arrival order; each worker on the node with the
//! lowest allocation rate that fits it — the baseline "MLaaS in the Wild"
//! (NSDI '22, §6.3) compares reserving-and-packing against. The allocation
//! rate is the mean of the node's allocated shares of CPU, memory and GPU
//! (equal weights: the paper says "weighted" and gives none), so work
//! spreads over every machine, high-end ones included; GPU model plays no
//! part. Ties go to the lower node index.

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
/// memory and GPU shares.
pub fn allocation_rate(plan: &Plan<'_>, node: u32) -> f64 {
    let n = plan.cluster().node(node);
    let gpu_total = n.gpu_range().len() as u32 * FULL_GPU_MILLI;
    (share(plan.free_cpu(node), n.cpu_milli())
        + share(plan.free_memory(node), n.memory_mib())
        + share(plan.node_free_milli(node), gpu_total))
        / 3.0
}

/// The fitting node with the lowest allocation rate.
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
        let pending = cluster.pending_by_arrival();
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        plan.place_each(pending, |plan, job| {
            let node = least_loaded(plan, &plan.job_fit(job.index()))?;
            plan.first_fit_worker(job.index(), node)
        });
        Ok(plan.into_decisions())
    }
}

arbiter_policy_sdk::export_policy!(LoadBalance);

#[cfg(test)]
mod tests {
    use super::*;

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
