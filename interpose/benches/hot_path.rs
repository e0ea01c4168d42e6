//! Hot-path overhead of the interposer against the fake driver, in one process.
//!
//! `cargo bench -p arbiter-interpose --bench hot_path`
//!
//! The fake `libcuda.so.1` is built by the same fixture builder as the tests and loaded with
//! `dlopen(RTLD_GLOBAL)`; "bare" calls go straight to its entry points, "hooked" calls go
//! through our exported wrappers (linked in as the rlib), with a control block mapped and
//! pacing off: the configuration a workload runs in when it is not being throttled.
//! Each figure is the best of several rounds of `ITERS` calls (ns per call).

use arbiter_interpose::bench_support;
use arbiter_interpose::control::{BlockInit, MappedBlock, UNLIMITED};
use arbiter_interpose::hooks;
use std::ffi::{c_uint, c_void};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;
type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> i32;
type FreeFn = unsafe extern "C" fn(u64) -> i32;

const ITERS: u32 = 2_000_000;
const ROUNDS: usize = 7;

fn best(mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..ITERS {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(ITERS));
    }
    best
}

fn launch(f: LaunchFn) {
    // SAFETY: calling a cuLaunchKernel-ABI function with a dummy (non-NULL) function handle
    // and NULL params, which the fake accepts.
    let r = unsafe {
        f(
            black_box(std::ptr::dangling_mut::<c_void>()),
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0);
}

fn alloc_free(a: AllocFn, fr: FreeFn) {
    let mut p = 0u64;
    // SAFETY: valid out-pointer; the pointer is freed right away.
    unsafe {
        assert_eq!(a(&mut p, black_box(4096)), 0);
        assert_eq!(fr(p), 0);
    }
}

fn main() {
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("interpose-fixtures");
    let fx = match cuda_workload::build(&work) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot build fixtures: {e}");
            std::process::exit(1);
        }
    };
    let block_path = work.join("bench-block");
    let _block = MappedBlock::create(
        &block_path,
        &BlockInit {
            quota_bytes: UNLIMITED,
            ..Default::default()
        },
    )
    .expect("control block");
    // SAFETY: single-threaded at this point; set before the interposer reads its environment.
    unsafe { std::env::set_var("ARBITER_CONTROL_BLOCK", &block_path) };
    let lib = std::ffi::CString::new(fx.libdir.join("libcuda.so.1").to_string_lossy().as_bytes())
        .expect("path");
    // SAFETY: loading the fake driver globally so the interposer's RTLD_NOLOAD lookup finds it.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "dlopen fake libcuda");

    let bare_launch_p = bench_support::real_cu_launch_kernel();
    let bare_alloc_p = bench_support::real_cu_mem_alloc();
    let bare_free_p = bench_support::real_cu_mem_free();
    assert!(!bare_launch_p.is_null() && !bare_alloc_p.is_null() && !bare_free_p.is_null());
    // SAFETY: the real driver's entry points with their documented ABIs.
    let (bare_launch, bare_alloc, bare_free) = unsafe {
        (
            std::mem::transmute::<*mut c_void, LaunchFn>(bare_launch_p),
            std::mem::transmute::<*mut c_void, AllocFn>(bare_alloc_p),
            std::mem::transmute::<*mut c_void, FreeFn>(bare_free_p),
        )
    };
    let hooked_launch: LaunchFn = hooks::cuLaunchKernel;
    let hooked_alloc: AllocFn = hooks::cuMemAlloc_v2;
    let hooked_free: FreeFn = hooks::cuMemFree_v2;
    // warm up (first hooked call initialises the interposer)
    launch(hooked_launch);
    alloc_free(hooked_alloc, hooked_free);

    let bl = best(|| launch(bare_launch));
    let hl = best(|| launch(hooked_launch));
    let ba = best(|| alloc_free(bare_alloc, bare_free));
    let ha = best(|| alloc_free(hooked_alloc, hooked_free));
    println!(
        "cuLaunchKernel            bare {bl:7.1} ns  hooked {hl:7.1} ns  overhead {:6.1} ns",
        hl - bl
    );
    let counted = _block
        .counters
        .launches
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        counted >= u64::from(ITERS),
        "hooked launches must go through the enforcing path (counted {counted})"
    );
    println!(
        "cuMemAlloc_v2+cuMemFree_v2 bare {ba:7.1} ns  hooked {ha:7.1} ns  overhead {:6.1} ns (alloc+free pair)",
        ha - ba
    );
}
