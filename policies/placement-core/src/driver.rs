//! The greedy one-by-one placement driver shared by all six policies.
//!
//! Each round the pending jobs are taken in arrival order and each worker is
//! put on the best-scoring candidate (node, GPU set); a job with no feasible
//! candidate for all its workers stays pending (in the FGD protocol the
//! simulator then drops it). A policy is a [`PlacementRule`] (how to score a
//! candidate) wrapped in [`Greedy`], which implements the SDK's `Policy`.

use crate::rng::SplitMix64;
use crate::task::{GpuSelection, Task, node_candidates};
use arbiter_policy_sdk::prelude::*;

/// How equal best scores are resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TieBreak {
    /// Uniformly at random among the tied nodes, as the Kubernetes scheduler
    /// (and therefore the FGD reference simulator) does. Seeded: deterministic.
    Random,
    /// The lowest node index: handy for hand-checked examples.
    First,
}

impl TieBreak {
    fn parse(text: &str) -> Result<Self, PolicyError> {
        match text {
            "random" => Ok(TieBreak::Random),
            "first" => Ok(TieBreak::First),
            other => Err(config_error(format!(
                "tie_break must be \"random\" or \"first\", got {other:?}"
            ))),
        }
    }
}

/// Resolves ties among equally good nodes, by reservoir sampling.
#[derive(Clone, Debug)]
pub struct Ties {
    mode: TieBreak,
    rng: SplitMix64,
}

impl Ties {
    pub fn new(mode: TieBreak, seed: u64) -> Self {
        Ties {
            mode,
            rng: SplitMix64::new(seed),
        }
    }

    /// Whether the `count`-th equal candidate (1-based) replaces the kept one.
    fn replace(&mut self, count: u64) -> bool {
        match self.mode {
            TieBreak::First => false,
            TieBreak::Random => self.rng.below(count) == 0,
        }
    }
}

impl Default for Ties {
    fn default() -> Self {
        Ties::new(TieBreak::Random, DEFAULT_SEED)
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

    /// The plan's tentative state of `node` changed (a worker was charged or
    /// released there).
    fn node_changed(&mut self, plan: &Plan<'_>, node: u32) {
        let _ = (plan, node);
    }

    /// The worker placement for `task`. The default asks [`best_candidate`];
    /// a rule that does not score (Random) replaces it.
    fn choose(&mut self, plan: &Plan<'_>, task: &Task, ties: &mut Ties) -> Option<WorkerPlacement>
    where
        Self: Sized,
    {
        best_candidate(plan, task, self, ties)
    }
}

/// The best candidate of all nodes for one worker of `task`: on each node the
/// best of its candidates (the first on ties, like the reference's GPU
/// choice), across nodes the best score with `ties` among equals.
pub fn best_candidate<R: PlacementRule>(
    plan: &Plan<'_>,
    task: &Task,
    rule: &mut R,
    ties: &mut Ties,
) -> Option<WorkerPlacement> {
    let selection = rule.selection();
    let mut scratch = Vec::new();
    let mut node_best: Vec<u32> = Vec::new();
    let mut best: Option<(f64, WorkerPlacement)> = None;
    let mut tied: u64 = 0;
    for node in 0..plan.cluster().node_count() as u32 {
        let mut node_score: Option<f64> = None;
        node_candidates(plan, task, node, selection, &mut scratch, |gpus| {
            let Some(score) = rule.score(plan, task, node, gpus).filter(|s| !s.is_nan()) else {
                return;
            };
            if node_score.is_none_or(|b| score > b) {
                node_score = Some(score);
                node_best.clear();
                node_best.extend_from_slice(gpus);
            }
        });
        let Some(score) = node_score else { continue };
        let take = match &best {
            Some((b, _)) if score < *b => false,
            Some((b, _)) if score == *b => {
                tied += 1;
                ties.replace(tied)
            }
            // First candidate, or a strictly better one: a new tie group.
            _ => {
                tied = 1;
                true
            }
        };
        if take {
            best = Some((
                score,
                WorkerPlacement {
                    node,
                    gpus: node_best.clone(),
                },
            ));
        }
    }
    best.map(|(_, w)| w)
}

/// A [`PlacementRule`] as a scheduler policy: jobs in arrival order, each
/// worker on its rule's best candidate.
pub struct Greedy<R> {
    rule: R,
    ties: Ties,
}

impl<R: PlacementRule> Greedy<R> {
    pub fn rule(&self) -> &R {
        &self.rule
    }
}

/// The configuration keys every policy of this family understands.
pub const COMMON_KEYS: &str = "seed (integer), tie_break (\"random\" | \"first\")";

impl<R: PlacementRule> Policy for Greedy<R> {
    fn manifest() -> Manifest {
        R::manifest()
    }

    fn create() -> Self {
        Greedy {
            rule: R::create(),
            ties: Ties::default(),
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
            None => TieBreak::Random,
        };
        let mut rule = R::create();
        rule.configure(&mut table, seed)?;
        if let Some(key) = table.keys().next() {
            return Err(config_error(format!(
                "unknown key `{key}` (known: {COMMON_KEYS} and the policy's own)"
            )));
        }
        self.rule = rule;
        self.ties = Ties::new(mode, seed);
        Ok(())
    }

    fn schedule(
        &mut self,
        cluster: &Cluster,
        round: &RoundInfo,
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut pending: Vec<Job<'_>> = cluster.pending_jobs().collect();
        pending.sort_by_key(|j| (j.submit_ms(), j.index()));
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
            let ties = &mut self.ties;
            // A gang that does not fit leaves the plan as it was; the job waits.
            let _ = plan.place_gang(job.index(), job.workers(), |plan| {
                // The previous worker is charged now: let the rule see it.
                if let Some(&node) = touched.last() {
                    rule.node_changed(plan, node);
                }
                let worker = rule.choose(plan, &task, ties)?;
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
