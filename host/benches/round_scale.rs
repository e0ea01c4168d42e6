//! How a scheduling round grows with the cluster: PAI's cluster and job
//! counts at 1×, 2×, 5× and 10× (18,970 nodes / 67,420 GPUs, 50,000 running
//! and 10,000 pending jobs at 10×), `best-fit` as Wasm against the same
//! crate compiled natively, through the same `RoundDriver` path.
//!
//! `cargo bench -p arbiter-host --bench round_scale` (`-- --scales 1,10`
//! picks scales, `-- --pairs N` the interleaved Wasm/native pairs per scale).
//! Targets (issue 13): the round linear or better from 1× to 10×, host RSS
//! ≤ 1 GiB at 10×. The table splits the round into the policy call (sync,
//! `schedule`, validation) and the host's own part around it (sealing the
//! epoch and building the delta, applying the decisions): best-fit scans
//! every node for every pending job, so its `schedule` is O(pending × nodes)
//! by design and grows ~100× from 1× to 10× — natively as in Wasm. The
//! linearity target is judged on the host's own part; the whole round's
//! growth is reported beside it.
//!
//! `-- --fuel` adds a third round to each pair, `best-fit` compiled by an
//! engine that meters fuel (`arbiter serve --fuel`, `arbiter sim --fuel`), and
//! a table of what metering costs: the metered round against the unmetered
//! Wasm round of the same pairs, and the fuel one round consumed.

mod common;

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::{RoundDriver, RoundReport, Served};
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine, RuntimeConfig};
use arbiter_host::state::ClusterState;
use arbiter_policy_sdk::Runtime;
use common::{PaiScenario, arg, describe, median_ms, rss_kib, verdict};
use policy_best_fit::BestFit;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn wasm_driver(compiled: &CompiledPolicy) -> RoundDriver {
    let slot = Arc::new(PolicySlot::new("best-fit"));
    slot.swap(compiled.clone(), None, None, None)
        .expect("load best-fit");
    RoundDriver::with_native(slot, Box::new(Runtime::<BestFit>::new()))
}

/// The measured round, never inlined so that a profiler can select it by
/// name (`valgrind --tool=callgrind --collect-atstart=no
/// --toggle-collect='*measured_round*'`: instructions and simulated cache
/// misses of the measured rounds alone, not of the scenario's generation or
/// its warm-up round).
#[inline(never)]
fn measured_round(driver: &mut RoundDriver, state: &mut ClusterState) -> RoundReport {
    driver.run_round(state)
}

fn native_driver() -> RoundDriver {
    RoundDriver::with_native(
        Arc::new(PolicySlot::new("empty")),
        Box::new(Runtime::<BestFit>::new()),
    )
}

struct Point {
    scale: usize,
    described: String,
    wasm_ms: f64,
    native_ms: f64,
    /// The Wasm round outside the policy call.
    host_ms: f64,
    placed: usize,
    rss_mib: f64,
    /// The Wasm round with fuel metering (`--fuel`).
    metered_ms: f64,
    /// Fuel the metered round consumed.
    fuel: u64,
}

fn main() {
    let scales: Vec<usize> = arg("--scales")
        .unwrap_or_else(|| "1,2,5,10".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let pairs: usize = arg("--pairs").and_then(|s| s.parse().ok()).unwrap_or(5);
    // `--native-only`: the native rounds alone (the host part is then the
    // native round's), for a profiler that should not see a Wasm engine.
    let native_only = std::env::args().any(|a| a == "--native-only");
    // Not made for `--native-only`: the engine reserves its pooling
    // allocator's address space up front, which valgrind refuses.
    let compile = |fuel: Option<u64>| {
        let engine = PolicyEngine::new(RuntimeConfig {
            deadline: Duration::from_secs(60),
            fuel,
            ..common::runtime_config()
        })
        .expect("engine");
        engine
            .compile(arbiter_policies::get("best-fit").expect("best-fit bytes"))
            .expect("compile")
    };
    let compiled = (!native_only).then(|| compile(None));
    // A budget no round comes near: the cost measured is the metering's.
    let metered =
        (!native_only && std::env::args().any(|a| a == "--fuel")).then(|| compile(Some(1 << 50)));
    let mut points = Vec::new();
    for &scale in &scales {
        let t = Instant::now();
        let scenario = PaiScenario::generate_scaled(scale);
        println!(
            "scale {scale}×: scenario generated in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let (mut w, mut n, mut h) = (Vec::new(), Vec::new(), Vec::new());
        let (mut m, mut fuel) = (Vec::new(), 0);
        let mut placed = 0;
        let mut described = String::new();
        let mut rss_mib: f64 = 0.0;
        for _ in 0..pairs.max(1) {
            if let Some(compiled) = &compiled {
                let (mut state, mut driver) = scenario.ready_round(wasm_driver(compiled));
                let t = Instant::now();
                let r = measured_round(&mut driver, &mut state);
                w.push(t.elapsed());
                h.push(r.latency.saturating_sub(r.policy_time));
                assert!(matches!(r.served, Served::Active(_)), "{:?}", r.faults);
                placed = r.decisions.len();
                // Live state and the Wasm mirror of the measured round.
                rss_mib = rss_mib.max(rss_kib().0 as f64 / 1024.0);
                drop((state, driver, r));
            }
            if let Some(metered) = &metered {
                let (mut state, mut driver) = scenario.ready_round(wasm_driver(metered));
                let t = Instant::now();
                let r = measured_round(&mut driver, &mut state);
                m.push(t.elapsed());
                assert!(matches!(r.served, Served::Active(_)), "{:?}", r.faults);
                assert_eq!(r.decisions.len(), placed, "same answer metered");
                fuel = r.fuel.expect("a metering engine reports fuel");
            }
            let (mut state, mut driver) = scenario.ready_round(native_driver());
            described = describe(&state);
            let t = Instant::now();
            let r = measured_round(&mut driver, &mut state);
            n.push(t.elapsed());
            assert_eq!(r.served, Served::Native);
            if native_only {
                placed = r.decisions.len();
                h.push(r.latency.saturating_sub(r.policy_time));
                rss_mib = rss_mib.max(rss_kib().0 as f64 / 1024.0);
            }
            assert_eq!(r.decisions.len(), placed, "same answer natively");
        }
        points.push(Point {
            scale,
            described,
            wasm_ms: if w.is_empty() {
                f64::NAN
            } else {
                median_ms(&mut w)
            },
            native_ms: median_ms(&mut n),
            host_ms: median_ms(&mut h),
            placed,
            rss_mib,
            metered_ms: if m.is_empty() {
                f64::NAN
            } else {
                median_ms(&mut m)
            },
            fuel,
        });
    }
    let (_, hwm) = rss_kib();
    println!();
    println!("## round_scale (medians of {pairs} interleaved Wasm/native rounds per scale)");
    println!();
    println!(
        "| scale | state | placed | Wasm round | native round | ratio | Wasm / 1× | native / 1× | host part ({} round) | host part / 1× | VmRSS |",
        if native_only { "native" } else { "Wasm" }
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let base = points.iter().find(|p| p.scale == 1);
    let growth = |now: f64, at1: Option<f64>| match at1 {
        Some(b) if b > 0.0 => now / b,
        _ => f64::NAN,
    };
    let mut linear = true;
    for p in &points {
        let host_growth = growth(p.host_ms, base.map(|b| b.host_ms));
        if host_growth > p.scale as f64 {
            linear = false;
        }
        println!(
            "| {}× | {} | {} | {:.1} ms | {:.1} ms | {:.2}× | {:.1}× | {:.1}× | {:.2} ms | {:.1}× | {:.0} MiB |",
            p.scale,
            p.described,
            p.placed,
            p.wasm_ms,
            p.native_ms,
            p.wasm_ms / p.native_ms,
            growth(p.wasm_ms, base.map(|b| b.wasm_ms)),
            growth(p.native_ms, base.map(|b| b.native_ms)),
            p.host_ms,
            host_growth,
            p.rss_mib
        );
    }
    if metered.is_some() {
        println!();
        println!("## fuel metering (the same pairs: a metered Wasm round beside each)");
        println!();
        println!("| scale | Wasm round | metered round | metered / Wasm | fuel per round |");
        println!("|---|---|---|---|---|");
        for p in &points {
            println!(
                "| {}× | {:.1} ms | {:.1} ms | {:.2}× | {:.1} M |",
                p.scale,
                p.wasm_ms,
                p.metered_ms,
                p.metered_ms / p.wasm_ms,
                p.fuel as f64 / 1e6
            );
        }
    }
    let peak_mib = hwm as f64 / 1024.0;
    println!();
    println!(
        "peak RSS (VmHWM) {peak_mib:.0} MiB (target ≤ 1024 MiB): {}; host part linear or better: {}",
        verdict(peak_mib <= 1024.0),
        if base.is_some() {
            verdict(linear)
        } else {
            "- (no 1× point)"
        }
    );
    if peak_mib > 1024.0 || !linear {
        eprintln!("round_scale: a target was missed");
        std::process::exit(1);
    }
}
