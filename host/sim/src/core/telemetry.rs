//! GPU telemetry: what a node agent would report of its GPUs, from the
//! simulator's own ground truth.

use crate::core::SimCtx;
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, GpuMetric};

/// Metrics by allocation: a GPU is as busy as the share of it held by jobs
/// that make progress now (past their restart overhead), its SMs as active
/// as that share, its memory as used as the jobs' memory. GPUs with nothing
/// progressing report zeros. Models with their own ground truth (kernel
/// duty cycles, interference) override [`crate::core::WorkloadModel::gpu_metrics`].
pub fn allocation_metrics(ctx: &SimCtx, now: u64) -> Vec<GpuMetric> {
    let state = &ctx.host.state;
    let cluster = state.cluster();
    let mut milli = vec![0u32; cluster.gpu_count()];
    let mut memory = vec![0u32; cluster.gpu_count()];
    for job in ctx.progress.progressing(now) {
        let Some(id) = ctx.progress.track(job).id else {
            continue;
        };
        let Some(index) = state.job_index(id) else {
            continue;
        };
        let view = cluster.job(index);
        // A whole-GPU worker holds all of each of its GPUs; a fractional
        // one its share, and memory in proportion unless it asked for some.
        let share = if view.is_fractional() {
            view.gpu_milli()
        } else {
            FULL_GPU_MILLI
        };
        for worker in view.placement() {
            for &gpu in &worker.gpus {
                let capacity = cluster.gpu(gpu).memory_mib();
                let mem = match view.gpu_memory_mib() {
                    0 => {
                        (u64::from(capacity) * u64::from(share) / u64::from(FULL_GPU_MILLI)) as u32
                    }
                    asked => asked,
                };
                if let Some(m) = milli.get_mut(gpu as usize) {
                    *m = m.saturating_add(share);
                }
                if let Some(m) = memory.get_mut(gpu as usize) {
                    *m = m.saturating_add(mem);
                }
            }
        }
    }
    milli
        .iter()
        .zip(&memory)
        .enumerate()
        .map(|(gpu, (&m, &mem))| {
            let pct = (u64::from(m.min(FULL_GPU_MILLI)) * 100 / u64::from(FULL_GPU_MILLI)) as u8;
            GpuMetric {
                gpu: gpu as u32,
                utilization_pct: pct,
                sm_activity_pct: pct,
                memory_used_mib: mem.min(cluster.gpu(gpu as u32).memory_mib()),
                // This model has no warp-level view; 0 = unknown (contract).
                sm_occupancy_pct: 0,
            }
        })
        .collect()
}
