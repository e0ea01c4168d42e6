//! The workload supervisor: launch under the interposer, persist, adopt, reap, evict.
//!
//! * **Launch**: the command runs with `LD_PRELOAD=libarbiter_interpose.so`, its own control
//!   block (`ARBITER_CONTROL_BLOCK`, created here with `arbiter_interpose::control`), the MPS
//!   client environment of its GPU when MPS is on (or `CUDA_VISIBLE_DEVICES` when it is off),
//!   in its **own process group** (so eviction reaches every process it forks), with stdout
//!   and stderr appended to files (a pipe to the node would break — `SIGPIPE` — when the node
//!   restarts).
//! * **Persist**: one JSON record per workload (`<state_dir>/workloads/<id>.json`, written
//!   atomically) with pid, `/proc` start time, block path and the limits the node set.
//! * **Adopt**: a new supervisor over the same state dir re-attaches every workload whose
//!   `(pid, start time)` is still alive, re-mapping its block; the limits keep being enforced
//!   meanwhile because they live in the block, not in the node. An adopted workload is not our
//!   child, so its exit status cannot be collected ([`ExitOutcome::Unknown`]).
//! * **Evict**: set `FLAG_EXIT`, `SIGTERM` to the group (the interposer stops launches,
//!   synchronizes, releases its contexts and re-raises), and after the grace period
//!   `terminate_client` on the MPS server (if any) and `SIGKILL` to the group.
//! * **Reap**: [`Supervisor::poll`] collects exits, deletes block and record and so releases
//!   the workload's quota.

use crate::mps::{MpsControl, MpsManager};
use crate::procfs::{self, Liveness};
use arbiter_interpose::control::{BlockInit, ControlBlock, FLAG_EXIT, MappedBlock, UNLIMITED};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Supervisor errors.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("workload {0} does not exist")]
    NoSuchWorkload(u32),
    #[error("invalid workload spec: {0}")]
    InvalidSpec(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("workload record {path}: {source}")]
    Record {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let what = what.into();
    move |source| SupervisorError::Io { what, source }
}

/// What the interposer does when the block is missing, invalid or stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailMode {
    /// Pass through (never break the application). The interposer's default.
    Open,
    /// Refuse allocations and launches.
    Closed,
}

/// Supervisor configuration.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Records and workload logs (survives node restarts).
    pub state_dir: PathBuf,
    /// Control blocks (normally under `/dev/shm`).
    pub block_dir: PathBuf,
    /// `libarbiter_interpose.so`.
    pub interposer: PathBuf,
    /// Written into each block (informational for the interposer).
    pub control_period: Duration,
    /// The interposer treats the block as stale after this long without a node heartbeat
    /// (`None`: never; a node restart then leaves the limits in force).
    pub stale_after: Option<Duration>,
    pub fail_mode: FailMode,
    /// `SIGTERM` → `SIGKILL` grace period on eviction.
    pub grace: Duration,
    /// Device time of one launch assumed until the node has measured it (ns).
    pub default_mean_kernel_ns: u64,
}

impl SupervisorConfig {
    pub fn new(state_dir: &Path, block_dir: &Path, interposer: &Path) -> SupervisorConfig {
        SupervisorConfig {
            state_dir: state_dir.to_path_buf(),
            block_dir: block_dir.to_path_buf(),
            interposer: interposer.to_path_buf(),
            control_period: Duration::from_millis(100),
            stale_after: None,
            fail_mode: FailMode::Open,
            grace: Duration::from_secs(10),
            default_mean_kernel_ns: 500_000,
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct WorkloadSpec {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Extra environment (on top of the node's, which is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Node GPU index.
    pub gpu: u32,
    /// `CUDA_VISIBLE_DEVICES` when MPS is off (default: the GPU index). Prefer UUIDs.
    pub device: Option<String>,
    /// 0 online (latency-critical), 1 offline (best effort).
    pub role: u8,
    /// Memory quota (`None`: unlimited).
    pub memory_limit_bytes: Option<u64>,
    /// Host memory the workload may spill to beyond its quota (the interposer serves
    /// over-quota `cuMemAlloc` from host-resident managed memory; `None`: no spill).
    pub host_spill_bytes: Option<u64>,
    /// Compute share in permille (0 is treated as 1000, i.e. unthrottled).
    pub compute_share_permille: u32,
    /// MPS active thread percentage for this client (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`).
    pub mps_thread_pct: Option<u8>,
    /// Device time of one launch, if known (ns); otherwise measured by the node.
    pub mean_kernel_ns: Option<u64>,
    /// The cluster job's terms (contract 0.3): its QoS and GPU share request
    /// and limit in permille (0 = unknown / the request).
    pub terms: ShareTerms,
}

/// A workload's cluster-level terms, as the host last sent them (launch or
/// update): what a coordinator sees as `workload-status.qos`,
/// `request-permille` and `limit-permille`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShareTerms {
    /// `None`: not told (an agent before contract 0.3); the role stands for it.
    pub qos: Option<u8>,
    pub request_permille: u32,
    pub limit_permille: u32,
}

/// The persisted state of one workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkloadRecord {
    pub id: u32,
    pub pid: u32,
    /// `/proc/<pid>/stat` start time: with `pid`, the process identity.
    pub start_ticks: u64,
    pub block_path: PathBuf,
    pub gpu: u32,
    pub role: u8,
    pub command: Vec<String>,
    pub started_unix_ms: u64,
    pub compute_share_permille: u32,
    pub mps_thread_pct: Option<u8>,
    pub mean_kernel_ns: u64,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Ran with the MPS client environment.
    pub mps: bool,
    /// Free-form owner label given at launch (the node agent stores `job-<id>/<rank>`), so
    /// that whoever adopts the workload after a restart knows what it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default)]
    pub terms: ShareTerms,
}

/// How a workload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitOutcome {
    Code(i32),
    Signal(i32),
    /// Adopted after a node restart: not our child, so the status is not available.
    Unknown,
}

/// A finished workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReport {
    pub id: u32,
    pub pid: u32,
    pub gpu: u32,
    pub outcome: ExitOutcome,
    /// It exited because the node evicted it.
    pub evicted: bool,
    /// It had to be killed with `SIGKILL` after the grace period.
    pub killed: bool,
}

/// Result of re-opening a state dir.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AdoptReport {
    /// Still running, re-attached.
    pub adopted: Vec<u32>,
    /// Exited while the node was away (cleaned up).
    pub exited: Vec<ExitReport>,
    /// Alive but their control block is gone or invalid: they cannot be enforced any more,
    /// so they were asked to exit (`SIGTERM`).
    pub unenforceable: Vec<u32>,
}

#[derive(Debug)]
struct Eviction {
    deadline: Instant,
    killed: bool,
}

/// One supervised workload.
#[derive(Debug)]
pub struct Workload {
    record: WorkloadRecord,
    block: MappedBlock,
    child: Option<Child>,
    eviction: Option<Eviction>,
}

impl Workload {
    pub fn record(&self) -> &WorkloadRecord {
        &self.record
    }

    /// The workload's control block.
    pub fn block(&self) -> &ControlBlock {
        &self.block
    }

    /// Adopted after a restart (not our child).
    pub fn adopted(&self) -> bool {
        self.child.is_none()
    }

    pub fn evicting(&self) -> bool {
        self.eviction.is_some()
    }

    /// Memory quota in bytes (`None`: unlimited).
    pub fn memory_limit_bytes(&self) -> Option<u64> {
        let q = self.block.limits.quota_bytes.load(Ordering::Relaxed);
        (q != UNLIMITED).then_some(q)
    }
}

/// Supervises the node's workloads.
#[derive(Debug)]
pub struct Supervisor {
    config: SupervisorConfig,
    workloads: BTreeMap<u32, Workload>,
    history: VecDeque<ExitReport>,
    next_id: u32,
}

const HISTORY: usize = 1024;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Pacing `(interval, burst)` in ns for a share in permille and a per-launch device time.
pub fn pacing_for(share_permille: u32, mean_kernel_ns: u64) -> (u64, u64) {
    let share = f64::from(share_permille.clamp(1, 1000)) / 1000.0;
    let interval = ControlBlock::interval_for_share(mean_kernel_ns, share);
    // One launch of burst: smooth pacing, small enough that a rate cut shows within a period.
    (interval, interval)
}

impl Supervisor {
    /// Open (or create) the state dir and adopt the workloads recorded there.
    pub fn open(config: SupervisorConfig) -> Result<(Supervisor, AdoptReport), SupervisorError> {
        let wdir = config.state_dir.join("workloads");
        std::fs::create_dir_all(&wdir).map_err(io(format!("mkdir {}", wdir.display())))?;
        std::fs::create_dir_all(&config.block_dir)
            .map_err(io(format!("mkdir {}", config.block_dir.display())))?;
        let mut sup = Supervisor {
            config,
            workloads: BTreeMap::new(),
            history: VecDeque::new(),
            next_id: 1,
        };
        let mut report = AdoptReport::default();
        let mut records = Vec::new();
        for entry in std::fs::read_dir(&wdir).map_err(io(format!("read {}", wdir.display())))? {
            let path = entry.map_err(io("read_dir entry"))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                match read_record(&path) {
                    Ok(r) => records.push(r),
                    Err(e) => tracing::error!(error = %e, "ignoring unreadable workload record"),
                }
            }
        }
        for rec in records {
            sup.next_id = sup.next_id.max(rec.id.saturating_add(1));
            sup.adopt(rec, &mut report);
        }
        // Never hand out an id whose block file still exists (a block some process may map).
        if let Ok(rd) = std::fs::read_dir(&sup.config.block_dir) {
            for e in rd.flatten() {
                let name = e.file_name();
                let id = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(".block"))
                    .and_then(|n| n.parse::<u32>().ok());
                if let Some(id) = id {
                    sup.next_id = sup.next_id.max(id.saturating_add(1));
                }
            }
        }
        tracing::info!(
            adopted = report.adopted.len(),
            exited = report.exited.len(),
            unenforceable = report.unenforceable.len(),
            "supervisor opened"
        );
        Ok((sup, report))
    }

    fn adopt(&mut self, rec: WorkloadRecord, report: &mut AdoptReport) {
        match procfs::liveness(rec.pid, rec.start_ticks) {
            Liveness::Alive => match MappedBlock::open(&rec.block_path) {
                Ok(block) => {
                    tracing::info!(id = rec.id, pid = rec.pid, "adopted workload");
                    report.adopted.push(rec.id);
                    block.heartbeat();
                    self.workloads.insert(
                        rec.id,
                        Workload {
                            record: rec,
                            block,
                            child: None,
                            eviction: None,
                        },
                    );
                }
                Err(e) => {
                    tracing::error!(id = rec.id, pid = rec.pid, error = %e,
                        "control block lost; asking the workload to exit");
                    let _ = procfs::signal_group(rec.pid, Signal::TERM);
                    report.unenforceable.push(rec.id);
                    self.remove_files(&rec);
                }
            },
            Liveness::Zombie | Liveness::Gone => {
                let r = ExitReport {
                    id: rec.id,
                    pid: rec.pid,
                    gpu: rec.gpu,
                    outcome: ExitOutcome::Unknown,
                    evicted: false,
                    killed: false,
                };
                tracing::info!(
                    id = rec.id,
                    pid = rec.pid,
                    "workload exited while the node was away"
                );
                self.remove_files(&rec);
                self.push_history(r.clone());
                report.exited.push(r);
            }
        }
    }

    pub fn config(&self) -> &SupervisorConfig {
        &self.config
    }

    fn record_path(&self, id: u32) -> PathBuf {
        self.config
            .state_dir
            .join("workloads")
            .join(format!("{id}.json"))
    }

    fn persist(&self, rec: &WorkloadRecord) -> Result<(), SupervisorError> {
        let path = self.record_path(rec.id);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(rec).map_err(|source| SupervisorError::Record {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&tmp, text).map_err(io(format!("write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io(format!("rename {}", path.display())))
    }

    fn remove_files(&self, rec: &WorkloadRecord) {
        let _ = std::fs::remove_file(&rec.block_path);
        let _ = std::fs::remove_file(self.record_path(rec.id));
    }

    /// Start a workload. `mps` is the MPS daemon of its GPU when MPS is on.
    pub fn launch(
        &mut self,
        spec: &WorkloadSpec,
        mps: Option<&dyn MpsControl>,
    ) -> Result<u32, SupervisorError> {
        self.launch_tagged(spec, mps, None)
    }

    /// [`launch`](Self::launch) with an owner label persisted in the workload's record
    /// ([`WorkloadRecord::tag`]) from the start, so it survives a node restart.
    pub fn launch_tagged(
        &mut self,
        spec: &WorkloadSpec,
        mps: Option<&dyn MpsControl>,
        tag: Option<String>,
    ) -> Result<u32, SupervisorError> {
        let Some((program, args)) = spec.command.split_first() else {
            return Err(SupervisorError::InvalidSpec("empty command".into()));
        };
        if let Some(p) = spec.mps_thread_pct
            && !(1..=100).contains(&p)
        {
            return Err(SupervisorError::InvalidSpec(format!(
                "mps_thread_pct {p} not in 1..=100"
            )));
        }
        let id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        let share = match spec.compute_share_permille {
            0 => 1000,
            s => s.min(1000),
        };
        let mean_kernel_ns = spec
            .mean_kernel_ns
            .filter(|&n| n > 0)
            .unwrap_or(self.config.default_mean_kernel_ns);
        let (interval, burst) = pacing_for(share, mean_kernel_ns);
        let block_path = self.config.block_dir.join(format!("{id}.block"));
        let block = MappedBlock::create(
            &block_path,
            &BlockInit {
                quota_bytes: spec.memory_limit_bytes.unwrap_or(UNLIMITED),
                pace_interval_ns: interval,
                pace_burst_ns: burst,
                control_period_ns: self.config.control_period.as_nanos() as u64,
                stale_after_ns: self.config.stale_after.map_or(0, |d| d.as_nanos() as u64),
                // A node workload runs on one GPU (`CUDA_VISIBLE_DEVICES` names it).
                device_count: 1,
                spill_limit_bytes: spec.host_spill_bytes.unwrap_or(0),
            },
        )
        .map_err(io(format!("create control block {}", block_path.display())))?;
        block.heartbeat();

        let wdir = self.config.state_dir.join("workloads");
        let stdout = wdir.join(format!("{id}.out"));
        let stderr = wdir.join(format!("{id}.err"));
        let open_log = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(io(format!("open {}", p.display())))
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(open_log(&stdout)?)
            .stderr(open_log(&stderr)?)
            .process_group(0)
            .env_remove("ARBITER_INTERPOSE_BYPASS")
            .env("ARBITER_CONTROL_BLOCK", &block_path)
            .env(
                "ARBITER_FAIL_MODE",
                match self.config.fail_mode {
                    FailMode::Open => "open",
                    FailMode::Closed => "closed",
                },
            );
        if let Some(d) = &spec.cwd {
            cmd.current_dir(d);
        }
        match mps {
            Some(m) => {
                // The daemon selected the GPU (CUDA_VISIBLE_DEVICES on the daemon); clients
                // must not set it again (the server remaps devices).
                cmd.env_remove("CUDA_VISIBLE_DEVICES");
                for (k, v) in m.client_env() {
                    cmd.env(k, v);
                }
                if let Some(p) = spec.mps_thread_pct {
                    cmd.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p.to_string());
                }
                if let Some(b) = spec.memory_limit_bytes {
                    cmd.env(
                        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                        format!("0={}M", (b >> 20).max(1)),
                    );
                }
            }
            None => {
                let dev = spec.device.clone().unwrap_or_else(|| spec.gpu.to_string());
                cmd.env("CUDA_VISIBLE_DEVICES", dev);
            }
        }
        let mut preload = self.config.interposer.display().to_string();
        for (k, v) in &spec.env {
            if k == "LD_PRELOAD" {
                // Ours first, so our `cu*` and `dlsym` exports win.
                preload = format!("{preload}:{v}");
            } else {
                cmd.env(k, v);
            }
        }
        cmd.env("LD_PRELOAD", preload);

        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&block_path);
                return Err(SupervisorError::Io {
                    what: format!("spawn {program}"),
                    source: e,
                });
            }
        };
        let pid = child.id();
        let start_ticks = procfs::stat(pid).map(|s| s.start_ticks).unwrap_or(0);
        let record = WorkloadRecord {
            id,
            pid,
            start_ticks,
            block_path,
            gpu: spec.gpu,
            role: spec.role,
            command: spec.command.clone(),
            started_unix_ms: unix_ms(),
            compute_share_permille: share,
            mps_thread_pct: spec.mps_thread_pct,
            mean_kernel_ns,
            stdout,
            stderr,
            mps: mps.is_some(),
            tag,
            terms: spec.terms,
        };
        self.persist(&record)?;
        tracing::info!(id, pid, gpu = spec.gpu, command = ?spec.command, "workload started");
        self.workloads.insert(
            id,
            Workload {
                record,
                block,
                child: Some(child),
                eviction: None,
            },
        );
        Ok(id)
    }

    pub fn ids(&self) -> Vec<u32> {
        self.workloads.keys().copied().collect()
    }

    pub fn workloads(&self) -> impl Iterator<Item = &Workload> {
        self.workloads.values()
    }

    pub fn get(&self, id: u32) -> Option<&Workload> {
        self.workloads.get(&id)
    }

    fn get_mut(&mut self, id: u32) -> Result<&mut Workload, SupervisorError> {
        self.workloads
            .get_mut(&id)
            .ok_or(SupervisorError::NoSuchWorkload(id))
    }

    /// Sum of the memory quotas of the live workloads on `gpu` (unlimited ones count 0).
    pub fn reserved_bytes(&self, gpu: u32) -> u64 {
        self.workloads
            .values()
            .filter(|w| w.record.gpu == gpu)
            .filter_map(Workload::memory_limit_bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Heartbeat every block (the interposer's staleness check).
    pub fn heartbeat(&self) {
        for w in self.workloads.values() {
            w.block.heartbeat();
        }
    }

    /// Set the memory quota; applies to the workload's next allocation (running ones
    /// included). Memory already allocated above a lowered quota is not taken back.
    pub fn set_memory_limit(&mut self, id: u32, bytes: Option<u64>) -> Result<(), SupervisorError> {
        let w = self.get_mut(id)?;
        w.block
            .limits
            .quota_bytes
            .store(bytes.unwrap_or(UNLIMITED), Ordering::Release);
        Ok(())
    }

    /// Set the compute share (permille) with the given per-launch device time; takes effect
    /// for waiting launches within one pacer slice.
    pub fn set_compute_share(
        &mut self,
        id: u32,
        permille: u32,
        mean_kernel_ns: Option<u64>,
    ) -> Result<(), SupervisorError> {
        let w = self.get_mut(id)?;
        let permille = permille.clamp(1, 1000);
        if let Some(n) = mean_kernel_ns.filter(|&n| n > 0) {
            w.record.mean_kernel_ns = n;
        }
        let (interval, burst) = pacing_for(permille, w.record.mean_kernel_ns);
        w.block.set_pacing(interval, burst);
        w.record.compute_share_permille = permille;
        let rec = w.record.clone();
        self.persist(&rec)
    }

    /// Re-derive the pacing interval from a new per-launch device time estimate, if it moved
    /// by more than 10 % (so the pacer is not re-planned every period for noise).
    pub fn update_kernel_estimate(
        &mut self,
        id: u32,
        mean_kernel_ns: u64,
    ) -> Result<bool, SupervisorError> {
        let w = self.get_mut(id)?;
        if mean_kernel_ns == 0 {
            return Ok(false);
        }
        let old = w.record.mean_kernel_ns;
        if old.abs_diff(mean_kernel_ns) * 10 <= old {
            return Ok(false);
        }
        w.record.mean_kernel_ns = mean_kernel_ns;
        if w.record.compute_share_permille < 1000 {
            let (interval, burst) = pacing_for(w.record.compute_share_permille, mean_kernel_ns);
            w.block.set_pacing(interval, burst);
        }
        Ok(true)
    }

    /// Change a running workload's role (0 online, 1 offline) and cluster
    /// terms, as an `Update` from the host says (an upgrade to guaranteed).
    pub fn set_terms(
        &mut self,
        id: u32,
        role: u8,
        terms: ShareTerms,
    ) -> Result<(), SupervisorError> {
        if role > 1 {
            return Err(SupervisorError::InvalidSpec(format!(
                "role {role} is not 0 or 1"
            )));
        }
        let w = self.get_mut(id)?;
        w.record.role = role;
        w.record.terms = terms;
        let rec = w.record.clone();
        self.persist(&rec)
    }

    /// Freeze (hold every launch in the interposer) or resume.
    pub fn set_frozen(&mut self, id: u32, frozen: bool) -> Result<(), SupervisorError> {
        let w = self.get_mut(id)?;
        w.block
            .set_flag(arbiter_interpose::control::FLAG_FREEZE, frozen);
        Ok(())
    }

    /// Record the MPS thread percentage; it reaches the workload at its next start (MPS reads
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` once per client).
    pub fn set_mps_thread_pct(&mut self, id: u32, pct: u8) -> Result<(), SupervisorError> {
        if !(1..=100).contains(&pct) {
            return Err(SupervisorError::InvalidSpec(format!(
                "mps thread percentage {pct} not in 1..=100"
            )));
        }
        let w = self.get_mut(id)?;
        w.record.mps_thread_pct = Some(pct);
        let rec = w.record.clone();
        self.persist(&rec)
    }

    /// Begin a graceful eviction (idempotent): `FLAG_EXIT` and `SIGTERM` to the process
    /// group now, `SIGKILL` from [`poll`](Self::poll) after the grace period.
    pub fn evict(&mut self, id: u32) -> Result<(), SupervisorError> {
        let grace = self.config.grace;
        let w = self.get_mut(id)?;
        if w.eviction.is_some() {
            return Ok(());
        }
        w.block.set_flag(FLAG_EXIT, true);
        // An adopted process is not our child: make sure the pid is still it before signalling
        // (if it is gone, the next poll reports the exit).
        let same = w.child.is_some()
            || procfs::liveness(w.record.pid, w.record.start_ticks) == Liveness::Alive;
        if !same {
            tracing::debug!(id, "already exited; nothing to signal");
        } else if let Err(e) = procfs::signal_group(w.record.pid, Signal::TERM) {
            tracing::debug!(id, error = %e, "SIGTERM to group");
        }
        w.eviction = Some(Eviction {
            deadline: Instant::now() + grace,
            killed: false,
        });
        tracing::info!(id, pid = w.record.pid, ?grace, "evicting workload");
        Ok(())
    }

    /// Reap exited workloads and escalate overdue evictions. `mps` holds the MPS daemons (to
    /// `terminate_client` before `SIGKILL`). Returns the workloads that finished.
    pub fn poll(&mut self, mps: Option<&MpsManager>) -> Vec<ExitReport> {
        let now = Instant::now();
        let mut done = Vec::new();
        for (id, w) in self.workloads.iter_mut() {
            // `group_safe`: the pid cannot have been reused yet (we just reaped our own child,
            // or the adopted process is still an unreaped zombie), so signalling its process
            // group cannot hit an unrelated process.
            let outcome = match &mut w.child {
                Some(child) => match child.try_wait() {
                    Ok(Some(st)) => Some((
                        match (st.code(), st.signal()) {
                            (Some(c), _) => ExitOutcome::Code(c),
                            (None, Some(s)) => ExitOutcome::Signal(s),
                            (None, None) => ExitOutcome::Unknown,
                        },
                        true,
                    )),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(id, error = %e, "try_wait");
                        None
                    }
                },
                None => match procfs::liveness(w.record.pid, w.record.start_ticks) {
                    Liveness::Alive => None,
                    Liveness::Zombie => Some((ExitOutcome::Unknown, true)),
                    Liveness::Gone => Some((ExitOutcome::Unknown, false)),
                },
            };
            if let Some(outcome) = outcome {
                done.push((*id, outcome));
                continue;
            }
            if let Some(ev) = &mut w.eviction
                && !ev.killed
                && now >= ev.deadline
            {
                let pid = w.record.pid;
                if w.record.mps
                    && let Some(m) = mps.and_then(|m| m.for_gpu(w.record.gpu))
                {
                    // Clean up the client's outstanding GPU work on the server first.
                    for server in m.server_list().unwrap_or_default() {
                        if let Err(e) = m.terminate_client(server, pid) {
                            tracing::warn!(id, server, error = %e, "terminate_client");
                        }
                    }
                }
                tracing::warn!(id, pid, "grace period over; SIGKILL");
                if let Err(e) = procfs::signal_group(pid, Signal::KILL) {
                    tracing::debug!(id, error = %e, "SIGKILL to group");
                }
                ev.killed = true;
            }
        }
        let mut reports = Vec::new();
        for (id, (outcome, group_safe)) in done {
            let Some(w) = self.workloads.remove(&id) else {
                continue;
            };
            let evicted = w.eviction.is_some();
            let killed = w.eviction.as_ref().is_some_and(|e| e.killed);
            if evicted && group_safe {
                // Whatever the leader left behind in its group goes too.
                let _ = procfs::signal_group(w.record.pid, Signal::KILL);
            }
            let r = ExitReport {
                id,
                pid: w.record.pid,
                gpu: w.record.gpu,
                outcome,
                evicted,
                killed,
            };
            tracing::info!(
                id,
                pid = r.pid,
                ?outcome,
                evicted,
                killed,
                "workload finished"
            );
            let rec = w.record.clone();
            drop(w);
            self.remove_files(&rec);
            self.push_history(r.clone());
            reports.push(r);
        }
        reports
    }

    fn push_history(&mut self, r: ExitReport) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(r);
    }

    /// Recently finished workloads (bounded).
    pub fn history(&self) -> impl Iterator<Item = &ExitReport> {
        self.history.iter()
    }

    /// Poll until workload `id` has finished or `timeout` passes (for CLIs and tests; the
    /// node's loop calls [`poll`](Self::poll) instead).
    pub fn wait_exit(
        &mut self,
        id: u32,
        timeout: Duration,
        mps: Option<&MpsManager>,
    ) -> Option<ExitReport> {
        let deadline = Instant::now() + timeout;
        loop {
            self.poll(mps);
            if let Some(r) = self.history.iter().rev().find(|r| r.id == id) {
                return Some(r.clone());
            }
            if !self.workloads.contains_key(&id) || Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn read_record(path: &Path) -> Result<WorkloadRecord, SupervisorError> {
    let text = std::fs::read(path).map_err(io(format!("read {}", path.display())))?;
    serde_json::from_slice(&text).map_err(|source| SupervisorError::Record {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_from_share() {
        assert_eq!(pacing_for(1000, 1_000_000), (0, 0));
        assert_eq!(pacing_for(250, 1_000_000), (4_000_000, 4_000_000));
        assert_eq!(
            pacing_for(0, 1_000),
            (1_000_000, 1_000_000),
            "clamped to 1 permille"
        );
    }
}
