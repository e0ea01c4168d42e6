use super::*;

fn profile(job: u32, util: u8, sm: u8) -> WorkloadProfile {
    WorkloadProfile {
        job,
        utilization_pct: util,
        sm_activity_pct: sm,
        memory_mib: 4096,
        throughput: 1.0,
        ..WorkloadProfile::default()
    }
}

/// One T4 node with `gpus` GPUs, sharing on (one shared worker per GPU,
/// host spill), a running guaranteed online job on each of the first
/// `online` GPUs (jobs 0..online), then `offline` pending best-effort jobs.
fn cluster(gpus: u32, online: u32, offline: u32) -> TestCluster {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "T4", 16_384, gpus);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 1,
        host_spill: true,
    });
    for g in 0..online {
        let job = c.job_on_one_gpu(&format!("on{g}"), "t", qos::GUARANTEED, 1000, 0);
        c.run(
            job,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![g],
            }],
        );
    }
    for j in 0..offline {
        c.job_on_one_gpu(&format!("off{j}"), "t", qos::BEST_EFFORT, 1000, 4096);
    }
    c
}

fn runtime(c: &TestCluster) -> Runtime<MuxFlow> {
    let mut rt = Runtime::<MuxFlow>::new();
    rt.resync(c.snapshot()).unwrap();
    rt
}

/// The host's check: every pairing as a place / migrate in one plan.
fn passes_the_host_check(c: &TestCluster, pairs: &[Pairing]) -> bool {
    let cluster = c.cluster();
    let mut plan = Plan::new(cluster);
    pairs.iter().all(|p| {
        let job = cluster.job(p.offline);
        let w = vec![WorkerPlacement {
            node: cluster.gpu(p.gpu).node(),
            gpus: vec![p.gpu],
        }];
        if job.is_running() && job.placement() == w.as_slice() {
            return true;
        }
        let on_gpus: Vec<u32> = cluster
            .job(p.online)
            .placement()
            .iter()
            .flat_map(|w| w.gpus.clone())
            .collect();
        on_gpus.contains(&p.gpu)
            && plan
                .apply(if job.is_running() {
                    Decision::Migrate(p.offline, w)
                } else {
                    Decision::Place(p.offline, w)
                })
                .is_ok()
    })
}

/// Online A (GPU 0, 20 % SMs), B (GPU 1, 80 %), X (GPU 2, 10 %); offline
/// C (80 % SMs), D (20 %), E (100 %). Predicted weights (default model):
/// A–C .865, A–D .955, A–E .68, B–C .149, B–D .865, B–E .11, X–C .955,
/// X–D .985, X–E .855.
fn figure_8_request(c: &TestCluster) -> MatchRequest {
    MatchRequest {
        epoch: c.snapshot().epoch,
        online: vec![0, 1, 2],
        offline: vec![3, 4, 5],
        profiles: vec![
            profile(0, 30, 20),
            profile(1, 90, 80),
            profile(2, 10, 10),
            profile(3, 90, 80),
            profile(4, 30, 20),
            profile(5, 100, 100),
        ],
    }
}

fn pairing(online: u32, offline: u32, gpu: u32, sm_percent: u8) -> Pairing {
    Pairing {
        online,
        offline,
        gpu,
        sm_percent,
    }
}

#[test]
fn km_pairs_by_predicted_throughput_with_fig_8_shares_and_skips_an_unhealthy_gpu() {
    let mut c = cluster(3, 3, 3);
    c.health(2, health::UNHEALTHY);
    let pairs = runtime(&c).match_workloads(figure_8_request(&c)).unwrap();
    // A–C + B–D = 1.73 beats A–D + B–C = 1.10 (greedy by SM activity would
    // instead put the busiest offline job E on X's unhealthy GPU 2).
    assert_eq!(pairs, vec![pairing(0, 3, 0, 80), pairing(1, 4, 1, 20)]);
    assert!(passes_the_host_check(&c, &pairs));
    for h in [health::INIT, health::OVERLIMIT, health::DISABLED] {
        c.health(2, h);
        let pairs = runtime(&c).match_workloads(figure_8_request(&c)).unwrap();
        assert!(pairs.iter().all(|p| p.gpu != 2), "health {h}: {pairs:?}");
    }
}

#[test]
fn a_healthy_gpu_takes_offline_work_and_the_total_is_maximal() {
    let c = cluster(3, 3, 3);
    let pairs = runtime(&c).match_workloads(figure_8_request(&c)).unwrap();
    // Best of the six complete plans: A–C, B–D, X–E = 2.585; X's share is
    // capped at max_pct = 90.
    assert_eq!(
        pairs,
        vec![
            pairing(0, 3, 0, 80),
            pairing(1, 4, 1, 20),
            pairing(2, 5, 2, 90)
        ]
    );
    assert!(passes_the_host_check(&c, &pairs));
}

#[test]
fn a_gpu_whose_shared_slot_is_taken_gets_no_second_offline_job() {
    let mut c = cluster(3, 3, 3);
    // A best-effort job outside the request already shares GPU 0.
    let other = c.job_on_one_gpu("other", "t", qos::BEST_EFFORT, 1000, 4096);
    c.run(
        other,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0],
        }],
    );
    let pairs = runtime(&c).match_workloads(figure_8_request(&c)).unwrap();
    assert!(pairs.iter().all(|p| p.gpu != 0), "{pairs:?}");
    assert_eq!(pairs.len(), 2);
    assert!(passes_the_host_check(&c, &pairs));
}

#[test]
fn a_running_offline_job_migrates_for_a_better_plan_unless_stay_bonus_keeps_it() {
    // Two online jobs, A (GPU 0, 20 % SMs) and B (GPU 1, 80 %); offline
    // jobs at half a GPU each, no shared-worker cap, so GPU 0 takes C
    // beside D. Offline D (job 3, 20 % SMs) already runs beside A; C (job
    // 2, 80 %) is pending.
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "T4", 16_384, 2);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 0,
        host_spill: true,
    });
    for g in 0..2 {
        let job = c.job_on_one_gpu(&format!("on{g}"), "t", qos::GUARANTEED, 1000, 0);
        c.run(
            job,
            vec![WorkerPlacement {
                node: 0,
                gpus: vec![g],
            }],
        );
    }
    c.job_on_one_gpu("C", "t", qos::BEST_EFFORT, 500, 4096);
    c.job_on_one_gpu("D", "t", qos::BEST_EFFORT, 500, 4096);
    c.run(
        3,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0],
        }],
    );
    let request = MatchRequest {
        epoch: c.snapshot().epoch,
        online: vec![0, 1],
        offline: vec![2, 3],
        profiles: vec![
            profile(0, 30, 20),
            profile(1, 90, 80),
            profile(2, 90, 80),
            profile(3, 30, 20),
        ],
    };
    // Without a bonus: A–C + B–D = 1.73 beats A–D + B–C = 1.10, so D
    // migrates to GPU 1 and C joins GPU 0.
    let pairs = runtime(&c).match_workloads(request.clone()).unwrap();
    assert_eq!(pairs, vec![pairing(0, 2, 0, 80), pairing(1, 3, 1, 20)]);
    assert!(passes_the_host_check(&c, &pairs));
    // A bonus of 1 makes staying worth 1.955 + 0.149 > 1.73.
    let mut rt = runtime(&c);
    rt.configure("stay_bonus = 1.0").unwrap();
    let pairs = rt.match_workloads(request).unwrap();
    assert_eq!(pairs, vec![pairing(0, 3, 0, 80), pairing(1, 2, 1, 20)]);
    assert!(passes_the_host_check(&c, &pairs));
}

#[test]
fn a_multi_gpu_online_job_offers_each_healthy_gpu() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "T4", 16_384, 3);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 1,
        host_spill: true,
    });
    let online = c.job("serve", "t", 3, 1);
    c.run(
        online,
        (0..3)
            .map(|g| WorkerPlacement {
                node: 0,
                gpus: vec![g],
            })
            .collect(),
    );
    c.health(1, health::UNHEALTHY);
    for j in 0..3 {
        c.job_on_one_gpu(&format!("off{j}"), "t", qos::BEST_EFFORT, 1000, 4096);
    }
    let request = MatchRequest {
        epoch: c.snapshot().epoch,
        online: vec![online, online],
        offline: vec![1, 2, 3],
        profiles: vec![profile(online, 50, 40)],
    };
    let pairs = runtime(&c).match_workloads(request).unwrap();
    let mut gpus: Vec<u32> = pairs.iter().map(|p| p.gpu).collect();
    gpus.sort_unstable();
    assert_eq!(gpus, vec![0, 2]);
    assert!(
        pairs
            .iter()
            .all(|p| p.online == online && p.sm_percent == 60)
    );
    assert!(passes_the_host_check(&c, &pairs));
}

#[test]
fn nothing_pairs_without_candidates_or_with_sharing_off() {
    let c = cluster(2, 2, 2);
    let mut rt = runtime(&c);
    let empty = MatchRequest {
        epoch: c.snapshot().epoch,
        ..MatchRequest::default()
    };
    assert!(rt.match_workloads(empty).unwrap().is_empty());
    // Pending "online" jobs have no GPU; unknown job indices are ignored.
    let request = MatchRequest {
        epoch: c.snapshot().epoch,
        online: vec![2, 99],
        offline: vec![3, 77],
        profiles: Vec::new(),
    };
    assert!(rt.match_workloads(request).unwrap().is_empty());
    // Sharing off: a best-effort job is charged as guaranteed and no
    // occupied GPU takes it.
    let mut off = TestCluster::new();
    off.node("n0", "p", 64_000, 512_000, "T4", 16_384, 1);
    let on = off.job_on_one_gpu("on", "t", qos::GUARANTEED, 1000, 0);
    off.run(
        on,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0],
        }],
    );
    off.job_on_one_gpu("off", "t", qos::BEST_EFFORT, 1000, 4096);
    let request = MatchRequest {
        epoch: off.snapshot().epoch,
        online: vec![0],
        offline: vec![1],
        profiles: Vec::new(),
    };
    assert!(runtime(&off).match_workloads(request).unwrap().is_empty());
}

#[test]
fn missing_profiles_count_as_fully_busy() {
    let c = cluster(1, 1, 1);
    let request = MatchRequest {
        epoch: c.snapshot().epoch,
        online: vec![0],
        offline: vec![1],
        profiles: Vec::new(),
    };
    // Online 100 % busy: the offline share is min_pct = 10; the offline job
    // needs every SM: r = 0.1, P = 0.1 · (1 − 0.5) = 0.05 > 0.
    let pairs = runtime(&c).match_workloads(request.clone()).unwrap();
    assert_eq!(pairs, vec![pairing(0, 1, 0, 10)]);
    // Raising the edge threshold above 0.05 drops it.
    let mut rt = runtime(&c);
    rt.configure("min_throughput = 0.06").unwrap();
    assert!(rt.match_workloads(request).unwrap().is_empty());
}

#[test]
fn per_model_weights_and_bounds_come_from_the_configuration() {
    let c = cluster(3, 3, 3);
    let mut rt = runtime(&c);
    // On T4 every edge weighs the SM-share term alone; and shares are capped at 50 %.
    rt.configure(
        "[dynamic_sm]\nmax_pct = 50\n[predictor.per_model]\nT4 = [0.0, 1.0, 0.0, 0.0, 0.0]\n",
    )
    .unwrap();
    let pairs = rt.match_workloads(figure_8_request(&c)).unwrap();
    assert!(pairs.iter().all(|p| p.sm_percent <= 50), "{pairs:?}");
    assert_eq!(pairs.len(), 3);
}

#[test]
fn manifest_and_default_configuration() {
    let m = Runtime::<MuxFlow>::new().manifest();
    assert_eq!(m.name, "muxflow");
    assert_eq!(m.roles, vec!["matcher"]);
    let cfg = Config::parse(&m.default_config).unwrap();
    assert_eq!(cfg, Config::default());
    assert_eq!(cfg.dynamic_sm.min_pct, 10);
    assert_eq!(cfg.dynamic_sm.max_pct, 90);
    assert_eq!(cfg.predictor.weights, [0.0, 1.0, -0.5, 0.0, 0.0]);
    let mut rt = Runtime::<MuxFlow>::new();
    assert!(rt.configure(&m.default_config).is_ok());
    assert!(rt.configure("").is_ok());
    assert!(
        rt.configure("nonsense = 1").is_err(),
        "unknown keys are refused"
    );
    assert!(rt.configure("[dynamic_sm]\nmin_pct = 95").is_err());
    assert!(rt.configure("min_throughput = 1.5").is_err());
    assert!(rt.configure("stay_bonus = -1.0").is_err());
    assert!(rt.configure("[predictor]\nweights = [1.0, 2.0]").is_err());
    assert!(
        rt.configure("[predictor]\nweights = [0.0, 1.0, 0.0, 0.0, nan]")
            .is_err()
    );
}

#[test]
fn a_stale_request_is_refused() {
    let c = cluster(1, 1, 1);
    let request = MatchRequest {
        epoch: c.snapshot().epoch + 1,
        online: vec![0],
        offline: vec![1],
        profiles: Vec::new(),
    };
    assert!(matches!(
        runtime(&c).match_workloads(request),
        Err(PolicyError::Stale(_))
    ));
}
