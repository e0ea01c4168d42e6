//! The host serves the current contract (0.4) and the previous minor (0.3,
//! through its adapter); the policies it ships are built against 0.4.

use arbiter_host::runtime::{PolicyEngine, RuntimeConfig, SERVED_VERSIONS};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::model::{Decision, Event, JobMetric, SharingRules, health};

/// No policy here hangs: a deadline no stall of a loaded machine reaches.
fn engine() -> PolicyEngine {
    PolicyEngine::new(RuntimeConfig {
        deadline: std::time::Duration::from_secs(30),
        ..RuntimeConfig::default()
    })
    .unwrap()
}

fn placed_jobs(decisions: &[Decision]) -> Vec<u32> {
    decisions
        .iter()
        .map(|d| match d {
            Decision::Place(j, _) => *j,
            other => panic!("a first-fit scheduler only places, got {other:?}"),
        })
        .collect()
}

#[test]
fn builtins_are_built_against_the_current_contract() {
    let engine = engine();
    assert_eq!(SERVED_VERSIONS, ["0.4.0", "0.3.0"]);
    for name in arbiter_policies::names() {
        let compiled = engine
            .compile(arbiter_policies::get(name).unwrap())
            .unwrap();
        assert_eq!(compiled.contract_version(), "0.4.0", "{name}");
    }
}

/// A 0.3 component keeps working: its mirror is fed by snapshot and by
/// delta, arrivals reach it as 0.3's one `job-added` per job (0.4 sends them
/// as `jobs-added` columns), and its one-`place`-per-job answers are
/// validated and applied like any other.
#[test]
fn a_v0_3_component_is_served_through_the_adapter() {
    let engine = engine();
    let compiled = engine
        .compile(arbiter_policies::fixture("contract-v0-3").unwrap())
        .unwrap();
    assert_eq!(compiled.contract_version(), "0.3.0");
    assert_eq!(compiled.manifest.name, "contract-v0-3");

    let mut state = ClusterState::new();
    state
        .set_sharing(SharingRules {
            oversub_milli: 1000,
            max_shared_workers: 0,
            host_spill: true,
        })
        .unwrap();
    state.set_tenant_quota("t", Some(100)).unwrap();
    state.set_gpu_model_speed("T4", 333).unwrap();
    state
        .add_node(NodeRequest::gpus("v0", "training", "V100", 32_768, 4))
        .unwrap();
    state
        .add_node(NodeRequest::gpus("t0", "inference", "T4", 16_384, 2))
        .unwrap();
    let a = state.submit(JobRequest::gpus("a", "t", 1, 2)).unwrap();
    state.submit(JobRequest::gpus("b", "t", 1, 2)).unwrap();
    state.submit(JobRequest::gpus("c", "t", 1, 4)).unwrap();

    // Round 1: the mirror comes from a snapshot.
    let (_, round) = state.begin_round(100);
    let mut instance = compiled.instantiate().unwrap();
    instance.sync_to(&state).unwrap();
    let decisions = instance.schedule(round).unwrap();
    assert_eq!(placed_jobs(&decisions), vec![0, 1], "c does not fit");
    state.validate(&decisions, 100).unwrap();
    state.apply(decisions).unwrap();

    // Events 0.2 has no words for, between the rounds.
    state.set_now(60_000);
    state.report_progress(a, 1_000).unwrap();
    state.set_gpu_health("t0", 1, health::UNHEALTHY).unwrap();
    state
        .record_job_metrics(vec![JobMetric {
            job: 0,
            iteration_ms: 120,
            ..JobMetric::default()
        }])
        .unwrap();
    state.submit(JobRequest::gpus("d", "t", 1, 2)).unwrap();
    state.submit(JobRequest::gpus("e", "t", 1, 4)).unwrap();

    // Round 2: the mirror catches up by delta; `d` fits only on the T4
    // node, `e` nowhere.
    let (delta, round) = state.begin_round(100);
    let arrivals = delta
        .events
        .iter()
        .filter(|e| matches!(e, Event::JobAdded(_)))
        .count();
    assert_eq!(arrivals, 2, "a run of arrivals, which 0.4 sends as columns");
    instance.sync_to(&state).unwrap();
    assert_eq!(instance.mirror_epoch(), Some(state.epoch()));
    let decisions = instance.schedule(round).unwrap();
    assert_eq!(placed_jobs(&decisions), vec![3]);
    match &decisions[0] {
        Decision::Place(_, w) => assert_eq!(w[0].node, 1),
        _ => unreachable!(),
    }
    state.validate(&decisions, 100).unwrap();
    state.apply(decisions).unwrap();
}

/// A built-in policy decides the same as a component and natively when the
/// round's delta carries a run of arrivals (0.4's `jobs-added`) and it starts
/// several jobs at once (its `place-batch`): packing and unpacking the
/// boundary's columns changes no decision.
#[test]
fn a_component_decides_as_its_native_build_across_the_columnar_boundary() {
    use arbiter_host::runtime::PolicyInstance;
    use arbiter_policy_sdk::Runtime;
    use policy_best_fit::BestFit;

    let compiled = engine()
        .compile(arbiter_policies::get("best-fit").unwrap())
        .unwrap();
    let mut wasm = compiled.instantiate().unwrap();
    let mut native = PolicyInstance::native(Box::new(Runtime::<BestFit>::new()));
    let mut state = ClusterState::new();
    for n in 0..4 {
        state
            .add_node(NodeRequest::gpus(
                format!("n{n}"),
                "training",
                "V100",
                32_768,
                4,
            ))
            .unwrap();
    }
    state.submit(JobRequest::gpus("first", "t", 1, 2)).unwrap();
    for round_no in 0..3u32 {
        let (delta, round) = state.begin_round(100);
        if round_no > 0 {
            let arrivals = delta
                .events
                .iter()
                .filter(|e| matches!(e, Event::JobAdded(_)))
                .count();
            assert_eq!(arrivals, 5, "a run of arrivals in round {round_no}");
        }
        wasm.sync_to(&state).unwrap();
        native.sync_to(&state).unwrap();
        let decided = wasm.schedule(round).unwrap();
        assert_eq!(decided, native.schedule(round).unwrap(), "round {round_no}");
        if round_no > 0 {
            let places = placed_jobs(&decided).len();
            assert!(places >= 2, "round {round_no} placed {places}: no batch");
        }
        state.validate(&decided, 100).unwrap();
        state.apply(decided).unwrap();
        for k in 0..5u32 {
            let name = format!("r{round_no}-{k}");
            state
                .submit(JobRequest::gpus(name, "t", 1 + k % 2, 1 + k % 2))
                .unwrap();
        }
    }
}
