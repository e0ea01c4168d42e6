//! Online services sharing their GPUs with offline training (MuxFlow, 2023): a matcher that
//! pairs offline jobs with services' GPUs every scheduling interval, a node coordinator
//! (`sysmonitor`) run as Wasm in virtual time on every node, and the GPU physics of
//! [`truth`].
//!
//! The world:
//!
//! * **Services** hold one GPU each for the whole run (guaranteed inference jobs, placed by
//!   the scheduler at the start). Each replays a load series (its duty cycle alone, one value
//!   per `sample_ms`, from the start again when it runs out) and a memory series (a share of
//!   the GPU's memory).
//! * **Offline jobs** (opportunistic, one GPU, checkpointing) arrive at stated times. Only the
//!   matcher places them: every `match_interval_ms` the host's [`MatcherDriver`] asks the
//!   matcher policy (as Wasm) to pair the pending and running offline jobs with the services,
//!   validates the pairings and applies them through the one apply path; a pairing's SM share
//!   becomes the job's MPS active-thread share. A running job the matcher moves pays
//!   `restart_ms` (checkpoint and restart) before it runs again; so does an evicted one.
//! * **Each GPU's physics** is [`truth::share_gpu`] under the scenario's [`Sharing`]: the
//!   offline job's speed, the service's kernel stretch, what NVML shows.
//! * **The node coordinator.** With one, every `coordinator_period_ms` each node's
//!   coordinator sees its GPUs as a node would show them (utilization, SM activity, SM clock,
//!   memory, health) and its workloads (the services as online, role 0; the offline jobs as
//!   offline, role 1, with their compute share, memory limit and freeze bit), through the host
//!   core's [`CoordinatorDriver`]. Its compute shares pace the offline jobs, its `evict`
//!   requeues them, its `set-health` reaches the cluster view (the matcher pairs only with
//!   Healthy GPUs, X10).
//! * **Metrics** ([`MuxflowMetrics`]): the services' mean and 99th-percentile response times
//!   against what they would have been alone (each service an M/M/1 queue, requests in
//!   proportion to its load), the offline jobs' completion times and MuxFlow's oversold GPU
//!   (Eq. 3), GPU utilization, SM activity and memory, evictions.
//!
//! Every constant not from the paper is a field of [`MuxflowSimConfig`] or [`truth::Physics`],
//! our choice its default; `docs/reproductions/muxflow.md` says which and how sensitive the
//! results are.

pub mod truth;

use crate::core::{self, LoopRules, Progress, ProgressRules, RunPolicy, SimCtx, SimHost};
use crate::metrics::mean;
use crate::models::ModelConfigFile;
use anyhow::{Context, bail};
use arbiter_host::roles::coordinator::{CoordinatorDriver, NodeSurface};
use arbiter_host::roles::matcher::MatcherDriver;
use arbiter_host::state::{Applied, ClusterState, JobId, JobRequest, NodeRequest};
use arbiter_policy_sdk::model::{
    GpuMetric, GpuStatus, NodeAction, NodeView, SharingRules, WorkerPlacement, WorkloadProfile,
    WorkloadStatus, health, job_kind, qos,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
pub use truth::{Physics, Sharing};

const MINUTE_MS: f64 = 60_000.0;
/// Workload ids of services carry this bit (offline ids are `job << 8 | local GPU`).
const SERVICE_ID: u32 = 1 << 31;

/// How one offline model trains on one GPU alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineModel {
    /// Share of the SMs it keeps busy alone, in (0, 1].
    pub fill: f64,
    /// Mini-batch time alone, ms (its profile's solo time).
    pub iteration_ms: u32,
}

/// The four offline models of MuxFlow §7.1, as this simulator's ground truth (ours: how
/// fully each keeps a T4's SMs busy at the batch the 40 % memory quota allows).
pub fn section_7_1_models() -> BTreeMap<String, OfflineModel> {
    let m = |fill, iteration_ms| OfflineModel { fill, iteration_ms };
    BTreeMap::from([
        ("resnet50".to_string(), m(0.90, 180)),
        ("vgg16".to_string(), m(0.95, 260)),
        ("densenet201".to_string(), m(0.75, 240)),
        ("inception-v3".to_string(), m(0.85, 210)),
    ])
}

/// One online service: its load and memory series.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePlan {
    pub name: String,
    /// Duty cycle alone per sample, in [0, 1].
    pub load: Vec<f64>,
    /// GPU memory it holds per sample, share of the GPU, in [0, 1].
    pub memory: Vec<f64>,
}

/// One offline job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflinePlan {
    pub name: String,
    /// A key of [`MuxflowSimConfig::models`].
    pub model: String,
    pub arrival_min: f64,
    /// Run time alone on a whole GPU, minutes.
    pub minutes: f64,
}

/// The scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MuxflowSimConfig {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub gpu_memory_mib: u32,
    pub max_sm_clock_mhz: u32,
    pub sharing: Sharing,
    pub physics: Physics,
    pub models: BTreeMap<String, OfflineModel>,
    /// At most one per GPU.
    pub services: Vec<ServicePlan>,
    pub offline: Vec<OfflinePlan>,
    /// The offline job's memory, share of the GPU (MuxFlow §7.1 sizes the batch to the 40 %
    /// quota).
    pub offline_memory: f64,
    /// Range of the pairs' sensitivity (Fig. 4: "up to 50 %" across pairs); each
    /// (service, model) pair draws one, deterministically from `seed`.
    pub pair_sensitivity: (f64, f64),
    pub seed: u64,
    /// Step of the services' series (the GenAI trace samples every 57–60 s).
    pub sample_ms: u64,
    /// Control period of every node's coordinator (ours).
    pub coordinator_period_ms: u64,
    /// MuxFlow's scheduling interval (15 min on the testbed, §7.2).
    pub match_interval_ms: u64,
    /// Each matching reconsiders the running offline jobs too (MuxFlow's periodic global
    /// rescheduling with checkpoint/restart, X4); otherwise only pending jobs and services
    /// without offline work are matched (the baselines place once).
    pub reschedule_running: bool,
    /// Checkpoint and restart of a moved or evicted offline job (ours).
    pub restart_ms: u64,
    pub horizon_ms: u64,
}

impl Default for MuxflowSimConfig {
    fn default() -> Self {
        MuxflowSimConfig {
            nodes: 1,
            gpus_per_node: 8,
            gpu_memory_mib: 16_384,
            max_sm_clock_mhz: 1_590,
            sharing: Sharing::Mps,
            physics: Physics::default(),
            models: section_7_1_models(),
            services: Vec::new(),
            offline: Vec::new(),
            offline_memory: 0.4,
            pair_sensitivity: (0.1, 0.5),
            seed: 1,
            sample_ms: 60_000,
            coordinator_period_ms: 10_000,
            match_interval_ms: 15 * 60_000,
            reschedule_running: true,
            restart_ms: 60_000,
            horizon_ms: 48 * 3_600_000,
        }
    }
}

impl ModelConfigFile for MuxflowSimConfig {
    const WHAT: &'static str = "the MuxFlow scenario";

    fn check(&self) -> anyhow::Result<()> {
        if self.nodes == 0 || self.gpus_per_node == 0 || self.gpus_per_node > 256 {
            bail!("the cluster needs nodes with 1..=256 GPUs");
        }
        self.physics.check().map_err(anyhow::Error::msg)?;
        let gpus = self.nodes as usize * self.gpus_per_node as usize;
        if self.services.len() > gpus {
            bail!(
                "{} services for {gpus} GPUs: at most one per GPU",
                self.services.len()
            );
        }
        for s in &self.services {
            let unit = |v: &[f64]| v.iter().all(|x| x.is_finite() && (0.0..=1.0).contains(x));
            if s.load.is_empty() || s.memory.is_empty() || !unit(&s.load) || !unit(&s.memory) {
                bail!(
                    "service `{}`: load and memory are non-empty series in [0, 1]",
                    s.name
                );
            }
        }
        for (name, m) in &self.models {
            if !(m.fill > 0.0 && m.fill <= 1.0) {
                bail!("model `{name}`: fill must be in (0, 1]");
            }
        }
        if self.offline.len() >= 1 << 23 {
            bail!("at most 8,388,607 offline jobs per scenario");
        }
        for j in &self.offline {
            if !self.models.contains_key(&j.model) {
                bail!("offline job `{}`: no model `{}`", j.name, j.model);
            }
            if !(j.minutes.is_finite() && j.minutes > 0.0 && j.arrival_min.is_finite())
                || j.arrival_min < 0.0
            {
                bail!(
                    "offline job `{}`: minutes positive, arrival non-negative",
                    j.name
                );
            }
        }
        let (lo, hi) = self.pair_sensitivity;
        if !(0.0..=1.0).contains(&lo) || !(lo..=1.0).contains(&hi) {
            bail!("pair_sensitivity must be a range within [0, 1]");
        }
        if !(self.offline_memory > 0.0 && self.offline_memory <= 1.0) {
            bail!("offline_memory must be in (0, 1]");
        }
        if self.sample_ms == 0 || self.coordinator_period_ms == 0 || self.match_interval_ms == 0 {
            bail!("periods must be positive");
        }
        Ok(())
    }
}

/// MuxFlow's oversold GPU (Eq. 3, §7.1 "Metrics") over (T_sep, T_real) pairs — a job's run
/// time alone and the time it ran sharing, in one unit: how much of a GPU the offline jobs got.
/// The extracted text reads Σ T_real / Σ T_sep, which is at least 1 whenever sharing slows the
/// offline work down and so contradicts the range the paper states, [0, 1] ("0 represents that
/// the offline workloads get no GPU computation resource, and 1 … equivalent GPU computation
/// resources as they are executed exclusively"); we use the reading that fits it, Σ T_sep /
/// Σ T_real. 0 when nothing ran.
pub fn oversold_gpu(runs: &[(f64, f64)]) -> f64 {
    let (sep, real) = runs.iter().fold((0.0, 0.0), |(s, r), &(a, b)| {
        (s + a.max(0.0), r + b.max(0.0))
    });
    if real > 0.0 { sep / real } else { 0.0 }
}

/// One offline job's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OfflineRow {
    pub name: String,
    pub model: String,
    pub submit_min: f64,
    pub start_min: Option<f64>,
    pub end_min: Option<f64>,
    /// Submit → end, when finished.
    pub jct_min: Option<f64>,
    /// Run time alone (`T_sep` of Eq. 3) and time it ran (`T_real`), minutes.
    pub alone_min: f64,
    pub ran_min: f64,
    pub evictions: u32,
    pub migrations: u32,
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MuxflowMetrics {
    pub matcher: Option<String>,
    pub coordinator: Option<String>,
    pub sharing: Sharing,
    pub offline: Vec<OfflineRow>,
    /// The services' mean and 99th-percentile response times over what they would be alone.
    pub latency_mean_ratio: f64,
    pub latency_p99_ratio: f64,
    pub mean_jct_min: f64,
    pub makespan_min: f64,
    /// Eq. 3: Σ T_sep / Σ T_real over the finished offline jobs (our reading: the share of a
    /// GPU the offline jobs got; in [0, 1]).
    pub oversold_gpu: f64,
    /// Time- and GPU-averaged, in [0, 1]: with the offline jobs, and the services alone.
    pub utilization: f64,
    pub utilization_alone: f64,
    pub sm_activity: f64,
    pub sm_activity_alone: f64,
    pub memory: f64,
    pub memory_alone: f64,
    /// Offline executions (starts) and how many ended in an eviction.
    pub executions: u64,
    pub evictions: u64,
    pub migrations: u64,
    pub unfinished: usize,
    pub matchings: u64,
    pub matcher_faults: u64,
    pub coordinator_steps: u64,
    pub coordinator_faults: u64,
    pub wall_seconds: f64,
}

/// A node's limits on one offline job.
#[derive(Clone, Copy, Debug)]
struct Control {
    pacing: f64,
    frozen: bool,
    limit_mib: u32,
}

struct OfflineJob {
    plan: OfflinePlan,
    model: OfflineModel,
    arrival_ms: u64,
    /// The MPS active-thread share of its latest pairing.
    sm_share: f64,
    ran_ms: u64,
    evictions: u32,
    migrations: u32,
    finished: bool,
}

/// Per-interval sums for the metrics.
#[derive(Default)]
struct Sums {
    /// (request weight, mean response time over the service time) per GPU interval.
    shared: Vec<(f64, f64)>,
    alone: Vec<(f64, f64)>,
    busy: f64,
    busy_alone: f64,
    sm: f64,
    sm_alone: f64,
    memory: f64,
    memory_alone: f64,
    gpu_ms: f64,
}

struct MuxflowModel<'a> {
    cfg: &'a MuxflowSimConfig,
    jobs: Vec<OfflineJob>,
    order: Vec<usize>,
    next_arrival: usize,
    /// Host ids of the services, by service index.
    service_ids: Vec<JobId>,
    /// The service on each global GPU, once placed.
    service_on: HashMap<u32, usize>,
    /// The offline job on each global GPU.
    offline_on: HashMap<u32, usize>,
    controls: HashMap<usize, Control>,
    /// Health each coordinator published, per global GPU.
    health: HashMap<u32, u8>,
    matcher: Option<MatcherDriver>,
    coordinators: Vec<CoordinatorDriver>,
    next_sample: u64,
    next_tick: u64,
    next_match: u64,
    /// The round that places the services has run: offline jobs arrive from then on (a
    /// round must never see one: offline work is the matcher's to place).
    services_round_done: bool,
    /// Each service's load summed since the last matching, and over how long (its profile).
    profile_load: Vec<(f64, f64)>,
    sums: Sums,
    m: MuxflowMetrics,
}

/// Workload id of offline job `job` on local GPU `local`.
fn offline_id(job: usize, local: u32) -> u32 {
    ((job as u32) << 8) | (local & 0xff)
}

/// A deterministic draw in [0, 1) from `(seed, a, b)` (SplitMix64).
fn unit_hash(seed: u64, a: u64, b: u64) -> f64 {
    let mut z =
        seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl MuxflowModel<'_> {
    fn sample(&self, series: &[f64], now: u64) -> f64 {
        let i = (now / self.cfg.sample_ms) as usize;
        series.get(i % series.len().max(1)).copied().unwrap_or(0.0)
    }

    fn load_of(&self, service: usize, now: u64) -> f64 {
        self.sample(&self.cfg.services[service].load, now)
    }

    fn control(&self, job: usize) -> Control {
        self.controls.get(&job).copied().unwrap_or(Control {
            pacing: 1.0,
            frozen: false,
            limit_mib: u32::MAX,
        })
    }

    fn pair_sensitivity(&self, service: usize, model: &str) -> f64 {
        let (lo, hi) = self.cfg.pair_sensitivity;
        let m = model
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b)));
        lo + (hi - lo) * unit_hash(self.cfg.seed, service as u64, m)
    }

    /// The ground truth on global GPU `gpu` at `now`.
    fn outcome(&self, gpu: u32, now: u64) -> truth::GpuOutcome {
        let Some(&service) = self.service_on.get(&gpu) else {
            // No service (not placed yet): the offline job, if any, has the GPU.
            let speed = self.offline_on.get(&gpu).map_or(0.0, |&k| {
                let c = self.control(k);
                if c.frozen { 0.0 } else { c.pacing }
            });
            return truth::GpuOutcome {
                offline_speed: speed,
                kernel_stretch: 1.0,
                utilization: speed,
                clock: 1.0,
                ..truth::GpuOutcome::default()
            };
        };
        let load = self.load_of(service, now);
        let offline = self.offline_on.get(&gpu).map(|&k| {
            let job = &self.jobs[k];
            let c = self.control(k);
            truth::Offline {
                fill: job.model.fill,
                pair_sensitivity: self.pair_sensitivity(service, &job.plan.model),
                sm_share: job.sm_share,
                pacing: if c.frozen { 0.0 } else { c.pacing },
            }
        });
        truth::share_gpu(&self.cfg.physics, self.cfg.sharing, load, offline)
    }

    fn memory_used(&self, gpu: u32, now: u64) -> f64 {
        let service = self
            .service_on
            .get(&gpu)
            .map_or(0.0, |&s| self.sample(&self.cfg.services[s].memory, now));
        let total = f64::from(self.cfg.gpu_memory_mib);
        let offline = self.offline_on.get(&gpu).map_or(0.0, |&k| {
            let limit = f64::from(self.control(k).limit_mib) / total;
            self.cfg.offline_memory.min(limit)
        });
        (service + offline).min(1.0)
    }

    /// Rebuilds which job runs on which GPU from the cluster view.
    fn refresh_placements(&mut self, ctx: &SimCtx) {
        self.offline_on.clear();
        let state = &ctx.host.state;
        let cluster = state.cluster();
        for job in cluster.running_jobs() {
            let Some(id) = state.records().get(job.index() as usize).map(|r| r.id) else {
                continue;
            };
            let gpus = job.placement().iter().flat_map(|w| w.gpus.clone());
            match ctx.progress.job_of(id) {
                Some(k) => {
                    for g in gpus {
                        self.offline_on.insert(g, k);
                    }
                }
                None => {
                    if let Some(s) = self.service_ids.iter().position(|&x| x == id) {
                        for g in gpus {
                            self.service_on.insert(g, s);
                        }
                    }
                }
            }
        }
    }

    /// Requeues offline job `k` (a coordinator evicted it).
    fn evict(&mut self, ctx: &mut SimCtx, k: usize, now: u64) -> anyhow::Result<()> {
        let Some(id) = ctx.progress.track(k).id else {
            return Ok(());
        };
        if ctx.host.state.job_index(id).is_none() {
            return Ok(());
        }
        ctx.host
            .state
            .evict(id)
            .with_context(|| format!("evicting `{}`", self.jobs[k].plan.name))?;
        ctx.progress.preempted(id, now);
        self.jobs[k].evictions += 1;
        self.m.evictions += 1;
        self.controls.remove(&k);
        self.refresh_placements(ctx);
        core::apply(self, ctx, &Applied::default(), now)
    }

    /// One control period of every node's coordinator.
    fn coordinate(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<()> {
        let drivers = std::mem::take(&mut self.coordinators);
        let mut evictions = Vec::new();
        let mut health = Vec::new();
        for (node, driver) in drivers.iter().enumerate() {
            let mut surface = SimNode {
                model: self,
                ctx: &*ctx,
                node: node as u32,
                now,
                evictions: &mut evictions,
                health: &mut health,
            };
            let step = driver.step(&mut surface);
            self.m.coordinator_steps += 1;
            self.m.coordinator_faults += u64::from(!step.faults.is_empty());
        }
        self.coordinators = drivers;
        for (node, local, h) in health {
            let name = node_name(node);
            ctx.host
                .state
                .set_gpu_health(&name, local, h)
                .with_context(|| format!("publishing the health of {name} GPU {local}"))?;
        }
        evictions.sort_unstable();
        evictions.dedup();
        for k in evictions {
            self.evict(ctx, k, now)?;
        }
        // New compute shares and freezes change the rates.
        core::apply(self, ctx, &Applied::default(), now)
    }

    /// One matching: the matcher pairs the pending and running offline jobs with the services.
    fn match_offline(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<()> {
        let Some(driver) = self.matcher.as_ref() else {
            return Ok(());
        };
        let state = &ctx.host.state;
        let cluster = state.cluster();
        let mut online = Vec::new();
        let mut offline = Vec::new();
        let mut profiles = Vec::new();
        let occupied: std::collections::HashSet<usize> = self
            .service_on
            .iter()
            .filter(|(g, _)| self.offline_on.contains_key(g))
            .map(|(_, &s)| s)
            .collect();
        for (s, id) in self.service_ids.iter().enumerate() {
            let Some(i) = state.job_index(*id) else {
                continue;
            };
            if !cluster.job(i).is_running()
                || (!self.cfg.reschedule_running && occupied.contains(&s))
            {
                continue;
            }
            online.push(i);
            let (sum, span) = self.profile_load[s];
            let load = if span > 0.0 {
                sum / span
            } else {
                self.load_of(s, now)
            };
            let pct = |v: f64| (v * 100.0).round().clamp(0.0, 100.0) as u8;
            profiles.push(WorkloadProfile {
                job: i,
                utilization_pct: pct(load),
                sm_activity_pct: pct(self.cfg.physics.sm_per_load * load),
                ..WorkloadProfile::default()
            });
        }
        for (k, job) in self.jobs.iter().enumerate() {
            let Some(id) = ctx.progress.track(k).id else {
                continue;
            };
            let Some(i) = state.job_index(id) else {
                continue;
            };
            if !self.cfg.reschedule_running && cluster.job(i).is_running() {
                continue;
            }
            offline.push(i);
            let pct = (job.model.fill * 100.0).round().clamp(0.0, 100.0) as u8;
            profiles.push(WorkloadProfile {
                job: i,
                utilization_pct: 100,
                sm_activity_pct: pct,
                sm_occupancy_pct: pct,
                solo_iteration_ms: job.model.iteration_ms,
                ..WorkloadProfile::default()
            });
        }
        self.profile_load.iter_mut().for_each(|p| *p = (0.0, 0.0));
        if online.is_empty() || offline.is_empty() {
            return Ok(());
        }
        online.sort_unstable();
        offline.sort_unstable();
        profiles.sort_unstable_by_key(|p| p.job);
        let outcome = driver.match_workloads(&mut ctx.host.state, &online, &offline, profiles);
        self.m.matchings += 1;
        self.m.matcher_faults += u64::from(!outcome.faults.is_empty());
        let applied = if outcome.decisions.is_empty() {
            Applied::default()
        } else {
            ctx.host
                .state
                .apply(outcome.decisions.clone())
                .context("applying the matcher's validated pairings")?
        };
        for p in &outcome.pairings {
            let Some(id) = ctx
                .host
                .state
                .records()
                .get(p.offline as usize)
                .map(|r| r.id)
            else {
                continue;
            };
            if let Some(k) = ctx.progress.job_of(id) {
                self.jobs[k].sm_share = f64::from(p.sm_percent.clamp(1, 100)) / 100.0;
            }
        }
        for id in applied.moved().collect::<Vec<_>>() {
            if let Some(k) = ctx.progress.job_of(id) {
                self.jobs[k].migrations += 1;
                self.m.migrations += 1;
                // A new GPU: the node's controls start afresh; checkpoint and restart.
                self.controls.remove(&k);
                ctx.progress.pause_until(k, now, now + self.cfg.restart_ms);
            }
        }
        self.refresh_placements(ctx);
        core::apply(self, ctx, &applied, now)
    }
}

fn node_name(node: u32) -> String {
    format!("t4-{node}")
}

/// One simulated node as its coordinator sees it.
struct SimNode<'m, 'a, 'c, 'o> {
    model: &'m mut MuxflowModel<'a>,
    ctx: &'c SimCtx,
    node: u32,
    now: u64,
    /// Offline jobs the coordinator evicted (carried out after the step).
    evictions: &'o mut Vec<usize>,
    /// (node, local GPU, health) it published.
    health: &'o mut Vec<(u32, u32, u8)>,
}

impl SimNode<'_, '_, '_, '_> {
    fn gpu_range(&self) -> std::ops::Range<u32> {
        self.ctx.host.state.cluster().node(self.node).gpu_range()
    }
}

impl NodeSurface for SimNode<'_, '_, '_, '_> {
    fn view(&mut self) -> NodeView {
        let m = &*self.model;
        let cfg = m.cfg;
        let range = self.gpu_range();
        let pct = |v: f64| (v * 100.0).round().clamp(0.0, 100.0) as u8;
        let mut gpus = Vec::new();
        let mut workloads = Vec::new();
        for g in range.clone() {
            let local = g - range.start;
            let o = m.outcome(g, self.now);
            let memory = m.memory_used(g, self.now);
            gpus.push(GpuStatus {
                index: local,
                utilization_pct: pct(o.utilization),
                sm_activity_pct: pct(o.sm_activity),
                sm_clock_mhz: (f64::from(cfg.max_sm_clock_mhz) * o.clock).round() as u32,
                max_sm_clock_mhz: cfg.max_sm_clock_mhz,
                memory_used_mib: (memory * f64::from(cfg.gpu_memory_mib)).round() as u32,
                memory_total_mib: cfg.gpu_memory_mib,
                health: m.health.get(&g).copied().unwrap_or(health::HEALTHY),
                observed_ok: true,
                ..GpuStatus::default()
            });
            let total = f64::from(cfg.gpu_memory_mib);
            if let Some(&s) = m.service_on.get(&g) {
                workloads.push(WorkloadStatus {
                    id: SERVICE_ID | s as u32,
                    gpu: local,
                    role: 0,
                    memory_used_mib: (m.sample(&cfg.services[s].memory, self.now) * total) as u32,
                    memory_limit_mib: cfg.gpu_memory_mib,
                    compute_share: 1000,
                    job: cfg.services[s].name.clone(),
                    qos: qos::GUARANTEED,
                    ..WorkloadStatus::default()
                });
            }
            if let Some(&k) = m.offline_on.get(&g) {
                let c = m.control(k);
                let job = &m.jobs[k];
                workloads.push(WorkloadStatus {
                    id: offline_id(k, local),
                    gpu: local,
                    role: 1,
                    memory_used_mib: (cfg.offline_memory * total).min(f64::from(c.limit_mib))
                        as u32,
                    memory_limit_mib: c.limit_mib.min(cfg.gpu_memory_mib),
                    compute_share: (c.pacing * 1000.0).round() as u32,
                    iteration_ms: if o.offline_speed > 0.0 {
                        (f64::from(job.model.iteration_ms) / o.offline_speed)
                            .round()
                            .min(f64::from(u32::MAX)) as u32
                    } else {
                        0
                    },
                    frozen: c.frozen,
                    job: job.plan.name.clone(),
                    qos: qos::OPPORTUNISTIC,
                    ..WorkloadStatus::default()
                });
            }
        }
        NodeView {
            now_ms: self.now,
            monotonic_ms: self.now,
            gpus,
            workloads,
            host_memory_total_mib: 128 * 1024,
            ..NodeView::default()
        }
    }

    fn apply_actions(&mut self, actions: &[NodeAction]) -> Vec<Result<(), String>> {
        let range = self.gpu_range();
        actions
            .iter()
            .map(|a| {
                let w = match *a {
                    NodeAction::SetHealth(gpu, h) => {
                        if gpu >= range.len() as u32 {
                            return Err(format!("no GPU {gpu} on node {}", self.node));
                        }
                        self.model.health.insert(range.start + gpu, h);
                        self.health.push((self.node, gpu, h));
                        return Ok(());
                    }
                    NodeAction::SetMemoryLimit(w, _)
                    | NodeAction::SetComputeShare(w, _)
                    | NodeAction::Freeze(w)
                    | NodeAction::Resume(w)
                    | NodeAction::Evict(w) => w,
                    _ => return Err(format!("{a:?} is not simulated")),
                };
                if w & SERVICE_ID != 0 {
                    return Err(format!("workload {w} is a service: left alone"));
                }
                let (k, local) = ((w >> 8) as usize, w & 0xff);
                let g = range.start + local;
                if self.model.offline_on.get(&g) != Some(&k) {
                    return Err(format!("no offline workload {w} on node {}", self.node));
                }
                let mut c = self.model.control(k);
                match *a {
                    NodeAction::SetMemoryLimit(_, mib) => c.limit_mib = mib,
                    NodeAction::SetComputeShare(_, permille) => {
                        c.pacing = f64::from(permille.clamp(1, 1000)) / 1000.0;
                    }
                    NodeAction::Freeze(_) => c.frozen = true,
                    NodeAction::Resume(_) => c.frozen = false,
                    NodeAction::Evict(_) => self.evictions.push(k),
                    _ => {}
                }
                self.model.controls.insert(k, c);
                Ok(())
            })
            .collect()
    }
}

impl core::WorkloadModel for MuxflowModel<'_> {
    fn next_event(&self, ctx: &SimCtx, now: u64) -> Option<u64> {
        if ctx.progress.all_finished() {
            return None;
        }
        let mut next = self.next_sample.min(self.next_match);
        if let Some(&k) = self.order.get(self.next_arrival) {
            next = next.min(self.jobs[k].arrival_ms);
        }
        if !self.coordinators.is_empty() {
            next = next.min(self.next_tick);
        }
        Some(next.max(now))
    }

    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        let mut changed = false;
        while let Some(&k) = self.order.get(self.next_arrival) {
            if self.jobs[k].arrival_ms > now || !self.services_round_done {
                break;
            }
            let plan = &self.jobs[k].plan;
            let request = JobRequest {
                qos: qos::OPPORTUNISTIC,
                gpu_memory_mib: (self.cfg.offline_memory * f64::from(self.cfg.gpu_memory_mib))
                    as u32,
                estimate_ms: (plan.minutes * MINUTE_MS) as u64,
                ..JobRequest::gpus(&plan.name, "offline", 1, 1)
            };
            let id = ctx
                .host
                .state
                .submit(request)
                .with_context(|| format!("submitting `{}`", plan.name))?;
            ctx.progress.submitted(k, id);
            self.next_arrival += 1;
            changed = true;
        }
        if now >= self.next_sample {
            // The services' load moved: every offline job's rate with it.
            core::apply(self, ctx, &Applied::default(), now)?;
            let p = self.cfg.sample_ms;
            self.next_sample = (now / p + 1) * p;
        }
        if now >= self.next_tick {
            if !self.coordinators.is_empty() {
                self.coordinate(ctx, now)?;
            }
            let p = self.cfg.coordinator_period_ms;
            self.next_tick = (now / p + 1) * p;
        }
        if now >= self.next_match {
            self.match_offline(ctx, now)?;
            let p = self.cfg.match_interval_ms;
            self.next_match = (now / p + 1) * p;
        }
        Ok(changed)
    }

    fn round_due(&self, _ctx: &SimCtx, _changed: bool) -> bool {
        // One round places the services; offline work is the matcher's.
        !self.services_round_done
    }

    fn rate(&self, ctx: &SimCtx, _job: usize, placement: &[WorkerPlacement]) -> f64 {
        let now = ctx.host.state.now_ms();
        placement
            .iter()
            .flat_map(|w| w.gpus.iter())
            .map(|&g| self.outcome(g, now).offline_speed)
            .fold(f64::INFINITY, f64::min)
            .clamp(0.0, 1.0)
    }

    fn interference(&self) -> bool {
        true
    }

    fn on_started(&mut self, _ctx: &mut SimCtx, _job: usize, _now: u64) {
        self.m.executions += 1;
    }

    fn after_round(
        &mut self,
        ctx: &mut SimCtx,
        _report: &arbiter_host::roles::scheduler::RoundReport,
        now: u64,
    ) -> anyhow::Result<()> {
        self.services_round_done = true;
        self.refresh_placements(ctx);
        if self.service_on.len() < self.service_ids.len() {
            bail!(
                "{} of {} services could not be placed",
                self.service_ids.len() - self.service_on.len(),
                self.service_ids.len()
            );
        }
        core::apply(self, ctx, &Applied::default(), now)
    }

    fn on_finished(&mut self, _ctx: &mut SimCtx, job: usize, _now: u64) {
        self.jobs[job].finished = true;
        self.controls.remove(&job);
        self.offline_on.retain(|_, k| *k != job);
    }

    fn observe(&mut self, _ctx: &SimCtx, from: u64, to: u64) {
        if to <= from {
            return;
        }
        let dt = (to - from) as f64;
        let mut gpus: Vec<u32> = self.service_on.keys().copied().collect();
        gpus.sort_unstable();
        for g in gpus {
            let Some(&s) = self.service_on.get(&g) else {
                continue;
            };
            let load = self.load_of(s, from);
            let o = self.outcome(g, from);
            let alone = truth::share_gpu(&self.cfg.physics, self.cfg.sharing, load, None);
            let memory = self.memory_used(g, from);
            let memory_alone = self.sample(&self.cfg.services[s].memory, from);
            let sums = &mut self.sums;
            let requests = load * dt;
            if requests > 0.0 {
                sums.shared
                    .push((requests, truth::response_time(load, o.kernel_stretch)));
                sums.alone.push((requests, truth::response_time(load, 1.0)));
            }
            sums.busy += o.utilization * dt;
            sums.busy_alone += alone.utilization * dt;
            sums.sm += o.sm_activity * dt;
            sums.sm_alone += alone.sm_activity * dt;
            sums.memory += memory * dt;
            sums.memory_alone += memory_alone * dt;
            sums.gpu_ms += dt;
            self.profile_load[s].0 += load * dt;
            self.profile_load[s].1 += dt;
        }
        for &k in self.offline_on.values() {
            self.jobs[k].ran_ms += to - from;
        }
    }

    fn gpu_metrics(&self, ctx: &SimCtx, now: u64) -> Vec<GpuMetric> {
        let gpus = ctx.host.state.cluster().gpu_count() as u32;
        let pct = |v: f64| (v * 100.0).round().clamp(0.0, 100.0) as u8;
        (0..gpus)
            .map(|g| {
                let o = self.outcome(g, now);
                GpuMetric {
                    gpu: g,
                    utilization_pct: pct(o.utilization),
                    sm_activity_pct: pct(o.sm_activity),
                    memory_used_mib: (self.memory_used(g, now) * f64::from(self.cfg.gpu_memory_mib))
                        as u32,
                    sm_occupancy_pct: 0,
                }
            })
            .collect()
    }
}

/// Runs the scenario: `scheduler` places the services, `matcher` (none: online only) pairs
/// offline jobs with them, `coordinator` (none: no node control) runs on every node.
pub fn run_muxflow(
    scheduler: &RunPolicy,
    matcher: Option<&RunPolicy>,
    coordinator: Option<&RunPolicy>,
    cfg: &MuxflowSimConfig,
) -> anyhow::Result<MuxflowMetrics> {
    let name = |p: Option<&RunPolicy>| p.map(|p| p.compiled.manifest.name.clone());
    let span = tracing::info_span!(
        "sim_muxflow",
        matcher = ?name(matcher),
        coordinator = ?name(coordinator),
        sharing = ?cfg.sharing
    );
    let _guard = span.enter();
    let started = Instant::now();
    cfg.check()?;
    let mut state = ClusterState::new();
    for k in 0..cfg.nodes {
        state.add_node(NodeRequest {
            name: node_name(k),
            pool: "gpu".into(),
            cpu_milli: 96_000,
            memory_mib: 128 * 1024 * 8,
            gpu_model: "T4".into(),
            gpu_memory_mib: cfg.gpu_memory_mib,
            gpu_count: cfg.gpus_per_node,
            on_loan: false,
        })?;
    }
    // MuxFlow pairs one offline job with one online workload; offline memory is bounded on
    // the node (the quota, SysMonitor), so the host counts it as soft beside the service.
    state.set_sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 1,
        host_spill: true,
    })?;
    let mut service_ids = Vec::with_capacity(cfg.services.len());
    for s in &cfg.services {
        let id = state.submit(JobRequest {
            kind: job_kind::INFERENCE,
            ..JobRequest::gpus(&s.name, "online", 1, 1)
        })?;
        service_ids.push(id);
    }
    let jobs: Vec<OfflineJob> = cfg
        .offline
        .iter()
        .map(|plan| OfflineJob {
            model: cfg.models[&plan.model].clone(),
            arrival_ms: (plan.arrival_min * MINUTE_MS).round() as u64,
            plan: plan.clone(),
            sm_share: 1.0,
            ran_ms: 0,
            evictions: 0,
            migrations: 0,
            finished: false,
        })
        .collect();
    let progress = Progress::new(
        jobs.iter().map(|j| (j.plan.minutes * MINUTE_MS, true)),
        ProgressRules {
            restart_overhead_ms: cfg.restart_ms,
            report_progress: false,
        },
    );
    let host = SimHost::new(state, scheduler, None)?;
    let mut ctx = SimCtx { host, progress };
    let matcher_driver = matcher
        .map(|p| p.slot("matcher").map(MatcherDriver::new))
        .transpose()?;
    let coordinators = match coordinator {
        Some(policy) => policy.coordinators(cfg.nodes)?,
        None => Vec::new(),
    };
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&k| (jobs[k].arrival_ms, k));
    let mut model = MuxflowModel {
        cfg,
        jobs,
        order,
        next_arrival: 0,
        service_ids,
        service_on: HashMap::new(),
        offline_on: HashMap::new(),
        controls: HashMap::new(),
        health: HashMap::new(),
        matcher: matcher_driver,
        coordinators,
        next_sample: cfg.sample_ms,
        next_tick: cfg.coordinator_period_ms,
        next_match: cfg.match_interval_ms,
        services_round_done: false,
        profile_load: vec![(0.0, 0.0); cfg.services.len()],
        sums: Sums::default(),
        m: MuxflowMetrics {
            matcher: name(matcher),
            coordinator: name(coordinator),
            sharing: cfg.sharing,
            ..MuxflowMetrics::default()
        },
    };
    let rules = LoopRules {
        round_interval_ms: 1_000,
        horizon_ms: cfg.horizon_ms,
        gpu_metrics_period_ms: Some(cfg.coordinator_period_ms),
    };
    core::run(&mut model, &mut ctx, &rules)?;

    let minutes = |ms: u64| ms as f64 / MINUTE_MS;
    let (mut jcts, mut runs) = (Vec::new(), Vec::new());
    let m = &mut model.m;
    for (k, job) in model.jobs.iter().enumerate() {
        let track = ctx.progress.track(k);
        let jct = track
            .end
            .filter(|_| job.finished)
            .map(|e| minutes(e.saturating_sub(job.arrival_ms)));
        if let Some(j) = jct {
            jcts.push(j);
            runs.push((job.plan.minutes, minutes(job.ran_ms)));
            m.makespan_min = m.makespan_min.max(minutes(track.end.unwrap_or(0)));
        } else {
            m.unfinished += 1;
        }
        m.offline.push(OfflineRow {
            name: job.plan.name.clone(),
            model: job.plan.model.clone(),
            submit_min: minutes(job.arrival_ms),
            start_min: track.first_start.map(minutes),
            end_min: track.end.map(minutes),
            jct_min: jct,
            alone_min: job.plan.minutes,
            ran_min: minutes(job.ran_ms),
            evictions: job.evictions,
            migrations: job.migrations,
        });
    }
    let s = &model.sums;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let weighted = |parts: &[(f64, f64)]| {
        let w: f64 = parts.iter().map(|p| p.0).sum();
        ratio(parts.iter().map(|p| p.0 * p.1).sum(), w)
    };
    m.latency_mean_ratio = ratio(weighted(&s.shared), weighted(&s.alone));
    m.latency_p99_ratio = ratio(
        truth::mixture_percentile(&s.shared, 0.99),
        truth::mixture_percentile(&s.alone, 0.99),
    );
    m.mean_jct_min = mean(&jcts);
    m.oversold_gpu = oversold_gpu(&runs);
    m.utilization = ratio(s.busy, s.gpu_ms);
    m.utilization_alone = ratio(s.busy_alone, s.gpu_ms);
    m.sm_activity = ratio(s.sm, s.gpu_ms);
    m.sm_activity_alone = ratio(s.sm_alone, s.gpu_ms);
    m.memory = ratio(s.memory, s.gpu_ms);
    m.memory_alone = ratio(s.memory_alone, s.gpu_ms);
    m.wall_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        latency = m.latency_mean_ratio,
        mean_jct_min = m.mean_jct_min,
        oversold = m.oversold_gpu,
        "muxflow run done"
    );
    Ok(model.m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eq. 3 on the brief's example: jobs of 1 h and 2 h alone that ran 2 h each got three
    /// quarters of a GPU.
    #[test]
    fn oversold_gpu_reads_equation_3_as_time_alone_over_time_run() {
        assert!((oversold_gpu(&[(60.0, 120.0), (120.0, 120.0)]) - 0.75).abs() < 1e-12);
        // The literal extraction would give 4 / 3, outside [0, 1].
        assert_eq!(oversold_gpu(&[]), 0.0);
        assert_eq!(oversold_gpu(&[(60.0, 60.0)]), 1.0, "exclusive");
    }

    #[test]
    fn the_scenario_reads_from_toml_and_refuses_what_it_cannot_run() {
        let cfg = MuxflowSimConfig::from_toml("sharing = \"time-slicing\"\nrestart_ms = 0")
            .expect("toml");
        assert_eq!((cfg.sharing, cfg.restart_ms), (Sharing::TimeSlicing, 0));
        assert!(MuxflowSimConfig::from_toml("sharing = \"space\"").is_err());
        assert!(MuxflowSimConfig::from_toml("match_interval_ms = 0").is_err());
        assert!(MuxflowSimConfig::from_toml("[physics]\nswitch_cost = 2.0").is_err());
        let too_many = MuxflowSimConfig {
            nodes: 1,
            gpus_per_node: 1,
            services: vec![
                ServicePlan {
                    name: "a".into(),
                    load: vec![0.1],
                    memory: vec![0.1],
                };
                2
            ],
            ..MuxflowSimConfig::default()
        };
        assert!(too_many.check().is_err(), "one service per GPU");
        let bad_series = "[[services]]\nname = \"s\"\nload = [1.5]\nmemory = [0.1]";
        assert!(MuxflowSimConfig::from_toml(bad_series).is_err());
    }
}
