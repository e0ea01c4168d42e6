//! Graceful exit (MuxFlow's fix for MPS error propagation), the worker thread, fork handling.
//!
//! * SIGINT/SIGTERM handlers are installed with `sigaction` on the first CUDA initialisation
//!   (never in a constructor), and only when a control block is configured (without one there
//!   is nothing to enforce or return), saving the previous disposition. They run on the
//!   alternate signal stack when the thread has one (`SA_ONSTACK`: Go's runtime aborts a cgo
//!   program whose foreign handlers lack it).
//! * The handler is async-signal-safe: if the previous disposition was a handler function it
//!   chains to it (the application owns that signal and may survive it, so we must not tear the
//!   GPU down) the way the kernel would have run it — under its `sa_mask`, with the signal
//!   unblocked for `SA_NODEFER`, and only once for `SA_RESETHAND` (afterwards the signal is
//!   treated as default), installed with its `SA_RESTART` choice; a signal that is ignored is
//!   left alone (no handler: an ignored signal is inherited across exec, a handler is not); if
//!   it was `SIG_DFL` (the process is about to die) it records the signal and writes one byte
//!   to a self-pipe. Nothing else.
//! * The worker thread wakes on the pipe, holds all further launches, synchronizes every known
//!   context — all at once, each on its own helper thread, within one grace period for the
//!   whole process (8 GPUs must fit in Kubernetes' 30 s, not 8 × a timeout) — destroys/releases
//!   the contexts, returns the process's quota, restores the disposition and re-raises the
//!   signal, so the exit status is the one the signal would have produced.
//! * The same worker polls the control block for `FLAG_EXIT` and for a stale node heartbeat.
//! * Fork: a `pthread_atfork` child handler forgets contexts, quota and the worker (threads do
//!   not survive fork); the next CUDA call in the child starts a fresh worker.

use crate::control::{FLAG_EXIT, monotonic_ns};
use crate::real::{self, Sym};
use crate::state::{self, CLOSED, ENFORCE};
use crate::{CUDA_SUCCESS, CUresult, quota};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MAX_CTX: usize = 64;
const MAX_DEV: usize = 64;
/// Contexts created with `cuCtxCreate` (0 = free slot).
static CREATED: [AtomicU64; MAX_CTX] = [const { AtomicU64::new(0) }; MAX_CTX];
/// Outstanding `cuDevicePrimaryCtxRetain` count per device ordinal.
static PRIMARY_REFS: [AtomicU64; MAX_DEV] = [const { AtomicU64::new(0) }; MAX_DEV];
/// Primary context handle per device ordinal.
static PRIMARY_CTX: [AtomicU64; MAX_DEV] = [const { AtomicU64::new(0) }; MAX_DEV];

static STARTED: AtomicBool = AtomicBool::new(false);
static WORKER_ALIVE: AtomicBool = AtomicBool::new(false);
static PENDING: AtomicI32 = AtomicI32::new(0);
static PIPE_R: AtomicI32 = AtomicI32::new(-1);
static PIPE_W: AtomicI32 = AtomicI32::new(-1);
static ATFORK: std::sync::Once = std::sync::Once::new();
/// Set once a previous handler installed with `SA_RESETHAND` ran: from then on the signal is
/// treated as if its disposition were `SIG_DFL`, as the kernel would have reset it.
static RESET: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
/// Stack of the threads that call into the driver (worker, synchronize helpers): the driver's
/// own frames are deep, and the memory is only reserved, not committed, until used.
const DRIVER_THREAD_STACK: usize = 4 << 20;

const SIGNALS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Previous dispositions, written once before our handler is installed.
struct OldActions {
    installed: [AtomicBool; 2],
    act: [UnsafeCell<MaybeUninit<libc::sigaction>>; 2],
}
// SAFETY: each `act[i]` is written only by `sigaction()` while installing (before
// `installed[i]` is set with Release) and afterwards only read.
unsafe impl Sync for OldActions {}
static OLD: OldActions = OldActions {
    installed: [const { AtomicBool::new(false) }; 2],
    act: [const { UnsafeCell::new(MaybeUninit::uninit()) }; 2],
};

fn old_action(i: usize) -> Option<&'static libc::sigaction> {
    if OLD.installed[i].load(Ordering::Acquire) {
        // SAFETY: initialised by sigaction() before `installed` was set; never written again.
        Some(unsafe { (*OLD.act[i].get()).assume_init_ref() })
    } else {
        None
    }
}

/// Remember a context created by the application.
pub fn track_created(ctx: u64) {
    if ctx == 0 {
        return;
    }
    for s in &CREATED {
        if s.compare_exchange(0, ctx, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
    state::log(format_args!(
        "more than {MAX_CTX} contexts; not tracking {ctx:#x}"
    ));
}

pub fn untrack_created(ctx: u64) {
    for s in &CREATED {
        if ctx != 0
            && s.compare_exchange(ctx, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return;
        }
    }
}

/// A successful `cuDevicePrimaryCtxRetain`; out-of-range ordinals are simply not tracked.
pub fn track_primary(dev: c_int, ctx: u64) {
    if let Ok(d) = usize::try_from(dev)
        && d < MAX_DEV
    {
        PRIMARY_CTX[d].store(ctx, Ordering::Release);
        PRIMARY_REFS[d].fetch_add(1, Ordering::AcqRel);
    }
}

/// A successful primary-context release; returns the context if that was this process's last
/// reference (the driver then destroys it, and the memory allocated in it).
pub fn untrack_primary(dev: c_int) -> Option<u64> {
    let d = usize::try_from(dev).ok().filter(|d| *d < MAX_DEV)?;
    let before = PRIMARY_REFS[d]
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1))
        .ok()?;
    (before == 1).then(|| PRIMARY_CTX[d].load(Ordering::Acquire))
}

/// The primary context of `dev` as this process retained it, if it did.
pub fn primary_context(dev: c_int) -> Option<u64> {
    let d = usize::try_from(dev).ok().filter(|d| *d < MAX_DEV)?;
    let ctx = PRIMARY_CTX[d].load(Ordering::Acquire);
    (ctx != 0).then_some(ctx)
}

/// Second-stage initialisation, run on `cuInit` and context creation: signal handlers, the
/// worker thread, the fork handler, the exit-time quota release. Idempotent and cheap after
/// the first call.
pub fn late_init() {
    if STARTED.load(Ordering::Acquire) || state::bypassed() {
        return;
    }
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    if state::block().is_none() {
        // Nothing to enforce, watch or give back: leave the process's signals alone.
        return;
    }
    ATFORK.call_once(|| {
        // SAFETY: registering plain extern "C" callbacks that only touch atomics / pipe().
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_child));
            libc::atexit(at_exit);
        }
    });
    if !make_pipe() {
        state::log(format_args!("pipe() failed; graceful exit disabled"));
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("arbiter-interpose".into())
        .stack_size(DRIVER_THREAD_STACK)
        .spawn(worker);
    match spawned {
        Ok(_) => WORKER_ALIVE.store(true, Ordering::Release),
        Err(e) => {
            state::log(format_args!("worker thread: {e}; graceful exit disabled"));
            return;
        }
    }
    if std::env::var_os("ARBITER_GRACEFUL_EXIT").is_some_and(|v| v == "0") {
        return;
    }
    install_handlers();
}

fn make_pipe() -> bool {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: pipe2 writes two fds into a 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return false;
    }
    PIPE_R.store(fds[0], Ordering::Release);
    PIPE_W.store(fds[1], Ordering::Release);
    true
}

fn install_handlers() {
    for (i, sig) in SIGNALS.iter().enumerate() {
        if OLD.installed[i].load(Ordering::Acquire) {
            continue;
        }
        // SAFETY: querying the current disposition into a local.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; a NULL new action only reads.
        if unsafe { libc::sigaction(*sig, std::ptr::null(), &mut current) } != 0
            || current.sa_sigaction == libc::SIG_IGN
        {
            // An ignored signal stays ignored — and is inherited across exec as ignored, which
            // a handler would not be (`nohup`, `trap '' TERM`).
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid starting point; we fill handler, mask, flags.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as *const () as usize;
        // SA_RESTART as the application chose it for its own handler (CPython installs without
        // it so that blocking calls return EINTR and its handler runs); for the default
        // disposition, restart (the process is going away on our schedule, not the call's).
        let restart = if current.sa_sigaction == libc::SIG_DFL {
            libc::SA_RESTART
        } else {
            current.sa_flags & libc::SA_RESTART
        };
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | restart;
        // SAFETY: valid sigset pointer.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: OLD.act[i] is written only here, before `installed[i]` is published; the
        // kernel fills the old action before our handler can possibly run.
        let rc = unsafe { libc::sigaction(*sig, &act, (*OLD.act[i].get()).as_mut_ptr()) };
        if rc == 0 {
            OLD.installed[i].store(true, Ordering::Release);
        }
    }
}

fn index_of(sig: c_int) -> Option<usize> {
    SIGNALS.iter().position(|s| *s == sig)
}

/// Async-signal-safe: atomics, `write`, `sigaction`, `raise` and the chained handler only.
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let Some(i) = index_of(sig) else { return };
    let Some(old) = old_action(i) else { return };
    let prev = if RESET[i].load(Ordering::Acquire) {
        libc::SIG_DFL
    } else {
        old.sa_sigaction
    };
    if prev == libc::SIG_IGN {
        return;
    }
    if prev != libc::SIG_DFL {
        if old.sa_flags & libc::SA_RESETHAND != 0 {
            RESET[i].store(true, Ordering::Release);
        }
        chain(sig, info, uctx, old);
        return;
    }
    // SAFETY: reading errno of this thread so the interrupted code sees it unchanged.
    let saved_errno = unsafe { *libc::__errno_location() };
    let fd = PIPE_W.load(Ordering::Acquire);
    let first = PENDING
        .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok();
    if !first || fd < 0 || !WORKER_ALIVE.load(Ordering::Acquire) {
        // No worker, or a second signal while we are already exiting: die right away.
        restore_disposition(i, sig);
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(sig) };
    } else {
        let byte = 1u8;
        // SAFETY: write(2) of one byte from a valid buffer is async-signal-safe.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
    // SAFETY: restore errno (see above).
    unsafe { *libc::__errno_location() = saved_errno };
}

/// Runs the previous handler as the kernel would have: its `sa_mask` blocked on top of the
/// current mask, the signal itself unblocked if it asked for `SA_NODEFER`, the mask restored
/// afterwards (a handler that leaves by `siglongjmp` restores its own). Async-signal-safe.
fn chain(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void, old: &libc::sigaction) {
    // SAFETY: sigset manipulation on locals and pthread_sigmask, all async-signal-safe.
    let saved = unsafe {
        let mut saved: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &old.sa_mask, &mut saved);
        if old.sa_flags & libc::SA_NODEFER != 0 {
            let mut own: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut own);
            libc::sigaddset(&mut own, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &own, std::ptr::null_mut());
        }
        saved
    };
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed as a 3-argument sa_sigaction.
        let f = unsafe {
            std::mem::transmute::<usize, extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void)>(
                old.sa_sigaction,
            )
        };
        f(sig, info, uctx);
    } else {
        // SAFETY: the previous handler was installed as a 1-argument sa_handler.
        let f = unsafe { std::mem::transmute::<usize, extern "C" fn(c_int)>(old.sa_sigaction) };
        f(sig);
    }
    // SAFETY: restoring this thread's mask from before the chained call.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
}

/// Put back the disposition we replaced — or the default one, if the previous handler asked to
/// be reset after one delivery and was delivered. Async-signal-safe.
fn restore_disposition(i: usize, sig: c_int) {
    match old_action(i) {
        Some(old) if !RESET[i].load(Ordering::Acquire) => {
            // SAFETY: restoring the disposition saved at install time.
            unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
        }
        _ => {
            // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default disposition.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

fn worker() {
    // Keep signals off this thread so the application's own threads get them.
    // SAFETY: full signal mask for this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    loop {
        let fd = PIPE_R.load(Ordering::Acquire);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; 50 ms timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 50) };
        if n > 0 {
            let mut buf = [0u8; 16];
            // SAFETY: reading into a local buffer of the given size (non-blocking fd).
            unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        }
        let sig = PENDING.load(Ordering::Acquire);
        if sig != 0 {
            graceful_exit(sig);
        }
        if let Some(b) = state::block() {
            if b.limits.flags.load(Ordering::Acquire) & FLAG_EXIT != 0 {
                state::log(format_args!("node requested exit"));
                graceful_exit(libc::SIGTERM);
            }
            check_staleness(b);
        }
    }
}

/// A stale heartbeat drops enforcement to the fail mode; a fresh one brings it back (also
/// when the block was already stale when this process attached), and with it the charge of
/// whatever was allocated in between.
fn check_staleness(b: &crate::control::ControlBlock) {
    let fallback = state::fail_mode();
    if b.is_stale(monotonic_ns()) {
        if state::set_mode(ENFORCE, fallback) {
            state::log(format_args!(
                "control block stale; failing {}",
                mode_name(fallback)
            ));
        }
    } else if state::set_mode(fallback, ENFORCE) {
        quota::charge_deferred();
        state::log(format_args!("control block fresh again; enforcing"));
    }
}

fn mode_name(m: u8) -> &'static str {
    if m == CLOSED { "closed" } else { "open" }
}

type CtxFn = unsafe extern "C" fn(u64) -> CUresult;
type SyncFn = unsafe extern "C" fn() -> CUresult;
type PopFn = unsafe extern "C" fn(*mut u64) -> CUresult;
type ReleaseFn = unsafe extern "C" fn(c_int) -> CUresult;

fn call_ctx(sym: Sym, arg: u64) -> Option<CUresult> {
    let p = real::get(sym);
    if p.is_null() {
        return None;
    }
    // SAFETY: `sym` is one of cuCtxPushCurrent_v2 / cuCtxDestroy_v2, both `CUresult(CUcontext)`.
    Some(unsafe { std::mem::transmute::<*mut c_void, CtxFn>(p)(arg) })
}

/// Push `ctx`, synchronize it, pop it (on a helper thread of our own).
fn synchronize_one(ctx: u64) -> bool {
    call_ctx(Sym::cuCtxPushCurrent_v2, ctx) == Some(CUDA_SUCCESS) && {
        let s = real::get(Sym::cuCtxSynchronize);
        let pop = real::get(Sym::cuCtxPopCurrent_v2);
        // SAFETY: driver entry points with the declared ABIs; the popped context is written
        // to a local.
        unsafe {
            let r = if s.is_null() {
                CUDA_SUCCESS
            } else {
                std::mem::transmute::<*mut c_void, SyncFn>(s)()
            };
            if !pop.is_null() {
                let mut out = 0u64;
                std::mem::transmute::<*mut c_void, PopFn>(pop)(&mut out);
            }
            r == CUDA_SUCCESS
        }
    }
}

/// Synchronizes every context at once, one helper thread each, and waits for all of them
/// within `grace` in total; false if any failed, could not start or is still running then
/// (its helper is left behind: the process is about to end).
fn synchronize_all(contexts: &[u64], grace: Duration) -> bool {
    let deadline = Instant::now() + grace;
    let (tx, rx) = std::sync::mpsc::channel();
    for &ctx in contexts {
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .stack_size(DRIVER_THREAD_STACK)
            .spawn(move || {
                let _ = tx.send(synchronize_one(ctx));
            });
        if spawned.is_err() {
            return false;
        }
    }
    drop(tx);
    for _ in contexts {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(true) => {}
            Ok(false) | Err(_) => return false,
        }
    }
    true
}

fn graceful_exit(sig: c_int) -> ! {
    state::begin_exit();
    state::log(format_args!(
        "signal {sig}: stopping launches, synchronizing"
    ));
    let grace = Duration::from_millis(
        std::env::var("ARBITER_EXIT_SYNC_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000),
    );
    let created: Vec<u64> = CREATED
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|c| *c != 0)
        .collect();
    let primaries: Vec<(usize, u64, u64)> = (0..MAX_DEV)
        .filter_map(|d| {
            let n = PRIMARY_REFS[d].load(Ordering::Acquire);
            (n > 0).then(|| (d, n, PRIMARY_CTX[d].load(Ordering::Acquire)))
        })
        .collect();
    let contexts: Vec<u64> = created
        .iter()
        .copied()
        .chain(primaries.iter().map(|p| p.2))
        .collect();
    if synchronize_all(&contexts, grace) {
        for ctx in created {
            let _ = call_ctx(Sym::cuCtxDestroy_v2, ctx);
            untrack_created(ctx);
        }
        let rel = real::get(Sym::cuDevicePrimaryCtxRelease_v2);
        for (d, n, _) in primaries {
            for _ in 0..n {
                if !rel.is_null() {
                    // SAFETY: cuDevicePrimaryCtxRelease_v2(CUdevice); `d` < MAX_DEV fits c_int.
                    unsafe { std::mem::transmute::<*mut c_void, ReleaseFn>(rel)(d as c_int) };
                }
            }
            PRIMARY_REFS[d].store(0, Ordering::Release);
        }
        state::log(format_args!("contexts released"));
    } else {
        state::log(format_args!(
            "synchronize timed out; exiting without teardown"
        ));
    }
    quota::release_all();
    reraise(sig)
}

fn reraise(sig: c_int) -> ! {
    if let Some(i) = index_of(sig) {
        restore_disposition(i, sig);
    } else {
        // SAFETY: default disposition for a signal we never hooked (FLAG_EXIT path).
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // SAFETY: unblock in this thread and send to the whole process; the default action ends
    // it with the signal's status. `_exit` is the fallback if it somehow survives.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
    }
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: terminating the process without running atexit handlers of a dying process.
    unsafe { libc::_exit(128 + sig) }
}

extern "C" fn at_exit() {
    quota::release_all();
}

/// `pthread_atfork` child handler: async-signal-safe work only (atomics, close, pipe).
extern "C" fn after_fork_child() {
    for s in CREATED
        .iter()
        .chain(PRIMARY_REFS.iter())
        .chain(PRIMARY_CTX.iter())
    {
        s.store(0, Ordering::Relaxed);
    }
    WORKER_ALIVE.store(false, Ordering::Release);
    PENDING.store(0, Ordering::Release);
    for fd in [&PIPE_R, &PIPE_W] {
        let old = fd.swap(-1, Ordering::AcqRel);
        if old >= 0 {
            // SAFETY: closing the child's copy of the parent's pipe.
            unsafe { libc::close(old) };
        }
    }
    quota::reset_after_fork();
    STARTED.store(false, Ordering::Release);
}
