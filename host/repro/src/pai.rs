//! "MLaaS in the Wild" (Weng et al., NSDI '22): the PAI cluster's machine
//! table (Table 1) and shortest-job-first on predicted durations (§5.2,
//! Fig. 13).
//!
//! The paper's SJF study runs on PAI's job table, which is no longer public.
//! We run its experiment on Philly run times (`philly_runtime.csv`) instead,
//! as single-GPU jobs arriving as a Poisson stream at a load where the
//! cluster is contended (FIFO's mean wait at least the mean run time), with
//! the prediction error of [`arbiter_sim::prediction`]: the paper's figures
//! compare only in direction and rough size, not to the percent. What we
//! choose (not given by the paper) is stated on [`SjfSetup`].

use anyhow::{Context, bail};
use arbiter_host::state::{JobRequest, NodeRequest};
use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::replay::{ReplayConfig, run_replay};
use arbiter_sim::prediction::Prediction;
use arbiter_sim::scenario::{Scenario, SimTask, Source};
use arbiter_sim::{RunOptions, engine};
use arbiter_traces::GpuModel;
use arbiter_traces::pai::PaiMachine;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use std::collections::BTreeMap;
use std::time::Duration;

/// The paper's Table 1 as the machine list gives it: machines and GPUs per
/// model, and host CPUs per GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineTable {
    pub machines: usize,
    pub gpus: u64,
    /// Per GPU model ("CPU" for machines without GPUs): (machines, GPUs).
    pub by_model: BTreeMap<String, (usize, u64)>,
    /// vCPUs per GPU on 8-GPU machines, on 2-GPU machines, and over the
    /// whole cluster (CPU-only machines' vCPUs included).
    pub vcpu_per_gpu_8: f64,
    pub vcpu_per_gpu_2: f64,
    pub vcpu_per_gpu_all: f64,
}

/// Table 1 from `pai_machine_spec.csv`.
pub fn machine_table(machines: &[PaiMachine]) -> MachineTable {
    let mut by_model: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let ratio = |filter: &dyn Fn(&PaiMachine) -> bool| {
        let (cpus, gpus) = machines
            .iter()
            .filter(|m| filter(m))
            .fold((0u64, 0u64), |(c, g), m| {
                (c + u64::from(m.cpu_cores), g + u64::from(m.gpu_count))
            });
        cpus as f64 / gpus.max(1) as f64
    };
    for m in machines {
        let name = m
            .gpu_model
            .map_or_else(|| "CPU".to_string(), |g: GpuModel| g.to_string());
        let e = by_model.entry(name).or_default();
        e.0 += 1;
        e.1 += u64::from(m.gpu_count);
    }
    MachineTable {
        machines: machines.len(),
        gpus: machines.iter().map(|m| u64::from(m.gpu_count)).sum(),
        by_model,
        vcpu_per_gpu_8: ratio(&|m| m.gpu_count == 8),
        vcpu_per_gpu_2: ratio(&|m| m.gpu_count == 2),
        vcpu_per_gpu_all: ratio(&|_| true),
    }
}

/// The SJF experiment's set-up. Everything here is our choice: the paper
/// runs PAI's own tasks on PAI's cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct SjfSetup {
    /// How many Philly run times become jobs: a seeded sample, with
    /// replacement, of the file's positive run times (the file is sorted,
    /// so its first rows are its shortest jobs).
    pub jobs: usize,
    /// Cluster size: 8-GPU nodes.
    pub nodes: u32,
    /// Offered load: arrival rate × mean run time / GPUs.
    pub load: f64,
    /// Seeds (arrivals and prediction errors); figures are their means.
    pub seeds: Vec<u64>,
}

impl Default for SjfSetup {
    fn default() -> Self {
        SjfSetup {
            jobs: 2_000,
            nodes: 4,
            load: 1.5,
            seeds: vec![42, 43, 44],
        }
    }
}

/// One scheduler (with one predictor) on the set-up, means over the seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct SjfRow {
    pub label: &'static str,
    pub avg_completion_s: f64,
    pub avg_wait_s: f64,
    /// Cut in average completion time against FIFO, percent.
    pub cut_pct: f64,
}

/// The experiment's result: FIFO, then SJF with an Oracle, the best
/// predictor and the noisier one; and the mean run time of the jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct SjfResult {
    pub mean_runtime_s: f64,
    pub rows: Vec<SjfRow>,
}

/// The published cut of average completion time by SJF over FIFO: 63–77 %
/// across the paper's four predictors (§5.2, Fig. 13).
pub const PUBLISHED_SJF_CUT_PCT: (f64, f64) = (63.0, 77.0);

/// The jobs of one seed: run times sampled from the file, arriving as a
/// Poisson stream at the set-up's load.
pub fn sjf_scenario(setup: &SjfSetup, runtimes_s: &[f64], seed: u64) -> anyhow::Result<Scenario> {
    let positive: Vec<u64> = runtimes_s
        .iter()
        .filter(|r| r.is_finite() && **r > 0.0)
        .map(|r| (r * 1000.0).round() as u64)
        .collect();
    if positive.is_empty() || setup.jobs == 0 {
        bail!("no positive run times to sample, or no jobs asked for");
    }
    if !(setup.load > 0.0 && setup.nodes > 0) {
        bail!("the load and the node count must be positive");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let runtimes: Vec<u64> = (0..setup.jobs)
        .map(|_| positive[rng.random_range(0..positive.len())])
        .collect();
    let gpus = f64::from(setup.nodes * 8);
    let mean_ms = runtimes.iter().sum::<u64>() as f64 / runtimes.len() as f64;
    let rate_per_ms = setup.load * gpus / mean_ms;
    let gaps = Exp::new(rate_per_ms).context("arrival rate")?;
    let mut t = 0.0f64;
    let tasks = runtimes
        .iter()
        .enumerate()
        .map(|(i, &duration)| {
            t += gaps.sample(&mut rng);
            let mut request = JobRequest::gpus(format!("philly-{i}"), "philly", 1, 1);
            request.cpu_milli = 0;
            request.memory_mib = 0;
            SimTask {
                request,
                arrival_ms: t.round() as u64,
                duration_ms: Some(duration),
                file_index: i,
            }
        })
        .collect();
    Ok(Scenario {
        name: format!("philly-sjf-{}x{}", setup.jobs, setup.nodes * 8),
        source: Source::Philly,
        nodes: (0..setup.nodes)
            .map(|n| NodeRequest::gpus(format!("node-{n}"), "training", "V100", 32_768, 8))
            .collect(),
        tasks,
        rejected: Vec::new(),
        unplaceable: Vec::new(),
    })
}

/// FIFO and SJF (Oracle, best, noisier predictor) on Philly run times.
pub fn sjf_experiment(setup: &SjfSetup, runtimes_s: &[f64]) -> anyhow::Result<SjfResult> {
    let engine = engine(Duration::from_secs(30))?;
    let compile = |name: &str| crate::builtin_run_policy(&engine, name, "");
    let (fifo, sjf) = (compile("fifo")?, compile("sjf")?);
    let runs: [(&'static str, &RunPolicy, Prediction); 4] = [
        ("FIFO", &fifo, Prediction::None),
        ("SJF, Oracle", &sjf, Prediction::Oracle),
        (
            "SJF, best predictor (78 % within 25 %)",
            &sjf,
            Prediction::Best,
        ),
        (
            "SJF, noisier predictor (50 % within 25 %)",
            &sjf,
            Prediction::GroupOnly,
        ),
    ];
    let mut sums = vec![(0.0, 0.0); runs.len()];
    let mut mean_runtime_s = 0.0;
    for &seed in &setup.seeds {
        let scenario = sjf_scenario(setup, runtimes_s, seed)?;
        mean_runtime_s = scenario
            .tasks
            .iter()
            .filter_map(|t| t.duration_ms)
            .sum::<u64>() as f64
            / scenario.tasks.len().max(1) as f64
            / 1000.0;
        for (k, (label, policy, prediction)) in runs.iter().enumerate() {
            let cfg = ReplayConfig {
                prediction: *prediction,
                ..ReplayConfig::default()
            };
            let opts = RunOptions {
                seed,
                keep_records: false,
                ..RunOptions::default()
            };
            let out = run_replay(&scenario, policy, "philly_runtime.csv", &cfg, &opts)
                .with_context(|| format!("{label}, seed {seed}"))?;
            let m = out.replay.context("a replay reports replay metrics")?;
            if m.jobs_completed != scenario.tasks.len() {
                bail!(
                    "{label}, seed {seed}: {} of {} jobs completed",
                    m.jobs_completed,
                    scenario.tasks.len()
                );
            }
            sums[k].0 += m.avg_jct_s;
            sums[k].1 += m.avg_queue_s;
        }
    }
    let n = setup.seeds.len().max(1) as f64;
    let fifo_completion = sums[0].0 / n;
    let rows = runs
        .iter()
        .zip(&sums)
        .map(|((label, _, _), (jct, wait))| SjfRow {
            label,
            avg_completion_s: jct / n,
            avg_wait_s: wait / n,
            cut_pct: 100.0 * (1.0 - (jct / n) / fifo_completion),
        })
        .collect();
    Ok(SjfResult {
        mean_runtime_s,
        rows,
    })
}
