//! Known answers from the paper (`round2_papers.md` §1 "Unit tests", Table 2, Algorithm 1)
//! and the decisions the brief asks for (A1–A15).

mod coordinator;
mod scheduler;

use super::*;
use arbiter_policy_sdk::model::SharingRules;

fn antman(config: &str) -> AntMan {
    let mut p = AntMan::create();
    p.configure(config).expect("configuration");
    p
}

#[test]
fn default_configuration_parses_to_the_defaults_and_typos_are_refused() {
    assert_eq!(
        Config::parse(DEFAULT_CONFIG).expect("default"),
        Config::default()
    );
    assert_eq!(Config::parse("").expect("empty"), Config::default());
    let m = AntMan::manifest();
    assert_eq!(m.name, "antman");
    assert_eq!(m.roles, vec!["scheduler", "coordinator"]);
    assert_eq!(m.default_config, DEFAULT_CONFIG);
    // Only the keys given change.
    let c = Config::parse("[scheduler]\nutilization_threshold_pct = 60").expect("partial");
    assert_eq!(c.scheduler.utilization_threshold_pct, 60);
    assert_eq!(c.coordinator, CoordinatorConfig::default());
    for bad in [
        "utilization_threshold_pct = 80",
        "[scheduler]\nutilisation_threshold_pct = 80",
        "[scheduler]\nutilization_threshold_pct = 0",
        "[coordinator]\nshare_floor_permille = 0",
        "[coordinator]\nopportunistic_max_permille = 1001",
        "[coordinator]\nshare_floor_permille = 100\nopportunistic_max_permille = 50",
        "[coordinator]\nthrottle = \"sometimes\"",
        "[coordinator]\nbaseline_samples = 0",
    ] {
        assert!(Config::parse(bad).is_err(), "{bad:?} should be refused");
        assert!(AntMan::create().configure(bad).is_err());
    }
}

/// Two servers of eight 32 GB V100s (the paper's testbed nodes), sharing on with host
/// spill (the node may move opportunistic memory to the host).
fn testbed() -> TestCluster {
    let mut c = TestCluster::new();
    for k in 0..2 {
        c.node(
            &format!("v100-{k}"),
            "p",
            96_000,
            768_000,
            "V100M32",
            32_768,
            8,
        );
    }
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 0,
        host_spill: true,
    });
    c
}

/// A pending gang of `workers` × `gpus_per_worker` whole GPUs.
fn gang(
    c: &mut TestCluster,
    name: &str,
    tenant: &str,
    workers: u32,
    gpus_per_worker: u32,
    qos: u8,
    locality: u8,
) -> u32 {
    let spec = JobSpec {
        name: c.intern(name),
        tenant: c.intern(tenant),
        qos,
        workers,
        min_workers: workers,
        max_workers: workers,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker,
        gpu_milli: FULL_GPU_MILLI,
        submit_ms: c.cluster().job_count() as u64,
        locality,
        group: c.intern(""),
        ..JobSpec::default()
    };
    c.job_spec(spec)
}

/// Runs `job` with one worker on each of `gpus` (eight GPUs per node).
fn run_on(c: &mut TestCluster, job: u32, gpus: &[u32]) {
    let workers = gpus
        .iter()
        .map(|&g| WorkerPlacement {
            node: g / 8,
            gpus: vec![g],
        })
        .collect();
    c.run(job, workers);
}

/// The GPUs a decision places a job on.
fn placed_gpus(d: &Decision) -> Vec<u32> {
    match d {
        Decision::Place(_, w) => w.iter().flat_map(|w| w.gpus.iter().copied()).collect(),
        other => panic!("expected a place, got {other:?}"),
    }
}
