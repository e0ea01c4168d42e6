//! The Aryl paper's own worked examples, checked against the pure algorithms.

use aryl_core::alloc::{self, AllocParams, QueuedJob};
use aryl_core::jct::{ElasticJob, Speedup, average, simulate_jcts};
use aryl_core::reclaim::{
    ReclaimJob, ReclaimProblem, greedy_select, optimal_select, preemptions, random_select,
    scf_select, server_costs, vacate,
};

const LIN: Speedup = Speedup::Linear;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.01
}

fn assert_all_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(close(*g, *w), "got {got:?}, want {want:?}");
    }
}

fn inelastic(workers: u32, gpus_per_worker: u32, on: &[(usize, &[u32])]) -> ReclaimJob {
    ReclaimJob {
        workers,
        min_workers: workers,
        gpus_per_worker,
        on_servers: on.iter().map(|(s, p)| (*s, p.to_vec())).collect(),
    }
}

/// Figure 5, reconstructed from Table 1 (8-GPU servers; paper servers 1–6
/// are positions 0–5 here):
/// * job a: half its GPUs on server 1, half on server 2;
/// * job b: all of its GPUs on server 3;
/// * job c: 80% of its GPUs on server 4, 20% on server 5;
/// * job d: 80% of its GPUs on server 6, 20% on server 5.
///
/// `order[k]` is the position paper server `k + 1` gets, so the same cluster
/// can be presented in another order.
fn figure5(order: [usize; 6]) -> ReclaimProblem {
    let s = |paper: usize| order[paper - 1];
    ReclaimProblem {
        servers: 6,
        jobs: vec![
            inelastic(2, 4, &[(s(1), &[0]), (s(2), &[1])]),
            inelastic(1, 8, &[(s(3), &[0])]),
            inelastic(5, 2, &[(s(4), &[0, 1, 2, 3]), (s(5), &[4])]),
            inelastic(5, 2, &[(s(6), &[0, 1, 2, 3]), (s(5), &[4])]),
        ],
    }
}

const IDENTITY: [usize; 6] = [0, 1, 2, 3, 4, 5];

#[test]
fn figure5_table1_three_cost_definitions() {
    let costs = server_costs(&figure5(IDENTITY));
    let jobs: Vec<u32> = costs.iter().map(|c| c.jobs).collect();
    let gpu: Vec<f64> = costs.iter().map(|c| c.gpu_fraction).collect();
    let server: Vec<f64> = costs.iter().map(|c| c.server_fraction).collect();
    // Table 1, columns 2–4.
    assert_eq!(jobs, vec![1, 1, 1, 1, 2, 1]);
    assert_all_close(&gpu, &[0.5, 0.5, 1.0, 0.8, 0.4, 0.8]);
    assert_all_close(&server, &[0.5, 0.5, 1.0, 0.5, 1.0, 0.5]);
}

#[test]
fn figure5_why_the_naive_costs_fail() {
    let p = figure5(IDENTITY);
    // Job count as an independent knapsack value: "would select any two
    // 1-cost servers such as 3 and 4 which lead to more preemptions".
    assert_eq!(preemptions(&p, &[2, 3]), 2);
    // GPU fraction: server 5 has the least cost (0.4) and alone preempts two jobs.
    let costs = server_costs(&p);
    let cheapest = (0..6)
        .min_by(|&a, &b| costs[a].gpu_fraction.total_cmp(&costs[b].gpu_fraction))
        .unwrap();
    assert_eq!(cheapest, 4);
    assert_eq!(preemptions(&p, &[4]), 2);
}

#[test]
fn figure5_reclaiming_two_servers_preempts_exactly_one_job() {
    let p = figure5(IDENTITY);
    let chosen = greedy_select(&p, 2);
    // "Servers 1 and 2 are obviously the optimal choice with one preemption."
    assert_eq!(chosen, vec![0, 1]);
    let v = vacate(&p, &chosen);
    assert_eq!(v.preempted, vec![0]); // job a only
    assert!(v.scaled_in.is_empty());
    // The exhaustive optimum agrees.
    let best = optimal_select(&p, 2, 1_000).unwrap();
    assert_eq!(preemptions(&p, &best), 1);
}

#[test]
fn figure5_tie_break_does_not_depend_on_server_order() {
    // Put server 4 (job c's 80%) first and server 1 last: a lowest-index
    // tie-break would now start with job c and end with two preemptions.
    // Our tie-break prefers the server whose preemption leaves a partner
    // server with nothing else to preempt (server 1 frees server 2; server 4
    // leaves server 5 still hosting job d).
    let order = [5, 4, 1, 0, 2, 3];
    let p = figure5(order);
    let chosen = greedy_select(&p, 2);
    assert_eq!(preemptions(&p, &chosen), 1, "chose {chosen:?}");
    let mut sorted = chosen.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![4, 5]); // paper servers 2 and 1
}

#[test]
fn figure5_single_server_is_the_one_with_fewest_preemptions() {
    // N_R = 1 (Algorithm 1, lines 18–20): any single-job server; server 5
    // (two jobs) never.
    let p = figure5(IDENTITY);
    let one = greedy_select(&p, 1);
    assert_eq!(one.len(), 1);
    assert_eq!(preemptions(&p, &one), 1);
    assert_ne!(one[0], 4);
}

#[test]
fn flexible_group_is_released_by_scale_in_before_any_preemption() {
    // Server 0: base workers of elastic job e (min 2) and an inelastic job;
    // server 1: flexible workers of e only; server 2: a one-server job.
    // Returning one server must scale e in (no preemption).
    let p = ReclaimProblem {
        servers: 3,
        jobs: vec![
            ReclaimJob {
                workers: 4,
                min_workers: 2,
                gpus_per_worker: 2,
                on_servers: vec![(0, vec![0, 1]), (1, vec![2, 3])],
            },
            inelastic(1, 4, &[(0, &[0])]),
            inelastic(1, 8, &[(2, &[0])]),
        ],
    };
    for count in [1, 2] {
        let chosen = greedy_select(&p, count);
        assert_eq!(chosen[0], 1);
        let v = vacate(&p, &chosen);
        if count == 1 {
            assert!(v.preempted.is_empty());
            assert_eq!(v.scaled_in, vec![(0, vec![2, 3])]);
        } else {
            // Second server: e has no slack left, so server 0 would cost two
            // preemptions (e and the inelastic job); server 2 costs one.
            assert_eq!(chosen[1], 2);
            assert_eq!(v.preempted, vec![2]);
        }
    }
}

#[test]
fn greedy_is_never_better_than_the_optimum_and_baselines_are_valid() {
    // A deterministic family of small random clusters.
    let mut state = arbiter_policy_sdk::rng::SplitMix64::new(42);
    let mut next = |m: u64| state.next_u64() % m;
    for _ in 0..200 {
        let servers = next(6) as usize + 2;
        let mut jobs = Vec::new();
        for _ in 0..next(6) + 1 {
            let spread = next(3) as usize + 1;
            let start = next(servers as u64) as usize;
            let elastic = next(3) == 0;
            let on: Vec<(usize, Vec<u32>)> = (0..spread)
                .map(|k| ((start + k) % servers, vec![k as u32]))
                .collect::<Vec<_>>();
            let mut on = on;
            on.sort();
            on.dedup_by_key(|e| e.0);
            let workers = on.len() as u32 + next(2) as u32;
            jobs.push(ReclaimJob {
                workers,
                min_workers: if elastic { 1 } else { workers },
                gpus_per_worker: 1,
                on_servers: on,
            });
        }
        let p = ReclaimProblem { servers, jobs };
        let count = next(servers as u64) as usize + 1;
        let best = optimal_select(&p, count, 10_000).unwrap();
        let g = greedy_select(&p, count);
        assert_eq!(g.len(), count);
        assert!(preemptions(&p, &g) >= preemptions(&p, &best));
        for sel in [scf_select(&p, count), random_select(&p, count, 7)] {
            assert_eq!(sel.len(), count);
            let mut s = sel.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), count);
            assert!(preemptions(&p, &sel) >= preemptions(&p, &best));
        }
    }
}

// ---- §5.1: Tables 2–4 ----

/// Table 2: A (w 2..=6, 50 s at 6 workers), B (w 2..=6, 20 s at 6 workers),
/// one GPU per worker, a cluster of 8 workers.
fn table2() -> [ElasticJob; 2] {
    [
        ElasticJob::from_min_running_time(2, 6, 1, 50.0, LIN),
        ElasticJob::from_min_running_time(2, 6, 1, 20.0, LIN),
    ]
}

/// Table 4: A becomes w 2..=3 with 100 s at 3 workers; B as in Table 2.
fn table4() -> [ElasticJob; 2] {
    [
        ElasticJob::from_min_running_time(2, 3, 1, 100.0, LIN),
        ElasticJob::from_min_running_time(2, 6, 1, 20.0, LIN),
    ]
}

#[test]
fn table3_jcts_of_the_three_allocations() {
    let jobs = table2();
    // (initial allocation, JCT of A and B, average) — Table 3.
    let rows: [([u32; 2], [f64; 2], f64); 3] = [
        ([6, 2], [50.0, 53.33], 51.67),
        ([2, 6], [63.33, 20.0], 41.67),
        ([4, 4], [60.0, 30.0], 45.0),
    ];
    for (alloc, want, avg) in rows {
        let got = simulate_jcts(&jobs, &alloc, 8, LIN);
        assert_all_close(&got, &want);
        assert!(close(average(&got), avg));
    }
}

#[test]
fn table4_jcts_when_favouring_either_job() {
    let jobs = table4();
    // Favour A (A at its max 3, B gets the other 5): A 100, B 24, avg 62.
    let a = simulate_jcts(&jobs, &[3, 5], 8, LIN);
    assert_all_close(&a, &[100.0, 24.0]);
    assert!(close(average(&a), 62.0));
    // Favour B (B at 6, A at 2): A 106.67, B 20, avg 63.33.
    let b = simulate_jcts(&jobs, &[2, 6], 8, LIN);
    assert_all_close(&b, &[106.67, 20.0]);
    assert!(close(average(&b), 63.33));
}

fn queued(jobs: &[ElasticJob]) -> Vec<QueuedJob> {
    jobs.iter()
        .enumerate()
        .map(|(key, job)| QueuedJob {
            key,
            job: *job,
            runtime_known: true,
            submit_ms: 0,
        })
        .collect()
}

/// What Algorithm 2 itself does on Table 2, derived by hand:
///
/// * `T^max` (running time at `w_min` = 2): A = 50·6/2 = 150, B = 20·6/2 = 60.
/// * SortJobs: B (60) before A (150). Phase one gives both their base demand,
///   2 + 2 workers, leaving `C* = 8 − 4 = 4`.
/// * Items `w = 1..=4` flexible workers, weight `w`, value `T^max·w/(w+2)`:
///   A: 50, 75, 90, 100; B: 20, 30, 36, 40.
/// * Best pair within weight 4: A3+B1 = 110 (A2+B2 = 105, A4 = 100,
///   A1+B3 = 86, B4 = 40). So A runs with 5 workers and B with 3.
/// * JCT: B finishes at 120/3 = 40; by then A did 200 of 300, the rest at 6
///   workers takes 16.67, so A ends at 56.67; average 48.33 — better than
///   Table 3's solution 1 (51.67) but not the optimum, solution 2 (41.67):
///   the knapsack values ignore that a job finishing early hands its GPUs on.
#[test]
fn algorithm2_on_table2() {
    let jobs = table2();
    let a = alloc::allocate(&queued(&jobs), &[], 8, AllocParams::default());
    assert_eq!(a.admitted, vec![1, 0]); // SJF: B first
    assert_eq!(a.workers_of(0), Some(5));
    assert_eq!(a.workers_of(1), Some(3));
    assert_eq!(a.left_gpus, 0);
    assert_eq!(a.dp_unit, 1);
    let jct = simulate_jcts(&jobs, &[5, 3], 8, LIN);
    assert_all_close(&jct, &[56.67, 40.0]);
    assert!(close(average(&jct), 48.33));
}

/// What Algorithm 2 does on Table 4, derived by hand:
///
/// * `T^max`: A = 100·3/2 = 150, B = 60. Phase one: B then A, 2 + 2 workers,
///   `C* = 4`.
/// * Items: A has one (w = 1, weight 1, value 150·1/3 = 50); B as before
///   20, 30, 36, 40.
/// * Best within weight 4: A1+B3 = 86 (A1+B2 = 80, B4 = 40). So A gets 3
///   workers and B 5 — "favour A", whose average JCT 62 beats SJF's 63.33:
///   here the knapsack values find the counter-example's better answer.
#[test]
fn algorithm2_on_table4() {
    let jobs = table4();
    let a = alloc::allocate(&queued(&jobs), &[], 8, AllocParams::default());
    assert_eq!(a.workers_of(0), Some(3));
    assert_eq!(a.workers_of(1), Some(5));
    let jct = simulate_jcts(&jobs, &[3, 5], 8, LIN);
    assert!(close(average(&jct), 62.0));
}

#[test]
fn figure6_items_with_two_gpus_per_worker_for_a() {
    // Figure 6's setting: Table 4's jobs with A needing 2 GPUs per worker
    // and B 1. A's single item weighs 2 GPUs; B's items weigh 1..=4.
    let a = ElasticJob::from_min_running_time(2, 3, 2, 100.0, LIN);
    let b = ElasticJob::from_min_running_time(2, 6, 1, 20.0, LIN);
    let ia = alloc::flexible_items(&a, LIN);
    assert_eq!(ia.len(), 1);
    assert_eq!(ia[0].weight, 2);
    assert!(close(ia[0].value, 50.0));
    let ib = alloc::flexible_items(&b, LIN);
    let w: Vec<u32> = ib.iter().map(|i| i.weight).collect();
    assert_eq!(w, vec![1, 2, 3, 4]);
    let v: Vec<f64> = ib.iter().map(|i| i.value).collect();
    assert_all_close(&v, &[20.0, 30.0, 36.0, 40.0]);
}

#[test]
fn sjf_phase_skips_what_does_not_fit_and_continues() {
    // Capacity 4 GPUs: a short 8-GPU job cannot fit, the longer 2-GPU jobs go.
    let j = |w: u32, t: f64| ElasticJob::from_min_running_time(w, w, 1, t, LIN);
    let q = queued(&[j(8, 10.0), j(2, 30.0), j(2, 20.0), j(2, 40.0)]);
    let a = alloc::allocate(&q, &[], 4, AllocParams::default());
    assert_eq!(a.admitted, vec![2, 1]);
    assert_eq!(a.left_gpus, 0);
}

#[test]
fn sub_linear_speedup_loses_ten_percent_per_step_past_the_midpoint() {
    let s = Speedup::SubLinear { loss_per_step: 0.1 };
    // Range 2..=6, midpoint 4: 5 workers → 5·0.9, 6 workers → 6·0.8.
    assert!(close(s.throughput(4, 2, 6), 4.0));
    assert!(close(s.throughput(5, 2, 6), 4.5));
    assert!(close(s.throughput(6, 2, 6), 4.8));
    // The knapsack values shrink accordingly: the 4th flexible worker of B is
    // worth less than under linear speed-up.
    let lin = ElasticJob::from_min_running_time(2, 6, 1, 20.0, LIN);
    let sub = ElasticJob::from_min_running_time(2, 6, 1, 20.0, s);
    assert!(
        sub.flexible_value(4, s) / sub.max_running_time(s)
            < lin.flexible_value(4, LIN) / lin.max_running_time(LIN)
    );
}
