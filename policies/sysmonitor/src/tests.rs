//! The policy end to end, natively: views in, actions out.

use super::*;
use arbiter_policy_sdk::Runtime;

const TOTAL_MIB: u32 = 16_384;

fn gpu(index: u32, util: u8, sm: u8, clock: u32, used_mib: u32) -> GpuStatus {
    GpuStatus {
        index,
        utilization_pct: util,
        sm_activity_pct: sm,
        sm_clock_mhz: clock,
        max_sm_clock_mhz: 2000,
        memory_used_mib: used_mib,
        memory_total_mib: TOTAL_MIB,
        health: health::HEALTHY,
        observed_ok: true,
        ..GpuStatus::default()
    }
}

fn idle(index: u32) -> GpuStatus {
    gpu(index, 10, 10, 2000, 1024)
}

fn workload(id: u32, gpu: u32, role: u8) -> WorkloadStatus {
    WorkloadStatus {
        id,
        gpu,
        role,
        memory_used_mib: 512,
        memory_limit_mib: TOTAL_MIB,
        compute_share: 1000,
        launches: 0,
        pacing_delay_us: 0,
        iteration_ms: 0,
        frozen: false,
        ..WorkloadStatus::default()
    }
}

/// A node: GPUs and workloads whose statuses the test evolves, fed back the policy's
/// actions the way the node applies them.
struct Sim {
    rt: Runtime<SysMonitor>,
    now_ms: u64,
    gpus: Vec<GpuStatus>,
    workloads: Vec<WorkloadStatus>,
}

impl Sim {
    fn new(config: &str) -> Sim {
        let mut rt = Runtime::<SysMonitor>::new();
        rt.configure(config).expect("config");
        Sim {
            rt,
            now_ms: 1_000_000,
            gpus: vec![idle(0)],
            workloads: vec![workload(1, 0, ROLE_ONLINE), workload(2, 0, ROLE_OFFLINE)],
        }
    }

    fn view(&self) -> NodeView {
        NodeView {
            now_ms: self.now_ms,
            gpus: self.gpus.clone(),
            workloads: self.workloads.clone(),
            ..NodeView::default()
        }
    }

    /// One period: tick, then apply the actions like the node would.
    fn tick(&mut self) -> Vec<NodeAction> {
        let actions = self.rt.tick(self.view()).expect("tick");
        for a in &actions {
            match *a {
                NodeAction::SetHealth(g, h) => {
                    if let Some(g) = self.gpus.iter_mut().find(|x| x.index == g) {
                        g.health = h;
                    }
                }
                NodeAction::SetComputeShare(w, s) => self.w(w).compute_share = s,
                NodeAction::SetMemoryLimit(w, m) => self.w(w).memory_limit_mib = m,
                NodeAction::Freeze(w) => self.w(w).frozen = true,
                NodeAction::Resume(w) => self.w(w).frozen = false,
                NodeAction::Evict(_)
                | NodeAction::SetMpsThreadPct(..)
                | NodeAction::RestartMps(_) => {}
            }
        }
        self.now_ms += 100;
        actions
    }

    /// A new reading of GPU 0; the health the node reports stays what the policy published.
    fn set(&mut self, g: GpuStatus) {
        let h = self.gpus[0].health;
        self.gpus[0] = GpuStatus { health: h, ..g };
    }

    fn w(&mut self, id: u32) -> &mut WorkloadStatus {
        self.workloads
            .iter_mut()
            .find(|w| w.id == id)
            .expect("workload")
    }

    fn ticks(&mut self, n: usize) -> Vec<NodeAction> {
        (0..n).flat_map(|_| self.tick()).collect()
    }
}

fn touching(actions: &[NodeAction], id: u32) -> Vec<NodeAction> {
    actions
        .iter()
        .copied()
        .filter(|a| match *a {
            NodeAction::SetMemoryLimit(w, _)
            | NodeAction::SetComputeShare(w, _)
            | NodeAction::SetMpsThreadPct(w, _)
            | NodeAction::Freeze(w)
            | NodeAction::Resume(w)
            | NodeAction::Evict(w) => w == id,
            NodeAction::SetHealth(..) | NodeAction::RestartMps(_) => false,
        })
        .collect()
}

fn health_of(actions: &[NodeAction], gpu: u32) -> Option<u8> {
    actions.iter().rev().find_map(|a| match *a {
        NodeAction::SetHealth(g, h) if g == gpu => Some(h),
        _ => None,
    })
}

#[test]
fn manifest_declares_the_coordinator_role_and_a_valid_default() {
    let m = SysMonitor::manifest();
    assert_eq!(m.name, "sysmonitor");
    assert_eq!(m.roles, ["coordinator"]);
    assert_eq!(Config::parse(&m.default_config), Ok(Config::default()));
}

#[test]
fn bad_configuration_is_rejected_and_keeps_the_old_one() {
    let mut p = SysMonitor::create();
    p.configure("unhealthy_share_cap = 300").expect("valid");
    for bad in [
        "unhealthy_share_cap = 0",
        "[thresholds]\nsm_activity_pct = [90, 10, 20]",
        "typo = 1",
        "[pacing]\nmin_share = 0",
    ] {
        match p.configure(bad) {
            Err(PolicyError::Failed(msg)) => assert!(!msg.is_empty()),
            other => panic!("{bad:?}: {other:?}"),
        }
        assert_eq!(p.config().unhealthy_share_cap, 300, "unchanged by {bad:?}");
    }
}

#[test]
fn first_tick_publishes_health_and_sets_the_offline_memory_quota_only() {
    let mut sim = Sim::new("");
    let a = sim.tick();
    assert_eq!(health_of(&a, 0), Some(health::HEALTHY));
    // 40 % of 16 GiB for the offline workload; nothing for the online one.
    assert_eq!(touching(&a, 2), [NodeAction::SetMemoryLimit(2, 6553)]);
    assert!(touching(&a, 1).is_empty());
    // A quiet GPU: no further actions at all (health already published, share at max).
    let later = sim.ticks(20);
    assert!(later.is_empty(), "{later:?}");
}

#[test]
fn online_burst_lowers_the_offline_share_in_the_first_period_and_never_touches_online() {
    let mut sim = Sim::new("");
    sim.ticks(5);
    // Burst: SM activity 75 % with the clock at 85 % of max (both in the hysteresis band:
    // still Healthy), a GPU load of 0.75 x 1.22 = 0.92 against the 0.7 set point.
    sim.set(gpu(0, 75, 75, 1700, 2048));
    let a = sim.tick();
    let share = match touching(&a, 2).as_slice() {
        [NodeAction::SetComputeShare(2, s)] => *s,
        other => panic!("expected one share cut, got {other:?}"),
    };
    assert!(share < 1000);
    assert!(touching(&a, 1).is_empty(), "online untouched: {a:?}");
    // Sustained: the share keeps falling to the floor.
    let more = sim.ticks(60);
    assert!(touching(&more, 1).is_empty());
    assert_eq!(
        sim.workloads[1].compute_share,
        Config::default().pacing.min_share
    );
    // The burst ends: the share climbs back to unthrottled.
    sim.set(idle(0));
    sim.ticks(60);
    assert_eq!(sim.workloads[1].compute_share, 1000);
}

#[test]
fn unhealthy_caps_the_share_and_recovers_only_below_the_healthy_thresholds() {
    let mut sim = Sim::new("");
    sim.ticks(2);
    // Memory at 91 %: Unhealthy (SM activity is low, so the controller alone would not cut).
    sim.set(gpu(0, 10, 10, 2000, TOTAL_MIB * 91 / 100));
    let a = sim.tick();
    assert_eq!(health_of(&a, 0), Some(health::UNHEALTHY));
    assert_eq!(touching(&a, 2), [NodeAction::SetComputeShare(2, 200)]);
    // 85 %: in the band, still Unhealthy, still capped.
    sim.set(gpu(0, 10, 10, 2000, TOTAL_MIB * 85 / 100));
    assert!(sim.ticks(5).is_empty());
    // 50 %: Healthy, the cap is lifted.
    sim.set(gpu(0, 10, 10, 2000, TOTAL_MIB / 2));
    let a = sim.tick();
    assert_eq!(health_of(&a, 0), Some(health::HEALTHY));
    assert!(matches!(touching(&a, 2).as_slice(), [NodeAction::SetComputeShare(2, s)] if *s > 200));
}

#[test]
fn unhealthy_with_freeze_freezes_offline_then_resumes_it() {
    let mut sim = Sim::new("unhealthy_action = \"freeze\"");
    sim.ticks(2);
    sim.set(gpu(0, 10, 85, 2000, 1024));
    let a = sim.tick();
    assert!(touching(&a, 2).contains(&NodeAction::Freeze(2)), "{a:?}");
    assert!(touching(&a, 1).is_empty());
    assert!(
        touching(&sim.ticks(3), 2)
            .iter()
            .all(|x| !matches!(x, NodeAction::Freeze(_))),
        "frozen once"
    );
    sim.set(idle(0));
    let a = sim.tick();
    assert!(touching(&a, 2).contains(&NodeAction::Resume(2)), "{a:?}");
    // A workload someone else froze is not ours to resume.
    sim.w(2).frozen = true;
    assert!(!sim.ticks(3).contains(&NodeAction::Resume(2)));
}

#[test]
fn overlimit_evicts_offline_once_and_leaves_online_alone() {
    let mut sim = Sim::new("");
    sim.workloads.push(workload(3, 0, ROLE_OFFLINE));
    sim.ticks(2);
    // The online workload's memory bursts past 95 %.
    sim.set(gpu(0, 60, 50, 1900, TOTAL_MIB * 97 / 100));
    let a = sim.tick();
    assert_eq!(health_of(&a, 0), Some(health::OVERLIMIT));
    assert_eq!(touching(&a, 2), [NodeAction::Evict(2)]);
    assert_eq!(touching(&a, 3), [NodeAction::Evict(3)]);
    assert!(touching(&a, 1).is_empty());
    // Evicting takes a while: asked once, not every period.
    assert!(sim.ticks(5).is_empty());
    // Gone from the view, then a new offline workload arrives while still in Overlimit: evicted.
    sim.workloads.retain(|w| w.role == ROLE_ONLINE);
    sim.tick();
    sim.workloads.push(workload(4, 0, ROLE_OFFLINE));
    assert_eq!(touching(&sim.tick(), 4), [NodeAction::Evict(4)]);
}

#[test]
fn repeated_overlimits_back_off_exponentially_then_disable() {
    let mut sim = Sim::new("disable_after_overlimits = 3\ndisabled_for_ms = 0");
    sim.workloads.retain(|w| w.role == ROLE_ONLINE);
    sim.ticks(2);
    let hot = gpu(0, 99, 99, 1000, 1024);
    let mut calm_periods = Vec::new();
    for _ in 0..2 {
        sim.set(hot);
        assert_eq!(health_of(&sim.tick(), 0), Some(health::OVERLIMIT));
        sim.set(idle(0));
        let mut n = 0;
        loop {
            n += 1;
            if health_of(&sim.tick(), 0) == Some(health::UNHEALTHY) {
                break;
            }
            assert!(n < 1000, "never left Overlimit");
        }
        calm_periods.push(n);
        assert_eq!(health_of(&sim.tick(), 0), Some(health::HEALTHY));
    }
    // 2 s then 4 s of calm at 100 ms periods (the first calm period starts the clock).
    assert_eq!(calm_periods, [21, 41]);
    sim.set(hot);
    assert_eq!(health_of(&sim.tick(), 0), Some(health::DISABLED));
    // Disabled holds no matter what, and an offline workload there is evicted.
    sim.set(idle(0));
    sim.workloads.push(workload(9, 0, ROLE_OFFLINE));
    let a = sim.ticks(50);
    assert_eq!(touching(&a, 9), [NodeAction::Evict(9)]);
    assert_eq!(health_of(&a, 0), None, "stays Disabled, published once");
}

#[test]
fn no_actions_for_unknown_roles_or_gpus_outside_the_view() {
    let mut sim = Sim::new("");
    sim.workloads = vec![
        workload(1, 0, ROLE_ONLINE),
        workload(5, 0, 7),            // unknown role
        workload(6, 3, ROLE_OFFLINE), // GPU 3 is not in the view
    ];
    sim.ticks(1);
    sim.set(gpu(0, 99, 99, 1000, TOTAL_MIB - 1));
    let a = sim.ticks(10);
    for id in [1, 5, 6] {
        assert!(touching(&a, id).is_empty(), "workload {id}: {a:?}");
    }
    assert!(a.iter().all(|x| matches!(x, NodeAction::SetHealth(0, _))));
}

#[test]
fn health_is_republished_when_the_node_forgets_it_but_not_over_its_own_unhealthy() {
    let mut sim = Sim::new("");
    sim.ticks(1);
    sim.set(gpu(0, 10, 10, 2000, TOTAL_MIB * 92 / 100));
    assert_eq!(health_of(&sim.tick(), 0), Some(health::UNHEALTHY));
    // A node restart: the GPU reads Healthy again although the policy says Unhealthy.
    sim.gpus[0].health = health::HEALTHY;
    assert_eq!(health_of(&sim.tick(), 0), Some(health::UNHEALTHY));
    // The node overriding a Healthy state with Unhealthy (MPS daemon down) is not fought.
    sim.set(idle(0));
    assert_eq!(health_of(&sim.tick(), 0), Some(health::HEALTHY));
    sim.gpus[0].health = health::UNHEALTHY;
    assert_eq!(health_of(&sim.ticks(5), 0), None);
}

#[test]
fn a_restarted_policy_keeps_a_gpu_the_node_reports_disabled() {
    let mut sim = Sim::new("");
    sim.gpus[0].health = health::DISABLED;
    let a = sim.tick();
    assert_eq!(touching(&a, 2), [NodeAction::Evict(2)]);
    assert_eq!(health_of(&a, 0), Some(health::DISABLED));
}

#[test]
fn a_failed_sample_is_unhealthy_and_holds_the_share() {
    let mut sim = Sim::new("");
    sim.ticks(2);
    sim.gpus[0] = GpuStatus {
        index: 0,
        memory_total_mib: TOTAL_MIB,
        health: health::UNHEALTHY,
        ..GpuStatus::default()
    };
    let a = sim.tick();
    assert_eq!(health_of(&a, 0), Some(health::UNHEALTHY));
    assert_eq!(touching(&a, 2), [NodeAction::SetComputeShare(2, 200)]);
}

#[test]
fn same_views_give_the_same_actions() {
    let run = || {
        let mut sim = Sim::new("");
        let mut all = Vec::new();
        for i in 0..200u32 {
            let sm = ((i * 37) % 100) as u8;
            let clock = 1200 + (i * 53) % 800;
            sim.set(gpu(0, sm, sm, clock, 1024 + (i * 97) % 15_000));
            all.extend(sim.tick());
        }
        all
    };
    assert_eq!(run(), run());
}

fn restarts(actions: &[NodeAction]) -> Vec<u32> {
    actions
        .iter()
        .filter_map(|a| match *a {
            NodeAction::RestartMps(g) => Some(g),
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_xid_error_evicts_offline_work_and_restarts_mps_once_per_interval() {
    let mut sim = Sim::new("[errors]\nrestart_mps_every_ms = 1000");
    sim.gpus[0].xid_errors = 4; // errors from before the policy started are history
    let a = sim.ticks(3);
    assert!(
        restarts(&a).is_empty()
            && touching(&a, 2)
                .iter()
                .all(|x| !matches!(x, NodeAction::Evict(_)))
    );
    sim.gpus[0].xid_errors = 5; // XID 31 in a client
    let a = sim.tick();
    assert_eq!(restarts(&a), [0]);
    assert_eq!(touching(&a, 2), [NodeAction::Evict(2)]);
    assert_eq!(health_of(&a, 0), Some(health::OVERLIMIT));
    assert!(touching(&a, 1).is_empty(), "online work is never touched");
    // Another error 300 ms later: an Overlimit reading again, but no second restart yet.
    sim.ticks(2);
    sim.gpus[0].xid_errors = 6;
    assert!(restarts(&sim.tick()).is_empty());
    sim.now_ms += 1_000;
    sim.gpus[0].xid_errors = 7;
    assert_eq!(restarts(&sim.tick()), [0]);
}

#[test]
fn an_mps_fault_the_node_reports_is_an_error_pattern_but_a_failed_sample_is_not() {
    let mut sim = Sim::new("");
    sim.ticks(2);
    // The node reads the GPU but its MPS server faulted: not observed OK, health Unhealthy.
    sim.gpus[0].observed_ok = false;
    sim.gpus[0].health = health::UNHEALTHY;
    let a = sim.tick();
    assert_eq!(restarts(&a), [0]);
    assert_eq!(touching(&a, 2), [NodeAction::Evict(2)]);
    // Restarts are opt-out.
    let mut sim = Sim::new("[errors]\nrestart_mps = false");
    sim.ticks(2);
    sim.gpus[0].observed_ok = false;
    let a = sim.tick();
    assert!(restarts(&a).is_empty());
    assert_eq!(touching(&a, 2), [NodeAction::Evict(2)]);
}

#[test]
fn host_pressure_evicts_offline_work_one_at_a_time_biggest_first() {
    let mut sim = Sim::new("");
    sim.workloads.push(WorkloadStatus {
        memory_used_mib: 4096,
        ..workload(3, 0, ROLE_OFFLINE)
    });
    let view_at = |sim: &Sim, used: u32, swap: u32| NodeView {
        host_memory_used_mib: used,
        host_memory_total_mib: 100_000,
        swap_in_per_s: swap,
        ..sim.view()
    };
    let evictions = |a: &[NodeAction]| -> Vec<u32> {
        a.iter()
            .filter_map(|x| match *x {
                NodeAction::Evict(w) => Some(w),
                _ => None,
            })
            .collect()
    };
    let tick = |sim: &mut Sim, used: u32, swap: u32| {
        let v = view_at(sim, used, swap);
        sim.now_ms += 1_000;
        sim.rt.tick(v).expect("tick")
    };
    assert!(
        evictions(&tick(&mut sim, 90_000, 0)).is_empty(),
        "below 95 %"
    );
    assert_eq!(
        evictions(&tick(&mut sim, 96_000, 0)),
        [3],
        "most GPU memory first"
    );
    // Still under pressure, but workload 3 has not exited yet: nobody else goes.
    assert!(evictions(&tick(&mut sim, 96_000, 0)).is_empty());
    sim.workloads.retain(|w| w.id != 3);
    assert_eq!(evictions(&tick(&mut sim, 96_000, 0)), [2]);
    assert!(sim.workloads.iter().any(|w| w.id == 1), "online work stays");

    // kswapd: swap-ins must last `swap_for_ms` (10 s) before they count.
    let mut sim = Sim::new("");
    for _ in 0..10 {
        assert!(evictions(&tick(&mut sim, 50_000, 5_000)).is_empty());
    }
    assert_eq!(evictions(&tick(&mut sim, 50_000, 5_000)), [2]);
    // A pause resets the clock.
    let mut sim = Sim::new("");
    for i in 0..20 {
        let swap = if i % 5 == 4 { 0 } else { 5_000 };
        assert!(evictions(&tick(&mut sim, 50_000, swap)).is_empty());
    }
}
