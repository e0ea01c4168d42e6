//! The policy natively: views in, actions out, counters evolved the way a node's would.

use super::*;
use arbiter_policy_sdk::Runtime;

fn workload(id: u32, request: u32, limit: u32) -> WorkloadStatus {
    WorkloadStatus {
        id,
        gpu: 0,
        role: 1,
        compute_share: request,
        request_permille: request,
        limit_permille: limit,
        qos: qos::GUARANTEED,
        ..WorkloadStatus::default()
    }
}

/// A GPU whose workloads launch (or not) each period; a workload launching at its full share
/// waits for the pacer (throttled), one marked light launches without waiting.
struct Node {
    rt: Runtime<ElasticShare>,
    monotonic_ms: u64,
    workloads: Vec<WorkloadStatus>,
    busy: Vec<bool>,
}

impl Node {
    fn new(workloads: Vec<WorkloadStatus>) -> Node {
        let mut rt = Runtime::<ElasticShare>::new();
        rt.configure("").expect("defaults");
        let busy = vec![false; workloads.len()];
        Node {
            rt,
            monotonic_ms: 5_000,
            workloads,
            busy,
        }
    }

    fn period(&mut self) -> Vec<NodeAction> {
        for (w, busy) in self.workloads.iter_mut().zip(&self.busy) {
            if *busy {
                w.launches += 100;
                w.pacing_delay_us += 20_000;
            }
        }
        let view = NodeView {
            now_ms: 1_700_000_000_000 + self.monotonic_ms,
            monotonic_ms: self.monotonic_ms,
            workloads: self.workloads.clone(),
            ..NodeView::default()
        };
        let actions = self.rt.tick(view).expect("tick");
        for a in &actions {
            match *a {
                NodeAction::SetComputeShare(id, s) => {
                    if let Some(w) = self.workloads.iter_mut().find(|w| w.id == id) {
                        w.compute_share = s;
                    }
                }
                other => panic!("only share changes expected, got {other:?}"),
            }
        }
        self.monotonic_ms += 100;
        actions
    }

    fn periods(&mut self, n: usize) {
        for _ in 0..n {
            self.period();
        }
    }

    fn share(&self, id: u32) -> u32 {
        self.workloads
            .iter()
            .find(|w| w.id == id)
            .map(|w| w.compute_share)
            .expect("workload")
    }
}

#[test]
fn request_quarter_limit_half_rises_beside_idle_neighbours_and_keeps_its_request_beside_busy_ones()
{
    let mut n = Node::new(vec![
        workload(1, 250, 500),
        workload(2, 250, 250),
        workload(3, 250, 250),
        workload(4, 250, 250),
    ]);
    n.busy[0] = true;
    n.periods(5);
    assert_eq!(n.share(1), 500, "idle neighbours lend; capped at the limit");
    for id in 2..=4 {
        assert_eq!(n.share(id), 250, "an idle owner keeps its request ready");
    }
    // The neighbours get busy: on the next period the borrower is back at its request.
    n.busy = vec![true; 4];
    n.period();
    assert_eq!(n.share(1), 250);
    n.periods(5);
    assert_eq!((1..=4).map(|id| n.share(id)).collect::<Vec<_>>(), [250; 4]);
    // They go idle again: lent again once they have been quiet for `idle_periods`.
    n.busy = vec![true, false, false, false];
    n.periods(2);
    assert_eq!(n.share(1), 250, "a short pause lends nothing");
    n.periods(2);
    assert_eq!(n.share(1), 500);
}

#[test]
fn a_workload_that_does_not_wait_for_the_pacer_does_not_grow() {
    let mut n = Node::new(vec![workload(1, 250, 1000), workload(2, 250, 250)]);
    // Launching, never delayed.
    for _ in 0..6 {
        n.workloads[0].launches += 10;
        n.period();
    }
    assert_eq!(n.share(1), 250);
}

#[test]
fn whole_gpu_workloads_are_left_alone_and_bounds_hold_for_odd_terms() {
    let mut n = Node::new(vec![
        workload(1, 1000, 1000),
        // A limit below the request counts as the request; a share outside the bounds is
        // brought back on the first period.
        WorkloadStatus {
            compute_share: 900,
            ..workload(2, 300, 100)
        },
    ]);
    let first = n.period();
    assert_eq!(first, [NodeAction::SetComputeShare(2, 300)]);
    n.busy = vec![true, true];
    n.periods(5);
    assert_eq!((n.share(1), n.share(2)), (1000, 300));
    // An idle whole-GPU workload lends like any other owner.
    n.busy = vec![false, true];
    n.workloads[1].limit_permille = 800;
    n.periods(5);
    assert_eq!((n.share(1), n.share(2)), (1000, 800));
}

#[test]
fn configuration_defaults_parse_and_typos_are_refused() {
    assert_eq!(
        config::Config::parse(DEFAULT_CONFIG).expect("default"),
        config::Config::default()
    );
    assert!(config::Config::parse("idle_period = 3").is_err());
    assert!(config::Config::parse("idle_periods = 0").is_err());
    let mut rt = Runtime::<ElasticShare>::new();
    assert!(rt.configure("min_step = 'x'").is_err());
}
