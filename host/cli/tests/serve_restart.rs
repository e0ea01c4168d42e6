//! `arbiter serve` as a real process, driven by the real CLI: kill -9 it in
//! the middle of an experiment and restart it on the same data directory.
//! Nothing submitted, loaded or started may be lost, and scheduling resumes.

use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{BIN, Server};

fn cli(server: &Server, token: &str, args: &[&str]) -> Value {
    common::cli_json(&server.url, token, args)
}

fn jobs(server: &Server, token: &str) -> Vec<Value> {
    cli(server, token, &["jobs"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kill_9_and_restart_loses_nothing_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = common::serve(&data, "127.0.0.1:0");
    let admin = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let tenant = cli(
        &server,
        &admin,
        &["tenant", "add", "team-a", "--quota-gpus", "16"],
    );
    let tenant_token = tenant["token"].as_str().unwrap().to_string();
    cli(
        &server,
        &admin,
        &["policy", "load", "builtin:fifo", "--slot", "fifo"],
    );
    cli(
        &server,
        &admin,
        &[
            "ab",
            "start",
            "exp",
            "--candidate",
            "fifo",
            "--tenants",
            "team-a",
        ],
    );
    let long = cli(
        &server,
        &tenant_token,
        &[
            "submit",
            "--name",
            "long",
            "--gpus",
            "4",
            "--duration",
            "10m",
            "--",
            "sleep",
            "600",
        ],
    )["id"]
        .as_u64()
        .unwrap();
    let mut short = Vec::new();
    for i in 0..3 {
        short.push(
            cli(
                &server,
                &admin,
                &[
                    "submit",
                    "--name",
                    &format!("s{i}"),
                    "--gpus",
                    "2",
                    "--duration",
                    "2s",
                ],
            )["id"]
                .as_u64()
                .unwrap(),
        );
    }
    let running_node = {
        let mut node = String::new();
        wait_until("the long job to run", || {
            let js = jobs(&server, &tenant_token);
            match js.iter().find(|j| j["id"] == long) {
                Some(j) if j["state"] == "running" => {
                    node = j["node"].as_str().unwrap_or_default().to_string();
                    true
                }
                _ => false,
            }
        });
        node
    };
    assert_eq!(
        jobs(&server, &tenant_token).len(),
        1,
        "a tenant sees only its jobs"
    );

    let before = cli(&server, &admin, &["ab", "status", "exp"]);

    // kill -9 (SIGKILL): no shutdown path runs.
    drop(server);

    let server = common::serve(&data, "127.0.0.1:0");
    let all = jobs(&server, &admin);
    assert_eq!(all.len(), 4, "{all:?}");
    let l = all.iter().find(|j| j["id"] == long).unwrap();
    assert_eq!(l["state"], "running", "the running job was adopted: {l}");
    assert_eq!(l["node"], running_node.as_str());
    assert_eq!(l["arm"], "candidate");
    // The experiment, the candidate slot and the tenant token survived.
    let status = cli(&server, &admin, &["ab", "status", "exp"]);
    assert_eq!(status["state"], "running", "{status}");
    // The arms' statistics survived the kill (they reset to nothing before):
    // every enrolled job still counts — the long job in the candidate arm,
    // the short ones in control — with the long job's measured queue delay,
    // and the counters add up.
    let arm = |s: &Value, name: &str| -> Value {
        s["arms"]
            .as_array()
            .and_then(|arms| arms.iter().find(|a| a["arm"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no arm {name}: {s}"))
    };
    let (cand, ctrl) = (arm(&status, "candidate"), arm(&status, "control"));
    assert_eq!(cand["jobs_submitted"], 1, "{status}");
    assert_eq!(cand["jobs_started"], 1, "{status}");
    assert_eq!(ctrl["jobs_submitted"], 3, "{status}");
    assert_eq!(
        cand["queue_delay_ms"],
        arm(&before, "candidate")["queue_delay_ms"],
        "before: {before}\nafter: {status}"
    );
    for a in [&cand, &ctrl] {
        let n = |k: &str| a[k].as_u64().unwrap_or(u64::MAX);
        assert!(
            n("jobs_submitted") >= n("jobs_started") && n("jobs_started") >= n("jobs_finished"),
            "{a}"
        );
    }
    let slot = cli(&server, &admin, &["policy", "describe", "fifo"]);
    assert_eq!(slot["generations"][0]["name"], "fifo", "{slot}");
    assert_eq!(jobs(&server, &tenant_token).len(), 1);
    // Scheduling resumes: the short jobs finish and a new one runs.
    wait_until("the short jobs to finish", || {
        let js = jobs(&server, &admin);
        short.iter().all(|id| {
            js.iter()
                .any(|j| j["id"] == *id && j["state"] == "succeeded")
        })
    });
    let new = cli(
        &server,
        &admin,
        &[
            "submit",
            "--name",
            "after",
            "--gpus",
            "1",
            "--duration",
            "1s",
        ],
    )["id"]
        .as_u64()
        .unwrap();
    assert!(new > long, "ids are never reused");
    wait_until("the new job to finish", || {
        jobs(&server, &admin)
            .iter()
            .any(|j| j["id"] == new && j["state"] == "succeeded")
    });
    // Promote, restart again: the promotion sticks.
    cli(&server, &admin, &["ab", "promote", "exp"]);
    drop(server);
    let server = common::serve(&data, "127.0.0.1:0");
    let top = cli(&server, &admin, &["top"]);
    assert_eq!(top["policy"], "fifo", "{top}");
    assert_eq!(top["experiment"], "", "{top}");
    // The journal replays bit for bit with the recorded policy.
    drop(server);
    let out = Command::new(BIN)
        .arg("replay")
        .arg(data.join("journal.jsonl"))
        .args(["--policy", "best-fit", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let exact = &report["exact"];
    assert!(exact["rounds_compared"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(
        exact["rounds_compared"], exact["rounds_identical"],
        "{report}"
    );
    assert!(
        report["counterfactual"]["jobs"].as_u64().unwrap() >= 3,
        "{report}"
    );
}

#[test]
fn a_second_control_plane_on_the_same_data_directory_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = common::serve(&data, "127.0.0.1:0");
    let second = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-metrics", "--data"])
        .arg(&data)
        .output()
        .expect("run arbiter serve");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    let expected = format!("is open in another process, pid {} (", first.pid());
    assert!(stderr.contains(&expected), "{stderr}");
    // The first one serves on, and once it is gone (kill -9: the kernel drops its
    // lock) the data directory opens again.
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap();
    assert!(jobs(&first, token.trim()).is_empty());
    drop(first);
    let again = common::serve(&data, "127.0.0.1:0");
    assert!(jobs(&again, token.trim()).is_empty());
}
