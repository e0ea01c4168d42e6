//! The tenant role: which of a tenant's queued jobs go to the scheduler.
//!
//! The tenant's policy (if its slot has one) orders and holds the queue
//! through [`super::ask_chain`]; a verdict that names a job outside the
//! queue, or one twice, is a fault like a trap. The native last resort is
//! submit order. Whoever answers, [`admit`] then releases jobs in that order
//! only while they fit the tenant's quota, stopping at the first that does
//! not (so a large job is not overtaken for ever by small ones): the
//! scheduler is never offered work the validator's quota rule would refuse,
//! so one tenant's backlog cannot stall a round for everybody.

use super::{ChainOutcome, RoundFaults, Served, ask_chain};
use crate::registry::{FaultInput, PolicySlot};
use crate::runtime::PolicyFault;
use arbiter_policy_sdk::model::{TenantVerdict, TenantView};
use std::collections::HashSet;
use std::time::Duration;

/// One tenant's admission question.
#[derive(Clone, Debug)]
pub struct AdmissionRequest {
    /// What the tenant policy sees: the queued jobs first (positions
    /// `0..demand_milli.len()`, in submit order), then the running ones.
    pub view: TenantView,
    /// Each queued job's GPU demand in milli-GPU (the validator's measure,
    /// `arbiter_policy_sdk::model::gpu_demand_milli`).
    pub demand_milli: Vec<u64>,
    /// The tenant's quota in milli-GPU; `None` = unlimited.
    pub quota_milli: Option<u64>,
    /// What the tenant's released jobs (pending or running) already claim.
    pub claimed_milli: u64,
}

/// What admission decided for one tenant.
#[derive(Clone, Debug)]
pub struct Admission {
    /// Queue positions to release, in order.
    pub release: Vec<u32>,
    /// Who ordered the queue (`Native` = submit order).
    pub served: Served,
    pub faults: RoundFaults,
    pub policy_time: Duration,
}

/// Asks the tenant's slot (if any) for a verdict and releases, in its order,
/// the jobs that fit the quota. `epoch` labels fault records.
pub fn admit(slot: Option<&PolicySlot>, epoch: u64, request: &AdmissionRequest) -> Admission {
    let queued = request.demand_milli.len();
    let span = tracing::debug_span!("tenant", tenant = %request.view.tenant, queued);
    let _g = span.enter();
    let outcome = match slot {
        Some(slot) => ask_chain(
            slot,
            arbiter_policy_sdk::model::Role::Tenant,
            epoch,
            || FaultInput::Tenant(request.view.clone()),
            |instance| {
                let verdict = instance.order(request.view.clone())?;
                queue_order(&verdict, queued)
            },
        ),
        None => ChainOutcome {
            answer: None,
            faults: Vec::new(),
        },
    };
    let (answer, faults) = outcome.or_native(|| (0..queued as u32).collect());
    let mut budget = request
        .quota_milli
        .map(|q| q.saturating_sub(request.claimed_milli));
    let mut release = Vec::new();
    // In order while the quota lasts: the first job that does not fit holds
    // the ones behind it (no small job overtakes a large one for quota).
    // Work that takes no quota (CPU-only, or shared work under contract 0.3's
    // sharing rules) is never held by quota, wherever it stands.
    let mut blocked = false;
    for position in answer.value {
        let demand = request.demand_milli[position as usize];
        if let Some(left) = budget.as_mut() {
            if blocked || demand > *left {
                blocked = true;
                if demand > 0 {
                    continue;
                }
            }
            *left -= demand;
        }
        release.push(position);
    }
    Admission {
        release,
        served: answer.served,
        faults,
        policy_time: answer.policy_time,
    }
}

/// The queue order a verdict gives: ordered positions first, then the rest
/// in submit order, held ones left out. A position outside the queue (or a
/// running job's), or one named twice, makes the verdict impossible.
pub fn queue_order(verdict: &TenantVerdict, queued: usize) -> Result<Vec<u32>, PolicyFault> {
    let check = |what: &str, list: &[u32]| -> Result<HashSet<u32>, PolicyFault> {
        let mut seen = HashSet::with_capacity(list.len().min(queued));
        for &p in list {
            if p as usize >= queued {
                return Err(PolicyFault::BadAnswer(format!(
                    "tenant verdict {what}s position {p}, but only {queued} jobs are queued"
                )));
            }
            if !seen.insert(p) {
                return Err(PolicyFault::BadAnswer(format!(
                    "tenant verdict {what}s position {p} twice"
                )));
            }
        }
        Ok(seen)
    };
    let ordered = check("order", &verdict.order)?;
    let held = check("hold", &verdict.hold)?;
    let mut order: Vec<u32> = verdict
        .order
        .iter()
        .copied()
        .filter(|p| !held.contains(p))
        .collect();
    order.extend((0..queued as u32).filter(|p| !held.contains(p) && !ordered.contains(p)));
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(order: &[u32], hold: &[u32]) -> TenantVerdict {
        TenantVerdict {
            order: order.to_vec(),
            hold: hold.to_vec(),
        }
    }

    #[test]
    fn a_verdict_orders_holds_and_keeps_the_rest_in_submit_order() {
        assert_eq!(
            queue_order(&verdict(&[3, 1], &[0]), 5).unwrap(),
            vec![3, 1, 2, 4]
        );
    }

    #[test]
    fn impossible_verdicts_are_faults() {
        for v in [
            verdict(&[5], &[]),
            verdict(&[], &[7]),
            verdict(&[1, 1], &[]),
            verdict(&[], &[2, 2]),
        ] {
            assert!(matches!(queue_order(&v, 5), Err(PolicyFault::BadAnswer(_))));
        }
    }

    fn request(demand: &[u64], quota: Option<u64>, claimed: u64) -> AdmissionRequest {
        AdmissionRequest {
            view: TenantView {
                now_ms: 0,
                tenant: "t".into(),
                gpu_quota: 0,
                gpus_in_use: 0,
                jobs: Vec::new(),
            },
            demand_milli: demand.to_vec(),
            quota_milli: quota,
            claimed_milli: claimed,
        }
    }

    #[test]
    fn without_a_policy_jobs_are_released_in_submit_order_within_the_quota() {
        let a = admit(None, 1, &request(&[1000, 500, 500, 1000], Some(2500), 500));
        assert_eq!(a.release, vec![0, 1, 2]);
        assert_eq!(a.served, Served::Native);
        let unlimited = admit(None, 1, &request(&[1000; 4], None, 9000));
        assert_eq!(unlimited.release, vec![0, 1, 2, 3]);
    }

    #[test]
    fn the_first_job_past_the_quota_blocks_those_behind_it() {
        let a = admit(None, 1, &request(&[500, 2000, 500], Some(1500), 0));
        assert_eq!(a.release, vec![0]);
    }

    /// Work that takes no quota (shared work, CPU-only jobs) is released
    /// even behind a blocked job; quota-taking work behind it still waits.
    #[test]
    fn work_that_takes_no_quota_is_never_held_by_it() {
        let a = admit(None, 1, &request(&[500, 2000, 0, 500, 0], Some(1500), 0));
        assert_eq!(a.release, vec![0, 2, 4]);
    }
}
