//! NVIDIA MPS control: one `nvidia-cuda-mps-control` daemon per GPU.
//!
//! Every GPU gets its own daemon with its own pipe and log directory
//! (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY`) and `CUDA_VISIBLE_DEVICES` set to that
//! GPU alone: a fatal fault is contained to the GPUs that share an MPS server, so one server
//! per GPU keeps a fault on one GPU from blocking new clients on the others. Commands are sent
//! the way the k8s device plugin does it: run the control binary with the daemon's environment
//! and write the command to its stdin (`echo <cmd> | nvidia-cuda-mps-control`).
//!
//! **What applies when** (NVIDIA MPS documentation, "Legacy MPS v2 Interface"):
//!
//! | knob | reaches |
//! |---|---|
//! | `set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit` | the **next** server the daemon spawns (lost on `quit`; we re-apply them on start) |
//! | `set_active_thread_percentage <server>`, `set_device_pinned_mem_limit <server>` | **new clients** of that server; existing clients are not affected |
//! | `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in a client's env | that client, read once at start; can only lower the server's value |
//!
//! No MPS knob changes the SM share of a running client. Runtime changes for running
//! workloads are therefore made by the interposer (launch pacing and the memory quota in the
//! control block); MPS limits are start-time ceilings.
//!
//! The command syntax is the MPS v2 control interface; protocol v3 (r615+) has a new CLI,
//! which is why everything goes through the [`MpsControl`] trait.

use crate::gpu::{ComputeMode, GpuBackend};
use crate::procfs;
use rustix::process::Signal;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Errors from MPS control.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("cannot run {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("`{command}` on GPU {gpu}: {message}")]
    Command {
        gpu: u32,
        command: String,
        message: String,
    },
    #[error("`{command}` on GPU {gpu} timed out after {timeout:?}")]
    Timeout {
        gpu: u32,
        command: String,
        timeout: Duration,
    },
    #[error("unexpected answer to `{command}` on GPU {gpu}: {answer:?}")]
    Parse {
        gpu: u32,
        command: String,
        answer: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// State of an MPS server (`get_server_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStatus {
    Active,
    /// A client caused a fatal fault; new clients are refused until all affected clients exit.
    Fault,
    Init,
    Other(String),
}

/// Health of one GPU's MPS daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsHealth {
    /// The control daemon answered.
    pub daemon_running: bool,
    /// Servers (one per user with clients) and their states.
    pub servers: Vec<(u32, ServerStatus)>,
}

impl MpsHealth {
    /// Daemon up and no server in `FAULT`.
    pub fn is_healthy(&self) -> bool {
        self.daemon_running && !self.servers.iter().any(|(_, s)| *s == ServerStatus::Fault)
    }
}

/// Control of the MPS daemon of one GPU.
pub trait MpsControl: Send + Sync {
    /// The GPU (node index) this daemon serves.
    fn gpu(&self) -> u32;
    /// Start the daemon (`nvidia-cuda-mps-control -d`) and re-apply the configured defaults.
    fn start(&self) -> Result<(), MpsError>;
    /// `quit`: stop the daemon (servers exit when their clients are gone).
    fn quit(&self) -> Result<(), MpsError>;
    /// `get_server_list`.
    fn server_list(&self) -> Result<Vec<u32>, MpsError>;
    /// `get_server_status <pid>`.
    fn server_status(&self, server: u32) -> Result<ServerStatus, MpsError>;
    /// `get_client_list <pid>`.
    fn client_list(&self, server: u32) -> Result<Vec<u32>, MpsError>;
    /// `set_default_active_thread_percentage <pct>` — affects the next server only.
    fn set_default_active_thread_percentage(&self, pct: u8) -> Result<(), MpsError>;
    /// `get_default_active_thread_percentage`.
    fn default_active_thread_percentage(&self) -> Result<f64, MpsError>;
    /// `set_active_thread_percentage <server> <pct>` — new clients of that server only.
    fn set_active_thread_percentage(&self, server: u32, pct: u8) -> Result<(), MpsError>;
    /// `set_default_device_pinned_mem_limit 0 <MiB>M` — the next server only.
    fn set_default_device_pinned_mem_limit(&self, bytes: u64) -> Result<(), MpsError>;
    /// `set_device_pinned_mem_limit <server> 0 <MiB>M` — new clients of that server only.
    fn set_device_pinned_mem_limit(&self, server: u32, bytes: u64) -> Result<(), MpsError>;
    /// `terminate_client <server> <client>`: kill the client's outstanding GPU work so the
    /// server and the other clients are left in a defined state.
    fn terminate_client(&self, server: u32, client: u32) -> Result<(), MpsError>;
    /// Daemon liveness and server states.
    fn health(&self) -> MpsHealth;
    /// Environment a client of this GPU's daemon needs.
    fn client_env(&self) -> Vec<(String, String)>;
}

/// Configuration of the per-GPU daemons.
#[derive(Debug, Clone)]
pub struct MpsConfig {
    /// The control binary (real or fake).
    pub binary: PathBuf,
    /// Pipe and log directories are `<base_dir>/gpu<N>/{pipe,log}`.
    pub base_dir: PathBuf,
    /// Re-applied on every start (`None`: leave the daemon's default of 100). A ceiling for
    /// every client: a workload's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` can only lower it
    /// (measured on an H200 — a client asking 100 % under a default of 50 % ran at 50 %;
    /// `docs/gpu-validation.md`).
    pub default_active_thread_pct: Option<u8>,
    /// Re-applied on every start.
    pub default_pinned_mem_limit_bytes: Option<u64>,
    /// Set `EXCLUSIVE_PROCESS` before starting and `DEFAULT` after quitting (needs root).
    pub set_exclusive_process: bool,
    /// Timeout of one control command.
    pub command_timeout: Duration,
}

impl MpsConfig {
    /// The default configuration with the binary found on `PATH`, if any.
    pub fn detect(base_dir: &Path) -> Option<MpsConfig> {
        let binary = find_on_path("nvidia-cuda-mps-control")?;
        Some(MpsConfig::new(binary, base_dir))
    }

    pub fn new(binary: PathBuf, base_dir: &Path) -> MpsConfig {
        MpsConfig {
            binary,
            base_dir: base_dir.to_path_buf(),
            default_active_thread_pct: None,
            default_pinned_mem_limit_bytes: None,
            set_exclusive_process: false,
            command_timeout: Duration::from_secs(10),
        }
    }
}

/// `name` in a directory of `$PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The daemon of one GPU, driven through the control binary.
#[derive(Debug, Clone)]
pub struct MpsDaemon {
    gpu: u32,
    /// Value for the daemon's `CUDA_VISIBLE_DEVICES` (the GPU's UUID: stable, unlike indices).
    device: String,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    config: MpsConfig,
}

fn mib_arg(bytes: u64) -> String {
    format!("{}M", (bytes >> 20).max(1))
}

impl MpsDaemon {
    pub fn new(gpu: u32, device: impl Into<String>, config: &MpsConfig) -> MpsDaemon {
        let dir = config.base_dir.join(format!("gpu{gpu}"));
        MpsDaemon {
            gpu,
            device: device.into(),
            pipe_dir: dir.join("pipe"),
            log_dir: dir.join("log"),
            config: config.clone(),
        }
    }

    pub fn pipe_dir(&self) -> &Path {
        &self.pipe_dir
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    fn base_command(&self) -> Command {
        let mut c = Command::new(&self.config.binary);
        c.env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log_dir)
            .env("CUDA_VISIBLE_DEVICES", &self.device);
        c
    }

    /// Run one control command and return its stdout.
    pub fn command(&self, cmd: &str) -> Result<String, MpsError> {
        let _span = tracing::debug_span!("mps", gpu = self.gpu, cmd).entered();
        let spawn = || {
            self.base_command()
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        };
        // A binary being written (an upgrade in place), or whose write
        // descriptor a concurrent fork still holds, is briefly "text file
        // busy": a few short retries, then the error.
        let mut attempt = spawn();
        for _ in 0..5 {
            match &attempt {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    attempt = spawn();
                }
                _ => break,
            }
        }
        let mut child = attempt.map_err(|source| MpsError::Spawn {
            binary: self.config.binary.clone(),
            source,
        })?;
        if let Some(mut stdin) = child.stdin.take() {
            // A daemon that exits early closes the pipe; its exit status tells us why.
            let _ = stdin.write_all(format!("{cmd}\n").as_bytes());
        }
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let timeout = self.config.command_timeout;
        let out = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => {
                let _ = procfs::signal(pid, Signal::KILL);
                return Err(MpsError::Timeout {
                    gpu: self.gpu,
                    command: cmd.to_string(),
                    timeout,
                });
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(MpsError::Command {
                gpu: self.gpu,
                command: cmd.to_string(),
                message: format!("{}: {}{}", out.status, stderr.trim(), stdout.trim()),
            });
        }
        tracing::debug!(answer = stdout.trim(), "mps command");
        Ok(stdout)
    }

    fn parse_pids(&self, cmd: &str, text: &str) -> Result<Vec<u32>, MpsError> {
        text.split_whitespace()
            .map(|w| {
                w.parse().map_err(|_| MpsError::Parse {
                    gpu: self.gpu,
                    command: cmd.to_string(),
                    answer: text.to_string(),
                })
            })
            .collect()
    }

    fn wait_until_answering(&self) -> Result<(), MpsError> {
        let deadline = Instant::now() + self.config.command_timeout;
        loop {
            match self.command("get_default_active_thread_percentage") {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl MpsControl for MpsDaemon {
    fn gpu(&self) -> u32 {
        self.gpu
    }

    fn start(&self) -> Result<(), MpsError> {
        std::fs::create_dir_all(&self.pipe_dir)?;
        std::fs::create_dir_all(&self.log_dir)?;
        let mut c = self.base_command();
        c.arg("-d")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(p) = self.config.default_active_thread_pct {
            c.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p.to_string());
        }
        let out = c.output().map_err(|source| MpsError::Spawn {
            binary: self.config.binary.clone(),
            source,
        })?;
        if !out.status.success() {
            return Err(MpsError::Command {
                gpu: self.gpu,
                command: "-d".into(),
                message: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        self.wait_until_answering()?;
        if let Some(p) = self.config.default_active_thread_pct {
            self.set_default_active_thread_percentage(p)?;
        }
        if let Some(b) = self.config.default_pinned_mem_limit_bytes {
            self.set_default_device_pinned_mem_limit(b)?;
        }
        tracing::info!(gpu = self.gpu, pipe = %self.pipe_dir.display(), "MPS daemon started");
        Ok(())
    }

    fn quit(&self) -> Result<(), MpsError> {
        self.command("quit").map(drop)
    }

    fn server_list(&self) -> Result<Vec<u32>, MpsError> {
        let cmd = "get_server_list";
        let out = self.command(cmd)?;
        self.parse_pids(cmd, &out)
    }

    fn server_status(&self, server: u32) -> Result<ServerStatus, MpsError> {
        let out = self.command(&format!("get_server_status {server}"))?;
        let t = out.trim();
        let up = t.to_ascii_uppercase();
        Ok(if up.contains("FAULT") {
            ServerStatus::Fault
        } else if up.contains("ACTIVE") {
            ServerStatus::Active
        } else if up.contains("INIT") {
            ServerStatus::Init
        } else {
            ServerStatus::Other(t.to_string())
        })
    }

    fn client_list(&self, server: u32) -> Result<Vec<u32>, MpsError> {
        let cmd = format!("get_client_list {server}");
        let out = self.command(&cmd)?;
        self.parse_pids(&cmd, &out)
    }

    fn set_default_active_thread_percentage(&self, pct: u8) -> Result<(), MpsError> {
        let pct = pct.clamp(1, 100);
        self.command(&format!("set_default_active_thread_percentage {pct}"))
            .map(drop)
    }

    fn default_active_thread_percentage(&self) -> Result<f64, MpsError> {
        let cmd = "get_default_active_thread_percentage";
        let out = self.command(cmd)?;
        out.trim().parse().map_err(|_| MpsError::Parse {
            gpu: self.gpu,
            command: cmd.to_string(),
            answer: out.clone(),
        })
    }

    fn set_active_thread_percentage(&self, server: u32, pct: u8) -> Result<(), MpsError> {
        let pct = pct.clamp(1, 100);
        self.command(&format!("set_active_thread_percentage {server} {pct}"))
            .map(drop)
    }

    fn set_default_device_pinned_mem_limit(&self, bytes: u64) -> Result<(), MpsError> {
        // Device 0: the daemon only sees this GPU (CUDA_VISIBLE_DEVICES).
        self.command(&format!(
            "set_default_device_pinned_mem_limit 0 {}",
            mib_arg(bytes)
        ))
        .map(drop)
    }

    fn set_device_pinned_mem_limit(&self, server: u32, bytes: u64) -> Result<(), MpsError> {
        self.command(&format!(
            "set_device_pinned_mem_limit {server} 0 {}",
            mib_arg(bytes)
        ))
        .map(drop)
    }

    fn terminate_client(&self, server: u32, client: u32) -> Result<(), MpsError> {
        self.command(&format!("terminate_client {server} {client}"))
            .map(drop)
    }

    fn health(&self) -> MpsHealth {
        let servers = match self.server_list() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(gpu = self.gpu, error = %e, "MPS daemon not answering");
                return MpsHealth {
                    daemon_running: false,
                    servers: Vec::new(),
                };
            }
        };
        let servers = servers
            .into_iter()
            .map(|s| {
                let st = self
                    .server_status(s)
                    .unwrap_or_else(|e| ServerStatus::Other(e.to_string()));
                (s, st)
            })
            .collect();
        MpsHealth {
            daemon_running: true,
            servers,
        }
    }

    fn client_env(&self) -> Vec<(String, String)> {
        vec![
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                self.pipe_dir.display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                self.log_dir.display().to_string(),
            ),
        ]
    }
}

/// The daemons of all GPUs of the node.
pub struct MpsManager {
    daemons: Vec<Box<dyn MpsControl>>,
    set_exclusive_process: bool,
}

impl std::fmt::Debug for MpsManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpsManager")
            .field(
                "gpus",
                &self.daemons.iter().map(|d| d.gpu()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl MpsManager {
    /// One [`MpsDaemon`] per `(gpu index, device id for CUDA_VISIBLE_DEVICES)`.
    pub fn new(config: &MpsConfig, gpus: &[(u32, String)]) -> MpsManager {
        MpsManager {
            daemons: gpus
                .iter()
                .map(|(i, dev)| Box::new(MpsDaemon::new(*i, dev.clone(), config)) as Box<_>)
                .collect(),
            set_exclusive_process: config.set_exclusive_process,
        }
    }

    /// From arbitrary [`MpsControl`] implementations (tests, other protocol versions).
    pub fn from_daemons(daemons: Vec<Box<dyn MpsControl>>) -> MpsManager {
        MpsManager {
            daemons,
            set_exclusive_process: false,
        }
    }

    pub fn for_gpu(&self, gpu: u32) -> Option<&dyn MpsControl> {
        self.daemons
            .iter()
            .find(|d| d.gpu() == gpu)
            .map(|d| d.as_ref())
    }

    pub fn gpus(&self) -> Vec<u32> {
        self.daemons.iter().map(|d| d.gpu()).collect()
    }

    /// Set `EXCLUSIVE_PROCESS` (if configured) and start every daemon.
    pub fn start_all(&self, backend: Option<&dyn GpuBackend>) -> Result<(), MpsError> {
        for d in &self.daemons {
            if self.set_exclusive_process
                && let Some(b) = backend
                && let Err(e) = b.set_compute_mode(d.gpu(), ComputeMode::ExclusiveProcess)
            {
                tracing::warn!(gpu = d.gpu(), error = %e, "cannot set EXCLUSIVE_PROCESS");
            }
            d.start()?;
        }
        Ok(())
    }

    /// `quit` every daemon and restore `DEFAULT` compute mode (if configured). Returns the
    /// first error after trying all.
    pub fn stop_all(&self, backend: Option<&dyn GpuBackend>) -> Result<(), MpsError> {
        let mut first = None;
        for d in &self.daemons {
            if let Err(e) = d.quit() {
                tracing::warn!(gpu = d.gpu(), error = %e, "MPS quit failed");
                first.get_or_insert(e);
            }
            if self.set_exclusive_process
                && let Some(b) = backend
                && let Err(e) = b.set_compute_mode(d.gpu(), ComputeMode::Default)
            {
                tracing::warn!(gpu = d.gpu(), error = %e, "cannot restore DEFAULT compute mode");
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Restart one GPU's MPS after a fault: terminate every client's outstanding work so the old
/// server can exit (a server in `FAULT` refuses new clients until its affected clients are
/// gone), `quit` the daemon and start it afresh with the configured defaults. Clients must
/// reconnect. Returns how many clients were terminated. A client that cannot be terminated is
/// logged and does not stop the restart: `quit` and `start` are what bring the GPU back.
pub fn restart(daemon: &dyn MpsControl) -> Result<usize, MpsError> {
    let gpu = daemon.gpu();
    let mut terminated = 0;
    for server in daemon.server_list().unwrap_or_default() {
        for client in daemon.client_list(server).unwrap_or_default() {
            match daemon.terminate_client(server, client) {
                Ok(()) => terminated += 1,
                Err(e) => {
                    tracing::warn!(gpu, server, client, error = %e, "terminating MPS client")
                }
            }
        }
    }
    daemon.quit()?;
    daemon.start()?;
    Ok(terminated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_limit_argument_is_whole_mib() {
        assert_eq!(mib_arg(10 << 30), "10240M");
        assert_eq!(mib_arg(1), "1M");
        assert_eq!(mib_arg((3 << 20) + 5), "3M");
    }

    #[test]
    fn missing_binary_is_a_spawn_error() {
        let cfg = MpsConfig::new(
            "/nonexistent/nvidia-cuda-mps-control".into(),
            Path::new("/tmp"),
        );
        let d = MpsDaemon::new(0, "GPU-x", &cfg);
        assert!(matches!(d.server_list(), Err(MpsError::Spawn { .. })));
        assert!(!d.health().daemon_running);
    }
}
