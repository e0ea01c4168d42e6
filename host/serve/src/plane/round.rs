//! The control period: a tick, its rounds, reconciling what they applied, and matching.

use super::*;

impl Plane {
    /// One control period: completions, admission, a round per cell,
    /// guardrails. The serving loop runs the same three steps but asks the
    /// tenant policies without holding the plane (see [`Plane::begin_tick`]).
    pub fn tick(&mut self) {
        let admission = self.begin_tick();
        let decided = admission.decide();
        self.end_tick(decided);
    }

    /// The first half of a control period: agent liveness, completions,
    /// and what each tenant's policy is to be asked. The asking
    /// ([`PendingAdmission::decide`]) needs no access to the plane, so a
    /// slow tenant policy (bounded by its deadline) never blocks the API.
    pub fn begin_tick(&mut self) -> PendingAdmission {
        let span = tracing::info_span!("tick", round = self.rounds + 1);
        let _g = span.enter();
        let now = self.now_ms();
        self.check_agents();
        self.complete_finished(now);
        self.drop_old_finished(now);
        // Completions are readable (and announced) while the tenants are asked.
        self.publish_jobs();
        PendingAdmission {
            now,
            epoch: self.rounds + 1,
            tenants: self.admission_requests(now),
        }
    }

    /// The second half: releases what the tenant policies admitted, then a
    /// round per cell and the guardrail; then everything is published on
    /// the board.
    pub fn end_tick(&mut self, decided: DecidedAdmission) {
        let span = tracing::info_span!("tick", round = self.rounds + 1);
        let _g = span.enter();
        let now = decided.now;
        self.apply_admissions(decided);
        for i in 0..self.cells.len() {
            self.run_cell_round(i, now);
        }
        self.match_if_due(now);
        self.rounds += 1;
        self.check_guardrail();
        self.persist_experiment_rounds();
        self.publish_tick();
    }

    pub(super) fn run_cell_round(&mut self, index: usize, now: u64) {
        let cell = &mut self.cells[index];
        cell.state.set_now(now);
        let report = cell.driver.run_round(&mut cell.state);
        let arm = cell.arm.clone();
        let slot = cell.slot.name().to_string();
        // Everything since the cell's last round: this round's epoch, and any
        // a reclaim between rounds sealed.
        // (After a string compaction the history starts at the resync epoch:
        // the round's own delta, as before.)
        let delta = cell
            .state
            .delta_since(cell.round_epoch)
            .or_else(|| cell.state.delta_since(report.epoch.saturating_sub(1)));
        cell.round_epoch = report.epoch;
        // Idle rounds (nothing changed, nothing decided, nothing failed) are
        // not journaled: they carry no input. The next journaled delta then
        // starts at the last journaled epoch, which is exact because the
        // skipped deltas were empty.
        let idle = delta.as_ref().is_some_and(|d| d.events.is_empty())
            && report.decisions.is_empty()
            && report.faults.is_empty()
            && matches!(report.served, Served::Active(_));
        let journal_base = cell.last_epoch;
        if !idle {
            cell.last_epoch = report.epoch;
        }
        let round = RoundInfo {
            epoch: report.epoch,
            now_ms: cell.state.now_ms(),
            max_decisions: self.cfg.max_decisions,
        };
        // What the round changed, read before anything else moves the cell.
        let changes = Changes::read(cell, &report.applied);
        let alloc = cell.state.gpu_allocation_pct();
        let frag = {
            let plan = Plan::new(cell.state.cluster());
            fragmentation_pct(&plan, pending_demand(cell.state.cluster()))
        };
        let generation = report.served.generation();
        let served_by = generation.and_then(|g| cell.slot.get(g).ok());
        let digest = served_by
            .as_ref()
            .map(|g| g.digest().to_string())
            .unwrap_or_default();
        // The configuration, journaled when the serving generation changes.
        let config = served_by
            .filter(|_| cell.journaled_generation != Some(generation))
            .map(|g| g.config.clone());
        let served = report.served.label();
        // Metrics.
        *self.metrics.rounds.entry(arm.clone()).or_default() += 1;
        self.metrics
            .round_latency
            .entry(arm.clone())
            .or_default()
            .observe(report.latency.as_secs_f64());
        let gen_label = generation_label(generation);
        if let Some(fuel) = report.fuel {
            let total = self
                .metrics
                .fuel
                .entry((slot.clone(), gen_label.clone()))
                .or_default();
            *total = total.saturating_add(fuel);
        }
        self.metrics
            .latency
            .entry((slot.clone(), gen_label))
            .or_default()
            .observe(report.policy_time.as_secs_f64());
        if !matches!(report.served, Served::Active(_)) {
            *self.metrics.fallbacks.entry(arm.clone()).or_default() += 1;
        }
        for (generation, fault) in &report.faults {
            self.metrics.count_fault(&slot, *generation, fault.kind());
        }
        if let Some(stats) = self.round_stats(&arm) {
            stats.faults += report.faults.len() as u64;
            stats.alloc_pct.push(alloc);
            stats.frag_pct.push(frag);
            stats.policy_ms.push(report.policy_time.as_secs_f64() * 1e3);
        }
        // Shadow: same inputs, off the critical path.
        if arm == CONTROL
            && let Some(shadow) = self.experiment.as_ref().and_then(|e| e.shadow.as_ref())
            && let Some(delta) = &delta
        {
            shadow.send(ShadowInput::Round {
                delta: delta.clone(),
                round,
                incumbent: report.decisions.clone(),
            });
        }
        // Journal.
        if !idle && let Some(journal) = self.journal.as_mut() {
            let journal_started = std::time::Instant::now();
            let mut delta = delta.unwrap_or_else(|| arbiter_policy_sdk::model::Delta {
                base_epoch: journal_base,
                epoch: report.epoch,
                now_ms: round.now_ms,
                events: Vec::new(),
            });
            delta.base_epoch = journal_base;
            let record = Record::Round(Box::new(RoundRecord {
                cell: arm.clone(),
                delta,
                round,
                served: served.into(),
                slot: slot.clone(),
                generation,
                digest,
                decisions: report.decisions.clone(),
                faults: report.faults.iter().map(|(_, f)| f.to_string()).collect(),
                fuel: report.fuel,
                latency_us: report.latency.as_micros() as u64,
                policy_us: report.policy_time.as_micros() as u64,
                config,
            }));
            self.cells[index].journaled_generation = Some(generation);
            if let Err(e) = journal.append(record) {
                tracing::error!(error = %e, "journal write failed; journaling stops");
                self.journal = None;
            }
            self.metrics
                .journal
                .observe(journal_started.elapsed().as_secs_f64());
            self.rotate_journal_if_full(now);
        }
        self.reconcile(changes, now);
    }

    /// Every change a cell applied — starts, preemptions, resizes and
    /// migrations, QoS changes — into the job table, the store and the
    /// agents, in one place (a round's, and a reclaim plan's).
    pub(super) fn reconcile(&mut self, changes: Changes, now: u64) {
        let Changes {
            started,
            preempted,
            moved,
            qos_changed,
        } = changes;
        // In job order, as a restart rebuilds them (same-time starts).
        let mut started = started;
        started.sort_unstable_by_key(|(id, _)| *id);
        for (id, placement) in started {
            let mut first_delay = None;
            if let Some(j) = self.jobs.get_mut(&id) {
                j.placement = placement;
                j.start_ms = now;
                if j.first_start_ms == 0 {
                    j.first_start_ms = now;
                    first_delay = Some(now.saturating_sub(j.submit_ms) as f64);
                }
            }
            if let Some(delay) = first_delay
                && let Some(stats) = self.enrolled_stats(id)
            {
                stats.started(delay);
            }
            self.set_status(id, JobStatus::Running);
            self.launch_on_agents(id);
        }
        for id in preempted {
            self.stop_elsewhere(id, "");
            self.preempted(id);
            self.set_status(id, JobStatus::Pending);
        }
        for (id, placement) in moved {
            self.relaunch(id, placement);
        }
        for (id, qos) in qos_changed {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.spec.qos = qos;
                self.writer.send(job_write(j));
            }
            self.update_on_agents(id);
        }
    }

    /// Every `match_interval`, when the `matcher` slot has an active generation: in each cell,
    /// the running guaranteed inference jobs are the online candidates and the one-GPU
    /// opportunistic jobs (pending or running) the offline ones, profiled from their nodes'
    /// job statistics; the host core's matcher driver validates the pairings and the
    /// placements that carry them out, which are applied and reconciled like a round's. A
    /// paired job's launches carry the pairing's SM share; a share that changes reaches the
    /// running workloads as an `Update`.
    pub(super) fn match_if_due(&mut self, now: u64) {
        let Some(interval) = self.cfg.match_interval else {
            return;
        };
        if self
            .last_match_ms
            .is_some_and(|t| Duration::from_millis(now.saturating_sub(t)) < interval)
        {
            return;
        }
        let Some(slot) = self.registry.find(MATCHER_SLOT) else {
            return;
        };
        if slot.active().is_none() {
            return;
        }
        self.last_match_ms = Some(now);
        let driver = MatcherDriver::new(slot);
        for index in 0..self.cells.len() {
            let (online, offline, profiles) = self.match_candidates(index);
            if online.is_empty() || offline.is_empty() {
                continue;
            }
            let cell = &mut self.cells[index];
            cell.state.set_now(now);
            let outcome = driver.match_workloads(&mut cell.state, &online, &offline, profiles);
            for (generation, fault) in &outcome.faults {
                self.metrics
                    .count_fault(MATCHER_SLOT, *generation, fault.kind());
            }
            let applied = if outcome.decisions.is_empty() {
                Applied::default()
            } else {
                match cell.state.apply(outcome.decisions.clone()) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::error!(error = %e, "validated pairings did not apply");
                        continue;
                    }
                }
            };
            let cell = &self.cells[index];
            let paired: Vec<(u64, u8)> = outcome
                .pairings
                .iter()
                .filter_map(|p| {
                    let local = cell.state.records().get(p.offline as usize)?.id;
                    Some((*cell.global.get(&local)?, p.sm_percent))
                })
                .collect();
            let changes = Changes::read(cell, &applied);
            let moved: BTreeSet<u64> = changes
                .started
                .iter()
                .chain(&changes.moved)
                .map(|(id, _)| *id)
                .collect();
            let mut updated = Vec::new();
            for &(id, pct) in &paired {
                if self.sm_shares.insert(id, pct) != Some(pct) && !moved.contains(&id) {
                    updated.push(id);
                }
            }
            tracing::info!(
                pairings = outcome.pairings.len(),
                decisions = outcome.decisions.len(),
                served = outcome.served.label(),
                "matched offline to online work"
            );
            self.reconcile(changes, now);
            for id in updated {
                self.update_on_agents(id);
            }
        }
    }

    /// The matcher's candidates in cell `index`, as job indices, and their profiles.
    pub(super) fn match_candidates(
        &self,
        index: usize,
    ) -> (Vec<u32>, Vec<u32>, Vec<model::WorkloadProfile>) {
        let cell = &self.cells[index];
        let cluster = cell.state.cluster();
        let (mut online, mut offline, mut profiles) = (Vec::new(), Vec::new(), Vec::new());
        for (&id, &local) in &cell.local {
            let Some(i) = cell.state.job_index(local) else {
                continue;
            };
            let job = cluster.job(i);
            let candidate = if job.qos() == model::qos::GUARANTEED {
                job.kind() == model::job_kind::INFERENCE && job.phase() == model::job_phase::RUNNING
            } else {
                job.workers() == 1 && job.gpus_per_worker() == 1
            };
            if !candidate {
                continue;
            }
            if job.qos() == model::qos::GUARANTEED {
                online.push(i);
            } else {
                offline.push(i);
            }
            if let Some(m) = self.job_metric(id) {
                profiles.push(model::WorkloadProfile {
                    job: i,
                    utilization_pct: m.utilization_pct,
                    sm_activity_pct: m.sm_activity_pct,
                    memory_mib: m.peak_memory_mib,
                    solo_iteration_ms: m.iteration_ms,
                    ..model::WorkloadProfile::default()
                });
            }
        }
        online.sort_unstable();
        offline.sort_unstable();
        profiles.sort_unstable_by_key(|p| p.job);
        (online, offline, profiles)
    }

    /// A running job's terms changed (its QoS): its agents get an `Update`
    /// with the role, QoS, memory quota and compute share the launch rule
    /// now resolves, applied to the live workloads (contract 0.3's G25).
    pub(super) fn update_on_agents(&mut self, id: u64) {
        if self.jobs.get(&id).is_none_or(|j| j.placement.is_empty()) {
            return;
        }
        let Some(resolved) = self.resolve_launches(id) else {
            return;
        };
        match resolved {
            Ok(launches) => {
                for l in launches {
                    if self.is_agent(&l.node) {
                        self.update_seq += 1;
                        let update = launch::update_of(&l.launch, self.update_seq);
                        self.send_to(&l.node, ToAgent::Update(update));
                    }
                }
            }
            Err(why) => tracing::error!(job = id, %why, "update not resolved"),
        }
    }

    /// A running job now runs on other workers (a resize or a migration):
    /// the job table and the store get the new placement, and its agents
    /// restart it there. Every rank restarts, since the job's world size and
    /// rank layout change with its workers (elastic frameworks re-form their
    /// group the same way).
    pub(super) fn relaunch(&mut self, id: u64, placement: Vec<WorkerAt>) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        if job.placement == placement {
            return;
        }
        self.stop_elsewhere(id, "");
        if let Some(j) = self.jobs.get_mut(&id) {
            j.placement = placement;
            self.writer.send(job_write(j));
        }
        self.launch_on_agents(id);
    }
}
