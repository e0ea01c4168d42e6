//! What one run takes and gives back, whatever the model, and running many
//! of them on a thread pool.

use crate::core::{MeterFactory, NativeFactory, RunPolicy, SimHost};
use crate::metrics::{FgdMetrics, ReplayMetrics, SeriesPoint, TaskRecord};
use crate::models::{fgd, replay};
use crate::scenario::Scenario;
use anyhow::{Context, bail};
use serde::Serialize;

/// How tasks arrive and leave (the workload model of a scenario run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// The FGD paper's static placement ([`fgd`]).
    Fgd,
    /// Time-based replay of a trace ([`replay`]).
    Replay,
    /// The Aryl paper's loaning model on the Philly trace
    /// ([`crate::models::aryl`]); its runs are cases, not scenario runs.
    Aryl,
    /// DynamoML's §4 scenario under the four settings of its Table 2
    /// ([`crate::models::dynamoml`]); like Aryl's, not a scenario run.
    Dynamoml,
    /// AntMan's Table 2 scenario under its five settings
    /// ([`crate::models::antman`]); like Aryl's, not a scenario run.
    Antman,
    /// AntMan's trace experiment (§5.2, Fig. 13): Philly jobs on 64 V100s under AntMan,
    /// YARN-CS (with and without preemption) and Gandiva; not a scenario run.
    AntmanTrace,
    /// MuxFlow's comparison (§7): GenAI services sharing their GPUs with Philly training
    /// under MuxFlow, its ablations and the time-sharing baselines
    /// ([`crate::models::muxflow`]); not a scenario run.
    Muxflow,
}

impl Protocol {
    pub const NAMES: [&'static str; 7] = [
        "fgd",
        "replay",
        "aryl",
        "dynamoml",
        "antman",
        "antman-trace",
        "muxflow",
    ];
}

impl Protocol {
    /// Whether a run is measured against the GPU request that has arrived (FGD's static
    /// placement) rather than against virtual time (every other protocol): what a report's
    /// x axis is.
    pub fn by_arrived_load(self) -> bool {
        match self {
            Protocol::Fgd => true,
            Protocol::Replay
            | Protocol::Aryl
            | Protocol::Dynamoml
            | Protocol::Antman
            | Protocol::AntmanTrace
            | Protocol::Muxflow => false,
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Fgd => "fgd",
            Protocol::Replay => "replay",
            Protocol::Aryl => "aryl",
            Protocol::Dynamoml => "dynamoml",
            Protocol::Antman => "antman",
            Protocol::AntmanTrace => "antman-trace",
            Protocol::Muxflow => "muxflow",
        })
    }
}

impl std::str::FromStr for Protocol {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "fgd" => Ok(Protocol::Fgd),
            "replay" => Ok(Protocol::Replay),
            "aryl" => Ok(Protocol::Aryl),
            "dynamoml" => Ok(Protocol::Dynamoml),
            "antman" => Ok(Protocol::Antman),
            "antman-trace" => Ok(Protocol::AntmanTrace),
            "muxflow" => Ok(Protocol::Muxflow),
            other => bail!(
                "unknown protocol `{other}` (fgd, replay, aryl, dynamoml, antman, antman-trace or muxflow)"
            ),
        }
    }
}

/// Knobs of one run beyond the scenario, the model's configuration and the policy.
#[derive(Clone)]
pub struct RunOptions {
    /// Seed of the run (the FGD protocol's task order).
    pub seed: u64,
    /// The policy's configuration as given (`None`: its manifest's default).
    pub config: Option<String>,
    /// The driver's last-resort native policy; `None` = the host's `fifo`.
    pub native_fallback: Option<NativeFactory>,
    /// Keep per-task records (reports); off for benchmarks of 80k-job traces.
    pub keep_records: bool,
    /// Measures fragmentation for the series and the FGD metrics (`None`: not measured).
    pub fragmentation: Option<MeterFactory>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            seed: 42,
            config: None,
            native_fallback: None,
            keep_records: true,
            fragmentation: None,
        }
    }
}

/// The result of one policy on one scenario with one seed.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutput {
    /// The policy's manifest name.
    pub policy: String,
    /// Built-in name or file path as given.
    pub policy_source: String,
    /// sha256 of the component.
    pub digest: String,
    pub protocol: Protocol,
    pub seed: u64,
    pub rounds: u64,
    pub tasks: usize,
    pub placed: usize,
    /// Rounds in which the policy faulted (answered by a fallback, or by nobody).
    pub policy_faults: u64,
    /// Rounds answered by an older generation or the native fallback.
    pub fallback_rounds: u64,
    pub round_latency_p50_us: f64,
    pub round_latency_p99_us: f64,
    /// Time inside the policy's calls, summed over rounds.
    pub policy_seconds: f64,
    /// Fuel the policy's calls consumed, summed over the rounds it answered
    /// (`arbiter sim --fuel`): its cost in guest instructions, the same on any
    /// machine, where `policy_seconds` is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_fuel: Option<u64>,
    pub wall_seconds: f64,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub fgd: Option<FgdMetrics>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayMetrics>,
    #[serde(skip)]
    pub series: Vec<SeriesPoint>,
    #[serde(skip)]
    pub records: Vec<TaskRecord>,
}

impl RunOutput {
    /// The host's side of a run's output; the model fills in its metrics.
    pub fn from_host(
        host: &SimHost,
        source: &str,
        protocol: Protocol,
        seed: u64,
        tasks: usize,
        placed: usize,
    ) -> RunOutput {
        let s = &host.stats;
        RunOutput {
            policy: host.generation().manifest().name.clone(),
            policy_source: source.to_string(),
            digest: host.generation().digest().to_string(),
            protocol,
            seed,
            rounds: s.rounds,
            tasks,
            placed,
            policy_faults: s.faulted,
            fallback_rounds: s.fallbacks,
            round_latency_p50_us: s.latency_p50_us(),
            round_latency_p99_us: s.latency_p99_us(),
            policy_seconds: s.policy_time.as_secs_f64(),
            policy_fuel: s.fuel,
            wall_seconds: 0.0,
            fgd: None,
            replay: None,
            series: Vec::new(),
            records: Vec::new(),
        }
    }
}

/// One scenario run: a policy (with its label), the options, and the model's configuration.
#[derive(Clone)]
pub struct ScenarioRun {
    pub label: String,
    pub policy: RunPolicy,
    pub options: RunOptions,
    pub model: ModelConfig,
}

/// The configuration of a scenario run's workload model.
#[derive(Clone, Debug)]
pub enum ModelConfig {
    Fgd(fgd::FgdConfig),
    Replay(replay::ReplayConfig),
}

impl ModelConfig {
    pub fn protocol(&self) -> Protocol {
        match self {
            ModelConfig::Fgd(_) => Protocol::Fgd,
            ModelConfig::Replay(_) => Protocol::Replay,
        }
    }
}

/// Runs every one of `runs` on `threads` threads; results in the runs' order.
pub fn run_many(
    scenario: &Scenario,
    runs: &[ScenarioRun],
    threads: usize,
) -> anyhow::Result<Vec<RunOutput>> {
    parallel_map(runs, threads, |run| match &run.model {
        ModelConfig::Fgd(cfg) => fgd::run_fgd(scenario, &run.policy, &run.label, cfg, &run.options),
        ModelConfig::Replay(cfg) => {
            replay::run_replay(scenario, &run.policy, &run.label, cfg, &run.options)
        }
    })
}

/// Applies `run` to every item on a rayon pool of `threads` threads; results
/// in item order. Items are handed out in order as threads come free, so a
/// caller that lists its longest runs first has them started first (and no
/// thread is left idle behind one long run at the end). A panicking run is an
/// error naming the item's position and the panic message, not a crash of the
/// caller (rayon alone would re-panic).
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    run: impl Fn(&T) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    use rayon::prelude::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.clamp(1, items.len().max(1)))
        .thread_name(|i| format!("arbiter-sim-{i}"))
        .build()
        .context("starting the simulation thread pool")?;
    let mut done: Vec<(usize, anyhow::Result<R>)> = pool.install(|| {
        items
            .iter()
            .enumerate()
            .par_bridge()
            .map(|(i, item)| {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(item)))
                    .unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "no message".into());
                        Err(anyhow::anyhow!("simulation run #{i} panicked: {message}"))
                    });
                (i, result)
            })
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, result)| result).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_item_order() {
        let items: Vec<u32> = (0..50).collect();
        let out = parallel_map(&items, 4, |&i| Ok(i * 2)).expect("runs");
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_run_is_an_error_not_a_crash() {
        let items = [1u32, 2, 3];
        let err = parallel_map(&items, 2, |&i| {
            if i == 2 {
                panic!("boom at {i}");
            }
            Ok(i)
        })
        .expect_err("a panic is an error");
        let text = format!("{err:#}");
        assert!(text.contains("#1") && text.contains("boom at 2"), "{text}");
    }

    #[test]
    fn protocols_round_trip_their_names() {
        for name in Protocol::NAMES {
            let p: Protocol = name.parse().expect("known");
            assert_eq!(p.to_string(), name);
        }
        assert!("nope".parse::<Protocol>().is_err());
    }
}
