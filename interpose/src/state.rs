//! Process-local configuration and the mode word read on every hook.
//!
//! Everything here is initialised lazily on the first hook call (never in a constructor) and
//! cached in atomics: the hot path reads `MODE` and the block pointer, nothing else.

use crate::control::{ControlBlock, MappedBlock};
use std::ffi::CStr;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

/// Not initialised yet.
pub const UNINIT: u8 = 0;
/// `ARBITER_INTERPOSE_BYPASS=1`: pure pass-through, no substitution, no accounting.
pub const BYPASS: u8 = 1;
/// A valid, fresh control block: enforce it.
pub const ENFORCE: u8 = 2;
/// Block missing/stale and fail-open: pass through.
pub const OPEN: u8 = 3;
/// Block missing/stale and fail-closed: refuse allocations and launches.
pub const CLOSED: u8 = 4;
/// Graceful exit in progress: launches are held until the process is gone.
pub const EXITING: u8 = 5;
/// The process returned its charges at `exit()`: what it allocates from now on (destructors,
/// late `atexit` handlers) passes through uncharged — nobody would return it.
pub const RELEASED: u8 = 6;

static MODE: AtomicU8 = AtomicU8::new(UNINIT);
static BLOCK: AtomicPtr<ControlBlock> = AtomicPtr::new(std::ptr::null_mut());
static INIT: Once = Once::new();
static FAIL_CLOSED: AtomicBool = AtomicBool::new(false);
static TEST_PANIC: AtomicBool = AtomicBool::new(false);
static LOG: AtomicBool = AtomicBool::new(false);

fn env(name: &CStr) -> Option<String> {
    // SAFETY: getenv with a NUL-terminated name; a non-NULL result is a C string owned by the
    // environment that we copy immediately. Only called once, from `init`.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL getenv result is NUL-terminated.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn truthy(v: Option<String>) -> bool {
    matches!(
        v.as_deref().map(str::trim),
        Some("1" | "true" | "yes" | "on")
    )
}

/// Environment variables (read once):
/// * `ARBITER_INTERPOSE_BYPASS=1` — do nothing at all;
/// * `ARBITER_CONTROL_BLOCK=<path>` — the control block file;
/// * `ARBITER_FAIL_MODE=open|closed` — what to do when the block is missing, invalid or stale
///   (default `open`: never break the application);
/// * `ARBITER_INTERPOSE_LOG=1` — diagnostics on stderr (slow paths only);
/// * `ARBITER_INTERPOSE_TRACE=<file>` — the resolution trace (`trace`);
/// * `ARBITER_INTERPOSE_TEST_PANIC=1` — test hook: `cuMemGetInfo_v2` panics.
fn init() {
    INIT.call_once(|| {
        if truthy(env(c"ARBITER_INTERPOSE_BYPASS")) {
            MODE.store(BYPASS, Ordering::Release);
            return;
        }
        LOG.store(truthy(env(c"ARBITER_INTERPOSE_LOG")), Ordering::Relaxed);
        crate::trace::init(env(c"ARBITER_INTERPOSE_TRACE"));
        TEST_PANIC.store(
            truthy(env(c"ARBITER_INTERPOSE_TEST_PANIC")),
            Ordering::Relaxed,
        );
        let closed = env(c"ARBITER_FAIL_MODE").is_some_and(|v| v.trim() == "closed");
        FAIL_CLOSED.store(closed, Ordering::Relaxed);
        let block = env(c"ARBITER_CONTROL_BLOCK").and_then(|p| {
            match MappedBlock::open(std::path::Path::new(&p)) {
                Ok(b) => Some(b.leak()),
                Err(e) => {
                    log(format_args!("control block {p}: {e}"));
                    None
                }
            }
        });
        let mode = match block {
            Some(b) => {
                b.liveness.attached.fetch_add(1, Ordering::Relaxed);
                BLOCK.store(std::ptr::from_ref(b).cast_mut(), Ordering::Release);
                if b.is_stale(crate::control::monotonic_ns()) {
                    fail_mode()
                } else {
                    ENFORCE
                }
            }
            None => fail_mode(),
        };
        MODE.store(mode, Ordering::Release);
    });
}

/// The mode to fall back to when the block is missing or stale.
pub fn fail_mode() -> u8 {
    if FAIL_CLOSED.load(Ordering::Relaxed) {
        CLOSED
    } else {
        OPEN
    }
}

/// Current mode, initialising on first use.
#[inline(always)]
pub fn mode() -> u8 {
    let m = MODE.load(Ordering::Acquire);
    if m != UNINIT {
        return m;
    }
    init_slow()
}

#[cold]
#[inline(never)]
fn init_slow() -> u8 {
    // `init` may open files; make sure a `dlsym("cu...")` reached from there is not substituted
    // (which would re-enter `init`).
    let _ = crate::real::reentrancy_guarded(init);
    let m = MODE.load(Ordering::Acquire);
    if m == UNINIT { OPEN } else { m }
}

/// Switch mode (worker: staleness, graceful exit). Never leaves `BYPASS` or `EXITING`.
pub fn set_mode(from: u8, to: u8) -> bool {
    MODE.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// Enter `RELEASED` (normal exit, after the charges were returned) unless bypassed or already
/// exiting gracefully.
pub fn set_released() {
    let _ = MODE.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |m| {
        if m == BYPASS || m == EXITING {
            None
        } else {
            Some(RELEASED)
        }
    });
}

/// Enter `EXITING` from whatever mode we are in (except bypass).
pub fn begin_exit() {
    let _ = MODE.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |m| {
        if m == BYPASS { None } else { Some(EXITING) }
    });
}

pub fn bypassed() -> bool {
    mode() == BYPASS
}

/// The control block, if one was mapped (valid in every mode but `BYPASS`).
#[inline(always)]
pub fn block() -> Option<&'static ControlBlock> {
    let p = BLOCK.load(Ordering::Acquire);
    // SAFETY: BLOCK is either NULL or a leaked, never-unmapped mapping of a ControlBlock.
    unsafe { p.as_ref() }
}

pub fn test_panic() -> bool {
    TEST_PANIC.load(Ordering::Relaxed)
}

/// Diagnostics on stderr when `ARBITER_INTERPOSE_LOG=1` (never on the hot path).
pub fn log(args: std::fmt::Arguments<'_>) {
    if LOG.load(Ordering::Relaxed) {
        eprintln!("[arbiter-interpose {}] {args}", std::process::id());
    }
}

/// Helpers for the benchmark (which links the interposer as an rlib).
pub mod bench_support {
    use std::ffi::c_void;

    /// Real driver address of `cuLaunchKernel` (resolving it if libcuda is loaded).
    pub fn real_cu_launch_kernel() -> *mut c_void {
        crate::real::get(crate::real::Sym::cuLaunchKernel)
    }

    /// Real driver address of `cuMemAlloc_v2`.
    pub fn real_cu_mem_alloc() -> *mut c_void {
        crate::real::get(crate::real::Sym::cuMemAlloc_v2)
    }

    /// Real driver address of `cuMemFree_v2`.
    pub fn real_cu_mem_free() -> *mut c_void {
        crate::real::get(crate::real::Sym::cuMemFree_v2)
    }
}
