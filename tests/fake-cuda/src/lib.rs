//! A fake `libcuda.so.1` that simulates one GPU so the interposer can be tested without one.
//!
//! What it simulates:
//! * device memory of `FAKE_CUDA_MEM_BYTES` (default 16 GiB), 512-byte granularity, with
//!   `CUDA_ERROR_OUT_OF_MEMORY` when full; every allocator the interposer wraps;
//! * kernels that each occupy the device for `FAKE_CUDA_KERNEL_NS` (default 0) on a single
//!   in-order timeline; launches are asynchronous and `cuCtxSynchronize`/`cuStreamSynchronize`
//!   wait for the timeline to drain;
//! * `FAKE_CUDA_DEVICES` devices (default 1) sharing one memory pool; contexts (created and
//!   primary, per device), streams, stream capture and graph launch;
//! * `cuGetProcAddress{,_v2}` resolving (name, version, flags) like the real driver does:
//!   `_ptsz` for the per-thread default stream flag (the real names, cuda.h 12.9: also
//!   `cuMemAllocAsync_ptsz`, `cuMemFreeAsync_ptsz`, `cuMemAllocFromPoolAsync_ptsz`), `_v2` for new
//!   enough versions. It is linked `-Bsymbolic` like the real driver (see build.rs).
//!
//! Accounting of what reached the "device" is kept in [`Slot`] counters. When `FAKE_CUDA_STATE`
//! names a file, the counters live in that file (mapped `MAP_SHARED`), so a test can read them
//! after the workload exited, even when it was killed by a signal. Layout: little-endian u64s
//! indexed by [`Slot`].
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

type CUresult = c_int;
const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const OUT_OF_MEMORY: CUresult = 2;
const INVALID_DEVICE: CUresult = 101;
const INVALID_CONTEXT: CUresult = 201;
const NOT_FOUND: CUresult = 500;

mod layout;
pub use layout::{SLOTS, STATE_MAGIC, Slot};

struct Device {
    slots: &'static [AtomicU64; SLOTS],
    kernel_ns: u64,
    /// Device pointer → (bytes, the context it was allocated in).
    allocations: Mutex<HashMap<u64, (u64, u64)>>,
    vmm: Mutex<HashMap<u64, Physical>>,
    /// VMM mappings: start address → (size, handle).
    mappings: Mutex<BTreeMap<u64, (u64, u64)>>,
    /// Arrays and mipmapped arrays: handle → bytes.
    arrays: Mutex<HashMap<u64, (u64, u64)>>,
    capturing: Mutex<HashSet<u64>>,
    /// Devices (`FAKE_CUDA_DEVICES`, default 1); they share one memory pool.
    count: c_int,
    /// Retain count of each device's primary context.
    primary_refs: Mutex<Vec<u64>>,
    /// Device of each created context.
    ctx_device: Mutex<HashMap<u64, c_int>>,
    next_addr: AtomicU64,
    next_handle: AtomicU64,
}

/// Device `d`'s primary context is `PRIMARY_CTX + d`.
const PRIMARY_CTX: u64 = 0xC0_0000;

fn valid_device(device: c_int) -> bool {
    (0..dev().count).contains(&device)
}

fn primary_device(ctx: u64) -> Option<c_int> {
    ctx.checked_sub(PRIMARY_CTX)
        .filter(|d| *d < 16)
        .map(|d| d as c_int)
}

/// A `cuMemCreate` allocation.
struct Physical {
    size: u64,
    maps: u64,
    released: bool,
}

fn env_u64(name: &CStr, default: u64) -> u64 {
    // SAFETY: getenv with a NUL-terminated name; the result is either NULL or a C string
    // owned by the environment, copied out immediately.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return default;
    }
    // SAFETY: non-NULL getenv result is a valid C string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

fn map_state_file() -> Option<&'static [AtomicU64; SLOTS]> {
    // SAFETY: see env_u64.
    let p = unsafe { libc::getenv(c"FAKE_CUDA_STATE".as_ptr()) };
    if p.is_null() {
        return None;
    }
    let size = SLOTS * 8;
    // SAFETY: open/ftruncate/mmap on a path from the environment; every result is checked and
    // the mapping (SLOTS u64s, page aligned) is never unmapped, so the 'static borrow is valid.
    unsafe {
        let fd = libc::open(p, libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600);
        if fd < 0 {
            return None;
        }
        if libc::ftruncate(fd, size as libc::off_t) != 0 {
            libc::close(fd);
            return None;
        }
        let m = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        if m == libc::MAP_FAILED {
            return None;
        }
        Some(&*(m as *const [AtomicU64; SLOTS]))
    }
}

fn dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| {
        let slots = map_state_file()
            .unwrap_or_else(|| Box::leak(Box::new(std::array::from_fn(|_| AtomicU64::new(0)))));
        let total = env_u64(c"FAKE_CUDA_MEM_BYTES", 16 << 30);
        if slots[Slot::Magic as usize].load(Ordering::Acquire) != STATE_MAGIC {
            slots[Slot::MemTotal as usize].store(total, Ordering::Relaxed);
            slots[Slot::Magic as usize].store(STATE_MAGIC, Ordering::Release);
        }
        Device {
            slots,
            kernel_ns: env_u64(c"FAKE_CUDA_KERNEL_NS", 0),
            allocations: Mutex::new(HashMap::new()),
            vmm: Mutex::new(HashMap::new()),
            mappings: Mutex::new(BTreeMap::new()),
            arrays: Mutex::new(HashMap::new()),
            capturing: Mutex::new(HashSet::new()),
            count: env_u64(c"FAKE_CUDA_DEVICES", 1).clamp(1, 16) as c_int,
            primary_refs: Mutex::new(vec![0; 16]),
            ctx_device: Mutex::new(HashMap::new()),
            next_addr: AtomicU64::new(0x7f00_0000_0000),
            next_handle: AtomicU64::new(1),
        }
    })
}

fn slot(s: Slot) -> &'static AtomicU64 {
    &dev().slots[s as usize]
}

fn bump(s: Slot, n: u64) {
    slot(s).fetch_add(n, Ordering::Relaxed);
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until(deadline: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: absolute sleep on CLOCK_MONOTONIC with a valid timespec; EINTR just returns early
    // and callers loop.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

thread_local! {
    static CURRENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Memory

fn reserve_device(size: usize) -> Result<u64, CUresult> {
    let d = dev();
    let rounded = (size as u64).div_ceil(512) * 512;
    if rounded == 0 {
        return Err(INVALID_VALUE);
    }
    let total = slot(Slot::MemTotal).load(Ordering::Relaxed);
    let used = slot(Slot::MemUsed);
    let ok = used.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
        u.checked_add(rounded).filter(|n| *n <= total)
    });
    match ok {
        Ok(prev) => {
            slot(Slot::MemPeak).fetch_max(prev + rounded, Ordering::Relaxed);
            bump(Slot::Allocs, 1);
            Ok(d.next_addr.fetch_add(rounded + 512, Ordering::Relaxed))
        }
        Err(_) => Err(OUT_OF_MEMORY),
    }
}

fn alloc_into(dptr: *mut u64, size: usize, extra: Option<Slot>) -> CUresult {
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    match reserve_device(size) {
        Ok(addr) => {
            let rounded = (size as u64).div_ceil(512) * 512;
            lock(&dev().allocations).insert(addr, (rounded, CURRENT.with(|c| c.get())));
            if let Some(s) = extra {
                bump(s, rounded);
            }
            // SAFETY: dptr checked non-NULL; the caller passes a writable CUdeviceptr.
            unsafe { *dptr = addr };
            SUCCESS
        }
        Err(e) => e,
    }
}

fn free_addr(addr: u64) -> CUresult {
    match lock(&dev().allocations).remove(&addr) {
        Some((size, _)) => {
            slot(Slot::MemUsed).fetch_sub(size, Ordering::AcqRel);
            bump(Slot::Frees, 1);
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

/// A context is gone: like the driver, free what was allocated in it (pointers and arrays).
fn free_in_context(ctx: u64) {
    let d = dev();
    let mut freed = 0u64;
    for map in [&d.allocations, &d.arrays] {
        lock(map).retain(|_, (size, c)| {
            let keep = *c != ctx;
            if !keep {
                freed += *size;
            }
            keep
        });
    }
    slot(Slot::MemUsed).fetch_sub(freed, Ordering::AcqRel);
}

fn free_everything() {
    let d = dev();
    lock(&d.allocations).clear();
    lock(&d.vmm).clear();
    lock(&d.mappings).clear();
    lock(&d.arrays).clear();
    slot(Slot::MemUsed).store(0, Ordering::Release);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CUresult {
    alloc_into(dptr, size, None)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _elem: c_uint,
) -> CUresult {
    if pitch.is_null() {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    let r = alloc_into(dptr, p.saturating_mul(height), Some(Slot::PitchBytes));
    if r == SUCCESS {
        // SAFETY: checked non-NULL above.
        unsafe { *pitch = p };
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut u64,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    alloc_into(dptr, size, Some(Slot::ManagedBytes))
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// Records the advice a caller gives a managed range: preferred location host
/// (`HostPreferredBytes`) and access by a device (`AccessedByBytes`). The
/// range must start at a live allocation.
fn advise(ptr: u64, count: usize, advice: c_int, host: bool, device: bool) -> CUresult {
    if !lock(&dev().allocations).contains_key(&ptr) {
        return INVALID_VALUE;
    }
    match advice {
        3 if host => bump(Slot::HostPreferredBytes, count as u64),
        5 if device => bump(Slot::AccessedByBytes, count as u64),
        1..=6 => {}
        _ => return INVALID_VALUE,
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAdvise_v2(
    ptr: u64,
    count: usize,
    advice: c_int,
    location: MemLocation,
) -> CUresult {
    // CU_MEM_LOCATION_TYPE_DEVICE = 1, _HOST = 2.
    advise(ptr, count, advice, location.kind == 2, location.kind == 1)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAdvise(
    ptr: u64,
    count: usize,
    advice: c_int,
    device: c_int,
) -> CUresult {
    // CU_DEVICE_CPU = -1.
    advise(ptr, count, advice, device == -1, device >= 0)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, _s: *mut c_void) -> CUresult {
    alloc_into(dptr, size, Some(Slot::AsyncBytes))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    _s: *mut c_void,
) -> CUresult {
    alloc_into(dptr, size, Some(Slot::AsyncPtszBytes))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    size: usize,
    _pool: *mut c_void,
    _s: *mut c_void,
) -> CUresult {
    alloc_into(dptr, size, Some(Slot::AsyncBytes))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    _pool: *mut c_void,
    _s: *mut c_void,
) -> CUresult {
    alloc_into(dptr, size, Some(Slot::AsyncPtszBytes))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    free_addr(dptr)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: u64, _s: *mut c_void) -> CUresult {
    free_addr(dptr)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, _s: *mut c_void) -> CUresult {
    free_addr(dptr)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    _prop: *const c_void,
    _flags: u64,
) -> CUresult {
    if handle.is_null() {
        return INVALID_VALUE;
    }
    match reserve_device(size) {
        Ok(_) => {
            let rounded = (size as u64).div_ceil(512) * 512;
            let h = dev().next_handle.fetch_add(1, Ordering::Relaxed);
            lock(&dev().vmm).insert(
                h,
                Physical {
                    size: rounded,
                    maps: 0,
                    released: false,
                },
            );
            bump(Slot::VmmBytes, rounded);
            // SAFETY: checked non-NULL.
            unsafe { *handle = h };
            SUCCESS
        }
        Err(e) => e,
    }
}

/// Like the real driver, a released handle's memory stays allocated while it is mapped and
/// is freed with its last unmap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    let mut vmm = lock(&dev().vmm);
    let Some(phys) = vmm.get_mut(&handle).filter(|p| !p.released) else {
        return INVALID_VALUE;
    };
    phys.released = true;
    bump(Slot::Frees, 1);
    if phys.maps == 0 {
        let size = phys.size;
        vmm.remove(&handle);
        slot(Slot::MemUsed).fetch_sub(size, Ordering::AcqRel);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    va: u64,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> CUresult {
    let mut vmm = lock(&dev().vmm);
    let Some(phys) = vmm.get_mut(&handle).filter(|p| !p.released) else {
        return INVALID_VALUE;
    };
    let mut mappings = lock(&dev().mappings);
    if va == 0 || size == 0 || mappings.contains_key(&va) {
        return INVALID_VALUE;
    }
    phys.maps += 1;
    mappings.insert(va, (size as u64, handle));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(va: u64, size: usize) -> CUresult {
    let mut vmm = lock(&dev().vmm);
    let mut mappings = lock(&dev().mappings);
    let starts: Vec<u64> = mappings
        .range(va..va.saturating_add(size as u64))
        .map(|(k, _)| *k)
        .collect();
    if starts.is_empty() {
        return INVALID_VALUE;
    }
    for start in starts {
        let Some((_, handle)) = mappings.remove(&start) else {
            continue;
        };
        if let Some(phys) = vmm.get_mut(&handle) {
            phys.maps = phys.maps.saturating_sub(1);
            if phys.maps == 0 && phys.released {
                let size = phys.size;
                vmm.remove(&handle);
                slot(Slot::MemUsed).fetch_sub(size, Ordering::AcqRel);
            }
        }
    }
    SUCCESS
}

/// Bytes per element of the formats the fake knows; others are refused like a bad format.
fn array_element(format: c_uint, channels: c_uint) -> Option<u64> {
    let per_channel = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    };
    matches!(channels, 1 | 2 | 4).then_some(per_channel * u64::from(channels))
}

/// The fake's footprint of an array: each row padded to 512 bytes, every mip level (the real
/// driver pads and tiles too; the interposer charges only the payload).
fn array_footprint(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    levels: c_uint,
) -> Option<u64> {
    let element = array_element(format, channels)?;
    if w == 0 {
        return None;
    }
    let mut total = 0u64;
    for l in 0..levels.max(1) {
        let shrink = |x: usize| ((x as u64) >> l).max(1);
        let row = (shrink(w) * element).div_ceil(512) * 512;
        total += row * shrink(h) * shrink(d);
    }
    Some(total)
}

fn create_array(handle: *mut u64, bytes: Option<u64>) -> CUresult {
    let Some(bytes) = bytes.filter(|_| !handle.is_null()) else {
        return INVALID_VALUE;
    };
    match reserve_device(bytes as usize) {
        Ok(_) => {
            let rounded = bytes.div_ceil(512) * 512;
            let h = 0xA000_0000 + dev().next_handle.fetch_add(1, Ordering::Relaxed);
            lock(&dev().arrays).insert(h, (rounded, CURRENT.with(|c| c.get())));
            bump(Slot::ArrayBytes, rounded);
            // SAFETY: checked non-NULL.
            unsafe { *handle = h };
            SUCCESS
        }
        Err(e) => e,
    }
}

fn destroy_array(handle: u64) -> CUresult {
    match lock(&dev().arrays).remove(&handle) {
        Some((size, _)) => {
            slot(Slot::MemUsed).fetch_sub(size, Ordering::AcqRel);
            bump(Slot::Frees, 1);
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(handle: *mut u64, d: *const ArrayDescriptor) -> CUresult {
    // SAFETY: a non-NULL descriptor is the caller's valid CUDA_ARRAY_DESCRIPTOR.
    let bytes = unsafe { d.as_ref() }
        .and_then(|d| array_footprint(d.width, d.height, 1, d.format, d.num_channels, 1));
    create_array(handle, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut u64,
    d: *const Array3dDescriptor,
) -> CUresult {
    // SAFETY: a non-NULL descriptor is the caller's valid CUDA_ARRAY3D_DESCRIPTOR.
    let bytes = unsafe { d.as_ref() }
        .and_then(|d| array_footprint(d.width, d.height, d.depth, d.format, d.num_channels, 1));
    create_array(handle, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut u64,
    d: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    // SAFETY: as above.
    let bytes = unsafe { d.as_ref() }.and_then(|d| {
        array_footprint(d.width, d.height, d.depth, d.format, d.num_channels, levels)
    });
    create_array(handle, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(handle: u64) -> CUresult {
    destroy_array(handle)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: u64) -> CUresult {
    destroy_array(handle)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    let t = slot(Slot::MemTotal).load(Ordering::Relaxed);
    let u = slot(Slot::MemUsed).load(Ordering::Relaxed);
    // SAFETY: both checked non-NULL.
    unsafe {
        *free = t.saturating_sub(u) as usize;
        *total = t as usize;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) -> CUresult {
    if bytes.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *bytes = slot(Slot::MemTotal).load(Ordering::Relaxed) as usize };
    SUCCESS
}

// ---------------------------------------------------------------------------------------------
// Device, contexts, streams

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    bump(Slot::Inits, 1);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    if v.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *v = 12080 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CUresult {
    if device.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(ordinal) {
        return INVALID_DEVICE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *device = ordinal };
    SUCCESS
}

/// Device `d`'s UUID: `fa ce 00 … 00 d` (NVML would print `GPU-face0000-…-0000000000dd`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut u8, device: c_int) -> CUresult {
    if uuid.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let mut bytes = [0u8; 16];
    bytes[0] = 0xfa;
    bytes[1] = 0xce;
    bytes[15] = device as u8;
    // SAFETY: checked non-NULL; a CUuuid is 16 writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), uuid, 16) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut u8, device: c_int) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    if count.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *count = dev().count };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> CUresult {
    if name.is_null() || len <= 0 {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let text = b"Arbiter Fake GPU\0";
    let n = text.len().min(len as usize);
    // SAFETY: `name` holds `len` writable bytes per the API contract; we copy at most that many
    // and always terminate.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, n);
        *name.add(n - 1) = 0;
    }
    SUCCESS
}

fn make_current(ctx: u64) {
    CURRENT.with(|c| c.set(ctx));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut u64, _flags: c_uint, device: c_int) -> CUresult {
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let id = 0xC1_0000 + dev().next_handle.fetch_add(1, Ordering::Relaxed);
    lock(&dev().ctx_device).insert(id, device);
    bump(Slot::CtxLive, 1);
    make_current(id);
    // SAFETY: checked non-NULL.
    unsafe { *ctx = id };
    SUCCESS
}

/// `cuCtxCreate_v3` (CUDA 11.4: execution-affinity parameters, ignored here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut u64,
    _params: *mut c_void,
    _num_params: c_int,
    flags: c_uint,
    device: c_int,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2 for the arguments it shares.
    unsafe { cuCtxCreate_v2(ctx, flags, device) }
}

/// `cuCtxCreate_v4` (CUDA 12.5: `CUctxCreateParams`, ignored here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut u64,
    _params: *mut c_void,
    flags: c_uint,
    device: c_int,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2 for the arguments it shares.
    unsafe { cuCtxCreate_v2(ctx, flags, device) }
}

fn context_gone() {
    slot(Slot::CtxDestroyed).fetch_add(1, Ordering::Relaxed);
    if slot(Slot::CtxLive).fetch_sub(1, Ordering::AcqRel) == 1 {
        free_everything();
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: u64) -> CUresult {
    if ctx == 0 || lock(&dev().ctx_device).remove(&ctx).is_none() {
        return INVALID_CONTEXT;
    }
    free_in_context(ctx);
    context_gone();
    if CURRENT.with(|c| c.get()) == ctx {
        make_current(0);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut u64, device: c_int) -> CUresult {
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let mut refs = lock(&dev().primary_refs);
    let refs = &mut refs[device as usize];
    *refs += 1;
    if *refs == 1 {
        bump(Slot::CtxLive, 1);
    }
    // SAFETY: checked non-NULL.
    unsafe { *ctx = PRIMARY_CTX + device as u64 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> CUresult {
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let mut refs = lock(&dev().primary_refs);
    let refs = &mut refs[device as usize];
    if *refs == 0 {
        return INVALID_CONTEXT;
    }
    *refs -= 1;
    if *refs == 0 {
        free_in_context(PRIMARY_CTX + device as u64);
        context_gone();
    }
    SUCCESS
}

/// Resets the primary context: everything allocated in it is freed; references stay.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> CUresult {
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    free_in_context(PRIMARY_CTX + device as u64);
    SUCCESS
}

/// The CUDA 7.0 ABI of the release (what cudart asks for at version 7000); same behaviour.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(device: c_int) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDevicePrimaryCtxRelease_v2(device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CUresult {
    if device.is_null() {
        return INVALID_VALUE;
    }
    let ctx = CURRENT.with(|c| c.get());
    let found = primary_device(ctx).or_else(|| lock(&dev().ctx_device).get(&ctx).copied());
    match found {
        Some(d) => {
            // SAFETY: checked non-NULL.
            unsafe { *device = d };
            SUCCESS
        }
        None => INVALID_CONTEXT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: u64) -> CUresult {
    make_current(ctx);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut u64) -> CUresult {
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *ctx = CURRENT.with(|c| c.get()) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: u64) -> CUresult {
    make_current(ctx);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut u64) -> CUresult {
    let cur = CURRENT.with(|c| c.replace(0));
    if !ctx.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { *ctx = cur };
    }
    SUCCESS
}

fn drain() {
    loop {
        let until = slot(Slot::BusyUntil).load(Ordering::Acquire);
        if now_ns() >= until {
            return;
        }
        sleep_until(until);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    if CURRENT.with(|c| c.get()) == 0 {
        return INVALID_CONTEXT;
    }
    drain();
    bump(Slot::Syncs, 1);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut u64, _flags: c_uint) -> CUresult {
    if stream.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *stream = 0x5700_0000 + dev().next_handle.fetch_add(1, Ordering::Relaxed) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(_stream: u64) -> CUresult {
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(_stream: u64) -> CUresult {
    drain();
    bump(Slot::Syncs, 1);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(_stream: u64) -> CUresult {
    drain();
    bump(Slot::Syncs, 1);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: u64, _mode: c_int) -> CUresult {
    if stream == 0 {
        return INVALID_VALUE;
    }
    lock(&dev().capturing).insert(stream);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: u64, graph: *mut u64) -> CUresult {
    if graph.is_null() || !lock(&dev().capturing).remove(&stream) {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *graph = 0x6700_0000 + dev().next_handle.fetch_add(1, Ordering::Relaxed) };
    SUCCESS
}

fn capture_status(stream: u64, status: *mut c_int) -> CUresult {
    if status.is_null() {
        return INVALID_VALUE;
    }
    let on = lock(&dev().capturing).contains(&stream);
    // SAFETY: checked non-NULL.
    unsafe { *status = c_int::from(on) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: u64, status: *mut c_int) -> CUresult {
    capture_status(stream, status)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(stream: u64, status: *mut c_int) -> CUresult {
    capture_status(stream, status)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut u64,
    graph: u64,
    _f: u64,
) -> CUresult {
    if exec.is_null() || graph == 0 {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { *exec = graph + 0x100_0000 };
    SUCCESS
}

// ---------------------------------------------------------------------------------------------
// Launches

fn run_kernel(stream: u64, weight: u64, which: Slot) -> CUresult {
    if lock_free_capturing(stream) {
        return SUCCESS;
    }
    bump(Slot::Launches, weight);
    if !matches!(which, Slot::Launches) {
        bump(which, weight);
    }
    let d = dev();
    if d.kernel_ns > 0 {
        let dur = d.kernel_ns * weight;
        let now = now_ns();
        let busy = slot(Slot::BusyUntil);
        let _ = busy.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |b| {
            Some(b.max(now) + dur)
        });
        bump(Slot::KernelNs, dur);
    }
    SUCCESS
}

/// Launches into a capturing stream are recorded into the graph, not executed.
fn lock_free_capturing(stream: u64) -> bool {
    stream != 0 && lock(&dev().capturing).contains(&stream)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    stream: u64,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    if f.is_null() {
        return INVALID_VALUE;
    }
    run_kernel(stream, 1, Slot::Launches)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: *mut c_void,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    stream: u64,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    if f.is_null() {
        return INVALID_VALUE;
    }
    run_kernel(stream, 1, Slot::LaunchesPtsz)
}

/// Mirror of `CUlaunchConfig` (only the stream is read).
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: u64,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

unsafe fn launch_ex(cfg: *const LaunchConfig, f: *mut c_void, which: Slot) -> CUresult {
    if cfg.is_null() || f.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-NULL; the caller passes a valid CUlaunchConfig.
    let stream = unsafe { (*cfg).stream };
    bump(Slot::LaunchesEx, 1);
    run_kernel(stream, 1, which)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    cfg: *const LaunchConfig,
    f: *mut c_void,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { launch_ex(cfg, f, Slot::Launches) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    cfg: *const LaunchConfig,
    f: *mut c_void,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { launch_ex(cfg, f, Slot::LaunchesPtsz) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: *mut c_void,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    stream: u64,
    _params: *mut *mut c_void,
) -> CUresult {
    if f.is_null() {
        return INVALID_VALUE;
    }
    bump(Slot::CoopLaunches, 1);
    run_kernel(stream, 1, Slot::Launches)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: *mut c_void,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    stream: u64,
    _params: *mut *mut c_void,
) -> CUresult {
    if f.is_null() {
        return INVALID_VALUE;
    }
    bump(Slot::CoopLaunches, 1);
    run_kernel(stream, 1, Slot::LaunchesPtsz)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut c_void,
    n: c_uint,
    _flags: c_uint,
) -> CUresult {
    if list.is_null() || n == 0 {
        return INVALID_VALUE;
    }
    bump(Slot::CoopLaunches, u64::from(n));
    run_kernel(0, u64::from(n), Slot::Launches)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: u64, stream: u64) -> CUresult {
    if exec == 0 {
        return INVALID_VALUE;
    }
    bump(Slot::GraphLaunches, 1);
    run_kernel(stream, 1, Slot::Launches)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: u64, stream: u64) -> CUresult {
    if exec == 0 {
        return INVALID_VALUE;
    }
    bump(Slot::GraphLaunches, 1);
    run_kernel(stream, 1, Slot::LaunchesPtsz)
}

// ---------------------------------------------------------------------------------------------
// Entry-point lookup

const PTDS: u64 = 1 << 1;

fn export(name: &[u8]) -> Option<*mut c_void> {
    macro_rules! table {
        ($($f:ident),* $(,)?) => {
            match name {
                $(n if n == stringify!($f).as_bytes() => Some($f as *mut c_void),)*
                _ => None,
            }
        };
    }
    table!(
        cuInit,
        cuDriverGetVersion,
        cuDeviceGet,
        cuDeviceGetCount,
        cuDeviceGetUuid,
        cuDeviceGetUuid_v2,
        cuDeviceGetName,
        cuDeviceTotalMem_v2,
        cuCtxCreate_v2,
        cuCtxCreate_v3,
        cuCtxCreate_v4,
        cuCtxDestroy_v2,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease,
        cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxReset_v2,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxGetDevice,
        cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2,
        cuCtxSynchronize,
        cuStreamCreate,
        cuStreamDestroy_v2,
        cuStreamSynchronize,
        cuStreamSynchronize_ptsz,
        cuStreamBeginCapture_v2,
        cuStreamEndCapture,
        cuStreamIsCapturing,
        cuStreamIsCapturing_ptsz,
        cuGraphInstantiateWithFlags,
        cuMemAlloc_v2,
        cuMemAllocPitch_v2,
        cuMemAllocManaged,
        cuMemAllocAsync,
        cuMemAllocAsync_ptsz,
        cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz,
        cuMemFree_v2,
        cuMemFreeAsync,
        cuMemFreeAsync_ptsz,
        cuMemCreate,
        cuMemRelease,
        cuMemMap,
        cuMemUnmap,
        cuArrayCreate_v2,
        cuArray3DCreate_v2,
        cuMipmappedArrayCreate,
        cuArrayDestroy,
        cuMipmappedArrayDestroy,
        cuMemGetInfo_v2,
        cuLaunchKernel,
        cuLaunchKernel_ptsz,
        cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz,
        cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz,
        cuLaunchCooperativeKernelMultiDevice,
        cuGraphLaunch,
        cuGraphLaunch_ptsz,
        cuGetProcAddress,
        cuGetProcAddress_v2,
    )
}

/// Resolve like the driver: per-thread variants first when asked for, then the newest ABI
/// revision the requested CUDA version knows, then the base name.
fn resolve(symbol: *const c_char, version: c_int, flags: u64) -> Option<*mut c_void> {
    if symbol.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated symbol name.
    let base = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let with = |suffix: &[u8]| -> Vec<u8> { [base, suffix].concat() };
    if flags & PTDS != 0
        && let Some(p) = export(&with(b"_ptsz"))
    {
        return Some(p);
    }
    let v2_min = if base == b"cuGetProcAddress" {
        12000
    } else {
        3020
    };
    if version >= v2_min
        && let Some(p) = export(&with(b"_v2"))
    {
        return Some(p);
    }
    export(base)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if pfn.is_null() {
        return INVALID_VALUE;
    }
    let found = resolve(symbol, version, flags);
    // SAFETY: pfn checked non-NULL; status is optional and checked.
    unsafe {
        *pfn = found.unwrap_or(std::ptr::null_mut());
        if !status.is_null() {
            *status = if found.is_some() { 0 } else { 1 };
        }
    }
    if found.is_some() { SUCCESS } else { NOT_FOUND }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: same contract minus the status pointer.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}
