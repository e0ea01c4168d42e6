//! "MLaaS in the Wild" (Weng et al., NSDI '22) on our traces: the PAI
//! cluster's machine table (Table 1, here), shortest-job-first on predicted
//! durations (§5.2, Fig. 13: [`sjf`]) and reserving-and-packing against load
//! balancing on the PAI cluster (§6.3, Fig. 19: [`reserving`]). What each
//! experiment chooses where the paper is silent is stated on its set-up and
//! in `docs/reproductions/pai.md`.

pub mod cart;
pub mod reserving;
pub mod sjf;

pub use sjf::{PUBLISHED_SJF_CUT_PCT, SjfResult, SjfRow, SjfSetup, sjf_experiment, sjf_scenario};

use anyhow::bail;
use arbiter_traces::GpuModel;
use arbiter_traces::pai::PaiMachine;
use rand::Rng;
use std::collections::BTreeMap;

/// `n` run times (ms) drawn with replacement from the file's positive run
/// times (`philly_runtime.csv` is sorted, so it is sampled, not read in
/// order).
pub fn sample_runtimes_ms(
    runtimes_s: &[f64],
    n: usize,
    rng: &mut impl Rng,
) -> anyhow::Result<Vec<u64>> {
    let positive: Vec<u64> = runtimes_s
        .iter()
        .filter(|r| r.is_finite() && **r > 0.0)
        .map(|r| (r * 1000.0).round() as u64)
        .collect();
    if positive.is_empty() || n == 0 {
        bail!("no positive run times to sample, or no jobs asked for");
    }
    Ok((0..n)
        .map(|_| positive[rng.random_range(0..positive.len())])
        .collect())
}

/// The paper's Table 1 as the machine list gives it: machines and GPUs per
/// model, and host CPUs per GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineTable {
    pub machines: usize,
    pub gpus: u64,
    /// Per GPU model ("CPU" for machines without GPUs): (machines, GPUs).
    pub by_model: BTreeMap<String, (usize, u64)>,
    /// vCPUs per GPU on 8-GPU machines, on 2-GPU machines, and over the
    /// whole cluster (CPU-only machines' vCPUs included).
    pub vcpu_per_gpu_8: f64,
    pub vcpu_per_gpu_2: f64,
    pub vcpu_per_gpu_all: f64,
}

/// Table 1 from `pai_machine_spec.csv`.
pub fn machine_table(machines: &[PaiMachine]) -> MachineTable {
    let mut by_model: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let ratio = |filter: &dyn Fn(&PaiMachine) -> bool| {
        let (cpus, gpus) = machines
            .iter()
            .filter(|m| filter(m))
            .fold((0u64, 0u64), |(c, g), m| {
                (c + u64::from(m.cpu_cores), g + u64::from(m.gpu_count))
            });
        cpus as f64 / gpus.max(1) as f64
    };
    for m in machines {
        let name = m
            .gpu_model
            .map_or_else(|| "CPU".to_string(), |g: GpuModel| g.to_string());
        let e = by_model.entry(name).or_default();
        e.0 += 1;
        e.1 += u64::from(m.gpu_count);
    }
    MachineTable {
        machines: machines.len(),
        gpus: machines.iter().map(|m| u64::from(m.gpu_count)).sum(),
        by_model,
        vcpu_per_gpu_8: ratio(&|m| m.gpu_count == 8),
        vcpu_per_gpu_2: ratio(&|m| m.gpu_count == 2),
        vcpu_per_gpu_all: ratio(&|_| true),
    }
}
