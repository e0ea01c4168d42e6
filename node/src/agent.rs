//! The node agent: the link between one [`Node`] and the control plane (`arbiter serve`).
//!
//! The agent holds one gRPC stream (`arbiter.v1.NodeLink/Session`) to the host and runs the
//! node-local control loop next to it:
//!
//! * **Registration.** On every (re)connect — with back-off, 100 ms doubling to 5 s — the first
//!   message is a `NodeHello`: the node's GPUs (from the [`GpuBackend`](crate::GpuBackend)),
//!   CPU and memory, and the workloads the supervisor still runs (launched by this agent or
//!   adopted after a restart) plus the jobs that finished recently (`running: false` with
//!   their exit code), so a finish the host missed while the link was down is not lost. The
//!   host answers `Welcome` with the heartbeat period.
//! * **Launch.** One supervised workload **per GPU of the launch** (the supervisor pins one
//!   GPU per workload: `CUDA_VISIBLE_DEVICES`, one control block, one memory quota), all with
//!   the launch's command, the per-GPU memory quota (MiB → bytes; 0 = unlimited), the compute
//!   share and the role, under the interposer (`LD_PRELOAD`, as the supervisor always does).
//!   Each workload gets `ARBITER_JOB_ID`, `ARBITER_JOB_NAME`, `ARBITER_RANK`,
//!   `ARBITER_LOCAL_RANK` and `ARBITER_WORLD_SIZE` in its environment — ranks and world size
//!   are the job's across all its nodes (the launch's `rank_base` and `world_size`), the local
//!   rank is the node's — and its persisted record carries the tag `job-<id>/<rank>` so an
//!   agent restarted on the same state dir knows which job an adopted workload belongs to. A
//!   launch for a job whose stopped run is still draining (a relaunch after a resize or a
//!   migration) starts the new run; the old run's exits are not counted against it. All started → `STARTED`; anything refused (a GPU the node does not
//!   have, an empty command, a quota that does not fit, a spawn error) → the ranks already
//!   started are evicted and the job gets `FAILED_TO_START` with the cause.
//! * **Exit.** When every rank has exited the job gets `EXITED` with the first non-zero exit
//!   code (0 if all succeeded; `128 + n` for death by signal n; `-1` when the status is unknown
//!   because the workload was adopted after an agent restart and is not our child). A rank
//!   that fails makes the agent evict its siblings.
//! * **Update** (contract 0.3's G25). A running job's new terms — role, QoS, per-GPU memory
//!   quota, compute share, MPS thread % (next client start), request/limit — applied to every
//!   rank's control block and record, answered by an `UpdateAck` with the update's `seq`. A
//!   quota lowered below what a rank holds is not taken back: its next allocations are refused
//!   until use falls below it (counted as `quota_denials`, which the coordinator sees).
//! * **Stop.** Graceful eviction of every rank (`FLAG_EXIT`, `SIGTERM`, `SIGKILL` after the
//!   grace period); nothing is reported for a stopped job. Unknown job ids are ignored.
//! * **Coordinator.** Every control period the [`Coordinator`] (the built-in `sysmonitor` Wasm
//!   policy by default) runs against the node; a workload it evicts makes the agent evict the
//!   job's other ranks and report `EVICTED` once they are gone (the host reschedules it).
//! * **Heartbeat.** Every `heartbeat_ms` a `Heartbeat` with one `GpuSample` per GPU and the
//!   host's load (CPU %, memory, swap-ins per second over the period, from `/proc`).
//!
//! The control loop runs on its own thread (so it keeps enforcing while the link is down);
//! the link runs on a current-thread tokio runtime; both share the [`Node`] behind a mutex.
//! Stopping the agent leaves the workloads running: the next agent adopts them.

use crate::coordinator::Coordinator;
use crate::enforcer::Node;
use crate::hostload::HostSampler;
use crate::supervisor::{ExitOutcome, ExitReport, ShareTerms, WorkloadSpec};
use anyhow::Context;
use arbiter_policy_sdk::model::{JobMetric, NodeAction, health, qos};
use arbiter_proto::v1;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

const MIB: u64 = 1 << 20;
/// Finished jobs remembered for the next `NodeHello`.
const RECENT_FINISHED: usize = 256;

/// Called once per successful registration with the registration count (1 for the first).
pub type RegisteredHook = Arc<dyn Fn(u64) + Send + Sync>;

/// Node agent settings.
#[derive(Clone)]
pub struct AgentConfig {
    /// Control plane URL (`http://host:port`; `http://` is assumed without a scheme).
    pub server: String,
    /// Bearer token: the control plane's node token (or the admin token).
    pub token: String,
    /// Node name (unique in the cluster).
    pub name: String,
    /// Pool the node joins (empty: the host's default).
    pub pool: String,
    /// CPU reported to the host (milli-CPU); `None`: the machine's.
    pub cpu_milli: Option<u32>,
    /// Memory reported to the host (MiB); `None`: the machine's.
    pub memory_mib: Option<u32>,
    /// Control period of the coordinator (and of reaping exits).
    pub control_period: Duration,
    /// First reconnect delay; doubled after each failure up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Connect (and registration) timeout.
    pub connect_timeout: Duration,
    /// CA certificate (PEM) to trust for an `https://` server; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Extra environment for every workload (on top of the agent's own, which is inherited).
    pub workload_env: Vec<(String, String)>,
    /// Called after every successful registration.
    pub on_registered: Option<RegisteredHook>,
    /// This agent's identity across restarts ([`instance_id`] of its state directory; a fresh
    /// one per process by default): the host refuses a second agent of the same name while
    /// this one is connected, and lets this one reconnect at once.
    pub instance: String,
    /// Host spill for opportunistic work (AntMan's universal memory): each workload of a job
    /// with QoS ≥ 1 may hold this much host memory beyond its GPU memory limit (0: none).
    /// Guaranteed work never spills: its memory is what it was promised.
    pub host_spill_mib: u32,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("server", &self.server)
            .field("name", &self.name)
            .field("pool", &self.pool)
            .field("control_period", &self.control_period)
            .finish_non_exhaustive()
    }
}

impl AgentConfig {
    pub fn new(server: &str, token: &str, name: &str) -> AgentConfig {
        AgentConfig {
            server: server.to_string(),
            token: token.to_string(),
            name: name.to_string(),
            pool: String::new(),
            cpu_milli: None,
            memory_mib: None,
            control_period: crate::coordinator::DEFAULT_PERIOD,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            ca_pem: None,
            workload_env: Vec::new(),
            on_registered: None,
            instance: fresh_instance(),
            host_spill_mib: 0,
        }
    }
}

/// The agent instance id kept in `state_dir/agent-instance`, made on first use: 128 random
/// bits in hex. It tells the host that a reconnecting agent is the one it knew, not another
/// machine given the same name; it is not a credential (the node token is).
pub fn instance_id(state_dir: &Path) -> anyhow::Result<String> {
    let path = state_dir.join("agent-instance");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let id = fresh_instance();
    std::fs::write(&path, &id).with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

fn fresh_instance() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if random.is_err() {
        // No urandom: unique enough to tell two agents apart (it is no secret).
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One job on this node: its ranks (one workload per GPU).
#[derive(Debug, Default)]
struct Job {
    name: String,
    /// Live workloads (supervisor ids).
    workloads: BTreeSet<u32>,
    /// Pid of rank 0 (reported in `NodeHello`).
    pid: u32,
    /// First non-zero exit code (or 0).
    code: Option<i32>,
    /// The host asked to stop it: report nothing.
    stopped: bool,
    /// The coordinator evicted it: report `EVICTED` with this message.
    evicted: Option<String>,
    /// How the deciding rank ended (for the event message).
    how: String,
    /// The host's number for this run (`Launch.launch_seq`), echoed on its
    /// events so that the host can tell a replaced run's from the current's.
    launch_seq: u64,
}

/// What the agent shares between its control thread and its link.
struct State {
    node: Node,
    jobs: BTreeMap<u64, Job>,
    by_workload: HashMap<u32, u64>,
    /// Recently finished jobs (job, exit code), for the next hello.
    finished: VecDeque<(u64, i32)>,
    workload_env: Vec<(String, String)>,
    /// Host spill each opportunistic workload is given (bytes; 0 none).
    host_spill_bytes: u64,
    /// Host load for heartbeats (rates over the heartbeat period).
    host: HostSampler,
}

fn event(
    job_id: u64,
    launch_seq: u64,
    kind: v1::WorkloadEventKind,
    exit_code: i32,
    message: String,
) -> v1::NodeMessage {
    v1::NodeMessage {
        body: Some(v1::node_message::Body::Event(v1::WorkloadEvent {
            job_id,
            kind: kind as i32,
            exit_code,
            message,
            launch_seq,
        })),
    }
}

/// `job-<id>/<rank>` → `id`.
fn job_of_tag(tag: &str) -> Option<u64> {
    let rest = tag.strip_prefix("job-")?;
    let id = rest.split('/').next()?;
    id.parse().ok()
}

impl State {
    fn new(node: Node, config: &AgentConfig) -> State {
        let mut s = State {
            node,
            jobs: BTreeMap::new(),
            by_workload: HashMap::new(),
            finished: VecDeque::new(),
            workload_env: config.workload_env.clone(),
            host_spill_bytes: u64::from(config.host_spill_mib) << 20,
            host: HostSampler::default(),
        };
        // Workloads adopted from the state dir: rebuild the job table from their tags.
        let adopted: Vec<(u32, u64, u32)> = s
            .node
            .supervisor()
            .workloads()
            .filter_map(|w| {
                let r = w.record();
                Some((r.id, job_of_tag(r.tag.as_deref()?)?, r.pid))
            })
            .collect();
        for (wid, job_id, pid) in adopted {
            let job = s.jobs.entry(job_id).or_default();
            if job.workloads.is_empty() {
                job.pid = pid;
            }
            job.workloads.insert(wid);
            s.by_workload.insert(wid, job_id);
            tracing::info!(job = job_id, workload = wid, pid, "adopted job workload");
        }
        s
    }

    fn hello(&self, cfg: &AgentConfig) -> v1::NodeHello {
        let backend = self.node.backend();
        let count = backend.device_count().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot enumerate GPUs");
            0
        });
        let gpus = (0..count)
            .map(|index| match backend.device_info(index) {
                Ok(i) => v1::GpuInfo {
                    index,
                    model: i.name,
                    memory_mib: u32::try_from(i.memory_total_bytes / MIB).unwrap_or(u32::MAX),
                },
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "GPU info");
                    v1::GpuInfo {
                        index,
                        model: String::new(),
                        memory_mib: 0,
                    }
                }
            })
            .collect();
        let mut workloads: Vec<v1::WorkloadReport> = self
            .finished
            .iter()
            .filter(|(id, _)| !self.jobs.contains_key(id))
            .map(|&(job_id, code)| v1::WorkloadReport {
                job_id,
                pid: 0,
                running: false,
                exit_code: code,
            })
            .collect();
        workloads.extend(
            self.jobs
                .iter()
                .filter(|(_, j)| !j.stopped && j.evicted.is_none())
                .map(|(&job_id, j)| v1::WorkloadReport {
                    job_id,
                    pid: j.pid,
                    running: true,
                    exit_code: 0,
                }),
        );
        v1::NodeHello {
            name: cfg.name.clone(),
            pool: cfg.pool.clone(),
            cpu_milli: cfg.cpu_milli.unwrap_or_else(machine_cpu_milli),
            memory_mib: cfg.memory_mib.unwrap_or_else(machine_memory_mib),
            gpus,
            workloads,
            instance: cfg.instance.clone(),
        }
    }

    fn heartbeat(&mut self, seq: u64) -> v1::Heartbeat {
        let backend = self.node.backend();
        let count = backend.device_count().unwrap_or(0);
        let gpus = (0..count)
            .map(|index| match backend.sample(index) {
                Ok(s) => {
                    let per_process: Option<u32> = s
                        .processes
                        .iter()
                        .filter_map(|p| p.sm_util_pct.map(u32::from))
                        .reduce(|a, b| a + b);
                    v1::GpuSample {
                        index,
                        utilization_pct: u32::from(s.utilization_pct),
                        sm_activity_pct: per_process
                            .map_or(u32::from(s.utilization_pct), |v| v.min(100)),
                        memory_used_mib: u32::try_from(s.memory_used_bytes / MIB)
                            .unwrap_or(u32::MAX),
                        // What the node policy published (overlimit, disabled…),
                        // so the host stops placing new work on that GPU's node.
                        health: u32::from(
                            self.node.published_health(index).unwrap_or(health::HEALTHY),
                        ),
                    }
                }
                Err(e) => {
                    tracing::debug!(gpu = index, error = %e, "GPU sample for heartbeat");
                    v1::GpuSample {
                        index,
                        health: u32::from(health::UNHEALTHY),
                        ..Default::default()
                    }
                }
            })
            .collect();
        let load = self.host.sample();
        v1::Heartbeat {
            seq,
            gpus,
            jobs: self.job_samples(),
            host: Some(v1::HostLoad {
                cpu_utilization_pct: u32::from(load.cpu_utilization_pct),
                memory_used_mib: load.memory_used_mib,
                memory_total_mib: load.memory_total_mib,
                swap_in_per_s: load.swap_in_per_s,
            }),
        }
    }

    /// Each running job's statistics since the previous heartbeat, its workloads (ranks)
    /// combined by the contract's per-worker rule.
    fn job_samples(&mut self) -> Vec<v1::JobSample> {
        let stats = self.node.take_stats();
        self.jobs
            .iter()
            .filter(|(_, j)| !j.stopped)
            .filter_map(|(&job_id, j)| {
                let samples: Vec<_> = j.workloads.iter().filter_map(|w| stats.get(w)).collect();
                // The most constrained worker's limits.
                let tightest = |f: fn(&crate::jobstats::Enforced) -> u32| {
                    samples.iter().map(|s| f(&s.enforced)).min().unwrap_or(0)
                };
                let memory_limit_mib = tightest(|e| e.memory_limit_mib);
                let compute_share_permille = tightest(|e| e.compute_share_permille);
                let m = samples
                    .iter()
                    .map(|s| JobMetric {
                        job: 0,
                        iteration_ms: s.iteration_ms,
                        peak_memory_mib: s.peak_memory_mib,
                        min_memory_mib: s.min_memory_mib,
                        host_memory_mib: s.host_memory_mib,
                        utilization_pct: s.utilization_pct,
                        ..JobMetric::default()
                    })
                    .reduce(JobMetric::combine)?;
                Some(v1::JobSample {
                    job_id,
                    iteration_ms: m.iteration_ms,
                    peak_memory_mib: m.peak_memory_mib,
                    min_memory_mib: m.min_memory_mib,
                    utilization_pct: u32::from(m.utilization_pct),
                    host_memory_mib: m.host_memory_mib,
                    memory_limit_mib,
                    compute_share_permille,
                })
            })
            .collect()
    }

    /// Carry out a `Launch`; returns the event to send.
    fn launch(&mut self, l: &v1::Launch) -> v1::NodeMessage {
        let span = tracing::info_span!("launch", job = l.job_id, name = %l.name);
        let _g = span.enter();
        if let Some(j) = self.jobs.get_mut(&l.job_id)
            && !j.stopped
            && j.evicted.is_none()
        {
            tracing::info!("already running here; launch ignored");
            // The host now knows this run by the new launch's number.
            j.launch_seq = l.launch_seq;
            return event(
                l.job_id,
                l.launch_seq,
                v1::WorkloadEventKind::Started,
                0,
                "already running".into(),
            );
        }
        match self.try_launch(l) {
            Ok(n) => {
                tracing::info!(ranks = n, "job started");
                event(
                    l.job_id,
                    l.launch_seq,
                    v1::WorkloadEventKind::Started,
                    0,
                    format!("{n} workload(s)"),
                )
            }
            Err(message) => {
                tracing::warn!(%message, "job failed to start");
                event(
                    l.job_id,
                    l.launch_seq,
                    v1::WorkloadEventKind::FailedToStart,
                    0,
                    message,
                )
            }
        }
    }

    fn try_launch(&mut self, l: &v1::Launch) -> Result<usize, String> {
        if l.command.is_empty() || l.command[0].is_empty() {
            return Err("empty command".into());
        }
        if l.gpus.is_empty() {
            return Err("the launch names no GPU".into());
        }
        let count = self
            .node
            .backend()
            .device_count()
            .map_err(|e| format!("cannot enumerate GPUs: {e}"))?;
        let mut seen = BTreeSet::new();
        for &g in &l.gpus {
            if g >= count {
                return Err(format!(
                    "GPU {g} does not exist on this node ({count} GPUs)"
                ));
            }
            if !seen.insert(g) {
                return Err(format!("GPU {g} named twice"));
            }
        }
        let role = if l.role == 0 { 0 } else { 1 };
        let share = match l.compute_share_permille {
            0 => 1000,
            s => s.min(1000),
        };
        let memory = (l.memory_limit_mib > 0).then(|| u64::from(l.memory_limit_mib) * MIB);
        let here = l.gpus.len();
        // Ranks are the job's: this node runs rank_base .. rank_base + here
        // of world_size (a host before rank_base/world_size sends 0s).
        let world = if l.world_size == 0 {
            here as u64
        } else {
            u64::from(l.world_size)
        };
        if u64::from(l.rank_base) + here as u64 > world {
            return Err(format!(
                "ranks {}..{} do not fit the world size {world}",
                l.rank_base,
                u64::from(l.rank_base) + here as u64
            ));
        }
        // A stopped run of this job still draining (a relaunch after a
        // resize or migration): its exits are not this run's.
        if let Some(old) = self.jobs.remove(&l.job_id) {
            for id in old.workloads {
                self.by_workload.remove(&id);
            }
        }
        let mut started: Vec<u32> = Vec::with_capacity(here);
        let mut first_pid = 0;
        for (local, &gpu) in l.gpus.iter().enumerate() {
            let rank = u64::from(l.rank_base) + local as u64;
            let mut env = self.workload_env.clone();
            env.extend([
                ("ARBITER_JOB_ID".to_string(), l.job_id.to_string()),
                ("ARBITER_JOB_NAME".to_string(), l.name.clone()),
                ("ARBITER_RANK".to_string(), rank.to_string()),
                ("ARBITER_LOCAL_RANK".to_string(), local.to_string()),
                ("ARBITER_WORLD_SIZE".to_string(), world.to_string()),
            ]);
            let qos = u8::try_from(l.qos).ok().filter(|&q| q <= qos::BEST_EFFORT);
            let spec = WorkloadSpec {
                command: l.command.clone(),
                env,
                gpu,
                role,
                memory_limit_bytes: memory,
                host_spill_bytes: (qos.is_some_and(|q| q >= 1) && self.host_spill_bytes > 0)
                    .then_some(self.host_spill_bytes),
                compute_share_permille: share,
                mps_thread_pct: u8::try_from(l.mps_thread_pct)
                    .ok()
                    .filter(|p| (1..=100).contains(p)),
                terms: ShareTerms {
                    qos,
                    request_permille: l.request_permille.min(1000),
                    limit_permille: l.limit_permille.min(1000),
                },
                ..WorkloadSpec::default()
            };
            let tag = format!("job-{}/{rank}", l.job_id);
            match self.node.launch_tagged(&spec, Some(tag)) {
                Ok(id) => {
                    if local == 0 {
                        first_pid = self.node.supervisor().get(id).map_or(0, |w| w.record().pid);
                    }
                    started.push(id);
                }
                Err(e) => {
                    // Take back what already started; those exits are not reported.
                    for &id in &started {
                        if let Err(e) = self.node.supervisor_mut().evict(id) {
                            tracing::warn!(workload = id, error = %e, "evict after failed launch");
                        }
                    }
                    if !started.is_empty() {
                        let job = Job {
                            name: l.name.clone(),
                            workloads: started.iter().copied().collect(),
                            stopped: true,
                            ..Job::default()
                        };
                        for &id in &started {
                            self.by_workload.insert(id, l.job_id);
                        }
                        self.jobs.insert(l.job_id, job);
                    }
                    return Err(format!("rank {rank} on GPU {gpu}: {e}"));
                }
            }
        }
        for &id in &started {
            self.by_workload.insert(id, l.job_id);
        }
        self.finished.retain(|(j, _)| *j != l.job_id);
        self.jobs.insert(
            l.job_id,
            Job {
                name: l.name.clone(),
                workloads: started.iter().copied().collect(),
                pid: first_pid,
                launch_seq: l.launch_seq,
                ..Job::default()
            },
        );
        Ok(here)
    }

    /// Carry out an `Update` of a running job's terms on every rank here;
    /// returns the acknowledgement. Values are checked before anything is
    /// applied, so a bad update changes nothing.
    fn update(&mut self, u: &v1::Update) -> v1::NodeMessage {
        let ack = |ok: bool, message: String| v1::NodeMessage {
            body: Some(v1::node_message::Body::UpdateAck(v1::UpdateAck {
                job_id: u.job_id,
                seq: u.seq,
                ok,
                message,
            })),
        };
        let span = tracing::info_span!("update", job = u.job_id, seq = u.seq);
        let _g = span.enter();
        let Some(job) = self
            .jobs
            .get(&u.job_id)
            .filter(|j| !j.stopped && j.evicted.is_none())
        else {
            return ack(false, "the job is not running here".into());
        };
        let bad = |what: &str, v: Option<u32>, ok: fn(u32) -> bool| {
            v.filter(|&v| !ok(v))
                .map(|v| format!("{what} {v} out of range"))
        };
        let problem = bad("role", u.role, |v| v <= 1)
            .or_else(|| bad("qos", u.qos, |v| v <= u32::from(qos::BEST_EFFORT)))
            .or_else(|| bad("compute share", u.compute_share_permille, |v| v <= 1000))
            .or_else(|| bad("MPS thread %", u.mps_thread_pct, |v| (1..=100).contains(&v)))
            .or_else(|| bad("request", u.request_permille, |v| v <= 1000))
            .or_else(|| bad("limit", u.limit_permille, |v| v <= 1000));
        if let Some(problem) = problem {
            tracing::warn!(%problem, "update refused");
            return ack(false, problem);
        }
        let ids: Vec<u32> = job.workloads.iter().copied().collect();
        let mut actions = Vec::new();
        for &id in &ids {
            if let Some(m) = u.memory_limit_mib {
                // 0 = the whole GPU: no quota.
                actions.push(NodeAction::SetMemoryLimit(
                    id,
                    if m == 0 { u32::MAX } else { m },
                ));
            }
            if let Some(c) = u.compute_share_permille {
                actions.push(NodeAction::SetComputeShare(
                    id,
                    if c == 0 { 1000 } else { c },
                ));
            }
            if let Some(p) = u.mps_thread_pct {
                actions.push(NodeAction::SetMpsThreadPct(id, p as u8));
            }
        }
        let mut failures: Vec<String> = self
            .node
            .apply_actions(&actions)
            .into_iter()
            .filter_map(|o| o.result.err().map(|e| format!("{:?}: {e}", o.action)))
            .collect();
        for &id in &ids {
            let Some(w) = self.node.supervisor().get(id) else {
                continue;
            };
            let rec = w.record();
            let role = u.role.map_or(rec.role, |r| r as u8);
            let terms = ShareTerms {
                qos: u.qos.map(|q| q as u8).or(rec.terms.qos),
                request_permille: u.request_permille.unwrap_or(rec.terms.request_permille),
                limit_permille: u.limit_permille.unwrap_or(rec.terms.limit_permille),
            };
            if let Err(e) = self.node.supervisor_mut().set_terms(id, role, terms) {
                failures.push(format!("workload {id}: {e}"));
            }
        }
        if failures.is_empty() {
            tracing::info!(ranks = ids.len(), "update applied");
            ack(true, String::new())
        } else {
            let message = failures.join("; ");
            tracing::warn!(%message, "update partly applied");
            ack(false, message)
        }
    }

    fn stop(&mut self, s: &v1::Stop) {
        let Some(job) = self.jobs.get_mut(&s.job_id) else {
            tracing::debug!(job = s.job_id, reason = %s.reason, "stop for a job not here; ignored");
            return;
        };
        tracing::info!(job = s.job_id, reason = %s.reason, "stopping job");
        job.stopped = true;
        let ids: Vec<u32> = job.workloads.iter().copied().collect();
        for id in ids {
            if let Err(e) = self.node.supervisor_mut().evict(id) {
                tracing::warn!(job = s.job_id, workload = id, error = %e, "evict");
            }
        }
    }

    /// The coordinator evicted workload `id`: the rest of its job goes too.
    fn coordinator_evicted(&mut self, id: u32) {
        let Some(&job_id) = self.by_workload.get(&id) else {
            return;
        };
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        if job.stopped || job.evicted.is_some() {
            return;
        }
        tracing::info!(job = job_id, workload = id, "coordinator evicted the job");
        job.evicted = Some(format!("node policy evicted workload {id}"));
        let ids: Vec<u32> = job.workloads.iter().copied().collect();
        for w in ids {
            if w != id
                && let Err(e) = self.node.supervisor_mut().evict(w)
            {
                tracing::warn!(job = job_id, workload = w, error = %e, "evict sibling");
            }
        }
    }

    /// Account finished workloads; returns the events of jobs that are now over.
    fn exits(&mut self, reports: &[ExitReport]) -> Vec<v1::NodeMessage> {
        let mut events = Vec::new();
        for r in reports {
            let Some(job_id) = self.by_workload.remove(&r.id) else {
                continue;
            };
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue;
            };
            job.workloads.remove(&r.id);
            let (code, how) = match r.outcome {
                ExitOutcome::Code(c) => (c, format!("exit code {c}")),
                ExitOutcome::Signal(s) => (128 + s, format!("killed by signal {s}")),
                ExitOutcome::Unknown => (
                    -1,
                    "exit status unknown (workload adopted after an agent restart)".to_string(),
                ),
            };
            if job.code.is_none_or(|c| c == 0) {
                job.code = Some(code);
                job.how = how;
            }
            let failing = code != 0 && !job.stopped && job.evicted.is_none();
            if failing && !job.workloads.is_empty() {
                tracing::info!(
                    job = job_id,
                    workload = r.id,
                    code,
                    "rank failed; evicting the others"
                );
                let ids: Vec<u32> = job.workloads.iter().copied().collect();
                for w in ids {
                    let _ = self.node.supervisor_mut().evict(w);
                }
            }
            if !job.workloads.is_empty() {
                continue;
            }
            let Some(job) = self.jobs.remove(&job_id) else {
                continue;
            };
            if job.stopped {
                tracing::info!(job = job_id, "stopped job is gone");
                continue;
            }
            if let Some(msg) = job.evicted {
                events.push(event(
                    job_id,
                    job.launch_seq,
                    v1::WorkloadEventKind::Evicted,
                    0,
                    msg,
                ));
                continue;
            }
            let code = job.code.unwrap_or(-1);
            tracing::info!(job = job_id, name = %job.name, code, "job finished");
            if self.finished.len() == RECENT_FINISHED {
                self.finished.pop_front();
            }
            self.finished.push_back((job_id, code));
            events.push(event(
                job_id,
                job.launch_seq,
                v1::WorkloadEventKind::Exited,
                code,
                job.how,
            ));
        }
        events
    }
}

fn machine_cpu_milli() -> u32 {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u32)
        .saturating_mul(1000)
}

fn machine_memory_mib() -> u32 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| u32::try_from(kib / 1024).unwrap_or(u32::MAX))
}

/// Run the node agent until `stop` is set. `coordinator`: the node-local policy run every
/// control period (`None`: only reap exits). Returns when stopped, or on a setup error; link
/// failures are retried forever.
pub fn run_agent(
    config: AgentConfig,
    node: Node,
    coordinator: Option<Coordinator>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let span = tracing::info_span!("agent", node = %config.name);
    let _g = span.enter();
    let state = Arc::new(Mutex::new(State::new(node, &config)));
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let control = {
        let state = state.clone();
        let stop = stop.clone();
        let period = config.control_period;
        let span = span.clone();
        std::thread::Builder::new()
            .name("arbiter-node-control".into())
            .spawn(move || {
                let _g = span.enter();
                control_loop(&state, coordinator, period, &stop, &events_tx);
            })
            .context("spawn the control thread")?
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let result = rt.block_on(link_loop(&config, &state, &stop, events_rx).instrument(span.clone()));
    stop.store(true, Ordering::Relaxed);
    if control.join().is_err() {
        tracing::error!("control thread panicked");
    }
    result
}

fn control_loop(
    state: &Mutex<State>,
    mut coordinator: Option<Coordinator>,
    period: Duration,
    stop: &AtomicBool,
    events: &mpsc::UnboundedSender<v1::NodeMessage>,
) {
    let period = period.max(Duration::from_millis(1));
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let evs = {
            let mut st = state.lock();
            let exits = match coordinator.as_mut() {
                Some(c) => {
                    let report = c.step(&mut st.node);
                    for o in &report.outcomes {
                        if let (NodeAction::Evict(id), Ok(_)) = (o.action, &o.result) {
                            st.coordinator_evicted(id);
                        }
                    }
                    report.exits
                }
                None => {
                    st.node.view();
                    st.node.poll()
                }
            };
            st.exits(&exits)
        };
        for e in evs {
            // The link forwards it, or drops it while disconnected (the next hello reports
            // finished jobs again).
            let _ = events.send(e);
        }
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

enum SessionEnd {
    Stopped,
    Closed,
}

async fn link_loop(
    cfg: &AgentConfig,
    state: &Mutex<State>,
    stop: &AtomicBool,
    mut events: mpsc::UnboundedReceiver<v1::NodeMessage>,
) -> anyhow::Result<()> {
    let registrations = AtomicU64::new(0);
    let mut backoff = cfg.backoff_initial.max(Duration::from_millis(1));
    let mut attempt: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        attempt += 1;
        let before = registrations.load(Ordering::Relaxed);
        let span = tracing::info_span!("session", attempt);
        match session(cfg, state, stop, &mut events, &registrations)
            .instrument(span)
            .await
        {
            Ok(SessionEnd::Stopped) => break,
            Ok(SessionEnd::Closed) => tracing::warn!("the control plane closed the link"),
            // Refused before it ever joined, for a reason the next attempt repeats (its
            // name, its GPUs, its token): say so and stop, rather than retry for ever. A
            // node that has joined keeps retrying whatever the plane says: a restored
            // plane or a rotated token may take it back.
            Err(e) if registrations.load(Ordering::Relaxed) == 0 && is_refusal(&e) => {
                return Err(e.context(
                    "the control plane refuses this node, and would again: fix the \
                     command line or the token",
                ));
            }
            Err(e) => tracing::warn!(
                error = arbiter_proto::endpoint::cause_line(e.as_ref()),
                "node link failed"
            ),
        }
        if registrations.load(Ordering::Relaxed) > before {
            backoff = cfg.backoff_initial.max(Duration::from_millis(1));
        }
        tracing::info!(?backoff, "reconnecting");
        let until = tokio::time::Instant::now() + backoff;
        while tokio::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20).min(backoff)).await;
        }
        backoff = (backoff * 2).min(cfg.backoff_max.max(cfg.backoff_initial));
    }
    Ok(())
}

/// Whether the plane answered with a refusal that does not depend on time: a bad hello
/// (`InvalidArgument`) or credentials (`Unauthenticated`, `PermissionDenied`). A name
/// still held by a session that has not yet lapsed (`AlreadyExists`) and the plane's own
/// troubles are worth waiting out.
fn is_refusal(e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|cause| cause.downcast_ref::<tonic::Status>())
        .is_some_and(|status| {
            matches!(
                status.code(),
                tonic::Code::InvalidArgument
                    | tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied
            )
        })
}

async fn session(
    cfg: &AgentConfig,
    state: &Mutex<State>,
    stop: &AtomicBool,
    events: &mut mpsc::UnboundedReceiver<v1::NodeMessage>,
    registrations: &AtomicU64,
) -> anyhow::Result<SessionEnd> {
    let url = arbiter_proto::endpoint::url(&cfg.server);
    let channel =
        arbiter_proto::endpoint::endpoint(&cfg.server, cfg.ca_pem.as_deref(), cfg.connect_timeout)?
            .connect()
            .await
            .with_context(|| format!("connect to {url}"))?;
    let mut client = v1::node_link_client::NodeLinkClient::new(channel);
    // Whatever finished while we were away is in the hello.
    while events.try_recv().is_ok() {}
    let hello = state.lock().hello(cfg);
    let reported = hello.workloads.len();
    let (tx, rx) = mpsc::channel::<v1::NodeMessage>(1024);
    tx.try_send(v1::NodeMessage {
        body: Some(v1::node_message::Body::Hello(hello)),
    })
    .map_err(|_| anyhow::anyhow!("cannot queue the hello"))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", cfg.token)
            .parse()
            .context("token is not valid in a header")?,
    );
    let mut inbound = tokio::time::timeout(cfg.connect_timeout, client.session(request))
        .await
        .context("registration timed out")?
        .context("open the node session")?
        .into_inner();
    let first = tokio::time::timeout(cfg.connect_timeout, inbound.message())
        .await
        .context("no welcome from the control plane")?
        .context("node session")?;
    let welcome = match first.and_then(|m| m.body) {
        Some(v1::host_message::Body::Welcome(w)) => w,
        Some(other) => anyhow::bail!("expected a welcome, got {other:?}"),
        None => return Ok(SessionEnd::Closed),
    };
    let heartbeat = Duration::from_millis(u64::from(welcome.heartbeat_ms.max(10)));
    let n = registrations.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::info!(
        registration = n,
        workloads = reported,
        ?heartbeat,
        lost_after_ms = welcome.lost_after_ms,
        "registered with the control plane"
    );
    if let Some(hook) = &cfg.on_registered {
        hook(n);
    }
    let mut hb = tokio::time::interval(heartbeat);
    hb.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop_check = tokio::time::interval(Duration::from_millis(50));
    let mut seq: u64 = 0;
    let send = |msg: v1::NodeMessage| -> anyhow::Result<()> {
        tx.try_send(msg)
            .map_err(|e| anyhow::anyhow!("node link send queue: {e}"))
    };
    loop {
        tokio::select! {
            msg = inbound.message() => {
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => return Ok(SessionEnd::Closed),
                    Err(status) => return Err(anyhow::anyhow!("node session: {status}")),
                };
                match msg.body {
                    Some(v1::host_message::Body::Launch(l)) => {
                        let ev = state.lock().launch(&l);
                        send(ev)?;
                    }
                    Some(v1::host_message::Body::Stop(s)) => state.lock().stop(&s),
                    Some(v1::host_message::Body::Update(u)) => {
                        let ack = state.lock().update(&u);
                        send(ack)?;
                    }
                    Some(v1::host_message::Body::Welcome(_)) => {
                        tracing::debug!("second welcome ignored");
                    }
                    None => tracing::debug!("empty host message ignored"),
                }
            }
            ev = events.recv() => {
                if let Some(ev) = ev {
                    send(ev)?;
                }
            }
            _ = hb.tick() => {
                seq += 1;
                let beat = state.lock().heartbeat(seq);
                // A full queue means the host is not reading: skip this beat.
                let _ = tx.try_send(v1::NodeMessage {
                    body: Some(v1::node_message::Body::Heartbeat(beat)),
                });
            }
            _ = stop_check.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(SessionEnd::Stopped);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags() {
        assert_eq!(job_of_tag("job-42/0"), Some(42));
        assert_eq!(job_of_tag("job-7"), Some(7));
        assert_eq!(job_of_tag("job-x/0"), None);
        assert_eq!(job_of_tag("other"), None);
    }

    #[test]
    fn the_instance_id_is_kept_in_the_state_directory() {
        let dir = std::env::temp_dir().join(format!("agent-instance-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = instance_id(&dir).expect("made");
        assert_eq!(first.len(), 32, "{first}");
        assert_eq!(
            instance_id(&dir).expect("read"),
            first,
            "the same across restarts"
        );
        assert_ne!(fresh_instance(), first);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
