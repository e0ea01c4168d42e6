//! The FGD paper's static-placement protocol (Weng et al., ATC '23, §6.1):
//! tasks shuffled with the seed and cycled until their GPU request is
//! `tune` × capacity, one task per round at virtual time = its position, no
//! departures; a task the policy does not place is dropped. Metrics: GPU
//! allocation at 100 % and `tune` arrived load, unallocated GPUs,
//! fragmentation (amount and ratio) against arrived load.

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
        if !(self.tune.is_finite() && self.tune > 0.0) {
            bail!("tune must be a positive number, got {}", self.tune);
        }
        Ok(())
    }
}

/// The protocol's task list: file order shuffled with `seed`, cycled until
/// the GPU request reaches `tune` × capacity (the reference simulator's
/// workload tuning).
pub fn tuned_tasks(scenario: &Scenario, seed: u64, tune: f64) -> Vec<&SimTask> {
    let mut base: Vec<&SimTask> = scenario.tasks.iter().collect();
    base.sort_by_key(|t| t.file_index);
    let mut order: Vec<usize> = (0..base.len()).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    let target = (scenario.gpu_capacity_milli() as f64 * tune) as u64;
    let mut out = Vec::new();
    let mut total = 0u64;
    // A workload without GPU requests never reaches the target: one pass only.
    if base.iter().all(|t| t.gpu_milli_total() == 0) {
        return order.iter().map(|&i| base[i]).collect();
    }
    for &i in order.iter().cycle() {
        if total >= target {
            break;
        }
        total += base[i].gpu_milli_total();
        out.push(base[i]);
    }
    out
}

struct FgdModel<'a> {
    tasks: Vec<&'a SimTask>,
    capacity: u64,
    meter: Option<Box<dyn FragmentationMeter>>,
    keep_records: bool,
    arrived: u64,
    used: u64,
    placed: usize,
    failed: usize,
    at_100: Option<f64>,
    at_80: Option<(f64, f64)>,
    next_sample: u64,
    series: Vec<SeriesPoint>,
    records: Vec<TaskRecord>,
}

impl FgdModel<'_> {
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
        if self.at_100.is_none() && self.arrived >= capacity {
            self.at_100 = Some(pct(used, capacity));
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
        let task = self.tasks[i];
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
        let task = self.tasks[i];
        let id = ctx
            .progress
            .track(i)
            .id
            .context("the round's task was never submitted")?;
        let ok = report.applied.started.contains(&id);
        if ok {
            self.placed += 1;
            self.used += task.gpu_milli_total();
        } else {
            self.failed += 1;
            ctx.host
                .state
                .remove(id)
                .with_context(|| format!("dropping unplaced `{}`", task.request.name))?;
            ctx.progress.withdrawn(i);
        }
        if self.keep_records {
            self.records.push(TaskRecord {
                task: format!("{}#{i}", task.request.name),
                arrival_s: i as f64,
                start_s: ok.then_some(i as f64),
                end_s: None,
                gpus: task.gpus(),
                outcome: if ok { "placed" } else { "failed" },
            });
        }
        self.arrived += task.gpu_milli_total();
        self.sample(&ctx.host.state);
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
        meter: opts.fragmentation.as_ref().map(|make| make(&tasks)),
        capacity: scenario.gpu_capacity_milli(),
        keep_records: opts.keep_records,
        arrived: 0,
        used: 0,
        placed: 0,
        failed: 0,
        at_100: None,
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
    out.fgd = Some(FgdMetrics {
        gpu_alloc_pct_at_100: model.at_100.unwrap_or(f64::NAN),
        gpu_alloc_pct_at_130: pct(model.used, capacity),
        unallocated_gpus_at_130: capacity.saturating_sub(model.used) as f64
            / f64::from(FULL_GPU_MILLI),
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
