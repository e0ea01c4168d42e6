//! `arbiter sim --protocol dynamoml` as a real process: DynamoML's §4 scenario under the four
//! settings of its Table 2, as JSON and as a table, with a scenario file, and refusing what
//! does not apply.

use serde_json::Value;
use std::process::Command;

mod common;

use common::{BIN, json_of, sim_scenario};

fn sim(extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["sim", "--protocol", "dynamoml"])
        .args(extra)
        .output()
        .expect("run arbiter")
}

#[test]
fn the_four_settings_run_and_the_peak_allocation_is_the_papers() {
    let out = sim(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let runs = v["runs"].as_array().expect("runs");
    let labels: Vec<&str> = runs.iter().filter_map(|r| r["setting"].as_str()).collect();
    assert_eq!(
        labels,
        ["DynamoML", "K8S+Sharing", "K8S+Scaling", "Native K8S"]
    );
    assert_eq!(runs[0]["metrics"]["inference_gpus_0_7"], 11);
    assert_eq!(runs[2]["metrics"]["inference_gpus_0_7"], 4);
    assert!((v["paper_makespan_ratio"].as_f64().unwrap() - 27.0 / 67.0).abs() < 1e-9);

    let out = sim(&[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("inference GPUs at the first peak 11 / 4 (paper 11 / 4)"),
        "{text}"
    );
}

#[test]
fn a_scenario_file_changes_the_scenario_and_nonsense_is_refused() {
    // Half the SLO: more requests over it, same peak allocation.
    let v = json_of(&sim_scenario("dynamoml", "slo_ms = 64\n", &["--json"]));
    assert_eq!(v["runs"][0]["metrics"]["inference_gpus_0_7"], 11);

    let out = sim_scenario("dynamoml", "no_such_key = 1\n", &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("scenario configuration"));
    let out = sim(&["--trace", "x.csv"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("do not apply"));
}

/// A horizon shorter than the training leaves jobs unfinished: no makespan and no ratio
/// is printed for them (it once printed makespan 0.0 and a ratio of NaN), the table counts
/// them, and the JSON's ratios are null.
#[test]
fn a_horizon_before_the_jobs_end_reports_them_unfinished_with_no_ratio() {
    let short = "horizon_ms = 600000\n";
    let v = json_of(&sim_scenario("dynamoml", short, &["--json"]));
    assert!(v["makespan_ratio"].is_null(), "{v}");
    assert!(v["training_cut_vs_native_pct"].is_null(), "{v}");
    assert!(v["runs"][0]["metrics"]["unfinished"].as_u64().unwrap_or(0) > 0);

    let out = sim_scenario("dynamoml", short, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("makespan DynamoML / K8S+Scaling n/a (DynamoML left ")
            && text.contains("unfinished at the horizon")
            && !text.contains("NaN"),
        "{text}"
    );
}
