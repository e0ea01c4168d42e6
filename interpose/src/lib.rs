//! `libarbiter_interpose.so`: an `LD_PRELOAD` interposer for the CUDA driver API.
//!
//! It enforces what the node writes into the per-workload [`control`] block: a memory quota
//! (reserved atomically before the driver call), launch pacing (a GCRA pacer shared by every
//! process of the workload), freeze, and a graceful exit on SIGINT/SIGTERM. See
//! `docs/interposer.md` for the design and the comparison with HAMi-core and vgpu.rs.
//!
//! Module map:
//! * [`control`] — the shared-memory layout (also used by the node, as an rlib);
//! * `elf` — glibc's own `dlvsym`, found in libc's symbol table (we export one of our own);
//! * `real` — the real driver: our `dlsym`/`dlvsym`/`dlopen` trampolines, the table of wrapped
//!   entry points and the pointer-keyed substitution used by `cuGetProcAddress{,_v2}`, `dlsym`
//!   and `dlvsym`;
//! * `state` — lazy configuration (environment read once), the mode word read on the hot path;
//! * `quota`, `pacer` — memory accounting and launch admission; `arrays` — what a CUDA
//!   array's descriptor charges;
//! * `exit` — signal handlers, the worker thread, fork handling;
//! * `hooks` — the exported `cu*` entry points;
//! * `nvml` — `nvmlDeviceGetMemoryInfo{,_v2}` as the workload sees them (the quota);
//! * `iteration` — `arbiter_iteration()`, the workload's report of a finished iteration;
//! * `release` — `arbiter_release_requested()`, the node's request to give memory back;
//! * `spill` — host spill: over-quota `cuMemAlloc` served from host-resident managed memory;
//! * `trace` — the resolution trace checked against the real CUDA runtime and driver.

mod arrays;
pub mod control;
mod elf;
mod exit;
pub mod hooks;
pub mod iteration;
mod nvml;
mod pacer;
mod quota;
mod real;
pub mod release;
mod spill;
mod state;
mod trace;

use std::panic::{AssertUnwindSafe, catch_unwind};

/// CUDA driver result code.
pub type CUresult = std::ffi::c_int;
/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_FOUND`.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
/// `CUDA_ERROR_UNKNOWN`.
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// Runs a hook body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
#[inline(always)]
pub(crate) fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

pub use state::bench_support;
