//! What the control plane persists: jobs, tenants, experiments and policy
//! slots, as serde records (JSON in the store), and the domain types of its
//! write API (the API layer maps its messages to these in `crate::convert`).

use arbiter_policy_sdk::model::job_kind;
use serde::{Deserialize, Serialize};

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// In its tenant's admission queue.
    Queued,
    /// Released to the scheduler.
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    /// Every state, in lifecycle order.
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Queued,
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled
        )
    }

    /// The state's one name, wherever it is shown (the API's, lower case).
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }
}

/// One worker of a running job: node name and the node-local GPU ordinals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerAt {
    pub node: String,
    pub gpus: Vec<u32>,
}

/// A job as the control plane keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredJob {
    pub id: u64,
    pub spec: JobSpecRecord,
    pub tenant: String,
    pub status: JobStatus,
    pub submit_ms: u64,
    pub start_ms: u64,
    pub end_ms: u64,
    pub placement: Vec<WorkerAt>,
    pub preemptions: u32,
    pub arm: String,
    /// The experiment the job was enrolled in: released to the scheduler
    /// while that split experiment ran, so its outcomes count in its arm's
    /// statistics (empty: none).
    #[serde(default)]
    pub experiment: String,
    /// When the job first started (0: never); `start_ms` is its latest start.
    #[serde(default)]
    pub first_start_ms: u64,
    pub message: String,
    /// Progress as of the last report or cell rebuild, restored into the
    /// rebuilt cells (experiment start or end, restart).
    #[serde(default)]
    pub progress: ProgressRecord,
    /// An inference job's last reported load, restored into rebuilt cells.
    #[serde(default)]
    pub service: Option<ServiceRecord>,
}

/// A job to accept: its spec, and the tenant the submitter named ("": the
/// caller's own, or `default` for the admin).
#[derive(Clone, Debug)]
pub struct NewJob {
    pub spec: JobSpecRecord,
    pub tenant: String,
}

impl NewJob {
    /// How errors name job `index` of `count` submitted together.
    pub fn which(index: usize, count: usize) -> String {
        if count == 1 {
            "job spec".to_string()
        } else {
            format!("job spec #{index}")
        }
    }
}

/// An experiment to start, as asked (checked against the plane's state
/// when it starts).
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentRequest {
    pub name: String,
    pub mode: Mode,
    pub candidate_slot: String,
    pub candidate_tenants: Vec<String>,
    /// The candidate arm's share of a randomised split (0: the default, ½).
    pub candidate_share: f64,
    pub guardrail: GuardrailRecord,
}

/// Where an upload went: its slot and its generation there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub slot: String,
    pub generation: u64,
}

/// What a reclaim did: the nodes it returned, the jobs it preempted or
/// scaled in, who answered (`active`, `fallback`, `native`) and their faults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reclaimed {
    pub returned: Vec<String>,
    pub preempted: Vec<u64>,
    pub scaled_in: Vec<u64>,
    pub served: String,
    /// The slot asked (of the cell whose answer `served` names).
    pub slot: String,
    pub faults: Vec<String>,
}

/// A job's state change, as watchers are told it.
#[derive(Clone, Debug)]
pub struct JobEvent {
    /// The job as it is after the change.
    pub job: StoredJob,
    /// Its state before (`None`: just submitted).
    pub previous: Option<JobStatus>,
}

/// An inference job's load as its reporter states it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServiceReport {
    pub requests_per_s: f32,
    pub p50_latency_ms: u32,
    pub p99_latency_ms: u32,
}

/// An inference job's load as its reporter last stated it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceRecord {
    pub requests_per_s: f32,
    pub p50_latency_ms: u32,
    pub p99_latency_ms: u32,
    pub reported_ms: u64,
}

/// What survives of a job's progress when its cell is rebuilt: its run time
/// so far and what it had left (0 = unknown), at how many workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressRecord {
    pub attained_ms: u64,
    pub remaining_ms: u64,
    pub remaining_workers: u32,
}

/// A validated job specification.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpecRecord {
    pub name: String,
    pub gpus: u32,
    pub gpus_per_worker: u32,
    pub gpu_milli: u32,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub priority: i32,
    pub qos: u8,
    pub duration_ms: u64,
    pub deadline_ms: u64,
    pub command: Vec<String>,
    pub gpu_models: Vec<String>,
    #[serde(default)]
    pub gpu_memory_mib: u32,
    /// Contract 0.3 job traits (absent from stores written before them).
    #[serde(default)]
    pub gpu_milli_limit: u32,
    #[serde(default)]
    pub locality: u8,
    #[serde(default)]
    pub slo_ms: u32,
    #[serde(default)]
    pub group: String,
    /// `model::job_kind` code (absent from stores written before it: training).
    #[serde(default)]
    pub kind: u8,
    /// Elastic bounds on the worker count, resolved (0 only in stores
    /// written before them: read as the submitted count).
    #[serde(default)]
    pub min_workers: u32,
    #[serde(default)]
    pub max_workers: u32,
}

/// Longest job name accepted.
pub const MAX_NAME: usize = 253;
/// Most GPUs one job may ask for.
pub const MAX_GPUS: u32 = 4096;
/// Largest command a job may carry: it is stored, journaled and listed with
/// the job, so one tenant must not be able to grow them without bound.
pub const MAX_COMMAND_ARGS: usize = 256;
pub const MAX_COMMAND_BYTES: usize = 8 * 1024;
/// Most GPU models one job may accept.
pub const MAX_GPU_MODELS: usize = 16;

impl JobSpecRecord {
    /// GPU demand in milli-GPU, as the validator charges it against a quota.
    pub fn demand_milli(&self) -> u64 {
        let per_worker = if self.gpus == 0 {
            0
        } else {
            self.gpus_per_worker
        };
        arbiter_policy_sdk::model::gpu_demand_milli(self.workers(), per_worker, self.gpu_milli)
    }

    /// Requested work in GPU-hours: the GPU demand over the stated run
    /// time (what a split experiment balances between its arms).
    pub fn gpu_hours(&self) -> f64 {
        self.demand_milli() as f64 / 1000.0 * self.duration_ms as f64 / 3.6e6
    }

    /// Checks a spec as submitted and resolves its defaults (the worker
    /// size, the elastic bounds, one GPU for a fractional job); the error
    /// says which field is wrong.
    pub fn validated(self) -> Result<JobSpecRecord, String> {
        let spec = self;
        if spec.name.is_empty() || spec.name.len() > MAX_NAME {
            return Err(format!("name must be 1..={MAX_NAME} bytes"));
        }
        if spec.name.chars().any(|c| c.is_control()) {
            return Err("name must not contain control characters".into());
        }
        if spec.gpus > MAX_GPUS {
            return Err(format!("gpus must be at most {MAX_GPUS}"));
        }
        if spec.gpu_milli > 1000 {
            return Err("gpu_milli must be 0..=1000".into());
        }
        if spec.gpu_milli > 0 && spec.gpus > 1 {
            return Err("a fractional job (gpu_milli > 0) uses exactly one GPU".into());
        }
        let gpus = if spec.gpu_milli > 0 { 1 } else { spec.gpus };
        let per_worker = match spec.gpus_per_worker {
            0 => gpus.max(1),
            n => n,
        };
        if gpus > 0 && gpus % per_worker != 0 {
            return Err(format!(
                "gpus ({gpus}) must be a multiple of gpus_per_worker ({per_worker})"
            ));
        }
        if spec.qos > 2 {
            return Err("qos must be 0 (guaranteed), 1 (opportunistic) or 2 (best effort)".into());
        }
        if spec.locality > 2 {
            return Err(
                "locality must be 0 (any), 1 (prefer one node) or 2 (require one node)".into(),
            );
        }
        if spec.gpu_milli_limit > 0
            && (spec.gpu_milli == 0
                || spec.gpu_milli_limit < spec.gpu_milli
                || spec.gpu_milli_limit > 1000)
        {
            return Err(
                "gpu_milli_limit must be within gpu_milli..=1000 of a fractional job".into(),
            );
        }
        if spec.group.len() > MAX_NAME || spec.group.chars().any(|c| c.is_control()) {
            return Err(format!(
                "group must be at most {MAX_NAME} bytes without control characters"
            ));
        }
        if spec.kind > job_kind::INTERACTIVE {
            return Err("kind must be 0 (training), 1 (inference) or 2 (interactive)".into());
        }
        let command_bytes: usize = spec.command.iter().map(String::len).sum();
        if spec.command.len() > MAX_COMMAND_ARGS || command_bytes > MAX_COMMAND_BYTES {
            return Err(format!(
                "command must be at most {MAX_COMMAND_ARGS} arguments and {MAX_COMMAND_BYTES} \
                 bytes (got {} and {command_bytes}); pass large inputs as files",
                spec.command.len()
            ));
        }
        if spec.command.iter().any(|a| a.contains('\0')) {
            return Err("command arguments may not contain NUL bytes".into());
        }
        if spec.gpu_models.len() > MAX_GPU_MODELS
            || spec
                .gpu_models
                .iter()
                .any(|m| m.is_empty() || m.len() > MAX_NAME)
        {
            return Err(format!(
                "gpu_models must name at most {MAX_GPU_MODELS} models of 1..={MAX_NAME} bytes"
            ));
        }
        let workers = if gpus == 0 { 1 } else { gpus / per_worker };
        let min_workers = match spec.min_workers {
            0 => workers,
            n => n,
        };
        let max_workers = match spec.max_workers {
            0 => workers,
            n => n,
        };
        if !(1..=workers).contains(&min_workers) || max_workers < workers {
            return Err(format!(
                "workers must satisfy 1 <= min_workers ({min_workers}) <= submitted \
                 ({workers}) <= max_workers ({max_workers})"
            ));
        }
        if max_workers.saturating_mul(per_worker.max(1)) > MAX_GPUS {
            return Err(format!(
                "max_workers × gpus_per_worker must be at most {MAX_GPUS} GPUs"
            ));
        }
        Ok(JobSpecRecord {
            gpus,
            gpus_per_worker: per_worker,
            min_workers,
            max_workers,
            ..spec
        })
    }

    /// Elastic bounds as the cluster state takes them (a record from before
    /// they existed: the submitted count).
    pub fn worker_bounds(&self) -> (u32, u32) {
        let w = self.workers();
        let or_submitted = |n: u32| if n == 0 { w } else { n };
        (
            or_submitted(self.min_workers),
            or_submitted(self.max_workers),
        )
    }

    pub fn workers(&self) -> u32 {
        if self.gpus == 0 {
            1
        } else {
            self.gpus / self.gpus_per_worker.max(1)
        }
    }
}

impl StoredJob {
    /// The name the job has inside a cell's cluster state (unique there).
    pub fn state_name(&self) -> String {
        format!("{}#{}", self.spec.name, self.id)
    }
}

/// A tenant and the hash of its token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    pub quota_gpus: u32,
    pub token_sha256: String,
}

/// Guardrail settings, with defaults filled in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuardrailRecord {
    pub metric: String,
    pub alpha: f64,
    pub min_samples: u32,
    pub max_faults: u32,
    /// The regression the sequential test is tuned to, as a fraction of the
    /// control's mean (records older than the field: the default).
    #[serde(default = "default_min_effect")]
    pub min_effect: f64,
}

fn default_min_effect() -> f64 {
    0.1
}

pub const GUARDRAIL_METRICS: [&str; 4] = ["queue_delay", "jct", "slo_violations", "faults"];

impl GuardrailRecord {
    /// The guardrail asked for (`None` or zero fields: the defaults), checked.
    pub fn resolved(g: Option<&GuardrailRecord>) -> Result<GuardrailRecord, String> {
        let metric = match g.map(|g| g.metric.as_str()) {
            None | Some("") => "queue_delay".to_string(),
            Some(m) if GUARDRAIL_METRICS.contains(&m) => m.to_string(),
            Some(m) => {
                return Err(format!(
                    "unknown guardrail metric `{m}` (one of {GUARDRAIL_METRICS:?})"
                ));
            }
        };
        // 0 is the wire's "unset"; any other value is the caller's and is checked.
        let alpha = match g.map(|g| g.alpha) {
            Some(a) if a != 0.0 => a,
            _ => 0.05,
        };
        if !(alpha > 0.0 && alpha < 0.5) {
            return Err("guardrail alpha must be in (0, 0.5)".into());
        }
        let min_effect = match g.map(|g| g.min_effect) {
            Some(e) if e != 0.0 => e,
            _ => default_min_effect(),
        };
        if !(min_effect > 0.0 && min_effect <= 10.0) {
            return Err("guardrail min_effect must be in (0, 10]".into());
        }
        Ok(GuardrailRecord {
            metric,
            alpha,
            min_samples: g.map(|g| g.min_samples).filter(|&n| n > 0).unwrap_or(30),
            max_faults: g.map(|g| g.max_faults).filter(|&n| n > 0).unwrap_or(3),
            min_effect,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Split,
    Shadow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExperimentState {
    Running,
    Promoted,
    Aborted,
    RolledBack,
}

/// An experiment's definition and outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExperimentRecord {
    pub name: String,
    pub mode: Mode,
    pub state: ExperimentState,
    pub candidate_slot: String,
    pub candidate_tenants: Vec<String>,
    pub candidate_share: f64,
    pub guardrail: GuardrailRecord,
    pub reason: String,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// Seed of the randomised assignment (0 in records older than it).
    #[serde(default)]
    pub seed: u64,
    /// The first job id submitted while the experiment runs: jobs from
    /// this one on are enrolled in it (0 in records older than it).
    #[serde(default)]
    pub first_job: u64,
}

/// A generation of a slot as persisted: the component by digest, its config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationRecord {
    /// The generation's id, kept across restarts (0 in stores written
    /// before ids were kept: such generations get new ones).
    #[serde(default)]
    pub id: u64,
    pub digest: String,
    pub config: String,
}

/// A policy slot as persisted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    pub generations: Vec<GenerationRecord>,
    /// Index into `generations` of the active one.
    pub active: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: u32, per: u32, milli: u32) -> JobSpecRecord {
        JobSpecRecord {
            name: "a".into(),
            gpus,
            gpus_per_worker: per,
            gpu_milli: milli,
            ..Default::default()
        }
    }

    #[test]
    fn spec_validation_names_the_field() {
        assert!(spec(4, 0, 0).validated().is_ok());
        assert_eq!(spec(8, 2, 0).validated().map(|s| s.workers()), Ok(4));
        assert!(spec(3, 2, 0).validated().unwrap_err().contains("multiple"));
        assert!(
            spec(1, 0, 1500)
                .validated()
                .unwrap_err()
                .contains("gpu_milli")
        );
        let mut s = spec(1, 0, 0);
        s.name.clear();
        assert!(s.validated().unwrap_err().contains("name"));
        assert!(
            GuardrailRecord::resolved(Some(&GuardrailRecord {
                metric: "nope".into(),
                alpha: 0.0,
                min_samples: 0,
                max_faults: 0,
                min_effect: 0.0,
            }))
            .is_err()
        );
        // Zero fields are the defaults; any other value is checked (a negative alpha once
        // became the default 0.05 without a word).
        let asked = |alpha: f64, min_effect: f64| {
            GuardrailRecord::resolved(Some(&GuardrailRecord {
                metric: String::new(),
                alpha,
                min_samples: 0,
                max_faults: 0,
                min_effect,
            }))
        };
        let defaults = asked(0.0, 0.0).expect("defaults");
        assert_eq!(
            (defaults.alpha, defaults.min_effect, defaults.min_samples),
            (0.05, 0.1, 30)
        );
        for (alpha, min_effect) in [(-0.1, 0.0), (0.5, 0.0), (f64::NAN, 0.0), (0.0, -1.0)] {
            assert!(asked(alpha, min_effect).is_err(), "{alpha} {min_effect}");
        }
    }
}
