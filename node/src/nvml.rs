//! [`GpuBackend`] over NVML, through `nvml-wrapper`.
//!
//! `nvml-wrapper` 0.13 loads the library with `libloading` and resolves **every** binding at
//! load time, each into a `Result`: a missing symbol does not fail `Nvml::init`, only the call
//! that needs it (`NvmlError::FailedToLoadSymbol`). `init` itself calls `nvmlInit_v2`, then
//! `nvmlSystemGetDriverVersion` (to pick the field-id scheme; a failure is tolerated), and
//! `Drop` calls `nvmlShutdown` unconditionally (it panics if that symbol is missing).
//!
//! Symbols this backend calls: `nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`,
//! `nvmlDeviceGetName`, `nvmlDeviceGetUUID`, `nvmlDeviceGetMemoryInfo_v2`,
//! `nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetClockInfo`, `nvmlDeviceGetMaxClockInfo`,
//! `nvmlDeviceGetCurrentClocksThrottleReasons`, `nvmlDeviceGetComputeRunningProcesses_v3`,
//! `nvmlDeviceGetMPSComputeRunningProcesses_v3`, `nvmlDeviceGetProcessUtilization`,
//! `nvmlDeviceGetComputeMode`, `nvmlDeviceSetComputeMode`, `nvmlDeviceGetPowerUsage`,
//! `nvmlDeviceGetTemperature`; for XID errors `nvmlEventSetCreate`,
//! `nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`, `nvmlDeviceGetIndex`, `nvmlEventSetFree`.
//!
//! **XID errors** reach NVML users only as events (`nvmlEventTypeXidCriticalError`; no
//! counter can be read), so the backend starts one watcher thread that registers every GPU
//! on one event set and waits on it, counting each GPU's XIDs; [`GpuSample::xid_errors`] is
//! that count. Where events cannot be registered (old drivers, no permission, a vGPU) the
//! count stays 0, which the contract reads as "unknown", and the reason is logged once.
//!
//! `Device<'nvml>` borrows the `Nvml` handle, so the backend keeps the handle and looks the
//! device up by index on every call (a cheap table lookup in NVML).

use crate::gpu::{
    ComputeMode, DeviceInfo, GpuBackend, GpuError, GpuProcess, GpuSample, ProcessKind,
};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode as NvmlComputeMode, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// How long the XID watcher waits for an event before it checks whether to stop.
const XID_WAIT_MS: u32 = 200;
/// How long opening the backend waits for the watcher to register the GPUs.
const XID_REGISTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// NVML-backed GPU backend.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    lib_path: Option<PathBuf>,
    /// Per GPU, the newest process-utilization timestamp seen (µs), so each sample returns
    /// only the period since the previous one.
    last_seen_us: Mutex<HashMap<u32, u64>>,
    xid: XidWatch,
}

/// The XID watcher thread and what it counted.
struct XidWatch {
    counts: Arc<Mutex<HashMap<u32, u32>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl XidWatch {
    /// Registers every GPU for XID events and starts counting them.
    fn start(nvml: &Arc<Nvml>) -> XidWatch {
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, c, s) = (Arc::clone(nvml), Arc::clone(&counts), Arc::clone(&stop));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || watch_xids(&n, &c, &s, &ready_tx))
            .map_err(|e| tracing::warn!(error = %e, "cannot start the XID watcher"))
            .ok();
        // Errors from the first sample on are counted: wait until the GPUs are registered
        // (or the watcher gave up), a few NVML calls.
        if thread.is_some() && ready_rx.recv_timeout(XID_REGISTER_TIMEOUT).is_err() {
            tracing::warn!("the XID watcher is slow to register; early errors may be missed");
        }
        XidWatch {
            counts,
            stop,
            thread,
        }
    }

    fn count(&self, index: u32) -> u32 {
        self.counts.lock().get(&index).copied().unwrap_or(0)
    }
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::warn!("the XID watcher panicked");
        }
    }
}

/// Tells [`XidWatch::start`] the watcher is past registration when dropped.
struct ReadyOnDrop<'a>(&'a std::sync::mpsc::Sender<()>);

impl Drop for ReadyOnDrop<'_> {
    fn drop(&mut self) {
        // The receiver may have timed out already; nothing to tell then.
        let _ = self.0.send(());
    }
}

/// The watcher thread's body: one event set over every GPU that takes XID events.
fn watch_xids(
    nvml: &Nvml,
    counts: &Mutex<HashMap<u32, u32>>,
    stop: &AtomicBool,
    ready: &std::sync::mpsc::Sender<()>,
) {
    // Whatever happens below, opening the backend stops waiting when this returns or waits.
    let _ready = ReadyOnDrop(ready);
    let mut set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(e) => {
            tracing::info!(error = %e, "XID errors are not watched (no NVML event sets)");
            return;
        }
    };
    let count = nvml.device_count().unwrap_or(0);
    let mut registered = 0;
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                tracing::info!(gpu = index, error = %e, "XID errors of this GPU are not watched");
                continue;
            }
        };
        // `register_events` consumes the set and frees it on failure: start a new one then.
        set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(set) => {
                registered += 1;
                set
            }
            Err(e) => {
                tracing::info!(gpu = index, error = %e.error, "XID errors of this GPU are not watched");
                match nvml.create_event_set() {
                    Ok(set) => set,
                    Err(_) => return,
                }
            }
        };
    }
    if registered == 0 {
        return;
    }
    tracing::debug!(gpus = registered, "watching XID errors");
    drop(_ready);
    while !stop.load(Ordering::Relaxed) {
        match set.wait(XID_WAIT_MS) {
            Ok(event) => {
                let xid = event.event_data;
                match event.device.index() {
                    Ok(index) => {
                        tracing::warn!(gpu = index, ?xid, "XID error");
                        *counts.lock().entry(index).or_insert(0) += 1;
                    }
                    Err(e) => tracing::warn!(?xid, error = %e, "XID error on an unknown GPU"),
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "XID watcher stopped");
                return;
            }
        }
    }
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("lib_path", &self.lib_path)
            .finish_non_exhaustive()
    }
}

fn map_err(index: u32, e: NvmlError) -> GpuError {
    match e {
        NvmlError::GpuLost => GpuError::Lost(index),
        NvmlError::InvalidArg => GpuError::NoSuchGpu(index),
        other => GpuError::Nvml(other.to_string()),
    }
}

impl NvmlBackend {
    /// Load the system's `libnvidia-ml.so.1` (`lib_path = None`) or the library at
    /// `lib_path` (the fake in tests) and initialise NVML.
    pub fn open(lib_path: Option<&Path>) -> Result<NvmlBackend, GpuError> {
        let nvml = match lib_path {
            Some(p) => Nvml::builder().lib_path(OsStr::new(p.as_os_str())).init(),
            None => Nvml::init(),
        }
        .map_err(|e| {
            GpuError::Nvml(format!(
                "init ({}): {e}",
                lib_path.map_or("libnvidia-ml.so.1".into(), |p| p.display().to_string())
            ))
        })?;
        let nvml = Arc::new(nvml);
        let backend = NvmlBackend {
            xid: XidWatch::start(&nvml),
            nvml,
            lib_path: lib_path.map(Path::to_path_buf),
            last_seen_us: Mutex::new(HashMap::new()),
        };
        tracing::info!(
            lib = ?backend.lib_path,
            driver = backend.driver_version().as_deref().unwrap_or("?"),
            "NVML initialised"
        );
        Ok(backend)
    }

    /// The driver version string (`nvmlSystemGetDriverVersion`).
    pub fn driver_version(&self) -> Result<String, GpuError> {
        self.nvml
            .sys_driver_version()
            .map_err(|e| GpuError::Nvml(e.to_string()))
    }

    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, GpuError> {
        self.nvml
            .device_by_index(index)
            .map_err(|e| map_err(index, e))
    }

    fn processes(
        &self,
        index: u32,
        dev: &nvml_wrapper::Device<'_>,
    ) -> Result<Vec<GpuProcess>, GpuError> {
        let used = |m: UsedGpuMemory| match m {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        };
        let mut out: Vec<GpuProcess> = Vec::new();
        let lists = [
            (ProcessKind::Compute, dev.running_compute_processes()),
            (ProcessKind::MpsClient, dev.mps_running_compute_processes()),
        ];
        for (kind, list) in lists {
            match list {
                Ok(list) => out.extend(list.into_iter().map(|p| GpuProcess {
                    pid: p.pid,
                    kind,
                    used_memory_bytes: used(p.used_gpu_memory),
                    sm_util_pct: None,
                    mem_util_pct: None,
                })),
                // Old drivers without the MPS list (or without `_v3`): report what we have.
                Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                    tracing::debug!(gpu = index, ?kind, "process list not supported")
                }
                Err(e) => return Err(map_err(index, e)),
            }
        }
        let last = self.last_seen_us.lock().get(&index).copied().unwrap_or(0);
        match dev.process_utilization_stats(last) {
            Ok(samples) => {
                let newest = samples.iter().map(|s| s.timestamp).max().unwrap_or(last);
                self.last_seen_us.lock().insert(index, newest);
                for s in samples {
                    if let Some(p) = out.iter_mut().find(|p| p.pid == s.pid) {
                        p.sm_util_pct = Some(s.sm_util.min(100) as u8);
                        p.mem_util_pct = Some(s.mem_util.min(100) as u8);
                    }
                }
            }
            // NOT_FOUND: no new sample since `last` (normal when idle or sampled too often).
            Err(
                NvmlError::NotFound | NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_),
            ) => {}
            Err(e) => return Err(map_err(index, e)),
        }
        Ok(out)
    }
}

fn to_nvml_mode(m: ComputeMode) -> NvmlComputeMode {
    match m {
        ComputeMode::Default => NvmlComputeMode::Default,
        ComputeMode::ExclusiveThread => NvmlComputeMode::ExclusiveThread,
        ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
        ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        self.nvml
            .device_count()
            .map_err(|e| GpuError::Nvml(e.to_string()))
    }

    fn device_info(&self, index: u32) -> Result<DeviceInfo, GpuError> {
        let dev = self.device(index)?;
        let e = |err| map_err(index, err);
        Ok(DeviceInfo {
            index,
            name: dev.name().map_err(e)?,
            uuid: dev.uuid().map_err(e)?,
            memory_total_bytes: dev.memory_info().map_err(e)?.total,
            max_sm_clock_mhz: dev.max_clock_info(Clock::SM).map_err(e)?,
        })
    }

    fn sample(&self, index: u32) -> Result<GpuSample, GpuError> {
        let dev = self.device(index)?;
        let e = |err| map_err(index, err);
        let util = dev.utilization_rates().map_err(e)?;
        let mem = dev.memory_info().map_err(e)?;
        let throttle_reasons = match dev.current_throttle_reasons() {
            Ok(r) => r.bits(),
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => 0,
            Err(err) => return Err(e(err)),
        };
        // Power and temperature are optional readings: unsupported or failing → unknown.
        let power_mw = dev.power_usage().ok();
        let temperature_c = dev
            .temperature(TemperatureSensor::Gpu)
            .ok()
            .map(|t| t.min(255) as u8);
        Ok(GpuSample {
            index,
            xid_errors: self.xid.count(index),
            power_mw,
            temperature_c,
            utilization_pct: util.gpu.min(100) as u8,
            memory_util_pct: util.memory.min(100) as u8,
            memory_used_bytes: mem.used,
            memory_total_bytes: mem.total,
            sm_clock_mhz: dev.clock_info(Clock::SM).map_err(e)?,
            max_sm_clock_mhz: dev.max_clock_info(Clock::SM).map_err(e)?,
            throttle_reasons,
            processes: self.processes(index, &dev)?,
        })
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, GpuError> {
        let dev = self.device(index)?;
        Ok(match dev.compute_mode().map_err(|e| map_err(index, e))? {
            NvmlComputeMode::Default => ComputeMode::Default,
            NvmlComputeMode::ExclusiveThread => ComputeMode::ExclusiveThread,
            NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
            NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        })
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), GpuError> {
        let mut dev = self.device(index)?;
        dev.set_compute_mode(to_nvml_mode(mode))
            .map_err(|e| map_err(index, e))
    }
}
