//! Choosing which on-loan servers to return (Aryl §4, Appendix B
//! Algorithm 1), over plain data, plus the paper's baselines (§7.1: Random,
//! Smallest-Count-First) and an exhaustive optimum for small cases (§7.3).
//!
//! Servers are `0..servers` (the caller's candidate list, by position); jobs
//! are the running jobs with at least one worker on a candidate server.

/// A running job as the reclaim problem sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReclaimJob {
    /// Workers the job runs with now, on all servers (candidates or not).
    pub workers: u32,
    /// Fewest workers the job may keep and still run: `max(w_min, 1)` for an
    /// elastic job, `workers` for an inelastic one (which cannot shed any).
    pub min_workers: u32,
    pub gpus_per_worker: u32,
    /// Its workers on candidate servers: (server, worker positions there).
    pub on_servers: Vec<(usize, Vec<u32>)>,
}

impl ReclaimJob {
    /// Workers it may lose by scale-in without being preempted.
    fn slack(&self) -> u32 {
        self.workers.saturating_sub(self.min_workers.max(1))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReclaimProblem {
    pub servers: usize,
    pub jobs: Vec<ReclaimJob>,
}

/// The three per-server preemption costs §4 discusses (Table 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServerCosts {
    /// Number of jobs running on the server (the plain 0-1 knapsack value).
    pub jobs: u32,
    /// Σ over its jobs of the fraction of the job's GPUs on this server.
    pub gpu_fraction: f64,
    /// Σ over its jobs of `1/|S_j|`, the fraction of the job's servers this
    /// server is — Aryl's server preemption cost (Algorithm 1, line 7).
    pub server_fraction: f64,
}

/// Table 1's three costs for every server, before any selection. Scale-in is
/// not considered here (Table 1 is the no-elastic-job case); `S_j` counts the
/// candidate servers hosting job `j` (see [`greedy_select`]).
pub fn server_costs(problem: &ReclaimProblem) -> Vec<ServerCosts> {
    let mut costs = vec![
        ServerCosts {
            jobs: 0,
            gpu_fraction: 0.0,
            server_fraction: 0.0,
        };
        problem.servers
    ];
    for job in &problem.jobs {
        let servers = job.on_servers.len() as f64;
        let total_gpus = f64::from(job.workers) * f64::from(job.gpus_per_worker.max(1));
        for (s, positions) in &job.on_servers {
            let Some(c) = costs.get_mut(*s) else { continue };
            c.jobs += 1;
            if total_gpus > 0.0 {
                c.gpu_fraction +=
                    positions.len() as f64 * f64::from(job.gpus_per_worker.max(1)) / total_gpus;
            }
            c.server_fraction += 1.0 / servers;
        }
    }
    costs
}

/// What returning a set of servers does to the jobs on them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vacate {
    /// The servers, in selection order.
    pub servers: Vec<usize>,
    /// Jobs that must be preempted (sorted).
    pub preempted: Vec<usize>,
    /// Jobs that only lose workers: (job, worker positions, sorted).
    pub scaled_in: Vec<(usize, Vec<u32>)>,
}

/// The cheapest way to empty `servers`: a job loses its workers there by
/// scale-in when it keeps at least its minimum ("we first kill the elastic
/// workers running on on-loan servers since stopping them does not lead to any
/// job-level preemption", §1/§4), and is preempted otherwise.
pub fn vacate(problem: &ReclaimProblem, servers: &[usize]) -> Vacate {
    let mut chosen = vec![false; problem.servers];
    for &s in servers {
        if let Some(c) = chosen.get_mut(s) {
            *c = true;
        }
    }
    let mut out = Vacate {
        servers: servers.to_vec(),
        ..Vacate::default()
    };
    for (j, job) in problem.jobs.iter().enumerate() {
        let mut positions: Vec<u32> = job
            .on_servers
            .iter()
            .filter(|(s, _)| chosen.get(*s).copied().unwrap_or(false))
            .flat_map(|(_, p)| p.iter().copied())
            .collect();
        if positions.is_empty() {
            continue;
        }
        if positions.len() as u64 <= u64::from(job.slack()) {
            positions.sort_unstable();
            positions.dedup();
            out.scaled_in.push((j, positions));
        } else {
            out.preempted.push(j);
        }
    }
    out
}

/// Number of jobs returning `servers` preempts.
pub fn preemptions(problem: &ReclaimProblem, servers: &[usize]) -> usize {
    vacate(problem, servers).preempted.len()
}

const EPS: f64 = 1e-9;

/// Working state of Algorithm 1.
struct Greedy {
    /// Per server: (job, workers of the job there).
    on_server: Vec<Vec<(usize, u32)>>,
    /// Per job: the unselected candidate servers it still has workers on.
    servers_of: Vec<Vec<usize>>,
    slack: Vec<u32>,
    preempted: Vec<bool>,
    selected: Vec<bool>,
    cost: Vec<f64>,
}

impl Greedy {
    /// `InitPreemptionCost` (Algorithm 1, lines 1–9).
    fn new(problem: &ReclaimProblem) -> Self {
        let n = problem.servers;
        let mut on_server = vec![Vec::new(); n];
        let mut servers_of = vec![Vec::new(); problem.jobs.len()];
        for (j, job) in problem.jobs.iter().enumerate() {
            for (s, positions) in &job.on_servers {
                if *s < n && !positions.is_empty() {
                    on_server[*s].push((j, positions.len() as u32));
                    servers_of[j].push(*s);
                }
            }
        }
        let mut g = Greedy {
            on_server,
            servers_of,
            slack: problem.jobs.iter().map(ReclaimJob::slack).collect(),
            preempted: vec![false; problem.jobs.len()],
            selected: vec![false; n],
            cost: vec![0.0; n],
        };
        for s in 0..n {
            g.recompute(s);
        }
        g
    }

    /// Whether returning `s` now forces job `j` (with `count` workers there)
    /// to be preempted rather than scaled in.
    fn must_preempt(&self, j: usize, count: u32) -> bool {
        !self.preempted[j] && self.slack[j] < count
    }

    /// Server preemption cost: Σ `1/|S_j|` over the jobs on `s` that would be
    /// preempted (Algorithm 1, line 7). A job that can shed its workers on `s`
    /// by scale-in costs nothing, which is how the flexible server group is
    /// released first (§5.3, "release the server group for flexible demands
    /// first without any preemption").
    fn recompute(&mut self, s: usize) {
        let mut cost = 0.0;
        for &(j, count) in &self.on_server[s] {
            if self.must_preempt(j, count) {
                cost += 1.0 / self.servers_of[j].len().max(1) as f64;
            }
        }
        self.cost[s] = cost;
    }

    fn preempted_jobs(&self, s: usize) -> impl Iterator<Item = usize> + '_ {
        self.on_server[s]
            .iter()
            .filter(|&&(j, c)| self.must_preempt(j, c))
            .map(|&(j, _)| j)
    }

    fn workers_on(&self, s: usize) -> u32 {
        self.on_server[s]
            .iter()
            .filter(|&&(j, _)| !self.preempted[j])
            .map(|&(_, c)| c)
            .sum()
    }

    /// Tie-break among equal-cost servers (the paper leaves ties open; on
    /// Figure 5 the choice decides between one and two preemptions): prefer
    /// the server whose preemptions leave the most *other* servers with
    /// nothing left to preempt — one job's cost is spread over its servers,
    /// and this completes the job we started paying for.
    fn completes(&self, s: usize) -> usize {
        let victims: Vec<usize> = self.preempted_jobs(s).collect();
        if victims.is_empty() {
            return 0;
        }
        let mut others: Vec<usize> = victims
            .iter()
            .flat_map(|&j| self.servers_of[j].iter().copied())
            .filter(|&o| o != s && !self.selected[o])
            .collect();
        others.sort_unstable();
        others.dedup();
        others
            .into_iter()
            .filter(|&o| self.preempted_jobs(o).all(|j| victims.contains(&j)))
            .count()
    }

    /// Returns `s` (Algorithm 1 lines 24–28 and `UpdateCost`, lines 10–16).
    fn take(&mut self, s: usize) {
        self.selected[s] = true;
        let jobs = std::mem::take(&mut self.on_server[s]);
        let mut touched = Vec::new();
        for &(j, count) in &jobs {
            if self.preempted[j] {
                continue;
            }
            if self.slack[j] >= count {
                self.slack[j] -= count;
            } else {
                // Preempt j: its workers leave every other server too.
                self.preempted[j] = true;
            }
            self.servers_of[j].retain(|&o| o != s);
            touched.extend(self.servers_of[j].iter().copied());
        }
        self.on_server[s] = jobs;
        touched.sort_unstable();
        touched.dedup();
        for o in touched {
            self.recompute(o);
        }
        self.cost[s] = f64::INFINITY;
    }
}

/// Aryl's server selection (Algorithm 1), extended with scale-in.
///
/// * `N_R = 1` (lines 18–20): the server with the fewest preemptions.
/// * Otherwise: repeatedly return the server with the lowest preemption cost,
///   preempt (or scale in) its jobs everywhere and update the costs of the
///   servers they ran on.
///
/// `S_j` is the set of *candidate* servers hosting `j`: servers outside the
/// candidate list can never be returned, so spreading a job's cost over them
/// would make a job with one worker on loan look cheap while returning that
/// server still costs a whole preemption.
///
/// Ties: lower cost, then the server that completes the most other servers
/// (see `completes`), then fewer workers to stop, then lower index.
pub fn greedy_select(problem: &ReclaimProblem, count: usize) -> Vec<usize> {
    let n = problem.servers;
    let count = count.min(n);
    let mut g = Greedy::new(problem);
    if count == 1 {
        // FindBestServer: fewest preemptions, then fewest workers stopped.
        let best = (0..n).min_by_key(|&s| (g.preempted_jobs(s).count(), g.workers_on(s), s));
        return best.into_iter().collect();
    }
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let Some(min) = (0..n)
            .filter(|&s| !g.selected[s])
            .map(|s| g.cost[s])
            .min_by(f64::total_cmp)
        else {
            break;
        };
        let tied: Vec<usize> = (0..n)
            .filter(|&s| !g.selected[s] && g.cost[s] <= min + EPS)
            .collect();
        let pick = if tied.len() == 1 {
            tied[0]
        } else {
            let mut best = tied[0];
            let mut best_key = (usize::MAX - g.completes(best), g.workers_on(best), best);
            for &s in &tied[1..] {
                let key = (usize::MAX - g.completes(s), g.workers_on(s), s);
                if key < best_key {
                    best = s;
                    best_key = key;
                }
            }
            best
        };
        out.push(pick);
        g.take(pick);
    }
    out
}

/// Smallest-Count-First (§7.1): the `count` servers hosting the fewest jobs,
/// lower index first among equals.
pub fn scf_select(problem: &ReclaimProblem, count: usize) -> Vec<usize> {
    let costs = server_costs(problem);
    let mut order: Vec<usize> = (0..problem.servers).collect();
    order.sort_by_key(|&s| (costs[s].jobs, s));
    order.truncate(count);
    order
}

/// Random (§7.1): `count` servers drawn uniformly without replacement.
pub fn random_select(problem: &ReclaimProblem, count: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..problem.servers).collect();
    // The SDK's SplitMix64, so a Random run replays bit for bit from its
    // seed (the host journals the round).
    let mut rng = arbiter_policy_sdk::rng::SplitMix64::new(seed);
    let count = count.min(order.len());
    for i in 0..count {
        let span = (order.len() - i) as u64;
        let k = i + (rng.next_u64() % span) as usize;
        order.swap(i, k);
    }
    order.truncate(count);
    order
}

/// `n choose k`, saturating.
fn binomial(n: usize, k: usize) -> u64 {
    let k = k.min(n - k.min(n));
    let mut r: u128 = 1;
    for i in 0..k {
        r = r * (n - i) as u128 / (i + 1) as u128;
        if r > u128::from(u64::MAX) {
            return u64::MAX;
        }
    }
    r as u64
}

/// The exhaustive optimum of §7.3: the `count` servers with the fewest
/// preemptions (then the fewest workers scaled in; then lexicographically
/// first). `None` when there are more than `max_subsets` subsets to try.
pub fn optimal_select(
    problem: &ReclaimProblem,
    count: usize,
    max_subsets: u64,
) -> Option<Vec<usize>> {
    let n = problem.servers;
    if count > n || binomial(n, count) > max_subsets {
        return None;
    }
    let mut idx: Vec<usize> = (0..count).collect();
    let mut best: Option<((usize, usize), Vec<usize>)> = None;
    loop {
        let v = vacate(problem, &idx);
        let scaled: usize = v.scaled_in.iter().map(|(_, p)| p.len()).sum();
        let key = (v.preempted.len(), scaled);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, idx.clone()));
        }
        // Next combination in lexicographic order.
        let mut i = count;
        loop {
            if i == 0 {
                return best.map(|(_, s)| s);
            }
            i -= 1;
            if idx[i] < n - count + i {
                idx[i] += 1;
                for k in i + 1..count {
                    idx[k] = idx[k - 1] + 1;
                }
                break;
            }
        }
    }
}
