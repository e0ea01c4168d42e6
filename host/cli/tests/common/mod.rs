//! Shared by the CLI's integration tests that drive a running control plane.

// Each test binary uses part of this module.
#![allow(dead_code)]

use serde_json::Value;
use std::process::Command;

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
