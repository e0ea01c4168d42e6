//! The scheduler role: maps the SDK [`Cluster`] onto Algorithm 2
//! ([`crate::alloc`]) and places the result with best-fit decreasing (§5.3).
//!
//! Conventions the glue relies on:
//! * an elastic job is one with `min_workers < max_workers`; its first
//!   `max(min_workers, 1)` worker positions are its *base* demand and the
//!   positions after them its *flexible* workers (placements list base
//!   workers first and scale-outs append, so the convention holds);
//! * capacity is counted in whole GPUs; a fractional worker counts as one;
//! * with `capacity = "reference"`, capacity is normalised by GPU speed
//!   (contract 0.2 `gpu-model-speed`): "the on-loan inference GPUs are
//!   normalized relative to training GPUs when calculating the resource
//!   capacity" (§5.2). The default counts GPUs, the unit the knapsack's item
//!   weights are in (see `Capacity`);
//! * run times are what the host last reported as left (contract 0.2
//!   `remaining-ms`), so running and preempted jobs are valued by the work
//!   they still have, not by their submitted estimate.

use crate::alloc::{self, AllocParams, QueuedJob, RunningElastic};
use crate::config::{Capacity, Config, SlowSpill};
use crate::jct::ElasticJob;
use arbiter_policy_sdk::prelude::*;

/// What kind of server a node is for placement (§5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A dedicated training server (pool `training`, not on loan).
    Training,
    /// Neither: a plain pool. Treated like a training server, after them.
    Other,
    /// An inference server on loan to training.
    Loaned,
    /// An inference server that is not on loan: the inference scheduler's,
    /// never Aryl's (§3, §6 "whitelist": each scheduler only uses the
    /// servers it controls).
    Inference,
}

/// What a worker is, for choosing its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A worker of an inelastic job: training servers first.
    Inelastic,
    /// A base worker of an elastic job: inference servers, away from the
    /// flexible group.
    Base,
    /// A flexible worker: inference servers, away from base workers, so that
    /// reclaiming can release the flexible group by scale-in alone.
    Flex,
}

/// Per-node bookkeeping the placement needs on top of the [`Plan`].
struct Book {
    kind: Vec<Kind>,
    /// GPU speed relative to the reference model (1.0 = reference).
    speed: Vec<f64>,
    /// Whole free GPUs (free milli-GPU = 1000), per the plan.
    free_whole: Vec<u32>,
    /// Whether any GPU of the node is (partly) in use.
    used: Vec<bool>,
    /// Non-flexible workers (inelastic + base) on the node.
    base: Vec<u32>,
    /// Flexible workers on the node.
    flex: Vec<u32>,
}

fn effective_min(job: Job<'_>) -> u32 {
    job.min_workers().max(1)
}

fn per_worker_gpus(job: Job<'_>) -> u32 {
    job.gpus_per_worker().max(1)
}

/// Whether position `p` of a running job is a flexible worker.
fn is_flex_position(job: Job<'_>, p: usize) -> bool {
    job.is_elastic() && p as u32 >= effective_min(job)
}

impl Book {
    fn new(cluster: &Cluster, plan: &Plan<'_>, cfg: &Config) -> Self {
        let n = cluster.node_count();
        let kind = cluster
            .nodes()
            .map(|node| {
                if node.on_loan() {
                    Kind::Loaned
                } else if node.pool() == cfg.inference_pool {
                    Kind::Inference
                } else if node.pool() == cfg.training_pool {
                    Kind::Training
                } else {
                    Kind::Other
                }
            })
            .collect();
        let speed = cluster
            .nodes()
            .map(|node| {
                node.gpu_range()
                    .next()
                    .map_or(1.0, |g| f64::from(cluster.gpu(g).speed_permille()) / 1000.0)
            })
            .collect();
        let mut book = Book {
            kind,
            speed,
            free_whole: vec![0; n],
            used: vec![false; n],
            base: vec![0; n],
            flex: vec![0; n],
        };
        for node in 0..n as u32 {
            book.refresh(cluster, plan, node);
        }
        for job in cluster.running_jobs() {
            for (p, w) in job.placement().iter().enumerate() {
                book.count(job, p, w.node, true);
            }
        }
        book
    }

    fn refresh(&mut self, cluster: &Cluster, plan: &Plan<'_>, node: u32) {
        let Some(slot) = self.free_whole.get_mut(node as usize) else {
            return;
        };
        let range = cluster.node(node).gpu_range();
        *slot = range
            .clone()
            .filter(|&g| plan.free_milli(g) >= FULL_GPU_MILLI)
            .count() as u32;
        self.used[node as usize] = range
            .into_iter()
            .any(|g| plan.free_milli(g) < FULL_GPU_MILLI);
    }

    fn count(&mut self, job: Job<'_>, position: usize, node: u32, add: bool) {
        let n = node as usize;
        let counter = if is_flex_position(job, position) {
            &mut self.flex
        } else {
            &mut self.base
        };
        if let Some(c) = counter.get_mut(n) {
            *c = if add {
                c.saturating_add(1)
            } else {
                c.saturating_sub(1)
            };
        }
    }

    /// Removes a running job's workers at `positions` from the books.
    fn release(&mut self, cluster: &Cluster, plan: &Plan<'_>, job: Job<'_>, positions: &[u32]) {
        for &p in positions {
            if let Some(w) = job.placement().get(p as usize) {
                self.count(job, p as usize, w.node, false);
                self.refresh(cluster, plan, w.node);
            }
        }
    }

    /// Tier of `node` for a worker of `class` (lower is preferred), given the
    /// extra base/flex workers `overlay` adds. §5.3: inelastic jobs prefer
    /// training servers; elastic jobs prefer inference servers, with base and
    /// flexible demand on separate groups of them.
    fn tier(&self, node: usize, class: Class, extra_base: u32, extra_flex: u32) -> Option<u8> {
        let base = self.base[node] + extra_base;
        let flex = self.flex[node] + extra_flex;
        Some(match (class, self.kind[node]) {
            (_, Kind::Inference) => return None,
            (Class::Inelastic, Kind::Training) => 0,
            (Class::Inelastic, Kind::Other) => 1,
            (Class::Inelastic, Kind::Loaned) if flex == 0 => 2,
            (Class::Inelastic, Kind::Loaned) => 3,
            (Class::Base, Kind::Loaned) if flex == 0 => 0,
            (Class::Flex, Kind::Loaned) if base == 0 => 0,
            (Class::Base | Class::Flex, Kind::Training) => 1,
            (Class::Base | Class::Flex, Kind::Other) => 2,
            (Class::Base | Class::Flex, Kind::Loaned) => 3,
        })
    }

    /// Whether Aryl may place training work on `node` at all.
    fn usable(&self, node: usize) -> bool {
        self.kind.get(node).is_some_and(|k| *k != Kind::Inference)
    }
}

/// Resources tentatively taken by the workers of one gang being built.
#[derive(Default)]
struct Overlay {
    /// (gpu, milli, memory MiB).
    gpus: Vec<(u32, u32, u32)>,
    /// (node, cpu milli, memory MiB, whole GPUs, base workers, flex workers).
    nodes: Vec<(u32, u32, u32, u32, u32, u32)>,
}

impl Overlay {
    fn gpu(&self, gpu: u32) -> (u32, u32) {
        self.gpus
            .iter()
            .filter(|e| e.0 == gpu)
            .fold((0, 0), |acc, e| (acc.0 + e.1, acc.1 + e.2))
    }

    fn node(&self, node: u32) -> (u32, u32, u32, u32, u32) {
        self.nodes
            .iter()
            .filter(|e| e.0 == node)
            .fold((0, 0, 0, 0, 0), |a, e| {
                (a.0 + e.1, a.1 + e.2, a.2 + e.3, a.3 + e.4, a.4 + e.5)
            })
    }
}

/// The GPUs of `node` one more worker of `job` would use, fullest first, if
/// the node has room after `overlay`.
fn fit_on_node(plan: &Plan<'_>, job: Job<'_>, node: u32, overlay: &Overlay) -> Option<Vec<u32>> {
    let cluster = plan.cluster();
    let (cpu, mem, _, _, _) = overlay.node(node);
    if plan.free_cpu(node).saturating_sub(cpu) < job.cpu_milli()
        || plan.free_memory(node).saturating_sub(mem) < job.memory_mib()
    {
        return None;
    }
    let need = job.gpus_per_worker() as usize;
    let mut fitting: Vec<(u32, u32)> = Vec::with_capacity(8);
    for g in cluster.node(node).gpu_range() {
        if !job.allows_gpu(g) {
            continue;
        }
        let gpu = cluster.gpu(g);
        let (milli, gmem) = gpu_share(
            job.gpus_per_worker(),
            job.gpu_milli(),
            cluster.job_columns().gpu_memory_mib[job.index() as usize],
            gpu.memory_mib(),
        );
        let (taken_milli, taken_mem) = overlay.gpu(g);
        let free = plan.free_milli(g).saturating_sub(taken_milli);
        if free >= milli && plan.free_gpu_memory(g).saturating_sub(taken_mem) >= gmem {
            fitting.push((free, g));
        }
    }
    if fitting.len() < need {
        return None;
    }
    fitting.sort_unstable();
    Some(fitting.into_iter().take(need).map(|(_, g)| g).collect())
}

/// Best-fit choice of one worker's server (§5.3): the lowest tier for its
/// class; within it a non-empty server before an empty one ("we place each
/// worker of the job into a non-empty server that best fits its demand; if
/// none has sufficient remaining resources, we place it on a new server"),
/// and the one left with the fewest free GPUs.
fn pick_worker(
    plan: &Plan<'_>,
    book: &Book,
    job: Job<'_>,
    class: Class,
    min_speed: f64,
    overlay: &Overlay,
) -> Option<WorkerPlacement> {
    let cluster = plan.cluster();
    let need = per_worker_gpus(job);
    let whole = !job.is_fractional();
    let mut best: Option<((u8, bool, u32, u32), WorkerPlacement)> = None;
    for node in 0..cluster.node_count() as u32 {
        let n = node as usize;
        let (_, _, taken, extra_base, extra_flex) = overlay.node(node);
        let free = book.free_whole[n].saturating_sub(taken);
        if whole && free < need {
            continue;
        }
        if book.speed[n] < min_speed {
            continue;
        }
        let empty = !book.used[n] && taken == 0;
        let Some(tier) = book.tier(n, class, extra_base, extra_flex) else {
            continue;
        };
        let key = (tier, empty, free.saturating_sub(need), node);
        if best.as_ref().is_some_and(|(k, _)| *k <= key) {
            continue;
        }
        if !plan.node_open_for(job.index(), node) {
            continue;
        }
        if let Some(gpus) = fit_on_node(plan, job, node, overlay) {
            best = Some((key, WorkerPlacement { node, gpus }));
        }
    }
    best.map(|(_, w)| w)
}

/// Chooses up to `classes.len()` workers, one per class in order; stops at
/// the first that has no server.
fn choose_workers(
    plan: &Plan<'_>,
    book: &Book,
    job: Job<'_>,
    classes: &[Class],
    min_speed: f64,
) -> Vec<WorkerPlacement> {
    let cluster = plan.cluster();
    let mut overlay = Overlay::default();
    let mut out = Vec::with_capacity(classes.len());
    for &class in classes {
        let Some(w) = pick_worker(plan, book, job, class, min_speed, &overlay) else {
            break;
        };
        let mut whole = 0;
        for &g in &w.gpus {
            let (milli, mem) = gpu_share(
                job.gpus_per_worker(),
                job.gpu_milli(),
                cluster.job_columns().gpu_memory_mib[job.index() as usize],
                cluster.gpu(g).memory_mib(),
            );
            let (taken, _) = overlay.gpu(g);
            if plan.free_milli(g).saturating_sub(taken) >= FULL_GPU_MILLI {
                whole += 1;
            }
            overlay.gpus.push((g, milli, mem));
        }
        let (b, f) = if class == Class::Flex { (0, 1) } else { (1, 0) };
        overlay
            .nodes
            .push((w.node, job.cpu_milli(), job.memory_mib(), whole, b, f));
        out.push(w);
    }
    out
}

/// Applies `decision` and updates the books for the new workers.
fn apply_new_workers(
    plan: &mut Plan<'_>,
    book: &mut Book,
    job: Job<'_>,
    first_position: usize,
    decision: Decision,
) -> bool {
    let nodes: Vec<u32> = match &decision {
        Decision::Place(_, w) | Decision::ScaleOut(_, w) => w.iter().map(|w| w.node).collect(),
        _ => Vec::new(),
    };
    if plan.apply(decision).is_err() {
        return false;
    }
    let cluster = plan.cluster();
    for (i, node) in nodes.into_iter().enumerate() {
        let position = first_position + i;
        let flex = job.is_elastic() && position as u32 >= effective_min(job);
        let counter = if flex { &mut book.flex } else { &mut book.base };
        counter[node as usize] += 1;
        book.refresh(cluster, plan, node);
    }
    true
}

/// Workers of running jobs on nodes being reclaimed must go: a last line of
/// defence for when the reclaim role's plan was not (fully) carried out.
/// Elastic jobs shed them by scale-in when they keep their base demand (§4);
/// otherwise the job is preempted.
fn vacate_reclaiming(cluster: &Cluster, plan: &mut Plan<'_>, book: &mut Book) {
    for job in cluster.running_jobs() {
        let positions: Vec<u32> = job
            .placement()
            .iter()
            .enumerate()
            .filter(|(_, w)| cluster.node(w.node).state() == node_state::RECLAIMING)
            .map(|(p, _)| p as u32)
            .collect();
        if positions.is_empty() {
            continue;
        }
        let current = job.placement().len() as u32;
        let keep = current - positions.len() as u32;
        let decision = if job.is_elastic() && keep >= effective_min(job) {
            Decision::ScaleIn(job.index(), positions.clone())
        } else {
            Decision::Preempt(job.index())
        };
        let all: Vec<u32> = (0..current).collect();
        let released = if matches!(decision, Decision::Preempt(_)) {
            all
        } else {
            positions
        };
        if plan.apply(decision).is_ok() {
            book.release(cluster, plan, job, &released);
        }
    }
}

/// GPUs an inelastic job takes, all workers together.
fn inelastic_gpus(job: Job<'_>) -> u32 {
    job.workers().max(1) * per_worker_gpus(job)
}

/// Run time left and the worker count it holds at: the host's latest
/// report, which starts as the submitted estimate at the submitted size
/// (`false`: unknown, the configured default at the current size).
fn remaining(job: Job<'_>, cfg: &Config) -> (f64, u32, bool) {
    match job.remaining_ms() {
        Some(ms) => (
            ms.max(1) as f64,
            job.progress().remaining_workers.max(1),
            true,
        ),
        None => (cfg.default_estimate_ms as f64, job.workers().max(1), false),
    }
}

/// The fastest and slowest GPUs Aryl may use this round.
#[derive(Clone, Copy)]
struct SpeedRange {
    fastest: f64,
    slowest: f64,
}

impl SpeedRange {
    fn of(book: &Book) -> Self {
        let usable = (0..book.speed.len()).filter(|&n| book.usable(n));
        let (fastest, slowest) = usable
            .map(|n| book.speed[n])
            .fold((0.0f64, f64::INFINITY), |(hi, lo), v| {
                (hi.max(v), lo.min(v))
            });
        if fastest > 0.0 {
            SpeedRange { fastest, slowest }
        } else {
            SpeedRange {
                fastest: 1.0,
                slowest: 1.0,
            }
        }
    }

    fn uniform(&self) -> bool {
        self.slowest >= self.fastest
    }
}

/// When the GPUs of the fastest servers free up: (time left, GPUs) of each
/// running worker on one, soonest first. Known because the contract reports
/// what each running job has left.
fn fast_release_times(
    cluster: &Cluster,
    book: &Book,
    cfg: &Config,
    speeds: SpeedRange,
) -> Vec<(f64, u32)> {
    let mut out = Vec::new();
    for job in cluster.running_jobs() {
        let (left, _, _) = remaining(job, cfg);
        for w in job.placement() {
            let n = w.node as usize;
            if book.usable(n) && book.speed[n] >= speeds.fastest {
                out.push((left, w.gpus.len() as u32));
            }
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The slowest GPUs an inelastic job may run on. A job stretched onto
/// slower servers finishes later than it would on fast ones; it goes there
/// only if the stretch is shorter than its wait for fast GPUs
/// (SlowSpill::IfSooner), or always (SlowSpill::Always, the plain
/// preference of §5.3). The wait is until the fast GPUs that free up cover
/// its own demand and the `ahead` GPUs of jobs before it that this round
/// held back for fast servers.
fn inelastic_min_speed(
    job: Job<'_>,
    cfg: &Config,
    speeds: SpeedRange,
    releases: &[(f64, u32)],
    ahead: u32,
) -> f64 {
    if cfg.slow_spill == SlowSpill::Always || speeds.uniform() {
        return 0.0;
    }
    let need = inelastic_gpus(job) + ahead;
    let (left, _, _) = remaining(job, cfg);
    let stretch = left * (speeds.fastest / speeds.slowest - 1.0);
    let mut freed = 0u32;
    let wait = releases
        .iter()
        .find(|(_, gpus)| {
            freed += gpus;
            freed >= need
        })
        .map_or(f64::INFINITY, |(t, _)| *t);
    if stretch <= wait { 0.0 } else { speeds.fastest }
}

/// Most placement attempts of the backfill pass per round.
const BACKFILL_ATTEMPTS: usize = 64;

/// One scheduling round of Aryl.
pub fn schedule(cluster: &Cluster, round: &RoundInfo, cfg: &Config) -> Vec<Decision> {
    let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
    let mut book = Book::new(cluster, &plan, cfg);
    vacate_reclaiming(cluster, &mut plan, &mut book);

    // ---- Allocation (Algorithm 2) ----
    let mut running = Vec::new();
    let unit = |node: usize| match cfg.capacity {
        Capacity::Gpus => 1.0,
        Capacity::Reference => book.speed[node],
    };
    let mut flexible_gpus = 0.0f64;
    for job in cluster.running_jobs() {
        if !job.is_elastic() || job.kind() != job_kind::TRAINING || plan.is_decided(job.index()) {
            continue;
        }

        let (left, at, _) = remaining(job, cfg);
        running.push(RunningElastic {
            key: job.index() as usize,
            job: ElasticJob::from_estimate(
                effective_min(job),
                job.max_workers(),
                per_worker_gpus(job),
                left,
                at,
                cfg.speedup,
            ),
        });
        for w in &job.placement()[(effective_min(job) as usize).min(job.placement().len())..] {
            flexible_gpus += f64::from(per_worker_gpus(job)) * unit(w.node as usize);
        }
    }
    let mut queued = Vec::new();
    // Aryl schedules training jobs only ("we use “jobs” to simply refer to
    // training jobs", §3); inference services belong to the inference
    // scheduler.
    for job in cluster.pending_jobs() {
        if job.kind() != job_kind::TRAINING {
            continue;
        }
        let (left, at, known) = remaining(job, cfg);
        let (min, max) = if job.is_elastic() {
            (effective_min(job), job.max_workers())
        } else {
            (job.workers(), job.workers())
        };
        if max == 0 {
            continue;
        }
        queued.push(QueuedJob {
            key: job.index() as usize,
            job: ElasticJob::from_estimate(min, max, per_worker_gpus(job), left, at, cfg.speedup),
            runtime_known: known,
            submit_ms: job.submit_ms(),
        });
    }
    let idle: f64 = cluster
        .nodes()
        .filter(|n| n.is_ready() && book.usable(n.index() as usize))
        .map(|n| {
            let i = n.index() as usize;
            f64::from(book.free_whole[i]) * unit(i)
        })
        .sum();
    let params = AllocParams {
        speedup: cfg.speedup,
        max_dp_cells: cfg.max_dp_cells,
    };
    let capacity = (idle + flexible_gpus + 1e-9).floor() as u64;
    let allocation = alloc::allocate(&queued, &running, capacity, params);
    let speeds = SpeedRange::of(&book);
    let releases = if speeds.uniform() {
        Vec::new()
    } else {
        fast_release_times(cluster, &book, cfg, speeds)
    };
    // GPUs of inelastic jobs held back for fast servers so far this round.
    let mut held_back = 0u32;
    let min_speed = |job: Job<'_>, ahead: u32| {
        if job.is_elastic() {
            0.0
        } else {
            inelastic_min_speed(job, cfg, speeds, &releases, ahead)
        }
    };
    // What an unplaced job adds to the queue for the fastest servers.
    let hold = |job: Job<'_>, min_speed: f64| {
        if min_speed > 0.0 {
            inelastic_gpus(job)
        } else {
            0
        }
    };

    // ---- Resizing down: give flexible GPUs back before placing (§5.2) ----
    let mut grow = Vec::new();
    for r in &running {
        let job = cluster.job(r.key as u32);
        let current = job.placement().len() as u32;
        let target = allocation.workers_of(r.key).unwrap_or(current);
        if target > current {
            grow.push((job, target - current));
        } else if target < current {
            // Shed flexible workers on training servers first (they block
            // queued inelastic jobs there), then the newest ones.
            let mut flex: Vec<u32> = (effective_min(job)..current).collect();
            flex.sort_by_key(|&p| {
                let node = job.placement()[p as usize].node as usize;
                (book.kind[node] == Kind::Loaned, std::cmp::Reverse(p))
            });
            flex.truncate((current - target) as usize);
            if plan
                .apply(Decision::ScaleIn(job.index(), flex.clone()))
                .is_ok()
            {
                book.release(cluster, &plan, job, &flex);
            }
        }
    }

    // ---- Placement: best-fit decreasing (§5.3) ----
    // Largest per-worker GPU demand first; SJF order among equals.
    let mut admitted: Vec<(usize, Job<'_>)> = allocation
        .admitted
        .iter()
        .enumerate()
        .map(|(rank, &k)| (rank, cluster.job(k as u32)))
        .collect();
    admitted.sort_by_key(|(rank, job)| (std::cmp::Reverse(per_worker_gpus(*job)), *rank));
    for (_, job) in admitted {
        let target = allocation.workers_of(job.index() as usize).unwrap_or(0);
        let (classes, needed): (Vec<Class>, u32) = if job.is_elastic() {
            let base = effective_min(job);
            let classes = (0..target)
                .map(|i| if i < base { Class::Base } else { Class::Flex })
                .collect();
            (classes, base)
        } else {
            (vec![Class::Inelastic; target as usize], target)
        };
        let floor = min_speed(job, held_back);
        let workers = choose_workers(&plan, &book, job, &classes, floor);
        if (workers.len() as u32) < needed || workers.is_empty() {
            held_back += hold(job, floor);
            continue;
        }
        apply_new_workers(
            &mut plan,
            &mut book,
            job,
            0,
            Decision::Place(job.index(), workers),
        );
    }

    // ---- Backfill ----
    // Phase one counts GPUs in aggregate; an admitted job that fragmentation
    // or its GPU-model mask kept out leaves its share unused. SJF continues
    // over the jobs phase one skipped, with their base demand only, as long
    // as whole GPUs remain ("we remove it from the pool and continue", §5.2).
    // Bounded so a long queue of unplaceable jobs cannot stretch the round.
    let mut free: u64 = (0..cluster.node_count())
        .filter(|&n| book.usable(n) && cluster.node(n as u32).is_ready())
        .map(|n| u64::from(book.free_whole[n]))
        .sum();
    let mut attempts = 0;
    for pos in alloc::sort_jobs(&queued, cfg.speedup) {
        if free == 0 || attempts >= BACKFILL_ATTEMPTS {
            break;
        }
        let job = cluster.job(queued[pos].key as u32);
        if plan.is_decided(job.index()) {
            continue;
        }
        let (classes, base) = if job.is_elastic() {
            (
                vec![Class::Base; effective_min(job) as usize],
                effective_min(job),
            )
        } else {
            (
                vec![Class::Inelastic; job.workers() as usize],
                job.workers(),
            )
        };
        let need = u64::from(base) * u64::from(per_worker_gpus(job));
        if need > free {
            continue;
        }
        attempts += 1;
        let floor = min_speed(job, held_back);
        let workers = choose_workers(&plan, &book, job, &classes, floor);
        if workers.len() as u32 != base || workers.is_empty() {
            held_back += hold(job, floor);
            continue;
        }
        if apply_new_workers(
            &mut plan,
            &mut book,
            job,
            0,
            Decision::Place(job.index(), workers),
        ) {
            free = free.saturating_sub(need);
        }
    }

    // ---- Resizing up: running elastic jobs' new flexible workers ----
    grow.sort_by_key(|(job, _)| (std::cmp::Reverse(per_worker_gpus(*job)), job.index()));
    for (job, add) in grow {
        let workers = choose_workers(&plan, &book, job, &vec![Class::Flex; add as usize], 0.0);
        if workers.is_empty() {
            continue;
        }
        let first = job.placement().len();
        apply_new_workers(
            &mut plan,
            &mut book,
            job,
            first,
            Decision::ScaleOut(job.index(), workers),
        );
    }
    plan.into_decisions()
}
