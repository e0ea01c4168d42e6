//! `arbiter serve --fuel`: with fuel metering on, each journaled round records
//! the fuel its policy consumed; a policy past its budget faults "out of fuel"
//! and the fallback schedules; without metering the journal says nothing of fuel.

mod common;

use arbiter_host::runtime::RuntimeConfig;
use arbiter_proto::v1;
use arbiter_serve::journal::{Record, RoundRecord};
use arbiter_serve::plane::{PlaneConfig, default_pool};
use common::*;
use std::time::Duration;

/// Runs one job to completion on a plane metering `fuel` (with a 60 s
/// deadline, so only fuel stops a call here), its `default` slot running
/// `policy` (a fixture and its configuration) after best-fit; returns the
/// journal's rounds and the metrics' text.
async fn rounds_with_fuel(
    fuel: Option<u64>,
    policy: Option<(&str, &str)>,
) -> (Vec<RoundRecord>, String) {
    let dir = tempfile::tempdir().unwrap();
    let running = server_with(
        dir.path(),
        PlaneConfig {
            nodes: default_pool(2, 8),
            default_duration: Duration::from_millis(200),
            runtime: RuntimeConfig {
                fuel,
                deadline: Duration::from_secs(60),
                ..RuntimeConfig::default()
            },
            ..PlaneConfig::default()
        },
    )
    .await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    if let Some((fixture, config)) = policy {
        let wasm = arbiter_policies::fixture(fixture).unwrap();
        load(&mut admin, "default", wasm, config).await;
    }
    let job = submit(&mut admin, spec("metered", 1, 200)).await;
    wait_state(&admin, job, v1::JobState::Succeeded).await;
    let metrics = metrics_text(&mut admin).await;
    running.plane.lock().await.flush_journal().unwrap();
    let journal = arbiter_serve::replay::read(&running.journal_path).unwrap();
    running.shutdown().await.unwrap();
    let rounds = journal
        .records
        .into_iter()
        .filter_map(|r| match r {
            Record::Round(round) => Some(*round),
            _ => None,
        })
        .collect();
    (rounds, metrics)
}

/// Far above any healthy round here (best-fit on 16 GPUs: well under 10⁷),
/// a second or so of a loop.
const BUDGET: u64 = 1 << 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_plane_journals_each_rounds_fuel() {
    let (rounds, metrics) = rounds_with_fuel(Some(BUDGET), None).await;
    // Generation 1 of `default` (best-fit) answered them all; the metric adds
    // up its fuel (it counts rounds the journal may have left out as idle).
    let journaled: u64 = rounds.iter().filter_map(|r| r.fuel).sum();
    let counted: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("arbiter_policy_fuel_total{slot=\"default\",generation=\"1\"} ")
        })
        .unwrap_or_else(|| panic!("no fuel counter: {metrics}"))
        .parse()
        .unwrap();
    assert!(
        counted >= journaled && journaled > 0,
        "{counted} {journaled}"
    );
    let active: Vec<&RoundRecord> = rounds.iter().filter(|r| r.served == "active").collect();
    assert!(!active.is_empty(), "{rounds:?}");
    for round in &active {
        let fuel = round.fuel.expect("an active round's fuel");
        // Syncing a 16-GPU cluster and placing: thousands of instructions at
        // least, far from the budget.
        assert!((1_000..BUDGET / 100).contains(&fuel), "{fuel}");
    }
    assert!(rounds.iter().all(|r| r.faults.is_empty()), "{rounds:?}");
}

/// A policy that never returns runs out of fuel (not time: the deadline is a
/// minute away), and the previous generation schedules the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_past_its_fuel_faults_and_the_fallback_schedules() {
    let (rounds, _) = rounds_with_fuel(Some(BUDGET), Some(("misbehave", "mode = loop"))).await;
    let starved = rounds
        .iter()
        .find(|r| r.faults.iter().any(|f| f.contains("out of fuel")))
        .unwrap_or_else(|| panic!("no round ran out of fuel: {rounds:?}"));
    assert_eq!(starved.served, "fallback");
    // The fuel of the generation that answered: best-fit's.
    assert!(
        starved.fuel.is_some_and(|f| f < BUDGET / 100),
        "{starved:?}"
    );
}

/// A budget too small to load the default policy fails the start, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_too_small_to_load_a_policy_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let refused = arbiter_serve::server::start(serve_config(
        dir.path(),
        PlaneConfig {
            runtime: RuntimeConfig {
                fuel: Some(10),
                ..RuntimeConfig::default()
            },
            ..PlaneConfig::default()
        },
    ))
    .await
    .err()
    .expect("the start must fail");
    assert!(
        format!("{refused:#}").contains("out of fuel"),
        "{refused:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_metering_the_journal_records_no_fuel() {
    let (rounds, metrics) = rounds_with_fuel(None, None).await;
    assert!(rounds.iter().any(|r| r.served == "active"));
    assert!(rounds.iter().all(|r| r.fuel.is_none()), "{rounds:?}");
    assert!(!metrics.contains("arbiter_policy_fuel_total{"), "{metrics}");
}
