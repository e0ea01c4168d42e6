//! Typed views of one node, GPU or job of the mirror.

use super::*;

/// A node of the mirror.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    pub(super) cluster: &'a Cluster,
    pub(super) index: u32,
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
    pub(super) cluster: &'a Cluster,
    pub(super) index: u32,
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
    pub(super) cluster: &'a Cluster,
    pub(super) index: u32,
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
