//! `fifo`: jobs in arrival order, each worker on the first node that fits.
//!
//! A job that does not fit is skipped for this round and later jobs may go
//! ahead of it (greedy backfill): strict head-of-line blocking would leave a
//! cluster idle behind one large gang. The host also runs this policy
//! natively as its last-resort fallback.

use arbiter_policy_sdk::prelude::*;

pub struct Fifo;

impl Policy for Fifo {
    fn manifest() -> Manifest {
        manifest(
            "fifo",
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            "Arrival order, first fit, greedy backfill.",
        )
    }

    fn create() -> Self {
        Fifo
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        let pending = cluster.pending_by_arrival();
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        plan.place_each(pending, |plan, job| plan.first_fit_anywhere(job.index()));
        Ok(plan.into_decisions())
    }
}

arbiter_policy_sdk::export_policy!(Fifo);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_in_arrival_order_and_backfills() {
        let mut c = TestCluster::new();
        c.node("n0", "default", 64_000, 512_000, "V100", 32_768, 4);
        let big = c.job("big", "t", 2, 4); // 8 GPUs: cannot fit on one 4-GPU node
        let small = c.job("small", "t", 1, 2);
        let small2 = c.job("small2", "t", 1, 2);
        let late = c.job("late", "t", 1, 1);
        let mut rt = Runtime::<Fifo>::new();
        rt.resync(c.snapshot()).unwrap();
        let d = rt.schedule(c.round(100)).unwrap();
        let placed: Vec<u32> = d.iter().map(Decision::job).collect();
        assert_eq!(placed, vec![small, small2]);
        assert!(!placed.contains(&big) && !placed.contains(&late));
    }
}
