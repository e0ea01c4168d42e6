//! Properties of the round planner: its incremental per-node aggregates
//! always equal a recomputation, and nothing it accepts overcommits.

use arbiter_policy_sdk::prelude::*;
use proptest::prelude::*;

fn check_aggregates(plan: &Plan<'_>) {
    let cluster = plan.cluster();
    for node in cluster.nodes() {
        let n = node.index();
        let free: u32 = node.gpu_range().map(|g| plan.free_milli(g)).sum();
        let idle = node
            .gpu_range()
            .filter(|&g| {
                plan.free_milli(g) == FULL_GPU_MILLI
                    && plan.free_gpu_memory(g) == cluster.gpu(g).memory_mib()
            })
            .count() as u32;
        assert_eq!(plan.node_free_milli(n), free, "free milli of node {n}");
        assert_eq!(plan.node_idle_gpus(n), idle, "idle GPUs of node {n}");
        for g in node.gpu_range() {
            assert!(plan.free_milli(g) <= FULL_GPU_MILLI);
        }
    }
}

/// The mirror's node index (`jobs_on`) equals the inverse of the jobs'
/// placements, each job once per node.
fn check_node_index(cluster: &Cluster) {
    for node in cluster.nodes() {
        let n = node.index();
        let mut indexed: Vec<u32> = cluster.jobs_on(n).map(|j| j.index()).collect();
        let mut expected: Vec<u32> = cluster
            .jobs()
            .filter(|j| j.placement().iter().any(|w| w.node == n))
            .map(|j| j.index())
            .collect();
        let listed = indexed.len();
        indexed.sort_unstable();
        indexed.dedup();
        assert_eq!(listed, indexed.len(), "a job listed twice on node {n}");
        expected.sort_unstable();
        assert_eq!(indexed, expected, "jobs on node {n}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn aggregates_track_every_change(
        nodes in prop::collection::vec((1u32..=8, 0usize..2), 1..6),
        jobs in prop::collection::vec((1u32..=3, 1u32..=4, prop::sample::select(vec![250u32, 500, 1000])), 1..24),
        preempt_mask in any::<u64>(),
    ) {
        let mut c = TestCluster::new();
        for (i, (gpus, model)) in nodes.iter().enumerate() {
            c.node(&format!("n{i}"), "p", 64_000, 512_000, ["A", "B"][*model], 16_000, *gpus);
        }
        let mut ids = Vec::new();
        for (i, (workers, per_worker, milli)) in jobs.iter().enumerate() {
            let (name, tenant) = (c.intern(&format!("j{i}")), c.intern("t"));
            let fractional = *per_worker == 1 && *milli < 1000;
            ids.push(c.job_spec(JobSpec {
                name, tenant, workers: *workers, min_workers: *workers, max_workers: *workers,
                cpu_milli: 1000, memory_mib: 1024, gpus_per_worker: *per_worker,
                gpu_milli: if fractional { *milli } else { 1000 }, ..JobSpec::default()
            }));
        }
        // Run half of the jobs first, so the plan starts from a used cluster.
        let first: Vec<Decision> = {
            let mut plan = Plan::new(c.cluster());
            let half: Vec<_> = c.cluster().pending_jobs().filter(|j| j.index() % 2 == 0).collect();
            plan.place_each(half, |p, j| p.first_fit_anywhere(j.index()));
            plan.into_decisions()
        };
        for d in first {
            if let Decision::Place(j, w) = d { c.run(j, w); }
        }
        // The mirror keeps the same aggregates incrementally as a fresh
        // mirror computes from a snapshot.
        check_aggregates(&Plan::new(c.cluster()));
        check_node_index(c.cluster());
        let rebuilt = Cluster::from_snapshot(c.snapshot()).unwrap();
        check_aggregates(&Plan::new(&rebuilt));
        check_node_index(&rebuilt);
        // Evicting in the mirror (not the plan) releases through the same books.
        let evict: Vec<u32> = c.cluster().running_jobs()
            .filter(|j| preempt_mask >> (j.index() % 64) & 2 == 2)
            .map(|j| j.index()).collect();
        for job in evict {
            let touched: Vec<u32> = c.cluster().job(job).placement().iter().map(|w| w.node).collect();
            let before: Vec<u64> = (0..c.cluster().node_count() as u32)
                .map(|n| c.cluster().node_version(n)).collect();
            c.apply(Event::JobEvicted(job));
            for (n, &v) in before.iter().enumerate() {
                let changed = c.cluster().node_version(n as u32) != v;
                prop_assert_eq!(changed, touched.contains(&(n as u32)), "node {} version", n);
            }
            check_aggregates(&Plan::new(c.cluster()));
            check_node_index(c.cluster());
        }
        // Removing a job renumbers the last one into its row; the index follows.
        let remove: Vec<u32> = (0..c.cluster().job_count() as u32)
            .rev()
            .filter(|j| preempt_mask >> (j % 64) & 4 == 4)
            .collect();
        for job in remove {
            c.apply(Event::JobRemoved(job));
            check_node_index(c.cluster());
            check_aggregates(&Plan::new(c.cluster()));
        }
        let cluster = c.cluster();
        let mut plan = Plan::new(cluster);
        check_aggregates(&plan);
        for (bit, job) in cluster.running_jobs().enumerate() {
            if preempt_mask >> (bit % 64) & 1 == 1 {
                plan.apply(Decision::Preempt(job.index())).unwrap();
                check_aggregates(&plan);
            }
        }
        let pending: Vec<_> = cluster.pending_jobs().collect();
        let versions: Vec<u64> = (0..cluster.node_count() as u32).map(|n| plan.node_version(n)).collect();
        plan.place_each(pending, |p, j| p.first_fit_anywhere(j.index()));
        check_aggregates(&plan);
        // A plan's node version moves wherever the plan placed workers (and
        // may move where a gang was tried and rolled back: a new version
        // only ever means "maybe changed").
        let placed: Vec<u32> = plan.decisions().iter().flat_map(|d| match d {
            Decision::Place(_, w) => w.iter().map(|w| w.node).collect(),
            _ => Vec::new(),
        }).collect();
        for (n, &v) in versions.iter().enumerate() {
            if placed.contains(&(n as u32)) {
                prop_assert!(plan.node_version(n as u32) != v, "plan node {} version", n);
            }
        }
        // worker_fits agrees with an exhaustive first fit on every node.
        for job in cluster.pending_jobs() {
            for node in 0..cluster.node_count() as u32 {
                prop_assert_eq!(plan.worker_fits(job.index(), node), plan.first_fit_worker(job.index(), node).is_some());
            }
        }
    }
}

#[test]
fn each_fitting_node_agrees_with_fits() {
    let mut c = TestCluster::new();
    for i in 0..6 {
        c.node(
            &format!("n{i}"),
            "p",
            8_000,
            64_000,
            if i % 2 == 0 { "A" } else { "B" },
            16_000,
            i % 3 + 1,
        );
    }
    let jobs: Vec<u32> = (0..5)
        .map(|i| c.job(&format!("j{i}"), "t", 1, i % 3 + 1))
        .collect();
    c.run(
        jobs[4],
        vec![WorkerPlacement {
            node: 2,
            gpus: c.cluster().node(2).gpu_range().take(1).collect(),
        }],
    );
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Preempt(jobs[4])).unwrap();
    for &job in &jobs[..4] {
        let fit = plan.job_fit(job);
        let mut visited = Vec::new();
        plan.each_fitting_node(&fit, |n| visited.push(n));
        let expected: Vec<u32> = (0..6).filter(|&n| plan.fits(&fit, n)).collect();
        assert_eq!(visited, expected, "job {job}");
    }
}

/// What the host would accept: the first `gpus_per_worker` GPUs of the node
/// that take one share of the job, through the validator's own check.
fn validator_accepts_a_worker(plan: &Plan<'_>, job: u32, node: u32) -> bool {
    let need = plan.cluster().job(job).gpus_per_worker() as usize;
    let gpus: Vec<u32> = plan
        .cluster()
        .node(node)
        .gpu_range()
        .filter(|&g| plan.gpu_fits(job, g))
        .take(need)
        .collect();
    gpus.len() == need
        && plan
            .check_worker(job, &WorkerPlacement { node, gpus })
            .is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The node scan (packed rows, 64 at a time, unrolled by four) visits
    /// exactly the nodes where the validator accepts a worker, on clusters
    /// larger than one chunk, with cordons, reservations and model masks.
    #[test]
    fn each_fitting_node_is_what_the_validator_accepts(
        nodes in prop::collection::vec((0u32..=8, 0usize..2, 0u8..8), 1..200),
        used in prop::collection::vec((0usize..200, prop::sample::select(vec![250u32, 500, 1000])), 0..150),
    ) {
        let mut c = TestCluster::new();
        for (i, (gpus, model, _)) in nodes.iter().enumerate() {
            c.node(&format!("n{i}"), "p", 16_000, 64_000, ["A", "B"][*model], 16_000, *gpus);
        }
        let (tenant, holder_name) = (c.intern("t"), c.intern("holder"));
        let shape = |name, cpu_milli, gpus_per_worker, gpu_milli, gpu_model_mask| JobSpec {
            name, tenant, workers: 1, min_workers: 1, max_workers: 1, cpu_milli,
            memory_mib: 4_096, gpus_per_worker, gpu_milli, gpu_model_mask, ..JobSpec::default()
        };
        // Load: fractional and whole-GPU workers where they fit.
        for (k, (node, milli)) in used.iter().enumerate() {
            let node = (*node % nodes.len()) as u32;
            let name = c.intern(&format!("u{k}"));
            let job = c.job_spec(shape(name, 2_000, 1, *milli, 0));
            let plan = Plan::new(c.cluster());
            if let Some(w) = plan.first_fit_worker(job, node) {
                c.run(job, vec![w]);
            }
        }
        let holder = c.job_spec(shape(holder_name, 1_000, 1, 1000, 0));
        for (i, (_, _, mark)) in nodes.iter().enumerate() {
            match mark {
                0 => c.apply(Event::NodeStateChanged(i as u32, node_state::CORDONED)),
                1 => c.apply(Event::JobReserved(holder, vec![i as u32])),
                _ => {}
            }
        }
        let a = c.model_mask(&["A"]);
        let mut asks = vec![holder];
        for (k, (cpu, gpus, milli, mask)) in [
            (1_000, 0, 0, 0), (2_000, 1, 250, 0), (2_000, 1, 500, a), (4_000, 1, 1000, 0),
            (8_000, 2, 1000, a), (8_000, 4, 1000, 0), (16_000, 8, 1000, 0), (20_000, 0, 0, 0),
        ].into_iter().enumerate() {
            let name = c.intern(&format!("ask{k}"));
            asks.push(c.job_spec(shape(name, cpu, gpus, milli, mask)));
        }
        let plan = Plan::new(c.cluster());
        for job in asks {
            let fit = plan.job_fit(job);
            let mut visited = Vec::new();
            plan.each_fitting_node(&fit, |n| visited.push(n));
            let expected: Vec<u32> = (0..nodes.len() as u32)
                .filter(|&n| validator_accepts_a_worker(&plan, job, n))
                .collect();
            prop_assert_eq!(&visited, &expected, "job {}", job);
            for n in 0..nodes.len() as u32 {
                prop_assert_eq!(plan.fits(&fit, n), expected.contains(&n));
            }
        }
    }
}

#[test]
fn scale_in_names_a_repeated_position_as_such() {
    let mut c = TestCluster::new();
    for i in 0..2 {
        c.node(&format!("n{i}"), "p", 8_000, 64_000, "A", 16_000, 4);
    }
    let job = c.job("j", "t", 2, 1);
    let workers = (0..2)
        .map(|n| WorkerPlacement {
            node: n,
            gpus: c.cluster().node(n).gpu_range().take(1).collect(),
        })
        .collect();
    c.run(job, workers);
    let mut plan = Plan::new(c.cluster());
    assert_eq!(
        plan.apply(Decision::ScaleIn(job, vec![0, 0, 1000])),
        Err(DecisionError::DuplicateWorker { job, worker: 0 })
    );
    assert_eq!(
        plan.apply(Decision::ScaleIn(job, vec![1000])),
        Err(DecisionError::BadWorkerIndex {
            job,
            worker: 1000,
            workers: 2
        })
    );
}

/// A plan answers `workers_of` with the workers its own decisions gave a job — read from the
/// decision for a place or a migrate, derived for a preemption — and with the committed
/// placement for a job it has not touched.
#[test]
fn workers_of_follows_the_plans_own_decisions() {
    let mut c = TestCluster::new();
    let a = c.node("a", "p", 64_000, 512_000, "T4", 16_000, 2);
    let b = c.node("b", "p", 64_000, 512_000, "T4", 16_000, 2);
    let (ga, gb) = (
        c.cluster().node(a).gpu_range().start,
        c.cluster().node(b).gpu_range().start,
    );
    // One worker on one GPU.
    let on = |node: u32, gpu: u32| {
        vec![WorkerPlacement {
            node,
            gpus: vec![gpu],
        }]
    };
    let running = c.job("running", "t", 1, 1);
    c.run(running, on(a, ga));
    let moved = c.job("moved", "t", 1, 1);
    c.run(moved, on(a, ga + 1));
    let stopped = c.job("stopped", "t", 1, 1);
    c.run(stopped, on(b, gb + 1));
    let pending = c.job("pending", "t", 1, 1);

    let mut plan = Plan::new(c.cluster());
    let placed = on(b, gb);
    plan.apply(Decision::Place(pending, placed.clone()))
        .expect("place");
    plan.apply(Decision::Preempt(stopped)).expect("preempt");
    let migrated = on(b, gb + 1);
    plan.apply(Decision::Migrate(moved, migrated.clone()))
        .expect("migrate");
    assert_eq!(plan.workers_of(pending), placed);
    assert_eq!(plan.workers_of(moved), migrated);
    assert_eq!(plan.workers_of(stopped), Vec::<WorkerPlacement>::new());
    assert_eq!(
        plan.workers_of(running),
        on(a, ga),
        "untouched: the committed placement"
    );
}
