//! The node link in the plane's terms: what an agent tells the plane (its
//! hello, periodic reports, workload events, answers to updates) and what
//! the plane tells an agent ([`ToAgent`]).
//!
//! The API layer maps these to and from the `NodeLink` stream's protobuf
//! (`crate::convert`); the plane never sees a wire message.

use crate::launch::{Launch, Update};
use std::time::Duration;

/// An agent's first message: the node it runs on and what it still runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentHello {
    pub name: String,
    /// "" puts the node in the `agents` pool.
    pub pool: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpus: Vec<AgentGpu>,
    /// Identifies the agent across its restarts ("" from older agents).
    pub instance: String,
    /// Workloads the node still runs or saw end (after an agent restart).
    pub workloads: Vec<SurvivingWorkload>,
}

/// One GPU an agent found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentGpu {
    pub model: String,
    pub memory_mib: u32,
}

/// A workload an agent found at its start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SurvivingWorkload {
    pub job_id: u64,
    pub pid: u32,
    pub running: bool,
    /// How it ended, when not running.
    pub exit_code: i32,
}

/// An agent's periodic report (its heartbeat).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentReport {
    pub gpus: Vec<GpuReading>,
    /// Absent from agents before contract 0.3.
    pub host: Option<HostLoad>,
    pub jobs: Vec<JobSample>,
}

/// One GPU's reading, by its node-local index.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuReading {
    pub index: u32,
    pub utilization_pct: u32,
    pub sm_activity_pct: u32,
    pub memory_used_mib: u32,
    /// Contract `gpu-health` code.
    pub health: u32,
}

/// A node's host-side load (contract 0.3 `node-metric`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostLoad {
    pub cpu_utilization_pct: u32,
    pub memory_used_mib: u32,
    pub swap_in_per_s: u32,
}

/// A running job as its node saw it over one report interval (contract 0.3
/// `job-metric`); combined over a job's nodes, what `jobs` shows of it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobSample {
    pub job_id: u64,
    /// Mean iteration time the workload reported (0: it reports none).
    pub iteration_ms: u32,
    pub peak_memory_mib: u32,
    pub min_memory_mib: u32,
    pub utilization_pct: u32,
    /// GPU memory served from host memory, highest of the interval.
    pub host_memory_mib: u32,
    /// What the node enforces now: GPU memory limit (MiB) and compute share (permille); 0 = not reported.
    pub memory_limit_mib: u32,
    pub compute_share_permille: u32,
}

/// A workload started, ended or was evicted on its node.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadEvent {
    pub job_id: u64,
    /// The launch this event is about (0 from an older agent).
    pub launch_seq: u64,
    pub kind: WorkloadEventKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadEventKind {
    Started,
    Exited {
        exit_code: i32,
    },
    FailedToStart {
        message: String,
    },
    /// The node's coordinator evicted it (e.g. over its limit).
    Evicted {
        message: String,
    },
}

/// An agent's answer to an [`Update`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpdateAck {
    pub job_id: u64,
    pub seq: u64,
    pub ok: bool,
    /// What was refused, if anything.
    pub message: String,
}

/// What the plane tells an agent.
#[derive(Clone, Debug, PartialEq)]
pub enum ToAgent {
    /// First, on every session: how often to report and when it counts as lost.
    Welcome {
        heartbeat: Duration,
        lost_after: Duration,
    },
    Launch(Launch),
    Update(Update),
    Stop {
        job_id: u64,
        reason: String,
    },
}
