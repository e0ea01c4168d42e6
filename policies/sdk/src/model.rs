//! Plain Rust mirror of the types of `wit/policy.wit`.
//!
//! Field for field the same as the WIT records, so the guest bindings and the
//! host's `wasmtime` bindings convert to and from these types by moving
//! vectors, never by reshaping data. The host uses these types too: a native
//! policy and a Wasm policy see exactly the same values.

/// `types.node-state` codes.
pub mod node_state {
    pub const READY: u8 = 0;
    pub const CORDONED: u8 = 1;
    pub const LOST: u8 = 2;
    pub const RECLAIMING: u8 = 3;
}

/// `types.job-phase` codes.
pub mod job_phase {
    pub const PENDING: u8 = 0;
    pub const RUNNING: u8 = 1;
    pub const RESERVED: u8 = 2;
}

/// `types.qos` codes.
pub mod qos {
    pub const GUARANTEED: u8 = 0;
    pub const OPPORTUNISTIC: u8 = 1;
    pub const BEST_EFFORT: u8 = 2;
}

/// `types.job-kind` codes.
pub mod job_kind {
    pub const TRAINING: u8 = 0;
    pub const INFERENCE: u8 = 1;
    /// A notebook or modeling session (since 0.3).
    pub const INTERACTIVE: u8 = 2;
}

/// `types.locality` codes (since 0.3).
pub mod locality {
    pub const ANY: u8 = 0;
    /// A hint: one node if possible.
    pub const PREFER_ONE_NODE: u8 = 1;
    /// Every worker on one node; the validator refuses anything else.
    pub const REQUIRE_ONE_NODE: u8 = 2;
}

/// `workload-status.role` codes (node-local).
pub mod workload_role {
    /// Latency-critical, the GPU's owner.
    pub const ONLINE: u8 = 0;
    /// Best effort beside an online workload.
    pub const OFFLINE: u8 = 1;
}

/// `types.health` codes (MuxFlow SysMonitor states).
pub mod health {
    pub const INIT: u8 = 0;
    pub const HEALTHY: u8 = 1;
    pub const UNHEALTHY: u8 = 2;
    pub const OVERLIMIT: u8 = 3;
    pub const DISABLED: u8 = 4;
}

/// A whole GPU in milli-GPU.
pub const FULL_GPU_MILLI: u32 = 1000;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct NodeColumns {
    pub name: Vec<u32>,
    pub pool: Vec<u32>,
    pub state: Vec<u8>,
    pub cpu_milli: Vec<u32>,
    pub memory_mib: Vec<u32>,
    pub cpu_used_milli: Vec<u32>,
    pub memory_used_mib: Vec<u32>,
    pub first_gpu: Vec<u32>,
    pub gpu_count: Vec<u32>,
    pub on_loan: Vec<bool>,
    // Since 0.3; absent from what an older host journaled (`fill_absent_columns`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub fabric: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GpuColumns {
    pub node: Vec<u32>,
    pub model: Vec<u32>,
    pub memory_mib: Vec<u32>,
    pub milli_used: Vec<u32>,
    pub memory_used_mib: Vec<u32>,
    // Since 0.3 (`fill_absent_columns`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub shared_milli: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub shared_memory_mib: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub shared_workers: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub health: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct JobColumns {
    pub name: Vec<u32>,
    pub tenant: Vec<u32>,
    pub phase: Vec<u8>,
    pub kind: Vec<u8>,
    pub qos: Vec<u8>,
    pub priority: Vec<i32>,
    pub workers: Vec<u32>,
    pub min_workers: Vec<u32>,
    pub max_workers: Vec<u32>,
    pub cpu_milli: Vec<u32>,
    pub memory_mib: Vec<u32>,
    pub gpus_per_worker: Vec<u32>,
    pub gpu_milli: Vec<u32>,
    pub gpu_memory_mib: Vec<u32>,
    pub gpu_model_mask: Vec<u64>,
    pub submit_ms: Vec<u64>,
    pub estimate_ms: Vec<u64>,
    pub deadline_ms: Vec<u64>,
    pub checkpointed: Vec<bool>,
    // Since 0.2; absent from what a 0.1 host journaled (see `Snapshot::fill_absent_columns`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub started_ms: Vec<u64>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub attained_ms: Vec<u64>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub remaining_ms: Vec<u64>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub remaining_workers: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub reported_ms: Vec<u64>,
    // Since 0.3 (`fill_absent_columns`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub gpu_milli_limit: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub locality: Vec<u8>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub slo_ms: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub group: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct WorkerPlacement {
    pub node: u32,
    pub gpus: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PlacementColumns {
    pub job: Vec<u32>,
    pub node: Vec<u32>,
    pub gpu_start: Vec<u32>,
    pub gpu_len: Vec<u8>,
    pub gpus: Vec<u32>,
}

impl PlacementColumns {
    /// Appends one job's workers as consecutive rows. `false` (and nothing
    /// appended) when the rows could not be read back as this one `place`
    /// ([`PlacementColumns::job_runs`]): the job has no workers (no row to
    /// carry it), a worker uses more GPUs than a row can say (255), or the
    /// last row already names this job (the two would read back as one).
    pub fn push_job(&mut self, job: u32, workers: &[WorkerPlacement]) -> bool {
        if workers.is_empty()
            || workers.iter().any(|w| w.gpus.len() > usize::from(u8::MAX))
            || self.job.last() == Some(&job)
        {
            return false;
        }
        for w in workers {
            self.job.push(job);
            self.node.push(w.node);
            self.gpu_start.push(self.gpus.len() as u32);
            self.gpu_len.push(w.gpus.len() as u8);
            self.gpus.extend_from_slice(&w.gpus);
        }
        true
    }

    /// The rows as one entry per run of consecutive rows naming the same
    /// job, in order. `Err` says what is malformed: columns of different
    /// lengths, or rows that do not tile `gpus` — each row's GPUs start where
    /// the previous row's ended, and the last row's end at the end of
    /// `gpus`, as [`PlacementColumns::push_job`] writes them. Tiling keeps
    /// what the host builds from a batch as large as the batch itself:
    /// rows that could name one range over and over would turn a few bytes
    /// of a guest's answer into 255 GPUs each in host memory, past the
    /// bound wasmtime puts on what a call may make the host allocate.
    pub fn job_runs(&self) -> Result<Vec<(u32, Vec<WorkerPlacement>)>, String> {
        let n = self.job.len();
        if self.node.len() != n || self.gpu_start.len() != n || self.gpu_len.len() != n {
            return Err("placement columns have different lengths".into());
        }
        let mut runs: Vec<(u32, Vec<WorkerPlacement>)> = Vec::new();
        let mut next = 0usize;
        for r in 0..n {
            let start = self.gpu_start[r] as usize;
            let end = start.saturating_add(usize::from(self.gpu_len[r]));
            if start != next {
                return Err(format!(
                    "placement row {r} starts at GPU {start}, not {next} where the rows before it end: rows must tile `gpus` in order"
                ));
            }
            let Some(gpus) = self.gpus.get(start..end) else {
                return Err(format!(
                    "placement row {r} names GPUs {start}..{end} of {}",
                    self.gpus.len()
                ));
            };
            next = end;
            let worker = WorkerPlacement {
                node: self.node[r],
                gpus: gpus.to_vec(),
            };
            match runs.last_mut() {
                Some((job, workers)) if *job == self.job[r] => workers.push(worker),
                _ => runs.push((self.job[r], vec![worker])),
            }
        }
        if next != self.gpus.len() {
            return Err(format!(
                "placement rows name {next} GPUs of the {} in `gpus`",
                self.gpus.len()
            ));
        }
        Ok(runs)
    }
}

/// `types.sharing-rules`: the operator's rules for sharing GPUs by QoS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SharingRules {
    /// Most shared milli-GPU on one GPU; 0 = sharing off.
    pub oversub_milli: u32,
    /// Most shared workers on one GPU; 0 = no limit.
    pub max_shared_workers: u32,
    pub host_spill: bool,
}

impl SharingRules {
    /// Sharing is on: qos >= 1 work is charged apart from guaranteed work.
    pub fn enabled(&self) -> bool {
        self.oversub_milli > 0
    }

    /// Whether a worker of this QoS is charged as shared under these rules.
    pub fn is_shared(&self, qos: u8) -> bool {
        self.enabled() && qos != qos::GUARANTEED
    }

    /// Whether work of this QoS consumes its tenant's GPU quota: only work
    /// charged as guaranteed does. The one statement of the rule for the
    /// validator (`Plan`) and the control plane's admission.
    pub fn takes_quota(&self, qos: u8) -> bool {
        !self.is_shared(qos)
    }
}

/// `types.tenant-columns`: tenants with a quota.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TenantColumns {
    pub name: Vec<u32>,
    pub gpu_quota_milli: Vec<u64>,
}

/// `types.reservation`: what a reserved job holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Reservation {
    pub job: u32,
    pub nodes: Vec<u32>,
    pub gpus: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Snapshot {
    pub epoch: u64,
    pub now_ms: u64,
    pub strings: Vec<String>,
    pub gpu_models: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub gpu_model_speed: Vec<u32>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub sharing: SharingRules,
    #[cfg_attr(feature = "serde", serde(default))]
    pub tenants: TenantColumns,
    #[cfg_attr(feature = "serde", serde(default))]
    pub metric_window_ms: u32,
    pub nodes: NodeColumns,
    pub gpus: GpuColumns,
    pub jobs: JobColumns,
    pub placements: PlacementColumns,
    #[cfg_attr(feature = "serde", serde(default))]
    pub reservations: Vec<Reservation>,
}

impl Snapshot {
    /// Gives a snapshot written before contract 0.2 (e.g. in an old decision
    /// journal) the columns it lacks, with the values a 0.2 host starts
    /// from: models at the reference speed, and each job's progress as its
    /// submitted estimate. Columns already present are left alone.
    pub fn fill_absent_columns(&mut self) {
        let models = self.gpu_models.len();
        if self.gpu_model_speed.len() < models {
            self.gpu_model_speed
                .resize(models, REFERENCE_SPEED_PERMILLE);
        }
        let j = &mut self.jobs;
        if j.started_ms.is_empty()
            && j.attained_ms.is_empty()
            && j.remaining_ms.is_empty()
            && j.remaining_workers.is_empty()
            && j.reported_ms.is_empty()
        {
            for i in 0..j.name.len() {
                // Columns of unequal lengths: the mirror refuses the snapshot
                // later, with the reason; nothing to fill here.
                let (Some(&estimate), Some(&workers), Some(&submit)) =
                    (j.estimate_ms.get(i), j.workers.get(i), j.submit_ms.get(i))
                else {
                    break;
                };
                let p = JobProgress::submitted(i as u32, estimate, workers, submit);
                j.push_progress(&p);
            }
        }
        // 0.3 columns, as a 0.3 host starts them: no fabric known, nothing
        // shared, GPUs healthy, no burst, no locality, SLO or group. The
        // fabric and group "" must be interned for their ids to mean "".
        let n = self.nodes.name.len();
        let g = self.gpus.node.len();
        let jobs = self.jobs.name.len();
        if self.nodes.fabric.is_empty() && n > 0 {
            let empty = self.intern_empty();
            self.nodes.fabric = vec![empty; n];
        }
        let gc = &mut self.gpus;
        for col in [
            &mut gc.shared_milli,
            &mut gc.shared_memory_mib,
            &mut gc.shared_workers,
        ] {
            if col.is_empty() {
                *col = vec![0; g];
            }
        }
        if gc.health.is_empty() {
            gc.health = vec![health::HEALTHY; g];
        }
        let jc = &mut self.jobs;
        if jc.gpu_milli_limit.is_empty() {
            jc.gpu_milli_limit = vec![0; jobs];
        }
        if jc.locality.is_empty() {
            jc.locality = vec![locality::ANY; jobs];
        }
        if jc.slo_ms.is_empty() {
            jc.slo_ms = vec![0; jobs];
        }
        if self.jobs.group.is_empty() && jobs > 0 {
            let empty = self.intern_empty();
            self.jobs.group = vec![empty; jobs];
        }
    }

    /// The id of "" in the string table, appended if absent.
    fn intern_empty(&mut self) -> u32 {
        match self.strings.iter().position(|s| s.is_empty()) {
            Some(i) => i as u32,
            None => {
                self.strings.push(String::new());
                (self.strings.len() - 1) as u32
            }
        }
    }
}

impl JobColumns {
    /// The number of rows, or `None` when the columns disagree on it.
    pub fn rows(&self) -> Option<usize> {
        let n = self.name.len();
        let lens = [
            self.tenant.len(),
            self.phase.len(),
            self.kind.len(),
            self.qos.len(),
            self.priority.len(),
            self.workers.len(),
            self.min_workers.len(),
            self.max_workers.len(),
            self.cpu_milli.len(),
            self.memory_mib.len(),
            self.gpus_per_worker.len(),
            self.gpu_milli.len(),
            self.gpu_memory_mib.len(),
            self.gpu_model_mask.len(),
            self.submit_ms.len(),
            self.estimate_ms.len(),
            self.deadline_ms.len(),
            self.checkpointed.len(),
            self.started_ms.len(),
            self.attained_ms.len(),
            self.remaining_ms.len(),
            self.remaining_workers.len(),
            self.reported_ms.len(),
            self.gpu_milli_limit.len(),
            self.locality.len(),
            self.slo_ms.len(),
            self.group.len(),
        ];
        lens.iter().all(|&l| l == n).then_some(n)
    }

    /// Appends a job as it arrives: pending, with no progress yet (the
    /// row a snapshot taken just after the arrival would show, and what
    /// the contract's `jobs-added` carries).
    pub fn push_arrival(&mut self, s: &JobSpec) {
        self.name.push(s.name);
        self.tenant.push(s.tenant);
        self.phase.push(job_phase::PENDING);
        self.kind.push(s.kind);
        self.qos.push(s.qos);
        self.priority.push(s.priority);
        self.workers.push(s.workers);
        self.min_workers.push(s.min_workers);
        self.max_workers.push(s.max_workers);
        self.cpu_milli.push(s.cpu_milli);
        self.memory_mib.push(s.memory_mib);
        self.gpus_per_worker.push(s.gpus_per_worker);
        self.gpu_milli.push(s.gpu_milli);
        self.gpu_memory_mib.push(s.gpu_memory_mib);
        self.gpu_model_mask.push(s.gpu_model_mask);
        self.submit_ms.push(s.submit_ms);
        self.estimate_ms.push(s.estimate_ms);
        self.deadline_ms.push(s.deadline_ms);
        self.checkpointed.push(s.checkpointed);
        self.gpu_milli_limit.push(s.gpu_milli_limit);
        self.locality.push(s.locality);
        self.slo_ms.push(s.slo_ms);
        self.group.push(s.group);
        // Until the host reports progress, what is left is the estimate.
        let row = self.name.len() as u32 - 1;
        self.push_progress(&JobProgress::submitted(
            row,
            s.estimate_ms,
            s.workers,
            s.submit_ms,
        ));
    }

    /// What row `j` (in range) says about the job as it arrived: the
    /// inverse of [`JobColumns::push_arrival`].
    pub fn arrival(&self, j: usize) -> JobSpec {
        JobSpec {
            name: self.name[j],
            tenant: self.tenant[j],
            kind: self.kind[j],
            qos: self.qos[j],
            priority: self.priority[j],
            workers: self.workers[j],
            min_workers: self.min_workers[j],
            max_workers: self.max_workers[j],
            cpu_milli: self.cpu_milli[j],
            memory_mib: self.memory_mib[j],
            gpus_per_worker: self.gpus_per_worker[j],
            gpu_milli: self.gpu_milli[j],
            gpu_memory_mib: self.gpu_memory_mib[j],
            gpu_model_mask: self.gpu_model_mask[j],
            submit_ms: self.submit_ms[j],
            estimate_ms: self.estimate_ms[j],
            deadline_ms: self.deadline_ms[j],
            checkpointed: self.checkpointed[j],
            gpu_milli_limit: self.gpu_milli_limit[j],
            locality: self.locality[j],
            slo_ms: self.slo_ms[j],
            group: self.group[j],
        }
    }

    /// Appends the progress columns of a new last row.
    pub(crate) fn push_progress(&mut self, p: &JobProgress) {
        self.started_ms.push(p.started_ms);
        self.attained_ms.push(p.attained_ms);
        self.remaining_ms.push(p.remaining_ms);
        self.remaining_workers.push(p.remaining_workers);
        self.reported_ms.push(p.reported_ms);
    }

    /// Overwrites the progress columns of row `p.job` (in range).
    pub(crate) fn set_progress(&mut self, p: &JobProgress) {
        let j = p.job as usize;
        self.started_ms[j] = p.started_ms;
        self.attained_ms[j] = p.attained_ms;
        self.remaining_ms[j] = p.remaining_ms;
        self.remaining_workers[j] = p.remaining_workers;
        self.reported_ms[j] = p.reported_ms;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct NodeSpec {
    pub name: u32,
    pub pool: u32,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpu_model: u32,
    pub gpu_memory_mib: u32,
    pub gpu_count: u32,
    pub on_loan: bool,
    /// Since 0.3; a 0.2 journal's nodes read as string id 0 (see
    /// `fill_absent_columns` for snapshots).
    #[cfg_attr(feature = "serde", serde(default))]
    pub fabric: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct JobSpec {
    pub name: u32,
    pub tenant: u32,
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
    pub gpu_model_mask: u64,
    pub submit_ms: u64,
    pub estimate_ms: u64,
    pub deadline_ms: u64,
    pub checkpointed: bool,
    // Since 0.3.
    #[cfg_attr(feature = "serde", serde(default))]
    pub gpu_milli_limit: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub locality: u8,
    #[cfg_attr(feature = "serde", serde(default))]
    pub slo_ms: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub group: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GpuMetric {
    pub gpu: u32,
    pub utilization_pct: u8,
    pub sm_activity_pct: u8,
    pub memory_used_mib: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub sm_occupancy_pct: u8,
}

/// `types.job-metric`: runtime statistics of a running job (since 0.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct JobMetric {
    pub job: u32,
    pub iteration_ms: u32,
    pub peak_memory_mib: u32,
    pub min_memory_mib: u32,
    pub host_memory_mib: u32,
    pub utilization_pct: u8,
    pub sm_activity_pct: u8,
}

impl JobMetric {
    /// Two workers' (or two nodes') statistics as one job's: the contract's fields are per
    /// worker, so the job reports its slowest iteration, its fullest and emptiest worker's
    /// memory, and its busiest worker's utilization. The `job` of `self` is kept.
    pub fn combine(self, other: JobMetric) -> JobMetric {
        JobMetric {
            job: self.job,
            iteration_ms: self.iteration_ms.max(other.iteration_ms),
            peak_memory_mib: self.peak_memory_mib.max(other.peak_memory_mib),
            min_memory_mib: self.min_memory_mib.min(other.min_memory_mib),
            host_memory_mib: self.host_memory_mib.max(other.host_memory_mib),
            utilization_pct: self.utilization_pct.max(other.utilization_pct),
            sm_activity_pct: self.sm_activity_pct.max(other.sm_activity_pct),
        }
    }
}

/// `types.service-metric`: load of an inference job (since 0.3).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ServiceMetric {
    pub job: u32,
    pub requests_per_s: f32,
    pub p50_latency_ms: u32,
    pub p99_latency_ms: u32,
}

/// `types.node-metric`: host-side load of a node (since 0.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct NodeMetric {
    pub node: u32,
    pub cpu_utilization_pct: u8,
    pub host_memory_used_mib: u32,
    pub swap_in_per_s: u32,
}

/// Where a job stands: `types.job-progress`. The host is its only source;
/// [`JobProgress::remaining_ms_at`] and [`JobProgress::attained_ms_at`] are
/// the one reading of it that host and guests share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct JobProgress {
    pub job: u32,
    /// Start of the current run; 0 = not running.
    pub started_ms: u64,
    /// Run time of the earlier runs.
    pub attained_ms: u64,
    /// Run time left at `remaining_workers` workers, as of `reported_ms`; 0 = unknown.
    pub remaining_ms: u64,
    pub remaining_workers: u32,
    pub reported_ms: u64,
}

impl JobProgress {
    /// Where a job stands before it has run (or after it lost its progress):
    /// what is left is its estimate, at the size it was submitted with.
    pub fn submitted(job: u32, estimate_ms: u64, workers: u32, submit_ms: u64) -> Self {
        JobProgress {
            job,
            started_ms: 0,
            attained_ms: 0,
            remaining_ms: estimate_ms,
            remaining_workers: workers,
            reported_ms: submit_ms,
        }
    }

    pub fn is_running(&self) -> bool {
        self.started_ms > 0
    }

    /// Run time so far, including the current run up to `now_ms`.
    pub fn attained_ms_at(&self, now_ms: u64) -> u64 {
        let current = if self.is_running() {
            now_ms.saturating_sub(self.started_ms)
        } else {
            0
        };
        self.attained_ms.saturating_add(current)
    }

    /// Run time left at `now_ms` (at `remaining_workers` workers), or `None`
    /// when unknown. A running job has worked since the later of the report
    /// and its start; a stopped one has not.
    pub fn remaining_ms_at(&self, now_ms: u64) -> Option<u64> {
        if self.remaining_ms == 0 {
            return None;
        }
        let worked = if self.is_running() {
            now_ms.saturating_sub(self.reported_ms.max(self.started_ms))
        } else {
            0
        };
        Some(self.remaining_ms.saturating_sub(worked))
    }
}

/// The most GPUs one node may have (a rack-scale NVLink domain is 72): a
/// node that claims more is refused by the host and by the mirror, so a
/// bad count cannot make either allocate billions of rows.
pub const MAX_NODE_GPUS: u32 = 1024;

/// Speed of a GPU model no one gave a speed for: the reference speed.
pub const REFERENCE_SPEED_PERMILLE: u32 = 1000;

#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Event {
    StringsAdded(Vec<String>),
    /// (string id, speed permille). A 0.1 journal's bare ids read as the
    /// reference speed.
    GpuModelsAdded(
        #[cfg_attr(feature = "serde", serde(deserialize_with = "models_added_compat"))]
        Vec<(u32, u32)>,
    ),
    /// (slot in `gpu_models`, speed permille).
    GpuModelSpeedChanged(u32, u32),
    NodeAdded(NodeSpec),
    NodeStateChanged(u32, u8),
    NodeLoanChanged(u32, bool),
    JobAdded(JobSpec),
    JobRemoved(u32),
    JobPlaced(u32, Vec<WorkerPlacement>),
    JobEvicted(u32),
    JobQosChanged(u32, u8),
    JobReserved(u32, Vec<u32>),
    GpuMetrics(Vec<GpuMetric>),
    JobProgress(Vec<JobProgress>),
    // Since 0.3.
    TenantQuotaChanged(u32, u64),
    TenantQuotaRemoved(u32),
    SharingChanged(SharingRules),
    GpuHealthChanged(u32, u8),
    JobReservedGpus(u32, Vec<u32>),
    JobMetrics(Vec<JobMetric>),
    ServiceMetrics(Vec<ServiceMetric>),
    NodeMetrics(Vec<NodeMetric>),
}

/// Reads `gpu-models-added` as written by 0.2 (`[[id, speed], …]`) or by a
/// 0.1 host (`[id, …]`).
#[cfg(feature = "serde")]
fn models_added_compat<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<(u32, u32)>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Entry {
        WithSpeed((u32, u32)),
        Bare(u32),
    }
    let entries: Vec<Entry> = serde::Deserialize::deserialize(d)?;
    Ok(entries
        .into_iter()
        .map(|e| match e {
            Entry::WithSpeed(pair) => pair,
            Entry::Bare(id) => (id, REFERENCE_SPEED_PERMILLE),
        })
        .collect())
}

#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Delta {
    pub base_epoch: u64,
    pub epoch: u64,
    pub now_ms: u64,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Decision {
    Place(u32, Vec<WorkerPlacement>),
    Reserve(u32, Vec<u32>),
    Unreserve(u32),
    Preempt(u32),
    ScaleOut(u32, Vec<WorkerPlacement>),
    ScaleIn(u32, Vec<u32>),
    SetQos(u32, u8),
    Migrate(u32, Vec<WorkerPlacement>),
    /// Since 0.3.
    ReserveGpus(u32, Vec<u32>),
}

impl Decision {
    /// The job the decision is about.
    pub fn job(&self) -> u32 {
        match self {
            Decision::Place(j, _)
            | Decision::Reserve(j, _)
            | Decision::Unreserve(j)
            | Decision::Preempt(j)
            | Decision::ScaleOut(j, _)
            | Decision::ScaleIn(j, _)
            | Decision::SetQos(j, _)
            | Decision::Migrate(j, _)
            | Decision::ReserveGpus(j, _) => *j,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RoundInfo {
    pub epoch: u64,
    pub now_ms: u64,
    pub max_decisions: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum PolicyError {
    Stale(u64),
    Unsupported(String),
    Failed(String),
}

impl core::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PolicyError::Stale(epoch) => write!(f, "policy mirror is stale (at epoch {epoch})"),
            PolicyError::Unsupported(role) => write!(f, "role `{role}` is not implemented"),
            PolicyError::Failed(msg) => write!(f, "policy failed: {msg}"),
        }
    }
}

impl std::error::Error for PolicyError {}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ReclaimRequest {
    pub epoch: u64,
    pub candidates: Vec<u32>,
    pub count: u32,
    pub max_decisions: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ReclaimPlan {
    pub nodes: Vec<u32>,
    pub decisions: Vec<Decision>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct WorkloadProfile {
    pub job: u32,
    pub utilization_pct: u8,
    pub sm_activity_pct: u8,
    pub memory_mib: u32,
    pub throughput: f32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub sm_occupancy_pct: u8,
    #[cfg_attr(feature = "serde", serde(default))]
    pub solo_iteration_ms: u32,
}

#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct MatchRequest {
    pub epoch: u64,
    pub online: Vec<u32>,
    pub offline: Vec<u32>,
    pub profiles: Vec<WorkloadProfile>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Pairing {
    pub online: u32,
    pub offline: u32,
    /// Since 0.3: the online job's GPU the offline job joins.
    pub gpu: u32,
    pub sm_percent: u8,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GpuStatus {
    pub index: u32,
    pub utilization_pct: u8,
    pub sm_activity_pct: u8,
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    pub memory_used_mib: u32,
    pub memory_total_mib: u32,
    pub health: u8,
    // Since 0.3.
    #[cfg_attr(feature = "serde", serde(default))]
    pub observed_ok: bool,
    #[cfg_attr(feature = "serde", serde(default))]
    pub xid_errors: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub throttle_reasons: u64,
    #[cfg_attr(feature = "serde", serde(default))]
    pub power_mw: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub temperature_c: u8,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct WorkloadStatus {
    pub id: u32,
    pub gpu: u32,
    pub role: u8,
    pub memory_used_mib: u32,
    pub memory_limit_mib: u32,
    pub compute_share: u32,
    pub launches: u64,
    pub pacing_delay_us: u64,
    pub iteration_ms: u32,
    pub frozen: bool,
    // Since 0.3.
    #[cfg_attr(feature = "serde", serde(default))]
    pub job: String,
    #[cfg_attr(feature = "serde", serde(default))]
    pub qos: u8,
    #[cfg_attr(feature = "serde", serde(default))]
    pub request_permille: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub limit_permille: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub quota_denials: u64,
    /// The part of `memory_used_mib` no wrapped allocator charged (context, module, graph and
    /// pool memory NVML sees); counted against the limit.
    #[cfg_attr(feature = "serde", serde(default))]
    pub memory_unseen_mib: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct NodeView {
    pub now_ms: u64,
    pub gpus: Vec<GpuStatus>,
    pub workloads: Vec<WorkloadStatus>,
    // Since 0.3.
    #[cfg_attr(feature = "serde", serde(default))]
    pub monotonic_ms: u64,
    #[cfg_attr(feature = "serde", serde(default))]
    pub host_memory_used_mib: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub host_memory_total_mib: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub swap_in_per_s: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub cpu_utilization_pct: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum NodeAction {
    SetMemoryLimit(u32, u32),
    SetComputeShare(u32, u32),
    SetMpsThreadPct(u32, u8),
    Freeze(u32),
    Resume(u32),
    Evict(u32),
    SetHealth(u32, u8),
    /// Since 0.3.
    RestartMps(u32),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TenantJob {
    pub position: u32,
    pub name: String,
    pub gpus: u32,
    pub priority: i32,
    pub submit_ms: u64,
    pub estimate_ms: u64,
    pub deadline_ms: u64,
    pub running: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TenantView {
    pub now_ms: u64,
    pub tenant: String,
    pub gpu_quota: u32,
    pub gpus_in_use: u32,
    pub jobs: Vec<TenantJob>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TenantVerdict {
    pub order: Vec<u32>,
    pub hold: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub roles: Vec<String>,
    pub description: String,
    pub default_config: String,
}

/// The policy roles of the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Role {
    Scheduler,
    Reclaim,
    Matcher,
    Coordinator,
    Tenant,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Scheduler,
        Role::Reclaim,
        Role::Matcher,
        Role::Coordinator,
        Role::Tenant,
    ];

    /// The role's name in manifests and in the WIT package.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Reclaim => "reclaim",
            Role::Matcher => "matcher",
            Role::Coordinator => "coordinator",
            Role::Tenant => "tenant",
        }
    }

    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl core::fmt::Display for Role {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's GPU demand in milli-GPU at `workers` workers: a fractional
/// worker (one GPU, `0 < gpu_milli < 1000`) counts its share, any other
/// worker its whole GPUs. Quotas are charged in this measure.
#[inline]
pub fn gpu_demand_milli(workers: u32, gpus_per_worker: u32, gpu_milli: u32) -> u64 {
    let per_worker = if gpus_per_worker == 1 && gpu_milli > 0 && gpu_milli < FULL_GPU_MILLI {
        u64::from(gpu_milli)
    } else {
        u64::from(gpus_per_worker) * u64::from(FULL_GPU_MILLI)
    };
    per_worker * u64::from(workers)
}

/// What one worker of a job takes from one of its GPUs: (milli-GPU, MiB).
///
/// The single definition of GPU accounting: the guest mirror, the round
/// planner and the host's validator all call this, so they cannot disagree.
/// A whole-GPU request (`gpus_per_worker > 1` or `gpu_milli >= 1000`) takes
/// the GPU entirely; a fractional one takes `gpu_milli` and either the
/// explicit memory or the same fraction of the GPU's memory.
#[inline]
pub fn gpu_share(
    gpus_per_worker: u32,
    gpu_milli: u32,
    gpu_memory_mib: u32,
    gpu_total_mib: u32,
) -> (u32, u32) {
    if gpus_per_worker != 1 || gpu_milli >= FULL_GPU_MILLI || gpu_milli == 0 {
        return (FULL_GPU_MILLI, gpu_total_mib);
    }
    let memory = if gpu_memory_mib > 0 {
        gpu_memory_mib
    } else {
        milli_share_of(gpu_total_mib, gpu_milli)
    };
    (gpu_milli, memory)
}

/// `ceil(total × milli / 1000)` for `milli` < 1000. In 32 bits whenever the
/// product fits (every real GPU: up to 4 TiB): a 64-bit division by a
/// constant is a real `div` in Wasm, which has no 64-bit multiply-high to
/// turn it into a multiply as native code does, and the placement scans ask
/// this per GPU.
#[inline]
fn milli_share_of(total: u32, milli: u32) -> u32 {
    match total.checked_mul(milli) {
        Some(product) => product.div_ceil(FULL_GPU_MILLI),
        None => (u64::from(total) * u64::from(milli)).div_ceil(u64::from(FULL_GPU_MILLI)) as u32,
    }
}

/// What one *shared* worker (qos >= 1 while sharing is on) takes from one
/// of its GPUs: the compute of [`gpu_share`], and its explicit
/// `gpu_memory_mib` when set even for a whole GPU, since a shared worker
/// declares what it will use beside the GPU's owner (AntMan's 3.5 GB
/// opportunistic job on a 32 GB GPU), capped at the GPU's memory.
pub fn shared_gpu_share(
    gpus_per_worker: u32,
    gpu_milli: u32,
    gpu_memory_mib: u32,
    gpu_total_mib: u32,
) -> (u32, u32) {
    let (milli, memory) = gpu_share(gpus_per_worker, gpu_milli, gpu_memory_mib, gpu_total_mib);
    if gpu_memory_mib > 0 {
        (milli, gpu_memory_mib.min(gpu_total_mib))
    } else {
        (milli, memory)
    }
}

/// Whether `mask` (a job's `gpu-model-mask`) allows the model at `model_slot`
/// of the snapshot's `gpu-models` table.
pub fn model_allowed(mask: u64, model_slot: Option<usize>) -> bool {
    if mask == 0 {
        return true;
    }
    match model_slot {
        Some(slot) if slot < 64 => mask & (1u64 << slot) != 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The 32-bit path gives the 64-bit formula's answer for every GPU
        /// size, to the largest `u32`.
        #[test]
        fn a_shares_memory_is_the_64_bit_formulas(total in any::<u32>(), milli in 1u32..1000) {
            let wide = (u64::from(total) * u64::from(milli)).div_ceil(1000) as u32;
            prop_assert_eq!(milli_share_of(total, milli), wide);
        }
    }

    fn arb_job() -> impl Strategy<Value = (u32, Vec<WorkerPlacement>)> {
        // Few job ids, so the same job often comes twice in a row; now and
        // then a worker wider than a row can say.
        let gpus = prop_oneof![
            8 => prop::collection::vec(any::<u32>(), 0..4),
            1 => prop::collection::vec(any::<u32>(), 256..260),
        ];
        (
            0u32..3,
            prop::collection::vec(
                (any::<u32>(), gpus).prop_map(|(node, gpus)| WorkerPlacement { node, gpus }),
                0..3,
            ),
        )
    }

    proptest! {
        /// What `push_job` accepts, `job_runs` gives back, one run per
        /// accepted job and in order; what it refuses leaves the columns as
        /// they were.
        #[test]
        fn placement_columns_give_back_the_jobs_they_took(jobs in prop::collection::vec(arb_job(), 0..8)) {
            let mut columns = PlacementColumns::default();
            let mut taken = Vec::new();
            for (job, workers) in jobs {
                let before = columns.clone();
                if columns.push_job(job, &workers) {
                    taken.push((job, workers));
                } else {
                    prop_assert_eq!(&columns, &before);
                }
            }
            prop_assert_eq!(columns.job_runs(), Ok(taken));
        }
    }

    #[test]
    fn a_fractional_worker_without_stated_memory_gets_its_share_rounded_up() {
        assert_eq!(gpu_share(1, 500, 0, 32_768), (500, 16_384));
        assert_eq!(gpu_share(1, 333, 0, 16_000), (333, 5_328));
        assert_eq!(gpu_share(1, 999, 0, u32::MAX), (999, 4_290_672_328));
    }
}
