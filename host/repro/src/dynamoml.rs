//! The DynamoML comparison (§4–§5): the scenario of
//! [`arbiter_sim::models::dynamoml`] under the four configurations of the
//! paper's Table 2, and the figures it publishes.

use anyhow::{Context, bail};
use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::dynamoml::{
    DynamoMetrics, DynamoSimConfig, ServiceDemand, TrainingRuntime, run_dynamoml,
};
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
    /// The training jobs' runtime in this setting, unless the scenario
    /// sets one for all (`DynamoSimConfig::training_runtime`).
    pub runtime: TrainingRuntime,
}

/// Table 2, in the paper's order.
pub const SETTINGS: [Setting; 4] = [
    Setting {
        label: "DynamoML",
        policy: "dynamoml",
        config: "",
        runtime: TrainingRuntime::Elastic,
    },
    Setting {
        label: "K8S+Sharing",
        policy: "k8s",
        config: "gpu_sharing = true",
        runtime: TrainingRuntime::Synchronous,
    },
    Setting {
        label: "K8S+Scaling",
        policy: "k8s",
        config: "inference_scaling = true",
        runtime: TrainingRuntime::Synchronous,
    },
    Setting {
        label: "Native K8S",
        policy: "k8s",
        config: "",
        runtime: TrainingRuntime::Synchronous,
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

    /// Runs `a` and `b`, each with every training job finished: with some left at the
    /// horizon, a makespan is unknown and a mean over the finished ones compares the jobs
    /// that got through, not the settings.
    fn pair(&self, a: &str, b: &str) -> anyhow::Result<(&DynamoMetrics, &DynamoMetrics)> {
        let get = |l: &str| {
            let m = self.get(l).with_context(|| format!("no `{l}` run"))?;
            if m.unfinished > 0 {
                bail!(
                    "{l} left {} of {} training jobs unfinished at the horizon",
                    m.unfinished,
                    m.jobs.len()
                );
            }
            Ok(m)
        };
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
    compare_settings(&SETTINGS, cfg, demand)
}

/// Runs `settings` on `cfg` (in parallel); [`compare`] with other
/// configurations of the same settings (the sensitivity table's).
pub fn compare_settings(
    settings: &[Setting],
    cfg: &DynamoSimConfig,
    demand: &ServiceDemand,
) -> anyhow::Result<Comparison> {
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let policies = settings
        .iter()
        .map(|s| {
            Ok(RunPolicy {
                compiled: crate::compile_builtin(&engine, s.policy)?,
                config: Some(policy_config(s, cfg)),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runs: Vec<(RunPolicy, DynamoSimConfig)> = policies
        .into_iter()
        .zip(settings)
        .map(|(p, s)| {
            let runtime = cfg.training_runtime.unwrap_or(s.runtime);
            let cfg = DynamoSimConfig {
                training_runtime: Some(runtime),
                ..cfg.clone()
            };
            (p, cfg)
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let metrics = parallel_map(&runs, threads, |(p, cfg)| run_dynamoml(p, cfg, demand))?;
    Ok(Comparison {
        runs: settings.iter().map(|s| s.label).zip(metrics).collect(),
    })
}

/// `arbiter sim --protocol dynamoml`: the comparison and the paper's figures beside it.
pub struct DynamoReport {
    pub comparison: Comparison,
}

/// Runs the §4 scenario under the four settings: the default scenario, or the
/// `DynamoSimConfig` TOML file `--config` names.
pub fn run_protocol(args: &crate::SimArgs) -> anyhow::Result<DynamoReport> {
    let cfg: DynamoSimConfig = crate::protocol_setup(args)?;
    let demand = trace_demand(&cfg)?;
    Ok(DynamoReport {
        comparison: compare(&cfg, &demand)?,
    })
}

impl DynamoReport {
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        let c = &self.comparison;
        let ratio = c.makespan_ratio();
        let cut = c.cut_vs_native_pct(|m| m.mean_training_min);
        if json {
            let runs: Vec<_> = c
                .runs
                .iter()
                .map(|(label, m)| serde_json::json!({ "setting": label, "metrics": m }))
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "runs": runs,
                    "makespan_ratio": ratio.as_ref().ok(),
                    "paper_makespan_ratio": PAPER_MAKESPAN_MIN.0 / PAPER_MAKESPAN_MIN.1,
                    "training_cut_vs_native_pct": cut.as_ref().ok(),
                    "paper_training_cut_vs_native_pct": PAPER_TRAINING_CUT_PCT,
                }))?
            );
            return Ok(());
        }
        println!(
            "{:<12} {:>9} {:>6} {:>9} {:>6} {:>9} {:>8} {:>10} {:>6}",
            "setting",
            "makespan",
            "wait",
            "training",
            "total",
            "over SLO",
            "> 1 s",
            "GPUs 0-7",
            "unfin"
        );
        for (label, m) in &c.runs {
            // With jobs left at the horizon the last end is not the makespan.
            let makespan = if m.unfinished > 0 {
                "-".to_string()
            } else {
                format!("{:.1}", m.makespan_min)
            };
            println!(
                "{:<12} {:>9} {:>6.1} {:>9.1} {:>6.1} {:>8.1}% {:>7.1}% {:>10} {:>6}",
                label,
                makespan,
                m.mean_wait_min,
                m.mean_training_min,
                m.mean_total_min,
                100.0 * m.over_slo,
                100.0 * m.latency_bins[3],
                m.inference_gpus_0_7,
                m.unfinished
            );
        }
        let shown = |v: &anyhow::Result<f64>, digits: usize, unit: &str| match v {
            Ok(v) => format!("{v:.digits$}{unit}"),
            Err(e) => format!("n/a ({e})"),
        };
        let (ratio, cut) = (shown(&ratio, 2, ""), shown(&cut, 0, " %"));
        println!(
            "makespan DynamoML / K8S+Scaling {ratio} (paper {:.2}); training time cut vs \
             native {cut} (paper {:.0} %); inference GPUs at the first peak {} / {} \
             (paper {} / {}). Minutes; see docs/reproductions/dynamoml.md.",
            PAPER_MAKESPAN_MIN.0 / PAPER_MAKESPAN_MIN.1,
            PAPER_TRAINING_CUT_PCT,
            c.get("DynamoML").map_or(0, |m| m.inference_gpus_0_7),
            c.get("K8S+Scaling").map_or(0, |m| m.inference_gpus_0_7),
            PAPER_INFERENCE_GPUS_0_7.0,
            PAPER_INFERENCE_GPUS_0_7.1,
        );
        Ok(())
    }
}
