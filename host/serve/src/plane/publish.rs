//! Publishing the plane's state on the [`Board`], the read side the API
//! answers reads from (see `crate::board` for what is published when).

use super::*;
use crate::board::{AdminSnapshot, Credentials, Derived};
use crate::link::JobSample;

/// How stale the published metrics text may get between ticks.
const METRICS_FRESHNESS: Duration = Duration::from_millis(200);

impl Plane {
    /// The board the API reads from.
    pub fn board(&self) -> Arc<Board> {
        Arc::clone(&self.board)
    }

    /// Job records changed since the last publish, then the job events
    /// those changes made. After every write through the API, every
    /// node-link message and each half of a tick.
    pub fn publish_jobs(&mut self) {
        let changes = self.jobs.take_changes();
        if !changes.is_empty() {
            let changes = changes
                .into_iter()
                .map(|c| {
                    c.map(|job| {
                        let progress = self.cell_progress(job.id);
                        (job, progress)
                    })
                })
                .collect();
            self.board.publish_jobs(changes);
        }
        for event in std::mem::take(&mut self.unsent_events) {
            let _ = self.events.send(event);
        }
    }

    /// Job records, credentials, the cluster view, the nodes, the metrics,
    /// the slots, tenants and experiments. After every administrative write.
    pub fn publish(&mut self) {
        self.publish_all_but_jobs_derived(true);
    }

    /// Everything, and what the reads derive from the cells (why jobs
    /// wait, their progress and samples). At the end of every tick (`end_tick`); the
    /// metrics text at most every `METRICS_FRESHNESS`.
    pub fn publish_tick(&mut self) {
        self.publish_all_but_jobs_derived(false);
        self.publish_jobs_derived();
    }

    /// All of it, every experiment's status included: before the API
    /// serves its first call.
    pub fn publish_all(&mut self) {
        self.publish_all_but_jobs_derived(true);
        self.publish_jobs_derived();
    }

    /// Why jobs wait, their progress and samples.
    fn publish_jobs_derived(&mut self) {
        self.board.publish_derived(self.derived());
        let progress = self
            .cells
            .iter()
            .flat_map(|cell| {
                cell.local.iter().filter_map(|(&id, &local)| {
                    let i = cell.state.job_index(local)?;
                    Some((id, cell.state.cluster().job(i).progress()))
                })
            })
            .collect();
        self.board.publish_progress(progress);
    }

    /// What [`Plane::publish`] publishes; `after_write`: the metrics text
    /// whatever its age, and every experiment's status (a tick refreshes
    /// only the running one's).
    fn publish_all_but_jobs_derived(&mut self, after_write: bool) {
        self.publish_jobs();
        self.board.publish_credentials(self.credentials());
        let metrics_due = after_write
            || self
                .metrics_published
                .is_none_or(|at| at.elapsed() >= METRICS_FRESHNESS);
        let metrics = if metrics_due {
            self.metrics_published = Some(std::time::Instant::now());
            Some(self.metrics_text())
        } else {
            None
        };
        self.board
            .publish_cluster(self.view(), self.list_nodes(), metrics);
        self.publish_admin(after_write);
    }

    /// Slots, tenants and experiments. Every experiment's status after an
    /// administrative write (`all`); at a tick only the running one's, and
    /// the final status of one that ended since the last publish.
    fn publish_admin(&mut self, all: bool) {
        let slots = self
            .registry
            .slots()
            .iter()
            .filter_map(|slot| {
                let name = slot.name();
                Some((name.to_string(), self.slot_view(name)?))
            })
            .collect();
        let mut claimed: HashMap<&str, u32> = HashMap::new();
        for j in self.released() {
            *claimed.entry(j.tenant.as_str()).or_default() += j.spec.gpus;
        }
        let tenants = self
            .tenants
            .keys()
            .map(|name| {
                let in_use = claimed.get(name.as_str()).copied().unwrap_or(0);
                (name.clone(), self.tenant_view(name, in_use))
            })
            .collect();
        let running = self.experiment.as_ref().map(|e| e.record.name.clone());
        let experiments = if all {
            self.list_experiments()
                .into_iter()
                .map(|s| (s.name.clone(), Arc::new(s)))
                .collect()
        } else {
            let mut experiments = self.board.experiments();
            for name in running.iter().chain(self.published_experiment.iter()) {
                if let Ok(status) = self.experiment_status(name) {
                    experiments.insert(name.clone(), Arc::new(status));
                }
            }
            experiments
        };
        self.published_experiment = running;
        self.board.publish_admin(AdminSnapshot {
            slots,
            tenants,
            experiments,
        });
    }

    fn credentials(&self) -> Credentials {
        Credentials {
            admin_sha: self.admin_token_sha.clone(),
            node_sha: self.node_token_sha.clone(),
            nodes: self.node_tokens.clone(),
            tenants: self
                .tenants
                .values()
                .map(|t| (t.name.clone(), t.token_sha256.clone()))
                .collect(),
        }
    }

    fn derived(&self) -> Derived {
        let mut cell_of = HashMap::new();
        for (index, cell) in self.cells.iter().enumerate() {
            cell_of.extend(cell.local.keys().map(|&id| (id, index)));
        }
        let samples = self
            .job_samples
            .keys()
            .filter_map(|&id| {
                let m = self.job_metric(id)?;
                Some((
                    id,
                    JobSample {
                        job_id: id,
                        iteration_ms: m.iteration_ms,
                        peak_memory_mib: m.peak_memory_mib,
                        min_memory_mib: m.min_memory_mib,
                        utilization_pct: u32::from(m.utilization_pct),
                        host_memory_mib: m.host_memory_mib,
                        memory_limit_mib: self.job_enforced(id, |r| r.memory_limit_mib),
                        compute_share_permille: self.job_enforced(id, |r| r.compute_share_permille),
                    },
                ))
            })
            .collect();
        Derived {
            capacity: self.cells.iter().map(|c| Capacity::of(&c.state)).collect(),
            cell_of,
            samples,
        }
    }
}
