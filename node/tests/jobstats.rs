//! A workload's runtime statistics end to end: a C workload reports its iterations through
//! the real interposer's `arbiter_iteration()`, and the node turns the control block's
//! counter into the `iteration-ms` a coordinator sees and the window the agent reports.

mod common;

use arbiter_node::gpu::{GpuBackend, SimBackend};
use arbiter_node::supervisor::{Supervisor, SupervisorConfig, WorkloadSpec};
use arbiter_node::{Node, NodeConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn reported_iterations_become_the_workloads_iteration_time() {
    common::init_tracing();
    let dir = common::test_dir("jobstats");
    let f = common::cuda_fixtures();
    let config = SupervisorConfig::new(&dir.join("state"), &dir.join("blocks"), &f.interposer);
    let (sup, _) = Supervisor::open(config).expect("supervisor");
    let backend: Arc<dyn GpuBackend> = Arc::new(SimBackend::new(1, 16 << 30));
    let mut node = Node::new(backend, None, sup, NodeConfig::default());
    // 40 iterations, 25 ms apart (plus a launch each).
    let id = node
        .launch(&WorkloadSpec {
            command: vec![
                f.workload.display().to_string(),
                "iterations".into(),
                "40".into(),
                "25".into(),
            ],
            env: common::cuda_env(&dir),
            ..WorkloadSpec::default()
        })
        .expect("launch");

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while Instant::now() < deadline {
        let w = node.view().workloads.into_iter().find(|w| w.id == id);
        seen = w.map_or(0, |w| w.iteration_ms);
        if seen > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // 25 ms of sleep plus a launch and a clock read per iteration; a loaded CI machine
    // oversleeps, never undersleeps, so the lower bound is exact and the upper one only
    // catches a measurement off by an order of magnitude.
    assert!((25..=250).contains(&seen), "iteration time {seen} ms");
    let window = node.take_stats().remove(&id).expect("sampled this window");
    assert!((25..=250).contains(&window.iteration_ms), "{window:?}");
    assert!(window.min_memory_mib <= window.peak_memory_mib);
    assert!(node.take_stats().is_empty(), "each window is reported once");
    let _ = node
        .supervisor_mut()
        .wait_exit(id, Duration::from_secs(30), None);
    let _ = std::fs::remove_dir_all(&dir);
}
