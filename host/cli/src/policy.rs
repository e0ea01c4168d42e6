//! `arbiter policy …`: check and list policy components.

use anyhow::Context;
use arbiter_host::files::read_component_file;
use arbiter_host::runtime::{
    CodeStats, CompiledPolicy, ImportClass, MAX_NAME_TEXT, PolicyEngine, RuntimeConfig,
    SERVED_VERSIONS, guest_text, inspect_component,
};
use clap::{Args, Subcommand};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Check a `.wasm` file: is it a policy component, which roles, manifest,
    /// imports; then instantiate it and configure it with its default
    /// configuration under the deadline.
    Check(CheckArgs),
    /// List the built-in policies and those in a policy directory, or (with
    /// `--server`) the slots of a running control plane.
    Ls(LsArgs),
    #[command(flatten)]
    Remote(crate::client::RemotePolicy),
}

#[derive(Args)]
pub struct CheckArgs {
    /// The component to check, or the name of a built-in policy.
    pub file: String,
    /// Capability import prefixes to allow (e.g. `wasi:clocks/`); refused by default.
    #[arg(long = "allow", value_name = "PREFIX")]
    pub allow: Vec<String>,
    /// The deadline `describe` and `configure` run under (a host's own; the
    /// default is the runtime's).
    #[arg(long)]
    pub deadline_ms: Option<u64>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct LsArgs {
    /// A policy directory to list besides the built-ins.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// List the slots of this control plane instead.
    #[arg(long)]
    pub server: Option<String>,
    /// Bearer token for `--server`.
    #[arg(long, env = "ARBITER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate to trust for an `https://` `--server`.
    #[arg(long, env = "ARBITER_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: &PolicyCommand) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Check(args) => check(args),
        PolicyCommand::Ls(args) => match &args.server {
            Some(server) => crate::block_on(crate::client::remote_ls(&crate::client::Conn {
                server: server.clone(),
                token: args.token.clone(),
                ca_cert: args.ca_cert.clone(),
                json: args.json,
            })),
            None => ls(args),
        },
        PolicyCommand::Remote(cmd) => crate::block_on(crate::client::remote_policy(cmd)),
    }
}

#[derive(Serialize)]
struct Report {
    source: String,
    ok: bool,
    error: Option<String>,
    digest: Option<String>,
    size_bytes: Option<usize>,
    name: Option<String>,
    version: Option<String>,
    description: Option<String>,
    roles: Vec<String>,
    /// The contract version it was built against (`0.2.0` is served through the adapter).
    contract: Option<String>,
    default_config: Option<String>,
    imports: Vec<ImportReport>,
    /// What compiling it costs (absent when it is not a component at all).
    code: Option<CodeStats>,
}

#[derive(Serialize)]
struct ImportReport {
    name: String,
    class: ImportClass,
}

fn report(source: &str, bytes: &[u8], result: Result<CompiledPolicy, String>) -> Report {
    let inspection = inspect_component(bytes).ok();
    let code = inspection.as_ref().map(|i| i.code);
    // Import names come from the file: bounded and escaped like any guest text.
    let imports = inspection
        .map(|i| {
            i.imports
                .into_iter()
                .map(|(name, class)| ImportReport {
                    name: guest_text(&name, MAX_NAME_TEXT, false),
                    class,
                })
                .collect()
        })
        .unwrap_or_default();
    match result {
        Ok(c) => Report {
            source: source.into(),
            ok: true,
            error: None,
            digest: Some(c.digest.clone()),
            size_bytes: Some(c.inspection.size_bytes),
            name: Some(c.manifest.name.clone()),
            version: Some(c.manifest.version.clone()),
            description: Some(c.manifest.description.clone()),
            roles: c.manifest.roles.clone(),
            contract: Some(c.contract_version().to_string()),
            default_config: Some(c.manifest.default_config.clone()),
            imports,
            code,
        },
        Err(error) => Report {
            source: source.into(),
            ok: false,
            error: Some(error),
            digest: None,
            size_bytes: Some(bytes.len()),
            name: None,
            version: None,
            description: None,
            roles: Vec::new(),
            contract: None,
            default_config: None,
            imports,
            code,
        },
    }
}

fn check(args: &CheckArgs) -> anyhow::Result<()> {
    let bytes = arbiter_repro::read_policy(&args.file)?;
    let defaults = RuntimeConfig::default();
    let engine = PolicyEngine::new(RuntimeConfig {
        allowed_capabilities: args.allow.clone(),
        deadline: args
            .deadline_ms
            .map_or(defaults.deadline, std::time::Duration::from_millis),
        ..defaults
    })?;
    let result = engine
        .compile(&bytes)
        .and_then(|c| c.try_default_configuration().map(|()| c))
        .map_err(|e| e.to_string());
    let r = report(&args.file, &bytes, result);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_report(&r);
    }
    if r.ok {
        Ok(())
    } else {
        anyhow::bail!("{} is not a usable policy", args.file)
    }
}

fn print_report(r: &Report) {
    if r.ok {
        println!("✓ {} is a policy component", r.source);
        println!(
            "  name         {} {}",
            r.name.as_deref().unwrap_or(""),
            r.version.as_deref().unwrap_or("")
        );
        println!("  roles        {}", r.roles.join(", "));
        if let Some(v) = &r.contract {
            let note = if v.as_str() == SERVED_VERSIONS[0] {
                ""
            } else {
                " (an older contract, served through the host's adapter)"
            };
            println!("  contract     arbiter:policy@{v}{note}");
        }
        // Continuation lines are indented, so a description cannot print a
        // line of its own that looks like the report's verdict.
        let mut description = r.description.as_deref().unwrap_or("").lines();
        println!("  description  {}", description.next().unwrap_or(""));
        for line in description {
            println!("               {line}");
        }
        println!(
            "  digest       sha256:{}",
            r.digest.as_deref().unwrap_or("")
        );
        println!("  size         {} bytes", r.size_bytes.unwrap_or(0));
        if let Some(code) = &r.code {
            println!(
                "  code         {} modules, {} functions, {} bytes of code, {} memories, {} tables",
                code.modules, code.functions, code.code_bytes, code.memories, code.tables
            );
        }
        println!("  configured   with its default configuration, within the deadline");
        if let Some(cfg) = r.default_config.as_deref().filter(|c| !c.trim().is_empty()) {
            println!("  default config:");
            for line in cfg.lines() {
                println!("    {line}");
            }
        }
    } else {
        println!(
            "✗ {}: {}",
            r.source,
            r.error.as_deref().unwrap_or("unknown error")
        );
    }
    if !r.imports.is_empty() {
        println!("  imports:");
        for i in &r.imports {
            let what = match i.class {
                ImportClass::Host => "contract host interface",
                ImportClass::InertWasi => "inert WASI plumbing (trapping stubs)",
                ImportClass::FixedSeed => "hash seed (fixed, deterministic)",
                ImportClass::Capability => "CAPABILITY — refused unless --allow",
                ImportClass::Unknown => "UNKNOWN — refused",
            };
            println!("    {:<40} {what}", i.name);
        }
    }
}

fn ls(args: &LsArgs) -> anyhow::Result<()> {
    let engine = PolicyEngine::new(RuntimeConfig::default())?;
    let mut rows = Vec::new();
    for name in arbiter_policies::names() {
        let bytes = arbiter_policies::get(name).unwrap_or_default();
        let r = engine.compile(bytes).map_err(|e| e.to_string());
        rows.push(report(&format!("builtin:{name}"), bytes, r));
    }
    if let Some(dir) = &args.dir {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
            .collect();
        files.sort();
        // A file that cannot be read is a row of its own, like one that does not compile:
        // the listing goes on.
        for file in files {
            let source = file.display().to_string();
            match read_component_file(&file).map_err(|e| format!("{e:#}")) {
                Ok(bytes) => {
                    let r = engine.compile(&bytes).map_err(|e| e.to_string());
                    rows.push(report(&source, &bytes, r));
                }
                Err(error) => rows.push(report(&source, &[], Err(error))),
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<34} {:<22} {:<9} {:<20} DIGEST",
        "SOURCE", "NAME", "VERSION", "ROLES"
    );
    for r in &rows {
        if r.ok {
            println!(
                "{:<34} {:<22} {:<9} {:<20} {}",
                r.source,
                r.name.as_deref().unwrap_or(""),
                r.version.as_deref().unwrap_or(""),
                r.roles.join(","),
                &r.digest.as_deref().unwrap_or("")
                    [..12.min(r.digest.as_deref().unwrap_or("").len())]
            );
        } else {
            println!(
                "{:<34} ERROR: {}",
                r.source,
                r.error.as_deref().unwrap_or("")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_bytes(bytes: &[u8]) -> Report {
        let engine = PolicyEngine::new(RuntimeConfig::default()).unwrap();
        report("x", bytes, engine.compile(bytes).map_err(|e| e.to_string()))
    }

    #[test]
    fn the_report_names_the_contract_a_policy_was_built_against() {
        let current = check_bytes(arbiter_policies::get("fifo").unwrap());
        assert_eq!(current.contract.as_deref(), Some("0.4.0"));
        let old = check_bytes(arbiter_policies::fixture("contract-v0-3").unwrap());
        assert!(old.ok, "{:?}", old.error);
        assert_eq!(old.contract.as_deref(), Some("0.3.0"));
        let refused = check_bytes(arbiter_policies::fixture("old-contract").unwrap());
        assert!(!refused.ok);
        let error = refused.error.unwrap_or_default();
        assert!(
            error.contains("@0.4.0") && error.contains("@0.3.0"),
            "{error}"
        );
    }
}
