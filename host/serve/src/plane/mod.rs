//! The control plane: jobs, tenants, policy slots, experiments and the cells
//! that run rounds, over the host core.
//!
//! A *cell* is one host core (`ClusterState` + `RoundDriver`) over a share of
//! the nodes. Outside a split experiment there is one cell, `control`, whose
//! scheduler is the `default` slot. A split experiment rebuilds the cells
//! from the plane's own job table: the candidate arm gets its share of the
//! nodes and the jobs routed to it (by tenant or by randomised, balanced assignment);
//! running jobs stay where they run. The same rebuild restores the cells
//! after a restart, so recovery is not a separate code path.
//!
//! Jobs first wait in their tenant's admission queue. Each round the
//! tenant's `tenant`-role policy (slot `tenant:<name>`), if it has one,
//! orders and holds them; released jobs go to their cell's scheduler.
//!
//! The plane is synchronous: the gRPC layer's writes and the round loop
//! share it behind one mutex, and nothing slow (compiling a component,
//! waiting for the disk, a tenant's policy) happens while it is held but a
//! scheduler round (bounded by its deadline). Reads never take it: the
//! plane publishes what they answer on the [`Board`] (`publish`).
//!
//! One `Plane`, its methods split by concern, one file each: `restore`
//! (opening the data directory), `auth`, `tenants`, `jobs` (the job table,
//! retention), `admission`, `policies`, `experiments` (enrollment, arm
//! statistics, guardrails), `cells` (rebuilds, journal checkpoints), `round`
//! (the tick, reconcile, matching), `nodes`, `agents` (the node link),
//! `telemetry` (the view, the metrics) and `publish` (onto the board);
//! `table` is the job table. The types and helpers they share
//! stay here.

use crate::board::Board;
use crate::clock::{Clock, SystemClock};
use crate::journal::{JournalLimits, JournalWriter, Record, RoundRecord};
use crate::launch;
use crate::link::{AgentHello, ToAgent};
use crate::metrics::{Exposition, GaugeValue, Histogram, PolicyMetrics, generation_label};
use crate::records::*;
use crate::shadow::{Shadow, ShadowInput};
use crate::stats::{
    AlwaysValidP, ArmStats, Assigner, Comparison, Estimate, JobStats, RoundStats, SRM_ALERT_P,
    assign, fragmentation_pct, look, pending_demand,
};
use crate::store::{Ack, Contents, Store, StoreWriter, Write};
use crate::views;
use crate::waiting::{Capacity, Fleet};
use anyhow::Context;
use arbiter_host::registry::{Generation, PolicySlot, Registry};
use arbiter_host::roles::matcher::MatcherDriver;
use arbiter_host::roles::reclaim::ReclaimDriver;
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::roles::tenant::{self, AdmissionRequest};
use arbiter_host::runtime::{CompiledPolicy, MemoryAccount, PolicyEngine, RuntimeConfig};
use arbiter_host::state::{Applied, ClusterState, JobId, JobRequest, JobTraits, NodeRequest};
use arbiter_policy_sdk::model::{
    self, Decision, Role, RoundInfo, TenantJob, TenantView, WorkerPlacement,
};
use arbiter_policy_sdk::plan::Plan;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

mod admission;
mod agents;
mod auth;
pub(crate) use auth::check_slot_access;
mod cells;
mod experiments;
mod jobs;
mod nodes;
mod policies;
mod publish;
mod restore;
mod round;
mod table;
mod telemetry;
mod tenants;

/// The scheduler slot outside experiments (and the control arm in them).
pub const DEFAULT_SLOT: &str = "default";
/// The slot whose active generation answers the `matcher` role (MuxFlow's pairing of offline
/// with online work); empty: nothing is paired, offline work runs where the scheduler put it.
pub const MATCHER_SLOT: &str = "matcher";
/// The slot whose active generation answers every cell's reclaims (`arbiter nodes reclaim`),
/// so an operator can keep one scheduler and take Aryl's reclaim plan (or their own); empty:
/// each cell's scheduling slot answers through its `reclaim` role, else the host's
/// Smallest-Count-First plan.
pub const RECLAIM_SLOT: &str = "reclaim";
/// Slots that serve one role for every cell, never a cell's scheduling, and what they do:
/// each takes only a policy with its role (a pure one, uploaded with no slot, goes there),
/// and none is an experiment's candidate, even when its policy also declares `scheduler`
/// (e.g. `aryl` in `reclaim`).
pub const ROLE_SLOTS: [(&str, Role, &str); 2] = [
    (
        MATCHER_SLOT,
        Role::Matcher,
        "pairs offline with online work",
    ),
    (
        RECLAIM_SLOT,
        Role::Reclaim,
        "chooses the nodes a reclaim takes back",
    ),
];
pub const CONTROL: &str = "control";
pub const CANDIDATE: &str = "candidate";
/// Largest component accepted by upload.
pub const MAX_UPLOAD: usize = 16 << 20;

/// One node's last report on one of the jobs it runs.
#[derive(Clone, Copy, Debug)]
struct NodeJobReport {
    metric: model::JobMetric,
    /// What that node enforces on the job (0: not reported).
    memory_limit_mib: u32,
    compute_share_permille: u32,
}

/// How the plane runs.
#[derive(Clone, Debug)]
pub struct PlaneConfig {
    pub round_interval: Duration,
    /// The simulated node pool.
    pub nodes: Vec<NodeRequest>,
    /// Built-in policy the `default` slot starts with.
    pub default_policy: String,
    /// Run time of a job that states none, on the simulated pool.
    pub default_duration: Duration,
    pub max_decisions: u32,
    pub runtime: RuntimeConfig,
    /// How often node agents send heartbeats.
    pub heartbeat: Duration,
    /// How often the `matcher` slot is asked to pair offline with online jobs (`None`: never).
    pub match_interval: Option<Duration>,
    /// A node agent silent this long is lost; its jobs are rescheduled.
    pub lost_after: Duration,
    /// Write the decision journal (on by default; off only to measure its cost).
    pub journal: bool,
    /// GPU speeds per model, in permille of the reference model, that
    /// policies see (contract 0.2 `gpu-model-speed`); others run at 1000.
    pub gpu_speeds: Vec<(String, u32)>,
    /// The operator's rules for sharing GPUs by QoS (contract 0.3
    /// `sharing-rules`; the default is sharing off, as in 0.2).
    pub sharing: model::SharingRules,
    /// Memory (linear memories and tables) that all of one tenant's policy
    /// instances may hold together: every generation its slot keeps, and the
    /// probe an upload configures. Each instance also stays within
    /// `runtime.max_memory_bytes`.
    pub tenant_memory_bytes: usize,
    /// Compiled code all the generations of one tenant's slot may hold
    /// together (each distinct component counted once).
    pub tenant_code_bytes: usize,
    /// Ended jobs kept (the newest-ended); older ones are dropped from the
    /// job table and the store. Jobs of a running experiment are kept
    /// until it ends (its statistics are rebuilt from them).
    pub keep_finished: usize,
    /// Ended jobs are dropped this long after they ended.
    pub keep_finished_for: Duration,
    /// Decision-journal segment size and total cap (see [`crate::journal`]).
    pub journal_limits: JournalLimits,
    /// What the plane reads the time from (wall time unless a test drives it).
    pub clock: Arc<dyn Clock>,
}

impl Default for PlaneConfig {
    fn default() -> Self {
        PlaneConfig {
            round_interval: Duration::from_millis(100),
            nodes: default_pool(4, 8),
            default_policy: "best-fit".into(),
            default_duration: Duration::from_secs(60),
            max_decisions: 10_000,
            runtime: RuntimeConfig::default(),
            heartbeat: Duration::from_millis(500),
            match_interval: Some(Duration::from_secs(10)),
            lost_after: Duration::from_secs(3),
            journal: true,
            gpu_speeds: Vec::new(),
            sharing: model::SharingRules::default(),
            tenant_memory_bytes: DEFAULT_TENANT_MEMORY_BYTES,
            tenant_code_bytes: DEFAULT_TENANT_CODE_BYTES,
            keep_finished: 10_000,
            keep_finished_for: Duration::from_secs(7 * 24 * 3600),
            journal_limits: JournalLimits::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Two instances at the default per-instance cap: a tenant can run one
/// policy at full size and probe its next upload, not fill the plane.
pub const DEFAULT_TENANT_MEMORY_BYTES: usize = 128 << 20;

/// About ten times the largest built-in policy's compiled code: room for a
/// slot's generations of real policies, not for a tenant to fill the plane
/// with code.
pub const DEFAULT_TENANT_CODE_BYTES: usize = 64 << 20;

/// `count` simulated nodes of `gpus` A100-80GB each.
pub fn default_pool(count: u32, gpus: u32) -> Vec<NodeRequest> {
    (0..count)
        .map(|i| NodeRequest {
            name: format!("sim-{i:02}"),
            pool: "sim".into(),
            cpu_milli: 16_000u32.saturating_mul(gpus),
            memory_mib: 131_072u32.saturating_mul(gpus),
            gpu_model: "A100-80GB".into(),
            gpu_memory_mib: 81_920,
            gpu_count: gpus,
            on_loan: false,
        })
        .collect()
}

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Tenant(String),
    /// A node agent with a node token: it may hold a `NodeLink` session
    /// and nothing else, so a compromised node cannot load policies, submit
    /// or cancel jobs, or read other tenants' work. With the shared node
    /// token (`None`) it may register under any name; with a token issued
    /// for one node (`token rotate node:<name>`), under that name only.
    Node(Option<String>),
}

impl Caller {
    pub(crate) fn may_see(&self, tenant: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Tenant(t) => t == tenant,
            Caller::Node(_) => false,
        }
    }
}

/// An API-level failure; the gRPC layer maps it to a status code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Internal(String),
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(e.to_string())
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Store key prefix of an ended experiment's final report (arm metrics,
/// shadow summary; JSON of [`views::ExperimentView`]), kept apart from its
/// record (`exp/`).
const FINISHED_REPORT_PREFIX: &str = "expreport/";
/// Where stores written before the reports were JSON kept them (protobuf):
/// read once at start-up and rewritten under [`FINISHED_REPORT_PREFIX`].
const LEGACY_FINISHED_STATUS_PREFIX: &str = "expstatus/";

fn node_token_refused() -> ApiError {
    ApiError::PermissionDenied(
        "the node token only opens node sessions (NodeLink); this needs the admin token".into(),
    )
}

fn new_token() -> String {
    let bytes: [u8; 24] = rand::random();
    hex::encode(bytes)
}

/// Node states of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Ready,
    Draining,
    Lost,
    /// Taken back from a loan by its owning pool: cordoned for training
    /// until lent again.
    Reclaimed,
}

impl NodeStatus {
    /// The state's name in listings and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            NodeStatus::Ready => "ready",
            NodeStatus::Draining => "draining",
            NodeStatus::Lost => "lost",
            NodeStatus::Reclaimed => "reclaimed",
        }
    }
}

/// How a node's work is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// Part of the embedded pool: jobs run for their stated duration.
    Simulated,
    /// An `arbiter node` agent: jobs run as real processes and end when they exit.
    Agent,
}

impl NodeKind {
    /// The kind's name in listings.
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Simulated => "simulated",
            NodeKind::Agent => "agent",
        }
    }
}

/// The host's end of a node agent's stream.
pub struct AgentLink {
    /// The agent's instance id from its hello ("" from an agent that sends none).
    instance: String,
    pub session: u64,
    pub tx: tokio::sync::mpsc::UnboundedSender<ToAgent>,
    /// When the agent was last heard from (the plane's clock, ms).
    pub last_seen_ms: u64,
}

struct PoolNode {
    request: NodeRequest,
    status: NodeStatus,
    kind: NodeKind,
    link: Option<AgentLink>,
    /// When an agent node was last heard from (or restored at start-up),
    /// on the plane's clock (ms).
    last_seen_ms: u64,
}

/// An agent node as persisted, so its running jobs survive a host restart.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct AgentRecord {
    name: String,
    pool: String,
    cpu_milli: u32,
    memory_mib: u32,
    gpu_model: String,
    gpu_memory_mib: u32,
    gpu_count: u32,
}

struct Cell {
    arm: String,
    slot: Arc<PolicySlot>,
    driver: RoundDriver,
    state: ClusterState,
    local: HashMap<u64, JobId>,
    global: HashMap<JobId, u64>,
    /// Epoch of the cell's last journal record.
    last_epoch: u64,
    /// Epoch of the cell's last round (or rebuild). A round's delta is taken
    /// since then: work between rounds (a reclaim plan) may seal epochs of its own.
    round_epoch: u64,
    /// The generation that served the cell's last journaled round (`None`
    /// after a rebuild): a round served by another one journals that
    /// generation's configuration, so a replay runs it as it ran.
    journaled_generation: Option<Option<u64>>,
}

/// What a cell applied, in the plane's job ids: where started, resized and
/// migrated jobs run now, who was preempted, whose QoS changed.
struct Changes {
    started: Vec<(u64, Vec<WorkerAt>)>,
    preempted: Vec<u64>,
    moved: Vec<(u64, Vec<WorkerAt>)>,
    qos_changed: Vec<(u64, u8)>,
}

impl Changes {
    fn read(cell: &Cell, applied: &Applied) -> Changes {
        let placed_now = |local: &JobId| {
            let placement = cell
                .state
                .job_index(*local)
                .map(|i| workers_at(&cell.state, cell.state.cluster().job(i).placement()))
                .unwrap_or_default();
            cell.global.get(local).map(|&id| (id, placement))
        };
        Changes {
            started: applied.started.iter().filter_map(placed_now).collect(),
            moved: applied.moved().filter_map(|l| placed_now(&l)).collect(),
            preempted: applied
                .preempted
                .iter()
                .filter_map(|l| cell.global.get(l).copied())
                .collect(),
            qos_changed: applied
                .qos_changed
                .iter()
                .filter_map(|l| {
                    let id = *cell.global.get(l)?;
                    let i = cell.state.job_index(*l)?;
                    Some((id, cell.state.cluster().job(i).qos()))
                })
                .collect(),
        }
    }
}

struct Experiment {
    record: ExperimentRecord,
    stats: BTreeMap<String, ArmStats>,
    shadow: Option<Shadow>,
    candidate_generation: u64,
    /// The `default` slot's generation when the experiment started: what
    /// the control arm ran (a promotion changes the slot, not the history).
    control_generation: u64,
    /// The randomised split's coin (`None`: shadow, or split by tenant).
    assigner: Option<Assigner>,
    /// The guardrail's evidence so far; persisted with the round stats.
    evidence: AlwaysValidP,
    /// The guardrail's last look at the guarded metric.
    comparison: Option<Comparison>,
    /// Round stats (or evidence) changed since they were last persisted.
    rounds_dirty: bool,
}

/// What an experiment persists besides its jobs: the per-round stats and
/// the guardrail's evidence (the job stats are rebuilt from the jobs).
#[derive(serde::Serialize, serde::Deserialize)]
struct ExperimentRounds {
    arms: BTreeMap<String, RoundStats>,
    evidence: AlwaysValidP,
}

const EXPERIMENT_ROUNDS_PREFIX: &str = "exp-rounds/";

/// The control plane.
pub struct Plane {
    cfg: PlaneConfig,
    data: PathBuf,
    registry: Arc<Registry>,
    writer: StoreWriter,
    journal: Option<JournalWriter>,
    jobs: table::JobTable,
    /// The read side: what the API answers reads from, published by the plane.
    board: Arc<Board>,
    /// Ids by status, so a round touches live jobs only, never the history.
    by_status: HashMap<JobStatus, BTreeSet<u64>>,
    next_id: u64,
    tenants: BTreeMap<String, TenantRecord>,
    admin_token_sha: String,
    node_token_sha: String,
    /// Tokens bound to one node each: node name → token hash.
    node_tokens: BTreeMap<String, String>,
    /// The pool's node shapes, for refusing jobs no node could hold
    /// (rebuilt when a node joins or changes, not on every submit).
    fleet: Fleet,
    nodes: Vec<PoolNode>,
    cells: Vec<Cell>,
    experiment: Option<Experiment>,
    experiments: BTreeMap<String, ExperimentRecord>,
    /// Final arm metrics of experiments that ended in this process.
    finished_status: BTreeMap<String, views::ExperimentView>,
    events: broadcast::Sender<JobEvent>,
    /// Job events not yet sent: they wait for their changes to be published.
    unsent_events: Vec<JobEvent>,
    metrics: PolicyMetrics,
    /// Stats of the single control cell outside experiments.
    tenant_faults: u64,
    /// When retention last looked at the ended jobs' ages.
    last_retention_ms: u64,
    /// The experiment that was running at the last publish (its final
    /// status is published when it ends, by a guardrail in a tick too).
    published_experiment: Option<String>,
    /// When the metrics text was last published (rendering it every tick
    /// of a fast round loop would cost more than the scrapes it serves).
    metrics_published: Option<std::time::Instant>,
    /// Ended jobs left after the last retention pass.
    retention_floor: u64,
    /// What each tenant's policy instances hold, against
    /// `cfg.tenant_memory_bytes`.
    tenant_memory: BTreeMap<String, Arc<MemoryAccount>>,
    rounds: u64,
    next_session: u64,
    /// Sequence number of the last node-link `Update` sent.
    update_seq: u64,
    /// Each running job's statistics as each of its nodes last reported them (transient:
    /// the next heartbeats bring them back after a restart).
    job_samples: HashMap<u64, BTreeMap<String, NodeJobReport>>,
    /// The SM share (MPS active thread %) of each offline job the matcher paired, sent with
    /// its launches; forgotten when the job ends or is paired no more.
    sm_shares: HashMap<u64, u8>,
    /// When the `matcher` slot was last asked.
    last_match_ms: Option<u64>,
    /// Each running job's current launch number (`Launch.launch_seq`): its
    /// agents' events name it, and an event of a run since replaced is
    /// ignored. Not stored: after a restart a job's number is unknown until
    /// its next launch and its events are taken as they come, as before.
    launch_seqs: HashMap<u64, u64>,
    /// The next launch number. Starts at the process's start time in
    /// microseconds, so that numbers never repeat across restarts of the
    /// plane (an agent may still hold one from before).
    next_launch_seq: u64,
}

impl Plane {
    /// Now, on the plane's clock (ms since the Unix epoch).
    fn now_ms(&self) -> u64 {
        self.cfg.clock.now_ms()
    }

    /// How long ago `since_ms` was, on the plane's clock.
    fn silent_since(&self, since_ms: u64) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(since_ms))
    }
}

/// What opening the plane produced besides the plane.
pub struct Opened {
    pub plane: Plane,
    /// Set when a new admin token was minted (first start).
    pub new_admin_token: Option<String>,
    /// Set when a new node token was minted (first start, or the first start
    /// of a data directory from before node tokens).
    pub new_node_token: Option<String>,
    pub journal_path: PathBuf,
}

/// A data directory whose store was lost, emptied or replaced while the
/// rest of the directory says the plane ran before: starting would mint new
/// tokens over `admin.token`/`node.token` (locking every client and agent
/// out) and write a second history into the old journal. Refused with what
/// to do instead.
fn refuse_a_lost_store(data: &Path, contents: &Contents) -> anyhow::Result<()> {
    let store = data.join("arbiter.redb");
    for kind in ["admin", "node"] {
        let key = format!("meta/{kind}_token_sha256");
        let file = data.join(format!("{kind}.token"));
        if contents.get(&key).is_none() && file.exists() {
            anyhow::bail!(
                "{} has no {kind} token but {} exists: the store was lost, emptied or \
                 replaced. Starting would mint new tokens (locking out every client and \
                 agent) and start a second history. Restore the store, or move \
                 admin.token, node.token and journal.jsonl out of {} to start afresh.",
                store.display(),
                file.display(),
                data.display()
            );
        }
    }
    let journal = data.join("journal.jsonl");
    let journaled = std::fs::metadata(&journal).is_ok_and(|m| m.len() > 0);
    if contents.get("meta/admin_token_sha256").is_none() && journaled {
        anyhow::bail!(
            "{} is empty but {} holds a history: the store was lost, emptied or replaced. \
             Restore the store, or move journal.jsonl out of {} to start afresh.",
            store.display(),
            journal.display(),
            data.display()
        );
    }
    Ok(())
}

/// What a node may be called (a host name's characters): the one rule for an agent's hello
/// and for a token bound to a node, so no token is issued for a name no node can take.
fn check_node_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err("node name must be 1..=63 of [A-Za-z0-9._-]".into())
    }
}

/// The node an agent describes; the error names the bad field.
fn hello_request(h: &AgentHello) -> Result<NodeRequest, String> {
    check_node_name(&h.name)?;
    if h.gpus.is_empty() {
        return Err("a node must report at least one GPU".into());
    }
    let model = h.gpus[0].model.clone();
    if h.gpus.iter().any(|g| g.model != model) {
        return Err("all GPUs of a node must be one model".into());
    }
    Ok(NodeRequest {
        name: h.name.clone(),
        pool: if h.pool.is_empty() {
            "agents".into()
        } else {
            h.pool.clone()
        },
        cpu_milli: h.cpu_milli,
        memory_mib: h.memory_mib,
        gpu_model: model,
        gpu_memory_mib: h.gpus.iter().map(|g| g.memory_mib).min().unwrap_or(0),
        gpu_count: h.gpus.len() as u32,
        on_loan: false,
    })
}

fn agent_request(r: &AgentRecord) -> NodeRequest {
    NodeRequest {
        name: r.name.clone(),
        pool: r.pool.clone(),
        cpu_milli: r.cpu_milli,
        memory_mib: r.memory_mib,
        gpu_model: r.gpu_model.clone(),
        gpu_memory_mib: r.gpu_memory_mib,
        gpu_count: r.gpu_count,
        on_loan: false,
    }
}

fn move_status(
    index: &mut HashMap<JobStatus, BTreeSet<u64>>,
    id: u64,
    from: JobStatus,
    to: JobStatus,
) {
    if let Some(set) = index.get_mut(&from) {
        set.remove(&id);
    }
    index.entry(to).or_default().insert(id);
}

/// A name the API creates something under (a slot, an experiment) is what a policy's own
/// name may be — at most 128 bytes of printable text, not blank — so a slot named after
/// its manifest always passes, and no name writes escape codes to the terminals and logs
/// that show it or fills a listing.
fn check_label(what: &str, name: &str) -> Result<(), ApiError> {
    use arbiter_host::runtime::{MAX_NAME_TEXT, guest_text, is_plain};
    if name.trim().is_empty() || name.len() > MAX_NAME_TEXT || !is_plain(name) {
        return Err(ApiError::InvalidArgument(format!(
            "{what} name `{}` must be 1 to {MAX_NAME_TEXT} bytes of printable text",
            guest_text(name, 32, false)
        )));
    }
    Ok(())
}

/// The tenant whose slot `slot` is (the inverse of [`tenant_slot`]).
fn slot_tenant(slot: &str) -> Option<&str> {
    slot.strip_prefix("tenant:")
}

fn tenant_slot(tenant: &str) -> String {
    format!("tenant:{tenant}")
}

fn arm_or_control(arm: &str) -> String {
    if arm.is_empty() {
        CONTROL.to_string()
    } else {
        arm.to_string()
    }
}

fn job_write(job: &StoredJob) -> Write {
    match serde_json::to_vec(job) {
        Ok(bytes) => Write::Job(job.id, bytes),
        // Unreachable for these plain records; never lose the id silently.
        Err(e) => Write::Put(format!("error/job/{}", job.id), e.to_string().into_bytes()),
    }
}

/// The contract-0.3 traits of a stored job.
fn job_traits(job: &StoredJob) -> JobTraits {
    let s = &job.spec;
    JobTraits {
        gpu_milli_limit: s.gpu_milli_limit,
        locality: s.locality,
        slo_ms: s.slo_ms,
        group: s.group.clone(),
    }
}

/// Hands a service's load to its cell's policies (`service-metric`).
fn record_service(
    state: &mut ClusterState,
    local: JobId,
    load: ServiceRecord,
) -> Result<(), arbiter_host::state::StateError> {
    let Some(job) = state.job_index(local) else {
        return Ok(()); // not in the cell any more: nothing to tell
    };
    state.record_service_metrics(vec![model::ServiceMetric {
        job,
        requests_per_s: load.requests_per_s,
        p50_latency_ms: load.p50_latency_ms,
        p99_latency_ms: load.p99_latency_ms,
    }])
}

fn job_request(job: &StoredJob) -> JobRequest {
    let s = &job.spec;
    let workers = s.workers();
    let per_worker = if s.gpus == 0 { 0 } else { s.gpus_per_worker };
    let mut req = JobRequest::gpus(job.state_name(), job.tenant.clone(), workers, per_worker);
    req.kind = s.kind;
    (req.min_workers, req.max_workers) = s.worker_bounds();
    req.priority = s.priority;
    req.qos = s.qos;
    // What the user asked for, nothing implied: a GPU job that states no CPU
    // or memory must still fit a small agent node.
    req.cpu_milli = s.cpu_milli;
    req.memory_mib = s.memory_mib;
    if s.gpu_milli > 0 {
        req.gpu_milli = s.gpu_milli;
    }
    req.estimate_ms = s.duration_ms;
    req.deadline_ms = if s.deadline_ms > 0 {
        job.submit_ms + s.deadline_ms
    } else {
        0
    };
    req.gpu_models = s.gpu_models.clone();
    req.gpu_memory_mib = s.gpu_memory_mib;
    req
}

/// Where the hashes of tokens issued for one node each are stored.
const NODE_TOKEN_PREFIX: &str = "nodetoken/";

/// The tenant of jobs submitted without one.
pub const DEFAULT_TENANT: &str = "default";

/// Jobs in a `List` page when the request names no size, and the most it may name.
pub const DEFAULT_PAGE: usize = 1_000;
pub const MAX_PAGE: usize = 10_000;

/// Picks one estimate of an arm's metrics.
type ArmEstimate = fn(&views::ArmView) -> &Estimate;

/// One tenant's jobs as admission sees them in a tick.
#[derive(Default)]
struct TenantJobs<'a> {
    queued: Vec<&'a StoredJob>,
    /// Pending or running.
    released: Vec<&'a StoredJob>,
    claimed_milli: u64,
    /// Whole GPUs asked for by the released jobs (the tenant view's measure).
    claimed_gpus: u32,
}

fn tenant_job(position: u32, j: &StoredJob, running: bool) -> TenantJob {
    TenantJob {
        position,
        name: j.spec.name.clone(),
        gpus: j.spec.gpus,
        priority: j.spec.priority,
        submit_ms: j.submit_ms,
        estimate_ms: j.spec.duration_ms,
        deadline_ms: if j.spec.deadline_ms > 0 {
            j.submit_ms + j.spec.deadline_ms
        } else {
            0
        },
        running,
    }
}

/// Node-named placement of a job in a cell's state.
fn workers_at(state: &ClusterState, workers: &[WorkerPlacement]) -> Vec<WorkerAt> {
    workers
        .iter()
        .map(|w| {
            let node = state.cluster().node(w.node);
            let base = node.gpu_range().start;
            WorkerAt {
                node: node.name().to_string(),
                gpus: w.gpus.iter().map(|g| g.saturating_sub(base)).collect(),
            }
        })
        .collect()
}

/// Puts a running job back where it ran, in a rebuilt cell.
fn place_again(
    state: &mut ClusterState,
    local: JobId,
    placement: &[WorkerAt],
) -> anyhow::Result<()> {
    let index = state
        .job_index(local)
        .ok_or_else(|| anyhow::anyhow!("job not in the cell"))?;
    let mut workers = Vec::with_capacity(placement.len());
    for w in placement {
        let node = state
            .node_index(&w.node)
            .ok_or_else(|| anyhow::anyhow!("node `{}` is not in this cell", w.node))?;
        let base = state.cluster().node(node).gpu_range().start;
        workers.push(WorkerPlacement {
            node,
            gpus: w.gpus.iter().map(|g| base + g).collect(),
        });
    }
    if workers.is_empty() {
        anyhow::bail!("no recorded placement");
    }
    let decision = vec![Decision::Place(index, workers)];
    state
        .validate(&decision, 1)
        .map_err(|(_, e)| anyhow::anyhow!("{e}"))?;
    state.apply(decision).context("re-placing")?;
    Ok(())
}

fn merge(a: &Histogram, b: &Histogram) -> Histogram {
    let mut m = a.clone();
    m.add(b);
    m
}

fn status_skeleton(r: &ExperimentRecord) -> views::ExperimentView {
    views::ExperimentView {
        name: r.name.clone(),
        mode: r.mode,
        state: r.state,
        candidate_slot: r.candidate_slot.clone(),
        arms: Vec::new(),
        shadow: None,
        reason: r.reason.clone(),
        started_ms: r.started_ms,
        ended_ms: r.ended_ms,
        comparison: None,
        balance: None,
    }
}

fn arm_metrics(
    arm: &str,
    slot: &str,
    generation: u64,
    nodes: u32,
    gpus: u32,
    s: &ArmStats,
) -> views::ArmView {
    let (j, r) = (&s.jobs, &s.rounds);
    views::ArmView {
        arm: arm.to_string(),
        slot: slot.to_string(),
        generation,
        nodes,
        gpus,
        jobs_submitted: j.submitted,
        jobs_started: j.started,
        jobs_finished: j.finished,
        queue_delay_ms: j.queue_delay_ms.estimate().within(0.0, f64::INFINITY),
        jct_ms: j.jct_ms.estimate().within(0.0, f64::INFINITY),
        gpu_allocation_pct: r.alloc_pct.estimate().within(0.0, 100.0),
        fragmentation_pct: r.frag_pct.estimate().within(0.0, 100.0),
        preemptions: j.preemptions,
        slo_violations: j.slo_violations,
        policy_faults: r.faults,
        policy_latency_ms: r.policy_ms.estimate().within(0.0, f64::INFINITY),
    }
}

/// One tenant's admission question, asked off the plane's lock.
pub struct TenantAdmission {
    tenant: String,
    slot: Option<Arc<PolicySlot>>,
    /// Job ids by queue position.
    queued: Vec<u64>,
    request: AdmissionRequest,
}

/// What [`Plane::begin_tick`] leaves for the tenant policies to decide.
pub struct PendingAdmission {
    now: u64,
    epoch: u64,
    tenants: Vec<TenantAdmission>,
}

impl PendingAdmission {
    /// Asks every tenant's policy (deadlines, faults, quarantine and the
    /// native fallback are the tenant driver's), touching no plane state.
    pub fn decide(self) -> DecidedAdmission {
        let epoch = self.epoch;
        DecidedAdmission {
            now: self.now,
            tenants: self
                .tenants
                .into_iter()
                .map(|t| {
                    let admission = tenant::admit(t.slot.as_deref(), epoch, &t.request);
                    (t.tenant, t.queued, admission)
                })
                .collect(),
        }
    }
}

/// The tenant policies' answers, for [`Plane::end_tick`].
pub struct DecidedAdmission {
    now: u64,
    tenants: Vec<(String, Vec<u64>, tenant::Admission)>,
}
