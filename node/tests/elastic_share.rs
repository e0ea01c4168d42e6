//! DynamoML's request/limit sharing end to end on the fake GPU libraries: the built-in
//! `elastic-share` Wasm coordinator run by [`Coordinator`] against a real [`Node`] whose
//! workloads are C programs launching kernels through the real interposer into the fake
//! `libcuda.so.1`. What is measured is the workload's device time — launches admitted by its
//! pacer times the fake kernel's duration, over wall time — not only the share the policy set.

mod common;

use arbiter_node::coordinator::{Coordinator, CoordinatorConfig, Served};
use arbiter_node::gpu::{GpuBackend, SimBackend};
use arbiter_node::supervisor::{ShareTerms, Supervisor, SupervisorConfig, WorkloadSpec};
use arbiter_node::{Node, NodeConfig};
use arbiter_policy_sdk::model::qos;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KERNEL_NS: u64 = 200_000;

fn workload(dir: &std::path::Path, args: &[String], request: u32, limit: u32) -> WorkloadSpec {
    let f = common::cuda_fixtures();
    let mut command = vec![f.workload.display().to_string()];
    command.extend(args.iter().cloned());
    let mut env = common::cuda_env(dir);
    env.push(("FAKE_CUDA_KERNEL_NS".into(), KERNEL_NS.to_string()));
    WorkloadSpec {
        command,
        env,
        role: 1,
        compute_share_permille: request,
        mean_kernel_ns: Some(KERNEL_NS),
        terms: ShareTerms {
            qos: Some(qos::GUARANTEED),
            request_permille: request,
            limit_permille: limit,
        },
        ..WorkloadSpec::default()
    }
}

/// Control steps for `span`, then the workload's measured device-time share over the last
/// `measure` of it (permille) and the share its status reports at the end.
fn run_and_measure(
    coord: &mut Coordinator,
    node: &mut Node,
    id: u32,
    span: Duration,
    measure: Duration,
) -> (f64, u32) {
    let period = Duration::from_millis(100);
    let start = Instant::now();
    let mut mark: Option<(Instant, u64)> = None;
    while start.elapsed() < span {
        let r = coord.step(node);
        assert_eq!(r.served, Served::Policy, "{:?}", r.fault);
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        if mark.is_none() && start.elapsed() >= span - measure {
            mark = Some((Instant::now(), launches(node, id)));
        }
        std::thread::sleep(period);
    }
    let (t0, l0) = mark.expect("measured");
    let l1 = launches(node, id);
    let device_ns = (l1 - l0) as f64 * KERNEL_NS as f64;
    let permille = 1000.0 * device_ns / t0.elapsed().as_nanos() as f64;
    let share = status(node, id).compute_share;
    (permille, share)
}

fn status(node: &mut Node, id: u32) -> arbiter_policy_sdk::model::WorkloadStatus {
    node.view()
        .workloads
        .into_iter()
        .find(|w| w.id == id)
        .expect("workload in view")
}

fn launches(node: &mut Node, id: u32) -> u64 {
    status(node, id).launches
}

#[test]
fn request_quarter_limit_half_rises_to_the_limit_beside_idle_neighbours_and_keeps_its_request_beside_busy_ones()
 {
    common::init_tracing();
    let dir = common::test_dir("elastic-share");
    let f = common::cuda_fixtures();
    let mut config = SupervisorConfig::new(&dir.join("state"), &dir.join("blocks"), &f.interposer);
    config.grace = Duration::from_secs(15);
    let (sup, _) = Supervisor::open(config).expect("supervisor");
    let backend: Arc<dyn GpuBackend> = Arc::new(SimBackend::new(1, 16 << 30));
    let mut node = Node::new(backend, None, sup, NodeConfig::default());

    // Loaded (compiled) before any workload starts, so the neighbours' quiet time below is
    // all control steps: compiling on a busy machine once took 2.5 s of it.
    // A deadline no stall of a loaded machine reaches: every step must be the policy's.
    let settings = CoordinatorConfig {
        deadline: Some(Duration::from_secs(30)),
        ..CoordinatorConfig::default()
    };
    let mut coord = Coordinator::builtin("elastic-share", None, settings).expect("load");
    assert_eq!(coord.policy_name(), Some("elastic-share"));

    // The burstable workload launches throughout; three 0.25 neighbours stay quiet (a
    // notebook waiting for its user) until the test creates `go`, then launch flat out. Both
    // run far longer than the test and are evicted at its end.
    let go = dir.join("go");
    let burst = node
        .launch(&workload(
            &dir,
            &["launch-loop".to_string(), "120000".into()],
            250,
            500,
        ))
        .expect("burstable");
    let neighbours: Vec<u32> = (0..3)
        .map(|_| {
            let args = [
                "launch-when".to_string(),
                go.display().to_string(),
                "120000".into(),
            ];
            node.launch(&workload(&dir, &args, 250, 250))
                .expect("neighbour")
        })
        .collect();

    // Idle neighbours: their requests are lent; the burstable one rises to its limit, no more.
    let (alone, share) = run_and_measure(
        &mut coord,
        &mut node,
        burst,
        Duration::from_millis(3_000),
        Duration::from_millis(1_500),
    );
    eprintln!("beside idle neighbours: share {share}‰, device time {alone:.0}‰");
    for &n in &neighbours {
        assert_eq!(
            launches(&mut node, n),
            0,
            "neighbour {n} launched before `go`"
        );
    }
    assert_eq!(share, 500, "share set beside idle neighbours");
    assert!(
        (400.0..=525.0).contains(&alone),
        "device time beside idle neighbours: {alone:.0}‰ (limit 500‰)"
    );
    for &n in &neighbours {
        assert_eq!(
            status(&mut node, n).compute_share,
            250,
            "idle owners keep their request"
        );
    }

    // The neighbours start launching: the lent share comes back and the burstable workload
    // keeps its request. Measured once all three launch.
    std::fs::write(&go, b"").expect("go");
    let busy_by = Instant::now() + Duration::from_secs(30);
    while neighbours.iter().any(|&n| launches(&mut node, n) == 0) {
        assert!(
            Instant::now() < busy_by,
            "a neighbour never launched after `go`"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (crowded, share) = run_and_measure(
        &mut coord,
        &mut node,
        burst,
        Duration::from_millis(2_500),
        Duration::from_millis(1_500),
    );
    eprintln!("beside busy neighbours: share {share}‰, device time {crowded:.0}‰");
    assert_eq!(share, 250, "share set beside busy neighbours");
    assert!(
        (225.0..=300.0).contains(&crowded),
        "device time beside busy neighbours: {crowded:.0}‰ (request 250‰)"
    );
    for &n in &neighbours {
        let s = status(&mut node, n);
        assert_eq!(s.compute_share, 250);
        assert!(s.launches > 0, "neighbour {n} launched");
    }
    assert_eq!(coord.stats().faults, 0);

    for id in node.supervisor().ids() {
        let _ = node.apply_actions(&[arbiter_policy_sdk::model::NodeAction::Evict(id)]);
    }
    for id in node.supervisor().ids() {
        let _ = node
            .supervisor_mut()
            .wait_exit(id, Duration::from_secs(30), None);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
