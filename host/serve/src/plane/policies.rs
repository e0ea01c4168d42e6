//! Policy slots: uploads, generations, swaps and rollbacks, per-slot statistics.

use super::*;

impl Plane {
    /// Compiles a component: slow, so callers do it without holding the plane.
    pub fn compile(registry: &Registry, wasm: &[u8]) -> Result<CompiledPolicy, ApiError> {
        if wasm.len() > MAX_UPLOAD {
            return Err(ApiError::InvalidArgument(format!(
                "component is {} bytes, over the {MAX_UPLOAD}-byte upload limit: refused before compiling",
                wasm.len()
            )));
        }
        registry
            .engine()
            .compile(wasm)
            .map_err(|e| ApiError::InvalidArgument(format!("not a loadable policy component: {e}")))
    }

    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// Loads a compiled component into a slot (tenants: only their own).
    pub fn upload(
        &mut self,
        caller: &Caller,
        slot: &str,
        compiled: CompiledPolicy,
        wasm: &[u8],
        config: &str,
        activate: bool,
    ) -> Result<(Loaded, Ack), ApiError> {
        let slot = match (caller, slot) {
            (Caller::Tenant(t), "") => tenant_slot(t),
            // A pure matcher or reclaim policy has one place to go.
            (Caller::Admin, "") => ROLE_SLOTS
                .iter()
                .find(|(_, role, _)| {
                    compiled.has_role(*role) && !compiled.has_role(Role::Scheduler)
                })
                .map_or_else(|| compiled.manifest.name.clone(), |(s, ..)| s.to_string()),
            (_, s) => s.to_string(),
        };
        check_label("slot", &slot)?;
        check_slot_access(caller, &slot)?;
        let tenant = slot_tenant(&slot);
        if let Some(tenant) = tenant
            && !self.tenants.contains_key(tenant)
        {
            return Err(ApiError::NotFound(format!("no tenant `{tenant}`")));
        }
        // Every slot takes one role: a tenant's, a role slot's, else scheduling.
        let (needed, purpose) = if tenant.is_some() {
            (Role::Tenant, "orders its tenant's queue")
        } else if let Some((_, role, purpose)) = ROLE_SLOTS.iter().find(|(s, ..)| *s == slot) {
            (*role, *purpose)
        } else {
            (Role::Scheduler, "schedules")
        };
        if !compiled.has_role(needed) {
            return Err(ApiError::InvalidArgument(format!(
                "slot `{slot}` {purpose}; `{}` does not implement the `{}` role (it implements {:?})",
                compiled.manifest.name,
                needed.as_str(),
                compiled.manifest.roles
            )));
        }
        if let Some(tenant) = tenant {
            self.check_tenant_code(tenant, &slot, &compiled)?;
        }
        if slot == DEFAULT_SLOT && self.experiment.is_some() && activate {
            return Err(ApiError::FailedPrecondition(
                "an experiment is running; promote or abort it before swapping the default policy"
                    .into(),
            ));
        }
        let compiled = self.charge_owner(&slot, compiled);
        if !config.is_empty() {
            // Try the configuration on a throwaway instance before accepting it.
            let mut probe = compiled
                .instantiate()
                .map_err(|e| ApiError::InvalidArgument(format!("instantiating: {e}")))?;
            probe
                .configure(config)
                .map_err(|e| ApiError::InvalidArgument(format!("configuration refused: {e}")))?;
        }
        let (generation, ack) =
            self.load_generation(&slot, compiled, wasm, config.to_string(), activate)?;
        Ok((
            Loaded {
                slot,
                generation: generation.id,
            },
            ack,
        ))
    }

    pub(super) fn load_generation(
        &mut self,
        slot_name: &str,
        compiled: CompiledPolicy,
        wasm: &[u8],
        config: String,
        activate: bool,
    ) -> Result<(Arc<Generation>, Ack), ApiError> {
        let digest = compiled.digest.clone();
        let slot = self.registry.slot(slot_name);
        let held_before: Vec<String> = slot
            .generations()
            .iter()
            .map(|g| g.digest().to_string())
            .collect();
        let generation = slot
            .load(
                compiled,
                (!config.is_empty()).then(|| config.clone()),
                None,
                None,
            )
            .map_err(|e| ApiError::InvalidArgument(format!("loading into `{slot_name}`: {e}")))?;
        if activate {
            slot.activate(generation.id).map_err(internal)?;
        }
        let mut writes = vec![
            Write::Put(format!("blob/{digest}"), wasm.to_vec()),
            self.slot_write(&slot)?,
        ];
        // A generation the slot pruned takes its component with it.
        writes.extend(self.unused_blobs(held_before));
        let ack = self.writer.send_durable(writes);
        Ok((generation, ack))
    }

    /// Deletes of the stored components among `digests` that no generation
    /// (of any slot) runs any more.
    fn unused_blobs(&self, digests: impl IntoIterator<Item = String>) -> Vec<Write> {
        let held_now = self.digests_in_use();
        let mut unused: Vec<String> = digests
            .into_iter()
            .filter(|d| !held_now.contains(d))
            .collect();
        unused.sort();
        unused.dedup();
        unused
            .into_iter()
            .map(|d| Write::Delete(format!("blob/{d}")))
            .collect()
    }

    pub(super) fn digests_in_use(&self) -> HashSet<String> {
        self.registry
            .slots()
            .iter()
            .flat_map(|s| s.generations())
            .map(|g| g.digest().to_string())
            .collect()
    }

    /// Refuses a component whose compiled code would take the tenant's slot
    /// over `tenant_code_bytes`, counting what the slot keeps once this one
    /// is loaded (the oldest inactive generation leaves a full slot) and
    /// each distinct component once.
    pub(super) fn check_tenant_code(
        &self,
        tenant: &str,
        slot_name: &str,
        compiled: &CompiledPolicy,
    ) -> Result<(), ApiError> {
        let mut kept: Vec<(String, usize)> = Vec::new();
        if let Some(slot) = self.registry.find(slot_name) {
            let mut generations = slot.generations();
            if generations.len() >= slot.max_generations() {
                let active = slot.active_id();
                if let Some(oldest) = generations.iter().position(|g| Some(g.id) != active) {
                    generations.remove(oldest);
                }
            }
            for g in generations {
                if let Some(c) = g.compiled() {
                    kept.push((c.digest.clone(), c.code_bytes()));
                }
            }
        }
        kept.push((compiled.digest.clone(), compiled.code_bytes()));
        kept.sort();
        kept.dedup_by(|a, b| a.0 == b.0);
        let held: usize = kept.iter().map(|(_, bytes)| bytes).sum();
        let limit = self.cfg.tenant_code_bytes;
        if held > limit {
            return Err(ApiError::FailedPrecondition(format!(
                "tenant `{tenant}`'s policies would hold {held} bytes of compiled code with this one ({} bytes), over the tenant's {limit}; older generations leave the slot as new ones arrive",
                compiled.code_bytes()
            )));
        }
        Ok(())
    }

    /// A tenant's policies are charged to the tenant's memory account, so
    /// all its generations together stay within `tenant_memory_bytes`.
    pub(super) fn charge_owner(&mut self, slot: &str, compiled: CompiledPolicy) -> CompiledPolicy {
        let Some(tenant) = slot_tenant(slot) else {
            return compiled;
        };
        let limit = self.cfg.tenant_memory_bytes;
        let account = self
            .tenant_memory
            .entry(tenant.to_string())
            .or_insert_with(|| MemoryAccount::new(format!("tenant:{tenant}"), limit));
        compiled.charged_to(Arc::clone(account))
    }

    /// The slot as persisted: generations in load order, by digest.
    pub(super) fn slot_write(&self, slot: &PolicySlot) -> Result<Write, ApiError> {
        let generations = slot.generations();
        let active = slot.active_id();
        let record = SlotRecord {
            active: generations.iter().position(|g| Some(g.id) == active),
            generations: generations
                .iter()
                .map(|g| GenerationRecord {
                    id: g.id,
                    digest: g.digest().to_string(),
                    config: g.config.clone(),
                })
                .collect(),
        };
        Ok(Write::Put(
            format!("slot/{}", slot.name()),
            serde_json::to_vec(&record).map_err(internal)?,
        ))
    }

    pub(super) fn find_slot(
        &self,
        caller: &Caller,
        slot: &str,
    ) -> Result<Arc<PolicySlot>, ApiError> {
        check_slot_access(caller, slot)?;
        self.registry
            .find(slot)
            .ok_or_else(|| ApiError::NotFound(format!("no policy slot `{slot}`")))
    }

    fn generation_view(&self, slot: &str, g: &Generation) -> views::GenerationView {
        let active = self
            .registry
            .find(slot)
            .and_then(|s| s.active_id())
            .is_some_and(|id| id == g.id);
        views::GenerationView {
            id: g.id,
            name: g.manifest().name.clone(),
            version: g.manifest().version.clone(),
            digest: g.digest().to_string(),
            roles: g.manifest().roles.clone(),
            active,
            quarantined: g.is_quarantined(),
            rounds_served: g.rounds_served(),
            faults: g.total_faults(),
            last_fault: g
                .last_fault()
                .map(|f| format!("epoch {}: {}", f.epoch, f.fault))
                .unwrap_or_default(),
            config: if g.config.is_empty() {
                g.manifest().default_config.clone()
            } else {
                g.config.clone()
            },
        }
    }

    pub fn swap(&mut self, caller: &Caller, slot: &str, generation: u64) -> Result<Ack, ApiError> {
        let s = self.find_slot(caller, slot)?;
        if slot == DEFAULT_SLOT && self.experiment.is_some() {
            return Err(ApiError::FailedPrecondition(
                "an experiment is running; promote or abort it first".into(),
            ));
        }
        s.activate(generation)
            .map_err(|e| ApiError::NotFound(e.to_string()))?;
        Ok(self.writer.send_durable(vec![self.slot_write(&s)?]))
    }

    pub fn rollback(
        &mut self,
        caller: &Caller,
        slot: &str,
        generation: u64,
    ) -> Result<Ack, ApiError> {
        let s = self.find_slot(caller, slot)?;
        s.rollback((generation != 0).then_some(generation))
            .map_err(|e| ApiError::FailedPrecondition(e.to_string()))?;
        Ok(self.writer.send_durable(vec![self.slot_write(&s)?]))
    }

    /// Removes generation `generation` from `slot`, or (0) every generation and
    /// the slot with them: how an operator stops the `matcher` pairing or the
    /// `reclaim` slot answering, or a tenant drops its policy. If the active
    /// generation goes, the newest healthy one left becomes active. `default`'s
    /// active generation (the cluster's scheduler) and a running experiment's
    /// candidate are refused. Components no generation runs any more are
    /// deleted from the store.
    pub fn unload(
        &mut self,
        caller: &Caller,
        slot: &str,
        generation: u64,
    ) -> Result<Ack, ApiError> {
        let s = self.find_slot(caller, slot)?;
        let gone: Vec<Arc<Generation>> = if generation == 0 {
            s.generations()
        } else {
            vec![
                s.get(generation)
                    .map_err(|e| ApiError::NotFound(e.to_string()))?,
            ]
        };
        let takes = |id: Option<u64>| id.is_some_and(|id| gone.iter().any(|g| g.id == id));
        if slot == DEFAULT_SLOT && takes(s.active_id()) {
            return Err(ApiError::FailedPrecondition(
                "`default` schedules the cluster and its active generation cannot be unloaded: \
                 activate another (`policy swap default N`) or load a new one first"
                    .into(),
            ));
        }
        if let Some(e) = &self.experiment
            && e.record.candidate_slot == slot
            && takes(Some(e.candidate_generation))
        {
            return Err(ApiError::FailedPrecondition(format!(
                "generation {} of `{slot}` is experiment `{}`'s candidate: promote or abort it first",
                e.candidate_generation, e.record.name
            )));
        }
        for g in &gone {
            s.unload(g.id).map_err(internal)?;
        }
        let mut writes = Vec::new();
        if s.generations().is_empty() {
            self.registry.remove(slot);
            writes.push(Write::Delete(format!("slot/{slot}")));
        } else {
            writes.push(self.slot_write(&s)?);
        }
        writes.extend(self.unused_blobs(gone.iter().map(|g| g.digest().to_string())));
        let ids: Vec<u64> = gone.iter().map(|g| g.id).collect();
        tracing::info!(slot, generations = ?ids, active = ?s.active_id(), "policy generations unloaded");
        Ok(self.writer.send_durable(writes))
    }

    /// Slot `slot`'s generations and how it has served (`None`: no such slot).
    pub(super) fn slot_view(&self, slot: &str) -> Option<views::SlotView> {
        let s = self.registry.find(slot)?;
        let mut merged = Histogram::default();
        let mut any = false;
        for ((s, _), h) in &self.metrics.latency {
            if s == slot {
                merged = merge(&merged, h);
                any = true;
            }
        }
        let cells: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.slot.name() == slot)
            .collect();
        Some(views::SlotView {
            slot: slot.to_string(),
            generations: s
                .generations()
                .iter()
                .map(|g| self.generation_view(slot, g))
                .collect(),
            cells: u32::try_from(cells.len()).unwrap_or(u32::MAX),
            rounds: cells
                .iter()
                .map(|c| self.metrics.rounds.get(&c.arm).copied().unwrap_or(0))
                .sum(),
            fallbacks: cells
                .iter()
                .map(|c| self.metrics.fallbacks.get(&c.arm).copied().unwrap_or(0))
                .sum(),
            latency_p50_ms: if any { merged.quantile(0.5) * 1e3 } else { 0.0 },
            latency_p99_ms: if any {
                merged.quantile(0.99) * 1e3
            } else {
                0.0
            },
        })
    }
}
