//! `arbiter serve` and `arbiter replay`.

use crate::client::parse_duration;
use arbiter_serve::plane::{PlaneConfig, default_pool};
use arbiter_serve::replay;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A listen address: `host:port` with the host an IP or a name, resolved
/// now (the first address it resolves to).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| format!("`{s}` is not host:port: {e}"))?
        .next()
        .ok_or_else(|| format!("`{s}` resolves to no address"))
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TlsArg {
    Auto,
    On,
    Off,
}

#[derive(Args)]
pub struct ServeArgs {
    /// gRPC address: `host:port`, the host a name (`localhost:7070`) or an IP.
    #[arg(long, default_value = "127.0.0.1:7070", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Data directory (embedded store, journal, compiled-policy cache, admin token).
    #[arg(long, default_value = "arbiter-data")]
    pub data: PathBuf,
    /// Prometheus endpoint address (`/metrics`), like `--listen`.
    #[arg(long, default_value = "127.0.0.1:9464", value_parser = parse_listen)]
    pub metrics: SocketAddr,
    /// Do not serve `/metrics` and `/healthz` over HTTP.
    #[arg(long)]
    pub no_metrics: bool,
    /// TLS for gRPC: `auto` serves it beyond loopback (a certificate of the
    /// plane's own CA, `<data>/tls/ca.pem`, unless `--tls-cert` is given);
    /// `on` always; `off` never (plaintext, also beyond loopback).
    #[arg(long, value_enum, default_value = "auto")]
    pub tls: TlsArg,
    /// PEM certificate chain to serve gRPC with (with `--tls-key`).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// More names (DNS or IP) the self-issued certificate covers, e.g. the
    /// name agents reach this machine by; repeatable.
    #[arg(long = "tls-san")]
    pub tls_sans: Vec<String>,
    /// Scheduling period.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub round: Duration,
    /// The decision journal's segment size, MiB (a full one is sealed and a
    /// new one begins with a checkpoint of every cell).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub journal_segment_mib: u64,
    /// The most the decision journal may take, MiB: the oldest segments go first.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub journal_max_mib: u64,
    /// Ended jobs kept in the job table and the store (the newest-ended).
    #[arg(long, default_value_t = 10_000)]
    pub keep_finished: usize,
    /// Ended jobs are dropped this long after they ended.
    #[arg(long, value_parser = parse_duration, default_value = "7d")]
    pub keep_finished_for: Duration,
    /// Simulated nodes in the embedded pool (0: only `arbiter node` agents; at most
    /// 100,000).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub nodes: u32,
    /// GPUs on each simulated node (1 to 1,024, a node's most).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=i64::from(arbiter_policy_sdk::model::MAX_NODE_GPUS)))]
    pub gpus_per_node: u32,
    /// Built-in policy the `default` slot starts with (first start only).
    #[arg(long, default_value = "best-fit")]
    pub policy: String,
    /// Run time of jobs that state none, on the simulated pool.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub default_duration: Duration,
    /// Heartbeat period asked of `arbiter node` agents.
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    pub heartbeat: Duration,
    /// How often the `matcher` slot (if a policy is loaded there) pairs offline
    /// with online jobs; `0s` turns matching off.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub match_every: Duration,
    /// An agent silent this long is lost and its jobs are rescheduled.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub lost_after: Duration,
    /// A GPU model's speed relative to the reference model, in permille, as
    /// policies see it (e.g. `--gpu-speed T4=333`); repeatable.
    #[arg(long = "gpu-speed", value_parser = parse_gpu_speed)]
    pub gpu_speeds: Vec<(String, u32)>,
    /// Most milli-GPU of opportunistic / best-effort work one GPU may carry
    /// beside its guaranteed work (contract 0.3 sharing rules); 0 = no
    /// sharing: every job is charged as guaranteed.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64_000))]
    pub oversub_milli: u32,
    /// Most shared workers on one GPU (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub max_shared_workers: u32,
    /// Shared work's memory is soft: the node may spill it to host memory,
    /// so it only has to fit beside other shared work.
    #[arg(long)]
    pub host_spill: bool,
    /// Memory, in MiB, all of one tenant's policy instances may hold
    /// together (each instance is also held to the per-policy cap).
    #[arg(long, default_value_t = arbiter_serve::plane::DEFAULT_TENANT_MEMORY_BYTES >> 20)]
    pub tenant_memory_mib: usize,
    /// Compiled code, in MiB, all of one tenant's policy generations may
    /// hold together.
    #[arg(long, default_value_t = arbiter_serve::plane::DEFAULT_TENANT_CODE_BYTES >> 20)]
    pub tenant_code_mib: usize,
    /// Watch this directory: `NAME.wasm` loads into slot `NAME` (`default.wasm`
    /// schedules the cluster; `reclaim`, `matcher`, `tenant:T`, or a slot for an
    /// experiment) as its active generation, with `NAME.toml` as its configuration;
    /// replacing either loads a new generation, removing the component unloads it.
    #[arg(long)]
    pub policies_dir: Option<PathBuf>,
    /// Meter every policy call in fuel (wasmtime's count of the guest's
    /// instructions), at most this much per call: a call past it faults "out of
    /// fuel" whatever the machine's speed, and the journal records what each
    /// round's policy consumed. Costs the guests some speed; off by default.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub fuel: Option<u64>,
}

/// `MODEL=PERMILLE`, e.g. `T4=333`.
fn parse_gpu_speed(s: &str) -> Result<(String, u32), String> {
    let (model, permille) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected MODEL=PERMILLE, e.g. T4=333"))?;
    let permille: u32 = permille
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: the speed must be a whole number of permille"))?;
    let max = arbiter_host::state::MAX_SPEED_PERMILLE;
    if model.trim().is_empty() || permille == 0 || permille > max {
        return Err(format!("`{s}`: need a model name and a speed in 1..={max}"));
    }
    Ok((model.trim().to_string(), permille))
}

pub fn serve(a: &ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!a.round.is_zero(), "--round must be positive");
    let cfg = arbiter_serve::ServeConfig {
        listen: a.listen,
        data: a.data.clone(),
        metrics_listen: (!a.no_metrics).then_some(a.metrics),
        tls: arbiter_serve::tls::TlsSettings {
            mode: match a.tls {
                TlsArg::Auto => arbiter_serve::tls::TlsMode::Auto,
                TlsArg::On => arbiter_serve::tls::TlsMode::On,
                TlsArg::Off => arbiter_serve::tls::TlsMode::Off,
            },
            cert: a.tls_cert.clone(),
            key: a.tls_key.clone(),
            sans: a.tls_sans.clone(),
        },
        policies_dir: a.policies_dir.clone(),
        plane: PlaneConfig {
            round_interval: a.round,
            nodes: default_pool(a.nodes, a.gpus_per_node),
            default_policy: a.policy.clone(),
            default_duration: a.default_duration,
            heartbeat: a.heartbeat,
            match_interval: (!a.match_every.is_zero()).then_some(a.match_every),
            lost_after: a.lost_after,
            gpu_speeds: a.gpu_speeds.clone(),
            sharing: arbiter_policy_sdk::model::SharingRules {
                oversub_milli: a.oversub_milli,
                max_shared_workers: a.max_shared_workers,
                host_spill: a.host_spill,
            },
            runtime: arbiter_host::runtime::RuntimeConfig {
                fuel: a.fuel,
                ..Default::default()
            },
            tenant_memory_bytes: a.tenant_memory_mib.saturating_mul(1 << 20),
            tenant_code_bytes: a.tenant_code_mib.saturating_mul(1 << 20),
            keep_finished: a.keep_finished,
            keep_finished_for: a.keep_finished_for,
            journal_limits: arbiter_serve::journal::JournalLimits {
                segment_bytes: a.journal_segment_mib << 20,
                max_bytes: a.journal_max_mib << 20,
            },
            ..PlaneConfig::default()
        },
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(arbiter_serve::serve(cfg))
}

#[derive(Args)]
pub struct ReplayArgs {
    /// The journal (`<data>/journal.jsonl`).
    pub journal: PathBuf,
    /// The policy to replay: a `.wasm` file or a built-in name.
    #[arg(long)]
    pub policy: String,
    /// Configuration file for `--policy`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The recorded policy for the counterfactual (default: the built-in whose
    /// digest served most rounds, if any).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Configuration file for `--baseline` (default: the configuration the
    /// journal recorded for it, else its manifest's default).
    #[arg(long)]
    pub baseline_config: Option<PathBuf>,
    /// Cell of the journal (`control` or `candidate`).
    #[arg(long, default_value = "control")]
    pub cell: String,
    /// Skip the counterfactual simulation.
    #[arg(long)]
    pub no_counterfactual: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

fn load(spec: &str) -> anyhow::Result<(String, Vec<u8>)> {
    Ok((spec.to_string(), arbiter_repro::read_policy(spec)?))
}

/// Progress on standard error for a long replay: at most every two seconds.
struct Progress {
    started: std::time::Instant,
    last: std::time::Instant,
}

impl Progress {
    fn new() -> Progress {
        let now = std::time::Instant::now();
        Progress {
            started: now,
            last: now,
        }
    }

    fn say(&mut self, what: &str) {
        eprintln!(
            "arbiter replay: {what} ({:.1} s)",
            self.started.elapsed().as_secs_f64()
        );
        self.last = std::time::Instant::now();
    }

    fn tick(&mut self, what: &str, done: usize, total: usize) {
        if self.last.elapsed() >= Duration::from_secs(2) {
            self.say(&format!("{what}: record {done} of {total}"));
        }
    }
}

pub fn replay(a: &ReplayArgs) -> anyhow::Result<()> {
    let mut progress = Progress::new();
    let journal = replay::read(&a.journal)?;
    progress.say(&format!(
        "read {} records ({} lines set aside)",
        journal.records.len(),
        journal.skipped.len()
    ));
    let (label, wasm) = load(&a.policy)?;
    let policy = replay::compile(&wasm)?;
    let read = |path: &Option<PathBuf>| -> anyhow::Result<Option<String>> {
        path.as_ref()
            .map(|p| arbiter_host::files::read_config(p))
            .transpose()
    };
    let config = read(&a.config)?;
    let baseline_config = read(&a.baseline_config)?;
    let exact = replay::exact_with_progress(
        &journal,
        &a.cell,
        &policy,
        config.as_deref(),
        &mut |done, total| progress.tick("bit-for-bit", done, total),
    )?;
    progress.say("bit-for-bit check done");
    let counterfactual = if a.no_counterfactual {
        None
    } else {
        let baseline = match &a.baseline {
            Some(b) => Some(load(b)?),
            None => match replay::main_digest(&journal, &a.cell) {
                None => {
                    eprintln!(
                        "arbiter: no round of cell `{}` was served by a component (the native \
                         fallback or nobody served them all); pass --baseline <built-in or wasm> \
                         for a counterfactual",
                        a.cell
                    );
                    None
                }
                Some(d) => {
                    let builtin = arbiter_policies::names()
                        .filter_map(|n| arbiter_policies::get(n).map(|b| (n, b)))
                        .find(|(_, b)| arbiter_serve::plane::sha256_hex(b) == d)
                        .map(|(n, b)| (n.to_string(), b.to_vec()));
                    if builtin.is_none() {
                        eprintln!(
                            "arbiter: the recorded policy (digest {}…) is not a built-in of this \
                             build; pass --baseline <its wasm> for a counterfactual",
                            &d[..12.min(d.len())]
                        );
                    }
                    builtin
                }
            },
        };
        match baseline {
            Some((blabel, bwasm)) => {
                let recorded = replay::compile(&bwasm)?;
                progress.say(&format!(
                    "counterfactual: simulating `{blabel}` and `{label}`"
                ));
                Some(replay::counterfactual(
                    &journal,
                    &a.cell,
                    replay::Contender {
                        label: &blabel,
                        policy: &recorded,
                        config: baseline_config.as_deref(),
                    },
                    replay::Contender {
                        label: &label,
                        policy: &policy,
                        config: config.as_deref(),
                    },
                )?)
            }
            None => None,
        }
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "exact": exact,
                "counterfactual": counterfactual,
            }))?
        );
    } else {
        println!(
            "journal {}: cell {}, {} rounds ({} lines set aside)",
            a.journal.display(),
            exact.cell,
            exact.rounds_in_journal,
            exact.skipped_lines.len()
        );
        for (line, why) in exact.skipped_lines.iter().take(5) {
            println!("  line {line}: {why}");
        }
        println!(
            "bit-for-bit: {} of {} rounds served by {} reproduced exactly",
            exact.rounds_identical,
            exact.rounds_compared,
            &exact.policy_digest[..12.min(exact.policy_digest.len())]
        );
        println!(
            "  native fallback: {} of {} rounds reproduced; served by nobody: {} of {} applied nothing",
            exact.native_rounds_identical,
            exact.native_rounds_compared,
            exact.unserved_rounds_empty,
            exact.unserved_rounds
        );
        for m in &exact.mismatches {
            println!("  {}", m.describe());
        }
        if let Some(c) = &counterfactual {
            println!(
                "counterfactual on {} jobs, {} nodes: {} vs {}",
                c.jobs, c.nodes, c.recorded_policy, c.candidate_policy
            );
            let rows = [
                ("avg JCT s", c.recorded.avg_jct_s, c.candidate.avg_jct_s),
                (
                    "avg queue s",
                    c.recorded.avg_queue_s,
                    c.candidate.avg_queue_s,
                ),
                (
                    "p95 queue s",
                    c.recorded.p95_queue_s,
                    c.candidate.p95_queue_s,
                ),
                ("makespan s", c.recorded.makespan_s, c.candidate.makespan_s),
                (
                    "mean GPU alloc %",
                    c.recorded.mean_gpu_alloc_pct,
                    c.candidate.mean_gpu_alloc_pct,
                ),
            ];
            for (name, r, k) in rows {
                println!("  {name:<18} {r:>10.2} {k:>10.2} ({:+.2})", k - r);
            }
        }
    }
    if !exact.all_identical() {
        anyhow::bail!(
            "rounds did not reproduce: {} of {} by the policy, {} of {} by the native fallback, {} \
             of {} served by nobody applied something",
            exact.rounds_compared - exact.rounds_identical,
            exact.rounds_compared,
            exact.native_rounds_compared - exact.native_rounds_identical,
            exact.native_rounds_compared,
            exact.unserved_rounds - exact.unserved_rounds_empty,
            exact.unserved_rounds
        );
    }
    if exact.rounds_compared == 0 {
        let served: Vec<String> = exact
            .served_by
            .iter()
            .map(|(d, n)| {
                let d = if d.is_empty() {
                    "native/nobody"
                } else {
                    &d[..12.min(d.len())]
                };
                format!("{d} × {n}")
            })
            .collect();
        anyhow::bail!(
            "no round of cell `{}` was served by {} (served by: {}); nothing of this policy to check",
            exact.cell,
            &exact.policy_digest[..12.min(exact.policy_digest.len())],
            if served.is_empty() {
                "none".to_string()
            } else {
                served.join(", ")
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_gpu_speed;

    #[test]
    fn gpu_speeds_parse_and_bad_ones_say_why() {
        assert_eq!(parse_gpu_speed("T4=333"), Ok(("T4".to_string(), 333)));
        assert_eq!(
            parse_gpu_speed(" A100 = 2500"),
            Ok(("A100".to_string(), 2500))
        );
        for bad in ["T4", "T4=", "T4=fast", "=333", "T4=0", "T4=100001"] {
            assert!(parse_gpu_speed(bad).is_err(), "{bad}");
        }
    }
}
