//! The harness the control-plane tests share: a loopback server, clients
//! with bearer tokens, and the calls most tests make.
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use arbiter_proto::v1;
use arbiter_serve::plane::{PlaneConfig, default_pool};
use arbiter_serve::server::{Running, ServeConfig, start};
use std::time::Duration;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub type Auth = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
pub struct Bearer(pub Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub struct Client {
    pub jobs: v1::jobs_client::JobsClient<Auth>,
    pub policies: v1::policies_client::PoliciesClient<Auth>,
    pub experiments: v1::experiments_client::ExperimentsClient<Auth>,
    pub cluster: v1::cluster_client::ClusterClient<Auth>,
    pub nodes: v1::nodes_client::NodesClient<Auth>,
}

pub async fn client(running: &Running, token: Option<&str>) -> Client {
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let auth = Bearer(token.map(|t| format!("Bearer {t}").parse().unwrap()));
    Client {
        jobs: v1::jobs_client::JobsClient::with_interceptor(channel.clone(), auth.clone()),
        policies: v1::policies_client::PoliciesClient::with_interceptor(
            channel.clone(),
            auth.clone(),
        )
        .max_encoding_message_size(64 << 20),
        experiments: v1::experiments_client::ExperimentsClient::with_interceptor(
            channel.clone(),
            auth.clone(),
        ),
        cluster: v1::cluster_client::ClusterClient::with_interceptor(channel.clone(), auth.clone()),
        nodes: v1::nodes_client::NodesClient::with_interceptor(channel, auth),
    }
}

/// The plane's defaults with a policy deadline no stall of a loaded machine reaches: a
/// test's healthy policy then faults only when it is at fault (the default 250 ms deadline
/// made a preempted round a fault, and a test asserting no faults flaky). Tests of hanging
/// policies set their own deadline.
pub fn patient_plane() -> PlaneConfig {
    let mut plane = PlaneConfig::default();
    plane.runtime.deadline = Duration::from_secs(30);
    plane
}

pub async fn server(dir: &std::path::Path, nodes: u32, duration: Duration) -> Running {
    server_with(
        dir,
        PlaneConfig {
            nodes: default_pool(nodes, 8),
            default_duration: duration,
            ..patient_plane()
        },
    )
    .await
}

/// A loopback server on `dir` running `plane` with 20 ms rounds.
pub async fn server_with(dir: &std::path::Path, plane: PlaneConfig) -> Running {
    start(serve_config(dir, plane)).await.unwrap()
}

/// A loopback plane on `dir` with `plane`'s settings and 20 ms rounds: no TLS,
/// no HTTP metrics, no policy directory.
pub fn serve_config(dir: &std::path::Path, plane: PlaneConfig) -> ServeConfig {
    ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        data: dir.to_path_buf(),
        metrics_listen: None,
        plane: PlaneConfig {
            round_interval: Duration::from_millis(20),
            ..plane
        },
    }
}

pub fn spec(name: &str, gpus: u32, duration_ms: u64) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        gpus,
        duration_ms,
        ..Default::default()
    }
}

/// Submits a job that must be accepted; returns its id.
pub async fn submit(c: &mut Client, spec: v1::JobSpec) -> u64 {
    c.jobs
        .submit(v1::SubmitJobRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner()
        .id
}

pub async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // A minute: what is awaited may take a directory poll and a compile, which a loaded
    // machine can stretch to many seconds. Passing tests return at the first success.
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < give_up {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

pub async fn wait_state(c: &Client, id: u64, state: v1::JobState) {
    wait_for(&format!("job {id} to be {state:?}"), || {
        let mut c = client_clone(c);
        async move { job_state(&mut c, id).await == state }
    })
    .await;
}

pub async fn job_state(c: &mut Client, id: u64) -> v1::JobState {
    let j = c.jobs.get(v1::JobRef { id }).await.unwrap().into_inner();
    v1::JobState::try_from(j.state).unwrap()
}

pub async fn add_tenant(admin: &mut Client, name: &str, quota: u32) -> String {
    admin
        .cluster
        .add_tenant(v1::AddTenantRequest {
            name: name.into(),
            quota_gpus: quota,
        })
        .await
        .unwrap()
        .into_inner()
        .token
}

/// The admin and two tenants without quota, `team-a` and `team-b`.
pub async fn two_tenants(running: &Running) -> (Client, Client, Client) {
    two_tenants_with_quotas(running, 0, 0).await
}

/// The admin and tenants `team-a` and `team-b` with these GPU quotas (0 = none).
pub async fn two_tenants_with_quotas(
    running: &Running,
    a: u32,
    b: u32,
) -> (Client, Client, Client) {
    let admin_token = running.new_admin_token.clone().unwrap();
    let mut admin = client(running, Some(&admin_token)).await;
    let a_token = add_tenant(&mut admin, "team-a", a).await;
    let b_token = add_tenant(&mut admin, "team-b", b).await;
    let a = client(running, Some(&a_token)).await;
    let b = client(running, Some(&b_token)).await;
    (admin, a, b)
}

pub fn client_clone(c: &Client) -> Client {
    Client {
        jobs: c.jobs.clone(),
        policies: c.policies.clone(),
        experiments: c.experiments.clone(),
        cluster: c.cluster.clone(),
        nodes: c.nodes.clone(),
    }
}

/// Uploads `wasm` into `slot` (activating it); the plane's answer.
pub async fn upload(
    c: &mut Client,
    slot: &str,
    wasm: &[u8],
    config: &str,
) -> Result<v1::GenerationInfo, tonic::Status> {
    c.policies
        .upload(v1::UploadPolicyRequest {
            slot: slot.into(),
            wasm: wasm.to_vec(),
            config: config.into(),
            activate: true,
        })
        .await
        .map(|r| r.into_inner().generation.unwrap_or_default())
}

/// Uploads `wasm` into `slot`, which must accept it.
pub async fn load(c: &mut Client, slot: &str, wasm: &[u8], config: &str) -> v1::GenerationInfo {
    upload(c, slot, wasm, config).await.unwrap()
}

pub async fn cluster_view(c: &mut Client) -> v1::ClusterView {
    c.cluster
        .view(v1::ClusterViewRequest {})
        .await
        .unwrap()
        .into_inner()
}

pub async fn metrics_text(c: &mut Client) -> String {
    c.cluster
        .metrics(v1::MetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .text
}

pub async fn describe(c: &mut Client, slot: &str) -> v1::SlotInfo {
    c.policies
        .describe(v1::SlotRef { slot: slot.into() })
        .await
        .unwrap()
        .into_inner()
}

pub async fn policy_stats(c: &mut Client, slot: &str) -> v1::PolicyStats {
    c.policies
        .stats(v1::SlotRef { slot: slot.into() })
        .await
        .unwrap()
        .into_inner()
}

pub async fn status(c: &mut Client, name: &str) -> v1::ExperimentStatus {
    c.experiments
        .status(v1::ExperimentRef { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

/// The first page of jobs the caller may see (newest first).
pub async fn list_jobs(c: &Client) -> Vec<v1::Job> {
    let mut c = client_clone(c);
    c.jobs
        .list(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs
}

/// Starts a randomised split experiment of `slot` against `default`, the
/// candidate's share `share`, with the default guardrail.
pub async fn start_split(
    admin: &mut Client,
    name: &str,
    slot: &str,
    share: f64,
) -> v1::ExperimentStatus {
    admin
        .experiments
        .start(v1::StartExperimentRequest {
            name: name.into(),
            mode: v1::ExperimentMode::Split as i32,
            candidate_slot: slot.into(),
            candidate_share: share,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// Asks one node of the `sim` pool back.
pub async fn reclaim_one(
    c: &mut Client,
) -> Result<tonic::Response<v1::ReclaimNodesResponse>, tonic::Status> {
    c.nodes
        .reclaim(v1::ReclaimNodesRequest {
            pool: "sim".into(),
            count: 1,
        })
        .await
}

/// Lends node `name` to training.
pub async fn lend(c: &mut Client, name: &str) -> v1::NodeInfo {
    c.nodes
        .lend(v1::LendNodeRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}
