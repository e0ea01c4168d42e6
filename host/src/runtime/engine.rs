//! The engine: configuration, compilation (cached), and what each store holds.

use super::bindings::{v0_1, v0_2};
use super::contract::ContractIndices;
use super::fault::PolicyFault;
use super::inspect::{ImportClass, Inspection, inspect_component};
use super::instance::PolicyInstance;
use super::ticker::Ticker;
use arbiter_policy_sdk::model::{Manifest, Role};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, StoreLimits};

/// Sandbox and engine settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Wall-clock bound of one guest call.
    pub deadline: Duration,
    /// Linear-memory cap of one instance, in bytes.
    pub memory_limit: usize,
    /// Fuel per call, for deterministic accounting; `None` disables fuel.
    pub fuel: Option<u64>,
    /// Epoch tick: the deadline's resolution.
    pub epoch_tick: Duration,
    /// Where compiled artifacts are cached; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Instances alive at once (pooling allocator slots).
    pub max_instances: u32,
    /// Capability import prefixes the operator allows (e.g. `wasi:clocks/`).
    /// Allowed capabilities are linked as trapping stubs: the policy loads,
    /// but v0.1 grants no real filesystem, network or clock access.
    pub allowed_capabilities: Vec<String>,
    /// Log lines a policy may write per call (more are dropped and counted).
    pub max_log_lines: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            deadline: Duration::from_millis(250),
            memory_limit: 64 << 20,
            fuel: None,
            epoch_tick: Duration::from_millis(1),
            cache_dir: None,
            max_instances: 128,
            allowed_capabilities: Vec::new(),
            max_log_lines: 64,
        }
    }
}

/// The seed `wasi:random/insecure-seed` answers: fixed, so hash maps in a
/// policy iterate the same way on every run and replays are exact.
const HASH_SEED: (u64, u64) = (0x6172_6269_7465_7221, 0x0070_6f6c_6963_7921);

/// Longest log line kept from a policy.
const MAX_LOG_LINE: usize = 1024;

/// What each store carries: the sandbox limits and the host imports' state.
pub struct HostState {
    pub(crate) limits: StoreLimits,
    pub(crate) policy: Arc<str>,
    pub(crate) now_ms: u64,
    pub(crate) log_budget: u32,
    pub(crate) logs_dropped: u64,
}

/// Severity of a guest log line, whichever contract version wrote it.
#[derive(Clone, Copy)]
enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl HostState {
    fn log_line(&mut self, level: LogLevel, message: String) {
        if self.log_budget == 0 {
            self.logs_dropped += 1;
            return;
        }
        self.log_budget -= 1;
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let policy = &*self.policy;
        match level {
            LogLevel::Trace => tracing::trace!(policy, "{message}"),
            LogLevel::Debug => tracing::debug!(policy, "{message}"),
            LogLevel::Info => tracing::info!(policy, "{message}"),
            LogLevel::Warn => tracing::warn!(policy, "{message}"),
            LogLevel::Error => tracing::error!(policy, "{message}"),
        }
    }
}

/// The `host` import of each served contract version: the same two calls.
macro_rules! host_import {
    ($v:ident) => {
        impl $v::arbiter::policy::host::Host for HostState {
            fn log(&mut self, level: $v::arbiter::policy::host::LogLevel, message: String) {
                use $v::arbiter::policy::host::LogLevel as L;
                let level = match level {
                    L::Trace => LogLevel::Trace,
                    L::Debug => LogLevel::Debug,
                    L::Info => LogLevel::Info,
                    L::Warn => LogLevel::Warn,
                    L::Error => LogLevel::Error,
                };
                self.log_line(level, message);
            }

            fn now_ms(&mut self) -> u64 {
                self.now_ms
            }
        }
    };
}

host_import!(v0_2);
host_import!(v0_1);

/// A compiled, linked policy, ready to instantiate in microseconds.
#[derive(Clone)]
pub struct CompiledPolicy {
    /// sha256 of the component bytes, hex.
    pub digest: String,
    pub manifest: Manifest,
    pub inspection: Inspection,
    pub(crate) pre: InstancePre<HostState>,
    pub(crate) roles: ContractIndices,
    pub(crate) engine: PolicyEngine,
}

impl CompiledPolicy {
    /// Roles the component both exports and declares in its manifest.
    pub fn roles(&self) -> Vec<Role> {
        self.manifest
            .roles
            .iter()
            .filter_map(|r| Role::parse(r))
            .collect()
    }

    pub fn has_role(&self, role: Role) -> bool {
        self.roles().contains(&role)
    }

    /// The contract version the component was built against (`"0.2.0"`,
    /// or `"0.1.0"` for one served through the adapter).
    pub fn contract_version(&self) -> &'static str {
        self.roles.version()
    }

    /// A fresh sandboxed instance.
    pub fn instantiate(&self) -> Result<PolicyInstance, PolicyFault> {
        PolicyInstance::wasm(self)
    }
}

struct EngineInner {
    engine: Engine,
    config: RuntimeConfig,
    compiled: Mutex<HashMap<String, Component>>,
    ticker: Arc<Ticker>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.ticker.stop();
    }
}

/// The host's one Wasm engine (cheap to clone).
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<EngineInner>,
}

impl PolicyEngine {
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Self> {
        let mut cfg = Config::new();
        cfg.epoch_interruption(true);
        cfg.consume_fuel(config.fuel.is_some());
        // Compiling a swapped-in policy must not steal the serving cores: the
        // `parallel-compilation` feature is left out of the build, so
        // compilation is serial on whichever thread loads the policy.
        let mut pool = PoolingAllocationConfig::default();
        let instances = config.max_instances.max(4);
        pool.total_component_instances(instances)
            .total_core_instances(instances * 8)
            .total_memories(instances * 2)
            .total_tables(instances * 8)
            .max_memory_size(config.memory_limit.max(1 << 20))
            .linear_memory_keep_resident(1 << 20);
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        if let Some(dir) = &config.cache_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("creating cache directory {}: {e}", dir.display()))?;
            let mut cache_config = wasmtime::CacheConfig::new();
            cache_config.with_directory(dir);
            cfg.cache(Some(wasmtime::Cache::new(cache_config)?));
        }
        let engine = Engine::new(&cfg)?;
        let ticker = Ticker::start(&engine, config.epoch_tick)?;
        Ok(PolicyEngine {
            inner: Arc::new(EngineInner {
                engine,
                config,
                compiled: Mutex::new(HashMap::new()),
                ticker,
            }),
        })
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// The epoch ticker, for instances to mark their calls.
    pub(crate) fn ticker(&self) -> &Arc<Ticker> {
        &self.inner.ticker
    }

    /// Epoch ticks that make up the call deadline.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let tick = self.inner.config.epoch_tick.as_nanos().max(1);
        (self.inner.config.deadline.as_nanos().div_ceil(tick)).max(1) as u64
    }

    /// A store with this engine's sandbox limits.
    pub(crate) fn new_store(&self, policy: Arc<str>) -> wasmtime::Store<HostState> {
        let limits = wasmtime::StoreLimitsBuilder::new()
            .memory_size(self.inner.config.memory_limit)
            .trap_on_grow_failure(true)
            .instances(64)
            .tables(64)
            .memories(16)
            .build();
        let state = HostState {
            limits,
            policy,
            now_ms: 0,
            log_budget: self.inner.config.max_log_lines,
            logs_dropped: 0,
        };
        let mut store = wasmtime::Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.limits);
        store
    }

    /// Checks, compiles, links and describes a policy component.
    pub fn compile(&self, wasm: &[u8]) -> Result<CompiledPolicy, PolicyFault> {
        let inspection = inspect_component(wasm).map_err(|e| PolicyFault::Abi(e.to_string()))?;
        for (name, class) in &inspection.imports {
            let allowed = match class {
                ImportClass::Host | ImportClass::InertWasi | ImportClass::FixedSeed => true,
                ImportClass::Capability => self
                    .inner
                    .config
                    .allowed_capabilities
                    .iter()
                    .any(|p| name.starts_with(p.as_str())),
                ImportClass::Unknown => false,
            };
            if !allowed {
                return Err(PolicyFault::Abi(format!(
                    "imports `{name}` ({class:?}); a policy gets no filesystem, network or clock unless the operator allows it"
                )));
            }
        }
        let digest = hex::encode(Sha256::digest(wasm));
        let component = {
            let cached = self.inner.compiled.lock().get(&digest).cloned();
            match cached {
                Some(c) => c,
                None => {
                    let c = Component::new(&self.inner.engine, wasm)
                        .map_err(|e| PolicyFault::Abi(format!("compiling component: {e:#}")))?;
                    self.inner.compiled.lock().insert(digest.clone(), c.clone());
                    c
                }
            }
        };
        let mut linker: Linker<HostState> = Linker::new(&self.inner.engine);
        v0_2::arbiter::policy::host::add_to_linker::<
            HostState,
            wasmtime::component::HasSelf<HostState>,
        >(&mut linker, |s| s)
        .and_then(|()| {
            v0_1::arbiter::policy::host::add_to_linker::<
                HostState,
                wasmtime::component::HasSelf<HostState>,
            >(&mut linker, |s| s)
        })
        .map_err(|e| PolicyFault::Abi(format!("linking host imports: {e:#}")))?;
        for (name, class) in &inspection.imports {
            if *class == ImportClass::FixedSeed {
                linker
                    .instance(name)
                    .and_then(|mut i| {
                        i.func_wrap(
                            "insecure-seed",
                            |_store, (): ()| -> wasmtime::Result<((u64, u64),)> {
                                Ok((HASH_SEED,))
                            },
                        )
                    })
                    .map_err(|e| PolicyFault::Abi(format!("linking `{name}`: {e:#}")))?;
            }
        }
        linker
            .define_unknown_imports_as_traps(&component)
            .map_err(|e| PolicyFault::Abi(format!("stubbing imports: {e:#}")))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| PolicyFault::Abi(format!("linking component: {e:#}")))?;
        let found: Vec<&String> = inspection
            .exports
            .iter()
            .filter(|e| e.starts_with("arbiter:policy/"))
            .collect();
        let roles = ContractIndices::find(&pre, &found).map_err(PolicyFault::Abi)?;
        let mut compiled = CompiledPolicy {
            digest,
            manifest: Manifest::default(),
            inspection,
            pre,
            roles,
            engine: self.clone(),
        };
        let mut instance = compiled.instantiate()?;
        let manifest = instance.describe()?;
        check_manifest(&manifest, &compiled.roles)?;
        compiled.manifest = manifest;
        Ok(compiled)
    }
}

/// Every declared role must be exported; a scheduler, reclaim or matcher also needs `sync`.
fn check_manifest(manifest: &Manifest, roles: &ContractIndices) -> Result<(), PolicyFault> {
    if manifest.name.trim().is_empty() {
        return Err(PolicyFault::BadAnswer("manifest has an empty name".into()));
    }
    if manifest.roles.is_empty() {
        return Err(PolicyFault::BadAnswer("manifest declares no roles".into()));
    }
    for name in &manifest.roles {
        let role = Role::parse(name).ok_or_else(|| {
            PolicyFault::BadAnswer(format!("manifest declares unknown role `{name}`"))
        })?;
        let exported = roles.exports(role);
        if !exported {
            return Err(PolicyFault::Abi(format!(
                "manifest declares role `{role}` but the component does not export it"
            )));
        }
    }
    Ok(())
}
