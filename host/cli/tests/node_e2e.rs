//! `arbiter serve --nodes 0` and two `arbiter node` agents as real processes on loopback,
//! with the fake NVML (`tests/fake-nvml`), the fake driver (`tests/fake-cuda`), the real
//! interposer and the C workload (`tests/cuda-workload`), driven by the real CLI:
//!
//! 1. a job runs on the node the policy chose, under the interposer with its memory quota
//!    (the workload sees the quota as the device's memory) and its compute share, and its exit
//!    code reaches the host;
//! 2. `kill -9` of the node agent running a long job: the host marks the node lost and
//!    reschedules the job on the other node;
//! 3. the killed agent restarts on the same state dir, adopts its surviving workload,
//!    re-registers, and the host stops the duplicate.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

mod common;

use common::BIN;
const GPU_MIB: u64 = 16_384;
const QUOTA_MIB: u64 = 1024;

/// Interposer, fake libcuda and C workloads, built once per test binary (the
/// tests run in parallel and would otherwise rebuild the same directory).
fn fixtures() -> &'static cuda_workload::Fixtures {
    static FIXTURES: OnceLock<Result<cuda_workload::Fixtures, String>> = OnceLock::new();
    match FIXTURES.get_or_init(|| {
        cuda_workload::build(&tmp_root().join("node-cuda-fixtures")).map_err(|e| e.to_string())
    }) {
        Ok(f) => f,
        Err(e) => panic!("build the interposer, the fake driver and the workloads: {e}"),
    }
}

fn tmp_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// The fake `libnvidia-ml.so` (its own target dir, shared with the node crate's tests).
fn fake_nvml_lib() -> PathBuf {
    cuda_workload::build_fake_nvml(&tmp_root().join("fake-nvml-target"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A private copy of the fake NVML with a two-GPU scenario (its own `dlopen` instance).
fn install_fake_nvml(dir: &Path, lib: &Path) -> PathBuf {
    let gpu = |i: u32| {
        serde_json::json!({
            "name": "Fake H100", "uuid": format!("GPU-{i:04}"), "memory_total_mib": GPU_MIB,
            "timeline": [ { "t": 0, "utilization_pct": 10 } ]
        })
    };
    install_fake_nvml_with(dir, lib, &serde_json::json!({ "gpus": [gpu(0), gpu(1)] }))
}

/// A private copy of the fake NVML playing `scenario`.
fn install_fake_nvml_with(dir: &Path, lib: &Path, scenario: &Value) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let dst = dir.join("libnvidia-ml.so.1");
    std::fs::copy(lib, &dst).expect("copy fake nvml");
    std::fs::write(
        dir.join("fake-nvml.json"),
        serde_json::to_vec_pretty(scenario).unwrap(),
    )
    .unwrap();
    dst
}

/// A child process killed (SIGKILL) when dropped, with its stdout lines on a channel.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn arbiter");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Keep draining so the child never blocks on a full pipe.
                    continue;
                }
            }
        });
        Proc { child, lines }
    }

    /// Wait for a stdout line starting with `prefix`; returns the rest of it.
    fn wait_line(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(e) => panic!("no `{prefix}` line: {e}"),
            }
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

struct Cluster {
    url: String,
    token: String,
    /// The plane's CA when it serves TLS (passed to the CLI and the agents).
    ca: Option<String>,
    interposer: PathBuf,
    libdir: PathBuf,
    workload: PathBuf,
    dir: PathBuf,
}

impl Cluster {
    fn cli(&self, args: &[&str]) -> Value {
        match &self.ca {
            Some(ca) => {
                // A global flag goes after the subcommand, before a trailing `-- command`.
                let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
                let mut with_ca = args[..split].to_vec();
                with_ca.extend(["--ca-cert", ca.as_str()]);
                with_ca.extend_from_slice(&args[split..]);
                common::cli_json(&self.url, &self.token, &with_ca)
            }
            None => common::cli_json(&self.url, &self.token, args),
        }
    }

    fn job(&self, id: u64) -> Value {
        self.cli(&["jobs"])
            .as_array()
            .into_iter()
            .flatten()
            .find(|j| j["id"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn node_state(&self, name: &str) -> String {
        self.cli(&["top"])["node_list"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == name)
            .map(|n| n["state"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }

    fn state_dir(&self, node: &str) -> PathBuf {
        self.dir.join(node).join("state")
    }

    fn start_node(&self, name: &str, nvml: &Path) -> Proc {
        self.start_node_with(name, nvml, &[])
    }

    /// [`Cluster::start_node`] with extra `arbiter node` arguments.
    fn start_node_with(&self, name: &str, nvml: &Path, extra: &[&str]) -> Proc {
        let p = Proc::spawn(
            Command::new(BIN)
                .args(["node", "--server", &self.url, "--name", name])
                .arg("--state-dir")
                .arg(self.state_dir(name))
                .arg("--nvml-lib")
                .arg(nvml)
                .arg("--interposer")
                .arg(&self.interposer)
                // A 100 ms period keeps the tests quick; the node policy's deadline is
                // generous, so that a healthy policy preempted on a loaded machine is
                // not retired (three faults in a row hand the node to the fallback).
                .args([
                    "--period",
                    "100ms",
                    "--policy-deadline",
                    "10s",
                    "--grace",
                    "2s",
                ])
                .args(["--cpu-milli", "32000", "--memory-mib", "131072"])
                .arg("--env")
                .arg(format!("LD_LIBRARY_PATH={}", self.libdir.display()))
                .args([
                    "--env",
                    "WL_RESOLVE=gpa",
                    "--env",
                    "FAKE_CUDA_KERNEL_NS=200000",
                ])
                .arg("--env")
                .arg(format!(
                    "FAKE_CUDA_STATE={}",
                    self.dir.join(name).join("fake-cuda-state").display()
                ))
                .args(["--log", "arbiter_node=info"])
                .args(self.ca.iter().flat_map(|ca| ["--ca-cert", ca.as_str()]))
                .args(extra)
                .env("ARBITER_TOKEN", &self.token),
        );
        let rest = p.wait_line(&format!("arbiter node {name} "), Duration::from_secs(60));
        assert_eq!(rest, "connected");
        p
    }

    fn submit(&self, name: &str, command: &[&str]) -> u64 {
        self.submit_with(name, &[], command)
    }

    fn submit_with(&self, name: &str, extra: &[&str], command: &[&str]) -> u64 {
        let mut args = vec![
            "submit",
            "--name",
            name,
            "--gpus",
            "1",
            "--gpu-milli",
            "500",
            "--gpu-memory",
            "1024",
        ];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(command);
        self.cli(&args)["id"].as_u64().expect("job id")
    }

    /// Loads the `misbehave` fixture in `mode` into the default slot.
    fn load_misbehave(&self, mode: &str) {
        let policy = self.dir.join(format!("{mode}.wasm"));
        std::fs::write(&policy, arbiter_policies::fixture("misbehave").unwrap()).unwrap();
        let config = self.dir.join(format!("{mode}.toml"));
        std::fs::write(&config, format!("mode = \"{mode}\"\n")).unwrap();
        self.cli(&[
            "policy",
            "load",
            policy.to_str().unwrap(),
            "--slot",
            "default",
            "--config",
            config.to_str().unwrap(),
        ]);
    }

    /// Workload records in a node's state dir.
    fn records(&self, node: &str) -> Vec<Value> {
        let dir = self.state_dir(node).join("workloads");
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json")
                && let Ok(text) = std::fs::read(&p)
                && let Ok(v) = serde_json::from_slice::<Value>(&text)
            {
                out.push(v);
            }
        }
        out
    }

    /// Rank `rank` of job `job`: the node running it and its workload record.
    fn rank_record(&self, job: u64, rank: u32) -> Option<(String, Value)> {
        let tag = format!("job-{job}/{rank}");
        ["node-a", "node-b"].into_iter().find_map(|n| {
            self.records(n)
                .into_iter()
                .find(|r| r["tag"] == tag)
                .map(|r| (n.to_string(), r))
        })
    }

    /// Everything the node's workloads wrote on stdout.
    fn outputs(&self, node: &str) -> String {
        let dir = self.state_dir(node).join("workloads");
        let mut s = String::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "out") {
                s += &std::fs::read_to_string(e.path()).unwrap_or_default();
            }
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Workloads outlive killed agents: take down their process groups.
        for node in ["node-a", "node-b", "burst-node"] {
            for r in self.records(node) {
                if let Some(pid) = r["pid"].as_u64() {
                    let _ = Command::new("kill")
                        .args(["-9", "--", &format!("-{pid}")])
                        .stderr(Stdio::null())
                        .status();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_until(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    wait_until_or(what, timeout, f, String::new);
}

fn wait_until_or(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `arbiter serve --nodes 0` in `dir`, and a client for it.
fn control_plane(dir: &Path, fixtures: &cuda_workload::Fixtures) -> (Proc, Cluster) {
    control_plane_with(dir, fixtures, &[])
}

/// [`control_plane`] with extra `arbiter serve` arguments.
fn control_plane_with(
    dir: &Path,
    fixtures: &cuda_workload::Fixtures,
    extra: &[&str],
) -> (Proc, Cluster) {
    let data = dir.join("data");
    let server = Proc::spawn(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--nodes",
                "0",
                "--no-metrics",
                "--round",
                "50ms",
                "--heartbeat",
                "200ms",
                "--lost-after",
                "1s",
                "--gpu-speed",
                "T4=333",
            ])
            .args(extra)
            .arg("--data")
            .arg(&data),
    );
    let addr = server.wait_line("arbiter serving gRPC on ", Duration::from_secs(120));
    let token = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    // With TLS the name must be one the certificate covers.
    let tls = extra.windows(2).any(|w| w == ["--tls", "on"]);
    let (url, ca) = if tls {
        let port = addr.rsplit(':').next().unwrap_or_default();
        (
            format!("https://localhost:{port}"),
            Some(data.join("tls").join("ca.pem").display().to_string()),
        )
    } else {
        (format!("http://{addr}"), None)
    };
    let c = Cluster {
        url,
        token,
        ca,
        interposer: fixtures.interposer.clone(),
        libdir: fixtures.libdir.clone(),
        workload: fixtures.workload.clone(),
        dir: dir.to_path_buf(),
    };
    (server, c)
}

/// A control plane and two ready agents, `node-a` (registered first) and
/// `node-b`, each with its own two-GPU fake NVML, in a fresh directory.
struct TwoNodes {
    server: Proc,
    c: Cluster,
    node_a: Proc,
    node_b: Proc,
    nvml_a: PathBuf,
    nvml_b: PathBuf,
}

fn two_nodes(test: &str) -> TwoNodes {
    two_nodes_with(test, &[])
}

/// [`two_nodes`] with extra `arbiter serve` arguments.
fn two_nodes_with(test: &str, serve_args: &[&str]) -> TwoNodes {
    let fixtures = fixtures();
    let nvml = fake_nvml_lib();
    let dir = tmp_root().join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (server, c) = control_plane_with(&dir, fixtures, serve_args);
    let nvml_a = install_fake_nvml(&dir.join("node-a"), &nvml);
    let nvml_b = install_fake_nvml(&dir.join("node-b"), &nvml);
    let node_a = c.start_node("node-a", &nvml_a);
    let node_b = c.start_node("node-b", &nvml_b);
    wait_until("both nodes ready", Duration::from_secs(60), || {
        c.node_state("node-a") == "ready" && c.node_state("node-b") == "ready"
    });
    TwoNodes {
        server,
        c,
        node_a,
        node_b,
        nvml_a,
        nvml_b,
    }
}

#[test]
fn agents_join_and_run_jobs_over_tls() {
    // The plane issues its own certificate; the CLI and the agents trust its CA.
    let TwoNodes {
        server,
        c,
        node_a,
        node_b,
        ..
    } = two_nodes_with("cli-node-tls", &["--tls", "on"]);
    assert!(c.url.starts_with("https://"));
    let id = c.submit("over-tls", &["sh", "-c", "exit 0"]);
    wait_until_or(
        "the job to succeed over TLS",
        Duration::from_secs(30),
        || c.job(id)["state"] == "succeeded",
        || format!("{} {}", c.job(id), c.cli(&["top"])),
    );
    // Plaintext and an untrusted server are refused.
    let plain = format!("http://{}", c.url.trim_start_matches("https://"));
    let out = Command::new(BIN)
        .args(["jobs", "--server", &plain, "--token", &c.token])
        .output()
        .unwrap();
    assert!(!out.status.success(), "plaintext to a TLS listener");
    let out = Command::new(BIN)
        .args(["jobs", "--server", &c.url, "--token", &c.token])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a CA the client does not trust");
    drop((node_a, node_b, server));
}

#[test]
fn agents_run_jobs_under_the_interposer_survive_loss_and_are_reconciled() {
    let TwoNodes {
        server,
        mut c,
        mut node_a,
        mut node_b,
        nvml_a,
        nvml_b,
    } = two_nodes("cli-node-e2e");

    // 1. A short job: runs under the interposer with its quota; its exit code reaches the host.
    let wl = c.workload.display().to_string();
    let short = c.submit(
        "short",
        &[
            "sh",
            "-c",
            "\"$0\" meminfo && echo \"preload=$LD_PRELOAD block=$ARBITER_CONTROL_BLOCK job=$ARBITER_JOB_ID\" && exit 3",
            &wl,
        ],
    );
    wait_until_or(
        "the short job to fail with exit code 3",
        Duration::from_secs(30),
        || c.job(short)["state"] == "failed",
        || format!("{} {}", c.job(short), c.cli(&["top"])),
    );
    let j = c.job(short);
    assert!(
        j["message"].as_str().unwrap_or("").contains("exit code 3"),
        "{j}"
    );
    let chosen = j["node"].as_str().expect("node").to_string();
    assert!(chosen == "node-a" || chosen == "node-b", "{j}");
    let other = if chosen == "node-a" {
        "node-b"
    } else {
        "node-a"
    };
    let out = c.outputs(&chosen);
    assert!(
        out.contains(&format!("meminfo total={}", QUOTA_MIB << 20)),
        "the workload must see its quota as the device's memory: {out}"
    );
    assert!(
        out.contains(&format!("preload={}", c.interposer.display())),
        "{out}"
    );
    assert!(out.contains(&format!("job={short}")), "{out}");
    assert!(
        c.outputs(other).is_empty(),
        "nothing ran on the other node: {}",
        c.outputs(other)
    );

    // 2. A long job; its node's agent is killed -9.
    let long = c.submit("long", &[&wl, "train"]);
    wait_until("the long job to run", Duration::from_secs(30), || {
        c.job(long)["state"] == "running"
    });
    let first = c.job(long)["node"].as_str().unwrap().to_string();
    let second = if first == "node-a" {
        "node-b"
    } else {
        "node-a"
    };
    let mut record = Value::Null;
    wait_until(
        "the long job's workload record",
        Duration::from_secs(60),
        || {
            record = c
                .records(&first)
                .into_iter()
                .find(|r| r["tag"] == format!("job-{long}/0"))
                .unwrap_or(Value::Null);
            !record.is_null() && c.outputs(&first).contains("ready")
        },
    );
    assert_eq!(record["compute_share_permille"], 500, "{record}");
    assert_eq!(record["role"], 0, "{record}");
    let pid = record["pid"].as_u64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ.contains(&format!("LD_PRELOAD={}", c.interposer.display())),
        "the workload runs under the interposer"
    );

    let (first_proc, nvml_first) = if first == "node-a" {
        (&mut node_a, nvml_a.clone())
    } else {
        (&mut node_b, nvml_b.clone())
    };
    first_proc.kill9();
    wait_until(
        "the killed node to be lost",
        Duration::from_secs(60),
        || c.node_state(&first) == "lost",
    );
    wait_until("the long job to move", Duration::from_secs(30), || {
        let j = c.job(long);
        j["state"] == "running" && j["node"] == second
    });
    assert!(
        c.job(long)["preemptions"].as_u64().unwrap_or(0) >= 1,
        "{}",
        c.job(long)
    );
    wait_until(
        "the rescheduled copy to start",
        Duration::from_secs(60),
        || {
            c.records(second)
                .iter()
                .any(|r| r["tag"] == format!("job-{long}/0"))
        },
    );
    // The orphaned copy is still running on the lost node.
    assert!(Path::new(&format!("/proc/{pid}")).exists());

    // 3. The agent comes back on the same state dir: it adopts the old copy, re-registers,
    //    and the host stops the duplicate.
    *first_proc = c.start_node(&first, &nvml_first);
    wait_until(
        "the restarted node to be ready",
        Duration::from_secs(60),
        || c.node_state(&first) == "ready",
    );
    wait_until(
        "the duplicate to be stopped",
        Duration::from_secs(60),
        || c.records(&first).is_empty(),
    );
    let j = c.job(long);
    assert_eq!(j["state"], "running", "{j}");
    assert_eq!(j["node"], second, "{j}");

    // Its framework reports what is left; the policies' view takes it.
    let p = c.cli(&["progress", &long.to_string(), "--remaining", "45m"]);
    assert_eq!(p["remaining_ms"], 2_700_000, "{p}");
    assert_eq!(p["remaining_workers"], 1, "{p}");

    // Cancel: the surviving copy is stopped too.
    c.cli(&["cancel", &long.to_string()]);
    wait_until(
        "the cancelled job's workload to go",
        Duration::from_secs(60),
        || c.records(second).is_empty(),
    );
    drop(node_a);
    drop(node_b);
    drop(server);
    c.token.clear();
}

/// The fake NVML scenario of two 16 GiB GPUs whose time the test sets: quiet, then
/// the online workload bursts (SM activity up, clock down), then its memory bursts
/// past the Overlimit threshold.
fn burst_scenario(dir: &Path) -> Value {
    let quiet = |i: u32| {
        serde_json::json!({
            "name": "Fake T4", "uuid": format!("GPU-burst-{i}"), "memory_total_mib": GPU_MIB,
            "max_sm_clock_mhz": 1980,
            "timeline": [ { "t": 0, "utilization_pct": 5, "sm_clock_mhz": 1980, "memory_used_mib": 512 } ]
        })
    };
    let mut bursting = quiet(0);
    bursting["timeline"] = serde_json::json!([
        { "t": 0, "utilization_pct": 30, "sm_clock_mhz": 1980, "memory_used_mib": 4096 },
        { "t": 1, "utilization_pct": 75, "sm_clock_mhz": 1683, "memory_used_mib": 6144 },
        { "t": 2, "utilization_pct": 78, "sm_clock_mhz": 1683, "memory_used_mib": 15892 }
    ]);
    serde_json::json!({ "time_file": dir.join("t"), "gpus": [bursting, quiet(1)] })
}

#[test]
fn an_online_burst_paces_then_evicts_offline_work_and_the_host_requeues_it() {
    let fixtures = fixtures();
    let nvml = fake_nvml_lib();
    let dir = tmp_root().join(format!("cli-node-burst-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (_server, c) = control_plane(&dir, fixtures);
    let node_dir = dir.join("burst-node");
    std::fs::create_dir_all(&node_dir).unwrap();
    let set_time = |t: u32| std::fs::write(node_dir.join("t"), t.to_string()).unwrap();
    set_time(0);
    let lib = install_fake_nvml_with(&node_dir, &nvml, &burst_scenario(&node_dir));
    let _node = c.start_node("burst-node", &lib);

    // An online job and an offline one share GPU 0 (best-fit packs the two halves).
    let wl = c.workload.display().to_string();
    let online = c.submit("online", &["sleep", "600"]);
    let offline = c.submit_with(
        "offline",
        &["--opportunistic"],
        &[&wl, "launch-loop", "600000"],
    );
    for id in [online, offline] {
        wait_until_or(
            "both jobs to run",
            Duration::from_secs(30),
            || c.job(id)["state"] == "running",
            || format!("{}", c.cli(&["jobs"])),
        );
    }
    let share = |role: u64| {
        c.records("burst-node")
            .iter()
            .find(|r| r["role"] == role && r["gpu"] == 0)
            .and_then(|r| r["compute_share_permille"].as_u64())
    };
    assert!(
        share(0).is_some() && share(1).is_some(),
        "both on GPU 0: {:?}",
        c.records("burst-node")
    );
    // Quiet: let the controller settle, then the burst must lower the offline share.
    std::thread::sleep(Duration::from_millis(1500));
    let quiet_share = share(1).unwrap_or(0);
    set_time(1);
    wait_until_or(
        "the coordinator to lower the offline share",
        Duration::from_secs(20),
        || share(1).is_some_and(|s| s < quiet_share),
        || format!("quiet {quiet_share}, now {:?}", share(1)),
    );
    let online_share = share(0);
    // Memory past the Overlimit threshold: the offline job is evicted, and the host
    // requeues it (it counts a preemption and says why).
    set_time(2);
    wait_until_or(
        "the host to see the eviction",
        Duration::from_secs(30),
        || c.job(offline)["preemptions"].as_u64().unwrap_or(0) >= 1,
        || format!("{}", c.job(offline)),
    );
    // The node reports GPU 0 overlimit: offline work stays off that GPU only (MuxFlow's
    // X10), the node stays open, and the requeued job runs again on the healthy GPU 1.
    wait_until_or(
        "the offline job to run again elsewhere",
        Duration::from_secs(30),
        || {
            let j = c.job(offline);
            j["state"] == "running" && j["gpu_indices"] == serde_json::json!([1])
        },
        || format!("{} {}", c.cli(&["top"]), c.job(offline)),
    );
    assert_eq!(c.node_state("burst-node"), "ready");
    // The online job is never touched.
    assert_eq!(c.job(online)["state"], "running");
    assert_eq!(c.job(online)["preemptions"], 0);
    assert_eq!(share(0), online_share);
}

/// The launch path, end to end, for the four defects it had:
/// 1. a half-GPU job that states no memory gets half the GPU's memory as its
///    quota (the scheduler charged that much), not the whole GPU;
/// 2. two workers of one job on one node both run (one launch, both GPUs);
/// 3. ranks and the world size are the job's, across its nodes;
/// 4. a job the policy migrates is stopped where it ran and started where it
///    goes, and the job table says where it runs now.
#[test]
fn one_resolved_launch_per_job_per_node() {
    // Registered in this order: node-a is node 0 of the cell.
    let TwoNodes {
        server,
        mut c,
        node_a,
        node_b,
        ..
    } = two_nodes("cli-launch-e2e");
    let wl = c.workload.display().to_string();
    let finished = |c: &Cluster, id: u64| {
        wait_until_or(
            &format!("job {id} to finish"),
            Duration::from_secs(30),
            || c.job(id)["state"] == "succeeded",
            || format!("{} {}", c.job(id), c.cli(&["top"])),
        );
    };
    let both = |c: &Cluster| c.outputs("node-a") + &c.outputs("node-b");
    // A job whose every rank prints its place in the job, run to its end.
    let run_ranks = |c: &Cluster, name: &str, gpus: &str, per_worker: &str| {
        let ranks = "echo \"job=$ARBITER_JOB_ID rank=$ARBITER_RANK local=$ARBITER_LOCAL_RANK world=$ARBITER_WORLD_SIZE\"";
        let id = c.cli(&[
            "submit",
            "--name",
            name,
            "--gpus",
            gpus,
            "--gpus-per-worker",
            per_worker,
            "--",
            "sh",
            "-c",
            ranks,
        ])["id"]
            .as_u64()
            .expect("id");
        finished(c, id);
        id
    };

    // 1. Half a GPU, no memory stated: the quota is half of the 16 GiB.
    let half = c.cli(&[
        "submit",
        "--name",
        "half",
        "--gpus",
        "1",
        "--gpu-milli",
        "500",
        "--",
        &wl,
        "meminfo",
    ])["id"]
        .as_u64()
        .expect("id");
    finished(&c, half);
    let node = c.job(half)["node"].as_str().unwrap_or_default().to_string();
    let out = c.outputs(&node);
    assert!(
        out.contains(&format!("meminfo total={}", (GPU_MIB / 2) << 20)),
        "a half-GPU job must see half the GPU's memory: {out}"
    );

    // 3. Two 2-GPU workers fill both nodes: ranks 0..3 of 4, two per node.
    let gang = run_ranks(&c, "gang", "4", "2");
    let out = both(&c);
    for rank in 0..4 {
        assert!(
            out.contains(&format!(
                "job={gang} rank={rank} local={} world=4",
                rank % 2
            )),
            "rank {rank} of the job's 4: {out}"
        );
    }
    for node in ["node-a", "node-b"] {
        let here = c.outputs(node);
        let count = here.matches(&format!("job={gang} ")).count();
        assert_eq!(count, 2, "two of the gang's ranks on {node}: {here}");
    }

    // 4. A policy that moves running work off node 0.
    c.load_misbehave("evacuate");
    let long = c.submit("long", &[&wl, "train"]);
    wait_until_or(
        "the long job to run on node-b with no copy left on node-a",
        Duration::from_secs(30),
        || {
            let tag = format!("job-{long}/0");
            c.job(long)["state"] == "running"
                && c.job(long)["node"] == "node-b"
                && c.records("node-b").iter().any(|r| r["tag"] == tag)
                && !c.records("node-a").iter().any(|r| r["tag"] == tag)
        },
        || {
            format!(
                "{} a={:?} b={:?}",
                c.job(long),
                c.records("node-a"),
                c.records("node-b")
            )
        },
    );
    c.cli(&["cancel", &long.to_string()]);
    wait_until(
        "the long job's workload to go",
        Duration::from_secs(60),
        || c.records("node-b").is_empty(),
    );

    // 2. With node-a drained, both 1-GPU workers of a job land on node-b:
    //    one launch, both ranks run.
    c.cli(&["nodes", "drain", "node-a"]);
    let pair = run_ranks(&c, "pair", "2", "1");
    let out = c.outputs("node-b");
    for rank in 0..2 {
        assert!(
            out.contains(&format!("job={pair} rank={rank} local={rank} world=2")),
            "both workers ran on node-b: {out}"
        );
    }
    drop(node_a);
    drop(node_b);
    drop(server);
    c.token.clear();
}

/// Contract 0.3's node link: with sharing on, an opportunistic job runs as
/// offline work with its stated memory as its quota; a policy's upgrade to
/// guaranteed (`set-qos`) reaches the running workload as an `Update` — the
/// agent makes it online with the guaranteed terms and acknowledges.
#[test]
fn an_upgrade_reaches_the_running_workload() {
    let TwoNodes {
        server,
        c,
        node_a,
        node_b,
        ..
    } = two_nodes_with(
        "cli-update-e2e",
        &["--oversub-milli", "1000", "--host-spill"],
    );
    let wl = c.workload.display().to_string();
    let job = c.cli(&[
        "submit",
        "--name",
        "opp",
        "--gpus",
        "1",
        "--opportunistic",
        "--gpu-memory",
        "3584",
        "--",
        &wl,
        "train",
    ])["id"]
        .as_u64()
        .expect("job id");
    let record_of = |c: &Cluster| c.rank_record(job, 0);
    wait_until_or(
        "the opportunistic job to run as offline work",
        Duration::from_secs(30),
        || {
            c.job(job)["state"] == "running"
                && record_of(&c).is_some_and(|(_, r)| r["role"] == 1 && r["terms"]["qos"] == 1)
        },
        || format!("{} {:?}", c.job(job), record_of(&c)),
    );
    let (node, before) = record_of(&c).expect("a record");

    c.load_misbehave("upgrade");
    wait_until_or(
        "the running workload to become online and guaranteed, in place",
        Duration::from_secs(30),
        || {
            record_of(&c).is_some_and(|(n, r)| {
                n == node
                    && r["pid"] == before["pid"]
                    && r["role"] == 0
                    && r["terms"]["qos"] == 0
                    && r["terms"]["request_permille"] == 1000
            })
        },
        || format!("{} {:?}", c.job(job), record_of(&c)),
    );
    assert_eq!(c.job(job)["state"], "running", "updated, not restarted");
    c.cli(&["cancel", &job.to_string()]);
    drop(node_a);
    drop(node_b);
    drop(server);
}

/// DynamoML live (issue 19 item 8): the built-in `dynamoml` policy in `arbiter serve` with two
/// agents on fake GPUs (two GPUs each). Two elastic training jobs grow to fill the cluster; a
/// service arrives and takes a training worker; a rising request rate reported through the API
/// (`arbiter service`) scales it out as far as the chiefs allow, shrinking both training jobs to
/// their chiefs; when the
/// rate falls the service scales in and training grows back. Worker counts are read from the
/// workloads the agents run as well as from the job table.
#[test]
fn dynamoml_scales_a_service_on_reported_load_borrowing_from_training_and_gives_back() {
    let TwoNodes {
        server,
        c,
        node_a,
        node_b,
        ..
    } = two_nodes("cli-dynamoml-live");
    let wl = c.workload.display().to_string();
    let config = c.dir.join("dynamoml.toml");
    std::fs::write(
        &config,
        "target_requests_per_replica = 10.0\nscale_down_delay_s = 1\n",
    )
    .unwrap();
    c.cli(&[
        "policy",
        "load",
        "builtin:dynamoml",
        "--slot",
        "default",
        "--config",
        config.to_str().unwrap(),
    ]);
    // Every job runs a loop that reports an iteration every 20 ms through the interposer.
    let submit = |name: &str, extra: &[&str]| -> u64 {
        let mut args = vec!["submit", "--name", name, "--gpus", "1"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", &wl, "iterations", "1000000", "20"]);
        c.cli(&args)["id"].as_u64().expect("job id")
    };
    let elastic = ["--min-workers", "1", "--max-workers", "2"];
    let a = submit("train-a", &elastic);
    let b = submit("train-b", &elastic);

    // (workers in the job table, workloads the agents run) of `job`.
    let count = |job: u64| -> (u64, usize) {
        let prefix = format!("job-{job}/");
        let running = ["node-a", "node-b"]
            .iter()
            .flat_map(|n| c.records(n))
            .filter(|r| r["tag"].as_str().is_some_and(|t| t.starts_with(&prefix)))
            .count();
        (c.job(job)["workers"].as_u64().unwrap_or(0), running)
    };
    // Waits until table and agents agree on every job's count and `want` accepts the counts.
    let expect = |what: &str, jobs: &[u64], want: &dyn Fn(&[u64]) -> bool| {
        wait_until_or(
            what,
            Duration::from_secs(40),
            || {
                let n: Vec<(u64, usize)> = jobs.iter().map(|&j| count(j)).collect();
                let workers: Vec<u64> = n.iter().map(|x| x.0).collect();
                n.iter().all(|&(w, r)| w as usize == r) && want(&workers)
            },
            || {
                let n: Vec<(u64, usize)> = jobs.iter().map(|&j| count(j)).collect();
                format!(
                    "(workers, workloads) {n:?}\n{}",
                    common::cli_text(&c.url, &c.token, &["jobs"])
                )
            },
        );
    };
    // Every training job's chief (rank 0) is running.
    let chiefs = || [a, b].iter().all(|&j| c.rank_record(j, 0).is_some());
    expect("training to grow into the idle GPUs", &[a, b], &|w| {
        w == [2, 2]
    });
    // The job statistics its node reports (contract 0.3 job-metric): the iteration time
    // from the interposer's counter, measured on the node.
    wait_until_or(
        "the training job's iteration time to reach the control plane",
        Duration::from_secs(20),
        || {
            c.job(a)["metrics"]["iteration_ms"]
                .as_u64()
                .is_some_and(|ms| (20..=80).contains(&ms))
        },
        || c.job(a).to_string(),
    );

    let service = submit(
        "resnet-serving",
        &[
            "--kind",
            "inference",
            "--min-workers",
            "1",
            "--max-workers",
            "3",
            "--slo",
            "128ms",
        ],
    );
    let jobs = [service, a, b];
    expect(
        "the service to start on a GPU taken from training",
        &jobs,
        &|w| w[0] == 1 && w[1] + w[2] == 3,
    );
    assert!(chiefs());

    // The request rate rises: 30 requests/s at 10 per replica wants three replicas; it gets
    // every GPU but the two chiefs' (the paper's 16 - 1 - 4 = 11 at this size).
    let report = |rps: &str, p50: &str, p99: &str| {
        let id = service.to_string();
        c.cli(&["service", &id, "--rps", rps, "--p50", p50, "--p99", p99]);
    };
    report("30", "60ms", "300ms");
    expect(
        "the service to scale out and training to shrink to its chiefs",
        &jobs,
        &|w| w == [2, 1, 1],
    );
    assert!(chiefs(), "chiefs keep running");
    let listed = common::cli_text(&c.url, &c.token, &["jobs"]);
    assert!(
        listed.contains("30.0 rps p50 60 p99 300/128 ms"),
        "`arbiter jobs` shows the load: {listed}"
    );
    let top = c.cli(&["top"]);
    let shown = &top["services"][0];
    assert_eq!(shown["id"], service, "{top}");
    assert_eq!(shown["replicas"], 2, "{top}");
    assert_eq!(shown["load"]["p99_latency_ms"], 300, "{top}");

    // It falls to one replica's worth: after the stabilisation delay the service shrinks and
    // training takes the GPUs back.
    report("4", "20ms", "40ms");
    expect(
        "the service to scale in and training to grow back",
        &jobs,
        &|w| w[0] == 1 && w[1] + w[2] == 3,
    );
    assert!(chiefs());
    for j in jobs {
        c.cli(&["cancel", &j.to_string()]);
    }
    drop(node_a);
    drop(node_b);
    drop(server);
}

/// The control plane's matcher loop (contract 0.3's G9, MuxFlow's pairing): with a matcher in
/// the `matcher` slot, an opportunistic one-GPU job is moved onto the GPU of a running
/// guaranteed service and runs there with the pairing's SM share (the MPS active thread % its
/// launch carries), on real agents.
#[test]
fn a_matcher_pairs_offline_work_onto_a_services_gpu_with_an_sm_share() {
    let TwoNodes {
        server,
        c,
        node_a,
        node_b,
        ..
    } = two_nodes_with(
        "cli-matcher-e2e",
        // Host spill: opportunistic memory is soft, so it may join a GPU whose guaranteed
        // job holds all of its memory (contract 0.3's G1, AntMan's Table 2).
        &[
            "--oversub-milli",
            "1000",
            "--host-spill",
            "--match-every",
            "200ms",
        ],
    );
    let wl = c.workload.display().to_string();
    // A pure matcher goes to the `matcher` slot.
    c.cli(&["policy", "load", "builtin:greedy-matcher"]);
    let slot = c.cli(&["policy", "describe", "matcher"]);
    assert!(slot.to_string().contains("greedy-matcher"), "{slot}");
    let service = c.cli(&[
        "submit",
        "--name",
        "online",
        "--gpus",
        "1",
        "--kind",
        "inference",
        "--slo",
        "100ms",
        "--",
        &wl,
        "train",
    ])["id"]
        .as_u64()
        .expect("id");
    wait_until_or(
        "the service to run",
        Duration::from_secs(20),
        || c.job(service)["state"] == "running",
        || c.job(service).to_string(),
    );
    let offline = c.cli(&[
        "submit",
        "--name",
        "offline",
        "--gpus",
        "1",
        "--opportunistic",
        "--gpu-memory",
        "1024",
        "--",
        &wl,
        "train",
    ])["id"]
        .as_u64()
        .expect("id");
    let record = |c: &Cluster, job: u64| c.rank_record(job, 0);
    wait_until_or(
        "the offline job to run on the service's GPU with an SM share",
        Duration::from_secs(30),
        || {
            let (Some((n1, s)), Some((n2, o))) = (record(&c, service), record(&c, offline)) else {
                return false;
            };
            n1 == n2
                && s["gpu"] == o["gpu"]
                && o["mps_thread_pct"]
                    .as_u64()
                    .is_some_and(|p| (1..=100).contains(&p))
        },
        || {
            format!(
                "service {:?}\noffline {:?}\n{}",
                record(&c, service),
                record(&c, offline),
                common::cli_text(&c.url, &c.token, &["jobs"])
            )
        },
    );
    assert_eq!(c.job(offline)["node"], c.job(service)["node"]);
    assert_eq!(c.job(offline)["gpu_indices"], c.job(service)["gpu_indices"]);
    for j in [service, offline] {
        c.cli(&["cancel", &j.to_string()]);
    }
    drop(node_a);
    drop(node_b);
    drop(server);
}

/// MuxFlow live (issue 18 item 7): the built-in `muxflow` matcher in the control plane and
/// `sysmonitor` on a node with one (fake) MPS daemon per GPU and two online services. GPU 1
/// starts Unhealthy (its service is busy), so the offline job is paired with the service on
/// GPU 0 and runs there as an MPS client with the pairing's thread % (in its launch, or, when
/// the scheduler's round placed it there first, recorded for its next start: MPS cannot
/// change a running client's) and the 40 % memory quota; an online burst throttles it through xCUDA's pacing; an online memory burst puts
/// GPU 0 Overlimit, which evicts it; the host requeues it, and it waits (no healthy service
/// GPU) until GPU 1's service quietens, when the matcher pairs it there. The services are
/// never touched.
#[test]
fn muxflow_pairs_throttles_evicts_and_reschedules_offline_work_under_mps() {
    let fixtures = fixtures();
    let nvml = fake_nvml_lib();
    let dir = tmp_root().join(format!("cli-muxflow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A guaranteed service is charged its whole GPU, memory included; `--host-spill` makes
    // offline memory soft, so it may join (MuxFlow bounds it on the node instead: xCUDA's
    // 40 % quota, and SysMonitor's Overlimit when the online memory grows).
    let (_server, c) = control_plane_with(
        &dir,
        fixtures,
        &[
            "--oversub-milli",
            "1000",
            "--host-spill",
            "--match-every",
            "200ms",
        ],
    );
    let node_dir = dir.join("mux-node");
    std::fs::create_dir_all(&node_dir).unwrap();
    let set_time = |t: u32| std::fs::write(node_dir.join("t"), t.to_string()).unwrap();
    set_time(0);
    let gpu = |i: u32, timeline: Value| {
        serde_json::json!({
            "name": "Fake T4", "uuid": format!("GPU-mux-{i}"), "memory_total_mib": GPU_MIB,
            "max_sm_clock_mhz": 1980, "timeline": timeline
        })
    };
    let scenario = serde_json::json!({ "time_file": node_dir.join("t"), "gpus": [
        gpu(0, serde_json::json!([
            { "t": 0, "utilization_pct": 30, "sm_clock_mhz": 1980, "memory_used_mib": 4096 },
            { "t": 1, "utilization_pct": 75, "sm_clock_mhz": 1683, "memory_used_mib": 6144 },
            { "t": 2, "utilization_pct": 78, "sm_clock_mhz": 1683, "memory_used_mib": 15892 }
        ])),
        gpu(1, serde_json::json!([
            { "t": 0, "utilization_pct": 90, "sm_clock_mhz": 1980, "memory_used_mib": 4096 },
            { "t": 3, "utilization_pct": 10, "sm_clock_mhz": 1980, "memory_used_mib": 4096 }
        ]))
    ]});
    let lib = install_fake_nvml_with(&node_dir, &nvml, &scenario);
    let mps =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fake-mps/nvidia-cuda-mps-control");
    let _node = c.start_node_with(
        "mux-node",
        &lib,
        &[
            "--policy",
            "sysmonitor",
            "--mps-control",
            &mps.display().to_string(),
        ],
    );
    let mps_log = |gpu: u32| {
        std::fs::read_to_string(
            c.state_dir("mux-node")
                .join(format!("mps/gpu{gpu}/log/commands.log")),
        )
        .unwrap_or_default()
    };
    assert!(mps_log(0).starts_with("START") && mps_log(1).starts_with("START"));
    // MuxFlow's matcher; stay_bonus keeps a running pair in place between matchings, so the
    // offline job leaves GPU 0 by eviction, not by a migration the matcher prefers.
    let config = dir.join("muxflow.toml");
    std::fs::write(&config, "stay_bonus = 1.0\n").unwrap();
    c.cli(&[
        "policy",
        "load",
        "builtin:muxflow",
        "--config",
        &config.display().to_string(),
    ]);
    assert!(
        c.cli(&["policy", "describe", "matcher"])
            .to_string()
            .contains("muxflow")
    );

    let wl = c.workload.display().to_string();
    let service = |name: &str| {
        c.cli(&[
            "submit",
            "--name",
            name,
            "--gpus",
            "1",
            "--gpu-memory",
            "4096",
            "--kind",
            "inference",
            "--slo",
            "100ms",
            "--",
            "sleep",
            "600",
        ])["id"]
            .as_u64()
            .expect("id")
    };
    let services = [service("online-a"), service("online-b")];
    for s in services {
        wait_until_or(
            "the services to run",
            Duration::from_secs(30),
            || c.job(s)["state"] == "running",
            || c.cli(&["jobs"]).to_string(),
        );
    }
    let gpu_of = |job: u64| c.job(job)["gpu_indices"].clone();
    let (on0, on1) = if gpu_of(services[0]) == serde_json::json!([0]) {
        (services[0], services[1])
    } else {
        (services[1], services[0])
    };
    assert_eq!(gpu_of(on1), serde_json::json!([1]));
    // GPU 1 Unhealthy first (SM activity 90 %): published before any offline work arrives.
    let health = |gpu: usize| {
        c.cli(&["top"])["node_list"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == "mux-node")
            .and_then(|n| n["gpu_health"].get(gpu).and_then(Value::as_u64))
    };
    wait_until_or(
        "GPU 1 published Unhealthy, GPU 0 Healthy",
        Duration::from_secs(20),
        || health(0) == Some(1) && health(1) == Some(2),
        || c.cli(&["top"]).to_string(),
    );
    let offline = c.cli(&[
        "submit",
        "--name",
        "offline",
        "--gpus",
        "1",
        "--gpu-milli",
        "500",
        "--gpu-memory",
        "8192",
        "--opportunistic",
        "--",
        &wl,
        "launch-loop",
        "600000",
    ])["id"]
        .as_u64()
        .expect("id");
    let offline_record = || {
        c.records("mux-node")
            .into_iter()
            .filter(|r| r["role"] == 1)
            .max_by_key(|r| r["id"].as_u64().unwrap_or(0))
    };
    wait_until_or(
        "the offline job paired with the service on GPU 0, under MPS",
        Duration::from_secs(30),
        || {
            c.job(offline)["state"] == "running"
                && gpu_of(offline) == serde_json::json!([0])
                && offline_record().is_some_and(|r| {
                    r["gpu"] == 0 && r["mps"] == true && r["mps_thread_pct"].is_u64()
                })
        },
        || format!("{} {:?}", c.job(offline), offline_record()),
    );
    let first = offline_record().expect("record");
    let pct = first["mps_thread_pct"].as_u64().expect("thread %");
    assert!(
        (10..=90).contains(&pct),
        "DynamicSM within its bounds: {pct}"
    );
    // The 40 % offline memory quota (of 16 GiB) reaches the running workload.
    let quota = |c: &Cluster| {
        c.job(offline)["metrics"]["memory_limit_mib"]
            .as_u64()
            .unwrap_or(0)
    };
    wait_until_or(
        "the 40 % memory quota",
        Duration::from_secs(20),
        || quota(&c) == GPU_MIB * 40 / 100,
        || c.job(offline).to_string(),
    );
    // The online burst on GPU 0: xCUDA lowers the offline share.
    let share = || {
        offline_record()
            .and_then(|r| r["compute_share_permille"].as_u64())
            .unwrap_or(1000)
    };
    std::thread::sleep(Duration::from_millis(1000));
    let quiet = share();
    set_time(1);
    wait_until_or(
        "xCUDA to throttle the offline job",
        Duration::from_secs(20),
        || share() < quiet,
        || format!("quiet {quiet}, now {}", share()),
    );
    // The memory burst: Overlimit evicts it and the host requeues it; with no healthy
    // service GPU left, it waits.
    set_time(2);
    wait_until_or(
        "the offline job evicted and requeued",
        Duration::from_secs(30),
        || {
            let j = c.job(offline);
            j["preemptions"].as_u64().unwrap_or(0) >= 1 && j["state"] == "pending"
        },
        || format!("{} {}", c.job(offline), c.cli(&["top"])),
    );
    assert!(
        c.job(offline)["message"]
            .as_str()
            .unwrap_or("")
            .contains("evicted")
    );
    // GPU 1's service quietens: Healthy, and the matcher pairs the job there.
    set_time(3);
    wait_until_or(
        "the offline job paired with the service on GPU 1",
        Duration::from_secs(30),
        || c.job(offline)["state"] == "running" && gpu_of(offline) == serde_json::json!([1]),
        || format!("{} {}", c.job(offline), c.cli(&["top"])),
    );
    let again = offline_record().expect("record");
    assert_eq!(
        (again["gpu"].clone(), again["mps"].clone()),
        (serde_json::json!(1), serde_json::json!(true))
    );
    for s in [on0, on1] {
        assert_eq!(c.job(s)["state"], "running");
        assert_eq!(c.job(s)["preemptions"], 0);
    }
    c.cli(&["cancel", &offline.to_string()]);
}

/// AntMan live (issue 17 item 7): the built-in `antman` policy as the control plane's
/// scheduler and as the node's coordinator, one agent with two fake GPUs. Tenant `research`
/// uses its one-GPU quota, so its opportunistic job runs beside it without an upgrade; a
/// guaranteed job of `prod` arrives on the opportunistic job's GPU and the node squeezes the
/// running opportunistic workload (its compute share and memory limit, shown by `arbiter
/// jobs`); once the guaranteed neighbour and research's other job are gone, the opportunistic
/// job is upgraded and the upgrade reaches its running workload.
#[test]
fn antman_squeezes_opportunistic_work_for_a_guaranteed_arrival_and_upgrades_it_later() {
    let fixtures = fixtures();
    let nvml = fake_nvml_lib();
    let dir = tmp_root().join(format!("cli-antman-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (_server, c) = control_plane_with(
        &dir,
        fixtures,
        &[
            "--policy",
            "antman",
            "--oversub-milli",
            "1000",
            "--host-spill",
        ],
    );
    let lib = install_fake_nvml(&dir.join("node-a"), &nvml);
    let _node = c.start_node_with(
        "node-a",
        &lib,
        &["--policy", "antman", "--host-spill-mib", "1024"],
    );
    wait_until("node ready", Duration::from_secs(60), || {
        c.node_state("node-a") == "ready"
    });
    for (tenant, quota) in [("research", "1"), ("prod", "1")] {
        c.cli(&["tenant", "add", tenant, "--quota-gpus", quota]);
    }
    let wl = c.workload.display().to_string();
    let submit = |name: &str, tenant: &str, extra: &[&str], command: &[&str]| {
        let mut args = vec![
            "submit",
            "--name",
            name,
            "--tenant",
            tenant,
            "--gpus",
            "1",
            "--gpu-memory",
            "4096",
        ];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(command);
        c.cli(&args)["id"].as_u64().expect("job id")
    };
    let running = |job: u64| c.job(job)["state"] == "running";
    let holder = submit("research-main", "research", &[], &["sleep", "600"]);
    wait_until("research's guaranteed job", Duration::from_secs(30), || {
        running(holder)
    });
    let opp = submit(
        "research-opp",
        "research",
        &["--opportunistic"],
        &[&wl, "train"],
    );
    wait_until_or(
        "the opportunistic job to run as offline work, unsqueezed",
        Duration::from_secs(30),
        || {
            running(opp)
                && c.rank_record(opp, 0)
                    .is_some_and(|(_, r)| r["role"] == 1 && r["terms"]["qos"] == 1)
        },
        || format!("{}", c.job(opp)),
    );
    let gpu_of = |job: u64| c.job(job)["gpu_indices"].clone();
    let prod = submit("prod", "prod", &[], &[&wl, "train"]);
    wait_until_or(
        "the guaranteed job beside the opportunistic one, and the opportunistic one squeezed",
        Duration::from_secs(40),
        || {
            let m = &c.job(opp)["metrics"];
            running(prod)
                && gpu_of(prod) == gpu_of(opp)
                && m["compute_share_permille"]
                    .as_u64()
                    .is_some_and(|s| s > 0 && s < 1000)
                && m["memory_limit_mib"]
                    .as_u64()
                    .is_some_and(|l| l > 0 && l < GPU_MIB)
        },
        || format!("opp {}\nprod {}", c.job(opp), c.job(prod)),
    );
    let text = common::cli_text(&c.url, &c.token, &["jobs"]);
    let line = text
        .lines()
        .find(|l| l.contains("research-opp"))
        .unwrap_or_default();
    assert!(line.contains("share ") && line.contains("limit "), "{text}");

    // The upgrade: research's quota frees and the guaranteed neighbour leaves.
    c.cli(&["cancel", &holder.to_string()]);
    c.cli(&["cancel", &prod.to_string()]);
    wait_until_or(
        "the opportunistic job upgraded in place on its node",
        Duration::from_secs(40),
        || {
            c.rank_record(opp, 0)
                .is_some_and(|(_, r)| r["role"] == 0 && r["terms"]["qos"] == 0)
        },
        || format!("{} {:?}", c.job(opp), c.rank_record(opp, 0)),
    );
    assert_eq!(c.job(opp)["state"], "running", "upgraded, not restarted");
}

/// `arbiter node --policies-dir`: a `coordinator.wasm` dropped into the node's directory is
/// its policy from the next period, one that cannot be a coordinator is refused with the reason
/// and changes nothing, and removing the file goes back to what the node started with (here
/// `--policy none`: the fallback). The agent says each on its stdout.
#[test]
fn a_policy_dropped_into_the_nodes_directory_serves_and_its_removal_restores_the_node() {
    let fixtures = fixtures();
    let nvml = fake_nvml_lib();
    let dir = tmp_root().join(format!("cli-node-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (_server, c) = control_plane(&dir, fixtures);
    let lib = install_fake_nvml(&dir.join("node-a"), &nvml);
    let policies = dir.join("node-a.d");
    let node = c.start_node_with(
        "node-a",
        &lib,
        &[
            "--policy",
            "none",
            "--policies-dir",
            &policies.display().to_string(),
        ],
    );
    wait_until("node ready", Duration::from_secs(60), || {
        c.node_state("node-a") == "ready"
    });
    let wasm = policies.join("coordinator.wasm");
    // Staged and renamed into place, as an operator should: the watcher never reads a
    // half-written component (whose refusal would be said first).
    let drop_in = |name: &str| {
        let staged = policies.join("coordinator.part");
        std::fs::write(&staged, arbiter_policies::get(name).expect("built-in")).unwrap();
        std::fs::rename(&staged, &wasm).unwrap();
    };
    drop_in("sysmonitor");
    let loaded = node.wait_line("arbiter node node-a: policy ", Duration::from_secs(60));
    assert!(loaded.starts_with("sysmonitor (generation "), "{loaded}");
    drop_in("fifo");
    let refused = node.wait_line("arbiter node node-a: not loaded: ", Duration::from_secs(60));
    assert!(
        refused.contains("does not declare the `coordinator` role")
            && refused.ends_with("(sysmonitor serves)"),
        "{refused}"
    );
    std::fs::remove_file(&wasm).unwrap();
    let removed = node.wait_line(
        "arbiter node node-a: policy removed; ",
        Duration::from_secs(60),
    );
    assert!(removed.starts_with("none (the fallback"), "{removed}");
    // The node stays in service throughout.
    assert_eq!(c.node_state("node-a"), "ready");
    let _ = std::fs::remove_dir_all(&dir);
}
