//! Host-side bindings of the contract versions the host serves, and their
//! conversions to the SDK model.
//!
//! * [`v0_2`]: the current contract, `wit/policy.wit`. The SDK model mirrors
//!   it field for field, so conversions move vectors and never reshape.
//! * [`v0_1`]: the previous minor, frozen in `wit/v0.1/policy.wit`. Its
//!   conversions are the adapter: the host's 0.2 state is lowered into the
//!   0.1 view (new columns, events and fields left out), and the types both
//!   versions share convert as they are. A 0.1 policy's answers (decisions,
//!   plans, pairings, node actions, verdicts) have the same types in both
//!   versions, so they lift unchanged and are validated by the one `Plan`.

/// `arbiter:policy@0.2.0`.
pub mod v0_2 {
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

/// `arbiter:policy@0.1.0`, served through the adapter below.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1",
        world: "policy",
    });

    pub use arbiter::policy::types as wit;
    pub use exports::arbiter::policy as roles;

    mod conversions {
        use super::wit;
        use arbiter_policy_sdk::model;
        arbiter_policy_sdk::wit_conversions_shared!();

        impl From<model::JobColumns> for wit::JobColumns {
            fn from(c: model::JobColumns) -> Self {
                // 0.1 has no progress columns; its `estimate-ms` meant the
                // same (the estimate as submitted).
                wit::JobColumns {
                    name: c.name,
                    tenant: c.tenant,
                    phase: c.phase,
                    kind: c.kind,
                    qos: c.qos,
                    priority: c.priority,
                    workers: c.workers,
                    min_workers: c.min_workers,
                    max_workers: c.max_workers,
                    cpu_milli: c.cpu_milli,
                    memory_mib: c.memory_mib,
                    gpus_per_worker: c.gpus_per_worker,
                    gpu_milli: c.gpu_milli,
                    gpu_memory_mib: c.gpu_memory_mib,
                    gpu_model_mask: c.gpu_model_mask,
                    submit_ms: c.submit_ms,
                    estimate_ms: c.estimate_ms,
                    deadline_ms: c.deadline_ms,
                    checkpointed: c.checkpointed,
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
                    nodes: s.nodes.into(),
                    gpus: s.gpus.into(),
                    jobs: s.jobs.into(),
                    placements: s.placements.into(),
                }
            }
        }

        /// The 0.1 form of an event, or `None` for what 0.1 cannot express
        /// (GPU speeds, job progress): a 0.1 mirror never had those columns.
        pub(in crate::runtime) fn lower_event(e: model::Event) -> Option<wit::Event> {
            use model::Event as E;
            Some(match e {
                E::StringsAdded(a) => wit::Event::StringsAdded(a),
                E::GpuModelsAdded(models) => {
                    wit::Event::GpuModelsAdded(models.into_iter().map(|(name, _)| name).collect())
                }
                E::GpuModelSpeedChanged(..) | E::JobProgress(_) => return None,
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

        impl From<model::ReclaimRequest> for wit::ReclaimRequest {
            fn from(r: model::ReclaimRequest) -> Self {
                // 0.1 has no limit field; the host still enforces it on the plan.
                wit::ReclaimRequest {
                    epoch: r.epoch,
                    candidates: r.candidates,
                    count: r.count,
                }
            }
        }
    }
}
