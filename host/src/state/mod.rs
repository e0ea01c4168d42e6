//! The host's cluster state: the truth every policy's mirror follows.
//!
//! Every change is an [`Event`] applied through the SDK's
//! [`Cluster::apply_event`] — the same state machine a guest runs — and
//! recorded for the next round's delta. Host-only bookkeeping (stable job
//! ids, tenants' quotas, timing) lives beside the cluster in tables that
//! follow the same swap-remove rule.
//!
//! Strings (job and node names, tenants, pools, GPU models) are interned once
//! and reference-counted by the columns that name them. When dead strings
//! (those of jobs long gone) dominate the table, the next round first opens a
//! *resync epoch* ([`ClusterState::compact_strings`]): live strings are
//! renumbered, the delta history is dropped, and every mirror resyncs from a
//! snapshot of live state only. So a long-lived host's memory, snapshots and
//! resyncs stay bounded by its live state, not by every job it ever saw.
//!
//! This file holds the tables, their mutations (nodes, jobs, tenants, metrics) and
//! queries; `strings.rs` interning and compaction; `epochs.rs` rounds' epochs, the delta
//! history and snapshots; `decisions.rs` the validator and applying a round.

mod decisions;
mod epochs;
mod strings;
#[cfg(test)]
mod tests;

pub use epochs::DeltaFeed;
use epochs::DeltaLog;
pub use strings::{Compaction, StringStats};

use arbiter_policy_sdk::model::{
    self, Decision, Delta, Event, JobSpec, NodeSpec, RoundInfo, Snapshot, job_phase,
};
use arbiter_policy_sdk::{Cluster, DecisionError, Plan};
use parking_lot::RwLock;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A job's stable identity (indices change; this does not).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct JobId(pub u64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job-{}", self.0)
    }
}

/// Most GPU models a cluster can name (they are a `u64` bit set in the contract).
pub const MAX_GPU_MODELS: usize = 64;

/// Fastest GPU model speed accepted, in permille of the reference (100×).
pub const MAX_SPEED_PERMILLE: u32 = 100_000;

/// How many rounds of deltas are kept to catch a lagging mirror up without a resync.
const DELTA_HISTORY: usize = 64;

/// Dead strings tolerated before the string table is compacted (when they
/// also outnumber the live ones). At ~100 ns per string in a resync, 1,024
/// dead strings cost a snapshot at most ~0.1 ms.
pub const DEFAULT_COMPACTION_FLOOR: usize = 1024;

/// Id marker of a string not (yet) renumbered during a compaction.
const UNMAPPED: u32 = u32::MAX;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("node `{0}` already exists")]
    DuplicateNode(String),
    #[error("job name `{0}` already exists")]
    DuplicateJob(String),
    #[error("unknown job {0}")]
    UnknownJob(JobId),
    #[error("unknown node `{0}`")]
    UnknownNode(String),
    #[error("unknown GPU model `{0}` in the job's constraint")]
    UnknownGpuModel(String),
    #[error("more than {MAX_GPU_MODELS} GPU models")]
    TooManyGpuModels,
    #[error("invalid job: {0}")]
    InvalidJob(String),
    #[error("invalid node: {0}")]
    InvalidNode(String),
    #[error("invalid GPU speed for `{model}`: {permille}‰ (must be 1..={MAX_SPEED_PERMILLE})")]
    InvalidSpeed { model: String, permille: u32 },
    #[error("internal event rejected: {0}")]
    Event(String),
}

/// A node as an operator (or a trace) describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRequest {
    pub name: String,
    pub pool: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpu_model: String,
    pub gpu_memory_mib: u32,
    pub gpu_count: u32,
    pub on_loan: bool,
}

impl NodeRequest {
    /// A GPU server with 12 CPUs and 96 GiB of memory per GPU, ready and
    /// not on loan.
    pub fn gpus(
        name: impl Into<String>,
        pool: impl Into<String>,
        gpu_model: impl Into<String>,
        gpu_memory_mib: u32,
        gpu_count: u32,
    ) -> Self {
        NodeRequest {
            name: name.into(),
            pool: pool.into(),
            cpu_milli: 12_000 * gpu_count.max(1),
            memory_mib: 98_304 * gpu_count.max(1),
            gpu_model: gpu_model.into(),
            gpu_memory_mib,
            gpu_count,
            on_loan: false,
        }
    }
}

/// A job as a user (or a trace) submits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    pub name: String,
    pub tenant: String,
    pub kind: u8,
    pub qos: u8,
    pub priority: i32,
    pub workers: u32,
    pub min_workers: u32,
    pub max_workers: u32,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpus_per_worker: u32,
    pub gpu_milli: u32,
    pub gpu_memory_mib: u32,
    /// Allowed GPU models; empty = any.
    pub gpu_models: Vec<String>,
    pub estimate_ms: u64,
    pub deadline_ms: u64,
    pub checkpointed: bool,
}

impl JobRequest {
    /// A gang of `workers` × `gpus_per_worker` whole GPUs with modest CPU and memory.
    pub fn gpus(
        name: impl Into<String>,
        tenant: impl Into<String>,
        workers: u32,
        gpus_per_worker: u32,
    ) -> Self {
        JobRequest {
            name: name.into(),
            tenant: tenant.into(),
            kind: model::job_kind::TRAINING,
            qos: model::qos::GUARANTEED,
            priority: 0,
            workers,
            min_workers: workers,
            max_workers: workers,
            cpu_milli: 4000 * gpus_per_worker.max(1),
            memory_mib: 16_384 * gpus_per_worker.max(1),
            gpus_per_worker,
            gpu_milli: model::FULL_GPU_MILLI,
            gpu_memory_mib: 0,
            gpu_models: Vec::new(),
            estimate_ms: 0,
            deadline_ms: 0,
            checkpointed: true,
        }
    }
}

/// What contract 0.3 added to a job beyond its [`JobRequest`]: a burst
/// limit, locality, a latency objective and a recurrence group. The default
/// is none of them ([`ClusterState::submit`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobTraits {
    /// Most milli-GPU a fractional worker may burst to; 0 = its request.
    pub gpu_milli_limit: u32,
    /// `model::locality` code.
    pub locality: u8,
    /// Latency objective of an inference job, ms; 0 = none.
    pub slo_ms: u32,
    /// Recurrence group ("" = none).
    pub group: String,
}

/// Host-side facts about a job, parallel to the cluster's job table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRecord {
    pub id: JobId,
    pub name: String,
    pub tenant: String,
    pub submit_ms: u64,
    pub first_start_ms: Option<u64>,
    pub last_start_ms: Option<u64>,
    pub preemptions: u32,
    /// The worker count the job was submitted with (what `estimate-ms` is at).
    pub submitted_workers: u32,
}

/// What applying a round's decisions changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub started: Vec<JobId>,
    pub preempted: Vec<JobId>,
    /// Scaled out or in: running on a new set of workers.
    pub resized: Vec<JobId>,
    /// Moved, while running, to other workers.
    pub migrated: Vec<JobId>,
    /// Running or pending jobs whose QoS changed.
    pub qos_changed: Vec<JobId>,
    /// Reservations made or released.
    pub other: usize,
}

impl Applied {
    /// Running jobs whose workers changed (a resize or a migration).
    pub fn moved(&self) -> impl Iterator<Item = JobId> + '_ {
        self.resized.iter().chain(&self.migrated).copied()
    }
}

/// Tells cluster states apart: see [`ClusterState::lineage`].
static NEXT_LINEAGE: AtomicU64 = AtomicU64::new(1);

/// The cluster state of one host (live or simulated).
pub struct ClusterState {
    /// Which state this is, unique in the process: epochs count one state's
    /// history, so a mirror synchronised to another state at the same epoch
    /// is not current (see [`ClusterState::lineage`]).
    lineage: u64,
    cluster: Cluster,
    interned: HashMap<String, u32>,
    node_index: HashMap<String, u32>,
    jobs: Vec<JobRecord>,
    job_index: HashMap<JobId, u32>,
    job_names: HashMap<String, JobId>,
    next_job: u64,
    /// GPU speeds the operator gave, per model name, in permille; models
    /// given none run at the reference speed.
    model_speeds: HashMap<String, u32>,
    events: Vec<Event>,
    /// Where in `events` the pending epoch's `strings-added` event is: every
    /// string interned later in the epoch joins it, so a round's delta
    /// carries one event for its new names, not one per name (a thousand
    /// arrivals were a thousand one-string events, each a list the
    /// component boundary allocates and copies). Strings are append-only and
    /// named by position, and nothing but interning adds one, so adding a
    /// string earlier in the epoch than it was interned changes no id and no
    /// mirror's result.
    strings_event: Option<usize>,
    /// The last rounds' deltas, shared with [`DeltaFeed`]s.
    history: Arc<RwLock<DeltaLog>>,
    now_ms: u64,
    /// Per string id: how many columns entries (and GPU-model slots) name it.
    string_refs: Vec<u32>,
    /// Strings with a non-zero count in `string_refs`.
    live_strings: usize,
    /// Dead strings tolerated before compacting; `None` = never automatically.
    compaction_floor: Option<usize>,
    compactions: u64,
    resync_epoch: u64,
}

impl Default for ClusterState {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterState {
    pub fn new() -> Self {
        ClusterState {
            lineage: NEXT_LINEAGE.fetch_add(1, Ordering::Relaxed),
            cluster: Cluster::new(),
            interned: HashMap::new(),
            node_index: HashMap::new(),
            jobs: Vec::new(),
            job_index: HashMap::new(),
            job_names: HashMap::new(),
            next_job: 1,
            model_speeds: HashMap::new(),
            events: Vec::new(),
            strings_event: None,
            history: Arc::new(RwLock::new(DeltaLog::default())),
            now_ms: 0,
            string_refs: Vec::new(),
            live_strings: 0,
            compaction_floor: Some(DEFAULT_COMPACTION_FLOOR),
            compactions: 0,
            resync_epoch: 0,
        }
    }

    /// Sets when the string table is compacted automatically (at the start of
    /// a round): once dead strings outnumber live ones and reach `floor`.
    /// `None` turns the automatic compaction off.
    pub fn with_compaction_floor(mut self, floor: Option<usize>) -> Self {
        self.set_compaction_floor(floor);
        self
    }

    /// See [`ClusterState::with_compaction_floor`].
    pub fn set_compaction_floor(&mut self, floor: Option<usize>) {
        self.compaction_floor = floor;
    }

    fn emit(&mut self, event: Event) -> Result<(), StateError> {
        self.cluster
            .apply_event(&event)
            .map_err(|e| StateError::Event(e.to_string()))?;
        self.events.push(event);
        Ok(())
    }

    fn model_slot(&mut self, model: &str, create: bool) -> Result<usize, StateError> {
        if let Some(&id) = self.interned.get(model)
            && let Some(slot) = self.cluster.gpu_models().iter().position(|&m| m == id)
        {
            return Ok(slot);
        }
        if !create {
            return Err(StateError::UnknownGpuModel(model.to_string()));
        }
        if self.cluster.gpu_models().len() >= MAX_GPU_MODELS {
            return Err(StateError::TooManyGpuModels);
        }
        let id = self.intern(model)?;
        let speed = self
            .model_speeds
            .get(model)
            .copied()
            .unwrap_or(model::REFERENCE_SPEED_PERMILLE);
        self.emit(Event::GpuModelsAdded(vec![(id, speed)]))?;
        self.retain_string(id);
        Ok(self.cluster.gpu_models().len() - 1)
    }

    /// Adds a node of unknown interconnect; its name must be new.
    pub fn add_node(&mut self, req: NodeRequest) -> Result<u32, StateError> {
        self.add_node_on(req, "")
    }

    /// Adds a node whose GPUs share the interconnect or topology group
    /// `fabric` ("nvlink", "pcie", ...; "" unknown); its name must be new.
    pub fn add_node_on(&mut self, req: NodeRequest, fabric: &str) -> Result<u32, StateError> {
        if self.node_index.contains_key(&req.name) {
            return Err(StateError::DuplicateNode(req.name));
        }
        if req.gpu_count > model::MAX_NODE_GPUS {
            return Err(StateError::InvalidNode(format!(
                "node `{}` has {} GPUs; at most {} are allowed",
                req.name,
                req.gpu_count,
                model::MAX_NODE_GPUS
            )));
        }
        if req.gpu_count > 0 && req.gpu_model.is_empty() {
            return Err(StateError::InvalidNode(format!(
                "node `{}` has GPUs but no model",
                req.name
            )));
        }
        if req.gpu_count > 0 {
            self.model_slot(&req.gpu_model, true)?;
        }
        let spec = NodeSpec {
            name: self.intern(&req.name)?,
            pool: self.intern(&req.pool)?,
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            gpu_model: self.intern(&req.gpu_model)?,
            gpu_memory_mib: req.gpu_memory_mib,
            gpu_count: req.gpu_count,
            on_loan: req.on_loan,
            fabric: self.intern(fabric)?,
        };
        let index = self.cluster.node_count() as u32;
        let (name, pool, model, fabric) = (spec.name, spec.pool, spec.gpu_model, spec.fabric);
        self.emit(Event::NodeAdded(spec))?;
        self.retain_string(name);
        self.retain_string(pool);
        self.retain_string(fabric);
        if req.gpu_count > 0 {
            self.retain_string(model);
        }
        self.node_index.insert(req.name, index);
        Ok(index)
    }

    /// Marks a node ready / cordoned / lost / reclaiming.
    pub fn set_node_state(&mut self, name: &str, state: u8) -> Result<(), StateError> {
        let index = *self
            .node_index
            .get(name)
            .ok_or_else(|| StateError::UnknownNode(name.to_string()))?;
        self.emit(Event::NodeStateChanged(index, state))
    }

    /// Marks a node as on loan (or back).
    pub fn set_node_loan(&mut self, name: &str, on_loan: bool) -> Result<(), StateError> {
        let index = *self
            .node_index
            .get(name)
            .ok_or_else(|| StateError::UnknownNode(name.to_string()))?;
        self.emit(Event::NodeLoanChanged(index, on_loan))
    }

    /// Sets a GPU model's speed, in permille of the reference model (e.g. a
    /// T4 at a third of a V100: `333` with the V100 as reference). Applies to
    /// the model now if it is known, and when it first appears otherwise.
    pub fn set_gpu_model_speed(&mut self, model: &str, permille: u32) -> Result<(), StateError> {
        if permille == 0 || permille > MAX_SPEED_PERMILLE {
            return Err(StateError::InvalidSpeed {
                model: model.to_string(),
                permille,
            });
        }
        self.model_speeds.insert(model.to_string(), permille);
        if let Ok(slot) = self.model_slot(model, false)
            && self.cluster.gpu_model_speed(slot) != permille
        {
            self.emit(Event::GpuModelSpeedChanged(slot as u32, permille))?;
        }
        Ok(())
    }

    /// Reports how much run time a job has left, at its current worker count
    /// (what a training framework or a simulator knows); policies read it as
    /// the job's `remaining-ms`.
    pub fn report_progress(&mut self, id: JobId, remaining_ms: u64) -> Result<(), StateError> {
        let index = *self.job_index.get(&id).ok_or(StateError::UnknownJob(id))?;
        let job = self.cluster.job(index);
        let progress = model::JobProgress {
            remaining_ms,
            remaining_workers: job.workers(),
            reported_ms: self.now_ms,
            ..job.progress()
        };
        self.set_progress(progress)
    }

    /// Gives a job the run time and remaining time it had elsewhere (a
    /// rebuilt cell, a restarted host), as of now; its current run, if any,
    /// stays as it is.
    pub fn restore_progress(
        &mut self,
        id: JobId,
        attained_ms: u64,
        remaining_ms: u64,
        remaining_workers: u32,
    ) -> Result<(), StateError> {
        let index = *self.job_index.get(&id).ok_or(StateError::UnknownJob(id))?;
        let restored = model::JobProgress {
            attained_ms,
            remaining_ms,
            remaining_workers,
            reported_ms: self.now_ms,
            ..self.cluster.job(index).progress()
        };
        self.set_progress(restored)
    }

    /// Emits `progress` for its job if it differs from what the job has.
    fn set_progress(&mut self, progress: model::JobProgress) -> Result<(), StateError> {
        self.set_progresses(vec![progress])
    }

    /// [`ClusterState::set_progress`] for several jobs, in one event.
    fn set_progresses(&mut self, mut progress: Vec<model::JobProgress>) -> Result<(), StateError> {
        progress.retain(|p| *p != self.cluster.job(p.job).progress());
        if progress.is_empty() {
            return Ok(());
        }
        self.emit(Event::JobProgress(progress))
    }

    /// The progress event of job `index` starting (`true`) or stopping now.
    /// A stopped job banks its run time; one without a checkpoint starts
    /// over, so what is left is its estimate again.
    fn run_changed(&self, index: u32, starting: bool) -> model::JobProgress {
        let job = self.cluster.job(index);
        let p = job.progress();
        let now = self.now_ms;
        if starting {
            return model::JobProgress {
                started_ms: now.max(1),
                ..p
            };
        }
        if !job.checkpointed() {
            let fresh = model::JobProgress::submitted(
                index,
                job.estimate_ms().unwrap_or(0),
                self.jobs[index as usize].submitted_workers,
                now,
            );
            return model::JobProgress {
                attained_ms: p.attained_ms_at(now),
                ..fresh
            };
        }
        model::JobProgress {
            started_ms: 0,
            attained_ms: p.attained_ms_at(now),
            remaining_ms: p.remaining_ms_at(now).map_or(0, |r| r.max(1)),
            reported_ms: now,
            ..p
        }
    }

    /// Sets a tenant's GPU quota (whole GPUs; fractions count by their
    /// share; only guaranteed work consumes it), or removes it (`None`:
    /// unlimited). The quota is part of the cluster view (contract 0.3).
    pub fn set_tenant_quota(&mut self, tenant: &str, gpus: Option<u32>) -> Result<(), StateError> {
        let id = self.intern(tenant)?;
        let had = self.cluster.tenant_quota_milli(id).is_some();
        match gpus {
            Some(q) => {
                let milli = u64::from(q) * u64::from(model::FULL_GPU_MILLI);
                self.emit(Event::TenantQuotaChanged(id, milli))?;
                if !had {
                    self.retain_string(id);
                }
            }
            None if had => {
                self.emit(Event::TenantQuotaRemoved(id))?;
                self.release_string(id);
            }
            None => {}
        }
        Ok(())
    }

    /// Sets the operator's rules for sharing GPUs by QoS (contract 0.3
    /// `sharing-rules`); running work is re-charged under them.
    pub fn set_sharing(&mut self, rules: model::SharingRules) -> Result<(), StateError> {
        if rules != self.cluster.sharing() {
            self.emit(Event::SharingChanged(rules))?;
        }
        Ok(())
    }

    /// Publishes the health of GPU `index` of node `node` (`model::health`).
    pub fn set_gpu_health(&mut self, node: &str, index: u32, health: u8) -> Result<(), StateError> {
        if health > model::health::DISABLED {
            return Err(StateError::InvalidNode(format!(
                "unknown health code {health} for GPU {index} of `{node}`"
            )));
        }
        let n = *self
            .node_index
            .get(node)
            .ok_or_else(|| StateError::UnknownNode(node.to_string()))?;
        let range = self.cluster.node(n).gpu_range();
        let gpu = range.start + index;
        if !range.contains(&gpu) {
            return Err(StateError::InvalidNode(format!(
                "`{node}` has no GPU {index}"
            )));
        }
        if self.cluster.gpu(gpu).health() != health {
            self.emit(Event::GpuHealthChanged(gpu, health))?;
        }
        Ok(())
    }

    /// Records runtime statistics of running jobs (`job` is the job index).
    pub fn record_job_metrics(&mut self, metrics: Vec<model::JobMetric>) -> Result<(), StateError> {
        self.emit(Event::JobMetrics(metrics))
    }

    /// Records the load of inference jobs (`job` is the job index).
    pub fn record_service_metrics(
        &mut self,
        metrics: Vec<model::ServiceMetric>,
    ) -> Result<(), StateError> {
        self.emit(Event::ServiceMetrics(metrics))
    }

    /// Records host-side node load (`node` is the node index).
    pub fn record_node_metrics(
        &mut self,
        metrics: Vec<model::NodeMetric>,
    ) -> Result<(), StateError> {
        self.emit(Event::NodeMetrics(metrics))
    }

    /// Sets the span metric samples are averaged over; part of every
    /// snapshot, so it must be set before the first one is sent.
    pub fn set_metric_window_ms(&mut self, window_ms: u32) {
        self.cluster.set_metric_window_ms(window_ms);
    }

    /// Accepts a job into the queue.
    pub fn submit(&mut self, req: JobRequest) -> Result<JobId, StateError> {
        self.submit_with(req, JobTraits::default())
    }

    /// Accepts a job with contract-0.3 traits into the queue.
    pub fn submit_with(&mut self, req: JobRequest, traits: JobTraits) -> Result<JobId, StateError> {
        check_job(&req)?;
        check_traits(&req, &traits)?;
        if self.job_names.contains_key(&req.name) {
            return Err(StateError::DuplicateJob(req.name));
        }
        let mut mask = 0u64;
        for model in &req.gpu_models {
            mask |= 1u64 << self.model_slot(model, false)?;
        }
        let spec = JobSpec {
            name: self.intern(&req.name)?,
            tenant: self.intern(&req.tenant)?,
            kind: req.kind,
            qos: req.qos,
            priority: req.priority,
            workers: req.workers,
            min_workers: req.min_workers,
            max_workers: req.max_workers,
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            gpus_per_worker: req.gpus_per_worker,
            gpu_milli: req.gpu_milli,
            gpu_memory_mib: req.gpu_memory_mib,
            gpu_model_mask: mask,
            submit_ms: self.now_ms,
            estimate_ms: req.estimate_ms,
            deadline_ms: req.deadline_ms,
            checkpointed: req.checkpointed,
            gpu_milli_limit: traits.gpu_milli_limit,
            locality: traits.locality,
            slo_ms: traits.slo_ms,
            group: self.intern(&traits.group)?,
        };
        let id = JobId(self.next_job);
        self.next_job += 1;
        let index = self.cluster.job_count() as u32;
        let (name, tenant, group) = (spec.name, spec.tenant, spec.group);
        self.emit(Event::JobAdded(spec))?;
        self.retain_string(name);
        self.retain_string(tenant);
        self.retain_string(group);
        self.jobs.push(JobRecord {
            id,
            name: req.name.clone(),
            tenant: req.tenant,
            submit_ms: self.now_ms,
            first_start_ms: None,
            last_start_ms: None,
            preemptions: 0,
            submitted_workers: req.workers,
        });
        self.job_index.insert(id, index);
        self.job_names.insert(req.name, id);
        Ok(id)
    }

    /// Removes a job (finished, cancelled or failed), freeing what it held.
    pub fn remove(&mut self, id: JobId) -> Result<JobRecord, StateError> {
        let index = *self.job_index.get(&id).ok_or(StateError::UnknownJob(id))?;
        let columns = self.cluster.job_columns();
        let strings = (
            columns.name.get(index as usize).copied(),
            columns.tenant.get(index as usize).copied(),
            columns.group.get(index as usize).copied(),
        );
        self.emit(Event::JobRemoved(index))?;
        if let (Some(name), Some(tenant), Some(group)) = strings {
            self.release_string(name);
            self.release_string(tenant);
            self.release_string(group);
        }
        let record = self.jobs.swap_remove(index as usize);
        self.job_index.remove(&id);
        self.job_names.remove(&record.name);
        if let Some(moved) = self.jobs.get(index as usize) {
            self.job_index.insert(moved.id, index);
        }
        Ok(record)
    }

    /// Requeues a running job (e.g. its node died); its resources are freed.
    pub fn evict(&mut self, id: JobId) -> Result<(), StateError> {
        let index = *self.job_index.get(&id).ok_or(StateError::UnknownJob(id))?;
        self.stop_job(index)?;
        self.jobs[index as usize].preemptions += 1;
        Ok(())
    }

    /// Requeues a running job: frees its resources and banks its progress.
    fn stop_job(&mut self, index: u32) -> Result<(), StateError> {
        let running = self.cluster.job(index).phase() == job_phase::RUNNING;
        let progress = running.then(|| self.run_changed(index, false));
        self.emit(Event::JobEvicted(index))?;
        match progress {
            Some(p) => self.set_progress(p),
            None => Ok(()),
        }
    }

    /// Records GPU utilization samples.
    pub fn record_gpu_metrics(&mut self, metrics: Vec<model::GpuMetric>) -> Result<(), StateError> {
        self.emit(Event::GpuMetrics(metrics))
    }

    /// Moves the clock (virtual in simulation, wall in live mode).
    pub fn set_now(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    // ---- queries ----

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }
    pub fn epoch(&self) -> u64 {
        self.cluster.epoch()
    }
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }
    pub fn job_index(&self, id: JobId) -> Option<u32> {
        self.job_index.get(&id).copied()
    }
    pub fn job_by_name(&self, name: &str) -> Option<JobId> {
        self.job_names.get(name).copied()
    }
    pub fn record(&self, id: JobId) -> Option<&JobRecord> {
        self.job_index(id).map(|i| &self.jobs[i as usize])
    }
    /// Host records of all jobs, in the cluster's job-table order.
    pub fn records(&self) -> &[JobRecord] {
        &self.jobs
    }
    pub fn node_index(&self, name: &str) -> Option<u32> {
        self.node_index.get(name).copied()
    }
    pub fn tenant_quota(&self, tenant: &str) -> Option<u32> {
        let id = *self.interned.get(tenant)?;
        self.cluster
            .tenant_quota_milli(id)
            .map(|m| (m / u64::from(model::FULL_GPU_MILLI)) as u32)
    }

    /// Allocated milli-GPU over all GPUs' capacity, in percent.
    pub fn gpu_allocation_pct(&self) -> f64 {
        let g = self.cluster.gpu_columns();
        if g.node.is_empty() {
            return 0.0;
        }
        let used: u64 = g.milli_used.iter().map(|&m| u64::from(m)).sum();
        100.0 * used as f64 / (g.node.len() as f64 * f64::from(model::FULL_GPU_MILLI))
    }
}

fn check_job(req: &JobRequest) -> Result<(), StateError> {
    let fail = |msg: String| Err(StateError::InvalidJob(format!("`{}`: {msg}", req.name)));
    if req.name.is_empty() {
        return fail("empty name".into());
    }
    if req.workers == 0 {
        return fail("needs at least one worker".into());
    }
    if req.min_workers > req.workers || req.workers > req.max_workers {
        return fail(format!(
            "workers {} outside min..=max {}..={}",
            req.workers, req.min_workers, req.max_workers
        ));
    }
    if req.gpu_milli > model::FULL_GPU_MILLI {
        return fail(format!("gpu_milli {} above 1000", req.gpu_milli));
    }
    if req.gpus_per_worker > 1 && req.gpu_milli != model::FULL_GPU_MILLI {
        return fail("a fraction of a GPU is only possible with one GPU per worker".into());
    }
    if req.gpus_per_worker > 0 && req.gpu_milli == 0 {
        return fail("GPUs requested with a zero share".into());
    }
    if req.kind > model::job_kind::INTERACTIVE || req.qos > model::qos::BEST_EFFORT {
        return fail("unknown kind or QoS".into());
    }
    if req.gpus_per_worker > u32::from(u8::MAX) {
        return fail("more than 255 GPUs per worker".into());
    }
    Ok(())
}

/// The contract-0.3 traits of a job, against its request.
fn check_traits(req: &JobRequest, traits: &JobTraits) -> Result<(), StateError> {
    let fail = |msg: String| Err(StateError::InvalidJob(format!("`{}`: {msg}", req.name)));
    if traits.locality > model::locality::REQUIRE_ONE_NODE {
        return fail(format!("unknown locality {}", traits.locality));
    }
    if traits.gpu_milli_limit > 0
        && (traits.gpu_milli_limit < req.gpu_milli
            || traits.gpu_milli_limit > model::FULL_GPU_MILLI)
    {
        return fail(format!(
            "GPU limit {} outside request..=1000 ({}..=1000)",
            traits.gpu_milli_limit, req.gpu_milli
        ));
    }
    Ok(())
}
