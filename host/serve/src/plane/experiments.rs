//! Experiments: split and shadow, enrollment and arm assignment, arm statistics, guardrails, promotion.

use super::*;

impl Plane {
    /// The job stats of the arm a job is enrolled in, while its experiment runs.
    pub(super) fn enrolled_stats(&mut self, id: u64) -> Option<&mut JobStats> {
        let job = self.jobs.get(&id)?;
        let e = self.experiment.as_mut()?;
        if job.experiment != e.record.name {
            return None;
        }
        Some(&mut e.stats.entry(arm_or_control(&job.arm)).or_default().jobs)
    }

    /// The round stats of a cell's arm while an experiment runs.
    pub(super) fn round_stats(&mut self, arm: &str) -> Option<&mut RoundStats> {
        let e = self.experiment.as_mut()?;
        e.rounds_dirty = true;
        Some(&mut e.stats.entry(arm_or_control(arm)).or_default().rounds)
    }

    pub fn start_experiment(
        &mut self,
        caller: &Caller,
        req: ExperimentRequest,
    ) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        if let Some(e) = &self.experiment {
            return Err(ApiError::FailedPrecondition(format!(
                "experiment `{}` is running; promote or abort it first",
                e.record.name
            )));
        }
        check_label("experiment", &req.name)?;
        if self.experiments.contains_key(&req.name) {
            return Err(ApiError::AlreadyExists(format!(
                "experiment `{}` exists",
                req.name
            )));
        }
        let mode = req.mode;
        if req.candidate_slot.is_empty()
            || req.candidate_slot == DEFAULT_SLOT
            || req.candidate_slot.starts_with("tenant:")
        {
            return Err(ApiError::InvalidArgument(
                "candidate_slot must name a loaded scheduler slot other than `default`".into(),
            ));
        }
        if ROLE_SLOTS.iter().any(|(s, ..)| *s == req.candidate_slot) {
            return Err(ApiError::InvalidArgument(format!(
                "slot `{}` serves one role for every cell, it does not schedule; load the candidate scheduler into a slot of its own",
                req.candidate_slot
            )));
        }
        let share = if req.candidate_share == 0.0 {
            0.5
        } else {
            req.candidate_share
        };
        if mode == Mode::Split && !(share > 0.0 && share < 1.0) {
            return Err(ApiError::InvalidArgument(
                "candidate_share must be in (0, 1)".into(),
            ));
        }
        for t in &req.candidate_tenants {
            if !self.tenants.contains_key(t) && t != DEFAULT_TENANT {
                return Err(ApiError::NotFound(format!("no tenant `{t}`")));
            }
        }
        let record = ExperimentRecord {
            name: req.name,
            mode,
            state: ExperimentState::Running,
            candidate_slot: req.candidate_slot,
            candidate_tenants: req.candidate_tenants,
            candidate_share: share,
            guardrail: req.guardrail,
            reason: String::new(),
            started_ms: self.now_ms(),
            ended_ms: 0,
            seed: rand::random(),
            first_job: self.next_id,
        };
        self.activate_experiment(record.clone(), None)?;
        let ack = self.persist_experiment(&record);
        Ok(ack)
    }

    pub(super) fn activate_experiment(
        &mut self,
        record: ExperimentRecord,
        rounds: Option<ExperimentRounds>,
    ) -> Result<(), ApiError> {
        let slot = self.registry.find(&record.candidate_slot).ok_or_else(|| {
            ApiError::NotFound(format!("no policy slot `{}`", record.candidate_slot))
        })?;
        let generation = slot.active().ok_or_else(|| {
            ApiError::FailedPrecondition(format!(
                "slot `{}` has no active generation",
                record.candidate_slot
            ))
        })?;
        if !generation.code.has_role(Role::Scheduler) {
            return Err(ApiError::InvalidArgument(format!(
                "`{}` does not implement the scheduler role",
                record.candidate_slot
            )));
        }
        let shadow = match record.mode {
            Mode::Shadow => {
                let instance = generation.new_instance().map_err(|e| {
                    ApiError::InvalidArgument(format!("candidate failed to start: {e}"))
                })?;
                Some(Shadow::start(instance).map_err(internal)?)
            }
            Mode::Split => None,
        };
        let (stats, assigner) = self.enrolled_job_stats(&record);
        let mut experiment = Experiment {
            candidate_generation: generation.id,
            control_generation: self
                .registry
                .find(DEFAULT_SLOT)
                .and_then(|s| s.active_id())
                .unwrap_or(0),
            record,
            stats,
            shadow,
            assigner,
            evidence: AlwaysValidP::default(),
            comparison: None,
            rounds_dirty: false,
        };
        if let Some(saved) = rounds {
            for (arm, rounds) in saved.arms {
                experiment.stats.entry(arm).or_default().rounds = rounds;
            }
            experiment.evidence = saved.evidence;
        }
        tracing::info!(experiment = %experiment.record.name, mode = ?experiment.record.mode, candidate = %experiment.record.candidate_slot, "experiment started");
        self.experiment = Some(experiment);
        self.rebuild_cells();
        Ok(())
    }

    /// The job stats of an experiment's arms and its coin's totals, from the
    /// jobs enrolled in it (none when it starts; after a restart, what it
    /// had): starts in the order of first start, finishes in the order of
    /// end, as they were seen.
    pub(super) fn enrolled_job_stats(
        &self,
        record: &ExperimentRecord,
    ) -> (BTreeMap<String, ArmStats>, Option<Assigner>) {
        let mut stats = BTreeMap::new();
        stats.insert(CONTROL.to_string(), ArmStats::default());
        stats.insert(CANDIDATE.to_string(), ArmStats::default());
        let mut assigner = (record.mode == Mode::Split && record.candidate_tenants.is_empty())
            .then(|| Assigner::new(record.candidate_share, record.seed));
        let enrolled: Vec<&StoredJob> = self
            .jobs
            .values()
            .filter(|j| j.experiment == record.name)
            .collect();
        for j in &enrolled {
            let arm = stats.entry(arm_or_control(&j.arm)).or_default();
            arm.jobs.enrolled();
            arm.jobs.preemptions += u64::from(j.preemptions);
            if let Some(coin) = assigner.as_mut() {
                coin.count(j.arm == CANDIDATE, j.spec.gpu_hours());
            }
        }
        for j in in_order(&enrolled, |j| {
            (j.first_start_ms > 0).then_some(j.first_start_ms)
        }) {
            let delay = j.first_start_ms.saturating_sub(j.submit_ms) as f64;
            let arm = stats.entry(arm_or_control(&j.arm)).or_default();
            arm.jobs.started(delay);
        }
        let ended = |j: &StoredJob| {
            (j.status == JobStatus::Succeeded && j.first_start_ms > 0).then_some(j.end_ms)
        };
        for j in in_order(&enrolled, ended) {
            let jct = j.end_ms.saturating_sub(j.submit_ms) as f64;
            let arm = stats.entry(arm_or_control(&j.arm)).or_default();
            arm.jobs.finished(jct, j.spec.deadline_ms);
        }
        (stats, assigner)
    }

    /// Persists the running experiment's round stats and evidence if they
    /// changed (once a tick at most).
    pub(super) fn persist_experiment_rounds(&mut self) {
        let Some(e) = self.experiment.as_mut().filter(|e| e.rounds_dirty) else {
            return;
        };
        e.rounds_dirty = false;
        let saved = ExperimentRounds {
            arms: e
                .stats
                .iter()
                .map(|(arm, s)| (arm.clone(), s.rounds.clone()))
                .collect(),
            evidence: e.evidence,
        };
        match serde_json::to_vec(&saved) {
            Ok(bytes) => self.writer.send(Write::Put(
                format!("{EXPERIMENT_ROUNDS_PREFIX}{}", e.record.name),
                bytes,
            )),
            Err(e) => tracing::error!(error = %e, "encoding an experiment's round stats"),
        }
    }

    /// Persists an ended experiment's record and its final status, in one write.
    pub(super) fn persist_experiment_with_status(
        &self,
        record: &ExperimentRecord,
        status: &views::ExperimentView,
    ) -> Ack {
        let report = match serde_json::to_vec(status) {
            Ok(bytes) => Some(Write::Put(
                format!("{FINISHED_REPORT_PREFIX}{}", record.name),
                bytes,
            )),
            Err(e) => {
                // The record is what matters; the report is shown when it can be.
                tracing::error!(error = %e, "encoding an experiment's final report");
                None
            }
        };
        self.persist_experiment_writes(record, report)
    }

    pub(super) fn persist_experiment(&self, record: &ExperimentRecord) -> Ack {
        self.persist_experiment_writes(record, None)
    }

    pub(super) fn persist_experiment_writes(
        &self,
        record: &ExperimentRecord,
        also: Option<Write>,
    ) -> Ack {
        match serde_json::to_vec(record) {
            Ok(bytes) => {
                let mut writes = vec![Write::Put(format!("exp/{}", record.name), bytes)];
                writes.extend(also);
                self.writer.send_durable(writes)
            }
            Err(e) => {
                tracing::error!(error = %e, "encoding an experiment");
                self.writer.send_durable(Vec::new())
            }
        }
    }

    /// Ends the running experiment with `state`.
    pub(super) fn end_experiment(&mut self, state: ExperimentState, reason: String) -> Option<Ack> {
        let mut exp = self.experiment.take()?;
        exp.record.state = state;
        exp.record.reason = reason;
        exp.record.ended_ms = self.now_ms();
        tracing::warn!(experiment = %exp.record.name, ?state, reason = %exp.record.reason, "experiment ended");
        // Keep the last arm metrics and shadow summary for `status`, in the
        // same durable write as the record, so they survive a restart.
        let status = self.status_of(&exp);
        let ack = self.persist_experiment_with_status(&exp.record, &status);
        // The final status holds the round stats now.
        self.writer.send(Write::Delete(format!(
            "{EXPERIMENT_ROUNDS_PREFIX}{}",
            exp.record.name
        )));
        self.finished_status.insert(exp.record.name.clone(), status);
        self.experiments
            .insert(exp.record.name.clone(), exp.record.clone());
        self.rebuild_cells();
        Some(ack)
    }

    pub fn promote(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        self.running_named(name)?;
        let (slot_name, candidate_gen) = match &self.experiment {
            Some(e) => (e.record.candidate_slot.clone(), e.candidate_generation),
            None => return Err(internal("experiment vanished")),
        };
        let slot = self
            .registry
            .find(&slot_name)
            .ok_or_else(|| ApiError::NotFound(format!("no slot `{slot_name}`")))?;
        let generation = slot
            .get(candidate_gen)
            .map_err(|e| ApiError::FailedPrecondition(e.to_string()))?;
        let default = self.registry.slot(DEFAULT_SLOT);
        let compiled = generation.compiled().cloned().ok_or_else(|| {
            ApiError::FailedPrecondition("a native generation cannot be promoted".into())
        })?;
        let promoted = default
            .load(
                compiled,
                (!generation.config.is_empty()).then(|| generation.config.clone()),
                None,
                None,
            )
            .map_err(|e| ApiError::FailedPrecondition(format!("promoting: {e}")))?;
        default.activate(promoted.id).map_err(internal)?;
        let slot_write = self.slot_write(&default)?;
        let ack1 = self.writer.send_durable(vec![slot_write]);
        let ack = self
            .end_experiment(
                ExperimentState::Promoted,
                format!(
                    "promoted: `{slot_name}` generation {candidate_gen} is now `default` generation {}",
                    promoted.id
                ),
            )
            .ok_or_else(|| internal("experiment vanished"))?;
        drop(ack1);
        Ok(ack)
    }

    pub fn abort(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        self.running_named(name)?;
        let ack = self
            .end_experiment(ExperimentState::Aborted, "aborted by request".into())
            .ok_or_else(|| internal("experiment vanished"))?;
        Ok(ack)
    }

    pub(super) fn running_named(&self, name: &str) -> Result<(), ApiError> {
        match &self.experiment {
            Some(e) if e.record.name == name => Ok(()),
            _ if self.experiments.contains_key(name) => Err(ApiError::FailedPrecondition(format!(
                "experiment `{name}` is not running"
            ))),
            _ => Err(ApiError::NotFound(format!("no experiment `{name}`"))),
        }
    }

    pub(super) fn experiment_status(&self, name: &str) -> Result<views::ExperimentView, ApiError> {
        if let Some(e) = self.experiment.as_ref().filter(|e| e.record.name == name) {
            return Ok(self.status_of(e));
        }
        if let Some(s) = self.finished_status.get(name) {
            let mut s = s.clone();
            if let Some(r) = self.experiments.get(name) {
                s.state = r.state;
                s.reason = r.reason.clone();
                s.ended_ms = r.ended_ms;
            }
            return Ok(s);
        }
        self.experiments
            .get(name)
            .map(status_skeleton)
            .ok_or_else(|| ApiError::NotFound(format!("no experiment `{name}`")))
    }

    pub(super) fn list_experiments(&self) -> Vec<views::ExperimentView> {
        let mut names: Vec<&String> = self.experiments.keys().collect();
        if let Some(e) = &self.experiment {
            names.push(&e.record.name);
        }
        names
            .into_iter()
            .filter_map(|n| self.experiment_status(n).ok())
            .collect()
    }

    pub(super) fn status_of(&self, e: &Experiment) -> views::ExperimentView {
        let mut status = status_skeleton(&e.record);
        let arms: Vec<(&str, &str)> = match e.record.mode {
            Mode::Split => vec![
                (CONTROL, DEFAULT_SLOT),
                (CANDIDATE, e.record.candidate_slot.as_str()),
            ],
            Mode::Shadow => vec![(CONTROL, DEFAULT_SLOT)],
        };
        let none = ArmStats::default();
        for (arm, slot) in arms {
            let stats = e.stats.get(arm).unwrap_or(&none);
            let cell = self.cells.iter().find(|c| c.arm == arm);
            let (nodes, gpus) = cell.map_or((0, 0), |c| {
                (
                    c.state.cluster().node_count() as u32,
                    c.state.cluster().gpu_count() as u32,
                )
            });
            let generation = if arm == CANDIDATE {
                e.candidate_generation
            } else {
                e.control_generation
            };
            status
                .arms
                .push(arm_metrics(arm, slot, generation, nodes, gpus, stats));
        }
        status.comparison = e.comparison.map(|c| views::ComparisonView {
            metric: e.record.guardrail.metric.clone(),
            difference: c.difference,
            ci_low: c.low,
            ci_high: c.high,
            always_valid_p: c.p,
        });
        status.balance = e.assigner.as_ref().map(|coin| {
            let b = coin.balance;
            let p = coin.sample_ratio_p();
            views::BalanceView {
                control_jobs: b.control_jobs,
                candidate_jobs: b.candidate_jobs,
                control_gpu_hours: b.control_work,
                candidate_gpu_hours: b.candidate_work,
                target_share: coin.share,
                sample_ratio_p: p,
                mismatch: p < SRM_ALERT_P,
            }
        });
        if let Some(shadow) = &e.shadow {
            let s = shadow.state.lock();
            status.shadow = Some(s.summary());
            let mut stats = ArmStats {
                rounds: RoundStats {
                    faults: s.candidate_faults,
                    frag_pct: s.candidate_frag.clone(),
                    policy_ms: s.candidate_latency_ms.clone(),
                    ..RoundStats::default()
                },
                ..ArmStats::default()
            };
            stats.jobs.started = s.candidate_only;
            status.arms.push(arm_metrics(
                CANDIDATE,
                &e.record.candidate_slot,
                e.candidate_generation,
                0,
                0,
                &stats,
            ));
        }
        status
    }

    /// Rolls the candidate back when it is significantly worse or faults.
    pub(super) fn check_guardrail(&mut self) {
        let Some(e) = &self.experiment else { return };
        let g = &e.record.guardrail;
        let reason = match e.record.mode {
            Mode::Shadow => {
                let faults = e
                    .shadow
                    .as_ref()
                    .map_or(0, |s| s.state.lock().candidate_faults);
                (faults >= u64::from(g.max_faults)).then(|| {
                    format!(
                        "candidate faulted {faults} times in shadow (limit {})",
                        g.max_faults
                    )
                })
            }
            Mode::Split => {
                let Some(e) = self.experiment.as_mut() else {
                    return;
                };
                let none = ArmStats::default();
                let candidate = e.stats.get(CANDIDATE).unwrap_or(&none);
                let control = e.stats.get(CONTROL).unwrap_or(&none);
                let looks = e.evidence.looks;
                let verdict = look(&e.record.guardrail, candidate, control, &mut e.evidence);
                e.comparison = verdict.comparison;
                e.rounds_dirty |= e.evidence.looks != looks;
                verdict.roll_back
            }
        };
        if let Some(reason) = reason {
            self.end_experiment(ExperimentState::RolledBack, reason);
        }
    }

    /// Which arm a released job belongs to under the running split
    /// experiment: its tenant's, or the arm it was enrolled in; a job
    /// carried over from before the experiment (not measured) by a draw at
    /// the split's share.
    pub(super) fn route(&self, job: &StoredJob) -> &'static str {
        match &self.experiment {
            Some(e) if e.record.mode == Mode::Split => {
                let candidate = if !e.record.candidate_tenants.is_empty() {
                    e.record.candidate_tenants.contains(&job.tenant)
                } else if job.experiment == e.record.name {
                    job.arm == CANDIDATE
                } else {
                    assign::unit_draw(e.record.seed, job.id) < e.record.candidate_share
                };
                if candidate { CANDIDATE } else { CONTROL }
            }
            _ => CONTROL,
        }
    }

    /// The arm a job joins on its release: the biased coin of a randomised
    /// split, else as routed.
    pub(super) fn assign(&self, job: &StoredJob) -> &'static str {
        match self.experiment.as_ref().and_then(|e| e.assigner.as_ref()) {
            Some(coin) if coin.choose(job.id) => CANDIDATE,
            Some(_) => CONTROL,
            None => self.route(job),
        }
    }

    /// Enrolls a released job in the running experiment, in arm `arm`.
    pub(super) fn enroll(&mut self, id: u64, arm: &str) {
        let (Some(e), Some(j)) = (self.experiment.as_mut(), self.jobs.get_mut(&id)) else {
            return;
        };
        j.experiment = e.record.name.clone();
        j.arm = if e.record.mode == Mode::Split {
            arm.to_string()
        } else {
            String::new()
        };
        if let Some(coin) = e.assigner.as_mut() {
            coin.count(arm == CANDIDATE, j.spec.gpu_hours());
        }
        e.stats
            .entry(arm_or_control(arm))
            .or_default()
            .jobs
            .enrolled();
    }
}

/// The jobs `at` gives a time for, in that order (ties by id): how the live
/// plane saw their starts or ends.
fn in_order<'a>(
    jobs: &[&'a StoredJob],
    at: impl Fn(&StoredJob) -> Option<u64>,
) -> Vec<&'a StoredJob> {
    let mut timed: Vec<(u64, u64, &'a StoredJob)> = jobs
        .iter()
        .filter_map(|j| at(j).map(|t| (t, j.id, *j)))
        .collect();
    timed.sort_unstable_by_key(|(t, id, _)| (*t, *id));
    timed.into_iter().map(|(_, _, j)| j).collect()
}
