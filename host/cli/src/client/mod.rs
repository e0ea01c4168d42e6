//! Client commands: they talk to `arbiter serve` over gRPC.
//!
//! Every command takes `--server <url>` (env `ARBITER_SERVER`) and
//! `--token <token>` (env `ARBITER_TOKEN`; else the admin token in
//! `./arbiter-data/admin.token`, which `arbiter serve` writes on first start),
//! after the command or before it (`arbiter --server URL jobs`).
//!
//! One module per command group (`jobs`, `policies`, `ab`, `top`, `nodes`, `tenants`);
//! this one holds what they share: the connection options and client, `--watch`, errors
//! and JSON output.

mod ab;
mod jobs;
mod nodes;
mod policies;
mod tenants;
mod top;

pub use ab::{AbCommand, ab};
pub use jobs::{
    CancelArgs, DescribeJobArgs, JobsArgs, ProgressArgs, ServiceArgs, SubmitArgs, cancel,
    describe_job, jobs, progress, service, submit,
};
pub use nodes::{NodesCommand, nodes};
pub use policies::{RemotePolicy, remote_ls, remote_policy};
pub use tenants::{TenantCommand, TokenCommand, tenant, token_command};
pub use top::{TopArgs, top};

use anyhow::Context;
use arbiter_proto::v1;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

#[derive(Args, Clone)]
pub struct Conn {
    /// Control-plane URL.
    #[arg(
        long,
        env = "ARBITER_SERVER",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub server: String,
    /// Bearer token (admin or tenant).
    #[arg(long, env = "ARBITER_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate to trust for an `https://` server (the plane's own:
    /// `<data>/tls/ca.pem`); default: the system's roots.
    #[arg(long, env = "ARBITER_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

type Auth = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

fn token(conn: &Conn) -> anyhow::Result<String> {
    if let Some(t) = &conn.token {
        return Ok(t.clone());
    }
    let path = PathBuf::from("arbiter-data/admin.token");
    std::fs::read_to_string(&path)
        .map(|t| t.trim().to_string())
        .with_context(|| {
            format!(
                "no --token given (or ARBITER_TOKEN) and {} is not readable",
                path.display()
            )
        })
}

pub struct Clients {
    pub jobs: v1::jobs_client::JobsClient<Auth>,
    pub policies: v1::policies_client::PoliciesClient<Auth>,
    pub experiments: v1::experiments_client::ExperimentsClient<Auth>,
    pub nodes: v1::nodes_client::NodesClient<Auth>,
    pub cluster: v1::cluster_client::ClusterClient<Auth>,
}

pub async fn connect(conn: &Conn) -> anyhow::Result<Clients> {
    let token = token(conn)?;
    let header: MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .context("the token is not valid header text")?;
    let ca = match &conn.ca_cert {
        Some(p) => Some(arbiter_host::files::read_at_most(
            p,
            arbiter_host::files::MAX_CONFIG_FILE,
        )?),
        None => None,
    };
    let channel =
        arbiter_proto::endpoint::endpoint(&conn.server, ca.as_deref(), Duration::from_secs(5))?
            .connect()
            .await
            .with_context(|| format!("connecting to {}", conn.server))?;
    let auth = Bearer(header);
    const MAX: usize = 32 << 20;
    Ok(Clients {
        jobs: v1::jobs_client::JobsClient::with_interceptor(channel.clone(), auth.clone()),
        policies: v1::policies_client::PoliciesClient::with_interceptor(
            channel.clone(),
            auth.clone(),
        )
        .max_encoding_message_size(MAX),
        experiments: v1::experiments_client::ExperimentsClient::with_interceptor(
            channel.clone(),
            auth.clone(),
        ),
        nodes: v1::nodes_client::NodesClient::with_interceptor(channel.clone(), auth.clone()),
        cluster: v1::cluster_client::ClusterClient::with_interceptor(channel, auth),
    })
}

/// `10m`, `30s`, `1h 30m`, `250ms` (humantime's forms). A bare number is
/// refused (`--duration 30` meant 30 ms to the API and 30 s to most
/// people); `0` alone needs no unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return if n == 0 {
            Ok(Duration::ZERO)
        } else {
            Err(format!(
                "`{s}` has no unit: write {s}s for seconds or {s}ms for milliseconds"
            ))
        };
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like 250ms, 30s, 10m or 1h 30m: {e}"))
}

/// A status from the plane as an error: its code and message, each once.
fn status_error(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", e.code(), e.message())
}

fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[derive(Args)]
pub struct ConnOnly {
    #[command(flatten)]
    pub conn: Conn,
}

/// A refresh period a person can read and the plane need not notice: `--watch 1ms` asked
/// the plane a thousand times a second and scrolled the terminal unreadably.
pub fn parse_watch(s: &str) -> Result<Duration, String> {
    let period = parse_duration(s)?;
    if period < Duration::from_millis(100) {
        return Err(format!(
            "`{s}` refreshes faster than a person reads: at least 100ms"
        ));
    }
    Ok(period)
}

/// Runs `show` once, or every `period` (clearing a terminal first) until interrupted.
pub async fn every<F, Fut>(period: Option<Duration>, mut show: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let Some(period) = period else {
        return show().await;
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        if terminal {
            print!("\x1b[2J\x1b[H");
        }
        show().await?;
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_garbage() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("42").is_err_and(|e| e.contains("42s") && e.contains("42ms")));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("m").is_err());
    }
}
