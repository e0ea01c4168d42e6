//! A fake `libnvidia-ml.so.1` for machines without a GPU.
//!
//! It implements the NVML C ABI for the calls `arbiter-node` makes through `nvml-wrapper`
//! (plus what `Nvml::init` and `Drop` need), answering from a **scenario file**: a JSON
//! document with a time series of utilization, clocks, memory, throttle reasons and processes
//! per GPU, read at `nvmlInit_v2` from `$FAKE_NVML_SCENARIO`, or else from `fake-nvml.json`
//! next to the library file itself. The second form lets each test copy the library into its
//! own directory with its own scenario: separate files are separate `dlopen` instances with
//! separate state, and no test has to change the process environment.
//!
//! ```json
//! { "driver_version": "550.54.15", "time_file": "/tmp/t", "call_log": "/tmp/calls",
//!   "gpus": [ { "name": "Fake H100", "uuid": "GPU-0000", "memory_total_mib": 81920,
//!               "max_sm_clock_mhz": 1980,
//!               "timeline": [ { "t": 0, "utilization_pct": 35, "sm_clock_mhz": 1755,
//!                               "throttle_reasons": 4,
//!                               "processes": [ { "pid": 42, "used_mib": 1024,
//!                                                "sm_util_pct": 30, "mps": false } ] } ] } ] }
//! ```
//!
//! Time: with `time_file`, the scenario time (seconds) is the number in that file (a test
//! writes it, so the series advances deterministically — a step counter is just integer
//! `t`s); without it, the seconds since the first `nvmlInit`. The frame in effect is the
//! last one whose `t` is not after the scenario time (a step function).
//!
//! With `"call_log": "<path>"` every call is appended to that file (one symbol name per
//! line), so tests can check which entry points the wrapper called.
//!
//! Events: a frame's `xid` list raises one `nvmlEventTypeXidCriticalError` per entry, when the
//! frame comes into effect, on every event set the GPU was registered on before then
//! (`nvmlEventSetWait_v2` delivers them in order). `power_mw` and `temperature_c` answer
//! `nvmlDeviceGetPowerUsage` and `nvmlDeviceGetTemperature` (left out: `NOT_SUPPORTED`).
//!
//! Exported symbols: see [`SYMBOLS`].

use serde::Deserialize;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

/// Every NVML entry point this library exports.
pub const SYMBOLS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
];

type Ret = c_uint;
const SUCCESS: Ret = 0;
const ERROR_UNINITIALIZED: Ret = 1;
const ERROR_INVALID_ARGUMENT: Ret = 2;
const ERROR_NOT_SUPPORTED: Ret = 3;
const ERROR_NOT_FOUND: Ret = 6;
const ERROR_INSUFFICIENT_SIZE: Ret = 7;
const ERROR_TIMEOUT: Ret = 10;
const ERROR_GPU_IS_LOST: Ret = 15;
const ERROR_UNKNOWN: Ret = 999;

const CLOCK_GRAPHICS: c_uint = 0;
const CLOCK_SM: c_uint = 1;
const CLOCK_MEM: c_uint = 2;
const CLOCK_VIDEO: c_uint = 3;

const MIB: u64 = 1 << 20;

/// `nvmlEventTypeXidCriticalError`: the only event type the fake delivers.
const EVENT_XID_CRITICAL_ERROR: c_ulonglong = 0x8;
/// `NVML_TEMPERATURE_GPU`.
const TEMPERATURE_GPU: c_uint = 0;

// ---------------------------------------------------------------------------------------------
// Scenario

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[serde(default = "default_driver")]
    driver_version: String,
    #[serde(default = "default_nvml_version")]
    nvml_version: String,
    #[serde(default = "default_cuda_version")]
    cuda_driver_version: c_int,
    #[serde(default)]
    time_file: Option<PathBuf>,
    #[serde(default)]
    call_log: Option<PathBuf>,
    gpus: Vec<Gpu>,
}

fn default_driver() -> String {
    "550.54.15".into()
}
fn default_nvml_version() -> String {
    "12.550.54.15".into()
}
fn default_cuda_version() -> c_int {
    12040
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Gpu {
    name: String,
    uuid: String,
    memory_total_mib: u64,
    #[serde(default = "default_max_sm")]
    max_sm_clock_mhz: u32,
    #[serde(default = "default_max_mem")]
    max_mem_clock_mhz: u32,
    /// 0 default, 1 exclusive thread, 2 prohibited, 3 exclusive process.
    #[serde(default)]
    compute_mode: u32,
    timeline: Vec<Frame>,
}

fn default_max_sm() -> u32 {
    1980
}
fn default_max_mem() -> u32 {
    2619
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Frame {
    t: f64,
    #[serde(default)]
    utilization_pct: u32,
    #[serde(default)]
    memory_util_pct: u32,
    /// Defaults to the sum of the processes' `used_mib`.
    #[serde(default)]
    memory_used_mib: Option<u64>,
    /// Defaults to the GPU's maximum.
    #[serde(default)]
    sm_clock_mhz: Option<u32>,
    #[serde(default)]
    throttle_reasons: u64,
    /// The GPU fell off the bus: every device query returns `NVML_ERROR_GPU_IS_LOST`.
    #[serde(default)]
    lost: bool,
    /// Board power draw, milliwatts (`None`: not supported, as on some boards).
    #[serde(default)]
    power_mw: Option<u32>,
    /// Core temperature, °C (`None`: not supported).
    #[serde(default)]
    temperature_c: Option<u32>,
    /// XID errors raised when this frame comes into effect: each is one
    /// `nvmlEventTypeXidCriticalError` event for every event set registered on the GPU
    /// before then (e.g. `[31]`, an MMU fault in a client; `[79]`, fell off the bus).
    #[serde(default)]
    xid: Vec<u64>,
    #[serde(default)]
    processes: Vec<Process>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Process {
    pid: u32,
    #[serde(default)]
    used_mib: u64,
    #[serde(default)]
    sm_util_pct: u32,
    #[serde(default)]
    mem_util_pct: u32,
    /// Listed by `nvmlDeviceGetMPSComputeRunningProcesses` instead of the compute list.
    #[serde(default)]
    mps: bool,
}

struct Fake {
    scenario: Scenario,
    refcount: u32,
    started: Instant,
    compute_modes: Vec<u32>,
    /// Event sets by handle (`id + 1`); a freed set is `None`.
    event_sets: Vec<Option<EventSet>>,
}

/// One `nvmlEventSet_t`: the GPUs registered on it, how far each GPU's timeline has been
/// delivered, and the events raised but not yet waited for.
#[derive(Default)]
struct EventSet {
    /// (GPU, index of the first frame whose XIDs are not yet queued).
    cursors: Vec<(usize, usize)>,
    pending: std::collections::VecDeque<(usize, u64)>,
}

static STATE: Mutex<Option<Fake>> = Mutex::new(None);

impl Fake {
    fn now_s(&self) -> f64 {
        match &self.scenario.time_file {
            Some(p) => std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0.0),
            None => self.started.elapsed().as_secs_f64(),
        }
    }

    fn frame(&self, gpu: usize) -> Option<&Frame> {
        let tl = &self.scenario.gpus.get(gpu)?.timeline;
        tl.get(self.frame_index(gpu)?)
    }

    /// Index of the frame in effect on `gpu`'s timeline.
    fn frame_index(&self, gpu: usize) -> Option<usize> {
        let now = self.now_s();
        let tl = &self.scenario.gpus.get(gpu)?.timeline;
        Some(tl.iter().rposition(|f| f.t <= now).unwrap_or(0))
    }

    /// Queues on `set` the XIDs of the frames that came into effect since the last look.
    fn raise_events(&mut self, set: usize) {
        let Some(Some(es)) = self.event_sets.get(set) else {
            return;
        };
        let mut cursors = es.cursors.clone();
        let mut raised = Vec::new();
        for (gpu, next) in &mut cursors {
            let Some(current) = self.frame_index(*gpu) else {
                continue;
            };
            let tl = &self.scenario.gpus[*gpu].timeline;
            for frame in tl.iter().take(current + 1).skip(*next) {
                raised.extend(frame.xid.iter().map(|&x| (*gpu, x)));
            }
            *next = (*next).max(current + 1);
        }
        if let Some(Some(es)) = self.event_sets.get_mut(set) {
            es.cursors = cursors;
            es.pending.extend(raised);
        }
    }

    /// Process-utilization timestamp of the current frame (µs, never 0).
    fn sample_ts(&self) -> u64 {
        (self.now_s().max(0.0) * 1e6) as u64 + 1
    }
}

fn trace(fake: &Fake, name: &str) {
    if let Some(p) = &fake.scenario.call_log
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
    {
        let _ = writeln!(f, "{name}");
    }
}

/// Runs an entry point body with the state locked; panics become `NVML_ERROR_UNKNOWN`.
fn with_state(name: &str, f: impl FnOnce(&mut Fake) -> Ret) -> Ret {
    catch_unwind(AssertUnwindSafe(|| {
        let mut guard = match STATE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match guard.as_mut() {
            Some(fake) => {
                trace(fake, name);
                f(fake)
            }
            None => ERROR_UNINITIALIZED,
        }
    }))
    .unwrap_or(ERROR_UNKNOWN)
}

/// Like [`with_state`] for a device query: decodes the handle and fails for a lost GPU.
fn with_device(name: &str, device: *mut c_void, f: impl FnOnce(&mut Fake, usize) -> Ret) -> Ret {
    with_state(name, |fake| {
        let Some(idx) = (device as usize).checked_sub(1) else {
            return ERROR_INVALID_ARGUMENT;
        };
        if idx >= fake.scenario.gpus.len() {
            return ERROR_INVALID_ARGUMENT;
        }
        if fake.frame(idx).is_some_and(|fr| fr.lost) {
            return ERROR_GPU_IS_LOST;
        }
        f(fake, idx)
    })
}

/// Device handles are opaque to callers: we hand out `index + 1` and never dereference it.
fn handle(idx: usize) -> *mut c_void {
    (idx + 1) as *mut c_void
}

/// The directory this library was loaded from.
fn own_dir() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `Dl_info` is a plain C struct for which all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nvmlInit_v2 as unsafe extern "C" fn() -> Ret as *const c_void;
    // SAFETY: `addr` is a code address inside this library and `info` is writable.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a non-NULL, NUL-terminated path owned by the dynamic loader,
    // valid while the library is loaded (it is: we are running its code).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.parent().map(std::path::Path::to_path_buf)
}

fn load() -> Result<Scenario, String> {
    let path = match std::env::var_os("FAKE_NVML_SCENARIO") {
        Some(p) => PathBuf::from(p),
        None => own_dir()
            .map(|d| d.join("fake-nvml.json"))
            .ok_or_else(|| "FAKE_NVML_SCENARIO is not set and dladdr failed".to_string())?,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", PathBuf::from(&path).display()))?;
    let s: Scenario = serde_json::from_str(&text)
        .map_err(|e| format!("{}: {e}", PathBuf::from(&path).display()))?;
    for g in &s.gpus {
        if g.timeline.is_empty() {
            return Err(format!("gpu {}: empty timeline", g.uuid));
        }
    }
    Ok(s)
}

fn init(name: &str) -> Ret {
    catch_unwind(|| {
        let mut guard = match STATE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(fake) = guard.as_mut() {
            fake.refcount += 1;
            trace(fake, name);
            return SUCCESS;
        }
        match load() {
            Ok(scenario) => {
                let compute_modes = scenario.gpus.iter().map(|g| g.compute_mode).collect();
                let fake = Fake {
                    scenario,
                    refcount: 1,
                    started: Instant::now(),
                    compute_modes,
                    event_sets: Vec::new(),
                };
                trace(&fake, name);
                *guard = Some(fake);
                SUCCESS
            }
            Err(e) => {
                eprintln!("fake-nvml: {e}");
                ERROR_UNKNOWN
            }
        }
    })
    .unwrap_or(ERROR_UNKNOWN)
}

/// Copies `s` NUL-terminated into `buf` of `len` bytes.
///
/// # Safety
/// `buf` must be NULL or valid for `len` bytes of writes.
unsafe fn copy_str(s: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller guarantees `len` writable bytes at `buf`; we write `bytes.len() + 1`
    // ≤ `len` of them, and `bytes` cannot overlap a buffer the caller owns.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

/// Writes `value` through `out` (NULL → invalid argument).
///
/// # Safety
/// `out` must be NULL or valid for one write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Ret {
    if out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-NULL and, per the caller, valid for a write of `T`.
    unsafe { out.write(value) };
    SUCCESS
}

// ---------------------------------------------------------------------------------------------
// C structs (layouts of nvml.h as bound by nvml-wrapper-sys 0.10)

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
pub struct MemoryV1 {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessInfo_t` (v2 layout, used by the `_v2` and `_v3` process queries).
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    device: *mut c_void,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[repr(C)]
pub struct ProcessUtilizationSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

// ---------------------------------------------------------------------------------------------
// Exported entry points

/// # Safety
/// Callable from C at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    init("nvmlInit_v2")
}

/// # Safety
/// Callable from C at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init("nvmlInitWithFlags")
}

/// # Safety
/// Callable from C at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    let mut guard = match STATE.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    match guard.as_mut() {
        None => ERROR_UNINITIALIZED,
        Some(fake) => {
            trace(fake, "nvmlShutdown");
            fake.refcount -= 1;
            if fake.refcount == 0 {
                *guard = None;
            }
            SUCCESS
        }
    }
}

/// # Safety
/// Callable from C at any time; returns a static string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"Success",
        ERROR_UNINITIALIZED => c"Uninitialized",
        ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ERROR_NOT_FOUND => c"Not Found",
        ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_state("nvmlSystemGetDriverVersion", |f| {
        // SAFETY: forwarded caller contract.
        unsafe { copy_str(&f.scenario.driver_version, version, length) }
    })
}

/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_state("nvmlSystemGetNVMLVersion", |f| {
        // SAFETY: forwarded caller contract.
        unsafe { copy_str(&f.scenario.nvml_version, version, length) }
    })
}

/// # Safety
/// `v` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> Ret {
    with_state("nvmlSystemGetCudaDriverVersion", |f| {
        // SAFETY: forwarded caller contract.
        unsafe { put(v, f.scenario.cuda_driver_version) }
    })
}

/// # Safety
/// `v` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> Ret {
    with_state("nvmlSystemGetCudaDriverVersion_v2", |f| {
        // SAFETY: forwarded caller contract.
        unsafe { put(v, f.scenario.cuda_driver_version) }
    })
}

/// # Safety
/// `count` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    with_state("nvmlDeviceGetCount_v2", |f| {
        // SAFETY: forwarded caller contract.
        unsafe { put(count, f.scenario.gpus.len() as c_uint) }
    })
}

/// # Safety
/// `device` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *mut c_void,
) -> Ret {
    with_state("nvmlDeviceGetHandleByIndex_v2", |f| {
        if index as usize >= f.scenario.gpus.len() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle(index as usize)) }
    })
}

/// # Safety
/// `uuid` must be a NUL-terminated string; `device` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut *mut c_void,
) -> Ret {
    with_state("nvmlDeviceGetHandleByUUID", |f| {
        if uuid.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL and NUL-terminated per the caller contract.
        let want = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
        match f.scenario.gpus.iter().position(|g| g.uuid == want) {
            // SAFETY: forwarded caller contract.
            Some(i) => unsafe { put(device, handle(i)) },
            None => ERROR_NOT_FOUND,
        }
    })
}

/// # Safety
/// `index` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *mut c_void, index: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetIndex", device, |_, i| {
        // SAFETY: forwarded caller contract.
        unsafe { put(index, i as c_uint) }
    })
}

/// # Safety
/// `name` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *mut c_void,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    with_device("nvmlDeviceGetName", device, |f, i| {
        // SAFETY: forwarded caller contract.
        unsafe { copy_str(&f.scenario.gpus[i].name, name, length) }
    })
}

/// # Safety
/// `uuid` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *mut c_void,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    with_device("nvmlDeviceGetUUID", device, |f, i| {
        // SAFETY: forwarded caller contract.
        unsafe { copy_str(&f.scenario.gpus[i].uuid, uuid, length) }
    })
}

/// # Safety
/// `util` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: *mut c_void,
    util: *mut Utilization,
) -> Ret {
    with_device("nvmlDeviceGetUtilizationRates", device, |f, i| {
        let fr = f.frame(i).map_or((0, 0), |fr| {
            (fr.utilization_pct.min(100), fr.memory_util_pct.min(100))
        });
        // SAFETY: forwarded caller contract.
        unsafe {
            put(
                util,
                Utilization {
                    gpu: fr.0,
                    memory: fr.1,
                },
            )
        }
    })
}

fn memory(f: &Fake, i: usize) -> (u64, u64) {
    let total = f.scenario.gpus[i].memory_total_mib * MIB;
    let used = f.frame(i).map_or(0, |fr| {
        fr.memory_used_mib
            .unwrap_or_else(|| fr.processes.iter().map(|p| p.used_mib).sum())
            * MIB
    });
    (total, used.min(total))
}

/// # Safety
/// `mem` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *mut c_void, mem: *mut MemoryV1) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo", device, |f, i| {
        let (total, used) = memory(f, i);
        // SAFETY: forwarded caller contract.
        unsafe {
            put(
                mem,
                MemoryV1 {
                    total,
                    free: total - used,
                    used,
                },
            )
        }
    })
}

/// # Safety
/// `mem` must be NULL or valid for a read and a write of an `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    mem: *mut MemoryV2,
) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo_v2", device, |f, i| {
        if mem.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL and valid for reads per the caller contract.
        let version = unsafe { (*mem).version };
        // NVML_STRUCT_VERSION(Memory, 2): size | 2 << 24. Reject other versions like NVML.
        if version != (std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24)) {
            return 25; // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        }
        let (total, used) = memory(f, i);
        // SAFETY: forwarded caller contract.
        unsafe {
            put(
                mem,
                MemoryV2 {
                    version,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                },
            )
        }
    })
}

fn clock(f: &Fake, i: usize, kind: c_uint, max: bool) -> Option<c_uint> {
    let g = &f.scenario.gpus[i];
    match kind {
        CLOCK_GRAPHICS | CLOCK_SM => Some(if max {
            g.max_sm_clock_mhz
        } else {
            f.frame(i)
                .and_then(|fr| fr.sm_clock_mhz)
                .unwrap_or(g.max_sm_clock_mhz)
        }),
        CLOCK_MEM => Some(g.max_mem_clock_mhz),
        CLOCK_VIDEO => Some(g.max_sm_clock_mhz * 9 / 10),
        _ => None,
    }
}

/// # Safety
/// `mhz` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: *mut c_void,
    kind: c_uint,
    mhz: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetClockInfo", device, |f, i| {
        match clock(f, i, kind, false) {
            // SAFETY: forwarded caller contract.
            Some(v) => unsafe { put(mhz, v) },
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

/// # Safety
/// `mhz` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: *mut c_void,
    kind: c_uint,
    mhz: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetMaxClockInfo", device, |f, i| {
        match clock(f, i, kind, true) {
            // SAFETY: forwarded caller contract.
            Some(v) => unsafe { put(mhz, v) },
            None => ERROR_INVALID_ARGUMENT,
        }
    })
}

fn throttle(name: &str, device: *mut c_void, out: *mut c_ulonglong) -> Ret {
    with_device(name, device, |f, i| {
        let r = f.frame(i).map_or(0, |fr| fr.throttle_reasons);
        // SAFETY: forwarded caller contract (see the exported functions).
        unsafe { put(out, r) }
    })
}

/// # Safety
/// `reasons` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: *mut c_void,
    reasons: *mut c_ulonglong,
) -> Ret {
    throttle("nvmlDeviceGetCurrentClocksThrottleReasons", device, reasons)
}

/// # Safety
/// `reasons` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: *mut c_void,
    reasons: *mut c_ulonglong,
) -> Ret {
    throttle("nvmlDeviceGetCurrentClocksEventReasons", device, reasons)
}

/// Shared body of the process-list queries (NVML's two-call protocol: a call with too small a
/// buffer reports the count and `NVML_ERROR_INSUFFICIENT_SIZE`).
fn processes(
    name: &str,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
    mps: bool,
) -> Ret {
    with_device(name, device, |f, i| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let list: Vec<Process> = f
            .frame(i)
            .map(|fr| {
                fr.processes
                    .iter()
                    .filter(|p| p.mps == mps)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        // SAFETY: `count` is non-NULL and valid for reads and writes per the caller contract.
        let cap = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if list.is_empty() {
            return SUCCESS;
        }
        if infos.is_null() || cap < list.len() {
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (k, p) in list.iter().enumerate() {
            // SAFETY: `infos` holds `cap` ≥ `list.len()` elements per the caller contract.
            unsafe {
                infos.add(k).write(ProcessInfo {
                    pid: p.pid,
                    used_gpu_memory: p.used_mib * MIB,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                })
            };
        }
        SUCCESS
    })
}

/// # Safety
/// `count` must be valid for read/write; `infos` NULL or valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    processes(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        count,
        infos,
        false,
    )
}

/// # Safety
/// `count` must be valid for read/write; `infos` NULL or valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    processes(
        "nvmlDeviceGetComputeRunningProcesses_v2",
        device,
        count,
        infos,
        false,
    )
}

/// # Safety
/// `count` must be valid for read/write; `infos` NULL or valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    processes(
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        device,
        count,
        infos,
        true,
    )
}

/// # Safety
/// `count` must be valid for read/write; `infos` NULL or valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    processes(
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        device,
        count,
        infos,
        true,
    )
}

/// Samples newer than `last_seen` (µs); `NVML_ERROR_NOT_FOUND` when there are none, like NVML.
///
/// # Safety
/// `count` must be valid for read/write; `samples` NULL or valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: *mut c_void,
    samples: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> Ret {
    with_device("nvmlDeviceGetProcessUtilization", device, |f, i| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let ts = f.sample_ts();
        let list: Vec<Process> = if ts > last_seen {
            f.frame(i)
                .map(|fr| fr.processes.clone())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if list.is_empty() {
            // SAFETY: `count` is non-NULL and valid for writes per the caller contract.
            unsafe { *count = 0 };
            return ERROR_NOT_FOUND;
        }
        // SAFETY: as above, valid for reads and writes.
        let cap = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if samples.is_null() || cap < list.len() {
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (k, p) in list.iter().enumerate() {
            // SAFETY: `samples` holds `cap` ≥ `list.len()` elements per the caller contract.
            unsafe {
                samples.add(k).write(ProcessUtilizationSample {
                    pid: p.pid,
                    time_stamp: ts,
                    sm_util: p.sm_util_pct.min(100),
                    mem_util: p.mem_util_pct.min(100),
                    enc_util: 0,
                    dec_util: 0,
                })
            };
        }
        SUCCESS
    })
}

/// # Safety
/// `mode` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: *mut c_void, mode: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetComputeMode", device, |f, i| {
        // SAFETY: forwarded caller contract.
        unsafe { put(mode, f.compute_modes[i]) }
    })
}

/// # Safety
/// Callable from C at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(device: *mut c_void, mode: c_uint) -> Ret {
    with_device("nvmlDeviceSetComputeMode", device, |f, i| {
        if mode > 3 {
            return ERROR_INVALID_ARGUMENT;
        }
        f.compute_modes[i] = mode;
        SUCCESS
    })
}

/// # Safety
/// `mw` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: *mut c_void, mw: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetPowerUsage", device, |f, i| {
        match f.frame(i).and_then(|fr| fr.power_mw) {
            // SAFETY: forwarded caller contract.
            Some(v) => unsafe { put(mw, v) },
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

/// # Safety
/// `temp` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: *mut c_void,
    sensor: c_uint,
    temp: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetTemperature", device, |f, i| {
        if sensor != TEMPERATURE_GPU {
            return ERROR_INVALID_ARGUMENT;
        }
        match f.frame(i).and_then(|fr| fr.temperature_c) {
            // SAFETY: forwarded caller contract.
            Some(v) => unsafe { put(temp, v) },
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

/// # Safety
/// `types` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: *mut c_void,
    types: *mut c_ulonglong,
) -> Ret {
    with_device("nvmlDeviceGetSupportedEventTypes", device, |_, _| {
        // SAFETY: forwarded caller contract.
        unsafe { put(types, EVENT_XID_CRITICAL_ERROR) }
    })
}

/// # Safety
/// `set` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> Ret {
    with_state("nvmlEventSetCreate", |f| {
        f.event_sets.push(Some(EventSet::default()));
        // Set handles are `id + 1`, opaque to callers and never dereferenced.
        let handle = f.event_sets.len() as *mut c_void;
        // SAFETY: forwarded caller contract.
        unsafe { put(set, handle) }
    })
}

fn event_set_id(f: &Fake, set: *mut c_void) -> Option<usize> {
    let id = (set as usize).checked_sub(1)?;
    f.event_sets.get(id)?.as_ref().map(|_| id)
}

/// Registers XID events (the only kind the fake raises) of `device` on `set`; events of
/// frames already in effect are not raised (NVML delivers only what happens after).
///
/// # Safety
/// Callable from C at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: *mut c_void,
    types: c_ulonglong,
    set: *mut c_void,
) -> Ret {
    with_device("nvmlDeviceRegisterEvents", device, |f, i| {
        if types & !EVENT_XID_CRITICAL_ERROR != 0 {
            return ERROR_NOT_SUPPORTED;
        }
        let Some(id) = event_set_id(f, set) else {
            return ERROR_INVALID_ARGUMENT;
        };
        let next = f.frame_index(i).map_or(0, |c| c + 1);
        if let Some(Some(es)) = f.event_sets.get_mut(id)
            && types != 0
            && !es.cursors.iter().any(|(g, _)| *g == i)
        {
            es.cursors.push((i, next));
        }
        SUCCESS
    })
}

/// Waits up to `timeout_ms` for the next XID event on `set` (`NVML_ERROR_TIMEOUT` if none).
/// The state is not locked while waiting, so the other entry points keep answering.
///
/// # Safety
/// `data` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut c_void,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> Ret {
    let deadline = Instant::now() + std::time::Duration::from_millis(u64::from(timeout_ms));
    loop {
        let mut found = None;
        let ret = with_state("nvmlEventSetWait_v2", |f| {
            let Some(id) = event_set_id(f, set) else {
                return ERROR_INVALID_ARGUMENT;
            };
            f.raise_events(id);
            found = f
                .event_sets
                .get_mut(id)
                .and_then(Option::as_mut)
                .and_then(|es| es.pending.pop_front());
            SUCCESS
        });
        if ret != SUCCESS {
            return ret;
        }
        if let Some((gpu, xid)) = found {
            let event = EventData {
                device: handle(gpu),
                event_type: EVENT_XID_CRITICAL_ERROR,
                event_data: xid,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            };
            // SAFETY: forwarded caller contract.
            return unsafe { put(data, event) };
        }
        let now = Instant::now();
        if now >= deadline {
            return ERROR_TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(std::time::Duration::from_millis(10)));
    }
}

/// # Safety
/// Callable from C at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut c_void) -> Ret {
    with_state("nvmlEventSetFree", |f| match event_set_id(f, set) {
        Some(id) => {
            f.event_sets[id] = None;
            SUCCESS
        }
        None => ERROR_INVALID_ARGUMENT,
    })
}
