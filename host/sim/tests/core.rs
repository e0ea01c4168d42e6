//! The simulator core with a model written here, as a paper's model would be:
//! co-location interference through the one integrator, and the GPU
//! telemetry a policy hears.

use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
use arbiter_policy_sdk::model::WorkerPlacement;
use arbiter_sim::core::{
    self, LoopRules, Progress, ProgressRules, RunPolicy, SimCtx, SimHost, WorkloadModel,
};
use std::time::Duration;

/// Half-GPU jobs arriving at given times on one one-GPU node; a GPU shared
/// by `n` jobs runs each at `1/n` (the model's ground truth).
struct Sharing {
    arrivals: Vec<u64>,
    next: usize,
}

impl WorkloadModel for Sharing {
    fn next_event(&self, _ctx: &SimCtx, _now: u64) -> Option<u64> {
        self.arrivals.get(self.next).copied()
    }

    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        let mut changed = false;
        while self.arrivals.get(self.next).is_some_and(|&t| t <= now) {
            let mut r = JobRequest::gpus(format!("j{}", self.next), "t", 1, 1);
            r.gpu_milli = 500;
            let id = ctx.host.state.submit(r)?;
            ctx.progress.submitted(self.next, id);
            self.next += 1;
            changed = true;
        }
        Ok(changed)
    }

    fn rate(&self, ctx: &SimCtx, _job: usize, placement: &[WorkerPlacement]) -> f64 {
        let cluster = ctx.host.state.cluster();
        let sharing = placement
            .iter()
            .flat_map(|w| &w.gpus)
            .map(|&g| {
                cluster
                    .running_jobs()
                    .filter(|j| j.placement().iter().any(|w| w.gpus.contains(&g)))
                    .count()
            })
            .max()
            .unwrap_or(1)
            .max(1);
        1.0 / sharing as f64
    }

    fn interference(&self) -> bool {
        true
    }
}

fn host() -> SimHost {
    let mut state = ClusterState::new();
    state
        .add_node(NodeRequest::gpus("n0", "default", "V100", 32_768, 1))
        .expect("node");
    let engine = arbiter_sim::engine(Duration::from_secs(10)).expect("engine");
    let compiled = engine
        .compile(arbiter_policies::get("best-fit").expect("built-in"))
        .expect("compile");
    SimHost::new(
        state,
        &RunPolicy {
            compiled,
            config: None,
        },
        None,
    )
    .expect("host")
}

#[test]
fn interference_slows_both_jobs_and_ends_when_the_work_is_done() {
    // A (1000 ms of work) alone from 0; B (1000 ms) joins at 500 on the
    // same GPU: both at 1/2, so A ends at 1500 and B, alone again, at 2000.
    let mut model = Sharing {
        arrivals: vec![0, 500],
        next: 0,
    };
    let progress = Progress::new([(1000.0, false), (1000.0, false)], ProgressRules::default());
    let mut ctx = SimCtx {
        host: host(),
        progress,
    };
    let end = core::run(&mut model, &mut ctx, &LoopRules::default()).expect("run");
    let t = ctx.progress.tracks();
    assert_eq!((t[0].first_start, t[0].end), (Some(0), Some(1500)));
    assert_eq!((t[1].first_start, t[1].end), (Some(500), Some(2000)));
    assert_eq!(end, 2000);
    assert!(ctx.progress.all_finished());
    assert_eq!(ctx.host.state.cluster().running_jobs().count(), 0);
}

#[test]
fn the_policy_hears_gpu_metrics_at_the_configured_period() {
    let mut model = Sharing {
        arrivals: vec![0, 500],
        next: 0,
    };
    let progress = Progress::new(
        [(1000.0, false), (f64::INFINITY, false)],
        ProgressRules::default(),
    );
    let mut ctx = SimCtx {
        host: host(),
        progress,
    };
    // The second job never ends: the run stops when nothing else is left
    // to happen (ticks alone never keep a run going).
    let rules = LoopRules {
        round_interval_ms: 0,
        horizon_ms: 10_000,
        gpu_metrics_period_ms: Some(250),
    };
    core::run(&mut model, &mut ctx, &rules).expect("run");
    // The last tick: one half-GPU job progressing on the GPU.
    let gpu = ctx.host.state.cluster().gpu(0);
    assert_eq!(gpu.utilization_pct(), 50);
    assert_eq!(gpu.sm_activity_pct(), 50);
    // The metrics reach the policy as events of the next round's delta.
    ctx.host.state.set_now(20_000);
    let report = ctx.host.round();
    assert!(report.faults.is_empty(), "{:?}", report.faults);
}

#[test]
fn without_a_period_no_metrics_are_sent() {
    let mut model = Sharing {
        arrivals: vec![0],
        next: 0,
    };
    let progress = Progress::new([(1000.0, false)], ProgressRules::default());
    let mut ctx = SimCtx {
        host: host(),
        progress,
    };
    core::run(&mut model, &mut ctx, &LoopRules::default()).expect("run");
    assert_eq!(ctx.host.state.cluster().gpu(0).utilization_pct(), 0);
}

#[test]
fn the_simulator_links_no_policy_and_no_cli_crate() {
    // The layering the crate docs promise: policies arrive compiled, with
    // their configuration text; comparisons and the command live elsewhere.
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("Cargo.toml");
    let manifest: toml::Table = toml::from_str(&manifest).expect("parse Cargo.toml");
    let deps = manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .expect("[dependencies]");
    let forbidden = |name: &str| {
        name == "clap"
            || name == "arbiter-policies"
            || name.ends_with("placement-core")
            || name.starts_with("aryl")
            || name.starts_with("policy-")
    };
    let bad: Vec<&String> = deps.keys().filter(|k| forbidden(k)).collect();
    assert!(bad.is_empty(), "arbiter-sim depends on {bad:?}");
}

/// A model that wants a round whenever asked until `until`, with nothing
/// else happening (an autoscaler's sync period).
struct AlwaysDue {
    until: u64,
}

impl WorkloadModel for AlwaysDue {
    fn next_event(&self, _ctx: &SimCtx, now: u64) -> Option<u64> {
        (now < self.until).then_some(self.until)
    }

    fn on_events(&mut self, _ctx: &mut SimCtx, _now: u64) -> anyhow::Result<bool> {
        Ok(false)
    }

    fn round_due(&self, ctx: &SimCtx, _changed: bool) -> bool {
        ctx.host.state.now_ms() < self.until
    }

    fn rate(&self, _ctx: &SimCtx, _job: usize, _placement: &[WorkerPlacement]) -> f64 {
        1.0
    }
}

#[test]
fn a_model_always_due_gets_one_round_per_grid_time() {
    // Rounds at 0, 100, …, 900; without the core's guard the loop would
    // run rounds at 0 forever.
    let mut model = AlwaysDue { until: 1000 };
    let mut ctx = SimCtx {
        host: host(),
        // One endless job, never submitted: the run is not over by itself.
        progress: Progress::new([(f64::INFINITY, false)], ProgressRules::default()),
    };
    let rules = LoopRules {
        round_interval_ms: 100,
        horizon_ms: 10_000,
        gpu_metrics_period_ms: None,
    };
    core::run(&mut model, &mut ctx, &rules).expect("run");
    assert_eq!(ctx.host.stats.rounds, 10);
}
