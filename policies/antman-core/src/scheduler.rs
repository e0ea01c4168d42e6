//! AntMan's global scheduler (§3.2, §3.3 "Global scheduler", Algorithm 1, "Job upgrade").
//!
//! One round, in this order (each step sees the decisions of the steps before it through
//! one [`Plan`], so the round's answer is exactly what the host's validator accepts):
//!
//! 1. **Upgrade** (A9). A running opportunistic (qos 1) job becomes guaranteed
//!    (`set-qos(job, 0)`) once every one of its workers is *ready to upgrade* — its GPUs hold
//!    no guaranteed work and no other job's reservation, so it can be guaranteed where it
//!    runs (A15) — and its tenant's quota holds the whole job. Never part of a job: the
//!    `set-qos` moves all workers or none. Upgrades come first: AntMan "prefers to upgrade
//!    the opportunistic job rather than launch a new one".
//! 2. **Guarantee jobs, fairness first** (A1, A2, A7, A8). Waiting qos-0 jobs whose tenant
//!    has quota for them form one queue per tenant (priority, then arrival); the tenant
//!    whose guaranteed use is the smallest fraction of its quota goes next, one job at a
//!    time. A job is placed on GPUs free of guaranteed work (Algorithm 1 l. 1, 4–6): all
//!    its workers on one node when its locality asks for it and some node is large enough
//!    (the node holding its reservation first, then the fullest that fits), otherwise over
//!    as few nodes as possible. A gang that does not fit holds the free GPUs it can get
//!    (`reserve-gpus`, l. 7–8) — on the one node that can come closest when it must sit on
//!    one node — and keeps and extends them round after round until it fits; placing it
//!    releases them. At most `max_reserving_jobs_per_tenant` jobs of a tenant hold
//!    reservations; a job that holds some and is no longer its tenant's reserving guarantee
//!    job is `unreserve`d (step 4).
//! 3. **Opportunistic jobs** (A3, A4, A6). Waiting qos ≥ 1 jobs go to the least-loaded
//!    GPUs whose utilization over the metric window is below M (Algorithm 1 l. 2–3, 9–10),
//!    reserved GPUs included, as shared work under the operator's sharing rules. A
//!    guaranteed job whose tenant lacks the quota for it and that has waited
//!    `opportunistic_after_s` runs as opportunistic: `set-qos(job, 1)` then `place`, both
//!    in this round (the contract lets a `set-qos` precede one more decision about the
//!    job, checked under the new QoS); it is upgraded later like any other (step 1).
//! 4. **Stale reservations** are released (`unreserve`).
//!
//! The scheduler keeps no state between rounds: everything comes from the view, so a fresh
//! instance after a fault decides the same.
//!
//! What the paper leaves open, and what we chose: the tenant order (lowest used/quota
//! first; an unlimited tenant measured against the cluster), the order inside a queue
//! (priority, then arrival), how many reservations a tenant holds (one by default), which
//! GPUs a guarantee job takes on a node (its reserved ones, then those with the least
//! opportunistic work), and how this round's opportunistic placements count toward a GPU's
//! load (each worker adds its compute share, a whole GPU adding 100 %), so that two
//! opportunistic workers of one round do not both land on the same idle GPU. qos 2
//! (best-effort) jobs are placed like opportunistic ones but never upgraded: the contract's
//! way to say "never occupies the tenant's quota" (§3.3, a job "specified as an
//! opportunistic job").

use crate::config::SchedulerConfig;
use crate::quota::{TenantBook, worker_milli};
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, gpu_share, job_phase, locality, qos};
use arbiter_policy_sdk::prelude::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// The round's decisions.
pub fn schedule(cfg: &SchedulerConfig, cluster: &Cluster, round: &RoundInfo) -> Vec<Decision> {
    let mut r = Round::new(cfg, cluster, round);
    r.upgrade();
    r.guarantee_jobs();
    r.opportunistic_jobs();
    r.release_reservations();
    r.plan.into_decisions()
}

/// What makes two waiting jobs equally hard to place: one that did not fit makes the
/// others of its shape skip the search for the rest of the round (capacity only shrinks
/// within a round).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    workers: u32,
    gpus_per_worker: u32,
    gpu_milli: u32,
    gpu_memory_mib: u32,
    cpu_milli: u32,
    memory_mib: u32,
    model_mask: u64,
    locality: u8,
}

impl Shape {
    fn of(job: &Job<'_>) -> Shape {
        Shape {
            workers: job.workers(),
            gpus_per_worker: job.gpus_per_worker(),
            gpu_milli: job.gpu_milli(),
            gpu_memory_mib: job.gpu_memory_mib(),
            cpu_milli: job.cpu_milli(),
            memory_mib: job.memory_mib(),
            model_mask: job.gpu_model_mask(),
            locality: job.locality(),
        }
    }
}

/// Queue order inside a tenant and among opportunistic jobs: priority, then arrival.
fn queue_key(job: &Job<'_>) -> (Reverse<i32>, u64, u32) {
    (Reverse(job.priority()), job.submit_ms(), job.index())
}

/// How many more workers of `job` the node's CPU and memory hold under `plan`.
fn host_capacity(plan: &Plan<'_>, job: &Job<'_>, node: u32) -> u32 {
    let by = |free: u32, need: u32| free.checked_div(need).unwrap_or(u32::MAX);
    by(plan.free_cpu(node), job.cpu_milli()).min(by(plan.free_memory(node), job.memory_mib()))
}

/// Workers without GPUs, first fit over the nodes open to the job.
fn host_only_workers(plan: &Plan<'_>, job: &Job<'_>) -> Option<Vec<WorkerPlacement>> {
    let want = job.workers() as usize;
    let mut out = Vec::with_capacity(want);
    for node in 0..plan.cluster().node_count() as u32 {
        if out.len() == want {
            break;
        }
        if !plan.node_open_for(job.index(), node) {
            continue;
        }
        let room = (host_capacity(plan, job, node) as usize).min(want - out.len());
        out.extend((0..room).map(|_| WorkerPlacement {
            node,
            gpus: Vec::new(),
        }));
    }
    (out.len() == want && want > 0).then_some(out)
}

/// One node's candidate GPUs for a job (best first) and how many workers it can take.
struct Row {
    node: u32,
    gpus: Vec<u32>,
    workers: u32,
}

struct Round<'a> {
    cfg: &'a SchedulerConfig,
    cluster: &'a Cluster,
    now_ms: u64,
    max_decisions: u32,
    plan: Plan<'a>,
    book: TenantBook,
    /// GPUs of the largest ready node: whether "one node can hold it".
    largest_node_gpus: u32,
    /// Jobs that keep (or were given) a reservation this round.
    reserving: HashSet<u32>,
    /// GPUs this round's `reserve-gpus` gave a job (not in the view until applied).
    reserved_now: HashMap<u32, u32>,
    /// Utilization (percent) and workers this round's opportunistic placements add per GPU.
    added_load: HashMap<u32, (u32, u32)>,
}

impl<'a> Round<'a> {
    fn new(cfg: &'a SchedulerConfig, cluster: &'a Cluster, round: &RoundInfo) -> Round<'a> {
        let largest_node_gpus = cluster
            .nodes()
            .filter(|n| n.is_ready())
            .map(|n| n.gpu_range().len() as u32)
            .max()
            .unwrap_or(0);
        Round {
            cfg,
            cluster,
            now_ms: round.now_ms,
            max_decisions: round.max_decisions,
            plan: Plan::new(cluster).with_max_decisions(round.max_decisions),
            book: TenantBook::of(cluster),
            largest_node_gpus,
            reserving: HashSet::new(),
            reserved_now: HashMap::new(),
            added_load: HashMap::new(),
        }
    }

    /// Whether `n` more decisions would pass the round's limit.
    fn no_room_for(&self, n: usize) -> bool {
        self.plan.decisions().len().saturating_add(n) > self.max_decisions as usize
    }

    /// No guaranteed work on GPU `g` in the tentative state (A15).
    fn no_guaranteed_on(&self, g: u32) -> bool {
        self.plan.free_milli(g) == FULL_GPU_MILLI
    }

    /// No other job holds GPU `g` by a reservation, committed or of this round.
    fn not_held_by_other(&self, job: u32, g: u32) -> bool {
        self.cluster.gpu(g).reserved_by().is_none_or(|h| h == job)
            && self.reserved_now.get(&g).is_none_or(|&h| h == job)
    }

    // ---- 1. upgrade (A9) ----

    fn upgrade(&mut self) {
        if !self.cfg.upgrade || !self.cluster.sharing().enabled() {
            return;
        }
        let mut jobs: Vec<Job<'a>> = self
            .cluster
            .running_jobs()
            .filter(|j| j.qos() == qos::OPPORTUNISTIC)
            .collect();
        jobs.sort_by_key(queue_key);
        for job in jobs {
            if self.no_room_for(1) {
                return;
            }
            let demand = worker_milli(&job).saturating_mul(job.placement().len() as u64);
            if job.placement().is_empty() || !self.book.fits(job.tenant_id(), demand) {
                continue;
            }
            if !self.all_workers_ready(&job) {
                continue;
            }
            if self
                .plan
                .apply(Decision::SetQos(job.index(), qos::GUARANTEED))
                .is_ok()
            {
                self.book
                    .charge(job.tenant_id(), i64::try_from(demand).unwrap_or(i64::MAX));
            }
        }
    }

    /// Every worker of a running job can be guaranteed where it runs: its GPUs hold no
    /// guaranteed work (A15) and no other job's reservation. The plan checks the rest
    /// (capacity, quota) when the `set-qos` is applied.
    fn all_workers_ready(&self, job: &Job<'_>) -> bool {
        job.placement().iter().all(|w| {
            w.gpus.iter().all(|&g| {
                (!self.cfg.one_guaranteed_per_gpu || self.no_guaranteed_on(g))
                    && self.not_held_by_other(job.index(), g)
            })
        })
    }

    // ---- 2. guarantee jobs (A1, A2, A8) ----

    fn guarantee_jobs(&mut self) {
        let mut queues: BTreeMap<u32, VecDeque<Job<'a>>> = BTreeMap::new();
        for job in self.cluster.pending_jobs() {
            if self.plan.qos(job.index()) == qos::GUARANTEED && !self.plan.is_decided(job.index()) {
                queues.entry(job.tenant_id()).or_default().push_back(job);
            }
        }
        for q in queues.values_mut() {
            q.make_contiguous().sort_by_key(queue_key);
        }
        // Each tenant's reserving jobs: those already holding a reservation keep their
        // slot (queue order), so reservations persist across rounds.
        let mut designated: HashSet<u32> = HashSet::new();
        let mut reservers: HashMap<u32, u32> = HashMap::new();
        let cap = self.cfg.max_reserving_jobs_per_tenant;
        for (&tenant, q) in &queues {
            for job in q {
                let holds = !job.reserved_gpus().is_empty() || !job.reserved_nodes().is_empty();
                let count = reservers.entry(tenant).or_default();
                if holds && *count < cap && self.book.fits(tenant, job.gpu_demand_milli()) {
                    designated.insert(job.index());
                    *count += 1;
                }
            }
        }
        let mut failed: HashSet<Shape> = HashSet::new();
        loop {
            if self.no_room_for(1) {
                return;
            }
            // The tenant furthest below its quota goes next (A8).
            let next = queues
                .iter()
                .filter(|(_, q)| !q.is_empty())
                .min_by_key(|(t, _)| (self.book.share_ppm(**t), **t))
                .map(|(t, _)| *t);
            let Some(tenant) = next else { return };
            let Some(job) = queues.get_mut(&tenant).and_then(VecDeque::pop_front) else {
                return;
            };
            if !self.book.fits(tenant, job.gpu_demand_milli()) {
                continue; // not a guarantee job now; step 3 may run it as opportunistic
            }
            if self.place_guaranteed(&job, &mut failed) {
                continue;
            }
            if !self.cfg.reserve {
                continue;
            }
            let count = reservers.entry(tenant).or_default();
            let may = designated.contains(&job.index()) || *count < cap;
            if may && self.reserve_for(&job) {
                if !designated.contains(&job.index()) {
                    *count += 1;
                }
                self.reserving.insert(job.index());
            }
        }
    }

    /// Places a guarantee job if its gang fits now.
    fn place_guaranteed(&mut self, job: &Job<'a>, failed: &mut HashSet<Shape>) -> bool {
        let holds = !job.reserved_gpus().is_empty();
        let shape = Shape::of(job);
        if !holds && failed.contains(&shape) {
            return false;
        }
        let workers = if job.gpus_per_worker() == 0 {
            host_only_workers(&self.plan, job)
        } else {
            self.guaranteed_workers(job)
        };
        let placed =
            workers.is_some_and(|w| self.plan.apply(Decision::Place(job.index(), w)).is_ok());
        if placed {
            let demand = job.gpu_demand_milli();
            self.book
                .charge(job.tenant_id(), i64::try_from(demand).unwrap_or(i64::MAX));
        } else if !holds {
            failed.insert(shape);
        }
        placed
    }

    /// `Some(true)`: all workers on one node (locality asks for it and some node is large
    /// enough); `Some(false)`: as few nodes as possible; `None`: it can never fit (it
    /// requires one node and none is large enough).
    fn one_node(&self, job: &Job<'_>) -> Option<bool> {
        let need = job.workers().saturating_mul(job.gpus_per_worker());
        let fits_one = self.largest_node_gpus >= need;
        match job.locality() {
            locality::REQUIRE_ONE_NODE => fits_one.then_some(true),
            locality::PREFER_ONE_NODE => Some(fits_one),
            _ => Some(false),
        }
    }

    /// The GPUs of each node that can take a guaranteed worker of `job` now, best first:
    /// the job's own reserved GPUs, then those with the least opportunistic work.
    fn guaranteed_rows(&self, job: &Job<'_>) -> Vec<Row> {
        let j = job.index();
        let gpw = job.gpus_per_worker().max(1);
        let fit = self.plan.job_fit(j);
        let mut rows = Vec::new();
        self.plan.each_fitting_node(&fit, |node| {
            let mut gpus: Vec<u32> = self
                .plan
                .fitting_gpus(j, node)
                .filter(|&g| !self.cfg.one_guaranteed_per_gpu || self.no_guaranteed_on(g))
                .filter(|&g| self.not_held_by_other(j, g))
                .collect();
            gpus.sort_by_key(|&g| {
                let gpu = self.cluster.gpu(g);
                (
                    gpu.reserved_by() != Some(j),
                    gpu.shared_workers(),
                    gpu.utilization_pct(),
                    g,
                )
            });
            let workers = (gpus.len() as u32 / gpw).min(host_capacity(&self.plan, job, node));
            if workers > 0 {
                rows.push(Row {
                    node,
                    gpus,
                    workers,
                });
            }
        });
        rows
    }

    /// Algorithm 1 l. 1, 4–6: the gang's workers if it fits now.
    fn guaranteed_workers(&self, job: &Job<'_>) -> Option<Vec<WorkerPlacement>> {
        let n = job.workers();
        let gpw = job.gpus_per_worker() as usize;
        if n == 0 || gpw == 0 {
            return None;
        }
        let one_node = self.one_node(job)?;
        let mut rows = self.guaranteed_rows(job);
        let held_on = |row: &Row| {
            row.gpus
                .iter()
                .filter(|&&g| self.cluster.gpu(g).reserved_by() == Some(job.index()))
                .count()
        };
        let take = |row: &Row, count: u32| -> Vec<WorkerPlacement> {
            row.gpus
                .chunks_exact(gpw)
                .take(count as usize)
                .map(|c| WorkerPlacement {
                    node: row.node,
                    gpus: c.to_vec(),
                })
                .collect()
        };
        if one_node {
            // The node holding its reservation, then the fullest that fits (best fit).
            let best = rows
                .iter()
                .filter(|r| r.workers >= n)
                .max_by_key(|r| (held_on(r), Reverse(r.gpus.len()), Reverse(r.node)))?;
            return Some(take(best, n));
        }
        rows.sort_by_key(|r| (Reverse(r.workers), r.node));
        let mut out = Vec::with_capacity(n as usize);
        for row in &rows {
            let left = n - out.len() as u32;
            if left == 0 {
                break;
            }
            out.extend(take(row, row.workers.min(left)));
        }
        (out.len() as u32 == n).then_some(out)
    }

    /// Whether GPU `g` may be reserved for `job`: its model is allowed, it holds no
    /// guaranteed work, and no other job holds it (or its node).
    fn reservable(&self, job: &Job<'_>, g: u32) -> bool {
        job.allows_gpu(g) && self.no_guaranteed_on(g) && self.not_held_by_other(job.index(), g)
    }

    /// Algorithm 1 l. 7–8 (A2): the job holds the free GPUs it can get until its gang fits.
    /// Whether the job holds a reservation after this round.
    fn reserve_for(&mut self, job: &Job<'a>) -> bool {
        let j = job.index();
        let gpw = job.gpus_per_worker();
        if gpw == 0 || self.no_room_for(1) {
            return false;
        }
        let Some(one_node) = self.one_node(job) else {
            return false;
        };
        let need = job.workers().saturating_mul(gpw) as usize;
        let mut per_node: Vec<(u32, Vec<u32>, usize)> = Vec::new(); // (node, gpus, held)
        for node in self.cluster.nodes() {
            if !node.is_ready() {
                continue;
            }
            if self
                .cluster
                .reserved_by(node.index())
                .is_some_and(|h| h != j)
            {
                continue;
            }
            let mut gpus: Vec<u32> = node
                .gpu_range()
                .filter(|&g| self.reservable(job, g))
                .collect();
            if gpus.is_empty() {
                continue;
            }
            gpus.sort_by_key(|&g| (self.cluster.gpu(g).reserved_by() != Some(j), g));
            let held = gpus
                .iter()
                .filter(|&&g| self.cluster.gpu(g).reserved_by() == Some(j))
                .count();
            per_node.push((node.index(), gpus, held));
        }
        let mut chosen: Vec<u32> = Vec::with_capacity(need);
        if one_node {
            let best = per_node
                .iter()
                .max_by_key(|(node, gpus, held)| (gpus.len().min(need), *held, Reverse(*node)));
            if let Some((_, gpus, _)) = best {
                chosen.extend(gpus.iter().take(need));
            }
        } else {
            per_node.sort_by_key(|(node, gpus, held)| {
                (Reverse(gpus.len().min(need)), Reverse(*held), *node)
            });
            for (_, gpus, _) in &per_node {
                let left = need - chosen.len();
                if left == 0 {
                    break;
                }
                chosen.extend(gpus.iter().take(left));
            }
        }
        if chosen.is_empty() {
            return false;
        }
        chosen.sort_unstable();
        let mut held: Vec<u32> = job.reserved_gpus().to_vec();
        held.sort_unstable();
        if chosen != held
            && self
                .plan
                .apply(Decision::ReserveGpus(j, chosen.clone()))
                .is_err()
        {
            return false;
        }
        for g in chosen {
            self.reserved_now.insert(g, j);
        }
        true
    }

    // ---- 3. opportunistic jobs (A3, A4, A6) ----

    /// A6: a guaranteed job whose tenant lacks the quota for it and that has queued long
    /// enough runs as opportunistic (only where opportunistic work is shared work).
    fn due_for_opportunistic(&self, job: &Job<'_>) -> bool {
        self.cfg.auto_opportunistic
            && self.cluster.sharing().enabled()
            && !self.book.fits(job.tenant_id(), job.gpu_demand_milli())
            && self.now_ms.saturating_sub(job.submit_ms())
                >= self.cfg.opportunistic_after_s.saturating_mul(1000)
    }

    fn opportunistic_jobs(&mut self) {
        let mut jobs: Vec<(Job<'a>, bool)> = Vec::new();
        for job in self.cluster.pending_jobs() {
            if self.plan.is_decided(job.index()) {
                continue;
            }
            if self.plan.qos(job.index()) != qos::GUARANTEED {
                jobs.push((job, false));
            } else if self.due_for_opportunistic(&job) {
                jobs.push((job, true));
            }
        }
        jobs.sort_by_key(|(j, _)| queue_key(j));
        // Shapes that found no room; only where every opportunistic job is shared work
        // (with sharing off, quotas make placements depend on the tenant too).
        let memo = self.cluster.sharing().enabled();
        let mut failed: HashSet<Shape> = HashSet::new();
        for (job, convert) in jobs {
            if self.no_room_for(if convert { 2 } else { 1 }) {
                continue;
            }
            let shape = Shape::of(&job);
            if memo && failed.contains(&shape) {
                continue;
            }
            let placed = if convert {
                self.convert_and_place(&job)
            } else {
                self.place_opportunistic(&job)
            };
            if !placed {
                failed.insert(shape);
            }
        }
    }

    fn place_opportunistic(&mut self, job: &Job<'a>) -> bool {
        let Some(workers) = self.opportunistic_workers(&self.plan, job) else {
            return false;
        };
        if self
            .plan
            .apply(Decision::Place(job.index(), workers.clone()))
            .is_err()
        {
            return false;
        }
        self.note_load(job, &workers);
        true
    }

    /// `set-qos(job, 1)` then `place`, both or neither.
    fn convert_and_place(&mut self, job: &Job<'a>) -> bool {
        let mut trial = self.plan.clone();
        if trial
            .apply(Decision::SetQos(job.index(), qos::OPPORTUNISTIC))
            .is_err()
        {
            return false;
        }
        let Some(workers) = self.opportunistic_workers(&trial, job) else {
            return false;
        };
        if trial
            .apply(Decision::Place(job.index(), workers.clone()))
            .is_err()
        {
            return false;
        }
        self.plan = trial;
        self.note_load(job, &workers);
        true
    }

    /// A GPU's load for opportunistic placement: its utilization over the metric window
    /// plus what this round's opportunistic placements add.
    fn load_pct(&self, g: u32) -> u32 {
        let added = self.added_load.get(&g).map_or(0, |a| a.0);
        u32::from(self.cluster.gpu(g).utilization_pct()).saturating_add(added)
    }

    /// The ordering key of a candidate GPU: load, then fewest shared workers, then least
    /// allocated (what decides when no utilization is reported), then index.
    fn load_key(&self, g: u32) -> (u32, u32, u32, u32) {
        let gpu = self.cluster.gpu(g);
        let workers = gpu
            .shared_workers()
            .saturating_add(self.added_load.get(&g).map_or(0, |a| a.1));
        (
            self.load_pct(g),
            workers,
            gpu.milli_used().saturating_add(gpu.shared_milli()),
            g,
        )
    }

    /// Algorithm 1 l. 2–3, 9–10: each worker on the freest candidate GPUs (utilization
    /// below M), reserved GPUs included (the plan lets shared work use them).
    fn opportunistic_workers(
        &self,
        plan: &Plan<'_>,
        job: &Job<'_>,
    ) -> Option<Vec<WorkerPlacement>> {
        let j = job.index();
        let n = job.workers();
        let gpw = job.gpus_per_worker() as usize;
        if n == 0 {
            return None;
        }
        if gpw == 0 {
            return host_only_workers(plan, job);
        }
        let threshold = u32::from(self.cfg.utilization_threshold_pct);
        let fit = plan.job_fit(j);
        // Per node: candidate GPUs, freest first, and the workers its host takes.
        let mut rows: Vec<(u32, VecDeque<u32>, u32)> = Vec::new();
        plan.each_fitting_node(&fit, |node| {
            let mut gpus: Vec<u32> = plan
                .fitting_gpus(j, node)
                .filter(|&g| self.load_pct(g) < threshold)
                .collect();
            if gpus.len() < gpw {
                return;
            }
            gpus.sort_by_key(|&g| self.load_key(g));
            let host = host_capacity(plan, job, node);
            if host > 0 {
                rows.push((node, gpus.into(), host));
            }
        });
        let score = |gpus: &VecDeque<u32>, k: usize| -> u32 {
            gpus.iter().take(k).map(|&g| self.load_pct(g)).sum()
        };
        if job.locality() == locality::REQUIRE_ONE_NODE {
            let need = gpw * n as usize;
            let (node, gpus, _) = rows
                .iter()
                .filter(|(_, gpus, host)| gpus.len() >= need && *host >= n)
                .min_by_key(|(node, gpus, _)| (score(gpus, need), *node))?;
            let gpus: Vec<u32> = gpus.iter().copied().take(need).collect();
            return Some(
                gpus.chunks_exact(gpw)
                    .map(|c| WorkerPlacement {
                        node: *node,
                        gpus: c.to_vec(),
                    })
                    .collect(),
            );
        }
        // minLoadNodes: one worker at a time on the node whose freest GPUs are freest.
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let best = rows
                .iter_mut()
                .filter(|(_, gpus, host)| gpus.len() >= gpw && *host > 0)
                .min_by_key(|(node, gpus, _)| (score(gpus, gpw), *node))?;
            let gpus: Vec<u32> = best.1.drain(..gpw).collect();
            best.2 -= 1;
            out.push(WorkerPlacement { node: best.0, gpus });
        }
        Some(out)
    }

    /// Counts this round's opportunistic workers toward their GPUs' load.
    fn note_load(&mut self, job: &Job<'_>, workers: &[WorkerPlacement]) {
        let (milli, _) = gpu_share(job.gpus_per_worker(), job.gpu_milli(), 0, 0);
        let pct = milli.div_ceil(10);
        for w in workers {
            for &g in &w.gpus {
                let entry = self.added_load.entry(g).or_default();
                entry.0 = entry.0.saturating_add(pct);
                entry.1 = entry.1.saturating_add(1);
            }
        }
    }

    // ---- 4. stale reservations ----

    fn release_reservations(&mut self) {
        let stale: Vec<u32> = self
            .cluster
            .pending_jobs()
            .filter(|j| {
                j.phase() == job_phase::RESERVED
                    && !self.reserving.contains(&j.index())
                    && !self.plan.is_decided(j.index())
            })
            .map(|j| j.index())
            .collect();
        for job in stale {
            if self.no_room_for(1) {
                return;
            }
            let _ = self.plan.apply(Decision::Unreserve(job));
        }
    }
}
