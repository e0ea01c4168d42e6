//! The local coordinator against a GPU that behaves like the node's: a workload uses what it
//! wants up to its limit, an allocation past the limit is refused (counted in
//! `quota-denials`) and served from host memory, and a limit below a workload's use makes it
//! release down to the limit (the rest spills to the host).

use super::*;
use crate::coordinator::UNLIMITED_MIB;
use arbiter_policy_sdk::model::qos;
use std::collections::BTreeMap;

const PERIOD_MS: u64 = 100;

struct Gpu {
    p: AntMan,
    now: u64,
    total: u32,
    workloads: Vec<WorkloadStatus>,
    /// Memory each workload wants, MiB.
    demand: BTreeMap<u32, u32>,
    /// Every action taken, with the time it was taken.
    log: Vec<(u64, NodeAction)>,
}

fn workload(id: u32, qos: u8, used: u32, limit: u32) -> WorkloadStatus {
    WorkloadStatus {
        id,
        gpu: 0,
        role: u8::from(qos != qos::GUARANTEED),
        qos,
        memory_used_mib: used,
        memory_limit_mib: limit,
        compute_share: 1000,
        request_permille: 1000,
        ..WorkloadStatus::default()
    }
}

impl Gpu {
    fn new(config: &str, total: u32) -> Gpu {
        Gpu {
            p: antman(config),
            now: 10_000,
            total,
            workloads: Vec::new(),
            demand: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    fn add(&mut self, w: WorkloadStatus, demand: u32) {
        self.demand.insert(w.id, demand);
        self.workloads.push(w);
    }

    fn w(&self, id: u32) -> &WorkloadStatus {
        self.workloads
            .iter()
            .find(|w| w.id == id)
            .unwrap_or_else(|| panic!("no workload {id}"))
    }

    fn w_mut(&mut self, id: u32) -> &mut WorkloadStatus {
        self.workloads
            .iter_mut()
            .find(|w| w.id == id)
            .unwrap_or_else(|| panic!("no workload {id}"))
    }

    fn set_iteration(&mut self, id: u32, ms: u32) {
        self.w_mut(id).iteration_ms = ms;
        self.w_mut(id).launches += 100;
    }

    /// One control period: the workloads run under the limits in force, then the policy acts.
    fn period(&mut self) -> Vec<NodeAction> {
        for w in &mut self.workloads {
            let want = self.demand.get(&w.id).copied().unwrap_or(w.memory_used_mib);
            if want > w.memory_limit_mib {
                w.quota_denials += 1;
            }
            w.memory_used_mib = want.min(w.memory_limit_mib);
        }
        let view = NodeView {
            now_ms: 1_700_000_000_000 + self.now,
            monotonic_ms: self.now,
            gpus: vec![GpuStatus {
                index: 0,
                memory_total_mib: self.total,
                health: 1,
                observed_ok: true,
                ..GpuStatus::default()
            }],
            workloads: self.workloads.clone(),
            ..NodeView::default()
        };
        let actions = self.p.tick(&view).expect("tick");
        for a in &actions {
            self.log.push((self.now, *a));
            match *a {
                NodeAction::SetMemoryLimit(id, mib) => {
                    let total = self.total;
                    self.w_mut(id).memory_limit_mib =
                        if mib == UNLIMITED_MIB { total } else { mib };
                }
                NodeAction::SetComputeShare(id, share) => {
                    assert!((1..=1000).contains(&share), "{a:?}");
                    self.w_mut(id).compute_share = share;
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
        self.now += PERIOD_MS;
        actions
    }

    fn run_for(&mut self, ms: u64, mut before: impl FnMut(&mut Gpu)) {
        let end = self.now + ms;
        while self.now < end {
            before(self);
            self.period();
        }
    }
}

#[test]
fn table_2_job_a_is_squeezed_to_the_2_gb_job_b_leaves_and_spills_1_5_gb() {
    // One 32 GB GPU. Job-A (GCN): opportunistic, 3.5 GB, no quota, runs first.
    let mut gpu = Gpu::new("", 32_768);
    gpu.add(workload(1, qos::OPPORTUNISTIC, 0, 3_584), 3_584);
    let first = gpu.period();
    // Alone, it runs without constraints.
    assert_eq!(first, vec![NodeAction::SetMemoryLimit(1, UNLIMITED_MIB)]);
    gpu.run_for(1_000, |_| {});
    assert_eq!(gpu.w(1).memory_used_mib, 3_584);

    // Job-B (ResNet-50): guaranteed, arrives 26 minutes later, initialising (1 GB so far).
    gpu.now += 26 * 60 * 1000;
    gpu.add(workload(2, qos::GUARANTEED, 0, 32_768), 1_024);
    let arrival = gpu.period();
    // A10: A is held where it is (memory no higher than its use) and its SM cut to the floor.
    assert!(
        arrival.contains(&NodeAction::SetComputeShare(1, 50)),
        "{arrival:?}"
    );
    assert!(
        arrival.contains(&NodeAction::SetMemoryLimit(1, 3_584)),
        "{arrival:?}"
    );
    assert!(
        arrival.contains(&NodeAction::SetMemoryLimit(2, 32_768 - 3_584)),
        "{arrival:?}"
    );

    // B grows to its 30 GB; its refused allocations make the coordinator shrink A (A12).
    gpu.demand.insert(2, 30_720);
    gpu.run_for(60_000, |g| g.set_iteration(2, 300));
    assert_eq!(gpu.w(2).memory_used_mib, 30_720);
    assert!(gpu.w(2).memory_limit_mib >= 30_720);
    // A gets what is left over: 32 − 30 = 2 GB on the GPU, the other 1.5 GB on the host.
    assert_eq!(gpu.w(1).memory_limit_mib, 2_048);
    assert_eq!(gpu.w(1).memory_used_mib, 2_048);
    assert_eq!(3_584 - gpu.w(1).memory_used_mib, 1_536);
    assert!(gpu.w(1).memory_limit_mib + gpu.w(2).memory_limit_mib <= 32_768);
    // B's limit never went below what it used.
    for (_, a) in &gpu.log {
        if let NodeAction::SetMemoryLimit(2, mib) = *a {
            assert!(mib >= 1_024, "{a:?}");
        }
    }
    // Steady: no more memory actions.
    let later = gpu.period();
    assert!(
        !later
            .iter()
            .any(|a| matches!(a, NodeAction::SetMemoryLimit(..))),
        "{later:?}"
    );

    // A finishes: B alone has no limit of ours.
    gpu.workloads.retain(|w| w.id != 1);
    assert_eq!(
        gpu.period(),
        vec![NodeAction::SetMemoryLimit(2, UNLIMITED_MIB)]
    );
}

/// The guaranteed job's mini-batch time: 100 ms while the opportunistic share is at most
/// `knee`, 130 ms above it.
fn guaranteed_speed(g: &mut Gpu, knee: u32) {
    let share = g.w(2).compute_share;
    g.set_iteration(1, if share <= knee { 100 } else { 130 });
}

/// The distinct shares the opportunistic workload went through, in order.
fn share_steps(gpu: &Gpu, id: u32) -> Vec<u32> {
    let mut steps: Vec<u32> = Vec::new();
    for (_, a) in &gpu.log {
        if let NodeAction::SetComputeShare(w, s) = *a
            && w == id
            && steps.last() != Some(&s)
        {
            steps.push(s);
        }
    }
    steps
}

fn shared_gpu(config: &str) -> Gpu {
    let mut gpu = Gpu::new(config, 32_768);
    gpu.add(workload(1, qos::GUARANTEED, 10_000, 32_768), 10_000);
    gpu.add(workload(2, qos::OPPORTUNISTIC, 4_000, 4_000), 4_000);
    gpu
}

#[test]
fn sm_share_steps_up_while_the_mini_batch_time_holds_and_drops_to_the_floor_when_it_rises() {
    let mut gpu = shared_gpu("[coordinator]\nstep_interval_ms = 1000");
    gpu.run_for(8_000, |g| guaranteed_speed(g, 400));
    // Floor, then one step per second while 100 ms holds; 450 slows it: back to the floor
    // at once (pessimistic), then up again, no higher than the last share that held.
    assert_eq!(
        share_steps(&gpu, 2),
        vec![50, 150, 250, 350, 450, 50, 150, 250, 350]
    );
    let raised_to_450 = gpu
        .log
        .iter()
        .find(|(_, a)| *a == NodeAction::SetComputeShare(2, 450))
        .map(|(t, _)| *t)
        .expect("raised to 450");
    let throttled = gpu
        .log
        .iter()
        .find(|(t, a)| *t > raised_to_450 && *a == NodeAction::SetComputeShare(2, 50))
        .map(|(t, _)| *t)
        .expect("throttled");
    assert_eq!(
        throttled - raised_to_450,
        PERIOD_MS,
        "throttled in the first slow period"
    );
    // The ceiling holds while the guaranteed job is fine at 350.
    gpu.run_for(30_000, |g| guaranteed_speed(g, 400));
    assert_eq!(gpu.w(2).compute_share, 350);
    // Once the ceiling lapses it probes again, and throttles again.
    gpu.run_for(40_000, |g| guaranteed_speed(g, 400));
    let steps = share_steps(&gpu, 2);
    assert_eq!(&steps[9..], &[450, 50, 150, 250, 350]);
}

#[test]
fn without_slowdown_the_share_climbs_to_its_maximum_and_halving_is_configurable() {
    // Beside a guaranteed job the raise stops a step below the full GPU, where pacing
    // still holds the opportunistic job (opportunistic_max_permille)...
    let mut gpu = shared_gpu("[coordinator]\nstep_interval_ms = 1000");
    gpu.run_for(15_000, |g| guaranteed_speed(g, 1000));
    assert_eq!(gpu.w(2).compute_share, 900);
    // ... which an operator may lift to the workload's limit.
    let mut gpu =
        shared_gpu("[coordinator]\nstep_interval_ms = 1000\nopportunistic_max_permille = 1000");
    gpu.run_for(15_000, |g| guaranteed_speed(g, 1000));
    assert_eq!(gpu.w(2).compute_share, 1000);

    let mut gpu = shared_gpu("[coordinator]\nstep_interval_ms = 1000\nthrottle = \"halve\"");
    gpu.run_for(8_000, |g| guaranteed_speed(g, 400));
    assert_eq!(&share_steps(&gpu, 2)[..6], &[50, 150, 250, 350, 450, 225]);
}

#[test]
fn without_any_performance_signal_the_opportunistic_share_stays_at_the_floor() {
    let mut gpu = shared_gpu("[coordinator]\nstep_interval_ms = 1000");
    // No iteration time, no launches.
    gpu.run_for(60_000, |_| {});
    assert_eq!(share_steps(&gpu, 2), vec![50]);
    // Memory settles anyway: the opportunistic workload gets the rest of the GPU.
    assert!(gpu.p.coordinator().settled(0));
    assert_eq!(gpu.w(2).memory_limit_mib, 32_768 - 10_000);
}

#[test]
fn a_launch_rate_stands_in_for_a_missing_mini_batch_time() {
    let mut gpu = shared_gpu("[coordinator]\nstep_interval_ms = 1000");
    // 100 launches per period while the share is at most 400, 70 above.
    gpu.run_for(8_000, |g| {
        let share = g.w(2).compute_share;
        g.w_mut(1).launches += if share <= 400 { 100 } else { 70 };
    });
    assert_eq!(
        share_steps(&gpu, 2),
        vec![50, 150, 250, 350, 450, 50, 150, 250, 350]
    );
}

/// Two opportunistic workloads alone on a 16 GB GPU with 8 GB each; X (id 1) wants 12 GB.
fn two_opportunistic(y_demand: u32) -> Gpu {
    let mut gpu = Gpu::new("", 16_384);
    gpu.add(workload(1, qos::OPPORTUNISTIC, 8_192, 8_192), 12_000);
    gpu.add(
        workload(2, qos::OPPORTUNISTIC, y_demand.min(8_192), 8_192),
        y_demand,
    );
    gpu
}

#[test]
fn memory_by_trial_keeps_a_trade_that_pays_and_undoes_one_that_does_not() {
    // X runs at 200 ms with 8 GB and 150 ms with more; Y (using 6 GB) keeps its speed down
    // to 7 GB and slows by 30 % below it (Fig. 10: workloads differ in sensitivity).
    let mut gpu = two_opportunistic(6_000);
    let speeds = |g: &mut Gpu| {
        let x = if g.w(1).memory_limit_mib > 8_192 {
            150
        } else {
            200
        };
        let y = if g.w(2).memory_limit_mib >= 7_168 {
            100
        } else {
            130
        };
        g.set_iteration(1, x);
        g.set_iteration(2, y);
    };
    gpu.run_for(5_000, speeds);
    // First trade on trial: a step from Y to X.
    assert_eq!(
        (gpu.w(1).memory_limit_mib, gpu.w(2).memory_limit_mib),
        (9_216, 7_168)
    );
    // After the trial period it paid (X +33 %, Y unchanged): kept. X still wants more: the
    // next step costs Y 30 % for nothing — undone, and the pair rests.
    gpu.run_for(25_000, speeds);
    assert_eq!(
        (gpu.w(1).memory_limit_mib, gpu.w(2).memory_limit_mib),
        (9_216, 7_168)
    );
    let trades = gpu
        .log
        .iter()
        .filter(|(_, a)| matches!(a, NodeAction::SetMemoryLimit(2, _)))
        .count();
    assert_eq!(trades, 3, "7 GB, 6 GB, back to 7 GB: {:?}", gpu.log);
    gpu.run_for(20_000, speeds);
    assert_eq!(
        (gpu.w(1).memory_limit_mib, gpu.w(2).memory_limit_mib),
        (9_216, 7_168),
        "the pair is not tried again during the cooldown"
    );
}

#[test]
fn a_refused_opportunistic_workload_grows_into_free_memory_without_a_trial() {
    let mut gpu = Gpu::new("", 16_384);
    gpu.add(workload(1, qos::OPPORTUNISTIC, 4_096, 4_096), 6_000);
    gpu.add(workload(2, qos::OPPORTUNISTIC, 4_096, 4_096), 4_096);
    gpu.run_for(1_000, |_| {});
    assert_eq!(gpu.w(1).memory_limit_mib, 6_144);
    assert_eq!(gpu.w(1).memory_used_mib, 6_000);
    assert_eq!(gpu.w(2).memory_limit_mib, 4_096);
    // Both run at their full share: no guaranteed work to protect.
    assert_eq!(
        (gpu.w(1).compute_share, gpu.w(2).compute_share),
        (1000, 1000)
    );
}

/// A guaranteed job that arrives short of memory runs slowly until the opportunistic work
/// has made room (it spills, its allocations are refused): those periods are not its
/// baseline. Had they been, a later real slowdown (130 ms against a 100 ms job) would pass
/// as "holding" and the opportunistic share would climb past the knee.
#[test]
fn the_baseline_is_measured_once_the_guaranteed_job_has_its_memory() {
    let mut gpu = Gpu::new("[coordinator]\nstep_interval_ms = 1000", 32_768);
    gpu.add(workload(2, qos::OPPORTUNISTIC, 3_584, 32_768), 3_584);
    gpu.run_for(1_000, |_| {});
    gpu.add(workload(1, qos::GUARANTEED, 0, 29_184), 30_720);
    gpu.run_for(10_000, |g| {
        let short = g.w(1).memory_used_mib < 30_720;
        if short {
            // Spilling: several times slower.
            g.set_iteration(1, 500);
        } else {
            guaranteed_speed(g, 400);
        }
    });
    let steps = share_steps(&gpu, 2);
    assert!(
        steps.iter().all(|&s| s <= 450),
        "the share never stays above the knee: {steps:?}"
    );
    assert!(
        steps.windows(2).any(|w| w == [450, 50]),
        "the first step past the knee is throttled: {steps:?}"
    );
}
