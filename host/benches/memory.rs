//! Issue 2, target 4: host RSS at PAI scale with 10 loaded generations of
//! `best-fit`, each with its instance synchronised to the PAI snapshot,
//! ≤ 256 MiB; and the cost of one more idle generation.
//!
//! `cargo bench -p arbiter-host --bench memory` (RSS and peak from
//! /proc/self/status; exits non-zero if the target is missed).

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use arbiter_policy_sdk::Runtime;
use common::{MAX_DECISIONS, PaiScenario, describe, rss_kib, verdict};
use policy_best_fit::BestFit;
use std::sync::Arc;
use std::time::Duration;

const GENERATIONS: usize = 10;
const TARGET_MIB: f64 = 256.0;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let mut rows: Vec<(String, u64, u64)> = Vec::new();
    let mut mark = |what: &str| {
        let (rss, hwm) = rss_kib();
        rows.push((what.to_string(), rss, hwm));
        rss
    };
    mark("process start");
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(10),
        ..common::runtime_config()
    })
    .expect("engine");
    let compiled = engine
        .compile(arbiter_policies::get("best-fit").expect("best-fit bytes"))
        .expect("compile");
    mark("engine + best-fit compiled");
    let scenario = PaiScenario::generate();
    let native = RoundDriver::with_native(
        Arc::new(PolicySlot::new("empty")),
        Box::new(Runtime::<BestFit>::new()),
    );
    let (mut state, native) = scenario.ready_round(native);
    drop(native);
    // Close the epoch so the snapshot is exactly at its epoch (no pending events).
    state.begin_round(MAX_DECISIONS);
    let summary = describe(&state);
    let base = mark("PAI state built (host ClusterState only)");
    let snapshot = state.snapshot();
    let slot = Arc::new(PolicySlot::new("best-fit"));
    let mut after_gen = Vec::new();
    for g in 1..=GENERATIONS + 1 {
        let generation = slot
            .load(compiled.clone(), None, None, Some(snapshot.clone()))
            .expect("load generation with snapshot");
        slot.activate(generation.id).expect("activate");
        let rss = mark(&format!(
            "{g} generation(s) loaded, each synchronised to the PAI snapshot"
        ));
        after_gen.push(rss);
    }
    let with_ten = after_gen[GENERATIONS - 1];
    let eleventh = after_gen[GENERATIONS] as i64 - with_ten as i64;
    let per_gen_avg = (with_ten as i64 - base as i64) / GENERATIONS as i64;
    drop(snapshot);
    mark("snapshot copy dropped");

    // For information: every generation serves one PAI round (warm heaps).
    let mut driver = RoundDriver::with_native(slot.clone(), Box::new(Runtime::<BestFit>::new()));
    for generation in slot.generations() {
        slot.activate(generation.id).expect("activate");
        let report = driver.run_round(&mut state);
        assert_eq!(
            report.served,
            Served::Active(generation.id),
            "{:?}",
            report.faults
        );
    }
    mark("after each of the 11 generations served one PAI round");

    println!();
    println!("## memory: {summary}");
    println!();
    println!("| point | VmRSS | VmHWM |");
    println!("|---|---|---|");
    for (what, rss, hwm) in &rows {
        println!("| {what} | {:.1} MiB | {:.1} MiB |", mib(*rss), mib(*hwm));
    }
    println!();
    let ok = mib(with_ten) <= TARGET_MIB;
    println!("| measured | result | target | met |");
    println!("|---|---|---|---|");
    println!(
        "| VmRSS with {GENERATIONS} generations synchronised to the PAI snapshot | {:.1} MiB | ≤ {TARGET_MIB} MiB | {} |",
        mib(with_ten),
        verdict(ok)
    );
    println!(
        "| cost of the 11th idle (synchronised) generation | {:.2} MiB | - | - |",
        eleventh as f64 / 1024.0
    );
    println!(
        "| average per generation (1st..10th) | {:.2} MiB | - | - |",
        per_gen_avg as f64 / 1024.0
    );
    if !ok {
        eprintln!("memory: target missed");
        std::process::exit(1);
    }
}
