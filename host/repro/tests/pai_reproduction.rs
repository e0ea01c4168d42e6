//! "MLaaS in the Wild" (NSDI '22) on our traces: Table 1 from the PAI
//! machine list, the paper's SJF toy, and SJF on predicted durations over
//! Philly run times (`docs/reproductions/pai.md`).

use arbiter_host::state::{JobRequest, NodeRequest};
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
