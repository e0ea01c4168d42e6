//! Shared fixtures of the node's integration tests: the fake `libnvidia-ml.so.1`, the fake
//! `nvidia-cuda-mps-control`, and (through `cuda-workload`) the interposer, the fake
//! `libcuda.so.1` and the C workloads.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn tmp_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// A fresh directory for one test.
pub fn test_dir(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = tmp_root().join(format!(
        "node-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("test dir");
    d
}

/// The fake NVML cdylib, built once per test binary (see `cuda_workload::build_fake_nvml`).
pub fn fake_nvml_lib() -> &'static Path {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r =
        LIB.get_or_init(|| cuda_workload::build_fake_nvml(&tmp_root().join("fake-nvml-target")));
    match r {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Install a private copy of the fake NVML with `scenario` in `dir`; returns the library path.
/// (A separate file is a separate `dlopen` instance, so tests never share fake state.)
pub fn install_fake_nvml(dir: &Path, scenario: &serde_json::Value) -> PathBuf {
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(fake_nvml_lib(), &lib).expect("copy fake nvml");
    std::fs::write(
        dir.join("fake-nvml.json"),
        serde_json::to_vec_pretty(scenario).expect("scenario json"),
    )
    .expect("write scenario");
    lib
}

/// `tests/fake-mps/nvidia-cuda-mps-control`, the fake MPS control client.
pub fn fake_mps_binary() -> PathBuf {
    // Run from the checkout (git keeps its mode, 0755), never from a fresh
    // copy: exec of a file another test thread's fork may still hold open
    // for writing fails with ETXTBSY.
    workspace_root().join("tests/fake-mps/nvidia-cuda-mps-control")
}

/// Interposer, fake libcuda and C workloads (built once per test binary).
pub fn cuda_fixtures() -> &'static cuda_workload::Fixtures {
    static F: OnceLock<Result<cuda_workload::Fixtures, String>> = OnceLock::new();
    let r = F.get_or_init(|| cuda_workload::build(&tmp_root().join("node-cuda-fixtures")));
    match r {
        Ok(f) => f,
        Err(e) => panic!("building CUDA fixtures failed: {e}"),
    }
}

/// Environment of a C workload over the fake driver: resolving the driver like cudart does
/// (`cuGetProcAddress`), the fake's counters in `dir/fake-cuda-state`.
pub fn cuda_env(dir: &Path) -> Vec<(String, String)> {
    let f = cuda_fixtures();
    vec![
        ("WL_RESOLVE".into(), "gpa".into()),
        ("LD_LIBRARY_PATH".into(), f.libdir.display().to_string()),
        (
            "FAKE_CUDA_STATE".into(),
            dir.join("fake-cuda-state").display().to_string(),
        ),
        ("RUST_BACKTRACE".into(), "0".into()),
    ]
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "arbiter_node=debug".into()),
        )
        .try_init();
}
