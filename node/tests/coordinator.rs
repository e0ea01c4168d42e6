//! The node-local policy runtime end to end: the built-in `sysmonitor` Wasm component run by
//! [`Coordinator`] against a real [`Node`] — NVML through the fake `libnvidia-ml.so.1`, an
//! offline C workload under the real interposer and the fake `libcuda.so.1` — and policies that
//! misbehave (a Wasm instance that traps, native policies with invalid answers).

mod common;

use arbiter_host::runtime::{NativePolicy, PolicyEngine, PolicyFault, RuntimeConfig};
use arbiter_node::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorError, InvalidActions, Served, StepReport,
    node_runtime_config,
};
use arbiter_node::enforcer::Applied;
use arbiter_node::gpu::{GpuBackend, GpuSample, SimBackend};
use arbiter_node::mps::{MpsConfig, MpsManager};
use arbiter_node::supervisor::{Supervisor, SupervisorConfig, WorkloadSpec};
use arbiter_node::{Node, NodeConfig, NvmlBackend};
use arbiter_policy_sdk::model::*;
use serde_json::json;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const GPU_MIB: u64 = 16_384;
const ONLINE: u8 = 0;
const OFFLINE: u8 = 1;

/// Settings for a policy that is not meant to hang: a deadline no stall of a loaded machine
/// reaches, so that a step faults only when the policy is at fault. (The default, a quarter
/// of the 100 ms period, is 25 ms: one preemption of the test thread mid-call would make a
/// healthy step a deadline fault.)
fn patient() -> CoordinatorConfig {
    CoordinatorConfig {
        deadline: Some(Duration::from_secs(30)),
        ..CoordinatorConfig::default()
    }
}

fn sysmonitor_wasm() -> &'static [u8] {
    arbiter_policies::get("sysmonitor").expect("sysmonitor is a built-in policy")
}

struct Env {
    dir: PathBuf,
}

impl Env {
    fn new(name: &str) -> Env {
        common::init_tracing();
        Env {
            dir: common::test_dir(name),
        }
    }

    fn supervisor(&self, interposer: &Path) -> Supervisor {
        let mut c = SupervisorConfig::new(
            &self.dir.join("state"),
            &self.dir.join("blocks"),
            interposer,
        );
        // Longer than the interposer's exit synchronization timeout (5 s) plus scheduling
        // delays on a loaded CI machine: a graceful exit that runs late must not be counted as
        // killed. A workload that ignores SIGTERM is still killed, only later.
        c.grace = Duration::from_secs(15);
        let (sup, _) = Supervisor::open(c).expect("supervisor");
        sup
    }

    /// A node over a simulated GPU backend; workloads are plain processes (no interposer: the
    /// control block is what the test checks).
    fn sim_node(&self, sim: Arc<SimBackend>) -> Node {
        let sup = self.supervisor(Path::new("/nonexistent/libarbiter_interpose.so"));
        Node::new(sim, None, sup, NodeConfig::default())
    }

    fn set_time(&self, t: f64) {
        std::fs::write(self.dir.join("t"), t.to_string()).expect("time file");
    }

    fn cuda_env(&self) -> Vec<(String, String)> {
        let mut env = common::cuda_env(&self.dir);
        env.push(("FAKE_CUDA_KERNEL_NS".into(), "200000".into()));
        env
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sleeper(role: u8, gpu: u32) -> WorkloadSpec {
    WorkloadSpec {
        command: vec!["sleep".into(), "120".into()],
        role,
        gpu,
        ..WorkloadSpec::default()
    }
}

fn status(node: &mut Node, id: u32) -> WorkloadStatus {
    node.view()
        .workloads
        .into_iter()
        .find(|w| w.id == id)
        .expect("workload in view")
}

fn pace_interval(node: &Node, id: u32) -> u64 {
    node.supervisor()
        .get(id)
        .expect("workload")
        .block()
        .limits
        .pace_interval_ns
        .load(Ordering::Acquire)
}

fn shares_applied(r: &StepReport, id: u32) -> Vec<u32> {
    r.outcomes
        .iter()
        .filter(|o| o.result.is_ok())
        .filter_map(|o| match o.action {
            NodeAction::SetComputeShare(w, s) if w == id => Some(s),
            _ => None,
        })
        .collect()
}

fn touches(r: &StepReport, id: u32) -> bool {
    r.outcomes.iter().any(|o| match o.action {
        NodeAction::SetMemoryLimit(w, _)
        | NodeAction::SetComputeShare(w, _)
        | NodeAction::SetMpsThreadPct(w, _)
        | NodeAction::Freeze(w)
        | NodeAction::Resume(w)
        | NodeAction::Evict(w) => w == id,
        NodeAction::SetHealth(..) | NodeAction::RestartMps(_) => false,
    })
}

fn evict_all(node: &mut Node) {
    let ids = node.supervisor().ids();
    for id in &ids {
        let _ = node.apply_actions(&[NodeAction::Evict(*id)]);
    }
    for id in ids {
        let _ = node
            .supervisor_mut()
            .wait_exit(id, Duration::from_secs(30), None);
    }
}

/// The fake NVML scenario of one 16 GiB GPU: quiet, then the online workload bursts (SM
/// activity and a falling clock: the GPU load rises past the set point, every metric still in
/// its hysteresis band), then its memory bursts past the Overlimit threshold.
fn burst_scenario(dir: &Path) -> serde_json::Value {
    json!({
        "time_file": dir.join("t"),
        "gpus": [{
            "name": "Fake T4", "uuid": "GPU-fake-coord", "memory_total_mib": GPU_MIB,
            "max_sm_clock_mhz": 1980,
            "timeline": [
                { "t": 0, "utilization_pct": 30, "sm_clock_mhz": 1980, "memory_used_mib": 4096 },
                { "t": 1, "utilization_pct": 75, "sm_clock_mhz": 1683, "memory_used_mib": 6144 },
                { "t": 2, "utilization_pct": 78, "sm_clock_mhz": 1683, "memory_used_mib": 15892 }
            ]
        }]
    })
}

#[test]
fn sysmonitor_wasm_paces_then_evicts_offline_work_on_an_online_burst() {
    let env = Env::new("coord-burst");
    let lib = common::install_fake_nvml(&env.dir, &burst_scenario(&env.dir));
    env.set_time(0.0);
    let nvml: Arc<dyn GpuBackend> = Arc::new(NvmlBackend::open(Some(&lib)).expect("fake NVML"));
    let f = common::cuda_fixtures();
    let mut node = Node::new(
        nvml,
        None,
        env.supervisor(&f.interposer),
        NodeConfig::default(),
    );
    let online = node.launch(&sleeper(ONLINE, 0)).expect("online");
    let offline = node
        .launch(&WorkloadSpec {
            command: vec![
                f.workload.display().to_string(),
                "launch-loop".into(),
                "120000".into(),
            ],
            env: env.cuda_env(),
            role: OFFLINE,
            mean_kernel_ns: Some(200_000),
            ..WorkloadSpec::default()
        })
        .expect("offline");
    let out = node
        .supervisor()
        .get(offline)
        .expect("w")
        .record()
        .stdout
        .clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("ready")
    {
        assert!(Instant::now() < deadline, "offline workload never started");
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut coord =
        Coordinator::builtin("sysmonitor", None, patient()).expect("built-in sysmonitor loads");
    assert_eq!(coord.policy_name(), Some("sysmonitor"));

    // Quiet: the GPU is published Healthy, the offline workload gets its 40 % memory quota
    // (MuxFlow §6) and stays unthrottled; the online one is never touched.
    for _ in 0..3 {
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Policy, "{:?}", r.fault);
        assert!(r.refused.is_empty());
        assert!(!touches(&r, online));
        assert!(shares_applied(&r, offline).is_empty());
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = node.view();
    assert_eq!(v.gpus[0].health, health::HEALTHY);
    let off = status(&mut node, offline);
    assert_eq!((off.memory_limit_mib, off.compute_share), (6553, 1000));
    assert_eq!(pace_interval(&node, offline), 0, "unthrottled");
    let on = status(&mut node, online);
    assert_eq!((on.memory_limit_mib, on.compute_share), (16_384, 1000));

    // The online burst: the very next control step lowers the offline share in its block.
    env.set_time(1.0);
    let t = Instant::now();
    let r = coord.step(&mut node);
    let burst_to_block = t.elapsed();
    let cut = shares_applied(&r, offline);
    assert_eq!(cut.len(), 1, "one share change: {:?}", r.outcomes);
    assert!(cut[0] < 1000);
    assert!(r.outcomes.iter().all(|o| o.result.is_ok()));
    let interval = pace_interval(&node, offline);
    assert_eq!(
        interval,
        (200_000.0 * 1000.0 / f64::from(cut[0])).round() as u64,
        "mean kernel time / share"
    );
    // The deterministic part is above: the very step after the burst changed the share. Its
    // time (~1 ms here) is a benchmark's business; this bound only catches a step that
    // blocks, with room for a loaded machine's scheduling.
    assert!(
        burst_to_block < Duration::from_secs(2),
        "view → Wasm → block: {burst_to_block:?}"
    );
    assert!(!touches(&r, online));
    assert_eq!(pace_interval(&node, online), 0);

    // Sustained, the controller keeps lowering the share (the integral term), and the paced
    // workload launches at most at the paced rate.
    let mut last = cut[0];
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Policy);
        assert!(!touches(&r, online));
        if let Some(&s) = shares_applied(&r, offline).last() {
            assert!(s < last, "the share only falls during the burst");
            last = s;
        }
    }
    assert!(last < cut[0]);
    let l0 = status(&mut node, offline).launches;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let rate = (status(&mut node, offline).launches - l0) as f64 / t0.elapsed().as_secs_f64();
    let paced = 1e9 / pace_interval(&node, offline) as f64;
    assert!(
        rate <= paced * 1.3 + 20.0,
        "launches at most at the paced rate: {rate:.0}/s vs {paced:.0}/s"
    );

    // The online workload's memory bursts past 95 %: Overlimit, the offline workload is evicted
    // (gracefully: the interposer exits on SIGTERM), the online one keeps running.
    env.set_time(2.0);
    let r = coord.step(&mut node);
    let evicted: Vec<_> = r
        .outcomes
        .iter()
        .filter(|o| o.action == NodeAction::Evict(offline))
        .map(|o| o.result.as_ref().ok().copied())
        .collect();
    assert_eq!(evicted, [Some(Applied::InProgress)], "{:?}", r.outcomes);
    assert!(!touches(&r, online));
    assert_eq!(node.view().gpus[0].health, health::OVERLIMIT);
    let exit = node
        .supervisor_mut()
        .wait_exit(offline, Duration::from_secs(30), None)
        .expect("offline workload evicted");
    assert!(exit.evicted && !exit.killed, "{exit:?}");
    // Asked once: the following steps do not evict again, and nothing touches the online work.
    for _ in 0..3 {
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Policy);
        assert!(r.outcomes.is_empty(), "{:?}", r.outcomes);
    }
    assert!(
        node.supervisor().get(online).is_some(),
        "online still running"
    );
    assert_eq!(coord.stats().faults, 0);
    evict_all(&mut node);
}

/// MuxFlow §4.2's reset: an XID error on a GPU (NVML event through the fake library) makes the
/// `sysmonitor` Wasm policy evict the GPU's offline work and restart its MPS server (the fake
/// `nvidia-cuda-mps-control` records the quit and the new daemon); online work stays.
#[test]
fn sysmonitor_wasm_resets_mps_and_evicts_offline_work_on_an_xid_error() {
    let env = Env::new("coord-xid");
    let scenario = json!({
        "time_file": env.dir.join("t"),
        "gpus": [{
            "name": "Fake T4", "uuid": "GPU-fake-xid", "memory_total_mib": GPU_MIB,
            "max_sm_clock_mhz": 1590,
            "timeline": [
                { "t": 0, "utilization_pct": 30, "memory_used_mib": 4096 },
                { "t": 1, "utilization_pct": 30, "memory_used_mib": 4096, "xid": [31] }
            ]
        }]
    });
    let lib = common::install_fake_nvml(&env.dir, &scenario);
    env.set_time(0.0);
    let nvml: Arc<dyn GpuBackend> = Arc::new(NvmlBackend::open(Some(&lib)).expect("fake NVML"));
    let mps_cfg = MpsConfig::new(common::fake_mps_binary(), &env.dir.join("mps"));
    let mps = MpsManager::new(&mps_cfg, &[(0, "GPU-fake-xid".into())]);
    mps.start_all(None).expect("MPS daemon");
    let mps_log = env.dir.join("mps/gpu0/log/commands.log");
    let starts = || {
        std::fs::read_to_string(&mps_log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("START"))
            .count()
    };
    assert_eq!(starts(), 1);
    let mut node = Node::new(
        nvml,
        Some(mps),
        env.supervisor(Path::new("/nonexistent/libarbiter_interpose.so")),
        NodeConfig::default(),
    );
    let online = node.launch(&sleeper(ONLINE, 0)).expect("online");
    let offline = node.launch(&sleeper(OFFLINE, 0)).expect("offline");
    let mut coord =
        Coordinator::builtin("sysmonitor", None, patient()).expect("built-in sysmonitor loads");
    for _ in 0..3 {
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Policy, "{:?}", r.fault);
        assert!(
            !r.outcomes
                .iter()
                .any(|o| matches!(o.action, NodeAction::RestartMps(_)))
        );
    }
    assert_eq!(node.view().gpus[0].xid_errors, 0);

    // XID 31 (a client's MMU fault): the watcher counts it within a wait period.
    env.set_time(1.0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = coord.step(&mut node);
        if r.outcomes
            .iter()
            .any(|o| o.action == NodeAction::RestartMps(0))
        {
            break r;
        }
        assert!(Instant::now() < deadline, "no reset after the XID error");
        std::thread::sleep(Duration::from_millis(50));
    };
    for o in &r.outcomes {
        assert!(o.result.is_ok(), "{o:?}");
    }
    assert!(
        r.outcomes
            .iter()
            .any(|o| o.action == NodeAction::Evict(offline))
    );
    assert!(!touches(&r, online), "online work is never touched");
    let log = std::fs::read_to_string(&mps_log).expect("MPS log");
    assert!(log.lines().any(|l| l == "CMD quit"), "{log}");
    assert_eq!(starts(), 2, "a fresh daemon: {log}");
    let v = node.view();
    assert_eq!(
        (v.gpus[0].xid_errors, v.gpus[0].health),
        (1, health::OVERLIMIT)
    );
    let exit = node
        .supervisor_mut()
        .wait_exit(offline, Duration::from_secs(30), None)
        .expect("offline workload evicted");
    assert!(exit.evicted, "{exit:?}");
    assert!(
        node.supervisor().get(online).is_some(),
        "online still running"
    );
    evict_all(&mut node);
}

fn quiet(sim: &SimBackend) -> GpuSample {
    let mut s = sim.sample(0).expect("sample");
    s.utilization_pct = 30;
    s.sm_clock_mhz = s.max_sm_clock_mhz;
    s.memory_used_bytes = 4 << 30;
    s
}

#[test]
fn run_loop_moves_the_pacing_rate_within_one_period_of_a_burst_and_stops_on_the_flag() {
    let env = Env::new("coord-loop");
    let sim = Arc::new(SimBackend::new(1, GPU_MIB << 20));
    sim.set_sample(0, quiet(&sim)).expect("sample");
    let mut node = env.sim_node(sim.clone());
    let online = node.launch(&sleeper(ONLINE, 0)).expect("online");
    let offline = node.launch(&sleeper(OFFLINE, 0)).expect("offline");
    let settings = patient();
    let period = settings.period;
    let mut coord = Coordinator::builtin("sysmonitor", None, settings).expect("load");

    let stop = AtomicBool::new(false);
    let mut injected: Option<(Instant, u64)> = None;
    let mut latency = None;
    let mut steps = 0;
    let summary = coord.run_loop_with(&mut node, &stop, |r| {
        steps += 1;
        assert_ne!(r.served, Served::Faulted, "{:?}", r.fault);
        assert!(!touches(r, online));
        match injected {
            None if steps == 5 => {
                // Half-way through the period, as a burst arrives at any time.
                std::thread::sleep(period / 2);
                let mut s = quiet(&sim);
                s.utilization_pct = 75;
                s.sm_clock_mhz = s.max_sm_clock_mhz * 85 / 100;
                sim.set_sample(0, s).expect("burst");
                injected = Some((Instant::now(), steps));
            }
            Some((at, at_step)) if latency.is_none() && !shares_applied(r, offline).is_empty() => {
                latency = Some((at.elapsed(), steps - at_step));
                stop.store(true, Ordering::Release);
            }
            _ => {}
        }
        if steps >= 50 {
            stop.store(true, Ordering::Release);
        }
    });
    let (latency, periods) = latency.expect("the burst moved the pacing rate");
    // The very next period acted on it: within one period, whatever the machine's load did to
    // the wall clock. The time bound only catches a loop that sleeps past its period.
    assert_eq!(periods, 1, "burst → block after {periods} periods");
    assert!(
        latency <= period + Duration::from_secs(2),
        "burst → block in {latency:?} at a {period:?} period"
    );
    assert_eq!(summary.steps, steps);
    assert!(pace_interval(&node, offline) > 0);
    assert_eq!(pace_interval(&node, online), 0);
    assert_eq!(coord.stats().steps, steps);
    evict_all(&mut node);
}

/// Fuel the sysmonitor component needs for `describe` and `configure("")`, and for one tick of
/// `view`: measured, because the Wasm instruction count is the compiler's business.
fn fuel_costs(view: &NodeView) -> (u64, u64) {
    let engine = PolicyEngine::new(RuntimeConfig {
        fuel: Some(1 << 40),
        ..patient().runtime_config()
    })
    .expect("engine");
    let compiled = engine.compile(sysmonitor_wasm()).expect("compile");
    let mut i = compiled.instantiate().expect("instance");
    i.describe().expect("describe");
    let describe = i.last_call().fuel.expect("fuel on");
    // The coordinator configures an empty configuration as the manifest's default.
    let default_config = compiled.manifest.default_config.clone();
    i.configure(&default_config).expect("configure");
    let configure = i.last_call().fuel.expect("fuel on");
    i.tick(view.clone()).expect("tick");
    let tick = i.last_call().fuel.expect("fuel on");
    (describe.max(configure), tick)
}

#[test]
fn a_wasm_policy_that_traps_every_period_falls_back_to_holding_steady() {
    let env = Env::new("coord-trap");
    // Many GPUs make a tick cost far more fuel than loading (with the manifest's default
    // configuration) does.
    let sim = Arc::new(SimBackend::new(256, GPU_MIB << 20));
    let mut node = env.sim_node(sim);
    let offline = node.launch(&sleeper(OFFLINE, 0)).expect("offline");
    node.apply_actions(&[NodeAction::SetComputeShare(offline, 700)]);
    let before = (status(&mut node, offline), pace_interval(&node, offline));

    let (load_cost, tick_cost) = fuel_costs(&node.view());
    let fuel = load_cost * 2 + 10_000;
    assert!(
        tick_cost > fuel * 2,
        "a tick ({tick_cost}) must cost well over loading ({load_cost}) for this test"
    );
    // Enough fuel to load and configure, never enough for a tick: every tick traps (for
    // fuel, never for time: the deadline is out of reach).
    let engine = PolicyEngine::new(RuntimeConfig {
        fuel: Some(fuel),
        ..patient().runtime_config()
    })
    .expect("engine");
    let compiled = engine.compile(sysmonitor_wasm()).expect("compile");
    let settings = CoordinatorConfig {
        fallback_after: 3,
        ..patient()
    };
    let mut coord = Coordinator::from_compiled(compiled, Some(""), settings).expect("load");

    for n in 1..=3u32 {
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Faulted);
        assert_eq!(r.fault, Some(PolicyFault::OutOfFuel), "step {n}");
        assert!(
            r.outcomes.is_empty(),
            "nothing applied from a faulting call"
        );
        assert_eq!(coord.stats().consecutive_faults, n);
    }
    assert!(coord.on_fallback(), "retired after 3 consecutive faults");
    // A trapped instance is never re-entered: steps 2 and 3 each got a fresh one.
    assert_eq!(coord.stats().reinstantiations, 2);
    for _ in 0..5 {
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Fallback);
        assert!(r.fault.is_none() && r.outcomes.is_empty());
    }
    // Holding steady: the offline workload kept exactly the limits it had.
    assert_eq!(
        (status(&mut node, offline), pace_interval(&node, offline)),
        before
    );
    let stats = coord.stats().clone();
    assert_eq!((stats.steps, stats.faults, stats.fallback_steps), (8, 3, 5));

    // An operator puts the policy back: a fresh instance, which still traps.
    coord.retry_policy().expect("retry");
    assert!(!coord.on_fallback());
    let r = coord.step(&mut node);
    assert_eq!(r.fault, Some(PolicyFault::OutOfFuel));
    assert_eq!(coord.stats().consecutive_faults, 1);
    assert_eq!(coord.stats().reinstantiations, 3);

    // A swap to the same policy in a well-fuelled engine: it serves from the next period on.
    let healthy = PolicyEngine::new(patient().runtime_config())
        .expect("engine")
        .compile(sysmonitor_wasm())
        .expect("compile");
    coord.replace_policy(healthy, None).expect("swap");
    assert_eq!(coord.stats().consecutive_faults, 0);
    let r = coord.step(&mut node);
    assert_eq!(r.served, Served::Policy, "{:?}", r.fault);
    assert!(r.refused.is_empty());
    evict_all(&mut node);
}

/// The hostile corpus's coordinator cases (`arbiter-hostile`: a `tick` that loops, traps,
/// allocates without bound, fails with 32 MiB of text, flaps, evicts a workload the node does
/// not have, or floods a million actions) on a node: each is quarantined within 40 periods,
/// what it says reaches the log bounded, and the node's workloads keep exactly the limits they
/// had — nothing a faulting answer held is applied.
#[test]
fn hostile_coordinators_are_quarantined_and_leave_the_workloads_as_they_were() {
    use arbiter_hostile::{Expect, Role};
    let env = Env::new("coord-hostile");
    let sim = Arc::new(SimBackend::new(2, GPU_MIB << 20));
    let mut node = env.sim_node(sim);
    let offline = node.launch(&sleeper(OFFLINE, 0)).expect("offline");
    let online = node.launch(&sleeper(ONLINE, 1)).expect("online");
    node.apply_actions(&[NodeAction::SetComputeShare(offline, 700)]);
    let limits = |node: &mut Node| {
        (
            status(node, offline),
            status(node, online),
            pace_interval(node, offline),
        )
    };
    let before = limits(&mut node);
    let engine =
        PolicyEngine::new(node_runtime_config(Duration::from_millis(100))).expect("engine");
    let cases: Vec<_> = arbiter_hostile::corpus()
        .into_iter()
        .filter(|c| {
            matches!(
                c.expect,
                Expect::Faults {
                    role: Role::Coordinator,
                    ..
                } | Expect::Flaps {
                    role: Role::Coordinator
                }
            )
        })
        .collect();
    assert!(cases.len() >= 7, "{} coordinator cases", cases.len());
    for case in &cases {
        let name = &case.name;
        let compiled = engine.compile(&case.wasm).expect("the fixture compiles");
        let mut coord = Coordinator::from_compiled(
            compiled,
            case.config.as_deref(),
            CoordinatorConfig::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut faults = 0;
        for _ in 0..40 {
            if coord.on_fallback() {
                break;
            }
            let r = coord.step(&mut node);
            if let Some(fault) = &r.fault {
                faults += 1;
                let shown = fault.to_string();
                assert!(
                    shown.len() <= arbiter_host::runtime::MAX_ERROR_TEXT + 64,
                    "{name}: a {} byte fault",
                    shown.len()
                );
                assert!(r.outcomes.is_empty(), "{name}: applied {:?}", r.outcomes);
            }
        }
        assert!(coord.on_fallback(), "{name}: not quarantined in 40 periods");
        assert!(faults >= 2, "{name}: {faults} faults");
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Fallback, "{name}");
        assert_eq!(limits(&mut node), before, "{name}");
    }
    evict_all(&mut node);
}

/// A native coordinator that answers from a script (then nothing).
struct Scripted {
    answers: VecDeque<Result<Vec<NodeAction>, PolicyError>>,
}

impl NativePolicy for Scripted {
    fn manifest(&self) -> Manifest {
        let mut m = Manifest {
            name: "scripted".into(),
            version: "0".into(),
            roles: vec!["coordinator".into()],
            ..Manifest::default()
        };
        m.description = "test double".into();
        m
    }
    fn configure(&mut self, _config: &str) -> Result<(), PolicyError> {
        Ok(())
    }
    fn resync(&mut self, _snapshot: Snapshot) -> Result<(), PolicyError> {
        Err(PolicyError::Unsupported("scheduler".into()))
    }
    fn apply(&mut self, _delta: &Delta) -> Result<(), PolicyError> {
        Err(PolicyError::Unsupported("scheduler".into()))
    }
    fn schedule(&mut self, _round: RoundInfo) -> Result<Vec<Decision>, PolicyError> {
        Err(PolicyError::Unsupported("scheduler".into()))
    }
    fn reclaim(&mut self, _request: ReclaimRequest) -> Result<ReclaimPlan, PolicyError> {
        Err(PolicyError::Unsupported("reclaim".into()))
    }
    fn match_workloads(&mut self, _request: MatchRequest) -> Result<Vec<Pairing>, PolicyError> {
        Err(PolicyError::Unsupported("matcher".into()))
    }
    fn tick(&mut self, _view: NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        self.answers.pop_front().unwrap_or(Ok(Vec::new()))
    }
    fn order(&mut self, _view: TenantView) -> Result<TenantVerdict, PolicyError> {
        Err(PolicyError::Unsupported("tenant".into()))
    }
}

#[test]
fn invalid_answers_are_refused_whole_and_repeated_faults_fall_back() {
    let env = Env::new("coord-invalid");
    let sim = Arc::new(SimBackend::new(2, GPU_MIB << 20));
    let mut node = env.sim_node(sim);
    let online = node.launch(&sleeper(ONLINE, 0)).expect("online");
    let offline = node.launch(&sleeper(OFFLINE, 1)).expect("offline");
    let flood = vec![NodeAction::Freeze(offline); 10_000];
    let script = Scripted {
        answers: VecDeque::from([
            // 1. Valid: applied.
            Ok(vec![
                NodeAction::SetComputeShare(offline, 500),
                NodeAction::SetMpsThreadPct(offline, 40),
                NodeAction::SetHealth(1, health::UNHEALTHY),
            ]),
            // 2. One good action among bad ones: nothing applied.
            Ok(vec![
                NodeAction::SetComputeShare(offline, 250),
                NodeAction::SetComputeShare(offline, 1001),
                NodeAction::SetMpsThreadPct(offline, 101),
                NodeAction::Evict(999),
                NodeAction::SetHealth(7, health::HEALTHY),
                NodeAction::SetHealth(0, 9),
            ]),
            // 3. A flood.
            Ok(flood),
            // 4. Valid again: the fault streak resets.
            Ok(vec![NodeAction::SetComputeShare(offline, 400)]),
            // 5–7. The policy reports failure three times in a row: retired.
            Err(PolicyError::Failed("lost its mind".into())),
            Err(PolicyError::Failed("lost its mind".into())),
            Ok(vec![NodeAction::Evict(online), NodeAction::Freeze(12345)]),
            // Never reached: the fallback answers from here.
            Ok(vec![NodeAction::Evict(online)]),
        ]),
    };
    let mut coord =
        Coordinator::native(Box::new(script), None, CoordinatorConfig::default()).expect("load");

    let r = coord.step(&mut node);
    assert_eq!(r.served, Served::Policy);
    assert_eq!(r.outcomes.len(), 3);
    assert!(r.outcomes.iter().all(|o| o.result.is_ok()));
    assert_eq!(status(&mut node, offline).compute_share, 500);
    assert_eq!(node.view().gpus[1].health, health::UNHEALTHY);
    let interval = pace_interval(&node, offline);

    let r = coord.step(&mut node);
    assert_eq!(r.served, Served::Faulted);
    assert_eq!(r.fault.as_ref().map(PolicyFault::kind), Some("bad-answer"));
    assert!(r.outcomes.is_empty());
    let bad: Vec<usize> = r.refused.iter().map(|x| x.index).collect();
    assert_eq!(bad, [1, 2, 3, 4, 5]);
    assert_eq!(
        (
            status(&mut node, offline).compute_share,
            pace_interval(&node, offline)
        ),
        (500, interval),
        "the valid action of an invalid answer is not applied either"
    );

    let r = coord.step(&mut node);
    assert_eq!(
        r.fault.as_ref().map(PolicyFault::kind),
        Some("too-many-decisions")
    );
    assert!(!status(&mut node, offline).frozen);
    assert_eq!(coord.stats().consecutive_faults, 2);

    let r = coord.step(&mut node);
    assert_eq!(r.served, Served::Policy);
    assert_eq!(coord.stats().consecutive_faults, 0);
    assert_eq!(status(&mut node, offline).compute_share, 400);

    for kind in ["reported", "reported", "bad-answer"] {
        let r = coord.step(&mut node);
        assert_eq!(r.fault.as_ref().map(PolicyFault::kind), Some(kind));
        assert!(r.outcomes.is_empty());
    }
    assert!(coord.on_fallback());
    for _ in 0..3 {
        let r = coord.step(&mut node);
        assert_eq!(r.served, Served::Fallback);
        assert!(r.outcomes.is_empty());
    }
    assert!(node.supervisor().get(online).is_some(), "never evicted");
    let s = coord.stats();
    assert_eq!(
        (s.faults, s.applied_actions, s.node_refused_actions),
        (5, 4, 0)
    );
    assert_eq!(s.refused_actions, 5 + 1);
    evict_all(&mut node);
}

#[test]
fn drop_action_mode_applies_the_valid_part_of_an_answer() {
    let env = Env::new("coord-drop");
    let sim = Arc::new(SimBackend::new(1, GPU_MIB << 20));
    let mut node = env.sim_node(sim);
    let offline = node.launch(&sleeper(OFFLINE, 0)).expect("offline");
    let script = Scripted {
        answers: VecDeque::from([Ok(vec![
            NodeAction::SetComputeShare(offline, 0),
            NodeAction::SetComputeShare(offline, 300),
            NodeAction::Freeze(offline + 1),
        ])]),
    };
    let settings = CoordinatorConfig {
        invalid_actions: InvalidActions::DropAction,
        ..CoordinatorConfig::default()
    };
    let mut coord = Coordinator::native(Box::new(script), None, settings).expect("load");
    let r = coord.step(&mut node);
    assert_eq!(r.served, Served::Policy);
    assert!(r.fault.is_none());
    assert_eq!(r.refused.len(), 2);
    assert_eq!(r.outcomes.len(), 1);
    assert_eq!(status(&mut node, offline).compute_share, 300);
    evict_all(&mut node);
}

#[test]
fn policies_that_are_not_coordinators_are_refused_at_load() {
    common::init_tracing();
    let engine = PolicyEngine::new(patient().runtime_config()).expect("engine");
    let fifo = arbiter_policies::get("fifo").expect("fifo");
    match Coordinator::from_wasm(&engine, fifo, None, CoordinatorConfig::default()) {
        Err(CoordinatorError::NotACoordinator { name, roles }) => {
            assert_eq!(name, "fifo");
            assert_eq!(roles, ["scheduler"]);
        }
        other => panic!("expected NotACoordinator, got {other:?}"),
    }
    assert!(matches!(
        Coordinator::builtin("no-such-policy", None, CoordinatorConfig::default()),
        Err(CoordinatorError::NoSuchBuiltin(_))
    ));
    // A configuration the policy rejects is a load error, not a silent default.
    match Coordinator::builtin("sysmonitor", Some("unhealthy_share_cap = 0"), patient()) {
        Err(CoordinatorError::Load { fault, .. }) => assert_eq!(fault.kind(), "reported"),
        other => panic!("expected a load error, got {other:?}"),
    }
    let mut c = Coordinator::fallback_only(CoordinatorConfig::default());
    assert!(c.on_fallback());
    assert!(matches!(
        c.retry_policy(),
        Err(CoordinatorError::NothingToRetry)
    ));
}
