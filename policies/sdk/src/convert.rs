//! Conversions between [`crate::model`] and generated WIT bindings.
//!
//! Both `wit-bindgen` (in guests) and `wasmtime::component::bindgen!` (in the
//! host) generate types named and shaped exactly like the WIT. The macro
//! [`wit_conversions!`](crate::wit_conversions) writes the `From` impls in
//! both directions once, for whichever generated module `wit` names at the
//! call site, so the guest and the host cannot disagree on a field.

/// Field-level conversion used by [`wit_conversions!`](crate::wit_conversions).
pub trait Conv<T> {
    fn conv(self) -> T;
}

macro_rules! identity_conv {
    ($($t:ty),*) => { $(impl Conv<$t> for $t { #[inline] fn conv(self) -> $t { self } })* };
}
identity_conv!(
    u8,
    u16,
    u32,
    u64,
    i32,
    i64,
    f32,
    f64,
    bool,
    String,
    (u32, u32)
);

impl<A: Conv<B>, B> Conv<Vec<B>> for Vec<A> {
    #[inline]
    fn conv(self) -> Vec<B> {
        self.into_iter().map(Conv::conv).collect()
    }
}

/// Implements the conversions between `$crate::model` and a generated
/// `types` module of the current contract (0.4) that must be in scope as
/// `wit` at the call site.
///
/// Records convert field for field with `From`, both ways. Two streams
/// change shape at the boundary: the model's one `JobAdded` per arrival
/// crosses as `jobs-added` columns, and a scheduler's `Place` decisions may
/// cross as one `place-batch`. So deltas, decision lists and reclaim plans
/// convert through functions, not `From`, and the direction that expands
/// columns back into per-job items checks them and can fail:
///
/// * `lower_delta` (host → guest): runs of `JobAdded` become one
///   `jobs-added`; `apply_events` (in the guest) writes them into the
///   mirror's columns as they came;
/// * `lower_decisions` (guest → host): runs of two or more `Place` become
///   one `place-batch`; `lift_decisions` (in the host) expands them back;
///   `lower_reclaim_plan` / `lift_reclaim_plan` do the same for a plan's
///   decisions.
#[macro_export]
macro_rules! wit_conversions {
    () => {
        $crate::wit_conversions_shared!();
        $crate::__wit_variant! { Event @partial(lower_event, lift_event) {
            StringsAdded(a), GpuModelsAdded(a), NodeAdded(a), JobRemoved(a), JobEvicted(a),
            GpuMetrics(a), JobProgress(a), TenantQuotaRemoved(a), SharingChanged(a), JobMetrics(a),
            ServiceMetrics(a), NodeMetrics(a);
            GpuModelSpeedChanged(a, b), NodeStateChanged(a, b), NodeLoanChanged(a, b), JobPlaced(a, b),
            JobQosChanged(a, b), JobReserved(a, b), TenantQuotaChanged(a, b), GpuHealthChanged(a, b),
            JobReservedGpus(a, b)
        } }
        $crate::__wit_variant! { Decision @partial(lower_decision, lift_decision) {
            Unreserve(a), Preempt(a);
            Place(a, b), Reserve(a, b), ScaleOut(a, b), ScaleIn(a, b), SetQos(a, b), Migrate(a, b),
            ReserveGpus(a, b)
        } }

        /// The 0.4 form of a delta: each run of arrivals as one `jobs-added`.
        #[allow(dead_code)]
        pub fn lower_delta(d: $crate::model::Delta) -> wit::Delta {
            let mut events = Vec::with_capacity(d.events.len());
            let mut arrivals: Option<$crate::model::JobColumns> = None;
            for e in d.events {
                if let $crate::model::Event::JobAdded(spec) = &e {
                    arrivals.get_or_insert_with(Default::default).push_arrival(spec);
                    continue;
                }
                if let Some(columns) = arrivals.take() {
                    events.push(wit::Event::JobsAdded(columns.into()));
                }
                // Every case but `JobAdded`, handled above.
                if let Some(e) = lower_event(e) {
                    events.push(e);
                }
            }
            if let Some(columns) = arrivals {
                events.push(wit::Event::JobsAdded(columns.into()));
            }
            wit::Delta { base_epoch: d.base_epoch, epoch: d.epoch, now_ms: d.now_ms, events }
        }

        /// Applies a 0.4 delta's events to a mirror, in order: `jobs-added`
        /// straight into its columns ([`Cluster::add_jobs`](crate::Cluster::add_jobs)),
        /// the rest as model events. The epoch is the caller's to move.
        #[allow(dead_code)]
        pub fn apply_events(
            cluster: &mut $crate::Cluster,
            events: Vec<wit::Event>,
        ) -> Result<(), $crate::MirrorError> {
            for event in events {
                match event {
                    wit::Event::JobsAdded(columns) => cluster.add_jobs(&columns.into())?,
                    other => {
                        if let Some(event) = lift_event(other) {
                            cluster.apply_event(&event)?;
                        }
                    }
                }
            }
            Ok(())
        }

        /// The 0.4 form of a decision list: each run of two or more `Place`
        /// that a batch can carry ([`PlacementColumns::push_job`]) as one
        /// `place-batch`, the rest as they are, so that [`lift_decisions`]
        /// gives back exactly this list.
        ///
        /// [`PlacementColumns::push_job`]: $crate::model::PlacementColumns::push_job
        #[allow(dead_code)]
        pub fn lower_decisions(decisions: Vec<$crate::model::Decision>) -> Vec<wit::Decision> {
            use $crate::model::{Decision, PlacementColumns};
            let mut out: Vec<wit::Decision> = Vec::with_capacity(decisions.len());
            // The batch being built and the decisions in it (a run of one goes as a `place`).
            let mut batch = PlacementColumns::default();
            let mut run: Vec<Decision> = Vec::new();
            let flush = |batch: &mut PlacementColumns, run: &mut Vec<Decision>, out: &mut Vec<wit::Decision>| {
                let columns = std::mem::take(batch);
                if run.len() < 2 {
                    out.extend(run.drain(..).filter_map(lower_decision));
                } else {
                    run.clear();
                    out.push(wit::Decision::PlaceBatch(columns.into()));
                }
            };
            for d in decisions {
                if let Decision::Place(job, workers) = &d {
                    if batch.push_job(*job, workers) {
                        run.push(d);
                        continue;
                    }
                    // Not in this batch (the same job twice in a row): maybe in a new one.
                    flush(&mut batch, &mut run, &mut out);
                    if batch.push_job(*job, workers) {
                        run.push(d);
                        continue;
                    }
                } else {
                    flush(&mut batch, &mut run, &mut out);
                }
                out.extend(lower_decision(d));
            }
            flush(&mut batch, &mut run, &mut out);
            out
        }

        /// The model form of a 0.4 decision list: a `place-batch` as one
        /// `Place` per run of its rows. `Err` when its columns are malformed.
        #[allow(dead_code)]
        pub fn lift_decisions(decisions: Vec<wit::Decision>) -> Result<Vec<$crate::model::Decision>, String> {
            let mut out = Vec::with_capacity(decisions.len());
            for d in decisions {
                match d {
                    wit::Decision::PlaceBatch(columns) => {
                        let columns: $crate::model::PlacementColumns = columns.into();
                        let runs = columns.job_runs().map_err(|e| format!("`place-batch`: {e}"))?;
                        out.extend(runs.into_iter().map(|(job, w)| $crate::model::Decision::Place(job, w)));
                    }
                    other => out.extend(lift_decision(other)),
                }
            }
            Ok(out)
        }

        #[allow(dead_code)]
        pub fn lower_reclaim_plan(p: $crate::model::ReclaimPlan) -> wit::ReclaimPlan {
            wit::ReclaimPlan { nodes: p.nodes, decisions: lower_decisions(p.decisions) }
        }

        #[allow(dead_code)]
        pub fn lift_reclaim_plan(p: wit::ReclaimPlan) -> Result<$crate::model::ReclaimPlan, String> {
            Ok($crate::model::ReclaimPlan { nodes: p.nodes, decisions: lift_decisions(p.decisions)? })
        }
    };
}

/// The conversions of contract 0.3 (served by the host through its adapter):
/// the types 0.3 and 0.4 share, plus 0.3's own one-`job-added`-per-job
/// events and `place`-only decisions, all with `From`, field for field and
/// case for case. The model is 0.3's shape for these streams, so lowering
/// and lifting never reshape.
#[macro_export]
macro_rules! wit_conversions_v0_3 {
    () => {
        $crate::wit_conversions_shared!();
        $crate::__wit_records! {
            JobSpec { name, tenant, kind, qos, priority, workers, min_workers, max_workers, cpu_milli, memory_mib,
                gpus_per_worker, gpu_milli, gpu_memory_mib, gpu_model_mask, submit_ms, estimate_ms, deadline_ms,
                checkpointed, gpu_milli_limit, locality, slo_ms, group }
            Delta { base_epoch, epoch, now_ms, events }
            ReclaimPlan { nodes, decisions }
        }
        $crate::__wit_variant! { Event {
            StringsAdded(a), GpuModelsAdded(a), NodeAdded(a), JobAdded(a), JobRemoved(a), JobEvicted(a),
            GpuMetrics(a), JobProgress(a), TenantQuotaRemoved(a), SharingChanged(a), JobMetrics(a),
            ServiceMetrics(a), NodeMetrics(a);
            GpuModelSpeedChanged(a, b), NodeStateChanged(a, b), NodeLoanChanged(a, b), JobPlaced(a, b),
            JobQosChanged(a, b), JobReserved(a, b), TenantQuotaChanged(a, b), GpuHealthChanged(a, b),
            JobReservedGpus(a, b)
        } }
        $crate::__wit_variant! { Decision {
            Unreserve(a), Preempt(a);
            Place(a, b), Reserve(a, b), ScaleOut(a, b), ScaleIn(a, b), SetQos(a, b), Migrate(a, b),
            ReserveGpus(a, b)
        } }

        /// 0.3's decisions are the model's, case for case.
        #[allow(dead_code)]
        pub fn lift_decisions(decisions: Vec<wit::Decision>) -> Result<Vec<$crate::model::Decision>, String> {
            Ok(decisions.into_iter().map(Into::into).collect())
        }

        #[allow(dead_code)]
        pub fn lift_reclaim_plan(p: wit::ReclaimPlan) -> Result<$crate::model::ReclaimPlan, String> {
            Ok(p.into())
        }

        #[allow(dead_code)]
        pub fn lower_delta(d: $crate::model::Delta) -> wit::Delta {
            d.into()
        }
    };
}

/// The conversions of the types contract 0.3 and 0.4 share, field for field.
#[macro_export]
macro_rules! wit_conversions_shared {
    () => {
        $crate::__wit_records! {
            NodeColumns { name, pool, state, cpu_milli, memory_mib, cpu_used_milli, memory_used_mib, first_gpu,
                gpu_count, on_loan, fabric }
            GpuColumns { node, model, memory_mib, milli_used, memory_used_mib, shared_milli, shared_memory_mib,
                shared_workers, health }
            JobColumns { name, tenant, phase, kind, qos, priority, workers, min_workers, max_workers, cpu_milli,
                memory_mib, gpus_per_worker, gpu_milli, gpu_memory_mib, gpu_model_mask, submit_ms, estimate_ms,
                deadline_ms, checkpointed, started_ms, attained_ms, remaining_ms, remaining_workers, reported_ms,
                gpu_milli_limit, locality, slo_ms, group }
            SharingRules { oversub_milli, max_shared_workers, host_spill }
            TenantColumns { name, gpu_quota_milli }
            Reservation { job, nodes, gpus }
            Snapshot { epoch, now_ms, strings, gpu_models, gpu_model_speed, sharing, tenants, metric_window_ms,
                nodes, gpus, jobs, placements, reservations }
            NodeSpec { name, pool, cpu_milli, memory_mib, gpu_model, gpu_memory_mib, gpu_count, on_loan, fabric }
            GpuMetric { gpu, utilization_pct, sm_activity_pct, memory_used_mib, sm_occupancy_pct }
            JobMetric { job, iteration_ms, peak_memory_mib, min_memory_mib, host_memory_mib, utilization_pct,
                sm_activity_pct }
            ServiceMetric { job, requests_per_s, p50_latency_ms, p99_latency_ms }
            NodeMetric { node, cpu_utilization_pct, host_memory_used_mib, swap_in_per_s }
            WorkloadProfile { job, utilization_pct, sm_activity_pct, memory_mib, throughput, sm_occupancy_pct,
                solo_iteration_ms }
            MatchRequest { epoch, online, offline, profiles }
            Pairing { online, offline, gpu, sm_percent }
            GpuStatus { index, utilization_pct, sm_activity_pct, sm_clock_mhz, max_sm_clock_mhz, memory_used_mib,
                memory_total_mib, health, observed_ok, xid_errors, throttle_reasons, power_mw, temperature_c }
            WorkloadStatus { id, gpu, role, memory_used_mib, memory_limit_mib, compute_share, launches,
                pacing_delay_us, iteration_ms, frozen, job, qos, request_permille, limit_permille, quota_denials,
                memory_unseen_mib }
            NodeView { now_ms, gpus, workloads, monotonic_ms, host_memory_used_mib, host_memory_total_mib,
                swap_in_per_s, cpu_utilization_pct }
            WorkerPlacement { node, gpus }
            PlacementColumns { job, node, gpu_start, gpu_len, gpus }
            RoundInfo { epoch, now_ms, max_decisions }
            ReclaimRequest { epoch, candidates, count, max_decisions }
            JobProgress { job, started_ms, attained_ms, remaining_ms, remaining_workers, reported_ms }
            TenantJob { position, name, gpus, priority, submit_ms, estimate_ms, deadline_ms, running }
            TenantView { now_ms, tenant, gpu_quota, gpus_in_use, jobs }
            TenantVerdict { order, hold }
            Manifest { name, version, roles, description, default_config }
        }
        $crate::__wit_variant! { NodeAction {
            Freeze(a), Resume(a), Evict(a), RestartMps(a);
            SetMemoryLimit(a, b), SetComputeShare(a, b), SetMpsThreadPct(a, b), SetHealth(a, b)
        } }
        $crate::__wit_variant! { PolicyError { Stale(a), Unsupported(a), Failed(a); } }
    };
}

/// `From<model>` for a record with the listed fields.
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_lower_records {
    ($( $name:ident { $($field:ident),* $(,)? } )*) => { $(
        impl From<$crate::model::$name> for wit::$name {
            fn from(v: $crate::model::$name) -> Self {
                wit::$name { $($field: $crate::convert::Conv::conv(v.$field)),* }
            }
        }
        impl $crate::convert::Conv<wit::$name> for $crate::model::$name {
            fn conv(self) -> wit::$name { self.into() }
        }
    )* };
}

/// `From<wit variant>` for the model's (a superset of its cases).
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_lift_variant {
    ($name:ident { $($one:ident($a:ident)),* ; $($two:ident($x:ident, $y:ident)),* $(,)? }) => {
        impl From<wit::$name> for $crate::model::$name {
            fn from(v: wit::$name) -> Self {
                match v {
                    $(wit::$name::$one($a) => $crate::model::$name::$one($crate::convert::Conv::conv($a)),)*
                    $(wit::$name::$two(($x, $y)) => $crate::model::$name::$two(
                        $crate::convert::Conv::conv($x), $crate::convert::Conv::conv($y)
                    ),)*
                }
            }
        }
        impl $crate::convert::Conv<$crate::model::$name> for wit::$name {
            fn conv(self) -> $crate::model::$name { self.into() }
        }
    };
}

/// Records both ways, field for field: the lowering above plus a lift that
/// names every field (so a field added to the model but not to the WIT, or
/// the other way round, does not compile).
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_records {
    ($( $name:ident { $($field:ident),* $(,)? } )*) => {
        $crate::__wit_lower_records! { $( $name { $($field),* } )* }
        $(
            impl From<wit::$name> for $crate::model::$name {
                fn from(v: wit::$name) -> Self {
                    $crate::model::$name { $($field: $crate::convert::Conv::conv(v.$field)),* }
                }
            }
            impl $crate::convert::Conv<$crate::model::$name> for wit::$name {
                fn conv(self) -> $crate::model::$name { self.into() }
            }
        )*
    };
}

/// Variants both ways: one-payload cases before `;`, two-payload (tuple)
/// cases after. The lift is [`__wit_lift_variant!`](crate::__wit_lift_variant).
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_variant {
    // The cases both sides have, as two functions (`None` for a case the
    // other side lacks: the caller reshapes those).
    ($name:ident @partial($lower:ident, $lift:ident) {
        $($one:ident($a:ident)),* ; $($two:ident($x:ident, $y:ident)),* $(,)?
    }) => {
        #[allow(dead_code, unreachable_patterns)]
        fn $lower(v: $crate::model::$name) -> Option<wit::$name> {
            Some(match v {
                $($crate::model::$name::$one($a) => wit::$name::$one($crate::convert::Conv::conv($a)),)*
                $($crate::model::$name::$two($x, $y) => wit::$name::$two((
                    $crate::convert::Conv::conv($x), $crate::convert::Conv::conv($y)
                )),)*
                _ => return None,
            })
        }
        #[allow(dead_code, unreachable_patterns)]
        fn $lift(v: wit::$name) -> Option<$crate::model::$name> {
            Some(match v {
                $(wit::$name::$one($a) => $crate::model::$name::$one($crate::convert::Conv::conv($a)),)*
                $(wit::$name::$two(($x, $y)) => $crate::model::$name::$two(
                    $crate::convert::Conv::conv($x), $crate::convert::Conv::conv($y)
                ),)*
                _ => return None,
            })
        }
    };
    ($name:ident { $($one:ident($a:ident)),* ; $($two:ident($x:ident, $y:ident)),* $(,)? }) => {
        impl From<$crate::model::$name> for wit::$name {
            fn from(v: $crate::model::$name) -> Self {
                match v {
                    $($crate::model::$name::$one($a) => wit::$name::$one($crate::convert::Conv::conv($a)),)*
                    $($crate::model::$name::$two($x, $y) => wit::$name::$two((
                        $crate::convert::Conv::conv($x), $crate::convert::Conv::conv($y)
                    )),)*
                }
            }
        }
        impl $crate::convert::Conv<wit::$name> for $crate::model::$name {
            fn conv(self) -> wit::$name { self.into() }
        }
        $crate::__wit_lift_variant! { $name { $($one($a)),* ; $($two($x, $y)),* } }
    };
}
