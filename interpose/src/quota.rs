//! Memory accounting: reserve before the driver call, commit or roll back after.
//!
//! The shared `used_bytes` counter in the control block is the quota (one per workload, CAS
//! reservation, so concurrent allocations in any number of threads or processes never
//! overshoot). A process-local map remembers what each pointer/handle was charged so frees
//! return exactly that. The map is sharded to keep allocation-heavy threads off each other's
//! locks; it is replaced wholesale in a forked child (locks copied mid-use cannot deadlock it).
//!
//! Two lifecycles are longer than allocate/free:
//! * VMM: `cuMemRelease` only drops the handle; the physical memory stays allocated until its
//!   last mapping is unmapped, so the charge is returned then ([`vmm_mapped`],
//!   [`vmm_unmapped`], [`vmm_released`]).
//! * Fail-open: while a stale block drops enforcement, allocations are not charged but are
//!   remembered as *deferred*; when enforcement returns, [`charge_deferred`] charges them
//!   (possibly over the quota: they exist) so they cannot stay invisible forever.

use crate::state::{self, BYPASS, CLOSED, ENFORCE, EXITING, OPEN};
use crate::{CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY, CUresult};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

const SHARDS: usize = 16;

/// Kind of allocation (device pointers, VMM handles and array handles live in separate key
/// spaces).
#[derive(Clone, Copy)]
pub enum Kind {
    Ptr,
    Vmm,
    Array,
}

/// A map value: the bytes charged, or with [`DEFERRED`] set, the bytes of an allocation made
/// while enforcement was fail-open and not charged yet.
type Entry = u64;
const DEFERRED: Entry = 1 << 63;

/// Bytes an entry has charged against the quota.
fn charged_by(entry: Entry) -> u64 {
    if entry & DEFERRED != 0 { 0 } else { entry }
}

type Shards = [Mutex<BTreeMap<u64, Entry>>; SHARDS];

struct Maps {
    ptr: Shards,
    vmm: Shards,
    array: Shards,
    mappings: Mutex<Mappings>,
}

/// VMM mappings: what is mapped where, and handles released while still mapped.
#[derive(Default)]
struct Mappings {
    /// Start address → (end, handle) of each `cuMemMap`.
    by_address: BTreeMap<u64, (u64, u64)>,
    /// Live mappings per handle.
    count: BTreeMap<u64, u64>,
    /// Handles released while mapped → the bytes to return at their last unmap.
    released: BTreeMap<u64, u64>,
}

/// Allocations remembered as deferred (a hint to skip the walk when there are none).
static DEFERRED_COUNT: AtomicU64 = AtomicU64::new(0);

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
        array: [const { Mutex::new(BTreeMap::new()) }; SHARDS],
        mappings: Mutex::new(Mappings::default()),
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

fn shards(kind: Kind) -> &'static Shards {
    let m = maps();
    match kind {
        Kind::Ptr => &m.ptr,
        Kind::Vmm => &m.vmm,
        Kind::Array => &m.array,
    }
}

fn shard(kind: Kind, key: u64) -> &'static Mutex<BTreeMap<u64, Entry>> {
    let i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize % SHARDS;
    &shards(kind)[i]
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A reservation taken before the driver call.
#[must_use]
pub struct Reservation {
    charged: u64,
    size: u64,
    /// Fail-open with a block: remember the allocation to charge it when enforcement returns.
    deferred: bool,
}

impl Reservation {
    fn uncharged(size: u64) -> Reservation {
        Reservation {
            charged: 0,
            size,
            deferred: false,
        }
    }
}

/// Reserve `size` bytes against the quota (mode-dependent).
#[inline]
pub fn reserve(size: u64) -> Result<Reservation, CUresult> {
    match state::mode() {
        ENFORCE => match state::block() {
            Some(b) if b.try_reserve(size) => Ok(Reservation {
                charged: size,
                size,
                deferred: false,
            }),
            Some(b) => {
                b.counters.quota_denials.fetch_add(1, Ordering::Relaxed);
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
            None => Ok(Reservation::uncharged(size)),
        },
        OPEN => Ok(Reservation {
            deferred: state::block().is_some(),
            ..Reservation::uncharged(size)
        }),
        CLOSED => Err(CUDA_ERROR_OUT_OF_MEMORY),
        EXITING => Err(CUDA_ERROR_NOT_PERMITTED),
        _ => Ok(Reservation::uncharged(size)),
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
        } else if self.deferred && self.size > 0 {
            DEFERRED_COUNT.fetch_add(1, Ordering::Relaxed);
            lock(shard(kind, key)).insert(key, self.size.min(!DEFERRED) | DEFERRED);
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

/// An allocation's map entry, taken out before its free.
#[derive(Clone, Copy)]
pub struct Taken(Entry);

impl Taken {
    /// Bytes the allocation charged against the quota (0 for a deferred one).
    pub fn charged(self) -> u64 {
        charged_by(self.0)
    }
}

/// Take `key` out of the map before the free; `restore` it if the driver refused the free.
pub fn take(kind: Kind, key: u64) -> Option<Taken> {
    if state::mode() == BYPASS {
        return None;
    }
    let entry = lock(shard(kind, key)).remove(&key)?;
    if entry & DEFERRED != 0 {
        let _ = DEFERRED_COUNT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_sub(1))
        });
    }
    Some(Taken(entry))
}

/// Put back an entry whose free failed.
pub fn restore(kind: Kind, key: u64, taken: Taken) {
    if taken.0 & DEFERRED != 0 {
        DEFERRED_COUNT.fetch_add(1, Ordering::Relaxed);
    }
    lock(shard(kind, key)).insert(key, taken.0);
}

/// The free succeeded: return the bytes — at most what this process still holds. After
/// [`release_all`] (exit) it holds nothing, so the frees that global destructors and earlier
/// `atexit` handlers make later refund nothing: the quota counter is shared with the other
/// processes of the workload, and refunding twice would hand their bytes out again.
pub fn released(taken: Option<Taken>) {
    let Some(b) = state::block() else { return };
    b.counters.frees.fetch_add(1, Ordering::Relaxed);
    refund(b, taken.map(Taken::charged));
}

fn refund(b: &crate::control::ControlBlock, charged: Option<u64>) {
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

/// A VMM handle was mapped at `[va, va + size)`.
pub fn vmm_mapped(va: u64, size: u64, handle: u64) {
    if state::mode() == BYPASS {
        return;
    }
    let mut m = lock(&maps().mappings);
    m.by_address.insert(va, (va.saturating_add(size), handle));
    *m.count.entry(handle).or_insert(0) += 1;
}

/// `[va, va + size)` was unmapped: every mapping starting in it is gone; a handle already
/// released returns its charge with its last mapping.
pub fn vmm_unmapped(va: u64, size: u64) {
    if state::mode() == BYPASS {
        return;
    }
    let mut refunds = Vec::new();
    {
        let mut m = lock(&maps().mappings);
        let end = va.saturating_add(size.max(1));
        let starts: Vec<u64> = m.by_address.range(va..end).map(|(k, _)| *k).collect();
        for start in starts {
            let Some((_, handle)) = m.by_address.remove(&start) else {
                continue;
            };
            let left = match m.count.get_mut(&handle) {
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n
                }
                None => 0,
            };
            if left == 0 {
                m.count.remove(&handle);
                if let Some(c) = m.released.remove(&handle) {
                    refunds.push(c);
                }
            }
        }
    }
    if let Some(b) = state::block() {
        for c in refunds {
            refund(b, Some(c));
        }
    }
}

/// `cuMemRelease` succeeded: return the handle's charge now if nothing maps it, else at its
/// last unmap.
pub fn vmm_released(handle: u64, taken: Option<Taken>) {
    let charged = taken.map(Taken::charged);
    if let Some(c) = charged
        && c > 0
    {
        let mut m = lock(&maps().mappings);
        if m.count.get(&handle).is_some_and(|n| *n > 0) {
            m.released.insert(handle, c);
            if let Some(b) = state::block() {
                b.counters.frees.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
    }
    released(taken);
}

/// Enforcement is back: charge what was allocated while it was fail-open.
pub fn charge_deferred() {
    if DEFERRED_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Some(b) = state::block() else { return };
    for kind in [Kind::Ptr, Kind::Vmm, Kind::Array] {
        for shard in shards(kind) {
            let mut map = lock(shard);
            for entry in map.values_mut() {
                if *entry & DEFERRED != 0 {
                    let bytes = *entry & !DEFERRED;
                    b.charge(bytes);
                    MY_USED.fetch_add(bytes, Ordering::Relaxed);
                    *entry = bytes;
                    let _ =
                        DEFERRED_COUNT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            Some(n.saturating_sub(1))
                        });
                }
            }
        }
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
    DEFERRED_COUNT.store(0, Ordering::Relaxed);
    MAPS.store(std::ptr::null_mut(), Ordering::Release);
}
