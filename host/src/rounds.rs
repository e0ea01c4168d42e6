//! The scheduling round: delta → policy → validation → state, with fallbacks.
//!
//! A round closes the state's epoch, then asks the slot's generations in
//! fallback order (active, then older healthy ones) and finally the native
//! built-in policy. The first answer that passes validation is applied; a
//! fault anywhere is counted against its generation, logged with the input
//! that caused it, and can quarantine the generation. The host never skips a
//! round and never applies a partial or invalid answer.

use crate::registry::{FaultRecord, Generation, PolicySlot};
use crate::runtime::NativePolicy;
use crate::runtime::{PolicyFault, PolicyInstance};
use crate::state::{Applied, ClusterState};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{Decision, Delta, RoundInfo};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who answered a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// The active generation.
    Active(u64),
    /// An older generation, after the newer ones faulted.
    Fallback(u64),
    /// The native built-in policy.
    Native,
    /// Nobody: even the native policy failed (the round applies nothing).
    Nobody,
}

/// Faults met during a round, by generation (`None` = the native policy).
pub type RoundFaults = Vec<(Option<u64>, PolicyFault)>;

/// What one round did.
#[derive(Clone, Debug)]
pub struct RoundReport {
    pub epoch: u64,
    pub served: Served,
    pub decisions: Vec<Decision>,
    pub applied: Applied,
    /// Faults met on the way, by generation (`None` = native).
    pub faults: RoundFaults,
    /// Whole round, delta to applied state.
    pub latency: Duration,
    /// Time inside the answering policy's calls (sync + schedule).
    pub policy_time: Duration,
}

/// Drives rounds for one scheduler slot.
pub struct RoundDriver {
    slot: Arc<PolicySlot>,
    native: PolicyInstance,
    max_decisions: u32,
}

impl RoundDriver {
    /// A driver whose last resort is the native `fifo` policy.
    pub fn new(slot: Arc<PolicySlot>) -> Self {
        Self::with_native(slot, Box::new(Runtime::<policy_fifo::Fifo>::new()))
    }

    pub fn with_native(slot: Arc<PolicySlot>, native: Box<dyn NativePolicy>) -> Self {
        RoundDriver {
            slot,
            native: PolicyInstance::native(native),
            max_decisions: 10_000,
        }
    }

    pub fn with_max_decisions(mut self, limit: u32) -> Self {
        self.max_decisions = limit;
        self
    }

    pub fn slot(&self) -> &Arc<PolicySlot> {
        &self.slot
    }

    /// Runs one round on `state`.
    pub fn run_round(&mut self, state: &mut ClusterState) -> RoundReport {
        let started = Instant::now();
        let (delta, round) = state.begin_round(self.max_decisions);
        let span = tracing::info_span!("round", epoch = round.epoch, events = delta.events.len());
        let _guard = span.enter();
        let mut faults = Vec::new();
        // The active generation is read once; the older ones (and the lock
        // on the slot's map) only when it faults.
        let active = self.slot.active();
        let active_id = active.as_ref().map(|g| g.id);
        let mut next = active.filter(|g| !g.is_quarantined());
        let mut fallbacks: Option<std::vec::IntoIter<Arc<Generation>>> = None;
        loop {
            let generation = match next.take() {
                Some(g) => g,
                None => {
                    let rest = fallbacks
                        .get_or_insert_with(|| self.slot.fallbacks_below(active_id).into_iter());
                    match rest.next() {
                        Some(g) => g,
                        None => break,
                    }
                }
            };
            match self.ask_generation(&generation, state, round) {
                Ok((decisions, policy_time)) => {
                    generation.record_success();
                    let served = if Some(generation.id) == active_id {
                        Served::Active(generation.id)
                    } else {
                        Served::Fallback(generation.id)
                    };
                    return self.finish(
                        state,
                        round,
                        served,
                        decisions,
                        faults,
                        started,
                        policy_time,
                    );
                }
                Err(fault) => {
                    self.on_fault(&generation, &delta, round, &fault);
                    faults.push((Some(generation.id), fault));
                }
            }
        }
        let native_started = Instant::now();
        match ask(&mut self.native, state, round) {
            Ok(decisions) => {
                let policy_time = native_started.elapsed();
                self.finish(
                    state,
                    round,
                    Served::Native,
                    decisions,
                    faults,
                    started,
                    policy_time,
                )
            }
            Err(fault) => {
                tracing::error!(%fault, "native fallback policy failed; the round applies nothing");
                faults.push((None, fault));
                self.finish(
                    state,
                    round,
                    Served::Nobody,
                    Vec::new(),
                    faults,
                    started,
                    Duration::ZERO,
                )
            }
        }
    }

    fn ask_generation(
        &self,
        generation: &Generation,
        state: &ClusterState,
        round: RoundInfo,
    ) -> Result<(Vec<Decision>, Duration), PolicyFault> {
        let mut guard = generation.instance.lock();
        if guard.as_ref().is_none_or(|i| i.poisoned().is_some()) {
            // A trapped instance is never re-entered: start afresh (µs).
            *guard = Some(generation.new_instance()?);
        }
        let Some(instance) = guard.as_mut() else {
            return Err(PolicyFault::Abi("instance vanished".into()));
        };
        let span = tracing::debug_span!("policy_call", generation = generation.id, policy = %generation.manifest().name);
        let _g = span.enter();
        let started = Instant::now();
        let result = ask(instance, state, round);
        let elapsed = started.elapsed();
        if result
            .as_ref()
            .err()
            .is_some_and(PolicyFault::poisons_instance)
        {
            *guard = None;
        }
        result.map(|d| (d, elapsed))
    }

    fn on_fault(
        &self,
        generation: &Generation,
        delta: &Delta,
        round: RoundInfo,
        fault: &PolicyFault,
    ) {
        tracing::warn!(
            generation = generation.id,
            policy = %generation.manifest().name,
            epoch = round.epoch,
            kind = fault.kind(),
            %fault,
            "policy fault; falling back"
        );
        let record = FaultRecord {
            epoch: round.epoch,
            fault: fault.clone(),
            delta: Some(delta.clone()),
        };
        if generation.record_fault(record, self.slot.quarantine_after()) {
            tracing::error!(
                generation = generation.id,
                "generation quarantined after repeated faults"
            );
            if self.slot.active_id() == Some(generation.id) {
                // Serve from the newest healthy older generation from now on.
                let _ = self.slot.rollback(None);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        state: &mut ClusterState,
        round: RoundInfo,
        served: Served,
        decisions: Vec<Decision>,
        faults: RoundFaults,
        started: Instant,
        policy_time: Duration,
    ) -> RoundReport {
        let applied = match state.apply(decisions.clone()) {
            Ok(applied) => applied,
            Err(e) => {
                // Unreachable after validation at the same epoch; never corrupt state silently.
                tracing::error!(error = %e, "validated decisions failed to apply");
                Applied::default()
            }
        };
        RoundReport {
            epoch: round.epoch,
            served,
            decisions,
            applied,
            faults,
            latency: started.elapsed(),
            policy_time,
        }
    }
}

/// Brings an instance's mirror to the round's epoch, asks it, validates the answer.
fn ask(
    instance: &mut PolicyInstance,
    state: &ClusterState,
    round: RoundInfo,
) -> Result<Vec<Decision>, PolicyFault> {
    instance.sync_to(state)?;
    let decisions = match instance.schedule(round) {
        Err(PolicyFault::Stale(_)) => {
            instance.resync_to(state)?;
            instance.schedule(round)?
        }
        other => other?,
    };
    state
        .validate(&decisions, round.max_decisions)
        .map_err(|(index, error)| PolicyFault::InvalidDecision { index, error })?;
    Ok(decisions)
}
