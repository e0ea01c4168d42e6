use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
use arbiter_host::state::{ClusterState, JobRequest, NodeRequest};

#[test]
fn fifo_component_places_a_job() {
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: std::time::Duration::from_secs(30),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let compiled = engine
        .compile(arbiter_policies::get("fifo").unwrap())
        .unwrap();
    assert_eq!(compiled.manifest.name, "fifo");
    let mut state = ClusterState::new();
    state
        .add_node(NodeRequest::gpus("n0", "default", "A100", 81_920, 8))
        .unwrap();
    state.submit(JobRequest::gpus("j", "t", 2, 2)).unwrap();
    let (_delta, round) = state.begin_round(100);
    let mut inst = compiled.instantiate().unwrap();
    inst.sync_to(&state).unwrap();
    let d = inst.schedule(round).unwrap();
    assert_eq!(d.len(), 1);
    state.validate(&d, 100).unwrap();
    println!("imports: {:?}", compiled.inspection.imports);
}
