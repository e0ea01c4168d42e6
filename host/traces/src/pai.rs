//! The Alibaba PAI trace (`pai2020/`, cluster-trace-gpu-v2020).
//!
//! Accepted oddities of the real files: `gpu_type` is `CPU` for the 83 machines without
//! GPUs (loaded as `gpu_model: None`) and `MISC` for 280 machines of assorted GPU models
//! ([`GpuModel::Misc`]); the mini-batch tables start with an unnamed pandas index column,
//! which is ignored.

use std::io::Read;
use std::path::Path;

use crate::error::Result;
use crate::gpu::GpuModel;
use crate::table::{Table, open_trace};

/// Relative path (under [`crate::traces_dir`]) of the machine list.
pub const MACHINE_SPEC_FILE: &str = "pai2020/pai_machine_spec.csv";
/// Relative path of the Philly run-time column.
pub const PHILLY_RUNTIME_FILE: &str = "pai2020/philly_runtime.csv";

/// Relative path of mini-batch job `job` (1 to 4), or `None` for any other number.
pub fn minibatch_file(job: u8) -> Option<String> {
    (1..=4)
        .contains(&job)
        .then(|| format!("pai2020/minibatch_job_{job}_norm.csv"))
}

/// A machine of the PAI cluster.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PaiMachine {
    /// `machine`: an anonymized hex id.
    pub name: String,
    /// `gpu_type`; `None` for `CPU` machines.
    pub gpu_model: Option<GpuModel>,
    /// `cap_cpu`: CPU cores.
    pub cpu_cores: u32,
    /// `cap_mem`: memory in GiB, as published.
    pub memory_gib: u32,
    /// `cap_gpu`: number of GPUs.
    pub gpu_count: u32,
}

/// Parses `pai_machine_spec.csv` from CSV text. `file` only labels errors.
pub fn read_machines(source: impl Read, file: &Path) -> Result<Vec<PaiMachine>> {
    let mut table = Table::new(source, file)?;
    let machine = table.require("machine")?;
    let gpu_type = table.require("gpu_type")?;
    let cap_cpu = table.require("cap_cpu")?;
    let cap_mem = table.require("cap_mem")?;
    let cap_gpu = table.require("cap_gpu")?;
    let mut machines = Vec::new();
    while let Some(row) = table.next_row()? {
        let gpu_count: u32 = row.unsigned(cap_gpu)?;
        let gpu_model = match row.text(gpu_type)? {
            "CPU" => None,
            name => Some(
                name.parse::<GpuModel>()
                    .map_err(|error| row.error(gpu_type, error.to_string()))?,
            ),
        };
        if gpu_model.is_none() != (gpu_count == 0) {
            return Err(row.error(cap_gpu, "GPU count disagrees with gpu_type (CPU means 0)"));
        }
        machines.push(PaiMachine {
            name: row.required_string(machine)?,
            gpu_model,
            cpu_cores: row.unsigned(cap_cpu)?,
            memory_gib: row.unsigned(cap_mem)?,
            gpu_count,
        });
    }
    Ok(machines)
}

/// Loads `pai_machine_spec.csv` (plain or gzip).
pub fn load_machines(path: impl AsRef<Path>) -> Result<Vec<PaiMachine>> {
    let path = path.as_ref();
    read_machines(open_trace(path)?, path)
}

/// One mini-batch time of one worker of a distributed training job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MinibatchSample {
    /// `worker`: worker index within the job (0 to 9 in the real files).
    pub worker: u32,
    /// `gpu`: the worker's share of its GPU, in percent.
    pub gpu_percent: u32,
    /// `time`: sample time step (non-decreasing through the file).
    pub time: u32,
    /// `batch_time_norm`: mini-batch time normalized to 0..=1000 (1000 = the job's slowest).
    pub batch_time_norm: u32,
}

/// Parses a `minibatch_job_N_norm.csv` table. `file` only labels errors.
pub fn read_minibatch(source: impl Read, file: &Path) -> Result<Vec<MinibatchSample>> {
    let mut table = Table::new(source, file)?;
    let worker = table.require("worker")?;
    let gpu = table.require("gpu")?;
    let time = table.require("time")?;
    let batch_time_norm = table.require("batch_time_norm")?;
    let mut samples = Vec::new();
    while let Some(row) = table.next_row()? {
        let gpu_percent: u32 = row.unsigned(gpu)?;
        if gpu_percent > 100 {
            return Err(row.error(gpu, "GPU share above 100 percent"));
        }
        samples.push(MinibatchSample {
            worker: row.unsigned(worker)?,
            gpu_percent,
            time: row.unsigned(time)?,
            batch_time_norm: row.unsigned(batch_time_norm)?,
        });
    }
    Ok(samples)
}

/// Loads a `minibatch_job_N_norm.csv` table (plain or gzip).
pub fn load_minibatch(path: impl AsRef<Path>) -> Result<Vec<MinibatchSample>> {
    let path = path.as_ref();
    read_minibatch(open_trace(path)?, path)
}

/// Parses `philly_runtime.csv`: one `runtime` column of job run times in seconds, in file
/// order (ascending in the real file). `file` only labels errors.
pub fn read_philly_runtimes(source: impl Read, file: &Path) -> Result<Vec<f64>> {
    let mut table = Table::new(source, file)?;
    let runtime = table.require("runtime")?;
    let mut runtimes = Vec::new();
    while let Some(row) = table.next_row()? {
        runtimes.push(row.real_seconds(runtime)?);
    }
    Ok(runtimes)
}

/// Loads `philly_runtime.csv` (plain or gzip).
pub fn load_philly_runtimes(path: impl AsRef<Path>) -> Result<Vec<f64>> {
    let path = path.as_ref();
    read_philly_runtimes(open_trace(path)?, path)
}
