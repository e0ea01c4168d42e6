//! The AntMan comparisons (OSDI '20, §5.1): Table 2 — two jobs on the one 32 GB GPU left,
//! under the five ways of handling the second arrival — on the scenario of
//! [`arbiter_sim::models::antman`], and the figures the paper publishes.

use anyhow::Context;
use arbiter_sim::models::antman::{
    AntmanMetrics, AntmanSimConfig, BANDWIDTH_RATIO, JobEnd, JobPlan, JobRow, ModelTruth,
    SpillRule, run_antman, table_3_models,
};
use arbiter_sim::parallel_map;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One configuration of Table 2.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub label: &'static str,
    pub scheduler: &'static str,
    /// The scheduler's configuration beyond its default.
    pub config: &'static str,
    /// The coordinator every node runs (none: launch limits stay).
    pub coordinator: Option<&'static str>,
    /// Whose memory may spill to the host.
    pub spill: SpillRule,
}

/// Table 2's columns, in the paper's order.
pub const SETTINGS: [Setting; 5] = [
    Setting {
        label: "Preempt",
        scheduler: "yarn-cs",
        config: "preemption = true",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "FIFO",
        scheduler: "yarn-cs",
        config: "",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "Pack",
        scheduler: "gandiva",
        // Gandiva as Table 2 runs it: packed whatever memory the job declared (§5.1: "Job-B
        // eventually fails because of the insufficient GPU memory (28.5 GB) granted").
        config: "memory_check = false",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "UMem",
        scheduler: "gandiva",
        config: "memory_check = false",
        coordinator: None,
        spill: SpillRule::All,
    },
    Setting {
        label: "AntMan",
        scheduler: "antman",
        config: "",
        coordinator: Some("antman"),
        spill: SpillRule::All,
    },
];

/// Table 2 as published: JCT in minutes of Job-A and Job-B per setting (`None`: Failed).
pub const PAPER_TABLE_2: [(&str, Option<f64>, Option<f64>); 5] = [
    ("Preempt", None, Some(91.1)),
    ("FIFO", Some(43.0), Some(108.2)),
    ("Pack", Some(43.1), None),
    ("UMem", Some(43.4), Some(541.6)),
    ("AntMan", Some(43.9), Some(91.8)),
];

/// The runs of one comparison, in [`SETTINGS`] order.
pub struct Table2 {
    pub runs: Vec<(&'static str, AntmanMetrics)>,
}

impl Table2 {
    pub fn get(&self, label: &str) -> Option<&AntmanMetrics> {
        self.runs.iter().find(|r| r.0 == label).map(|r| &r.1)
    }

    /// Job `name`'s JCT (minutes) under `label`, `None` when it did not finish.
    pub fn jct(&self, label: &str, name: &str) -> Option<f64> {
        self.get(label)?
            .jobs
            .iter()
            .find(|j| j.name == name)
            .and_then(|j| j.jct_min)
    }

    /// How job `name` ended under `label`.
    pub fn end(&self, label: &str, name: &str) -> Option<JobEnd> {
        self.get(label)?
            .jobs
            .iter()
            .find(|j| j.name == name)
            .map(|j| j.end.clone())
    }
}

/// Runs the five settings of Table 2 on `cfg` (its jobs and cluster; each setting brings
/// its own policies and spill rule), in parallel.
pub fn table_2(cfg: &AntmanSimConfig) -> anyhow::Result<Table2> {
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let runs = SETTINGS
        .iter()
        .map(|s| {
            let scheduler = crate::builtin_run_policy(&engine, s.scheduler, s.config)?;
            let coordinator = s
                .coordinator
                .map(|c| crate::builtin_run_policy(&engine, c, ""))
                .transpose()?;
            let cfg = AntmanSimConfig {
                spill: s.spill,
                ..cfg.clone()
            };
            Ok((scheduler, coordinator, cfg))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let metrics = parallel_map(&runs, threads, |(scheduler, coordinator, cfg)| {
        run_antman(scheduler, coordinator.as_ref(), cfg)
    })?;
    Ok(Table2 {
        runs: SETTINGS.iter().map(|s| s.label).zip(metrics).collect(),
    })
}

/// `arbiter sim --protocol antman`: Table 2's five settings on the default scenario, or on
/// the `AntmanSimConfig` TOML file `--config` names.
pub fn run_protocol(args: &crate::SimArgs) -> anyhow::Result<Table2> {
    table_2(&crate::protocol_setup::<AntmanSimConfig>(args)?)
}

impl Table2 {
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            let runs: Vec<_> = self
                .runs
                .iter()
                .map(|(label, m)| serde_json::json!({ "setting": label, "metrics": m }))
                .collect();
            let paper: Vec<_> = PAPER_TABLE_2
                .iter()
                .map(|(label, a, b)| serde_json::json!({ "setting": label, "job_a_min": a, "job_b_min": b }))
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "runs": runs, "paper": paper }))?
            );
        } else {
            print_table_2(self);
            println!(
                "JCT in minutes (Failed: out of memory or killed; unfinished: still waiting or \
                 running at the horizon); the paper's on the right. \
                 See docs/reproductions/antman.md."
            );
        }
        Ok(())
    }
}

/// Table 2 as text: ours beside the paper's.
pub fn print_table_2(t: &Table2) {
    let cell = |v: Option<f64>| v.map_or("Failed".to_string(), |m| format!("{m:.1}"));
    let ours = |label: &str, job: &str| match (t.jct(label, job), t.end(label, job)) {
        (Some(minutes), _) => format!("{minutes:.1}"),
        (None, Some(JobEnd::OutOfMemory | JobEnd::Killed)) => "Failed".to_string(),
        (None, _) => "unfinished".to_string(),
    };
    println!(
        "{:<8} {:>16} {:>16}",
        "setting", "Job-A ours/paper", "Job-B ours/paper"
    );
    for (label, a, b) in PAPER_TABLE_2 {
        println!(
            "{:<8} {:>16} {:>16}",
            label,
            format!("{}/{}", ours(label, "job-a"), cell(a)),
            format!("{}/{}", ours(label, "job-b"), cell(b)),
        );
    }
}

// ---------------------------------------------------------------------------------------
// The trace experiment (§5.2, Fig. 13)

/// Average JCT of YARN-CS and of Gandiva over AntMan's (§5.2): 2.05× and 1.84×.
pub const PAPER_FIG_13_RATIOS: (f64, f64) = (2.05, 1.84);

/// What the paper leaves out of §5.2, our choices (`docs/reproductions/antman.md`).
#[derive(Clone, Debug)]
pub struct TraceSetup {
    /// Jobs per run (ours: 1,000: fewer leave one seed's mean to a handful of day-long
    /// gangs).
    pub jobs: usize,
    /// Offered load: arrival rate × mean GPU time per job / 64 GPUs (ours: 1.0 — work
    /// arrives as fast as the cluster can do it alone, neither idle nor overloaded by
    /// construction).
    pub load: f64,
    /// How jobs arrive at that load (ours: Philly's own submissions, consecutive jobs with
    /// their gaps scaled to the load — the paper says only that run times and GPU counts
    /// come from the trace; Poisson is the sensitivity).
    pub arrivals: Arrivals,
    /// Philly jobs asking for more GPUs are not drawn (ours: 16, a quarter of the cluster).
    pub max_gpus: u32,
    /// Philly run times are capped at this many hours (ours: 24; the file's tail reaches
    /// months, which one 64-GPU run cannot hold).
    pub max_hours: f64,
    /// Node coordinators' control period in the runs (ours: 10 s, the M window).
    pub coordinator_period_ms: u64,
    /// Give multi-worker gangs the PAI mini-batch traces' straggler factors (ours: off —
    /// those jobs' workers shared GPUs, so their stragglers include the co-location
    /// interference this model's physics already charges; on, it would be charged twice,
    /// and exclusive gangs under YARN-CS would pay it too).
    pub stragglers: bool,
    /// How much uncapped jobs below saturation slow each other (the simulator's physics,
    /// measured on an H100: [`arbiter_sim::models::antman::TIMESLICE_INTERFERENCE`]); a knob
    /// here for the sensitivity table only.
    pub timeslice_interference: f64,
    /// The nine models' ground truth (default: [`table_3_models`] at the V100's bandwidth
    /// ratio). Changed here for the sensitivity tables only: a model's demand (how dense
    /// packed pairs are) or its sync rate (none of Table 3's is measured).
    pub models: BTreeMap<String, ModelTruth>,
    /// Whether Gandiva's run keeps the tenants' QoS (ours: yes — Tenant-A's jobs are
    /// guaranteed in every run, so Gandiva packs a Tenant-B job beside a Tenant-A one but
    /// never two Tenant-A jobs, which the contract cannot put on one GPU). `false`: Gandiva
    /// as OSDI '18 built it, with no tenants or guarantees — see [`without_tenants`].
    pub gandiva_keeps_qos: bool,
    pub seeds: Vec<u64>,
}

impl Default for TraceSetup {
    fn default() -> Self {
        TraceSetup {
            jobs: 1_000,
            load: 1.0,
            arrivals: Arrivals::Philly,
            max_gpus: 16,
            max_hours: 24.0,
            coordinator_period_ms: 10_000,
            stragglers: false,
            timeslice_interference: arbiter_sim::models::antman::TIMESLICE_INTERFERENCE,
            models: table_3_models(BANDWIDTH_RATIO),
            gandiva_keeps_qos: true,
            seeds: (1..=5).collect(),
        }
    }
}

/// How the trace experiment's jobs arrive. Either way the offered load is the set-up's:
/// the mean gap between arrivals is the same, only how the arrivals bunch differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Each seed draws its jobs from the whole Philly table and spaces them by
    /// exponential gaps: arrivals with no memory and no bursts.
    Poisson,
    /// Each seed takes a run of consecutive Philly submissions (from a random start) with
    /// their own run times, GPU counts and gaps, the gaps scaled by one factor to the
    /// set-up's load: Philly's bursts and lulls (many jobs submitted within a minute, then
    /// hours of few) kept as they were.
    Philly,
}

/// One Philly job the experiment may draw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhillyShape {
    /// Submission time, seconds on the trace's clock.
    pub submit_s: i64,
    /// Run time, seconds (capped).
    pub secs: f64,
    pub gpus: u32,
}

/// The Philly jobs the experiment draws from: positive run times, at most `max_gpus` GPUs,
/// run times capped. In the order [`trace_scenario`] draws from for the set-up's
/// [`Arrivals`]: file order for Poisson (its draws are by index, so the order fixes which
/// jobs a seed gets), submission order for Philly (its runs of consecutive submissions).
pub fn philly_shapes(setup: &TraceSetup) -> anyhow::Result<Vec<PhillyShape>> {
    let file = arbiter_traces::trace_file(arbiter_traces::philly::JOBS_FILE)
        .context("the AntMan trace experiment needs the Philly job table")?;
    let trace = arbiter_traces::philly::load_jobs(&file)
        .with_context(|| format!("loading `{}`", file.display()))?;
    let cap = setup.max_hours * 3600.0;
    let mut shapes: Vec<PhillyShape> = trace
        .jobs
        .iter()
        .filter(|j| j.duration_secs.is_finite() && j.duration_secs > 0.0)
        .filter(|j| j.num_gpus >= 1 && j.num_gpus <= setup.max_gpus)
        .map(|j| PhillyShape {
            submit_s: j.submit_time,
            secs: j.duration_secs.min(cap),
            gpus: j.num_gpus,
        })
        .collect();
    if setup.arrivals == Arrivals::Philly {
        // Stable: the file's order among jobs submitted in the same second.
        shapes.sort_by_key(|j| j.submit_s);
    }
    Ok(shapes)
}

/// The straggler factor of each PAI mini-batch trace (`minibatch_job_{1..4}_norm.csv`):
/// Σ over steps of the slowest worker's mini-batch time over Σ of the median worker's — how
/// much slower a synchronous gang steps than its typical worker.
pub fn pai_straggler_factors() -> anyhow::Result<Vec<f64>> {
    (1..=4)
        .map(|job| {
            let name = arbiter_traces::pai::minibatch_file(job).context("mini-batch file name")?;
            let file = arbiter_traces::trace_file(&name)
                .with_context(|| format!("the AntMan trace experiment needs `{name}`"))?;
            let samples = arbiter_traces::pai::load_minibatch(&file)
                .with_context(|| format!("loading `{}`", file.display()))?;
            let mut by_step: BTreeMap<u32, Vec<u32>> = Default::default();
            for s in samples {
                by_step.entry(s.time).or_default().push(s.batch_time_norm);
            }
            let (mut max, mut median) = (0.0, 0.0);
            for times in by_step.values_mut().filter(|t| t.len() > 1) {
                times.sort_unstable();
                let n = times.len();
                max += f64::from(times[n - 1]);
                median += if n % 2 == 1 {
                    f64::from(times[n / 2])
                } else {
                    (f64::from(times[n / 2 - 1]) + f64::from(times[n / 2])) / 2.0
                };
            }
            anyhow::ensure!(median > 0.0, "`{name}` has no step with several workers");
            Ok(max / median)
        })
        .collect()
}

/// The scenario of one seed: 8 × 8 V100-32GB, Tenant-A (64-GPU quota, guaranteed) and
/// Tenant-B (no quota, opportunistic) drawn at random, Table 3's categories evenly mixed,
/// Philly run times and GPU counts, arrivals at the set-up's load as its [`Arrivals`] says;
/// a gang's straggler factor is one of the PAI mini-batch traces', drawn at random.
pub fn trace_scenario(
    setup: &TraceSetup,
    shapes: &[PhillyShape],
    stragglers: &[f64],
    seed: u64,
) -> anyhow::Result<AntmanSimConfig> {
    use arbiter_sim::models::antman::TABLE_3_CATEGORIES;
    use rand::{Rng, SeedableRng};
    use rand_distr::{Distribution, Exp};
    if shapes.is_empty() || setup.jobs == 0 || setup.load.is_nan() || setup.load <= 0.0 {
        anyhow::bail!("the trace experiment needs Philly jobs, a job count and a load");
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let drawn: Vec<PhillyShape> = match setup.arrivals {
        Arrivals::Poisson => (0..setup.jobs)
            .map(|_| shapes[rng.random_range(0..shapes.len())])
            .collect(),
        Arrivals::Philly => {
            anyhow::ensure!(
                shapes.len() >= setup.jobs,
                "{} consecutive Philly jobs asked for, {} in the table",
                setup.jobs,
                shapes.len()
            );
            anyhow::ensure!(
                shapes.is_sorted_by_key(|j| j.submit_s),
                "Philly arrivals need the jobs in submission order (`philly_shapes` gives them so)"
            );
            let start = rng.random_range(0..=shapes.len() - setup.jobs);
            shapes[start..start + setup.jobs].to_vec()
        }
    };
    let mean_gpu_s = drawn
        .iter()
        .map(|j| j.secs * f64::from(j.gpus))
        .sum::<f64>()
        / drawn.len() as f64;
    let per_min = setup.load * 64.0 * 60.0 / mean_gpu_s;
    let gaps = Exp::new(per_min).context("arrival rate")?;
    // Philly's own gaps, scaled so their mean is the Poisson one's (1 / per_min).
    let philly_min_per_s = {
        let (first, last) = (drawn[0].submit_s, drawn[drawn.len() - 1].submit_s);
        let span_s = (last - first) as f64;
        let wanted_min = (drawn.len() - 1) as f64 / per_min;
        if span_s > 0.0 {
            wanted_min / span_s
        } else {
            0.0
        }
    };
    let mut t = 0.0;
    let jobs = drawn
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            t = match setup.arrivals {
                Arrivals::Poisson => t + gaps.sample(&mut rng),
                Arrivals::Philly => (shape.submit_s - drawn[0].submit_s) as f64 * philly_min_per_s,
            };
            let category = TABLE_3_CATEGORIES[rng.random_range(0..TABLE_3_CATEGORIES.len())];
            let model = category[rng.random_range(0..category.len())];
            let guaranteed = rng.random_bool(0.5);
            let straggler = if shape.gpus > 1 && !stragglers.is_empty() {
                stragglers[rng.random_range(0..stragglers.len())]
            } else {
                1.0
            };
            JobPlan {
                name: format!("job-{i:04}"),
                model: model.to_string(),
                tenant: if guaranteed { "tenant-a" } else { "tenant-b" }.to_string(),
                arrival_min: t,
                minutes: shape.secs / 60.0,
                workers: shape.gpus,
                opportunistic: !guaranteed,
                checkpointed: true,
                straggler,
            }
        })
        .collect();
    Ok(AntmanSimConfig {
        nodes: 8,
        gpus_per_node: 8,
        jobs,
        quotas: [("tenant-a".to_string(), 64), ("tenant-b".to_string(), 0)].into(),
        coordinator_period_ms: setup.coordinator_period_ms,
        timeslice_interference: setup.timeslice_interference,
        models: setup.models.clone(),
        horizon_ms: 90 * 24 * 3_600_000,
        ..AntmanSimConfig::default()
    })
}

/// Fig. 13's schedulers: YARN-CS, Gandiva (packing with its memory check, no node
/// control, no universal memory), AntMan (scheduler, coordinator, universal memory) — Fig.
/// 13a — and YARN-CS with preemption, Fig. 13b's reference for Tenant-A's jobs.
pub const FIG_13_SETTINGS: [Setting; 4] = [
    Setting {
        label: "YARN-CS",
        scheduler: "yarn-cs",
        config: "",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "Gandiva",
        scheduler: "gandiva",
        config: "",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "AntMan",
        scheduler: "antman",
        config: "",
        coordinator: Some("antman"),
        spill: SpillRule::All,
    },
    Setting {
        label: "YARN-CS-preempt",
        scheduler: "yarn-cs",
        config: "preemption = true",
        coordinator: None,
        spill: SpillRule::None,
    },
];

/// Fig. 13b (§5.2): "the JCT of AntMan is almost the same as YARN-CS-preempt, however,
/// YARN-CS-preempt achieves it with 46% of jobs being preempted".
pub const PAPER_FIG_13B_PREEMPTED: f64 = 0.46;

/// One seed's runs, in [`FIG_13_SETTINGS`] order.
pub struct Fig13Seed {
    pub seed: u64,
    pub runs: Vec<(&'static str, AntmanMetrics)>,
    /// The names of Tenant-A's (guaranteed) jobs.
    pub tenant_a: BTreeSet<String>,
}

impl Fig13Seed {
    fn run(&self, label: &str) -> Option<&AntmanMetrics> {
        self.runs.iter().find(|r| r.0 == label).map(|r| &r.1)
    }

    pub fn mean_jct(&self, label: &str) -> Option<f64> {
        self.run(label).map(|m| m.mean_jct_min)
    }

    /// Tenant-A's mean JCT (minutes) under `label`, over its finished jobs (Fig. 13b).
    pub fn tenant_a_mean_jct(&self, label: &str) -> Option<f64> {
        let jcts: Vec<f64> = self
            .run(label)?
            .jobs
            .iter()
            .filter(|j| self.tenant_a.contains(&j.name))
            .filter_map(|j| j.jct_min)
            .collect();
        (!jcts.is_empty()).then(|| jcts.iter().sum::<f64>() / jcts.len() as f64)
    }

    /// The share of jobs under `label` preempted at least once: (of all jobs, of Tenant-B's).
    pub fn preempted_share(&self, label: &str) -> Option<(f64, f64)> {
        self.per_job_mean(label, |j| f64::from(u8::from(j.preemptions > 0)))
    }

    /// Preemptions under `label` per job, a job preempted twice counted twice: (over all
    /// jobs, over Tenant-B's) — the other reading of Fig. 13b's "46 % of jobs".
    pub fn preemptions_per_job(&self, label: &str) -> Option<(f64, f64)> {
        self.per_job_mean(label, |j| f64::from(j.preemptions))
    }

    /// The mean of `value` over all of `label`'s jobs and over Tenant-B's.
    fn per_job_mean(&self, label: &str, value: fn(&JobRow) -> f64) -> Option<(f64, f64)> {
        let jobs = &self.run(label)?.jobs;
        let mean = |of: &mut dyn Iterator<Item = &JobRow>| {
            let (mut sum, mut n) = (0.0, 0usize);
            for j in of {
                sum += value(j);
                n += 1;
            }
            sum / n.max(1) as f64
        };
        let all = mean(&mut jobs.iter());
        let b = mean(&mut jobs.iter().filter(|j| !self.tenant_a.contains(&j.name)));
        Some((all, b))
    }

    /// (YARN-CS, Gandiva) mean JCT over AntMan's.
    pub fn ratios(&self) -> Option<(f64, f64)> {
        let a = self.mean_jct("AntMan")?;
        Some((self.mean_jct("YARN-CS")? / a, self.mean_jct("Gandiva")? / a))
    }
}

/// Workers on one GPU under Gandiva's default configuration (`max_jobs_per_gpu`).
const GANDIVA_JOBS_PER_GPU: u32 = 2;

/// The scenario as a scheduler with no tenants sees it: every job opportunistic (no
/// guarantee, no quota to charge) and the sharing rules widened so `jobs_per_gpu`
/// whole-GPU workers fit on one GPU — Gandiva's packing of any two jobs, Tenant-A's with
/// each other included. The physics does not read a job's QoS (only the spill rule and the
/// coordinator do), so the jobs run exactly as they would guaranteed.
pub fn without_tenants(cfg: AntmanSimConfig, jobs_per_gpu: u32) -> AntmanSimConfig {
    let jobs = cfg
        .jobs
        .into_iter()
        .map(|j| JobPlan {
            opportunistic: true,
            ..j
        })
        .collect();
    AntmanSimConfig {
        jobs,
        oversub_milli: 1000 * jobs_per_gpu,
        max_shared_workers: cfg.max_shared_workers.max(jobs_per_gpu),
        ..cfg
    }
}

/// Runs Fig. 13's settings on every seed of `setup`, all runs in one thread pool.
pub fn fig_13(setup: &TraceSetup) -> anyhow::Result<Vec<Fig13Seed>> {
    fig_13_with(setup, &FIG_13_SETTINGS)
}

/// Runs `settings` (labelled as in [`FIG_13_SETTINGS`] for the [`Fig13Seed`] methods) on
/// every seed of `setup`, all runs in one thread pool: Fig. 13 with a setting changed.
pub fn fig_13_with(setup: &TraceSetup, settings: &[Setting]) -> anyhow::Result<Vec<Fig13Seed>> {
    let shapes = philly_shapes(setup)?;
    let stragglers = if setup.stragglers {
        pai_straggler_factors()?
    } else {
        Vec::new()
    };
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let policies = settings
        .iter()
        .map(|s| {
            let scheduler = crate::builtin_run_policy(&engine, s.scheduler, s.config)?;
            let coordinator = s
                .coordinator
                .map(|c| crate::builtin_run_policy(&engine, c, ""))
                .transpose()?;
            Ok((s, scheduler, coordinator))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let scenarios = setup
        .seeds
        .iter()
        .map(|&seed| Ok((seed, trace_scenario(setup, &shapes, &stragglers, seed)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Every (seed, setting) run in one pool: AntMan's runs (coordinators as Wasm) take
    // several times the others', so one seed at a time would leave cores idle; they are
    // handed out first, so no long run starts last.
    let mut runs: Vec<(usize, usize)> = (0..scenarios.len())
        .flat_map(|k| (0..policies.len()).map(move |p| (k, p)))
        .collect();
    runs.sort_by_key(|&(k, p)| (policies[p].2.is_none(), k, p));
    let metrics = parallel_map(&runs, threads, |&(k, p)| {
        let (s, scheduler, coordinator) = &policies[p];
        let cfg = AntmanSimConfig {
            spill: s.spill,
            ..scenarios[k].1.clone()
        };
        let cfg = if s.scheduler == "gandiva" && !setup.gandiva_keeps_qos {
            without_tenants(cfg, GANDIVA_JOBS_PER_GPU)
        } else {
            cfg
        };
        run_antman(scheduler, coordinator.as_ref(), &cfg)
    })?;
    // Back in (seed, setting) order.
    let mut done: Vec<((usize, usize), AntmanMetrics)> = runs.into_iter().zip(metrics).collect();
    done.sort_unstable_by_key(|&(run, _)| run);
    let mut metrics = done.into_iter().map(|(_, m)| m);
    Ok(scenarios
        .into_iter()
        .map(|(seed, base)| Fig13Seed {
            seed,
            tenant_a: base
                .jobs
                .iter()
                .filter(|j| !j.opportunistic)
                .map(|j| j.name.clone())
                .collect(),
            runs: settings
                .iter()
                .map(|s| s.label)
                .zip(metrics.by_ref())
                .collect(),
        })
        .collect())
}

// ---------------------------------------------------------------------------------------
// Fig. 12 (§5.1): a guaranteed ESPnet beside an opportunistic ResNet-50

/// ESPnet's run time (min) alone, packed under Gandiva, and under AntMan (§5.1, Fig. 12).
pub const PAPER_FIG_12_ESPNET_MIN: (f64, f64, f64) = (20.1, 105.2, 20.8);

/// The Fig. 12 scenario: one V100; ESPnet (guaranteed, 20.1 min alone) and ResNet-50
/// (opportunistic, ours: 120 min alone) start together. Fig. 12's ResNet-50 fits beside
/// ESPnet, so it is given 16 GB (ours), not Table 1's 30 GB batch.
pub fn fig_12_scenario() -> AntmanSimConfig {
    use arbiter_sim::models::antman::JobPlan;
    let mut cfg = AntmanSimConfig::default();
    if let Some(resnet) = cfg.models.get_mut("resnet50") {
        resnet.memory_mib = 16_384;
    }
    cfg.jobs = vec![
        JobPlan {
            name: "espnet".into(),
            model: "espnet".into(),
            tenant: "quota".into(),
            arrival_min: 0.0,
            minutes: PAPER_FIG_12_ESPNET_MIN.0,
            workers: 1,
            opportunistic: false,
            checkpointed: false,
            straggler: 1.0,
        },
        JobPlan {
            name: "resnet50".into(),
            model: "resnet50".into(),
            tenant: "no-quota".into(),
            arrival_min: 0.0,
            minutes: 120.0,
            workers: 1,
            opportunistic: true,
            checkpointed: false,
            straggler: 1.0,
        },
    ];
    cfg
}

/// Fig. 12 under Gandiva's packing (no node control) and under AntMan: (label, run).
pub fn fig_12() -> anyhow::Result<Vec<(&'static str, AntmanMetrics)>> {
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let cfg = fig_12_scenario();
    let gandiva = crate::builtin_run_policy(&engine, "gandiva", "")?;
    let antman = crate::builtin_run_policy(&engine, "antman", "")?;
    Ok(vec![
        ("Gandiva", run_antman(&gandiva, None, &cfg)?),
        (
            "AntMan",
            run_antman(
                &antman,
                Some(&antman),
                &AntmanSimConfig {
                    spill: SpillRule::All,
                    ..cfg
                },
            )?,
        ),
    ])
}

/// `arbiter sim --protocol antman-trace --config FILE`: the trace experiment's set-up in a
/// TOML table, every key optional ([`TraceSetup::default`]'s value), unknown ones refused.
/// The model truths and the physics stay the reproduction's; the sensitivity tables that
/// change them are the reproduction test's (`docs/reproductions/antman.md`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceProtocolConfig {
    /// Jobs per seed.
    pub jobs: usize,
    /// Offered load: GPU-time submitted per GPU-time the cluster has.
    pub load: f64,
    /// `"philly"` (the trace's own consecutive submissions) or `"poisson"`.
    pub arrivals: String,
    pub max_gpus: u32,
    pub max_hours: f64,
    /// The node coordinators' control period, seconds.
    pub coordinator_period_s: f64,
    pub stragglers: bool,
    pub gandiva_keeps_qos: bool,
    pub seeds: Vec<u64>,
}

impl Default for TraceProtocolConfig {
    fn default() -> Self {
        let setup = TraceSetup::default();
        TraceProtocolConfig {
            jobs: setup.jobs,
            load: setup.load,
            arrivals: "philly".to_string(),
            max_gpus: setup.max_gpus,
            max_hours: setup.max_hours,
            coordinator_period_s: setup.coordinator_period_ms as f64 / 1000.0,
            stragglers: setup.stragglers,
            gandiva_keeps_qos: setup.gandiva_keeps_qos,
            seeds: setup.seeds,
        }
    }
}

impl arbiter_sim::models::ModelConfigFile for TraceProtocolConfig {
    const WHAT: &'static str = "the AntMan trace experiment's set-up";

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=100_000).contains(&self.jobs),
            "jobs must be 1 to 100,000 (got {})",
            self.jobs
        );
        anyhow::ensure!(
            self.load.is_finite() && self.load > 0.0 && self.load <= 100.0,
            "load must be above 0 and at most 100 (got {:?})",
            self.load
        );
        anyhow::ensure!(
            matches!(self.arrivals.as_str(), "philly" | "poisson"),
            "arrivals must be \"philly\" or \"poisson\" (got {:?})",
            self.arrivals
        );
        anyhow::ensure!(
            (1..=64).contains(&self.max_gpus),
            "max_gpus must be 1 to 64, the cluster's GPUs (got {})",
            self.max_gpus
        );
        anyhow::ensure!(
            self.max_hours.is_finite() && self.max_hours > 0.0 && self.max_hours <= 24.0 * 365.0,
            "max_hours must be above 0 and at most a year (got {:?})",
            self.max_hours
        );
        anyhow::ensure!(
            self.coordinator_period_s.is_finite()
                && (0.1..=3600.0).contains(&self.coordinator_period_s),
            "coordinator_period_s must be 0.1 to 3600 (got {:?})",
            self.coordinator_period_s
        );
        anyhow::ensure!(
            (1..=100).contains(&self.seeds.len()),
            "seeds must list 1 to 100 seeds (got {})",
            self.seeds.len()
        );
        Ok(())
    }
}

impl TraceProtocolConfig {
    pub fn setup(&self) -> TraceSetup {
        TraceSetup {
            jobs: self.jobs,
            load: self.load,
            arrivals: if self.arrivals == "poisson" {
                Arrivals::Poisson
            } else {
                Arrivals::Philly
            },
            max_gpus: self.max_gpus,
            max_hours: self.max_hours,
            coordinator_period_ms: (self.coordinator_period_s * 1000.0).round() as u64,
            stragglers: self.stragglers,
            gandiva_keeps_qos: self.gandiva_keeps_qos,
            seeds: self.seeds.clone(),
            ..TraceSetup::default()
        }
    }
}

/// `arbiter sim --protocol antman-trace`: Fig. 13's runs, seed by seed.
pub struct Fig13Report {
    pub seeds: Vec<Fig13Seed>,
}

/// Runs Fig. 13 (§5.2) on the set-up `--config` names (a [`TraceProtocolConfig`] TOML) or
/// the reproduction's default: five seeds of 1,000 Philly jobs, about two minutes
/// on two cores.
pub fn run_trace_protocol(args: &crate::SimArgs) -> anyhow::Result<Fig13Report> {
    let cfg: TraceProtocolConfig = crate::protocol_setup(args)?;
    Ok(Fig13Report {
        seeds: fig_13(&cfg.setup())?,
    })
}

/// The median of `values` (the upper one of an even count), `None` when there are none.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

impl Fig13Report {
    /// Median (YARN-CS, Gandiva) mean JCT over AntMan's across the seeds.
    pub fn median_ratios(&self) -> Option<(f64, f64)> {
        let ratios: Vec<(f64, f64)> = self.seeds.iter().filter_map(Fig13Seed::ratios).collect();
        Some((
            median(ratios.iter().map(|r| r.0).collect())?,
            median(ratios.iter().map(|r| r.1).collect())?,
        ))
    }

    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        let medians = self.median_ratios();
        if json {
            let seeds: Vec<_> = self
                .seeds
                .iter()
                .map(|s| {
                    let runs: Vec<_> = s
                        .runs
                        .iter()
                        .map(|(label, m)| {
                            serde_json::json!({
                                "setting": label,
                                "tenant_a_mean_jct_min": s.tenant_a_mean_jct(label),
                                "preempted_share": s.preempted_share(label).map(|p| p.0),
                                "metrics": m,
                            })
                        })
                        .collect();
                    serde_json::json!({ "seed": s.seed, "runs": runs })
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "seeds": seeds,
                    "median_yarn_cs_over_antman": medians.map(|m| m.0),
                    "median_gandiva_over_antman": medians.map(|m| m.1),
                    "paper_yarn_cs_over_antman": PAPER_FIG_13_RATIOS.0,
                    "paper_gandiva_over_antman": PAPER_FIG_13_RATIOS.1,
                    "paper_yarn_cs_preempt_preempted_share": PAPER_FIG_13B_PREEMPTED,
                }))?
            );
            return Ok(());
        }
        let labels: Vec<&str> = FIG_13_SETTINGS.iter().map(|s| s.label).collect();
        println!(
            "{:<6} {:<16} {:>13} {:>17} {:>10} {:>9}",
            "seed", "setting", "mean JCT min", "Tenant-A JCT min", "preempted", "finished"
        );
        for s in &self.seeds {
            for label in &labels {
                let Some(m) = s.run(label) else { continue };
                let finished = m.jobs.iter().filter(|j| j.end == JobEnd::Finished).count();
                println!(
                    "{:<6} {:<16} {:>13.1} {:>17} {:>9.0}% {:>9}",
                    s.seed,
                    label,
                    m.mean_jct_min,
                    s.tenant_a_mean_jct(label)
                        .map_or("-".to_string(), |v| format!("{v:.1}")),
                    100.0 * s.preempted_share(label).map_or(0.0, |p| p.0),
                    format!("{finished}/{}", m.jobs.len()),
                );
            }
        }
        if let Some((y, g)) = medians {
            println!(
                "median mean JCT over AntMan's: YARN-CS {y:.2} (paper {:.2}), Gandiva {g:.2} \
                 (paper {:.2}); YARN-CS-preempt preempts {:.0} % of the jobs in the paper. See \
                 docs/reproductions/antman.md.",
                PAPER_FIG_13_RATIOS.0,
                PAPER_FIG_13_RATIOS.1,
                100.0 * PAPER_FIG_13B_PREEMPTED
            );
        }
        Ok(())
    }
}
