//! The coordinator role: what a node does to its GPUs and workloads this
//! control period (memory limits, compute shares, MPS thread percentages,
//! freeze/resume, evictions, GPU health).
//!
//! The driver works against a [`NodeSurface`] — the node's view and the
//! way its actions are carried out — so one coordinator policy runs the
//! same on a real node (`arbiter-node`'s enforcer) and on simulated GPUs in
//! virtual time. The answer is checked once, here ([`validate_actions`]),
//! against the view the policy was given: an action on a workload or GPU
//! the view does not list, a compute share outside 1..=1000 ‰, an MPS
//! thread percentage outside 1..=100, an unknown health code, or more
//! actions than the view can justify. With [`InvalidActions::RejectCall`]
//! (the host's rule for scheduling decisions) one invalid action makes the
//! whole answer a fault; with [`InvalidActions::DropAction`] the invalid
//! ones are dropped. The native last resort holds steady: no action, so
//! every workload keeps the limits it has.

use super::{RoundFaults, Served, ask_chain};
use crate::registry::{FaultInput, PolicySlot};
use crate::runtime::{NativePolicy, PolicyFault, PolicyInstance};
use arbiter_policy_sdk::model::{NodeAction, NodeView, health};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// A node as a coordinator sees it: a view, and a way to act.
pub trait NodeSurface {
    /// The node now: its GPUs, its workloads, its clock.
    fn view(&mut self) -> NodeView;
    /// Carries out validated actions; one result per action (the node may
    /// still refuse one, e.g. a workload that exited meanwhile).
    fn apply_actions(&mut self, actions: &[NodeAction]) -> Vec<Result<(), String>>;
}

/// What to do with an answer that contains invalid actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InvalidActions {
    /// The whole answer is a fault: nothing from the call is applied (the
    /// host's rule for scheduling decisions, and the default: a policy that
    /// gets one action wrong may have got the others wrong too).
    #[default]
    RejectCall,
    /// Drop the invalid actions, apply the valid ones, and count no fault.
    DropAction,
}

/// One refused action and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Its position in the answer.
    pub index: usize,
    pub action: NodeAction,
    pub reason: String,
}

/// Limits of the one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionRules {
    /// Actions allowed per GPU and per workload in the view (plus a constant
    /// 8): a policy returning more is flooding, and its answer is a fault.
    pub max_actions_per_entity: usize,
    pub invalid_actions: InvalidActions,
}

impl Default for ActionRules {
    fn default() -> Self {
        ActionRules {
            max_actions_per_entity: 8,
            invalid_actions: InvalidActions::RejectCall,
        }
    }
}

/// An answer that passed the check: the actions to apply and the ones dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    pub actions: Vec<NodeAction>,
    pub refused: Vec<Refusal>,
}

/// An answer that failed the check.
#[derive(Debug, Clone)]
pub struct Rejected {
    pub fault: PolicyFault,
    pub refused: Vec<Refusal>,
}

/// The ids a view lists.
struct ViewIndex {
    gpus: Vec<u32>,
    workloads: Vec<u32>,
}

impl ViewIndex {
    fn new(view: &NodeView) -> ViewIndex {
        let mut gpus: Vec<u32> = view.gpus.iter().map(|g| g.index).collect();
        let mut workloads: Vec<u32> = view.workloads.iter().map(|w| w.id).collect();
        gpus.sort_unstable();
        workloads.sort_unstable();
        ViewIndex { gpus, workloads }
    }

    fn has_gpu(&self, index: u32) -> bool {
        self.gpus.binary_search(&index).is_ok()
    }

    fn has_workload(&self, id: u32) -> bool {
        self.workloads.binary_search(&id).is_ok()
    }
}

/// Why an action is not acceptable for this view (`None`: acceptable).
fn action_problem(action: &NodeAction, index: &ViewIndex) -> Option<String> {
    let workload = match *action {
        NodeAction::SetMemoryLimit(w, _)
        | NodeAction::Freeze(w)
        | NodeAction::Resume(w)
        | NodeAction::Evict(w) => w,
        NodeAction::SetComputeShare(w, permille) => {
            if !(1..=1000).contains(&permille) {
                return Some(format!("compute share {permille} permille not in 1..=1000"));
            }
            w
        }
        NodeAction::SetMpsThreadPct(w, pct) => {
            if !(1..=100).contains(&pct) {
                return Some(format!("MPS thread percentage {pct} not in 1..=100"));
            }
            w
        }
        NodeAction::RestartMps(gpu) => {
            return (!index.has_gpu(gpu)).then(|| format!("GPU {gpu} is not in the view"));
        }
        NodeAction::SetHealth(gpu, code) => {
            if !index.has_gpu(gpu) {
                return Some(format!("GPU {gpu} is not in the view"));
            }
            if code > health::DISABLED {
                return Some(format!("health code {code} is not one of 0..=4"));
            }
            return None;
        }
    };
    (!index.has_workload(workload)).then(|| format!("workload {workload} is not in the view"))
}

/// The one check of a coordinator's answer against the view it was computed from.
pub fn validate_actions(
    view: &NodeView,
    actions: Vec<NodeAction>,
    rules: &ActionRules,
) -> Result<Checked, Rejected> {
    let limit = rules
        .max_actions_per_entity
        .saturating_mul(view.gpus.len() + view.workloads.len())
        .saturating_add(8);
    if actions.len() > limit {
        return Err(Rejected {
            fault: PolicyFault::TooManyDecisions {
                count: actions.len(),
                limit: u32::try_from(limit).unwrap_or(u32::MAX),
            },
            refused: Vec::new(),
        });
    }
    let index = ViewIndex::new(view);
    let mut refused = Vec::new();
    let mut valid = Vec::with_capacity(actions.len());
    for (i, action) in actions.into_iter().enumerate() {
        match action_problem(&action, &index) {
            None => valid.push(action),
            Some(reason) => {
                // Log a few; a policy producing thousands must not flood the log.
                if refused.len() < 8 {
                    tracing::warn!(index = i, ?action, %reason, "coordinator action refused");
                }
                refused.push(Refusal {
                    index: i,
                    action,
                    reason,
                });
            }
        }
    }
    match (refused.first(), rules.invalid_actions) {
        (Some(first), InvalidActions::RejectCall) => Err(Rejected {
            fault: PolicyFault::BadAnswer(format!(
                "{} of {} actions invalid; first: #{} {:?}: {}",
                refused.len(),
                refused.len() + valid.len(),
                first.index,
                first.action,
                first.reason
            )),
            refused,
        }),
        _ => Ok(Checked {
            actions: valid,
            refused,
        }),
    }
}

/// What one control step decided and what the node did with it.
#[derive(Debug)]
pub struct StepOutcome {
    /// The view the policy was given.
    pub view: NodeView,
    /// The applied actions (after the check).
    pub actions: Vec<NodeAction>,
    /// The node's result for each applied action.
    pub results: Vec<Result<(), String>>,
    /// Actions the check dropped ([`InvalidActions::DropAction`]) or that
    /// made a generation's answer a fault.
    pub refused: Vec<Refusal>,
    pub served: Served,
    pub faults: RoundFaults,
    pub policy_time: Duration,
}

/// Drives the `coordinator` role of one slot.
pub struct CoordinatorDriver {
    slot: Arc<PolicySlot>,
    rules: ActionRules,
    /// The last resort; `None`: hold steady (no action).
    native: Option<Mutex<PolicyInstance>>,
}

impl CoordinatorDriver {
    pub fn new(slot: Arc<PolicySlot>, rules: ActionRules) -> Self {
        CoordinatorDriver {
            slot,
            rules,
            native: None,
        }
    }

    /// Another native last resort than holding steady. Its answers pass the
    /// same check; if it fails, the node holds steady.
    pub fn with_native(mut self, native: Box<dyn NativePolicy>) -> Self {
        self.native = Some(Mutex::new(PolicyInstance::native(native)));
        self
    }

    pub fn slot(&self) -> &Arc<PolicySlot> {
        &self.slot
    }

    pub fn rules(&self) -> &ActionRules {
        &self.rules
    }

    /// The native last resort's answer on `view`, checked.
    fn ask_native(&self, view: &NodeView) -> Checked {
        let Some(native) = &self.native else {
            return Checked::default();
        };
        let answer = native
            .lock()
            .tick(view.clone())
            .map_err(|fault| Rejected {
                fault,
                refused: Vec::new(),
            })
            .and_then(|actions| validate_actions(view, actions, &self.rules));
        answer.unwrap_or_else(|rejected| {
            tracing::error!(fault = %rejected.fault, "native coordinator failed; holding steady");
            Checked {
                actions: Vec::new(),
                refused: rejected.refused,
            }
        })
    }

    /// Asks the slot's generations for this period's actions on `view`;
    /// the native last resort holds steady.
    pub fn decide(&self, view: &NodeView) -> (Checked, Served, RoundFaults, Duration) {
        let span = tracing::info_span!(
            "coordinate",
            now_ms = view.now_ms,
            gpus = view.gpus.len(),
            workloads = view.workloads.len()
        );
        let _g = span.enter();
        let mut refused_by_faults = Vec::new();
        let outcome = ask_chain(
            &self.slot,
            arbiter_policy_sdk::model::Role::Coordinator,
            view.now_ms,
            || FaultInput::Node(view.clone()),
            |instance| {
                let actions = instance.tick(view.clone())?;
                validate_actions(view, actions, &self.rules).map_err(|r| {
                    refused_by_faults.extend(r.refused);
                    r.fault
                })
            },
        );
        let (answer, faults) = outcome.or_native(|| self.ask_native(view));
        let mut checked = answer.value;
        if checked.refused.is_empty() {
            checked.refused = refused_by_faults;
        }
        (checked, answer.served, faults, answer.policy_time)
    }

    /// One control step on `surface`: view, decide, check, apply.
    pub fn step(&self, surface: &mut impl NodeSurface) -> StepOutcome {
        let view = surface.view();
        let (checked, served, faults, policy_time) = self.decide(&view);
        let results = if checked.actions.is_empty() {
            Vec::new()
        } else {
            surface.apply_actions(&checked.actions)
        };
        StepOutcome {
            view,
            actions: checked.actions,
            results,
            refused: checked.refused,
            served,
            faults,
            policy_time,
        }
    }
}
