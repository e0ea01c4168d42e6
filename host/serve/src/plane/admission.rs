//! Admission: what each tenant may release to the scheduler, within its quota.

use super::*;

impl Plane {
    /// Each tenant's admission question: its queue, its released jobs and
    /// its quota. Jobs pending past a lowered quota go back to the queue here.
    /// The answers come from the host core's tenant driver (see
    /// `arbiter_host::roles::tenant`), which releases queued jobs in the
    /// order tenant policies give, only while they fit the quota.
    pub(super) fn admission_requests(&mut self, now: u64) -> Vec<TenantAdmission> {
        // One pass over the job table per tick: each tenant's queue, its
        // released jobs and what they claim.
        let mut tenants: BTreeMap<String, TenantJobs<'_>> = BTreeMap::new();
        for j in self
            .ids(JobStatus::Queued)
            .filter_map(|id| self.jobs.get(&id))
        {
            tenants.entry(j.tenant.clone()).or_default().queued.push(j);
        }
        let sharing = self.cfg.sharing;
        // What a job takes from its tenant's quota: the validator's rule,
        // guaranteed-charged work only (contract 0.3: shared work is exempt).
        let quota_milli_of = |j: &StoredJob| {
            if sharing.takes_quota(j.spec.qos) {
                j.spec.demand_milli()
            } else {
                0
            }
        };
        for j in self.released() {
            let t = tenants.entry(j.tenant.clone()).or_default();
            t.claimed_milli += quota_milli_of(j);
            t.claimed_gpus += j.spec.gpus;
            t.released.push(j);
        }
        let mut withdraw = Vec::new();
        let mut requests = Vec::new();
        for (tenant, jobs) in tenants {
            let quota_gpus = self.tenants.get(&tenant).map_or(0, |t| t.quota_gpus);
            let quota_milli =
                (quota_gpus > 0).then(|| u64::from(quota_gpus) * u64::from(model::FULL_GPU_MILLI));
            let mut claimed_milli = jobs.claimed_milli;
            if let Some(quota) = quota_milli {
                // A lowered quota: pending (not yet running) jobs go back to
                // the queue, newest first, until the rest fits. Without this
                // the scheduler would be offered jobs the validator refuses.
                let mut pending: Vec<&StoredJob> = jobs
                    .released
                    .iter()
                    .copied()
                    .filter(|j| j.status == JobStatus::Pending)
                    .collect();
                pending.sort_by_key(|j| std::cmp::Reverse((j.submit_ms, j.id)));
                for j in pending {
                    if claimed_milli <= quota {
                        break;
                    }
                    let milli = quota_milli_of(j);
                    if milli == 0 {
                        continue;
                    }
                    claimed_milli -= milli;
                    withdraw.push(j.id);
                }
            }
            if jobs.queued.is_empty() {
                continue;
            }
            let mut view_jobs = Vec::with_capacity(jobs.queued.len() + jobs.released.len());
            for (position, j) in jobs.queued.iter().enumerate() {
                view_jobs.push(tenant_job(position as u32, j, false));
            }
            for (k, j) in jobs.released.iter().enumerate() {
                view_jobs.push(tenant_job((jobs.queued.len() + k) as u32, j, true));
            }
            let queued: Vec<u64> = jobs.queued.iter().map(|j| j.id).collect();
            let request = AdmissionRequest {
                view: TenantView {
                    now_ms: now,
                    tenant: tenant.clone(),
                    gpu_quota: quota_gpus,
                    gpus_in_use: jobs.claimed_gpus,
                    jobs: view_jobs,
                },
                demand_milli: jobs.queued.iter().map(|j| quota_milli_of(j)).collect(),
                quota_milli,
                claimed_milli,
            };
            let slot = self.registry.find(&tenant_slot(&tenant));
            requests.push(TenantAdmission {
                tenant,
                slot,
                queued,
                request,
            });
        }
        for id in withdraw {
            tracing::info!(
                job = id,
                "tenant past its quota; job back in the tenant queue"
            );
            self.remove_from_cell(id);
            self.set_status(id, JobStatus::Queued);
        }
        requests
    }

    /// Releases what the tenant policies admitted and counts their faults.
    pub(super) fn apply_admissions(&mut self, decided: DecidedAdmission) {
        for (tenant, queued, admission) in decided.tenants {
            let slot_name = tenant_slot(&tenant);
            for (generation, fault) in &admission.faults {
                self.tenant_faults += 1;
                self.metrics
                    .count_fault(&slot_name, *generation, fault.kind());
            }
            for position in admission.release {
                let Some(&id) = queued.get(position as usize) else {
                    continue;
                };
                // Cancelled (or otherwise moved on) while the policy was asked.
                if self
                    .jobs
                    .get(&id)
                    .is_some_and(|j| j.status == JobStatus::Queued)
                {
                    self.release(id);
                }
            }
        }
    }

    pub(super) fn release(&mut self, id: u64) {
        let Some(job) = self.jobs.get(&id).cloned() else {
            return;
        };
        // Jobs submitted while the experiment runs join it on their first
        // release; older ones run in an arm but are not measured (their wait
        // began under another policy).
        let newly_enrolled = self
            .experiment
            .as_ref()
            .is_some_and(|e| job.experiment != e.record.name && job.id >= e.record.first_job);
        let arm = if newly_enrolled {
            self.assign(&job)
        } else {
            self.route(&job)
        };
        let Some(cell) = self.cells.iter_mut().find(|c| c.arm == arm) else {
            return;
        };
        match cell.state.submit_with(job_request(&job), job_traits(&job)) {
            Ok(local) => {
                cell.local.insert(id, local);
                cell.global.insert(local, id);
                if newly_enrolled {
                    self.enroll(id, arm);
                }
                self.set_status(id, JobStatus::Pending);
            }
            Err(e) => {
                drop(self.finish_job(id, JobStatus::Failed, &format!("refused: {e}")));
            }
        }
    }
}
