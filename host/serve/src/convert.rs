//! The API layer's one translation between `arbiter.v1` messages and the
//! plane's domain types: requests in (job specs, experiment requests, the
//! node link's hello, reports, events and acks), reports and decisions out
//! (jobs, views, slots, tenants, experiments; welcomes, launches, updates and
//! stops).
//!
//! Nothing here decides anything: checks of what a request asks for are the
//! domain's ([`JobSpecRecord::validated`], [`GuardrailRecord::resolved`]);
//! what is left here is only what the wire format itself cannot say (an
//! enum value out of range, a message without its required part). Integer
//! fields the domain keeps narrower than the wire are saturated, never
//! wrapped, so an out-of-range value stays out of range and is refused by
//! the domain's check with its field's name.

use crate::board::JobQuery;
use crate::launch::{Launch, Update};
use crate::link::{
    AgentGpu, AgentHello, AgentReport, GpuReading, HostLoad, JobSample, SurvivingWorkload, ToAgent,
    UpdateAck, WorkloadEvent, WorkloadEventKind,
};
use crate::records::{
    ExperimentRequest, ExperimentState, GuardrailRecord, JobSpecRecord, JobStatus, Mode,
    ServiceRecord, StoredJob,
};
use crate::shadow::{PlacementDiff, ShadowSummary};
use crate::stats::Estimate;
use crate::views::{
    ArmView, BalanceView, ClusterView, ComparisonView, ExperimentView, GenerationView, JobView,
    NodeView, QuarantinedGeneration, SlotView, TenantView,
};
use arbiter_policy_sdk::model::JobProgress;
use arbiter_proto::v1;

/// A `u32` wire value into a domain `u8`, saturated (256 stays invalid).
fn narrow(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

// ---- Jobs ----------------------------------------------------------------

pub fn job_state(s: JobStatus) -> v1::JobState {
    match s {
        JobStatus::Queued => v1::JobState::Queued,
        JobStatus::Pending => v1::JobState::Pending,
        JobStatus::Running => v1::JobState::Running,
        JobStatus::Succeeded => v1::JobState::Succeeded,
        JobStatus::Failed => v1::JobState::Failed,
        JobStatus::Cancelled => v1::JobState::Cancelled,
    }
}

/// `None` for `UNSPECIFIED`.
pub fn job_status(s: v1::JobState) -> Option<JobStatus> {
    Some(match s {
        v1::JobState::Unspecified => return None,
        v1::JobState::Queued => JobStatus::Queued,
        v1::JobState::Pending => JobStatus::Pending,
        v1::JobState::Running => JobStatus::Running,
        v1::JobState::Succeeded => JobStatus::Succeeded,
        v1::JobState::Failed => JobStatus::Failed,
        v1::JobState::Cancelled => JobStatus::Cancelled,
    })
}

/// A submitted spec as the domain's unchecked record (see
/// [`JobSpecRecord::validated`]); the tenant it names travels apart.
pub fn submitted_spec(spec: &v1::JobSpec) -> JobSpecRecord {
    JobSpecRecord {
        name: spec.name.clone(),
        gpus: spec.gpus,
        gpus_per_worker: spec.gpus_per_worker,
        gpu_milli: spec.gpu_milli,
        cpu_milli: spec.cpu_milli,
        memory_mib: spec.memory_mib,
        priority: spec.priority,
        qos: narrow(spec.qos),
        duration_ms: spec.duration_ms,
        deadline_ms: spec.deadline_ms,
        command: spec.command.clone(),
        gpu_models: spec.gpu_models.clone(),
        gpu_memory_mib: spec.gpu_memory_mib,
        gpu_milli_limit: spec.gpu_milli_limit,
        locality: narrow(spec.locality),
        slo_ms: spec.slo_ms,
        group: spec.group.clone(),
        kind: narrow(spec.kind),
        min_workers: spec.min_workers,
        max_workers: spec.max_workers,
    }
}

/// Which jobs a `List` call asks for.
pub fn job_query(req: &v1::ListJobsRequest) -> JobQuery {
    JobQuery {
        tenant: req.tenant.clone(),
        states: req.states().filter_map(job_status).collect(),
        page_token: req.page_token.clone(),
        limit: req.limit,
    }
}

/// A job's record alone (what a write returns and watchers are told).
pub fn job(job: &StoredJob) -> v1::Job {
    let s = &job.spec;
    let (min_workers, max_workers) = s.worker_bounds();
    v1::Job {
        id: job.id,
        spec: Some(v1::JobSpec {
            name: s.name.clone(),
            tenant: job.tenant.clone(),
            gpus: s.gpus,
            gpus_per_worker: s.gpus_per_worker,
            gpu_milli: s.gpu_milli,
            cpu_milli: s.cpu_milli,
            memory_mib: s.memory_mib,
            priority: s.priority,
            qos: u32::from(s.qos),
            duration_ms: s.duration_ms,
            deadline_ms: s.deadline_ms,
            command: s.command.clone(),
            gpu_models: s.gpu_models.clone(),
            gpu_memory_mib: s.gpu_memory_mib,
            gpu_milli_limit: s.gpu_milli_limit,
            locality: u32::from(s.locality),
            slo_ms: s.slo_ms,
            group: s.group.clone(),
            kind: u32::from(s.kind),
            min_workers,
            max_workers,
        }),
        state: job_state(job.status) as i32,
        submit_ms: job.submit_ms,
        start_ms: job.start_ms,
        end_ms: job.end_ms,
        node: job
            .placement
            .iter()
            .map(|w| w.node.as_str())
            .collect::<Vec<_>>()
            .join(","),
        gpu_indices: job.placement.iter().flat_map(|w| w.gpus.clone()).collect(),
        preemptions: job.preemptions,
        arm: job.arm.clone(),
        message: job.message.clone(),
        progress: None,
        service: job.service.map(service_load),
        workers: job.placement.len() as u32,
        waiting_reason: String::new(),
        metrics: None,
    }
}

/// A job as reads show it: its record, why it waits, progress and samples.
pub fn job_view(view: &JobView) -> v1::Job {
    v1::Job {
        waiting_reason: view.waiting_reason.clone(),
        progress: view.progress.as_ref().map(job_progress),
        metrics: view.sample.as_ref().map(job_sample),
        ..job(&view.record)
    }
}

pub fn job_progress(p: &JobProgress) -> v1::JobProgress {
    v1::JobProgress {
        started_ms: p.started_ms,
        attained_ms: p.attained_ms,
        remaining_ms: p.remaining_ms,
        remaining_workers: p.remaining_workers,
        reported_ms: p.reported_ms,
    }
}

pub fn service_load(s: ServiceRecord) -> v1::ServiceLoad {
    v1::ServiceLoad {
        requests_per_s: s.requests_per_s,
        p50_latency_ms: s.p50_latency_ms,
        p99_latency_ms: s.p99_latency_ms,
        reported_ms: s.reported_ms,
    }
}

// ---- The cluster, nodes, slots, tenants ----------------------------------

pub fn cluster_view(v: &ClusterView) -> v1::ClusterView {
    v1::ClusterView {
        epoch: v.epoch,
        now_ms: v.now_ms,
        nodes: v.nodes,
        gpus: v.gpus,
        gpu_allocation_pct: v.gpu_allocation_pct,
        jobs_queued: v.jobs_queued,
        jobs_pending: v.jobs_pending,
        jobs_running: v.jobs_running,
        jobs_finished: v.jobs_finished,
        active_policy: v.active_policy.clone(),
        active_generation: v.active_generation,
        experiment: v.experiment.clone(),
        rounds: v.rounds,
        quarantined: v.quarantined.iter().map(quarantined).collect(),
    }
}

fn quarantined(q: &QuarantinedGeneration) -> v1::QuarantinedGeneration {
    v1::QuarantinedGeneration {
        slot: q.slot.clone(),
        generation: q.generation,
        name: q.name.clone(),
        faults: q.faults,
        last_fault: q.last_fault.clone(),
        active: q.active,
    }
}

pub fn node(n: &NodeView) -> v1::NodeInfo {
    v1::NodeInfo {
        name: n.name.clone(),
        pool: n.pool.clone(),
        gpu_model: n.gpu_model.clone(),
        gpus: n.gpus,
        gpus_free: n.gpus_free,
        state: n.status.name().into(),
        arm: n.arm.clone(),
        kind: n.kind.name().into(),
        on_loan: n.on_loan,
        gpu_health: n.gpu_health.clone(),
        host: n.host.map(|h| v1::HostLoad {
            cpu_utilization_pct: h.cpu_utilization_pct,
            memory_used_mib: h.memory_used_mib,
            // Not part of the cluster view's node metric.
            memory_total_mib: 0,
            swap_in_per_s: h.swap_in_per_s,
        }),
    }
}

pub fn generation(g: &GenerationView) -> v1::GenerationInfo {
    v1::GenerationInfo {
        id: g.id,
        name: g.name.clone(),
        version: g.version.clone(),
        digest: g.digest.clone(),
        roles: g.roles.clone(),
        active: g.active,
        quarantined: g.quarantined,
        rounds_served: g.rounds_served,
        faults: g.faults,
        last_fault: g.last_fault.clone(),
        config: g.config.clone(),
    }
}

pub fn slot_info(s: &SlotView) -> v1::SlotInfo {
    v1::SlotInfo {
        slot: s.slot.clone(),
        generations: s.generations.iter().map(generation).collect(),
    }
}

pub fn policy_stats(s: &SlotView) -> v1::PolicyStats {
    v1::PolicyStats {
        slot: s.slot.clone(),
        generations: s.generations.iter().map(generation).collect(),
        cells: s.cells,
        rounds: s.rounds,
        fallbacks: s.fallbacks,
        latency_p50_ms: s.latency_p50_ms,
        latency_p99_ms: s.latency_p99_ms,
    }
}

/// A tenant; `token` only in the answer that created it (else "").
pub fn tenant(t: &TenantView, token: String) -> v1::TenantInfo {
    v1::TenantInfo {
        name: t.name.clone(),
        quota_gpus: t.quota_gpus,
        gpus_in_use: t.gpus_in_use,
        token,
        policy_slot: t.policy_slot.clone(),
    }
}

// ---- Experiments ---------------------------------------------------------

pub fn experiment_request(req: &v1::StartExperimentRequest) -> Result<ExperimentRequest, String> {
    let mode = match v1::ExperimentMode::try_from(req.mode) {
        Ok(v1::ExperimentMode::Split) => Mode::Split,
        Ok(v1::ExperimentMode::Shadow) => Mode::Shadow,
        _ => return Err("mode must be SPLIT or SHADOW".into()),
    };
    let asked = req.guardrail.as_ref().map(|g| GuardrailRecord {
        metric: g.metric.clone(),
        alpha: g.alpha,
        min_samples: g.min_samples,
        max_faults: g.max_faults,
        min_effect: g.min_effect,
    });
    Ok(ExperimentRequest {
        name: req.name.clone(),
        mode,
        candidate_slot: req.candidate_slot.clone(),
        candidate_tenants: req.candidate_tenants.clone(),
        candidate_share: req.candidate_share,
        guardrail: GuardrailRecord::resolved(asked.as_ref())?,
    })
}

fn mode(m: Mode) -> v1::ExperimentMode {
    match m {
        Mode::Split => v1::ExperimentMode::Split,
        Mode::Shadow => v1::ExperimentMode::Shadow,
    }
}

fn experiment_state(s: ExperimentState) -> v1::ExperimentState {
    match s {
        ExperimentState::Running => v1::ExperimentState::Running,
        ExperimentState::Promoted => v1::ExperimentState::Promoted,
        ExperimentState::Aborted => v1::ExperimentState::Aborted,
        ExperimentState::RolledBack => v1::ExperimentState::RolledBack,
    }
}

pub fn experiment(e: &ExperimentView) -> v1::ExperimentStatus {
    v1::ExperimentStatus {
        name: e.name.clone(),
        mode: mode(e.mode) as i32,
        state: experiment_state(e.state) as i32,
        candidate_slot: e.candidate_slot.clone(),
        arms: e.arms.iter().map(arm).collect(),
        shadow: e.shadow.as_ref().map(shadow),
        reason: e.reason.clone(),
        started_ms: e.started_ms,
        ended_ms: e.ended_ms,
        comparison: e.comparison.as_ref().map(|c| v1::Comparison {
            metric: c.metric.clone(),
            difference: c.difference,
            ci_low: c.ci_low,
            ci_high: c.ci_high,
            always_valid_p: c.always_valid_p,
        }),
        balance: e.balance.as_ref().map(|b| v1::Balance {
            control_jobs: b.control_jobs,
            candidate_jobs: b.candidate_jobs,
            control_gpu_hours: b.control_gpu_hours,
            candidate_gpu_hours: b.candidate_gpu_hours,
            target_share: b.target_share,
            sample_ratio_p: b.sample_ratio_p,
            mismatch: b.mismatch,
        }),
    }
}

fn estimate(e: &Estimate) -> v1::Estimate {
    v1::Estimate {
        mean: e.mean,
        ci_low: e.ci_low,
        ci_high: e.ci_high,
        samples: e.samples,
        batches: e.batches,
    }
}

fn arm(a: &ArmView) -> v1::ArmMetrics {
    v1::ArmMetrics {
        arm: a.arm.clone(),
        slot: a.slot.clone(),
        generation: a.generation,
        nodes: a.nodes,
        gpus: a.gpus,
        jobs_submitted: a.jobs_submitted,
        jobs_started: a.jobs_started,
        jobs_finished: a.jobs_finished,
        queue_delay_ms: Some(estimate(&a.queue_delay_ms)),
        jct_ms: Some(estimate(&a.jct_ms)),
        gpu_allocation_pct: Some(estimate(&a.gpu_allocation_pct)),
        fragmentation_pct: Some(estimate(&a.fragmentation_pct)),
        preemptions: a.preemptions,
        slo_violations: a.slo_violations,
        policy_faults: a.policy_faults,
        policy_latency_ms: Some(estimate(&a.policy_latency_ms)),
    }
}

fn shadow(s: &ShadowSummary) -> v1::ShadowSummary {
    v1::ShadowSummary {
        rounds: s.rounds,
        rounds_identical: s.rounds_identical,
        placements_differing: s.placements_differing,
        candidate_only: s.candidate_only,
        incumbent_only: s.incumbent_only,
        incumbent_fragmentation_pct: s.incumbent_fragmentation_pct,
        candidate_fragmentation_pct: s.candidate_fragmentation_pct,
        candidate_faults: s.candidate_faults,
        recent: s
            .recent
            .iter()
            .map(|d| v1::PlacementDiff {
                epoch: d.epoch,
                job: d.job,
                job_name: d.job_name.clone(),
                incumbent: d.incumbent.clone(),
                candidate: d.candidate.clone(),
            })
            .collect(),
        candidate_invalid: s.candidate_invalid,
        jobs_differing: s.jobs_differing,
    }
}

/// An ended experiment's final status as stores before the JSON reports
/// kept it (protobuf): read once at start-up, then rewritten as JSON. The
/// one place below the API where the wire format is decoded.
pub fn legacy_experiment_report(bytes: &[u8]) -> Result<ExperimentView, String> {
    let s = <v1::ExperimentStatus as prost::Message>::decode(bytes).map_err(|e| e.to_string())?;
    let mode = match v1::ExperimentMode::try_from(s.mode) {
        Ok(v1::ExperimentMode::Shadow) => Mode::Shadow,
        _ => Mode::Split,
    };
    let state = match v1::ExperimentState::try_from(s.state) {
        Ok(v1::ExperimentState::Promoted) => ExperimentState::Promoted,
        Ok(v1::ExperimentState::Aborted) => ExperimentState::Aborted,
        Ok(v1::ExperimentState::RolledBack) => ExperimentState::RolledBack,
        Ok(v1::ExperimentState::Running) => ExperimentState::Running,
        _ => return Err(format!("unknown experiment state {}", s.state)),
    };
    let est = |e: &Option<v1::Estimate>| {
        e.as_ref().map_or(Estimate::default(), |e| Estimate {
            mean: e.mean,
            ci_low: e.ci_low,
            ci_high: e.ci_high,
            samples: e.samples,
            batches: e.batches,
        })
    };
    Ok(ExperimentView {
        name: s.name,
        mode,
        state,
        candidate_slot: s.candidate_slot,
        arms: s
            .arms
            .iter()
            .map(|a| ArmView {
                arm: a.arm.clone(),
                slot: a.slot.clone(),
                generation: a.generation,
                nodes: a.nodes,
                gpus: a.gpus,
                jobs_submitted: a.jobs_submitted,
                jobs_started: a.jobs_started,
                jobs_finished: a.jobs_finished,
                queue_delay_ms: est(&a.queue_delay_ms),
                jct_ms: est(&a.jct_ms),
                gpu_allocation_pct: est(&a.gpu_allocation_pct),
                fragmentation_pct: est(&a.fragmentation_pct),
                preemptions: a.preemptions,
                slo_violations: a.slo_violations,
                policy_faults: a.policy_faults,
                policy_latency_ms: est(&a.policy_latency_ms),
            })
            .collect(),
        shadow: s.shadow.map(|s| ShadowSummary {
            rounds: s.rounds,
            rounds_identical: s.rounds_identical,
            placements_differing: s.placements_differing,
            candidate_only: s.candidate_only,
            incumbent_only: s.incumbent_only,
            incumbent_fragmentation_pct: s.incumbent_fragmentation_pct,
            candidate_fragmentation_pct: s.candidate_fragmentation_pct,
            candidate_faults: s.candidate_faults,
            recent: s
                .recent
                .into_iter()
                .map(|d| PlacementDiff {
                    epoch: d.epoch,
                    job: d.job,
                    job_name: d.job_name,
                    incumbent: d.incumbent,
                    candidate: d.candidate,
                })
                .collect(),
            candidate_invalid: s.candidate_invalid,
            jobs_differing: s.jobs_differing,
        }),
        reason: s.reason,
        started_ms: s.started_ms,
        ended_ms: s.ended_ms,
        comparison: s.comparison.map(|c| ComparisonView {
            metric: c.metric,
            difference: c.difference,
            ci_low: c.ci_low,
            ci_high: c.ci_high,
            always_valid_p: c.always_valid_p,
        }),
        balance: s.balance.map(|b| BalanceView {
            control_jobs: b.control_jobs,
            candidate_jobs: b.candidate_jobs,
            control_gpu_hours: b.control_gpu_hours,
            candidate_gpu_hours: b.candidate_gpu_hours,
            target_share: b.target_share,
            sample_ratio_p: b.sample_ratio_p,
            mismatch: b.mismatch,
        }),
    })
}

// ---- The node link -------------------------------------------------------

pub fn agent_hello(h: &v1::NodeHello) -> AgentHello {
    AgentHello {
        name: h.name.clone(),
        pool: h.pool.clone(),
        cpu_milli: h.cpu_milli,
        memory_mib: h.memory_mib,
        gpus: h
            .gpus
            .iter()
            .map(|g| AgentGpu {
                model: g.model.clone(),
                memory_mib: g.memory_mib,
            })
            .collect(),
        instance: h.instance.clone(),
        workloads: h
            .workloads
            .iter()
            .map(|w| SurvivingWorkload {
                job_id: w.job_id,
                pid: w.pid,
                running: w.running,
                exit_code: w.exit_code,
            })
            .collect(),
    }
}

pub fn agent_report(hb: &v1::Heartbeat) -> AgentReport {
    AgentReport {
        gpus: hb
            .gpus
            .iter()
            .map(|g| GpuReading {
                index: g.index,
                utilization_pct: g.utilization_pct,
                sm_activity_pct: g.sm_activity_pct,
                memory_used_mib: g.memory_used_mib,
                health: g.health,
            })
            .collect(),
        host: hb.host.as_ref().map(|h| HostLoad {
            cpu_utilization_pct: h.cpu_utilization_pct,
            memory_used_mib: h.memory_used_mib,
            swap_in_per_s: h.swap_in_per_s,
        }),
        jobs: hb
            .jobs
            .iter()
            .map(|s| JobSample {
                job_id: s.job_id,
                iteration_ms: s.iteration_ms,
                peak_memory_mib: s.peak_memory_mib,
                min_memory_mib: s.min_memory_mib,
                utilization_pct: s.utilization_pct,
                host_memory_mib: s.host_memory_mib,
                memory_limit_mib: s.memory_limit_mib,
                compute_share_permille: s.compute_share_permille,
            })
            .collect(),
    }
}

pub fn job_sample(s: &JobSample) -> v1::JobSample {
    v1::JobSample {
        job_id: s.job_id,
        iteration_ms: s.iteration_ms,
        peak_memory_mib: s.peak_memory_mib,
        min_memory_mib: s.min_memory_mib,
        utilization_pct: s.utilization_pct,
        host_memory_mib: s.host_memory_mib,
        memory_limit_mib: s.memory_limit_mib,
        compute_share_permille: s.compute_share_permille,
    }
}

/// `Err` names the kind an older or newer agent sent that this host does not know.
pub fn workload_event(ev: &v1::WorkloadEvent) -> Result<WorkloadEvent, i32> {
    let kind = match v1::WorkloadEventKind::try_from(ev.kind) {
        Ok(v1::WorkloadEventKind::Started) => WorkloadEventKind::Started,
        Ok(v1::WorkloadEventKind::Exited) => WorkloadEventKind::Exited {
            exit_code: ev.exit_code,
        },
        Ok(v1::WorkloadEventKind::FailedToStart) => WorkloadEventKind::FailedToStart {
            message: ev.message.clone(),
        },
        Ok(v1::WorkloadEventKind::Evicted) => WorkloadEventKind::Evicted {
            message: ev.message.clone(),
        },
        Ok(v1::WorkloadEventKind::Unspecified) | Err(_) => return Err(ev.kind),
    };
    Ok(WorkloadEvent {
        job_id: ev.job_id,
        launch_seq: ev.launch_seq,
        kind,
    })
}

pub fn update_ack(a: &v1::UpdateAck) -> UpdateAck {
    UpdateAck {
        job_id: a.job_id,
        seq: a.seq,
        ok: a.ok,
        message: a.message.clone(),
    }
}

pub fn to_agent(message: ToAgent) -> v1::HostMessage {
    let body = match message {
        ToAgent::Welcome {
            heartbeat,
            lost_after,
        } => v1::host_message::Body::Welcome(v1::Welcome {
            heartbeat_ms: millis(heartbeat),
            lost_after_ms: millis(lost_after),
        }),
        ToAgent::Launch(l) => v1::host_message::Body::Launch(launch(l)),
        ToAgent::Update(u) => v1::host_message::Body::Update(update(u)),
        ToAgent::Stop { job_id, reason } => {
            v1::host_message::Body::Stop(v1::Stop { job_id, reason })
        }
    };
    v1::HostMessage { body: Some(body) }
}

fn millis(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

pub fn launch(l: Launch) -> v1::Launch {
    v1::Launch {
        job_id: l.job_id,
        name: l.name,
        command: l.command,
        gpus: l.gpus,
        memory_limit_mib: l.memory_limit_mib,
        compute_share_permille: l.compute_share_permille,
        role: l.role,
        rank_base: l.rank_base,
        world_size: l.world_size,
        mps_thread_pct: l.mps_thread_pct,
        qos: l.qos,
        request_permille: l.request_permille,
        limit_permille: l.limit_permille,
        launch_seq: l.launch_seq,
    }
}

pub fn update(u: Update) -> v1::Update {
    v1::Update {
        job_id: u.job_id,
        seq: u.seq,
        role: u.role,
        qos: u.qos,
        memory_limit_mib: u.memory_limit_mib,
        compute_share_permille: u.compute_share_permille,
        mps_thread_pct: u.mps_thread_pct,
        request_permille: u.request_permille,
        limit_permille: u.limit_permille,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_codes_stay_out_of_range_and_are_refused_by_name() {
        let spec = v1::JobSpec {
            name: "j".into(),
            gpus: 1,
            qos: 256, // would wrap to 0 (guaranteed) if cast
            ..Default::default()
        };
        let e = submitted_spec(&spec).validated().unwrap_err();
        assert!(e.contains("qos"), "{e}");
        let spec = v1::JobSpec {
            name: "j".into(),
            gpus: 1,
            kind: 258,
            ..Default::default()
        };
        assert!(
            submitted_spec(&spec)
                .validated()
                .unwrap_err()
                .contains("kind")
        );
    }

    #[test]
    fn every_job_state_round_trips() {
        for s in JobStatus::ALL {
            assert_eq!(job_status(job_state(s)), Some(s));
        }
        assert_eq!(job_status(v1::JobState::Unspecified), None);
    }

    #[test]
    fn an_unknown_workload_event_kind_is_named() {
        let ev = v1::WorkloadEvent {
            job_id: 3,
            kind: 99,
            ..Default::default()
        };
        assert_eq!(workload_event(&ev), Err(99));
        let ev = v1::WorkloadEvent {
            job_id: 3,
            kind: v1::WorkloadEventKind::Exited as i32,
            exit_code: 7,
            launch_seq: 4,
            ..Default::default()
        };
        assert_eq!(
            workload_event(&ev),
            Ok(WorkloadEvent {
                job_id: 3,
                launch_seq: 4,
                kind: WorkloadEventKind::Exited { exit_code: 7 },
            })
        );
    }

    fn report() -> ExperimentView {
        // Intervals as the t quantiles make them: floats the default JSON
        // parser reads back one ULP off (the store enables `float_roundtrip`).
        let e = |mean: f64| Estimate {
            mean,
            ci_low: mean - 31.283440854640283,
            ci_high: mean + 31.283440854640285,
            samples: 40,
            batches: 4,
        };
        ExperimentView {
            name: "ab".into(),
            mode: Mode::Shadow,
            state: ExperimentState::RolledBack,
            candidate_slot: "cand".into(),
            arms: vec![ArmView {
                arm: "control".into(),
                slot: "default".into(),
                generation: 3,
                nodes: 2,
                gpus: 16,
                jobs_submitted: 40,
                jobs_started: 39,
                jobs_finished: 38,
                queue_delay_ms: e(40.333333333333336),
                jct_ms: e(9_000.0),
                gpu_allocation_pct: e(71.5),
                fragmentation_pct: e(3.25),
                preemptions: 1,
                slo_violations: 2,
                policy_faults: 0,
                policy_latency_ms: e(0.4),
            }],
            shadow: Some(ShadowSummary {
                rounds: 10,
                rounds_identical: 7,
                placements_differing: 4,
                recent: vec![PlacementDiff {
                    epoch: 5,
                    job: 9,
                    job_name: "j#9".into(),
                    incumbent: "a:0".into(),
                    candidate: String::new(),
                }],
                jobs_differing: 2,
                ..ShadowSummary::default()
            }),
            reason: "rolled back: worse".into(),
            started_ms: 1_000,
            ended_ms: 2_000,
            comparison: Some(ComparisonView {
                metric: "queue_delay".into(),
                difference: 30.0,
                ci_low: 10.0,
                ci_high: 50.0,
                always_valid_p: 0.01,
            }),
            balance: Some(BalanceView {
                control_jobs: 40,
                candidate_jobs: 38,
                target_share: 0.5,
                sample_ratio_p: 0.8,
                ..BalanceView::default()
            }),
        }
    }

    /// Stores written before the reports were JSON keep their final
    /// metrics: the protobuf form reads back to the same report.
    #[test]
    fn a_legacy_protobuf_report_reads_back_whole() {
        let report = report();
        let bytes = prost::Message::encode_to_vec(&experiment(&report));
        assert_eq!(legacy_experiment_report(&bytes), Ok(report));
        assert!(legacy_experiment_report(b"\xff\xff\xff").is_err());
    }

    /// A comparison whose batch means are all equal has a NaN interval:
    /// stored as JSON (`null`), the report still reads back.
    #[test]
    fn a_report_with_a_nan_interval_stays_readable() {
        let mut report = report();
        if let Some(c) = report.comparison.as_mut() {
            c.ci_low = f64::NAN;
            c.ci_high = f64::INFINITY;
        }
        report.arms[0].jct_ms.mean = f64::NAN;
        let json = serde_json::to_vec(&report).unwrap();
        let back: ExperimentView = serde_json::from_slice(&json).unwrap();
        let c = back.comparison.as_ref().unwrap();
        assert!(c.ci_low.is_nan() && c.ci_high.is_nan(), "{c:?}");
        assert!(back.arms[0].jct_ms.mean.is_nan());
        assert_eq!(back.arms[0].queue_delay_ms, report.arms[0].queue_delay_ms);
    }

    #[test]
    fn a_report_round_trips_through_the_stores_json() {
        let report = report();
        let json = serde_json::to_vec(&report).unwrap();
        let back: ExperimentView = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, report);
    }
}
