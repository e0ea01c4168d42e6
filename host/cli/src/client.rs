//! Client commands: they talk to `arbiter serve` over gRPC.
//!
//! Every command takes `--server <url>` (env `ARBITER_SERVER`) and
//! `--token <token>` (env `ARBITER_TOKEN`; else the admin token in
//! `./arbiter-data/admin.token`, which `arbiter serve` writes on first start),
//! after the command or before it (`arbiter --server URL jobs`).

use anyhow::{Context, bail};
use arbiter_policy_sdk::model;
use arbiter_proto::v1;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

#[derive(Args, Clone)]
pub struct Conn {
    /// Control-plane URL.
    #[arg(
        long,
        env = "ARBITER_SERVER",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub server: String,
    /// Bearer token (admin or tenant).
    #[arg(long, env = "ARBITER_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate to trust for an `https://` server (the plane's own:
    /// `<data>/tls/ca.pem`); default: the system's roots.
    #[arg(long, env = "ARBITER_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

type Auth = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

fn token(conn: &Conn) -> anyhow::Result<String> {
    if let Some(t) = &conn.token {
        return Ok(t.clone());
    }
    let path = PathBuf::from("arbiter-data/admin.token");
    std::fs::read_to_string(&path)
        .map(|t| t.trim().to_string())
        .with_context(|| {
            format!(
                "no --token given (or ARBITER_TOKEN) and {} is not readable",
                path.display()
            )
        })
}

pub struct Clients {
    pub jobs: v1::jobs_client::JobsClient<Auth>,
    pub policies: v1::policies_client::PoliciesClient<Auth>,
    pub experiments: v1::experiments_client::ExperimentsClient<Auth>,
    pub nodes: v1::nodes_client::NodesClient<Auth>,
    pub cluster: v1::cluster_client::ClusterClient<Auth>,
}

pub async fn connect(conn: &Conn) -> anyhow::Result<Clients> {
    let token = token(conn)?;
    let header: MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .context("the token is not valid header text")?;
    let ca = match &conn.ca_cert {
        Some(p) => Some(arbiter_host::files::read_at_most(
            p,
            arbiter_host::files::MAX_CONFIG_FILE,
        )?),
        None => None,
    };
    let channel =
        arbiter_proto::endpoint::endpoint(&conn.server, ca.as_deref(), Duration::from_secs(5))?
            .connect()
            .await
            .with_context(|| format!("connecting to {}", conn.server))?;
    let auth = Bearer(header);
    const MAX: usize = 32 << 20;
    Ok(Clients {
        jobs: v1::jobs_client::JobsClient::with_interceptor(channel.clone(), auth.clone()),
        policies: v1::policies_client::PoliciesClient::with_interceptor(
            channel.clone(),
            auth.clone(),
        )
        .max_encoding_message_size(MAX),
        experiments: v1::experiments_client::ExperimentsClient::with_interceptor(
            channel.clone(),
            auth.clone(),
        ),
        nodes: v1::nodes_client::NodesClient::with_interceptor(channel.clone(), auth.clone()),
        cluster: v1::cluster_client::ClusterClient::with_interceptor(channel, auth),
    })
}

/// `10m`, `30s`, `1h 30m`, `250ms` (humantime's forms). A bare number is
/// refused (`--duration 30` meant 30 ms to the API and 30 s to most
/// people); `0` alone needs no unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return if n == 0 {
            Ok(Duration::ZERO)
        } else {
            Err(format!(
                "`{s}` has no unit: write {s}s for seconds or {s}ms for milliseconds"
            ))
        };
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like 250ms, 30s, 10m or 1h 30m: {e}"))
}

fn status_error(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", e.code(), e.message())
}

fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

// ------------------------------------------------------------------ submit / jobs

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
async fn list_all_jobs(
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

fn service_json(s: &v1::ServiceLoad) -> serde_json::Value {
    serde_json::json!({
        "requests_per_s": s.requests_per_s,
        "p50_latency_ms": s.p50_latency_ms,
        "p99_latency_ms": s.p99_latency_ms,
        "reported_ms": s.reported_ms,
    })
}

/// `120.0 rps p50 40 p99 90/128 ms` for a service that reported its load.
fn service_text(j: &v1::Job) -> String {
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

// ------------------------------------------------------------------ policies

#[derive(Subcommand)]
pub enum RemotePolicy {
    /// Upload a component into a slot (default: the slot named by its manifest;
    /// with a tenant token, the tenant's own slot).
    Load(LoadArgs),
    /// Make a loaded generation the active one.
    Swap(SwapArgs),
    /// Go back to the previous healthy generation (or `--to` one).
    Rollback(RollbackArgs),
    /// Remove a generation from a slot, or (without `--generation`) every
    /// generation and the slot: e.g. `policy unload matcher` stops pairing.
    Unload(UnloadArgs),
    /// A slot's generations, manifests, faults and configuration.
    Describe(DescribeArgs),
    /// A slot's rounds, fallbacks and latency.
    Stats(DescribeArgs),
}

#[derive(Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The `.wasm` component, or a built-in policy's name (`builtin:<name>` whatever files
    /// exist).
    pub file: String,
    /// Slot to load into (`default`: the scheduler the plane runs). Without
    /// it: the slot named by the component's manifest — `matcher` for a pure
    /// matcher, `reclaim` for a pure reclaim policy.
    #[arg(long)]
    pub slot: Option<String>,
    /// Load into the calling tenant's own slot (`tenant:<name>`).
    #[arg(long)]
    pub tenant: bool,
    /// Configuration file (TOML) for the policy.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Load without activating.
    #[arg(long)]
    pub inactive: bool,
}

#[derive(Args)]
pub struct SwapArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot whose active generation changes.
    pub slot: String,
    /// The generation to activate (`policy describe` lists them).
    pub generation: u64,
}

#[derive(Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot to roll back.
    pub slot: String,
    /// The generation to return to (default: the one active before; never a
    /// quarantined one).
    #[arg(long)]
    pub to: Option<u64>,
}

#[derive(Args)]
pub struct UnloadArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot to unload from.
    pub slot: String,
    /// The generation to remove (default: all of them, and the slot).
    #[arg(long)]
    pub generation: Option<u64>,
}

#[derive(Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot to describe.
    pub slot: String,
}

fn gen_json(g: &v1::GenerationInfo) -> serde_json::Value {
    serde_json::json!({
        "id": g.id, "name": g.name, "version": g.version, "digest": g.digest,
        "roles": g.roles, "active": g.active, "quarantined": g.quarantined,
        "rounds_served": g.rounds_served, "faults": g.faults,
        "last_fault": g.last_fault, "config": g.config,
    })
}

fn print_slot(s: &v1::SlotInfo, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(&serde_json::json!({
            "slot": s.slot,
            "generations": s.generations.iter().map(gen_json).collect::<Vec<_>>(),
        }));
    }
    println!("slot {}", s.slot);
    // SERVED: the calls a generation answered — a scheduling slot's rounds,
    // or a role or tenant slot's answers (`rounds_served` counts both).
    println!(
        "  {:>4} {:<22} {:<9} {:<14} {:>8} {:>7} STATE",
        "GEN", "NAME", "VERSION", "DIGEST", "SERVED", "FAULTS"
    );
    for g in &s.generations {
        let state = match (g.active, g.quarantined) {
            (true, _) => "active",
            (false, true) => "quarantined",
            _ => "",
        };
        println!(
            "  {:>4} {:<22} {:<9} {:<14} {:>8} {:>7} {}",
            g.id,
            g.name,
            g.version,
            &g.digest[..12.min(g.digest.len())],
            g.rounds_served,
            g.faults,
            state
        );
        println!("       roles: {}", g.roles.join(", "));
        if g.config.trim().is_empty() {
            println!("       config: (the manifest's default)");
        } else {
            for (i, line) in g.config.lines().enumerate() {
                let label = if i == 0 { "config:" } else { "       " };
                println!("       {label} {line}");
            }
        }
        if g.quarantined {
            println!("       quarantined: not asked any more, and never rolled back to");
        }
        if !g.last_fault.is_empty() {
            println!("       last fault: {}", g.last_fault);
        }
    }
    Ok(())
}

pub async fn remote_policy(cmd: &RemotePolicy) -> anyhow::Result<()> {
    match cmd {
        RemotePolicy::Load(a) => {
            let wasm = arbiter_repro::read_policy(&a.file)?;
            let config = match &a.config {
                Some(p) => arbiter_host::files::read_config(p)?,
                None => String::new(),
            };
            if a.tenant && a.slot.is_some() {
                bail!("--tenant and --slot are exclusive");
            }
            let mut c = connect(&a.conn).await?;
            let loaded = c
                .policies
                .upload(v1::UploadPolicyRequest {
                    slot: a.slot.clone().unwrap_or_default(),
                    wasm,
                    config,
                    activate: !a.inactive,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            let g = loaded.generation.unwrap_or_default();
            if a.conn.json {
                let mut json = gen_json(&g);
                json["slot"] = serde_json::Value::String(loaded.slot);
                print_json(&json)
            } else {
                println!(
                    "loaded {} {} into slot `{}` as generation {}{} (digest {})",
                    g.name,
                    g.version,
                    loaded.slot,
                    g.id,
                    if g.active { ", active" } else { "" },
                    &g.digest[..12.min(g.digest.len())]
                );
                Ok(())
            }
        }
        RemotePolicy::Swap(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .swap(v1::SwapPolicyRequest {
                    slot: a.slot.clone(),
                    generation: a.generation,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Rollback(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .rollback(v1::RollbackPolicyRequest {
                    slot: a.slot.clone(),
                    generation: a.to.unwrap_or(0),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Unload(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .unload(v1::UnloadPolicyRequest {
                    slot: a.slot.clone(),
                    generation: a.generation.unwrap_or(0),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if s.generations.is_empty() && !a.conn.json {
                println!("slot {} unloaded: it is empty and gone", s.slot);
                return Ok(());
            }
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Describe(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .describe(v1::SlotRef {
                    slot: a.slot.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Stats(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .stats(v1::SlotRef {
                    slot: a.slot.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.conn.json {
                return print_json(&serde_json::json!({
                    "slot": s.slot, "cells": s.cells, "rounds": s.rounds, "fallbacks": s.fallbacks,
                    "latency_p50_ms": s.latency_p50_ms, "latency_p99_ms": s.latency_p99_ms,
                    "generations": s.generations.iter().map(gen_json).collect::<Vec<_>>(),
                }));
            }
            if s.cells == 0 {
                // A role slot or a tenant's: no rounds of its own to time.
                println!(
                    "slot {}: runs no cell's rounds; answers by generation:",
                    s.slot
                );
                for g in &s.generations {
                    println!(
                        "  {:>4} {:<22} {} answered, {} faults{}",
                        g.id,
                        g.name,
                        g.rounds_served,
                        g.faults,
                        if g.active { " (active)" } else { "" }
                    );
                }
                return Ok(());
            }
            println!(
                "slot {}: {} rounds, {} fallbacks, policy latency p50 {:.3} ms p99 {:.3} ms",
                s.slot, s.rounds, s.fallbacks, s.latency_p50_ms, s.latency_p99_ms
            );
            Ok(())
        }
    }
}

pub async fn remote_ls(conn: &Conn) -> anyhow::Result<()> {
    let mut c = connect(conn).await?;
    let slots = c
        .policies
        .list(v1::ListPoliciesRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .slots;
    if conn.json {
        return print_json(
            &slots
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "slot": s.slot,
                        "generations": s.generations.iter().map(gen_json).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>(),
        );
    }
    for s in &slots {
        print_slot(s, false)?;
    }
    Ok(())
}

// ------------------------------------------------------------------ experiments

#[derive(Subcommand)]
pub enum AbCommand {
    /// Start an experiment of a candidate slot against `default`.
    Start(AbStartArgs),
    /// Per-arm metrics with 95% confidence intervals, or the shadow diff.
    Status(AbRefArgs),
    /// Make the candidate the `default` policy.
    Promote(AbRefArgs),
    /// Stop the experiment; the control policy takes everything back.
    #[command(visible_alias = "stop")]
    Abort(AbRefArgs),
    /// Every experiment, running and ended.
    Ls(ConnOnly),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Split,
    Shadow,
}

#[derive(Args)]
pub struct AbStartArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// A name for the experiment (unique, kept after it ends).
    pub name: String,
    /// Slot whose active generation is the candidate.
    #[arg(long)]
    pub candidate: String,
    /// `split`: each arm schedules its share of jobs on its share of nodes;
    /// `shadow`: the candidate only answers a mirror of the control's rounds.
    #[arg(long, value_enum, default_value = "split")]
    pub mode: ModeArg,
    /// Tenants routed to the candidate (default: randomised assignment, a
    /// biased coin that keeps requested GPUs at the share).
    #[arg(long, value_delimiter = ',')]
    pub tenants: Vec<String>,
    /// Candidate's share of demand (randomised assignment) and of node capacity.
    #[arg(long, default_value_t = 0.5, value_parser = |s: &str| parse_within(s, 0.0, 1.0, false))]
    pub share: f64,
    /// Guardrail metric: queue_delay, jct, slo_violations or faults.
    #[arg(long, default_value = "queue_delay")]
    pub guardrail: String,
    /// False-rollback rate of the guardrail's sequential test; it holds however
    /// often the guardrail looks.
    #[arg(long, default_value_t = 0.05, value_parser = |s: &str| parse_within(s, 0.0, 0.5, false))]
    pub alpha: f64,
    /// Samples each arm needs before the guardrail weighs evidence.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub min_samples: u32,
    /// Candidate policy faults that roll it back at once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_faults: u32,
    /// The regression the guardrail is most sensitive to, as a fraction of the
    /// control's mean (0.1 = a candidate 10 % worse).
    #[arg(long, default_value_t = 0.1, value_parser = |s: &str| parse_within(s, 0.0, 10.0, true))]
    pub min_effect: f64,
}

/// A number above `low` and below `high` (up to it if `high_included`). The wire reads 0
/// as "the default", so an explicit 0 must be refused here rather than quietly replaced.
fn parse_within(s: &str, low: f64, high: f64, high_included: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    let below_high = v < high || (high_included && v == high);
    if v > low && below_high {
        Ok(v)
    } else {
        let close = if high_included { ']' } else { ')' };
        Err(format!("`{s}` is not in ({low}, {high}{close}"))
    }
}

#[derive(Args)]
pub struct AbRefArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The experiment.
    pub name: String,
}

fn est(e: &Option<v1::Estimate>) -> String {
    match e {
        Some(e) if e.samples > 0 && e.batches >= 2 => format!(
            "{:.1} [{:.1}, {:.1}] n={} ({} batches)",
            e.mean, e.ci_low, e.ci_high, e.samples, e.batches
        ),
        Some(e) if e.samples > 0 => {
            format!("{:.1} n={} (too few for an interval)", e.mean, e.samples)
        }
        _ => "-".into(),
    }
}

fn est_json(e: &Option<v1::Estimate>) -> serde_json::Value {
    match e {
        Some(e) => serde_json::json!({
            "mean": e.mean, "ci_low": e.ci_low, "ci_high": e.ci_high, "samples": e.samples,
            "batches": e.batches
        }),
        None => serde_json::Value::Null,
    }
}

fn exp_state(s: i32) -> &'static str {
    match v1::ExperimentState::try_from(s) {
        Ok(v1::ExperimentState::Running) => "running",
        Ok(v1::ExperimentState::Promoted) => "promoted",
        Ok(v1::ExperimentState::Aborted) => "aborted",
        Ok(v1::ExperimentState::RolledBack) => "rolled back",
        _ => "?",
    }
}

fn print_experiment(s: &v1::ExperimentStatus, json: bool) -> anyhow::Result<()> {
    if json {
        let arms: Vec<_> = s
            .arms
            .iter()
            .map(|a| {
                serde_json::json!({
                    "arm": a.arm, "slot": a.slot, "generation": a.generation,
                    "nodes": a.nodes, "gpus": a.gpus,
                    "jobs_submitted": a.jobs_submitted, "jobs_started": a.jobs_started,
                    "jobs_finished": a.jobs_finished,
                    "queue_delay_ms": est_json(&a.queue_delay_ms), "jct_ms": est_json(&a.jct_ms),
                    "gpu_allocation_pct": est_json(&a.gpu_allocation_pct),
                    "fragmentation_pct": est_json(&a.fragmentation_pct),
                    "preemptions": a.preemptions, "slo_violations": a.slo_violations,
                    "policy_faults": a.policy_faults,
                    "policy_latency_ms": est_json(&a.policy_latency_ms),
                })
            })
            .collect();
        let shadow = s.shadow.as_ref().map(|sh| {
            serde_json::json!({
                "rounds": sh.rounds, "rounds_identical": sh.rounds_identical,
                "placements_differing": sh.placements_differing,
                "jobs_differing": sh.jobs_differing,
                "candidate_only": sh.candidate_only, "incumbent_only": sh.incumbent_only,
                "incumbent_fragmentation_pct": sh.incumbent_fragmentation_pct,
                "candidate_fragmentation_pct": sh.candidate_fragmentation_pct,
                "candidate_faults": sh.candidate_faults, "candidate_invalid": sh.candidate_invalid,
                "recent": sh.recent.iter().map(|d| serde_json::json!({
                    "epoch": d.epoch, "job": d.job_name,
                    "incumbent": d.incumbent, "candidate": d.candidate,
                })).collect::<Vec<_>>(),
            })
        });
        return print_json(&serde_json::json!({
            "name": s.name,
            "mode": if s.mode == v1::ExperimentMode::Shadow as i32 { "shadow" } else { "split" },
            "state": exp_state(s.state),
            "candidate_slot": s.candidate_slot,
            "reason": s.reason,
            "arms": arms,
            "comparison": s.comparison.as_ref().map(|c| serde_json::json!({
                "metric": c.metric, "difference": c.difference,
                "ci_low": c.ci_low, "ci_high": c.ci_high, "always_valid_p": c.always_valid_p,
            })),
            "balance": s.balance.as_ref().map(|b| serde_json::json!({
                "control_jobs": b.control_jobs, "candidate_jobs": b.candidate_jobs,
                "control_gpu_hours": b.control_gpu_hours, "candidate_gpu_hours": b.candidate_gpu_hours,
                "target_share": b.target_share, "sample_ratio_p": b.sample_ratio_p,
                "mismatch": b.mismatch,
            })),
            "shadow": shadow,
        }));
    }
    println!(
        "experiment {} ({}) — {}{}",
        s.name,
        if s.mode == v1::ExperimentMode::Shadow as i32 {
            "shadow"
        } else {
            "split"
        },
        exp_state(s.state),
        if s.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", s.reason)
        }
    );
    for a in &s.arms {
        println!(
            "  {} ({} gen {}): {} nodes, {} GPUs; jobs {}/{}/{} enrolled/started/finished",
            a.arm,
            a.slot,
            a.generation,
            a.nodes,
            a.gpus,
            a.jobs_submitted,
            a.jobs_started,
            a.jobs_finished
        );
        println!("    queue delay ms   {}", est(&a.queue_delay_ms));
        println!("    JCT ms           {}", est(&a.jct_ms));
        println!("    GPU alloc %      {}", est(&a.gpu_allocation_pct));
        println!("    fragmentation %  {}", est(&a.fragmentation_pct));
        println!("    policy ms        {}", est(&a.policy_latency_ms));
        println!(
            "    preemptions {}, SLO violations {}, policy faults {}",
            a.preemptions, a.slo_violations, a.policy_faults
        );
    }
    if let Some(c) = &s.comparison {
        println!(
            "  candidate - control, {}: {:+.1} [95% CI {:.1}, {:.1}], always-valid p = {:.3}",
            c.metric, c.difference, c.ci_low, c.ci_high, c.always_valid_p
        );
    }
    if let Some(b) = &s.balance {
        let total = b.control_gpu_hours + b.candidate_gpu_hours;
        println!(
            "  balance: {}/{} jobs control/candidate, candidate share of GPU-hours {:.3} (target {:.3}); sample-ratio p = {:.3}{}",
            b.control_jobs,
            b.candidate_jobs,
            if total > 0.0 {
                b.candidate_gpu_hours / total
            } else {
                0.0
            },
            b.target_share,
            b.sample_ratio_p,
            if b.mismatch {
                " — MISMATCH: the split is not what was asked; do not trust the comparison"
            } else {
                ""
            }
        );
    }
    if let Some(sh) = &s.shadow {
        println!(
            "  shadow: {} rounds, {} identical; {} jobs placed differently ({} round-by-round differences: candidate-only {}, incumbent-only {}); candidate faults {}, invalid {}",
            sh.rounds,
            sh.rounds_identical,
            sh.jobs_differing,
            sh.placements_differing,
            sh.candidate_only,
            sh.incumbent_only,
            sh.candidate_faults,
            sh.candidate_invalid
        );
        println!(
            "  fragmentation after decisions: incumbent {:.1}%, candidate {:.1}%",
            sh.incumbent_fragmentation_pct, sh.candidate_fragmentation_pct
        );
        for d in sh.recent.iter().rev().take(10) {
            println!(
                "    epoch {} {}: incumbent {} | candidate {}",
                d.epoch,
                d.job_name,
                if d.incumbent.is_empty() {
                    "-"
                } else {
                    &d.incumbent
                },
                if d.candidate.is_empty() {
                    "-"
                } else {
                    &d.candidate
                }
            );
        }
    }
    Ok(())
}

pub async fn ab(cmd: &AbCommand) -> anyhow::Result<()> {
    match cmd {
        AbCommand::Start(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .experiments
                .start(v1::StartExperimentRequest {
                    name: a.name.clone(),
                    mode: match a.mode {
                        ModeArg::Split => v1::ExperimentMode::Split,
                        ModeArg::Shadow => v1::ExperimentMode::Shadow,
                    } as i32,
                    candidate_slot: a.candidate.clone(),
                    candidate_tenants: a.tenants.clone(),
                    candidate_share: a.share,
                    guardrail: Some(v1::Guardrail {
                        metric: a.guardrail.clone(),
                        alpha: a.alpha,
                        min_samples: a.min_samples,
                        max_faults: a.max_faults,
                        min_effect: a.min_effect,
                    }),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_experiment(&s, a.conn.json)
        }
        AbCommand::Status(a) | AbCommand::Promote(a) | AbCommand::Abort(a) => {
            let mut c = connect(&a.conn).await?;
            let r = v1::ExperimentRef {
                name: a.name.clone(),
            };
            let s = match cmd {
                AbCommand::Status(_) => c.experiments.status(r).await,
                AbCommand::Promote(_) => c.experiments.promote(r).await,
                _ => c.experiments.abort(r).await,
            }
            .map_err(status_error)?
            .into_inner();
            print_experiment(&s, a.conn.json)
        }
        AbCommand::Ls(a) => {
            let mut c = connect(&a.conn).await?;
            let all = c
                .experiments
                .list(v1::ListExperimentsRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .experiments;
            if a.conn.json {
                return print_json(
                    &all.iter()
                        .map(|s| {
                            serde_json::json!({
                                "name": s.name, "state": exp_state(s.state),
                                "candidate_slot": s.candidate_slot, "reason": s.reason,
                                "started_ms": s.started_ms, "ended_ms": s.ended_ms,
                            })
                        })
                        .collect::<Vec<_>>(),
                );
            }
            println!("{:<24} {:<12} {:<16} REASON", "NAME", "STATE", "CANDIDATE");
            for s in &all {
                println!(
                    "{:<24} {:<12} {:<16} {}",
                    s.name,
                    exp_state(s.state),
                    s.candidate_slot,
                    s.reason
                );
            }
            Ok(())
        }
    }
}

// ------------------------------------------------------------------ cluster, nodes, tenants

pub async fn top(conn: &Conn) -> anyhow::Result<()> {
    let mut c = connect(conn).await?;
    let view = c
        .cluster
        .view(v1::ClusterViewRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    let nodes = c
        .nodes
        .list(v1::ListNodesRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .nodes;
    // Running services and their load: what an autoscaling policy acts on.
    let services: Vec<v1::Job> = list_all_jobs(
        &mut c,
        v1::ListJobsRequest {
            states: vec![v1::JobState::Running as i32],
            ..Default::default()
        },
    )
    .await?
    .into_iter()
    .filter(|j| j.spec.as_ref().is_some_and(|s| s.kind == 1))
    .collect();
    if conn.json {
        return print_json(&serde_json::json!({
            "epoch": view.epoch, "rounds": view.rounds, "nodes": view.nodes, "gpus": view.gpus,
            "gpu_allocation_pct": view.gpu_allocation_pct,
            "jobs": {"queued": view.jobs_queued, "pending": view.jobs_pending,
                     "running": view.jobs_running, "finished": view.jobs_finished},
            "policy": view.active_policy, "generation": view.active_generation,
            "experiment": view.experiment,
            "quarantined": view.quarantined.iter().map(|q| serde_json::json!({
                "slot": q.slot, "generation": q.generation, "name": q.name,
                "faults": q.faults, "last_fault": q.last_fault, "active": q.active,
            })).collect::<Vec<_>>(),
            "node_list": nodes.iter().map(node_json).collect::<Vec<_>>(),
            "services": services.iter().map(|j| serde_json::json!({
                "id": j.id, "name": j.spec.as_ref().map(|s| s.name.clone()),
                "replicas": j.workers, "slo_ms": j.spec.as_ref().map_or(0, |s| s.slo_ms),
                "load": j.service.as_ref().map(service_json),
            })).collect::<Vec<_>>(),
        }));
    }
    println!(
        "policy {} (gen {}){}  rounds {}  GPUs {} allocated {:.1}%",
        view.active_policy,
        view.active_generation,
        if view.experiment.is_empty() {
            String::new()
        } else {
            format!("  experiment {}", view.experiment)
        },
        view.rounds,
        view.gpus,
        view.gpu_allocation_pct
    );
    println!(
        "jobs: {} queued, {} pending, {} running, {} finished",
        view.jobs_queued, view.jobs_pending, view.jobs_running, view.jobs_finished
    );
    for q in &view.quarantined {
        println!(
            "QUARANTINED slot {} gen {} ({}): {} faults{}{}",
            q.slot,
            q.generation,
            q.name,
            q.faults,
            if q.active {
                "; still active, the native policy serves the slot"
            } else {
                ""
            },
            if q.last_fault.is_empty() {
                String::new()
            } else {
                format!("; last: {}", q.last_fault)
            }
        );
    }
    print_node_table(&nodes);
    if !services.is_empty() {
        println!("{:>6} {:<24} {:>8} LOAD", "SERVICE", "NAME", "REPLICAS");
        for j in &services {
            let name = j.spec.as_ref().map_or("", |s| s.name.as_str());
            let load = service_text(j);
            let load = if load.is_empty() {
                "no report yet".to_string()
            } else {
                load
            };
            println!("{:>6} {:<24} {:>8} {}", j.id, name, j.workers, load);
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum NodesCommand {
    /// List nodes.
    Ls(ConnOnly),
    /// Stop placing new work on a node.
    Drain(DrainArgs),
    /// Undo a drain: the node takes new work again.
    Undrain(DrainArgs),
    /// Lend a node to training (its pool owns it; a reclaim takes it back).
    Lend(DrainArgs),
    /// Take on-loan nodes of a pool back through the policy's reclaim role.
    Reclaim(ReclaimArgs),
}

#[derive(Args)]
pub struct ReclaimArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The pool whose on-loan nodes are the candidates.
    #[arg(long)]
    pub pool: String,
    /// How many to take back.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
}

#[derive(Args)]
pub struct ConnOnly {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Refresh this often until interrupted (e.g. `2s`; at least 100ms).
    #[arg(long, value_parser = parse_watch)]
    pub watch: Option<Duration>,
}

/// Runs `show` once, or every `period` (clearing a terminal first) until interrupted.
/// A refresh period a person can read and the plane need not notice: `--watch 1ms` asked
/// the plane a thousand times a second and scrolled the terminal unreadably.
fn parse_watch(s: &str) -> Result<Duration, String> {
    let period = parse_duration(s)?;
    if period < Duration::from_millis(100) {
        return Err(format!(
            "`{s}` refreshes faster than a person reads: at least 100ms"
        ));
    }
    Ok(period)
}

pub async fn every<F, Fut>(period: Option<Duration>, mut show: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let Some(period) = period else {
        return show().await;
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        if terminal {
            print!("\x1b[2J\x1b[H");
        }
        show().await?;
        tokio::time::sleep(period).await;
    }
}

#[derive(Args)]
pub struct DrainArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The node.
    pub name: String,
}

/// The node table `top` and `nodes ls` print.
fn print_node_table(nodes: &[v1::NodeInfo]) {
    println!(
        "{:<16} {:<10} {:<12} {:>5} {:>5} {:<12} HEALTH",
        "NODE", "STATE", "MODEL", "GPUS", "FREE", "ARM"
    );
    for n in nodes {
        println!(
            "{:<16} {:<10} {:<12} {:>5} {:>5} {:<12} {}",
            n.name,
            n.state,
            n.gpu_model,
            n.gpus,
            n.gpus_free,
            n.arm,
            gpu_health_text(&n.gpu_health)
        );
    }
}

fn node_json(n: &v1::NodeInfo) -> serde_json::Value {
    serde_json::json!({
        "name": n.name, "state": n.state, "gpus": n.gpus, "gpus_free": n.gpus_free,
        "arm": n.arm, "kind": n.kind, "gpu_model": n.gpu_model,
        "gpu_health": n.gpu_health, "on_loan": n.on_loan,
    })
}

/// Each GPU's health by its SysMonitor state's initial (`H` healthy, `U` unhealthy, `O`
/// overlimit, `D` disabled, `I` init), in GPU order; `-` when the node reports none.
fn gpu_health_text(health: &[u32]) -> String {
    if health.is_empty() {
        return "-".into();
    }
    health
        .iter()
        .map(|&h| match u8::try_from(h).unwrap_or(u8::MAX) {
            model::health::INIT => 'I',
            model::health::HEALTHY => 'H',
            model::health::UNHEALTHY => 'U',
            model::health::OVERLIMIT => 'O',
            model::health::DISABLED => 'D',
            _ => '?',
        })
        .collect()
}

pub async fn nodes(cmd: &NodesCommand) -> anyhow::Result<()> {
    match cmd {
        NodesCommand::Ls(a) => {
            let mut c = connect(&a.conn).await?;
            let nodes = c
                .nodes
                .list(v1::ListNodesRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .nodes;
            if a.conn.json {
                return print_json(&nodes.iter().map(node_json).collect::<Vec<_>>());
            }
            print_node_table(&nodes);
            Ok(())
        }
        NodesCommand::Drain(a) | NodesCommand::Undrain(a) | NodesCommand::Lend(a) => {
            let mut c = connect(&a.conn).await?;
            let name = a.name.clone();
            let n = match cmd {
                NodesCommand::Lend(_) => c.nodes.lend(v1::LendNodeRequest { name }).await,
                NodesCommand::Undrain(_) => c.nodes.undrain(v1::DrainNodeRequest { name }).await,
                _ => c.nodes.drain(v1::DrainNodeRequest { name }).await,
            }
            .map_err(status_error)?
            .into_inner();
            if a.conn.json {
                return print_json(&serde_json::json!({
                    "name": n.name, "state": n.state, "gpus": n.gpus, "gpus_free": n.gpus_free,
                    "on_loan": n.on_loan,
                }));
            }
            let loan = if n.on_loan { " (on loan)" } else { "" };
            println!("node {} {}{loan}", n.name, n.state);
            Ok(())
        }
        NodesCommand::Reclaim(a) => {
            let mut c = connect(&a.conn).await?;
            let r = c
                .nodes
                .reclaim(v1::ReclaimNodesRequest {
                    pool: a.pool.clone(),
                    count: a.count,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.conn.json {
                return print_json(&serde_json::json!({
                    "returned": r.returned, "preempted": r.preempted,
                    "scaled_in": r.scaled_in, "slot": r.slot, "served": r.served,
                    "faults": r.faults,
                }));
            }
            let chooser = if r.served == "native" {
                "the host, smallest count first".to_string()
            } else {
                format!("slot `{}`, {} generation", r.slot, r.served)
            };
            println!(
                "returned {} (chosen by {chooser}); preempted {:?}, scaled in {:?}",
                r.returned.join(", "),
                r.preempted,
                r.scaled_in
            );
            for f in &r.faults {
                println!("  fault: {f}");
            }
            if r.served == "native" && r.faults.is_empty() {
                println!(
                    "  (no policy of slot `{}` answers reclaims: none declares the role, or those \
                     that do are quarantined; to have one choose for every cell: \
                     arbiter policy load builtin:aryl --slot reclaim)",
                    r.slot
                );
            }
            Ok(())
        }
    }
}

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its token (admin).
    Add(TenantAddArgs),
    /// List tenants, quotas and use.
    Ls(ConnOnly),
    /// Remove a tenant without live jobs (admin): its token and policy go.
    Rm(TenantRefArgs),
    /// A new token for a tenant (admin); the old one stops working.
    Rotate(TenantRefArgs),
}

#[derive(Args)]
pub struct TenantRefArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The tenant.
    pub name: String,
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// A new admin or node token (admin); the old one stops working and the
    /// data directory's `admin.token`/`node.token` is rewritten. `node:NAME`
    /// issues (or replaces) a token bound to node NAME.
    Rotate(TokenRotateArgs),
}

#[derive(Args)]
pub struct TokenRotateArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Whose: `admin`, `node` (the shared node token), or `node:NAME` (a token
    /// that registers node NAME only); tenants: `tenant rotate NAME`.
    #[arg(value_parser = parse_token_subject)]
    pub subject: String,
}

fn parse_token_subject(s: &str) -> Result<String, String> {
    match s {
        "admin" | "node" => Ok(s.to_string()),
        _ if s.strip_prefix("node:").is_some_and(|n| !n.is_empty()) => Ok(s.to_string()),
        _ => Err(format!("`{s}`: one of admin, node, node:<name>")),
    }
}

async fn rotate(conn: &Conn, subject: String) -> anyhow::Result<()> {
    let mut c = connect(conn).await?;
    let t = c
        .cluster
        .rotate_token(v1::RotateTokenRequest {
            subject: subject.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if conn.json {
        print_json(&serde_json::json!({"subject": subject, "token": t.token}))
    } else {
        println!("{subject} token: {}", t.token);
        Ok(())
    }
}

pub async fn token_command(cmd: &TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Rotate(a) => rotate(&a.conn, a.subject.clone()).await,
    }
}

#[derive(Args)]
pub struct TenantAddArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The tenant's name (`default` is reserved for jobs without a tenant).
    pub name: String,
    /// GPUs the tenant may hold at once (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub quota_gpus: u32,
}

pub async fn tenant(cmd: &TenantCommand) -> anyhow::Result<()> {
    match cmd {
        TenantCommand::Rm(a) => {
            let mut c = connect(&a.conn).await?;
            c.cluster
                .remove_tenant(v1::TenantRef {
                    name: a.name.clone(),
                })
                .await
                .map_err(status_error)?;
            if a.conn.json {
                print_json(&serde_json::json!({"removed": a.name}))
            } else {
                println!("tenant {} removed", a.name);
                Ok(())
            }
        }
        TenantCommand::Rotate(a) => rotate(&a.conn, format!("tenant:{}", a.name)).await,
        TenantCommand::Add(a) => {
            let mut c = connect(&a.conn).await?;
            let t = c
                .cluster
                .add_tenant(v1::AddTenantRequest {
                    name: a.name.clone(),
                    quota_gpus: a.quota_gpus,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.conn.json {
                print_json(&serde_json::json!({
                    "name": t.name, "quota_gpus": t.quota_gpus, "token": t.token
                }))
            } else {
                println!(
                    "tenant {} (quota {} GPUs) token: {}",
                    t.name, t.quota_gpus, t.token
                );
                Ok(())
            }
        }
        TenantCommand::Ls(a) => {
            let mut c = connect(&a.conn).await?;
            let ts = c
                .cluster
                .list_tenants(v1::ListTenantsRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .tenants;
            if a.conn.json {
                return print_json(
                    &ts.iter()
                        .map(|t| {
                            serde_json::json!({
                                "name": t.name, "quota_gpus": t.quota_gpus,
                                "gpus_in_use": t.gpus_in_use, "policy_slot": t.policy_slot,
                            })
                        })
                        .collect::<Vec<_>>(),
                );
            }
            println!("{:<20} {:>6} {:>6} POLICY", "TENANT", "QUOTA", "USED");
            for t in &ts {
                println!(
                    "{:<20} {:>6} {:>6} {}",
                    t.name, t.quota_gpus, t.gpus_in_use, t.policy_slot
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_garbage() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("42").is_err_and(|e| e.contains("42s") && e.contains("42ms")));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("m").is_err());
    }

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
