//! The AntMan comparisons (OSDI '20, §5.1): Table 2 — two jobs on the one 32 GB GPU left,
//! under the five ways of handling the second arrival — on the scenario of
//! [`arbiter_sim::models::antman`], and the figures the paper publishes.

use anyhow::Context;
use arbiter_host::runtime::PolicyEngine;
use arbiter_sim::core::RunPolicy;
use arbiter_sim::models::antman::{AntmanMetrics, AntmanSimConfig, JobEnd, SpillRule, run_antman};
use arbiter_sim::parallel_map;
use std::time::Duration;

/// One configuration of Table 2.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub label: &'static str,
    pub scheduler: &'static str,
    /// The scheduler's configuration beyond its default.
    pub config: &'static str,
    /// The coordinator every node runs (none: launch limits stay).
    pub coordinator: Option<&'static str>,
    /// Whose memory may spill to the host.
    pub spill: SpillRule,
}

/// Table 2's columns, in the paper's order.
pub const SETTINGS: [Setting; 5] = [
    Setting {
        label: "Preempt",
        scheduler: "yarn-cs",
        config: "preemption = true",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "FIFO",
        scheduler: "yarn-cs",
        config: "",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "Pack",
        scheduler: "gandiva",
        // Gandiva as Table 2 runs it: packed whatever memory the job declared (§5.1: "Job-B
        // eventually fails because of the insufficient GPU memory (28.5 GB) granted").
        config: "memory_check = false",
        coordinator: None,
        spill: SpillRule::None,
    },
    Setting {
        label: "UMem",
        scheduler: "gandiva",
        config: "memory_check = false",
        coordinator: None,
        spill: SpillRule::All,
    },
    Setting {
        label: "AntMan",
        scheduler: "antman",
        config: "",
        coordinator: Some("antman"),
        spill: SpillRule::All,
    },
];

/// Table 2 as published: JCT in minutes of Job-A and Job-B per setting (`None`: Failed).
pub const PAPER_TABLE_2: [(&str, Option<f64>, Option<f64>); 5] = [
    ("Preempt", None, Some(91.1)),
    ("FIFO", Some(43.0), Some(108.2)),
    ("Pack", Some(43.1), None),
    ("UMem", Some(43.4), Some(541.6)),
    ("AntMan", Some(43.9), Some(91.8)),
];

/// The runs of one comparison, in [`SETTINGS`] order.
pub struct Table2 {
    pub runs: Vec<(&'static str, AntmanMetrics)>,
}

impl Table2 {
    pub fn get(&self, label: &str) -> Option<&AntmanMetrics> {
        self.runs.iter().find(|r| r.0 == label).map(|r| &r.1)
    }

    /// Job `name`'s JCT (minutes) under `label`, `None` when it did not finish.
    pub fn jct(&self, label: &str, name: &str) -> Option<f64> {
        self.get(label)?
            .jobs
            .iter()
            .find(|j| j.name == name)
            .and_then(|j| j.jct_min)
    }

    /// How job `name` ended under `label`.
    pub fn end(&self, label: &str, name: &str) -> Option<JobEnd> {
        self.get(label)?
            .jobs
            .iter()
            .find(|j| j.name == name)
            .map(|j| j.end.clone())
    }
}

fn compile(engine: &PolicyEngine, name: &str, config: &str) -> anyhow::Result<RunPolicy> {
    let bytes = arbiter_policies::get(name)
        .with_context(|| format!("`{name}` is not a built-in policy"))?;
    Ok(RunPolicy {
        compiled: engine
            .compile(bytes)
            .with_context(|| format!("compiling `{name}`"))?,
        config: (!config.is_empty()).then(|| config.to_string()),
    })
}

/// Runs the five settings of Table 2 on `cfg` (its jobs and cluster; each setting brings
/// its own policies and spill rule), in parallel.
pub fn table_2(cfg: &AntmanSimConfig) -> anyhow::Result<Table2> {
    let engine = arbiter_sim::engine(Duration::from_secs(30))?;
    let runs = SETTINGS
        .iter()
        .map(|s| {
            let scheduler = compile(&engine, s.scheduler, s.config)?;
            let coordinator = s.coordinator.map(|c| compile(&engine, c, "")).transpose()?;
            let cfg = AntmanSimConfig {
                spill: s.spill,
                ..cfg.clone()
            };
            Ok((scheduler, coordinator, cfg))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let metrics = parallel_map(&runs, threads, |(scheduler, coordinator, cfg)| {
        run_antman(scheduler, coordinator.as_ref(), cfg)
    })?;
    Ok(Table2 {
        runs: SETTINGS.iter().map(|s| s.label).zip(metrics).collect(),
    })
}

/// Table 2 as text: ours beside the paper's.
pub fn print_table_2(t: &Table2) {
    let cell = |v: Option<f64>| v.map_or("Failed".to_string(), |m| format!("{m:.1}"));
    println!(
        "{:<8} {:>16} {:>16}",
        "setting", "Job-A ours/paper", "Job-B ours/paper"
    );
    for (label, a, b) in PAPER_TABLE_2 {
        println!(
            "{:<8} {:>16} {:>16}",
            label,
            format!("{}/{}", cell(t.jct(label, "job-a")), cell(a)),
            format!("{}/{}", cell(t.jct(label, "job-b")), cell(b)),
        );
    }
}
