//! The job table: submission, reads, cancellation, progress and service reports, status changes, retention.

use super::*;
use crate::link::JobSample;

impl Plane {
    pub(super) fn ids(&self, status: JobStatus) -> impl Iterator<Item = u64> + '_ {
        self.by_status.get(&status).into_iter().flatten().copied()
    }

    pub(super) fn count(&self, status: JobStatus) -> u64 {
        self.by_status.get(&status).map_or(0, |s| s.len() as u64)
    }

    /// Jobs handed to a cell: pending or running.
    pub(super) fn released(&self) -> impl Iterator<Item = &StoredJob> + '_ {
        self.ids(JobStatus::Pending)
            .chain(self.ids(JobStatus::Running))
            .filter_map(|id| self.jobs.get(&id))
    }

    /// Accepts jobs; the [`Ack`] completes once they are durable.
    pub fn submit(
        &mut self,
        caller: &Caller,
        jobs: Vec<NewJob>,
    ) -> Result<(Vec<u64>, Ack), ApiError> {
        let mut accepted = Vec::with_capacity(jobs.len());
        let count = jobs.len();
        for (
            i,
            NewJob {
                spec: record,
                tenant: asked,
            },
        ) in jobs.into_iter().enumerate()
        {
            let which = NewJob::which(i, count);
            if let Some(why) = self.fleet.never_fits(&record) {
                return Err(ApiError::InvalidArgument(format!(
                    "{which}: can never run on this cluster: {why}"
                )));
            }
            let tenant = match caller {
                Caller::Tenant(t) => {
                    if !asked.is_empty() && &asked != t {
                        return Err(ApiError::PermissionDenied(format!(
                            "tenant `{t}` may not submit for tenant `{asked}`"
                        )));
                    }
                    t.clone()
                }
                Caller::Admin if asked.is_empty() || asked == DEFAULT_TENANT => {
                    DEFAULT_TENANT.to_string()
                }
                Caller::Admin if !self.tenants.contains_key(&asked) => {
                    return Err(ApiError::NotFound(format!(
                        "{which}: no tenant `{asked}` (add it first: `arbiter tenant add`)"
                    )));
                }
                Caller::Admin => asked,
                Caller::Node(_) => return Err(node_token_refused()),
            };
            accepted.push((record, tenant));
        }
        let now = self.now_ms();
        let mut ids = Vec::with_capacity(accepted.len());
        let mut writes = Vec::with_capacity(accepted.len());
        for (mut spec, tenant) in accepted {
            if spec.duration_ms == 0 {
                spec.duration_ms = self.cfg.default_duration.as_millis() as u64;
            }
            let id = self.next_id;
            self.next_id += 1;
            let job = StoredJob {
                id,
                spec,
                tenant,
                status: JobStatus::Queued,
                submit_ms: now,
                start_ms: 0,
                end_ms: 0,
                placement: Vec::new(),
                preemptions: 0,
                arm: String::new(),
                experiment: String::new(),
                first_start_ms: 0,
                message: String::new(),
                progress: ProgressRecord::default(),
                service: None,
            };
            writes.push(job_write(&job));
            self.notify(&job, None);
            self.by_status
                .entry(JobStatus::Queued)
                .or_default()
                .insert(id);
            self.jobs.insert(id, job);
            ids.push(id);
        }
        Ok((ids, self.writer.send_durable(writes)))
    }

    /// Job `id`'s statistics over its nodes' last reports.
    pub(super) fn job_metric(&self, id: u64) -> Option<model::JobMetric> {
        self.job_samples
            .get(&id)?
            .values()
            .map(|r| r.metric)
            .reduce(model::JobMetric::combine)
    }

    /// The tightest of job `id`'s enforced limits (`field`) over its nodes (0: none reported).
    pub(super) fn job_enforced(&self, id: u64, field: fn(&NodeJobReport) -> u32) -> u32 {
        self.job_samples
            .get(&id)
            .and_then(|by_node| by_node.values().map(field).filter(|&v| v > 0).min())
            .unwrap_or(0)
    }

    /// A node's statistics of the jobs it runs: kept per node, combined per job, recorded as
    /// `job-metrics` in each job's cell. Samples for jobs not running there are ignored.
    pub(super) fn record_job_samples(&mut self, node: &str, samples: &[JobSample]) {
        let mut changed = Vec::new();
        for s in samples {
            let here = self.jobs.get(&s.job_id).is_some_and(|j| {
                j.status == JobStatus::Running && j.placement.iter().any(|w| w.node == node)
            });
            if !here {
                continue;
            }
            let metric = model::JobMetric {
                job: 0,
                iteration_ms: s.iteration_ms,
                peak_memory_mib: s.peak_memory_mib,
                min_memory_mib: s.min_memory_mib.min(s.peak_memory_mib),
                host_memory_mib: s.host_memory_mib,
                utilization_pct: s.utilization_pct.min(100) as u8,
                sm_activity_pct: s.utilization_pct.min(100) as u8,
            };
            self.job_samples.entry(s.job_id).or_default().insert(
                node.to_string(),
                NodeJobReport {
                    metric,
                    memory_limit_mib: s.memory_limit_mib,
                    compute_share_permille: s.compute_share_permille,
                },
            );
            changed.push(s.job_id);
        }
        for id in changed {
            let Some(combined) = self.job_metric(id) else {
                continue;
            };
            let Ok((state, local)) = self.in_cell(id) else {
                continue;
            };
            let Some(index) = state.job_index(local) else {
                continue;
            };
            let metric = model::JobMetric {
                job: index,
                ..combined
            };
            if let Err(e) = state.record_job_metrics(vec![metric]) {
                tracing::warn!(job = id, node, error = %e, "job metrics refused");
            }
        }
    }

    /// Job `id`'s progress in the cell it is in.
    pub(super) fn cell_progress(&self, id: u64) -> Option<model::JobProgress> {
        self.cells.iter().find_map(|cell| {
            let local = *cell.local.get(&id)?;
            let index = cell.state.job_index(local)?;
            Some(cell.state.cluster().job(index).progress())
        })
    }

    /// Keeps job `id`'s progress, as of now, in its stored record.
    pub(super) fn keep_progress(&mut self, id: u64) {
        let now = self.now_ms();
        let Some(p) = self.cell_progress(id) else {
            return;
        };
        let record = ProgressRecord {
            attained_ms: p.attained_ms_at(now),
            remaining_ms: p.remaining_ms_at(now).unwrap_or(0),
            remaining_workers: p.remaining_workers,
        };
        if let Some(job) = self.jobs.get_mut(&id)
            && job.progress != record
        {
            job.progress = record;
            let job = job.clone();
            self.writer.send(job_write(&job));
        }
    }

    /// A job the caller may act on: theirs (a tenant learns nothing about
    /// other tenants' job ids) and not ended.
    pub(super) fn live_job(&self, caller: &Caller, id: u64) -> Result<&StoredJob, ApiError> {
        let Some(job) = self.jobs.get(&id).filter(|j| caller.may_see(&j.tenant)) else {
            return Err(ApiError::NotFound(format!("no job {id}")));
        };
        if job.status.is_terminal() {
            return Err(ApiError::FailedPrecondition(format!(
                "job {id} already ended ({:?})",
                job.status
            )));
        }
        Ok(job)
    }

    pub fn cancel(&mut self, caller: &Caller, id: u64) -> Result<(StoredJob, Ack), ApiError> {
        self.live_job(caller, id)?;
        self.stop_elsewhere(id, "");
        self.remove_from_cell(id);
        let ack = self.finish_job(id, JobStatus::Cancelled, "cancelled by request");
        let job = self
            .jobs
            .get(&id)
            .cloned()
            .ok_or_else(|| internal("cancelled job vanished"))?;
        Ok((job, ack))
    }

    /// Records what a job has left, for the policies of its cell.
    pub fn report_progress(
        &mut self,
        caller: &Caller,
        id: u64,
        remaining_ms: u64,
    ) -> Result<model::JobProgress, ApiError> {
        self.live_job(caller, id)?;
        let (state, local) = self.in_cell(id)?;
        state
            .report_progress(local, remaining_ms)
            .map_err(|e| internal(format!("recording progress of job {id}: {e}")))?;
        self.keep_progress(id);
        self.jobs.touch(id);
        self.cell_progress(id)
            .ok_or_else(|| internal("reported job vanished from its cell"))
    }

    /// The cluster state of the cell job `id` is in, and its id there.
    pub(super) fn in_cell(&mut self, id: u64) -> Result<(&mut ClusterState, JobId), ApiError> {
        self.cells
            .iter_mut()
            .find_map(|c| Some((&mut c.state, *c.local.get(&id)?)))
            .ok_or_else(|| ApiError::FailedPrecondition(format!("job {id} is not in any cell yet")))
    }

    /// Records an inference job's load for the policies of its cell (and
    /// keeps it, so a rebuilt cell starts from it).
    pub fn report_service(
        &mut self,
        caller: &Caller,
        id: u64,
        load: ServiceReport,
    ) -> Result<ServiceRecord, ApiError> {
        self.live_job(caller, id)?;
        if !(load.requests_per_s.is_finite() && load.requests_per_s >= 0.0) {
            return Err(ApiError::InvalidArgument(format!(
                "requests_per_s must be a finite rate >= 0 (got {:?})",
                load.requests_per_s
            )));
        }
        if load.p50_latency_ms > load.p99_latency_ms {
            return Err(ApiError::InvalidArgument(format!(
                "p50 latency ({} ms) above p99 ({} ms)",
                load.p50_latency_ms, load.p99_latency_ms
            )));
        }
        if self
            .jobs
            .get(&id)
            .is_some_and(|j| j.spec.kind != model::job_kind::INFERENCE)
        {
            return Err(ApiError::FailedPrecondition(format!(
                "job {id} is not an inference job (submit it with kind 1)"
            )));
        }
        let record = ServiceRecord {
            requests_per_s: load.requests_per_s,
            p50_latency_ms: load.p50_latency_ms,
            p99_latency_ms: load.p99_latency_ms,
            reported_ms: self.now_ms(),
        };
        let (state, local) = self.in_cell(id)?;
        record_service(state, local, record)
            .map_err(|e| internal(format!("recording the load of job {id}: {e}")))?;
        if let Some(job) = self.jobs.get_mut(&id) {
            job.service = Some(record);
            let job = job.clone();
            self.writer.send(job_write(&job));
        }
        Ok(record)
    }

    /// The job-event channel, to subscribe without the plane's lock.
    pub fn event_sender(&self) -> broadcast::Sender<JobEvent> {
        self.events.clone()
    }

    /// Queues a job event; it is sent once the change is on the board
    /// ([`Plane::publish_jobs`]), so a watcher reading the job it names
    /// never sees it as it was before.
    pub(super) fn notify(&mut self, job: &StoredJob, previous: Option<JobStatus>) {
        if self.events.receiver_count() == 0 {
            return;
        }
        self.unsent_events.push(JobEvent {
            job: job.clone(),
            previous,
        });
    }

    pub(super) fn remove_from_cell(&mut self, id: u64) {
        for cell in &mut self.cells {
            if let Some(local) = cell.local.remove(&id) {
                cell.global.remove(&local);
                if let Err(e) = cell.state.remove(local) {
                    tracing::error!(job = id, error = %e, "job missing from its cell");
                }
            }
        }
    }

    pub(super) fn set_status(&mut self, id: u64, status: JobStatus) {
        if let Some(job) = self.jobs.get_mut(&id) {
            let previous = Some(job.status);
            move_status(&mut self.by_status, id, job.status, status);
            job.status = status;
            let job = job.clone();
            self.writer.send(job_write(&job));
            self.notify(&job, previous);
        }
    }

    pub(super) fn finish_job(&mut self, id: u64, status: JobStatus, message: &str) -> Ack {
        let now = self.now_ms();
        let Some(job) = self.jobs.get_mut(&id) else {
            return self.writer.send_durable(Vec::new());
        };
        let previous = Some(job.status);
        let was_running = job.status == JobStatus::Running;
        self.job_samples.remove(&id);
        self.sm_shares.remove(&id);
        self.launch_seqs.remove(&id);
        move_status(&mut self.by_status, id, job.status, status);
        job.status = status;
        job.end_ms = now;
        *self.metrics.jobs_ended.entry(status.name()).or_default() += 1;
        job.message = message.to_string();
        let job = job.clone();
        if was_running
            && status == JobStatus::Succeeded
            && let Some(stats) = self.enrolled_stats(id)
        {
            stats.finished(
                now.saturating_sub(job.submit_ms) as f64,
                job.spec.deadline_ms,
            );
        }
        self.notify(&job, previous);
        self.writer.send_durable(vec![job_write(&job)])
    }

    /// Retention: ended jobs past `keep_finished` (oldest-ended first) or
    /// ended longer ago than `keep_finished_for` leave the job table and
    /// the store, in one write. Checked when the count is over or, for the
    /// age, at most once a minute, so a tick stays O(1) otherwise.
    pub(super) fn drop_old_finished(&mut self, now: u64) {
        let ended = self.count(JobStatus::Succeeded)
            + self.count(JobStatus::Failed)
            + self.count(JobStatus::Cancelled);
        let keep = self.cfg.keep_finished as u64;
        // Over the count and grown since the last pass (what a pass could
        // not drop — a running experiment's jobs — is not rescanned every tick).
        let over = ended > keep && ended > self.retention_floor;
        let age_due = now.saturating_sub(self.last_retention_ms) >= 60_000;
        if !over && !age_due {
            return;
        }
        self.last_retention_ms = now;
        let horizon = now.saturating_sub(self.cfg.keep_finished_for.as_millis() as u64);
        let running = self.experiment.as_ref().map(|e| e.record.name.as_str());
        let mut candidates: Vec<(u64, u64)> = [
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ]
        .into_iter()
        .flat_map(|s| self.ids(s))
        .filter_map(|id| self.jobs.get(&id))
        .filter(|j| running != Some(j.experiment.as_str()))
        .map(|j| (j.end_ms, j.id))
        .collect();
        // Newest-ended first: the first `keep` stay (if young enough).
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let drop: Vec<u64> = candidates
            .iter()
            .enumerate()
            .filter(|(rank, (end, _))| *rank as u64 >= keep || *end < horizon)
            .map(|(_, (_, id))| *id)
            .collect();
        self.retention_floor = ended - drop.len() as u64;
        if drop.is_empty() {
            return;
        }
        let mut writes = Vec::with_capacity(drop.len());
        for id in &drop {
            if let Some(job) = self.jobs.remove(id)
                && let Some(set) = self.by_status.get_mut(&job.status)
            {
                set.remove(id);
            }
            writes.push(Write::DeleteJob(*id));
        }
        self.metrics.jobs_dropped += drop.len() as u64;
        tracing::info!(dropped = drop.len(), "ended jobs past retention dropped");
        for w in writes {
            self.writer.send(w);
        }
    }

    /// Simulated pool: jobs whose run time is up succeed.
    pub(super) fn complete_finished(&mut self, now: u64) {
        let done: Vec<u64> = self
            .ids(JobStatus::Running)
            .filter_map(|id| self.jobs.get(&id))
            .filter(|j| j.start_ms.saturating_add(j.spec.duration_ms) <= now)
            // Jobs on agent nodes end when their process exits, not on a timer.
            .filter(|j| !j.placement.iter().any(|w| self.is_agent(&w.node)))
            .map(|j| j.id)
            .collect();
        for id in done {
            self.remove_from_cell(id);
            drop(self.finish_job(id, JobStatus::Succeeded, "completed"));
        }
    }
}
