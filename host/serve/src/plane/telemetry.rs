//! What the plane reports: the cluster view and the Prometheus metrics.

use super::*;

impl Plane {
    pub(super) fn view(&self) -> views::ClusterView {
        let count = |s: JobStatus| self.count(s);
        let (mut alloc, mut gpus) = (0.0, 0u32);
        for c in &self.cells {
            let g = c.state.cluster().gpu_count() as u32;
            alloc += c.state.gpu_allocation_pct() * f64::from(g);
            gpus += g;
        }
        let default = self.registry.find(DEFAULT_SLOT);
        views::ClusterView {
            epoch: self.cells.first().map_or(0, |c| c.state.epoch()),
            now_ms: self.now_ms(),
            nodes: self.nodes.len() as u32,
            gpus,
            gpu_allocation_pct: if gpus == 0 {
                0.0
            } else {
                alloc / f64::from(gpus)
            },
            jobs_queued: count(JobStatus::Queued),
            jobs_pending: count(JobStatus::Pending),
            jobs_running: count(JobStatus::Running),
            jobs_finished: count(JobStatus::Succeeded)
                + count(JobStatus::Failed)
                + count(JobStatus::Cancelled),
            active_policy: default
                .as_ref()
                .and_then(|s| s.active())
                .map(|g| g.manifest().name.clone())
                .unwrap_or_default(),
            active_generation: default.and_then(|s| s.active_id()).unwrap_or(0),
            experiment: self
                .experiment
                .as_ref()
                .map(|e| e.record.name.clone())
                .unwrap_or_default(),
            rounds: self.rounds,
            quarantined: self
                .registry
                .slots()
                .iter()
                .flat_map(|slot| {
                    slot.generations()
                        .into_iter()
                        .filter(|g| g.is_quarantined())
                        .map(|g| views::QuarantinedGeneration {
                            slot: slot.name().to_string(),
                            generation: g.id,
                            name: g.manifest().name.clone(),
                            faults: g.total_faults(),
                            last_fault: g
                                .last_fault()
                                .map(|f| f.fault.to_string())
                                .unwrap_or_default(),
                            active: slot.active_id() == Some(g.id),
                        })
                        .collect::<Vec<_>>()
                })
                .collect(),
        }
    }

    /// Total time spent journaling and in rounds, in seconds (for the
    /// journal-overhead benchmark).
    pub fn journal_and_round_seconds(&self) -> (f64, f64) {
        let rounds = self
            .metrics
            .round_latency
            .values()
            .map(Histogram::sum)
            .sum();
        (self.metrics.journal.sum(), rounds)
    }

    /// The metrics exposition (OpenMetrics text).
    pub(super) fn metrics_text(&self) -> String {
        let mut e = Exposition::new();
        let view = self.view();
        e.counter(
            "arbiter_rounds",
            "Scheduling rounds run, by cell.",
            self.metrics
                .rounds
                .iter()
                .map(|(cell, n)| (vec![("cell", cell.as_str())], *n)),
        );
        e.histogram(
            "arbiter_round_seconds",
            "Whole-round latency (delta, policy, validation, apply), by cell.",
            self.metrics
                .round_latency
                .iter()
                .map(|(cell, h)| (vec![("cell", cell.as_str())], h)),
        );
        e.histogram(
            "arbiter_policy_seconds",
            "Time inside the answering policy per round, by slot and generation.",
            self.metrics.latency.iter().map(|((slot, generation), h)| {
                (
                    vec![("slot", slot.as_str()), ("generation", generation.as_str())],
                    h,
                )
            }),
        );
        e.counter(
            "arbiter_policy_faults",
            "Policy faults, by slot, generation and kind.",
            self.metrics
                .faults
                .iter()
                .map(|((slot, generation, kind), n)| {
                    (
                        vec![
                            ("slot", slot.as_str()),
                            ("generation", generation.as_str()),
                            ("kind", kind.as_str()),
                        ],
                        *n,
                    )
                }),
        );
        let slots = self.registry.slots();
        let quarantined: Vec<(String, String, bool)> = slots
            .iter()
            .flat_map(|slot| {
                slot.generations().into_iter().map(|g| {
                    (
                        slot.name().to_string(),
                        g.id.to_string(),
                        g.is_quarantined(),
                    )
                })
            })
            .collect();
        e.gauge(
            "arbiter_policy_quarantined",
            "1 for a loaded generation that is quarantined (never served, never rolled back to), by slot and generation.",
            quarantined.iter().map(|(slot, generation, q)| {
                (
                    vec![("slot", slot.as_str()), ("generation", generation.as_str())],
                    GaugeValue::Int(i64::from(*q)),
                )
            }),
        );
        e.counter(
            "arbiter_policy_fuel",
            "Fuel (guest instructions, as wasmtime meters them) the scheduler rounds a generation answered consumed, by slot and generation; only with `arbiter serve --fuel`.",
            self.metrics
                .fuel
                .iter()
                .map(|((slot, generation), n)| {
                    (
                        vec![("slot", slot.as_str()), ("generation", generation.as_str())],
                        *n,
                    )
                }),
        );
        e.counter(
            "arbiter_fallback_rounds",
            "Rounds served by an older generation or the native policy, by cell.",
            self.metrics
                .fallbacks
                .iter()
                .map(|(cell, n)| (vec![("cell", cell.as_str())], *n)),
        );
        e.histogram(
            "arbiter_journal_append_seconds",
            "Encoding and appending one decision-journal record.",
            [(vec![], &self.metrics.journal)],
        );
        e.counter(
            "arbiter_node_updates",
            "Updates of running jobs acknowledged by node agents, by outcome.",
            self.metrics
                .node_updates
                .iter()
                .map(|(outcome, n)| (vec![("outcome", *outcome)], *n)),
        );
        e.counter(
            "arbiter_tenant_policy_faults",
            "Tenant policy faults.",
            [(vec![], self.tenant_faults)],
        );
        e.gauge(
            "arbiter_tenant_policy_memory_bytes",
            "Memory the tenant's policy instances hold (limit: the plane's tenant memory budget).",
            self.tenant_memory.iter().map(|(tenant, account)| {
                (
                    vec![("tenant", tenant.as_str())],
                    GaugeValue::Int(account.used() as i64),
                )
            }),
        );
        // One name per job state, as the API names them.
        let states = JobStatus::ALL;
        e.gauge(
            "arbiter_jobs",
            "Jobs in the job table by state (ended ones until retention drops them).",
            states.map(|s| {
                (
                    vec![("state", s.name())],
                    GaugeValue::Int(self.count(s) as i64),
                )
            }),
        );
        e.counter(
            "arbiter_jobs_ended",
            "Jobs that ended since the plane started, by final state.",
            self.metrics
                .jobs_ended
                .iter()
                .map(|(state, n)| (vec![("state", *state)], *n)),
        );
        e.counter(
            "arbiter_jobs_dropped",
            "Ended jobs dropped from the job table and the store by retention.",
            [(vec![], self.metrics.jobs_dropped)],
        );
        e.gauge(
            "arbiter_gpu_allocation_ratio",
            "Allocated share of GPU capacity (0 to 1).",
            [(vec![], GaugeValue::Float(view.gpu_allocation_pct / 100.0))],
        );
        // Per tenant: GPUs its released jobs hold or claim, and its quota.
        let mut claimed: BTreeMap<&str, u64> = BTreeMap::new();
        for j in self.released() {
            *claimed.entry(j.tenant.as_str()).or_default() += u64::from(j.spec.gpus);
        }
        e.gauge(
            "arbiter_tenant_gpus",
            "GPUs a tenant's pending and running jobs ask for.",
            claimed
                .iter()
                .map(|(t, n)| (vec![("tenant", *t)], GaugeValue::Int(*n as i64))),
        );
        e.gauge(
            "arbiter_tenant_quota_gpus",
            "A tenant's GPU quota (0: none).",
            self.tenants.values().map(|t| {
                (
                    vec![("tenant", t.name.as_str())],
                    GaugeValue::Int(i64::from(t.quota_gpus)),
                )
            }),
        );
        let nodes = self.list_nodes();
        for (name, help, value) in [
            (
                "arbiter_node_gpus_free",
                "Idle GPUs on a node, by node and state.",
                (|n: &views::NodeView| n.gpus_free) as fn(&views::NodeView) -> u32,
            ),
            (
                "arbiter_node_gpus",
                "GPUs on a node, by node and state.",
                |n: &views::NodeView| n.gpus,
            ),
        ] {
            e.gauge(
                name,
                help,
                nodes.iter().map(|n| {
                    (
                        vec![("node", n.name.as_str()), ("state", n.status.name())],
                        GaugeValue::Int(i64::from(value(n))),
                    )
                }),
            );
        }
        let journal_bytes = crate::journal::disk_bytes(&self.data.join("journal.jsonl"));
        e.gauge(
            "arbiter_journal_bytes",
            "What the decision journal takes on disk (segments and stored snapshots).",
            [(vec![], GaugeValue::Int(journal_bytes as i64))],
        );
        if let Some(exp) = &self.experiment {
            // One metric per unit: seconds, ratios and counts never share a gauge.
            let status = self.status_of(exp);
            let mean = |x: &Estimate, scale: f64| GaugeValue::Float(x.mean * scale);
            fn arm_labels<'a>(
                experiment: &'a str,
                a: &'a views::ArmView,
            ) -> Vec<(&'static str, &'a str)> {
                vec![("experiment", experiment), ("arm", a.arm.as_str())]
            }
            let labels = |a| arm_labels(&exp.record.name, a);
            // (metric, help, which estimate, scale to the metric's unit)
            let gauges: [(&str, &str, ArmEstimate, f64); 5] = [
                (
                    "arbiter_experiment_queue_delay_seconds",
                    "Mean queue delay of an arm's enrolled jobs.",
                    |a| &a.queue_delay_ms,
                    1e-3,
                ),
                (
                    "arbiter_experiment_jct_seconds",
                    "Mean completion time of an arm's enrolled jobs.",
                    |a| &a.jct_ms,
                    1e-3,
                ),
                (
                    "arbiter_experiment_gpu_allocation_ratio",
                    "Mean allocated share of an arm's GPUs per round (0 to 1).",
                    |a| &a.gpu_allocation_pct,
                    1e-2,
                ),
                (
                    "arbiter_experiment_fragmentation_ratio",
                    "Mean stranded share of an arm's free GPU capacity per round (0 to 1).",
                    |a| &a.fragmentation_pct,
                    1e-2,
                ),
                (
                    "arbiter_experiment_policy_latency_seconds",
                    "Mean time in the arm's policy per round.",
                    |a| &a.policy_latency_ms,
                    1e-3,
                ),
            ];
            for (name, help, estimate, scale) in &gauges {
                e.gauge(
                    name,
                    help,
                    status
                        .arms
                        .iter()
                        .map(|a| (labels(a), mean(estimate(a), *scale))),
                );
            }
            e.counter(
                "arbiter_experiment_events",
                "Counts in an arm of the running experiment, by event.",
                status.arms.iter().flat_map(|a| {
                    [
                        ("enrolled", a.jobs_submitted),
                        ("started", a.jobs_started),
                        ("finished", a.jobs_finished),
                        ("preempted", a.preemptions),
                        ("slo_violation", a.slo_violations),
                        ("policy_fault", a.policy_faults),
                    ]
                    .map(|(event, n)| {
                        let mut l = labels(a);
                        l.push(("event", event));
                        (l, n)
                    })
                }),
            );
        }
        e.finish()
    }
}
