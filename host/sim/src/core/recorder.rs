//! The recorder: what a run measured, the same way for every model — per-job
//! times from the integrator's tracks, time series, fragmentation samples.

use crate::core::progress::JobTrack;
use crate::metrics::SeriesPoint;
use arbiter_host::state::ClusterState;
use arbiter_policy_sdk::Cluster;
use arbiter_policy_sdk::model::FULL_GPU_MILLI;
use std::sync::Arc;

/// A measure of how fragmented a cluster's idle GPU capacity is (the FGD
/// paper's F(M) against a target workload), in milli-GPU. The simulator
/// takes it from outside: the measure is a paper's definition, shared with
/// whoever reports against that paper.
pub trait FragmentationMeter {
    fn measure(&mut self, cluster: &Cluster) -> f64;
}

/// Makes a meter for a run from the shapes of the run's tasks.
pub type MeterFactory =
    Arc<dyn Fn(&[&crate::scenario::SimTask]) -> Box<dyn FragmentationMeter> + Send + Sync>;

/// Percent, 0 for an empty denominator.
pub fn pct(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        100.0 * used as f64 / capacity as f64
    }
}

/// Fragmentation of `state`'s cluster: (GPUs, % of idle capacity).
pub fn fragmentation(
    meter: &mut dyn FragmentationMeter,
    state: &ClusterState,
    capacity_milli: u64,
    used_milli: u64,
) -> (f64, f64) {
    let frag = meter.measure(state.cluster());
    let idle = capacity_milli.saturating_sub(used_milli) as f64;
    let ratio = if idle > 0.0 { 100.0 * frag / idle } else { 0.0 };
    (frag / f64::from(FULL_GPU_MILLI), ratio)
}

/// Queueing delays and completion times, in seconds, of every job that
/// started (resp. finished), from the integrator's tracks.
pub struct JobTimes {
    pub queue_s: Vec<f64>,
    pub jct_s: Vec<f64>,
}

impl JobTimes {
    pub fn collect<'a>(
        tracks: &[JobTrack],
        arrivals_ms: impl IntoIterator<Item = &'a u64>,
    ) -> JobTimes {
        let mut queue_s = Vec::new();
        let mut jct_s = Vec::new();
        for (t, &arrival) in tracks.iter().zip(arrivals_ms) {
            if let Some(s) = t.first_start {
                queue_s.push(s.saturating_sub(arrival) as f64 / 1000.0);
            }
            if let Some(e) = t.end {
                jct_s.push(e.saturating_sub(arrival) as f64 / 1000.0);
            }
        }
        JobTimes { queue_s, jct_s }
    }
}

/// A time series sampled at most every `step` (plus whatever the model adds).
pub struct Series {
    pub points: Vec<SeriesPoint>,
    next: u64,
    step: u64,
}

impl Series {
    pub fn every(first: u64, step: u64) -> Series {
        Series {
            points: Vec::new(),
            next: first,
            step: step.max(1),
        }
    }

    /// Whether a sample is due at `now` (and, if so, the next one is `now + step`).
    pub fn due(&mut self, now: u64) -> bool {
        if now >= self.next {
            self.next = now.saturating_add(self.step);
            true
        } else {
            false
        }
    }
}
