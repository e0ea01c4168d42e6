//! MuxFlow (2023, §7) on the real traces: GenAI serving pods as the online services, Philly
//! virtual clusters A–D as the offline traces, the built-in `muxflow` matcher and `sysmonitor`
//! coordinator as Wasm against Online-only, Time-sharing, PB-time-sharing and the ablations
//! of §7.4. What holds and what does not, and why: `docs/reproductions/muxflow.md`.

use arbiter_repro::muxflow::{
    PAPER_TESTBED, SETTINGS, TRACES, TraceRuns, TraceSetup, compare, print_runs,
};
use arbiter_sim::models::muxflow::MuxflowMetrics;
use std::sync::OnceLock;

fn runs() -> &'static [TraceRuns] {
    static RUNS: OnceLock<Vec<TraceRuns>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let labels: Vec<&str> = TRACES.iter().map(|t| t.0).collect();
        let runs = compare(&TraceSetup::default(), &labels, &SETTINGS).expect("MuxFlow runs");
        for r in &runs {
            print_runs(r);
        }
        runs
    })
}

fn get<'a>(r: &'a TraceRuns, label: &str) -> &'a MuxflowMetrics {
    r.get(label).unwrap_or_else(|| panic!("no run of {label}"))
}

#[test]
fn every_system_runs_without_faults_and_finishes_the_offline_traces() {
    for r in runs() {
        for (label, m) in &r.runs {
            assert_eq!(m.matcher_faults, 0, "trace {} {label}", r.trace);
            assert_eq!(m.coordinator_faults, 0, "trace {} {label}", r.trace);
            if *label == "Online-only" {
                assert_eq!(m.executions, 0, "no offline work");
                assert!((m.latency_mean_ratio - 1.0).abs() < 1e-9);
            } else {
                assert_eq!(m.unfinished, 0, "trace {} {label}", r.trace);
            }
        }
    }
}

/// §7.2: MuxFlow slows the services by less than 20 % (paper: mean +16.0 %, P99 +15.3 %) and
/// evicts a few percent of the offline executions (paper 1.5 %; the band 0.5–5 %).
#[test]
fn muxflow_keeps_the_services_within_20_percent_and_evicts_a_few_percent() {
    for r in runs() {
        let m = get(r, "MuxFlow");
        assert!(
            m.latency_mean_ratio <= 1.20 && m.latency_p99_ratio <= 1.20,
            "trace {}: mean {:.3}, P99 {:.3} (paper {}, {})",
            r.trace,
            m.latency_mean_ratio,
            m.latency_p99_ratio,
            PAPER_TESTBED.latency_mean,
            PAPER_TESTBED.latency_p99
        );
        assert!(
            m.latency_mean_ratio > 1.0,
            "sharing costs the services something"
        );
        let evicted = m.evictions as f64 / m.executions as f64;
        assert!(
            (0.005..=0.05).contains(&evicted),
            "trace {}: {:.2} % evicted (paper {} %)",
            r.trace,
            100.0 * evicted,
            100.0 * PAPER_TESTBED.evicted
        );
    }
}

/// §7.2: GPU utilization and SM activity several times Online-only's (paper 4.0×, 4.7×; ours
/// 1.7–2.1× and 2.0–2.7×, see the doc: the same services alone over the same hours).
#[test]
fn sharing_raises_utilization_and_sm_activity_well_over_online_only() {
    for r in runs() {
        let m = get(r, "MuxFlow");
        let util = m.utilization / m.utilization_alone;
        let sm = m.sm_activity / m.sm_activity_alone;
        println!(
            "trace {}: utilization {util:.2}×, SM activity {sm:.2}×",
            r.trace
        );
        assert!(
            util >= 1.5 && sm >= 1.8,
            "trace {}: {util:.2}×, {sm:.2}×",
            r.trace
        );
        assert!(m.memory > m.memory_alone);
    }
}

/// §7.3: Time-sharing slows the services the most (paper: up to 50 %), PB-time-sharing
/// protects them but leaves the offline jobs only the idle time.
#[test]
fn time_sharing_slows_the_services_most_and_priority_sharing_gives_offline_work_least() {
    for r in runs() {
        let (ts, pb, mux) = (
            get(r, "Time-sharing"),
            get(r, "PB-time-sharing"),
            get(r, "MuxFlow"),
        );
        assert!(ts.latency_mean_ratio > 1.15 && ts.latency_mean_ratio <= 1.5);
        assert!(ts.latency_mean_ratio > mux.latency_mean_ratio);
        assert!(ts.latency_mean_ratio > pb.latency_mean_ratio);
        assert!(pb.oversold_gpu < ts.oversold_gpu);
    }
}

/// §7.3–7.4 where they hold here: MuxFlow gets the offline jobs at least as much GPU as
/// PB-time-sharing (paper: 1.08–1.97× more; ours level to 7 % more), and the ablations order
/// as Fig. 13's: without both mechanisms worst, each mechanism helps, MuxFlow best in most
/// traces. Against Time-sharing MuxFlow's offline figures are worse here (the doc says why).
#[test]
fn muxflow_matches_pb_time_sharing_for_offline_work_and_the_ablations_order_as_fig_13() {
    let mut muxflow_best = 0;
    for r in runs() {
        let m = |l| get(r, l);
        let (mux, pb) = (m("MuxFlow"), m("PB-time-sharing"));
        println!(
            "trace {}: JCT PB / MuxFlow {:.2}, TS / MuxFlow {:.2}; oversold MuxFlow / PB {:.2}, / TS {:.2}",
            r.trace,
            pb.mean_jct_min / mux.mean_jct_min,
            m("Time-sharing").mean_jct_min / mux.mean_jct_min,
            mux.oversold_gpu / pb.oversold_gpu,
            mux.oversold_gpu / m("Time-sharing").oversold_gpu
        );
        assert!(
            mux.oversold_gpu >= 0.95 * pb.oversold_gpu,
            "trace {}",
            r.trace
        );
        let jct = |l| m(l).mean_jct_min;
        let sm = jct("MuxFlow-S-M");
        assert!(
            sm >= jct("MuxFlow-S") && sm >= jct("MuxFlow-M") && sm > jct("MuxFlow"),
            "trace {}: S-M is the worst",
            r.trace
        );
        assert!(
            jct("MuxFlow") < jct("MuxFlow-S"),
            "trace {}: dynamic SM helps",
            r.trace
        );
        let over = |l| m(l).oversold_gpu;
        assert!(over("MuxFlow") > over("MuxFlow-S-M"));
        if jct("MuxFlow") <= jct("MuxFlow-M").min(jct("MuxFlow-S")) {
            muxflow_best += 1;
        }
    }
    assert!(
        muxflow_best >= 3,
        "MuxFlow best in {muxflow_best} of 4 traces"
    );
}

/// The matcher's predictor can be trained from profiles the simulator produces (issue 18 item
/// 1): ridge least squares on profiled pairs predicts the ground truth better than the
/// analytic default.
#[test]
fn the_predictor_fitted_to_the_simulators_profiles_beats_the_default() {
    use arbiter_repro::muxflow::{fitted_predictor_config, profile_samples};
    use arbiter_sim::models::muxflow::MuxflowSimConfig;
    let cfg = MuxflowSimConfig::default();
    let train = profile_samples(&cfg, 1);
    let test = profile_samples(&cfg, 2);
    let fitted = muxflow_core::LinearModel::fit(&train, 1e-6).expect("fit");
    let default = muxflow_core::LinearModel::default();
    let error = |m: &muxflow_core::LinearModel| {
        test.iter()
            .map(|(x, y)| (m.predict(x) - y).abs())
            .sum::<f64>()
            / test.len() as f64
    };
    let (e_fit, e_default) = (error(&fitted), error(&default));
    println!("mean absolute error: fitted {e_fit:.3}, default {e_default:.3}");
    assert!(
        e_fit < e_default && e_fit < 0.1,
        "{e_fit:.3} vs {e_default:.3}"
    );
    let config = fitted_predictor_config(&cfg, 1).expect("config");
    assert!(config.contains("[predictor]") && config.contains("weights = ["));
}

/// What we chose, varied one at a time on trace A (`--ignored print_sensitivity`): MuxFlow's
/// and the baselines' key figures.
#[test]
#[ignore = "prints the sensitivity table; a few minutes of runs"]
fn print_sensitivity() {
    use arbiter_repro::muxflow::SYSMONITOR_CONFIG;
    use arbiter_sim::models::muxflow::Physics;
    let base = TraceSetup::default();
    let cases: Vec<(&str, TraceSetup)> = vec![
        ("defaults", base.clone()),
        (
            "GenAI memory as in the trace (peaks 78 %)",
            TraceSetup {
                online_memory_peak: None,
                ..base.clone()
            },
        ),
        (
            "xCUDA target load 1.0 (default 0.7)",
            TraceSetup {
                sysmonitor_config: format!("{SYSMONITOR_CONFIG}[pacing]\ntarget_load = 1.0\n"),
                ..base.clone()
            },
        ),
        (
            "sysmonitor defaults (utilization a health signal)",
            TraceSetup {
                sysmonitor_config: String::new(),
                ..base.clone()
            },
        ),
        (
            "time-slice switching cost 20 % (default 5 %)",
            TraceSetup {
                physics: Physics {
                    switch_cost: 0.2,
                    ..Physics::default()
                },
                ..base.clone()
            },
        ),
        (
            "MPS interference 0.5 (default 0.32)",
            TraceSetup {
                physics: Physics {
                    mps_interference: 0.5,
                    ..Physics::default()
                },
                ..base.clone()
            },
        ),
        (
            "time slicing as measured on an H200: switching cost 0.42, interference 0.61",
            TraceSetup {
                physics: Physics {
                    switch_cost: 0.42,
                    time_slice_interference: 0.61,
                    ..Physics::default()
                },
                ..base.clone()
            },
        ),
        (
            "MPS interference 1.0, the model's most (an H200: 0.1 to 3.7 by service)",
            TraceSetup {
                physics: Physics {
                    mps_interference: 1.0,
                    ..Physics::default()
                },
                ..base.clone()
            },
        ),
        (
            "predictor fitted to the simulator's profiles (default: analytic)",
            TraceSetup {
                muxflow_config: arbiter_repro::muxflow::fitted_predictor_config(
                    &arbiter_sim::models::muxflow::MuxflowSimConfig::default(),
                    1,
                )
                .expect("fit"),
                ..base.clone()
            },
        ),
        (
            "restart 5 min (default 1 min)",
            TraceSetup {
                restart_ms: 300_000,
                ..base.clone()
            },
        ),
        (
            "online utilization 30 % (default 26 %; the pods are idle in 67 % of samples, 33 % is the most)",
            TraceSetup {
                online_utilization: 0.3,
                ..base
            },
        ),
    ];
    println!(
        "| case | MuxFlow latency | TS latency | PB latency | JCT PB / MuxFlow | JCT TS / MuxFlow | oversold MuxFlow | evicted % |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, setup) in cases {
        let r = &compare(&setup, &["A"], &SETTINGS).expect("runs")[0];
        let (mux, ts, pb) = (
            get(r, "MuxFlow"),
            get(r, "Time-sharing"),
            get(r, "PB-time-sharing"),
        );
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.1} |",
            mux.latency_mean_ratio,
            ts.latency_mean_ratio,
            pb.latency_mean_ratio,
            pb.mean_jct_min / mux.mean_jct_min,
            ts.mean_jct_min / mux.mean_jct_min,
            mux.oversold_gpu,
            100.0 * mux.evictions as f64 / mux.executions.max(1) as f64
        );
    }
}
