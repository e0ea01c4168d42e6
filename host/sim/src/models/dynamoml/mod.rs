//! The DynamoML scenario (Chiang & Chou, CLOSER '21, §4): a mixed ML
//! pipeline on two nodes of eight V100s — notebooks that share GPUs, one
//! ResNet-50 inference service whose clients come and go, and elastic
//! TensorFlow training jobs arriving in groups.
//!
//! The model's ground truth, none of it a policy's estimate:
//!
//! * **Training.** A job's work is its training time on one GPU
//!   ([`ModelTruth::solo_minutes`]); it progresses at the throughput of its
//!   worker count on one node ([`ModelTruth::speedup`], the shape of the
//!   paper's Fig. 3: ResNet-50 near-linear, MNIST flat beyond three GPUs),
//!   times [`ModelTruth::cross_node`] when its workers span nodes (the
//!   communication overhead §3.2 packs against). A job whose workers change
//!   pauses for `rescale_pause_ms` (the job re-forms); a preempted one
//!   restarts from its checkpoint after `restart_overhead_ms`. What a job
//!   does on fewer workers than it was submitted with is its runtime's
//!   ([`TrainingRuntime`]): an elastic job computes with them, a plain
//!   synchronous one waits for the rest. The parameter server runs on CPU and
//!   is not modelled.
//! * **Inference.** Closed-loop clients ([`service`]): each minute's active
//!   clients come from the demand curve ([`ServiceDemand`]); the replicas
//!   that are ready (`replica_start_ms` after they were placed) serve them
//!   at the mean response time of the closed network. Every round the host
//!   hears the service's request rate and response time over the round
//!   (`service-metrics`), as the paper's Istio → Prometheus → HPA path
//!   delivers them.
//! * **Notebooks.** Persistent, a quarter of a GPU each, no effect on
//!   anyone's speed (the paper: < 25 % use).
//!
//! The run ends when the last training job finishes; what it measures is in
//! [`DynamoMetrics`]. Every constant the paper leaves out is a field of
//! [`DynamoSimConfig`], with our choice as its default.

pub mod service;

use crate::core::{self, LoopRules, Progress, ProgressRules, RunPolicy, SimCtx, SimHost};
use crate::metrics::mean;
use crate::models::ModelConfigFile;
use anyhow::{Context, bail};
use arbiter_host::roles::scheduler::RoundReport;
use arbiter_host::state::{ClusterState, JobId, JobRequest, JobTraits, NodeRequest};
use arbiter_policy_sdk::model::{ServiceMetric, WorkerPlacement, job_kind, qos};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;

pub use service::{DemandShape, ServiceDemand, closed_loop};

const MINUTE_MS: u64 = 60_000;

/// The two training workloads of the paper.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainingModel {
    Mnist,
    Resnet50,
}

/// How fast one training workload runs (ours; the paper gives Fig. 3's
/// shape, not its numbers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTruth {
    /// Training time on one GPU, minutes.
    pub solo_minutes: f64,
    /// Throughput of 1, 2, 3, … workers on one node, relative to one
    /// worker; past the end, the last value.
    pub speedup: Vec<f64>,
    /// Throughput factor when the workers span nodes.
    pub cross_node: f64,
}

impl ModelTruth {
    /// Work per ms (one-GPU ms) of `workers` workers over `nodes` nodes.
    pub fn rate(&self, workers: usize, nodes: usize) -> f64 {
        if workers == 0 {
            return 0.0;
        }
        let s = self
            .speedup
            .get(workers - 1)
            .or(self.speedup.last())
            .copied()
            .unwrap_or(1.0);
        if nodes > 1 { s * self.cross_node } else { s }
    }

    fn check(&self, what: &str) -> anyhow::Result<()> {
        if !(self.solo_minutes.is_finite() && self.solo_minutes > 0.0) {
            bail!("{what}.solo_minutes must be positive");
        }
        if self.speedup.is_empty() || self.speedup.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            bail!("{what}.speedup must be a non-empty list of positive numbers");
        }
        if !(self.cross_node > 0.0 && self.cross_node <= 1.0) {
            bail!("{what}.cross_node must be in (0, 1]");
        }
        Ok(())
    }
}

/// The runtime the training jobs run on, which decides what a job does with
/// fewer workers than it was submitted with (the scheduler cannot tell: to
/// the contract both are a job placed with fewer workers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainingRuntime {
    /// DynamoML's elastic training (§3.2, after Lin et al. 2019): a job
    /// re-forms at whatever worker count it is given and computes with it.
    Elastic,
    /// Plain synchronous TFJobs: a job computes only while it has all the
    /// workers it was submitted with; workers that start before the rest
    /// wait for them, holding their GPUs — "the idle resource problem of
    /// synchronous computations" that §3.2's gang scheduling avoids.
    Synchronous,
}

/// A group of training jobs arriving together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arrival {
    pub minute: u32,
    pub model: TrainingModel,
    pub jobs: u32,
}

/// The scenario. Defaults: the paper's testbed and workload (§4), and our
/// choices where it states none (each marked "ours").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DynamoSimConfig {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub gpu_memory_mib: u32,
    pub notebooks: u32,
    pub notebook_gpu_milli: u32,
    /// The paper lists 12 jobs in three groups (its "16 in 4 groups"
    /// contradicts its own list); we follow the list.
    pub arrivals: Vec<Arrival>,
    pub initial_workers: u32,
    pub max_workers: u32,
    pub mnist: ModelTruth,
    pub resnet50: ModelTruth,
    /// One replica's service time per request, ms (ours: 40).
    pub service_ms: f64,
    /// A client's think time between an answer and its next request, ms (ours: 100).
    pub think_ms: f64,
    /// "Needs k replicas": k replicas are this busy (ours: 0.7).
    pub replica_target_utilization: f64,
    /// The service's latency objective, ms (ours: 128, the paper's first histogram bin).
    pub slo_ms: u32,
    pub max_replicas: u32,
    /// A replica serves this long after it was placed (ours: 30 s).
    pub replica_start_ms: u64,
    /// A training job makes no progress this long after its workers change (ours: 30 s).
    pub rescale_pause_ms: u64,
    /// After a preemption (ours: 60 s).
    pub restart_overhead_ms: u64,
    /// The training jobs' runtime; unset, each setting's own (the
    /// comparison runs DynamoML's jobs elastic and Kubernetes' as plain
    /// synchronous TFJobs, as the paper does: Table 2's Kubernetes settings
    /// lack its training scheduling). A single run with it unset: elastic.
    pub training_runtime: Option<TrainingRuntime>,
    /// Rounds (the autoscaler's sync period; Kubernetes' HPA default 15 s).
    pub round_interval_ms: u64,
    pub demand: DemandShape,
    /// The run gives up here (unfinished jobs are reported).
    pub horizon_ms: u64,
}

impl Default for DynamoSimConfig {
    fn default() -> Self {
        DynamoSimConfig {
            nodes: 2,
            gpus_per_node: 8,
            gpu_memory_mib: 16_384,
            notebooks: 4,
            notebook_gpu_milli: 250,
            arrivals: vec![
                Arrival {
                    minute: 0,
                    model: TrainingModel::Mnist,
                    jobs: 4,
                },
                Arrival {
                    minute: 10,
                    model: TrainingModel::Resnet50,
                    jobs: 4,
                },
                Arrival {
                    minute: 20,
                    model: TrainingModel::Mnist,
                    jobs: 2,
                },
                Arrival {
                    minute: 20,
                    model: TrainingModel::Resnet50,
                    jobs: 2,
                },
            ],
            initial_workers: 2,
            max_workers: 4,
            mnist: ModelTruth {
                solo_minutes: 12.0,
                speedup: vec![1.0, 1.8, 2.4, 2.5],
                cross_node: 0.5,
            },
            resnet50: ModelTruth {
                solo_minutes: 20.0,
                speedup: vec![1.0, 1.95, 2.85, 3.7],
                cross_node: 0.8,
            },
            service_ms: 40.0,
            think_ms: 100.0,
            replica_target_utilization: 0.7,
            slo_ms: 128,
            max_replicas: 12,
            replica_start_ms: 30_000,
            rescale_pause_ms: 30_000,
            restart_overhead_ms: 60_000,
            training_runtime: None,
            round_interval_ms: 15_000,
            demand: DemandShape::default(),
            horizon_ms: 6 * 3_600_000,
        }
    }
}

impl ModelConfigFile for DynamoSimConfig {
    const WHAT: &'static str = "the DynamoML scenario";

    fn check(&self) -> anyhow::Result<()> {
        if self.nodes == 0 || self.gpus_per_node == 0 || self.gpu_memory_mib == 0 {
            bail!("the cluster needs nodes with GPUs (and GPUs with memory)");
        }
        if self.notebook_gpu_milli == 0 || self.notebook_gpu_milli > 1000 {
            bail!("notebook_gpu_milli must be in 1..=1000");
        }
        if self.initial_workers == 0 || self.max_workers < self.initial_workers {
            bail!("need 1 <= initial_workers <= max_workers");
        }
        self.mnist.check("mnist")?;
        self.resnet50.check("resnet50")?;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !(positive(self.service_ms) && self.think_ms.is_finite() && self.think_ms >= 0.0) {
            bail!("service_ms must be positive and think_ms non-negative");
        }
        if !(self.replica_target_utilization > 0.0 && self.replica_target_utilization < 1.0) {
            bail!("replica_target_utilization must be in (0, 1)");
        }
        if self.max_replicas == 0 || self.round_interval_ms == 0 {
            bail!("max_replicas and round_interval_ms must be positive");
        }
        self.demand.check()?;
        // Mean Value Analysis steps through the clients one by one.
        let clients = self.clients_per_replica() * self.demand.peak_replicas;
        if clients.is_nan() || clients > MAX_CLIENTS {
            bail!(
                "the busiest minute would have {clients:.0} closed-loop clients, more than \
                 {MAX_CLIENTS}: lower think_ms or demand.peak_replicas, or raise service_ms"
            );
        }
        Ok(())
    }
}

/// The most closed-loop clients the service model solves for (the default scenario's
/// busiest minute has 29).
pub const MAX_CLIENTS: f64 = 100_000.0;

impl DynamoSimConfig {
    fn truth(&self, model: TrainingModel) -> &ModelTruth {
        match model {
            TrainingModel::Mnist => &self.mnist,
            TrainingModel::Resnet50 => &self.resnet50,
        }
    }

    /// Work per ms of a training job of `model` on `placement`: nothing
    /// under the synchronous runtime while it has fewer workers than it was
    /// submitted with, else its workers' throughput over their nodes.
    fn training_rate(&self, model: TrainingModel, placement: &[WorkerPlacement]) -> f64 {
        let short = placement.len() < self.initial_workers as usize;
        if short && self.training_runtime == Some(TrainingRuntime::Synchronous) {
            return 0.0;
        }
        let mut nodes: Vec<u32> = placement.iter().map(|w| w.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        self.truth(model).rate(placement.len(), nodes.len())
    }

    /// Clients that keep one replica at its target utilisation.
    pub fn clients_per_replica(&self) -> f64 {
        self.replica_target_utilization * (self.service_ms + self.think_ms) / self.service_ms
    }

    /// Requests per second one replica serves at its target utilisation:
    /// the HPA target an operator who knows the service would set.
    pub fn target_requests_per_replica(&self) -> f64 {
        self.replica_target_utilization * 1000.0 / self.service_ms
    }
}

/// One training job's times, minutes from the start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrainingRow {
    pub name: String,
    pub model: String,
    pub submit_min: f64,
    /// When it first computed: placed, and under the synchronous runtime
    /// with all its workers (§5.2's training time is "the actual running
    /// time for training"; until then it waits, pods placed or not).
    pub start_min: Option<f64>,
    pub end_min: Option<f64>,
}

/// Allocation at one minute.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TimelineRow {
    pub minute: u64,
    pub clients: f64,
    pub replicas_needed: f64,
    pub inference_gpus: u32,
    pub training_gpus: u32,
    pub notebook_gpus: u32,
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DynamoMetrics {
    pub policy: String,
    /// Time the last training job finished (the paper's "overall execution time").
    pub makespan_min: f64,
    /// Mean submit → first computing ("waiting time").
    pub mean_wait_min: f64,
    /// Mean first computing → end ("training time").
    pub mean_training_min: f64,
    /// Mean submit → end ("total execution time").
    pub mean_total_min: f64,
    pub longest_training_min: f64,
    /// Share of training jobs whose training time is at most 5 min.
    pub within_5_min: f64,
    pub unfinished: usize,
    pub jobs: Vec<TrainingRow>,
    pub requests: f64,
    /// Share of requests answered later than the objective.
    pub over_slo: f64,
    /// Shares of requests by response time: < 128, 128–512, 512–1024, > 1024 ms.
    pub latency_bins: [f64; 4],
    /// Most inference replicas placed during the first 7 minutes (`[0, 7)`)
    /// while no training job has finished yet (the paper's peak contention).
    pub inference_gpus_0_7: u32,
    /// Share of training job-time spent with 1, 2, 3, … workers (Fig. 7).
    pub worker_time: Vec<f64>,
    pub timeline: Vec<TimelineRow>,
    pub rounds: u64,
    pub policy_faults: u64,
    pub wall_seconds: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Service,
    Notebook,
    Training(TrainingModel),
}

struct SimJob {
    name: String,
    kind: Kind,
    arrival_ms: u64,
}

struct DynamoModel<'a> {
    cfg: &'a DynamoSimConfig,
    demand: &'a ServiceDemand,
    jobs: Vec<SimJob>,
    /// Jobs in arrival order, and the next to arrive.
    order: Vec<usize>,
    next_arrival: usize,
    training_left: usize,
    training_total: usize,
    service_id: Option<JobId>,
    /// The service's replicas by GPU, and when each serves.
    ready_at: HashMap<u32, u64>,
    /// This round's (response ms, requests) intervals.
    window: Vec<(f64, f64)>,
    window_start: u64,
    next_tick: u64,
    requests: f64,
    over_slo: f64,
    bins: [f64; 4],
    worker_ms: Vec<f64>,
    /// Per job: when it first computed (see [`TrainingRow::start_min`]).
    computing_from: Vec<Option<u64>>,
    m: DynamoMetrics,
}

impl DynamoModel<'_> {
    fn clients_at(&self, now: u64) -> f64 {
        self.demand.at_minute(now / MINUTE_MS) * self.cfg.clients_per_replica()
    }

    fn ready_replicas(&self, now: u64) -> u32 {
        self.ready_at.values().filter(|&&t| t <= now).count() as u32
    }

    fn service_placement<'c>(&self, ctx: &'c SimCtx) -> &'c [WorkerPlacement] {
        self.service_id
            .and_then(|id| ctx.host.state.job_index(id))
            .map_or(&[], |i| ctx.host.state.cluster().job(i).placement())
    }

    /// The service metrics of the round that ends now.
    fn report_service(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<()> {
        let window = std::mem::take(&mut self.window);
        let span_s = now.saturating_sub(self.window_start) as f64 / 1000.0;
        self.window_start = now;
        let requests: f64 = window.iter().map(|w| w.1).sum();
        let Some(index) = self.service_id.and_then(|id| ctx.host.state.job_index(id)) else {
            return Ok(());
        };
        // Nothing answered (no replica ready yet): nothing to report, as
        // HPA ignores pods that are not ready.
        if requests <= 0.0 || span_s <= 0.0 {
            return Ok(());
        }
        let metric = ServiceMetric {
            job: index,
            requests_per_s: (requests / span_s) as f32,
            p50_latency_ms: weighted_percentile(&window, 0.50).round() as u32,
            p99_latency_ms: weighted_percentile(&window, 0.99).round() as u32,
        };
        ctx.host
            .state
            .record_service_metrics(vec![metric])
            .context("recording service metrics")
    }

    fn sample_timeline(&mut self, ctx: &SimCtx, now: u64) {
        let minute = now / MINUTE_MS;
        if self.m.timeline.last().is_some_and(|r| r.minute >= minute) {
            return;
        }
        let cluster = ctx.host.state.cluster();
        let mut row = TimelineRow {
            minute,
            clients: self.clients_at(now),
            replicas_needed: self.demand.at_minute(minute),
            ..TimelineRow::default()
        };
        let mut notebook_gpus: Vec<u32> = Vec::new();
        for job in cluster.running_jobs() {
            let gpus: u32 = job.placement().iter().map(|w| w.gpus.len() as u32).sum();
            match job.kind() {
                job_kind::INFERENCE => row.inference_gpus += gpus,
                job_kind::TRAINING => row.training_gpus += gpus,
                _ => notebook_gpus.extend(job.placement().iter().flat_map(|w| w.gpus.clone())),
            }
        }
        notebook_gpus.sort_unstable();
        notebook_gpus.dedup();
        row.notebook_gpus = notebook_gpus.len() as u32;
        self.m.timeline.push(row);
    }
}

/// The `q` quantile of response times weighted by requests.
fn weighted_percentile(window: &[(f64, f64)], q: f64) -> f64 {
    let mut sorted: Vec<(f64, f64)> = window.iter().copied().filter(|w| w.1 > 0.0).collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = sorted.iter().map(|w| w.1).sum();
    let mut seen = 0.0;
    for (r, n) in &sorted {
        seen += n;
        if seen >= q * total {
            return r.min(f64::from(u32::MAX));
        }
    }
    sorted.last().map_or(0.0, |w| w.0.min(f64::from(u32::MAX)))
}

fn latency_bin(response_ms: f64) -> usize {
    match response_ms {
        r if r < 128.0 => 0,
        r if r < 512.0 => 1,
        r if r <= 1024.0 => 2,
        _ => 3,
    }
}

impl core::WorkloadModel for DynamoModel<'_> {
    fn next_event(&self, _ctx: &SimCtx, now: u64) -> Option<u64> {
        if self.training_left == 0 {
            return None;
        }
        let mut next = (now / MINUTE_MS + 1) * MINUTE_MS;
        if let Some(&k) = self.order.get(self.next_arrival) {
            next = next.min(self.jobs[k].arrival_ms);
        }
        next = next.min(self.next_tick);
        if let Some(t) = self.ready_at.values().copied().filter(|&t| t > now).min() {
            next = next.min(t);
        }
        Some(next.max(now))
    }

    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        let mut changed = false;
        while let Some(&k) = self.order.get(self.next_arrival) {
            let job = &self.jobs[k];
            if job.arrival_ms > now {
                break;
            }
            let cfg = self.cfg;
            let (request, traits) = match job.kind {
                Kind::Service => (
                    JobRequest {
                        kind: job_kind::INFERENCE,
                        min_workers: 1,
                        max_workers: cfg.max_replicas,
                        ..JobRequest::gpus(&job.name, "serving", 1, 1)
                    },
                    JobTraits {
                        slo_ms: cfg.slo_ms,
                        ..JobTraits::default()
                    },
                ),
                Kind::Notebook => (
                    JobRequest {
                        kind: job_kind::INTERACTIVE,
                        gpu_milli: cfg.notebook_gpu_milli,
                        ..JobRequest::gpus(&job.name, "modeling", 1, 1)
                    },
                    JobTraits::default(),
                ),
                Kind::Training(_) => (
                    JobRequest {
                        min_workers: 1,
                        max_workers: cfg.max_workers,
                        checkpointed: true,
                        ..JobRequest::gpus(&job.name, "training", cfg.initial_workers, 1)
                    },
                    JobTraits::default(),
                ),
            };
            debug_assert_eq!(request.qos, qos::GUARANTEED);
            let id = ctx
                .host
                .state
                .submit_with(request, traits)
                .with_context(|| format!("submitting `{}`", job.name))?;
            if job.kind == Kind::Service {
                self.service_id = Some(id);
            }
            ctx.progress.submitted(k, id);
            self.next_arrival += 1;
            changed = true;
        }
        if now >= self.next_tick {
            self.report_service(ctx, now)?;
            self.next_tick = (now / self.cfg.round_interval_ms + 1) * self.cfg.round_interval_ms;
        }
        Ok(changed)
    }

    /// A round runs on every tick of the grid while training is left (the
    /// autoscaler looks at the service each sync period whatever else
    /// happened; the core runs one per grid time).
    fn round_due(&self, _ctx: &SimCtx, _changed: bool) -> bool {
        self.training_left > 0
    }

    fn rate(&self, _ctx: &SimCtx, job: usize, placement: &[WorkerPlacement]) -> f64 {
        match self.jobs[job].kind {
            Kind::Training(model) => self.cfg.training_rate(model, placement),
            Kind::Service | Kind::Notebook => 1.0,
        }
    }

    fn on_finished(&mut self, _ctx: &mut SimCtx, job: usize, _now: u64) {
        if matches!(self.jobs[job].kind, Kind::Training(_)) {
            self.training_left = self.training_left.saturating_sub(1);
        }
    }

    fn after_round(
        &mut self,
        ctx: &mut SimCtx,
        report: &RoundReport,
        now: u64,
    ) -> anyhow::Result<()> {
        // Training jobs whose workers changed re-form.
        let until = now.saturating_add(self.cfg.rescale_pause_ms);
        for &id in &report.applied.resized {
            if let Some(k) = ctx.progress.job_of(id)
                && matches!(self.jobs[k].kind, Kind::Training(_))
            {
                ctx.progress.pause_until(k, now, until);
            }
        }
        // Placements change only in rounds: a job computes from the first
        // round that leaves it a positive rate.
        for (k, from) in self.computing_from.iter_mut().enumerate() {
            let track = ctx.progress.track(k);
            if from.is_none() && track.running && track.rate > 0.0 {
                *from = Some(now);
            }
        }
        // The service's replicas: new ones start, removed ones are gone.
        let gpus: Vec<u32> = self
            .service_placement(ctx)
            .iter()
            .flat_map(|w| w.gpus.iter().copied())
            .collect();
        self.ready_at.retain(|g, _| gpus.contains(g));
        for g in &gpus {
            self.ready_at
                .entry(*g)
                .or_insert(now.saturating_add(self.cfg.replica_start_ms));
        }
        // The paper's contention: its first 7 minutes, while the first
        // group of training jobs all still run.
        if now < 7 * MINUTE_MS && self.training_left == self.training_total {
            self.m.inference_gpus_0_7 = self.m.inference_gpus_0_7.max(gpus.len() as u32);
        }
        self.sample_timeline(ctx, now);
        Ok(())
    }

    fn observe(&mut self, ctx: &SimCtx, from: u64, to: u64) {
        if self.training_left == 0 || to <= from {
            return;
        }
        let dt = (to - from) as f64;
        if self.service_id.is_some() {
            let (response, throughput) = closed_loop(
                self.clients_at(from),
                self.ready_replicas(from),
                self.cfg.service_ms,
                self.cfg.think_ms,
            );
            let requests = throughput * dt / 1000.0;
            if requests > 0.0 {
                self.requests += requests;
                self.bins[latency_bin(response)] += requests;
                if response > f64::from(self.cfg.slo_ms) {
                    self.over_slo += requests;
                }
                self.window.push((response, requests));
            }
        }
        for job in ctx.host.state.cluster().running_jobs() {
            if job.kind() == job_kind::TRAINING {
                let w = job.placement().len();
                if self.worker_ms.len() < w {
                    self.worker_ms.resize(w, 0.0);
                }
                if w > 0 {
                    self.worker_ms[w - 1] += dt;
                }
            }
        }
    }
}

/// Runs `policy` on the scenario.
pub fn run_dynamoml(
    policy: &RunPolicy,
    cfg: &DynamoSimConfig,
    demand: &ServiceDemand,
) -> anyhow::Result<DynamoMetrics> {
    let name = policy.compiled.manifest.name.clone();
    let span = tracing::info_span!("sim_dynamoml", policy = %name);
    let _guard = span.enter();
    let started = Instant::now();
    cfg.check()?;
    let mut state = ClusterState::new();
    for k in 0..cfg.nodes {
        state.add_node(NodeRequest {
            name: format!("p3-{k}"),
            pool: "gpu".into(),
            cpu_milli: 64_000,
            memory_mib: 488 * 1024,
            gpu_model: "V100".into(),
            gpu_memory_mib: cfg.gpu_memory_mib,
            gpu_count: cfg.gpus_per_node,
            on_loan: false,
        })?;
    }
    let mut jobs = vec![SimJob {
        name: "resnet50-serving".into(),
        kind: Kind::Service,
        arrival_ms: 0,
    }];
    jobs.extend((0..cfg.notebooks).map(|k| SimJob {
        name: format!("notebook-{k}"),
        kind: Kind::Notebook,
        arrival_ms: 0,
    }));
    let mut n = 0;
    for group in &cfg.arrivals {
        for _ in 0..group.jobs {
            n += 1;
            let model = match group.model {
                TrainingModel::Mnist => "mnist",
                TrainingModel::Resnet50 => "resnet50",
            };
            jobs.push(SimJob {
                name: format!("tfjob-{n}-{model}"),
                kind: Kind::Training(group.model),
                arrival_ms: u64::from(group.minute) * MINUTE_MS,
            });
        }
    }
    let work = |j: &SimJob| match j.kind {
        Kind::Training(model) => cfg.truth(model).solo_minutes * MINUTE_MS as f64,
        Kind::Service | Kind::Notebook => f64::INFINITY,
    };
    let progress = Progress::new(
        jobs.iter().map(|j| (work(j), true)),
        ProgressRules {
            restart_overhead_ms: cfg.restart_overhead_ms,
            report_progress: false,
        },
    );
    let host = SimHost::new(state, policy, None)?;
    let mut ctx = SimCtx { host, progress };
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&k| (jobs[k].arrival_ms, k));
    let training_left = jobs
        .iter()
        .filter(|j| matches!(j.kind, Kind::Training(_)))
        .count();
    let job_count = jobs.len();
    let mut model = DynamoModel {
        cfg,
        demand,
        jobs,
        order,
        next_arrival: 0,
        training_left,
        training_total: training_left,
        service_id: None,
        ready_at: HashMap::new(),
        window: Vec::new(),
        window_start: 0,
        next_tick: cfg.round_interval_ms,
        requests: 0.0,
        over_slo: 0.0,
        bins: [0.0; 4],
        worker_ms: Vec::new(),
        computing_from: vec![None; job_count],
        m: DynamoMetrics {
            policy: name.clone(),
            ..DynamoMetrics::default()
        },
    };
    let rules = LoopRules {
        round_interval_ms: cfg.round_interval_ms,
        horizon_ms: cfg.horizon_ms,
        gpu_metrics_period_ms: None,
    };
    core::run(&mut model, &mut ctx, &rules)?;

    let minutes = |ms: u64| ms as f64 / MINUTE_MS as f64;
    let mut waits = Vec::new();
    let mut trainings = Vec::new();
    let mut totals = Vec::new();
    let m = &mut model.m;
    for (k, job) in model.jobs.iter().enumerate() {
        let Kind::Training(tm) = job.kind else {
            continue;
        };
        let track = ctx.progress.track(k);
        let row = TrainingRow {
            name: job.name.clone(),
            model: format!("{tm:?}"),
            submit_min: minutes(job.arrival_ms),
            start_min: model.computing_from[k].map(minutes),
            end_min: track.end.map(minutes),
        };
        if let (Some(s), Some(e)) = (model.computing_from[k], track.end) {
            waits.push(minutes(s.saturating_sub(job.arrival_ms)));
            trainings.push(minutes(e.saturating_sub(s)));
            totals.push(minutes(e.saturating_sub(job.arrival_ms)));
            m.makespan_min = m.makespan_min.max(minutes(e));
        } else {
            m.unfinished += 1;
        }
        m.jobs.push(row);
    }
    m.mean_wait_min = mean(&waits);
    m.mean_training_min = mean(&trainings);
    m.mean_total_min = mean(&totals);
    m.longest_training_min = trainings.iter().copied().fold(0.0, f64::max);
    m.within_5_min = if trainings.is_empty() {
        0.0
    } else {
        trainings.iter().filter(|&&t| t <= 5.0).count() as f64 / trainings.len() as f64
    };
    m.requests = model.requests;
    if model.requests > 0.0 {
        m.over_slo = model.over_slo / model.requests;
        for (share, count) in m.latency_bins.iter_mut().zip(model.bins) {
            *share = count / model.requests;
        }
    }
    let job_ms: f64 = model.worker_ms.iter().sum();
    if job_ms > 0.0 {
        m.worker_time = model.worker_ms.iter().map(|t| t / job_ms).collect();
    }
    m.rounds = ctx.host.stats.rounds;
    m.policy_faults = ctx.host.stats.troubled;
    m.wall_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        makespan_min = m.makespan_min,
        mean_training_min = m.mean_training_min,
        over_slo = m.over_slo,
        "dynamoml run done"
    );
    Ok(model.m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_truth_follows_workers_and_nodes() {
        let cfg = DynamoSimConfig::default();
        assert_eq!(cfg.mnist.rate(1, 1), 1.0);
        assert_eq!(cfg.mnist.rate(4, 1), 2.5);
        assert_eq!(cfg.mnist.rate(6, 1), 2.5, "past the table: its last value");
        assert_eq!(cfg.mnist.rate(2, 2), 1.8 * 0.5);
        assert_eq!(cfg.resnet50.rate(0, 0), 0.0);
    }

    /// A job placed one worker short computes under the elastic runtime
    /// (unset: elastic) and waits under the synchronous one; whole, both
    /// compute alike.
    #[test]
    fn a_synchronous_job_computes_only_with_all_its_workers() {
        let worker = |node: u32, gpu: u32| WorkerPlacement {
            node,
            gpus: vec![gpu],
        };
        let short = [worker(0, 0)];
        let whole = [worker(0, 0), worker(1, 8)];
        let mut cfg = DynamoSimConfig::default();
        for runtime in [None, Some(TrainingRuntime::Elastic)] {
            cfg.training_runtime = runtime;
            assert_eq!(cfg.training_rate(TrainingModel::Mnist, &short), 1.0);
            assert_eq!(cfg.training_rate(TrainingModel::Mnist, &whole), 1.8 * 0.5);
        }
        cfg.training_runtime = Some(TrainingRuntime::Synchronous);
        assert_eq!(cfg.training_rate(TrainingModel::Mnist, &short), 0.0);
        assert_eq!(cfg.training_rate(TrainingModel::Mnist, &whole), 1.8 * 0.5);
        let toml = DynamoSimConfig::from_toml("training_runtime = \"synchronous\"").expect("toml");
        assert_eq!(toml.training_runtime, Some(TrainingRuntime::Synchronous));
    }

    #[test]
    fn the_configuration_reads_from_toml_and_refuses_nonsense() {
        let cfg = DynamoSimConfig::from_toml(
            "think_ms = 50.0\n[mnist]\nsolo_minutes = 8.0\nspeedup = [1.0, 1.5]\ncross_node = 0.6",
        )
        .expect("toml");
        assert_eq!(cfg.think_ms, 50.0);
        assert_eq!(cfg.mnist.speedup, vec![1.0, 1.5]);
        assert!(DynamoSimConfig::from_toml("replica_target_utilization = 1.0").is_err());
        assert!(
            DynamoSimConfig::from_toml(
                "[resnet50]\nsolo_minutes = 1.0\nspeedup = []\ncross_node = 1.0"
            )
            .is_err()
        );
        assert!(
            DynamoSimConfig::from_toml("gpus = 3").is_err(),
            "unknown key"
        );
        // A client population the service model cannot step through (it hung the run).
        for huge in [
            "think_ms = 1e300",
            "service_ms = 1e-9",
            "demand.peak_replicas = 1e9",
        ] {
            let error = DynamoSimConfig::from_toml(huge).expect_err(huge);
            assert!(
                format!("{error:#}").contains("closed-loop clients"),
                "{huge}: {error:#}"
            );
        }
        assert!(DynamoSimConfig::from_toml("think_ms = 100000").is_ok());
        assert!(DynamoSimConfig::from_toml("gpu_memory_mib = 0").is_err());
        // The HPA target is the rate one replica serves at its target load.
        let d = DynamoSimConfig::default();
        assert!((d.target_requests_per_replica() - 17.5).abs() < 1e-9);
        assert!((d.clients_per_replica() - 2.45).abs() < 1e-9);
    }

    #[test]
    fn percentiles_are_weighted_by_requests() {
        let w = [(40.0, 98.0), (300.0, 1.0), (2000.0, 1.0)];
        assert_eq!(weighted_percentile(&w, 0.5), 40.0);
        assert_eq!(weighted_percentile(&w, 0.99), 300.0);
        assert_eq!(weighted_percentile(&w, 1.0), 2000.0);
        assert_eq!(latency_bin(127.9), 0);
        assert_eq!(latency_bin(1024.0), 2);
        assert_eq!(latency_bin(f64::INFINITY), 3);
    }
}
