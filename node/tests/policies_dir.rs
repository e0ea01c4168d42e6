//! The node's watched policy directory (`arbiter node --policies-dir`): `coordinator.wasm`
//! dropped in is the node's coordinator policy from the next control period, its
//! `coordinator.toml` is followed, what cannot load is said and changes nothing, and removing
//! the component goes back to the policy the node started with — through the host core's
//! `PolicyDirectory` into the coordinator's slot, with a real `Node` on a simulated GPU.

mod common;

use arbiter_host::runtime::{CompiledPolicy, PolicyEngine};
use arbiter_host::watch::PolicyDirectory;
use arbiter_node::coordinator::{Coordinator, CoordinatorConfig, Served};
use arbiter_node::policies_dir::{COORDINATOR_FILE, NodePolicies};
use arbiter_node::supervisor::{Supervisor, SupervisorConfig};
use arbiter_node::{Node, NodeConfig, SimBackend};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Healthy policies only: a deadline no stall of a loaded machine reaches.
fn settings() -> CoordinatorConfig {
    CoordinatorConfig {
        deadline: Some(Duration::from_secs(30)),
        ..CoordinatorConfig::default()
    }
}

fn node(dir: &Path) -> Node {
    let config = SupervisorConfig::new(
        &dir.join("state"),
        &dir.join("blocks"),
        Path::new("/nonexistent/libarbiter_interpose.so"),
    );
    let (sup, _) = Supervisor::open(config).expect("supervisor");
    Node::new(
        Arc::new(SimBackend::new(2, 16 << 30)),
        None,
        sup,
        NodeConfig::default(),
    )
}

fn builtin(engine: &PolicyEngine, name: &str) -> CompiledPolicy {
    engine
        .compile(arbiter_policies::get(name).expect("built-in"))
        .expect("compiles")
}

/// A coordinator started with `initial` (`None`: only the fallback) and its watched directory.
fn watched(dir: &Path, initial: Option<&str>) -> (Coordinator, Arc<PolicyDirectory>, PathBuf) {
    let engine = PolicyEngine::new(settings().runtime_config()).expect("engine");
    let initial = initial.map(|name| builtin(&engine, name));
    let coordinator = match &initial {
        Some(compiled) => {
            Coordinator::from_compiled(compiled.clone(), None, settings()).expect("loads")
        }
        None => Coordinator::fallback_only(settings()),
    };
    let target = NodePolicies::new(&coordinator, engine, initial.map(|c| (c, None)));
    let policies = dir.join("node.d");
    std::fs::create_dir_all(&policies).expect("dir");
    let directory = Arc::new(PolicyDirectory::new(&policies, Arc::new(target)));
    (coordinator, directory, policies)
}

fn served_by(coordinator: &mut Coordinator, node: &mut Node) -> (Served, Option<String>) {
    let r = coordinator.step(node);
    assert!(r.fault.is_none(), "{:?}", r.fault);
    (r.served, coordinator.policy_name().map(str::to_string))
}

fn policy(name: &str) -> &'static [u8] {
    arbiter_policies::get(name).expect("built-in")
}

#[test]
fn a_dropped_coordinator_serves_the_next_period_and_removing_it_restores_the_nodes_own() {
    common::init_tracing();
    let dir = common::test_dir("policies-dir");
    let mut node = node(&dir);
    let (mut coordinator, directory, policies) = watched(&dir, Some("elastic-share"));
    let slot = coordinator.slot();
    let own = (Served::Policy, Some("elastic-share".to_string()));
    assert_eq!(served_by(&mut coordinator, &mut node), own);

    // Dropped in: loaded into the coordinator's slot, serving from the next step.
    let wasm = policies.join(COORDINATOR_FILE);
    std::fs::write(&wasm, policy("sysmonitor")).expect("write");
    let r = directory.reconcile();
    assert_eq!(r.loaded.len(), 1, "{r:?}");
    assert_eq!(r.loaded[0].1, "coordinator");
    let dropped = (Served::Policy, Some("sysmonitor".to_string()));
    assert_eq!(served_by(&mut coordinator, &mut node), dropped);
    let generation = slot.active_id();

    // Its configuration is followed: one the policy refuses is said once and changes
    // nothing; one it accepts is a new generation.
    let toml = policies.join("coordinator.toml");
    std::fs::write(&toml, "unhealthy_share_cap = 0").expect("write");
    let r = directory.reconcile();
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert!(r.loaded.is_empty(), "{r:?}");
    assert!(directory.reconcile().failed.is_empty(), "said once");
    assert_eq!(slot.active_id(), generation);
    assert_eq!(served_by(&mut coordinator, &mut node), dropped);
    std::fs::write(&toml, "unhealthy_share_cap = 300").expect("write");
    let r = directory.reconcile();
    assert_eq!(r.loaded.len(), 1, "{r:?}");
    assert_ne!(slot.active_id(), generation);
    let generation = slot.active_id();
    assert_eq!(served_by(&mut coordinator, &mut node), dropped);

    // What cannot be the node's policy is said, and the running one stays: another file
    // name, a policy without the coordinator role, bytes that are not a component.
    let other = policies.join("other.wasm");
    std::fs::write(&other, policy("sysmonitor")).expect("write");
    let r = directory.reconcile();
    assert!(
        r.failed.len() == 1 && r.failed[0].1.contains(COORDINATOR_FILE),
        "{r:?}"
    );
    std::fs::remove_file(&other).expect("rm");
    for bytes in [policy("fifo"), &b"\0asm not a component"[..]] {
        std::fs::write(&wasm, bytes).expect("write");
        let r = directory.reconcile();
        assert!(r.loaded.is_empty() && r.failed.len() == 1, "{r:?}");
        assert_eq!(slot.active_id(), generation);
        assert_eq!(served_by(&mut coordinator, &mut node), dropped);
    }
    let r = directory.reconcile();
    assert!(r.failed.is_empty(), "a file's error is said once: {r:?}");
    // Not a coordinator: the refusal says so.
    std::fs::write(&wasm, policy("fifo")).expect("write");
    let r = directory.reconcile();
    assert!(
        r.failed[0]
            .1
            .contains("does not declare the `coordinator` role"),
        "{r:?}"
    );

    // Put back: what the files hold is what serves, so nothing loads.
    std::fs::write(&wasm, policy("sysmonitor")).expect("write");
    assert_eq!(directory.reconcile(), Default::default());
    assert_eq!(slot.active_id(), generation);
    assert_eq!(served_by(&mut coordinator, &mut node), dropped);
    // Removed: the node's own policy serves again.
    std::fs::remove_file(&wasm).expect("rm");
    std::fs::remove_file(&toml).expect("rm");
    let r = directory.reconcile();
    assert_eq!(r.unloaded.len(), 1, "{r:?}");
    assert_eq!(served_by(&mut coordinator, &mut node), own);
    assert_eq!(coordinator.stats().faults, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_without_a_policy_runs_the_dropped_one_and_falls_back_when_it_goes() {
    common::init_tracing();
    let dir = common::test_dir("policies-dir-none");
    let mut node = node(&dir);
    let (mut coordinator, directory, policies) = watched(&dir, None);
    assert_eq!(
        served_by(&mut coordinator, &mut node),
        (Served::Fallback, None)
    );
    let wasm = policies.join(COORDINATOR_FILE);
    std::fs::write(&wasm, policy("sysmonitor")).expect("write");
    assert_eq!(directory.reconcile().loaded.len(), 1);
    assert_eq!(
        served_by(&mut coordinator, &mut node),
        (Served::Policy, Some("sysmonitor".to_string()))
    );
    std::fs::remove_file(&wasm).expect("rm");
    assert_eq!(directory.reconcile().unloaded.len(), 1);
    assert_eq!(
        served_by(&mut coordinator, &mut node),
        (Served::Fallback, None)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The swap happens on the watcher's thread while the control loop runs on its own, as in
/// `arbiter node`: no step faults, and the loop serves the dropped policy.
#[test]
fn a_policy_dropped_while_the_control_loop_runs_is_served_without_a_fault() {
    common::init_tracing();
    let dir = common::test_dir("policies-dir-live");
    let mut node = node(&dir);
    let (mut coordinator, directory, policies) = watched(&dir, Some("elastic-share"));
    let slot = coordinator.slot();
    let _watch = directory.watch(Duration::from_millis(200)).expect("watch");
    let stop = Arc::new(AtomicBool::new(false));
    let steps = Arc::new(AtomicU64::new(0));
    let control = {
        let (stop, steps) = (stop.clone(), steps.clone());
        std::thread::spawn(move || {
            let mut faults = 0;
            coordinator.run_loop_with(&mut node, &stop, |r| {
                faults += u64::from(r.fault.is_some());
                steps.fetch_add(1, Ordering::Relaxed);
            });
            (coordinator, faults)
        })
    };
    std::fs::write(policies.join(COORDINATOR_FILE), policy("sysmonitor")).expect("write");
    let give_up = Instant::now() + Duration::from_secs(60);
    while slot
        .active()
        .is_none_or(|g| g.manifest().name != "sysmonitor")
    {
        assert!(Instant::now() < give_up, "the dropped policy never loaded");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A few periods served by it.
    let after = steps.load(Ordering::Relaxed) + 3;
    while steps.load(Ordering::Relaxed) < after {
        assert!(Instant::now() < give_up, "the control loop stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Release);
    let (coordinator, faults) = control.join().expect("control thread");
    assert_eq!(faults, 0);
    assert_eq!(coordinator.policy_name(), Some("sysmonitor"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every hostile component of the corpus dropped into a node's directory: refused with the
/// sandbox's reason (the running policy untouched) or loaded and, when its coordinator calls
/// fault, retired to the fallback within a few periods; removing it always brings the node's
/// own policy back. (The corpus's hanging cases are the coordinator test's: each costs its
/// deadline per call, and this node runs a patient one.)
#[test]
fn every_hostile_component_dropped_into_the_directory_leaves_the_node_in_service() {
    use arbiter_hostile::{Expect, Role};
    common::init_tracing();
    let dir = common::test_dir("policies-dir-hostile");
    let mut node = node(&dir);
    let (mut coordinator, directory, policies) = watched(&dir, Some("sysmonitor"));
    let slot = coordinator.slot();
    let (wasm, toml) = (
        policies.join(COORDINATOR_FILE),
        policies.join("coordinator.toml"),
    );
    let cases: Vec<_> = arbiter_hostile::corpus()
        .into_iter()
        .filter(|c| !c.hangs)
        .collect();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for case in &cases {
        let name = &case.name;
        let own = slot.active_id();
        match &case.config {
            Some(config) => std::fs::write(&toml, config).expect("write"),
            None => {
                let _ = std::fs::remove_file(&toml);
            }
        }
        std::fs::write(&wasm, &case.wasm).expect("write");
        let r = directory.reconcile();
        match &case.expect {
            Expect::Refused(why) => {
                // For its own reason, or for memory: a node's sandbox is smaller than a
                // control plane's (32 MiB), so memory can run out first.
                let error = r.failed.first().map_or("", |(_, e)| e.as_str());
                let for_memory = error.contains("memory cap");
                assert!(
                    r.loaded.is_empty()
                        && r.failed.len() == 1
                        && (error.contains(why) || for_memory),
                    "{name}: {r:?}"
                );
                assert_eq!(slot.active_id(), own, "{name}");
            }
            Expect::Unusable(_) => {
                assert!(r.loaded.is_empty() && r.failed.len() == 1, "{name}: {r:?}");
                assert_eq!(slot.active_id(), own, "{name}");
            }
            // A component without the coordinator role is refused for that alone.
            _ if !r.failed.is_empty() => {
                assert!(
                    r.loaded.is_empty()
                        && r.failed[0]
                            .1
                            .contains("does not declare the `coordinator` role"),
                    "{name}: {r:?}"
                );
                assert_eq!(slot.active_id(), own, "{name}");
            }
            expect => {
                assert_eq!(r.loaded.len(), 1, "{name}: {r:?}");
                // The corpus's misbehaving modes act in every role's call, the node's
                // `tick` too: a case that faults there is retired within a few periods
                // and the policy it replaced serves again.
                let mut faulted = false;
                for _ in 0..40 {
                    if slot.active_id() == own {
                        break;
                    }
                    let r = coordinator.step(&mut node);
                    if r.fault.is_some() {
                        faulted = true;
                        assert!(r.outcomes.is_empty(), "{name}: applied {:?}", r.outcomes);
                    }
                }
                let coordinator_faults = matches!(
                    expect,
                    Expect::Faults {
                        role: Role::Coordinator,
                        ..
                    } | Expect::Flaps {
                        role: Role::Coordinator
                    }
                );
                assert!(faulted || !coordinator_faults, "{name}: never faulted");
                if faulted {
                    assert_eq!(slot.active_id(), own, "{name}: not retired in 40 periods");
                    let r = coordinator.step(&mut node);
                    assert!(
                        r.served == Served::Policy && r.fault.is_none(),
                        "{name}: {r:?}"
                    );
                    assert_eq!(coordinator.policy_name(), Some("sysmonitor"), "{name}");
                }
            }
        }
        // Removed: the node's own policy serves again, whatever the dropped one did.
        std::fs::remove_file(&wasm).expect("rm");
        let _ = std::fs::remove_file(&toml);
        directory.reconcile();
        let r = coordinator.step(&mut node);
        assert_eq!(r.served, Served::Policy, "{name}: {:?}", r.fault);
        assert_eq!(coordinator.policy_name(), Some("sysmonitor"), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
