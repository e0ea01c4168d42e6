//! Loads every real trace in the shared folder and checks exact counts and totals, verified
//! independently against the files. The traces are always present in CI; when they are
//! missing these tests fail with a message that says where they were looked for.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::PathBuf;

use arbiter_traces::genai::{self, DemandMetric, PredictStatus, QpsRequestType};
use arbiter_traces::openb::{self, PodListVariant, PodPhase};
use arbiter_traces::{GpuModel, pai, philly, trace_file};

/// The real file at `relative`, or a failure that explains how to provide the traces.
fn real_trace(relative: &str) -> PathBuf {
    trace_file(relative).unwrap_or_else(|error| {
        panic!(
            "this test needs the real traces (normally at ../shared/traces beside the \
             checkout, or wherever ARBITER_TRACES points): {error}"
        )
    })
}

#[test]
fn openb_gpu_nodes_match_published_cluster() {
    let nodes = openb::load_nodes(real_trace(openb::GPU_NODES_FILE)).unwrap();
    assert_eq!(nodes.len(), 1_213);
    assert_eq!(openb::total_gpus(&nodes), 6_212);
    let mut gpus_by_model: HashMap<GpuModel, u32> = HashMap::new();
    for node in &nodes {
        let model = node
            .gpu_model
            .expect("every node of the GPU list has a model");
        *gpus_by_model.entry(model).or_default() += node.gpu_count;
    }
    let expected = [
        (GpuModel::G2, 4_392),
        (GpuModel::T4, 842),
        (GpuModel::G3, 312),
        (GpuModel::P100, 265),
        (GpuModel::V100M32, 204),
        (GpuModel::V100M16, 195),
        (GpuModel::A10, 2),
    ];
    assert_eq!(gpus_by_model, HashMap::from(expected));
    let cpu_milli: u64 = nodes.iter().map(|node| u64::from(node.cpu_milli)).sum();
    let memory_mib: u64 = nodes.iter().map(|node| u64::from(node.memory_mib)).sum();
    assert_eq!((cpu_milli, memory_mib), (107_018_000, 503_828_480));
    assert_eq!(nodes[0].name, "openb-node-0000");
}

#[test]
fn openb_all_nodes_add_cpu_only_nodes_without_model() {
    let nodes = openb::load_nodes(real_trace(openb::ALL_NODES_FILE)).unwrap();
    assert_eq!(nodes.len(), 1_523);
    assert_eq!(openb::total_gpus(&nodes), 6_212);
    let cpu_only = nodes.iter().filter(|node| node.gpu_count == 0).count();
    assert_eq!(cpu_only, 310);
    assert!(
        nodes
            .iter()
            .all(|node| node.gpu_model.is_none() == (node.gpu_count == 0))
    );
}

#[test]
fn openb_default_pod_list_totals() {
    let pods = openb::load_pods(real_trace(PodListVariant::Default.relative_path())).unwrap();
    assert_eq!(pods.len(), 8_152);
    let gpu_milli: u64 = pods.iter().map(openb::OpenbPod::total_gpu_milli).sum();
    assert_eq!(gpu_milli, 6_086_800);
    assert_eq!(pods.iter().filter(|pod| pod.num_gpu == 0).count(), 1_088);
    assert_eq!(
        pods.iter().filter(|pod| pod.is_gpu_sharing()).count(),
        3_078
    );
    let cpu_milli: u64 = pods.iter().map(|pod| u64::from(pod.cpu_milli)).sum();
    let memory_mib: u64 = pods.iter().map(|pod| u64::from(pod.memory_mib)).sum();
    assert_eq!((cpu_milli, memory_mib), (85_436_012, 303_546_211));
    assert!(pods.iter().all(|pod| pod.gpu_spec.is_any()));

    // Pending pods are exactly the never-scheduled ones (empty scheduled_time).
    let pending = pods
        .iter()
        .filter(|pod| pod.phase == Some(PodPhase::Pending))
        .count();
    let unscheduled = pods
        .iter()
        .filter(|pod| pod.times.is_some_and(|times| times.scheduled.is_none()))
        .count();
    assert_eq!((pending, unscheduled), (897, 897));
    assert!(
        pods.iter()
            .all(|pod| pod.qos.is_some() && pod.times.is_some())
    );

    // The file is ordered by creation time, which replay relies on.
    let creations: Vec<u64> = pods
        .iter()
        .filter_map(|pod| pod.times.map(|t| t.creation))
        .collect();
    assert!(creations.is_sorted());
}

#[test]
fn openb_every_pod_list_variant_loads() {
    // (variant, tasks, total milli-GPUs, tasks with a GPU-model constraint), verified
    // against the files independently.
    let expected = [
        (PodListVariant::Default, 8_152, 6_086_800, 0),
        (PodListVariant::GpuShare20, 8_152, 6_531_500, 0),
        (PodListVariant::GpuShare40, 8_152, 5_641_250, 0),
        (PodListVariant::GpuShare60, 8_152, 4_908_340, 0),
        (PodListVariant::GpuShare80, 8_152, 4_408_190, 0),
        (PodListVariant::GpuShare100, 8_152, 3_952_670, 0),
        (PodListVariant::GpuSpec10, 8_152, 6_086_800, 732),
        (PodListVariant::GpuSpec20, 8_152, 6_086_800, 1_444),
        (PodListVariant::Cpu050, 7_439, 6_086_800, 0),
        (PodListVariant::Cpu100, 7_853, 6_086_800, 0),
        (PodListVariant::MultiGpu20, 8_324, 7_086_800, 0),
        (PodListVariant::MultiGpu30, 8_508, 8_086_800, 0),
        (PodListVariant::MultiGpu40, 8_746, 9_442_800, 0),
    ];
    assert_eq!(expected.len(), PodListVariant::ALL.len());
    for (variant, tasks, gpu_milli, constrained) in expected {
        let pods = openb::load_pods(real_trace(variant.relative_path()))
            .unwrap_or_else(|error| panic!("{variant:?}: {error}"));
        assert_eq!(pods.len(), tasks, "{variant:?}");
        let total: u64 = pods.iter().map(openb::OpenbPod::total_gpu_milli).sum();
        assert_eq!(total, gpu_milli, "{variant:?}");
        let with_spec = pods.iter().filter(|pod| !pod.gpu_spec.is_any()).count();
        assert_eq!(with_spec, constrained, "{variant:?}");
        let is_multi_gpu = matches!(
            variant,
            PodListVariant::MultiGpu20 | PodListVariant::MultiGpu30 | PodListVariant::MultiGpu40
        );
        // The multigpu variants have no time, QoS or phase columns.
        assert!(
            pods.iter().all(|pod| pod.times.is_none() == is_multi_gpu
                && pod.qos.is_none() == is_multi_gpu
                && pod.phase.is_none() == is_multi_gpu),
            "{variant:?}"
        );
    }
}

#[test]
fn openb_gpuspec_lists_collapse_duplicate_models() {
    let pods = openb::load_pods(real_trace(PodListVariant::GpuSpec20.relative_path())).unwrap();
    // `V100M16|V100M32|V100M32` appears 16 times; the set holds each model once.
    let duplicated = pods
        .iter()
        .filter(|pod| {
            pod.gpu_spec
                .iter()
                .eq([GpuModel::V100M16, GpuModel::V100M32])
        })
        .count();
    assert_eq!(duplicated, 95 + 16);
}

#[test]
fn pai_machine_spec_matches_published_cluster() {
    let machines = pai::load_machines(real_trace(pai::MACHINE_SPEC_FILE)).unwrap();
    assert_eq!(machines.len(), 1_897);
    let gpus: u64 = machines
        .iter()
        .map(|machine| u64::from(machine.gpu_count))
        .sum();
    assert_eq!(gpus, 6_742);
    let count = |model: Option<GpuModel>| {
        machines
            .iter()
            .filter(|machine| machine.gpu_model == model)
            .count()
    };
    assert_eq!(count(None), 83);
    assert_eq!(count(Some(GpuModel::Misc)), 280);
    assert_eq!(count(Some(GpuModel::P100)), 798);
    assert_eq!(count(Some(GpuModel::T4)), 497);
    assert_eq!(count(Some(GpuModel::V100M32)), 135);
    assert_eq!(count(Some(GpuModel::V100)), 104);
}

#[test]
fn pai_minibatch_jobs_load() {
    for (job, rows, gpu_percent) in [
        (1, 3_000, 25),
        (2, 2_402, 20),
        (3, 2_489, 25),
        (4, 21_829, 50),
    ] {
        let file = pai::minibatch_file(job).unwrap();
        let samples = pai::load_minibatch(real_trace(&file)).unwrap();
        assert_eq!(samples.len(), rows, "job {job}");
        assert!(
            samples.iter().all(|s| s.gpu_percent == gpu_percent),
            "job {job}"
        );
        assert!(
            samples
                .iter()
                .all(|s| s.worker < 10 && s.batch_time_norm <= 1_000),
            "job {job}"
        );
        assert_eq!(
            samples.iter().map(|s| s.batch_time_norm).max(),
            Some(1_000),
            "job {job}"
        );
        assert!(samples.is_sorted_by_key(|s| s.time), "job {job}");
    }
    assert_eq!(pai::minibatch_file(5), None);
}

#[test]
fn pai_philly_runtimes_load() {
    let runtimes = pai::load_philly_runtimes(real_trace(pai::PHILLY_RUNTIME_FILE)).unwrap();
    assert_eq!(runtimes.len(), 83_154);
    assert_eq!(runtimes.iter().sum::<f64>(), 1_215_156_667.0);
    assert!(runtimes.is_sorted());
}

#[test]
fn philly_jobs_match_published_totals() {
    let trace = philly::load_jobs(real_trace(philly::JOBS_FILE)).unwrap();
    assert_eq!(trace.jobs.len(), 82_247);
    assert_eq!(trace.clusters.len(), 15);
    let gpus: u64 = trace.jobs.iter().map(|job| u64::from(job.num_gpus)).sum();
    assert_eq!(gpus, 107_235);
    let gpu_time: f64 = trace.jobs.iter().map(|job| job.gpu_time_secs).sum();
    assert_eq!(gpu_time, 3_521_082_502.0);
    assert_eq!(trace.jobs.iter().map(|job| job.num_gpus).max(), Some(128));
    // 2017-09-04 10:30:41 and 2017-12-22 08:02:11.
    let submit = trace.jobs.iter().map(|job| job.submit_time);
    assert_eq!(submit.clone().min(), Some(1_504_521_041));
    assert_eq!(submit.max(), Some(1_513_929_731));
    assert_eq!(trace.cluster_name(&trace.jobs[0]), Some("11cb48"));
    let largest = trace
        .clusters
        .iter()
        .position(|name| name == "6214e9")
        .unwrap();
    let in_largest = trace
        .jobs
        .iter()
        .filter(|job| usize::from(job.cluster) == largest)
        .count();
    assert_eq!(in_largest, 41_226);
    // File order is not chronological (documented; replay must sort).
    assert!(!trace.jobs.is_sorted_by_key(|job| job.submit_time));
}

#[test]
fn genai_lora_requests_and_demand_curve() {
    let requests = genai::load_lora_requests(real_trace(genai::LORA_REQUESTS_FILE)).unwrap();
    assert_eq!(requests.len(), 26_823);
    let succeeded = requests
        .iter()
        .filter(|r| r.status == PredictStatus::Succeeded)
        .count();
    assert_eq!(succeeded, 26_392);
    assert_eq!(
        requests.iter().filter(|r| r.num_images.is_none()).count(),
        25
    );
    assert_eq!(requests.first().map(|r| r.created_at), Some(1_731_689_870));
    assert_eq!(requests.last().map(|r| r.created_at), Some(1_733_679_237));

    let hour = NonZeroU64::new(3_600).unwrap();
    let arrivals = genai::demand_curve(&requests, hour, DemandMetric::Arrivals).unwrap();
    assert_eq!(arrivals.values.len(), 554);
    assert_eq!(arrivals.values.iter().sum::<f64>(), 26_823.0);
    assert_eq!(arrivals.peak, 436.0);
    assert!(
        arrivals.peak_to_mean() > 5.0,
        "a strong daily cycle is bursty"
    );
    let normalized = arrivals.normalized();
    assert!(normalized.iter().all(|v| (0.0..=1.0).contains(v)));
    assert_eq!(normalized.iter().copied().fold(0.0, f64::max), 1.0);

    let concurrency = genai::demand_curve(&requests, hour, DemandMetric::Concurrency).unwrap();
    let busy_seconds: f64 = concurrency.values.iter().sum::<f64>() * 3_600.0;
    assert!((busy_seconds - 768_899.0).abs() < 1e-3, "{busy_seconds}");
    let pool = concurrency.scaled_to_peak(64.0);
    assert!((pool.iter().copied().fold(0.0, f64::max) - 64.0).abs() < 1e-9);
}

#[test]
fn genai_qps_loads_with_gateway_rows_unattributed() {
    let trace = genai::load_qps(real_trace(genai::QPS_FILE)).unwrap();
    assert_eq!(trace.samples.len(), 24_627);
    assert_eq!(trace.containers.len(), 107);
    let api: Vec<_> = trace
        .samples
        .iter()
        .filter(|s| s.request_type == QpsRequestType::Api)
        .collect();
    assert_eq!(api.len(), 1_114);
    assert!(api.iter().all(|s| s.container.is_none()));
    assert!(trace.samples.is_sorted_by_key(|s| s.timestamp));
}

#[test]
fn genai_pod_gpu_series_load() {
    let duty = genai::load_pod_gpu_series(real_trace(genai::POD_GPU_DUTY_CYCLE_FILE)).unwrap();
    assert_eq!((duty.samples.len(), duty.containers.len()), (157_417, 143));
    assert!(duty.samples.iter().all(|s| s.value <= 100.0));
    let memory = genai::load_pod_gpu_series(real_trace(genai::POD_GPU_MEMORY_FILE)).unwrap();
    assert_eq!(
        (memory.samples.len(), memory.containers.len()),
        (161_413, 144)
    );
}

#[test]
fn reference_results_cover_every_variant_but_gpushare20_with_six_policies_and_ten_seeds() {
    let rows = openb::load_reference_alloc(real_trace(openb::REFERENCE_ALLOC_FILE)).unwrap();
    assert_eq!(rows.len(), 12 * 6 * 10);
    for variant in PodListVariant::ALL {
        let n = rows.iter().filter(|r| r.variant == variant).count();
        let expected = if variant == PodListVariant::GpuShare20 {
            0
        } else {
            60
        };
        assert_eq!(n, expected, "{variant:?}");
        assert_eq!(PodListVariant::from_name(variant.name()), Some(variant));
    }
    let policies: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.policy.as_str()).collect();
    assert_eq!(
        policies.into_iter().collect::<Vec<_>>(),
        [
            "BestFit",
            "DotProd",
            "FGD",
            "GpuClustering",
            "GpuPacking",
            "Random"
        ]
    );
    // Allocation only grows as more load arrives.
    assert!(
        rows.iter()
            .all(|r| r.alloc_pct_at_130 >= r.alloc_pct_at_100)
    );
}
