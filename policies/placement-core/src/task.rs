//! What one worker of a job asks for, and where it could go.

use arbiter_policy_sdk::prelude::*;

/// One worker's request, in the terms of the FGD paper: CPU, memory, and
/// `num_gpu` GPUs of which it takes `gpu_milli` each (< 1000 only for a
/// GPU-sharing task, which always asks for exactly one GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub job: u32,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// GPUs per worker; 0 for a CPU-only task.
    pub num_gpu: u32,
    /// Milli-GPU taken from each of its GPUs: 1000 for whole GPUs, 0 for a CPU-only task.
    pub gpu_milli: u32,
}

impl Task {
    /// The request of one worker of `job`, with the SDK's accounting
    /// ([`gpu_share`]): a GPU request that is not a fraction of one GPU takes
    /// whole GPUs.
    pub fn of(job: Job<'_>) -> Task {
        let num_gpu = job.gpus_per_worker();
        let gpu_milli = if num_gpu == 0 {
            0
        } else if job.is_fractional() {
            job.gpu_milli()
        } else {
            FULL_GPU_MILLI
        };
        Task {
            job: job.index(),
            cpu_milli: job.cpu_milli(),
            memory_mib: job.memory_mib(),
            num_gpu,
            gpu_milli,
        }
    }

    /// Whether the task takes a fraction of one GPU.
    pub fn is_sharing(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < FULL_GPU_MILLI
    }

    /// Total milli-GPU requested (`num_gpu * gpu_milli`).
    pub fn total_gpu_milli(&self) -> u32 {
        self.num_gpu.saturating_mul(self.gpu_milli)
    }
}

/// Which GPU sets of a node are offered as candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSelection {
    /// One candidate per node, chosen the way the reference simulator's
    /// `best` GPU selection does: a sharing task goes to the fitting GPU with
    /// the least free milli-GPU (lowest index on ties); whole-GPU tasks take
    /// the lowest-index free GPUs. For policies whose node score does not
    /// depend on the GPU (DotProd, GpuClustering, GpuPacking, BestFit).
    BestFit,
    /// A sharing task: one candidate per distinct free amount among the
    /// fitting GPUs (the lowest-index GPU of each). GPUs with the same free
    /// amount are interchangeable for every score here, so offering each of
    /// them would only repeat work. Whole-GPU and CPU tasks: as `BestFit`.
    /// For FGD, whose score depends on which GPU is used.
    EachFreeLevel,
}

/// Whether `node` can take one more worker of `task` at the host level
/// (schedulable, not reserved for another job, CPU and memory free).
pub fn node_admits(plan: &Plan<'_>, task: &Task, node: u32) -> bool {
    plan.node_open_for(task.job, node)
        && plan.free_cpu(node) >= task.cpu_milli
        && plan.free_memory(node) >= task.memory_mib
}

/// Every GPU of `node` that can take one more worker-share of `task`
/// (model allowed, milli-GPU and GPU memory free), in index order.
pub fn fitting_gpus(plan: &Plan<'_>, task: &Task, node: u32, out: &mut Vec<u32>) {
    out.clear();
    if task.num_gpu == 0 {
        return;
    }
    let range = plan.cluster().node(node).gpu_range();
    for gpu in range {
        // Cheap milli check first: most GPUs of a busy cluster fail it.
        if plan.free_milli(gpu) >= task.gpu_milli && plan.gpu_fits(task.job, gpu) {
            out.push(gpu);
        }
    }
}

/// Calls `visit` with every candidate GPU set of `node` for one worker of
/// `task` under `selection`; nothing if the node cannot take it. A CPU-only
/// task has one candidate per admitting node, with no GPUs.
pub fn node_candidates(
    plan: &Plan<'_>,
    task: &Task,
    node: u32,
    selection: GpuSelection,
    scratch: &mut Vec<u32>,
    mut visit: impl FnMut(&[u32]),
) {
    if !node_admits(plan, task, node) {
        return;
    }
    if task.num_gpu == 0 {
        visit(&[]);
        return;
    }
    // A node without enough free GPU in total cannot fit: skip the per-GPU checks.
    let range = plan.cluster().node(node).gpu_range();
    if (range.len() as u32) < task.num_gpu {
        return;
    }
    fitting_gpus(plan, task, node, scratch);
    if task.is_sharing() {
        match selection {
            GpuSelection::BestFit => {
                if let Some(&gpu) = scratch.iter().min_by_key(|&&g| (plan.free_milli(g), g)) {
                    visit(&[gpu]);
                }
            }
            GpuSelection::EachFreeLevel => {
                for (i, &gpu) in scratch.iter().enumerate() {
                    let free = plan.free_milli(gpu);
                    if scratch[..i].iter().all(|&g| plan.free_milli(g) != free) {
                        visit(&[gpu]);
                    }
                }
            }
        }
    } else if scratch.len() >= task.num_gpu as usize {
        // Whole GPUs: every fitting GPU is entirely free, so any subset leaves
        // the node in the same state; the lowest indices are the canonical choice.
        visit(&scratch[..task.num_gpu as usize]);
    }
}
