//! The policy's configuration: one flat TOML document. Keys left out keep their defaults;
//! unknown keys are an error.
//!
//! AntMan (§5.2) uses Gandiva's packing, which "greedily schedules jobs to the GPUs with
//! lowest GPU utilization and sufficient GPU memory", with the jobs' profiles known; its
//! micro-benchmarks (Table 2 "Pack", Fig. 12) pack two jobs on one GPU. Neither paper
//! gives a per-GPU bound; [`DEFAULT_CONFIG`] says what we chose and why.

use arbiter_policy_sdk::model::PolicyError;
use serde::Deserialize;

/// The default configuration, as returned in the manifest. Parses to [`Config::default`].
pub const DEFAULT_CONFIG: &str = r#"# gandiva: Gandiva's packing (OSDI '18) as AntMan (OSDI '20) compares against it.

# Most jobs (workers) on one GPU. Gandiva packs jobs pairwise; AntMan's Table 2 "Pack" and
# Fig. 12 put two jobs on one GPU (ours: 2). The operator's sharing rules may allow fewer.
max_jobs_per_gpu = 2

# AntMan §5.2: Gandiva packs onto GPUs with "sufficient GPU memory", from job profiles: a
# job goes beside others only where its declared GPU memory (`gpu-memory-mib`, the whole
# GPU when not declared; or the peak a running job reported, if larger) fits beside theirs.
# false: pack regardless of memory, as in AntMan's Table 2 "Pack" configuration, where
# Job-B (30 GB) joins Job-A (3.5 GB) on a 32 GB GPU and fails with 28.5 GB granted.
memory_check = true
"#;

/// The configuration (see [`DEFAULT_CONFIG`]).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Most workers on one GPU (at least 1; 1 turns packing off).
    pub max_jobs_per_gpu: u32,
    /// Pack only where the job's declared memory fits beside the GPU's residents'.
    pub memory_check: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_jobs_per_gpu: 2,
            memory_check: true,
        }
    }
}

impl Config {
    /// Parses and checks a configuration document (empty: the defaults).
    pub fn parse(text: &str) -> Result<Config, PolicyError> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| PolicyError::Failed(format!("gandiva config: {e}")))?;
        if cfg.max_jobs_per_gpu == 0 {
            return Err(PolicyError::Failed(
                "gandiva config: max_jobs_per_gpu must be at least 1".into(),
            ));
        }
        Ok(cfg)
    }
}
