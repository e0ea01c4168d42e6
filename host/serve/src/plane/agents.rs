//! Node agents: registration, heartbeats, workload events, launches and stops.

use super::*;
use crate::link::{AgentReport, SurvivingWorkload, UpdateAck, WorkloadEvent, WorkloadEventKind};

impl Plane {
    /// Registers (or re-registers) a node agent; returns its session id and
    /// what it must be told first. Surviving workloads it reports are adopted.
    pub fn register_node(
        &mut self,
        caller: &Caller,
        hello: &AgentHello,
        tx: tokio::sync::mpsc::UnboundedSender<ToAgent>,
    ) -> Result<u64, ApiError> {
        if let Caller::Tenant(t) = caller {
            return Err(ApiError::PermissionDenied(format!(
                "tenant `{t}` may not register nodes; agents use the node token"
            )));
        }
        let request = hello_request(hello).map_err(ApiError::InvalidArgument)?;
        let name = request.name.clone();
        if let Caller::Node(Some(bound)) = caller
            && *bound != name
        {
            return Err(ApiError::PermissionDenied(format!(
                "this node token belongs to node `{bound}`, not `{name}`"
            )));
        }
        if self
            .nodes
            .iter()
            .any(|n| n.request.name == name && n.kind == NodeKind::Simulated)
        {
            return Err(ApiError::AlreadyExists(format!(
                "`{name}` is a simulated node of the embedded pool"
            )));
        }
        // One live agent per name: a second agent (another instance id) is refused while the
        // first is connected and heard from within `lost_after`, so two machines configured
        // with the same name cannot take the node from each other in turn (each launch would
        // land on whichever connected last). The same agent reconnecting (its instance id,
        // which `arbiter node` keeps in its state directory) takes its session over at once.
        if let Some(n) = self.nodes.iter().find(|n| n.request.name == name)
            && let Some(link) = &n.link
            && self.silent_since(n.last_seen_ms) < self.cfg.lost_after
            && (hello.instance.is_empty() || hello.instance != link.instance)
        {
            return Err(ApiError::AlreadyExists(format!(
                "node `{name}` is connected from another agent (instance `{}`); another agent \
                 may take the name once it has been silent for {:?}",
                link.instance, self.cfg.lost_after
            )));
        }
        let session = self.next_session;
        self.next_session += 1;
        let now = self.now_ms();
        // The welcome goes first: reconciliation below may already send stops.
        let _ = tx.send(ToAgent::Welcome {
            heartbeat: self.cfg.heartbeat,
            lost_after: self.cfg.lost_after,
        });
        let link = AgentLink {
            instance: hello.instance.clone(),
            session,
            tx,
            last_seen_ms: now,
        };
        match self.nodes.iter_mut().find(|n| n.request.name == name) {
            Some(n) => {
                // A reconnect keeps what the operator decided about the
                // node's loan (a reclaimed node stays reclaimed).
                let on_loan = n.request.on_loan;
                n.request = request.clone();
                n.request.on_loan = on_loan;
                if n.status != NodeStatus::Reclaimed {
                    n.status = NodeStatus::Ready;
                }
                n.link = Some(link);
                n.last_seen_ms = now;
            }
            None => self.nodes.push(PoolNode {
                request: request.clone(),
                status: NodeStatus::Ready,
                kind: NodeKind::Agent,
                link: Some(link),
                last_seen_ms: now,
            }),
        }
        self.refresh_fleet();
        let record = AgentRecord {
            name: name.clone(),
            pool: request.pool.clone(),
            cpu_milli: request.cpu_milli,
            memory_mib: request.memory_mib,
            gpu_model: request.gpu_model.clone(),
            gpu_memory_mib: request.gpu_memory_mib,
            gpu_count: request.gpu_count,
        };
        if let Ok(bytes) = serde_json::to_vec(&record) {
            self.writer.send(Write::Put(format!("agent/{name}"), bytes));
        }
        if self
            .nodes
            .iter()
            .any(|n| n.request.name == name && n.status == NodeStatus::Ready)
        {
            self.writer.send(Write::Delete(format!("node/{name}")));
        }
        // Reconcile what the node still runs with what the host believes.
        let reported: HashMap<u64, &SurvivingWorkload> =
            hello.workloads.iter().map(|w| (w.job_id, w)).collect();
        let believed: Vec<u64> = self
            .released()
            .filter(|j| {
                j.status == JobStatus::Running && j.placement.iter().any(|w| w.node == name)
            })
            .map(|j| j.id)
            .collect();
        let mut requeue = Vec::new();
        for id in &believed {
            match reported.get(id) {
                Some(w) if w.running => {
                    tracing::info!(node = %name, job = id, pid = w.pid, "workload adopted");
                }
                Some(w) => {
                    let status = if w.exit_code == 0 {
                        JobStatus::Succeeded
                    } else {
                        JobStatus::Failed
                    };
                    self.remove_from_cell(*id);
                    drop(self.finish_job(
                        *id,
                        status,
                        &format!("exited with {} while the node was away", w.exit_code),
                    ));
                }
                None => requeue.push(*id),
            }
        }
        for w in &hello.workloads {
            if w.running && !believed.contains(&w.job_id) {
                self.send_to(
                    &name,
                    ToAgent::Stop {
                        job_id: w.job_id,
                        reason: "not running here according to the control plane".into(),
                    },
                );
            }
        }
        for id in requeue {
            self.requeue(id, &format!("lost on `{name}` while the node was away"));
        }
        self.rebuild_cells();
        tracing::info!(node = %name, session, gpus = hello.gpus.len(), "node agent registered");
        Ok(session)
    }

    /// Drops every node stream (shutdown); agents reconnect to the next host.
    pub fn disconnect_agents(&mut self) {
        for n in &mut self.nodes {
            n.link = None;
        }
    }

    pub(super) fn agent_mut(&mut self, name: &str, session: u64) -> Option<&mut PoolNode> {
        self.nodes.iter_mut().find(|n| {
            n.request.name == name && n.link.as_ref().is_some_and(|l| l.session == session)
        })
    }

    /// An agent's answer to an `Update`: counted, and logged when refused.
    pub fn node_update_ack(&mut self, name: &str, session: u64, ack: &UpdateAck) {
        if self.agent_mut(name, session).is_none() {
            return;
        }
        let outcome = if ack.ok { "applied" } else { "refused" };
        *self.metrics.node_updates.entry(outcome).or_default() += 1;
        if ack.ok {
            tracing::debug!(
                node = name,
                job = ack.job_id,
                seq = ack.seq,
                "update applied"
            );
        } else {
            tracing::warn!(node = name, job = ack.job_id, seq = ack.seq, message = %ack.message, "update refused");
        }
    }

    /// A report (heartbeat) from a node agent's current session.
    pub fn node_report(&mut self, name: &str, session: u64, hb: &AgentReport) {
        let now = self.now_ms();
        let Some(node) = self.agent_mut(name, session) else {
            return;
        };
        node.last_seen_ms = now;
        if let Some(l) = node.link.as_mut() {
            l.last_seen_ms = now;
        }
        for cell in &mut self.cells {
            let Some(index) = cell.state.node_index(name) else {
                continue;
            };
            let range = cell.state.cluster().node(index).gpu_range();
            let metrics: Vec<model::GpuMetric> = hb
                .gpus
                .iter()
                .filter(|g| g.index < range.len() as u32)
                .map(|g| model::GpuMetric {
                    gpu: range.start + g.index,
                    utilization_pct: g.utilization_pct.min(100) as u8,
                    sm_activity_pct: g.sm_activity_pct.min(100) as u8,
                    memory_used_mib: g.memory_used_mib,
                    sm_occupancy_pct: 0, // not in the heartbeat
                })
                .collect();
            if let Some(h) = &hb.host {
                let metric = model::NodeMetric {
                    node: index,
                    cpu_utilization_pct: h.cpu_utilization_pct.min(100) as u8,
                    host_memory_used_mib: h.memory_used_mib,
                    swap_in_per_s: h.swap_in_per_s,
                };
                if let Err(e) = cell.state.record_node_metrics(vec![metric]) {
                    tracing::warn!(node = name, error = %e, "host load refused");
                }
            }
            // Per-GPU health into the cluster view (contract 0.3's G8, MuxFlow's
            // X10): shared work goes only on healthy GPUs, guaranteed work is
            // unaffected, and the node stays open for both.
            for g in hb.gpus.iter().filter(|g| g.index < range.len() as u32) {
                let health = u8::try_from(g.health).unwrap_or(u8::MAX);
                if let Err(e) = cell.state.set_gpu_health(name, g.index, health) {
                    tracing::warn!(node = name, gpu = g.index, error = %e, "GPU health refused");
                }
            }
            if !metrics.is_empty()
                && let Err(e) = cell.state.record_gpu_metrics(metrics)
            {
                tracing::warn!(node = name, error = %e, "GPU metrics refused");
            }
        }
        self.record_job_samples(name, &hb.jobs);
    }

    /// A workload event from a node agent.
    pub fn node_event(&mut self, name: &str, session: u64, ev: &WorkloadEvent) {
        if self.agent_mut(name, session).is_none() {
            return;
        }
        let here = self.jobs.get(&ev.job_id).is_some_and(|j| {
            j.status == JobStatus::Running && j.placement.iter().any(|w| w.node == name)
        });
        if !here {
            return;
        }
        if ev.launch_seq != 0
            && let Some(&current) = self.launch_seqs.get(&ev.job_id)
            && current != ev.launch_seq
        {
            tracing::info!(
                node = name,
                job = ev.job_id,
                event_seq = ev.launch_seq,
                current,
                "event of a replaced run ignored"
            );
            return;
        }
        match &ev.kind {
            WorkloadEventKind::Started => {
                if let Some(j) = self.jobs.get_mut(&ev.job_id) {
                    j.message = format!("running on {name}");
                }
            }
            &WorkloadEventKind::Exited { exit_code } => {
                let status = if exit_code == 0 {
                    JobStatus::Succeeded
                } else {
                    JobStatus::Failed
                };
                self.stop_elsewhere(ev.job_id, name);
                self.remove_from_cell(ev.job_id);
                drop(self.finish_job(ev.job_id, status, &format!("exit code {exit_code}")));
            }
            WorkloadEventKind::FailedToStart { message } => {
                self.stop_elsewhere(ev.job_id, name);
                self.remove_from_cell(ev.job_id);
                drop(self.finish_job(
                    ev.job_id,
                    JobStatus::Failed,
                    &format!("failed to start on {name}: {message}"),
                ));
            }
            WorkloadEventKind::Evicted { message } => {
                self.stop_elsewhere(ev.job_id, name);
                self.requeue(ev.job_id, &format!("evicted by {name}: {message}"));
            }
        }
    }

    /// The agent's stream ended; the heartbeat timeout decides whether it is lost.
    pub fn node_disconnected(&mut self, name: &str, session: u64) {
        if let Some(node) = self.agent_mut(name, session) {
            node.link = None;
            tracing::warn!(node = name, session, "node agent disconnected");
        }
    }

    /// Marks silent agents lost and reschedules their jobs.
    pub(super) fn check_agents(&mut self) {
        let lost: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| {
                n.kind == NodeKind::Agent
                    && n.status != NodeStatus::Lost
                    && self.silent_since(n.last_seen_ms) > self.cfg.lost_after
            })
            .map(|n| n.request.name.clone())
            .collect();
        if lost.is_empty() {
            return;
        }
        for name in &lost {
            tracing::error!(node = %name, "node lost: no heartbeat; rescheduling its jobs");
            if let Some(n) = self.nodes.iter_mut().find(|n| &n.request.name == name) {
                n.status = NodeStatus::Lost;
                n.link = None;
            }
            let victims: Vec<u64> = self
                .released()
                .filter(|j| {
                    j.status == JobStatus::Running && j.placement.iter().any(|w| &w.node == name)
                })
                .map(|j| j.id)
                .collect();
            for id in victims {
                self.stop_elsewhere(id, name);
                self.requeue(id, &format!("node `{name}` lost"));
            }
        }
        self.rebuild_cells();
    }

    /// Puts a running job back in the queue of its cell (resources freed).
    pub(super) fn requeue(&mut self, id: u64, why: &str) {
        for cell in &mut self.cells {
            if let Some(&local) = cell.local.get(&id)
                && let Err(e) = cell.state.evict(local)
            {
                tracing::error!(job = id, error = %e, "evicting from the cell");
            }
        }
        self.preempted(id);
        if let Some(j) = self.jobs.get_mut(&id) {
            j.message = why.to_string();
        }
        self.set_status(id, JobStatus::Pending);
    }

    /// A running job lost its placement (preempted, its node lost, or it
    /// could not keep it in a rebuilt cell): counted on the job and, if
    /// enrolled, in its arm.
    pub(super) fn preempted(&mut self, id: u64) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.placement.clear();
            j.preemptions += 1;
        }
        if let Some(stats) = self.enrolled_stats(id) {
            stats.preemptions += 1;
        }
    }

    pub(super) fn send_to(&self, node: &str, message: ToAgent) {
        let Some(link) = self
            .nodes
            .iter()
            .find(|n| n.request.name == node)
            .and_then(|n| n.link.as_ref())
        else {
            return;
        };
        if link.tx.send(message).is_err() {
            tracing::warn!(node, "node agent stream closed; message dropped");
        }
    }

    pub(super) fn is_agent(&self, node: &str) -> bool {
        self.nodes
            .iter()
            .any(|n| n.request.name == node && n.kind == NodeKind::Agent)
    }

    /// Tells every agent node of a job except `except` to stop it.
    pub(super) fn stop_elsewhere(&self, id: u64, except: &str) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let mut told = HashSet::new();
        for w in &job.placement {
            if w.node != except && self.is_agent(&w.node) && told.insert(w.node.clone()) {
                self.send_to(
                    &w.node,
                    ToAgent::Stop {
                        job_id: id,
                        reason: "stopped by the control plane".into(),
                    },
                );
            }
        }
    }

    /// Job `id`'s launches where it is placed now, by the one launch rule
    /// (`None`: no such job).
    pub(super) fn resolve_launches(
        &self,
        id: u64,
    ) -> Option<Result<Vec<launch::NodeLaunch>, String>> {
        let job = self.jobs.get(&id)?;
        let shared = self.cfg.sharing.is_shared(job.spec.qos);
        let resolved = launch::resolve(id, &job.spec, &job.placement, shared, |node| {
            self.nodes
                .iter()
                .find(|n| n.request.name == node)
                .map(|n| n.request.gpu_memory_mib)
        });
        Some(resolved.map(|mut launches| {
            if let Some(&pct) = self.sm_shares.get(&id) {
                launch::with_sm_share(&mut launches, pct);
            }
            launches
        }))
    }

    /// Sends the job's resolved launches (one per agent node it is placed
    /// on, see [`crate::launch`]). A placement that cannot be resolved puts
    /// the job back in the queue with the reason.
    pub(super) fn launch_on_agents(&mut self, id: u64) {
        let Some(resolved) = self.resolve_launches(id) else {
            return;
        };
        match resolved {
            Ok(launches) => {
                let seq = self.next_launch_seq;
                self.next_launch_seq += 1;
                self.launch_seqs.insert(id, seq);
                for mut l in launches {
                    if self.is_agent(&l.node) {
                        l.launch.launch_seq = seq;
                        self.send_to(&l.node, ToAgent::Launch(l.launch));
                    }
                }
            }
            Err(why) => {
                tracing::error!(job = id, %why, "launch not resolved; job requeued");
                self.requeue(id, &why);
            }
        }
    }
}
