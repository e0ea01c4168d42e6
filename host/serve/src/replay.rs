//! `arbiter replay`: re-run a decision journal.
//!
//! *Bit-for-bit*: a fresh instance of the given component is fed exactly what
//! the live instance was fed (the cell's snapshot at every rebuild, then each
//! round's delta) and asked the same rounds; in every round the live host
//! served with a component of the same digest, its answer must equal the
//! journaled decisions. Every other round is checked too: one the native
//! fallback served against a native instance fed the same way, one nobody
//! served (every policy faulted) for applying nothing — so a stalled
//! cluster's journal does not pass as "0 of 0 rounds reproduced". *Counterfactual*: the workload the journal recorded
//! (the cell's nodes, each job's arrival, shape and run time) is run through
//! the simulator under the given policy and under the recorded one, and the
//! outcome metrics are compared.

use crate::journal::{Journal, Record};
use anyhow::{Context, bail};
use arbiter_host::roles::scheduler::native_fallback;
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, PolicyInstance, RuntimeConfig};
use arbiter_host::state::{JobRequest, NodeRequest};
use arbiter_policy_sdk::cluster::Cluster;
use arbiter_policy_sdk::model::{Decision, Event, Snapshot};
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
    /// Who served the round live: `active`/`fallback` (a component), `native`, `nobody`.
    pub served: String,
    pub journaled: Vec<Decision>,
    pub replayed: Result<Vec<Decision>, String>,
}

impl Mismatch {
    /// The difference in words: what the journal applied, what the replay answered.
    pub fn describe(&self) -> String {
        let replayed = match &self.replayed {
            Ok(d) => describe_decisions(d),
            Err(e) => format!("a fault ({e})"),
        };
        format!(
            "epoch {} (served by {}): the journal applied {}; the replay answered {}",
            self.epoch,
            self.served,
            describe_decisions(&self.journaled),
            replayed
        )
    }
}

/// Decisions as a person reads them: `place job 3 on node 1 GPUs [0, 1]; preempt job 4`.
pub fn describe_decisions(decisions: &[Decision]) -> String {
    if decisions.is_empty() {
        return "nothing".into();
    }
    let workers = |w: &[arbiter_policy_sdk::model::WorkerPlacement]| {
        w.iter()
            .map(|w| format!("node {} GPUs {:?}", w.node, w.gpus))
            .collect::<Vec<_>>()
            .join(", ")
    };
    decisions
        .iter()
        .map(|d| match d {
            Decision::Place(j, w) => format!("place job {j} on {}", workers(w)),
            Decision::Reserve(j, nodes) => format!("reserve nodes {nodes:?} for job {j}"),
            Decision::Unreserve(j) => format!("unreserve job {j}"),
            Decision::Preempt(j) => format!("preempt job {j}"),
            Decision::ScaleOut(j, w) => format!("scale job {j} out onto {}", workers(w)),
            Decision::ScaleIn(j, k) => format!("scale job {j} in by workers {k:?}"),
            Decision::SetQos(j, q) => format!("set job {j}'s QoS to {q}"),
            Decision::Migrate(j, w) => format!("migrate job {j} to {}", workers(w)),
            Decision::ReserveGpus(j, g) => format!("reserve GPUs {g:?} for job {j}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
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
    /// Rounds the native fallback served, and how many it answers the same way again.
    pub native_rounds_compared: u64,
    pub native_rounds_identical: u64,
    /// Rounds nobody served (every policy faulted), and how many applied nothing, as they must.
    pub unserved_rounds: u64,
    pub unserved_rounds_empty: u64,
    /// Lines set aside, with their line numbers and why (a torn last line, invalid UTF-8).
    pub skipped_lines: Vec<(usize, String)>,
}

impl ExactReplay {
    /// Every round checked held.
    pub fn all_identical(&self) -> bool {
        self.rounds_identical == self.rounds_compared
            && self.native_rounds_identical == self.native_rounds_compared
            && self.unserved_rounds_empty == self.unserved_rounds
    }
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
    exact_with_progress(journal, cell, policy, config, &mut |_, _| {})
}

/// [`exact`], telling `progress(records done, records in all)` as it goes
/// (every 1,000 records): a long journal takes minutes.
pub fn exact_with_progress(
    journal: &Journal,
    cell: &str,
    policy: &CompiledPolicy,
    config: Option<&str>,
    progress: &mut dyn FnMut(usize, usize),
) -> anyhow::Result<ExactReplay> {
    known_cell(journal, cell)?;
    let mut out = ExactReplay {
        cell: cell.to_string(),
        policy_digest: policy.digest.clone(),
        rounds_in_journal: 0,
        rounds_compared: 0,
        rounds_identical: 0,
        mismatches: Vec::new(),
        served_by: Vec::new(),
        native_rounds_compared: 0,
        native_rounds_identical: 0,
        unserved_rounds: 0,
        unserved_rounds_empty: 0,
        skipped_lines: journal.skipped.clone(),
    };
    let config = match config {
        Some(config) => config.to_string(),
        None => journaled_config(journal, cell, &policy.digest)
            .unwrap_or_else(|| policy.manifest.default_config.clone()),
    };
    let mut instance = None;
    let mut native: Option<PolicyInstance> = None;
    let fresh_native = |snapshot: Option<&Snapshot>| -> anyhow::Result<PolicyInstance> {
        let mut n = PolicyInstance::native(native_fallback());
        if let Some(s) = snapshot {
            n.resync(s.clone())
                .map_err(|e| anyhow::anyhow!("native resync at epoch {}: {e}", s.epoch))?;
        }
        Ok(n)
    };
    let mismatch = |out: &mut ExactReplay,
                    r: &crate::journal::RoundRecord,
                    replayed: Result<Vec<Decision>, String>| {
        if out.mismatches.len() < MAX_MISMATCHES {
            out.mismatches.push(Mismatch {
                epoch: r.round.epoch,
                served: r.served.clone(),
                journaled: r.decisions.clone(),
                replayed,
            });
        }
    };
    let total = journal.records.len();
    for (done, record) in journal.records.iter().enumerate() {
        if done % 1000 == 0 {
            progress(done, total);
        }
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
                native = Some(fresh_native(Some(snapshot))?);
            }
            // Where a segment begins. A reading that starts here starts
            // fresh instances; one already following the cell resyncs the
            // instances it has (the live policy went on without a restart:
            // its own state stays, its mirror moves to the checkpoint).
            Record::Checkpoint {
                cell: c, snapshot, ..
            } if c == cell => {
                let resync = |inst: &mut PolicyInstance| {
                    inst.resync((**snapshot).clone())
                        .map_err(|e| anyhow::anyhow!("resync at epoch {}: {e}", snapshot.epoch))
                };
                match instance.as_mut() {
                    Some(inst) => resync(inst)?,
                    None => {
                        let mut fresh = fresh_instance(policy, &config)?;
                        resync(&mut fresh)?;
                        instance = Some(fresh);
                    }
                }
                let kept = native
                    .as_mut()
                    .is_some_and(|n| n.resync((**snapshot).clone()).is_ok());
                if !kept {
                    native = Some(fresh_native(Some(snapshot))?);
                }
            }
            Record::Round(r) if r.cell == cell => {
                out.rounds_in_journal += 1;
                match out.served_by.iter_mut().find(|(d, _)| *d == r.digest) {
                    Some((_, n)) => *n += 1,
                    None => out.served_by.push((r.digest.clone(), 1)),
                }
                let Some(inst) = instance.as_mut() else {
                    // The snapshot is most often a line set aside (its file lost or damaged).
                    let first_set_aside = journal
                        .skipped
                        .first()
                        .map(|(line, why)| format!("; line {line} was set aside: {why}"))
                        .unwrap_or_default();
                    bail!(
                        "journal has a round of `{cell}` before its first snapshot{first_set_aside}"
                    );
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
                // The native mirror follows the same deltas; one that cannot
                // (it faulted earlier) is rebuilt at the next snapshot.
                if let Some(n) = native.as_mut()
                    && n.apply(&r.delta).is_err()
                {
                    native = None;
                }
                match r.served.as_str() {
                    "native" => {
                        out.native_rounds_compared += 1;
                        let replayed = match native.as_mut() {
                            Some(n) => n.schedule(r.round).map_err(|e| e.to_string()),
                            None => Err("the native mirror fell out of step".into()),
                        };
                        if replayed.as_ref() == Ok(&r.decisions) {
                            out.native_rounds_identical += 1;
                        } else {
                            if replayed.is_err() {
                                native = None;
                            }
                            mismatch(&mut out, r, replayed);
                        }
                        continue;
                    }
                    "nobody" => {
                        out.unserved_rounds += 1;
                        if r.decisions.is_empty() {
                            out.unserved_rounds_empty += 1;
                        } else {
                            mismatch(&mut out, r, Ok(Vec::new()));
                        }
                        continue;
                    }
                    _ => {}
                }
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
                    mismatch(&mut out, r, replayed);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A cell the journal has records of; else the error lists the ones it has (a mistyped
/// `--cell` read as "no round was served by this policy").
fn known_cell(journal: &Journal, cell: &str) -> anyhow::Result<()> {
    let cells = journal.cells();
    if !cells.iter().any(|c| c == cell) {
        bail!(
            "the journal has no cell `{cell}` (its cells: {})",
            cells.join(", ")
        );
    }
    Ok(())
}

/// The workload a cell's journal recorded: its nodes and every job's arrival,
/// shape and run time (the run time the job asked for, which is what the
/// simulated pool ran it for).
pub fn scenario(journal: &Journal, cell: &str) -> anyhow::Result<Scenario> {
    known_cell(journal, cell)?;
    let mut mirror: Option<Cluster> = None;
    let mut nodes: Vec<NodeRequest> = Vec::new();
    let mut tasks: Vec<SimTask> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for record in &journal.records {
        match record {
            Record::Snapshot {
                cell: c, snapshot, ..
            }
            | Record::Checkpoint {
                cell: c, snapshot, ..
            } if c == cell => {
                // A checkpoint is the state the deltas lead to: the mirror
                // moves to it; jobs already seen are not added twice.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::RoundRecord;
    use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};
    use std::sync::Arc;

    fn round(
        delta: Arc<arbiter_policy_sdk::model::Delta>,
        info: arbiter_policy_sdk::model::RoundInfo,
        served: &str,
        decisions: Vec<Decision>,
    ) -> Record {
        Record::Round(Box::new(RoundRecord {
            cell: "control".into(),
            delta: (*delta).clone(),
            round: info,
            served: served.into(),
            slot: "default".into(),
            generation: None,
            digest: String::new(),
            decisions,
            faults: Vec::new(),
            fuel: None,
            latency_us: 0,
            policy_us: 0,
            config: None,
        }))
    }

    /// A journal of a cluster the native fallback served (its policy
    /// faulting), then nobody: those rounds are checked, and a tampered one
    /// is caught and said in words.
    #[test]
    fn rounds_the_fallback_or_nobody_served_are_checked_too() -> anyhow::Result<()> {
        let mut state = ClusterState::new();
        state.add_node(NodeRequest::gpus("n0", "p", "A100", 81_920, 4))?;
        let mut records = vec![Record::Snapshot {
            cell: "control".into(),
            wall_ms: 0,
            snapshot: Box::new(state.snapshot()),
        }];
        let mut native = PolicyInstance::native(native_fallback());
        native
            .resync(state.snapshot())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        state.submit(JobRequest::gpus("a", "t", 1, 2))?;
        state.submit(JobRequest::gpus("b", "t", 1, 2))?;
        // Round 1: the native fallback served it.
        let (delta, info) = state.begin_round(16);
        native.apply(&delta).map_err(|e| anyhow::anyhow!("{e}"))?;
        let answer = native.schedule(info).map_err(|e| anyhow::anyhow!("{e}"))?;
        assert!(!answer.is_empty());
        records.push(round(delta, info, "native", answer.clone()));
        state.apply(answer)?;
        // Round 2: nobody served it; nothing was applied.
        state.submit(JobRequest::gpus("c", "t", 1, 4))?;
        let (delta, info) = state.begin_round(16);
        records.push(round(delta, info, "nobody", Vec::new()));
        let journal = Journal {
            records: records.clone(),
            ..Journal::default()
        };
        let policy = compile(
            arbiter_policies::get("best-fit").ok_or_else(|| anyhow::anyhow!("no best-fit"))?,
        )?;
        let out = exact(&journal, "control", &policy, None)?;
        assert_eq!(
            (out.native_rounds_compared, out.native_rounds_identical),
            (1, 1)
        );
        // A mistyped cell names the cells there are.
        let error = exact(&journal, "contrl", &policy, None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("no cell `contrl` (its cells: control)"),
            "{error}"
        );
        assert_eq!((out.unserved_rounds, out.unserved_rounds_empty), (1, 1));
        assert_eq!(out.rounds_compared, 0, "best-fit served nothing here");
        assert!(out.all_identical());

        // Tampered: the journal says the fallback placed nothing.
        if let Some(Record::Round(r)) = records.get_mut(1) {
            r.decisions.clear();
        }
        let tampered = Journal {
            records,
            ..Journal::default()
        };
        let out = exact(&tampered, "control", &policy, None)?;
        assert!(!out.all_identical());
        let said = out.mismatches[0].describe();
        assert!(
            said.contains("served by native")
                && said.contains("applied nothing")
                && said.contains("place job 0"),
            "{said}"
        );
        Ok(())
    }
}
