//! xCUDA's compute control (MuxFlow §4.1, Figure 6a), as plain Rust: the GPU load of Eq. 1–2
//! and the PID controller that turns it into the offline workloads' compute share.
//!
//! xCUDA delays an offline workload's kernel launches when the GPU load is high and lets them
//! through when it is low; "as the GPU load may change rapidly, xCUDA leverages the PID
//! algorithm" (§4.1). Here the delay is the interposer's launch pacing, set through the
//! workload's compute share, and the controller runs in the coordinator once per period.

use crate::config::Pacing;

/// The clock factor `N_C` of Eq. 2: above 1 when the SM clock `c` is below the threshold `t`
/// (the load counts more: favour the clock), below 1 above it (favour utilization).
///
/// `N_C = 1 + a_L (T_SM - C_SM) / T_SM` if `C_SM < T_SM`, else
/// `1 - a_H (C_SM - T_SM) / (C_H - T_SM)`.
pub fn clock_factor(clock_mhz: f64, max_clock_mhz: f64, pacing: &Pacing) -> f64 {
    let t = max_clock_mhz * pacing.clock_threshold_pct / 100.0;
    if t <= 0.0 {
        return 1.0;
    }
    if clock_mhz < t {
        1.0 + pacing.alpha_low * (t - clock_mhz) / t
    } else if max_clock_mhz > t {
        1.0 - pacing.alpha_high * (clock_mhz.min(max_clock_mhz) - t) / (max_clock_mhz - t)
    } else {
        1.0
    }
}

/// The GPU load `U_GPU = U_SM × N_C` of Eq. 1, with `U_SM` as a fraction.
pub fn gpu_load(sm_activity_pct: f64, clock_mhz: f64, max_clock_mhz: f64, pacing: &Pacing) -> f64 {
    (sm_activity_pct / 100.0) * clock_factor(clock_mhz, max_clock_mhz, pacing)
}

/// A PID controller in velocity (incremental) form whose output is a compute share in
/// permille.
///
/// The velocity form changes the output by `kp·Δe + ki·e·dt + kd·Δ²e/dt` each step, so clamping
/// the output to `[min_share, max_share]` is also the anti-windup: there is no integral term to
/// saturate while the share sits at a bound, and the controller moves off the bound on the first
/// period the error changes sign. The error is `load − target`: a load above the set point
/// lowers the share.
#[derive(Clone, Debug, PartialEq)]
pub struct Pid {
    share: f64,
    /// Last two errors, newest first (`None` until observed).
    e1: Option<f64>,
    e2: Option<f64>,
}

impl Pid {
    /// A controller starting from the share the workloads have now.
    pub fn new(initial_share: u32, pacing: &Pacing) -> Pid {
        Pid {
            share: f64::from(initial_share.clamp(pacing.min_share, pacing.max_share)),
            e1: None,
            e2: None,
        }
    }

    /// The current output, in permille.
    pub fn share(&self) -> u32 {
        self.share.round() as u32
    }

    /// One control period: `load` measured now, `dt_s` seconds since the last update.
    pub fn update(&mut self, load: f64, dt_s: f64, pacing: &Pacing) -> u32 {
        if !load.is_finite() {
            // A reading that is not a number must not poison the error history.
            return self.share();
        }
        let e = load - pacing.target_load;
        let dt = if dt_s.is_finite() && dt_s > 0.0 {
            dt_s
        } else {
            0.1
        };
        // No history yet: no proportional or derivative kick on the first period.
        let e1 = self.e1.unwrap_or(e);
        let e2 = self.e2.unwrap_or(e1);
        let delta =
            pacing.kp * (e - e1) + pacing.ki * e * dt + pacing.kd * (e - 2.0 * e1 + e2) / dt;
        if delta.is_finite() {
            self.share = (self.share - delta)
                .clamp(f64::from(pacing.min_share), f64::from(pacing.max_share));
        }
        self.e2 = self.e1;
        self.e1 = Some(e);
        self.share()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Pacing {
        Pacing::default()
    }

    #[test]
    fn clock_factor_follows_eq_2() {
        let pc = p(); // T_SM = 90 % of max, a_L = 4, a_H = 0.5
        let max = 2000.0;
        assert!(
            (clock_factor(1800.0, max, &pc) - 1.0).abs() < 1e-9,
            "at T_SM"
        );
        // Half-way below T_SM (900 of 1800): 1 + 4 * 0.5 = 3.
        assert!((clock_factor(900.0, max, &pc) - 3.0).abs() < 1e-9);
        // At the highest clock: 1 - 0.5 = 0.5.
        assert!((clock_factor(2000.0, max, &pc) - 0.5).abs() < 1e-9);
        // a_L >> a_H: half-way below T_SM weighs much more than half-way above it.
        let below = clock_factor(900.0, max, &pc) - 1.0;
        let above = 1.0 - clock_factor(1900.0, max, &pc);
        assert!((below - 2.0).abs() < 1e-9 && (above - 0.25).abs() < 1e-9);
        assert_eq!(
            clock_factor(1000.0, 0.0, &pc),
            1.0,
            "no clock data: neutral"
        );
        assert!(
            (gpu_load(50.0, 900.0, max, &pc) - 1.5).abs() < 1e-9,
            "Eq. 1"
        );
    }

    /// A plant: an online workload uses `online` of the SMs; the offline one would use
    /// `offline_demand` unthrottled and uses that times its share. The SM clock falls linearly
    /// from the max at 50 % activity to 60 % of max at 100 %.
    fn plant(online: f64, offline_demand: f64, share: u32) -> (f64, f64) {
        let activity = (online + offline_demand * f64::from(share) / 1000.0).min(1.0);
        let max = 2000.0;
        let clock = if activity <= 0.5 {
            max
        } else {
            max * (1.0 - 0.4 * (activity - 0.5) / 0.5)
        };
        (activity * 100.0, clock)
    }

    fn run(pid: &mut Pid, online: f64, periods: usize, pc: &Pacing) -> Vec<(u32, f64)> {
        (0..periods)
            .map(|_| {
                let (sm, clock) = plant(online, 0.8, pid.share());
                let load = gpu_load(sm, clock, 2000.0, pc);
                (pid.update(load, 0.1, pc), load)
            })
            .collect()
    }

    #[test]
    fn step_response_settles_at_the_set_point_without_oscillating() {
        let pc = p();
        let mut pid = Pid::new(1000, &pc);
        // Quiet online workload: the offline one can have most of the GPU, held at the target.
        let quiet = run(&mut pid, 0.1, 100, &pc);
        let (_, settled) = quiet[quiet.len() - 1];
        assert!(
            (settled - pc.target_load).abs() < 0.03,
            "settles at the set point, got {settled:.3}"
        );
        let quiet_share = pid.share();
        assert!(
            quiet_share > 500,
            "offline keeps most of the GPU: {quiet_share}"
        );

        // Burst: the online workload jumps to 50 % of the SMs.
        let burst = run(&mut pid, 0.5, 100, &pc);
        let first = burst[0].0;
        assert!(
            first + pc.min_step <= quiet_share,
            "the first period after the burst already lowers the share ({quiet_share} -> {first})"
        );
        let within_1s = burst[9].1;
        assert!(
            (within_1s - pc.target_load).abs() < 0.12,
            "within 1 s the load is near the set point, got {within_1s:.3}"
        );
        let tail = &burst[50..];
        let (lo, hi) = tail
            .iter()
            .fold((u32::MAX, 0), |(lo, hi), (s, _)| (lo.min(*s), hi.max(*s)));
        assert!(hi - lo <= 5, "steady, no limit cycle: shares {lo}..{hi}");
        let (_, load) = burst[burst.len() - 1];
        assert!(
            (load - pc.target_load).abs() < 0.03,
            "back at the set point: {load:.3}"
        );
        assert!(pid.share() < quiet_share);

        // The burst ends: the share comes back up.
        let after = run(&mut pid, 0.1, 100, &pc);
        assert!(after[after.len() - 1].0 >= quiet_share - 5);
    }

    #[test]
    fn output_is_clamped_and_recovers_from_the_bound_at_once() {
        let pc = p();
        let mut pid = Pid::new(1000, &pc);
        // Online alone saturates the GPU: the share hits the floor and stays there.
        for _ in 0..200 {
            let (sm, clock) = plant(1.0, 0.8, pid.share());
            pid.update(gpu_load(sm, clock, 2000.0, &pc), 0.1, &pc);
        }
        assert_eq!(pid.share(), pc.min_share);
        // No wind-up: the first idle period raises it.
        let (sm, clock) = plant(0.0, 0.8, pid.share());
        let next = pid.update(gpu_load(sm, clock, 2000.0, &pc), 0.1, &pc);
        assert!(next > pc.min_share);
        // Garbage never leaves the bounds.
        pid.update(f64::NAN, 0.1, &pc);
        pid.update(f64::INFINITY, 0.0, &pc);
        assert!((pc.min_share..=pc.max_share).contains(&pid.share()));
        assert_eq!(
            Pid::new(0, &pc).share(),
            pc.min_share,
            "initial share clamped"
        );
    }
}
