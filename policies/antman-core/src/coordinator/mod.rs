//! AntMan's local coordinator (§3.3 "Local coordinator", §3.1, Table 2, Fig. 7, 10, 12) as a
//! node-local `coordinator` role: every control period, per GPU, from the node's view.
//!
//! A workload with qos 0 is guaranteed, qos ≥ 1 opportunistic. Per GPU:
//!
//! * **A guaranteed workload arrives beside opportunistic ones** (A10): their memory limits
//!   are cut to what they use (at most what the GPU leaves beside the guaranteed one) so they
//!   cannot grow while it initialises, and their compute share drops to the floor
//!   (`share_floor_permille`). Once the guaranteed job runs stably (a baseline of its
//!   mini-batch time is measured, or `settle_timeout_ms` passes without a signal), the rest of
//!   the GPU memory goes to the opportunistic workloads, split equally.
//! * **Step-like raise** (A11): every `step_interval_ms` in which the guaranteed job's
//!   mini-batch time (`iteration-ms`; its launch rate when it reports none) stayed within
//!   `slowdown_tolerance_pct` of its baseline, each opportunistic workload's share rises by
//!   `share_step_permille`, up to its limit (`workload-status.limit-permille`) and never past
//!   `opportunistic_max_permille` (below the full GPU: at 1000 ‰ nothing paces it and the two
//!   contexts time-slice uncontrolled, which costs the guaranteed job more than the tolerance).
//! * **Pessimistic throttle** (A13): in the first period the guaranteed job is slower than
//!   that, the opportunistic shares drop back to the floor (`throttle = "floor"`, the default;
//!   `"halve"` halves them), the share that last held becomes a ceiling for
//!   `ceiling_hold_ms`, and the baseline is measured afresh at the lowered shares.
//! * **Memory surge** (A12): when the guaranteed workload's allocations are refused (its
//!   `quota-denials` rise), or it comes within half the headroom of its limit, it gets
//!   `surge_step_mib` more at once, taken from the opportunistic workloads, whose limits
//!   shrink — below their use if need be: a limit below a workload's use asks the node to
//!   release memory (a cooperative release, or a spill to host memory). Its limit is always
//!   what the opportunistic limits leave of the GPU, so it grows as they shrink.
//! * **Opportunistic work only** (A14): one workload runs unconstrained (no memory limit, its
//!   full share). Several keep their limits while they fit the GPU; a workload whose
//!   allocations are refused grows by `memory_step_mib` into free memory, and when there is
//!   none, takes a step from another by trial: kept only when the two workloads' normalised
//!   performance (1 / mini-batch time) rises in sum by `trial_min_gain_pct`, undone otherwise.
//! * **Guaranteed work alone**: any limit this policy set on it is lifted.
//!
//! State per GPU lives in the policy instance; a fresh instance (after a fault) starts from
//! the next view as if every guaranteed workload had just arrived, which is the cautious
//! reading. Thresholds and steps are ours (see `config.rs`); the paper gives none.

mod compute;
mod memory;

use crate::config::CoordinatorConfig;
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, qos};
use arbiter_policy_sdk::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// `set-memory-limit` value meaning "no limit" (the node's convention).
pub const UNLIMITED_MIB: u32 = u32::MAX;

/// One measurement of a workload's speed: time per unit of work, higher is slower.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Sample {
    /// The reported mean mini-batch time, ms.
    Iteration(f64),
    /// Without one: ms per 1000 kernel launches over the last period.
    LaunchGap(f64),
}

impl Sample {
    fn value(self) -> f64 {
        match self {
            Sample::Iteration(v) | Sample::LaunchGap(v) => v,
        }
    }
    fn same_kind(self, other: Sample) -> bool {
        matches!(
            (self, other),
            (Sample::Iteration(_), Sample::Iteration(_))
                | (Sample::LaunchGap(_), Sample::LaunchGap(_))
        )
    }
}

/// A workload's performance signal across periods.
#[derive(Clone, Debug, Default)]
pub(crate) struct Perf {
    last_launches: Option<u64>,
    last_ms: u64,
    /// The latest sample and when it was taken.
    latest: Option<(Sample, u64)>,
}

impl Perf {
    /// This period's sample, if the workload gave one.
    fn observe(&mut self, w: &WorkloadStatus, now: u64, cfg: &CoordinatorConfig) -> Option<Sample> {
        let prev = self.last_launches.replace(w.launches);
        let prev_ms = std::mem::replace(&mut self.last_ms, now);
        let sample = if w.iteration_ms > 0 {
            Some(Sample::Iteration(f64::from(w.iteration_ms)))
        } else if cfg.launch_rate_fallback {
            match prev {
                Some(p) if w.launches > p && now > prev_ms => Some(Sample::LaunchGap(
                    (now - prev_ms) as f64 * 1000.0 / (w.launches - p) as f64,
                )),
                _ => None,
            }
        } else {
            None
        };
        if let Some(s) = sample {
            self.latest = Some((s, now));
        }
        sample
    }
}

/// A guaranteed workload on a shared GPU.
#[derive(Clone, Debug, Default)]
pub(crate) struct Guaranteed {
    /// The most memory it has used on this GPU, MiB.
    peak_used: u32,
    denials: u64,
    /// Whether its denials rose this period.
    denied: bool,
    /// Extra room granted on a surge (A12), MiB, and until when.
    surge_mib: u32,
    surge_until: u64,
    perf: Perf,
    /// This period's sample.
    sample: Option<Sample>,
    /// Its speed with the opportunistic work held down (A11), and the samples toward it.
    baseline: Option<Sample>,
    samples: Vec<Sample>,
}

/// An opportunistic workload.
#[derive(Clone, Debug, Default)]
pub(crate) struct Opportunistic {
    /// The compute share this policy wants it at, permille.
    share: u32,
    /// Its use when the guaranteed workload arrived (A10: its limit goes no higher until the
    /// guaranteed job runs stably).
    arrival_use: u32,
    denials: u64,
    denied: bool,
    perf: Perf,
    /// On a GPU without guaranteed work (A14): the limit this policy gave it.
    limit: Option<u32>,
}

/// Where the compute controller of a shared GPU stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Compute {
    /// Shares held; sampling the guaranteed job's speed toward a baseline.
    Measuring,
    /// Raising step by step; the last change and whether every guaranteed workload has
    /// given a sample since.
    Raising { last_change: u64, evidence: bool },
}

/// A memory trade between two opportunistic workloads on trial (A14).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trial {
    to: u32,
    from: u32,
    step: u32,
    started: u64,
    before_to: Sample,
    before_from: Sample,
}

/// Per-GPU state.
#[derive(Clone, Debug)]
pub(crate) struct GpuCtl {
    guaranteed: BTreeMap<u32, Guaranteed>,
    opportunistic: BTreeMap<u32, Opportunistic>,
    /// A guaranteed workload shares the GPU with opportunistic ones.
    shared: bool,
    /// The guaranteed job runs stably: the opportunistic work may have the rest of the memory.
    settled: bool,
    arrived: u64,
    compute: Compute,
    /// After a throttle: the highest share until a time.
    ceiling: Option<(u32, u64)>,
    trial: Option<Trial>,
    /// Pairs (to, from) not to be traded again until a time.
    cooldown: BTreeMap<(u32, u32), u64>,
}

impl GpuCtl {
    fn new() -> GpuCtl {
        GpuCtl {
            guaranteed: BTreeMap::new(),
            opportunistic: BTreeMap::new(),
            shared: false,
            settled: false,
            arrived: 0,
            compute: Compute::Measuring,
            ceiling: None,
            trial: None,
            cooldown: BTreeMap::new(),
        }
    }
}

/// The highest compute share a workload may have: its share limit (or request), permille.
pub(crate) fn share_cap(w: &WorkloadStatus) -> u32 {
    let cap = match (w.request_permille, w.limit_permille) {
        (r, l) if l > 0 => l.max(r),
        (r, _) if r > 0 => r,
        _ => FULL_GPU_MILLI,
    };
    cap.clamp(1, FULL_GPU_MILLI)
}

/// The share an opportunistic workload is held down to.
pub(crate) fn share_floor(cfg: &CoordinatorConfig, w: &WorkloadStatus) -> u32 {
    cfg.share_floor_permille.min(share_cap(w)).max(1)
}

/// The coordinator: per-GPU state across control periods.
#[derive(Clone, Debug, Default)]
pub struct Coordinator {
    gpus: BTreeMap<u32, GpuCtl>,
}

impl Coordinator {
    pub fn new() -> Coordinator {
        Coordinator::default()
    }

    /// The compute share this policy wants an opportunistic workload at, once seen.
    pub fn wanted_share(&self, gpu: u32, workload: u32) -> Option<u32> {
        Some(self.gpus.get(&gpu)?.opportunistic.get(&workload)?.share)
    }

    /// Whether the guaranteed job on `gpu` runs stably beside opportunistic work.
    pub fn settled(&self, gpu: u32) -> bool {
        self.gpus.get(&gpu).is_some_and(|g| g.settled)
    }

    /// One control period.
    pub fn tick(&mut self, cfg: &CoordinatorConfig, view: &NodeView) -> Vec<NodeAction> {
        // A host before contract 0.3 sends no monotonic clock: use the wall clock then.
        let now = match view.monotonic_ms {
            0 => view.now_ms,
            t => t,
        };
        let mut by_gpu: BTreeMap<u32, Vec<&WorkloadStatus>> = BTreeMap::new();
        for w in &view.workloads {
            by_gpu.entry(w.gpu).or_default().push(w);
        }
        for list in by_gpu.values_mut() {
            list.sort_by_key(|w| w.id);
            list.dedup_by_key(|w| w.id);
        }
        let present: BTreeSet<u32> = view.gpus.iter().map(|g| g.index).collect();
        self.gpus
            .retain(|g, _| present.contains(g) && by_gpu.contains_key(g));
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for gpu in &view.gpus {
            if !seen.insert(gpu.index) {
                continue; // a duplicate entry: the first one counts
            }
            let Some(list) = by_gpu.get(&gpu.index) else {
                continue;
            };
            let ctl = self.gpus.entry(gpu.index).or_insert_with(GpuCtl::new);
            ctl.step(cfg, gpu, list, now, &mut out);
        }
        out
    }
}

impl GpuCtl {
    /// One control period of one GPU.
    fn step(
        &mut self,
        cfg: &CoordinatorConfig,
        gpu: &GpuStatus,
        workloads: &[&WorkloadStatus],
        now: u64,
        out: &mut Vec<NodeAction>,
    ) {
        let (gs, os): (Vec<&WorkloadStatus>, Vec<&WorkloadStatus>) = workloads
            .iter()
            .copied()
            .partition(|w| w.qos == qos::GUARANTEED);
        self.guaranteed
            .retain(|id, _| gs.iter().any(|w| w.id == *id));
        self.opportunistic
            .retain(|id, _| os.iter().any(|w| w.id == *id));
        let mut arrived = false;
        for w in &gs {
            let g = self.guaranteed.entry(w.id).or_insert_with(|| {
                arrived = true;
                Guaranteed {
                    denials: w.quota_denials,
                    ..Guaranteed::default()
                }
            });
            g.peak_used = g.peak_used.max(w.memory_used_mib);
            g.denied = w.quota_denials > g.denials;
            g.denials = w.quota_denials;
            g.sample = g.perf.observe(w, now, cfg);
        }
        let mut newcomers: BTreeSet<u32> = BTreeSet::new();
        for w in &os {
            let o = self.opportunistic.entry(w.id).or_insert_with(|| {
                newcomers.insert(w.id);
                Opportunistic {
                    share: w.compute_share,
                    arrival_use: w.memory_used_mib,
                    denials: w.quota_denials,
                    ..Opportunistic::default()
                }
            });
            o.denied = w.quota_denials > o.denials;
            o.denials = w.quota_denials;
            o.perf.observe(w, now, cfg);
        }
        self.cooldown.retain(|_, until| *until > now);

        if gs.is_empty() {
            self.leave_shared();
            if !os.is_empty() {
                self.opportunistic_only(cfg, gpu, &os, now, out);
            }
            return;
        }
        if os.is_empty() {
            self.leave_shared();
            self.trial = None;
            // Guaranteed work alone: no limit of ours on it.
            for w in &gs {
                if gpu.memory_total_mib > 0 && w.memory_limit_mib < gpu.memory_total_mib {
                    out.push(NodeAction::SetMemoryLimit(w.id, UNLIMITED_MIB));
                }
            }
            return;
        }
        if !self.shared || arrived {
            // A10: a guaranteed workload arrives beside opportunistic ones.
            self.shared = true;
            self.settled = false;
            self.arrived = now;
            self.compute = Compute::Measuring;
            self.trial = None;
            for g in self.guaranteed.values_mut() {
                g.baseline = None;
                g.samples.clear();
            }
            for w in &os {
                if let Some(o) = self.opportunistic.get_mut(&w.id) {
                    o.share = share_floor(cfg, w);
                    o.arrival_use = w.memory_used_mib;
                    o.limit = None;
                }
            }
        }
        for w in &os {
            // An opportunistic workload arriving beside guaranteed work starts at the floor
            // and climbs like the others (§3.3: "raises its GPU resource usage in a
            // step-like fashion").
            if newcomers.contains(&w.id)
                && let Some(o) = self.opportunistic.get_mut(&w.id)
            {
                o.share = share_floor(cfg, w);
            }
        }
        self.compute_shared(cfg, &os, now, out);
        self.memory_shared(cfg, gpu, &gs, &os, now, out);
    }

    /// The GPU no longer has guaranteed and opportunistic work side by side.
    fn leave_shared(&mut self) {
        self.shared = false;
        self.settled = false;
        self.compute = Compute::Measuring;
        self.ceiling = None;
    }
}
