//! What the plane reports, as plain data: jobs, the cluster view, the nodes,
//! the policy slots, the tenants and the experiments the plane publishes on the
//! [`crate::board::Board`].
//!
//! No protobuf here: the API layer renders these as its messages
//! (`crate::convert`), so the plane's reports change with the plane and the
//! wire format with the API. An ended experiment's report is also what the
//! store keeps of its final metrics (JSON), hence the serde derives there.

use crate::link::{HostLoad, JobSample};
use crate::plane::{NodeKind, NodeStatus};
use crate::records::{ExperimentState, Mode, StoredJob};
use crate::shadow::ShadowSummary;
use crate::stats::Estimate;
use arbiter_policy_sdk::model::JobProgress;
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::Arc;

/// Reads a stored report's float back, `null` as NaN. JSON has no NaN or
/// infinity (serde_json writes them as `null`), and a report can hold one —
/// the interval of a comparison whose batch means are all equal is NaN — so
/// without this such a report would be unreadable after a restart.
pub(crate) fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// A job as reads show it: its record, why it waits, its progress and what
/// its nodes report.
#[derive(Clone, Debug)]
pub struct JobView {
    pub record: Arc<StoredJob>,
    /// Why a queued or pending job has not started ("" for any other).
    pub waiting_reason: String,
    /// Its progress in its cell (an unfinished job in a cell).
    pub progress: Option<JobProgress>,
    /// Its nodes' latest samples, combined (an unfinished job on agents).
    pub sample: Option<JobSample>,
}

/// The cluster at a glance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// The first cell's epoch.
    pub epoch: u64,
    pub now_ms: u64,
    pub nodes: u32,
    pub gpus: u32,
    pub gpu_allocation_pct: f64,
    pub jobs_queued: u64,
    pub jobs_pending: u64,
    pub jobs_running: u64,
    /// Succeeded, failed or cancelled (and not yet dropped by retention).
    pub jobs_finished: u64,
    /// The `default` slot's active policy and generation.
    pub active_policy: String,
    pub active_generation: u64,
    /// The running experiment ("" when none).
    pub experiment: String,
    pub rounds: u64,
    pub quarantined: Vec<QuarantinedGeneration>,
}

/// A generation its faults took out of service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuarantinedGeneration {
    pub slot: String,
    pub generation: u64,
    pub name: String,
    pub faults: u64,
    pub last_fault: String,
    /// Still its slot's active generation (its rounds go to the fallback).
    pub active: bool,
}

/// One node of the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub pool: String,
    pub gpu_model: String,
    pub gpus: u32,
    /// GPUs nothing is placed on (0 for a node in no cell).
    pub gpus_free: u32,
    pub status: NodeStatus,
    /// The experiment arm whose cell holds the node ("" outside experiments).
    pub arm: String,
    pub kind: NodeKind,
    pub on_loan: bool,
    /// Per GPU, the health the node last reported (contract `gpu-health` codes).
    pub gpu_health: Vec<u32>,
    /// The node's host load, once reported.
    pub host: Option<HostLoad>,
}

/// A policy slot: its generations and how it has served.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlotView {
    pub slot: String,
    pub generations: Vec<GenerationView>,
    /// The cells this slot schedules (0: it answers another role for them).
    pub cells: u32,
    /// Rounds of the cells this slot schedules, and those the fallback served.
    pub rounds: u64,
    pub fallbacks: u64,
    /// Time inside the slot's policies per round, all generations (0: no rounds yet).
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

/// One loaded generation of a slot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationView {
    /// Stable: never reused or renumbered, across restarts too.
    pub id: u64,
    pub name: String,
    pub version: String,
    pub digest: String,
    pub roles: Vec<String>,
    pub active: bool,
    pub quarantined: bool,
    pub rounds_served: u64,
    pub faults: u64,
    pub last_fault: String,
    /// The configuration it runs with (its manifest's default when none was given).
    pub config: String,
}

/// A tenant as the tenant list shows it (its token is never shown again).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantView {
    pub name: String,
    pub quota_gpus: u32,
    /// Whole GPUs its pending and running jobs asked for.
    pub gpus_in_use: u32,
    /// Its admission policy's slot ("" when it has none active).
    pub policy_slot: String,
}

/// An experiment: its definition, outcome and, per arm, its metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExperimentView {
    pub name: String,
    pub mode: Mode,
    pub state: ExperimentState,
    pub candidate_slot: String,
    pub arms: Vec<ArmView>,
    pub shadow: Option<ShadowSummary>,
    pub reason: String,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// The guardrail metric's candidate − control difference.
    pub comparison: Option<ComparisonView>,
    /// How jobs were split between the arms (split mode).
    pub balance: Option<BalanceView>,
}

/// One arm's metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ArmView {
    pub arm: String,
    pub slot: String,
    pub generation: u64,
    pub nodes: u32,
    pub gpus: u32,
    pub jobs_submitted: u64,
    pub jobs_started: u64,
    pub jobs_finished: u64,
    pub queue_delay_ms: Estimate,
    pub jct_ms: Estimate,
    pub gpu_allocation_pct: Estimate,
    pub fragmentation_pct: Estimate,
    pub preemptions: u64,
    pub slo_violations: u64,
    pub policy_faults: u64,
    pub policy_latency_ms: Estimate,
}

/// The guardrail metric compared between the arms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ComparisonView {
    pub metric: String,
    #[serde(deserialize_with = "nan_if_null")]
    pub difference: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_high: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub always_valid_p: f64,
}

/// The split's balance and its sample-ratio check.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BalanceView {
    pub control_jobs: u64,
    pub candidate_jobs: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub control_gpu_hours: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub candidate_gpu_hours: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub target_share: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub sample_ratio_p: f64,
    pub mismatch: bool,
}
