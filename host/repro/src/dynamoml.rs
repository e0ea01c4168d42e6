//! The DynamoML comparison (§4–§5): the scenario of
//! [`arbiter_sim::models::dynamoml`] under the four configurations of the
//! paper's Table 2, and the figures it publishes.

use anyhow::Context;
use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::dynamoml::{DynamoMetrics, DynamoSimConfig, ServiceDemand, run_dynamoml};
use arbiter_sim::parallel_map;
use std::time::Duration;

/// Overall execution time, minutes: DynamoML, K8S+Scaling (§5.1).
pub const PAPER_MAKESPAN_MIN: (f64, f64) = (27.0, 67.0);
/// Training time cut of DynamoML against native Kubernetes, percent (§5.2).
pub const PAPER_TRAINING_CUT_PCT: f64 = 70.0;
/// Inference GPUs in the first 7 minutes: DynamoML, K8S+Scaling (§5.1).
pub const PAPER_INFERENCE_GPUS_0_7: (u32, u32) = (11, 4);

/// One configuration of Table 2.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub label: &'static str,
    pub policy: &'static str,
    /// Configuration beyond the policy's default.
    pub config: &'static str,
}

/// Table 2, in the paper's order.
pub const SETTINGS: [Setting; 4] = [
    Setting {
        label: "DynamoML",
        policy: "dynamoml",
        config: "",
    },
    Setting {
        label: "K8S+Sharing",
        policy: "k8s",
        config: "gpu_sharing = true",
    },
    Setting {
        label: "K8S+Scaling",
        policy: "k8s",
        config: "inference_scaling = true",
    },
    Setting {
        label: "Native K8S",
        policy: "k8s",
        config: "",
    },
];

/// The policy configuration of `setting` in the scenario `cfg`: the HPA
/// target is what one replica serves at its target load (an operator
/// who runs the service knows it).
pub fn policy_config(setting: &Setting, cfg: &DynamoSimConfig) -> String {
    format!(
        "{}\ntarget_requests_per_replica = {}\n",
        setting.config,
        cfg.target_requests_per_replica()
    )
}

/// The demand curve from the GenAI LoRA trace in `../shared/traces`.
pub fn trace_demand(cfg: &DynamoSimConfig) -> anyhow::Result<ServiceDemand> {
    let file = arbiter_traces::trace_file(arbiter_traces::genai::LORA_REQUESTS_FILE)
        .context("the DynamoML scenario needs the GenAI LoRA request trace")?;
    let requests = arbiter_traces::genai::load_lora_requests(&file)
        .with_context(|| format!("loading `{}`", file.display()))?;
    ServiceDemand::from_lora(&requests, &cfg.demand).context("shaping the demand curve")
}

/// The four settings' runs, in [`SETTINGS`] order.
pub struct Comparison {
    pub runs: Vec<(&'static str, DynamoMetrics)>,
}

impl Comparison {
    pub fn get(&self, label: &str) -> Option<&DynamoMetrics> {
        self.runs.iter().find(|r| r.0 == label).map(|r| &r.1)
    }

    fn pair(&self, a: &str, b: &str) -> anyhow::Result<(&DynamoMetrics, &DynamoMetrics)> {
        let get = |l: &str| self.get(l).with_context(|| format!("no `{l}` run"));
        Ok((get(a)?, get(b)?))
    }

    /// DynamoML's makespan over K8S+Scaling's (the paper: 27/67 = 0.40).
    pub fn makespan_ratio(&self) -> anyhow::Result<f64> {
        let (d, k) = self.pair("DynamoML", "K8S+Scaling")?;
        Ok(d.makespan_min / k.makespan_min)
    }

    /// How much DynamoML cuts `field` against native Kubernetes, percent.
    pub fn cut_vs_native_pct(&self, field: fn(&DynamoMetrics) -> f64) -> anyhow::Result<f64> {
        let (d, n) = self.pair("DynamoML", "Native K8S")?;
        Ok(100.0 * (1.0 - field(d) / field(n)))
    }
}

/// Runs the four settings of Table 2 on `cfg` (in parallel).
pub fn compare(cfg: &DynamoSimConfig, demand: &ServiceDemand) -> anyhow::Result<Comparison> {
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let policies = SETTINGS
        .iter()
        .map(|s| {
            let bytes = arbiter_policies::get(s.policy)
                .with_context(|| format!("`{}` is not a built-in policy", s.policy))?;
            Ok(RunPolicy {
                compiled: engine
                    .compile(bytes)
                    .with_context(|| format!("compiling `{}`", s.policy))?,
                config: Some(policy_config(s, cfg)),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let metrics = parallel_map(&policies, threads, |p| run_dynamoml(p, cfg, demand))?;
    Ok(Comparison {
        runs: SETTINGS.iter().map(|s| s.label).zip(metrics).collect(),
    })
}
