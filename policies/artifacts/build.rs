//! Builds every policy crate under `policies/` and `examples/` that opts in
//! with
//!
//! ```toml
//! [package.metadata.arbiter]
//! builtin = true   # or: fixture = true (test components, never offered to users)
//! ```
//!
//! for `wasm32-wasip2` with the `policy` profile, and embeds the components.
//! Opting in keeps library crates and policies still being written out of
//! the host's build.
//!
//! A component's name is its package name without a `policy-` and then a
//! `fixture-` prefix: `policies/fixture-misbehave` (`policy-fixture-misbehave`)
//! is `fixture("misbehave")`, `examples/tenant-policy`
//! (`tenant-deadline-first`) is `fixture("tenant-deadline-first")`.
//!
//! The nested cargo uses its own target directory so it never waits on the
//! lock of the build that runs this script.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "policy";

fn main() {
    if let Err(e) = run() {
        // A build script reports failure by panicking; say what to do about it.
        panic!("building the policy components failed: {e}");
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let policies_dir = manifest_dir
        .parent()
        .ok_or("no policies/ directory")?
        .to_path_buf();
    let workspace = policies_dir
        .parent()
        .ok_or("no workspace root")?
        .to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);

    println!("cargo:rerun-if-changed={}", workspace.join("wit").display());
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );
    // The directory itself catches new crates; every file below it, edits
    // (cargo does not look inside a watched directory's subdirectories).
    println!("cargo:rerun-if-changed={}", policies_dir.display());
    for wit in [["policy.wit"].as_slice(), &["v0.3", "policy.wit"]] {
        let path = wit
            .iter()
            .fold(workspace.join("wit"), |p, part| p.join(part));
        println!("cargo:rerun-if-changed={}", path.display());
    }
    watch_files(&policies_dir)?;
    // Example policies (documented in docs/writing-policies.md) opt in the same way.
    let examples_dir = workspace.join("examples");
    if examples_dir.is_dir() {
        println!("cargo:rerun-if-changed={}", examples_dir.display());
        watch_files(&examples_dir)?;
    }
    // (package name, kind)
    let mut crates = Vec::new();
    for dir in [&policies_dir, &examples_dir] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path().join("Cargo.toml");
            let manifest = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(kind) = artifact_kind(&manifest) {
                let package = package_name(&manifest)
                    .ok_or_else(|| format!("{}: no [package] name", path.display()))?;
                crates.push((package, kind));
            }
        }
    }
    crates.sort_by(|a, b| a.0.cmp(&b.0));

    ensure_target()?;
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("wasm-policies");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args([
            "build",
            "--target",
            TARGET,
            "--profile",
            PROFILE,
            "--target-dir",
        ])
        .arg(&target_dir);
    for (package, _) in &crates {
        cmd.args(["-p", package]);
    }
    // Flags meant for the host build must not leak into the Wasm build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo build --target {TARGET}` failed ({status}); is the target installed? \
             run `rustup target add {TARGET}`"
        ));
    }

    let mut generated = String::new();
    for (kind, constant, doc) in [
        (
            Kind::Builtin,
            "BUILTIN",
            "Built-in policies: (name, component bytes).",
        ),
        (
            Kind::Fixture,
            "FIXTURES",
            "Test fixtures (misbehaving or foreign components): (name, bytes).",
        ),
    ] {
        writeln!(
            generated,
            "/// {doc}\npub const {constant}: &[(&str, &[u8])] = &["
        )
        .map_err(|e| e.to_string())?;
        for (package, _) in crates.iter().filter(|(_, k)| *k == kind) {
            let file = target_dir
                .join(TARGET)
                .join(PROFILE)
                .join(format!("{}.wasm", package.replace('-', "_")));
            if !file.is_file() {
                return Err(format!(
                    "expected component {} was not produced",
                    file.display()
                ));
            }
            let name = package.strip_prefix("policy-").unwrap_or(package);
            let short = name.strip_prefix("fixture-").unwrap_or(name);
            writeln!(
                generated,
                "    ({short:?}, include_bytes!({:?})),",
                path_str(&file)?
            )
            .map_err(|e| e.to_string())?;
        }
        generated.push_str("];\n");
    }
    std::fs::write(out_dir.join("builtin.rs"), generated).map_err(|e| e.to_string())?;
    Ok(())
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("non-UTF-8 path {}", p.display()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Builtin,
    Fixture,
}

/// `builtin = true` or `fixture = true` under `[package.metadata.arbiter]`.
fn artifact_kind(manifest: &str) -> Option<Kind> {
    let mut in_section = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[package.metadata.arbiter]";
        } else if in_section {
            match line.replace(' ', "").as_str() {
                "builtin=true" => return Some(Kind::Builtin),
                "fixture=true" => return Some(Kind::Fixture),
                _ => {}
            }
        }
    }
    None
}

/// `name = "..."` under `[package]`.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_section = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[package]";
        } else if in_section {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if key.trim() == "name" {
                // `name = "pkg"`, possibly followed by a comment.
                let quoted = value.trim().strip_prefix('"')?;
                return quoted.split_once('"').map(|(name, _)| name.to_string());
            }
        }
    }
    None
}

/// Prints `rerun-if-changed` for every source file below `dir`.
fn watch_files(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            watch_files(&path)?;
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Ok(())
}

/// Installs the `wasm32-wasip2` standard library through rustup if the
/// toolchain lacks it, so a fresh checkout builds with plain `cargo`.
fn ensure_target() -> Result<(), String> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run {rustc}: {e}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if sysroot.join("lib").join("rustlib").join(TARGET).is_dir() {
        return Ok(());
    }
    println!("cargo:warning=installing the {TARGET} target with `rustup target add {TARGET}`");
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .map_err(|e| format!("the {TARGET} target is missing and rustup is not available ({e}); install the target for your toolchain"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`rustup target add {TARGET}` failed ({status})"))
    }
}
