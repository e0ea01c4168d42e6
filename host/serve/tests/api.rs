//! The control plane end to end over loopback gRPC: jobs, tenants, policies,
//! split and shadow experiments, guardrails, promotion, malformed requests.

mod common;

use arbiter_proto::v1;
use arbiter_serve::plane::{PlaneConfig, default_pool};
use arbiter_serve::server::{ServeConfig, start};
use common::*;
use std::time::Duration;
use tonic::Code;
use tonic::transport::Channel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_to_completion_and_tenants_are_isolated() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_millis(200)).await;
    let (mut admin, mut a, mut b) = two_tenants(&running).await;

    let id = submit(&mut a, spec("train", 4, 300)).await;
    wait_state(&a, id, v1::JobState::Succeeded).await;
    let job = a.jobs.get(v1::JobRef { id }).await.unwrap().into_inner();
    assert_eq!(job.spec.unwrap().tenant, "team-a");
    assert!(job.node.starts_with("sim-"), "{}", job.node);
    assert_eq!(job.gpu_indices.len(), 4);
    assert!(job.end_ms >= job.start_ms + 300);

    // Another tenant can neither read nor cancel it, nor learn it exists.
    let e = b.jobs.get(v1::JobRef { id }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = b.jobs.cancel(v1::JobRef { id }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let listed = b
        .jobs
        .list(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert!(listed.is_empty());
    // Nor submit as team-a, nor touch a slot other than its own.
    let mut s = spec("sneaky", 1, 100);
    s.tenant = "team-a".into();
    let e = b
        .jobs
        .submit(v1::SubmitJobRequest { spec: Some(s) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = b
        .policies
        .swap(v1::SwapPolicyRequest {
            slot: "default".into(),
            generation: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = b
        .cluster
        .add_tenant(v1::AddTenantRequest {
            name: "x".into(),
            quota_gpus: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // The admin sees everything.
    let all = admin
        .jobs
        .list(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(all.len(), 1);

    // Cancelling a running job frees it at once.
    let id2 = submit(&mut a, spec("long", 2, 60_000)).await;
    wait_state(&a, id2, v1::JobState::Running).await;
    let cancelled = a
        .jobs
        .cancel(v1::JobRef { id: id2 })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(cancelled.state, v1::JobState::Cancelled as i32);
    let e = a.jobs.cancel(v1::JobRef { id: id2 }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_status_codes() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(1)).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    let mut anonymous = client(&running, None).await;
    let mut forged = client(&running, Some("not-a-token")).await;

    let e = anonymous
        .jobs
        .list(v1::ListJobsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("authorization"), "{}", e.message());
    let e = forged
        .jobs
        .list(v1::ListJobsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    let e = admin
        .jobs
        .submit(v1::SubmitJobRequest { spec: None })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut bad = spec("odd", 3, 100);
    bad.gpus_per_worker = 2;
    let e = admin
        .jobs
        .submit(v1::SubmitJobRequest { spec: Some(bad) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("gpus_per_worker"), "{}", e.message());
    // Contract 0.3 traits: a burst limit below the request, or an unknown
    // locality, is refused; valid traits come back as submitted.
    for (limit, locality, field) in [(200, 0, "gpu_milli_limit"), (0, 3, "locality")] {
        let mut bad = spec("traits", 1, 100);
        bad.gpu_milli = 500;
        bad.gpu_milli_limit = limit;
        bad.locality = locality;
        let e = admin
            .jobs
            .submit(v1::SubmitJobRequest { spec: Some(bad) })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains(field), "{}", e.message());
    }
    let mut traits = spec("traits", 1, 100);
    traits.gpu_milli = 250;
    traits.gpu_milli_limit = 500;
    traits.locality = 2;
    traits.slo_ms = 80;
    traits.group = "nightly-eval".into();
    let id = admin
        .jobs
        .submit(v1::SubmitJobRequest {
            spec: Some(traits.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let back = admin
        .jobs
        .get(v1::JobRef { id })
        .await
        .unwrap()
        .into_inner()
        .spec
        .unwrap();
    assert_eq!(
        (
            back.gpu_milli_limit,
            back.locality,
            back.slo_ms,
            back.group.as_str()
        ),
        (500, 2, 80, "nightly-eval")
    );

    // Not a component at all.
    let e = admin
        .policies
        .upload(v1::UploadPolicyRequest {
            slot: "x".into(),
            wasm: b"\0asm not really".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("component"), "{}", e.message());
    // Oversized.
    let e = admin
        .policies
        .upload(v1::UploadPolicyRequest {
            slot: "x".into(),
            wasm: vec![0u8; (16 << 20) + 1],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("upload limit"), "{}", e.message());
    // A slot's name is what a policy's own may be: no escape codes to echo into
    // terminals, no 3,000-byte listing rows.
    for slot in ["a\u{1b}[31mred".to_string(), "s".repeat(3_000), " ".into()] {
        let e = admin
            .policies
            .upload(v1::UploadPolicyRequest {
                slot: slot.clone(),
                wasm: arbiter_policies::get("fifo").unwrap().to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{slot:?}");
        assert!(e.message().contains("printable text"), "{}", e.message());
        assert!(!e.message().contains('\u{1b}'), "{}", e.message());
    }
    for name in ["e\u{202e}vil".to_string(), "e".repeat(5_000)] {
        let e = admin
            .experiments
            .start(v1::StartExperimentRequest {
                name,
                mode: v1::ExperimentMode::Split as i32,
                candidate_slot: "x".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("experiment name"), "{}", e.message());
    }
    // A tenant-role slot refuses a scheduler-only component, and vice versa.
    let e = admin
        .policies
        .upload(v1::UploadPolicyRequest {
            slot: "default".into(),
            wasm: arbiter_policies::fixture("foreign-world")
                .map(<[u8]>::to_vec)
                .unwrap_or_default(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // A configuration the policy refuses.
    let e = admin
        .policies
        .upload(v1::UploadPolicyRequest {
            slot: "x".into(),
            wasm: arbiter_policies::get("fifo").unwrap().to_vec(),
            config: "this is = = not toml".into(),
            activate: true,
        })
        .await;
    // fifo ignores configuration it does not know, so either answer is fine,
    // but an error must be INVALID_ARGUMENT.
    if let Err(e) = e {
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    // A field this API does not know is refused, not silently dropped.
    #[derive(Clone, PartialEq, prost::Message)]
    struct SubmitWithExtra {
        #[prost(message, optional, tag = "1")]
        spec: Option<v1::JobSpec>,
        #[prost(string, tag = "99")]
        colour: String,
    }
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    raw.ready().await.unwrap();
    let mut req = tonic::Request::new(SubmitWithExtra {
        spec: Some(spec("x", 1, 100)),
        colour: "blue".into(),
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let e = raw
        .unary::<_, v1::SubmitJobResponse, _>(
            req,
            tonic::codegen::http::uri::PathAndQuery::from_static("/arbiter.v1.Jobs/Submit"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("does not know"), "{}", e.message());

    let e = admin
        .experiments
        .start(v1::StartExperimentRequest {
            name: "e".into(),
            mode: 0,
            candidate_slot: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = admin
        .experiments
        .status(v1::ExperimentRef {
            name: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_jobs_are_refused_waiting_ones_say_why_and_lists_page_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    // Two 8-GPU A100 nodes.
    let running = server(dir.path(), 2, Duration::from_secs(600)).await;
    let (mut admin, mut a, _b) = two_tenants_with_quotas(&running, 8, 0).await;
    let refused = |mut c: Client, s: v1::JobSpec| async move {
        c.jobs
            .submit(v1::SubmitJobRequest { spec: Some(s) })
            .await
            .unwrap_err()
    };
    // A worker bigger than any node, more GPUs than the cluster, a model no
    // node has, a CPU request no node can give: refused at submit, saying why.
    let mut unknown_model = spec("h100", 1, 100);
    unknown_model.gpu_models = vec!["H100".into()];
    let mut cpu = spec("cpu", 1, 100);
    cpu.cpu_milli = 4_000_000_000;
    let mut wide = spec("wide", 64, 100);
    wide.gpus_per_worker = 8;
    for (s, says) in [
        (spec("big", 16, 100), "one worker"),
        (wide, "hold 16"),
        (unknown_model, "A100-80GB"),
        (cpu, "mCPU"),
    ] {
        let e = refused(client_clone(&admin), s).await;
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("can never run") && e.message().contains(says),
            "{}",
            e.message()
        );
    }
    // A command past the limit is refused before it is stored.
    let mut long = spec("long", 1, 100);
    long.command = vec!["x".repeat(64 * 1024)];
    let e = refused(client_clone(&admin), long).await;
    assert!(
        e.message().contains("command must be at most"),
        "{}",
        e.message()
    );

    // Waiting jobs say why: a whole-cluster job waits for capacity behind
    // one that runs; a job past its tenant's quota waits in its queue.
    let first = submit(&mut admin, spec("first", 8, 600_000)).await;
    wait_state(&admin, first, v1::JobState::Running).await;
    let mut two_nodes = spec("whole", 16, 600_000);
    two_nodes.gpus_per_worker = 8;
    let whole = submit(&mut admin, two_nodes).await;
    let mine = submit(&mut a, spec("mine", 8, 600_000)).await;
    wait_state(&admin, mine, v1::JobState::Running).await;
    let over = submit(&mut a, spec("over", 1, 600_000)).await;
    let reason = |id: u64| {
        let mut c = client_clone(&admin);
        async move {
            c.jobs
                .get(v1::JobRef { id })
                .await
                .unwrap()
                .into_inner()
                .waiting_reason
        }
    };
    wait_for("the whole-cluster job to wait for capacity", || {
        let r = reason(whole);
        async move { r.await.starts_with("capacity") }
    })
    .await;
    let r = reason(over).await;
    assert!(r.starts_with("quota") && r.contains("team-a"), "{r}");
    assert_eq!(reason(first).await, "", "a running job waits for nothing");

    // Lists come newest first, a page at a time, and the pages cover every job once.
    let page = |token: String| {
        let mut c = client_clone(&admin);
        async move {
            c.jobs
                .list(v1::ListJobsRequest {
                    limit: 2,
                    page_token: token,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let (mut seen, mut token) = (Vec::new(), String::new());
    loop {
        let p = page(token).await;
        assert!(p.jobs.len() <= 2);
        seen.extend(p.jobs.iter().map(|j| j.id));
        if p.next_page_token.is_empty() {
            break;
        }
        token = p.next_page_token;
    }
    assert_eq!(seen, vec![over, mine, whole, first]);
    let e = admin
        .jobs
        .list(v1::ListJobsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_fails_the_start_before_anything_is_written() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let refused = start(ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: taken.local_addr().unwrap(),
        data: data.clone(),
        metrics_listen: None,
        plane: patient_plane(),
    })
    .await;
    let Err(e) = refused else {
        panic!("started on a port in use");
    };
    assert!(format!("{e:#}").contains("binding"), "{e:#}");
    assert!(!data.exists(), "no data directory, no tokens minted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_jobs_past_retention_leave_the_table_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let plane = || PlaneConfig {
        round_interval: Duration::from_millis(20),
        nodes: default_pool(2, 8),
        default_duration: Duration::from_millis(50),
        keep_finished: 3,
        ..patient_plane()
    };
    let running = server_with(dir.path(), plane()).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(submit(&mut admin, spec(&format!("r{i}"), 1, 50)).await);
    }
    wait_for("retention to keep only the 3 newest-ended jobs", || {
        let l = list_jobs(&admin);
        async move {
            let jobs = l.await;
            jobs.len() == 3
                && jobs
                    .iter()
                    .all(|j| j.state == v1::JobState::Succeeded as i32)
        }
    })
    .await;
    // The metrics are published with the ticks (at most 200 ms apart).
    wait_for("the metrics to count the dropped and ended jobs", || {
        let mut c = client_clone(&admin);
        async move {
            let text = metrics_text(&mut c).await;
            text.contains("arbiter_jobs_dropped_total 5")
                && text.contains("arbiter_jobs_ended_total{state=\"succeeded\"} 8")
        }
    })
    .await;
    // A dropped job is gone, not failed; the kept ones survive a restart, the dropped do not return.
    let gone = admin.jobs.get(v1::JobRef { id: ids[0] }).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    running.shutdown().await.unwrap();
    let running = server_with(dir.path(), plane()).await;
    let admin = client(&running, Some(&token)).await;
    assert_eq!(list_jobs(&admin).await.len(), 3);
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_rotates_within_its_cap_and_still_replays_exactly() {
    use arbiter_serve::journal::JournalLimits;
    let dir = tempfile::tempdir().unwrap();
    let limits = JournalLimits {
        segment_bytes: 16 << 10,
        max_bytes: 64 << 10,
    };
    let running = server_with(
        dir.path(),
        PlaneConfig {
            round_interval: Duration::from_millis(10),
            nodes: default_pool(2, 8),
            default_duration: Duration::from_millis(30),
            journal_limits: limits,
            ..patient_plane()
        },
    )
    .await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(submit(&mut admin, spec(&format!("r{i}"), 1 + i % 4, 30)).await);
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for &id in &ids {
        wait_state(&admin, id, v1::JobState::Succeeded).await;
    }
    let journal_path = running.journal_path.clone();
    running.shutdown().await.unwrap();

    let data = journal_path.parent().unwrap();
    let mut sealed = Vec::new();
    let mut total = 0u64;
    for entry in std::fs::read_dir(data).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_prefix("journal.")
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            sealed.push(n);
        }
        if name.starts_with("journal") {
            let meta = entry.metadata().unwrap();
            total += if meta.is_dir() {
                std::fs::read_dir(entry.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.metadata().unwrap().len())
                    .sum::<u64>()
            } else {
                meta.len()
            };
        }
    }
    sealed.sort();
    // At least one sealed segment is left to read across. How many fit is not
    // fixed: the cap counts the checkpoints' snapshot files too, so it depends
    // on the size of the state at each rotation, not only on the segments.
    assert!(!sealed.is_empty(), "sealed segments {sealed:?}");
    assert!(
        sealed[0] > 1,
        "the oldest segments were removed: {sealed:?}"
    );
    // Within the cap, give or take the active segment's last records.
    assert!(
        total <= limits.max_bytes + 2 * limits.segment_bytes,
        "journal of {total} bytes over its cap"
    );
    // Read across segments (the oldest were deleted: the reading starts at
    // a checkpoint) and replayed exactly.
    let journal = arbiter_serve::replay::read(&journal_path).unwrap();
    assert!(journal.skipped.is_empty(), "{:?}", journal.skipped);
    let best_fit =
        arbiter_serve::replay::compile(arbiter_policies::get("best-fit").unwrap()).unwrap();
    let exact = arbiter_serve::replay::exact(&journal, "control", &best_fit, None).unwrap();
    assert!(exact.rounds_compared > 10, "{exact:?}");
    assert!(exact.all_identical(), "{:?}", exact.mismatches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_split_ab_reports_per_arm_metrics_and_promotes() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 4, Duration::from_millis(100)).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    let a_token = add_tenant(&mut admin, "team-a", 0).await;
    let b_token = add_tenant(&mut admin, "team-b", 0).await;
    load(
        &mut admin,
        "fifo",
        arbiter_policies::get("fifo").unwrap(),
        "",
    )
    .await;
    let started = admin
        .experiments
        .start(v1::StartExperimentRequest {
            name: "bf-vs-fifo".into(),
            mode: v1::ExperimentMode::Split as i32,
            candidate_slot: "fifo".into(),
            candidate_tenants: vec!["team-b".into()],
            candidate_share: 0.5,
            guardrail: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.state, v1::ExperimentState::Running as i32);
    let arms: Vec<(String, u32)> = started
        .arms
        .iter()
        .map(|a| (a.arm.clone(), a.nodes))
        .collect();
    assert_eq!(arms, vec![("control".into(), 2), ("candidate".into(), 2)]);

    let mut a = client(&running, Some(&a_token)).await;
    let mut b = client(&running, Some(&b_token)).await;
    let specs: Vec<v1::JobSpec> = (0..12)
        .map(|i| spec(&format!("j{i}"), 1 + i % 4, 100))
        .collect();
    let ids_a = a
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: specs.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    let ids_b = b
        .jobs
        .submit_batch(v1::SubmitJobsRequest { specs })
        .await
        .unwrap()
        .into_inner()
        .ids;
    for id in ids_a.iter().chain(&ids_b) {
        let id = *id;
        wait_state(&admin, id, v1::JobState::Succeeded).await;
    }
    let job_b = b
        .jobs
        .get(v1::JobRef { id: ids_b[0] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job_b.arm, "candidate");
    let job_a = a
        .jobs
        .get(v1::JobRef { id: ids_a[0] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job_a.arm, "control");
    let s = status(&mut admin, "bf-vs-fifo").await;
    for arm in &s.arms {
        assert_eq!(arm.jobs_finished, 12, "{arm:?}");
        let q = arm.queue_delay_ms.unwrap();
        assert_eq!(q.samples, 12);
        assert!(q.ci_low <= q.mean && q.mean <= q.ci_high);
        assert!(arm.jct_ms.unwrap().mean >= 100.0);
        assert!(arm.gpu_allocation_pct.unwrap().samples > 0);
        assert_eq!(arm.policy_faults, 0);
    }
    // Experiment-arm metrics are exported (the text is published with
    // the ticks, at most 200 ms apart: wait until it counts every job).
    let finished = "arbiter_experiment_events_total{experiment=\"bf-vs-fifo\",arm=\"candidate\",event=\"finished\"} 12";
    wait_for("the metrics to count the finished jobs", || {
        let mut c = client_clone(&admin);
        async move {
            let text = metrics_text(&mut c).await;
            text.contains(finished) && text.contains("arbiter_jobs{state=\"succeeded\"} 24")
        }
    })
    .await;
    let text = metrics_text(&mut admin).await;
    assert!(
        text.contains(
            "arbiter_experiment_events_total{experiment=\"bf-vs-fifo\",arm=\"candidate\",event=\"finished\"} 12"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "arbiter_experiment_jct_seconds{experiment=\"bf-vs-fifo\",arm=\"candidate\"}"
        ),
        "{text}"
    );
    assert!(
        text.contains("arbiter_jobs{state=\"succeeded\"} 24"),
        "{text}"
    );
    assert!(
        text.contains("arbiter_jobs_ended_total{state=\"succeeded\"} 24"),
        "{text}"
    );
    assert!(
        text.contains("arbiter_tenant_quota_gpus{tenant=\"team-a\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("arbiter_node_gpus{node=\"sim-00\",state=\"ready\"} 8"),
        "{text}"
    );
    assert!(text.contains("arbiter_gpu_allocation_ratio"), "{text}");

    let promoted = admin
        .experiments
        .promote(v1::ExperimentRef {
            name: "bf-vs-fifo".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(promoted.state, v1::ExperimentState::Promoted as i32);
    let view = cluster_view(&mut admin).await;
    assert_eq!(view.active_policy, "fifo");
    assert!(view.experiment.is_empty());
    let before = status(&mut admin, "bf-vs-fifo").await;
    assert!(!before.arms.is_empty());
    running.shutdown().await.unwrap();

    // The ended experiment's final arm metrics survive a restart.
    let running = server(dir.path(), 4, Duration::from_millis(100)).await;
    let mut admin = client(&running, Some(&token)).await;
    let after = status(&mut admin, "bf-vs-fifo").await;
    assert_eq!(after, before);
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_split_measures_only_its_enrolled_jobs_and_keeps_them_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Two 8-GPU nodes and jobs that take a whole node: a backlog forms.
    let running = server(dir.path(), 2, Duration::from_millis(150)).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    load(
        &mut admin,
        "copy",
        arbiter_policies::get("best-fit").unwrap(),
        "",
    )
    .await;
    // The backlog from before the experiment: it runs in the arms but is
    // not measured (the old counters mixed it in: "91/113/121").
    let mut backlog = Vec::new();
    for i in 0..8 {
        backlog.push(submit(&mut admin, spec(&format!("old{i}"), 8, 150)).await);
    }
    let started = start_split(&mut admin, "a-a", "copy", 0.5).await;
    assert!(
        started.balance.is_some(),
        "a randomised split reports its balance"
    );
    let mut enrolled = Vec::new();
    for i in 0..24 {
        enrolled.push(submit(&mut admin, spec(&format!("new{i}"), 1 + i % 4, 100)).await);
    }
    for &id in backlog.iter().chain(&enrolled) {
        wait_state(&admin, id, v1::JobState::Succeeded).await;
    }
    // The running experiment's status is published with the ticks, at most
    // one behind the job records.
    wait_for("the arms to count every enrolled job finished", || {
        let mut admin = client_clone(&admin);
        async move {
            let s = status(&mut admin, "a-a").await;
            s.arms.iter().map(|a| a.jobs_finished).sum::<u64>() == 24
        }
    })
    .await;
    let s = status(&mut admin, "a-a").await;
    let counts: Vec<(u64, u64, u64)> = s
        .arms
        .iter()
        .map(|a| (a.jobs_submitted, a.jobs_started, a.jobs_finished))
        .collect();
    let total: u64 = counts.iter().map(|c| c.0).sum();
    assert_eq!(total, 24, "only the enrolled jobs count: {counts:?}");
    for &(submitted, started, finished) in &counts {
        assert!(submitted > 0, "both arms got jobs: {counts:?}");
        assert_eq!((started, finished), (submitted, submitted), "{counts:?}");
    }
    let balance = s.balance.unwrap();
    assert_eq!(balance.control_jobs + balance.candidate_jobs, 24);
    assert!(!balance.mismatch, "{balance:?}");
    for arm in &s.arms {
        let q = arm.queue_delay_ms.unwrap();
        assert_eq!(q.samples, arm.jobs_started);
        assert!(
            q.batches >= 2 && q.ci_low <= q.mean && q.mean <= q.ci_high,
            "{q:?}"
        );
    }
    let comparison = s
        .comparison
        .clone()
        .expect("a comparison once both arms have batches");
    assert_eq!(comparison.metric, "queue_delay");
    assert!(
        comparison.ci_low <= comparison.difference && comparison.difference <= comparison.ci_high
    );
    running.shutdown().await.unwrap();

    // After a restart the job statistics are what they were (rebuilt from
    // the jobs), the round statistics at least what they were.
    let running = server(dir.path(), 2, Duration::from_millis(150)).await;
    let mut admin = client(&running, Some(&token)).await;
    let after = status(&mut admin, "a-a").await;
    assert_eq!(after.balance, s.balance);
    for (a, b) in after.arms.iter().zip(&s.arms) {
        assert_eq!(
            (
                a.jobs_submitted,
                a.jobs_started,
                a.jobs_finished,
                a.preemptions
            ),
            (
                b.jobs_submitted,
                b.jobs_started,
                b.jobs_finished,
                b.preemptions
            )
        );
        assert_eq!(a.queue_delay_ms, b.queue_delay_ms);
        assert_eq!(a.jct_ms, b.jct_ms);
        assert!(a.gpu_allocation_pct.unwrap().samples >= b.gpu_allocation_pct.unwrap().samples);
    }
    // The evidence the guardrail had is not forgotten.
    let p_after = after.comparison.map_or(1.0, |c| c.always_valid_p);
    assert!(
        p_after <= comparison.always_valid_p,
        "{p_after} > {}",
        comparison.always_valid_p
    );
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_diffs_placements_without_enforcing_them() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(60)).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    load(
        &mut admin,
        "fifo",
        arbiter_policies::get("fifo").unwrap(),
        "",
    )
    .await;
    admin
        .experiments
        .start(v1::StartExperimentRequest {
            name: "shadow".into(),
            mode: v1::ExperimentMode::Shadow as i32,
            candidate_slot: "fifo".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // After A (4 GPUs) on sim-00 and B (6) on sim-01, a 2-GPU job fits the
    // first node for first-fit but the fuller one for best-fit.
    let ids = admin
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: vec![spec("a", 4, 0), spec("b", 6, 0), spec("c", 2, 0)],
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    for id in ids.clone() {
        wait_state(&admin, id, v1::JobState::Running).await;
    }
    let c = admin
        .jobs
        .get(v1::JobRef { id: ids[2] })
        .await
        .unwrap()
        .into_inner();
    // Enforced: best-fit's choice (the node with 2 GPUs left).
    assert_eq!(c.node, "sim-01");
    let mut s = status(&mut admin, "shadow").await;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        if s.shadow
            .as_ref()
            .is_some_and(|sh| sh.placements_differing > 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = status(&mut admin, "shadow").await;
    }
    let sh = s.shadow.unwrap();
    assert!(sh.rounds > 0);
    assert_eq!(sh.candidate_faults, 0);
    let diff = sh
        .recent
        .iter()
        .find(|d| d.job_name.starts_with("c#"))
        .unwrap_or_else(|| panic!("no diff for c: {:?}", sh.recent));
    assert!(diff.incumbent.starts_with("sim-01["), "{diff:?}");
    assert!(diff.candidate.starts_with("sim-00["), "{diff:?}");
    // Three jobs at most can differ, however many rounds go by.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sh = status(&mut admin, "shadow").await.shadow.unwrap();
    assert!(
        (1..=3).contains(&sh.jobs_differing),
        "{} jobs differing of 3 submitted",
        sh.jobs_differing
    );
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guardrail_rolls_a_faulting_candidate_back() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_millis(100)).await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    let bad = arbiter_policies::fixture("misbehave").unwrap();
    load(&mut admin, "bad", bad, "mode = trap").await;
    admin
        .experiments
        .start(v1::StartExperimentRequest {
            name: "risky".into(),
            mode: v1::ExperimentMode::Split as i32,
            candidate_slot: "bad".into(),
            candidate_share: 0.5,
            guardrail: Some(v1::Guardrail {
                metric: "faults".into(),
                max_faults: 3,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    // Jobs keep running meanwhile: the candidate arm falls back to native fifo.
    let ids = admin
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: (0..6).map(|i| spec(&format!("j{i}"), 1, 100)).collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    let mut s = status(&mut admin, "risky").await;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        if s.state != v1::ExperimentState::Running as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = status(&mut admin, "risky").await;
    }
    assert_eq!(s.state, v1::ExperimentState::RolledBack as i32, "{s:?}");
    assert!(s.reason.contains("faulted"), "{}", s.reason);
    for id in ids {
        wait_state(&admin, id, v1::JobState::Succeeded).await;
    }
    // The default policy is untouched.
    let view = cluster_view(&mut admin).await;
    assert_eq!(view.active_policy, "best-fit");
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_holds_across_both_arms_and_ending_a_split_evicts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 4, Duration::from_secs(600)).await;
    let (mut admin, mut a, _b) = two_tenants_with_quotas(&running, 16, 0).await;
    load(
        &mut admin,
        "copy",
        arbiter_policies::get("best-fit").unwrap(),
        "",
    )
    .await;
    start_split(&mut admin, "split", "copy", 0.5).await;
    // 24 GPUs asked for against a quota of 16, on 32 GPUs in two arms of 16.
    let ids = a
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: (0..6).map(|i| spec(&format!("q{i}"), 4, 600_000)).collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    let running_jobs = |jobs: &[v1::Job]| -> Vec<v1::Job> {
        jobs.iter()
            .filter(|j| j.state == v1::JobState::Running as i32)
            .cloned()
            .collect()
    };
    wait_for("four of the tenant's jobs to run", || {
        let l = list_jobs(&admin);
        async move { running_jobs(&l.await).len() == 4 }
    })
    .await;
    // A few more rounds: nothing more starts in either arm.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let jobs = list_jobs(&admin).await;
    let on = running_jobs(&jobs);
    let held: u32 = on
        .iter()
        .map(|j| j.spec.as_ref().map_or(0, |s| s.gpus))
        .sum();
    assert_eq!(held, 16, "the quota holds across both arms: {on:?}");
    // Ending the experiment keeps every running job where it is.
    admin
        .experiments
        .abort(v1::ExperimentRef {
            name: "split".into(),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = list_jobs(&admin).await;
    for j in &on {
        let now = after.iter().find(|k| k.id == j.id).unwrap();
        assert_eq!(now.state, v1::JobState::Running as i32, "{now:?}");
        assert_eq!(now.preemptions, 0, "ending the split evicted {now:?}");
        assert_eq!(now.node, j.node, "{now:?}");
    }
    assert_eq!(running_jobs(&after).len(), 4);
    assert_eq!(ids.len(), 6);
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_policy_orders_its_own_queue_within_quota() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(600)).await;
    let (_admin, mut a, mut b) = two_tenants_with_quotas(&running, 4, 0).await;
    let wasm = arbiter_policies::fixture("tenant-deadline-first").unwrap();
    // Another tenant cannot load into team-a's slot.
    let e = b
        .policies
        .upload(v1::UploadPolicyRequest {
            slot: "tenant:team-a".into(),
            wasm: wasm.to_vec(),
            activate: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // A tenant's upload lands in its own slot by default.
    let g = load(&mut a, "", wasm, "").await;
    assert!(g.roles.contains(&"tenant".to_string()), "{g:?}");
    let slot = describe(&mut a, "tenant:team-a").await;
    assert_eq!(slot.generations.len(), 1);

    let mut late = spec("late", 2, 600_000);
    // Deadlines all reachable (10 min run time): none is hopeless.
    late.deadline_ms = 36_000_000;
    let mut urgent = spec("urgent", 2, 600_000);
    urgent.deadline_ms = 1_800_000;
    let mut mid = spec("mid", 2, 600_000);
    mid.deadline_ms = 3_600_000;
    let ids = a
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: vec![late, urgent, mid],
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    for id in [ids[1], ids[2]] {
        wait_state(&a, id, v1::JobState::Running).await;
    }
    // Quota 4 GPUs: the latest deadline waits in the tenant's queue.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(job_state(&mut a, ids[0]).await, v1::JobState::Queued);
    // Cancelling one frees quota and the waiting job is released.
    a.jobs.cancel(v1::JobRef { id: ids[1] }).await.unwrap();
    wait_state(&a, ids[0], v1::JobState::Running).await;

    // Its policy is the tenant's to drop, and no other tenant's.
    let unload = v1::UnloadPolicyRequest {
        slot: "tenant:team-a".into(),
        generation: 0,
    };
    let e = b.policies.unload(unload.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let gone = a.policies.unload(unload).await.unwrap().into_inner();
    assert!(gone.generations.is_empty());
    // Without it the tenant's jobs still run, in submission order within quota.
    let after = submit(&mut a, spec("after", 1, 600_000)).await;
    a.jobs.cancel(v1::JobRef { id: ids[2] }).await.unwrap();
    wait_state(&a, after, v1::JobState::Running).await;
    running.shutdown().await.unwrap();
}

/// Regression: one tenant submitting past its GPU quota used to stop
/// scheduling for the whole cluster (admission released every queued job,
/// the scheduler placed them, the validator refused the round, the native
/// fallback too, for ever). And a tenant policy that traps must neither stall
/// its tenant nor go unnoticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_quota_or_with_a_trapping_policy_never_stalls_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(600)).await;
    let (mut admin, mut a, mut b) = two_tenants_with_quotas(&running, 2, 2).await;
    let trap = load(
        &mut b,
        "",
        arbiter_policies::fixture("misbehave").unwrap(),
        "mode = trap",
    )
    .await;
    let mut a_ids = Vec::new();
    let mut b_ids = Vec::new();
    for i in 0..3 {
        a_ids.push(submit(&mut a, spec(&format!("a{i}"), 1, 600_000)).await);
        b_ids.push(submit(&mut b, spec(&format!("b{i}"), 1, 600_000)).await);
    }
    let admin_job = submit(&mut admin, spec("admin", 1, 600_000)).await;
    wait_state(&admin, admin_job, v1::JobState::Running).await;
    for id in [a_ids[0], a_ids[1], b_ids[0], b_ids[1]] {
        wait_state(&admin, id, v1::JobState::Running).await;
    }
    // Rounds go on; the jobs past the quota wait in their tenants' queues.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(job_state(&mut a, a_ids[2]).await, v1::JobState::Queued);
    assert_eq!(job_state(&mut b, b_ids[2]).await, v1::JobState::Queued);
    let late = submit(&mut admin, spec("admin-late", 2, 600_000)).await;
    wait_state(&admin, late, v1::JobState::Running).await;
    // The scheduler never saw a job it would have to refuse.
    let default = describe(&mut admin, "default").await;
    assert!(
        default
            .generations
            .iter()
            .all(|g| g.faults == 0 && !g.quarantined),
        "{default:?}"
    );
    // The trapping tenant policy is quarantined, and shows it.
    let view = cluster_view(&mut admin).await;
    let q = view
        .quarantined
        .iter()
        .find(|q| q.slot == "tenant:team-b")
        .unwrap_or_else(|| panic!("team-b's policy is not shown quarantined: {view:?}"));
    assert_eq!(q.generation, trap.id);
    assert!(
        q.active && q.faults >= 3 && q.last_fault.contains("trap"),
        "{q:?}"
    );
    let gauge = format!(
        "arbiter_policy_quarantined{{slot=\"tenant:team-b\",generation=\"{}\"}} 1",
        trap.id
    );
    // (The metrics text trails the view by up to 200 ms.)
    wait_for("the quarantine gauge", || {
        let mut c = client_clone(&admin);
        let gauge = gauge.clone();
        async move { metrics_text(&mut c).await.contains(&gauge) }
    })
    .await;
    let metrics = metrics_text(&mut admin).await;
    assert!(metrics.contains(&gauge), "{metrics}");
    // Freed quota still releases the tenant's next job, in submit order.
    b.jobs.cancel(v1::JobRef { id: b_ids[0] }).await.unwrap();
    wait_state(&b, b_ids[2], v1::JobState::Running).await;
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_swap_rollback_stats_drain_abort_hash_split_metrics_and_reflection() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        data: dir.path().to_path_buf(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        plane: PlaneConfig {
            round_interval: Duration::from_millis(20),
            nodes: default_pool(4, 8),
            default_duration: Duration::from_millis(100),
            ..patient_plane()
        },
    })
    .await
    .unwrap();
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;

    // Watch sees a job's life.
    let mut watch = admin
        .jobs
        .watch(v1::WatchJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let id = submit(&mut admin, spec("watched", 1, 100)).await;
    let mut seen = Vec::new();
    while !seen.contains(&(v1::JobState::Succeeded as i32)) {
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("watch went quiet")
            .unwrap()
            .unwrap();
        let job = ev.job.unwrap();
        if job.id == id {
            seen.push(job.state);
            // An event is sent once its change can be read: the job reads
            // as it says, or as it went on since (states only move forward).
            let now = admin
                .jobs
                .get(v1::JobRef { id })
                .await
                .unwrap()
                .into_inner();
            assert!(
                now.state >= job.state,
                "read {now:?} after the event {job:?}"
            );
        }
    }
    assert_eq!(
        seen,
        [
            v1::JobState::Queued,
            v1::JobState::Pending,
            v1::JobState::Running,
            v1::JobState::Succeeded
        ]
        .map(|s| s as i32)
    );

    // Swap to a new generation of the default slot, then roll back.
    let g2 = load(
        &mut admin,
        "default",
        arbiter_policies::get("fifo").unwrap(),
        "",
    )
    .await;
    assert!(g2.active);
    let rolled = admin
        .policies
        .rollback(v1::RollbackPolicyRequest {
            slot: "default".into(),
            generation: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let active: Vec<_> = rolled.generations.iter().filter(|g| g.active).collect();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].name, "best-fit");
    let swapped = admin
        .policies
        .swap(v1::SwapPolicyRequest {
            slot: "default".into(),
            generation: g2.id,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        swapped
            .generations
            .iter()
            .any(|g| g.id == g2.id && g.active)
    );
    let e = admin
        .policies
        .swap(v1::SwapPolicyRequest {
            slot: "default".into(),
            generation: 999,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let stats = policy_stats(&mut admin, "default").await;
    assert!(stats.rounds > 0);
    assert!(stats.latency_p99_ms >= stats.latency_p50_ms);

    // Drain a node: nothing new lands there.
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut nodes = v1::nodes_client::NodesClient::with_interceptor(
        channel.clone(),
        Bearer(Some(format!("Bearer {token}").parse().unwrap())),
    );
    let drained = nodes
        .drain(v1::DrainNodeRequest {
            name: "sim-00".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(drained.state, "draining");
    let e = nodes
        .drain(v1::DrainNodeRequest {
            name: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // A hash split sends about its share of jobs to the candidate; abort ends it.
    load(&mut admin, "sjf", arbiter_policies::get("sjf").unwrap(), "").await;
    start_split(&mut admin, "hash", "sjf", 0.25).await;
    let ids = admin
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: (0..200).map(|i| spec(&format!("h{i}"), 1, 50)).collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    let last = *ids.last().unwrap();
    wait_for("the batch to be released", || {
        let mut admin = client_clone(&admin);
        async move { job_state(&mut admin, last).await != v1::JobState::Queued }
    })
    .await;
    let jobs = admin
        .jobs
        .list(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let candidate = jobs
        .iter()
        .filter(|j| ids.contains(&j.id) && j.arm == "candidate")
        .count();
    assert!(
        (25..=75).contains(&candidate),
        "{candidate} of 200 routed to a 25% arm"
    );
    let aborted = admin
        .experiments
        .abort(v1::ExperimentRef {
            name: "hash".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(aborted.state, v1::ExperimentState::Aborted as i32);
    let listed = admin
        .experiments
        .list(v1::ListExperimentsRequest {})
        .await
        .unwrap()
        .into_inner()
        .experiments;
    assert_eq!(listed.len(), 1);

    // Prometheus over HTTP.
    let addr = running.metrics_addr.unwrap();
    let body = http_get(addr, "/metrics").await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("# TYPE arbiter_round_seconds histogram"));
    assert!(
        body.lines()
            .any(|l| l.starts_with("arbiter_policy_seconds_bucket{")
                && l.contains("slot=\"default\"")),
        "{body}"
    );
    assert!(body.contains("application/openmetrics-text"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    // Liveness over HTTP, and the standard gRPC health service.
    let health = http_get(addr, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let mut grpc_health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let mut status = 0;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        status = grpc_health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_or(0, |r| r.into_inner().status);
        if status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // Reflection lists the services for generic clients, in both versions
    // clients speak (v1, and v1alpha for older grpcurl and Python grpcio).
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "arbiter.v1.Jobs",
        "arbiter.v1.Policies",
        "arbiter.v1.Experiments",
        "arbiter.v1.NodeLink",
        "grpc.health.v1.Health",
    ] {
        assert!(names.iter().any(|n| n == service), "{names:?}");
    }
    {
        use tonic_reflection::pb::v1alpha::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let mut alpha = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let answer = alpha
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner()
            .message()
            .await
            .unwrap()
            .unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("unexpected v1alpha reflection answer");
        };
        assert!(list.service.iter().any(|s| s.name == "arbiter.v1.Jobs"));
    }
    running.shutdown().await.unwrap();
}

/// A job's tenant reports what it has left; the policies' view of the job
/// (contract 0.2 `job-progress`) carries it. Nobody else may report, and an
/// ended job takes no reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_report_progress_that_policies_see() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let (_admin, mut a, mut b) = two_tenants(&running).await;
    let id = submit(&mut a, spec("long", 2, 600_000)).await;
    wait_state(&a, id, v1::JobState::Running).await;

    let p = a
        .jobs
        .report_progress(v1::ReportProgressRequest {
            id,
            remaining_ms: 45_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((p.remaining_ms, p.remaining_workers), (45_000, 1));
    assert!(p.started_ms > 0 && p.reported_ms >= p.started_ms, "{p:?}");

    let e = b
        .jobs
        .report_progress(v1::ReportProgressRequest {
            id,
            remaining_ms: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    a.jobs.cancel(v1::JobRef { id }).await.unwrap();
    let e = a
        .jobs
        .report_progress(v1::ReportProgressRequest {
            id,
            remaining_ms: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    running.shutdown().await.unwrap();
}

/// Reported progress lives in the cell, and survives the cell being
/// rebuilt: here by a restart of the server on the same data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_progress_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    let (admin, mut a, _) = two_tenants(&running).await;
    let id = submit(&mut a, spec("long", 1, 600_000)).await;
    wait_state(&a, id, v1::JobState::Running).await;
    a.jobs
        .report_progress(v1::ReportProgressRequest {
            id,
            remaining_ms: 90_000,
        })
        .await
        .unwrap();
    let shown = a.jobs.get(v1::JobRef { id }).await.unwrap().into_inner();
    let p = shown.progress.expect("a running job has progress");
    assert!(p.remaining_ms == 90_000 && p.started_ms > 0, "{p:?}");
    drop((admin, a));
    running.shutdown().await.unwrap();

    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let admin = client(&running, Some(&admin_token)).await;
    wait_for("the job to run again with its progress", || {
        let mut c = client_clone(&admin);
        async move {
            let j = c.jobs.get(v1::JobRef { id }).await;
            j.ok()
                .and_then(|j| j.into_inner().progress)
                .is_some_and(|p| p.started_ms > 0 && p.remaining_ms > 0 && p.remaining_ms <= 90_000)
        }
    })
    .await;
    running.shutdown().await.unwrap();
}

/// An inference job's tenant reports its load; the job shows it, it survives
/// a restart, and bad reports are refused: another tenant's job, a job that
/// is not a service, a rate that is not a finite number, p50 above p99.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_report_their_load_and_it_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    let (admin, mut a, mut b) = two_tenants(&running).await;
    let service = submit(
        &mut a,
        v1::JobSpec {
            kind: 1,
            min_workers: 1,
            max_workers: 3,
            slo_ms: 128,
            ..spec("serving", 1, 600_000)
        },
    )
    .await;
    let training = submit(&mut a, spec("train", 1, 600_000)).await;
    wait_state(&a, service, v1::JobState::Running).await;
    let report = |id: u64, rps: f32, p50: u32, p99: u32| v1::ReportServiceRequest {
        id,
        requests_per_s: rps,
        p50_latency_ms: p50,
        p99_latency_ms: p99,
    };
    let load = a
        .jobs
        .report_service(report(service, 42.5, 30, 95))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            load.requests_per_s,
            load.p50_latency_ms,
            load.p99_latency_ms
        ),
        (42.5, 30, 95)
    );
    assert!(load.reported_ms > 0);
    let shown = a
        .jobs
        .get(v1::JobRef { id: service })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shown.service, Some(load));
    let spec_shown = shown.spec.expect("spec");
    assert_eq!(
        (
            spec_shown.kind,
            spec_shown.min_workers,
            spec_shown.max_workers
        ),
        (1, 1, 3)
    );
    assert_eq!(shown.workers, 1);

    let code = |r: Result<tonic::Response<v1::ServiceLoad>, tonic::Status>| r.unwrap_err().code();
    assert_eq!(
        code(b.jobs.report_service(report(service, 1.0, 1, 1)).await),
        Code::NotFound
    );
    assert_eq!(
        code(a.jobs.report_service(report(training, 1.0, 1, 1)).await),
        Code::FailedPrecondition
    );
    for bad in [
        report(service, f32::NAN, 1, 1),
        report(service, -1.0, 1, 1),
        report(service, 1.0, 9, 1),
    ] {
        assert_eq!(
            code(a.jobs.report_service(bad).await),
            Code::InvalidArgument
        );
    }
    // Two workers of one GPU: bounds must hold 1 <= min <= 2 <= max.
    for (min, max, accepted) in [(1, 4, true), (0, 0, true), (3, 0, false), (0, 1, false)] {
        let e = a
            .jobs
            .submit(v1::SubmitJobRequest {
                spec: Some(v1::JobSpec {
                    gpus_per_worker: 1,
                    min_workers: min,
                    max_workers: max,
                    ..spec(&format!("bounds-{min}-{max}"), 2, 1_000)
                }),
            })
            .await;
        assert_eq!(e.is_ok(), accepted, "min {min} max {max}: {e:?}");
        if let Err(e) = e {
            assert_eq!(e.code(), Code::InvalidArgument);
        }
    }
    drop((admin, a, b));
    running.shutdown().await.unwrap();

    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let admin = client(&running, Some(&admin_token)).await;
    wait_for("the service to run again with its load", || {
        let mut c = client_clone(&admin);
        async move {
            let j = c.jobs.get(v1::JobRef { id: service }).await;
            j.ok().is_some_and(|j| {
                let j = j.into_inner();
                j.state == v1::JobState::Running as i32
                    && j.service.is_some_and(|s| s.requests_per_s == 42.5)
            })
        }
    })
    .await;
    running.shutdown().await.unwrap();
}

async fn node(c: &mut Client, name: &str) -> v1::NodeInfo {
    c.nodes
        .list(v1::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes
        .into_iter()
        .find(|n| n.name == name)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_takes_lent_nodes_back_through_the_reclaim_driver() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(3600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&admin_token)).await;
    // Nothing is on loan yet: a reclaim is refused, not guessed.
    let err = reclaim_one(&mut admin).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let lent = lend(&mut admin, "sim-01").await;
    assert!(lent.on_loan);
    // Two whole-node jobs: one on each node.
    let a = submit(&mut admin, spec("a", 8, 3_600_000)).await;
    let b = submit(&mut admin, spec("b", 8, 3_600_000)).await;
    wait_state(&admin, a, v1::JobState::Running).await;
    wait_state(&admin, b, v1::JobState::Running).await;
    let on_lent = |j: &v1::Job| j.node == "sim-01";
    let jobs = |c: &mut Client| {
        let mut c = client_clone(c);
        async move {
            let mut out = Vec::new();
            for id in [a, b] {
                out.push(c.jobs.get(v1::JobRef { id }).await.unwrap().into_inner());
            }
            out
        }
    };
    let before = jobs(&mut admin).await;
    let victim = before
        .iter()
        .find(|j| on_lent(j))
        .expect("a job on sim-01")
        .id;
    let kept = if victim == a { b } else { a };

    // best-fit has no reclaim role: the host's Smallest-Count-First plan.
    let r = reclaim_one(&mut admin).await.unwrap().into_inner();
    assert_eq!(r.returned, ["sim-01"]);
    assert_eq!(r.preempted, [victim]);
    assert_eq!(r.served, "native");
    // The preempted job is back to pending and stays there: the returned
    // node is cordoned, the other node is full.
    wait_state(&admin, victim, v1::JobState::Pending).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(job_state(&mut admin, victim).await, v1::JobState::Pending);
    assert_eq!(job_state(&mut admin, kept).await, v1::JobState::Running);
    let sim1 = node(&mut admin, "sim-01").await;
    assert_eq!((sim1.state.as_str(), sim1.on_loan), ("reclaimed", false));
    // Lent again, the node takes the job back.
    lend(&mut admin, "sim-01").await;
    wait_state(&admin, victim, v1::JobState::Running).await;

    // The decision journal still replays exactly across the reclaim: the
    // events it applied between rounds reached the next round's delta.
    running.plane.lock().await.flush_journal().unwrap();
    let journal = arbiter_serve::replay::read(&running.journal_path).unwrap();
    let best_fit =
        arbiter_serve::replay::compile(arbiter_policies::get("best-fit").unwrap()).unwrap();
    let exact = arbiter_serve::replay::exact(&journal, "control", &best_fit, None).unwrap();
    assert!(exact.rounds_compared > 0);
    assert!(exact.mismatches.is_empty(), "{:?}", exact.mismatches);
    assert_eq!(exact.rounds_identical, exact.rounds_compared);

    // Loans are durable: take sim-01 back again, restart on the same data
    // directory, and it is still reclaimed, not on loan, and not used.
    let r = reclaim_one(&mut admin).await.unwrap().into_inner();
    assert_eq!(r.returned, ["sim-01"]);
    drop(admin);
    running.shutdown().await.unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(3600)).await;
    let mut admin = client(&running, Some(&admin_token)).await;
    let sim1 = node(&mut admin, "sim-01").await;
    assert_eq!((sim1.state.as_str(), sim1.on_loan), ("reclaimed", false));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let j = admin
        .jobs
        .get(v1::JobRef { id: victim })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        j.node, "sim-01",
        "a reclaimed node runs nothing after a restart"
    );
    running.shutdown().await.unwrap();
}

/// The `reclaim` slot answers reclaims for the cells: the operator keeps
/// `best-fit` scheduling and has Aryl choose what goes back. It takes only a
/// policy with the role, and is no experiment's candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reclaim_slot_chooses_what_goes_back_for_the_cells_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(3600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&admin_token)).await;
    let fifo = arbiter_policies::get("fifo").unwrap();
    let e = upload(&mut admin, "reclaim", fifo, "").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("`reclaim` role"), "{}", e.message());
    let aryl = load(
        &mut admin,
        "reclaim",
        arbiter_policies::get("aryl").unwrap(),
        "",
    )
    .await;
    let e = admin
        .experiments
        .start(v1::StartExperimentRequest {
            name: "e".into(),
            mode: v1::ExperimentMode::Split as i32,
            candidate_slot: "reclaim".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("does not schedule"), "{}", e.message());

    lend(&mut admin, "sim-01").await;
    let a = submit(&mut admin, spec("a", 8, 3_600_000)).await;
    let b = submit(&mut admin, spec("b", 8, 3_600_000)).await;
    wait_state(&admin, a, v1::JobState::Running).await;
    wait_state(&admin, b, v1::JobState::Running).await;
    let mut victim = None;
    for id in [a, b] {
        let j = admin
            .jobs
            .get(v1::JobRef { id })
            .await
            .unwrap()
            .into_inner();
        if j.node == "sim-01" {
            victim = Some(id);
        }
    }
    let r = reclaim_one(&mut admin).await.unwrap().into_inner();
    assert_eq!(r.returned, ["sim-01"]);
    assert_eq!(r.preempted, [victim.expect("a job on sim-01")]);
    assert_eq!((r.slot.as_str(), r.served.as_str()), ("reclaim", "active"));
    assert!(r.faults.is_empty(), "{:?}", r.faults);
    let reclaim = describe(&mut admin, "reclaim").await;
    let answered = reclaim
        .generations
        .iter()
        .find(|g| g.id == aryl.id)
        .unwrap();
    assert!(answered.active && answered.faults == 0, "{answered:?}");
    assert_eq!(answered.rounds_served, 1, "its answers are counted");
    // It runs no cell's rounds; `default` runs the one cell's.
    assert_eq!(policy_stats(&mut admin, "reclaim").await.cells, 0);
    assert_eq!(policy_stats(&mut admin, "default").await.cells, 1);
    // The cell's scheduler was not asked, and not blamed.
    let default = describe(&mut admin, "default").await;
    assert!(default.generations.iter().all(|g| g.faults == 0));

    // Unloaded, the slot is gone (across a restart too) and the cell's own
    // slot answers again; the scheduler's active generation stays put.
    let unload = |slot: &str, generation: u64| v1::UnloadPolicyRequest {
        slot: slot.into(),
        generation,
    };
    let active = default.generations.iter().find(|g| g.active).unwrap().id;
    let e = admin
        .policies
        .unload(unload("default", 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = admin
        .policies
        .unload(unload("default", active))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = admin
        .policies
        .unload(unload("reclaim", aryl.id + 100))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let emptied = admin
        .policies
        .unload(unload("reclaim", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (emptied.slot.as_str(), emptied.generations.len()),
        ("reclaim", 0)
    );
    drop(admin);
    running.shutdown().await.unwrap();
    let running = server(dir.path(), 2, Duration::from_secs(3600)).await;
    let mut admin = client(&running, Some(&admin_token)).await;
    let e = admin
        .policies
        .describe(v1::SlotRef {
            slot: "reclaim".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    lend(&mut admin, "sim-01").await;
    let r = reclaim_one(&mut admin).await.unwrap().into_inner();
    assert_eq!((r.slot.as_str(), r.served.as_str()), ("default", "native"));
    running.shutdown().await.unwrap();
}

/// A generation's configuration reaches the journal, and replay uses it:
/// `random` loaded with `seed = 7` replays bit for bit from the journal
/// alone, the same component under its default seed does not, and the
/// counterfactual runs both sides with the journaled configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_runs_the_configuration_the_journal_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 8, Duration::from_secs(3600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&admin_token)).await;
    let random = arbiter_policies::get("random").unwrap();
    let g = load(&mut admin, "default", random, "seed = 7\n").await;
    assert!(g.id > 0);
    let ids = admin
        .jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: (0..12)
                .map(|i| spec(&format!("r{i}"), 1, 3_600_000))
                .collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    for id in ids {
        wait_state(&admin, id, v1::JobState::Running).await;
    }
    running.plane.lock().await.flush_journal().unwrap();
    let journal = arbiter_serve::replay::read(&running.journal_path).unwrap();
    let compiled = arbiter_serve::replay::compile(random).unwrap();
    assert_eq!(
        arbiter_serve::replay::journaled_config(&journal, "control", &compiled.digest).as_deref(),
        Some("seed = 7\n")
    );
    // No configuration given: the journaled one, and every round matches.
    let exact = arbiter_serve::replay::exact(&journal, "control", &compiled, None).unwrap();
    assert!(exact.rounds_compared > 0);
    assert!(exact.mismatches.is_empty(), "{:?}", exact.mismatches);
    // The default seed places twelve jobs on 64 GPUs differently.
    let other =
        arbiter_serve::replay::exact(&journal, "control", &compiled, Some("seed = 42\n")).unwrap();
    assert!(
        !other.mismatches.is_empty(),
        "seed 42 replayed seed 7's rounds"
    );
    let c = arbiter_serve::replay::counterfactual(
        &journal,
        "control",
        arbiter_serve::replay::Contender {
            label: "random",
            policy: &compiled,
            config: None,
        },
        arbiter_serve::replay::Contender {
            label: "random seed 42",
            policy: &compiled,
            config: Some("seed = 42\n"),
        },
    )
    .unwrap();
    assert_eq!(c.jobs, 12);
    running.shutdown().await.unwrap();
}

/// Issue 14 (3): after a restart, `policy swap cand 5` must mean the same
/// policy as before it, and the journal's and metrics' generation ids too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_ids_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&admin_token)).await;
    // Eleven loads into a slot that keeps eight: the kept ids start at 4,
    // not 1 (what a restart used to renumber them to). A second slot keeps
    // its own ids.
    for (i, name) in ["fifo", "sjf", "best-fit", "fifo"]
        .iter()
        .cycle()
        .take(11)
        .enumerate()
    {
        let wasm = arbiter_policies::get(name).unwrap();
        load(&mut admin, "cand", wasm, "").await;
        if i % 4 == 0 {
            load(&mut admin, "other", wasm, "").await;
        }
    }
    let ids = |slot: v1::SlotInfo| -> Vec<(u64, String, bool)> {
        slot.generations
            .into_iter()
            .map(|g| (g.id, g.digest, g.active))
            .collect()
    };
    let before = ids(describe(&mut admin, "cand").await);
    let other_before = ids(describe(&mut admin, "other").await);
    assert_eq!(before.len(), 8, "the slot keeps 8 of 11: {before:?}");
    drop(admin);
    running.shutdown().await.unwrap();

    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let mut admin = client(&running, Some(&admin_token)).await;
    assert_eq!(ids(describe(&mut admin, "cand").await), before);
    assert_eq!(ids(describe(&mut admin, "other").await), other_before);
    let newest = before.iter().map(|g| g.0).max().unwrap();
    let next = load(
        &mut admin,
        "cand",
        arbiter_policies::get("sjf").unwrap(),
        "",
    )
    .await;
    assert!(next.id > newest, "{} after {newest}", next.id);
    running.shutdown().await.unwrap();
}

/// Contract 0.3: with sharing on, only guaranteed work consumes a tenant's
/// quota — at admission as in the validator. A tenant at its quota still
/// runs opportunistic work (AntMan: quota-less jobs run opportunistically),
/// while its next guaranteed job waits in its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opportunistic_work_runs_past_a_full_quota_when_sharing_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let running = server_with(
        dir.path(),
        PlaneConfig {
            nodes: default_pool(1, 8),
            default_duration: Duration::from_secs(600),
            sharing: arbiter_policy_sdk::model::SharingRules {
                oversub_milli: 1000,
                max_shared_workers: 0,
                host_spill: true,
            },
            ..patient_plane()
        },
    )
    .await;
    let (admin, mut a, _b) = two_tenants_with_quotas(&running, 1, 1).await;
    let first = submit(&mut a, spec("first", 1, 600_000)).await;
    wait_state(&admin, first, v1::JobState::Running).await;
    let second = submit(&mut a, spec("second", 1, 600_000)).await;
    let mut opp = spec("opp", 1, 600_000);
    opp.qos = 1;
    opp.gpu_memory_mib = 2_048;
    let opp = submit(&mut a, opp).await;
    wait_state(&admin, opp, v1::JobState::Running).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(job_state(&mut a, second).await, v1::JobState::Queued);
    running.shutdown().await.unwrap();
}

/// Issue 14, item 4: a data directory whose store was lost or emptied is
/// refused, not silently re-initialised with new tokens over the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_store_is_refused_not_reinitialised() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    submit(&mut admin, spec("before", 1, 600_000)).await;
    running.shutdown().await.unwrap();
    let admin_token = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();

    std::fs::remove_file(dir.path().join("arbiter.redb")).unwrap();
    let refused = arbiter_serve::server::start(ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        data: dir.path().to_path_buf(),
        metrics_listen: None,
        plane: patient_plane(),
    })
    .await
    .err()
    .expect("a lost store must be refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains("admin.token") && message.contains("lost"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("admin.token")).unwrap(),
        admin_token,
        "the old token is left alone"
    );

    // Moving the old files away starts afresh, as the message says.
    for f in ["admin.token", "node.token", "journal.jsonl"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    let fresh = server(dir.path(), 1, Duration::from_secs(600)).await;
    assert!(fresh.new_admin_token.is_some());
    fresh.shutdown().await.unwrap();
}

/// The `matcher` slot takes matchers only; a pure matcher loaded without a slot lands there,
/// and a scheduler cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_matcher_slot_takes_matchers_only() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let mut admin = client(&running, running.new_admin_token.as_deref()).await;
    let best_fit = arbiter_policies::get("best-fit").unwrap();
    let e = upload(&mut admin, "matcher", best_fit, "")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("matcher"), "{}", e.message());
    let matcher = arbiter_policies::get("greedy-matcher").unwrap();
    load(&mut admin, "", matcher, "").await;
    let slot = describe(&mut admin, "matcher").await;
    assert!(
        slot.generations
            .iter()
            .any(|g| g.name == "greedy-matcher" && g.active),
        "{slot:?}"
    );
    running.shutdown().await.unwrap();
}

/// Reads never wait on the plane: with its lock held — as a round holds it
/// while a slow scheduler policy runs to its deadline — authentication, a
/// job, a page of jobs, the cluster view, the nodes, the metrics, the policy
/// slots and their statistics, the tenants and the experiments are all
/// answered, and they show the writes made before. A write waits for the
/// lock and, once it is free, is read back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_answered_while_the_plane_is_busy_and_show_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let (mut admin, mut a, _) = two_tenants(&running).await;
    let first = submit(&mut a, spec("first", 8, 600_000)).await;
    wait_state(&a, first, v1::JobState::Running).await;
    let queued = submit(&mut a, spec("second", 8, 600_000)).await;

    let plane = std::sync::Arc::clone(&running.plane);
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _busy = plane.blocking_lock();
        let _ = locked_tx.send(());
        // Held until the test says so, or fails (its sender is dropped).
        let _ = release_rx.recv_timeout(Duration::from_secs(600));
    });
    locked_rx.await.unwrap();

    let reads = async {
        let job = a
            .jobs
            .get(v1::JobRef { id: first })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(job.state, v1::JobState::Running as i32);
        let page = a
            .jobs
            .list(v1::ListJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .jobs;
        assert_eq!(
            page.iter().map(|j| j.id).collect::<Vec<_>>(),
            vec![queued, first],
            "newest first, both writes shown"
        );
        let view = cluster_view(&mut admin).await;
        assert_eq!(
            (view.jobs_running, view.jobs_pending + view.jobs_queued),
            (1, 1)
        );
        let nodes = admin
            .nodes
            .list(v1::ListNodesRequest {})
            .await
            .unwrap()
            .into_inner()
            .nodes;
        assert_eq!(nodes.len(), 1);
        assert!(metrics_text(&mut admin).await.contains("arbiter_jobs"));
        let slots = admin
            .policies
            .list(v1::ListPoliciesRequest {})
            .await
            .unwrap()
            .into_inner()
            .slots;
        assert!(slots.iter().any(|s| s.slot == "default"));
        assert!(!describe(&mut admin, "default").await.generations.is_empty());
        assert!(policy_stats(&mut admin, "default").await.rounds > 0);
        let e = a
            .policies
            .describe(v1::SlotRef {
                slot: "default".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
        let tenants = admin
            .cluster
            .list_tenants(v1::ListTenantsRequest {})
            .await
            .unwrap()
            .into_inner()
            .tenants;
        let team_a = tenants.iter().find(|t| t.name == "team-a").unwrap();
        // The running job's, and the second's once released to the scheduler.
        assert!([8, 16].contains(&team_a.gpus_in_use), "{team_a:?}");
        admin
            .experiments
            .list(v1::ListExperimentsRequest {})
            .await
            .unwrap();
        let e = client(&running, Some("not-a-token"))
            .await
            .jobs
            .get(v1::JobRef { id: first })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
    };
    tokio::time::timeout(Duration::from_secs(30), reads)
        .await
        .expect("reads answered while the plane's lock is held");

    // Writes wait for the lock — more of them than the runtime has threads…
    let mut writer = client_clone(&a);
    let cancel = tokio::spawn(async move {
        writer
            .jobs
            .cancel(v1::JobRef { id: queued })
            .await
            .map(|r| r.into_inner())
    });
    let submits: Vec<_> = (0..4)
        .map(|i| {
            let mut writer = client_clone(&a);
            tokio::spawn(async move {
                writer
                    .jobs
                    .submit(v1::SubmitJobRequest {
                        spec: Some(spec(&format!("late{i}"), 1, 600_000)),
                    })
                    .await
                    .map(|r| r.into_inner().id)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!holder.is_finished(), "the lock is still held");
    assert!(!cancel.is_finished(), "a write went round the plane's lock");
    // …and while they wait, reads are still answered: a waiting write
    // parks its task, it holds no runtime thread.
    tokio::time::timeout(
        Duration::from_secs(30),
        a.jobs.get(v1::JobRef { id: queued }),
    )
    .await
    .expect("a read answered while writes wait for the plane")
    .unwrap();
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    cancel.await.unwrap().unwrap();
    for submit in submits {
        let id = submit.await.unwrap().unwrap();
        a.jobs.get(v1::JobRef { id }).await.unwrap();
    }
    // …and is read back as soon as it returns.
    let job = a
        .jobs
        .get(v1::JobRef { id: queued })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job.state, v1::JobState::Cancelled as i32);
    let view = cluster_view(&mut admin).await;
    assert_eq!((view.jobs_finished, view.jobs_running), (1, 1));
    assert_eq!(view.jobs_queued + view.jobs_pending, 4);
    running.shutdown().await.unwrap();
}

/// Time is the plane's clock's: an hour-long job runs for an hour of it and
/// ended jobs are kept for a week of it — here a clock the test moves on,
/// so neither waits an hour nor a week, and neither can end early however
/// slowly the test runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plane_runs_on_its_clock_hour_long_jobs_and_a_week_of_history() {
    use arbiter_serve::clock::ManualClock;
    let dir = tempfile::tempdir().unwrap();
    let clock = std::sync::Arc::new(ManualClock::starting_now());
    let running = server_with(
        dir.path(),
        PlaneConfig {
            nodes: default_pool(1, 8),
            keep_finished_for: Duration::from_secs(7 * 24 * 3600),
            clock: clock.clone(),
            ..patient_plane()
        },
    )
    .await;
    let token = running.new_admin_token.clone().unwrap();
    let mut admin = client(&running, Some(&token)).await;
    let id = submit(&mut admin, spec("hour", 1, 3_600_000)).await;
    wait_state(&admin, id, v1::JobState::Running).await;
    let rounds = |c: &Client| {
        let mut c = client_clone(c);
        async move { cluster_view(&mut c).await.rounds }
    };
    // Some rounds pass after a step of the clock.
    let let_rounds_pass = |c: &Client| {
        let c = client_clone(c);
        async move {
            let from = rounds(&c).await;
            wait_for("three rounds", || {
                let r = rounds(&c);
                async move { r.await >= from + 3 }
            })
            .await;
        }
    };

    clock.advance(Duration::from_secs(59 * 60));
    let_rounds_pass(&admin).await;
    assert_eq!(job_state(&mut admin, id).await, v1::JobState::Running);
    clock.advance(Duration::from_secs(60));
    wait_state(&admin, id, v1::JobState::Succeeded).await;
    let job = admin
        .jobs
        .get(v1::JobRef { id })
        .await
        .unwrap()
        .into_inner();
    assert!(
        (3_600_000..3_600_000 + 60_000).contains(&(job.end_ms - job.start_ms)),
        "ran {} ms of the clock",
        job.end_ms - job.start_ms
    );

    clock.advance(Duration::from_secs(6 * 24 * 3600));
    let_rounds_pass(&admin).await;
    admin.jobs.get(v1::JobRef { id }).await.unwrap();
    clock.advance(Duration::from_secs(24 * 3600 + 60));
    wait_for("a week-old job to leave the table", || {
        let mut c = client_clone(&admin);
        async move {
            c.jobs
                .get(v1::JobRef { id })
                .await
                .is_err_and(|e| e.code() == Code::NotFound)
        }
    })
    .await;
    running.shutdown().await.unwrap();
}

/// The whole HTTP/1.1 response to `GET path` from `addr`.
async fn http_get(addr: std::net::SocketAddr, path: &'static str) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// Stores written before ended experiments' reports were JSON kept them as
/// protobuf (`expstatus/`): such a report is still shown after the upgrade,
/// and rewritten once in the new form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_report_an_earlier_version_stored_is_kept_and_rewritten() {
    use arbiter_serve::records::{ExperimentRecord, ExperimentState, GuardrailRecord, Mode};
    use arbiter_serve::store::{Store, Write};
    let dir = tempfile::tempdir().unwrap();
    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let admin_token = running.new_admin_token.clone().unwrap();
    running.shutdown().await.unwrap();

    let record = ExperimentRecord {
        name: "old".into(),
        mode: Mode::Split,
        state: ExperimentState::RolledBack,
        candidate_slot: "cand".into(),
        candidate_tenants: Vec::new(),
        candidate_share: 0.5,
        guardrail: GuardrailRecord::resolved(None).unwrap(),
        reason: "rolled back: queue delay worse".into(),
        started_ms: 1_000,
        ended_ms: 9_000,
        seed: 7,
        first_job: 1,
    };
    let legacy = v1::ExperimentStatus {
        name: "old".into(),
        mode: v1::ExperimentMode::Split as i32,
        state: v1::ExperimentState::RolledBack as i32,
        candidate_slot: "cand".into(),
        arms: vec![v1::ArmMetrics {
            arm: "candidate".into(),
            slot: "cand".into(),
            generation: 2,
            jobs_submitted: 41,
            queue_delay_ms: Some(v1::Estimate {
                mean: 812.5,
                ci_low: 700.0,
                ci_high: 925.0,
                samples: 41,
                batches: 4,
            }),
            ..Default::default()
        }],
        reason: record.reason.clone(),
        started_ms: 1_000,
        ended_ms: 9_000,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path()).unwrap();
        let writer = store.writer().unwrap();
        writer
            .send_durable(vec![
                Write::Put("exp/old".into(), serde_json::to_vec(&record).unwrap()),
                Write::Put(
                    "expstatus/old".into(),
                    prost::Message::encode_to_vec(&legacy),
                ),
            ])
            .done()
            .await
            .unwrap();
    }

    let running = server(dir.path(), 1, Duration::from_secs(600)).await;
    let mut admin = client(&running, Some(&admin_token)).await;
    let shown = status(&mut admin, "old").await;
    assert_eq!(shown.arms.len(), 1, "{shown:?}");
    assert_eq!(shown.arms[0].jobs_submitted, 41);
    assert_eq!(shown.arms[0].queue_delay_ms, legacy.arms[0].queue_delay_ms);
    assert_eq!(shown.state, v1::ExperimentState::RolledBack as i32);
    assert_eq!(shown.reason, record.reason);
    drop(admin);
    running.shutdown().await.unwrap();

    let contents = Store::open(dir.path()).unwrap().read_all().unwrap();
    assert!(
        contents.get("expstatus/old").is_none(),
        "the old form is gone"
    );
    let rewritten: serde_json::Value =
        serde_json::from_slice(contents.get("expreport/old").expect("rewritten")).unwrap();
    assert_eq!(rewritten["arms"][0]["jobs_submitted"], 41);
}
