//! Host-side bindings of the contract versions the host serves, and their
//! conversions to the SDK model.
//!
//! * [`v0_3`]: the current contract, `wit/policy.wit`. The SDK model mirrors
//!   it field for field, so conversions move vectors and never reshape.
//! * [`v0_2`]: the previous minor, frozen in `wit/v0.2/policy.wit`. Its
//!   conversions are the adapter: the host's 0.3 state is lowered into the
//!   0.2 view, and a 0.2 policy's answers are lifted into 0.3 answers that
//!   the one `Plan` validates. Lowering keeps 0.2's meaning: a 0.2 mirror
//!   knows no sharing, so a GPU's use is guaranteed plus shared use (a 0.2
//!   policy never co-locates on purpose); quotas, health, the new metrics
//!   and GPU reservations are left out (0.2 has no words for a job holding
//!   GPUs: its mirror sees the job pending, and any answer it gives about
//!   it is checked by the 0.3 rules); new node-view fields are dropped. Lifting fills 0.3's new fields with their neutral values; a
//!   0.2 pairing names no GPU ([`LEGACY_PAIRING_GPU`]), and the matcher
//!   driver gives it the online job's first GPU.

/// `pairing.gpu` of a pairing from a 0.2 matcher, which names no GPU.
pub const LEGACY_PAIRING_GPU: u32 = u32::MAX;

/// `arbiter:policy@0.3.0`.
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy",
    });

    pub use arbiter::policy::types as wit;
    pub use exports::arbiter::policy as roles;

    mod conversions {
        use super::wit;
        arbiter_policy_sdk::wit_conversions!();
    }
}

/// `arbiter:policy@0.2.0`, served through the adapter below.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.2",
        world: "policy",
    });

    pub use arbiter::policy::types as wit;
    pub use exports::arbiter::policy as roles;

    mod conversions {
        use super::wit;
        use arbiter_policy_sdk::model;
        arbiter_policy_sdk::wit_conversions_shared!();
        arbiter_policy_sdk::__wit_lower_records! {
            NodeColumns { name, pool, state, cpu_milli, memory_mib, cpu_used_milli, memory_used_mib, first_gpu,
                gpu_count, on_loan }
            JobColumns { name, tenant, phase, kind, qos, priority, workers, min_workers, max_workers, cpu_milli,
                memory_mib, gpus_per_worker, gpu_milli, gpu_memory_mib, gpu_model_mask, submit_ms, estimate_ms,
                deadline_ms, checkpointed, started_ms, attained_ms, remaining_ms, remaining_workers, reported_ms }
            NodeSpec { name, pool, cpu_milli, memory_mib, gpu_model, gpu_memory_mib, gpu_count, on_loan }
            JobSpec { name, tenant, kind, qos, priority, workers, min_workers, max_workers, cpu_milli, memory_mib,
                gpus_per_worker, gpu_milli, gpu_memory_mib, gpu_model_mask, submit_ms, estimate_ms, deadline_ms,
                checkpointed }
            GpuMetric { gpu, utilization_pct, sm_activity_pct, memory_used_mib }
            WorkloadProfile { job, utilization_pct, sm_activity_pct, memory_mib, throughput }
            MatchRequest { epoch, online, offline, profiles }
            GpuStatus { index, utilization_pct, sm_activity_pct, sm_clock_mhz, max_sm_clock_mhz, memory_used_mib,
                memory_total_mib, health }
            WorkloadStatus { id, gpu, role, memory_used_mib, memory_limit_mib, compute_share, launches,
                pacing_delay_us, iteration_ms, frozen }
            NodeView { now_ms, gpus, workloads }
        }
        arbiter_policy_sdk::__wit_lift_records! {
            ReclaimPlan { nodes, decisions }
        }
        arbiter_policy_sdk::__wit_lift_variant! { Decision {
            Unreserve(a), Preempt(a);
            Place(a, b), Reserve(a, b), ScaleOut(a, b), ScaleIn(a, b), SetQos(a, b), Migrate(a, b)
        } }
        arbiter_policy_sdk::__wit_lift_variant! { NodeAction {
            Freeze(a), Resume(a), Evict(a);
            SetMemoryLimit(a, b), SetComputeShare(a, b), SetMpsThreadPct(a, b), SetHealth(a, b)
        } }

        impl From<wit::Pairing> for model::Pairing {
            fn from(p: wit::Pairing) -> Self {
                model::Pairing {
                    online: p.online,
                    offline: p.offline,
                    gpu: crate::runtime::bindings::LEGACY_PAIRING_GPU,
                    sm_percent: p.sm_percent,
                }
            }
        }

        impl From<model::GpuColumns> for wit::GpuColumns {
            fn from(c: model::GpuColumns) -> Self {
                // A 0.2 mirror charges every worker to one account: all use.
                let add = |a: Vec<u32>, b: &[u32]| -> Vec<u32> {
                    a.into_iter()
                        .zip(b.iter().copied().chain(std::iter::repeat(0)))
                        .map(|(x, y)| x.saturating_add(y))
                        .collect()
                };
                wit::GpuColumns {
                    milli_used: add(c.milli_used, &c.shared_milli),
                    memory_used_mib: add(c.memory_used_mib, &c.shared_memory_mib),
                    node: c.node,
                    model: c.model,
                    memory_mib: c.memory_mib,
                }
            }
        }

        impl From<model::Snapshot> for wit::Snapshot {
            fn from(s: model::Snapshot) -> Self {
                wit::Snapshot {
                    epoch: s.epoch,
                    now_ms: s.now_ms,
                    strings: s.strings,
                    gpu_models: s.gpu_models,
                    gpu_model_speed: s.gpu_model_speed,
                    nodes: s.nodes.into(),
                    gpus: s.gpus.into(),
                    jobs: s.jobs.into(),
                    placements: s.placements.into(),
                }
            }
        }

        /// The 0.2 form of an event, or `None` for what 0.2 cannot express.
        fn lower_event(e: model::Event) -> Option<wit::Event> {
            use model::Event as E;
            Some(match e {
                E::StringsAdded(a) => wit::Event::StringsAdded(a),
                E::GpuModelsAdded(a) => wit::Event::GpuModelsAdded(a),
                E::GpuModelSpeedChanged(a, b) => wit::Event::GpuModelSpeedChanged((a, b)),
                E::NodeAdded(a) => wit::Event::NodeAdded(a.into()),
                E::NodeStateChanged(a, b) => wit::Event::NodeStateChanged((a, b)),
                E::NodeLoanChanged(a, b) => wit::Event::NodeLoanChanged((a, b)),
                E::JobAdded(a) => wit::Event::JobAdded(a.into()),
                E::JobRemoved(a) => wit::Event::JobRemoved(a),
                E::JobPlaced(a, b) => {
                    wit::Event::JobPlaced((a, b.into_iter().map(Into::into).collect()))
                }
                E::JobEvicted(a) => wit::Event::JobEvicted(a),
                E::JobQosChanged(a, b) => wit::Event::JobQosChanged((a, b)),
                E::JobReserved(a, b) => wit::Event::JobReserved((a, b)),
                E::GpuMetrics(a) => wit::Event::GpuMetrics(a.into_iter().map(Into::into).collect()),
                E::JobProgress(a) => {
                    wit::Event::JobProgress(a.into_iter().map(Into::into).collect())
                }
                E::TenantQuotaChanged(..)
                | E::TenantQuotaRemoved(_)
                | E::SharingChanged(_)
                | E::GpuHealthChanged(..)
                | E::JobReservedGpus(..)
                | E::JobMetrics(_)
                | E::ServiceMetrics(_)
                | E::NodeMetrics(_) => return None,
            })
        }

        impl From<model::Delta> for wit::Delta {
            fn from(d: model::Delta) -> Self {
                wit::Delta {
                    base_epoch: d.base_epoch,
                    epoch: d.epoch,
                    now_ms: d.now_ms,
                    events: d.events.into_iter().filter_map(lower_event).collect(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::v0_2::wit as v2;
    use arbiter_policy_sdk::model::{self, Event, GpuColumns};

    /// A 0.2 mirror has one account: it sees guaranteed plus shared use, so
    /// a 0.2 policy never stacks guaranteed work on a GPU shared work uses.
    #[test]
    fn a_0_2_view_counts_shared_use_as_used() {
        let columns = GpuColumns {
            node: vec![0, 0],
            model: vec![1, 1],
            memory_mib: vec![32_768, 32_768],
            milli_used: vec![1000, 0],
            memory_used_mib: vec![30_720, 0],
            shared_milli: vec![1000, 500],
            shared_memory_mib: vec![3_584, 2_048],
            shared_workers: vec![1, 1],
            health: vec![1, 1],
        };
        let lowered: v2::GpuColumns = columns.into();
        assert_eq!(lowered.milli_used, vec![2000, 500]);
        assert_eq!(lowered.memory_used_mib, vec![34_304, 2_048]);
    }

    /// What 0.2 has no words for is left out of its deltas; what it has
    /// passes unchanged.
    #[test]
    fn a_0_2_delta_leaves_out_0_3_events() {
        let delta = model::Delta {
            base_epoch: 1,
            epoch: 2,
            now_ms: 5,
            events: vec![
                Event::TenantQuotaChanged(3, 1000),
                Event::GpuHealthChanged(0, model::health::UNHEALTHY),
                Event::JobReservedGpus(0, vec![1]),
                Event::JobEvicted(0),
                Event::SharingChanged(model::SharingRules::default()),
            ],
        };
        let lowered: v2::Delta = delta.into();
        assert_eq!(lowered.events.len(), 1);
        assert!(matches!(lowered.events[0], v2::Event::JobEvicted(0)));
    }
}
