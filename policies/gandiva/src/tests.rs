//! Known answers: AntMan's Table 2 "Pack", and Gandiva's packing rules.

use super::*;
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, SharingRules, qos};

const MIN: u64 = 60_000;

fn gandiva(config: &str) -> Gandiva {
    let mut p = Gandiva::create();
    p.configure(config).expect("configuration");
    p
}

/// One node of `gpus` 32 GB V100s.
fn node(gpus: u32, sharing: SharingRules) -> TestCluster {
    let mut c = TestCluster::new();
    c.node("v100-0", "p", 96_000, 736 * 1024, "V100M32", 32_768, gpus);
    c.sharing(sharing);
    c
}

/// Sharing on, shared work beside guaranteed memory (no host spill).
fn shared(oversub_milli: u32, max_shared_workers: u32) -> SharingRules {
    SharingRules {
        oversub_milli,
        max_shared_workers,
        host_spill: false,
    }
}

/// A pending one-GPU job of tenant `t` declaring `memory_mib` of GPU memory.
fn job(c: &mut TestCluster, name: &str, qos: u8, memory_mib: u32, submit_ms: u64) -> u32 {
    job_of(c, name, "t", qos, memory_mib, submit_ms)
}

fn job_of(
    c: &mut TestCluster,
    name: &str,
    tenant: &str,
    qos: u8,
    memory_mib: u32,
    submit_ms: u64,
) -> u32 {
    let spec = JobSpec {
        name: c.intern(name),
        tenant: c.intern(tenant),
        qos,
        workers: 1,
        min_workers: 1,
        max_workers: 1,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker: 1,
        gpu_milli: FULL_GPU_MILLI,
        gpu_memory_mib: memory_mib,
        submit_ms,
        group: c.intern(""),
        ..JobSpec::default()
    };
    c.job_spec(spec)
}

fn on_gpu(gpu: u32) -> Vec<WorkerPlacement> {
    vec![WorkerPlacement {
        node: 0,
        gpus: vec![gpu],
    }]
}

fn gpus_of(d: &[Decision], job: u32) -> Vec<u32> {
    d.iter()
        .find_map(|d| match d {
            Decision::Place(j, w) if *j == job => {
                Some(w.iter().flat_map(|w| w.gpus.iter().copied()).collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("job {job} not placed in {d:?}"))
}

#[test]
fn manifest_and_default_configuration() {
    let m = Runtime::<Gandiva>::new().manifest();
    assert_eq!(m.name, "gandiva");
    assert_eq!(m.roles, vec!["scheduler"]);
    assert_eq!(m.default_config, DEFAULT_CONFIG);
    let cfg = Config::parse(&m.default_config).expect("default");
    assert_eq!(cfg, Config::default());
    assert_eq!(Config::parse("").expect("empty"), Config::default());
    assert_eq!(
        cfg.max_jobs_per_gpu, 2,
        "two jobs per GPU, as AntMan packs them"
    );
    assert!(cfg.memory_check, "§5.2: sufficient GPU memory");
    let c = Config::parse("max_jobs_per_gpu = 3").expect("partial");
    assert!(c.max_jobs_per_gpu == 3 && c.memory_check);
    for bad in [
        "max_jobs_per_gpu = 0",
        "max_jobs = 2",
        "memory_check = \"yes\"",
    ] {
        assert!(Config::parse(bad).is_err(), "{bad:?} should be refused");
        assert!(Gandiva::create().configure(bad).is_err());
    }
}

/// AntMan Table 1/2 as `host/sim` runs Gandiva's "Pack": one 32 GB GPU, sharing on without
/// host spill; Job-A (GCN, 3.5 GB, opportunistic, no quota) at 0 min, Job-B (ResNet,
/// 30 GB, guaranteed, 1-GPU quota) at 26 min.
fn table_2(p: &mut Gandiva) -> TestCluster {
    let mut c = node(1, shared(1000, 4));
    c.quota("quota", Some(u64::from(FULL_GPU_MILLI)));
    let a = job_of(&mut c, "job-a", "no-quota", qos::OPPORTUNISTIC, 3_584, 0);
    assert_eq!(c.run_round(p, 0), vec![Decision::Place(a, on_gpu(0))]);
    job_of(&mut c, "job-b", "quota", qos::GUARANTEED, 30_720, 26 * MIN);
    c
}

#[test]
fn table_2_pack_job_b_is_packed_onto_job_a_s_gpu() {
    let mut p = gandiva("memory_check = false");
    let mut c = table_2(&mut p);
    let b = c.index_of("job-b");
    // No GPU is free: B goes onto A's, as guaranteed work beside A's shared work (the
    // validator's guaranteed admission ignores shared use). Nothing controls their memory
    // on the node: B gets the 28.5 GB A leaves.
    assert_eq!(
        c.run_round(&mut p, 26 * MIN),
        vec![Decision::Place(b, on_gpu(0))]
    );
    assert_eq!(c.cluster().gpu(0).milli_used(), FULL_GPU_MILLI);
    assert_eq!(c.cluster().gpu(0).shared_workers(), 1);
}

#[test]
fn with_its_memory_check_gandiva_does_not_pack_job_b_where_30_gb_do_not_fit_beside_3_5() {
    let mut p = gandiva("");
    let mut c = table_2(&mut p);
    assert_eq!(c.run_round(&mut p, 26 * MIN), vec![]);
}

#[test]
fn free_gpus_come_first() {
    let mut c = node(2, shared(2000, 0));
    let x = job(&mut c, "x", qos::OPPORTUNISTIC, 4_096, 0);
    c.run(x, on_gpu(0));
    // GPU 0 is busy but reports 0 %; GPU 1 is free but still reports the 50 % of work
    // that has ended (samples lag): free comes first all the same.
    c.utilization(&[(0, 0), (1, 50)]);
    let y = job(&mut c, "y", qos::OPPORTUNISTIC, 4_096, 1);
    let d = c.run_round(&mut gandiva(""), 1_000);
    assert_eq!(d, vec![Decision::Place(y, on_gpu(1))]);
}

#[test]
fn with_no_gpu_free_a_job_is_packed_onto_the_least_utilized_busy_gpu() {
    let mut c = node(3, shared(2000, 0));
    for g in 0..3 {
        let r = job(&mut c, &format!("r{g}"), qos::OPPORTUNISTIC, 8_192, 0);
        c.run(r, on_gpu(g));
    }
    c.utilization(&[(0, 90), (1, 30), (2, 60)]);
    let y = job(&mut c, "y", qos::OPPORTUNISTIC, 8_192, 1);
    let d = c.run_round(&mut gandiva(""), 1_000);
    assert_eq!(d, vec![Decision::Place(y, on_gpu(1))]);
}

#[test]
fn this_round_s_placements_count_toward_a_gpu_s_load() {
    let mut c = node(2, shared(3000, 0));
    for g in 0..2 {
        let r = job(&mut c, &format!("r{g}"), qos::OPPORTUNISTIC, 4_096, 0);
        c.run(r, on_gpu(g));
    }
    c.utilization(&[(0, 10), (1, 40)]);
    let y1 = job(&mut c, "y1", qos::OPPORTUNISTIC, 4_096, 1);
    let y2 = job(&mut c, "y2", qos::OPPORTUNISTIC, 4_096, 2);
    let d = c.run_round(&mut gandiva(""), 1_000);
    // y1 on the 10 % GPU makes it 110 %: y2 goes to the 40 % one.
    assert_eq!(gpus_of(&d, y1), vec![0]);
    assert_eq!(gpus_of(&d, y2), vec![1]);
}

#[test]
fn never_more_than_max_jobs_per_gpu() {
    // The operator's rules would take three shared whole-GPU workers on the GPU.
    let build = || {
        let mut c = node(1, shared(3000, 0));
        let js: Vec<u32> = (0..3)
            .map(|k| job(&mut c, &format!("j{k}"), qos::OPPORTUNISTIC, 8_192, k))
            .collect();
        (c, js)
    };
    let (mut c, js) = build();
    let d = c.run_round(&mut gandiva(""), 1_000);
    assert_eq!(
        d,
        vec![
            Decision::Place(js[0], on_gpu(0)),
            Decision::Place(js[1], on_gpu(0))
        ]
    );
    // The third waits, round after round, until one of them ends.
    assert_eq!(c.run_round(&mut gandiva(""), 2_000), vec![]);
    let (mut c, js) = build();
    let d = c.run_round(&mut gandiva("max_jobs_per_gpu = 3"), 1_000);
    assert_eq!(d.len(), 3);
    assert!(js.iter().all(|&j| gpus_of(&d, j) == vec![0]));
}

#[test]
fn two_guaranteed_whole_gpu_jobs_never_share_a_gpu() {
    // Gandiva would pack them; the contract charges both to the GPU's guaranteed account,
    // which holds one. The plan refuses, so the second waits.
    let mut c = node(1, shared(1000, 0));
    let a = job(&mut c, "a", qos::GUARANTEED, 4_096, 0);
    c.run(a, on_gpu(0));
    job(&mut c, "b", qos::GUARANTEED, 4_096, 1);
    assert_eq!(
        c.run_round(&mut gandiva("memory_check = false"), 1_000),
        vec![]
    );
    // An opportunistic one joins it.
    let o = job(&mut c, "o", qos::OPPORTUNISTIC, 4_096, 2);
    let mut c2 = c;
    c2.sharing(SharingRules {
        host_spill: true,
        ..shared(1000, 0)
    });
    let d = c2.run_round(&mut gandiva("memory_check = false"), 2_000);
    assert_eq!(d, vec![Decision::Place(o, on_gpu(0))]);
}

#[test]
fn jobs_are_taken_in_arrival_order() {
    let mut c = node(1, shared(1000, 0));
    let late = job(&mut c, "late", qos::OPPORTUNISTIC, 4_096, 200);
    let early = job(&mut c, "early", qos::OPPORTUNISTIC, 4_096, 100);
    let d = c.run_round(&mut gandiva("max_jobs_per_gpu = 1"), 1_000);
    assert_eq!(d, vec![Decision::Place(early, on_gpu(0))]);
    assert!(!d.iter().any(|d| d.job() == late));
}

#[test]
fn a_gang_fills_free_gpus_on_one_node_before_packing() {
    let mut c = TestCluster::new();
    c.node("v100-0", "p", 96_000, 736 * 1024, "V100M32", 32_768, 4);
    c.node("v100-1", "p", 96_000, 736 * 1024, "V100M32", 32_768, 4);
    c.sharing(shared(2000, 0));
    // Node 0 has 3 free GPUs, node 1 has 4.
    let r = job(&mut c, "r", qos::OPPORTUNISTIC, 4_096, 0);
    c.run(r, on_gpu(0));
    let spec = JobSpec {
        name: c.intern("gang"),
        tenant: c.intern("t"),
        qos: qos::OPPORTUNISTIC,
        workers: 3,
        min_workers: 3,
        max_workers: 3,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker: 1,
        gpu_milli: FULL_GPU_MILLI,
        gpu_memory_mib: 4_096,
        submit_ms: 1,
        group: c.intern(""),
        ..JobSpec::default()
    };
    let gang = c.job_spec(spec);
    let d = c.run_round(&mut gandiva(""), 1_000);
    let mut gpus = gpus_of(&d, gang);
    gpus.sort_unstable();
    assert_eq!(
        gpus,
        vec![1, 2, 3],
        "the free GPUs of the node it fills exactly"
    );
}
