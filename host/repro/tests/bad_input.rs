//! Bad input ends in a clear error, or in tasks reported as rejected or
//! unplaced — never in a panic or a hang.

use arbiter_host::runtime::NativePolicy;
use arbiter_policy_sdk::prelude::*;
use arbiter_repro::{SimArgs, run};
use arbiter_sim::core::{NativeFactory, RunPolicy};
use arbiter_sim::models::fgd::{FgdConfig, run_fgd};
use arbiter_sim::models::replay::{ReplayConfig, run_replay};
use arbiter_sim::{Protocol, RunOptions, scenario};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
n0,64000,262144,8,V100M32\n\
n1,32000,131072,4,T4\n\
n2,96000,393216,8,G2\n";

const HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Runs `arbiter sim --nodes NODES --trace <pods>` (replay).
fn sim(pods: &str) -> anyhow::Result<arbiter_sim::SimOutput> {
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = write(dir.path(), "nodes.csv", NODES);
    let trace = write(dir.path(), "pods.csv", pods);
    run(&SimArgs {
        nodes: Some(nodes),
        trace: Some(trace),
        ..SimArgs::default()
    })
}

fn error(pods: &str) -> String {
    format!("{:#}", sim(pods).expect_err("should fail"))
}

#[test]
fn empty_trace_is_an_error() {
    assert!(error(HEADER).contains("no tasks"), "{}", error(HEADER));
    let zero = error("");
    assert!(zero.contains("empty"), "{zero}");
}

#[test]
fn unknown_gpu_model_in_a_constraint_is_an_error() {
    let msg = error(&format!(
        "{HEADER}p0,4000,8192,1,500,H100,LS,Running,0,100,0\n"
    ));
    assert!(msg.contains("H100"), "{msg}");
}

#[test]
fn model_no_node_has_and_oversized_tasks_are_rejected_with_reasons() {
    let pods = format!(
        "{HEADER}ok,4000,8192,1,500,,LS,Running,0,100,0\n\
a10-only,4000,8192,1,500,A10,LS,Running,5,100,5\n\
huge,4000,8192,16,1000,,LS,Running,6,100,6\n\
fat-cpu,200000,8192,1,1000,,LS,Running,7,100,7\n"
    );
    let out = sim(&pods).expect("runs");
    assert_eq!(out.scenario.tasks, 1);
    assert_eq!(out.scenario.rejected, 3);
    let reasons: Vec<String> = out
        .scenario
        .rejected_examples
        .iter()
        .map(|r| format!("{}: {}", r.task, r.reason))
        .collect();
    assert!(
        reasons[0].starts_with("a10-only") && reasons[0].contains("GPU model"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("huge") && reasons[1].contains("no node"),
        "{reasons:?}"
    );
    assert!(reasons[2].starts_with("fat-cpu"), "{reasons:?}");
    assert_eq!(
        out.runs[0].replay.as_ref().expect("replay").jobs_completed,
        1
    );
    assert!(out.human().contains("rejected"));
}

#[test]
fn a_gang_larger_than_the_cluster_is_rejected() {
    let mut s = scenario::builtin_example(1);
    let mut big = s.tasks[0].clone();
    big.request.name = "too-many-workers".into();
    big.request.workers = 40;
    big.request.min_workers = 40;
    big.request.max_workers = 40;
    big.request.gpus_per_worker = 8;
    big.request.gpu_milli = 1000;
    big.request.gpu_models.clear();
    s.tasks.push(big);
    let s = s.finish().expect("valid");
    assert!(
        s.rejected
            .iter()
            .any(|r| r.task == "too-many-workers" && r.reason.contains("holds only")),
        "{:?}",
        s.rejected
    );
}

#[test]
fn negative_or_reversed_times_are_errors_and_out_of_order_rows_are_sorted() {
    let reversed = error(&format!(
        "{HEADER}p0,4000,8192,1,500,,LS,Running,100,50,100\n"
    ));
    assert!(reversed.contains("deletion before creation"), "{reversed}");
    let negative = error(&format!("{HEADER}p0,4000,8192,1,500,,LS,Running,-5,50,0\n"));
    assert!(negative.contains("creation_time"), "{negative}");
    let out = sim(&format!(
        "{HEADER}late,4000,8192,1,500,,LS,Running,300,400,300\nearly,4000,8192,1,500,,LS,Running,100,200,100\n"
    ))
    .expect("runs");
    let records = &out.runs[0].records;
    assert_eq!(records[0].task, "early");
    assert_eq!(records[0].arrival_s, 0.0);
    assert_eq!(records[1].arrival_s, 200.0);
    assert!(records.iter().all(|r| r.outcome == "completed"));
}

#[test]
fn duplicate_names_are_errors() {
    let msg = error(&format!(
        "{HEADER}p0,4000,8192,1,500,,LS,Running,0,10,0\np0,4000,8192,1,500,,LS,Running,1,10,1\n"
    ));
    assert!(msg.contains("duplicate task name `p0`"), "{msg}");
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = write(
        dir.path(),
        "nodes.csv",
        &format!("{NODES}n0,1000,1000,1,T4\n"),
    );
    let trace = write(
        dir.path(),
        "pods.csv",
        &format!("{HEADER}p0,4000,8192,1,500,,LS,Running,0,10,0\n"),
    );
    let err = run(&SimArgs {
        nodes: Some(nodes),
        trace: Some(trace),
        ..SimArgs::default()
    })
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("duplicate node name `n0`"),
        "{err:#}"
    );
}

#[test]
fn unrecognised_files_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = write(dir.path(), "what.csv", "a,b,c\n1,2,3\n");
    let err = run(&SimArgs {
        trace: Some(trace),
        ..SimArgs::default()
    })
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("unrecognised trace header"),
        "{err:#}"
    );
    // Each of these ran for hours or ran out of memory: 1e9 copies of the trace, 1e8 runs.
    for (args, flag) in [
        (
            SimArgs {
                tune: -1.0,
                ..SimArgs::default()
            },
            "--tune",
        ),
        (
            SimArgs {
                tune: 1e9,
                ..SimArgs::default()
            },
            "--tune",
        ),
        (
            SimArgs {
                seeds: 100_000_000,
                ..SimArgs::default()
            },
            "--seeds",
        ),
        (
            SimArgs {
                interval_s: 1e30,
                ..SimArgs::default()
            },
            "--interval-s",
        ),
    ] {
        let err = run(&args).unwrap_err();
        assert!(format!("{err:#}").contains(flag), "{err:#}");
    }
}

/// The simulator tells a trace's and a node list's format from their headers as the
/// loaders read them: a spreadsheet's export (byte-order mark, quoted names, CRLF) is the
/// same trace, not an unrecognised one.
#[test]
fn a_spreadsheet_export_runs_as_the_plain_files() {
    let export = |text: &str| {
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        let quoted: Vec<String> = header.split(',').map(|c| format!("\"{c}\"")).collect();
        let mut out = format!("\u{feff}{}\r\n", quoted.join(","));
        for row in lines {
            out += row;
            out += "\r\n";
        }
        out
    };
    let pods = format!(
        "{HEADER}p0,4000,8192,1,500,,LS,Running,0,100,0\np1,8000,16384,2,1000,V100M32,LS,Running,5,50,5\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let summary = |nodes: &str, trace: &str| {
        let out = run(&SimArgs {
            nodes: Some(write(dir.path(), "nodes.csv", nodes)),
            trace: Some(write(dir.path(), "pods.csv", trace)),
            ..SimArgs::default()
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
        let run = &out.runs[0];
        let records: Vec<String> = run.records.iter().map(|r| format!("{r:?}")).collect();
        (
            out.scenario.gpus,
            run.tasks,
            run.placed,
            run.rounds,
            records,
        )
    };
    let plain = summary(NODES, &pods);
    assert_eq!((plain.0, plain.1, plain.2), (20, 2, 2));
    assert_eq!(summary(&export(NODES), &export(&pods)), plain);
}

/// A policy that is not a scheduler is refused by name, with its roles: every round would
/// pass it over and the run would be the native fallback's under its name.
#[test]
fn a_policy_without_the_scheduler_role_is_refused() {
    for (policy, role) in [("sysmonitor", "coordinator"), ("greedy-matcher", "matcher")] {
        let err = run(&SimArgs {
            policy: format!("best-fit,{policy}"),
            ..SimArgs::default()
        })
        .expect_err("not a scheduler");
        let text = format!("{err:#}");
        assert!(
            text.contains(&format!("`{policy}` is not a scheduler")) && text.contains(role),
            "{text}"
        );
    }
}

/// Answers every round with nothing.
struct NeverPlace;

impl Policy for NeverPlace {
    fn manifest() -> Manifest {
        manifest(
            "never-place",
            "0.1.0",
            &[Role::Scheduler],
            "Places nothing, ever.",
        )
    }
    fn create() -> Self {
        NeverPlace
    }
    fn schedule(
        &mut self,
        _cluster: &Cluster,
        _round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(Vec::new())
    }
}

#[test]
fn a_policy_that_never_places_ends_with_every_task_unplaced() {
    // A Wasm policy that refuses every round (`mode = fail`), whose fallback
    // (the driver's native last resort) places nothing either.
    let engine = arbiter_sim::engine(Duration::from_secs(5)).expect("engine");
    let compiled = engine
        .compile(arbiter_policies::fixture("misbehave").expect("fixture"))
        .expect("compile");
    let never: NativeFactory =
        Arc::new(|| Box::new(Runtime::<NeverPlace>::new()) as Box<dyn NativePolicy>);
    let opts = RunOptions {
        native_fallback: Some(never),
        ..RunOptions::default()
    };
    let policy = RunPolicy {
        compiled,
        config: Some("mode = fail".into()),
    };
    let scenario = scenario::builtin_example(3);
    let out = run_replay(
        &scenario,
        &policy,
        "misbehave",
        &ReplayConfig::default(),
        &opts,
    )
    .expect("replay ends");
    let m = out.replay.as_ref().expect("replay");
    assert_eq!(m.jobs_unplaced, scenario.tasks.len());
    assert_eq!(m.jobs_completed, 0);
    assert_eq!(out.placed, 0);
    assert!(out.records.iter().all(|r| r.outcome == "unplaced"));
    assert!(out.policy_faults > 0 && out.fallback_rounds == out.rounds);
    let out = run_fgd(
        &scenario,
        &policy,
        "misbehave",
        &FgdConfig::default(),
        &opts,
    )
    .expect("fgd ends");
    let m = out.fgd.as_ref().expect("fgd");
    assert_eq!(m.tasks_failed, m.tasks_offered);
    assert!(out.series.iter().all(|p| p.gpu_alloc_pct == 0.0));
    // The example is small: tuning stops at the first draw that would pass
    // 130 % (at 126 % here), so no task arrives near 130 % and the bucket
    // metric has no value there, as in the reference's analysis.
    assert!(m.arrived_pct < 129.5, "{}", m.arrived_pct);
    assert!(m.gpu_alloc_pct_at_130.is_nan());
    assert_eq!(out.protocol, Protocol::Fgd);
}
