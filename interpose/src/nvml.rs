//! NVML as the workload sees it: under a memory quota, `nvmlDeviceGetMemoryInfo{,_v2}` report
//! the quota as the device's total and the workload's own usage as used (what it was charged
//! plus what the node found it holds uncharged) — what `nvidia-smi`,
//! pynvml, Ray and vLLM read before sizing their caches.
//!
//! Reached like the driver entry points: plain interposition for programs linked with
//! `-lnvidia-ml`, and pointer substitution in our `dlsym` for everyone who loads NVML at run
//! time (pynvml's `CDLL`, `nvml-wrapper`'s libloading, `nvidia-smi`). The real functions come
//! from the loaded `libnvidia-ml.so.1` (`RTLD_NOLOAD`, found by its SONAME however it was
//! loaded), else from the next object after us.
//!
//! The per-process queries (`nvmlDeviceGetComputeRunningProcesses{,_v2,_v3}` and their MPS
//! forms) list only the workload's own processes — those holding a process slot in its block —
//! so a tenant does not see who else runs on the GPU, nor how much they use.
//!
//! Which device: NVML lists every GPU of the machine, whatever `CUDA_VISIBLE_DEVICES` says, so
//! each NVML device is matched to one of the workload's CUDA ordinals by UUID ([`cuda_ordinal`]);
//! a GPU that is not the workload's is shown as NVML reports it.
#![allow(non_snake_case)]

use crate::control::ControlBlock;
use crate::real::{self, Sym};
use crate::state::{self, ENFORCE};
use crate::{CUDA_SUCCESS, control::UNLIMITED};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

type Ret = c_uint;
const NVML_SUCCESS: Ret = 0;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
const NVML_ERROR_FUNCTION_NOT_FOUND: Ret = 13;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (v2; the `_v2` and `_v3` queries).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// A process record that has a pid.
trait HasPid: Copy {
    fn pid(&self) -> c_uint;
}
impl HasPid for ProcessInfoV1 {
    fn pid(&self) -> c_uint {
        self.pid
    }
}
impl HasPid for ProcessInfo {
    fn pid(&self) -> c_uint {
        self.pid
    }
}

#[derive(Clone, Copy)]
enum Nvml {
    MemoryInfo,
    MemoryInfoV2,
    GetUUID,
    Processes,
    ProcessesV2,
    ProcessesV3,
    MpsProcesses,
    MpsProcessesV2,
    MpsProcessesV3,
    DeviceCount,
}

const NAMES: [&std::ffi::CStr; 10] = [
    c"nvmlDeviceGetMemoryInfo",
    c"nvmlDeviceGetMemoryInfo_v2",
    c"nvmlDeviceGetUUID",
    c"nvmlDeviceGetComputeRunningProcesses",
    c"nvmlDeviceGetComputeRunningProcesses_v2",
    c"nvmlDeviceGetComputeRunningProcesses_v3",
    c"nvmlDeviceGetMPSComputeRunningProcesses",
    c"nvmlDeviceGetMPSComputeRunningProcesses_v2",
    c"nvmlDeviceGetMPSComputeRunningProcesses_v3",
    c"nvmlDeviceGetCount_v2",
];
static REAL: [AtomicPtr<c_void>; 10] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 10];
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
const NVML_ERROR_INSUFFICIENT_SIZE: Ret = 7;
/// `NVML_ERROR_INVALID_ARGUMENT`.
const NVML_ERROR_INVALID_ARGUMENT: Ret = 2;
static RESOLVED: AtomicBool = AtomicBool::new(false);

/// glibc's `RTLD_NEXT`.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

fn resolve() -> bool {
    if RESOLVED.load(Ordering::Acquire) {
        return true;
    }
    let Some(dlsym) = real::real_dlsym() else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded object.
    let mut handle = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if handle.is_null() {
        handle = RTLD_NEXT;
    }
    let mut any = false;
    for (slot, name) in REAL.iter().zip(NAMES) {
        // SAFETY: real dlsym on a valid handle (or RTLD_NEXT) with a NUL-terminated name.
        let p = unsafe { dlsym(handle, name.as_ptr()) };
        any |= !p.is_null();
        slot.store(p, Ordering::Release);
    }
    if any {
        RESOLVED.store(true, Ordering::Release);
    }
    any
}

fn get(f: Nvml) -> *mut c_void {
    let p = REAL[f as usize].load(Ordering::Acquire);
    if !p.is_null() || !resolve() {
        return p;
    }
    REAL[f as usize].load(Ordering::Acquire)
}

/// Our wrapper if `p` is the real address of an NVML function we wrap.
pub fn substitute(p: *mut c_void) -> Option<*mut c_void> {
    if p.is_null() || state::bypassed() || !resolve() {
        return None;
    }
    let ours: [(Nvml, *mut c_void); 8] = [
        (Nvml::MemoryInfo, nvmlDeviceGetMemoryInfo as *mut c_void),
        (
            Nvml::MemoryInfoV2,
            nvmlDeviceGetMemoryInfo_v2 as *mut c_void,
        ),
        (
            Nvml::Processes,
            nvmlDeviceGetComputeRunningProcesses as *mut c_void,
        ),
        (
            Nvml::ProcessesV2,
            nvmlDeviceGetComputeRunningProcesses_v2 as *mut c_void,
        ),
        (
            Nvml::ProcessesV3,
            nvmlDeviceGetComputeRunningProcesses_v3 as *mut c_void,
        ),
        (
            Nvml::MpsProcesses,
            nvmlDeviceGetMPSComputeRunningProcesses as *mut c_void,
        ),
        (
            Nvml::MpsProcessesV2,
            nvmlDeviceGetMPSComputeRunningProcesses_v2 as *mut c_void,
        ),
        (
            Nvml::MpsProcessesV3,
            nvmlDeviceGetMPSComputeRunningProcesses_v3 as *mut c_void,
        ),
    ];
    ours.iter()
        .find(|(f, _)| p == REAL[*f as usize].load(Ordering::Acquire))
        .map(|(_, wrapper)| *wrapper)
}

/// The quota and the workload's usage to show for `device`, if a quota is enforced and the
/// device is one of the workload's.
fn view(device: *mut c_void) -> Option<(u64, u64)> {
    if state::mode() != ENFORCE {
        return None;
    }
    let b = state::block()?;
    let quota = b.limits.quota_bytes.load(Ordering::Relaxed);
    if quota == UNLIMITED {
        return None;
    }
    let usage = b.device(cuda_ordinal(b, device)?);
    let used = usage
        .used_bytes
        .load(Ordering::Relaxed)
        .saturating_add(usage.unseen_bytes.load(Ordering::Relaxed));
    Some((quota, used))
}

/// The workload's CUDA ordinal of an NVML device, `None` if it is not one of the workload's
/// (NVML lists every GPU of the machine whatever `CUDA_VISIBLE_DEVICES` says):
/// 1. by UUID against CUDA's own ordinals, when the driver is initialised in this process;
/// 2. by UUID against `CUDA_VISIBLE_DEVICES` naming GPUs by UUID (or a prefix, as CUDA
///    accepts) — `nvidia-smi` or pynvml alone in a workload;
/// 3. a machine (or container) whose NVML shows a single GPU: that one.
fn cuda_ordinal(b: &ControlBlock, device: *mut c_void) -> Option<usize> {
    let count = b
        .liveness
        .device_count
        .load(Ordering::Relaxed)
        .clamp(1, crate::control::MAX_DEVICES as u64) as usize;
    if let Some(uuid) = nvml_uuid(device) {
        if let Some(o) = (0..count).find(|&o| cuda_uuid(o).as_deref() == Some(uuid.as_str())) {
            return Some(o);
        }
        if let Some(o) = visible_ordinal(&uuid, std::env::var("CUDA_VISIBLE_DEVICES").ok()) {
            return Some(o);
        }
    }
    (nvml_device_count() == Some(1)).then_some(0)
}

/// The position of `uuid` in a `CUDA_VISIBLE_DEVICES` list of UUIDs (or UUID prefixes).
fn visible_ordinal(uuid: &str, visible: Option<String>) -> Option<usize> {
    visible?
        .split(',')
        .map(str::trim)
        .position(|item| item.starts_with("GPU-") && uuid.starts_with(item))
}

fn nvml_device_count() -> Option<c_uint> {
    let p = get(Nvml::DeviceCount);
    if p.is_null() {
        return None;
    }
    let mut n: c_uint = 0;
    // SAFETY: `p` is NVML's nvmlDeviceGetCount_v2(unsigned*), valid out-pointer.
    let r = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_uint) -> Ret>(p)(&mut n)
    };
    (r == NVML_SUCCESS).then_some(n)
}

fn nvml_uuid(device: *mut c_void) -> Option<String> {
    let p = get(Nvml::GetUUID);
    if p.is_null() {
        return None;
    }
    let mut buf = [0 as c_char; 96];
    // SAFETY: `p` is NVML's nvmlDeviceGetUUID(device, char*, unsigned); the buffer is 96 bytes
    // (NVML_DEVICE_UUID_V2_BUFFER_SIZE) and NUL-terminated by NVML on success.
    let r = unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> Ret,
        >(p)(device, buf.as_mut_ptr(), buf.len() as c_uint)
    };
    if r != NVML_SUCCESS {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (forced above).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

/// CUDA's UUID of ordinal `ordinal`, formatted as NVML formats UUIDs (`GPU-8-4-4-4-12`).
fn cuda_uuid(ordinal: usize) -> Option<String> {
    let get_dev = real::get(Sym::cuDeviceGet);
    let get_uuid = real::get(Sym::cuDeviceGetUuid);
    if get_dev.is_null() || get_uuid.is_null() {
        return None;
    }
    let mut dev: c_int = 0;
    let mut uuid = [0u8; 16];
    // SAFETY: cuDeviceGet(CUdevice*, int) and cuDeviceGetUuid(CUuuid*, CUdevice) with valid
    // out-pointers (CUuuid is 16 bytes).
    let ok = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int, c_int) -> c_int>(
            get_dev,
        )(&mut dev, c_int::try_from(ordinal).ok()?)
            == CUDA_SUCCESS
            && std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut u8, c_int) -> c_int>(
                get_uuid,
            )(uuid.as_mut_ptr(), dev)
                == CUDA_SUCCESS
    };
    ok.then(|| format_uuid(&uuid))
}

fn format_uuid(u: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// `(total, free, used)` the workload sees, from the real figures (`reserved`: v2's
/// driver-reserved part of the total).
fn clamp(real_total: u64, real_free: u64, reserved: u64, quota: u64, mine: u64) -> (u64, u64, u64) {
    let total = real_total.min(quota);
    let used = mine.min(total.saturating_sub(reserved));
    let free = real_free.min(total.saturating_sub(reserved).saturating_sub(used));
    (total, free, used)
}

/// # Safety
/// NVML API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *mut c_void, mem: *mut Memory) -> Ret {
    let p = get(Nvml::MemoryInfo);
    if p.is_null() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: forwarding the caller's arguments to NVML's own function.
    let r = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, *mut Memory) -> Ret>(p)(
            device, mem,
        )
    };
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    let shown = std::panic::catch_unwind(|| crate::real::reentrancy_guarded(|| view(device)));
    if let Ok(Some(Some((quota, mine)))) = shown {
        // SAFETY: NVML succeeded, so `mem` is a valid nvmlMemory_t it just wrote.
        let m = unsafe { &mut *mem };
        (m.total, m.free, m.used) = clamp(m.total, m.free, 0, quota, mine);
    }
    r
}

/// # Safety
/// NVML API contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    mem: *mut MemoryV2,
) -> Ret {
    let p = get(Nvml::MemoryInfoV2);
    if p.is_null() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: forwarding the caller's arguments to NVML's own function.
    let r = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, *mut MemoryV2) -> Ret>(
            p,
        )(device, mem)
    };
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    let shown = std::panic::catch_unwind(|| crate::real::reentrancy_guarded(|| view(device)));
    if let Ok(Some(Some((quota, mine)))) = shown {
        // SAFETY: NVML succeeded, so `mem` is a valid nvmlMemory_v2_t it just wrote.
        let m = unsafe { &mut *mem };
        (m.total, m.free, m.used) = clamp(m.total, m.free, m.reserved, quota, mine);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Per-process queries

/// The pids whose processes belong to this workload (its block's claimed slots), if a quota
/// is enforced; `None`: show NVML's answer unchanged.
fn own_pids() -> Option<Vec<c_uint>> {
    if state::mode() != ENFORCE {
        return None;
    }
    let b = state::block()?;
    let mut pids: Vec<c_uint> = b
        .processes
        .iter()
        .filter_map(|p| c_uint::try_from(p.pid.load(Ordering::Acquire)).ok())
        .filter(|pid| *pid != 0)
        .collect();
    pids.push(std::process::id());
    Some(pids)
}

type ProcessesFn<T> = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut T) -> Ret;

/// NVML's list for `device`, filtered to the workload's processes, returned under NVML's own
/// size protocol: `*count` in = the caller's capacity, out = the number of entries;
/// `NVML_ERROR_INSUFFICIENT_SIZE` when they do not fit.
///
/// # Safety
/// NVML's contract for the per-process queries; `f` is one of them, with records of type `T`.
unsafe fn filtered<T: HasPid>(
    f: *mut c_void,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut T,
) -> Ret {
    if f.is_null() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    // SAFETY: `f` is NVML's per-process query with records of type T.
    let query = unsafe { std::mem::transmute::<*mut c_void, ProcessesFn<T>>(f) };
    let own = std::panic::catch_unwind(|| crate::real::reentrancy_guarded(own_pids))
        .ok()
        .flatten()
        .flatten();
    let Some(own) = own else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { query(device, count, infos) };
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // Ask NVML into a buffer of our own (the caller's may fit our list but not NVML's), growing
    // it if processes appear between the size query and the fetch.
    let mut all: Vec<T> = Vec::new();
    let mut n: c_uint = 0;
    let mut r = NVML_ERROR_INSUFFICIENT_SIZE;
    for _ in 0..4 {
        n = c_uint::try_from(all.capacity()).unwrap_or(c_uint::MAX);
        // SAFETY: `all` has room for `n` records; NVML writes at most `n` and sets `n`.
        r = unsafe { query(device, &mut n, all.as_mut_ptr()) };
        if r != NVML_ERROR_INSUFFICIENT_SIZE {
            break;
        }
        all.reserve_exact(n as usize + 4);
    }
    if r != NVML_SUCCESS {
        return r;
    }
    // SAFETY: NVML initialised the first `n` records (n ≤ capacity on success).
    unsafe { all.set_len((n as usize).min(all.capacity())) };
    let mine: Vec<T> = all.into_iter().filter(|p| own.contains(&p.pid())).collect();
    // SAFETY: `count` is non-NULL (checked) and valid per the caller contract.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = mine.len() as c_uint };
    if mine.is_empty() {
        return NVML_SUCCESS;
    }
    if infos.is_null() || cap < mine.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `cap` ≥ mine.len() records.
    unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), infos, mine.len()) };
    NVML_SUCCESS
}

macro_rules! process_query {
    ($name:ident, $which:ident, $record:ty) => {
        /// The workload's own processes only (see the module docs).
        ///
        /// # Safety
        /// NVML API contract.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: *mut c_void,
            count: *mut c_uint,
            infos: *mut $record,
        ) -> Ret {
            // SAFETY: forwarding the caller's arguments under NVML's contract.
            unsafe { filtered(get(Nvml::$which), device, count, infos) }
        }
    };
}

process_query!(
    nvmlDeviceGetComputeRunningProcesses,
    Processes,
    ProcessInfoV1
);
process_query!(
    nvmlDeviceGetComputeRunningProcesses_v2,
    ProcessesV2,
    ProcessInfo
);
process_query!(
    nvmlDeviceGetComputeRunningProcesses_v3,
    ProcessesV3,
    ProcessInfo
);
process_query!(
    nvmlDeviceGetMPSComputeRunningProcesses,
    MpsProcesses,
    ProcessInfoV1
);
process_query!(
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    MpsProcessesV2,
    ProcessInfo
);
process_query!(
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
    MpsProcessesV3,
    ProcessInfo
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_name_gpus_by_uuid_or_prefix() {
        let uuid = "GPU-12345678-9abc-def0-0123-456789abcdef";
        let list = |s: &str| Some(s.to_string());
        assert_eq!(visible_ordinal(uuid, list("GPU-aaaa,GPU-1234")), Some(1));
        assert_eq!(visible_ordinal(uuid, list(uuid)), Some(0));
        assert_eq!(
            visible_ordinal(uuid, list("0,1")),
            None,
            "indices cannot be matched"
        );
        assert_eq!(visible_ordinal(uuid, None), None);
    }

    #[test]
    fn uuids_are_formatted_like_nvml() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0123-456789abcdef");
    }

    #[test]
    fn the_view_is_the_quota_and_the_workloads_own_use() {
        const GIB: u64 = 1 << 30;
        // 80 GiB GPU, 50 GiB free; quota 20 GiB, the workload holds 5.
        assert_eq!(
            clamp(80 * GIB, 50 * GIB, 0, 20 * GIB, 5 * GIB),
            (20 * GIB, 15 * GIB, 5 * GIB)
        );
        // Others filled the GPU: free is never more than physically free.
        assert_eq!(clamp(80 * GIB, GIB, 0, 20 * GIB, 5 * GIB).1, GIB);
        // v2: the driver's reserve is part of the total.
        assert_eq!(
            clamp(80 * GIB, 50 * GIB, GIB, 20 * GIB, 5 * GIB).1,
            14 * GIB
        );
        // A quota above the physical memory shows the physical memory.
        assert_eq!(clamp(16 * GIB, 16 * GIB, 0, 20 * GIB, 0).0, 16 * GIB);
    }
}
