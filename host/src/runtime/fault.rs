//! What can go wrong when a policy runs, classified from wasmtime's errors.

use super::budget::BudgetExceeded;
use super::guest_text::{MAX_ERROR_TEXT, MAX_NAME_TEXT, guest_text};
use arbiter_policy_sdk::{DecisionError, PolicyError};
use std::time::Duration;

/// A policy fault. The host survives every one of these: the round falls back.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PolicyFault {
    #[error("policy exceeded its deadline of {0:?}")]
    Deadline(Duration),
    #[error("policy exceeded its memory cap of {0} bytes")]
    MemoryCap(usize),
    /// The budget its owner's instances share (e.g. a tenant's) is spent,
    /// although this instance is within its own cap.
    #[error("policy {0}")]
    SharedMemory(BudgetExceeded),
    #[error("policy ran out of fuel")]
    OutOfFuel,
    #[error("policy trapped: {0}")]
    Trap(String),
    #[error("policy does not fit the contract: {0}")]
    Abi(String),
    #[error("policy mirror is stale (at epoch {0})")]
    Stale(u64),
    #[error("policy does not implement role `{0}`")]
    Unsupported(String),
    #[error("policy reported failure: {0}")]
    Reported(String),
    #[error("decision #{index} is invalid: {error}")]
    InvalidDecision { index: usize, error: DecisionError },
    #[error("policy returned {count} decisions, the limit is {limit}")]
    TooManyDecisions { count: usize, limit: u32 },
    #[error("policy returned an impossible answer: {0}")]
    BadAnswer(String),
    /// Lifting its answer (or a host call's arguments) would have made the host allocate
    /// more than this many bytes: wasmtime's hostcall fuel, counted in host bytes, so a
    /// small answer whose lists alias one range of guest memory is caught too.
    #[error("policy's answer would make the host allocate more than {0} bytes")]
    AnswerTooLarge(usize),
}

/// The sandbox's bounds a fault names when a guest call runs past one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultLimits {
    /// Wall-clock deadline of one call.
    pub deadline: Duration,
    /// Guest memory bound, bytes.
    pub memory_cap: usize,
    /// What lifting one answer may make the host allocate, bytes.
    pub answer_cap: usize,
}

/// Innermost guest functions a trap's text names.
const TRAP_FRAMES: usize = 3;

/// A trap's text: what stopped the guest (the error's root cause, e.g.
/// "wasm `unreachable` instruction executed" or an unknown import), the
/// innermost functions of the policy's own code it stopped in (demangled;
/// the standard library's, the panic machinery's and unnamed frames
/// skipped), and the last error line the policy logged in the call — where
/// the SDK's panic hook puts the panic's message and location. Not the whole
/// backtrace: that is kilobytes of frames an operator cannot act on.
/// Bounded and escaped like everything a guest says (function names come
/// from its name section).
fn trap_text(err: &wasmtime::Error, last_error_log: Option<&str>) -> String {
    let cause = err.root_cause().to_string();
    // The fault's own text already says "policy trapped".
    let mut text = cause
        .strip_prefix("wasm trap: ")
        .unwrap_or(&cause)
        .to_string();
    if let Some(trace) = err.downcast_ref::<wasmtime::WasmBacktrace>() {
        let names: Vec<String> = trace
            .frames()
            .iter()
            .filter_map(|f| f.func_name())
            .map(|name| match rustc_demangle::try_demangle(name) {
                Ok(d) => format!("{d:#}"),
                Err(_) => name.to_string(),
            })
            .collect();
        // A component built without the SDK's panic hook traps inside std's
        // (on the environment read), which says nothing of the panic itself.
        if last_error_log.is_none() && names.iter().any(|n| n.contains("::panicking::")) {
            text.push_str(" while panicking");
        }
        let frames: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|name| !is_runtime_frame(name))
            .take(TRAP_FRAMES)
            .collect();
        if !frames.is_empty() {
            text.push_str(" in ");
            text.push_str(&frames.join(" < "));
        }
    }
    if let Some(line) = last_error_log {
        text.push_str("; last error logged: ");
        text.push_str(line);
    }
    guest_text(&text, MAX_ERROR_TEXT, false)
}

/// A frame of the language runtime rather than of the policy: Rust's
/// standard library and panic machinery, wasi-libc's C runtime.
fn is_runtime_frame(name: &str) -> bool {
    const RUNTIME: [&str; 8] = [
        "std::", "core::", "alloc::", "__", "rust_", "<std::", "<core::", "<alloc::",
    ];
    const LIBC: [&str; 5] = [
        "abort",
        "getenv",
        "environment_get_environment",
        "exit",
        "_start",
    ];
    RUNTIME.iter().any(|p| name.starts_with(p)) || LIBC.contains(&name)
}

impl PolicyFault {
    /// Classifies an error from a guest call; `last_error_log` is the last
    /// error-level line the policy logged in the call, which a trap's text
    /// quotes.
    pub fn from_call_error(
        err: &wasmtime::Error,
        limits: &FaultLimits,
        last_error_log: Option<&str>,
    ) -> PolicyFault {
        if let Some(trap) = err.downcast_ref::<wasmtime::Trap>() {
            return match trap {
                wasmtime::Trap::Interrupt => PolicyFault::Deadline(limits.deadline),
                wasmtime::Trap::OutOfFuel => PolicyFault::OutOfFuel,
                _ => PolicyFault::Trap(trap_text(err, last_error_log)),
            };
        }
        // A memory-budget refusal is not a `Trap` value: it is the
        // limiter's own error, somewhere in the chain.
        if let Some(exceeded) = err.chain().find_map(|e| e.downcast_ref::<BudgetExceeded>()) {
            return if exceeded.shared {
                PolicyFault::SharedMemory(exceeded.clone())
            } else {
                PolicyFault::MemoryCap(limits.memory_cap)
            };
        }
        let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
        // wasmtime's `HostcallFuelExhausted` is private: its text is what there is (a test,
        // `answer_beyond_the_hostcall_bound_is_refused`, notices if it changes).
        if chain
            .iter()
            .any(|m| m.contains("fuel allocated for hostcalls has been exhausted"))
        {
            return PolicyFault::AnswerTooLarge(limits.answer_cap);
        }
        if chain
            .iter()
            .any(|m| m.contains("growing memory") || m.contains("memory limit"))
        {
            return PolicyFault::MemoryCap(limits.memory_cap);
        }
        PolicyFault::Trap(trap_text(err, last_error_log))
    }

    /// Turns an error the policy reported itself into a fault; its text is
    /// bounded and escaped here, once (see [`guest_text`]).
    pub fn from_policy_error(err: PolicyError) -> PolicyFault {
        match err {
            PolicyError::Stale(epoch) => PolicyFault::Stale(epoch),
            PolicyError::Unsupported(role) => {
                PolicyFault::Unsupported(guest_text(&role, MAX_NAME_TEXT, false))
            }
            PolicyError::Failed(msg) => {
                PolicyFault::Reported(guest_text(&msg, MAX_ERROR_TEXT, false))
            }
        }
    }

    /// Short machine-readable kind, for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyFault::Deadline(_) => "deadline",
            PolicyFault::MemoryCap(_) | PolicyFault::SharedMemory(_) => "memory",
            PolicyFault::OutOfFuel => "fuel",
            PolicyFault::Trap(_) => "trap",
            PolicyFault::Abi(_) => "abi",
            PolicyFault::Stale(_) => "stale",
            PolicyFault::Unsupported(_) => "unsupported",
            PolicyFault::Reported(_) => "reported",
            PolicyFault::InvalidDecision { .. } => "invalid-decision",
            PolicyFault::TooManyDecisions { .. } => "too-many-decisions",
            PolicyFault::BadAnswer(_) => "bad-answer",
            PolicyFault::AnswerTooLarge(_) => "answer-too-large",
        }
    }

    /// Whether the instance must be thrown away (it trapped or was interrupted).
    pub fn poisons_instance(&self) -> bool {
        matches!(
            self,
            PolicyFault::Deadline(_)
                | PolicyFault::MemoryCap(_)
                | PolicyFault::SharedMemory(_)
                | PolicyFault::OutOfFuel
                | PolicyFault::Trap(_)
                | PolicyFault::Abi(_)
                // The lift failed half-way: the instance never finished the call.
                | PolicyFault::AnswerTooLarge(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real trap with a real backtrace: `run` calls `my_policy::pick`,
    /// which calls into a panic hook that executes `unreachable`.
    fn trap(last_error_log: Option<&str>) -> String {
        let engine = wasmtime::Engine::default();
        let wasm = wat::parse_str(
            r#"(module
                (func $std::panicking::default_hook unreachable)
                (func $my_policy::pick call $std::panicking::default_hook)
                (func $run (export "run") call $my_policy::pick))"#,
        )
        .expect("module text");
        let module = wasmtime::Module::new(&engine, wasm).expect("module");
        let mut store = wasmtime::Store::new(&engine, ());
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instance");
        let run = instance
            .get_typed_func::<(), ()>(&mut store, "run")
            .expect("run");
        let err = run.call(&mut store, ()).expect_err("traps");
        let limits = FaultLimits {
            deadline: Duration::from_millis(1),
            memory_cap: 1,
            answer_cap: 1,
        };
        match PolicyFault::from_call_error(&err, &limits, last_error_log) {
            PolicyFault::Trap(text) => text,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_trap_names_its_cause_the_policys_frames_and_its_last_error_line() {
        assert_eq!(
            trap(Some("panicked at src/lib.rs:3:5: no node fits")),
            "wasm `unreachable` instruction executed in my_policy::pick < run; \
             last error logged: panicked at src/lib.rs:3:5: no node fits"
        );
        // Without the SDK's report, a trap inside std's panic machinery says so.
        assert_eq!(
            trap(None),
            "wasm `unreachable` instruction executed while panicking in my_policy::pick < run"
        );
    }
}
