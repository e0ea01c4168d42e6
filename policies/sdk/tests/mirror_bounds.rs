//! Inputs the fuzz targets (`fuzz/`) found, kept as regressions.

use arbiter_policy_sdk::model::{Delta, Event, MAX_NODE_GPUS, NodeSpec};
use arbiter_policy_sdk::{Cluster, MirrorError};

/// `decisions` fuzz target: a node claiming 1.36 billion GPUs made the
/// mirror allocate rows for each until the process ran out of memory.
#[test]
fn a_node_with_more_gpus_than_a_node_can_have_is_refused() {
    let mut cluster = Cluster::new();
    let base_epoch = cluster.epoch();
    let delta = |gpu_count| Delta {
        base_epoch,
        epoch: 1,
        now_ms: 0,
        events: vec![Event::NodeAdded(NodeSpec {
            gpu_count,
            ..NodeSpec::default()
        })],
    };
    let refused = cluster.apply(&delta(1_364_283_729));
    assert!(
        matches!(refused, Err(MirrorError::Inconsistent(_))),
        "{refused:?}"
    );
    assert_eq!(cluster.gpu_count(), 0);
    cluster
        .apply(&delta(MAX_NODE_GPUS))
        .expect("the largest node");
    assert_eq!(cluster.gpu_count(), MAX_NODE_GPUS as usize);
}
