//! What a scenario run reports: the scenario, every run, the per-policy
//! means of the FGD protocol, and their human and JSON forms.

use crate::metrics::{self, FgdMetrics};
use crate::run::{Protocol, RunOutput};
use crate::scenario::{Rejected, Source};
use serde::Serialize;
use std::path::PathBuf;

/// The scenario a run used.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioSummary {
    pub name: String,
    pub source: Source,
    pub protocol: Protocol,
    pub nodes: usize,
    pub gpus: u64,
    pub tasks: usize,
    /// Tasks set aside before the run (no node could ever hold them).
    pub rejected: usize,
    /// The first few rejections with their reasons.
    pub rejected_examples: Vec<Rejected>,
}

/// Mean over seeds of one policy's FGD-protocol runs.
#[derive(Clone, Debug, Serialize)]
pub struct FgdSummary {
    pub policy: String,
    pub seeds: usize,
    pub gpu_alloc_pct_at_100: f64,
    pub gpu_alloc_pct_at_130: f64,
    pub gpu_alloc_pct_at_130_sd: f64,
    pub unallocated_gpus_at_130: f64,
    pub frag_ratio_pct_at_80: f64,
    pub wall_seconds: f64,
}

/// Everything `arbiter sim` produced.
#[derive(Clone, Debug, Serialize)]
pub struct SimOutput {
    pub scenario: ScenarioSummary,
    /// One per policy and seed, in the order given.
    pub runs: Vec<RunOutput>,
    /// FGD protocol: per-policy means over the seeds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fgd_summary: Vec<FgdSummary>,
    /// Where `--report` wrote its files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_dir: Option<PathBuf>,
    /// Whole command, loading included.
    pub wall_seconds: f64,
}

/// Per-policy means of FGD-protocol runs.
pub fn fgd_summary(runs: &[RunOutput]) -> Vec<FgdSummary> {
    let mut order: Vec<&str> = Vec::new();
    for r in runs {
        if r.fgd.is_some() && !order.contains(&r.policy.as_str()) {
            order.push(&r.policy);
        }
    }
    order
        .into_iter()
        .map(|policy| {
            let mine: Vec<&RunOutput> = runs.iter().filter(|r| r.policy == policy).collect();
            let get = |f: fn(&FgdMetrics) -> f64| -> Vec<f64> {
                mine.iter().filter_map(|r| r.fgd.as_ref()).map(f).collect()
            };
            let at_130 = get(|m| m.gpu_alloc_pct_at_130);
            FgdSummary {
                policy: policy.to_string(),
                seeds: mine.len(),
                gpu_alloc_pct_at_100: metrics::mean(&get(|m| m.gpu_alloc_pct_at_100)),
                gpu_alloc_pct_at_130: metrics::mean(&at_130),
                gpu_alloc_pct_at_130_sd: metrics::std_dev(&at_130),
                unallocated_gpus_at_130: metrics::mean(&get(|m| m.unallocated_gpus_at_130)),
                frag_ratio_pct_at_80: metrics::mean(&get(|m| m.frag_ratio_pct_at_80)),
                wall_seconds: mine.iter().map(|r| r.wall_seconds).sum(),
            }
        })
        .collect()
}

/// A duration to read at a glance: two units (`12.3s`-like below a minute).
fn human_duration(secs: f64) -> String {
    if !(secs.is_finite() && secs >= 0.0) {
        return "-".into();
    }
    // Round to the smaller of the two units shown.
    let unit = match secs {
        s if s < 60.0 => 0.1,
        s if s < 3_600.0 => 1.0,
        s if s < 86_400.0 => 60.0,
        _ => 3_600.0,
    };
    let rounded = (secs / unit).round() * unit;
    humantime::format_duration(std::time::Duration::from_millis(
        (rounded * 1000.0).round() as u64
    ))
    .to_string()
}

impl SimOutput {
    /// The human summary, as text.
    pub fn human(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let s = &self.scenario;
        let _ = writeln!(
            o,
            "Arbiter simulator — {} ({} protocol): {} nodes, {} GPUs, {} tasks{}",
            s.name,
            s.protocol,
            s.nodes,
            s.gpus,
            s.tasks,
            if s.rejected > 0 {
                format!(", {} rejected up front", s.rejected)
            } else {
                String::new()
            }
        );
        for r in &s.rejected_examples {
            let _ = writeln!(o, "  rejected {}: {}", r.task, r.reason);
        }
        match s.protocol {
            Protocol::Replay
            | Protocol::Aryl
            | Protocol::Dynamoml
            | Protocol::Antman
            | Protocol::AntmanTrace
            | Protocol::Muxflow => {
                for r in &self.runs {
                    let _ = writeln!(o);
                    let _ = writeln!(
                        o,
                        "policy {}  sha256:{}  ({})",
                        r.policy,
                        &r.digest[..12.min(r.digest.len())],
                        r.policy_source
                    );
                    let Some(m) = &r.replay else { continue };
                    let _ = writeln!(
                        o,
                        "  rounds           {:<10} round latency p50 {:.0} µs, p99 {:.0} µs",
                        r.rounds, r.round_latency_p50_us, r.round_latency_p99_us
                    );
                    let _ = writeln!(
                        o,
                        "  jobs completed   {}/{}{}{}",
                        m.jobs_completed,
                        r.tasks,
                        if m.jobs_running_at_end > 0 {
                            format!(", {} still running", m.jobs_running_at_end)
                        } else {
                            String::new()
                        },
                        if m.jobs_unplaced > 0 {
                            format!(", {} never placed", m.jobs_unplaced)
                        } else {
                            String::new()
                        }
                    );
                    let _ = writeln!(
                        o,
                        "  JCT              avg {}  p95 {}",
                        human_duration(m.avg_jct_s),
                        human_duration(m.p95_jct_s)
                    );
                    let _ = writeln!(
                        o,
                        "  queueing         avg {}  p95 {}  max {}",
                        human_duration(m.avg_queue_s),
                        human_duration(m.p95_queue_s),
                        human_duration(m.max_queue_s)
                    );
                    let _ = writeln!(o, "  makespan         {}", human_duration(m.makespan_s));
                    let _ = writeln!(
                        o,
                        "  GPU allocation   mean {:.1}%  peak {:.1}%  (peak queue {} jobs)",
                        m.mean_gpu_alloc_pct, m.peak_gpu_alloc_pct, m.peak_pending
                    );
                    let _ = writeln!(
                        o,
                        "  policy faults    {}  fallback rounds {}  preemptions {}",
                        r.policy_faults, r.fallback_rounds, m.preemptions
                    );
                    let _ = writeln!(
                        o,
                        "  wall time        {:.2}s ({:.2}s inside the policy)",
                        r.wall_seconds, r.policy_seconds
                    );
                    if let Some(fuel) = r.policy_fuel {
                        let _ = writeln!(
                            o,
                            "  policy fuel      {fuel} ({:.0} per round)",
                            fuel as f64 / r.rounds.max(1) as f64
                        );
                    }
                }
            }
            Protocol::Fgd => {
                let _ = writeln!(o);
                let _ = writeln!(
                    o,
                    "{:<16} {:>5} {:>10} {:>10} {:>9} {:>10} {:>7} {:>7} {:>8}",
                    "policy",
                    "seed",
                    "alloc@100",
                    "alloc@130",
                    "unalloc",
                    "frag@80",
                    "failed",
                    "faults",
                    "wall"
                );
                for r in &self.runs {
                    let Some(m) = &r.fgd else { continue };
                    let _ = writeln!(
                        o,
                        "{:<16} {:>5} {:>9.2}% {:>9.2}% {:>9.1} {:>9.1}% {:>7} {:>7} {:>7.2}s",
                        r.policy,
                        r.seed,
                        m.gpu_alloc_pct_at_100,
                        m.gpu_alloc_pct_at_130,
                        m.unallocated_gpus_at_130,
                        m.frag_ratio_pct_at_80,
                        m.tasks_failed,
                        r.policy_faults,
                        r.wall_seconds
                    );
                }
                if self.runs.len() > self.fgd_summary.len() {
                    let _ = writeln!(o);
                    let _ = writeln!(o, "mean over seeds:");
                    for m in &self.fgd_summary {
                        let _ = writeln!(
                            o,
                            "{:<16} {:>5} {:>9.2}% {:>9.2}% {:>9.1} {:>9.1}%   (sd@130 {:.2})",
                            m.policy,
                            m.seeds,
                            m.gpu_alloc_pct_at_100,
                            m.gpu_alloc_pct_at_130,
                            m.unallocated_gpus_at_130,
                            m.frag_ratio_pct_at_80,
                            m.gpu_alloc_pct_at_130_sd
                        );
                    }
                }
                if let Some(r) = self.runs.first() {
                    let _ = writeln!(
                        o,
                        "round latency p50 {:.0} µs, p99 {:.0} µs ({})",
                        r.round_latency_p50_us, r.round_latency_p99_us, r.policy
                    );
                }
            }
        }
        if let Some(dir) = &self.report_dir {
            let _ = writeln!(o);
            let _ = writeln!(o, "report: {}", dir.join("index.html").display());
        }
        let _ = writeln!(o, "total {:.2}s", self.wall_seconds);
        o
    }

    /// Prints the human summary to stdout.
    pub fn print_human(&self) {
        print!("{}", self.human());
    }

    /// The JSON form (`--json`).
    pub fn to_json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Prints JSON or the human summary, as `--json` asks.
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", self.to_json()?);
        } else {
            self.print_human();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations_read_in_two_units() {
        assert_eq!(human_duration(12.34), "12s 300ms");
        assert_eq!(human_duration(3_725.4), "1h 2m");
        assert_eq!(human_duration(90_061.0), "1day 1h");
        assert_eq!(human_duration(f64::NAN), "-");
    }
}
