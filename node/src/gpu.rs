//! The GPU backend: what the node reads from (and the little it writes to) each GPU.
//!
//! [`GpuBackend`] is implemented by [`crate::nvml::NvmlBackend`] (NVML through `nvml-wrapper`;
//! in CI the same code runs against the fake `libnvidia-ml.so.1` in `tests/fake-nvml`) and by
//! [`SimBackend`], a programmable in-memory device for unit tests and the simulator.

use parking_lot::Mutex;
use std::collections::HashMap;

/// Errors from a GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("GPU {0} does not exist")]
    NoSuchGpu(u32),
    #[error("GPU {0} is lost (fell off the bus or the driver lost it)")]
    Lost(u32),
    #[error("not supported by this GPU/driver: {0}")]
    NotSupported(&'static str),
    #[error("NVML: {0}")]
    Nvml(String),
}

/// `nvmlComputeMode_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ComputeMode {
    Default,
    ExclusiveThread,
    Prohibited,
    /// One context (the MPS server's) owns the GPU: the mode MPS wants.
    ExclusiveProcess,
}

/// Static facts about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_bytes: u64,
    pub max_sm_clock_mhz: u32,
}

/// Which NVML list a process came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    /// `nvmlDeviceGetComputeRunningProcesses` (a plain CUDA process, or an MPS server).
    Compute,
    /// `nvmlDeviceGetMPSComputeRunningProcesses` (an MPS client).
    MpsClient,
}

/// One process on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    pub kind: ProcessKind,
    /// `None` where NVML cannot tell (e.g. Windows WDDM, some containers).
    pub used_memory_bytes: Option<u64>,
    /// SM utilization of this process over the last sample period (`None`: no new sample).
    /// Under MPS, NVML attributes client work to the server, so this is unreliable there.
    pub sm_util_pct: Option<u8>,
    pub mem_util_pct: Option<u8>,
}

/// One reading of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSample {
    pub index: u32,
    /// Percent of the sample period during which a kernel was running (`utilization.gpu`).
    pub utilization_pct: u8,
    /// Percent of the period during which device memory was read or written.
    pub memory_util_pct: u8,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    /// `nvmlClocksThrottleReasons` bits ([`throttle_reason_names`] decodes them).
    pub throttle_reasons: u64,
    pub processes: Vec<GpuProcess>,
    /// XID errors the driver raised on this GPU since the backend opened (NVML's
    /// `XidCriticalError` events; 0 also where they cannot be watched).
    pub xid_errors: u32,
    /// Board power draw, milliwatts (`None`: not supported).
    pub power_mw: Option<u32>,
    /// Core temperature, °C (`None`: not supported).
    pub temperature_c: Option<u8>,
}

/// The GPU backend of the node.
///
/// Methods take `&self`: backends synchronise internally so the node can sample from one
/// thread and apply actions from another.
pub trait GpuBackend: Send + Sync {
    /// Short name for logs ("nvml", "sim").
    fn kind(&self) -> &'static str;
    fn device_count(&self) -> Result<u32, GpuError>;
    fn device_info(&self, index: u32) -> Result<DeviceInfo, GpuError>;
    /// A fresh reading: utilization, memory, clocks, throttle reasons, processes with their
    /// per-process utilization.
    fn sample(&self, index: u32) -> Result<GpuSample, GpuError>;
    fn compute_mode(&self, index: u32) -> Result<ComputeMode, GpuError>;
    /// Needs root on a real GPU.
    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), GpuError>;
}

/// Names of the set bits of an `nvmlClocksThrottleReasons` mask (nvml.h values).
pub fn throttle_reason_names(bits: u64) -> Vec<&'static str> {
    const NAMES: &[(u64, &str)] = &[
        (0x1, "gpu_idle"),
        (0x2, "applications_clocks_setting"),
        (0x4, "sw_power_cap"),
        (0x8, "hw_slowdown"),
        (0x10, "sync_boost"),
        (0x20, "sw_thermal_slowdown"),
        (0x40, "hw_thermal_slowdown"),
        (0x80, "hw_power_brake_slowdown"),
        (0x100, "display_clock_setting"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Throttle reasons that mean the GPU is running below the clock it was asked for because of
/// power, heat or hardware protection (not idleness or an application setting).
pub const THROTTLE_SLOWDOWN_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// A programmable in-memory backend: tests and the simulator set what each GPU shows.
#[derive(Debug, Default)]
pub struct SimBackend {
    inner: Mutex<SimInner>,
}

#[derive(Debug, Default)]
struct SimInner {
    gpus: Vec<(DeviceInfo, GpuSample, ComputeMode)>,
    lost: HashMap<u32, bool>,
}

impl SimBackend {
    /// `count` idle GPUs of `memory_total_bytes` each, max SM clock 1980 MHz.
    pub fn new(count: u32, memory_total_bytes: u64) -> SimBackend {
        let sim = SimBackend::default();
        {
            let mut g = sim.inner.lock();
            for index in 0..count {
                let info = DeviceInfo {
                    index,
                    name: "Simulated GPU".into(),
                    uuid: format!("GPU-sim-{index:04}"),
                    memory_total_bytes,
                    max_sm_clock_mhz: 1980,
                };
                let sample = GpuSample {
                    index,
                    utilization_pct: 0,
                    memory_util_pct: 0,
                    memory_used_bytes: 0,
                    memory_total_bytes,
                    sm_clock_mhz: 1980,
                    max_sm_clock_mhz: 1980,
                    throttle_reasons: 0,
                    processes: Vec::new(),
                    xid_errors: 0,
                    power_mw: None,
                    temperature_c: None,
                };
                g.gpus.push((info, sample, ComputeMode::Default));
            }
        }
        sim
    }

    /// Replace what GPU `index` reports (its `index`/totals are kept consistent).
    pub fn set_sample(&self, index: u32, mut sample: GpuSample) -> Result<(), GpuError> {
        let mut g = self.inner.lock();
        let slot = g
            .gpus
            .get_mut(index as usize)
            .ok_or(GpuError::NoSuchGpu(index))?;
        sample.index = index;
        sample.memory_total_bytes = slot.0.memory_total_bytes;
        sample.max_sm_clock_mhz = slot.0.max_sm_clock_mhz;
        slot.1 = sample;
        Ok(())
    }

    /// Make GPU `index` fail every query (as if it fell off the bus) or recover.
    pub fn set_lost(&self, index: u32, lost: bool) {
        self.inner.lock().lost.insert(index, lost);
    }

    fn with<T>(
        &self,
        index: u32,
        f: impl FnOnce(&mut (DeviceInfo, GpuSample, ComputeMode)) -> T,
    ) -> Result<T, GpuError> {
        let mut g = self.inner.lock();
        if g.lost.get(&index).copied().unwrap_or(false) {
            return Err(GpuError::Lost(index));
        }
        g.gpus
            .get_mut(index as usize)
            .map(f)
            .ok_or(GpuError::NoSuchGpu(index))
    }
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        Ok(self.inner.lock().gpus.len() as u32)
    }

    fn device_info(&self, index: u32) -> Result<DeviceInfo, GpuError> {
        self.with(index, |g| g.0.clone())
    }

    fn sample(&self, index: u32) -> Result<GpuSample, GpuError> {
        self.with(index, |g| g.1.clone())
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, GpuError> {
        self.with(index, |g| g.2)
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), GpuError> {
        self.with(index, |g| g.2 = mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_backend_roundtrip_and_loss() {
        let sim = SimBackend::new(2, 8 << 30);
        assert_eq!(sim.device_count().ok(), Some(2));
        let mut s = sim.sample(1).expect("sample");
        s.utilization_pct = 55;
        s.memory_used_bytes = 1 << 30;
        sim.set_sample(1, s).expect("set");
        let s = sim.sample(1).expect("sample");
        assert_eq!((s.utilization_pct, s.memory_total_bytes), (55, 8 << 30));
        sim.set_compute_mode(0, ComputeMode::ExclusiveProcess)
            .expect("mode");
        assert_eq!(
            sim.compute_mode(0).ok(),
            Some(ComputeMode::ExclusiveProcess)
        );
        sim.set_lost(1, true);
        assert!(matches!(sim.sample(1), Err(GpuError::Lost(1))));
        assert!(matches!(sim.sample(7), Err(GpuError::NoSuchGpu(7))));
    }

    #[test]
    fn throttle_names() {
        assert_eq!(
            throttle_reason_names(0x1 | 0x4 | 0x40),
            ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
        );
        assert!(throttle_reason_names(0).is_empty());
    }
}
