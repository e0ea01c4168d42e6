//! The host side of one run: the real host core — [`ClusterState`], a
//! [`RoundDriver`] over a [`PolicySlot`] holding the policy — and what its
//! rounds cost.

use crate::metrics::percentile;
use anyhow::Context;
use arbiter_host::registry::{Generation, PolicySlot};
use arbiter_host::roles::coordinator::{ActionRules, CoordinatorDriver};
use arbiter_host::roles::scheduler::{RoundDriver, RoundReport, Served};
use arbiter_host::runtime::{CompiledPolicy, NativePolicy};
use arbiter_host::state::ClusterState;
use std::sync::Arc;
use std::time::Duration;

/// A fresh native fallback policy for each run (the host's default is `fifo`).
pub type NativeFactory = Arc<dyn Fn() -> Box<dyn NativePolicy> + Send + Sync>;

/// A compiled policy and the configuration it runs with (`None`: its
/// manifest's default).
#[derive(Clone)]
pub struct RunPolicy {
    pub compiled: CompiledPolicy,
    pub config: Option<String>,
}

impl RunPolicy {
    /// A slot named `name` holding this policy, loaded and configured: what a role driver
    /// (a node's coordinator, the matcher) runs.
    pub fn slot(&self, name: &str) -> anyhow::Result<Arc<PolicySlot>> {
        let slot = Arc::new(PolicySlot::new(name.to_string()));
        slot.swap(self.compiled.clone(), self.config.clone(), None, None)
            .with_context(|| format!("loading `{}` as {name}", self.compiled.manifest.name))?;
        Ok(slot)
    }

    /// One coordinator driver per node, each with its own instance of this policy (a real
    /// node runs its own), under the host's default action rules.
    pub fn coordinators(&self, nodes: u32) -> anyhow::Result<Vec<CoordinatorDriver>> {
        (0..nodes)
            .map(|k| {
                Ok(CoordinatorDriver::new(
                    self.slot(&format!("coordinator-{k}"))?,
                    ActionRules::default(),
                ))
            })
            .collect()
    }
}

/// Round statistics of one run.
#[derive(Clone, Debug, Default)]
pub struct RoundStats {
    pub rounds: u64,
    pub latencies_us: Vec<f64>,
    /// Rounds in which the policy faulted.
    pub faulted: u64,
    /// Rounds answered by an older generation or the native fallback.
    pub fallbacks: u64,
    /// Rounds that faulted or were answered by a fallback.
    pub troubled: u64,
    pub policy_time: Duration,
    /// Fuel the answering policy consumed, summed over rounds (with fuel
    /// metering on; `None` otherwise).
    pub fuel: Option<u64>,
}

impl RoundStats {
    pub fn latency_p50_us(&self) -> f64 {
        percentile(&self.latencies_us, 50.0)
    }
    pub fn latency_p99_us(&self) -> f64 {
        percentile(&self.latencies_us, 99.0)
    }
}

/// The host core of one simulated cluster.
pub struct SimHost {
    pub state: ClusterState,
    driver: RoundDriver,
    generation: Arc<Generation>,
    pub stats: RoundStats,
    keep_latencies: bool,
}

impl SimHost {
    /// Loads `policy` into a fresh slot over `state` (nodes already added).
    pub fn new(
        mut state: ClusterState,
        policy: &RunPolicy,
        native: Option<&NativeFactory>,
    ) -> anyhow::Result<SimHost> {
        let name = policy.compiled.manifest.name.clone();
        let slot = Arc::new(PolicySlot::new(name.clone()));
        let generation = slot
            .swap(
                policy.compiled.clone(),
                policy.config.clone(),
                None,
                Some(state.snapshot()),
            )
            .with_context(|| format!("loading policy `{name}`"))?;
        let driver = match native {
            Some(factory) => RoundDriver::with_native(slot, factory()),
            None => RoundDriver::new(slot),
        };
        Ok(SimHost {
            state,
            driver,
            generation,
            stats: RoundStats::default(),
            keep_latencies: true,
        })
    }

    /// The loaded generation (manifest name, digest).
    pub fn generation(&self) -> &Generation {
        &self.generation
    }

    /// Runs one scheduling round through the host's driver.
    pub fn round(&mut self) -> RoundReport {
        let report = self.driver.run_round(&mut self.state);
        let s = &mut self.stats;
        s.rounds += 1;
        if self.keep_latencies {
            s.latencies_us.push(report.latency.as_secs_f64() * 1e6);
        }
        s.policy_time += report.policy_time;
        if let Some(fuel) = report.fuel {
            s.fuel = Some(s.fuel.unwrap_or(0).saturating_add(fuel));
        }
        let faulted = !report.faults.is_empty();
        let fallback = !matches!(report.served, Served::Active(_));
        s.faulted += u64::from(faulted);
        s.fallbacks += u64::from(fallback);
        s.troubled += u64::from(faulted || fallback);
        report
    }
}
