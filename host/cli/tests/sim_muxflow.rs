//! `arbiter sim --protocol muxflow` as a real process: MuxFlow's §7 comparison (the seven
//! systems) on a small set-up of the real traces, as JSON and as a table, and refusing a
//! set-up it cannot run.

use serde_json::Value;
use std::process::Command;

mod common;

use common::{BIN, sim_scenario};

fn sim(extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["sim", "--protocol", "muxflow"])
        .args(extra)
        .output()
        .expect("run arbiter")
}

#[test]
fn the_seven_systems_run_on_one_trace_of_a_set_up_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("setup.toml");
    // One node of 8 T4s: trace B's density gives it a dozen offline jobs.
    std::fs::write(&file, "traces = [\"B\"]\nnodes = 1\nseeds = [2]\n").unwrap();
    let config = file.to_str().unwrap();
    let out = sim(&["--json", "--config", config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let traces = v["traces"].as_array().expect("traces");
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0]["trace"], "B");
    assert_eq!(traces[0]["seed"], 2);
    let runs = traces[0]["runs"].as_array().expect("runs");
    let systems: Vec<&str> = runs.iter().filter_map(|r| r["system"].as_str()).collect();
    assert_eq!(
        systems,
        [
            "Online-only",
            "Time-sharing",
            "PB-time-sharing",
            "MuxFlow",
            "MuxFlow-S",
            "MuxFlow-M",
            "MuxFlow-S-M"
        ]
    );
    for r in runs {
        let m = &r["metrics"];
        assert_eq!(m["matcher_faults"], 0, "{}", r["system"]);
        assert_eq!(m["coordinator_faults"], 0, "{}", r["system"]);
        if r["system"] == "Online-only" {
            assert_eq!(m["executions"], 0, "no offline work");
        } else {
            assert_eq!(
                m["unfinished"], 0,
                "{}: the offline trace finishes",
                r["system"]
            );
            assert!(m["executions"].as_u64().unwrap_or(0) > 0, "{}", r["system"]);
        }
    }
    let muxflow = &runs[3]["metrics"];
    let latency = muxflow["latency_mean_ratio"].as_f64().expect("latency");
    assert!(
        (1.0..1.2).contains(&latency),
        "MuxFlow's services: {latency}"
    );
    assert_eq!(v["paper_jct_gain"][0], 1.1);

    let out = sim(&["--config", config]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("trace B (seed 2)"), "{text}");
    assert!(text.contains("PB-time-sharing"), "{text}");
}

#[test]
fn a_set_up_it_cannot_run_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("setup.toml");
    let config = file.to_str().unwrap();
    for (text, key) in [
        ("traces = [\"E\"]\n", "trace"),
        ("online_utilization = 1.5\n", "online_utilization"),
        ("nodes = 0\n", "nodes"),
        ("restart_s = -1.0\n", "restart_s"),
        ("horizon_h = nan\n", "horizon_h"),
        ("node = 2\n", "node"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = sim(&["--config", config]);
        assert!(!out.status.success(), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{text}: {err}");
    }
    let out = sim(&["--nodes", "nodes.csv"]);
    assert!(!out.status.success(), "--nodes does not apply");
}

/// A horizon that ends before any offline job finishes leaves the JCT and oversold columns
/// without data: "-", not a measured 0.0.
#[test]
fn columns_with_nothing_measured_read_as_dashes() {
    let out = sim_scenario(
        "muxflow",
        "traces = [\"B\"]\nseeds = [1]\nhorizon_h = 0.01\n",
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let muxflow = text
        .lines()
        .find(|l| l.starts_with("MuxFlow "))
        .unwrap_or_default();
    let cells: Vec<&str> = muxflow.split_whitespace().collect();
    // system, lat, p99, JCT, oversold, unfinished, ...
    assert_eq!(cells.get(3..5), Some(&["-", "-"][..]), "{text}");
    assert_ne!(cells.get(5), Some(&"0"), "{text}");
}
