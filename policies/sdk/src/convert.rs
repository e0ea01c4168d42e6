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

/// Implements `From` both ways between `$crate::model` and a generated
/// `types` module of the current contract that must be in scope as `wit` at
/// the call site.
#[macro_export]
macro_rules! wit_conversions {
    () => {
        $crate::wit_conversions_shared!();
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
            JobSpec { name, tenant, kind, qos, priority, workers, min_workers, max_workers, cpu_milli, memory_mib,
                gpus_per_worker, gpu_milli, gpu_memory_mib, gpu_model_mask, submit_ms, estimate_ms, deadline_ms,
                checkpointed, gpu_milli_limit, locality, slo_ms, group }
            GpuMetric { gpu, utilization_pct, sm_activity_pct, memory_used_mib, sm_occupancy_pct }
            JobMetric { job, iteration_ms, peak_memory_mib, min_memory_mib, host_memory_mib, utilization_pct,
                sm_activity_pct }
            ServiceMetric { job, requests_per_s, p50_latency_ms, p99_latency_ms }
            NodeMetric { node, cpu_utilization_pct, host_memory_used_mib, swap_in_per_s }
            Delta { base_epoch, epoch, now_ms, events }
            ReclaimPlan { nodes, decisions }
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
        $crate::__wit_variant! { NodeAction {
            Freeze(a), Resume(a), Evict(a), RestartMps(a);
            SetMemoryLimit(a, b), SetComputeShare(a, b), SetMpsThreadPct(a, b), SetHealth(a, b)
        } }
    };
}

/// The conversions of the types contract 0.2 and 0.3 share, field for field.
/// [`wit_conversions!`](crate::wit_conversions) uses them; the host's 0.2
/// adapter uses them alone and writes the changed types' conversions itself.
#[macro_export]
macro_rules! wit_conversions_shared {
    () => {
        $crate::__wit_records! {
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
        $crate::__wit_variant! { PolicyError { Stale(a), Unsupported(a), Failed(a); } }
    };
}

/// For an adapter of an older contract: `From<model>` for the old record
/// with the listed fields (the model's other fields are left out).
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

/// For an adapter of an older contract: `From<old record>` for the model,
/// with the listed fields and the model's defaults for the others.
#[doc(hidden)]
#[macro_export]
macro_rules! __wit_lift_records {
    ($( $name:ident { $($field:ident),* $(,)? } )*) => { $(
        impl From<wit::$name> for $crate::model::$name {
            // Records whose fields did not change list them all.
            #[allow(clippy::needless_update)]
            fn from(v: wit::$name) -> Self {
                $crate::model::$name {
                    $($field: $crate::convert::Conv::conv(v.$field),)*
                    ..Default::default()
                }
            }
        }
        impl $crate::convert::Conv<$crate::model::$name> for wit::$name {
            fn conv(self) -> $crate::model::$name { self.into() }
        }
    )* };
}

/// For an adapter of an older contract: `From<old variant>` for the model's
/// (a superset of its cases).
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
