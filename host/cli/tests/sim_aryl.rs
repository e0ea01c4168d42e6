//! `arbiter sim --protocol aryl` as a real process: the Aryl comparison on a
//! small cut of the Philly trace (one day, every 4th job, 6 + 7 servers), in
//! human form and as one JSON object. Skips (with a message) when the shared
//! traces folder is missing.

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_arbiter");

const SMALL: [&str; 13] = [
    "sim",
    "--protocol",
    "aryl",
    "--scale",
    "ci",
    "--days",
    "1",
    "--sample-every",
    "4",
    "--training-nodes",
    "6",
    "--threads",
    "2",
];

/// Whether the CLI will find the traces: `ARBITER_TRACES`, else
/// `shared/traces` above this crate (the CLI also searches from its working
/// directory, which is this crate's here).
fn traces_present() -> bool {
    let has_files = |dir: &std::path::Path| {
        dir.join("philly/philly_jobs.csv.gz").is_file()
            && dir.join("genai2026/lora_request_trace.csv.gz").is_file()
    };
    match std::env::var_os("ARBITER_TRACES") {
        Some(dir) => has_files(std::path::Path::new(&dir)),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .any(|d| has_files(&d.join("shared/traces"))),
    }
}

/// Fails (never skips) when the CLI would not find the traces.
fn require_traces() {
    assert!(
        traces_present(),
        "the aryl CLI test needs philly/philly_jobs.csv.gz and \
         genai2026/lora_request_trace.csv.gz under ../shared/traces \
         (or the folder ARBITER_TRACES names)"
    );
}

fn arbiter(extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(SMALL)
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run arbiter")
}

#[test]
fn sim_aryl_prints_the_comparison() {
    require_traces();
    let out = arbiter(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "arbiter failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "Aryl comparison, scale `ci`",
        "6 training + 7 inference servers",
        "baseline (fifo)",
        "aryl loan-only",
        "baseline/aryl: avg queueing",
        "paired reclaim loaning only",
    ] {
        assert!(stdout.contains(needle), "no `{needle}` in:\n{stdout}");
    }
}

#[test]
fn sim_aryl_json_is_one_object_of_headline_metrics() {
    require_traces();
    let out = arbiter(&["--json", "--seed", "7"]);
    assert!(
        out.status.success(),
        "arbiter failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["protocol"], "aryl");
    assert_eq!(v["seed"], 7);
    assert_eq!(v["scale"]["name"], "ci");
    assert_eq!(v["scale"]["days"], 1);
    assert_eq!(v["scale"]["training_nodes"], 6);
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(8));
    let h = &v["headline"];
    for key in [
        "avg_queue_ratio",
        "p95_queue_ratio",
        "avg_jct_ratio",
        "p95_jct_ratio",
        "baseline_combined_usage_pct",
        "aryl_combined_usage_pct",
        "combined_usage_gain_pct",
        "preemption_ratio_pct",
    ] {
        let x = h[key].as_f64().unwrap_or(f64::NAN);
        assert!(x.is_finite() && x >= 0.0, "headline `{key}` = {}", h[key]);
    }
    // Every job of every run finished.
    for r in v["runs"].as_array().into_iter().flatten() {
        assert_eq!(r["unfinished"], 0, "{}", r["policy"]);
    }
    // Loaning adds capacity: combined usage grows.
    assert!(
        h["combined_usage_gain_pct"].as_f64().unwrap_or(0.0) > 0.0,
        "{h}"
    );
}

#[test]
fn sim_aryl_refuses_a_node_list() {
    let out = Command::new(BIN)
        .args(["sim", "--protocol", "aryl", "--nodes", "nodes.csv"])
        .output()
        .expect("run arbiter");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--nodes does not apply"), "{stderr}");
}

/// Pools the comparison cannot run on are refused before any work: an empty inference
/// pool once ended in "run `aryl` has no paired rule `aryl`", and a hundred million
/// training servers in the kernel's out-of-memory killer.
#[test]
fn sim_aryl_refuses_pools_it_cannot_run() {
    for (flags, says) in [
        (
            ["--inference-nodes", "0"],
            "--inference-nodes must be 1 to 100000, got 0",
        ),
        (
            ["--training-nodes", "0"],
            "--training-nodes must be 1 to 100000, got 0",
        ),
        (
            ["--training-nodes", "100000000"],
            "--training-nodes must be 1 to 100000, got 100000000",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["sim", "--protocol", "aryl"])
            .args(flags)
            .output()
            .expect("run arbiter");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn sim_aryl_config_reaches_the_policies_and_a_bad_one_is_refused() {
    require_traces();
    let out = arbiter(&["--json", "--config", "slow_spill = \"always\""]);
    assert!(
        out.status.success(),
        "arbiter failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = arbiter(&["--config", "slow_spill = \"sometimes\""]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("slow_spill"), "{stderr}");
}
