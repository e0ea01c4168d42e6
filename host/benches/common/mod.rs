//! Shared set-up of the host benchmarks: the PAI-scale cluster, a small
//! churn cluster, job mixes, and RSS readings.
//!
//! Each bench binary includes this module with `mod common;` and uses only
//! part of it.
#![allow(dead_code)]

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::state::Applied;
use arbiter_host::state::{ClusterState, JobId, JobRequest, NodeRequest};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{Decision, WorkerPlacement, job_kind, qos};
use policy_best_fit::BestFit;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Jobs running in the measured PAI round.
pub const PAI_RUNNING: usize = 5_000;
/// Jobs pending in the measured PAI round.
pub const PAI_PENDING: usize = 1_000;
/// Arrivals, completions and (previous round's) placements in a typical round's delta.
pub const CHURN: usize = 50;
/// The decision cap of the rounds.
pub const MAX_DECISIONS: u32 = 10_000;

fn gpu_memory_mib(model: &str) -> u32 {
    match model {
        "V100M32" => 32_768,
        "" => 0,
        _ => 16_384,
    }
}

/// The 1,897 machines of `pai2020/pai_machine_spec.csv` (CPU machines have no GPUs).
pub fn pai_nodes() -> Vec<NodeRequest> {
    let path =
        arbiter_traces::trace_file(arbiter_traces::pai::MACHINE_SPEC_FILE).expect("PAI trace file");
    let machines = arbiter_traces::pai::load_machines(&path).expect("PAI machine list");
    machines
        .into_iter()
        .map(|m| {
            let model = m
                .gpu_model
                .map(|g| g.as_str().to_string())
                .unwrap_or_default();
            NodeRequest {
                name: m.name,
                pool: if model.is_empty() {
                    "cpu".into()
                } else {
                    "gpu".into()
                },
                cpu_milli: m.cpu_cores * 1000,
                memory_mib: m.memory_gib * 1024,
                gpu_memory_mib: gpu_memory_mib(&model),
                gpu_model: model,
                gpu_count: m.gpu_count,
                on_loan: false,
            }
        })
        .collect()
}

/// A job of the PAI-like size mix: 55% fractional (¼ or ½ GPU), 30% one GPU,
/// 7% two, 3% four, 2% eight, 1% a 2×8 gang, 2% CPU-only.
pub fn mixed_job(rng: &mut ChaCha8Rng, name: String) -> JobRequest {
    let tenant = format!("tenant-{}", rng.random_range(0..16));
    let roll = rng.random_range(0..100);
    let mut job = match roll {
        0..55 => {
            let mut j = JobRequest::gpus(name, tenant, 1, 1);
            j.gpu_milli = if rng.random_bool(0.5) { 250 } else { 500 };
            j.cpu_milli = 2_000;
            j.memory_mib = 8_192;
            j.kind = job_kind::INFERENCE;
            j
        }
        55..85 => JobRequest::gpus(name, tenant, 1, 1),
        85..92 => JobRequest::gpus(name, tenant, 1, 2),
        92..95 => JobRequest::gpus(name, tenant, 1, 4),
        95..97 => JobRequest::gpus(name, tenant, 1, 8),
        97..98 => JobRequest::gpus(name, tenant, 2, 8),
        _ => {
            let mut j = JobRequest::gpus(name, tenant, 1, 0);
            j.cpu_milli = 8_000;
            j.memory_mib = 32_768;
            j
        }
    };
    job.qos = if roll % 3 == 0 {
        qos::OPPORTUNISTIC
    } else {
        qos::GUARANTEED
    };
    job.estimate_ms = rng.random_range(60_000..36_000_000);
    job
}

fn native_best_fit_driver() -> RoundDriver {
    RoundDriver::with_native(
        Arc::new(PolicySlot::new("empty")),
        Box::new(Runtime::<BestFit>::new()),
    )
    .with_max_decisions(MAX_DECISIONS)
}

/// The PAI cluster `scale` times over: every machine `scale` times, the
/// copies named `<name>~<k>`.
pub fn pai_nodes_scaled(scale: usize) -> Vec<NodeRequest> {
    let base = pai_nodes();
    (0..scale.max(1))
        .flat_map(|k| {
            base.iter().map(move |n| NodeRequest {
                name: if k == 0 {
                    n.name.clone()
                } else {
                    format!("{}~{k}", n.name)
                },
                ..n.clone()
            })
        })
        .collect()
}

/// The PAI-scale scenario, recorded once so that every measured round can
/// start from an identical, freshly built state.
pub struct PaiScenario {
    /// How many times PAI's cluster and job counts.
    pub scale: usize,
    /// Arrivals, completions and previous placements of the measured round's
    /// delta (each [`CHURN`] × scale).
    pub churn: usize,
    pub nodes: Vec<NodeRequest>,
    /// Running jobs in job-index order, with their placements.
    pub running: Vec<(JobRequest, Vec<WorkerPlacement>)>,
    /// Jobs pending before the warm-up round.
    pub pending: Vec<JobRequest>,
    /// Jobs that arrive between the warm-up round and the measured round.
    pub arrivals: Vec<JobRequest>,
    /// Running jobs (by position in `running`) that complete between the two.
    pub completions: Vec<usize>,
}

impl PaiScenario {
    /// Places jobs of the mix with native best-fit until exactly
    /// [`PAI_RUNNING`] run (jobs that do not fit are withdrawn
    /// and replaced by new ones), then records the result.
    pub fn generate() -> PaiScenario {
        Self::generate_scaled(1)
    }

    /// The same at `scale` × the cluster, the running and pending jobs and
    /// the churn.
    pub fn generate_scaled(scale: usize) -> PaiScenario {
        let scale = scale.max(1);
        let nodes = pai_nodes_scaled(scale);
        let churn = CHURN * scale;
        let mut rng = ChaCha8Rng::seed_from_u64(2020);
        let mut state = ClusterState::new();
        for n in &nodes {
            state.add_node(n.clone()).expect("node");
        }
        let mut next = 0usize;
        let mut requests = std::collections::HashMap::new();
        let mut driver = native_best_fit_driver();
        let target = PAI_RUNNING * scale;
        loop {
            let running = state.cluster().running_jobs().count();
            if running >= target {
                break;
            }
            for _ in running..target {
                let req = mixed_job(&mut rng, format!("job-{next:05}"));
                next += 1;
                requests.insert(req.name.clone(), req.clone());
                state.submit(req).expect("submit");
            }
            driver.run_round(&mut state);
            let unplaced: Vec<JobId> = state
                .cluster()
                .pending_jobs()
                .map(|j| state.records()[j.index() as usize].id)
                .collect();
            for id in unplaced {
                state.remove(id).expect("withdraw");
            }
        }
        let running: Vec<(JobRequest, Vec<WorkerPlacement>)> = state
            .cluster()
            .running_jobs()
            .map(|j| {
                (
                    requests[&state.records()[j.index() as usize].name].clone(),
                    j.placement().to_vec(),
                )
            })
            .collect();
        assert_eq!(running.len(), target, "over-placed in the last round");
        let pending = (0..PAI_PENDING * scale)
            .map(|i| mixed_job(&mut rng, format!("pending-{i:05}")))
            .collect();
        let arrivals = (0..churn)
            .map(|i| mixed_job(&mut rng, format!("arrival-{i:05}")))
            .collect();
        let mut completions: Vec<usize> = Vec::new();
        while completions.len() < churn {
            let c = rng.random_range(0..target);
            if !completions.contains(&c) {
                completions.push(c);
            }
        }
        PaiScenario {
            scale,
            churn,
            nodes,
            running,
            pending,
            arrivals,
            completions,
        }
    }

    /// The state with [`PAI_RUNNING`] jobs running and
    /// [`PAI_PENDING`] pending; every event so far closed into past rounds
    /// except the pending submissions.
    pub fn base_state(&self) -> ClusterState {
        let mut state = ClusterState::new();
        for n in &self.nodes {
            state.add_node(n.clone()).expect("node");
        }
        for (req, _) in &self.running {
            state.submit(req.clone()).expect("submit");
        }
        state.begin_round(MAX_DECISIONS);
        let place: Vec<Decision> = self
            .running
            .iter()
            .enumerate()
            .map(|(i, (_, w))| Decision::Place(i as u32, w.clone()))
            .collect();
        state.apply(place).expect("replay placements");
        state.set_now(1_000);
        state.begin_round(MAX_DECISIONS);
        state.set_now(2_000);
        for req in &self.pending {
            state.submit(req.clone()).expect("submit");
        }
        state
    }

    /// Between the warm-up and the measured round: completions and arrivals.
    pub fn churn(&self, state: &mut ClusterState) {
        state.set_now(3_000);
        for &c in &self.completions {
            let id = state
                .job_by_name(&self.running[c].0.name)
                .expect("running job");
            state.remove(id).expect("complete");
        }
        for req in &self.arrivals {
            state.submit(req.clone()).expect("arrive");
        }
    }

    /// A state and a driver ready for the measured round: the driver's
    /// policy mirror is synchronised to the previous round (the warm-up round,
    /// which placed [`CHURN`] jobs), and the churn is waiting as the next
    /// round's delta (previous placements + completions + arrivals), with
    /// [`PAI_RUNNING`] running and [`PAI_PENDING`] pending.
    pub fn ready_round(&self, driver: RoundDriver) -> (ClusterState, RoundDriver) {
        let mut state = self.base_state();
        let mut driver = driver.with_max_decisions(self.churn as u32);
        let warm = driver.run_round(&mut state);
        assert_eq!(
            warm.decisions.len(),
            self.churn,
            "warm-up round placed {:?}",
            warm.served
        );
        assert!(warm.faults.is_empty(), "{:?}", warm.faults);
        self.churn(&mut state);
        let driver = driver.with_max_decisions(MAX_DECISIONS);
        (state, driver)
    }
}

/// Counts of the state, for the result tables.
pub fn describe(state: &ClusterState) -> String {
    let c = state.cluster();
    let gpu_nodes = c.nodes().filter(|n| !n.gpu_range().is_empty()).count();
    format!(
        "{} nodes ({} with GPUs) / {} GPUs, {} running, {} pending, GPU allocation {:.1}%",
        c.node_count(),
        gpu_nodes,
        c.gpu_count(),
        c.running_jobs().count(),
        c.pending_jobs().count(),
        state.gpu_allocation_pct()
    )
}

/// `(VmRSS, VmHWM)` of this process in KiB.
pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Value at quantile `q` (0..=1) of sorted samples.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> T {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Median of durations in milliseconds.
pub fn median_ms(samples: &mut [std::time::Duration]) -> f64 {
    samples.sort();
    quantile(samples, 0.5).as_secs_f64() * 1e3
}

/// `--name value` from the command line (cargo bench passes `--bench` too).
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

pub fn verdict(ok: bool) -> &'static str {
    if ok { "yes" } else { "NO" }
}

/// The engine settings of the benches: the defaults, plus the clock import
/// that components built by newer toolchains' std declare (linked as a
/// trapping stub; the policies never call it).
pub fn runtime_config() -> arbiter_host::runtime::RuntimeConfig {
    arbiter_host::runtime::RuntimeConfig {
        allowed_capabilities: vec!["wasi:clocks/".into()],
        ..Default::default()
    }
}

/// One policy's round as Wasm against the same policy natively, `pairs` times interleaved,
/// each round from a freshly built identical state: the median latencies (ms, Wasm then
/// native) and what `count` says was applied (the same on both sides, asserted).
pub fn wasm_vs_native_rounds(
    pairs: usize,
    build: impl Fn() -> ClusterState,
    wasm: impl Fn() -> RoundDriver,
    native: impl Fn() -> RoundDriver,
    count: impl Fn(&Applied) -> usize,
) -> (f64, f64, usize) {
    let (mut wasm_ms, mut native_ms) = (Vec::new(), Vec::new());
    let mut counts = (0, 0);
    for _ in 0..pairs {
        for is_wasm in [true, false] {
            let mut state = build();
            let mut driver = if is_wasm { wasm() } else { native() };
            let r = driver.run_round(&mut state);
            assert!(r.faults.is_empty(), "{:?}", r.faults);
            assert_eq!(
                matches!(r.served, Served::Active(_)),
                is_wasm,
                "{:?}",
                r.served
            );
            let n = count(&r.applied);
            if is_wasm {
                wasm_ms.push(r.latency);
                counts.0 = n;
            } else {
                native_ms.push(r.latency);
                counts.1 = n;
            }
        }
    }
    assert_eq!(counts.0, counts.1, "Wasm and native decide the same");
    (median_ms(&mut wasm_ms), median_ms(&mut native_ms), counts.0)
}
