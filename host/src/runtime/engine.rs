//! The engine: configuration, compilation (cached), and what each store holds.

use super::bindings::{v0_3, v0_4};
use super::budget::{MemoryAccount, SandboxLimiter};
use super::contract::ContractIndices;
use super::fault::{FaultLimits, PolicyFault};
use super::guest_text::{MAX_ERROR_TEXT, MAX_NAME_TEXT, guest_text, is_plain};
use super::inspect::{CompileLimits, ImportClass, Inspection, inspect_component};
use super::instance::PolicyInstance;
use super::ticker::Ticker;
use arbiter_policy_sdk::model::{Manifest, Role};
use parking_lot::{Condvar, Mutex};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Sandbox and engine settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Wall-clock bound of one guest call.
    pub deadline: Duration,
    /// Memory budget of one instance, in bytes: all its linear memories and
    /// tables together (see `budget.rs`).
    pub memory_limit: usize,
    /// Bytes the host may allocate lifting one answer of a policy, or the arguments of one
    /// of its host calls (wasmtime's hostcall fuel, counted in host bytes; beyond it the
    /// call is a fault, [`PolicyFault::AnswerTooLarge`]). Set here rather than left to
    /// wasmtime's default, which has moved between releases (2 GiB, then 128 MiB).
    pub max_answer_bytes: usize,
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
    /// Bytes of log one instance may write per second of wall clock, over
    /// all its calls (a burst of `max_log_lines` full lines is allowed):
    /// without it a policy logging its per-call maximum every round of a
    /// 1 kHz loop writes 64 MiB/s into the operator's logs.
    pub log_bytes_per_s: u64,
    /// What one component may cost to compile, checked before compiling.
    pub compile_limits: CompileLimits,
    /// Compilations running at once; more wait. With the compile limits this
    /// bounds the memory compilation can take.
    pub max_parallel_compiles: usize,
    /// Bytes of compiled code kept in memory for reuse (least recently used
    /// evicted); only components that passed every check are kept.
    pub compiled_cache_bytes: usize,
    /// Soft limit of the on-disk cache (`cache_dir`), in bytes.
    pub disk_cache_bytes: u64,
}

impl RuntimeConfig {
    /// The bounds a call's fault names (deadline, guest memory, answer size).
    pub fn fault_limits(&self) -> FaultLimits {
        FaultLimits {
            deadline: self.deadline,
            memory_cap: self.memory_limit,
            answer_cap: self.max_answer_bytes,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            deadline: Duration::from_millis(250),
            memory_limit: 64 << 20,
            max_answer_bytes: 64 << 20,
            fuel: None,
            epoch_tick: Duration::from_millis(1),
            cache_dir: None,
            max_instances: 128,
            allowed_capabilities: Vec::new(),
            max_log_lines: 64,
            log_bytes_per_s: 8 << 10,
            compile_limits: CompileLimits::default(),
            max_parallel_compiles: std::thread::available_parallelism().map_or(2, |n| n.get()),
            compiled_cache_bytes: 256 << 20,
            disk_cache_bytes: 512 << 20,
        }
    }
}

/// The seed `wasi:random/insecure-seed` answers: fixed, so hash maps in a
/// policy iterate the same way on every run and replays are exact.
const HASH_SEED: (u64, u64) = (0x6172_6269_7465_7221, 0x0070_6f6c_6963_7921);

/// Longest log line kept from a policy.
const MAX_LOG_LINE: usize = 1024;
/// Longest description kept from a manifest (longer is cut).
const MAX_DESCRIPTION: usize = 4 << 10;
/// Longest default configuration a manifest may carry (longer is refused:
/// cutting configuration would change its meaning).
const MAX_DEFAULT_CONFIG: usize = 64 << 10;
/// Most roles a manifest may declare (the contract has five).
const MAX_ROLES: usize = 16;

/// The functions the host implements in each interface it links: a
/// component that imports anything more from these interfaces is refused
/// (linking it would need a stub, and a policy must never be told a
/// function exists that the host does not provide).
const HOST_FUNCTIONS: [(&str, &[&str]); 3] = [
    ("arbiter:policy/host", &["log", "now-ms"]),
    ("arbiter:policy/types", &[]),
    ("wasi:random/insecure-seed", &["insecure-seed"]),
];

/// What each store carries: the sandbox limits and the host imports' state.
pub struct HostState {
    pub(crate) limits: SandboxLimiter,
    pub(crate) policy: Arc<str>,
    pub(crate) now_ms: u64,
    pub(crate) log_budget: u32,
    pub(crate) log_bytes: LogAllowance,
    /// Lines dropped since the last report of drops.
    pub(crate) logs_dropped: u64,
    /// The last error-level line the policy logged in the current call,
    /// kept even over the log budget: a trap's fault quotes it (the SDK's
    /// panic hook logs what panicked and where just before the trap).
    pub(crate) last_error_log: Option<String>,
}

/// Log bytes an instance may still write: a token bucket refilled by wall
/// clock (logs are not state, so replays stay exact).
pub(crate) struct LogAllowance {
    available: u64,
    burst: u64,
    per_s: u64,
    refilled: Instant,
}

impl LogAllowance {
    fn new(burst: u64, per_s: u64) -> LogAllowance {
        LogAllowance {
            available: burst,
            burst,
            per_s,
            refilled: Instant::now(),
        }
    }

    /// Takes `bytes` if that many are available.
    fn take(&mut self, bytes: u64) -> bool {
        self.take_at(bytes, Instant::now())
    }

    /// [`Self::take`] at `now` (a test's clock).
    fn take_at(&mut self, bytes: u64, now: Instant) -> bool {
        let earned = (now - self.refilled).as_secs_f64() * self.per_s as f64;
        if earned >= 1.0 {
            self.available = (self.available + earned as u64).min(self.burst);
            self.refilled = now;
        }
        if bytes > self.available {
            return false;
        }
        self.available -= bytes;
        true
    }
}

/// Severity of a guest log line, whichever contract version wrote it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl HostState {
    /// Says how many log lines were dropped, when there were some and the
    /// allowance has room for saying so (else they are counted on).
    pub(crate) fn report_dropped_logs(&mut self) {
        if self.logs_dropped > 0 && self.log_bytes.take(128) {
            let dropped = std::mem::take(&mut self.logs_dropped);
            tracing::warn!(
                policy = &*self.policy,
                dropped,
                "policy log lines over budget were dropped"
            );
        }
    }

    fn log_line(&mut self, level: LogLevel, message: String) {
        let message = guest_text(&message, MAX_LOG_LINE, false);
        if self.log_budget == 0 || !self.log_bytes.take(message.len() as u64) {
            self.logs_dropped += 1;
        } else {
            self.log_budget -= 1;
            let policy = &*self.policy;
            match level {
                LogLevel::Trace => tracing::trace!(policy, "{message}"),
                LogLevel::Debug => tracing::debug!(policy, "{message}"),
                LogLevel::Info => tracing::info!(policy, "{message}"),
                LogLevel::Warn => tracing::warn!(policy, "{message}"),
                LogLevel::Error => tracing::error!(policy, "{message}"),
            }
        }
        // Kept over the budget too: a trap's fault quotes it.
        if level == LogLevel::Error {
            self.last_error_log = Some(message);
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

host_import!(v0_4);
host_import!(v0_3);

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
    /// The shared budget its instances are charged to, besides their own.
    pub(crate) account: Option<Arc<MemoryAccount>>,
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

    /// As [`Self::roles`] says, without building the list: the role drivers ask it on every
    /// call of every generation.
    pub fn has_role(&self, role: Role) -> bool {
        self.manifest
            .roles
            .iter()
            .any(|r| Role::parse(r) == Some(role))
    }

    /// The contract version the component was built against (`"0.4.0"`,
    /// or `"0.3.0"` for one served through the adapter).
    pub fn contract_version(&self) -> &'static str {
        self.roles.version()
    }

    /// A fresh sandboxed instance.
    pub fn instantiate(&self) -> Result<PolicyInstance, PolicyFault> {
        PolicyInstance::wasm(self)
    }

    /// The same policy with every future instance also charged to `account`
    /// (e.g. its tenant's), so one owner's instances share one budget.
    pub fn charged_to(&self, account: Arc<MemoryAccount>) -> CompiledPolicy {
        CompiledPolicy {
            account: Some(account),
            ..self.clone()
        }
    }

    /// Bytes of compiled machine code (and its metadata) this policy holds
    /// in memory while anything refers to it.
    pub fn code_bytes(&self) -> usize {
        let range = self.pre.component().image_range();
        (range.end as usize).saturating_sub(range.start as usize)
    }

    pub fn account(&self) -> Option<&Arc<MemoryAccount>> {
        self.account.as_ref()
    }

    /// Instantiates the policy and configures it with its manifest's default
    /// configuration, each call under the deadline: what every host does
    /// first with a policy, so a component that loops, traps or fails here
    /// cannot work anywhere (`arbiter policy check` runs this).
    pub fn try_default_configuration(&self) -> Result<(), PolicyFault> {
        let mut instance = self.instantiate()?;
        instance.describe()?;
        instance.configure(&self.manifest.default_config)
    }
}

struct EngineInner {
    engine: Engine,
    config: RuntimeConfig,
    compiled: Mutex<CompiledCache>,
    compiles: CompileGate,
    ticker: Arc<Ticker>,
}

/// Compiled components by digest, bounded in bytes of code, least recently
/// used evicted. Only components that passed every check get in, so a
/// refused upload leaves nothing behind.
#[derive(Default)]
struct CompiledCache {
    entries: HashMap<String, (Component, usize, u64)>,
    bytes: usize,
    clock: u64,
}

impl CompiledCache {
    fn get(&mut self, digest: &str) -> Option<Component> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(digest).map(|(c, _, used)| {
            *used = clock;
            c.clone()
        })
    }

    fn insert(&mut self, digest: String, component: Component, limit: usize) {
        let range = component.image_range();
        let size = (range.end as usize).saturating_sub(range.start as usize);
        if size > limit || self.entries.contains_key(&digest) {
            return;
        }
        while self.bytes + size > limit {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(d, _)| d.clone())
            else {
                break;
            };
            if let Some((_, freed, _)) = self.entries.remove(&oldest) {
                self.bytes -= freed;
            }
        }
        self.clock += 1;
        self.bytes += size;
        self.entries.insert(digest, (component, size, self.clock));
    }
}

/// A counting semaphore over compilations.
struct CompileGate {
    running: Mutex<usize>,
    freed: Condvar,
    max: usize,
}

impl CompileGate {
    fn enter(&self) -> CompileTurn<'_> {
        let mut running = self.running.lock();
        while *running >= self.max {
            self.freed.wait(&mut running);
        }
        *running += 1;
        CompileTurn(self)
    }
}

struct CompileTurn<'a>(&'a CompileGate);

impl Drop for CompileTurn<'_> {
    fn drop(&mut self) {
        *self.0.running.lock() -= 1;
        self.0.freed.notify_one();
    }
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
            cache_config
                .with_directory(dir)
                .with_files_total_size_soft_limit(config.disk_cache_bytes);
            cfg.cache(Some(wasmtime::Cache::new(cache_config)?));
        }
        let engine = Engine::new(&cfg)?;
        let ticker = Ticker::start(&engine, config.epoch_tick)?;
        Ok(PolicyEngine {
            inner: Arc::new(EngineInner {
                engine,
                compiled: Mutex::new(CompiledCache::default()),
                compiles: CompileGate {
                    running: Mutex::new(0),
                    freed: Condvar::new(),
                    max: config.max_parallel_compiles.max(1),
                },
                config,
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

    /// Compiled components held in memory, and their bytes of code.
    pub fn cached_components(&self) -> (usize, usize) {
        let cache = self.inner.compiled.lock();
        (cache.entries.len(), cache.bytes)
    }

    /// A store with this engine's sandbox limits.
    pub(crate) fn new_store(
        &self,
        policy: Arc<str>,
        account: Option<Arc<MemoryAccount>>,
    ) -> wasmtime::Store<HostState> {
        let state = HostState {
            limits: SandboxLimiter::new(self.inner.config.memory_limit, account),
            policy,
            now_ms: 0,
            log_budget: self.inner.config.max_log_lines,
            log_bytes: LogAllowance::new(
                u64::from(self.inner.config.max_log_lines) * MAX_LOG_LINE as u64,
                self.inner.config.log_bytes_per_s,
            ),
            logs_dropped: 0,
            last_error_log: None,
        };
        let mut store = wasmtime::Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_hostcall_fuel(self.inner.config.max_answer_bytes);
        store
    }

    /// Checks, compiles, links and describes a policy component.
    pub fn compile(&self, wasm: &[u8]) -> Result<CompiledPolicy, PolicyFault> {
        let refused = |e| PolicyFault::Abi(format!("refused before compiling: {e}"));
        self.inner
            .config
            .compile_limits
            .check_size(wasm.len())
            .map_err(refused)?;
        let inspection = inspect_component(wasm).map_err(|e| PolicyFault::Abi(e.to_string()))?;
        self.inner
            .config
            .compile_limits
            .check(inspection.size_bytes, &inspection.code)
            .map_err(refused)?;
        // The pooling allocator would refuse it at every instantiation, in its own words;
        // say it once, in the sandbox's, before compiling anything.
        let memory_cap = self.inner.config.memory_limit as u64;
        if inspection.code.largest_memory_minimum > memory_cap {
            return Err(PolicyFault::Abi(format!(
                "refused before compiling: a core module declares a linear memory of {} bytes \
                 at start, over the sandbox's memory cap of {memory_cap} bytes, so it could \
                 never be instantiated",
                inspection.code.largest_memory_minimum
            )));
        }
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
        let cached = self.inner.compiled.lock().get(&digest);
        let fresh = cached.is_none();
        let component = match cached {
            Some(c) => c,
            None => {
                let _turn = self.inner.compiles.enter();
                Component::new(&self.inner.engine, wasm).map_err(|e| {
                    PolicyFault::Abi(guest_text(
                        &format!("compiling component: {e:#}"),
                        MAX_ERROR_TEXT,
                        false,
                    ))
                })?
            }
        };
        self.check_host_imports(&component, &inspection)?;
        let mut linker: Linker<HostState> = Linker::new(&self.inner.engine);
        v0_4::arbiter::policy::host::add_to_linker::<
            HostState,
            wasmtime::component::HasSelf<HostState>,
        >(&mut linker, |s| s)
        .and_then(|()| {
            v0_3::arbiter::policy::host::add_to_linker::<
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
            account: None,
        };
        let mut instance = compiled.instantiate()?;
        let manifest = instance.describe()?;
        compiled.manifest = check_manifest(manifest, &compiled.roles)?;
        if fresh {
            self.inner.compiled.lock().insert(
                compiled.digest.clone(),
                component,
                self.inner.config.compiled_cache_bytes,
            );
        }
        Ok(compiled)
    }

    /// Every function the component imports from an interface the host
    /// implements must be one the host provides: nothing there is stubbed.
    fn check_host_imports(
        &self,
        component: &Component,
        inspection: &Inspection,
    ) -> Result<(), PolicyFault> {
        let engine = &self.inner.engine;
        let ty = component.component_type();
        for (name, class) in &inspection.imports {
            if !matches!(class, ImportClass::Host | ImportClass::FixedSeed) {
                continue;
            }
            let interface = name.split('@').next().unwrap_or(name);
            let provided = HOST_FUNCTIONS
                .iter()
                .find(|(i, _)| *i == interface)
                .map_or(&[][..], |(_, f)| *f);
            let Some(import) = ty.get_import(engine, name) else {
                continue;
            };
            let ComponentItem::ComponentInstance(instance) = import.ty else {
                return Err(PolicyFault::Abi(format!(
                    "imports `{name}` as something other than an interface"
                )));
            };
            for (function, item) in instance.exports(engine) {
                let is_function = matches!(item.ty, ComponentItem::ComponentFunc(_));
                if is_function && !provided.contains(&function) {
                    return Err(PolicyFault::Abi(format!(
                        "imports `{}` from `{name}`, which the host does not provide (it provides: {})",
                        guest_text(function, MAX_NAME_TEXT, false),
                        provided.join(", ")
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A manifest the host can show and trust: a short printable name and
/// version, known roles each exported, a bounded default configuration; the
/// description is cut and escaped (see [`guest_text`]).
fn check_manifest(
    mut manifest: Manifest,
    roles: &ContractIndices,
) -> Result<Manifest, PolicyFault> {
    let shown = |s: &str| guest_text(s, MAX_NAME_TEXT, false);
    if manifest.name.trim().is_empty() {
        return Err(PolicyFault::BadAnswer("manifest has an empty name".into()));
    }
    for (field, value) in [("name", &manifest.name), ("version", &manifest.version)] {
        if value.len() > MAX_NAME_TEXT || !is_plain(value) {
            return Err(PolicyFault::BadAnswer(format!(
                "manifest {field} `{}` must be at most {MAX_NAME_TEXT} bytes of printable text",
                shown(value)
            )));
        }
    }
    if manifest.roles.is_empty() {
        return Err(PolicyFault::BadAnswer("manifest declares no roles".into()));
    }
    if manifest.roles.len() > MAX_ROLES {
        return Err(PolicyFault::BadAnswer(format!(
            "manifest declares {} roles; the contract has five",
            manifest.roles.len()
        )));
    }
    if manifest.default_config.len() > MAX_DEFAULT_CONFIG {
        return Err(PolicyFault::BadAnswer(format!(
            "manifest default configuration is {} bytes, the limit is {MAX_DEFAULT_CONFIG}",
            manifest.default_config.len()
        )));
    }
    if guest_text(&manifest.default_config, usize::MAX, true) != manifest.default_config {
        return Err(PolicyFault::BadAnswer(
            "manifest default configuration holds control characters".into(),
        ));
    }
    manifest.description = guest_text(&manifest.description, MAX_DESCRIPTION, true);
    for name in &manifest.roles {
        let role = Role::parse(name).ok_or_else(|| {
            PolicyFault::BadAnswer(format!("manifest declares unknown role `{}`", shown(name)))
        })?;
        let exported = roles.exports(role);
        if !exported {
            return Err(PolicyFault::Abi(format!(
                "manifest declares role `{role}` but the component does not export it"
            )));
        }
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::LogAllowance;
    use std::time::Duration;

    #[test]
    fn the_log_allowance_gives_a_burst_then_only_what_time_earns() {
        let mut allowance = LogAllowance::new(1_000, 10_000);
        let t0 = allowance.refilled;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(allowance.take_at(600, at(0)));
        assert!(!allowance.take_at(600, at(0)), "the burst is spent");
        assert!(allowance.take_at(400, at(0)));
        // 60 ms at 10 kB/s earned 600 bytes.
        assert!(!allowance.take_at(601, at(60)));
        assert!(allowance.take_at(600, at(60)));
        // A long pause refills to the burst, never past it.
        assert!(
            !allowance.take_at(1_001, at(10_000)),
            "refills stop at the burst"
        );
        assert!(allowance.take_at(1_000, at(10_000)));
        assert!(allowance.take(0), "the wall clock's take is the same rule");
    }
}
