//! `aryl-scf-reclaim`: Aryl's scheduler with the *Smallest (Job) Count First*
//! reclaim baseline of the Aryl paper (§7.1: "The top-k servers that host the
//! smallest number of jobs are chosen"). The selected servers are emptied
//! exactly as Aryl empties its own, so a comparison isolates the selection
//! rule.

pub use aryl_core::{Aryl, ScfReclaim};

/// The exported policy type.
pub type ArylScfReclaim = Aryl<ScfReclaim>;

arbiter_policy_sdk::export_policy!(ArylScfReclaim);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::prelude::*;

    #[test]
    fn reclaims_exactly_count_servers_with_valid_decisions() {
        let m = Runtime::<ArylScfReclaim>::new().manifest();
        assert_eq!(m.name, "aryl-scf-reclaim");
        assert_eq!(m.roles, vec!["scheduler", "reclaim"]);
        let mut c = TestCluster::new();
        let nodes: Vec<u32> = (0..4)
            .map(|k| {
                let n = c.node(
                    &format!("i{k}"),
                    "inference",
                    96_000,
                    210_000,
                    "T4",
                    16_384,
                    8,
                );
                c.apply(Event::NodeLoanChanged(n, true));
                n
            })
            .collect();
        for (k, &n) in nodes.iter().enumerate() {
            let j = c.job(&format!("j{k}"), "t", 1, 8);
            let gpus = c.cluster().node(n).gpu_range().collect();
            c.run(j, vec![WorkerPlacement { node: n, gpus }]);
        }
        let mut rt = Runtime::<ArylScfReclaim>::new();
        rt.resync(c.snapshot()).unwrap();
        let plan = rt
            .reclaim(ReclaimRequest {
                epoch: c.round(0).epoch,
                candidates: nodes.clone(),
                count: 2,
            })
            .unwrap();
        assert_eq!(plan.nodes.len(), 2);
        assert!(plan.nodes.iter().all(|n| nodes.contains(n)));
        let mut p = Plan::new(c.cluster());
        for d in &plan.decisions {
            p.apply(d.clone()).unwrap();
        }
        assert_eq!(plan.decisions.len(), 2);
    }
}
