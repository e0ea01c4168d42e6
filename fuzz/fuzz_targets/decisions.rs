//! The decision validator (the SDK's `Plan`, which the host's
//! `ClusterState::validate` runs) on arbitrary clusters, deltas and
//! decisions: it never panics, never accepts more than its limit, and what it
//! accepted one by one it accepts again as a whole. The mirror on the way:
//! a cluster built from a snapshot and deltas round-trips through its own
//! snapshot.
#![no_main]

use arbiter_policy_sdk::model::{Decision, Delta, Snapshot};
use arbiter_policy_sdk::{Cluster, Plan};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    snapshot: Option<Snapshot>,
    deltas: Vec<Delta>,
    decisions: Vec<Decision>,
    max_decisions: u8,
}

fuzz_target!(|input: Input| {
    let mut cluster = match input.snapshot {
        Some(s) => match Cluster::from_snapshot(s) {
            Ok(c) => c,
            Err(_) => return,
        },
        None => Cluster::new(),
    };
    for delta in &input.deltas {
        // A mirror that refuses a delta is resynchronised by the host.
        if cluster.apply(delta).is_err() {
            break;
        }
    }
    let snapshot = cluster.to_snapshot();
    let again = Cluster::from_snapshot(snapshot.clone())
        .expect("a mirror's own snapshot is a valid snapshot");
    assert_eq!(again.to_snapshot(), snapshot, "snapshot round trip");

    let limit = u32::from(input.max_decisions);
    let mut plan = Plan::new(&cluster).with_max_decisions(limit);
    let mut kept = Vec::new();
    for d in input.decisions {
        if plan.apply(d.clone()).is_ok() {
            kept.push(d);
        }
    }
    assert!(kept.len() <= limit as usize, "the limit holds");
    for gpu in 0..cluster.gpu_count() as u32 {
        assert!(plan.free_milli(gpu) <= 1000, "GPU {gpu} over-freed");
    }
    let mut replay = Plan::new(&cluster).with_max_decisions(limit);
    for (i, d) in kept.iter().enumerate() {
        if let Err(e) = replay.apply(d.clone()) {
            panic!("decision {i} ({d:?}) was accepted, then refused: {e}");
        }
    }
});
