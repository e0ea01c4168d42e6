//! DynamoML (CLOSER '21) reproduced on its scenario: see
//! `docs/reproductions/dynamoml.md`.

use arbiter_repro::dynamoml::{SETTINGS, compare, compare_settings, trace_demand};
use arbiter_sim::models::dynamoml::{DynamoSimConfig, TrainingRuntime};

use arbiter_repro::dynamoml::{Comparison, PAPER_INFERENCE_GPUS_0_7};
use std::sync::OnceLock;

/// The four settings of Table 2 on the default scenario, run once.
fn comparison() -> &'static Comparison {
    static RUNS: OnceLock<Comparison> = OnceLock::new();
    RUNS.get_or_init(|| {
        let cfg = DynamoSimConfig::default();
        let demand = trace_demand(&cfg).expect("the LoRA trace's demand curve");
        let c = compare(&cfg, &demand).expect("the four settings run");
        for (label, m) in &c.runs {
            eprintln!(
                "{label:12} makespan {:.1} min, wait {:.1}, training {:.1}, total {:.1}, over SLO {:.3}, bins {:?}, inference GPUs 0-7 {}",
                m.makespan_min, m.mean_wait_min, m.mean_training_min, m.mean_total_min,
                m.over_slo, m.latency_bins, m.inference_gpus_0_7
            );
        }
        c
    })
}

fn run(label: &str) -> &'static arbiter_sim::models::dynamoml::DynamoMetrics {
    comparison().get(label).expect("run")
}

#[test]
fn every_setting_finishes_every_training_job_without_a_policy_fault() {
    for (label, m) in &comparison().runs {
        assert_eq!(m.unfinished, 0, "{label}");
        assert_eq!(m.jobs.len(), 12, "{label}: the paper's list, 12 jobs");
        assert_eq!(m.policy_faults, 0, "{label}");
    }
}

/// §5.1: 16 − 1 (four 0.25 notebooks) − 4 chiefs = 11 under DynamoML;
/// 16 − 4 notebooks − 4 jobs × 2 workers = 4 under K8S+Scaling. Exact.
#[test]
fn inference_gets_eleven_gpus_under_dynamoml_and_four_under_k8s_scaling_at_the_first_peak() {
    assert_eq!(
        run("DynamoML").inference_gpus_0_7,
        PAPER_INFERENCE_GPUS_0_7.0
    );
    assert_eq!(
        run("K8S+Scaling").inference_gpus_0_7,
        PAPER_INFERENCE_GPUS_0_7.1
    );
    // Without autoscaling the service keeps its one replica.
    assert_eq!(run("Native K8S").inference_gpus_0_7, 1);
    assert_eq!(run("K8S+Sharing").inference_gpus_0_7, 1);
}

/// §5.1 (paper: 27 vs 67 min, ratio 0.40). Ours is shorter by less; the
/// tolerance is what we reproduce — the ordering and a cut of at least
/// 15 % — and `docs/reproductions/dynamoml.md` says why not more.
#[test]
fn dynamoml_finishes_well_before_k8s_scaling_which_finishes_last() {
    let c = comparison();
    let ratio = c.makespan_ratio().expect("ratio");
    assert!(ratio <= 0.85, "DynamoML / K8S+Scaling makespan {ratio:.2}");
    let scaling = run("K8S+Scaling").makespan_min;
    for (label, m) in &c.runs {
        assert!(m.makespan_min <= scaling, "{label} slower than K8S+Scaling");
    }
}

/// §5.3: DynamoML keeps the service within its objective; without
/// autoscaling most requests miss it and some take over a second; with
/// HPA but no borrowing more miss it than under DynamoML.
#[test]
fn only_dynamoml_keeps_the_inference_service_within_its_objective() {
    let d = run("DynamoML");
    assert!(d.over_slo <= 0.01, "DynamoML over SLO {:.4}", d.over_slo);
    assert_eq!(d.latency_bins[3], 0.0, "nothing over 1024 ms");
    for label in ["Native K8S", "K8S+Sharing"] {
        let m = run(label);
        assert!(m.over_slo >= 0.5, "{label} over SLO {:.3}", m.over_slo);
        assert!(m.latency_bins[3] > 0.0, "{label}: some over 1024 ms");
    }
    assert!(run("K8S+Scaling").over_slo > d.over_slo);
}

/// §5.2 (paper: training time −70 %, waiting −55 % vs native). Ours: the
/// direction only; the size depends on the cross-node penalty and the
/// rescale cost the paper does not give (see the doc's sensitivity table).
#[test]
fn dynamoml_trains_and_waits_less_than_native_kubernetes() {
    let c = comparison();
    let training = c.cut_vs_native_pct(|m| m.mean_training_min).expect("cut");
    let total = c.cut_vs_native_pct(|m| m.mean_total_min).expect("cut");
    assert!(training > 0.0, "training time cut {training:.1} %");
    assert!(total > 0.0, "total time cut {total:.1} %");
    assert!(run("DynamoML").mean_wait_min <= run("Native K8S").mean_wait_min);
    // Elastic: DynamoML's jobs ran with more than one worker count.
    assert!(
        run("DynamoML")
            .worker_time
            .iter()
            .filter(|&&s| s > 0.0)
            .count()
            >= 3
    );
    // Kubernetes' jobs never get more workers than they asked for; under
    // K8S+Scaling they spent time a pod short, holding GPUs while they wait
    // for the rest (§5: "blocked or running with few GPUs").
    for label in ["Native K8S", "K8S+Scaling", "K8S+Sharing"] {
        assert!(run(label).worker_time.len() <= 2, "{label}");
    }
    assert!(run("K8S+Scaling").worker_time[0] > 0.0);
}

/// The numbers behind the doc's sensitivity table (`--ignored`, prints only).
#[ignore = "prints the sensitivity table of docs/reproductions/dynamoml.md"]
#[test]
fn print_sensitivity() {
    let base = DynamoSimConfig::default();
    let demand = trace_demand(&base).expect("demand");
    let mut cases: Vec<(String, DynamoSimConfig)> = vec![("default".into(), base.clone())];
    for p in [0u64, 10_000, 60_000] {
        cases.push((
            format!("rescale_pause_ms={p}"),
            DynamoSimConfig {
                rescale_pause_ms: p,
                ..base.clone()
            },
        ));
    }
    for z in [50.0, 200.0] {
        cases.push((
            format!("think_ms={z}"),
            DynamoSimConfig {
                think_ms: z,
                ..base.clone()
            },
        ));
    }
    for x in [0.3, 0.7] {
        let mut c = base.clone();
        c.mnist.cross_node = x;
        c.resnet50.cross_node = (x + 0.3f64).min(1.0);
        cases.push((format!("cross_node mnist={x}"), c));
    }
    for s in [17 * 3600u64, 17 * 3600 + 40 * 60] {
        let mut c = base.clone();
        c.demand.start_of_day_s = s;
        cases.push((format!("start_of_day_s={s}"), c));
    }
    cases.push((
        "kubernetes jobs elastic".into(),
        DynamoSimConfig {
            training_runtime: Some(TrainingRuntime::Elastic),
            ..base.clone()
        },
    ));
    // Kubernetes with a gang plugin (kube-batch, Volcano): pods all or none.
    let mut gang = SETTINGS;
    for (s, config) in gang.iter_mut().skip(1).zip([
        "gpu_sharing = true\nk8s_gang_scheduling = true",
        "inference_scaling = true\nk8s_gang_scheduling = true",
        "k8s_gang_scheduling = true",
    ]) {
        s.config = config;
    }
    let c = compare_settings(&gang, &base, &demand).expect("compare");
    print_case("kubernetes gang-scheduled", &c);
    for (label, cfg) in cases {
        let d = if label.starts_with("start") {
            trace_demand(&cfg).expect("d")
        } else {
            demand.clone()
        };
        let c = compare(&cfg, &d).expect("compare");
        print_case(&label, &c);
    }
}

fn print_case(label: &str, c: &Comparison) {
    let g = |l: &str| c.get(l).expect("run");
    eprintln!(
        "{label:28} ratio {:.2} cut_train {:.0}% cut_total {:.0}% | dyn mk {:.1} slo {:.3} inf07 {} | k8s+sc mk {:.1} inf07 {} slo {:.3} | native train {:.1}",
        c.makespan_ratio().unwrap(),
        c.cut_vs_native_pct(|m| m.mean_training_min).unwrap(),
        c.cut_vs_native_pct(|m| m.mean_total_min).unwrap(),
        g("DynamoML").makespan_min,
        g("DynamoML").over_slo,
        g("DynamoML").inference_gpus_0_7,
        g("K8S+Scaling").makespan_min,
        g("K8S+Scaling").inference_gpus_0_7,
        g("K8S+Scaling").over_slo,
        g("Native K8S").mean_training_min
    );
}
