//! What the control-plane benches share: a plane serving on loopback, and
//! the bearer-token interceptor their gRPC clients authenticate with.

use arbiter_serve::plane::PlaneConfig;
use arbiter_serve::server::{Running, ServeConfig, start};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// A plane serving gRPC on a loopback port, its data in a temporary
/// directory (kept while this lives), a channel to it and the admin's token.
pub struct Served {
    pub running: Running,
    pub channel: Channel,
    pub admin: Bearer,
    pub dir: tempfile::TempDir,
}

pub async fn serve(plane: PlaneConfig) -> anyhow::Result<Served> {
    let dir = tempfile::tempdir()?;
    let running = start(ServeConfig {
        tls: Default::default(),
        policies_dir: None,
        listen: "127.0.0.1:0".parse()?,
        data: dir.path().to_path_buf(),
        metrics_listen: None,
        plane,
    })
    .await?;
    let admin = Bearer::new(&running.new_admin_token.clone().unwrap_or_default())?;
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))?
        .connect()
        .await?;
    Ok(Served {
        running,
        channel,
        admin,
        dir,
    })
}

#[derive(Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl Bearer {
    pub fn new(token: &str) -> anyhow::Result<Bearer> {
        Ok(Bearer(format!("Bearer {token}").parse()?))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}
