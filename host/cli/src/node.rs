//! `arbiter node`: the node agent (enforcer + link to `arbiter serve`).

use crate::client::parse_duration;
use anyhow::Context;
use arbiter_host::runtime::PolicyEngine;
use arbiter_host::watch::{LoadError, PolicyDirectory, PolicyTarget, WatchGuard};
use arbiter_node::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, DEFAULT_POLICY};
use arbiter_node::mps::{MpsConfig, MpsManager};
use arbiter_node::policies_dir::{self, NodePolicies};
use arbiter_node::supervisor::{Supervisor, SupervisorConfig};
use arbiter_node::{AgentConfig, GpuBackend, Node, NodeConfig, NvmlBackend, SimBackend};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Args)]
pub struct NodeArgs {
    /// Control plane URL (like every other command's, `ARBITER_SERVER`).
    #[arg(long, env = "ARBITER_SERVER", default_value = "http://127.0.0.1:7070")]
    pub server: String,
    /// Node token (`node.token` in the control plane's data directory: it
    /// opens node sessions and nothing else); the admin token works too. Required;
    /// checked after parsing, so `arbiter --token T node …` gives it too.
    #[arg(long, env = "ARBITER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate to trust for an `https://` server (the plane's
    /// `<data>/tls/ca.pem`); default: the system's roots.
    #[arg(long, env = "ARBITER_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Node name (unique in the cluster).
    #[arg(long)]
    pub name: String,
    /// Pool to join (default: the control plane's).
    #[arg(long, default_value = "")]
    pub pool: String,
    /// Workload records and logs; an agent restarted on the same directory adopts the
    /// workloads still running.
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Control blocks (default: `<state-dir>/blocks`; `/dev/shm/...` is a good choice).
    #[arg(long)]
    pub block_dir: Option<PathBuf>,
    /// `libnvidia-ml.so.1` to load (default: the system's).
    #[arg(long)]
    pub nvml_lib: Option<PathBuf>,
    /// Simulated GPUs instead of NVML (machines without a GPU; 1 to 1,024, as the plane
    /// accepts).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(arbiter_policy_sdk::model::MAX_NODE_GPUS)))]
    pub sim_gpus: Option<u32>,
    /// Memory of each simulated GPU, MiB (at most 16 TiB).
    #[arg(long, default_value_t = 16_384, value_parser = clap::value_parser!(u64).range(1..=16 << 20))]
    pub sim_gpu_memory_mib: u64,
    /// `libarbiter_interpose.so` (default: next to this executable).
    #[arg(long)]
    pub interposer: Option<PathBuf>,
    /// Control period of the node policy (10ms to 1h).
    #[arg(long, value_parser = parse_period, default_value = "100ms")]
    pub period: Duration,
    /// Deadline of one call into the node policy (1ms to 1h; default: a quarter of
    /// --period). A call past it is a fault: the period changes nothing, and after three
    /// in a row the native fallback (which never acts) takes over. Raise it on a node
    /// whose CPUs are shared with busy work, where a healthy policy can be preempted
    /// mid-call.
    #[arg(long, value_parser = parse_policy_deadline)]
    pub policy_deadline: Option<Duration>,
    /// Built-in node policy (`none`: only supervise).
    #[arg(long, default_value = DEFAULT_POLICY)]
    pub policy: String,
    /// Configuration file (TOML) for --policy (default: the policy's own defaults).
    #[arg(long)]
    pub policy_config: Option<PathBuf>,
    /// A directory watched for the node's own policy: a compiled `coordinator.wasm` dropped
    /// into it (with its configuration in `coordinator.toml`, if any) replaces the running
    /// coordinator policy from the next control period; removing it goes back to --policy.
    /// What cannot load is said once and the running policy stays.
    #[arg(long)]
    pub policies_dir: Option<PathBuf>,
    /// SIGTERM → SIGKILL grace period on eviction.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// Extra environment for workloads (`KEY=VALUE`, repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// CPU reported to the control plane (milli-CPU; default: this machine's).
    #[arg(long)]
    pub cpu_milli: Option<u32>,
    /// Memory reported to the control plane (MiB; default: this machine's).
    #[arg(long)]
    pub memory_mib: Option<u32>,
    /// Run one MPS control daemon per GPU with this binary (normally
    /// `nvidia-cuda-mps-control`); its pipes and logs live under
    /// `<state-dir>/mps`. Without it, workloads share GPUs by time slicing and
    /// the interposer's pacing alone.
    #[arg(long)]
    pub mps_control: Option<PathBuf>,
    /// Host spill for opportunistic work (QoS ≥ 1): each such workload may hold this much
    /// host memory beyond its GPU memory limit, served by the interposer from host-resident
    /// managed memory (slower; see docs/interposer.md). 0: no spill. Pair it with
    /// `arbiter serve --host-spill`, which lets the scheduler count that memory as soft.
    #[arg(long, default_value_t = 0)]
    pub host_spill_mib: u32,
}

fn default_interposer() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locate this executable")?;
    Ok(exe
        .parent()
        .map(|d| d.join("libarbiter_interpose.so"))
        .unwrap_or_else(|| PathBuf::from("libarbiter_interpose.so")))
}

/// A duration from `min` to an hour, or why not.
fn duration_up_to_an_hour(s: &str, min: Duration, what: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if (min..=Duration::from_secs(3600)).contains(&d) {
        Ok(d)
    } else {
        Err(format!("`{s}` is not {what} from {min:?} to 1h"))
    }
}

/// A control period: each one asks the node policy under a deadline, so a zero period
/// spun the policy into deadline faults, and one past an hour never acts.
fn parse_period(s: &str) -> Result<Duration, String> {
    duration_up_to_an_hour(s, Duration::from_millis(10), "a control period")
}

fn parse_policy_deadline(s: &str) -> Result<Duration, String> {
    duration_up_to_an_hour(s, Duration::from_millis(1), "a policy deadline")
}

/// The node's watched directory, saying on stdout what each file did: the operator who
/// dropped a policy in sees it serve, or why it did not.
struct Announced {
    inner: NodePolicies,
    node: String,
}

impl Announced {
    fn say(&self, what: std::fmt::Arguments<'_>) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "arbiter node {}: {what}", self.node);
        let _ = out.flush();
    }

    fn serving(&self) -> String {
        self.inner
            .serving()
            .unwrap_or_else(|| "none (the fallback, which never acts)".to_string())
    }
}

impl PolicyTarget for Announced {
    fn load(
        &self,
        file: &Path,
        wasm: &[u8],
        config: Option<String>,
    ) -> Result<(String, u64), LoadError> {
        let loaded = self.inner.load(file, wasm, config);
        match &loaded {
            Ok((_, generation)) => self.say(format_args!(
                "policy {} (generation {generation}) from {}",
                self.serving(),
                file.display()
            )),
            Err(LoadError::File(e) | LoadError::NotNow(e)) => self.say(format_args!(
                "not loaded: {}: {e:#} ({} serves)",
                file.display(),
                self.serving()
            )),
        }
        loaded
    }

    fn unload(&self, slot: &str, generation: u64) -> anyhow::Result<()> {
        self.inner.unload(slot, generation)?;
        self.say(format_args!("policy removed; {} serves", self.serving()));
        Ok(())
    }
}

/// The node's coordinator (`None`: only supervise) and, with --policies-dir, the watch that
/// swaps policies into it (it stops when dropped).
fn node_policy(a: &NodeArgs) -> anyhow::Result<(Option<Coordinator>, Option<WatchGuard>)> {
    let settings = CoordinatorConfig {
        period: a.period,
        deadline: a.policy_deadline,
        ..CoordinatorConfig::default()
    };
    let engine = PolicyEngine::new(settings.runtime_config())
        .context("creating the Wasm engine for node policies")?;
    let config = match &a.policy_config {
        Some(_) if a.policy == "none" => {
            anyhow::bail!("--policy-config configures --policy, and --policy is none")
        }
        Some(path) => Some(arbiter_host::files::read_config(path)?),
        None => None,
    };
    let builtin = if a.policy == "none" {
        None
    } else {
        let wasm = arbiter_policies::get(&a.policy)
            .ok_or_else(|| CoordinatorError::NoSuchBuiltin(a.policy.clone()))?;
        let compiled = engine
            .compile(wasm)
            .map_err(|fault| CoordinatorError::Load {
                name: a.policy.clone(),
                fault,
            })
            .with_context(|| format!("node policy {}", a.policy))?;
        Some(compiled)
    };
    let coordinator = match &builtin {
        Some(compiled) => Some(
            Coordinator::from_compiled(compiled.clone(), config.as_deref(), settings)
                .with_context(|| format!("node policy {}", a.policy))?,
        ),
        // A watched directory needs a slot to load into; until a policy arrives its
        // fallback never acts, as `--policy none` does.
        None if a.policies_dir.is_some() => Some(Coordinator::fallback_only(settings)),
        None => None,
    };
    let watched = match (&a.policies_dir, &coordinator) {
        (Some(dir), Some(coordinator)) => {
            let target = Announced {
                inner: NodePolicies::new(coordinator, engine, builtin.map(|c| (c, config))),
                node: a.name.clone(),
            };
            let directory = Arc::new(PolicyDirectory::new(dir.clone(), Arc::new(target)));
            Some(
                directory
                    .watch(policies_dir::POLL)
                    .with_context(|| format!("watching {}", dir.display()))?,
            )
        }
        _ => None,
    };
    Ok((coordinator, watched))
}

pub fn node(a: &NodeArgs) -> anyhow::Result<()> {
    let token = a.token.as_deref().context(
        "no --token given (or ARBITER_TOKEN): an agent needs the node token, `node.token` in \
         the control plane's data directory",
    )?;
    let mut env = Vec::new();
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv}: expected KEY=VALUE"))?;
        env.push((k.to_string(), v.to_string()));
    }
    // First: a policy that cannot load stops the agent before it starts anything (MPS
    // daemons, adopted workloads).
    let (coordinator, _watched) = node_policy(a)?;
    let backend: Arc<dyn GpuBackend> = match a.sim_gpus {
        Some(n) => Arc::new(SimBackend::new(n, a.sim_gpu_memory_mib << 20)),
        None => Arc::new(
            NvmlBackend::open(a.nvml_lib.as_deref())
                .context("NVML (use --sim-gpus N on a machine without a GPU)")?,
        ),
    };
    let interposer = match &a.interposer {
        Some(p) => p.clone(),
        None => default_interposer()?,
    };
    if !interposer.exists() {
        tracing::warn!(path = %interposer.display(), "interposer not found; workloads run without enforcement");
    }
    let block_dir = a
        .block_dir
        .clone()
        .unwrap_or_else(|| a.state_dir.join("blocks"));
    let mut sc = SupervisorConfig::new(&a.state_dir, &block_dir, &interposer);
    sc.control_period = a.period;
    sc.grace = a.grace;
    let (supervisor, adopted) = Supervisor::open(sc).context("open the state dir")?;
    if !adopted.adopted.is_empty() {
        tracing::info!(workloads = ?adopted.adopted, "adopted running workloads");
    }
    let mps = match &a.mps_control {
        Some(binary) => {
            let config = MpsConfig::new(binary.clone(), &a.state_dir.join("mps"));
            let count = backend.device_count().context("counting GPUs for MPS")?;
            let mut gpus = Vec::with_capacity(count as usize);
            for i in 0..count {
                let info = backend
                    .device_info(i)
                    .with_context(|| format!("GPU {i} for MPS"))?;
                gpus.push((i, info.uuid));
            }
            let manager = MpsManager::new(&config, &gpus);
            manager
                .start_all(Some(&*backend))
                .context("starting the MPS control daemons")?;
            Some(manager)
        }
        None => None,
    };
    let node = Node::new(backend, mps, supervisor, NodeConfig::default());
    let name = a.name.clone();
    let mut cfg = AgentConfig::new(&a.server, token, &a.name);
    if let Some(path) = &a.ca_cert {
        cfg.ca_pem = Some(arbiter_host::files::read_at_most(
            path,
            arbiter_host::files::MAX_CONFIG_FILE,
        )?);
    }
    cfg.instance = arbiter_node::agent::instance_id(&a.state_dir)?;
    cfg.pool = a.pool.clone();
    cfg.cpu_milli = a.cpu_milli;
    cfg.memory_mib = a.memory_mib;
    cfg.control_period = a.period;
    cfg.workload_env = env;
    cfg.host_spill_mib = a.host_spill_mib;
    cfg.on_registered = Some(Arc::new(move |n| {
        let mut out = std::io::stdout().lock();
        let _ = if n == 1 {
            writeln!(out, "arbiter node {name} connected")
        } else {
            writeln!(out, "arbiter node {name} reconnected")
        };
        let _ = out.flush();
    }));

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("arbiter-node-signals".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async {
                    let mut term = match tokio::signal::unix::signal(
                        tokio::signal::unix::SignalKind::terminate(),
                    ) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                    }
                });
                stop.store(true, Ordering::Relaxed);
            })
            .context("spawn the signal thread")?;
    }
    arbiter_node::run_agent(cfg, node, coordinator, stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_and_policy_deadlines_are_bounded_and_say_their_range() {
        assert_eq!(parse_period("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_period("1h"), Ok(Duration::from_secs(3600)));
        let zero = parse_period("0s").unwrap_err();
        assert!(
            zero.contains("not a control period from 10ms to 1h"),
            "{zero}"
        );
        assert!(parse_period("2h").is_err());
        assert_eq!(parse_policy_deadline("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_policy_deadline("10s"), Ok(Duration::from_secs(10)));
        let zero = parse_policy_deadline("0ms").unwrap_err();
        assert!(
            zero.contains("not a policy deadline from 1ms to 1h"),
            "{zero}"
        );
    }
}
