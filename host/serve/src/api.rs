//! The gRPC services of `arbiter.v1` over the [`Plane`].
//!
//! Every handler authenticates the bearer token on the [`Board`]. Reads of
//! jobs, the cluster view, nodes and metrics are answered from the board
//! and never take the plane's lock, so they never wait on a round. Writes do
//! their work under the plane's lock (never compiling or waiting for the
//! disk there), publish what they changed on the board, and wait for
//! durability after releasing the lock. Errors map to gRPC codes:
//! unauthenticated, permission denied, not found, invalid argument, failed
//! precondition, already exists, internal.

use crate::board::Board;
use crate::convert;
use crate::plane::{ApiError, Caller, Plane};
use crate::records::{JobEvent, NewJob, ServiceReport};
use crate::store::Ack;
use arbiter_host::registry::Registry;
use arbiter_proto::v1;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::Mutex;
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tonic::{Request, Response, Status};

/// Shared handle every service holds.
#[derive(Clone)]
pub struct Api {
    plane: Arc<Mutex<Plane>>,
    board: Arc<Board>,
    events: tokio::sync::broadcast::Sender<JobEvent>,
    registry: Arc<Registry>,
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        match e {
            ApiError::Unauthenticated(m) => Status::unauthenticated(m),
            ApiError::PermissionDenied(m) => Status::permission_denied(m),
            ApiError::NotFound(m) => Status::not_found(m),
            ApiError::InvalidArgument(m) => Status::invalid_argument(m),
            ApiError::FailedPrecondition(m) => Status::failed_precondition(m),
            ApiError::AlreadyExists(m) => Status::already_exists(m),
            ApiError::Internal(m) => Status::internal(m),
        }
    }
}

fn bearer<T>(request: &Request<T>) -> Result<Option<String>, Status> {
    let Some(value) = request.metadata().get("authorization") else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| Status::unauthenticated("authorization metadata is not ASCII"))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(|| Status::unauthenticated("authorization must be `Bearer <token>`"))?;
    Ok(Some(token.trim().to_string()))
}

/// What the API holds of a plane besides the plane: its board, its
/// job-event channel and its registry (see [`Api::parts`]).
pub struct ApiParts {
    board: Arc<Board>,
    events: tokio::sync::broadcast::Sender<JobEvent>,
    /// To compile uploads against (the plane's, never replaced).
    registry: Arc<Registry>,
}

impl Api {
    /// Publishes everything the plane has (before it serves) and takes what
    /// the API reads without the plane's lock.
    pub fn parts(plane: &mut Plane) -> ApiParts {
        plane.publish_all();
        ApiParts {
            board: plane.board(),
            events: plane.event_sender(),
            registry: plane.registry(),
        }
    }

    /// The plane's lock is tokio's: a write waiting for it (behind a round)
    /// parks its task, not a runtime thread, so reads keep being served
    /// however many writes wait.
    pub fn new(plane: Arc<Mutex<Plane>>, parts: ApiParts) -> Api {
        Api {
            plane,
            board: parts.board,
            events: parts.events,
            registry: parts.registry,
        }
    }

    /// A write to jobs (submit, cancel, reports): the records it changed are
    /// on the board before it returns.
    async fn jobs_write<T>(&self, write: impl FnOnce(&mut Plane) -> T) -> T {
        let mut plane = self.plane.lock().await;
        let out = write(&mut plane);
        plane.publish_jobs();
        out
    }

    /// Any other write (policies, experiments, nodes, tenants, tokens):
    /// job records, credentials, the view, nodes and metrics are published.
    async fn admin_write<T>(&self, write: impl FnOnce(&mut Plane) -> T) -> T {
        let mut plane = self.plane.lock().await;
        let out = write(&mut plane);
        plane.publish();
        out
    }

    /// The caller of every service but `NodeLink`: the admin or a tenant.
    /// The node token is refused here, whatever the method.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        match self.any_caller(request)? {
            Caller::Node(_) => Err(ApiError::PermissionDenied(
                "the node token only opens node sessions (NodeLink); this needs the admin or a \
                 tenant token"
                    .into(),
            )
            .into()),
            caller => Ok(caller),
        }
    }

    fn any_caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let token = bearer(request)?;
        Ok(self.board.authenticate(token.as_deref())?)
    }
}

/// The jobs of a submission, each spec checked (the error names which).
fn new_jobs(specs: &[v1::JobSpec]) -> Result<Vec<NewJob>, Status> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let record = convert::submitted_spec(spec).validated().map_err(|e| {
                Status::invalid_argument(format!("{}: {e}", NewJob::which(i, specs.len())))
            })?;
            Ok(NewJob {
                spec: record,
                tenant: spec.tenant.clone(),
            })
        })
        .collect()
}

/// A write's result is read back from the board it was published on; not
/// finding it there is a bug, never the caller's fault.
fn written_but_not_shown(what: &str) -> Status {
    Status::internal(format!("the {what} written is not on the board"))
}

/// Waits until a write is durable (after the plane's lock is released).
async fn durable(ack: Ack) -> Result<(), Status> {
    ack.done()
        .await
        .map_err(|e| Status::unavailable(format!("{e:#}")))
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl v1::jobs_server::Jobs for Api {
    async fn submit(&self, request: Request<v1::SubmitJobRequest>) -> Reply<v1::SubmitJobResponse> {
        let caller = self.caller(&request)?;
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("`spec` is required"))?;
        let jobs = new_jobs(std::slice::from_ref(&spec))?;
        let (ids, ack) = self.jobs_write(|p| p.submit(&caller, jobs)).await?;
        durable(ack).await?;
        let id = ids
            .first()
            .copied()
            .ok_or_else(|| Status::internal("no id assigned"))?;
        Ok(Response::new(v1::SubmitJobResponse { id }))
    }

    async fn submit_batch(
        &self,
        request: Request<v1::SubmitJobsRequest>,
    ) -> Reply<v1::SubmitJobsResponse> {
        let caller = self.caller(&request)?;
        let specs = request.into_inner().specs;
        let jobs = new_jobs(&specs)?;
        let (ids, ack) = self.jobs_write(|p| p.submit(&caller, jobs)).await?;
        durable(ack).await?;
        Ok(Response::new(v1::SubmitJobsResponse { ids }))
    }

    async fn cancel(&self, request: Request<v1::JobRef>) -> Reply<v1::CancelJobResponse> {
        let caller = self.caller(&request)?;
        let (job, ack) = self
            .jobs_write(|p| p.cancel(&caller, request.get_ref().id))
            .await?;
        durable(ack).await?;
        Ok(Response::new(v1::CancelJobResponse {
            job: Some(convert::job(&job)),
        }))
    }

    async fn get(&self, request: Request<v1::JobRef>) -> Reply<v1::Job> {
        let caller = self.caller(&request)?;
        let job = self.board.get_job(&caller, request.get_ref().id)?;
        Ok(Response::new(convert::job_view(&job)))
    }

    async fn list(&self, request: Request<v1::ListJobsRequest>) -> Reply<v1::ListJobsResponse> {
        let caller = self.caller(&request)?;
        let query = convert::job_query(request.get_ref());
        let (jobs, next_page_token) = self.board.list_jobs(&caller, &query)?;
        Ok(Response::new(v1::ListJobsResponse {
            jobs: jobs.iter().map(convert::job_view).collect(),
            next_page_token,
        }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::JobEvent, Status>> + Send + 'static>>;

    async fn watch(&self, request: Request<v1::WatchJobsRequest>) -> Reply<Self::WatchStream> {
        let caller = self.caller(&request)?;
        let want = request.into_inner().tenant;
        if let Caller::Tenant(t) = &caller
            && !want.is_empty()
            && &want != t
        {
            return Err(Status::permission_denied(format!(
                "tenant `{t}` may not watch tenant `{want}`"
            )));
        }
        let rx = self.events.subscribe();
        let stream = BroadcastStream::new(rx).filter_map(move |event| {
            let event = match event {
                Ok(e) => e,
                Err(lagged) => {
                    return Some(Err(Status::data_loss(format!(
                        "watcher fell behind: {lagged}; re-list and watch again"
                    ))));
                }
            };
            let tenant = &event.job.tenant;
            let visible = match &caller {
                Caller::Admin => want.is_empty() || want == *tenant,
                Caller::Tenant(t) => t == tenant,
                Caller::Node(_) => false,
            };
            visible.then(|| {
                Ok(v1::JobEvent {
                    job: Some(convert::job(&event.job)),
                    previous: event
                        .previous
                        .map_or(v1::JobState::Unspecified, convert::job_state)
                        as i32,
                })
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
    async fn report_progress(
        &self,
        request: Request<v1::ReportProgressRequest>,
    ) -> Reply<v1::JobProgress> {
        let caller = self.caller(&request)?;
        let r = request.get_ref();
        let progress = self
            .jobs_write(|p| p.report_progress(&caller, r.id, r.remaining_ms))
            .await?;
        Ok(Response::new(convert::job_progress(&progress)))
    }
    async fn report_service(
        &self,
        request: Request<v1::ReportServiceRequest>,
    ) -> Reply<v1::ServiceLoad> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let report = ServiceReport {
            requests_per_s: r.requests_per_s,
            p50_latency_ms: r.p50_latency_ms,
            p99_latency_ms: r.p99_latency_ms,
        };
        let load = self
            .jobs_write(|p| p.report_service(&caller, r.id, report))
            .await?;
        Ok(Response::new(convert::service_load(load)))
    }
}

#[tonic::async_trait]
impl v1::policies_server::Policies for Api {
    async fn list(
        &self,
        request: Request<v1::ListPoliciesRequest>,
    ) -> Reply<v1::ListPoliciesResponse> {
        let caller = self.caller(&request)?;
        let slots = self.board.list_policies(&caller);
        Ok(Response::new(v1::ListPoliciesResponse {
            slots: slots.iter().map(convert::slot_info).collect(),
        }))
    }

    async fn upload(
        &self,
        request: Request<v1::UploadPolicyRequest>,
    ) -> Reply<v1::UploadPolicyResponse> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let registry = Arc::clone(&self.registry);
        // Compiling takes tens of milliseconds or more: never under the lock.
        let wasm = req.wasm;
        let (compiled, wasm) = tokio::task::spawn_blocking(move || {
            Plane::compile(&registry, &wasm).map(|c| (c, wasm))
        })
        .await
        .map_err(|e| Status::internal(format!("compile task: {e}")))??;
        let (loaded, ack) = self
            .admin_write(|p| {
                p.upload(
                    &caller,
                    &req.slot,
                    compiled,
                    &wasm,
                    &req.config,
                    req.activate,
                )
            })
            .await?;
        durable(ack).await?;
        let generation = self
            .board
            .slot(&caller, &loaded.slot)
            .ok()
            .and_then(|slot| {
                slot.generations
                    .iter()
                    .find(|g| g.id == loaded.generation)
                    .map(convert::generation)
            })
            .ok_or_else(|| written_but_not_shown("generation"))?;
        Ok(Response::new(v1::UploadPolicyResponse {
            generation: Some(generation),
            slot: loaded.slot,
        }))
    }

    async fn swap(&self, request: Request<v1::SwapPolicyRequest>) -> Reply<v1::SlotInfo> {
        let caller = self.caller(&request)?;
        let r = request.get_ref();
        let ack = self
            .admin_write(|p| p.swap(&caller, &r.slot, r.generation))
            .await?;
        durable(ack).await?;
        Ok(Response::new(convert::slot_info(
            &self.board.slot(&caller, &r.slot)?,
        )))
    }

    async fn rollback(&self, request: Request<v1::RollbackPolicyRequest>) -> Reply<v1::SlotInfo> {
        let caller = self.caller(&request)?;
        let r = request.get_ref();
        let ack = self
            .admin_write(|p| p.rollback(&caller, &r.slot, r.generation))
            .await?;
        durable(ack).await?;
        Ok(Response::new(convert::slot_info(
            &self.board.slot(&caller, &r.slot)?,
        )))
    }

    async fn unload(&self, request: Request<v1::UnloadPolicyRequest>) -> Reply<v1::SlotInfo> {
        let caller = self.caller(&request)?;
        let r = request.get_ref();
        let ack = self
            .admin_write(|p| p.unload(&caller, &r.slot, r.generation))
            .await?;
        durable(ack).await?;
        // An emptied slot is gone: shown with no generations.
        Ok(Response::new(match self.board.slot(&caller, &r.slot) {
            Ok(view) => convert::slot_info(&view),
            Err(_) => v1::SlotInfo {
                slot: r.slot.clone(),
                generations: Vec::new(),
            },
        }))
    }

    async fn describe(&self, request: Request<v1::SlotRef>) -> Reply<v1::SlotInfo> {
        let caller = self.caller(&request)?;
        Ok(Response::new(convert::slot_info(
            &self.board.slot(&caller, &request.get_ref().slot)?,
        )))
    }

    async fn stats(&self, request: Request<v1::SlotRef>) -> Reply<v1::PolicyStats> {
        let caller = self.caller(&request)?;
        Ok(Response::new(convert::policy_stats(
            &self.board.slot(&caller, &request.get_ref().slot)?,
        )))
    }
}

#[tonic::async_trait]
impl v1::experiments_server::Experiments for Api {
    async fn start(
        &self,
        request: Request<v1::StartExperimentRequest>,
    ) -> Reply<v1::ExperimentStatus> {
        let caller = self.caller(&request)?;
        let req =
            convert::experiment_request(request.get_ref()).map_err(Status::invalid_argument)?;
        let name = req.name.clone();
        let ack = self
            .admin_write(|p| p.start_experiment(&caller, req))
            .await?;
        durable(ack).await?;
        self.experiment(&name)
    }

    async fn status(&self, request: Request<v1::ExperimentRef>) -> Reply<v1::ExperimentStatus> {
        let caller = self.caller(&request)?;
        if caller != Caller::Admin {
            return Err(ApiError::PermissionDenied("experiments are admin-only".into()).into());
        }
        self.experiment(&request.get_ref().name)
    }

    async fn list(
        &self,
        request: Request<v1::ListExperimentsRequest>,
    ) -> Reply<v1::ListExperimentsResponse> {
        let caller = self.caller(&request)?;
        if caller != Caller::Admin {
            return Err(ApiError::PermissionDenied("experiments are admin-only".into()).into());
        }
        Ok(Response::new(v1::ListExperimentsResponse {
            experiments: self
                .board
                .list_experiments()
                .iter()
                .map(|e| convert::experiment(e))
                .collect(),
        }))
    }

    async fn promote(&self, request: Request<v1::ExperimentRef>) -> Reply<v1::ExperimentStatus> {
        let caller = self.caller(&request)?;
        let name = &request.get_ref().name;
        let ack = self.admin_write(|p| p.promote(&caller, name)).await?;
        durable(ack).await?;
        self.experiment(name)
    }

    async fn abort(&self, request: Request<v1::ExperimentRef>) -> Reply<v1::ExperimentStatus> {
        let caller = self.caller(&request)?;
        let name = &request.get_ref().name;
        let ack = self.admin_write(|p| p.abort(&caller, name)).await?;
        durable(ack).await?;
        self.experiment(name)
    }
}

impl Api {
    /// Node `name` as the board shows it, after a write to it.
    fn node_info(&self, name: &str) -> Reply<v1::NodeInfo> {
        self.board
            .list_nodes()
            .iter()
            .find(|n| n.name == name)
            .map(|n| Response::new(convert::node(n)))
            .ok_or_else(|| written_but_not_shown("node"))
    }

    /// Experiment `name` as the board shows it.
    fn experiment(&self, name: &str) -> Reply<v1::ExperimentStatus> {
        let experiment = self.board.experiment(name)?;
        Ok(Response::new(convert::experiment(&experiment)))
    }
}

#[tonic::async_trait]
impl v1::nodes_server::Nodes for Api {
    async fn list(&self, request: Request<v1::ListNodesRequest>) -> Reply<v1::ListNodesResponse> {
        self.caller(&request)?;
        Ok(Response::new(v1::ListNodesResponse {
            nodes: self.board.list_nodes().iter().map(convert::node).collect(),
        }))
    }

    async fn drain(&self, request: Request<v1::DrainNodeRequest>) -> Reply<v1::NodeInfo> {
        let caller = self.caller(&request)?;
        let name = &request.get_ref().name;
        let ack = self.admin_write(|p| p.drain(&caller, name)).await?;
        durable(ack).await?;
        self.node_info(name)
    }

    async fn undrain(&self, request: Request<v1::DrainNodeRequest>) -> Reply<v1::NodeInfo> {
        let caller = self.caller(&request)?;
        let name = &request.get_ref().name;
        let ack = self.admin_write(|p| p.undrain(&caller, name)).await?;
        durable(ack).await?;
        self.node_info(name)
    }

    async fn lend(&self, request: Request<v1::LendNodeRequest>) -> Reply<v1::NodeInfo> {
        let caller = self.caller(&request)?;
        let name = &request.get_ref().name;
        let ack = self.admin_write(|p| p.lend(&caller, name)).await?;
        durable(ack).await?;
        self.node_info(name)
    }

    async fn reclaim(
        &self,
        request: Request<v1::ReclaimNodesRequest>,
    ) -> Reply<v1::ReclaimNodesResponse> {
        let caller = self.caller(&request)?;
        let r = request.get_ref();
        let (reclaimed, ack) = self
            .admin_write(|p| p.reclaim(&caller, &r.pool, r.count))
            .await?;
        durable(ack).await?;
        Ok(Response::new(v1::ReclaimNodesResponse {
            returned: reclaimed.returned,
            preempted: reclaimed.preempted,
            scaled_in: reclaimed.scaled_in,
            served: reclaimed.served,
            slot: reclaimed.slot,
            faults: reclaimed.faults,
        }))
    }
}

#[tonic::async_trait]
impl v1::cluster_server::Cluster for Api {
    async fn view(&self, request: Request<v1::ClusterViewRequest>) -> Reply<v1::ClusterView> {
        self.caller(&request)?;
        Ok(Response::new(convert::cluster_view(&self.board.view())))
    }

    async fn metrics(&self, request: Request<v1::MetricsRequest>) -> Reply<v1::MetricsResponse> {
        self.caller(&request)?;
        Ok(Response::new(v1::MetricsResponse {
            text: self.board.metrics_text(),
        }))
    }

    async fn add_tenant(&self, request: Request<v1::AddTenantRequest>) -> Reply<v1::TenantInfo> {
        let caller = self.caller(&request)?;
        let r = request.get_ref();
        let (token, ack) = self
            .admin_write(|p| p.add_tenant(&caller, &r.name, r.quota_gpus))
            .await?;
        durable(ack).await?;
        let info = self
            .board
            .list_tenants(&caller)
            .into_iter()
            .find(|t| t.name == r.name)
            .ok_or_else(|| written_but_not_shown("tenant"))?;
        Ok(Response::new(convert::tenant(&info, token)))
    }

    async fn remove_tenant(
        &self,
        request: Request<v1::TenantRef>,
    ) -> Reply<v1::RemoveTenantResponse> {
        let caller = self.caller(&request)?;
        let ack = self
            .admin_write(|p| p.remove_tenant(&caller, &request.get_ref().name))
            .await?;
        durable(ack).await?;
        Ok(Response::new(v1::RemoveTenantResponse {}))
    }

    async fn rotate_token(
        &self,
        request: Request<v1::RotateTokenRequest>,
    ) -> Reply<v1::RotateTokenResponse> {
        let caller = self.caller(&request)?;
        let (token, ack) = self
            .admin_write(|p| p.rotate_token(&caller, &request.get_ref().subject))
            .await?;
        durable(ack).await?;
        Ok(Response::new(v1::RotateTokenResponse { token }))
    }

    async fn list_tenants(
        &self,
        request: Request<v1::ListTenantsRequest>,
    ) -> Reply<v1::ListTenantsResponse> {
        let caller = self.caller(&request)?;
        Ok(Response::new(v1::ListTenantsResponse {
            tenants: self
                .board
                .list_tenants(&caller)
                .iter()
                .map(|t| convert::tenant(t, String::new()))
                .collect(),
        }))
    }
}

#[tonic::async_trait]
impl v1::node_link_server::NodeLink for Api {
    type SessionStream =
        Pin<Box<dyn Stream<Item = Result<v1::HostMessage, Status>> + Send + 'static>>;

    async fn session(
        &self,
        request: Request<tonic::Streaming<v1::NodeMessage>>,
    ) -> Reply<Self::SessionStream> {
        let caller = self.any_caller(&request)?;
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(v1::NodeMessage {
                body: Some(v1::node_message::Body::Hello(h)),
            }) => convert::agent_hello(&h),
            Some(_) => {
                return Err(Status::invalid_argument(
                    "the first message of a node session must be `hello`",
                ));
            }
            None => return Err(Status::invalid_argument("empty node session")),
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let session = self
            .admin_write(|p| p.register_node(&caller, &hello, tx))
            .await?;
        let api = self.clone();
        let name = hello.name.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(msg)) => match msg.body {
                        Some(v1::node_message::Body::Heartbeat(hb)) => {
                            let report = convert::agent_report(&hb);
                            api.jobs_write(|p| p.node_report(&name, session, &report))
                                .await;
                        }
                        Some(v1::node_message::Body::Event(ev)) => {
                            match convert::workload_event(&ev) {
                                Ok(ev) => {
                                    api.jobs_write(|p| p.node_event(&name, session, &ev)).await;
                                }
                                Err(kind) => {
                                    tracing::warn!(node = %name, job = ev.job_id, kind, "workload event of unknown kind; ignored");
                                }
                            }
                        }
                        Some(v1::node_message::Body::UpdateAck(ack)) => {
                            let ack = convert::update_ack(&ack);
                            api.jobs_write(|p| p.node_update_ack(&name, session, &ack))
                                .await;
                        }
                        Some(v1::node_message::Body::Hello(_)) | None => {
                            tracing::warn!(node = %name, "unexpected message on a node session; ignored");
                        }
                    },
                    Ok(None) => break,
                    Err(status) => {
                        tracing::warn!(node = %name, %status, "node session failed");
                        break;
                    }
                }
            }
            api.admin_write(|p| p.node_disconnected(&name, session))
                .await;
        });
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
            .map(|message| Ok(convert::to_agent(message)));
        Ok(Response::new(Box::pin(stream)))
    }
}
