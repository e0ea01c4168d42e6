//! DynamoML (Chiang & Chou, CLOSER '21) as a `scheduler` policy, and the
//! Kubernetes configurations the paper compares it with (its Table 2), on
//! one body with three switches:
//!
//! * **GPU sharing** (§3.1, the shared GPU allocator): a fractional job takes
//!   its share of a GPU and shares it, packed onto GPUs that already hold
//!   shared work, never over-allocated (the validator's rule). Without it a
//!   fractional job gets a GPU nobody else uses — Kubernetes' device plugin
//!   hands out whole devices.
//! * **Training scheduling** (§3.2): a training job starts only when all its
//!   workers fit (gang), packed on as few nodes as possible (one, whenever
//!   one node has the GPUs); when nothing waits, running elastic jobs grow a
//!   worker at a time on their own node, fewest workers first, up to their
//!   maximum; a waiting job is started by taking back the workers others got
//!   beyond what they were submitted with; a checkpointed job that has run
//!   `preempt_after_s` gives way to one that has waited as long
//!   (monopolisation, §2.2). Without it Kubernetes' default scheduler
//!   places a job's worker pods one by one, each on the least-allocated
//!   node (its default scoring), so a job's workers spread over nodes, and
//!   a job starts with the pods that fit: it holds fewer workers than it
//!   asked for until the rest are placed, oldest job first (§5: under
//!   K8S+Scaling training jobs are "blocked or running with few GPUs").
//!   `k8s_gang_scheduling` makes that all-or-nothing instead (a gang
//!   plugin such as kube-batch or Volcano). Only elastic jobs can start
//!   short: the contract places an inelastic job whole or not at all.
//! * **Inference autoscaling** (§3.3): HPA on requests per second and the
//!   response time against the job's objective ([`autoscale`]); replicas
//!   are whole GPUs. Inference has the highest priority: with
//!   `borrow_from_training`, when no GPU is free, training workers are
//!   evicted one by one (scale-in of the job with the most workers, never its
//!   chief at position 0) to make room, and the GPUs go back to training when
//!   inference shrinks (the growth above). Without it a service grows only
//!   into free GPUs.
//!
//! Every round serves the inference jobs first, then other pending work
//! (notebooks), then training. The paper gives no thresholds; the defaults
//! (`Config::default`) are ours and documented there.

pub mod autoscale;
mod rooms;

use arbiter_policy_sdk::model::job_kind;
use arbiter_policy_sdk::prelude::*;
use autoscale::{ServiceLoad, desired_replicas};
use rooms::Rooms;
use serde::Deserialize;
use std::collections::HashMap;
use std::marker::PhantomData;

#[doc(hidden)]
pub use arbiter_policy_sdk as __sdk;

/// What the policy does; every field may be left out of a configuration.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Gang + pack + elastic training (§3.2).
    pub training_scheduler: bool,
    /// Inference replica autoscaling (§3.3).
    pub inference_scaling: bool,
    /// Fractional GPU sharing (§3.1).
    pub gpu_sharing: bool,
    /// Inference may evict training workers (never a chief) to grow.
    pub borrow_from_training: bool,
    /// HPA target: requests per second one replica should serve (ours: 20).
    pub target_requests_per_replica: f64,
    /// Scale out when p99 latency passes this percentage of the objective (ours: 80).
    pub latency_target_pct: u32,
    /// HPA tolerance band, percent (Kubernetes' default: 10).
    pub tolerance_pct: u32,
    /// A service shrinks only after wanting fewer replicas this long
    /// (HPA's scale-down stabilisation; ours: 60 s, Kubernetes' is 300 s).
    pub scale_down_delay_s: u64,
    /// A checkpointed training job that has run this long may be preempted
    /// for one that has waited this long; 0: never (ours: 1800 s).
    pub preempt_after_s: u64,
    /// Without the training scheduler: a job's pods start all together or
    /// not at all (a gang-scheduling plugin) rather than one by one
    /// (Kubernetes' default scheduler; the default, false).
    pub k8s_gang_scheduling: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            training_scheduler: true,
            inference_scaling: true,
            gpu_sharing: true,
            borrow_from_training: true,
            target_requests_per_replica: 20.0,
            latency_target_pct: 80,
            tolerance_pct: 10,
            scale_down_delay_s: 60,
            preempt_after_s: 1800,
            k8s_gang_scheduling: false,
        }
    }
}

impl Config {
    /// Parses and checks a TOML document (missing keys keep the values of
    /// [`Config::default`]).
    pub fn parse(text: &str) -> Result<Config, PolicyError> {
        Self::parse_over("", text)
    }

    /// Parses `text` over `defaults` (both TOML): a key `text` leaves out
    /// keeps its value in `defaults`, then in [`Config::default`].
    pub fn parse_over(defaults: &str, text: &str) -> Result<Config, PolicyError> {
        let bad = |e: toml::de::Error| PolicyError::Failed(format!("bad configuration: {e}"));
        let mut table: toml::Table = defaults.parse().map_err(bad)?;
        let given: toml::Table = text.parse().map_err(bad)?;
        table.extend(given);
        let cfg: Config = table.try_into().map_err(|e: toml::de::Error| bad(e))?;
        if !(cfg.target_requests_per_replica.is_finite() && cfg.target_requests_per_replica > 0.0) {
            return Err(PolicyError::Failed(
                "`target_requests_per_replica` must be positive".into(),
            ));
        }
        if !(1..=1000).contains(&cfg.latency_target_pct) {
            return Err(PolicyError::Failed(
                "`latency_target_pct` must be in 1..=1000".into(),
            ));
        }
        if cfg.tolerance_pct >= 100 {
            return Err(PolicyError::Failed(
                "`tolerance_pct` must be below 100".into(),
            ));
        }
        Ok(cfg)
    }
}

/// A named configuration of the body: the component's name, summary and
/// default configuration.
pub trait Preset: 'static {
    const NAME: &'static str;
    const SUMMARY: &'static str;
    const DEFAULT_CONFIG: &'static str;
}

/// The policy body; a component crate exports it under a [`Preset`] with
/// [`dynamoml_policy!`].
pub struct Dynamo<P: Preset> {
    cfg: Config,
    /// The worker count each training job was submitted with, by name:
    /// workers beyond it are what a waiting job may take back.
    initial: HashMap<String, u32>,
    /// Since when each service has wanted fewer replicas, by name.
    shrink_since: HashMap<String, u64>,
    _preset: PhantomData<fn() -> P>,
}

/// Exports `Dynamo<$preset>` as the crate's component under the name `$policy`.
#[macro_export]
macro_rules! dynamoml_policy {
    ($policy:ident = $preset:ident) => {
        /// The exported policy type.
        pub type $policy = $crate::Dynamo<$preset>;

        $crate::__sdk::export_policy!($policy);
    };
}

/// A running training job with workers beyond its submitted count on one node.
struct Donor {
    job: u32,
    /// All its workers (the biggest donor gives first).
    workers: u32,
    /// Its removable positions on the node, highest first (never the chief, 0).
    positions: Vec<u32>,
    gpus_per_worker: u32,
}

impl<P: Preset> Dynamo<P> {
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Learns the submitted worker counts of new training jobs and forgets
    /// jobs that left.
    fn observe(&mut self, cluster: &Cluster) {
        let mut live: HashMap<&str, ()> = HashMap::with_capacity(cluster.job_count());
        for job in cluster.jobs() {
            live.insert(job.name(), ());
            if job.kind() == job_kind::TRAINING && job.is_pending() {
                self.initial
                    .entry(job.name().to_string())
                    .or_insert(job.workers());
            }
        }
        self.initial
            .retain(|name, _| live.contains_key(name.as_str()));
        self.shrink_since
            .retain(|name, _| live.contains_key(name.as_str()));
    }

    fn initial_workers(&self, job: &Job<'_>) -> u32 {
        self.initial
            .get(job.name())
            .copied()
            .unwrap_or(job.min_workers())
            .max(job.min_workers())
    }

    // ---- inference ----

    fn serve(&mut self, plan: &mut Plan<'_>, service: Job<'_>, now: u64) {
        let job = service.index();
        if plan.is_decided(job) {
            return;
        }
        if service.is_pending() {
            let want = service.workers();
            let mut rooms = Rooms::of(plan, job);
            let workers = match rooms.spread(want) {
                Some(w) => Some(w),
                None if self.cfg.borrow_from_training => {
                    self.borrow(plan, want.saturating_sub(rooms.workers_available()));
                    Rooms::of(plan, job).spread(want)
                }
                None => None,
            };
            if let Some(workers) = workers {
                let _ = plan.apply(Decision::Place(job, workers));
            }
            return;
        }
        if !self.cfg.inference_scaling {
            return;
        }
        let metric = service.service();
        let load = ServiceLoad {
            replicas: service.workers(),
            min_replicas: service.min_workers(),
            max_replicas: service.max_workers(),
            requests_per_s: metric.requests_per_s,
            p99_latency_ms: metric.p99_latency_ms,
            slo_ms: service.slo_ms().unwrap_or(0),
        };
        let current = service.workers();
        let Some(want) = desired_replicas(&self.cfg, &load) else {
            self.shrink_since.remove(service.name());
            return;
        };
        if want > current {
            self.shrink_since.remove(service.name());
            let need = want - current;
            let mut rooms = Rooms::of(plan, job);
            let free = rooms.workers_available();
            if free < need && self.cfg.borrow_from_training {
                self.borrow(plan, need - free);
                rooms = Rooms::of(plan, job);
            }
            let added = rooms.spread_up_to(need);
            if !added.is_empty() {
                let _ = plan.apply(Decision::ScaleOut(job, added));
            }
        } else if want < current {
            let since = *self
                .shrink_since
                .entry(service.name().to_string())
                .or_insert(now);
            if now.saturating_sub(since) >= self.cfg.scale_down_delay_s.saturating_mul(1000) {
                let positions = (want..current).rev().collect();
                if plan.apply(Decision::ScaleIn(job, positions)).is_ok() {
                    self.shrink_since.remove(service.name());
                }
            }
        } else {
            self.shrink_since.remove(service.name());
        }
    }

    /// Evicts up to `workers` training workers, one at a time from the job
    /// with the most (the latest submitted among equals), never a job's
    /// chief (position 0) nor below its minimum. One scale-in per job.
    fn borrow(&self, plan: &mut Plan<'_>, workers: u32) {
        let cluster = plan.cluster();
        let mut donors: Vec<(u32, u32, u32, u64)> = cluster
            .running_jobs()
            .filter(|j| j.kind() == job_kind::TRAINING && !plan.is_decided(j.index()))
            .map(|j| {
                (
                    j.index(),
                    j.workers(),
                    j.min_workers().max(1),
                    j.submit_ms(),
                )
            })
            .collect();
        let mut taken = vec![0u32; donors.len()];
        for _ in 0..workers {
            let best = donors
                .iter()
                .enumerate()
                .filter(|(k, d)| d.1 - taken[*k] > d.2)
                .max_by_key(|(k, d)| (d.1 - taken[*k], d.3, d.0));
            let Some((k, _)) = best else { break };
            taken[k] += 1;
        }
        for (k, (job, count, _, _)) in donors.drain(..).enumerate() {
            if taken[k] > 0 {
                let positions = (count - taken[k]..count).rev().collect();
                let _ = plan.apply(Decision::ScaleIn(job, positions));
            }
        }
    }

    // ---- other pending work (notebooks) ----

    fn place_plain(&self, plan: &mut Plan<'_>, job: Job<'_>) {
        let index = job.index();
        if job.is_fractional() {
            let sharing = self.cfg.gpu_sharing;
            let _ = plan.place_gang(index, job.workers(), |plan| {
                fractional_gpu(plan, index, sharing)
            });
        } else {
            let mut rooms = Rooms::of(plan, index);
            if let Some(workers) = rooms.spread(job.workers()) {
                let _ = plan.apply(Decision::Place(index, workers));
            }
        }
    }

    // ---- training ----

    fn schedule_training(&self, plan: &mut Plan<'_>, now: u64) {
        if !self.cfg.training_scheduler {
            self.schedule_pods(plan);
            return;
        }
        let cluster = plan.cluster();
        let waiting: Vec<Job<'_>> = cluster
            .pending_by_arrival()
            .into_iter()
            .filter(|j| j.kind() == job_kind::TRAINING)
            .collect();
        let mut still_waiting = false;
        for job in waiting {
            if plan.is_decided(job.index()) {
                continue;
            }
            let started = self.start_packed(plan, &job)
                || (self.take_back_for(plan, &job) && self.start_packed(plan, &job))
                || (self.preempt_for(plan, &job, now) && self.start_packed(plan, &job));
            still_waiting |= !started;
        }
        if !still_waiting {
            self.grow(plan);
        }
    }

    /// Kubernetes without the training scheduler: training pods in the order
    /// the scheduling queue holds them (equal priority: by creation, so a
    /// running job's pods still pending come before a later job's), each on
    /// the least-allocated node. A waiting job starts with the pods that fit
    /// (all of them, or none, with `k8s_gang_scheduling` or when the job is
    /// inelastic); a running job gets its missing pods as room appears, up
    /// to the workers it was submitted with, never more. The submitted
    /// counts live in this instance (`initial`, learned while jobs wait): an
    /// instance swapped in after a job started short does not know it is
    /// short and leaves it with the pods it has — the contract has no
    /// pending pods, only jobs placed with fewer workers.
    fn schedule_pods(&self, plan: &mut Plan<'_>) {
        let cluster = plan.cluster();
        let mut queue: Vec<Job<'_>> = cluster
            .jobs()
            .filter(|j| j.kind() == job_kind::TRAINING)
            .filter(|j| j.is_pending() || (j.is_running() && j.workers() < self.initial_workers(j)))
            .collect();
        queue.sort_by_key(|j| (j.submit_ms(), j.index()));
        for job in queue {
            let index = job.index();
            if plan.is_decided(index) {
                continue;
            }
            let mut rooms = Rooms::of(plan, index);
            if job.is_pending() {
                let want = job.workers();
                let whole = self.cfg.k8s_gang_scheduling || !job.is_elastic();
                let workers = if whole {
                    rooms.spread(want).unwrap_or_default()
                } else {
                    rooms.spread_up_to(want)
                };
                if workers.len() as u32 >= job.min_workers().max(1) {
                    let _ = plan.apply(Decision::Place(index, workers));
                }
            } else if !self.cfg.k8s_gang_scheduling {
                let missing = self.initial_workers(&job) - job.workers();
                let added = rooms.spread_up_to(missing);
                if !added.is_empty() {
                    let _ = plan.apply(Decision::ScaleOut(index, added));
                }
            }
        }
    }

    /// Places `job`'s gang packed on as few nodes as possible: on one node
    /// whenever a node is large enough to hold it (the job waits for one
    /// rather than spread), else over the fewest nodes.
    fn start_packed(&self, plan: &mut Plan<'_>, job: &Job<'_>) -> bool {
        let cluster = plan.cluster();
        let gpus = job.workers().saturating_mul(job.gpus_per_worker());
        let split = !cluster.nodes().any(|n| {
            n.gpu_range().len() as u32 >= gpus && plan.node_open_for(job.index(), n.index())
        });
        let mut rooms = Rooms::of(plan, job.index());
        match rooms.pack(job.workers(), split) {
            Some(workers) => plan.apply(Decision::Place(job.index(), workers)).is_ok(),
            None => false,
        }
    }

    /// Takes back, on one node, the workers running training jobs have
    /// beyond what they were submitted with, enough for `job`'s gang there
    /// (the node needing the fewest). Whether it took any.
    fn take_back_for(&self, plan: &mut Plan<'_>, job: &Job<'_>) -> bool {
        let cluster = plan.cluster();
        let need = job.workers();
        let per_worker = job.gpus_per_worker().max(1);
        let rooms = Rooms::of(plan, job.index());
        // One pass over the running jobs for every node, not one per node.
        let mut surplus = self.surplus_by_node(plan);
        let mut best: Option<(u32, u32)> = None; // (removals, node)
        for node in 0..cluster.node_count() as u32 {
            let free = rooms.workers_on(node);
            if free >= need || !plan.node_open_for(job.index(), node) {
                continue;
            }
            let mut gpus = free * per_worker;
            let mut removals = 0;
            for donor in surplus.get(&node).into_iter().flatten() {
                for _ in 0..donor.positions.len() {
                    if gpus >= need * per_worker {
                        break;
                    }
                    gpus += donor.gpus_per_worker;
                    removals += 1;
                }
            }
            if gpus >= need * per_worker && best.is_none_or(|b| (removals, node) < b) {
                best = Some((removals, node));
            }
        }
        let Some((mut removals, node)) = best else {
            return false;
        };
        for donor in surplus.remove(&node).unwrap_or_default() {
            if removals == 0 {
                break;
            }
            let take: Vec<u32> = donor
                .positions
                .into_iter()
                .take(removals as usize)
                .collect();
            removals -= take.len() as u32;
            let _ = plan.apply(Decision::ScaleIn(donor.job, take));
        }
        true
    }

    /// Running training jobs with workers beyond their submitted count, by
    /// node, on each node the job with the most workers first.
    fn surplus_by_node(&self, plan: &Plan<'_>) -> HashMap<u32, Vec<Donor>> {
        let cluster = plan.cluster();
        let mut by_node: HashMap<u32, Vec<Donor>> = HashMap::new();
        for j in cluster
            .running_jobs()
            .filter(|j| j.kind() == job_kind::TRAINING && !plan.is_decided(j.index()))
        {
            let keep = self.initial_workers(&j).max(1);
            let surplus = j.workers().saturating_sub(keep) as usize;
            if surplus == 0 {
                continue;
            }
            let mut positions: HashMap<u32, Vec<u32>> = HashMap::new();
            for (p, w) in j.placement().iter().enumerate().rev() {
                let on_node = positions.entry(w.node).or_default();
                if p > 0 && on_node.len() < surplus {
                    on_node.push(p as u32);
                }
            }
            for (node, positions) in positions {
                if !positions.is_empty() {
                    by_node.entry(node).or_default().push(Donor {
                        job: j.index(),
                        workers: j.workers(),
                        positions,
                        gpus_per_worker: j.gpus_per_worker().max(1),
                    });
                }
            }
        }
        for donors in by_node.values_mut() {
            donors.sort_by_key(|d| (std::cmp::Reverse(d.workers), d.job));
        }
        by_node
    }

    /// Monopolisation: preempts (with its checkpoint) the training job that
    /// has run longest, once it has run `preempt_after_s` and `job` has
    /// waited as long, on a node where that makes room for `job`'s gang.
    fn preempt_for(&self, plan: &mut Plan<'_>, job: &Job<'_>, now: u64) -> bool {
        let after = self.cfg.preempt_after_s.saturating_mul(1000);
        if after == 0 || now.saturating_sub(job.submit_ms()) < after {
            return false;
        }
        let cluster = plan.cluster();
        let rooms = Rooms::of(plan, job.index());
        let per_worker = job.gpus_per_worker().max(1);
        let victim = cluster
            .running_jobs()
            .filter(|j| {
                j.kind() == job_kind::TRAINING
                    && j.checkpointed()
                    && !plan.is_decided(j.index())
                    && now.saturating_sub(j.progress().started_ms) >= after
            })
            .filter(|j| {
                // All its workers on one node that then holds the gang.
                let node = j.placement().first().map_or(u32::MAX, |w| w.node);
                j.placement().iter().all(|w| w.node == node)
                    && plan.node_open_for(job.index(), node)
                    && rooms.workers_on(node) * per_worker + j.workers() * j.gpus_per_worker()
                        >= job.workers() * per_worker
            })
            .max_by_key(|j| (now.saturating_sub(j.progress().started_ms), j.index()));
        match victim {
            Some(v) => plan.apply(Decision::Preempt(v.index())).is_ok(),
            None => false,
        }
    }

    /// Nothing waits: running elastic training jobs grow on their own nodes,
    /// one worker at a time, fewest workers first, up to their maximum.
    fn grow(&self, plan: &mut Plan<'_>) {
        let cluster = plan.cluster();
        let mut jobs: Vec<(u32, u32, u32, u32)> = cluster
            .running_jobs()
            .filter(|j| {
                j.kind() == job_kind::TRAINING
                    && j.workers() < j.max_workers()
                    && !plan.is_decided(j.index())
            })
            .map(|j| {
                let home = j.placement().first().map_or(0, |w| w.node);
                (j.index(), j.workers(), j.max_workers(), home)
            })
            .collect();
        let mut added: Vec<Vec<WorkerPlacement>> = vec![Vec::new(); jobs.len()];
        // Workers are only added on a job's home node (packing), so that is the only room
        // each job needs.
        let mut rooms: Vec<Rooms> = jobs.iter().map(|j| Rooms::at(plan, j.0, j.3)).collect();
        loop {
            // Fewest workers (counting this round's) first, then arrival.
            let next = jobs
                .iter()
                .enumerate()
                .filter(|(k, j)| j.1 + (added[*k].len() as u32) < j.2)
                .filter(|(k, j)| rooms[*k].workers_on(j.3) > 0)
                .min_by_key(|(k, j)| (j.1 + added[*k].len() as u32, j.0))
                .map(|(k, _)| k);
            let Some(k) = next else { break };
            let home = jobs[k].3;
            let Some(worker) = rooms[k].take_on(home) else {
                break;
            };
            // Every other job at home there loses those GPUs, CPU and memory too.
            let (cpu, memory) = rooms[k].worker_needs();
            for (other, r) in rooms.iter_mut().enumerate() {
                if other != k && jobs[other].3 == home {
                    r.remove_worker(&worker, cpu, memory);
                }
            }
            added[k].push(worker);
        }
        for (k, job) in jobs.drain(..).enumerate() {
            let workers = std::mem::take(&mut added[k]);
            if !workers.is_empty() {
                let _ = plan.apply(Decision::ScaleOut(job.0, workers));
            }
        }
    }
}

/// A GPU for one fractional worker: with sharing, the fitting GPU with the
/// least compute left (GPUs already shared first); without, a GPU nobody
/// uses, on the least-allocated node.
fn fractional_gpu(plan: &Plan<'_>, job: u32, sharing: bool) -> Option<WorkerPlacement> {
    let cluster = plan.cluster();
    let mut best: Option<(u32, u32, u32)> = None; // (key, gpu, node)
    for node in 0..cluster.node_count() as u32 {
        if !plan.node_open_for(job, node) || !plan.host_resources_fit(job, node) {
            continue;
        }
        for gpu in plan.fitting_gpus(job, node) {
            let free = plan.free_milli(gpu);
            let key = if sharing {
                free
            } else if free == FULL_GPU_MILLI && plan.cluster().gpu(gpu).shared_workers() == 0 {
                u32::MAX - plan.node_free_milli(node)
            } else {
                continue;
            };
            if best.is_none_or(|b| (key, gpu) < (b.0, b.1)) {
                best = Some((key, gpu, node));
            }
        }
    }
    best.map(|(_, gpu, node)| WorkerPlacement {
        node,
        gpus: vec![gpu],
    })
}

impl<P: Preset> Policy for Dynamo<P> {
    fn manifest() -> Manifest {
        let mut m = manifest(
            P::NAME,
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler],
            P::SUMMARY,
        );
        m.default_config = P::DEFAULT_CONFIG.into();
        m
    }

    fn create() -> Self {
        Dynamo {
            cfg: Config::parse_over(P::DEFAULT_CONFIG, "").unwrap_or_default(),
            initial: HashMap::new(),
            shrink_since: HashMap::new(),
            _preset: PhantomData,
        }
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        // What the configuration leaves out keeps the preset's value.
        self.cfg = Config::parse_over(P::DEFAULT_CONFIG, config)?;
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        let now = round.now_ms;
        self.observe(cluster);
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        let mut services: Vec<Job<'_>> = cluster
            .jobs()
            .filter(|j| j.kind() == job_kind::INFERENCE)
            .collect();
        services.sort_by_key(|j| (j.submit_ms(), j.index()));
        for service in services {
            self.serve(&mut plan, service, now);
        }
        for job in cluster.pending_by_arrival() {
            if job.kind() != job_kind::TRAINING
                && job.kind() != job_kind::INFERENCE
                && !plan.is_decided(job.index())
            {
                self.place_plain(&mut plan, job);
            }
        }
        self.schedule_training(&mut plan, now);
        Ok(plan.into_decisions())
    }
}

#[cfg(test)]
mod tests;
