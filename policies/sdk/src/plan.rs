//! A round's plan: tentative decisions over a [`Cluster`], checked as they are made.
//!
//! Policies build their decisions through a `Plan` so two decisions of the
//! same round cannot claim the same capacity. The host validates whatever a
//! policy returns by replaying it through a `Plan` too: a decision the plan
//! refuses here is exactly a decision the host refuses.

use crate::cluster::{CLOSED, Cluster, NodeRoom, OPEN};
use crate::model::*;
use std::collections::HashMap;

/// Why a decision is impossible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecisionError {
    UnknownJob(u32),
    UnknownNode(u32),
    UnknownGpu(u32),
    /// The job is not in a phase the decision applies to.
    WrongPhase {
        job: u32,
        phase: u8,
        decision: &'static str,
    },
    /// A gang placement with the wrong number of workers.
    GangSize {
        job: u32,
        workers: usize,
        min: u32,
        max: u32,
    },
    /// A worker got the wrong number of GPUs.
    GpuCount {
        job: u32,
        expected: u32,
        got: usize,
    },
    GpuNotOnNode {
        gpu: u32,
        node: u32,
    },
    /// The same GPU twice in one worker.
    DuplicateGpu {
        job: u32,
        gpu: u32,
    },
    ModelNotAllowed {
        job: u32,
        gpu: u32,
    },
    NodeNotSchedulable {
        node: u32,
        state: u8,
    },
    ReservedForOther {
        node: u32,
        holder: u32,
    },
    /// Not enough of a resource left.
    Overcommit {
        resource: &'static str,
        at: u32,
        need: u64,
        free: u64,
    },
    QuotaExceeded {
        job: u32,
        tenant: u32,
        need_milli: u64,
        quota_milli: u64,
    },
    BadWorkerIndex {
        job: u32,
        worker: u32,
        workers: usize,
    },
    /// A scale-in names the same worker position twice.
    DuplicateWorker {
        job: u32,
        worker: u32,
    },
    /// Two decisions about the same job in one round (a `set-qos` may
    /// precede one other).
    JobAlreadyDecided(u32),
    TooManyDecisions {
        limit: u32,
    },
    BadQos(u8),
    /// Opportunistic (qos >= 1) work on a GPU that is not healthy.
    GpuNotHealthy {
        gpu: u32,
        health: u8,
    },
    /// A GPU held by another job's `reserve-gpus`.
    GpuReservedForOther {
        gpu: u32,
        holder: u32,
    },
    /// The GPU already has the most shared workers the operator allows.
    SharedWorkersFull {
        gpu: u32,
        limit: u32,
    },
    /// A job that requires one node, placed across several.
    LocalityViolated {
        job: u32,
    },
}

impl core::fmt::Display for DecisionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use DecisionError::*;
        match self {
            UnknownJob(j) => write!(f, "unknown job index {j}"),
            UnknownNode(n) => write!(f, "unknown node index {n}"),
            UnknownGpu(g) => write!(f, "unknown GPU index {g}"),
            WrongPhase {
                job,
                phase,
                decision,
            } => {
                write!(
                    f,
                    "`{decision}` is not valid for job {job} in phase {phase}"
                )
            }
            GangSize {
                job,
                workers,
                min,
                max,
            } => {
                write!(
                    f,
                    "job {job} is a gang of {min}..={max} workers, got {workers}"
                )
            }
            GpuCount { job, expected, got } => {
                write!(f, "a worker of job {job} needs {expected} GPUs, got {got}")
            }
            GpuNotOnNode { gpu, node } => write!(f, "GPU {gpu} is not on node {node}"),
            DuplicateGpu { job, gpu } => {
                write!(f, "GPU {gpu} given twice to a worker of job {job}")
            }
            ModelNotAllowed { job, gpu } => {
                write!(f, "job {job} does not allow the model of GPU {gpu}")
            }
            NodeNotSchedulable { node, state } => {
                write!(f, "node {node} is not schedulable (state {state})")
            }
            ReservedForOther { node, holder } => {
                write!(f, "node {node} is reserved for job {holder}")
            }
            Overcommit {
                resource,
                at,
                need,
                free,
            } => {
                write!(
                    f,
                    "overcommit of {resource} at {at}: need {need}, free {free}"
                )
            }
            QuotaExceeded {
                job,
                tenant,
                need_milli,
                quota_milli,
            } => write!(
                f,
                "job {job} would take tenant {tenant} to {need_milli} milli-GPU, quota {quota_milli}"
            ),
            BadWorkerIndex {
                job,
                worker,
                workers,
            } => {
                write!(f, "job {job} has {workers} workers, no worker {worker}")
            }
            DuplicateWorker { job, worker } => {
                write!(f, "scale-in of job {job} names worker {worker} twice")
            }
            JobAlreadyDecided(j) => write!(f, "job {j} already has a decision this round"),
            TooManyDecisions { limit } => write!(f, "more than {limit} decisions in one round"),
            BadQos(q) => write!(f, "unknown QoS {q}"),
            GpuNotHealthy { gpu, health } => {
                write!(
                    f,
                    "GPU {gpu} is not healthy (health {health}): no shared work"
                )
            }
            GpuReservedForOther { gpu, holder } => {
                write!(f, "GPU {gpu} is reserved for job {holder}")
            }
            SharedWorkersFull { gpu, limit } => {
                write!(f, "GPU {gpu} already has {limit} shared workers")
            }
            LocalityViolated { job } => {
                write!(f, "job {job} requires all its workers on one node")
            }
        }
    }
}

impl std::error::Error for DecisionError {}

/// One worker's needs, hoisted out of per-node loops (see [`Plan::job_fit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobFit {
    pub job: u32,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpus: u32,
    /// Milli-GPU of a fractional worker; 0 for whole GPUs.
    pub fractional_milli: u32,
    pub model_mask: u64,
    /// The node rows cannot answer for the GPUs: shared work (which may use
    /// reserved nodes and is checked per GPU against the sharing rules) or
    /// a job holding GPU reservations. The node row still answers for
    /// readiness, CPU, memory and model; each GPU is then checked.
    pub scan_gpus: bool,
    /// Shared work: node reservations do not apply.
    pub shared: bool,
    /// Opportunistic (qos >= 1) work, which goes only on healthy GPUs: on a node with a GPU
    /// that is not healthy, each GPU is checked (the node row cannot tell which).
    pub opportunistic: bool,
}

/// Tentative state of one round.
#[derive(Clone)]
pub struct Plan<'a> {
    cluster: &'a Cluster,
    cpu_used: Vec<u32>,
    memory_used: Vec<u32>,
    milli_used: Vec<u32>,
    gpu_memory_used: Vec<u32>,
    shared_milli: Vec<u32>,
    shared_memory: Vec<u32>,
    shared_workers: Vec<u32>,
    /// Per job: its QoS under this plan (a `set-qos` changes it).
    qos: Vec<u8>,
    /// Per node: its room under this plan (re-derived by `charge`).
    room: Vec<NodeRoom>,
    /// Per node: a fresh version once this plan changed the node, else 0.
    node_version: Vec<u64>,
    phase: Vec<u8>,
    /// Workers of jobs whose placement this plan changed.
    workers: HashMap<u32, ChangedWorkers>,
    /// Per job: [`UNDECIDED`], [`QOS_SET`] (a `set-qos` was taken; one more
    /// decision may follow) or [`DECIDED`].
    decided: Vec<u8>,
    tenant_quota_milli: HashMap<u32, u64>,
    tenant_used_milli: HashMap<u32, u64>,
    max_decisions: u32,
    decisions: Vec<Decision>,
}

/// Where a [`Plan`] keeps the workers of a job whose placement it changed.
#[derive(Clone, Debug)]
enum ChangedWorkers {
    /// Those of the plan's decision at this index, a place or a migrate —
    /// read there, not copied: a round places thousands of jobs, and a copy
    /// of each placement (a vector per job and one per worker) was a tenth of
    /// a PAI-scale round, allocating and freeing.
    InDecision(usize),
    /// Derived by the plan: a scale-out's or scale-in's result, or none after
    /// a preemption.
    Derived(Vec<WorkerPlacement>),
}

impl<'a> Plan<'a> {
    pub fn new(cluster: &'a Cluster) -> Self {
        Plan {
            cluster,
            cpu_used: cluster.nodes.cpu_used_milli.clone(),
            memory_used: cluster.nodes.memory_used_mib.clone(),
            milli_used: cluster.gpus.milli_used.clone(),
            gpu_memory_used: cluster.gpus.memory_used_mib.clone(),
            // Never read while sharing is off: nothing is charged as shared.
            shared_milli: shared_or_empty(cluster, &cluster.gpus.shared_milli),
            shared_memory: shared_or_empty(cluster, &cluster.gpus.shared_memory_mib),
            shared_workers: shared_or_empty(cluster, &cluster.gpus.shared_workers),
            qos: cluster.jobs.qos.clone(),
            room: cluster.node_room.clone(),
            node_version: vec![0; cluster.node_count()],
            phase: cluster.jobs.phase.clone(),
            workers: HashMap::new(),
            decided: vec![UNDECIDED; cluster.job_count()],
            tenant_quota_milli: HashMap::new(),
            tenant_used_milli: HashMap::new(),
            max_decisions: u32::MAX,
            decisions: Vec::new(),
        }
        .with_cluster_quotas()
    }

    /// Caps the number of decisions (the round's `max-decisions`).
    pub fn with_max_decisions(mut self, limit: u32) -> Self {
        self.max_decisions = limit;
        self
    }

    /// The tenants' quotas of the cluster view and what their guaranteed
    /// work holds now (only guaranteed-charged work consumes quota).
    fn with_cluster_quotas(mut self) -> Self {
        let tenants = self.cluster.tenant_columns();
        if tenants.name.is_empty() {
            return self;
        }
        let quotas: HashMap<u32, u64> = tenants
            .name
            .iter()
            .copied()
            .zip(tenants.gpu_quota_milli.iter().copied())
            .collect();
        let mut used: HashMap<u32, u64> = HashMap::new();
        for job in self.cluster.running_jobs() {
            if quotas.contains_key(&job.tenant_id()) && self.cluster.sharing.takes_quota(job.qos())
            {
                *used.entry(job.tenant_id()).or_default() +=
                    self.worker_milli(job.index()) * job.placement().len() as u64;
            }
        }
        self.tenant_quota_milli = quotas;
        self.tenant_used_milli = used;
        self
    }

    /// A job's QoS under this plan.
    pub fn qos(&self, job: u32) -> u8 {
        self.qos
            .get(job as usize)
            .copied()
            .unwrap_or(qos::GUARANTEED)
    }

    /// Whether `job`'s workers are charged as shared under this plan.
    pub fn is_shared(&self, job: u32) -> bool {
        self.cluster.sharing.is_shared(self.qos(job))
    }

    pub fn cluster(&self) -> &'a Cluster {
        self.cluster
    }
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }
    pub fn into_decisions(self) -> Vec<Decision> {
        self.decisions
    }

    // ---- tentative capacity ----

    pub fn free_milli(&self, gpu: u32) -> u32 {
        FULL_GPU_MILLI.saturating_sub(self.milli_used[gpu as usize])
    }
    pub fn free_gpu_memory(&self, gpu: u32) -> u32 {
        self.cluster.gpus.memory_mib[gpu as usize]
            .saturating_sub(self.gpu_memory_used[gpu as usize])
    }
    pub fn free_cpu(&self, node: u32) -> u32 {
        self.room[node as usize].cpu_free
    }
    pub fn free_memory(&self, node: u32) -> u32 {
        self.room[node as usize].memory_free
    }
    /// Free milli-GPU summed over a node's GPUs (O(1): kept by the plan).
    pub fn node_free_milli(&self, node: u32) -> u32 {
        self.room[node as usize].free_milli
    }
    /// GPUs of a node with nothing on them (O(1): kept by the plan).
    pub fn node_idle_gpus(&self, node: u32) -> u32 {
        self.room[node as usize].idle_gpus
    }
    /// [`Cluster::node_version`] of `node` with this plan's changes: a
    /// fresh version after each worker the plan charges to or releases from it.
    pub fn node_version(&self, node: u32) -> u64 {
        match self.node_version.get(node as usize) {
            Some(&v) if v != 0 => v,
            _ => self.cluster.node_version(node),
        }
    }
    pub fn phase(&self, job: u32) -> u8 {
        self.phase[job as usize]
    }
    pub fn is_decided(&self, job: u32) -> bool {
        self.decided.get(job as usize).is_none_or(|&d| d == DECIDED)
    }

    /// Whether node `node` can take new work for `job` at all (shared work
    /// may use reserved nodes).
    pub fn node_open_for(&self, job: u32, node: u32) -> bool {
        let n = self.cluster.node(node);
        n.is_ready()
            && (self.is_shared(job)
                || self
                    .cluster
                    .reserved_by(node)
                    .is_none_or(|holder| holder == job))
    }

    /// What one worker of `job` takes from GPU `gpu` under this plan's QoS.
    fn share_on(&self, job: u32, gpu: u32) -> (u32, u32) {
        self.cluster
            .worker_gpu_share_as(job as usize, gpu as usize, self.qos(job))
    }

    /// Whether GPU `gpu` can take one more worker-share of `job`.
    #[inline]
    pub fn gpu_fits(&self, job: u32, gpu: u32) -> bool {
        self.gpu_refusal(job, gpu).is_none()
    }

    /// Why GPU `gpu` cannot take one more worker-share of `job`, or `None`
    /// when it can: the one statement of the GPU rules for guaranteed and
    /// shared work (`sharing-rules` in the WIT). Inlined so that callers
    /// asking only *whether* it fits (the placement scans) build no error.
    #[inline(always)]
    fn gpu_refusal(&self, job: u32, gpu: u32) -> Option<DecisionError> {
        let g = gpu as usize;
        if !self.cluster.gpu_allowed_for(job as usize, g) {
            return Some(DecisionError::ModelNotAllowed { job, gpu });
        }
        let q = self.qos(job);
        let (milli, mem) = self.cluster.worker_gpu_share_as(job as usize, g, q);
        let over = |resource, need: u32, free: u32| {
            Some(DecisionError::Overcommit {
                resource,
                at: gpu,
                need: need.into(),
                free: free.into(),
            })
        };
        // Opportunistic (qos ≥ 1) work goes only on healthy GPUs, shared or not (MuxFlow's
        // X10: a GPU its coordinator holds unhealthy, overlimit or disabled takes no offline
        // work); guaranteed work is unaffected.
        let health = self.cluster.gpus.health[g];
        if q != crate::model::qos::GUARANTEED && health != crate::model::health::HEALTHY {
            return Some(DecisionError::GpuNotHealthy { gpu, health });
        }
        if !self.cluster.sharing.is_shared(q) {
            // Guaranteed: against guaranteed use and GPU reservations only.
            let holder = self.cluster.gpu_reserved_by[g];
            if holder != 0 && holder != job + 1 {
                return Some(DecisionError::GpuReservedForOther {
                    gpu,
                    holder: holder - 1,
                });
            }
            if self.free_milli(gpu) < milli {
                return over("gpu-milli", milli, self.free_milli(gpu));
            }
            if self.free_gpu_memory(gpu) < mem {
                return over("gpu-memory-mib", mem, self.free_gpu_memory(gpu));
            }
            return None;
        }
        // Shared: (healthy GPUs, above,) the shared-worker cap, the shared compute
        // cap, and memory beside guaranteed use (or, with host spill, beside
        // other shared work only); never blocked by reservations.
        let rules = self.cluster.sharing;
        if rules.max_shared_workers > 0 && self.shared_workers[g] >= rules.max_shared_workers {
            return Some(DecisionError::SharedWorkersFull {
                gpu,
                limit: rules.max_shared_workers,
            });
        }
        let shared_free = rules.oversub_milli.saturating_sub(self.shared_milli[g]);
        if shared_free < milli {
            return over("shared gpu-milli", milli, shared_free);
        }
        let beside = if rules.host_spill {
            0
        } else {
            self.gpu_memory_used[g]
        };
        let total = self.cluster.gpus.memory_mib[g];
        let mem_free = total.saturating_sub(beside.saturating_add(self.shared_memory[g]));
        if mem_free < mem {
            return over("shared gpu-memory-mib", mem, mem_free);
        }
        None
    }

    /// GPUs of `node` that can take one more worker-share of `job`.
    pub fn fitting_gpus(&self, job: u32, node: u32) -> impl Iterator<Item = u32> + '_ {
        self.cluster
            .node(node)
            .gpu_range()
            .filter(move |&g| self.gpu_fits(job, g))
    }

    /// Whether the node has CPU and memory for one more worker of `job`.
    pub fn host_resources_fit(&self, job: u32, node: u32) -> bool {
        let j = self.cluster.job(job);
        self.free_cpu(node) >= j.cpu_milli() && self.free_memory(node) >= j.memory_mib()
    }

    /// What a node must offer one worker of `job`, read once so that
    /// [`Plan::fits`] can test thousands of nodes touching only node data.
    pub fn job_fit(&self, job: u32) -> JobFit {
        let j = self.cluster.job(job);
        let shared = self.is_shared(job);
        JobFit {
            job,
            cpu_milli: j.cpu_milli(),
            memory_mib: j.memory_mib(),
            gpus: j.gpus_per_worker(),
            fractional_milli: if j.is_fractional() { j.gpu_milli() } else { 0 },
            model_mask: j.gpu_model_mask(),
            scan_gpus: shared || !j.reserved_gpus().is_empty(),
            shared,
            opportunistic: self.qos(job) != crate::model::qos::GUARANTEED,
        }
    }

    /// Whether one more worker described by `fit` fits on `node`. Whole-GPU
    /// workers are answered from the plan's per-node counts in O(1),
    /// fractional ones by scanning the node's GPUs; a node's GPUs are one
    /// model (`NodeSpec`).
    pub fn fits(&self, fit: &JobFit, node: u32) -> bool {
        self.room
            .get(node as usize)
            .is_some_and(|room| self.room_fits(fit, node, room))
    }

    /// [`Plan::fits`] on the node's row.
    fn room_fits(&self, fit: &JobFit, node: u32, room: &NodeRoom) -> bool {
        room_admits(fit, room) && self.gpus_fit(fit, node)
    }

    /// The per-GPU part of [`Plan::fits`], for the fits the node row cannot
    /// answer alone: a fractional worker needs one GPU with its share, a
    /// scanned one (`JobFit::scan_gpus`) its GPU count of fitting GPUs.
    fn gpus_fit(&self, fit: &JobFit, node: u32) -> bool {
        if fit.gpus == 0 {
            true
        } else if fit.scan_gpus || (fit.opportunistic && self.has_unhealthy_gpu(node)) {
            self.fitting_gpus(fit.job, node)
                .take(fit.gpus as usize)
                .count()
                == fit.gpus as usize
        } else {
            fit.fractional_milli == 0 || self.fitting_gpus(fit.job, node).next().is_some()
        }
    }

    /// Whether a GPU of `node` is not healthy (a node has a handful of GPUs).
    fn has_unhealthy_gpu(&self, node: u32) -> bool {
        let health = &self.cluster.gpus.health;
        self.cluster
            .node(node)
            .gpu_range()
            .any(|g| health.get(g as usize) != Some(&crate::model::health::HEALTHY))
    }

    /// Calls `visit(node)` for every node where one worker of `fit` fits, in
    /// index order: [`Plan::fits`] over all nodes.
    ///
    /// This loop is most of a placement policy's time at cluster scale, so
    /// it is shaped for the Wasm compiler as much as for LLVM: a tight,
    /// branch-free pass over the packed rows of 64 nodes at a time yields a
    /// bit mask, and only the admitted nodes get the per-GPU check and the
    /// visit. Kept out of line, so that a policy's large `schedule` does not
    /// crowd the loop's registers (Cranelift otherwise spills its state on
    /// every iteration).
    #[inline(never)]
    pub fn each_fitting_node(&self, fit: &JobFit, mut visit: impl FnMut(u32)) {
        for (chunk, rows) in self.room.chunks(64).enumerate() {
            let mut admitted = admitted_rows(fit, rows);
            while admitted != 0 {
                let node = (chunk * 64) as u32 + admitted.trailing_zeros();
                admitted &= admitted - 1;
                if self.gpus_fit(fit, node) {
                    visit(node);
                }
            }
        }
    }

    /// Whether one more worker of `job` fits on `node` (see [`Plan::fits`]).
    pub fn worker_fits(&self, job: u32, node: u32) -> bool {
        self.fits(&self.job_fit(job), node)
    }

    /// One worker of `job` on `node` using the first GPUs that fit, if any.
    pub fn first_fit_worker(&self, job: u32, node: u32) -> Option<WorkerPlacement> {
        if !self.worker_fits(job, node) {
            return None;
        }
        let need = self.cluster.job(job).gpus_per_worker() as usize;
        let gpus: Vec<u32> = self.fitting_gpus(job, node).take(need).collect();
        (gpus.len() == need).then_some(WorkerPlacement { node, gpus })
    }

    /// One worker of `job` on the first node (in index order) where it fits.
    pub fn first_fit_anywhere(&self, job: u32) -> Option<WorkerPlacement> {
        let fit = self.job_fit(job);
        let node = (0..self.cluster.node_count() as u32).find(|&n| self.fits(&fit, n))?;
        self.first_fit_worker(job, node)
    }

    // ---- decisions ----

    /// Places a gang: `choose` is asked for one worker at a time and sees the
    /// plan with the previous workers already charged. All or nothing.
    pub fn place_gang(
        &mut self,
        job: u32,
        workers: u32,
        mut choose: impl FnMut(&Plan<'a>) -> Option<WorkerPlacement>,
    ) -> Result<(), DecisionError> {
        let mut chosen = Vec::with_capacity(workers as usize);
        let mut failure = None;
        for _ in 0..workers {
            match choose(self) {
                Some(w) => {
                    if let Err(e) = self.check_worker(job, &w) {
                        failure = Some(e);
                        break;
                    }
                    self.charge(job, &w, true);
                    chosen.push(w);
                }
                None => break,
            }
        }
        for w in &chosen {
            self.charge(job, w, false);
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if chosen.len() as u32 != workers {
            let j = self.cluster.job(job);
            return Err(DecisionError::GangSize {
                job,
                workers: chosen.len(),
                min: j.min_workers(),
                max: j.max_workers(),
            });
        }
        self.apply(Decision::Place(job, chosen))
    }

    /// Places `jobs` in the order given, each as a gang whose workers
    /// `choose` picks one at a time; a job that does not fit waits for a
    /// later round and the jobs behind it may go ahead (greedy backfill).
    /// Stops at the round's decision limit.
    pub fn place_each(
        &mut self,
        jobs: impl IntoIterator<Item = crate::cluster::Job<'a>>,
        mut choose: impl FnMut(&Plan<'a>, crate::cluster::Job<'a>) -> Option<WorkerPlacement>,
    ) {
        for job in jobs {
            if self.decisions.len() as u64 >= u64::from(self.max_decisions) {
                break;
            }
            let _ = self.place_gang(job.index(), job.workers(), |plan| choose(plan, job));
        }
    }

    /// Checks a decision against the tentative state and, if possible, takes it.
    pub fn apply(&mut self, decision: Decision) -> Result<(), DecisionError> {
        if self.decisions.len() as u64 >= u64::from(self.max_decisions) {
            return Err(DecisionError::TooManyDecisions {
                limit: self.max_decisions,
            });
        }
        let job = decision.job();
        if job as usize >= self.cluster.job_count() {
            return Err(DecisionError::UnknownJob(job));
        }
        let state = self.decided[job as usize];
        if state == DECIDED || (matches!(decision, Decision::SetQos(..)) && state == QOS_SET) {
            return Err(DecisionError::JobAlreadyDecided(job));
        }
        match &decision {
            Decision::Place(_, w) | Decision::Migrate(_, w) => self.check_locality(job, w, &[])?,
            Decision::ScaleOut(_, w) => self.check_locality(job, &self.current_workers(job), w)?,
            _ => {}
        }
        match &decision {
            Decision::Place(_, workers) => {
                self.expect_phase(job, &[job_phase::PENDING, job_phase::RESERVED], "place")?;
                self.check_gang(job, workers, false)?;
                self.check_quota(job, workers.len())?;
                self.commit_workers(job, workers)?;
                self.charge_quota(job, workers.len() as i64);
                self.phase[job as usize] = job_phase::RUNNING;
            }
            Decision::Migrate(_, workers) => {
                self.expect_phase(job, &[job_phase::RUNNING], "migrate")?;
                self.check_gang(job, workers, false)?;
                let old = self.current_workers(job);
                self.check_quota(job, workers.len().saturating_sub(old.len()))?;
                for w in &old {
                    self.charge(job, w, false);
                }
                if let Err(e) = self.commit_workers(job, workers) {
                    for w in &old {
                        self.charge(job, w, true);
                    }
                    return Err(e);
                }
                self.charge_quota(job, workers.len() as i64 - old.len() as i64);
            }
            Decision::ScaleOut(_, added) => {
                self.expect_phase(job, &[job_phase::RUNNING], "scale-out")?;
                let mut all = self.current_workers(job);
                all.extend(added.iter().cloned());
                self.check_gang(job, &all, true)?;
                self.check_quota(job, added.len())?;
                for (i, w) in added.iter().enumerate() {
                    if let Err(e) = self.check_worker(job, w) {
                        for done in &added[..i] {
                            self.charge(job, done, false);
                        }
                        return Err(e);
                    }
                    self.charge(job, w, true);
                }
                self.charge_quota(job, added.len() as i64);
                self.workers.insert(job, ChangedWorkers::Derived(all));
            }
            Decision::ScaleIn(_, positions) => {
                self.expect_phase(job, &[job_phase::RUNNING], "scale-in")?;
                let current = self.current_workers(job);
                let mut remove = vec![false; current.len()];
                for &p in positions {
                    match remove.get_mut(p as usize) {
                        Some(slot) if !*slot => *slot = true,
                        Some(_) => {
                            return Err(DecisionError::DuplicateWorker { job, worker: p });
                        }
                        None => {
                            return Err(DecisionError::BadWorkerIndex {
                                job,
                                worker: p,
                                workers: current.len(),
                            });
                        }
                    }
                }
                let kept: Vec<WorkerPlacement> = current
                    .iter()
                    .zip(&remove)
                    .filter(|(_, r)| !**r)
                    .map(|(w, _)| w.clone())
                    .collect();
                self.check_gang(job, &kept, true)?;
                for (w, r) in current.iter().zip(&remove) {
                    if *r {
                        self.charge(job, w, false);
                    }
                }
                self.charge_quota(job, kept.len() as i64 - current.len() as i64);
                self.workers.insert(job, ChangedWorkers::Derived(kept));
            }
            Decision::Preempt(_) => {
                self.expect_phase(job, &[job_phase::RUNNING], "preempt")?;
                let old = self.current_workers(job);
                for w in &old {
                    self.charge(job, w, false);
                }
                self.charge_quota(job, -(old.len() as i64));
                self.workers
                    .insert(job, ChangedWorkers::Derived(Vec::new()));
                self.phase[job as usize] = job_phase::PENDING;
            }
            Decision::Reserve(_, nodes) => {
                self.expect_phase(job, &[job_phase::PENDING, job_phase::RESERVED], "reserve")?;
                for &node in nodes {
                    if node as usize >= self.cluster.node_count() {
                        return Err(DecisionError::UnknownNode(node));
                    }
                    // A reservation is exclusive whatever the holder's QoS
                    // (shared work may *use* reserved nodes, not reserve them).
                    let n = self.cluster.node(node);
                    if let Some(holder) = self.cluster.reserved_by(node).filter(|&h| h != job) {
                        return Err(DecisionError::ReservedForOther { node, holder });
                    }
                    if !n.is_ready() {
                        return Err(DecisionError::NodeNotSchedulable {
                            node,
                            state: n.state(),
                        });
                    }
                }
            }
            Decision::Unreserve(_) => {
                self.expect_phase(job, &[job_phase::RESERVED], "unreserve")?;
            }
            Decision::SetQos(_, q) => {
                self.set_qos(job, *q)?;
                // One more decision about the job may follow, under the new QoS.
                self.decided[job as usize] = QOS_SET;
                self.decisions.push(decision);
                return Ok(());
            }
            Decision::ReserveGpus(_, gpus) => {
                self.expect_phase(
                    job,
                    &[job_phase::PENDING, job_phase::RESERVED],
                    "reserve-gpus",
                )?;
                for (i, &gpu) in gpus.iter().enumerate() {
                    if gpu as usize >= self.cluster.gpu_count() {
                        return Err(DecisionError::UnknownGpu(gpu));
                    }
                    if gpus[..i].contains(&gpu) {
                        return Err(DecisionError::DuplicateGpu { job, gpu });
                    }
                    let node = self.cluster.gpu(gpu).node();
                    let n = self.cluster.node(node);
                    if !n.is_ready() {
                        return Err(DecisionError::NodeNotSchedulable {
                            node,
                            state: n.state(),
                        });
                    }
                    if let Some(holder) = self.cluster.gpu_reserved_by(gpu).filter(|&h| h != job) {
                        return Err(DecisionError::GpuReservedForOther { gpu, holder });
                    }
                    if let Some(holder) = self.cluster.reserved_by(node).filter(|&h| h != job) {
                        return Err(DecisionError::ReservedForOther { node, holder });
                    }
                }
            }
        }
        self.decided[job as usize] = DECIDED;
        self.decisions.push(decision);
        Ok(())
    }

    /// `set-qos`: a known code; a running job whose charge moves between
    /// the guaranteed and shared accounts must fit the new one (and, moving
    /// to guaranteed, its tenant's quota), checked as if its workers moved.
    fn set_qos(&mut self, job: u32, q: u8) -> Result<(), DecisionError> {
        if q > qos::BEST_EFFORT {
            return Err(DecisionError::BadQos(q));
        }
        let old = self.qos(job);
        let sharing = self.cluster.sharing;
        if self.phase[job as usize] != job_phase::RUNNING
            || sharing.is_shared(old) == sharing.is_shared(q)
        {
            self.qos[job as usize] = q;
            return Ok(());
        }
        let workers = self.current_workers(job);
        for w in &workers {
            self.charge(job, w, false);
        }
        self.charge_quota(job, -(workers.len() as i64));
        self.qos[job as usize] = q;
        let checked = self
            .check_quota(job, workers.len())
            .and_then(|()| self.commit_workers(job, &workers));
        if let Err(e) = checked {
            self.qos[job as usize] = old;
            for w in &workers {
                self.charge(job, w, true);
            }
            self.charge_quota(job, workers.len() as i64);
            return Err(e);
        }
        self.charge_quota(job, workers.len() as i64);
        Ok(())
    }

    /// A job that requires one node gets all its workers (`kept` and
    /// `added`) on one node.
    fn check_locality(
        &self,
        job: u32,
        kept: &[WorkerPlacement],
        added: &[WorkerPlacement],
    ) -> Result<(), DecisionError> {
        if self.cluster.job(job).locality() != crate::model::locality::REQUIRE_ONE_NODE {
            return Ok(());
        }
        let mut nodes = kept.iter().chain(added).map(|w| w.node);
        let first = nodes.next();
        if nodes.all(|n| Some(n) == first) {
            Ok(())
        } else {
            Err(DecisionError::LocalityViolated { job })
        }
    }

    fn expect_phase(
        &self,
        job: u32,
        allowed: &[u8],
        decision: &'static str,
    ) -> Result<(), DecisionError> {
        let phase = self.phase[job as usize];
        if allowed.contains(&phase) {
            Ok(())
        } else {
            Err(DecisionError::WrongPhase {
                job,
                phase,
                decision,
            })
        }
    }

    /// A job's workers in the tentative state (empty once preempted).
    pub fn workers_of(&self, job: u32) -> Vec<WorkerPlacement> {
        self.current_workers(job)
    }

    fn current_workers(&self, job: u32) -> Vec<WorkerPlacement> {
        self.changed_workers(job)
            .unwrap_or_else(|| self.cluster.job(job).placement())
            .to_vec()
    }

    /// The workers of `job` if this plan changed its placement.
    fn changed_workers(&self, job: u32) -> Option<&[WorkerPlacement]> {
        match self.workers.get(&job)? {
            ChangedWorkers::Derived(w) => Some(w),
            ChangedWorkers::InDecision(i) => match self.decisions.get(*i) {
                Some(Decision::Place(_, w) | Decision::Migrate(_, w)) => Some(w),
                other => {
                    debug_assert!(false, "job {job}'s workers at decision {i}: {other:?}");
                    None
                }
            },
        }
    }

    /// Gang rule: an inelastic job gets exactly `workers`; an elastic job
    /// anything in `min..=max` (a running job being resized keeps ≥ 1).
    fn check_gang(
        &self,
        job: u32,
        workers: &[WorkerPlacement],
        resizing: bool,
    ) -> Result<(), DecisionError> {
        let j = self.cluster.job(job);
        let (min, max) = if j.is_elastic() || resizing {
            (
                j.min_workers().max(1),
                j.max_workers().max(j.min_workers()).max(1),
            )
        } else {
            (j.workers(), j.workers())
        };
        let n = workers.len() as u32;
        if n < min || n > max || workers.is_empty() {
            return Err(DecisionError::GangSize {
                job,
                workers: workers.len(),
                min,
                max,
            });
        }
        Ok(())
    }

    /// Whether `job` consumes its tenant's quota under this plan's QoS.
    fn takes_quota(&self, job: u32) -> bool {
        self.cluster.sharing.takes_quota(self.qos(job))
    }

    /// What one worker of `job` charges against its tenant's quota.
    fn worker_milli(&self, job: u32) -> u64 {
        let j = self.cluster.job(job);
        crate::model::gpu_demand_milli(1, j.gpus_per_worker(), j.gpu_milli())
    }

    /// Moves the job's tenant's charged quota by `workers` workers (the one
    /// place it changes: place, migrate, scale-out/in, preempt).
    fn charge_quota(&mut self, job: u32, workers: i64) {
        let tenant = self.cluster.job(job).tenant_id();
        if !self.tenant_quota_milli.contains_key(&tenant) || !self.takes_quota(job) {
            return;
        }
        let amount = self.worker_milli(job) * workers.unsigned_abs();
        let used = self.tenant_used_milli.entry(tenant).or_default();
        *used = if workers >= 0 {
            used.saturating_add(amount)
        } else {
            used.saturating_sub(amount)
        };
    }

    fn check_quota(&self, job: u32, new_workers: usize) -> Result<(), DecisionError> {
        let j = self.cluster.job(job);
        let Some(&quota) = self.tenant_quota_milli.get(&j.tenant_id()) else {
            return Ok(());
        };
        if !self.takes_quota(job) {
            return Ok(());
        }
        let per_worker = self.worker_milli(job);
        let used = self
            .tenant_used_milli
            .get(&j.tenant_id())
            .copied()
            .unwrap_or(0);
        let need = used + per_worker * new_workers as u64;
        if need > quota {
            return Err(DecisionError::QuotaExceeded {
                job,
                tenant: j.tenant_id(),
                need_milli: need,
                quota_milli: quota,
            });
        }
        Ok(())
    }

    /// Charges a full worker set, all or nothing.
    fn commit_workers(
        &mut self,
        job: u32,
        workers: &[WorkerPlacement],
    ) -> Result<(), DecisionError> {
        for (i, w) in workers.iter().enumerate() {
            if let Err(e) = self.check_worker(job, w) {
                for done in &workers[..i] {
                    self.charge(job, done, false);
                }
                return Err(e);
            }
            self.charge(job, w, true);
        }
        // The caller (`apply`, for a place or a migrate) pushes the decision
        // holding `workers` next, with nothing fallible in between.
        self.workers
            .insert(job, ChangedWorkers::InDecision(self.decisions.len()));
        Ok(())
    }

    /// Checks one worker against the tentative state (without charging it).
    pub fn check_worker(&self, job: u32, w: &WorkerPlacement) -> Result<(), DecisionError> {
        let node = w.node;
        if node as usize >= self.cluster.node_count() {
            return Err(DecisionError::UnknownNode(node));
        }
        let n = self.cluster.node(node);
        if !n.is_ready() {
            return Err(DecisionError::NodeNotSchedulable {
                node,
                state: n.state(),
            });
        }
        if let Some(holder) = self
            .cluster
            .reserved_by(node)
            .filter(|&h| h != job && !self.is_shared(job))
        {
            return Err(DecisionError::ReservedForOther { node, holder });
        }
        let j = self.cluster.job(job);
        if w.gpus.len() != j.gpus_per_worker() as usize {
            return Err(DecisionError::GpuCount {
                job,
                expected: j.gpus_per_worker(),
                got: w.gpus.len(),
            });
        }
        let (cpu, mem) = (j.cpu_milli(), j.memory_mib());
        if self.free_cpu(node) < cpu {
            return Err(DecisionError::Overcommit {
                resource: "cpu-milli",
                at: node,
                need: cpu.into(),
                free: self.free_cpu(node).into(),
            });
        }
        if self.free_memory(node) < mem {
            return Err(DecisionError::Overcommit {
                resource: "memory-mib",
                at: node,
                need: mem.into(),
                free: self.free_memory(node).into(),
            });
        }
        let range = n.gpu_range();
        for (i, &gpu) in w.gpus.iter().enumerate() {
            if gpu as usize >= self.cluster.gpu_count() {
                return Err(DecisionError::UnknownGpu(gpu));
            }
            if !range.contains(&gpu) {
                return Err(DecisionError::GpuNotOnNode { gpu, node });
            }
            if w.gpus[..i].contains(&gpu) {
                return Err(DecisionError::DuplicateGpu { job, gpu });
            }
            if let Some(refusal) = self.gpu_refusal(job, gpu) {
                return Err(refusal);
            }
        }
        Ok(())
    }

    fn charge(&mut self, job: u32, w: &WorkerPlacement, charge: bool) {
        let j = self.cluster.job(job);
        let n = w.node as usize;
        let apply = |v: &mut u32, amount: u32| {
            *v = if charge {
                v.saturating_add(amount)
            } else {
                v.saturating_sub(amount)
            };
        };
        apply(&mut self.cpu_used[n], j.cpu_milli());
        apply(&mut self.memory_used[n], j.memory_mib());
        if let Some(v) = self.node_version.get_mut(n) {
            *v = crate::cluster::fresh_version();
        }
        let shared = self.is_shared(job);
        for &gpu in &w.gpus {
            let g = gpu as usize;
            let (milli, mem) = self.share_on(job, gpu);
            if shared {
                apply(&mut self.shared_milli[g], milli);
                apply(&mut self.shared_memory[g], mem);
                apply(&mut self.shared_workers[g], 1);
            } else {
                apply(&mut self.milli_used[g], milli);
                apply(&mut self.gpu_memory_used[g], mem);
            }
        }
        if n < self.room.len() {
            self.room[n] = NodeRoom::of(
                self.cluster,
                n,
                |g| (self.milli_used[g], self.gpu_memory_used[g]),
                self.cpu_used[n],
                self.memory_used[n],
            );
        }
    }
}

/// [`Plan::decided`] states.
const UNDECIDED: u8 = 0;
const QOS_SET: u8 = 1;
const DECIDED: u8 = 2;

/// A plan's copy of a shared-account column, or nothing while sharing is off.
fn shared_or_empty(cluster: &Cluster, column: &[u32]) -> Vec<u32> {
    if cluster.sharing.enabled() {
        column.to_vec()
    } else {
        Vec::new()
    }
}

/// Bit i set: `room_admits` for `rows[i]` (at most 64 rows). A small leaf
/// function on purpose: Cranelift keeps all its state in registers, which it
/// does not manage for the same loop inlined into a large caller.
#[inline(never)]
fn admitted_rows(fit: &JobFit, rows: &[NodeRoom]) -> u64 {
    let rows = &rows[..rows.len().min(64)];
    // Four rows per iteration: a Wasm loop pays an interruption check on
    // every back-edge.
    let mut admitted = 0u64;
    let mut quads = rows.chunks_exact(4);
    for (q, quad) in quads.by_ref().enumerate() {
        let bits = u64::from(room_admits(fit, &quad[0]))
            | u64::from(room_admits(fit, &quad[1])) << 1
            | u64::from(room_admits(fit, &quad[2])) << 2
            | u64::from(room_admits(fit, &quad[3])) << 3;
        admitted |= bits << (4 * q);
    }
    let done = rows.len() - quads.remainder().len();
    for (i, room) in quads.remainder().iter().enumerate() {
        admitted |= u64::from(room_admits(fit, room)) << (done + i);
    }
    admitted
}

/// Everything [`Plan::fits`] checks that the node's row alone answers: the
/// node is ready and not reserved for another job, CPU and memory suffice,
/// and for a GPU worker the model is allowed and there is GPU room in total
/// (for a fractional worker some GPU must still have the share: the caller
/// checks that per GPU). Branch-free on purpose (see `each_fitting_node`).
#[inline(always)]
fn room_admits(fit: &JobFit, room: &NodeRoom) -> bool {
    if room.holder == CLOSED
        || (room.holder != OPEN && room.holder != fit.job.wrapping_add(1) && !fit.shared)
        || room.cpu_free < fit.cpu_milli
        || room.memory_free < fit.memory_mib
    {
        return false;
    }
    if fit.gpus == 0 {
        return true;
    }
    let slot = u32::from(room.model_slot);
    room.gpu_count > 0
        && (fit.model_mask == 0 || (slot < 64 && (fit.model_mask >> slot) & 1 == 1))
        && (fit.scan_gpus
            || if fit.fractional_milli > 0 {
                room.free_milli >= fit.fractional_milli
            } else {
                room.idle_gpus >= fit.gpus
            })
}
