//! SysMonitor's GPU health state machine (MuxFlow §4.1, Figure 6b), as plain Rust.
//!
//! Five states: **Init** (the GPU is being initialised) → **Healthy** (offline workloads may
//! run and be scheduled) ⇄ **Unhealthy** (one metric reached its Unhealthy threshold, none its
//! Overlimit one: online workloads may be affected, nothing new is scheduled) → **Overlimit**
//! (the device is overloaded: offline workloads are evicted) → back to Unhealthy once every
//! metric stayed below its Overlimit threshold for a hold period that doubles with each entry
//! into Overlimit in the last two hours. **Disabled** (no offline workload runs) is where a GPU
//! that keeps going Overlimit ends up; it is re-initialised after a cool-down.
//!
//! The machine only sees one [`Level`] per period (the worst metric, see [`classify`]) and the
//! time; it never looks at workloads, so it is tested on its own.

use crate::config::{Band, Config};
use arbiter_policy_sdk::model::{GpuStatus, health};
use std::collections::VecDeque;

/// The five SysMonitor states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Init,
    Healthy,
    Unhealthy,
    Overlimit,
    Disabled,
}

impl State {
    /// The contract's `health` code (`wit/policy.wit`, `types.health`).
    pub fn code(self) -> u8 {
        match self {
            State::Init => health::INIT,
            State::Healthy => health::HEALTHY,
            State::Unhealthy => health::UNHEALTHY,
            State::Overlimit => health::OVERLIMIT,
            State::Disabled => health::DISABLED,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Init => "init",
            State::Healthy => "healthy",
            State::Unhealthy => "unhealthy",
            State::Overlimit => "overlimit",
            State::Disabled => "disabled",
        }
    }
}

/// How bad one period's reading is: the worst of its metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Every metric below its Healthy threshold.
    Healthy,
    /// Some metric between its Healthy and Unhealthy thresholds (hysteresis band: keep state).
    Band,
    /// Some metric at or above its Unhealthy threshold, none above Overlimit.
    Unhealthy,
    /// Some metric above its Overlimit threshold.
    Overlimit,
    /// No reading (the node could not sample the GPU). Counts as Unhealthy: protection
    /// cannot be verified, but one failed sample is no proof of overload either.
    Missing,
}

fn level_of(value: f64, band: Option<Band>) -> Level {
    match band {
        None => Level::Healthy,
        Some(b) if value > b.overlimit => Level::Overlimit,
        Some(b) if value >= b.unhealthy => Level::Unhealthy,
        Some(b) if value < b.healthy => Level::Healthy,
        Some(_) => Level::Band,
    }
}

/// Metrics of one GPU reading, each as a percentage where higher is worse.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metrics {
    pub utilization_pct: f64,
    pub sm_activity_pct: f64,
    pub memory_used_pct: f64,
    pub sm_clock_drop_pct: f64,
}

impl Metrics {
    /// Reads a GPU's status; `None` when the node had no sample (it then reports zero clocks
    /// and, for a GPU it never sampled, zero memory).
    pub fn from_status(gpu: &GpuStatus, config: &Config) -> Option<Metrics> {
        if gpu.max_sm_clock_mhz == 0 || gpu.memory_total_mib == 0 {
            return None;
        }
        let utilization = f64::from(gpu.utilization_pct);
        let memory = 100.0 * f64::from(gpu.memory_used_mib) / f64::from(gpu.memory_total_mib);
        let clock_ratio = f64::from(gpu.sm_clock_mhz) / f64::from(gpu.max_sm_clock_mhz);
        let clock_drop = if utilization >= config.clock_min_util_pct {
            (100.0 * (1.0 - clock_ratio)).clamp(0.0, 100.0)
        } else {
            0.0
        };
        Some(Metrics {
            utilization_pct: utilization,
            sm_activity_pct: f64::from(gpu.sm_activity_pct),
            memory_used_pct: memory.min(100.0),
            sm_clock_drop_pct: clock_drop,
        })
    }
}

/// The worst level among the metrics (MuxFlow §4.1: "once one metric reaches ...").
pub fn classify(metrics: Option<&Metrics>, config: &Config) -> Level {
    let Some(m) = metrics else {
        return Level::Missing;
    };
    let t = &config.thresholds;
    [
        level_of(m.utilization_pct, t.utilization_pct),
        level_of(m.sm_activity_pct, t.sm_activity_pct),
        level_of(m.memory_used_pct, t.memory_used_pct),
        level_of(m.sm_clock_drop_pct, t.sm_clock_drop_pct),
    ]
    .into_iter()
    .max()
    .unwrap_or(Level::Healthy)
}

/// A state change, for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
}

/// The state machine of one GPU.
#[derive(Clone, Debug)]
pub struct Monitor {
    state: State,
    /// Valid readings seen in Init.
    init_seen: u32,
    /// When the GPU entered Overlimit, within the counting window (oldest first).
    overlimit_entries: VecDeque<u64>,
    /// The current Overlimit hold.
    hold_ms: u64,
    /// Since when every metric has been below its Overlimit threshold (in Overlimit).
    calm_since: Option<u64>,
    /// When the GPU was disabled.
    disabled_at: u64,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new()
    }
}

impl Monitor {
    pub fn new() -> Monitor {
        Monitor {
            state: State::Init,
            init_seen: 0,
            overlimit_entries: VecDeque::new(),
            hold_ms: 0,
            calm_since: None,
            disabled_at: 0,
        }
    }

    /// A machine that starts Disabled (the node still reports a GPU disabled by an earlier
    /// instance: a restarted policy must not re-enable it early).
    pub fn disabled(now_ms: u64) -> Monitor {
        Monitor {
            state: State::Disabled,
            disabled_at: now_ms,
            ..Monitor::new()
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The hold of the current (or last) Overlimit episode.
    pub fn hold_ms(&self) -> u64 {
        self.hold_ms
    }

    /// Entries into Overlimit still inside the window (as of the last step).
    pub fn overlimit_count(&self) -> usize {
        self.overlimit_entries.len()
    }

    /// Advances one period with this reading's level; returns the change, if any.
    pub fn step(&mut self, level: Level, now_ms: u64, config: &Config) -> Option<Transition> {
        let from = self.state;
        self.prune(now_ms, config);
        match self.state {
            State::Disabled => {
                let cooled = config.disabled_for_ms > 0
                    && now_ms.saturating_sub(self.disabled_at) >= config.disabled_for_ms;
                if cooled {
                    // "enabled" (Figure 6b): back through Init, so the GPU proves itself again.
                    self.state = State::Init;
                    self.init_seen = 0;
                }
            }
            State::Init => {
                if level != Level::Missing {
                    self.init_seen += 1;
                }
                if self.init_seen >= config.init_samples {
                    self.state = State::Healthy;
                    // The reading that finished initialisation is judged at once: a GPU that
                    // comes up overloaded must not look Healthy for a period.
                    self.judge(level, now_ms, config);
                }
            }
            State::Healthy | State::Unhealthy => self.judge(level, now_ms, config),
            State::Overlimit => {
                if level == Level::Overlimit {
                    self.calm_since = None;
                } else {
                    let since = *self.calm_since.get_or_insert(now_ms);
                    if now_ms.saturating_sub(since) >= self.hold_ms {
                        self.state = State::Unhealthy;
                        self.calm_since = None;
                    }
                }
            }
        }
        (self.state != from).then_some(Transition {
            from,
            to: self.state,
        })
    }

    /// Healthy/Unhealthy edges of Figure 6b.
    fn judge(&mut self, level: Level, now_ms: u64, config: &Config) {
        match level {
            Level::Overlimit => self.enter_overlimit(now_ms, config),
            Level::Unhealthy | Level::Missing => self.state = State::Unhealthy,
            Level::Healthy => self.state = State::Healthy,
            Level::Band => {}
        }
    }

    /// Enters Overlimit, or Disabled if this is one entry too many in the window. The hold is
    /// `base * 2^(n-1)` for the n-th entry in the window ("the exponent of the times going into
    /// the Overlimit state during the last two hours", MuxFlow §4.1).
    fn enter_overlimit(&mut self, now_ms: u64, config: &Config) {
        self.overlimit_entries.push_back(now_ms);
        let n = self.overlimit_entries.len() as u32;
        if config.disable_after_overlimits > 0 && n >= config.disable_after_overlimits {
            self.state = State::Disabled;
            self.disabled_at = now_ms;
            self.calm_since = None;
            return;
        }
        let doublings = n.saturating_sub(1).min(63);
        self.hold_ms = config
            .overlimit_hold_base_ms
            .saturating_mul(1u64 << doublings)
            .min(config.overlimit_hold_max_ms);
        self.calm_since = None;
        self.state = State::Overlimit;
    }

    fn prune(&mut self, now_ms: u64, config: &Config) {
        while let Some(&t) = self.overlimit_entries.front() {
            if now_ms.saturating_sub(t) >= config.overlimit_window_ms {
                self.overlimit_entries.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Thresholds;

    fn cfg() -> Config {
        Config::default()
    }

    fn gpu(util: u8, sm: u8, clock: u32, used: u32) -> GpuStatus {
        GpuStatus {
            index: 0,
            utilization_pct: util,
            sm_activity_pct: sm,
            sm_clock_mhz: clock,
            max_sm_clock_mhz: 2000,
            memory_used_mib: used,
            memory_total_mib: 1000,
            health: health::HEALTHY,
            observed_ok: true,
            ..GpuStatus::default()
        }
    }

    fn level(g: &GpuStatus) -> Level {
        let c = cfg();
        classify(Metrics::from_status(g, &c).as_ref(), &c)
    }

    #[test]
    fn classify_takes_the_worst_metric_with_hysteresis() {
        assert_eq!(level(&gpu(10, 10, 2000, 100)), Level::Healthy);
        // SM activity 70 %: between healthy (60) and unhealthy (80).
        assert_eq!(level(&gpu(70, 70, 2000, 100)), Level::Band);
        assert_eq!(level(&gpu(80, 80, 2000, 100)), Level::Unhealthy);
        assert_eq!(level(&gpu(96, 96, 2000, 100)), Level::Overlimit);
        // Memory alone: 96 % used is above the 95 % Overlimit threshold.
        assert_eq!(level(&gpu(10, 10, 2000, 960)), Level::Overlimit);
        assert_eq!(level(&gpu(10, 10, 2000, 900)), Level::Unhealthy);
        // Clock at 70 % of max while busy: a 30 % drop, Unhealthy; at 50 %: Overlimit.
        assert_eq!(level(&gpu(50, 50, 1400, 100)), Level::Unhealthy);
        assert_eq!(level(&gpu(50, 50, 1000, 100)), Level::Overlimit);
        // ... but an idle GPU's low clock is power saving, not pressure.
        assert_eq!(level(&gpu(5, 5, 300, 100)), Level::Healthy);
        // Utilization saturating at 100 makes a GPU Unhealthy, never Overlimit.
        assert_eq!(level(&gpu(100, 50, 2000, 100)), Level::Unhealthy);
        // No reading.
        let mut lost = gpu(0, 0, 0, 0);
        lost.max_sm_clock_mhz = 0;
        assert_eq!(level(&lost), Level::Missing);
        // A metric turned off never counts.
        let c = Config {
            thresholds: Thresholds {
                memory_used_pct: None,
                ..Thresholds::default()
            },
            ..Config::default()
        };
        let g = gpu(10, 10, 2000, 999);
        assert_eq!(
            classify(Metrics::from_status(&g, &c).as_ref(), &c),
            Level::Healthy
        );
    }

    #[test]
    fn init_becomes_healthy_after_init_samples_valid_readings() {
        let c = Config {
            init_samples: 3,
            ..cfg()
        };
        let mut m = Monitor::new();
        assert_eq!(
            m.step(Level::Missing, 0, &c),
            None,
            "no reading, no progress"
        );
        assert_eq!(m.step(Level::Healthy, 100, &c), None);
        assert_eq!(m.step(Level::Healthy, 200, &c), None);
        assert_eq!(m.state(), State::Init);
        assert_eq!(
            m.step(Level::Healthy, 300, &c),
            Some(Transition {
                from: State::Init,
                to: State::Healthy
            })
        );
        // A GPU that finishes Init overloaded goes straight to Overlimit.
        let mut m = Monitor::new();
        m.step(Level::Overlimit, 0, &cfg());
        assert_eq!(m.state(), State::Overlimit);
    }

    #[test]
    fn healthy_unhealthy_overlimit_edges_follow_figure_6b() {
        let c = cfg();
        let mut m = Monitor::new();
        m.step(Level::Healthy, 0, &c);
        assert_eq!(m.state(), State::Healthy);
        // The band keeps Healthy Healthy ...
        m.step(Level::Band, 100, &c);
        assert_eq!(m.state(), State::Healthy);
        m.step(Level::Unhealthy, 200, &c);
        assert_eq!(m.state(), State::Unhealthy);
        // ... and Unhealthy Unhealthy: only all-below-Healthy recovers.
        m.step(Level::Band, 300, &c);
        assert_eq!(m.state(), State::Unhealthy);
        m.step(Level::Healthy, 400, &c);
        assert_eq!(m.state(), State::Healthy);
        // Healthy jumps straight to Overlimit.
        m.step(Level::Overlimit, 500, &c);
        assert_eq!(m.state(), State::Overlimit);
        // Unhealthy to Overlimit too.
        let mut m = Monitor::new();
        m.step(Level::Unhealthy, 0, &c);
        assert_eq!(m.state(), State::Unhealthy);
        m.step(Level::Overlimit, 100, &c);
        assert_eq!(m.state(), State::Overlimit);
        // A failed sample makes a Healthy GPU Unhealthy.
        let mut m = Monitor::new();
        m.step(Level::Healthy, 0, &c);
        m.step(Level::Missing, 100, &c);
        assert_eq!(m.state(), State::Unhealthy);
    }

    #[test]
    fn overlimit_holds_until_calm_for_the_hold_then_unhealthy() {
        let c = cfg(); // base hold 2 s
        let mut m = Monitor::new();
        m.step(Level::Overlimit, 0, &c);
        assert_eq!((m.state(), m.hold_ms()), (State::Overlimit, 2000));
        // Calm from t=100 ms; an Overlimit reading at 1500 restarts the clock.
        m.step(Level::Healthy, 100, &c);
        m.step(Level::Healthy, 1500, &c);
        m.step(Level::Overlimit, 1600, &c);
        m.step(Level::Healthy, 1700, &c);
        m.step(Level::Healthy, 3600, &c);
        assert_eq!(m.state(), State::Overlimit, "only 1.9 s calm");
        let t = m.step(Level::Healthy, 3700, &c);
        assert_eq!(
            t,
            Some(Transition {
                from: State::Overlimit,
                to: State::Unhealthy
            }),
            "Overlimit leaves to Unhealthy, never straight to Healthy"
        );
        m.step(Level::Healthy, 3800, &c);
        assert_eq!(m.state(), State::Healthy);
        assert_eq!(
            m.overlimit_count(),
            1,
            "re-entering Overlimit is not counted twice"
        );
    }

    #[test]
    fn hold_doubles_with_each_entry_in_the_window_and_resets_after_it() {
        let c = Config {
            disable_after_overlimits: 0,
            overlimit_hold_max_ms: 20_000,
            ..cfg()
        };
        let mut m = Monitor::new();
        let mut now = 0;
        let mut holds = Vec::new();
        for _ in 0..6 {
            m.step(Level::Overlimit, now, &c);
            assert_eq!(m.state(), State::Overlimit);
            holds.push(m.hold_ms());
            // Calm for exactly the hold: back to Unhealthy, then Healthy.
            now += 100;
            m.step(Level::Healthy, now, &c);
            now += m.hold_ms();
            m.step(Level::Healthy, now, &c);
            assert_eq!(m.state(), State::Unhealthy);
            now += 100;
            m.step(Level::Healthy, now, &c);
            assert_eq!(m.state(), State::Healthy);
        }
        assert_eq!(holds, [2000, 4000, 8000, 16_000, 20_000, 20_000], "capped");
        // Two hours later the history has expired: back to the base hold.
        now += 2 * 3600 * 1000;
        m.step(Level::Overlimit, now, &c);
        assert_eq!((m.overlimit_count(), m.hold_ms()), (1, 2000));
    }

    #[test]
    fn repeated_overlimits_disable_the_gpu_until_the_cool_down() {
        let c = Config {
            disable_after_overlimits: 3,
            disabled_for_ms: 60_000,
            ..cfg()
        };
        let mut m = Monitor::new();
        let mut now = 0;
        for _ in 0..2 {
            m.step(Level::Overlimit, now, &c);
            assert_eq!(m.state(), State::Overlimit);
            now += m.hold_ms() + 1;
            m.step(Level::Healthy, now - m.hold_ms() - 1, &c);
            m.step(Level::Healthy, now, &c);
            assert_eq!(m.state(), State::Unhealthy);
        }
        let t = m.step(Level::Overlimit, now + 1, &c);
        assert_eq!(
            t,
            Some(Transition {
                from: State::Unhealthy,
                to: State::Disabled
            })
        );
        // Nothing brings a disabled GPU back before its cool-down ...
        m.step(Level::Healthy, now + 30_000, &c);
        assert_eq!(m.state(), State::Disabled);
        // ... after it, it is re-initialised ("enabled" → Init), then judged again.
        m.step(Level::Healthy, now + 60_001, &c);
        assert_eq!(m.state(), State::Init);
        m.step(Level::Healthy, now + 60_101, &c);
        assert_eq!(m.state(), State::Healthy);
        // `disabled_for_ms = 0`: only an operator re-enables it.
        let c = Config {
            disabled_for_ms: 0,
            ..c
        };
        let mut m = Monitor::disabled(0);
        m.step(Level::Healthy, u64::MAX / 2, &c);
        assert_eq!(m.state(), State::Disabled);
    }

    #[test]
    fn state_codes_match_the_contract() {
        let codes: Vec<u8> = [
            State::Init,
            State::Healthy,
            State::Unhealthy,
            State::Overlimit,
            State::Disabled,
        ]
        .iter()
        .map(|s| s.code())
        .collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
    }
}
