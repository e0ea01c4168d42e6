//! `antman`: AntMan (Xiao et al., OSDI '20) as one component with two roles.
//!
//! * `scheduler` — the global scheduler: Algorithm 1 with per-tenant queues and fairness
//!   first, GPU reservations for guarantee gangs, opportunistic jobs on the least-loaded
//!   GPUs below M = 80 % utilization (reserved GPUs included), long-queued jobs without quota
//!   run as opportunistic, and all-or-nothing upgrades (§3.2, §3.3).
//! * `coordinator` — the local coordinator on each node (`arbiter node --policy antman`):
//!   opportunistic memory and SM held down when guaranteed work arrives, SM raised step by
//!   step while the guaranteed mini-batch time holds and throttled pessimistically when it
//!   does not, memory surges, memory by trial among opportunistic workloads (§3.3).
//!
//! The body is `antman-core`.

pub use antman_core::{AntMan, Config};

arbiter_policy_sdk::export_policy!(AntMan);

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::prelude::*;

    #[test]
    fn manifest_names_both_roles_and_its_default_configuration_parses() {
        let m = Runtime::<AntMan>::new().manifest();
        assert_eq!(m.name, "antman");
        assert_eq!(m.roles, vec!["scheduler", "coordinator"]);
        let cfg = Config::parse(&m.default_config).expect("default parses");
        assert_eq!(cfg, Config::default());
        assert_eq!(cfg.scheduler.utilization_threshold_pct, 80, "the paper's M");
    }
}
