//! # Arbiter simulator
//!
//! A discrete-event, virtual-time simulator that drives the **real** host
//! core — [`ClusterState`](arbiter_host::state::ClusterState), the role
//! drivers of [`arbiter_host::roles`] and a
//! [`PolicySlot`](arbiter_host::registry::PolicySlot) holding the policy
//! compiled as Wasm — over a cluster and a workload.
//!
//! The crate is two layers:
//!
//! * [`core`]: one clock and event loop ([`core::run`]), one host
//!   ([`core::SimHost`]), one job-progress integrator ([`core::Progress`]:
//!   speed, restart overhead, checkpoint loss, gang at its slowest worker),
//!   one recorder ([`core::recorder`]) and GPU telemetry
//!   ([`core::telemetry`], the `gpu-metrics` a node agent would send);
//! * [`models`]: workload models behind [`core::WorkloadModel`] — the FGD
//!   placement protocol, trace replay, Aryl's loaning pools — each with its
//!   own configuration and its own ground truth;
//! * [`prediction`]: what a trace job's `estimate-ms` says — nothing, an
//!   Oracle, or a predictor with a stated accuracy — never the truth.
//!
//! Invariants: the simulator depends on no policy crate and no CLI crate
//! (policies arrive as compiled components with their configuration text);
//! a model's ground truth is its own, never a policy's estimate; a decision
//! reaches the cluster only through the host's validator; runs are
//! deterministic for a given seed (wall-clock figures aside). Paper
//! comparisons and the `arbiter sim` command live in `arbiter-repro`.
//!
//! ```no_run
//! use arbiter_sim::core::RunPolicy;
//! use arbiter_sim::models::replay::{ReplayConfig, run_replay};
//! use arbiter_sim::{RunOptions, engine, scenario};
//!
//! # fn main() -> anyhow::Result<()> {
//! let engine = engine(std::time::Duration::from_secs(10))?;
//! let compiled = engine.compile(&std::fs::read("best-fit.wasm")?)?;
//! let policy = RunPolicy { compiled, config: None };
//! let scenario = scenario::builtin_example(42);
//! let out = run_replay(&scenario, &policy, "best-fit", &ReplayConfig::default(), &RunOptions::default())?;
//! println!("{} rounds, avg JCT {:?}", out.rounds, out.replay.map(|m| m.avg_jct_s));
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod core;
pub mod metrics;
pub mod models;
pub mod output;
pub mod prediction;
pub mod report;
pub mod run;
pub mod scenario;

pub use metrics::{FgdMetrics, ReplayMetrics, SeriesPoint, TaskRecord};
pub use output::{FgdSummary, ScenarioSummary, SimOutput, fgd_summary};
pub use run::{ModelConfig, Protocol, RunOptions, RunOutput, ScenarioRun, parallel_map, run_many};
pub use scenario::{Scenario, SimTask, Source, TraceFormat};

use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use std::time::Duration;

/// The engine the simulator uses: the host's defaults with a longer call
/// deadline (a round over a long backlog may take longer than a live round
/// should; a missed deadline would silently hand the round to the fallback).
pub fn engine(deadline: Duration) -> anyhow::Result<PolicyEngine> {
    metered_engine(deadline, None)
}

/// [`engine`], metering each policy call in fuel (at most `fuel` per call) when
/// given: a run then reports what its policy consumed, the same on any machine.
pub fn metered_engine(deadline: Duration, fuel: Option<u64>) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::new(RuntimeConfig {
        deadline,
        fuel,
        ..RuntimeConfig::default()
    })
}
