//! "MLaaS in the Wild" (NSDI '22) on our traces: Table 1 from the PAI
//! machine list, the paper's SJF toy, and SJF on predicted durations over
//! Philly run times (`docs/reproductions/pai.md`).

use arbiter_host::state::{JobRequest, NodeRequest};
use arbiter_repro::pai::reserving::{
    PUBLISHED_ALL_CUT_PCT, PUBLISHED_HIGH_GPU_CUT_PCT, PUBLISHED_STARTED_AT_ONCE_PCT,
    PackingResult, PackingSetup, packing_experiment,
};
use arbiter_repro::pai::sjf::{LearnedSetup, learned_experiment};
use arbiter_repro::pai::{
    MachineTable, PUBLISHED_SJF_CUT_PCT, SjfSetup, machine_table, sjf_experiment,
};
use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::replay::{ReplayConfig, run_replay};
use arbiter_sim::prediction::Prediction;
use arbiter_sim::scenario::{Scenario, SimTask, Source};
use arbiter_sim::{RunOptions, engine};
use arbiter_traces::pai;
use std::time::Duration;

fn table() -> MachineTable {
    let path = arbiter_traces::trace_file(pai::MACHINE_SPEC_FILE)
        .unwrap_or_else(|e| panic!("{e} (set ARBITER_TRACES to the traces folder)"));
    machine_table(&pai::load_machines(&path).expect("machine list"))
}

/// Table 1: 1,897 machines with 6,742 GPUs; per model as the brief reads
/// the file; host CPUs per GPU 12.0 on 8-GPU machines, 38.1 on 2-GPU
/// machines, 23.2 over the cluster (CPU-only machines included).
#[test]
fn table_1_from_the_machine_list() {
    let t = table();
    assert_eq!((t.machines, t.gpus), (1_897, 6_742));
    let machines = |model: &str| t.by_model.get(model).map_or(0, |m| m.0);
    assert_eq!(machines("P100"), 798);
    assert_eq!(machines("T4"), 497);
    assert_eq!(machines("MISC"), 280);
    assert_eq!(machines("V100M32"), 135);
    assert_eq!(machines("V100"), 104);
    assert_eq!(machines("CPU"), 83);
    for (got, published) in [
        (t.vcpu_per_gpu_8, 12.0),
        (t.vcpu_per_gpu_2, 38.1),
        (t.vcpu_per_gpu_all, 23.2),
    ] {
        assert!(
            (got - published).abs() < 0.05,
            "vCPU per GPU {got:.2}, published {published}"
        );
    }
}

fn policy(name: &str) -> RunPolicy {
    let engine = engine(Duration::from_secs(30)).expect("engine");
    RunPolicy {
        compiled: engine
            .compile(arbiter_policies::get(name).expect("built-in"))
            .expect("compile"),
        config: None,
    }
}

/// §5.2's example: one GPU, jobs of 10, 1 and 1 hours at t = 0. FIFO
/// completes them at 10, 11, 12 h (average 11 h); SJF on exact predictions
/// at 1, 2, 12 h (average 5 h); with no prediction SJF cannot tell them
/// apart and is FIFO.
#[test]
fn the_papers_sjf_toy() {
    const HOUR: u64 = 3_600_000;
    let tasks = [10, 1, 1]
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let mut request = JobRequest::gpus(format!("job-{i}"), "t", 1, 1);
            request.cpu_milli = 0;
            request.memory_mib = 0;
            SimTask {
                request,
                arrival_ms: 0,
                duration_ms: Some(h * HOUR),
                file_index: i,
            }
        })
        .collect();
    let scenario = Scenario {
        name: "sjf-toy".into(),
        source: Source::BuiltIn,
        nodes: vec![NodeRequest::gpus("gpu", "default", "V100", 32_768, 1)],
        tasks,
        rejected: Vec::new(),
        unplaceable: Vec::new(),
    };
    let average_hours = |name: &str, prediction: Prediction| {
        let cfg = ReplayConfig {
            prediction,
            ..ReplayConfig::default()
        };
        let out = run_replay(
            &scenario,
            &policy(name),
            "toy",
            &cfg,
            &RunOptions::default(),
        )
        .expect("run");
        out.replay.expect("replay metrics").avg_jct_s / 3_600.0
    };
    assert_eq!(average_hours("fifo", Prediction::None), 11.0);
    assert_eq!(average_hours("sjf", Prediction::Oracle), 5.0);
    assert_eq!(average_hours("sjf", Prediction::None), 11.0);
}

/// Fig. 13's direction and size on Philly run times at a contended load:
/// SJF cuts average completion time by 55–85 % (paper: 63–77 % over its
/// four predictors), and a better predictor never does worse than a
/// noisier one (Oracle ≥ best ≥ noisier > FIFO).
#[test]
fn sjf_on_predicted_durations_cuts_completion_time_on_philly() {
    let path = arbiter_traces::trace_file(pai::PHILLY_RUNTIME_FILE)
        .unwrap_or_else(|e| panic!("{e} (set ARBITER_TRACES to the traces folder)"));
    let runtimes = pai::load_philly_runtimes(&path).expect("run times");
    let setup = SjfSetup::default();
    let result = sjf_experiment(&setup, &runtimes).expect("experiment");
    for r in &result.rows {
        println!(
            "{:<45} completion {:>9.0} s  wait {:>9.0} s  cut {:>5.1} %",
            r.label, r.avg_completion_s, r.avg_wait_s, r.cut_pct
        );
    }
    let fifo = &result.rows[0];
    assert!(
        fifo.avg_wait_s >= result.mean_runtime_s,
        "not contended: FIFO waits {:.0} s on average, jobs run {:.0} s",
        fifo.avg_wait_s,
        result.mean_runtime_s
    );
    let cuts: Vec<f64> = result.rows[1..].iter().map(|r| r.cut_pct).collect();
    let (lo, hi) = (PUBLISHED_SJF_CUT_PCT.0 - 8.0, PUBLISHED_SJF_CUT_PCT.1 + 8.0);
    for (r, cut) in result.rows[1..].iter().zip(&cuts) {
        assert!(
            (lo..=hi).contains(cut),
            "{}: {cut:.1} % outside {lo}..={hi} %",
            r.label
        );
    }
    assert!(
        cuts[0] >= cuts[1] && cuts[1] >= cuts[2] && cuts[2] > 0.0,
        "Oracle ≥ best ≥ noisier > FIFO: {cuts:?}"
    );
}

fn machines() -> Vec<pai::PaiMachine> {
    let path = arbiter_traces::trace_file(pai::MACHINE_SPEC_FILE)
        .unwrap_or_else(|e| panic!("{e} (set ARBITER_TRACES to the traces folder)"));
    pai::load_machines(&path).expect("machine list")
}

fn philly_runtimes() -> Vec<f64> {
    let path = arbiter_traces::trace_file(pai::PHILLY_RUNTIME_FILE)
        .unwrap_or_else(|e| panic!("{e} (set ARBITER_TRACES to the traces folder)"));
    pai::load_philly_runtimes(&path).expect("run times")
}

fn print_packing(r: &PackingResult) {
    for (label, s) in [("load balancing", &r.balanced), ("R&P", &r.reserve_pack)] {
        println!(
            "{label:<15} tasks {:>6} mean queue {:>8.0} s  p99 {:>8.0} s  at once {:>5.1} % (instances {:>5.1} %)  >10,000 s {:>4.1} %  high-GPU ({}) {:>8.0} s ({:.0} % started while arriving)  low-GPU {:>7.0} s  GPU alloc {:>4.1} %",
            s.tasks,
            s.mean_queue_s,
            s.p99_queue_s,
            s.started_at_once_pct,
            s.instances_at_once_pct,
            s.over_10000_s_pct,
            s.high_gpu_tasks,
            s.high_gpu_mean_queue_s,
            s.high_gpu_started_while_arriving_pct,
            s.low_gpu_mean_queue_s,
            s.mean_gpu_alloc_pct,
        );
    }
    println!(
        "R&P cuts the mean task queueing by {:.1} % (paper {PUBLISHED_ALL_CUT_PCT} %), high-GPU tasks' by {:.1} % (paper {PUBLISHED_HIGH_GPU_CUT_PCT} %)",
        r.all_cut_pct, r.high_gpu_cut_pct
    );
}

/// §5.2's learned predictor on what Philly has: CART (≤ 10 splits, MAE)
/// on the virtual cluster and GPU count, trained on the jobs submitted
/// before December 2017 and applied to December's. Philly has no recurrence
/// tag (the paper's Group), so the tree is far less accurate than the
/// paper's (78 % within 25 %); SJF on it still beats FIFO by a wide margin
/// and stays short of the Oracle.
#[test]
fn cart_trained_on_one_period_orders_the_next() {
    let path = arbiter_traces::trace_file(arbiter_traces::philly::JOBS_FILE)
        .unwrap_or_else(|e| panic!("{e} (set ARBITER_TRACES to the traces folder)"));
    let trace = arbiter_traces::philly::load_jobs(&path).expect("Philly jobs");
    let r = learned_experiment(&SjfSetup::default(), &LearnedSetup::default(), &trace)
        .expect("experiment");
    println!(
        "trained on {} jobs, predicting {}",
        r.train_jobs, r.test_jobs
    );
    for a in &r.accuracy {
        println!(
            "{:<25} {:>2} splits, {:>5.1} % within 25 %",
            a.label, a.splits, a.within_25_pct
        );
    }
    for row in &r.sjf.rows {
        println!(
            "{:<45} completion {:>9.0} s  wait {:>9.0} s  cut {:>5.1} %",
            row.label, row.avg_completion_s, row.avg_wait_s, row.cut_pct
        );
    }
    for a in &r.accuracy {
        assert!(a.splits <= 10, "{}: {} splits", a.label, a.splits);
        assert!(
            a.within_25_pct >= 25.0,
            "{}: only {:.1} % within 25 %",
            a.label,
            a.within_25_pct
        );
    }
    let cut = |label: &str| {
        r.sjf
            .rows
            .iter()
            .find(|row| row.label == label)
            .map(|row| row.cut_pct)
            .unwrap_or_else(|| panic!("no row {label}"))
    };
    let (oracle, cart) = (cut("SJF, Oracle"), cut("SJF, CART on cluster + GPUs"));
    assert!(
        (25.0..=oracle).contains(&cart),
        "CART's cut {cart:.1} % outside 25 %..=the Oracle's {oracle:.1} %"
    );
    assert!(
        r.sjf.rows[0].avg_wait_s >= r.sjf.mean_runtime_s,
        "December's sample is not contended"
    );
}

/// Fig. 19 on the PAI cluster with our workload model
/// (`arbiter_repro::pai::reserving`): over 90 % of tasks start at once
/// under both policies, as in the paper; R&P cuts the average task queueing
/// against load balancing by at least 20 % (paper: 45 %) and the high-GPU
/// tasks' by at least 45 % (paper: 68 %), and it cuts the tail beyond
/// 10,000 s. Direction and rough size only: PAI's tasks are a model here;
/// our cuts are far larger than the paper's (see the write-up).
#[test]
fn reserving_and_packing_cuts_queueing_against_load_balancing() {
    let (machines, runtimes) = (machines(), philly_runtimes());
    let r = packing_experiment(&PackingSetup::default(), &machines, &runtimes).expect("experiment");
    print_packing(&r);
    for (label, s) in [("load balancing", &r.balanced), ("R&P", &r.reserve_pack)] {
        assert!(
            s.started_at_once_pct >= PUBLISHED_STARTED_AT_ONCE_PCT,
            "{label}: {:.1} % of tasks started at once",
            s.started_at_once_pct
        );
        assert!(s.high_gpu_tasks > 0, "{label}: no high-GPU task measured");
    }
    assert!(
        r.all_cut_pct >= PUBLISHED_ALL_CUT_PCT - 25.0,
        "R&P cut the mean task queueing by only {:.1} %",
        r.all_cut_pct
    );
    assert!(
        r.high_gpu_cut_pct >= PUBLISHED_HIGH_GPU_CUT_PCT - 23.0,
        "R&P cut the high-GPU tasks' queueing by only {:.1} %",
        r.high_gpu_cut_pct
    );
    assert!(
        r.reserve_pack.over_10000_s_pct < r.balanced.over_10000_s_pct,
        "no cut of the tail beyond 10,000 s"
    );
}

/// What the Fig. 19 comparison depends on (ignored: minutes; the write-up
/// quotes its output): the load, R&P's attempt timeout, the high-GPU share
/// and the run's length, one seed each.
#[test]
#[ignore]
fn print_packing_sensitivity() {
    let (machines, runtimes) = (machines(), philly_runtimes());
    let base = PackingSetup {
        seeds: vec![42],
        ..PackingSetup::default()
    };
    let mut cases = vec![("default".to_string(), base.clone())];
    for load in [0.4, 0.6, 0.9] {
        cases.push((
            format!("load {load}"),
            PackingSetup {
                load,
                ..base.clone()
            },
        ));
    }
    for attempt_timeout_s in [60, 1_800] {
        cases.push((
            format!("attempt timeout {attempt_timeout_s} s"),
            PackingSetup {
                attempt_timeout_s,
                ..base.clone()
            },
        ));
    }
    for high_gpu_share in [0.03, 0.12] {
        cases.push((
            format!("high-GPU share {high_gpu_share}"),
            PackingSetup {
                high_gpu_share,
                ..base.clone()
            },
        ));
    }
    cases.push((
        "20,000 tasks".into(),
        PackingSetup {
            tasks: 20_000,
            ..base.clone()
        },
    ));
    for (label, setup) in cases {
        let r = packing_experiment(&setup, &machines, &runtimes).expect("experiment");
        println!("== {label}");
        print_packing(&r);
    }
}
