//! Issue 15, worst case: the resident memory of a live control plane after
//! 100 hostile uploads by one tenant (target: at most 256 MiB above idle),
//! against the same plane after 100 uploads of a well-behaved policy (the
//! baseline, same run).
//!
//! The hostile uploads cycle through the `arbiter-hostile` corpus (compile
//! bombs, many memories, hostile manifests, `configure` that loops, traps or
//! allocates, misbehaving modes): everything a tenant can send through
//! `Policies.Upload`. Resident memory is read from `/proc/self/status` after
//! the uploads and a second of rounds.
//!
//! `cargo bench -p arbiter-serve --bench hostile_uploads`

mod common;

use arbiter_proto::v1;
use arbiter_serve::plane::{PlaneConfig, default_pool};
use common::Bearer;
use std::time::Duration;

const UPLOADS: usize = 100;

/// (resident, peak resident) in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb << 10)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resident memory growth (bytes) of a fresh plane over `UPLOADS` uploads by
/// one tenant, and how many were accepted.
async fn growth(uploads: &[(Vec<u8>, String)]) -> anyhow::Result<(i64, usize)> {
    let common::Served {
        running,
        channel,
        admin,
        dir: _dir,
        ..
    } = common::serve(PlaneConfig {
        round_interval: Duration::from_millis(20),
        nodes: default_pool(4, 8),
        ..PlaneConfig::default()
    })
    .await?;
    let mut cluster = v1::cluster_client::ClusterClient::with_interceptor(channel.clone(), admin);
    let token = cluster
        .add_tenant(v1::AddTenantRequest {
            name: "tenant".into(),
            quota_gpus: 0,
        })
        .await?
        .into_inner()
        .token;
    let mut policies =
        v1::policies_client::PoliciesClient::with_interceptor(channel, Bearer::new(&token)?)
            .max_encoding_message_size(64 << 20);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle, _) = rss();
    let mut accepted = 0;
    for (wasm, config) in uploads.iter().cycle().take(UPLOADS) {
        let reply = policies
            .upload(v1::UploadPolicyRequest {
                slot: String::new(),
                wasm: wasm.clone(),
                config: config.clone(),
                activate: true,
            })
            .await;
        accepted += usize::from(reply.is_ok());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (after, _) = rss();
    running.shutdown().await?;
    Ok((after as i64 - idle as i64, accepted))
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let good = arbiter_policies::fixture("misbehave").ok_or_else(|| anyhow::anyhow!("fixture"))?;
    let benign = vec![(good.to_vec(), String::new())];
    let hostile: Vec<(Vec<u8>, String)> = arbiter_hostile::corpus()
        .into_iter()
        .map(|c| (c.wasm, c.config.unwrap_or_default()))
        .collect();
    // Every upload a new digest: what the compiled cache must bound.
    let distinct: Vec<(Vec<u8>, String)> = (0..UPLOADS)
        .map(|i| {
            (
                arbiter_hostile::misbehave_as(&format!("distinct-{i}")),
                String::new(),
            )
        })
        .collect();
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    let (benign_growth, benign_ok) = runtime.block_on(growth(&benign))?;
    let (hostile_growth, hostile_ok) = runtime.block_on(growth(&hostile))?;
    let (distinct_growth, distinct_ok) = runtime.block_on(growth(&distinct))?;
    let (_, peak) = rss();
    println!(
        "{UPLOADS} benign uploads ({benign_ok} accepted): resident +{:.1} MiB",
        mib(benign_growth)
    );
    println!(
        "{UPLOADS} hostile uploads ({hostile_ok} accepted, {} distinct cases): resident +{:.1} MiB (target ≤ 256 MiB); {:.2}× the benign growth",
        hostile.len(),
        mib(hostile_growth),
        hostile_growth as f64 / benign_growth.max(1) as f64
    );
    println!(
        "{UPLOADS} distinct well-behaved components ({distinct_ok} accepted): resident +{:.1} MiB (target ≤ 256 MiB); {:.2}× the benign growth",
        mib(distinct_growth),
        distinct_growth as f64 / benign_growth.max(1) as f64
    );
    println!(
        "peak resident of the bench process: {:.1} MiB",
        mib(peak as i64)
    );
    Ok(())
}
