//! Wires the plane, the round loop, the gRPC services (with reflection) and
//! the Prometheus endpoint into a running server.

use crate::api::Api;
use crate::board::Board;
use crate::plane::{Plane, PlaneConfig};
use crate::tls::{TlsSettings, server_tls};
use anyhow::Context;
use arbiter_proto::v1;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

/// Largest gRPC message accepted (policy uploads are the big ones; the plane
/// refuses components over [`crate::plane::MAX_UPLOAD`] with a clear error).
const MAX_MESSAGE: usize = 32 << 20;

/// How long a shutdown waits for open calls and streams.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Everything `arbiter serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub data: PathBuf,
    /// Where `/metrics` is served; `None` = not served over HTTP (still via gRPC).
    pub metrics_listen: Option<SocketAddr>,
    pub plane: PlaneConfig,
    /// TLS for the gRPC listener (see [`crate::tls`]).
    pub tls: TlsSettings,
    /// A directory whose `NAME.wasm` files load into slot `NAME`
    /// ([`crate::policies_dir`]).
    pub policies_dir: Option<PathBuf>,
}

/// A started server.
pub struct Running {
    pub grpc_addr: SocketAddr,
    /// Whether gRPC is served over TLS, and the CA clients must trust when
    /// the plane issued its own certificate.
    pub tls: bool,
    pub ca_path: Option<PathBuf>,
    pub metrics_addr: Option<SocketAddr>,
    /// Set on the first start (a new data directory).
    pub new_admin_token: Option<String>,
    /// Set when the node token was minted (see [`crate::plane::Opened`]).
    pub new_node_token: Option<String>,
    pub journal_path: PathBuf,
    pub plane: Arc<Mutex<Plane>>,
    stop: Arc<AtomicBool>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    grpc: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    rounds: Option<std::thread::JoinHandle<()>>,
    policies_dir: Option<arbiter_host::watch::WatchGuard>,
}

impl Running {
    /// Stops the round loop and the server, and waits for both.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        // Nothing loads from the policy directory while the plane stops.
        if let Some(guard) = self.policies_dir.take() {
            tokio::task::spawn_blocking(move || drop(guard))
                .await
                .context("stopping the policy directory's watcher")?;
        }
        self.stop.store(true, Ordering::Release);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.rounds.take() {
            tokio::task::spawn_blocking(move || t.join())
                .await
                .context("joining the round loop")?
                .map_err(|_| anyhow::anyhow!("round loop panicked"))?;
        }
        // Long-lived streams (node sessions, job watchers) would hold a
        // graceful shutdown open forever: close the node streams, then give
        // the rest a moment before cutting them.
        self.plane.lock().await.disconnect_agents();
        // The journal's thread writes what is queued before the plane is gone.
        if let Err(e) = self.plane.lock().await.flush_journal() {
            tracing::error!(error = %format!("{e:#}"), "flushing the journal at shutdown");
        }
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.grpc).await {
            Ok(joined) => joined
                .context("joining the gRPC server")?
                .context("gRPC server")?,
            Err(_) => {
                tracing::warn!("open streams outlived the shutdown grace period; closing them");
                self.grpc.abort();
            }
        }
        Ok(())
    }
}

/// Opens the data directory and starts serving.
pub async fn start(cfg: ServeConfig) -> anyhow::Result<Running> {
    // Bind first: a port in use must fail the start before a data
    // directory is created or a token minted.
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let grpc_addr = listener.local_addr().context("local address")?;
    let metrics_listener = match cfg.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics endpoint {addr}"))?,
        ),
        None => None,
    };
    let server_tls = {
        let (settings, data) = (cfg.tls.clone(), cfg.data.clone());
        tokio::task::spawn_blocking(move || server_tls(&settings, grpc_addr, &data))
            .await
            .context("preparing TLS")??
    };
    let plane_cfg = cfg.plane.clone();
    let data = cfg.data.clone();
    let opened = tokio::task::spawn_blocking(move || Plane::open(plane_cfg, &data))
        .await
        .context("opening the plane")??;
    let mut opened_plane = opened.plane;
    let api_parts = Api::parts(&mut opened_plane);
    let board = opened_plane.board();
    let plane = Arc::new(Mutex::new(opened_plane));
    let stop = Arc::new(AtomicBool::new(false));
    let liveness = Liveness::new(cfg.plane.round_interval);
    liveness.ticked();
    let rounds = {
        let plane = Arc::clone(&plane);
        let stop = Arc::clone(&stop);
        let liveness = liveness.clone();
        let period = cfg.plane.round_interval;
        std::thread::Builder::new()
            .name("arbiter-rounds".into())
            .spawn(move || {
                let mut next = Instant::now();
                while !stop.load(Ordering::Acquire) {
                    // The tenant policies are asked between the two
                    // halves, without the plane: the API stays responsive
                    // however long they take (up to their deadline).
                    let admission = plane.blocking_lock().begin_tick();
                    let decided = admission.decide();
                    plane.blocking_lock().end_tick(decided);
                    liveness.ticked();
                    next += period;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        // Overran the period: do not try to catch up in a burst.
                        next = now;
                    }
                }
            })
            .context("spawning the round loop")?
    };
    let api = Api::new(Arc::clone(&plane), api_parts);
    // Both reflection versions: clients on `v1alpha` (grpcurl's older
    // builds, Python grpcio-reflection) get answers too.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(arbiter_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(arbiter_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the v1alpha reflection service")?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut builder = tonic::transport::Server::builder();
    let ca_path = server_tls.as_ref().and_then(|t| t.ca_path.clone());
    let tls = server_tls.is_some();
    if let Some(t) = server_tls {
        builder = builder
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(t.cert_pem, t.key_pem)),
            )
            .context("the TLS certificate or key")?;
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    watch_health(health, liveness.clone());
    let router = builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(
            v1::jobs_server::JobsServer::new(api.clone()).max_decoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            v1::policies_server::PoliciesServer::new(api.clone())
                .max_decoding_message_size(MAX_MESSAGE),
        )
        .add_service(v1::experiments_server::ExperimentsServer::new(api.clone()))
        .add_service(v1::nodes_server::NodesServer::new(api.clone()))
        .add_service(v1::cluster_server::ClusterServer::new(api.clone()))
        .add_service(v1::node_link_server::NodeLinkServer::new(api.clone()));
    let grpc = tokio::spawn(router.serve_with_incoming_shutdown(
        // Nagle off on every accepted connection: a response is several
        // small HTTP/2 frames, and with Nagle on the peer's delayed ACK
        // holds the last of them for up to 40 ms (the reads' p99 was that).
        tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        async {
            let _ = rx.await;
        },
    ));
    let metrics_addr = match metrics_listener {
        Some(listener) => Some(serve_metrics(listener, board, liveness)?),
        None => None,
    };
    // After the API is up: what the directory holds loads (and is stored)
    // before `start` returns.
    let policies_dir = match cfg.policies_dir.clone() {
        Some(dir) => {
            let plane = Arc::clone(&plane);
            Some(
                tokio::task::spawn_blocking(move || crate::policies_dir::watch(plane, &dir))
                    .await
                    .context("starting the policy directory's watcher")??,
            )
        }
        None => None,
    };
    tracing::info!(%grpc_addr, ?metrics_addr, data = %cfg.data.display(), "arbiter control plane serving");
    Ok(Running {
        grpc_addr,
        tls,
        ca_path,
        metrics_addr,
        new_admin_token: opened.new_admin_token,
        new_node_token: opened.new_node_token,
        journal_path: opened.journal_path,
        plane,
        stop,
        shutdown: Some(tx),
        grpc,
        rounds: Some(rounds),
        policies_dir,
    })
}

/// Serves until Ctrl-C.
pub async fn serve(cfg: ServeConfig) -> anyhow::Result<()> {
    let running = start(cfg).await?;
    if let Some(token) = &running.new_admin_token {
        println!("admin token (also in the data directory's admin.token): {token}");
    }
    if running.new_node_token.is_some() {
        println!(
            "node token for `arbiter node --token` (NodeLink only): the data directory's node.token"
        );
    }
    println!("arbiter serving gRPC on {}", running.grpc_addr);
    if running.tls {
        match &running.ca_path {
            Some(ca) => println!(
                "TLS on: clients use https:// and trust {} (`--ca-cert`)",
                ca.display()
            ),
            None => println!("TLS on: clients use https://"),
        }
    }
    if let Some(m) = running.metrics_addr {
        println!("metrics on http://{m}/metrics");
    }
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    running.shutdown().await
}

/// Whether the round loop is alive: it ticked within the allowed silence.
#[derive(Clone)]
struct Liveness {
    started: Instant,
    /// Milliseconds since `started` of the round loop's last tick.
    last_tick_ms: Arc<std::sync::atomic::AtomicU64>,
    allowed_silence: std::time::Duration,
}

impl Liveness {
    fn new(round: std::time::Duration) -> Liveness {
        Liveness {
            started: Instant::now(),
            last_tick_ms: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            allowed_silence: (round * 20).max(std::time::Duration::from_secs(5)),
        }
    }

    fn ticked(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_tick_ms.store(ms, Ordering::Release);
    }

    /// `None` while alive; else how long the round loop has been silent.
    fn stalled(&self) -> Option<std::time::Duration> {
        let last = std::time::Duration::from_millis(self.last_tick_ms.load(Ordering::Acquire));
        let silent = self.started.elapsed().saturating_sub(last);
        (silent > self.allowed_silence).then_some(silent)
    }
}

/// Keeps the gRPC health service's overall status in step with the round
/// loop: NOT_SERVING while it is stalled.
fn watch_health(reporter: tonic_health::server::HealthReporter, liveness: Liveness) {
    tokio::spawn(async move {
        let mut serving = None;
        loop {
            let now = liveness.stalled().is_none();
            if serving != Some(now) {
                let status = if now {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                reporter.set_service_status("", status).await;
                serving = Some(now);
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
}

/// `/metrics` (OpenMetrics) and `/healthz` (200 while the round loop is
/// alive, 503 once it has been silent too long) over plain HTTP.
fn serve_metrics(
    listener: TcpListener,
    board: Arc<Board>,
    liveness: Liveness,
) -> anyhow::Result<SocketAddr> {
    let bound = listener.local_addr().context("metrics address")?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let board = Arc::clone(&board);
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        board.metrics_text(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(move || {
                let liveness = liveness.clone();
                async move {
                    match liveness.stalled() {
                        None => (axum::http::StatusCode::OK, "ok\n".to_string()),
                        Some(silent) => (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            format!("round loop silent for {:.1} s\n", silent.as_secs_f64()),
                        ),
                    }
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(bound)
}
