use super::*;
use arbiter_policy_sdk::model::WorkerPlacement;

fn node(name: &str, gpus: u32) -> NodeRequest {
    NodeRequest {
        name: name.into(),
        pool: "default".into(),
        cpu_milli: 64_000,
        memory_mib: 512_000,
        gpu_model: "V100".into(),
        gpu_memory_mib: 32_768,
        gpu_count: gpus,
        on_loan: false,
    }
}

#[test]
fn deltas_replayed_on_a_mirror_reproduce_the_host_state() {
    let mut s = ClusterState::new();
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    s.add_node(node("a", 4)).unwrap();
    let j1 = s.submit(JobRequest::gpus("j1", "t", 1, 2)).unwrap();
    let j2 = s.submit(JobRequest::gpus("j2", "t", 1, 1)).unwrap();
    let (delta, _) = s.begin_round(10);
    mirror.apply(&delta).unwrap();
    let decisions = vec![Decision::Place(
        0,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0, 1],
        }],
    )];
    s.validate(&decisions, 10).unwrap();
    s.apply(decisions).unwrap();
    s.remove(j2).unwrap();
    let (delta, _) = s.begin_round(10);
    mirror.apply(&delta).unwrap();
    assert_eq!(mirror.to_snapshot(), s.snapshot());
    assert_eq!(s.record(j1).unwrap().first_start_ms, Some(0));
    assert!((s.gpu_allocation_pct() - 50.0).abs() < 1e-9);
}

#[test]
fn delta_since_merges_history_and_gives_up_past_it() {
    let mut s = ClusterState::new();
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    for i in 0..3 {
        s.add_node(node(&format!("n{i}"), 1)).unwrap();
        s.begin_round(1);
    }
    let d = s.delta_since(0).unwrap();
    mirror.apply(&d).unwrap();
    assert_eq!(mirror.to_snapshot(), s.snapshot());
    for _ in 0..DELTA_HISTORY {
        s.begin_round(1);
    }
    assert!(s.delta_since(0).is_none());
}

/// An epoch's new names cross in one `strings-added` event, ahead of the
/// first event naming them, in the order they were interned; a mirror
/// that applies the delta ends where the host is.
#[test]
fn an_epochs_new_strings_travel_in_one_event() {
    let mut s = ClusterState::new();
    s.add_node(node("a", 4)).unwrap();
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    let before = s.cluster().strings().len();
    for (name, tenant) in [("j1", "team-a"), ("j2", "team-b"), ("j3", "team-a")] {
        s.submit(JobRequest::gpus(name, tenant, 1, 1)).unwrap();
    }
    let (delta, _) = s.begin_round(10);
    let added: Vec<&Vec<String>> = delta
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StringsAdded(strings) => Some(strings),
            _ => None,
        })
        .collect();
    assert_eq!(added.len(), 1, "{:?}", delta.events);
    assert!(matches!(delta.events[0], Event::StringsAdded(_)));
    assert_eq!(added[0][..], s.cluster().strings()[before..]);
    mirror.apply(&delta).unwrap();
    assert_eq!(mirror.to_snapshot(), s.snapshot());
    // The next epoch opens its own event.
    s.submit(JobRequest::gpus("j4", "team-c", 1, 1)).unwrap();
    let (delta, _) = s.begin_round(10);
    assert!(matches!(&delta.events[0], Event::StringsAdded(v) if v.len() == 2));
    mirror.apply(&delta).unwrap();
    assert_eq!(mirror.to_snapshot(), s.snapshot());
}

#[test]
fn snapshot_between_rounds_does_not_replay_pending_changes() {
    let mut s = ClusterState::new();
    s.add_node(node("a", 2)).unwrap();
    // A mirror loaded between rounds, then caught up by the next round's delta.
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    assert!(s.snapshot_at_epoch().is_some());
    s.submit(JobRequest::gpus("j", "t", 1, 1)).unwrap();
    assert!(s.snapshot_at_epoch().is_none());
    let (delta, _) = s.begin_round(10);
    mirror.apply(&delta).unwrap();
    assert_eq!(mirror.node_count(), 1);
    assert_eq!(mirror.to_snapshot(), s.snapshot());
}

#[test]
fn invalid_requests_are_refused_with_reasons() {
    let mut s = ClusterState::new();
    s.add_node(node("a", 1)).unwrap();
    assert_eq!(
        s.add_node(node("a", 1)),
        Err(StateError::DuplicateNode("a".into()))
    );
    // One node cannot claim a billion GPUs (the mirror refuses it too).
    assert!(matches!(
        s.add_node(node("huge", model::MAX_NODE_GPUS + 1)),
        Err(StateError::InvalidNode(_))
    ));
    let mut bad = JobRequest::gpus("x", "t", 1, 2);
    bad.gpu_milli = 500;
    assert!(matches!(s.submit(bad), Err(StateError::InvalidJob(_))));
    let mut unknown = JobRequest::gpus("y", "t", 1, 1);
    unknown.gpu_models = vec!["H100".into()];
    assert_eq!(
        s.submit(unknown),
        Err(StateError::UnknownGpuModel("H100".into()))
    );
    assert!(matches!(
        s.submit(JobRequest::gpus("z", "t", 0, 1)),
        Err(StateError::InvalidJob(_))
    ));
}

#[test]
fn quota_is_enforced_by_validation() {
    let mut s = ClusterState::new();
    s.add_node(node("a", 4)).unwrap();
    s.submit(JobRequest::gpus("j", "team", 1, 3)).unwrap();
    s.set_tenant_quota("team", Some(2)).unwrap();
    s.begin_round(10);
    let d = vec![Decision::Place(
        0,
        vec![WorkerPlacement {
            node: 0,
            gpus: vec![0, 1, 2],
        }],
    )];
    assert!(matches!(
        s.validate(&d, 10),
        Err((0, DecisionError::QuotaExceeded { .. }))
    ));
}

/// The quota charged to a tenant follows every decision of the round:
/// a migration keeps it, a preemption frees it, both for later
/// decisions of the same round.
#[test]
fn quota_follows_migrations_and_preemptions_within_a_round() {
    let w = |node: u32, gpus: Vec<u32>| vec![WorkerPlacement { node, gpus }];
    let mut s = ClusterState::new();
    s.add_node(node("a", 4)).unwrap();
    s.add_node(node("b", 4)).unwrap();
    s.set_tenant_quota("team", Some(2)).unwrap();
    for name in ["running", "next", "third"] {
        s.submit(JobRequest::gpus(name, "team", 1, 1)).unwrap();
    }
    s.begin_round(10);
    let start = vec![Decision::Place(0, w(0, vec![0]))];
    s.validate(&start, 10).unwrap();
    s.apply(start).unwrap();
    s.begin_round(10);
    // Moving the running job does not charge it twice.
    let moved_then_placed = vec![
        Decision::Migrate(0, w(1, vec![4])),
        Decision::Place(1, w(0, vec![0])),
    ];
    assert_eq!(s.validate(&moved_then_placed, 10), Ok(()));
    // Two more would be three GPUs: the second is refused.
    let over = vec![
        Decision::Place(1, w(0, vec![1])),
        Decision::Place(2, w(0, vec![2])),
    ];
    assert!(matches!(
        s.validate(&over, 10),
        Err((1, DecisionError::QuotaExceeded { .. }))
    ));
    // A preemption frees its share for the same round.
    let swapped = vec![
        Decision::Preempt(0),
        Decision::Place(1, w(0, vec![1])),
        Decision::Place(2, w(0, vec![2])),
    ];
    assert_eq!(s.validate(&swapped, 10), Ok(()));
}

// ---- string-table compaction ----

fn gpu_node(name: &str, pool: &str, model: &str, gpus: u32) -> NodeRequest {
    NodeRequest {
        name: name.into(),
        pool: pool.into(),
        gpu_model: model.into(),
        ..node(name, gpus)
    }
}

/// Distinct string ids the columns refer to, found by a full scan (what
/// the incremental reference counts must agree with).
fn live_by_scan(s: &ClusterState) -> usize {
    let c = s.cluster();
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
}

/// A job as names and indices: name, tenant, phase, model mask,
/// placement, reserved nodes.
type JobView = (String, String, u8, u64, Vec<WorkerPlacement>, Vec<u32>);

/// Everything a string id stands for, as strings, plus what refers to indices.
#[derive(Debug, PartialEq)]
struct View {
    nodes: Vec<(String, String, Option<u32>)>,
    gpu_models: Vec<String>,
    gpus: Vec<(u32, String, u8, u8)>,
    jobs: Vec<JobView>,
}

fn view(s: &ClusterState) -> View {
    let c = s.cluster();
    View {
        nodes: c
            .nodes()
            .map(|n| (n.name().into(), n.pool().into(), c.reserved_by(n.index())))
            .collect(),
        gpu_models: c
            .gpu_models()
            .iter()
            .map(|&m| c.string(m).to_string())
            .collect(),
        gpus: (0..c.gpu_count() as u32)
            .map(|g| {
                let g = c.gpu(g);
                (
                    g.node(),
                    g.model().to_string(),
                    g.utilization_pct(),
                    g.sm_activity_pct(),
                )
            })
            .collect(),
        jobs: c
            .jobs()
            .map(|j| {
                (
                    j.name().into(),
                    j.tenant().into(),
                    j.phase(),
                    j.gpu_model_mask(),
                    j.placement().to_vec(),
                    j.reserved_nodes().to_vec(),
                )
            })
            .collect(),
    }
}

fn place(s: &mut ClusterState, job: u32, node: u32, gpus: Vec<u32>) {
    let d = vec![Decision::Place(job, vec![WorkerPlacement { node, gpus }])];
    s.validate(&d, 10).unwrap();
    s.apply(d).unwrap();
}

/// Three nodes (two models, two pools), 200 jobs of which 12 live on:
/// running, reserved, pending with a model constraint.
fn churned_state() -> ClusterState {
    let mut s = ClusterState::new().with_compaction_floor(None);
    s.add_node(gpu_node("a", "train", "V100", 4)).unwrap();
    s.add_node(gpu_node("b", "infer", "T4", 2)).unwrap();
    s.add_node(gpu_node("c", "train", "V100", 2)).unwrap();
    let mut ids = Vec::new();
    for i in 0..200 {
        let mut req = JobRequest::gpus(format!("j{i}"), format!("t{}", i % 7), 1, 1);
        if i % 3 == 0 {
            req.gpu_models = vec!["T4".into()];
        }
        ids.push(s.submit(req).unwrap());
    }
    s.begin_round(10);
    // Keep every 17th job (12 of them).
    for (i, id) in ids.iter().enumerate() {
        if i % 17 != 0 {
            s.remove(*id).unwrap();
        }
    }
    s.begin_round(10);
    let by_name = |s: &ClusterState, n: &str| {
        let id = s.job_by_name(n).unwrap();
        s.job_index(id).unwrap()
    };
    let j0 = by_name(&s, "j0"); // T4 only
    place(&mut s, j0, 1, vec![4]);
    let j17 = by_name(&s, "j17");
    place(&mut s, j17, 0, vec![2]);
    let j34 = by_name(&s, "j34");
    let d = vec![Decision::Reserve(j34, vec![2])];
    s.validate(&d, 10).unwrap();
    s.apply(d).unwrap();
    s.record_gpu_metrics(vec![model::GpuMetric {
        gpu: 2,
        utilization_pct: 80,
        sm_activity_pct: 40,
        memory_used_mib: 1000,
        sm_occupancy_pct: 30,
    }])
    .unwrap();
    s.begin_round(10);
    s
}

#[test]
fn string_counts_follow_submissions_and_removals() {
    let mut s = ClusterState::new().with_compaction_floor(None);
    s.add_node(gpu_node("a", "p", "V100", 2)).unwrap();
    // A CPU node's empty model string is interned but not referred to
    // as a model; "" is every node's fabric (unknown), so it is live.
    s.add_node(gpu_node("cpu", "p", "", 0)).unwrap();
    assert_eq!(s.string_stats().live, live_by_scan(&s));
    assert_eq!(s.string_stats().dead(), 0);
    let a = s.submit(JobRequest::gpus("x", "t", 1, 1)).unwrap();
    let b = s.submit(JobRequest::gpus("y", "t", 1, 1)).unwrap();
    assert_eq!(s.string_stats().live, live_by_scan(&s));
    s.remove(a).unwrap();
    // `t` is still the tenant of `y`.
    assert_eq!(s.string_stats().live, live_by_scan(&s));
    s.remove(b).unwrap();
    let stats = s.string_stats();
    assert_eq!(stats.live, live_by_scan(&s));
    // x, y, t and the jobs' groups (""; still the nodes' fabric) die.
    assert_eq!((stats.total, stats.dead()), (8, 3));
    assert!(!s.compaction_due(), "automatic compaction is off");
    s.set_compaction_floor(Some(4));
    assert!(
        !s.compaction_due(),
        "dead strings do not outnumber live ones"
    );
    for unused in ["u1", "u2", "u3"] {
        s.intern(unused).unwrap();
    }
    assert!(s.compaction_due());
    s.set_compaction_floor(Some(7));
    assert!(!s.compaction_due(), "below the floor");
}

#[test]
fn compaction_renumbers_every_column_that_names_a_string() {
    let mut s = churned_state();
    let before = view(&s);
    let stats = s.string_stats();
    assert_eq!(stats.live, live_by_scan(&s));
    assert!(stats.dead() > 150, "{stats:?}");
    let epoch = s.epoch();
    let c = s.compact_strings().unwrap();
    assert_eq!(c.epoch, epoch + 1);
    assert_eq!(c.strings_before, stats.total);
    // 3 names + 2 pools + 2 models + "" (fabric, group) + 12 job names
    // + 7 tenants.
    assert_eq!(c.strings_after, 27);
    assert_eq!(
        view(&s),
        before,
        "every name, placement and reservation kept"
    );
    let stats = s.string_stats();
    assert_eq!((stats.total, stats.live, stats.compactions), (27, 27, 1));
    assert_eq!(stats.live, live_by_scan(&s));
    // The host's own maps follow the new numbering.
    let n = s.cluster().strings().len();
    let j17 = s.job_index(s.job_by_name("j17").unwrap()).unwrap();
    assert_eq!(
        s.intern("j17").unwrap(),
        s.cluster().job_columns().name[j17 as usize]
    );
    assert_eq!(s.cluster().strings().len(), n, "no string interned twice");
    for r in s.records() {
        let i = s.job_index(r.id).unwrap();
        assert_eq!(s.cluster().job(i).name(), r.name);
        assert_eq!(s.cluster().job(i).tenant(), r.tenant);
    }
    // A model constraint still means the same model.
    let mut t4 = JobRequest::gpus("new", "t1", 1, 1);
    t4.gpu_models = vec!["T4".into()];
    let id = s.submit(t4).unwrap();
    let j = s.job_index(id).unwrap();
    assert!(s.cluster().job(j).allows_gpu(4) && !s.cluster().job(j).allows_gpu(0));
    assert_eq!(s.string_stats().total, 28, "only the new job's name is new");
    // Quotas are looked up through the rebuilt table.
    s.set_tenant_quota("t1", Some(0)).unwrap();
    s.begin_round(10);
    let d = vec![Decision::Place(
        j,
        vec![WorkerPlacement {
            node: 1,
            gpus: vec![5],
        }],
    )];
    assert!(matches!(
        s.validate(&d, 10),
        Err((0, DecisionError::QuotaExceeded { .. }))
    ));
}

#[test]
fn snapshot_after_compaction_equals_a_fresh_state_of_the_live_jobs() {
    let mut s = churned_state();
    s.compact_strings().unwrap();
    // Build the same cluster from scratch: nodes, then the live jobs in
    // job-table order, their placements and reservations.
    let mut fresh = ClusterState::new();
    fresh.add_node(gpu_node("a", "train", "V100", 4)).unwrap();
    fresh.add_node(gpu_node("b", "infer", "T4", 2)).unwrap();
    fresh.add_node(gpu_node("c", "train", "V100", 2)).unwrap();
    for job in s.cluster().jobs() {
        let i: u32 = job.name()[1..].parse().unwrap();
        let mut req = JobRequest::gpus(job.name(), job.tenant(), 1, 1);
        if i.is_multiple_of(3) {
            req.gpu_models = vec!["T4".into()];
        }
        fresh.submit(req).unwrap();
    }
    fresh.begin_round(10);
    for job in s.cluster().jobs() {
        if !job.placement().is_empty() {
            let w = &job.placement()[0];
            place(&mut fresh, job.index(), w.node, w.gpus.clone());
        }
        if !job.reserved_nodes().is_empty() {
            let d = vec![Decision::Reserve(
                job.index(),
                job.reserved_nodes().to_vec(),
            )];
            fresh.apply(d).unwrap();
        }
    }
    let (mut compacted, mut built) = (s.snapshot(), fresh.snapshot());
    compacted.epoch = 0;
    built.epoch = 0;
    assert_eq!(compacted, built);
    assert_eq!(view(&s).jobs, view(&fresh).jobs);
}

#[test]
fn compaction_opens_a_resync_epoch() {
    let mut s = churned_state();
    let feed = s.delta_feed();
    let old_mirror_epoch = s.epoch();
    s.begin_round(10);
    assert!(s.delta_since(old_mirror_epoch).is_some());
    // Pending changes are folded into the resync epoch.
    let late = s.submit(JobRequest::gpus("late", "t0", 1, 1)).unwrap();
    let before = s.epoch();
    let c = s.compact_strings().unwrap();
    assert_eq!(
        (c.epoch, s.epoch(), s.resync_epoch()),
        (before + 1, before + 1, before + 1)
    );
    assert!(!s.has_pending_events());
    assert!(s.job_index(late).is_some());
    // Mirrors from before must resync; none can be caught up by delta.
    for e in [old_mirror_epoch, before] {
        assert!(s.delta_since(e).is_none());
        assert!(feed.delta_since(e).is_none());
    }
    assert_eq!(feed.epoch(), c.epoch);
    assert_eq!(feed.resync_epoch(), c.epoch);
    assert!(s.delta_since(c.epoch).unwrap().events.is_empty());
    // A mirror built at the resync epoch follows by deltas as before.
    let snapshot = s.snapshot_at_epoch().unwrap();
    assert_eq!(snapshot.epoch, c.epoch);
    assert_eq!(snapshot.strings.len(), c.strings_after);
    let mut mirror = Cluster::from_snapshot(snapshot).unwrap();
    s.submit(JobRequest::gpus("after", "t9", 1, 1)).unwrap();
    let (delta, round) = s.begin_round(10);
    assert_eq!((delta.base_epoch, round.epoch), (c.epoch, c.epoch + 1));
    mirror.apply(&delta).unwrap();
    assert_eq!(mirror.to_snapshot(), s.snapshot());
    assert_eq!(feed.delta_since(c.epoch).unwrap().events, delta.events);
}

#[test]
fn a_round_compacts_first_when_dead_strings_dominate() {
    let mut s = ClusterState::new().with_compaction_floor(Some(20));
    s.add_node(node("a", 8)).unwrap();
    let mut last_epoch = s.epoch();
    let mut resync_epochs = Vec::new();
    for i in 0..100 {
        let id = s
            .submit(JobRequest::gpus(format!("job-{i}"), "t", 1, 1))
            .unwrap();
        let due = s.compaction_due();
        let (delta, round) = s.begin_round(10);
        if due {
            // The round's epoch follows the resync epoch it opened.
            assert_eq!(round.epoch, last_epoch + 2);
            assert_eq!(delta.base_epoch, s.resync_epoch());
            assert!(delta.events.is_empty());
            resync_epochs.push(s.resync_epoch());
        } else {
            assert_eq!(round.epoch, last_epoch + 1);
        }
        last_epoch = round.epoch;
        s.remove(id).unwrap();
        let stats = s.string_stats();
        assert!(stats.total <= 2 * stats.live + 20 + 2, "{stats:?}");
    }
    // 100 names died: a compaction every ~20 of them.
    assert_eq!(s.string_stats().compactions as usize, resync_epochs.len());
    assert!(resync_epochs.len() >= 4, "{resync_epochs:?}");
}

#[test]
fn mirrors_resync_after_a_compaction_and_their_decisions_stay_valid() {
    use arbiter_policy_sdk::Runtime;
    let mut s = ClusterState::new().with_compaction_floor(Some(32));
    for i in 0..4 {
        s.add_node(node(&format!("n{i}"), 4)).unwrap();
    }
    let mut policy =
        crate::runtime::PolicyInstance::native(Box::new(Runtime::<policy_fifo::Fifo>::new()));
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    let (mut resyncs, mut started) = (0, 0);
    for round in 0..300u64 {
        s.set_now(round * 10);
        for k in 0..2 {
            s.submit(JobRequest::gpus(
                format!("r{round}-{k}"),
                format!("t{k}"),
                1,
                1,
            ))
            .unwrap();
        }
        // Jobs finish after about 5 rounds.
        let done: Vec<JobId> = s
            .records()
            .iter()
            .filter(|r| r.last_start_ms.is_some_and(|t| t + 50 <= round * 10))
            .map(|r| r.id)
            .collect();
        for id in done {
            s.remove(id).unwrap();
        }
        let (_, info) = s.begin_round(100);
        match s.delta_since(mirror.epoch()) {
            Some(delta) => mirror.apply(&delta).unwrap(),
            None => {
                resyncs += 1;
                mirror = Cluster::from_snapshot(s.snapshot_at_epoch().unwrap()).unwrap();
            }
        }
        assert_eq!(mirror.to_snapshot(), s.snapshot_at_epoch().unwrap());
        policy.sync_to(&s).unwrap();
        assert_eq!(policy.mirror_epoch(), Some(s.epoch()));
        let decisions = policy.schedule(info).unwrap();
        s.validate(&decisions, 100).unwrap();
        started += s.apply(decisions).unwrap().started.len();
        let stats = s.string_stats();
        assert!(stats.total <= 2 * stats.live + 32 + 4, "{stats:?}");
    }
    let compactions = s.string_stats().compactions;
    assert!(compactions >= 3, "{compactions} compactions");
    assert_eq!(
        resyncs, compactions,
        "a mirror resyncs only at a compaction"
    );
    assert!(started >= 500, "{started} jobs started");
}

#[test]
fn reservations_and_utilization_survive_on_the_host() {
    let mut s = churned_state();
    let reserved = s.job_by_name("j34").unwrap();
    s.compact_strings().unwrap();
    let c = s.cluster();
    let j = s.job_index(reserved).unwrap();
    assert_eq!(c.job(j).reserved_nodes(), &[2]);
    assert_eq!(c.reserved_by(2), Some(j));
    assert_eq!(
        (c.gpu(2).utilization_pct(), c.gpu(2).sm_activity_pct()),
        (80, 40)
    );
    // Node 2 is still closed to other jobs.
    let other = s.job_index(s.job_by_name("j68").unwrap()).unwrap();
    s.begin_round(10);
    let d = vec![Decision::Place(
        other,
        vec![WorkerPlacement {
            node: 2,
            gpus: vec![6],
        }],
    )];
    assert!(s.validate(&d, 10).is_err());
}

#[test]
fn a_delta_feed_is_read_from_another_thread() {
    let mut s = ClusterState::new();
    s.add_node(node("a", 4)).unwrap();
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    let feed = s.delta_feed();
    for i in 0..10 {
        s.submit(JobRequest::gpus(format!("j{i}"), "t", 1, 1))
            .unwrap();
        s.begin_round(10);
    }
    let target = s.epoch();
    let reader = std::thread::spawn(move || {
        let d = feed.delta_since(mirror.epoch()).unwrap();
        mirror.apply(&d).unwrap();
        mirror
    });
    let mirror = reader.join().unwrap();
    assert_eq!(mirror.epoch(), target);
    assert_eq!(mirror.to_snapshot(), s.snapshot());
}

fn place_on(s: &mut ClusterState, job: u32, node: u32, gpus: Vec<u32>) {
    let d = vec![Decision::Place(job, vec![WorkerPlacement { node, gpus }])];
    s.validate(&d, 10).unwrap();
    s.apply(d).unwrap();
}

#[test]
fn progress_follows_runs_and_reports() {
    let mut s = ClusterState::new();
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    s.add_node(node("a", 4)).unwrap();
    let mut req = JobRequest::gpus("ckpt", "t", 2, 1);
    req.estimate_ms = 100_000;
    let ckpt = s.submit(req).unwrap();
    let mut req = JobRequest::gpus("fresh", "t", 1, 1);
    req.estimate_ms = 50_000;
    req.checkpointed = false;
    let fresh = s.submit(req).unwrap();
    // Until anything runs, what is left is the estimate at the submitted size.
    let p = s.cluster().job(0).progress();
    assert_eq!(
        (p.remaining_ms, p.remaining_workers, p.started_ms),
        (100_000, 2, 0)
    );

    s.set_now(1_000);
    s.begin_round(10);
    let d = vec![Decision::Place(
        0,
        vec![
            WorkerPlacement {
                node: 0,
                gpus: vec![0],
            },
            WorkerPlacement {
                node: 0,
                gpus: vec![1],
            },
        ],
    )];
    s.validate(&d, 10).unwrap();
    s.apply(d).unwrap();
    place_on(&mut s, 1, 0, vec![2]);
    assert_eq!(s.cluster().job(0).progress().started_ms, 1_000);

    // A report at 11 s: 80 s left. At 21 s, 70 s are left.
    s.set_now(11_000);
    s.report_progress(ckpt, 80_000).unwrap();
    let p = s.cluster().job(0).progress();
    assert_eq!((p.remaining_ms, p.reported_ms), (80_000, 11_000));
    assert_eq!(p.remaining_ms_at(21_000), Some(70_000));
    assert_eq!(p.attained_ms_at(21_000), 20_000);

    // Preempted at 21 s: the checkpointed job banks 20 s and keeps 70 s
    // left; the other starts over from its estimate.
    s.set_now(21_000);
    s.evict(ckpt).unwrap();
    s.evict(fresh).unwrap();
    let p = s.cluster().job(0).progress();
    assert_eq!(
        (p.started_ms, p.attained_ms, p.remaining_ms),
        (0, 20_000, 70_000)
    );
    assert_eq!(
        p.remaining_ms_at(99_000),
        Some(70_000),
        "a stopped job does not progress"
    );
    let p = s.cluster().job(1).progress();
    assert_eq!(
        (p.attained_ms, p.remaining_ms, p.remaining_workers),
        (20_000, 50_000, 1)
    );

    s.begin_round(10);
    mirror.apply(&s.delta_since(0).unwrap()).unwrap();
    assert_eq!(mirror.to_snapshot(), s.snapshot());
    assert!(matches!(
        s.report_progress(JobId(999), 1),
        Err(StateError::UnknownJob(_))
    ));
}

#[test]
fn gpu_speeds_reach_the_mirror_before_and_after_the_model_appears() {
    let mut s = ClusterState::new();
    let mut mirror = Cluster::from_snapshot(s.snapshot()).unwrap();
    s.set_gpu_model_speed("T4", 333).unwrap();
    s.add_node(node("v", 2)).unwrap();
    let mut t4 = node("t", 2);
    t4.gpu_model = "T4".into();
    s.add_node(t4).unwrap();
    let (delta, _) = s.begin_round(10);
    mirror.apply(&delta).unwrap();
    let speeds: Vec<u32> = (0..4).map(|g| mirror.gpu(g).speed_permille()).collect();
    assert_eq!(speeds, vec![1000, 1000, 333, 333]);

    s.set_gpu_model_speed("V100", 2_000).unwrap();
    s.set_gpu_model_speed("T4", 333).unwrap(); // unchanged: no event
    let (delta, _) = s.begin_round(10);
    assert_eq!(delta.events, vec![Event::GpuModelSpeedChanged(0, 2_000)]);
    mirror.apply(&delta).unwrap();
    assert_eq!(mirror.gpu(0).speed_permille(), 2_000);
    assert_eq!(mirror.to_snapshot(), s.snapshot());

    for bad in [0, MAX_SPEED_PERMILLE + 1] {
        assert!(matches!(
            s.set_gpu_model_speed("A100", bad),
            Err(StateError::InvalidSpeed { .. })
        ));
    }
}
