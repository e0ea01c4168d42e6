//! What a simulation runs on: the nodes, the tasks with their arrival and
//! run times, and where they came from (a trace, or the built-in example).
//!
//! Everything here is checked once, up front, so the event loop never meets
//! bad input: names are unique, times are in range, and a task that no node
//! could ever hold is set aside as *rejected* with its reason instead of
//! waiting forever.

use anyhow::{Context, bail};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::model::{self, FULL_GPU_MILLI};
use arbiter_traces::openb::{OpenbNode, OpenbPod};
use arbiter_traces::pai::PaiMachine;
use arbiter_traces::philly::PhillyTrace;
use arbiter_traces::{GpuModel, openb, pai, philly};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;
use std::path::Path;

/// GPU memory given to every openb GPU. The trace has no GPU memory column;
/// a multiple of 1000 MiB makes the proportional memory of a sharing task
/// (`gpu_memory_mib = 0` → `gpu_milli`/1000 of the GPU) exact, so memory never
/// binds before milli-GPU does. Same value as placement-core's FGD harness.
pub const OPENB_GPU_MEMORY_MIB: u32 = 32_000;

/// CPU given to each Philly GPU (the trace has no CPU column): below every
/// PAI machine's per-GPU share (32 cores per 2-GPU P100 machine, 12 per
/// 8-GPU machine), so GPUs are the binding dimension, as in the trace.
pub const PHILLY_CPU_MILLI_PER_GPU: u32 = 4_000;
/// Memory given to each Philly GPU; below every PAI machine's per-GPU share.
pub const PHILLY_MEMORY_MIB_PER_GPU: u32 = 16_384;

/// One task of a scenario.
#[derive(Clone, Debug)]
pub struct SimTask {
    pub request: JobRequest,
    /// Arrival in virtual milliseconds from the scenario's start.
    pub arrival_ms: u64,
    /// Run time once started; `None` = never departs (static placement).
    pub duration_ms: Option<u64>,
    /// Position in the source file (the FGD protocol shuffles file order).
    pub file_index: usize,
}

impl SimTask {
    /// Milli-GPU taken from each of the task's GPUs (0 for a CPU-only task).
    pub fn gpu_milli_per_gpu(&self) -> u64 {
        let r = &self.request;
        let per_gpu = match r.gpus_per_worker {
            0 => 0,
            1 => r.gpu_milli.min(FULL_GPU_MILLI),
            _ => FULL_GPU_MILLI,
        };
        u64::from(per_gpu)
    }

    /// Total GPU request in milli-GPU.
    pub fn gpu_milli_total(&self) -> u64 {
        let r = &self.request;
        u64::from(r.workers) * u64::from(r.gpus_per_worker) * self.gpu_milli_per_gpu()
    }

    /// Whole GPUs' worth of request, for reports.
    pub fn gpus(&self) -> f64 {
        self.gpu_milli_total() as f64 / f64::from(FULL_GPU_MILLI)
    }
}

/// A task set aside before the run because no node could ever hold it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Rejected {
    pub task: String,
    pub reason: String,
}

/// Where a scenario came from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// The seeded synthetic example cluster and workload.
    BuiltIn,
    /// openb nodes and pods (Alibaba GPU-sharing trace).
    Openb,
    /// Philly jobs on the PAI cluster (or on openb nodes).
    Philly,
    /// The workload a live control plane recorded in its decision journal.
    Journal,
}

/// Nodes + tasks, validated.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub source: Source,
    pub nodes: Vec<NodeRequest>,
    /// Sorted by arrival (stable: file order among equal times).
    pub tasks: Vec<SimTask>,
    pub rejected: Vec<Rejected>,
    /// The tasks of `rejected` that no node could ever hold, as the trace
    /// gave them (model constraints intact): a protocol that counts them,
    /// like the FGD paper's, offers them and records their failure.
    pub unplaceable: Vec<SimTask>,
}

impl Scenario {
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpu_count)).sum()
    }

    /// A host state holding the scenario's nodes (and no jobs yet).
    pub fn cluster_state(&self) -> anyhow::Result<ClusterState> {
        let mut state = ClusterState::new();
        for node in &self.nodes {
            state
                .add_node(node.clone())
                .with_context(|| format!("adding node `{}`", node.name))?;
        }
        Ok(state)
    }

    pub fn gpu_capacity_milli(&self) -> u64 {
        self.gpu_count() * u64::from(FULL_GPU_MILLI)
    }

    /// Checks names and feasibility; sorts tasks by arrival. Infeasible
    /// tasks move to `rejected`.
    pub fn finish(mut self) -> anyhow::Result<Self> {
        if self.nodes.is_empty() {
            bail!("scenario `{}` has no nodes", self.name);
        }
        if self.tasks.is_empty() && self.rejected.is_empty() {
            bail!("scenario `{}` has no tasks (empty trace?)", self.name);
        }
        let mut names = HashSet::new();
        for n in &self.nodes {
            if !names.insert(n.name.as_str()) {
                bail!("duplicate node name `{}`", n.name);
            }
        }
        let mut names = HashSet::new();
        for t in &self.tasks {
            if !names.insert(t.request.name.as_str()) {
                bail!("duplicate task name `{}`", t.request.name);
            }
        }
        let models: HashSet<&str> = self
            .nodes
            .iter()
            .filter(|n| n.gpu_count > 0)
            .map(|n| n.gpu_model.as_str())
            .collect();
        let mut kept = Vec::with_capacity(self.tasks.len());
        for mut task in std::mem::take(&mut self.tasks) {
            let as_given = task.clone();
            // A model listed in a constraint that no node has cannot matter for
            // placement; dropping it keeps the host's model table to the real ones.
            let listed = task.request.gpu_models.len();
            task.request
                .gpu_models
                .retain(|m| models.contains(m.as_str()));
            if listed > 0 && task.request.gpu_models.is_empty() {
                self.rejected.push(Rejected {
                    task: task.request.name.clone(),
                    reason: "no node has any of the GPU models the task allows".into(),
                });
                self.unplaceable.push(as_given);
                continue;
            }
            match infeasible(&task.request, &self.nodes) {
                Some(reason) => {
                    self.rejected.push(Rejected {
                        task: task.request.name.clone(),
                        reason,
                    });
                    self.unplaceable.push(as_given);
                }
                None => kept.push(task),
            }
        }
        kept.sort_by_key(|t| t.arrival_ms);
        self.tasks = kept;
        Ok(self)
    }
}

/// Why no node (or too few nodes) could ever hold the task, if so.
fn infeasible(r: &JobRequest, nodes: &[NodeRequest]) -> Option<String> {
    let allowed = |n: &NodeRequest| r.gpu_models.is_empty() || r.gpu_models.contains(&n.gpu_model);
    let fits = |n: &NodeRequest| {
        n.cpu_milli >= r.cpu_milli
            && n.memory_mib >= r.memory_mib
            && (r.gpus_per_worker == 0 || (n.gpu_count >= r.gpus_per_worker && allowed(n)))
            && (r.gpu_memory_mib == 0 || n.gpu_memory_mib >= r.gpu_memory_mib)
    };
    // How many workers fit on an empty node, summed over nodes: a gang needs `workers`.
    let mut room: u64 = 0;
    for n in nodes.iter().filter(|n| fits(n)) {
        // A zero request never limits the count.
        let by_cpu = n
            .cpu_milli
            .checked_div(r.cpu_milli)
            .map_or(u64::MAX, u64::from);
        let by_mem = n
            .memory_mib
            .checked_div(r.memory_mib)
            .map_or(u64::MAX, u64::from);
        let by_gpu = if r.gpus_per_worker == 0 {
            u64::MAX
        } else if r.gpus_per_worker == 1 && r.gpu_milli < FULL_GPU_MILLI {
            u64::from(n.gpu_count) * u64::from(FULL_GPU_MILLI / r.gpu_milli.max(1))
        } else {
            u64::from(n.gpu_count / r.gpus_per_worker)
        };
        room = room.saturating_add(by_cpu.min(by_mem).min(by_gpu));
        if room >= u64::from(r.workers) {
            return None;
        }
    }
    Some(if room == 0 {
        format!(
            "no node can hold one worker ({} milli-CPU, {} MiB, {} GPU(s){})",
            r.cpu_milli,
            r.memory_mib,
            r.gpus_per_worker,
            if r.gpu_models.is_empty() {
                String::new()
            } else {
                format!(" of {}", r.gpu_models.join("|"))
            }
        )
    } else {
        format!(
            "the whole cluster holds only {room} of its {} workers",
            r.workers
        )
    })
}

fn base_job(name: String) -> JobRequest {
    JobRequest {
        name,
        tenant: "default".into(),
        kind: model::job_kind::TRAINING,
        qos: model::qos::GUARANTEED,
        priority: 0,
        workers: 1,
        min_workers: 1,
        max_workers: 1,
        cpu_milli: 0,
        memory_mib: 0,
        gpus_per_worker: 0,
        gpu_milli: 0,
        gpu_memory_mib: 0,
        gpu_models: Vec::new(),
        estimate_ms: 0,
        deadline_ms: 0,
        checkpointed: true,
    }
}

/// An openb node as the host's node request.
pub fn openb_node(n: &OpenbNode) -> NodeRequest {
    NodeRequest {
        name: n.name.clone(),
        pool: "default".into(),
        cpu_milli: n.cpu_milli,
        memory_mib: n.memory_mib,
        gpu_model: n
            .gpu_model
            .map_or(String::new(), |m| m.as_str().to_string()),
        gpu_memory_mib: if n.gpu_count > 0 {
            OPENB_GPU_MEMORY_MIB
        } else {
            0
        },
        gpu_count: n.gpu_count,
        on_loan: false,
    }
}

/// An openb pod as a one-worker job request named `name`.
pub fn openb_job(pod: &OpenbPod, name: String) -> JobRequest {
    let mut r = base_job(name);
    r.cpu_milli = pod.cpu_milli;
    r.memory_mib = pod.memory_mib;
    r.gpus_per_worker = pod.num_gpu;
    r.gpu_milli = match pod.num_gpu {
        0 => 0,
        1 => pod.gpu_milli.clamp(1, FULL_GPU_MILLI),
        _ => FULL_GPU_MILLI,
    };
    r.gpu_models = pod
        .gpu_spec
        .iter()
        .map(|m| m.as_str().to_string())
        .collect();
    if matches!(pod.qos, Some(openb::Qos::BestEffort)) {
        r.qos = model::qos::BEST_EFFORT;
    }
    r
}

/// A PAI machine as the host's node request.
pub fn pai_node(m: &PaiMachine) -> NodeRequest {
    let gpu_memory_mib = match m.gpu_model {
        Some(GpuModel::V100M32) => 32_768,
        Some(GpuModel::T4) => 15_360,
        Some(_) => 16_384,
        None => 0,
    };
    NodeRequest {
        name: m.name.clone(),
        pool: "default".into(),
        cpu_milli: m.cpu_cores.saturating_mul(1000),
        memory_mib: m.memory_gib.saturating_mul(1024),
        gpu_model: m
            .gpu_model
            .map_or(String::new(), |g| g.as_str().to_string()),
        gpu_memory_mib,
        gpu_count: m.gpu_count,
        on_loan: false,
    }
}

/// Splits a job of `gpus` GPUs into a gang of equal workers for servers of
/// `per_node` GPUs — the one rule every workload model uses. A job that fits
/// one server is one worker; a larger one gets workers of the largest size
/// that divides both the job and the server, so workers tile servers with
/// no stranded GPUs (12 GPUs on 8-GPU servers: 3 × 4, not 2 × 6).
pub fn gang_shape(gpus: u32, per_node: u32) -> (u32, u32) {
    let per_node = per_node.max(1);
    if gpus <= per_node {
        return (1, gpus.max(1));
    }
    let per_worker = (1..=per_node)
        .rev()
        .find(|d| gpus.is_multiple_of(*d) && per_node.is_multiple_of(*d))
        .unwrap_or(1);
    (gpus / per_worker, per_worker)
}

/// What kind of file a path holds, from its header line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// openb pod list (`name,cpu_milli,...`).
    Openb,
    /// Philly job table (`timestamp,duration,num_gpus,...`).
    Philly,
}

impl std::str::FromStr for TraceFormat {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "openb" => Ok(TraceFormat::Openb),
            "philly" => Ok(TraceFormat::Philly),
            other => bail!("unknown trace format `{other}` (openb or philly)"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeFormat {
    Openb,
    Pai,
}

/// The header's columns, read as the loaders read them, and the header as one line for
/// an error message. An empty file is an error of its own.
fn header(path: &Path) -> anyhow::Result<(Vec<String>, String)> {
    let columns = arbiter_traces::header_columns(path)?;
    let line = columns.join(",");
    Ok((columns, line))
}

fn has(columns: &[String], name: &str) -> bool {
    columns.iter().any(|c| c == name)
}

/// Detects a trace's format from its header.
pub fn detect_trace(path: &Path) -> anyhow::Result<TraceFormat> {
    let (c, h) = header(path)?;
    if has(&c, "timestamp") && has(&c, "num_gpus") {
        Ok(TraceFormat::Philly)
    } else if has(&c, "name") && has(&c, "num_gpu") {
        Ok(TraceFormat::Openb)
    } else {
        bail!(
            "{}: unrecognised trace header `{h}` (expected an openb pod list or the Philly job table)",
            path.display()
        )
    }
}

fn detect_nodes(path: &Path) -> anyhow::Result<NodeFormat> {
    let (c, h) = header(path)?;
    if has(&c, "sn") && has(&c, "gpu") {
        Ok(NodeFormat::Openb)
    } else if has(&c, "machine") && has(&c, "cap_gpu") {
        Ok(NodeFormat::Pai)
    } else {
        bail!(
            "{}: unrecognised node list header `{h}` (expected openb `sn,...` or PAI `machine,...`)",
            path.display()
        )
    }
}

/// Loads a node list (openb or PAI, by header).
pub fn load_nodes(path: &Path) -> anyhow::Result<Vec<NodeRequest>> {
    Ok(match detect_nodes(path)? {
        NodeFormat::Openb => openb::load_nodes(path)?.iter().map(openb_node).collect(),
        NodeFormat::Pai => pai::load_machines(path)?.iter().map(pai_node).collect(),
    })
}

/// openb pods with their creation/deletion times (seconds → ms, relative
/// to the earliest creation). Pods of a variant without time columns arrive
/// at 0 and never depart.
pub fn openb_tasks(pods: &[OpenbPod]) -> Vec<SimTask> {
    let t0 = pods
        .iter()
        .filter_map(|p| p.times.map(|t| t.creation))
        .min()
        .unwrap_or(0);
    pods.iter()
        .enumerate()
        .map(|(file_index, p)| SimTask {
            file_index,
            request: openb_job(p, p.name.clone()),
            arrival_ms: p
                .times
                .map_or(0, |t| (t.creation - t0).saturating_mul(1000)),
            duration_ms: p.times.map(|t| t.lifetime().saturating_mul(1000)),
        })
        .collect()
}

/// Philly jobs, duration-based departures; `per_node` is the most GPUs a
/// worker may take (the largest node's GPU count).
pub fn philly_tasks(trace: &PhillyTrace, per_node: u32) -> Vec<SimTask> {
    let t0 = trace.jobs.iter().map(|j| j.submit_time).min().unwrap_or(0);
    trace
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let (workers, per_worker) = gang_shape(j.num_gpus, per_node);
            let mut r = base_job(format!("philly-{i}"));
            r.tenant = trace.cluster_name(j).unwrap_or("default").to_string();
            r.workers = workers;
            r.min_workers = workers;
            r.max_workers = workers;
            r.gpus_per_worker = per_worker;
            r.gpu_milli = FULL_GPU_MILLI;
            r.cpu_milli = PHILLY_CPU_MILLI_PER_GPU * per_worker;
            r.memory_mib = PHILLY_MEMORY_MIB_PER_GPU * per_worker;
            // Seconds since the earliest job; the loader guarantees a valid date.
            let offset = u64::try_from(j.submit_time - t0).unwrap_or(0);
            SimTask {
                request: r,
                arrival_ms: offset.saturating_mul(1000),
                duration_ms: Some((j.duration_secs * 1000.0).round() as u64),
                file_index: i,
            }
        })
        .collect()
}

/// Builds the scenario a set of flags names.
pub fn from_files(
    nodes: Option<&Path>,
    trace: Option<&Path>,
    format: Option<TraceFormat>,
) -> anyhow::Result<Scenario> {
    let Some(trace) = trace else {
        if nodes.is_some() {
            bail!(
                "--nodes needs --trace (the tasks to place); with neither, the built-in example runs"
            );
        }
        return Ok(builtin_example(42));
    };
    let format = match format {
        Some(f) => f,
        None => detect_trace(trace)?,
    };
    let name = trace.file_name().map_or_else(
        || trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    match format {
        TraceFormat::Openb => {
            let nodes_path = match nodes {
                Some(p) => p.to_path_buf(),
                None => arbiter_traces::trace_file(openb::GPU_NODES_FILE).context(
                    "--trace with an openb pod list needs --nodes (or the shared traces folder)",
                )?,
            };
            let nodes = load_nodes(&nodes_path)?;
            let pods = openb::load_pods(trace)?;
            let tasks = openb_tasks(&pods);
            Scenario {
                name,
                source: Source::Openb,
                nodes,
                tasks,
                rejected: Vec::new(),
                unplaceable: Vec::new(),
            }
            .finish()
        }
        TraceFormat::Philly => {
            let nodes_path = match nodes {
                Some(p) => p.to_path_buf(),
                None => arbiter_traces::trace_file(pai::MACHINE_SPEC_FILE).context(
                    "--trace with Philly jobs needs --nodes (or the shared traces folder)",
                )?,
            };
            let nodes = load_nodes(&nodes_path)?;
            let trace_data = philly::load_jobs(trace)?;
            let per_node = nodes.iter().map(|n| n.gpu_count).max().unwrap_or(1);
            let tasks = philly_tasks(&trace_data, per_node);
            Scenario {
                name,
                source: Source::Philly,
                nodes,
                tasks,
                rejected: Vec::new(),
                unplaceable: Vec::new(),
            }
            .finish()
        }
    }
}

/// The built-in example: 16 heterogeneous 8-GPU nodes and 320 seeded jobs
/// (fractional GPUs, whole GPUs, gangs, model-constrained and CPU-only
/// tasks) arriving over about three hours at roughly 95% offered GPU load,
/// running 1 to 90 minutes each. Small enough to run in well under a second.
pub fn builtin_example(seed: u64) -> Scenario {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let shapes: [(&str, u32, u32, u32, u32); 3] = [
        // model, count, cpu cores, memory GiB, GPU memory MiB
        ("A100", 6, 128, 1024, 81_920),
        ("V100M32", 6, 96, 768, 32_768),
        ("T4", 4, 64, 384, 15_360),
    ];
    let mut nodes = Vec::new();
    for (model, count, cores, gib, gpu_mem) in shapes {
        for i in 0..count {
            nodes.push(NodeRequest {
                name: format!("{}-{i:02}", model.to_lowercase()),
                pool: "default".into(),
                cpu_milli: cores * 1000,
                memory_mib: gib * 1024,
                gpu_model: model.into(),
                gpu_memory_mib: gpu_mem,
                gpu_count: 8,
                on_loan: false,
            });
        }
    }
    let tenants = ["vision", "nlp", "speech", "recsys"];
    let mut tasks = Vec::new();
    let mut t_ms: u64 = 0;
    for i in 0..320 {
        // Poisson arrivals 35 s apart on average: about 95% offered GPU load.
        let gap: f64 = -35_000.0 * (1.0 - rng.random::<f64>()).ln();
        t_ms += gap as u64;
        let mut r = base_job(format!("job-{i:03}"));
        r.tenant = tenants[rng.random_range(0..tenants.len())].into();
        let kind = rng.random_range(0..100);
        let (workers, per_worker, milli) = match kind {
            0..=34 => (1, 1, [250, 500, 500, 750][rng.random_range(0..4)]),
            35..=64 => (1, [1, 1, 2, 4][rng.random_range(0..4)], FULL_GPU_MILLI),
            65..=79 => (1, 8, FULL_GPU_MILLI),
            80..=91 => (
                [2, 2, 4][rng.random_range(0..3)],
                [4, 8][rng.random_range(0..2)],
                FULL_GPU_MILLI,
            ),
            _ => (1, 0, 0),
        };
        r.workers = workers;
        r.min_workers = workers;
        r.max_workers = workers;
        r.gpus_per_worker = per_worker;
        r.gpu_milli = milli;
        r.cpu_milli = 2_000 + 4_000 * per_worker.max(1);
        r.memory_mib = 8_192 * per_worker.max(1);
        if per_worker == 0 {
            r.cpu_milli = 8_000;
            r.memory_mib = 32_768;
            r.kind = model::job_kind::INFERENCE;
        }
        if per_worker > 0 && rng.random_range(0..10) == 0 {
            // Some tasks insist on the big GPUs.
            r.gpu_models = vec!["A100".into()];
        }
        // Log-uniform durations from 1 minute to 90 minutes.
        let minutes = (rng.random::<f64>() * 90f64.ln()).exp();
        let duration = (minutes * 60_000.0) as u64;
        r.estimate_ms = duration;
        tasks.push(SimTask {
            request: r,
            arrival_ms: t_ms,
            duration_ms: Some(duration),
            file_index: i,
        });
    }
    let scenario = Scenario {
        name: "built-in example".into(),
        source: Source::BuiltIn,
        nodes,
        tasks,
        rejected: Vec::new(),
        unplaceable: Vec::new(),
    };
    // Generated names and shapes are valid by construction; `finish` only sorts.
    match scenario.clone().finish() {
        Ok(s) => s,
        Err(_) => scenario,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gang_shapes_divide_evenly() {
        assert_eq!(gang_shape(1, 8), (1, 1));
        assert_eq!(gang_shape(8, 8), (1, 8));
        assert_eq!(gang_shape(16, 8), (2, 8));
        assert_eq!(gang_shape(12, 8), (3, 4));
        assert_eq!(gang_shape(10, 8), (5, 2));
        assert_eq!(gang_shape(128, 8), (16, 8));
        assert_eq!(gang_shape(11, 8), (11, 1));
        assert_eq!(gang_shape(9, 6), (3, 3));
    }

    #[test]
    fn builtin_is_deterministic_and_feasible() {
        let a = builtin_example(42);
        let b = builtin_example(42);
        assert_eq!(a.tasks.len(), 320);
        assert!(a.rejected.is_empty());
        assert_eq!(
            a.tasks
                .iter()
                .map(|t| (t.arrival_ms, t.duration_ms))
                .collect::<Vec<_>>(),
            b.tasks
                .iter()
                .map(|t| (t.arrival_ms, t.duration_ms))
                .collect::<Vec<_>>()
        );
    }
}
