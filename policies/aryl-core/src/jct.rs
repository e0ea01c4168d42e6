//! Running-time and JCT model of elastic jobs (Aryl §5, Appendix C).
//!
//! A job carries a fixed amount of work `L` (Appendix C, "the workload `L` …
//! of a job. For elastic scaling jobs, the total workload is constant").
//! With `w` workers it progresses at `throughput(w)` units of work per
//! millisecond, so its running time is `L / throughput(w)` (Eq. 1 with
//! linear speed-up, where `throughput(w) = w`).

/// How a job's throughput grows with its worker count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Speedup {
    /// `throughput(w) = w`: the paper's default assumption (§5, §7.1, Eq. 1).
    Linear,
    /// The imperfect scaling of §7.2: up to the midpoint of the scaling range
    /// the job scales linearly; "whenever a job scales beyond the midpoint of
    /// its scaling range, its throughput suffers additional 10% loss from the
    /// ideal performance each time it scales one step further". We read the
    /// loss as additive against the ideal: `k` steps past the midpoint give
    /// `w · (1 − loss_per_step · k)` (never below zero).
    SubLinear { loss_per_step: f64 },
}

impl Speedup {
    /// Relative throughput of `workers` workers of a job whose scaling range
    /// is `min..=max`.
    pub fn throughput(self, workers: u32, min: u32, max: u32) -> f64 {
        let w = f64::from(workers);
        match self {
            Speedup::Linear => w,
            Speedup::SubLinear { loss_per_step } => {
                // Midpoint of the scaling range, rounded down: a job at
                // `min + (max - min) / 2` workers still scales ideally.
                let mid = min + max.saturating_sub(min) / 2;
                let steps = f64::from(workers.saturating_sub(mid));
                (w * (1.0 - loss_per_step * steps)).max(0.0)
            }
        }
    }
}

/// One elastic (or, with `min == max`, inelastic) job of the JCT model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ElasticJob {
    pub min_workers: u32,
    pub max_workers: u32,
    /// GPUs each worker takes (`D_j` of Algorithm 2).
    pub gpus_per_worker: u32,
    /// Total work `L`, in "one ideal worker" milliseconds.
    pub workload: f64,
}

impl ElasticJob {
    /// A job described as in Tables 2 and 4: its *minimum* running time,
    /// reached with `max_workers` workers.
    pub fn from_min_running_time(
        min_workers: u32,
        max_workers: u32,
        gpus_per_worker: u32,
        min_running_time: f64,
        speedup: Speedup,
    ) -> Self {
        let workload = min_running_time * speedup.throughput(max_workers, min_workers, max_workers);
        ElasticJob {
            min_workers,
            max_workers,
            gpus_per_worker,
            workload,
        }
    }

    /// A job described by an estimate of its (remaining) running time at
    /// `at_workers` workers, which is what the contract's `estimate-ms` is.
    pub fn from_estimate(
        min_workers: u32,
        max_workers: u32,
        gpus_per_worker: u32,
        estimate: f64,
        at_workers: u32,
        speedup: Speedup,
    ) -> Self {
        let at = at_workers.clamp(min_workers.max(1), max_workers.max(min_workers).max(1));
        let workload = estimate * speedup.throughput(at, min_workers, max_workers);
        ElasticJob {
            min_workers,
            max_workers,
            gpus_per_worker,
            workload,
        }
    }

    /// Running time with `workers` workers (Eq. 1); infinite when the job
    /// makes no progress.
    pub fn running_time(&self, workers: u32, speedup: Speedup) -> f64 {
        let tp = speedup.throughput(workers, self.min_workers, self.max_workers);
        if tp > 0.0 {
            self.workload / tp
        } else {
            f64::INFINITY
        }
    }

    /// `T_j^max`: the running time at the base demand (Algorithm 2, line 5).
    pub fn max_running_time(&self, speedup: Speedup) -> f64 {
        self.running_time(self.min_workers.max(1), speedup)
    }

    /// The value of the knapsack item "`flexible` workers on top of the base
    /// demand": the running-time reduction over `T_j^max` (§5.2; Algorithm 2,
    /// line 18 — `T_j^max · w / (w + w_min)` under linear speed-up).
    pub fn flexible_value(&self, flexible: u32, speedup: Speedup) -> f64 {
        let base = self.min_workers.max(1);
        self.max_running_time(speedup) - self.running_time(base + flexible, speedup)
    }
}

/// JCTs of jobs that all start at time 0 with `initial` workers on a cluster
/// of `capacity_gpus` GPUs, as Tables 3 and 4 compute them: "once the first
/// job finishes, the other is immediately allocated more resources as much as
/// possible". With more than two jobs the freed GPUs go to the unfinished job
/// with the least remaining running time first (the SJF spirit of §5.2), each
/// up to its `max_workers`.
///
/// Returns one JCT per job; a job that can never finish gets `INFINITY`.
pub fn simulate_jcts(
    jobs: &[ElasticJob],
    initial: &[u32],
    capacity_gpus: u32,
    speedup: Speedup,
) -> Vec<f64> {
    let n = jobs.len();
    let mut workers: Vec<u32> = (0..n)
        .map(|i| initial.get(i).copied().unwrap_or(0))
        .collect();
    let mut remaining: Vec<f64> = jobs.iter().map(|j| j.workload).collect();
    let mut jct = vec![f64::INFINITY; n];
    let mut done = vec![false; n];
    let mut now = 0.0;
    for _ in 0..n {
        // Next completion among the running jobs.
        let next = (0..n)
            .filter(|&i| !done[i])
            .map(|i| {
                let tp = speedup.throughput(workers[i], jobs[i].min_workers, jobs[i].max_workers);
                let t = if tp > 0.0 {
                    remaining[i] / tp
                } else {
                    f64::INFINITY
                };
                (t, i)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((dt, _)) = next else { break };
        if !dt.is_finite() {
            break;
        }
        now += dt;
        for i in 0..n {
            if done[i] {
                continue;
            }
            let tp = speedup.throughput(workers[i], jobs[i].min_workers, jobs[i].max_workers);
            remaining[i] -= tp * dt;
            // Jobs finishing at the same instant (up to rounding) finish together.
            if remaining[i] <= 1e-9 * jobs[i].workload.max(1.0) {
                remaining[i] = 0.0;
                done[i] = true;
                jct[i] = now;
                workers[i] = 0;
            }
        }
        // Hand the free GPUs out again, shortest remaining time first.
        let used: u64 = (0..n)
            .map(|i| u64::from(workers[i]) * u64::from(jobs[i].gpus_per_worker))
            .sum();
        let mut free = u64::from(capacity_gpus).saturating_sub(used);
        let mut order: Vec<usize> = (0..n).filter(|&i| !done[i]).collect();
        order.sort_by(|&a, &b| {
            let ta = jobs[a].running_time(workers[a].max(1), speedup) * remaining[a]
                / jobs[a].workload.max(f64::MIN_POSITIVE);
            let tb = jobs[b].running_time(workers[b].max(1), speedup) * remaining[b]
                / jobs[b].workload.max(f64::MIN_POSITIVE);
            ta.total_cmp(&tb).then(a.cmp(&b))
        });
        for i in order {
            let per = u64::from(jobs[i].gpus_per_worker.max(1));
            let room = u64::from(jobs[i].max_workers.saturating_sub(workers[i]));
            let add = room.min(free / per);
            workers[i] += add as u32;
            free -= add * per;
        }
    }
    jct
}

/// Mean of a list of JCTs (0 for an empty list).
pub fn average(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}
