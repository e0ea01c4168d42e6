//! Control-plane benchmarks (issue 4 targets), each with a baseline from the
//! same run:
//!
//! 1. submission throughput over loopback gRPC (target ≥ 10,000 jobs/s),
//!    against a no-op authenticated RPC (`Cluster.View`);
//! 2. journal overhead on the round (target ≤ 5%), journal on vs off;
//! 3. what a shadow experiment adds to the control round (target ≤ the
//!    candidate's own policy time), shadow on vs off;
//! 4. the p99 of read calls (`Jobs.List`, `Cluster.View`) while a tenant's
//!    policy, then also the cluster's scheduler, takes most of its deadline
//!    every round, against the same calls on an idle plane (target ≤ 2×).
//!
//! `cargo bench -p arbiter-serve --bench control_plane [-- --quick]`

mod common;

use arbiter_proto::v1;
use arbiter_serve::convert;
use arbiter_serve::plane::{Caller, Plane, PlaneConfig, default_pool};
use arbiter_serve::records::NewJob;
use common::Bearer;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

fn spec(i: u64, duration_ms: u64) -> v1::JobSpec {
    v1::JobSpec {
        name: format!("j{i}"),
        gpus: 1 + (i % 4) as u32,
        duration_ms,
        ..Default::default()
    }
}

async fn submission(quick: bool) -> anyhow::Result<()> {
    let common::Served {
        running,
        channel,
        admin: auth,
        dir: _dir,
        ..
    } = common::serve(PlaneConfig {
        nodes: default_pool(64, 8),
        default_duration: Duration::from_secs(5),
        ..PlaneConfig::default()
    })
    .await?;
    let clients: usize = 64;
    let per_client: u64 = if quick { 100 } else { 500 };
    let total = clients as u64 * per_client;

    // Baseline: the cheapest authenticated RPC.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut c =
            v1::cluster_client::ClusterClient::with_interceptor(channel.clone(), auth.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_client {
                c.view(v1::ClusterViewRequest {}).await?;
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let view_rate = total as f64 / started.elapsed().as_secs_f64();

    // Batches of 100 from one client (on an empty plane, before the flood).
    let mut c = v1::jobs_client::JobsClient::with_interceptor(channel.clone(), auth.clone());
    let batches = if quick { 20 } else { 100 };
    let started = Instant::now();
    for b in 0..batches {
        c.submit_batch(v1::SubmitJobsRequest {
            specs: (0..100)
                .map(|i| spec(1_000_000 + b * 100 + i, 5_000))
                .collect(),
        })
        .await?;
    }
    let batch_rate = (batches * 100) as f64 / started.elapsed().as_secs_f64();
    // Single-job submissions, each acknowledged only once durable.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..clients as u64 {
        let mut c = v1::jobs_client::JobsClient::with_interceptor(channel.clone(), auth.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..per_client {
                c.submit(v1::SubmitJobRequest {
                    spec: Some(spec(k * per_client + i, 5_000)),
                })
                .await?;
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let submit_rate = total as f64 / started.elapsed().as_secs_f64();

    println!(
        "submission over loopback ({clients} concurrent clients, {total} jobs, durable acks):"
    );
    println!("  baseline Cluster.View      {view_rate:>10.0} calls/s");
    println!(
        "  Jobs.Submit                {submit_rate:>10.0} jobs/s  ({:.2}x baseline; target >= 10000)",
        submit_rate / view_rate
    );
    println!("  Jobs.SubmitBatch (100/req) {batch_rate:>10.0} jobs/s  (one client)");
    running.shutdown().await?;
    Ok(())
}

/// Loop iterations of the `misbehave` fixture's `slow` mode that take
/// about `target` (measured here, on this machine, through the host runtime).
fn calibrate_spin(target: Duration) -> anyhow::Result<u64> {
    use arbiter_host::runtime::{PolicyEngine, RuntimeConfig};
    let engine = PolicyEngine::new(RuntimeConfig {
        deadline: Duration::from_secs(30),
        ..RuntimeConfig::default()
    })?;
    let wasm = arbiter_policies::fixture("misbehave")
        .ok_or_else(|| anyhow::anyhow!("no misbehave fixture"))?;
    let compiled = engine
        .compile(wasm)
        .map_err(|e| anyhow::anyhow!("compiling the fixture: {e}"))?;
    let mut instance = compiled
        .instantiate()
        .map_err(|e| anyhow::anyhow!("instantiating: {e}"))?;
    let probe: u64 = 50_000_000;
    instance
        .configure(&format!("mode = \"slow\"\nspin = {probe}\n"))
        .map_err(|e| anyhow::anyhow!("configuring: {e}"))?;
    let started = Instant::now();
    instance
        .order(arbiter_policy_sdk::model::TenantView::default())
        .map_err(|e| anyhow::anyhow!("probe call: {e}"))?;
    let per_iteration = started.elapsed().as_secs_f64() / probe as f64;
    Ok((target.as_secs_f64() / per_iteration) as u64)
}

/// p50 and p99 of `calls` sequential reads (alternately `Jobs.List` of 100
/// jobs and `Cluster.View`), in ms.
async fn read_quantiles(
    channel: &Channel,
    auth: &Bearer,
    calls: usize,
) -> anyhow::Result<(f64, f64)> {
    let mut jobs = v1::jobs_client::JobsClient::with_interceptor(channel.clone(), auth.clone());
    let mut cluster =
        v1::cluster_client::ClusterClient::with_interceptor(channel.clone(), auth.clone());
    let mut ms = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        if i % 2 == 0 {
            jobs.list(v1::ListJobsRequest {
                limit: 100,
                ..Default::default()
            })
            .await?;
        } else {
            cluster.view(v1::ClusterViewRequest {}).await?;
        }
        ms.push(started.elapsed().as_secs_f64() * 1e3);
        // Spread the calls over many rounds.
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok((q(0.5), q(0.99)))
}

/// [`read_quantiles`], and how long a tick took meanwhile (ms).
async fn reads_meanwhile(
    channel: &Channel,
    admin: &Bearer,
    calls: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut cluster =
        v1::cluster_client::ClusterClient::with_interceptor(channel.clone(), admin.clone());
    let rounds_before = cluster
        .view(v1::ClusterViewRequest {})
        .await?
        .into_inner()
        .rounds;
    let window = Instant::now();
    let (p50, p99) = read_quantiles(channel, admin, calls).await?;
    let rounds = cluster
        .view(v1::ClusterViewRequest {})
        .await?
        .into_inner()
        .rounds
        - rounds_before;
    let tick_ms = window.elapsed().as_secs_f64() * 1e3 / rounds.max(1) as f64;
    Ok((p50, p99, tick_ms))
}

/// Faults of slot `slot`'s generations so far.
async fn slot_faults(channel: &Channel, caller: &Bearer, slot: &str) -> anyhow::Result<u64> {
    let info =
        v1::policies_client::PoliciesClient::with_interceptor(channel.clone(), caller.clone())
            .describe(v1::SlotRef { slot: slot.into() })
            .await?
            .into_inner();
    Ok(info.generations.iter().map(|g| g.faults).sum())
}

async fn read_latency(quick: bool) -> anyhow::Result<()> {
    let common::Served {
        running,
        channel,
        admin,
        dir: _dir,
        ..
    } = common::serve(PlaneConfig {
        nodes: default_pool(8, 8),
        default_duration: Duration::from_secs(600),
        ..PlaneConfig::default()
    })
    .await?;
    let mut jobs = v1::jobs_client::JobsClient::with_interceptor(channel.clone(), admin.clone());
    jobs.submit_batch(v1::SubmitJobsRequest {
        specs: (0..200).map(|i| spec(i, 600_000)).collect(),
    })
    .await?;
    let calls = if quick { 100 } else { 400 };
    let (idle_p50, idle_p99) = read_quantiles(&channel, &admin, calls).await?;

    // A tenant whose policy takes ~80 % of its deadline on every round: it
    // has jobs queued past its quota, so it is asked every tick.
    let deadline = arbiter_host::runtime::RuntimeConfig::default().deadline;
    let spin = calibrate_spin(deadline.mul_f64(0.8))?;
    let mut cluster =
        v1::cluster_client::ClusterClient::with_interceptor(channel.clone(), admin.clone());
    let tenant = cluster
        .add_tenant(v1::AddTenantRequest {
            name: "busy".into(),
            quota_gpus: 1,
        })
        .await?
        .into_inner();
    let busy = Bearer::new(&tenant.token)?;
    let mut policies =
        v1::policies_client::PoliciesClient::with_interceptor(channel.clone(), busy.clone())
            .max_encoding_message_size(32 << 20);
    policies
        .upload(v1::UploadPolicyRequest {
            slot: String::new(),
            wasm: arbiter_policies::fixture("misbehave")
                .ok_or_else(|| anyhow::anyhow!("no misbehave fixture"))?
                .to_vec(),
            config: format!("mode = \"slow\"\nspin = {spin}\n"),
            activate: true,
        })
        .await?;
    let mut busy_jobs =
        v1::jobs_client::JobsClient::with_interceptor(channel.clone(), busy.clone());
    busy_jobs
        .submit_batch(v1::SubmitJobsRequest {
            specs: (0..20)
                .map(|i| spec(10_000 + i, 600_000))
                .map(|mut s| {
                    s.gpus = 1;
                    s
                })
                .collect(),
        })
        .await?;
    let (busy_p50, busy_p99, tick_ms) = reads_meanwhile(&channel, &admin, calls).await?;
    let faults = slot_faults(&channel, &busy, "tenant:busy").await?;

    // And the cluster's own scheduler slow too: its round runs under the
    // plane's lock, which reads no longer take. At 60 % of its deadline: its
    // call also brings its mirror up to date, and a call past the deadline
    // would soon quarantine it (and the fallback is fast).
    let scheduler_spin = calibrate_spin(deadline.mul_f64(0.6))?;
    let mut admin_policies =
        v1::policies_client::PoliciesClient::with_interceptor(channel.clone(), admin.clone())
            .max_encoding_message_size(32 << 20);
    admin_policies
        .upload(v1::UploadPolicyRequest {
            slot: "default".into(),
            wasm: arbiter_policies::fixture("misbehave")
                .ok_or_else(|| anyhow::anyhow!("no misbehave fixture"))?
                .to_vec(),
            config: format!("mode = \"slow\"\nspin = {scheduler_spin}\n"),
            activate: true,
        })
        .await?;
    let (both_p50, both_p99, both_tick_ms) = reads_meanwhile(&channel, &admin, calls).await?;
    let scheduler_faults = slot_faults(&channel, &admin, "default").await?;
    println!("read calls (Jobs.List of 100 / Cluster.View, {calls} calls, 200 jobs):");
    println!("  idle plane                    p50 {idle_p50:>7.2} ms  p99 {idle_p99:>7.2} ms");
    println!(
        "  tenant policy ~{:.0} ms a round  p50 {busy_p50:>7.2} ms  p99 {busy_p99:>7.2} ms  ({:.2}x idle p99; target <= 2x; tenant policy faults {faults}; a tick took {tick_ms:.0} ms meanwhile)",
        deadline.as_secs_f64() * 800.0,
        busy_p99 / idle_p99,
    );
    println!(
        "  + scheduler ~{:.0} ms a round    p50 {both_p50:>7.2} ms  p99 {both_p99:>7.2} ms  ({:.2}x idle p99; target <= 2x; scheduler faults {scheduler_faults}; a tick took {both_tick_ms:.0} ms meanwhile)",
        deadline.as_secs_f64() * 600.0,
        both_p99 / idle_p99,
    );
    running.shutdown().await?;
    Ok(())
}

/// Mean tick time over a workload that keeps the cluster busy.
fn ticks(cfg: PlaneConfig, rounds: u32, shadow: bool) -> anyhow::Result<(f64, f64, f64)> {
    let dir = tempfile::tempdir()?;
    let mut opened = Plane::open(cfg, dir.path())?;
    let plane = &mut opened.plane;
    if shadow {
        let wasm = arbiter_policies::get("fifo").ok_or_else(|| anyhow::anyhow!("no fifo"))?;
        let compiled =
            Plane::compile(&plane.registry(), wasm).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (_, ack) = plane
            .upload(&Caller::Admin, "fifo", compiled, wasm, "", true)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        ack.wait()?;
        let request = convert::experiment_request(&v1::StartExperimentRequest {
            name: "shadow".into(),
            mode: v1::ExperimentMode::Shadow as i32,
            candidate_slot: "fifo".into(),
            ..Default::default()
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let ack = plane
            .start_experiment(&Caller::Admin, request)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        ack.wait()?;
    }
    let mut next = 0u64;
    let mut total = Duration::ZERO;
    for r in 0..rounds {
        // 40 new jobs a round with 200-400 ms run times: a busy, churning cluster.
        let jobs = (0..40)
            .map(|_| {
                next += 1;
                let spec = spec(next, 200 + (next % 3) * 100);
                convert::submitted_spec(&spec)
                    .validated()
                    .map(|spec| NewJob {
                        spec,
                        tenant: String::new(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let (_, ack) = plane
            .submit(&Caller::Admin, jobs)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        drop(ack);
        let started = Instant::now();
        plane.tick();
        if r >= 10 {
            total += started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let candidate_ms = if shadow {
        let status = plane
            .board()
            .experiment("shadow")
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        status
            .arms
            .iter()
            .find(|a| a.arm == "candidate")
            .map_or(0.0, |a| a.policy_latency_ms.mean)
    } else {
        0.0
    };
    // Journal time over the time of the rounds (the round loop's part of a tick).
    let (journal_s, round_s) = plane.journal_and_round_seconds();
    let journal_share = if round_s > 0.0 {
        journal_s / (round_s + journal_s)
    } else {
        0.0
    };
    if journal_s > 0.0 {
        println!(
            "    (per round: journal {:.1} us, round {:.1} us)",
            journal_s * 1e6 / f64::from(rounds),
            round_s * 1e6 / f64::from(rounds)
        );
    }
    Ok((
        total.as_secs_f64() * 1e3 / f64::from(rounds - 10),
        candidate_ms,
        journal_share,
    ))
}

fn rounds(quick: bool) -> anyhow::Result<()> {
    let n = if quick { 110 } else { 410 };
    let base = PlaneConfig {
        nodes: default_pool(128, 8),
        ..PlaneConfig::default()
    };
    let off = PlaneConfig {
        journal: false,
        ..base.clone()
    };
    // Interleave to spread machine noise over both.
    let (a1, _, _) = ticks(off.clone(), n, false)?;
    let (b1, _, share1) = ticks(base.clone(), n, false)?;
    let (a2, _, _) = ticks(off, n, false)?;
    let (b2, _, share2) = ticks(base.clone(), n, false)?;
    let (without, with) = ((a1 + a2) / 2.0, (b1 + b2) / 2.0);
    println!("round time, 128 nodes x 8 GPUs, 40 submissions/round, best-fit ({n} rounds x2):");
    println!("  journal off {without:>8.3} ms");
    println!(
        "  journal on  {with:>8.3} ms  (tick difference {:+.1}%; measured journal share of round time {:.2}%; target <= 5%)",
        100.0 * (with - without) / without,
        50.0 * (share1 + share2)
    );
    let (shadowed, candidate, _) = ticks(base, n, true)?;
    println!(
        "  shadow on   {shadowed:>8.3} ms  (adds {:+.3} ms; candidate's own policy time {candidate:.3} ms; target: adds <= that)",
        shadowed - with
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async {
            submission(quick).await?;
            read_latency(quick).await
        })?;
    rounds(quick)
}
