//! A mirror from a snapshot and back: every table checked for length and every index
//! for range before it is used, so a damaged snapshot is an error, not a panic.

use super::*;

impl Cluster {
    /// Builds the mirror from a full snapshot, checking its consistency.
    pub fn from_snapshot(s: Snapshot) -> Result<Self, MirrorError> {
        let n = s.nodes.name.len();
        let nc = &s.nodes;
        check_len(
            "nodes",
            n,
            &[
                nc.pool.len(),
                nc.state.len(),
                nc.cpu_milli.len(),
                nc.memory_mib.len(),
                nc.cpu_used_milli.len(),
                nc.memory_used_mib.len(),
                nc.first_gpu.len(),
                nc.gpu_count.len(),
                nc.on_loan.len(),
                nc.fabric.len(),
            ],
        )?;
        let g = s.gpus.node.len();
        let gc = &s.gpus;
        check_len(
            "gpus",
            g,
            &[
                gc.model.len(),
                gc.memory_mib.len(),
                gc.milli_used.len(),
                gc.memory_used_mib.len(),
                gc.shared_milli.len(),
                gc.shared_memory_mib.len(),
                gc.shared_workers.len(),
                gc.health.len(),
            ],
        )?;
        let j = s.jobs.rows().ok_or(MirrorError::Ragged("jobs"))?;
        check_len(
            "tenants",
            s.tenants.name.len(),
            &[s.tenants.gpu_quota_milli.len()],
        )?;
        check_len("gpu models", s.gpu_models.len(), &[s.gpu_model_speed.len()])?;
        let pc = &s.placements;
        check_len(
            "placements",
            pc.job.len(),
            &[pc.node.len(), pc.gpu_start.len(), pc.gpu_len.len()],
        )?;
        for node in 0..n {
            let first = nc.first_gpu[node] as usize;
            let end = first + nc.gpu_count[node] as usize;
            if end > g {
                return Err(MirrorError::OutOfRange {
                    what: "node gpu range",
                    index: end as u64,
                    len: g as u64,
                });
            }
            if gc.node[first..end]
                .iter()
                .any(|&owner| owner as usize != node)
            {
                return Err(MirrorError::Inconsistent(format!(
                    "GPUs of node {node} are not contiguous"
                )));
            }
        }
        let mut job_workers = vec![Vec::new(); j];
        for w in 0..pc.job.len() {
            let job = in_range("placement job", pc.job[w], j)?;
            let node = in_range("placement node", pc.node[w], n)?;
            let start = pc.gpu_start[w] as usize;
            let end = start + pc.gpu_len[w] as usize;
            if end > pc.gpus.len() {
                return Err(MirrorError::OutOfRange {
                    what: "placement gpus",
                    index: end as u64,
                    len: pc.gpus.len() as u64,
                });
            }
            let gpus = pc.gpus[start..end].to_vec();
            for &gpu in &gpus {
                in_range("placement gpu", gpu, g)?;
            }
            job_workers[job].push(WorkerPlacement {
                node: node as u32,
                gpus,
            });
        }
        let mut node_jobs: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (job, workers) in job_workers.iter().enumerate() {
            for w in workers {
                let on_node = &mut node_jobs[w.node as usize];
                if !on_node.contains(&(job as u32)) {
                    on_node.push(job as u32);
                }
            }
        }
        let mut job_reserved = vec![Vec::new(); j];
        let mut node_reserved_by = vec![0; n];
        let mut job_reserved_gpus = vec![Vec::new(); j];
        let mut gpu_reserved_by = vec![0; g];
        for r in &s.reservations {
            let job = in_range("reservation job", r.job, j)?;
            for &node in &r.nodes {
                node_reserved_by[in_range("reserved node", node, n)?] = job as u32 + 1;
            }
            for &gpu in &r.gpus {
                gpu_reserved_by[in_range("reserved gpu", gpu, g)?] = job as u32 + 1;
            }
            job_reserved[job] = r.nodes.clone();
            job_reserved_gpus[job] = r.gpus.clone();
        }
        let tenant_row = s
            .tenants
            .name
            .iter()
            .enumerate()
            .map(|(row, &name)| (name, row))
            .collect();
        let mut cluster = Cluster {
            epoch: s.epoch,
            now_ms: s.now_ms,
            strings: s.strings,
            gpu_models: s.gpu_models,
            gpu_model_speed: s.gpu_model_speed,
            sharing: s.sharing,
            tenants: s.tenants,
            tenant_row,
            metric_window_ms: s.metric_window_ms,
            nodes: s.nodes,
            gpus: s.gpus,
            gpu_model_slot: Vec::new(),
            gpu_utilization: vec![0; g],
            gpu_sm_activity: vec![0; g],
            gpu_sm_occupancy: vec![0; g],
            gpu_reserved_by,
            node_metrics: vec![NodeMetric::default(); n],
            jobs: s.jobs,
            job_metrics: vec![JobMetric::default(); j],
            job_service: vec![ServiceMetric::default(); j],
            job_reserved_gpus,
            job_workers,
            node_jobs,
            job_reserved,
            node_reserved_by,
            node_room: vec![NodeRoom::default(); n],
            node_version: (0..n).map(|_| fresh_version()).collect(),
        };
        cluster.gpu_model_slot = cluster
            .gpus
            .model
            .iter()
            .map(|&m| cluster.slot_of_model(m))
            .collect();
        for node in 0..n {
            let room = cluster.room_of(node);
            cluster.node_room[node] = room;
        }
        Ok(cluster)
    }

    /// The full snapshot of this state (what the host sends on resync).
    pub fn to_snapshot(&self) -> Snapshot {
        let mut placements = PlacementColumns::default();
        for (job, workers) in self.job_workers.iter().enumerate() {
            for w in workers {
                placements.job.push(job as u32);
                placements.node.push(w.node);
                placements.gpu_start.push(placements.gpus.len() as u32);
                placements.gpu_len.push(w.gpus.len() as u8);
                placements.gpus.extend_from_slice(&w.gpus);
            }
        }
        let reservations = (0..self.job_count())
            .filter(|&j| !self.job_reserved[j].is_empty() || !self.job_reserved_gpus[j].is_empty())
            .map(|j| Reservation {
                job: j as u32,
                nodes: self.job_reserved[j].clone(),
                gpus: self.job_reserved_gpus[j].clone(),
            })
            .collect();
        Snapshot {
            epoch: self.epoch,
            now_ms: self.now_ms,
            strings: self.strings.clone(),
            gpu_models: self.gpu_models.clone(),
            gpu_model_speed: self.gpu_model_speed.clone(),
            sharing: self.sharing,
            tenants: self.tenants.clone(),
            metric_window_ms: self.metric_window_ms,
            nodes: self.nodes.clone(),
            gpus: self.gpus.clone(),
            jobs: self.jobs.clone(),
            placements,
            reservations,
        }
    }

    pub(super) fn slot_of_model(&self, model: u32) -> u8 {
        self.gpu_models
            .iter()
            .position(|&m| m == model)
            .filter(|&slot| slot < 64)
            .map_or(NO_MODEL_SLOT, |slot| slot as u8)
    }
}
