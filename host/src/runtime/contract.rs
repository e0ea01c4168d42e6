//! The contract versions a component may be built against, behind one API.
//!
//! The host serves the current minor (`0.4`) and the previous one (`0.3`,
//! through the adapter in [`super::bindings::v0_3`]). At load,
//! [`ContractIndices::find`] looks for `meta@0.4.x` first, then `meta@0.3.x`;
//! from then on an instance's calls take and return SDK model types whatever
//! its version, so the round driver, the validator and the journal have one
//! path. Anything else is refused with an error naming every version served.

use super::engine::HostState;
use arbiter_policy_sdk::model::*;
use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre};

/// Contract versions the host serves, newest first.
pub const SERVED_VERSIONS: [&str; 2] = ["0.4.0", "0.3.0"];

/// An answer the conversions could not read (a malformed `place-batch`):
/// the policy's own failure, handled like any other.
fn malformed(why: String) -> PolicyError {
    PolicyError::Failed(format!("malformed answer: {why}"))
}

/// A guest call's outcome: a trap or host error outside, the policy's own
/// answer inside.
pub(crate) type Call<T> = wasmtime::Result<Result<T, PolicyError>>;

/// Generates, for one version's bindings module, the role indices found at
/// load and the loaded exports, with calls in SDK model types.
macro_rules! versioned {
    ($m:ident = $v:ident) => {
        pub(crate) mod $m {
            use super::*;
            use crate::runtime::bindings::$v::{
                lift_decisions, lift_reclaim_plan, lower_delta, roles, wit,
            };

            #[derive(Clone)]
            pub(crate) struct Indices {
                meta: roles::meta::GuestIndices,
                sync: Option<roles::sync::GuestIndices>,
                scheduler: Option<roles::scheduler::GuestIndices>,
                reclaim: Option<roles::reclaim::GuestIndices>,
                matcher: Option<roles::matcher::GuestIndices>,
                coordinator: Option<roles::coordinator::GuestIndices>,
                tenant: Option<roles::tenant::GuestIndices>,
            }

            pub(crate) struct Exports {
                meta: roles::meta::Guest,
                sync: Option<roles::sync::Guest>,
                scheduler: Option<roles::scheduler::Guest>,
                reclaim: Option<roles::reclaim::Guest>,
                matcher: Option<roles::matcher::Guest>,
                coordinator: Option<roles::coordinator::Guest>,
                tenant: Option<roles::tenant::Guest>,
            }

            fn lift<T, W: Into<T>>(r: wasmtime::Result<Result<W, wit::PolicyError>>) -> Call<T> {
                r.map(|inner| inner.map(Into::into).map_err(Into::into))
            }

            /// A decision list: how it crosses is the version's business, and
            /// a malformed one is the policy's fault.
            fn lift_decision_list(
                r: wasmtime::Result<Result<Vec<wit::Decision>, wit::PolicyError>>,
            ) -> Call<Vec<Decision>> {
                r.map(|inner| {
                    inner
                        .map_err(Into::into)
                        .and_then(|d| lift_decisions(d).map_err(malformed))
                })
            }

            fn lift_list<T, W: Into<T>>(
                r: wasmtime::Result<Result<Vec<W>, wit::PolicyError>>,
            ) -> Call<Vec<T>> {
                r.map(|inner| {
                    inner
                        .map(|list| list.into_iter().map(Into::into).collect())
                        .map_err(Into::into)
                })
            }

            impl Indices {
                /// `Err` when the component does not export this version's `meta`.
                pub(crate) fn new(pre: &InstancePre<HostState>) -> wasmtime::Result<Self> {
                    Ok(Indices {
                        meta: roles::meta::GuestIndices::new(pre)?,
                        sync: roles::sync::GuestIndices::new(pre).ok(),
                        scheduler: roles::scheduler::GuestIndices::new(pre).ok(),
                        reclaim: roles::reclaim::GuestIndices::new(pre).ok(),
                        matcher: roles::matcher::GuestIndices::new(pre).ok(),
                        coordinator: roles::coordinator::GuestIndices::new(pre).ok(),
                        tenant: roles::tenant::GuestIndices::new(pre).ok(),
                    })
                }

                pub(crate) fn exports(&self, role: Role) -> bool {
                    match role {
                        Role::Scheduler => self.scheduler.is_some() && self.sync.is_some(),
                        Role::Reclaim => self.reclaim.is_some() && self.sync.is_some(),
                        Role::Matcher => self.matcher.is_some() && self.sync.is_some(),
                        Role::Coordinator => self.coordinator.is_some(),
                        Role::Tenant => self.tenant.is_some(),
                    }
                }

                pub(crate) fn load(
                    &self,
                    store: &mut Store<HostState>,
                    instance: &Instance,
                ) -> wasmtime::Result<Exports> {
                    macro_rules! opt {
                        ($f:ident) => {
                            self.$f
                                .as_ref()
                                .map(|i| i.load(&mut *store, instance))
                                .transpose()?
                        };
                    }
                    Ok(Exports {
                        meta: self.meta.load(&mut *store, instance)?,
                        sync: opt!(sync),
                        scheduler: opt!(scheduler),
                        reclaim: opt!(reclaim),
                        matcher: opt!(matcher),
                        coordinator: opt!(coordinator),
                        tenant: opt!(tenant),
                    })
                }
            }

            /// Each call is `None` when the role is not exported.
            impl Exports {
                pub(crate) fn describe(
                    &self,
                    store: &mut Store<HostState>,
                ) -> wasmtime::Result<Manifest> {
                    self.meta.call_describe(store).map(Into::into)
                }
                pub(crate) fn configure(
                    &self,
                    store: &mut Store<HostState>,
                    config: &str,
                ) -> Call<()> {
                    lift(self.meta.call_configure(store, config))
                }
                pub(crate) fn resync(
                    &self,
                    store: &mut Store<HostState>,
                    snapshot: Snapshot,
                ) -> Option<Call<()>> {
                    let s: wit::Snapshot = snapshot.into();
                    Some(lift(self.sync.as_ref()?.call_resync(store, &s)))
                }
                pub(crate) fn apply(
                    &self,
                    store: &mut Store<HostState>,
                    delta: Delta,
                ) -> Option<Call<()>> {
                    let d = lower_delta(delta);
                    Some(lift(self.sync.as_ref()?.call_apply(store, &d)))
                }
                pub(crate) fn schedule(
                    &self,
                    store: &mut Store<HostState>,
                    round: RoundInfo,
                ) -> Option<Call<Vec<Decision>>> {
                    let r = self.scheduler.as_ref()?.call_schedule(store, round.into());
                    Some(lift_decision_list(r))
                }
                pub(crate) fn reclaim(
                    &self,
                    store: &mut Store<HostState>,
                    request: ReclaimRequest,
                ) -> Option<Call<ReclaimPlan>> {
                    let r: wit::ReclaimRequest = request.into();
                    let r = self.reclaim.as_ref()?.call_reclaim(store, &r);
                    Some(r.map(|inner| {
                        inner
                            .map_err(Into::into)
                            .and_then(|p| lift_reclaim_plan(p).map_err(malformed))
                    }))
                }
                pub(crate) fn match_workloads(
                    &self,
                    store: &mut Store<HostState>,
                    request: MatchRequest,
                ) -> Option<Call<Vec<Pairing>>> {
                    let r: wit::MatchRequest = request.into();
                    Some(lift_list(
                        self.matcher.as_ref()?.call_match_workloads(store, &r),
                    ))
                }
                pub(crate) fn tick(
                    &self,
                    store: &mut Store<HostState>,
                    view: NodeView,
                ) -> Option<Call<Vec<NodeAction>>> {
                    let v: wit::NodeView = view.into();
                    Some(lift_list(self.coordinator.as_ref()?.call_tick(store, &v)))
                }
                pub(crate) fn order(
                    &self,
                    store: &mut Store<HostState>,
                    view: TenantView,
                ) -> Option<Call<TenantVerdict>> {
                    let v: wit::TenantView = view.into();
                    Some(lift(self.tenant.as_ref()?.call_order(store, &v)))
                }
            }
        }
    };
}

versioned!(serve_v0_4 = v0_4);
versioned!(serve_v0_3 = v0_3);

/// The roles a component exports, under the contract version it was built for.
#[derive(Clone)]
pub(crate) enum ContractIndices {
    V0_4(serve_v0_4::Indices),
    V0_3(serve_v0_3::Indices),
}

/// A loaded instance's exports, under its contract version.
pub(crate) enum ContractExports {
    V0_4(serve_v0_4::Exports),
    V0_3(serve_v0_3::Exports),
}

impl ContractIndices {
    /// The newest served version the component exports `meta` of; the
    /// error says what it exports instead.
    pub(crate) fn find(pre: &InstancePre<HostState>, exported: &[&String]) -> Result<Self, String> {
        match serve_v0_4::Indices::new(pre) {
            Ok(i) => Ok(ContractIndices::V0_4(i)),
            Err(newest) => match serve_v0_3::Indices::new(pre) {
                Ok(i) => Ok(ContractIndices::V0_3(i)),
                Err(_) => {
                    let served: Vec<String> = SERVED_VERSIONS
                        .iter()
                        .map(|v| format!("`arbiter:policy/meta@{v}`"))
                        .collect();
                    Err(format!(
                        "component does not export {} (wrong world or contract version; it exports {exported:?}): {newest}",
                        served.join(" or ")
                    ))
                }
            },
        }
    }

    /// The contract version the component was built against.
    pub(crate) fn version(&self) -> &'static str {
        match self {
            ContractIndices::V0_4(_) => SERVED_VERSIONS[0],
            ContractIndices::V0_3(_) => SERVED_VERSIONS[1],
        }
    }

    pub(crate) fn exports(&self, role: Role) -> bool {
        match self {
            ContractIndices::V0_4(i) => i.exports(role),
            ContractIndices::V0_3(i) => i.exports(role),
        }
    }

    pub(crate) fn load(
        &self,
        store: &mut Store<HostState>,
        instance: &Instance,
    ) -> wasmtime::Result<ContractExports> {
        Ok(match self {
            ContractIndices::V0_4(i) => ContractExports::V0_4(i.load(store, instance)?),
            ContractIndices::V0_3(i) => ContractExports::V0_3(i.load(store, instance)?),
        })
    }
}

/// Forwards a call to whichever version's exports an instance has.
macro_rules! forward {
    ($( $name:ident($($arg:ident: $ty:ty),*) -> $out:ty; )*) => {
        impl ContractExports {
            $(
                pub(crate) fn $name(&self, store: &mut Store<HostState>, $($arg: $ty),*) -> $out {
                    match self {
                        ContractExports::V0_4(e) => e.$name(store, $($arg),*),
                        ContractExports::V0_3(e) => e.$name(store, $($arg),*),
                    }
                }
            )*
        }
    };
}

forward! {
    describe() -> wasmtime::Result<Manifest>;
    configure(config: &str) -> Call<()>;
    resync(snapshot: Snapshot) -> Option<Call<()>>;
    apply(delta: Delta) -> Option<Call<()>>;
    schedule(round: RoundInfo) -> Option<Call<Vec<Decision>>>;
    reclaim(request: ReclaimRequest) -> Option<Call<ReclaimPlan>>;
    match_workloads(request: MatchRequest) -> Option<Call<Vec<Pairing>>>;
    tick(view: NodeView) -> Option<Call<Vec<NodeAction>>>;
    order(view: TenantView) -> Option<Call<TenantVerdict>>;
}
