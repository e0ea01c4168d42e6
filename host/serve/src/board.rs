//! The read side of the control plane: what authentication and every read
//! call answer from — `Jobs.Get`/`List`, `Cluster.View`/`Metrics`/
//! `ListTenants`, `Nodes.List`, `Policies.List`/`Describe`/`Stats`,
//! `Experiments.Status`/`List` — and `/metrics`.
//!
//! The plane publishes here and readers never take the plane's lock, so a
//! read never waits on a round, however long a scheduler or tenant policy
//! in it takes (up to its deadline, then its fallbacks). What is published
//! when:
//!
//! * **Job records**: every change (submit, release, start, end, cancel,
//!   retention) is on the board before the call that made it returns, so a
//!   client reads its own writes.
//! * **Credentials**: at start-up and after every administrative write
//!   (tenants and tokens change only through those).
//! * **What the reads derive** (why a job waits, its progress and samples,
//!   the cluster view, the nodes, the metrics text, the policy slots and
//!   their statistics, the tenants, the experiments): at the end of every
//!   tick, and all but the per-job parts after every administrative write
//!   too. They are at most one tick old (the metrics text 200 ms).
//!
//! Invariant: the board holds nothing the plane could not rebuild; it is a
//! projection of the plane's state, written only by the plane
//! (`Plane::publish*`), read by the API layer.

use crate::link::JobSample;
use crate::plane::{ApiError, Caller, DEFAULT_PAGE, MAX_PAGE, check_slot_access};
use crate::records::{JobStatus, StoredJob};
use crate::views::{ClusterView, ExperimentView, JobView, NodeView, SlotView, TenantView};
use crate::waiting::{self, Capacity};
use arbiter_policy_sdk::model;
use arc_swap::ArcSwap;
use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The published read model (see the module docs).
#[derive(Default)]
pub struct Board {
    credentials: ArcSwap<Credentials>,
    jobs: RwLock<JobBoard>,
    derived: ArcSwap<Derived>,
    cluster: ArcSwap<ClusterSnapshot>,
    admin: ArcSwap<AdminSnapshot>,
}

/// Policy slots, tenants and experiments as of the last publish.
#[derive(Debug, Default)]
pub struct AdminSnapshot {
    /// Each slot's generations and statistics, by slot name.
    pub slots: BTreeMap<String, SlotView>,
    pub tenants: BTreeMap<String, TenantView>,
    /// Every experiment's status, by name (shared with the next publish,
    /// which replaces only the running one's).
    pub experiments: BTreeMap<String, Arc<ExperimentView>>,
}

/// Who may call: digests of every token the plane accepts.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub admin_sha: String,
    pub node_sha: String,
    /// Tokens bound to one node each: node name → token digest.
    pub nodes: BTreeMap<String, String>,
    /// Tenant name → token digest.
    pub tenants: BTreeMap<String, String>,
}

impl Credentials {
    /// Maps a bearer token to a caller.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Caller, ApiError> {
        let token = token.ok_or_else(|| {
            ApiError::Unauthenticated("missing `authorization: Bearer <token>` metadata".into())
        })?;
        let sha = hex::encode(Sha256::digest(token.as_bytes()));
        if constant_time_eq(&sha, &self.admin_sha) {
            return Ok(Caller::Admin);
        }
        if constant_time_eq(&sha, &self.node_sha) {
            return Ok(Caller::Node(None));
        }
        if let Some((name, _)) = self.nodes.iter().find(|(_, s)| constant_time_eq(s, &sha)) {
            return Ok(Caller::Node(Some(name.clone())));
        }
        self.tenants
            .iter()
            .find(|(_, s)| constant_time_eq(s, &sha))
            .map(|(name, _)| Caller::Tenant(name.clone()))
            .ok_or_else(|| ApiError::Unauthenticated("unknown token".into()))
    }
}

/// Compares token digests without a timing side channel (the digests are
/// of equal, public length; `subtle` keeps the compiler from short-circuiting).
fn constant_time_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Every job's record as of its last change, and how many are in each state.
#[derive(Default)]
struct JobBoard {
    records: BTreeMap<u64, BoardJob>,
    counts: HashMap<JobStatus, u64>,
}

/// A job's record and its progress in its cell (`None` outside cells), as
/// of the record's last change or the last tick, whichever came later.
#[derive(Clone)]
struct BoardJob {
    record: Arc<StoredJob>,
    progress: Option<model::JobProgress>,
}

impl JobBoard {
    fn count(&self, status: JobStatus) -> u64 {
        self.counts.get(&status).copied().unwrap_or(0)
    }

    fn put(&mut self, job: BoardJob) {
        *self.counts.entry(job.record.status).or_default() += 1;
        if let Some(old) = self.records.insert(job.record.id, job) {
            self.uncount(old.record.status);
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(old) = self.records.remove(&id) {
            self.uncount(old.record.status);
        }
    }

    fn uncount(&mut self, status: JobStatus) {
        if let Some(n) = self.counts.get_mut(&status) {
            *n = n.saturating_sub(1);
        }
    }
}

/// What the reads derive from the cells and the node reports, as of the
/// end of the last tick.
#[derive(Debug, Default)]
pub struct Derived {
    /// Each cell's idle capacity, and the cell each released job is in.
    pub capacity: Vec<Capacity>,
    pub cell_of: HashMap<u64, usize>,
    /// Samples of every running job its nodes reported on.
    pub samples: HashMap<u64, JobSample>,
}

/// The cluster-wide reads, as of the last tick or administrative write.
#[derive(Debug, Default)]
pub struct ClusterSnapshot {
    /// The view without its job counts (those come from the job records).
    pub view: ClusterView,
    pub nodes: Vec<NodeView>,
    pub metrics: Arc<str>,
}

impl Board {
    /// Maps a bearer token to a caller.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Caller, ApiError> {
        self.credentials.load().authenticate(token)
    }

    pub fn get_job(&self, caller: &Caller, id: u64) -> Result<JobView, ApiError> {
        let job = self.jobs.read().records.get(&id).cloned();
        match job {
            Some(j) if caller.may_see(&j.record.tenant) => {
                Ok(job_view(j, &self.derived.load(), &self.admin.load()))
            }
            // A tenant learns nothing about other tenants' job ids.
            _ => Err(ApiError::NotFound(format!("no job {id}"))),
        }
    }

    /// A page of jobs, newest first, and the token of the next page ("" if
    /// none): a response stays bounded however many jobs the plane holds.
    pub fn list_jobs(
        &self,
        caller: &Caller,
        req: &JobQuery,
    ) -> Result<(Vec<JobView>, String), ApiError> {
        let states = &req.states;
        let before = if req.page_token.is_empty() {
            u64::MAX
        } else {
            req.page_token.parse::<u64>().map_err(|_| {
                ApiError::InvalidArgument(format!(
                    "page_token `{}` is not one this server gave",
                    req.page_token
                ))
            })?
        };
        let page = match req.limit {
            0 => DEFAULT_PAGE,
            n => (n as usize).min(MAX_PAGE),
        };
        // The records are copied out (reference counts) under the lock and
        // turned into messages after it is released.
        let (picked, more) = {
            let board = self.jobs.read();
            let mut matching = board
                .records
                .range(..before)
                .rev()
                .map(|(_, j)| j)
                .filter(|j| caller.may_see(&j.record.tenant))
                .filter(|j| req.tenant.is_empty() || j.record.tenant == req.tenant)
                .filter(|j| states.is_empty() || states.contains(&j.record.status));
            let picked: Vec<BoardJob> = matching.by_ref().take(page).cloned().collect();
            (picked, matching.next().is_some())
        };
        let derived = self.derived.load();
        let admin = self.admin.load();
        let jobs: Vec<JobView> = picked
            .into_iter()
            .map(|j| job_view(j, &derived, &admin))
            .collect();
        let next = match (more, jobs.last()) {
            (true, Some(last)) => last.record.id.to_string(),
            _ => String::new(),
        };
        Ok((jobs, next))
    }

    /// The cluster view: job counts as of now, the rest as of its snapshot.
    pub fn view(&self) -> ClusterView {
        let mut view = self.cluster.load().view.clone();
        let board = self.jobs.read();
        view.jobs_queued = board.count(JobStatus::Queued);
        view.jobs_pending = board.count(JobStatus::Pending);
        view.jobs_running = board.count(JobStatus::Running);
        view.jobs_finished = board.count(JobStatus::Succeeded)
            + board.count(JobStatus::Failed)
            + board.count(JobStatus::Cancelled);
        view
    }

    pub fn list_nodes(&self) -> Vec<NodeView> {
        self.cluster.load().nodes.clone()
    }

    /// The metrics exposition (OpenMetrics text).
    pub fn metrics_text(&self) -> String {
        self.cluster.load().metrics.to_string()
    }

    /// The slots the caller may see.
    pub fn list_policies(&self, caller: &Caller) -> Vec<SlotView> {
        self.admin
            .load()
            .slots
            .iter()
            .filter(|(name, _)| check_slot_access(caller, name).is_ok())
            .map(|(_, slot)| slot.clone())
            .collect()
    }

    pub fn slot(&self, caller: &Caller, slot: &str) -> Result<SlotView, ApiError> {
        check_slot_access(caller, slot)?;
        self.admin
            .load()
            .slots
            .get(slot)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("no policy slot `{slot}`")))
    }

    pub fn list_tenants(&self, caller: &Caller) -> Vec<TenantView> {
        self.admin
            .load()
            .tenants
            .values()
            .filter(|t| caller.may_see(&t.name))
            .cloned()
            .collect()
    }

    pub fn experiment(&self, name: &str) -> Result<Arc<ExperimentView>, ApiError> {
        self.admin
            .load()
            .experiments
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("no experiment `{name}`")))
    }

    pub fn list_experiments(&self) -> Vec<Arc<ExperimentView>> {
        self.admin.load().experiments.values().cloned().collect()
    }

    /// The experiments as last published (the base of the next publish).
    pub(crate) fn experiments(&self) -> BTreeMap<String, Arc<ExperimentView>> {
        self.admin.load().experiments.clone()
    }

    pub(crate) fn publish_admin(&self, snapshot: AdminSnapshot) {
        self.admin.store(Arc::new(snapshot));
    }

    pub(crate) fn publish_credentials(&self, credentials: Credentials) {
        self.credentials.store(Arc::new(credentials));
    }

    /// Job records: `Ok` a changed record with its progress, `Err(id)` one dropped.
    pub(crate) fn publish_jobs(&self, changed: Vec<JobChange>) {
        let mut board = self.jobs.write();
        for change in changed {
            match change {
                Ok((record, progress)) => board.put(BoardJob { record, progress }),
                Err(id) => board.remove(id),
            }
        }
    }

    /// The progress of every job in a cell, as of this tick.
    pub(crate) fn publish_progress(&self, progress: Vec<(u64, model::JobProgress)>) {
        let mut board = self.jobs.write();
        for (id, p) in progress {
            if let Some(job) = board.records.get_mut(&id) {
                job.progress = Some(p);
            }
        }
    }

    pub(crate) fn publish_derived(&self, derived: Derived) {
        self.derived.store(Arc::new(derived));
    }

    /// The view and nodes; the metrics text too when given (else the last one stays).
    pub(crate) fn publish_cluster(
        &self,
        view: ClusterView,
        nodes: Vec<NodeView>,
        metrics: Option<String>,
    ) {
        let metrics = match metrics {
            Some(text) => Arc::from(text),
            None => Arc::clone(&self.cluster.load().metrics),
        };
        self.cluster.store(Arc::new(ClusterSnapshot {
            view,
            nodes,
            metrics,
        }));
    }
}

/// A changed job record and its progress in its cell, or the id of one dropped.
pub(crate) type JobChange = Result<(Arc<StoredJob>, Option<model::JobProgress>), u64>;

/// A job as reads show it: its record, why it waits, its progress and samples.
fn job_view(job: BoardJob, derived: &Derived, admin: &AdminSnapshot) -> JobView {
    let live = !job.record.status.is_terminal();
    JobView {
        waiting_reason: waiting_reason(&job.record, derived, admin),
        progress: job.progress.filter(|_| live),
        sample: derived
            .samples
            .get(&job.record.id)
            .copied()
            .filter(|_| live),
        record: job.record,
    }
}

/// Which jobs a `List` call asks for: a tenant's ("" for all the caller may
/// see), in some states (none: all), a page of them, newest first.
#[derive(Clone, Debug, Default)]
pub struct JobQuery {
    pub tenant: String,
    pub states: HashSet<JobStatus>,
    /// The `next` a previous page returned ("" for the first page).
    pub page_token: String,
    /// 0: [`DEFAULT_PAGE`]; at most [`MAX_PAGE`].
    pub limit: u32,
}

/// Why a queued or pending job has not started ("" for any other).
fn waiting_reason(job: &StoredJob, derived: &Derived, admin: &AdminSnapshot) -> String {
    match job.status {
        // The tenant's quota and the GPUs its released jobs hold, as the
        // tenant list shows them (a tenant without a record has no quota).
        JobStatus::Queued => {
            let tenant = admin.tenants.get(&job.tenant);
            waiting::queued_reason(
                &job.spec,
                &job.tenant,
                tenant.map_or(0, |t| t.quota_gpus),
                tenant.map_or(0, |t| t.gpus_in_use),
            )
        }
        JobStatus::Pending => match derived
            .cell_of
            .get(&job.id)
            .and_then(|&cell| derived.capacity.get(cell))
        {
            Some(capacity) => waiting::pending_reason(&job.spec, capacity),
            None => "waiting to be handed to a scheduler".into(),
        },
        _ => String::new(),
    }
}
