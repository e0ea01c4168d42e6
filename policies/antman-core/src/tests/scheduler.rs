//! The global scheduler: Algorithm 1, reservations, fairness, A6, upgrades, A15.

use super::*;
use crate::quota::TenantBook;
use arbiter_policy_sdk::model::{job_phase, locality, qos};

/// Two servers × eight GPUs: node 0 has GPUs 5, 6, 7 free; node 1 has 14 and 15 free. The
/// busy GPUs run one-GPU guaranteed jobs of tenant `other` named after their GPU.
fn busy_testbed() -> TestCluster {
    let mut c = testbed();
    c.quota("prod", Some(8 * FULL_GPU_MILLI as u64));
    for g in (0..5).chain(8..14) {
        let j = gang(
            &mut c,
            &format!("busy-{g}"),
            "other",
            1,
            1,
            qos::GUARANTEED,
            0,
        );
        run_on(&mut c, j, &[g]);
    }
    c
}

#[test]
fn algorithm_1_reserves_the_three_free_gpus_of_a_server_for_a_four_gpu_one_server_gang() {
    let mut c = busy_testbed();
    let bert = gang(
        &mut c,
        "bert",
        "prod",
        4,
        1,
        qos::GUARANTEED,
        locality::REQUIRE_ONE_NODE,
    );
    let mut p = antman("");
    // Five GPUs are free, but no server has four: reserve, not place.
    assert_eq!(
        c.run_round(&mut p, 1_000),
        vec![Decision::ReserveGpus(bert, vec![5, 6, 7])]
    );
    assert_eq!(c.cluster().job(bert).phase(), job_phase::RESERVED);
    // Nothing changed: the reservation is kept, no decision.
    assert_eq!(c.run_round(&mut p, 2_000), vec![]);
    // GPU 4 frees up: the gang fits on server 0, on its reserved GPUs and GPU 4.
    let busy4 = c.index_of("busy-4");
    c.apply(Event::JobRemoved(busy4));
    let bert = c.index_of("bert");
    let d = c.run_round(&mut p, 3_000);
    assert_eq!(d.len(), 1);
    let mut gpus = placed_gpus(&d[0]);
    gpus.sort_unstable();
    assert_eq!((d[0].job(), gpus), (bert, vec![4, 5, 6, 7]));
    assert!(c.cluster().job(bert).reserved_gpus().is_empty());
}

#[test]
fn without_a_locality_constraint_the_same_gang_is_placed_over_the_fewest_servers() {
    let mut c = busy_testbed();
    let bert = gang(&mut c, "bert", "prod", 4, 1, qos::GUARANTEED, locality::ANY);
    let d = c.run_round(&mut antman(""), 1_000);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].job(), bert);
    let mut gpus = placed_gpus(&d[0]);
    gpus.sort_unstable();
    // All three of server 0, one of server 1.
    assert_eq!(&gpus[..3], &[5, 6, 7]);
    assert!(gpus[3] == 14 || gpus[3] == 15);
}

#[test]
fn a_one_server_gang_goes_whole_onto_one_server_when_one_has_room() {
    let mut c = testbed();
    let j = gang(
        &mut c,
        "gpt",
        "prod",
        4,
        1,
        qos::GUARANTEED,
        locality::PREFER_ONE_NODE,
    );
    let d = c.run_round(&mut antman(""), 1_000);
    let nodes: Vec<u32> = match &d[0] {
        Decision::Place(job, w) if *job == j => w.iter().map(|w| w.node).collect(),
        other => panic!("expected a place, got {other:?}"),
    };
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|&n| n == nodes[0]), "{nodes:?}");
}

/// 10-s utilizations of the four candidate GPUs {85, 40, 10, 79} % (GPUs 5, 6, 7, 14);
/// every other GPU is busier than M.
fn set_utilizations(c: &mut TestCluster) {
    let mut pct: Vec<(u32, u8)> = (0..16).map(|g| (g, 95)).collect();
    for (g, u) in [(5, 85), (6, 40), (7, 10), (14, 79)] {
        pct[g as usize].1 = u;
    }
    c.utilization(&pct);
}

fn opportunistic_job(c: &mut TestCluster, name: &str) -> u32 {
    c.job_on_one_gpu(name, "research", qos::OPPORTUNISTIC, FULL_GPU_MILLI, 3_584)
}

#[test]
fn algorithm_1_puts_an_opportunistic_job_on_the_least_loaded_gpu_below_m_even_if_reserved() {
    // Reserved: GPU 7 is one of the three the guarantee gang holds.
    let mut c = busy_testbed();
    let bert = gang(
        &mut c,
        "bert",
        "prod",
        4,
        1,
        qos::GUARANTEED,
        locality::REQUIRE_ONE_NODE,
    );
    let mut p = antman("");
    c.run_round(&mut p, 1_000);
    assert_eq!(c.cluster().gpu(7).reserved_by(), Some(bert));
    set_utilizations(&mut c);
    let gcn = opportunistic_job(&mut c, "gcn");
    assert_eq!(
        c.run_round(&mut p, 2_000),
        vec![Decision::Place(
            gcn,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![7]
            }]
        )]
    );
    // The reservation stands beside it.
    assert_eq!(c.cluster().gpu(7).reserved_by(), Some(bert));

    // Not reserved: the same GPU.
    let mut c = busy_testbed();
    set_utilizations(&mut c);
    let gcn = opportunistic_job(&mut c, "gcn");
    let d = c.run_round(&mut antman(""), 1_000);
    assert_eq!((d.len(), d[0].job(), placed_gpus(&d[0])), (1, gcn, vec![7]));
}

#[test]
fn no_gpu_at_or_above_m_takes_opportunistic_work_and_m_is_configurable() {
    let mut c = busy_testbed();
    let mut pct: Vec<(u32, u8)> = (0..16).map(|g| (g, 95)).collect();
    for (g, u) in [(5, 85), (6, 90), (7, 80), (14, 81)] {
        pct[g as usize].1 = u;
    }
    c.utilization(&pct);
    opportunistic_job(&mut c, "gcn");
    assert_eq!(c.run_round(&mut antman(""), 1_000), vec![]);
    // With M = 90 %, the 80 % GPU is a candidate (the least loaded).
    let d = c.run_round(
        &mut antman("[scheduler]\nutilization_threshold_pct = 90"),
        2_000,
    );
    assert_eq!(placed_gpus(&d[0]), vec![7]);
}

#[test]
fn two_opportunistic_jobs_of_one_round_do_not_pile_onto_the_same_idle_gpu() {
    let mut c = busy_testbed();
    set_utilizations(&mut c);
    // Half a GPU each: the sharing rules would take both on GPU 7.
    let a = c.job_on_one_gpu("a", "research", qos::OPPORTUNISTIC, 500, 3_584);
    let b = c.job_on_one_gpu("b", "research", qos::OPPORTUNISTIC, 500, 3_584);
    let d = c.run_round(&mut antman(""), 1_000);
    assert_eq!(d.len(), 2);
    assert_eq!((d[0].job(), placed_gpus(&d[0])), (a, vec![7]));
    // GPU 7 now counts 10 + 50 %: the freest below M is GPU 6 (40 %).
    assert_eq!((d[1].job(), placed_gpus(&d[1])), (b, vec![6]));
}

/// A 2-worker opportunistic job of tenant `research` runs on GPUs 0 and 1; a one-GPU
/// guaranteed job of tenant `other` runs on GPU 1 (added last).
fn upgrade_cluster(quota_gpus: u64) -> (TestCluster, u32, u32) {
    let mut c = testbed();
    c.quota("research", Some(quota_gpus * u64::from(FULL_GPU_MILLI)));
    let job = gang(&mut c, "tune", "research", 2, 1, qos::OPPORTUNISTIC, 0);
    run_on(&mut c, job, &[0, 1]);
    let owner = gang(&mut c, "owner", "other", 1, 1, qos::GUARANTEED, 0);
    run_on(&mut c, owner, &[1]);
    (c, job, owner)
}

fn research_use(c: &TestCluster) -> u64 {
    let tenant = c.cluster().job(c.index_of("tune")).tenant_id();
    TenantBook::of(c.cluster()).used_milli(tenant)
}

#[test]
fn upgrade_waits_for_every_worker_and_then_charges_the_whole_job_to_the_quota() {
    let (mut c, job, owner) = upgrade_cluster(2);
    let mut p = antman("");
    // One worker is ready (GPU 0); the other shares GPU 1 with guaranteed work: no upgrade.
    assert_eq!(c.run_round(&mut p, 1_000), vec![]);
    assert_eq!(
        research_use(&c),
        0,
        "opportunistic work takes no quota (A7)"
    );
    // The guaranteed job leaves GPU 1: both workers are ready and the quota holds two.
    c.apply(Event::JobRemoved(owner));
    assert_eq!(
        c.run_round(&mut p, 2_000),
        vec![Decision::SetQos(job, qos::GUARANTEED)]
    );
    assert_eq!(c.cluster().job(job).qos(), qos::GUARANTEED);
    assert_eq!(research_use(&c), 2 * u64::from(FULL_GPU_MILLI));
}

#[test]
fn upgrade_is_never_partial_a_quota_of_one_gpu_keeps_a_two_worker_job_opportunistic() {
    let (mut c, job, owner) = upgrade_cluster(1);
    c.apply(Event::JobRemoved(owner));
    assert_eq!(c.run_round(&mut antman(""), 1_000), vec![]);
    assert_eq!(c.cluster().job(job).qos(), qos::OPPORTUNISTIC);
    // Best-effort (qos 2) work is never upgraded, whatever the quota.
    let (mut c, job, owner) = upgrade_cluster(8);
    c.apply(Event::JobRemoved(owner));
    c.apply(Event::JobQosChanged(job, qos::BEST_EFFORT));
    assert_eq!(c.run_round(&mut antman(""), 1_000), vec![]);
}

#[test]
fn a_long_queued_job_without_quota_runs_as_opportunistic() {
    let mut c = busy_testbed();
    c.quota("students", Some(0));
    let j = gang(&mut c, "homework", "students", 1, 1, qos::GUARANTEED, 0);
    let mut p = antman("[scheduler]\nopportunistic_after_s = 60");
    // Not a guarantee job (no quota) and not waited long enough: nothing, not even a reservation.
    assert_eq!(c.run_round(&mut p, 59_000), vec![]);
    let d = c.run_round(&mut p, 61_000);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0], Decision::SetQos(j, qos::OPPORTUNISTIC));
    assert_eq!(d[1].job(), j);
    assert!(matches!(d[1], Decision::Place(..)));
    let students = c.cluster().job(j).tenant_id();
    assert_eq!(TenantBook::of(c.cluster()).used_milli(students), 0);
    // Switched off, it waits.
    let mut c = busy_testbed();
    c.quota("students", Some(0));
    gang(&mut c, "homework", "students", 1, 1, qos::GUARANTEED, 0);
    let mut p = antman("[scheduler]\nauto_opportunistic = false");
    assert_eq!(c.run_round(&mut p, 10_000_000), vec![]);
}

#[test]
fn fairness_first_the_tenant_furthest_below_its_quota_goes_first() {
    let mut c = TestCluster::new();
    c.node("n", "p", 64_000, 512_000, "V100M32", 32_768, 4);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 0,
        host_spill: true,
    });
    c.quota("a", Some(4000));
    c.quota("b", Some(4000));
    let running = gang(&mut c, "a-running", "a", 3, 1, qos::GUARANTEED, 0);
    run_on(&mut c, running, &[0, 1, 2]);
    // A's job arrived first; one GPU is free.
    gang(&mut c, "a-next", "a", 1, 1, qos::GUARANTEED, 0);
    let b = gang(&mut c, "b-next", "b", 1, 1, qos::GUARANTEED, 0);
    let d = c.run_round(&mut antman(""), 1_000);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].job(), placed_gpus(&d[0])), (b, vec![3]));
}

#[test]
fn at_most_one_guarantee_job_per_gpu_even_for_fractional_work() {
    let mut c = TestCluster::new();
    c.node("n", "p", 64_000, 512_000, "T4", 16_384, 1);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 0,
        host_spill: false,
    });
    let first = c.job_on_one_gpu("half-1", "a", qos::GUARANTEED, 500, 0);
    c.run(
        first,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0],
        }],
    );
    c.job_on_one_gpu("half-2", "a", qos::GUARANTEED, 500, 0);
    // The validator would take it (500 + 500 milli); AntMan does not (A15).
    assert_eq!(c.run_round(&mut antman(""), 1_000), vec![]);
    let d = c.run_round(
        &mut antman("[scheduler]\none_guaranteed_per_gpu = false"),
        2_000,
    );
    assert_eq!(d.len(), 1);

    // Nor is a half-GPU opportunistic job upgraded beside a half-GPU guaranteed one.
    let mut c = TestCluster::new();
    c.node("n", "p", 64_000, 512_000, "T4", 16_384, 1);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 0,
        host_spill: false,
    });
    let on_gpu_0 = || {
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0],
        }]
    };
    let owner = c.job_on_one_gpu("half-1", "a", qos::GUARANTEED, 500, 0);
    c.run(owner, on_gpu_0());
    let guest = c.job_on_one_gpu("half-2", "a", qos::OPPORTUNISTIC, 500, 0);
    c.run(guest, on_gpu_0());
    assert_eq!(c.run_round(&mut antman(""), 1_000), vec![]);
    let d = c.run_round(
        &mut antman("[scheduler]\none_guaranteed_per_gpu = false"),
        2_000,
    );
    assert_eq!(d, vec![Decision::SetQos(guest, qos::GUARANTEED)]);
}

#[test]
fn a_reservation_is_released_when_its_job_is_no_longer_a_guarantee_job() {
    let mut c = busy_testbed();
    let bert = gang(
        &mut c,
        "bert",
        "prod",
        4,
        1,
        qos::GUARANTEED,
        locality::REQUIRE_ONE_NODE,
    );
    let mut p = antman("");
    c.run_round(&mut p, 1_000);
    assert_eq!(c.cluster().job(bert).reserved_gpus(), &[5, 6, 7]);
    // The tenant's quota drops below the gang: it is no longer a guarantee job.
    c.quota("prod", Some(2000));
    assert_eq!(c.run_round(&mut p, 2_000), vec![Decision::Unreserve(bert)]);
    assert_eq!(c.cluster().job(bert).phase(), job_phase::PENDING);
    assert_eq!(c.cluster().gpu(5).reserved_by(), None);
}

#[test]
fn a_tenant_holds_one_reservation_and_others_still_backfill_free_gpus() {
    let mut c = busy_testbed();
    let first = gang(
        &mut c,
        "first",
        "prod",
        4,
        1,
        qos::GUARANTEED,
        locality::REQUIRE_ONE_NODE,
    );
    gang(
        &mut c,
        "second",
        "prod",
        4,
        1,
        qos::GUARANTEED,
        locality::REQUIRE_ONE_NODE,
    );
    let small = gang(&mut c, "small", "prod", 1, 1, qos::GUARANTEED, 0);
    let d = c.run_round(&mut antman(""), 1_000);
    // The head of the queue reserves server 0's three GPUs; the second waits without a
    // reservation; the one-GPU job backfills server 1 (not a reserved GPU).
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0], Decision::ReserveGpus(first, vec![5, 6, 7]));
    assert_eq!(d[1].job(), small);
    assert!(placed_gpus(&d[1])[0] >= 14);
}

/// Table 2 (§5.1) at the scheduler: Job-B (guaranteed, 30 GB) arrives at the one 32 GB GPU
/// that opportunistic Job-A (3.5 GB) holds; AntMan starts it there at once (the coordinator
/// then makes room), it does not wait as FIFO would.
#[test]
fn table_2_the_guaranteed_job_starts_at_once_on_the_gpu_the_opportunistic_one_holds() {
    let mut c = TestCluster::new();
    c.node("v100", "p", 96_000, 768_000, "V100M32", 32_768, 1);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 4,
        host_spill: true,
    });
    c.quota("quota", Some(1000));
    c.quota("no-quota", Some(0));
    let mut p = antman("");
    let a = gang(&mut c, "job-a", "no-quota", 1, 1, qos::OPPORTUNISTIC, 0);
    let on_gpu_0 = vec![WorkerPlacement {
        node: 0,
        gpus: vec![0],
    }];
    assert_eq!(
        c.run_round(&mut p, 0),
        [Decision::Place(a, on_gpu_0.clone())]
    );
    assert!(
        c.run_round(&mut p, 10_000).is_empty(),
        "no quota: never upgraded"
    );
    let b = gang(&mut c, "job-b", "quota", 1, 1, qos::GUARANTEED, 0);
    assert_eq!(
        c.run_round(&mut p, 26 * 60_000),
        [Decision::Place(b, on_gpu_0)],
        "B starts beside A, not after it"
    );
}
