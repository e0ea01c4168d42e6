//! The Aryl cluster model (Li et al., "Aryl: An Elastic Cluster Scheduler for
//! Deep Learning", §4, §5, §7): a training pool and an inference pool of a
//! slower GPU model, capacity loaning driven by an inference demand curve,
//! reclaiming through the policy's `reclaim` role, elastic training jobs and
//! preemption with a restart overhead.
//!
//! The model drives the real host core (`ClusterState` + `RoundDriver` with
//! the Wasm policy in a `PolicySlot`) in virtual time, like [`crate::sim`],
//! and adds what Aryl needs on top:
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
//!   servers to take back, applies its scale-ins and preemptions after the
//!   host's validation, evicts anything the plan left behind, and cordons the
//!   returned servers. A plan the host refuses is a *reclaim fault*; the host
//!   then returns the on-loan servers hosting the fewest jobs itself.
//! * **Jobs.** Work is counted in "one V100 worker" milliseconds: a job of
//!   `w0` workers that ran `d` ms in the trace carries `d · throughput(w0)`.
//!   A running job progresses at `throughput(w) · min(speed of its GPUs)`
//!   (synchronous data-parallel training runs at its slowest worker);
//!   `throughput` is linear or the sub-linear law of §7.2
//!   ([`aryl_core::jct::Speedup`]). Elastic jobs scale between their min and
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

use crate::metrics::{mean, percentile};
use crate::scenario::gang_shape;
use anyhow::{Context, bail};
use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::reclaim::{ReclaimDriver, validate_plan};
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::runtime::{CompiledPolicy, PolicyInstance};
use arbiter_host::state::{ClusterState, JobId, JobRequest, MAX_SPEED_PERMILLE, NodeRequest};
use arbiter_policy_sdk::model::{Decision, ReclaimRequest, node_state};
use arbiter_traces::genai::{DemandMetric, LoraRequest, demand_curve};
use arbiter_traces::philly::PhillyTrace;
use aryl_core::jct::Speedup;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Instant;

/// Pool name of the dedicated training servers.
pub const TRAINING_POOL: &str = "training";
/// Pool name of the inference servers.
pub const INFERENCE_POOL: &str = "inference";
/// Largest reclaim instance (server subsets) compared with the exhaustive optimum.
pub const OPTIMUM_MAX_SUBSETS: u64 = 20_000;
/// Preemption overhead the paper measured on its testbed (§7.5).
pub const RESTART_OVERHEAD_MS: u64 = 63_000;
/// Most decisions a reclaim plan may carry (`reclaim-request.max-decisions`).
pub const RECLAIM_MAX_DECISIONS: u32 = 10_000;

/// Knobs of the Aryl model.
#[derive(Clone, Debug, Serialize)]
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
    /// Speed-up law of elastic jobs.
    #[serde(skip)]
    pub speedup: Speedup,
    /// No progress for this long after a restart that follows a preemption.
    pub restart_overhead_ms: u64,
    /// Rounds run on this grid, when something changed.
    pub round_interval_ms: u64,
    /// Stop after this much virtual time past the last arrival (jobs still
    /// running or queued then count as unfinished).
    pub drain_ms: u64,
    /// Seed of the policies' tie-breaking (Random reclaim).
    pub seed: u64,
    /// Extra configuration lines for the Aryl family (e.g.
    /// `slow_spill = "always"`), after the ones the model sets.
    pub policy_config: String,
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
            speedup: Speedup::Linear,
            restart_overhead_ms: RESTART_OVERHEAD_MS,
            round_interval_ms: 30_000,
            drain_ms: 60 * 86_400_000,
            seed: 42,
            policy_config: String::new(),
        }
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
    /// Reclaims small enough for the exhaustive optimum (§7.3), computed
    /// natively with `aryl-core` on the same instance as the run's request.
    pub optimum_instances: u64,
    /// Over those: jobs Algorithm 1 (`greedy_select`) would preempt …
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

/// Where a job stands.
#[derive(Clone, Debug, Default)]
struct Track {
    id: Option<JobId>,
    /// Total work, in one-V100-worker milliseconds.
    work: f64,
    remaining: f64,
    /// Work per millisecond now (0 when not running).
    rate: f64,
    running: bool,
    first_start: Option<u64>,
    end: Option<u64>,
    /// No progress before this time (restart overhead).
    resume_at: u64,
    /// Preempted since its last start: the next start pays the overhead.
    restart_pending: bool,
    /// The rate of the last progress report to the host (0 = none since it stopped).
    reported_rate: f64,
}

struct Model<'a> {
    cfg: &'a ArylSimConfig,
    jobs: &'a [ArylJob],
    state: ClusterState,
    driver: RoundDriver,
    reclaimer: Option<ReclaimDriver>,
    /// Other reclaim rules asked the same questions (see [`PairedReclaim`]).
    shadows: Vec<PolicyInstance>,
    paired: Vec<PairedReclaim>,
    track: Vec<Track>,
    /// Jobs with a positive rate (as of the last [`Model::refresh_rates`]).
    active: Vec<usize>,
    by_id: HashMap<JobId, usize>,
    /// Node index → GPU speed.
    speed: Vec<f64>,
    /// Inference node names and whether each is on loan.
    inference: Vec<(String, u32, bool)>,
    m: ArylMetrics,
    preempted_share: Vec<f64>,
    collateral: Vec<f64>,
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

impl Model<'_> {
    fn job_of(&self, index: u32) -> Option<usize> {
        let rec = self.state.records().get(index as usize)?;
        self.by_id.get(&rec.id).copied()
    }

    /// Moves every running job's progress to `now`.
    fn advance(&mut self, from: u64, now: u64) {
        for &k in &self.active {
            let t = &mut self.track[k];
            if !(t.running && t.rate > 0.0) {
                continue;
            }
            let begin = from.max(t.resume_at);
            if now > begin {
                t.remaining -= t.rate * (now - begin) as f64;
            }
        }
    }

    /// Recomputes every running job's rate from its placement, and reports
    /// to the host what each job whose rate changed has left (the contract's
    /// `remaining-ms`, as a training framework would report it).
    fn refresh_rates(&mut self) -> anyhow::Result<()> {
        let cluster = self.state.cluster();
        let mut rates = Vec::new();
        for job in cluster.running_jobs() {
            let Some(k) = self.job_of(job.index()) else {
                continue;
            };
            let placement = job.placement();
            let slowest = placement
                .iter()
                .map(|w| self.speed.get(w.node as usize).copied().unwrap_or(1.0))
                .fold(f64::INFINITY, f64::min);
            let slowest = if slowest.is_finite() { slowest } else { 0.0 };
            let tp = throughput(self.cfg, &self.jobs[k], placement.len() as u32);
            rates.push((k, tp * slowest));
        }
        for &k in &self.active {
            self.track[k].rate = 0.0;
        }
        self.active.clear();
        let now = self.state.now_ms();
        for (k, r) in rates {
            let t = &mut self.track[k];
            t.rate = r;
            if r > 0.0 {
                self.active.push(k);
            }
            if r > 0.0 && r != t.reported_rate {
                t.reported_rate = r;
                let left =
                    t.resume_at.saturating_sub(now) + (t.remaining.max(0.0) / r).ceil() as u64;
                if let Some(id) = t.id {
                    self.state
                        .report_progress(id, left.max(1))
                        .with_context(|| {
                            format!("reporting progress of `{}`", self.jobs[k].name)
                        })?;
                }
            }
        }
        Ok(())
    }

    fn on_started(&mut self, id: JobId, now: u64) {
        let Some(&k) = self.by_id.get(&id) else {
            return;
        };
        let t = &mut self.track[k];
        t.running = true;
        t.first_start.get_or_insert(now);
        if t.restart_pending {
            t.resume_at = now + self.cfg.restart_overhead_ms;
            t.restart_pending = false;
        } else {
            t.resume_at = now;
        }
    }

    /// A preempted job waits with what it has left; a checkpointed one
    /// reports it, at the reference speed and its last worker count (the
    /// host already reset one without a checkpoint to its estimate).
    fn on_preempted(&mut self, id: JobId) -> anyhow::Result<()> {
        let Some(&k) = self.by_id.get(&id) else {
            return Ok(());
        };
        let t = &mut self.track[k];
        if !t.running {
            return Ok(());
        }
        t.running = false;
        t.rate = 0.0;
        t.reported_rate = 0.0;
        t.restart_pending = true;
        self.m.preemptions += 1;
        let spec = &self.jobs[k];
        if !spec.checkpointed {
            t.remaining = t.work;
            return Ok(());
        }
        let remaining = t.remaining;
        let Some(index) = self.state.job_index(id) else {
            return Ok(());
        };
        let workers = self.state.cluster().job(index).workers();
        let tp = throughput(self.cfg, spec, workers);
        if tp > 0.0 {
            let left = (remaining.max(0.0) / tp).ceil() as u64;
            self.state
                .report_progress(id, left.max(1))
                .with_context(|| format!("reporting progress of `{}`", spec.name))?;
        }
        Ok(())
    }

    fn round(&mut self, now: u64) -> anyhow::Result<()> {
        let report = self.driver.run_round(&mut self.state);
        self.m.rounds += 1;
        if !report.faults.is_empty() || !matches!(report.served, Served::Active(_)) {
            self.m.policy_faults += 1;
        }
        for id in &report.applied.preempted {
            self.on_preempted(*id)?;
        }
        for id in &report.applied.started {
            self.on_started(*id, now);
        }
        self.refresh_rates()
    }

    /// GPUs in use per node.
    fn used_per_node(&self) -> Vec<u32> {
        let cluster = self.state.cluster();
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

    /// Lends or takes back inference servers to match the demand at `now`.
    fn adjust_loans(&mut self, now: u64, demand: &InferenceDemand) -> anyhow::Result<bool> {
        if !self.cfg.loaning {
            return Ok(false);
        }
        let pool = self.inference.len();
        let u = demand.utilization_at(now);
        let needed = ((pool as f64) * u * (1.0 + self.cfg.headroom)).ceil() as usize;
        let floor = ((pool as f64) * self.cfg.min_inference_fraction).ceil() as usize;
        let needed = needed.max(floor).min(pool);
        let lendable = pool - needed;
        let on_loan = self.inference.iter().filter(|n| n.2).count();
        if lendable > on_loan {
            let mut more = lendable - on_loan;
            for n in self.inference.iter_mut().filter(|n| !n.2) {
                if more == 0 {
                    break;
                }
                self.state.set_node_loan(&n.0, true)?;
                self.state.set_node_state(&n.0, node_state::READY)?;
                n.2 = true;
                more -= 1;
            }
            Ok(true)
        } else if lendable < on_loan {
            self.reclaim(on_loan - lendable)?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Algorithm 1 against the exhaustive optimum on `request`, when the
    /// instance has at most [`OPTIMUM_MAX_SUBSETS`] server subsets.
    fn compare_with_optimum(&mut self, request: &ReclaimRequest) {
        let Ok((problem, _)) = aryl_core::policy::reclaim_problem(self.state.cluster(), request)
        else {
            return;
        };
        let count = request.count as usize;
        let Some(best) = aryl_core::reclaim::optimal_select(&problem, count, OPTIMUM_MAX_SUBSETS)
        else {
            return;
        };
        let greedy = aryl_core::reclaim::greedy_select(&problem, count);
        let (g, o) = (
            aryl_core::reclaim::preemptions(&problem, &greedy) as u64,
            aryl_core::reclaim::preemptions(&problem, &best) as u64,
        );
        self.m.optimum_instances += 1;
        self.m.optimum_greedy_preempted += g;
        self.m.optimum_preempted += o;
        if g == o {
            self.m.optimum_matches += 1;
        }
    }

    /// Asks each shadow rule the run's own reclaim question (state sealed
    /// and unchanged); records its plan's cost next to the run's own.
    fn ask_shadows(&mut self, request: &ReclaimRequest, running: usize, own: Option<PlanCost>) {
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
                .sync_to(&self.state)
                .and_then(|()| instance.reclaim(request.clone()));
            let Some(entry) = self.paired.get_mut(k + 1) else {
                continue;
            };
            // The same check as the run's own plan (the host core's).
            match plan.and_then(|plan| validate_plan(&self.state, request, &plan).map(|()| plan)) {
                Ok(plan) => {
                    let cost = plan_cost(self.state.cluster(), &plan.nodes, &plan.decisions);
                    entry.record(cost, running, count, per_node);
                }
                Err(_) => entry.faults += 1,
            }
        }
    }

    /// Takes `count` on-loan servers back through the policy's reclaim role.
    fn reclaim(&mut self, count: usize) -> anyhow::Result<()> {
        let span = tracing::info_span!("aryl_reclaim", count);
        let _guard = span.enter();
        let candidates: Vec<u32> = self.inference.iter().filter(|n| n.2).map(|n| n.1).collect();
        let before = self.used_per_node();
        let running_before = self.state.cluster().running_jobs().count();
        let Some(driver) = self.reclaimer.as_ref() else {
            bail!("reclaim without a reclaim role");
        };
        // The host core's reclaim driver: the policy's plan if it passes the
        // one plan check, else Smallest-Count-First on the host's side.
        let outcome = driver.reclaim(
            &mut self.state,
            &candidates,
            count as u32,
            RECLAIM_MAX_DECISIONS,
        );
        // The driver changed nothing yet: the optimum is judged on the same
        // state and request.
        self.compare_with_optimum(&outcome.request);
        let own = (outcome.served != Served::Native).then(|| {
            plan_cost(
                self.state.cluster(),
                &outcome.plan.nodes,
                &outcome.plan.decisions,
            )
        });
        if !outcome.faults.is_empty() {
            self.m.reclaim_faults += outcome.faults.len() as u64;
        }
        self.ask_shadows(&outcome.request, running_before, own);
        let (nodes, decisions) = (outcome.plan.nodes, outcome.plan.decisions);
        let mut scale_ins = 0;
        let mut preempted: Vec<JobId> = Vec::new();
        if !decisions.is_empty() {
            scale_ins = decisions
                .iter()
                .filter(|d| matches!(d, Decision::ScaleIn(..)))
                .count();
            let applied = self
                .state
                .apply(decisions)
                .context("applying a validated reclaim plan")?;
            preempted.extend(applied.preempted);
        }
        // The reclaim driver's plans empty the returned servers (its one
        // plan check; the native plan preempts everything there).
        if let Some(job) = self
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
                self.state.set_node_loan(&entry.0, false)?;
                self.state.set_node_state(&entry.0, node_state::CORDONED)?;
                entry.2 = false;
            }
        }
        let after = self.used_per_node();
        let elsewhere: u32 = (0..before.len() as u32)
            .filter(|n| !nodes.contains(n))
            .map(|n| before[n as usize].saturating_sub(after[n as usize]))
            .sum();
        for id in &preempted {
            self.on_preempted(*id)?;
        }
        self.refresh_rates()?;
        self.m.reclaims += 1;
        self.m.servers_reclaimed += count as u64;
        self.m.reclaim_preemptions += preempted.len() as u64;
        self.m.reclaim_scale_ins += scale_ins as u64;
        if running_before > 0 {
            self.preempted_share
                .push(100.0 * preempted.len() as f64 / running_before as f64);
        }
        self.collateral.push(
            100.0 * f64::from(elsewhere) / (count as f64 * f64::from(self.cfg.gpus_per_node)),
        );
        tracing::debug!(
            preempted = preempted.len(),
            scale_ins,
            elsewhere,
            "reclaim done"
        );
        Ok(())
    }
}

/// Policy configuration for the Aryl family: the seed (their Random
/// baseline's draws) and the speed-up law the model uses.
fn aryl_config(name: &str, cfg: &ArylSimConfig) -> Option<String> {
    if !name.starts_with("aryl") {
        return None;
    }
    let mut text = format!("random_seed = {}\n", cfg.seed & (i64::MAX as u64));
    if let Speedup::SubLinear { loss_per_step } = cfg.speedup {
        text.push_str(&format!(
            "speedup = \"sub-linear\"\nsublinear_loss = {loss_per_step}\n"
        ));
    }
    text.push_str(&cfg.policy_config);
    Some(text)
}

/// A configured instance of `compiled` for the host's reclaim calls.
fn reclaim_instance(
    compiled: &CompiledPolicy,
    cfg: &ArylSimConfig,
) -> anyhow::Result<PolicyInstance> {
    let name = &compiled.manifest.name;
    let mut instance = compiled
        .instantiate()
        .with_context(|| format!("instantiating `{name}` for reclaim"))?;
    let text = aryl_config(name, cfg).unwrap_or_else(|| compiled.manifest.default_config.clone());
    instance
        .configure(&text)
        .with_context(|| format!("configuring `{name}` for reclaim"))?;
    Ok(instance)
}

/// Runs one policy on the Aryl model.
///
/// `shadows`: other reclaim rules (components with a `reclaim` role) asked
/// the same question at every reclaim, for [`ArylMetrics::paired`].
pub fn run_aryl(
    workload: &ArylWorkload,
    demand: &InferenceDemand,
    compiled: &CompiledPolicy,
    cfg: &ArylSimConfig,
    shadows: &[CompiledPolicy],
) -> anyhow::Result<ArylMetrics> {
    let name = compiled.manifest.name.clone();
    let span = tracing::info_span!("sim_aryl", policy = %name, loaning = cfg.loaning, elastic = cfg.elastic);
    let _guard = span.enter();
    let started = Instant::now();
    if cfg.gpus_per_node == 0 || cfg.training_nodes == 0 {
        bail!("the training pool needs servers with GPUs");
    }
    if !(cfg.inference_speed.is_finite() && cfg.inference_speed > 0.0) {
        bail!("inference_speed must be positive");
    }
    if cfg.round_interval_ms == 0 {
        bail!("round_interval_ms must be positive");
    }
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
    let config = aryl_config(&name, cfg);
    let slot = Arc::new(PolicySlot::new(name.clone()));
    slot.swap(
        compiled.clone(),
        config.clone(),
        None,
        Some(state.snapshot()),
    )
    .with_context(|| format!("loading policy `{name}`"))?;
    let has_reclaim = |c: &CompiledPolicy| c.manifest.roles.iter().any(|r| r == "reclaim");
    let reclaimer = if cfg.loaning && has_reclaim(compiled) {
        // Its own slot, so its instance (and the policy's state in it) is
        // not the scheduler's.
        let slot = Arc::new(PolicySlot::new(format!("{name}/reclaim")));
        slot.swap(compiled.clone(), config.clone(), None, None)
            .with_context(|| format!("loading `{name}` for reclaim"))?;
        Some(ReclaimDriver::new(slot))
    } else {
        None
    };
    let mut paired = vec![PairedReclaim {
        policy: name.clone(),
        ..PairedReclaim::default()
    }];
    let mut shadow_instances = Vec::new();
    if reclaimer.is_some() {
        for shadow in shadows {
            if !has_reclaim(shadow) {
                bail!("shadow `{}` has no reclaim role", shadow.manifest.name);
            }
            shadow_instances.push(reclaim_instance(shadow, cfg)?);
            paired.push(PairedReclaim {
                policy: shadow.manifest.name.clone(),
                ..PairedReclaim::default()
            });
        }
    }
    let jobs = &workload.jobs;
    let track = jobs
        .iter()
        .map(|j| {
            let work = j.duration_ms as f64 * throughput(cfg, j, j.workers);
            Track {
                work,
                remaining: work,
                ..Track::default()
            }
        })
        .collect();
    let mut model = Model {
        cfg,
        jobs,
        state,
        driver: RoundDriver::new(slot),
        reclaimer,
        shadows: shadow_instances,
        paired,
        track,
        active: Vec::new(),
        by_id: HashMap::new(),
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
    };
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&k| (jobs[k].arrival_ms, k));
    let last_arrival = jobs.iter().map(|j| j.arrival_ms).max().unwrap_or(0);
    let horizon = last_arrival.saturating_add(cfg.drain_ms);
    let interval = cfg.round_interval_ms;
    let training_gpus = f64::from(cfg.training_nodes * cfg.gpus_per_node);
    let inference_gpus = f64::from(cfg.inference_nodes * cfg.gpus_per_node);
    let (mut train_int, mut comb_int, mut loan_used_int, mut loan_cap_int, mut loaned_int) =
        (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut next_arrival = 0usize;
    let mut now = 0u64;
    let mut dirty = false;
    let mut next_bucket = 0u64;
    let mut finished = 0usize;
    loop {
        // Next event.
        let mut t_next = u64::MAX;
        if let Some(&k) = order.get(next_arrival) {
            t_next = t_next.min(jobs[k].arrival_ms);
        }
        for t in model
            .active
            .iter()
            .map(|&k| &model.track[k])
            .filter(|t| t.running && t.rate > 0.0)
        {
            let begin = now.max(t.resume_at);
            let done = begin as f64 + (t.remaining.max(0.0) / t.rate).ceil();
            t_next = t_next.min(done.min(u64::MAX as f64) as u64);
        }
        let all_done = finished == jobs.len();
        if cfg.loaning && !all_done {
            t_next = t_next.min(next_bucket);
        }
        if dirty {
            t_next = t_next.min(now.div_ceil(interval) * interval);
        }
        if t_next == u64::MAX || all_done || t_next > horizon {
            break;
        }
        let t_next = t_next.max(now);
        // Usage integrals over the arrival window.
        if now < last_arrival {
            let dt = (t_next.min(last_arrival) - now) as f64;
            let used = model.used_per_node();
            let train: u32 = used[..cfg.training_nodes as usize].iter().sum();
            let all: u32 = used.iter().sum();
            let loaned: Vec<&(String, u32, bool)> =
                model.inference.iter().filter(|n| n.2).collect();
            let loan_used: u32 = loaned.iter().map(|n| used[n.1 as usize]).sum();
            let inf_busy = demand.utilization_at(now) * inference_gpus;
            train_int += dt * f64::from(train) / training_gpus;
            comb_int += dt * (f64::from(all) + inf_busy) / (training_gpus + inference_gpus);
            loan_used_int += dt * f64::from(loan_used);
            loan_cap_int += dt * (loaned.len() as f64) * f64::from(cfg.gpus_per_node);
            loaned_int += dt * loaned.len() as f64;
        }
        model.advance(now, t_next);
        now = t_next;
        model.state.set_now(now);
        // Completions.
        let done: Vec<usize> = model
            .active
            .iter()
            .copied()
            .filter(|&k| {
                let t = &model.track[k];
                t.running && t.rate > 0.0 && now >= t.resume_at && t.remaining <= 1e-6 * t.work
            })
            .collect();
        model.active.retain(|k| !done.contains(k));
        for k in done {
            let t = &mut model.track[k];
            t.running = false;
            t.rate = 0.0;
            t.end = Some(now);
            finished += 1;
            if let Some(id) = t.id {
                model
                    .state
                    .remove(id)
                    .with_context(|| format!("removing finished `{}`", jobs[k].name))?;
                model.by_id.remove(&id);
            }
            dirty = true;
        }
        // Arrivals.
        while let Some(&k) = order.get(next_arrival) {
            if jobs[k].arrival_ms > now {
                break;
            }
            let id = model
                .state
                .submit(jobs[k].request(cfg.elastic))
                .with_context(|| format!("submitting `{}`", jobs[k].name))?;
            model.track[k].id = Some(id);
            model.by_id.insert(id, k);
            next_arrival += 1;
            dirty = true;
        }
        // Loaning.
        if cfg.loaning && now >= next_bucket {
            if model.adjust_loans(now, demand)? {
                dirty = true;
            }
            next_bucket = (now / demand.bucket_ms.max(1) + 1) * demand.bucket_ms.max(1);
        }
        if dirty && now.is_multiple_of(interval) {
            model.round(now)?;
            dirty = false;
        }
    }
    let arrival_span = last_arrival.max(1) as f64;
    let mut queue = Vec::new();
    let mut jct = Vec::new();
    for (job, t) in jobs.iter().zip(&model.track) {
        if let Some(s) = t.first_start {
            queue.push((s - job.arrival_ms) as f64 / 1000.0);
        }
        if let Some(e) = t.end {
            jct.push((e - job.arrival_ms) as f64 / 1000.0);
        }
    }
    let m = &mut model.m;
    m.completed = jct.len();
    m.unfinished = jobs.len() - jct.len();
    m.avg_queue_s = mean(&queue);
    m.p50_queue_s = percentile(&queue, 50.0);
    m.p95_queue_s = percentile(&queue, 95.0);
    m.avg_jct_s = mean(&jct);
    m.p50_jct_s = percentile(&jct, 50.0);
    m.p95_jct_s = percentile(&jct, 95.0);
    m.training_usage_pct = 100.0 * train_int / arrival_span;
    m.combined_usage_pct = 100.0 * comb_int / arrival_span;
    m.loaned_usage_pct = if loan_cap_int > 0.0 {
        100.0 * loan_used_int / loan_cap_int
    } else {
        0.0
    };
    m.mean_loaned_servers = loaned_int / arrival_span;
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
    pub compiled: CompiledPolicy,
    pub config: ArylSimConfig,
    /// Reclaim rules asked the same questions (see [`ArylMetrics::paired`]).
    pub shadows: Vec<CompiledPolicy>,
}

/// Runs `cases` on up to `threads` threads; results in case order.
pub fn run_cases(
    workload: &ArylWorkload,
    demand: &InferenceDemand,
    cases: &[ArylCase],
    threads: usize,
) -> anyhow::Result<Vec<ArylMetrics>> {
    crate::parallel_map(cases, threads, |case| {
        run_aryl(
            workload,
            demand,
            &case.compiled,
            &case.config,
            &case.shadows,
        )
        .map(|mut m| {
            m.policy = case.label.clone();
            m
        })
    })
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
        let compile = |name: &str| -> anyhow::Result<CompiledPolicy> {
            let bytes = arbiter_policies::get(name)
                .with_context(|| format!("`{name}` is not a built-in policy"))?;
            engine
                .compile(bytes)
                .with_context(|| format!("compiling `{name}`"))
        };
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
pub fn comparison_cases(p: &ComparisonPolicies, base: &ArylSimConfig) -> Vec<ArylCase> {
    let no_elastic = ArylSimConfig {
        elastic: false,
        ..base.clone()
    };
    let case =
        |label: &str, compiled: &CompiledPolicy, config: &ArylSimConfig, paired: bool| ArylCase {
            label: label.to_string(),
            compiled: compiled.clone(),
            config: config.clone(),
            shadows: if paired {
                vec![p.random.clone(), p.scf.clone()]
            } else {
                Vec::new()
            },
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
    pub protocol: crate::Protocol,
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
    if scale.training_nodes == 0 {
        bail!("--training-nodes must be at least 1");
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
    let engine = crate::engine(std::time::Duration::from_millis(args.deadline_ms.max(1)))?;
    let policies = ComparisonPolicies::builtin(&engine)?;
    let base = ArylSimConfig {
        training_nodes: scale.training_nodes,
        inference_nodes: scale.inference_nodes,
        seed: args.seed,
        // `--config` reaches the Aryl family (e.g. `slow_spill = "always"`).
        policy_config: args.config.clone().unwrap_or_default(),
        ..ArylSimConfig::default()
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_cases(
        &workload,
        &demand,
        &comparison_cases(&policies, &base),
        threads,
    )?;
    let headline = headline(&runs)?;
    Ok(ArylReport {
        protocol: crate::Protocol::Aryl,
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
