//! The FGD paper's static-placement protocol (Weng et al., ATC '23, §6.1),
//! as the authors' simulator runs it (`hkust-adsl/kubernetes-scheduler-simulator`;
//! `docs/reproductions/fgd.md` names the source lines of each rule):
//!
//! * the task list is every task of the trace, placeable or not, in name
//!   order, shuffled with the seed, then tuned to `tune` × capacity
//!   ([`tuned_tasks`]);
//! * one task per round at virtual time = its position, no departures; a
//!   task the policy does not place is dropped, and one no node could ever
//!   hold fails without a round;
//! * the allocation "at X %" is the mean allocation over the tasks whose
//!   arrived GPU request rounds to X % of capacity ([`AllocBuckets`]), as the
//!   reference's `merge_alloc_discrete.py` computes it; unallocated GPUs and
//!   fragmentation (amount and ratio) are reported beside it.

use crate::core::recorder::{FragmentationMeter, fragmentation, pct};
use crate::core::{self, LoopRules, Progress, ProgressRules, RunPolicy, SimCtx, SimHost};
use crate::metrics::{FgdMetrics, SeriesPoint, TaskRecord};
use crate::models::ModelConfigFile;
use crate::run::{Protocol, RunOptions, RunOutput};
use crate::scenario::{Scenario, SimTask};
use anyhow::{Context, bail};
use arbiter_host::roles::scheduler::RoundReport;
use arbiter_host::state::ClusterState;
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, WorkerPlacement};
use arbiter_policy_sdk::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The protocol's one knob.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FgdConfig {
    /// Arrived GPU request at the end, as a multiple of capacity (the paper: 1.3).
    pub tune: f64,
}

impl Default for FgdConfig {
    fn default() -> Self {
        FgdConfig { tune: 1.3 }
    }
}

impl ModelConfigFile for FgdConfig {
    const WHAT: &'static str = "the FGD protocol's configuration";

    fn check(&self) -> anyhow::Result<()> {
        check_tune(self.tune)
    }
}

/// The most the FGD protocol tunes a workload to, in multiples of the cluster's GPU
/// capacity (the paper's axis ends at 1.3): each multiple is a copy of the trace's tasks.
pub const MAX_TUNE: f64 = 10.0;

/// `tune` is a multiple of capacity in (0, [`MAX_TUNE`]].
pub fn check_tune(tune: f64) -> anyhow::Result<()> {
    if !(tune > 0.0 && tune <= MAX_TUNE) {
        bail!("tune must be above 0 and at most {MAX_TUNE}, got {tune:?}");
    }
    Ok(())
}

/// One entry of the protocol's task list.
#[derive(Clone, Copy, Debug)]
pub struct ProtocolTask<'a> {
    pub task: &'a SimTask,
    /// `false` for a task no node could ever hold (`Scenario::unplaceable`):
    /// it arrives and fails.
    pub placeable: bool,
}

/// Every task of the trace, placeable or not, in name order (the
/// reference's `SetWorkloadPods`).
pub fn trace_tasks(scenario: &Scenario) -> Vec<ProtocolTask<'_>> {
    let mut tasks: Vec<ProtocolTask<'_>> = scenario
        .tasks
        .iter()
        .map(|task| ProtocolTask {
            task,
            placeable: true,
        })
        .chain(scenario.unplaceable.iter().map(|task| ProtocolTask {
            task,
            placeable: false,
        }))
        .collect();
    tasks.sort_by(|a, b| a.task.request.name.cmp(&b.task.request.name));
    tasks
}

/// The protocol's task list, built as the reference simulator builds it
/// (`SortClusterPods`, then `TunePodsByNodeTotalResource`):
///
/// * every task of the trace in name order, shuffled with `seed`;
/// * tune up, while the list's GPU request is under `tune` × capacity:
///   tasks drawn uniformly *with replacement* from the name-ordered trace
///   are appended, until a draw whose per-GPU milli-GPU would take the
///   request past the target (that draw is discarded; the check is per GPU,
///   so the last multi-GPU task may overshoot);
/// * tune down, while it is over: tasks removed at uniformly drawn
///   positions until the request is at or under the target.
///
/// The random numbers are SplitMix64's, not Go's `math/rand`: the lists
/// follow the same rules with other draws, so only means over seeds compare.
pub fn tuned_tasks(scenario: &Scenario, seed: u64, tune: f64) -> Vec<ProtocolTask<'_>> {
    let base = trace_tasks(scenario);
    let mut rng = SplitMix64::new(seed);
    let mut list = base.clone();
    rng.shuffle(&mut list);
    let target = scenario.gpu_capacity_milli() as f64 * tune;
    let mut total: u64 = list.iter().map(|t| t.task.gpu_milli_total()).sum();
    if (total as f64) < target {
        // Without a GPU task no draw could ever stop the loop.
        if base.iter().any(|t| t.task.gpu_milli_per_gpu() > 0) {
            loop {
                let drawn = base[rng.below(base.len() as u64) as usize];
                if (total + drawn.task.gpu_milli_per_gpu()) as f64 > target {
                    break;
                }
                total += drawn.task.gpu_milli_total();
                list.push(drawn);
            }
        }
    } else {
        while total as f64 > target && !list.is_empty() {
            let removed = list.remove(rng.below(list.len() as u64) as usize);
            total -= removed.task.gpu_milli_total();
        }
    }
    list
}

/// The allocation against arrived load, binned as the reference's analysis
/// (`experiments/analysis/merge_alloc_discrete.py`) bins it: after every
/// task (placed or failed) one row of (arrived request in % of capacity,
/// rounded to a whole percent half-to-even; allocation in %, rounded to two
/// decimals); the value at X % is the mean of the rows in bucket X, or of
/// buckets X − 1 to X + 1 when X is empty, rounded to two decimals.
#[derive(Debug, Default)]
pub struct AllocBuckets {
    /// Per whole percent of arrived load: (sum of allocations, rows).
    rows: std::collections::BTreeMap<i64, (f64, u32)>,
}

/// Python's `round(x, digits)` for the values here (half to even).
fn round_to(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round_ties_even() / scale
}

impl AllocBuckets {
    /// One row: `arrived` and `used` milli-GPU of `capacity` (whole GPUs).
    /// The percentages are computed as the reference's script does,
    /// `milli / gpus / 10`, so that a half lands where it lands there.
    pub fn record(&mut self, arrived: u64, used: u64, capacity: u64) {
        let gpus = (capacity / u64::from(FULL_GPU_MILLI)) as f64;
        if gpus == 0.0 {
            return;
        }
        let percent = |milli: u64| milli as f64 / gpus / 10.0;
        let bucket = round_to(percent(arrived), 0) as i64;
        let row = self.rows.entry(bucket).or_default();
        row.0 += round_to(percent(used), 2);
        row.1 += 1;
    }

    /// The allocation at `percent` % of arrived load; NaN if no row is near.
    pub fn at(&self, percent: i64) -> f64 {
        let mean = |range: std::ops::RangeInclusive<i64>| {
            let (sum, n) = self
                .rows
                .range(range)
                .fold((0.0, 0u32), |(s, n), (_, &(rs, rn))| (s + rs, n + rn));
            (n > 0).then(|| round_to(sum / f64::from(n), 2))
        };
        mean(percent..=percent)
            .or_else(|| mean(percent - 1..=percent + 1))
            .unwrap_or(f64::NAN)
    }
}

struct FgdModel<'a> {
    tasks: Vec<ProtocolTask<'a>>,
    capacity: u64,
    meter: Option<Box<dyn FragmentationMeter>>,
    keep_records: bool,
    arrived: u64,
    used: u64,
    placed: usize,
    failed: usize,
    buckets: AllocBuckets,
    at_80: Option<(f64, f64)>,
    next_sample: u64,
    series: Vec<SeriesPoint>,
    records: Vec<TaskRecord>,
}

impl FgdModel<'_> {
    /// After task `i` was decided: its arrival counts, one allocation row,
    /// and a series point per whole percent of arrived load crossed.
    fn task_done(&mut self, state: &ClusterState, i: usize, placed: bool) {
        let task = self.tasks[i].task;
        if placed {
            self.placed += 1;
            self.used += task.gpu_milli_total();
        } else {
            self.failed += 1;
        }
        if self.keep_records {
            self.records.push(TaskRecord {
                task: format!("{}#{i}", task.request.name),
                arrival_s: i as f64,
                start_s: placed.then_some(i as f64),
                end_s: None,
                gpus: task.gpus(),
                outcome: if placed { "placed" } else { "failed" },
            });
        }
        self.arrived += task.gpu_milli_total();
        self.buckets.record(self.arrived, self.used, self.capacity);
        self.sample(state);
    }

    fn sample(&mut self, state: &ClusterState) {
        let (capacity, used) = (self.capacity, self.used);
        // One sample per whole percent of arrived load.
        while capacity > 0 && self.arrived * 100 >= self.next_sample * capacity {
            let (frag, ratio) = match self.meter.as_deref_mut() {
                Some(meter) => {
                    let (f, r) = fragmentation(meter, state, capacity, used);
                    (Some(f), Some(r))
                }
                None => (None, None),
            };
            self.series.push(SeriesPoint {
                x: pct(self.arrived, capacity),
                gpu_alloc_pct: pct(used, capacity),
                frag_ratio_pct: ratio,
                frag_gpus: frag,
                pending: 0,
                running: self.placed,
            });
            if self.at_80.is_none() && self.next_sample >= 80 {
                self.at_80 = Some((frag.unwrap_or(f64::NAN), ratio.unwrap_or(f64::NAN)));
            }
            self.next_sample += 1;
        }
    }
}

impl core::WorkloadModel for FgdModel<'_> {
    fn next_event(&self, _ctx: &SimCtx, _now: u64) -> Option<u64> {
        // Task `i` arrives at time `i`, after task `i - 1` was decided.
        let next = self.placed + self.failed;
        (next < self.tasks.len()).then_some(next as u64)
    }

    fn on_events(&mut self, ctx: &mut SimCtx, now: u64) -> anyhow::Result<bool> {
        let i = now as usize;
        let ProtocolTask { task, placeable } = self.tasks[i];
        if !placeable {
            // No node could ever hold it: it arrives and fails, no round.
            self.task_done(&ctx.host.state, i, false);
            return Ok(false);
        }
        let mut request = task.request.clone();
        // Tuning repeats tasks; every copy needs its own name.
        request.name = format!("{}#{i}", request.name);
        let id = ctx
            .host
            .state
            .submit(request)
            .with_context(|| format!("submitting `{}`", task.request.name))?;
        ctx.progress.submitted(i, id);
        Ok(true)
    }

    fn rate(&self, _ctx: &SimCtx, _job: usize, _placement: &[WorkerPlacement]) -> f64 {
        // Static placement: tasks hold their resources and never end.
        0.0
    }

    fn after_round(
        &mut self,
        ctx: &mut SimCtx,
        report: &RoundReport,
        now: u64,
    ) -> anyhow::Result<()> {
        let i = now as usize;
        let task = self.tasks[i].task;
        let id = ctx
            .progress
            .track(i)
            .id
            .context("the round's task was never submitted")?;
        let placed = report.applied.started.contains(&id);
        if !placed {
            ctx.host
                .state
                .remove(id)
                .with_context(|| format!("dropping unplaced `{}`", task.request.name))?;
            ctx.progress.withdrawn(i);
        }
        self.task_done(&ctx.host.state, i, placed);
        Ok(())
    }
}

/// Runs the FGD protocol for one policy and seed (`opts.seed` orders the tasks).
pub fn run_fgd(
    scenario: &Scenario,
    policy: &RunPolicy,
    source: &str,
    cfg: &FgdConfig,
    opts: &RunOptions,
) -> anyhow::Result<RunOutput> {
    let span =
        tracing::info_span!("sim_fgd", policy = %policy.compiled.manifest.name, seed = opts.seed);
    let _guard = span.enter();
    cfg.check()?;
    let started = Instant::now();
    let tasks = tuned_tasks(scenario, opts.seed, cfg.tune);
    let host = SimHost::new(
        scenario.cluster_state()?,
        policy,
        opts.native_fallback.as_ref(),
    )?;
    let progress = Progress::new(
        tasks.iter().map(|_| (f64::INFINITY, false)),
        ProgressRules::default(),
    );
    let mut ctx = SimCtx { host, progress };
    let mut model = FgdModel {
        meter: opts
            .fragmentation
            .as_ref()
            .map(|make| make(&tasks.iter().map(|t| t.task).collect::<Vec<_>>())),
        capacity: scenario.gpu_capacity_milli(),
        keep_records: opts.keep_records,
        arrived: 0,
        used: 0,
        placed: 0,
        failed: 0,
        buckets: AllocBuckets::default(),
        at_80: None,
        next_sample: 0,
        series: Vec::new(),
        records: Vec::new(),
        tasks,
    };
    core::run(&mut model, &mut ctx, &LoopRules::default())?;
    let capacity = model.capacity;
    let (frag80, ratio80) = model.at_80.unwrap_or((f64::NAN, f64::NAN));
    let mut out = RunOutput::from_host(
        &ctx.host,
        source,
        Protocol::Fgd,
        opts.seed,
        model.tasks.len(),
        model.placed,
    );
    let at_end = model.buckets.at((cfg.tune * 100.0).round() as i64);
    out.fgd = Some(FgdMetrics {
        gpu_alloc_pct_at_100: model.buckets.at(100),
        gpu_alloc_pct_at_130: at_end,
        unallocated_gpus_at_130: capacity as f64 / f64::from(FULL_GPU_MILLI)
            * (1.0 - at_end / 100.0),
        frag_gpus_at_80: frag80,
        frag_ratio_pct_at_80: ratio80,
        tasks_offered: model.tasks.len(),
        tasks_failed: model.failed,
        arrived_pct: pct(model.arrived, capacity),
    });
    out.series = model.series;
    out.records = model.records;
    out.wall_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        wall_s = out.wall_seconds,
        placed = model.placed,
        failed = model.failed,
        "fgd protocol run done"
    );
    Ok(out)
}
