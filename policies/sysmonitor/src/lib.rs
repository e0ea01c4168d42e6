//! `sysmonitor`: MuxFlow's two-level protection of online workloads (MuxFlow §4.1, Figure 6)
//! as a node-local `coordinator` policy.
//!
//! Every control period the node hands the policy a [`NodeView`]; per GPU the policy
//!
//! 1. runs SysMonitor's health state machine ([`monitor`]) on utilization, SM activity, SM
//!    clock and memory, and publishes the state with `set-health` (the host schedules offline
//!    work only onto Healthy GPUs, §4.1);
//! 2. runs xCUDA's controller ([`pacing`]): GPU load `U_SM × N_C` (Eq. 1–2) through a PID,
//!    whose output is the compute share of the GPU's offline workloads (`set-compute-share`,
//!    enforced by launch pacing in the interposer);
//! 3. acts on the state: Healthy → the controller's share; Unhealthy → that share capped (or
//!    the offline workloads frozen, by configuration); Overlimit and Disabled → the offline
//!    workloads are evicted; and it keeps offline memory quotas at the configured share of the
//!    GPU (§6: 40 %);
//! 4. treats an *error pattern* — the GPU's XID error count rose, or the node reports a GPU it
//!    can read as no longer observed OK (its MPS server faulted) — as an Overlimit reading and
//!    restarts the GPU's MPS server (`restart-mps`, rate-limited): MuxFlow §4.2 resets the
//!    CUDA context and the MPS server on such patterns.
//!
//! Per node, it evicts offline workloads one at a time, the one holding the most GPU memory
//! first, while the host is short of memory or swapping hard (MuxFlow §6: "when the host
//! memory usage is high or kswapd is busy"); the next goes once the previous has exited.
//!
//! Beyond the paper, and labelled so in [`config`]: every threshold and gain (MuxFlow gives
//! none), the hysteresis bands, the Unhealthy throttle/freeze choice, the restart rate limit
//! and the eviction order under host pressure.
//!
//! Online workloads (role 0) are never touched: protecting them is the point. Workloads of
//! other roles, and of GPUs the view does not list, are left alone too.
//!
//! State lives in the policy instance. When the node restarts the instance, the only state it
//! recovers is a GPU the node still reports Disabled (so a restart cannot re-enable a GPU
//! early); everything else is re-derived from the next readings, and controllers restart from
//! the shares the workloads have.

pub mod config;
pub mod monitor;
pub mod pacing;

use arbiter_policy_sdk::prelude::*;
use config::{Config, UnhealthyAction};
use monitor::{Level, Metrics, Monitor, State, classify};
use pacing::{Pid, gpu_load};
use std::collections::{BTreeMap, BTreeSet};

pub use config::DEFAULT_CONFIG;

/// `workload-status.role` of a latency-critical workload.
pub const ROLE_ONLINE: u8 = 0;
/// `workload-status.role` of a best-effort workload: the only kind this policy acts on.
pub const ROLE_OFFLINE: u8 = 1;

/// Nominal control period, used for the controller's first step (no previous time yet).
const NOMINAL_PERIOD_S: f64 = 0.1;

/// Per-GPU state.
#[derive(Clone, Debug)]
struct GpuCtl {
    monitor: Monitor,
    /// The offline share controller; `None` while the GPU has no offline workload to pace.
    pid: Option<Pid>,
    /// The health code last published with `set-health`.
    published: Option<u8>,
    /// The XID error count of the previous reading.
    xid_errors: Option<u32>,
    /// Whether the node observed the GPU in the previous reading.
    observed_ok: Option<bool>,
    /// When this policy last asked for the GPU's MPS server to be restarted.
    restarted_mps_at: Option<u64>,
}

/// The policy.
#[derive(Clone, Debug, Default)]
pub struct SysMonitor {
    config: Config,
    gpus: BTreeMap<u32, GpuCtl>,
    /// Workloads this policy asked to evict (asked once; they stay in the view until reaped).
    evicting: BTreeSet<u32>,
    /// Workloads this policy froze (only those are resumed by it).
    frozen: BTreeSet<u32>,
    /// Workloads evicted for host pressure that are still in the view: the next goes only
    /// when they are gone (their memory is what should relieve the host).
    host_evicting: BTreeSet<u32>,
    /// Since when swap-ins have stayed at or above the threshold.
    swapping_since: Option<u64>,
    last_now_ms: Option<u64>,
}

impl SysMonitor {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The SysMonitor state of a GPU, once the policy has seen it.
    pub fn state(&self, gpu: u32) -> Option<State> {
        self.gpus.get(&gpu).map(|g| g.monitor.state())
    }

    /// The controller's current share for a GPU's offline workloads.
    pub fn controller_share(&self, gpu: u32) -> Option<u32> {
        self.gpus.get(&gpu)?.pid.as_ref().map(Pid::share)
    }

    fn period_s(&mut self, now_ms: u64) -> f64 {
        let dt = match self.last_now_ms {
            Some(last) if now_ms > last => (now_ms - last) as f64 / 1000.0,
            _ => NOMINAL_PERIOD_S,
        };
        self.last_now_ms = Some(now_ms);
        // A long pause (node stalled, clock stepped) must not turn into one huge integral step.
        dt.clamp(0.001, 1.0)
    }

    /// Whether the host is under pressure now: memory at its threshold, or swap-ins at theirs
    /// for long enough.
    fn host_pressure(&mut self, view: &NodeView) -> bool {
        let host = self.config.host;
        let memory = host.memory_used_pct > 0.0
            && view.host_memory_total_mib > 0
            && 100.0 * f64::from(view.host_memory_used_mib) / f64::from(view.host_memory_total_mib)
                >= host.memory_used_pct;
        let swapping = host.swap_in_per_s > 0 && view.swap_in_per_s >= host.swap_in_per_s;
        if !swapping {
            self.swapping_since = None;
        }
        let since = swapping.then(|| *self.swapping_since.get_or_insert(view.now_ms));
        let swap = since.is_some_and(|t| view.now_ms.saturating_sub(t) >= host.swap_for_ms);
        memory || swap
    }

    /// Under host pressure, evicts one offline workload (most GPU memory first, then lowest
    /// id) unless one evicted for it is still exiting.
    fn relieve_host(&mut self, view: &NodeView, out: &mut Vec<NodeAction>) {
        if !self.host_pressure(view) || !self.host_evicting.is_empty() {
            return;
        }
        let victim = view
            .workloads
            .iter()
            .filter(|w| w.role == ROLE_OFFLINE && !self.evicting.contains(&w.id))
            .max_by_key(|w| (w.memory_used_mib, std::cmp::Reverse(w.id)));
        if let Some(w) = victim {
            log(
                LogLevel::Warn,
                &format!(
                    "host pressure (memory {}/{} MiB, {} swap-ins/s): evicting workload {}",
                    view.host_memory_used_mib, view.host_memory_total_mib, view.swap_in_per_s, w.id
                ),
            );
            self.evicting.insert(w.id);
            self.host_evicting.insert(w.id);
            out.push(NodeAction::Evict(w.id));
        }
    }

    /// One control period for one GPU.
    fn tick_gpu(
        &mut self,
        gpu: &GpuStatus,
        offline: &[&WorkloadStatus],
        now_ms: u64,
        dt_s: f64,
        out: &mut Vec<NodeAction>,
    ) {
        let config = self.config;
        let ctl = self.gpus.entry(gpu.index).or_insert_with(|| GpuCtl {
            monitor: if gpu.health == health::DISABLED {
                Monitor::disabled(now_ms)
            } else {
                Monitor::new()
            },
            pid: None,
            published: None,
            xid_errors: None,
            observed_ok: None,
            restarted_mps_at: None,
        });
        let metrics = Metrics::from_status(gpu, &config);
        let error = error_pattern(ctl, gpu, metrics.is_some());
        let level = if error {
            Level::Overlimit
        } else {
            classify(metrics.as_ref(), &config)
        };
        if error && config.errors.restart_mps {
            let every = config.errors.restart_mps_every_ms;
            if ctl
                .restarted_mps_at
                .is_none_or(|at| now_ms.saturating_sub(at) >= every)
            {
                log(
                    LogLevel::Warn,
                    &format!(
                        "gpu {}: error pattern (xid errors {}, observed {}): restarting MPS",
                        gpu.index, gpu.xid_errors, gpu.observed_ok
                    ),
                );
                out.push(NodeAction::RestartMps(gpu.index));
                ctl.restarted_mps_at = Some(now_ms);
            }
        }
        if let Some(t) = ctl.monitor.step(level, now_ms, &config) {
            let msg = format!(
                "gpu {}: {} -> {} (reading {level:?}, {} overlimit entries in window, hold {} ms)",
                gpu.index,
                t.from.name(),
                t.to.name(),
                ctl.monitor.overlimit_count(),
                ctl.monitor.hold_ms()
            );
            let lvl = if t.to == State::Disabled {
                LogLevel::Warn
            } else {
                LogLevel::Info
            };
            log(lvl, &msg);
        }
        let state = ctl.monitor.state();
        let code = state.code();
        // Publish on change, and again when the node lost it (a node restart forgets what was
        // set). The node reports a GPU it cannot sample or whose MPS daemon is unhealthy as
        // Unhealthy over the published state; re-publishing that every period would be noise.
        if ctl.published != Some(code) || (gpu.health != code && gpu.health != health::UNHEALTHY) {
            out.push(NodeAction::SetHealth(gpu.index, code));
            ctl.published = Some(code);
        }

        if offline.is_empty() {
            ctl.pid = None;
            return;
        }
        if matches!(state, State::Overlimit | State::Disabled) {
            ctl.pid = None;
            for w in offline {
                if self.evicting.insert(w.id) {
                    out.push(NodeAction::Evict(w.id));
                }
            }
            return;
        }

        // Memory: xCUDA's fixed offline quota (§6), only ever lowered.
        if config.offline_memory_quota_pct > 0.0 && gpu.memory_total_mib > 0 {
            let quota = (f64::from(gpu.memory_total_mib) * config.offline_memory_quota_pct / 100.0)
                .floor()
                .max(1.0) as u32;
            for w in offline {
                if w.memory_limit_mib > quota {
                    out.push(NodeAction::SetMemoryLimit(w.id, quota));
                }
            }
        }
        if state == State::Init {
            return;
        }

        // Compute: the controller's share, updated when there is a reading.
        let pacing = &config.pacing;
        let pid = ctl.pid.get_or_insert_with(|| {
            let current = offline
                .iter()
                .map(|w| w.compute_share)
                .min()
                .unwrap_or(pacing.max_share);
            Pid::new(current, pacing)
        });
        let share = match (metrics, gpu.max_sm_clock_mhz) {
            (Some(_), max) if max > 0 => {
                let load = gpu_load(
                    f64::from(gpu.sm_activity_pct),
                    f64::from(gpu.sm_clock_mhz),
                    f64::from(max),
                    pacing,
                );
                pid.update(load, dt_s, pacing)
            }
            _ => pid.share(),
        };
        let unhealthy = state == State::Unhealthy;
        let cap = config.unhealthy_share_cap;
        let target = if unhealthy && config.unhealthy_action == UnhealthyAction::Throttle {
            share.min(cap)
        } else {
            share
        };
        let bounds = [pacing.min_share, pacing.max_share, cap];
        for w in offline {
            if share_moves(pacing.min_step, w.compute_share, target, &bounds) {
                out.push(NodeAction::SetComputeShare(w.id, target));
            }
            if unhealthy && config.unhealthy_action == UnhealthyAction::Freeze {
                if !w.frozen {
                    out.push(NodeAction::Freeze(w.id));
                }
                self.frozen.insert(w.id);
            } else if !unhealthy && self.frozen.remove(&w.id) && w.frozen {
                out.push(NodeAction::Resume(w.id));
            }
        }
    }
}

/// Whether this reading of `gpu` shows an error pattern: its XID count rose since the previous
/// reading, or the node, which observed the GPU then, now reports it not OK although it
/// could read it (`read`): what the node reports when the GPU's MPS server faulted. A reading
/// that failed is not one (one failed sample proves nothing: it is [`Level::Missing`]).
/// Remembers this reading.
fn error_pattern(ctl: &mut GpuCtl, gpu: &GpuStatus, read: bool) -> bool {
    let xid_rose = ctl.xid_errors.is_some_and(|prev| gpu.xid_errors > prev);
    let lost = read && ctl.observed_ok == Some(true) && !gpu.observed_ok;
    ctl.xid_errors = Some(gpu.xid_errors);
    ctl.observed_ok = Some(gpu.observed_ok);
    xid_rose || lost
}

/// Whether a share change from `current` to `target` is worth an action: a move of at least
/// `min_step`, or reaching a bound exactly (so a workload is never left a step short of
/// unthrottled or of the cap).
fn share_moves(min_step: u32, current: u32, target: u32, bounds: &[u32]) -> bool {
    current != target && (current.abs_diff(target) >= min_step.max(1) || bounds.contains(&target))
}

impl Policy for SysMonitor {
    fn manifest() -> Manifest {
        let mut m = manifest(
            "sysmonitor",
            env!("CARGO_PKG_VERSION"),
            &[Role::Coordinator],
            "MuxFlow SysMonitor health state machine and xCUDA PID pacing of offline workloads.",
        );
        m.default_config = DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        SysMonitor::default()
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        self.config = Config::parse(config).map_err(PolicyError::Failed)?;
        Ok(())
    }

    fn tick(&mut self, view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        let now = view.now_ms;
        let dt = self.period_s(now);
        let live: BTreeSet<u32> = view.workloads.iter().map(|w| w.id).collect();
        self.evicting.retain(|id| live.contains(id));
        self.host_evicting.retain(|id| live.contains(id));
        self.frozen.retain(|id| live.contains(id));
        let present: BTreeSet<u32> = view.gpus.iter().map(|g| g.index).collect();
        self.gpus.retain(|index, _| present.contains(index));

        let mut offline: BTreeMap<u32, Vec<&WorkloadStatus>> = BTreeMap::new();
        for w in view.workloads.iter().filter(|w| w.role == ROLE_OFFLINE) {
            offline.entry(w.gpu).or_default().push(w);
        }
        for list in offline.values_mut() {
            list.sort_by_key(|w| w.id);
            list.dedup_by_key(|w| w.id);
        }
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for gpu in &view.gpus {
            if !seen.insert(gpu.index) {
                continue; // a duplicate entry: the first one counts
            }
            let mine = offline.get(&gpu.index).map(Vec::as_slice).unwrap_or(&[]);
            self.tick_gpu(gpu, mine, now, dt, &mut out);
        }
        self.relieve_host(view, &mut out);
        Ok(out)
    }
}

arbiter_policy_sdk::export_policy!(SysMonitor);

#[cfg(test)]
mod tests;
