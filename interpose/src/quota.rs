//! Memory accounting: reserve before the driver call, commit or roll back after.
//!
//! The quota is per device: each device's `used_bytes` in the control block is reserved with a
//! CAS against it, so concurrent allocations in any number of threads or processes never
//! overshoot. An allocation is charged to the device it lives on (the current context's device
//! when the workload has several GPUs, the VMM location for `cuMemCreate`). A process-local map
//! remembers what each pointer/handle was charged, and where, so frees return exactly that; what
//! the process holds per device is mirrored into its process slot in the block, from which the
//! node reclaims the charges of a process that was killed before it could return them. The map is sharded to keep allocation-heavy threads off each other's
//! locks; it is replaced wholesale in a forked child (locks copied mid-use cannot deadlock it).
//!
//! Two lifecycles are longer than allocate/free:
//! * VMM: `cuMemRelease` only drops the handle; the physical memory stays allocated until its
//!   last mapping is unmapped, so the charge is returned then ([`vmm_mapped`],
//!   [`vmm_unmapped`], [`vmm_released`]).
//! * Fail-open: while a stale block drops enforcement, allocations are not charged but are
//!   remembered as *deferred*; when enforcement returns, [`charge_deferred`] charges them
//!   (possibly over the quota: they exist) so they cannot stay invisible forever.

use crate::control::{ControlBlock, MAX_DEVICES};
use crate::real::{self, Sym};
use crate::state::{self, BYPASS, CLOSED, ENFORCE, EXITING, OPEN};
use crate::{CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

const SHARDS: usize = 16;

/// Kind of allocation (device pointers, VMM handles and array handles live in separate key
/// spaces).
#[derive(Clone, Copy)]
pub enum Kind {
    Ptr,
    Vmm,
    Array,
}

/// A map value: bytes (low 56 bits) charged to a device (bits 56–61); with [`DEFERRED`] set,
/// the bytes of an allocation made while enforcement was fail-open and not charged yet; with
/// [`SPILLED`] set, host-backed bytes held against the spill allowance, not the quota.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry(u64);

const DEFERRED: u64 = 1 << 63;
const SPILLED: u64 = 1 << 62;
const BYTES: u64 = (1 << 56) - 1;

impl Entry {
    fn new(device: usize, bytes: u64, deferred: bool) -> Entry {
        let flag = if deferred { DEFERRED } else { 0 };
        Entry(flag | ((device.min(MAX_DEVICES - 1) as u64) << 56) | bytes.min(BYTES))
    }
    fn spilled(bytes: u64) -> Entry {
        Entry(SPILLED | bytes.min(BYTES))
    }
    fn device(self) -> usize {
        ((self.0 >> 56) & 0x3f) as usize
    }
    fn is_spilled(self) -> bool {
        self.0 & SPILLED != 0
    }
    fn bytes(self) -> u64 {
        self.0 & BYTES
    }
    fn deferred(self) -> bool {
        self.0 & DEFERRED != 0
    }
    /// Bytes charged against the quota (0 for a deferred or spilled entry).
    fn charged(self) -> u64 {
        if self.deferred() || self.is_spilled() {
            0
        } else {
            self.bytes()
        }
    }
}

/// A map value: the entry and the context the allocation was made in (0 = none current or
/// not asked), so that destroying a context returns what was allocated in it.
#[derive(Clone, Copy)]
struct Record {
    entry: Entry,
    context: u64,
}

type Shards = [Mutex<BTreeMap<u64, Record>>; SHARDS];

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
    /// Handles released while mapped → their entry, refunded at the last unmap.
    released: BTreeMap<u64, Entry>,
}

static MAPS: AtomicPtr<Maps> = AtomicPtr::new(std::ptr::null_mut());
/// Bytes this process holds against the quota, per device (returned at exit).
static MY_HELD: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Host-spilled bytes this process holds (returned at exit).
static MY_SPILLED: AtomicU64 = AtomicU64::new(0);
/// Allocations remembered as deferred (a hint to skip the walk when there are none).
static DEFERRED_COUNT: AtomicU64 = AtomicU64::new(0);

/// This process's slot in the block: [`UNCLAIMED`] until its first charge, [`NO_SLOT`] if all
/// were taken.
static SLOT: AtomicUsize = AtomicUsize::new(UNCLAIMED);
const UNCLAIMED: usize = usize::MAX;
const NO_SLOT: usize = usize::MAX - 1;

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

fn shard(kind: Kind, key: u64) -> &'static Mutex<BTreeMap<u64, Record>> {
    let i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize % SHARDS;
    &shards(kind)[i]
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Which device, and what this process holds there

type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
type CtxGetCurrentFn = unsafe extern "C" fn(*mut u64) -> CUresult;

/// The calling thread's current context (0 if none, or without a block: nothing to return).
#[inline]
pub fn current_context() -> u64 {
    if state::block().is_none() {
        return 0;
    }
    let p = real::get(Sym::cuCtxGetCurrent);
    if p.is_null() {
        return 0;
    }
    let mut ctx = 0u64;
    // SAFETY: `p` is the driver's cuCtxGetCurrent, ABI CtxGetCurrentFn; valid out-pointer.
    let r = unsafe { std::mem::transmute::<*mut c_void, CtxGetCurrentFn>(p)(&mut ctx) };
    if r == CUDA_SUCCESS { ctx } else { 0 }
}

/// Device ordinal of the current context: 0 without asking the driver when the workload has
/// one GPU (the node says how many in the block), else `cuCtxGetDevice` (0 if that fails).
#[inline]
pub fn current_device() -> usize {
    match state::block() {
        Some(b) if b.liveness.device_count.load(Ordering::Relaxed) > 1 => ask_current_device(),
        _ => 0,
    }
}

#[cold]
#[inline(never)]
fn ask_current_device() -> usize {
    let p = real::get(Sym::cuCtxGetDevice);
    if p.is_null() {
        return 0;
    }
    let mut dev: c_int = 0;
    // SAFETY: `p` is the driver's cuCtxGetDevice, ABI CtxGetDeviceFn; valid out-pointer.
    let r = unsafe { std::mem::transmute::<*mut c_void, CtxGetDeviceFn>(p)(&mut dev) };
    if r == CUDA_SUCCESS {
        usize::try_from(dev).unwrap_or(0)
    } else {
        0
    }
}

/// This process's slot, claimed on first use (never on the hot path after that).
fn my_slot(b: &ControlBlock) -> Option<&crate::control::ProcessSlot> {
    let mut i = SLOT.load(Ordering::Acquire);
    if i == UNCLAIMED {
        i = claim_slot(b);
    }
    b.processes.get(i)
}

#[cold]
#[inline(never)]
fn claim_slot(b: &ControlBlock) -> usize {
    let pid = u64::from(std::process::id());
    let ticks = crate::control::process_start_ticks(pid).unwrap_or(0);
    let i = b.claim_process_slot(pid, ticks).unwrap_or(NO_SLOT);
    match SLOT.compare_exchange(UNCLAIMED, i, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if i == NO_SLOT {
                state::log(format_args!(
                    "no free process slot: a SIGKILL would leave this process's charges"
                ));
            }
            i
        }
        Err(other) => {
            // Another thread claimed first: give ours back.
            if let Some(slot) = b.processes.get(i) {
                slot.start_ticks.store(0, Ordering::Release);
                slot.pid.store(0, Ordering::Release);
            }
            other
        }
    }
}

/// This process now holds `bytes` more on `device` (recorded as soon as they are reserved, so
/// that a process killed inside the driver call leaves them in its slot for the node).
fn hold(b: &ControlBlock, device: usize, bytes: u64) {
    let d = device.min(MAX_DEVICES - 1);
    MY_HELD[d].fetch_add(bytes, Ordering::Relaxed);
    if let Some(slot) = my_slot(b) {
        slot.held[d].fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Returns `bytes` of `device` to the quota — at most what this process still holds there.
/// After [`release_all`] (exit) it holds nothing, so the frees that global destructors and
/// earlier `atexit` handlers make later refund nothing: the counters are shared with the other
/// processes of the workload, and refunding twice would hand their bytes out again.
fn refund(b: &ControlBlock, device: usize, bytes: u64) {
    let d = device.min(MAX_DEVICES - 1);
    let mut refund = 0;
    let _ = MY_HELD[d].fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
        refund = bytes.min(u);
        Some(u - refund)
    });
    if refund == 0 {
        return;
    }
    b.counters.bytes_freed.fetch_add(refund, Ordering::Relaxed);
    unhold_slot(b, d, refund);
    b.release(d, refund);
}

/// Takes `bytes` of `device` off this process's slot — before the block's counters are
/// released, so that a process killed in between is under-reclaimed (a leak the size of one
/// allocation) rather than reclaimed twice.
fn unhold_slot(b: &ControlBlock, device: usize, bytes: u64) {
    if let Some(slot) = my_slot(b) {
        let _ = slot.held[device].fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
            Some(u.saturating_sub(bytes))
        });
    }
}

/// Gives back a reservation that never became an allocation (it is held since `reserve`).
fn unreserve(b: &ControlBlock, device: usize, bytes: u64) {
    let d = device.min(MAX_DEVICES - 1);
    let _ = MY_HELD[d].fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
        Some(u.saturating_sub(bytes))
    });
    unhold_slot(b, d, bytes);
    b.release(d, bytes);
}

/// Returns what a freed (or context-destroyed) allocation held: quota bytes, or spill.
fn give_back(b: &ControlBlock, entry: Entry) {
    if entry.is_spilled() {
        unspill(b, entry.bytes());
    } else {
        refund(b, entry.device(), entry.charged());
    }
}

/// Returns `bytes` of freed host spill (see [`drop_spill`]).
fn unspill(b: &ControlBlock, bytes: u64) {
    let mine = drop_spill(b, bytes);
    b.counters.bytes_freed.fetch_add(mine, Ordering::Relaxed);
}

/// Gives `bytes` of host spill back to the allowance — at most what this process still holds
/// (see [`refund`]: after exit it holds nothing) — slot first, as [`unhold_slot`] does.
/// Returns the bytes given back.
fn drop_spill(b: &ControlBlock, bytes: u64) -> u64 {
    let mut mine = 0;
    let _ = MY_SPILLED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
        mine = bytes.min(u);
        Some(u - mine)
    });
    if mine > 0 {
        if let Some(slot) = my_slot(b) {
            let _ = slot
                .spilled
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                    Some(u.saturating_sub(mine))
                });
        }
        b.unspill(mine);
    }
    mine
}

// ---------------------------------------------------------------------------------------------
// Allocation

/// A reservation taken before the driver call.
#[must_use]
pub struct Reservation {
    device: usize,
    /// The context the allocation is made in (see [`Record`]).
    context: u64,
    charged: u64,
    size: u64,
    /// Fail-open with a block: remember the allocation to charge it when enforcement returns.
    deferred: bool,
}

impl Reservation {
    fn uncharged(device: usize, size: u64) -> Reservation {
        Reservation {
            device,
            context: 0,
            charged: 0,
            size,
            deferred: false,
        }
    }
}

/// Reserve `size` bytes on `device` against the quota (mode-dependent).
#[inline]
pub fn reserve(device: usize, size: u64) -> Result<Reservation, CUresult> {
    match state::mode() {
        ENFORCE => match state::block() {
            Some(b) if b.try_reserve(device, size) => {
                hold(b, device, size);
                Ok(Reservation {
                    charged: size,
                    ..Reservation::uncharged(device, size)
                })
            }
            Some(b) => {
                b.counters.quota_denials.fetch_add(1, Ordering::Relaxed);
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
            None => Ok(Reservation::uncharged(device, size)),
        },
        OPEN => Ok(Reservation {
            deferred: state::block().is_some(),
            ..Reservation::uncharged(device, size)
        }),
        CLOSED => Err(CUDA_ERROR_OUT_OF_MEMORY),
        EXITING => Err(CUDA_ERROR_NOT_PERMITTED),
        _ => Ok(Reservation::uncharged(device, size)),
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
            if !b.try_reserve(self.device, actual - self.charged) {
                b.counters.quota_denials.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            hold(b, self.device, actual - self.charged);
        } else {
            unreserve(b, self.device, self.charged - actual);
        }
        self.charged = actual;
        self.size = actual;
        true
    }

    /// The allocation is made in `context` (its memory goes when the context does).
    pub fn in_context(mut self, context: u64) -> Reservation {
        self.context = context;
        self
    }

    /// The driver call succeeded: remember what `key` was charged, and where.
    pub fn commit(self, kind: Kind, key: u64) {
        let Some(b) = state::block() else { return };
        b.counters.allocations.fetch_add(1, Ordering::Relaxed);
        b.counters
            .bytes_allocated
            .fetch_add(self.size, Ordering::Relaxed);
        let record = |entry| Record {
            entry,
            context: self.context,
        };
        if self.charged > 0 {
            lock(shard(kind, key))
                .insert(key, record(Entry::new(self.device, self.charged, false)));
        } else if self.deferred && self.size > 0 {
            DEFERRED_COUNT.fetch_add(1, Ordering::Relaxed);
            lock(shard(kind, key)).insert(key, record(Entry::new(self.device, self.size, true)));
            // Enforcement may have returned (and the deferred walk run) between our reservation
            // and this insert: then charge now rather than at the next stale/fresh cycle.
            if state::mode() == ENFORCE {
                charge_deferred();
            }
        }
    }

    /// The driver call failed: give the bytes back.
    pub fn rollback(self) {
        if self.charged > 0
            && let Some(b) = state::block()
        {
            unreserve(b, self.device, self.charged);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host spill

/// Host spill taken against the block's allowance before the managed allocation is made.
#[must_use]
pub struct Spill {
    bytes: u64,
    context: u64,
}

/// Reserve `size` bytes of host spill: only while the quota is enforced and the node gave the
/// workload an allowance (`spill_limit_bytes`) with room left. The bytes are held in this
/// process's slot from here, like a quota reservation.
pub fn reserve_spill(size: u64) -> Option<Spill> {
    if state::mode() != ENFORCE || size == 0 {
        return None;
    }
    let b = state::block()?;
    if !b.try_spill(size) {
        return None;
    }
    MY_SPILLED.fetch_add(size, Ordering::AcqRel);
    if let Some(slot) = my_slot(b) {
        slot.spilled.fetch_add(size, Ordering::AcqRel);
    }
    Some(Spill {
        bytes: size,
        context: current_context(),
    })
}

impl Spill {
    /// The managed allocation `key` was made: remember it as spilled.
    pub fn commit(self, key: u64) {
        let Some(b) = state::block() else { return };
        b.counters.allocations.fetch_add(1, Ordering::Relaxed);
        b.counters
            .bytes_allocated
            .fetch_add(self.bytes, Ordering::Relaxed);
        lock(shard(Kind::Ptr, key)).insert(
            key,
            Record {
                entry: Entry::spilled(self.bytes),
                context: self.context,
            },
        );
    }

    /// The managed allocation failed: give the allowance back.
    pub fn rollback(self) {
        if let Some(b) = state::block() {
            drop_spill(b, self.bytes);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Free

/// An allocation's map record, taken out before its free.
#[derive(Clone, Copy)]
pub struct Taken(Record);

/// Take `key` out of the map before the free; `restore` it if the driver refused the free.
pub fn take(kind: Kind, key: u64) -> Option<Taken> {
    if state::mode() == BYPASS {
        return None;
    }
    let record = lock(shard(kind, key)).remove(&key)?;
    if record.entry.deferred() {
        let _ = DEFERRED_COUNT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_sub(1))
        });
    }
    Some(Taken(record))
}

/// Put back an entry whose free failed.
pub fn restore(kind: Kind, key: u64, taken: Taken) {
    if taken.0.entry.deferred() {
        DEFERRED_COUNT.fetch_add(1, Ordering::Relaxed);
    }
    lock(shard(kind, key)).insert(key, taken.0);
}

/// The free succeeded: return the bytes (see [`refund`]).
pub fn released(taken: Option<Taken>) {
    let Some(b) = state::block() else { return };
    b.counters.frees.fetch_add(1, Ordering::Relaxed);
    if let Some(Taken(r)) = taken {
        give_back(b, r.entry);
    }
}

/// A context was destroyed (or the last reference to a primary context released, or it was
/// reset): the driver freed everything allocated in it, so its charges go back. VMM handles
/// are not the context's and stay.
pub fn context_destroyed(context: u64) {
    if context == 0 || state::mode() == BYPASS {
        return;
    }
    let Some(b) = state::block() else { return };
    for kind in [Kind::Ptr, Kind::Array] {
        for shard in shards(kind) {
            let gone: Vec<Record> = {
                let mut map = lock(shard);
                let keys: Vec<u64> = map
                    .iter()
                    .filter(|(_, r)| r.context == context)
                    .map(|(k, _)| *k)
                    .collect();
                keys.iter().filter_map(|k| map.remove(k)).collect()
            };
            for r in gone {
                if r.entry.deferred() {
                    let _ =
                        DEFERRED_COUNT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            Some(n.saturating_sub(1))
                        });
                }
                b.counters.frees.fetch_add(1, Ordering::Relaxed);
                give_back(b, r.entry);
            }
        }
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
            let left = m.count.get_mut(&handle).map_or(0, |n| {
                *n = n.saturating_sub(1);
                *n
            });
            if left == 0 {
                m.count.remove(&handle);
                if let Some(e) = m.released.remove(&handle) {
                    refunds.push(e);
                }
            }
        }
    }
    if let Some(b) = state::block() {
        for e in refunds {
            refund(b, e.device(), e.charged());
        }
    }
}

/// `cuMemRelease` succeeded: return the handle's charge now if nothing maps it, else at its
/// last unmap (the driver keeps the memory until then).
pub fn vmm_released(handle: u64, taken: Option<Taken>) {
    if let Some(Taken(Record { entry: e, .. })) = taken
        && e.charged() > 0
    {
        let mut m = lock(&maps().mappings);
        if m.count.get(&handle).is_some_and(|n| *n > 0) {
            m.released.insert(handle, e);
            drop(m);
            if let Some(b) = state::block() {
                b.counters.frees.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
    }
    released(taken);
}

// ---------------------------------------------------------------------------------------------
// Whole-process transitions

/// Enforcement is back: charge what was allocated while it was fail-open.
pub fn charge_deferred() {
    if DEFERRED_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Some(b) = state::block() else { return };
    for kind in [Kind::Ptr, Kind::Vmm, Kind::Array] {
        for shard in shards(kind) {
            let mut map = lock(shard);
            for record in map.values_mut().filter(|r| r.entry.deferred()) {
                let entry = record.entry;
                b.charge(entry.device(), entry.bytes());
                hold(b, entry.device(), entry.bytes());
                record.entry = Entry::new(entry.device(), entry.bytes(), false);
                let _ = DEFERRED_COUNT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
            }
        }
    }
}

/// Return everything this process holds (graceful exit, `atexit`) and free its slot. From
/// then on nothing is charged (`RELEASED`): a destructor's allocation would never be returned.
pub fn release_all() {
    state::set_released();
    let Some(b) = state::block() else { return };
    let i = SLOT.swap(NO_SLOT, Ordering::AcqRel);
    let slot = b.processes.get(i);
    for (d, held) in MY_HELD.iter().enumerate() {
        let mine = held.swap(0, Ordering::AcqRel);
        if let Some(slot) = slot {
            slot.held[d].store(0, Ordering::Release);
        }
        if mine > 0 {
            b.release(d, mine);
        }
    }
    let spilled = MY_SPILLED.swap(0, Ordering::AcqRel);
    if let Some(slot) = slot {
        slot.spilled.store(0, Ordering::Release);
    }
    b.unspill(spilled);
    if let Some(slot) = slot
        && slot.pid.load(Ordering::Acquire) == u64::from(std::process::id())
    {
        // The start time first: a slot never pairs a new owner's pid with our start time.
        slot.start_ticks.store(0, Ordering::Release);
        slot.pid.store(0, Ordering::Release);
    }
}

/// Forked child: it holds nothing (device memory belongs to the parent's contexts), owns no
/// slot yet, and must not touch maps whose locks may have been held by a parent thread at
/// fork time. Async-signal-safe: atomics only.
pub fn reset_after_fork() {
    for held in &MY_HELD {
        held.store(0, Ordering::Relaxed);
    }
    MY_SPILLED.store(0, Ordering::Relaxed);
    SLOT.store(UNCLAIMED, Ordering::Release);
    DEFERRED_COUNT.store(0, Ordering::Relaxed);
    MAPS.store(std::ptr::null_mut(), Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_device_bytes_and_deferral_apart() {
        let e = Entry::new(5, 3 << 30, false);
        assert_eq!((e.device(), e.bytes(), e.charged()), (5, 3 << 30, 3 << 30));
        let d = Entry::new(15, 7, true);
        assert_eq!((d.device(), d.bytes(), d.charged()), (15, 7, 0));
        assert!(d.deferred() && !e.deferred());
        assert_eq!(Entry::new(99, 1, false).device(), MAX_DEVICES - 1);
        let s = Entry::spilled(5 << 20);
        assert!(s.is_spilled() && !s.deferred() && !e.is_spilled());
        assert_eq!(
            (s.bytes(), s.charged()),
            (5 << 20, 0),
            "spill is not charged to the quota"
        );
    }
}
