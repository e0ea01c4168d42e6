//! Memory accounting: reserve before the driver call, commit or roll back after.
//!
//! The shared `used_bytes` counter in the control block is the quota (one per workload, CAS
//! reservation, so concurrent allocations in any number of threads or processes never
//! overshoot). A process-local map remembers what each pointer/handle was charged so frees
//! return exactly that. The map is sharded to keep allocation-heavy threads off each other's
//! locks; it is replaced wholesale in a forked child (locks copied mid-use cannot deadlock it).

use crate::state::{self, BYPASS, CLOSED, ENFORCE, EXITING, OPEN};
use crate::{CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY, CUresult};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

const SHARDS: usize = 16;

/// Kind of allocation (device pointers and VMM handles live in separate key spaces).
#[derive(Clone, Copy)]
pub enum Kind {
    Ptr,
    Vmm,
}

struct Maps {
    ptr: [Mutex<BTreeMap<u64, u64>>; SHARDS],
    vmm: [Mutex<BTreeMap<u64, u64>>; SHARDS],
}

static MAPS: AtomicPtr<Maps> = AtomicPtr::new(std::ptr::null_mut());
/// Bytes this process holds against the shared quota (returned at exit).
static MY_USED: AtomicU64 = AtomicU64::new(0);

fn maps() -> &'static Maps {
    let p = MAPS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: MAPS only ever holds leaked Boxes, never freed.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Maps {
        ptr: [const { Mutex::new(BTreeMap::new()) }; SHARDS],
        vmm: [const { Mutex::new(BTreeMap::new()) }; SHARDS],
    }));
    match MAPS.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: we just published `fresh`, which is leaked for the life of the process.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never published, we still own it.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above, a leaked published Box.
            unsafe { &*existing }
        }
    }
}

fn shard(kind: Kind, key: u64) -> &'static Mutex<BTreeMap<u64, u64>> {
    let m = maps();
    let i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize % SHARDS;
    match kind {
        Kind::Ptr => &m.ptr[i],
        Kind::Vmm => &m.vmm[i],
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A reservation taken before the driver call.
#[must_use]
pub struct Reservation {
    charged: u64,
    size: u64,
}

/// Reserve `size` bytes against the quota (mode-dependent).
#[inline]
pub fn reserve(size: u64) -> Result<Reservation, CUresult> {
    match state::mode() {
        ENFORCE => match state::block() {
            Some(b) if b.try_reserve(size) => Ok(Reservation {
                charged: size,
                size,
            }),
            Some(b) => {
                b.counters.quota_denials.fetch_add(1, Ordering::Relaxed);
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
            None => Ok(Reservation { charged: 0, size }),
        },
        BYPASS | OPEN => Ok(Reservation { charged: 0, size }),
        CLOSED => Err(CUDA_ERROR_OUT_OF_MEMORY),
        EXITING => Err(CUDA_ERROR_NOT_PERMITTED),
        _ => Ok(Reservation { charged: 0, size }),
    }
}

impl Reservation {
    /// Grow (or shrink) the reservation to `actual` bytes after the driver told us the real
    /// size (pitched allocations). Fails without changing anything if growth exceeds the quota.
    pub fn adjust(&mut self, actual: u64) -> bool {
        if self.charged == 0 {
            self.size = actual;
            return true;
        }
        let Some(b) = state::block() else { return true };
        if actual > self.charged {
            if !b.try_reserve(actual - self.charged) {
                b.counters.quota_denials.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        } else {
            b.release(self.charged - actual);
        }
        self.charged = actual;
        self.size = actual;
        true
    }

    /// The driver call succeeded: remember what `key` was charged.
    pub fn commit(self, kind: Kind, key: u64) {
        if let Some(b) = state::block() {
            b.counters.allocations.fetch_add(1, Ordering::Relaxed);
            b.counters
                .bytes_allocated
                .fetch_add(self.size, Ordering::Relaxed);
        }
        if self.charged > 0 {
            MY_USED.fetch_add(self.charged, Ordering::Relaxed);
            lock(shard(kind, key)).insert(key, self.charged);
        }
    }

    /// The driver call failed: give the bytes back.
    pub fn rollback(self) {
        if self.charged > 0
            && let Some(b) = state::block()
        {
            b.release(self.charged);
        }
    }
}

/// Take `key` out of the map before the free; `restore` it if the driver refused the free.
pub fn take(kind: Kind, key: u64) -> Option<u64> {
    if state::mode() == BYPASS {
        return None;
    }
    lock(shard(kind, key)).remove(&key)
}

/// Put back an entry whose free failed.
pub fn restore(kind: Kind, key: u64, charged: u64) {
    lock(shard(kind, key)).insert(key, charged);
}

/// The free succeeded: return the bytes — at most what this process still holds. After
/// [`release_all`] (exit) it holds nothing, so the frees that global destructors and earlier
/// `atexit` handlers make later refund nothing: the quota counter is shared with the other
/// processes of the workload, and refunding twice would hand their bytes out again.
pub fn released(charged: Option<u64>) {
    let Some(b) = state::block() else { return };
    b.counters.frees.fetch_add(1, Ordering::Relaxed);
    if let Some(c) = charged {
        b.counters.bytes_freed.fetch_add(c, Ordering::Relaxed);
        let mut refund = 0;
        let _ = MY_USED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
            refund = c.min(u);
            Some(u - refund)
        });
        b.release(refund);
    }
}

/// Return everything this process holds (graceful exit, `atexit`).
pub fn release_all() {
    let mine = MY_USED.swap(0, Ordering::AcqRel);
    if mine > 0
        && let Some(b) = state::block()
    {
        b.release(mine);
    }
}

/// Forked child: it holds nothing (device memory belongs to the parent's contexts) and must
/// not touch maps whose locks may have been held by a parent thread at fork time.
pub fn reset_after_fork() {
    MY_USED.store(0, Ordering::Relaxed);
    MAPS.store(std::ptr::null_mut(), Ordering::Release);
}
