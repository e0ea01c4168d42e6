//! Jobs: `submit`, `jobs`, `service`, `cancel`, `describe`, `progress`.

use super::{Clients, Conn, connect, every, parse_duration, parse_watch, print_json, status_error};
use arbiter_proto::v1;
use clap::{Args, ValueEnum};
use std::time::Duration;

#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The job's name (1..=253 bytes; need not be unique).
    #[arg(long)]
    pub name: String,
    /// GPUs in all (0 = a CPU-only job).
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// GPUs per worker (default: all on one worker).
    #[arg(long)]
    pub gpus_per_worker: Option<u32>,
    /// A fraction of one GPU, in milli (e.g. 500 = half a GPU).
    #[arg(long)]
    pub gpu_milli: Option<u32>,
    /// Device-memory quota per GPU, MiB (enforced on the node by the interposer).
    #[arg(long = "gpu-memory", value_name = "MiB")]
    pub gpu_memory: Option<u32>,
    /// Tenant (admin only; a tenant token always submits as its tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Higher runs first where the policy honours priority.
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Expected run time (the simulated pool runs the job this long).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Deadline, counted from submission.
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Opportunistic QoS (may be preempted; with sharing on, runs beside
    /// guaranteed work). Same as `--qos 1`.
    #[arg(long, conflicts_with = "qos")]
    pub opportunistic: bool,
    /// QoS: 0 guaranteed, 1 opportunistic, 2 best effort (offline).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=2))]
    pub qos: Option<u32>,
    /// Most of the GPU, in milli, a fractional job may burst to when the
    /// GPU is idle (its `--gpu-milli` is the guaranteed request).
    #[arg(long)]
    pub gpu_milli_limit: Option<u32>,
    /// Keep every worker on one node (`require`) or prefer it (`prefer`).
    #[arg(long, value_parser = ["any", "prefer", "require"], default_value = "any")]
    pub locality: String,
    /// Latency objective of an inference job.
    #[arg(long, value_parser = parse_duration)]
    pub slo: Option<Duration>,
    /// Recurrence group: reruns of the same work share one.
    #[arg(long)]
    pub group: Option<String>,
    /// Host CPU to reserve, in milli-cores (default: none).
    #[arg(long, default_value_t = 0)]
    pub cpu_milli: u32,
    /// Host memory to reserve, in MiB (default: none).
    #[arg(long, default_value_t = 0)]
    pub memory_mib: u32,
    /// What the job is: `inference` jobs are services that report their
    /// load (`arbiter service`); `interactive` is a notebook.
    #[arg(long, value_parser = ["training", "inference", "interactive"], default_value = "training")]
    pub kind: String,
    /// Elastic jobs: the fewest workers a policy may shrink the job to
    /// (default: the submitted `gpus / gpus-per-worker`).
    #[arg(long)]
    pub min_workers: Option<u32>,
    /// Elastic jobs: the most workers a policy may grow the job to.
    #[arg(long)]
    pub max_workers: Option<u32>,
    /// The workload command.
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub async fn submit(a: &SubmitArgs) -> anyhow::Result<()> {
    let mut c = connect(&a.conn).await?;
    let spec = v1::JobSpec {
        name: a.name.clone(),
        tenant: a.tenant.clone().unwrap_or_default(),
        gpus: a.gpus,
        gpus_per_worker: a.gpus_per_worker.unwrap_or(0),
        gpu_milli: a.gpu_milli.unwrap_or(0),
        gpu_memory_mib: a.gpu_memory.unwrap_or(0),
        cpu_milli: a.cpu_milli,
        memory_mib: a.memory_mib,
        priority: a.priority,
        qos: a.qos.unwrap_or(u32::from(a.opportunistic)),
        gpu_milli_limit: a.gpu_milli_limit.unwrap_or(0),
        locality: match a.locality.as_str() {
            "prefer" => 1,
            "require" => 2,
            _ => 0,
        },
        slo_ms: a
            .slo
            .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX)),
        group: a.group.clone().unwrap_or_default(),
        duration_ms: a.duration.map_or(0, |d| d.as_millis() as u64),
        deadline_ms: a.deadline.map_or(0, |d| d.as_millis() as u64),
        command: a.command.clone(),
        kind: match a.kind.as_str() {
            "inference" => 1,
            "interactive" => 2,
            _ => 0,
        },
        min_workers: a.min_workers.unwrap_or(0),
        max_workers: a.max_workers.unwrap_or(0),
        ..Default::default()
    };
    let id = c
        .jobs
        .submit(v1::SubmitJobRequest { spec: Some(spec) })
        .await
        .map_err(status_error)?
        .into_inner()
        .id;
    if a.conn.json {
        print_json(&serde_json::json!({ "id": id }))
    } else {
        println!("submitted job {id}");
        Ok(())
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum StateArg {
    Queued,
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Only jobs in these states.
    #[arg(long, value_enum)]
    pub state: Vec<StateArg>,
    /// Only this tenant's jobs (admin).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Show the newest N jobs (0: the server's page, 1,000).
    #[arg(long, default_value_t = 0)]
    pub limit: u32,
    /// Every matching job, page after page (newest first).
    #[arg(long, conflicts_with = "limit")]
    pub all: bool,
    /// Refresh this often until interrupted (e.g. `2s`; at least 100ms).
    #[arg(long, value_parser = parse_watch)]
    pub watch: Option<Duration>,
}

/// Every job matching `req`, following the server's pages (newest first).
pub(super) async fn list_all_jobs(
    c: &mut Clients,
    mut req: v1::ListJobsRequest,
) -> anyhow::Result<Vec<v1::Job>> {
    let mut all = Vec::new();
    loop {
        let page = c
            .jobs
            .list(req.clone())
            .await
            .map_err(status_error)?
            .into_inner();
        all.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        req.page_token = page.next_page_token;
    }
}

fn state_name(s: i32) -> &'static str {
    match v1::JobState::try_from(s) {
        Ok(v1::JobState::Queued) => "queued",
        Ok(v1::JobState::Pending) => "pending",
        Ok(v1::JobState::Running) => "running",
        Ok(v1::JobState::Succeeded) => "succeeded",
        Ok(v1::JobState::Failed) => "failed",
        Ok(v1::JobState::Cancelled) => "cancelled",
        _ => "?",
    }
}

fn kind_name(kind: u32) -> &'static str {
    match kind {
        0 => "training",
        1 => "inference",
        2 => "interactive",
        _ => "?",
    }
}

pub(super) fn service_json(s: &v1::ServiceLoad) -> serde_json::Value {
    serde_json::json!({
        "requests_per_s": s.requests_per_s,
        "p50_latency_ms": s.p50_latency_ms,
        "p99_latency_ms": s.p99_latency_ms,
        "reported_ms": s.reported_ms,
    })
}

/// `120.0 rps p50 40 p99 90/128 ms` for a service that reported its load.
pub(super) fn service_text(j: &v1::Job) -> String {
    let slo = j.spec.as_ref().map_or(0, |s| s.slo_ms);
    j.service.as_ref().map_or_else(String::new, |s| {
        let objective = if slo > 0 {
            format!("/{slo}")
        } else {
            String::new()
        };
        format!(
            "{:.1} rps p50 {} p99 {}{objective} ms",
            s.requests_per_s, s.p50_latency_ms, s.p99_latency_ms
        )
    })
}

/// A running job's statistics from its nodes, as text: iteration time, GPU memory (peak),
/// memory spilled to the host, and what the node enforces when it limits the job.
fn metrics_text(j: &v1::Job) -> String {
    let Some(m) = &j.metrics else {
        return String::new();
    };
    let mut parts = Vec::new();
    if m.iteration_ms > 0 {
        parts.push(format!("it {} ms", m.iteration_ms));
    }
    parts.push(format!("mem {} MiB", m.peak_memory_mib));
    if m.host_memory_mib > 0 {
        parts.push(format!("host {} MiB", m.host_memory_mib));
    }
    if m.memory_limit_mib > 0 {
        parts.push(format!("limit {} MiB", m.memory_limit_mib));
    }
    if m.compute_share_permille > 0 && m.compute_share_permille < 1000 {
        parts.push(format!("share {}‰", m.compute_share_permille));
    }
    parts.join(", ")
}

fn job_json(j: &v1::Job) -> serde_json::Value {
    let spec = j.spec.clone().unwrap_or_default();
    serde_json::json!({
        "id": j.id,
        "name": spec.name,
        "tenant": spec.tenant,
        "state": state_name(j.state),
        "gpus": spec.gpus,
        "gpu_milli": spec.gpu_milli,
        "priority": spec.priority,
        "duration_ms": spec.duration_ms,
        "deadline_ms": spec.deadline_ms,
        "command": spec.command,
        "submit_ms": j.submit_ms,
        "start_ms": j.start_ms,
        "end_ms": j.end_ms,
        "node": j.node,
        "gpu_indices": j.gpu_indices,
        "preemptions": j.preemptions,
        "arm": j.arm,
        "message": j.message,
        "waiting_reason": j.waiting_reason,
        "progress": j.progress.as_ref().map(progress_json),
        "kind": kind_name(spec.kind),
        "workers": j.workers,
        "min_workers": spec.min_workers,
        "max_workers": spec.max_workers,
        "slo_ms": spec.slo_ms,
        "service": j.service.as_ref().map(service_json),
        "metrics": j.metrics.as_ref().map(|m| serde_json::json!({
            "iteration_ms": m.iteration_ms,
            "peak_memory_mib": m.peak_memory_mib,
            "min_memory_mib": m.min_memory_mib,
            "host_memory_mib": m.host_memory_mib,
            "utilization_pct": m.utilization_pct,
            "memory_limit_mib": m.memory_limit_mib,
            "compute_share_permille": m.compute_share_permille,
        })),
    })
}

fn progress_json(p: &v1::JobProgress) -> serde_json::Value {
    serde_json::json!({
        "started_ms": p.started_ms,
        "attained_ms": p.attained_ms,
        "remaining_ms": p.remaining_ms,
        "remaining_workers": p.remaining_workers,
        "reported_ms": p.reported_ms,
    })
}

pub async fn jobs(a: &JobsArgs) -> anyhow::Result<()> {
    every(a.watch, || jobs_once(a)).await
}

async fn jobs_once(a: &JobsArgs) -> anyhow::Result<()> {
    let mut c = connect(&a.conn).await?;
    let states = a
        .state
        .iter()
        .map(|s| {
            (match s {
                StateArg::Queued => v1::JobState::Queued,
                StateArg::Pending => v1::JobState::Pending,
                StateArg::Running => v1::JobState::Running,
                StateArg::Succeeded => v1::JobState::Succeeded,
                StateArg::Failed => v1::JobState::Failed,
                StateArg::Cancelled => v1::JobState::Cancelled,
            }) as i32
        })
        .collect();
    let req = v1::ListJobsRequest {
        states,
        tenant: a.tenant.clone().unwrap_or_default(),
        limit: a.limit,
        page_token: String::new(),
    };
    let jobs = if a.all {
        list_all_jobs(&mut c, req).await?
    } else {
        c.jobs
            .list(req)
            .await
            .map_err(status_error)?
            .into_inner()
            .jobs
    };
    if a.conn.json {
        return print_json(&jobs.iter().map(job_json).collect::<Vec<_>>());
    }
    println!(
        "{:>6} {:<24} {:<12} {:<9} {:>4} {:>7} {:<16} {:<8} MESSAGE",
        "ID", "NAME", "TENANT", "STATE", "GPUS", "WORKERS", "NODE", "ARM"
    );
    for j in &jobs {
        let spec = j.spec.clone().unwrap_or_default();
        let workers = if spec.max_workers > spec.min_workers {
            format!("{}/{}-{}", j.workers, spec.min_workers, spec.max_workers)
        } else {
            j.workers.to_string()
        };
        // A waiting job's reason first: it is what the user asks `jobs` for.
        let message = [
            j.waiting_reason.clone(),
            service_text(j),
            metrics_text(j),
            j.message.clone(),
        ]
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
        println!(
            "{:>6} {:<24} {:<12} {:<9} {:>4} {:>7} {:<16} {:<8} {}",
            j.id,
            spec.name,
            spec.tenant,
            state_name(j.state),
            spec.gpus,
            workers,
            j.node,
            j.arm,
            message
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The inference job.
    pub id: u64,
    /// Requests per second over the reporter's window.
    #[arg(long, value_parser = parse_rate)]
    pub rps: f32,
    /// Median latency (e.g. `40ms`).
    #[arg(long, value_parser = parse_duration)]
    pub p50: Duration,
    /// 99th-percentile latency (e.g. `120ms`).
    #[arg(long, value_parser = parse_duration)]
    pub p99: Duration,
}

/// A request rate: a finite number ≥ 0 in the wire's `f32` (a larger number would reach the
/// plane as infinity and be refused there with a less helpful word).
fn parse_rate(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!(
            "`{s}` is not a rate: a number of requests per second, 0 to {:e}",
            f32::MAX
        )),
    }
}

pub async fn service(a: &ServiceArgs) -> anyhow::Result<()> {
    let mut c = connect(&a.conn).await?;
    let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    let load = c
        .jobs
        .report_service(v1::ReportServiceRequest {
            id: a.id,
            requests_per_s: a.rps,
            p50_latency_ms: ms(a.p50),
            p99_latency_ms: ms(a.p99),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if a.conn.json {
        print_json(&service_json(&load))
    } else {
        println!(
            "job {}: {:.1} requests/s, p50 {} ms, p99 {} ms (reported at {} ms)",
            a.id, load.requests_per_s, load.p50_latency_ms, load.p99_latency_ms, load.reported_ms
        );
        Ok(())
    }
}

#[derive(Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The jobs to cancel.
    #[arg(required = true)]
    pub ids: Vec<u64>,
}

/// Cancels every job named; one that cannot be cancelled is reported and
/// the rest still are (the exit status says whether all were).
pub async fn cancel(a: &CancelArgs) -> anyhow::Result<()> {
    let mut c = connect(&a.conn).await?;
    let mut cancelled = Vec::new();
    let mut failed = Vec::new();
    for &id in &a.ids {
        match c.jobs.cancel(v1::JobRef { id }).await {
            Ok(r) => cancelled.push(r.into_inner().job.unwrap_or_default()),
            Err(e) => failed.push((id, status_error(e))),
        }
    }
    if a.conn.json {
        print_json(&serde_json::json!({
            "cancelled": cancelled.iter().map(job_json).collect::<Vec<_>>(),
            "failed": failed.iter().map(|(id, e)| serde_json::json!({"id": id, "error": e.to_string()})).collect::<Vec<_>>(),
        }))?;
    } else {
        for job in &cancelled {
            println!("job {} {}", job.id, state_name(job.state));
        }
        for (id, e) in &failed {
            eprintln!("job {id}: {e}");
        }
    }
    match failed.len() {
        0 => Ok(()),
        n => anyhow::bail!("{n} of {} jobs not cancelled", a.ids.len()),
    }
}

#[derive(Args)]
pub struct DescribeJobArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The job.
    pub id: u64,
}

/// One job, every field: where it runs, why it waits, what it reported.
pub async fn describe_job(a: &DescribeJobArgs) -> anyhow::Result<()> {
    let mut c = connect(&a.conn).await?;
    let j = c
        .jobs
        .get(v1::JobRef { id: a.id })
        .await
        .map_err(status_error)?
        .into_inner();
    let value = job_json(&j);
    if a.conn.json {
        return print_json(&value);
    }
    let mut lines = Vec::new();
    described_fields("", &value, &mut lines);
    let width = lines
        .iter()
        .map(|(label, _)| label.len())
        .max()
        .unwrap_or(0);
    for (label, shown) in lines {
        println!("{label:<width$} {shown}");
    }
    Ok(())
}

/// Fields of the API's job that are times since the epoch, in ms.
const INSTANT_FIELDS: [&str; 5] = [
    "submit_ms",
    "start_ms",
    "end_ms",
    "started_ms",
    "reported_ms",
];
/// Fields that are spans of time, in ms.
const SPAN_FIELDS: [&str; 8] = [
    "duration_ms",
    "deadline_ms",
    "slo_ms",
    "attained_ms",
    "remaining_ms",
    "iteration_ms",
    "p50_latency_ms",
    "p99_latency_ms",
];
/// Fields whose 0 is the API's "none" (not started, no deadline, no objective).
const NONE_IF_ZERO: [&str; 6] = [
    "submit_ms",
    "start_ms",
    "end_ms",
    "duration_ms",
    "deadline_ms",
    "slo_ms",
];

/// `describe`'s text form of one field, appended to `lines` as (label, text): nested
/// objects flattened as `progress.remaining`; times since the epoch shown as UTC
/// timestamps and spans as durations, under the field's name without `_ms`; nothing for a
/// field that says nothing (null, empty, or a 0 that means "none"). `--json` keeps the
/// API's fields and milliseconds.
fn described_fields(prefix: &str, value: &serde_json::Value, lines: &mut Vec<(String, String)>) {
    let serde_json::Value::Object(fields) = value else {
        return;
    };
    for (key, v) in fields {
        let timed = INSTANT_FIELDS.contains(&key.as_str()) || SPAN_FIELDS.contains(&key.as_str());
        let label = |name: &str| format!("{prefix}{name}");
        let shown = match v {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) if s.is_empty() => continue,
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(_) => {
                described_fields(&label(&format!("{key}.")), v, lines);
                continue;
            }
            serde_json::Value::Number(n) if timed && n.as_u64().is_some() => {
                let ms = n.as_u64().unwrap_or_default();
                if ms == 0 && NONE_IF_ZERO.contains(&key.as_str()) {
                    continue;
                }
                let span = Duration::from_millis(ms);
                let text = if INSTANT_FIELDS.contains(&key.as_str()) {
                    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + span).to_string()
                } else {
                    humantime::format_duration(span).to_string()
                };
                lines.push((label(key.trim_end_matches("_ms")), text));
                continue;
            }
            other => other.to_string(),
        };
        lines.push((label(key), shown));
    }
}

#[derive(Args)]
pub struct ProgressArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The job reporting.
    pub id: u64,
    /// Run time the job has left at its current size (e.g. `45m`).
    #[arg(long, value_parser = parse_duration)]
    pub remaining: Duration,
}

pub async fn progress(a: &ProgressArgs) -> anyhow::Result<()> {
    let mut c = connect(&a.conn).await?;
    let p = c
        .jobs
        .report_progress(v1::ReportProgressRequest {
            id: a.id,
            remaining_ms: a.remaining.as_millis().try_into().unwrap_or(u64::MAX),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if a.conn.json {
        print_json(&progress_json(&p))
    } else {
        println!(
            "job {}: {} ms left at {} workers (reported at {} ms)",
            a.id, p.remaining_ms, p.remaining_workers, p.reported_ms
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_shows_times_as_timestamps_and_spans_as_durations() {
        let job = serde_json::json!({
            "name": "j0",
            "node": "",
            "gpu_milli": 0,
            "submit_ms": 1_795_964_254_868u64,
            "start_ms": 0,
            "duration_ms": 5_400_000,
            "deadline_ms": 0,
            "slo_ms": 128,
            "service": null,
            "progress": {"attained_ms": 0, "remaining_ms": 90_000, "remaining_workers": 1},
        });
        let mut lines = Vec::new();
        described_fields("", &job, &mut lines);
        let shown: Vec<(&str, &str)> = lines
            .iter()
            .map(|(l, t)| (l.as_str(), t.as_str()))
            .collect();
        // 0 is "none" for a start, a deadline or an objective, not for a count or for
        // progress; empty strings and nulls say nothing.
        assert_eq!(
            shown,
            [
                ("duration", "1h 30m"),
                ("gpu_milli", "0"),
                ("name", "j0"),
                ("progress.attained", "0s"),
                ("progress.remaining", "1m 30s"),
                ("progress.remaining_workers", "1"),
                ("slo", "128ms"),
                ("submit", "2026-11-29T14:57:34.868Z"),
            ]
        );
    }
}
