//! The scheduler role: delta → policy → validation → state, with fallbacks.
//!
//! A round closes the state's epoch, then asks the slot through
//! [`super::ask_chain`] (active, then older healthy generations) and finally
//! the native built-in policy. The first answer that passes validation is
//! applied. A Wasm answer is all or nothing; the native answer is filtered
//! through the same validator ([`ClusterState::keep_valid`]), so a round
//! always has an answer the validator accepts and a fault in one place (a
//! tenant past its quota, a cordoned node) never stalls the whole cluster.
//! The host never skips a round and never applies an invalid answer.

use super::ask_chain;
pub use super::{RoundFaults, Served};
use crate::registry::{FaultInput, PolicySlot};
use crate::runtime::NativePolicy;
use crate::runtime::{PolicyFault, PolicyInstance};
use crate::state::{Applied, ClusterState};
use arbiter_policy_sdk::Runtime;
use arbiter_policy_sdk::model::{Decision, Delta, RoundInfo};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Fuel the answering generation's calls consumed (sync + schedule), when
    /// the engine meters fuel; `None` for the native policy.
    pub fuel: Option<u64>,
}

/// Drives rounds for one scheduler slot.
pub struct RoundDriver {
    slot: Arc<PolicySlot>,
    native: PolicyInstance,
    max_decisions: u32,
}

/// The scheduler's last resort: the native `fifo` policy (what a round
/// journaled as served by `native` ran, so a replay can check it).
pub fn native_fallback() -> Box<dyn NativePolicy> {
    Box::new(Runtime::<policy_fifo::Fifo>::new())
}

impl RoundDriver {
    /// A driver whose last resort is [`native_fallback`].
    pub fn new(slot: Arc<PolicySlot>) -> Self {
        Self::with_native(slot, native_fallback())
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
        let outcome = ask_chain(
            &self.slot,
            arbiter_policy_sdk::model::Role::Scheduler,
            round.epoch,
            || FaultInput::Delta(Delta::clone(&delta)),
            |instance| ask(instance, state, round),
        );
        let mut faults = outcome.faults;
        if let Some(answer) = outcome.answer {
            return self.finish(
                state,
                round,
                answer.served,
                answer.value,
                faults,
                started,
                (answer.policy_time, answer.fuel),
            );
        }
        let native_started = Instant::now();
        match ask_native(&mut self.native, state, round) {
            Ok(decisions) => {
                let policy_time = native_started.elapsed();
                self.finish(
                    state,
                    round,
                    Served::Native,
                    decisions,
                    faults,
                    started,
                    (policy_time, None),
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
                    (Duration::ZERO, None),
                )
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
        (policy_time, fuel): (Duration, Option<u64>),
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
            fuel,
        }
    }
}

/// Brings an instance's mirror to the round's epoch and asks it.
fn decide(
    instance: &mut PolicyInstance,
    state: &ClusterState,
    round: RoundInfo,
) -> Result<Vec<Decision>, PolicyFault> {
    instance.sync_to(state)?;
    match instance.schedule(round) {
        Err(PolicyFault::Stale(_)) => {
            instance.resync_to(state)?;
            instance.schedule(round)
        }
        other => other,
    }
}

/// A generation's answer: valid as a whole, or a fault.
fn ask(
    instance: &mut PolicyInstance,
    state: &ClusterState,
    round: RoundInfo,
) -> Result<Vec<Decision>, PolicyFault> {
    let decisions = decide(instance, state, round)?;
    state
        .validate(&decisions, round.max_decisions)
        .map_err(|(index, error)| PolicyFault::InvalidDecision { index, error })?;
    Ok(decisions)
}

/// The native last resort: its answer is kept decision by decision where it
/// passes the validator, so it is never refused as a whole.
fn ask_native(
    instance: &mut PolicyInstance,
    state: &ClusterState,
    round: RoundInfo,
) -> Result<Vec<Decision>, PolicyFault> {
    let decisions = decide(instance, state, round)?;
    let (kept, dropped) = state.keep_valid(decisions, round.max_decisions);
    if let Some((index, error)) = dropped.first() {
        tracing::warn!(
            dropped = dropped.len(),
            first = index,
            %error,
            "native fallback decisions the validator refuses were dropped"
        );
    }
    Ok(kept)
}
