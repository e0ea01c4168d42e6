//! `arbiter replay`: re-run a decision journal.
//!
//! *Bit-for-bit*: a fresh instance of the given component is fed exactly what
//! the live instance was fed (the cell's snapshot at every rebuild, then each
//! round's delta) and asked the same rounds; in every round the live host
//! served with a component of the same digest, its answer must equal the
//! journaled decisions. *Counterfactual*: the workload the journal recorded
//! (the cell's nodes, each job's arrival, shape and run time) is run through
//! the simulator under the given policy and under the recorded one, and the
//! outcome metrics are compared.

use crate::journal::{Journal, Record};
use anyhow::{Context, bail};
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, PolicyInstance, RuntimeConfig};
use arbiter_host::state::{JobRequest, NodeRequest};
use arbiter_policy_sdk::cluster::Cluster;
use arbiter_policy_sdk::model::{Decision, Event};
use arbiter_sim::RunOptions;
use arbiter_sim::core::RunPolicy;
use arbiter_sim::metrics::ReplayMetrics;
use arbiter_sim::models::replay::{ReplayConfig, run_replay};
use arbiter_sim::scenario::{Scenario, SimTask, Source};
use serde::Serialize;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

/// A round whose replayed answer differs from the journal.
#[derive(Clone, Debug, Serialize)]
pub struct Mismatch {
    pub epoch: u64,
    pub journaled: Vec<Decision>,
    pub replayed: Result<Vec<Decision>, String>,
}

/// Outcome of the bit-for-bit check.
#[derive(Clone, Debug, Serialize)]
pub struct ExactReplay {
    pub cell: String,
    pub policy_digest: String,
    pub rounds_in_journal: u64,
    /// Rounds the live host served with a component of this digest.
    pub rounds_compared: u64,
    pub rounds_identical: u64,
    /// The first few differences.
    pub mismatches: Vec<Mismatch>,
    /// Digests that served rounds of this cell, with their round counts.
    pub served_by: Vec<(String, u64)>,
    pub torn_lines: usize,
}

/// Outcome of the counterfactual run.
#[derive(Clone, Debug, Serialize)]
pub struct Counterfactual {
    pub jobs: usize,
    pub nodes: usize,
    pub recorded_policy: String,
    pub recorded: ReplayMetrics,
    pub candidate_policy: String,
    pub candidate: ReplayMetrics,
}

/// Most mismatches kept in a report.
const MAX_MISMATCHES: usize = 10;

fn engine() -> anyhow::Result<PolicyEngine> {
    // Offline: a generous deadline, so a slow machine never fakes a mismatch.
    PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(10),
        ..RuntimeConfig::default()
    })
}

/// Compiles a component for replay.
pub fn compile(wasm: &[u8]) -> anyhow::Result<CompiledPolicy> {
    engine()?
        .compile(wasm)
        .map_err(|e| anyhow::anyhow!("compiling the replay policy: {e}"))
}

/// A configured instance, as the live host starts one.
fn fresh_instance(policy: &CompiledPolicy, config: &str) -> anyhow::Result<PolicyInstance> {
    let mut instance = policy
        .instantiate()
        .map_err(|e| anyhow::anyhow!("instantiating: {e}"))?;
    instance
        .configure(config)
        .map_err(|e| anyhow::anyhow!("configuring: {e}"))?;
    Ok(instance)
}

/// Replays one cell of a journal with `policy`, comparing its answers.
pub fn exact(
    journal: &Journal,
    cell: &str,
    policy: &CompiledPolicy,
    config: Option<&str>,
) -> anyhow::Result<ExactReplay> {
    let mut out = ExactReplay {
        cell: cell.to_string(),
        policy_digest: policy.digest.clone(),
        rounds_in_journal: 0,
        rounds_compared: 0,
        rounds_identical: 0,
        mismatches: Vec::new(),
        served_by: Vec::new(),
        torn_lines: journal.skipped.len(),
    };
    let config = match config {
        Some(config) => config.to_string(),
        None => journaled_config(journal, cell, &policy.digest)
            .unwrap_or_else(|| policy.manifest.default_config.clone()),
    };
    let mut instance = None;
    for record in &journal.records {
        match record {
            Record::Snapshot {
                cell: c, snapshot, ..
            } if c == cell => {
                // The live host starts a fresh instance on every rebuild.
                let mut fresh = fresh_instance(policy, &config)?;
                fresh
                    .resync((**snapshot).clone())
                    .map_err(|e| anyhow::anyhow!("resync at epoch {}: {e}", snapshot.epoch))?;
                instance = Some(fresh);
            }
            Record::Round(r) if r.cell == cell => {
                out.rounds_in_journal += 1;
                match out.served_by.iter_mut().find(|(d, _)| *d == r.digest) {
                    Some((_, n)) => *n += 1,
                    None => out.served_by.push((r.digest.clone(), 1)),
                }
                let Some(inst) = instance.as_mut() else {
                    bail!("journal has a round of `{cell}` before its first snapshot");
                };
                if inst.mirror_epoch() != Some(r.delta.base_epoch) {
                    bail!(
                        "journal gap in `{cell}`: mirror at {:?}, next delta starts at {}",
                        inst.mirror_epoch(),
                        r.delta.base_epoch
                    );
                }
                inst.apply(&r.delta)
                    .map_err(|e| anyhow::anyhow!("delta to epoch {}: {e}", r.delta.epoch))?;
                if r.digest != policy.digest {
                    continue;
                }
                out.rounds_compared += 1;
                let replayed = inst.schedule(r.round).map_err(|e| e.to_string());
                if replayed.as_ref() == Ok(&r.decisions) {
                    out.rounds_identical += 1;
                } else {
                    if replayed.is_err() {
                        // A trapped instance is never re-entered; the live host restarts it.
                        *inst = fresh_instance(policy, &config)?;
                    }
                    if out.mismatches.len() < MAX_MISMATCHES {
                        out.mismatches.push(Mismatch {
                            epoch: r.round.epoch,
                            journaled: r.decisions.clone(),
                            replayed,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The workload a cell's journal recorded: its nodes and every job's arrival,
/// shape and run time (the run time the job asked for, which is what the
/// simulated pool ran it for).
pub fn scenario(journal: &Journal, cell: &str) -> anyhow::Result<Scenario> {
    let mut mirror: Option<Cluster> = None;
    let mut nodes: Vec<NodeRequest> = Vec::new();
    let mut tasks: Vec<SimTask> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for record in &journal.records {
        match record {
            Record::Snapshot {
                cell: c, snapshot, ..
            } if c == cell => {
                let cluster = Cluster::from_snapshot((**snapshot).clone())
                    .context("journal snapshot does not build a mirror")?;
                for n in cluster.nodes() {
                    if !nodes.iter().any(|x| x.name == n.name()) {
                        nodes.push(node_request(&cluster, n.index()));
                    }
                }
                for j in cluster.jobs() {
                    push_task(&cluster, j.index(), &mut tasks, &mut seen);
                }
                mirror = Some(cluster);
            }
            Record::Round(r) if r.cell == cell => {
                let Some(cluster) = mirror.as_mut() else {
                    continue;
                };
                for event in &r.delta.events {
                    cluster
                        .apply_event(event)
                        .context("journal delta does not apply")?;
                    match event {
                        Event::JobAdded(_) => {
                            let index = cluster.job_count() as u32 - 1;
                            push_task(cluster, index, &mut tasks, &mut seen);
                        }
                        Event::NodeAdded(_) => {
                            let index = cluster.node_count() as u32 - 1;
                            nodes.push(node_request(cluster, index));
                        }
                        _ => {}
                    }
                }
                cluster.set_epoch(r.delta.epoch, r.delta.now_ms);
            }
            _ => {}
        }
    }
    if nodes.is_empty() {
        bail!("the journal has no snapshot of cell `{cell}`");
    }
    // Relative times: the simulator's clock starts at the first arrival.
    let t0 = tasks.iter().map(|t| t.arrival_ms).min().unwrap_or(0);
    for t in &mut tasks {
        t.arrival_ms -= t0;
        if t.request.deadline_ms > 0 {
            t.request.deadline_ms = t.request.deadline_ms.saturating_sub(t0);
        }
    }
    tasks.sort_by_key(|t| t.arrival_ms);
    Scenario {
        name: format!("journal:{cell}"),
        source: Source::Journal,
        nodes,
        tasks,
        rejected: Vec::new(),
        unplaceable: Vec::new(),
    }
    .finish()
}

fn node_request(cluster: &Cluster, index: u32) -> NodeRequest {
    let n = cluster.node(index);
    let model = n
        .gpus()
        .next()
        .map(|g| g.model().to_string())
        .unwrap_or_default();
    let gpu_memory = n.gpus().next().map_or(0, |g| g.memory_mib());
    NodeRequest {
        name: n.name().to_string(),
        pool: n.pool().to_string(),
        cpu_milli: n.cpu_milli(),
        memory_mib: n.memory_mib(),
        gpu_model: model,
        gpu_memory_mib: gpu_memory,
        gpu_count: n.gpu_range().len() as u32,
        on_loan: n.on_loan(),
    }
}

fn push_task(cluster: &Cluster, index: u32, tasks: &mut Vec<SimTask>, seen: &mut HashSet<String>) {
    let j = cluster.job(index);
    if !seen.insert(j.name().to_string()) {
        return;
    }
    let mask = j.gpu_model_mask();
    let gpu_models = cluster
        .gpu_models()
        .iter()
        .enumerate()
        .filter(|(slot, _)| mask & (1u64 << slot) != 0)
        .map(|(_, &id)| cluster.string(id).to_string())
        .collect();
    let request = JobRequest {
        name: j.name().to_string(),
        tenant: j.tenant().to_string(),
        kind: j.kind(),
        qos: j.qos(),
        priority: j.priority(),
        workers: j.workers(),
        min_workers: j.min_workers(),
        max_workers: j.max_workers(),
        cpu_milli: j.cpu_milli(),
        memory_mib: j.memory_mib(),
        gpus_per_worker: j.gpus_per_worker(),
        gpu_milli: j.gpu_milli(),
        gpu_memory_mib: 0,
        gpu_models,
        estimate_ms: j.estimate_ms().unwrap_or(0),
        deadline_ms: j.deadline_ms().unwrap_or(0),
        checkpointed: j.checkpointed(),
    };
    tasks.push(SimTask {
        duration_ms: j.estimate_ms(),
        arrival_ms: j.submit_ms(),
        file_index: tasks.len(),
        request,
    });
}

/// One side of a counterfactual: a policy and the configuration it runs with.
pub struct Contender<'a> {
    pub label: &'a str,
    pub policy: &'a CompiledPolicy,
    /// `None`: the configuration the journal recorded for this policy's
    /// digest in this cell, else the manifest's default.
    pub config: Option<&'a str>,
}

/// The configuration that served the most of `cell`'s rounds answered by a
/// component of `digest`, as the journal recorded it (a round carries its
/// generation's configuration when the serving generation changes).
pub fn journaled_config(journal: &Journal, cell: &str, digest: &str) -> Option<String> {
    let mut current: Option<&str> = None;
    let mut counts: Vec<(&str, u64)> = Vec::new();
    for record in &journal.records {
        match record {
            Record::Snapshot { cell: c, .. } if c == cell => current = None,
            Record::Round(r) if r.cell == cell => {
                if let Some(config) = &r.config {
                    current = Some(config);
                }
                if r.digest != digest {
                    continue;
                }
                if let Some(config) = current {
                    match counts.iter_mut().find(|(c, _)| *c == config) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((config, 1)),
                    }
                }
            }
            _ => {}
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map(|(c, _)| c.to_string())
}

/// Runs the journal's workload under `recorded` and `candidate`.
pub fn counterfactual(
    journal: &Journal,
    cell: &str,
    recorded: Contender<'_>,
    candidate: Contender<'_>,
) -> anyhow::Result<Counterfactual> {
    let scenario = scenario(journal, cell)?;
    let opts = RunOptions {
        keep_records: false,
        ..RunOptions::default()
    };
    let rules = ReplayConfig {
        round_interval_ms: 100,
        ..ReplayConfig::default()
    };
    let run = |side: &Contender<'_>| -> anyhow::Result<ReplayMetrics> {
        let config = match side.config {
            Some(config) => Some(config.to_string()),
            None => journaled_config(journal, cell, &side.policy.digest),
        };
        let policy = RunPolicy {
            compiled: side.policy.clone(),
            config,
        };
        let out = run_replay(&scenario, &policy, side.label, &rules, &opts)
            .with_context(|| format!("simulating `{}`", side.label))?;
        out.replay
            .ok_or_else(|| anyhow::anyhow!("the simulator returned no replay metrics"))
    };
    Ok(Counterfactual {
        jobs: scenario.tasks.len(),
        nodes: scenario.nodes.len(),
        recorded_policy: recorded.label.to_string(),
        recorded: run(&recorded)?,
        candidate_policy: candidate.label.to_string(),
        candidate: run(&candidate)?,
    })
}

/// Reads a journal, failing clearly on a wrong path.
pub fn read(path: &Path) -> anyhow::Result<Journal> {
    let j = Journal::read(path)?;
    if j.records.is_empty() {
        bail!("{} holds no journal records", path.display());
    }
    Ok(j)
}

/// The digest the journal's active rounds of `cell` were served with most.
pub fn main_digest(journal: &Journal, cell: &str) -> Option<String> {
    let mut counts: Vec<(String, u64)> = Vec::new();
    for r in &journal.records {
        if let Record::Round(r) = r
            && r.cell == cell
            && !r.digest.is_empty()
        {
            match counts.iter_mut().find(|(d, _)| *d == r.digest) {
                Some((_, n)) => *n += 1,
                None => counts.push((r.digest.clone(), 1)),
            }
        }
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(d, _)| d)
}
