//! A corpus of hostile policy components, each paired with the safe behaviour
//! the host must show: refused when loaded, unusable (so `arbiter policy
//! check` fails), faulting until quarantined, or working with everything it
//! says bounded and escaped.
//!
//! Tenants upload their own policies, so every byte of a component and every
//! value it returns is hostile input. The corpus is built, not stored:
//!
//! - **compile bombs** and **resource bombs** are encoded here with
//!   `wasm-encoder`/`wat` — a module of 250k functions, one 2 MiB body, one
//!   function of 60k blocks or calls, eleven of 49k blocks, an element segment of 200k items, components nested 10k deep or 10k wide,
//!   a component type nested 100k deep, a data bomb, memories and tables
//!   beyond the instance budget appended to a real policy, a start function
//!   that never returns, an import of a host function that does not exist;
//! - **personas** patch the `fixture-misbehave` component's persona string
//!   (see that crate) so one build yields policies whose manifests carry
//!   terminal escapes, 40 MiB role names or 24 MiB descriptions, and whose
//!   `configure` loops, traps, fails or allocates without bound;
//! - **modes** configure `fixture-misbehave` to fail every call with a
//!   32 MiB message, loop, flap, answer the impossible, and so on, in each
//!   of the five roles.
//!
//! The same corpus runs through the engine (`host/tests/hostile.rs`),
//! `arbiter policy check` and `arbiter sim` (`host/cli/tests/hostile.rs`) and
//! a live `arbiter serve` (`host/serve/tests/hostile.rs`). Each harness
//! runs the cases that hang (`Case::hangs`) under a short deadline and every
//! other case under a long one, so no verdict depends on how fast or busy
//! the machine is.
//!
//! ```
//! let corpus = arbiter_hostile::corpus();
//! assert!(corpus.len() >= 40);
//! let bomb = corpus.iter().find(|c| c.name == "bomb-functions").unwrap();
//! assert!(matches!(bomb.expect, arbiter_hostile::Expect::Refused(_)));
//! assert!(!bomb.hangs);
//! assert!(corpus.iter().any(|c| c.name == "scheduler-hang-flap" && c.hangs));
//! ```

use wasm_encoder::{
    CodeSection, ComponentSectionId, ConstExpr, DataSection, Function, FunctionSection,
    InstanceSection, Module, ModuleArg, RawSection, TypeSection, ValType,
};

/// The policy role a misbehaving call is made in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Scheduler,
    Tenant,
    Reclaim,
    Matcher,
    Coordinator,
}

impl Role {
    /// The role's name in the contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Tenant => "tenant",
            Role::Reclaim => "reclaim",
            Role::Matcher => "matcher",
            Role::Coordinator => "coordinator",
        }
    }
}

/// What the host must do with a case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Refused when loaded; the error contains this text.
    Refused(&'static str),
    /// Loads, but instantiating it and configuring it with its default
    /// configuration faults with this kind (`PolicyFault::kind`), so
    /// `policy check` refuses it.
    Unusable(&'static str),
    /// Every call in `role` faults with `kind`: the host falls back and
    /// quarantines the generation.
    Faults { role: Role, kind: &'static str },
    /// Calls in `role` fault every other time: only a fault-rate quarantine
    /// catches it.
    Flaps { role: Role },
    /// Loads, configures and works; what it says reaches the operator bounded
    /// and escaped.
    Works,
}

/// One hostile component.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub wasm: Vec<u8>,
    /// The configuration a slot gives it (`None`: its default).
    pub config: Option<String>,
    pub expect: Expect,
    /// Whether the case runs past its deadline (a loop, a hang). A harness
    /// gives these a short deadline, since they pay it per call, and every
    /// other case a long one: what those are refused or faulted for (memory,
    /// a trap, a bad answer) must not turn into a deadline on a loaded
    /// machine.
    pub hangs: bool,
}

impl Case {
    fn new(name: impl Into<String>, wasm: Vec<u8>, expect: Expect) -> Case {
        let hangs = matches!(
            expect,
            Expect::Refused("deadline")
                | Expect::Unusable("deadline")
                | Expect::Faults {
                    kind: "deadline",
                    ..
                }
        );
        Case {
            name: name.into(),
            wasm,
            config: None,
            expect,
            hangs,
        }
    }
}

/// The marker `fixture-misbehave` keeps before its persona's name.
const PERSONA_MARKER: &[u8] = b"arbiter-hostile-persona:";
/// Bytes after the marker the persona's name may take.
const PERSONA_ROOM: usize = 64 - PERSONA_MARKER.len();

/// The `fixture-misbehave` component with its persona patched to `persona`.
///
/// # Panics
/// If the fixture does not hold exactly one persona marker or `persona`
/// does not fit: both mean the fixture and this crate disagree, a bug in
/// the test suite.
pub fn misbehave_as(persona: &str) -> Vec<u8> {
    let mut wasm = misbehave().to_vec();
    let at: Vec<usize> = wasm
        .windows(PERSONA_MARKER.len())
        .enumerate()
        .filter(|(_, w)| *w == PERSONA_MARKER)
        .map(|(i, _)| i + PERSONA_MARKER.len())
        .collect();
    assert_eq!(
        at.len(),
        1,
        "fixture-misbehave must hold one persona marker"
    );
    assert!(
        persona.len() <= PERSONA_ROOM,
        "persona `{persona}` too long"
    );
    let room = &mut wasm[at[0]..at[0] + PERSONA_ROOM];
    room.fill(b' ');
    room[..persona.len()].copy_from_slice(persona.as_bytes());
    wasm
}

fn misbehave() -> &'static [u8] {
    arbiter_policies::fixture("misbehave").expect("fixture-misbehave is built")
}

/// `base` (a component) with more core modules, given as text, and an
/// instance of each: the component instantiates them with everything else,
/// so what they define — memories, tables, a start function — is created
/// whenever the policy is.
///
/// # Panics
/// On invalid `module_wat` or a `base` that is not a component (test bugs).
pub fn with_core_modules(base: &[u8], modules_wat: &[&str]) -> Vec<u8> {
    let first = top_level_modules(base);
    let mut tail = wasm_encoder::Component::new();
    for (i, text) in modules_wat.iter().enumerate() {
        let module = wat::parse_str(text).expect("valid module text");
        tail.section(&RawSection {
            id: ComponentSectionId::CoreModule as u8,
            data: &module,
        });
        let mut instances = InstanceSection::new();
        instances.instantiate(first + i as u32, Vec::<(&str, ModuleArg)>::new());
        tail.section(&instances);
    }
    let mut out = base.to_vec();
    out.extend_from_slice(&tail.as_slice()[wasm_encoder::Component::HEADER.len()..]);
    out
}

/// Core modules defined at the top level of a component (its core module
/// index space; nested components have their own).
fn top_level_modules(component: &[u8]) -> u32 {
    let mut depth = 0u32;
    let mut modules = 0u32;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        match payload.expect("a valid component") {
            wasmparser::Payload::ModuleSection { .. } => {
                if depth == 0 {
                    modules += 1;
                }
                depth += 1;
            }
            wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    modules
}

/// A component holding one core module built by `build`.
fn component_of(module: &Module) -> Vec<u8> {
    let mut c = wasm_encoder::Component::new();
    c.section(&wasm_encoder::ModuleSection(module));
    c.finish()
}

/// A module of `count` empty functions: Cranelift's cost is per function.
pub fn many_functions(count: u32) -> Vec<u8> {
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut functions = FunctionSection::new();
    let mut code = CodeSection::new();
    let mut body = Function::new([]);
    body.instructions().end();
    for _ in 0..count {
        functions.function(0);
        code.function(&body);
    }
    module.section(&functions).section(&code);
    component_of(&module)
}

/// `count` functions, each with a body `body_bytes` long (nops) declaring
/// `locals` locals (Cranelift's cost grows with both).
fn functions_of(count: u32, body_bytes: usize, locals: u32) -> Vec<u8> {
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut functions = FunctionSection::new();
    let mut body = Function::new([(locals, ValType::I64)]);
    body.raw(std::iter::repeat_n(0x01u8, body_bytes)); // `nop`
    body.instructions().end();
    let mut code = CodeSection::new();
    for _ in 0..count {
        functions.function(0);
        code.function(&body);
    }
    module.section(&functions).section(&code);
    component_of(&module)
}

/// A module with one memory and a `bytes`-long active data segment.
fn data_bomb(bytes: usize) -> Vec<u8> {
    let mut module = Module::new();
    let pages = bytes.div_ceil(65_536) as u64;
    let mut memories = wasm_encoder::MemorySection::new();
    memories.memory(wasm_encoder::MemoryType {
        minimum: pages,
        maximum: None,
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    module.section(&memories);
    let mut data = DataSection::new();
    data.active(0, &ConstExpr::i32_const(0), vec![0xAB; bytes]);
    module.section(&data);
    component_of(&module)
}

/// A component of `count` nested core modules, each empty.
fn many_modules(count: usize) -> Vec<u8> {
    let mut c = wasm_encoder::Component::new();
    let empty = Module::new();
    for _ in 0..count {
        c.section(&wasm_encoder::ModuleSection(&empty));
    }
    c.finish()
}

/// `count` functions, each a body of `instruction` (raw bytes) `times` over: Cranelift's
/// time grows faster than linearly with one function's control-flow edges.
fn functions_repeating(count: u32, instruction: &[u8], times: usize) -> Vec<u8> {
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut functions = FunctionSection::new();
    let mut body = Function::new([]);
    body.raw(
        instruction
            .iter()
            .copied()
            .cycle()
            .take(instruction.len() * times),
    );
    body.instructions().end();
    let mut code = CodeSection::new();
    for _ in 0..count {
        functions.function(0);
        code.function(&body);
    }
    module.section(&functions).section(&code);
    component_of(&module)
}

/// One function and `segments` passive element segments of `items` references to it.
fn element_bomb(segments: usize, items: usize) -> Vec<u8> {
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut functions = FunctionSection::new();
    functions.function(0);
    module.section(&functions);
    let mut elements = wasm_encoder::ElementSection::new();
    for _ in 0..segments {
        elements.passive(wasm_encoder::Elements::Functions(vec![0; items].into()));
    }
    module.section(&elements);
    let mut body = Function::new([]);
    body.instructions().end();
    let mut code = CodeSection::new();
    code.function(&body);
    module.section(&code);
    component_of(&module)
}

/// The section id of a nested component, in a component.
const COMPONENT_SECTION: u8 = 4;
/// The section id of component type definitions.
const COMPONENT_TYPE_SECTION: u8 = 7;

fn leb(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    wasm_encoder::Encode::encode(&(n as u32), &mut out);
    out
}

/// Empty components nested `depth` deep, encoded directly: built with `wasm-encoder`
/// each level would copy the levels inside it.
fn nested_components(depth: usize) -> Vec<u8> {
    let header = wasm_encoder::Component::HEADER;
    // sizes[k]: the bytes of the component with k levels inside it.
    let mut sizes = vec![header.len()];
    for k in 0..depth {
        let inner = sizes[k];
        sizes.push(header.len() + 1 + leb(inner).len() + inner);
    }
    let mut out = Vec::with_capacity(sizes[depth]);
    for k in (0..depth).rev() {
        out.extend_from_slice(&header);
        out.push(COMPONENT_SECTION);
        out.extend(leb(sizes[k]));
    }
    out.extend_from_slice(&header);
    out
}

/// `outer` components side by side, each holding `inner` empty ones.
fn wide_components(outer: usize, inner: usize) -> Vec<u8> {
    let mut middle = wasm_encoder::Component::new();
    for _ in 0..inner {
        middle.section(&wasm_encoder::NestedComponentSection(
            &wasm_encoder::Component::new(),
        ));
    }
    let mut top = wasm_encoder::Component::new();
    for _ in 0..outer {
        top.section(&wasm_encoder::NestedComponentSection(&middle));
    }
    top.finish()
}

/// One component type nested `depth` deep (each declares the next), encoded directly.
fn nested_component_type(depth: usize) -> Vec<u8> {
    // A component type (0x41) of one declaration, a type (0x01), `depth` times; then an
    // empty one.
    let mut ty = [0x41u8, 0x01, 0x01].repeat(depth);
    ty.extend([0x41, 0x00]);
    let mut section = leb(1);
    section.extend(ty);
    let mut out = wasm_encoder::Component::HEADER.to_vec();
    out.push(COMPONENT_TYPE_SECTION);
    out.extend(leb(section.len()));
    out.extend(section);
    out
}

/// A component of `count` type definitions: the component model's own cost.
fn many_component_types(count: u32) -> Vec<u8> {
    let mut c = wasm_encoder::Component::new();
    let mut types = wasm_encoder::ComponentTypeSection::new();
    for _ in 0..count {
        types
            .defined_type()
            .primitive(wasm_encoder::PrimitiveValType::U32);
    }
    c.section(&types);
    c.finish()
}

/// A component that also asks for `function` from the contract's host
/// interface, which the host does not provide.
fn extra_host_function(function: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(component
             (import "arbiter:policy/host@0.4.0" (instance
               (export "log" (func (param "msg" string)))
               (export "{function}" (func (param "cmd" string) (result string))))))"#
    ))
    .expect("valid component text")
}

/// Every case of the corpus.
pub fn corpus() -> Vec<Case> {
    let mut cases = compile_bombs();
    cases.extend(resource_bombs());
    cases.extend(personas());
    cases.extend(modes());
    cases
}

fn compile_bombs() -> Vec<Case> {
    let refused = "refused before compiling";
    vec![
        // The issue's 1.2 MB component: 7.8 s and 1.4 GB to compile.
        Case::new(
            "bomb-functions",
            many_functions(250_000),
            Expect::Refused(refused),
        ),
        Case::new(
            "bomb-functions-just-over",
            many_functions(20_001),
            Expect::Refused(refused),
        ),
        Case::new(
            "bomb-body",
            functions_of(1, 2 << 20, 0),
            Expect::Refused(refused),
        ),
        // The validator allows 50,000 locals per function; 25 such functions
        // pass it and declare 1.2M together.
        Case::new(
            "bomb-locals",
            functions_of(25, 16, 49_000),
            Expect::Refused(refused),
        ),
        Case::new("bomb-data", data_bomb(9 << 20), Expect::Refused(refused)),
        Case::new("bomb-modules", many_modules(64), Expect::Refused(refused)),
        Case::new(
            "bomb-component-types",
            many_component_types(200_000),
            Expect::Refused(refused),
        ),
        Case::new("bomb-size", size_bomb(17 << 20), Expect::Refused(refused)),
        // 60,000 empty blocks in a row in one 180 KB body: seconds of Cranelift (a
        // million-byte body of them, minutes).
        Case::new(
            "bomb-branches",
            functions_repeating(1, &[0x02, 0x40, 0x0b], 60_000),
            Expect::Refused(refused),
        ),
        // Eleven functions each under the one-function limit, over the total.
        Case::new(
            "bomb-branches-spread",
            functions_repeating(11, &[0x02, 0x40, 0x0b], 49_000),
            Expect::Refused(refused),
        ),
        // 200 KB (without the limit, a million items took 15 s and 2.3 GiB to compile).
        Case::new(
            "bomb-elements",
            element_bomb(1, 200_000),
            Expect::Refused(refused),
        ),
        // 300 KB of empty segments (100,000 of them took 1.1 s and 280 MiB).
        Case::new(
            "bomb-element-segments",
            element_bomb(99_999, 0),
            Expect::Refused(refused),
        ),
        Case::new(
            "bomb-calls",
            functions_repeating(1, &[0x10, 0x00], 60_000),
            Expect::Refused(refused),
        ),
        // Beyond the validator's own limits too (`BEYOND_THE_VALIDATOR`), but wasmtime
        // spends gigabytes before its validator says so.
        Case::new(
            "bomb-nested-components",
            nested_components(10_000),
            Expect::Refused(refused),
        ),
        Case::new(
            "bomb-many-components",
            wide_components(100, 100),
            Expect::Refused(refused),
        ),
        // 100,000 levels in 300 KB: read recursively, it overflowed the host's stack.
        Case::new(
            "bomb-type-nesting",
            nested_component_type(100_000),
            Expect::Refused("nesting is too deep"),
        ),
    ]
}

/// A real policy padded with a custom section to `bytes`.
fn size_bomb(bytes: usize) -> Vec<u8> {
    let mut wasm = misbehave().to_vec();
    let pad = bytes.saturating_sub(wasm.len());
    let mut tail = wasm_encoder::Component::new();
    tail.section(&wasm_encoder::CustomSection {
        name: "padding".into(),
        data: vec![0u8; pad].into(),
    });
    wasm.extend_from_slice(&tail.as_slice()[wasm_encoder::Component::HEADER.len()..]);
    wasm
}

fn resource_bombs() -> Vec<Case> {
    let base = misbehave();
    vec![
        // Three more 37.5 MiB memories, one per module: each under the
        // per-memory cap, far over the instance's budget together (the
        // issue's policy ran at 942 MiB with 15 more).
        Case::new(
            "memories-in-three-modules",
            with_core_modules(base, &["(module (memory 600))"; 3]),
            Expect::Refused("memory cap"),
        ),
        // One just under the per-memory cap, beside the policy's own memory.
        Case::new(
            "memory-beside-a-policy",
            with_core_modules(base, &["(module (memory 1020))"]),
            Expect::Refused("memory cap"),
        ),
        // One whose declared minimum alone is over the cap (68.75 MiB): refused from the
        // file, before compiling, not by the pooling allocator at every instantiation.
        Case::new(
            "memory-minimum-over-the-cap",
            with_core_modules(base, &["(module (memory 1100))"]),
            Expect::Refused("memory cap"),
        ),
        // The issue's case: 15 more 60 MiB memories.
        Case::new(
            "memories-in-fifteen-modules",
            with_core_modules(base, &["(module (memory 960))"; 15]),
            Expect::Refused("refused before compiling"),
        ),
        Case::new(
            "memories-in-one-module",
            with_core_modules(base, &["(module (memory 960) (memory 960) (memory 960))"]),
            Expect::Refused("memories count"),
        ),
        // 5M table elements: small in the file, 80 MiB of host memory.
        Case::new(
            "table-beside-a-policy",
            with_core_modules(base, &["(module (table 5000000 funcref))"]),
            Expect::Refused("minimum element size"),
        ),
        Case::new(
            "start-function-loops",
            with_core_modules(base, &["(module (func $s (loop (br 0))) (start $s))"]),
            Expect::Refused("deadline"),
        ),
        Case::new(
            "start-function-traps",
            with_core_modules(base, &["(module (func $s unreachable) (start $s))"]),
            Expect::Refused("trapped"),
        ),
        Case::new(
            "extra-host-function",
            extra_host_function("exec"),
            Expect::Refused("which the host does not provide"),
        ),
    ]
}

fn personas() -> Vec<Case> {
    let persona = |name: &str, expect: Expect| Case::new(name, misbehave_as(name), expect);
    vec![
        persona("name-escape", Expect::Refused("manifest name")),
        persona("version-huge", Expect::Refused("manifest version")),
        persona("role-huge", Expect::Refused("unknown role")),
        persona("role-unknown", Expect::Refused("unknown role")),
        persona("roles-many", Expect::Refused("roles")),
        persona("roles-none", Expect::Refused("declares no roles")),
        persona("name-blank", Expect::Refused("empty name")),
        persona("manifest-loop", Expect::Refused("deadline")),
        persona("manifest-trap", Expect::Refused("trap")),
        persona("manifest-alloc", Expect::Refused("memory")),
        persona("config-huge", Expect::Refused("default configuration is")),
        persona("config-escape", Expect::Refused("control characters")),
        persona("description-escape", Expect::Works),
        persona("description-huge", Expect::Works),
        persona("configure-loop", Expect::Unusable("deadline")),
        persona("configure-trap", Expect::Unusable("trap")),
        persona("configure-fail", Expect::Unusable("reported")),
        persona("configure-fail-huge", Expect::Unusable("reported")),
        persona("configure-alloc", Expect::Unusable("memory")),
    ]
}

fn modes() -> Vec<Case> {
    let mode = |role: Role, mode: &str, expect: Expect| Case {
        config: Some(format!("mode = {mode}")),
        ..Case::new(
            format!("{}-{mode}", role.as_str()),
            misbehave().to_vec(),
            expect,
        )
    };
    let faults = |role, kind| Expect::Faults { role, kind };
    use Role::{Coordinator, Matcher, Reclaim, Scheduler, Tenant};
    let mut cases = vec![
        mode(Scheduler, "recurse", faults(Scheduler, "trap")),
        mode(Scheduler, "fail-escape", faults(Scheduler, "reported")),
        mode(
            Scheduler,
            "unsupported-huge",
            faults(Scheduler, "unsupported"),
        ),
        mode(Scheduler, "huge", faults(Scheduler, "too-many-decisions")),
        Case {
            hangs: true,
            ..mode(Scheduler, "hang-flap", Expect::Flaps { role: Scheduler })
        },
        mode(Scheduler, "log-escape", Expect::Works),
    ];
    // What every role's call can do.
    for role in [Scheduler, Tenant, Reclaim, Matcher, Coordinator] {
        cases.extend([
            mode(role, "loop", faults(role, "deadline")),
            mode(role, "trap", faults(role, "trap")),
            mode(role, "alloc", faults(role, "memory")),
            mode(role, "fail-huge", faults(role, "reported")),
            // `hang-flap` is the scheduler's alone: a second per hang, and
            // the fault-rate rule it proves is the one every role shares.
            mode(role, "flap", Expect::Flaps { role }),
        ]);
    }
    // Impossible answers, each caught by its role's one check.
    let impossible = [
        (Tenant, "bad-verdict", "bad-answer"),
        (Tenant, "huge", "bad-answer"),
        (Reclaim, "bad-answer", "bad-answer"),
        (Reclaim, "huge", "bad-answer"),
        (Matcher, "bad-answer", "bad-answer"),
        (Matcher, "huge", "bad-answer"),
        (Coordinator, "bad-answer", "bad-answer"),
        (Coordinator, "huge", "too-many-decisions"),
    ];
    cases.extend(impossible.map(|(role, m, kind)| mode(role, m, faults(role, kind))));
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patched_persona_is_a_different_component_of_the_same_size() {
        let plain = misbehave();
        let patched = misbehave_as("configure-loop");
        assert_eq!(plain.len(), patched.len());
        assert_ne!(plain, &patched[..]);
        wasmparser::Validator::new()
            .validate_all(&patched)
            .expect("still a valid component");
    }

    /// Cases that break a limit of the WebAssembly validator as well as the host's: the
    /// host refuses them before wasmtime sees them (its validator runs as it translates,
    /// after the damage).
    const BEYOND_THE_VALIDATOR: [&str; 3] = [
        "bomb-nested-components",
        "bomb-many-components",
        "bomb-type-nesting",
    ];

    #[test]
    fn every_case_is_a_valid_binary_so_only_the_sandbox_refuses_it() {
        for case in corpus() {
            let valid = wasmparser::Validator::new().validate_all(&case.wasm);
            if BEYOND_THE_VALIDATOR.contains(&case.name.as_str()) {
                assert!(valid.is_err(), "{}", case.name);
            } else {
                assert!(valid.is_ok(), "{}: {:?}", case.name, valid.err());
            }
        }
    }

    #[test]
    fn case_names_are_unique() {
        let mut names: Vec<String> = corpus().into_iter().map(|c| c.name).collect();
        let all = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all);
    }
}
