//! The matcher role: which offline job shares which online job's GPU, with
//! what share of its SMs (MuxFlow §5).
//!
//! The host names the candidates (running online jobs, offline jobs that
//! may join them) and their profiles; a policy answers pairings. A pairing
//! list is valid when every online job is one of the request's, every
//! offline job likewise and at most once, each online GPU takes at most one
//! offline job (MuxFlow §8), every SM share is 1–100 %
//! ([`validate_pairings`]), the pairing's GPU is one the online job runs on,
//! and the placement that carries it out passes the validator
//! ([`pairing_decisions`]): a `place` of a pending offline job onto that GPU
//! or a `migrate` of a running one, under contract 0.3's sharing rules
//! (G1, G9). Both checks run inside the fallback chain, so an impossible
//! pairing is the policy's fault. The native last resort pairs nothing:
//! offline work then runs only where the scheduler put it.
//!
//! The driver returns the pairings and their decisions; the caller applies
//! the decisions through the one apply path (`ClusterState::apply`) and
//! sends each pairing's `sm-percent` to the node with the launch.

use super::{RoundFaults, Served, ask_chain};
use crate::registry::{FaultInput, PolicySlot};
use crate::runtime::PolicyFault;
use crate::state::ClusterState;
use arbiter_policy_sdk::model::{
    Decision, MatchRequest, Pairing, WorkerPlacement, WorkloadProfile, job_phase,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// What one matching decided.
#[derive(Clone, Debug)]
pub struct MatchOutcome {
    pub request: MatchRequest,
    /// Pairings [`validate_pairings`] accepts, each naming its GPU (a 0.2
    /// matcher's are given the online job's first GPU).
    pub pairings: Vec<Pairing>,
    /// The placements that carry them out, valid at the request's epoch.
    pub decisions: Vec<Decision>,
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
            arbiter_policy_sdk::model::Role::Matcher,
            request.epoch,
            || FaultInput::Match(request.clone()),
            |instance| {
                instance.sync_to(state)?;
                let pairings = instance.match_workloads(request.clone())?;
                validate_pairings(&request, &pairings)?;
                let decisions = pairing_decisions(state, &pairings)?;
                Ok((pairings, decisions))
            },
        );
        let (answer, faults) = outcome.or_native(|| (Vec::new(), Vec::new()));
        let (pairings, decisions) = answer.value;
        MatchOutcome {
            request,
            pairings,
            decisions,
            served: answer.served,
            faults,
            policy_time: answer.policy_time,
        }
    }
}

/// The check of a pairing list against its request (see the module doc).
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
        if !seen_online.insert((p.online, p.gpu)) {
            return bad(format!(
                "online job {} is paired twice on GPU {}",
                p.online, p.gpu
            ));
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

/// The placements that carry out `pairings` (see the module doc), checked by
/// the validator at the state's epoch.
pub fn pairing_decisions(
    state: &ClusterState,
    pairings: &[Pairing],
) -> Result<Vec<Decision>, PolicyFault> {
    let cluster = state.cluster();
    let mut decisions = Vec::new();
    for (i, p) in pairings.iter().enumerate() {
        let bad = |why: String| Err(PolicyFault::BadAnswer(format!("pairing #{i}: {why}")));
        if p.online as usize >= cluster.job_count() || p.offline as usize >= cluster.job_count() {
            return bad("names a job that does not exist".into());
        }
        let online = cluster.job(p.online);
        let gpus: Vec<u32> = online
            .placement()
            .iter()
            .flat_map(|w| w.gpus.iter().copied())
            .collect();
        if !gpus.contains(&p.gpu) {
            return bad(format!(
                "GPU {} is not one online job {} runs on",
                p.gpu, p.online
            ));
        }
        let offline = cluster.job(p.offline);
        if offline.gpus_per_worker() != 1 || offline.workers() != 1 {
            return bad(format!(
                "offline job {} is not one worker on one GPU",
                p.offline
            ));
        }
        let worker = WorkerPlacement {
            node: cluster.gpu(p.gpu).node(),
            gpus: vec![p.gpu],
        };
        match offline.phase() {
            job_phase::RUNNING if offline.placement() == std::slice::from_ref(&worker) => {}
            job_phase::RUNNING => decisions.push(Decision::Migrate(p.offline, vec![worker])),
            _ => decisions.push(Decision::Place(p.offline, vec![worker])),
        }
    }
    state
        .validate(&decisions, u32::MAX)
        .map_err(|(index, error)| PolicyFault::InvalidDecision { index, error })?;
    Ok(decisions)
}
