//! The FGD protocol's rules as the reference simulator has them, on small
//! hand-made scenarios: the task list (name order, shuffle, tuning up with
//! draws with replacement and the per-GPU stop check, tuning down by random
//! removals), unplaceable tasks kept, and the allocation binned by arrived load.

use arbiter_host::state::{JobRequest, NodeRequest};
use arbiter_policy_sdk::model::{job_kind, qos};
use arbiter_sim::SimTask;
use arbiter_sim::models::fgd::{AllocBuckets, trace_tasks, tuned_tasks};
use arbiter_sim::scenario::{Scenario, Source};

fn task(name: &str, gpus: u32, milli: u32, file_index: usize) -> SimTask {
    SimTask {
        request: JobRequest {
            name: name.into(),
            tenant: "default".into(),
            kind: job_kind::TRAINING,
            qos: qos::GUARANTEED,
            priority: 0,
            workers: 1,
            min_workers: 1,
            max_workers: 1,
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus_per_worker: gpus,
            gpu_milli: milli,
            gpu_memory_mib: 0,
            gpu_models: Vec::new(),
            estimate_ms: 0,
            deadline_ms: 0,
            checkpointed: true,
        },
        arrival_ms: 0,
        duration_ms: None,
        file_index,
    }
}

/// Two 8-GPU nodes (16,000 milli-GPU) and tasks given as (name, GPUs, milli).
fn scenario(tasks: &[(&str, u32, u32)]) -> Scenario {
    let node = |name: &str| NodeRequest {
        name: name.into(),
        pool: "default".into(),
        cpu_milli: 96_000,
        memory_mib: 786_432,
        gpu_model: "V100".into(),
        gpu_memory_mib: 32_000,
        gpu_count: 8,
        on_loan: false,
    };
    Scenario {
        name: "hand-made".into(),
        source: Source::Openb,
        nodes: vec![node("n0"), node("n1")],
        tasks: tasks
            .iter()
            .enumerate()
            // File order deliberately not name order.
            .map(|(i, &(name, gpus, milli))| task(name, gpus, milli, tasks.len() - i))
            .collect(),
        rejected: Vec::new(),
        unplaceable: Vec::new(),
    }
    .finish()
    .expect("scenario")
}

fn total(tasks: &[arbiter_sim::models::fgd::ProtocolTask<'_>]) -> u64 {
    tasks.iter().map(|t| t.task.gpu_milli_total()).sum()
}

#[test]
fn tuning_up_appends_draws_with_replacement_and_stops_on_the_per_gpu_check() {
    // 4,000 milli-GPU of 16,000: tuning to 1.3 needs copies.
    let s = scenario(&[("c", 1, 500), ("a", 2, 1000), ("b", 0, 0), ("d", 1, 500)]);
    let target = 16_000.0 * 1.3;
    for seed in 0..50 {
        let list = tuned_tasks(&s, seed, 1.3);
        // The trace itself first, once each, shuffled.
        let mut head: Vec<&str> = list[..4]
            .iter()
            .map(|t| t.task.request.name.as_str())
            .collect();
        head.sort_unstable();
        assert_eq!(head, ["a", "b", "c", "d"], "seed {seed}");
        // Then copies of trace tasks, until the next draw's per-GPU milli
        // would pass the target: the total is at most the target plus what
        // a multi-GPU task adds beyond its per-GPU check (1,000 here).
        let sum = total(&list) as f64;
        assert!(sum <= target + 1000.0, "seed {seed}: {sum}");
        assert!(sum > target - 1000.0, "seed {seed}: stopped early at {sum}");
    }
    // Draws are with replacement and depend on the seed.
    let lists: Vec<usize> = (0..20)
        .map(|seed| tuned_tasks(&s, seed, 1.3).len())
        .collect();
    assert!(lists.iter().any(|&n| n != lists[0]), "{lists:?}");
}

#[test]
fn tuning_down_removes_tasks_until_at_or_under_the_target() {
    let names: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
    let tasks: Vec<(&str, u32, u32)> = names.iter().map(|n| (n.as_str(), 1, 1000)).collect();
    // 40 whole GPUs on 16: tuning to 1.3 keeps at most 20,800 milli.
    let s = scenario(&tasks);
    for seed in 0..20 {
        let list = tuned_tasks(&s, seed, 1.3);
        assert_eq!(total(&list), 20_000, "seed {seed}");
        let mut seen: Vec<&str> = list.iter().map(|t| t.task.request.name.as_str()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 20, "removals take distinct tasks");
    }
}

#[test]
fn a_task_no_node_can_hold_stays_in_the_list() {
    // A 9-GPU task on 8-GPU nodes, and one that needs a model nobody has.
    let mut s = scenario(&[("a", 1, 500), ("b", 1, 1000)]);
    let mut big = task("huge", 9, 1000, 9);
    big.request.workers = 1;
    let mut foreign = task("foreign", 1, 1000, 10);
    foreign.request.gpu_models = vec!["H100".into()];
    s.tasks.push(big);
    s.tasks.push(foreign);
    let s = s.finish().expect("scenario");
    assert_eq!(s.rejected.len(), 2);
    assert_eq!(s.unplaceable.len(), 2);
    // As given: the model constraint is intact.
    let kept = s
        .unplaceable
        .iter()
        .find(|t| t.request.name == "foreign")
        .expect("kept");
    assert_eq!(kept.request.gpu_models, ["H100"]);
    let all = trace_tasks(&s);
    let names: Vec<(&str, bool)> = all
        .iter()
        .map(|t| (t.task.request.name.as_str(), t.placeable))
        .collect();
    assert_eq!(
        names,
        [
            ("a", true),
            ("b", true),
            ("foreign", false),
            ("huge", false)
        ]
    );
}

#[test]
fn the_allocation_at_x_is_the_mean_of_its_bucket() {
    let mut b = AllocBuckets::default();
    // Capacity 1,000: rows at arrived 99.4 % (bucket 99), 99.5 % (100: half
    // to even), 100.4 % (100), 100.5 % (100: half to even), 101 %.
    b.record(994, 900, 1000);
    b.record(995, 910, 1000);
    b.record(1004, 920, 1000);
    b.record(1005, 930, 1000);
    b.record(1010, 940, 1000);
    assert_eq!(b.at(100), 92.0);
    assert_eq!(b.at(99), 90.0);
    // An empty bucket takes its neighbours: 102 has none, 101 and 103 → 101's.
    assert_eq!(b.at(102), 94.0);
    assert!(b.at(110).is_nan());
}
