//! Contract 0.3's co-location rules, through the one validator (`Plan`) and
//! the mirror: sharing by QoS (G1), quotas in the view (G2), GPU health
//! (G8), GPU reservations (G20), `set-qos` before a placement (G14) and
//! locality (G13).

use arbiter_policy_sdk::prelude::*;
use proptest::prelude::*;

const GB32: u32 = 32_768;

/// One node with one 32 GB GPU (AntMan §5.1's testbed GPU).
fn one_gpu(c: &mut TestCluster) {
    c.node("n0", "p", 64_000, 512_000, "V100M32", GB32, 1);
}

fn on_gpu(gpu: u32) -> Vec<WorkerPlacement> {
    vec![WorkerPlacement {
        node: 0,
        gpus: vec![gpu],
    }]
}

fn spill(oversub_milli: u32) -> SharingRules {
    SharingRules {
        oversub_milli,
        max_shared_workers: 0,
        host_spill: true,
    }
}

/// Applies decisions the plan accepted as the host would, event by event.
fn commit(c: &mut TestCluster, decisions: Vec<Decision>) {
    for d in decisions {
        match d {
            Decision::Place(j, w) | Decision::Migrate(j, w) => c.run(j, w),
            Decision::SetQos(j, q) => c.apply(Event::JobQosChanged(j, q)),
            Decision::ReserveGpus(j, g) => c.apply(Event::JobReservedGpus(j, g)),
            Decision::Preempt(j) => c.apply(Event::JobEvicted(j)),
            other => panic!("not used here: {other:?}"),
        }
    }
}

/// AntMan Table 2: Job-A (opportunistic, 3.5 GB) runs first; Job-B
/// (guaranteed, 30 GB on the 32 GB GPU) then lands beside it. Admitted:
/// guaranteed admission looks only at guaranteed use; A's memory is soft.
#[test]
fn antman_table_2_is_admitted() {
    let mut c = TestCluster::new();
    one_gpu(&mut c);
    c.sharing(spill(1000));
    let a = c.job_on_one_gpu("job-a", "t", qos::OPPORTUNISTIC, 1000, 3_584);
    let b = c.job_on_one_gpu("job-b", "t", qos::GUARANTEED, 1000, 30_720);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(a, on_gpu(0))).unwrap();
    let decisions = plan.into_decisions();
    commit(&mut c, decisions);
    let gpu = c.cluster().gpu(0);
    assert_eq!(
        (
            gpu.shared_milli(),
            gpu.shared_memory_mib(),
            gpu.shared_workers()
        ),
        (1000, 3_584, 1)
    );
    assert_eq!(gpu.milli_used(), 0, "A is not charged as guaranteed");

    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(b, on_gpu(0))).unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    let gpu = c.cluster().gpu(0);
    assert_eq!(gpu.milli_used(), 1000);
    assert_eq!(gpu.shared_workers(), 1);

    // Genuinely impossible: a second guaranteed job on the same GPU.
    let b2 = c.job_on_one_gpu("job-b2", "t", qos::GUARANTEED, 1000, 1_024);
    let a2 = c.job_on_one_gpu("job-a2", "t", qos::OPPORTUNISTIC, 500, 1_024);
    let mut plan = Plan::new(c.cluster());
    assert!(matches!(
        plan.apply(Decision::Place(b2, on_gpu(0))),
        Err(DecisionError::Overcommit {
            resource: "gpu-milli",
            ..
        })
    ));
    // ... and shared work past the operator's compute cap (1000 shared).
    assert!(matches!(
        plan.apply(Decision::Place(a2, on_gpu(0))),
        Err(DecisionError::Overcommit {
            resource: "shared gpu-milli",
            ..
        })
    ));
}

/// Without host spill, shared memory must fit beside guaranteed memory; a
/// shared worker larger than the GPU never fits.
#[test]
fn shared_memory_is_hard_without_host_spill() {
    let mut c = TestCluster::new();
    one_gpu(&mut c);
    c.sharing(SharingRules {
        oversub_milli: 2000,
        max_shared_workers: 0,
        host_spill: false,
    });
    let b = c.job_on_one_gpu("b", "t", qos::GUARANTEED, 500, 28_000);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(b, on_gpu(0))).unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    let small = c.job_on_one_gpu("small", "t", qos::BEST_EFFORT, 1000, 4_000);
    let big = c.job_on_one_gpu("big", "t", qos::BEST_EFFORT, 1000, 5_000);
    let huge = c.job_on_one_gpu("huge", "t", qos::BEST_EFFORT, 100, 40_000);
    let mut plan = Plan::new(c.cluster());
    assert!(matches!(
        plan.apply(Decision::Place(big, on_gpu(0))),
        Err(DecisionError::Overcommit {
            resource: "shared gpu-memory-mib",
            need: 5_000,
            free: 4_768,
            ..
        })
    ));
    plan.apply(Decision::Place(small, on_gpu(0))).unwrap();
    // `huge` asks for more than the GPU has: capped at the GPU's memory, it
    // still cannot fit beside anything.
    assert!(plan.apply(Decision::Place(huge, on_gpu(0))).is_err());

    // With host spill, shared memory only has to fit beside shared work.
    c.sharing(spill(2000));
    let plan = Plan::new(c.cluster());
    assert!(plan.gpu_fits(big, 0));
}

/// Sharing off (the default and 0.2's behaviour): every QoS is charged as
/// guaranteed, so an opportunistic job cannot join a held GPU.
#[test]
fn sharing_off_charges_every_qos_as_guaranteed() {
    let mut c = TestCluster::new();
    one_gpu(&mut c);
    let b = c.job_on_one_gpu("b", "t", qos::GUARANTEED, 1000, 0);
    let a = c.job_on_one_gpu("a", "t", qos::OPPORTUNISTIC, 1000, 3_584);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(b, on_gpu(0))).unwrap();
    assert!(matches!(
        plan.apply(Decision::Place(a, on_gpu(0))),
        Err(DecisionError::Overcommit {
            resource: "gpu-milli",
            ..
        })
    ));
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    // Turning sharing on re-charges running work under the new rules.
    c.sharing(spill(1000));
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(a, on_gpu(0))).unwrap();
}

/// Shared work only on healthy GPUs, and at most `max-shared-workers` per
/// GPU (MuxFlow: one offline workload per online one); guaranteed work is
/// unaffected by health.
#[test]
fn health_and_the_shared_worker_cap() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "T4", 16_384, 2);
    c.sharing(SharingRules {
        oversub_milli: 1000,
        max_shared_workers: 1,
        host_spill: false,
    });
    c.health(1, health::UNHEALTHY);
    let online = c.job_on_one_gpu("online", "t", qos::GUARANTEED, 1000, 0);
    let off1 = c.job_on_one_gpu("off1", "t", qos::BEST_EFFORT, 300, 1_000);
    let off2 = c.job_on_one_gpu("off2", "t", qos::BEST_EFFORT, 300, 1_000);
    let mut plan = Plan::new(c.cluster());
    assert_eq!(
        plan.apply(Decision::Place(off1, on_gpu(1))),
        Err(DecisionError::GpuNotHealthy {
            gpu: 1,
            health: health::UNHEALTHY
        })
    );
    plan.apply(Decision::Place(online, on_gpu(1))).unwrap();
    plan.apply(Decision::Place(off1, on_gpu(0))).unwrap();
    assert_eq!(
        plan.apply(Decision::Place(off2, on_gpu(0))),
        Err(DecisionError::SharedWorkersFull { gpu: 0, limit: 1 })
    );
    // The scan agrees with the validator.
    let fit = plan.job_fit(off2);
    assert!(!plan.fits(&fit, 0));
}

/// With sharing off, opportunistic work takes whole GPUs like guaranteed work, but still only
/// healthy ones (MuxFlow's X10: no offline work on a GPU its coordinator holds overlimit); the
/// node scan sees the difference although the node row cannot.
#[test]
fn opportunistic_work_avoids_unhealthy_gpus_with_sharing_off() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "T4", 16_384, 2);
    c.health(0, health::OVERLIMIT);
    let off = c.job_on_one_gpu("off", "t", qos::OPPORTUNISTIC, 1000, 1_000);
    let prod = c.job_on_one_gpu("prod", "t", qos::GUARANTEED, 1000, 1_000);
    let mut plan = Plan::new(c.cluster());
    assert_eq!(
        plan.apply(Decision::Place(off, on_gpu(0))),
        Err(DecisionError::GpuNotHealthy {
            gpu: 0,
            health: health::OVERLIMIT
        })
    );
    plan.apply(Decision::Place(prod, on_gpu(0))).unwrap();
    let fit = plan.job_fit(off);
    assert!(plan.fits(&fit, 0), "GPU 1 is healthy and free");
    plan.apply(Decision::Place(off, on_gpu(1))).unwrap();
    c.health(1, health::DISABLED);
    let plan = Plan::new(c.cluster());
    assert!(!plan.fits(&plan.job_fit(off), 0), "no healthy GPU left");
}

/// Only guaranteed work consumes quota (AntMan A7); quotas live in the
/// cluster view, and an upgrade to guaranteed is checked against them.
#[test]
fn quota_counts_guaranteed_work_and_gates_upgrades() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "V100", GB32, 4);
    c.sharing(spill(1000));
    c.quota("t", Some(1000));
    let t = c.intern("t");
    assert_eq!(c.cluster().tenant_quota_milli(t), Some(1000));
    let g1 = c.job_on_one_gpu("g1", "t", qos::GUARANTEED, 1000, 0);
    let g2 = c.job_on_one_gpu("g2", "t", qos::GUARANTEED, 1000, 0);
    let o1 = c.job_on_one_gpu("o1", "t", qos::OPPORTUNISTIC, 1000, 2_000);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(g1, on_gpu(0))).unwrap();
    assert!(matches!(
        plan.apply(Decision::Place(g2, on_gpu(1))),
        Err(DecisionError::QuotaExceeded { .. })
    ));
    plan.apply(Decision::Place(o1, on_gpu(2))).unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    // Upgrading the running opportunistic job would take the tenant past
    // its quota; once the quota grows it is allowed and moves accounts.
    let mut plan = Plan::new(c.cluster());
    assert!(matches!(
        plan.apply(Decision::SetQos(o1, qos::GUARANTEED)),
        Err(DecisionError::QuotaExceeded { .. })
    ));
    c.quota("t", Some(2000));
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::SetQos(o1, qos::GUARANTEED)).unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    let gpu = c.cluster().gpu(2);
    assert_eq!(
        (gpu.milli_used(), gpu.shared_milli(), gpu.shared_workers()),
        (1000, 0, 0)
    );
    c.quota("t", None);
    assert_eq!(c.cluster().tenant_quota_milli(t), None);
}

/// `set-qos` may precede one placement of the same job in a round, which is
/// then checked under the new QoS (AntMan A6: demote a long-queued job and
/// start it at once); nothing else may join them.
#[test]
fn set_qos_then_place_in_one_round() {
    let mut c = TestCluster::new();
    one_gpu(&mut c);
    c.sharing(spill(1000));
    let held = c.job_on_one_gpu("held", "t", qos::GUARANTEED, 1000, 0);
    let waiting = c.job_on_one_gpu("waiting", "t", qos::GUARANTEED, 1000, 4_000);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(held, on_gpu(0))).unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);

    let mut plan = Plan::new(c.cluster());
    assert!(plan.apply(Decision::Place(waiting, on_gpu(0))).is_err());
    plan.apply(Decision::SetQos(waiting, qos::OPPORTUNISTIC))
        .unwrap();
    assert_eq!(
        plan.apply(Decision::SetQos(waiting, qos::BEST_EFFORT)),
        Err(DecisionError::JobAlreadyDecided(waiting))
    );
    plan.apply(Decision::Place(waiting, on_gpu(0))).unwrap();
    assert_eq!(
        plan.apply(Decision::Preempt(waiting)),
        Err(DecisionError::JobAlreadyDecided(waiting))
    );
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    assert_eq!(c.cluster().gpu(0).shared_workers(), 1);
    assert_eq!(c.cluster().job(waiting).qos(), qos::OPPORTUNISTIC);
    // After a placement, a set-qos is a second decision.
    c.sharing(spill(2000));
    let late = c.job_on_one_gpu("late", "t", qos::OPPORTUNISTIC, 100, 100);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(late, on_gpu(0))).unwrap();
    assert_eq!(
        plan.apply(Decision::SetQos(late, qos::GUARANTEED)),
        Err(DecisionError::JobAlreadyDecided(late))
    );
}

/// GPU-granular reservations (AntMan A2/A3): three of four GPUs held for a
/// four-GPU gang; other guaranteed work stays off them, shared work may use
/// them, the holder may place on them, and a resync keeps them.
#[test]
fn gpu_reservations_close_gpus_to_guaranteed_work_only() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "V100", GB32, 4);
    c.sharing(spill(1000));
    let busy = c.job_on_one_gpu("busy", "t", qos::GUARANTEED, 1000, 0);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Place(busy, on_gpu(3))).unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    let gang = c.job("gang", "t", 1, 4);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::ReserveGpus(gang, vec![0, 1, 2]))
        .unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    assert_eq!(c.cluster().job(gang).phase(), job_phase::RESERVED);
    assert_eq!(c.cluster().job(gang).reserved_gpus(), &[0, 1, 2]);
    assert_eq!(c.cluster().gpu(1).reserved_by(), Some(gang));

    let other = c.job_on_one_gpu("other", "u", qos::GUARANTEED, 1000, 0);
    let opp = c.job_on_one_gpu("opp", "u", qos::OPPORTUNISTIC, 1000, 2_000);
    let mut plan = Plan::new(c.cluster());
    assert_eq!(
        plan.apply(Decision::Place(other, on_gpu(0))),
        Err(DecisionError::GpuReservedForOther {
            gpu: 0,
            holder: gang
        })
    );
    let fit = plan.job_fit(other);
    assert!(
        !plan.fits(&fit, 0),
        "the node row must not count reserved GPUs as idle"
    );
    plan.apply(Decision::Place(opp, on_gpu(1))).unwrap();
    assert_eq!(
        plan.apply(Decision::ReserveGpus(other, vec![2])),
        Err(DecisionError::GpuReservedForOther {
            gpu: 2,
            holder: gang
        })
    );

    // A resync keeps the reservation; removing another job renumbers it.
    let rebuilt = Cluster::from_snapshot(c.snapshot()).unwrap();
    assert_eq!(rebuilt.job(gang).reserved_gpus(), &[0, 1, 2]);
    assert_eq!(rebuilt.job(gang).phase(), job_phase::RESERVED);
    c.apply(Event::JobRemoved(busy));
    let gang = c
        .cluster()
        .jobs()
        .find(|j| j.name() == "gang")
        .unwrap()
        .index();
    assert_eq!(c.cluster().gpu(0).reserved_by(), Some(gang));
    // The holder's gang now fits on its GPUs plus the freed one.
    let mut plan = Plan::new(c.cluster());
    let fit = plan.job_fit(gang);
    assert!(plan.fits(&fit, 0));
    plan.apply(Decision::Place(
        gang,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0, 1, 2, 3],
        }],
    ))
    .unwrap();
    let decided = plan.into_decisions();
    commit(&mut c, decided);
    assert_eq!(c.cluster().gpu(0).reserved_by(), None);
    assert_eq!(c.cluster().job(gang).phase(), job_phase::RUNNING);
}

/// A job that requires one node may not spread over two (G13).
#[test]
fn locality_requirement_is_enforced() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "V100", GB32, 2);
    c.node("n1", "p", 64_000, 512_000, "V100", GB32, 2);
    let name = c.intern("local");
    let tenant = c.intern("t");
    let job = c.job_spec(JobSpec {
        name,
        tenant,
        workers: 2,
        min_workers: 2,
        max_workers: 2,
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus_per_worker: 1,
        gpu_milli: 1000,
        locality: locality::REQUIRE_ONE_NODE,
        ..JobSpec::default()
    });
    let w = |node, gpu| WorkerPlacement {
        node,
        gpus: vec![gpu],
    };
    let mut plan = Plan::new(c.cluster());
    assert_eq!(
        plan.apply(Decision::Place(job, vec![w(0, 0), w(1, 2)])),
        Err(DecisionError::LocalityViolated { job })
    );
    plan.apply(Decision::Place(job, vec![w(1, 2), w(1, 3)]))
        .unwrap();
}

/// Per GPU, the books of a mirror fed only events equal a recount from
/// the placements, by account.
fn check_books(cluster: &Cluster) {
    let g = cluster.gpu_count();
    let (mut milli, mut shared, mut workers) = (vec![0u32; g], vec![0u32; g], vec![0u32; g]);
    for job in cluster.running_jobs() {
        for w in job.placement() {
            for &gpu in &w.gpus {
                let share = if job.is_shared() {
                    shared_gpu_share(
                        job.gpus_per_worker(),
                        job.gpu_milli(),
                        job.gpu_memory_mib(),
                        cluster.gpu(gpu).memory_mib(),
                    )
                } else {
                    gpu_share(
                        job.gpus_per_worker(),
                        job.gpu_milli(),
                        job.gpu_memory_mib(),
                        cluster.gpu(gpu).memory_mib(),
                    )
                };
                if job.is_shared() {
                    shared[gpu as usize] += share.0;
                    workers[gpu as usize] += 1;
                } else {
                    milli[gpu as usize] += share.0;
                }
            }
        }
    }
    for gpu in 0..g as u32 {
        let gp = cluster.gpu(gpu);
        assert_eq!(
            gp.milli_used(),
            milli[gpu as usize],
            "guaranteed milli of GPU {gpu}"
        );
        assert_eq!(
            gp.shared_milli(),
            shared[gpu as usize],
            "shared milli of GPU {gpu}"
        );
        assert_eq!(
            gp.shared_workers(),
            workers[gpu as usize],
            "shared workers of GPU {gpu}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever the plan accepts, under any sharing rules, health and QoS
    /// mix: guaranteed use never passes a GPU, shared use never passes the
    /// operator's caps nor lands on an unhealthy GPU, the mirror's books
    /// equal a recount, and the node scan agrees with the validator.
    #[test]
    fn nothing_accepted_breaks_the_sharing_rules(
        oversub in prop::sample::select(vec![0u32, 500, 1000, 2000]),
        cap in 0u32..3,
        host_spill in any::<bool>(),
        unhealthy in any::<u8>(),
        jobs in prop::collection::vec((0u8..3, prop::sample::select(vec![250u32, 500, 1000]), 0u32..12_000), 1..30),
        upgrades in any::<u32>(),
    ) {
        let mut c = TestCluster::new();
        c.node("n0", "p", 640_000, 5_120_000, "A", 16_000, 4);
        c.node("n1", "p", 640_000, 5_120_000, "A", 16_000, 2);
        let rules = SharingRules { oversub_milli: oversub, max_shared_workers: cap, host_spill };
        c.sharing(rules);
        for gpu in 0..6 {
            if unhealthy >> gpu & 1 == 1 {
                c.health(gpu, health::UNHEALTHY);
            }
        }
        for (i, (q, milli, mem)) in jobs.iter().enumerate() {
            c.job_on_one_gpu(&format!("j{i}"), "t", *q, *milli, *mem);
        }
        let mut plan = Plan::new(c.cluster());
        let pending: Vec<_> = c.cluster().pending_jobs().collect();
        plan.place_each(pending, |p, j| p.first_fit_anywhere(j.index()));
        let decisions = plan.into_decisions();
        commit(&mut c, decisions);
        check_books(c.cluster());
        // Upgrades and downgrades of running jobs, where the plan allows.
        let mut plan = Plan::new(c.cluster());
        for (bit, job) in c.cluster().running_jobs().enumerate() {
            let to = if upgrades >> (bit % 32) & 1 == 1 { qos::GUARANTEED } else { qos::BEST_EFFORT };
            let _ = plan.apply(Decision::SetQos(job.index(), to));
        }
        let decisions = plan.into_decisions();
        commit(&mut c, decisions);
        check_books(c.cluster());
        let rebuilt = Cluster::from_snapshot(c.snapshot()).unwrap();
        check_books(&rebuilt);
        let cluster = c.cluster();
        for gpu in cluster.gpu_columns().node.iter().enumerate().map(|(g, _)| g as u32) {
            let gp = cluster.gpu(gpu);
            prop_assert!(gp.milli_used() <= FULL_GPU_MILLI);
            prop_assert!(gp.memory_free_mib() <= gp.memory_mib());
            if rules.enabled() {
                prop_assert!(gp.shared_milli() <= oversub);
                if cap > 0 {
                    prop_assert!(gp.shared_workers() <= cap);
                }
            } else {
                prop_assert_eq!(gp.shared_workers(), 0);
            }
        }
        let plan = Plan::new(cluster);
        for job in cluster.pending_jobs() {
            let fit = plan.job_fit(job.index());
            for node in 0..cluster.node_count() as u32 {
                prop_assert_eq!(plan.fits(&fit, node), plan.first_fit_worker(job.index(), node).is_some());
            }
        }
    }
}

/// Shared work may use a reserved node but not take its reservation.
#[test]
fn shared_work_cannot_reserve_what_another_job_holds() {
    let mut c = TestCluster::new();
    c.node("n0", "p", 64_000, 512_000, "V100", GB32, 4);
    c.sharing(spill(1000));
    let gang = c.job("gang", "t", 1, 4);
    let opp = c.job_on_one_gpu("opp", "u", qos::OPPORTUNISTIC, 1000, 2_000);
    let mut plan = Plan::new(c.cluster());
    plan.apply(Decision::Reserve(gang, vec![0])).unwrap();
    let decided = plan.into_decisions();
    for d in decided {
        if let Decision::Reserve(j, nodes) = d {
            c.apply(Event::JobReserved(j, nodes));
        }
    }
    let mut plan = Plan::new(c.cluster());
    assert_eq!(
        plan.apply(Decision::Reserve(opp, vec![0])),
        Err(DecisionError::ReservedForOther {
            node: 0,
            holder: gang
        })
    );
    plan.apply(Decision::Place(opp, on_gpu(1))).unwrap();
}
