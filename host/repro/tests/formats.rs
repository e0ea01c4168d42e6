//! Philly jobs on a PAI node list, both detected by header: gangs, whole
//! GPUs and duration-based departures.

use arbiter_repro::{SimArgs, run};
use arbiter_sim::{Protocol, Source};

#[test]
fn philly_jobs_on_pai_machines_replay_by_duration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("pai_machine_spec.csv");
    std::fs::write(
        &nodes,
        "machine,gpu_type,cap_cpu,cap_mem,cap_gpu\nm0,V100M32,96,384,8\nm1,V100M32,96,384,8\nm2,P100,64,512,2\nc0,CPU,96,512,0\n",
    )
    .expect("write");
    let trace = dir.path().join("philly_jobs.csv");
    std::fs::write(
        &trace,
        "timestamp,duration,num_gpus,gpu_time,cluster\n\
2017-10-09 07:00:10,600.0,16,9600.0,vc1\n\
2017-10-09 07:00:00,60.0,1,60.0,vc2\n\
2017-10-09 07:00:05,120.0,8,960.0,vc1\n\
2017-10-09 07:00:20,30.0,2,60.0,vc2\n\n",
    )
    .expect("write");
    let out = run(&SimArgs {
        nodes: Some(nodes),
        trace: Some(trace),
        policy: "best-fit,fifo".into(),
        ..SimArgs::default()
    })
    .expect("philly replay");
    assert_eq!(out.scenario.source, Source::Philly);
    assert_eq!(out.scenario.protocol, Protocol::Replay);
    assert_eq!(out.scenario.gpus, 18);
    for r in &out.runs {
        let m = r.replay.as_ref().expect("replay");
        assert_eq!(m.jobs_completed, 4, "{}", r.policy);
        // The 16-GPU gang (two 8-GPU workers) waits for the 8-GPU job (120 s from t=5).
        let gang = r.records.iter().find(|t| t.gpus == 16.0).expect("gang");
        assert_eq!(gang.start_s, Some(125.0), "{}", r.policy);
        assert_eq!(gang.end_s, Some(725.0));
        assert_eq!(m.makespan_s, 725.0);
        let first = r
            .records
            .iter()
            .find(|t| t.arrival_s == 0.0)
            .expect("first");
        assert_eq!(first.jct_s(), Some(60.0));
    }
}
