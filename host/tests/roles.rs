//! The role framework: quarantine by fault rate, and a native last resort
//! whose answer the validator always accepts.

use arbiter_host::registry::{PolicySlot, QuarantineRule};
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::runtime::{PolicyEngine, PolicyFault, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::model::{Decision, node_state};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// Loads `policy` (a built-in name, or `fixture:NAME`) into `slot` as its
/// new active generation; returns the generation's id.
fn load(slot: &PolicySlot, policy: &str, config: Option<&str>) -> u64 {
    load_under(slot, policy, config, Duration::from_secs(30))
}

/// [`load`] with a policy-call deadline: 30 s there, so a loaded machine
/// never turns a healthy call or a fault for what a policy does (a trap, a
/// bad answer) into a deadline fault; short only for a policy that hangs.
fn load_under(slot: &PolicySlot, policy: &str, config: Option<&str>, deadline: Duration) -> u64 {
    let bytes = match policy.strip_prefix("fixture:") {
        Some(name) => arbiter_policies::fixture(name),
        None => arbiter_policies::get(policy),
    }
    .unwrap_or_else(|| panic!("no policy `{policy}`"));
    let compiled = PolicyEngine::new(RuntimeConfig {
        deadline,
        ..RuntimeConfig::default()
    })
    .expect("engine")
    .compile(bytes)
    .expect("compile");
    slot.swap(compiled, config.map(str::to_string), None, None)
        .expect("load")
        .id
}

fn cluster(nodes: u32, jobs: u32) -> ClusterState {
    let mut s = ClusterState::new();
    for i in 0..nodes {
        s.add_node(NodeRequest::gpus(
            format!("n{i}"),
            "default",
            "V100",
            32_768,
            4,
        ))
        .unwrap();
    }
    for j in 0..jobs {
        s.submit(JobRequest::gpus(format!("job{j}"), "t", 1, 1))
            .unwrap();
    }
    s
}

/// Runs `rounds` rounds with healthy fifo under a flapping fixture; returns
/// who served each round and the flapping generation's fault count.
fn flapping(mode: &str, rounds: usize) -> (Vec<Served>, u64, u64, bool) {
    let slot = Arc::new(
        PolicySlot::new("flap").with_quarantine_rule(QuarantineRule {
            consecutive: 3,
            window: 12,
            window_faults: 4,
        }),
    );
    let good = load(&slot, "fifo", None);
    // `hang-flap` pays its deadline in every other round: 1 s, so that its working rounds
    // (bound by the same deadline) stay well inside it on a loaded machine; one of them
    // faulting would add a fault between two hangs and trip the consecutive rule instead.
    let deadline = Duration::from_millis(if mode == "hang-flap" { 1_000 } else { 30_000 });
    let bad = load_under(
        &slot,
        "fixture:misbehave",
        Some(&format!("mode = {mode}")),
        deadline,
    );
    let mut state = cluster(4, 40);
    let mut driver = RoundDriver::new(slot.clone());
    let served = (0..rounds)
        .map(|i| {
            state
                .submit(JobRequest::gpus(format!("late{i}"), "t", 1, 1))
                .unwrap();
            driver.run_round(&mut state).served
        })
        .collect();
    assert_eq!(slot.active_id(), Some(good));
    let bad = slot.get(bad).expect("still loaded");
    (served, good, bad.total_faults(), bad.is_quarantined())
}

#[test]
fn a_policy_that_traps_every_other_round_is_quarantined_by_its_fault_rate() {
    let (served, good, faults, quarantined) = flapping("flap", 30);
    assert!(quarantined);
    // Never two faults in a row, so only the rate rule (4 in 12) fires.
    assert_eq!(faults, 4, "{served:?}");
    assert!(
        served[served.len() - 10..]
            .iter()
            .all(|s| *s == Served::Active(good)),
        "{served:?}"
    );
}

#[test]
fn a_policy_that_hangs_every_other_round_is_quarantined_by_its_fault_rate() {
    let (served, good, faults, quarantined) = flapping("hang-flap", 30);
    assert!(quarantined);
    assert_eq!(faults, 4, "{served:?}");
    assert_eq!(served.last(), Some(&Served::Active(good)));
}

#[test]
fn with_every_generation_quarantined_the_native_policy_serves_and_rollback_refuses() {
    let slot = Arc::new(PolicySlot::new("trap").with_quarantine_after(2));
    let bad = load(&slot, "fixture:misbehave", Some("mode = trap"));
    let bad = slot.get(bad).expect("loaded");
    let mut state = cluster(2, 12);
    let mut driver = RoundDriver::new(slot.clone());
    let served: Vec<Served> = (0..4)
        .map(|_| driver.run_round(&mut state).served)
        .collect();
    assert_eq!(served, vec![Served::Native; 4]);
    assert!(bad.is_quarantined());
    assert_eq!(
        bad.total_faults(),
        2,
        "a quarantined generation is not asked again"
    );
    let Err(err) = slot.rollback(Some(bad.id)) else {
        panic!("rolled back to a quarantined generation");
    };
    assert!(err.to_string().contains("quarantined"), "{err}");
}

/// A tenant past its quota, as the host core sees it when nothing gates
/// admission: since contract 0.3 quotas are in the cluster view, so the
/// active policy's own plan keeps the tenant within its quota and places
/// everything else that fits (under 0.2 its answer was refused and the
/// native fallback served the round).
#[test]
fn a_policy_sees_quotas_and_places_what_fits_when_a_tenant_is_past_its_quota() {
    let slot = Arc::new(PolicySlot::new("best-fit"));
    load(&slot, "best-fit", None);
    let g = slot.active_id().unwrap();
    let mut state = cluster(2, 0);
    state.set_tenant_quota("a", Some(2)).unwrap();
    for i in 0..3 {
        state
            .submit(JobRequest::gpus(format!("a{i}"), "a", 1, 1))
            .unwrap();
    }
    let admin = state
        .submit(JobRequest::gpus("admin", "admin", 1, 1))
        .unwrap();
    let mut driver = RoundDriver::new(slot);
    let report = driver.run_round(&mut state);
    assert_eq!(report.served, Served::Active(g), "{:?}", report.faults);
    assert!(report.faults.is_empty(), "{:?}", report.faults);
    assert_eq!(report.applied.started.len(), 3, "{report:?}");
    assert!(report.applied.started.contains(&admin));
}

#[derive(Debug, Clone)]
struct Scenario {
    nodes: Vec<(u32, bool)>,
    jobs: Vec<(u8, u32, u32, u32)>,
    quotas: [Option<u32>; 3],
    reserve: Option<(usize, usize)>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec((1u32..=8, prop::bool::weighted(0.25)), 1..6),
        prop::collection::vec((0u8..3, 1u32..=3, 1u32..=4, 0u32..=1500), 1..30),
        prop::array::uniform3(prop::option::of(0u32..6)),
        prop::option::of((0usize..30, 0usize..6)),
    )
        .prop_map(|(nodes, jobs, quotas, reserve)| Scenario {
            nodes,
            jobs,
            quotas,
            reserve,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever the state (quotas, cordons, reservations, fractional GPUs,
    /// gangs), the native last resort's answer passes the validator: a round
    /// served by it has no fault and is never `Nobody`.
    #[test]
    fn the_native_fallback_never_answers_what_the_validator_refuses(s in scenario()) {
        let mut state = ClusterState::new();
        for (i, &(gpus, cordoned)) in s.nodes.iter().enumerate() {
            let name = format!("n{i}");
            state
                .add_node(NodeRequest::gpus(&name, "default", "A100", 40_960, gpus))
                .unwrap();
            if cordoned {
                state.set_node_state(&name, node_state::CORDONED).unwrap();
            }
        }
        for (t, q) in s.quotas.iter().enumerate() {
            state.set_tenant_quota(&format!("t{t}"), *q).unwrap();
        }
        for (j, &(tenant, workers, per_worker, milli)) in s.jobs.iter().enumerate() {
            let mut req = JobRequest::gpus(format!("j{j}"), format!("t{tenant}"), workers, per_worker);
            if per_worker == 1 && milli > 0 && milli < 1000 {
                req.gpu_milli = milli;
            }
            state.submit(req).unwrap();
        }
        if let Some((job, node)) = s.reserve {
            let (job, node) = (job % s.jobs.len(), node % s.nodes.len());
            let reserve = vec![Decision::Reserve(job as u32, vec![node as u32])];
            state.begin_round(100);
            if state.validate(&reserve, 100).is_ok() {
                state.apply(reserve).unwrap();
            }
        }
        let mut driver = RoundDriver::new(Arc::new(PolicySlot::new("empty")));
        for _ in 0..3 {
            let report = driver.run_round(&mut state);
            prop_assert_eq!(report.served, Served::Native);
            prop_assert!(report.faults.is_empty(), "{:?}", report.faults);
        }
    }
}

mod reclaim {
    use super::*;
    use arbiter_host::roles::reclaim::{ReclaimDriver, native_plan, validate_plan};
    use arbiter_policy_sdk::model::{ReclaimPlan, ReclaimRequest, WorkerPlacement};

    /// Four 4-GPU servers; job j0 on n0 (2 GPUs), j1 on n1 and n2 (a gang of
    /// two 1-GPU workers), j2 on n2 (1 GPU). Nothing on n3.
    fn loaned() -> ClusterState {
        let mut s = cluster(4, 0);
        for (name, workers, per) in [("j0", 1, 2), ("j1", 2, 1), ("j2", 1, 1)] {
            s.submit(JobRequest::gpus(name, "t", workers, per)).unwrap();
        }
        s.begin_round(100);
        let gpu = |node: u32, k: u32| node * 4 + k;
        let place = |node: u32, gpus: Vec<u32>| WorkerPlacement { node, gpus };
        let decisions = vec![
            Decision::Place(0, vec![place(0, vec![gpu(0, 0), gpu(0, 1)])]),
            Decision::Place(
                1,
                vec![place(1, vec![gpu(1, 0)]), place(2, vec![gpu(2, 0)])],
            ),
            Decision::Place(2, vec![place(2, vec![gpu(2, 1)])]),
        ];
        s.validate(&decisions, 100).unwrap();
        s.apply(decisions).unwrap();
        s.seal();
        s
    }

    fn request(s: &ClusterState, count: u32) -> ReclaimRequest {
        ReclaimRequest {
            epoch: s.epoch(),
            candidates: vec![0, 1, 2, 3],
            count,
            max_decisions: 100,
        }
    }

    fn plan(nodes: &[u32], decisions: Vec<Decision>) -> ReclaimPlan {
        ReclaimPlan {
            nodes: nodes.to_vec(),
            decisions,
        }
    }

    #[test]
    fn a_plan_returns_exactly_count_distinct_candidates_and_empties_them() {
        let s = loaned();
        let r = request(&s, 2);
        let ok = plan(&[3, 0], vec![Decision::Preempt(0)]);
        assert_eq!(validate_plan(&s, &r, &ok), Ok(()));
        let refused = [
            plan(&[3], vec![]),                           // too few
            plan(&[3, 3], vec![]),                        // duplicate
            plan(&[3, 7], vec![]),                        // not a candidate
            plan(&[3, 0], vec![]),                        // leaves j0 on n0
            plan(&[3, 1], vec![Decision::Preempt(2)]),    // leaves j1 on n1
            plan(&[3, 0], vec![Decision::Preempt(9)]),    // unknown job
            plan(&[3, 0], vec![Decision::Preempt(0); 2]), // decided twice
        ];
        for p in refused {
            assert!(validate_plan(&s, &r, &p).is_err(), "{p:?} must be refused");
        }
    }

    #[test]
    fn the_native_plan_is_smallest_count_first_and_always_valid() {
        let s = loaned();
        for count in 1..=4 {
            let r = request(&s, count);
            let p = native_plan(&s, &r);
            assert_eq!(validate_plan(&s, &r, &p), Ok(()), "count {count}: {p:?}");
        }
        // Jobs per node: n0 1, n1 1, n2 2, n3 0.
        assert_eq!(native_plan(&s, &request(&s, 3)).nodes, vec![3, 0, 1]);
    }

    /// A scheduler-only policy is not asked to reclaim, and not blamed for it: reclaims one
    /// after another (more than the three consecutive faults that quarantine) are
    /// answered natively, leave no fault and keep it active — it used to take three
    /// `arbiter nodes reclaim` to quarantine the operator's scheduler.
    #[test]
    fn a_policy_without_the_role_falls_back_to_the_native_plan_without_a_fault() {
        let slot = Arc::new(PolicySlot::new("fifo"));
        let fifo = load(&slot, "fifo", None);
        let mut s = loaned();
        let driver = ReclaimDriver::new(Arc::clone(&slot));
        for _ in 0..5 {
            let out = driver.reclaim(&mut s, &[0, 1, 2, 3], 2, 100);
            assert_eq!(out.served, Served::Native);
            assert!(out.faults.is_empty(), "{:?}", out.faults);
            assert_eq!(out.plan.nodes, vec![3, 0]);
            assert_eq!(out.plan.decisions, vec![Decision::Preempt(0)]);
        }
        let active = slot.active().expect("fifo stays active");
        assert_eq!(active.id, fifo);
        assert!(!active.is_quarantined());
        assert_eq!(active.total_faults(), 0);
    }

    /// Passed over, not faulted: an older generation that declares the role answers.
    #[test]
    fn an_older_generation_with_the_role_answers_for_an_active_one_without_it() {
        let slot = Arc::new(PolicySlot::new("mixed"));
        let aryl = load(&slot, "aryl", None);
        let fifo = load(&slot, "fifo", None);
        let mut s = loaned();
        let out = ReclaimDriver::new(Arc::clone(&slot)).reclaim(&mut s, &[0, 1, 2, 3], 2, 100);
        assert_eq!(out.served, Served::Fallback(aryl));
        assert!(out.faults.is_empty(), "{:?}", out.faults);
        assert_eq!(slot.active_id(), Some(fifo));
    }

    /// One slot asked for two cells' reclaims (the control plane's `reclaim` slot answers
    /// for every cell): the instance's mirror follows the state it is asked about. Both
    /// states are at the same epoch, so an epoch alone says the mirror of the empty one is
    /// current for the busy one — aryl then returned nodes with jobs left on them.
    #[test]
    fn one_instance_asked_about_two_states_mirrors_each_in_turn() {
        let slot = Arc::new(PolicySlot::new("reclaim"));
        let g = load(&slot, "aryl", None);
        let driver = ReclaimDriver::new(Arc::clone(&slot));
        let mut busy = loaned();
        let mut idle = cluster(4, 0);
        while idle.epoch() < busy.epoch() {
            idle.begin_round(100);
        }
        assert_eq!(idle.epoch(), busy.epoch());
        for busy_turn in [false, true, false] {
            let (name, state) = if busy_turn {
                ("busy", &mut busy)
            } else {
                ("idle", &mut idle)
            };
            let out = driver.reclaim(state, &[0, 1, 2], 2, 100);
            assert_eq!(out.served, Served::Active(g), "{name}: {:?}", out.faults);
            assert_eq!(validate_plan(state, &out.request, &out.plan), Ok(()));
        }
        let busy_plan = driver.reclaim(&mut busy, &[0, 1, 2], 2, 100).plan;
        assert!(
            !busy_plan.decisions.is_empty(),
            "two of n0..n2 back from the busy state preempt something: {busy_plan:?}"
        );
    }

    #[test]
    fn aryls_reclaim_plan_passes_the_one_check() {
        let slot = Arc::new(PolicySlot::new("aryl"));
        let g = load(&slot, "aryl", None);
        let mut s = loaned();
        let out = ReclaimDriver::new(slot).reclaim(&mut s, &[0, 1, 2, 3], 2, 100);
        assert_eq!(out.served, Served::Active(g), "{:?}", out.faults);
        assert_eq!(validate_plan(&s, &out.request, &out.plan), Ok(()));
    }
}

mod matcher {
    use super::*;
    use arbiter_host::roles::matcher::{MatcherDriver, pairing_decisions, validate_pairings};
    use arbiter_policy_sdk::model::{
        MatchRequest, Pairing, SharingRules, WorkerPlacement, WorkloadProfile, qos,
    };

    fn profile(job: u32, sm: u8) -> WorkloadProfile {
        WorkloadProfile {
            job,
            utilization_pct: sm,
            sm_activity_pct: sm,
            memory_mib: 2048,
            throughput: 1.0,
            ..WorkloadProfile::default()
        }
    }

    /// Two 4-GPU nodes with sharing on: jobs 0 and 1 run guaranteed on
    /// GPUs 0 and 4, jobs 2 and 3 are pending best-effort one-GPU jobs.
    fn colocation() -> ClusterState {
        let mut state = cluster(2, 2);
        state
            .set_sharing(SharingRules {
                oversub_milli: 1000,
                max_shared_workers: 1,
                host_spill: true,
            })
            .unwrap();
        let place = vec![
            Decision::Place(
                0,
                vec![WorkerPlacement {
                    node: 0,
                    gpus: vec![0],
                }],
            ),
            Decision::Place(
                1,
                vec![WorkerPlacement {
                    node: 1,
                    gpus: vec![4],
                }],
            ),
        ];
        state.validate(&place, 10).unwrap();
        state.apply(place).unwrap();
        for j in 2..4 {
            let mut job = JobRequest::gpus(format!("job{j}"), "t", 1, 1);
            job.qos = qos::BEST_EFFORT;
            job.gpu_memory_mib = 4_096;
            state.submit(job).unwrap();
        }
        state
    }

    fn slot_of(policy: &str) -> Arc<PolicySlot> {
        let slot = Arc::new(PolicySlot::new(policy));
        load(&slot, policy, None);
        slot
    }

    #[test]
    fn a_real_matcher_component_answers_validated_pairings() {
        let slot = slot_of("greedy-matcher");
        let g = slot.active_id().unwrap();
        let mut state = colocation();
        let out = MatcherDriver::new(slot).match_workloads(
            &mut state,
            &[0, 1],
            &[2, 3],
            vec![
                profile(0, 60),
                profile(1, 25),
                profile(2, 40),
                profile(3, 90),
            ],
        );
        assert_eq!(out.served, Served::Active(g), "{:?}", out.faults);
        assert_eq!(
            out.pairings,
            vec![
                Pairing {
                    online: 1,
                    offline: 3,
                    gpu: 4,
                    sm_percent: 75
                },
                Pairing {
                    online: 0,
                    offline: 2,
                    gpu: 0,
                    sm_percent: 40
                },
            ]
        );
        // Each pairing becomes a placement of the offline job on the online
        // job's GPU, valid under the sharing rules, applied by the one path.
        let on = |gpu: u32| {
            vec![WorkerPlacement {
                node: gpu / 4,
                gpus: vec![gpu],
            }]
        };
        assert_eq!(
            out.decisions,
            vec![Decision::Place(3, on(4)), Decision::Place(2, on(0))]
        );
        state.apply(out.decisions).unwrap();
        assert_eq!(state.cluster().gpu(0).shared_workers(), 1);
        assert_eq!(state.cluster().gpu(0).milli_used(), 1000);
    }

    /// A pairing the sharing rules refuse (sharing off: the online job's GPU
    /// is full) is a fault: the check that turns a policy's answer into one.
    /// `greedy-matcher` checks its pairings against the same rules, so it
    /// answers nothing there rather than something the host refuses.
    #[test]
    fn a_pairing_the_validator_refuses_is_a_fault() {
        let mut state = colocation();
        state.set_sharing(SharingRules::default()).unwrap();
        let gpu = state.cluster().job(0).placement()[0].gpus[0];
        let refused = [Pairing {
            online: 0,
            offline: 2,
            gpu,
            sm_percent: 50,
        }];
        assert!(matches!(
            pairing_decisions(&state, &refused),
            Err(PolicyFault::InvalidDecision { .. })
        ));
        let out = MatcherDriver::new(slot_of("greedy-matcher")).match_workloads(
            &mut state,
            &[0, 1],
            &[2, 3],
            vec![profile(0, 60), profile(1, 25)],
        );
        assert!(matches!(out.served, Served::Active(_)), "{:?}", out.served);
        assert!(out.pairings.is_empty() && out.decisions.is_empty());
        assert!(out.faults.is_empty(), "{:?}", out.faults);
    }

    #[test]
    fn a_policy_without_the_role_leaves_offline_work_unpaired() {
        let mut state = cluster(2, 4);
        let out =
            MatcherDriver::new(slot_of("fifo")).match_workloads(&mut state, &[0], &[1], Vec::new());
        assert_eq!(out.served, Served::Native);
        assert!(out.pairings.is_empty());
        assert!(out.faults.is_empty(), "{:?}", out.faults);
    }

    #[test]
    fn impossible_pairings_are_refused() {
        let request = MatchRequest {
            epoch: 1,
            online: vec![0, 1],
            offline: vec![2, 3],
            profiles: Vec::new(),
        };
        let p = |online, offline, sm_percent| Pairing {
            online,
            offline,
            gpu: 0,
            sm_percent,
        };
        assert_eq!(
            validate_pairings(&request, &[p(0, 2, 50), p(1, 3, 100)]),
            Ok(())
        );
        for bad in [
            vec![p(2, 3, 50)],              // online is not an online candidate
            vec![p(0, 1, 50)],              // offline is not an offline candidate
            vec![p(0, 2, 50), p(0, 3, 50)], // one online GPU twice
            vec![p(0, 2, 50), p(1, 2, 50)], // one offline job twice
            vec![p(0, 2, 0)],               // no SMs
            vec![p(0, 2, 101)],             // more than all of them
        ] {
            assert!(validate_pairings(&request, &bad).is_err(), "{bad:?}");
        }
    }
}

mod tenant {
    use super::*;
    use arbiter_host::registry::FaultInput;
    use arbiter_host::roles::tenant::{AdmissionRequest, admit};
    use arbiter_policy_sdk::model::{TenantJob, TenantView};

    fn request(mode_jobs: u32) -> AdmissionRequest {
        AdmissionRequest {
            view: TenantView {
                now_ms: 5,
                tenant: "t".into(),
                gpu_quota: 2,
                gpus_in_use: 0,
                jobs: (0..mode_jobs)
                    .map(|position| TenantJob {
                        position,
                        name: format!("j{position}"),
                        gpus: 1,
                        ..TenantJob::default()
                    })
                    .collect(),
            },
            demand_milli: vec![1000; mode_jobs as usize],
            quota_milli: Some(2000),
            claimed_milli: 0,
        }
    }

    fn slot(mode: &str) -> (Arc<PolicySlot>, u64) {
        let slot = Arc::new(PolicySlot::new("tenant:t").with_quarantine_after(2));
        let g = load(&slot, "fixture:misbehave", Some(&format!("mode = {mode}")));
        (slot, g)
    }

    #[test]
    fn a_trapping_tenant_policy_is_quarantined_with_its_input_and_the_quota_still_holds() {
        let (slot, g) = slot("trap");
        let r = request(3);
        for call in 0..3 {
            let a = admit(Some(&slot), call, &r);
            assert_eq!(a.served, Served::Native);
            assert_eq!(a.release, vec![0, 1], "within the 2-GPU quota");
            assert_eq!(a.faults.len(), usize::from(call < 2), "call {call}");
        }
        let generation = slot.get(g).unwrap();
        assert!(generation.is_quarantined());
        let record = generation.last_fault().expect("fault record");
        assert_eq!(record.input, FaultInput::Tenant(r.view.clone()));
    }

    #[test]
    fn an_impossible_verdict_is_a_fault_and_a_good_one_is_followed() {
        let (slot, _) = slot("bad-verdict");
        let a = admit(Some(&slot), 1, &request(3));
        assert!(
            matches!(a.faults[..], [(Some(_), PolicyFault::BadAnswer(_))]),
            "{a:?}"
        );
        let (slot, g) = slot_ok();
        let a = admit(Some(&slot), 1, &request(3));
        assert_eq!((a.served, a.release), (Served::Active(g), vec![0, 1]));
    }

    fn slot_ok() -> (Arc<PolicySlot>, u64) {
        slot("ok")
    }
}

mod coordinator {
    use super::load;
    use arbiter_host::registry::PolicySlot;
    use arbiter_host::roles::Served;
    use arbiter_host::roles::coordinator::{
        ActionRules, CoordinatorDriver, InvalidActions, NodeSurface, validate_actions,
    };
    use arbiter_host::runtime::PolicyFault;
    use arbiter_policy_sdk::model::{GpuStatus, NodeAction, NodeView, WorkloadStatus, health};
    use std::sync::Arc;

    fn view() -> NodeView {
        NodeView {
            now_ms: 1,
            gpus: vec![GpuStatus {
                index: 0,
                ..GpuStatus::default()
            }],
            workloads: vec![WorkloadStatus {
                id: 7,
                ..WorkloadStatus::default()
            }],
            ..NodeView::default()
        }
    }

    fn drop_rules() -> ActionRules {
        ActionRules {
            invalid_actions: InvalidActions::DropAction,
            ..ActionRules::default()
        }
    }

    #[test]
    fn validation_refuses_what_the_view_cannot_justify() {
        let ok = [
            NodeAction::SetMemoryLimit(7, 0),
            NodeAction::SetMemoryLimit(7, u32::MAX),
            NodeAction::SetComputeShare(7, 1),
            NodeAction::SetComputeShare(7, 1000),
            NodeAction::SetMpsThreadPct(7, 100),
            NodeAction::Freeze(7),
            NodeAction::Resume(7),
            NodeAction::Evict(7),
            NodeAction::SetHealth(0, health::DISABLED),
        ];
        let checked = validate_actions(&view(), ok.to_vec(), &drop_rules()).expect("valid");
        assert_eq!(checked.actions, ok);
        assert!(checked.refused.is_empty());
        let bad = [
            NodeAction::SetComputeShare(7, 0),
            NodeAction::SetComputeShare(7, 1001),
            NodeAction::SetComputeShare(8, 500),
            NodeAction::SetMpsThreadPct(7, 0),
            NodeAction::SetMpsThreadPct(7, 101),
            NodeAction::SetMemoryLimit(99, 10),
            NodeAction::Freeze(8),
            NodeAction::Resume(8),
            NodeAction::Evict(u32::MAX),
            NodeAction::SetHealth(1, health::HEALTHY),
            NodeAction::SetHealth(0, 5),
        ];
        let checked = validate_actions(&view(), bad.to_vec(), &drop_rules()).expect("dropped");
        assert!(checked.actions.is_empty());
        assert_eq!(checked.refused.len(), bad.len());
    }

    #[test]
    fn an_invalid_action_rejects_the_call_or_only_itself() {
        let answer = vec![NodeAction::Freeze(7), NodeAction::Evict(8)];
        let rejected = validate_actions(&view(), answer.clone(), &ActionRules::default())
            .expect_err("rejected");
        assert_eq!(rejected.fault.kind(), "bad-answer");
        assert_eq!(rejected.refused.len(), 1);
        assert_eq!(rejected.refused[0].index, 1);
        let checked = validate_actions(&view(), answer, &drop_rules()).expect("accepted");
        assert_eq!(checked.actions, [NodeAction::Freeze(7)]);
        assert_eq!(checked.refused.len(), 1);
        // Two entities in the view: at most 2 × 1 + 8 actions.
        let rules = ActionRules {
            max_actions_per_entity: 1,
            ..drop_rules()
        };
        let flood = vec![NodeAction::Freeze(7); 11];
        assert!(matches!(
            validate_actions(&view(), flood, &rules).map_err(|r| r.fault),
            Err(PolicyFault::TooManyDecisions {
                count: 11,
                limit: 10
            })
        ));
    }

    /// Simulated GPUs in virtual time: what a simulator would give a coordinator.
    struct SimulatedNode {
        now_ms: u64,
        gpus: Vec<GpuStatus>,
        workloads: Vec<WorkloadStatus>,
        applied: Vec<NodeAction>,
    }

    impl NodeSurface for SimulatedNode {
        fn view(&mut self) -> NodeView {
            NodeView {
                now_ms: self.now_ms,
                gpus: self.gpus.clone(),
                workloads: self.workloads.clone(),
                ..NodeView::default()
            }
        }

        fn apply_actions(&mut self, actions: &[NodeAction]) -> Vec<Result<(), String>> {
            self.applied.extend_from_slice(actions);
            actions
                .iter()
                .map(|a| match *a {
                    NodeAction::SetHealth(g, code) => {
                        let gpu = self.gpus.iter_mut().find(|x| x.index == g);
                        gpu.map(|x| x.health = code)
                            .ok_or_else(|| "no such GPU".into())
                    }
                    _ => Ok(()),
                })
                .collect()
        }
    }

    fn simulated() -> SimulatedNode {
        SimulatedNode {
            now_ms: 0,
            gpus: (0..2)
                .map(|index| GpuStatus {
                    index,
                    utilization_pct: 30,
                    sm_activity_pct: 30,
                    sm_clock_mhz: 1_400,
                    max_sm_clock_mhz: 1_400,
                    memory_used_mib: 4_000,
                    memory_total_mib: 16_000,
                    health: health::HEALTHY,
                    observed_ok: true,
                    ..GpuStatus::default()
                })
                .collect(),
            workloads: Vec::new(),
            applied: Vec::new(),
        }
    }

    #[test]
    fn the_node_policy_runs_on_simulated_gpus_through_the_host_driver() {
        // MuxFlow's SysMonitor, the built-in node policy, as a Wasm component.
        let slot = Arc::new(PolicySlot::new("node"));
        let generation = load(&slot, "sysmonitor", None);
        let driver = CoordinatorDriver::new(slot, ActionRules::default());
        let mut node = simulated();
        let mut served = Vec::new();
        for step in 0..20 {
            node.now_ms = step * 100;
            let out = driver.step(&mut node);
            assert!(out.faults.is_empty(), "{:?}", out.faults);
            assert!(out.results.iter().all(Result::is_ok));
            served.push(out.served);
        }
        assert!(served.iter().all(|s| *s == Served::Active(generation)));
        // The policy's answers reached the simulated node (it publishes the
        // GPUs' health), and only valid ones did.
        assert!(
            node.applied
                .iter()
                .any(|a| matches!(a, NodeAction::SetHealth(0 | 1, _))),
            "{:?}",
            node.applied
        );
    }

    #[test]
    fn a_policy_without_the_role_is_not_asked_and_the_node_holds_steady() {
        let slot = Arc::new(PolicySlot::new("node"));
        load(&slot, "best-fit", None);
        let driver = CoordinatorDriver::new(slot.clone(), ActionRules::default());
        let mut node = simulated();
        for step in 0..4 {
            node.now_ms = step * 100;
            let out = driver.step(&mut node);
            assert!(out.actions.is_empty());
            assert_eq!(out.served, Served::Native);
            assert!(out.faults.is_empty(), "{:?}", out.faults);
        }
        assert!(node.applied.is_empty());
        assert!(slot.active().is_some_and(|g| !g.is_quarantined()));
    }
}
