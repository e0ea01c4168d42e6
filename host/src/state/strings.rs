//! The interned string table: reference counts kept by the columns that name a string,
//! and the compaction that drops dead strings in a resync epoch of its own.

use super::*;

/// The interned string table: its size, how much of it is referenced, compactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StringStats {
    /// Strings in the table (what a snapshot carries).
    pub total: usize,
    /// Strings some node, GPU model or job refers to.
    pub live: usize,
    /// Compactions so far.
    pub compactions: u64,
    /// The epoch the last compaction opened (0 = none): a mirror at an older
    /// epoch can only catch up with a snapshot.
    pub resync_epoch: u64,
}

impl StringStats {
    /// Strings nothing refers to any more.
    pub fn dead(&self) -> usize {
        self.total - self.live
    }
}

/// What one compaction of the string table did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// The resync epoch it opened.
    pub epoch: u64,
    pub strings_before: usize,
    pub strings_after: usize,
}

/// Old string id → new, numbering strings in the order they are first met.
struct Renumber<'a> {
    old: &'a [String],
    new_id: Vec<u32>,
    strings: Vec<String>,
}

impl Renumber<'_> {
    /// The new id of old id `id` (every column is rewritten from old ids once).
    fn id(&mut self, id: u32) -> Result<u32, StateError> {
        let old = id as usize;
        let (Some(&mapped), Some(s)) = (self.new_id.get(old), self.old.get(old)) else {
            return Err(StateError::Event(format!(
                "string id {old} out of range ({} strings)",
                self.old.len()
            )));
        };
        if mapped != UNMAPPED {
            return Ok(mapped);
        }
        let new = self.strings.len() as u32;
        self.new_id[old] = new;
        self.strings.push(s.clone());
        Ok(new)
    }
}

impl ClusterState {
    pub(super) fn retain_string(&mut self, id: u32) {
        if let Some(count) = self.string_refs.get_mut(id as usize) {
            if *count == 0 {
                self.live_strings += 1;
            }
            *count += 1;
        }
    }

    pub(super) fn release_string(&mut self, id: u32) {
        if let Some(count) = self.string_refs.get_mut(id as usize)
            && *count > 0
        {
            *count -= 1;
            if *count == 0 {
                self.live_strings -= 1;
            }
        }
    }

    /// Id of an interned string, interning it (and telling the policies) if new.
    /// Ids hold until the next compaction renumbers them; a string nothing
    /// refers to (one only interned here) counts as dead.
    pub fn intern(&mut self, s: &str) -> Result<u32, StateError> {
        if let Some(&id) = self.interned.get(s) {
            return Ok(id);
        }
        let id = self.cluster.strings().len() as u32;
        self.cluster
            .apply_event(&Event::StringsAdded(vec![s.to_string()]))
            .map_err(|e| StateError::Event(e.to_string()))?;
        match self.strings_event.and_then(|i| self.events.get_mut(i)) {
            Some(Event::StringsAdded(strings)) => strings.push(s.to_string()),
            _ => {
                self.strings_event = Some(self.events.len());
                self.events.push(Event::StringsAdded(vec![s.to_string()]));
            }
        }
        self.interned.insert(s.to_string(), id);
        self.string_refs.push(0);
        Ok(id)
    }

    /// The string table's size, live part and compactions.
    pub fn string_stats(&self) -> StringStats {
        StringStats {
            total: self.cluster.strings().len(),
            live: self.live_strings,
            compactions: self.compactions,
            resync_epoch: self.resync_epoch,
        }
    }

    /// Whether the next round compacts the string table first: dead strings
    /// outnumber live ones and reach the floor.
    pub fn compaction_due(&self) -> bool {
        let stats = self.string_stats();
        self.compaction_floor
            .is_some_and(|floor| stats.dead() > stats.live && stats.dead() >= floor.max(1))
    }

    /// Drops the strings nothing refers to and renumbers the live ones, in a
    /// new epoch of its own — a resync epoch.
    ///
    /// Pending changes are folded into that epoch and the delta history is
    /// dropped: a mirror at any earlier epoch gets `None` from
    /// [`ClusterState::delta_since`] and resyncs from a snapshot, which is
    /// exact at this epoch and carries live strings only. Deltas after it
    /// work as before. Live strings are numbered in the order a fresh state
    /// interns them (per node: GPU model, name, pool, fabric; then per job:
    /// name, tenant, group; then tenants with a quota), so a compacted state snapshots like a fresh state built from
    /// the same nodes and jobs. The GPU-model table keeps its order, so job
    /// model masks keep their meaning. The latest metric samples, which a
    /// snapshot does not carry, are kept on the host.
    ///
    /// On error the state is unchanged.
    pub fn compact_strings(&mut self) -> Result<Compaction, StateError> {
        let strings_before = self.cluster.strings().len();
        let epoch = self.cluster.epoch() + 1;
        let span = tracing::info_span!(
            "compact_strings",
            epoch,
            strings_before,
            live = self.live_strings
        );
        let _guard = span.enter();
        let mut snapshot = self.cluster.to_snapshot();
        let old = std::mem::take(&mut snapshot.strings);
        let mut renumber = Renumber {
            old: &old,
            new_id: vec![UNMAPPED; old.len()],
            strings: Vec::with_capacity(self.live_strings),
        };
        {
            let (nodes, gpus) = (&mut snapshot.nodes, &mut snapshot.gpus);
            for n in 0..nodes.name.len() {
                if nodes.gpu_count[n] > 0
                    && let Some(&model) = gpus.model.get(nodes.first_gpu[n] as usize)
                {
                    renumber.id(model)?; // numbered here; rewritten with all GPUs below
                }
                nodes.name[n] = renumber.id(nodes.name[n])?;
                nodes.pool[n] = renumber.id(nodes.pool[n])?;
                nodes.fabric[n] = renumber.id(nodes.fabric[n])?;
            }
            for model in gpus.model.iter_mut() {
                *model = renumber.id(*model)?;
            }
        }
        for model in snapshot.gpu_models.iter_mut() {
            *model = renumber.id(*model)?;
        }
        let jobs = &mut snapshot.jobs;
        for j in 0..jobs.name.len() {
            jobs.name[j] = renumber.id(jobs.name[j])?;
            jobs.tenant[j] = renumber.id(jobs.tenant[j])?;
            jobs.group[j] = renumber.id(jobs.group[j])?;
        }
        for tenant in snapshot.tenants.name.iter_mut() {
            *tenant = renumber.id(*tenant)?;
        }
        let strings = renumber.strings;
        snapshot.strings = strings.clone();
        let window = snapshot.metric_window_ms;
        let mut cluster =
            Cluster::from_snapshot(snapshot).map_err(|e| StateError::Event(e.to_string()))?;
        cluster.set_metric_window_ms(window);
        // What a snapshot leaves out: the latest metric samples.
        for e in self.metric_events() {
            cluster
                .apply_event(&e)
                .map_err(|e| StateError::Event(e.to_string()))?;
        }
        cluster.set_epoch(epoch, self.now_ms);

        // Recount references over the new numbering (as the incremental
        // counts would have it: GPU-model slots, per node name, pool and model
        // if it has GPUs, per job name and tenant).
        let mut refs = vec![0u32; strings.len()];
        let mut count = |id: u32| {
            if let Some(r) = refs.get_mut(id as usize) {
                *r += 1;
            }
        };
        cluster.gpu_models().iter().for_each(|&m| count(m));
        for node in cluster.nodes() {
            let n = node.index() as usize;
            count(cluster.node_columns().name[n]);
            count(cluster.node_columns().pool[n]);
            count(cluster.node_columns().fabric[n]);
            if let Some(gpu) = node.gpus().next() {
                count(cluster.gpu_columns().model[gpu.index() as usize]);
            }
        }
        let jobs = cluster.job_columns();
        jobs.name
            .iter()
            .chain(jobs.tenant.iter())
            .chain(jobs.group.iter())
            .chain(cluster.tenant_columns().name.iter())
            .for_each(|&s| count(s));

        self.interned = strings
            .into_iter()
            .enumerate()
            .map(|(id, s)| (s, id as u32))
            .collect();
        self.live_strings = refs.iter().filter(|&&r| r > 0).count();
        self.string_refs = refs;
        self.cluster = cluster;
        self.events.clear();
        self.strings_event = None;
        self.history.write().reset(epoch, self.now_ms);
        self.resync_epoch = epoch;
        self.compactions += 1;
        let strings_after = self.cluster.strings().len();
        tracing::info!(
            epoch,
            strings_before,
            strings_after,
            "string table compacted; mirrors resync"
        );
        Ok(Compaction {
            epoch,
            strings_before,
            strings_after,
        })
    }

    /// The latest metric samples as events, for a mirror built from a
    /// snapshot (which carries none).
    fn metric_events(&self) -> Vec<Event> {
        let c = &self.cluster;
        let gpus: Vec<model::GpuMetric> = (0..c.gpu_count() as u32)
            .map(|g| c.gpu(g))
            .filter(|g| {
                g.utilization_pct() > 0 || g.sm_activity_pct() > 0 || g.sm_occupancy_pct() > 0
            })
            .map(|g| model::GpuMetric {
                gpu: g.index(),
                utilization_pct: g.utilization_pct(),
                sm_activity_pct: g.sm_activity_pct(),
                memory_used_mib: 0, // not kept by the cluster; ignored by it
                sm_occupancy_pct: g.sm_occupancy_pct(),
            })
            .collect();
        let jobs: Vec<model::JobMetric> = c
            .jobs()
            .map(|j| j.metrics())
            .filter(|m| {
                *m != model::JobMetric {
                    job: m.job,
                    ..Default::default()
                }
            })
            .collect();
        let services: Vec<model::ServiceMetric> = c
            .jobs()
            .map(|j| j.service())
            .filter(|m| {
                *m != model::ServiceMetric {
                    job: m.job,
                    ..Default::default()
                }
            })
            .collect();
        let nodes: Vec<model::NodeMetric> = (0..c.node_count() as u32)
            .map(|n| model::NodeMetric {
                node: n,
                ..c.node_metrics(n)
            })
            .filter(|m| {
                *m != model::NodeMetric {
                    node: m.node,
                    ..Default::default()
                }
            })
            .collect();
        let mut events = Vec::new();
        if !gpus.is_empty() {
            events.push(Event::GpuMetrics(gpus));
        }
        if !jobs.is_empty() {
            events.push(Event::JobMetrics(jobs));
        }
        if !services.is_empty() {
            events.push(Event::ServiceMetrics(services));
        }
        if !nodes.is_empty() {
            events.push(Event::NodeMetrics(nodes));
        }
        events
    }
}
