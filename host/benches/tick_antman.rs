//! Issue 17's performance target: one tick of AntMan's local coordinator for a node of
//! 8 GPUs × 8 workloads (one guaranteed and seven opportunistic per GPU) ≤ 1 ms p99, as
//! Wasm through the host core's coordinator driver (the one a node runs), with the same
//! policy compiled natively beside it in the same run.
//!
//! Each tick's view moves like a busy node's: memory in use drifts, the guaranteed jobs'
//! mini-batch times hold most periods and rise now and then (so shares step up and are
//! throttled back), and some opportunistic workloads are refused allocations. The answer
//! is applied to the next view (limits and shares), as the node would.
//!
//! `cargo bench -p arbiter-host --bench tick_antman`

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::coordinator::{ActionRules, CoordinatorDriver};
use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{GpuStatus, NodeAction, NodeView, WorkloadStatus, health, qos};
use policy_antman::AntMan;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GPUS: u32 = 8;
const PER_GPU: u32 = 8;
const TICKS: usize = 3_000;
const PERIOD_MS: u64 = 100;

fn node(n: u64) -> NodeView {
    let gpus = (0..GPUS)
        .map(|index| GpuStatus {
            index,
            utilization_pct: 70,
            sm_activity_pct: 60,
            sm_clock_mhz: 1_410,
            max_sm_clock_mhz: 1_410,
            memory_used_mib: 30_000,
            memory_total_mib: 32_768,
            health: health::HEALTHY,
            observed_ok: true,
            ..GpuStatus::default()
        })
        .collect();
    let workloads = (0..GPUS)
        .flat_map(|gpu| {
            (0..PER_GPU).map(move |k| {
                let guaranteed = k == 0;
                WorkloadStatus {
                    id: gpu * PER_GPU + k,
                    gpu,
                    role: u8::from(!guaranteed),
                    memory_used_mib: if guaranteed { 16_000 } else { 1_500 },
                    memory_limit_mib: 32_768,
                    compute_share: 1000,
                    iteration_ms: if guaranteed { 120 } else { 300 },
                    job: format!("job-{gpu}-{k}"),
                    qos: if guaranteed {
                        qos::GUARANTEED
                    } else {
                        qos::OPPORTUNISTIC
                    },
                    ..WorkloadStatus::default()
                }
            })
        })
        .collect();
    NodeView {
        now_ms: 1_700_000_000_000 + n * PERIOD_MS,
        monotonic_ms: n * PERIOD_MS,
        gpus,
        workloads,
        host_memory_total_mib: 768 * 1024,
        ..NodeView::default()
    }
}

/// Moves `view` one period on: drift, a slow guaranteed job now and then, refusals.
fn advance(view: &mut NodeView, n: u64, rng: &mut ChaCha8Rng) {
    view.now_ms += PERIOD_MS;
    view.monotonic_ms = n * PERIOD_MS;
    for w in &mut view.workloads {
        let drift: i64 = rng.random_range(-256..=256);
        w.memory_used_mib = (i64::from(w.memory_used_mib) + drift)
            .clamp(256, i64::from(w.memory_limit_mib.max(256))) as u32;
        if w.qos == qos::GUARANTEED {
            w.iteration_ms = if rng.random_bool(0.05) { 150 } else { 120 };
        } else if rng.random_bool(0.1) {
            w.quota_denials += 1;
        }
    }
}

fn apply(view: &mut NodeView, actions: &[NodeAction]) {
    for a in actions {
        match *a {
            NodeAction::SetMemoryLimit(w, mib) => {
                if let Some(x) = view.workloads.iter_mut().find(|x| x.id == w) {
                    x.memory_limit_mib = mib;
                }
            }
            NodeAction::SetComputeShare(w, share) => {
                if let Some(x) = view.workloads.iter_mut().find(|x| x.id == w) {
                    x.compute_share = share;
                }
            }
            _ => {}
        }
    }
}

/// Tick latencies of `driver` over the same sequence of views.
fn run(driver: &CoordinatorDriver) -> (Vec<Duration>, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut view = node(0);
    let mut times = Vec::with_capacity(TICKS);
    let mut actions = 0;
    for n in 1..=TICKS as u64 {
        advance(&mut view, n, &mut rng);
        let t = Instant::now();
        let (checked, _, faults, _) = driver.decide(&view);
        times.push(t.elapsed());
        assert!(faults.is_empty(), "{faults:?}");
        actions += checked.actions.len();
        apply(&mut view, &checked.actions);
    }
    times.sort();
    (times, actions)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
    let slot = Arc::new(PolicySlot::new("coordinator"));
    slot.swap(compiled, None, None, None).expect("load antman");
    let wasm = CoordinatorDriver::new(slot, ActionRules::default());
    let native = CoordinatorDriver::new(Arc::new(PolicySlot::new("empty")), ActionRules::default())
        .with_native(Box::new(Runtime::<AntMan>::new()));
    let (w, wasm_actions) = run(&wasm);
    let (n, native_actions) = run(&native);
    assert_eq!(wasm_actions, native_actions, "Wasm and native act the same");
    let q = |v: &[Duration], p: f64| ms(v[((v.len() - 1) as f64 * p).round() as usize]);
    let (wp99, np99) = (q(&w, 0.99), q(&n, 0.99));
    println!(
        "AntMan coordinator tick, {GPUS} GPUs x {PER_GPU} workloads, {TICKS} ticks, \
         {wasm_actions} actions: wasm p50 {:.3} ms p99 {wp99:.3} ms, native p50 {:.3} ms \
         p99 {np99:.3} ms (wasm/native p99 {:.2}x); target p99 <= 1 ms: {}",
        q(&w, 0.5),
        q(&n, 0.5),
        wp99 / np99,
        if wp99 <= 1.0 { "met" } else { "NOT met" }
    );
}
