//! The node's watched policy directory (`arbiter node --policies-dir DIR`): drop a compiled
//! `coordinator.wasm` (and, beside it, its configuration `coordinator.toml`) into `DIR` and it
//! becomes the node's coordinator policy from the next control period; replace either file and
//! the new version takes over; remove the component and the node goes back to the policy it
//! started with (`--policy`), or to the native fallback that never acts.
//!
//! The directory is the host core's [`PolicyDirectory`] (one rule for reading, hashing,
//! retrying and reporting policy files, shared with `policies.d/` and `arbiter serve
//! --policies-dir`); this module is only its target: [`NodePolicies`] loads into the
//! coordinator's one slot ([`Coordinator::slot`]). A swap happens on the watcher's thread
//! between two control periods — the slot is built for that, as the host's round loop is —
//! and is compiled there, off the control loop. What cannot load (not a component, not a
//! `coordinator`, a configuration it refuses, a file of another name) is said once and the
//! running policy stays. A dropped policy that loads but keeps faulting is retired by the
//! host core's rule, and the policy it replaced (kept by the slot as its fallback) serves
//! again until the file changes.
//!
//! [`PolicyDirectory`]: arbiter_host::watch::PolicyDirectory

use crate::coordinator::{Coordinator, CoordinatorError, install};
use anyhow::Context;
use arbiter_host::registry::{PolicyCode, PolicySlot};
use arbiter_host::runtime::{CompiledPolicy, PolicyEngine};
use arbiter_host::watch::{LoadError, PolicyTarget};
use std::path::Path;
use std::sync::Arc;

/// The one file name a node loads: a node runs one coordinator policy.
pub const COORDINATOR_FILE: &str = "coordinator.wasm";

/// How often the directory is read again when no file-system event came.
pub const POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// Loads a node's watched directory into its coordinator's slot.
pub struct NodePolicies {
    slot: Arc<PolicySlot>,
    engine: PolicyEngine,
    /// The policy the node started with, restored when `coordinator.wasm` goes.
    initial: Option<(CompiledPolicy, Option<String>)>,
}

impl NodePolicies {
    /// A target for `coordinator`'s slot, compiling with `engine` (sized for node policies:
    /// [`crate::coordinator::CoordinatorConfig::runtime_config`]); `initial` is the policy
    /// the coordinator was built with, if any.
    pub fn new(
        coordinator: &Coordinator,
        engine: PolicyEngine,
        initial: Option<(CompiledPolicy, Option<String>)>,
    ) -> NodePolicies {
        NodePolicies {
            slot: coordinator.slot(),
            engine,
            initial,
        }
    }

    /// The name of the policy the slot serves now, or `None` when only its native
    /// fallback (which never acts) is left.
    pub fn serving(&self) -> Option<String> {
        self.slot.active().map(|g| g.manifest().name.clone())
    }
}

fn load_error(e: CoordinatorError) -> LoadError {
    LoadError::File(anyhow::Error::new(e))
}

impl PolicyTarget for NodePolicies {
    fn load(
        &self,
        file: &Path,
        wasm: &[u8],
        config: Option<String>,
    ) -> Result<(String, u64), LoadError> {
        if file.file_name().is_none_or(|n| n != COORDINATOR_FILE) {
            return Err(LoadError::File(anyhow::anyhow!(
                "a node runs one policy, from `{COORDINATOR_FILE}`; this file is not loaded"
            )));
        }
        let compiled = self.engine.compile(wasm).map_err(|fault| {
            load_error(CoordinatorError::Load {
                name: file.display().to_string(),
                fault,
            })
        })?;
        let (_, generation) = install(
            &self.slot,
            PolicyCode::from(compiled),
            config.as_deref().filter(|c| !c.is_empty()),
        )
        .map_err(load_error)?;
        Ok((self.slot.name().to_string(), generation))
    }

    /// The file is gone: the slot goes back to exactly the node's own policy (a fresh
    /// generation of it), or to nothing (the native fallback). Every other generation
    /// leaves the slot — the one the file loaded, and the one it replaced, which the slot
    /// kept as its fallback — so nothing the directory held serves any more.
    fn unload(&self, _slot: &str, _generation: u64) -> anyhow::Result<()> {
        let own = match &self.initial {
            Some((compiled, config)) => Some(
                install(
                    &self.slot,
                    PolicyCode::from(compiled.clone()),
                    config.as_deref(),
                )
                .context("restoring the node's own policy")?
                .1,
            ),
            None => None,
        };
        for generation in self.slot.generations() {
            if Some(generation.id) != own {
                self.slot
                    .unload(generation.id)
                    .context("unloading the coordinator policy")?;
            }
        }
        Ok(())
    }
}
