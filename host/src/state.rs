//! The host's cluster state: the truth every policy's mirror follows.
//!
//! Every change is an [`Event`] applied through the SDK's
//! [`Cluster::apply_event`] — the same state machine a guest runs — and
//! recorded for the next round's delta. Host-only bookkeeping (stable job
//! ids, tenants' quotas, timing) lives beside the cluster in tables that
//! follow the same swap-remove rule.

use arbiter_policy_sdk::model::{
    self, Decision, Delta, Event, JobSpec, NodeSpec, RoundInfo, Snapshot, job_phase,
};
use arbiter_policy_sdk::{Cluster, DecisionError, Plan};
use std::collections::{HashMap, VecDeque};

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

/// How many rounds of deltas are kept to catch a lagging mirror up without a resync.
const DELTA_HISTORY: usize = 64;

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
}

/// What applying a round's decisions changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub started: Vec<JobId>,
    pub preempted: Vec<JobId>,
    pub resized: Vec<JobId>,
    pub other: usize,
}

/// The cluster state of one host (live or simulated).
pub struct ClusterState {
    cluster: Cluster,
    interned: HashMap<String, u32>,
    node_index: HashMap<String, u32>,
    jobs: Vec<JobRecord>,
    job_index: HashMap<JobId, u32>,
    job_names: HashMap<String, JobId>,
    next_job: u64,
    tenant_quota_gpus: HashMap<String, u32>,
    events: Vec<Event>,
    history: VecDeque<Delta>,
    now_ms: u64,
}

impl Default for ClusterState {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterState {
    pub fn new() -> Self {
        ClusterState {
            cluster: Cluster::new(),
            interned: HashMap::new(),
            node_index: HashMap::new(),
            jobs: Vec::new(),
            job_index: HashMap::new(),
            job_names: HashMap::new(),
            next_job: 1,
            tenant_quota_gpus: HashMap::new(),
            events: Vec::new(),
            history: VecDeque::new(),
            now_ms: 0,
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
    pub fn intern(&mut self, s: &str) -> Result<u32, StateError> {
        if let Some(&id) = self.interned.get(s) {
            return Ok(id);
        }
        let id = self.cluster.strings().len() as u32;
        self.emit(Event::StringsAdded(vec![s.to_string()]))?;
        self.interned.insert(s.to_string(), id);
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
        self.emit(Event::GpuModelsAdded(vec![id]))?;
        Ok(self.cluster.gpu_models().len() - 1)
    }

    /// Adds a node; its name must be new.
    pub fn add_node(&mut self, req: NodeRequest) -> Result<u32, StateError> {
        if self.node_index.contains_key(&req.name) {
            return Err(StateError::DuplicateNode(req.name));
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
        };
        let index = self.cluster.node_count() as u32;
        self.emit(Event::NodeAdded(spec))?;
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

    /// Sets a tenant's GPU quota (whole GPUs; fractions count by their share).
    pub fn set_tenant_quota(&mut self, tenant: &str, gpus: Option<u32>) {
        match gpus {
            Some(q) => self.tenant_quota_gpus.insert(tenant.to_string(), q),
            None => self.tenant_quota_gpus.remove(tenant),
        };
    }

    /// Accepts a job into the queue.
    pub fn submit(&mut self, req: JobRequest) -> Result<JobId, StateError> {
        check_job(&req)?;
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
        };
        let id = JobId(self.next_job);
        self.next_job += 1;
        let index = self.cluster.job_count() as u32;
        self.emit(Event::JobAdded(spec))?;
        self.jobs.push(JobRecord {
            id,
            name: req.name.clone(),
            tenant: req.tenant,
            submit_ms: self.now_ms,
            first_start_ms: None,
            last_start_ms: None,
            preemptions: 0,
        });
        self.job_index.insert(id, index);
        self.job_names.insert(req.name, id);
        Ok(id)
    }

    /// Removes a job (finished, cancelled or failed), freeing what it held.
    pub fn remove(&mut self, id: JobId) -> Result<JobRecord, StateError> {
        let index = *self.job_index.get(&id).ok_or(StateError::UnknownJob(id))?;
        self.emit(Event::JobRemoved(index))?;
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
        self.emit(Event::JobEvicted(index))?;
        self.jobs[index as usize].preemptions += 1;
        Ok(())
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
    pub fn begin_round(&mut self, max_decisions: u32) -> (Delta, RoundInfo) {
        let base_epoch = self.cluster.epoch();
        let epoch = base_epoch + 1;
        let delta = Delta {
            base_epoch,
            epoch,
            now_ms: self.now_ms,
            events: std::mem::take(&mut self.events),
        };
        self.cluster.set_epoch(epoch, self.now_ms);
        if self.history.len() == DELTA_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(delta.clone());
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
        if epoch == current {
            return Some(Delta {
                base_epoch: epoch,
                epoch,
                now_ms: self.now_ms,
                events: Vec::new(),
            });
        }
        let first = self.history.iter().position(|d| d.base_epoch == epoch)?;
        let mut events = Vec::new();
        for d in self.history.iter().skip(first) {
            events.extend(d.events.iter().cloned());
        }
        Some(Delta {
            base_epoch: epoch,
            epoch: current,
            now_ms: self.now_ms,
            events,
        })
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

    /// Checks a policy's decisions against the current epoch: all valid, or
    /// the first invalid one with its position.
    pub fn validate(
        &self,
        decisions: &[Decision],
        max_decisions: u32,
    ) -> Result<(), (usize, DecisionError)> {
        if decisions.len() > max_decisions as usize {
            return Err((
                max_decisions as usize,
                DecisionError::TooManyDecisions {
                    limit: max_decisions,
                },
            ));
        }
        let mut plan = Plan::new(&self.cluster).with_max_decisions(max_decisions);
        if !self.tenant_quota_gpus.is_empty() {
            let quotas = self
                .tenant_quota_gpus
                .iter()
                .filter_map(|(t, &q)| {
                    self.interned
                        .get(t)
                        .map(|&id| (id, u64::from(q) * u64::from(model::FULL_GPU_MILLI)))
                })
                .collect();
            plan = plan.with_tenant_quotas(quotas);
        }
        for (i, d) in decisions.iter().enumerate() {
            plan.apply(d.clone()).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Carries out decisions that passed [`ClusterState::validate`] at this epoch.
    pub fn apply(&mut self, decisions: Vec<Decision>) -> Result<Applied, StateError> {
        let mut applied = Applied::default();
        for d in decisions {
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
                        let rec = &mut self.jobs[j as usize];
                        rec.first_start_ms.get_or_insert(self.now_ms);
                        rec.last_start_ms = Some(self.now_ms);
                        applied.started.push(id);
                    } else {
                        applied.other += 1;
                    }
                }
                Decision::ScaleOut(j, added) => {
                    let mut workers = self.cluster.job(j).placement().to_vec();
                    workers.extend(added);
                    self.emit(Event::JobPlaced(j, workers))?;
                    applied.resized.push(id);
                }
                Decision::ScaleIn(j, positions) => {
                    let workers = self
                        .cluster
                        .job(j)
                        .placement()
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !positions.contains(&(*i as u32)))
                        .map(|(_, w)| w.clone())
                        .collect();
                    self.emit(Event::JobPlaced(j, workers))?;
                    applied.resized.push(id);
                }
                Decision::Preempt(j) => {
                    self.emit(Event::JobEvicted(j))?;
                    self.jobs[j as usize].preemptions += 1;
                    applied.preempted.push(id);
                }
                Decision::Reserve(j, nodes) => {
                    self.emit(Event::JobReserved(j, nodes))?;
                    applied.other += 1;
                }
                Decision::Unreserve(j) => {
                    self.emit(Event::JobReserved(j, Vec::new()))?;
                    applied.other += 1;
                }
                Decision::SetQos(j, q) => {
                    self.emit(Event::JobQosChanged(j, q))?;
                    applied.other += 1;
                }
            }
        }
        Ok(applied)
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
        self.tenant_quota_gpus.get(tenant).copied()
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
    if req.kind > model::job_kind::INFERENCE || req.qos > model::qos::BEST_EFFORT {
        return fail("unknown kind or QoS".into());
    }
    if req.gpus_per_worker > u32::from(u8::MAX) {
        return fail("more than 255 GPUs per worker".into());
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
        s.set_tenant_quota("team", Some(2));
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
}
