//! Cells: the cluster states the rounds run on, rebuilt from the job table, and the journal they write.

use super::*;

impl Plane {
    /// Waits until every journal record queued so far is on disk (for a
    /// reader of a running plane's journal).
    pub fn flush_journal(&self) -> anyhow::Result<()> {
        match &self.journal {
            Some(j) => j.flush(),
            None => Ok(()),
        }
    }

    /// Rebuilds the cells from the job table (start-up, experiment start/end).
    pub(super) fn rebuild_cells(&mut self) {
        let span = tracing::info_span!("rebuild_cells");
        let _g = span.enter();
        let ids: Vec<u64> = self
            .cells
            .iter()
            .flat_map(|c| c.local.keys().copied())
            .collect();
        for id in ids {
            self.keep_progress(id);
        }
        let now = self.now_ms();
        let default_slot = self.registry.slot(DEFAULT_SLOT);
        let mut arms: Vec<(&'static str, Arc<PolicySlot>)> = vec![(CONTROL, default_slot)];
        let mut candidate_nodes: HashSet<String> = HashSet::new();
        if let Some(e) = self
            .experiment
            .as_ref()
            .filter(|e| e.record.mode == Mode::Split)
            && let Some(slot) = self.registry.find(&e.record.candidate_slot)
        {
            arms.push((CANDIDATE, slot));
            let mut names: Vec<&str> = self
                .nodes
                .iter()
                .filter(|n| n.status != NodeStatus::Lost)
                .map(|n| n.request.name.as_str())
                .collect();
            names.sort();
            let k = ((e.record.candidate_share * names.len() as f64).round() as usize)
                .clamp(1, names.len().saturating_sub(1).max(1));
            candidate_nodes = names[names.len().saturating_sub(k)..]
                .iter()
                .map(|s| s.to_string())
                .collect();
        }
        for (_, slot) in &arms {
            for g in slot.generations() {
                g.discard_instance();
            }
        }
        let mut cells: Vec<Cell> = arms
            .into_iter()
            .map(|(arm, slot)| {
                let mut state = ClusterState::new();
                state.set_now(now);
                // Job and node statistics arrive once per heartbeat, each over the interval
                // since the previous one: that interval is the metric window.
                state.set_metric_window_ms(
                    u32::try_from(self.cfg.heartbeat.as_millis()).unwrap_or(u32::MAX),
                );
                for (model, permille) in &self.cfg.gpu_speeds {
                    if let Err(e) = state.set_gpu_model_speed(model, *permille) {
                        tracing::error!(model, error = %e, "GPU speed not applied");
                    }
                }
                if let Err(e) = state.set_sharing(self.cfg.sharing) {
                    tracing::error!(error = %e, "sharing rules not applied");
                }
                for (name, t) in &self.tenants {
                    if t.quota_gpus > 0
                        && let Err(e) = state.set_tenant_quota(name, Some(t.quota_gpus))
                    {
                        tracing::error!(tenant = name, error = %e, "tenant quota not applied");
                    }
                }
                for n in self.nodes.iter().filter(|n| n.status != NodeStatus::Lost) {
                    let mine = if arm == CANDIDATE {
                        candidate_nodes.contains(&n.request.name)
                    } else {
                        !candidate_nodes.contains(&n.request.name)
                    };
                    if !mine {
                        continue;
                    }
                    match state.add_node(n.request.clone()) {
                        Ok(_)
                            if matches!(n.status, NodeStatus::Draining | NodeStatus::Reclaimed) =>
                        {
                            let _ =
                                state.set_node_state(&n.request.name, model::node_state::CORDONED);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::error!(node = %n.request.name, error = %e, "node refused")
                        }
                    }
                }
                let driver =
                    RoundDriver::new(Arc::clone(&slot)).with_max_decisions(self.cfg.max_decisions);
                Cell {
                    arm: arm.to_string(),
                    slot,
                    driver,
                    state,
                    local: HashMap::new(),
                    global: HashMap::new(),
                    last_epoch: 0,
                    round_epoch: 0,
                    journaled_generation: None,
                }
            })
            .collect();
        let mut ids: Vec<u64> = self.released().map(|j| j.id).collect();
        ids.sort_unstable();
        let mut requeued = Vec::new();
        for id in ids {
            let Some(job) = self.jobs.get(&id).cloned() else {
                continue;
            };
            let routed = self.route(&job);
            let home = if job.status == JobStatus::Running {
                job.placement.first().and_then(|w| {
                    cells
                        .iter()
                        .position(|c| c.state.node_index(&w.node).is_some())
                })
            } else {
                None
            };
            let cell_index = home
                .or_else(|| cells.iter().position(|c| c.arm == routed))
                .unwrap_or(0);
            let cell = &mut cells[cell_index];
            let local = match cell.state.submit_with(job_request(&job), job_traits(&job)) {
                Ok(local) => local,
                Err(e) => {
                    tracing::error!(job = id, error = %e, "job refused by its cell; marking it failed");
                    requeued.push((id, Err(e.to_string())));
                    continue;
                }
            };
            cell.local.insert(id, local);
            cell.global.insert(local, id);
            if job.status == JobStatus::Running {
                let placed = place_again(&mut cell.state, local, &job.placement);
                if let Err(e) = placed {
                    tracing::warn!(job = id, error = %e, "running job could not keep its placement; requeued");
                    requeued.push((id, Ok(())));
                }
            }
            let p = job.progress;
            if p != ProgressRecord::default()
                && let Err(e) = cell.state.restore_progress(
                    local,
                    p.attained_ms,
                    p.remaining_ms,
                    p.remaining_workers,
                )
            {
                tracing::warn!(job = id, error = %e, "progress not restored");
            }
            if let Some(load) = job.service
                && let Err(e) = record_service(&mut cell.state, local, load)
            {
                tracing::warn!(job = id, error = %e, "service load not restored");
            }
            if let Some(j) = self.jobs.get_mut(&id) {
                j.arm = if self
                    .experiment
                    .as_ref()
                    .is_some_and(|e| e.record.mode == Mode::Split)
                {
                    cells[cell_index].arm.clone()
                } else {
                    String::new()
                };
            }
        }
        for (id, outcome) in requeued {
            match outcome {
                Ok(()) => {
                    self.preempted(id);
                    self.set_status(id, JobStatus::Pending);
                }
                Err(e) => {
                    let _ = self.finish_job(id, JobStatus::Failed, &e);
                }
            }
        }
        for cell in &mut cells {
            let snapshot = cell.state.snapshot();
            cell.last_epoch = cell.state.epoch();
            cell.round_epoch = cell.last_epoch;
            cell.journaled_generation = None;
            if let Some(j) = self.journal.as_mut()
                && let Err(e) = j.append(Record::Snapshot {
                    cell: cell.arm.clone(),
                    wall_ms: now,
                    snapshot: Box::new(snapshot.clone()),
                })
            {
                tracing::error!(error = %e, "journal write failed; journaling stops");
                self.journal = None;
            }
            if cell.arm == CONTROL
                && let Some(shadow) = self.experiment.as_ref().and_then(|e| e.shadow.as_ref())
            {
                shadow.send(ShadowInput::Snapshot(Box::new(snapshot)));
            }
        }
        self.cells = cells;
    }

    /// Seals a full journal segment and begins the next with a checkpoint
    /// of every cell, so each segment can be read on its own. A checkpoint
    /// seals the cell's pending changes into an epoch of its own and the
    /// next round's delta starts there (as after a rebuild); a reader that
    /// was already following the cell resyncs its instance to it, which
    /// leaves the mirror exactly where the deltas would have.
    pub(super) fn rotate_journal_if_full(&mut self, now: u64) {
        let Some(journal) = self.journal.as_mut().filter(|j| j.is_full()) else {
            return;
        };
        let mut rotated = journal.rotate();
        let shadow = self.experiment.as_ref().and_then(|e| e.shadow.as_ref());
        for cell in &mut self.cells {
            if rotated.is_err() {
                break;
            }
            let snapshot = cell.state.snapshot();
            cell.last_epoch = cell.state.epoch();
            cell.round_epoch = cell.last_epoch;
            rotated = journal.append(Record::Checkpoint {
                cell: cell.arm.clone(),
                wall_ms: now,
                snapshot: Box::new(snapshot.clone()),
            });
            if cell.arm == CONTROL
                && let Some(shadow) = shadow
            {
                shadow.send(ShadowInput::Snapshot(Box::new(snapshot)));
            }
        }
        if let Err(e) = rotated {
            tracing::error!(error = %e, "journal rotation failed; journaling stops");
            self.journal = None;
        }
    }
}
