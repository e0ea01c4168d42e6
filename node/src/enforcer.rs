//! The node-local policy data path: metrics in ([`Node::view`]), actions out
//! ([`Node::apply_actions`]).
//!
//! [`Node::view`] samples every GPU through the [`GpuBackend`], reads each workload's control
//! block (memory in use, quota, launches, pacing delay, freeze bit), reconciles the block's
//! memory with NVML's per-process numbers, refreshes the per-launch device-time estimate that
//! turns a compute share into a pacing interval, heartbeats the blocks, and returns the SDK's
//! [`NodeView`] — what a `coordinator` policy's `tick` receives.
//!
//! [`Node::apply_actions`] carries out the [`NodeAction`]s a policy returns. A policy is
//! untrusted: every action is validated and gets its own [`ActionOutcome`]; a bad one never
//! stops the others.
//!
//! | action | effect | reaches running clients |
//! |---|---|---|
//! | `SetMemoryLimit(w, MiB)` | block `quota_bytes` (`u32::MAX` = unlimited) | yes, next allocation |
//! | `SetComputeShare(w, ‰)` | block pacing interval = mean launch time / share | yes, within one pacer slice |
//! | `SetMpsThreadPct(w, %)` | recorded; `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` at the next start | no (MPS limitation) |
//! | `Freeze(w)` / `Resume(w)` | block `FLAG_FREEZE` (launches held in the interposer) | yes |
//! | `Evict(w)` | `FLAG_EXIT` + `SIGTERM`, `SIGKILL` after the grace period | yes |
//! | `SetHealth(gpu, h)` | the GPU's reported health | n/a |
//! | `RestartMps(gpu)` | clients' work terminated, the GPU's MPS daemon quit and started afresh | clients must reconnect |

use crate::gpu::{GpuBackend, GpuError, GpuSample};
use crate::hostload::HostSampler;
use crate::jobstats::{Enforced, StatsSample, WorkloadStats};
use crate::mps::{self, MpsManager};
use crate::procfs;
use crate::supervisor::{ExitReport, Supervisor, SupervisorError, Workload, WorkloadSpec};
use arbiter_interpose::control::FLAG_FREEZE;
use arbiter_policy_sdk::model::{
    GpuStatus, NodeAction, NodeView, WorkloadStatus, health, qos, workload_role,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MIB: u64 = 1 << 20;

/// How an accepted action takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Already in force.
    Now,
    /// Started; completes later (eviction).
    InProgress,
    /// Recorded; reaches the workload when its client (re)starts (MPS knobs).
    AtNextStart,
}

/// Why an action was refused.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("workload {0} does not exist on this node")]
    NoSuchWorkload(u32),
    #[error("GPU {0} does not exist on this node")]
    NoSuchGpu(u32),
    #[error("invalid value: {0}")]
    Invalid(String),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
}

/// The result of one action.
#[derive(Debug)]
pub struct ActionOutcome {
    pub action: NodeAction,
    pub result: Result<Applied, ActionError>,
}

/// Node configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Refuse a launch whose memory quota does not fit next to the quotas already granted on
    /// its GPU.
    pub admission: bool,
    /// How often the MPS daemons are asked for their health (each ask runs the control
    /// binary a few times).
    pub mps_health_every: Duration,
    /// Weight of a new sample in the per-launch device-time estimate.
    pub kernel_estimate_alpha: f64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            admission: true,
            mps_health_every: Duration::from_secs(5),
            kernel_estimate_alpha: 0.3,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct LaunchSample {
    at: Instant,
    launches: u64,
    estimate_ns: Option<f64>,
}

/// The node enforcer: GPU backend, MPS daemons and the supervised workloads.
pub struct Node {
    backend: Arc<dyn GpuBackend>,
    mps: Option<MpsManager>,
    supervisor: Supervisor,
    config: NodeConfig,
    /// Health set by the coordinator policy, per GPU.
    policy_health: HashMap<u32, u8>,
    /// Last MPS health check per GPU: (when, healthy).
    mps_health: HashMap<u32, (Instant, bool)>,
    /// Memory of each GPU (MiB), remembered so a lost GPU still reports its size.
    memory_total_mib: HashMap<u32, u32>,
    launch_samples: HashMap<u32, LaunchSample>,
    /// Iteration time, memory and utilization of each workload (`job-metric`).
    stats: HashMap<u32, WorkloadStats>,
    host: HostSampler,
    /// Origin of `node-view.monotonic-ms`.
    started: Instant,
    /// Views taken (the slot processes' start times are checked every `VERIFY_EVERY`).
    periods: u64,
    /// Workloads already reported for loading a CUDA runtime around the interposer.
    reported_unenforced: HashSet<u32>,
}

/// Every this many views the node checks the start time of every slot's process, not only
/// that its pid exists: a pid reused between two checks is then caught within a few seconds
/// (pids are handed out sequentially, so reuse within that time needs a wrap of `pid_max`).
const VERIFY_EVERY: u64 = 50;

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("backend", &self.backend.kind())
            .field("mps", &self.mps)
            .field("workloads", &self.supervisor.ids())
            .finish_non_exhaustive()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn mib(bytes: u64) -> u32 {
    u32::try_from(bytes / MIB).unwrap_or(u32::MAX)
}

impl Node {
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        mps: Option<MpsManager>,
        supervisor: Supervisor,
        config: NodeConfig,
    ) -> Node {
        Node {
            backend,
            mps,
            supervisor,
            config,
            policy_health: HashMap::new(),
            mps_health: HashMap::new(),
            memory_total_mib: HashMap::new(),
            launch_samples: HashMap::new(),
            stats: HashMap::new(),
            host: HostSampler::default(),
            started: Instant::now(),
            periods: 0,
            reported_unenforced: HashSet::new(),
        }
    }

    pub fn backend(&self) -> &dyn GpuBackend {
        self.backend.as_ref()
    }

    pub fn mps(&self) -> Option<&MpsManager> {
        self.mps.as_ref()
    }

    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    pub fn supervisor_mut(&mut self) -> &mut Supervisor {
        &mut self.supervisor
    }

    /// Launch a workload on its GPU (with that GPU's MPS environment when MPS is on).
    pub fn launch(&mut self, spec: &WorkloadSpec) -> Result<u32, ActionError> {
        self.launch_tagged(spec, None)
    }

    /// [`launch`](Self::launch) with an owner label kept in the workload's persisted record
    /// (see [`Supervisor::launch_tagged`]).
    pub fn launch_tagged(
        &mut self,
        spec: &WorkloadSpec,
        tag: Option<String>,
    ) -> Result<u32, ActionError> {
        let count = self
            .backend
            .device_count()
            .map_err(|e| ActionError::Invalid(format!("cannot enumerate GPUs: {e}")))?;
        if spec.gpu >= count {
            return Err(ActionError::NoSuchGpu(spec.gpu));
        }
        if self.config.admission
            && let Some(want) = spec.memory_limit_bytes
        {
            let total = self
                .backend
                .device_info(spec.gpu)
                .map(|i| i.memory_total_bytes)
                .map_err(|e| ActionError::Invalid(format!("GPU {}: {e}", spec.gpu)))?;
            let granted = self.supervisor.reserved_bytes(spec.gpu);
            if granted.saturating_add(want) > total {
                return Err(ActionError::Invalid(format!(
                    "memory quota {} MiB does not fit on GPU {} ({} of {} MiB granted)",
                    want / MIB,
                    spec.gpu,
                    granted / MIB,
                    total / MIB
                )));
            }
        }
        let mps = self.mps.as_ref().and_then(|m| m.for_gpu(spec.gpu));
        Ok(self.supervisor.launch_tagged(spec, mps, tag)?)
    }

    /// Each workload's statistics over the window since the last call (the agent reports them
    /// with its heartbeat); a workload no control period sampled since is left out.
    pub fn take_stats(&mut self) -> HashMap<u32, StatsSample> {
        self.stats
            .iter_mut()
            .filter_map(|(&id, s)| Some((id, s.take_window()?)))
            .collect()
    }

    /// Reap finished workloads and escalate overdue evictions (call every control period).
    pub fn poll(&mut self) -> Vec<ExitReport> {
        let reports = self.supervisor.poll(self.mps.as_ref());
        for r in &reports {
            self.launch_samples.remove(&r.id);
            self.stats.remove(&r.id);
        }
        reports
    }

    /// The health the node policy last published for a GPU (`set-health`).
    pub fn published_health(&self, index: u32) -> Option<u8> {
        self.policy_health.get(&index).copied()
    }

    /// The health to report for GPU `index` and whether the node's own
    /// checks passed (the sample, `observed_ok`, and the MPS server).
    fn gpu_health(&mut self, index: u32, observed_ok: bool) -> (u8, bool) {
        let set = self.policy_health.get(&index).copied();
        let mut ok = observed_ok;
        if let Some(m) = self.mps.as_ref().and_then(|m| m.for_gpu(index)) {
            let now = Instant::now();
            let fresh = self
                .mps_health
                .get(&index)
                .filter(|(at, _)| now.duration_since(*at) < self.config.mps_health_every)
                .map(|(_, h)| *h);
            let healthy = match fresh {
                Some(h) => h,
                None => {
                    let h = m.health().is_healthy();
                    self.mps_health.insert(index, (now, h));
                    h
                }
            };
            ok &= healthy;
        }
        let reported = if set == Some(health::DISABLED) {
            health::DISABLED
        } else if !ok {
            health::UNHEALTHY
        } else {
            set.unwrap_or(health::HEALTHY)
        };
        (reported, ok)
    }

    /// Build the coordinator's view of this node now. Also heartbeats every control block and
    /// refreshes the launch-time estimates (so call it once per control period).
    pub fn view(&mut self) -> NodeView {
        self.supervisor.heartbeat();
        // Each workload's charge before NVML is sampled (see `ControlBlock::reconcile`).
        let charged_before: HashMap<u32, u64> = self
            .supervisor
            .ids()
            .into_iter()
            .filter_map(|id| {
                let w = self.supervisor.get(id)?;
                Some((id, w.block().device(0).used_bytes.load(Ordering::Relaxed)))
            })
            .collect();
        let count = match self.backend.device_count() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot enumerate GPUs");
                0
            }
        };
        let mut samples: HashMap<u32, GpuSample> = HashMap::new();
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let status = match self.backend.sample(index) {
                Ok(s) => {
                    let total = mib(s.memory_total_bytes);
                    self.memory_total_mib.insert(index, total);
                    // NVML has no SM-occupancy counter outside GPM (Hopper+); the sum of the
                    // per-process SM utilization is the closest, the GPU busy time otherwise.
                    let per_process: Option<u32> = s
                        .processes
                        .iter()
                        .filter_map(|p| p.sm_util_pct.map(u32::from))
                        .reduce(|a, b| a + b);
                    let sm_activity = per_process.map_or(s.utilization_pct, |v| v.min(100) as u8);
                    let (health, observed_ok) = self.gpu_health(index, true);
                    // Power and temperature the GPU cannot report are 0 (unknown), as the
                    // contract says; XID errors are counted since the node started.
                    let st = GpuStatus {
                        index,
                        utilization_pct: s.utilization_pct,
                        sm_activity_pct: sm_activity,
                        sm_clock_mhz: s.sm_clock_mhz,
                        max_sm_clock_mhz: s.max_sm_clock_mhz,
                        memory_used_mib: mib(s.memory_used_bytes),
                        memory_total_mib: total,
                        health,
                        observed_ok,
                        throttle_reasons: s.throttle_reasons,
                        xid_errors: s.xid_errors,
                        power_mw: s.power_mw.unwrap_or(0),
                        temperature_c: s.temperature_c.unwrap_or(0),
                    };
                    samples.insert(index, s);
                    st
                }
                Err(e) => {
                    log_sample_error(index, &e);
                    let (health, observed_ok) = self.gpu_health(index, false);
                    GpuStatus {
                        index,
                        memory_total_mib: self.memory_total_mib.get(&index).copied().unwrap_or(0),
                        health,
                        observed_ok,
                        ..GpuStatus::default()
                    }
                }
            };
            gpus.push(status);
        }

        let now = Instant::now();
        let alpha = self.config.kernel_estimate_alpha.clamp(0.01, 1.0);
        let mut workloads = Vec::new();
        let mut estimates = Vec::new();
        let ids = self.supervisor.ids();
        let leaders: HashSet<u32> = self
            .supervisor
            .workloads()
            .map(|w| w.record().pid)
            .collect();
        let attribution = Attribution::new(&samples, &leaders);
        let mut per_gpu: HashMap<u32, usize> = HashMap::new();
        for w in self.supervisor.workloads() {
            *per_gpu.entry(w.record().gpu).or_insert(0) += 1;
        }
        // Liveness of the processes in the blocks' slots: `kill(pid, 0)` every period, the
        // start time (a `/proc` read per process, which tells a reused pid) every
        // `VERIFY_EVERY` periods and on the first.
        self.periods = self.periods.wrapping_add(1);
        self.reported_unenforced.retain(|id| ids.contains(id));
        let verify = self.periods % VERIFY_EVERY == 1;
        for id in ids {
            let Some(w) = self.supervisor.get(id) else {
                continue;
            };
            let rec = w.record();
            let b = w.block();
            // A process of the workload killed before it could return its charges (SIGKILL,
            // the OOM killer) left them in its slot: give them back to the workload's quota.
            let reclaimed =
                b.reclaim_dead_processes(|pid, ticks| slot_process_alive(pid, ticks, verify));
            if reclaimed > 0 {
                tracing::info!(
                    workload = id,
                    bytes = reclaimed,
                    "reclaimed the memory charges of a dead process"
                );
            }
            if b.liveness.unenforced_loads.load(Ordering::Relaxed) > 0
                && self.reported_unenforced.insert(id)
            {
                tracing::warn!(
                    workload = id,
                    "the workload loaded a CUDA runtime with RTLD_DEEPBIND: its memory and \
                     launches through it are not enforced"
                );
            }
            let launches = b.counters.launches.load(Ordering::Relaxed);
            let sample = samples.get(&rec.gpu);
            let alone = per_gpu.get(&rec.gpu) == Some(&1);
            let (nvml_used, util) = attribution.usage(w, sample, alone);
            // What NVML sees the workload's processes hold beyond the interposer's charge
            // (context, module, graph, pool memory) counts against its quota from now on. No
            // sample this period: keep the last reconciliation rather than forget it.
            let unseen = if sample.is_some() {
                b.reconcile(0, nvml_used, charged_before.get(&id).copied().unwrap_or(0))
            } else {
                b.device(0).unseen_bytes.load(Ordering::Relaxed)
            };
            let block_used = b.device(0).used_bytes.load(Ordering::Relaxed);
            let total_mib = self.memory_total_mib.get(&rec.gpu).copied().unwrap_or(0);
            let stats = self.stats.entry(id).or_default();
            let iteration_ms = stats.iteration.observe(
                b.shared.iterations.load(Ordering::Acquire),
                b.shared.last_iteration_ns.load(Ordering::Acquire),
            );
            let spilled = b.shared.spilled_bytes.load(Ordering::Relaxed);
            stats.sample(mib(block_used + unseen), mib(spilled), util);
            let memory_limit_mib = w.memory_limit_bytes().map_or(total_mib, mib);
            stats.enforce(Enforced {
                memory_limit_mib,
                compute_share_permille: rec.compute_share_permille,
            });
            workloads.push(WorkloadStatus {
                id,
                gpu: rec.gpu,
                role: rec.role,
                memory_used_mib: mib(block_used + unseen),
                memory_unseen_mib: mib(unseen),
                memory_limit_mib,
                compute_share: rec.compute_share_permille,
                launches,
                pacing_delay_us: b.counters.pacing_delay_ns.load(Ordering::Relaxed) / 1000,
                iteration_ms,
                frozen: b.limits.flags.load(Ordering::Acquire) & FLAG_FREEZE != 0,
                // The agent labels a workload `job-<id>/<rank>`.
                job: rec
                    .tag
                    .as_deref()
                    .map(|t| t.split('/').next().unwrap_or(t).to_string())
                    .unwrap_or_default(),
                // The host's terms (launch or update); a workload launched
                // by a host that sent none: the role stands for the QoS and
                // the compute share for the request.
                qos: rec
                    .terms
                    .qos
                    .unwrap_or(if rec.role == workload_role::ONLINE {
                        qos::GUARANTEED
                    } else {
                        qos::BEST_EFFORT
                    }),
                request_permille: match rec.terms.request_permille {
                    0 => rec.compute_share_permille,
                    r => r,
                },
                limit_permille: rec.terms.limit_permille,
                quota_denials: b.counters.quota_denials.load(Ordering::Relaxed),
            });
            // Device time per launch = busy time attributed to the workload / launches.
            let prev = self.launch_samples.get(&id).copied();
            let mut estimate_ns = prev.and_then(|p| p.estimate_ns);
            if let (Some(p), Some(u)) = (prev, util) {
                let dl = launches.saturating_sub(p.launches);
                let dt = now.duration_since(p.at).as_nanos() as f64;
                if dl > 0 && u > 0.0 {
                    let x = u / 100.0 * dt / dl as f64;
                    let e = estimate_ns.map_or(x, |e| e + alpha * (x - e));
                    estimate_ns = Some(e);
                    estimates.push((id, e.round() as u64));
                }
            }
            self.launch_samples.insert(
                id,
                LaunchSample {
                    at: now,
                    launches,
                    estimate_ns,
                },
            );
        }
        for (id, ns) in estimates {
            if let Err(e) = self.supervisor.update_kernel_estimate(id, ns) {
                tracing::warn!(id, error = %e, "kernel-time estimate");
            }
        }
        let host = self.host.sample();
        NodeView {
            now_ms: unix_ms(),
            gpus,
            workloads,
            monotonic_ms: self.started.elapsed().as_millis() as u64,
            host_memory_used_mib: host.memory_used_mib,
            host_memory_total_mib: host.memory_total_mib,
            swap_in_per_s: host.swap_in_per_s,
            cpu_utilization_pct: host.cpu_utilization_pct,
        }
    }

    /// Carry out a coordinator's actions; one outcome per action, in order.
    pub fn apply_actions(&mut self, actions: &[NodeAction]) -> Vec<ActionOutcome> {
        actions
            .iter()
            .map(|&action| {
                let result = self.apply(action);
                match &result {
                    Ok(a) => tracing::debug!(?action, applied = ?a, "node action"),
                    Err(e) => tracing::warn!(?action, error = %e, "node action refused"),
                }
                ActionOutcome { action, result }
            })
            .collect()
    }

    fn workload(&self, id: u32) -> Result<&Workload, ActionError> {
        self.supervisor
            .get(id)
            .ok_or(ActionError::NoSuchWorkload(id))
    }

    fn apply(&mut self, action: NodeAction) -> Result<Applied, ActionError> {
        match action {
            NodeAction::SetMemoryLimit(id, limit_mib) => {
                self.workload(id)?;
                let bytes = (limit_mib != u32::MAX).then(|| u64::from(limit_mib) * MIB);
                self.supervisor.set_memory_limit(id, bytes)?;
                Ok(Applied::Now)
            }
            NodeAction::SetComputeShare(id, permille) => {
                self.workload(id)?;
                if permille == 0 || permille > 1000 {
                    return Err(ActionError::Invalid(format!(
                        "compute share {permille} not in 1..=1000 permille (use Freeze to stop)"
                    )));
                }
                let estimate = self
                    .launch_samples
                    .get(&id)
                    .and_then(|s| s.estimate_ns)
                    .map(|e| e.round() as u64);
                self.supervisor.set_compute_share(id, permille, estimate)?;
                Ok(Applied::Now)
            }
            NodeAction::SetMpsThreadPct(id, pct) => {
                self.workload(id)?;
                self.supervisor.set_mps_thread_pct(id, pct)?;
                Ok(Applied::AtNextStart)
            }
            NodeAction::Freeze(id) | NodeAction::Resume(id) => {
                self.workload(id)?;
                self.supervisor
                    .set_frozen(id, matches!(action, NodeAction::Freeze(_)))?;
                Ok(Applied::Now)
            }
            NodeAction::Evict(id) => {
                self.workload(id)?;
                self.supervisor.evict(id)?;
                Ok(Applied::InProgress)
            }
            NodeAction::RestartMps(gpu) => {
                let daemon = self
                    .mps
                    .as_ref()
                    .and_then(|m| m.for_gpu(gpu))
                    .ok_or(ActionError::NoSuchGpu(gpu))?;
                mps::restart(daemon).map_err(|e| {
                    ActionError::Invalid(format!("restarting MPS on GPU {gpu}: {e}"))
                })?;
                self.mps_health.remove(&gpu);
                Ok(Applied::Now)
            }
            NodeAction::SetHealth(gpu, h) => {
                let count = self.backend.device_count().unwrap_or(0);
                if gpu >= count {
                    return Err(ActionError::NoSuchGpu(gpu));
                }
                if h > health::DISABLED {
                    return Err(ActionError::Invalid(format!("health code {h}")));
                }
                self.policy_health.insert(gpu, h);
                Ok(Applied::Now)
            }
        }
    }
}

fn log_sample_error(index: u32, e: &GpuError) {
    match e {
        GpuError::Lost(_) => tracing::error!(gpu = index, error = %e, "GPU lost"),
        _ => tracing::warn!(gpu = index, error = %e, "GPU sample failed"),
    }
}

/// Whether the process that claimed a control-block slot as (`pid`, `start_ticks`) still runs:
/// its pid exists (one syscall), and, when `verify`, it is the same process (its start time,
/// a `/proc` read) and not a zombie (whose GPU memory is already gone). A start time of 0 is a
/// slot being claimed right now: the pid alone decides.
fn slot_process_alive(pid: u64, start_ticks: u64, verify: bool) -> bool {
    let Ok(pid) = u32::try_from(pid) else {
        return false;
    };
    if !verify || start_ticks == 0 {
        return procfs::exists(pid);
    }
    procfs::liveness(pid, start_ticks) == procfs::Liveness::Alive
}

/// NVML's processes attributed to workloads, once per view: a process belongs to the workload
/// whose process group it is in (the group's leader is the workload's pid). A process that is
/// itself a leader needs no look at `/proc`; any other is looked up once — not once per
/// workload on its GPU, which at 8 workloads per GPU was most of the node's per-period work.
struct Attribution {
    /// (GPU, process group) → (device memory, summed SM utilization when any process had one).
    by_group: HashMap<(u32, u32), (u64, Option<u32>)>,
}

impl Attribution {
    fn new(samples: &HashMap<u32, GpuSample>, leaders: &HashSet<u32>) -> Attribution {
        let mut by_group: HashMap<(u32, u32), (u64, Option<u32>)> = HashMap::new();
        for (gpu, s) in samples {
            for p in &s.processes {
                let group = if leaders.contains(&p.pid) {
                    Some(p.pid)
                } else {
                    procfs::stat(p.pid)
                        .ok()
                        .map(|st| st.pgrp)
                        .filter(|g| leaders.contains(g))
                };
                let Some(group) = group else { continue };
                let e = by_group.entry((*gpu, group)).or_insert((0, None));
                e.0 += p.used_memory_bytes.unwrap_or(0);
                if let Some(u) = p.sm_util_pct {
                    e.1 = Some(e.1.unwrap_or(0) + u32::from(u));
                }
            }
        }
        Attribution { by_group }
    }

    /// NVML's view of a workload: the device memory of its processes and their SM utilization
    /// (percent; `None` when there is no usable sample). When no per-process sample exists and
    /// the workload is alone on its GPU, the GPU's utilization is attributed to it.
    fn usage(&self, w: &Workload, sample: Option<&GpuSample>, alone: bool) -> (u64, Option<f64>) {
        let Some(s) = sample else {
            return (0, None);
        };
        let rec = w.record();
        let (used, util) = self
            .by_group
            .get(&(rec.gpu, rec.pid))
            .copied()
            .unwrap_or((0, None));
        let util = match util {
            Some(u) => Some(f64::from(u.min(100))),
            None if alone => Some(f64::from(s.utilization_pct)),
            None => None,
        };
        (used, util)
    }
}
