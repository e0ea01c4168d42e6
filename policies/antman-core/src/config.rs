//! The policy's configuration: one TOML document with a `[scheduler]` and a `[coordinator]`
//! table. Keys left out keep their defaults; unknown keys are an error.
//!
//! The paper gives one number, the utilization threshold M = 80 % over the last 10 s
//! (Algorithm 1, §3.3); the 10 s window is the host's `snapshot.metric-window-ms`. Every
//! other default is ours, and [`DEFAULT_CONFIG`] says why.

use arbiter_policy_sdk::model::{FULL_GPU_MILLI, PolicyError};
use serde::Deserialize;

/// The default configuration, as returned in the manifest. Parses to [`Config::default`].
pub const DEFAULT_CONFIG: &str = r#"# antman: AntMan (OSDI '20) global scheduler and local coordinator.

[scheduler]
# Algorithm 1's M: an opportunistic job goes only to GPUs whose utilization over the
# metric window is below this percentage (the paper: 80 % over the last 10 s).
utilization_threshold_pct = 80
# §3.3: a guaranteed job whose tenant has no quota left for it runs as opportunistic
# once it has queued this long. The paper "estimates the queuing time" and gives no
# number; ours: 10 minutes of waiting.
auto_opportunistic = true
opportunistic_after_s = 600
# §3.3 "Job upgrade": a running opportunistic (qos 1) job becomes guaranteed once all
# its workers can be guaranteed where they run and its tenant's quota holds the whole job.
upgrade = true
# Algorithm 1 l. 7-8: a guaranteed gang that does not fit yet holds the free GPUs it can
# get (`reserve-gpus`) until it does.
reserve = true
# Ours: how many of a tenant's waiting guaranteed jobs may hold reservations at once
# (the paper gives no bound; one per tenant keeps reservations from fragmenting the
# cluster while every tenant's head-of-line gang still makes progress).
max_reserving_jobs_per_tenant = 1
# §3.3: "A GPU is allocated to only one resource-guarantee job". The validator enforces
# it for whole-GPU workers; this also keeps fractional guaranteed workers one per GPU.
one_guaranteed_per_gpu = true

[coordinator]
# Compute share (permille) an opportunistic workload starts from beside a guaranteed
# one, and is throttled back to (ours: 5 % of the GPU).
share_floor_permille = 50
# Step of the step-like raise (ours: 10 % of the GPU) and how often it is taken while
# the guaranteed job's mini-batch time holds (ours: 5 s, several node metric windows).
share_step_permille = 100
step_interval_ms = 5000
# The highest share an opportunistic workload is raised to beside a guaranteed one (ours:
# 900, the last step below the full GPU). At 1000 nothing paces it any more and the two
# contexts time-slice uncontrolled: measured on an H100, both then lose 1 + 1.21 · d_g · d_o
# of their speed (d: GPU busy share alone; 11 % for 0.9 beside 0.1, docs/gpu-validation.md)
# — past the tolerance below, so a raise to the full GPU would only ever end in a throttle.
opportunistic_max_permille = 900
# The guaranteed job's mini-batch time may exceed its baseline by this much before the
# opportunistic work is throttled (ours: 5 %; the paper's shared runs lose 0.8 % (Table 2)
# and 3.5 % (Fig. 12)).
slowdown_tolerance_pct = 5.0
# Pessimistic throttling (§3.3): "floor" drops every opportunistic workload of the GPU
# back to the floor at once; "halve" halves their shares.
throttle = "floor"
# After a throttle, the shares climb again no higher than the last share that held, for
# this long (ours: one minute), so the controller does not oscillate around the knee.
ceiling_hold_ms = 60000
# The baseline is the median of this many samples of the guaranteed job's performance with
# the opportunistic work at the floor (ours: 3 periods).
baseline_samples = 3
# A guaranteed job that gives no performance signal for this long after it arrives counts
# as stably executing for memory (the rest of the GPU memory goes to the opportunistic
# work); its opportunistic neighbours stay at the floor until it gives one (ours: 30 s).
settle_timeout_ms = 30000
# Without a reported mini-batch time (`iteration-ms` 0), use the guaranteed workload's
# launch rate as its performance signal (ms per 1000 launches).
launch_rate_fallback = true
# Memory kept free for the guaranteed job beyond what it has used (ours: 0, as in the
# paper's Table 2 where Job-A gets exactly the 2 GB Job-B leaves; set it above 0 where
# the node cannot spill a guaranteed job's excess to host memory).
guaranteed_headroom_mib = 0
# A guaranteed job whose allocations are refused (quota denials rising) is given this
# much more memory at once, taken from the opportunistic workloads, and keeps the extra
# room this long after its last denial (ours: 1 GiB, 30 s).
surge_step_mib = 1024
surge_hold_ms = 30000
# GPUs shared by opportunistic workloads only (§3.3, Fig. 10): memory moves between
# them by this step, by trial: a trial that does not raise the normalised aggregate
# performance by at least `trial_min_gain_pct` after `trial_period_ms` is undone, and
# the same pair is not tried again for `trial_cooldown_ms` (all ours).
memory_step_mib = 1024
trial_period_ms = 10000
trial_min_gain_pct = 2.0
trial_cooldown_ms = 60000
"#;

/// The whole configuration.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub scheduler: SchedulerConfig,
    pub coordinator: CoordinatorConfig,
}

/// The global scheduler's settings (see [`DEFAULT_CONFIG`]).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    pub utilization_threshold_pct: u8,
    pub auto_opportunistic: bool,
    pub opportunistic_after_s: u64,
    pub upgrade: bool,
    pub reserve: bool,
    pub max_reserving_jobs_per_tenant: u32,
    pub one_guaranteed_per_gpu: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            utilization_threshold_pct: 80,
            auto_opportunistic: true,
            opportunistic_after_s: 600,
            upgrade: true,
            reserve: true,
            max_reserving_jobs_per_tenant: 1,
            one_guaranteed_per_gpu: true,
        }
    }
}

/// How the coordinator throttles opportunistic work when the guaranteed job slows down.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Throttle {
    /// Back to the floor share at once.
    Floor,
    /// Half the current share (never below the floor).
    Halve,
}

/// The local coordinator's settings (see [`DEFAULT_CONFIG`]).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    pub share_floor_permille: u32,
    pub share_step_permille: u32,
    pub step_interval_ms: u64,
    pub opportunistic_max_permille: u32,
    pub slowdown_tolerance_pct: f64,
    pub throttle: Throttle,
    pub ceiling_hold_ms: u64,
    pub baseline_samples: u32,
    pub settle_timeout_ms: u64,
    pub launch_rate_fallback: bool,
    pub guaranteed_headroom_mib: u32,
    pub surge_step_mib: u32,
    pub surge_hold_ms: u64,
    pub memory_step_mib: u32,
    pub trial_period_ms: u64,
    pub trial_min_gain_pct: f64,
    pub trial_cooldown_ms: u64,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            share_floor_permille: 50,
            share_step_permille: 100,
            step_interval_ms: 5000,
            opportunistic_max_permille: 900,
            slowdown_tolerance_pct: 5.0,
            throttle: Throttle::Floor,
            ceiling_hold_ms: 60_000,
            baseline_samples: 3,
            settle_timeout_ms: 30_000,
            launch_rate_fallback: true,
            guaranteed_headroom_mib: 0,
            surge_step_mib: 1024,
            surge_hold_ms: 30_000,
            memory_step_mib: 1024,
            trial_period_ms: 10_000,
            trial_min_gain_pct: 2.0,
            trial_cooldown_ms: 60_000,
        }
    }
}

impl Config {
    /// Parses and checks a configuration document (empty: the defaults).
    pub fn parse(text: &str) -> Result<Config, PolicyError> {
        let cfg: Config =
            toml::from_str(text).map_err(|e| PolicyError::Failed(format!("antman config: {e}")))?;
        cfg.check()
            .map_err(|e| PolicyError::Failed(format!("antman config: {e}")))?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), String> {
        let s = &self.scheduler;
        if !(1..=100).contains(&s.utilization_threshold_pct) {
            return Err("scheduler.utilization_threshold_pct must be in 1..=100".into());
        }
        let c = &self.coordinator;
        if !(1..=FULL_GPU_MILLI).contains(&c.share_floor_permille) {
            return Err("coordinator.share_floor_permille must be in 1..=1000".into());
        }
        if !(c.share_floor_permille..=FULL_GPU_MILLI).contains(&c.opportunistic_max_permille) {
            return Err(
                "coordinator.opportunistic_max_permille must be in share_floor_permille..=1000"
                    .into(),
            );
        }
        if c.share_step_permille == 0 {
            return Err("coordinator.share_step_permille must be at least 1".into());
        }
        if !(c.slowdown_tolerance_pct.is_finite() && c.slowdown_tolerance_pct >= 0.0) {
            return Err("coordinator.slowdown_tolerance_pct must be >= 0".into());
        }
        if c.baseline_samples == 0 {
            return Err("coordinator.baseline_samples must be at least 1".into());
        }
        if c.memory_step_mib == 0 || c.surge_step_mib == 0 {
            return Err("coordinator memory steps must be at least 1 MiB".into());
        }
        if !c.trial_min_gain_pct.is_finite() {
            return Err("coordinator.trial_min_gain_pct must be a number".into());
        }
        Ok(())
    }
}
