//! The FGD paper's protocol on the openb trace, run natively through the SDK
//! `Runtime` (no host): shuffle the tasks, repeat them until the GPU request
//! is 1.3 × the cluster's GPUs, place them one per round without departures,
//! and record the GPU allocation ratio when the arrived GPU request reaches
//! 100% and 130% of capacity. One seed per policy; prints the numbers beside
//! the published means of 10 seeds.
//!
//! Ignored by default (a release build runs all six in seconds, a debug
//! build much longer):
//! `cargo test --release -p arbiter-placement-core --test openb_protocol -- --ignored --nocapture`

use std::time::Instant;

use arbiter_placement_core::{
    DEFAULT_POPULARITY, SplitMix64, TargetWorkload, TaskShape, fgd_config,
};
use arbiter_policy_sdk::Cluster;
use arbiter_policy_sdk::prelude::*;
use arbiter_traces::openb::{self, OpenbNode, OpenbPod};
use arbiter_traces::{GpuModel, trace_file};

/// GPU memory given to every openb GPU: a multiple of 1000 MiB, so that the
/// proportional GPU memory of a sharing task (`gpu_memory_mib = 0`) is exact
/// and memory never binds before milli-GPU does (openb has no GPU memory per task).
const GPU_MEMORY_MIB: u32 = 32_000;
const TUNE_RATIO: f64 = 1.3;

struct Outcome {
    at_100: f64,
    at_130: f64,
    placed: usize,
    failed: usize,
    seconds: f64,
}

struct Setup {
    cluster: Cluster,
    masks: Vec<(GpuModel, u64)>,
    capacity_milli: u64,
}

fn setup(nodes: &[OpenbNode]) -> Setup {
    let mut tc = TestCluster::new();
    for node in nodes {
        let model = node.gpu_model.map_or("", GpuModel::as_str);
        tc.node(
            &node.name,
            "default",
            node.cpu_milli,
            node.memory_mib,
            model,
            GPU_MEMORY_MIB,
            node.gpu_count,
        );
    }
    let masks = GpuModel::ALL
        .into_iter()
        .map(|m| (m, tc.model_mask(&[m.as_str()])))
        .collect();
    tc.intern("task");
    Setup {
        cluster: tc.cluster().clone(),
        masks,
        capacity_milli: openb::total_gpus(nodes) * 1000,
    }
}

/// The tuned task list: shuffled with `seed`, repeated until 1.3 × capacity.
fn tune(pods: &[OpenbPod], capacity_milli: u64, seed: u64) -> Vec<OpenbPod> {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    let target = (capacity_milli as f64 * TUNE_RATIO) as u64;
    let mut out = Vec::new();
    let mut total = 0u64;
    for &i in order.iter().cycle() {
        if total >= target {
            break;
        }
        total += pods[i].total_gpu_milli();
        out.push(pods[i].clone());
    }
    out
}

fn shape(pod: &OpenbPod) -> TaskShape {
    TaskShape {
        cpu_milli: pod.cpu_milli,
        num_gpu: pod.num_gpu,
        gpu_milli: pod.gpu_milli,
        gpu_models: pod
            .gpu_spec
            .iter()
            .map(|m| m.as_str().to_string())
            .collect(),
    }
}

fn run<P: Policy>(setup: &Setup, tasks: &[OpenbPod], config: &str) -> Outcome {
    let start = Instant::now();
    let mut host = setup.cluster.clone();
    let mut runtime = Runtime::<P>::new();
    runtime.configure(config).expect("configure");
    runtime.resync(host.to_snapshot()).expect("resync");
    let mut pending_events: Vec<Event> = Vec::new();
    let mut arrived = 0u64;
    let (mut at_100, mut placed, mut failed) = (None, 0, 0);
    for (i, pod) in tasks.iter().enumerate() {
        let mask = pod
            .gpu_spec
            .iter()
            .map(|m| {
                setup
                    .masks
                    .iter()
                    .find(|(x, _)| *x == m)
                    .map_or(0, |(_, b)| *b)
            })
            .fold(0, |a, b| a | b);
        let spec = JobSpec {
            name: 0,
            tenant: 0,
            workers: 1,
            min_workers: 1,
            max_workers: 1,
            cpu_milli: pod.cpu_milli,
            memory_mib: pod.memory_mib,
            gpus_per_worker: pod.num_gpu,
            gpu_milli: pod.gpu_milli,
            gpu_memory_mib: 0,
            gpu_model_mask: mask,
            submit_ms: i as u64,
            ..JobSpec::default()
        };
        let added = Event::JobAdded(spec);
        host.apply_event(&added).expect("job added");
        pending_events.push(added);
        let epoch = host.epoch() + 1;
        let delta = Delta {
            base_epoch: host.epoch(),
            epoch,
            now_ms: i as u64,
            events: std::mem::take(&mut pending_events),
        };
        runtime.apply(&delta).expect("apply");
        host.set_epoch(epoch, i as u64);
        let decisions = runtime
            .schedule(RoundInfo {
                epoch,
                now_ms: i as u64,
                max_decisions: 1,
            })
            .expect("schedule");
        let job = host.job_count() as u32 - 1;
        let event = match decisions.into_iter().next() {
            Some(decision @ Decision::Place(..)) => {
                // The host's validator: replay through a Plan of the host's state.
                Plan::new(&host)
                    .apply(decision.clone())
                    .expect("valid decision");
                let Decision::Place(j, workers) = decision else {
                    unreachable!()
                };
                assert_eq!(j, job);
                placed += 1;
                Event::JobPlaced(j, workers)
            }
            Some(other) => panic!("unexpected decision {other:?}"),
            None => {
                failed += 1;
                Event::JobRemoved(job)
            }
        };
        host.apply_event(&event).expect("outcome");
        pending_events.push(event);
        arrived += pod.total_gpu_milli();
        if at_100.is_none() && arrived >= setup.capacity_milli {
            at_100 = Some(allocation(&host, setup.capacity_milli));
        }
    }
    Outcome {
        at_100: at_100.unwrap_or(f64::NAN),
        at_130: allocation(&host, setup.capacity_milli),
        placed,
        failed,
        seconds: start.elapsed().as_secs_f64(),
    }
}

fn allocation(host: &Cluster, capacity_milli: u64) -> f64 {
    let used: u64 = host
        .gpu_columns()
        .milli_used
        .iter()
        .map(|&m| u64::from(m))
        .sum();
    100.0 * used as f64 / capacity_milli as f64
}

#[test]
#[ignore = "replays ~10k placements per policy on the openb trace; run in release"]
fn openb_default_one_seed_per_policy() {
    let nodes_rel =
        std::env::var("OPENB_NODES").unwrap_or_else(|_| openb::GPU_NODES_FILE.to_string());
    let nodes_file =
        trace_file(&nodes_rel).unwrap_or_else(|e| panic!("this test needs the openb trace: {e}"));
    let nodes = openb::load_nodes(nodes_file).expect("nodes");
    let pods = openb::load_pods(trace_file("openb/openb_pod_list_default.csv").expect("pods"))
        .expect("pods");
    let setup = setup(&nodes);
    let seed = 42;
    let tasks = tune(&pods, setup.capacity_milli, seed);
    let popularity: f64 = std::env::var("POPULARITY")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_POPULARITY);
    // M from the trace as given, before tuning (the reference's `SetTypicalPods`).
    let workload = TargetWorkload::from_tasks(pods.iter().map(shape), popularity);
    let fgd = fgd_config(&workload, seed);
    let fgd_exact = format!("exact = true\n{fgd}");
    let common = format!("seed = {seed}\n");
    println!(
        "openb default: {} nodes, {} GPUs, {} tasks after tuning, {} target classes",
        nodes.len(),
        setup.capacity_milli / 1000,
        tasks.len(),
        workload.classes().len()
    );
    println!("policy          alloc@100%  (paper)  alloc@130%  (paper)  placed failed  seconds");
    let rows: Vec<(&str, f64, f64, Outcome)> = vec![
        (
            "Random",
            86.30,
            87.47,
            run::<policy_random::RandomPlacement>(&setup, &tasks, &common),
        ),
        (
            "DotProd",
            90.62,
            90.85,
            run::<policy_dot_product::DotProduct>(&setup, &tasks, &common),
        ),
        (
            "GpuClustering",
            91.65,
            91.88,
            run::<policy_gpu_clustering::GpuClustering>(&setup, &tasks, &common),
        ),
        (
            "GpuPacking",
            91.78,
            92.00,
            run::<policy_gpu_packing::GpuPacking>(&setup, &tasks, &common),
        ),
        (
            "BestFit",
            92.86,
            93.08,
            run::<policy_fgd_best_fit::FgdBestFit>(&setup, &tasks, &common),
        ),
        (
            "FGD",
            95.23,
            95.39,
            run::<policy_fgd::Fgd>(&setup, &tasks, &fgd),
        ),
        (
            "FGD (exact)",
            95.23,
            95.39,
            run::<policy_fgd::Fgd>(&setup, &tasks, &fgd_exact),
        ),
    ];
    for (name, p100, p130, o) in &rows {
        println!(
            "{name:<14} {:>10.2}  {p100:>7.2}  {:>10.2}  {p130:>7.2}  {:>6} {:>6}  {:>7.2}",
            o.at_100, o.at_130, o.placed, o.failed, o.seconds
        );
    }
    for (name, _, _, o) in &rows {
        assert!(o.at_130 >= o.at_100 - 1e-9, "{name}: allocation went down");
    }
}
