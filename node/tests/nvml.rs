//! The NVML backend reading the fake `libnvidia-ml.so.1` through `nvml-wrapper`: the same code
//! path as on a GPU machine, driven by a scenario file.

mod common;

use arbiter_node::gpu::{ComputeMode, GpuBackend, GpuError, ProcessKind, THROTTLE_SLOWDOWN_MASK};
use arbiter_node::mps::{MpsConfig, MpsManager};
use arbiter_node::supervisor::{Supervisor, SupervisorConfig};
use arbiter_node::{Node, NodeConfig, NvmlBackend};
use arbiter_policy_sdk::model::{NodeAction, health};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn scenario(dir: &Path) -> serde_json::Value {
    json!({
        "driver_version": "550.54.15",
        "time_file": dir.join("t"),
        "call_log": dir.join("calls"),
        "gpus": [
            {
                "name": "Fake H100 80GB HBM3", "uuid": "GPU-fake-0000", "memory_total_mib": 81920,
                "max_sm_clock_mhz": 1980,
                "timeline": [
                    { "t": 0, "utilization_pct": 35, "memory_util_pct": 12, "sm_clock_mhz": 1755,
                      "throttle_reasons": 0,
                      "processes": [
                        { "pid": 4001, "used_mib": 2048, "sm_util_pct": 20, "mem_util_pct": 5 },
                        { "pid": 4002, "used_mib": 1024, "sm_util_pct": 10, "mps": true }
                      ] },
                    { "t": 1, "utilization_pct": 90, "memory_util_pct": 40, "sm_clock_mhz": 1200,
                      "throttle_reasons": 64, "memory_used_mib": 4096,
                      "processes": [
                        { "pid": 4001, "used_mib": 3072, "sm_util_pct": 85, "mem_util_pct": 30 }
                      ] }
                ]
            },
            {
                "name": "Fake H100 80GB HBM3", "uuid": "GPU-fake-0001", "memory_total_mib": 81920,
                "timeline": [
                    { "t": 0, "utilization_pct": 0 },
                    { "t": 2, "lost": true }
                ]
            }
        ]
    })
}

fn set_time(dir: &Path, t: f64) {
    std::fs::write(dir.join("t"), t.to_string()).expect("time file");
}

fn calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn nvml_backend_reads_a_scenario_through_nvml_wrapper() {
    common::init_tracing();
    let dir = common::test_dir("nvml-read");
    let lib = common::install_fake_nvml(&dir, &scenario(&dir));
    set_time(&dir, 0.0);
    let nvml = NvmlBackend::open(Some(&lib)).expect("NVML over the fake library");
    assert_eq!(nvml.driver_version().expect("driver"), "550.54.15");
    assert_eq!(nvml.device_count().expect("count"), 2);

    let info = nvml.device_info(0).expect("info");
    assert_eq!(info.name, "Fake H100 80GB HBM3");
    assert_eq!(info.uuid, "GPU-fake-0000");
    assert_eq!(info.memory_total_bytes, 81920 * MIB);
    assert_eq!(info.max_sm_clock_mhz, 1980);

    let s = nvml.sample(0).expect("sample t=0");
    assert_eq!((s.utilization_pct, s.memory_util_pct), (35, 12));
    assert_eq!((s.sm_clock_mhz, s.max_sm_clock_mhz), (1755, 1980));
    assert_eq!(
        s.memory_used_bytes,
        3072 * MIB,
        "defaults to the processes' sum"
    );
    assert_eq!(s.memory_total_bytes, 81920 * MIB);
    assert_eq!(s.throttle_reasons, 0);
    assert_eq!(s.processes.len(), 2);
    let p = &s.processes[0];
    assert_eq!((p.pid, p.kind), (4001, ProcessKind::Compute));
    assert_eq!(p.used_memory_bytes, Some(2048 * MIB));
    assert_eq!((p.sm_util_pct, p.mem_util_pct), (Some(20), Some(5)));
    let q = &s.processes[1];
    assert_eq!((q.pid, q.kind), (4002, ProcessKind::MpsClient));
    assert_eq!(q.sm_util_pct, Some(10));

    // Same scenario time: NVML has no newer per-process sample (NOT_FOUND) -> None, not error.
    let s = nvml.sample(0).expect("sample again");
    assert!(s.processes.iter().all(|p| p.sm_util_pct.is_none()));

    set_time(&dir, 1.5);
    let s = nvml.sample(0).expect("sample t=1.5");
    assert_eq!(s.utilization_pct, 90);
    assert_eq!(s.sm_clock_mhz, 1200);
    assert_eq!(s.throttle_reasons, 64);
    assert_ne!(s.throttle_reasons & THROTTLE_SLOWDOWN_MASK, 0);
    assert_eq!(
        arbiter_node::gpu::throttle_reason_names(s.throttle_reasons),
        ["hw_thermal_slowdown"]
    );
    assert_eq!(s.memory_used_bytes, 4096 * MIB);
    assert_eq!(s.processes.len(), 1);
    assert_eq!(s.processes[0].sm_util_pct, Some(85));

    set_time(&dir, 2.0);
    assert!(matches!(nvml.sample(1), Err(GpuError::Lost(1))));
    assert!(matches!(nvml.sample(5), Err(GpuError::NoSuchGpu(5))));

    drop(nvml);
    let log = calls(&dir);
    for sym in [
        "nvmlInit_v2",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetProcessUtilization",
        "nvmlShutdown",
    ] {
        assert!(
            log.iter().any(|l| l == sym),
            "{sym} was not called: {log:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn node_view_over_nvml_maps_metrics_and_health() {
    common::init_tracing();
    let dir = common::test_dir("nvml-view");
    let lib = common::install_fake_nvml(&dir, &scenario(&dir));
    set_time(&dir, 0.0);
    let nvml: Arc<dyn GpuBackend> = Arc::new(NvmlBackend::open(Some(&lib)).expect("nvml"));
    let (sup, _) = Supervisor::open(SupervisorConfig::new(
        &dir.join("state"),
        &dir.join("blocks"),
        Path::new("/nonexistent/libarbiter_interpose.so"),
    ))
    .expect("supervisor");
    let mut node = Node::new(nvml, None, sup, NodeConfig::default());

    let v = node.view();
    assert_eq!(v.gpus.len(), 2);
    let g = v.gpus[0];
    assert_eq!(g.index, 0);
    assert_eq!(g.utilization_pct, 35);
    assert_eq!(g.sm_activity_pct, 30, "sum of per-process SM utilization");
    assert_eq!((g.sm_clock_mhz, g.max_sm_clock_mhz), (1755, 1980));
    assert_eq!((g.memory_used_mib, g.memory_total_mib), (3072, 81920));
    assert_eq!(g.health, health::HEALTHY);
    assert!(v.workloads.is_empty());

    // The GPU falls off the bus: UNHEALTHY, size remembered.
    set_time(&dir, 2.0);
    let v = node.view();
    assert_eq!(v.gpus[1].health, health::UNHEALTHY);
    assert_eq!(v.gpus[1].memory_total_mib, 81920);
    // A policy disables it: DISABLED wins over the observation; other codes are validated.
    let out = node.apply_actions(&[
        NodeAction::SetHealth(1, health::DISABLED),
        NodeAction::SetHealth(0, 9),
        NodeAction::SetHealth(7, health::HEALTHY),
    ]);
    assert!(out[0].result.is_ok());
    assert!(out[1].result.is_err());
    assert!(out[2].result.is_err());
    assert_eq!(node.view().gpus[1].health, health::DISABLED);
    let _ = std::fs::remove_dir_all(&dir);
}

/// XID errors reach NVML users only as events: the backend's watcher counts them per GPU from
/// the moment it opened, and the node reports the count with power and temperature.
#[test]
fn xid_errors_are_counted_from_nvml_events_and_reach_the_node_view() {
    common::init_tracing();
    let dir = common::test_dir("nvml-xid");
    let scenario = json!({
        "time_file": dir.join("t"),
        "gpus": [
            { "name": "Fake A100", "uuid": "GPU-xid-0", "memory_total_mib": 40960,
              "timeline": [
                { "t": 0, "utilization_pct": 10, "power_mw": 95000, "temperature_c": 41,
                  "xid": [79] },
                { "t": 1, "utilization_pct": 10, "xid": [31] },
                { "t": 2, "utilization_pct": 10, "xid": [31, 43] }
              ] },
            { "name": "Fake A100", "uuid": "GPU-xid-1", "memory_total_mib": 40960,
              "timeline": [ { "t": 0 } ] }
        ]
    });
    let lib = common::install_fake_nvml(&dir, &scenario);
    set_time(&dir, 0.0);
    let nvml: Arc<dyn GpuBackend> = Arc::new(NvmlBackend::open(Some(&lib)).expect("nvml"));
    let s = nvml.sample(0).expect("sample");
    // The frame in effect when the watcher registered raised nothing to it.
    assert_eq!(s.xid_errors, 0);
    assert_eq!((s.power_mw, s.temperature_c), (Some(95_000), Some(41)));
    let s1 = nvml.sample(1).expect("sample");
    assert_eq!(
        (s1.power_mw, s1.temperature_c),
        (None, None),
        "not supported"
    );

    let wait_for = |gpu: u32, n: u32| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let got = nvml.sample(gpu).expect("sample").xid_errors;
            if got >= n || std::time::Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    set_time(&dir, 1.0);
    assert_eq!(wait_for(0, 1), 1);
    set_time(&dir, 2.5);
    assert_eq!(wait_for(0, 3), 3);
    assert_eq!(nvml.sample(1).expect("sample").xid_errors, 0, "per GPU");

    let (sup, _) = Supervisor::open(SupervisorConfig::new(
        &dir.join("state"),
        &dir.join("blocks"),
        Path::new("/nonexistent/libarbiter_interpose.so"),
    ))
    .expect("supervisor");
    let mut node = Node::new(nvml, None, sup, NodeConfig::default());
    let v = node.view();
    assert_eq!((v.gpus[0].xid_errors, v.gpus[1].xid_errors), (3, 0));
    assert_eq!(v.gpus[1].power_mw, 0, "unknown");
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mps_start_sets_exclusive_process_through_nvml() {
    common::init_tracing();
    let dir = common::test_dir("nvml-mps");
    let lib = common::install_fake_nvml(&dir, &scenario(&dir));
    set_time(&dir, 0.0);
    let nvml = NvmlBackend::open(Some(&lib)).expect("nvml");
    assert_eq!(nvml.compute_mode(0).expect("mode"), ComputeMode::Default);
    let mut cfg = MpsConfig::new(common::fake_mps_binary(), &dir.join("mps"));
    cfg.set_exclusive_process = true;
    let gpus: Vec<(u32, String)> = (0..2)
        .map(|i| (i, nvml.device_info(i).expect("info").uuid))
        .collect();
    let mps = MpsManager::new(&cfg, &gpus);
    mps.start_all(Some(&nvml)).expect("start");
    assert_eq!(
        nvml.compute_mode(0).expect("mode"),
        ComputeMode::ExclusiveProcess
    );
    assert_eq!(
        nvml.compute_mode(1).expect("mode"),
        ComputeMode::ExclusiveProcess
    );
    mps.stop_all(Some(&nvml)).expect("stop");
    assert_eq!(nvml.compute_mode(0).expect("mode"), ComputeMode::Default);
    assert!(calls(&dir).iter().any(|l| l == "nvmlDeviceSetComputeMode"));
    let _ = std::fs::remove_dir_all(&dir);
}
