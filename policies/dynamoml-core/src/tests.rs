//! Known answers from the paper's testbed (two nodes of eight V100s) and the
//! brief's unit cases (`round2_papers.md` §3).

use super::*;
use arbiter_policy_sdk::model::{ServiceMetric, job_kind};

struct Full;
impl Preset for Full {
    const NAME: &'static str = "test-dynamoml";
    const SUMMARY: &'static str = "test";
    const DEFAULT_CONFIG: &'static str = "";
}

/// DynamoML with a target of 10 requests/s per replica.
fn dynamoml() -> Dynamo<Full> {
    let mut p = Dynamo::<Full>::create();
    p.configure("target_requests_per_replica = 10.0\nscale_down_delay_s = 30")
        .expect("config");
    p
}

/// Kubernetes with HPA only (the paper's K8S+Scaling).
fn k8s_scaling() -> Dynamo<Full> {
    let mut p = Dynamo::<Full>::create();
    p.configure(
        "training_scheduler = false\ngpu_sharing = false\nborrow_from_training = false\n\
         target_requests_per_replica = 10.0",
    )
    .expect("config");
    p
}

fn testbed() -> TestCluster {
    let mut c = TestCluster::new();
    for k in 0..2 {
        c.node(&format!("p3-{k}"), "p", 64_000, 488_000, "V100", 16_384, 8);
    }
    c
}

fn spec(c: &mut TestCluster, name: &str, kind: u8, workers: (u32, u32, u32), milli: u32) -> u32 {
    let spec = JobSpec {
        name: c.intern(name),
        tenant: c.intern("t"),
        kind,
        workers: workers.0,
        min_workers: workers.1,
        max_workers: workers.2,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker: 1,
        gpu_milli: milli,
        submit_ms: c.cluster().job_count() as u64,
        checkpointed: true,
        slo_ms: if kind == job_kind::INFERENCE { 128 } else { 0 },
        group: c.intern(""),
        ..JobSpec::default()
    };
    c.job_spec(spec)
}

fn notebook(c: &mut TestCluster, name: &str) -> u32 {
    spec(c, name, job_kind::INTERACTIVE, (1, 1, 1), 250)
}
fn training(c: &mut TestCluster, name: &str) -> u32 {
    spec(c, name, job_kind::TRAINING, (2, 1, 4), FULL_GPU_MILLI)
}
fn service(c: &mut TestCluster) -> u32 {
    spec(
        c,
        "resnet-serving",
        job_kind::INFERENCE,
        (1, 1, 12),
        FULL_GPU_MILLI,
    )
}

fn load(c: &mut TestCluster, job: u32, requests_per_s: f32) {
    c.apply(Event::ServiceMetrics(vec![ServiceMetric {
        job,
        requests_per_s,
        p50_latency_ms: 40,
        p99_latency_ms: 60,
    }]));
}

fn workers(c: &TestCluster, job: u32) -> u32 {
    c.cluster().job(job).placement().len() as u32
}

/// The paper's peak: four notebooks, four two-worker training jobs and a
/// service that wants twelve replicas.
fn peak(p: &mut Dynamo<Full>) -> (TestCluster, u32, Vec<u32>) {
    let mut c = testbed();
    let s = service(&mut c);
    for k in 0..4 {
        notebook(&mut c, &format!("nb{k}"));
    }
    let jobs: Vec<u32> = (0..4)
        .map(|k| training(&mut c, &format!("mnist{k}")))
        .collect();
    c.run_round(p, 1_000);
    for t in 2..6 {
        load(&mut c, s, 120.0);
        c.run_round(p, t * 15_000);
    }
    (c, s, jobs)
}

#[test]
fn at_peak_dynamoml_gives_inference_eleven_gpus_and_keeps_each_chief() {
    let mut p = dynamoml();
    let (c, s, jobs) = peak(&mut p);
    // 16 − 1 (four notebooks on one GPU) − 4 chiefs.
    assert_eq!(workers(&c, s), 11);
    for &j in &jobs {
        assert_eq!(workers(&c, j), 1, "job {j} keeps only its chief");
    }
}

#[test]
fn at_peak_k8s_scaling_gives_inference_four_gpus() {
    let mut p = k8s_scaling();
    let (c, s, jobs) = peak(&mut p);
    // 16 − 4 notebooks on whole GPUs − 4 jobs × 2 workers.
    assert_eq!(workers(&c, s), 4);
    for &j in &jobs {
        assert_eq!(workers(&c, j), 2);
    }
}

#[test]
fn chiefs_keep_their_gpus_when_inference_borrows() {
    let mut p = dynamoml();
    let mut c = testbed();
    let s = service(&mut c);
    let jobs: Vec<u32> = (0..2).map(|k| training(&mut c, &format!("r{k}"))).collect();
    c.run_round(&mut p, 1_000);
    let chiefs: Vec<WorkerPlacement> = jobs
        .iter()
        .map(|&j| c.cluster().job(j).placement()[0].clone())
        .collect();
    load(&mut c, s, 120.0);
    c.run_round(&mut p, 15_000);
    for (k, &j) in jobs.iter().enumerate() {
        assert_eq!(c.cluster().job(j).placement()[0], chiefs[k]);
    }
}

#[test]
fn four_quarter_notebooks_share_one_gpu_and_a_fifth_goes_to_another() {
    let mut p = dynamoml();
    let mut c = testbed();
    let nbs: Vec<u32> = (0..5)
        .map(|k| notebook(&mut c, &format!("nb{k}")))
        .collect();
    c.run_round(&mut p, 1_000);
    let gpu = |j: u32| c.cluster().job(j).placement()[0].gpus[0];
    for &j in &nbs[1..4] {
        assert_eq!(gpu(j), gpu(nbs[0]));
    }
    assert_ne!(gpu(nbs[4]), gpu(nbs[0]));
    assert_eq!(c.cluster().gpu(gpu(nbs[0])).milli_used(), FULL_GPU_MILLI);
}

#[test]
fn without_sharing_each_notebook_holds_a_gpu_of_its_own() {
    let mut p = k8s_scaling();
    let mut c = testbed();
    let nbs: Vec<u32> = (0..4)
        .map(|k| notebook(&mut c, &format!("nb{k}")))
        .collect();
    c.run_round(&mut p, 1_000);
    let mut gpus: Vec<u32> = nbs
        .iter()
        .map(|&j| c.cluster().job(j).placement()[0].gpus[0])
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    assert_eq!(gpus.len(), 4);
}

/// Node 0 with `a` free GPUs, node 1 with `b`, by filling the rest with
/// an inelastic job per node.
fn partly_free(a: u32, b: u32) -> TestCluster {
    let mut c = testbed();
    for (node, free) in [(0u32, a), (1, b)] {
        let used = 8 - free;
        if used > 0 {
            let j = spec(
                &mut c,
                &format!("fill{node}"),
                job_kind::TRAINING,
                (used, used, used),
                1000,
            );
            let base = node * 8;
            c.run(
                j,
                (0..used)
                    .map(|g| WorkerPlacement {
                        node,
                        gpus: vec![base + g],
                    })
                    .collect(),
            );
        }
    }
    c
}

#[test]
fn a_gang_goes_to_one_node_and_waits_rather_than_spread() {
    let mut p = dynamoml();
    let mut c = partly_free(4, 5);
    let j = spec(&mut c, "four", job_kind::TRAINING, (4, 4, 4), 1000);
    c.run_round(&mut p, 1_000);
    let nodes: Vec<u32> = c
        .cluster()
        .job(j)
        .placement()
        .iter()
        .map(|w| w.node)
        .collect();
    assert!(nodes.iter().all(|&n| n == nodes[0]), "one node: {nodes:?}");

    let mut c = partly_free(3, 3);
    let j = spec(&mut c, "four", job_kind::TRAINING, (4, 4, 4), 1000);
    c.run_round(&mut p, 1_000);
    assert!(c.cluster().job(j).is_pending(), "3 + 3 free: no placement");
}

#[test]
fn kubernetes_spreads_a_jobs_workers_over_the_least_allocated_nodes() {
    let mut p = k8s_scaling();
    let mut c = testbed();
    let j = training(&mut c, "spread");
    c.run_round(&mut p, 1_000);
    let nodes: Vec<u32> = c
        .cluster()
        .job(j)
        .placement()
        .iter()
        .map(|w| w.node)
        .collect();
    assert_eq!(nodes, vec![0, 1]);
}

/// Kubernetes' default scheduler places pods, not gangs: with three GPUs
/// free, the first two-worker job starts whole and the second with the one
/// pod that fits; when a GPU comes free the older job's missing pod goes
/// first, and a job never gets more pods than it asked for. With a gang
/// plugin the second job waits; DynamoML's training scheduler starts only
/// whole gangs too.
#[test]
fn kubernetes_places_a_jobs_pods_one_by_one_unless_it_gang_schedules() {
    let setup = || {
        let mut c = partly_free(2, 2);
        // One more GPU of node 0 held by a one-GPU job: three GPUs free.
        let small = spec(&mut c, "small", job_kind::TRAINING, (1, 1, 1), 1000);
        c.run(
            small,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![6],
            }],
        );
        let a = training(&mut c, "tf-a");
        let b = training(&mut c, "tf-b");
        (c, a, b)
    };
    let mut p = k8s_scaling();
    let (mut c, a, b) = setup();
    c.run_round(&mut p, 1_000);
    assert_eq!((workers(&c, a), workers(&c, b)), (2, 1));
    // A later job arrives, then the one-GPU job ends.
    training(&mut c, "tf-late");
    c.apply(Event::JobRemoved(c.index_of("small")));
    c.run_round(&mut p, 16_000);
    let (b, late) = (c.index_of("tf-b"), c.index_of("tf-late"));
    assert_eq!(workers(&c, b), 2, "the older job's missing pod first");
    assert!(c.cluster().job(late).is_pending());
    // Node 1's filler ends: six GPUs free, the later job starts, and the
    // others stay at the two pods they asked for.
    c.apply(Event::JobRemoved(c.index_of("fill1")));
    c.run_round(&mut p, 31_000);
    let (a, b, late) = (
        c.index_of("tf-a"),
        c.index_of("tf-b"),
        c.index_of("tf-late"),
    );
    assert_eq!(
        (workers(&c, a), workers(&c, b), workers(&c, late)),
        (2, 2, 2),
        "never beyond the request"
    );

    let mut gang = Dynamo::<Full>::create();
    gang.configure(
        "training_scheduler = false\ngpu_sharing = false\nborrow_from_training = false\n\
         k8s_gang_scheduling = true",
    )
    .expect("config");
    let (mut c, a, b) = setup();
    c.run_round(&mut gang, 1_000);
    assert_eq!(workers(&c, a), 2);
    assert!(c.cluster().job(b).is_pending(), "all pods or none");

    let (mut c, a, b) = setup();
    c.run_round(&mut dynamoml(), 1_000);
    assert_eq!(workers(&c, a), 2);
    assert!(
        c.cluster().job(b).is_pending(),
        "DynamoML starts whole gangs"
    );
}

#[test]
fn when_inference_falls_training_grows_back_on_its_own_nodes() {
    let mut p = dynamoml();
    let (mut c, s, jobs) = peak(&mut p);
    assert_eq!(workers(&c, s), 11);
    // Demand falls to four replicas' worth; the service shrinks after the
    // stabilisation delay, then training takes the GPUs back.
    let mut t = 6;
    while workers(&c, s) > 4 && t < 20 {
        load(&mut c, s, 40.0);
        c.run_round(&mut p, t * 15_000);
        t += 1;
    }
    assert_eq!(workers(&c, s), 4);
    c.run_round(&mut p, t * 15_000);
    let cluster = c.cluster();
    for &j in &jobs {
        let job = cluster.job(j);
        let home = job.placement()[0].node;
        assert!(job.placement().iter().all(|w| w.node == home), "packed");
    }
    // Every idle GPU is on a node whose training jobs are all at their
    // maximum (a job grows on its own node only).
    for gpu in (0..cluster.gpu_count() as u32).filter(|&g| cluster.gpu(g).milli_used() == 0) {
        let node = cluster.gpu(gpu).node();
        for &j in &jobs {
            let job = cluster.job(j);
            if job.placement()[0].node == node {
                assert_eq!(
                    job.workers(),
                    4,
                    "GPU {gpu} idle beside a job that could grow"
                );
            }
        }
    }
    let total: u32 = jobs.iter().map(|&j| workers(&c, j)).sum();
    assert!(total >= 10, "{total}");
}

#[test]
fn a_waiting_job_takes_back_what_others_grew_beyond_their_start() {
    let mut p = dynamoml();
    let mut c = testbed();
    let first: Vec<u32> = (0..4).map(|k| training(&mut c, &format!("a{k}"))).collect();
    c.run_round(&mut p, 1_000);
    c.run_round(&mut p, 15_000);
    assert_eq!(
        first.iter().map(|&j| workers(&c, j)).sum::<u32>(),
        16,
        "grown"
    );
    let late = training(&mut c, "late");
    c.run_round(&mut p, 30_000);
    assert_eq!(workers(&c, late), 2, "started at once");
    for &j in &first {
        assert!(workers(&c, j) >= 2, "nobody below what it started with");
    }
}

#[test]
fn a_long_runner_gives_way_to_a_long_waiter_with_its_checkpoint() {
    let mut p = Dynamo::<Full>::create();
    p.configure("preempt_after_s = 600").expect("config");
    let mut c = testbed();
    let hog = spec(&mut c, "hog", job_kind::TRAINING, (8, 8, 8), 1000);
    let hog2 = spec(&mut c, "hog2", job_kind::TRAINING, (8, 8, 8), 1000);
    c.run_round(&mut p, 0);
    let waiter = spec(&mut c, "waiter", job_kind::TRAINING, (2, 2, 2), 1000);
    c.progress(JobProgress {
        job: hog,
        started_ms: 0,
        ..JobProgress::default()
    });
    c.progress(JobProgress {
        job: hog2,
        started_ms: 100,
        ..JobProgress::default()
    });
    c.run_round(&mut p, 300_000);
    assert!(
        c.cluster().job(waiter).is_pending(),
        "not waited long enough"
    );
    let d = c.run_round(&mut p, 700_000);
    assert!(d.contains(&Decision::Preempt(hog)), "{d:?}");
    assert!(c.cluster().job(hog).is_pending());
}

#[test]
fn configurations_parse_and_bad_values_are_refused() {
    assert_eq!(Config::parse("").expect("empty"), Config::default());
    assert!(Config::parse("target_requests_per_replica = 0.0").is_err());
    assert!(Config::parse("latency_target_pct = 0").is_err());
    assert!(Config::parse("tolerance_pct = 100").is_err());
    assert!(Config::parse("autoscale = true").is_err(), "unknown key");
}

#[test]
fn jobs_growing_on_one_node_share_its_cpu_fairly() {
    // Eight GPUs but CPU for four workers: two one-worker jobs can add two workers between
    // them, one each (fewest workers first), not two for one and a refused decision for the
    // other.
    let mut c = TestCluster::new();
    c.node("small-cpu", "p", 4_000, 488_000, "V100", 16_384, 8);
    let a = spec(&mut c, "a", job_kind::TRAINING, (1, 1, 4), FULL_GPU_MILLI);
    let b = spec(&mut c, "b", job_kind::TRAINING, (1, 1, 4), FULL_GPU_MILLI);
    let mut p = dynamoml();
    c.run_round(&mut p, 1_000);
    assert_eq!((workers(&c, a), workers(&c, b)), (1, 1));
    let grown = c.run_round(&mut p, 16_000);
    assert_eq!((workers(&c, a), workers(&c, b)), (2, 2), "{grown:?}");
}
