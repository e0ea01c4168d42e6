//! The FGD paper's comparison (Weng et al., ATC '23): which configuration
//! each built-in placement policy gets in a run, and the fragmentation
//! measure F(M) the paper reports, both from `arbiter-placement-core` (the
//! library the FGD-family policies are built on).

use arbiter_host::runtime::CompiledPolicy;
use arbiter_placement_core::{
    DEFAULT_POPULARITY, FragIndex, TargetWorkload, TaskShape, fgd_config,
};
use arbiter_policy_sdk::Cluster;
use arbiter_sim::core::{FragmentationMeter, MeterFactory, RunPolicy};
use arbiter_sim::models::fgd::trace_tasks;
use arbiter_sim::{ModelConfig, RunOptions, Scenario, ScenarioRun, SimTask};
use std::sync::Arc;

/// The FGD paper's six placement policies, as built-ins: the protocol's
/// grid. They are the ones that take `seed` (placement-core's COMMON_KEYS);
/// the others (fifo, best-fit, sjf, aryl*) get their default configuration.
pub const FGD_PAPER_POLICIES: [&str; 6] = [
    "random",
    "dot-product",
    "gpu-clustering",
    "gpu-packing",
    "fgd-best-fit",
    "fgd",
];

/// The configuration a policy gets: `seed` for the FGD-paper family, and for
/// `fgd` also the target workload of the tasks (so it does not have to estimate it).
pub fn policy_config(
    manifest_name: &str,
    seed: u64,
    workload: impl FnOnce() -> TargetWorkload,
) -> Option<String> {
    match manifest_name {
        "fgd" => Some(fgd_config(&workload(), seed)),
        name if FGD_PAPER_POLICIES.contains(&name) => Some(format!("seed = {}\n", seed as i64)),
        _ => None,
    }
}

/// A task as placement-core sees it when building a target workload.
pub fn task_shape(task: &SimTask) -> TaskShape {
    let r = &task.request;
    TaskShape {
        cpu_milli: r.cpu_milli,
        num_gpu: r.gpus_per_worker,
        gpu_milli: r.gpu_milli,
        gpu_models: r.gpu_models.clone(),
    }
}

/// The target workload of `tasks` (their shapes, at the default popularity).
pub fn target_workload<'a>(tasks: impl IntoIterator<Item = &'a SimTask>) -> TargetWorkload {
    TargetWorkload::from_tasks(tasks.into_iter().map(task_shape), DEFAULT_POPULARITY)
}

/// The FGD protocol's target workload M: the classes of the trace as given
/// (every task, placeable or not, before tuning) that cover 95 % of its
/// tasks, as the reference builds its "typical pods" once from the original
/// pod list (`SetTypicalPods` before `TunePodsByNodeTotalResource`).
pub fn trace_workload(scenario: &Scenario) -> TargetWorkload {
    target_workload(trace_tasks(scenario).into_iter().map(|t| t.task))
}

/// FGD's F(M): the expected milli-GPU a task of the target workload could
/// not use, summed over the cluster.
struct FragMeter(FragIndex);

impl FragmentationMeter for FragMeter {
    fn measure(&mut self, cluster: &Cluster) -> f64 {
        self.0.sync(cluster);
        self.0.cluster_fragmentation()
    }
}

/// Measures fragmentation against `workload` (the run's tasks are not
/// consulted: M is the trace's, whatever the tuning made of it).
pub fn meter(workload: TargetWorkload) -> MeterFactory {
    Arc::new(move |_: &[&SimTask]| {
        Box::new(FragMeter(FragIndex::new(workload.clone()))) as Box<dyn FragmentationMeter>
    })
}

/// One run of `compiled` on `scenario` as the comparison makes it: the
/// configuration given, or else the derived one (for the FGD policy, the
/// target workload M of the trace), with the fragmentation meter against M.
pub fn scenario_run(
    scenario: &Scenario,
    label: &str,
    compiled: &CompiledPolicy,
    seed: u64,
    config: Option<String>,
    model: ModelConfig,
) -> ScenarioRun {
    let workload = match &model {
        ModelConfig::Fgd(_) => trace_workload(scenario),
        ModelConfig::Replay(_) => target_workload(&scenario.tasks),
    };
    let config =
        config.or_else(|| policy_config(&compiled.manifest.name, seed, || workload.clone()));
    ScenarioRun {
        label: label.to_string(),
        policy: RunPolicy {
            compiled: compiled.clone(),
            config,
        },
        options: RunOptions {
            seed,
            fragmentation: Some(meter(workload)),
            ..RunOptions::default()
        },
        model,
    }
}

/// The FGD protocol's grid: every policy (label, component) with every seed,
/// each run as [`scenario_run`] makes it (derived configuration, the
/// fragmentation meter); per-task records only with `keep_records`.
pub fn protocol_grid(
    scenario: &Scenario,
    policies: &[(String, CompiledPolicy)],
    seeds: &[u64],
    keep_records: bool,
) -> Vec<ScenarioRun> {
    let mut runs = Vec::with_capacity(policies.len() * seeds.len());
    for (label, compiled) in policies {
        for &seed in seeds {
            let mut run = scenario_run(
                scenario,
                label,
                compiled,
                seed,
                None,
                ModelConfig::Fgd(arbiter_sim::models::fgd::FgdConfig::default()),
            );
            run.options.keep_records = keep_records;
            runs.push(run);
        }
    }
    runs
}
