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

fn engine() -> PolicyEngine {
    PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_millis(50),
        ..RuntimeConfig::default()
    })
    .expect("engine")
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
    let engine = engine();
    let slot = Arc::new(
        PolicySlot::new("flap").with_quarantine_rule(QuarantineRule {
            consecutive: 3,
            window: 12,
            window_faults: 4,
        }),
    );
    let good = slot
        .swap(
            engine
                .compile(arbiter_policies::get("fifo").unwrap())
                .unwrap(),
            None,
            None,
            None,
        )
        .unwrap();
    let bad = slot
        .swap(
            engine
                .compile(arbiter_policies::fixture("misbehave").unwrap())
                .unwrap(),
            Some(format!("mode = {mode}")),
            None,
            None,
        )
        .unwrap();
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
    assert_eq!(slot.active_id(), Some(good.id));
    (served, good.id, bad.total_faults(), bad.is_quarantined())
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
    let engine = engine();
    let slot = Arc::new(PolicySlot::new("trap").with_quarantine_after(2));
    let bad = slot
        .swap(
            engine
                .compile(arbiter_policies::fixture("misbehave").unwrap())
                .unwrap(),
            Some("mode = trap".into()),
            None,
            None,
        )
        .unwrap();
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
/// admission: the active policy's answer is refused (it cannot see quotas
/// in contract 0.2), and the native fallback places everything that fits.
#[test]
fn the_native_fallback_places_what_fits_when_a_tenant_is_past_its_quota() {
    let engine = engine();
    let slot = Arc::new(PolicySlot::new("best-fit"));
    slot.swap(
        engine
            .compile(arbiter_policies::get("best-fit").unwrap())
            .unwrap(),
        None,
        None,
        None,
    )
    .unwrap();
    let mut state = cluster(2, 0);
    state.set_tenant_quota("a", Some(2));
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
    assert_eq!(report.served, Served::Native);
    assert!(
        matches!(
            report.faults[..],
            [(Some(_), PolicyFault::InvalidDecision { .. })]
        ),
        "{:?}",
        report.faults
    );
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
            state.set_tenant_quota(&format!("t{t}"), *q);
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
