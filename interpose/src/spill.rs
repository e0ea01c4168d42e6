//! Host spill: an allocation the quota refuses is served from host-resident managed memory,
//! when the node gave the workload an allowance (`Liveness::spill_limit_bytes`).
//!
//! AntMan's "universal memory" (§3.1.1) lets an opportunistic job keep running when a
//! guaranteed neighbour takes its GPU memory: the framework moves tensors to host memory and
//! the job slows down instead of failing. AntMan does it inside TensorFlow and PyTorch; we do
//! it below the framework, in the driver API, which is our own design:
//!
//! * only `cuMemAlloc_v2` spills (what `cudaMalloc` and PyTorch's caching allocator call);
//!   stream-ordered pools, VMM and arrays keep their hard quota;
//! * the spilled allocation is `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)` advised
//!   `SET_PREFERRED_LOCATION = host` and `SET_ACCESSED_BY = the current device`: its pages
//!   stay in host memory and the GPU reads and writes them over the interconnect (PCIe or
//!   C2C) instead of migrating them in, so spilled memory never occupies the GPU beyond the
//!   quota. If the advice cannot be given the allocation is freed and refused as before: a
//!   managed allocation left to migrate would break the quota;
//! * it costs what remote access costs: every kernel touching a spilled buffer runs at
//!   interconnect bandwidth for that buffer (tens of GB/s against the HBM's TB/s), so a job
//!   whose hot tensors spill slows down a lot and one whose cold state spills (optimizer
//!   moments, caches) hardly at all — AntMan's Fig. 10 shows the same spread.
//!   `docs/interposer.md` has what was measured on a real GPU.
//!
//! The spilled bytes are held against the allowance in the block (`Shared::spilled_bytes`)
//! and in the process's slot, and given back on free, context destruction, exit, or by the
//! node when the process dies.

use crate::quota;
use crate::real::{self, Sym};
use crate::{CUDA_SUCCESS, CUresult};
use std::ffi::{c_int, c_uint, c_void};

const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
const CU_MEM_ADVISE_SET_ACCESSED_BY: c_int = 5;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
/// `CU_DEVICE_CPU`, the host in the pre-12.2 `cuMemAdvise`.
const CU_DEVICE_CPU: c_int = -1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: c_int,
    id: c_int,
}

type ManagedFn = unsafe extern "C" fn(*mut u64, usize, c_uint) -> CUresult;
type AdviseV2Fn = unsafe extern "C" fn(u64, usize, c_int, MemLocation) -> CUresult;
type AdviseFn = unsafe extern "C" fn(u64, usize, c_int, c_int) -> CUresult;
type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
type FreeFn = unsafe extern "C" fn(u64) -> CUresult;

/// Serves `size` bytes into `*dptr` from host spill; false (nothing changed) when the workload
/// has no allowance left or the driver cannot keep the memory on the host.
pub fn alloc(dptr: *mut u64, size: usize) -> bool {
    if dptr.is_null() {
        return false;
    }
    let Some(spill) = quota::reserve_spill(size as u64) else {
        return false;
    };
    let managed = real::get(Sym::cuMemAllocManaged);
    if managed.is_null() {
        spill.rollback();
        return false;
    }
    // SAFETY: the driver's `cuMemAllocManaged`, whose prototype is `ManagedFn`.
    let managed = unsafe { std::mem::transmute::<*mut c_void, ManagedFn>(managed) };
    // SAFETY: `dptr` is the caller's non-NULL out-parameter of `cuMemAlloc_v2`.
    if unsafe { managed(dptr, size, CU_MEM_ATTACH_GLOBAL) } != CUDA_SUCCESS {
        spill.rollback();
        return false;
    }
    // SAFETY: the driver succeeded and wrote the out-parameter.
    let ptr = unsafe { *dptr };
    if !keep_on_host(ptr, size) {
        let free = real::get(Sym::cuMemFree_v2);
        if !free.is_null() {
            // SAFETY: the driver's `cuMemFree_v2`; frees the allocation made just above.
            unsafe { std::mem::transmute::<*mut c_void, FreeFn>(free)(ptr) };
        }
        spill.rollback();
        crate::state::log(format_args!(
            "host spill refused: the driver would not keep managed memory on the host"
        ));
        return false;
    }
    spill.commit(ptr);
    true
}

/// Advises `[ptr, ptr + size)` to live on the host and be mapped by the current device.
fn keep_on_host(ptr: u64, size: usize) -> bool {
    let get_device = real::get(Sym::cuCtxGetDevice);
    if get_device.is_null() {
        return false;
    }
    let mut device: c_int = 0;
    // SAFETY: the driver's `cuCtxGetDevice`, writing one `CUdevice`.
    if unsafe { std::mem::transmute::<*mut c_void, CtxGetDeviceFn>(get_device)(&mut device) }
        != CUDA_SUCCESS
    {
        return false;
    }
    let v2 = real::get(Sym::cuMemAdvise_v2);
    if !v2.is_null() {
        // SAFETY: the driver's `cuMemAdvise_v2` (CUDA ≥ 12.2), prototype `AdviseV2Fn`.
        let advise = unsafe { std::mem::transmute::<*mut c_void, AdviseV2Fn>(v2) };
        let host = MemLocation {
            kind: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let gpu = MemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        };
        // SAFETY: advising a range the driver just allocated.
        return unsafe {
            advise(ptr, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host) == CUDA_SUCCESS
                && advise(ptr, size, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu) == CUDA_SUCCESS
        };
    }
    let v1 = real::get(Sym::cuMemAdvise);
    if v1.is_null() {
        return false;
    }
    // SAFETY: the driver's `cuMemAdvise` (before CUDA 12.2), prototype `AdviseFn`.
    let advise = unsafe { std::mem::transmute::<*mut c_void, AdviseFn>(v1) };
    // SAFETY: advising a range the driver just allocated.
    unsafe {
        advise(
            ptr,
            size,
            CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            CU_DEVICE_CPU,
        ) == CUDA_SUCCESS
            && advise(ptr, size, CU_MEM_ADVISE_SET_ACCESSED_BY, device) == CUDA_SUCCESS
    }
}
