//! Issue 15: what bounded compilation costs on the normal path, and what a
//! refused compile bomb costs.
//!
//! For every built-in policy: its code statistics against the default
//! `CompileLimits` (the headroom), the time of the check that runs before
//! compiling (parse + count + compare) and the time of the whole
//! `PolicyEngine::compile` (check, Cranelift, link, describe) with the
//! compiled cache off, so each compile is a real one. The check is the only
//! thing the limits add to a compile, so `check / compile` is the overhead.
//! Then the corpus's compile bombs: the time to refuse each.
//!
//! `cargo bench -p arbiter-host --bench compile_limits`

use arbiter_host::runtime::{CompileLimits, PolicyEngine, RuntimeConfig, inspect_component};
use std::time::{Duration, Instant};

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(f());
                started.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let limits = CompileLimits::default();
    let engine = PolicyEngine::new(RuntimeConfig {
        compiled_cache_bytes: 0,
        ..RuntimeConfig::default()
    })
    .expect("engine");
    println!(
        "{:<24} {:>9} {:>7} {:>9} {:>10} {:>10} {:>8}",
        "policy", "bytes", "funcs", "code B", "check", "compile", "ratio"
    );
    let (mut max_functions, mut max_code) = (0u64, 0u64);
    let (mut max_branches, mut max_calls, mut max_total) = (0u64, 0u64, 0u64);
    let mut max_elements = 0u64;
    let (mut total_check, mut total_compile) = (Duration::ZERO, Duration::ZERO);
    for name in arbiter_policies::names() {
        let wasm = arbiter_policies::get(name).expect("built-in");
        let stats = inspect_component(wasm).expect("inspects").code;
        max_functions = max_functions.max(stats.functions);
        max_code = max_code.max(stats.code_bytes);
        max_branches = max_branches.max(stats.largest_function_branches);
        max_calls = max_calls.max(stats.largest_function_calls);
        max_total = max_total.max(stats.branches);
        max_elements = max_elements.max(stats.element_items);
        let check = time(21, || {
            let inspection = inspect_component(wasm).expect("inspects");
            limits.check(inspection.size_bytes, &inspection.code)
        });
        let compile = time(3, || engine.compile(wasm).expect("compiles"));
        total_check += check;
        total_compile += compile;
        println!(
            "{name:<24} {:>9} {:>7} {:>9} {:>10.2?} {:>10.2?} {:>7.2}%",
            wasm.len(),
            stats.functions,
            stats.code_bytes,
            check,
            compile,
            100.0 * check.as_secs_f64() / compile.as_secs_f64()
        );
    }
    println!(
        "all built-ins: check {total_check:.2?}, compile {total_compile:.2?}: the limits add {:.2}% to compiling them",
        100.0 * total_check.as_secs_f64() / total_compile.as_secs_f64()
    );
    println!("headroom of the default limits over the largest built-in:");
    for (what, largest, limit) in [
        ("functions", max_functions, limits.max_functions),
        ("code bytes", max_code, limits.max_code_bytes),
        (
            "control-flow edges in one function",
            max_branches,
            limits.max_function_branches,
        ),
        (
            "calls in one function",
            max_calls,
            limits.max_function_calls,
        ),
        (
            "control-flow edges in all functions",
            max_total,
            limits.max_branches,
        ),
        (
            "element segments and items",
            max_elements,
            limits.max_element_items,
        ),
    ] {
        println!(
            "  {what:<36} {largest:>9} (limit {limit}, {:.0}×)",
            limit as f64 / largest as f64
        );
    }
    println!("refusing compile bombs (time from bytes to the refusal):");
    for case in arbiter_hostile::corpus() {
        if !case.name.starts_with("bomb-") {
            continue;
        }
        let refused = time(5, || engine.compile(&case.wasm).is_err());
        let outcome = engine
            .compile(&case.wasm)
            .err()
            .map_or_else(|| "ACCEPTED".to_string(), |e| e.to_string());
        println!(
            "  {:<26} {:>9} bytes  {refused:>10.2?}  {}",
            case.name,
            case.wasm.len(),
            outcome.chars().take(90).collect::<String>()
        );
    }
}
