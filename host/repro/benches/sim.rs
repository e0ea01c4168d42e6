//! Simulator benchmarks (plain timing harness; numbers for BENCHMARKS.md).
//!
//! `cargo bench -p arbiter-repro --bench sim` (add `-- fgd`, `-- grid` or `-- philly` to run one).
//! Needs the shared traces folder; each benchmark says so and skips otherwise.
//!
//! * `fgd`: one FGD-protocol run on openb default with FGD as Wasm through
//!   the host path, and the same with FGD compiled natively into the host
//!   (the driver's native policy), to split policy cost from host cost;
//! * `grid`: 6 policies × seeds 42–51, all cores;
//! * `philly`: time-based replay of the 82k Philly jobs on the PAI cluster
//!   with best-fit, then with `sjf` on predicted durations (the paper's best
//!   predictor), with the process's peak RSS;
//! * `dynamoml`: DynamoML's §4 scenario under the four settings of Table 2
//!   (issue 19 target: the scenario ≤ 10 s), compile included.

use arbiter_host::runtime::NativePolicy;
use arbiter_policy_sdk::Runtime;
use arbiter_repro::compile_policies;
use arbiter_repro::fgd::{
    FGD_PAPER_POLICIES, policy_config, protocol_grid, scenario_run, trace_workload,
};
use arbiter_sim::core::{NativeFactory, RunPolicy};
use arbiter_sim::models::fgd::{FgdConfig, run_fgd};
use arbiter_sim::models::replay::{ReplayConfig, run_replay};
use arbiter_sim::prediction::Prediction;
use arbiter_sim::{ModelConfig, fgd_summary, run_many, scenario};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn openb() -> Option<scenario::Scenario> {
    let nodes = arbiter_traces::trace_file(arbiter_traces::openb::GPU_NODES_FILE).ok()?;
    let pods = arbiter_traces::trace_file("openb/openb_pod_list_default.csv").ok()?;
    scenario::from_files(Some(&nodes), Some(&pods), None).ok()
}

fn bench_fgd(engine: &arbiter_host::runtime::PolicyEngine) {
    let Some(s) = openb() else {
        return eprintln!("fgd: traces missing, skipped");
    };
    let compile_start = Instant::now();
    let compiled = engine
        .compile(arbiter_policies::get("fgd").expect("fgd"))
        .expect("compile");
    let compile = compile_start.elapsed();
    let fgd = FgdConfig::default();
    let mut run = scenario_run(
        &s,
        "fgd",
        &compiled,
        42,
        None,
        ModelConfig::Fgd(fgd.clone()),
    );
    run.options.keep_records = false;
    let opts = run.options.clone();
    let wasm = run_fgd(&s, &run.policy, "fgd", &fgd, &opts).expect("run");
    let m = wasm.fgd.as_ref().expect("fgd metrics");
    println!(
        "fgd/wasm: {:.2}s for {} rounds (compile {:.2}s; {:.2}s inside the policy; p50 {:.0} µs, p99 {:.0} µs), alloc@130 {:.2}%",
        wasm.wall_seconds,
        wasm.rounds,
        compile.as_secs_f64(),
        wasm.policy_seconds,
        wasm.round_latency_p50_us,
        wasm.round_latency_p99_us,
        m.gpu_alloc_pct_at_130
    );
    // The same policy natively: a slot whose generation always refuses
    // (`misbehave` in `fail` mode, quarantined after 3 rounds) hands every
    // round to the driver's native policy, here FGD itself.
    let refuse = engine
        .compile(arbiter_policies::fixture("misbehave").expect("fixture"))
        .expect("compile");
    // Configured exactly as the Wasm run is: seed 42 and the trace's target workload.
    let config =
        policy_config("fgd", opts.seed, || trace_workload(&s)).expect("fgd takes a configuration");
    let native: NativeFactory = Arc::new(move || {
        let mut fgd = Runtime::<policy_fgd::Fgd>::new();
        fgd.configure(&config).expect("configure native fgd");
        Box::new(fgd) as Box<dyn NativePolicy>
    });
    let opts = arbiter_sim::RunOptions {
        native_fallback: Some(native),
        ..opts
    };
    let refuse = RunPolicy {
        compiled: refuse,
        config: Some("mode = fail".into()),
    };
    let nat = run_fgd(&s, &refuse, "fgd (native)", &fgd, &opts).expect("run");
    println!(
        "fgd/native-in-host: {:.2}s ({:.2}s inside the policy), alloc@130 {:.2}%",
        nat.wall_seconds,
        nat.policy_seconds,
        nat.fgd
            .as_ref()
            .map_or(f64::NAN, |m| m.gpu_alloc_pct_at_130)
    );
}

fn bench_grid(engine: &arbiter_host::runtime::PolicyEngine) {
    let Some(s) = openb() else {
        return eprintln!("grid: traces missing, skipped");
    };
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    let policies =
        compile_policies(engine, &FGD_PAPER_POLICIES.join(","), threads).expect("compile");
    let compiled_in = started.elapsed();
    let seeds: Vec<u64> = (42..52).collect();
    let jobs = protocol_grid(&s, &policies, &seeds, false);
    let runs = run_many(&s, &jobs, threads).expect("grid");
    println!(
        "grid: {} runs on {threads} threads in {:.1}s ({:.1}s of it compiling {} policies)",
        runs.len(),
        started.elapsed().as_secs_f64(),
        compiled_in.as_secs_f64(),
        policies.len()
    );
    for m in fgd_summary(&runs) {
        println!(
            "  {:<15} alloc@100 {:.2}%  alloc@130 {:.2}% (sd {:.2})  unalloc {:.1} GPUs  frag@80 {:.1}%  cpu {:.1}s",
            m.policy,
            m.gpu_alloc_pct_at_100,
            m.gpu_alloc_pct_at_130,
            m.gpu_alloc_pct_at_130_sd,
            m.unallocated_gpus_at_130,
            m.frag_ratio_pct_at_80,
            m.wall_seconds
        );
    }
}

fn bench_philly(engine: &arbiter_host::runtime::PolicyEngine) {
    let (Ok(machines), Ok(jobs)) = (
        arbiter_traces::trace_file(arbiter_traces::pai::MACHINE_SPEC_FILE),
        arbiter_traces::trace_file(arbiter_traces::philly::JOBS_FILE),
    ) else {
        return eprintln!("philly: traces missing, skipped");
    };
    let started = Instant::now();
    let s = scenario::from_files(Some(&machines), Some(&jobs), None).expect("philly scenario");
    let load = started.elapsed();
    // best-fit as before; then `sjf` on the paper's best predictor (issue 20's
    // target: the full replay with predictions ≤ 60 s), the same trace.
    for (name, prediction) in [("best-fit", Prediction::None), ("sjf", Prediction::Best)] {
        let compiled = engine
            .compile(arbiter_policies::get(name).expect("built-in"))
            .expect("compile");
        let replay = ReplayConfig {
            prediction,
            ..ReplayConfig::default()
        };
        let mut run = scenario_run(
            &s,
            name,
            &compiled,
            42,
            None,
            ModelConfig::Replay(replay.clone()),
        );
        run.options.keep_records = false;
        let out = run_replay(&s, &run.policy, name, &replay, &run.options).expect("replay");
        let m = out.replay.as_ref().expect("replay metrics");
        println!(
            "philly/{name} (prediction {prediction:?}): {} jobs on {} GPUs, {} rounds, {:.2}s run + {:.2}s load, peak RSS {:.0} MiB; completed {}, avg JCT {:.0}s, avg queue {:.1}s, mean alloc {:.1}%",
            s.tasks.len(),
            s.gpu_count(),
            out.rounds,
            out.wall_seconds,
            load.as_secs_f64(),
            peak_rss_mib().unwrap_or(f64::NAN),
            m.jobs_completed,
            m.avg_jct_s,
            m.avg_queue_s,
            m.mean_gpu_alloc_pct
        );
    }
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let engine = arbiter_sim::engine(Duration::from_secs(30)).expect("engine");
    if wants("philly") {
        // First, so its peak RSS is its own.
        bench_philly(&engine);
    }
    if wants("fgd") {
        bench_fgd(&engine);
    }
    if wants("grid") {
        bench_grid(&engine);
    }
    if wants("dynamoml") {
        bench_dynamoml();
    }
}

fn bench_dynamoml() {
    use arbiter_sim::models::dynamoml::DynamoSimConfig;
    let cfg = DynamoSimConfig::default();
    let demand = match arbiter_repro::dynamoml::trace_demand(&cfg) {
        Ok(d) => d,
        Err(e) => {
            println!("dynamoml: skipped ({e:#})");
            return;
        }
    };
    let started = Instant::now();
    let comparison = arbiter_repro::dynamoml::compare(&cfg, &demand).expect("scenario");
    let total = started.elapsed();
    println!(
        "dynamoml: 4 settings of Table 2 (compile included, in parallel) {:.2} s (target <= 10 s)",
        total.as_secs_f64()
    );
    for (label, m) in &comparison.runs {
        println!("  {label}: simulation {:.3} s", m.wall_seconds);
    }
}
