//! Issue 2, target 3: a runaway policy is stopped within 2× its deadline.
//!
//! The `misbehave` fixture in `mode = loop` spins forever in `schedule`. For
//! deadlines of 10, 50 and 100 ms this measures the time from the start of
//! `PolicyInstance::schedule` to its `PolicyFault::Deadline`, on a fresh
//! instance each time (an interrupted instance is never re-entered).
//!
//! `cargo bench -p arbiter-host --bench runaway`

mod common;

use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, PolicyFault, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::model::RoundInfo;
use common::{quantile, verdict};
use criterion::{Criterion, SamplingMode};
use std::time::{Duration, Instant};

const DEADLINES_MS: [u64; 3] = [10, 50, 100];
const TRIALS: usize = 20;

fn cluster() -> (ClusterState, RoundInfo) {
    let mut s = ClusterState::new();
    for i in 0..4 {
        s.add_node(NodeRequest {
            name: format!("n{i}"),
            pool: "gpu".into(),
            cpu_milli: 64_000,
            memory_mib: 512_000,
            gpu_model: "V100".into(),
            gpu_memory_mib: 32_768,
            gpu_count: 4,
            on_loan: false,
        })
        .expect("node");
    }
    s.submit(JobRequest::gpus("j", "t", 1, 1)).expect("submit");
    let (_, round) = s.begin_round(100);
    (s, round)
}

/// One runaway call on a fresh instance: time from call start to the fault.
fn runaway(
    compiled: &CompiledPolicy,
    state: &ClusterState,
    round: RoundInfo,
    deadline: Duration,
) -> Duration {
    let mut inst = compiled.instantiate().expect("instantiate");
    inst.configure("mode = loop").expect("configure");
    inst.sync_to(state).expect("sync");
    let t = Instant::now();
    let r = inst.schedule(round);
    let dt = t.elapsed();
    assert_eq!(
        r,
        Err(PolicyFault::Deadline(deadline)),
        "a looping policy must hit its deadline"
    );
    dt
}

fn main() {
    let (state, round) = cluster();
    let mut c = Criterion::default().configure_from_args();
    let mut rows = Vec::new();
    let mut failed = false;
    for ms in DEADLINES_MS {
        let deadline = Duration::from_millis(ms);
        let engine = PolicyEngine::new(RuntimeConfig {
            deadline,
            ..common::runtime_config()
        })
        .expect("engine");
        let compiled = engine
            .compile(arbiter_policies::fixture("misbehave").expect("fixture"))
            .expect("compile");
        {
            let mut g = c.benchmark_group("runaway_loop");
            g.sampling_mode(SamplingMode::Flat)
                .sample_size(10)
                .warm_up_time(Duration::from_millis(500));
            g.measurement_time(deadline * 30);
            g.bench_function(format!("deadline_{ms}ms"), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| runaway(&compiled, &state, round, deadline))
                        .sum()
                })
            });
            g.finish();
        }
        let mut samples: Vec<Duration> = (0..TRIALS)
            .map(|_| runaway(&compiled, &state, round, deadline))
            .collect();
        samples.sort();
        let p50 = quantile(&samples, 0.5);
        let max = *samples.last().expect("samples");
        let ratio = max.as_secs_f64() / deadline.as_secs_f64();
        failed |= ratio > 2.0;
        rows.push(format!(
            "| {ms} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2}× (p50 {:.2}×) | ≤ 2× | {} |",
            samples[0].as_secs_f64() * 1e3,
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            ratio,
            p50.as_secs_f64() / deadline.as_secs_f64(),
            verdict(ratio <= 2.0)
        ));
    }
    c.final_summary();
    println!();
    println!(
        "## runaway: `misbehave` `mode = loop`, call start → `PolicyFault::Deadline` ({TRIALS} trials each, epoch tick 1 ms)"
    );
    println!();
    println!("| deadline | min | p50 | max | max / deadline | target | met |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    if failed {
        eprintln!("runaway: a target was missed");
        std::process::exit(1);
    }
}
