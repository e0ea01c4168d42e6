//! A watched policy directory (`policies.d/`): drop a `.wasm` in and it
//! loads (a hot swap into the slot its manifest names); replace it and the
//! new version becomes a new generation; remove it and its generations unload.
//!
//! The watcher does not trust individual file-system events: any event (or a
//! slow poll, in case events are lost) triggers [`PolicyDirectory::reconcile`],
//! which compares the directory with what is loaded by content hash. That is
//! idempotent, so duplicate or coalesced events are harmless, and a file
//! caught half-written simply fails to load and is retried on the next event.
//! A `NAME.toml` beside `NAME.wasm` is that policy's configuration: editing,
//! adding or removing it loads a new generation as replacing the component
//! does (a configuration the policy refuses is reported and the running
//! generation stays).
//!
//! Only regular files are read, each with a bound. A file that cannot be read
//! (too large, a permission, a FIFO, a configuration that is not UTF-8) is
//! reported once per distinct error and keeps whatever its policy loaded;
//! only a component that is gone unloads.

use crate::registry::Registry;
use notify::{RecursiveMode, Watcher};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// What one reconciliation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// (file, slot, generation) loaded.
    pub loaded: Vec<(PathBuf, String, u64)>,
    /// (file, slot, generation) unloaded.
    pub unloaded: Vec<(PathBuf, String, u64)>,
    /// (file, error) that failed to load, or whose generation could not be
    /// unloaded when the file went.
    pub failed: Vec<(PathBuf, String)>,
}

/// Why a policy file did not load.
#[derive(Debug)]
pub enum LoadError {
    /// What the file holds cannot load (it does not compile, lacks the slot's
    /// role, its configuration is refused): tried again when the file changes.
    File(anyhow::Error),
    /// The target cannot take it now (a tenant that does not exist yet, an
    /// experiment in the way): tried again at every reconcile, said once.
    NotNow(anyhow::Error),
}

/// Where a policy directory's files load: the host core's [`Registry`] (the slot
/// a component's manifest names), a control plane that also stores what loads
/// and names slots its own way (`arbiter serve --policies-dir`), or a node's
/// coordinator slot (`arbiter node --policies-dir`).
pub trait PolicyTarget: Send + Sync {
    /// Loads `wasm`, read from `file`, with `config` (`None`: the policy's
    /// default) as the active generation of a slot; returns the slot and the
    /// generation.
    fn load(
        &self,
        file: &Path,
        wasm: &[u8],
        config: Option<String>,
    ) -> Result<(String, u64), LoadError>;

    /// Unloads a generation whose file is gone (or that moved slots).
    fn unload(&self, slot: &str, generation: u64) -> anyhow::Result<()>;

    /// The generation already serving what `file` holds (the component's
    /// digest, its configuration), if there is one: a restarted host that kept
    /// its slots adopts it instead of loading a copy.
    fn serving(&self, _file: &Path, _wasm_digest: &str, _config: &str) -> Option<(String, u64)> {
        None
    }
}

impl PolicyTarget for Registry {
    fn load(
        &self,
        file: &Path,
        wasm: &[u8],
        config: Option<String>,
    ) -> Result<(String, u64), LoadError> {
        let (slot, generation) = self
            .load_bytes(wasm, config, Some(file.to_path_buf()), None)
            .map_err(|e| LoadError::File(e.into()))?;
        Ok((slot.name().to_string(), generation.id))
    }

    fn unload(&self, slot: &str, generation: u64) -> anyhow::Result<()> {
        if let Some(slot) = self.find(slot) {
            slot.unload(generation)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
struct Loaded {
    digest: String,
    slot: String,
    generation: u64,
}

/// A policy's files: `NAME.wasm` and its configuration, `NAME.toml`, when there is
/// one. A configuration that is there but cannot be read makes the policy unreadable:
/// loading it with its default configuration instead would run something the operator
/// did not write.
fn read_policy_files(wasm: &Path) -> anyhow::Result<(Vec<u8>, Option<String>)> {
    let bytes = crate::files::read_component_file(wasm)?;
    let config = match crate::files::read_config_file(&wasm.with_extension("toml")) {
        Ok(text) => Some(text),
        Err(e) if crate::files::is_not_found(&e) => None,
        Err(e) => return Err(e),
    };
    Ok((bytes, config))
}

/// What a policy's files hold, so that a change to either — the component or its
/// configuration — loads a new generation.
fn digest(wasm_digest: &[u8], config: Option<&str>) -> String {
    let mut hash = Sha256::new();
    hash.update(wasm_digest);
    match config {
        Some(text) => {
            hash.update([1]);
            hash.update(text.as_bytes());
        }
        None => hash.update([0]),
    }
    hex::encode(hash.finalize())
}

/// A policy directory kept in sync with a [`PolicyTarget`].
pub struct PolicyDirectory {
    dir: PathBuf,
    target: Arc<dyn PolicyTarget>,
    loaded: Mutex<BTreeMap<PathBuf, Loaded>>,
    /// Digests that failed, so a broken file is not recompiled on every poll.
    failed: Mutex<BTreeMap<PathBuf, String>>,
    /// Files that could not be read, with the error: read again at every
    /// reconcile (reading is cheap), reported again only when the error changes.
    unreadable: Mutex<BTreeMap<PathBuf, String>>,
    /// Files the target could not take yet ([`LoadError::NotNow`]), with the
    /// error: tried at every reconcile, reported again only when it changes.
    waiting: Mutex<BTreeMap<PathBuf, String>>,
}

impl PolicyDirectory {
    pub fn new(dir: impl Into<PathBuf>, target: Arc<dyn PolicyTarget>) -> Self {
        PolicyDirectory {
            dir: dir.into(),
            target,
            loaded: Mutex::new(BTreeMap::new()),
            failed: Mutex::new(BTreeMap::new()),
            unreadable: Mutex::new(BTreeMap::new()),
            waiting: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Brings the registry in line with the directory's `.wasm` files.
    pub fn reconcile(&self) -> Reconciled {
        let mut out = Reconciled::default();
        let mut present = BTreeMap::new();
        let mut unreadable = BTreeMap::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    let path = entry.path();
                    if path.extension().is_some_and(|e| e == "wasm") {
                        match read_policy_files(&path) {
                            Ok(files) => {
                                present.insert(path, files);
                            }
                            // Removed since the directory was listed: gone, not unreadable.
                            Err(e) if crate::files::is_not_found(&e) => {}
                            Err(e) => {
                                unreadable.insert(path, format!("{e:#}"));
                            }
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read policy directory");
                return out;
            }
        }
        // A file that cannot be read now (too large, a permission changed mid-copy) keeps
        // what it loaded: only a file that is gone unloads.
        let kept: Vec<PathBuf> = unreadable.keys().cloned().collect();
        {
            let mut reported = self.unreadable.lock();
            for (path, error) in &unreadable {
                if reported.get(path) != Some(error) {
                    tracing::warn!(file = %path.display(), %error, "policy file cannot be read");
                    out.failed.push((path.clone(), error.clone()));
                }
            }
            *reported = unreadable;
        }
        let mut loaded = self.loaded.lock();
        let gone: Vec<PathBuf> = loaded
            .keys()
            .filter(|p| !present.contains_key(*p) && !kept.contains(p))
            .cloned()
            .collect();
        for path in gone {
            if let Some(l) = loaded.remove(&path) {
                // Refused (a control plane keeps its `default` slot's active
                // generation): said once; the file is forgotten either way.
                if let Err(e) = self.target.unload(&l.slot, l.generation) {
                    let error = format!("{e:#}");
                    tracing::warn!(file = %path.display(), slot = %l.slot, generation = l.generation, %error, "the generation of a removed policy file stays loaded");
                    out.failed.push((path, error));
                    continue;
                }
                tracing::info!(file = %path.display(), slot = %l.slot, generation = l.generation, "policy unloaded");
                out.unloaded.push((path, l.slot, l.generation));
            }
        }
        let mut failed = self.failed.lock();
        failed.retain(|p, _| present.contains_key(p));
        let mut waiting = self.waiting.lock();
        let mut still_waiting = BTreeMap::new();
        for (path, (bytes, config)) in present {
            // The component is hashed once: for the change test and, the first time
            // a file is seen, for the adoption test.
            let wasm_digest = Sha256::digest(&bytes);
            let digest = digest(&wasm_digest, config.as_deref());
            if loaded.get(&path).is_some_and(|l| l.digest == digest)
                || failed.get(&path) == Some(&digest)
            {
                continue;
            }
            if let Entry::Vacant(first_seen) = loaded.entry(path.clone()) {
                let config_text = config.as_deref().unwrap_or_default();
                if let Some((slot, generation)) =
                    self.target
                        .serving(&path, &hex::encode(wasm_digest), config_text)
                {
                    tracing::info!(file = %path.display(), %slot, generation, "policy file already serving");
                    first_seen.insert(Loaded {
                        digest,
                        slot,
                        generation,
                    });
                    continue;
                }
            }
            match self.target.load(&path, &bytes, config) {
                Ok((slot, generation)) => {
                    if let Some(previous) = loaded.insert(
                        path.clone(),
                        Loaded {
                            digest,
                            slot: slot.clone(),
                            generation,
                        },
                    ) && previous.slot != slot
                    {
                        // The file's previous version stays loaded as an older
                        // generation (a rollback target) unless it moved slots.
                        if let Err(e) = self.target.unload(&previous.slot, previous.generation) {
                            tracing::warn!(file = %path.display(), slot = %previous.slot, generation = previous.generation, error = %format!("{e:#}"), "the previous generation stays loaded");
                        }
                    }
                    failed.remove(&path);
                    tracing::info!(file = %path.display(), %slot, generation, "policy loaded");
                    out.loaded.push((path, slot, generation));
                }
                Err(LoadError::File(e)) => {
                    let error = format!("{e:#}");
                    tracing::warn!(file = %path.display(), %error, "policy file failed to load");
                    failed.insert(path.clone(), digest);
                    out.failed.push((path, error));
                }
                Err(LoadError::NotNow(e)) => {
                    let error = format!("{e:#}");
                    if waiting.get(&path) != Some(&error) {
                        tracing::warn!(file = %path.display(), %error, "policy file cannot load yet; trying again");
                        out.failed.push((path.clone(), error.clone()));
                    }
                    still_waiting.insert(path, error);
                }
            }
        }
        *waiting = still_waiting;
        out
    }

    /// Reconciles now, then watches the directory on a background thread
    /// until the returned guard is dropped.
    pub fn watch(self: Arc<Self>, poll: Duration) -> anyhow::Result<WatchGuard> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            anyhow::anyhow!("creating policy directory {}: {e}", self.dir.display())
        })?;
        self.reconcile();
        let (tx, rx) = mpsc::channel::<()>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    let _ = tx.send(());
                }
            })?;
        watcher.watch(&self.dir, RecursiveMode::NonRecursive)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_thread = stop.clone();
        let dir = self.clone();
        let thread = std::thread::Builder::new()
            .name("arbiter-policies-d".into())
            .spawn(move || {
                while !stop_thread.load(Ordering::Relaxed) {
                    match rx.recv_timeout(poll) {
                        Ok(()) => {
                            // Let a burst of events (a copy in progress) settle.
                            std::thread::sleep(Duration::from_millis(50));
                            while rx.try_recv().is_ok() {}
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                    if !stop_thread.load(Ordering::Relaxed) {
                        dir.reconcile();
                    }
                }
            })?;
        Ok(WatchGuard {
            watcher: Some(watcher),
            stop,
            thread: Some(thread),
        })
    }
}

/// Keeps a directory watched; stops the watcher thread on drop.
pub struct WatchGuard {
    watcher: Option<notify::RecommendedWatcher>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the watcher closes the event channel, waking the thread at once.
        self.watcher.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
