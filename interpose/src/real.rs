//! The real driver: our own `dlsym`, the table of entry points we wrap, and the pointer-keyed
//! substitution shared by `cuGetProcAddress{,_v2}` and `dlsym`.
//!
//! Substitution is keyed on the *pointer* the real resolver returned, not on the name: whatever
//! (name, version, flags) the caller asked for, if the driver handed back the address of an
//! export we wrap (`cuMemAlloc_v2`, `cuLaunchKernel_ptsz`, `cuGetProcAddress_v2`, ...), the
//! caller gets our wrapper for exactly that ABI; any other address passes through untouched.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

macro_rules! symbols {
    ($($name:ident),* $(,)?) => {
        /// Driver entry points whose real address we need.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Sym { $($name,)* }
        /// Names, indexed by `Sym`.
        pub const NAMES: &[&CStr] = &[$(
            match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(c) => c,
                Err(_) => panic!("symbol name"),
            },
        )*];
    };
}

symbols!(
    cuInit,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuMemAlloc_v2,
    cuMemAllocPitch_v2,
    cuMemAllocManaged,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFree_v2,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuArrayCreate_v2,
    cuArray3DCreate_v2,
    cuMipmappedArrayCreate,
    cuArrayDestroy,
    cuMipmappedArrayDestroy,
    cuMemGetInfo_v2,
    cuDeviceTotalMem_v2,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy_v2,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset_v2,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuLaunchCooperativeKernelMultiDevice,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    // Needed by the interposer itself, never substituted.
    cuStreamIsCapturing,
    cuStreamIsCapturing_ptsz,
    cuCtxGetDevice,
    cuCtxGetCurrent,
    cuDeviceGet,
    cuDeviceGetUuid,
    cuCtxSynchronize,
    cuCtxPushCurrent_v2,
    cuCtxPopCurrent_v2,
    cuMemAdvise,
    cuMemAdvise_v2,
);

const N: usize = NAMES.len();
static REAL: [AtomicPtr<c_void>; N] = [const { AtomicPtr::new(std::ptr::null_mut()) }; N];
static RESOLVED: AtomicBool = AtomicBool::new(false);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's `RTLD_NEXT`.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

thread_local! {
    /// Set while this thread runs interposer code that may itself reach `dlsym`.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the re-entrancy flag set; returns `None` if the flag was already set.
pub fn reentrancy_guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let entered = IN_HOOK.try_with(|g| !g.replace(true)).unwrap_or(false);
    if !entered {
        return None;
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            let _ = IN_HOOK.try_with(|g| g.set(false));
        }
    }
    let _reset = Reset;
    Some(f())
}

type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// The real `dlsym`, found with glibc's `dlvsym(RTLD_NEXT, ...)` (itself found in libc's symbol
/// table, [`crate::elf`]: we export a `dlvsym` of our own) so our own export is skipped. Never
/// `__libc_dlsym`/`_dl_sym` (GLIBC_PRIVATE, gone in 2.34).
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        let dlvsym = crate::elf::libc_dlvsym();
        if dlvsym.is_null() {
            return None;
        }
        // SAFETY: glibc's dlvsym, ABI DlvsymFn.
        let dlvsym = unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(dlvsym) };
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with valid NUL-terminated strings; returns NULL if absent. Called
            // from here, RTLD_NEXT means "after libarbiter": glibc's dlsym.
            p = unsafe { dlvsym(RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's dlsym, whose ABI is DlsymFn.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// Resolves the real driver's entry points once libcuda is loaded. Cheap and idempotent;
/// concurrent callers store identical values, so no lock is needed.
pub fn ensure_resolved() -> bool {
    if RESOLVED.load(Ordering::Acquire) {
        return true;
    }
    let Some(dlsym) = real_dlsym() else {
        return false;
    };
    let mut handle = std::ptr::null_mut();
    for name in [c"libcuda.so.1", c"libcuda.so"] {
        // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded object (and bumps
        // its refcount, which we keep: the driver is never unloaded under us).
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if !handle.is_null() {
            break;
        }
    }
    if handle.is_null() {
        return false;
    }
    for (i, name) in NAMES.iter().enumerate() {
        // SAFETY: real dlsym on a valid handle with a NUL-terminated name.
        let p = unsafe { dlsym(handle, name.as_ptr()) };
        REAL[i].store(p, Ordering::Release);
    }
    RESOLVED.store(true, Ordering::Release);
    true
}

/// Address of the real entry point, resolving on first use; NULL if the driver lacks it.
#[inline(always)]
pub fn get(sym: Sym) -> *mut c_void {
    let p = REAL[sym as usize].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    get_slow(sym)
}

#[cold]
#[inline(never)]
fn get_slow(sym: Sym) -> *mut c_void {
    ensure_resolved();
    REAL[sym as usize].load(Ordering::Acquire)
}

/// If `p` is the real address of an entry point we wrap, returns our wrapper instead.
pub fn substitute(p: *mut c_void) -> *mut c_void {
    if p.is_null() || crate::state::bypassed() || !ensure_resolved() {
        return p;
    }
    for (i, slot) in REAL.iter().enumerate() {
        if slot.load(Ordering::Acquire) == p {
            let sym = SYMS[i];
            return crate::hooks::wrapper(sym).unwrap_or(p);
        }
    }
    p
}

const SYMS: [Sym; N] = {
    let mut out = [Sym::cuInit; N];
    let mut i = 0;
    while i < N {
        // SAFETY: `Sym` is a fieldless repr(usize) enum with discriminants 0..N in order, so
        // every i < N is a valid discriminant.
        out[i] = unsafe { std::mem::transmute::<usize, Sym>(i) };
        i += 1;
    }
    out
};

/// Our `dlsym`. Lookups in a handle (`dlopen`'s, `RTLD_DEFAULT`) go through
/// [`dlsym_substituting`]; `RTLD_NEXT` lookups are forwarded to glibc's `dlsym` by a tail jump,
/// so glibc still sees the *caller's* return address and searches after the caller's object.
/// Forwarded from a Rust body, glibc would search after libarbiter instead, and an interposer
/// loaded after us that looks up its own next definition (`dlsym(RTLD_NEXT, "f")` inside its
/// `f`) would be handed itself and recurse until the stack overflows. An `RTLD_NEXT` result is
/// not substituted: the caller asked for the definition after its own, and the CUDA programs
/// we wrap never ask the driver that way.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // At entry: rdi = handle, rsi = symbol, [rsp] = the caller's return address.
    std::arch::naked_asm!(
        "cmp rdi, -1", // RTLD_NEXT
        "jne {substituting}",
        // Resolve glibc's dlsym; keep the arguments and 16-byte stack alignment for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {real}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax", // the stack is as the caller left it: glibc sees the caller
        "2:",
        "ret", // no real dlsym (cannot happen with glibc): NULL
        substituting = sym dlsym_substituting,
        real = sym real_dlsym_address,
    )
}

/// Our `dlvsym`: the same as our `dlsym` for a lookup of a given version — `RTLD_NEXT` leaves
/// by a tail jump to glibc's `dlvsym` (the caller decides what "next" is: an interposer after
/// us that finds its next definition with `dlvsym` must not get itself), any other handle is
/// looked up through glibc's `dlvsym`, and a driver or NVML entry point we wrap comes back as
/// our wrapper. (Today's drivers export unversioned symbols, which glibc's `dlvsym` returns
/// under no version; the substitution is there for a library that versions them.)
///
/// # Safety
/// Same contract as glibc's `dlvsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // At entry: rdi = handle, rsi = symbol, rdx = version, [rsp] = the caller's return address.
    std::arch::naked_asm!(
        "cmp rdi, -1", // RTLD_NEXT
        "jne {substituting}",
        "push rdi",
        "push rsi",
        "push rdx",
        "call {real}", // rsp is 16-byte aligned here: entry (8 mod 16) + three pushes
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax", // the stack is as the caller left it: glibc sees the caller
        "2:",
        "ret",
        substituting = sym dlvsym_substituting,
        real = sym libc_dlvsym_address,
    )
}

/// glibc's `dlvsym`, or NULL (for the trampoline).
extern "C" fn libc_dlvsym_address() -> *mut c_void {
    crate::elf::libc_dlvsym()
}

/// Looks `symbol`@`version` up with glibc's `dlvsym`, then swaps in our wrapper when the result
/// is a real driver entry point we wrap.
///
/// # Safety
/// Same contract as glibc's `dlvsym`.
unsafe extern "C" fn dlvsym_substituting(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let real = crate::elf::libc_dlvsym();
    if real.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: glibc's dlvsym (ABI DlvsymFn) with the caller's arguments.
    let p = unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(real)(handle, symbol, version) };
    // SAFETY: the same post-processing as a `dlsym` result of `symbol` (NUL-terminated).
    unsafe { substitute_lookup(p, symbol, "dlvsym") }
}

/// Our `dlsym` where no trampoline is written: every lookup through [`dlsym_substituting`]
/// (`RTLD_NEXT` then resolves relative to libarbiter, see the x86-64 version).
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { dlsym_substituting(handle, symbol) }
}

/// Our `dlopen` (x86-64): every call leaves by a tail jump to glibc's `dlopen`, so the search
/// path and namespace are still decided by the *caller* (its `RUNPATH`, `$ORIGIN`), exactly as
/// without us. A call with `RTLD_DEEPBIND` is noted first ([`note_deepbind`]): a CUDA runtime
/// loaded that way looks `dlsym` up in its own scope, around our `dlsym`, and escapes
/// enforcement — we cannot cover it without patching the library, so we report it.
///
/// # Safety
/// Same contract as glibc's `dlopen`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(filename: *const c_char, flags: std::ffi::c_int) -> *mut c_void {
    // At entry: rdi = filename, esi = flags, [rsp] = the caller's return address.
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "test esi, {deepbind}",
        "jz 2f",
        "call {note}", // rdi, rsi still hold the arguments
        "2:",
        "call {real}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 3f",
        "jmp rax", // the stack is as the caller left it: glibc sees the caller
        "3:",
        "ret", // no real dlopen (cannot happen with glibc): NULL
        deepbind = const libc::RTLD_DEEPBIND,
        note = sym note_deepbind,
        real = sym real_dlopen_address,
    )
}

static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's `dlopen`, or NULL (for the trampoline).
extern "C" fn real_dlopen_address() -> *mut c_void {
    let p = REAL_DLOPEN.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the real dlsym with RTLD_NEXT and a NUL-terminated name: the next `dlopen`
    // after libarbiter in the search order, glibc's.
    let p = unsafe { dlsym(RTLD_NEXT, c"dlopen".as_ptr()) };
    REAL_DLOPEN.store(p, Ordering::Release);
    p
}

/// A `dlopen` with `RTLD_DEEPBIND`: if it loads a CUDA runtime, say so on stderr (always:
/// the workload is not enforced) and count it in the block for the node.
extern "C" fn note_deepbind(filename: *const c_char, _flags: std::ffi::c_int) {
    let _ = std::panic::catch_unwind(|| {
        if filename.is_null() {
            return;
        }
        // SAFETY: dlopen's contract: a non-NULL filename is NUL-terminated.
        let name = unsafe { CStr::from_ptr(filename) }.to_string_lossy();
        let base = name.rsplit('/').next().unwrap_or(&name);
        if !base.starts_with("libcudart") {
            return;
        }
        eprintln!(
            "[arbiter-interpose {}] {base} is being loaded with RTLD_DEEPBIND: its CUDA calls \
             bypass the interposer and are not enforced",
            std::process::id()
        );
        // The runtime is usually loaded before any CUDA call: configure now to find the block.
        let _ = crate::state::mode();
        if let Some(b) = crate::state::block() {
            b.liveness.unenforced_loads.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// glibc's `dlsym`, or NULL (for the trampoline).
extern "C" fn real_dlsym_address() -> *mut c_void {
    real_dlsym().map_or(std::ptr::null_mut(), |f| f as *mut c_void)
}

/// Resolves with the caller's handle through the real `dlsym`, then swaps in our wrapper when
/// the result is a real driver entry point we wrap.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
unsafe extern "C" fn dlsym_substituting(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments unchanged to the real dlsym.
    let p = unsafe { real(handle, symbol) };
    // SAFETY: `symbol` is the caller's NUL-terminated name (dlsym's contract).
    unsafe { substitute_lookup(p, symbol, "dlsym") }
}

/// The result `p` of a `dlsym`/`dlvsym` of `symbol`: our wrapper if it is a driver or NVML
/// entry point we wrap, else `p` itself.
///
/// # Safety
/// `symbol` is NULL or NUL-terminated.
unsafe fn substitute_lookup(p: *mut c_void, symbol: *const c_char, via: &str) -> *mut c_void {
    if p.is_null() || symbol.is_null() {
        return p;
    }
    // SAFETY: `symbol` is NUL-terminated; reading up to four bytes is fine because a NUL among
    // them stops the `&&` chain before the next read.
    let (is_cu, is_nvml) = unsafe {
        let at = |i: usize| *symbol.add(i) as u8;
        let cu = at(0) == b'c' && at(1) == b'u';
        let nvml = at(0) == b'n' && at(1) == b'v' && at(2) == b'm' && at(3) == b'l';
        (cu, nvml)
    };
    if !is_cu && !is_nvml {
        return p;
    }
    // Initialise before entering the re-entrancy guard: inside it the lazy init would be
    // skipped, and the first lookups (cudart's bootstrap `dlsym` of `cuGetProcAddress_v2`)
    // would run before the configuration — and the trace — exist.
    let _ = crate::state::mode();
    let swapped = std::panic::catch_unwind(|| {
        reentrancy_guarded(|| {
            let q = if is_cu {
                substitute(p)
            } else {
                crate::nvml::substitute(p).unwrap_or(p)
            };
            crate::trace::lookup(via, symbol, 0, 0, p, q);
            q
        })
    });
    match swapped {
        Ok(Some(q)) => q,
        _ => p,
    }
}
