//! `arbiter_release_requested()`: how a workload learns that the node wants memory back.
//!
//! The interposer can refuse new allocations but cannot take away memory a process holds;
//! AntMan shrinks an opportunistic job's memory through a modified framework allocator
//! (17.6 → 1.3 GB in 17 ms, §4.1). Ours is cooperative: the node lowers the workload's quota
//! below what it holds (a coordinator's `set-memory-limit`), and a framework hook that polls
//! this function at an iteration boundary releases its allocator's cache when it is non-zero —
//! `scripts/gpu/train_iterations.py` does it with the public `torch.cuda.empty_cache()`. Until
//! then every new allocation is refused (or spilled, with an allowance), so a workload that
//! never cooperates still cannot grow.
//!
//! Callable before any CUDA call and without a block (it returns 0); it never panics into the
//! caller, and it costs a few atomic loads.

use crate::state;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Bytes the workload should give back (what it holds over its quota on the device where it
/// is furthest over; 0: nothing to release, or no control block).
#[unsafe(no_mangle)]
pub extern "C" fn arbiter_release_requested() -> u64 {
    catch_unwind(AssertUnwindSafe(|| {
        let _ = state::mode(); // first use: read the configuration, map the block
        state::block().map_or(0, |b| b.release_requested())
    }))
    .unwrap_or(0)
}
