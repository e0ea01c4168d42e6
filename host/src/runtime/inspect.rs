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
    /// What compiling it would cost, counted over every nested module.
    pub code: CodeStats,
}

/// The sizes that drive compile time and compile memory (Cranelift's cost is
/// per function and per byte of body), and what instantiation would create.
/// Counted from the section headers before anything is compiled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CodeStats {
    /// Core modules, at any depth.
    pub modules: usize,
    /// Nested components, at any depth, and how deep they nest (0: none). Validating
    /// them costs memory for each (a million empty ones, 10 MB in the file, took the
    /// host past 24 GiB).
    pub components: u64,
    pub component_depth: u64,
    /// Defined core functions, over all modules.
    pub functions: u64,
    /// Bytes of function bodies, over all modules.
    pub code_bytes: u64,
    /// The largest single function body.
    pub largest_body: u64,
    /// Declared locals, over all functions.
    pub locals: u64,
    /// The most control-flow edges in one function (blocks, branches, `br_table`
    /// targets): Cranelift's time grows faster than linearly with them, so a body
    /// within the byte limit made of nothing else compiles for minutes.
    pub largest_function_branches: u64,
    /// Control-flow edges over all functions.
    pub branches: u64,
    /// The most calls in one function: each keeps compile-time metadata (300,000 calls
    /// in one body took 540 MiB to compile).
    pub largest_function_calls: u64,
    /// Defined linear memories and tables, over all modules.
    pub memories: u64,
    pub tables: u64,
    /// The largest size, in bytes, any one defined linear memory starts at (its declared
    /// minimum): instantiating its module needs at least this much memory at once.
    pub largest_memory_minimum: u64,
    /// Bytes of data segments.
    pub data_bytes: u64,
    /// Element segments (table initialisers) and their items, one each: wasmtime's
    /// translation spends kilobytes on each (a million items in a 1 MB file took 15 s and
    /// 2.3 GiB; 100,000 empty passive segments, 1.1 s and 280 MiB).
    pub element_items: u64,
    /// Component-level definitions (types, aliases, canonical functions,
    /// instances): the component model's own compile-time cost.
    pub component_items: u64,
}

/// The most a component may cost to compile. Compilation is not
/// interruptible, so these are checked against [`CodeStats`] before it
/// starts: a refused component costs a parse and nothing more. The defaults
/// are several times the largest built-in policy (see BENCHMARKS.md,
/// "compile limits") and bound one compilation to a few seconds and a few
/// hundred MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileLimits {
    pub max_bytes: usize,
    pub max_modules: usize,
    pub max_components: u64,
    pub max_component_depth: u64,
    pub max_functions: u64,
    pub max_function_branches: u64,
    pub max_branches: u64,
    pub max_function_calls: u64,
    pub max_code_bytes: u64,
    pub max_body_bytes: u64,
    pub max_locals: u64,
    pub max_memories: u64,
    pub max_tables: u64,
    pub max_data_bytes: u64,
    pub max_element_items: u64,
    pub max_component_items: u64,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            max_bytes: 16 << 20,
            max_modules: 16,
            max_components: 64,
            max_component_depth: 8,
            max_functions: 20_000,
            max_function_branches: 50_000,
            max_branches: 500_000,
            max_function_calls: 50_000,
            max_code_bytes: 8 << 20,
            max_body_bytes: 1 << 20,
            max_locals: 1 << 20,
            max_memories: 4,
            max_tables: 8,
            max_data_bytes: 8 << 20,
            max_element_items: 20_000,
            max_component_items: 50_000,
        }
    }
}

/// The refusal of a count over its limit.
fn over(what: &str, have: u64, max: u64) -> Result<(), String> {
    if have > max {
        Err(format!(
            "{what}: {have}, the limit is {max} (compile limits bound the time and memory one upload can cost)"
        ))
    } else {
        Ok(())
    }
}

impl CompileLimits {
    /// The size limit alone: checked before the file is read at all, since reading it
    /// (inspection reads every operator) costs time in proportion to its size.
    pub fn check_size(&self, size: usize) -> Result<(), String> {
        over(
            "component size in bytes",
            size as u64,
            self.max_bytes as u64,
        )
    }

    /// The first limit `stats` (of a file of `size` bytes) exceeds, as a
    /// sentence for the operator.
    pub fn check(&self, size: usize, stats: &CodeStats) -> Result<(), String> {
        self.check_size(size)?;
        over(
            "core modules",
            stats.modules as u64,
            self.max_modules as u64,
        )?;
        over("nested components", stats.components, self.max_components)?;
        over(
            "levels of nested components",
            stats.component_depth,
            self.max_component_depth,
        )?;
        over("functions", stats.functions, self.max_functions)?;
        over(
            "control-flow edges in one function",
            stats.largest_function_branches,
            self.max_function_branches,
        )?;
        over(
            "control-flow edges in all functions",
            stats.branches,
            self.max_branches,
        )?;
        over(
            "calls in one function",
            stats.largest_function_calls,
            self.max_function_calls,
        )?;
        over(
            "bytes of function bodies",
            stats.code_bytes,
            self.max_code_bytes,
        )?;
        over(
            "bytes in one function body",
            stats.largest_body,
            self.max_body_bytes,
        )?;
        over("declared locals", stats.locals, self.max_locals)?;
        over("linear memories", stats.memories, self.max_memories)?;
        over("tables", stats.tables, self.max_tables)?;
        over(
            "bytes of data segments",
            stats.data_bytes,
            self.max_data_bytes,
        )?;
        over(
            "element segments and their items",
            stats.element_items,
            self.max_element_items,
        )?;
        over(
            "component-level definitions",
            stats.component_items,
            self.max_component_items,
        )
    }
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

/// A function body's control-flow edges and calls: every operator that starts, ends or
/// leaves a block (a `br_table` counts each target) and every call. Read without
/// compiling, a linear pass over the operators.
fn control_flow(body: &wasmparser::FunctionBody<'_>) -> wasmparser::Result<(u64, u64)> {
    use wasmparser::Operator as Op;
    let (mut branches, mut calls) = (0u64, 0u64);
    let mut operators = body.get_operators_reader()?;
    while !operators.eof() {
        match operators.read()? {
            Op::Block { .. }
            | Op::Loop { .. }
            | Op::If { .. }
            | Op::Else
            | Op::Br { .. }
            | Op::BrIf { .. }
            | Op::BrOnNull { .. }
            | Op::BrOnNonNull { .. }
            | Op::BrOnCast { .. }
            | Op::BrOnCastFail { .. }
            | Op::TryTable { .. }
            | Op::Try { .. }
            | Op::Catch { .. }
            | Op::CatchAll
            | Op::Delegate { .. } => branches += 1,
            Op::BrTable { targets } => branches += u64::from(targets.len()) + 1,
            Op::Call { .. }
            | Op::CallIndirect { .. }
            | Op::CallRef { .. }
            | Op::ReturnCall { .. }
            | Op::ReturnCallIndirect { .. }
            | Op::ReturnCallRef { .. } => calls += 1,
            _ => {}
        }
    }
    Ok((branches, calls))
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
        code: CodeStats::default(),
    };
    let malformed = |e: wasmparser::BinaryReaderError| InspectError::Malformed(e.to_string());
    let code = &mut inspection.code;
    // What each enclosing section is: `true` a component, `false` a core module.
    let mut nesting: Vec<bool> = Vec::new();
    let mut component_depth = 0u64;
    for payload in Parser::new(0).parse_all(bytes) {
        let depth = nesting.len();
        let payload = payload.map_err(malformed)?;
        match payload {
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } if depth == 0 => {
                return Err(InspectError::CoreModule);
            }
            Payload::ModuleSection { .. } => {
                code.modules += 1;
                nesting.push(false);
            }
            Payload::ComponentSection { .. } => {
                code.components += 1;
                nesting.push(true);
                component_depth += 1;
                code.component_depth = code.component_depth.max(component_depth);
            }
            Payload::End(_) => component_depth -= u64::from(nesting.pop() == Some(true)),
            Payload::FunctionSection(reader) => code.functions += u64::from(reader.count()),
            Payload::CodeSectionStart { size, .. } => code.code_bytes += u64::from(size),
            Payload::CodeSectionEntry(body) => {
                let range = body.range();
                code.largest_body = code.largest_body.max(range.end - range.start);
                for local in body.get_locals_reader().map_err(malformed)? {
                    code.locals += u64::from(local.map_err(malformed)?.0);
                }
                let (branches, calls) = control_flow(&body).map_err(malformed)?;
                code.largest_function_branches = code.largest_function_branches.max(branches);
                code.branches += branches;
                code.largest_function_calls = code.largest_function_calls.max(calls);
            }
            Payload::MemorySection(reader) => {
                code.memories += u64::from(reader.count());
                for memory in reader {
                    let memory = memory.map_err(malformed)?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16).min(16);
                    code.largest_memory_minimum = code
                        .largest_memory_minimum
                        .max(memory.initial.saturating_mul(page));
                }
            }
            Payload::TableSection(reader) => code.tables += u64::from(reader.count()),
            Payload::ElementSection(reader) => {
                for element in reader {
                    code.element_items += 1 + u64::from(match element.map_err(malformed)?.items {
                        wasmparser::ElementItems::Functions(items) => items.count(),
                        wasmparser::ElementItems::Expressions(_, items) => items.count(),
                    });
                }
            }
            Payload::DataSection(reader) => {
                for data in reader {
                    code.data_bytes += data.map_err(malformed)?.data.len() as u64;
                }
            }
            Payload::ComponentTypeSection(reader) => {
                code.component_items += u64::from(reader.count());
                // Reading each type here bounds how deeply component and instance types
                // nest (wasmparser stops at 100 levels); the validator wasmtime runs reads
                // them recursively without a bound, and 100,000 levels (300 KB) overflowed
                // the host's stack.
                for ty in reader {
                    ty.map_err(malformed)?;
                }
            }
            Payload::CoreTypeSection(reader) => code.component_items += u64::from(reader.count()),
            Payload::ComponentAliasSection(reader) => {
                code.component_items += u64::from(reader.count())
            }
            Payload::ComponentCanonicalSection(reader) => {
                code.component_items += u64::from(reader.count())
            }
            Payload::ComponentInstanceSection(reader) => {
                code.component_items += u64::from(reader.count())
            }
            Payload::InstanceSection(reader) => code.component_items += u64::from(reader.count()),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let name = import.map_err(malformed)?.name.name.to_string();
                    let class = classify_import(&name);
                    inspection.imports.push((name, class));
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    inspection
                        .exports
                        .push(export.map_err(malformed)?.name.name.to_string());
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
