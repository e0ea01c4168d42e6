//! The resolution trace, `ARBITER_INTERPOSE_TRACE=<file>`: one line per driver lookup we
//! answered (through `cuGetProcAddress{,_v2}` or `dlsym`) and per `cuInit`, so a check can
//! prove against the *real* CUDA runtime and driver that every entry point we wrap was handed
//! out as our wrapper (`scripts/real-cuda-check.sh`). The driver's answer is named with
//! `dladdr`, independently of our own table. Slow paths only: lookups happen while a program
//! loads its CUDA stack, never per launch or allocation.
//!
//! ```text
//! lookup via=gpa2 name=cuMemAlloc version=12090 flags=0 driver=cuMemAlloc_v2 ours=1
//! call cuInit rc=100
//! ```

use std::ffi::{CStr, c_char, c_int, c_void};
use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

static TRACE: OnceLock<Option<Mutex<File>>> = OnceLock::new();

/// Opens the trace file named by the environment (called once, from the lazy init).
pub fn init(path: Option<String>) {
    let _ = TRACE.set(path.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .ok()
            .map(Mutex::new)
    }));
}

fn write(args: std::fmt::Arguments<'_>) {
    if let Some(Some(f)) = TRACE.get() {
        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_fmt(args);
    }
}

/// Whether tracing is on (to skip the work of formatting otherwise).
pub fn enabled() -> bool {
    matches!(TRACE.get(), Some(Some(_)))
}

/// The exported symbol at exactly `p`, as the dynamic linker names it.
fn symbol_at(p: *mut c_void) -> String {
    // SAFETY: an all-zero Dl_info (null pointers) is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    let found = unsafe { libc::dladdr(p, &mut info) } != 0;
    if !found || info.dli_sname.is_null() || info.dli_saddr != p {
        return "?".into();
    }
    // SAFETY: dladdr's dli_sname is a NUL-terminated string owned by the loader.
    unsafe { CStr::from_ptr(info.dli_sname) }
        .to_string_lossy()
        .into_owned()
}

/// A lookup of `name` answered with `answer`; the driver had answered `real`.
pub fn lookup(
    via: &str,
    name: *const c_char,
    version: c_int,
    flags: u64,
    real: *mut c_void,
    answer: *mut c_void,
) {
    if !enabled() || real.is_null() {
        return;
    }
    let name = if name.is_null() {
        "?".into()
    } else {
        // SAFETY: the caller's lookup name, NUL-terminated per the API contract.
        unsafe { CStr::from_ptr(name) }.to_string_lossy()
    };
    write(format_args!(
        "lookup via={via} name={name} version={version} flags={flags} driver={} ours={}\n",
        symbol_at(real),
        u8::from(answer != real),
    ));
}

/// A wrapped call worth recording (`cuInit`).
pub fn call(what: &str, rc: c_int) {
    write(format_args!("call {what} rc={rc}\n"));
}
