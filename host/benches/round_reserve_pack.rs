//! Issue 20's performance target: one reserving-and-packing round at PAI scale — the
//! 1,897 machines of `pai_machine_spec.csv` (6,742 GPUs), sharing on, 1,000 jobs pending —
//! with `reserve-pack` as Wasm against the same policy compiled natively, in the same run
//! (target: Wasm ≤ 1.5× native); and its baseline `load-balance` the same way.
//!
//! Before the measured round, warm-up rounds run natively (so both sides start from the
//! same state) place 4,000 jobs of the PAI size mix (about 4,000 run); then 1,000 jobs of
//! the mix arrive over the last 15 minutes, so that the pending jobs sit at every step of
//! R&P's ordered plans (attempt timeouts of 300 s). Two measured rounds: one in operation —
//! the driver ran the round before, so the arrivals reach the policy as a delta (the
//! target) — and the round after a policy swap, which transfers the whole snapshot first.
//!
//! `cargo bench -p arbiter-host --bench round_reserve_pack`

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, RuntimeConfig};
use arbiter_host::state::ClusterState;
use arbiter_policy_sdk::model::SharingRules;
use arbiter_policy_sdk::{Policy, Runtime};
use policy_load_balance::LoadBalance;
use policy_reserve_pack::ReservePack;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Duration;

const WARM_JOBS: u32 = 4_000;
const PENDING: u32 = 1_000;
const WARM_UP_ROUNDS: u32 = 3;
const PAIRS: usize = 7;
const MAX_DECISIONS: u32 = 10_000;
/// The pending jobs arrive over this long before the measured round (ms).
const ARRIVAL_SPREAD_MS: u64 = 900_000;

fn native<P: Policy + Send + 'static>() -> RoundDriver {
    RoundDriver::with_native(
        Arc::new(PolicySlot::new("empty")),
        Box::new(Runtime::<P>::new()),
    )
    .with_max_decisions(MAX_DECISIONS)
}

fn wasm<P: Policy + Send + 'static>(name: &str, compiled: &CompiledPolicy) -> RoundDriver {
    let slot = Arc::new(PolicySlot::new(name));
    slot.swap(compiled.clone(), None, None, None)
        .expect("load the policy");
    RoundDriver::with_native(slot, Box::new(Runtime::<P>::new())).with_max_decisions(MAX_DECISIONS)
}

/// The cluster after the warm-up rounds, built identically each time by
/// `warm_up` (a native driver of the measured policy), before the pending jobs arrive.
fn warm_state(warm_up: &dyn Fn() -> RoundDriver) -> (ClusterState, ChaCha8Rng, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    let mut state = ClusterState::new();
    for n in common::pai_nodes() {
        state.add_node(n).expect("node");
    }
    state
        .set_sharing(SharingRules {
            oversub_milli: 1000,
            max_shared_workers: 4,
            host_spill: false,
        })
        .expect("sharing");
    let mut now = 1_000_000;
    state.set_now(now);
    for i in 0..WARM_JOBS {
        state
            .submit(common::mixed_job(&mut rng, format!("warm-{i:05}")))
            .expect("job");
    }
    let mut driver = warm_up();
    for _ in 0..WARM_UP_ROUNDS {
        state.set_now(now);
        let r = driver.run_round(&mut state);
        assert!(r.faults.is_empty(), "{:?}", r.faults);
        now += 10_000;
    }
    (state, rng, now)
}

/// The measured round's arrivals: 1,000 jobs over the last 15 minutes.
fn arrive(state: &mut ClusterState, rng: &mut ChaCha8Rng, now: u64) {
    for i in 0..PENDING {
        state.set_now(now + ARRIVAL_SPREAD_MS * u64::from(i) / u64::from(PENDING));
        state
            .submit(common::mixed_job(rng, format!("new-{i:05}")))
            .expect("job");
    }
    state.set_now(now + ARRIVAL_SPREAD_MS);
}

/// One measured round, in one of two states of the policy's mirror: `first_sync`, a
/// driver new to the cluster (the round transfers the whole snapshot: the round after a
/// policy swap); otherwise a driver that ran the previous round (the round transfers the
/// arrivals as a delta: every other round).
fn measured_round(
    warm_up: &dyn Fn() -> RoundDriver,
    make: &dyn Fn() -> RoundDriver,
    first_sync: bool,
    wasm: bool,
) -> (Duration, usize) {
    let (mut state, mut rng, now) = warm_state(warm_up);
    let mut driver = make();
    if !first_sync {
        let r = driver.run_round(&mut state);
        assert!(r.faults.is_empty(), "{:?}", r.faults);
    }
    arrive(&mut state, &mut rng, now);
    let r = driver.run_round(&mut state);
    assert!(r.faults.is_empty(), "{:?}", r.faults);
    assert_eq!(
        matches!(r.served, Served::Active(_)),
        wasm,
        "{:?}",
        r.served
    );
    (r.latency, r.applied.started.len())
}

fn measure(
    label: &str,
    warm_up: &dyn Fn() -> RoundDriver,
    wasm: &dyn Fn() -> RoundDriver,
    native: &dyn Fn() -> RoundDriver,
) {
    let (mut probe, mut rng, now) = warm_state(warm_up);
    arrive(&mut probe, &mut rng, now);
    println!("{label} round at PAI scale: {}", common::describe(&probe));
    for first_sync in [false, true] {
        let (mut w, mut n) = (Vec::new(), Vec::new());
        let mut started = (0, 0);
        for _ in 0..PAIRS {
            let (latency, s) = measured_round(warm_up, wasm, first_sync, true);
            w.push(latency);
            started.0 = s;
            let (latency, s) = measured_round(warm_up, native, first_sync, false);
            n.push(latency);
            started.1 = s;
        }
        assert_eq!(started.0, started.1, "Wasm and native start the same jobs");
        let (wm, nm) = (common::median_ms(&mut w), common::median_ms(&mut n));
        println!(
            "  {} ({} jobs started): wasm p50 {wm:.2} ms, native p50 {nm:.2} ms: wasm/native {:.2}x{}",
            if first_sync {
                "round after a swap (the policy's first sync: the whole snapshot)"
            } else {
                "round in operation (the arrivals as a delta)"
            },
            started.0,
            wm / nm,
            if first_sync {
                String::new()
            } else {
                format!(
                    " (target <= 1.5x): {}",
                    if wm / nm <= 1.5 { "met" } else { "NOT met" }
                )
            }
        );
    }
}

fn main() {
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(5),
        ..RuntimeConfig::default()
    })
    .expect("engine");
    let compile = |name: &str| {
        engine
            .compile(arbiter_policies::get(name).expect("built-in"))
            .expect("compile")
    };
    let (rp, lb) = (compile("reserve-pack"), compile("load-balance"));
    measure(
        "reserve-pack",
        &native::<ReservePack>,
        &|| wasm::<ReservePack>("reserve-pack", &rp),
        &native::<ReservePack>,
    );
    measure(
        "load-balance",
        &native::<LoadBalance>,
        &|| wasm::<LoadBalance>("load-balance", &lb),
        &native::<LoadBalance>,
    );
}
