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

/// The interned string table: its size, how much of it is referenced, compactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StringStats {
    /// Strings in the table (what a snapshot carries).
    pub total: usize,
    /// Strings some node, GPU model or job refers to.
    pub live: usize,
    /// Compactions so far.
    pub compactions: u64,
    /// The epoch the last compaction opened (0 = none): a mirror at an older
    /// epoch can only catch up with a snapshot.
    pub resync_epoch: u64,
}

impl StringStats {
    /// Strings nothing refers to any more.
    pub fn dead(&self) -> usize {
        self.total - self.live
    }
}

/// What one compaction of the string table did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// The resync epoch it opened.
    pub epoch: u64,
    pub strings_before: usize,
    pub strings_after: usize,
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

    fn retain_string(&mut self, id: u32) {
        if let Some(count) = self.string_refs.get_mut(id as usize) {
            if *count == 0 {
                self.live_strings += 1;
            }
            *count += 1;
        }
    }

    fn release_string(&mut self, id: u32) {
        if let Some(count) = self.string_refs.get_mut(id as usize)
            && *count > 0
        {
            *count -= 1;
            if *count == 0 {
                self.live_strings -= 1;
            }
        }
    }

    fn emit(&mut self, event: Event) -> Result<(), StateError> {
        self.cluster
            .apply_event(&event)
            .map_err(|e| StateError::Event(e.to_string()))?;
        self.events.push(event);
        Ok(())
    }

    /// Id of an interned string, interning it (and telling the policies) if new.
    /// Ids hold until the next compaction renumbers them; a string nothing
    /// refers to (one only interned here) counts as dead.
    pub fn intern(&mut self, s: &str) -> Result<u32, StateError> {
        if let Some(&id) = self.interned.get(s) {
            return Ok(id);
        }
        let id = self.cluster.strings().len() as u32;
        self.cluster
            .apply_event(&Event::StringsAdded(vec![s.to_string()]))
            .map_err(|e| StateError::Event(e.to_string()))?;
        match self.strings_event.and_then(|i| self.events.get_mut(i)) {
            Some(Event::StringsAdded(strings)) => strings.push(s.to_string()),
            _ => {
                self.strings_event = Some(self.events.len());
                self.events.push(Event::StringsAdded(vec![s.to_string()]));
            }
        }
        self.interned.insert(s.to_string(), id);
        self.string_refs.push(0);
        Ok(id)
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

    /// Closes the current epoch: returns the delta since the last round and the round's info.
    ///
    /// When the string table is due for compaction
    /// ([`ClusterState::compaction_due`]), the round first opens a resync
    /// epoch of its own ([`ClusterState::compact_strings`]), so the round's
    /// epoch is two past the last one and its delta starts at the resync
    /// epoch (a mirror from before it resyncs).
    /// The delta is the one the history keeps (shared, not copied: at ten
    /// times PAI's scale a round's delta holds tens of thousands of events).
    pub fn begin_round(&mut self, max_decisions: u32) -> (Arc<Delta>, RoundInfo) {
        if self.compaction_due()
            && let Err(e) = self.compact_strings()
        {
            // Unreachable for a consistent state; never fail a round for it.
            tracing::error!(error = %e, "string compaction failed; automatic compaction is off");
            self.compaction_floor = None;
        }
        let base_epoch = self.cluster.epoch();
        let epoch = base_epoch + 1;
        self.strings_event = None;
        let delta = Arc::new(Delta {
            base_epoch,
            epoch,
            now_ms: self.now_ms,
            events: std::mem::take(&mut self.events),
        });
        self.cluster.set_epoch(epoch, self.now_ms);
        self.history.write().push(delta.clone());
        (
            delta,
            RoundInfo {
                epoch,
                now_ms: self.now_ms,
                max_decisions,
            },
        )
    }

    /// One delta that takes a mirror at `epoch` to the current epoch, if the
    /// history still reaches back that far (else the mirror must resync).
    pub fn delta_since(&self, epoch: u64) -> Option<Delta> {
        let current = self.cluster.epoch();
        if epoch < self.resync_epoch {
            return None;
        }
        if epoch == current {
            return Some(Delta {
                base_epoch: epoch,
                epoch,
                now_ms: self.now_ms,
                events: Vec::new(),
            });
        }
        let log = self.history.read();
        let parts = log.since(epoch)?;
        Some(merge(epoch, current, self.now_ms, parts))
    }

    /// A handle on this state's delta history that other threads can read:
    /// a policy generation loaded off the round loop catches up with it
    /// before it is activated, so its first round applies one round's delta
    /// instead of every delta since its snapshot.
    pub fn delta_feed(&self) -> DeltaFeed {
        DeltaFeed {
            lineage: self.lineage,
            log: self.history.clone(),
        }
    }

    /// Whether events are waiting for the next round.
    pub fn has_pending_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Closes the current epoch if changes are pending (without a round), so
    /// that a snapshot and the deltas after it line up exactly.
    pub fn seal(&mut self) {
        if !self.events.is_empty() {
            self.begin_round(0);
        }
    }

    /// This state's identity, unique in the process. Epochs and deltas only
    /// mean something within one state's history: a policy instance asked
    /// about several states (the control plane's `matcher` and `reclaim`
    /// slots answer for every cell) resyncs when the state changes, even at
    /// an epoch its mirror has ([`crate::runtime::PolicyInstance::sync_to`]).
    pub fn lineage(&self) -> u64 {
        self.lineage
    }

    /// The full state, exact at the epoch it is labelled with (pending
    /// changes are sealed into a new epoch first; a snapshot labelled with
    /// the old epoch would make a mirror apply them twice).
    pub fn snapshot(&mut self) -> Snapshot {
        self.seal();
        self.cluster.to_snapshot()
    }

    /// The full state at `epoch()` without sealing: `None` while changes are
    /// pending. Within a round (after `begin_round`) it is always `Some`.
    pub fn snapshot_at_epoch(&self) -> Option<Snapshot> {
        self.events.is_empty().then(|| self.cluster.to_snapshot())
    }

    /// The string table's size, live part and compactions.
    pub fn string_stats(&self) -> StringStats {
        StringStats {
            total: self.cluster.strings().len(),
            live: self.live_strings,
            compactions: self.compactions,
            resync_epoch: self.resync_epoch,
        }
    }

    /// The epoch the last compaction opened (0 = none). A mirror at an older
    /// epoch cannot be caught up by a delta; it resyncs.
    pub fn resync_epoch(&self) -> u64 {
        self.resync_epoch
    }

    /// Whether the next round compacts the string table first: dead strings
    /// outnumber live ones and reach the floor.
    pub fn compaction_due(&self) -> bool {
        let stats = self.string_stats();
        self.compaction_floor
            .is_some_and(|floor| stats.dead() > stats.live && stats.dead() >= floor.max(1))
    }

    /// Drops the strings nothing refers to and renumbers the live ones, in a
    /// new epoch of its own — a resync epoch.
    ///
    /// Pending changes are folded into that epoch and the delta history is
    /// dropped: a mirror at any earlier epoch gets `None` from
    /// [`ClusterState::delta_since`] and resyncs from a snapshot, which is
    /// exact at this epoch and carries live strings only. Deltas after it
    /// work as before. Live strings are numbered in the order a fresh state
    /// interns them (per node: GPU model, name, pool, fabric; then per job:
    /// name, tenant, group; then tenants with a quota), so a compacted state snapshots like a fresh state built from
    /// the same nodes and jobs. The GPU-model table keeps its order, so job
    /// model masks keep their meaning. The latest metric samples, which a
    /// snapshot does not carry, are kept on the host.
    ///
    /// On error the state is unchanged.
    pub fn compact_strings(&mut self) -> Result<Compaction, StateError> {
        let strings_before = self.cluster.strings().len();
        let epoch = self.cluster.epoch() + 1;
        let span = tracing::info_span!(
            "compact_strings",
            epoch,
            strings_before,
            live = self.live_strings
        );
        let _guard = span.enter();
        let mut snapshot = self.cluster.to_snapshot();
        let old = std::mem::take(&mut snapshot.strings);
        let mut renumber = Renumber {
            old: &old,
            new_id: vec![UNMAPPED; old.len()],
            strings: Vec::with_capacity(self.live_strings),
        };
        {
            let (nodes, gpus) = (&mut snapshot.nodes, &mut snapshot.gpus);
            for n in 0..nodes.name.len() {
                if nodes.gpu_count[n] > 0
                    && let Some(&model) = gpus.model.get(nodes.first_gpu[n] as usize)
                {
                    renumber.id(model)?; // numbered here; rewritten with all GPUs below
                }
                nodes.name[n] = renumber.id(nodes.name[n])?;
                nodes.pool[n] = renumber.id(nodes.pool[n])?;
                nodes.fabric[n] = renumber.id(nodes.fabric[n])?;
            }
            for model in gpus.model.iter_mut() {
                *model = renumber.id(*model)?;
            }
        }
        for model in snapshot.gpu_models.iter_mut() {
            *model = renumber.id(*model)?;
        }
        let jobs = &mut snapshot.jobs;
        for j in 0..jobs.name.len() {
            jobs.name[j] = renumber.id(jobs.name[j])?;
            jobs.tenant[j] = renumber.id(jobs.tenant[j])?;
            jobs.group[j] = renumber.id(jobs.group[j])?;
        }
        for tenant in snapshot.tenants.name.iter_mut() {
            *tenant = renumber.id(*tenant)?;
        }
        let strings = renumber.strings;
        snapshot.strings = strings.clone();
        let window = snapshot.metric_window_ms;
        let mut cluster =
            Cluster::from_snapshot(snapshot).map_err(|e| StateError::Event(e.to_string()))?;
        cluster.set_metric_window_ms(window);
        // What a snapshot leaves out: the latest metric samples.
        for e in self.metric_events() {
            cluster
                .apply_event(&e)
                .map_err(|e| StateError::Event(e.to_string()))?;
        }
        cluster.set_epoch(epoch, self.now_ms);

        // Recount references over the new numbering (as the incremental
        // counts would have it: GPU-model slots, per node name, pool and model
        // if it has GPUs, per job name and tenant).
        let mut refs = vec![0u32; strings.len()];
        let mut count = |id: u32| {
            if let Some(r) = refs.get_mut(id as usize) {
                *r += 1;
            }
        };
        cluster.gpu_models().iter().for_each(|&m| count(m));
        for node in cluster.nodes() {
            let n = node.index() as usize;
            count(cluster.node_columns().name[n]);
            count(cluster.node_columns().pool[n]);
            count(cluster.node_columns().fabric[n]);
            if let Some(gpu) = node.gpus().next() {
                count(cluster.gpu_columns().model[gpu.index() as usize]);
            }
        }
        let jobs = cluster.job_columns();
        jobs.name
            .iter()
            .chain(jobs.tenant.iter())
            .chain(jobs.group.iter())
            .chain(cluster.tenant_columns().name.iter())
            .for_each(|&s| count(s));

        self.interned = strings
            .into_iter()
            .enumerate()
            .map(|(id, s)| (s, id as u32))
            .collect();
        self.live_strings = refs.iter().filter(|&&r| r > 0).count();
        self.string_refs = refs;
        self.cluster = cluster;
        self.events.clear();
        self.strings_event = None;
        self.history.write().reset(epoch, self.now_ms);
        self.resync_epoch = epoch;
        self.compactions += 1;
        let strings_after = self.cluster.strings().len();
        tracing::info!(
            epoch,
            strings_before,
            strings_after,
            "string table compacted; mirrors resync"
        );
        Ok(Compaction {
            epoch,
            strings_before,
            strings_after,
        })
    }

    /// The validator for this epoch: a [`Plan`] over the cluster (whose
    /// view carries the tenants' quotas and the sharing rules).
    /// [`ClusterState::validate`] and [`ClusterState::keep_valid`] both
    /// replay decisions through it.
    fn validator(&self, max_decisions: u32) -> Plan<'_> {
        Plan::new(&self.cluster).with_max_decisions(max_decisions)
    }

    /// The latest metric samples as events, for a mirror built from a
    /// snapshot (which carries none).
    fn metric_events(&self) -> Vec<Event> {
        let c = &self.cluster;
        let gpus: Vec<model::GpuMetric> = (0..c.gpu_count() as u32)
            .map(|g| c.gpu(g))
            .filter(|g| {
                g.utilization_pct() > 0 || g.sm_activity_pct() > 0 || g.sm_occupancy_pct() > 0
            })
            .map(|g| model::GpuMetric {
                gpu: g.index(),
                utilization_pct: g.utilization_pct(),
                sm_activity_pct: g.sm_activity_pct(),
                memory_used_mib: 0, // not kept by the cluster; ignored by it
                sm_occupancy_pct: g.sm_occupancy_pct(),
            })
            .collect();
        let jobs: Vec<model::JobMetric> = c
            .jobs()
            .map(|j| j.metrics())
            .filter(|m| {
                *m != model::JobMetric {
                    job: m.job,
                    ..Default::default()
                }
            })
            .collect();
        let services: Vec<model::ServiceMetric> = c
            .jobs()
            .map(|j| j.service())
            .filter(|m| {
                *m != model::ServiceMetric {
                    job: m.job,
                    ..Default::default()
                }
            })
            .collect();
        let nodes: Vec<model::NodeMetric> = (0..c.node_count() as u32)
            .map(|n| model::NodeMetric {
                node: n,
                ..c.node_metrics(n)
            })
            .filter(|m| {
                *m != model::NodeMetric {
                    node: m.node,
                    ..Default::default()
                }
            })
            .collect();
        let mut events = Vec::new();
        if !gpus.is_empty() {
            events.push(Event::GpuMetrics(gpus));
        }
        if !jobs.is_empty() {
            events.push(Event::JobMetrics(jobs));
        }
        if !services.is_empty() {
            events.push(Event::ServiceMetrics(services));
        }
        if !nodes.is_empty() {
            events.push(Event::NodeMetrics(nodes));
        }
        events
    }

    /// Checks a policy's decisions against the current epoch: all valid, or
    /// the first invalid one with its position.
    pub fn validate(
        &self,
        decisions: &[Decision],
        max_decisions: u32,
    ) -> Result<(), (usize, DecisionError)> {
        self.replay(decisions, max_decisions).map(|_| ())
    }

    /// Replays decisions through the validator and returns its tentative
    /// state after them (for rules that judge the result, e.g. that a
    /// reclaim plan empties the returned servers), or the first invalid one.
    pub fn replay(
        &self,
        decisions: &[Decision],
        max_decisions: u32,
    ) -> Result<Plan<'_>, (usize, DecisionError)> {
        if decisions.len() > max_decisions as usize {
            return Err((
                max_decisions as usize,
                DecisionError::TooManyDecisions {
                    limit: max_decisions,
                },
            ));
        }
        let mut plan = self.validator(max_decisions);
        for (i, d) in decisions.iter().enumerate() {
            plan.apply(d.clone()).map_err(|e| (i, e))?;
        }
        Ok(plan)
    }

    /// The decisions that survive validation one by one, in order: each is
    /// checked against the plan of those kept before it, so the result
    /// always passes [`ClusterState::validate`]. Used for the host's own
    /// native last resort, which must never leave a round without an
    /// answer; a Wasm policy's answer is all or nothing.
    pub fn keep_valid(
        &self,
        decisions: Vec<Decision>,
        max_decisions: u32,
    ) -> (Vec<Decision>, Vec<(usize, DecisionError)>) {
        let mut plan = self.validator(max_decisions);
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        // The plan itself refuses decisions past the limit.
        for (i, d) in decisions.into_iter().enumerate() {
            match plan.apply(d.clone()) {
                Ok(()) => kept.push(d),
                Err(e) => dropped.push((i, e)),
            }
        }
        (kept, dropped)
    }

    /// Carries out decisions that passed [`ClusterState::validate`] at this epoch.
    ///
    /// The jobs a round starts get their progress in one `job-progress` event
    /// after the round's placements, not one event each beside its placement:
    /// a placement changes no job's progress, so the mirror ends the same,
    /// and a thousand starts cross the policy boundary as one list instead of
    /// a thousand one-element lists.
    pub fn apply(&mut self, decisions: Vec<Decision>) -> Result<Applied, StateError> {
        let mut applied = Applied::default();
        let mut started = Vec::new();
        for d in decisions {
            if let Err(e) = self.apply_one(d, &mut applied, &mut started) {
                // The jobs started before the failed decision still get their
                // progress; the decision's error is the one to report.
                if let Err(progress) = self.set_progresses(started) {
                    tracing::error!(error = %progress, "recording the progress of the jobs started before a failed decision");
                }
                return Err(e);
            }
        }
        self.set_progresses(started)?;
        Ok(applied)
    }

    /// One decision of [`ClusterState::apply`]; the progress of a job it
    /// starts goes to `started`.
    fn apply_one(
        &mut self,
        d: Decision,
        applied: &mut Applied,
        started: &mut Vec<model::JobProgress>,
    ) -> Result<(), StateError> {
        let job = d.job();
        let Some(record) = self.jobs.get(job as usize) else {
            return Err(StateError::Event(format!(
                "decision for unknown job index {job}"
            )));
        };
        let id = record.id;
        match d {
            Decision::Place(j, workers) | Decision::Migrate(j, workers) => {
                let starting = self.cluster.job(j).phase() != job_phase::RUNNING;
                self.emit(Event::JobPlaced(j, workers))?;
                if starting {
                    started.push(self.run_changed(j, true));
                    let rec = &mut self.jobs[j as usize];
                    rec.first_start_ms.get_or_insert(self.now_ms);
                    rec.last_start_ms = Some(self.now_ms);
                    applied.started.push(id);
                } else {
                    applied.migrated.push(id);
                }
            }
            Decision::ScaleOut(j, added) => {
                let workers = self.cluster.job(j).placement_with(&added);
                self.emit(Event::JobPlaced(j, workers))?;
                applied.resized.push(id);
            }
            Decision::ScaleIn(j, positions) => {
                let workers = self.cluster.job(j).placement_without(&positions);
                self.emit(Event::JobPlaced(j, workers))?;
                applied.resized.push(id);
            }
            Decision::Preempt(j) => {
                self.stop_job(j)?;
                self.jobs[j as usize].preemptions += 1;
                applied.preempted.push(id);
            }
            Decision::Reserve(j, nodes) => {
                self.emit(Event::JobReserved(j, nodes))?;
                applied.other += 1;
            }
            Decision::Unreserve(j) => {
                self.emit(Event::JobReserved(j, Vec::new()))?;
                self.emit(Event::JobReservedGpus(j, Vec::new()))?;
                applied.other += 1;
            }
            Decision::ReserveGpus(j, gpus) => {
                self.emit(Event::JobReservedGpus(j, gpus))?;
                applied.other += 1;
            }
            Decision::SetQos(j, q) => {
                self.emit(Event::JobQosChanged(j, q))?;
                applied.qos_changed.push(id);
            }
        }
        Ok(())
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

/// The rounds' deltas since the last resync epoch, newest last, at most
/// [`DELTA_HISTORY`] of them.
#[derive(Debug, Default)]
struct DeltaLog {
    /// The epoch after the newest delta (the state's epoch).
    epoch: u64,
    now_ms: u64,
    /// Mirrors older than this epoch cannot catch up by delta.
    resync_epoch: u64,
    deltas: VecDeque<Arc<Delta>>,
}

impl DeltaLog {
    fn push(&mut self, delta: Arc<Delta>) {
        if self.deltas.len() == DELTA_HISTORY {
            self.deltas.pop_front();
        }
        self.epoch = delta.epoch;
        self.now_ms = delta.now_ms;
        self.deltas.push_back(delta);
    }

    /// Forgets every delta: `epoch` is a resync epoch.
    fn reset(&mut self, epoch: u64, now_ms: u64) {
        self.deltas.clear();
        self.epoch = epoch;
        self.now_ms = now_ms;
        self.resync_epoch = epoch;
    }

    /// The deltas from `epoch` to the newest, if the log reaches back to it.
    fn since(&self, epoch: u64) -> Option<impl Iterator<Item = &Arc<Delta>> + Clone> {
        if epoch < self.resync_epoch {
            return None;
        }
        let first = self.deltas.iter().position(|d| d.base_epoch == epoch)?;
        Some(self.deltas.iter().skip(first))
    }
}

/// Concatenates consecutive deltas into one from `base_epoch` to `epoch`.
fn merge<'a>(
    base_epoch: u64,
    epoch: u64,
    now_ms: u64,
    parts: impl Iterator<Item = &'a Arc<Delta>> + Clone,
) -> Delta {
    let mut events = Vec::with_capacity(parts.clone().map(|d| d.events.len()).sum());
    for d in parts {
        events.extend(d.events.iter().cloned());
    }
    Delta {
        base_epoch,
        epoch,
        now_ms,
        events,
    }
}

/// A read-only handle on a [`ClusterState`]'s recent deltas that another
/// thread can hold ([`ClusterState::delta_feed`]): what a policy generation
/// loaded off the round loop needs to follow the state up to the round
/// before its activation.
#[derive(Clone, Debug)]
pub struct DeltaFeed {
    /// The [`ClusterState::lineage`] of the state it reads.
    lineage: u64,
    log: Arc<RwLock<DeltaLog>>,
}

impl DeltaFeed {
    /// The [`ClusterState::lineage`] of the state whose deltas these are.
    pub fn lineage(&self) -> u64 {
        self.lineage
    }

    /// The state's epoch as of its last round (or seal, or compaction).
    pub fn epoch(&self) -> u64 {
        self.log.read().epoch
    }

    /// The last resync epoch: a mirror older than it needs a snapshot.
    pub fn resync_epoch(&self) -> u64 {
        self.log.read().resync_epoch
    }

    /// One delta from `epoch` to the feed's epoch, like
    /// [`ClusterState::delta_since`]; `None` if the history no longer
    /// reaches back to `epoch` (or `epoch` is ahead of it). The lock is held
    /// only to copy a few pointers, never while events are cloned, so the
    /// round loop is not held up.
    pub fn delta_since(&self, epoch: u64) -> Option<Delta> {
        let (parts, current, now_ms) = {
            let log = self.log.read();
            if epoch == log.epoch {
                return Some(Delta {
                    base_epoch: epoch,
                    epoch,
                    now_ms: log.now_ms,
                    events: Vec::new(),
                });
            }
            let parts: Vec<Arc<Delta>> = log.since(epoch)?.cloned().collect();
            (parts, log.epoch, log.now_ms)
        };
        Some(merge(epoch, current, now_ms, parts.iter()))
    }
}

/// Old string id → new, numbering strings in the order they are first met.
struct Renumber<'a> {
    old: &'a [String],
    new_id: Vec<u32>,
    strings: Vec<String>,
}

impl Renumber<'_> {
    /// The new id of old id `id` (every column is rewritten from old ids once).
    fn id(&mut self, id: u32) -> Result<u32, StateError> {
        let old = id as usize;
        let (Some(&mapped), Some(s)) = (self.new_id.get(old), self.old.get(old)) else {
            return Err(StateError::Event(format!(
                "string id {old} out of range ({} strings)",
                self.old.len()
            )));
        };
        if mapped != UNMAPPED {
            return Ok(mapped);
        }
        let new = self.strings.len() as u32;
        self.new_id[old] = new;
        self.strings.push(s.clone());
        Ok(new)
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

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::model::WorkerPlacement;

    fn node(name: &str, gpus: u32) -> NodeRequest {
        NodeRequest {
            name: name.into(),
            pool: "default".into(),
            cpu_milli: 64_000,
            memory_mib: 512_000,
            gpu_model: "V100".into(),
            gpu_memory_mib: 32_768,
            gpu_count: gpus,
            on_loan: false,
        }
    }

    #[test]
    fn deltas_replayed_on_a_mirror_reproduce_the_host_state() {
        let mut s = ClusterState::new();
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        s.add_node(node("a", 4)).unwrap();
        let j1 = s.submit(JobRequest::gpus("j1", "t", 1, 2)).unwrap();
        let j2 = s.submit(JobRequest::gpus("j2", "t", 1, 1)).unwrap();
        let (delta, _) = s.begin_round(10);
        mirror.apply(&delta).unwrap();
        let decisions = vec![Decision::Place(
            0,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![0, 1],
            }],
        )];
        s.validate(&decisions, 10).unwrap();
        s.apply(decisions).unwrap();
        s.remove(j2).unwrap();
        let (delta, _) = s.begin_round(10);
        mirror.apply(&delta).unwrap();
        assert_eq!(mirror.to_snapshot(), s.snapshot());
        assert_eq!(s.record(j1).unwrap().first_start_ms, Some(0));
        assert!((s.gpu_allocation_pct() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn delta_since_merges_history_and_gives_up_past_it() {
        let mut s = ClusterState::new();
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        for i in 0..3 {
            s.add_node(node(&format!("n{i}"), 1)).unwrap();
            s.begin_round(1);
        }
        let d = s.delta_since(0).unwrap();
        mirror.apply(&d).unwrap();
        assert_eq!(mirror.to_snapshot(), s.snapshot());
        for _ in 0..DELTA_HISTORY {
            s.begin_round(1);
        }
        assert!(s.delta_since(0).is_none());
    }

    /// An epoch's new names cross in one `strings-added` event, ahead of the
    /// first event naming them, in the order they were interned; a mirror
    /// that applies the delta ends where the host is.
    #[test]
    fn an_epochs_new_strings_travel_in_one_event() {
        let mut s = ClusterState::new();
        s.add_node(node("a", 4)).unwrap();
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        let before = s.cluster().strings().len();
        for (name, tenant) in [("j1", "team-a"), ("j2", "team-b"), ("j3", "team-a")] {
            s.submit(JobRequest::gpus(name, tenant, 1, 1)).unwrap();
        }
        let (delta, _) = s.begin_round(10);
        let added: Vec<&Vec<String>> = delta
            .events
            .iter()
            .filter_map(|e| match e {
                Event::StringsAdded(strings) => Some(strings),
                _ => None,
            })
            .collect();
        assert_eq!(added.len(), 1, "{:?}", delta.events);
        assert!(matches!(delta.events[0], Event::StringsAdded(_)));
        assert_eq!(added[0][..], s.cluster().strings()[before..]);
        mirror.apply(&delta).unwrap();
        assert_eq!(mirror.to_snapshot(), s.snapshot());
        // The next epoch opens its own event.
        s.submit(JobRequest::gpus("j4", "team-c", 1, 1)).unwrap();
        let (delta, _) = s.begin_round(10);
        assert!(matches!(&delta.events[0], Event::StringsAdded(v) if v.len() == 2));
        mirror.apply(&delta).unwrap();
        assert_eq!(mirror.to_snapshot(), s.snapshot());
    }

    #[test]
    fn snapshot_between_rounds_does_not_replay_pending_changes() {
        let mut s = ClusterState::new();
        s.add_node(node("a", 2)).unwrap();
        // A mirror loaded between rounds, then caught up by the next round's delta.
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        assert!(s.snapshot_at_epoch().is_some());
        s.submit(JobRequest::gpus("j", "t", 1, 1)).unwrap();
        assert!(s.snapshot_at_epoch().is_none());
        let (delta, _) = s.begin_round(10);
        mirror.apply(&delta).unwrap();
        assert_eq!(mirror.node_count(), 1);
        assert_eq!(mirror.to_snapshot(), s.snapshot());
    }

    #[test]
    fn invalid_requests_are_refused_with_reasons() {
        let mut s = ClusterState::new();
        s.add_node(node("a", 1)).unwrap();
        assert_eq!(
            s.add_node(node("a", 1)),
            Err(StateError::DuplicateNode("a".into()))
        );
        // One node cannot claim a billion GPUs (the mirror refuses it too).
        assert!(matches!(
            s.add_node(node("huge", model::MAX_NODE_GPUS + 1)),
            Err(StateError::InvalidNode(_))
        ));
        let mut bad = JobRequest::gpus("x", "t", 1, 2);
        bad.gpu_milli = 500;
        assert!(matches!(s.submit(bad), Err(StateError::InvalidJob(_))));
        let mut unknown = JobRequest::gpus("y", "t", 1, 1);
        unknown.gpu_models = vec!["H100".into()];
        assert_eq!(
            s.submit(unknown),
            Err(StateError::UnknownGpuModel("H100".into()))
        );
        assert!(matches!(
            s.submit(JobRequest::gpus("z", "t", 0, 1)),
            Err(StateError::InvalidJob(_))
        ));
    }

    #[test]
    fn quota_is_enforced_by_validation() {
        let mut s = ClusterState::new();
        s.add_node(node("a", 4)).unwrap();
        s.submit(JobRequest::gpus("j", "team", 1, 3)).unwrap();
        s.set_tenant_quota("team", Some(2)).unwrap();
        s.begin_round(10);
        let d = vec![Decision::Place(
            0,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![0, 1, 2],
            }],
        )];
        assert!(matches!(
            s.validate(&d, 10),
            Err((0, DecisionError::QuotaExceeded { .. }))
        ));
    }

    /// The quota charged to a tenant follows every decision of the round:
    /// a migration keeps it, a preemption frees it, both for later
    /// decisions of the same round.
    #[test]
    fn quota_follows_migrations_and_preemptions_within_a_round() {
        let w = |node: u32, gpus: Vec<u32>| vec![WorkerPlacement { node, gpus }];
        let mut s = ClusterState::new();
        s.add_node(node("a", 4)).unwrap();
        s.add_node(node("b", 4)).unwrap();
        s.set_tenant_quota("team", Some(2)).unwrap();
        for name in ["running", "next", "third"] {
            s.submit(JobRequest::gpus(name, "team", 1, 1)).unwrap();
        }
        s.begin_round(10);
        let start = vec![Decision::Place(0, w(0, vec![0]))];
        s.validate(&start, 10).unwrap();
        s.apply(start).unwrap();
        s.begin_round(10);
        // Moving the running job does not charge it twice.
        let moved_then_placed = vec![
            Decision::Migrate(0, w(1, vec![4])),
            Decision::Place(1, w(0, vec![0])),
        ];
        assert_eq!(s.validate(&moved_then_placed, 10), Ok(()));
        // Two more would be three GPUs: the second is refused.
        let over = vec![
            Decision::Place(1, w(0, vec![1])),
            Decision::Place(2, w(0, vec![2])),
        ];
        assert!(matches!(
            s.validate(&over, 10),
            Err((1, DecisionError::QuotaExceeded { .. }))
        ));
        // A preemption frees its share for the same round.
        let swapped = vec![
            Decision::Preempt(0),
            Decision::Place(1, w(0, vec![1])),
            Decision::Place(2, w(0, vec![2])),
        ];
        assert_eq!(s.validate(&swapped, 10), Ok(()));
    }

    // ---- string-table compaction ----

    fn gpu_node(name: &str, pool: &str, model: &str, gpus: u32) -> NodeRequest {
        NodeRequest {
            name: name.into(),
            pool: pool.into(),
            gpu_model: model.into(),
            ..node(name, gpus)
        }
    }

    /// Distinct string ids the columns refer to, found by a full scan (what
    /// the incremental reference counts must agree with).
    fn live_by_scan(s: &ClusterState) -> usize {
        let c = s.cluster();
        let mut ids: std::collections::BTreeSet<u32> = c.gpu_models().iter().copied().collect();
        ids.extend(&c.node_columns().name);
        ids.extend(&c.node_columns().pool);
        ids.extend(&c.gpu_columns().model);
        ids.extend(&c.job_columns().name);
        ids.extend(&c.job_columns().tenant);
        ids.extend(&c.node_columns().fabric);
        ids.extend(&c.job_columns().group);
        ids.extend(&c.tenant_columns().name);
        ids.len()
    }

    /// A job as names and indices: name, tenant, phase, model mask,
    /// placement, reserved nodes.
    type JobView = (String, String, u8, u64, Vec<WorkerPlacement>, Vec<u32>);

    /// Everything a string id stands for, as strings, plus what refers to indices.
    #[derive(Debug, PartialEq)]
    struct View {
        nodes: Vec<(String, String, Option<u32>)>,
        gpu_models: Vec<String>,
        gpus: Vec<(u32, String, u8, u8)>,
        jobs: Vec<JobView>,
    }

    fn view(s: &ClusterState) -> View {
        let c = s.cluster();
        View {
            nodes: c
                .nodes()
                .map(|n| (n.name().into(), n.pool().into(), c.reserved_by(n.index())))
                .collect(),
            gpu_models: c
                .gpu_models()
                .iter()
                .map(|&m| c.string(m).to_string())
                .collect(),
            gpus: (0..c.gpu_count() as u32)
                .map(|g| {
                    let g = c.gpu(g);
                    (
                        g.node(),
                        g.model().to_string(),
                        g.utilization_pct(),
                        g.sm_activity_pct(),
                    )
                })
                .collect(),
            jobs: c
                .jobs()
                .map(|j| {
                    (
                        j.name().into(),
                        j.tenant().into(),
                        j.phase(),
                        j.gpu_model_mask(),
                        j.placement().to_vec(),
                        j.reserved_nodes().to_vec(),
                    )
                })
                .collect(),
        }
    }

    fn place(s: &mut ClusterState, job: u32, node: u32, gpus: Vec<u32>) {
        let d = vec![Decision::Place(job, vec![WorkerPlacement { node, gpus }])];
        s.validate(&d, 10).unwrap();
        s.apply(d).unwrap();
    }

    /// Three nodes (two models, two pools), 200 jobs of which 12 live on:
    /// running, reserved, pending with a model constraint.
    fn churned_state() -> ClusterState {
        let mut s = ClusterState::new().with_compaction_floor(None);
        s.add_node(gpu_node("a", "train", "V100", 4)).unwrap();
        s.add_node(gpu_node("b", "infer", "T4", 2)).unwrap();
        s.add_node(gpu_node("c", "train", "V100", 2)).unwrap();
        let mut ids = Vec::new();
        for i in 0..200 {
            let mut req = JobRequest::gpus(format!("j{i}"), format!("t{}", i % 7), 1, 1);
            if i % 3 == 0 {
                req.gpu_models = vec!["T4".into()];
            }
            ids.push(s.submit(req).unwrap());
        }
        s.begin_round(10);
        // Keep every 17th job (12 of them).
        for (i, id) in ids.iter().enumerate() {
            if i % 17 != 0 {
                s.remove(*id).unwrap();
            }
        }
        s.begin_round(10);
        let by_name = |s: &ClusterState, n: &str| {
            let id = s.job_by_name(n).unwrap();
            s.job_index(id).unwrap()
        };
        let j0 = by_name(&s, "j0"); // T4 only
        place(&mut s, j0, 1, vec![4]);
        let j17 = by_name(&s, "j17");
        place(&mut s, j17, 0, vec![2]);
        let j34 = by_name(&s, "j34");
        let d = vec![Decision::Reserve(j34, vec![2])];
        s.validate(&d, 10).unwrap();
        s.apply(d).unwrap();
        s.record_gpu_metrics(vec![model::GpuMetric {
            gpu: 2,
            utilization_pct: 80,
            sm_activity_pct: 40,
            memory_used_mib: 1000,
            sm_occupancy_pct: 30,
        }])
        .unwrap();
        s.begin_round(10);
        s
    }

    #[test]
    fn string_counts_follow_submissions_and_removals() {
        let mut s = ClusterState::new().with_compaction_floor(None);
        s.add_node(gpu_node("a", "p", "V100", 2)).unwrap();
        // A CPU node's empty model string is interned but not referred to
        // as a model; "" is every node's fabric (unknown), so it is live.
        s.add_node(gpu_node("cpu", "p", "", 0)).unwrap();
        assert_eq!(s.string_stats().live, live_by_scan(&s));
        assert_eq!(s.string_stats().dead(), 0);
        let a = s.submit(JobRequest::gpus("x", "t", 1, 1)).unwrap();
        let b = s.submit(JobRequest::gpus("y", "t", 1, 1)).unwrap();
        assert_eq!(s.string_stats().live, live_by_scan(&s));
        s.remove(a).unwrap();
        // `t` is still the tenant of `y`.
        assert_eq!(s.string_stats().live, live_by_scan(&s));
        s.remove(b).unwrap();
        let stats = s.string_stats();
        assert_eq!(stats.live, live_by_scan(&s));
        // x, y, t and the jobs' groups (""; still the nodes' fabric) die.
        assert_eq!((stats.total, stats.dead()), (8, 3));
        assert!(!s.compaction_due(), "automatic compaction is off");
        s.set_compaction_floor(Some(4));
        assert!(
            !s.compaction_due(),
            "dead strings do not outnumber live ones"
        );
        for unused in ["u1", "u2", "u3"] {
            s.intern(unused).unwrap();
        }
        assert!(s.compaction_due());
        s.set_compaction_floor(Some(7));
        assert!(!s.compaction_due(), "below the floor");
    }

    #[test]
    fn compaction_renumbers_every_column_that_names_a_string() {
        let mut s = churned_state();
        let before = view(&s);
        let stats = s.string_stats();
        assert_eq!(stats.live, live_by_scan(&s));
        assert!(stats.dead() > 150, "{stats:?}");
        let epoch = s.epoch();
        let c = s.compact_strings().unwrap();
        assert_eq!(c.epoch, epoch + 1);
        assert_eq!(c.strings_before, stats.total);
        // 3 names + 2 pools + 2 models + "" (fabric, group) + 12 job names
        // + 7 tenants.
        assert_eq!(c.strings_after, 27);
        assert_eq!(
            view(&s),
            before,
            "every name, placement and reservation kept"
        );
        let stats = s.string_stats();
        assert_eq!((stats.total, stats.live, stats.compactions), (27, 27, 1));
        assert_eq!(stats.live, live_by_scan(&s));
        // The host's own maps follow the new numbering.
        let n = s.cluster().strings().len();
        let j17 = s.job_index(s.job_by_name("j17").unwrap()).unwrap();
        assert_eq!(
            s.intern("j17").unwrap(),
            s.cluster().job_columns().name[j17 as usize]
        );
        assert_eq!(s.cluster().strings().len(), n, "no string interned twice");
        for r in s.records() {
            let i = s.job_index(r.id).unwrap();
            assert_eq!(s.cluster().job(i).name(), r.name);
            assert_eq!(s.cluster().job(i).tenant(), r.tenant);
        }
        // A model constraint still means the same model.
        let mut t4 = JobRequest::gpus("new", "t1", 1, 1);
        t4.gpu_models = vec!["T4".into()];
        let id = s.submit(t4).unwrap();
        let j = s.job_index(id).unwrap();
        assert!(s.cluster().job(j).allows_gpu(4) && !s.cluster().job(j).allows_gpu(0));
        assert_eq!(s.string_stats().total, 28, "only the new job's name is new");
        // Quotas are looked up through the rebuilt table.
        s.set_tenant_quota("t1", Some(0)).unwrap();
        s.begin_round(10);
        let d = vec![Decision::Place(
            j,
            vec![WorkerPlacement {
                node: 1,
                gpus: vec![5],
            }],
        )];
        assert!(matches!(
            s.validate(&d, 10),
            Err((0, DecisionError::QuotaExceeded { .. }))
        ));
    }

    #[test]
    fn snapshot_after_compaction_equals_a_fresh_state_of_the_live_jobs() {
        let mut s = churned_state();
        s.compact_strings().unwrap();
        // Build the same cluster from scratch: nodes, then the live jobs in
        // job-table order, their placements and reservations.
        let mut fresh = ClusterState::new();
        fresh.add_node(gpu_node("a", "train", "V100", 4)).unwrap();
        fresh.add_node(gpu_node("b", "infer", "T4", 2)).unwrap();
        fresh.add_node(gpu_node("c", "train", "V100", 2)).unwrap();
        for job in s.cluster().jobs() {
            let i: u32 = job.name()[1..].parse().unwrap();
            let mut req = JobRequest::gpus(job.name(), job.tenant(), 1, 1);
            if i.is_multiple_of(3) {
                req.gpu_models = vec!["T4".into()];
            }
            fresh.submit(req).unwrap();
        }
        fresh.begin_round(10);
        for job in s.cluster().jobs() {
            if !job.placement().is_empty() {
                let w = &job.placement()[0];
                place(&mut fresh, job.index(), w.node, w.gpus.clone());
            }
            if !job.reserved_nodes().is_empty() {
                let d = vec![Decision::Reserve(
                    job.index(),
                    job.reserved_nodes().to_vec(),
                )];
                fresh.apply(d).unwrap();
            }
        }
        let (mut compacted, mut built) = (s.snapshot(), fresh.snapshot());
        compacted.epoch = 0;
        built.epoch = 0;
        assert_eq!(compacted, built);
        assert_eq!(view(&s).jobs, view(&fresh).jobs);
    }

    #[test]
    fn compaction_opens_a_resync_epoch() {
        let mut s = churned_state();
        let feed = s.delta_feed();
        let old_mirror_epoch = s.epoch();
        s.begin_round(10);
        assert!(s.delta_since(old_mirror_epoch).is_some());
        // Pending changes are folded into the resync epoch.
        let late = s.submit(JobRequest::gpus("late", "t0", 1, 1)).unwrap();
        let before = s.epoch();
        let c = s.compact_strings().unwrap();
        assert_eq!(
            (c.epoch, s.epoch(), s.resync_epoch()),
            (before + 1, before + 1, before + 1)
        );
        assert!(!s.has_pending_events());
        assert!(s.job_index(late).is_some());
        // Mirrors from before must resync; none can be caught up by delta.
        for e in [old_mirror_epoch, before] {
            assert!(s.delta_since(e).is_none());
            assert!(feed.delta_since(e).is_none());
        }
        assert_eq!(feed.epoch(), c.epoch);
        assert_eq!(feed.resync_epoch(), c.epoch);
        assert!(s.delta_since(c.epoch).unwrap().events.is_empty());
        // A mirror built at the resync epoch follows by deltas as before.
        let snapshot = s.snapshot_at_epoch().unwrap();
        assert_eq!(snapshot.epoch, c.epoch);
        assert_eq!(snapshot.strings.len(), c.strings_after);
        let mut mirror = Cluster::from_snapshot(snapshot).unwrap();
        s.submit(JobRequest::gpus("after", "t9", 1, 1)).unwrap();
        let (delta, round) = s.begin_round(10);
        assert_eq!((delta.base_epoch, round.epoch), (c.epoch, c.epoch + 1));
        mirror.apply(&delta).unwrap();
        assert_eq!(mirror.to_snapshot(), s.snapshot());
        assert_eq!(feed.delta_since(c.epoch).unwrap().events, delta.events);
    }

    #[test]
    fn a_round_compacts_first_when_dead_strings_dominate() {
        let mut s = ClusterState::new().with_compaction_floor(Some(20));
        s.add_node(node("a", 8)).unwrap();
        let mut last_epoch = s.epoch();
        let mut resync_epochs = Vec::new();
        for i in 0..100 {
            let id = s
                .submit(JobRequest::gpus(format!("job-{i}"), "t", 1, 1))
                .unwrap();
            let due = s.compaction_due();
            let (delta, round) = s.begin_round(10);
            if due {
                // The round's epoch follows the resync epoch it opened.
                assert_eq!(round.epoch, last_epoch + 2);
                assert_eq!(delta.base_epoch, s.resync_epoch());
                assert!(delta.events.is_empty());
                resync_epochs.push(s.resync_epoch());
            } else {
                assert_eq!(round.epoch, last_epoch + 1);
            }
            last_epoch = round.epoch;
            s.remove(id).unwrap();
            let stats = s.string_stats();
            assert!(stats.total <= 2 * stats.live + 20 + 2, "{stats:?}");
        }
        // 100 names died: a compaction every ~20 of them.
        assert_eq!(s.string_stats().compactions as usize, resync_epochs.len());
        assert!(resync_epochs.len() >= 4, "{resync_epochs:?}");
    }

    #[test]
    fn mirrors_resync_after_a_compaction_and_their_decisions_stay_valid() {
        use arbiter_policy_sdk::Runtime;
        let mut s = ClusterState::new().with_compaction_floor(Some(32));
        for i in 0..4 {
            s.add_node(node(&format!("n{i}"), 4)).unwrap();
        }
        let mut policy =
            crate::runtime::PolicyInstance::native(Box::new(Runtime::<policy_fifo::Fifo>::new()));
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        let (mut resyncs, mut started) = (0, 0);
        for round in 0..300u64 {
            s.set_now(round * 10);
            for k in 0..2 {
                s.submit(JobRequest::gpus(
                    format!("r{round}-{k}"),
                    format!("t{k}"),
                    1,
                    1,
                ))
                .unwrap();
            }
            // Jobs finish after about 5 rounds.
            let done: Vec<JobId> = s
                .records()
                .iter()
                .filter(|r| r.last_start_ms.is_some_and(|t| t + 50 <= round * 10))
                .map(|r| r.id)
                .collect();
            for id in done {
                s.remove(id).unwrap();
            }
            let (_, info) = s.begin_round(100);
            match s.delta_since(mirror.epoch()) {
                Some(delta) => mirror.apply(&delta).unwrap(),
                None => {
                    resyncs += 1;
                    mirror = Cluster::from_snapshot(s.snapshot_at_epoch().unwrap()).unwrap();
                }
            }
            assert_eq!(mirror.to_snapshot(), s.snapshot_at_epoch().unwrap());
            policy.sync_to(&s).unwrap();
            assert_eq!(policy.mirror_epoch(), Some(s.epoch()));
            let decisions = policy.schedule(info).unwrap();
            s.validate(&decisions, 100).unwrap();
            started += s.apply(decisions).unwrap().started.len();
            let stats = s.string_stats();
            assert!(stats.total <= 2 * stats.live + 32 + 4, "{stats:?}");
        }
        let compactions = s.string_stats().compactions;
        assert!(compactions >= 3, "{compactions} compactions");
        assert_eq!(
            resyncs, compactions,
            "a mirror resyncs only at a compaction"
        );
        assert!(started >= 500, "{started} jobs started");
    }

    #[test]
    fn reservations_and_utilization_survive_on_the_host() {
        let mut s = churned_state();
        let reserved = s.job_by_name("j34").unwrap();
        s.compact_strings().unwrap();
        let c = s.cluster();
        let j = s.job_index(reserved).unwrap();
        assert_eq!(c.job(j).reserved_nodes(), &[2]);
        assert_eq!(c.reserved_by(2), Some(j));
        assert_eq!(
            (c.gpu(2).utilization_pct(), c.gpu(2).sm_activity_pct()),
            (80, 40)
        );
        // Node 2 is still closed to other jobs.
        let other = s.job_index(s.job_by_name("j68").unwrap()).unwrap();
        s.begin_round(10);
        let d = vec![Decision::Place(
            other,
            vec![WorkerPlacement {
                node: 2,
                gpus: vec![6],
            }],
        )];
        assert!(s.validate(&d, 10).is_err());
    }

    #[test]
    fn a_delta_feed_is_read_from_another_thread() {
        let mut s = ClusterState::new();
        s.add_node(node("a", 4)).unwrap();
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        let feed = s.delta_feed();
        for i in 0..10 {
            s.submit(JobRequest::gpus(format!("j{i}"), "t", 1, 1))
                .unwrap();
            s.begin_round(10);
        }
        let target = s.epoch();
        let reader = std::thread::spawn(move || {
            let d = feed.delta_since(mirror.epoch()).unwrap();
            mirror.apply(&d).unwrap();
            mirror
        });
        let mirror = reader.join().unwrap();
        assert_eq!(mirror.epoch(), target);
        assert_eq!(mirror.to_snapshot(), s.snapshot());
    }

    fn place_on(s: &mut ClusterState, job: u32, node: u32, gpus: Vec<u32>) {
        let d = vec![Decision::Place(job, vec![WorkerPlacement { node, gpus }])];
        s.validate(&d, 10).unwrap();
        s.apply(d).unwrap();
    }

    #[test]
    fn progress_follows_runs_and_reports() {
        let mut s = ClusterState::new();
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        s.add_node(node("a", 4)).unwrap();
        let mut req = JobRequest::gpus("ckpt", "t", 2, 1);
        req.estimate_ms = 100_000;
        let ckpt = s.submit(req).unwrap();
        let mut req = JobRequest::gpus("fresh", "t", 1, 1);
        req.estimate_ms = 50_000;
        req.checkpointed = false;
        let fresh = s.submit(req).unwrap();
        // Until anything runs, what is left is the estimate at the submitted size.
        let p = s.cluster().job(0).progress();
        assert_eq!(
            (p.remaining_ms, p.remaining_workers, p.started_ms),
            (100_000, 2, 0)
        );

        s.set_now(1_000);
        s.begin_round(10);
        let d = vec![Decision::Place(
            0,
            vec![
                WorkerPlacement {
                    node: 0,
                    gpus: vec![0],
                },
                WorkerPlacement {
                    node: 0,
                    gpus: vec![1],
                },
            ],
        )];
        s.validate(&d, 10).unwrap();
        s.apply(d).unwrap();
        place_on(&mut s, 1, 0, vec![2]);
        assert_eq!(s.cluster().job(0).progress().started_ms, 1_000);

        // A report at 11 s: 80 s left. At 21 s, 70 s are left.
        s.set_now(11_000);
        s.report_progress(ckpt, 80_000).unwrap();
        let p = s.cluster().job(0).progress();
        assert_eq!((p.remaining_ms, p.reported_ms), (80_000, 11_000));
        assert_eq!(p.remaining_ms_at(21_000), Some(70_000));
        assert_eq!(p.attained_ms_at(21_000), 20_000);

        // Preempted at 21 s: the checkpointed job banks 20 s and keeps 70 s
        // left; the other starts over from its estimate.
        s.set_now(21_000);
        s.evict(ckpt).unwrap();
        s.evict(fresh).unwrap();
        let p = s.cluster().job(0).progress();
        assert_eq!(
            (p.started_ms, p.attained_ms, p.remaining_ms),
            (0, 20_000, 70_000)
        );
        assert_eq!(
            p.remaining_ms_at(99_000),
            Some(70_000),
            "a stopped job does not progress"
        );
        let p = s.cluster().job(1).progress();
        assert_eq!(
            (p.attained_ms, p.remaining_ms, p.remaining_workers),
            (20_000, 50_000, 1)
        );

        s.begin_round(10);
        mirror.apply(&s.delta_since(0).unwrap()).unwrap();
        assert_eq!(mirror.to_snapshot(), s.snapshot());
        assert!(matches!(
            s.report_progress(JobId(999), 1),
            Err(StateError::UnknownJob(_))
        ));
    }

    #[test]
    fn gpu_speeds_reach_the_mirror_before_and_after_the_model_appears() {
        let mut s = ClusterState::new();
        let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
        s.set_gpu_model_speed("T4", 333).unwrap();
        s.add_node(node("v", 2)).unwrap();
        let mut t4 = node("t", 2);
        t4.gpu_model = "T4".into();
        s.add_node(t4).unwrap();
        let (delta, _) = s.begin_round(10);
        mirror.apply(&delta).unwrap();
        let speeds: Vec<u32> = (0..4).map(|g| mirror.gpu(g).speed_permille()).collect();
        assert_eq!(speeds, vec![1000, 1000, 333, 333]);

        s.set_gpu_model_speed("V100", 2_000).unwrap();
        s.set_gpu_model_speed("T4", 333).unwrap(); // unchanged: no event
        let (delta, _) = s.begin_round(10);
        assert_eq!(delta.events, vec![Event::GpuModelSpeedChanged(0, 2_000)]);
        mirror.apply(&delta).unwrap();
        assert_eq!(mirror.gpu(0).speed_permille(), 2_000);
        assert_eq!(mirror.to_snapshot(), s.snapshot());

        for bad in [0, MAX_SPEED_PERMILLE + 1] {
            assert!(matches!(
                s.set_gpu_model_speed("A100", bad),
                Err(StateError::InvalidSpeed { .. })
            ));
        }
    }
}
