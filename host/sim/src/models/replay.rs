//! Time-based trace replay: tasks arrive at their trace times and run for
//! their trace durations at the reference speed (a task without a duration
//! never leaves); a round runs whenever something changed and some task
//! waits — at the event times, or on a grid. A preempted task goes back to
//! the queue and keeps its progress only with a checkpoint. Metrics: JCT,
//! queueing delay, makespan, time-weighted GPU allocation, a time series.

use crate::core::recorder::{FragmentationMeter, JobTimes, Series, fragmentation, pct};
use crate::core::{self, LoopRules, Progress, ProgressRules, RunPolicy, SimCtx, SimHost};
use crate::metrics::{ReplayMetrics, SeriesPoint, TaskRecord, mean, percentile};
use crate::models::ModelConfigFile;
use crate::prediction::Prediction;
use crate::run::{Protocol, RunOptions, RunOutput};
use crate::scenario::{Scenario, SimTask};
use anyhow::{Context, bail};
use arbiter_host::state::ClusterState;
use arbiter_policy_sdk::model::WorkerPlacement;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// How the replay runs rounds and what it reports to the host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    /// Rounds run on this grid (virtual ms); 0: at every event time.
    pub round_interval_ms: u64,
    /// Report every GPU's metrics to the host this often (virtual ms), as
    /// a node agent would; `None`: never.
    pub gpu_metrics_period_ms: Option<u64>,
    /// What a job's `estimate-ms` says when it arrives (the run time stays
    /// the trace's): the trace's own estimate, an Oracle, or a predictor
    /// with a stated accuracy (see [`crate::prediction`]).
    pub prediction: Prediction,
}

impl ModelConfigFile for ReplayConfig {
    const WHAT: &'static str = "the replay's configuration";

    fn check(&self) -> anyhow::Result<()> {
        if self.gpu_metrics_period_ms == Some(0) {
            bail!("gpu_metrics_period_ms must be positive");
        }
        self.prediction.check()
    }
}

struct ReplayModel<'a> {
    tasks: &'a [SimTask],
    /// Each task's `estimate-ms` as submitted (`None`: the trace's own).
    predicted: Option<Vec<u64>>,
    capacity: u64,
    next_arrival: usize,
    pending: usize,
    running: usize,
    used: u64,
    peak_pending: usize,
    alloc_integral: f64,
    peak_alloc: f64,
    last_end: u64,
    series: Series,
    meter: Option<Box<dyn FragmentationMeter>>,
}

impl ReplayModel<'_> {
    fn point(&mut self, state: &ClusterState, x: f64, with_frag: bool) -> SeriesPoint {
        let (frag, ratio) = match self.meter.as_deref_mut().filter(|_| with_frag) {
            Some(meter) => {
                let (f, r) = fragmentation(meter, state, self.capacity, self.used);
                (Some(f), Some(r))
            }
            None => (None, None),
        };
        SeriesPoint {
            x,
            gpu_alloc_pct: pct(self.used, self.capacity),
            frag_ratio_pct: ratio,
            frag_gpus: frag,
            pending: self.pending,
            running: self.running,
        }
    }
}

impl core::WorkloadModel for ReplayModel<'_> {
    fn start_ms(&self) -> u64 {
        self.tasks.first().map_or(0, |t| t.arrival_ms)
    }

    fn next_event(&self, _ctx: &SimCtx, _now: u64) -> Option<u64> {
        self.tasks.get(self.next_arrival).map(|t| t.arrival_ms)
    }

    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        let mut arrived = false;
        while let Some(task) = self.tasks.get(self.next_arrival) {
            if task.arrival_ms > now {
                break;
            }
            let mut request = task.request.clone();
            if let Some(p) = self
                .predicted
                .as_ref()
                .and_then(|p| p.get(self.next_arrival))
            {
                request.estimate_ms = *p;
            }
            let id = ctx
                .host
                .state
                .submit(request)
                .with_context(|| format!("submitting `{}`", task.request.name))?;
            ctx.progress.submitted(self.next_arrival, id);
            self.pending += 1;
            self.next_arrival += 1;
            arrived = true;
        }
        self.peak_pending = self.peak_pending.max(self.pending);
        Ok(arrived)
    }

    /// A round only when something waits: with an empty queue no scheduler
    /// has anything to decide, and the events reach the policy next time.
    fn round_due(&self, _ctx: &SimCtx, changed: bool) -> bool {
        changed && self.pending > 0
    }

    fn rate(&self, _ctx: &SimCtx, _job: usize, _placement: &[WorkerPlacement]) -> f64 {
        // Trace durations are at the trace's own speed.
        1.0
    }

    fn on_started(&mut self, _ctx: &mut SimCtx, job: usize, _now: u64) {
        self.pending -= 1;
        self.running += 1;
        self.used += self.tasks[job].gpu_milli_total();
    }

    fn on_preempted(&mut self, _ctx: &mut SimCtx, job: usize) -> anyhow::Result<()> {
        self.running -= 1;
        self.pending += 1;
        self.used -= self.tasks[job].gpu_milli_total();
        Ok(())
    }

    fn on_finished(&mut self, _ctx: &mut SimCtx, job: usize, now: u64) {
        self.running -= 1;
        self.used -= self.tasks[job].gpu_milli_total();
        self.last_end = self.last_end.max(now);
    }

    fn observe(&mut self, _ctx: &SimCtx, from: u64, to: u64) {
        self.alloc_integral += pct(self.used, self.capacity) * (to - from) as f64;
    }

    fn after_step(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<()> {
        let alloc = pct(self.used, self.capacity);
        self.peak_alloc = self.peak_alloc.max(alloc);
        if self.series.due(now) {
            let x = (now - self.start_ms()) as f64 / 1000.0;
            let point = self.point(&ctx.host.state, x, true);
            self.series.points.push(point);
        }
        Ok(())
    }
}

/// Runs a time-based replay of `scenario` for one policy.
pub fn run_replay(
    scenario: &Scenario,
    policy: &RunPolicy,
    source: &str,
    cfg: &ReplayConfig,
    opts: &RunOptions,
) -> anyhow::Result<RunOutput> {
    let span = tracing::info_span!("sim_replay", policy = %policy.compiled.manifest.name, seed = opts.seed);
    let _guard = span.enter();
    cfg.check()?;
    let started = Instant::now();
    let host = SimHost::new(
        scenario.cluster_state()?,
        policy,
        opts.native_fallback.as_ref(),
    )?;
    let tasks = &scenario.tasks;
    let progress = Progress::new(
        tasks.iter().map(|t| {
            let work = t.duration_ms.map_or(f64::INFINITY, |d| d as f64);
            (work, t.request.checkpointed)
        }),
        ProgressRules::default(),
    );
    let mut ctx = SimCtx { host, progress };
    let first_arrival = tasks.first().map_or(0, |t| t.arrival_ms);
    let last_arrival = tasks.last().map_or(0, |t| t.arrival_ms);
    // About a thousand series points whatever the trace's length.
    let sample_step = ((last_arrival - first_arrival) / 1000).max(1);
    let meter = opts.fragmentation.as_ref().map(|make| {
        let all: Vec<&SimTask> = tasks.iter().collect();
        make(&all)
    });
    let predicted = (cfg.prediction != Prediction::None).then(|| {
        let truth: Vec<Option<u64>> = tasks.iter().map(|t| t.duration_ms).collect();
        cfg.prediction.predict_all(&truth, opts.seed)
    });
    let mut model = ReplayModel {
        tasks,
        predicted,
        capacity: scenario.gpu_capacity_milli(),
        next_arrival: 0,
        pending: 0,
        running: 0,
        used: 0,
        peak_pending: 0,
        alloc_integral: 0.0,
        peak_alloc: 0.0,
        last_end: first_arrival,
        series: Series::every(first_arrival, sample_step),
        meter,
    };
    let rules = LoopRules {
        round_interval_ms: cfg.round_interval_ms,
        horizon_ms: u64::MAX,
        gpu_metrics_period_ms: cfg.gpu_metrics_period_ms,
    };
    let last_t = core::run(&mut model, &mut ctx, &rules)?;
    let end = model.last_end.max(last_t);
    let final_point = model.point(
        &ctx.host.state,
        (end - first_arrival) as f64 / 1000.0,
        false,
    );
    model.series.points.push(final_point);
    let secs = |ms: u64| (ms - first_arrival) as f64 / 1000.0;
    let tracks = ctx.progress.tracks();
    let times = JobTimes::collect(tracks, tasks.iter().map(|t| &t.arrival_ms));
    let mut records = Vec::new();
    let (mut completed, mut still_running, mut unplaced) = (0, 0, 0);
    for (task, tr) in tasks.iter().zip(tracks) {
        let outcome = match (tr.first_start, tr.end) {
            (_, Some(_)) => {
                completed += 1;
                "completed"
            }
            (Some(_), None) if tr.running => {
                still_running += 1;
                "running"
            }
            _ => {
                unplaced += 1;
                "unplaced"
            }
        };
        if opts.keep_records {
            records.push(TaskRecord {
                task: task.request.name.clone(),
                arrival_s: secs(task.arrival_ms),
                start_s: tr.first_start.map(secs),
                end_s: tr.end.map(secs),
                gpus: task.gpus(),
                outcome,
            });
        }
    }
    let preemptions = tracks.iter().map(|t| u64::from(t.preemptions)).sum();
    let span_ms = end.saturating_sub(first_arrival);
    let placed = completed + still_running;
    let mut out = RunOutput::from_host(
        &ctx.host,
        source,
        Protocol::Replay,
        opts.seed,
        tasks.len(),
        placed,
    );
    let (jct, queue) = (&times.jct_s, &times.queue_s);
    out.replay = Some(ReplayMetrics {
        jobs_completed: completed,
        jobs_running_at_end: still_running,
        jobs_unplaced: unplaced,
        avg_jct_s: mean(jct),
        p95_jct_s: percentile(jct, 95.0),
        avg_queue_s: mean(queue),
        p95_queue_s: percentile(queue, 95.0),
        max_queue_s: queue.iter().copied().fold(0.0, f64::max),
        makespan_s: span_ms as f64 / 1000.0,
        mean_gpu_alloc_pct: if span_ms > 0 {
            model.alloc_integral / span_ms as f64
        } else {
            pct(model.used, model.capacity)
        },
        peak_gpu_alloc_pct: model.peak_alloc,
        peak_pending: model.peak_pending,
        preemptions,
    });
    out.series = model.series.points;
    out.records = records;
    out.wall_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        wall_s = out.wall_seconds,
        rounds = out.rounds,
        completed,
        unplaced,
        "replay run done"
    );
    Ok(out)
}
