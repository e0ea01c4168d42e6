//! Role drivers: how the host asks a policy slot anything.
//!
//! Every role goes through [`ask_chain`], the one implementation of what all
//! roles share: the fallback order (the active generation, then older
//! healthy ones, newest first), a fresh instance after any trap, fault
//! records with the input that caused them, quarantine (consecutive faults
//! and fault rate, see [`crate::registry::QuarantineRule`]), the automatic
//! rollback off a quarantined active generation, and a `tracing` span per
//! policy call. A role module adds only its call, its validation (a fault
//! like any other when the answer is refused) and its native last resort:
//!
//! - [`scheduler`]: decisions through the SDK's `Plan`; native `fifo`,
//!   filtered through the same `Plan` so that it never produces an answer
//!   the validator refuses.
//! - [`tenant`]: a verdict over the tenant's queue; native submit order.
//!   Whoever answers, admission releases a job only while it fits the
//!   tenant's quota.
//! - [`reclaim`]: a plan returning exactly `count` distinct candidates with
//!   decisions that empty them; native Smallest-Count-First.
//! - [`matcher`]: pairings of offline with online jobs, each at most once,
//!   SM shares 1–100 %; native: no pairings.
//! - [`coordinator`]: node actions checked against the view they were
//!   computed from, on a [`coordinator::NodeSurface`] (a real node or
//!   simulated GPUs); native: hold steady (no action).

pub mod coordinator;
pub mod matcher;
pub mod reclaim;
pub mod scheduler;
pub mod tenant;

use crate::registry::{FaultInput, FaultRecord, Generation, PolicySlot};
use crate::runtime::{PolicyFault, PolicyInstance};
use arbiter_policy_sdk::model::Role;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who answered a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// The active generation.
    Active(u64),
    /// An older generation, after the newer ones faulted.
    Fallback(u64),
    /// The native built-in policy.
    Native,
    /// Nobody: even the native policy failed (the call applies nothing).
    Nobody,
}

impl Served {
    /// The generation that answered, if a Wasm one did.
    pub fn generation(self) -> Option<u64> {
        match self {
            Served::Active(g) | Served::Fallback(g) => Some(g),
            Served::Native | Served::Nobody => None,
        }
    }

    /// `active`, `fallback`, `native` or `nobody` (metrics and journal labels).
    pub fn label(self) -> &'static str {
        match self {
            Served::Active(_) => "active",
            Served::Fallback(_) => "fallback",
            Served::Native => "native",
            Served::Nobody => "nobody",
        }
    }
}

/// Faults met during a call, by generation (`None` = the native policy).
pub type RoundFaults = Vec<(Option<u64>, PolicyFault)>;

/// A generation's accepted answer.
pub struct Answer<T> {
    pub served: Served,
    pub value: T,
    /// Time inside the answering policy's call(s).
    pub policy_time: Duration,
    /// Fuel the answering policy's call(s) consumed, when the engine meters
    /// fuel (`RuntimeConfig::fuel`): deterministic, unlike the time.
    pub fuel: Option<u64>,
}

/// What the slot's generations said; `answer` is `None` when every one of
/// them faulted (or none is loaded) and the caller's native policy must answer.
pub struct ChainOutcome<T> {
    pub answer: Option<Answer<T>>,
    pub faults: RoundFaults,
}

impl<T> ChainOutcome<T> {
    /// The generation's answer, or the role's native one (which cannot fail).
    pub fn or_native(self, native: impl FnOnce() -> T) -> (Answer<T>, RoundFaults) {
        let answer = self.answer.unwrap_or_else(|| Answer {
            served: Served::Native,
            value: native(),
            policy_time: Duration::ZERO,
            fuel: None,
        });
        (answer, self.faults)
    }
}

/// Asks `slot`'s generations in fallback order until one answers. A generation that does
/// not declare `role` ([`crate::registry::PolicyCode::has_role`]) is passed over without
/// a call or a fault; one that declares it and then answers `unsupported` has a manifest
/// that is wrong, a fault like any other.
///
/// `call` runs the role's call on an instance and validates the answer: an
/// `Err` is a fault of that generation, recorded with `epoch` and the input
/// `input()` returns (made only on a fault), counted toward its quarantine. The active generation
/// is read once, so a swap takes effect between calls, never inside one.
pub fn ask_chain<T>(
    slot: &PolicySlot,
    role: Role,
    epoch: u64,
    input: impl Fn() -> FaultInput,
    mut call: impl FnMut(&mut PolicyInstance) -> Result<T, PolicyFault>,
) -> ChainOutcome<T> {
    let mut faults = Vec::new();
    let active = slot.active();
    let active_id = active.as_ref().map(|g| g.id);
    let mut next = active.filter(|g| !g.is_quarantined());
    // The older generations (and the lock on the slot's map) only on a fault.
    let mut fallbacks: Option<std::vec::IntoIter<Arc<Generation>>> = None;
    loop {
        let generation = match next.take() {
            Some(g) => g,
            None => {
                let rest =
                    fallbacks.get_or_insert_with(|| slot.fallbacks_below(active_id).into_iter());
                match rest.next() {
                    Some(g) => g,
                    None => {
                        return ChainOutcome {
                            answer: None,
                            faults,
                        };
                    }
                }
            }
        };
        if !generation.code.has_role(role) {
            // It has no answer to give, and not having one is no fault: counted as one, three
            // reclaims in a row quarantined a scheduler-only active policy.
            tracing::debug!(
                slot = %slot.name(),
                role = role.as_str(),
                generation = generation.id,
                "generation does not declare the role; not asked"
            );
            continue;
        }
        match ask_generation(&generation, role.as_str(), &mut call) {
            Ok(Called {
                value,
                policy_time,
                fuel,
            }) => {
                generation.record_success(slot.quarantine_rule());
                let served = if Some(generation.id) == active_id {
                    Served::Active(generation.id)
                } else {
                    Served::Fallback(generation.id)
                };
                return ChainOutcome {
                    answer: Some(Answer {
                        served,
                        value,
                        policy_time,
                        fuel,
                    }),
                    faults,
                };
            }
            Err(fault) => {
                on_fault(slot, &generation, role.as_str(), epoch, input(), &fault);
                faults.push((Some(generation.id), fault));
            }
        }
    }
}

/// A generation's answer and what it cost.
struct Called<T> {
    value: T,
    policy_time: Duration,
    fuel: Option<u64>,
}

fn ask_generation<T>(
    generation: &Generation,
    role: &'static str,
    call: &mut impl FnMut(&mut PolicyInstance) -> Result<T, PolicyFault>,
) -> Result<Called<T>, PolicyFault> {
    let mut guard = generation.instance.lock();
    if guard.as_ref().is_none_or(|i| i.poisoned().is_some()) {
        // A trapped instance is never re-entered: start afresh (µs).
        *guard = Some(generation.reinstantiate()?);
    }
    let Some(instance) = guard.as_mut() else {
        return Err(PolicyFault::Abi("instance vanished".into()));
    };
    let span = tracing::debug_span!("policy_call", role, generation = generation.id, policy = %generation.manifest().name);
    let _g = span.enter();
    let started = Instant::now();
    let fuel_before = instance.fuel_spent().unwrap_or(0);
    let result = call(instance);
    let elapsed = started.elapsed();
    let fuel = instance
        .fuel_spent()
        .map(|spent| spent.saturating_sub(fuel_before));
    if result
        .as_ref()
        .err()
        .is_some_and(PolicyFault::poisons_instance)
    {
        *guard = None;
    }
    result.map(|value| Called {
        value,
        policy_time: elapsed,
        fuel,
    })
}

fn on_fault(
    slot: &PolicySlot,
    generation: &Generation,
    role: &'static str,
    epoch: u64,
    input: FaultInput,
    fault: &PolicyFault,
) {
    tracing::warn!(
        slot = %slot.name(),
        role,
        generation = generation.id,
        policy = %generation.manifest().name,
        epoch,
        kind = fault.kind(),
        %fault,
        "policy fault; falling back"
    );
    let record = FaultRecord {
        epoch,
        fault: fault.clone(),
        input,
    };
    if generation.record_fault(record, slot.quarantine_rule()) {
        tracing::error!(
            slot = %slot.name(),
            role,
            generation = generation.id,
            faults = generation.total_faults(),
            "generation quarantined"
        );
        if slot.active_id() == Some(generation.id) {
            // Serve from the newest healthy older generation from now on;
            // with none, the chain skips the quarantined active one and the
            // native policy answers.
            let _ = slot.rollback(None);
        }
    }
}
