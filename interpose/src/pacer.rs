//! Launch admission: freeze, graceful-exit hold, and a GCRA pacer whose rate the node sets.
//!
//! The pacer keeps one "theoretical arrival time" (TAT) in the shared block, so the rate is a
//! budget for the whole workload, whatever number of threads and processes launch. A launch
//! reserves its slot with a CAS (`tat = max(tat, now) + interval * weight`) and, if the slot is
//! in the future beyond the burst allowance, waits for it with absolute `clock_nanosleep` in
//! slices of at most [`SLICE_NS`]; between slices it re-reads the rate epoch and the flags, so a
//! rate change, a freeze or a thaw is seen within one slice (far below one control period).
//! Oversleeping does not accumulate: the next slot is computed from the TAT, not from "now".
//!
//! The unthrottled fast path is two relaxed loads of node-written fields plus one relaxed
//! `fetch_add` of the launch counter: no clock read, no syscall, no lock.

use crate::control::{ControlBlock, FLAG_EXIT, FLAG_FREEZE, monotonic_ns};
use crate::real::{self, Sym};
use crate::state::{self, BYPASS, CLOSED, ENFORCE, EXITING, OPEN};
use crate::{CUDA_ERROR_NOT_PERMITTED, CUDA_SUCCESS, CUresult};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

/// Longest single sleep while waiting (re-check period for rate/flags).
pub const SLICE_NS: u64 = 1_000_000;

/// Which launch entry point is asking (for the stream-capture query).
#[derive(Clone, Copy)]
pub enum StreamKind {
    /// Legacy default-stream semantics.
    Legacy,
    /// `_ptsz` entry point: stream 0 means the per-thread default stream.
    PerThread,
    /// No stream to check (multi-device cooperative launch).
    None,
}

/// A launch we let through: what it took from the workload's budget, so that a launch the
/// driver then rejects gives it back (a rejected launch does no work on the GPU and must not
/// slow down the ones that do).
#[must_use]
pub struct Admission {
    /// The block the launch was counted in (`None`: not enforcing, nothing to give back).
    block: Option<&'static ControlBlock>,
    weight: u64,
    /// Pacer time reserved (`interval × weight`), 0 when unthrottled.
    cost_ns: u64,
    /// Rate epoch the slot was reserved under (a slot of an older epoch is already forgiven).
    epoch: u64,
}

impl Admission {
    const NONE: Admission = Admission {
        block: None,
        weight: 0,
        cost_ns: 0,
        epoch: 0,
    };

    /// Settle with the driver's answer: a rejected launch returns its slot and is not counted.
    #[inline(always)]
    pub fn settle(self, r: CUresult) -> CUresult {
        if r != CUDA_SUCCESS {
            self.give_back();
        }
        r
    }

    #[cold]
    #[inline(never)]
    fn give_back(self) {
        let Some(b) = self.block else { return };
        let _ = b
            .counters
            .launches
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(self.weight))
            });
        if self.cost_ns > 0 && b.limits.pace_epoch.load(Ordering::Acquire) == self.epoch {
            let _ = b
                .shared
                .pace_tat_ns
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    Some(t.saturating_sub(self.cost_ns))
                });
        }
    }
}

/// Admit a launch of `weight` kernels on `stream`.
#[inline(always)]
pub fn admit(stream: *mut c_void, kind: StreamKind, weight: u64) -> Result<Admission, CUresult> {
    if state::mode() == ENFORCE
        && let Some(b) = state::block()
    {
        let flags = b.limits.flags.load(Ordering::Relaxed);
        let interval = b.limits.pace_interval_ns.load(Ordering::Relaxed);
        if flags | interval == 0 {
            b.counters.launches.fetch_add(weight, Ordering::Relaxed);
            return Ok(Admission {
                block: Some(b),
                weight,
                cost_ns: 0,
                epoch: 0,
            });
        }
        return admit_slow(b, stream, kind, weight);
    }
    admit_other().map(|()| Admission::NONE)
}

#[cold]
#[inline(never)]
fn admit_other() -> Result<(), CUresult> {
    match state::mode() {
        BYPASS | OPEN => Ok(()),
        CLOSED => Err(CUDA_ERROR_NOT_PERMITTED),
        EXITING => {
            hold_forever();
            Err(CUDA_ERROR_NOT_PERMITTED)
        }
        // ENFORCE without a block cannot happen; be permissive.
        _ => Ok(()),
    }
}

/// Graceful exit in progress: the worker is synchronizing and will end the process.
fn hold_forever() {
    loop {
        sleep_until(monotonic_ns() + 10 * SLICE_NS);
    }
}

fn sleep_until(deadline: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: absolute CLOCK_MONOTONIC sleep with a valid timespec; EINTR returns early and
    // every caller loops on the clock.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

type IsCapturingFn = unsafe extern "C" fn(*mut c_void, *mut c_int) -> CUresult;

/// Whether `stream` is being captured into a graph (then we never throttle: the work is
/// charged when the graph is launched, and blocking a capture hangs NCCL/vLLM).
fn capturing(stream: *mut c_void, kind: StreamKind) -> bool {
    let sym = match kind {
        StreamKind::Legacy => Sym::cuStreamIsCapturing,
        StreamKind::PerThread => Sym::cuStreamIsCapturing_ptsz,
        StreamKind::None => return false,
    };
    let p = real::get(sym);
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` is the driver's cuStreamIsCapturing{,_ptsz}, ABI IsCapturingFn.
    let f = unsafe { std::mem::transmute::<*mut c_void, IsCapturingFn>(p) };
    let mut status: c_int = 0;
    // SAFETY: valid out-pointer; the stream is the caller's own.
    let r = unsafe { f(stream, &mut status) };
    r == CUDA_SUCCESS && status != 0
}

#[cold]
#[inline(never)]
fn admit_slow(
    b: &'static ControlBlock,
    stream: *mut c_void,
    kind: StreamKind,
    weight: u64,
) -> Result<Admission, CUresult> {
    let mut admission = Admission {
        block: Some(b),
        weight,
        cost_ns: 0,
        epoch: 0,
    };
    if capturing(stream, kind) {
        b.counters.launches.fetch_add(weight, Ordering::Relaxed);
        return Ok(admission);
    }
    let start = monotonic_ns();
    let mut waited = false;
    let mut replan = false;
    'plan: loop {
        let mut now = monotonic_ns();
        if replan {
            match state::mode() {
                ENFORCE => {}
                EXITING => hold_forever(),
                CLOSED => return Err(CUDA_ERROR_NOT_PERMITTED),
                _ => break 'plan,
            }
        }
        replan = true;
        if b.limits.flags.load(Ordering::Acquire) & (FLAG_FREEZE | FLAG_EXIT) != 0 {
            waited = true;
            sleep_until(now + SLICE_NS);
            continue 'plan;
        }
        let epoch = b.limits.pace_epoch.load(Ordering::Acquire);
        apply_epoch(b, epoch, now);
        let interval = b.limits.pace_interval_ns.load(Ordering::Acquire);
        if interval == 0 {
            break 'plan;
        }
        let burst = b.limits.pace_burst_ns.load(Ordering::Relaxed);
        let cost = interval.saturating_mul(weight);
        let tat = &b.shared.pace_tat_ns;
        let mut cur = tat.load(Ordering::Acquire);
        let slot = loop {
            let base = cur.max(now);
            match tat.compare_exchange_weak(
                cur,
                base.saturating_add(cost),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break base,
                Err(actual) => cur = actual,
            }
        };
        admission.cost_ns = cost;
        admission.epoch = epoch;
        let allowed_at = slot.saturating_sub(burst);
        while now < allowed_at {
            waited = true;
            sleep_until(allowed_at.min(now + SLICE_NS));
            now = monotonic_ns();
            let flags = b.limits.flags.load(Ordering::Acquire);
            if b.limits.pace_epoch.load(Ordering::Acquire) != epoch
                || flags & (FLAG_FREEZE | FLAG_EXIT) != 0
                || state::mode() != ENFORCE
            {
                // The node changed something: drop this slot and plan again.
                admission.cost_ns = 0;
                continue 'plan;
            }
        }
        break 'plan;
    }
    if waited {
        b.counters
            .throttled_launches
            .fetch_add(1, Ordering::Relaxed);
        let delay = monotonic_ns().saturating_sub(start);
        b.counters
            .pacing_delay_ns
            .fetch_add(delay, Ordering::Relaxed);
    }
    b.counters.launches.fetch_add(weight, Ordering::Relaxed);
    if state::mode() == EXITING {
        hold_forever();
    }
    Ok(admission)
}

/// First launch to see a new rate epoch resets the schedule to "now", so debt accumulated at
/// the old (slower) rate does not delay the new one.
fn apply_epoch(b: &ControlBlock, epoch: u64, now: u64) {
    let applied = &b.shared.pace_epoch_applied;
    let seen = applied.load(Ordering::Acquire);
    if seen != epoch
        && applied
            .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        let _ = b
            .shared
            .pace_tat_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(t.min(now)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::BlockInit;

    // Pure GCRA check on a private block (no waiting: burst covers the whole run).
    #[test]
    fn gcra_slots_are_spaced_by_interval() {
        let b: &'static ControlBlock = Box::leak(Box::default());
        b.initialize(&BlockInit {
            pace_interval_ns: 1_000,
            pace_burst_ns: 1_000_000_000,
            ..Default::default()
        });
        b.shared.pace_tat_ns.store(0, Ordering::Relaxed);
        let now = monotonic_ns();
        apply_epoch(b, 0, now);
        for _ in 0..10 {
            let r = admit_slow(b, std::ptr::null_mut(), StreamKind::None, 1);
            assert!(r.is_ok_and(|a| a.settle(CUDA_SUCCESS) == CUDA_SUCCESS));
        }
        let tat = b.shared.pace_tat_ns.load(Ordering::Relaxed);
        assert!(tat >= now + 10_000, "ten slots of 1 µs were reserved");
        assert_eq!(b.counters.launches.load(Ordering::Relaxed), 10);
        assert_eq!(b.counters.throttled_launches.load(Ordering::Relaxed), 0);

        // An eleventh launch the driver rejects gives its slot and its count back.
        let admitted = admit_slow(b, std::ptr::null_mut(), StreamKind::None, 1);
        assert!(admitted.is_ok_and(|a| a.settle(crate::CUDA_ERROR_INVALID_VALUE) != 0));
        assert_eq!(b.shared.pace_tat_ns.load(Ordering::Relaxed), tat);
        assert_eq!(b.counters.launches.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn new_epoch_forgives_old_debt() {
        let b = ControlBlock::default();
        b.initialize(&BlockInit::default());
        let now = monotonic_ns();
        b.shared
            .pace_tat_ns
            .store(now + 60_000_000_000, Ordering::Relaxed);
        b.set_pacing(1_000, 0);
        apply_epoch(&b, b.limits.pace_epoch.load(Ordering::Relaxed), now);
        assert!(b.shared.pace_tat_ns.load(Ordering::Relaxed) <= now);
    }
}
