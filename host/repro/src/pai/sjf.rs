//! Shortest-job-first on predicted durations ("MLaaS in the Wild" §5.2,
//! Fig. 13).
//!
//! The paper's SJF study runs on PAI's job table, which is no longer public.
//! We run its experiment on Philly run times (`philly_runtime.csv`) instead,
//! as single-GPU jobs arriving as a Poisson stream at a load where the
//! cluster is contended (FIFO's mean wait at least the mean run time), with
//! the prediction error of [`arbiter_sim::prediction`]: the paper's figures
//! compare only in direction and rough size, not to the percent. What we
//! choose (not given by the paper) is stated on [`SjfSetup`].
//!
//! A learned predictor runs too ([`learned_experiment`]): the paper's CART
//! ([`super::cart`]) on the features Philly's job table has — the virtual
//! cluster (our stand-in for the paper's Group and User) and the GPUs asked
//! for (Resource) — trained on the jobs submitted before December 2017 and
//! applied to December's.

use anyhow::{Context, bail};
use arbiter_host::state::{JobRequest, NodeRequest};
use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::replay::{ReplayConfig, run_replay};
use arbiter_sim::prediction::Prediction;
use arbiter_sim::scenario::{Scenario, SimTask, Source};
use arbiter_sim::{RunOptions, engine};
use arbiter_traces::philly::{PhillyJob, PhillyTrace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use std::collections::BTreeMap;
use std::time::Duration;

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

/// The experiment's result: FIFO first, then SJF with each predictor; and
/// the mean run time of the jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct SjfResult {
    pub mean_runtime_s: f64,
    pub rows: Vec<SjfRow>,
}

/// The published cut of average completion time by SJF over FIFO: 63–77 %
/// across the paper's four predictors (§5.2, Fig. 13).
pub const PUBLISHED_SJF_CUT_PCT: (f64, f64) = (63.0, 77.0);

/// Poisson arrivals at `load` for jobs of these GPU counts and run times on
/// `nodes` 8-GPU nodes, each job one worker; `tenant` and `estimate` name
/// a job's virtual cluster and its learned prediction (ms, 0 = none).
fn poisson_scenario(
    name: String,
    nodes: u32,
    load: f64,
    jobs: &[(u32, u64)],
    labels: impl Fn(usize) -> (String, u64),
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<Scenario> {
    if !(load > 0.0 && nodes > 0) || jobs.is_empty() {
        bail!("the load, the node count and the jobs must be positive");
    }
    let gpus = f64::from(nodes * 8);
    let mean_gpu_ms = jobs
        .iter()
        .map(|&(g, ms)| f64::from(g) * ms as f64)
        .sum::<f64>()
        / jobs.len() as f64;
    let gaps = Exp::new(load * gpus / mean_gpu_ms).context("arrival rate")?;
    let mut t = 0.0f64;
    let tasks = jobs
        .iter()
        .enumerate()
        .map(|(i, &(g, duration))| {
            t += gaps.sample(rng);
            let (tenant, estimate_ms) = labels(i);
            let mut request = JobRequest::gpus(format!("philly-{i}"), tenant, 1, g);
            request.cpu_milli = 0;
            request.memory_mib = 0;
            request.estimate_ms = estimate_ms;
            SimTask {
                request,
                arrival_ms: t.round() as u64,
                duration_ms: Some(duration),
                file_index: i,
            }
        })
        .collect();
    Ok(Scenario {
        name,
        source: Source::Philly,
        nodes: (0..nodes)
            .map(|n| NodeRequest::gpus(format!("node-{n}"), "training", "V100", 32_768, 8))
            .collect(),
        tasks,
        rejected: Vec::new(),
        unplaceable: Vec::new(),
    })
}

/// The jobs of one seed: run times sampled from the file, one GPU each,
/// arriving as a Poisson stream at the set-up's load.
pub fn sjf_scenario(setup: &SjfSetup, runtimes_s: &[f64], seed: u64) -> anyhow::Result<Scenario> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let runtimes = super::sample_runtimes_ms(runtimes_s, setup.jobs, &mut rng)?;
    let jobs: Vec<(u32, u64)> = runtimes.into_iter().map(|ms| (1, ms)).collect();
    poisson_scenario(
        format!("philly-sjf-{}x{}", setup.jobs, setup.nodes * 8),
        setup.nodes,
        setup.load,
        &jobs,
        |_| ("philly".into(), 0),
        &mut rng,
    )
}

/// One scheduler with one predictor.
struct Arm<'a> {
    label: &'static str,
    policy: &'a RunPolicy,
    /// What fills `estimate-ms`; `None` keeps the scenario's own estimates
    /// (the learned predictions, or none).
    prediction: Prediction,
    /// Which of a seed's scenarios the arm runs (they differ only in the
    /// estimates on the tasks).
    variant: usize,
}

/// Runs every arm on every seed's scenarios; FIFO must be the first arm.
fn compare(seeds: &[(u64, Vec<Scenario>)], arms: &[Arm<'_>]) -> anyhow::Result<SjfResult> {
    let mut sums = vec![(0.0, 0.0); arms.len()];
    let mut mean_runtime_s = 0.0;
    for (seed, variants) in seeds {
        let first = variants.first().context("a seed without a scenario")?;
        mean_runtime_s += first
            .tasks
            .iter()
            .filter_map(|t| t.duration_ms)
            .sum::<u64>() as f64
            / first.tasks.len().max(1) as f64
            / 1000.0;
        for (k, arm) in arms.iter().enumerate() {
            let scenario = variants
                .get(arm.variant)
                .with_context(|| format!("{}: no scenario variant {}", arm.label, arm.variant))?;
            let cfg = ReplayConfig {
                prediction: arm.prediction,
                ..ReplayConfig::default()
            };
            let opts = RunOptions {
                seed: *seed,
                keep_records: false,
                ..RunOptions::default()
            };
            let out = run_replay(scenario, arm.policy, "philly", &cfg, &opts)
                .with_context(|| format!("{}, seed {seed}", arm.label))?;
            let m = out.replay.context("a replay reports replay metrics")?;
            if m.jobs_completed != scenario.tasks.len() {
                bail!(
                    "{}, seed {seed}: {} of {} jobs completed",
                    arm.label,
                    m.jobs_completed,
                    scenario.tasks.len()
                );
            }
            sums[k].0 += m.avg_jct_s;
            sums[k].1 += m.avg_queue_s;
        }
    }
    let n = seeds.len().max(1) as f64;
    let fifo_completion = sums.first().map_or(0.0, |s| s.0 / n);
    let rows = arms
        .iter()
        .zip(&sums)
        .map(|(arm, (jct, wait))| SjfRow {
            label: arm.label,
            avg_completion_s: jct / n,
            avg_wait_s: wait / n,
            cut_pct: 100.0 * (1.0 - (jct / n) / fifo_completion),
        })
        .collect();
    Ok(SjfResult {
        mean_runtime_s: mean_runtime_s / n,
        rows,
    })
}

/// The built-in `fifo` and `sjf`, compiled.
fn fifo_and_sjf() -> anyhow::Result<(RunPolicy, RunPolicy)> {
    let engine = engine(Duration::from_secs(30))?;
    let compile = |name: &str| crate::builtin_run_policy(&engine, name, "");
    Ok((compile("fifo")?, compile("sjf")?))
}

/// FIFO, then SJF on the Oracle, the best and the noisier synthetic
/// predictor, all on scenario variant 0 (the one without learned estimates).
fn synthetic_arms<'a>(fifo: &'a RunPolicy, sjf: &'a RunPolicy) -> Vec<Arm<'a>> {
    let arm = |label, policy, prediction| Arm {
        label,
        policy,
        prediction,
        variant: 0,
    };
    vec![
        arm("FIFO", fifo, Prediction::None),
        arm("SJF, Oracle", sjf, Prediction::Oracle),
        arm(
            "SJF, best predictor (78 % within 25 %)",
            sjf,
            Prediction::Best,
        ),
        arm(
            "SJF, noisier predictor (50 % within 25 %)",
            sjf,
            Prediction::GroupOnly,
        ),
    ]
}

/// FIFO and SJF (Oracle, best, noisier predictor) on Philly run times.
pub fn sjf_experiment(setup: &SjfSetup, runtimes_s: &[f64]) -> anyhow::Result<SjfResult> {
    let (fifo, sjf) = fifo_and_sjf()?;
    let seeds = setup
        .seeds
        .iter()
        .map(|&seed| Ok((seed, vec![sjf_scenario(setup, runtimes_s, seed)?])))
        .collect::<anyhow::Result<Vec<_>>>()?;
    compare(&seeds, &synthetic_arms(&fifo, &sjf))
}

/// Submissions before this instant (2017-12-01 00:00:00 on the trace's
/// clock, seconds) train the learned predictor; December's jobs are the
/// ones it predicts. Philly's table runs from September to December 2017.
pub const LEARNED_SPLIT_TIME: i64 = 1_512_086_400;

/// The learned predictor's settings: the paper's CART (§5.2) — at most 10
/// splits, MAE — and ours: leaves of at least `min_leaf` jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedSetup {
    pub max_splits: usize,
    pub min_leaf: usize,
    /// Largest job taken into the SJF runs (GPUs; one worker on an 8-GPU
    /// node). Larger jobs still train the tree.
    pub max_gpus: u32,
}

impl Default for LearnedSetup {
    fn default() -> Self {
        LearnedSetup {
            max_splits: 10,
            min_leaf: 50,
            max_gpus: 8,
        }
    }
}

/// A job's features: its cluster's rank (a cluster unseen in training
/// ranks past every known one) and, if asked, its GPUs.
fn features(cluster_rank: &BTreeMap<u16, f64>, use_gpus: bool, job: &PhillyJob) -> Vec<f64> {
    let rank = cluster_rank
        .get(&job.cluster)
        .copied()
        .unwrap_or(cluster_rank.len() as f64);
    if use_gpus {
        vec![rank, f64::from(job.num_gpus)]
    } else {
        vec![rank]
    }
}

/// A CART duration predictor for Philly jobs.
pub struct LearnedPredictor {
    tree: super::cart::RegressionTree,
    /// Virtual cluster → its rank by median training run time.
    cluster_rank: BTreeMap<u16, f64>,
    use_gpus: bool,
}

impl LearnedPredictor {
    /// Trains on `jobs`: on the virtual cluster and, if `use_gpus`, the GPU
    /// count (the paper's Group-only vs Group + Resource predictors).
    pub fn train(
        jobs: &[&PhillyJob],
        use_gpus: bool,
        setup: &LearnedSetup,
    ) -> anyhow::Result<Self> {
        let y: Vec<f64> = jobs.iter().map(|j| j.duration_secs).collect();
        let clusters: Vec<u16> = jobs.iter().map(|j| j.cluster).collect();
        let cluster_rank = super::cart::rank_by_median(&clusters, &y);
        let x: Vec<Vec<f64>> = jobs
            .iter()
            .map(|j| features(&cluster_rank, use_gpus, j))
            .collect();
        Ok(LearnedPredictor {
            tree: super::cart::RegressionTree::fit(&x, &y, setup.max_splits, setup.min_leaf)?,
            cluster_rank,
            use_gpus,
        })
    }

    /// Predicted run time, seconds.
    pub fn predict(&self, job: &PhillyJob) -> f64 {
        self.tree
            .predict(&features(&self.cluster_rank, self.use_gpus, job))
    }

    pub fn splits(&self) -> usize {
        self.tree.splits()
    }
}

/// How well a predictor does on the jobs it predicts.
#[derive(Clone, Debug, PartialEq)]
pub struct Accuracy {
    pub label: &'static str,
    pub splits: usize,
    /// Predictions within 25 % of the truth, percent (the paper's best: 78).
    pub within_25_pct: f64,
}

/// The learned experiment's result.
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedResult {
    pub train_jobs: usize,
    pub test_jobs: usize,
    pub accuracy: Vec<Accuracy>,
    pub sjf: SjfResult,
}

/// CART trained on Philly's jobs before December 2017 and applied to
/// December's: accuracy, and SJF on its predictions against FIFO, the
/// Oracle and the synthetic predictors, on December's jobs (sampled with
/// replacement, their own GPU counts up to `max_gpus`) arriving at the SJF
/// set-up's load.
pub fn learned_experiment(
    setup: &SjfSetup,
    learned: &LearnedSetup,
    trace: &PhillyTrace,
) -> anyhow::Result<LearnedResult> {
    let (train, test): (Vec<&PhillyJob>, Vec<&PhillyJob>) = trace
        .jobs
        .iter()
        .filter(|j| j.duration_secs > 0.0)
        .partition(|j| j.submit_time < LEARNED_SPLIT_TIME);
    if train.is_empty() || test.is_empty() {
        bail!("the job table has no jobs on one side of the December split");
    }
    let full = LearnedPredictor::train(&train, true, learned)?;
    let group = LearnedPredictor::train(&train, false, learned)?;
    let within = |p: &LearnedPredictor| {
        let hit = test
            .iter()
            .filter(|j| (p.predict(j) / j.duration_secs - 1.0).abs() <= 0.25)
            .count();
        100.0 * hit as f64 / test.len() as f64
    };
    let accuracy = vec![
        Accuracy {
            label: "CART, cluster + GPUs",
            splits: full.splits(),
            within_25_pct: within(&full),
        },
        Accuracy {
            label: "CART, cluster only",
            splits: group.splits(),
            within_25_pct: within(&group),
        },
    ];
    let pool: Vec<&PhillyJob> = test
        .iter()
        .copied()
        .filter(|j| j.num_gpus <= learned.max_gpus)
        .collect();
    if pool.is_empty() {
        bail!("no December job fits one node");
    }
    let seeds = setup
        .seeds
        .iter()
        .map(|&seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let picked: Vec<&PhillyJob> = (0..setup.jobs)
                .map(|_| pool[rng.random_range(0..pool.len())])
                .collect();
            let jobs: Vec<(u32, u64)> = picked
                .iter()
                .map(|j| {
                    (
                        j.num_gpus,
                        (j.duration_secs * 1000.0).round().max(1.0) as u64,
                    )
                })
                .collect();
            let variants = [None, Some(&full), Some(&group)]
                .iter()
                .map(|predictor| {
                    let labels = |i: usize| {
                        let job = picked[i];
                        let tenant = trace.cluster_name(job).unwrap_or("philly").to_string();
                        let estimate = predictor
                            .map_or(0, |p| (p.predict(job) * 1000.0).round().max(1.0) as u64);
                        (tenant, estimate)
                    };
                    // The same arrivals for every variant.
                    let mut arrivals = rng.clone();
                    poisson_scenario(
                        format!("philly-december-sjf-{}x{}", setup.jobs, setup.nodes * 8),
                        setup.nodes,
                        setup.load,
                        &jobs,
                        labels,
                        &mut arrivals,
                    )
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok((seed, variants))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (fifo, sjf) = fifo_and_sjf()?;
    let mut arms = synthetic_arms(&fifo, &sjf);
    // After the Oracle: SJF on the two trees' estimates (variants 1 and 2).
    let learned = |label, variant| Arm {
        label,
        policy: &sjf,
        prediction: Prediction::None,
        variant,
    };
    arms.insert(2, learned("SJF, CART on cluster + GPUs", 1));
    arms.insert(3, learned("SJF, CART on cluster only", 2));
    Ok(LearnedResult {
        train_jobs: train.len(),
        test_jobs: test.len(),
        accuracy,
        sjf: compare(&seeds, &arms)?,
    })
}
