//! The state machine: a delta's events applied to the mirror — the host's truth runs
//! the same code — with the accounting they imply (workers charged to their GPUs and
//! nodes, reservations, each touched node's room recomputed).

use super::*;

impl Cluster {
    /// Applies a delta; its base epoch must be the mirror's epoch.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), MirrorError> {
        if delta.base_epoch != self.epoch {
            return Err(MirrorError::EpochMismatch {
                mirror: self.epoch,
                delta_base: delta.base_epoch,
            });
        }
        for event in &delta.events {
            self.apply_event(event)?;
        }
        self.epoch = delta.epoch;
        self.now_ms = delta.now_ms;
        Ok(())
    }

    /// Moves the mirror to a new epoch (the host does this after a round's events).
    pub fn set_epoch(&mut self, epoch: u64, now_ms: u64) {
        self.epoch = epoch;
        self.now_ms = now_ms;
    }

    /// Applies one event. On error the mirror is unchanged.
    pub fn apply_event(&mut self, event: &Event) -> Result<(), MirrorError> {
        match event {
            Event::StringsAdded(strings) => self.strings.extend(strings.iter().cloned()),
            Event::GpuModelsAdded(models) => {
                self.gpu_models.extend(models.iter().map(|&(name, _)| name));
                self.gpu_model_speed
                    .extend(models.iter().map(|&(_, speed)| speed));
                let slots: Vec<u8> = self
                    .gpus
                    .model
                    .iter()
                    .map(|&m| self.slot_of_model(m))
                    .collect();
                self.gpu_model_slot = slots;
                // Which GPUs a model mask allows may have changed anywhere.
                for n in 0..self.node_count() {
                    self.touch(n);
                }
            }
            Event::GpuModelSpeedChanged(slot, speed) => {
                let s = in_range("gpu model", *slot, self.gpu_model_speed.len())?;
                self.gpu_model_speed[s] = *speed;
            }
            Event::NodeAdded(spec) => {
                if spec.gpu_count > MAX_NODE_GPUS {
                    return Err(MirrorError::Inconsistent(format!(
                        "a node with {} GPUs; at most {} are allowed",
                        spec.gpu_count, MAX_NODE_GPUS
                    )));
                }
                self.add_node(spec)
            }
            Event::NodeStateChanged(node, state) => {
                let n = in_range("node", *node, self.node_count())?;
                self.nodes.state[n] = *state;
                self.touch(n);
            }
            Event::NodeLoanChanged(node, on_loan) => {
                let n = in_range("node", *node, self.node_count())?;
                self.nodes.on_loan[n] = *on_loan;
                self.touch(n);
            }
            Event::JobAdded(spec) => self.add_job(spec),
            Event::JobRemoved(job) => {
                let j = in_range("job", *job, self.job_count())?;
                self.release_job(j);
                self.clear_reservation(j);
                self.swap_remove_job(j);
            }
            Event::JobPlaced(job, workers) => {
                let j = in_range("job", *job, self.job_count())?;
                self.check_workers(workers)?;
                self.release_job(j);
                self.clear_reservation(j);
                self.place_job(j, workers);
                self.jobs.phase[j] = job_phase::RUNNING;
                self.jobs.workers[j] = workers.len() as u32;
            }
            Event::JobEvicted(job) => {
                let j = in_range("job", *job, self.job_count())?;
                self.release_job(j);
                self.jobs.phase[j] = job_phase::PENDING;
            }
            Event::JobQosChanged(job, qos) => {
                let j = in_range("job", *job, self.job_count())?;
                // A running job's charge moves between the guaranteed and
                // shared accounts when its QoS crosses them.
                let workers = std::mem::take(&mut self.job_workers[j]);
                for w in &workers {
                    self.charge_worker(j, w, false);
                }
                self.jobs.qos[j] = *qos;
                for w in &workers {
                    self.charge_worker(j, w, true);
                }
                self.job_workers[j] = workers;
            }
            Event::JobReserved(job, nodes) => {
                let j = in_range("job", *job, self.job_count())?;
                for &node in nodes {
                    in_range("node", node, self.node_count())?;
                }
                self.clear_node_reservation(j);
                for &node in nodes {
                    self.node_reserved_by[node as usize] = j as u32 + 1;
                    self.touch(node as usize);
                }
                self.job_reserved[j] = nodes.clone();
                self.settle_reserved_phase(j);
            }
            Event::JobReservedGpus(job, gpus) => {
                let j = in_range("job", *job, self.job_count())?;
                for &gpu in gpus {
                    in_range("gpu", gpu, self.gpu_count())?;
                }
                self.clear_gpu_reservation(j);
                for &gpu in gpus {
                    self.gpu_reserved_by[gpu as usize] = j as u32 + 1;
                    self.touch(self.gpus.node[gpu as usize] as usize);
                }
                self.job_reserved_gpus[j] = gpus.clone();
                self.settle_reserved_phase(j);
            }
            Event::TenantQuotaChanged(tenant, quota) => match self.tenant_row.get(tenant) {
                Some(&row) => self.tenants.gpu_quota_milli[row] = *quota,
                None => {
                    self.tenant_row.insert(*tenant, self.tenants.name.len());
                    self.tenants.name.push(*tenant);
                    self.tenants.gpu_quota_milli.push(*quota);
                }
            },
            Event::TenantQuotaRemoved(tenant) => {
                if let Some(row) = self.tenant_row.remove(tenant) {
                    self.tenants.name.swap_remove(row);
                    self.tenants.gpu_quota_milli.swap_remove(row);
                    if let Some(&moved) = self.tenants.name.get(row) {
                        self.tenant_row.insert(moved, row);
                    }
                }
            }
            Event::SharingChanged(rules) => {
                // Every running worker is re-charged under the new rules.
                let running: Vec<usize> = (0..self.job_count())
                    .filter(|&j| !self.job_workers[j].is_empty())
                    .collect();
                for &j in &running {
                    for w in self.job_workers[j].clone() {
                        self.charge_worker(j, &w, false);
                    }
                }
                self.sharing = *rules;
                for &j in &running {
                    for w in self.job_workers[j].clone() {
                        self.charge_worker(j, &w, true);
                    }
                }
                for n in 0..self.node_count() {
                    self.touch(n);
                }
            }
            Event::GpuHealthChanged(gpu, health) => {
                let g = in_range("gpu", *gpu, self.gpu_count())?;
                self.gpus.health[g] = *health;
                self.touch(self.gpus.node[g] as usize);
            }
            Event::JobMetrics(metrics) => {
                for m in metrics {
                    in_range("job", m.job, self.job_count())?;
                }
                for m in metrics {
                    self.job_metrics[m.job as usize] = *m;
                }
            }
            Event::ServiceMetrics(metrics) => {
                for m in metrics {
                    in_range("job", m.job, self.job_count())?;
                }
                for m in metrics {
                    self.job_service[m.job as usize] = *m;
                }
            }
            Event::NodeMetrics(metrics) => {
                for m in metrics {
                    in_range("node", m.node, self.node_count())?;
                }
                for m in metrics {
                    self.node_metrics[m.node as usize] = *m;
                }
            }
            Event::JobProgress(progress) => {
                for p in progress {
                    in_range("job", p.job, self.job_count())?;
                }
                for p in progress {
                    self.jobs.set_progress(p);
                }
            }
            Event::GpuMetrics(metrics) => {
                for m in metrics {
                    in_range("gpu", m.gpu, self.gpu_count())?;
                }
                for m in metrics {
                    let g = m.gpu as usize;
                    self.gpu_utilization[g] = m.utilization_pct;
                    self.gpu_sm_activity[g] = m.sm_activity_pct;
                    self.gpu_sm_occupancy[g] = m.sm_occupancy_pct;
                }
            }
        }
        Ok(())
    }

    fn add_node(&mut self, spec: &NodeSpec) {
        let node = self.node_count() as u32;
        let first_gpu = self.gpu_count() as u32;
        let n = &mut self.nodes;
        n.name.push(spec.name);
        n.pool.push(spec.pool);
        n.state.push(node_state::READY);
        n.cpu_milli.push(spec.cpu_milli);
        n.memory_mib.push(spec.memory_mib);
        n.cpu_used_milli.push(0);
        n.memory_used_mib.push(0);
        n.first_gpu.push(first_gpu);
        n.gpu_count.push(spec.gpu_count);
        n.on_loan.push(spec.on_loan);
        n.fabric.push(spec.fabric);
        let slot = self.slot_of_model(spec.gpu_model);
        for _ in 0..spec.gpu_count {
            let gc = &mut self.gpus;
            gc.node.push(node);
            gc.model.push(spec.gpu_model);
            gc.memory_mib.push(spec.gpu_memory_mib);
            gc.milli_used.push(0);
            gc.memory_used_mib.push(0);
            gc.shared_milli.push(0);
            gc.shared_memory_mib.push(0);
            gc.shared_workers.push(0);
            gc.health.push(health::HEALTHY);
            self.gpu_model_slot.push(slot);
            self.gpu_utilization.push(0);
            self.gpu_sm_activity.push(0);
            self.gpu_sm_occupancy.push(0);
            self.gpu_reserved_by.push(0);
        }
        self.node_metrics.push(NodeMetric::default());
        self.node_reserved_by.push(0);
        self.node_jobs.push(Vec::new());
        let room = self.room_of(node as usize);
        self.node_room.push(room);
        self.node_version.push(fresh_version());
    }

    /// Appends arriving jobs given as columns (the contract's `jobs-added`),
    /// as [`Event::JobAdded`] would one by one, without a per-row detour.
    /// Their phase and progress are taken as a fresh arrival's, whatever
    /// the columns say. On error the mirror is unchanged.
    pub fn add_jobs(&mut self, c: &JobColumns) -> Result<(), MirrorError> {
        let rows = c.rows().ok_or(MirrorError::Ragged("jobs-added"))?;
        let first = self.job_count();
        let j = &mut self.jobs;
        j.name.extend_from_slice(&c.name);
        j.tenant.extend_from_slice(&c.tenant);
        j.phase
            .extend(std::iter::repeat_n(job_phase::PENDING, rows));
        j.kind.extend_from_slice(&c.kind);
        j.qos.extend_from_slice(&c.qos);
        j.priority.extend_from_slice(&c.priority);
        j.workers.extend_from_slice(&c.workers);
        j.min_workers.extend_from_slice(&c.min_workers);
        j.max_workers.extend_from_slice(&c.max_workers);
        j.cpu_milli.extend_from_slice(&c.cpu_milli);
        j.memory_mib.extend_from_slice(&c.memory_mib);
        j.gpus_per_worker.extend_from_slice(&c.gpus_per_worker);
        j.gpu_milli.extend_from_slice(&c.gpu_milli);
        j.gpu_memory_mib.extend_from_slice(&c.gpu_memory_mib);
        j.gpu_model_mask.extend_from_slice(&c.gpu_model_mask);
        j.submit_ms.extend_from_slice(&c.submit_ms);
        j.estimate_ms.extend_from_slice(&c.estimate_ms);
        j.deadline_ms.extend_from_slice(&c.deadline_ms);
        j.checkpointed.extend_from_slice(&c.checkpointed);
        j.gpu_milli_limit.extend_from_slice(&c.gpu_milli_limit);
        j.locality.extend_from_slice(&c.locality);
        j.slo_ms.extend_from_slice(&c.slo_ms);
        j.group.extend_from_slice(&c.group);
        // Until the host reports progress, what is left is the estimate.
        j.started_ms.extend(std::iter::repeat_n(0, rows));
        j.attained_ms.extend(std::iter::repeat_n(0, rows));
        j.remaining_ms.extend_from_slice(&c.estimate_ms);
        j.remaining_workers.extend_from_slice(&c.workers);
        j.reported_ms.extend_from_slice(&c.submit_ms);
        let end = first + rows;
        self.job_workers.resize_with(end, Vec::new);
        self.job_reserved.resize_with(end, Vec::new);
        self.job_reserved_gpus.resize_with(end, Vec::new);
        self.job_metrics.resize_with(end, JobMetric::default);
        self.job_service.resize_with(end, ServiceMetric::default);
        Ok(())
    }

    fn add_job(&mut self, s: &JobSpec) {
        self.jobs.push_arrival(s);
        self.job_workers.push(Vec::new());
        self.job_reserved.push(Vec::new());
        self.job_reserved_gpus.push(Vec::new());
        self.job_metrics.push(JobMetric::default());
        self.job_service.push(ServiceMetric::default());
    }

    fn swap_remove_job(&mut self, j: usize) {
        let last = self.job_count() - 1;
        let jc = &mut self.jobs;
        jc.name.swap_remove(j);
        jc.tenant.swap_remove(j);
        jc.phase.swap_remove(j);
        jc.kind.swap_remove(j);
        jc.qos.swap_remove(j);
        jc.priority.swap_remove(j);
        jc.workers.swap_remove(j);
        jc.min_workers.swap_remove(j);
        jc.max_workers.swap_remove(j);
        jc.cpu_milli.swap_remove(j);
        jc.memory_mib.swap_remove(j);
        jc.gpus_per_worker.swap_remove(j);
        jc.gpu_milli.swap_remove(j);
        jc.gpu_memory_mib.swap_remove(j);
        jc.gpu_model_mask.swap_remove(j);
        jc.submit_ms.swap_remove(j);
        jc.estimate_ms.swap_remove(j);
        jc.deadline_ms.swap_remove(j);
        jc.checkpointed.swap_remove(j);
        jc.started_ms.swap_remove(j);
        jc.attained_ms.swap_remove(j);
        jc.remaining_ms.swap_remove(j);
        jc.remaining_workers.swap_remove(j);
        jc.reported_ms.swap_remove(j);
        jc.gpu_milli_limit.swap_remove(j);
        jc.locality.swap_remove(j);
        jc.slo_ms.swap_remove(j);
        jc.group.swap_remove(j);
        self.job_workers.swap_remove(j);
        self.job_reserved.swap_remove(j);
        self.job_reserved_gpus.swap_remove(j);
        self.job_metrics.swap_remove(j);
        self.job_service.swap_remove(j);
        if j != last {
            for &node in &self.job_reserved[j] {
                self.node_reserved_by[node as usize] = j as u32 + 1;
            }
            for &gpu in &self.job_reserved_gpus[j] {
                self.gpu_reserved_by[gpu as usize] = j as u32 + 1;
            }
            // The last job is now job `j`: renumber it in the node index.
            for w in &self.job_workers[j] {
                for entry in self.node_jobs[w.node as usize].iter_mut() {
                    if *entry == last as u32 {
                        *entry = j as u32;
                    }
                }
            }
        }
    }

    fn check_workers(&self, workers: &[WorkerPlacement]) -> Result<(), MirrorError> {
        for w in workers {
            in_range("node", w.node, self.node_count())?;
            for &gpu in &w.gpus {
                in_range("gpu", gpu, self.gpu_count())?;
            }
        }
        Ok(())
    }

    /// Adds (`charge`) or removes one worker's resources from the books.
    fn charge_worker(&mut self, j: usize, w: &WorkerPlacement, charge: bool) {
        let n = w.node as usize;
        let cpu = self.jobs.cpu_milli[j];
        let mem = self.jobs.memory_mib[j];
        let update = |v: &mut u32, amount: u32| {
            *v = if charge {
                v.saturating_add(amount)
            } else {
                v.saturating_sub(amount)
            };
        };
        update(&mut self.nodes.cpu_used_milli[n], cpu);
        update(&mut self.nodes.memory_used_mib[n], mem);
        let shared = self.sharing.is_shared(self.jobs.qos[j]);
        for &gpu in &w.gpus {
            let g = gpu as usize;
            let (milli, gmem) = self.worker_gpu_share(j, g);
            if shared {
                update(&mut self.gpus.shared_milli[g], milli);
                update(&mut self.gpus.shared_memory_mib[g], gmem);
                update(&mut self.gpus.shared_workers[g], 1);
            } else {
                update(&mut self.gpus.milli_used[g], milli);
                update(&mut self.gpus.memory_used_mib[g], gmem);
            }
            let owner = self.gpus.node[g] as usize;
            if owner != n {
                self.touch(owner);
            }
        }
        self.touch(n);
    }

    /// (milli-GPU, GPU memory) in use on GPU `g`.
    fn gpu_used(&self, g: usize) -> (u32, u32) {
        (self.gpus.milli_used[g], self.gpus.memory_used_mib[g])
    }

    /// Marks `node` as changed (see [`Cluster::node_version`]) and derives
    /// its room afresh.
    fn touch(&mut self, node: usize) {
        if node >= self.node_count() {
            return;
        }
        self.node_version[node] = fresh_version();
        let room = self.room_of(node);
        self.node_room[node] = room;
    }

    /// `node`'s room in the committed state.
    pub(super) fn room_of(&self, node: usize) -> NodeRoom {
        NodeRoom::of(
            self,
            node,
            |g| self.gpu_used(g),
            self.nodes.cpu_used_milli[node],
            self.nodes.memory_used_mib[node],
        )
    }

    /// Charges `workers` to job `j` (which holds none) and indexes them.
    fn place_job(&mut self, j: usize, workers: &[WorkerPlacement]) {
        for w in workers {
            self.charge_worker(j, w, true);
            let on_node = &mut self.node_jobs[w.node as usize];
            if !on_node.contains(&(j as u32)) {
                on_node.push(j as u32);
            }
        }
        self.job_workers[j] = workers.to_vec();
    }

    fn release_job(&mut self, j: usize) {
        let workers = std::mem::take(&mut self.job_workers[j]);
        for w in &workers {
            self.charge_worker(j, w, false);
            self.node_jobs[w.node as usize].retain(|&other| other != j as u32);
        }
    }

    /// Drops everything job `j` holds (nodes and GPUs); it is pending again.
    fn clear_reservation(&mut self, j: usize) {
        self.clear_node_reservation(j);
        self.clear_gpu_reservation(j);
        self.settle_reserved_phase(j);
    }

    fn clear_node_reservation(&mut self, j: usize) {
        for node in std::mem::take(&mut self.job_reserved[j]) {
            if self.node_reserved_by[node as usize] == j as u32 + 1 {
                self.node_reserved_by[node as usize] = 0;
                self.touch(node as usize);
            }
        }
    }

    fn clear_gpu_reservation(&mut self, j: usize) {
        for gpu in std::mem::take(&mut self.job_reserved_gpus[j]) {
            let g = gpu as usize;
            if self.gpu_reserved_by[g] == j as u32 + 1 {
                self.gpu_reserved_by[g] = 0;
                self.touch(self.gpus.node[g] as usize);
            }
        }
    }

    /// A waiting job is `reserved` exactly while it holds nodes or GPUs.
    fn settle_reserved_phase(&mut self, j: usize) {
        let holds = !self.job_reserved[j].is_empty() || !self.job_reserved_gpus[j].is_empty();
        match self.jobs.phase[j] {
            job_phase::PENDING if holds => self.jobs.phase[j] = job_phase::RESERVED,
            job_phase::RESERVED if !holds => self.jobs.phase[j] = job_phase::PENDING,
            _ => {}
        }
    }
}
