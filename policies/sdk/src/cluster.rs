//! The cluster mirror: snapshot + deltas → a queryable view.
//!
//! The host keeps its own truth in exactly this structure and feeds every
//! change through [`Cluster::apply_event`], the same state machine a guest
//! runs on the deltas it receives. That is what keeps a policy's mirror and
//! the host's state in step: there is one implementation of the index rules
//! and of the resource accounting.

use crate::model::*;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// The source of node versions: one counter for every mirror and plan of
/// the process, so that a version identifies one state of one node even
/// across a resync (which builds a fresh mirror).
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

/// A node version never handed out before.
pub(crate) fn fresh_version() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

/// Why a snapshot or delta could not be applied to the mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorError {
    /// The delta starts from another epoch than the mirror is at.
    EpochMismatch { mirror: u64, delta_base: u64 },
    /// Column lengths of a snapshot disagree.
    Ragged(&'static str),
    /// An event or snapshot names an index that does not exist.
    OutOfRange {
        what: &'static str,
        index: u64,
        len: u64,
    },
    /// An event is inconsistent with the state (e.g. a GPU used twice).
    Inconsistent(String),
}

impl core::fmt::Display for MirrorError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MirrorError::EpochMismatch { mirror, delta_base } => {
                write!(
                    f,
                    "delta for epoch {delta_base} but the mirror is at epoch {mirror}"
                )
            }
            MirrorError::Ragged(table) => write!(f, "columns of `{table}` have different lengths"),
            MirrorError::OutOfRange { what, index, len } => {
                write!(f, "{what} index {index} out of range (len {len})")
            }
            MirrorError::Inconsistent(msg) => write!(f, "inconsistent state: {msg}"),
        }
    }
}

impl std::error::Error for MirrorError {}

/// Slot marker for GPU models that are not in the snapshot's model table.
const NO_MODEL_SLOT: u8 = u8::MAX;

/// The cluster state, as a set of dense columnar tables.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    epoch: u64,
    now_ms: u64,
    strings: Vec<String>,
    gpu_models: Vec<u32>,
    /// Per model slot: its speed in permille of the reference model.
    gpu_model_speed: Vec<u32>,
    /// The operator's sharing rules (contract 0.3 `sharing-rules`).
    pub(crate) sharing: SharingRules,
    /// Tenants with a quota, and each one's row by tenant string id.
    tenants: TenantColumns,
    tenant_row: HashMap<u32, usize>,
    metric_window_ms: u32,
    pub(crate) nodes: NodeColumns,
    pub(crate) gpus: GpuColumns,
    /// Per GPU: its model's slot in `gpu_models` (for model masks).
    gpu_model_slot: Vec<u8>,
    gpu_utilization: Vec<u8>,
    gpu_sm_activity: Vec<u8>,
    gpu_sm_occupancy: Vec<u8>,
    /// Per GPU: the job holding it (`reserve-gpus`) as `job index + 1`, 0 = none.
    pub(crate) gpu_reserved_by: Vec<u32>,
    /// Per node: latest host-side metrics.
    node_metrics: Vec<NodeMetric>,
    pub(crate) jobs: JobColumns,
    /// Per job: latest runtime statistics and service load (default: none
    /// reported; the `job` field is not kept up to date, the row is the job).
    job_metrics: Vec<JobMetric>,
    job_service: Vec<ServiceMetric>,
    /// Per job: the GPUs it holds by `reserve-gpus`.
    pub(crate) job_reserved_gpus: Vec<Vec<u32>>,
    /// Per job: its running workers.
    pub(crate) job_workers: Vec<Vec<WorkerPlacement>>,
    /// Per node: the jobs with at least one running worker there, each once,
    /// in the order they were placed. The inverse of `job_workers`, kept in
    /// step with it by `place_job`, `release_job` and `swap_remove_job`.
    node_jobs: Vec<Vec<u32>>,
    /// Per job: the nodes it holds a reservation on.
    pub(crate) job_reserved: Vec<Vec<u32>>,
    /// Per node: the job that reserved it, as `job index + 1` (0 = none).
    pub(crate) node_reserved_by: Vec<u32>,
    /// Per node: what it has room for, derived from the columns above by
    /// [`NodeRoom::of`] whenever the node is touched.
    pub(crate) node_room: Vec<NodeRoom>,
    /// Per node: see [`Cluster::node_version`].
    node_version: Vec<u64>,
}

fn check_len(table: &'static str, expected: usize, lens: &[usize]) -> Result<(), MirrorError> {
    if lens.iter().all(|&l| l == expected) {
        Ok(())
    } else {
        Err(MirrorError::Ragged(table))
    }
}

fn in_range(what: &'static str, index: u32, len: usize) -> Result<usize, MirrorError> {
    let i = index as usize;
    if i < len {
        Ok(i)
    } else {
        Err(MirrorError::OutOfRange {
            what,
            index: u64::from(index),
            len: len as u64,
        })
    }
}

/// What one node has room for, packed in one row so that a scan over all
/// nodes (the inner loop of most placement policies) reads one array.
/// Derived data: [`NodeRoom::of`] recomputes it from the node's columns and
/// its GPUs' usage, in the mirror whenever a node is touched and in a
/// [`Plan`](crate::plan::Plan) whenever the plan charges the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeRoom {
    pub cpu_free: u32,
    pub memory_free: u32,
    /// Free milli-GPU summed over the node's GPUs.
    pub free_milli: u32,
    /// GPUs with no guaranteed work and no reservation (whole-GPU
    /// guaranteed workers of jobs without reservations fit exactly these).
    pub idle_gpus: u32,
    /// Who may place work here: [`OPEN`] anyone, `job index + 1` only the
    /// job holding a reservation, [`CLOSED`] nobody (the node is not ready).
    /// One field, so the scan over all nodes tests one value.
    pub holder: u32,
    pub gpu_count: u16,
    /// The slot of the node's (first) GPU model for model masks.
    pub model_slot: u8,
}

/// [`NodeRoom::holder`] of a ready node without a reservation.
pub(crate) const OPEN: u32 = 0;
/// [`NodeRoom::holder`] of a node that is not ready (no job index + 1 equals it).
pub(crate) const CLOSED: u32 = u32::MAX;

impl NodeRoom {
    /// The room of `node`, with `gpu_used(g)` the (milli, memory) used on GPU `g`.
    pub(crate) fn of(
        cluster: &Cluster,
        node: usize,
        gpu_used: impl Fn(usize) -> (u32, u32),
        cpu_used: u32,
        memory_used: u32,
    ) -> NodeRoom {
        let nc = &cluster.nodes;
        let first = nc.first_gpu[node] as usize;
        let count = nc.gpu_count[node] as usize;
        let (mut free_milli, mut idle_gpus) = (0, 0);
        for g in first..first + count {
            let (milli, memory) = gpu_used(g);
            free_milli += FULL_GPU_MILLI.saturating_sub(milli);
            idle_gpus += u32::from(milli == 0 && memory == 0 && cluster.gpu_reserved_by[g] == 0);
        }
        NodeRoom {
            cpu_free: nc.cpu_milli[node].saturating_sub(cpu_used),
            memory_free: nc.memory_mib[node].saturating_sub(memory_used),
            free_milli,
            idle_gpus,
            holder: if nc.state[node] == node_state::READY {
                cluster.node_reserved_by[node]
            } else {
                CLOSED
            },
            gpu_count: count.min(usize::from(u16::MAX)) as u16,
            model_slot: cluster
                .gpu_model_slot
                .get(first)
                .copied()
                .unwrap_or(NO_MODEL_SLOT),
        }
    }
}

impl Cluster {
    /// An empty cluster at epoch 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds the mirror from a full snapshot, checking its consistency.
    pub fn from_snapshot(s: Snapshot) -> Result<Self, MirrorError> {
        let n = s.nodes.name.len();
        let nc = &s.nodes;
        check_len(
            "nodes",
            n,
            &[
                nc.pool.len(),
                nc.state.len(),
                nc.cpu_milli.len(),
                nc.memory_mib.len(),
                nc.cpu_used_milli.len(),
                nc.memory_used_mib.len(),
                nc.first_gpu.len(),
                nc.gpu_count.len(),
                nc.on_loan.len(),
                nc.fabric.len(),
            ],
        )?;
        let g = s.gpus.node.len();
        let gc = &s.gpus;
        check_len(
            "gpus",
            g,
            &[
                gc.model.len(),
                gc.memory_mib.len(),
                gc.milli_used.len(),
                gc.memory_used_mib.len(),
                gc.shared_milli.len(),
                gc.shared_memory_mib.len(),
                gc.shared_workers.len(),
                gc.health.len(),
            ],
        )?;
        let j = s.jobs.rows().ok_or(MirrorError::Ragged("jobs"))?;
        check_len(
            "tenants",
            s.tenants.name.len(),
            &[s.tenants.gpu_quota_milli.len()],
        )?;
        check_len("gpu models", s.gpu_models.len(), &[s.gpu_model_speed.len()])?;
        let pc = &s.placements;
        check_len(
            "placements",
            pc.job.len(),
            &[pc.node.len(), pc.gpu_start.len(), pc.gpu_len.len()],
        )?;
        for node in 0..n {
            let first = nc.first_gpu[node] as usize;
            let end = first + nc.gpu_count[node] as usize;
            if end > g {
                return Err(MirrorError::OutOfRange {
                    what: "node gpu range",
                    index: end as u64,
                    len: g as u64,
                });
            }
            if gc.node[first..end]
                .iter()
                .any(|&owner| owner as usize != node)
            {
                return Err(MirrorError::Inconsistent(format!(
                    "GPUs of node {node} are not contiguous"
                )));
            }
        }
        let mut job_workers = vec![Vec::new(); j];
        for w in 0..pc.job.len() {
            let job = in_range("placement job", pc.job[w], j)?;
            let node = in_range("placement node", pc.node[w], n)?;
            let start = pc.gpu_start[w] as usize;
            let end = start + pc.gpu_len[w] as usize;
            if end > pc.gpus.len() {
                return Err(MirrorError::OutOfRange {
                    what: "placement gpus",
                    index: end as u64,
                    len: pc.gpus.len() as u64,
                });
            }
            let gpus = pc.gpus[start..end].to_vec();
            for &gpu in &gpus {
                in_range("placement gpu", gpu, g)?;
            }
            job_workers[job].push(WorkerPlacement {
                node: node as u32,
                gpus,
            });
        }
        let mut node_jobs: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (job, workers) in job_workers.iter().enumerate() {
            for w in workers {
                let on_node = &mut node_jobs[w.node as usize];
                if !on_node.contains(&(job as u32)) {
                    on_node.push(job as u32);
                }
            }
        }
        let mut job_reserved = vec![Vec::new(); j];
        let mut node_reserved_by = vec![0; n];
        let mut job_reserved_gpus = vec![Vec::new(); j];
        let mut gpu_reserved_by = vec![0; g];
        for r in &s.reservations {
            let job = in_range("reservation job", r.job, j)?;
            for &node in &r.nodes {
                node_reserved_by[in_range("reserved node", node, n)?] = job as u32 + 1;
            }
            for &gpu in &r.gpus {
                gpu_reserved_by[in_range("reserved gpu", gpu, g)?] = job as u32 + 1;
            }
            job_reserved[job] = r.nodes.clone();
            job_reserved_gpus[job] = r.gpus.clone();
        }
        let tenant_row = s
            .tenants
            .name
            .iter()
            .enumerate()
            .map(|(row, &name)| (name, row))
            .collect();
        let mut cluster = Cluster {
            epoch: s.epoch,
            now_ms: s.now_ms,
            strings: s.strings,
            gpu_models: s.gpu_models,
            gpu_model_speed: s.gpu_model_speed,
            sharing: s.sharing,
            tenants: s.tenants,
            tenant_row,
            metric_window_ms: s.metric_window_ms,
            nodes: s.nodes,
            gpus: s.gpus,
            gpu_model_slot: Vec::new(),
            gpu_utilization: vec![0; g],
            gpu_sm_activity: vec![0; g],
            gpu_sm_occupancy: vec![0; g],
            gpu_reserved_by,
            node_metrics: vec![NodeMetric::default(); n],
            jobs: s.jobs,
            job_metrics: vec![JobMetric::default(); j],
            job_service: vec![ServiceMetric::default(); j],
            job_reserved_gpus,
            job_workers,
            node_jobs,
            job_reserved,
            node_reserved_by,
            node_room: vec![NodeRoom::default(); n],
            node_version: (0..n).map(|_| fresh_version()).collect(),
        };
        cluster.gpu_model_slot = cluster
            .gpus
            .model
            .iter()
            .map(|&m| cluster.slot_of_model(m))
            .collect();
        for node in 0..n {
            let room = cluster.room_of(node);
            cluster.node_room[node] = room;
        }
        Ok(cluster)
    }

    /// The full snapshot of this state (what the host sends on resync).
    pub fn to_snapshot(&self) -> Snapshot {
        let mut placements = PlacementColumns::default();
        for (job, workers) in self.job_workers.iter().enumerate() {
            for w in workers {
                placements.job.push(job as u32);
                placements.node.push(w.node);
                placements.gpu_start.push(placements.gpus.len() as u32);
                placements.gpu_len.push(w.gpus.len() as u8);
                placements.gpus.extend_from_slice(&w.gpus);
            }
        }
        let reservations = (0..self.job_count())
            .filter(|&j| !self.job_reserved[j].is_empty() || !self.job_reserved_gpus[j].is_empty())
            .map(|j| Reservation {
                job: j as u32,
                nodes: self.job_reserved[j].clone(),
                gpus: self.job_reserved_gpus[j].clone(),
            })
            .collect();
        Snapshot {
            epoch: self.epoch,
            now_ms: self.now_ms,
            strings: self.strings.clone(),
            gpu_models: self.gpu_models.clone(),
            gpu_model_speed: self.gpu_model_speed.clone(),
            sharing: self.sharing,
            tenants: self.tenants.clone(),
            metric_window_ms: self.metric_window_ms,
            nodes: self.nodes.clone(),
            gpus: self.gpus.clone(),
            jobs: self.jobs.clone(),
            placements,
            reservations,
        }
    }

    fn slot_of_model(&self, model: u32) -> u8 {
        self.gpu_models
            .iter()
            .position(|&m| m == model)
            .filter(|&slot| slot < 64)
            .map_or(NO_MODEL_SLOT, |slot| slot as u8)
    }

    /// Applies a delta; its base epoch must be the mirror's epoch.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), MirrorError> {
        if delta.base_epoch != self.epoch {
            return Err(MirrorError::EpochMismatch {
                mirror: self.epoch,
                delta_base: delta.base_epoch,
            });
        }
        for event in &delta.events {
            self.apply_event(event)?;
        }
        self.epoch = delta.epoch;
        self.now_ms = delta.now_ms;
        Ok(())
    }

    /// Moves the mirror to a new epoch (the host does this after a round's events).
    pub fn set_epoch(&mut self, epoch: u64, now_ms: u64) {
        self.epoch = epoch;
        self.now_ms = now_ms;
    }

    /// Applies one event. On error the mirror is unchanged.
    pub fn apply_event(&mut self, event: &Event) -> Result<(), MirrorError> {
        match event {
            Event::StringsAdded(strings) => self.strings.extend(strings.iter().cloned()),
            Event::GpuModelsAdded(models) => {
                self.gpu_models.extend(models.iter().map(|&(name, _)| name));
                self.gpu_model_speed
                    .extend(models.iter().map(|&(_, speed)| speed));
                let slots: Vec<u8> = self
                    .gpus
                    .model
                    .iter()
                    .map(|&m| self.slot_of_model(m))
                    .collect();
                self.gpu_model_slot = slots;
                // Which GPUs a model mask allows may have changed anywhere.
                for n in 0..self.node_count() {
                    self.touch(n);
                }
            }
            Event::GpuModelSpeedChanged(slot, speed) => {
                let s = in_range("gpu model", *slot, self.gpu_model_speed.len())?;
                self.gpu_model_speed[s] = *speed;
            }
            Event::NodeAdded(spec) => {
                if spec.gpu_count > MAX_NODE_GPUS {
                    return Err(MirrorError::Inconsistent(format!(
                        "a node with {} GPUs; at most {} are allowed",
                        spec.gpu_count, MAX_NODE_GPUS
                    )));
                }
                self.add_node(spec)
            }
            Event::NodeStateChanged(node, state) => {
                let n = in_range("node", *node, self.node_count())?;
                self.nodes.state[n] = *state;
                self.touch(n);
            }
            Event::NodeLoanChanged(node, on_loan) => {
                let n = in_range("node", *node, self.node_count())?;
                self.nodes.on_loan[n] = *on_loan;
                self.touch(n);
            }
            Event::JobAdded(spec) => self.add_job(spec),
            Event::JobRemoved(job) => {
                let j = in_range("job", *job, self.job_count())?;
                self.release_job(j);
                self.clear_reservation(j);
                self.swap_remove_job(j);
            }
            Event::JobPlaced(job, workers) => {
                let j = in_range("job", *job, self.job_count())?;
                self.check_workers(workers)?;
                self.release_job(j);
                self.clear_reservation(j);
                self.place_job(j, workers);
                self.jobs.phase[j] = job_phase::RUNNING;
                self.jobs.workers[j] = workers.len() as u32;
            }
            Event::JobEvicted(job) => {
                let j = in_range("job", *job, self.job_count())?;
                self.release_job(j);
                self.jobs.phase[j] = job_phase::PENDING;
            }
            Event::JobQosChanged(job, qos) => {
                let j = in_range("job", *job, self.job_count())?;
                // A running job's charge moves between the guaranteed and
                // shared accounts when its QoS crosses them.
                let workers = std::mem::take(&mut self.job_workers[j]);
                for w in &workers {
                    self.charge_worker(j, w, false);
                }
                self.jobs.qos[j] = *qos;
                for w in &workers {
                    self.charge_worker(j, w, true);
                }
                self.job_workers[j] = workers;
            }
            Event::JobReserved(job, nodes) => {
                let j = in_range("job", *job, self.job_count())?;
                for &node in nodes {
                    in_range("node", node, self.node_count())?;
                }
                self.clear_node_reservation(j);
                for &node in nodes {
                    self.node_reserved_by[node as usize] = j as u32 + 1;
                    self.touch(node as usize);
                }
                self.job_reserved[j] = nodes.clone();
                self.settle_reserved_phase(j);
            }
            Event::JobReservedGpus(job, gpus) => {
                let j = in_range("job", *job, self.job_count())?;
                for &gpu in gpus {
                    in_range("gpu", gpu, self.gpu_count())?;
                }
                self.clear_gpu_reservation(j);
                for &gpu in gpus {
                    self.gpu_reserved_by[gpu as usize] = j as u32 + 1;
                    self.touch(self.gpus.node[gpu as usize] as usize);
                }
                self.job_reserved_gpus[j] = gpus.clone();
                self.settle_reserved_phase(j);
            }
            Event::TenantQuotaChanged(tenant, quota) => match self.tenant_row.get(tenant) {
                Some(&row) => self.tenants.gpu_quota_milli[row] = *quota,
                None => {
                    self.tenant_row.insert(*tenant, self.tenants.name.len());
                    self.tenants.name.push(*tenant);
                    self.tenants.gpu_quota_milli.push(*quota);
                }
            },
            Event::TenantQuotaRemoved(tenant) => {
                if let Some(row) = self.tenant_row.remove(tenant) {
                    self.tenants.name.swap_remove(row);
                    self.tenants.gpu_quota_milli.swap_remove(row);
                    if let Some(&moved) = self.tenants.name.get(row) {
                        self.tenant_row.insert(moved, row);
                    }
                }
            }
            Event::SharingChanged(rules) => {
                // Every running worker is re-charged under the new rules.
                let running: Vec<usize> = (0..self.job_count())
                    .filter(|&j| !self.job_workers[j].is_empty())
                    .collect();
                for &j in &running {
                    for w in self.job_workers[j].clone() {
                        self.charge_worker(j, &w, false);
                    }
                }
                self.sharing = *rules;
                for &j in &running {
                    for w in self.job_workers[j].clone() {
                        self.charge_worker(j, &w, true);
                    }
                }
                for n in 0..self.node_count() {
                    self.touch(n);
                }
            }
            Event::GpuHealthChanged(gpu, health) => {
                let g = in_range("gpu", *gpu, self.gpu_count())?;
                self.gpus.health[g] = *health;
                self.touch(self.gpus.node[g] as usize);
            }
            Event::JobMetrics(metrics) => {
                for m in metrics {
                    in_range("job", m.job, self.job_count())?;
                }
                for m in metrics {
                    self.job_metrics[m.job as usize] = *m;
                }
            }
            Event::ServiceMetrics(metrics) => {
                for m in metrics {
                    in_range("job", m.job, self.job_count())?;
                }
                for m in metrics {
                    self.job_service[m.job as usize] = *m;
                }
            }
            Event::NodeMetrics(metrics) => {
                for m in metrics {
                    in_range("node", m.node, self.node_count())?;
                }
                for m in metrics {
                    self.node_metrics[m.node as usize] = *m;
                }
            }
            Event::JobProgress(progress) => {
                for p in progress {
                    in_range("job", p.job, self.job_count())?;
                }
                for p in progress {
                    self.jobs.set_progress(p);
                }
            }
            Event::GpuMetrics(metrics) => {
                for m in metrics {
                    in_range("gpu", m.gpu, self.gpu_count())?;
                }
                for m in metrics {
                    let g = m.gpu as usize;
                    self.gpu_utilization[g] = m.utilization_pct;
                    self.gpu_sm_activity[g] = m.sm_activity_pct;
                    self.gpu_sm_occupancy[g] = m.sm_occupancy_pct;
                }
            }
        }
        Ok(())
    }

    fn add_node(&mut self, spec: &NodeSpec) {
        let node = self.node_count() as u32;
        let first_gpu = self.gpu_count() as u32;
        let n = &mut self.nodes;
        n.name.push(spec.name);
        n.pool.push(spec.pool);
        n.state.push(node_state::READY);
        n.cpu_milli.push(spec.cpu_milli);
        n.memory_mib.push(spec.memory_mib);
        n.cpu_used_milli.push(0);
        n.memory_used_mib.push(0);
        n.first_gpu.push(first_gpu);
        n.gpu_count.push(spec.gpu_count);
        n.on_loan.push(spec.on_loan);
        n.fabric.push(spec.fabric);
        let slot = self.slot_of_model(spec.gpu_model);
        for _ in 0..spec.gpu_count {
            let gc = &mut self.gpus;
            gc.node.push(node);
            gc.model.push(spec.gpu_model);
            gc.memory_mib.push(spec.gpu_memory_mib);
            gc.milli_used.push(0);
            gc.memory_used_mib.push(0);
            gc.shared_milli.push(0);
            gc.shared_memory_mib.push(0);
            gc.shared_workers.push(0);
            gc.health.push(health::HEALTHY);
            self.gpu_model_slot.push(slot);
            self.gpu_utilization.push(0);
            self.gpu_sm_activity.push(0);
            self.gpu_sm_occupancy.push(0);
            self.gpu_reserved_by.push(0);
        }
        self.node_metrics.push(NodeMetric::default());
        self.node_reserved_by.push(0);
        self.node_jobs.push(Vec::new());
        let room = self.room_of(node as usize);
        self.node_room.push(room);
        self.node_version.push(fresh_version());
    }

    /// Appends arriving jobs given as columns (the contract's `jobs-added`),
    /// as [`Event::JobAdded`] would one by one, without a per-row detour.
    /// Their phase and progress are taken as a fresh arrival's, whatever
    /// the columns say. On error the mirror is unchanged.
    pub fn add_jobs(&mut self, c: &JobColumns) -> Result<(), MirrorError> {
        let rows = c.rows().ok_or(MirrorError::Ragged("jobs-added"))?;
        let first = self.job_count();
        let j = &mut self.jobs;
        j.name.extend_from_slice(&c.name);
        j.tenant.extend_from_slice(&c.tenant);
        j.phase
            .extend(std::iter::repeat_n(job_phase::PENDING, rows));
        j.kind.extend_from_slice(&c.kind);
        j.qos.extend_from_slice(&c.qos);
        j.priority.extend_from_slice(&c.priority);
        j.workers.extend_from_slice(&c.workers);
        j.min_workers.extend_from_slice(&c.min_workers);
        j.max_workers.extend_from_slice(&c.max_workers);
        j.cpu_milli.extend_from_slice(&c.cpu_milli);
        j.memory_mib.extend_from_slice(&c.memory_mib);
        j.gpus_per_worker.extend_from_slice(&c.gpus_per_worker);
        j.gpu_milli.extend_from_slice(&c.gpu_milli);
        j.gpu_memory_mib.extend_from_slice(&c.gpu_memory_mib);
        j.gpu_model_mask.extend_from_slice(&c.gpu_model_mask);
        j.submit_ms.extend_from_slice(&c.submit_ms);
        j.estimate_ms.extend_from_slice(&c.estimate_ms);
        j.deadline_ms.extend_from_slice(&c.deadline_ms);
        j.checkpointed.extend_from_slice(&c.checkpointed);
        j.gpu_milli_limit.extend_from_slice(&c.gpu_milli_limit);
        j.locality.extend_from_slice(&c.locality);
        j.slo_ms.extend_from_slice(&c.slo_ms);
        j.group.extend_from_slice(&c.group);
        // Until the host reports progress, what is left is the estimate.
        j.started_ms.extend(std::iter::repeat_n(0, rows));
        j.attained_ms.extend(std::iter::repeat_n(0, rows));
        j.remaining_ms.extend_from_slice(&c.estimate_ms);
        j.remaining_workers.extend_from_slice(&c.workers);
        j.reported_ms.extend_from_slice(&c.submit_ms);
        let end = first + rows;
        self.job_workers.resize_with(end, Vec::new);
        self.job_reserved.resize_with(end, Vec::new);
        self.job_reserved_gpus.resize_with(end, Vec::new);
        self.job_metrics.resize_with(end, JobMetric::default);
        self.job_service.resize_with(end, ServiceMetric::default);
        Ok(())
    }

    fn add_job(&mut self, s: &JobSpec) {
        self.jobs.push_arrival(s);
        self.job_workers.push(Vec::new());
        self.job_reserved.push(Vec::new());
        self.job_reserved_gpus.push(Vec::new());
        self.job_metrics.push(JobMetric::default());
        self.job_service.push(ServiceMetric::default());
    }

    fn swap_remove_job(&mut self, j: usize) {
        let last = self.job_count() - 1;
        let jc = &mut self.jobs;
        jc.name.swap_remove(j);
        jc.tenant.swap_remove(j);
        jc.phase.swap_remove(j);
        jc.kind.swap_remove(j);
        jc.qos.swap_remove(j);
        jc.priority.swap_remove(j);
        jc.workers.swap_remove(j);
        jc.min_workers.swap_remove(j);
        jc.max_workers.swap_remove(j);
        jc.cpu_milli.swap_remove(j);
        jc.memory_mib.swap_remove(j);
        jc.gpus_per_worker.swap_remove(j);
        jc.gpu_milli.swap_remove(j);
        jc.gpu_memory_mib.swap_remove(j);
        jc.gpu_model_mask.swap_remove(j);
        jc.submit_ms.swap_remove(j);
        jc.estimate_ms.swap_remove(j);
        jc.deadline_ms.swap_remove(j);
        jc.checkpointed.swap_remove(j);
        jc.started_ms.swap_remove(j);
        jc.attained_ms.swap_remove(j);
        jc.remaining_ms.swap_remove(j);
        jc.remaining_workers.swap_remove(j);
        jc.reported_ms.swap_remove(j);
        jc.gpu_milli_limit.swap_remove(j);
        jc.locality.swap_remove(j);
        jc.slo_ms.swap_remove(j);
        jc.group.swap_remove(j);
        self.job_workers.swap_remove(j);
        self.job_reserved.swap_remove(j);
        self.job_reserved_gpus.swap_remove(j);
        self.job_metrics.swap_remove(j);
        self.job_service.swap_remove(j);
        if j != last {
            for &node in &self.job_reserved[j] {
                self.node_reserved_by[node as usize] = j as u32 + 1;
            }
            for &gpu in &self.job_reserved_gpus[j] {
                self.gpu_reserved_by[gpu as usize] = j as u32 + 1;
            }
            // The last job is now job `j`: renumber it in the node index.
            for w in &self.job_workers[j] {
                for entry in self.node_jobs[w.node as usize].iter_mut() {
                    if *entry == last as u32 {
                        *entry = j as u32;
                    }
                }
            }
        }
    }

    fn check_workers(&self, workers: &[WorkerPlacement]) -> Result<(), MirrorError> {
        for w in workers {
            in_range("node", w.node, self.node_count())?;
            for &gpu in &w.gpus {
                in_range("gpu", gpu, self.gpu_count())?;
            }
        }
        Ok(())
    }

    /// Adds (`charge`) or removes one worker's resources from the books.
    fn charge_worker(&mut self, j: usize, w: &WorkerPlacement, charge: bool) {
        let n = w.node as usize;
        let cpu = self.jobs.cpu_milli[j];
        let mem = self.jobs.memory_mib[j];
        let update = |v: &mut u32, amount: u32| {
            *v = if charge {
                v.saturating_add(amount)
            } else {
                v.saturating_sub(amount)
            };
        };
        update(&mut self.nodes.cpu_used_milli[n], cpu);
        update(&mut self.nodes.memory_used_mib[n], mem);
        let shared = self.sharing.is_shared(self.jobs.qos[j]);
        for &gpu in &w.gpus {
            let g = gpu as usize;
            let (milli, gmem) = self.worker_gpu_share(j, g);
            if shared {
                update(&mut self.gpus.shared_milli[g], milli);
                update(&mut self.gpus.shared_memory_mib[g], gmem);
                update(&mut self.gpus.shared_workers[g], 1);
            } else {
                update(&mut self.gpus.milli_used[g], milli);
                update(&mut self.gpus.memory_used_mib[g], gmem);
            }
            let owner = self.gpus.node[g] as usize;
            if owner != n {
                self.touch(owner);
            }
        }
        self.touch(n);
    }

    /// (milli-GPU, GPU memory) in use on GPU `g`.
    fn gpu_used(&self, g: usize) -> (u32, u32) {
        (self.gpus.milli_used[g], self.gpus.memory_used_mib[g])
    }

    /// Marks `node` as changed (see [`Cluster::node_version`]) and derives
    /// its room afresh.
    fn touch(&mut self, node: usize) {
        if node >= self.node_count() {
            return;
        }
        self.node_version[node] = fresh_version();
        let room = self.room_of(node);
        self.node_room[node] = room;
    }

    /// `node`'s room in the committed state.
    fn room_of(&self, node: usize) -> NodeRoom {
        NodeRoom::of(
            self,
            node,
            |g| self.gpu_used(g),
            self.nodes.cpu_used_milli[node],
            self.nodes.memory_used_mib[node],
        )
    }

    /// Charges `workers` to job `j` (which holds none) and indexes them.
    fn place_job(&mut self, j: usize, workers: &[WorkerPlacement]) {
        for w in workers {
            self.charge_worker(j, w, true);
            let on_node = &mut self.node_jobs[w.node as usize];
            if !on_node.contains(&(j as u32)) {
                on_node.push(j as u32);
            }
        }
        self.job_workers[j] = workers.to_vec();
    }

    fn release_job(&mut self, j: usize) {
        let workers = std::mem::take(&mut self.job_workers[j]);
        for w in &workers {
            self.charge_worker(j, w, false);
            self.node_jobs[w.node as usize].retain(|&other| other != j as u32);
        }
    }

    /// Drops everything job `j` holds (nodes and GPUs); it is pending again.
    fn clear_reservation(&mut self, j: usize) {
        self.clear_node_reservation(j);
        self.clear_gpu_reservation(j);
        self.settle_reserved_phase(j);
    }

    fn clear_node_reservation(&mut self, j: usize) {
        for node in std::mem::take(&mut self.job_reserved[j]) {
            if self.node_reserved_by[node as usize] == j as u32 + 1 {
                self.node_reserved_by[node as usize] = 0;
                self.touch(node as usize);
            }
        }
    }

    fn clear_gpu_reservation(&mut self, j: usize) {
        for gpu in std::mem::take(&mut self.job_reserved_gpus[j]) {
            let g = gpu as usize;
            if self.gpu_reserved_by[g] == j as u32 + 1 {
                self.gpu_reserved_by[g] = 0;
                self.touch(self.gpus.node[g] as usize);
            }
        }
    }

    /// A waiting job is `reserved` exactly while it holds nodes or GPUs.
    fn settle_reserved_phase(&mut self, j: usize) {
        let holds = !self.job_reserved[j].is_empty() || !self.job_reserved_gpus[j].is_empty();
        match self.jobs.phase[j] {
            job_phase::PENDING if holds => self.jobs.phase[j] = job_phase::RESERVED,
            job_phase::RESERVED if !holds => self.jobs.phase[j] = job_phase::PENDING,
            _ => {}
        }
    }

    /// What one worker of job `j` takes from GPU `g`, in the account its
    /// QoS is charged to ([`gpu_share`] or [`shared_gpu_share`]).
    pub(crate) fn worker_gpu_share(&self, j: usize, g: usize) -> (u32, u32) {
        self.worker_gpu_share_as(j, g, self.jobs.qos[j])
    }

    /// [`Cluster::worker_gpu_share`] as if job `j` had QoS `qos`.
    #[inline]
    pub(crate) fn worker_gpu_share_as(&self, j: usize, g: usize, qos: u8) -> (u32, u32) {
        let (per_worker, milli, memory, total) = (
            self.jobs.gpus_per_worker[j],
            self.jobs.gpu_milli[j],
            self.jobs.gpu_memory_mib[j],
            self.gpus.memory_mib[g],
        );
        if self.sharing.is_shared(qos) {
            shared_gpu_share(per_worker, milli, memory, total)
        } else {
            gpu_share(per_worker, milli, memory, total)
        }
    }

    // ---- queries ----

    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }
    pub fn node_count(&self) -> usize {
        self.nodes.name.len()
    }
    pub fn gpu_count(&self) -> usize {
        self.gpus.node.len()
    }
    pub fn job_count(&self) -> usize {
        self.jobs.name.len()
    }
    /// An interned string; unknown ids give `""`.
    pub fn string(&self, id: u32) -> &str {
        self.strings.get(id as usize).map_or("", String::as_str)
    }
    pub fn strings(&self) -> &[String] {
        &self.strings
    }
    pub fn gpu_models(&self) -> &[u32] {
        &self.gpu_models
    }
    /// Speed of the model at `slot` of [`Cluster::gpu_models`], in permille
    /// of the reference model.
    pub fn gpu_model_speed(&self, slot: usize) -> u32 {
        self.gpu_model_speed
            .get(slot)
            .copied()
            .unwrap_or(REFERENCE_SPEED_PERMILLE)
    }
    pub fn node(&self, index: u32) -> Node<'_> {
        Node {
            cluster: self,
            index,
        }
    }
    pub fn gpu(&self, index: u32) -> Gpu<'_> {
        Gpu {
            cluster: self,
            index,
        }
    }
    pub fn job(&self, index: u32) -> Job<'_> {
        Job {
            cluster: self,
            index,
        }
    }
    pub fn nodes(&self) -> impl Iterator<Item = Node<'_>> + '_ {
        (0..self.node_count() as u32).map(|i| self.node(i))
    }
    pub fn jobs(&self) -> impl Iterator<Item = Job<'_>> + '_ {
        (0..self.job_count() as u32).map(|i| self.job(i))
    }
    /// Jobs waiting to start (pending or holding a reservation).
    pub fn pending_jobs(&self) -> impl Iterator<Item = Job<'_>> + '_ {
        self.jobs().filter(|j| j.is_pending())
    }
    /// Jobs waiting to start, oldest first (submit time, then index): the
    /// arrival order most schedulers start from.
    pub fn pending_by_arrival(&self) -> Vec<Job<'_>> {
        let mut pending: Vec<Job<'_>> = self.pending_jobs().collect();
        // Keys are unique (the index breaks ties), so an unstable sort
        // gives the one order without a stable sort's scratch buffer.
        pending.sort_unstable_by_key(|j| (j.submit_ms(), j.index()));
        pending
    }
    pub fn running_jobs(&self) -> impl Iterator<Item = Job<'_>> + '_ {
        self.jobs().filter(|j| j.phase() == job_phase::RUNNING)
    }
    /// Raw columns, for policies that want to vectorise.
    pub fn node_columns(&self) -> &NodeColumns {
        &self.nodes
    }
    pub fn gpu_columns(&self) -> &GpuColumns {
        &self.gpus
    }
    pub fn job_columns(&self) -> &JobColumns {
        &self.jobs
    }
    /// A stamp of `node`'s state that changes whenever anything a placement
    /// on the node can depend on changes: its state, loan, reservation, the
    /// resources charged to it or its GPUs, the GPU model table. Stamps are
    /// unique within the process (a resync's fresh mirror gets new ones), so
    /// an equal stamp means an unchanged node: a policy may cache per-node
    /// results under it. [`Plan::node_version`](crate::plan::Plan::node_version)
    /// adds the plan's own tentative changes.
    pub fn node_version(&self, node: u32) -> u64 {
        self.node_version.get(node as usize).copied().unwrap_or(0)
    }
    /// The running jobs with at least one worker on `node`, each once, in
    /// the order they were placed there (an index the mirror keeps, so a
    /// per-node question costs the node's jobs, not every job).
    pub fn jobs_on(&self, node: u32) -> impl Iterator<Item = Job<'_>> + '_ {
        self.node_jobs
            .get(node as usize)
            .into_iter()
            .flatten()
            .map(move |&j| self.job(j))
    }
    /// The job that holds a reservation on `node`, if any.
    pub fn reserved_by(&self, node: u32) -> Option<u32> {
        match self.node_reserved_by.get(node as usize) {
            Some(&r) if r > 0 => Some(r - 1),
            _ => None,
        }
    }
    /// The job that holds GPU `gpu` (`reserve-gpus`), if any.
    pub fn gpu_reserved_by(&self, gpu: u32) -> Option<u32> {
        match self.gpu_reserved_by.get(gpu as usize) {
            Some(&r) if r > 0 => Some(r - 1),
            _ => None,
        }
    }
    /// The operator's sharing rules.
    pub fn sharing(&self) -> SharingRules {
        self.sharing
    }
    /// A tenant's GPU quota in milli-GPU (tenant string id), `None` = unlimited.
    pub fn tenant_quota_milli(&self, tenant: u32) -> Option<u64> {
        self.tenant_row
            .get(&tenant)
            .map(|&row| self.tenants.gpu_quota_milli[row])
    }
    /// Tenants with a quota.
    pub fn tenant_columns(&self) -> &TenantColumns {
        &self.tenants
    }
    /// The span metric samples are averaged over, ms (0 = instantaneous).
    pub fn metric_window_ms(&self) -> u32 {
        self.metric_window_ms
    }
    /// Sets the metric window (the host's configuration; not an event).
    pub fn set_metric_window_ms(&mut self, window_ms: u32) {
        self.metric_window_ms = window_ms;
    }
    /// Latest host-side metrics of `node` (zeros until reported).
    pub fn node_metrics(&self, node: u32) -> NodeMetric {
        self.node_metrics
            .get(node as usize)
            .copied()
            .unwrap_or_default()
    }
    pub(crate) fn gpu_allowed_for(&self, j: usize, g: usize) -> bool {
        let slot = self.gpu_model_slot[g];
        model_allowed(
            self.jobs.gpu_model_mask[j],
            (slot != NO_MODEL_SLOT).then_some(slot as usize),
        )
    }
}

/// A node of the mirror.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    cluster: &'a Cluster,
    index: u32,
}

impl<'a> Node<'a> {
    pub fn index(&self) -> u32 {
        self.index
    }
    fn i(&self) -> usize {
        self.index as usize
    }
    pub fn name(&self) -> &'a str {
        self.cluster.string(self.cluster.nodes.name[self.i()])
    }
    pub fn pool(&self) -> &'a str {
        self.cluster.string(self.cluster.nodes.pool[self.i()])
    }
    pub fn state(&self) -> u8 {
        self.cluster.nodes.state[self.i()]
    }
    pub fn is_ready(&self) -> bool {
        self.state() == node_state::READY
    }
    /// Interconnect or topology group ("" unknown).
    pub fn fabric(&self) -> &'a str {
        self.cluster.string(
            self.cluster
                .nodes
                .fabric
                .get(self.i())
                .copied()
                .unwrap_or(u32::MAX),
        )
    }
    pub fn on_loan(&self) -> bool {
        self.cluster.nodes.on_loan[self.i()]
    }
    pub fn cpu_milli(&self) -> u32 {
        self.cluster.nodes.cpu_milli[self.i()]
    }
    pub fn memory_mib(&self) -> u32 {
        self.cluster.nodes.memory_mib[self.i()]
    }
    pub fn cpu_free_milli(&self) -> u32 {
        self.cpu_milli()
            .saturating_sub(self.cluster.nodes.cpu_used_milli[self.i()])
    }
    pub fn memory_free_mib(&self) -> u32 {
        self.memory_mib()
            .saturating_sub(self.cluster.nodes.memory_used_mib[self.i()])
    }
    /// Dense indices of the node's GPUs.
    pub fn gpu_range(&self) -> Range<u32> {
        let first = self.cluster.nodes.first_gpu[self.i()];
        first..first + self.cluster.nodes.gpu_count[self.i()]
    }
    pub fn gpus(&self) -> impl Iterator<Item = Gpu<'a>> + 'a {
        let cluster = self.cluster;
        self.gpu_range().map(move |g| cluster.gpu(g))
    }
    /// Unallocated milli-GPU summed over the node's GPUs.
    pub fn gpu_free_milli(&self) -> u32 {
        self.gpus().map(|g| g.free_milli()).sum()
    }
    /// The running jobs with a worker here ([`Cluster::jobs_on`]).
    pub fn jobs(&self) -> impl Iterator<Item = Job<'a>> + 'a {
        self.cluster.jobs_on(self.index)
    }
}

/// A GPU of the mirror.
#[derive(Clone, Copy)]
pub struct Gpu<'a> {
    cluster: &'a Cluster,
    index: u32,
}

impl<'a> Gpu<'a> {
    pub fn index(&self) -> u32 {
        self.index
    }
    fn i(&self) -> usize {
        self.index as usize
    }
    pub fn node(&self) -> u32 {
        self.cluster.gpus.node[self.i()]
    }
    pub fn model(&self) -> &'a str {
        self.cluster.string(self.model_id())
    }
    /// The model's interned string id: equal ids, equal models (for
    /// per-model tables built once instead of comparing names per GPU).
    pub fn model_id(&self) -> u32 {
        self.cluster.gpus.model[self.i()]
    }
    /// The model's speed in permille of the reference model (1000 when the
    /// operator gave none).
    pub fn speed_permille(&self) -> u32 {
        match self.cluster.gpu_model_slot[self.i()] {
            NO_MODEL_SLOT => REFERENCE_SPEED_PERMILLE,
            slot => self.cluster.gpu_model_speed(slot as usize),
        }
    }
    pub fn memory_mib(&self) -> u32 {
        self.cluster.gpus.memory_mib[self.i()]
    }
    pub fn milli_used(&self) -> u32 {
        self.cluster.gpus.milli_used[self.i()]
    }
    pub fn free_milli(&self) -> u32 {
        FULL_GPU_MILLI.saturating_sub(self.milli_used())
    }
    pub fn memory_free_mib(&self) -> u32 {
        self.memory_mib()
            .saturating_sub(self.cluster.gpus.memory_used_mib[self.i()])
    }
    pub fn utilization_pct(&self) -> u8 {
        self.cluster.gpu_utilization[self.i()]
    }
    pub fn sm_activity_pct(&self) -> u8 {
        self.cluster.gpu_sm_activity[self.i()]
    }
    pub fn sm_occupancy_pct(&self) -> u8 {
        self.cluster.gpu_sm_occupancy[self.i()]
    }
    /// Shared (qos >= 1) work on the GPU: milli-GPU, memory, workers.
    pub fn shared_milli(&self) -> u32 {
        self.cluster.gpus.shared_milli[self.i()]
    }
    pub fn shared_memory_mib(&self) -> u32 {
        self.cluster.gpus.shared_memory_mib[self.i()]
    }
    pub fn shared_workers(&self) -> u32 {
        self.cluster.gpus.shared_workers[self.i()]
    }
    pub fn health(&self) -> u8 {
        self.cluster.gpus.health[self.i()]
    }
    pub fn is_healthy(&self) -> bool {
        self.health() == health::HEALTHY
    }
    /// The job holding this GPU by `reserve-gpus`, if any.
    pub fn reserved_by(&self) -> Option<u32> {
        self.cluster.gpu_reserved_by(self.index)
    }
}

/// A job of the mirror.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    cluster: &'a Cluster,
    index: u32,
}

impl<'a> Job<'a> {
    pub fn index(&self) -> u32 {
        self.index
    }
    fn i(&self) -> usize {
        self.index as usize
    }
    fn cols(&self) -> &'a JobColumns {
        &self.cluster.jobs
    }
    pub fn name(&self) -> &'a str {
        self.cluster.string(self.cols().name[self.i()])
    }
    pub fn tenant(&self) -> &'a str {
        self.cluster.string(self.cols().tenant[self.i()])
    }
    pub fn tenant_id(&self) -> u32 {
        self.cols().tenant[self.i()]
    }
    pub fn phase(&self) -> u8 {
        self.cols().phase[self.i()]
    }
    pub fn is_pending(&self) -> bool {
        matches!(self.phase(), job_phase::PENDING | job_phase::RESERVED)
    }
    pub fn is_running(&self) -> bool {
        self.phase() == job_phase::RUNNING
    }
    pub fn kind(&self) -> u8 {
        self.cols().kind[self.i()]
    }
    pub fn qos(&self) -> u8 {
        self.cols().qos[self.i()]
    }
    pub fn priority(&self) -> i32 {
        self.cols().priority[self.i()]
    }
    /// Workers the job asks for (or runs with, once running).
    pub fn workers(&self) -> u32 {
        self.cols().workers[self.i()]
    }
    pub fn min_workers(&self) -> u32 {
        self.cols().min_workers[self.i()]
    }
    pub fn max_workers(&self) -> u32 {
        self.cols().max_workers[self.i()]
    }
    pub fn is_elastic(&self) -> bool {
        self.min_workers() < self.max_workers()
    }
    pub fn cpu_milli(&self) -> u32 {
        self.cols().cpu_milli[self.i()]
    }
    pub fn memory_mib(&self) -> u32 {
        self.cols().memory_mib[self.i()]
    }
    pub fn gpus_per_worker(&self) -> u32 {
        self.cols().gpus_per_worker[self.i()]
    }
    pub fn gpu_milli(&self) -> u32 {
        self.cols().gpu_milli[self.i()]
    }
    /// GPU memory per fractional worker; 0 = in proportion to `gpu_milli`.
    pub fn gpu_memory_mib(&self) -> u32 {
        self.cols().gpu_memory_mib[self.i()]
    }
    /// Whether each worker wants a fraction of one GPU.
    pub fn is_fractional(&self) -> bool {
        self.gpus_per_worker() == 1 && self.gpu_milli() > 0 && self.gpu_milli() < FULL_GPU_MILLI
    }
    /// Total GPU demand at `workers` workers, in milli-GPU.
    pub fn gpu_demand_milli(&self) -> u64 {
        crate::model::gpu_demand_milli(self.workers(), self.gpus_per_worker(), self.gpu_milli())
    }
    pub fn gpu_model_mask(&self) -> u64 {
        self.cols().gpu_model_mask[self.i()]
    }
    pub fn submit_ms(&self) -> u64 {
        self.cols().submit_ms[self.i()]
    }
    /// Estimated total run time at the submitted worker count, `None` if unknown.
    pub fn estimate_ms(&self) -> Option<u64> {
        Some(self.cols().estimate_ms[self.i()]).filter(|&e| e > 0)
    }
    /// Where the job stands: its runs and what is left of it.
    pub fn progress(&self) -> JobProgress {
        let c = self.cols();
        let i = self.i();
        JobProgress {
            job: self.index,
            started_ms: c.started_ms[i],
            attained_ms: c.attained_ms[i],
            remaining_ms: c.remaining_ms[i],
            remaining_workers: c.remaining_workers[i],
            reported_ms: c.reported_ms[i],
        }
    }
    /// Run time left now, at [`JobProgress::remaining_workers`] workers;
    /// `None` if unknown.
    pub fn remaining_ms(&self) -> Option<u64> {
        self.progress().remaining_ms_at(self.cluster.now_ms)
    }
    /// Run time so far, over all of the job's runs.
    pub fn attained_ms(&self) -> u64 {
        self.progress().attained_ms_at(self.cluster.now_ms)
    }
    pub fn deadline_ms(&self) -> Option<u64> {
        Some(self.cols().deadline_ms[self.i()]).filter(|&d| d > 0)
    }
    pub fn checkpointed(&self) -> bool {
        self.cols().checkpointed[self.i()]
    }
    /// The job's running workers.
    pub fn placement(&self) -> &'a [WorkerPlacement] {
        &self.cluster.job_workers[self.i()]
    }
    /// The placement after a `scale-out` adding `added` (appended, so the
    /// existing workers keep their positions).
    pub fn placement_with(&self, added: &[WorkerPlacement]) -> Vec<WorkerPlacement> {
        let mut workers = self.placement().to_vec();
        workers.extend_from_slice(added);
        workers
    }
    /// The placement after a `scale-in` removing the workers at `positions`.
    pub fn placement_without(&self, positions: &[u32]) -> Vec<WorkerPlacement> {
        self.placement()
            .iter()
            .enumerate()
            .filter(|(i, _)| !positions.contains(&(*i as u32)))
            .map(|(_, w)| w.clone())
            .collect()
    }
    /// Nodes reserved for this job.
    pub fn reserved_nodes(&self) -> &'a [u32] {
        &self.cluster.job_reserved[self.i()]
    }
    /// GPUs this job holds by `reserve-gpus`.
    pub fn reserved_gpus(&self) -> &'a [u32] {
        &self.cluster.job_reserved_gpus[self.i()]
    }
    /// The most milli-GPU a fractional worker may burst to (the request
    /// when no limit was given).
    pub fn gpu_milli_limit(&self) -> u32 {
        match self.cols().gpu_milli_limit[self.i()] {
            0 => self.gpu_milli(),
            limit => limit,
        }
    }
    /// `locality` code.
    pub fn locality(&self) -> u8 {
        self.cols().locality[self.i()]
    }
    /// Latency objective, if any.
    pub fn slo_ms(&self) -> Option<u32> {
        Some(self.cols().slo_ms[self.i()]).filter(|&v| v > 0)
    }
    /// Recurrence group name ("" = none).
    pub fn group(&self) -> &'a str {
        self.cluster.string(self.cols().group[self.i()])
    }
    /// Whether the job's workers are charged as shared work (qos >= 1
    /// while sharing is on).
    pub fn is_shared(&self) -> bool {
        self.cluster.sharing.is_shared(self.qos())
    }
    /// Latest runtime statistics (zeros until reported).
    pub fn metrics(&self) -> JobMetric {
        JobMetric {
            job: self.index,
            ..self.cluster.job_metrics[self.i()]
        }
    }
    /// Latest service load (zeros until reported).
    pub fn service(&self) -> ServiceMetric {
        ServiceMetric {
            job: self.index,
            ..self.cluster.job_service[self.i()]
        }
    }
    /// Whether GPU `gpu`'s model is allowed for this job.
    pub fn allows_gpu(&self, gpu: u32) -> bool {
        self.cluster.gpu_allowed_for(self.i(), gpu as usize)
    }
}
