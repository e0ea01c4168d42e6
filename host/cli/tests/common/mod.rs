//! Shared by the CLI's integration tests that drive a running control plane.

// Each test binary uses part of this module.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_arbiter");

/// Runs `arbiter <args> --server <url> --token <token> --json` (connection
/// options go before a trailing `-- command...`) and parses its JSON output;
/// panics with stderr when it fails.
pub fn cli_json(url: &str, token: &str, args: &[&str]) -> Value {
    let stdout = cli_output(url, token, args, true);
    serde_json::from_slice(&stdout).unwrap_or_else(|e| {
        panic!(
            "arbiter {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&stdout)
        )
    })
}

/// [`cli_json`] without `--json`: what a person reads.
pub fn cli_text(url: &str, token: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&cli_output(url, token, args, false)).into_owned()
}

fn cli_output(url: &str, token: &str, args: &[&str], json: bool) -> Vec<u8> {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let out = Command::new(BIN)
        .args(&args[..split])
        .args(["--server", url, "--token", token])
        .args(json.then_some("--json"))
        .args(&args[split..])
        .output()
        .expect("run arbiter");
    assert!(
        out.status.success(),
        "arbiter {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// An `arbiter serve` process, killed (SIGKILL) when dropped.
pub struct Server {
    child: Child,
    pub url: String,
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `arbiter serve` on `listen` with its data in `data`; returns once it serves.
pub fn serve(data: &Path, listen: &str) -> Server {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            listen,
            "--no-metrics",
            "--round",
            "50ms",
        ])
        .arg("--data")
        .arg(data)
        .args(["--default-duration", "1s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn arbiter serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = loop {
        assert!(
            Instant::now() < deadline,
            "server did not report its address"
        );
        let line = lines
            .next()
            .expect("server exited before serving")
            .expect("read stdout");
        if let Some(addr) = line.strip_prefix("arbiter serving gRPC on ") {
            break format!("http://{}", addr.trim());
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, url }
}

/// `arbiter sim --protocol PROTOCOL --config <a file holding scenario> EXTRA...`; the file
/// lives as long as the call.
pub fn sim_scenario(protocol: &str, scenario: &str, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, scenario).expect("write the scenario");
    Command::new(BIN)
        .args(["sim", "--protocol", protocol, "--config"])
        .arg(&file)
        .args(extra)
        .output()
        .expect("run arbiter")
}

/// The JSON a successful run printed; panics with its stderr when it failed.
pub fn json_of(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}
