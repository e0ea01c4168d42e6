//! `arbiter serve --policies-dir DIR`: a watched directory
//! ([`arbiter_host::watch::PolicyDirectory`]) whose files load through the plane,
//! exactly as an admin's `policy load` does — compiled off the plane's lock, held
//! to the slot's role and the tenant's budgets, stored (so a restart keeps them)
//! and published.
//!
//! The file names the slot: `NAME.wasm` loads into slot `NAME` as its active
//! generation — `default.wasm` schedules the cluster, `reclaim.wasm` and
//! `matcher.wasm` fill those roles, `tenant:acme.wasm` orders tenant `acme`'s
//! queue, any other name is a slot an experiment can use — and `NAME.toml` is
//! its configuration. A file the plane cannot take *yet* (`tenant:acme.wasm`
//! before `arbiter tenant add acme`, `default.wasm` while an experiment runs)
//! is tried again at every poll; one it refuses for what it is is tried again
//! when it changes. Replacing either loads a new generation (the previous one
//! stays, a rollback target); removing the component unloads its generation
//! unless the plane refuses — `default`'s active one, a running experiment's
//! candidate — which is said in the log. A
//! restarted plane whose slot already runs what a file holds adopts that
//! generation instead of loading a copy.

use crate::plane::{ApiError, Caller, Plane};
use anyhow::Context;
use arbiter_host::registry::Registry;
use arbiter_host::watch::{LoadError, PolicyDirectory, PolicyTarget, WatchGuard};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// How often the directory is read even without a file event (events can be
/// lost, e.g. on network file systems).
const POLL: Duration = Duration::from_secs(2);

/// The plane as a [`PolicyTarget`]. Its calls block: they run on the
/// directory's own thread, never on the async runtime.
pub struct PlaneTarget {
    plane: Arc<Mutex<Plane>>,
    registry: Arc<Registry>,
}

impl PlaneTarget {
    pub fn new(plane: Arc<Mutex<Plane>>, registry: Arc<Registry>) -> PlaneTarget {
        PlaneTarget { plane, registry }
    }

    fn write<T>(&self, write: impl FnOnce(&mut Plane) -> T) -> T {
        let mut plane = self.plane.blocking_lock();
        let out = write(&mut plane);
        plane.publish();
        out
    }
}

/// The slot a file loads into: its name without `.wasm`.
pub fn slot_of(file: &Path) -> anyhow::Result<String> {
    file.file_stem()
        .and_then(|stem| stem.to_str())
        .map(str::to_string)
        .with_context(|| format!("{}: a slot is named by UTF-8 text", file.display()))
}

impl PolicyTarget for PlaneTarget {
    fn load(
        &self,
        file: &Path,
        wasm: &[u8],
        config: Option<String>,
    ) -> Result<(String, u64), LoadError> {
        let slot = slot_of(file).map_err(LoadError::File)?;
        let compiled =
            Plane::compile(&self.registry, wasm).map_err(|e| LoadError::File(e.into()))?;
        let config = config.unwrap_or_default();
        let (loaded, ack) = self
            .write(|p| p.upload(&Caller::Admin, &slot, compiled, wasm, &config, true))
            .map_err(|e| match e {
                // A tenant not added yet, an experiment running, a store
                // write that failed: the plane may take it later.
                ApiError::NotFound(_) | ApiError::FailedPrecondition(_) | ApiError::Internal(_) => {
                    LoadError::NotNow(e.into())
                }
                _ => LoadError::File(e.into()),
            })?;
        ack.wait().map_err(LoadError::NotNow)?;
        Ok((loaded.slot, loaded.generation))
    }

    fn unload(&self, slot: &str, generation: u64) -> anyhow::Result<()> {
        let ack = self.write(|p| p.unload(&Caller::Admin, slot, generation))?;
        ack.wait()
    }

    fn serving(&self, file: &Path, wasm_digest: &str, config: &str) -> Option<(String, u64)> {
        let slot = slot_of(file).ok()?;
        let active = self.registry.find(&slot)?.active()?;
        (active.digest() == wasm_digest && active.config == config).then_some((slot, active.id))
    }
}

/// Loads what `dir` holds now (blocking), then follows it until the guard is
/// dropped. Call it off the async runtime.
pub fn watch(plane: Arc<Mutex<Plane>>, dir: &Path) -> anyhow::Result<WatchGuard> {
    let registry = plane.blocking_lock().registry();
    let target = Arc::new(PlaneTarget::new(plane, registry));
    Arc::new(PolicyDirectory::new(dir, target))
        .watch(POLL)
        .with_context(|| format!("watching the policy directory {}", dir.display()))
}
