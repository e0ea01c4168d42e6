//! A long-lived host's string table stays bounded by its live state.
//!
//! Many rounds of job churn through `RoundDriver` with the real `best-fit`
//! component: every job brings a new name, so without compaction the table
//! (and every snapshot and resync) would grow with every job ever submitted.
//! The state compacts at resync epochs; the Wasm mirror resyncs there and its
//! decisions stay valid; hot swaps (with a fresh snapshot, or one from
//! before the history or a compaction) keep being served.

use arbiter_host::registry::PolicySlot;
use arbiter_host::roles::scheduler::{RoundDriver, Served};
use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use arbiter_host::state::{ClusterState, DEFAULT_COMPACTION_FLOOR, JobRequest, NodeRequest};
use arbiter_policy_sdk::Cluster;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

const NODES: usize = 16;
const ROUNDS: u64 = 2_500;
const ARRIVALS: usize = 3;

fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    for i in 0..NODES {
        s.add_node(NodeRequest::gpus(
            format!("node-{i:02}"),
            "gpu",
            "A100",
            81_920,
            8,
        ))
        .unwrap();
    }
    s
}

#[test]
fn churn_through_a_wasm_policy_keeps_the_string_table_bounded() {
    // Every one of the rounds below must be served without a fault: a deadline no stall of
    // a loaded machine reaches (the default 250 ms is the production bound, not this test's).
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: std::time::Duration::from_secs(30),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let compiled = engine
        .compile(arbiter_policies::get("best-fit").unwrap())
        .unwrap();
    let slot = Arc::new(PolicySlot::new("best-fit"));
    let mut active = slot.swap(compiled.clone(), None, None, None).unwrap().id;
    let mut driver = RoundDriver::new(slot.clone());
    let mut state = cluster();
    let feed = state.delta_feed();
    // An independent mirror following the state the way a guest does.
    let mut mirror = Cluster::from_snapshot(state.snapshot()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut submitted, mut started, mut mirror_resyncs) = (0usize, 0usize, 0u64);
    let mut max_total = 0usize;
    let mut old_snapshot = None;
    let mut last_epoch = state.epoch();
    for round in 0..ROUNDS {
        state.set_now(round * 100);
        // Arrivals, each with a new name, from a handful of tenants.
        for _ in 0..ARRIVALS {
            let mut job = JobRequest::gpus(
                format!("job-{submitted}"),
                format!("tenant-{}", rng.random_range(0..5)),
                1,
                rng.random_range(1..=2),
            );
            job.estimate_ms = 1_000;
            state.submit(job).unwrap();
            submitted += 1;
        }
        // Completions: jobs that ran a while, plus a few pending ones cancelled.
        let done: Vec<_> = state
            .records()
            .iter()
            .filter(|r| match r.last_start_ms {
                Some(t) => t + rng.random_range(500..3_000) <= round * 100,
                None => r.submit_ms + 5_000 <= round * 100,
            })
            .map(|r| r.id)
            .collect();
        for id in done {
            state.remove(id).unwrap();
        }
        // Hot swaps: from a fresh snapshot (caught up through the feed), and
        // from one taken 100 to 300 rounds earlier, past the delta history
        // and sometimes a compaction (the first round resyncs it).
        if round % 300 == 150 {
            old_snapshot = Some(state.snapshot());
        }
        if round % 500 == 499 {
            let g = slot
                .swap_with_feed(compiled.clone(), None, None, Some(state.snapshot()), &feed)
                .unwrap();
            active = g.id;
        } else if round % 500 == 249
            && let Some(snapshot) = old_snapshot.take()
        {
            active = slot
                .swap_with_feed(compiled.clone(), None, None, Some(snapshot), &feed)
                .unwrap()
                .id;
        }

        let report = driver.run_round(&mut state);
        assert_eq!(report.served, Served::Active(active), "round {round}");
        assert!(
            report.faults.is_empty(),
            "round {round}: {:?}",
            report.faults
        );
        assert!(report.epoch > last_epoch);
        last_epoch = report.epoch;
        started += report.applied.started.len();

        // The round's decisions are pending: a check seals them first.
        let check = round % 100 == 0;
        if check {
            state.seal();
        }
        match state.delta_since(mirror.epoch()) {
            Some(delta) => mirror.apply(&delta).unwrap(),
            None => {
                mirror_resyncs += 1;
                mirror = Cluster::from_snapshot(state.snapshot()).unwrap();
            }
        }
        if check {
            assert_eq!(Some(mirror.to_snapshot()), state.snapshot_at_epoch());
        }

        let stats = state.string_stats();
        max_total = max_total.max(stats.total);
        // Dead strings stay below max(live, floor), plus this round's arrivals
        // (two strings each at most).
        assert!(
            stats.total <= 2 * stats.live.max(DEFAULT_COMPACTION_FLOOR) + 2 * ARRIVALS,
            "round {round}: {stats:?}"
        );
    }

    let stats = state.string_stats();
    let live_jobs = state.cluster().job_count();
    println!(
        "{submitted} jobs submitted, {started} started, {live_jobs} live; strings {stats:?}, at most {max_total}; mirror resyncs {mirror_resyncs}"
    );
    assert!(
        started * 10 >= submitted * 8,
        "{started} of {submitted} jobs started"
    );
    assert!(stats.compactions >= 4, "{stats:?}");
    assert_eq!(
        mirror_resyncs, stats.compactions,
        "resyncs happen at compactions only"
    );
    assert!(
        max_total < submitted / 2,
        "{max_total} strings for {submitted} jobs"
    );
    // The host's names still match the renumbered columns.
    for r in state.records() {
        let j = state.cluster().job(state.job_index(r.id).unwrap());
        assert_eq!((j.name(), j.tenant()), (r.name.as_str(), r.tenant.as_str()));
    }
    assert_eq!(stats.live, {
        let c = state.cluster();
        let mut ids: std::collections::BTreeSet<u32> = c.gpu_models().iter().copied().collect();
        ids.extend(&c.node_columns().name);
        ids.extend(&c.node_columns().pool);
        ids.extend(&c.gpu_columns().model);
        ids.extend(&c.job_columns().name);
        ids.extend(&c.job_columns().tenant);
        ids.extend(&c.node_columns().fabric);
        ids.extend(&c.job_columns().group);
        ids.extend(&c.tenant_columns().name);
        ids.len()
    });
}
