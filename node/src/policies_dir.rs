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
//! running policy stays.
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
        install(
            &self.slot,
            PolicyCode::from(compiled),
            config.as_deref().filter(|c| !c.is_empty()),
        )
        .map_err(load_error)?;
        let generation = self
            .slot
            .active_id()
            .context("the slot has no active generation right after a load")
            .map_err(LoadError::File)?;
        Ok((self.slot.name().to_string(), generation))
    }

    fn unload(&self, _slot: &str, generation: u64) -> anyhow::Result<()> {
        // Replaced since (the slot keeps one generation): nothing of the file is left.
        if self.slot.active_id() != Some(generation) {
            return Ok(());
        }
        match &self.initial {
            Some((compiled, config)) => {
                install(
                    &self.slot,
                    PolicyCode::from(compiled.clone()),
                    config.as_deref(),
                )
                .context("restoring the node's own policy")?;
            }
            None => self
                .slot
                .unload(generation)
                .context("unloading the coordinator policy")?,
        }
        Ok(())
    }
}
