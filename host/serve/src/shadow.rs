//! Shadow execution: a candidate policy answers every round the incumbent
//! answers, on exactly the same state, off the round's critical path.
//!
//! The round loop only sends (delta, round, incumbent decisions) down a
//! channel. The shadow thread keeps its own mirror of the cell (from the same
//! snapshot and deltas), asks the candidate instance, validates its answer
//! against the mirror like the host would, and diffs the two answers:
//! which jobs each would have started and where, and the fragmentation each
//! answer leaves behind. Nothing the candidate says is ever enforced.

use crate::stats::{BatchMeans, fragmentation_pct, pending_demand};
use arbiter_host::runtime::PolicyInstance;
use arbiter_policy_sdk::cluster::Cluster;
use arbiter_policy_sdk::model::{Decision, Delta, RoundInfo, Snapshot, WorkerPlacement};
use arbiter_policy_sdk::plan::Plan;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

/// Differences kept for `status` (the most recent ones).
const RECENT_DIFFS: usize = 50;

pub enum ShadowInput {
    Snapshot(Box<Snapshot>),
    Round {
        delta: Delta,
        round: RoundInfo,
        incumbent: Vec<Decision>,
    },
}

/// What the shadow run has seen so far.
#[derive(Clone, Debug, Default)]
pub struct ShadowState {
    pub rounds: u64,
    pub rounds_identical: u64,
    pub placements_differing: u64,
    pub candidate_only: u64,
    pub incumbent_only: u64,
    pub incumbent_frag: BatchMeans,
    pub candidate_frag: BatchMeans,
    pub candidate_faults: u64,
    pub candidate_invalid: u64,
    pub candidate_latency_ms: BatchMeans,
    pub recent: VecDeque<PlacementDiff>,
    pub last_fault: String,
    /// Jobs (by their unique name in the cell) whose placement differed at least once.
    pub jobs_differing: std::collections::HashSet<String>,
}

/// What a shadow run found, as experiment reports show it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShadowSummary {
    pub rounds: u64,
    pub rounds_identical: u64,
    /// Placements that differed, counted once per round they differed in.
    pub placements_differing: u64,
    pub candidate_only: u64,
    pub incumbent_only: u64,
    #[serde(deserialize_with = "crate::views::nan_if_null")]
    pub incumbent_fragmentation_pct: f64,
    #[serde(deserialize_with = "crate::views::nan_if_null")]
    pub candidate_fragmentation_pct: f64,
    pub candidate_faults: u64,
    pub recent: Vec<PlacementDiff>,
    pub candidate_invalid: u64,
    /// Distinct jobs whose placement differed at least once.
    pub jobs_differing: u64,
}

/// One job placed differently by the incumbent and the candidate in a round.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlacementDiff {
    pub epoch: u64,
    pub job: u64,
    pub job_name: String,
    /// Each side's placement in words ("" where that side did not place it).
    pub incumbent: String,
    pub candidate: String,
}

impl ShadowState {
    pub fn summary(&self) -> ShadowSummary {
        ShadowSummary {
            rounds: self.rounds,
            rounds_identical: self.rounds_identical,
            placements_differing: self.placements_differing,
            candidate_only: self.candidate_only,
            incumbent_only: self.incumbent_only,
            incumbent_fragmentation_pct: self.incumbent_frag.mean(),
            candidate_fragmentation_pct: self.candidate_frag.mean(),
            candidate_faults: self.candidate_faults,
            recent: self.recent.iter().cloned().collect(),
            candidate_invalid: self.candidate_invalid,
            jobs_differing: self.jobs_differing.len() as u64,
        }
    }
}

/// The running shadow: a channel in, shared results out.
pub struct Shadow {
    tx: mpsc::Sender<ShadowInput>,
    pub state: Arc<Mutex<ShadowState>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Shadow {
    /// Starts the shadow thread with a fresh candidate instance.
    pub fn start(instance: PolicyInstance) -> anyhow::Result<Shadow> {
        let (tx, rx) = mpsc::channel();
        let state = Arc::new(Mutex::new(ShadowState::default()));
        let shared = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("arbiter-shadow".into())
            .spawn(move || run(instance, &rx, &shared))?;
        Ok(Shadow {
            tx,
            state,
            thread: Some(thread),
        })
    }

    pub fn send(&self, input: ShadowInput) {
        // A dead shadow thread only loses the experiment's diff, never a round.
        let _ = self.tx.send(input);
    }

    /// Waits until everything sent so far has been processed (tests, status).
    pub fn drain(self) -> ShadowState {
        let Shadow { tx, state, thread } = self;
        drop(tx);
        if let Some(t) = thread {
            let _ = t.join();
        }
        state.lock().clone()
    }
}

fn run(
    mut instance: PolicyInstance,
    rx: &mpsc::Receiver<ShadowInput>,
    shared: &Mutex<ShadowState>,
) {
    let mut mirror: Option<Cluster> = None;
    while let Ok(input) = rx.recv() {
        match input {
            ShadowInput::Snapshot(snapshot) => match Cluster::from_snapshot((*snapshot).clone()) {
                Ok(c) => {
                    mirror = Some(c);
                    if let Err(fault) = instance.resync(*snapshot) {
                        let mut s = shared.lock();
                        s.candidate_faults += 1;
                        s.last_fault = fault.to_string();
                    }
                }
                Err(e) => tracing::error!(error = %e, "shadow: bad snapshot"),
            },
            ShadowInput::Round {
                delta,
                round,
                incumbent,
            } => {
                let Some(cluster) = mirror.as_mut() else {
                    continue;
                };
                if let Err(e) = cluster.apply(&delta) {
                    tracing::error!(error = %e, "shadow: mirror lost sync; stopping the shadow");
                    mirror = None;
                    continue;
                }
                let step = shadow_round(&mut instance, cluster, &delta, round, &incumbent);
                step.record(shared);
            }
        }
    }
}

struct Step {
    candidate: Result<Vec<Decision>, String>,
    invalid: bool,
    diffs: Vec<PlacementDiff>,
    candidate_only: u64,
    incumbent_only: u64,
    identical: bool,
    incumbent_frag: f64,
    candidate_frag: Option<f64>,
    latency_ms: f64,
}

impl Step {
    fn record(self, shared: &Mutex<ShadowState>) {
        let mut s = shared.lock();
        s.rounds += 1;
        s.incumbent_frag.push(self.incumbent_frag);
        s.candidate_latency_ms.push(self.latency_ms);
        match self.candidate {
            Err(fault) => {
                s.candidate_faults += 1;
                s.last_fault = fault;
                return;
            }
            Ok(_) if self.invalid => {
                s.candidate_invalid += 1;
                return;
            }
            Ok(_) => {}
        }
        if let Some(f) = self.candidate_frag {
            s.candidate_frag.push(f);
        }
        if self.identical {
            s.rounds_identical += 1;
        }
        s.candidate_only += self.candidate_only;
        s.incumbent_only += self.incumbent_only;
        s.placements_differing += self.diffs.len() as u64;
        for d in self.diffs {
            if !s.jobs_differing.contains(&d.job_name) {
                s.jobs_differing.insert(d.job_name.clone());
            }
            if s.recent.len() == RECENT_DIFFS {
                s.recent.pop_front();
            }
            s.recent.push_back(d);
        }
    }
}

fn shadow_round(
    instance: &mut PolicyInstance,
    cluster: &Cluster,
    delta: &Delta,
    round: RoundInfo,
    incumbent: &[Decision],
) -> Step {
    let demand = pending_demand(cluster);
    let mut incumbent_plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
    for d in incumbent {
        // Validated by the host already; a failure here would be a host bug.
        if let Err(e) = incumbent_plan.apply(d.clone()) {
            tracing::error!(error = %e, "shadow: incumbent decision does not apply to the mirror");
        }
    }
    let incumbent_frag = fragmentation_pct(&incumbent_plan, demand);
    let started = Instant::now();
    let answer = ask(instance, cluster, delta, round);
    let latency_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut step = Step {
        candidate: answer.clone(),
        invalid: false,
        diffs: Vec::new(),
        candidate_only: 0,
        incumbent_only: 0,
        identical: false,
        incumbent_frag,
        candidate_frag: None,
        latency_ms,
    };
    let Ok(candidate) = answer else {
        return step;
    };
    let mut candidate_plan = Plan::new(cluster).with_max_decisions(round.max_decisions);
    for d in &candidate {
        if candidate_plan.apply(d.clone()).is_err() {
            step.invalid = true;
            return step;
        }
    }
    step.candidate_frag = Some(fragmentation_pct(&candidate_plan, demand));
    step.identical = candidate == incumbent;
    let inc = placements(incumbent);
    let cand = placements(&candidate);
    let jobs: std::collections::BTreeSet<u32> = inc.keys().chain(cand.keys()).copied().collect();
    for job in jobs {
        let (a, b) = (inc.get(&job), cand.get(&job));
        if a == b {
            continue;
        }
        match (a, b) {
            (Some(_), None) => step.incumbent_only += 1,
            (None, Some(_)) => step.candidate_only += 1,
            _ => {}
        }
        let j = cluster.job(job);
        step.diffs.push(PlacementDiff {
            epoch: round.epoch,
            job: u64::from(job),
            job_name: j.name().to_string(),
            incumbent: a.map(|w| describe(cluster, w)).unwrap_or_default(),
            candidate: b.map(|w| describe(cluster, w)).unwrap_or_default(),
        });
    }
    step
}

fn ask(
    instance: &mut PolicyInstance,
    cluster: &Cluster,
    delta: &Delta,
    round: RoundInfo,
) -> Result<Vec<Decision>, String> {
    if instance.mirror_epoch() == Some(delta.base_epoch) {
        instance.apply(delta).map_err(|f| f.to_string())?;
    } else {
        instance
            .resync(cluster.to_snapshot())
            .map_err(|f| f.to_string())?;
    }
    instance.schedule(round).map_err(|f| f.to_string())
}

/// Job index → where a decision starts or moves it.
fn placements(decisions: &[Decision]) -> BTreeMap<u32, &[WorkerPlacement]> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Place(j, w) | Decision::Migrate(j, w) => Some((*j, w.as_slice())),
            _ => None,
        })
        .collect()
}

fn describe(cluster: &Cluster, workers: &[WorkerPlacement]) -> String {
    workers
        .iter()
        .map(|w| {
            let node = cluster.node(w.node);
            let base = node.gpu_range().start;
            let gpus: Vec<String> = w
                .gpus
                .iter()
                .map(|g| g.saturating_sub(base).to_string())
                .collect();
            format!("{}[{}]", node.name(), gpus.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
