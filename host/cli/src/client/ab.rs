//! Experiments: `ab start|status|ls|promote|abort`.

use super::{Conn, ConnOnly, connect, print_json, status_error};
use arbiter_proto::v1;
use clap::{Args, Subcommand, ValueEnum};

#[derive(Subcommand)]
pub enum AbCommand {
    /// Start an experiment of a candidate slot against `default`.
    Start(AbStartArgs),
    /// Per-arm metrics with 95% confidence intervals, or the shadow diff.
    Status(AbRefArgs),
    /// Make the candidate the `default` policy.
    Promote(AbRefArgs),
    /// Stop the experiment; the control policy takes everything back.
    #[command(visible_alias = "stop")]
    Abort(AbRefArgs),
    /// Every experiment, running and ended.
    Ls(ConnOnly),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Split,
    Shadow,
}

#[derive(Args)]
pub struct AbStartArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// A name for the experiment (unique, kept after it ends).
    pub name: String,
    /// Slot whose active generation is the candidate.
    #[arg(long)]
    pub candidate: String,
    /// `split`: each arm schedules its share of jobs on its share of nodes;
    /// `shadow`: the candidate only answers a mirror of the control's rounds.
    #[arg(long, value_enum, default_value = "split")]
    pub mode: ModeArg,
    /// Tenants routed to the candidate (default: randomised assignment, a
    /// biased coin that keeps requested GPUs at the share).
    #[arg(long, value_delimiter = ',')]
    pub tenants: Vec<String>,
    /// Candidate's share of demand (randomised assignment) and of node capacity.
    #[arg(long, default_value_t = 0.5, value_parser = |s: &str| parse_within(s, 0.0, 1.0, false))]
    pub share: f64,
    /// Guardrail metric: queue_delay, jct, slo_violations or faults.
    #[arg(long, default_value = "queue_delay")]
    pub guardrail: String,
    /// False-rollback rate of the guardrail's sequential test; it holds however
    /// often the guardrail looks.
    #[arg(long, default_value_t = 0.05, value_parser = |s: &str| parse_within(s, 0.0, 0.5, false))]
    pub alpha: f64,
    /// Samples each arm needs before the guardrail weighs evidence.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub min_samples: u32,
    /// Candidate policy faults that roll it back at once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_faults: u32,
    /// The regression the guardrail is most sensitive to, as a fraction of the
    /// control's mean (0.1 = a candidate 10 % worse).
    #[arg(long, default_value_t = 0.1, value_parser = |s: &str| parse_within(s, 0.0, 10.0, true))]
    pub min_effect: f64,
}

/// A number above `low` and below `high` (up to it if `high_included`). The wire reads 0
/// as "the default", so an explicit 0 must be refused here rather than quietly replaced.
fn parse_within(s: &str, low: f64, high: f64, high_included: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    let below_high = v < high || (high_included && v == high);
    if v > low && below_high {
        Ok(v)
    } else {
        let close = if high_included { ']' } else { ')' };
        Err(format!("`{s}` is not in ({low}, {high}{close}"))
    }
}

#[derive(Args)]
pub struct AbRefArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The experiment.
    pub name: String,
}

fn est(e: &Option<v1::Estimate>) -> String {
    match e {
        Some(e) if e.samples > 0 && e.batches >= 2 => format!(
            "{:.1} [{:.1}, {:.1}] n={} ({} batches)",
            e.mean, e.ci_low, e.ci_high, e.samples, e.batches
        ),
        Some(e) if e.samples > 0 => {
            format!("{:.1} n={} (too few for an interval)", e.mean, e.samples)
        }
        _ => "-".into(),
    }
}

fn est_json(e: &Option<v1::Estimate>) -> serde_json::Value {
    match e {
        Some(e) => serde_json::json!({
            "mean": e.mean, "ci_low": e.ci_low, "ci_high": e.ci_high, "samples": e.samples,
            "batches": e.batches
        }),
        None => serde_json::Value::Null,
    }
}

fn exp_state(s: i32) -> &'static str {
    match v1::ExperimentState::try_from(s) {
        Ok(v1::ExperimentState::Running) => "running",
        Ok(v1::ExperimentState::Promoted) => "promoted",
        Ok(v1::ExperimentState::Aborted) => "aborted",
        Ok(v1::ExperimentState::RolledBack) => "rolled back",
        _ => "?",
    }
}

fn print_experiment(s: &v1::ExperimentStatus, json: bool) -> anyhow::Result<()> {
    if json {
        let arms: Vec<_> = s
            .arms
            .iter()
            .map(|a| {
                serde_json::json!({
                    "arm": a.arm, "slot": a.slot, "generation": a.generation,
                    "nodes": a.nodes, "gpus": a.gpus,
                    "jobs_submitted": a.jobs_submitted, "jobs_started": a.jobs_started,
                    "jobs_finished": a.jobs_finished,
                    "queue_delay_ms": est_json(&a.queue_delay_ms), "jct_ms": est_json(&a.jct_ms),
                    "gpu_allocation_pct": est_json(&a.gpu_allocation_pct),
                    "fragmentation_pct": est_json(&a.fragmentation_pct),
                    "preemptions": a.preemptions, "slo_violations": a.slo_violations,
                    "policy_faults": a.policy_faults,
                    "policy_latency_ms": est_json(&a.policy_latency_ms),
                })
            })
            .collect();
        let shadow = s.shadow.as_ref().map(|sh| {
            serde_json::json!({
                "rounds": sh.rounds, "rounds_identical": sh.rounds_identical,
                "placements_differing": sh.placements_differing,
                "jobs_differing": sh.jobs_differing,
                "candidate_only": sh.candidate_only, "incumbent_only": sh.incumbent_only,
                "incumbent_fragmentation_pct": sh.incumbent_fragmentation_pct,
                "candidate_fragmentation_pct": sh.candidate_fragmentation_pct,
                "candidate_faults": sh.candidate_faults, "candidate_invalid": sh.candidate_invalid,
                "recent": sh.recent.iter().map(|d| serde_json::json!({
                    "epoch": d.epoch, "job": d.job_name,
                    "incumbent": d.incumbent, "candidate": d.candidate,
                })).collect::<Vec<_>>(),
            })
        });
        return print_json(&serde_json::json!({
            "name": s.name,
            "mode": if s.mode == v1::ExperimentMode::Shadow as i32 { "shadow" } else { "split" },
            "state": exp_state(s.state),
            "candidate_slot": s.candidate_slot,
            "reason": s.reason,
            "arms": arms,
            "comparison": s.comparison.as_ref().map(|c| serde_json::json!({
                "metric": c.metric, "difference": c.difference,
                "ci_low": c.ci_low, "ci_high": c.ci_high, "always_valid_p": c.always_valid_p,
            })),
            "balance": s.balance.as_ref().map(|b| serde_json::json!({
                "control_jobs": b.control_jobs, "candidate_jobs": b.candidate_jobs,
                "control_gpu_hours": b.control_gpu_hours, "candidate_gpu_hours": b.candidate_gpu_hours,
                "target_share": b.target_share, "sample_ratio_p": b.sample_ratio_p,
                "mismatch": b.mismatch,
            })),
            "shadow": shadow,
        }));
    }
    println!(
        "experiment {} ({}) — {}{}",
        s.name,
        if s.mode == v1::ExperimentMode::Shadow as i32 {
            "shadow"
        } else {
            "split"
        },
        exp_state(s.state),
        if s.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", s.reason)
        }
    );
    for a in &s.arms {
        println!(
            "  {} ({} gen {}): {} nodes, {} GPUs; jobs {}/{}/{} enrolled/started/finished",
            a.arm,
            a.slot,
            a.generation,
            a.nodes,
            a.gpus,
            a.jobs_submitted,
            a.jobs_started,
            a.jobs_finished
        );
        println!("    queue delay ms   {}", est(&a.queue_delay_ms));
        println!("    JCT ms           {}", est(&a.jct_ms));
        println!("    GPU alloc %      {}", est(&a.gpu_allocation_pct));
        println!("    fragmentation %  {}", est(&a.fragmentation_pct));
        println!("    policy ms        {}", est(&a.policy_latency_ms));
        println!(
            "    preemptions {}, SLO violations {}, policy faults {}",
            a.preemptions, a.slo_violations, a.policy_faults
        );
    }
    if let Some(c) = &s.comparison {
        println!(
            "  candidate - control, {}: {:+.1} [95% CI {:.1}, {:.1}], always-valid p = {:.3}",
            c.metric, c.difference, c.ci_low, c.ci_high, c.always_valid_p
        );
    }
    if let Some(b) = &s.balance {
        let total = b.control_gpu_hours + b.candidate_gpu_hours;
        println!(
            "  balance: {}/{} jobs control/candidate, candidate share of GPU-hours {:.3} (target {:.3}); sample-ratio p = {:.3}{}",
            b.control_jobs,
            b.candidate_jobs,
            if total > 0.0 {
                b.candidate_gpu_hours / total
            } else {
                0.0
            },
            b.target_share,
            b.sample_ratio_p,
            if b.mismatch {
                " — MISMATCH: the split is not what was asked; do not trust the comparison"
            } else {
                ""
            }
        );
    }
    if let Some(sh) = &s.shadow {
        println!(
            "  shadow: {} rounds, {} identical; {} jobs placed differently ({} round-by-round differences: candidate-only {}, incumbent-only {}); candidate faults {}, invalid {}",
            sh.rounds,
            sh.rounds_identical,
            sh.jobs_differing,
            sh.placements_differing,
            sh.candidate_only,
            sh.incumbent_only,
            sh.candidate_faults,
            sh.candidate_invalid
        );
        println!(
            "  fragmentation after decisions: incumbent {:.1}%, candidate {:.1}%",
            sh.incumbent_fragmentation_pct, sh.candidate_fragmentation_pct
        );
        for d in sh.recent.iter().rev().take(10) {
            println!(
                "    epoch {} {}: incumbent {} | candidate {}",
                d.epoch,
                d.job_name,
                if d.incumbent.is_empty() {
                    "-"
                } else {
                    &d.incumbent
                },
                if d.candidate.is_empty() {
                    "-"
                } else {
                    &d.candidate
                }
            );
        }
    }
    Ok(())
}

pub async fn ab(cmd: &AbCommand) -> anyhow::Result<()> {
    match cmd {
        AbCommand::Start(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .experiments
                .start(v1::StartExperimentRequest {
                    name: a.name.clone(),
                    mode: match a.mode {
                        ModeArg::Split => v1::ExperimentMode::Split,
                        ModeArg::Shadow => v1::ExperimentMode::Shadow,
                    } as i32,
                    candidate_slot: a.candidate.clone(),
                    candidate_tenants: a.tenants.clone(),
                    candidate_share: a.share,
                    guardrail: Some(v1::Guardrail {
                        metric: a.guardrail.clone(),
                        alpha: a.alpha,
                        min_samples: a.min_samples,
                        max_faults: a.max_faults,
                        min_effect: a.min_effect,
                    }),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_experiment(&s, a.conn.json)
        }
        AbCommand::Status(a) | AbCommand::Promote(a) | AbCommand::Abort(a) => {
            let mut c = connect(&a.conn).await?;
            let r = v1::ExperimentRef {
                name: a.name.clone(),
            };
            let s = match cmd {
                AbCommand::Status(_) => c.experiments.status(r).await,
                AbCommand::Promote(_) => c.experiments.promote(r).await,
                _ => c.experiments.abort(r).await,
            }
            .map_err(status_error)?
            .into_inner();
            print_experiment(&s, a.conn.json)
        }
        AbCommand::Ls(a) => {
            let mut c = connect(&a.conn).await?;
            let all = c
                .experiments
                .list(v1::ListExperimentsRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .experiments;
            if a.conn.json {
                return print_json(
                    &all.iter()
                        .map(|s| {
                            serde_json::json!({
                                "name": s.name, "state": exp_state(s.state),
                                "candidate_slot": s.candidate_slot, "reason": s.reason,
                                "started_ms": s.started_ms, "ended_ms": s.ended_ms,
                            })
                        })
                        .collect::<Vec<_>>(),
                );
            }
            println!("{:<24} {:<12} {:<16} REASON", "NAME", "STATE", "CANDIDATE");
            for s in &all {
                println!(
                    "{:<24} {:<12} {:<16} {}",
                    s.name,
                    exp_state(s.state),
                    s.candidate_slot,
                    s.reason
                );
            }
            Ok(())
        }
    }
}
