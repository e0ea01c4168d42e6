//! Runtime statistics of each workload, for the contract's `job-metric` (AntMan's bottom-up
//! statistics; G24): the iteration time, from the iteration counter the workload bumps through
//! the interposer's `arbiter_iteration()`; the GPU memory in use at its lowest and highest; the
//! GPU utilization attributed to it. Memory and utilization are sampled once per control
//! period; the window is what the agent reports in one heartbeat (`take_window` starts the
//! next).

/// Iteration time from the block's counter and the stamp of its last iteration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterationClock {
    count: u64,
    last_ns: u64,
    ms: u32,
}

impl IterationClock {
    /// Takes a reading of the counter; returns the mean time per iteration over the iterations
    /// finished since the previous reading (the last value while none finished, 0 until two
    /// readings are apart by one).
    pub fn observe(&mut self, count: u64, last_ns: u64) -> u32 {
        if count < self.count {
            // A new block (relaunch): start over.
            *self = IterationClock::default();
        }
        if count > self.count && self.count > 0 && last_ns > self.last_ns {
            let per = (last_ns - self.last_ns) / (count - self.count);
            self.ms = u32::try_from(per / 1_000_000).unwrap_or(u32::MAX).max(1);
        }
        if count > self.count {
            self.count = count;
            self.last_ns = last_ns;
        }
        self.ms
    }

    pub fn ms(&self) -> u32 {
        self.ms
    }
}

/// Memory and utilization over the current window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    peak_memory_mib: u32,
    min_memory_mib: Option<u32>,
    peak_host_memory_mib: u32,
    utilization_sum: f64,
    utilization_samples: u32,
}

/// One workload's statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkloadStats {
    pub iteration: IterationClock,
    window: Window,
    /// What the node enforces now (the latest period's).
    enforced: Enforced,
}

/// The limits the node enforces on a workload: its memory limit (MiB) and compute share
/// (permille).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    pub memory_limit_mib: u32,
    pub compute_share_permille: u32,
}

/// What a window says about one workload (per worker: the busiest GPU's memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSample {
    pub iteration_ms: u32,
    pub peak_memory_mib: u32,
    pub min_memory_mib: u32,
    /// Highest host-spilled memory of the window.
    pub host_memory_mib: u32,
    pub utilization_pct: u8,
    /// The limits in force at the end of the window.
    pub enforced: Enforced,
}

impl WorkloadStats {
    /// One control period's reading of GPU memory in use, memory spilled to the host, and
    /// attributed utilization (percent of the GPU; `None`: NVML could not tell this period).
    pub fn sample(&mut self, memory_mib: u32, host_memory_mib: u32, utilization_pct: Option<f64>) {
        let w = &mut self.window;
        w.peak_memory_mib = w.peak_memory_mib.max(memory_mib);
        w.peak_host_memory_mib = w.peak_host_memory_mib.max(host_memory_mib);
        w.min_memory_mib = Some(w.min_memory_mib.map_or(memory_mib, |m| m.min(memory_mib)));
        if let Some(u) = utilization_pct.filter(|u| u.is_finite()) {
            w.utilization_sum += u.clamp(0.0, 100.0);
            w.utilization_samples += 1;
        }
    }

    /// The limits the node enforces now.
    pub fn enforce(&mut self, enforced: Enforced) {
        self.enforced = enforced;
    }

    /// The window so far, and a fresh one; `None` when no period was sampled in it.
    pub fn take_window(&mut self) -> Option<StatsSample> {
        let w = std::mem::take(&mut self.window);
        let min = w.min_memory_mib?;
        Some(StatsSample {
            iteration_ms: self.iteration.ms(),
            peak_memory_mib: w.peak_memory_mib,
            min_memory_mib: min,
            host_memory_mib: w.peak_host_memory_mib,
            enforced: self.enforced,
            utilization_pct: if w.utilization_samples == 0 {
                0
            } else {
                (w.utilization_sum / f64::from(w.utilization_samples)).round() as u8
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn iteration_time_is_the_mean_since_the_last_reading() {
        let mut c = IterationClock::default();
        assert_eq!(c.observe(0, 0), 0, "no iteration yet");
        assert_eq!(c.observe(1, 100 * MS), 0, "one stamp is no interval");
        assert_eq!(c.observe(4, 400 * MS), 100, "3 iterations in 300 ms");
        assert_eq!(c.observe(4, 400 * MS), 100, "none finished: the last value");
        assert_eq!(c.observe(5, 650 * MS), 250);
        // The workload was relaunched with a fresh block.
        assert_eq!(c.observe(2, 50 * MS), 0);
        assert_eq!(c.observe(3, 80 * MS), 30);
    }

    #[test]
    fn a_window_keeps_the_extremes_and_the_mean_utilization() {
        let mut s = WorkloadStats::default();
        assert_eq!(s.take_window(), None, "nothing sampled");
        s.sample(1024, 0, Some(40.0));
        s.sample(3072, 700, None);
        s.sample(2048, 300, Some(60.0));
        s.iteration.observe(1, MS);
        s.iteration.observe(3, 41 * MS);
        let w = s.take_window().expect("sampled");
        assert_eq!(
            w,
            StatsSample {
                iteration_ms: 20,
                peak_memory_mib: 3072,
                min_memory_mib: 1024,
                host_memory_mib: 700,
                utilization_pct: 50,
                enforced: Enforced::default(),
            }
        );
        assert_eq!(s.take_window(), None, "a fresh window");
        s.sample(512, 0, Some(f64::NAN));
        assert_eq!(
            s.take_window()
                .map(|w| (w.min_memory_mib, w.utilization_pct)),
            Some((512, 0))
        );
    }
}
