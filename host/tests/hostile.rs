//! The hostile corpus (`arbiter-hostile`) through the engine and the role
//! drivers: every case meets the safe behaviour it expects, every string a
//! hostile policy hands the host arrives bounded and escaped, and refused
//! components leave nothing behind in the compile cache.

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::Served;
use arbiter_host::roles::coordinator::{ActionRules, CoordinatorDriver};
use arbiter_host::roles::matcher::MatcherDriver;
use arbiter_host::roles::reclaim::ReclaimDriver;
use arbiter_host::roles::scheduler::RoundDriver;
use arbiter_host::roles::tenant::{AdmissionRequest, admit};
use arbiter_host::runtime::{MAX_ERROR_TEXT, PolicyEngine, PolicyFault, RuntimeConfig, is_plain};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_hostile::{Case, Expect, Role};
use arbiter_policy_sdk::model::{GpuStatus, NodeView, TenantJob, TenantView, WorkloadStatus};
use std::sync::Arc;
use std::time::Duration;

/// An engine whose policy calls have `deadline`.
fn engine_with(deadline: Duration) -> PolicyEngine {
    PolicyEngine::new(RuntimeConfig {
        deadline,
        ..RuntimeConfig::default()
    })
    .expect("engine")
}

/// One second, for the cases that hang: they pay it per call until
/// quarantined.
fn engine() -> PolicyEngine {
    engine_with(Duration::from_secs(1))
}

/// Thirty seconds, for every other case: a refusal or fault for what a case
/// *is* (64 MiB hoarded, a 40 MiB role name, a 32 MiB error) takes well
/// under a second, but a loaded test machine once stretched one past a
/// 1 s deadline and the verdict became one about time.
fn patient_engine() -> PolicyEngine {
    engine_with(Duration::from_secs(30))
}

fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    for i in 0..2 {
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
        .expect("node");
    }
    for j in 0..40 {
        s.submit(JobRequest::gpus(format!("job{j}"), "t", 1, 1))
            .expect("job");
    }
    s
}

/// Text the host shows for a policy: bounded, and printable (`multiline`
/// allows newlines and tabs).
fn check_shown(case: &str, what: &str, text: &str, multiline: bool) -> Result<(), String> {
    // Cut texts end with " … (N bytes cut)": a few bytes over the bound.
    if text.len() > MAX_ERROR_TEXT + 64 {
        return Err(format!("{case}: {what} is {} bytes", text.len()));
    }
    let plain = if multiline {
        text.lines().all(is_plain)
    } else {
        is_plain(text)
    };
    if !plain {
        return Err(format!("{case}: {what} is not escaped: {text:?}"));
    }
    Ok(())
}

fn check_fault(case: &str, fault: &PolicyFault) -> Result<(), String> {
    check_shown(case, "fault text", &fault.to_string(), false)
}

/// The slot a case runs in: healthy `fifo` first, the hostile generation active.
fn slot_for(engine: &PolicyEngine, case: &Case) -> Result<(Arc<PolicySlot>, u64), String> {
    let slot = Arc::new(PolicySlot::new(case.name.clone()));
    let fifo = engine
        .compile(arbiter_policies::get("fifo").expect("fifo"))
        .map_err(|e| e.to_string())?;
    slot.swap(fifo, None, None, None)
        .map_err(|e| e.to_string())?;
    let hostile = engine
        .compile(&case.wasm)
        .map_err(|e| format!("{}: {e}", case.name))?;
    let generation = slot
        .swap(hostile, case.config.clone(), None, None)
        .map_err(|e| format!("{}: {e}", case.name))?;
    Ok((slot, generation.id))
}

fn tenant_request(round: u64) -> AdmissionRequest {
    let jobs: Vec<TenantJob> = (0..4)
        .map(|p| TenantJob {
            position: p,
            name: format!("q{p}"),
            gpus: 1,
            priority: 0,
            submit_ms: round * 10 + u64::from(p),
            estimate_ms: 1_000,
            deadline_ms: 0,
            running: false,
        })
        .collect();
    AdmissionRequest {
        view: TenantView {
            now_ms: round * 1_000,
            tenant: "t1".into(),
            gpu_quota: 8,
            gpus_in_use: 0,
            jobs,
        },
        demand_milli: vec![1_000; 4],
        quota_milli: Some(8_000),
        claimed_milli: 0,
    }
}

/// A node with two GPUs and two workloads, as a coordinator sees it.
fn node_view(now_ms: u64) -> NodeView {
    NodeView {
        now_ms,
        gpus: (0..2)
            .map(|index| GpuStatus {
                index,
                ..GpuStatus::default()
            })
            .collect(),
        workloads: (0..2)
            .map(|id| WorkloadStatus {
                id,
                gpu: id,
                ..WorkloadStatus::default()
            })
            .collect(),
        ..NodeView::default()
    }
}

/// Calls `role` `calls` times; returns who served each call and the faults.
fn run_role(slot: &Arc<PolicySlot>, role: Role, calls: u64) -> Vec<(Served, Vec<PolicyFault>)> {
    let mut out = Vec::new();
    let collect = |faults: Vec<(Option<u64>, PolicyFault)>| -> Vec<PolicyFault> {
        faults.into_iter().map(|(_, f)| f).collect()
    };
    match role {
        Role::Scheduler => {
            let mut state = cluster();
            let mut driver = RoundDriver::new(slot.clone()).with_max_decisions(100);
            for _ in 0..calls {
                let r = driver.run_round(&mut state);
                out.push((r.served, r.faults.into_iter().map(|(_, f)| f).collect()));
            }
        }
        Role::Tenant => {
            for round in 0..calls {
                let a = admit(Some(slot), round, &tenant_request(round));
                out.push((a.served, collect(a.faults)));
            }
        }
        Role::Reclaim => {
            let mut state = cluster();
            let driver = ReclaimDriver::new(slot.clone());
            for _ in 0..calls {
                let r = driver.reclaim(&mut state, &[0, 1], 1, 100);
                out.push((r.served, collect(r.faults)));
            }
        }
        Role::Matcher => {
            let mut state = cluster();
            let driver = MatcherDriver::new(slot.clone());
            for _ in 0..calls {
                let m = driver.match_workloads(&mut state, &[0, 1], &[2, 3], Vec::new());
                out.push((m.served, collect(m.faults)));
            }
        }
        Role::Coordinator => {
            let driver = CoordinatorDriver::new(slot.clone(), ActionRules::default());
            for period in 0..calls {
                let (_, served, faults, _) = driver.decide(&node_view(period * 100));
                out.push((served, collect(faults)));
            }
        }
    }
    out
}

fn check_case(engine: &PolicyEngine, case: &Case) -> Result<(), String> {
    let name = case.name.as_str();
    match &case.expect {
        Expect::Refused(text) => match engine.compile(&case.wasm) {
            Ok(_) => Err(format!("{name}: loaded but must be refused")),
            Err(fault) => {
                check_fault(name, &fault)?;
                let shown = fault.to_string();
                if shown.contains(text) {
                    Ok(())
                } else {
                    Err(format!("{name}: refused with `{shown}`, expected `{text}`"))
                }
            }
        },
        Expect::Unusable(kind) => {
            let compiled = engine
                .compile(&case.wasm)
                .map_err(|e| format!("{name}: refused at load ({e}); must load"))?;
            match compiled.try_default_configuration() {
                Ok(()) => Err(format!("{name}: configured, but must be unusable")),
                Err(fault) if fault.kind() == *kind => check_fault(name, &fault),
                Err(fault) => Err(format!("{name}: `{fault}`, expected a {kind} fault")),
            }
        }
        Expect::Faults { role, kind } => {
            let (slot, hostile) = slot_for(engine, case)?;
            let calls = run_role(&slot, *role, 6);
            for (served, faults) in &calls {
                if matches!(served, Served::Active(id) if *id == hostile) {
                    return Err(format!("{name}: the hostile generation answered"));
                }
                for fault in faults {
                    check_fault(name, fault)?;
                }
            }
            let first = calls
                .first()
                .and_then(|(_, f)| f.first())
                .ok_or_else(|| format!("{name}: no fault in the first call"))?;
            if first.kind() != *kind {
                return Err(format!("{name}: `{first}`, expected a {kind} fault"));
            }
            let generation = slot.get(hostile).map_err(|e| e.to_string())?;
            if !generation.is_quarantined() {
                return Err(format!("{name}: not quarantined after 6 faulting calls"));
            }
            Ok(())
        }
        Expect::Flaps { role } => {
            let (slot, hostile) = slot_for(engine, case)?;
            let calls = run_role(&slot, *role, 30);
            for (_, faults) in &calls {
                for fault in faults {
                    check_fault(name, fault)?;
                }
            }
            let generation = slot.get(hostile).map_err(|e| e.to_string())?;
            if !generation.is_quarantined() {
                return Err(format!("{name}: flapped for 30 calls without quarantine"));
            }
            if !calls[25..]
                .iter()
                .all(|(served, faults)| faults.is_empty() && *served != Served::Active(hostile))
            {
                return Err(format!("{name}: still asked after its quarantine"));
            }
            Ok(())
        }
        Expect::Works => {
            let compiled = engine
                .compile(&case.wasm)
                .map_err(|e| format!("{name}: refused ({e}); must load"))?;
            compiled
                .try_default_configuration()
                .map_err(|e| format!("{name}: default configuration failed: {e}"))?;
            check_shown(name, "description", &compiled.manifest.description, true)?;
            check_shown(name, "name", &compiled.manifest.name, false)?;
            let (slot, hostile) = slot_for(engine, case)?;
            for (served, faults) in run_role(&slot, Role::Scheduler, 3) {
                if served != Served::Active(hostile) || !faults.is_empty() {
                    return Err(format!("{name}: served by {served:?}, faults {faults:?}"));
                }
            }
            Ok(())
        }
    }
}

#[test]
fn every_hostile_component_meets_the_behaviour_it_expects() {
    let (hanging, patient) = (engine(), patient_engine());
    let failures: Vec<String> = arbiter_hostile::corpus()
        .iter()
        .filter_map(|case| {
            let engine = if case.hangs { &hanging } else { &patient };
            check_case(engine, case).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn refused_components_leave_nothing_in_the_compile_cache() {
    let engine = engine();
    let refused: Vec<Case> = arbiter_hostile::corpus()
        .into_iter()
        .filter(|c| matches!(c.expect, Expect::Refused(_)))
        .collect();
    assert!(refused.len() >= 15, "{}", refused.len());
    for case in &refused {
        assert!(engine.compile(&case.wasm).is_err(), "{}", case.name);
    }
    assert_eq!(engine.cached_components(), (0, 0));
    engine
        .compile(arbiter_policies::get("fifo").expect("fifo"))
        .expect("fifo loads");
    let (count, bytes) = engine.cached_components();
    assert_eq!(count, 1);
    assert!(bytes > 0);
}
