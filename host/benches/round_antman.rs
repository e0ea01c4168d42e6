//! Issue 17's performance target: one AntMan scheduling round at PAI scale — the 1,897
//! machines of `pai_machine_spec.csv` (6,742 GPUs), sharing on with host spill, eight
//! tenants with quotas (together 70 % of the GPUs) and one without — with `antman` as Wasm
//! against the same policy compiled natively, in the same run. Target: Wasm ≤ 1.5× native.
//!
//! The measured round follows warm-up rounds run natively (so both sides start from the
//! same state) that placed 3,000 jobs of the PAI size mix; then every GPU reports its
//! utilization (a quarter above AntMan's M = 80 %) and 1,000 jobs arrive: two thirds
//! guaranteed gangs (some too large for what is free: reservations), a third opportunistic.
//!
//! `cargo bench -p arbiter-host --bench round_antman`

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::RoundDriver;
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{GpuMetric, SharingRules, qos};
use policy_antman::AntMan;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Duration;

const WARM_JOBS: u32 = 3_000;
const PENDING: u32 = 1_000;
const WARM_UP_ROUNDS: u32 = 3;
const PAIRS: usize = 7;
const MAX_DECISIONS: u32 = 10_000;

fn native_driver() -> RoundDriver {
    RoundDriver::with_native(
        Arc::new(PolicySlot::new("empty")),
        Box::new(Runtime::<AntMan>::new()),
    )
    .with_max_decisions(MAX_DECISIONS)
}

fn wasm_driver(compiled: &CompiledPolicy) -> RoundDriver {
    let slot = Arc::new(PolicySlot::new("antman"));
    slot.swap(compiled.clone(), None, None, None)
        .expect("load antman");
    RoundDriver::with_native(slot, Box::new(Runtime::<AntMan>::new()))
        .with_max_decisions(MAX_DECISIONS)
}

/// A job of AntMan's world: whole-GPU gangs of 1, 2, 4 or 8 GPUs (one worker per GPU
/// beyond one node's eight: 2 × 8), a third of the no-quota tenant's as opportunistic.
fn job(rng: &mut ChaCha8Rng, name: String) -> JobRequest {
    let tenant = rng.random_range(0..9);
    let (workers, per) = match rng.random_range(0..100) {
        0..50 => (1, 1),
        50..75 => (1, 2),
        75..90 => (1, 4),
        90..97 => (1, 8),
        _ => (2, 8),
    };
    let mut j = JobRequest::gpus(name, format!("tenant-{tenant}"), workers, per);
    j.qos = if tenant == 8 {
        qos::OPPORTUNISTIC
    } else {
        qos::GUARANTEED
    };
    j.gpu_memory_mib = rng.random_range(2_048..16_384);
    j.estimate_ms = rng.random_range(600_000..36_000_000);
    j
}

/// The cluster just before the measured round, built identically each time.
fn before_round() -> ClusterState {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut state = ClusterState::new();
    for n in common::pai_nodes() {
        if n.gpu_count > 0 {
            state.add_node(n).expect("node");
        }
    }
    state
        .set_sharing(SharingRules {
            oversub_milli: 1000,
            max_shared_workers: 4,
            host_spill: true,
        })
        .expect("sharing");
    let gpus = state.cluster().gpu_count() as u32;
    for t in 0..8 {
        state
            .set_tenant_quota(&format!("tenant-{t}"), Some(gpus * 7 / 80))
            .expect("quota");
    }
    state.set_tenant_quota("tenant-8", Some(0)).expect("quota");
    for i in 0..WARM_JOBS {
        state
            .submit(job(&mut rng, format!("warm-{i:05}")))
            .expect("job");
    }
    let mut driver = native_driver();
    let mut now = 1_000_000;
    for _ in 0..WARM_UP_ROUNDS {
        state.set_now(now);
        let r = driver.run_round(&mut state);
        assert!(r.faults.is_empty(), "{:?}", r.faults);
        now += 10_000;
    }
    let metrics = (0..gpus)
        .map(|gpu| GpuMetric {
            gpu,
            utilization_pct: rng.random_range(0..=100),
            ..GpuMetric::default()
        })
        .collect();
    state.record_gpu_metrics(metrics).expect("metrics");
    for i in 0..PENDING {
        state
            .submit(job(&mut rng, format!("new-{i:05}")))
            .expect("job");
    }
    state.set_now(now);
    state
}

fn main() {
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(5),
        ..RuntimeConfig::default()
    })
    .expect("engine");
    let compiled = engine
        .compile(arbiter_policies::get("antman").expect("built-in antman"))
        .expect("compile");

    let probe = before_round();
    let gpus = probe.cluster().gpu_count();
    let running = probe.cluster().running_jobs().count();
    let pending = probe.cluster().pending_jobs().count();
    println!(
        "AntMan round at PAI scale: {gpus} GPUs, {running} jobs running, {pending} pending \
         (8 tenants with quotas, one opportunistic)"
    );
    let (w, n, applied) = common::wasm_vs_native_rounds(
        PAIRS,
        before_round,
        || wasm_driver(&compiled),
        native_driver,
        |a| a.started.len() + a.qos_changed.len(),
    );
    println!(
        "  {} starts and QoS changes applied; round (incl. the policy's first sync) wasm p50 \
         {w:.2} ms, native p50 {n:.2} ms: wasm/native {:.2}x (target <= 1.5x): {}",
        applied,
        w / n,
        if w / n <= 1.5 { "met" } else { "NOT met" }
    );
}
