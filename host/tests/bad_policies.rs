//! Bad input: every kind of broken component and misbehaving policy gets a
//! clear error or a fallback; the host keeps serving rounds and its state is
//! exactly what the healthy fallback would have produced.

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::{RoundDriver, RoundFaults, Served};
use arbiter_host::runtime::{PolicyEngine, PolicyFault, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::DecisionError;
use std::sync::Arc;
use std::time::Duration;

/// The deadline of a policy that runs past any deadline (`loop`,
/// `log-flood`): it pays it every round.
const HASTY: Duration = Duration::from_millis(100);

/// The deadline of every other policy here: what those fault for (memory,
/// a trap, a bad answer) takes milliseconds, and must not become a deadline
/// fault on a loaded machine.
const PATIENT: Duration = Duration::from_secs(30);

fn engine_with(deadline: Duration) -> PolicyEngine {
    PolicyEngine::new(RuntimeConfig {
        deadline,
        memory_limit: 16 << 20,
        ..RuntimeConfig::default()
    })
    .expect("engine")
}

fn engine() -> PolicyEngine {
    engine_with(PATIENT)
}

fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    for i in 0..4 {
        s.add_node(NodeRequest {
            name: format!("n{i}"),
            pool: "default".into(),
            cpu_milli: 64_000,
            memory_mib: 512_000,
            gpu_model: "V100".into(),
            gpu_memory_mib: 32_768,
            gpu_count: 4,
            on_loan: false,
        })
        .unwrap();
    }
    for j in 0..6 {
        s.submit(JobRequest::gpus(format!("job{j}"), "t", 2, 2))
            .unwrap();
    }
    s
}

/// A slot whose older generation is healthy `fifo` and whose active one misbehaves in `mode`
/// (compiled by `engine`; fifo always under the patient deadline, so that a preempted fifo
/// round on a loaded machine is not a fault of the fallback).
fn slot_with(engine: &PolicyEngine, mode: &str) -> (Arc<PolicySlot>, u64, u64) {
    let slot = Arc::new(PolicySlot::new("under-test"));
    let good = slot
        .swap(
            self::engine()
                .compile(arbiter_policies::get("fifo").unwrap())
                .unwrap(),
            None,
            None,
            None,
        )
        .unwrap();
    let bad = engine
        .compile(arbiter_policies::fixture("misbehave").unwrap())
        .unwrap();
    let bad = slot
        .swap(bad, Some(format!("mode = {mode}")), None, None)
        .unwrap();
    (slot, good.id, bad.id)
}

/// Runs `rounds` rounds with the misbehaving policy, and the same rounds with
/// healthy fifo alone; the states must end identical.
fn run_mode(mode: &str, rounds: usize) -> Vec<(Served, RoundFaults)> {
    let engine = engine_with(if mode == "loop" { HASTY } else { PATIENT });
    let (slot, good, bad) = slot_with(&engine, mode);
    let mut state = cluster();
    let mut driver = RoundDriver::new(slot.clone()).with_max_decisions(100);
    let mut out = Vec::new();
    for _ in 0..rounds {
        let r = driver.run_round(&mut state);
        out.push((r.served, r.faults));
    }
    let reference_slot = Arc::new(PolicySlot::new("reference"));
    reference_slot
        .swap(
            self::engine()
                .compile(arbiter_policies::get("fifo").unwrap())
                .unwrap(),
            None,
            None,
            None,
        )
        .unwrap();
    let mut reference = cluster();
    let mut ref_driver = RoundDriver::new(reference_slot).with_max_decisions(100);
    for _ in 0..rounds {
        ref_driver.run_round(&mut reference);
    }
    assert_eq!(
        state.snapshot(),
        reference.snapshot(),
        "mode {mode}: state diverged from the healthy run"
    );
    let expected = [
        Served::Active(bad),
        Served::Fallback(good),
        Served::Active(good),
    ];
    assert!(
        out.iter().all(|(served, _)| expected.contains(served)),
        "{out:?}"
    );
    out
}

fn first_fault(mode: &str) -> PolicyFault {
    let rounds = run_mode(mode, 1);
    let (served, faults) = &rounds[0];
    assert!(
        matches!(served, Served::Fallback(_)),
        "mode {mode}: served by {served:?}"
    );
    faults
        .first()
        .map(|(_, f)| f.clone())
        .unwrap_or_else(|| panic!("mode {mode}: no fault"))
}

/// The error message of a component the host must refuse to load.
fn refusal(bytes: &[u8]) -> String {
    match engine().compile(bytes) {
        Ok(c) => panic!("`{}` loaded but must be refused", c.manifest.name),
        Err(e) => e.to_string(),
    }
}

#[test]
fn not_wasm_is_refused() {
    let msg = refusal(b"#!/bin/sh\nrm -rf /\n");
    assert!(msg.contains("not a WebAssembly file"), "{msg}");
}

#[test]
fn core_module_is_refused() {
    let msg = refusal(&wat::parse_str("(module (func (export \"schedule\")))").unwrap());
    assert!(
        msg.contains("core WebAssembly module, not a component"),
        "{msg}"
    );
}

#[test]
fn foreign_world_is_refused() {
    let msg = refusal(arbiter_policies::fixture("foreign-world").unwrap());
    assert!(
        msg.contains("does not export `arbiter:policy/meta@0.4.0` or `arbiter:policy/meta@0.3.0`"),
        "{msg}"
    );
}

#[test]
fn older_contract_version_is_refused_naming_the_versions() {
    let msg = refusal(arbiter_policies::fixture("old-contract").unwrap());
    assert!(
        msg.contains("arbiter:policy/meta@0.4.0")
            && msg.contains("arbiter:policy/meta@0.3.0")
            && msg.contains("@0.0.9"),
        "{msg}"
    );
}

#[test]
fn truncated_component_is_refused() {
    let bytes = arbiter_policies::get("fifo").unwrap();
    let err = engine().compile(&bytes[..bytes.len() / 2]).err().unwrap();
    assert!(matches!(err, PolicyFault::Abi(_)), "{err}");
}

#[test]
fn trapping_policy_falls_back_and_is_quarantined() {
    let rounds = run_mode("trap", 5);
    for (served, faults) in &rounds[..3] {
        assert!(matches!(served, Served::Fallback(_)));
        assert!(matches!(faults[0].1, PolicyFault::Trap(_)), "{faults:?}");
    }
    // Quarantined after three faults: the good generation is active again.
    for (served, faults) in &rounds[3..] {
        assert!(matches!(served, Served::Active(_)), "{served:?}");
        assert!(faults.is_empty());
    }
}

/// A Rust policy that panics: the fault says what panicked, where, and in
/// which of the policy's functions — not a kilobyte of backtrace, and not
/// the environment read std's default panic hook would trap on first.
#[test]
fn a_panic_is_reported_with_its_message_and_place() {
    let PolicyFault::Trap(text) = first_fault("trap") else {
        panic!("not a trap");
    };
    assert!(
        text.starts_with("wasm `unreachable` instruction executed in "),
        "{text}"
    );
    assert!(
        text.contains("Misbehave"),
        "names the policy's function: {text}"
    );
    assert!(
        text.contains("; last error logged: panicked at ")
            && text.contains("fixture-misbehave/src/lib.rs:")
            && text.ends_with(": fixture asked to trap"),
        "{text}"
    );
    assert!(!text.contains("environment"), "{text}");
    assert!(text.len() < 1024, "{} bytes: {text}", text.len());
}

#[test]
fn infinite_loop_hits_the_deadline() {
    assert_eq!(first_fault("loop"), PolicyFault::Deadline(HASTY));
}

#[test]
fn unbounded_recursion_traps() {
    let fault = first_fault("recurse");
    assert!(
        matches!(&fault, PolicyFault::Trap(msg) if msg.contains("stack")),
        "{fault}"
    );
}

#[test]
fn allocation_past_the_cap_is_stopped() {
    assert_eq!(first_fault("alloc"), PolicyFault::MemoryCap(16 << 20));
}

/// The validator's verdict on the first decision of a misbehaving round.
fn rejected_decision(mode: &str) -> (usize, DecisionError) {
    match first_fault(mode) {
        PolicyFault::InvalidDecision { index, error } => (index, error),
        other => panic!("mode {mode}: expected an invalid decision, got {other}"),
    }
}

#[test]
fn unknown_job_is_rejected() {
    let (index, error) = rejected_decision("unknown-job");
    assert!(
        index == 0 && matches!(error, DecisionError::UnknownJob(_)),
        "{error}"
    );
}

#[test]
fn unknown_gpu_is_rejected() {
    let (_, error) = rejected_decision("unknown-gpu");
    assert_eq!(error, DecisionError::UnknownGpu(u32::MAX));
}

#[test]
fn overcommitted_gpu_is_rejected() {
    let (_, error) = rejected_decision("overcommit");
    assert!(matches!(error, DecisionError::Overcommit { .. }), "{error}");
}

#[test]
fn split_gang_is_rejected() {
    let (_, error) = rejected_decision("split-gang");
    assert!(matches!(error, DecisionError::GangSize { .. }), "{error}");
}

#[test]
fn huge_decision_list_is_rejected() {
    let fault = first_fault("huge");
    assert!(
        matches!(fault, PolicyFault::TooManyDecisions { limit: 100, .. }),
        "{fault}"
    );
}

/// An answer whose lifting would make the host allocate past `max_answer_bytes` (wasmtime's
/// hostcall fuel) is a fault of its own, the round falls back, and the next round still runs;
/// under the default bound the same answer lifts and the validator counts it.
#[test]
fn answer_beyond_the_hostcall_bound_is_refused() {
    let cap = 64 << 10;
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: PATIENT,
        memory_limit: 16 << 20,
        max_answer_bytes: cap,
        ..RuntimeConfig::default()
    })
    .expect("engine");
    // `huge` answers 4 × max_decisions + 1,000 preempts: 5,000 here, over 64 KiB as host
    // values.
    let (slot, good, _) = slot_with(&engine, "huge");
    let mut state = cluster();
    let mut driver = RoundDriver::new(slot).with_max_decisions(1000);
    for round in 0..2 {
        let r = driver.run_round(&mut state);
        assert_eq!(r.served, Served::Fallback(good), "round {round}");
        let fault = &r.faults.first().expect("a fault").1;
        assert_eq!(fault, &PolicyFault::AnswerTooLarge(cap), "{fault}");
        assert_eq!(fault.kind(), "answer-too-large");
    }
    // The same answer within the default bound: lifted, and too many decisions.
    let (slot, _, _) = slot_with(&self::engine(), "huge");
    let r = RoundDriver::new(slot)
        .with_max_decisions(1000)
        .run_round(&mut cluster());
    assert!(
        matches!(
            r.faults.first().map(|f| &f.1),
            Some(PolicyFault::TooManyDecisions { limit: 1000, .. })
        ),
        "{:?}",
        r.faults
    );
}

#[test]
fn policy_reported_failure_falls_back() {
    assert_eq!(
        first_fault("fail"),
        PolicyFault::Reported("fixture refuses".into())
    );
}

#[test]
fn permanently_stale_policy_falls_back() {
    assert!(matches!(first_fault("stale"), PolicyFault::Stale(_)));
}

#[test]
fn log_flood_is_capped_and_bounded() {
    // 100k lines of 10 KB. The host keeps 64 lines per call and drops the
    // rest; the deadline bounds the time. Which of the two happens first
    // depends on the machine's speed, so both outcomes are legitimate — and
    // nothing else is.
    let engine = engine_with(HASTY);
    let (slot, good, bad) = slot_with(&engine, "log-flood");
    let mut state = cluster();
    let mut driver = RoundDriver::new(slot).with_max_decisions(100);
    for _ in 0..2 {
        let r = driver.run_round(&mut state);
        match r.served {
            // Finished in time: its (empty) answer stands.
            Served::Active(g) => {
                assert_eq!(g, bad);
                assert!(r.faults.is_empty() && r.decisions.is_empty(), "{r:?}");
            }
            // Stopped by the deadline: fifo answered instead.
            Served::Fallback(g) => {
                assert_eq!(g, good);
                assert!(
                    matches!(r.faults[..], [(Some(b), PolicyFault::Deadline(_))] if b == bad),
                    "{:?}",
                    r.faults
                );
            }
            other => panic!("served by {other:?}"),
        }
    }
}

#[test]
fn empty_slot_is_served_by_the_native_policy() {
    let slot = Arc::new(PolicySlot::new("empty"));
    let mut state = cluster();
    let mut driver = RoundDriver::new(slot);
    let report = driver.run_round(&mut state);
    assert_eq!(report.served, Served::Native);
    assert_eq!(report.applied.started.len(), 4);
}

#[test]
fn ok_mode_fixture_serves_as_active() {
    let rounds = run_mode_ok();
    assert!(matches!(rounds, Served::Active(_)));
}

fn run_mode_ok() -> Served {
    let engine = engine();
    let (slot, _, _) = slot_with(&engine, "ok");
    let mut state = cluster();
    RoundDriver::new(slot).run_round(&mut state).served
}
