//! Known answers: AntMan's Table 2 (FIFO and Preempt), and the capacity scheduler's rules.

use super::*;
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, JobProgress, SharingRules, locality, qos};

const GPU: u64 = FULL_GPU_MILLI as u64;
const MIN: u64 = 60_000;

fn yarn(config: &str) -> YarnCs {
    let mut p = YarnCs::create();
    p.configure(config).expect("configuration");
    p
}

/// `nodes` nodes of `gpus` 32 GB V100s each (node k's GPUs are `k * gpus ..`).
fn cluster(nodes: u32, gpus: u32) -> TestCluster {
    let mut c = TestCluster::new();
    for k in 0..nodes {
        c.node(
            &format!("v100-{k}"),
            "p",
            96_000,
            736 * 1024,
            "V100M32",
            32_768,
            gpus,
        );
    }
    c
}

/// The operator's sharing rules of the AntMan scenario (`host/sim`'s defaults).
fn sharing_on(c: &mut TestCluster) {
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 4,
        host_spill: true,
    });
}

struct Spec<'a> {
    name: &'a str,
    tenant: &'a str,
    workers: u32,
    gpus_per_worker: u32,
    qos: u8,
    submit_ms: u64,
    gpu_memory_mib: u32,
    locality: u8,
}

impl<'a> Spec<'a> {
    fn new(name: &'a str, tenant: &'a str, workers: u32, submit_ms: u64) -> Self {
        Spec {
            name,
            tenant,
            workers,
            gpus_per_worker: 1,
            qos: qos::GUARANTEED,
            submit_ms,
            gpu_memory_mib: 0,
            locality: locality::ANY,
        }
    }
}

fn add(c: &mut TestCluster, s: Spec<'_>) -> u32 {
    let spec = JobSpec {
        name: c.intern(s.name),
        tenant: c.intern(s.tenant),
        qos: s.qos,
        workers: s.workers,
        min_workers: s.workers,
        max_workers: s.workers,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker: s.gpus_per_worker,
        gpu_milli: FULL_GPU_MILLI,
        gpu_memory_mib: s.gpu_memory_mib,
        submit_ms: s.submit_ms,
        locality: s.locality,
        group: c.intern(""),
        ..JobSpec::default()
    };
    c.job_spec(spec)
}

/// A one-GPU job of `tenant`, running on `(node, gpu)` since `started_ms`.
fn running(c: &mut TestCluster, name: &str, tenant: &str, at: (u32, u32), started_ms: u64) -> u32 {
    let j = add(c, Spec::new(name, tenant, 1, 0));
    c.run(
        j,
        vec![WorkerPlacement {
            node: at.0,
            gpus: vec![at.1],
        }],
    );
    c.progress(JobProgress {
        job: j,
        started_ms,
        ..JobProgress::default()
    });
    j
}

/// The jobs placed, in decision order.
fn placed(d: &[Decision]) -> Vec<u32> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Place(j, _) => Some(*j),
            _ => None,
        })
        .collect()
}

/// The (node, GPUs) of a placed job's workers.
fn workers_of(d: &[Decision], job: u32) -> Vec<(u32, Vec<u32>)> {
    d.iter()
        .find_map(|d| match d {
            Decision::Place(j, w) if *j == job => {
                Some(w.iter().map(|w| (w.node, w.gpus.clone())).collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("job {job} not placed in {d:?}"))
}

fn gpus_of(d: &[Decision], job: u32) -> Vec<u32> {
    let mut g: Vec<u32> = workers_of(d, job)
        .into_iter()
        .flat_map(|(_, g)| g)
        .collect();
    g.sort_unstable();
    g
}

#[test]
fn manifest_and_default_configuration() {
    let m = Runtime::<YarnCs>::new().manifest();
    assert_eq!(m.name, "yarn-cs");
    assert_eq!(m.roles, vec!["scheduler"]);
    assert_eq!(m.default_config, DEFAULT_CONFIG);
    assert_eq!(
        Config::parse(&m.default_config).expect("default"),
        Config::default()
    );
    assert_eq!(Config::parse("").expect("empty"), Config::default());
    assert!(
        !Config::default().preemption,
        "the production baseline does not preempt"
    );
    let c = Config::parse("preemption = true").expect("partial");
    assert!(c.preemption && c.hold_idle_for_quota);
    for bad in [
        "preempt = true",
        "preemption = 1",
        "[scheduler]\npreemption = true",
    ] {
        assert!(Config::parse(bad).is_err(), "{bad:?} should be refused");
        assert!(YarnCs::create().configure(bad).is_err());
    }
}

/// AntMan Table 1/2: the one 32 GB GPU left; Job-A (GCN, 3.5 GB, no quota, submitted as
/// opportunistic) at 0 min, Job-B (ResNet, 30 GB, a 1-GPU quota) at 26 min.
fn table_2(p: &mut YarnCs) -> (TestCluster, u32) {
    let mut c = cluster(1, 1);
    sharing_on(&mut c);
    c.quota("quota", Some(GPU));
    let a = add(
        &mut c,
        Spec {
            qos: qos::OPPORTUNISTIC,
            gpu_memory_mib: 3_584,
            ..Spec::new("job-a", "no-quota", 1, 0)
        },
    );
    // Job-A starts on the idle GPU as it is: beyond its tenant's capacity (none), in the
    // shared account, no QoS change.
    let d = c.run_round(p, 0);
    assert_eq!(
        d,
        vec![Decision::Place(
            a,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![0]
            }]
        )]
    );
    add(
        &mut c,
        Spec {
            gpu_memory_mib: 30_720,
            ..Spec::new("job-b", "quota", 1, 26 * MIN)
        },
    );
    (c, a)
}

#[test]
fn table_2_fifo_the_guaranteed_job_waits_for_the_gpu_without_preemption() {
    let mut p = yarn("");
    let (mut c, a) = table_2(&mut p);
    let b = c.index_of("job-b");
    // The validator would admit Job-B beside Job-A's shared work; YARN-CS gives whole GPUs
    // of their own, so Job-B waits.
    assert!(Plan::new(c.cluster()).gpu_fits(b, 0));
    assert_eq!(c.run_round(&mut p, 26 * MIN), vec![]);
    assert_eq!(c.run_round(&mut p, 30 * MIN), vec![]);
    // Job-A ends at 43 min: Job-B starts (17 min of queueing, Table 2's FIFO column).
    c.apply(Event::JobRemoved(a));
    let b = c.index_of("job-b");
    let d = c.run_round(&mut p, 43 * MIN);
    assert_eq!(placed(&d), vec![b]);
    assert_eq!(gpus_of(&d, b), vec![0]);
}

#[test]
fn table_2_preempt_job_a_is_preempted_and_job_b_placed() {
    let mut p = yarn("preemption = true");
    let (mut c, a) = table_2(&mut p);
    let b = c.index_of("job-b");
    assert_eq!(
        c.run_round(&mut p, 26 * MIN),
        vec![
            Decision::Preempt(a),
            Decision::Place(
                b,
                vec![WorkerPlacement {
                    node: 0,
                    gpus: vec![0]
                }]
            )
        ]
    );
    // Job-A is back in its queue and waits: nothing is idle, and Job-B is within quota.
    assert_eq!(c.run_round(&mut p, 27 * MIN), vec![]);
}

#[test]
fn jobs_of_a_queue_start_in_arrival_order_and_its_head_blocks_the_rest() {
    let mut c = cluster(1, 4);
    c.quota("t", Some(8 * GPU));
    let r0 = running(&mut c, "r0", "t", (0, 0), 0);
    running(&mut c, "r1", "t", (0, 1), 0);
    // Added out of order: `late` has the lower index, `early` arrived first.
    add(&mut c, Spec::new("late", "t", 1, 200));
    add(&mut c, Spec::new("early", "t", 3, 100));
    let mut p = yarn("");
    // `early` needs 3 GPUs and 2 are free: it waits, and `late` waits behind it.
    assert_eq!(c.run_round(&mut p, 1_000), vec![]);
    c.apply(Event::JobRemoved(r0));
    // Job indices move on removal (swap-remove): look them up again.
    let early = c.index_of("early");
    let d = c.run_round(&mut p, 2_000);
    assert_eq!(placed(&d), vec![early]);
    assert_eq!(gpus_of(&d, early), vec![0, 2, 3]);
    // No GPU is left for `late` until r1 ends.
    assert_eq!(c.run_round(&mut p, 3_000), vec![]);
    let r1 = c.index_of("r1");
    c.apply(Event::JobRemoved(r1));
    let late = c.index_of("late");
    let d = c.run_round(&mut p, 4_000);
    assert_eq!(placed(&d), vec![late]);
}

#[test]
fn of_two_jobs_of_one_queue_the_earlier_arrival_gets_the_one_free_gpu() {
    let mut c = cluster(1, 2);
    c.quota("t", Some(8 * GPU));
    running(&mut c, "r0", "t", (0, 0), 0);
    let _late = add(&mut c, Spec::new("late", "t", 1, 200));
    let early = add(&mut c, Spec::new("early", "t", 1, 100));
    let d = c.run_round(&mut yarn(""), 1_000);
    assert_eq!(placed(&d), vec![early]);
    assert_eq!(gpus_of(&d, early), vec![1]);
}

#[test]
fn a_gang_waits_until_all_its_gpus_fit() {
    let mut c = cluster(2, 2);
    c.quota("t", Some(8 * GPU));
    c.quota("other", Some(8 * GPU));
    let busy0 = running(&mut c, "busy0", "other", (0, 0), 0);
    running(&mut c, "busy2", "other", (1, 2), 0);
    // Two GPUs are free but on two nodes; the gang needs both on one.
    add(
        &mut c,
        Spec {
            locality: locality::REQUIRE_ONE_NODE,
            ..Spec::new("pair", "t", 2, 10)
        },
    );
    let mut p = yarn("");
    assert_eq!(c.run_round(&mut p, 1_000), vec![]);
    assert_eq!(c.run_round(&mut p, 2_000), vec![]);
    c.apply(Event::JobRemoved(busy0));
    let pair = c.index_of("pair");
    let d = c.run_round(&mut p, 3_000);
    assert_eq!(placed(&d), vec![pair]);
    assert_eq!(
        workers_of(&d, pair),
        vec![(0, vec![0]), (0, vec![1])],
        "the whole gang, on the node that freed up"
    );
}

#[test]
fn a_gang_is_packed_on_as_few_nodes_as_possible() {
    let mut c = cluster(3, 4);
    c.quota("t", Some(64 * GPU));
    c.quota("other", Some(64 * GPU));
    // Node 0: 3 free; node 1: 4 free; node 2: 2 free.
    running(&mut c, "b0", "other", (0, 0), 0);
    running(&mut c, "b8", "other", (2, 8), 0);
    running(&mut c, "b9", "other", (2, 9), 0);
    let three = add(&mut c, Spec::new("three", "t", 3, 10));
    let five = add(&mut c, Spec::new("five", "t", 5, 20));
    let d = c.run_round(&mut yarn(""), 1_000);
    assert_eq!(placed(&d), vec![three, five]);
    // Three GPUs: the node it fills exactly, not the emptier one.
    assert!(workers_of(&d, three).iter().all(|(n, _)| *n == 0));
    // Five GPUs: all four of node 1 and one of node 2.
    let nodes: Vec<u32> = workers_of(&d, five).iter().map(|(n, _)| *n).collect();
    assert_eq!(nodes, vec![1, 1, 1, 1, 2]);
}

#[test]
fn the_tenant_furthest_below_its_quota_goes_first() {
    let mut c = cluster(1, 4);
    c.quota("x", Some(8 * GPU));
    c.quota("y", Some(2 * GPU));
    // x holds 2 of 8 (25 %), y holds 1 of 2 (50 %); one GPU is free.
    running(&mut c, "x0", "x", (0, 0), 0);
    running(&mut c, "x1", "x", (0, 1), 0);
    running(&mut c, "y0", "y", (0, 2), 0);
    let _y_job = add(&mut c, Spec::new("y-job", "y", 1, 10));
    let x_job = add(&mut c, Spec::new("x-job", "x", 1, 20));
    // x holds more GPUs and its job arrived later, but it is further below its quota.
    let d = c.run_round(&mut yarn(""), 1_000);
    assert_eq!(placed(&d), vec![x_job]);
}

#[test]
fn fairness_alternates_between_tenants_as_their_shares_move() {
    let mut c = cluster(1, 4);
    c.quota("x", Some(4 * GPU));
    c.quota("y", Some(4 * GPU));
    running(&mut c, "x0", "x", (0, 0), 0);
    // x's jobs all arrived before y's; three GPUs are free.
    let x1 = add(&mut c, Spec::new("x1", "x", 1, 1));
    add(&mut c, Spec::new("x2", "x", 1, 2));
    let y1 = add(&mut c, Spec::new("y1", "y", 1, 3));
    let y2 = add(&mut c, Spec::new("y2", "y", 1, 4));
    let d = c.run_round(&mut yarn(""), 1_000);
    // y (0/4) first; then x and y both hold 1/4 and one GPU: the lower tenant id (x, named
    // first) goes; then y (1/4 against x's 2/4).
    assert_eq!(placed(&d), vec![y1, x1, y2]);
}

#[test]
fn idle_gpus_are_lent_beyond_quota_in_the_shared_account_when_sharing_is_on() {
    let mut c = cluster(1, 4);
    sharing_on(&mut c);
    c.quota("q", Some(GPU));
    let j1 = add(&mut c, Spec::new("j1", "q", 1, 1));
    let j2 = add(&mut c, Spec::new("j2", "q", 1, 2));
    let j3 = add(&mut c, Spec::new("j3", "q", 1, 3));
    let d = c.run_round(&mut yarn(""), 1_000);
    // j1 within the 1-GPU quota as guaranteed; j2 and j3 borrow idle GPUs, charged to the
    // shared account so the validator's quota (a hard cap on guaranteed work) holds.
    assert_eq!(d.len(), 5, "{d:?}");
    assert_eq!(placed(&d), vec![j1, j2, j3]);
    assert!(d.contains(&Decision::SetQos(j2, qos::OPPORTUNISTIC)));
    assert!(d.contains(&Decision::SetQos(j3, qos::OPPORTUNISTIC)));
    let mut all: Vec<u32> = [j1, j2, j3].iter().flat_map(|&j| gpus_of(&d, j)).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 3, "each on a GPU of its own");
}

#[test]
fn tenants_without_quota_run_on_idle_gpus_and_a_quota_caps_guaranteed_work_without_sharing() {
    let mut c = cluster(1, 4);
    c.quota("q", Some(GPU));
    let q1 = add(&mut c, Spec::new("q1", "q", 1, 1));
    let q2 = add(&mut c, Spec::new("q2", "q", 1, 2));
    let n1 = add(&mut c, Spec::new("n1", "nq", 1, 3));
    let n2 = add(&mut c, Spec::new("n2", "nq", 1, 4));
    let d = c.run_round(&mut yarn(""), 1_000);
    // Sharing off: every worker is guaranteed, so q cannot go past its quota (the
    // validator's hard cap); the quota-less tenant borrows the idle GPUs.
    assert_eq!(placed(&d), vec![q1, n1, n2]);
    assert!(!placed(&d).contains(&q2));
}

#[test]
fn a_waiting_quota_job_keeps_idle_gpus_from_being_lent() {
    let build = || {
        let mut c = cluster(1, 4);
        c.quota("a", Some(4 * GPU));
        running(&mut c, "b0", "b", (0, 0), 0);
        running(&mut c, "b1", "b", (0, 1), 0);
        add(&mut c, Spec::new("a-four", "a", 4, 10));
        let b2 = add(&mut c, Spec::new("b2", "b", 1, 5));
        (c, b2)
    };
    let (mut c, _) = build();
    assert_eq!(c.run_round(&mut yarn(""), 1_000), vec![]);
    let (mut c, b2) = build();
    let d = c.run_round(&mut yarn("hold_idle_for_quota = false"), 1_000);
    assert_eq!(placed(&d), vec![b2]);
}

#[test]
fn a_job_that_can_never_fit_does_not_hold_the_cluster() {
    let mut c = cluster(1, 4);
    c.quota("a", Some(64 * GPU));
    add(&mut c, Spec::new("too-big", "a", 8, 1));
    let b = add(&mut c, Spec::new("b", "b", 1, 2));
    let small = add(&mut c, Spec::new("small", "a", 1, 3));
    let d = c.run_round(&mut yarn(""), 1_000);
    assert_eq!(placed(&d), vec![small, b]);
}

#[test]
fn a_job_within_quota_submitted_opportunistic_still_runs_as_guaranteed() {
    let mut c = cluster(1, 2);
    sharing_on(&mut c);
    c.quota("q", Some(GPU));
    let j = add(
        &mut c,
        Spec {
            qos: qos::OPPORTUNISTIC,
            ..Spec::new("j", "q", 1, 1)
        },
    );
    let d = c.run_round(&mut yarn(""), 1_000);
    assert_eq!(d[0], Decision::SetQos(j, qos::GUARANTEED));
    assert_eq!(placed(&d), vec![j]);
}

#[test]
fn preemption_takes_the_newest_over_quota_jobs_and_no_more() {
    let mut c = cluster(1, 4);
    c.quota("a", Some(2 * GPU));
    c.quota("c", Some(GPU));
    let _b1 = running(&mut c, "b1", "b", (0, 0), 1_000);
    let b2 = running(&mut c, "b2", "b", (0, 1), 2_000);
    let b3 = running(&mut c, "b3", "b", (0, 2), 3_000);
    // c's job is the newest but within c's quota: never a victim.
    running(&mut c, "c1", "c", (0, 3), 4_000);
    let a = add(&mut c, Spec::new("a", "a", 2, 5_000));
    let d = c.run_round(&mut yarn("preemption = true"), 6_000);
    assert_eq!(&d[..2], &[Decision::Preempt(b3), Decision::Preempt(b2)]);
    assert_eq!(placed(&d), vec![a]);
    assert_eq!(gpus_of(&d, a), vec![1, 2]);
    assert_eq!(d.len(), 3);
}

#[test]
fn preemption_happens_only_when_it_makes_the_job_fit() {
    let mut c = cluster(1, 4);
    c.quota("a", Some(4 * GPU));
    c.quota("c", Some(GPU));
    running(&mut c, "b1", "b", (0, 0), 1_000);
    running(&mut c, "b2", "b", (0, 1), 2_000);
    running(&mut c, "b3", "b", (0, 2), 3_000);
    running(&mut c, "c1", "c", (0, 3), 4_000);
    // Four GPUs within a's quota, but only three are over-quota work.
    add(&mut c, Spec::new("a", "a", 4, 5_000));
    assert_eq!(c.run_round(&mut yarn("preemption = true"), 6_000), vec![]);
}

#[test]
fn preemption_spares_a_newer_job_whose_gpu_does_not_help() {
    let mut c = cluster(2, 2);
    c.quota("a", Some(2 * GPU));
    // Node 0: W (oldest) and X (newest); node 1: Z and Y.
    running(&mut c, "w", "b", (0, 0), 100);
    let x = running(&mut c, "x", "b", (0, 1), 3_000);
    let z = running(&mut c, "z", "b", (1, 2), 1_000);
    let y = running(&mut c, "y", "b", (1, 3), 2_000);
    let a = add(
        &mut c,
        Spec {
            locality: locality::REQUIRE_ONE_NODE,
            ..Spec::new("a", "a", 2, 5_000)
        },
    );
    let d = c.run_round(&mut yarn("preemption = true"), 6_000);
    // Newest first would take X, Y, Z; X's GPU does not let the one-node pair start, so
    // only Y and Z go, and the pair takes node 1.
    assert_eq!(&d[..2], &[Decision::Preempt(y), Decision::Preempt(z)]);
    assert!(!d.contains(&Decision::Preempt(x)));
    assert_eq!(workers_of(&d, a), vec![(1, vec![2]), (1, vec![3])]);
}

#[test]
fn without_preemption_over_quota_work_is_never_touched() {
    let mut c = cluster(1, 2);
    c.quota("a", Some(2 * GPU));
    running(&mut c, "b1", "b", (0, 0), 1_000);
    running(&mut c, "b2", "b", (0, 1), 2_000);
    add(&mut c, Spec::new("a", "a", 1, 5_000));
    assert_eq!(c.run_round(&mut yarn(""), 6_000), vec![]);
}
