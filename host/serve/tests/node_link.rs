//! The host's side of the node link, driven by scripted agents over real
//! gRPC streams: registration, launch with the policy's GPUs/quota/share,
//! completion, loss after missed heartbeats, rescheduling, adoption after an
//! agent restart, and stopping a duplicate.

mod common;

use arbiter_proto::v1;
use arbiter_serve::clock::{Clock, ManualClock};
use arbiter_serve::plane::PlaneConfig;
use arbiter_serve::server::{Running, ServeConfig, start};
use common::patient_plane;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

fn bearer<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// A scripted node agent: what it sends, and what the host sent it.
struct Agent {
    tx: mpsc::Sender<v1::NodeMessage>,
    rx: tonic::Streaming<v1::HostMessage>,
}

impl Agent {
    /// The agent of `name` (instance `instance-<name>`, as if it kept its state directory).
    async fn connect(
        running: &Running,
        token: &str,
        name: &str,
        workloads: Vec<v1::WorkloadReport>,
    ) -> Agent {
        Self::connect_as(running, token, name, &format!("instance-{name}"), workloads)
            .await
            .unwrap_or_else(|s| panic!("session refused: {s:?}"))
    }

    async fn connect_as(
        running: &Running,
        token: &str,
        name: &str,
        instance: &str,
        workloads: Vec<v1::WorkloadReport>,
    ) -> Result<Agent, tonic::Status> {
        let mut client = v1::node_link_client::NodeLinkClient::new(channel(running).await);
        let (tx, rx) = mpsc::channel(64);
        tx.send(v1::NodeMessage {
            body: Some(v1::node_message::Body::Hello(v1::NodeHello {
                name: name.into(),
                pool: "lab".into(),
                cpu_milli: 32_000,
                memory_mib: 131_072,
                gpus: (0..2)
                    .map(|i| v1::GpuInfo {
                        index: i,
                        model: "H200".into(),
                        memory_mib: 143_000,
                    })
                    .collect(),
                workloads,
                instance: instance.into(),
            })),
        })
        .await
        .unwrap();
        let rx = client
            .session(bearer(token, ReceiverStream::new(rx)))
            .await?
            .into_inner();
        let mut agent = Agent { tx, rx };
        match agent.next().await {
            v1::host_message::Body::Welcome(w) => assert!(w.heartbeat_ms > 0),
            other => panic!("expected welcome, got {other:?}"),
        }
        Ok(agent)
    }

    async fn next(&mut self) -> v1::host_message::Body {
        let msg = tokio::time::timeout(Duration::from_secs(10), self.rx.next())
            .await
            .expect("host said nothing")
            .expect("stream ended")
            .expect("stream error");
        msg.body.expect("empty host message")
    }

    async fn send(&self, body: v1::node_message::Body) {
        self.tx
            .send(v1::NodeMessage { body: Some(body) })
            .await
            .unwrap();
    }

    async fn heartbeat(&self) {
        self.heartbeat_with_health(1).await;
    }

    async fn heartbeat_with_health(&self, health: u32) {
        self.heartbeat_with(health, Vec::new()).await;
    }

    async fn heartbeat_with(&self, health: u32, jobs: Vec<v1::JobSample>) {
        self.send(v1::node_message::Body::Heartbeat(v1::Heartbeat {
            jobs,
            seq: 1,
            gpus: vec![v1::GpuSample {
                index: 0,
                utilization_pct: 40,
                sm_activity_pct: 30,
                memory_used_mib: 1000,
                health,
            }],
            host: Some(v1::HostLoad {
                cpu_utilization_pct: 35,
                memory_used_mib: 20_000,
                memory_total_mib: 64_000,
                swap_in_per_s: 7,
            }),
        }))
        .await;
    }

    async fn event(&self, job: u64, kind: v1::WorkloadEventKind, code: i32) {
        self.event_of_run(job, 0, kind, code).await;
    }

    /// An event naming the run (`Launch.launch_seq`) it is about.
    async fn event_of_run(
        &self,
        job: u64,
        launch_seq: u64,
        kind: v1::WorkloadEventKind,
        code: i32,
    ) {
        self.send(v1::node_message::Body::Event(v1::WorkloadEvent {
            job_id: job,
            kind: kind as i32,
            exit_code: code,
            message: String::new(),
            launch_seq,
        }))
        .await;
    }
}

/// A control plane with no simulated nodes, fast rounds and heartbeats, agents lost after
/// 600 ms of silence on a clock that stands still: the scripted agents heartbeat only when
/// told to, so none is lost however slowly a test runs.
async fn agents_only(data: &std::path::Path) -> Running {
    agents_only_on(data, std::sync::Arc::new(ManualClock::starting_now())).await
}

/// [`agents_only`] on `clock` (a test that loses an agent moves it on).
async fn agents_only_on(data: &std::path::Path, clock: std::sync::Arc<dyn Clock>) -> Running {
    start(ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        data: data.to_path_buf(),
        metrics_listen: None,
        plane: PlaneConfig {
            round_interval: Duration::from_millis(20),
            nodes: Vec::new(),
            heartbeat: Duration::from_millis(100),
            lost_after: Duration::from_millis(600),
            clock,
            ..patient_plane()
        },
    })
    .await
    .unwrap()
}

async fn job(running: &Running, token: &str, id: u64) -> v1::Job {
    let channel = channel(running).await;
    v1::jobs_client::JobsClient::new(channel)
        .get(bearer(token, v1::JobRef { id }))
        .await
        .unwrap()
        .into_inner()
}

async fn submit(running: &Running, token: &str, spec: v1::JobSpec) -> u64 {
    let channel = channel(running).await;
    v1::jobs_client::JobsClient::new(channel)
        .submit(bearer(token, v1::SubmitJobRequest { spec: Some(spec) }))
        .await
        .unwrap()
        .into_inner()
        .id
}

async fn wait_state(running: &Running, token: &str, id: u64, state: v1::JobState) -> v1::Job {
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        let j = job(running, token, id).await;
        if j.state == state as i32 {
            return j;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("job {id} never reached {state:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_register_run_jobs_get_lost_and_are_adopted() {
    let dir = tempfile::tempdir().unwrap();
    // The scripted agents heartbeat only when told to: on the plane's own
    // clock, moved by the test, none is lost before the test says so,
    // however slowly it runs.
    let clock = std::sync::Arc::new(ManualClock::starting_now());
    let running = agents_only_on(dir.path(), clock.clone()).await;
    let token = running.new_admin_token.clone().unwrap();

    let mut a = Agent::connect(&running, &token, "node-a", Vec::new()).await;
    a.heartbeat().await;

    // The policy's choice reaches the agent with the quota and share.
    let short = submit(
        &running,
        &token,
        v1::JobSpec {
            name: "short".into(),
            gpus: 1,
            gpu_milli: 500,
            gpu_memory_mib: 4096,
            qos: 1,
            command: vec!["train".into()],
            ..Default::default()
        },
    )
    .await;
    let launch = match a.next().await {
        v1::host_message::Body::Launch(l) => l,
        other => panic!("expected a launch, got {other:?}"),
    };
    assert_eq!(launch.job_id, short);
    assert_eq!(launch.command, vec!["train".to_string()]);
    assert_eq!(launch.gpus.len(), 1);
    assert_eq!(launch.memory_limit_mib, 4096);
    assert_eq!(launch.compute_share_permille, 500);
    assert_eq!(launch.role, 1, "opportunistic = offline");
    a.event(short, v1::WorkloadEventKind::Started, 0).await;
    a.event(short, v1::WorkloadEventKind::Exited, 0).await;
    let done = wait_state(&running, &token, short, v1::JobState::Succeeded).await;
    assert_eq!(done.node, "node-a");

    // The node's coordinator evicts an offline job: the host requeues it and
    // places it again.
    let evicted = submit(
        &running,
        &token,
        v1::JobSpec {
            name: "offline".into(),
            gpus: 1,
            qos: 1,
            ..Default::default()
        },
    )
    .await;
    let first_run = match a.next().await {
        v1::host_message::Body::Launch(l) => {
            assert_eq!(l.job_id, evicted);
            l.launch_seq
        }
        other => panic!("expected a launch, got {other:?}"),
    };
    assert_ne!(first_run, 0, "every launch is numbered");
    wait_state(&running, &token, evicted, v1::JobState::Running).await;
    a.send(v1::node_message::Body::Event(v1::WorkloadEvent {
        job_id: evicted,
        kind: v1::WorkloadEventKind::Evicted as i32,
        exit_code: 0,
        message: "GPU 0 overlimit".into(),
        launch_seq: first_run,
    }))
    .await;
    let second_run = match a.next().await {
        v1::host_message::Body::Launch(l) => {
            assert_eq!(l.job_id, evicted, "placed again");
            l.launch_seq
        }
        other => panic!("expected the job to be placed again, got {other:?}"),
    };
    assert!(second_run > first_run, "{second_run} after {first_run}");
    let again = wait_state(&running, &token, evicted, v1::JobState::Running).await;
    assert_eq!(again.preemptions, 1);
    // The first run's events arriving late — a repeated eviction, its exit —
    // are about a run the host has replaced on this same node: ignored, not
    // a second requeue of the run now going.
    a.event_of_run(evicted, first_run, v1::WorkloadEventKind::Evicted, 0)
        .await;
    a.event_of_run(evicted, first_run, v1::WorkloadEventKind::Exited, 1)
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let still = job(&running, &token, evicted).await;
    assert_eq!(still.state, v1::JobState::Running as i32, "{still:?}");
    assert_eq!(still.preemptions, 1, "{still:?}");
    a.event_of_run(evicted, second_run, v1::WorkloadEventKind::Exited, 0)
        .await;
    wait_state(&running, &token, evicted, v1::JobState::Succeeded).await;

    // A GPU its coordinator holds overlimit takes no new shared work; the node
    // stays open (contract 0.3's per-GPU health, MuxFlow's X10).
    a.heartbeat_with_health(3).await;
    // The GPU's health and the host's load reach the cluster view (contract
    // 0.3: per-GPU health, node metrics), as the node list shows them once the
    // heartbeat has gone through the plane (polled: however slowly it runs).
    let mut nodes = v1::nodes_client::NodesClient::new(channel(&running).await);
    let by = std::time::Instant::now() + Duration::from_secs(60);
    let node_a = loop {
        let listed = nodes
            .list(bearer(&token, v1::ListNodesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .nodes;
        let node_a = listed
            .into_iter()
            .find(|n| n.name == "node-a")
            .expect("node-a");
        if node_a.gpu_health.first() == Some(&3) && node_a.host.is_some()
            || std::time::Instant::now() > by
        {
            break node_a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(node_a.gpu_health.first(), Some(&3), "{node_a:?}");
    assert_eq!(
        node_a.state, "ready",
        "a GPU's health never cordons the node"
    );
    let host = node_a.host.as_ref().expect("host load");
    assert_eq!(
        (
            host.cpu_utilization_pct,
            host.memory_used_mib,
            host.swap_in_per_s
        ),
        (35, 20_000, 7)
    );
    let held = submit(
        &running,
        &token,
        v1::JobSpec {
            name: "held".into(),
            gpus: 1,
            qos: 1,
            ..Default::default()
        },
    )
    .await;
    match a.next().await {
        v1::host_message::Body::Launch(l) => {
            assert_eq!(l.job_id, held);
            assert_eq!(l.gpus, [1], "shared work only on the healthy GPU");
        }
        other => panic!("expected the shared job on GPU 1, got {other:?}"),
    }
    a.heartbeat().await;
    a.event(held, v1::WorkloadEventKind::Exited, 0).await;
    wait_state(&running, &token, held, v1::JobState::Succeeded).await;

    // A long job on node-a; node-a goes silent and is declared lost.
    let long = submit(
        &running,
        &token,
        v1::JobSpec {
            name: "long".into(),
            gpus: 2,
            command: vec!["serve".into()],
            ..Default::default()
        },
    )
    .await;
    match a.next().await {
        v1::host_message::Body::Launch(l) => assert_eq!(l.job_id, long),
        other => panic!("expected a launch, got {other:?}"),
    }
    drop(a);
    let mut requeued = job(&running, &token, long).await;
    for _ in 0..250 {
        if requeued.state == v1::JobState::Pending as i32 {
            break;
        }
        clock.advance(Duration::from_millis(601));
        tokio::time::sleep(Duration::from_millis(20)).await;
        requeued = job(&running, &token, long).await;
    }
    assert_eq!(requeued.state, v1::JobState::Pending as i32, "{requeued:?}");
    assert_eq!(requeued.preemptions, 1);
    assert!(requeued.message.contains("lost"), "{}", requeued.message);

    // node-b registers and gets the job.
    let mut b = Agent::connect(&running, &token, "node-b", Vec::new()).await;
    match b.next().await {
        v1::host_message::Body::Launch(l) => assert_eq!(l.job_id, long),
        other => panic!("expected the rescheduled launch, got {other:?}"),
    }
    let moved = wait_state(&running, &token, long, v1::JobState::Running).await;
    assert_eq!(moved.node, "node-b");

    // node-a comes back still running the old copy: the host stops it.
    let mut a = Agent::connect(
        &running,
        &token,
        "node-a",
        vec![v1::WorkloadReport {
            job_id: long,
            pid: 1234,
            running: true,
            exit_code: 0,
        }],
    )
    .await;
    match a.next().await {
        v1::host_message::Body::Stop(s) => assert_eq!(s.job_id, long),
        other => panic!("expected a stop, got {other:?}"),
    }

    // node-b's agent restarts; its workload survived and is adopted, not relaunched.
    drop(b);
    let b = Agent::connect(
        &running,
        &token,
        "node-b",
        vec![v1::WorkloadReport {
            job_id: long,
            pid: 4321,
            running: true,
            exit_code: 0,
        }],
    )
    .await;
    b.heartbeat().await;
    let adopted = job(&running, &token, long).await;
    assert_eq!(adopted.state, v1::JobState::Running as i32);
    assert_eq!(adopted.node, "node-b");
    assert_eq!(adopted.preemptions, 1);

    // The job's statistics from its node reach the job (and its cell's policies as
    // `job-metrics`); samples for jobs not running on that node are ignored.
    let sample = v1::JobSample {
        job_id: long,
        iteration_ms: 120,
        peak_memory_mib: 3000,
        min_memory_mib: 1000,
        utilization_pct: 70,
        host_memory_mib: 1500,
        memory_limit_mib: 2048,
        compute_share_permille: 50,
    };
    let stray = |job_id| v1::JobSample {
        job_id,
        iteration_ms: 1,
        ..sample
    };
    b.heartbeat_with(1, vec![sample, stray(held), stray(999_999)])
        .await;
    let mut shown = None;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        shown = job(&running, &token, long).await.metrics;
        if shown.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shown, Some(sample));
    assert_eq!(
        job(&running, &token, held).await.metrics,
        None,
        "not running there"
    );
    b.event(long, v1::WorkloadEventKind::Exited, 3).await;
    let failed = wait_state(&running, &token, long, v1::JobState::Failed).await;
    assert!(failed.message.contains("exit code 3"), "{}", failed.message);

    // The nodes are listed as agents.
    let channel = channel(&running).await;
    let nodes = v1::nodes_client::NodesClient::new(channel)
        .list(bearer(&token, v1::ListNodesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert!(nodes.iter().all(|n| n.kind == "agent"), "{nodes:?}");
    assert_eq!(nodes.len(), 2);
    drop(a);
    running.shutdown().await.unwrap();
}

async fn channel(running: &Running) -> Channel {
    Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Opens a node session with `token` and returns the status it fails with.
async fn session_refusal(running: &Running, token: &str) -> tonic::Status {
    let mut client = v1::node_link_client::NodeLinkClient::new(channel(running).await);
    let (tx, rx) = mpsc::channel(4);
    tx.send(v1::NodeMessage {
        body: Some(v1::node_message::Body::Hello(v1::NodeHello {
            name: "intruder".into(),
            pool: "lab".into(),
            cpu_milli: 1_000,
            memory_mib: 1_024,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    match client.session(bearer(token, ReceiverStream::new(rx))).await {
        Ok(_) => panic!("the session was accepted"),
        Err(status) => status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_token_opens_node_sessions_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        data: dir.path().to_path_buf(),
        metrics_listen: None,
        plane: PlaneConfig {
            round_interval: Duration::from_millis(20),
            nodes: Vec::new(),
            ..patient_plane()
        },
    };
    let running = start(cfg()).await.unwrap();
    let admin = running.new_admin_token.clone().unwrap();
    let node = running.new_node_token.clone().unwrap();
    assert_ne!(admin, node);
    let on_disk = std::fs::read_to_string(dir.path().join("node.token")).unwrap();
    assert_eq!(on_disk.trim(), node);

    // An agent with the node token registers and is welcomed.
    let a = Agent::connect(&running, &node, "node-a", Vec::new()).await;
    a.heartbeat().await;

    // Everything else refuses the node token.
    let channel = channel(&running).await;
    let mut jobs = v1::jobs_client::JobsClient::new(channel.clone());
    let spec = v1::JobSpec {
        name: "sneaky".into(),
        gpus: 1,
        ..Default::default()
    };
    let refused = jobs
        .submit(bearer(&node, v1::SubmitJobRequest { spec: Some(spec) }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let refused = jobs
        .list(bearer(&node, v1::ListJobsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let mut policies = v1::policies_client::PoliciesClient::new(channel.clone());
    let refused = policies
        .list(bearer(&node, v1::ListPoliciesRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let mut cluster = v1::cluster_client::ClusterClient::new(channel.clone());
    let refused = cluster
        .add_tenant(bearer(
            &node,
            v1::AddTenantRequest {
                name: "mine".into(),
                quota_gpus: 0,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // A tenant's token may not register a node; the admin's still may.
    let tenant = cluster
        .add_tenant(bearer(
            &admin,
            v1::AddTenantRequest {
                name: "team".into(),
                quota_gpus: 0,
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .token;
    let refused = session_refusal(&running, &tenant).await;
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let refused = session_refusal(&running, "not-a-token").await;
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let b = Agent::connect(&running, &admin, "node-b", Vec::new()).await;
    b.heartbeat().await;
    drop((a, b));
    running.shutdown().await.unwrap();

    // The node token survives a restart and is not minted again.
    let running = start(cfg()).await.unwrap();
    assert!(running.new_admin_token.is_none());
    assert!(running.new_node_token.is_none());
    let again = Agent::connect(&running, &node, "node-a", Vec::new()).await;
    again.heartbeat().await;
    drop(again);
    running.shutdown().await.unwrap();
}

/// A token bound to one node registers that node only, opens nothing but node sessions,
/// and is issued only for a name a node can take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_issued_for_one_node_registers_that_node_only() {
    let dir = tempfile::tempdir().unwrap();
    let running = agents_only(dir.path()).await;
    let admin = running.new_admin_token.clone().unwrap();
    let issue = |subject: &str| {
        let (running, admin, subject) = (&running, admin.clone(), subject.to_string());
        async move {
            let mut cluster = v1::cluster_client::ClusterClient::new(channel(running).await);
            cluster
                .rotate_token(bearer(&admin, v1::RotateTokenRequest { subject }))
                .await
                .unwrap()
                .into_inner()
                .token
        }
    };
    // No token for a name no agent may register under (the hello's rule).
    for subject in ["node:bad/name", "node:a b", "node:"] {
        let mut cluster = v1::cluster_client::ClusterClient::new(channel(&running).await);
        let refused = cluster
            .rotate_token(bearer(
                &admin,
                v1::RotateTokenRequest {
                    subject: subject.into(),
                },
            ))
            .await
            .err()
            .unwrap_or_else(|| panic!("{subject} issued"));
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("node name"), "{refused:?}");
    }
    let gpu01 = issue("node:gpu-01").await;
    let refused = Agent::connect_as(&running, &gpu01, "gpu-02", "machine-2", Vec::new())
        .await
        .err()
        .expect("another node's name is refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("gpu-01"), "{refused:?}");
    let agent = Agent::connect(&running, &gpu01, "gpu-01", Vec::new()).await;
    agent.heartbeat().await;
    // It opens node sessions and nothing else.
    assert_eq!(
        session_refusal_of_jobs(&running, &gpu01).await,
        tonic::Code::PermissionDenied
    );
    // Reissued, the old one stops working; it survives a restart.
    let again = issue("node:gpu-01").await;
    let old = Agent::connect_as(&running, &gpu01, "gpu-01", "instance-gpu-01", Vec::new())
        .await
        .err()
        .expect("the replaced token is refused");
    assert_eq!(old.code(), tonic::Code::Unauthenticated, "{old:?}");
    drop(agent);
    running.shutdown().await.unwrap();
    let running = agents_only(dir.path()).await;
    let back = Agent::connect(&running, &again, "gpu-01", Vec::new()).await;
    back.heartbeat().await;
    drop(back);
    running.shutdown().await.unwrap();
}

/// The code a jobs listing with `token` gets.
async fn session_refusal_of_jobs(running: &Running, token: &str) -> tonic::Code {
    let mut jobs = v1::jobs_client::JobsClient::new(channel(running).await);
    jobs.list(bearer(token, v1::ListJobsRequest::default()))
        .await
        .map_or_else(|s| s.code(), |_| tonic::Code::Ok)
}

/// Two agents given the same name (issue 14: they used to take the node from each other
/// several times a second): while the first is connected and heard from, the second is
/// refused; the first reconnecting (same instance) is welcome at once; once the first has
/// been silent for `lost_after`, the name is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_cannot_take_a_live_nodes_name() {
    let dir = tempfile::tempdir().unwrap();
    // The plane's clock moves only when the test says: the first agent
    // stays live however slowly the test runs, and goes silent at once.
    let clock = std::sync::Arc::new(ManualClock::starting_now());
    let running = agents_only_on(dir.path(), clock.clone()).await;
    let token = running.new_admin_token.clone().unwrap();
    let first = Agent::connect_as(&running, &token, "gpu-01", "machine-1", Vec::new())
        .await
        .unwrap();
    first.heartbeat().await;
    for instance in ["machine-2", ""] {
        let refused = Agent::connect_as(&running, &token, "gpu-01", instance, Vec::new())
            .await
            .err()
            .expect("a second agent is refused");
        assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");
        assert!(refused.message().contains("machine-1"), "{refused:?}");
    }
    // The first agent reconnects (a new stream before the old one is noticed gone).
    let again = Agent::connect_as(&running, &token, "gpu-01", "machine-1", Vec::new())
        .await
        .expect("the same agent takes its session over");
    again.heartbeat().await;
    // Silent past `lost_after`: another machine may have the name.
    drop((first, again));
    // (Its last heartbeat may still be on its way: each try moves the clock
    // past `lost_after` again.)
    let mut other = None;
    for _ in 0..100 {
        clock.advance(Duration::from_millis(601));
        match Agent::connect_as(&running, &token, "gpu-01", "machine-2", Vec::new()).await {
            Ok(agent) => {
                other = Some(agent);
                break;
            }
            Err(s) => assert_eq!(s.code(), tonic::Code::AlreadyExists, "{s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = other.expect("the name is free once the first agent is lost");
    other.heartbeat().await;
    drop(other);
    running.shutdown().await.unwrap();
}
