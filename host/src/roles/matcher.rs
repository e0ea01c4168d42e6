//! The matcher role: which offline job shares which online job's GPU, with
//! what share of its SMs (MuxFlow §5).
//!
//! The host names the candidates (running online jobs, offline jobs that
//! may join them) and their profiles; a policy answers pairings. A pairing
//! list is valid when every online job is one of the request's and appears
//! at most once, every offline job likewise (one offline workload per
//! online one, MuxFlow §8), and every SM share is 1–100 %
//! ([`validate_pairings`], the one check). The native last resort pairs
//! nothing: offline work then runs only where the scheduler put it.
//!
//! Turning a pairing into a placement plus an SM share on the node is
//! contract 0.3.0's (G9: the GPU of a multi-GPU online job, the
//! oversubscription rule that admits it); the driver returns validated
//! pairings for the caller to carry out.

use super::{RoundFaults, Served, ask_chain};
use crate::registry::{FaultInput, PolicySlot};
use crate::runtime::PolicyFault;
use crate::state::ClusterState;
use arbiter_policy_sdk::model::{MatchRequest, Pairing, WorkloadProfile};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// What one matching decided.
#[derive(Clone, Debug)]
pub struct MatchOutcome {
    pub request: MatchRequest,
    /// Pairings [`validate_pairings`] accepts.
    pub pairings: Vec<Pairing>,
    pub served: Served,
    pub faults: RoundFaults,
    pub policy_time: Duration,
}

/// Drives the `matcher` role of one slot.
pub struct MatcherDriver {
    slot: Arc<PolicySlot>,
}

impl MatcherDriver {
    pub fn new(slot: Arc<PolicySlot>) -> Self {
        MatcherDriver { slot }
    }

    pub fn slot(&self) -> &Arc<PolicySlot> {
        &self.slot
    }

    /// Asks for pairings of `offline` jobs with `online` ones (job indices at
    /// the state's epoch, which is sealed first).
    pub fn match_workloads(
        &self,
        state: &mut ClusterState,
        online: &[u32],
        offline: &[u32],
        profiles: Vec<WorkloadProfile>,
    ) -> MatchOutcome {
        state.seal();
        let request = MatchRequest {
            epoch: state.epoch(),
            online: online.to_vec(),
            offline: offline.to_vec(),
            profiles,
        };
        let span = tracing::info_span!(
            "match",
            epoch = request.epoch,
            online = online.len(),
            offline = offline.len()
        );
        let _g = span.enter();
        let state = &*state;
        let outcome = ask_chain(
            &self.slot,
            "matcher",
            request.epoch,
            || FaultInput::Match(request.clone()),
            |instance| {
                instance.sync_to(state)?;
                let pairings = instance.match_workloads(request.clone())?;
                validate_pairings(&request, &pairings)?;
                Ok(pairings)
            },
        );
        let (answer, faults) = outcome.or_native(Vec::new);
        MatchOutcome {
            request,
            pairings: answer.value,
            served: answer.served,
            faults,
            policy_time: answer.policy_time,
        }
    }
}

/// The one check of a pairing list against its request (see the module doc).
pub fn validate_pairings(request: &MatchRequest, pairings: &[Pairing]) -> Result<(), PolicyFault> {
    let online: BTreeSet<u32> = request.online.iter().copied().collect();
    let offline: BTreeSet<u32> = request.offline.iter().copied().collect();
    let mut seen_online = BTreeSet::new();
    let mut seen_offline = BTreeSet::new();
    for (i, p) in pairings.iter().enumerate() {
        let bad = |why: String| Err(PolicyFault::BadAnswer(format!("pairing #{i}: {why}")));
        if !online.contains(&p.online) {
            return bad(format!("job {} is not an online candidate", p.online));
        }
        if !offline.contains(&p.offline) {
            return bad(format!("job {} is not an offline candidate", p.offline));
        }
        if !seen_online.insert(p.online) {
            return bad(format!("online job {} is paired twice", p.online));
        }
        if !seen_offline.insert(p.offline) {
            return bad(format!("offline job {} is paired twice", p.offline));
        }
        if !(1..=100).contains(&p.sm_percent) {
            return bad(format!("SM share {} % is not 1..=100", p.sm_percent));
        }
    }
    Ok(())
}
