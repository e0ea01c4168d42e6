//! Static inspection of a `.wasm` file, before anything of it runs.

use wasmparser::{Encoding, Parser, Payload};

/// How the host treats an import.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportClass {
    /// The contract's own host interface.
    Host,
    /// WASI plumbing every Rust guest links (stdio for panics, environment,
    /// exit): satisfied by stubs that trap if called, so it grants nothing.
    InertWasi,
    /// `wasi:random/insecure-seed` (std's `HashMap` seeding): answered with a
    /// fixed seed, so policies stay deterministic and replayable.
    FixedSeed,
    /// A capability: filesystem, network, clocks, random, HTTP. Refused
    /// unless the operator allows it.
    Capability,
    /// Anything else: refused.
    Unknown,
}

/// What a `.wasm` file is and what it asks for.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Inspection {
    pub size_bytes: usize,
    pub imports: Vec<(String, ImportClass)>,
    pub exports: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InspectError {
    #[error("not a WebAssembly file (no `\\0asm` header)")]
    NotWasm,
    #[error(
        "a core WebAssembly module, not a component: build for wasm32-wasip2 (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    #[error("malformed component: {0}")]
    Malformed(String),
}

/// Classifies an import name like `wasi:filesystem/types@0.2.3`.
pub fn classify_import(name: &str) -> ImportClass {
    let interface = name.split('@').next().unwrap_or(name);
    if interface == "arbiter:policy/host" || interface == "arbiter:policy/types" {
        return ImportClass::Host;
    }
    const INERT: [&str; 11] = [
        // Newer Rust std links the monotonic clock; the stub traps if called,
        // so no clock is granted (policies read time through `host.now-ms`).
        "wasi:clocks/monotonic-clock",
        "wasi:cli/environment",
        "wasi:cli/exit",
        "wasi:cli/stdin",
        "wasi:cli/stdout",
        "wasi:cli/stderr",
        "wasi:cli/terminal-input",
        "wasi:cli/terminal-output",
        "wasi:cli/terminal-stdin",
        "wasi:cli/terminal-stdout",
        "wasi:cli/terminal-stderr",
    ];
    if interface == "wasi:random/insecure-seed" {
        return ImportClass::FixedSeed;
    }
    if INERT.contains(&interface) || interface.starts_with("wasi:io/") {
        return ImportClass::InertWasi;
    }
    const CAPABILITIES: [&str; 6] = [
        "wasi:filesystem/",
        "wasi:sockets/",
        "wasi:clocks/",
        "wasi:random/",
        "wasi:http/",
        "wasi:keyvalue/",
    ];
    // (`wasi:clocks/monotonic-clock` matched INERT above; `wall-clock` stays a capability.)
    if CAPABILITIES.iter().any(|c| interface.starts_with(c)) {
        return ImportClass::Capability;
    }
    ImportClass::Unknown
}

/// Reads a file's top-level imports and exports without compiling it.
pub fn inspect_component(bytes: &[u8]) -> Result<Inspection, InspectError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(InspectError::NotWasm);
    }
    let mut inspection = Inspection {
        size_bytes: bytes.len(),
        imports: Vec::new(),
        exports: Vec::new(),
    };
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| InspectError::Malformed(e.to_string()))?;
        match payload {
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } if depth == 0 => {
                return Err(InspectError::CoreModule);
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import.map_err(|e| InspectError::Malformed(e.to_string()))?;
                    let name = import.name.name.to_string();
                    let class = classify_import(&name);
                    inspection.imports.push((name, class));
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| InspectError::Malformed(e.to_string()))?;
                    inspection.exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(inspection)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_imports() {
        assert_eq!(
            classify_import("arbiter:policy/host@0.1.0"),
            ImportClass::Host
        );
        assert_eq!(
            classify_import("wasi:cli/stderr@0.2.4"),
            ImportClass::InertWasi
        );
        assert_eq!(
            classify_import("wasi:io/streams@0.2.4"),
            ImportClass::InertWasi
        );
        assert_eq!(
            classify_import("wasi:random/insecure-seed@0.2.6"),
            ImportClass::FixedSeed
        );
        assert_eq!(
            classify_import("wasi:random/random@0.2.6"),
            ImportClass::Capability
        );
        assert_eq!(
            classify_import("wasi:filesystem/preopens@0.2.4"),
            ImportClass::Capability
        );
        assert_eq!(
            classify_import("wasi:sockets/tcp@0.2.4"),
            ImportClass::Capability
        );
        assert_eq!(
            classify_import("wasi:clocks/monotonic-clock@0.2.12"),
            ImportClass::InertWasi
        );
        assert_eq!(
            classify_import("wasi:clocks/wall-clock@0.2.12"),
            ImportClass::Capability
        );
        assert_eq!(classify_import("evil:backdoor/open"), ImportClass::Unknown);
    }

    #[test]
    fn refuses_non_wasm_and_core_modules() {
        assert_eq!(
            inspect_component(b"#!/bin/sh\necho hi\n").unwrap_err(),
            InspectError::NotWasm
        );
        let core = wat::parse_str("(module (func (export \"f\")))").unwrap();
        assert_eq!(
            inspect_component(&core).unwrap_err(),
            InspectError::CoreModule
        );
    }
}
