//! The node pool: listing, draining, lending and reclaiming nodes.

use super::*;
use crate::link::HostLoad;

impl Plane {
    /// Recomputes the node shapes submissions are checked against.
    pub(super) fn refresh_fleet(&mut self) {
        self.fleet = Fleet::of(self.nodes.iter().map(|n| &n.request));
    }

    pub(super) fn list_nodes(&self) -> Vec<views::NodeView> {
        // One plan per cell, not per node: listing stays linear in the pool.
        let plans: Vec<Plan> = self
            .cells
            .iter()
            .map(|c| Plan::new(c.state.cluster()))
            .collect();
        self.nodes
            .iter()
            .map(|n| {
                let (arm, free, gpu_health, host) = self
                    .cells
                    .iter()
                    .zip(&plans)
                    .find_map(|(c, plan)| {
                        c.state.node_index(&n.request.name).map(|i| {
                            let cluster = c.state.cluster();
                            let health = cluster
                                .node(i)
                                .gpus()
                                .map(|g| u32::from(g.health()))
                                .collect();
                            let m = cluster.node_metrics(i);
                            let host = (m.host_memory_used_mib > 0).then(|| HostLoad {
                                cpu_utilization_pct: u32::from(m.cpu_utilization_pct),
                                memory_used_mib: m.host_memory_used_mib,
                                swap_in_per_s: m.swap_in_per_s,
                            });
                            (c.arm.clone(), plan.node_idle_gpus(i), health, host)
                        })
                    })
                    .unwrap_or_default();
                views::NodeView {
                    name: n.request.name.clone(),
                    pool: n.request.pool.clone(),
                    gpu_model: n.request.gpu_model.clone(),
                    gpus: n.request.gpu_count,
                    gpus_free: free,
                    status: n.status,
                    on_loan: n.request.on_loan,
                    arm: if self.experiment.is_some() {
                        arm
                    } else {
                        String::new()
                    },
                    kind: n.kind,
                    gpu_health,
                    host,
                }
            })
            .collect()
    }

    pub fn drain(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        self.node_mut(name)?;
        self.set_drained(name, NodeStatus::Draining, model::node_state::CORDONED)
    }

    /// Undoes a drain: a draining node takes new work again (a lost or
    /// reclaimed node is not the operator's to bring back this way).
    pub fn undrain(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        let node = self.node_mut(name)?;
        match node.status {
            NodeStatus::Draining => {}
            NodeStatus::Ready => {
                return Err(ApiError::FailedPrecondition(format!(
                    "node `{name}` is not draining"
                )));
            }
            other => {
                return Err(ApiError::FailedPrecondition(format!(
                    "node `{name}` is {other:?}, not draining"
                )));
            }
        }
        self.set_drained(name, NodeStatus::Ready, model::node_state::READY)
    }

    /// Records a node's drain state: in the pool, in its cell, in the store.
    pub(super) fn set_drained(
        &mut self,
        name: &str,
        status: NodeStatus,
        cell_state: u8,
    ) -> Result<Ack, ApiError> {
        self.node_mut(name)?.status = status;
        for cell in &mut self.cells {
            if cell.state.node_index(name).is_some() {
                cell.state
                    .set_node_state(name, cell_state)
                    .map_err(internal)?;
            }
        }
        let bytes = serde_json::to_vec(&status).map_err(internal)?;
        Ok(self
            .writer
            .send_durable(vec![Write::Put(format!("node/{name}"), bytes)]))
    }

    pub(super) fn node_mut(&mut self, name: &str) -> Result<&mut PoolNode, ApiError> {
        self.nodes
            .iter_mut()
            .find(|n| n.request.name == name)
            .ok_or_else(|| ApiError::NotFound(format!("no node `{name}`")))
    }

    /// The node `name`'s info as listed.
    /// Persists a node's status and loan (restored at start-up).
    pub(super) fn node_write(node: &PoolNode) -> Result<Vec<Write>, ApiError> {
        let name = &node.request.name;
        Ok(vec![
            Write::Put(
                format!("node/{name}"),
                serde_json::to_vec(&node.status).map_err(internal)?,
            ),
            Write::Put(
                format!("loan/{name}"),
                serde_json::to_vec(&node.request.on_loan).map_err(internal)?,
            ),
        ])
    }

    /// Lends a node to training: schedulable again, and a reclaim candidate.
    pub fn lend(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        let node = self.node_mut(name)?;
        if matches!(node.status, NodeStatus::Lost | NodeStatus::Draining) {
            return Err(ApiError::FailedPrecondition(format!(
                "node `{name}` is {:?}; only a ready or reclaimed node can be lent",
                node.status
            )));
        }
        node.request.on_loan = true;
        node.status = NodeStatus::Ready;
        let writes = Self::node_write(node)?;
        for cell in &mut self.cells {
            if cell.state.node_index(name).is_some() {
                cell.state.set_node_loan(name, true).map_err(internal)?;
                cell.state
                    .set_node_state(name, model::node_state::READY)
                    .map_err(internal)?;
            }
        }
        let ack = self.writer.send_durable(writes);
        tracing::info!(node = name, "node lent to training");
        Ok(ack)
    }

    /// Takes `count` on-loan nodes of `pool` back through the host core's
    /// reclaim driver: the `reclaim` slot answers when it holds an active
    /// generation, else each cell's scheduling slot (its `reclaim` role), or
    /// the native Smallest-Count-First plan. The plan's preemptions
    /// and scale-ins are reconciled like a round's; the returned nodes are
    /// cordoned and no longer on loan.
    pub fn reclaim(
        &mut self,
        caller: &Caller,
        pool: &str,
        count: u32,
    ) -> Result<(Reclaimed, Ack), ApiError> {
        Self::require_admin(caller)?;
        if count == 0 {
            return Err(ApiError::InvalidArgument("count must be at least 1".into()));
        }
        let on_loan: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| {
                n.request.pool == pool && n.request.on_loan && n.status == NodeStatus::Ready
            })
            .map(|n| n.request.name.clone())
            .collect();
        if on_loan.len() < count as usize {
            return Err(ApiError::FailedPrecondition(format!(
                "pool `{pool}` has {} node(s) on loan, {count} asked back",
                on_loan.len()
            )));
        }
        let now = self.now_ms();
        let mut response = Reclaimed::default();
        let mut remaining = count;
        let mut writes = Vec::new();
        let reclaim_slot = self
            .registry
            .find(RECLAIM_SLOT)
            .filter(|s| s.active().is_some());
        for index in 0..self.cells.len() {
            if remaining == 0 {
                break;
            }
            let cell = &mut self.cells[index];
            let candidates: Vec<u32> = on_loan
                .iter()
                .filter_map(|name| cell.state.node_index(name))
                .collect();
            if candidates.is_empty() {
                continue;
            }
            let take = remaining.min(candidates.len() as u32);
            cell.state.set_now(now);
            let asked = reclaim_slot.as_ref().unwrap_or(&cell.slot);
            let driver = ReclaimDriver::new(Arc::clone(asked));
            let outcome =
                driver.reclaim(&mut cell.state, &candidates, take, self.cfg.max_decisions);
            let returned: Vec<String> = outcome
                .plan
                .nodes
                .iter()
                .map(|&i| cell.state.cluster().node(i).name().to_string())
                .collect();
            let applied = if outcome.plan.decisions.is_empty() {
                Applied::default()
            } else {
                cell.state
                    .apply(outcome.plan.decisions.clone())
                    .map_err(internal)?
            };
            for name in &returned {
                cell.state.set_node_loan(name, false).map_err(internal)?;
                cell.state
                    .set_node_state(name, model::node_state::CORDONED)
                    .map_err(internal)?;
            }
            let slot = asked.name().to_string();
            let changes = Changes::read(cell, &applied);
            response.preempted.extend(changes.preempted.iter().copied());
            response.scaled_in.extend(
                applied
                    .resized
                    .iter()
                    .filter_map(|l| cell.global.get(l).copied()),
            );
            if response.served.is_empty() || outcome.served != Served::Native {
                response.served = outcome.served.label().to_string();
                response.slot = slot.clone();
            }
            for (generation, fault) in &outcome.faults {
                let g = generation_label(*generation);
                response.faults.push(format!("{g}: {fault}"));
                self.metrics.count_fault(&slot, *generation, fault.kind());
            }
            self.reconcile(changes, now);
            for name in &returned {
                if let Some(node) = self.nodes.iter_mut().find(|n| &n.request.name == name) {
                    node.request.on_loan = false;
                    node.status = NodeStatus::Reclaimed;
                    writes.extend(Self::node_write(node)?);
                }
            }
            tracing::info!(
                cell = %self.cells[index].arm,
                returned = ?returned,
                slot = %slot,
                served = outcome.served.label(),
                "nodes reclaimed"
            );
            remaining -= take;
            response.returned.extend(returned);
        }
        let ack = self.writer.send_durable(writes);
        Ok((response, ack))
    }
}
