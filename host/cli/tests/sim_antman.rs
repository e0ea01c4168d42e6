//! `arbiter sim --protocol antman` as a real process: AntMan's Table 2 under its five
//! settings, as JSON and as a table, with a scenario file, and refusing what does not apply.

use serde_json::Value;
use std::process::Command;

mod common;

use common::{BIN, json_of, sim_scenario};

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
    // A 40 GB GPU holds both jobs: Pack no longer runs Job-B out of memory.
    let v = json_of(&sim_scenario(
        "antman",
        "gpu_memory_mib = 40960\n",
        &["--json"],
    ));
    assert_eq!(end_of(&v, 2, 1), "finished");

    let out = sim_scenario("antman", "packing_efficiency = 2.0\n", &[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("packing_efficiency"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sim(&["--nodes", "x.csv"]);
    assert!(!out.status.success(), "--nodes does not apply");
}

/// `arbiter sim --protocol antman-trace`: Fig. 13's four schedulers on a small set-up (one
/// seed of 40 Philly jobs), as JSON and as a table; a bad set-up is refused by name.
#[test]
fn the_trace_experiment_runs_its_four_schedulers_on_a_set_up_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("setup.toml");
    std::fs::write(&file, "jobs = 40\nseeds = [3]\n").unwrap();
    let config = file.to_str().unwrap();
    let trace = |extra: &[&str]| {
        Command::new(BIN)
            .args(["sim", "--protocol", "antman-trace"])
            .args(extra)
            .output()
            .expect("run arbiter")
    };
    let out = trace(&["--json", "--config", config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let seeds = v["seeds"].as_array().expect("seeds");
    assert_eq!(seeds.len(), 1);
    assert_eq!(seeds[0]["seed"], 3);
    let runs = seeds[0]["runs"].as_array().expect("runs");
    let labels: Vec<&str> = runs.iter().filter_map(|r| r["setting"].as_str()).collect();
    assert_eq!(labels, ["YARN-CS", "Gandiva", "AntMan", "YARN-CS-preempt"]);
    for r in runs {
        let jobs = r["metrics"]["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), 40, "{}", r["setting"]);
        assert!(
            jobs.iter().all(|j| j["end"] == "finished"),
            "{}: every job finishes",
            r["setting"]
        );
        assert_eq!(r["metrics"]["policy_faults"], 0);
    }
    assert_eq!(runs[2]["preempted_share"], 0.0, "AntMan preempts nothing");
    let yarn = v["median_yarn_cs_over_antman"].as_f64().expect("a ratio");
    assert!(yarn.is_finite() && yarn > 0.0, "{yarn}");
    assert_eq!(v["paper_gandiva_over_antman"], 1.84);

    let out = trace(&["--config", config]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("YARN-CS-preempt"), "{text}");
    assert!(text.contains("(paper 2.05)"), "{text}");

    std::fs::write(&file, "arrivals = \"bursty\"\n").unwrap();
    let out = trace(&["--config", config]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("arrivals"), "{err}");
    std::fs::write(&file, "job = 40\n").unwrap();
    let out = trace(&["--config", config]);
    assert!(!out.status.success(), "an unknown key is refused");
    std::fs::write(&file, "seeds = []\n").unwrap();
    let out = trace(&["--config", config]);
    assert!(!out.status.success(), "no seed to run");
    let out = trace(&["--trace", "philly.csv"]);
    assert!(!out.status.success(), "--trace does not apply");
}

/// A horizon shorter than the jobs leaves them unfinished, and the table says so: it once
/// printed "Failed", the paper's word for a job out of memory or killed.
#[test]
fn jobs_cut_off_by_the_horizon_read_unfinished_not_failed() {
    let out = sim_scenario("antman", "horizon_ms = 60000\n", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for setting in ["Preempt ", "FIFO ", "Pack ", "UMem ", "AntMan "] {
        let row = text
            .lines()
            .find(|l| l.starts_with(setting))
            .unwrap_or_default();
        let ours: Vec<&str> = row
            .split_whitespace()
            .skip(1)
            .map(|cell| cell.split('/').next().unwrap_or_default())
            .collect();
        assert_eq!(ours, ["unfinished", "unfinished"], "{text}");
    }
}
