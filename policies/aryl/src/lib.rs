//! `aryl`: the Aryl scheduler (Li et al.) as one component with two roles.
//!
//! * `scheduler` — Algorithm 2: SJF over inelastic jobs and elastic jobs'
//!   base demand, then a multiple-choice knapsack over the flexible demand of
//!   queued and running elastic jobs; best-fit-decreasing placement with
//!   inelastic jobs on training servers and elastic jobs on loaned inference
//!   servers, base and flexible workers on separate server groups (§5).
//! * `reclaim` — scale in flexible workers first, then pick servers by the
//!   server preemption cost of Algorithm 1 (§4).
//!
//! The algorithms live in `aryl-core` (shared with the reclaim baselines).

pub use aryl_core::Config;

aryl_core::aryl_policy!(ArylPolicy = GreedyReclaim);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::prelude::*;
    use aryl_core::testing::{loaned, request, runtime, training};

    #[test]
    fn exported_type_is_aryl_with_both_roles() {
        let m = Runtime::<ArylPolicy>::new().manifest();
        assert_eq!(m.name, "aryl");
        assert_eq!(m.roles, vec!["scheduler", "reclaim"]);
    }

    #[test]
    fn schedules_and_reclaims_through_the_runtime() {
        let mut c = TestCluster::new();
        training(&mut c, "t0");
        let l0 = loaned(&mut c, "i0");
        let j = c.job("gang", "t", 1, 4);
        let mut rt = runtime::<ArylPolicy>(&c);
        let d = rt.schedule(c.round(10)).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].job(), j);
        let plan = rt.reclaim(request(&c, vec![l0], 1)).unwrap();
        assert_eq!(plan.nodes, vec![l0]);
        assert!(plan.decisions.is_empty());
    }
}
