//! Policy-level tests: the Aryl roles driven through the SDK `Runtime`, on
//! clusters built with `TestCluster`.

use arbiter_policy_sdk::prelude::*;
use aryl_core::testing::{
    assert_plan_empties, assert_valid, job, loaned, placed, preempted, request, run_on, runtime,
    schedule_valid, training,
};
use aryl_core::{Aryl, GreedyReclaim, RandomReclaim, ScfReclaim};

type ArylP = Aryl<GreedyReclaim>;

#[test]
fn manifest_declares_scheduler_and_reclaim() {
    let m = Runtime::<ArylP>::new().manifest();
    assert_eq!(m.name, "aryl");
    assert_eq!(
        m.roles,
        vec!["scheduler".to_string(), "reclaim".to_string()]
    );
    assert!(!m.default_config.is_empty());
    let mut rt = Runtime::<ArylP>::new();
    rt.configure(&m.default_config).unwrap();
    assert!(rt.configure("no_such_key = 1").is_err());
    assert_eq!(
        Runtime::<Aryl<RandomReclaim>>::new().manifest().name,
        "aryl-random-reclaim"
    );
    assert_eq!(
        Runtime::<Aryl<ScfReclaim>>::new().manifest().name,
        "aryl-scf-reclaim"
    );
}

#[test]
fn inelastic_jobs_go_to_training_servers() {
    let mut c = TestCluster::new();
    let l0 = loaned(&mut c, "i0");
    let t0 = training(&mut c, "t0");
    let t1 = training(&mut c, "t1");
    let _l1 = loaned(&mut c, "i1");
    let j = job(&mut c, "resnet", 2, 2, 2, 4, 3_600_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    let w = placed(&d, j);
    assert_eq!(w.len(), 2);
    // Best fit: both workers on one training server, none on loan.
    assert!(w.iter().all(|w| w.node == t0), "{w:?}");
    assert_ne!(t1, l0);
}

#[test]
fn elastic_jobs_go_to_loaned_servers_with_base_and_flexible_apart() {
    let mut c = TestCluster::new();
    let _t0 = training(&mut c, "t0");
    let l0 = loaned(&mut c, "i0");
    let l1 = loaned(&mut c, "i1");
    let e = job(&mut c, "bert", 1, 4, 4, 2, 3_600_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    let w = placed(&d, e);
    // Phase two gives the whole flexible demand (GPUs are plentiful).
    assert_eq!(w.len(), 4);
    // Base worker (position 0) on one loaned server, the flexible workers
    // (positions 1..) on another loaned server (§5.3).
    assert_eq!(w[0].node, l0);
    assert!(w[1..].iter().all(|w| w.node == l1), "{w:?}");
}

#[test]
fn mixed_round_separates_inelastic_and_elastic_servers() {
    let mut c = TestCluster::new();
    let t0 = training(&mut c, "t0");
    let l0 = loaned(&mut c, "i0");
    let l1 = loaned(&mut c, "i1");
    let i = job(&mut c, "gang", 1, 1, 1, 8, 1_000_000);
    let e = job(&mut c, "elastic", 2, 6, 2, 1, 2_000_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert!(placed(&d, i).iter().all(|w| w.node == t0));
    let we = placed(&d, e);
    assert_eq!(we.len(), 6);
    assert!(we[..2].iter().all(|w| w.node == l0));
    assert!(we[2..].iter().all(|w| w.node == l1));
}

#[test]
fn running_elastic_job_scales_out_onto_loaned_servers() {
    let mut c = TestCluster::new();
    let _t0 = training(&mut c, "t0");
    let l0 = loaned(&mut c, "i0");
    let l1 = loaned(&mut c, "i1");
    let e = job(&mut c, "gnmt", 1, 4, 1, 2, 3_600_000);
    run_on(&mut c, e, &[(l0, 0, 1, 2)]);
    let d = schedule_valid::<ArylP>(&c, 100);
    match d.as_slice() {
        [Decision::ScaleOut(j, added)] => {
            assert_eq!(*j, e);
            assert_eq!(added.len(), 3);
            assert!(added.iter().all(|w| w.node == l1), "{added:?}");
        }
        other => panic!("expected one scale-out, got {other:?}"),
    }
}

#[test]
fn queued_base_demand_takes_gpus_from_flexible_workers() {
    // One 8-GPU server, fully used by an elastic job (4 workers × 2 GPUs,
    // min 1). A queued inelastic 4-GPU job is phase-one demand: the elastic
    // job scales in to 2 workers (phase two gives it the 2 GPUs left) and
    // the queued job starts (§5.2: inelastic workload first).
    let mut c = TestCluster::new();
    let t0 = training(&mut c, "t0");
    let e = job(&mut c, "elastic", 1, 4, 4, 2, 3_600_000);
    run_on(&mut c, e, &[(t0, 0, 4, 2)]);
    let i = job(&mut c, "queued", 1, 1, 1, 4, 600_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert_eq!(d.len(), 2, "{d:?}");
    match &d[0] {
        Decision::ScaleIn(j, positions) => {
            assert_eq!(*j, e);
            assert_eq!(positions.len(), 2);
            assert!(positions.iter().all(|&p| p >= 1), "base worker kept");
        }
        other => panic!("expected a scale-in first, got {other:?}"),
    }
    assert_eq!(placed(&d, i)[0].node, t0);
}

#[test]
fn backfills_when_aggregate_capacity_hides_fragmentation() {
    // Two training servers with 4 free GPUs each: phase one admits the short
    // 8-GPU single-worker job by aggregate count (8 free), which cannot be
    // placed; the backfill then starts the longer 4-GPU job SJF skipped.
    let mut c = TestCluster::new();
    let t0 = training(&mut c, "t0");
    let t1 = training(&mut c, "t1");
    for (k, &n) in [t0, t1].iter().enumerate() {
        let r = job(&mut c, &format!("r{k}"), 1, 1, 1, 4, 9_000_000);
        run_on(&mut c, r, &[(n, 0, 1, 4)]);
    }
    let big = job(&mut c, "big", 1, 1, 1, 8, 1_000);
    let small = job(&mut c, "small", 1, 1, 1, 4, 50_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert_eq!(placed(&d, small).len(), 1);
    assert!(d.iter().all(|x| x.job() != big));
}

#[test]
fn inference_servers_not_on_loan_are_left_alone() {
    let mut c = TestCluster::new();
    c.node("inf", "inference", 96_000, 210_000, "T4", 16_384, 8);
    job(&mut c, "j", 1, 1, 1, 1, 1000);
    job(&mut c, "e", 1, 4, 1, 1, 1000);
    let d = runtime::<ArylP>(&c).schedule(c.round(100)).unwrap();
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn respects_max_decisions() {
    let mut c = TestCluster::new();
    training(&mut c, "t0");
    for k in 0..5 {
        job(&mut c, &format!("j{k}"), 1, 1, 1, 1, 1000 + k);
    }
    let d = runtime::<ArylP>(&c).schedule(c.round(2)).unwrap();
    assert_eq!(d.len(), 2);
    assert_valid(&c, &d);
}

#[test]
fn jobs_on_reclaiming_nodes_are_scaled_in_or_preempted() {
    let mut c = TestCluster::new();
    let t0 = training(&mut c, "t0");
    let l0 = loaned(&mut c, "i0");
    let l1 = loaned(&mut c, "i1");
    let e = job(&mut c, "elastic", 1, 3, 3, 2, 3_600_000);
    run_on(&mut c, e, &[(l0, 0, 1, 2), (l1, 0, 2, 2)]);
    let i = job(&mut c, "inelastic", 1, 1, 1, 4, 3_600_000);
    run_on(&mut c, i, &[(l1, 4, 1, 4)]);
    c.apply(Event::NodeStateChanged(l1, node_state::RECLAIMING));
    let d = schedule_valid::<ArylP>(&c, 100);
    assert!(d.contains(&Decision::ScaleIn(e, vec![1, 2])), "{d:?}");
    assert!(d.contains(&Decision::Preempt(i)), "{d:?}");
    // Nothing new lands on the reclaimed node.
    for dec in &d {
        if let Decision::Place(_, w) | Decision::ScaleOut(_, w) = dec {
            assert!(w.iter().all(|w| w.node != l1));
        }
    }
    assert_ne!(t0, l1);
}

/// Figure 5 as a cluster: six loaned 8-GPU servers, jobs a–d.
fn figure5_cluster() -> (TestCluster, Vec<u32>, [u32; 4]) {
    let mut c = TestCluster::new();
    let _t = training(&mut c, "t0");
    let s: Vec<u32> = (1..=6).map(|k| loaned(&mut c, &format!("s{k}"))).collect();
    let a = job(&mut c, "a", 2, 2, 2, 4, 1);
    run_on(&mut c, a, &[(s[0], 0, 1, 4), (s[1], 0, 1, 4)]);
    let b = job(&mut c, "b", 1, 1, 1, 8, 1);
    run_on(&mut c, b, &[(s[2], 0, 1, 8)]);
    let cj = job(&mut c, "c", 5, 5, 5, 2, 1);
    run_on(&mut c, cj, &[(s[3], 0, 4, 2), (s[4], 0, 1, 2)]);
    let dj = job(&mut c, "d", 5, 5, 5, 2, 1);
    run_on(&mut c, dj, &[(s[5], 0, 4, 2), (s[4], 2, 1, 2)]);
    (c, s, [a, b, cj, dj])
}

#[test]
fn reclaim_figure5_returns_two_servers_with_one_preemption() {
    let (c, s, [a, ..]) = figure5_cluster();
    let plan = runtime::<ArylP>(&c)
        .reclaim(request(&c, s.clone(), 2))
        .unwrap();
    assert_eq!(plan.nodes, vec![s[0], s[1]]);
    assert_eq!(plan.decisions, vec![Decision::Preempt(a)]);
    assert_plan_empties(&c, &plan);
}

#[test]
fn reclaim_returns_exactly_count_candidates_with_valid_decisions() {
    let (c, s, _) = figure5_cluster();
    for count in 0..=6u32 {
        // Candidates in a scrambled order, to check positions map back.
        let candidates = vec![s[4], s[2], s[0], s[5], s[1], s[3]];
        let plan = runtime::<ArylP>(&c)
            .reclaim(request(&c, candidates.clone(), count))
            .unwrap();
        assert_eq!(plan.nodes.len(), count as usize);
        let mut nodes = plan.nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(nodes.len(), count as usize);
        assert!(plan.nodes.iter().all(|n| candidates.contains(n)));
        assert_plan_empties(&c, &plan);
    }
}

#[test]
fn reclaim_scales_in_flexible_workers_before_preempting() {
    let mut c = TestCluster::new();
    let l0 = loaned(&mut c, "i0");
    let l1 = loaned(&mut c, "i1");
    let e = job(&mut c, "elastic", 2, 6, 6, 2, 3_600_000);
    run_on(&mut c, e, &[(l0, 0, 2, 2), (l1, 0, 4, 2)]);
    let i = job(&mut c, "inelastic", 1, 1, 1, 4, 3_600_000);
    run_on(&mut c, i, &[(l0, 4, 1, 4)]);
    let plan = runtime::<ArylP>(&c)
        .reclaim(request(&c, vec![l0, l1], 1))
        .unwrap();
    assert_eq!(plan.nodes, vec![l1]);
    assert_eq!(plan.decisions, vec![Decision::ScaleIn(e, vec![2, 3, 4, 5])]);
    assert_plan_empties(&c, &plan);
}

#[test]
fn reclaim_rejects_bad_requests() {
    let (c, s, _) = figure5_cluster();
    let mut rt = runtime::<ArylP>(&c);
    assert!(rt.reclaim(request(&c, vec![s[0]], 2)).is_err());
    assert!(rt.reclaim(request(&c, vec![s[0], s[0]], 1)).is_err());
    assert!(rt.reclaim(request(&c, vec![999], 1)).is_err());
}

/// Ten loaned servers: servers 0..8 each run their own one-server job; one
/// job spans servers 8 and 9. Returning two servers costs one preemption
/// (8 and 9) and two anywhere else.
fn crafted_reclaim_case() -> (TestCluster, Vec<u32>) {
    let mut c = TestCluster::new();
    let s: Vec<u32> = (0..10).map(|k| loaned(&mut c, &format!("s{k}"))).collect();
    for (k, &node) in s.iter().take(8).enumerate() {
        let j = job(&mut c, &format!("solo{k}"), 1, 1, 1, 8, 1);
        run_on(&mut c, j, &[(node, 0, 1, 8)]);
    }
    let j = job(&mut c, "pair", 2, 2, 2, 8, 1);
    run_on(&mut c, j, &[(s[8], 0, 1, 8), (s[9], 0, 1, 8)]);
    (c, s)
}

#[test]
fn baselines_are_valid_but_preempt_more_than_aryl() {
    let (c, s) = crafted_reclaim_case();
    let aryl = runtime::<ArylP>(&c)
        .reclaim(request(&c, s.clone(), 2))
        .unwrap();
    assert_eq!(preempted(&aryl), 1);
    assert_plan_empties(&c, &aryl);

    // SCF: every server hosts one job, so it takes the first two: 2 preemptions.
    let scf = runtime::<Aryl<ScfReclaim>>(&c)
        .reclaim(request(&c, s.clone(), 2))
        .unwrap();
    assert_eq!(scf.nodes.len(), 2);
    assert_plan_empties(&c, &scf);
    assert_eq!(preempted(&scf), 2);

    // Random, over several seeds: never fewer preemptions, more in total.
    let mut total = 0;
    for seed in 0..20 {
        let mut rt = runtime::<Aryl<RandomReclaim>>(&c);
        rt.configure(&format!("random_seed = {seed}")).unwrap();
        let plan = rt.reclaim(request(&c, s.clone(), 2)).unwrap();
        assert_eq!(plan.nodes.len(), 2);
        assert_plan_empties(&c, &plan);
        assert!(preempted(&plan) >= preempted(&aryl));
        total += preempted(&plan);
    }
    assert!(total > 20 * preempted(&aryl), "random total {total}");
}

#[test]
fn baselines_share_the_scheduler() {
    let mut c = TestCluster::new();
    training(&mut c, "t0");
    loaned(&mut c, "i0");
    job(&mut c, "gang", 1, 1, 1, 4, 1000);
    job(&mut c, "elastic", 1, 3, 1, 2, 5000);
    let a = runtime::<ArylP>(&c).schedule(c.round(100)).unwrap();
    let r = runtime::<Aryl<RandomReclaim>>(&c)
        .schedule(c.round(100))
        .unwrap();
    let s = runtime::<Aryl<ScfReclaim>>(&c)
        .schedule(c.round(100))
        .unwrap();
    assert_eq!(a, r);
    assert_eq!(a, s);
}

#[test]
fn large_round_is_valid() {
    // The benchmark's shape, scaled down for a debug build: training servers,
    // loaned servers, many queued jobs, running elastic jobs.
    let mut c = TestCluster::new();
    let t: Vec<u32> = (0..60)
        .map(|k| training(&mut c, &format!("t{k}")))
        .collect();
    let l: Vec<u32> = (0..40).map(|k| loaned(&mut c, &format!("l{k}"))).collect();
    for k in 0..20u32 {
        let e = job(
            &mut c,
            &format!("e{k}"),
            1,
            4,
            1,
            2,
            1_000_000 + u64::from(k),
        );
        run_on(&mut c, e, &[(l[k as usize % 40], (k / 40) * 2, 1, 2)]);
    }
    for k in 0..200u32 {
        let elastic = k % 10 == 0;
        let gpus = [1, 2, 4, 8][k as usize % 4];
        let (min, max) = if elastic { (1, 4) } else { (1, 1) };
        let workers = if elastic { 2 } else { 1 + k % 2 };
        let (min, max) = if elastic {
            (min, max)
        } else {
            (workers, workers)
        };
        job(
            &mut c,
            &format!("q{k}"),
            min,
            max,
            workers,
            gpus,
            60_000 * u64::from(k % 17 + 1),
        );
    }
    let d = schedule_valid::<ArylP>(&c, 10_000);
    assert!(d.len() > 50);
    assert!(!t.is_empty());
}

/// The benchmark's shape at full size: 443 training servers (3,544 GPUs),
/// 500 loaned servers, 1,000 queued jobs, 100 running elastic jobs; a
/// scheduling round and a reclaim over the 500 loaned servers. Run with
/// `cargo test --release -- --ignored full_scale` to see native timings.
#[test]
#[ignore = "timing run; use --release"]
fn full_scale_round_and_reclaim() {
    let mut c = TestCluster::new();
    let t: Vec<u32> = (0..443)
        .map(|k| training(&mut c, &format!("t{k}")))
        .collect();
    let l: Vec<u32> = (0..500).map(|k| loaned(&mut c, &format!("l{k}"))).collect();
    // Busy training servers: 7 of 8 GPUs used by one inelastic job each.
    for (k, &n) in t.iter().enumerate() {
        let j = job(&mut c, &format!("r{k}"), 1, 1, 1, 7, 5_000_000);
        run_on(&mut c, j, &[(n, 0, 1, 7)]);
    }
    // 100 elastic jobs on loaned servers, 2 workers × 2 GPUs each, and some
    // inelastic work sharing servers with them.
    for k in 0..100usize {
        let e = job(&mut c, &format!("e{k}"), 1, 8, 2, 2, 2_000_000 + k as u64);
        run_on(&mut c, e, &[(l[k], 0, 1, 2), (l[k + 100], 0, 1, 2)]);
        let i = job(&mut c, &format!("x{k}"), 2, 2, 2, 4, 1);
        run_on(
            &mut c,
            i,
            &[(l[k + 200], 0, 1, 4), (l[(k + 1) % 100 + 200], 4, 1, 4)],
        );
    }
    for k in 0..1000u32 {
        let elastic = k % 10 == 0;
        let gpus = [1, 2, 4, 8][k as usize % 4];
        let workers = if elastic { 2 } else { 1 + k % 2 };
        let (min, max) = if elastic { (1, 8) } else { (workers, workers) };
        job(
            &mut c,
            &format!("q{k}"),
            min,
            max,
            workers,
            gpus,
            60_000 * u64::from(k % 97 + 1),
        );
    }
    let mut rt = runtime::<ArylP>(&c);
    let start = std::time::Instant::now();
    let d = rt.schedule(c.round(100_000)).unwrap();
    let schedule = start.elapsed();
    assert_valid(&c, &d);
    let start = std::time::Instant::now();
    let plan = rt.reclaim(request(&c, l.clone(), 250)).unwrap();
    let reclaim = start.elapsed();
    assert_eq!(plan.nodes.len(), 250);
    assert_plan_empties(&c, &plan);
    eprintln!(
        "schedule: {} decisions in {schedule:?}; reclaim 250/500: {} decisions in {reclaim:?}",
        d.len(),
        plan.decisions.len()
    );
}

// ---- contract 0.2: GPU speeds and remaining times ----

/// One full training server whose job has `left_ms` to go, one free loaned
/// T4 server at a third of the speed, and a queued 1-GPU inelastic job.
fn full_training_and_a_slow_loan(left_ms: u64, queued_ms: u64) -> (TestCluster, u32, u32) {
    full_training_and_a_slow_loan_at(left_ms, queued_ms, 1000, 333)
}

fn full_training_and_a_slow_loan_at(
    left_ms: u64,
    queued_ms: u64,
    v100: u32,
    t4: u32,
) -> (TestCluster, u32, u32) {
    let mut c = TestCluster::new();
    let t0 = training(&mut c, "t0");
    let l0 = loaned(&mut c, "i0");
    c.model_speed("V100", v100);
    c.model_speed("T4", t4);
    let busy = job(&mut c, "busy", 1, 1, 1, 8, 10 * left_ms);
    run_on(&mut c, busy, &[(t0, 0, 1, 8)]);
    c.at(1_000);
    c.progress(JobProgress {
        job: busy,
        started_ms: 1,
        attained_ms: 0,
        remaining_ms: left_ms,
        remaining_workers: 1,
        reported_ms: 1_000,
    });
    let q = job(&mut c, "queued", 1, 1, 1, 1, queued_ms);
    (c, q, l0)
}

#[test]
fn a_short_inelastic_job_spills_onto_slow_servers_a_long_one_waits() {
    // The training server frees up in 1 h. A 10-minute job takes 30 min on
    // a T4: sooner than waiting. A 10-hour job would take 30 h: it waits.
    let (c, q, l0) = full_training_and_a_slow_loan(3_600_000, 600_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert!(placed(&d, q).iter().all(|w| w.node == l0));

    let (c, q, _) = full_training_and_a_slow_loan(3_600_000, 36_000_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert!(d.iter().all(|d| d.job() != q), "{d:?}");

    // Speeds are relative to whatever reference the operator chose: with an
    // A100 as the reference (V100 at half, T4 at a sixth), the same holds.
    let (c, q, l0) = full_training_and_a_slow_loan_at(3_600_000, 600_000, 500, 167);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert!(placed(&d, q).iter().all(|w| w.node == l0));
    let (c2, q2, _) = full_training_and_a_slow_loan_at(3_600_000, 36_000_000, 500, 167);
    let d = schedule_valid::<ArylP>(&c2, 100);
    assert!(d.iter().all(|d| d.job() != q2), "{d:?}");

    // §5.3 as written prefers training servers but always spills.
    let (c, q, _) = full_training_and_a_slow_loan(3_600_000, 36_000_000);
    let mut rt = runtime::<ArylP>(&c);
    rt.configure("slow_spill = \"always\"").unwrap();
    let d = rt.schedule(c.round(100)).unwrap();
    assert_valid(&c, &d);
    assert_eq!(placed(&d, q).len(), 1);
}

#[test]
fn equal_speeds_never_hold_a_job_back() {
    // Without a speed (the T4 at the reference speed), the long job spills.
    let mut c = TestCluster::new();
    let t0 = training(&mut c, "t0");
    let l0 = loaned(&mut c, "i0");
    let busy = job(&mut c, "busy", 1, 1, 1, 8, 3_600_000);
    run_on(&mut c, busy, &[(t0, 0, 1, 8)]);
    let q = job(&mut c, "queued", 1, 1, 1, 1, 36_000_000);
    let d = schedule_valid::<ArylP>(&c, 100);
    assert!(placed(&d, q).iter().all(|w| w.node == l0));
}

#[test]
fn loaned_capacity_counts_at_its_speed() {
    // Counted at their speed, two loaned T4 servers (16 GPUs) at a quarter
    // of the speed are worth 4 reference GPUs: phase one admits one 4-GPU
    // job and the knapsack has nothing left for flexible workers. The other
    // job still backfills onto what is physically free.
    let mut c = TestCluster::new();
    let l0 = loaned(&mut c, "i0");
    let _l1 = loaned(&mut c, "i1");
    c.model_speed("T4", 250);
    let e0 = job(&mut c, "e0", 4, 16, 4, 1, 3_600_000);
    let e1 = job(&mut c, "e1", 4, 16, 4, 1, 7_200_000);
    let mut rt = runtime::<ArylP>(&c);
    rt.configure("capacity = \"reference\"").unwrap();
    let d = rt.schedule(c.round(100)).unwrap();
    assert_valid(&c, &d);
    // Phase two has no capacity left over for e0's flexible workers.
    assert_eq!(placed(&d, e0).len(), 4, "{d:?}");
    assert!(placed(&d, e0).iter().all(|w| w.node == l0));
    // e1 came in by backfill, with its base demand only.
    assert_eq!(placed(&d, e1).len(), 4, "{d:?}");
}

#[test]
fn running_elastic_jobs_are_valued_by_what_they_have_left() {
    // Two running elastic jobs submitted with the same estimate; one has
    // almost finished. Phase two gives the free GPUs to the one with more
    // work left (its JCT gains more from them).
    let mut c = TestCluster::new();
    let l0 = loaned(&mut c, "i0");
    let l1 = loaned(&mut c, "i1");
    let done = job(&mut c, "nearly-done", 1, 8, 1, 1, 36_000_000);
    let fresh = job(&mut c, "fresh", 1, 8, 1, 1, 36_000_000);
    run_on(&mut c, done, &[(l0, 0, 1, 1)]);
    run_on(&mut c, fresh, &[(l1, 0, 1, 1)]);
    let l2 = loaned(&mut c, "i2");
    c.at(10_000);
    c.progress(JobProgress {
        job: done,
        started_ms: 1,
        attained_ms: 0,
        remaining_ms: 60_000,
        remaining_workers: 1,
        reported_ms: 10_000,
    });
    // Leave only 6 free GPUs in all: the rest of i0 and i1 is taken.
    let filler = job(&mut c, "filler", 1, 1, 2, 7, 36_000_000);
    run_on(&mut c, filler, &[(l0, 1, 1, 7), (l1, 1, 1, 7)]);
    let hog = job(&mut c, "hog", 1, 1, 1, 2, 36_000_000);
    run_on(&mut c, hog, &[(l2, 0, 1, 2)]);
    let d = schedule_valid::<ArylP>(&c, 100);
    let grown = |j: u32| {
        d.iter()
            .filter_map(|d| match d {
                Decision::ScaleOut(k, w) if *k == j => Some(w.len()),
                _ => None,
            })
            .sum::<usize>()
    };
    assert_eq!(grown(fresh), 6, "{d:?}");
    assert_eq!(grown(done), 0, "{d:?}");
}
