//! Aryl's decision costs (issue 5 targets), Wasm against the same policy
//! compiled natively, in the same run:
//!
//! * a reclaim decision over 500 on-loan servers (target ≤ 3 ms as Wasm; the
//!   paper reports 1–3 ms);
//! * one scheduling round with 3,544 training GPUs, 1,000 queued jobs of which
//!   100 are elastic (target ≤ 20 ms as Wasm).
//!
//! `cargo bench -p arbiter-sim --bench aryl`

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::RoundDriver;
use arbiter_host::runtime::{PolicyEngine, PolicyInstance, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{Decision, ReclaimRequest, WorkerPlacement};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn node(name: String, pool: &str, model: &str, gpus: u32) -> NodeRequest {
    NodeRequest {
        name,
        pool: pool.into(),
        cpu_milli: 96_000,
        memory_mib: 512 * 1024,
        gpu_model: model.into(),
        gpu_memory_mib: 16_384,
        gpu_count: gpus,
        on_loan: false,
    }
}

/// 500 on-loan T4 servers (4 GPUs each), most running training work: single
/// workers, and elastic gangs spanning two to four servers.
fn loaned_cluster() -> anyhow::Result<(ClusterState, Vec<u32>)> {
    let mut s = ClusterState::new();
    let mut nodes = Vec::new();
    for i in 0..500 {
        let name = format!("inf-{i:03}");
        nodes.push(s.add_node(node(name.clone(), "inference", "T4", 4))?);
        s.set_node_loan(&name, true)?;
    }
    let mut decisions = Vec::new();
    let mut n = 0usize;
    let mut k = 0u32;
    while n < 480 {
        let span = 1 + (k % 4) as usize; // servers this job spans
        let span = span.min(500 - n);
        let mut req = JobRequest::gpus(format!("j{k}"), "t", span as u32 * 2, 2);
        req.min_workers = 1;
        req.max_workers = span as u32 * 4;
        let id = s.submit(req)?;
        let index = s
            .job_index(id)
            .ok_or_else(|| anyhow::anyhow!("job index"))?;
        let workers = (0..span)
            .flat_map(|j| {
                let node = nodes[n + j];
                let base = node * 4;
                [
                    WorkerPlacement {
                        node,
                        gpus: vec![base, base + 1],
                    },
                    WorkerPlacement {
                        node,
                        gpus: vec![base + 2, base + 3],
                    },
                ]
            })
            .collect();
        decisions.push(Decision::Place(index, workers));
        n += span;
        k += 1;
    }
    s.seal();
    s.validate(&decisions, u32::MAX)
        .map_err(|(i, e)| anyhow::anyhow!("decision {i}: {e}"))?;
    s.apply(decisions)?;
    s.seal();
    Ok((s, nodes))
}

/// 443 V100 servers (3,544 GPUs) with a quarter busy, and 1,000 queued jobs,
/// 100 of them elastic.
fn queued_cluster() -> anyhow::Result<ClusterState> {
    let mut s = ClusterState::new();
    for i in 0..443 {
        s.add_node(node(format!("train-{i:03}"), "training", "V100", 8))?;
    }
    for i in 0..1000u32 {
        let gpus = [1, 1, 2, 4, 8][(i % 5) as usize];
        let mut req = JobRequest::gpus(format!("q{i}"), "t", 1, gpus);
        req.estimate_ms = 60_000 * u64::from(1 + i % 17);
        if i % 10 == 0 {
            req.workers = 2;
            req.min_workers = 1;
            req.max_workers = 8;
            req.gpus_per_worker = 1;
        }
        s.submit(req)?;
    }
    s.seal();
    Ok(s)
}

fn percentile(mut xs: Vec<Duration>, p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn reclaim_times(
    instance: &mut PolicyInstance,
    state: &ClusterState,
    nodes: &[u32],
) -> anyhow::Result<Vec<Duration>> {
    instance
        .sync_to(state)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut times = Vec::new();
    for r in 0..60 {
        let request = ReclaimRequest {
            epoch: state.epoch(),
            candidates: nodes.to_vec(),
            count: 10 + (r % 5) * 10,
            max_decisions: arbiter_sim::models::aryl::RECLAIM_MAX_DECISIONS,
        };
        let started = Instant::now();
        let plan = instance
            .reclaim(request)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        times.push(started.elapsed());
        anyhow::ensure!(!plan.nodes.is_empty(), "empty reclaim plan");
    }
    Ok(times[10..].to_vec())
}

fn round_times(
    make: &dyn Fn() -> anyhow::Result<RoundDriver>,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let mut times = Vec::new();
    let mut placed = 0;
    for _ in 0..12 {
        let mut state = queued_cluster()?;
        let mut driver = make()?;
        let report = driver.run_round(&mut state);
        anyhow::ensure!(report.faults.is_empty(), "faults: {:?}", report.faults);
        times.push(report.latency);
        placed = report.applied.started.len();
    }
    Ok((times[2..].to_vec(), placed))
}

fn main() -> anyhow::Result<()> {
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(5),
        ..RuntimeConfig::default()
    })?;
    let wasm = arbiter_policies::get("aryl").ok_or_else(|| anyhow::anyhow!("no aryl"))?;
    let compiled = engine.compile(wasm).map_err(|e| anyhow::anyhow!("{e}"))?;

    let (state, nodes) = loaned_cluster()?;
    let mut wasm_instance = compiled.instantiate().map_err(|e| anyhow::anyhow!("{e}"))?;
    wasm_instance
        .configure(&compiled.manifest.default_config)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut native = PolicyInstance::native(Box::new(Runtime::<policy_aryl::ArylPolicy>::new()));
    let w = reclaim_times(&mut wasm_instance, &state, &nodes)?;
    let n = reclaim_times(&mut native, &state, &nodes)?;
    let (w50, w99, n50) = (
        percentile(w.clone(), 0.5),
        percentile(w, 0.99),
        percentile(n, 0.5),
    );
    println!("reclaim over 500 on-loan servers (10-50 servers asked):");
    println!(
        "  wasm p50 {:.3} ms p99 {:.3} ms; native p50 {:.3} ms; wasm/native {:.2}x (target: wasm <= 3 ms)",
        w50.as_secs_f64() * 1e3,
        w99.as_secs_f64() * 1e3,
        n50.as_secs_f64() * 1e3,
        w50.as_secs_f64() / n50.as_secs_f64()
    );

    let wasm_driver = || -> anyhow::Result<RoundDriver> {
        let slot = Arc::new(PolicySlot::new("aryl"));
        slot.swap(compiled.clone(), None, None, None)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(RoundDriver::new(slot))
    };
    let native_driver = || -> anyhow::Result<RoundDriver> {
        Ok(RoundDriver::with_native(
            Arc::new(PolicySlot::new("empty")),
            Box::new(Runtime::<policy_aryl::ArylPolicy>::new()),
        ))
    };
    let (w, placed) = round_times(&wasm_driver)?;
    let (n, _) = round_times(&native_driver)?;
    let (w50, w99, n50) = (
        percentile(w.clone(), 0.5),
        percentile(w, 0.99),
        percentile(n, 0.5),
    );
    println!("scheduling round, 3,544 training GPUs, 1,000 queued (100 elastic), {placed} placed:");
    println!(
        "  wasm p50 {:.2} ms p99 {:.2} ms; native p50 {:.2} ms; wasm/native {:.2}x (target: wasm <= 20 ms)",
        w50.as_secs_f64() * 1e3,
        w99.as_secs_f64() * 1e3,
        n50.as_secs_f64() * 1e3,
        w50.as_secs_f64() / n50.as_secs_f64()
    );
    Ok(())
}
