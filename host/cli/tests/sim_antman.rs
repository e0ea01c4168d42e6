//! `arbiter sim --protocol antman` as a real process: AntMan's Table 2 under its five
//! settings, as JSON and as a table, with a scenario file, and refusing what does not apply.

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_arbiter");

fn sim(extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["sim", "--protocol", "antman"])
        .args(extra)
        .output()
        .expect("run arbiter")
}

fn end_of(v: &Value, setting: usize, job: usize) -> String {
    v["runs"][setting]["metrics"]["jobs"][job]["end"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_five_settings_run_with_the_papers_failures() {
    let out = sim(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let labels: Vec<&str> = v["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["setting"].as_str())
        .collect();
    assert_eq!(labels, ["Preempt", "FIFO", "Pack", "UMem", "AntMan"]);
    assert_eq!(end_of(&v, 0, 0), "killed", "Preempt kills Job-A");
    assert_eq!(
        end_of(&v, 2, 1),
        "out-of-memory",
        "Pack runs Job-B out of memory"
    );
    assert_eq!(end_of(&v, 4, 0), "finished");
    assert_eq!(end_of(&v, 4, 1), "finished");
    assert_eq!(v["paper"][1]["job_b_min"], 108.2);

    let out = sim(&[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("FIFO            43.0/43.0      108.1/108.2"),
        "{text}"
    );
}

#[test]
fn a_scenario_file_changes_the_scenario_and_nonsense_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A 40 GB GPU holds both jobs: Pack no longer runs Job-B out of memory.
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, "gpu_memory_mib = 40960\n").unwrap();
    let out = sim(&["--json", "--config", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(end_of(&v, 2, 1), "finished");

    std::fs::write(&file, "packing_efficiency = 2.0\n").unwrap();
    let out = sim(&["--config", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("packing_efficiency"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sim(&["--nodes", "x.csv"]);
    assert!(!out.status.success(), "--nodes does not apply");
}
