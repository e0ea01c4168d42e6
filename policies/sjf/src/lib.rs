//! `sjf`: shortest remaining run time first, each worker on the first node that fits.
//!
//! What a job has left is the host's latest progress report (contract 0.2
//! `remaining-ms`), which starts as the submitted estimate — a *prediction*
//! of the run time, never the truth (in the simulator, from
//! `arbiter_sim::prediction`: an Oracle or a predictor with a stated
//! accuracy, as in "MLaaS in the Wild" §5.2): a preempted job that kept its
//! progress goes ahead of a fresh one of the same size. Jobs with nothing
//! known go after all others, in arrival order.

use arbiter_policy_sdk::prelude::*;

pub struct ShortestJobFirst;

impl Policy for ShortestJobFirst {
    fn manifest() -> Manifest {
        manifest(
            "sjf",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Shortest remaining run time first, first fit.",
        )
    }

    fn create() -> Self {
        ShortestJobFirst
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut pending: Vec<Job<'_>> = cluster.pending_jobs().collect();
        pending.sort_by_key(|j| {
            (
                j.remaining_ms().unwrap_or(u64::MAX),
                j.submit_ms(),
                j.index(),
            )
        });
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        plan.place_each(pending, |plan, job| plan.first_fit_anywhere(job.index()));
        Ok(plan.into_decisions())
    }
}

arbiter_policy_sdk::export_policy!(ShortestJobFirst);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_estimate_wins_the_last_gpu() {
        let mut c = TestCluster::new();
        c.node("n0", "default", 64_000, 512_000, "V100", 32_768, 1);
        let spec = |c: &mut TestCluster, name: &str, estimate_ms: u64| {
            let name = c.intern(name);
            let tenant = c.intern("t");
            c.job_spec(JobSpec {
                name,
                tenant,
                workers: 1,
                min_workers: 1,
                max_workers: 1,
                cpu_milli: 1000,
                memory_mib: 1024,
                gpus_per_worker: 1,
                gpu_milli: 1000,
                estimate_ms,
                ..JobSpec::default()
            })
        };
        let _long = spec(&mut c, "long", 10_000);
        let _unknown = spec(&mut c, "unknown", 0);
        let short = spec(&mut c, "short", 10);
        let mut rt = Runtime::<ShortestJobFirst>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(100)).unwrap();
        assert_eq!(d.iter().map(Decision::job).collect::<Vec<_>>(), vec![short]);
    }

    #[test]
    fn what_is_left_counts_not_what_was_submitted() {
        let mut c = TestCluster::new();
        c.node("n0", "default", 64_000, 512_000, "V100", 32_768, 1);
        let fresh = c.job("fresh", "t", 1, 1);
        let resumed = c.job("resumed", "t", 1, 1);
        for (job, remaining_ms) in [(fresh, 60_000), (resumed, 5_000)] {
            c.progress(JobProgress {
                job,
                remaining_ms,
                remaining_workers: 1,
                ..JobProgress::default()
            });
        }
        let mut rt = Runtime::<ShortestJobFirst>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(100)).unwrap();
        assert_eq!(
            d.iter().map(Decision::job).collect::<Vec<_>>(),
            vec![resumed]
        );
    }
}
