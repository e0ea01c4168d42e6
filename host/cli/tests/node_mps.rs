//! `arbiter node --mps-control`: one MPS control daemon per GPU, started
//! before the agent registers (against the recording fake of
//! `nvidia-cuda-mps-control`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_arbiter");

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` and waits for a stdout line starting with `prefix`.
fn spawn_until(cmd: &mut Command, prefix: &str) -> (Killed, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn arbiter");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let child = Killed(child);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no `{prefix}` line"));
        if let Some(rest) = line.strip_prefix(prefix) {
            return (child, rest.trim().to_string());
        }
    }
}

/// The fake MPS control client, run from the checkout (git keeps its mode):
/// a fresh copy could fail to exec with ETXTBSY while another test thread's
/// fork still holds it open for writing.
fn fake_mps() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fake-mps/nvidia-cuda-mps-control")
}

#[test]
fn the_agent_starts_one_mps_daemon_per_gpu_before_registering() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (_server, addr) = spawn_until(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--nodes",
                "0",
                "--no-metrics",
            ])
            .arg("--data")
            .arg(&data),
        "arbiter serving gRPC on ",
    );
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap();
    let state = dir.path().join("node");
    let (_node, _) = spawn_until(
        Command::new(BIN)
            .args([
                "node",
                "--name",
                "mps-node",
                "--sim-gpus",
                "2",
                "--policy",
                "none",
            ])
            .args([
                "--server",
                &format!("http://{addr}"),
                "--token",
                token.trim(),
            ])
            .arg("--state-dir")
            .arg(&state)
            .arg("--mps-control")
            .arg(fake_mps()),
        "arbiter node mps-node connected",
    );
    for gpu in 0..2 {
        let log = state.join(format!("mps/gpu{gpu}/log/commands.log"));
        let text =
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert!(
            text.contains(&format!("START CUDA_VISIBLE_DEVICES=GPU-sim-{gpu:04}")),
            "{text}"
        );
        assert!(state.join(format!("mps/gpu{gpu}/pipe/control")).exists());
    }
}
