//! The policy's configuration: SysMonitor thresholds and back-off, xCUDA pacing gains.
//!
//! MuxFlow says its thresholds and the parameters of Eq. 1–2 are "empirically selected"
//! (§4.1, §6) and publishes no values, so the defaults below are ours; each says why it was
//! chosen. The one number the paper does give, the 40 % memory quota of offline workloads
//! (§6), is the default of [`Config::offline_memory_quota_pct`].
//!
//! The document is TOML (what `meta.configure` passes), or JSON when it starts with `{`.
//! Keys left out keep their defaults; unknown keys are an error, so a typo never silently
//! leaves a threshold at its default.

use serde::Deserialize;

/// The default configuration, as returned in the manifest. Parses to [`Config::default`].
pub const DEFAULT_CONFIG: &str = r#"# SysMonitor: the GPU health state machine (MuxFlow §4.1, Figure 6b).
# Valid readings in Init before the GPU is Healthy.
init_samples = 1
# The clock is a pressure signal only while the GPU is busy (idle GPUs clock down).
clock_min_util_pct = 20.0
# Overlimit back-off: hold = base * 2^(n-1), n = entries into Overlimit in the window.
overlimit_window_ms = 7200000
overlimit_hold_base_ms = 2000
overlimit_hold_max_ms = 600000
# The n-th entry into Overlimit within the window disables the GPU (0 = never).
disable_after_overlimits = 6
# How long a disabled GPU stays disabled before it is re-initialised (0 = until an operator).
disabled_for_ms = 1800000
# What Unhealthy does to offline workloads: "throttle" (cap their share) or "freeze".
unhealthy_action = "throttle"
unhealthy_share_cap = 200
# Memory quota of offline workloads, percent of the GPU (MuxFlow §6: 40 %); 0 = leave as is.
offline_memory_quota_pct = 40.0

# Per metric: [healthy below, unhealthy at or above, overlimit above], in percent;
# `false` turns a metric off.
[thresholds]
utilization_pct = [90.0, 97.0, 100.0]
sm_activity_pct = [60.0, 80.0, 95.0]
memory_used_pct = [80.0, 90.0, 95.0]
sm_clock_drop_pct = [10.0, 20.0, 40.0]

# Host pressure (MuxFlow §6 evicts offline work "when the host memory usage is high or
# kswapd is busy"; the numbers are ours): while host memory is at or above
# `memory_used_pct` of the node's, or swap-ins stay at or above `swap_in_per_s` pages/s
# for `swap_for_ms`, one offline workload per period is evicted (most GPU memory first).
# 0 turns a signal off.
[host]
memory_used_pct = 95.0
swap_in_per_s = 1000
swap_for_ms = 10000

# Error patterns (MuxFlow §4.2 resets the CUDA context and MPS server on them): a GPU
# whose XID error count rises, or that the node reports not OK although it can read it
# (its MPS server faulted), is an Overlimit reading (offline work evicted, back-off,
# repeated: Disabled), and its MPS server is restarted, at most once per
# `restart_mps_every_ms` (ours). `restart_mps = false` leaves the server alone.
[errors]
restart_mps = true
restart_mps_every_ms = 60000

# xCUDA: GPU load = SM activity x clock factor (Eq. 1-2), PID-controlled offline share.
[pacing]
target_load = 0.7
clock_threshold_pct = 90.0
alpha_low = 4.0
alpha_high = 0.5
kp = 50.0
ki = 1000.0
kd = 0.0
min_share = 50
max_share = 1000
min_step = 10
"#;

/// What the Unhealthy state does to the offline workloads of a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnhealthyAction {
    /// Cap their compute share at [`Config::unhealthy_share_cap`] (launch pacing).
    Throttle,
    /// Hold all their launches in the interposer until the GPU is Healthy again.
    Freeze,
}

/// Thresholds of one metric, in percent, "higher is worse".
///
/// MuxFlow gives every state "a set of metric thresholds" (§4.1): a reading below `healthy`
/// lets an Unhealthy GPU recover, one at or above `unhealthy` makes a Healthy GPU Unhealthy,
/// one above `overlimit` makes it Overlimit. Between `healthy` and `unhealthy` the state is
/// kept (hysteresis), so a metric hovering at one value cannot flap the state every period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Band {
    pub healthy: f64,
    pub unhealthy: f64,
    pub overlimit: f64,
}

impl Band {
    pub const fn new(healthy: f64, unhealthy: f64, overlimit: f64) -> Band {
        Band {
            healthy,
            unhealthy,
            overlimit,
        }
    }

    fn check(&self, name: &str) -> Result<(), String> {
        let Band {
            healthy: h,
            unhealthy: u,
            overlimit: o,
        } = *self;
        if ![h, u, o]
            .iter()
            .all(|v| v.is_finite() && (0.0..=100.0).contains(v))
        {
            return Err(format!(
                "`thresholds.{name}` values must be percentages in 0..=100, got [{h}, {u}, {o}]"
            ));
        }
        if h > u || u > o {
            return Err(format!(
                "`thresholds.{name}` must be ordered healthy <= unhealthy <= overlimit, got [{h}, {u}, {o}]"
            ));
        }
        Ok(())
    }
}

/// `[h, u, o]` or `false` (metric off) in the document.
#[derive(Deserialize)]
#[serde(untagged)]
enum BandSpec {
    Band([f64; 3]),
    Flag(bool),
}

fn band<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Band>, D::Error> {
    match BandSpec::deserialize(d)? {
        BandSpec::Band([h, u, o]) => Ok(Some(Band::new(h, u, o))),
        BandSpec::Flag(false) => Ok(None),
        BandSpec::Flag(true) => Err(serde::de::Error::custom(
            "a metric is `false` (off) or `[healthy, unhealthy, overlimit]`",
        )),
    }
}

/// The four metrics SysMonitor watches (MuxFlow §4.1: "GPU utilization, SM activity, SM
/// clock, and GPU memory usage"). `None` turns a metric off.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// NVML `utilization.gpu`: the share of time any kernel ran. It saturates at 100 % on a
    /// GPU that is merely busy, so by default it can make a GPU Unhealthy but never Overlimit
    /// (`overlimit = 100` is never exceeded).
    #[serde(deserialize_with = "band")]
    pub utilization_pct: Option<Band>,
    /// SM activity as the node reports it (per-process SM utilization summed, else busy time).
    #[serde(deserialize_with = "band")]
    pub sm_activity_pct: Option<Band>,
    /// Device memory in use, percent of the GPU: an online workload's memory burst is what
    /// xCUDA's per-workload quota cannot answer and SysMonitor must (MuxFlow §4.1).
    #[serde(deserialize_with = "band")]
    pub memory_used_pct: Option<Band>,
    /// How far the SM clock sits below its maximum, percent (`100 - 100 * clock / max`). A
    /// falling clock is how an inference GPU shows overload (MuxFlow §4.1, T4).
    #[serde(deserialize_with = "band")]
    pub sm_clock_drop_pct: Option<Band>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            utilization_pct: Some(Band::new(90.0, 97.0, 100.0)),
            sm_activity_pct: Some(Band::new(60.0, 80.0, 95.0)),
            memory_used_pct: Some(Band::new(80.0, 90.0, 95.0)),
            sm_clock_drop_pct: Some(Band::new(10.0, 20.0, 40.0)),
        }
    }
}

/// xCUDA's compute control (MuxFlow §4.1, Eq. 1–2) and its PID controller.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Pacing {
    /// Set point of the GPU load `U_GPU = U_SM * N_C` (fraction). Below the SM-activity
    /// Unhealthy threshold, so a GPU held at its set point stays Healthy.
    pub target_load: f64,
    /// `T_SM`, the SM clock threshold, percent of the GPU's maximum clock (`C_H`). Above it the
    /// controller favours utilization, below it the clock (MuxFlow §4.1).
    pub clock_threshold_pct: f64,
    /// `a_L`: weight of a clock below `T_SM`. "Much larger than `a_H`" (MuxFlow §4.1).
    pub alpha_low: f64,
    /// `a_H`: weight of a clock above `T_SM`.
    pub alpha_high: f64,
    /// Proportional gain, permille of share per unit of load error.
    pub kp: f64,
    /// Integral gain, permille per unit of load error per second.
    pub ki: f64,
    /// Derivative gain, permille per unit of load error per second of rate.
    pub kd: f64,
    /// Lowest share the controller gives an offline workload (permille). Stopping it entirely
    /// is Unhealthy-with-freeze's or Overlimit's job, not the controller's.
    pub min_share: u32,
    /// Highest share (permille; 1000 = unthrottled).
    pub max_share: u32,
    /// Smallest change worth an action (permille): each change is a control-block write and a
    /// persisted record on the node, so noise-sized moves are skipped.
    pub min_step: u32,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            target_load: 0.7,
            clock_threshold_pct: 90.0,
            alpha_low: 4.0,
            alpha_high: 0.5,
            kp: 50.0,
            ki: 1000.0,
            kd: 0.0,
            min_share: 50,
            max_share: 1000,
            min_step: 10,
        }
    }
}

/// Host pressure that evicts offline workloads (MuxFlow §6; thresholds ours).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostPressure {
    /// Host memory in use, percent of the node's, at which offline work goes (0 = off).
    pub memory_used_pct: f64,
    /// Swap-ins per second that count as kswapd being busy (0 = off)...
    pub swap_in_per_s: u32,
    /// ...when they last this long (a burst of swap-ins is not pressure).
    pub swap_for_ms: u64,
}

impl Default for HostPressure {
    fn default() -> Self {
        HostPressure {
            memory_used_pct: 95.0,
            swap_in_per_s: 1000,
            swap_for_ms: 10_000,
        }
    }
}

/// What error patterns on a GPU do (MuxFlow §4.2; the rate limit is ours).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ErrorPatterns {
    /// Restart the GPU's MPS server (`restart-mps`) on an error pattern.
    pub restart_mps: bool,
    /// At most one restart per GPU in this long: a fault that outlives a restart is the
    /// state machine's to escalate (Overlimit back-off, then Disabled), not a restart loop's.
    pub restart_mps_every_ms: u64,
}

impl Default for ErrorPatterns {
    fn default() -> Self {
        ErrorPatterns {
            restart_mps: true,
            restart_mps_every_ms: 60_000,
        }
    }
}

/// The whole configuration.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Valid readings a GPU needs in Init before it is Healthy ("when the initialization
    /// finishes", MuxFlow §4.1).
    pub init_samples: u32,
    pub thresholds: Thresholds,
    /// The clock counts as pressure only at or above this utilization: an idle GPU lowers its
    /// clock to save power, which is not overload.
    pub clock_min_util_pct: f64,
    /// Window over which entries into Overlimit are counted ("the last two hours", §4.1).
    pub overlimit_window_ms: u64,
    /// Hold of the first entry into Overlimit; the n-th entry in the window holds
    /// `base * 2^(n-1)` ("the exponent of the times going into the Overlimit state", §4.1).
    pub overlimit_hold_base_ms: u64,
    /// Upper bound of the hold.
    pub overlimit_hold_max_ms: u64,
    /// The n-th entry into Overlimit within the window disables the GPU; 0 = never.
    pub disable_after_overlimits: u32,
    /// How long a GPU stays Disabled before it is re-initialised; 0 = until an operator.
    pub disabled_for_ms: u64,
    pub unhealthy_action: UnhealthyAction,
    /// Share cap of offline workloads in Unhealthy with `throttle` (permille).
    pub unhealthy_share_cap: u32,
    /// Memory quota of offline workloads, percent of the GPU's memory (MuxFlow §6 fixes it
    /// at 40 %, as most online workloads use under 60 %). Only ever lowers a quota. 0 = off.
    pub offline_memory_quota_pct: f64,
    pub host: HostPressure,
    pub errors: ErrorPatterns,
    pub pacing: Pacing,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            init_samples: 1,
            thresholds: Thresholds::default(),
            clock_min_util_pct: 20.0,
            overlimit_window_ms: 2 * 3600 * 1000,
            overlimit_hold_base_ms: 2000,
            overlimit_hold_max_ms: 600_000,
            disable_after_overlimits: 6,
            disabled_for_ms: 30 * 60 * 1000,
            unhealthy_action: UnhealthyAction::Throttle,
            unhealthy_share_cap: 200,
            offline_memory_quota_pct: 40.0,
            host: HostPressure::default(),
            errors: ErrorPatterns::default(),
            pacing: Pacing::default(),
        }
    }
}

impl Config {
    /// Parses and checks a configuration document (TOML, or JSON if it starts with `{`).
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("invalid JSON configuration: {e}"))?
        } else {
            toml::from_str(text).map_err(|e| format!("invalid TOML configuration: {e}"))?
        };
        config.check()?;
        Ok(config)
    }

    /// Rejects values the state machine or the controller cannot work with.
    pub fn check(&self) -> Result<(), String> {
        if self.init_samples == 0 {
            return Err("`init_samples` must be at least 1".into());
        }
        let t = &self.thresholds;
        for (name, b) in [
            ("utilization_pct", t.utilization_pct),
            ("sm_activity_pct", t.sm_activity_pct),
            ("memory_used_pct", t.memory_used_pct),
            ("sm_clock_drop_pct", t.sm_clock_drop_pct),
        ] {
            if let Some(b) = b {
                b.check(name)?;
            }
        }
        pct("clock_min_util_pct", self.clock_min_util_pct)?;
        pct("offline_memory_quota_pct", self.offline_memory_quota_pct)?;
        pct("host.memory_used_pct", self.host.memory_used_pct)?;
        if self.errors.restart_mps && self.errors.restart_mps_every_ms == 0 {
            return Err("`errors.restart_mps_every_ms` must be positive".into());
        }
        if self.overlimit_window_ms == 0 {
            return Err("`overlimit_window_ms` must be positive".into());
        }
        if self.overlimit_hold_base_ms == 0 {
            return Err("`overlimit_hold_base_ms` must be positive".into());
        }
        if self.overlimit_hold_max_ms < self.overlimit_hold_base_ms {
            return Err(format!(
                "`overlimit_hold_max_ms` ({}) is below `overlimit_hold_base_ms` ({})",
                self.overlimit_hold_max_ms, self.overlimit_hold_base_ms
            ));
        }
        permille("unhealthy_share_cap", self.unhealthy_share_cap)?;
        let p = &self.pacing;
        if !(p.target_load.is_finite() && p.target_load > 0.0 && p.target_load <= 2.0) {
            return Err(format!(
                "`pacing.target_load` must be in (0, 2], got {}",
                p.target_load
            ));
        }
        if !(p.clock_threshold_pct.is_finite()
            && p.clock_threshold_pct > 0.0
            && p.clock_threshold_pct < 100.0)
        {
            return Err(format!(
                "`pacing.clock_threshold_pct` must be in (0, 100), got {}",
                p.clock_threshold_pct
            ));
        }
        for (name, v) in [
            ("alpha_low", p.alpha_low),
            ("alpha_high", p.alpha_high),
            ("kp", p.kp),
            ("ki", p.ki),
            ("kd", p.kd),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "`pacing.{name}` must be a non-negative number, got {v}"
                ));
            }
        }
        permille("pacing.min_share", p.min_share)?;
        permille("pacing.max_share", p.max_share)?;
        if p.min_share > p.max_share {
            return Err(format!(
                "`pacing.min_share` ({}) is above `pacing.max_share` ({})",
                p.min_share, p.max_share
            ));
        }
        if p.min_step > 1000 {
            return Err(format!(
                "`pacing.min_step` must be at most 1000, got {}",
                p.min_step
            ));
        }
        Ok(())
    }
}

fn pct(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && (0.0..=100.0).contains(&v) {
        Ok(())
    } else {
        Err(format!("`{name}` must be a percentage in 0..=100, got {v}"))
    }
}

fn permille(name: &str, v: u32) -> Result<(), String> {
    if (1..=1000).contains(&v) {
        Ok(())
    } else {
        Err(format!("`{name}` must be in 1..=1000 permille, got {v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_document_is_the_default() {
        assert_eq!(Config::parse(DEFAULT_CONFIG), Ok(Config::default()));
        assert_eq!(Config::parse(""), Ok(Config::default()));
        assert_eq!(Config::parse("{}"), Ok(Config::default()));
    }

    #[test]
    fn keys_override_defaults_in_toml_and_json() {
        let c = Config::parse(
            "unhealthy_action = \"freeze\"\n[thresholds]\nutilization_pct = false\n\
             memory_used_pct = [50, 60, 70]\n[pacing]\nkp = 10.0\n",
        )
        .expect("valid");
        assert_eq!(c.unhealthy_action, UnhealthyAction::Freeze);
        assert_eq!(c.thresholds.utilization_pct, None);
        assert_eq!(
            c.thresholds.memory_used_pct,
            Some(Band::new(50.0, 60.0, 70.0))
        );
        assert_eq!(
            c.thresholds.sm_activity_pct,
            Thresholds::default().sm_activity_pct
        );
        assert_eq!(c.pacing.kp, 10.0);
        assert_eq!(c.pacing.ki, Pacing::default().ki);

        let j = Config::parse(r#"{"disabled_for_ms": 0, "pacing": {"min_share": 100}}"#)
            .expect("valid json");
        assert_eq!(j.disabled_for_ms, 0);
        assert_eq!(j.pacing.min_share, 100);
    }

    #[test]
    fn bad_documents_are_rejected_with_the_reason() {
        let cases = [
            ("init_samples = 0", "init_samples"),
            ("no_such_key = 1", "no_such_key"),
            ("[thresholds]\nsm_activity_pct = [90, 80, 95]", "ordered"),
            ("[thresholds]\nsm_activity_pct = [10, 20, 200]", "0..=100"),
            (
                "[thresholds]\nsm_activity_pct = [10, 20]",
                "sm_activity_pct",
            ),
            ("[thresholds]\nsm_activity_pct = true", "sm_activity_pct"),
            ("[thresholds]\nvram = [1, 2, 3]", "vram"),
            ("unhealthy_action = \"panic\"", "panic"),
            ("unhealthy_share_cap = 0", "unhealthy_share_cap"),
            ("unhealthy_share_cap = 1001", "unhealthy_share_cap"),
            ("overlimit_hold_base_ms = 0", "overlimit_hold_base_ms"),
            (
                "overlimit_hold_base_ms = 5000\noverlimit_hold_max_ms = 1000",
                "overlimit_hold_max_ms",
            ),
            ("overlimit_window_ms = 0", "overlimit_window_ms"),
            (
                "offline_memory_quota_pct = 140.0",
                "offline_memory_quota_pct",
            ),
            ("[host]\nmemory_used_pct = 101.0", "host.memory_used_pct"),
            ("[host]\nkswapd = 1", "kswapd"),
            ("[errors]\nrestart_mps_every_ms = 0", "restart_mps_every_ms"),
            ("[pacing]\ntarget_load = 0.0", "target_load"),
            (
                "[pacing]\nclock_threshold_pct = 100.0",
                "clock_threshold_pct",
            ),
            ("[pacing]\nki = -1.0", "ki"),
            ("[pacing]\nmin_share = 600\nmax_share = 500", "min_share"),
            ("[pacing]\nmax_share = 2000", "max_share"),
            ("[pacing]\nmin_step = 5000", "min_step"),
            ("init_samples = \"three\"", "init_samples"),
            ("this is not toml", "TOML"),
            ("{ not json", "JSON"),
        ];
        for (doc, needle) in cases {
            match Config::parse(doc) {
                Ok(c) => panic!("{doc:?} accepted as {c:?}"),
                Err(e) => assert!(e.contains(needle), "{doc:?}: {e:?} lacks {needle:?}"),
            }
        }
    }
}
