//! # Aryl core
//!
//! The algorithms of *Aryl: An Elastic Cluster Scheduler for Deep Learning*
//! (Li et al.) over plain data, and the glue that maps the SDK cluster mirror
//! onto them. Shared by the `aryl` policy and its reclaim baselines
//! (`aryl-random-reclaim`, `aryl-scf-reclaim`); this crate exports no
//! component itself.
//!
//! * [`jct`] — running time / JCT model of elastic jobs (Eq. 1, Tables 3–4),
//!   linear or sub-linear (§7.2) speed-up;
//! * [`knapsack`] — the multiple-choice knapsack DP (§5.2, `MaxValueDP`);
//! * [`alloc`] — Algorithm 2: SJF on inelastic demand, knapsack on flexible;
//! * [`reclaim`] — Algorithm 1 (server preemption cost), the Random and SCF
//!   baselines and an exhaustive optimum;
//! * [`schedule`] / [`policy`] — the scheduler and reclaim roles;
//! * [`aryl_policy!`] / [`reclaim_baseline!`] — a policy crate's whole body;
//! * [`testing`] — cluster builders and checks shared by the tests.

pub mod alloc;
pub mod config;
pub mod jct;
pub mod knapsack;
pub mod policy;
pub mod reclaim;
pub mod schedule;
pub mod testing;

pub use config::Config;
pub use policy::{Aryl, GreedyReclaim, RandomReclaim, ReclaimStrategy, ScfReclaim};

#[doc(hidden)]
pub use arbiter_policy_sdk as __sdk;

/// A policy crate's body: `pub type $policy = Aryl<$strategy>`, exported as
/// the crate's component, with `Aryl` and `$strategy` re-exported.
///
/// ```
/// aryl_core::aryl_policy!(ArylPolicy = GreedyReclaim);
/// # use arbiter_policy_sdk::Policy;
/// assert_eq!(ArylPolicy::manifest().name, "aryl");
/// ```
#[macro_export]
macro_rules! aryl_policy {
    ($policy:ident = $strategy:ident) => {
        pub use $crate::{Aryl, $strategy};

        /// The exported policy type.
        pub type $policy = $crate::Aryl<$strategy>;

        $crate::__sdk::export_policy!($policy);
    };
}

/// A reclaim-baseline crate's body (§7.1): [`aryl_policy!`] plus a test that
/// the policy is named `$name`, has both roles and reclaims exactly the asked
/// number of servers with decisions that apply to a [`Plan`](arbiter_policy_sdk::Plan).
///
/// ```
/// aryl_core::reclaim_baseline!(ArylScfReclaim = ScfReclaim, "aryl-scf-reclaim");
/// # use arbiter_policy_sdk::Policy;
/// assert_eq!(ArylScfReclaim::manifest().name, "aryl-scf-reclaim");
/// ```
#[macro_export]
macro_rules! reclaim_baseline {
    ($policy:ident = $strategy:ident, $name:literal) => {
        $crate::aryl_policy!($policy = $strategy);

        #[cfg(test)]
        mod tests {
            use super::*;
            use $crate::__sdk::prelude::*;
            use $crate::testing::{assert_valid, loaned, request, run_on, runtime};

            #[test]
            fn reclaims_exactly_count_servers_with_valid_decisions() {
                let m = Runtime::<$policy>::new().manifest();
                assert_eq!(m.name, $name);
                assert_eq!(m.roles, vec!["scheduler", "reclaim"]);
                let mut c = TestCluster::new();
                let nodes: Vec<u32> = (0..4).map(|k| loaned(&mut c, &format!("i{k}"))).collect();
                for (k, &n) in nodes.iter().enumerate() {
                    let j = c.job(&format!("j{k}"), "t", 1, 8);
                    run_on(&mut c, j, &[(n, 0, 1, 8)]);
                }
                let plan = runtime::<$policy>(&c)
                    .reclaim(request(&c, nodes.clone(), 2))
                    .unwrap();
                assert_eq!(plan.nodes.len(), 2);
                assert!(plan.nodes.iter().all(|n| nodes.contains(n)));
                assert_valid(&c, &plan.decisions);
                assert_eq!(plan.decisions.len(), 2);
            }
        }
    };
}
