//! Result types and the small statistics they need.

use serde::Serialize;

/// Nearest-rank percentile (`p` in 0..=100) of unsorted values; 0 when empty.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Sample standard deviation; 0 for fewer than two values.
pub fn std_dev(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let m = mean(values);
    (values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
}

/// Metrics of the FGD static-placement protocol.
#[derive(Clone, Debug, Serialize)]
pub struct FgdMetrics {
    /// Mean allocation (allocated / total milli-GPU, percent) over the
    /// tasks whose arrived GPU request rounds to 100 % of capacity
    /// (`models::fgd::AllocBuckets`); NaN if none arrived near it.
    pub gpu_alloc_pct_at_100: f64,
    /// The same at the `tune` ratio (130 % by default).
    pub gpu_alloc_pct_at_130: f64,
    /// GPUs left unallocated at that allocation: GPUs × (1 − alloc@130).
    pub unallocated_gpus_at_130: f64,
    /// Fragmentation (FGD's F(M), in GPUs) when the arrived request reaches 80%.
    pub frag_gpus_at_80: f64,
    /// Fragmentation over idle GPU capacity at 80% arrival, percent.
    pub frag_ratio_pct_at_80: f64,
    /// Tasks offered (after tuning).
    pub tasks_offered: usize,
    /// Tasks the policy could not place (removed, as in the protocol).
    pub tasks_failed: usize,
    /// Arrived GPU request at the end, percent of capacity.
    pub arrived_pct: f64,
}

/// Metrics of a time-based replay.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayMetrics {
    pub jobs_completed: usize,
    /// Started and still running when the trace ended (no departure time).
    pub jobs_running_at_end: usize,
    /// Never started: waiting when nothing was left to happen.
    pub jobs_unplaced: usize,
    pub avg_jct_s: f64,
    pub p95_jct_s: f64,
    pub avg_queue_s: f64,
    pub p95_queue_s: f64,
    pub max_queue_s: f64,
    /// First arrival to last completion.
    pub makespan_s: f64,
    /// Time-weighted mean of allocated / total milli-GPU over the makespan.
    pub mean_gpu_alloc_pct: f64,
    pub peak_gpu_alloc_pct: f64,
    pub peak_pending: usize,
    pub preemptions: u64,
}

/// One point of a run's time series. `x` is virtual seconds in a replay and
/// arrived GPU request (% of capacity) in the FGD protocol.
#[derive(Clone, Debug, Serialize)]
pub struct SeriesPoint {
    pub x: f64,
    pub gpu_alloc_pct: f64,
    /// FGD fragmentation over idle capacity, percent (`None` where not sampled).
    pub frag_ratio_pct: Option<f64>,
    pub frag_gpus: Option<f64>,
    pub pending: usize,
    pub running: usize,
}

/// What became of one task.
#[derive(Clone, Debug, Serialize)]
pub struct TaskRecord {
    pub task: String,
    pub arrival_s: f64,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub gpus: f64,
    pub outcome: &'static str,
}

impl TaskRecord {
    pub fn queue_s(&self) -> Option<f64> {
        self.start_s.map(|s| s - self.arrival_s)
    }
    pub fn jct_s(&self) -> Option<f64> {
        self.end_s.map(|e| e - self.arrival_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!((std_dev(&[1.0, 3.0]) - 2f64.sqrt()).abs() < 1e-12);
    }
}
