//! The supervisor and the node-local data path with real processes: C workloads run under
//! `LD_PRELOAD` of the real interposer against the fake `libcuda.so.1`, and the test plays the
//! coordinator policy through `Node::view` / `Node::apply_actions`.

mod common;

use arbiter_node::enforcer::Applied;
use arbiter_node::gpu::{GpuBackend, GpuProcess, ProcessKind, SimBackend};
use arbiter_node::supervisor::{ExitOutcome, Supervisor, SupervisorConfig, WorkloadSpec};
use arbiter_node::{Node, NodeConfig};
use arbiter_policy_sdk::model::NodeAction;
use cuda_workload::{FakeSlot, FakeState};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

struct Env {
    dir: PathBuf,
}

impl Env {
    fn new(name: &str) -> Env {
        common::init_tracing();
        let _ = common::cuda_fixtures();
        Env {
            dir: common::test_dir(name),
        }
    }

    fn config(&self) -> SupervisorConfig {
        let mut c = SupervisorConfig::new(
            &self.dir.join("state"),
            &self.dir.join("blocks"),
            &common::cuda_fixtures().interposer,
        );
        c.grace = Duration::from_secs(5);
        c
    }

    fn node_with(&self, config: SupervisorConfig) -> Node {
        let (sup, report) = Supervisor::open(config).expect("supervisor");
        assert!(report.adopted.is_empty() && report.exited.is_empty());
        let backend: Arc<dyn GpuBackend> = Arc::new(SimBackend::new(1, 16 << 30));
        Node::new(backend, None, sup, NodeConfig::default())
    }

    fn node(&self) -> Node {
        self.node_with(self.config())
    }

    fn fake_state(&self) -> PathBuf {
        self.dir.join("fake-cuda-state")
    }

    /// A spec running the C workload (resolving the driver like cudart does).
    fn workload(&self, args: &[&str]) -> WorkloadSpec {
        let f = common::cuda_fixtures();
        let mut command = vec![f.workload.display().to_string()];
        command.extend(args.iter().map(|a| a.to_string()));
        WorkloadSpec {
            command,
            env: self.cuda_env(),
            ..WorkloadSpec::default()
        }
    }

    /// A workload that races 8 threads allocating 1 MiB chunks until the quota says no, but
    /// only once the returned file exists: the test can set limits (or NVML readings) on the
    /// running workload before its first allocation.
    fn gated_alloc_race(&self) -> (WorkloadSpec, PathBuf) {
        let go = self.dir.join("GO");
        let script = format!(
            "while [ ! -e '{}' ]; do sleep 0.01; done; exec '{}' alloc-race 8 {MIB}",
            go.display(),
            common::cuda_fixtures().workload.display()
        );
        let spec = WorkloadSpec {
            command: vec!["sh".into(), "-c".into(), script],
            env: self.cuda_env(),
            ..WorkloadSpec::default()
        };
        (spec, go)
    }

    fn cuda_env(&self) -> Vec<(String, String)> {
        common::cuda_env(&self.dir)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stdout_of(node: &Node, id: u32) -> PathBuf {
    node.supervisor()
        .get(id)
        .expect("workload")
        .record()
        .stdout
        .clone()
}

fn wait_for_output(path: &Path, want: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {want:?} in {} after {timeout:?}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn field(out: &str, key: &str) -> u64 {
    let pat = format!("{key}=");
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&pat))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}

fn only_ok(outcomes: &[arbiter_node::ActionOutcome]) -> Vec<Applied> {
    outcomes
        .iter()
        .map(|o| match &o.result {
            Ok(a) => *a,
            Err(e) => panic!("{:?} refused: {e}", o.action),
        })
        .collect()
}

#[test]
fn memory_limit_set_through_apply_actions_is_enforced_in_the_workload() {
    let env = Env::new("sup-memlimit");
    let mut node = env.node();
    // The limit is set on a running workload before its first allocation.
    let (spec, go) = env.gated_alloc_race();
    let id = node.launch(&spec).expect("launch");
    let v = node.view();
    assert_eq!(v.workloads.len(), 1);
    assert_eq!(
        v.workloads[0].memory_limit_mib,
        16 << 10,
        "unlimited = the GPU's size"
    );

    let out = node.apply_actions(&[NodeAction::SetMemoryLimit(id, 10)]);
    assert_eq!(only_ok(&out), [Applied::Now]);
    assert_eq!(node.view().workloads[0].memory_limit_mib, 10);
    let peak = {
        std::fs::write(&go, b"").expect("go");
        let r = node
            .supervisor_mut()
            .wait_exit(id, Duration::from_secs(60), None);
        r.expect("workload finished")
    };
    assert_eq!(peak.outcome, ExitOutcome::Code(0));
    assert!(!peak.evicted);
    let text = std::fs::read_to_string(stdout_of_finished(&env, id)).expect("stdout");
    assert_eq!(
        field(&text, "granted_allocs"),
        10,
        "10 MiB quota, 1 MiB chunks:\n{text}"
    );
    let fake = FakeState::read(&env.fake_state()).expect("fake state");
    assert_eq!(
        fake.get(FakeSlot::MemPeak),
        10 * MIB,
        "the device never saw more"
    );
    assert!(node.supervisor().get(id).is_none());
}

/// A workload given a host-spill allowance has its over-quota allocations served from host
/// memory (the C workload's `spill` mode fails unless exactly the allowance spills); one
/// without keeps the hard quota.
#[test]
fn a_host_spill_allowance_reaches_the_workload() {
    let env = Env::new("sup-spill");
    let mut node = env.node();
    let args = ["spill", &(8 * MIB).to_string(), &(4 * MIB).to_string()];
    for (spill, code) in [(Some(4 * MIB), 0), (None, 1)] {
        let spec = WorkloadSpec {
            memory_limit_bytes: Some(8 * MIB),
            host_spill_bytes: spill,
            ..env.workload(&args)
        };
        let id = node.launch(&spec).expect("launch");
        let b = node.supervisor().get(id).expect("workload").block();
        assert_eq!(
            b.liveness.spill_limit_bytes.load(Ordering::Relaxed),
            spill.unwrap_or(0)
        );
        let exit = node
            .supervisor_mut()
            .wait_exit(id, Duration::from_secs(60), None)
            .expect("workload finished");
        assert_eq!(exit.outcome, ExitOutcome::Code(code), "spill {spill:?}");
    }
}

/// NVML sees the workload's process hold 6 MiB that no wrapped allocator charged (context and
/// module memory on a real GPU): the node reconciles, reports both figures, and the workload's
/// 16 MiB limit leaves it 10 MiB to allocate — charged and unseen memory together never
/// exceed the limit.
#[test]
fn memory_nvml_sees_but_the_interposer_cannot_counts_against_the_limit() {
    let env = Env::new("sup-unseen");
    let (sup, _) = Supervisor::open(env.config()).expect("supervisor");
    let sim = Arc::new(SimBackend::new(1, 16 << 30));
    let backend: Arc<dyn GpuBackend> = sim.clone();
    let mut node = Node::new(backend, None, sup, NodeConfig::default());
    let (spec, go) = env.gated_alloc_race();
    let spec = WorkloadSpec {
        memory_limit_bytes: Some(16 * MIB),
        ..spec
    };
    let id = node.launch(&spec).expect("launch");
    let pid = node.supervisor().get(id).expect("running").record().pid;
    let mut sample = sim.sample(0).expect("sample");
    sample.processes = vec![GpuProcess {
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(6 * MIB),
        sm_util_pct: None,
        mem_util_pct: None,
    }];
    sim.set_sample(0, sample).expect("set sample");
    let status = node.view().workloads[0].clone();
    assert_eq!(
        (status.memory_used_mib, status.memory_unseen_mib),
        (6, 6),
        "both figures reach the coordinator"
    );
    std::fs::write(&go, b"").expect("go");
    let exit = node
        .supervisor_mut()
        .wait_exit(id, Duration::from_secs(60), None)
        .expect("workload finished");
    assert_eq!(exit.outcome, ExitOutcome::Code(0));
    let text = std::fs::read_to_string(stdout_of_finished(&env, id)).expect("stdout");
    assert_eq!(
        field(&text, "granted_allocs"),
        10,
        "16 MiB limit - 6 MiB unseen, 1 MiB chunks:\n{text}"
    );
}

fn stdout_of_finished(env: &Env, id: u32) -> PathBuf {
    env.dir.join("state/workloads").join(format!("{id}.out"))
}

#[test]
fn compute_share_change_reaches_the_block_and_paces_launches() {
    let env = Env::new("sup-share");
    let mut node = env.node();
    let mut spec = env.workload(&["launch-loop", "4000"]);
    spec.env
        .push(("FAKE_CUDA_KERNEL_NS".into(), "1000000".into()));
    spec.mean_kernel_ns = Some(1_000_000);
    let id = node.launch(&spec).expect("launch");
    wait_for_output(&stdout_of(&node, id), "ready", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(200));
    let before = node.view().workloads[0].clone();
    assert_eq!(before.compute_share, 1000);
    assert!(
        before.launches > 0,
        "the interposer counts launches into the block"
    );

    let out = node.apply_actions(&[NodeAction::SetComputeShare(id, 100)]);
    assert_eq!(only_ok(&out), [Applied::Now]);
    {
        let b = node.supervisor().get(id).expect("workload").block();
        assert_eq!(
            b.limits.pace_interval_ns.load(Ordering::Relaxed),
            10_000_000
        );
        assert!(b.limits.pace_epoch.load(Ordering::Relaxed) >= 1);
    }
    // Within one control period the new rate is in force; then count for a second.
    std::thread::sleep(Duration::from_millis(150));
    let l0 = node.view().workloads[0].launches;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let after = node.view().workloads[0].clone();
    let rate = (after.launches - l0) as f64 / t0.elapsed().as_secs_f64();
    assert_eq!(after.compute_share, 100);
    assert!(rate <= 130.0, "paced to ~100 launches/s, saw {rate:.0}/s");
    assert!(after.pacing_delay_us > 0, "pacing delay is reported");
    let b = node.supervisor().get(id).expect("workload").block();
    assert!(b.counters.throttled_launches.load(Ordering::Relaxed) > 0);

    // Out-of-range shares from a policy are refused, unknown workloads too.
    let out = node.apply_actions(&[
        NodeAction::SetComputeShare(id, 0),
        NodeAction::SetComputeShare(id, 1001),
        NodeAction::SetComputeShare(999, 500),
        NodeAction::Freeze(999),
    ]);
    assert!(out.iter().all(|o| o.result.is_err()));

    let out = node.apply_actions(&[NodeAction::Evict(id)]);
    assert_eq!(only_ok(&out), [Applied::InProgress]);
    let r = node
        .supervisor_mut()
        .wait_exit(id, Duration::from_secs(30), None)
        .expect("evicted");
    assert!(r.evicted);
}

#[test]
fn freeze_holds_launches_and_resume_releases_them() {
    let env = Env::new("sup-freeze");
    let mut node = env.node();
    let id = node
        .launch(&env.workload(&["launch-loop", "4000"]))
        .expect("launch");
    wait_for_output(&stdout_of(&node, id), "ready", Duration::from_secs(30));
    assert_eq!(
        only_ok(&node.apply_actions(&[NodeAction::Freeze(id)])),
        [Applied::Now]
    );
    std::thread::sleep(Duration::from_millis(100));
    let v1 = node.view().workloads[0].clone();
    assert!(v1.frozen);
    std::thread::sleep(Duration::from_millis(300));
    let v2 = node.view().workloads[0].clone();
    assert!(
        v2.launches - v1.launches <= 1,
        "at most the launch in flight got through"
    );
    assert_eq!(
        only_ok(&node.apply_actions(&[NodeAction::Resume(id)])),
        [Applied::Now]
    );
    let give_up = Instant::now() + Duration::from_secs(20);
    let v3 = loop {
        let v3 = node.view().workloads[0].clone();
        if v3.launches > v2.launches + 10 || Instant::now() > give_up {
            break v3;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!v3.frozen);
    assert!(v3.launches > v2.launches + 10, "launches flow again");
    node.apply_actions(&[NodeAction::Evict(id)]);
    node.supervisor_mut()
        .wait_exit(id, Duration::from_secs(30), None)
        .expect("evicted");
}

#[test]
fn graceful_eviction_reports_the_signal_and_releases_the_quota() {
    let env = Env::new("sup-evict");
    let mut node = env.node();
    let mut spec = env.workload(&["train"]);
    spec.memory_limit_bytes = Some(1 << 30);
    let id = node.launch(&spec).expect("launch");
    wait_for_output(&stdout_of(&node, id), "ready", Duration::from_secs(30));
    assert_eq!(node.supervisor().reserved_bytes(0), 1 << 30);
    let v = node.view();
    assert_eq!(v.workloads[0].memory_used_mib, 64, "train holds 64 MiB");
    assert_eq!(v.workloads[0].memory_limit_mib, 1024);
    let block_path = node
        .supervisor()
        .get(id)
        .expect("w")
        .record()
        .block_path
        .clone();

    // Admission: a second 16 GiB quota does not fit next to the first on a 16 GiB GPU.
    let mut big = env.workload(&["train"]);
    big.memory_limit_bytes = Some(16 << 30);
    assert!(node.launch(&big).is_err());

    assert_eq!(
        only_ok(&node.apply_actions(&[NodeAction::Evict(id)])),
        [Applied::InProgress]
    );
    let r = node
        .supervisor_mut()
        .wait_exit(id, Duration::from_secs(30), None)
        .expect("exited within the grace period");
    assert_eq!(
        r.outcome,
        ExitOutcome::Signal(15),
        "interposer re-raises SIGTERM"
    );
    assert!(r.evicted && !r.killed);
    assert_eq!(node.supervisor().reserved_bytes(0), 0, "quota released");
    assert!(!block_path.exists(), "control block removed");
    assert!(node.view().workloads.is_empty());
    let fake = FakeState::read(&env.fake_state()).expect("fake state");
    assert_eq!(
        fake.get(FakeSlot::MemUsed),
        0,
        "memory returned before exit"
    );
    assert_eq!(
        fake.get(FakeSlot::CtxLive),
        0,
        "context released before exit"
    );
}

#[test]
fn eviction_escalates_to_sigkill_after_the_grace_period() {
    let env = Env::new("sup-kill");
    let mut cfg = env.config();
    cfg.grace = Duration::from_millis(300);
    let mut node = env.node_with(cfg);
    let ready = env.dir.join("ready");
    let spec = WorkloadSpec {
        command: vec![
            "sh".into(),
            "-c".into(),
            format!(
                "trap '' TERM; : > '{}'; while :; do sleep 0.05; done",
                ready.display()
            ),
        ],
        ..WorkloadSpec::default()
    };
    let id = node.launch(&spec).expect("launch");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "workload never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    node.apply_actions(&[NodeAction::Evict(id)]);
    let t = Instant::now();
    let r = node
        .supervisor_mut()
        .wait_exit(id, Duration::from_secs(10), None)
        .expect("killed");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "grace period honoured"
    );
    assert_eq!(r.outcome, ExitOutcome::Signal(9));
    assert!(r.evicted && r.killed);
}

#[test]
fn a_new_supervisor_adopts_running_workloads_after_a_node_restart() {
    let env = Env::new("sup-adopt");
    let mut node = env.node();
    let mut spec = env.workload(&["launch-loop", "20000"]);
    spec.memory_limit_bytes = Some(256 * MIB);
    spec.role = 1;
    let live = node.launch(&spec).expect("launch");
    wait_for_output(&stdout_of(&node, live), "ready", Duration::from_secs(30));
    let short = node
        .launch(&WorkloadSpec {
            command: vec!["sh".into(), "-c".into(), "exit 3".into()],
            ..WorkloadSpec::default()
        })
        .expect("launch short");
    let short_pid = node.supervisor().get(short).expect("w").record().pid;
    let live_pid = node.supervisor().get(live).expect("w").record().pid;
    // A record whose pid now belongs to another process (pid reuse): same pid, other start.
    let me = std::process::id();
    let mut reused = node.supervisor().get(live).expect("w").record().clone();
    reused.id = 77;
    reused.pid = me;
    reused.start_ticks = arbiter_node::procfs::stat(me).expect("stat").start_ticks + 1;
    reused.block_path = env.dir.join("blocks/77.block");
    std::fs::write(
        env.dir.join("state/workloads/77.json"),
        serde_json::to_vec(&reused).expect("json"),
    )
    .expect("record");

    // The node "crashes": the supervisor goes away without reaping or killing anything.
    drop(node);
    let deadline = Instant::now() + Duration::from_secs(10);
    while arbiter_node::procfs::stat(short_pid).map(|s| s.state).ok() != Some('Z') {
        assert!(Instant::now() < deadline, "short workload did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }

    let (sup, report) = Supervisor::open(env.config()).expect("reopen");
    assert_eq!(report.adopted, vec![live]);
    let mut exited: Vec<u32> = report.exited.iter().map(|r| r.id).collect();
    exited.sort();
    assert_eq!(exited, vec![short, 77]);
    assert!(
        report
            .exited
            .iter()
            .all(|r| r.outcome == ExitOutcome::Unknown)
    );
    let w = sup.get(live).expect("adopted");
    assert!(w.adopted());
    assert_eq!(w.record().pid, live_pid);
    assert_eq!(
        w.memory_limit_bytes(),
        Some(256 * MIB),
        "limits survived in the block"
    );

    let backend: Arc<dyn GpuBackend> = Arc::new(SimBackend::new(1, 16 << 30));
    let mut node = Node::new(backend, None, sup, NodeConfig::default());
    let v = node.view();
    assert_eq!(v.workloads.len(), 1);
    assert_eq!((v.workloads[0].id, v.workloads[0].role), (live, 1));
    let l0 = v.workloads[0].launches;
    let give_up = Instant::now() + Duration::from_secs(20);
    while node.view().workloads[0].launches <= l0 {
        assert!(Instant::now() < give_up, "still running, still counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The new node controls the adopted workload.
    let out = node.apply_actions(&[
        NodeAction::SetMemoryLimit(live, 128),
        NodeAction::SetComputeShare(live, 500),
        NodeAction::SetMpsThreadPct(live, 40),
    ]);
    assert_eq!(
        only_ok(&out),
        [Applied::Now, Applied::Now, Applied::AtNextStart]
    );
    assert_eq!(node.view().workloads[0].memory_limit_mib, 128);
    // A new id never collides with the old ones.
    let next = node
        .launch(&WorkloadSpec {
            command: vec!["true".into()],
            ..WorkloadSpec::default()
        })
        .expect("launch");
    assert!(next > 77);

    node.apply_actions(&[NodeAction::Evict(live)]);
    let r = node
        .supervisor_mut()
        .wait_exit(live, Duration::from_secs(30), None)
        .expect("evicted");
    assert_eq!(
        r.outcome,
        ExitOutcome::Unknown,
        "not our child after the restart"
    );
    assert!(r.evicted);
    node.supervisor_mut()
        .wait_exit(next, Duration::from_secs(10), None)
        .expect("true exits");
}

#[test]
fn kernel_time_estimate_turns_a_share_into_an_interval() {
    let env = Env::new("sup-estimate");
    let sim = Arc::new(SimBackend::new(1, 16 << 30));
    let (sup, _) = Supervisor::open(env.config()).expect("supervisor");
    let mut node = Node::new(
        sim.clone(),
        None,
        sup,
        NodeConfig {
            kernel_estimate_alpha: 1.0,
            ..NodeConfig::default()
        },
    );
    let id = node
        .launch(&WorkloadSpec {
            command: vec!["sleep".into(), "30".into()],
            ..WorkloadSpec::default()
        })
        .expect("launch");
    let mut s = sim.sample(0).expect("sample");
    s.utilization_pct = 50;
    sim.set_sample(0, s).expect("set");
    node.view();
    let first_view = Instant::now();
    // The workload (alone on the GPU, so the GPU's busy time is its own) made 1000 launches
    // in ~100 ms at 50 % busy: ~50 µs of device time per launch.
    let b = node.supervisor().get(id).expect("w").block();
    b.counters.launches.fetch_add(1000, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    node.view();
    // Busy time is wall time between the views × 50 %, so a loaded machine's oversleep
    // raises the estimate: the bound follows the time that really passed.
    let between = first_view.elapsed().as_nanos() as u64;
    node.apply_actions(&[NodeAction::SetComputeShare(id, 500)]);
    let interval = node
        .supervisor()
        .get(id)
        .expect("w")
        .block()
        .limits
        .pace_interval_ns
        .load(Ordering::Relaxed);
    // Per launch: between × 0.5 / 1000; the interval at a 0.5 share twice that.
    let expected = between / 1000;
    assert!(
        (100_000..=expected * 2).contains(&interval),
        "~50 µs / 0.5 = ~100 µs ({between} ns between the views), got {interval} ns"
    );
    node.apply_actions(&[NodeAction::Evict(id)]);
    node.supervisor_mut()
        .wait_exit(id, Duration::from_secs(10), None)
        .expect("evicted");
}
