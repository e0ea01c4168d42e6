//! The ground truth of one GPU that an online service shares with at most one offline training
//! job (MuxFlow's world): how much the offline job gets, how much the service's requests slow
//! down, and what NVML would show.
//!
//! Everything here is the simulator's own physics, never a policy's estimate (the matcher's
//! predictor must learn it from profiles). MuxFlow publishes no model of its GPUs; the rules and
//! constants are ours, each anchored where the paper gives a number (`docs/reproductions/
//! muxflow.md` lists them with their sensitivity):
//!
//! * **The service** keeps the GPU busy a share `load` of the time alone (its duty cycle) and
//!   fills a share `sm_per_load · load` of the SMs (SM activity; MuxFlow §7.5's production
//!   averages, 16 % SM activity at 26 % utilization, give 0.62).
//! * **Space sharing under MPS** (MuxFlow). The offline job is an MPS client limited to a
//!   share `s` of the SMs (the active-thread %), paced to a share `c` of its launches by xCUDA.
//!   Alone on `s` it runs at `min(1, s / fill)^sm_exponent` of its solo speed (`fill`: the SMs
//!   it fills alone; Fig. 4: more than 5× between 10 % and 100 % of the SMs). While the service
//!   computes (a share `load` of the time) the two contend for memory bandwidth and caches: the
//!   offline job loses a share `pair_sensitivity` of its speed then (Fig. 4: up to 50 % across
//!   pairs). The service's kernels stretch by `1 + mps_interference · x`, `x` the SM share the
//!   offline job keeps busy (Fig. 4: the offline job gains up to 62 % of a GPU with the service
//!   less than 20 % slower).
//! * **Time sharing** (Gandiva, no MPS): the driver alternates time slices between the two
//!   contexts. The offline job has the GPU whenever the service is idle, and half of it while
//!   both have work, less the switching cost; the service's kernels wait for the offline
//!   job's slices: they stretch by `1 + time_slice_interference · busy` (the paper: up to 50 %
//!   slower).
//! * **Priority time sharing** (AntMan, PAI): the offline job computes only while the service
//!   is idle, less the switching cost; the service's kernels wait at most for one offline kernel
//!   to drain: `1 + priority_interference · busy`.
//! * **Latency.** A service is an M/M/1 queue at utilization `load`: a request's mean response
//!   time is `S / (1 − load)` alone and `k·S / (1 − k·load)` with its kernels stretched by `k`.
//!   Response times are exponential (the queue's), so a percentile of many services' minutes is
//!   a percentile of a mixture of exponentials ([`mixture_percentile`]).
//! * **NVML.** Utilization is the share of time any kernel runs; SM activity the share of SMs
//!   busy; the SM clock drops `clock_drop` of its maximum as SM activity goes from
//!   `clock_knee` to 100 % (power capping on a T4; MuxFlow Eq. 1–2 react to it).

use serde::{Deserialize, Serialize};

/// How the offline job shares the GPU with the service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// MPS clients with an SM limit (MuxFlow).
    #[default]
    Mps,
    /// The driver's time slices (Gandiva's packing).
    TimeSlicing,
    /// Time slices only when the service is idle (AntMan, PAI).
    PriorityTimeSlicing,
}

/// The physics' constants (see the module docs; all ours, anchored as stated).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Physics {
    /// The service's SM activity per unit of load (§7.5: 16 / 26).
    pub sm_per_load: f64,
    /// Exponent of the offline speed in its SM share (Fig. 4: > 5× over 10–100 %).
    pub sm_exponent: f64,
    /// Service kernel stretch per unit of SM share the offline job keeps busy under MPS
    /// (Fig. 4: 62 % of a GPU for < 20 % slower: 0.2 / 0.62).
    pub mps_interference: f64,
    /// Service kernel stretch when the offline job always has work, time slicing (§7.3:
    /// "up to 50 %").
    pub time_slice_interference: f64,
    /// The same under priority time slicing (one offline kernel to drain; ours).
    pub priority_interference: f64,
    /// Share of GPU time lost to switching contexts when both have work (ours).
    pub switch_cost: f64,
    /// SM activity above which the SM clock drops (ours).
    pub clock_knee: f64,
    /// How far the clock drops at 100 % SM activity (ours; a T4 at its power cap).
    pub clock_drop: f64,
}

impl Default for Physics {
    fn default() -> Self {
        Physics {
            sm_per_load: 16.0 / 26.0,
            sm_exponent: 0.75,
            mps_interference: 0.2 / 0.62,
            time_slice_interference: 0.5,
            priority_interference: 0.05,
            switch_cost: 0.05,
            clock_knee: 0.6,
            clock_drop: 0.2,
        }
    }
}

impl Physics {
    /// Refuses constants the rules cannot work with.
    pub fn check(&self) -> Result<(), String> {
        let unit = |name: &str, v: f64| {
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("`{name}` must be in [0, 1], got {v}"))
            }
        };
        unit("sm_per_load", self.sm_per_load)?;
        unit("switch_cost", self.switch_cost)?;
        unit("clock_knee", self.clock_knee)?;
        unit("clock_drop", self.clock_drop)?;
        for (name, v) in [
            ("sm_exponent", self.sm_exponent),
            ("mps_interference", self.mps_interference),
            ("time_slice_interference", self.time_slice_interference),
            ("priority_interference", self.priority_interference),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("`{name}` must be non-negative, got {v}"));
            }
        }
        if self.clock_knee >= 1.0 {
            return Err("`clock_knee` must be below 1".into());
        }
        Ok(())
    }
}

/// The offline job on the GPU and the limits the node put on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offline {
    /// SMs it fills alone, in (0, 1].
    pub fill: f64,
    /// Share of its speed it loses while the service computes (this pair's), in [0, 1].
    pub pair_sensitivity: f64,
    /// MPS active-thread share, in (0, 1] (MPS sharing only).
    pub sm_share: f64,
    /// xCUDA's launch pacing: the share of its launches let through, in [0, 1].
    pub pacing: f64,
}

/// What one GPU does over an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuOutcome {
    /// Offline speed relative to running alone on the GPU, in [0, 1].
    pub offline_speed: f64,
    /// Share of the GPU's SMs the offline job keeps busy.
    pub offline_sm: f64,
    /// The service's kernels take this many times as long (≥ 1).
    pub kernel_stretch: f64,
    /// NVML utilization and SM activity, in [0, 1].
    pub utilization: f64,
    pub sm_activity: f64,
    /// SM clock as a share of its maximum.
    pub clock: f64,
}

/// One GPU: the service at `load` (its duty cycle alone), and the offline job if any.
pub fn share_gpu(p: &Physics, sharing: Sharing, load: f64, offline: Option<Offline>) -> GpuOutcome {
    let load = load.clamp(0.0, 1.0);
    let service_sm = (p.sm_per_load * load).min(1.0);
    let Some(f) = offline else {
        return with_clock(
            p,
            GpuOutcome {
                kernel_stretch: 1.0,
                utilization: load,
                sm_activity: service_sm,
                ..GpuOutcome::default()
            },
        );
    };
    let fill = f.fill.clamp(1e-6, 1.0);
    let pacing = f.pacing.clamp(0.0, 1.0);
    // (offline speed, SMs it keeps busy, service kernel stretch, NVML utilization)
    let (speed, offline_sm, stretch, utilization) = match sharing {
        Sharing::Mps => {
            let share = f.sm_share.clamp(0.0, 1.0);
            let alone = (share / fill).min(1.0).powf(p.sm_exponent);
            let contention = 1.0 - f.pair_sensitivity.clamp(0.0, 1.0) * load;
            let speed = alone * contention * pacing;
            // Its SMs stay busy while it is let through, at the rate contention leaves.
            let sm = share.min(fill) * contention * pacing;
            let utilization = load + (1.0 - load) * pacing;
            (speed, sm, 1.0 + p.mps_interference * sm, utilization)
        }
        Sharing::TimeSlicing => {
            let gpu_time = ((1.0 - load) + load * 0.5 * (1.0 - p.switch_cost)) * pacing;
            let stretch = 1.0 + p.time_slice_interference * pacing;
            (
                gpu_time,
                fill * gpu_time,
                stretch,
                load + (1.0 - load) * pacing,
            )
        }
        Sharing::PriorityTimeSlicing => {
            let gpu_time = (1.0 - load) * (1.0 - p.switch_cost) * pacing;
            let stretch = 1.0 + p.priority_interference * pacing;
            (gpu_time, fill * gpu_time, stretch, load + gpu_time)
        }
    };
    with_clock(
        p,
        GpuOutcome {
            offline_speed: speed.clamp(0.0, 1.0),
            offline_sm,
            kernel_stretch: stretch,
            utilization: utilization.clamp(0.0, 1.0),
            sm_activity: (service_sm + offline_sm).min(1.0),
            clock: 1.0,
        },
    )
}

fn with_clock(p: &Physics, mut o: GpuOutcome) -> GpuOutcome {
    let over = ((o.sm_activity - p.clock_knee) / (1.0 - p.clock_knee)).clamp(0.0, 1.0);
    o.clock = 1.0 - p.clock_drop * over;
    o
}

/// A service's mean response time over its service time alone, at `load` with its kernels
/// stretched by `stretch` (M/M/1); saturation is capped at 99 % busy.
pub fn response_time(load: f64, stretch: f64) -> f64 {
    let busy = (load.clamp(0.0, 1.0) * stretch).min(0.99);
    stretch / (1.0 - busy)
}

/// The `q` quantile (in (0, 1)) of a mixture of exponential distributions given as
/// (weight, mean) pairs: bisection on the mixture's CDF.
pub fn mixture_percentile(parts: &[(f64, f64)], q: f64) -> f64 {
    let total: f64 = parts.iter().map(|(w, _)| w.max(0.0)).sum();
    if total <= 0.0 || !(0.0..1.0).contains(&q) {
        return 0.0;
    }
    let cdf = |x: f64| {
        parts
            .iter()
            .filter(|(w, m)| *w > 0.0 && *m > 0.0)
            .map(|(w, m)| w * (1.0 - (-x / m).exp()))
            .sum::<f64>()
            / total
    };
    let mut hi = parts.iter().map(|(_, m)| *m).fold(0.0, f64::max) * 50.0;
    if hi <= 0.0 {
        return 0.0;
    }
    let mut lo = 0.0;
    while cdf(hi) < q {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) < q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offline(sm_share: f64) -> Offline {
        Offline {
            fill: 1.0,
            pair_sensitivity: 0.3,
            sm_share,
            pacing: 1.0,
        }
    }

    #[test]
    fn alone_the_service_shows_its_load_and_keeps_its_clock() {
        let p = Physics::default();
        let o = share_gpu(&p, Sharing::Mps, 0.26, None);
        assert_eq!((o.offline_speed, o.kernel_stretch), (0.0, 1.0));
        assert!((o.utilization - 0.26).abs() < 1e-12);
        assert!((o.sm_activity - 0.16).abs() < 1e-12, "§7.5: 16 % at 26 %");
        assert_eq!(o.clock, 1.0);
    }

    #[test]
    fn the_offline_speed_spans_more_than_five_times_over_the_sm_share() {
        // Fig. 4: more than 5× between 10 % and 100 % of the SMs.
        let p = Physics::default();
        let at = |s| share_gpu(&p, Sharing::Mps, 0.0, Some(offline(s))).offline_speed;
        assert!(at(1.0) / at(0.1) > 5.0, "{} / {}", at(1.0), at(0.1));
        assert_eq!(at(1.0), 1.0);
    }

    #[test]
    fn mps_gives_the_offline_job_more_and_slows_the_service_less_than_time_slicing() {
        let p = Physics::default();
        let load = 0.3;
        let mps = share_gpu(&p, Sharing::Mps, load, Some(offline(0.8)));
        let ts = share_gpu(&p, Sharing::TimeSlicing, load, Some(offline(1.0)));
        let pb = share_gpu(&p, Sharing::PriorityTimeSlicing, load, Some(offline(1.0)));
        assert!(mps.kernel_stretch < ts.kernel_stretch);
        assert!(pb.kernel_stretch < mps.kernel_stretch);
        assert!(pb.offline_speed < ts.offline_speed);
        // Time slicing slows the service by the paper's "up to 50 %".
        assert!((ts.kernel_stretch - 1.5).abs() < 1e-12);
        // The Fig. 4 anchor: an offline job keeping 62 % of the SMs busy costs the service 20 %.
        let anchor = 1.0 + p.mps_interference * 0.62;
        assert!((anchor - 1.2).abs() < 1e-12);
    }

    #[test]
    fn pacing_takes_the_offline_job_and_its_interference_down_together() {
        let p = Physics::default();
        let full = share_gpu(&p, Sharing::Mps, 0.5, Some(offline(0.9)));
        let paced = share_gpu(
            &p,
            Sharing::Mps,
            0.5,
            Some(Offline {
                pacing: 0.5,
                ..offline(0.9)
            }),
        );
        assert!((paced.offline_speed - full.offline_speed / 2.0).abs() < 1e-12);
        assert!(paced.kernel_stretch < full.kernel_stretch);
        // A busy GPU clocks down.
        assert!(full.clock < 1.0);
    }

    #[test]
    fn response_times_and_their_percentiles() {
        assert!((response_time(0.5, 1.0) - 2.0).abs() < 1e-12);
        assert!((response_time(0.5, 1.2) - 1.2 / 0.4).abs() < 1e-12);
        assert!(response_time(0.9, 2.0) <= 2.0 / 0.01 + 1e-9, "capped");
        // One exponential: the 99th percentile is its mean times ln 100.
        let p99 = mixture_percentile(&[(1.0, 2.0)], 0.99);
        assert!((p99 - 2.0 * 100f64.ln()).abs() < 1e-6, "{p99}");
        // A mixture sits between its parts.
        let mix = mixture_percentile(&[(1.0, 1.0), (1.0, 4.0)], 0.99);
        assert!(mix > 100f64.ln() && mix < 4.0 * 100f64.ln());
    }
}
