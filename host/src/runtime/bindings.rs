//! Host-side bindings of the contract versions the host serves, and their
//! conversions to the SDK model.
//!
//! * [`v0_4`]: the current contract, `wit/policy.wit`. The SDK model mirrors
//!   it field for field, except the two per-job streams 0.4 sends as
//!   columns: a delta's arrivals are lowered into `jobs-added`, and a
//!   `place-batch` decision is lifted into one `Place` per job (checked: a
//!   malformed batch is the policy's fault, not a panic).
//! * [`v0_3`]: the previous minor, frozen in `wit/v0.3/policy.wit`: the
//!   model's own shape for those streams, so its adapter only moves fields.

/// `arbiter:policy@0.4.0`.
pub mod v0_4 {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy",
    });

    pub use arbiter::policy::types as wit;
    #[cfg(test)]
    pub(super) use conversions::{
        apply_events as apply_events_for_tests, lower_decisions as lower_decisions_for_tests,
    };
    pub use conversions::{lift_decisions, lift_reclaim_plan, lower_delta};
    pub use exports::arbiter::policy as roles;

    mod conversions {
        use super::wit;
        arbiter_policy_sdk::wit_conversions!();
    }
}

/// `arbiter:policy@0.3.0`, served through the adapter: the model is 0.3's
/// shape (one `job-added` per arrival, `place` decisions), so its
/// conversions move fields and never reshape.
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.3",
        world: "policy",
    });

    pub use arbiter::policy::types as wit;
    pub use conversions::{lift_decisions, lift_reclaim_plan, lower_delta};
    pub use exports::arbiter::policy as roles;

    mod conversions {
        use super::wit;
        arbiter_policy_sdk::wit_conversions_v0_3!();
    }
}

#[cfg(test)]
mod tests {
    use super::v0_4::{self, wit};
    use arbiter_policy_sdk::model::{self, Decision, Event, JobSpec, WorkerPlacement};
    use arbiter_policy_sdk::{Cluster, MirrorError};
    use proptest::prelude::*;

    fn spec(name: u32, workers: u32) -> JobSpec {
        JobSpec {
            name,
            workers,
            gpus_per_worker: 1,
            gpu_milli: 1000,
            estimate_ms: 60_000,
            submit_ms: 5,
            ..JobSpec::default()
        }
    }

    fn worker(node: u32, gpus: &[u32]) -> WorkerPlacement {
        WorkerPlacement {
            node,
            gpus: gpus.to_vec(),
        }
    }

    /// Each run of arrivals crosses as one `jobs-added` (the order of
    /// events kept: a removal between arrivals splits the run), carrying
    /// what a snapshot would show, and a mirror that takes the columns as
    /// they came ends where one that took the host's events one by one does.
    #[test]
    fn arrivals_cross_as_columns_and_come_back_as_they_were() {
        let delta = model::Delta {
            base_epoch: 0,
            epoch: 4,
            now_ms: 9,
            events: vec![
                Event::StringsAdded(vec!["a".into(), "b".into()]),
                Event::JobAdded(spec(1, 2)),
                Event::JobAdded(spec(2, 1)),
                Event::JobRemoved(0),
                Event::JobAdded(spec(1, 4)),
            ],
        };
        let lowered = v0_4::lower_delta(delta.clone());
        assert_eq!(lowered.events.len(), 4);
        match &lowered.events[1] {
            wit::Event::JobsAdded(columns) => {
                assert_eq!(columns.name, vec![1, 2]);
                assert_eq!(columns.workers, vec![2, 1]);
                assert_eq!(columns.phase, vec![model::job_phase::PENDING; 2]);
                assert_eq!(columns.remaining_ms, vec![60_000; 2]);
                assert_eq!(columns.reported_ms, vec![5; 2]);
            }
            other => panic!("expected jobs-added, got {other:?}"),
        }
        assert!(matches!(lowered.events[2], wit::Event::JobRemoved(0)));
        assert!(matches!(&lowered.events[3], wit::Event::JobsAdded(c) if c.name == vec![1]));
        let mut by_model = Cluster::new();
        by_model.apply(&delta).unwrap();
        let mut by_columns = Cluster::new();
        super::v0_4::apply_events_for_tests(&mut by_columns, lowered.events).unwrap();
        by_columns.set_epoch(delta.epoch, delta.now_ms);
        assert_eq!(by_columns.to_snapshot(), by_model.to_snapshot());
    }

    /// A ragged `jobs-added` is refused, not read past its end.
    #[test]
    fn ragged_arrival_columns_are_an_error() {
        let mut lowered = v0_4::lower_delta(model::Delta {
            events: vec![Event::JobAdded(spec(1, 1)), Event::JobAdded(spec(2, 1))],
            ..model::Delta::default()
        });
        if let wit::Event::JobsAdded(c) = &mut lowered.events[0] {
            c.workers.pop();
        }
        let refused = super::v0_4::apply_events_for_tests(&mut Cluster::new(), lowered.events);
        assert!(
            matches!(refused, Err(MirrorError::Ragged(_))),
            "{refused:?}"
        );
    }

    /// A guest's run of two or more `place` crosses as one `place-batch`;
    /// the host lifts it back into the same decisions, in order.
    #[test]
    fn a_run_of_places_crosses_as_one_batch() {
        let decisions = vec![
            Decision::Place(4, vec![worker(0, &[0, 1]), worker(1, &[8])]),
            Decision::Place(2, vec![worker(1, &[9])]),
            Decision::Preempt(7),
            Decision::Place(5, vec![worker(2, &[])]),
            Decision::Place(6, vec![worker(2, &[16]), worker(2, &[17])]),
            Decision::Migrate(1, vec![worker(3, &[24])]),
            Decision::Place(3, vec![worker(3, &[25])]),
        ];
        let lowered = super::v0_4::lower_decisions_for_tests(decisions.clone());
        assert_eq!(lowered.len(), 5);
        match &lowered[0] {
            wit::Decision::PlaceBatch(c) => {
                assert_eq!(c.job, vec![4, 4, 2]);
                assert_eq!(c.gpus, vec![0, 1, 8, 9]);
            }
            other => panic!("expected place-batch, got {other:?}"),
        }
        assert!(matches!(lowered[2], wit::Decision::PlaceBatch(_)));
        assert!(
            matches!(lowered[4], wit::Decision::Place(_)),
            "a run of one stays a place"
        );
        assert_eq!(v0_4::lift_decisions(lowered), Ok(decisions));
    }

    /// What a batch's rows cannot say goes as plain `place`s, so a list
    /// comes back as the policy wrote it: one job placed twice in a row
    /// (rows naming one job read back as one `place`, which would turn a
    /// decision the validator refuses into a larger one it may accept) and
    /// a `place` with no workers (no row to carry it).
    #[test]
    fn places_a_batch_cannot_say_go_as_they_are() {
        let decisions = vec![
            Decision::Place(4, vec![worker(0, &[0])]),
            Decision::Place(4, vec![worker(1, &[8])]),
            Decision::Place(5, vec![worker(1, &[9])]),
            Decision::Place(6, vec![]),
            Decision::Place(7, vec![worker(2, &[16])]),
            Decision::Place(7, vec![worker(2, &[17])]),
        ];
        let lowered = super::v0_4::lower_decisions_for_tests(decisions.clone());
        assert!(matches!(lowered[0], wit::Decision::Place(_)));
        assert!(
            matches!(&lowered[1], wit::Decision::PlaceBatch(c) if c.job == vec![4, 5]),
            "{:?}",
            lowered[1]
        );
        assert_eq!(lowered.len(), 5, "{lowered:?}");
        assert_eq!(v0_4::lift_decisions(lowered), Ok(decisions));
    }

    fn arb_workers() -> impl Strategy<Value = Vec<WorkerPlacement>> {
        prop::collection::vec(
            (0u32..3, prop::collection::vec(0u32..6, 0..3))
                .prop_map(|(node, gpus)| WorkerPlacement { node, gpus }),
            0..3,
        )
    }

    fn arb_decision() -> impl Strategy<Value = Decision> {
        // Few job ids, so the same job often comes twice in a row.
        prop_oneof![
            4 => (0u32..3, arb_workers()).prop_map(|(j, w)| Decision::Place(j, w)),
            1 => (0u32..3).prop_map(Decision::Preempt),
            1 => (0u32..3, arb_workers()).prop_map(|(j, w)| Decision::Migrate(j, w)),
            1 => (0u32..3, prop::collection::vec(0u32..6, 0..3))
                .prop_map(|(j, g)| Decision::ReserveGpus(j, g)),
        ]
    }

    proptest! {
        /// Whatever a policy decides crosses the 0.4 boundary unchanged:
        /// the host lifts exactly the list the SDK lowered.
        #[test]
        fn any_decision_list_crosses_unchanged(decisions in prop::collection::vec(arb_decision(), 0..12)) {
            let lowered = super::v0_4::lower_decisions_for_tests(decisions.clone());
            prop_assert_eq!(v0_4::lift_decisions(lowered), Ok(decisions));
        }
    }

    /// A worker wider than a row can say (255 GPUs) is not batched.
    #[test]
    fn a_worker_too_wide_for_a_row_goes_as_its_own_places() {
        let wide: Vec<u32> = (0..300).collect();
        let decisions = vec![
            Decision::Place(0, vec![worker(0, &wide)]),
            Decision::Place(1, vec![worker(1, &[400])]),
        ];
        let lowered = super::v0_4::lower_decisions_for_tests(decisions.clone());
        assert!(lowered.iter().all(|d| matches!(d, wit::Decision::Place(_))));
        assert_eq!(v0_4::lift_decisions(lowered), Ok(decisions));
    }

    /// A hostile guest's malformed batch is an error for the round to
    /// report, never an index out of bounds in the host.
    #[test]
    fn a_malformed_batch_is_refused() {
        let batch = |job: Vec<u32>, gpu_start: Vec<u32>, gpu_len: Vec<u8>, gpus: Vec<u32>| {
            vec![wit::Decision::PlaceBatch(wit::PlacementColumns {
                node: vec![0; job.len()],
                job,
                gpu_start,
                gpu_len,
                gpus,
            })]
        };
        let beyond = v0_4::lift_decisions(batch(vec![0], vec![0], vec![255], vec![1]));
        assert!(beyond.unwrap_err().contains("names GPUs"));
        let far = v0_4::lift_decisions(batch(vec![0], vec![u32::MAX], vec![255], vec![1]));
        assert!(far.unwrap_err().contains("must tile"));
        // Rows naming one range over and over: a few bytes each in the
        // guest, 255 GPUs each in the host if they were read.
        let rows = 1_000;
        let aliased = v0_4::lift_decisions(batch(
            (0..rows).collect(),
            vec![0; rows as usize],
            vec![255; rows as usize],
            (0..255).collect(),
        ));
        assert!(
            aliased
                .unwrap_err()
                .contains("row 1 starts at GPU 0, not 255")
        );
        let left_over = v0_4::lift_decisions(batch(vec![0], vec![0], vec![1], vec![1, 2]));
        assert!(left_over.unwrap_err().contains("name 1 GPUs of the 2"));
        let ragged = v0_4::lift_decisions(batch(vec![0, 1], vec![0], vec![1], vec![1]));
        assert!(ragged.unwrap_err().contains("different lengths"));
        let empty = v0_4::lift_decisions(batch(vec![], vec![], vec![], vec![]));
        assert_eq!(empty, Ok(vec![]));
    }
}
