//! Tenants' quotas and what their guaranteed work holds (A7, A8).
//!
//! The rule is the validator's (`Plan`): only work charged to the guaranteed account
//! consumes quota (`SharingRules::takes_quota`), a worker its GPU demand in milli-GPU
//! (`gpu_demand_milli`), and a tenant without a quota row is unlimited. The book is
//! recomputed from the view every round and moved by the scheduler's own decisions, so it
//! always agrees with the `Plan` that checks them.

use arbiter_policy_sdk::model::{FULL_GPU_MILLI, gpu_demand_milli};
use arbiter_policy_sdk::prelude::*;
use std::collections::HashMap;

/// Quotas and charged use per tenant (tenant string id).
#[derive(Clone, Debug, Default)]
pub struct TenantBook {
    quota: HashMap<u32, u64>,
    used: HashMap<u32, u64>,
    /// The cluster's GPUs in milli-GPU: an unlimited tenant's fair share is measured against it.
    capacity_milli: u64,
}

/// What one worker of `job` charges against its tenant's quota.
pub fn worker_milli(job: &Job<'_>) -> u64 {
    gpu_demand_milli(1, job.gpus_per_worker(), job.gpu_milli())
}

impl TenantBook {
    /// The book of the view: quotas, and each tenant's running guaranteed-charged work.
    pub fn of(cluster: &Cluster) -> TenantBook {
        let t = cluster.tenant_columns();
        let quota: HashMap<u32, u64> = t
            .name
            .iter()
            .copied()
            .zip(t.gpu_quota_milli.iter().copied())
            .collect();
        let sharing = cluster.sharing();
        let mut used: HashMap<u32, u64> = HashMap::new();
        for job in cluster.running_jobs() {
            if sharing.takes_quota(job.qos()) {
                let milli = worker_milli(&job).saturating_mul(job.placement().len() as u64);
                let entry = used.entry(job.tenant_id()).or_default();
                *entry = entry.saturating_add(milli);
            }
        }
        TenantBook {
            quota,
            used,
            capacity_milli: cluster.gpu_count() as u64 * u64::from(FULL_GPU_MILLI),
        }
    }

    /// The tenant's quota in milli-GPU; `None`: unlimited.
    pub fn quota_milli(&self, tenant: u32) -> Option<u64> {
        self.quota.get(&tenant).copied()
    }

    /// Milli-GPU the tenant's guaranteed work holds (with this round's decisions).
    pub fn used_milli(&self, tenant: u32) -> u64 {
        self.used.get(&tenant).copied().unwrap_or(0)
    }

    /// Whether `milli` more guaranteed milli-GPU fits the tenant's quota.
    pub fn fits(&self, tenant: u32, milli: u64) -> bool {
        self.quota_milli(tenant)
            .is_none_or(|q| self.used_milli(tenant).saturating_add(milli) <= q)
    }

    /// The tenant's use as a fraction of what it is entitled to, in parts per million (the
    /// fairness key of A8: lowest first). An unlimited tenant is measured against the
    /// cluster; a tenant with a zero quota is last.
    pub fn share_ppm(&self, tenant: u32) -> u64 {
        let used = u128::from(self.used_milli(tenant));
        let of = match self.quota_milli(tenant) {
            Some(0) => return u64::MAX,
            Some(q) => u128::from(q),
            None => u128::from(self.capacity_milli.max(1)),
        };
        u64::try_from(used * 1_000_000 / of).unwrap_or(u64::MAX)
    }

    /// Moves the tenant's charged use by `milli` (positive: charge).
    pub fn charge(&mut self, tenant: u32, milli: i64) {
        let used = self.used.entry(tenant).or_default();
        *used = if milli >= 0 {
            used.saturating_add(milli.unsigned_abs())
        } else {
            used.saturating_sub(milli.unsigned_abs())
        };
    }
}
