//! The event loop: the real host core (`ClusterState` + `RoundDriver` + a
//! `PolicySlot` holding the Wasm policy) driven in virtual time.

use crate::metrics::{FgdMetrics, ReplayMetrics, SeriesPoint, TaskRecord, mean, percentile};
use crate::scenario::{Scenario, SimTask};
use anyhow::Context;
use arbiter_host::registry::{Generation, PolicySlot};
use arbiter_host::roles::scheduler::{RoundDriver, RoundReport, Served};
use arbiter_host::runtime::{CompiledPolicy, NativePolicy};
use arbiter_host::state::{ClusterState, JobId};
use arbiter_placement_core::{
    DEFAULT_POPULARITY, FragIndex, SplitMix64, TargetWorkload, TaskShape, fgd_config,
};
use arbiter_policy_sdk::model::FULL_GPU_MILLI;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How tasks arrive and leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// The FGD paper's static placement: shuffled tasks, repeated until the
    /// GPU request is `tune` × capacity, one per round, no departures; a task
    /// the policy does not place is dropped.
    Fgd,
    /// Time-based replay: arrivals and departures at the trace's times.
    Replay,
    /// The Aryl paper's comparison on the Philly trace (capacity loaning,
    /// elastic scaling, reclaim rules; see `arbiter_sim::aryl::run_protocol`):
    /// a fixed set of eight runs, so `--policy` does not apply.
    Aryl,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Fgd => "fgd",
            Protocol::Replay => "replay",
            Protocol::Aryl => "aryl",
        })
    }
}

/// A fresh native fallback policy for each run (the host's default is `fifo`).
pub type NativeFactory = Arc<dyn Fn() -> Box<dyn NativePolicy> + Send + Sync>;

/// Knobs of one run beyond the scenario and the policy.
#[derive(Clone)]
pub struct RunOptions {
    pub seed: u64,
    /// FGD protocol: arrived GPU request at the end, as a multiple of capacity.
    pub tune: f64,
    /// Replay: rounds run at most this often (0 = at every event time).
    pub interval_ms: u64,
    /// Configuration for the policy; `None` = derived (see [`policy_config`]).
    pub config: Option<String>,
    /// The driver's last-resort native policy; `None` = the host's `fifo`.
    pub native_fallback: Option<NativeFactory>,
    /// Keep per-task records (reports); off for benchmarks of 80k-job traces.
    pub keep_records: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            seed: 42,
            tune: 1.3,
            interval_ms: 0,
            config: None,
            native_fallback: None,
            keep_records: true,
        }
    }
}

/// The result of one policy on one scenario with one seed.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutput {
    /// The policy's manifest name.
    pub policy: String,
    /// Built-in name or file path as given.
    pub policy_source: String,
    /// sha256 of the component.
    pub digest: String,
    pub protocol: Protocol,
    pub seed: u64,
    pub rounds: u64,
    pub tasks: usize,
    pub placed: usize,
    /// Rounds in which the policy faulted (answered by a fallback, or by nobody).
    pub policy_faults: u64,
    /// Rounds answered by an older generation or the native fallback.
    pub fallback_rounds: u64,
    pub round_latency_p50_us: f64,
    pub round_latency_p99_us: f64,
    /// Time inside the policy's calls, summed over rounds.
    pub policy_seconds: f64,
    pub wall_seconds: f64,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub fgd: Option<FgdMetrics>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayMetrics>,
    #[serde(skip)]
    pub series: Vec<SeriesPoint>,
    #[serde(skip)]
    pub records: Vec<TaskRecord>,
}

/// The built-in policies that take `seed` (placement-core's COMMON_KEYS);
/// the others (fifo, best-fit, sjf, aryl*) get their default configuration.
const SEEDED: [&str; 6] = [
    "random",
    "dot-product",
    "gpu-clustering",
    "gpu-packing",
    "fgd-best-fit",
    "fgd",
];

/// The configuration a policy gets: `seed` for the FGD-paper family, and for
/// `fgd` also the target workload of the tasks (so it does not have to estimate it).
pub fn policy_config(
    manifest_name: &str,
    seed: u64,
    workload: impl FnOnce() -> TargetWorkload,
) -> Option<String> {
    match manifest_name {
        "fgd" => Some(fgd_config(&workload(), seed)),
        name if SEEDED.contains(&name) => Some(format!("seed = {}\n", seed as i64)),
        _ => None,
    }
}

/// A task as placement-core sees it when building a target workload.
pub fn task_shape(task: &SimTask) -> TaskShape {
    let r = &task.request;
    TaskShape {
        cpu_milli: r.cpu_milli,
        num_gpu: r.gpus_per_worker,
        gpu_milli: r.gpu_milli,
        gpu_models: r.gpu_models.clone(),
    }
}

/// The host side of one run: state, slot, driver, and round statistics.
struct Host {
    state: ClusterState,
    driver: RoundDriver,
    generation: Arc<Generation>,
    rounds: u64,
    latencies_us: Vec<f64>,
    faults: u64,
    fallbacks: u64,
    policy_time: Duration,
}

impl Host {
    fn new(
        scenario: &Scenario,
        compiled: &CompiledPolicy,
        config: Option<String>,
        native: Option<&NativeFactory>,
    ) -> anyhow::Result<Host> {
        let mut state = ClusterState::new();
        for node in &scenario.nodes {
            state
                .add_node(node.clone())
                .with_context(|| format!("adding node `{}`", node.name))?;
        }
        let slot = Arc::new(PolicySlot::new(compiled.manifest.name.clone()));
        let generation = slot
            .swap(compiled.clone(), config, None, Some(state.snapshot()))
            .with_context(|| format!("loading policy `{}`", compiled.manifest.name))?;
        let driver = match native {
            Some(factory) => RoundDriver::with_native(slot, factory()),
            None => RoundDriver::new(slot),
        };
        Ok(Host {
            state,
            driver,
            generation,
            rounds: 0,
            latencies_us: Vec::new(),
            faults: 0,
            fallbacks: 0,
            policy_time: Duration::ZERO,
        })
    }

    fn round(&mut self) -> RoundReport {
        let report = self.driver.run_round(&mut self.state);
        self.rounds += 1;
        self.latencies_us.push(report.latency.as_secs_f64() * 1e6);
        self.policy_time += report.policy_time;
        if !report.faults.is_empty() {
            self.faults += 1;
        }
        if !matches!(report.served, Served::Active(_)) {
            self.fallbacks += 1;
        }
        report
    }

    fn output(
        &self,
        source: &str,
        protocol: Protocol,
        seed: u64,
        tasks: usize,
        placed: usize,
    ) -> RunOutput {
        RunOutput {
            policy: self.generation.manifest().name.clone(),
            policy_source: source.to_string(),
            digest: self.generation.digest().to_string(),
            protocol,
            seed,
            rounds: self.rounds,
            tasks,
            placed,
            policy_faults: self.faults,
            fallback_rounds: self.fallbacks,
            round_latency_p50_us: percentile(&self.latencies_us, 50.0),
            round_latency_p99_us: percentile(&self.latencies_us, 99.0),
            policy_seconds: self.policy_time.as_secs_f64(),
            wall_seconds: 0.0,
            fgd: None,
            replay: None,
            series: Vec::new(),
            records: Vec::new(),
        }
    }
}

/// Fragmentation of the host's cluster against `index`'s workload: (GPUs, % of idle).
fn fragmentation(
    index: &mut FragIndex,
    state: &ClusterState,
    capacity_milli: u64,
    used_milli: u64,
) -> (f64, f64) {
    index.sync(state.cluster());
    let frag = index.cluster_fragmentation();
    let idle = capacity_milli.saturating_sub(used_milli) as f64;
    let ratio = if idle > 0.0 { 100.0 * frag / idle } else { 0.0 };
    (frag / f64::from(FULL_GPU_MILLI), ratio)
}

fn pct(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        100.0 * used as f64 / capacity as f64
    }
}

/// The FGD protocol's task list: file order shuffled with `seed`, cycled
/// until the GPU request reaches `tune` × capacity (as the reference
/// simulator's workload tuning, and placement-core's harness).
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

/// Runs the FGD protocol for one policy and seed.
pub fn run_fgd(
    scenario: &Scenario,
    compiled: &CompiledPolicy,
    source: &str,
    opts: &RunOptions,
) -> anyhow::Result<RunOutput> {
    let span = tracing::info_span!("sim_fgd", policy = %compiled.manifest.name, seed = opts.seed);
    let _guard = span.enter();
    let started = Instant::now();
    let tasks = tuned_tasks(scenario, opts.seed, opts.tune);
    let workload =
        TargetWorkload::from_tasks(tasks.iter().map(|t| task_shape(t)), DEFAULT_POPULARITY);
    let config = match &opts.config {
        Some(c) => Some(c.clone()),
        None => policy_config(&compiled.manifest.name, opts.seed, || workload.clone()),
    };
    let mut host = Host::new(scenario, compiled, config, opts.native_fallback.as_ref())?;
    let capacity = scenario.gpu_capacity_milli();
    let mut index = FragIndex::new(workload);
    let (mut arrived, mut used) = (0u64, 0u64);
    let (mut placed, mut failed) = (0usize, 0usize);
    let mut at_100 = None;
    let mut at_80 = None;
    let mut next_sample = 0u64;
    let mut series = Vec::new();
    let mut records = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let mut request = task.request.clone();
        // Tuning repeats tasks; every copy needs its own name.
        request.name = format!("{}#{i}", request.name);
        host.state.set_now(i as u64);
        let id = host
            .state
            .submit(request)
            .with_context(|| format!("submitting `{}`", task.request.name))?;
        let report = host.round();
        let ok = report.applied.started.contains(&id);
        if ok {
            placed += 1;
            used += task.gpu_milli_total();
        } else {
            failed += 1;
            host.state
                .remove(id)
                .with_context(|| format!("dropping unplaced `{}`", task.request.name))?;
        }
        if opts.keep_records {
            records.push(TaskRecord {
                task: format!("{}#{i}", task.request.name),
                arrival_s: i as f64,
                start_s: ok.then_some(i as f64),
                end_s: None,
                gpus: task.gpus(),
                outcome: if ok { "placed" } else { "failed" },
            });
        }
        arrived += task.gpu_milli_total();
        // One sample per whole percent of arrived load.
        while arrived * 100 >= next_sample * capacity && capacity > 0 {
            let (frag, ratio) = fragmentation(&mut index, &host.state, capacity, used);
            series.push(SeriesPoint {
                x: pct(arrived, capacity),
                gpu_alloc_pct: pct(used, capacity),
                frag_ratio_pct: Some(ratio),
                frag_gpus: Some(frag),
                pending: 0,
                running: placed,
            });
            if at_80.is_none() && next_sample >= 80 {
                at_80 = Some((frag, ratio));
            }
            next_sample += 1;
        }
        if at_100.is_none() && arrived >= capacity {
            at_100 = Some(pct(used, capacity));
        }
    }
    let (frag80, ratio80) = at_80.unwrap_or((f64::NAN, f64::NAN));
    let mut out = host.output(source, Protocol::Fgd, opts.seed, tasks.len(), placed);
    out.fgd = Some(FgdMetrics {
        gpu_alloc_pct_at_100: at_100.unwrap_or(f64::NAN),
        gpu_alloc_pct_at_130: pct(used, capacity),
        unallocated_gpus_at_130: capacity.saturating_sub(used) as f64 / f64::from(FULL_GPU_MILLI),
        frag_gpus_at_80: frag80,
        frag_ratio_pct_at_80: ratio80,
        tasks_offered: tasks.len(),
        tasks_failed: failed,
        arrived_pct: pct(arrived, capacity),
    });
    out.series = series;
    out.records = records;
    out.wall_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        wall_s = out.wall_seconds,
        placed,
        failed,
        "fgd protocol run done"
    );
    Ok(out)
}

/// Where a task stands during a replay.
#[derive(Clone, Default)]
struct Track {
    id: Option<JobId>,
    first_start: Option<u64>,
    run_start: u64,
    end: Option<u64>,
    /// Work left (ms) when (re)started.
    remaining: u64,
    /// Bumped on preemption so a stale departure is ignored.
    generation: u32,
    running: bool,
}

/// Runs a time-based replay for one policy.
pub fn run_replay(
    scenario: &Scenario,
    compiled: &CompiledPolicy,
    source: &str,
    opts: &RunOptions,
) -> anyhow::Result<RunOutput> {
    let span =
        tracing::info_span!("sim_replay", policy = %compiled.manifest.name, seed = opts.seed);
    let _guard = span.enter();
    let started = Instant::now();
    let config = match &opts.config {
        Some(c) => Some(c.clone()),
        None => policy_config(&compiled.manifest.name, opts.seed, || {
            TargetWorkload::from_tasks(scenario.tasks.iter().map(task_shape), DEFAULT_POPULARITY)
        }),
    };
    let mut host = Host::new(scenario, compiled, config, opts.native_fallback.as_ref())?;
    let tasks = &scenario.tasks;
    let capacity = scenario.gpu_capacity_milli();
    let mut track: Vec<Track> = tasks
        .iter()
        .map(|t| Track {
            remaining: t.duration_ms.unwrap_or(u64::MAX),
            ..Track::default()
        })
        .collect();
    let mut by_id: HashMap<JobId, usize> = HashMap::new();
    // (time, task, generation): min-heap of departures.
    let mut departures: BinaryHeap<Reverse<(u64, usize, u32)>> = BinaryHeap::new();
    let mut next_arrival = 0usize;
    let (mut pending, mut running, mut used) = (0usize, 0usize, 0u64);
    let (mut peak_pending, mut preemptions) = (0usize, 0u64);
    let first_arrival = tasks.first().map_or(0, |t| t.arrival_ms);
    let last_arrival = tasks.last().map_or(0, |t| t.arrival_ms);
    // About a thousand series points whatever the trace's length.
    let sample_step = ((last_arrival - first_arrival) / 1000).max(1);
    let mut next_sample = first_arrival;
    let mut series = Vec::new();
    let mut frag_index = FragIndex::new(TargetWorkload::from_tasks(
        tasks.iter().map(task_shape),
        DEFAULT_POPULARITY,
    ));
    let (mut alloc_integral, mut last_t, mut peak_alloc) = (0.0f64, first_arrival, 0.0f64);
    let mut last_end = first_arrival;
    let mut now;
    loop {
        let arrival = tasks.get(next_arrival).map(|t| t.arrival_ms);
        let departure = departures.peek().map(|Reverse((t, _, _))| *t);
        now = match (arrival, departure) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(d)) => d,
            (Some(a), Some(d)) => a.min(d),
        };
        if opts.interval_ms > 0 {
            // Batch everything up to the next scheduling tick into one round.
            now = now.div_ceil(opts.interval_ms) * opts.interval_ms;
        }
        alloc_integral += pct(used, capacity) * (now - last_t) as f64;
        last_t = now;
        host.state.set_now(now);
        while let Some(&Reverse((t, task, generation))) = departures.peek() {
            if t > now {
                break;
            }
            departures.pop();
            let tr = &mut track[task];
            if tr.generation != generation || !tr.running {
                continue;
            }
            let Some(id) = tr.id else { continue };
            host.state
                .remove(id)
                .with_context(|| format!("completing `{}`", tasks[task].request.name))?;
            by_id.remove(&id);
            tr.running = false;
            tr.end = Some(t);
            last_end = last_end.max(t);
            running -= 1;
            used -= tasks[task].gpu_milli_total();
        }
        while next_arrival < tasks.len() && tasks[next_arrival].arrival_ms <= now {
            let task = &tasks[next_arrival];
            let id = host
                .state
                .submit(task.request.clone())
                .with_context(|| format!("submitting `{}`", task.request.name))?;
            track[next_arrival].id = Some(id);
            by_id.insert(id, next_arrival);
            pending += 1;
            next_arrival += 1;
        }
        peak_pending = peak_pending.max(pending);
        // A round only when something waits: with an empty queue no scheduler
        // has anything to decide, and the events reach the policy next time.
        if pending > 0 {
            let report = host.round();
            for id in &report.applied.started {
                let Some(&task) = by_id.get(id) else { continue };
                let tr = &mut track[task];
                tr.first_start.get_or_insert(now);
                tr.run_start = now;
                tr.running = true;
                pending -= 1;
                running += 1;
                used += tasks[task].gpu_milli_total();
                if tr.remaining != u64::MAX {
                    departures.push(Reverse((
                        now.saturating_add(tr.remaining),
                        task,
                        tr.generation,
                    )));
                }
            }
            for id in &report.applied.preempted {
                let Some(&task) = by_id.get(id) else { continue };
                let tr = &mut track[task];
                if !tr.running {
                    continue;
                }
                preemptions += 1;
                if tr.remaining != u64::MAX {
                    // Checkpointed work is kept; otherwise the job starts over.
                    let done = now - tr.run_start;
                    if tasks[task].request.checkpointed {
                        tr.remaining = tr.remaining.saturating_sub(done);
                    }
                }
                tr.generation += 1;
                tr.running = false;
                running -= 1;
                pending += 1;
                used -= tasks[task].gpu_milli_total();
            }
        }
        let alloc = pct(used, capacity);
        peak_alloc = peak_alloc.max(alloc);
        if now >= next_sample {
            let (frag, ratio) = fragmentation(&mut frag_index, &host.state, capacity, used);
            series.push(SeriesPoint {
                x: (now - first_arrival) as f64 / 1000.0,
                gpu_alloc_pct: alloc,
                frag_ratio_pct: Some(ratio),
                frag_gpus: Some(frag),
                pending,
                running,
            });
            next_sample = now + sample_step;
        }
    }
    let end = last_end.max(last_t);
    series.push(SeriesPoint {
        x: (end - first_arrival) as f64 / 1000.0,
        gpu_alloc_pct: pct(used, capacity),
        frag_ratio_pct: None,
        frag_gpus: None,
        pending,
        running,
    });
    let secs = |ms: u64| (ms - first_arrival) as f64 / 1000.0;
    let mut jct = Vec::new();
    let mut queue = Vec::new();
    let mut records = Vec::new();
    let (mut completed, mut still_running, mut unplaced) = (0, 0, 0);
    for (task, tr) in tasks.iter().zip(&track) {
        let arrival = task.arrival_ms;
        if let Some(s) = tr.first_start {
            queue.push((s - arrival) as f64 / 1000.0);
        }
        let outcome = match (tr.first_start, tr.end) {
            (_, Some(e)) => {
                completed += 1;
                jct.push((e - arrival) as f64 / 1000.0);
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
                arrival_s: secs(arrival),
                start_s: tr.first_start.map(secs),
                end_s: tr.end.map(secs),
                gpus: task.gpus(),
                outcome,
            });
        }
    }
    let span_ms = end.saturating_sub(first_arrival);
    let placed = completed + still_running;
    let mut out = host.output(source, Protocol::Replay, opts.seed, tasks.len(), placed);
    out.replay = Some(ReplayMetrics {
        jobs_completed: completed,
        jobs_running_at_end: still_running,
        jobs_unplaced: unplaced,
        avg_jct_s: mean(&jct),
        p95_jct_s: percentile(&jct, 95.0),
        avg_queue_s: mean(&queue),
        p95_queue_s: percentile(&queue, 95.0),
        max_queue_s: queue.iter().copied().fold(0.0, f64::max),
        makespan_s: span_ms as f64 / 1000.0,
        mean_gpu_alloc_pct: if span_ms > 0 {
            alloc_integral / span_ms as f64
        } else {
            pct(used, capacity)
        },
        peak_gpu_alloc_pct: peak_alloc,
        peak_pending,
        preemptions,
    });
    out.series = series;
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
