//! The `gpu_check` example (run on real GPUs by `scripts/node-gpu-check.sh` and
//! `scripts/gpu-smoke.sh`) against the fake NVML and fake MPS control: its reconciliation of a
//! control block writes what NVML sees beyond the interposer's charge, and its MPS client runs
//! once per thread percentage with the daemon's client environment.

mod common;

use arbiter_interpose::control::{BlockInit, MappedBlock};
use serde_json::json;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

/// `target/<profile>/examples/gpu_check`, built by `cargo test` with the other examples.
fn gpu_check_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("examples").join("gpu_check");
    assert!(
        bin.exists(),
        "{} missing: `cargo test` builds examples (`cargo build -p arbiter-node --examples`)",
        bin.display()
    );
    bin
}

/// Runs `gpu_check --nvml-lib LIB ARGS...`; its stdout, after checking it succeeded.
fn gpu_check(lib: &Path, args: &[&OsStr]) -> String {
    let out = Command::new(gpu_check_binary())
        .arg("--nvml-lib")
        .arg(lib)
        .args(args)
        .output()
        .expect("run gpu_check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One sample of GPU 0, no MPS, and the reconciliation of the block at `path`.
fn reconcile_args(path: &Path) -> Vec<&OsStr> {
    let mut args = ["--samples", "1", "--no-mps", "--block"]
        .map(OsStr::new)
        .to_vec();
    args.push(path.as_os_str());
    args
}

#[test]
fn reconciliation_writes_what_nvml_sees_beyond_the_charge() {
    let dir = common::test_dir("gpu-check-reconcile");
    let pid = std::process::id();
    let lib = common::install_fake_nvml(
        &dir,
        &json!({
            "driver_version": "580.159.04",
            "gpus": [{
                "name": "Fake H200", "uuid": "GPU-fake-0000", "memory_total_mib": 143771,
                "timeline": [{ "t": 0, "utilization_pct": 10, "processes": [
                    { "pid": pid, "used_mib": 1542 },
                    { "pid": 1, "used_mib": 900 }
                ] }]
            }]
        }),
    );
    let path = dir.join("w.blk");
    let block = MappedBlock::create(
        &path,
        &BlockInit {
            quota_bytes: 4 << 30,
            ..BlockInit::default()
        },
    )
    .expect("block");
    let slot = block.claim_process_slot(u64::from(pid), 0).expect("slot");
    assert!(block.try_reserve(0, 1 << 30));
    block.processes[slot].held[0].store(1 << 30, Ordering::Relaxed);

    let stdout = gpu_check(&lib, &reconcile_args(&path));
    // Only the block's own process counts (pid 1 is another workload): 1542 - 1024 MiB.
    assert_eq!(
        block.device(0).unseen_bytes.load(Ordering::Relaxed),
        518 << 20,
        "{stdout}"
    );
    assert!(stdout.contains("unseen 543162368 B (518 MiB)"), "{stdout}");
    // Unseen memory now counts against the quota: 4096 - 1024 - 518 MiB are left.
    assert!(!block.try_reserve(0, (2554 << 20) + 1));
    assert!(block.try_reserve(0, 2554 << 20));
}

#[test]
fn a_block_whose_processes_nvml_does_not_report_is_left_alone() {
    let dir = common::test_dir("gpu-check-no-pid");
    let lib = common::install_fake_nvml(
        &dir,
        &json!({ "gpus": [{ "name": "Fake", "uuid": "GPU-fake-0000", "memory_total_mib": 1024,
                  "timeline": [{ "t": 0, "processes": [{ "pid": 1, "used_mib": 900 }] }] }] }),
    );
    let path = dir.join("w.blk");
    let block = MappedBlock::create(&path, &BlockInit::default()).expect("block");
    block
        .claim_process_slot(u64::from(std::process::id()), 0)
        .expect("slot");
    let stdout = gpu_check(&lib, &reconcile_args(&path));
    assert!(
        stdout.contains("NVML reports none of the block's processes"),
        "{stdout}"
    );
    assert_eq!(block.device(0).unseen_bytes.load(Ordering::Relaxed), 0);
}

/// A fake NVML with one GPU, and where the fake MPS daemon keeps its directories.
fn one_fake_gpu_with_mps(dir: &Path) -> (PathBuf, PathBuf) {
    let lib = common::install_fake_nvml(
        dir,
        &json!({ "gpus": [{ "name": "Fake", "uuid": "GPU-fake-0000", "memory_total_mib": 1024,
                  "timeline": [{ "t": 0 }] }] }),
    );
    (lib, dir.join("mps"))
}

/// [`gpu_check`] with one sample and the fake MPS daemon under `mps_dir`, then `args`.
fn gpu_check_with_mps(lib: &Path, mps_dir: &Path, args: &[&OsStr]) -> String {
    let mps_binary = common::fake_mps_binary();
    let mut all = vec![
        OsStr::new("--samples"),
        OsStr::new("1"),
        OsStr::new("--mps-binary"),
        mps_binary.as_os_str(),
        OsStr::new("--mps-dir"),
        mps_dir.as_os_str(),
    ];
    all.extend_from_slice(args);
    gpu_check(lib, &all)
}

#[test]
fn the_mps_client_runs_once_per_thread_percentage_with_the_daemons_environment() {
    let dir = common::test_dir("gpu-check-mps");
    let (lib, mps_dir) = one_fake_gpu_with_mps(&dir);
    let stdout = gpu_check_with_mps(
        &lib,
        &mps_dir,
        &[
            OsStr::new("--mps-client"),
            OsStr::new("echo pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE pipe=$CUDA_MPS_PIPE_DIRECTORY"),
            OsStr::new("--mps-client-pcts"),
            OsStr::new("100,25"),
        ],
    );
    let pipe = mps_dir.join("gpu0").join("pipe");
    for pct in [100, 25] {
        let line = format!("pct={pct} pipe={}", pipe.display());
        assert!(stdout.contains(&line), "no {line:?} in\n{stdout}");
    }
    assert!(stdout.contains("daemon stopped (quit)"), "{stdout}");
}

#[test]
fn a_fault_under_mps_is_seen_and_the_enforcers_restart_terminates_clients_and_starts_afresh() {
    let dir = common::test_dir("gpu-check-mps-fault");
    let (lib, mps_dir) = one_fake_gpu_with_mps(&dir);
    // The bystander connects (the fake daemon lists what the test writes), and the "faulting
    // client" does to the fake daemon what a fatal fault does to a real one: the server goes to
    // FAULT with the bystander still attached.
    let bystander = "P=$CUDA_MPS_PIPE_DIRECTORY; echo 777 > $P/servers; echo 4242 > $P/clients.777; \
                     echo bystander pct=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-unset}";
    let fault = "echo FAULT > $CUDA_MPS_PIPE_DIRECTORY/status.777; echo faulted";
    let stdout = gpu_check_with_mps(
        &lib,
        &mps_dir,
        &[
            OsStr::new("--mps-client"),
            OsStr::new(bystander),
            OsStr::new("--mps-client-pcts"),
            OsStr::new("50"),
            OsStr::new("--mps-fault"),
            OsStr::new(fault),
        ],
    );
    assert!(
        stdout.contains("faulting client: status exit status: 0, stdout \"faulted\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("healthy false, [server 777 Fault clients [4242]]"),
        "the poll must see the faulted server and its client:\n{stdout}"
    );
    assert!(
        stdout.contains("restart: 1 client(s) terminated"),
        "{stdout}"
    );
    assert!(
        stdout.contains("bystander: status exit status: 0, stdout \"bystander pct=unset\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("a fresh client after the restart:\nmps client at 100%"),
        "{stdout}"
    );
    let log = std::fs::read_to_string(mps_dir.join("gpu0").join("log").join("commands.log"))
        .expect("the fake daemon's command log");
    let terminate = log.find("CMD terminate_client 777 4242").expect(&log);
    let quit = log[terminate..]
        .find("CMD quit")
        .map(|i| i + terminate)
        .expect(&log);
    assert!(
        log[quit..].contains("START "),
        "the daemon is started again after the quit:\n{log}"
    );
}
