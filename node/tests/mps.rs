//! The MPS manager against the fake `nvidia-cuda-mps-control` (tests/fake-mps), which records
//! the daemon's environment and every command it receives on stdin.

mod common;

use arbiter_node::gpu::SimBackend;
use arbiter_node::mps::{MpsConfig, MpsControl, MpsDaemon, MpsError, MpsManager, ServerStatus};
use arbiter_node::supervisor::{Supervisor, SupervisorConfig};
use arbiter_node::{Node, NodeConfig};
use arbiter_policy_sdk::model::health;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn log(mps_dir: &Path, gpu: u32) -> Vec<String> {
    std::fs::read_to_string(mps_dir.join(format!("gpu{gpu}/log/commands.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn config(dir: &Path) -> MpsConfig {
    let mut cfg = MpsConfig::new(common::fake_mps_binary(), &dir.join("mps"));
    cfg.default_active_thread_pct = Some(50);
    cfg.default_pinned_mem_limit_bytes = Some(4 << 30);
    cfg
}

#[test]
fn one_daemon_per_gpu_with_its_own_pipe_log_and_device() {
    common::init_tracing();
    let dir = common::test_dir("mps-daemons");
    let cfg = config(&dir);
    let mps = MpsManager::new(&cfg, &[(0, "GPU-aaaa".into()), (1, "GPU-bbbb".into())]);
    mps.start_all(None).expect("start");
    let m = dir.join("mps");
    for (gpu, uuid) in [(0, "GPU-aaaa"), (1, "GPU-bbbb")] {
        let l = log(&m, gpu);
        let pipe = m.join(format!("gpu{gpu}/pipe"));
        let logd = m.join(format!("gpu{gpu}/log"));
        assert_eq!(
            l[0],
            format!(
                "START CUDA_VISIBLE_DEVICES={uuid} PIPE={} LOG={} ACTIVE_THREAD_PERCENTAGE=50",
                pipe.display(),
                logd.display()
            )
        );
        // Defaults are re-applied after every start (a `quit` loses them).
        assert!(
            l.contains(&"CMD set_default_active_thread_percentage 50".to_string()),
            "{l:?}"
        );
        assert!(
            l.contains(&"CMD set_default_device_pinned_mem_limit 0 4096M".to_string()),
            "{l:?}"
        );
        let d = mps.for_gpu(gpu).expect("daemon");
        assert_eq!(
            d.client_env(),
            vec![
                (
                    "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                    pipe.display().to_string()
                ),
                (
                    "CUDA_MPS_LOG_DIRECTORY".to_string(),
                    logd.display().to_string()
                ),
            ]
        );
    }
    mps.stop_all(None).expect("stop");
    assert_eq!(log(&m, 0).last().map(String::as_str), Some("CMD quit"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn commands_queries_and_health() {
    common::init_tracing();
    let dir = common::test_dir("mps-commands");
    let cfg = config(&dir);
    let d = MpsDaemon::new(0, "GPU-aaaa", &cfg);
    // Not started yet: the client cannot reach a daemon.
    assert!(matches!(d.server_list(), Err(MpsError::Command { .. })));
    assert!(!d.health().daemon_running);

    d.start().expect("start");
    assert_eq!(d.default_active_thread_percentage().expect("get"), 50.0);
    assert_eq!(d.server_list().expect("servers"), Vec::<u32>::new());
    std::fs::write(d.pipe_dir().join("servers"), "777\n").expect("servers");
    std::fs::write(d.pipe_dir().join("clients.777"), "1001\n1002\n").expect("clients");
    assert_eq!(d.server_list().expect("servers"), vec![777]);
    assert_eq!(d.client_list(777).expect("clients"), vec![1001, 1002]);
    assert_eq!(d.server_status(777).expect("status"), ServerStatus::Active);
    assert!(d.health().is_healthy());

    d.set_active_thread_percentage(777, 30).expect("pct");
    d.set_active_thread_percentage(777, 250)
        .expect("pct clamps");
    d.set_device_pinned_mem_limit(777, 2 << 30).expect("pinned");
    d.terminate_client(777, 1002).expect("terminate");
    d.set_default_active_thread_percentage(25)
        .expect("default pct");
    assert_eq!(d.default_active_thread_percentage().expect("get"), 25.0);

    std::fs::write(d.pipe_dir().join("status.777"), "FAULT\n").expect("fault");
    let h = d.health();
    assert!(h.daemon_running);
    assert_eq!(h.servers, vec![(777, ServerStatus::Fault)]);
    assert!(!h.is_healthy());

    let l = log(&dir.join("mps"), 0);
    for want in [
        "CMD get_server_list",
        "CMD get_client_list 777",
        "CMD get_server_status 777",
        "CMD set_active_thread_percentage 777 30",
        "CMD set_active_thread_percentage 777 100",
        "CMD set_device_pinned_mem_limit 777 0 2048M",
        "CMD terminate_client 777 1002",
        "CMD set_default_active_thread_percentage 25",
    ] {
        assert!(l.iter().any(|x| x == want), "missing {want:?} in {l:?}");
    }
    d.quit().expect("quit");
    assert!(!d.health().daemon_running);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hung_control_binary_times_out() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::test_dir("mps-hang");
    let bin = dir.join("hang");
    std::fs::write(&bin, "#!/bin/sh\nexec sleep 30\n").expect("script");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut cfg = MpsConfig::new(bin, &dir.join("mps"));
    cfg.command_timeout = Duration::from_millis(300);
    let d = MpsDaemon::new(0, "GPU-x", &cfg);
    let t = std::time::Instant::now();
    assert!(matches!(d.server_list(), Err(MpsError::Timeout { .. })));
    assert!(t.elapsed() < Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_faulted_mps_server_makes_the_gpu_unhealthy() {
    common::init_tracing();
    let dir = common::test_dir("mps-node");
    let cfg = config(&dir);
    let mps = MpsManager::new(
        &cfg,
        &[(0, "GPU-sim-0000".into()), (1, "GPU-sim-0001".into())],
    );
    mps.start_all(None).expect("start");
    let (sup, _) = Supervisor::open(SupervisorConfig::new(
        &dir.join("state"),
        &dir.join("blocks"),
        Path::new("/nonexistent/libarbiter_interpose.so"),
    ))
    .expect("supervisor");
    let node_cfg = NodeConfig {
        mps_health_every: Duration::ZERO,
        ..NodeConfig::default()
    };
    let mut node = Node::new(
        Arc::new(SimBackend::new(2, 16 << 30)),
        Some(mps),
        sup,
        node_cfg,
    );
    let v = node.view();
    assert_eq!(
        [v.gpus[0].health, v.gpus[1].health],
        [health::HEALTHY, health::HEALTHY]
    );
    let pipe1 = dir.join("mps/gpu1/pipe");
    std::fs::write(pipe1.join("servers"), "900\n").expect("servers");
    std::fs::write(pipe1.join("status.900"), "FAULT\n").expect("fault");
    let v = node.view();
    assert_eq!(
        [v.gpus[0].health, v.gpus[1].health],
        [health::HEALTHY, health::UNHEALTHY]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
