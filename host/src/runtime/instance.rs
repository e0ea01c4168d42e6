//! One live policy instance — Wasm in a sandboxed store, or a native built-in —
//! behind a single API, so the round driver has one path for both.

use super::contract::{Call, ContractExports};
use super::engine::{CompiledPolicy, HostState};
use super::fault::{FaultLimits, PolicyFault};
use super::ticker::Ticker;
use crate::state::{ClusterState, DeltaFeed};
use arbiter_policy_sdk::model::*;
use arbiter_policy_sdk::{Policy, Runtime};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::Store;

/// A policy compiled into the host binary (the last-resort fallback, and the
/// native baseline of the benchmarks). Implemented for every SDK [`Runtime`].
pub trait NativePolicy: Send {
    fn manifest(&self) -> Manifest;
    fn configure(&mut self, config: &str) -> Result<(), PolicyError>;
    fn resync(&mut self, snapshot: Snapshot) -> Result<(), PolicyError>;
    fn apply(&mut self, delta: &Delta) -> Result<(), PolicyError>;
    fn schedule(&mut self, round: RoundInfo) -> Result<Vec<Decision>, PolicyError>;
    fn reclaim(&mut self, request: ReclaimRequest) -> Result<ReclaimPlan, PolicyError>;
    fn match_workloads(&mut self, request: MatchRequest) -> Result<Vec<Pairing>, PolicyError>;
    fn tick(&mut self, view: NodeView) -> Result<Vec<NodeAction>, PolicyError>;
    fn order(&mut self, view: TenantView) -> Result<TenantVerdict, PolicyError>;
}

impl<P: Policy + Send> NativePolicy for Runtime<P> {
    fn manifest(&self) -> Manifest {
        Runtime::manifest(self)
    }
    fn configure(&mut self, config: &str) -> Result<(), PolicyError> {
        Runtime::configure(self, config)
    }
    fn resync(&mut self, snapshot: Snapshot) -> Result<(), PolicyError> {
        Runtime::resync(self, snapshot)
    }
    fn apply(&mut self, delta: &Delta) -> Result<(), PolicyError> {
        Runtime::apply(self, delta)
    }
    fn schedule(&mut self, round: RoundInfo) -> Result<Vec<Decision>, PolicyError> {
        Runtime::schedule(self, round)
    }
    fn reclaim(&mut self, request: ReclaimRequest) -> Result<ReclaimPlan, PolicyError> {
        Runtime::reclaim(self, request)
    }
    fn match_workloads(&mut self, request: MatchRequest) -> Result<Vec<Pairing>, PolicyError> {
        Runtime::match_workloads(self, request)
    }
    fn tick(&mut self, view: NodeView) -> Result<Vec<NodeAction>, PolicyError> {
        Runtime::tick(self, view)
    }
    fn order(&mut self, view: TenantView) -> Result<TenantVerdict, PolicyError> {
        Runtime::order(self, view)
    }
}

/// Cost of the last call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStats {
    pub wall: Duration,
    /// Fuel consumed, when fuel accounting is on.
    pub fuel: Option<u64>,
}

struct WasmInstance {
    store: Store<HostState>,
    exports: ContractExports,
    limits: FaultLimits,
    deadline_ticks: u64,
    fuel: Option<u64>,
    max_log_lines: u32,
    /// Runs the deadline's clock while a call of this instance is in flight.
    ticker: Arc<Ticker>,
}

enum Backend {
    Wasm(Box<WasmInstance>),
    Native(Box<dyn NativePolicy>),
}

/// Where an instance's cluster mirror is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mirror {
    epoch: u64,
    /// The [`ClusterState::lineage`] of the state it follows; `None` after a
    /// bare [`PolicyInstance::resync`] (the caller vouches for the snapshot's
    /// source until the next [`PolicyInstance::sync_to`] names the state).
    lineage: Option<u64>,
}

/// A live policy instance and where its mirror is.
pub struct PolicyInstance {
    backend: Backend,
    mirror: Option<Mirror>,
    poisoned: Option<PolicyFault>,
    last: CallStats,
    /// Fuel consumed by every call so far, when fuel accounting is on.
    fuel_spent: Option<u64>,
}

fn unsupported(role: Role) -> PolicyFault {
    PolicyFault::Unsupported(role.as_str().into())
}

impl PolicyInstance {
    pub(crate) fn wasm(compiled: &CompiledPolicy) -> Result<PolicyInstance, PolicyFault> {
        let engine = &compiled.engine;
        let name: Arc<str> = if compiled.manifest.name.is_empty() {
            Arc::from(&compiled.digest[..12])
        } else {
            Arc::from(compiled.manifest.name.as_str())
        };
        let mut store = engine.new_store(name, compiled.account.clone());
        let config = engine.config();
        let deadline_ticks = engine.deadline_ticks();
        store.set_epoch_deadline(deadline_ticks);
        if let Some(fuel) = config.fuel {
            store
                .set_fuel(fuel)
                .map_err(|e| PolicyFault::Abi(e.to_string()))?;
        }
        let ticker = engine.ticker().clone();
        let running = ticker.call();
        let limits = config.fault_limits();
        let instance = compiled.pre.instantiate(&mut store).map_err(|e| {
            PolicyFault::from_call_error(&e, &limits, store.data().last_error_log.as_deref())
        })?;
        let exports = compiled
            .roles
            .load(&mut store, &instance)
            .map_err(|e| PolicyFault::Abi(format!("loading exports: {e:#}")))?;
        drop(running);
        Ok(PolicyInstance {
            backend: Backend::Wasm(Box::new(WasmInstance {
                store,
                exports,
                limits,
                deadline_ticks,
                fuel: config.fuel,
                max_log_lines: config.max_log_lines,
                ticker,
            })),
            mirror: None,
            poisoned: None,
            last: CallStats::default(),
            fuel_spent: None,
        })
    }

    /// Wraps a native policy.
    pub fn native(policy: Box<dyn NativePolicy>) -> PolicyInstance {
        PolicyInstance {
            backend: Backend::Native(policy),
            mirror: None,
            poisoned: None,
            last: CallStats::default(),
            fuel_spent: None,
        }
    }

    /// Whether a fault made this instance unusable.
    pub fn poisoned(&self) -> Option<&PolicyFault> {
        self.poisoned.as_ref()
    }

    pub fn is_native(&self) -> bool {
        matches!(self.backend, Backend::Native(_))
    }

    /// Epoch of the instance's cluster mirror, if synchronised.
    pub fn mirror_epoch(&self) -> Option<u64> {
        self.mirror.map(|m| m.epoch)
    }

    pub fn last_call(&self) -> CallStats {
        self.last
    }

    /// Fuel consumed by all of this instance's calls so far (`None` without fuel
    /// accounting, or for a native policy): a caller that makes several calls for one
    /// answer (a scheduler's sync, then its round) takes the difference.
    pub fn fuel_spent(&self) -> Option<u64> {
        self.fuel_spent
    }

    /// Bytes the instance holds in linear memories and tables (0 for a
    /// native policy).
    pub fn memory_bytes(&self) -> usize {
        match &self.backend {
            Backend::Wasm(w) => w.store.data().limits.used(),
            Backend::Native(_) => 0,
        }
    }

    /// Runs one guest call under the sandbox; any wasmtime error poisons the instance.
    fn wasm_call<R>(
        &mut self,
        now_ms: u64,
        call: impl FnOnce(&mut Store<HostState>, &ContractExports) -> Result<R, PolicyFault>,
    ) -> Result<R, PolicyFault> {
        if let Some(fault) = &self.poisoned {
            return Err(PolicyFault::Abi(format!(
                "instance unusable after an earlier fault: {fault}"
            )));
        }
        let Backend::Wasm(w) = &mut self.backend else {
            return Err(PolicyFault::Abi("not a Wasm instance".into()));
        };
        w.store.set_epoch_deadline(w.deadline_ticks);
        if let Some(fuel) = w.fuel {
            w.store
                .set_fuel(fuel)
                .map_err(|e| PolicyFault::Abi(e.to_string()))?;
        }
        {
            let data = w.store.data_mut();
            data.now_ms = now_ms;
            data.log_budget = w.max_log_lines;
            data.last_error_log = None;
        }
        let start = Instant::now();
        let running = w.ticker.call();
        let result = call(&mut w.store, &w.exports);
        drop(running);
        let fuel = w
            .fuel
            .and_then(|f| w.store.get_fuel().ok().map(|left| f.saturating_sub(left)));
        self.last = CallStats {
            wall: start.elapsed(),
            fuel,
        };
        if let Some(fuel) = fuel {
            self.fuel_spent = Some(self.fuel_spent.unwrap_or(0).saturating_add(fuel));
        }
        w.store.data_mut().report_dropped_logs();
        if let Err(fault) = &result
            && fault.poisons_instance()
        {
            self.poisoned = Some(fault.clone());
            self.mirror = None;
        }
        result
    }

    fn classify(&self, e: wasmtime::Error) -> PolicyFault {
        match &self.backend {
            Backend::Wasm(w) => PolicyFault::from_call_error(
                &e,
                &w.limits,
                w.store.data().last_error_log.as_deref(),
            ),
            Backend::Native(_) => PolicyFault::Trap(format!("{e:#}")),
        }
    }

    fn native_call<R>(
        &mut self,
        call: impl FnOnce(&mut dyn NativePolicy) -> R,
    ) -> Result<R, PolicyFault> {
        let Backend::Native(p) = &mut self.backend else {
            return Err(PolicyFault::Abi("not a native instance".into()));
        };
        let start = Instant::now();
        let out = call(p.as_mut());
        self.last = CallStats {
            wall: start.elapsed(),
            fuel: None,
        };
        Ok(out)
    }

    pub fn describe(&mut self) -> Result<Manifest, PolicyFault> {
        if self.is_native() {
            return self.native_call(|p| p.manifest());
        }
        let r = self.wasm_call(0, |store, ex| Ok(ex.describe(store)));
        self.lift(r)
    }

    pub fn configure(&mut self, config: &str) -> Result<(), PolicyFault> {
        if self.is_native() {
            return self
                .native_call(|p| p.configure(config))?
                .map_err(PolicyFault::from_policy_error);
        }
        let r = self.wasm_call(0, |store, ex| Ok(ex.configure(store, config)));
        self.lift_result(r)
    }

    /// Replaces the mirror with a full snapshot.
    pub fn resync(&mut self, snapshot: Snapshot) -> Result<(), PolicyFault> {
        let epoch = snapshot.epoch;
        let now = snapshot.now_ms;
        let r = if self.is_native() {
            self.native_call(|p| p.resync(snapshot))?
                .map_err(PolicyFault::from_policy_error)
        } else {
            let r = self.wasm_call(now, |store, ex| {
                ex.resync(store, snapshot)
                    .ok_or_else(|| unsupported(Role::Scheduler))
            });
            self.lift_result(r)
        };
        self.mirror = r.is_ok().then_some(Mirror {
            epoch,
            lineage: None,
        });
        r
    }

    /// Applies a delta to the mirror.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), PolicyFault> {
        self.apply_delta(Cow::Borrowed(delta))
    }

    /// [`PolicyInstance::apply`] of a delta the caller may give away: a
    /// component gets it moved into its call, not copied (a round's delta
    /// holds every arrival).
    fn apply_delta(&mut self, delta: Cow<'_, Delta>) -> Result<(), PolicyFault> {
        let epoch = delta.epoch;
        let r = if self.is_native() {
            self.native_call(|p| p.apply(&delta))?
                .map_err(PolicyFault::from_policy_error)
        } else {
            let delta = delta.into_owned();
            let r = self.wasm_call(delta.now_ms, |store, ex| {
                ex.apply(store, delta)
                    .ok_or_else(|| unsupported(Role::Scheduler))
            });
            self.lift_result(r)
        };
        // The delta continues whatever state the mirror followed.
        let lineage = self.mirror.and_then(|m| m.lineage);
        self.mirror = r.is_ok().then_some(Mirror { epoch, lineage });
        r
    }

    /// Brings the mirror to the state's epoch: a delta if history allows, else a snapshot.
    /// A mirror of another state resyncs, whatever its epoch: epochs count one state's
    /// history (an instance of the control plane's `reclaim` slot answers for every cell).
    pub fn sync_to(&mut self, state: &ClusterState) -> Result<(), PolicyFault> {
        let lineage = state.lineage();
        let Some(mirror) = self
            .mirror
            .filter(|m| m.lineage.is_none_or(|l| l == lineage))
        else {
            return self.resync_to(state);
        };
        let r = if mirror.epoch == state.epoch() {
            Ok(())
        } else {
            match state.delta_since(mirror.epoch) {
                Some(d) => match self.apply_delta(Cow::Owned(d)) {
                    Err(PolicyFault::Stale(_)) => return self.resync_to(state),
                    other => other,
                },
                None => return self.resync_to(state),
            }
        };
        self.follow(lineage, r)
    }

    /// After a successful sync, the mirror follows the state of `lineage`.
    fn follow(&mut self, lineage: u64, r: Result<(), PolicyFault>) -> Result<(), PolicyFault> {
        if r.is_ok()
            && let Some(m) = &mut self.mirror
        {
            m.lineage = Some(lineage);
        }
        r
    }

    /// Brings the mirror as far as a [`DeltaFeed`] reaches, off the round loop
    /// (one merged delta). `Ok(Some(epoch))`: the mirror is at the feed's
    /// epoch; `Ok(None)`: it cannot be caught up by delta (never synced, or
    /// older than the feed's history or resync epoch) and the next round
    /// resyncs it. A fault other than `stale` is returned.
    pub fn catch_up(&mut self, feed: &DeltaFeed) -> Result<Option<u64>, PolicyFault> {
        let Some(Mirror { epoch, lineage }) = self.mirror else {
            return Ok(None);
        };
        if lineage.is_some_and(|l| l != feed.lineage()) {
            return Ok(None);
        }
        let Some(delta) = feed.delta_since(epoch) else {
            return Ok(None);
        };
        if delta.base_epoch == delta.epoch {
            return Ok(Some(epoch));
        }
        let span = tracing::debug_span!(
            "catch_up",
            from = epoch,
            to = delta.epoch,
            events = delta.events.len()
        );
        let _guard = span.enter();
        let applied = self.apply(&delta);
        match self.follow(feed.lineage(), applied) {
            Ok(()) => Ok(self.mirror_epoch()),
            Err(PolicyFault::Stale(_)) => Ok(None),
            Err(fault) => Err(fault),
        }
    }

    /// Replaces the mirror with the state's snapshot at its current epoch.
    pub fn resync_to(&mut self, state: &ClusterState) -> Result<(), PolicyFault> {
        let snapshot = state.snapshot_at_epoch().ok_or_else(|| {
            PolicyFault::Abi("cluster state has unsealed changes; seal it before syncing".into())
        })?;
        let r = self.resync(snapshot);
        self.follow(state.lineage(), r)
    }

    pub fn schedule(&mut self, round: RoundInfo) -> Result<Vec<Decision>, PolicyFault> {
        let decisions = if self.is_native() {
            self.native_call(|p| p.schedule(round))?
                .map_err(PolicyFault::from_policy_error)?
        } else {
            let r = self.wasm_call(round.now_ms, |store, ex| {
                ex.schedule(store, round)
                    .ok_or_else(|| unsupported(Role::Scheduler))
            });
            self.lift_result(r)?
        };
        if decisions.len() > round.max_decisions as usize {
            return Err(PolicyFault::TooManyDecisions {
                count: decisions.len(),
                limit: round.max_decisions,
            });
        }
        Ok(decisions)
    }

    pub fn reclaim(&mut self, request: ReclaimRequest) -> Result<ReclaimPlan, PolicyFault> {
        if self.is_native() {
            return self
                .native_call(|p| p.reclaim(request))?
                .map_err(PolicyFault::from_policy_error);
        }
        let r = self.wasm_call(0, |store, ex| {
            ex.reclaim(store, request)
                .ok_or_else(|| unsupported(Role::Reclaim))
        });
        self.lift_result(r)
    }

    pub fn match_workloads(&mut self, request: MatchRequest) -> Result<Vec<Pairing>, PolicyFault> {
        if self.is_native() {
            return self
                .native_call(|p| p.match_workloads(request))?
                .map_err(PolicyFault::from_policy_error);
        }
        let r = self.wasm_call(0, |store, ex| {
            ex.match_workloads(store, request)
                .ok_or_else(|| unsupported(Role::Matcher))
        });
        self.lift_result(r)
    }

    pub fn tick(&mut self, view: NodeView) -> Result<Vec<NodeAction>, PolicyFault> {
        if self.is_native() {
            return self
                .native_call(|p| p.tick(view))?
                .map_err(PolicyFault::from_policy_error);
        }
        let now = view.now_ms;
        let r = self.wasm_call(now, |store, ex| {
            ex.tick(store, view)
                .ok_or_else(|| unsupported(Role::Coordinator))
        });
        self.lift_result(r)
    }

    pub fn order(&mut self, view: TenantView) -> Result<TenantVerdict, PolicyFault> {
        if self.is_native() {
            return self
                .native_call(|p| p.order(view))?
                .map_err(PolicyFault::from_policy_error);
        }
        let now = view.now_ms;
        let r = self.wasm_call(now, |store, ex| {
            ex.order(store, view)
                .ok_or_else(|| unsupported(Role::Tenant))
        });
        self.lift_result(r)
    }

    /// Maps a call's wasmtime error into a fault (poisoning the instance).
    fn lift<T>(&mut self, r: Result<wasmtime::Result<T>, PolicyFault>) -> Result<T, PolicyFault> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let fault = self.classify(e);
                self.poisoned = Some(fault.clone());
                self.mirror = None;
                Err(fault)
            }
            Err(fault) => Err(fault),
        }
    }

    /// Like [`Self::lift`], for calls whose guest result is `result<T, policy-error>`.
    fn lift_result<T>(&mut self, r: Result<Call<T>, PolicyFault>) -> Result<T, PolicyFault> {
        self.lift(r)?.map_err(PolicyFault::from_policy_error)
    }
}
