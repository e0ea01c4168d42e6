//! Policy slots and their generations: load, swap, rollback, quarantine.
//!
//! A slot holds every loaded generation of one policy. Exactly one is
//! active; switching is one atomic pointer store, done between rounds by
//! construction (a round reads the active generation once, at its start), so
//! no round is lost or run twice. Loading — compile, instantiate, configure,
//! and optionally a first resync — happens on the caller's thread, off the
//! round loop; with a [`DeltaFeed`] ([`PolicySlot::swap_with_feed`]) the new
//! mirror is also caught up to the state's latest round there, so the switch
//! leaves the round loop one round's delta to apply.
//!
//! A slot keeps at most [`DEFAULT_MAX_GENERATIONS`] generations (older ones
//! are unloaded as new ones load), and a generation that leaves the slot is
//! freed on a control thread (the next load or unload), never by the round
//! that happened to hold it last.

use crate::runtime::{CompiledPolicy, NativePolicy, PolicyEngine, PolicyFault, PolicyInstance};
use crate::state::DeltaFeed;
use arbiter_policy_sdk::model::{
    Delta, Manifest, MatchRequest, NodeView, ReclaimRequest, Snapshot, TenantView,
};
use arc_swap::ArcSwapOption;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Consecutive faults after which a generation is quarantined.
pub const DEFAULT_QUARANTINE_AFTER: u32 = 3;

/// When a generation is quarantined: after `consecutive` faults in a row, or
/// once `window_faults` of its last `window` calls faulted. The second rule
/// catches what the first cannot: a policy that faults every other call, or
/// whose call hangs until the deadline and then works again on a fresh
/// instance, never faults twice in a row but costs a deadline every other
/// round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuarantineRule {
    pub consecutive: u32,
    /// Calls remembered (1..=64).
    pub window: u32,
    /// Faults among them that quarantine.
    pub window_faults: u32,
}

impl Default for QuarantineRule {
    fn default() -> Self {
        QuarantineRule {
            consecutive: DEFAULT_QUARANTINE_AFTER,
            window: 20,
            window_faults: 6,
        }
    }
}

impl QuarantineRule {
    fn normalised(self) -> Self {
        let window = self.window.clamp(1, 64);
        QuarantineRule {
            consecutive: self.consecutive.max(1),
            window,
            window_faults: self.window_faults.clamp(1, window),
        }
    }
}

/// The outcomes of a generation's recent calls, newest in bit 0 (1 = fault).
#[derive(Debug, Default)]
struct Outcomes {
    bits: u64,
    len: u32,
}

impl Outcomes {
    fn push(&mut self, fault: bool, window: u32) -> u32 {
        self.bits = (self.bits << 1) | u64::from(fault);
        self.len = (self.len + 1).min(window);
        let mask = if window >= 64 {
            u64::MAX
        } else {
            (1u64 << window) - 1
        };
        (self.bits & mask).count_ones()
    }
}

/// Generations a slot keeps loaded (the active one and its rollback targets).
/// Each holds a sandboxed instance (a pooling-allocator slot and its memory),
/// so without a cap a slot whose policy file keeps changing would grow until
/// instantiation fails.
pub const DEFAULT_MAX_GENERATIONS: usize = 8;

/// What a role call was given, kept with its fault for diagnosis and replay.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultInput {
    /// A scheduler round's delta.
    Delta(Delta),
    /// A tenant's view of its queue.
    Tenant(TenantView),
    /// A reclaim request (at its epoch, on the mirror the delta history rebuilds).
    Reclaim(ReclaimRequest),
    /// A matching request.
    Match(MatchRequest),
    /// A node's view, given to its coordinator.
    Node(NodeView),
}

/// The input that made a generation fault, kept for diagnosis and replay.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    pub epoch: u64,
    pub fault: PolicyFault,
    /// What the policy was given in that call.
    pub input: FaultInput,
}

/// Where a generation's instances come from.
pub enum PolicyCode {
    /// A compiled Wasm component: every instance is a fresh sandbox.
    Wasm(Box<CompiledPolicy>),
    /// A policy compiled into the host (trusted code: a native baseline, a
    /// test double). It is given as one instance, so it cannot be made
    /// afresh: once dropped after a fault, the generation faults on every
    /// call until it is quarantined.
    Native(NativeCode),
}

/// A native policy waiting to be a generation's instance.
pub struct NativeCode {
    manifest: Manifest,
    digest: String,
    policy: Mutex<Option<Box<dyn NativePolicy>>>,
}

impl NativeCode {
    /// Reads the policy's manifest; its digest is `native:<name>@<version>`.
    pub fn new(policy: Box<dyn NativePolicy>) -> Self {
        let manifest = policy.manifest();
        NativeCode {
            digest: format!("native:{}@{}", manifest.name, manifest.version),
            manifest,
            policy: Mutex::new(Some(policy)),
        }
    }
}

impl PolicyCode {
    pub fn manifest(&self) -> &Manifest {
        match self {
            PolicyCode::Wasm(c) => &c.manifest,
            PolicyCode::Native(n) => &n.manifest,
        }
    }

    pub fn digest(&self) -> &str {
        match self {
            PolicyCode::Wasm(c) => &c.digest,
            PolicyCode::Native(n) => &n.digest,
        }
    }

    /// Whether the policy declares (and, for a component, exports) `role`.
    pub fn has_role(&self, role: arbiter_policy_sdk::model::Role) -> bool {
        match self {
            PolicyCode::Wasm(c) => c.has_role(role),
            PolicyCode::Native(n) => n.manifest.roles.iter().any(|r| r == role.as_str()),
        }
    }

    fn instance(&self) -> Result<PolicyInstance, PolicyFault> {
        match self {
            PolicyCode::Wasm(c) => c.instantiate(),
            PolicyCode::Native(n) => n
                .policy
                .lock()
                .take()
                .map(PolicyInstance::native)
                .ok_or_else(|| PolicyFault::Abi("native policy instance lost".into())),
        }
    }
}

impl From<CompiledPolicy> for PolicyCode {
    fn from(compiled: CompiledPolicy) -> Self {
        PolicyCode::Wasm(Box::new(compiled))
    }
}

/// One loaded version of a policy.
pub struct Generation {
    pub id: u64,
    pub code: PolicyCode,
    pub config: String,
    pub source: Option<PathBuf>,
    pub loaded_at: Instant,
    /// Time to compile, instantiate and configure it.
    pub load_time: Duration,
    consecutive_faults: AtomicU32,
    total_faults: AtomicU64,
    rounds_served: AtomicU64,
    /// Instances made after the first (a trap is never re-entered).
    reinstantiations: AtomicU64,
    recent: Mutex<Outcomes>,
    quarantined: AtomicBool,
    last_fault: Mutex<Option<FaultRecord>>,
    pub(crate) instance: Mutex<Option<PolicyInstance>>,
}

impl Generation {
    pub fn manifest(&self) -> &Manifest {
        self.code.manifest()
    }
    pub fn digest(&self) -> &str {
        self.code.digest()
    }
    /// The compiled component, unless the generation is native.
    pub fn compiled(&self) -> Option<&CompiledPolicy> {
        match &self.code {
            PolicyCode::Wasm(c) => Some(c),
            PolicyCode::Native(_) => None,
        }
    }
    pub fn consecutive_faults(&self) -> u32 {
        self.consecutive_faults.load(Ordering::Relaxed)
    }
    pub fn reinstantiations(&self) -> u64 {
        self.reinstantiations.load(Ordering::Relaxed)
    }
    pub fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Acquire)
    }
    pub fn total_faults(&self) -> u64 {
        self.total_faults.load(Ordering::Relaxed)
    }
    pub fn rounds_served(&self) -> u64 {
        self.rounds_served.load(Ordering::Relaxed)
    }
    pub fn last_fault(&self) -> Option<FaultRecord> {
        self.last_fault.lock().clone()
    }

    /// A fresh instance with this generation's configuration.
    pub fn new_instance(&self) -> Result<PolicyInstance, PolicyFault> {
        let mut instance = self.code.instance()?;
        let config = if self.config.is_empty() {
            &self.manifest().default_config
        } else {
            &self.config
        };
        instance.configure(config)?;
        Ok(instance)
    }

    /// [`Generation::new_instance`] in place of one a fault dropped.
    pub(crate) fn reinstantiate(&self) -> Result<PolicyInstance, PolicyFault> {
        self.reinstantiations.fetch_add(1, Ordering::Relaxed);
        self.new_instance()
    }

    /// Brings this generation's idle mirror up to the feed's epoch (see
    /// [`PolicyInstance::catch_up`]); `Ok(None)` if it needs a resync.
    pub fn catch_up(&self, feed: &DeltaFeed) -> Result<Option<u64>, PolicyFault> {
        match self.instance.lock().as_mut() {
            Some(instance) => instance.catch_up(feed),
            None => Ok(None),
        }
    }

    /// Epoch of this generation's mirror, if it has a synchronised instance.
    pub fn mirror_epoch(&self) -> Option<u64> {
        self.instance
            .lock()
            .as_ref()
            .and_then(PolicyInstance::mirror_epoch)
    }

    /// Records a fault; returns true if this fault quarantined the generation.
    pub(crate) fn record_fault(&self, record: FaultRecord, rule: QuarantineRule) -> bool {
        let rule = rule.normalised();
        self.total_faults.fetch_add(1, Ordering::Relaxed);
        let consecutive = self.consecutive_faults.fetch_add(1, Ordering::AcqRel) + 1;
        let in_window = self.recent.lock().push(true, rule.window);
        *self.last_fault.lock() = Some(record);
        let due = consecutive >= rule.consecutive || in_window >= rule.window_faults;
        due && !self.quarantined.swap(true, Ordering::AcqRel)
    }

    /// Records a call that succeeded (a served round, an accepted verdict).
    pub(crate) fn record_success(&self, rule: QuarantineRule) {
        self.consecutive_faults.store(0, Ordering::Relaxed);
        self.recent.lock().push(false, rule.normalised().window);
        self.rounds_served.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops the cached instance, so the next round starts a fresh one. Needed
    /// when the state it mirrors is replaced by a new `ClusterState` (whose
    /// epochs start over and could collide with the old mirror's).
    pub fn discard_instance(&self) {
        *self.instance.lock() = None;
    }

    /// Lifts a quarantine: an operator's decision (reloading a policy makes
    /// a new generation; rollback never lifts one).
    pub fn release_quarantine(&self) {
        self.consecutive_faults.store(0, Ordering::Relaxed);
        *self.recent.lock() = Outcomes::default();
        self.quarantined.store(false, Ordering::Release);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("policy load failed: {0}")]
    Load(#[from] PolicyFault),
    #[error("no generation {generation} in slot `{slot}`")]
    NoSuchGeneration { slot: String, generation: u64 },
    #[error("no policy slot `{0}`")]
    NoSuchSlot(String),
    #[error(
        "slot `{slot}` already gave out generation ids up to {next}; {generation} cannot be restored"
    )]
    IdTaken {
        slot: String,
        generation: u64,
        next: u64,
    },
    #[error("slot `{slot}` has no generation to roll back to")]
    NothingToRollBack { slot: String },
    #[error(
        "generation {generation} of slot `{slot}` is quarantined ({faults} faults); rollback never returns to a quarantined generation"
    )]
    Quarantined {
        slot: String,
        generation: u64,
        faults: u64,
    },
    #[error("component is `{found}`, not a generation of slot `{slot}`")]
    WrongPolicy { slot: String, found: String },
}

/// Every loaded generation of one policy, and which one is active.
pub struct PolicySlot {
    name: String,
    generations: RwLock<BTreeMap<u64, Arc<Generation>>>,
    active: ArcSwapOption<Generation>,
    next_id: AtomicU64,
    quarantine: QuarantineRule,
    max_generations: usize,
    /// Generations out of the slot that a round may still hold; freed by
    /// [`PolicySlot::reap`] once nothing else does.
    retired: Mutex<Vec<Arc<Generation>>>,
}

impl PolicySlot {
    pub fn new(name: impl Into<String>) -> Self {
        PolicySlot {
            name: name.into(),
            generations: RwLock::new(BTreeMap::new()),
            active: ArcSwapOption::empty(),
            next_id: AtomicU64::new(1),
            quarantine: QuarantineRule::default(),
            max_generations: DEFAULT_MAX_GENERATIONS,
            retired: Mutex::new(Vec::new()),
        }
    }

    /// How many generations the slot keeps (at least 1); the oldest inactive
    /// ones are unloaded when a load goes past it.
    pub fn with_max_generations(mut self, generations: usize) -> Self {
        self.max_generations = generations.max(1);
        self
    }

    pub fn max_generations(&self) -> usize {
        self.max_generations
    }

    /// Frees retired generations that no round holds any more. Called by
    /// every load and unload; a control thread may call it too.
    pub fn reap(&self) -> usize {
        let mut retired = self.retired.lock();
        let before = retired.len();
        // Only the slot holds these, and nothing can take a new reference to
        // them (they left the map and the active pointer): dropping here is
        // the last drop, on this thread.
        retired.retain(|g| Arc::strong_count(g) > 1);
        before - retired.len()
    }

    fn retire(&self, generation: Arc<Generation>) {
        self.retired.lock().push(generation);
    }

    /// Unloads the oldest generations beyond the cap, sparing the active one and `keep`.
    fn prune(&self, keep: u64) {
        let active = self.active_id();
        let mut pruned = Vec::new();
        {
            let mut generations = self.generations.write();
            while generations.len() > self.max_generations {
                let Some(oldest) = generations
                    .keys()
                    .copied()
                    .find(|&id| Some(id) != active && id != keep)
                else {
                    break;
                };
                if let Some(g) = generations.remove(&oldest) {
                    pruned.push(g);
                }
            }
        }
        for g in pruned {
            tracing::info!(slot = %self.name, generation = g.id, "oldest generation unloaded (slot at its cap)");
            self.retire(g);
        }
    }

    /// Quarantine after this many consecutive faults (the rate rule stays).
    pub fn with_quarantine_after(mut self, faults: u32) -> Self {
        self.quarantine.consecutive = faults.max(1);
        self
    }

    pub fn with_quarantine_rule(mut self, rule: QuarantineRule) -> Self {
        self.quarantine = rule.normalised();
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn quarantine_rule(&self) -> QuarantineRule {
        self.quarantine
    }

    /// Loads a compiled policy as a new, inactive generation. With a
    /// snapshot, its mirror is synchronised here, off the round loop.
    pub fn load(
        &self,
        code: impl Into<PolicyCode>,
        config: Option<String>,
        source: Option<PathBuf>,
        snapshot: Option<Snapshot>,
    ) -> Result<Arc<Generation>, RegistryError> {
        let started = Instant::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut generation = Generation {
            id,
            code: code.into(),
            config: config.unwrap_or_default(),
            source,
            loaded_at: Instant::now(),
            load_time: Duration::ZERO,
            consecutive_faults: AtomicU32::new(0),
            total_faults: AtomicU64::new(0),
            rounds_served: AtomicU64::new(0),
            reinstantiations: AtomicU64::new(0),
            recent: Mutex::new(Outcomes::default()),
            quarantined: AtomicBool::new(false),
            last_fault: Mutex::new(None),
            instance: Mutex::new(None),
        };
        let mut instance = generation.new_instance()?;
        if let Some(snapshot) = snapshot {
            instance.resync(snapshot)?;
        }
        generation.instance = Mutex::new(Some(instance));
        generation.load_time = started.elapsed();
        let generation = Arc::new(generation);
        self.generations.write().insert(id, generation.clone());
        self.prune(id);
        self.reap();
        tracing::info!(slot = %self.name, generation = id, digest = %generation.digest(), "policy generation loaded");
        Ok(generation)
    }

    /// [`PolicySlot::load`] under a given id, as a restart restores a
    /// persisted generation, so the ids operators, metrics and the journal
    /// know stay the same. Ids must come in increasing order, above every id
    /// the slot gave out; call it while nothing else loads into the slot.
    pub fn load_as(
        &self,
        id: u64,
        code: impl Into<PolicyCode>,
        config: Option<String>,
    ) -> Result<Arc<Generation>, RegistryError> {
        let next = self.next_id.load(Ordering::Relaxed);
        if id < next {
            return Err(RegistryError::IdTaken {
                slot: self.name.clone(),
                generation: id,
                next,
            });
        }
        self.next_id.store(id, Ordering::Relaxed);
        self.load(code, config, None, None)
    }

    /// Makes a loaded generation the active one (takes effect at the next round).
    pub fn activate(&self, id: u64) -> Result<(), RegistryError> {
        let generation = self.get(id)?;
        self.active.store(Some(generation));
        tracing::info!(slot = %self.name, generation = id, "policy generation activated");
        Ok(())
    }

    /// Load + activate: a hot swap.
    pub fn swap(
        &self,
        compiled: impl Into<PolicyCode>,
        config: Option<String>,
        source: Option<PathBuf>,
        snapshot: Option<Snapshot>,
    ) -> Result<Arc<Generation>, RegistryError> {
        let generation = self.load(compiled, config, source, snapshot)?;
        self.activate(generation.id)?;
        Ok(generation)
    }

    /// A hot swap that leaves the round loop almost nothing to do: load (with
    /// `snapshot`, off the round loop), catch the new mirror up to the state's
    /// latest round through `feed`, then activate. The first round of the new
    /// generation applies only the rounds that ran since the catch-up (about
    /// one), instead of every round since the snapshot; a mirror the feed
    /// cannot reach (the snapshot predates a resync epoch) resyncs in that
    /// round, as with [`PolicySlot::swap`]. A fault while catching up fails
    /// the swap and unloads the generation; the active one keeps serving.
    pub fn swap_with_feed(
        &self,
        compiled: CompiledPolicy,
        config: Option<String>,
        source: Option<PathBuf>,
        snapshot: Option<Snapshot>,
        feed: &DeltaFeed,
    ) -> Result<Arc<Generation>, RegistryError> {
        let generation = self.load(compiled, config, source, snapshot)?;
        let span = tracing::debug_span!("catch_up", slot = %self.name, generation = generation.id);
        let _guard = span.enter();
        // Twice: rounds run while the first (larger) delta is applied.
        for _ in 0..2 {
            match generation.catch_up(feed) {
                Ok(Some(epoch)) if epoch == feed.epoch() => break,
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(fault) => {
                    tracing::warn!(slot = %self.name, generation = generation.id, %fault, "new generation failed to catch up; not activated");
                    let _ = self.unload(generation.id);
                    return Err(RegistryError::Load(fault));
                }
            }
        }
        self.activate(generation.id)?;
        Ok(generation)
    }

    /// Activates a given generation, or (with `None`) the newest healthy one
    /// older than the active one. Never a quarantined one: it would fault
    /// again, and an automatic rollback must not undo a quarantine.
    pub fn rollback(&self, to: Option<u64>) -> Result<Arc<Generation>, RegistryError> {
        let target = match to {
            Some(id) => {
                let g = self.get(id)?;
                if g.is_quarantined() {
                    return Err(RegistryError::Quarantined {
                        slot: self.name.clone(),
                        generation: id,
                        faults: g.total_faults(),
                    });
                }
                g
            }
            None => {
                let active = self.active_id();
                self.generations
                    .read()
                    .values()
                    .rev()
                    .find(|g| Some(g.id) < active && !g.is_quarantined())
                    .cloned()
                    .ok_or_else(|| RegistryError::NothingToRollBack {
                        slot: self.name.clone(),
                    })?
            }
        };
        self.active.store(Some(target.clone()));
        tracing::warn!(slot = %self.name, generation = target.id, "rolled back");
        Ok(target)
    }

    /// Removes a generation; if it was active, the slot falls back to the newest healthy other one.
    pub fn unload(&self, id: u64) -> Result<(), RegistryError> {
        let removed = self.generations.write().remove(&id);
        let Some(removed) = removed else {
            return Err(RegistryError::NoSuchGeneration {
                slot: self.name.clone(),
                generation: id,
            });
        };
        self.retire(removed);
        if self.active_id() == Some(id) {
            let next = self
                .generations
                .read()
                .values()
                .rev()
                .find(|g| !g.is_quarantined())
                .cloned();
            self.active.store(next);
        }
        self.reap();
        Ok(())
    }

    pub fn get(&self, id: u64) -> Result<Arc<Generation>, RegistryError> {
        self.generations
            .read()
            .get(&id)
            .cloned()
            .ok_or_else(|| RegistryError::NoSuchGeneration {
                slot: self.name.clone(),
                generation: id,
            })
    }

    pub fn active(&self) -> Option<Arc<Generation>> {
        self.active.load_full()
    }

    pub fn active_id(&self) -> Option<u64> {
        self.active.load().as_ref().map(|g| g.id)
    }

    /// All generations, oldest first.
    pub fn generations(&self) -> Vec<Arc<Generation>> {
        self.generations.read().values().cloned().collect()
    }

    /// The healthy generations older than `active`, newest first: where a
    /// round falls back to when the active generation faults.
    pub fn fallbacks_below(&self, active: Option<u64>) -> Vec<Arc<Generation>> {
        self.generations
            .read()
            .values()
            .rev()
            .filter(|g| Some(g.id) < active && !g.is_quarantined())
            .cloned()
            .collect()
    }

    /// The order in which a round tries generations: the active one, then
    /// older healthy ones, newest first.
    pub fn fallback_chain(&self) -> Vec<Arc<Generation>> {
        let active = self.active();
        let mut chain: Vec<Arc<Generation>> = active
            .iter()
            .filter(|g| !g.is_quarantined())
            .cloned()
            .collect();
        let active_id = active.as_ref().map(|g| g.id);
        chain.extend(
            self.generations
                .read()
                .values()
                .rev()
                .filter(|g| {
                    Some(g.id) != active_id && Some(g.id) < active_id && !g.is_quarantined()
                })
                .cloned(),
        );
        chain
    }
}

/// All slots of a host, by policy name.
pub struct Registry {
    engine: PolicyEngine,
    slots: RwLock<BTreeMap<String, Arc<PolicySlot>>>,
}

impl Registry {
    pub fn new(engine: PolicyEngine) -> Self {
        Registry {
            engine,
            slots: RwLock::new(BTreeMap::new()),
        }
    }

    pub fn engine(&self) -> &PolicyEngine {
        &self.engine
    }

    /// The slot for a policy name, created empty if new.
    pub fn slot(&self, name: &str) -> Arc<PolicySlot> {
        if let Some(slot) = self.slots.read().get(name) {
            return slot.clone();
        }
        self.slots
            .write()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(PolicySlot::new(name)))
            .clone()
    }

    pub fn find(&self, name: &str) -> Option<Arc<PolicySlot>> {
        self.slots.read().get(name).cloned()
    }

    pub fn slots(&self) -> Vec<Arc<PolicySlot>> {
        self.slots.read().values().cloned().collect()
    }

    /// Drops a slot and its generations (a removed tenant's); instances
    /// already handed out finish their call.
    pub fn remove(&self, name: &str) -> Option<Arc<PolicySlot>> {
        self.slots.write().remove(name)
    }

    /// Compiles `wasm` and hot-swaps it into the slot named by its manifest.
    pub fn load_bytes(
        &self,
        wasm: &[u8],
        config: Option<String>,
        source: Option<PathBuf>,
        snapshot: Option<Snapshot>,
    ) -> Result<(Arc<PolicySlot>, Arc<Generation>), RegistryError> {
        let compiled = self.engine.compile(wasm)?;
        let slot = self.slot(&compiled.manifest.name);
        let generation = slot.swap(compiled, config, source, snapshot)?;
        Ok((slot, generation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeConfig;

    fn compiled(name: &str) -> CompiledPolicy {
        let engine = PolicyEngine::new(RuntimeConfig::default()).unwrap();
        engine
            .compile(arbiter_policies::get(name).unwrap())
            .unwrap()
    }

    #[test]
    fn restored_generations_keep_their_ids_and_new_ones_follow() {
        let slot = PolicySlot::new("fifo");
        assert_eq!(slot.load_as(4, compiled("fifo"), None).unwrap().id, 4);
        assert_eq!(slot.load_as(9, compiled("fifo"), None).unwrap().id, 9);
        assert!(matches!(
            slot.load_as(7, compiled("fifo"), None),
            Err(RegistryError::IdTaken {
                generation: 7,
                next: 10,
                ..
            })
        ));
        assert_eq!(
            slot.load(compiled("fifo"), None, None, None).unwrap().id,
            10
        );
    }

    #[test]
    fn swap_rollback_and_unload() {
        let slot = PolicySlot::new("fifo");
        let g1 = slot.swap(compiled("fifo"), None, None, None).unwrap();
        let g2 = slot.swap(compiled("fifo"), None, None, None).unwrap();
        assert_eq!(slot.active_id(), Some(g2.id));
        assert_eq!(
            slot.fallback_chain()
                .iter()
                .map(|g| g.id)
                .collect::<Vec<_>>(),
            vec![g2.id, g1.id]
        );
        assert_eq!(slot.rollback(None).unwrap().id, g1.id);
        assert_eq!(slot.active_id(), Some(g1.id));
        slot.activate(g2.id).unwrap();
        slot.unload(g2.id).unwrap();
        assert_eq!(slot.active_id(), Some(g1.id));
        assert!(matches!(
            slot.rollback(None),
            Err(RegistryError::NothingToRollBack { .. })
        ));
    }

    #[test]
    fn repeated_faults_quarantine() {
        let slot = PolicySlot::new("fifo").with_quarantine_after(2);
        let g = slot.swap(compiled("fifo"), None, None, None).unwrap();
        let record = FaultRecord {
            epoch: 1,
            fault: PolicyFault::OutOfFuel,
            input: FaultInput::Match(Default::default()),
        };
        assert!(!g.record_fault(record.clone(), slot.quarantine_rule()));
        assert!(g.record_fault(record, slot.quarantine_rule()));
        assert!(g.is_quarantined());
        assert!(slot.fallback_chain().is_empty());
    }

    fn fault_record() -> FaultRecord {
        FaultRecord {
            epoch: 1,
            fault: PolicyFault::Deadline(Duration::from_millis(50)),
            input: FaultInput::Match(Default::default()),
        }
    }

    #[test]
    fn a_generation_that_faults_every_other_call_is_quarantined_by_rate() {
        let rule = QuarantineRule {
            consecutive: 3,
            window: 10,
            window_faults: 4,
        };
        let slot = PolicySlot::new("fifo").with_quarantine_rule(rule);
        let g = slot.swap(compiled("fifo"), None, None, None).unwrap();
        let mut quarantined_at = None;
        for call in 1..=20 {
            if call % 2 == 1 {
                if g.record_fault(fault_record(), slot.quarantine_rule()) {
                    quarantined_at = Some(call);
                    break;
                }
            } else {
                g.record_success(slot.quarantine_rule());
            }
        }
        // Never two in a row, but the 4th fault in 10 calls is the 7th call.
        assert_eq!(quarantined_at, Some(7));
        assert!(g.is_quarantined());
    }

    #[test]
    fn faults_older_than_the_window_are_forgotten() {
        let rule = QuarantineRule {
            consecutive: 3,
            window: 5,
            window_faults: 2,
        };
        let slot = PolicySlot::new("fifo").with_quarantine_rule(rule);
        let g = slot.swap(compiled("fifo"), None, None, None).unwrap();
        for _ in 0..50 {
            assert!(!g.record_fault(fault_record(), rule));
            for _ in 0..5 {
                g.record_success(rule);
            }
        }
        assert!(!g.is_quarantined());
        assert_eq!(g.total_faults(), 50);
    }

    #[test]
    fn rollback_never_returns_to_a_quarantined_generation() {
        let slot = PolicySlot::new("fifo").with_quarantine_after(1);
        let bad = slot.swap(compiled("fifo"), None, None, None).unwrap();
        let newer = slot.swap(compiled("fifo"), None, None, None).unwrap();
        assert!(bad.record_fault(fault_record(), slot.quarantine_rule()));
        assert!(matches!(
            slot.rollback(Some(bad.id)),
            Err(RegistryError::Quarantined { generation, .. }) if generation == bad.id
        ));
        assert!(matches!(
            slot.rollback(None),
            Err(RegistryError::NothingToRollBack { .. })
        ));
        assert_eq!(slot.active_id(), Some(newer.id));
        assert!(bad.is_quarantined());
    }

    #[test]
    fn a_slot_keeps_at_most_its_cap_of_generations() {
        let slot = PolicySlot::new("fifo").with_max_generations(3);
        let c = compiled("fifo");
        let ids: Vec<u64> = (0..6)
            .map(|_| slot.swap(c.clone(), None, None, None).unwrap().id)
            .collect();
        let loaded =
            |slot: &PolicySlot| slot.generations().iter().map(|g| g.id).collect::<Vec<_>>();
        assert_eq!(loaded(&slot), ids[3..]);
        assert_eq!(slot.active_id(), Some(ids[5]));
        // The active generation is spared even when it is the oldest.
        slot.rollback(Some(ids[3])).unwrap();
        let newest = slot.swap(c, None, None, None).unwrap().id;
        assert_eq!(loaded(&slot), vec![ids[3], ids[5], newest]);
    }

    #[test]
    fn a_generation_leaving_the_slot_is_freed_by_a_control_call_not_by_a_round() {
        let slot = PolicySlot::new("fifo");
        let first = slot.swap(compiled("fifo"), None, None, None).unwrap();
        let weak = Arc::downgrade(&first);
        let held_by_round = first.clone();
        drop(first);
        slot.swap(compiled("fifo"), None, None, None).unwrap();
        slot.unload(held_by_round.id).unwrap();
        // The round lets go: not the last reference, so nothing is freed here.
        drop(held_by_round);
        assert!(weak.upgrade().is_some());
        assert_eq!(slot.reap(), 1);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn swap_with_feed_catches_the_new_mirror_up_before_activation() {
        use crate::roles::scheduler::{RoundDriver, Served};
        use crate::state::{ClusterState, JobRequest, NodeRequest};
        let mut state = ClusterState::new();
        state
            .add_node(NodeRequest::gpus("n0", "default", "A100", 81_920, 8))
            .unwrap();
        let feed = state.delta_feed();
        let slot = Arc::new(PolicySlot::new("fifo"));
        let mut driver = RoundDriver::new(slot.clone());
        let first = slot.swap(compiled("fifo"), None, None, None).unwrap();
        let mut round = |state: &mut ClusterState, i: usize| {
            state
                .submit(JobRequest::gpus(format!("j{i}"), "t", 1, 1))
                .unwrap();
            driver.run_round(state)
        };
        for i in 0..3 {
            assert_eq!(round(&mut state, i).served, Served::Active(first.id));
        }
        // A snapshot a few rounds old: the feed brings the new mirror to the last round.
        let snapshot = state.snapshot();
        for i in 3..6 {
            round(&mut state, i);
        }
        let second = slot
            .swap_with_feed(compiled("fifo"), None, None, Some(snapshot), &feed)
            .unwrap();
        assert_eq!(second.mirror_epoch(), Some(state.epoch()));
        let report = round(&mut state, 6);
        assert_eq!(report.served, Served::Active(second.id));
        assert!(report.faults.is_empty());
        // A snapshot from before a resync epoch cannot be caught up: the swap
        // still succeeds and the first round resyncs.
        let stale = state.snapshot();
        state.compact_strings().unwrap();
        round(&mut state, 7);
        let third = slot
            .swap_with_feed(compiled("fifo"), None, None, Some(stale.clone()), &feed)
            .unwrap();
        assert_eq!(third.mirror_epoch(), Some(stale.epoch));
        let report = round(&mut state, 8);
        assert_eq!(report.served, Served::Active(third.id));
        assert!(report.faults.is_empty());
        assert_eq!(third.mirror_epoch(), Some(state.epoch()));
    }

    /// Epochs count one state's history: a mirror of one state is not caught
    /// up by another state's deltas, even where the epochs line up.
    #[test]
    fn a_feed_of_another_state_leaves_the_mirror_alone() {
        use crate::roles::scheduler::RoundDriver;
        use crate::state::{ClusterState, JobRequest, NodeRequest};
        let one_node = || {
            let mut s = ClusterState::new();
            s.add_node(NodeRequest::gpus("n0", "default", "A100", 81_920, 8))
                .unwrap();
            s
        };
        let (mut followed, mut other) = (one_node(), one_node());
        let slot = Arc::new(PolicySlot::new("fifo"));
        let generation = slot.swap(compiled("fifo"), None, None, None).unwrap();
        RoundDriver::new(slot.clone()).run_round(&mut followed);
        let at = followed.epoch();
        assert_eq!(generation.mirror_epoch(), Some(at));
        other.begin_round(0);
        assert_eq!(other.epoch(), at);
        other
            .submit(JobRequest::gpus("elsewhere", "t", 1, 1))
            .unwrap();
        other.begin_round(0);
        assert!(other.delta_since(at).is_some());
        assert!(matches!(generation.catch_up(&other.delta_feed()), Ok(None)));
        assert_eq!(generation.mirror_epoch(), Some(at));
    }
}
