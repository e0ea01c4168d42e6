//! Opening the data directory: the store, the journal, the tokens, and everything restored from them.

use super::*;

impl Plane {
    /// Opens (or creates) the plane's data directory and restores everything in it.
    pub fn open(cfg: PlaneConfig, data: &Path) -> anyhow::Result<Opened> {
        let data =
            &std::path::absolute(data).with_context(|| format!("resolving {}", data.display()))?;
        crate::files::private_dir(data)?;
        let store = Store::open(data)?;
        crate::files::restrict(&data.join("arbiter.redb"))?;
        let contents = store.read_all()?;
        refuse_a_lost_store(data, &contents)?;
        let writer = store.writer()?;
        let mut runtime = cfg.runtime.clone();
        if runtime.cache_dir.is_none() {
            runtime.cache_dir = Some(data.join("cache"));
        }
        let engine = PolicyEngine::new(runtime).context("creating the policy engine")?;
        let registry = Arc::new(Registry::new(engine));
        let journal_path = data.join("journal.jsonl");
        let journal = if cfg.journal {
            let journal = JournalWriter::open_with(&journal_path, cfg.journal_limits)?;
            crate::files::restrict(&journal_path)?;
            Some(journal)
        } else {
            None
        };
        let (events, _) = broadcast::channel(4096);
        let mut plane = Plane {
            nodes: cfg
                .nodes
                .iter()
                .map(|n| PoolNode {
                    request: n.clone(),
                    status: NodeStatus::Ready,
                    kind: NodeKind::Simulated,
                    link: None,
                    last_seen_ms: cfg.clock.now_ms(),
                })
                .collect(),
            cfg,
            data: data.to_path_buf(),
            registry,
            writer,
            journal,
            jobs: table::JobTable::default(),
            board: Arc::default(),
            by_status: HashMap::new(),
            next_id: 1,
            tenants: BTreeMap::new(),
            admin_token_sha: String::new(),
            node_token_sha: String::new(),
            node_tokens: BTreeMap::new(),
            fleet: Fleet::default(),
            cells: Vec::new(),
            experiment: None,
            experiments: BTreeMap::new(),
            finished_status: BTreeMap::new(),
            events,
            metrics: PolicyMetrics::default(),
            tenant_faults: 0,
            last_retention_ms: 0,
            metrics_published: None,
            unsent_events: Vec::new(),
            published_experiment: None,
            retention_floor: 0,
            tenant_memory: BTreeMap::new(),
            job_samples: HashMap::new(),
            sm_shares: HashMap::new(),
            last_match_ms: None,
            launch_seqs: HashMap::new(),
            next_launch_seq: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
                .max(1),
            rounds: 0,
            next_session: 1,
            update_seq: 0,
        };
        let (admin_sha, new_admin_token) = plane.stored_token(&contents, "admin")?;
        let (node_sha, new_node_token) = plane.stored_token(&contents, "node")?;
        plane.admin_token_sha = admin_sha;
        plane.node_token_sha = node_sha;
        plane.restore(&contents)?;
        plane.refresh_fleet();
        plane.rebuild_cells();
        Ok(Opened {
            plane,
            new_admin_token,
            new_node_token,
            journal_path,
        })
    }

    /// The stored hash of the `kind` token (`admin`, `node`), minting the
    /// token on first start: its hash goes to the store, the token itself to
    /// `<kind>.token` in the data directory (owner-only) and to the caller.
    pub(super) fn stored_token(
        &mut self,
        contents: &Contents,
        kind: &str,
    ) -> anyhow::Result<(String, Option<String>)> {
        let key = format!("meta/{kind}_token_sha256");
        if let Some(sha) = contents.get(&key) {
            return Ok((String::from_utf8_lossy(sha).into_owned(), None));
        }
        let token = new_token();
        let sha = sha256_hex(token.as_bytes());
        self.writer
            .send_durable(vec![Write::Put(key, sha.clone().into_bytes())])
            .wait()?;
        let path = self.data.join(format!("{kind}.token"));
        crate::files::write(&path, format!("{token}\n").as_bytes(), true)?;
        Ok((sha, Some(token)))
    }

    pub(super) fn restore(&mut self, contents: &Contents) -> anyhow::Result<()> {
        for (name, bytes) in contents.with_prefix(NODE_TOKEN_PREFIX) {
            self.node_tokens.insert(
                name.to_string(),
                String::from_utf8_lossy(bytes).into_owned(),
            );
        }
        for (name, bytes) in contents.with_prefix("tenant/") {
            let t: TenantRecord =
                serde_json::from_slice(bytes).with_context(|| format!("stored tenant `{name}`"))?;
            self.tenants.insert(t.name.clone(), t);
        }
        for (id, bytes) in &contents.jobs {
            let job: StoredJob =
                serde_json::from_slice(bytes).with_context(|| format!("stored job {id}"))?;
            self.next_id = self.next_id.max(job.id + 1);
            self.by_status.entry(job.status).or_default().insert(job.id);
            self.jobs.insert(job.id, job);
        }
        for (name, bytes) in contents.with_prefix("agent/") {
            let r: AgentRecord = serde_json::from_slice(bytes)
                .with_context(|| format!("stored agent node `{name}`"))?;
            // Restored as ready with a fresh grace period: it is declared lost
            // (and its jobs rescheduled) only if it does not reconnect in time.
            self.nodes.push(PoolNode {
                request: agent_request(&r),
                status: NodeStatus::Ready,
                kind: NodeKind::Agent,
                link: None,
                last_seen_ms: self.now_ms(),
            });
        }
        for (name, bytes) in contents.with_prefix("node/") {
            let status: NodeStatus =
                serde_json::from_slice(bytes).with_context(|| format!("stored node `{name}`"))?;
            if let Some(n) = self.nodes.iter_mut().find(|n| n.request.name == name) {
                n.status = status;
            }
        }
        for (name, bytes) in contents.with_prefix("loan/") {
            let on_loan: bool = serde_json::from_slice(bytes)
                .with_context(|| format!("stored loan of `{name}`"))?;
            if let Some(n) = self.nodes.iter_mut().find(|n| n.request.name == name) {
                n.request.on_loan = on_loan;
            }
        }
        // Policy slots: recompile every persisted generation (the engine's
        // on-disk cache makes this a deserialisation).
        let mut restored_default = false;
        // Digests the stored slots refer to, whether or not they load.
        let mut referenced: HashSet<String> = HashSet::new();
        for (slot_name, bytes) in contents.with_prefix("slot/") {
            let record: SlotRecord = serde_json::from_slice(bytes)
                .with_context(|| format!("stored slot `{slot_name}`"))?;
            referenced.extend(record.generations.iter().map(|g| g.digest.clone()));
            let slot = self.registry.slot(slot_name);
            let mut ids = Vec::new();
            for g in &record.generations {
                let Some(wasm) = contents.get(&format!("blob/{}", g.digest)) else {
                    tracing::error!(slot = slot_name, digest = %g.digest, "stored generation has no component; skipped");
                    continue;
                };
                match self.registry.engine().compile(wasm) {
                    Ok(compiled) => {
                        let compiled = self.charge_owner(slot_name, compiled);
                        let config = (!g.config.is_empty()).then(|| g.config.clone());
                        let loaded = if g.id > 0 {
                            slot.load_as(g.id, compiled, config)
                        } else {
                            slot.load(compiled, config, None, None)
                        };
                        match loaded {
                            Ok(generation) => ids.push(Some(generation.id)),
                            Err(e) => {
                                tracing::error!(slot = slot_name, error = %e, "stored generation failed to load");
                                ids.push(None);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(slot = slot_name, error = %e, "stored generation failed to compile");
                        ids.push(None);
                    }
                }
            }
            if let Some(Some(id)) = record.active.and_then(|i| ids.get(i)) {
                let _ = slot.activate(*id);
            } else if let Some(Some(id)) = ids.iter().rev().find(|i| i.is_some()) {
                let _ = slot.activate(*id);
            }
            restored_default |= slot_name == DEFAULT_SLOT && slot.active().is_some();
        }
        // Components no slot refers to any more (left behind by a version that
        // never deleted them, or by a crash between the two writes).
        for (digest, _) in contents.with_prefix("blob/") {
            if !referenced.contains(digest) {
                tracing::info!(digest, "deleting a stored component no slot refers to");
                self.writer.send(Write::Delete(format!("blob/{digest}")));
            }
        }
        if !restored_default {
            let name = self.cfg.default_policy.clone();
            let wasm = arbiter_policies::get(&name)
                .ok_or_else(|| anyhow::anyhow!("no built-in policy `{name}`"))?;
            let compiled = self
                .registry
                .engine()
                .compile(wasm)
                .map_err(|e| anyhow::anyhow!("built-in `{name}`: {e}"))?;
            self.load_generation(DEFAULT_SLOT, compiled, wasm, String::new(), true)
                .map_err(|e| anyhow::anyhow!("loading built-in `{name}`: {e}"))?;
        }
        // Final metrics are a report, not state: an unreadable one is
        // dropped with a warning rather than refusing to start.
        for (name, bytes) in contents.with_prefix(LEGACY_FINISHED_STATUS_PREFIX) {
            match crate::convert::legacy_experiment_report(bytes) {
                Ok(report) => match serde_json::to_vec(&report) {
                    Ok(json) => {
                        self.writer
                            .send(Write::Put(format!("{FINISHED_REPORT_PREFIX}{name}"), json));
                        self.finished_status.insert(name.to_string(), report);
                    }
                    Err(e) => {
                        tracing::warn!(experiment = name, error = %e, "final experiment report not rewritten");
                    }
                },
                Err(e) => {
                    tracing::warn!(experiment = name, error = %e, "unreadable final experiment status; dropped");
                }
            }
            self.writer.send(Write::Delete(format!(
                "{LEGACY_FINISHED_STATUS_PREFIX}{name}"
            )));
        }
        for (name, bytes) in contents.with_prefix(FINISHED_REPORT_PREFIX) {
            match serde_json::from_slice(bytes) {
                Ok(report) => {
                    self.finished_status.insert(name.to_string(), report);
                }
                Err(e) => {
                    tracing::warn!(experiment = name, error = %e, "unreadable final experiment report; dropped");
                }
            }
        }
        for (name, bytes) in contents.with_prefix("exp/") {
            let record: ExperimentRecord = serde_json::from_slice(bytes)
                .with_context(|| format!("stored experiment `{name}`"))?;
            if record.state == ExperimentState::Running {
                // Round stats are a report: an unreadable record starts them afresh.
                let rounds = contents
                    .get(&format!("{EXPERIMENT_ROUNDS_PREFIX}{name}"))
                    .and_then(|bytes| match serde_json::from_slice(bytes) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            tracing::warn!(experiment = name, error = %e, "unreadable round stats; started afresh");
                            None
                        }
                    });
                match self.activate_experiment(record.clone(), rounds) {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::error!(experiment = name, error = %e, "could not resume experiment; aborting it");
                        let mut r = record;
                        r.state = ExperimentState::Aborted;
                        r.reason = format!("could not resume after restart: {e}");
                        r.ended_ms = self.now_ms();
                        self.persist_experiment(&r);
                        self.experiments.insert(r.name.clone(), r);
                    }
                }
            } else {
                self.experiments.insert(record.name.clone(), record);
            }
        }
        Ok(())
    }
}
