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

/// Arrivals applied as columns (`jobs-added`, how a 0.4 guest takes them)
/// leave the mirror exactly as one `JobAdded` per row does, phase and
/// progress those of a fresh arrival whatever the columns carry; ragged
/// columns are refused and change nothing.
#[test]
fn arrivals_as_columns_equal_arrivals_one_by_one() {
    use arbiter_policy_sdk::model::{JobColumns, JobSpec};
    let specs: Vec<JobSpec> = (0..5u32)
        .map(|i| JobSpec {
            name: i,
            workers: 1 + i % 3,
            gpus_per_worker: 1,
            gpu_milli: 250 * (1 + i % 4),
            estimate_ms: 1_000 * u64::from(i + 1),
            submit_ms: 7 + u64::from(i),
            deadline_ms: u64::from(i) * 3,
            priority: -(i as i32),
            group: i % 2,
            ..JobSpec::default()
        })
        .collect();
    let mut one_by_one = Cluster::new();
    for spec in &specs {
        one_by_one
            .apply_event(&Event::JobAdded(spec.clone()))
            .unwrap();
    }
    let mut columns = JobColumns::default();
    for spec in &specs {
        columns.push_arrival(spec);
    }
    // What the rows say of phase and progress is not an arrival's to set.
    columns.phase[1] = 1;
    columns.started_ms[2] = 99;
    let mut as_columns = Cluster::new();
    as_columns.add_jobs(&columns).unwrap();
    assert_eq!(as_columns.to_snapshot(), one_by_one.to_snapshot());
    for (row, spec) in specs.iter().enumerate() {
        assert_eq!(&columns.arrival(row), spec);
    }

    columns.slo_ms.pop();
    let before = as_columns.to_snapshot();
    assert!(matches!(
        as_columns.add_jobs(&columns),
        Err(MirrorError::Ragged(_))
    ));
    assert_eq!(as_columns.to_snapshot(), before);
}
