//! The simulator core: one clock, one event loop, one job-progress
//! integrator, one host, for every workload model.
//!
//! A [`WorkloadModel`] says what happens in its world — when jobs arrive,
//! how fast a job runs on its placement (its ground truth), what it records —
//! and [`run`] does the rest the same way for every model:
//!
//! 1. the next time is the earliest of the model's next event, the next
//!    job completion at today's rates, the next round on the grid when a
//!    round is due, and the next telemetry tick (ticks alone never keep a
//!    run going);
//! 2. the model observes the interval (time-weighted metrics); the clock
//!    moves (the integrator brings a job's work up to date lazily, when
//!    its rate, start or stop changes);
//! 3. finished jobs leave the host (in job order), then the model's events
//!    at that time run (arrivals, loans, reclaims);
//! 4. on a telemetry tick the host hears the GPUs' metrics
//!    ([`WorkloadModel::gpu_metrics`]) as the `gpu-metrics` event a node
//!    agent would send;
//! 5. when the model says a round is due and the time is on the grid (once
//!    per grid time, however often the model says so), the host runs a
//!    scheduling round through its [`RoundDriver`]; every change
//!    it applied — starts, preemptions, resizes, migrations, QoS changes —
//!    reaches the integrator and the model here, in [`apply`].
//!
//! [`RoundDriver`]: arbiter_host::roles::scheduler::RoundDriver

pub mod host;
pub mod progress;
pub mod recorder;
pub mod telemetry;

use anyhow::Context;
use arbiter_host::roles::scheduler::RoundReport;
use arbiter_host::state::{Applied, JobId};
use arbiter_policy_sdk::model::{GpuMetric, WorkerPlacement};
pub use host::{NativeFactory, RoundStats, RunPolicy, SimHost};
pub use progress::{JobTrack, Progress, ProgressRules, SpeedupLaw};
pub use recorder::{FragmentationMeter, MeterFactory};

/// Everything a model acts on: the host core and the jobs' progress.
pub struct SimCtx {
    pub host: SimHost,
    pub progress: Progress,
}

/// When rounds run and when the run ends.
#[derive(Clone, Copy, Debug)]
pub struct LoopRules {
    /// Rounds run on this grid (virtual ms); 0: at the event times.
    pub round_interval_ms: u64,
    /// The run stops when the next event is later than this.
    pub horizon_ms: u64,
    /// Emit `gpu-metrics` every this many ms (`None`: never).
    pub gpu_metrics_period_ms: Option<u64>,
}

impl Default for LoopRules {
    fn default() -> Self {
        LoopRules {
            round_interval_ms: 0,
            horizon_ms: u64::MAX,
            gpu_metrics_period_ms: None,
        }
    }
}

/// A paper's world: its arrivals, its ground truth, its measurements.
///
/// Jobs are known by the model's index (`job`), the one the [`Progress`]
/// tracks were made with.
pub trait WorkloadModel {
    /// Virtual time the run starts at.
    fn start_ms(&self) -> u64 {
        0
    }
    /// The next time at or after `now` the model has something to do.
    fn next_event(&self, ctx: &SimCtx, now: u64) -> Option<u64>;
    /// Runs the model's events due at `now`; whether the cluster changed.
    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool>;
    /// Whether a round should run, given whether anything changed since the last one.
    fn round_due(&self, _ctx: &SimCtx, changed: bool) -> bool {
        changed
    }
    /// Ground truth: work per ms of `job` running on `placement`.
    fn rate(&self, ctx: &SimCtx, job: usize, placement: &[WorkerPlacement]) -> f64;
    /// Ground truth for several jobs at once: each one's [`rate`](Self::rate), in order
    /// (the default). A model whose truth is worked out per GPU from everything on it
    /// (co-location) overrides this to work each GPU out once, not once per job.
    fn rates(&self, ctx: &SimCtx, jobs: &[(usize, &[WorkerPlacement])]) -> Vec<f64> {
        jobs.iter()
            .map(|&(job, placement)| self.rate(ctx, job, placement))
            .collect()
    }
    /// Whether one job's placement changes other jobs' rates (co-location
    /// interference): then every running job's rate is recomputed after a change.
    fn interference(&self) -> bool {
        false
    }
    fn on_started(&mut self, _ctx: &mut SimCtx, _job: usize, _now: u64) {}
    /// After the integrator took the preemption into account.
    fn on_preempted(&mut self, _ctx: &mut SimCtx, _job: usize) -> anyhow::Result<()> {
        Ok(())
    }
    fn on_finished(&mut self, _ctx: &mut SimCtx, _job: usize, _now: u64) {}
    /// After a round's changes reached the integrator.
    fn after_round(
        &mut self,
        _ctx: &mut SimCtx,
        _report: &RoundReport,
        _now: u64,
    ) -> anyhow::Result<()> {
        Ok(())
    }
    /// The cluster stays as it is over `from..to` (time-weighted metrics).
    fn observe(&mut self, _ctx: &SimCtx, _from: u64, _to: u64) {}
    /// End of one step of the loop (samples).
    fn after_step(&mut self, _ctx: &mut SimCtx, _now: u64) -> anyhow::Result<()> {
        Ok(())
    }
    /// Ground truth of the GPUs' metrics at `now` (default: by allocation,
    /// see [`telemetry::allocation_metrics`]).
    fn gpu_metrics(&self, ctx: &SimCtx, now: u64) -> Vec<GpuMetric> {
        telemetry::allocation_metrics(ctx, now)
    }
}

/// Runs `model` on `ctx` until nothing is left to happen or the horizon;
/// returns the last virtual time.
pub fn run<M: WorkloadModel>(
    model: &mut M,
    ctx: &mut SimCtx,
    rules: &LoopRules,
) -> anyhow::Result<u64> {
    let interval = rules.round_interval_ms;
    let period = rules.gpu_metrics_period_ms.filter(|&p| p > 0);
    let mut now = model.start_ms();
    let mut next_tick = period.map(|p| now.saturating_add(p));
    let mut changed = false;
    // On a grid, at most one round per grid time: a model that wants a
    // round on every tick must not get a second one at the same time.
    let mut last_round: Option<u64> = None;
    loop {
        let mut t_next = u64::MAX;
        if let Some(t) = model.next_event(ctx, now) {
            t_next = t_next.min(t);
        }
        if let Some(t) = ctx.progress.next_completion(now) {
            t_next = t_next.min(t);
        }
        if interval > 0 && model.round_due(ctx, changed) {
            let mut grid = now.div_ceil(interval).saturating_mul(interval);
            if last_round == Some(grid) {
                grid = grid.saturating_add(interval);
            }
            t_next = t_next.min(grid);
        }
        if t_next == u64::MAX || ctx.progress.all_finished() || t_next > rules.horizon_ms {
            break;
        }
        if let Some(tick) = next_tick {
            t_next = t_next.min(tick);
        }
        let t_next = t_next.max(now);
        model.observe(ctx, now, t_next);
        now = t_next;
        ctx.host.state.set_now(now);
        let mut finished = ctx.progress.take_finished(now);
        // In the cluster's order (the order its running jobs are listed in).
        finished.sort_by_key(|(job, id)| (id.and_then(|id| ctx.host.state.job_index(id)), *job));
        for (job, id) in finished {
            if let Some(id) = id {
                ctx.host
                    .state
                    .remove(id)
                    .with_context(|| format!("removing finished job #{job}"))?;
            }
            model.on_finished(ctx, job, now);
            changed = true;
        }
        if changed && model.interference() {
            // A job that left frees its co-located neighbours.
            apply(model, ctx, &Applied::default(), now)?;
        }
        if model.on_events(ctx, now)? {
            changed = true;
        }
        if let (Some(tick), Some(p)) = (next_tick, period)
            && now >= tick
        {
            let metrics = model.gpu_metrics(ctx, now);
            ctx.host
                .state
                .record_gpu_metrics(metrics)
                .context("recording GPU metrics")?;
            next_tick = Some(now.saturating_add(p));
        }
        let on_grid = interval == 0 || (now.is_multiple_of(interval) && last_round != Some(now));
        if model.round_due(ctx, changed) && on_grid {
            if interval > 0 {
                last_round = Some(now);
            }
            let report = ctx.host.round();
            apply(model, ctx, &report.applied, now)?;
            model.after_round(ctx, &report, now)?;
            changed = false;
        }
        model.after_step(ctx, now)?;
    }
    Ok(now)
}

/// Takes what the host applied (a round, or a plan the model applied
/// itself, such as a reclaim) into the integrator and the model:
/// preemptions first, then starts, then the new rates of every job whose
/// placement or QoS changed.
pub fn apply<M: WorkloadModel + ?Sized>(
    model: &mut M,
    ctx: &mut SimCtx,
    applied: &Applied,
    now: u64,
) -> anyhow::Result<()> {
    for &id in &applied.preempted {
        if let Some(job) = ctx.progress.preempted(id, now) {
            model.on_preempted(ctx, job)?;
        }
    }
    for &id in &applied.started {
        if let Some(job) = ctx.progress.started(id, now) {
            model.on_started(ctx, job, now);
        }
    }
    if model.interference() {
        let running: Vec<JobId> = ctx
            .host
            .state
            .cluster()
            .running_jobs()
            .filter_map(|j| ctx.host.state.records().get(j.index() as usize))
            .map(|r| r.id)
            .collect();
        return refresh_rates(&*model, ctx, running);
    }
    let changed = applied
        .started
        .iter()
        .chain(applied.moved().collect::<Vec<_>>().iter())
        .chain(&applied.qos_changed)
        .copied()
        .collect();
    refresh_rates(&*model, ctx, changed)
}

/// Recomputes the rates of `jobs` (host ids) from their placements.
fn refresh_rates<M: WorkloadModel + ?Sized>(
    model: &M,
    ctx: &mut SimCtx,
    jobs: Vec<JobId>,
) -> anyhow::Result<()> {
    let rates: Vec<(usize, f64)> = {
        let state = &ctx.host.state;
        let cluster = state.cluster();
        let mut indexed: Vec<(u32, usize)> = jobs
            .into_iter()
            .filter_map(|id| Some((state.job_index(id)?, ctx.progress.job_of(id)?)))
            .collect();
        // In the cluster's order, once each: the host hears the progress
        // reports in the order a node's reports would list its jobs.
        indexed.sort_unstable();
        indexed.dedup();
        let asked: Vec<(usize, &[WorkerPlacement])> = indexed
            .iter()
            .map(|&(index, job)| (job, cluster.job(index).placement()))
            .collect();
        let rates = model.rates(ctx, &asked);
        asked.iter().map(|&(job, _)| job).zip(rates).collect()
    };
    for (job, rate) in rates {
        ctx.progress.set_rate(&mut ctx.host.state, job, rate)?;
    }
    Ok(())
}
