//! Two-phase resource allocation (Aryl §5.2, Appendix D Algorithm 2), over
//! plain data: worker counts only, no placement.
//!
//! Phase one (`AllocateInelastic`) serves the *inelastic* demand — inelastic
//! jobs and the base demand (`w_min`) of elastic jobs — shortest job first.
//! Phase two (`AllocateElastic`) gives the GPUs left over to the *flexible*
//! demand of queued and running elastic jobs by a multiple-choice knapsack.

use crate::jct::{ElasticJob, Speedup};
use crate::knapsack::{self, Item};

/// A job waiting in the queue. An inelastic job has `min_workers == max_workers`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueuedJob {
    /// The caller's identifier, returned as is.
    pub key: usize,
    pub job: ElasticJob,
    /// Whether the running time is known; unknown ones are served after all
    /// known ones, in arrival order (SJF cannot rank them).
    pub runtime_known: bool,
    pub submit_ms: u64,
}

impl QueuedJob {
    fn is_elastic(&self) -> bool {
        self.job.min_workers < self.job.max_workers
    }
}

/// A running elastic job whose flexible workers are up for re-allocation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunningElastic {
    pub key: usize,
    /// Built from the *remaining* running time at the current worker count.
    pub job: ElasticJob,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocParams {
    pub speedup: Speedup,
    /// Cell budget of the knapsack DP (see [`knapsack::solve`]).
    pub max_dp_cells: u64,
}

impl Default for AllocParams {
    fn default() -> Self {
        AllocParams {
            speedup: Speedup::Linear,
            max_dp_cells: 4_000_000,
        }
    }
}

/// The outcome of Algorithm 2.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// Keys of the queued jobs admitted in phase one, in SJF order.
    pub admitted: Vec<usize>,
    /// Final worker count per key, for every admitted job and every running
    /// elastic job (base + flexible).
    pub workers: Vec<(usize, u32)>,
    /// GPUs of the capacity left unallocated.
    pub left_gpus: u64,
    /// Weight unit the knapsack ran with (1 = exact).
    pub dp_unit: u32,
}

impl Allocation {
    /// Worker count allocated to `key`, if any.
    pub fn workers_of(&self, key: usize) -> Option<u32> {
        self.workers
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, w)| w)
    }
}

/// `SortJobs` (Algorithm 2, lines 1–9): increasing running time, where an
/// elastic job counts with `T_j^max` (its running time at the base demand) and
/// an inelastic one with `T_j`. Returns positions into `queued`.
pub fn sort_jobs(queued: &[QueuedJob], speedup: Speedup) -> Vec<usize> {
    let mut order: Vec<usize> = (0..queued.len()).collect();
    let key = |q: &QueuedJob| q.job.max_running_time(speedup);
    order.sort_by(|&a, &b| {
        let (qa, qb) = (&queued[a], &queued[b]);
        (!qa.runtime_known)
            .cmp(&!qb.runtime_known)
            .then_with(|| {
                if qa.runtime_known && qb.runtime_known {
                    key(qa).total_cmp(&key(qb))
                } else {
                    core::cmp::Ordering::Equal
                }
            })
            .then(qa.submit_ms.cmp(&qb.submit_ms))
            .then(qa.key.cmp(&qb.key))
    });
    order
}

/// The knapsack group of one elastic job (Algorithm 2, lines 13–19): one
/// item per possible number `w = 1..=w_max − w_min` of flexible workers.
///
/// Algorithm 2 line 17 writes the weight as `(w + w_min)·D_j`, but the
/// capacity it is packed into is `C*`, what is left *after* phase one has
/// already charged every `w_min·D_j`; §5.2 defines the weight as "the number
/// of GPUs required for this allocation" of the flexible demand. Charging the
/// base twice would leave GPUs idle (on Table 2 it allocates 6 of 8 workers),
/// so the weight here is the flexible GPUs `w·D_j`. The value is the JCT
/// reduction over `T_j^max` (line 18).
pub fn flexible_items(job: &ElasticJob, speedup: Speedup) -> Vec<Item> {
    let flex = job.max_workers.saturating_sub(job.min_workers.max(1));
    (1..=flex)
        .map(|w| Item {
            weight: w.saturating_mul(job.gpus_per_worker.max(1)),
            value: job.flexible_value(w, speedup),
        })
        .collect()
}

/// Phase two alone (`AllocateElastic`): flexible workers per job.
pub fn allocate_flexible(
    jobs: &[ElasticJob],
    capacity_gpus: u64,
    params: AllocParams,
) -> (Vec<u32>, knapsack::Solution) {
    let groups: Vec<Vec<Item>> = jobs
        .iter()
        .map(|j| flexible_items(j, params.speedup))
        .collect();
    let solution = knapsack::solve(&groups, capacity_gpus, params.max_dp_cells);
    let flex = solution
        .choice
        .iter()
        .map(|c| c.map_or(0, |i| i as u32 + 1))
        .collect();
    (flex, solution)
}

/// `Allocation` (Algorithm 2, lines 22–28).
///
/// `capacity_gpus` is `C^a`: the idle GPUs plus the GPUs of the running
/// elastic jobs' flexible workers ("the set of available resources refer to
/// idle GPUs and GPUs being used by flexible workers for resizing", §5.2).
/// Phase one is SJF on the inelastic demand; a job whose base demand does not
/// fit the remaining capacity is skipped and later, smaller ones may still go
/// ("If demand of `j*` exceeds the remaining capacity, we remove it from the
/// pool and continue", §5.2).
pub fn allocate(
    queued: &[QueuedJob],
    running: &[RunningElastic],
    capacity_gpus: u64,
    params: AllocParams,
) -> Allocation {
    let mut left = capacity_gpus;
    let mut admitted = Vec::new();
    for i in sort_jobs(queued, params.speedup) {
        let q = &queued[i];
        let base_workers = if q.is_elastic() {
            q.job.min_workers.max(1)
        } else {
            q.job.max_workers
        };
        let base = u64::from(base_workers) * u64::from(q.job.gpus_per_worker.max(1));
        if base <= left {
            left -= base;
            admitted.push(i);
        }
    }

    // Phase two over running elastic jobs plus the elastic jobs just admitted
    // (line 26: `J_e^r.add(J*.get_elastic_jobs())`).
    let mut keys = Vec::new();
    let mut jobs = Vec::new();
    for r in running {
        keys.push(r.key);
        jobs.push(r.job);
    }
    for &i in &admitted {
        if queued[i].is_elastic() {
            keys.push(queued[i].key);
            jobs.push(queued[i].job);
        }
    }
    let (flex, solution) = allocate_flexible(&jobs, left, params);
    left -= solution.weight.min(left);

    let mut workers = Vec::with_capacity(admitted.len() + running.len());
    for (k, (job, f)) in keys.iter().zip(jobs.iter().zip(&flex)) {
        workers.push((*k, job.min_workers.max(1) + f));
    }
    for &i in &admitted {
        if !queued[i].is_elastic() {
            workers.push((queued[i].key, queued[i].job.max_workers));
        }
    }
    Allocation {
        admitted: admitted.iter().map(|&i| queued[i].key).collect(),
        workers,
        left_gpus: left,
        dp_unit: solution.unit,
    }
}
