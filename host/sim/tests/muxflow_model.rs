//! The MuxFlow model on the simulator core, on small hand-made scenarios: the built-in
//! `muxflow` matcher and `sysmonitor` coordinator as Wasm, against the sharing baselines.

use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::muxflow::{
    MuxflowMetrics, MuxflowSimConfig, OfflinePlan, ServicePlan, Sharing, run_muxflow,
};
use std::time::Duration;

/// Under MPS with dynamic SM shares a GPU's SMs are meant to be nearly all busy: SM activity
/// alone never makes it Overlimit (overload shows in the SM clock and memory).
const SYSMONITOR: &str = "[thresholds]\nsm_activity_pct = [90.0, 97.0, 100.0]\n";

fn policy(name: &str, config: &str) -> RunPolicy {
    let engine = arbiter_sim::engine(Duration::from_secs(30)).expect("engine");
    RunPolicy {
        compiled: engine
            .compile(arbiter_policies::get(name).expect("built-in"))
            .expect("compile"),
        config: (!config.is_empty()).then(|| config.to_string()),
    }
}

/// One node of 8 T4s, 8 services at a steady 25 % load holding 40 % of their GPU's memory, and
/// 8 one-hour offline jobs at the start.
fn scenario(sharing: Sharing) -> MuxflowSimConfig {
    MuxflowSimConfig {
        sharing,
        services: (0..8)
            .map(|i| ServicePlan {
                name: format!("svc-{i}"),
                load: vec![0.25],
                memory: vec![0.4],
            })
            .collect(),
        offline: (0..8)
            .map(|i| OfflinePlan {
                name: format!("off-{i}"),
                model: ["resnet50", "vgg16", "densenet201", "inception-v3"][i % 4].into(),
                arrival_min: 0.0,
                minutes: 60.0,
            })
            .collect(),
        horizon_ms: 24 * 3_600_000,
        ..MuxflowSimConfig::default()
    }
}

fn run(sharing: Sharing, matcher: Option<(&str, &str)>, coordinator: bool) -> MuxflowMetrics {
    let scheduler = policy("fifo", "");
    let reschedule_running = matcher.is_some_and(|(n, _)| n == "muxflow");
    let matcher = matcher.map(|(n, c)| policy(n, c));
    let coordinator = coordinator.then(|| policy("sysmonitor", SYSMONITOR));
    let cfg = MuxflowSimConfig {
        reschedule_running,
        ..scenario(sharing)
    };
    run_muxflow(&scheduler, matcher.as_ref(), coordinator.as_ref(), &cfg).expect("run")
}

#[test]
fn muxflow_runs_offline_work_beside_the_services_and_protects_them() {
    let m = run(Sharing::Mps, Some(("muxflow", "")), true);
    println!("{m:#?}");
    assert_eq!((m.matcher_faults, m.coordinator_faults), (0, 0));
    assert_eq!(m.unfinished, 0, "every offline job finishes");
    assert!(m.matchings > 0 && m.executions >= 8);
    assert!(
        m.oversold_gpu > 0.2 && m.oversold_gpu < 1.0,
        "{}",
        m.oversold_gpu
    );
    assert!(
        m.latency_mean_ratio > 1.0 && m.latency_mean_ratio < 1.3,
        "{}",
        m.latency_mean_ratio
    );
    assert!(m.utilization > m.utilization_alone && m.sm_activity > m.sm_activity_alone);
    // The offline jobs waited for the first scheduling interval (15 min).
    assert!(
        m.offline
            .iter()
            .all(|j| j.start_min.is_some_and(|s| s >= 15.0))
    );
}

#[test]
fn online_only_leaves_the_services_alone() {
    let m = run(Sharing::Mps, None, true);
    assert_eq!(m.executions, 0);
    assert_eq!(m.unfinished, 8);
    assert!((m.latency_mean_ratio - 1.0).abs() < 1e-9);
    assert!((m.utilization - 0.25).abs() < 1e-9);
}

#[test]
fn time_slicing_slows_the_services_more_and_priority_slicing_gives_offline_work_less() {
    let ts = run(Sharing::TimeSlicing, Some(("greedy-matcher", "")), false);
    let pb = run(
        Sharing::PriorityTimeSlicing,
        Some(("greedy-matcher", "")),
        false,
    );
    let mux = run(Sharing::Mps, Some(("muxflow", "")), true);
    println!(
        "latency ts {:.3} pb {:.3} mux {:.3}; jct ts {:.1} pb {:.1} mux {:.1}",
        ts.latency_mean_ratio,
        pb.latency_mean_ratio,
        mux.latency_mean_ratio,
        ts.mean_jct_min,
        pb.mean_jct_min,
        mux.mean_jct_min
    );
    assert!(ts.latency_mean_ratio > mux.latency_mean_ratio);
    assert!(pb.latency_mean_ratio < ts.latency_mean_ratio);
    assert!(pb.oversold_gpu < ts.oversold_gpu);
    assert_eq!((ts.unfinished, pb.unfinished), (0, 0));
}
