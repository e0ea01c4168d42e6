//! The greedy one-by-one placement driver shared by all six policies.
//!
//! Each round the pending jobs are taken in arrival order and each worker is
//! put on the best-scoring candidate (node, GPU set); a job with no feasible
//! candidate for all its workers stays pending (in the FGD protocol the
//! simulator then drops it). A policy is a [`PlacementRule`] (how to score a
//! candidate) wrapped in [`Greedy`], which implements the SDK's `Policy`.

use crate::SplitMix64;
use crate::task::{GpuSelection, Task, node_candidates};
use arbiter_policy_sdk::prelude::*;
use std::collections::HashMap;

/// How equal best scores are resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TieBreak {
    /// The first tied node in a node order shuffled once with the seed. This
    /// is what the FGD reference simulator does: it renames every node
    /// `<seeded permutation index>-<name>` (`syncClusterResourceList`) and
    /// its forked scheduler takes the first of equally scored nodes. Breaking
    /// ties the same way every time consolidates tied tasks (every CPU-only
    /// task ties everywhere under integer scores) instead of spreading them.
    NodeOrder,
    /// Uniformly at random among the tied nodes, as upstream Kubernetes'
    /// `selectHost` does. Seeded: deterministic.
    Random,
    /// The lowest node index: handy for hand-checked examples.
    First,
}

impl TieBreak {
    fn parse(text: &str) -> Result<Self, PolicyError> {
        match text {
            "node-order" => Ok(TieBreak::NodeOrder),
            "random" => Ok(TieBreak::Random),
            "first" => Ok(TieBreak::First),
            other => Err(config_error(format!(
                "tie_break must be \"node-order\", \"random\" or \"first\", got {other:?}"
            ))),
        }
    }
}

/// Resolves ties among equally good nodes.
#[derive(Clone, Debug)]
pub struct Ties {
    mode: TieBreak,
    seed: u64,
    rng: SplitMix64,
    /// `NodeOrder`: per node, its position in the shuffled order (built on
    /// first use and whenever the node count changes).
    rank: Vec<u32>,
}

/// Salts the node order so it is not the same stream as a simulator's task
/// shuffle with the same seed.
const NODE_ORDER_SALT: u64 = 0x6E6F_6465_6F72_6465;

impl Ties {
    pub fn new(mode: TieBreak, seed: u64) -> Self {
        Ties {
            mode,
            seed,
            rng: SplitMix64::new(seed),
            rank: Vec::new(),
        }
    }

    /// Position of every node of a `nodes`-node cluster in the seeded order.
    pub fn node_ranks(&mut self, nodes: usize) -> &[u32] {
        if self.rank.len() != nodes {
            let mut order: Vec<u32> = (0..nodes as u32).collect();
            SplitMix64::new(self.seed ^ NODE_ORDER_SALT).shuffle(&mut order);
            self.rank = vec![0; nodes];
            for (position, &node) in order.iter().enumerate() {
                self.rank[node as usize] = position as u32;
            }
        }
        &self.rank
    }

    /// Whether `node`, the `count`-th equal candidate (1-based), replaces
    /// `kept` in a cluster of `nodes` nodes.
    fn replace(&mut self, count: u64, node: u32, kept: u32, nodes: usize) -> bool {
        match self.mode {
            TieBreak::First => false,
            TieBreak::Random => self.rng.below(count) == 0,
            TieBreak::NodeOrder => {
                let rank = self.node_ranks(nodes);
                rank.get(node as usize) < rank.get(kept as usize)
            }
        }
    }
}

impl Default for Ties {
    fn default() -> Self {
        Ties::new(TieBreak::NodeOrder, DEFAULT_SEED)
    }
}

/// Everything a search for the best candidate carries from call to call:
/// the tie-breaker and the memo of per-node results.
#[derive(Debug, Default)]
pub struct Search {
    pub ties: Ties,
    memo: CandidateMemo,
}

impl Search {
    pub fn new(ties: Ties) -> Self {
        Search {
            ties,
            memo: CandidateMemo::default(),
        }
    }
}

/// Everything about a worker's request that decides which GPU sets of a
/// node are candidates (and so, for a rule with a memo epoch, their scores).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    cpu_milli: u32,
    memory_mib: u32,
    gpus_per_worker: u32,
    gpu_milli: u32,
    gpu_memory_mib: u32,
    gpu_model_mask: u64,
}

impl Shape {
    fn of(job: Job<'_>) -> Self {
        Shape {
            cpu_milli: job.cpu_milli(),
            memory_mib: job.memory_mib(),
            gpus_per_worker: job.gpus_per_worker(),
            gpu_milli: job.gpu_milli(),
            gpu_memory_mib: job.gpu_memory_mib(),
            gpu_model_mask: job.gpu_model_mask(),
        }
    }
}

/// One node's best candidate for one shape, valid while the node's version
/// is `version` (0: empty).
#[derive(Clone, Copy, Debug, Default)]
struct MemoEntry {
    version: u64,
    /// NaN: the node has no candidate.
    score: f64,
    /// The GPUs, as bits over the node's GPU range.
    gpus: u64,
}

/// Per shape and node, the best candidate found last time. In the FGD
/// protocol one placement changes one node, so nearly every node's answer
/// for a recurring shape is still valid: this turns a scan that scores every
/// candidate of every node into one that mostly compares versions.
#[derive(Debug, Default)]
struct CandidateMemo {
    /// The rule's memo epoch the entries were computed under.
    epoch: Option<u64>,
    shapes: HashMap<Shape, usize>,
    /// Per shape id, per node.
    tables: Vec<Vec<MemoEntry>>,
    /// Node answers taken from the memo (for tests and benchmarks).
    hits: u64,
}

/// Beyond this many distinct shapes the memo starts over (it holds one
/// entry per node per shape: 24 B × nodes × shapes).
const MAX_MEMO_SHAPES: usize = 256;

impl CandidateMemo {
    /// The table for `job`'s shape under `epoch`, sized for `nodes`.
    fn table(&mut self, epoch: u64, job: Job<'_>, nodes: usize) -> &mut Vec<MemoEntry> {
        if self.epoch != Some(epoch) || self.shapes.len() >= MAX_MEMO_SHAPES {
            self.epoch = Some(epoch);
            self.shapes.clear();
            self.tables.clear();
        }
        let next = self.tables.len();
        let id = *self.shapes.entry(Shape::of(job)).or_insert(next);
        if id == next {
            self.tables.push(Vec::new());
        }
        let table = &mut self.tables[id];
        if table.len() < nodes {
            table.resize(nodes, MemoEntry::default());
        }
        table
    }
}

/// Seed used when the configuration gives none.
pub const DEFAULT_SEED: u64 = 42;

/// A configuration error, reported as the policy's `failed` error.
pub fn config_error(message: impl core::fmt::Display) -> PolicyError {
    PolicyError::Failed(format!("bad configuration: {message}"))
}

/// Removes `key` from a configuration table and converts it, if present.
pub fn take_key<T: serde::de::DeserializeOwned>(
    table: &mut toml::Table,
    key: &str,
) -> Result<Option<T>, PolicyError> {
    match table.remove(key) {
        None => Ok(None),
        Some(value) => value
            .try_into()
            .map(Some)
            .map_err(|e| config_error(format!("`{key}`: {e}"))),
    }
}

/// How one placement policy scores candidates.
pub trait PlacementRule: 'static {
    fn manifest() -> Manifest;

    fn create() -> Self
    where
        Self: Sized;

    /// Takes the rule's own keys out of the configuration table of a fresh
    /// rule; keys left over are reported as unknown. `seed` is the
    /// configuration's seed, for rules that draw random numbers themselves.
    fn configure(&mut self, table: &mut toml::Table, seed: u64) -> Result<(), PolicyError> {
        let _ = (table, seed);
        Ok(())
    }

    /// Which GPU sets of a node are candidates.
    fn selection(&self) -> GpuSelection {
        GpuSelection::BestFit
    }

    /// Start of a round: bring any cache in step with the cluster.
    fn begin_round(&mut self, plan: &Plan<'_>) {
        let _ = plan;
    }

    /// The candidate's score, higher is better; `None` rules it out.
    fn score(&mut self, plan: &Plan<'_>, task: &Task, node: u32, gpus: &[u32]) -> Option<f64>;

    /// `Some(epoch)` promises that a candidate's score is a function of the
    /// node's state (its [`Plan::node_version`]), the task's request and
    /// rule state that changes only together with `epoch`. The driver then
    /// reuses each node's best candidate while its version is unchanged.
    /// `None` (the default): every candidate is scored every time.
    fn memo_epoch(&self) -> Option<u64> {
        None
    }

    /// The plan's tentative state of `node` changed (a worker was charged or
    /// released there).
    fn node_changed(&mut self, plan: &Plan<'_>, node: u32) {
        let _ = (plan, node);
    }

    /// The worker placement for `task`. The default asks [`best_candidate`];
    /// a rule that does not score (Random) replaces it.
    fn choose(
        &mut self,
        plan: &Plan<'_>,
        task: &Task,
        search: &mut Search,
    ) -> Option<WorkerPlacement>
    where
        Self: Sized,
    {
        best_candidate(plan, task, self, search)
    }
}

/// The best candidate of all nodes for one worker of `task`: on each node the
/// best of its candidates (the first on ties, like the reference's GPU
/// choice), across nodes the best score with the search's ties among equals.
/// A node's best is taken from the memo when the rule allows it and the node
/// is unchanged; the result is the same either way.
pub fn best_candidate<R: PlacementRule>(
    plan: &Plan<'_>,
    task: &Task,
    rule: &mut R,
    search: &mut Search,
) -> Option<WorkerPlacement> {
    let selection = rule.selection();
    let cluster = plan.cluster();
    let nodes = cluster.node_count();
    let mut hits = 0;
    let Search { ties, memo } = search;
    let mut memo = rule
        .memo_epoch()
        .map(|epoch| memo.table(epoch, cluster.job(task.job), nodes));
    let mut scratch = Vec::new();
    let mut node_best: Vec<u32> = Vec::new();
    // The best so far: score, node and GPUs. The GPUs are copied only when a
    // node takes the lead, not for every node visited.
    let mut best: Option<(f64, u32)> = None;
    let mut best_gpus: Vec<u32> = Vec::new();
    let mut tied: u64 = 0;
    for node in 0..nodes as u32 {
        let range = cluster.node(node).gpu_range();
        // A reservation makes the answer depend on the job, not only its shape.
        let entry = memo
            .as_deref_mut()
            .filter(|_| range.len() <= 64 && cluster.reserved_by(node).is_none())
            .map(|table| &mut table[node as usize]);
        let version = plan.node_version(node);
        // The node's best score, and its GPUs as bits over the node's range
        // when they came from the memo (else they are in `node_best`).
        let (node_score, memo_gpus) = match entry {
            Some(e) if e.version == version => {
                hits += 1;
                (Some(e.score).filter(|s| !s.is_nan()), Some(e.gpus))
            }
            entry => {
                let mut node_score: Option<f64> = None;
                node_best.clear();
                node_candidates(plan, task, node, selection, &mut scratch, |gpus| {
                    let Some(score) = rule.score(plan, task, node, gpus).filter(|s| !s.is_nan())
                    else {
                        return;
                    };
                    if node_score.is_none_or(|b| score > b) {
                        node_score = Some(score);
                        node_best.clear();
                        node_best.extend_from_slice(gpus);
                    }
                });
                if let Some(e) = entry {
                    *e = MemoEntry {
                        version,
                        score: node_score.unwrap_or(f64::NAN),
                        gpus: node_best
                            .iter()
                            .fold(0, |bits, g| bits | 1 << (g - range.start)),
                    };
                }
                (node_score, None)
            }
        };
        let Some(score) = node_score else { continue };
        let take = match best {
            Some((b, _)) if score < b => false,
            Some((b, kept)) if score == b => {
                tied += 1;
                ties.replace(tied, node, kept, nodes)
            }
            // First candidate, or a strictly better one: a new tie group.
            _ => {
                tied = 1;
                true
            }
        };
        if take {
            best = Some((score, node));
            best_gpus.clear();
            match memo_gpus {
                Some(bits) => {
                    best_gpus.extend(range.clone().filter(|g| bits >> (g - range.start) & 1 == 1))
                }
                None => best_gpus.extend_from_slice(&node_best),
            }
        }
    }
    search.memo.hits += hits;
    best.map(|(_, node)| WorkerPlacement {
        node,
        gpus: best_gpus,
    })
}

/// A [`PlacementRule`] as a scheduler policy: jobs in arrival order, each
/// worker on its rule's best candidate.
pub struct Greedy<R> {
    rule: R,
    search: Search,
}

impl<R: PlacementRule> Greedy<R> {
    pub fn rule(&self) -> &R {
        &self.rule
    }

    /// How many per-node answers came from the memo so far.
    pub fn memo_hits(&self) -> u64 {
        self.search.memo.hits
    }
}

/// The configuration keys every policy of this family understands.
pub const COMMON_KEYS: &str = "seed (integer), tie_break (\"node-order\" | \"random\" | \"first\")";

impl<R: PlacementRule> Policy for Greedy<R> {
    fn manifest() -> Manifest {
        R::manifest()
    }

    fn create() -> Self {
        Greedy {
            rule: R::create(),
            search: Search::default(),
        }
    }

    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        let mut table: toml::Table = config.parse().map_err(config_error)?;
        let seed: u64 = match take_key::<i64>(&mut table, "seed")? {
            // TOML integers are signed; keep every bit so any u64 seed round-trips.
            Some(seed) => seed as u64,
            None => DEFAULT_SEED,
        };
        let mode = match take_key::<String>(&mut table, "tie_break")? {
            Some(text) => TieBreak::parse(&text)?,
            None => TieBreak::NodeOrder,
        };
        let mut rule = R::create();
        rule.configure(&mut table, seed)?;
        if let Some(key) = table.keys().next() {
            return Err(config_error(format!(
                "unknown key `{key}` (known: {COMMON_KEYS} and the policy's own)"
            )));
        }
        self.rule = rule;
        // A fresh search: the memo belonged to the old rule.
        self.search = Search::new(Ties::new(mode, seed));
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        let pending = cluster.pending_by_arrival();
        let mut plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
        self.rule.begin_round(&plan);
        let mut touched: Vec<u32> = Vec::new();
        for job in pending {
            if plan.decisions().len() as u32 >= round.max_decisions {
                break;
            }
            let task = Task::of(job);
            touched.clear();
            let rule = &mut self.rule;
            let search = &mut self.search;
            // A gang that does not fit leaves the plan as it was; the job waits.
            let _ = plan.place_gang(job.index(), job.workers(), |plan| {
                // The previous worker is charged now: let the rule see it.
                if let Some(&node) = touched.last() {
                    rule.node_changed(plan, node);
                }
                let worker = rule.choose(plan, &task, search)?;
                touched.push(worker.node);
                Some(worker)
            });
            touched.sort_unstable();
            touched.dedup();
            for &node in &touched {
                self.rule.node_changed(&plan, node);
            }
        }
        Ok(plan.into_decisions())
    }
}
