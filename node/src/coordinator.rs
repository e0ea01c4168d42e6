//! The node-local policy runtime: runs a `coordinator` policy every control period.
//!
//! One control step is
//!
//! ```text
//! node.view()  →  policy.tick(view)  →  validate  →  node.apply_actions()  →  node.poll()
//! ```
//!
//! (reaping and eviction escalation come last, off the path from a metric to the control
//! blocks).
//!
//! The policy is a Wasm component (the built-in [`sysmonitor`](DEFAULT_POLICY) by default) run by
//! the host's runtime — `arbiter_host::runtime`, the same engine, sandbox and fault
//! classification as the cluster scheduler, not a copy — or any [`NativePolicy`].
//!
//! A policy is untrusted. Its answer is checked against the view it was given before anything
//! is applied, by the host core's one check
//! ([`arbiter_host::roles::coordinator::validate_actions`]): an action on a workload or GPU the view does not list, a compute share outside
//! 1..=1000 ‰, an MPS thread percentage outside 1..=100, an unknown health code, or more actions
//! than the view can justify make the answer invalid, and (by default) **nothing** from that
//! call is applied — the same rule the host applies to scheduling decisions. The node itself
//! validates each action again when it applies it.
//!
//! The policy lives in a one-generation [`PolicySlot`] and is asked through the host core's
//! [`CoordinatorDriver`] — the same fallback chain every role uses, not a copy. A fault (trap,
//! deadline, memory cap, reported error, invalid answer) is recorded with the view that caused
//! it, and that period the fallback answers: by default [`HoldSteady`], which changes nothing,
//! so every workload keeps its current memory quota, share and freeze state. A trapped
//! instance is never re-entered; the next period gets a fresh instance of the same compiled
//! policy. After [`CoordinatorConfig::fallback_after`] consecutive faults, or a fault rate the
//! host's [`QuarantineRule`](arbiter_host::registry::QuarantineRule) calls flapping, the policy
//! is quarantined and the fallback answers every period until an operator calls
//! [`Coordinator::retry_policy`] (lifting the quarantine) or installs another policy with
//! [`Coordinator::replace_policy`]. Nothing here panics on what a policy returns.

use crate::enforcer::{ActionOutcome, Node};
use crate::supervisor::ExitReport;
use arbiter_host::registry::{NativeCode, PolicyCode, PolicySlot, RegistryError};
use arbiter_host::roles::Served as RoleServed;
use arbiter_host::roles::coordinator::{ActionRules, Checked, CoordinatorDriver, NodeSurface};
use arbiter_host::runtime::{
    CompiledPolicy, NativePolicy, PolicyEngine, PolicyFault, RuntimeConfig,
};
use arbiter_policy_sdk::Policy;
use arbiter_policy_sdk::model::{Manifest, NodeAction, NodeView, PolicyError, Role};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The control period MuxFlow's GPU monitor and the brief ask for.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);

/// The built-in coordinator policy: MuxFlow's SysMonitor + xCUDA pacing.
pub const DEFAULT_POLICY: &str = "sysmonitor";

/// The one check of an answer, and its settings, are the host core's coordinator role.
pub use arbiter_host::roles::coordinator::{InvalidActions, Refusal};

/// Coordinator settings.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Control period of [`Coordinator::run_loop`].
    pub period: Duration,
    /// Consecutive faults after which the native fallback takes over.
    pub fallback_after: u32,
    /// Actions allowed per GPU and per workload in the view (plus a constant 8): a policy
    /// returning more is flooding, and its answer is a fault.
    pub max_actions_per_entity: usize,
    pub invalid_actions: InvalidActions,
    /// Wall-clock bound of one call into the node policy; `None`: a quarter of the
    /// period ([`node_runtime_config`]). A node whose CPUs are shared with busy work
    /// may want more, so that a healthy policy preempted mid-call is not a fault.
    pub deadline: Option<Duration>,
}

impl CoordinatorConfig {
    /// The sandbox settings these settings give node policies.
    pub fn runtime_config(&self) -> RuntimeConfig {
        match self.deadline {
            Some(deadline) => runtime_config_with_deadline(deadline),
            None => node_runtime_config(self.period),
        }
    }
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            period: DEFAULT_PERIOD,
            fallback_after: 3,
            max_actions_per_entity: 8,
            invalid_actions: InvalidActions::RejectCall,
            deadline: None,
        }
    }
}

/// Sandbox settings for node-local policies, derived from the control period.
///
/// The deadline is a quarter of the period, so a runaway policy costs at most a quarter period
/// before it is cut off. The epoch tick (the deadline's resolution) is half the deadline: a
/// call is then interrupted after between one and two ticks, i.e. never before half the
/// deadline, which is still ~100x what `sysmonitor` needs. A finer tick buys nothing here and
/// costs CPU: the engine's ticker thread wakes on every tick while a call is in flight (it
/// parks between calls), and a runaway call at the host's 1 ms tick would wake it 25 times.
pub fn node_runtime_config(period: Duration) -> RuntimeConfig {
    runtime_config_with_deadline((period / 4).max(Duration::from_millis(4)))
}

fn runtime_config_with_deadline(deadline: Duration) -> RuntimeConfig {
    RuntimeConfig {
        deadline,
        epoch_tick: deadline / 2,
        memory_limit: 32 << 20,
        max_instances: 4,
        max_log_lines: 16,
        ..RuntimeConfig::default()
    }
}

/// Why a coordinator could not be built (at load time; at run time nothing is an error).
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("creating the Wasm engine for node policies: {0}")]
    Engine(String),
    #[error("no built-in policy `{0}` in this build (see `arbiter_policies::names()`)")]
    NoSuchBuiltin(String),
    #[error("policy `{name}` does not declare the `coordinator` role (roles: {roles:?})")]
    NotACoordinator { name: String, roles: Vec<String> },
    #[error("loading coordinator policy `{name}`: {fault}")]
    Load { name: String, fault: PolicyFault },
    #[error("no policy to retry: the coordinator was built with the fallback only")]
    NothingToRetry,
}

/// A native coordinator that never acts: the safe fallback. Every workload keeps the memory
/// quota, compute share and freeze state it has; evictions already started still complete
/// (the step keeps polling the node); GPU health stays what was last published.
#[derive(Debug, Default, Clone, Copy)]
pub struct HoldSteady;

impl Policy for HoldSteady {
    fn manifest() -> Manifest {
        arbiter_policy_sdk::manifest(
            "hold-steady",
            env!("CARGO_PKG_VERSION"),
            &[Role::Coordinator],
            "Native fallback coordinator: keeps every limit as it is.",
        )
    }

    fn create() -> Self {
        HoldSteady
    }

    fn tick(&mut self, _view: &NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        Ok(Vec::new())
    }
}

/// Who answered a control step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The configured policy; its actions were applied.
    Policy,
    /// The configured policy faulted this step: nothing from it was applied.
    Faulted,
    /// The native fallback (the policy was retired after repeated faults).
    Fallback,
}

/// What one control step did.
#[derive(Debug)]
pub struct StepReport {
    pub step: u64,
    pub served: Served,
    /// The fault of this step, if the policy had one.
    pub fault: Option<PolicyFault>,
    /// Actions the validator refused (never applied).
    pub refused: Vec<Refusal>,
    /// What the node did with each action passed to it, in order.
    pub outcomes: Vec<ActionOutcome>,
    /// Workloads the node reaped this step.
    pub exits: Vec<ExitReport>,
    /// When the actions had reached the control blocks (end of `apply_actions`).
    pub applied_at: Instant,
    /// `node.view()`.
    pub view_time: Duration,
    /// The policy call (including re-instantiation after a trap).
    pub policy_time: Duration,
    /// `node.apply_actions()`.
    pub apply_time: Duration,
    /// The whole step.
    pub total: Duration,
}

/// Counters over the coordinator's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    pub steps: u64,
    /// Steps answered by the fallback.
    pub fallback_steps: u64,
    pub faults: u64,
    pub consecutive_faults: u32,
    /// Fresh instances made after a trap.
    pub reinstantiations: u64,
    /// Actions refused by validation.
    pub refused_actions: u64,
    /// Actions passed to the node.
    pub applied_actions: u64,
    /// Actions the node then refused itself (e.g. a workload that exited meanwhile).
    pub node_refused_actions: u64,
    pub last_fault: Option<PolicyFault>,
}

/// What [`Coordinator::run_loop`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopSummary {
    pub steps: u64,
    /// Steps that started more than a period late (the loop skips missed periods rather than
    /// running them back to back).
    pub overruns: u64,
}

/// Runs a coordinator policy against a [`Node`] through the host core's coordinator driver.
pub struct Coordinator {
    config: CoordinatorConfig,
    driver: CoordinatorDriver,
    stats: CoordinatorStats,
    /// The configured policy's name (active or retired).
    policy: Option<String>,
    /// Re-instantiations of the policies replaced so far.
    replaced_reinstantiations: u64,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("policy", &self.policy_name())
            .field("on_fallback", &self.on_fallback())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The node's policy slot: one generation serving, the one it replaced kept
/// as its fallback (the host core's chain: an older generation, then the
/// native [`HoldSteady`]), older ones unloaded. A generation is retired after
/// `fallback_after` consecutive faults or a fault rate the host's rule calls
/// flapping, and the slot rolls back to the one before it.
fn node_slot(settings: &CoordinatorConfig) -> Arc<PolicySlot> {
    Arc::new(
        PolicySlot::new("coordinator")
            .with_max_generations(1)
            .with_quarantine_after(settings.fallback_after.max(1)),
    )
}

/// Loads `code` into `slot` as its active generation, refusing a policy without the role.
/// Returns the policy's name and the generation's id. (Also the node's watched directory's
/// way in: [`crate::policies_dir`].)
pub(crate) fn install(
    slot: &PolicySlot,
    code: PolicyCode,
    config: Option<&str>,
) -> Result<(String, u64), CoordinatorError> {
    let name = code.manifest().name.clone();
    if !code.has_role(Role::Coordinator) {
        return Err(CoordinatorError::NotACoordinator {
            name,
            roles: code.manifest().roles.clone(),
        });
    }
    let generation = slot
        .swap(code, config.map(str::to_string), None, None)
        .map_err(|e| match e {
            RegistryError::Load(fault) => CoordinatorError::Load {
                name: name.clone(),
                fault,
            },
            other => CoordinatorError::Load {
                name: name.clone(),
                fault: PolicyFault::Abi(other.to_string()),
            },
        })?;
    tracing::info!(policy = %name, digest = %generation.digest(), "coordinator policy loaded");
    Ok((name, generation.id))
}

impl Coordinator {
    /// A coordinator running a compiled Wasm policy with `config` (its manifest's default
    /// configuration when `None` or empty). Instantiation and configuration happen here, so a
    /// policy that cannot start is an error the operator sees, not a silent fallback.
    pub fn from_compiled(
        compiled: CompiledPolicy,
        config: Option<&str>,
        settings: CoordinatorConfig,
    ) -> Result<Coordinator, CoordinatorError> {
        let mut coordinator = Coordinator::fallback_only(settings);
        let (name, _) = install(
            coordinator.driver.slot(),
            PolicyCode::from(compiled),
            config,
        )?;
        coordinator.policy = Some(name);
        Ok(coordinator)
    }

    /// Installs another compiled policy (a hot swap between periods). The new policy is
    /// instantiated and configured first; if that fails, the running one stays in charge.
    /// The fault streak starts over, and a retired policy is forgotten.
    pub fn replace_policy(
        &mut self,
        compiled: CompiledPolicy,
        config: Option<&str>,
    ) -> Result<(), CoordinatorError> {
        let replaced = self
            .driver
            .slot()
            .active()
            .map_or(0, |g| g.reinstantiations());
        let (to, _) = install(self.driver.slot(), PolicyCode::from(compiled), config)?;
        tracing::info!(from = self.policy_name().unwrap_or("-"), %to, "coordinator policy replaced");
        self.policy = Some(to);
        self.replaced_reinstantiations += replaced;
        self.stats.consecutive_faults = 0;
        Ok(())
    }

    /// Compiles a Wasm component with `engine` and runs it (see [`Self::from_compiled`]).
    pub fn from_wasm(
        engine: &PolicyEngine,
        wasm: &[u8],
        config: Option<&str>,
        settings: CoordinatorConfig,
    ) -> Result<Coordinator, CoordinatorError> {
        let compiled = engine
            .compile(wasm)
            .map_err(|fault| CoordinatorError::Load {
                name: "<component>".into(),
                fault,
            })?;
        Coordinator::from_compiled(compiled, config, settings)
    }

    /// A built-in policy (`arbiter_policies::get(name)`) in its own engine sized for node
    /// policies ([`node_runtime_config`]).
    pub fn builtin(
        name: &str,
        config: Option<&str>,
        settings: CoordinatorConfig,
    ) -> Result<Coordinator, CoordinatorError> {
        let wasm = arbiter_policies::get(name)
            .ok_or_else(|| CoordinatorError::NoSuchBuiltin(name.to_string()))?;
        let engine = PolicyEngine::new(settings.runtime_config())
            .map_err(|e| CoordinatorError::Engine(format!("{e:#}")))?;
        Coordinator::from_wasm(&engine, wasm, config, settings)
    }

    /// A native policy (trusted code compiled into the node: benchmarks' baseline, tests),
    /// as the slot's one generation.
    pub fn native(
        policy: Box<dyn NativePolicy>,
        config: Option<&str>,
        settings: CoordinatorConfig,
    ) -> Result<Coordinator, CoordinatorError> {
        let mut coordinator = Coordinator::fallback_only(settings);
        let (name, _) = install(
            coordinator.driver.slot(),
            PolicyCode::Native(NativeCode::new(policy)),
            config,
        )?;
        coordinator.policy = Some(name);
        Ok(coordinator)
    }

    /// Only the fallback: what a node runs when its policy cannot be loaded at all.
    pub fn fallback_only(settings: CoordinatorConfig) -> Coordinator {
        let rules = ActionRules {
            max_actions_per_entity: settings.max_actions_per_entity,
            invalid_actions: settings.invalid_actions,
        };
        Coordinator {
            driver: CoordinatorDriver::new(node_slot(&settings), rules),
            config: settings,
            stats: CoordinatorStats::default(),
            policy: None,
            replaced_reinstantiations: 0,
        }
    }

    /// Replaces the fallback (the default is [`HoldSteady`]). It answers whenever the policy
    /// does not: in a step where the policy faulted, and after it was retired; its answers pass
    /// the same check.
    pub fn with_fallback(mut self, fallback: Box<dyn NativePolicy>) -> Coordinator {
        self.driver = self.driver.with_native(fallback);
        self
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// The node's policy slot (see `node_slot`). Another thread may swap a policy
    /// into it between two control periods (the node's watched directory,
    /// [`crate::policies_dir::NodePolicies`]); the next step serves it.
    pub fn slot(&self) -> Arc<PolicySlot> {
        Arc::clone(self.driver.slot())
    }

    pub fn stats(&self) -> &CoordinatorStats {
        &self.stats
    }

    /// Whether the fallback is answering (no policy, or the policy was retired).
    pub fn on_fallback(&self) -> bool {
        self.driver
            .slot()
            .active()
            .is_none_or(|g| g.is_quarantined())
    }

    /// Name of the configured policy (active or retired).
    pub fn policy_name(&self) -> Option<&str> {
        self.policy.as_deref()
    }

    /// Puts a retired policy back in charge with a fresh instance (an operator's decision:
    /// the host's quarantine lifted).
    pub fn retry_policy(&mut self) -> Result<(), CoordinatorError> {
        let generation = self
            .driver
            .slot()
            .active()
            .ok_or(CoordinatorError::NothingToRetry)?;
        if generation.is_quarantined() {
            generation.release_quarantine();
            generation.discard_instance();
            tracing::info!(policy = %generation.manifest().name, "coordinator policy back in charge");
        }
        self.stats.consecutive_faults = 0;
        Ok(())
    }

    /// One control period: view, decide (the host core's coordinator driver: the policy,
    /// its check, the fallback), apply, then reap.
    pub fn step(&mut self, node: &mut Node) -> StepReport {
        let step = self.stats.steps;
        self.stats.steps += 1;
        let span = tracing::info_span!(
            "control_step",
            step,
            policy = self.policy_name().unwrap_or("-"),
        );
        let _guard = span.enter();
        let start = Instant::now();
        let view = node.view();
        let view_time = start.elapsed();

        let t = Instant::now();
        let (checked, served, faults, _) = self.driver.decide(&view);
        let policy_time = t.elapsed();
        let fault = faults.into_iter().map(|(_, f)| f).next_back();
        let served = match (served, &fault) {
            (RoleServed::Native | RoleServed::Nobody, Some(_)) => Served::Faulted,
            (RoleServed::Native | RoleServed::Nobody, None) => Served::Fallback,
            (RoleServed::Active(_) | RoleServed::Fallback(_), _) => Served::Policy,
        };
        self.observe_generation(fault.as_ref());
        let Checked { actions, refused } = checked;

        let t = Instant::now();
        let outcomes = if actions.is_empty() {
            Vec::new()
        } else {
            node.apply_actions(&actions)
        };
        let applied_at = Instant::now();
        let apply_time = applied_at.duration_since(t);
        let exits = node.poll();
        self.stats.applied_actions += outcomes.len() as u64;
        self.stats.node_refused_actions +=
            outcomes.iter().filter(|o| o.result.is_err()).count() as u64;
        self.stats.refused_actions += refused.len() as u64;
        if served == Served::Fallback {
            self.stats.fallback_steps += 1;
        }
        let total = start.elapsed();
        tracing::debug!(
            ?served,
            actions = outcomes.len(),
            refused = refused.len(),
            view_us = view_time.as_micros() as u64,
            policy_us = policy_time.as_micros() as u64,
            apply_us = apply_time.as_micros() as u64,
            "control step"
        );
        StepReport {
            step,
            served,
            fault,
            refused,
            outcomes,
            exits,
            applied_at,
            view_time,
            policy_time,
            apply_time,
            total,
        }
    }

    /// Mirrors the generation's fault counters into the node's stats, and its name: a
    /// policy swapped into the slot from outside (the watched directory) is named from the
    /// step that serves it.
    fn observe_generation(&mut self, fault: Option<&PolicyFault>) {
        let s = &mut self.stats;
        let active = self.driver.slot().active();
        if let Some(g) = &active {
            s.consecutive_faults = g.consecutive_faults();
            s.reinstantiations = self.replaced_reinstantiations + g.reinstantiations();
        }
        let name = active.as_ref().map(|g| g.manifest().name.as_str());
        if self.policy.as_deref() != name {
            self.policy = name.map(str::to_string);
        }
        if let Some(fault) = fault {
            s.faults += 1;
            s.last_fault = Some(fault.clone());
        }
    }

    /// Runs [`Self::step`] every period until `stop` is set (checked once per period).
    pub fn run_loop(&mut self, node: &mut Node, stop: &AtomicBool) -> LoopSummary {
        self.run_loop_with(node, stop, |_| {})
    }
    /// [`Self::run_loop`], handing every step's report to `observe`.
    ///
    /// Periods are scheduled against absolute times (start + k·period), so a slow step does not
    /// shift every later one; a step that starts more than a whole period late is counted as an
    /// overrun and the missed periods are skipped, not run back to back.
    pub fn run_loop_with(
        &mut self,
        node: &mut Node,
        stop: &AtomicBool,
        mut observe: impl FnMut(&StepReport),
    ) -> LoopSummary {
        let period = self.config.period.max(Duration::from_millis(1));
        let mut summary = LoopSummary::default();
        let mut next = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let report = self.step(node);
            summary.steps += 1;
            observe(&report);
            next += period;
            let now = Instant::now();
            match next.checked_duration_since(now) {
                Some(wait) => std::thread::sleep(wait),
                None => {
                    let behind = now.duration_since(next);
                    if behind >= period {
                        summary.overruns += 1;
                        let skipped = (behind.as_nanos() / period.as_nanos()) as u32;
                        next += period.saturating_mul(skipped);
                        tracing::warn!(
                            skipped,
                            "control loop overran its period; skipping missed periods"
                        );
                    }
                }
            }
        }
        summary
    }
}

/// A real node as the host core's coordinator driver sees it.
impl NodeSurface for Node {
    fn view(&mut self) -> NodeView {
        Node::view(self)
    }

    fn apply_actions(&mut self, actions: &[NodeAction]) -> Vec<Result<(), String>> {
        Node::apply_actions(self, actions)
            .into_iter()
            .map(|o| o.result.map(|_| ()).map_err(|e| e.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_policy_sdk::Runtime;
    use arbiter_policy_sdk::model::{GpuStatus, WorkloadStatus};

    fn view() -> NodeView {
        NodeView {
            now_ms: 1,
            gpus: vec![GpuStatus {
                index: 0,
                ..GpuStatus::default()
            }],
            workloads: vec![WorkloadStatus {
                id: 7,
                ..WorkloadStatus::default()
            }],
            ..NodeView::default()
        }
    }

    #[test]
    fn runtime_config_scales_with_the_period() {
        let c = node_runtime_config(Duration::from_millis(100));
        assert_eq!(c.deadline, Duration::from_millis(25));
        assert_eq!(c.epoch_tick, Duration::from_micros(12_500));
        let c = node_runtime_config(Duration::from_millis(1));
        assert_eq!(c.deadline, Duration::from_millis(4));
        assert_eq!(c.epoch_tick, Duration::from_millis(2));
        let settings = CoordinatorConfig {
            deadline: Some(Duration::from_secs(2)),
            ..CoordinatorConfig::default()
        };
        let c = settings.runtime_config();
        assert_eq!(c.deadline, Duration::from_secs(2));
        assert_eq!(c.epoch_tick, Duration::from_secs(1));
        assert_eq!(
            CoordinatorConfig::default().runtime_config().deadline,
            Duration::from_millis(25)
        );
    }

    /// The agent runs the loop on a thread of its own: both halves must move there.
    #[test]
    fn coordinator_and_node_can_move_to_a_control_thread() {
        fn is_send<T: Send>() {}
        is_send::<Coordinator>();
        is_send::<Node>();
    }

    #[test]
    fn hold_steady_never_acts() {
        let mut p = Runtime::<HoldSteady>::new();
        assert_eq!(p.tick(view()), Ok(Vec::new()));
        assert_eq!(p.manifest().roles, ["coordinator"]);
    }
}
