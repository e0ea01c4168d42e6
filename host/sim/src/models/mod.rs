//! Workload models: each paper's world on the simulator core — its
//! arrivals, its ground truth (speed, loans, interference), its metrics —
//! configured by a struct that also reads from TOML. Paper comparisons
//! (cases, published constants, tables) are not here: they live in
//! `arbiter-repro`.
//!
//! * [`fgd`]: the FGD paper's static placement protocol;
//! * [`replay`]: time-based replay of a trace;
//! * [`aryl`]: Aryl's training and inference pools with capacity loaning;
//! * [`dynamoml`]: DynamoML's mixed pipeline — notebooks, an autoscaled
//!   inference service with closed-loop clients, elastic training;
//! * [`antman`]: AntMan's co-located training — GPUs whose memory and compute
//!   jobs contend for, and a node coordinator run as Wasm in virtual time;
//! * [`muxflow`]: MuxFlow's online services sharing their GPUs with offline
//!   training — a matcher and a node coordinator as Wasm, MPS or time slicing.

pub mod antman;
pub mod aryl;
pub mod dynamoml;
pub mod fgd;
pub mod muxflow;
pub mod replay;

use anyhow::Context;
use serde::de::DeserializeOwned;

/// A model's configuration: a struct that also reads from a TOML table
/// (every field optional, unknown ones refused) and checks itself.
pub trait ModelConfigFile: DeserializeOwned {
    /// What it configures, for error messages.
    const WHAT: &'static str;

    /// Refuses values the model cannot run with.
    fn check(&self) -> anyhow::Result<()>;

    /// Parses and checks `text`.
    fn from_toml(text: &str) -> anyhow::Result<Self> {
        let cfg: Self = toml::from_str(text).with_context(|| format!("parsing {}", Self::WHAT))?;
        cfg.check()
            .with_context(|| format!("checking {}", Self::WHAT))?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::ModelConfigFile;
    use super::aryl::ArylSimConfig;
    use super::fgd::FgdConfig;
    use super::replay::ReplayConfig;
    use crate::core::SpeedupLaw;

    #[test]
    fn model_configurations_read_from_toml_and_refuse_what_they_cannot_run() {
        assert_eq!(FgdConfig::from_toml("tune = 1.0").expect("fgd").tune, 1.0);
        assert!(FgdConfig::from_toml("tune = -1.0").is_err());
        assert!(FgdConfig::from_toml("tuned = 1.0").is_err(), "unknown key");
        let replay =
            ReplayConfig::from_toml("round_interval_ms = 500\ngpu_metrics_period_ms = 100")
                .expect("replay");
        assert_eq!(replay.gpu_metrics_period_ms, Some(100));
        assert!(ReplayConfig::from_toml("gpu_metrics_period_ms = 0").is_err());
        let aryl = ArylSimConfig::from_toml(
            "training_nodes = 4\nspeedup = { law = \"sub-linear\", loss_per_step = 0.1 }",
        )
        .expect("aryl");
        assert_eq!(aryl.training_nodes, 4);
        assert_eq!(
            aryl.inference_nodes,
            ArylSimConfig::default().inference_nodes
        );
        assert_eq!(aryl.speedup, SpeedupLaw::SubLinear { loss_per_step: 0.1 });
        assert!(ArylSimConfig::from_toml("round_interval_ms = 0").is_err());
        assert!(
            ArylSimConfig::from_toml("speedup = { law = \"sub-linear\", loss_per_step = 2.0 }")
                .is_err()
        );
    }
}
