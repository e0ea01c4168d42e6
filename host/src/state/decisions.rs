//! Policies' decisions against the state: the validator (the SDK's [`Plan`], the same
//! code a policy plans with), and applying a valid round.

use super::*;

impl ClusterState {
    /// The validator for this epoch: a [`Plan`] over the cluster (whose
    /// view carries the tenants' quotas and the sharing rules).
    /// [`ClusterState::validate`] and [`ClusterState::keep_valid`] both
    /// replay decisions through it.
    fn validator(&self, max_decisions: u32) -> Plan<'_> {
        Plan::new(&self.cluster).with_max_decisions(max_decisions)
    }

    /// Checks a policy's decisions against the current epoch: all valid, or
    /// the first invalid one with its position.
    pub fn validate(
        &self,
        decisions: &[Decision],
        max_decisions: u32,
    ) -> Result<(), (usize, DecisionError)> {
        self.replay(decisions, max_decisions).map(|_| ())
    }

    /// Replays decisions through the validator and returns its tentative
    /// state after them (for rules that judge the result, e.g. that a
    /// reclaim plan empties the returned servers), or the first invalid one.
    pub fn replay(
        &self,
        decisions: &[Decision],
        max_decisions: u32,
    ) -> Result<Plan<'_>, (usize, DecisionError)> {
        if decisions.len() > max_decisions as usize {
            return Err((
                max_decisions as usize,
                DecisionError::TooManyDecisions {
                    limit: max_decisions,
                },
            ));
        }
        let mut plan = self.validator(max_decisions);
        for (i, d) in decisions.iter().enumerate() {
            plan.apply(d.clone()).map_err(|e| (i, e))?;
        }
        Ok(plan)
    }

    /// The decisions that survive validation one by one, in order: each is
    /// checked against the plan of those kept before it, so the result
    /// always passes [`ClusterState::validate`]. Used for the host's own
    /// native last resort, which must never leave a round without an
    /// answer; a Wasm policy's answer is all or nothing.
    pub fn keep_valid(
        &self,
        decisions: Vec<Decision>,
        max_decisions: u32,
    ) -> (Vec<Decision>, Vec<(usize, DecisionError)>) {
        let mut plan = self.validator(max_decisions);
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        // The plan itself refuses decisions past the limit.
        for (i, d) in decisions.into_iter().enumerate() {
            match plan.apply(d.clone()) {
                Ok(()) => kept.push(d),
                Err(e) => dropped.push((i, e)),
            }
        }
        (kept, dropped)
    }

    /// Carries out decisions that passed [`ClusterState::validate`] at this epoch.
    ///
    /// The jobs a round starts get their progress in one `job-progress` event
    /// after the round's placements, not one event each beside its placement:
    /// a placement changes no job's progress, so the mirror ends the same,
    /// and a thousand starts cross the policy boundary as one list instead of
    /// a thousand one-element lists.
    pub fn apply(&mut self, decisions: Vec<Decision>) -> Result<Applied, StateError> {
        let mut applied = Applied::default();
        let mut started = Vec::new();
        for d in decisions {
            if let Err(e) = self.apply_one(d, &mut applied, &mut started) {
                // The jobs started before the failed decision still get their
                // progress; the decision's error is the one to report.
                if let Err(progress) = self.set_progresses(started) {
                    tracing::error!(error = %progress, "recording the progress of the jobs started before a failed decision");
                }
                return Err(e);
            }
        }
        self.set_progresses(started)?;
        Ok(applied)
    }

    /// One decision of [`ClusterState::apply`]; the progress of a job it
    /// starts goes to `started`.
    fn apply_one(
        &mut self,
        d: Decision,
        applied: &mut Applied,
        started: &mut Vec<model::JobProgress>,
    ) -> Result<(), StateError> {
        let job = d.job();
        let Some(record) = self.jobs.get(job as usize) else {
            return Err(StateError::Event(format!(
                "decision for unknown job index {job}"
            )));
        };
        let id = record.id;
        match d {
            Decision::Place(j, workers) | Decision::Migrate(j, workers) => {
                let starting = self.cluster.job(j).phase() != job_phase::RUNNING;
                self.emit(Event::JobPlaced(j, workers))?;
                if starting {
                    started.push(self.run_changed(j, true));
                    let rec = &mut self.jobs[j as usize];
                    rec.first_start_ms.get_or_insert(self.now_ms);
                    rec.last_start_ms = Some(self.now_ms);
                    applied.started.push(id);
                } else {
                    applied.migrated.push(id);
                }
            }
            Decision::ScaleOut(j, added) => {
                let workers = self.cluster.job(j).placement_with(&added);
                self.emit(Event::JobPlaced(j, workers))?;
                applied.resized.push(id);
            }
            Decision::ScaleIn(j, positions) => {
                let workers = self.cluster.job(j).placement_without(&positions);
                self.emit(Event::JobPlaced(j, workers))?;
                applied.resized.push(id);
            }
            Decision::Preempt(j) => {
                self.stop_job(j)?;
                self.jobs[j as usize].preemptions += 1;
                applied.preempted.push(id);
            }
            Decision::Reserve(j, nodes) => {
                self.emit(Event::JobReserved(j, nodes))?;
                applied.other += 1;
            }
            Decision::Unreserve(j) => {
                self.emit(Event::JobReserved(j, Vec::new()))?;
                self.emit(Event::JobReservedGpus(j, Vec::new()))?;
                applied.other += 1;
            }
            Decision::ReserveGpus(j, gpus) => {
                self.emit(Event::JobReservedGpus(j, gpus))?;
                applied.other += 1;
            }
            Decision::SetQos(j, q) => {
                self.emit(Event::JobQosChanged(j, q))?;
                applied.qos_changed.push(id);
            }
        }
        Ok(())
    }
}
