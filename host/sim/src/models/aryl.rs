//! The Aryl cluster model (Li et al., "Aryl: An Elastic Cluster Scheduler for
//! Deep Learning", §4, §5, §7): a training pool and an inference pool of a
//! slower GPU model, capacity loaning driven by an inference demand curve,
//! reclaiming through the policy's `reclaim` role, elastic training jobs and
//! preemption with a restart overhead.
//!
//! The model runs on the simulator core ([`crate::core`]: its event loop,
//! host and progress integrator) and adds what Aryl needs on top:
//!
//! * **Pools.** `training` nodes (V100-class, speed 1) and `inference` nodes
//!   (T4-class, relative speed [`ArylSimConfig::inference_speed`]). An
//!   inference node is *on loan* to training (`ClusterState::set_node_loan`)
//!   or the inference scheduler's, in which case it is also cordoned so no
//!   training scheduler (fifo included) can use it.
//! * **Loaning.** Every [`InferenceDemand`] bucket the inference side needs
//!   `ceil(pool · utilization · (1 + headroom))` servers (at least
//!   `min_inference_fraction` of them); the rest are lent. When demand
//!   rises, the host asks the policy's `reclaim` role (a second instance of
//!   the same component, synchronised to the same state) which on-loan
//!   servers to take back through the host's [`ReclaimDriver`], applies the
//!   plan's scale-ins and preemptions, and cordons the returned servers. A
//!   plan the driver refuses is a *reclaim fault*; the driver then returns
//!   the on-loan servers hosting the fewest jobs itself.
//! * **Jobs.** Work is counted in "one V100 worker" milliseconds: a job of
//!   `w0` workers that ran `d` ms in the trace carries `d · throughput(w0)`.
//!   A running job progresses at `throughput(w) · min(speed of its GPUs)`
//!   (synchronous data-parallel training runs at its slowest worker);
//!   `throughput` is linear or the sub-linear law of §7.2
//!   ([`SpeedupLaw`], the simulator's own). Elastic jobs scale between their min and
//!   max workers; inelastic jobs have min = max.
//! * **Preemption.** A preempted job returns to the queue. With a checkpoint
//!   it keeps its progress; without one it starts over (§4). Either way it
//!   makes no progress for `restart_overhead_ms` after its next start (63 s,
//!   measured in §7.5).
//!
//! Rounds run on a fixed grid (`round_interval_ms`) whenever something
//! changed since the last one. Metrics: average / median / p95 queueing time
//! and JCT, training-pool and combined (training + inference) GPU usage,
//! preemptions (ratio to submitted jobs, share of running jobs preempted per
//! reclaim) and collateral damage (GPUs vacated outside the returned servers
//! per reclaimed GPU).

use crate::core::recorder::JobTimes;
use crate::core::{
    self, LoopRules, Progress, ProgressRules, RunPolicy, SimCtx, SimHost, SpeedupLaw,
};
use crate::metrics::{mean, percentile};
use crate::models::ModelConfigFile;
use crate::run::parallel_map;
use crate::scenario::gang_shape;
use anyhow::{Context, bail};
use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::reclaim::{ReclaimDriver, validate_plan};
use arbiter_host::roles::scheduler::Served;
use arbiter_host::runtime::PolicyInstance;
use arbiter_host::state::{ClusterState, JobRequest, MAX_SPEED_PERMILLE, NodeRequest};
use arbiter_policy_sdk::Cluster;
use arbiter_policy_sdk::model::{Decision, ReclaimRequest, WorkerPlacement, node_state};
use arbiter_traces::genai::{DemandMetric, LoraRequest, demand_curve};
use arbiter_traces::philly::PhillyTrace;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Instant;

/// Pool name of the dedicated training servers.
pub const TRAINING_POOL: &str = "training";
/// Pool name of the inference servers.
pub const INFERENCE_POOL: &str = "inference";
/// Preemption overhead the paper measured on its testbed (§7.5).
pub const RESTART_OVERHEAD_MS: u64 = 63_000;
/// Most decisions a reclaim plan may carry (`reclaim-request.max-decisions`).
pub const RECLAIM_MAX_DECISIONS: u32 = 10_000;

/// Knobs of the Aryl model (a TOML table of these names, every one optional).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArylSimConfig {
    /// Training servers (V100-class).
    pub training_nodes: u32,
    /// Inference servers (T4-class).
    pub inference_nodes: u32,
    /// GPUs per server, both pools.
    pub gpus_per_node: u32,
    /// Speed of an inference GPU relative to a training GPU.
    pub inference_speed: f64,
    /// Extra servers the inference side keeps above its demand (fraction).
    pub headroom: f64,
    /// Servers the inference side never lends (fraction of its pool).
    pub min_inference_fraction: f64,
    /// Whether inference servers are lent at all (off for the baseline).
    pub loaning: bool,
    /// Whether the chosen jobs are submitted as elastic (off for the baseline).
    pub elastic: bool,
    /// Speed-up law of elastic jobs (the model's ground truth).
    pub speedup: SpeedupLaw,
    /// No progress for this long after a restart that follows a preemption.
    pub restart_overhead_ms: u64,
    /// Rounds run on this grid, when something changed.
    pub round_interval_ms: u64,
    /// Stop after this much virtual time past the last arrival (jobs still
    /// running or queued then count as unfinished).
    pub drain_ms: u64,
    /// Seed of the run (recorded with its metrics).
    pub seed: u64,
}

impl Default for ArylSimConfig {
    fn default() -> Self {
        ArylSimConfig {
            training_nodes: 16,
            inference_nodes: 18,
            gpus_per_node: 8,
            inference_speed: 1.0 / 3.0,
            headroom: 0.1,
            min_inference_fraction: 0.1,
            loaning: true,
            elastic: true,
            speedup: SpeedupLaw::Linear,
            restart_overhead_ms: RESTART_OVERHEAD_MS,
            round_interval_ms: 30_000,
            drain_ms: 60 * 86_400_000,
            seed: 42,
        }
    }
}

impl ModelConfigFile for ArylSimConfig {
    const WHAT: &'static str = "the Aryl model's configuration";

    fn check(&self) -> anyhow::Result<()> {
        if self.gpus_per_node == 0 || self.training_nodes == 0 {
            bail!("the training pool needs servers with GPUs");
        }
        if !(self.inference_speed.is_finite() && self.inference_speed > 0.0) {
            bail!("inference_speed must be positive");
        }
        if self.round_interval_ms == 0 {
            bail!("round_interval_ms must be positive");
        }
        if let SpeedupLaw::SubLinear { loss_per_step } = self.speedup
            && !(loss_per_step.is_finite() && (0.0..=1.0).contains(&loss_per_step))
        {
            bail!("loss_per_step must be in 0..=1, got {loss_per_step}");
        }
        Ok(())
    }
}

impl ArylSimConfig {
    /// The baseline of Table 5 row 1: no loaning, no elastic scaling.
    pub fn baseline(&self) -> Self {
        ArylSimConfig {
            loaning: false,
            elastic: false,
            ..self.clone()
        }
    }
}

/// One training job of the workload.
#[derive(Clone, Debug, Serialize)]
pub struct ArylJob {
    pub name: String,
    pub arrival_ms: u64,
    /// Workers the job ran with in the trace.
    pub workers: u32,
    pub gpus_per_worker: u32,
    /// Scaling range when submitted as elastic (`min == max` for inelastic jobs).
    pub min_workers: u32,
    pub max_workers: u32,
    /// Run time in the trace, at `workers` training GPUs' speed.
    pub duration_ms: u64,
    pub checkpointed: bool,
    /// One of the large, well-scaling jobs (§7.1 "Basic").
    pub elastic: bool,
}

impl ArylJob {
    fn request(&self, elastic: bool) -> JobRequest {
        let mut r = JobRequest::gpus(
            self.name.clone(),
            "philly",
            self.workers,
            self.gpus_per_worker,
        );
        if elastic && self.elastic {
            r.min_workers = self.min_workers;
            r.max_workers = self.max_workers;
        }
        // The paper assumes known running times (§5.2; profiler, §6).
        r.estimate_ms = self.duration_ms.max(1);
        r.checkpointed = self.checkpointed;
        r
    }
}

/// How to cut a workload out of the Philly trace.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadSpec {
    /// First submission time taken (trace clock, seconds).
    pub start: i64,
    /// Length of the window, seconds.
    pub span_s: i64,
    /// Keep every `sample_every`-th job of the window (submission order), a
    /// uniform thinning to match a scaled-down cluster.
    pub sample_every: usize,
    /// Share of all jobs made elastic: the largest (by GPU time) multi-GPU jobs.
    pub elastic_fraction: f64,
    /// Share of jobs with checkpoints (drawn with the seed); the others lose
    /// their progress when preempted.
    pub checkpointed_fraction: f64,
    /// Jobs needing more GPUs than this are dropped (they could never run on
    /// the scaled-down training pool).
    pub max_gpus: u32,
    /// Longest run time kept; longer jobs are cut to it (0 = no cut).
    pub max_duration_s: f64,
    pub seed: u64,
}

/// The jobs of one run and what was left out.
#[derive(Clone, Debug, Serialize)]
pub struct ArylWorkload {
    pub jobs: Vec<ArylJob>,
    /// Jobs of the window dropped for needing more than `max_gpus`.
    pub dropped_too_large: usize,
    pub elastic: usize,
    pub checkpointed: usize,
    /// Total GPU time of the kept jobs, GPU-hours.
    pub gpu_hours: f64,
}

/// Parses `YYYY-MM-DD` as seconds since 1970 (the Philly trace's clock).
pub fn date_seconds(date: &str) -> anyhow::Result<i64> {
    let mut it = date.split('-');
    let (Some(y), Some(m), Some(d), None) = (it.next(), it.next(), it.next(), it.next()) else {
        bail!("expected YYYY-MM-DD, got `{date}`");
    };
    let (y, m, d): (i64, i64, i64) = (
        y.parse().with_context(|| format!("year in `{date}`"))?,
        m.parse().with_context(|| format!("month in `{date}`"))?,
        d.parse().with_context(|| format!("day in `{date}`"))?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        bail!("invalid date `{date}`");
    }
    // Days from civil (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Ok((era * 146_097 + doe - 719_468) * 86_400)
}

/// Cuts the workload out of the Philly trace (see [`WorkloadSpec`]).
///
/// Elastic jobs (§2.2, §7.1 "Basic": ~5% of jobs, the large ones that scale
/// well) are data-parallel with one GPU per worker: the trace's `G` GPUs are
/// `G` workers, and the job may shrink to `max(1, G/2)` and grow to `2G`.
pub fn philly_workload(
    trace: &PhillyTrace,
    spec: &WorkloadSpec,
    per_node: u32,
) -> anyhow::Result<ArylWorkload> {
    if spec.sample_every == 0 {
        bail!("sample_every must be at least 1");
    }
    if !(0.0..=1.0).contains(&spec.elastic_fraction)
        || !(0.0..=1.0).contains(&spec.checkpointed_fraction)
    {
        bail!("elastic_fraction and checkpointed_fraction must be in 0..=1");
    }
    let end = spec.start.saturating_add(spec.span_s);
    let mut window: Vec<_> = trace
        .jobs
        .iter()
        .filter(|j| j.submit_time >= spec.start && j.submit_time < end)
        .copied()
        .collect();
    // Stable order: submission time, then the file order the filter kept.
    window.sort_by_key(|j| j.submit_time);
    let sampled: Vec<_> = window.into_iter().step_by(spec.sample_every).collect();
    let mut dropped = 0;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut jobs = Vec::new();
    for (i, j) in sampled.iter().enumerate() {
        if j.num_gpus > spec.max_gpus {
            dropped += 1;
            continue;
        }
        let mut secs = j.duration_secs.max(1.0);
        if spec.max_duration_s > 0.0 {
            secs = secs.min(spec.max_duration_s);
        }
        let (workers, gpw) = gang_shape(j.num_gpus, per_node);
        jobs.push(ArylJob {
            name: format!("philly-{i}"),
            arrival_ms: ((j.submit_time - spec.start).max(0) as u64) * 1000,
            workers,
            gpus_per_worker: gpw,
            min_workers: workers,
            max_workers: workers,
            duration_ms: (secs * 1000.0).round() as u64,
            checkpointed: rng.random_bool(spec.checkpointed_fraction),
            elastic: false,
        });
    }
    // The largest multi-GPU jobs by GPU time become elastic.
    let target = (spec.elastic_fraction * jobs.len() as f64).round() as usize;
    let mut big: Vec<usize> = (0..jobs.len())
        .filter(|&k| jobs[k].workers * jobs[k].gpus_per_worker >= 2)
        .collect();
    big.sort_by(|&a, &b| {
        let ga = jobs[a].duration_ms as f64 * f64::from(jobs[a].workers * jobs[a].gpus_per_worker);
        let gb = jobs[b].duration_ms as f64 * f64::from(jobs[b].workers * jobs[b].gpus_per_worker);
        gb.total_cmp(&ga).then(a.cmp(&b))
    });
    for &k in big.iter().take(target) {
        let job = &mut jobs[k];
        let g = job.workers * job.gpus_per_worker;
        job.workers = g;
        job.gpus_per_worker = 1;
        job.min_workers = (g / 2).max(1);
        job.max_workers = (2 * g).min(spec.max_gpus.max(g));
        job.elastic = true;
    }
    let gpu_hours = jobs
        .iter()
        .map(|j| j.duration_ms as f64 / 3.6e6 * f64::from(j.workers * j.gpus_per_worker))
        .sum();
    Ok(ArylWorkload {
        elastic: jobs.iter().filter(|j| j.elastic).count(),
        checkpointed: jobs.iter().filter(|j| j.checkpointed).count(),
        jobs,
        dropped_too_large: dropped,
        gpu_hours,
    })
}

/// Inference utilization over time, as a share of the inference pool.
#[derive(Clone, Debug, Serialize)]
pub struct InferenceDemand {
    pub bucket_ms: u64,
    /// Busy share of the pool per bucket, `0..=1`; the curve repeats.
    pub utilization: Vec<f64>,
}

impl InferenceDemand {
    /// From the GenAI LoRA request trace: mean concurrent requests per bucket
    /// of the day (`bucket_s` divides a day), averaged over the trace's whole
    /// days — the typical day the inference scheduler provisions for — and
    /// scaled so its busiest bucket fills `peak_utilization` of the pool. The
    /// profile starts at midnight of the trace's clock and repeats daily.
    pub fn from_lora(
        requests: &[LoraRequest],
        bucket_s: u64,
        peak_utilization: f64,
    ) -> anyhow::Result<Self> {
        let width = NonZeroU64::new(bucket_s).context("bucket width must be positive")?;
        if 86_400 % bucket_s != 0 {
            bail!("bucket width {bucket_s}s does not divide a day");
        }
        if !(peak_utilization > 0.0 && peak_utilization <= 1.0) {
            bail!("peak utilization must be in (0, 1], got {peak_utilization}");
        }
        let curve = demand_curve(requests, width, DemandMetric::Concurrency)?;
        if curve.values.is_empty() || curve.peak <= 0.0 {
            bail!("the request trace has no demand");
        }
        let per_day = (86_400 / bucket_s) as usize;
        // Bucket of the day of curve bucket 0 (the curve starts on a bucket boundary).
        let offset = (curve.start.rem_euclid(86_400) / bucket_s as i64) as usize;
        // Whole days only, so every bucket of the day is averaged equally often.
        let first = (per_day - offset) % per_day;
        let days = curve.values.len().saturating_sub(first) / per_day;
        if days == 0 {
            bail!("the request trace covers no whole day");
        }
        let mut profile = vec![0.0; per_day];
        for (k, v) in curve.values[first..first + days * per_day]
            .iter()
            .enumerate()
        {
            profile[k % per_day] += v / days as f64;
        }
        let peak = profile.iter().copied().fold(0.0, f64::max);
        if peak <= 0.0 {
            bail!("the request trace's daily profile is empty");
        }
        Ok(InferenceDemand {
            bucket_ms: bucket_s * 1000,
            utilization: profile
                .iter()
                .map(|v| (v / peak * peak_utilization).clamp(0.0, 1.0))
                .collect(),
        })
    }

    /// A synthetic daily cycle between `low` and `high` (for tests without traces).
    pub fn diurnal(bucket_s: u64, low: f64, high: f64) -> Self {
        let per_day = (86_400 / bucket_s.max(1)).max(1);
        InferenceDemand {
            bucket_ms: bucket_s.max(1) * 1000,
            utilization: (0..per_day)
                .map(|k| {
                    let phase = std::f64::consts::TAU * k as f64 / per_day as f64;
                    (low + (high - low) * 0.5 * (1.0 - phase.cos())).clamp(0.0, 1.0)
                })
                .collect(),
        }
    }

    pub fn utilization_at(&self, t_ms: u64) -> f64 {
        if self.utilization.is_empty() || self.bucket_ms == 0 {
            return 0.0;
        }
        let k = (t_ms / self.bucket_ms) as usize % self.utilization.len();
        self.utilization[k]
    }

    pub fn mean(&self) -> f64 {
        mean(&self.utilization)
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ArylMetrics {
    pub policy: String,
    pub seed: u64,
    pub loaning: bool,
    pub elastic: bool,
    pub jobs: usize,
    pub completed: usize,
    /// Queued or running when the drain time ran out.
    pub unfinished: usize,
    pub avg_queue_s: f64,
    pub p50_queue_s: f64,
    pub p95_queue_s: f64,
    pub avg_jct_s: f64,
    pub p50_jct_s: f64,
    pub p95_jct_s: f64,
    /// Time-weighted allocated share of the training pool, first arrival to last arrival.
    pub training_usage_pct: f64,
    /// (training allocation anywhere + inference demand) / all GPUs, same window.
    pub combined_usage_pct: f64,
    /// Allocated share of the on-loan servers' GPUs, same window.
    pub loaned_usage_pct: f64,
    /// Mean number of servers on loan, same window.
    pub mean_loaned_servers: f64,
    /// Every preemption (a job preempted twice counts twice).
    pub preemptions: u64,
    /// Preemptions per submitted job, percent (Table 5 footnote 2).
    pub preemption_ratio_pct: f64,
    /// Reclaim operations with a positive count.
    pub reclaims: u64,
    pub servers_reclaimed: u64,
    /// Jobs preempted by reclaims.
    pub reclaim_preemptions: u64,
    /// Flexible-worker scale-ins carried out by reclaims.
    pub reclaim_scale_ins: u64,
    /// Mean over reclaims of preempted / running jobs, percent (Fig. 8).
    pub preempted_of_running_pct: f64,
    /// Mean over reclaims of GPUs vacated outside the returned servers per
    /// returned GPU, percent (Fig. 8 "collateral damage").
    pub collateral_damage_pct: f64,
    /// Reclaim plans the host refused (it then chose the servers itself).
    pub reclaim_faults: u64,
    /// Decision-level comparison on the same states: at every reclaim of this
    /// run, the run's own rule (first entry) and each shadow rule answer the
    /// same request; what each plan would preempt is counted without applying
    /// the shadows' plans.
    pub paired: Vec<PairedReclaim>,
    /// Reclaims the run's [`ReclaimProbe`] judged (e.g. against the
    /// exhaustive optimum of §7.3) on the same instance as the run's request.
    pub optimum_instances: u64,
    /// Over those: jobs the rule under test (Algorithm 1) would preempt …
    pub optimum_greedy_preempted: u64,
    /// … and the optimum would.
    pub optimum_preempted: u64,
    /// Instances where Algorithm 1 matched the optimum's preemption count.
    pub optimum_matches: u64,
    /// Rounds in which the scheduler faulted or a fallback answered.
    pub policy_faults: u64,
    pub rounds: u64,
    pub makespan_s: f64,
    pub wall_seconds: f64,
}

/// What one reclaim rule would have done over the reclaims of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PairedReclaim {
    pub policy: String,
    /// Reclaims answered with a usable plan.
    pub answered: u64,
    /// Plans refused (not counted in the sums).
    pub faults: u64,
    /// Jobs the plans would preempt (explicitly, or by leaving a worker on a
    /// returned server), summed over the answered reclaims.
    pub preempted: u64,
    /// Mean over answered reclaims of preempted / running jobs, percent.
    pub preempted_of_running_pct: f64,
    /// Mean over answered reclaims of GPUs vacated outside the returned
    /// servers per returned GPU, percent.
    pub collateral_pct: f64,
    #[serde(skip)]
    shares: Vec<f64>,
    #[serde(skip)]
    collaterals: Vec<f64>,
}

impl PairedReclaim {
    fn record(&mut self, cost: PlanCost, running: usize, count: usize, gpus_per_node: u32) {
        self.answered += 1;
        self.preempted += cost.preempted as u64;
        if running > 0 {
            self.shares
                .push(100.0 * cost.preempted as f64 / running as f64);
        }
        self.collaterals.push(
            100.0 * f64::from(cost.elsewhere_gpus) / (count as f64 * f64::from(gpus_per_node)),
        );
    }

    fn finish(&mut self) {
        self.preempted_of_running_pct = mean(&self.shares);
        self.collateral_pct = mean(&self.collaterals);
    }
}

/// What a reclaim plan costs, judged before it is applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCost {
    /// Running jobs the plan preempts, or leaves with a worker on a returned
    /// server (the host evicts those).
    pub preempted: usize,
    /// GPUs vacated on servers that are not returned (the preempted jobs'
    /// other workers and scale-ins elsewhere).
    pub elsewhere_gpus: u32,
}

/// Judges returning `nodes` with `decisions` on `cluster` (see [`PlanCost`]).
pub fn plan_cost(
    cluster: &arbiter_policy_sdk::Cluster,
    nodes: &[u32],
    decisions: &[Decision],
) -> PlanCost {
    let mut cost = PlanCost::default();
    for job in cluster.running_jobs() {
        let j = job.index();
        let placement = job.placement();
        let preempt = decisions
            .iter()
            .any(|d| matches!(d, Decision::Preempt(k) if *k == j));
        let scaled: Vec<u32> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::ScaleIn(k, positions) if *k == j => Some(positions.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        let stranded = placement
            .iter()
            .enumerate()
            .any(|(p, w)| nodes.contains(&w.node) && !scaled.contains(&(p as u32)));
        let elsewhere = |p: usize, w: &arbiter_policy_sdk::model::WorkerPlacement| {
            if nodes.contains(&w.node) {
                0
            } else if preempt || stranded || scaled.contains(&(p as u32)) {
                w.gpus.len() as u32
            } else {
                0
            }
        };
        if preempt || stranded {
            cost.preempted += 1;
        }
        cost.elsewhere_gpus += placement
            .iter()
            .enumerate()
            .map(|(p, w)| elsewhere(p, w))
            .sum::<u32>();
    }
    cost
}

/// Judges a reclaim request beside the run (e.g. a rule against the
/// exhaustive optimum); the model never acts on it.
pub trait ReclaimProbe: Send + Sync {
    /// Jobs (the rule under test, the reference) would preempt on `request`
    /// in `cluster`; `None` when the probe does not judge this instance.
    fn judge(&self, cluster: &Cluster, request: &ReclaimRequest) -> Option<(u64, u64)>;
}

/// A reclaim rule asked the run's reclaim questions beside it (its plans
/// are costed, never applied), with the configuration it gets.
pub type ShadowRule = RunPolicy;

/// The Aryl world around the core: pools, loans, the reclaim role, and what it measures.
struct ArylModel<'a> {
    cfg: &'a ArylSimConfig,
    jobs: &'a [ArylJob],
    demand: &'a InferenceDemand,
    /// Jobs in arrival order (then file order).
    order: Vec<usize>,
    next_arrival: usize,
    next_bucket: u64,
    reclaimer: Option<ReclaimDriver>,
    /// Other reclaim rules asked the same questions (see [`PairedReclaim`]).
    shadows: Vec<PolicyInstance>,
    paired: Vec<PairedReclaim>,
    probe: Option<&'a dyn ReclaimProbe>,
    /// Node index → GPU speed.
    speed: Vec<f64>,
    /// Inference node names, indices and whether each is on loan.
    inference: Vec<(String, u32, bool)>,
    m: ArylMetrics,
    preempted_share: Vec<f64>,
    collateral: Vec<f64>,
    last_arrival: u64,
    // Usage integrals over the arrival window.
    train_int: f64,
    comb_int: f64,
    loan_used_int: f64,
    loan_cap_int: f64,
    loaned_int: f64,
}

/// Throughput of `job` at `workers` workers, relative to one worker: within
/// its scaling range when the run scales elastic jobs, else fixed at its
/// submitted size.
fn throughput(cfg: &ArylSimConfig, job: &ArylJob, workers: u32) -> f64 {
    let (min, max) = if cfg.elastic && job.elastic {
        (job.min_workers, job.max_workers)
    } else {
        (job.workers, job.workers)
    };
    cfg.speedup
        .throughput(workers, min.max(1), max.max(min).max(1))
}

/// GPUs in use per node.
fn used_per_node(cluster: &Cluster) -> Vec<u32> {
    let mut used = vec![0u32; cluster.node_count()];
    for job in cluster.running_jobs() {
        for w in job.placement() {
            if let Some(u) = used.get_mut(w.node as usize) {
                *u += w.gpus.len() as u32;
            }
        }
    }
    used
}

impl ArylModel<'_> {
    /// Lends or takes back inference servers to match the demand at `now`.
    fn adjust_loans(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        if !self.cfg.loaning {
            return Ok(false);
        }
        let pool = self.inference.len();
        let u = self.demand.utilization_at(now);
        let needed = ((pool as f64) * u * (1.0 + self.cfg.headroom)).ceil() as usize;
        let floor = ((pool as f64) * self.cfg.min_inference_fraction).ceil() as usize;
        let needed = needed.max(floor).min(pool);
        let lendable = pool - needed;
        let on_loan = self.inference.iter().filter(|n| n.2).count();
        if lendable > on_loan {
            let mut more = lendable - on_loan;
            let state = &mut ctx.host.state;
            for n in self.inference.iter_mut().filter(|n| !n.2) {
                if more == 0 {
                    break;
                }
                state.set_node_loan(&n.0, true)?;
                state.set_node_state(&n.0, node_state::READY)?;
                n.2 = true;
                more -= 1;
            }
            Ok(true)
        } else if lendable < on_loan {
            self.reclaim(ctx, on_loan - lendable, now)?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Asks each shadow rule the run's own reclaim question (state sealed
    /// and unchanged); records its plan's cost next to the run's own.
    fn ask_shadows(
        &mut self,
        state: &ClusterState,
        request: &ReclaimRequest,
        running: usize,
        own: Option<PlanCost>,
    ) {
        let per_node = self.cfg.gpus_per_node;
        let count = request.count as usize;
        if let Some(entry) = self.paired.first_mut() {
            match own {
                Some(cost) => entry.record(cost, running, count, per_node),
                None => entry.faults += 1,
            }
        }
        for (k, instance) in self.shadows.iter_mut().enumerate() {
            let plan = instance
                .sync_to(state)
                .and_then(|()| instance.reclaim(request.clone()));
            let Some(entry) = self.paired.get_mut(k + 1) else {
                continue;
            };
            // The same check as the run's own plan (the host core's).
            match plan.and_then(|plan| validate_plan(state, request, &plan).map(|()| plan)) {
                Ok(plan) => {
                    let cost = plan_cost(state.cluster(), &plan.nodes, &plan.decisions);
                    entry.record(cost, running, count, per_node);
                }
                Err(_) => entry.faults += 1,
            }
        }
    }

    /// Takes `count` on-loan servers back through the host's reclaim driver.
    fn reclaim(&mut self, ctx: &mut SimCtx, count: usize, now: u64) -> anyhow::Result<()> {
        let span = tracing::info_span!("aryl_reclaim", count);
        let _guard = span.enter();
        let candidates: Vec<u32> = self.inference.iter().filter(|n| n.2).map(|n| n.1).collect();
        let before = used_per_node(ctx.host.state.cluster());
        let running_before = ctx.host.state.cluster().running_jobs().count();
        let Some(driver) = self.reclaimer.as_ref() else {
            bail!("reclaim without a reclaim role");
        };
        // The host core's reclaim driver: the policy's plan if it passes the
        // one plan check, else Smallest-Count-First on the host's side.
        let outcome = driver.reclaim(
            &mut ctx.host.state,
            &candidates,
            count as u32,
            RECLAIM_MAX_DECISIONS,
        );
        // The driver changed nothing yet: the probe judges the same state and request.
        if let Some((rule, reference)) = self
            .probe
            .and_then(|p| p.judge(ctx.host.state.cluster(), &outcome.request))
        {
            self.m.optimum_instances += 1;
            self.m.optimum_greedy_preempted += rule;
            self.m.optimum_preempted += reference;
            if rule == reference {
                self.m.optimum_matches += 1;
            }
        }
        let own = (outcome.served != Served::Native).then(|| {
            plan_cost(
                ctx.host.state.cluster(),
                &outcome.plan.nodes,
                &outcome.plan.decisions,
            )
        });
        if !outcome.faults.is_empty() {
            self.m.reclaim_faults += outcome.faults.len() as u64;
        }
        self.ask_shadows(&ctx.host.state, &outcome.request, running_before, own);
        let (nodes, decisions) = (outcome.plan.nodes, outcome.plan.decisions);
        let scale_ins = decisions
            .iter()
            .filter(|d| matches!(d, Decision::ScaleIn(..)))
            .count();
        let applied = if decisions.is_empty() {
            Default::default()
        } else {
            ctx.host
                .state
                .apply(decisions)
                .context("applying a validated reclaim plan")?
        };
        // The reclaim driver's plans empty the returned servers (its one
        // plan check; the native plan preempts everything there).
        if let Some(job) = ctx
            .host
            .state
            .cluster()
            .running_jobs()
            .find(|job| job.placement().iter().any(|w| nodes.contains(&w.node)))
        {
            bail!(
                "job {} still runs on a returned server after a validated reclaim plan",
                job.index()
            );
        }
        for &n in &nodes {
            if let Some(entry) = self.inference.iter_mut().find(|e| e.1 == n) {
                ctx.host.state.set_node_loan(&entry.0, false)?;
                ctx.host
                    .state
                    .set_node_state(&entry.0, node_state::CORDONED)?;
                entry.2 = false;
            }
        }
        let after = used_per_node(ctx.host.state.cluster());
        let elsewhere: u32 = (0..before.len() as u32)
            .filter(|n| !nodes.contains(n))
            .map(|n| before[n as usize].saturating_sub(after[n as usize]))
            .sum();
        let preempted = applied.preempted.len();
        // Preemptions and scale-ins reach the integrator as a round's would.
        core::apply(self, ctx, &applied, now)?;
        self.m.reclaims += 1;
        self.m.servers_reclaimed += count as u64;
        self.m.reclaim_preemptions += preempted as u64;
        self.m.reclaim_scale_ins += scale_ins as u64;
        if running_before > 0 {
            self.preempted_share
                .push(100.0 * preempted as f64 / running_before as f64);
        }
        self.collateral.push(
            100.0 * f64::from(elsewhere) / (count as f64 * f64::from(self.cfg.gpus_per_node)),
        );
        tracing::debug!(preempted, scale_ins, elsewhere, "reclaim done");
        Ok(())
    }
}

impl core::WorkloadModel for ArylModel<'_> {
    fn next_event(&self, ctx: &SimCtx, _now: u64) -> Option<u64> {
        let arrival = self
            .order
            .get(self.next_arrival)
            .map(|&k| self.jobs[k].arrival_ms);
        let bucket = (self.cfg.loaning && !ctx.progress.all_finished()).then_some(self.next_bucket);
        match (arrival, bucket) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        let mut changed = false;
        while let Some(&k) = self.order.get(self.next_arrival) {
            if self.jobs[k].arrival_ms > now {
                break;
            }
            let id = ctx
                .host
                .state
                .submit(self.jobs[k].request(self.cfg.elastic))
                .with_context(|| format!("submitting `{}`", self.jobs[k].name))?;
            ctx.progress.submitted(k, id);
            self.next_arrival += 1;
            changed = true;
        }
        if self.cfg.loaning && now >= self.next_bucket {
            if self.adjust_loans(ctx, now)? {
                changed = true;
            }
            let width = self.demand.bucket_ms.max(1);
            self.next_bucket = (now / width + 1) * width;
        }
        Ok(changed)
    }

    /// Synchronous data-parallel training runs at its slowest worker.
    fn rate(&self, _ctx: &SimCtx, job: usize, placement: &[WorkerPlacement]) -> f64 {
        let slowest = placement
            .iter()
            .map(|w| self.speed.get(w.node as usize).copied().unwrap_or(1.0))
            .fold(f64::INFINITY, f64::min);
        let slowest = if slowest.is_finite() { slowest } else { 0.0 };
        throughput(self.cfg, &self.jobs[job], placement.len() as u32) * slowest
    }

    /// A checkpointed job reports what it has left, at the reference speed
    /// and its last worker count (the host already reset one without a
    /// checkpoint to its estimate).
    fn on_preempted(&mut self, ctx: &mut SimCtx, job: usize) -> anyhow::Result<()> {
        self.m.preemptions += 1;
        let Some(id) = ctx.progress.track(job).id else {
            return Ok(());
        };
        let Some(index) = ctx.host.state.job_index(id) else {
            return Ok(());
        };
        let workers = ctx.host.state.cluster().job(index).workers();
        let tp = throughput(self.cfg, &self.jobs[job], workers);
        ctx.progress.report_waiting(&mut ctx.host.state, job, tp)
    }

    fn observe(&mut self, ctx: &SimCtx, from: u64, to: u64) {
        if from >= self.last_arrival {
            return;
        }
        let cfg = self.cfg;
        let training_gpus = f64::from(cfg.training_nodes * cfg.gpus_per_node);
        let inference_gpus = f64::from(cfg.inference_nodes * cfg.gpus_per_node);
        let dt = (to.min(self.last_arrival) - from) as f64;
        let used = used_per_node(ctx.host.state.cluster());
        let train: u32 = used[..cfg.training_nodes as usize].iter().sum();
        let all: u32 = used.iter().sum();
        let loaned: Vec<&(String, u32, bool)> = self.inference.iter().filter(|n| n.2).collect();
        let loan_used: u32 = loaned.iter().map(|n| used[n.1 as usize]).sum();
        let inf_busy = self.demand.utilization_at(from) * inference_gpus;
        self.train_int += dt * f64::from(train) / training_gpus;
        self.comb_int += dt * (f64::from(all) + inf_busy) / (training_gpus + inference_gpus);
        self.loan_used_int += dt * f64::from(loan_used);
        self.loan_cap_int += dt * (loaned.len() as f64) * f64::from(cfg.gpus_per_node);
        self.loaned_int += dt * loaned.len() as f64;
    }
}

/// Policy instances for the shadow rules.
fn shadow_instances(shadows: &[ShadowRule]) -> anyhow::Result<Vec<PolicyInstance>> {
    shadows
        .iter()
        .map(|shadow| {
            let name = &shadow.compiled.manifest.name;
            let mut instance = shadow
                .compiled
                .instantiate()
                .with_context(|| format!("instantiating `{name}` for reclaim"))?;
            let text = shadow
                .config
                .clone()
                .unwrap_or_else(|| shadow.compiled.manifest.default_config.clone());
            instance
                .configure(&text)
                .with_context(|| format!("configuring `{name}` for reclaim"))?;
            Ok(instance)
        })
        .collect()
}

fn has_reclaim(policy: &RunPolicy) -> bool {
    policy
        .compiled
        .manifest
        .roles
        .iter()
        .any(|r| r == "reclaim")
}

/// Runs one policy on the Aryl model.
///
/// `shadows`: other reclaim rules (components with a `reclaim` role) asked
/// the same question at every reclaim, for [`ArylMetrics::paired`];
/// `probe`: judges every reclaim request beside the run (the optimum fields
/// of [`ArylMetrics`]).
pub fn run_aryl(
    workload: &ArylWorkload,
    demand: &InferenceDemand,
    policy: &RunPolicy,
    cfg: &ArylSimConfig,
    shadows: &[ShadowRule],
    probe: Option<&dyn ReclaimProbe>,
) -> anyhow::Result<ArylMetrics> {
    let name = policy.compiled.manifest.name.clone();
    let span = tracing::info_span!("sim_aryl", policy = %name, loaning = cfg.loaning, elastic = cfg.elastic);
    let _guard = span.enter();
    let started = Instant::now();
    cfg.check()?;
    let mut state = ClusterState::new();
    // What the policies see of the T4's speed (contract 0.2 `gpu-model-speed`).
    let t4_permille = (cfg.inference_speed * 1000.0)
        .round()
        .clamp(1.0, f64::from(MAX_SPEED_PERMILLE));
    state.set_gpu_model_speed("T4", t4_permille as u32)?;
    let mut speed = Vec::new();
    for k in 0..cfg.training_nodes {
        state.add_node(NodeRequest {
            name: format!("train-{k}"),
            pool: TRAINING_POOL.into(),
            cpu_milli: 92_000,
            memory_mib: 350 * 1024,
            gpu_model: "V100".into(),
            gpu_memory_mib: 32_768,
            gpu_count: cfg.gpus_per_node,
            on_loan: false,
        })?;
        speed.push(1.0);
    }
    let mut inference = Vec::new();
    for k in 0..cfg.inference_nodes {
        let node = format!("infer-{k}");
        let index = state.add_node(NodeRequest {
            name: node.clone(),
            pool: INFERENCE_POOL.into(),
            cpu_milli: 92_000,
            memory_mib: 210 * 1024,
            gpu_model: "T4".into(),
            gpu_memory_mib: 16_384,
            gpu_count: cfg.gpus_per_node,
            on_loan: false,
        })?;
        state.set_node_state(&node, node_state::CORDONED)?;
        speed.push(cfg.inference_speed);
        inference.push((node, index, false));
    }
    let host = SimHost::new(state, policy, None)?;
    let reclaimer = if cfg.loaning && has_reclaim(policy) {
        // Its own slot, so its instance (and the policy's state in it) is
        // not the scheduler's.
        let slot = Arc::new(PolicySlot::new(format!("{name}/reclaim")));
        slot.swap(policy.compiled.clone(), policy.config.clone(), None, None)
            .with_context(|| format!("loading `{name}` for reclaim"))?;
        Some(ReclaimDriver::new(slot))
    } else {
        None
    };
    let mut paired = vec![PairedReclaim {
        policy: name.clone(),
        ..PairedReclaim::default()
    }];
    let mut shadow_rules = Vec::new();
    if reclaimer.is_some() {
        if let Some(shadow) = shadows.iter().find(|s| !has_reclaim(s)) {
            bail!(
                "shadow `{}` has no reclaim role",
                shadow.compiled.manifest.name
            );
        }
        shadow_rules = shadow_instances(shadows)?;
        paired.extend(shadows.iter().map(|s| PairedReclaim {
            policy: s.compiled.manifest.name.clone(),
            ..PairedReclaim::default()
        }));
    }
    let jobs = &workload.jobs;
    let progress = Progress::new(
        jobs.iter().map(|j| {
            (
                j.duration_ms as f64 * throughput(cfg, j, j.workers),
                j.checkpointed,
            )
        }),
        ProgressRules {
            restart_overhead_ms: cfg.restart_overhead_ms,
            report_progress: true,
        },
    );
    let mut ctx = SimCtx { host, progress };
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&k| (jobs[k].arrival_ms, k));
    let last_arrival = jobs.iter().map(|j| j.arrival_ms).max().unwrap_or(0);
    let mut model = ArylModel {
        cfg,
        jobs,
        demand,
        order,
        next_arrival: 0,
        next_bucket: 0,
        reclaimer,
        shadows: shadow_rules,
        paired,
        probe,
        speed,
        inference,
        m: ArylMetrics {
            policy: name.clone(),
            seed: cfg.seed,
            loaning: cfg.loaning,
            elastic: cfg.elastic,
            jobs: jobs.len(),
            ..ArylMetrics::default()
        },
        preempted_share: Vec::new(),
        collateral: Vec::new(),
        last_arrival,
        train_int: 0.0,
        comb_int: 0.0,
        loan_used_int: 0.0,
        loan_cap_int: 0.0,
        loaned_int: 0.0,
    };
    let rules = LoopRules {
        round_interval_ms: cfg.round_interval_ms,
        horizon_ms: last_arrival.saturating_add(cfg.drain_ms),
        gpu_metrics_period_ms: None,
    };
    let now = core::run(&mut model, &mut ctx, &rules)?;
    let arrival_span = last_arrival.max(1) as f64;
    let times = JobTimes::collect(ctx.progress.tracks(), jobs.iter().map(|j| &j.arrival_ms));
    let (queue, jct) = (&times.queue_s, &times.jct_s);
    let m = &mut model.m;
    m.rounds = ctx.host.stats.rounds;
    m.policy_faults = ctx.host.stats.troubled;
    m.completed = jct.len();
    m.unfinished = jobs.len() - jct.len();
    m.avg_queue_s = mean(queue);
    m.p50_queue_s = percentile(queue, 50.0);
    m.p95_queue_s = percentile(queue, 95.0);
    m.avg_jct_s = mean(jct);
    m.p50_jct_s = percentile(jct, 50.0);
    m.p95_jct_s = percentile(jct, 95.0);
    m.training_usage_pct = 100.0 * model.train_int / arrival_span;
    m.combined_usage_pct = 100.0 * model.comb_int / arrival_span;
    m.loaned_usage_pct = if model.loan_cap_int > 0.0 {
        100.0 * model.loan_used_int / model.loan_cap_int
    } else {
        0.0
    };
    m.mean_loaned_servers = model.loaned_int / arrival_span;
    m.preemption_ratio_pct = if jobs.is_empty() {
        0.0
    } else {
        100.0 * m.preemptions as f64 / jobs.len() as f64
    };
    m.preempted_of_running_pct = mean(&model.preempted_share);
    m.collateral_damage_pct = mean(&model.collateral);
    if m.reclaims > 0 {
        for p in &mut model.paired {
            p.finish();
        }
        m.paired = std::mem::take(&mut model.paired);
    }
    m.makespan_s = now as f64 / 1000.0;
    m.wall_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        wall_s = m.wall_seconds,
        rounds = m.rounds,
        completed = m.completed,
        preemptions = m.preemptions,
        "aryl run done"
    );
    Ok(model.m)
}

/// One row of a comparison: which policy under which model settings.
#[derive(Clone)]
pub struct ArylCase {
    pub label: String,
    pub policy: RunPolicy,
    pub config: ArylSimConfig,
    /// Reclaim rules asked the same questions (see [`ArylMetrics::paired`]).
    pub shadows: Vec<ShadowRule>,
    pub probe: Option<Arc<dyn ReclaimProbe>>,
}

/// Runs `cases` on up to `threads` threads; results in case order.
pub fn run_cases(
    workload: &ArylWorkload,
    demand: &InferenceDemand,
    cases: &[ArylCase],
    threads: usize,
) -> anyhow::Result<Vec<ArylMetrics>> {
    parallel_map(cases, threads, |case| {
        run_aryl(
            workload,
            demand,
            &case.policy,
            &case.config,
            &case.shadows,
            case.probe.as_deref(),
        )
        .map(|mut m| {
            m.policy = case.label.clone();
            m
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(date_seconds("1970-01-01").ok(), Some(0));
        assert_eq!(date_seconds("2017-10-16").ok(), Some(1_508_112_000));
        assert!(date_seconds("2017-13-01").is_err());
    }

    #[test]
    fn diurnal_demand_wraps() {
        let d = InferenceDemand::diurnal(3600, 0.2, 0.8);
        assert_eq!(d.utilization.len(), 24);
        assert!((d.utilization_at(0) - 0.2).abs() < 1e-9);
        assert!((d.utilization_at(12 * 3_600_000) - 0.8).abs() < 1e-9);
        assert_eq!(d.utilization_at(0), d.utilization_at(86_400_000));
    }
}
