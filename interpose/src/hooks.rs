//! The exported driver entry points.
//!
//! Each export is `#[no_mangle] extern "C"` with the driver's exact ABI, runs its body under
//! `crate::guard` (a panic becomes `CUDA_ERROR_UNKNOWN`, never an unwind into C), and calls
//! the real driver through the pointer table in `real`. The same functions are reached three
//! ways: plain symbol interposition (programs linked with `-lcuda`), `dlsym` substitution,
//! and `cuGetProcAddress{,_v2}` substitution (how cudart ≥ 11.3 resolves everything).
//!
//! Handles are passed as `u64`/`*mut c_void`, which share the 64-bit integer-register ABI of
//! the driver's opaque pointer and `unsigned long long` handle types.
#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::arrays::{self, Array3dDescriptor, ArrayDescriptor};
use crate::exit;
use crate::pacer::{self, StreamKind};
use crate::quota::{self, Kind};
use crate::real::{self, Sym};
use crate::spill;
use crate::state::{self, ENFORCE};
use crate::trace;
use crate::{CUDA_ERROR_NOT_FOUND, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult, guard};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

type Ptr = *mut c_void;
type Args = *mut *mut c_void;

macro_rules! real {
    ($sym:ident : $ty:ty) => {{
        let p = real::get(Sym::$sym);
        if p.is_null() {
            return CUDA_ERROR_NOT_FOUND;
        }
        // SAFETY: `p` is the driver's export named like `Sym::$sym`, whose C prototype is `$ty`.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// Our wrapper for a real entry point, if we wrap it.
pub fn wrapper(sym: Sym) -> Option<*mut c_void> {
    use Sym::*;
    let p: *mut c_void = match sym {
        cuInit => self::cuInit as *mut c_void,
        cuGetProcAddress => self::cuGetProcAddress as *mut c_void,
        cuGetProcAddress_v2 => self::cuGetProcAddress_v2 as *mut c_void,
        cuMemAlloc_v2 => self::cuMemAlloc_v2 as *mut c_void,
        cuMemAllocPitch_v2 => self::cuMemAllocPitch_v2 as *mut c_void,
        cuMemAllocManaged => self::cuMemAllocManaged as *mut c_void,
        cuMemAllocAsync => self::cuMemAllocAsync as *mut c_void,
        cuMemAllocAsync_ptsz => self::cuMemAllocAsync_ptsz as *mut c_void,
        cuMemAllocFromPoolAsync => self::cuMemAllocFromPoolAsync as *mut c_void,
        cuMemAllocFromPoolAsync_ptsz => self::cuMemAllocFromPoolAsync_ptsz as *mut c_void,
        cuMemFree_v2 => self::cuMemFree_v2 as *mut c_void,
        cuMemFreeAsync => self::cuMemFreeAsync as *mut c_void,
        cuMemFreeAsync_ptsz => self::cuMemFreeAsync_ptsz as *mut c_void,
        cuMemCreate => self::cuMemCreate as *mut c_void,
        cuMemRelease => self::cuMemRelease as *mut c_void,
        cuMemMap => self::cuMemMap as *mut c_void,
        cuMemUnmap => self::cuMemUnmap as *mut c_void,
        cuArrayCreate_v2 => self::cuArrayCreate_v2 as *mut c_void,
        cuArray3DCreate_v2 => self::cuArray3DCreate_v2 as *mut c_void,
        cuMipmappedArrayCreate => self::cuMipmappedArrayCreate as *mut c_void,
        cuArrayDestroy => self::cuArrayDestroy as *mut c_void,
        cuMipmappedArrayDestroy => self::cuMipmappedArrayDestroy as *mut c_void,
        cuMemGetInfo_v2 => self::cuMemGetInfo_v2 as *mut c_void,
        cuDeviceTotalMem_v2 => self::cuDeviceTotalMem_v2 as *mut c_void,
        cuCtxCreate_v2 => self::cuCtxCreate_v2 as *mut c_void,
        cuCtxCreate_v3 => self::cuCtxCreate_v3 as *mut c_void,
        cuCtxCreate_v4 => self::cuCtxCreate_v4 as *mut c_void,
        cuCtxDestroy_v2 => self::cuCtxDestroy_v2 as *mut c_void,
        cuDevicePrimaryCtxRetain => self::cuDevicePrimaryCtxRetain as *mut c_void,
        cuDevicePrimaryCtxRelease => self::cuDevicePrimaryCtxRelease as *mut c_void,
        cuDevicePrimaryCtxRelease_v2 => self::cuDevicePrimaryCtxRelease_v2 as *mut c_void,
        cuDevicePrimaryCtxReset_v2 => self::cuDevicePrimaryCtxReset_v2 as *mut c_void,
        cuLaunchKernel => self::cuLaunchKernel as *mut c_void,
        cuLaunchKernel_ptsz => self::cuLaunchKernel_ptsz as *mut c_void,
        cuLaunchKernelEx => self::cuLaunchKernelEx as *mut c_void,
        cuLaunchKernelEx_ptsz => self::cuLaunchKernelEx_ptsz as *mut c_void,
        cuLaunchCooperativeKernel => self::cuLaunchCooperativeKernel as *mut c_void,
        cuLaunchCooperativeKernel_ptsz => self::cuLaunchCooperativeKernel_ptsz as *mut c_void,
        cuLaunchCooperativeKernelMultiDevice => {
            self::cuLaunchCooperativeKernelMultiDevice as *mut c_void
        }
        cuGraphLaunch => self::cuGraphLaunch as *mut c_void,
        cuGraphLaunch_ptsz => self::cuGraphLaunch_ptsz as *mut c_void,
        cuStreamIsCapturing
        | cuStreamIsCapturing_ptsz
        | cuCtxGetDevice
        | cuCtxGetCurrent
        | cuDeviceGet
        | cuDeviceGetUuid
        | cuCtxSynchronize
        | cuCtxPushCurrent_v2
        | cuCtxPopCurrent_v2
        | cuMemAdvise
        | cuMemAdvise_v2 => return None,
    };
    Some(p)
}

// ---------------------------------------------------------------------------------------------
// Resolution

/// `cuGetProcAddress` (CUDA 11.3–11.8 ABI).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut Ptr,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard(|| {
        let f = real!(cuGetProcAddress: unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64) -> CUresult);
        // SAFETY: forwarding the caller's arguments to the real resolver.
        let r = unsafe { f(symbol, pfn, version, flags) };
        substitute_out(r, pfn, "gpa", symbol, version, flags);
        r
    })
}

/// `cuGetProcAddress_v2` (CUDA ≥ 12.0 ABI, with `symbolStatus`).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut Ptr,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(|| {
        let f = real!(cuGetProcAddress_v2: unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> CUresult);
        // SAFETY: forwarding the caller's arguments (status and all) to the real resolver.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        substitute_out(r, pfn, "gpa2", symbol, version, flags);
        r
    })
}

/// Replace `*pfn` by our wrapper when it is a real entry point we wrap (including the
/// resolver itself: the self-lookup trap). NULL results are left alone.
fn substitute_out(
    r: CUresult,
    pfn: *mut Ptr,
    via: &str,
    symbol: *const c_char,
    version: c_int,
    flags: u64,
) {
    if r != CUDA_SUCCESS || pfn.is_null() {
        return;
    }
    // SAFETY: the real resolver succeeded and wrote `*pfn`; pfn is non-NULL.
    unsafe {
        let p = *pfn;
        if !p.is_null() {
            *pfn = real::substitute(p);
            trace::lookup(via, symbol, version, flags, p, *pfn);
        }
    }
}

/// `cuInit`: the driver's own init, then our second-stage init (signals, worker).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| {
        let f = real!(cuInit: unsafe extern "C" fn(c_uint) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(flags) };
        trace::call("cuInit", r);
        if r == CUDA_SUCCESS {
            exit::late_init();
        }
        r
    })
}

// ---------------------------------------------------------------------------------------------
// Memory

/// Charge `size` bytes on the current device, call the driver, commit or roll back.
/// Memory that belongs to the current context (it goes when the context does).
fn alloc_with(size: usize, kind: Kind, call: impl FnOnce() -> (CUresult, u64)) -> CUresult {
    alloc_on(quota::current_device(), size, kind, Owner::Context, call)
}

/// Memory from a pool: the pool is the device's and may outlive the context.
fn alloc_from_pool(size: usize, call: impl FnOnce() -> (CUresult, u64)) -> CUresult {
    alloc_on(
        quota::current_device(),
        size,
        Kind::Ptr,
        Owner::Device,
        call,
    )
}

/// Whose lifetime an allocation shares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Context,
    Device,
}

fn alloc_on(
    device: usize,
    size: usize,
    kind: Kind,
    owner: Owner,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    exit::late_init();
    let res = match quota::reserve(device, size as u64) {
        Ok(r) if owner == Owner::Context => r.in_context(quota::current_context()),
        Ok(r) => r,
        Err(e) => return e,
    };
    let (r, key) = call();
    if r == CUDA_SUCCESS {
        res.commit(kind, key);
    } else {
        res.rollback();
    }
    r
}

fn read_out(p: *const u64) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: only called after the driver returned success and wrote the out-parameter.
    unsafe { *p }
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CUresult {
    guard(|| {
        let f = real!(cuMemAlloc_v2: unsafe extern "C" fn(*mut u64, usize) -> CUresult);
        let r = alloc_with(size, Kind::Ptr, || {
            // SAFETY: forwarding.
            let r = unsafe { f(dptr, size) };
            (r, if r == CUDA_SUCCESS { read_out(dptr) } else { 0 })
        });
        if r == CUDA_ERROR_OUT_OF_MEMORY && spill::alloc(dptr, size) {
            return CUDA_SUCCESS;
        }
        r
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> CUresult {
    guard(|| {
        let f = real!(cuMemAllocManaged: unsafe extern "C" fn(*mut u64, usize, c_uint) -> CUresult);
        alloc_with(size, Kind::Ptr, || {
            // SAFETY: forwarding.
            let r = unsafe { f(dptr, size, flags) };
            (r, if r == CUDA_SUCCESS { read_out(dptr) } else { 0 })
        })
    })
}

/// Pitched allocations: reserve `round_up(width, 512) * height` first, then settle on the
/// driver's real `pitch * height`; if that needs more than the quota allows, free it again.
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard(|| {
        let f = real!(cuMemAllocPitch_v2: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CUresult);
        exit::late_init();
        let estimate = width
            .div_ceil(512)
            .saturating_mul(512)
            .saturating_mul(height);
        let mut res = match quota::reserve(quota::current_device(), estimate as u64) {
            Ok(r) => r.in_context(quota::current_context()),
            Err(e) => return e,
        };
        // SAFETY: forwarding.
        let r = unsafe { f(dptr, pitch, width, height, elem) };
        if r != CUDA_SUCCESS {
            res.rollback();
            return r;
        }
        let addr = read_out(dptr);
        let actual = if pitch.is_null() {
            estimate
        } else {
            // SAFETY: the driver succeeded and wrote the pitch.
            unsafe { *pitch }.saturating_mul(height)
        };
        if !res.adjust(actual as u64) {
            let free = real!(cuMemFree_v2: unsafe extern "C" fn(u64) -> CUresult);
            // SAFETY: freeing the allocation the driver just made.
            unsafe { free(addr) };
            res.rollback();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        res.commit(Kind::Ptr, addr);
        r
    })
}

type AllocAsyncFn = unsafe extern "C" fn(*mut u64, usize, Ptr) -> CUresult;
type AllocPoolFn = unsafe extern "C" fn(*mut u64, usize, Ptr, Ptr) -> CUresult;

/// Stream-ordered allocations are charged per allocation when enqueued and returned when the
/// free is enqueued (pool growth beyond that is the driver's cache, see docs/interposer.md).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Ptr) -> CUresult {
    guard(|| {
        let f = real!(cuMemAllocAsync: AllocAsyncFn);
        alloc_from_pool(size, || {
            // SAFETY: forwarding.
            let r = unsafe { f(dptr, size, stream) };
            (r, if r == CUDA_SUCCESS { read_out(dptr) } else { 0 })
        })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    stream: Ptr,
) -> CUresult {
    guard(|| {
        let f = real!(cuMemAllocAsync_ptsz: AllocAsyncFn);
        alloc_from_pool(size, || {
            // SAFETY: forwarding.
            let r = unsafe { f(dptr, size, stream) };
            (r, if r == CUDA_SUCCESS { read_out(dptr) } else { 0 })
        })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    size: usize,
    pool: Ptr,
    stream: Ptr,
) -> CUresult {
    guard(|| {
        let f = real!(cuMemAllocFromPoolAsync: AllocPoolFn);
        alloc_from_pool(size, || {
            // SAFETY: forwarding.
            let r = unsafe { f(dptr, size, pool, stream) };
            (r, if r == CUDA_SUCCESS { read_out(dptr) } else { 0 })
        })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    pool: Ptr,
    stream: Ptr,
) -> CUresult {
    guard(|| {
        let f = real!(cuMemAllocFromPoolAsync_ptsz: AllocPoolFn);
        alloc_from_pool(size, || {
            // SAFETY: forwarding.
            let r = unsafe { f(dptr, size, pool, stream) };
            (r, if r == CUDA_SUCCESS { read_out(dptr) } else { 0 })
        })
    })
}

fn free_with(kind: Kind, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let taken = quota::take(kind, key);
    let r = call();
    if r == CUDA_SUCCESS {
        quota::released(taken);
    } else if let Some(t) = taken {
        quota::restore(kind, key, t);
    }
    r
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    guard(|| {
        let f = real!(cuMemFree_v2: unsafe extern "C" fn(u64) -> CUresult);
        // SAFETY: forwarding.
        free_with(Kind::Ptr, dptr, || unsafe { f(dptr) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: u64, stream: Ptr) -> CUresult {
    guard(|| {
        let f = real!(cuMemFreeAsync: unsafe extern "C" fn(u64, Ptr) -> CUresult);
        // SAFETY: forwarding.
        free_with(Kind::Ptr, dptr, || unsafe { f(dptr, stream) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, stream: Ptr) -> CUresult {
    guard(|| {
        let f = real!(cuMemFreeAsync_ptsz: unsafe extern "C" fn(u64, Ptr) -> CUresult);
        // SAFETY: forwarding.
        free_with(Kind::Ptr, dptr, || unsafe { f(dptr, stream) })
    })
}

/// VMM: physical memory is charged at `cuMemCreate` and returned when it is really freed:
/// at `cuMemRelease` if nothing maps it, else at its last `cuMemUnmap` (the driver keeps a
/// released handle's memory while it is mapped). Mapping is not charged again.
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    guard(|| {
        let f = real!(cuMemCreate: unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> CUresult);
        let device = match vmm_location(prop) {
            VmmLocation::Device(d) => d,
            VmmLocation::Current => quota::current_device(),
            VmmLocation::Host => {
                // Host memory: not the GPU's to charge.
                // SAFETY: forwarding.
                return unsafe { f(handle, size, prop, flags) };
            }
        };
        alloc_on(device, size, Kind::Vmm, Owner::Device, || {
            // SAFETY: forwarding.
            let r = unsafe { f(handle, size, prop, flags) };
            (
                r,
                if r == CUDA_SUCCESS {
                    read_out(handle)
                } else {
                    0
                },
            )
        })
    })
}

/// Where a `cuMemCreate` puts its memory, from `CUmemAllocationProp::location`.
enum VmmLocation {
    Device(usize),
    /// No properties to read: the current device.
    Current,
    Host,
}

/// Prefix of `CUmemAllocationProp` up to the location (all we read).
#[repr(C)]
struct AllocationPropPrefix {
    kind: c_uint,
    requested_handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

fn vmm_location(prop: *const c_void) -> VmmLocation {
    // SAFETY: a non-NULL `prop` is the caller's CUmemAllocationProp, whose first four 32-bit
    // fields are the type, the handle types and the location (type, id).
    match unsafe { prop.cast::<AllocationPropPrefix>().as_ref() } {
        None => VmmLocation::Current,
        Some(p) if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE => {
            VmmLocation::Device(usize::try_from(p.location_id).unwrap_or(0))
        }
        Some(_) => VmmLocation::Host,
    }
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(|| {
        let f = real!(cuMemRelease: unsafe extern "C" fn(u64) -> CUresult);
        let taken = quota::take(Kind::Vmm, handle);
        // SAFETY: forwarding.
        let r = unsafe { f(handle) };
        if r == CUDA_SUCCESS {
            quota::vmm_released(handle, taken);
        } else if let Some(t) = taken {
            quota::restore(Kind::Vmm, handle, t);
        }
        r
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    va: u64,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    guard(|| {
        let f = real!(cuMemMap: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(va, size, offset, handle, flags) };
        if r == CUDA_SUCCESS {
            quota::vmm_mapped(va, size as u64, handle);
        }
        r
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(va: u64, size: usize) -> CUresult {
    guard(|| {
        let f = real!(cuMemUnmap: unsafe extern "C" fn(u64, usize) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(va, size) };
        if r == CUDA_SUCCESS {
            quota::vmm_unmapped(va, size as u64);
        }
        r
    })
}

// ---------------------------------------------------------------------------------------------
// Arrays (textures, surfaces): charged by their payload, see `arrays`.

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: *mut u64,
    desc: *const ArrayDescriptor,
) -> CUresult {
    guard(|| {
        let f = real!(cuArrayCreate_v2: unsafe extern "C" fn(*mut u64, *const ArrayDescriptor) -> CUresult);
        // SAFETY: a non-NULL descriptor is the caller's valid CUDA_ARRAY_DESCRIPTOR; a NULL
        // one is the driver's to refuse.
        let bytes = unsafe { desc.as_ref() }.map_or(0, arrays::bytes_2d);
        alloc_with(bytes as usize, Kind::Array, || {
            // SAFETY: forwarding.
            let r = unsafe { f(handle, desc) };
            (
                r,
                if r == CUDA_SUCCESS {
                    read_out(handle)
                } else {
                    0
                },
            )
        })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut u64,
    desc: *const Array3dDescriptor,
) -> CUresult {
    guard(|| {
        let f = real!(cuArray3DCreate_v2: unsafe extern "C" fn(*mut u64, *const Array3dDescriptor) -> CUresult);
        // SAFETY: as in cuArrayCreate_v2.
        let bytes = unsafe { desc.as_ref() }.map_or(0, |d| arrays::bytes_3d(d, 1));
        alloc_with(bytes as usize, Kind::Array, || {
            // SAFETY: forwarding.
            let r = unsafe { f(handle, desc) };
            (
                r,
                if r == CUDA_SUCCESS {
                    read_out(handle)
                } else {
                    0
                },
            )
        })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut u64,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        let f = real!(cuMipmappedArrayCreate: unsafe extern "C" fn(*mut u64, *const Array3dDescriptor, c_uint) -> CUresult);
        // SAFETY: as in cuArrayCreate_v2.
        let bytes = unsafe { desc.as_ref() }.map_or(0, |d| arrays::bytes_3d(d, levels));
        alloc_with(bytes as usize, Kind::Array, || {
            // SAFETY: forwarding.
            let r = unsafe { f(handle, desc, levels) };
            (
                r,
                if r == CUDA_SUCCESS {
                    read_out(handle)
                } else {
                    0
                },
            )
        })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(handle: u64) -> CUresult {
    guard(|| {
        let f = real!(cuArrayDestroy: unsafe extern "C" fn(u64) -> CUresult);
        // SAFETY: forwarding.
        free_with(Kind::Array, handle, || unsafe { f(handle) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: u64) -> CUresult {
    guard(|| {
        let f = real!(cuMipmappedArrayDestroy: unsafe extern "C" fn(u64) -> CUresult);
        // SAFETY: forwarding.
        free_with(Kind::Array, handle, || unsafe { f(handle) })
    })
}

/// Quota view of the current device: `total = min(physical, quota)`,
/// `free = min(physical free, total - used - unseen)`.
/// NULL arguments: the driver sees the caller's own pointers first, so the result code is
/// exactly the driver's (`CUDA_ERROR_INVALID_VALUE` for NULL today); only if it accepts them
/// do we compute the view into locals and write the non-NULL outputs.
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        if state::test_panic() {
            panic!("ARBITER_INTERPOSE_TEST_PANIC: deliberate panic inside cuMemGetInfo_v2");
        }
        let f = real!(cuMemGetInfo_v2: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult);
        if free.is_null() || total.is_null() {
            // SAFETY: forwarding the caller's arguments unchanged.
            let r = unsafe { f(free, total) };
            if r != CUDA_SUCCESS {
                return r;
            }
        }
        let (mut fr, mut to) = (0usize, 0usize);
        // SAFETY: valid local out-pointers.
        let r = unsafe { f(&mut fr, &mut to) };
        if r != CUDA_SUCCESS {
            return r;
        }
        if state::mode() == ENFORCE
            && let Some(b) = state::block()
        {
            let quota = b.limits.quota_bytes.load(Ordering::Relaxed);
            let d = b.device(quota::current_device());
            let used = d
                .used_bytes
                .load(Ordering::Relaxed)
                .saturating_add(d.unseen_bytes.load(Ordering::Relaxed));
            let t = (to as u64).min(quota);
            to = t as usize;
            fr = (fr as u64).min(t.saturating_sub(used)) as usize;
        }
        // SAFETY: each output written only if the caller supplied it.
        unsafe {
            if !free.is_null() {
                *free = fr;
            }
            if !total.is_null() {
                *total = to;
            }
        }
        r
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    guard(|| {
        let f = real!(cuDeviceTotalMem_v2: unsafe extern "C" fn(*mut usize, c_int) -> CUresult);
        if bytes.is_null() {
            // SAFETY: forwarding the caller's arguments unchanged (the driver's own NULL answer).
            return unsafe { f(bytes, dev) };
        }
        let mut t = 0usize;
        // SAFETY: valid local out-pointer.
        let r = unsafe { f(&mut t, dev) };
        if r != CUDA_SUCCESS {
            return r;
        }
        if state::mode() == ENFORCE
            && let Some(b) = state::block()
        {
            t = (t as u64).min(b.limits.quota_bytes.load(Ordering::Relaxed)) as usize;
        }
        // SAFETY: non-NULL caller pointer (checked above).
        unsafe { *bytes = t };
        r
    })
}

// ---------------------------------------------------------------------------------------------
// Contexts (tracked for the graceful exit)

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut u64, flags: c_uint, dev: c_int) -> CUresult {
    guard(|| {
        let f = real!(cuCtxCreate_v2: unsafe extern "C" fn(*mut u64, c_uint, c_int) -> CUresult);
        exit::late_init();
        // SAFETY: forwarding.
        created(unsafe { f(ctx, flags, dev) }, ctx)
    })
}

/// Records a context the driver just created (every creation ABI ends here).
fn created(r: CUresult, ctx: *mut u64) -> CUresult {
    if r == CUDA_SUCCESS {
        exit::track_created(read_out(ctx));
    }
    r
}

/// `cuCtxCreate_v3` (CUDA 11.4, execution affinity).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut u64,
    params: Ptr,
    num_params: c_int,
    flags: c_uint,
    dev: c_int,
) -> CUresult {
    guard(|| {
        let f = real!(cuCtxCreate_v3: unsafe extern "C" fn(*mut u64, Ptr, c_int, c_uint, c_int) -> CUresult);
        exit::late_init();
        // SAFETY: forwarding.
        created(unsafe { f(ctx, params, num_params, flags, dev) }, ctx)
    })
}

/// `cuCtxCreate_v4` (CUDA 12.5, `CUctxCreateParams`).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut u64,
    params: Ptr,
    flags: c_uint,
    dev: c_int,
) -> CUresult {
    guard(|| {
        let f =
            real!(cuCtxCreate_v4: unsafe extern "C" fn(*mut u64, Ptr, c_uint, c_int) -> CUresult);
        exit::late_init();
        // SAFETY: forwarding.
        created(unsafe { f(ctx, params, flags, dev) }, ctx)
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: u64) -> CUresult {
    guard(|| {
        let f = real!(cuCtxDestroy_v2: unsafe extern "C" fn(u64) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(ctx) };
        if r == CUDA_SUCCESS {
            exit::untrack_created(ctx);
            quota::context_destroyed(ctx);
        }
        r
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut u64, dev: c_int) -> CUresult {
    guard(|| {
        let f = real!(cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut u64, c_int) -> CUresult);
        exit::late_init();
        // SAFETY: forwarding.
        let r = unsafe { f(ctx, dev) };
        if r == CUDA_SUCCESS {
            exit::track_primary(dev, read_out(ctx));
        }
        r
    })
}

/// Resetting the primary context frees everything allocated in it.
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: c_int) -> CUresult {
    guard(|| {
        let f = real!(cuDevicePrimaryCtxReset_v2: unsafe extern "C" fn(c_int) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(dev) };
        if r == CUDA_SUCCESS
            && let Some(ctx) = exit::primary_context(dev)
        {
            quota::context_destroyed(ctx);
        }
        r
    })
}

/// The CUDA 7.0 ABI, which cudart still asks for at version 7000.
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: c_int) -> CUresult {
    guard(|| {
        let f = real!(cuDevicePrimaryCtxRelease: unsafe extern "C" fn(c_int) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(dev) };
        if r == CUDA_SUCCESS
            && let Some(ctx) = exit::untrack_primary(dev)
        {
            quota::context_destroyed(ctx);
        }
        r
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    guard(|| {
        let f = real!(cuDevicePrimaryCtxRelease_v2: unsafe extern "C" fn(c_int) -> CUresult);
        // SAFETY: forwarding.
        let r = unsafe { f(dev) };
        if r == CUDA_SUCCESS
            && let Some(ctx) = exit::untrack_primary(dev)
        {
            quota::context_destroyed(ctx);
        }
        r
    })
}

// ---------------------------------------------------------------------------------------------
// Launches

type LaunchFn = unsafe extern "C" fn(
    Ptr,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Ptr,
    Args,
    Args,
) -> CUresult;
type CoopFn = unsafe extern "C" fn(
    Ptr,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Ptr,
    Args,
) -> CUresult;
type LaunchExFn = unsafe extern "C" fn(*const LaunchConfig, Ptr, Args, Args) -> CUresult;
type GraphFn = unsafe extern "C" fn(Ptr, Ptr) -> CUresult;

/// Prefix of `CUlaunchConfig` up to the stream (the only field we read).
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: Ptr,
}

/// Admit the launch (or return the pacer's refusal); evaluates to the [`pacer::Admission`]
/// to settle with the driver's answer.
macro_rules! admit_or_return {
    ($stream:expr, $kind:expr, $weight:expr) => {
        match pacer::admit($stream, $kind, $weight) {
            Ok(admission) => admission,
            Err(e) => return e,
        }
    };
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Ptr,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shm: c_uint,
    stream: Ptr,
    params: Args,
    extra: Args,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchKernel: LaunchFn);
        let admission = admit_or_return!(stream, StreamKind::Legacy, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(f, gx, gy, gz, bx, by, bz, shm, stream, params, extra) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Ptr,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shm: c_uint,
    stream: Ptr,
    params: Args,
    extra: Args,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchKernel_ptsz: LaunchFn);
        let admission = admit_or_return!(stream, StreamKind::PerThread, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(f, gx, gy, gz, bx, by, bz, shm, stream, params, extra) })
    })
}

fn config_stream(cfg: *const LaunchConfig) -> Ptr {
    if cfg.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-NULL CUlaunchConfig supplied by the caller; we read only the stream.
    unsafe { (*cfg).stream }
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    cfg: *const LaunchConfig,
    f: Ptr,
    params: Args,
    extra: Args,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchKernelEx: LaunchExFn);
        let admission = admit_or_return!(config_stream(cfg), StreamKind::Legacy, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(cfg, f, params, extra) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    cfg: *const LaunchConfig,
    f: Ptr,
    params: Args,
    extra: Args,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchKernelEx_ptsz: LaunchExFn);
        let admission = admit_or_return!(config_stream(cfg), StreamKind::PerThread, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(cfg, f, params, extra) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Ptr,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shm: c_uint,
    stream: Ptr,
    params: Args,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchCooperativeKernel: CoopFn);
        let admission = admit_or_return!(stream, StreamKind::Legacy, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(f, gx, gy, gz, bx, by, bz, shm, stream, params) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Ptr,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shm: c_uint,
    stream: Ptr,
    params: Args,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchCooperativeKernel_ptsz: CoopFn);
        let admission = admit_or_return!(stream, StreamKind::PerThread, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(f, gx, gy, gz, bx, by, bz, shm, stream, params) })
    })
}

/// Charged as one launch per participating device.
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: Ptr,
    n: c_uint,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let real = real!(cuLaunchCooperativeKernelMultiDevice: unsafe extern "C" fn(Ptr, c_uint, c_uint) -> CUresult);
        let admission =
            admit_or_return!(std::ptr::null_mut(), StreamKind::None, u64::from(n.max(1)));
        // SAFETY: forwarding.
        admission.settle(unsafe { real(list, n, flags) })
    })
}

/// Graph launches are paced like a launch (work captured into the graph was not paced).
///
/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: Ptr, stream: Ptr) -> CUresult {
    guard(|| {
        let real = real!(cuGraphLaunch: GraphFn);
        let admission = admit_or_return!(stream, StreamKind::Legacy, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(exec, stream) })
    })
}

/// # Safety
/// Driver API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Ptr, stream: Ptr) -> CUresult {
    guard(|| {
        let real = real!(cuGraphLaunch_ptsz: GraphFn);
        let admission = admit_or_return!(stream, StreamKind::PerThread, 1);
        // SAFETY: forwarding.
        admission.settle(unsafe { real(exec, stream) })
    })
}
