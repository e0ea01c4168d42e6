//! One round of the capacity scheduler.
//!
//! 1. **Within capacity.** Among the tenants whose queue head fits their capacity (used +
//!    the head's GPUs ≤ quota), the one with the lowest used/capacity starts its head, if
//!    the gang fits on free GPUs; repeat. A head that does not fit blocks its queue for the
//!    round (FIFO). With `preemption`, it first tries to make room (below).
//! 2. **Elastic capacity.** Unless a job within its tenant's capacity is waiting for GPUs
//!    and `hold_idle_for_quota` keeps the idle GPUs for it, the remaining queue heads —
//!    every one beyond its tenant's capacity now — borrow free GPUs, lowest used/capacity
//!    first (tenants without capacity last, least used first among them); a head that does
//!    not fit blocks its queue.
//!
//! **Preemption** (`preemption = true`, AntMan's "YARN-CS-preempt"). A head within its
//! tenant's capacity that does not fit may preempt running jobs of tenants above their
//! capacity (a tenant without a quota row is above it with any GPU), most recently started
//! first, a victim only while its tenant is still above its capacity (YARN reclaims
//! over-capacity use only; a gang is taken whole, so the last victim may take its tenant
//! below). The shortest such prefix after which the head fits is taken, then every victim
//! the head does not need is spared (the oldest-started tried first), so the preemptions
//! are just enough; if no prefix makes it fit, nothing is preempted.
//!
//! Every decision goes through one [`Plan`], so the answer is exactly what the host's
//! validator accepts. The round keeps no state: a fresh instance decides the same.
//!
//! What YARN-CS (and AntMan's description of it) leaves open, and what we chose: a tenant
//! without a quota row has capacity 0 (the paper's "no quota" tenant; the contract would
//! call it unlimited); a tenant's use counts whole GPUs held by any of its running jobs,
//! whatever their QoS; the queue order is priority, then arrival (YARN's FIFO ordering
//! policy); used/capacity ties go to the tenant using fewer GPUs, then the lower string id;
//! within a node the lowest-indexed free GPUs; preemption victims of the same start time
//! go highest job index first (the later arrival).

use crate::config::Config;
use arbiter_policy_sdk::model::{FULL_GPU_MILLI, job_phase, locality, qos};
use arbiter_policy_sdk::prelude::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// The round's decisions.
pub fn schedule(cfg: &Config, cluster: &Cluster, round: &RoundInfo) -> Vec<Decision> {
    let mut queues: BTreeMap<u32, VecDeque<Job<'_>>> = BTreeMap::new();
    for job in cluster.pending_jobs() {
        queues.entry(job.tenant_id()).or_default().push_back(job);
    }
    for q in queues.values_mut() {
        q.make_contiguous().sort_by_key(queue_key);
    }
    let mut r = Round {
        cfg,
        cluster,
        state: State::new(cluster, round.max_decisions),
        queues,
        blocked: HashSet::new(),
        quota_job_waits: false,
    };
    r.within_capacity();
    if !(cfg.hold_idle_for_quota && r.quota_job_waits) {
        r.borrow_idle();
    }
    r.state.plan.into_decisions()
}

/// FIFO within a queue: priority, then arrival, then index.
fn queue_key(job: &Job<'_>) -> (Reverse<i32>, u64, u32) {
    (Reverse(job.priority()), job.submit_ms(), job.index())
}

/// GPUs a running job holds, in milli-GPU (whole GPUs: YARN-CS gives nothing less).
fn held_milli(job: &Job<'_>) -> u64 {
    let gpus: usize = job.placement().iter().map(|w| w.gpus.len()).sum();
    gpus as u64 * u64::from(FULL_GPU_MILLI)
}

/// GPUs a pending job will hold once started, in milli-GPU.
fn demand_milli(job: &Job<'_>) -> u64 {
    u64::from(job.workers()) * u64::from(job.gpus_per_worker()) * u64::from(FULL_GPU_MILLI)
}

/// How many more workers of `job` the node's CPU and memory hold under `plan`.
fn host_capacity(plan: &Plan<'_>, job: &Job<'_>, node: u32) -> u32 {
    let by = |free: u32, need: u32| free.checked_div(need).unwrap_or(u32::MAX);
    by(plan.free_cpu(node), job.cpu_milli()).min(by(plan.free_memory(node), job.memory_mib()))
}

/// Whether the gang could start on the cluster's ready nodes if they were empty: a job
/// that never can does not hold idle GPUs back from the others.
fn could_ever_fit(cluster: &Cluster, job: &Job<'_>) -> bool {
    let gpw = job.gpus_per_worker();
    let by = |cap: u32, need: u32| cap.checked_div(need).unwrap_or(u32::MAX);
    let (mut total, mut most) = (0u64, 0u32);
    for node in cluster.nodes().filter(|n| n.is_ready()) {
        let host =
            by(node.cpu_milli(), job.cpu_milli()).min(by(node.memory_mib(), job.memory_mib()));
        let gpus = node.gpu_range().filter(|&g| job.allows_gpu(g)).count() as u32;
        let slots = host.min(by(gpus, gpw));
        total = total.saturating_add(u64::from(slots));
        most = most.max(slots);
    }
    if job.locality() == locality::REQUIRE_ONE_NODE {
        most >= job.workers()
    } else {
        total >= u64::from(job.workers())
    }
}

/// Tenants' capacities and the GPUs their running jobs hold (milli-GPU, by tenant string id).
#[derive(Clone, Debug, Default)]
struct Book {
    capacity: HashMap<u32, u64>,
    used: HashMap<u32, u64>,
}

impl Book {
    fn of(cluster: &Cluster) -> Book {
        let t = cluster.tenant_columns();
        let capacity = t
            .name
            .iter()
            .copied()
            .zip(t.gpu_quota_milli.iter().copied())
            .collect();
        let mut used: HashMap<u32, u64> = HashMap::new();
        for job in cluster.running_jobs() {
            let entry = used.entry(job.tenant_id()).or_default();
            *entry = entry.saturating_add(held_milli(&job));
        }
        Book { capacity, used }
    }

    /// The tenant's capacity; 0 without a quota row.
    fn capacity(&self, tenant: u32) -> u64 {
        self.capacity.get(&tenant).copied().unwrap_or(0)
    }

    fn used(&self, tenant: u32) -> u64 {
        self.used.get(&tenant).copied().unwrap_or(0)
    }

    /// Whether `milli` more keeps the tenant within its capacity.
    fn within(&self, tenant: u32, milli: u64) -> bool {
        self.used(tenant).saturating_add(milli) <= self.capacity(tenant)
    }

    /// Whether the tenant holds more than its capacity.
    fn over(&self, tenant: u32) -> bool {
        self.used(tenant) > self.capacity(tenant)
    }

    /// Fairest first: lowest used/capacity (parts per million), tenants without capacity
    /// last; then fewer GPUs held; then the string id.
    fn order(&self, tenant: u32) -> (bool, u128, u64, u32) {
        let (cap, used) = (self.capacity(tenant), self.used(tenant));
        let ratio = match cap {
            0 => 0,
            c => u128::from(used) * 1_000_000 / u128::from(c),
        };
        (cap == 0, ratio, used, tenant)
    }

    fn charge(&mut self, tenant: u32, milli: u64, add: bool) {
        let used = self.used.entry(tenant).or_default();
        *used = if add {
            used.saturating_add(milli)
        } else {
            used.saturating_sub(milli)
        };
    }
}

/// One node's free GPUs for a job and how many of its workers the node can take.
struct Row {
    node: u32,
    gpus: Vec<u32>,
    slots: u32,
}

/// The round's tentative state: the plan, which GPUs hold work, the tenants' books.
#[derive(Clone)]
struct State<'a> {
    cluster: &'a Cluster,
    plan: Plan<'a>,
    max_decisions: u32,
    /// Per GPU: workers of any job on it, with this round's decisions.
    busy: Vec<u32>,
    book: Book,
}

impl<'a> State<'a> {
    fn new(cluster: &'a Cluster, max_decisions: u32) -> State<'a> {
        let mut busy = vec![0u32; cluster.gpu_count()];
        for job in cluster.running_jobs() {
            for w in job.placement() {
                for &g in &w.gpus {
                    if let Some(b) = busy.get_mut(g as usize) {
                        *b += 1;
                    }
                }
            }
        }
        State {
            cluster,
            plan: Plan::new(cluster).with_max_decisions(max_decisions),
            max_decisions,
            busy,
            book: Book::of(cluster),
        }
    }

    /// No more decisions fit the round.
    fn full(&self) -> bool {
        self.plan.decisions().len() >= self.max_decisions as usize
    }

    /// GPU `g` can go to a worker of job `j` alone: nothing runs on it, no other job holds
    /// it, and the plan takes the worker there under the job's QoS in `plan`.
    fn free_for(&self, plan: &Plan<'a>, j: u32, g: u32) -> bool {
        self.busy.get(g as usize) == Some(&0)
            && self.cluster.gpu_reserved_by(g).is_none_or(|h| h == j)
            && plan.gpu_fits(j, g)
    }

    /// The gang's workers on free GPUs: on one node if one has room for all of them (the
    /// one with the fewest free slots that does), else over the fewest nodes (most free
    /// slots first), unless the job requires one node.
    fn gang_workers(&self, plan: &Plan<'a>, job: &Job<'a>) -> Option<Vec<WorkerPlacement>> {
        let j = job.index();
        let n = job.workers();
        let gpw = job.gpus_per_worker() as usize;
        if n == 0 {
            return None;
        }
        let mut rows: Vec<Row> = Vec::new();
        for node in self.cluster.nodes() {
            let at = node.index();
            if !node.is_ready() || self.cluster.reserved_by(at).is_some_and(|h| h != j) {
                continue;
            }
            let host = host_capacity(plan, job, at);
            if host == 0 {
                continue;
            }
            let gpus: Vec<u32> = if gpw == 0 {
                Vec::new()
            } else {
                node.gpu_range()
                    .filter(|&g| self.free_for(plan, j, g))
                    .collect()
            };
            // Host-only workers (no GPUs) are bounded by the host alone.
            let slots = gpus
                .len()
                .checked_div(gpw)
                .map_or(host, |s| u32::try_from(s).unwrap_or(u32::MAX).min(host));
            if slots > 0 {
                rows.push(Row {
                    node: at,
                    gpus,
                    slots,
                });
            }
        }
        let take = |row: &Row, count: u32| -> Vec<WorkerPlacement> {
            (0..count as usize)
                .map(|k| WorkerPlacement {
                    node: row.node,
                    gpus: row
                        .gpus
                        .get(k * gpw..(k + 1) * gpw)
                        .map(<[u32]>::to_vec)
                        .unwrap_or_default(),
                })
                .collect()
        };
        if let Some(best) = rows
            .iter()
            .filter(|r| r.slots >= n)
            .min_by_key(|r| (r.slots, r.node))
        {
            return Some(take(best, n));
        }
        if job.locality() == locality::REQUIRE_ONE_NODE {
            return None;
        }
        rows.sort_by_key(|r| (Reverse(r.slots), r.node));
        let mut out = Vec::with_capacity(n as usize);
        for row in &rows {
            let left = n.saturating_sub(out.len() as u32);
            if left == 0 {
                break;
            }
            out.extend(take(row, row.slots.min(left)));
        }
        (out.len() as u32 == n).then_some(out)
    }

    /// The accounts to try for a placement, best first (see the crate docs): within
    /// capacity guaranteed, then the job's own QoS; beyond it the job's own QoS, then the
    /// other account. Without sharing, QoS changes nothing: the job's own only.
    fn qos_options(&self, job: &Job<'_>, within: bool) -> Vec<u8> {
        let own = self.plan.qos(job.index());
        if !self.cluster.sharing().enabled() {
            return vec![own];
        }
        let (first, second) = if within {
            (qos::GUARANTEED, own)
        } else if own == qos::GUARANTEED {
            (own, qos::OPPORTUNISTIC)
        } else {
            (own, qos::GUARANTEED)
        };
        if first == second {
            vec![first]
        } else {
            vec![first, second]
        }
    }

    /// Starts the job on free GPUs if its gang fits (with a `set-qos` first where the
    /// account must change); whether it started.
    fn place(&mut self, job: &Job<'a>, within: bool) -> bool {
        let j = job.index();
        for q in self.qos_options(job, within) {
            if q == self.plan.qos(j) {
                let Some(workers) = self.gang_workers(&self.plan, job) else {
                    continue;
                };
                if self.plan.apply(Decision::Place(j, workers.clone())).is_ok() {
                    self.occupy(job, &workers);
                    return true;
                }
            } else {
                let mut trial = self.plan.clone();
                if trial.apply(Decision::SetQos(j, q)).is_err() {
                    continue;
                }
                let Some(workers) = self.gang_workers(&trial, job) else {
                    continue;
                };
                if trial.apply(Decision::Place(j, workers.clone())).is_ok() {
                    self.plan = trial;
                    self.occupy(job, &workers);
                    return true;
                }
            }
        }
        false
    }

    fn occupy(&mut self, job: &Job<'_>, workers: &[WorkerPlacement]) {
        for w in workers {
            for &g in &w.gpus {
                if let Some(b) = self.busy.get_mut(g as usize) {
                    *b += 1;
                }
            }
        }
        self.book.charge(job.tenant_id(), demand_milli(job), true);
    }

    /// Preempts a running job; whether the plan took it.
    fn preempt(&mut self, victim: &Job<'_>) -> bool {
        if self.plan.apply(Decision::Preempt(victim.index())).is_err() {
            return false;
        }
        for w in victim.placement() {
            for &g in &w.gpus {
                if let Some(b) = self.busy.get_mut(g as usize) {
                    *b = b.saturating_sub(1);
                }
            }
        }
        self.book
            .charge(victim.tenant_id(), held_milli(victim), false);
        true
    }

    /// This state with `victims` preempted in order, each while its tenant is above its
    /// capacity; `None` if one cannot be.
    fn with_preempted(&self, victims: &[Job<'a>]) -> Option<State<'a>> {
        let mut s = self.clone();
        for v in victims {
            if !s.book.over(v.tenant_id()) || !s.preempt(v) {
                return None;
            }
        }
        Some(s)
    }
}

struct Round<'a> {
    cfg: &'a Config,
    cluster: &'a Cluster,
    state: State<'a>,
    /// Per tenant: its pending jobs in queue order, not yet tried this round.
    queues: BTreeMap<u32, VecDeque<Job<'a>>>,
    /// Tenants whose head did not fit: nothing behind it starts this round.
    blocked: HashSet<u32>,
    /// A job within its tenant's capacity waits for GPUs (and could fit the cluster).
    quota_job_waits: bool,
}

impl<'a> Round<'a> {
    /// The next tenant to serve: unblocked, with a head `eligible` says may go, fairest.
    fn next_tenant(&self, eligible: impl Fn(u32, &Job<'a>) -> bool) -> Option<u32> {
        self.queues
            .iter()
            .filter(|(t, q)| {
                !self.blocked.contains(*t) && q.front().is_some_and(|head| eligible(**t, head))
            })
            .min_by_key(|(t, _)| self.state.book.order(**t))
            .map(|(t, _)| *t)
    }

    /// Step 1: heads within their tenant's capacity, fairest tenant first.
    fn within_capacity(&mut self) {
        while !self.state.full() {
            let book = &self.state.book;
            let Some(tenant) = self.next_tenant(|t, head| book.within(t, demand_milli(head)))
            else {
                return;
            };
            let Some(job) = self.queues.get_mut(&tenant).and_then(VecDeque::pop_front) else {
                return;
            };
            if self.state.place(&job, true) {
                continue;
            }
            if !could_ever_fit(self.cluster, &job) {
                continue; // it would block its queue forever: the jobs behind it go on
            }
            if self.cfg.preemption && self.preempt_for(&job) {
                continue;
            }
            self.blocked.insert(tenant);
            self.quota_job_waits = true;
        }
    }

    /// Step 2: the remaining heads borrow idle GPUs, fairest tenant first.
    fn borrow_idle(&mut self) {
        while !self.state.full() {
            let Some(tenant) = self.next_tenant(|_, _| true) else {
                return;
            };
            let Some(job) = self.queues.get_mut(&tenant).and_then(VecDeque::pop_front) else {
                return;
            };
            let within = self.state.book.within(tenant, demand_milli(&job));
            if !self.state.place(&job, within) && could_ever_fit(self.cluster, &job) {
                self.blocked.insert(tenant);
            }
        }
    }

    /// YARN-CS-preempt: just enough over-capacity work, newest first, for `job` to start.
    fn preempt_for(&mut self, job: &Job<'a>) -> bool {
        let state = &self.state;
        let mut victims: Vec<Job<'a>> = self
            .cluster
            .running_jobs()
            .filter(|v| {
                !state.plan.is_decided(v.index())
                    && state.plan.phase(v.index()) == job_phase::RUNNING
                    && state.book.over(v.tenant_id())
                    && held_milli(v) > 0
            })
            .collect();
        victims.sort_by_key(|v| (Reverse(v.progress().started_ms), Reverse(v.index())));
        // The shortest prefix, newest first, after which the job fits.
        let mut trial = state.clone();
        let mut chosen: Vec<Job<'a>> = Vec::new();
        let mut fits = false;
        for v in &victims {
            if !trial.book.over(v.tenant_id()) || !trial.preempt(v) {
                continue;
            }
            chosen.push(*v);
            if trial.clone().place(job, true) {
                fits = true;
                break;
            }
        }
        if !fits {
            return false;
        }
        // Just enough: spare every victim, oldest-started first, the job does not need.
        let mut keep = chosen.clone();
        for v in chosen.iter().rev() {
            let without: Vec<Job<'a>> = keep
                .iter()
                .filter(|k| k.index() != v.index())
                .copied()
                .collect();
            if state
                .with_preempted(&without)
                .is_some_and(|mut s| s.place(job, true))
            {
                keep = without;
            }
        }
        let Some(mut s) = state.with_preempted(&keep) else {
            return false;
        };
        if !s.place(job, true) {
            return false;
        }
        self.state = s;
        true
    }
}
