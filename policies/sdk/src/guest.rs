//! The component side: WIT bindings and the exports that forward to a [`Runtime`].
//!
//! Compiled only for `wasm32`. A policy crate calls
//! [`export_policy!`](crate::export_policy); everything here is reached
//! through that macro.

use crate::model;
use crate::runtime::{Policy, Runtime};
use core::any::Any;
use core::cell::RefCell;
use core::marker::PhantomData;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "export_policy_world",
        default_bindings_module: "arbiter_policy_sdk::guest::bindings",
    });
}

use bindings::arbiter::policy::types as wit;
use bindings::exports::arbiter::policy as exports;

crate::wit_conversions!();

thread_local! {
    // One policy per component; a component instance is single-threaded.
    static RUNTIME: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Installs, once per instance, a panic hook that tells the host what
/// panicked and where — an error-level [`log`] line, which the host quotes in
/// the trap's fault — before the instance traps. std's default hook reads
/// `RUST_BACKTRACE` first, and the sandbox gives a policy no environment:
/// that read traps inside the hook, and the panic's message was lost.
fn report_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let message = info
                .payload_as_str()
                .unwrap_or("(a panic without a message)");
            let text = match info.location() {
                Some(at) => format!(
                    "panicked at {}:{}:{}: {message}",
                    at.file(),
                    at.line(),
                    at.column()
                ),
                None => format!("panicked: {message}"),
            };
            log(crate::LogLevel::Error, &text);
        }));
    });
}

fn with_runtime<P: Policy, R>(f: impl FnOnce(&mut Runtime<P>) -> R) -> R {
    report_panics();
    RUNTIME.with(|cell| {
        let taken = cell.borrow_mut().take();
        let mut runtime = match taken.and_then(|b| b.downcast::<Runtime<P>>().ok()) {
            Some(runtime) => runtime,
            None => Box::new(Runtime::<P>::new()),
        };
        let out = f(&mut runtime);
        *cell.borrow_mut() = Some(runtime);
        out
    })
}

/// The type the generated export macro is given: forwards every export to `Runtime<P>`.
#[doc(hidden)]
pub struct Export<P>(PhantomData<P>);

fn result<T, U: From<T>>(r: Result<T, model::PolicyError>) -> Result<U, wit::PolicyError> {
    r.map(Into::into).map_err(Into::into)
}

impl<P: Policy> exports::meta::Guest for Export<P> {
    fn describe() -> wit::Manifest {
        report_panics();
        P::manifest().into()
    }
    fn configure(config: String) -> Result<(), wit::PolicyError> {
        with_runtime::<P, _>(|rt| rt.configure(&config)).map_err(Into::into)
    }
}

impl<P: Policy> exports::sync::Guest for Export<P> {
    fn resync(snapshot: wit::Snapshot) -> Result<(), wit::PolicyError> {
        with_runtime::<P, _>(|rt| rt.resync(snapshot.into())).map_err(Into::into)
    }
    fn apply(delta: wit::Delta) -> Result<(), wit::PolicyError> {
        let (base, epoch, now) = (delta.base_epoch, delta.epoch, delta.now_ms);
        let update = |cluster: &mut crate::cluster::Cluster| {
            apply_events(cluster, delta.events)?;
            cluster.set_epoch(epoch, now);
            Ok(())
        };
        with_runtime::<P, _>(|rt| rt.apply_with(base, update)).map_err(Into::into)
    }
}

impl<P: Policy> exports::scheduler::Guest for Export<P> {
    fn schedule(round: wit::RoundInfo) -> Result<Vec<wit::Decision>, wit::PolicyError> {
        let r = with_runtime::<P, _>(|rt| rt.schedule(round.into()));
        r.map(lower_decisions).map_err(Into::into)
    }
}

impl<P: Policy> exports::reclaim::Guest for Export<P> {
    fn reclaim(request: wit::ReclaimRequest) -> Result<wit::ReclaimPlan, wit::PolicyError> {
        with_runtime::<P, _>(|rt| rt.reclaim(request.into()))
            .map(lower_reclaim_plan)
            .map_err(Into::into)
    }
}

impl<P: Policy> exports::matcher::Guest for Export<P> {
    fn match_workloads(request: wit::MatchRequest) -> Result<Vec<wit::Pairing>, wit::PolicyError> {
        let r = with_runtime::<P, _>(|rt| rt.match_workloads(request.into()));
        r.map(|d| d.into_iter().map(Into::into).collect())
            .map_err(Into::into)
    }
}

impl<P: Policy> exports::coordinator::Guest for Export<P> {
    fn tick(view: wit::NodeView) -> Result<Vec<wit::NodeAction>, wit::PolicyError> {
        let r = with_runtime::<P, _>(|rt| rt.tick(view.into()));
        r.map(|d| d.into_iter().map(Into::into).collect())
            .map_err(Into::into)
    }
}

impl<P: Policy> exports::tenant::Guest for Export<P> {
    fn order(view: wit::TenantView) -> Result<wit::TenantVerdict, wit::PolicyError> {
        result(with_runtime::<P, _>(|rt| rt.order(view.into())))
    }
}

/// Log through the host (shows up in the host's `tracing` output).
pub fn log(level: crate::LogLevel, message: &str) {
    use bindings::arbiter::policy::host::{self, LogLevel as L};
    let level = match level {
        crate::LogLevel::Trace => L::Trace,
        crate::LogLevel::Debug => L::Debug,
        crate::LogLevel::Info => L::Info,
        crate::LogLevel::Warn => L::Warn,
        crate::LogLevel::Error => L::Error,
    };
    host::log(level, message);
}
