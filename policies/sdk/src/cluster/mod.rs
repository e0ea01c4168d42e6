//! The cluster mirror: snapshot + deltas → a queryable view.
//!
//! The host keeps its own truth in exactly this structure and feeds every
//! change through [`Cluster::apply_event`], the same state machine a guest
//! runs on the deltas it receives. That is what keeps a policy's mirror and
//! the host's state in step: there is one implementation of the index rules
//! and of the resource accounting.
//!
//! This file holds the tables ([`Cluster`]) and the queries; `snapshot.rs` builds a mirror
//! from a snapshot and back, `events.rs` is the state machine, `views.rs` the typed views
//! of a node, GPU or job.

mod events;
mod snapshot;
mod views;

pub use views::{Gpu, Job, Node};

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
