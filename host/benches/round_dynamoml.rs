//! Issue 19's performance target: one DynamoML scheduling round at PAI scale
//! — the 1,897 machines of `pai_machine_spec.csv` (6,742 GPUs), 1,000 elastic
//! training jobs (2 workers of 2 GPUs, up to 4 workers) and 100 inference
//! services (1 GPU per replica, up to 12) — with `dynamoml` as Wasm against
//! the same policy compiled natively, in the same run. Target: Wasm ≤ 1.5×
//! native.
//!
//! The measured round follows warm-up rounds (the policy natively, so both
//! sides start from the same state): training has scaled out and filled the
//! cluster, and then 50 services report a surge (request rate 5× what their
//! replicas serve, p99 over the objective), so the round has to grow them,
//! borrowing training workers (never a chief).
//!
//! `cargo bench -p arbiter-host --bench round_dynamoml`

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::RoundDriver;
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, JobTraits};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{ServiceMetric, job_kind};
use policy_dynamoml::DynamoMlPolicy;
use std::sync::Arc;
use std::time::Duration;

const TRAINING_JOBS: u32 = 1_000;
const SERVICES: u32 = 100;
const SURGING: u32 = 50;
const SLO_MS: u32 = 128;
/// What one replica serves at its target load (the policy's default).
const PER_REPLICA: f32 = 20.0;
const WARM_UP_ROUNDS: u32 = 4;
const PAIRS: usize = 7;

fn native_driver() -> RoundDriver {
    RoundDriver::with_native(
        Arc::new(PolicySlot::new("empty")),
        Box::new(Runtime::<DynamoMlPolicy>::new()),
    )
}

fn wasm_driver(compiled: &CompiledPolicy) -> RoundDriver {
    let slot = Arc::new(PolicySlot::new("dynamoml"));
    slot.swap(compiled.clone(), None, None, None)
        .expect("load dynamoml");
    RoundDriver::with_native(slot, Box::new(Runtime::<DynamoMlPolicy>::new()))
}

fn service_metrics(state: &ClusterState, services: &[u32], surge: bool) -> Vec<ServiceMetric> {
    services
        .iter()
        .enumerate()
        .map(|(k, &job)| {
            let replicas = state.cluster().job(job).placement().len().max(1) as f32;
            let hot = surge && (k as u32) < SURGING;
            ServiceMetric {
                job,
                requests_per_s: replicas * PER_REPLICA * if hot { 5.0 } else { 0.9 },
                p50_latency_ms: if hot { 200 } else { 40 },
                p99_latency_ms: if hot { 900 } else { 90 },
            }
        })
        .collect()
}

/// The cluster just before the measured round, built identically each time.
fn before_surge() -> ClusterState {
    let mut state = ClusterState::new();
    for n in common::pai_nodes() {
        if n.gpu_count > 0 {
            state.add_node(n).expect("node");
        }
    }
    let mut services = Vec::new();
    for i in 0..SERVICES {
        let req = JobRequest {
            kind: job_kind::INFERENCE,
            min_workers: 1,
            max_workers: 12,
            ..JobRequest::gpus(format!("svc-{i:03}"), "serving", 2, 1)
        };
        let id = state
            .submit_with(
                req,
                JobTraits {
                    slo_ms: SLO_MS,
                    ..JobTraits::default()
                },
            )
            .expect("service");
        services.push(id);
    }
    for i in 0..TRAINING_JOBS {
        let mut req = JobRequest::gpus(format!("train-{i:04}"), format!("t{}", i % 8), 2, 2);
        req.min_workers = 1;
        req.max_workers = 4;
        req.estimate_ms = 600_000 * u64::from(1 + i % 9);
        req.checkpointed = true;
        state.submit(req).expect("training job");
    }
    let mut driver = native_driver();
    let mut now = 1_000_000;
    for _ in 0..WARM_UP_ROUNDS {
        state.set_now(now);
        let indices: Vec<u32> = services
            .iter()
            .filter_map(|&id| state.job_index(id))
            .collect();
        let metrics = service_metrics(&state, &indices, false);
        state.record_service_metrics(metrics).expect("metrics");
        let r = driver.run_round(&mut state);
        assert!(r.faults.is_empty(), "{:?}", r.faults);
        now += 15_000;
    }
    state.set_now(now);
    let indices: Vec<u32> = services
        .iter()
        .filter_map(|&id| state.job_index(id))
        .collect();
    let metrics = service_metrics(&state, &indices, true);
    state.record_service_metrics(metrics).expect("surge");
    state
}

fn main() {
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(5),
        ..RuntimeConfig::default()
    })
    .expect("engine");
    let compiled = engine
        .compile(arbiter_policies::get("dynamoml").expect("built-in dynamoml"))
        .expect("compile");

    let probe = before_surge();
    let gpus = probe.cluster().gpu_count();
    let running = probe.cluster().running_jobs().count();
    println!(
        "DynamoML round at PAI scale: {gpus} GPUs, {running} jobs running before the surge \
         ({TRAINING_JOBS} elastic training jobs, {SERVICES} services, {SURGING} surging)"
    );
    let (w, n, applied) = common::wasm_vs_native_rounds(
        PAIRS,
        before_surge,
        || wasm_driver(&compiled),
        native_driver,
        |a| a.started.len() + a.resized.len() + a.preempted.len(),
    );
    println!(
        "  {} decisions applied; round (incl. the policy's first sync) wasm p50 {w:.2} ms, \
         native p50 {n:.2} ms: wasm/native {:.2}x (target <= 1.5x): {}",
        applied,
        w / n,
        if w / n <= 1.5 { "met" } else { "NOT met" }
    );
}
