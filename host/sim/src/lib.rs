//! # Arbiter simulator
//!
//! A discrete-event, virtual-time simulator that drives the **real** host
//! core — [`ClusterState`](arbiter_host::state::ClusterState),
//! [`RoundDriver`](arbiter_host::roles::scheduler::RoundDriver) and a
//! [`PolicySlot`](arbiter_host::registry::PolicySlot) holding the policy
//! compiled as Wasm by [`PolicyEngine`] — over a cluster and a workload:
//!
//! * **replay** ([`Protocol::Replay`]): tasks arrive and leave at their
//!   trace times (openb creation/deletion, Philly submit + duration, or the
//!   built-in example); a round runs at every event time at which some task
//!   waits (or at most every `--interval-s`). Metrics: JCT, queueing delay,
//!   makespan, time-weighted GPU allocation, utilization time series.
//! * **fgd** ([`Protocol::Fgd`]): the FGD paper's static placement — tasks
//!   shuffled with the seed, repeated until their GPU request is `tune` ×
//!   capacity, one task per round, no departures, an unplaced task is
//!   dropped. Metrics: GPU allocation at 100% and 130% arrived load,
//!   unallocated GPUs, FGD fragmentation (amount and ratio) against arrived
//!   load.
//!
//! * **aryl** ([`aryl`]): the Aryl paper's cluster model — a training pool
//!   and a slower inference pool whose idle servers are lent following an
//!   inference demand curve and taken back through the policy's `reclaim`
//!   role; elastic jobs, progress in GPU-time, preemption with a restart
//!   overhead. Metrics: queueing, JCT, combined usage, preemptions and
//!   collateral damage, and reclaim rules compared on the same requests.
//!   `arbiter sim --protocol aryl` runs the paper's comparison on the Philly
//!   trace ([`aryl::run_protocol`]).
//!
//! CPU, memory, milli-GPU and GPU memory are separate dimensions (the SDK
//! accounts them); GPU-model constraints, multi-GPU and gang tasks are
//! placed by the policy and checked by the host's validator like any live
//! round. Runs are deterministic for a given seed (wall-clock figures aside).
//!
//! The CLI flattens [`SimArgs`] into `arbiter sim` and calls [`run`]. With
//! no `--trace`, the built-in example runs (16 nodes, 128 GPUs, 320 jobs).

#![forbid(unsafe_code)]

pub mod aryl;
pub mod metrics;
pub mod report;
pub mod scenario;
pub mod sim;

pub use metrics::{FgdMetrics, ReplayMetrics, SeriesPoint, TaskRecord};
pub use scenario::{Scenario, SimTask, Source, TraceFormat};
pub use sim::{
    NativeFactory, Protocol, RunOptions, RunOutput, policy_config, run_fgd, run_replay, task_shape,
    tuned_tasks,
};

use anyhow::{Context, bail};
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, RuntimeConfig};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `arbiter sim` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Policy: a built-in name or a path to a `.wasm` component; several,
    /// comma-separated, to compare them on one scenario.
    #[arg(long, default_value = "best-fit")]
    pub policy: String,
    /// Node list: openb (`sn,cpu_milli,...`) or PAI (`machine,gpu_type,...`), detected by header.
    #[arg(long)]
    pub nodes: Option<PathBuf>,
    /// Task trace: openb pod list or Philly job table (plain or gzip). Without it the built-in example runs.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace format, if the header does not tell.
    #[arg(long, value_enum)]
    pub format: Option<TraceFormat>,
    /// `fgd` (static placement, the FGD paper's protocol), `replay` (time-based; the default)
    /// or `aryl` (the Aryl paper's comparison on the Philly trace; `--trace` may name the
    /// Philly job table, `--policy` does not apply).
    #[arg(long, value_enum)]
    pub protocol: Option<Protocol>,
    /// Seed: task order of the FGD protocol and the policies' tie-breaking.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Runs per policy with seeds `seed`, `seed+1`, ... (the paper uses 10: 42..=51).
    #[arg(long, default_value_t = 1)]
    pub seeds: u32,
    /// FGD protocol: tune the total GPU request to this multiple of capacity.
    #[arg(long, default_value_t = 1.3)]
    pub tune: f64,
    /// Replay: run rounds at most every this many virtual seconds (0 = at every event).
    #[arg(long, default_value_t = 0.0)]
    pub interval_s: f64,
    /// Policy configuration (TOML) instead of the derived one (`seed`, FGD's workload).
    #[arg(long)]
    pub config: Option<String>,
    /// Wall-clock bound of one policy call, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub deadline_ms: u64,
    /// Runs in parallel (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Write tasks.csv, series.csv and index.html (inline SVG plots) here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Aryl protocol: trace window and cluster size (`ci`, `full` or `paper`; default `ci`).
    #[arg(long, value_enum)]
    pub scale: Option<aryl::ScaleName>,
    /// Aryl protocol: days of the trace window, instead of the scale's.
    #[arg(long)]
    pub days: Option<i64>,
    /// Aryl protocol: keep every n-th job of the window, instead of the scale's.
    #[arg(long)]
    pub sample_every: Option<usize>,
    /// Aryl protocol: training servers, instead of the scale's (the inference pool follows at
    /// 8 : 7 unless `--inference-nodes` is given).
    #[arg(long)]
    pub training_nodes: Option<u32>,
    /// Aryl protocol: inference servers, instead of the scale's.
    #[arg(long)]
    pub inference_nodes: Option<u32>,
}

impl Default for SimArgs {
    fn default() -> Self {
        SimArgs {
            policy: "best-fit".into(),
            nodes: None,
            trace: None,
            format: None,
            protocol: None,
            seed: 42,
            seeds: 1,
            tune: 1.3,
            interval_s: 0.0,
            config: None,
            deadline_ms: 10_000,
            threads: None,
            json: false,
            report: None,
            scale: None,
            days: None,
            sample_every: None,
            training_nodes: None,
            inference_nodes: None,
        }
    }
}

/// The scenario a run used.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioSummary {
    pub name: String,
    pub source: Source,
    pub protocol: Protocol,
    pub nodes: usize,
    pub gpus: u64,
    pub tasks: usize,
    /// Tasks set aside before the run (no node could ever hold them).
    pub rejected: usize,
    /// The first few rejections with their reasons.
    pub rejected_examples: Vec<scenario::Rejected>,
}

/// Mean over seeds of one policy's FGD-protocol runs.
#[derive(Clone, Debug, Serialize)]
pub struct FgdSummary {
    pub policy: String,
    pub seeds: usize,
    pub gpu_alloc_pct_at_100: f64,
    pub gpu_alloc_pct_at_130: f64,
    pub gpu_alloc_pct_at_130_sd: f64,
    pub unallocated_gpus_at_130: f64,
    pub frag_ratio_pct_at_80: f64,
    pub wall_seconds: f64,
}

/// Everything `arbiter sim` produced.
#[derive(Clone, Debug, Serialize)]
pub struct SimOutput {
    pub scenario: ScenarioSummary,
    /// One per policy and seed, in the order given.
    pub runs: Vec<RunOutput>,
    /// FGD protocol: per-policy means over the seeds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fgd_summary: Vec<FgdSummary>,
    /// Where `--report` wrote its files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_dir: Option<PathBuf>,
    /// Whole command, loading included.
    pub wall_seconds: f64,
}

/// A policy named on the command line, resolved to component bytes.
pub struct PolicySource {
    /// As given (a built-in name or a path).
    pub label: String,
    pub bytes: Vec<u8>,
}

/// Resolves `name-or-path`: a built-in policy name, else a `.wasm` file.
pub fn resolve_policy(spec: &str) -> anyhow::Result<PolicySource> {
    if let Some(bytes) = arbiter_policies::get(spec) {
        return Ok(PolicySource {
            label: spec.to_string(),
            bytes: bytes.to_vec(),
        });
    }
    let path = std::path::Path::new(spec);
    if path.exists() {
        let bytes =
            std::fs::read(path).with_context(|| format!("reading policy {}", path.display()))?;
        return Ok(PolicySource {
            label: spec.to_string(),
            bytes,
        });
    }
    let names: Vec<&str> = arbiter_policies::names().collect();
    bail!(
        "`{spec}` is neither a built-in policy ({}) nor a file",
        names.join(", ")
    )
}

/// The engine the simulator uses: the host's defaults with a longer call
/// deadline (a round over a long backlog may take longer than a live round
/// should; a missed deadline would silently hand the round to the fallback).
pub fn engine(deadline: Duration) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::new(RuntimeConfig {
        deadline,
        ..RuntimeConfig::default()
    })
}

/// Compiles each comma-separated policy once.
pub fn compile_policies(
    engine: &PolicyEngine,
    list: &str,
) -> anyhow::Result<Vec<(String, CompiledPolicy)>> {
    let mut out = Vec::new();
    for spec in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let source = resolve_policy(spec)?;
        let compiled = engine
            .compile(&source.bytes)
            .with_context(|| format!("compiling policy `{spec}`"))?;
        out.push((source.label, compiled));
    }
    if out.is_empty() {
        bail!("--policy names no policy");
    }
    Ok(out)
}

/// Runs every (policy, seed) of `jobs` on `threads` threads; results in job order.
pub fn run_many(
    scenario: &Scenario,
    protocol: Protocol,
    jobs: &[(String, CompiledPolicy, RunOptions)],
    threads: usize,
) -> anyhow::Result<Vec<RunOutput>> {
    parallel_map(jobs, threads, |(label, compiled, opts)| match protocol {
        Protocol::Fgd => run_fgd(scenario, compiled, label, opts),
        Protocol::Replay => run_replay(scenario, compiled, label, opts),
        Protocol::Aryl => bail!("the aryl protocol runs through `aryl::run_protocol`"),
    })
}

/// Applies `run` to every item on a rayon pool of `threads` threads; results
/// in item order. A panicking run is an error naming the item's position and
/// the panic message, not a crash of the caller (rayon alone would re-panic).
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    run: impl Fn(&T) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    use rayon::prelude::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.clamp(1, items.len().max(1)))
        .thread_name(|i| format!("arbiter-sim-{i}"))
        .build()
        .context("starting the simulation thread pool")?;
    pool.install(|| {
        items
            .par_iter()
            .enumerate()
            .map(|(i, item)| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(item))).unwrap_or_else(
                    |panic| {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "no message".into());
                        Err(anyhow::anyhow!("simulation run #{i} panicked: {message}"))
                    },
                )
            })
            .collect()
    })
}

/// Per-policy means of FGD-protocol runs.
pub fn fgd_summary(runs: &[RunOutput]) -> Vec<FgdSummary> {
    let mut order: Vec<&str> = Vec::new();
    for r in runs {
        if r.fgd.is_some() && !order.contains(&r.policy.as_str()) {
            order.push(&r.policy);
        }
    }
    order
        .into_iter()
        .map(|policy| {
            let mine: Vec<&RunOutput> = runs.iter().filter(|r| r.policy == policy).collect();
            let get = |f: fn(&FgdMetrics) -> f64| -> Vec<f64> {
                mine.iter().filter_map(|r| r.fgd.as_ref()).map(f).collect()
            };
            let at_130 = get(|m| m.gpu_alloc_pct_at_130);
            FgdSummary {
                policy: policy.to_string(),
                seeds: mine.len(),
                gpu_alloc_pct_at_100: metrics::mean(&get(|m| m.gpu_alloc_pct_at_100)),
                gpu_alloc_pct_at_130: metrics::mean(&at_130),
                gpu_alloc_pct_at_130_sd: metrics::std_dev(&at_130),
                unallocated_gpus_at_130: metrics::mean(&get(|m| m.unallocated_gpus_at_130)),
                frag_ratio_pct_at_80: metrics::mean(&get(|m| m.frag_ratio_pct_at_80)),
                wall_seconds: mine.iter().map(|r| r.wall_seconds).sum(),
            }
        })
        .collect()
}

/// `arbiter sim`: loads the scenario, runs each policy (and seed), and
/// writes the report if asked.
pub fn run(args: &SimArgs) -> anyhow::Result<SimOutput> {
    let span = tracing::info_span!("sim", policy = %args.policy, protocol = ?args.protocol);
    let _guard = span.enter();
    let started = Instant::now();
    if !(args.tune.is_finite() && args.tune > 0.0) {
        bail!("--tune must be a positive number, got {}", args.tune);
    }
    if !(args.interval_s.is_finite() && args.interval_s >= 0.0) {
        bail!(
            "--interval-s must be zero or positive, got {}",
            args.interval_s
        );
    }
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    if args.protocol == Some(Protocol::Aryl) {
        bail!("the aryl protocol has its own driver: `arbiter_sim::aryl::run_protocol`");
    }
    let scenario = scenario::from_files(args.nodes.as_deref(), args.trace.as_deref(), args.format)?;
    let protocol = args.protocol.unwrap_or(Protocol::Replay);
    if scenario.tasks.is_empty() {
        bail!(
            "no task of `{}` fits any node ({} rejected)",
            scenario.name,
            scenario.rejected.len()
        );
    }
    let engine = engine(Duration::from_millis(args.deadline_ms.max(1)))?;
    let policies = compile_policies(&engine, &args.policy)?;
    let mut jobs = Vec::new();
    for (label, compiled) in &policies {
        for k in 0..args.seeds {
            let opts = RunOptions {
                seed: args.seed.wrapping_add(u64::from(k)),
                tune: args.tune,
                interval_ms: (args.interval_s * 1000.0).round() as u64,
                config: args.config.clone(),
                native_fallback: None,
                keep_records: true,
            };
            jobs.push((label.clone(), compiled.clone(), opts));
        }
    }
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_many(&scenario, protocol, &jobs, threads)?;
    let mut output = SimOutput {
        scenario: ScenarioSummary {
            name: scenario.name.clone(),
            source: scenario.source.clone(),
            protocol,
            nodes: scenario.nodes.len(),
            gpus: scenario.gpu_count(),
            tasks: scenario.tasks.len(),
            rejected: scenario.rejected.len(),
            rejected_examples: scenario.rejected.iter().take(5).cloned().collect(),
        },
        fgd_summary: fgd_summary(&runs),
        runs,
        report_dir: None,
        wall_seconds: 0.0,
    };
    if let Some(dir) = &args.report {
        report::write(dir, &output)?;
        output.report_dir = Some(dir.clone());
    }
    output.wall_seconds = started.elapsed().as_secs_f64();
    Ok(output)
}

fn human_duration(secs: f64) -> String {
    if !secs.is_finite() {
        return "-".into();
    }
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{secs:.1}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

impl SimOutput {
    /// The human summary, as text.
    pub fn human(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let s = &self.scenario;
        let _ = writeln!(
            o,
            "Arbiter simulator — {} ({} protocol): {} nodes, {} GPUs, {} tasks{}",
            s.name,
            s.protocol,
            s.nodes,
            s.gpus,
            s.tasks,
            if s.rejected > 0 {
                format!(", {} rejected up front", s.rejected)
            } else {
                String::new()
            }
        );
        for r in &s.rejected_examples {
            let _ = writeln!(o, "  rejected {}: {}", r.task, r.reason);
        }
        match s.protocol {
            Protocol::Replay | Protocol::Aryl => {
                for r in &self.runs {
                    let _ = writeln!(o);
                    let _ = writeln!(
                        o,
                        "policy {}  sha256:{}  ({})",
                        r.policy,
                        &r.digest[..12.min(r.digest.len())],
                        r.policy_source
                    );
                    let Some(m) = &r.replay else { continue };
                    let _ = writeln!(
                        o,
                        "  rounds           {:<10} round latency p50 {:.0} µs, p99 {:.0} µs",
                        r.rounds, r.round_latency_p50_us, r.round_latency_p99_us
                    );
                    let _ = writeln!(
                        o,
                        "  jobs completed   {}/{}{}{}",
                        m.jobs_completed,
                        r.tasks,
                        if m.jobs_running_at_end > 0 {
                            format!(", {} still running", m.jobs_running_at_end)
                        } else {
                            String::new()
                        },
                        if m.jobs_unplaced > 0 {
                            format!(", {} never placed", m.jobs_unplaced)
                        } else {
                            String::new()
                        }
                    );
                    let _ = writeln!(
                        o,
                        "  JCT              avg {}  p95 {}",
                        human_duration(m.avg_jct_s),
                        human_duration(m.p95_jct_s)
                    );
                    let _ = writeln!(
                        o,
                        "  queueing         avg {}  p95 {}  max {}",
                        human_duration(m.avg_queue_s),
                        human_duration(m.p95_queue_s),
                        human_duration(m.max_queue_s)
                    );
                    let _ = writeln!(o, "  makespan         {}", human_duration(m.makespan_s));
                    let _ = writeln!(
                        o,
                        "  GPU allocation   mean {:.1}%  peak {:.1}%  (peak queue {} jobs)",
                        m.mean_gpu_alloc_pct, m.peak_gpu_alloc_pct, m.peak_pending
                    );
                    let _ = writeln!(
                        o,
                        "  policy faults    {}  fallback rounds {}  preemptions {}",
                        r.policy_faults, r.fallback_rounds, m.preemptions
                    );
                    let _ = writeln!(
                        o,
                        "  wall time        {:.2}s ({:.2}s inside the policy)",
                        r.wall_seconds, r.policy_seconds
                    );
                }
            }
            Protocol::Fgd => {
                let _ = writeln!(o);
                let _ = writeln!(
                    o,
                    "{:<16} {:>5} {:>10} {:>10} {:>9} {:>10} {:>7} {:>7} {:>8}",
                    "policy",
                    "seed",
                    "alloc@100",
                    "alloc@130",
                    "unalloc",
                    "frag@80",
                    "failed",
                    "faults",
                    "wall"
                );
                for r in &self.runs {
                    let Some(m) = &r.fgd else { continue };
                    let _ = writeln!(
                        o,
                        "{:<16} {:>5} {:>9.2}% {:>9.2}% {:>9.1} {:>9.1}% {:>7} {:>7} {:>7.2}s",
                        r.policy,
                        r.seed,
                        m.gpu_alloc_pct_at_100,
                        m.gpu_alloc_pct_at_130,
                        m.unallocated_gpus_at_130,
                        m.frag_ratio_pct_at_80,
                        m.tasks_failed,
                        r.policy_faults,
                        r.wall_seconds
                    );
                }
                if self.runs.len() > self.fgd_summary.len() {
                    let _ = writeln!(o);
                    let _ = writeln!(o, "mean over seeds:");
                    for m in &self.fgd_summary {
                        let _ = writeln!(
                            o,
                            "{:<16} {:>5} {:>9.2}% {:>9.2}% {:>9.1} {:>9.1}%   (sd@130 {:.2})",
                            m.policy,
                            m.seeds,
                            m.gpu_alloc_pct_at_100,
                            m.gpu_alloc_pct_at_130,
                            m.unallocated_gpus_at_130,
                            m.frag_ratio_pct_at_80,
                            m.gpu_alloc_pct_at_130_sd
                        );
                    }
                }
                if let Some(r) = self.runs.first() {
                    let _ = writeln!(
                        o,
                        "round latency p50 {:.0} µs, p99 {:.0} µs ({})",
                        r.round_latency_p50_us, r.round_latency_p99_us, r.policy
                    );
                }
            }
        }
        if let Some(dir) = &self.report_dir {
            let _ = writeln!(o);
            let _ = writeln!(o, "report: {}", dir.join("index.html").display());
        }
        let _ = writeln!(o, "total {:.2}s", self.wall_seconds);
        o
    }

    /// Prints the human summary to stdout.
    pub fn print_human(&self) {
        print!("{}", self.human());
    }

    /// The JSON form (`--json`).
    pub fn to_json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Prints JSON or the human summary, as `--json` asks.
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", self.to_json()?);
        } else {
            self.print_human();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parallel_map;

    #[test]
    fn parallel_map_keeps_item_order() {
        let items: Vec<u64> = (0..100).collect();
        let out = parallel_map(&items, 3, |&x| Ok(x * x)).unwrap();
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_run_is_an_error_not_a_crash() {
        let items = [1, 2, 3];
        let err = parallel_map(&items, 2, |&x| {
            if x == 2 {
                panic!("run two broke");
            }
            Ok(x)
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("#1") && msg.contains("run two broke"), "{msg}");
    }
}
