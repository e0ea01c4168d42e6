//! The reclaim role: which on-loan servers go back, and how they are emptied.
//!
//! The host asks when capacity must be returned (Aryl's inference pool
//! takes its loaned servers back; DynamoML's inference burst). A plan is
//! valid when it names exactly `count` distinct servers, all among the
//! candidates, its decisions pass the validator at the request's epoch, and
//! once they are applied no running job keeps a worker on a returned server
//! ([`validate_plan`], the one check; the simulator's primary and shadow
//! paths both use it). The native last resort ([`native_plan`]) is
//! Smallest-Count-First: the candidates running the fewest jobs, every job
//! with a worker there preempted.

use super::{RoundFaults, Served, ask_chain};
use crate::registry::{FaultInput, PolicySlot};
use crate::runtime::PolicyFault;
use crate::state::ClusterState;
use arbiter_policy_sdk::model::{Decision, ReclaimPlan, ReclaimRequest};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// What one reclaim decided.
#[derive(Clone, Debug)]
pub struct ReclaimOutcome {
    pub request: ReclaimRequest,
    /// A plan [`validate_plan`] accepts.
    pub plan: ReclaimPlan,
    pub served: Served,
    pub faults: RoundFaults,
    pub policy_time: Duration,
}

/// Drives the `reclaim` role of one slot.
pub struct ReclaimDriver {
    slot: Arc<PolicySlot>,
}

impl ReclaimDriver {
    pub fn new(slot: Arc<PolicySlot>) -> Self {
        ReclaimDriver { slot }
    }

    pub fn slot(&self) -> &Arc<PolicySlot> {
        &self.slot
    }

    /// Asks for `count` of `candidates` back. Seals the state first: the
    /// request names its epoch, and the plan is judged at it. The state is
    /// not changed; the caller applies the plan's decisions.
    pub fn reclaim(
        &self,
        state: &mut ClusterState,
        candidates: &[u32],
        count: u32,
        max_decisions: u32,
    ) -> ReclaimOutcome {
        state.seal();
        let request = ReclaimRequest {
            epoch: state.epoch(),
            candidates: candidates.to_vec(),
            count,
            max_decisions,
        };
        let span = tracing::info_span!("reclaim", epoch = request.epoch, count);
        let _g = span.enter();
        let state = &*state;
        let outcome = ask_chain(
            &self.slot,
            arbiter_policy_sdk::model::Role::Reclaim,
            request.epoch,
            || FaultInput::Reclaim(request.clone()),
            |instance| {
                instance.sync_to(state)?;
                let plan = instance.reclaim(request.clone())?;
                validate_plan(state, &request, &plan)?;
                Ok(plan)
            },
        );
        if outcome.answer.is_none() && !outcome.faults.is_empty() {
            tracing::warn!(
                faults = outcome.faults.len(),
                "reclaim plan refused; the host picks the servers (smallest count first)"
            );
        }
        let (answer, faults) = outcome.or_native(|| native_plan(state, &request));
        ReclaimOutcome {
            request,
            plan: answer.value,
            served: answer.served,
            faults,
            policy_time: answer.policy_time,
        }
    }
}

/// The one check of a reclaim plan against its request (see the module doc).
pub fn validate_plan(
    state: &ClusterState,
    request: &ReclaimRequest,
    plan: &ReclaimPlan,
) -> Result<(), PolicyFault> {
    let refuse = || {
        // A hostile plan may name millions of servers: show a few.
        const SHOWN: usize = 8;
        let more = plan.nodes.len().saturating_sub(SHOWN);
        let shown = &plan.nodes[..plan.nodes.len().min(SHOWN)];
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Err(PolicyFault::BadAnswer(format!(
            "reclaim plan returns {shown:?}{tail}, not {} distinct candidates",
            request.count
        )))
    };
    // The length first: the set below is as large as the plan.
    if plan.nodes.len() != request.count as usize {
        return refuse();
    }
    let distinct: BTreeSet<u32> = plan.nodes.iter().copied().collect();
    if distinct.len() != plan.nodes.len()
        || !plan.nodes.iter().all(|n| request.candidates.contains(n))
    {
        return refuse();
    }
    let after = state
        .replay(&plan.decisions, request.max_decisions)
        .map_err(|(index, error)| PolicyFault::InvalidDecision { index, error })?;
    let cluster = state.cluster();
    for job in cluster.running_jobs() {
        if let Some(w) = after
            .workers_of(job.index())
            .iter()
            .find(|w| distinct.contains(&w.node))
        {
            return Err(PolicyFault::BadAnswer(format!(
                "reclaim plan leaves job {} running on returned node {}",
                job.index(),
                w.node
            )));
        }
    }
    Ok(())
}

/// Smallest-Count-First on the host's side: the `count` candidates that run
/// the fewest jobs (ties by index), each job with a worker there preempted.
pub fn native_plan(state: &ClusterState, request: &ReclaimRequest) -> ReclaimPlan {
    let cluster = state.cluster();
    let mut jobs_on = vec![0usize; cluster.node_count()];
    for job in cluster.running_jobs() {
        let nodes: BTreeSet<u32> = job.placement().iter().map(|w| w.node).collect();
        for n in nodes {
            jobs_on[n as usize] += 1;
        }
    }
    let mut order: Vec<u32> = request
        .candidates
        .iter()
        .copied()
        .filter(|&n| (n as usize) < cluster.node_count())
        .collect::<BTreeSet<u32>>()
        .into_iter()
        .collect();
    order.sort_by_key(|&n| (jobs_on[n as usize], n));
    order.truncate(request.count as usize);
    let decisions = cluster
        .running_jobs()
        .filter(|job| job.placement().iter().any(|w| order.contains(&w.node)))
        .map(|job| Decision::Preempt(job.index()))
        .collect();
    ReclaimPlan {
        nodes: order,
        decisions,
    }
}
