//! `best-fit`: jobs in arrival order; each worker on the node that its
//! placement leaves with the least free GPU capacity (then least free CPU),
//! and on that node the fullest GPUs that still fit.
//!
//! Packing tightly keeps whole nodes and whole GPUs free for large gangs and
//! for jobs that want an unshared GPU.

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
        let mut pending: Vec<Job<'_>> = cluster.pending_jobs().collect();
        pending.sort_by_key(|j| (j.submit_ms(), j.index()));
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        plan.place_each(pending, |plan, job| {
            // Least free GPU capacity left behind, then least free CPU.
            let fit = plan.job_fit(job.index());
            let per_gpu = if fit.fractional_milli > 0 {
                fit.fractional_milli
            } else {
                FULL_GPU_MILLI
            };
            let mut best: Option<((u32, u32), u32)> = None;
            plan.each_fitting_node(&fit, |n| {
                let leftover = (
                    plan.node_free_milli(n) - per_gpu * fit.gpus,
                    plan.free_cpu(n) - fit.cpu_milli,
                );
                if best.is_none_or(|(b, _)| leftover < b) {
                    best = Some((leftover, n));
                }
            });
            best.map(|(_, n)| worker_on(plan, job, n))
        });
        Ok(plan.into_decisions())
    }
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
}
