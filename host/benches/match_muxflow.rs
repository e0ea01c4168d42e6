//! Issue 18's performance target: one MuxFlow matching of 1,000 online × 1,000 offline
//! workloads as Wasm (through the host core's `MatcherDriver`, its sync included) against the
//! same policy compiled natively (resync + match), in the same run. Targets: Wasm ≤ 1.5×
//! native and ≤ 1 s.
//!
//! The cluster: 125 nodes × 8 GPUs, sharing on with soft offline memory; 1,000 one-GPU
//! online services running, one per GPU, with random utilization and SM activity (all GPUs
//! healthy, so every (offline, GPU) pair is an edge: a dense 1,000 × 1,000 matrix); 1,000
//! one-GPU offline jobs waiting, with random profiles.
//!
//! `cargo bench --profile dev -p arbiter-host --bench match_muxflow`

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::matcher::MatcherDriver;
use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{
    Decision, MatchRequest, SharingRules, WorkerPlacement, WorkloadProfile, qos,
};
use common::median_ms;
use policy_muxflow::MuxFlow;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODES: u32 = 125;
const PAIRS: usize = 5;

/// The cluster, the online and offline job indices, and their profiles.
fn cluster() -> (ClusterState, Vec<u32>, Vec<u32>, Vec<WorkloadProfile>) {
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    let mut state = ClusterState::new();
    for n in 0..NODES {
        state
            .add_node(NodeRequest::gpus(
                format!("t4-{n:03}"),
                "gpu",
                "T4",
                16_384,
                8,
            ))
            .expect("node");
    }
    state
        .set_sharing(SharingRules {
            oversub_milli: 1000,
            max_shared_workers: 1,
            // A whole-GPU guaranteed worker is charged the GPU's whole memory: offline work
            // joins it only as soft (spillable) memory, MuxFlow's 40 % quota on the node.
            host_spill: true,
        })
        .expect("sharing");
    let gpus = NODES * 8;
    let mut online = Vec::new();
    for g in 0..gpus {
        let mut req = JobRequest::gpus(format!("svc-{g:04}"), "online", 1, 1);
        req.gpu_memory_mib = 6_144;
        state.submit(req).expect("service");
    }
    state.seal();
    let decisions = (0..gpus)
        .map(|g| {
            Decision::Place(
                g,
                vec![WorkerPlacement {
                    node: g / 8,
                    gpus: vec![g],
                }],
            )
        })
        .collect::<Vec<_>>();
    let (kept, dropped) = state.keep_valid(decisions, gpus);
    assert!(dropped.is_empty(), "{dropped:?}");
    state.apply(kept).expect("place the services");
    online.extend(0..gpus);
    let mut offline = Vec::new();
    for i in 0..gpus {
        let mut req = JobRequest::gpus(format!("train-{i:04}"), "offline", 1, 1);
        req.qos = qos::OPPORTUNISTIC;
        req.gpu_memory_mib = 4_096;
        state.submit(req).expect("training");
    }
    state.seal();
    offline.extend(gpus..2 * gpus);
    let profiles = online
        .iter()
        .chain(&offline)
        .map(|&job| WorkloadProfile {
            job,
            utilization_pct: rng.random_range(5..95),
            sm_activity_pct: rng.random_range(5..90),
            memory_mib: rng.random_range(1_024..8_192),
            sm_occupancy_pct: rng.random_range(5..60),
            solo_iteration_ms: rng.random_range(50..500),
            ..WorkloadProfile::default()
        })
        .collect();
    (state, online, offline, profiles)
}

fn main() {
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(10),
        ..RuntimeConfig::default()
    })
    .expect("engine");
    let (mut state, online, offline, profiles) = cluster();
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    let mut pairs = (0, 0);
    let compiled = engine
        .compile(arbiter_policies::get("muxflow").expect("built-in muxflow"))
        .expect("compile");
    for _ in 0..PAIRS {
        let slot = Arc::new(PolicySlot::new("matcher"));
        slot.swap(compiled.clone(), None, None, None)
            .expect("load muxflow");
        let driver = MatcherDriver::new(slot);
        let t = Instant::now();
        let out = driver.match_workloads(&mut state, &online, &offline, profiles.clone());
        wasm.push(t.elapsed());
        assert!(out.faults.is_empty(), "{:?}", out.faults);
        pairs.0 = out.pairings.len();

        let t = Instant::now();
        let mut rt = Runtime::<MuxFlow>::new();
        rt.resync(state.snapshot()).expect("resync");
        let answer = rt
            .match_workloads(MatchRequest {
                epoch: state.epoch(),
                online: online.clone(),
                offline: offline.clone(),
                profiles: profiles.clone(),
            })
            .expect("native match");
        native.push(t.elapsed());
        pairs.1 = answer.len();
    }
    assert_eq!(pairs.0, pairs.1, "Wasm and native pair the same number");
    let (w, n) = (median_ms(&mut wasm), median_ms(&mut native));
    println!(
        "MuxFlow matching, {} online x {} offline, {} pairings: wasm p50 {w:.1} ms, native p50 \
         {n:.1} ms: wasm/native {:.2}x (target <= 1.5x: {}), wasm <= 1 s: {}",
        online.len(),
        offline.len(),
        pairs.0,
        w / n,
        if w / n <= 1.5 { "met" } else { "NOT met" },
        if w <= 1_000.0 { "met" } else { "NOT met" }
    );
}
