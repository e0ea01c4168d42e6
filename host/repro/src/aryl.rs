//! The Aryl paper's comparison (Li et al., EuroSys '23, Table 5 and Fig. 8)
//! on the Philly trace: the published constants, the scales, the eight runs
//! of [`comparison_cases`], the headline against the paper, and the
//! exhaustive-optimum probe (§7.3). The model itself is
//! [`arbiter_sim::models::aryl`].

use anyhow::{Context, bail};
use arbiter_host::runtime::CompiledPolicy;
use arbiter_policy_sdk::Cluster;
use arbiter_policy_sdk::model::ReclaimRequest;
use arbiter_sim::Protocol;
use arbiter_sim::core::{RunPolicy, SpeedupLaw};
pub use arbiter_sim::models::aryl::*;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// Largest reclaim instance (server subsets) compared with the exhaustive optimum.
pub const OPTIMUM_MAX_SUBSETS: u64 = 20_000;

/// Algorithm 1 (`greedy_select`) against the exhaustive optimum on the same
/// instance, computed natively with `aryl-core`, when the instance has at
/// most [`OPTIMUM_MAX_SUBSETS`] server subsets.
pub struct OptimumProbe;

impl ReclaimProbe for OptimumProbe {
    fn judge(&self, cluster: &Cluster, request: &ReclaimRequest) -> Option<(u64, u64)> {
        let (problem, _) = aryl_core::policy::reclaim_problem(cluster, request).ok()?;
        let count = request.count as usize;
        let best = aryl_core::reclaim::optimal_select(&problem, count, OPTIMUM_MAX_SUBSETS)?;
        let greedy = aryl_core::reclaim::greedy_select(&problem, count);
        Some((
            aryl_core::reclaim::preemptions(&problem, &greedy) as u64,
            aryl_core::reclaim::preemptions(&problem, &best) as u64,
        ))
    }
}

/// The configuration the Aryl family gets in a run: the seed (their Random
/// baseline's draws), the speed-up law the model uses (so Algorithm 2
/// plans with the law the cluster follows), then `extra` lines (e.g.
/// `slow_spill = "always"`). Other policies get their default (`None`).
pub fn aryl_policy_config(name: &str, cfg: &ArylSimConfig, extra: &str) -> Option<String> {
    if !name.starts_with("aryl") {
        return None;
    }
    let mut text = format!("random_seed = {}\n", cfg.seed & (i64::MAX as u64));
    if let SpeedupLaw::SubLinear { loss_per_step } = cfg.speedup {
        text.push_str(&format!(
            "speedup = \"sub-linear\"\nsublinear_loss = {loss_per_step}\n"
        ));
    }
    text.push_str(extra);
    Some(text)
}

/// `compiled` with the configuration [`aryl_policy_config`] gives it.
pub fn configured(compiled: &CompiledPolicy, cfg: &ArylSimConfig, extra: &str) -> RunPolicy {
    RunPolicy {
        config: aryl_policy_config(&compiled.manifest.name, cfg, extra),
        compiled: compiled.clone(),
    }
}

/// One comparison case: `compiled` (configured for `cfg`) with `shadows`
/// asked the same reclaim questions, judged by the [`OptimumProbe`].
pub fn case(
    label: &str,
    compiled: &CompiledPolicy,
    cfg: &ArylSimConfig,
    extra: &str,
    shadows: &[CompiledPolicy],
) -> ArylCase {
    ArylCase {
        label: label.to_string(),
        policy: configured(compiled, cfg, extra),
        config: cfg.clone(),
        shadows: shadows.iter().map(|s| configured(s, cfg, extra)).collect(),
        probe: Some(Arc::new(OptimumProbe)),
    }
}

/// Runs one policy of the Aryl family (or any other) on the model, as the
/// comparison does: configured by [`aryl_policy_config`], judged by the
/// [`OptimumProbe`].
pub fn run_policy(
    workload: &ArylWorkload,
    demand: &InferenceDemand,
    compiled: &CompiledPolicy,
    cfg: &ArylSimConfig,
    shadows: &[CompiledPolicy],
) -> anyhow::Result<ArylMetrics> {
    let c = case(&compiled.manifest.name, compiled, cfg, "", shadows);
    run_aryl(
        workload,
        demand,
        &c.policy,
        cfg,
        &c.shadows,
        Some(&OptimumProbe),
    )
}

/// Named sizes of the Philly comparison (docs/reproductions/aryl.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleName {
    /// 4 days from 2017-10-16, every 2nd job, 20 + 23 servers (saturated baseline).
    Ci,
    /// 14 days from 2017-10-09, every job, 56 + 64 servers (saturated baseline).
    Full,
    /// 14 days from 2017-10-09, every job, 72 + 83 servers (the FIFO
    /// baseline at the paper's load: its average queueing closest to Table
    /// 5's 3,072 s over the training pool sizes searched)
    // The search: `PAPER_LOAD_SEARCH`, test `paper_load_search`.
    Paper,
}

impl std::fmt::Display for ScaleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScaleName::Ci => "ci",
            ScaleName::Full => "full",
            ScaleName::Paper => "paper",
        })
    }
}

impl std::str::FromStr for ScaleName {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "ci" => Ok(ScaleName::Ci),
            "full" => Ok(ScaleName::Full),
            "paper" => Ok(ScaleName::Paper),
            other => bail!("unknown Aryl scale `{other}` (ci, full or paper)"),
        }
    }
}

/// Training pool sizes searched for the `paper` scale (FIFO baseline only,
/// `full` window, inference pool from [`inference_nodes_for`]).
pub const PAPER_LOAD_SEARCH: [u32; 7] = [56, 64, 72, 80, 88, 96, 104];
/// Table 5 row 1: the paper's FIFO baseline averages this much queueing.
pub const PAPER_BASELINE_AVG_QUEUE_S: f64 = 3072.0;

/// Inference servers for `training` training servers: the 8 : 7 ratio of the
/// `ci` (23 : 20) and `full` (64 : 56) scales; the paper has 4,160 : 3,544.
pub fn inference_nodes_for(training: u32) -> u32 {
    (8 * training).div_ceil(7)
}

/// A trace window and a cluster size.
#[derive(Clone, Debug, Serialize)]
pub struct ArylScale {
    pub name: ScaleName,
    /// First submission day, `YYYY-MM-DD`.
    pub start: String,
    pub days: i64,
    pub sample_every: usize,
    pub training_nodes: u32,
    pub inference_nodes: u32,
}

impl ArylScale {
    pub fn named(name: ScaleName) -> Self {
        let (start, days, sample_every, training_nodes) = match name {
            ScaleName::Ci => ("2017-10-16", 4, 2, 20),
            ScaleName::Full => ("2017-10-09", 14, 1, 56),
            ScaleName::Paper => ("2017-10-09", 14, 1, 72),
        };
        ArylScale {
            name,
            start: start.to_string(),
            days,
            sample_every,
            training_nodes,
            inference_nodes: inference_nodes_for(training_nodes),
        }
    }

    /// The workload spec of this window (5% elastic, half checkpointed,
    /// jobs up to 64 GPUs).
    pub fn spec(&self, seed: u64) -> anyhow::Result<WorkloadSpec> {
        Ok(WorkloadSpec {
            start: date_seconds(&self.start)?,
            span_s: self.days.saturating_mul(86_400),
            sample_every: self.sample_every,
            elastic_fraction: 0.05,
            checkpointed_fraction: 0.5,
            max_gpus: 64,
            max_duration_s: 0.0,
            seed,
        })
    }
}

/// Labels of the comparison's runs (see [`comparison_cases`]).
pub mod labels {
    pub const BASELINE: &str = "baseline (fifo)";
    pub const ARYL: &str = "aryl";
    pub const SCHED_ONLY: &str = "aryl sched-only";
    pub const RANDOM: &str = "random-reclaim";
    pub const SCF: &str = "scf-reclaim";
    pub const LOAN_ONLY: &str = "aryl loan-only";
    pub const RANDOM_LOAN_ONLY: &str = "random loan-only";
    pub const SCF_LOAN_ONLY: &str = "scf loan-only";
}

/// The four components of the comparison.
#[derive(Clone)]
pub struct ComparisonPolicies {
    pub fifo: CompiledPolicy,
    pub aryl: CompiledPolicy,
    pub random: CompiledPolicy,
    pub scf: CompiledPolicy,
}

impl ComparisonPolicies {
    /// Compiles the built-in `fifo`, `aryl`, `aryl-random-reclaim` and `aryl-scf-reclaim`.
    pub fn builtin(engine: &arbiter_host::runtime::PolicyEngine) -> anyhow::Result<Self> {
        let compile = |name: &str| crate::compile_builtin(engine, name);
        Ok(ComparisonPolicies {
            fifo: compile("fifo")?,
            aryl: compile("aryl")?,
            random: compile("aryl-random-reclaim")?,
            scf: compile("aryl-scf-reclaim")?,
        })
    }
}

/// The eight runs of the comparison (Table 5 rows 1, 2, 5–7, 11 and Fig. 8):
/// the FIFO baseline, Aryl, Aryl's scheduler alone, Aryl's scheduler with
/// the Random and SCF reclaim rules, and the same three without elastic
/// scaling. The `aryl` and `aryl loan-only` runs ask Random and SCF the same
/// reclaim questions (paired).
///
/// `extra`: configuration lines for the Aryl family after the ones the run
/// sets (see [`aryl_policy_config`]).
pub fn comparison_cases(
    p: &ComparisonPolicies,
    base: &ArylSimConfig,
    extra: &str,
) -> Vec<ArylCase> {
    let no_elastic = ArylSimConfig {
        elastic: false,
        ..base.clone()
    };
    let paired = [p.random.clone(), p.scf.clone()];
    let case =
        |label: &str, compiled: &CompiledPolicy, config: &ArylSimConfig, with_shadows: bool| {
            case(
                label,
                compiled,
                config,
                extra,
                if with_shadows { &paired } else { &[] },
            )
        };
    vec![
        case(labels::BASELINE, &p.fifo, &base.baseline(), false),
        case(labels::ARYL, &p.aryl, base, true),
        case(labels::SCHED_ONLY, &p.aryl, &base.baseline(), false),
        case(labels::RANDOM, &p.random, base, false),
        case(labels::SCF, &p.scf, base, false),
        case(labels::LOAN_ONLY, &p.aryl, &no_elastic, true),
        case(labels::RANDOM_LOAN_ONLY, &p.random, &no_elastic, false),
        case(labels::SCF_LOAN_ONLY, &p.scf, &no_elastic, false),
    ]
}

/// Jobs each rule's plans would preempt over the same reclaims.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PairedCounts {
    pub reclaims: u64,
    pub aryl: u64,
    pub scf: u64,
    pub random: u64,
}

/// The comparison's headline figures, against Table 5 and Fig. 8.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ArylHeadline {
    /// Baseline / Aryl (paper: 1.53).
    pub avg_queue_ratio: f64,
    /// Baseline / Aryl (paper: 2.49).
    pub p95_queue_ratio: f64,
    /// Baseline / Aryl (paper: 1.50).
    pub avg_jct_ratio: f64,
    /// Baseline / Aryl (paper: 1.47).
    pub p95_jct_ratio: f64,
    pub baseline_avg_queue_s: f64,
    pub baseline_training_usage_pct: f64,
    pub baseline_combined_usage_pct: f64,
    pub aryl_combined_usage_pct: f64,
    /// Relative growth of combined usage, percent (paper: +26.9).
    pub combined_usage_gain_pct: f64,
    /// Aryl's preemption ratio, percent (paper: 10.2).
    pub preemption_ratio_pct: f64,
    /// Loaning only (paper: 12.3).
    pub loan_only_preemption_ratio_pct: f64,
    /// Paired reclaims with elastic scaling.
    pub paired: PairedCounts,
    /// Paired reclaims without elastic scaling (paper: SCF 1.5×, Random 1.67× Aryl's).
    pub paired_loan_only: PairedCounts,
}

fn find_run<'a>(runs: &'a [ArylMetrics], label: &str) -> anyhow::Result<&'a ArylMetrics> {
    runs.iter()
        .find(|r| r.policy == label)
        .with_context(|| format!("no run labelled `{label}`"))
}

fn paired_counts(run: &ArylMetrics) -> anyhow::Result<PairedCounts> {
    let get = |name: &str| -> anyhow::Result<u64> {
        run.paired
            .iter()
            .find(|p| p.policy == name)
            .map(|p| p.preempted)
            .with_context(|| format!("run `{}` has no paired rule `{name}`", run.policy))
    };
    Ok(PairedCounts {
        reclaims: run.reclaims,
        aryl: get("aryl")?,
        scf: get("aryl-scf-reclaim")?,
        random: get("aryl-random-reclaim")?,
    })
}

/// Headline figures of a [`comparison_cases`] run.
pub fn headline(runs: &[ArylMetrics]) -> anyhow::Result<ArylHeadline> {
    let baseline = find_run(runs, labels::BASELINE)?;
    let aryl = find_run(runs, labels::ARYL)?;
    let loan_only = find_run(runs, labels::LOAN_ONLY)?;
    let ratio = |b: f64, a: f64| b / a.max(1.0);
    Ok(ArylHeadline {
        avg_queue_ratio: ratio(baseline.avg_queue_s, aryl.avg_queue_s),
        p95_queue_ratio: ratio(baseline.p95_queue_s, aryl.p95_queue_s),
        avg_jct_ratio: ratio(baseline.avg_jct_s, aryl.avg_jct_s),
        p95_jct_ratio: ratio(baseline.p95_jct_s, aryl.p95_jct_s),
        baseline_avg_queue_s: baseline.avg_queue_s,
        baseline_training_usage_pct: baseline.training_usage_pct,
        baseline_combined_usage_pct: baseline.combined_usage_pct,
        aryl_combined_usage_pct: aryl.combined_usage_pct,
        combined_usage_gain_pct: 100.0
            * (aryl.combined_usage_pct / baseline.combined_usage_pct.max(1e-9) - 1.0),
        preemption_ratio_pct: aryl.preemption_ratio_pct,
        loan_only_preemption_ratio_pct: loan_only.preemption_ratio_pct,
        paired: paired_counts(aryl)?,
        paired_loan_only: paired_counts(loan_only)?,
    })
}

impl ArylHeadline {
    /// The headline against the paper, one line per figure.
    pub fn against_paper(&self) -> String {
        use std::fmt::Write as _;
        let x = |a: u64, b: u64| a as f64 / b.max(1) as f64;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "baseline: avg queueing {:.0}s (paper 3,072s), training usage {:.1}% (paper 72%)",
            self.baseline_avg_queue_s, self.baseline_training_usage_pct
        );
        let _ = writeln!(
            o,
            "baseline/aryl: avg queueing {:.2}x (paper 1.53x), p95 queueing {:.2}x (paper 2.49x), \
             avg JCT {:.2}x (paper 1.50x), p95 JCT {:.2}x (paper 1.47x)",
            self.avg_queue_ratio, self.p95_queue_ratio, self.avg_jct_ratio, self.p95_jct_ratio
        );
        let _ = writeln!(
            o,
            "combined usage {:.1}% -> {:.1}% ({:+.1}%, paper 52% -> 66%, +26.9%); \
             preemption ratio {:.2}% (paper 10.2%), loaning only {:.2}% (paper 12.3%)",
            self.baseline_combined_usage_pct,
            self.aryl_combined_usage_pct,
            self.combined_usage_gain_pct,
            self.preemption_ratio_pct,
            self.loan_only_preemption_ratio_pct
        );
        for (what, c) in [
            ("with scaling", self.paired),
            ("loaning only", self.paired_loan_only),
        ] {
            let _ = writeln!(
                o,
                "paired reclaim {what} ({} reclaims): aryl {}, SCF {} ({:.2}x), Random {} ({:.2}x) \
                 (paper without scaling: 1.5x, 1.67x)",
                c.reclaims,
                c.aryl,
                c.scf,
                x(c.scf, c.aryl),
                c.random,
                x(c.random, c.aryl)
            );
        }
        o
    }
}

/// What `arbiter sim --protocol aryl` produced.
#[derive(Clone, Debug, Serialize)]
pub struct ArylReport {
    pub protocol: Protocol,
    pub scale: ArylScale,
    pub seed: u64,
    pub jobs: usize,
    pub elastic_jobs: usize,
    pub checkpointed_jobs: usize,
    /// Jobs of the window dropped for needing more than 64 GPUs.
    pub dropped_jobs: usize,
    pub gpu_hours: f64,
    /// Mean of the inference demand curve (share of the inference pool).
    pub mean_inference_utilization: f64,
    pub headline: ArylHeadline,
    /// One per run of [`comparison_cases`], in that order.
    pub runs: Vec<ArylMetrics>,
    /// Whole command, loading included.
    pub wall_seconds: f64,
}

impl ArylReport {
    /// The human summary: the workload, the table of runs and the headline.
    pub fn human(&self) -> String {
        let s = &self.scale;
        let mut o = format!(
            "Aryl comparison, scale `{}`: {} + {} d, 1 in {} jobs: {} jobs ({} elastic, {} checkpointed, \
             {} dropped > 64 GPUs, {:.0} GPU-h); {} training + {} inference servers; \
             mean inference utilization {:.2}; seed {}; {:.1}s\n\n",
            s.name,
            s.start,
            s.days,
            s.sample_every,
            self.jobs,
            self.elastic_jobs,
            self.checkpointed_jobs,
            self.dropped_jobs,
            self.gpu_hours,
            s.training_nodes,
            s.inference_nodes,
            self.mean_inference_utilization,
            self.seed,
            self.wall_seconds
        );
        o.push_str(&table(&self.runs));
        o.push('\n');
        o.push_str(&self.headline.against_paper());
        o
    }

    /// Prints the JSON object (`--json`) or the human summary.
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(self).context("serialising the Aryl report")?
            );
        } else {
            print!("{}", self.human());
        }
        Ok(())
    }
}

/// The most servers in either pool of an Aryl run (the `paper` scale has 72 + 83; ten
/// times PAI's cluster is 18,970).
pub const MAX_POOL_NODES: u32 = 100_000;

/// `arbiter sim --protocol aryl`: the eight runs of [`comparison_cases`] on
/// the Philly trace (`--trace`, else the shared traces folder's job table)
/// with the GenAI LoRA demand curve, at `--scale` (default `ci`) with the
/// `--days`, `--sample-every`, `--training-nodes` and `--inference-nodes`
/// overrides (`--training-nodes` alone also sets the inference pool by
/// [`inference_nodes_for`]). `--seed` draws the checkpointed jobs and seeds
/// the policies.
pub fn run_protocol(args: &crate::SimArgs) -> anyhow::Result<ArylReport> {
    let started = Instant::now();
    if args.nodes.is_some() {
        bail!("the aryl protocol builds its own cluster; --nodes does not apply");
    }
    let mut scale = ArylScale::named(args.scale.unwrap_or(ScaleName::Ci));
    if let Some(days) = args.days {
        if days <= 0 {
            bail!("--days must be positive, got {days}");
        }
        scale.days = days;
    }
    if let Some(k) = args.sample_every {
        if k == 0 {
            bail!("--sample-every must be at least 1");
        }
        scale.sample_every = k;
    }
    if let Some(n) = args.training_nodes {
        scale.training_nodes = n;
        scale.inference_nodes = inference_nodes_for(n);
    }
    if let Some(n) = args.inference_nodes {
        scale.inference_nodes = n;
    }
    // Both pools exist (the comparison is about lending inference servers to training) and
    // stay within what one machine simulates eight times over.
    for (flag, n) in [
        ("--training-nodes", scale.training_nodes),
        ("--inference-nodes", scale.inference_nodes),
    ] {
        if !(1..=MAX_POOL_NODES).contains(&n) {
            bail!("{flag} must be 1 to {MAX_POOL_NODES}, got {n}");
        }
    }
    let jobs_file = match &args.trace {
        Some(path) => path.clone(),
        None => arbiter_traces::trace_file(arbiter_traces::philly::JOBS_FILE)
            .context("the aryl protocol needs the Philly job table (--trace)")?,
    };
    let lora_file = arbiter_traces::trace_file(arbiter_traces::genai::LORA_REQUESTS_FILE)
        .context("the aryl protocol needs the GenAI LoRA request trace")?;
    let trace = arbiter_traces::philly::load_jobs(&jobs_file)
        .with_context(|| format!("loading the Philly trace `{}`", jobs_file.display()))?;
    let requests = arbiter_traces::genai::load_lora_requests(&lora_file)
        .with_context(|| format!("loading the LoRA trace `{}`", lora_file.display()))?;
    let demand = InferenceDemand::from_lora(&requests, 1800, 0.9)
        .context("building the inference demand curve")?;
    let workload = philly_workload(&trace, &scale.spec(args.seed)?, 8)
        .context("cutting the Philly workload")?;
    if workload.jobs.is_empty() {
        bail!(
            "no job of the Philly trace falls in {} + {} days",
            scale.start,
            scale.days
        );
    }
    let engine = arbiter_sim::engine(std::time::Duration::from_millis(args.deadline_ms.max(1)))?;
    let policies = ComparisonPolicies::builtin(&engine)?;
    let base = ArylSimConfig {
        training_nodes: scale.training_nodes,
        inference_nodes: scale.inference_nodes,
        seed: args.seed,
        ..ArylSimConfig::default()
    };
    // `--config` reaches the Aryl family (e.g. `slow_spill = "always"`).
    let extra = args
        .config
        .as_deref()
        .map(crate::config_text)
        .transpose()?
        .unwrap_or_default();
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_cases(
        &workload,
        &demand,
        &comparison_cases(&policies, &base, &extra),
        threads,
    )?;
    let headline = headline(&runs)?;
    Ok(ArylReport {
        protocol: Protocol::Aryl,
        seed: args.seed,
        jobs: workload.jobs.len(),
        elastic_jobs: workload.elastic,
        checkpointed_jobs: workload.checkpointed,
        dropped_jobs: workload.dropped_too_large,
        gpu_hours: workload.gpu_hours,
        mean_inference_utilization: demand.mean(),
        scale,
        headline,
        runs,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

/// A table of runs, one line each (for tests and the reproduction doc).
pub fn table(runs: &[ArylMetrics]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<22} {:>8} {:>7} {:>8} {:>8} {:>7} {:>8} {:>6} {:>6} {:>6} {:>6} {:>7} {:>6} {:>6} {:>5}",
        "run",
        "avgQ(s)",
        "p50Q",
        "p95Q",
        "avgJCT",
        "p50JCT",
        "p95JCT",
        "train%",
        "comb%",
        "loan%",
        "preem",
        "ratio%",
        "pr/run",
        "coll%",
        "unfin"
    );
    for r in runs {
        let _ = writeln!(
            o,
            "{:<22} {:>8.0} {:>7.0} {:>8.0} {:>8.0} {:>7.0} {:>8.0} {:>6.1} {:>6.1} {:>6.1} {:>6} {:>7.2} {:>6.2} {:>6.1} {:>5}",
            r.policy,
            r.avg_queue_s,
            r.p50_queue_s,
            r.p95_queue_s,
            r.avg_jct_s,
            r.p50_jct_s,
            r.p95_jct_s,
            r.training_usage_pct,
            r.combined_usage_pct,
            r.loaned_usage_pct,
            r.preemptions,
            r.preemption_ratio_pct,
            r.preempted_of_running_pct,
            r.collateral_damage_pct,
            r.unfinished
        );
    }
    o
}
