//! `arbiter_iteration()`: how a training workload tells the node it finished an iteration.
//!
//! AntMan's node-local coordinator judges whether an opportunistic neighbour slows a
//! guaranteed job by the job's iteration time, which only the job knows. The interposer
//! exports this function; the workload (or its framework: `scripts/gpu/train_iterations.py`
//! registers it as a PyTorch optimizer step hook through `ctypes`) calls it once per
//! iteration, and the node turns the block's counter and timestamp into `iteration-ms`.
//! We do not infer iterations from launch or synchronisation patterns: a step's kernels and
//! syncs vary with the model, the data loader and the framework's graph capture, so a guess
//! would be wrong in ways a policy could not tell. Without reports the node says 0 ("none").
//!
//! Callable before any CUDA call (it initialises the interposer's state, mapping the block)
//! and without a block (it returns 0); it never panics into the caller.

use crate::control::monotonic_ns;
use crate::state;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Records one finished iteration; returns how many the workload has reported (0 when no
/// control block is configured).
#[unsafe(no_mangle)]
pub extern "C" fn arbiter_iteration() -> u64 {
    catch_unwind(AssertUnwindSafe(|| {
        let _ = state::mode(); // first use: read the configuration, map the block
        state::block().map_or(0, |b| b.record_iteration(monotonic_ns()))
    }))
    .unwrap_or(0)
}
