//! Arbitrary gRPC request bodies, decoded as the server decodes them and
//! handed to the control plane as its handlers hand them, from an admin, a
//! tenant and a node agent, with rounds in between: a request the plane
//! cannot serve is an error status, never a panic, and the plane stays
//! usable (every call later in the run works against the state earlier
//! calls left). Writes publish onto the board as the API's do, and reads
//! are answered from it.
#![no_main]

use arbiter_proto::v1;
use arbiter_serve::plane::{Caller, Plane, PlaneConfig, default_pool};
use arbiter_serve::convert;
use arbiter_serve::link::ToAgent;
use arbiter_serve::records::NewJob;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::Mutex;
use tokio::sync::mpsc;

/// Calls before the plane starts over, so state (and the store) stays small.
const CALLS_PER_PLANE: u32 = 20_000;

struct Harness {
    plane: Plane,
    calls: u32,
    /// The latest agent session, and its outbox kept open.
    agent: Option<(String, u64, mpsc::UnboundedReceiver<ToAgent>)>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("temporary directory");
        let cfg = PlaneConfig {
            nodes: default_pool(3, 8),
            journal: false,
            ..PlaneConfig::default()
        };
        let mut plane = Plane::open(cfg, dir.path()).expect("plane").plane;
        drop(plane.add_tenant(&Caller::Admin, "fuzz", 4).expect("tenant"));
        Harness {
            plane,
            calls: 0,
            agent: None,
            _dir: dir,
        }
    }
}

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

fn decode<M: Message + Default>(bytes: &[u8]) -> Option<M> {
    M::decode(bytes).ok()
}

fuzz_target!(
    // Opening a plane compiles its default policy: done before the clock runs.
    init: {
        let mut guard = HARNESS.lock().unwrap_or_else(|p| p.into_inner());
        guard.get_or_insert_with(Harness::new);
    },
    |data: &[u8]| {
    let [op, who, body @ ..] = data else {
        return;
    };
    let mut guard = HARNESS.lock().unwrap_or_else(|p| p.into_inner());
    let h = guard.get_or_insert_with(Harness::new);
    h.calls += 1;
    if h.calls > CALLS_PER_PLANE {
        *h = Harness::new();
    }
    let caller = match who % 3 {
        0 => Caller::Admin,
        1 => Caller::Tenant("fuzz".into()),
        _ => Caller::Node(None),
    };
    let plane = &mut h.plane;
    match op % 18 {
        0 => {
            if let Some(r) = decode::<v1::SubmitJobsRequest>(body) {
                // As the API parses them: one bad spec refuses the batch.
                let jobs: Result<Vec<NewJob>, String> = r
                    .specs
                    .iter()
                    .map(|spec| {
                        convert::submitted_spec(spec).validated().map(|record| NewJob {
                            spec: record,
                            tenant: spec.tenant.clone(),
                        })
                    })
                    .collect();
                if let Ok(jobs) = jobs {
                    let _ = plane.submit(&caller, jobs);
                }
            }
        }
        1 => {
            if let Some(r) = decode::<v1::JobRef>(body) {
                let _ = plane.cancel(&caller, r.id);
            }
        }
        2 => {
            if let Some(r) = decode::<v1::JobRef>(body) {
                let _ = plane
                    .board()
                    .get_job(&caller, r.id)
                    .map(|j| convert::job_view(&j));
            }
        }
        3 => {
            if let Some(r) = decode::<v1::ListJobsRequest>(body) {
                let _ = plane
                    .board()
                    .list_jobs(&caller, &convert::job_query(&r))
                    .map(|(jobs, _)| jobs.iter().map(convert::job_view).count());
            }
        }
        4 => {
            if let Some(r) = decode::<v1::ReportProgressRequest>(body) {
                let _ = plane.report_progress(&caller, r.id, r.remaining_ms);
            }
        }
        5 => {
            if let Some(r) = decode::<v1::AddTenantRequest>(body) {
                let _ = plane.add_tenant(&caller, &r.name, r.quota_gpus);
            }
        }
        6 => {
            if let Some(Ok(r)) =
                decode::<v1::StartExperimentRequest>(body).map(|r| convert::experiment_request(&r))
            {
                let _ = plane.start_experiment(&caller, r);
            }
        }
        7 => {
            if let Some(r) = decode::<v1::ReclaimNodesRequest>(body) {
                let _ = plane.reclaim(&caller, &r.pool, r.count);
            }
        }
        8 => {
            if let Some(r) = decode::<v1::DrainNodeRequest>(body) {
                let _ = plane.drain(&caller, &r.name);
            }
        }
        9 => {
            if let Some(r) = decode::<v1::LendNodeRequest>(body) {
                let _ = plane.lend(&caller, &r.name);
            }
        }
        10 => {
            if let Some(hello) = decode::<v1::NodeHello>(body) {
                let (tx, rx) = mpsc::unbounded_channel();
                if let Ok(session) = plane.register_node(&caller, &convert::agent_hello(&hello), tx) {
                    h.agent = Some((hello.name, session, rx));
                }
            }
        }
        11 => {
            if let (Some(hb), Some((name, session, _))) = (decode::<v1::Heartbeat>(body), &h.agent) {
                plane.node_report(name, *session, &convert::agent_report(&hb));
            }
        }
        12 => {
            if let (Some(ev), Some((name, session, _))) =
                (decode::<v1::WorkloadEvent>(body), &h.agent)
            {
                if let Ok(ev) = convert::workload_event(&ev) {
                    plane.node_event(name, *session, &ev);
                }
            }
        }
        13 => {
            if let Some(r) = decode::<v1::SwapPolicyRequest>(body) {
                let _ = plane.swap(&caller, &r.slot, r.generation);
            }
        }
        14 => {
            if let Some(r) = decode::<v1::RollbackPolicyRequest>(body) {
                let _ = plane.rollback(&caller, &r.slot, r.generation);
            }
        }
        15 => {
            if let Some(r) = decode::<v1::ExperimentRef>(body) {
                let _ = if who & 8 == 0 {
                    plane.promote(&caller, &r.name)
                } else {
                    plane.abort(&caller, &r.name)
                };
            }
        }
        16 => {
            if let Some((name, session, _)) = &h.agent {
                plane.node_disconnected(name, *session);
            }
        }
        _ => {
            plane.tick();
            let board = plane.board();
            let _ = convert::cluster_view(&board.view());
            let _ = board.metrics_text();
            let _ = board.list_experiments().iter().map(|e| convert::experiment(e)).count();
            let _ = board.list_nodes().iter().map(convert::node).count();
        }
    }
    // What the API does after each write: job changes after every call,
    // everything after administrative ones (the tick published its own).
    match op % 18 {
        0 | 1 | 4 | 11 | 12 => plane.publish_jobs(),
        2 | 3 | 17 => {}
        _ => plane.publish(),
    }
    }
);
