//! The control plane: jobs, tenants, policy slots, experiments and the cells
//! that run rounds, over the host core.
//!
//! A *cell* is one host core (`ClusterState` + `RoundDriver`) over a share of
//! the nodes. Outside a split experiment there is one cell, `control`, whose
//! scheduler is the `default` slot. A split experiment rebuilds the cells
//! from the plane's own job table: the candidate arm gets its share of the
//! nodes and the jobs routed to it (by tenant or by a hash of the job id);
//! running jobs stay where they run. The same rebuild restores the cells
//! after a restart, so recovery is not a separate code path.
//!
//! Jobs first wait in their tenant's admission queue. Each round the
//! tenant's `tenant`-role policy (slot `tenant:<name>`), if it has one,
//! orders and holds them; released jobs go to their cell's scheduler.
//!
//! The plane is synchronous: the gRPC layer and the round loop share it
//! behind one mutex, and nothing slow (compiling a component, waiting for
//! the disk) happens while it is held.

use crate::journal::{JournalLimits, JournalWriter, Record, RoundRecord};
use crate::launch;
use crate::metrics::{Exposition, GaugeValue, Histogram, PolicyMetrics, generation_label};
use crate::records::*;
use crate::shadow::{Shadow, ShadowInput};
use crate::stats::{
    AlwaysValidP, ArmStats, Assigner, Comparison, JobStats, RoundStats, SRM_ALERT_P, assign,
    fragmentation_pct, look, pending_demand,
};
use crate::store::{Ack, Contents, Store, StoreWriter, Write};
use crate::waiting::{self, Capacity, Fleet};
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
use arbiter_proto::v1;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// The scheduler slot outside experiments (and the control arm in them).
pub const DEFAULT_SLOT: &str = "default";
/// The slot whose active generation answers the `matcher` role (MuxFlow's pairing of offline
/// with online work); empty: nothing is paired, offline work runs where the scheduler put it.
pub const MATCHER_SLOT: &str = "matcher";
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
            cpu_milli: 16_000 * gpus,
            memory_mib: 131_072 * gpus,
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
    /// A node agent with the node token: it may hold a `NodeLink` session
    /// and nothing else, so a compromised node cannot load policies, submit
    /// or cancel jobs, or read other tenants' work.
    Node,
}

impl Caller {
    fn may_see(&self, tenant: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Tenant(t) => t == tenant,
            Caller::Node => false,
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

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Store key prefix of an ended experiment's final status (arm metrics,
/// shadow summary), kept apart from its record (`exp/`).
const FINISHED_STATUS_PREFIX: &str = "expstatus/";

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

/// How a node's work is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// Part of the embedded pool: jobs run for their stated duration.
    Simulated,
    /// An `arbiter node` agent: jobs run as real processes and end when they exit.
    Agent,
}

/// The host's end of a node agent's stream.
pub struct AgentLink {
    /// The agent's instance id from its hello ("" from an agent that sends none).
    instance: String,
    pub session: u64,
    pub tx: tokio::sync::mpsc::UnboundedSender<v1::HostMessage>,
    pub last_seen: std::time::Instant,
}

struct PoolNode {
    request: NodeRequest,
    status: NodeStatus,
    kind: NodeKind,
    link: Option<AgentLink>,
    /// When an agent node was last heard from (or restored at start-up).
    last_seen: std::time::Instant,
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
    jobs: BTreeMap<u64, StoredJob>,
    /// Ids by status, so a round touches live jobs only, never the history.
    by_status: HashMap<JobStatus, BTreeSet<u64>>,
    next_id: u64,
    tenants: BTreeMap<String, TenantRecord>,
    admin_token_sha: String,
    node_token_sha: String,
    nodes: Vec<PoolNode>,
    cells: Vec<Cell>,
    experiment: Option<Experiment>,
    experiments: BTreeMap<String, ExperimentRecord>,
    /// Final arm metrics of experiments that ended in this process.
    finished_status: BTreeMap<String, v1::ExperimentStatus>,
    events: broadcast::Sender<v1::JobEvent>,
    metrics: PolicyMetrics,
    /// Stats of the single control cell outside experiments.
    tenant_faults: u64,
    /// When retention last looked at the ended jobs' ages.
    last_retention_ms: u64,
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
    last_match: Option<std::time::Instant>,
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

impl Plane {
    /// Opens (or creates) the plane's data directory and restores everything in it.
    pub fn open(cfg: PlaneConfig, data: &Path) -> anyhow::Result<Opened> {
        let data =
            &std::path::absolute(data).with_context(|| format!("resolving {}", data.display()))?;
        crate::files::private_dir(data)?;
        let store = Store::open(data)?;
        crate::files::restrict(&data.join("arbiter.redb"))?;
        let contents = store.read_all()?;
        refuse_a_lost_store(data, &contents)?;
        let writer = store.writer()?;
        let mut runtime = cfg.runtime.clone();
        if runtime.cache_dir.is_none() {
            runtime.cache_dir = Some(data.join("cache"));
        }
        let engine = PolicyEngine::new(runtime).context("creating the policy engine")?;
        let registry = Arc::new(Registry::new(engine));
        let journal_path = data.join("journal.jsonl");
        let journal = if cfg.journal {
            let journal = JournalWriter::open_with(&journal_path, cfg.journal_limits)?;
            crate::files::restrict(&journal_path)?;
            Some(journal)
        } else {
            None
        };
        let (events, _) = broadcast::channel(4096);
        let mut plane = Plane {
            nodes: cfg
                .nodes
                .iter()
                .map(|n| PoolNode {
                    request: n.clone(),
                    status: NodeStatus::Ready,
                    kind: NodeKind::Simulated,
                    link: None,
                    last_seen: std::time::Instant::now(),
                })
                .collect(),
            cfg,
            data: data.to_path_buf(),
            registry,
            writer,
            journal,
            jobs: BTreeMap::new(),
            by_status: HashMap::new(),
            next_id: 1,
            tenants: BTreeMap::new(),
            admin_token_sha: String::new(),
            node_token_sha: String::new(),
            cells: Vec::new(),
            experiment: None,
            experiments: BTreeMap::new(),
            finished_status: BTreeMap::new(),
            events,
            metrics: PolicyMetrics::default(),
            tenant_faults: 0,
            last_retention_ms: 0,
            tenant_memory: BTreeMap::new(),
            job_samples: HashMap::new(),
            sm_shares: HashMap::new(),
            last_match: None,
            launch_seqs: HashMap::new(),
            next_launch_seq: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
                .max(1),
            rounds: 0,
            next_session: 1,
            update_seq: 0,
        };
        let (admin_sha, new_admin_token) = plane.stored_token(&contents, "admin")?;
        let (node_sha, new_node_token) = plane.stored_token(&contents, "node")?;
        plane.admin_token_sha = admin_sha;
        plane.node_token_sha = node_sha;
        plane.restore(&contents)?;
        plane.rebuild_cells();
        Ok(Opened {
            plane,
            new_admin_token,
            new_node_token,
            journal_path,
        })
    }

    /// The stored hash of the `kind` token (`admin`, `node`), minting the
    /// token on first start: its hash goes to the store, the token itself to
    /// `<kind>.token` in the data directory (owner-only) and to the caller.
    fn stored_token(
        &mut self,
        contents: &Contents,
        kind: &str,
    ) -> anyhow::Result<(String, Option<String>)> {
        let key = format!("meta/{kind}_token_sha256");
        if let Some(sha) = contents.get(&key) {
            return Ok((String::from_utf8_lossy(sha).into_owned(), None));
        }
        let token = new_token();
        let sha = sha256_hex(token.as_bytes());
        self.writer
            .send_durable(vec![Write::Put(key, sha.clone().into_bytes())])
            .wait()?;
        let path = self.data.join(format!("{kind}.token"));
        crate::files::write(&path, format!("{token}\n").as_bytes(), true)?;
        Ok((sha, Some(token)))
    }

    fn restore(&mut self, contents: &Contents) -> anyhow::Result<()> {
        for (name, bytes) in contents.with_prefix("tenant/") {
            let t: TenantRecord =
                serde_json::from_slice(bytes).with_context(|| format!("stored tenant `{name}`"))?;
            self.tenants.insert(t.name.clone(), t);
        }
        for (id, bytes) in &contents.jobs {
            let job: StoredJob =
                serde_json::from_slice(bytes).with_context(|| format!("stored job {id}"))?;
            self.next_id = self.next_id.max(job.id + 1);
            self.by_status.entry(job.status).or_default().insert(job.id);
            self.jobs.insert(job.id, job);
        }
        for (name, bytes) in contents.with_prefix("agent/") {
            let r: AgentRecord = serde_json::from_slice(bytes)
                .with_context(|| format!("stored agent node `{name}`"))?;
            // Restored as ready with a fresh grace period: it is declared lost
            // (and its jobs rescheduled) only if it does not reconnect in time.
            self.nodes.push(PoolNode {
                request: agent_request(&r),
                status: NodeStatus::Ready,
                kind: NodeKind::Agent,
                link: None,
                last_seen: std::time::Instant::now(),
            });
        }
        for (name, bytes) in contents.with_prefix("node/") {
            let status: NodeStatus =
                serde_json::from_slice(bytes).with_context(|| format!("stored node `{name}`"))?;
            if let Some(n) = self.nodes.iter_mut().find(|n| n.request.name == name) {
                n.status = status;
            }
        }
        for (name, bytes) in contents.with_prefix("loan/") {
            let on_loan: bool = serde_json::from_slice(bytes)
                .with_context(|| format!("stored loan of `{name}`"))?;
            if let Some(n) = self.nodes.iter_mut().find(|n| n.request.name == name) {
                n.request.on_loan = on_loan;
            }
        }
        // Policy slots: recompile every persisted generation (the engine's
        // on-disk cache makes this a deserialisation).
        let mut restored_default = false;
        // Digests the stored slots refer to, whether or not they load.
        let mut referenced: HashSet<String> = HashSet::new();
        for (slot_name, bytes) in contents.with_prefix("slot/") {
            let record: SlotRecord = serde_json::from_slice(bytes)
                .with_context(|| format!("stored slot `{slot_name}`"))?;
            referenced.extend(record.generations.iter().map(|g| g.digest.clone()));
            let slot = self.registry.slot(slot_name);
            let mut ids = Vec::new();
            for g in &record.generations {
                let Some(wasm) = contents.get(&format!("blob/{}", g.digest)) else {
                    tracing::error!(slot = slot_name, digest = %g.digest, "stored generation has no component; skipped");
                    continue;
                };
                match self.registry.engine().compile(wasm) {
                    Ok(compiled) => {
                        let compiled = self.charge_owner(slot_name, compiled);
                        let config = (!g.config.is_empty()).then(|| g.config.clone());
                        let loaded = if g.id > 0 {
                            slot.load_as(g.id, compiled, config)
                        } else {
                            slot.load(compiled, config, None, None)
                        };
                        match loaded {
                            Ok(generation) => ids.push(Some(generation.id)),
                            Err(e) => {
                                tracing::error!(slot = slot_name, error = %e, "stored generation failed to load");
                                ids.push(None);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(slot = slot_name, error = %e, "stored generation failed to compile");
                        ids.push(None);
                    }
                }
            }
            if let Some(Some(id)) = record.active.and_then(|i| ids.get(i)) {
                let _ = slot.activate(*id);
            } else if let Some(Some(id)) = ids.iter().rev().find(|i| i.is_some()) {
                let _ = slot.activate(*id);
            }
            restored_default |= slot_name == DEFAULT_SLOT && slot.active().is_some();
        }
        // Components no slot refers to any more (left behind by a version that
        // never deleted them, or by a crash between the two writes).
        for (digest, _) in contents.with_prefix("blob/") {
            if !referenced.contains(digest) {
                tracing::info!(digest, "deleting a stored component no slot refers to");
                self.writer.send(Write::Delete(format!("blob/{digest}")));
            }
        }
        if !restored_default {
            let name = self.cfg.default_policy.clone();
            let wasm = arbiter_policies::get(&name)
                .ok_or_else(|| anyhow::anyhow!("no built-in policy `{name}`"))?;
            let compiled = self
                .registry
                .engine()
                .compile(wasm)
                .map_err(|e| anyhow::anyhow!("built-in `{name}`: {e}"))?;
            self.load_generation(DEFAULT_SLOT, compiled, wasm, String::new(), true)
                .map_err(|e| anyhow::anyhow!("loading built-in `{name}`: {e}"))?;
        }
        for (name, bytes) in contents.with_prefix(FINISHED_STATUS_PREFIX) {
            // Final metrics are a report, not state: an unreadable one is
            // dropped with a warning rather than refusing to start.
            match <v1::ExperimentStatus as prost::Message>::decode(bytes) {
                Ok(status) => {
                    self.finished_status.insert(name.to_string(), status);
                }
                Err(e) => {
                    tracing::warn!(experiment = name, error = %e, "unreadable final experiment status; dropped");
                }
            }
        }
        for (name, bytes) in contents.with_prefix("exp/") {
            let record: ExperimentRecord = serde_json::from_slice(bytes)
                .with_context(|| format!("stored experiment `{name}`"))?;
            if record.state == ExperimentState::Running {
                // Round stats are a report: an unreadable record starts them afresh.
                let rounds = contents
                    .get(&format!("{EXPERIMENT_ROUNDS_PREFIX}{name}"))
                    .and_then(|bytes| match serde_json::from_slice(bytes) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            tracing::warn!(experiment = name, error = %e, "unreadable round stats; started afresh");
                            None
                        }
                    });
                match self.activate_experiment(record.clone(), rounds) {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::error!(experiment = name, error = %e, "could not resume experiment; aborting it");
                        let mut r = record;
                        r.state = ExperimentState::Aborted;
                        r.reason = format!("could not resume after restart: {e}");
                        r.ended_ms = now_ms();
                        self.persist_experiment(&r);
                        self.experiments.insert(r.name.clone(), r);
                    }
                }
            } else {
                self.experiments.insert(record.name.clone(), record);
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ auth

    /// Maps a bearer token to a caller.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Caller, ApiError> {
        let token = token.ok_or_else(|| {
            ApiError::Unauthenticated("missing `authorization: Bearer <token>` metadata".into())
        })?;
        let sha = sha256_hex(token.as_bytes());
        if constant_time_eq(&sha, &self.admin_token_sha) {
            return Ok(Caller::Admin);
        }
        if constant_time_eq(&sha, &self.node_token_sha) {
            return Ok(Caller::Node);
        }
        self.tenants
            .values()
            .find(|t| constant_time_eq(&t.token_sha256, &sha))
            .map(|t| Caller::Tenant(t.name.clone()))
            .ok_or_else(|| ApiError::Unauthenticated("unknown token".into()))
    }

    fn require_admin(caller: &Caller) -> Result<(), ApiError> {
        match caller {
            Caller::Admin => Ok(()),
            Caller::Tenant(t) => Err(ApiError::PermissionDenied(format!(
                "tenant `{t}` may not do this; it needs the admin token"
            ))),
            Caller::Node => Err(node_token_refused()),
        }
    }

    // ------------------------------------------------------------ tenants

    pub fn add_tenant(
        &mut self,
        caller: &Caller,
        name: &str,
        quota_gpus: u32,
    ) -> Result<(v1::TenantInfo, Ack), ApiError> {
        Self::require_admin(caller)?;
        if name.is_empty()
            || name.len() > 63
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ApiError::InvalidArgument(
                "tenant name must be 1..=63 of [A-Za-z0-9_-]".into(),
            ));
        }
        if name == DEFAULT_TENANT {
            // It would inherit every job submitted without a tenant.
            return Err(ApiError::InvalidArgument(format!(
                "`{DEFAULT_TENANT}` is reserved for jobs submitted without a tenant"
            )));
        }
        if self.tenants.contains_key(name) {
            return Err(ApiError::AlreadyExists(format!("tenant `{name}` exists")));
        }
        let token = new_token();
        let record = TenantRecord {
            name: name.to_string(),
            quota_gpus,
            token_sha256: sha256_hex(token.as_bytes()),
        };
        let bytes = serde_json::to_vec(&record).map_err(internal)?;
        let ack = self
            .writer
            .send_durable(vec![Write::Put(format!("tenant/{name}"), bytes)]);
        self.tenants.insert(name.to_string(), record);
        for cell in &mut self.cells {
            if let Err(e) = cell
                .state
                .set_tenant_quota(name, (quota_gpus > 0).then_some(quota_gpus))
            {
                tracing::error!(tenant = name, error = %e, "tenant quota not applied");
            }
        }
        let mut info = self.tenant_info(name);
        info.token = token;
        Ok((info, ack))
    }

    /// Removes a tenant that has no live job: its record, its token, its
    /// policy slot. Its ended jobs stay (as history, until retention).
    pub fn remove_tenant(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        if !self.tenants.contains_key(name) {
            return Err(ApiError::NotFound(format!("no tenant `{name}`")));
        }
        let live = self
            .jobs
            .values()
            .filter(|j| j.tenant == name && !j.status.is_terminal())
            .count();
        if live > 0 {
            return Err(ApiError::FailedPrecondition(format!(
                "tenant `{name}` has {live} live jobs; cancel them first"
            )));
        }
        if self
            .experiment
            .as_ref()
            .is_some_and(|e| e.record.candidate_tenants.iter().any(|t| t == name))
        {
            return Err(ApiError::FailedPrecondition(format!(
                "tenant `{name}` is an arm of the running experiment"
            )));
        }
        self.tenants.remove(name);
        let slot = tenant_slot(name);
        self.registry.remove(&slot);
        self.tenant_memory.remove(name);
        for cell in &mut self.cells {
            if let Err(e) = cell.state.set_tenant_quota(name, None) {
                tracing::error!(tenant = name, error = %e, "tenant quota not cleared");
            }
        }
        tracing::info!(tenant = name, "tenant removed");
        Ok(self.writer.send_durable(vec![
            Write::Delete(format!("tenant/{name}")),
            Write::Delete(format!("slot/{slot}")),
        ]))
    }

    /// A new token for `subject` ("admin", "node" or "tenant:<name>"); the
    /// old one stops working at once. The admin's and the nodes' are also
    /// written to their files in the data directory.
    pub fn rotate_token(
        &mut self,
        caller: &Caller,
        subject: &str,
    ) -> Result<(String, Ack), ApiError> {
        Self::require_admin(caller)?;
        let token = new_token();
        let sha = sha256_hex(token.as_bytes());
        let write = match subject {
            "admin" | "node" => {
                let path = self.data.join(format!("{subject}.token"));
                crate::files::write(&path, format!("{token}\n").as_bytes(), true)
                    .map_err(internal)?;
                if subject == "admin" {
                    self.admin_token_sha = sha.clone();
                } else {
                    self.node_token_sha = sha.clone();
                }
                Write::Put(format!("meta/{subject}_token_sha256"), sha.into_bytes())
            }
            _ => {
                let name = subject.strip_prefix("tenant:").ok_or_else(|| {
                    ApiError::InvalidArgument(format!(
                        "rotate whose token? `admin`, `node` or `tenant:<name>`, not `{subject}`"
                    ))
                })?;
                let record = self
                    .tenants
                    .get_mut(name)
                    .ok_or_else(|| ApiError::NotFound(format!("no tenant `{name}`")))?;
                record.token_sha256 = sha;
                let bytes = serde_json::to_vec(record).map_err(internal)?;
                Write::Put(format!("tenant/{name}"), bytes)
            }
        };
        tracing::info!(subject, "token rotated");
        Ok((token, self.writer.send_durable(vec![write])))
    }

    fn tenant_info(&self, name: &str) -> v1::TenantInfo {
        let quota = self.tenants.get(name).map_or(0, |t| t.quota_gpus);
        let slot = tenant_slot(name);
        v1::TenantInfo {
            name: name.to_string(),
            quota_gpus: quota,
            gpus_in_use: self.tenant_gpus_claimed(name),
            token: String::new(),
            policy_slot: if self
                .registry
                .find(&slot)
                .is_some_and(|s| s.active().is_some())
            {
                slot
            } else {
                String::new()
            },
        }
    }

    pub fn list_tenants(&self, caller: &Caller) -> Vec<v1::TenantInfo> {
        self.tenants
            .keys()
            .filter(|t| caller.may_see(t))
            .map(|t| self.tenant_info(t))
            .collect()
    }

    /// GPUs held or claimed by the tenant's released jobs (running or pending),
    /// as the tenant view states them (whole GPUs asked for).
    fn tenant_gpus_claimed(&self, tenant: &str) -> u32 {
        self.released()
            .filter(|j| j.tenant == tenant)
            .map(|j| j.spec.gpus)
            .sum()
    }

    fn ids(&self, status: JobStatus) -> impl Iterator<Item = u64> + '_ {
        self.by_status.get(&status).into_iter().flatten().copied()
    }

    fn count(&self, status: JobStatus) -> u64 {
        self.by_status.get(&status).map_or(0, |s| s.len() as u64)
    }

    /// Jobs handed to a cell: pending or running.
    fn released(&self) -> impl Iterator<Item = &StoredJob> + '_ {
        self.ids(JobStatus::Pending)
            .chain(self.ids(JobStatus::Running))
            .filter_map(|id| self.jobs.get(&id))
    }

    // ------------------------------------------------------------ jobs

    /// Accepts jobs; the [`Ack`] completes once they are durable.
    pub fn submit(
        &mut self,
        caller: &Caller,
        specs: &[v1::JobSpec],
    ) -> Result<(Vec<u64>, Ack), ApiError> {
        let mut accepted = Vec::with_capacity(specs.len());
        let fleet = Fleet::of(self.nodes.iter().map(|n| &n.request));
        for (i, spec) in specs.iter().enumerate() {
            let which = if specs.len() == 1 {
                "job spec".to_string()
            } else {
                format!("job spec #{i}")
            };
            let record = JobSpecRecord::from_proto(spec)
                .map_err(|e| ApiError::InvalidArgument(format!("{which}: {e}")))?;
            if let Some(why) = fleet.never_fits(&record) {
                return Err(ApiError::InvalidArgument(format!(
                    "{which}: can never run on this cluster: {why}"
                )));
            }
            let tenant = match caller {
                Caller::Tenant(t) => {
                    if !spec.tenant.is_empty() && &spec.tenant != t {
                        return Err(ApiError::PermissionDenied(format!(
                            "tenant `{t}` may not submit for tenant `{}`",
                            spec.tenant
                        )));
                    }
                    t.clone()
                }
                Caller::Admin if spec.tenant.is_empty() || spec.tenant == DEFAULT_TENANT => {
                    DEFAULT_TENANT.to_string()
                }
                Caller::Admin if !self.tenants.contains_key(&spec.tenant) => {
                    return Err(ApiError::NotFound(format!(
                        "{which}: no tenant `{}` (add it first: `arbiter tenant add`)",
                        spec.tenant
                    )));
                }
                Caller::Admin => spec.tenant.clone(),
                Caller::Node => return Err(node_token_refused()),
            };
            accepted.push((record, tenant));
        }
        let now = now_ms();
        let mut ids = Vec::with_capacity(accepted.len());
        let mut writes = Vec::with_capacity(accepted.len());
        for (mut spec, tenant) in accepted {
            if spec.duration_ms == 0 {
                spec.duration_ms = self.cfg.default_duration.as_millis() as u64;
            }
            let id = self.next_id;
            self.next_id += 1;
            let job = StoredJob {
                id,
                spec,
                tenant,
                status: JobStatus::Queued,
                submit_ms: now,
                start_ms: 0,
                end_ms: 0,
                placement: Vec::new(),
                preemptions: 0,
                arm: String::new(),
                experiment: String::new(),
                first_start_ms: 0,
                message: String::new(),
                progress: ProgressRecord::default(),
                service: None,
            };
            writes.push(job_write(&job));
            self.notify(&job, v1::JobState::Unspecified);
            self.by_status
                .entry(JobStatus::Queued)
                .or_default()
                .insert(id);
            self.jobs.insert(id, job);
            ids.push(id);
        }
        Ok((ids, self.writer.send_durable(writes)))
    }

    /// A job as the API shows it: the stored record, where it stands in its
    /// cell, and why it waits (`reasons` caches what the reasons need across
    /// the jobs of one call).
    fn job_proto(&self, job: &StoredJob, reasons: &mut WaitContext) -> v1::Job {
        let mut proto = job.to_proto();
        proto.waiting_reason = self.waiting_reason(job, reasons);
        proto.progress = self.cell_progress(job.id).as_ref().map(progress_proto);
        proto.metrics = self.job_metric(job.id).map(|m| v1::JobSample {
            job_id: job.id,
            iteration_ms: m.iteration_ms,
            peak_memory_mib: m.peak_memory_mib,
            min_memory_mib: m.min_memory_mib,
            utilization_pct: u32::from(m.utilization_pct),
            host_memory_mib: m.host_memory_mib,
            memory_limit_mib: self.job_enforced(job.id, |r| r.memory_limit_mib),
            compute_share_permille: self.job_enforced(job.id, |r| r.compute_share_permille),
        });
        proto
    }

    /// Job `id`'s statistics over its nodes' last reports.
    fn job_metric(&self, id: u64) -> Option<model::JobMetric> {
        self.job_samples
            .get(&id)?
            .values()
            .map(|r| r.metric)
            .reduce(model::JobMetric::combine)
    }

    /// The tightest of job `id`'s enforced limits (`field`) over its nodes (0: none reported).
    fn job_enforced(&self, id: u64, field: fn(&NodeJobReport) -> u32) -> u32 {
        self.job_samples
            .get(&id)
            .and_then(|by_node| by_node.values().map(field).filter(|&v| v > 0).min())
            .unwrap_or(0)
    }

    /// A node's statistics of the jobs it runs: kept per node, combined per job, recorded as
    /// `job-metrics` in each job's cell. Samples for jobs not running there are ignored.
    fn record_job_samples(&mut self, node: &str, samples: &[v1::JobSample]) {
        let mut changed = Vec::new();
        for s in samples {
            let here = self.jobs.get(&s.job_id).is_some_and(|j| {
                j.status == JobStatus::Running && j.placement.iter().any(|w| w.node == node)
            });
            if !here {
                continue;
            }
            let metric = model::JobMetric {
                job: 0,
                iteration_ms: s.iteration_ms,
                peak_memory_mib: s.peak_memory_mib,
                min_memory_mib: s.min_memory_mib.min(s.peak_memory_mib),
                host_memory_mib: s.host_memory_mib,
                utilization_pct: s.utilization_pct.min(100) as u8,
                sm_activity_pct: s.utilization_pct.min(100) as u8,
            };
            self.job_samples.entry(s.job_id).or_default().insert(
                node.to_string(),
                NodeJobReport {
                    metric,
                    memory_limit_mib: s.memory_limit_mib,
                    compute_share_permille: s.compute_share_permille,
                },
            );
            changed.push(s.job_id);
        }
        for id in changed {
            let Some(combined) = self.job_metric(id) else {
                continue;
            };
            let Ok((state, local)) = self.in_cell(id) else {
                continue;
            };
            let Some(index) = state.job_index(local) else {
                continue;
            };
            let metric = model::JobMetric {
                job: index,
                ..combined
            };
            if let Err(e) = state.record_job_metrics(vec![metric]) {
                tracing::warn!(job = id, node, error = %e, "job metrics refused");
            }
        }
    }

    /// Job `id`'s progress in the cell it is in.
    fn cell_progress(&self, id: u64) -> Option<model::JobProgress> {
        self.cells.iter().find_map(|cell| {
            let local = *cell.local.get(&id)?;
            let index = cell.state.job_index(local)?;
            Some(cell.state.cluster().job(index).progress())
        })
    }

    /// Keeps job `id`'s progress, as of now, in its stored record.
    fn keep_progress(&mut self, id: u64) {
        let now = now_ms();
        let Some(p) = self.cell_progress(id) else {
            return;
        };
        let record = ProgressRecord {
            attained_ms: p.attained_ms_at(now),
            remaining_ms: p.remaining_ms_at(now).unwrap_or(0),
            remaining_workers: p.remaining_workers,
        };
        if let Some(job) = self.jobs.get_mut(&id)
            && job.progress != record
        {
            job.progress = record;
            let job = job.clone();
            self.writer.send(job_write(&job));
        }
    }

    /// Why a queued or pending job has not started ("" for any other).
    fn waiting_reason(&self, job: &StoredJob, cx: &mut WaitContext) -> String {
        match job.status {
            JobStatus::Queued => {
                let claimed = cx.claimed.get_or_insert_with(|| {
                    let mut claimed: HashMap<String, u32> = HashMap::new();
                    for j in self.released() {
                        *claimed.entry(j.tenant.clone()).or_default() += j.spec.gpus;
                    }
                    claimed
                });
                let quota = self.tenants.get(&job.tenant).map_or(0, |t| t.quota_gpus);
                waiting::queued_reason(
                    &job.spec,
                    &job.tenant,
                    quota,
                    claimed.get(&job.tenant).copied().unwrap_or(0),
                )
            }
            JobStatus::Pending => {
                let Some(index) = self
                    .cells
                    .iter()
                    .position(|c| c.local.contains_key(&job.id))
                else {
                    return "waiting to be handed to a scheduler".into();
                };
                let capacity = *cx
                    .capacity
                    .entry(index)
                    .or_insert_with(|| Capacity::of(&self.cells[index].state));
                waiting::pending_reason(&job.spec, &capacity)
            }
            _ => String::new(),
        }
    }

    pub fn get_job(&self, caller: &Caller, id: u64) -> Result<v1::Job, ApiError> {
        match self.jobs.get(&id) {
            Some(j) if caller.may_see(&j.tenant) => {
                Ok(self.job_proto(j, &mut WaitContext::default()))
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
        req: &v1::ListJobsRequest,
    ) -> Result<(Vec<v1::Job>, String), ApiError> {
        let states: HashSet<JobStatus> = req.states().filter_map(JobStatus::from_proto).collect();
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
        let mut reasons = WaitContext::default();
        let mut matching = self
            .jobs
            .range(..before)
            .rev()
            .map(|(_, j)| j)
            .filter(|j| caller.may_see(&j.tenant))
            .filter(|j| req.tenant.is_empty() || j.tenant == req.tenant)
            .filter(|j| states.is_empty() || states.contains(&j.status));
        let jobs: Vec<v1::Job> = matching
            .by_ref()
            .take(page)
            .map(|j| self.job_proto(j, &mut reasons))
            .collect();
        let next = match (matching.next(), jobs.last()) {
            (Some(_), Some(last)) => last.id.to_string(),
            _ => String::new(),
        };
        Ok((jobs, next))
    }

    /// A job the caller may act on: theirs (a tenant learns nothing about
    /// other tenants' job ids) and not ended.
    fn live_job(&self, caller: &Caller, id: u64) -> Result<&StoredJob, ApiError> {
        let Some(job) = self.jobs.get(&id).filter(|j| caller.may_see(&j.tenant)) else {
            return Err(ApiError::NotFound(format!("no job {id}")));
        };
        if job.status.is_terminal() {
            return Err(ApiError::FailedPrecondition(format!(
                "job {id} already ended ({:?})",
                job.status
            )));
        }
        Ok(job)
    }

    pub fn cancel(&mut self, caller: &Caller, id: u64) -> Result<(v1::Job, Ack), ApiError> {
        self.live_job(caller, id)?;
        self.stop_elsewhere(id, "");
        self.remove_from_cell(id);
        let ack = self.finish_job(id, JobStatus::Cancelled, "cancelled by request");
        let job = self
            .jobs
            .get(&id)
            .map(StoredJob::to_proto)
            .ok_or_else(|| internal("cancelled job vanished"))?;
        Ok((job, ack))
    }

    /// Records what a job has left, for the policies of its cell.
    pub fn report_progress(
        &mut self,
        caller: &Caller,
        id: u64,
        remaining_ms: u64,
    ) -> Result<v1::JobProgress, ApiError> {
        self.live_job(caller, id)?;
        let (state, local) = self.in_cell(id)?;
        state
            .report_progress(local, remaining_ms)
            .map_err(|e| internal(format!("recording progress of job {id}: {e}")))?;
        self.keep_progress(id);
        self.cell_progress(id)
            .as_ref()
            .map(progress_proto)
            .ok_or_else(|| internal("reported job vanished from its cell"))
    }

    /// The cluster state of the cell job `id` is in, and its id there.
    fn in_cell(&mut self, id: u64) -> Result<(&mut ClusterState, JobId), ApiError> {
        self.cells
            .iter_mut()
            .find_map(|c| Some((&mut c.state, *c.local.get(&id)?)))
            .ok_or_else(|| ApiError::FailedPrecondition(format!("job {id} is not in any cell yet")))
    }

    /// Records an inference job's load for the policies of its cell (and
    /// keeps it, so a rebuilt cell starts from it).
    pub fn report_service(
        &mut self,
        caller: &Caller,
        id: u64,
        load: v1::ReportServiceRequest,
    ) -> Result<v1::ServiceLoad, ApiError> {
        self.live_job(caller, id)?;
        let finite = load.requests_per_s.is_finite() && load.requests_per_s >= 0.0;
        if !finite || load.p50_latency_ms > load.p99_latency_ms {
            return Err(ApiError::InvalidArgument(
                "requests_per_s must be a finite rate >= 0 and p50 <= p99".into(),
            ));
        }
        if self
            .jobs
            .get(&id)
            .is_some_and(|j| j.spec.kind != model::job_kind::INFERENCE)
        {
            return Err(ApiError::FailedPrecondition(format!(
                "job {id} is not an inference job (submit it with kind 1)"
            )));
        }
        let record = ServiceRecord {
            requests_per_s: load.requests_per_s,
            p50_latency_ms: load.p50_latency_ms,
            p99_latency_ms: load.p99_latency_ms,
            reported_ms: now_ms(),
        };
        let (state, local) = self.in_cell(id)?;
        record_service(state, local, record)
            .map_err(|e| internal(format!("recording the load of job {id}: {e}")))?;
        if let Some(job) = self.jobs.get_mut(&id) {
            job.service = Some(record);
            let job = job.clone();
            self.writer.send(job_write(&job));
        }
        Ok(record.to_proto())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<v1::JobEvent> {
        self.events.subscribe()
    }

    fn notify(&self, job: &StoredJob, previous: v1::JobState) {
        if self.events.receiver_count() == 0 {
            return;
        }
        let _ = self.events.send(v1::JobEvent {
            job: Some(job.to_proto()),
            previous: previous as i32,
        });
    }

    fn remove_from_cell(&mut self, id: u64) {
        for cell in &mut self.cells {
            if let Some(local) = cell.local.remove(&id) {
                cell.global.remove(&local);
                if let Err(e) = cell.state.remove(local) {
                    tracing::error!(job = id, error = %e, "job missing from its cell");
                }
            }
        }
    }

    fn set_status(&mut self, id: u64, status: JobStatus) {
        if let Some(job) = self.jobs.get_mut(&id) {
            let previous = job.status.to_proto();
            move_status(&mut self.by_status, id, job.status, status);
            job.status = status;
            let job = job.clone();
            self.writer.send(job_write(&job));
            self.notify(&job, previous);
        }
    }

    fn finish_job(&mut self, id: u64, status: JobStatus, message: &str) -> Ack {
        let now = now_ms();
        let Some(job) = self.jobs.get_mut(&id) else {
            return self.writer.send_durable(Vec::new());
        };
        let previous = job.status.to_proto();
        let was_running = job.status == JobStatus::Running;
        self.job_samples.remove(&id);
        self.sm_shares.remove(&id);
        self.launch_seqs.remove(&id);
        move_status(&mut self.by_status, id, job.status, status);
        job.status = status;
        job.end_ms = now;
        *self.metrics.jobs_ended.entry(status.name()).or_default() += 1;
        job.message = message.to_string();
        let job = job.clone();
        if was_running
            && status == JobStatus::Succeeded
            && let Some(stats) = self.enrolled_stats(id)
        {
            stats.finished(
                now.saturating_sub(job.submit_ms) as f64,
                job.spec.deadline_ms,
            );
        }
        self.notify(&job, previous);
        self.writer.send_durable(vec![job_write(&job)])
    }

    /// The job stats of the arm a job is enrolled in, while its experiment runs.
    fn enrolled_stats(&mut self, id: u64) -> Option<&mut JobStats> {
        let job = self.jobs.get(&id)?;
        let e = self.experiment.as_mut()?;
        if job.experiment != e.record.name {
            return None;
        }
        Some(&mut e.stats.entry(arm_or_control(&job.arm)).or_default().jobs)
    }

    /// The round stats of a cell's arm while an experiment runs.
    fn round_stats(&mut self, arm: &str) -> Option<&mut RoundStats> {
        let e = self.experiment.as_mut()?;
        e.rounds_dirty = true;
        Some(&mut e.stats.entry(arm_or_control(arm)).or_default().rounds)
    }

    // ------------------------------------------------------------ policies

    /// Compiles a component: slow, so callers do it without holding the plane.
    pub fn compile(registry: &Registry, wasm: &[u8]) -> Result<CompiledPolicy, ApiError> {
        if wasm.len() > MAX_UPLOAD {
            return Err(ApiError::InvalidArgument(format!(
                "component is {} bytes, over the {MAX_UPLOAD}-byte upload limit: refused before compiling",
                wasm.len()
            )));
        }
        registry
            .engine()
            .compile(wasm)
            .map_err(|e| ApiError::InvalidArgument(format!("not a loadable policy component: {e}")))
    }

    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// Loads a compiled component into a slot (tenants: only their own).
    pub fn upload(
        &mut self,
        caller: &Caller,
        slot: &str,
        compiled: CompiledPolicy,
        wasm: &[u8],
        config: &str,
        activate: bool,
    ) -> Result<(v1::GenerationInfo, Ack), ApiError> {
        let slot = match (caller, slot) {
            (Caller::Tenant(t), "") => tenant_slot(t),
            // A pure matcher has one place to go.
            (Caller::Admin, "")
                if compiled.has_role(Role::Matcher) && !compiled.has_role(Role::Scheduler) =>
            {
                MATCHER_SLOT.to_string()
            }
            (Caller::Admin, "") => compiled.manifest.name.clone(),
            (_, s) => s.to_string(),
        };
        self.check_slot_access(caller, &slot)?;
        if let Some(tenant) = slot_tenant(&slot) {
            if !self.tenants.contains_key(tenant) {
                return Err(ApiError::NotFound(format!("no tenant `{tenant}`")));
            }
            if !compiled.has_role(Role::Tenant) {
                return Err(ApiError::InvalidArgument(format!(
                    "slot `{slot}` needs the `tenant` role; `{}` implements {:?}",
                    compiled.manifest.name, compiled.manifest.roles
                )));
            }
            self.check_tenant_code(tenant, &slot, &compiled)?;
        } else if slot == MATCHER_SLOT {
            if !compiled.has_role(Role::Matcher) {
                return Err(ApiError::InvalidArgument(format!(
                    "slot `{MATCHER_SLOT}` pairs offline with online work; `{}` does not implement the `matcher` role (it implements {:?})",
                    compiled.manifest.name, compiled.manifest.roles
                )));
            }
        } else if !compiled.has_role(Role::Scheduler) {
            return Err(ApiError::InvalidArgument(format!(
                "slot `{slot}` schedules; `{}` does not implement the `scheduler` role (it implements {:?})",
                compiled.manifest.name, compiled.manifest.roles
            )));
        }
        if slot == DEFAULT_SLOT && self.experiment.is_some() && activate {
            return Err(ApiError::FailedPrecondition(
                "an experiment is running; promote or abort it before swapping the default policy"
                    .into(),
            ));
        }
        let compiled = self.charge_owner(&slot, compiled);
        if !config.is_empty() {
            // Try the configuration on a throwaway instance before accepting it.
            let mut probe = compiled
                .instantiate()
                .map_err(|e| ApiError::InvalidArgument(format!("instantiating: {e}")))?;
            probe
                .configure(config)
                .map_err(|e| ApiError::InvalidArgument(format!("configuration refused: {e}")))?;
        }
        let (generation, ack) =
            self.load_generation(&slot, compiled, wasm, config.to_string(), activate)?;
        Ok((self.generation_info(&slot, &generation), ack))
    }

    fn load_generation(
        &mut self,
        slot_name: &str,
        compiled: CompiledPolicy,
        wasm: &[u8],
        config: String,
        activate: bool,
    ) -> Result<(Arc<Generation>, Ack), ApiError> {
        let digest = compiled.digest.clone();
        let slot = self.registry.slot(slot_name);
        let held_before: Vec<String> = slot
            .generations()
            .iter()
            .map(|g| g.digest().to_string())
            .collect();
        let generation = slot
            .load(
                compiled,
                (!config.is_empty()).then(|| config.clone()),
                None,
                None,
            )
            .map_err(|e| ApiError::InvalidArgument(format!("loading into `{slot_name}`: {e}")))?;
        if activate {
            slot.activate(generation.id).map_err(internal)?;
        }
        let mut writes = vec![
            Write::Put(format!("blob/{digest}"), wasm.to_vec()),
            self.slot_write(&slot)?,
        ];
        // A generation the slot pruned takes its component with it, unless
        // another generation (of any slot) still runs the same code.
        let held_now = self.digests_in_use();
        for gone in held_before {
            if !held_now.contains(&gone) {
                writes.push(Write::Delete(format!("blob/{gone}")));
            }
        }
        let ack = self.writer.send_durable(writes);
        Ok((generation, ack))
    }

    fn digests_in_use(&self) -> HashSet<String> {
        self.registry
            .slots()
            .iter()
            .flat_map(|s| s.generations())
            .map(|g| g.digest().to_string())
            .collect()
    }

    /// Refuses a component whose compiled code would take the tenant's slot
    /// over `tenant_code_bytes`, counting what the slot keeps once this one
    /// is loaded (the oldest inactive generation leaves a full slot) and
    /// each distinct component once.
    fn check_tenant_code(
        &self,
        tenant: &str,
        slot_name: &str,
        compiled: &CompiledPolicy,
    ) -> Result<(), ApiError> {
        let mut kept: Vec<(String, usize)> = Vec::new();
        if let Some(slot) = self.registry.find(slot_name) {
            let mut generations = slot.generations();
            if generations.len() >= slot.max_generations() {
                let active = slot.active_id();
                if let Some(oldest) = generations.iter().position(|g| Some(g.id) != active) {
                    generations.remove(oldest);
                }
            }
            for g in generations {
                if let Some(c) = g.compiled() {
                    kept.push((c.digest.clone(), c.code_bytes()));
                }
            }
        }
        kept.push((compiled.digest.clone(), compiled.code_bytes()));
        kept.sort();
        kept.dedup_by(|a, b| a.0 == b.0);
        let held: usize = kept.iter().map(|(_, bytes)| bytes).sum();
        let limit = self.cfg.tenant_code_bytes;
        if held > limit {
            return Err(ApiError::FailedPrecondition(format!(
                "tenant `{tenant}`'s policies would hold {held} bytes of compiled code with this one ({} bytes), over the tenant's {limit}; older generations leave the slot as new ones arrive",
                compiled.code_bytes()
            )));
        }
        Ok(())
    }

    /// A tenant's policies are charged to the tenant's memory account, so
    /// all its generations together stay within `tenant_memory_bytes`.
    fn charge_owner(&mut self, slot: &str, compiled: CompiledPolicy) -> CompiledPolicy {
        let Some(tenant) = slot_tenant(slot) else {
            return compiled;
        };
        let limit = self.cfg.tenant_memory_bytes;
        let account = self
            .tenant_memory
            .entry(tenant.to_string())
            .or_insert_with(|| MemoryAccount::new(format!("tenant:{tenant}"), limit));
        compiled.charged_to(Arc::clone(account))
    }

    /// The slot as persisted: generations in load order, by digest.
    fn slot_write(&self, slot: &PolicySlot) -> Result<Write, ApiError> {
        let generations = slot.generations();
        let active = slot.active_id();
        let record = SlotRecord {
            active: generations.iter().position(|g| Some(g.id) == active),
            generations: generations
                .iter()
                .map(|g| GenerationRecord {
                    id: g.id,
                    digest: g.digest().to_string(),
                    config: g.config.clone(),
                })
                .collect(),
        };
        Ok(Write::Put(
            format!("slot/{}", slot.name()),
            serde_json::to_vec(&record).map_err(internal)?,
        ))
    }

    fn check_slot_access(&self, caller: &Caller, slot: &str) -> Result<(), ApiError> {
        match caller {
            Caller::Admin => Ok(()),
            Caller::Tenant(t) if slot == tenant_slot(t) => Ok(()),
            Caller::Tenant(t) => Err(ApiError::PermissionDenied(format!(
                "tenant `{t}` may only use its own slot `{}`",
                tenant_slot(t)
            ))),
            Caller::Node => Err(node_token_refused()),
        }
    }

    fn find_slot(&self, caller: &Caller, slot: &str) -> Result<Arc<PolicySlot>, ApiError> {
        self.check_slot_access(caller, slot)?;
        self.registry
            .find(slot)
            .ok_or_else(|| ApiError::NotFound(format!("no policy slot `{slot}`")))
    }

    fn generation_info(&self, slot: &str, g: &Generation) -> v1::GenerationInfo {
        let active = self
            .registry
            .find(slot)
            .and_then(|s| s.active_id())
            .is_some_and(|id| id == g.id);
        v1::GenerationInfo {
            id: g.id,
            name: g.manifest().name.clone(),
            version: g.manifest().version.clone(),
            digest: g.digest().to_string(),
            roles: g.manifest().roles.clone(),
            active,
            quarantined: g.is_quarantined(),
            rounds_served: g.rounds_served(),
            faults: g.total_faults(),
            last_fault: g
                .last_fault()
                .map(|f| format!("epoch {}: {}", f.epoch, f.fault))
                .unwrap_or_default(),
            config: if g.config.is_empty() {
                g.manifest().default_config.clone()
            } else {
                g.config.clone()
            },
        }
    }

    pub fn slot_info(&self, caller: &Caller, slot: &str) -> Result<v1::SlotInfo, ApiError> {
        let s = self.find_slot(caller, slot)?;
        Ok(v1::SlotInfo {
            slot: slot.to_string(),
            generations: s
                .generations()
                .iter()
                .map(|g| self.generation_info(slot, g))
                .collect(),
        })
    }

    pub fn list_policies(&self, caller: &Caller) -> Vec<v1::SlotInfo> {
        self.registry
            .slots()
            .iter()
            .filter(|s| self.check_slot_access(caller, s.name()).is_ok())
            .filter_map(|s| self.slot_info(caller, s.name()).ok())
            .collect()
    }

    pub fn swap(
        &mut self,
        caller: &Caller,
        slot: &str,
        generation: u64,
    ) -> Result<(v1::SlotInfo, Ack), ApiError> {
        let s = self.find_slot(caller, slot)?;
        if slot == DEFAULT_SLOT && self.experiment.is_some() {
            return Err(ApiError::FailedPrecondition(
                "an experiment is running; promote or abort it first".into(),
            ));
        }
        s.activate(generation)
            .map_err(|e| ApiError::NotFound(e.to_string()))?;
        let ack = self.writer.send_durable(vec![self.slot_write(&s)?]);
        Ok((self.slot_info(caller, slot)?, ack))
    }

    pub fn rollback(
        &mut self,
        caller: &Caller,
        slot: &str,
        generation: u64,
    ) -> Result<(v1::SlotInfo, Ack), ApiError> {
        let s = self.find_slot(caller, slot)?;
        s.rollback((generation != 0).then_some(generation))
            .map_err(|e| ApiError::FailedPrecondition(e.to_string()))?;
        let ack = self.writer.send_durable(vec![self.slot_write(&s)?]);
        Ok((self.slot_info(caller, slot)?, ack))
    }

    pub fn policy_stats(&self, caller: &Caller, slot: &str) -> Result<v1::PolicyStats, ApiError> {
        let info = self.slot_info(caller, slot)?;
        let mut merged = Histogram::default();
        let mut any = false;
        for ((s, _), h) in &self.metrics.latency {
            if s == slot {
                merged = merge(&merged, h);
                any = true;
            }
        }
        let cells: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.slot.name() == slot)
            .collect();
        Ok(v1::PolicyStats {
            slot: slot.to_string(),
            rounds: cells
                .iter()
                .map(|c| self.metrics.rounds.get(&c.arm).copied().unwrap_or(0))
                .sum(),
            fallbacks: cells
                .iter()
                .map(|c| self.metrics.fallbacks.get(&c.arm).copied().unwrap_or(0))
                .sum(),
            latency_p50_ms: if any { merged.quantile(0.5) * 1e3 } else { 0.0 },
            latency_p99_ms: if any {
                merged.quantile(0.99) * 1e3
            } else {
                0.0
            },
            generations: info.generations,
        })
    }

    // ------------------------------------------------------------ experiments

    pub fn start_experiment(
        &mut self,
        caller: &Caller,
        req: &v1::StartExperimentRequest,
    ) -> Result<(v1::ExperimentStatus, Ack), ApiError> {
        Self::require_admin(caller)?;
        if let Some(e) = &self.experiment {
            return Err(ApiError::FailedPrecondition(format!(
                "experiment `{}` is running; promote or abort it first",
                e.record.name
            )));
        }
        if req.name.is_empty() {
            return Err(ApiError::InvalidArgument("experiment name is empty".into()));
        }
        if self.experiments.contains_key(&req.name) {
            return Err(ApiError::AlreadyExists(format!(
                "experiment `{}` exists",
                req.name
            )));
        }
        let mode = match v1::ExperimentMode::try_from(req.mode) {
            Ok(v1::ExperimentMode::Split) => Mode::Split,
            Ok(v1::ExperimentMode::Shadow) => Mode::Shadow,
            _ => {
                return Err(ApiError::InvalidArgument(
                    "mode must be SPLIT or SHADOW".into(),
                ));
            }
        };
        if req.candidate_slot.is_empty()
            || req.candidate_slot == DEFAULT_SLOT
            || req.candidate_slot.starts_with("tenant:")
        {
            return Err(ApiError::InvalidArgument(
                "candidate_slot must name a loaded scheduler slot other than `default`".into(),
            ));
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
        let guardrail = GuardrailRecord::from_proto(req.guardrail.as_ref())
            .map_err(ApiError::InvalidArgument)?;
        let record = ExperimentRecord {
            name: req.name.clone(),
            mode,
            state: ExperimentState::Running,
            candidate_slot: req.candidate_slot.clone(),
            candidate_tenants: req.candidate_tenants.clone(),
            candidate_share: share,
            guardrail,
            reason: String::new(),
            started_ms: now_ms(),
            ended_ms: 0,
            seed: rand::random(),
            first_job: self.next_id,
        };
        self.activate_experiment(record.clone(), None)?;
        let ack = self.persist_experiment(&record);
        Ok((self.experiment_status(&record.name)?, ack))
    }

    fn activate_experiment(
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
    fn enrolled_job_stats(
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
        let mut starts: Vec<&&StoredJob> =
            enrolled.iter().filter(|j| j.first_start_ms > 0).collect();
        starts.sort_unstable_by_key(|j| (j.first_start_ms, j.id));
        for j in starts {
            let delay = j.first_start_ms.saturating_sub(j.submit_ms) as f64;
            stats
                .entry(arm_or_control(&j.arm))
                .or_default()
                .jobs
                .started(delay);
        }
        let mut ends: Vec<&&StoredJob> = enrolled
            .iter()
            .filter(|j| j.status == JobStatus::Succeeded && j.first_start_ms > 0)
            .collect();
        ends.sort_unstable_by_key(|j| (j.end_ms, j.id));
        for j in ends {
            let jct = j.end_ms.saturating_sub(j.submit_ms) as f64;
            stats
                .entry(arm_or_control(&j.arm))
                .or_default()
                .jobs
                .finished(jct, j.spec.deadline_ms);
        }
        (stats, assigner)
    }

    /// Persists the running experiment's round stats and evidence if they
    /// changed (once a tick at most).
    fn persist_experiment_rounds(&mut self) {
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
    fn persist_experiment_with_status(
        &self,
        record: &ExperimentRecord,
        status: &v1::ExperimentStatus,
    ) -> Ack {
        self.persist_experiment_writes(
            record,
            Some(Write::Put(
                format!("{FINISHED_STATUS_PREFIX}{}", record.name),
                prost::Message::encode_to_vec(status),
            )),
        )
    }

    fn persist_experiment(&self, record: &ExperimentRecord) -> Ack {
        self.persist_experiment_writes(record, None)
    }

    fn persist_experiment_writes(&self, record: &ExperimentRecord, also: Option<Write>) -> Ack {
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
    fn end_experiment(&mut self, state: ExperimentState, reason: String) -> Option<Ack> {
        let mut exp = self.experiment.take()?;
        exp.record.state = state;
        exp.record.reason = reason;
        exp.record.ended_ms = now_ms();
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

    pub fn promote(
        &mut self,
        caller: &Caller,
        name: &str,
    ) -> Result<(v1::ExperimentStatus, Ack), ApiError> {
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
        Ok((self.experiment_status(name)?, ack))
    }

    pub fn abort(
        &mut self,
        caller: &Caller,
        name: &str,
    ) -> Result<(v1::ExperimentStatus, Ack), ApiError> {
        Self::require_admin(caller)?;
        self.running_named(name)?;
        let ack = self
            .end_experiment(ExperimentState::Aborted, "aborted by request".into())
            .ok_or_else(|| internal("experiment vanished"))?;
        Ok((self.experiment_status(name)?, ack))
    }

    fn running_named(&self, name: &str) -> Result<(), ApiError> {
        match &self.experiment {
            Some(e) if e.record.name == name => Ok(()),
            _ if self.experiments.contains_key(name) => Err(ApiError::FailedPrecondition(format!(
                "experiment `{name}` is not running"
            ))),
            _ => Err(ApiError::NotFound(format!("no experiment `{name}`"))),
        }
    }

    pub fn experiment_status(&self, name: &str) -> Result<v1::ExperimentStatus, ApiError> {
        if let Some(e) = self.experiment.as_ref().filter(|e| e.record.name == name) {
            return Ok(self.status_of(e));
        }
        if let Some(s) = self.finished_status.get(name) {
            let mut s = s.clone();
            if let Some(r) = self.experiments.get(name) {
                s.state = experiment_state(r.state) as i32;
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

    pub fn list_experiments(&self) -> Vec<v1::ExperimentStatus> {
        let mut names: Vec<&String> = self.experiments.keys().collect();
        if let Some(e) = &self.experiment {
            names.push(&e.record.name);
        }
        names
            .into_iter()
            .filter_map(|n| self.experiment_status(n).ok())
            .collect()
    }

    fn status_of(&self, e: &Experiment) -> v1::ExperimentStatus {
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
        status.comparison = e.comparison.map(|c| v1::Comparison {
            metric: e.record.guardrail.metric.clone(),
            difference: c.difference,
            ci_low: c.low,
            ci_high: c.high,
            always_valid_p: c.p,
        });
        status.balance = e.assigner.as_ref().map(|coin| {
            let b = coin.balance;
            let p = coin.sample_ratio_p();
            v1::Balance {
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
            status.shadow = Some(s.to_proto());
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
    fn check_guardrail(&mut self) {
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

    // ------------------------------------------------------------ nodes & cluster

    pub fn list_nodes(&self) -> Vec<v1::NodeInfo> {
        self.nodes
            .iter()
            .map(|n| {
                let (arm, free, gpu_health, host) = self
                    .cells
                    .iter()
                    .find_map(|c| {
                        c.state.node_index(&n.request.name).map(|i| {
                            let cluster = c.state.cluster();
                            let plan = Plan::new(cluster);
                            let health = cluster
                                .node(i)
                                .gpus()
                                .map(|g| u32::from(g.health()))
                                .collect();
                            let m = cluster.node_metrics(i);
                            let host = (m.host_memory_used_mib > 0).then(|| v1::HostLoad {
                                cpu_utilization_pct: u32::from(m.cpu_utilization_pct),
                                memory_used_mib: m.host_memory_used_mib,
                                // Not part of the cluster view's node metric.
                                memory_total_mib: 0,
                                swap_in_per_s: m.swap_in_per_s,
                            });
                            (c.arm.clone(), plan.node_idle_gpus(i), health, host)
                        })
                    })
                    .unwrap_or_default();
                v1::NodeInfo {
                    name: n.request.name.clone(),
                    pool: n.request.pool.clone(),
                    gpu_model: n.request.gpu_model.clone(),
                    gpus: n.request.gpu_count,
                    gpus_free: free,
                    state: match n.status {
                        NodeStatus::Ready => "ready",
                        NodeStatus::Draining => "draining",
                        NodeStatus::Lost => "lost",
                        NodeStatus::Reclaimed => "reclaimed",
                    }
                    .into(),
                    on_loan: n.request.on_loan,
                    arm: if self.experiment.is_some() {
                        arm
                    } else {
                        String::new()
                    },
                    kind: match n.kind {
                        NodeKind::Simulated => "simulated",
                        NodeKind::Agent => "agent",
                    }
                    .into(),
                    gpu_health,
                    host,
                }
            })
            .collect()
    }

    pub fn drain(&mut self, caller: &Caller, name: &str) -> Result<(v1::NodeInfo, Ack), ApiError> {
        Self::require_admin(caller)?;
        self.node_mut(name)?;
        self.set_drained(name, NodeStatus::Draining, model::node_state::CORDONED)
    }

    /// Undoes a drain: a draining node takes new work again (a lost or
    /// reclaimed node is not the operator's to bring back this way).
    pub fn undrain(
        &mut self,
        caller: &Caller,
        name: &str,
    ) -> Result<(v1::NodeInfo, Ack), ApiError> {
        Self::require_admin(caller)?;
        let node = self.node_mut(name)?;
        match node.status {
            NodeStatus::Draining => {}
            NodeStatus::Ready => {
                return Err(ApiError::FailedPrecondition(format!(
                    "node `{name}` is not draining"
                )));
            }
            other => {
                return Err(ApiError::FailedPrecondition(format!(
                    "node `{name}` is {other:?}, not draining"
                )));
            }
        }
        self.set_drained(name, NodeStatus::Ready, model::node_state::READY)
    }

    /// Records a node's drain state: in the pool, in its cell, in the store.
    fn set_drained(
        &mut self,
        name: &str,
        status: NodeStatus,
        cell_state: u8,
    ) -> Result<(v1::NodeInfo, Ack), ApiError> {
        self.node_mut(name)?.status = status;
        for cell in &mut self.cells {
            if cell.state.node_index(name).is_some() {
                cell.state
                    .set_node_state(name, cell_state)
                    .map_err(internal)?;
            }
        }
        let bytes = serde_json::to_vec(&status).map_err(internal)?;
        let ack = self
            .writer
            .send_durable(vec![Write::Put(format!("node/{name}"), bytes)]);
        let info = self
            .list_nodes()
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| internal("the node vanished"))?;
        Ok((info, ack))
    }

    fn node_mut(&mut self, name: &str) -> Result<&mut PoolNode, ApiError> {
        self.nodes
            .iter_mut()
            .find(|n| n.request.name == name)
            .ok_or_else(|| ApiError::NotFound(format!("no node `{name}`")))
    }

    /// The node `name`'s info as listed.
    fn node_info(&self, name: &str) -> Result<v1::NodeInfo, ApiError> {
        self.list_nodes()
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| ApiError::NotFound(format!("no node `{name}`")))
    }

    /// Persists a node's status and loan (restored at start-up).
    fn node_write(node: &PoolNode) -> Result<Vec<Write>, ApiError> {
        let name = &node.request.name;
        Ok(vec![
            Write::Put(
                format!("node/{name}"),
                serde_json::to_vec(&node.status).map_err(internal)?,
            ),
            Write::Put(
                format!("loan/{name}"),
                serde_json::to_vec(&node.request.on_loan).map_err(internal)?,
            ),
        ])
    }

    /// Lends a node to training: schedulable again, and a reclaim candidate.
    pub fn lend(&mut self, caller: &Caller, name: &str) -> Result<(v1::NodeInfo, Ack), ApiError> {
        Self::require_admin(caller)?;
        let node = self.node_mut(name)?;
        if matches!(node.status, NodeStatus::Lost | NodeStatus::Draining) {
            return Err(ApiError::FailedPrecondition(format!(
                "node `{name}` is {:?}; only a ready or reclaimed node can be lent",
                node.status
            )));
        }
        node.request.on_loan = true;
        node.status = NodeStatus::Ready;
        let writes = Self::node_write(node)?;
        for cell in &mut self.cells {
            if cell.state.node_index(name).is_some() {
                cell.state.set_node_loan(name, true).map_err(internal)?;
                cell.state
                    .set_node_state(name, model::node_state::READY)
                    .map_err(internal)?;
            }
        }
        let ack = self.writer.send_durable(writes);
        tracing::info!(node = name, "node lent to training");
        Ok((self.node_info(name)?, ack))
    }

    /// Takes `count` on-loan nodes of `pool` back through the host core's
    /// reclaim driver: each cell's scheduling slot answers (its `reclaim`
    /// role), or the native Smallest-Count-First plan. The plan's preemptions
    /// and scale-ins are reconciled like a round's; the returned nodes are
    /// cordoned and no longer on loan.
    pub fn reclaim(
        &mut self,
        caller: &Caller,
        pool: &str,
        count: u32,
    ) -> Result<(v1::ReclaimNodesResponse, Ack), ApiError> {
        Self::require_admin(caller)?;
        if count == 0 {
            return Err(ApiError::InvalidArgument("count must be at least 1".into()));
        }
        let on_loan: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| {
                n.request.pool == pool && n.request.on_loan && n.status == NodeStatus::Ready
            })
            .map(|n| n.request.name.clone())
            .collect();
        if on_loan.len() < count as usize {
            return Err(ApiError::FailedPrecondition(format!(
                "pool `{pool}` has {} node(s) on loan, {count} asked back",
                on_loan.len()
            )));
        }
        let now = now_ms();
        let mut response = v1::ReclaimNodesResponse::default();
        let mut remaining = count;
        let mut writes = Vec::new();
        for index in 0..self.cells.len() {
            if remaining == 0 {
                break;
            }
            let cell = &mut self.cells[index];
            let candidates: Vec<u32> = on_loan
                .iter()
                .filter_map(|name| cell.state.node_index(name))
                .collect();
            if candidates.is_empty() {
                continue;
            }
            let take = remaining.min(candidates.len() as u32);
            cell.state.set_now(now);
            let driver = ReclaimDriver::new(Arc::clone(&cell.slot));
            let outcome =
                driver.reclaim(&mut cell.state, &candidates, take, self.cfg.max_decisions);
            let returned: Vec<String> = outcome
                .plan
                .nodes
                .iter()
                .map(|&i| cell.state.cluster().node(i).name().to_string())
                .collect();
            let applied = if outcome.plan.decisions.is_empty() {
                Applied::default()
            } else {
                cell.state
                    .apply(outcome.plan.decisions.clone())
                    .map_err(internal)?
            };
            for name in &returned {
                cell.state.set_node_loan(name, false).map_err(internal)?;
                cell.state
                    .set_node_state(name, model::node_state::CORDONED)
                    .map_err(internal)?;
            }
            let changes = Changes::read(cell, &applied);
            let slot = cell.slot.name().to_string();
            response.preempted.extend(changes.preempted.iter().copied());
            response.scaled_in.extend(
                applied
                    .resized
                    .iter()
                    .filter_map(|l| cell.global.get(l).copied()),
            );
            if response.served.is_empty() || outcome.served != Served::Native {
                response.served = outcome.served.label().to_string();
            }
            for (generation, fault) in &outcome.faults {
                let g = generation_label(*generation);
                response.faults.push(format!("{g}: {fault}"));
                self.metrics.count_fault(&slot, *generation, fault.kind());
            }
            self.reconcile(changes, now);
            for name in &returned {
                if let Some(node) = self.nodes.iter_mut().find(|n| &n.request.name == name) {
                    node.request.on_loan = false;
                    node.status = NodeStatus::Reclaimed;
                    writes.extend(Self::node_write(node)?);
                }
            }
            tracing::info!(
                cell = %self.cells[index].arm,
                returned = ?returned,
                served = outcome.served.label(),
                "nodes reclaimed"
            );
            remaining -= take;
            response.returned.extend(returned);
        }
        let ack = self.writer.send_durable(writes);
        Ok((response, ack))
    }

    pub fn view(&self) -> v1::ClusterView {
        let count = |s: JobStatus| self.count(s);
        let (mut alloc, mut gpus) = (0.0, 0u32);
        for c in &self.cells {
            let g = c.state.cluster().gpu_count() as u32;
            alloc += c.state.gpu_allocation_pct() * f64::from(g);
            gpus += g;
        }
        let default = self.registry.find(DEFAULT_SLOT);
        v1::ClusterView {
            epoch: self.cells.first().map_or(0, |c| c.state.epoch()),
            now_ms: now_ms(),
            nodes: self.nodes.len() as u32,
            gpus,
            gpu_allocation_pct: if gpus == 0 {
                0.0
            } else {
                alloc / f64::from(gpus)
            },
            jobs_queued: count(JobStatus::Queued),
            jobs_pending: count(JobStatus::Pending),
            jobs_running: count(JobStatus::Running),
            jobs_finished: count(JobStatus::Succeeded)
                + count(JobStatus::Failed)
                + count(JobStatus::Cancelled),
            active_policy: default
                .as_ref()
                .and_then(|s| s.active())
                .map(|g| g.manifest().name.clone())
                .unwrap_or_default(),
            active_generation: default.and_then(|s| s.active_id()).unwrap_or(0),
            experiment: self
                .experiment
                .as_ref()
                .map(|e| e.record.name.clone())
                .unwrap_or_default(),
            rounds: self.rounds,
            quarantined: self
                .registry
                .slots()
                .iter()
                .flat_map(|slot| {
                    slot.generations()
                        .into_iter()
                        .filter(|g| g.is_quarantined())
                        .map(|g| v1::QuarantinedGeneration {
                            slot: slot.name().to_string(),
                            generation: g.id,
                            name: g.manifest().name.clone(),
                            faults: g.total_faults(),
                            last_fault: g
                                .last_fault()
                                .map(|f| f.fault.to_string())
                                .unwrap_or_default(),
                            active: slot.active_id() == Some(g.id),
                        })
                        .collect::<Vec<_>>()
                })
                .collect(),
        }
    }

    /// Total time spent journaling and in rounds, in seconds (for the
    /// journal-overhead benchmark).
    pub fn journal_and_round_seconds(&self) -> (f64, f64) {
        let rounds = self
            .metrics
            .round_latency
            .values()
            .map(Histogram::sum)
            .sum();
        (self.metrics.journal.sum(), rounds)
    }

    /// The metrics exposition (OpenMetrics text).
    pub fn metrics_text(&self) -> String {
        let mut e = Exposition::new();
        let view = self.view();
        e.counter(
            "arbiter_rounds",
            "Scheduling rounds run, by cell.",
            self.metrics
                .rounds
                .iter()
                .map(|(cell, n)| (vec![("cell", cell.as_str())], *n)),
        );
        e.histogram(
            "arbiter_round_seconds",
            "Whole-round latency (delta, policy, validation, apply), by cell.",
            self.metrics
                .round_latency
                .iter()
                .map(|(cell, h)| (vec![("cell", cell.as_str())], h)),
        );
        e.histogram(
            "arbiter_policy_seconds",
            "Time inside the answering policy per round, by slot and generation.",
            self.metrics.latency.iter().map(|((slot, generation), h)| {
                (
                    vec![("slot", slot.as_str()), ("generation", generation.as_str())],
                    h,
                )
            }),
        );
        e.counter(
            "arbiter_policy_faults",
            "Policy faults, by slot, generation and kind.",
            self.metrics
                .faults
                .iter()
                .map(|((slot, generation, kind), n)| {
                    (
                        vec![
                            ("slot", slot.as_str()),
                            ("generation", generation.as_str()),
                            ("kind", kind.as_str()),
                        ],
                        *n,
                    )
                }),
        );
        let slots = self.registry.slots();
        let quarantined: Vec<(String, String, bool)> = slots
            .iter()
            .flat_map(|slot| {
                slot.generations().into_iter().map(|g| {
                    (
                        slot.name().to_string(),
                        g.id.to_string(),
                        g.is_quarantined(),
                    )
                })
            })
            .collect();
        e.gauge(
            "arbiter_policy_quarantined",
            "1 for a loaded generation that is quarantined (never served, never rolled back to), by slot and generation.",
            quarantined.iter().map(|(slot, generation, q)| {
                (
                    vec![("slot", slot.as_str()), ("generation", generation.as_str())],
                    GaugeValue::Int(i64::from(*q)),
                )
            }),
        );
        e.counter(
            "arbiter_fallback_rounds",
            "Rounds served by an older generation or the native policy, by cell.",
            self.metrics
                .fallbacks
                .iter()
                .map(|(cell, n)| (vec![("cell", cell.as_str())], *n)),
        );
        e.histogram(
            "arbiter_journal_append_seconds",
            "Encoding and appending one decision-journal record.",
            [(vec![], &self.metrics.journal)],
        );
        e.counter(
            "arbiter_node_updates",
            "Updates of running jobs acknowledged by node agents, by outcome.",
            self.metrics
                .node_updates
                .iter()
                .map(|(outcome, n)| (vec![("outcome", *outcome)], *n)),
        );
        e.counter(
            "arbiter_tenant_policy_faults",
            "Tenant policy faults.",
            [(vec![], self.tenant_faults)],
        );
        e.gauge(
            "arbiter_tenant_policy_memory_bytes",
            "Memory the tenant's policy instances hold (limit: the plane's tenant memory budget).",
            self.tenant_memory.iter().map(|(tenant, account)| {
                (
                    vec![("tenant", tenant.as_str())],
                    GaugeValue::Int(account.used() as i64),
                )
            }),
        );
        // One name per job state, as the API names them.
        let states = [
            JobStatus::Queued,
            JobStatus::Pending,
            JobStatus::Running,
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ];
        e.gauge(
            "arbiter_jobs",
            "Jobs in the job table by state (ended ones until retention drops them).",
            states.map(|s| {
                (
                    vec![("state", s.name())],
                    GaugeValue::Int(self.count(s) as i64),
                )
            }),
        );
        e.counter(
            "arbiter_jobs_ended",
            "Jobs that ended since the plane started, by final state.",
            self.metrics
                .jobs_ended
                .iter()
                .map(|(state, n)| (vec![("state", *state)], *n)),
        );
        e.counter(
            "arbiter_jobs_dropped",
            "Ended jobs dropped from the job table and the store by retention.",
            [(vec![], self.metrics.jobs_dropped)],
        );
        e.gauge(
            "arbiter_gpu_allocation_ratio",
            "Allocated share of GPU capacity (0 to 1).",
            [(vec![], GaugeValue::Float(view.gpu_allocation_pct / 100.0))],
        );
        // Per tenant: GPUs its released jobs hold or claim, and its quota.
        let mut claimed: BTreeMap<&str, u64> = BTreeMap::new();
        for j in self.released() {
            *claimed.entry(j.tenant.as_str()).or_default() += u64::from(j.spec.gpus);
        }
        e.gauge(
            "arbiter_tenant_gpus",
            "GPUs a tenant's pending and running jobs ask for.",
            claimed
                .iter()
                .map(|(t, n)| (vec![("tenant", *t)], GaugeValue::Int(*n as i64))),
        );
        e.gauge(
            "arbiter_tenant_quota_gpus",
            "A tenant's GPU quota (0: none).",
            self.tenants.values().map(|t| {
                (
                    vec![("tenant", t.name.as_str())],
                    GaugeValue::Int(i64::from(t.quota_gpus)),
                )
            }),
        );
        let nodes = self.list_nodes();
        e.gauge(
            "arbiter_node_gpus_free",
            "Idle GPUs on a node, by node and state.",
            nodes.iter().map(|n| {
                (
                    vec![("node", n.name.as_str()), ("state", n.state.as_str())],
                    GaugeValue::Int(i64::from(n.gpus_free)),
                )
            }),
        );
        e.gauge(
            "arbiter_node_gpus",
            "GPUs on a node, by node and state.",
            nodes.iter().map(|n| {
                (
                    vec![("node", n.name.as_str()), ("state", n.state.as_str())],
                    GaugeValue::Int(i64::from(n.gpus)),
                )
            }),
        );
        let journal_bytes =
            std::fs::metadata(self.data.join("journal.jsonl")).map_or(0, |m| m.len());
        e.gauge(
            "arbiter_journal_bytes",
            "Size of the decision journal.",
            [(vec![], GaugeValue::Int(journal_bytes as i64))],
        );
        if let Some(exp) = &self.experiment {
            // One metric per unit: seconds, ratios and counts never share a gauge.
            let status = self.status_of(exp);
            let mean = |x: &Option<v1::Estimate>, scale: f64| {
                GaugeValue::Float(x.as_ref().map_or(0.0, |e| e.mean * scale))
            };
            let labels = |arm: &str| {
                vec![
                    ("experiment", exp.record.name.clone()),
                    ("arm", arm.to_string()),
                ]
            };
            // (metric, help, which estimate, scale to the metric's unit)
            let gauges: [(&str, &str, ArmEstimate, f64); 5] = [
                (
                    "arbiter_experiment_queue_delay_seconds",
                    "Mean queue delay of an arm's enrolled jobs.",
                    |a| &a.queue_delay_ms,
                    1e-3,
                ),
                (
                    "arbiter_experiment_jct_seconds",
                    "Mean completion time of an arm's enrolled jobs.",
                    |a| &a.jct_ms,
                    1e-3,
                ),
                (
                    "arbiter_experiment_gpu_allocation_ratio",
                    "Mean allocated share of an arm's GPUs per round (0 to 1).",
                    |a| &a.gpu_allocation_pct,
                    1e-2,
                ),
                (
                    "arbiter_experiment_fragmentation_ratio",
                    "Mean stranded share of an arm's free GPU capacity per round (0 to 1).",
                    |a| &a.fragmentation_pct,
                    1e-2,
                ),
                (
                    "arbiter_experiment_policy_latency_seconds",
                    "Mean time in the arm's policy per round.",
                    |a| &a.policy_latency_ms,
                    1e-3,
                ),
            ];
            for (name, help, estimate, scale) in &gauges {
                let rows: Vec<(Vec<(&str, String)>, GaugeValue)> = status
                    .arms
                    .iter()
                    .map(|a| (labels(&a.arm), mean(estimate(a), *scale)))
                    .collect();
                e.gauge(
                    name,
                    help,
                    rows.iter()
                        .map(|(l, v)| (l.iter().map(|(k, v)| (*k, v.as_str())).collect(), *v)),
                );
            }
            let mut counts: Vec<(Vec<(&str, String)>, u64)> = Vec::new();
            for a in &status.arms {
                for (event, n) in [
                    ("enrolled", a.jobs_submitted),
                    ("started", a.jobs_started),
                    ("finished", a.jobs_finished),
                    ("preempted", a.preemptions),
                    ("slo_violation", a.slo_violations),
                    ("policy_fault", a.policy_faults),
                ] {
                    let mut l = labels(&a.arm);
                    l.push(("event", event.to_string()));
                    counts.push((l, n));
                }
            }
            e.counter(
                "arbiter_experiment_events",
                "Counts in an arm of the running experiment, by event.",
                counts
                    .iter()
                    .map(|(l, n)| (l.iter().map(|(k, v)| (*k, v.as_str())).collect(), *n)),
            );
        }
        e.finish()
    }

    // ------------------------------------------------------------ node agents

    /// Registers (or re-registers) a node agent; returns its session id and
    /// what it must be told first. Surviving workloads it reports are adopted.
    pub fn register_node(
        &mut self,
        caller: &Caller,
        hello: &v1::NodeHello,
        tx: tokio::sync::mpsc::UnboundedSender<v1::HostMessage>,
    ) -> Result<u64, ApiError> {
        if let Caller::Tenant(t) = caller {
            return Err(ApiError::PermissionDenied(format!(
                "tenant `{t}` may not register nodes; agents use the node token"
            )));
        }
        let request = hello_request(hello).map_err(ApiError::InvalidArgument)?;
        let name = request.name.clone();
        if self
            .nodes
            .iter()
            .any(|n| n.request.name == name && n.kind == NodeKind::Simulated)
        {
            return Err(ApiError::AlreadyExists(format!(
                "`{name}` is a simulated node of the embedded pool"
            )));
        }
        // One live agent per name: a second agent (another instance id) is refused while the
        // first is connected and heard from within `lost_after`, so two machines configured
        // with the same name cannot take the node from each other in turn (each launch would
        // land on whichever connected last). The same agent reconnecting (its instance id,
        // which `arbiter node` keeps in its state directory) takes its session over at once.
        if let Some(n) = self.nodes.iter().find(|n| n.request.name == name)
            && let Some(link) = &n.link
            && n.last_seen.elapsed() < self.cfg.lost_after
            && (hello.instance.is_empty() || hello.instance != link.instance)
        {
            return Err(ApiError::AlreadyExists(format!(
                "node `{name}` is connected from another agent (instance `{}`); another agent \
                 may take the name once it has been silent for {:?}",
                link.instance, self.cfg.lost_after
            )));
        }
        let session = self.next_session;
        self.next_session += 1;
        let now = std::time::Instant::now();
        // The welcome goes first: reconciliation below may already send stops.
        let _ = tx.send(v1::HostMessage {
            body: Some(v1::host_message::Body::Welcome(v1::Welcome {
                heartbeat_ms: self.cfg.heartbeat.as_millis() as u32,
                lost_after_ms: self.cfg.lost_after.as_millis() as u32,
            })),
        });
        let link = AgentLink {
            instance: hello.instance.clone(),
            session,
            tx,
            last_seen: now,
        };
        match self.nodes.iter_mut().find(|n| n.request.name == name) {
            Some(n) => {
                // A reconnect keeps what the operator decided about the
                // node's loan (a reclaimed node stays reclaimed).
                let on_loan = n.request.on_loan;
                n.request = request.clone();
                n.request.on_loan = on_loan;
                if n.status != NodeStatus::Reclaimed {
                    n.status = NodeStatus::Ready;
                }
                n.link = Some(link);
                n.last_seen = now;
            }
            None => self.nodes.push(PoolNode {
                request: request.clone(),
                status: NodeStatus::Ready,
                kind: NodeKind::Agent,
                link: Some(link),
                last_seen: now,
            }),
        }
        let record = AgentRecord {
            name: name.clone(),
            pool: request.pool.clone(),
            cpu_milli: request.cpu_milli,
            memory_mib: request.memory_mib,
            gpu_model: request.gpu_model.clone(),
            gpu_memory_mib: request.gpu_memory_mib,
            gpu_count: request.gpu_count,
        };
        if let Ok(bytes) = serde_json::to_vec(&record) {
            self.writer.send(Write::Put(format!("agent/{name}"), bytes));
        }
        if self
            .nodes
            .iter()
            .any(|n| n.request.name == name && n.status == NodeStatus::Ready)
        {
            self.writer.send(Write::Delete(format!("node/{name}")));
        }
        // Reconcile what the node still runs with what the host believes.
        let reported: HashMap<u64, &v1::WorkloadReport> =
            hello.workloads.iter().map(|w| (w.job_id, w)).collect();
        let believed: Vec<u64> = self
            .released()
            .filter(|j| {
                j.status == JobStatus::Running && j.placement.iter().any(|w| w.node == name)
            })
            .map(|j| j.id)
            .collect();
        let mut requeue = Vec::new();
        for id in &believed {
            match reported.get(id) {
                Some(w) if w.running => {
                    tracing::info!(node = %name, job = id, pid = w.pid, "workload adopted");
                }
                Some(w) => {
                    let status = if w.exit_code == 0 {
                        JobStatus::Succeeded
                    } else {
                        JobStatus::Failed
                    };
                    self.remove_from_cell(*id);
                    drop(self.finish_job(
                        *id,
                        status,
                        &format!("exited with {} while the node was away", w.exit_code),
                    ));
                }
                None => requeue.push(*id),
            }
        }
        for w in &hello.workloads {
            if w.running && !believed.contains(&w.job_id) {
                self.send_to(
                    &name,
                    v1::host_message::Body::Stop(v1::Stop {
                        job_id: w.job_id,
                        reason: "not running here according to the control plane".into(),
                    }),
                );
            }
        }
        for id in requeue {
            self.requeue(id, &format!("lost on `{name}` while the node was away"));
        }
        self.rebuild_cells();
        tracing::info!(node = %name, session, gpus = hello.gpus.len(), "node agent registered");
        Ok(session)
    }

    /// Drops every node stream (shutdown); agents reconnect to the next host.
    pub fn disconnect_agents(&mut self) {
        for n in &mut self.nodes {
            n.link = None;
        }
    }

    fn agent_mut(&mut self, name: &str, session: u64) -> Option<&mut PoolNode> {
        self.nodes.iter_mut().find(|n| {
            n.request.name == name && n.link.as_ref().is_some_and(|l| l.session == session)
        })
    }

    /// An agent's answer to an `Update`: counted, and logged when refused.
    pub fn node_update_ack(&mut self, name: &str, session: u64, ack: &v1::UpdateAck) {
        if self.agent_mut(name, session).is_none() {
            return;
        }
        let outcome = if ack.ok { "applied" } else { "refused" };
        *self.metrics.node_updates.entry(outcome).or_default() += 1;
        if ack.ok {
            tracing::debug!(
                node = name,
                job = ack.job_id,
                seq = ack.seq,
                "update applied"
            );
        } else {
            tracing::warn!(node = name, job = ack.job_id, seq = ack.seq, message = %ack.message, "update refused");
        }
    }

    /// A heartbeat from a node agent's current session.
    pub fn node_heartbeat(&mut self, name: &str, session: u64, hb: &v1::Heartbeat) {
        let now = std::time::Instant::now();
        let Some(node) = self.agent_mut(name, session) else {
            return;
        };
        node.last_seen = now;
        if let Some(l) = node.link.as_mut() {
            l.last_seen = now;
        }
        for cell in &mut self.cells {
            let Some(index) = cell.state.node_index(name) else {
                continue;
            };
            let range = cell.state.cluster().node(index).gpu_range();
            let metrics: Vec<model::GpuMetric> = hb
                .gpus
                .iter()
                .filter(|g| g.index < range.len() as u32)
                .map(|g| model::GpuMetric {
                    gpu: range.start + g.index,
                    utilization_pct: g.utilization_pct.min(100) as u8,
                    sm_activity_pct: g.sm_activity_pct.min(100) as u8,
                    memory_used_mib: g.memory_used_mib,
                    sm_occupancy_pct: 0, // not in the heartbeat
                })
                .collect();
            if let Some(h) = &hb.host {
                let metric = model::NodeMetric {
                    node: index,
                    cpu_utilization_pct: h.cpu_utilization_pct.min(100) as u8,
                    host_memory_used_mib: h.memory_used_mib,
                    swap_in_per_s: h.swap_in_per_s,
                };
                if let Err(e) = cell.state.record_node_metrics(vec![metric]) {
                    tracing::warn!(node = name, error = %e, "host load refused");
                }
            }
            // Per-GPU health into the cluster view (contract 0.3's G8, MuxFlow's
            // X10): shared work goes only on healthy GPUs, guaranteed work is
            // unaffected, and the node stays open for both.
            for g in hb.gpus.iter().filter(|g| g.index < range.len() as u32) {
                let health = u8::try_from(g.health).unwrap_or(u8::MAX);
                if let Err(e) = cell.state.set_gpu_health(name, g.index, health) {
                    tracing::warn!(node = name, gpu = g.index, error = %e, "GPU health refused");
                }
            }
            if !metrics.is_empty()
                && let Err(e) = cell.state.record_gpu_metrics(metrics)
            {
                tracing::warn!(node = name, error = %e, "GPU metrics refused");
            }
        }
        self.record_job_samples(name, &hb.jobs);
    }

    /// A workload event from a node agent.
    pub fn node_event(&mut self, name: &str, session: u64, ev: &v1::WorkloadEvent) {
        if self.agent_mut(name, session).is_none() {
            return;
        }
        let here = self.jobs.get(&ev.job_id).is_some_and(|j| {
            j.status == JobStatus::Running && j.placement.iter().any(|w| w.node == name)
        });
        if !here {
            return;
        }
        if ev.launch_seq != 0
            && let Some(&current) = self.launch_seqs.get(&ev.job_id)
            && current != ev.launch_seq
        {
            tracing::info!(
                node = name,
                job = ev.job_id,
                event_seq = ev.launch_seq,
                current,
                "event of a replaced run ignored"
            );
            return;
        }
        match v1::WorkloadEventKind::try_from(ev.kind) {
            Ok(v1::WorkloadEventKind::Started) => {
                if let Some(j) = self.jobs.get_mut(&ev.job_id) {
                    j.message = format!("running on {name}");
                }
            }
            Ok(v1::WorkloadEventKind::Exited) => {
                let status = if ev.exit_code == 0 {
                    JobStatus::Succeeded
                } else {
                    JobStatus::Failed
                };
                self.stop_elsewhere(ev.job_id, name);
                self.remove_from_cell(ev.job_id);
                drop(self.finish_job(ev.job_id, status, &format!("exit code {}", ev.exit_code)));
            }
            Ok(v1::WorkloadEventKind::FailedToStart) => {
                self.stop_elsewhere(ev.job_id, name);
                self.remove_from_cell(ev.job_id);
                drop(self.finish_job(
                    ev.job_id,
                    JobStatus::Failed,
                    &format!("failed to start on {name}: {}", ev.message),
                ));
            }
            Ok(v1::WorkloadEventKind::Evicted) => {
                self.stop_elsewhere(ev.job_id, name);
                self.requeue(ev.job_id, &format!("evicted by {name}: {}", ev.message));
            }
            _ => tracing::warn!(node = name, "workload event of unknown kind"),
        }
    }

    /// The agent's stream ended; the heartbeat timeout decides whether it is lost.
    pub fn node_disconnected(&mut self, name: &str, session: u64) {
        if let Some(node) = self.agent_mut(name, session) {
            node.link = None;
            tracing::warn!(node = name, session, "node agent disconnected");
        }
    }

    /// Marks silent agents lost and reschedules their jobs.
    fn check_agents(&mut self) {
        let now = std::time::Instant::now();
        let lost: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| {
                n.kind == NodeKind::Agent
                    && n.status != NodeStatus::Lost
                    && now.duration_since(n.last_seen) > self.cfg.lost_after
            })
            .map(|n| n.request.name.clone())
            .collect();
        if lost.is_empty() {
            return;
        }
        for name in &lost {
            tracing::error!(node = %name, "node lost: no heartbeat; rescheduling its jobs");
            if let Some(n) = self.nodes.iter_mut().find(|n| &n.request.name == name) {
                n.status = NodeStatus::Lost;
                n.link = None;
            }
            let victims: Vec<u64> = self
                .released()
                .filter(|j| {
                    j.status == JobStatus::Running && j.placement.iter().any(|w| &w.node == name)
                })
                .map(|j| j.id)
                .collect();
            for id in victims {
                self.stop_elsewhere(id, name);
                self.requeue(id, &format!("node `{name}` lost"));
            }
        }
        self.rebuild_cells();
    }

    /// Puts a running job back in the queue of its cell (resources freed).
    fn requeue(&mut self, id: u64, why: &str) {
        for cell in &mut self.cells {
            if let Some(&local) = cell.local.get(&id)
                && let Err(e) = cell.state.evict(local)
            {
                tracing::error!(job = id, error = %e, "evicting from the cell");
            }
        }
        self.preempted(id);
        if let Some(j) = self.jobs.get_mut(&id) {
            j.message = why.to_string();
        }
        self.set_status(id, JobStatus::Pending);
    }

    /// A running job lost its placement (preempted, its node lost, or it
    /// could not keep it in a rebuilt cell): counted on the job and, if
    /// enrolled, in its arm.
    fn preempted(&mut self, id: u64) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.placement.clear();
            j.preemptions += 1;
        }
        if let Some(stats) = self.enrolled_stats(id) {
            stats.preemptions += 1;
        }
    }

    fn send_to(&self, node: &str, body: v1::host_message::Body) {
        let Some(link) = self
            .nodes
            .iter()
            .find(|n| n.request.name == node)
            .and_then(|n| n.link.as_ref())
        else {
            return;
        };
        if link.tx.send(v1::HostMessage { body: Some(body) }).is_err() {
            tracing::warn!(node, "node agent stream closed; message dropped");
        }
    }

    fn is_agent(&self, node: &str) -> bool {
        self.nodes
            .iter()
            .any(|n| n.request.name == node && n.kind == NodeKind::Agent)
    }

    /// Tells every agent node of a job except `except` to stop it.
    fn stop_elsewhere(&self, id: u64, except: &str) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let mut told = HashSet::new();
        for w in &job.placement {
            if w.node != except && self.is_agent(&w.node) && told.insert(w.node.clone()) {
                self.send_to(
                    &w.node,
                    v1::host_message::Body::Stop(v1::Stop {
                        job_id: id,
                        reason: "stopped by the control plane".into(),
                    }),
                );
            }
        }
    }

    /// Job `id`'s launches where it is placed now, by the one launch rule
    /// (`None`: no such job).
    fn resolve_launches(&self, id: u64) -> Option<Result<Vec<launch::NodeLaunch>, String>> {
        let job = self.jobs.get(&id)?;
        let shared = self.cfg.sharing.is_shared(job.spec.qos);
        let resolved = launch::resolve(id, &job.spec, &job.placement, shared, |node| {
            self.nodes
                .iter()
                .find(|n| n.request.name == node)
                .map(|n| n.request.gpu_memory_mib)
        });
        Some(resolved.map(|mut launches| {
            if let Some(&pct) = self.sm_shares.get(&id) {
                launch::with_sm_share(&mut launches, pct);
            }
            launches
        }))
    }

    /// Sends the job's resolved launches (one per agent node it is placed
    /// on, see [`crate::launch`]). A placement that cannot be resolved puts
    /// the job back in the queue with the reason.
    fn launch_on_agents(&mut self, id: u64) {
        let Some(resolved) = self.resolve_launches(id) else {
            return;
        };
        match resolved {
            Ok(launches) => {
                let seq = self.next_launch_seq;
                self.next_launch_seq += 1;
                self.launch_seqs.insert(id, seq);
                for mut l in launches {
                    if self.is_agent(&l.node) {
                        l.launch.launch_seq = seq;
                        self.send_to(&l.node, v1::host_message::Body::Launch(l.launch));
                    }
                }
            }
            Err(why) => {
                tracing::error!(job = id, %why, "launch not resolved; job requeued");
                self.requeue(id, &why);
            }
        }
    }

    // ------------------------------------------------------------ cells

    /// Which arm a released job belongs to under the running split
    /// experiment: its tenant's, or the arm it was enrolled in; a job
    /// carried over from before the experiment (not measured) by a draw at
    /// the split's share.
    fn route(&self, job: &StoredJob) -> &'static str {
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
    fn assign(&self, job: &StoredJob) -> &'static str {
        match self.experiment.as_ref().and_then(|e| e.assigner.as_ref()) {
            Some(coin) if coin.choose(job.id) => CANDIDATE,
            Some(_) => CONTROL,
            None => self.route(job),
        }
    }

    /// Enrolls a released job in the running experiment, in arm `arm`.
    fn enroll(&mut self, id: u64, arm: &str) {
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

    /// Rebuilds the cells from the job table (start-up, experiment start/end).
    fn rebuild_cells(&mut self) {
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
        let now = now_ms();
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
                && let Err(e) = j.append(&Record::Snapshot {
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
    fn rotate_journal_if_full(&mut self, now: u64) {
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
            rotated = journal.append(&Record::Checkpoint {
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

    // ------------------------------------------------------------ the round

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
        let now = now_ms();
        self.check_agents();
        self.complete_finished(now);
        self.drop_old_finished(now);
        PendingAdmission {
            now,
            epoch: self.rounds + 1,
            tenants: self.admission_requests(now),
        }
    }

    /// The second half: releases what the tenant policies admitted, then a
    /// round per cell and the guardrail.
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
    }

    /// Retention: ended jobs past `keep_finished` (oldest-ended first) or
    /// ended longer ago than `keep_finished_for` leave the job table and
    /// the store, in one write. Checked when the count is over or, for the
    /// age, at most once a minute, so a tick stays O(1) otherwise.
    fn drop_old_finished(&mut self, now: u64) {
        let ended = self.count(JobStatus::Succeeded)
            + self.count(JobStatus::Failed)
            + self.count(JobStatus::Cancelled);
        let keep = self.cfg.keep_finished as u64;
        let over = ended > keep;
        let age_due = now.saturating_sub(self.last_retention_ms) >= 60_000;
        if !over && !age_due {
            return;
        }
        self.last_retention_ms = now;
        let horizon = now.saturating_sub(self.cfg.keep_finished_for.as_millis() as u64);
        let running = self.experiment.as_ref().map(|e| e.record.name.as_str());
        let mut candidates: Vec<(u64, u64)> = [
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ]
        .into_iter()
        .flat_map(|s| self.ids(s))
        .filter_map(|id| self.jobs.get(&id))
        .filter(|j| running != Some(j.experiment.as_str()))
        .map(|j| (j.end_ms, j.id))
        .collect();
        // Newest-ended first: the first `keep` stay (if young enough).
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let drop: Vec<u64> = candidates
            .iter()
            .enumerate()
            .filter(|(rank, (end, _))| *rank as u64 >= keep || *end < horizon)
            .map(|(_, (_, id))| *id)
            .collect();
        if drop.is_empty() {
            return;
        }
        let mut writes = Vec::with_capacity(drop.len());
        for id in &drop {
            if let Some(job) = self.jobs.remove(id)
                && let Some(set) = self.by_status.get_mut(&job.status)
            {
                set.remove(id);
            }
            writes.push(Write::DeleteJob(*id));
        }
        self.metrics.jobs_dropped += drop.len() as u64;
        tracing::info!(dropped = drop.len(), "ended jobs past retention dropped");
        for w in writes {
            self.writer.send(w);
        }
    }

    /// Simulated pool: jobs whose run time is up succeed.
    fn complete_finished(&mut self, now: u64) {
        let done: Vec<u64> = self
            .ids(JobStatus::Running)
            .filter_map(|id| self.jobs.get(&id))
            .filter(|j| j.start_ms.saturating_add(j.spec.duration_ms) <= now)
            // Jobs on agent nodes end when their process exits, not on a timer.
            .filter(|j| !j.placement.iter().any(|w| self.is_agent(&w.node)))
            .map(|j| j.id)
            .collect();
        for id in done {
            self.remove_from_cell(id);
            drop(self.finish_job(id, JobStatus::Succeeded, "completed"));
        }
    }

    /// Each tenant's admission question: its queue, its released jobs and
    /// its quota. Jobs pending past a lowered quota go back to the queue here.
    /// The answers come from the host core's tenant driver (see
    /// `arbiter_host::roles::tenant`), which releases queued jobs in the
    /// order tenant policies give, only while they fit the quota.
    fn admission_requests(&mut self, now: u64) -> Vec<TenantAdmission> {
        // One pass over the job table per tick: each tenant's queue, its
        // released jobs and what they claim.
        let mut tenants: BTreeMap<String, TenantJobs<'_>> = BTreeMap::new();
        for j in self
            .ids(JobStatus::Queued)
            .filter_map(|id| self.jobs.get(&id))
        {
            tenants.entry(j.tenant.clone()).or_default().queued.push(j);
        }
        let sharing = self.cfg.sharing;
        // What a job takes from its tenant's quota: the validator's rule,
        // guaranteed-charged work only (contract 0.3: shared work is exempt).
        let quota_milli_of = |j: &StoredJob| {
            if sharing.takes_quota(j.spec.qos) {
                j.spec.demand_milli()
            } else {
                0
            }
        };
        for j in self.released() {
            let t = tenants.entry(j.tenant.clone()).or_default();
            t.claimed_milli += quota_milli_of(j);
            t.claimed_gpus += j.spec.gpus;
            t.released.push(j);
        }
        let mut withdraw = Vec::new();
        let mut requests = Vec::new();
        for (tenant, jobs) in tenants {
            let quota_gpus = self.tenants.get(&tenant).map_or(0, |t| t.quota_gpus);
            let quota_milli =
                (quota_gpus > 0).then(|| u64::from(quota_gpus) * u64::from(model::FULL_GPU_MILLI));
            let mut claimed_milli = jobs.claimed_milli;
            if let Some(quota) = quota_milli {
                // A lowered quota: pending (not yet running) jobs go back to
                // the queue, newest first, until the rest fits. Without this
                // the scheduler would be offered jobs the validator refuses.
                let mut pending: Vec<&StoredJob> = jobs
                    .released
                    .iter()
                    .copied()
                    .filter(|j| j.status == JobStatus::Pending)
                    .collect();
                pending.sort_by_key(|j| std::cmp::Reverse((j.submit_ms, j.id)));
                for j in pending {
                    if claimed_milli <= quota {
                        break;
                    }
                    let milli = quota_milli_of(j);
                    if milli == 0 {
                        continue;
                    }
                    claimed_milli -= milli;
                    withdraw.push(j.id);
                }
            }
            if jobs.queued.is_empty() {
                continue;
            }
            let mut view_jobs = Vec::with_capacity(jobs.queued.len() + jobs.released.len());
            for (position, j) in jobs.queued.iter().enumerate() {
                view_jobs.push(tenant_job(position as u32, j, false));
            }
            for (k, j) in jobs.released.iter().enumerate() {
                view_jobs.push(tenant_job((jobs.queued.len() + k) as u32, j, true));
            }
            let queued: Vec<u64> = jobs.queued.iter().map(|j| j.id).collect();
            let request = AdmissionRequest {
                view: TenantView {
                    now_ms: now,
                    tenant: tenant.clone(),
                    gpu_quota: quota_gpus,
                    gpus_in_use: jobs.claimed_gpus,
                    jobs: view_jobs,
                },
                demand_milli: jobs.queued.iter().map(|j| quota_milli_of(j)).collect(),
                quota_milli,
                claimed_milli,
            };
            let slot = self.registry.find(&tenant_slot(&tenant));
            requests.push(TenantAdmission {
                tenant,
                slot,
                queued,
                request,
            });
        }
        for id in withdraw {
            tracing::info!(
                job = id,
                "tenant past its quota; job back in the tenant queue"
            );
            self.remove_from_cell(id);
            self.set_status(id, JobStatus::Queued);
        }
        requests
    }

    /// Releases what the tenant policies admitted and counts their faults.
    fn apply_admissions(&mut self, decided: DecidedAdmission) {
        for (tenant, queued, admission) in decided.tenants {
            let slot_name = tenant_slot(&tenant);
            for (generation, fault) in &admission.faults {
                self.tenant_faults += 1;
                self.metrics
                    .count_fault(&slot_name, *generation, fault.kind());
            }
            for position in admission.release {
                let Some(&id) = queued.get(position as usize) else {
                    continue;
                };
                // Cancelled (or otherwise moved on) while the policy was asked.
                if self
                    .jobs
                    .get(&id)
                    .is_some_and(|j| j.status == JobStatus::Queued)
                {
                    self.release(id);
                }
            }
        }
    }

    fn release(&mut self, id: u64) {
        let Some(job) = self.jobs.get(&id).cloned() else {
            return;
        };
        // Jobs submitted while the experiment runs join it on their first
        // release; older ones run in an arm but are not measured (their wait
        // began under another policy).
        let newly_enrolled = self
            .experiment
            .as_ref()
            .is_some_and(|e| job.experiment != e.record.name && job.id >= e.record.first_job);
        let arm = if newly_enrolled {
            self.assign(&job)
        } else {
            self.route(&job)
        };
        let Some(cell) = self.cells.iter_mut().find(|c| c.arm == arm) else {
            return;
        };
        match cell.state.submit_with(job_request(&job), job_traits(&job)) {
            Ok(local) => {
                cell.local.insert(id, local);
                cell.global.insert(local, id);
                if newly_enrolled {
                    self.enroll(id, arm);
                }
                self.set_status(id, JobStatus::Pending);
            }
            Err(e) => {
                drop(self.finish_job(id, JobStatus::Failed, &format!("refused: {e}")));
            }
        }
    }

    fn run_cell_round(&mut self, index: usize, now: u64) {
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
                fuel: None,
                latency_us: report.latency.as_micros() as u64,
                policy_us: report.policy_time.as_micros() as u64,
                config,
            }));
            self.cells[index].journaled_generation = Some(generation);
            if let Err(e) = journal.append(&record) {
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
    fn reconcile(&mut self, changes: Changes, now: u64) {
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
    fn match_if_due(&mut self, now: u64) {
        let Some(interval) = self.cfg.match_interval else {
            return;
        };
        if self.last_match.is_some_and(|t| t.elapsed() < interval) {
            return;
        }
        let Some(slot) = self.registry.find(MATCHER_SLOT) else {
            return;
        };
        if slot.active().is_none() {
            return;
        }
        self.last_match = Some(std::time::Instant::now());
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
    fn match_candidates(&self, index: usize) -> (Vec<u32>, Vec<u32>, Vec<model::WorkloadProfile>) {
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
    fn update_on_agents(&mut self, id: u64) {
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
                        self.send_to(&l.node, v1::host_message::Body::Update(update));
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
    fn relaunch(&mut self, id: u64, placement: Vec<WorkerAt>) {
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

/// The node an agent describes; the error names the bad field.
fn hello_request(h: &v1::NodeHello) -> Result<NodeRequest, String> {
    if h.name.is_empty()
        || h.name.len() > 63
        || !h
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("node name must be 1..=63 of [A-Za-z0-9._-]".into());
    }
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

fn progress_proto(p: &model::JobProgress) -> v1::JobProgress {
    v1::JobProgress {
        started_ms: p.started_ms,
        attained_ms: p.attained_ms,
        remaining_ms: p.remaining_ms,
        remaining_workers: p.remaining_workers,
        reported_ms: p.reported_ms,
    }
}

fn job_write(job: &StoredJob) -> Write {
    match serde_json::to_vec(job) {
        Ok(bytes) => Write::Job(job.id, bytes),
        // Unreachable for these plain records; never lose the id silently.
        Err(e) => Write::Put(format!("error/job/{}", job.id), e.to_string().into_bytes()),
    }
}

/// Compares token digests without a timing side channel (the digests are
/// of equal, public length; `subtle` keeps the compiler from short-circuiting).
fn constant_time_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
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

/// The tenant of jobs submitted without one.
pub const DEFAULT_TENANT: &str = "default";

/// Jobs in a `List` page when the request names no size, and the most it may name.
pub const DEFAULT_PAGE: usize = 1_000;
pub const MAX_PAGE: usize = 10_000;

/// Picks one estimate of an arm's metrics.
type ArmEstimate = fn(&v1::ArmMetrics) -> &Option<v1::Estimate>;

/// What the waiting reasons of one API call share: each cell's idle
/// capacity and each tenant's claimed GPUs, computed once when first needed.
#[derive(Default)]
struct WaitContext {
    capacity: HashMap<usize, Capacity>,
    claimed: Option<HashMap<String, u32>>,
}

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

fn experiment_state(s: ExperimentState) -> v1::ExperimentState {
    match s {
        ExperimentState::Running => v1::ExperimentState::Running,
        ExperimentState::Promoted => v1::ExperimentState::Promoted,
        ExperimentState::Aborted => v1::ExperimentState::Aborted,
        ExperimentState::RolledBack => v1::ExperimentState::RolledBack,
    }
}

fn status_skeleton(r: &ExperimentRecord) -> v1::ExperimentStatus {
    v1::ExperimentStatus {
        name: r.name.clone(),
        mode: match r.mode {
            Mode::Split => v1::ExperimentMode::Split,
            Mode::Shadow => v1::ExperimentMode::Shadow,
        } as i32,
        state: experiment_state(r.state) as i32,
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
) -> v1::ArmMetrics {
    let (j, r) = (&s.jobs, &s.rounds);
    v1::ArmMetrics {
        arm: arm.to_string(),
        slot: slot.to_string(),
        generation,
        nodes,
        gpus,
        jobs_submitted: j.submitted,
        jobs_started: j.started,
        jobs_finished: j.finished,
        queue_delay_ms: Some(j.queue_delay_ms.estimate()),
        jct_ms: Some(j.jct_ms.estimate()),
        gpu_allocation_pct: Some(r.alloc_pct.estimate()),
        fragmentation_pct: Some(r.frag_pct.estimate()),
        preemptions: j.preemptions,
        slo_violations: j.slo_violations,
        policy_faults: r.faults,
        policy_latency_ms: Some(r.policy_ms.estimate()),
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
