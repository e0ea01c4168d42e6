//! The Aryl policy type, generic over its server-selection rule so the
//! paper's reclaim baselines (§7.1) share the scheduler bit for bit.

use crate::config::{Config, DEFAULT_CONFIG};
use crate::reclaim::{self, ReclaimJob, ReclaimProblem};
use crate::schedule;
use arbiter_policy_sdk::prelude::*;
use std::marker::PhantomData;

/// How a reclaim picks its servers.
pub trait ReclaimStrategy: 'static {
    /// Policy name in the manifest.
    const NAME: &'static str;
    const DESCRIPTION: &'static str;
    /// `count` distinct servers of `problem` (positions in the candidate list).
    fn select(problem: &ReclaimProblem, count: usize, config: &Config, epoch: u64) -> Vec<usize>;
}

/// Aryl's own rule: Algorithm 1 with scale-in first.
pub struct GreedyReclaim;
/// The Random baseline of §7.1.
pub struct RandomReclaim;
/// The Smallest-Count-First baseline of §7.1.
pub struct ScfReclaim;

impl ReclaimStrategy for GreedyReclaim {
    const NAME: &'static str = "aryl";
    const DESCRIPTION: &'static str = "Aryl (Li et al.): SJF for inelastic demand, multiple-choice \
        knapsack for flexible demand, best-fit-decreasing placement on training/loaned servers; \
        reclaim by server preemption cost (Algorithm 1) after scaling in flexible workers.";
    fn select(problem: &ReclaimProblem, count: usize, _: &Config, _: u64) -> Vec<usize> {
        reclaim::greedy_select(problem, count)
    }
}

impl ReclaimStrategy for RandomReclaim {
    const NAME: &'static str = "aryl-random-reclaim";
    const DESCRIPTION: &'static str =
        "Aryl's scheduler; reclaim returns on-loan servers chosen at random (baseline, §7.1).";
    fn select(problem: &ReclaimProblem, count: usize, config: &Config, epoch: u64) -> Vec<usize> {
        // Mixing in the epoch gives each reclaim its own draw while a replay
        // of the same round draws the same servers.
        let seed = config.random_seed ^ epoch.wrapping_mul(0x2545_f491_4f6c_dd1d);
        reclaim::random_select(problem, count, seed)
    }
}

impl ReclaimStrategy for ScfReclaim {
    const NAME: &'static str = "aryl-scf-reclaim";
    const DESCRIPTION: &'static str = "Aryl's scheduler; reclaim returns the on-loan servers \
        hosting the fewest jobs (Smallest-Count-First baseline, §7.1).";
    fn select(problem: &ReclaimProblem, count: usize, _: &Config, _: u64) -> Vec<usize> {
        reclaim::scf_select(problem, count)
    }
}

/// Aryl with server-selection rule `R`.
pub struct Aryl<R: ReclaimStrategy = GreedyReclaim> {
    config: Config,
    strategy: PhantomData<R>,
}

impl<R: ReclaimStrategy> Aryl<R> {
    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// The reclaim problem of a request: candidate servers by position, and the
/// running jobs with workers on them. Returns the problem and, per problem
/// job, its index in the cluster.
pub fn reclaim_problem(
    cluster: &Cluster,
    request: &ReclaimRequest,
) -> Result<(ReclaimProblem, Vec<u32>), PolicyError> {
    let nodes = cluster.node_count();
    let mut slot: Vec<Option<usize>> = vec![None; nodes];
    for (i, &node) in request.candidates.iter().enumerate() {
        match slot.get_mut(node as usize) {
            None => {
                return Err(PolicyError::Failed(format!(
                    "reclaim candidate {node} is not a node (the cluster has {nodes})"
                )));
            }
            Some(Some(_)) => {
                return Err(PolicyError::Failed(format!(
                    "reclaim candidate {node} is listed twice"
                )));
            }
            Some(s) => *s = Some(i),
        }
    }
    if request.count as usize > request.candidates.len() {
        return Err(PolicyError::Failed(format!(
            "cannot return {} servers out of {} candidates",
            request.count,
            request.candidates.len()
        )));
    }
    let mut problem = ReclaimProblem {
        servers: request.candidates.len(),
        jobs: Vec::new(),
    };
    let mut index = Vec::new();
    for job in cluster.running_jobs() {
        let mut on_servers: Vec<(usize, Vec<u32>)> = Vec::new();
        for (p, w) in job.placement().iter().enumerate() {
            let Some(s) = slot.get(w.node as usize).copied().flatten() else {
                continue;
            };
            match on_servers.iter_mut().find(|(server, _)| *server == s) {
                Some((_, positions)) => positions.push(p as u32),
                None => on_servers.push((s, vec![p as u32])),
            }
        }
        if on_servers.is_empty() {
            continue;
        }
        let workers = job.placement().len() as u32;
        problem.jobs.push(ReclaimJob {
            workers,
            min_workers: if job.is_elastic() {
                job.min_workers().max(1)
            } else {
                workers
            },
            gpus_per_worker: job.gpus_per_worker().max(1),
            on_servers,
        });
        index.push(job.index());
    }
    Ok((problem, index))
}

/// The reclaim role for any selection rule: pick the servers, then empty them
/// with scale-ins where the job keeps its base demand and preemptions
/// otherwise; the decisions are checked against a [`Plan`] before they leave.
pub fn reclaim_with(
    cluster: &Cluster,
    request: &ReclaimRequest,
    select: impl FnOnce(&ReclaimProblem, usize) -> Vec<usize>,
) -> Result<ReclaimPlan, PolicyError> {
    let (problem, index) = reclaim_problem(cluster, request)?;
    let count = request.count as usize;
    let servers = select(&problem, count);
    let mut seen = vec![false; problem.servers];
    for &s in &servers {
        match seen.get_mut(s) {
            Some(flag) if !*flag => *flag = true,
            _ => {
                return Err(PolicyError::Failed(format!(
                    "server selection returned an invalid or repeated server {s}"
                )));
            }
        }
    }
    if servers.len() != count {
        return Err(PolicyError::Failed(format!(
            "server selection returned {} servers, {count} asked",
            servers.len()
        )));
    }
    let vacate = reclaim::vacate(&problem, &servers);
    let mut decisions = Vec::new();
    for &(j, ref positions) in &vacate.scaled_in {
        decisions.push(Decision::ScaleIn(index[j], positions.clone()));
    }
    for &j in &vacate.preempted {
        decisions.push(Decision::Preempt(index[j]));
    }
    let nodes: Vec<u32> = servers.iter().map(|&s| request.candidates[s]).collect();
    // A reservation on a returned server would keep a pending job waiting
    // for a node that is gone: drop it.
    let mut unreserve: Vec<u32> = nodes
        .iter()
        .filter_map(|&n| cluster.reserved_by(n))
        .collect();
    unreserve.sort_unstable();
    unreserve.dedup();
    decisions.extend(unreserve.into_iter().map(Decision::Unreserve));

    // The host refuses a plan over its limit; better to say why here.
    let mut plan = Plan::new(cluster).with_max_decisions(request.max_decisions);
    for d in &decisions {
        plan.apply(d.clone())
            .map_err(|e| PolicyError::Failed(format!("reclaim decision {d:?} is invalid: {e}")))?;
    }
    Ok(ReclaimPlan { nodes, decisions })
}

impl<R: ReclaimStrategy> Policy for Aryl<R> {
    fn manifest() -> Manifest {
        let mut m = manifest(
            R::NAME,
            env!("CARGO_PKG_VERSION"),
            &[Role::Scheduler, Role::Reclaim],
            R::DESCRIPTION,
        );
        m.default_config = DEFAULT_CONFIG.to_string();
        m
    }

    fn create() -> Self {
        Aryl {
            config: Config::default(),
            strategy: PhantomData,
        }
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        self.config = Config::parse(config).map_err(PolicyError::Failed)?;
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(schedule::schedule(cluster, round, &self.config))
    }

    fn reclaim(
        &mut self,
        cluster: &Cluster,
        request: &ReclaimRequest,
    ) -> Result<ReclaimPlan, PolicyError> {
        let config = &self.config;
        reclaim_with(cluster, request, |problem, count| {
            R::select(problem, count, config, request.epoch)
        })
    }
}
