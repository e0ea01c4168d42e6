//! Prints what the node's NVML backend (and, if available, the MPS manager) sees on this
//! machine. Run by `scripts/node-gpu-check.sh` on a GPU machine; with `--nvml-lib` it runs
//! against any `libnvidia-ml.so.1` (e.g. the fake one in `tests/fake-nvml`).
//!
//! Usage: gpu_check [--nvml-lib PATH] [--samples N] [--interval-ms MS]
//!                  [--mps-binary PATH | --no-mps] [--mps-dir DIR]
//!                  [--block PATH] [--mps-client CMD] [--mps-client-pcts 100,25]
//!                  [--mps-fault CMD]
//!
//! `--block PATH` reconciles a workload's control block with NVML as the node does every
//! period (`ControlBlock::reconcile`): the NVML memory of the processes in the block's slots
//! minus what the interposer charged is written to the block as `unseen_bytes` (context and
//! module memory), which counts against the quota from then on.
//!
//! `--mps-client CMD` runs `sh -c CMD` as a client of the private MPS daemon once per
//! percentage in `--mps-client-pcts` (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), to measure what a
//! thread percentage does to a real kernel's throughput.
//!
//! `--mps-fault CMD` then checks the node's recovery from a fatal GPU fault under MPS: the
//! `--mps-client` command runs in the background as a bystander, `sh -c CMD` (a client that
//! faults, e.g. a device-side assert) runs beside it, the daemon's health is polled, and
//! [`arbiter_node::mps::restart`] — what the enforcer's `RestartMps` action does — brings the
//! GPU back; a fresh client must then run.

use anyhow::{Context, Result, bail};
use arbiter_interpose::control::MappedBlock;
use arbiter_node::NvmlBackend;
use arbiter_node::gpu::{GpuBackend, throttle_reason_names};
use arbiter_node::mps::{self, MpsConfig, MpsControl, MpsDaemon, find_on_path};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Args {
    nvml_lib: Option<PathBuf>,
    samples: u32,
    interval: Duration,
    mps_binary: Option<PathBuf>,
    no_mps: bool,
    mps_dir: Option<PathBuf>,
    block: Option<PathBuf>,
    mps_client: Option<String>,
    mps_client_pcts: Vec<u8>,
    mps_fault: Option<String>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        nvml_lib: None,
        samples: 3,
        interval: Duration::from_millis(500),
        mps_binary: None,
        no_mps: false,
        mps_dir: None,
        block: None,
        mps_client: None,
        mps_client_pcts: vec![100, 25],
        mps_fault: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--nvml-lib" => a.nvml_lib = Some(value("--nvml-lib")?.into()),
            "--samples" => a.samples = value("--samples")?.parse().context("--samples")?,
            "--interval-ms" => {
                a.interval =
                    Duration::from_millis(value("--interval-ms")?.parse().context("--interval-ms")?)
            }
            "--mps-binary" => a.mps_binary = Some(value("--mps-binary")?.into()),
            "--mps-dir" => a.mps_dir = Some(value("--mps-dir")?.into()),
            "--no-mps" => a.no_mps = true,
            "--block" => a.block = Some(value("--block")?.into()),
            "--mps-client" => a.mps_client = Some(value("--mps-client")?),
            "--mps-fault" => a.mps_fault = Some(value("--mps-fault")?),
            "--mps-client-pcts" => {
                a.mps_client_pcts = value("--mps-client-pcts")?
                    .split(',')
                    .map(|p| p.trim().parse().context("--mps-client-pcts"))
                    .collect::<Result<_>>()?
            }
            "-h" | "--help" => {
                println!(
                    "gpu_check [--nvml-lib PATH] [--samples N] [--interval-ms MS] \
                     [--mps-binary PATH | --no-mps] [--mps-dir DIR] [--block PATH] \
                     [--mps-client CMD] [--mps-client-pcts 100,25] [--mps-fault CMD]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

fn main() -> Result<()> {
    // The backend's warnings (an XID event with its code, among them) on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    let args = parse_args()?;
    let nvml = NvmlBackend::open(args.nvml_lib.as_deref()).context("initialising NVML")?;
    println!("== NVML");
    println!(
        "driver version: {}",
        nvml.driver_version().unwrap_or_else(|e| format!("? ({e})"))
    );
    let count = nvml.device_count().context("device count")?;
    println!("GPUs: {count}");
    let mut uuids = Vec::new();
    for i in 0..count {
        let info = nvml
            .device_info(i)
            .with_context(|| format!("GPU {i} info"))?;
        println!(
            "GPU {i}: {} {} memory {} MiB, max SM clock {} MHz, compute mode {}",
            info.name,
            info.uuid,
            info.memory_total_bytes >> 20,
            info.max_sm_clock_mhz,
            nvml.compute_mode(i)
                .map_or_else(|e| format!("? ({e})"), |m| format!("{m:?}"))
        );
        uuids.push((i, info.uuid));
    }
    for round in 0..args.samples {
        if round > 0 {
            std::thread::sleep(args.interval);
        }
        println!("-- sample {round}");
        for i in 0..count {
            match nvml.sample(i) {
                Ok(s) => {
                    println!(
                        "GPU {i}: util {}% mem-util {}% memory {}/{} MiB SM {}/{} MHz throttle {:#x} {:?}",
                        s.utilization_pct,
                        s.memory_util_pct,
                        s.memory_used_bytes >> 20,
                        s.memory_total_bytes >> 20,
                        s.sm_clock_mhz,
                        s.max_sm_clock_mhz,
                        s.throttle_reasons,
                        throttle_reason_names(s.throttle_reasons)
                    );
                    for p in &s.processes {
                        println!(
                            "    pid {} {:?} memory {} sm {} mem {}",
                            p.pid,
                            p.kind,
                            p.used_memory_bytes
                                .map_or("n/a".into(), |b| format!("{} MiB", b >> 20)),
                            p.sm_util_pct.map_or("-".into(), |v| format!("{v}%")),
                            p.mem_util_pct.map_or("-".into(), |v| format!("{v}%")),
                        );
                    }
                }
                Err(e) => println!("GPU {i}: sample failed: {e}"),
            }
        }
    }

    if let Some(path) = &args.block {
        reconcile_block(&nvml, path)?;
    }

    if args.no_mps {
        return Ok(());
    }
    let binary = args
        .mps_binary
        .clone()
        .or_else(|| find_on_path("nvidia-cuda-mps-control"));
    let Some(binary) = binary else {
        println!("== MPS: nvidia-cuda-mps-control not found; skipped");
        return Ok(());
    };
    let Some((gpu, uuid)) = uuids.first().cloned() else {
        println!("== MPS: no GPU; skipped");
        return Ok(());
    };
    // A private daemon (own pipe/log dirs) so an MPS setup already on the machine is untouched.
    let dir = match &args.mps_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("arbiter-node-gpu-check-{}", std::process::id())),
    };
    println!(
        "== MPS ({}) on GPU {gpu} ({uuid}), dirs under {}",
        binary.display(),
        dir.display()
    );
    let cfg = MpsConfig::new(binary, &dir);
    let d = MpsDaemon::new(gpu, uuid, &cfg);
    d.start().context("starting the MPS control daemon")?;
    let result = (|| -> Result<()> {
        println!(
            "default active thread percentage: {}",
            d.default_active_thread_percentage()?
        );
        d.set_default_active_thread_percentage(50)?;
        println!(
            "after set_default_active_thread_percentage 50: {}",
            d.default_active_thread_percentage()?
        );
        let h = d.health();
        println!(
            "daemon running: {}, servers: {:?}",
            h.daemon_running, h.servers
        );
        println!("client environment: {:?}", d.client_env());
        if let Some(cmd) = &args.mps_client {
            for pct in &args.mps_client_pcts {
                run_mps_client(cmd, &d.client_env(), *pct)?;
            }
        }
        if let Some(fault) = &args.mps_fault {
            mps_fault_check(&nvml, gpu, &d, args.mps_client.as_deref(), fault)?;
        }
        Ok(())
    })();
    if let Err(e) = d.quit() {
        println!("quit failed: {e}");
    } else {
        println!("daemon stopped (quit)");
    }
    if args.mps_dir.is_none() {
        // Only what we created ourselves.
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// One reconciliation of GPU 0 as the node's enforcer does it each period: the block's charge
/// before sampling, NVML's memory of the block's processes, the difference written back.
fn reconcile_block(nvml: &NvmlBackend, path: &std::path::Path) -> Result<()> {
    use std::sync::atomic::Ordering;
    let block = MappedBlock::open(path)
        .with_context(|| format!("opening control block {}", path.display()))?;
    let charged_before = block.device(0).used_bytes.load(Ordering::Relaxed);
    let pids: Vec<u64> = block
        .processes
        .iter()
        .map(|p| p.pid.load(Ordering::Acquire))
        .filter(|&pid| pid != 0)
        .collect();
    let sample = nvml.sample(0).context("sampling GPU 0")?;
    let mut found = Vec::new();
    let mut nvml_bytes = 0u64;
    for p in &sample.processes {
        if pids.contains(&u64::from(p.pid)) {
            found.push(p.pid);
            nvml_bytes += p.used_memory_bytes.unwrap_or(0);
        }
    }
    println!("== reconciliation of {}", path.display());
    println!(
        "block processes {pids:?}; NVML processes on GPU 0 {:?}",
        sample.processes.iter().map(|p| p.pid).collect::<Vec<_>>()
    );
    if found.is_empty() {
        println!(
            "reconcile: NVML reports none of the block's processes (another pid namespace?); \
             nothing written"
        );
        return Ok(());
    }
    let unseen = block.reconcile(0, nvml_bytes, charged_before);
    println!(
        "reconcile: charged {charged_before} B ({} MiB), NVML {nvml_bytes} B ({} MiB) for pids \
         {found:?}, unseen {unseen} B ({} MiB)",
        charged_before >> 20,
        nvml_bytes >> 20,
        unseen >> 20
    );
    Ok(())
}

/// `sh -c cmd` with the private daemon's client environment.
fn mps_client_command(cmd: &str, env: &[(String, String)]) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    command
}

/// Prints how a client ended: its status, its stdout and the last lines of its stderr.
fn print_exit(label: &str, out: &std::process::Output) {
    println!(
        "{label}: status {}, stdout {:?}, stderr tail {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
    );
}

/// Runs `sh -c cmd` as a client of the private MPS daemon limited to `pct` % of the SMs and
/// prints its output.
fn run_mps_client(cmd: &str, env: &[(String, String)], pct: u8) -> Result<()> {
    let out = mps_client_command(cmd, env)
        .env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", pct.to_string())
        .output()
        .with_context(|| format!("running the MPS client {cmd:?}"))?;
    print_exit(&format!("mps client at {pct}%"), &out);
    Ok(())
}

/// `sh -c cmd` as a client of the private daemon, in the background.
fn spawn_mps_client(cmd: &str, env: &[(String, String)]) -> Result<Child> {
    mps_client_command(cmd, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the MPS client {cmd:?}"))
}

/// The daemon's servers, their states and their clients, on one line.
fn describe_health(d: &MpsDaemon) -> String {
    let h = d.health();
    let servers: Vec<String> = h
        .servers
        .iter()
        .map(|(pid, status)| {
            let clients = d.client_list(*pid).unwrap_or_default();
            format!("server {pid} {status:?} clients {clients:?}")
        })
        .collect();
    format!(
        "daemon running {}, healthy {}, [{}]",
        h.daemon_running,
        h.is_healthy(),
        servers.join("; ")
    )
}

/// A client faults beside a bystander; the health poll sees what MPS does with it; the
/// enforcer's restart brings the GPU back and a fresh client runs.
fn mps_fault_check(
    nvml: &NvmlBackend,
    gpu: u32,
    d: &MpsDaemon,
    bystander: Option<&str>,
    fault: &str,
) -> Result<()> {
    println!("== MPS fault and restart");
    let xids = || nvml.sample(gpu).map(|s| s.xid_errors).unwrap_or(0);
    println!("XID errors counted before: {}", xids());
    let env = d.client_env();
    let victim = match bystander {
        Some(cmd) => {
            let child = spawn_mps_client(cmd, &env)?;
            // The fault must find the bystander connected (a client that connects after it
            // never sees it): wait until the server lists a client.
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(60)
                && !d
                    .server_list()
                    .unwrap_or_default()
                    .iter()
                    .any(|server| !d.client_list(*server).unwrap_or_default().is_empty())
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            println!(
                "bystander running (+{:?}): {}",
                started.elapsed(),
                describe_health(d)
            );
            Some(child)
        }
        None => None,
    };
    let out = mps_client_command(fault, &env)
        .output()
        .with_context(|| format!("running the faulting client {fault:?}"))?;
    print_exit("faulting client", &out);
    let mut last = String::new();
    let poll = Instant::now();
    while poll.elapsed() < Duration::from_secs(3) {
        let now = describe_health(d);
        if now != last {
            println!("after the fault (+{:?}): {now}", poll.elapsed());
            last = now;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("XID errors counted after the fault: {}", xids());
    let t0 = Instant::now();
    let terminated = mps::restart(d).context("restarting MPS as the enforcer does")?;
    println!(
        "restart: {terminated} client(s) terminated, daemon quit and started in {:?}; {}",
        t0.elapsed(),
        describe_health(d)
    );
    if let Some(mut child) = victim {
        let waited = Instant::now();
        while child.try_wait()?.is_none() && waited.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if child.try_wait()?.is_none() {
            println!("bystander still running 30 s after the restart; killing it");
            child.kill()?;
        }
        print_exit("bystander", &child.wait_with_output()?);
    }
    if let Some(cmd) = bystander {
        println!("a fresh client after the restart:");
        run_mps_client(cmd, &env, 100)?;
    }
    println!("after the fresh client: {}", describe_health(d));
    Ok(())
}
