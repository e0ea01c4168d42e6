//! Test fixtures for the interposer and the node: builds the fake driver (`libcuda.so.1`), the
//! interposer (`libarbiter_interpose.so`), the C workloads in `c/workload.c` and the fake
//! NVML (`libnvidia-ml.so`, [`build_fake_nvml`]), and reads the fake driver's accounting file.
//! Beside the fake driver it puts `libcudart.so.12`, a stand-in runtime (`c/fake_cudart.c`),
//! and `libnext_interposer.so`, a second ordinary interposer (`c/next_interposer.c`).
//!
//! The cdylibs are built by a nested `cargo build` with a *separate* target directory, so it
//! never waits on the build lock of the `cargo test` that runs us. The workload is compiled
//! twice with the system C compiler (`$CC`, default `cc`): once resolving the driver at run
//! time like cudart (`dlopen` + `cuGetProcAddress`), once linked directly with `-lcuda`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Paths of everything a test needs.
#[derive(Debug, Clone)]
pub struct Fixtures {
    /// `libarbiter_interpose.so`, for `LD_PRELOAD`.
    pub interposer: PathBuf,
    /// Directory holding `libcuda.so.1` (the fake), for `LD_LIBRARY_PATH`.
    pub libdir: PathBuf,
    /// Workload resolving the driver at run time (`WL_RESOLVE=gpa|gpa-ptds|gpa-v1|dlsym`).
    pub workload: PathBuf,
    /// Workload linked with `-lcuda` (`WL_RESOLVE=direct`).
    pub workload_direct: PathBuf,
    /// The fake `libnvidia-ml.so` (`tests/fake-nvml`); copy it beside a scenario file.
    pub fake_nvml: PathBuf,
    /// A second, ordinary `LD_PRELOAD` interposer (`c/next_interposer.c`) whose `getppid`
    /// calls the next definition found with `dlsym(RTLD_NEXT, …)`.
    pub next_interposer: PathBuf,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `cargo build ARGS --target-dir TARGET` in the workspace, as a nested build that never
/// waits on the lock of the build running the tests (its own target dir, none of the outer
/// build's jobserver or target settings).
fn nested_cargo_build(args: &[&str], target: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(
        Command::new(cargo)
            .current_dir(workspace_root())
            .arg("build")
            .args(args)
            .arg("--target-dir")
            .arg(target)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET_DIR")
            .env_remove("CARGO_MAKEFLAGS")
            .env_remove("MAKEFLAGS"),
        &format!("cargo build {}", args.join(" ")),
    )
}

/// Build (or rebuild incrementally) the fake `libnvidia-ml.so` (`tests/fake-nvml`) in the
/// target directory `target`; returns the built cdylib.
pub fn build_fake_nvml(target: &Path) -> Result<PathBuf, String> {
    nested_cargo_build(&["--manifest-path", "tests/fake-nvml/Cargo.toml"], target)?;
    Ok(target.join("debug").join("libnvidia_ml.so"))
}

/// Build (or rebuild incrementally) all fixtures under `work`.
///
/// `ARBITER_INTERPOSE_SO=<path>` tests a prebuilt interposer instead of building one: CI runs
/// the end-to-end tests a second time against the shipped glibc-2.17 build
/// (`scripts/build-interposer.sh`).
pub fn build(work: &Path) -> Result<Fixtures, String> {
    let root = workspace_root();
    let target = work.join("target");
    let prebuilt = std::env::var_os("ARBITER_INTERPOSE_SO").map(PathBuf::from);
    if let Some(so) = &prebuilt
        && !so.is_file()
    {
        return Err(format!(
            "ARBITER_INTERPOSE_SO={}: no such file",
            so.display()
        ));
    }
    let packages: &[&str] = if prebuilt.is_some() {
        &["-p", "fake-cuda"]
    } else {
        &["-p", "arbiter-interpose", "-p", "fake-cuda"]
    };
    nested_cargo_build(packages, &target)?;
    let built = target.join("debug");
    let libdir = work.join("lib");
    let bin = work.join("bin");
    for d in [&libdir, &bin] {
        std::fs::create_dir_all(d).map_err(|e| format!("mkdir {}: {e}", d.display()))?;
    }
    let fake = libdir.join("libcuda.so.1");
    let tmp = libdir.join(".libcuda.so.1.tmp");
    std::fs::copy(built.join("libcuda.so"), &tmp).map_err(|e| format!("copy fake driver: {e}"))?;
    std::fs::rename(&tmp, &fake).map_err(|e| format!("install fake driver: {e}"))?;
    let link = libdir.join("libcuda.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so.1", &link).map_err(|e| format!("symlink: {e}"))?;

    let src = root.join("tests/cuda-workload/c/workload.c");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let workload = bin.join("workload");
    let workload_direct = bin.join("workload-direct");
    run(
        Command::new(&cc)
            .args(["-O1", "-Wall", "-o"])
            .arg(&workload)
            .arg(&src)
            .args(["-ldl", "-lpthread"]),
        "cc workload.c",
    )?;
    run(
        Command::new(&cc)
            .args(["-O1", "-Wall", "-DDIRECT_LINK", "-o"])
            .arg(&workload_direct)
            .arg(&src)
            .arg(format!("-L{}", libdir.display()))
            .args(["-lcuda", "-ldl", "-lpthread"]),
        "cc -DDIRECT_LINK workload.c -lcuda",
    )?;
    let fake_nvml = build_fake_nvml(&target)?;
    run(
        Command::new(&cc)
            .args(["-O1", "-Wall", "-shared", "-fPIC", "-o"])
            .arg(libdir.join("libcudart.so.12"))
            .arg(root.join("tests/cuda-workload/c/fake_cudart.c"))
            .arg("-ldl"),
        "cc -shared fake_cudart.c",
    )?;
    let next_interposer = libdir.join("libnext_interposer.so");
    run(
        Command::new(&cc)
            .args(["-O1", "-Wall", "-shared", "-fPIC", "-o"])
            .arg(&next_interposer)
            .arg(root.join("tests/cuda-workload/c/next_interposer.c"))
            .arg("-ldl"),
        "cc -shared next_interposer.c",
    )?;
    Ok(Fixtures {
        interposer: prebuilt.unwrap_or_else(|| built.join("libarbiter_interpose.so")),
        libdir,
        workload,
        workload_direct,
        fake_nvml,
        next_interposer,
    })
}

#[path = "../../fake-cuda/src/layout.rs"]
mod fake_layout;
/// Index of each counter in the fake driver's state file.
pub use fake_layout::{SLOTS as FAKE_SLOTS, STATE_MAGIC as FAKE_STATE_MAGIC, Slot as FakeSlot};

/// A snapshot of the fake driver's accounting (`FAKE_CUDA_STATE` file).
#[derive(Debug, Clone)]
pub struct FakeState(Vec<u64>);

impl FakeState {
    /// Read the file written by the fake driver.
    pub fn read(path: &Path) -> Result<FakeState, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect();
        if v.first() != Some(&FAKE_STATE_MAGIC) {
            return Err(format!("{}: not a fake-cuda state file", path.display()));
        }
        Ok(FakeState(v))
    }

    /// Value of one counter.
    pub fn get(&self, s: FakeSlot) -> u64 {
        self.0.get(s as usize).copied().unwrap_or(0)
    }
}
