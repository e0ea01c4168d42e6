//! One round of Gandiva's packing.
//!
//! Pending jobs in arrival order; each is placed, or waits while the ones behind it go on:
//!
//! 1. **Free GPUs.** If the gang fits on GPUs nothing runs on, it goes there: all on one
//!    node when one has room (the node with the fewest free slots that holds it), otherwise
//!    over the fewest nodes (most free slots first), unless it requires one node.
//! 2. **Packing.** Otherwise each worker takes the least-loaded GPUs that accept it (see
//!    the crate docs for what "accept" means), one worker at a time on the node whose best
//!    candidates are least loaded; a job that asks for one node (locality 1 or 2) first
//!    looks for one node with enough candidates, and one that requires it waits for one.
//!
//! A GPU's load is its reported utilization (the latest sample the view holds) plus what
//! this round's placements add: the worker's compute share, a whole GPU being 100 %.
//! Ties go to fewer residents, then less memory held, then the lower index.
//!
//! What AntMan's description leaves open, and what we chose: the bound on residents per GPU
//! ([`Config::max_jobs_per_gpu`]); the profile behind "sufficient GPU memory" (the job's
//! declared `gpu-memory-mib`, or the whole GPU when it declares none, raised to the peak a
//! running job reports in `job-metrics`); greedy backfill behind a job that waits; GPUs
//! and nodes another job reserved are left alone (Gandiva reserves nothing, and a reserved
//! GPU is about to get its holder's guaranteed work).

use crate::config::Config;
use arbiter_policy_sdk::model::{gpu_share, locality, shared_gpu_share};
use arbiter_policy_sdk::prelude::*;
use std::cmp::Reverse;

/// The round's decisions.
pub fn schedule(cfg: &Config, cluster: &Cluster, round: &RoundInfo) -> Vec<Decision> {
    let mut r = Round::new(cfg, cluster, round.max_decisions);
    for job in cluster.pending_by_arrival() {
        if r.full() {
            break;
        }
        r.place(&job);
    }
    r.plan.into_decisions()
}

/// GPU memory one worker of `job` declares on a GPU of `total` MiB: its `gpu-memory-mib`
/// when set, otherwise its share of the GPU (the whole GPU for a whole-GPU worker).
fn declared_mib(job: &Job<'_>, total: u32) -> u32 {
    shared_gpu_share(
        job.gpus_per_worker(),
        job.gpu_milli(),
        job.gpu_memory_mib(),
        total,
    )
    .1
}

/// How many more workers of `job` the node's CPU and memory hold under `plan`.
fn host_capacity(plan: &Plan<'_>, job: &Job<'_>, node: u32) -> u32 {
    let by = |free: u32, need: u32| free.checked_div(need).unwrap_or(u32::MAX);
    by(plan.free_cpu(node), job.cpu_milli()).min(by(plan.free_memory(node), job.memory_mib()))
}

/// One node's candidate GPUs for a job (best first) and how many workers its host takes.
struct Row {
    node: u32,
    gpus: Vec<u32>,
    host: u32,
}

struct Round<'a> {
    cfg: &'a Config,
    cluster: &'a Cluster,
    plan: Plan<'a>,
    max_decisions: u32,
    /// Per GPU: workers of any job on it, with this round's placements.
    residents: Vec<u32>,
    /// Per GPU: memory its residents declare (or reported at peak), MiB.
    memory: Vec<u64>,
    /// Per GPU: utilization (percent) this round's placements add.
    added_pct: Vec<u32>,
}

impl<'a> Round<'a> {
    fn new(cfg: &'a Config, cluster: &'a Cluster, max_decisions: u32) -> Round<'a> {
        let gpus = cluster.gpu_count();
        let mut residents = vec![0u32; gpus];
        let mut memory = vec![0u64; gpus];
        for job in cluster.running_jobs() {
            let peak = job.metrics().peak_memory_mib;
            for w in job.placement() {
                for &g in &w.gpus {
                    let total = cluster.gpu(g).memory_mib();
                    if let (Some(r), Some(m)) =
                        (residents.get_mut(g as usize), memory.get_mut(g as usize))
                    {
                        *r += 1;
                        *m += u64::from(declared_mib(&job, total).max(peak));
                    }
                }
            }
        }
        Round {
            cfg,
            cluster,
            plan: Plan::new(cluster).with_max_decisions(max_decisions),
            max_decisions,
            residents,
            memory,
            added_pct: vec![0; gpus],
        }
    }

    fn full(&self) -> bool {
        self.plan.decisions().len() >= self.max_decisions as usize
    }

    fn residents(&self, g: u32) -> u32 {
        self.residents.get(g as usize).copied().unwrap_or(u32::MAX)
    }

    /// Whether `node` is open to the job at all: ready, and not reserved by another job.
    fn node_open(&self, j: u32, node: &Node<'_>) -> bool {
        node.is_ready()
            && self
                .cluster
                .reserved_by(node.index())
                .is_none_or(|h| h == j)
    }

    /// Whether the plan takes a worker of job `j` on GPU `g` (no other job holds it).
    fn accepts(&self, j: u32, g: u32) -> bool {
        self.cluster.gpu_reserved_by(g).is_none_or(|h| h == j) && self.plan.gpu_fits(j, g)
    }

    /// Whether a worker of `job` may be packed onto GPU `g`: below the resident bound, the
    /// plan accepts it, and (with `memory_check`) its memory fits beside the residents'.
    fn packable(&self, job: &Job<'_>, g: u32) -> bool {
        if self.residents(g) >= self.cfg.max_jobs_per_gpu || !self.accepts(job.index(), g) {
            return false;
        }
        if !self.cfg.memory_check {
            return true;
        }
        let total = self.cluster.gpu(g).memory_mib();
        let held = self.memory.get(g as usize).copied().unwrap_or(u64::MAX);
        held.saturating_add(u64::from(declared_mib(job, total))) <= u64::from(total)
    }

    /// A GPU's load: utilization with this round's additions, residents, memory, index.
    fn load(&self, g: u32) -> (u32, u32, u64, u32) {
        let i = g as usize;
        (
            u32::from(self.cluster.gpu(g).utilization_pct())
                .saturating_add(self.added_pct.get(i).copied().unwrap_or(0)),
            self.residents(g),
            self.memory.get(i).copied().unwrap_or(0),
            g,
        )
    }

    fn place(&mut self, job: &Job<'a>) {
        if job.workers() == 0 {
            return;
        }
        let workers = self.on_free_gpus(job).or_else(|| self.packed(job));
        let Some(workers) = workers else { return };
        if self
            .plan
            .apply(Decision::Place(job.index(), workers.clone()))
            .is_ok()
        {
            self.occupy(job, &workers);
        }
    }

    /// Step 1: the gang on GPUs nothing runs on, on as few nodes as possible.
    fn on_free_gpus(&self, job: &Job<'a>) -> Option<Vec<WorkerPlacement>> {
        let j = job.index();
        let n = job.workers();
        let gpw = job.gpus_per_worker() as usize;
        let mut rows: Vec<(u32, Vec<u32>, u32)> = Vec::new(); // (node, free GPUs, slots)
        for node in self.cluster.nodes() {
            if !self.node_open(j, &node) {
                continue;
            }
            let host = host_capacity(&self.plan, job, node.index());
            let gpus: Vec<u32> = if gpw == 0 {
                Vec::new()
            } else {
                node.gpu_range()
                    .filter(|&g| self.residents(g) == 0 && self.accepts(j, g))
                    .collect()
            };
            // Host-only workers (no GPUs) are bounded by the host alone.
            let slots = gpus
                .len()
                .checked_div(gpw)
                .map_or(host, |s| u32::try_from(s).unwrap_or(u32::MAX).min(host));
            if slots > 0 {
                rows.push((node.index(), gpus, slots));
            }
        }
        let take = |node: u32, gpus: &[u32], count: u32| -> Vec<WorkerPlacement> {
            (0..count as usize)
                .map(|k| WorkerPlacement {
                    node,
                    gpus: gpus
                        .get(k * gpw..(k + 1) * gpw)
                        .map(<[u32]>::to_vec)
                        .unwrap_or_default(),
                })
                .collect()
        };
        if let Some((node, gpus, _)) = rows.iter().filter(|r| r.2 >= n).min_by_key(|r| (r.2, r.0)) {
            return Some(take(*node, gpus, n));
        }
        if job.locality() == locality::REQUIRE_ONE_NODE {
            return None;
        }
        rows.sort_by_key(|r| (Reverse(r.2), r.0));
        let mut out = Vec::with_capacity(n as usize);
        for (node, gpus, slots) in &rows {
            let left = n.saturating_sub(out.len() as u32);
            if left == 0 {
                break;
            }
            out.extend(take(*node, gpus, (*slots).min(left)));
        }
        (out.len() as u32 == n).then_some(out)
    }

    /// Step 2: each worker on the least-loaded GPUs that take it.
    fn packed(&self, job: &Job<'a>) -> Option<Vec<WorkerPlacement>> {
        let n = job.workers();
        let gpw = job.gpus_per_worker() as usize;
        if gpw == 0 {
            return None; // host-only work does not pack: step 1 found no host room
        }
        let mut rows: Vec<Row> = Vec::new();
        for node in self.cluster.nodes() {
            if !self.node_open(job.index(), &node) {
                continue;
            }
            let host = host_capacity(&self.plan, job, node.index());
            if host == 0 {
                continue;
            }
            let mut gpus: Vec<u32> = node
                .gpu_range()
                .filter(|&g| self.packable(job, g))
                .collect();
            if gpus.len() < gpw {
                continue;
            }
            gpus.sort_by_key(|&g| self.load(g));
            rows.push(Row {
                node: node.index(),
                gpus,
                host,
            });
        }
        let score = |gpus: &[u32]| -> (u64, u64, u64) {
            gpus.iter().fold((0, 0, 0), |(u, r, m), &g| {
                let (util, res, mem, _) = self.load(g);
                (u + u64::from(util), r + u64::from(res), m + mem)
            })
        };
        let need = gpw.saturating_mul(n as usize);
        if job.locality() != locality::ANY {
            let one = rows
                .iter()
                .filter(|r| r.gpus.len() >= need && r.host >= n)
                .min_by_key(|r| (score(&r.gpus[..need]), r.node));
            if let Some(row) = one {
                return Some(
                    row.gpus[..need]
                        .chunks_exact(gpw)
                        .map(|c| WorkerPlacement {
                            node: row.node,
                            gpus: c.to_vec(),
                        })
                        .collect(),
                );
            }
            if job.locality() == locality::REQUIRE_ONE_NODE {
                return None;
            }
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let best = rows
                .iter_mut()
                .filter(|r| r.gpus.len() >= gpw && r.host > 0)
                .min_by_key(|r| (score(&r.gpus[..gpw]), r.node))?;
            let gpus: Vec<u32> = best.gpus.drain(..gpw).collect();
            best.host -= 1;
            out.push(WorkerPlacement {
                node: best.node,
                gpus,
            });
        }
        Some(out)
    }

    /// Counts this round's workers on their GPUs.
    fn occupy(&mut self, job: &Job<'_>, workers: &[WorkerPlacement]) {
        let (milli, _) = gpu_share(job.gpus_per_worker(), job.gpu_milli(), 0, 0);
        let pct = milli.div_ceil(10);
        for w in workers {
            for &g in &w.gpus {
                let total = self.cluster.gpu(g).memory_mib();
                let i = g as usize;
                if let Some(r) = self.residents.get_mut(i) {
                    *r += 1;
                }
                if let Some(m) = self.memory.get_mut(i) {
                    *m += u64::from(declared_mib(job, total));
                }
                if let Some(a) = self.added_pct.get_mut(i) {
                    *a = a.saturating_add(pct);
                }
            }
        }
    }
}
